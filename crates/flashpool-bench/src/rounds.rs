//! `--rounds N`: the same workload N times, each after its own ramp. The
//! round with the median IOPS is the result, with every round's figures and
//! the spread beside it, so that one lucky or unlucky run is never the
//! published figure. A round that overlapped other work on the machine is
//! run once more.
//!
//! The record of the rounds ([`Rounds`]) is part of the [`Summary`] and
//! lives beside it in `stats`; this module only runs and picks.

use anyhow::Result;

use crate::stats::{DISTURBED_CORES, Round, Rounds, Summary};

fn disturbed(s: &Summary) -> bool {
    s.cpu
        .other_cores(s.elapsed_s)
        .is_some_and(|o| o > DISTURBED_CORES)
}

/// Runs `one` `n` times (a disturbed round once more) and returns the
/// median round's summary with all rounds attached.
pub fn run(n: u32, mut one: impl FnMut() -> Result<Summary>) -> Result<Summary> {
    let mut runs: Vec<(Summary, bool)> = Vec::new();
    for i in 0..n {
        let mut s = one()?;
        let mut repeated = false;
        if disturbed(&s) {
            tracing::warn!(
                "round {}: {:.2} cores of other work overlapped it; running it again",
                i + 1,
                s.cpu.other_cores(s.elapsed_s).unwrap_or(0.0)
            );
            s = one()?;
            repeated = true;
        }
        runs.push((s, repeated));
    }
    Ok(pick(runs))
}

fn pick(runs: Vec<(Summary, bool)>) -> Summary {
    let mut order: Vec<usize> = (0..runs.len()).collect();
    order.sort_by(|&a, &b| runs[a].0.all.iops.total_cmp(&runs[b].0.all.iops));
    let median = order[order.len() / 2];
    let (lo, hi) = (
        runs[order[0]].0.all.iops,
        runs[order[order.len() - 1]].0.all.iops,
    );
    let mid = runs[median].0.all.iops;
    let rounds = runs
        .iter()
        .map(|(s, repeated)| Round {
            iops: s.all.iops,
            mb_s: s.all.mb_s,
            mean_us: s.all.lat.mean_us,
            p99_us: s.all.lat.p99_us,
            target_s_per_million_ios: s.cpu.target_s_per_million_ios,
            load_1m: s.cpu.load_1m,
            other_cores: s.cpu.other_cores(s.elapsed_s),
            repeated: *repeated,
        })
        .collect();
    let mut out = runs.into_iter().nth(median).expect("the median round").0;
    out.rounds = Some(Rounds {
        rounds,
        median,
        spread_pct: if mid > 0.0 {
            100.0 * (hi - lo) / mid
        } else {
            0.0
        },
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::summary;

    #[test]
    fn the_median_round_is_the_result_and_the_spread_is_shown() {
        let mut iops = [300u64, 100, 200].into_iter();
        let s = run(3, || Ok(summary("t", 4096, iops.next().unwrap(), 10))).unwrap();
        assert_eq!(s.all.ios, 200);
        let r = s.rounds.as_ref().unwrap();
        assert_eq!(r.median, 2);
        assert_eq!(r.rounds.len(), 3);
        assert!((r.spread_pct - 100.0).abs() < 1e-9, "{}", r.spread_pct);
        assert!(
            s.render().contains(
                "rounds   3: median of IOPS 300, 100, 200 (round 3 shown), spread 100.0%"
            ),
            "{}",
            s.render()
        );
        let j = serde_json::to_value(&s).unwrap();
        assert_eq!(j["rounds"]["rounds"][1]["iops"], 100.0);
    }

    #[test]
    fn a_round_that_overlapped_other_work_runs_again() {
        let mut tries = 0;
        let s = run(2, || {
            tries += 1;
            let mut s = summary("t", 4096, 100 + tries, 10);
            // the first try: half a core of other work during a 1 s run
            s.cpu.other_s = Some(if tries == 1 { 0.5 } else { 0.01 });
            Ok(s)
        })
        .unwrap();
        assert_eq!(tries, 3);
        let r = s.rounds.unwrap();
        assert!(r.rounds[0].repeated && !r.rounds[1].repeated);
        assert_eq!(r.rounds[0].iops, 102.0);
        assert!(r.render().contains("102*, 103"), "{}", r.render());
    }
}

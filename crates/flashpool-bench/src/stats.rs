//! Results: latency from HDR histograms, rates, CPU time of the bench and of
//! the target process, the human summary and the JSON form.

use std::fmt::Write as _;

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::engine::VerifyCounts;
use crate::spec::{Workload, human_bytes};
use crate::verify::Bad;

/// Latency in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Latency {
    pub min_us: f64,
    pub mean_us: f64,
    pub stdev_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub p9999_us: f64,
    pub max_us: f64,
}

impl Latency {
    pub fn of(h: &Histogram<u64>) -> Latency {
        if h.is_empty() {
            return Latency::default();
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        Latency {
            min_us: us(h.min()),
            mean_us: h.mean() / 1000.0,
            stdev_us: h.stdev() / 1000.0,
            p50_us: us(h.value_at_quantile(0.50)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            p9999_us: us(h.value_at_quantile(0.9999)),
            max_us: us(h.max()),
        }
    }
}

/// A histogram as (value, count) pairs of the recorded values: lossless at its precision.
#[derive(Debug, Clone, Serialize)]
pub struct HistogramJson {
    pub unit: &'static str,
    pub significant_digits: u8,
    pub buckets: Vec<(u64, u64)>,
}

impl HistogramJson {
    pub fn of(h: &Histogram<u64>) -> HistogramJson {
        HistogramJson {
            unit: "ns",
            significant_digits: h.sigfig(),
            buckets: h
                .iter_recorded()
                .map(|v| (v.value_iterated_to(), v.count_at_value()))
                .collect(),
        }
    }
}

/// One direction (or both together).
#[derive(Debug, Clone, Serialize)]
pub struct Rates {
    pub ios: u64,
    pub bytes: u64,
    pub iops: f64,
    /// 10^6 bytes per second.
    pub mb_s: f64,
    pub lat: Latency,
    pub histogram: HistogramJson,
}

impl Rates {
    pub fn of(h: &Histogram<u64>, bytes: u64, secs: f64) -> Rates {
        let ios = h.len();
        let secs = secs.max(1e-9);
        Rates {
            ios,
            bytes,
            iops: ios as f64 / secs,
            mb_s: bytes as f64 / secs / 1e6,
            lat: Latency::of(h),
            histogram: HistogramJson::of(h),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Cpu {
    /// User + system seconds of this process over the measured interval.
    pub bench_s: f64,
    pub bench_s_per_million_ios: f64,
    /// Same for --target-pid, when given.
    pub target_s: Option<f64>,
    pub target_s_per_million_ios: Option<f64>,
    /// CPU seconds the rest of the machine used meanwhile (all CPUs, user
    /// and system, less the bench and the target): other work that
    /// overlapped the run. None where /proc/stat cannot be read.
    pub other_s: Option<f64>,
    /// The 1-minute load average when the measurement started.
    pub load_1m: Option<f64>,
}

impl Cpu {
    /// Cores of other work, on average, during the measurement.
    pub fn other_cores(&self, elapsed_s: f64) -> Option<f64> {
        self.other_s.map(|o| o / elapsed_s.max(1e-9))
    }
}

/// Above this many cores of other work a run is flagged as disturbed (and
/// repeated once under --rounds): a tenth of a core.
pub const DISTURBED_CORES: f64 = 0.1;

#[derive(Debug, Clone, Serialize)]
pub struct Mismatch {
    pub lba: u64,
    pub what: Bad,
    pub message: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct VerifySummary {
    pub seed: u64,
    pub checked_blocks: u64,
    pub skipped_blocks: u64,
    pub readback_blocks: u64,
    pub mismatches: u64,
    pub first: Vec<Mismatch>,
}

impl VerifySummary {
    pub(crate) fn of(seed: u64, v: &VerifyCounts) -> VerifySummary {
        VerifySummary {
            seed,
            checked_blocks: v.checked_blocks,
            skipped_blocks: v.skipped_blocks,
            readback_blocks: v.readback_blocks,
            mismatches: v.mismatches,
            first: v
                .first
                .iter()
                .map(|(lba, bad)| Mismatch {
                    lba: *lba,
                    what: bad.clone(),
                    message: bad.to_string(),
                })
                .collect(),
        }
    }
}

/// One round of `--rounds`, in brief.
#[derive(Debug, Clone, Serialize)]
pub struct Round {
    pub iops: f64,
    pub mb_s: f64,
    pub mean_us: f64,
    pub p99_us: f64,
    pub target_s_per_million_ios: Option<f64>,
    pub load_1m: Option<f64>,
    /// Cores of other work during the round (see `Cpu::other_s`).
    pub other_cores: Option<f64>,
    /// The first try overlapped other work and was run again.
    pub repeated: bool,
}

/// Every round of `--rounds` (see `crate::rounds`) and which one the summary is.
#[derive(Debug, Clone, Serialize)]
pub struct Rounds {
    pub rounds: Vec<Round>,
    /// Index in `rounds` of the median (by IOPS), the summary's own figures.
    pub median: usize,
    /// (max - min) / median IOPS, in percent.
    pub spread_pct: f64,
}

impl Rounds {
    pub fn render(&self) -> String {
        let iops: Vec<String> = self
            .rounds
            .iter()
            .map(|r| {
                format!(
                    "{}{}",
                    fmt_thousands(r.iops),
                    if r.repeated { "*" } else { "" }
                )
            })
            .collect();
        format!(
            "  rounds   {}: median of IOPS {} (round {} shown), spread {:.1}%{}\n",
            self.rounds.len(),
            iops.join(", "),
            self.median + 1,
            self.spread_pct,
            if self.rounds.iter().any(|r| r.repeated) {
                "; * run again after overlapping other work"
            } else {
                ""
            }
        )
    }
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub target: String,
    /// What the target turned out to be (device, namespace size, LBA size, digests).
    pub target_detail: String,
    pub workload: Workload,
    /// Seconds from the end of the ramp to the last measured completion.
    pub elapsed_s: f64,
    pub all: Rates,
    pub read: Option<Rates>,
    pub write: Option<Rates>,
    /// I/Os per second asked for with --rate-iops.
    pub offered_iops: Option<u64>,
    pub cpu: Cpu,
    pub verify: Option<VerifySummary>,
    /// --rounds: every round; the figures above are the median round's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rounds: Option<Rounds>,
}

impl Summary {
    pub fn verify_failed(&self) -> bool {
        self.verify.as_ref().is_some_and(|v| v.mismatches > 0)
    }

    /// The human summary.
    pub fn render(&self) -> String {
        let w = &self.workload;
        let mut s = String::new();
        let dur = match (w.runtime, w.size) {
            (Some(t), _) => format!("{:.1} s", t.as_secs_f64()),
            (None, Some(sz)) => format!("one pass over {}", human_bytes(sz)),
            (None, None) => "one pass".into(),
        };
        let _ = writeln!(
            s,
            "{} {}{}, qd {}, {} job{}, {dur}{} on {}{}",
            w.rw.name(),
            human_bytes(u64::from(w.bs)),
            if w.rw == crate::spec::Rw::Randrw {
                format!(" ({}% reads)", w.mix)
            } else {
                String::new()
            },
            w.qd,
            w.jobs,
            if w.jobs == 1 { "" } else { "s" },
            if w.ramp.is_zero() {
                String::new()
            } else {
                format!(" after {:.1} s ramp", w.ramp.as_secs_f64())
            },
            self.target,
            if w.engine == crate::spec::Engine::Queue {
                String::new()
            } else {
                format!(" (engine {})", w.engine.name())
            },
        );
        let _ = writeln!(s, "  target   {}", self.target_detail);
        let line = |s: &mut String, name: &str, r: &Rates| {
            let _ = writeln!(
                s,
                "  {name:<8} {:>12} IOPS {:>10.1} MB/s   {} I/Os in {:.2} s",
                fmt_thousands(r.iops),
                r.mb_s,
                r.ios,
                self.elapsed_s
            );
            let l = &r.lat;
            let _ = writeln!(
                s,
                "  {:<8} lat us: mean {:.1}  p50 {:.1}  p99 {:.1}  p99.9 {:.1}  p99.99 {:.1}  max {:.1}",
                "", l.mean_us, l.p50_us, l.p99_us, l.p999_us, l.p9999_us, l.max_us
            );
        };
        let label = match (&self.read, &self.write, w.rw.writes()) {
            (Some(_), Some(_), _) => "all",
            (_, _, true) if w.rw != crate::spec::Rw::Randrw => "write",
            (_, _, true) => "all",
            _ => "read",
        };
        line(&mut s, label, &self.all);
        if let (Some(r), Some(wr)) = (&self.read, &self.write) {
            line(&mut s, "read", r);
            line(&mut s, "write", wr);
        }
        if let Some(o) = self.offered_iops {
            let _ = writeln!(
                s,
                "  offered  {} IOPS ({:.1}% achieved)",
                fmt_thousands(o as f64),
                100.0 * self.all.iops / o as f64
            );
        }
        let c = &self.cpu;
        let _ = write!(
            s,
            "  cpu      bench {:.2} s ({:.2} cores, {:.2} s per million I/Os)",
            c.bench_s,
            c.bench_s / self.elapsed_s.max(1e-9),
            c.bench_s_per_million_ios
        );
        if let (Some(t), Some(pm)) = (c.target_s, c.target_s_per_million_ios) {
            let _ = write!(
                s,
                "; target {t:.2} s ({:.2} cores, {pm:.2} s per million I/Os)",
                t / self.elapsed_s.max(1e-9)
            );
        }
        s.push('\n');
        if let Some(r) = &self.rounds {
            s.push_str(&r.render());
        }
        if let Some(o) = c.other_cores(self.elapsed_s) {
            let _ = writeln!(
                s,
                "  machine  load {} at start; other work {o:.2} cores during the run{}",
                c.load_1m.map_or("?".into(), |l| format!("{l:.2}")),
                if o > DISTURBED_CORES {
                    " (disturbed: the figures may be low; run again on a quiet machine)"
                } else {
                    ""
                }
            );
        }
        if let Some(v) = &self.verify {
            let _ = writeln!(
                s,
                "  verify   seed {:#x}: {} blocks checked on read, {} read back after writing, {} skipped (not written in this run), {} mismatch{}",
                v.seed,
                v.checked_blocks,
                v.readback_blocks,
                v.skipped_blocks,
                v.mismatches,
                if v.mismatches == 1 { "" } else { "es" }
            );
            for m in &v.first {
                let _ = writeln!(s, "           LBA {}: {}", m.lba, m.message);
            }
        }
        s
    }

    pub fn write_json(&self, path: &std::path::Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).context("encoding the summary as JSON")?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write --json {}", path.display()))
    }
}

/// 1234567.8 -> "1,234,568".
pub fn fmt_thousands(v: f64) -> String {
    let n = v.round() as u64;
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// User + system CPU seconds of this process.
pub fn self_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes one rusage struct to the pointer; zeroed is a valid initial value.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU seconds the machine spent in user and system mode (all CPUs, from the
/// first line of /proc/stat); interrupt time is left out, since the
/// network work of the bench and the target themselves lands there.
pub fn machine_busy_seconds() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let f: Vec<u64> = text
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .take(3)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(f.iter().sum::<u64>() as f64 / if hz > 0 { hz as f64 } else { 100.0 })
}

/// The 1-minute load average.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// utime + stime of process `pid` from /proc/PID/stat, in seconds.
pub fn process_cpu_seconds(pid: u32) -> Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!("--target-pid {pid}: cannot read {path}; is the process running?")
    })?;
    let ticks = parse_stat_ticks(&text).with_context(|| format!("{path}: unexpected format"))?;
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Ok(ticks as f64 / if hz > 0 { hz as f64 } else { 100.0 })
}

/// utime + stime (fields 14 and 15) in clock ticks; the command name may hold spaces and parentheses.
fn parse_stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: field 3 (state) is f[0], so field n is f[n - 3].
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields() {
        let line =
            "4242 (fp (reactor) 0) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 56 0 0 20 0 3 0 1 2 3";
        assert_eq!(parse_stat_ticks(line), Some(1290));
        assert!(parse_stat_ticks("garbage").is_none());
        assert!(process_cpu_seconds(std::process::id()).unwrap() >= 0.0);
        assert!(self_cpu_seconds() > 0.0);
    }

    #[test]
    fn numbers() {
        assert_eq!(fmt_thousands(1_234_567.8), "1,234,568");
        assert_eq!(fmt_thousands(999.0), "999");
        let mut h = crate::engine::new_histogram();
        for v in [1000u64, 2000, 3000, 4000] {
            h.record(v).unwrap();
        }
        let l = Latency::of(&h);
        assert!(
            (l.mean_us - 2.5).abs() < 0.01 && (l.max_us - 4.0).abs() < 0.01,
            "{l:?}"
        );
        let r = Rates::of(&h, 4 * 4096, 2.0);
        assert_eq!((r.ios, r.iops), (4, 2.0));
        assert_eq!(r.histogram.buckets.len(), 4);
    }
}

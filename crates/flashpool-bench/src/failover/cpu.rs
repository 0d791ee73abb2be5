//! CPU time of the cluster's processes around a fault: sampled from
//! `/proc/PID/task/*/schedstat` (nanoseconds on a CPU, every thread), or
//! `/proc/PID/stat` (clock ticks) where schedstat is missing.

use std::time::{Duration, Instant};

/// CPU time of every thread of `pid` so far, in nanoseconds; None once it is gone.
pub(crate) fn cpu_ns(pid: u32) -> Option<u64> {
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        let mut total = 0u64;
        let mut any = false;
        for t in tasks.flatten() {
            let p = t.path().join("schedstat");
            if let Some(ns) = std::fs::read_to_string(p)
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            {
                total += ns;
                any = true;
            }
        }
        if any {
            return Some(total);
        }
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // fields after the command name (which may hold spaces): state is field 3
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(ticks * 1_000_000_000 / hz)
}

/// Samples of the watched processes: seconds since the fault, and each
/// process's CPU nanoseconds (the last value kept once a process is gone).
#[derive(Default)]
pub(crate) struct Samples {
    pub(crate) at: Vec<f64>,
    pub(crate) ns: Vec<Vec<u64>>,
}

impl Samples {
    pub(crate) fn push(&mut self, t: f64, now: &[Option<u64>]) {
        let last = self.ns.last().cloned();
        let row = now
            .iter()
            .enumerate()
            .map(|(i, v)| v.unwrap_or_else(|| last.as_ref().map_or(0, |l| l[i])))
            .collect();
        self.at.push(t);
        self.ns.push(row);
    }

    fn total(&self, i: usize) -> u64 {
        self.ns[i].iter().sum()
    }

    /// CPU seconds of process `p` (None: all together) between the samples
    /// nearest to `from` and `to` (seconds since the fault).
    pub(crate) fn cpu_s(&self, p: Option<usize>, from: f64, to: f64) -> f64 {
        let (Some(a), Some(b)) = (self.index_at(from), self.index_at(to)) else {
            return 0.0;
        };
        let v = |i: usize| p.map_or_else(|| self.total(i), |p| self.ns[i][p]);
        v(b).saturating_sub(v(a)) as f64 / 1e9
    }

    fn index_at(&self, t: f64) -> Option<usize> {
        if self.at.is_empty() {
            return None;
        }
        let i = self.at.partition_point(|&x| x < t);
        Some(i.min(self.at.len() - 1))
    }

    /// Seconds after `t_last` until the watched processes are quiet: the end
    /// of the last window of `k` sampling intervals ending after `t_last` in
    /// which they used more than `cores` CPUs together (a window of several
    /// intervals: one short burst, a heartbeat or a compaction, is no busy
    /// machine); 0 if none did; None if the last window was still busy.
    pub(crate) fn quiet_after(&self, t_last: f64, cores: f64, k: usize) -> Option<f64> {
        let k = k.max(1);
        let mut quiet = 0.0f64;
        let n = self.at.len();
        for i in 1..n {
            if self.at[i] <= t_last {
                continue;
            }
            let from = i.saturating_sub(k);
            let dt = self.at[i] - self.at[from];
            let used = self.total(i).saturating_sub(self.total(from)) as f64 / 1e9;
            if dt > 0.0 && used / dt > cores {
                if i == n - 1 {
                    return None;
                }
                quiet = self.at[i] - t_last;
            }
        }
        Some(quiet.max(0.0))
    }
}

/// What the sampler thread saw: when, and each process's CPU nanoseconds then.
pub(crate) type Raw = (Vec<Instant>, Vec<Vec<Option<u64>>>);

/// Samples `pids` every `every` until `stop` is set, on its own thread (a
/// busy runtime must not stretch the intervals); `t0` is set when the fault
/// is done, samples before it get negative times.
pub(crate) fn sample(
    pids: Vec<u32>,
    every: Duration,
    start: Instant,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Raw> {
    std::thread::spawn(move || {
        let (mut at, mut rows) = (Vec::new(), Vec::new());
        let mut next = start;
        loop {
            let row: Vec<Option<u64>> = pids.iter().map(|&p| cpu_ns(p)).collect();
            at.push(Instant::now());
            rows.push(row);
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                return (at, rows);
            }
            next += every;
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            } else {
                next = now;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(rows: &[(f64, &[u64])]) -> Samples {
        let mut s = Samples::default();
        for (t, r) in rows {
            let v: Vec<Option<u64>> = r.iter().map(|&x| Some(x)).collect();
            s.push(*t, &v);
        }
        s
    }

    const MS: u64 = 1_000_000;

    #[test]
    fn quiet_is_the_end_of_the_last_busy_interval() {
        // two processes; 0.1 s intervals; the last volume at 0.2 s
        let x = s(&[
            (0.0, &[0, 0]),
            (0.1, &[50 * MS, 50 * MS]), // busy (before the last volume: not counted)
            (0.2, &[100 * MS, 100 * MS]), // busy
            (0.3, &[130 * MS, 100 * MS]), // 0.3 cores: busy
            (0.4, &[131 * MS, 100 * MS]), // quiet
            (0.5, &[135 * MS, 102 * MS]), // 0.06 cores: quiet at 0.1
            (0.6, &[135 * MS, 102 * MS]),
        ]);
        assert!((x.quiet_after(0.2, 0.1, 1).unwrap() - 0.1).abs() < 1e-9);
        assert!((x.quiet_after(0.2, 0.05, 1).unwrap() - 0.3).abs() < 1e-9);
        assert_eq!(x.quiet_after(0.3, 0.5, 1), Some(0.0));
        // over windows of two intervals: the one ending at 0.3 (0.65 CPUs) and at 0.4
        // (0.031 s in 0.2 s = 0.155 CPUs) are busy at 0.1; at 0.2, only the first
        assert!((x.quiet_after(0.2, 0.1, 2).unwrap() - 0.2).abs() < 1e-9);
        assert!((x.quiet_after(0.2, 0.2, 2).unwrap() - 0.1).abs() < 1e-9);
        assert!((x.cpu_s(None, 0.0, 0.2) - 0.2).abs() < 1e-9);
        assert!((x.cpu_s(Some(1), 0.2, 0.6) - 0.002).abs() < 1e-9);
    }

    #[test]
    fn busy_to_the_end_is_not_quiet() {
        let x = s(&[(0.0, &[0]), (0.1, &[10 * MS]), (0.2, &[90 * MS])]);
        assert_eq!(x.quiet_after(0.0, 0.5, 1), None);
        // one burst in a window of three is not busy
        let y = s(&[
            (0.0, &[0]),
            (0.1, &[0]),
            (0.2, &[30 * MS]),
            (0.3, &[30 * MS]),
            (0.4, &[30 * MS]),
        ]);
        assert_eq!(y.quiet_after(0.0, 0.15, 3), Some(0.0));
        assert!((y.quiet_after(0.0, 0.15, 1).unwrap() - 0.2).abs() < 1e-9);
    }

    #[test]
    fn a_process_that_goes_keeps_its_last_time() {
        let mut x = Samples::default();
        x.push(0.0, &[Some(5), Some(7)]);
        x.push(0.1, &[None, Some(9)]);
        assert_eq!(x.ns[1], vec![5, 9]);
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        let a = cpu_ns(me).unwrap();
        // 50 ms on the CPU, then a sleep: the kernel adds a running thread's time at ticks
        // and switches, so the next read sees it
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
        }
        std::thread::sleep(Duration::from_millis(5));
        assert!(cpu_ns(me).unwrap() > a);
        assert!(cpu_ns(u32::MAX).is_none());
    }
}

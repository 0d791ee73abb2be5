//! The progress line on stderr while a run goes: IOPS, MB/s and mean
//! latency of the last second, in place on a terminal, one line a second
//! otherwise.

use std::io::{IsTerminal, Write};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use crate::engine::Shared;
use crate::spec::Workload;
use crate::stats;

/// The line on stderr, once a second.
pub(crate) struct Progress<'a> {
    on: bool,
    tty: bool,
    shared: &'a Shared,
    start: Instant,
    last: (Instant, u64, u64, u64),
    rw: &'static str,
    printed: bool,
}

impl<'a> Progress<'a> {
    pub(crate) fn new(w: &Workload, shared: &'a Shared, start: Instant) -> Self {
        Progress {
            on: w.progress,
            tty: std::io::stderr().is_terminal(),
            shared,
            start,
            last: (start, 0, 0, 0),
            rw: w.rw.name(),
            printed: false,
        }
    }

    fn totals(&self) -> (u64, u64, u64) {
        self.shared.live.iter().fold((0, 0, 0), |(a, b, c), l| {
            (
                a + l.ios.load(Relaxed),
                b + l.bytes.load(Relaxed),
                c + l.lat_ns.load(Relaxed),
            )
        })
    }

    pub(crate) fn tick(&mut self, now: Instant, measure_from: Instant, total: Option<Duration>) {
        if !self.on {
            return;
        }
        let (ios, bytes, lat) = self.totals();
        let (t0, ios0, bytes0, lat0) = self.last;
        let dt = now.duration_since(t0).as_secs_f64().max(1e-9);
        let dios = ios - ios0;
        let mean_us = if dios > 0 {
            (lat - lat0) as f64 / dios as f64 / 1000.0
        } else {
            0.0
        };
        let elapsed = now.duration_since(self.start).as_secs_f64();
        let of = total.map_or(String::new(), |t| format!("/{:.0}", t.as_secs_f64()));
        let line = format!(
            "[{elapsed:>4.0}{of} s] {} {:>10} IOPS {:>9.1} MB/s  mean {:>8.1} us{}",
            self.rw,
            stats::fmt_thousands(dios as f64 / dt),
            (bytes - bytes0) as f64 / dt / 1e6,
            mean_us,
            if now < measure_from { "  (ramp)" } else { "" }
        );
        let mut e = std::io::stderr().lock();
        let _ = if self.tty {
            write!(e, "\r\x1b[K{line}")
        } else {
            writeln!(e, "{line}")
        };
        let _ = e.flush();
        self.printed = true;
        self.last = (now, ios, bytes, lat);
    }

    pub(crate) fn finish(&self) {
        if self.on && self.tty && self.printed {
            eprintln!();
        }
    }
}

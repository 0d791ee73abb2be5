//! Adaptive polling of one connection: after activity, keep the reactor
//! spinning for a short window instead of sleeping, so that the host's next
//! command is picked up without a wake-up (tens of microseconds on small
//! VMs), but only while that pays.
//!
//! A spin pays when the host comes back within the window. When it comes
//! back later, the queue sleeps and is woken anyway, and the window was
//! burnt for nothing: measured at 500 IOPS QD 1, the target spent 104 µs
//! of CPU per I/O spinning against 52 µs asleep (docs/performance.md). So
//! the queue keeps a running share of spins that ended in work, stops
//! spinning when hardly any do, and probes now and then to see whether
//! spinning pays again.
//!
//! The bar is low on purpose: a spin that catches the host saves a
//! wake-up on the critical path, a wasted one costs only CPU. With a
//! sleeping client at QD 32, whose turnaround is often just over the
//! window, stopping at a quarter of hits lost a quarter of the IOPS.

use std::time::{Duration, Instant};

/// Spin only while at least this share of spins ended in work (1/1024ths):
/// about one spin in ten, given the running average's weight of 1/8.
const WORTH: u32 = 32;
/// While spinning does not pay, one quiet spell in this many spins anyway:
/// a gap measured asleep includes this thread's own wake-up, so only a
/// spin measures whether spinning would catch the host.
const PROBE: u32 = 16;

pub(super) struct Poller {
    /// The window; None: never spin (`poll_us = 0`).
    window: Option<Duration>,
    /// When the queue last received data, completed I/O or sent answers.
    pub last_busy: Instant,
    /// Spins that ended in work: a running average of hits (1024) and
    /// misses (0) over the last eight or so.
    hits: u32,
    /// Whether the current quiet spell spins.
    spins: bool,
    spells: u32,
}

impl Poller {
    pub fn new(poll_us: u32) -> Self {
        Poller {
            window: (poll_us > 0).then(|| Duration::from_micros(u64::from(poll_us))),
            last_busy: Instant::now(),
            hits: 1024,
            spins: true,
            spells: 0,
        }
    }

    pub fn enabled(&self) -> bool {
        self.window.is_some()
    }

    /// Whether the reactor should spin now rather than sleep.
    pub fn spin(&self) -> bool {
        self.spins && self.window.is_some_and(|w| self.last_busy.elapsed() < w)
    }

    /// The host sent something at `now`. `quiet`: nothing was in flight,
    /// so this ends a quiet spell: score the spin, if there was one, and
    /// choose whether the next spell spins.
    pub fn host_sent(&mut self, now: Instant, quiet: bool) {
        if let Some(w) = self.window
            && quiet
        {
            if self.spins {
                let hit = now.saturating_duration_since(self.last_busy) < w;
                self.hits = if hit {
                    self.hits + (1024 - self.hits) / 8
                } else {
                    self.hits - self.hits / 8
                };
            }
            self.spells = self.spells.wrapping_add(1);
            self.spins = self.hits >= WORTH || self.spells.is_multiple_of(PROBE);
        }
        self.last_busy = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Quiet spells ending `gap_us` after the last activity; how many of
    /// the last `n` spun.
    fn spells(p: &mut Poller, gap_us: u64, n: u32) -> u32 {
        let mut spun = 0;
        for _ in 0..n {
            spun += u32::from(p.spins);
            let now = p.last_busy + Duration::from_micros(gap_us);
            p.host_sent(now, true);
        }
        spun
    }

    #[test]
    fn spins_while_the_host_comes_back_within_the_window() {
        let mut p = Poller::new(50);
        assert_eq!(spells(&mut p, 20, 1000), 1000);
        // busy periods (not quiet) change nothing
        for _ in 0..100 {
            let now = p.last_busy + Duration::from_millis(5);
            p.host_sent(now, false);
        }
        assert_eq!(spells(&mut p, 20, 10), 10);
    }

    #[test]
    fn stops_when_spins_are_wasted_and_probes_back() {
        let mut p = Poller::new(50);
        // a sparse host: a few wasted spins, then only probes
        spells(&mut p, 2000, 40);
        let spun = spells(&mut p, 2000, 160);
        assert_eq!(spun, 10, "one spell in {PROBE} probes");
        // the host speeds up: the probes see it and spinning comes back
        spells(&mut p, 10, 6 * PROBE);
        assert_eq!(spells(&mut p, 10, 50), 50);
    }

    #[test]
    fn a_mix_keeps_spinning_while_some_spins_pay() {
        let mut p = Poller::new(50);
        // one spell in eight comes back in time: spinning still pays
        let mut spun = 0;
        for i in 0..400 {
            spun += spells(&mut p, if i % 8 == 0 { 10 } else { 500 }, 1);
        }
        assert_eq!(spun, 400);
        // one in fifty does not
        let mut p = Poller::new(50);
        let mut spun = 0;
        for i in 0..800 {
            spun += spells(&mut p, if i % 50 == 0 { 10 } else { 500 }, 1);
        }
        assert!(spun < 200, "{spun}");
    }

    #[test]
    fn zero_never_spins() {
        let mut p = Poller::new(0);
        assert!(!p.spin());
        spells(&mut p, 10, 10);
        assert!(!p.spin());
    }
}

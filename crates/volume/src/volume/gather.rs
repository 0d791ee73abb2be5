//! Gathering partial-stripe writes into full stripes (md's stripe cache,
//! without its write-back).
//!
//! A sequential stream whose writes do not line up with stripes (raid5 5+1
//! with 32 KiB strips takes 160 KiB per stripe; hosts write 128 KiB) makes
//! every stripe two partial writes, each a read-modify-write. The target
//! submits a write only once its data has arrived, so the write that
//! completes a stripe comes a few tens of microseconds after the one that
//! started it. Here the first partial write of a stripe in a stream waits a
//! short window for the others; once the parts cover the stripe they go to
//! the members as one full-stripe write (parity from the new data alone, no
//! reads), and every part completes with it.
//!
//! Nothing is acknowledged before it is on the members: a part completes
//! when the merged write has gone through the same stripe lock, intent
//! bitmap and journal as any write, so crash safety is the engine's. A
//! window that ends without a full stripe, a failed merged write or a
//! leader that went away sends each part back to write itself.
//!
//! Only writes that continue the previous write (a stream) while other
//! writes are in flight start a window, so random writes and a stream at
//! queue depth 1 never wait, nor do writes too small to fill a stripe
//! within one window. The window is a few times the stream's recent
//! gap between writes (on a busy owner the next write comes hundreds of
//! microseconds later), within `WINDOW_MIN..WINDOW_MAX`; the leader sleeps
//! on a timer and is woken by the part that fills the stripe, so waiting
//! costs no CPU. A score of recent windows (full or not) stops the waiting
//! where it does not pay; every 64th candidate probes again. Outside a
//! tokio runtime, or inside `blockdev::block_on` (no timer either),
//! nothing waits.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use blockdev::{AlignedBuf, BlockError};
use tokio::sync::{Notify, oneshot};

use super::Inner;
use super::member_io::{abuf, recycle};
use super::write::Src;
use crate::layout::Extent;
use crate::parity::Code;

/// Bounds of how long the first partial write of a stripe waits for the
/// rest: `WINDOW_GAPS` times the stream's mean gap between writes.
const WINDOW_MIN: Duration = Duration::from_micros(200);
const WINDOW_MAX: Duration = Duration::from_millis(3);
const WINDOW_GAPS: u64 = 4;
/// Largest stripe (data bytes) gathered: bounds the memory of one window.
const MAX_STRIPE_BYTES: u64 = 2 << 20;
/// Stripes gathering at once, at most (with the above: 64 MiB).
const MAX_OPEN: usize = 32;
/// Bounds of the score; a window starts while it is above zero.
const SCORE_MAX: i32 = 16;
const SCORE_MIN: i32 = -16;

/// Per-volume gathering state.
pub(crate) struct Gather {
    open: parking_lot::Mutex<HashMap<u64, Open>>,
    /// Where the last write that came in ended: a write starting there
    /// continues a stream.
    next_lba: AtomicU64,
    /// Writes between entry and completion.
    in_flight: AtomicUsize,
    /// When the last write of a stream came in, and the mean gap between
    /// them (ns since `epoch()`, ns; a moving average of 1/8 weight).
    last_seq_ns: AtomicU64,
    gap_ns: AtomicU64,
    score: AtomicI32,
    probes: AtomicU64,
    /// Full stripes written from parts of several writes.
    pub(crate) merged: AtomicU64,
    /// Windows that ended without a full stripe.
    pub(crate) expired: AtomicU64,
}

impl Default for Gather {
    fn default() -> Self {
        Gather {
            open: parking_lot::Mutex::new(HashMap::new()),
            next_lba: AtomicU64::new(u64::MAX),
            in_flight: AtomicUsize::new(0),
            last_seq_ns: AtomicU64::new(0),
            gap_ns: AtomicU64::new(0),
            score: AtomicI32::new(4),
            probes: AtomicU64::new(0),
            merged: AtomicU64::new(0),
            expired: AtomicU64::new(0),
        }
    }
}

/// A stripe gathering parts.
struct Open {
    /// The stripe's data, as the parts wrote it (later parts over earlier).
    buf: AlignedBuf,
    /// Block ranges of the stripe the parts cover: sorted, disjoint.
    covered: Vec<(u64, u64)>,
    fua: bool,
    /// The parts other than the leader's.
    waiters: Vec<oneshot::Sender<Outcome>>,
    /// Wakes the leader once the stripe is covered.
    full: Arc<Notify>,
}

/// What a partial write is in its stripe's window.
enum Role {
    /// Another write leads the window: wait for its outcome.
    Part(oneshot::Receiver<Outcome>),
    /// Leads the window; woken when the stripe is covered.
    Leader(Arc<Notify>),
    /// No window: write at once.
    Alone,
}

#[derive(Clone, Copy)]
enum Outcome {
    /// On the members as part of a full stripe.
    Written,
    /// Not written: the part writes itself.
    Alone,
}

impl Open {
    fn add(&mut self, rel: u64, blocks: u64, bytes: &[u8], bs: u64, fua: bool) {
        let at = (rel * bs) as usize;
        self.buf[at..at + bytes.len()].copy_from_slice(bytes);
        self.fua |= fua;
        let (mut lo, mut hi) = (rel, rel + blocks);
        // Merge with every range it touches or adjoins.
        self.covered.retain(|&(a, b)| {
            if b < lo || a > hi {
                return true;
            }
            lo = lo.min(a);
            hi = hi.max(b);
            false
        });
        let i = self.covered.partition_point(|&(a, _)| a < lo);
        self.covered.insert(i, (lo, hi));
    }

    fn full(&self, per: u64) -> bool {
        self.covered == [(0, per)]
    }
}

/// Takes the leader's stripe out of the open set when the leader goes away
/// (its future dropped): the other parts then see their channel closed and
/// write themselves.
struct Lead<'a> {
    g: &'a Gather,
    stripe: u64,
    done: bool,
}

impl Lead<'_> {
    fn take(mut self) -> Option<Open> {
        self.done = true;
        self.g.open.lock().remove(&self.stripe)
    }
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.g.open.lock().remove(&self.stripe);
        }
    }
}

/// Counts a write as in flight while alive.
pub(crate) struct InFlight<'a>(&'a Gather);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A fixed point for the stream's arrival times.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Gather {
    /// Notes a write of `lba..lba + blocks` coming in; returns whether it
    /// continues the previous one, and its in-flight guard.
    pub(crate) fn enter(&self, lba: u64, blocks: u64) -> (bool, InFlight<'_>) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let seq = self.next_lba.swap(lba + blocks, Ordering::Relaxed) == lba;
        if seq {
            let now = epoch().elapsed().as_nanos() as u64;
            let last = self.last_seq_ns.swap(now, Ordering::Relaxed);
            if last != 0 {
                let gap = now.saturating_sub(last).min(WINDOW_MAX.as_nanos() as u64);
                let mean = self.gap_ns.load(Ordering::Relaxed);
                let mean = if mean == 0 {
                    gap
                } else {
                    mean - mean / 8 + gap / 8
                };
                self.gap_ns.store(mean, Ordering::Relaxed);
            }
        }
        (seq, InFlight(self))
    }

    /// How long a leader waits now.
    fn window(&self) -> Duration {
        let gap = Duration::from_nanos(self.gap_ns.load(Ordering::Relaxed) * WINDOW_GAPS);
        gap.clamp(WINDOW_MIN, WINDOW_MAX)
    }

    fn may_lead(&self, seq: bool) -> bool {
        if !seq
            || self.in_flight.load(Ordering::Relaxed) < 2
            || tokio::runtime::Handle::try_current().is_err()
            || blockdev::in_block_on()
        {
            return false;
        }
        self.score.load(Ordering::Relaxed) > 0
            || self
                .probes
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(64)
    }

    fn scored(&self, delta: i32) {
        let _ = self
            .score
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| {
                Some((s + delta).clamp(SCORE_MIN, SCORE_MAX))
            });
    }
}

impl Inner {
    /// Whether a window is open on `stripe` (tests).
    #[cfg(test)]
    pub(crate) fn gather_open(&self, stripe: u64) -> bool {
        self.gather.open.lock().contains_key(&stripe)
    }

    /// Whether this volume's partial-stripe writes may be gathered: parity
    /// layouts (not mirrors) with stripes of at most `MAX_STRIPE_BYTES`.
    pub(crate) fn gathers(&self) -> bool {
        self.parity.code != Code::None
            && self.parity.code != Code::Mirror
            && self.layout.stripe_data_blocks() * self.bs <= MAX_STRIPE_BYTES
    }

    /// Writes one stripe's share of a write (`exts`, from `src`): joins or
    /// starts a gathering window where that pays, else as
    /// [`Inner::write_stripe`]. `seq`: the write continues the previous one;
    /// `whole`: the write's length in blocks (all its stripes).
    pub(crate) async fn write_stripe_gathered(
        &self,
        exts: &[Extent],
        src: Src<'_>,
        fua: bool,
        seq: bool,
        whole: u64,
    ) -> Result<(), BlockError> {
        let per = self.layout.stripe_data_blocks();
        let blocks: u64 = exts.iter().map(|e| e.blocks).sum();
        if blocks >= per || !self.gathers() {
            return self.write_stripe(exts, src, fua).await;
        }
        let stripe = exts[0].stripe;
        // The extents are in LBA order, so the part starts at its first one.
        let rel = exts[0].col as u64 * self.layout.strip_blocks() + exts[0].row;
        let g = &self.gather;
        // Decided under the lock, awaited after it.
        let role = {
            let mut open = g.open.lock();
            if let Some(o) = open.get_mut(&stripe) {
                o.add(rel, blocks, src.bytes(), self.bs, fua);
                let (tx, rx) = oneshot::channel();
                o.waiters.push(tx);
                if o.full(per) {
                    o.full.notify_one();
                }
                Role::Part(rx)
            } else if open.len() >= MAX_OPEN
                // Writes this small could not fill the stripe in one window
                // (the host sends the next ones as these complete).
                || whole * (WINDOW_GAPS + 1) < per
                || !g.may_lead(seq)
            {
                Role::Alone
            } else {
                let mut o = Open {
                    buf: abuf((per * self.bs) as usize),
                    covered: Vec::with_capacity(4),
                    fua: false,
                    waiters: Vec::new(),
                    full: Arc::new(Notify::new()),
                };
                o.add(rel, blocks, src.bytes(), self.bs, fua);
                let full = o.full.clone();
                open.insert(stripe, o);
                Role::Leader(full)
            }
        };
        let full = match role {
            Role::Part(rx) => {
                return match rx.await {
                    Ok(Outcome::Written) => Ok(()),
                    Ok(Outcome::Alone) | Err(_) => self.write_stripe(exts, src, fua).await,
                };
            }
            Role::Alone => return self.write_stripe(exts, src, fua).await,
            Role::Leader(full) => full,
        };
        let lead = Lead {
            g,
            stripe,
            done: false,
        };
        // The part that fills the stripe wakes us (a permit if it came first).
        let _ = tokio::time::timeout(g.window(), full.notified()).await;
        let full = g.open.lock().get(&stripe).is_some_and(|o| o.full(per));
        let Some(o) = lead.take() else {
            return self.write_stripe(exts, src, fua).await;
        };
        if !full {
            g.expired.fetch_add(1, Ordering::Relaxed);
            g.scored(-2);
            for w in o.waiters {
                let _ = w.send(Outcome::Alone);
            }
            recycle(o.buf);
            return self.write_stripe(exts, src, fua).await;
        }
        g.merged.fetch_add(1, Ordering::Relaxed);
        g.scored(1);
        let len = o.buf.len();
        let shared = o.buf.share();
        let all = self.layout.extents(stripe * per, per);
        let r = self.write_stripe(&all, Src::new(&shared, len), o.fua).await;
        let out = if r.is_ok() {
            Outcome::Written
        } else {
            Outcome::Alone
        };
        for w in o.waiters {
            let _ = w.send(out);
        }
        recycle(super::write::unshare(shared));
        // Its own part goes back to write itself too, as the others did
        // (not once fenced: no write may go out then).
        if r.is_err() && !self.fence.is_set() {
            return self.write_stripe(exts, src, fua).await;
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coverage_merges_touching_and_overlapping_ranges() {
        let mut o = Open {
            buf: abuf(64 * 512),
            covered: Vec::new(),
            fua: false,
            waiters: Vec::new(),
            full: Arc::new(Notify::new()),
        };
        o.add(10, 6, &[1; 6 * 512], 512, false);
        o.add(40, 24, &[2; 24 * 512], 512, false);
        assert_eq!(o.covered, [(10, 16), (40, 64)]);
        o.add(0, 10, &[3; 10 * 512], 512, true);
        assert_eq!(o.covered, [(0, 16), (40, 64)]);
        assert!(!o.full(64));
        // Overlaps both: the later part's bytes win where they overlap.
        o.add(12, 30, &[4; 30 * 512], 512, false);
        assert!(o.full(64));
        assert!(o.fua);
        assert_eq!(o.buf[11 * 512], 1);
        assert_eq!(o.buf[12 * 512], 4);
        assert_eq!(o.buf[41 * 512], 4);
        assert_eq!(o.buf[42 * 512], 2);
    }
}

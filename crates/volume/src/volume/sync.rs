//! Long parity passes that run in the background while the volume serves:
//! the initial sync after `create` (also the crash resync that a takeover
//! defers, [`Volume::assemble_deferring_resync`]), and scrub. Both report progress through
//! a [`SyncControl`], can be stopped, and can be held to a rate.
//!
//! The initial sync is crash-safe through the write-intent bitmap: `create`
//! sets every region's bit on disk and keeps one intent reference per region
//! (so no flush clears it); the sync drops a region's reference once its
//! stripes have parity. After a crash, assembly resyncs whatever is still
//! dirty. Until a region is synced its parity is unknown: a write there is
//! made from data (read-modify-write keeps parity as wrong as it was, and
//! the sync fixes it after), but a member lost before the sync ends leaves
//! those stripes unrecoverable, as in md.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use blockdev::BlockError;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use super::{Inner, ScrubReport, Volume, VolumeError};
use crate::intent::IntentLog;
use crate::parity::Code;

/// Stripes synced at once by the initial sync.
const SYNC_PARALLEL: usize = 8;

/// Progress, rate limit and stop switch of one background pass.
#[derive(Debug, Default)]
pub struct SyncControl {
    /// Set to stop the pass at the next stripe.
    pub cancel: AtomicBool,
    /// Bytes per second of stripe data to check; 0 = as fast as possible.
    pub rate_bytes_per_sec: AtomicU64,
    /// Stripes done and to do in this pass.
    pub done: AtomicU64,
    pub total: AtomicU64,
    /// Stripe data bytes covered so far.
    pub bytes: AtomicU64,
    /// Stripes whose parity disagreed with their data.
    pub mismatches: AtomicU64,
    pub repaired: AtomicU64,
    /// Stripes that could not be checked (a data member missing).
    pub skipped: AtomicU64,
    started: parking_lot::Mutex<Option<Instant>>,
}

impl SyncControl {
    pub fn with_rate(rate_bytes_per_sec: Option<u64>) -> Self {
        let c = SyncControl::default();
        c.rate_bytes_per_sec
            .store(rate_bytes_per_sec.unwrap_or(0), Ordering::Relaxed);
        c
    }

    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    /// Bytes per second since the pass began.
    pub fn bytes_per_sec(&self) -> f64 {
        let elapsed = self.started.lock().map(|t| t.elapsed().as_secs_f64());
        elapsed
            .filter(|&e| e > 0.0)
            .map_or(0.0, |e| self.bytes.load(Ordering::Relaxed) as f64 / e)
    }

    /// Time left at the rate so far (None before any progress).
    pub fn eta(&self) -> Option<Duration> {
        let done = self.done.load(Ordering::Relaxed);
        let total = self.total.load(Ordering::Relaxed);
        let elapsed = self.started.lock().map(|t| t.elapsed())?;
        (done > 0).then(|| elapsed.mul_f64(total.saturating_sub(done) as f64 / done as f64))
    }

    fn begin(&self, total: u64) {
        self.total.store(total, Ordering::Relaxed);
        self.done.store(0, Ordering::Relaxed);
        *self.started.lock() = Some(Instant::now());
    }

    /// Counts one stripe and sleeps as long as the rate asks.
    async fn step(&self, stripe_bytes: u64) {
        self.done.fetch_add(1, Ordering::Relaxed);
        let total = self.bytes.fetch_add(stripe_bytes, Ordering::Relaxed) + stripe_bytes;
        let rate = self.rate_bytes_per_sec.load(Ordering::Relaxed);
        let Some(began) = *self.started.lock() else {
            return;
        };
        if rate > 0 {
            let due = Duration::from_secs_f64(total as f64 / rate as f64);
            let elapsed = began.elapsed();
            if due > elapsed {
                tokio::time::sleep(due - elapsed).await;
            }
        }
    }

    fn report(
        &self,
        rep: &mut ScrubReport,
        stripe: u64,
        r: &Result<Option<bool>, BlockError>,
        repair: bool,
    ) {
        match r {
            Ok(Some(true)) => rep.stripes_checked += 1,
            Ok(Some(false)) => {
                rep.stripes_checked += 1;
                rep.inconsistent_count += 1;
                self.mismatches.fetch_add(1, Ordering::Relaxed);
                if rep.inconsistent.len() < 1000 {
                    rep.inconsistent.push(stripe);
                }
                if repair {
                    rep.repaired += 1;
                    self.repaired.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(None) | Err(_) => {
                rep.skipped += 1;
                self.skipped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Volume {
    /// Checks every stripe's parity against its data, reporting to `ctl`
    /// and stopping when it is cancelled (`ScrubReport::cancelled`); with
    /// `repair`, rewrites parity that disagrees.
    pub async fn scrub_with(&self, repair: bool, ctl: &SyncControl) -> ScrubReport {
        let inner = &self.inner;
        let mut rep = ScrubReport::default();
        if inner.parity.code == Code::None {
            return rep;
        }
        let stripes = inner.layout.stripes();
        ctl.begin(stripes);
        let stripe_bytes = inner.stripe_data_bytes();
        for s in 0..stripes {
            if ctl.cancelled() {
                rep.cancelled = true;
                break;
            }
            let r = inner.sync_stripe(s, repair).await;
            ctl.report(&mut rep, s, &r, repair);
            if r.is_err() && inner.fence.is_set() {
                rep.cancelled = true;
                break;
            }
            ctl.step(stripe_bytes).await;
        }
        rep
    }

    /// Regions still waiting for their initial parity sync.
    pub fn unsynced_regions(&self) -> u64 {
        self.inner.unsynced.lock().len() as u64
    }

    /// Computes the parity of every region not synced since `create`, in
    /// the background while the volume serves. Stops early when `ctl` is
    /// cancelled (the rest stays dirty on disk: the next assembly, or the
    /// next call, syncs it). Stripes that cannot be synced (a data member
    /// missing) are counted as skipped.
    pub async fn initial_sync(&self, ctl: &SyncControl) -> Result<ScrubReport, VolumeError> {
        let inner = &self.inner;
        let regions: Vec<u64> = inner.unsynced.lock().clone();
        let rs = inner.intent.region_stripes;
        let stripes = inner.layout.stripes();
        let span = |r: u64| (r * rs)..((r + 1) * rs).min(stripes);
        ctl.begin(regions.iter().map(|&r| span(r).count() as u64).sum());
        let stripe_bytes = inner.stripe_data_bytes();
        let mut rep = ScrubReport::default();
        for r in regions {
            if ctl.cancelled() {
                rep.cancelled = true;
                break;
            }
            let mut next = span(r);
            let mut running = FuturesUnordered::new();
            let mut failed = None;
            loop {
                while running.len() < SYNC_PARALLEL {
                    match next.next() {
                        Some(s) => running.push(self.sync_one(s)),
                        None => break,
                    }
                }
                let Some((s, res)) = running.next().await else {
                    break;
                };
                // Parity disagreeing is expected here: nothing was synced.
                match res {
                    Ok(Some(_)) => rep.stripes_checked += 1,
                    Ok(None) => {
                        rep.skipped += 1;
                        ctl.skipped.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        failed.get_or_insert(format!("initial sync of stripe {s}: {e}"));
                    }
                }
                ctl.step(stripe_bytes).await;
            }
            if let Some(e) = failed {
                return Err(VolumeError::Rebuild(e));
            }
            inner.unsynced.lock().retain(|&x| x != r);
            inner.intent.end(r);
        }
        if !rep.cancelled && inner.unsynced.lock().is_empty() {
            // Clears the bits of the synced regions on disk now, not at the
            // next idle flush.
            inner
                .flush()
                .await
                .map_err(|e| VolumeError::Rebuild(format!("initial sync: flush: {e}")))?;
        }
        Ok(rep)
    }

    async fn sync_one(&self, s: u64) -> (u64, Result<Option<bool>, BlockError>) {
        (s, self.inner.sync_stripe(s, true).await)
    }
}

impl Inner {
    /// Data bytes of one stripe (what a parity pass covers per stripe).
    fn stripe_data_bytes(&self) -> u64 {
        self.layout.strip_blocks() * self.bs * self.layout.data_columns() as u64
    }

    /// `create` without an inline sync: every region dirty on disk and held.
    pub(crate) async fn mark_all_unsynced(&self) {
        self.mark_unsynced((0..self.intent.regions).collect()).await;
    }

    /// `regions` wait for [`Volume::initial_sync`]: each holds one intent
    /// reference (no flush clears its bit), and every member's bitmap has
    /// the bits before this returns, so a crash or a move before the sync
    /// ends leaves them for the next assembly to resync.
    pub(crate) async fn mark_unsynced(&self, regions: Vec<u64>) {
        for &r in &regions {
            self.intent.begin(r);
        }
        let _io = self.intent.io.lock().await;
        for block in 0..IntentLog::blocks_for(self.intent.regions) as usize {
            let snap = self.intent.snapshot_block(block);
            self.write_bitmap_block(block, &snap).await;
            self.intent.written(block, &snap);
        }
        *self.unsynced.lock() = regions;
    }
}

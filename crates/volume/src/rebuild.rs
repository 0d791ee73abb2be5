//! Rebuild onto replacement members: stripe by stripe, under the stripe lock,
//! throttled, with progress and a checkpoint in the superblocks so a restart
//! resumes where it left off.
//!
//! A member being rebuilt holds good data below its checkpoint: reads and
//! writes use it there and treat it as failed above (writes above it are
//! skipped; the rebuild reconstructs those stripes later).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How a rebuild runs.
#[derive(Debug, Clone)]
pub struct RebuildOptions {
    /// Bytes per second written to the new members; None = as fast as possible.
    pub rate_bytes_per_sec: Option<u64>,
    /// Stripes between checkpoints written to the superblocks.
    pub checkpoint_every: u64,
}

impl Default for RebuildOptions {
    fn default() -> Self {
        RebuildOptions {
            rate_bytes_per_sec: None,
            checkpoint_every: 256,
        }
    }
}

/// What a rebuild has done so far.
#[derive(Debug, Clone, PartialEq)]
pub struct RebuildProgress {
    pub running: bool,
    /// Member positions being rebuilt (or resynced).
    pub members: Vec<usize>,
    /// True when the run only resyncs re-added members (`Volume::re_add`):
    /// its stripes are just their stale ones.
    pub resync: bool,
    /// Stripes this run has done, of the ones it has to do (every stripe
    /// from the lowest checkpoint on for a rebuild; the stale stripes from
    /// the lowest checkpoint on for a resync).
    pub done_stripes: u64,
    pub total_stripes: u64,
    /// Bytes written to new members by this run.
    pub bytes: u64,
    pub bytes_per_sec: f64,
    /// Time left for this run and every one queued after it.
    pub eta: Option<Duration>,
    /// Members waiting for the next run (replaced or re-added while this
    /// one runs, or before the first starts), and their stripes to do.
    pub queued_members: Vec<usize>,
    pub queued_stripes: u64,
}

#[derive(Default)]
pub(crate) struct RebuildState {
    pub(crate) running: AtomicBool,
    pub(crate) done: AtomicU64,
    pub(crate) total: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) started: Mutex<Option<Instant>>,
    pub(crate) members: Mutex<Vec<usize>>,
    pub(crate) resync: Mutex<bool>,
}

pub(crate) struct RunningGuard<'a>(pub(crate) &'a AtomicBool);
impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

//! Background compaction of compressed thin pools: chunks rewritten smaller
//! or freed leave holes in the pack clusters that hold compressed chunks;
//! every [`COMPACT_EVERY`] the node empties the sparse ones of each
//! compressed pool it runs ([`ThinPool::compact`], throttled), so their
//! clusters go back to the pool.
//!
//! One task per node goes through the pools in turn (the passes are
//! throttled; running them one at a time bounds the node's background
//! I/O). A pass runs without the node's state lock. Before its pool goes,
//! the pass ends ([`Compactor`]): a delete or a fenced pool drops it where
//! it is (nothing of that pool is kept on this node); a hand-over or a
//! shutdown, which close the pool and leave it to be opened again, wait
//! for it to end, as a pass dropped between taking a chunk's new blocks
//! and recording the move would leave those blocks taken.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use volume::thin::ThinPool;
use volume::{CompactOptions, CompactReport, Compression, ThinError};

use super::{Backing, Node, NodeState};

/// How often each compressed pool is looked at.
pub const COMPACT_EVERY: Duration = Duration::from_secs(30);

/// The pass in flight, and whether passes may start at all.
#[derive(Default)]
pub struct Compactor {
    running: parking_lot::Mutex<Option<Pass>>,
    /// The node shuts down: no pass starts any more.
    closed: AtomicBool,
}

/// A pass on one pool: `cancel` drops it, `done` is held while it runs.
struct Pass {
    /// The pool volume's name.
    pool: String,
    cancel: Arc<tokio::sync::Notify>,
    /// Ends the pass after the chunk in flight (for a hand-over).
    stop: Arc<AtomicBool>,
    done: Arc<tokio::sync::Mutex<()>>,
}

impl Compactor {
    /// Drops the pass on pool `pool`, if one runs, and waits until it is
    /// gone: for a pool this node forgets without closing it for another
    /// (deleted, or fenced). Called under the node's state lock, which a
    /// pass never takes while it runs.
    pub async fn stop(&self, pool: &str) {
        self.end(Some(pool), true).await;
    }

    /// Waits for the pass on pool `pool` (every pass, and no new one ever,
    /// when None: the node shuts down) to end by itself: for a pool that
    /// is closed and opened again, here or on another node.
    pub async fn finish(&self, pool: Option<&str>) {
        if pool.is_none() {
            self.closed.store(true, Ordering::Release);
        }
        self.end(pool, false).await;
    }

    async fn end(&self, pool: Option<&str>, cancel: bool) {
        let (name, c, stop, done) = {
            let r = self.running.lock();
            match r.as_ref() {
                Some(p) if pool.is_none_or(|n| n == p.pool) => (
                    p.pool.clone(),
                    p.cancel.clone(),
                    p.stop.clone(),
                    p.done.clone(),
                ),
                _ => return,
            }
        };
        if cancel {
            // A stored permit: a pass not yet waiting sees it as it starts.
            c.notify_one();
        } else {
            // It ends after the chunk it moves now, with the pool sound.
            stop.store(true, Ordering::Release);
            tracing::info!("thin pool {name}: waiting for its compaction pass to end");
        }
        let _ended = done.lock().await;
    }

    /// The pool volume a pass runs on now.
    pub fn running(&self) -> Option<String> {
        self.running.lock().as_ref().map(|p| p.pool.clone())
    }
}

/// The compressed pools `st` runs that hold pack clusters, by volume name
/// (not those whose volume is fenced: another node owns it now).
pub(super) fn candidates(st: &NodeState) -> Vec<String> {
    st.volumes
        .values()
        .filter_map(|e| match &e.backing {
            Backing::Drives { vol, pool: Some(p) } if !vol.is_fenced() && wants_compaction(p) => {
                Some(e.name.clone())
            }
            _ => None,
        })
        .collect()
}

fn wants_compaction(p: &ThinPool) -> bool {
    p.compression() != Compression::None && p.usage().pack_clusters > 0
}

/// One compaction pass on `pool`.
async fn compact_pass(
    pool: &ThinPool,
    opts: CompactOptions,
    stop: &AtomicBool,
) -> Result<CompactReport, ThinError> {
    pool.compact_until(opts, stop).await
}

impl Node {
    /// Starts the compaction of compressed pools (for as long as the node lives).
    pub fn spawn_compaction(self: &Arc<Self>) {
        self.spawn_compaction_every(COMPACT_EVERY, CompactOptions::default());
    }

    pub(super) fn spawn_compaction_every(self: &Arc<Self>, every: Duration, opts: CompactOptions) {
        let node = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(n) = node.upgrade() else { return };
                if !n.compact_pools(opts).await {
                    return;
                }
            }
        });
    }

    /// One pass over every compressed pool that holds pack clusters;
    /// false once the node shuts down.
    pub(super) async fn compact_pools(&self, opts: CompactOptions) -> bool {
        let names = {
            let st = self.state.lock().await;
            if st.compactor.closed.load(Ordering::Acquire) {
                return false;
            }
            candidates(&st)
        };
        for name in names {
            // Looked up again, and the pass entered, under the lock: a
            // delete that took the lock since either sees the pass and
            // stops it, or has removed the pool, which is then skipped.
            let (pool, cancel, stop, done, compactor) = {
                let st = self.state.lock().await;
                let compactor = st.compactor.clone();
                if compactor.closed.load(Ordering::Acquire) {
                    return false;
                }
                let Some(pool) = st
                    .volumes
                    .get(&name)
                    .filter(|e| e.on_drives().is_some_and(|v| !v.is_fenced()))
                    .and_then(|e| e.thin_pool())
                    .filter(|p| wants_compaction(p))
                    .cloned()
                else {
                    continue;
                };
                let cancel = Arc::new(tokio::sync::Notify::new());
                let stop = Arc::new(AtomicBool::new(false));
                let done = Arc::new(tokio::sync::Mutex::new(()));
                let guard = done.clone().try_lock_owned().expect("new");
                *compactor.running.lock() = Some(Pass {
                    pool: name.clone(),
                    cancel: cancel.clone(),
                    stop: stop.clone(),
                    done,
                });
                (pool, cancel, stop, guard, compactor)
            };
            let began = std::time::Instant::now();
            let r = tokio::select! {
                r = compact_pass(&pool, opts, &stop) => Some(r),
                _ = cancel.notified() => None,
            };
            *compactor.running.lock() = None;
            drop(done);
            match r {
                Some(Ok(rep)) if rep.chunks_moved > 0 || rep.clusters_freed > 0 => {
                    tracing::info!(
                        "thin pool {name}: compacted: {} chunk(s), {} moved, {} pack cluster(s) \
                         freed in {:.1} s",
                        rep.chunks_moved,
                        crate::units::human_bytes(rep.bytes_moved),
                        rep.clusters_freed,
                        began.elapsed().as_secs_f64()
                    );
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => tracing::warn!("thin pool {name}: compaction: {e}"),
                None => tracing::info!("thin pool {name}: compaction stopped (pool going away)"),
            }
        }
        true
    }
}

//! Compaction of a compressed pool: a rewrite frees its chunk's old
//! blocks, which leaves holes in pack clusters that only chunks of the
//! right size refill. Compaction empties the sparsest pack clusters by
//! moving their chunks (as stored, no recompression) into other pack
//! clusters, so whole clusters go back to the pool. Each move is one
//! journal record, like a rewrite: a crash leaves the chunk in its old
//! place or its new one.
//!
//! A snapshot's chunk is read by its clones and their snapshots through
//! their own shard locks, so a move holds the cluster's shard lock of the
//! owner and of every volume below it in the tree.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use blockdev::{BlockError, BlockOp};

use super::format::Record;
use super::pack::{PACK_BLOCK, Packed};
use super::state::{Loc, PoolInner, State, VolInner};
use super::{CompactOptions, CompactReport, ThinError, ThinPool};
use crate::volume::member_io::{abuf, recycle};

/// Lets held pack clusters take chunks again, also when the pass is dropped.
struct Unhold<'a>(&'a PoolInner);

impl Drop for Unhold<'_> {
    fn drop(&mut self) {
        self.0.packer.lock().unhold();
    }
}

/// `vol` and every volume that reads through it, in slot order.
fn readers(st: &State, vol: &Arc<VolInner>) -> Vec<Arc<VolInner>> {
    let mut out = vec![vol.clone()];
    let mut i = 0;
    while i < out.len() {
        let kids = st.children(out[i].slot);
        out.extend(kids);
        i += 1;
    }
    out.sort_by_key(|v| v.slot);
    out
}

fn same(a: &[Arc<VolInner>], b: &[Arc<VolInner>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| Arc::ptr_eq(x, y))
}

impl ThinPool {
    /// Empties pack clusters at most `below_fill_pct` full by moving their
    /// chunks elsewhere, at most `rate_bytes_per_sec`. Nothing to do in a
    /// pool without compression. Writes go on meanwhile; a chunk rewritten
    /// since the pass looked is left alone (its old place is free anyway).
    pub async fn compact(&self, opts: CompactOptions) -> Result<CompactReport, ThinError> {
        self.compact_until(opts, &AtomicBool::new(false)).await
    }

    /// [`ThinPool::compact`] that ends after the chunk in flight once
    /// `stop` is set (a node handing the pool over need not wait for the
    /// whole pass). Dropping the future part-way is safe too: the pool's
    /// clusters take chunks again, and at most the blocks of the move in
    /// flight stay taken until the pool is opened again.
    pub async fn compact_until(
        &self,
        opts: CompactOptions,
        stop: &AtomicBool,
    ) -> Result<CompactReport, ThinError> {
        let p = &self.inner;
        let mut report = CompactReport::default();
        let per = p.geom.pack_blocks;
        if per == 0 {
            return Ok(report);
        }
        let limit = per * u64::from(opts.below_fill_pct.min(99)) / 100;
        let mut sources: Vec<(u32, u32)> = p
            .packer
            .lock()
            .fill()
            .into_iter()
            .filter(|&(_, used)| u64::from(used) <= limit)
            .collect();
        // One sparse cluster emptied into a new one frees nothing.
        if sources.len() < 2 {
            return Ok(report);
        }
        sources.sort_unstable_by_key(|&(c, used)| (used, c));
        let held: Vec<u32> = sources.iter().map(|s| s.0).collect();
        p.packer.lock().hold(&held);
        let unhold = Unhold(p);
        let r = self.move_chunks(&held, opts, stop, &mut report).await;
        drop(unhold);
        r?;
        if report.chunks_moved > 0 {
            tracing::info!(
                "thin pool {}: compaction moved {} chunks ({} KiB), gave back {} clusters",
                self.uuid(),
                report.chunks_moved,
                report.bytes_moved >> 10,
                report.clusters_freed
            );
        }
        Ok(report)
    }

    async fn move_chunks(
        &self,
        held: &[u32],
        opts: CompactOptions,
        stop: &AtomicBool,
        report: &mut CompactReport,
    ) -> Result<(), ThinError> {
        let p = &self.inner;
        let per = p.geom.pack_blocks;
        let chunks: Vec<(Arc<VolInner>, u64, Packed)> = {
            let st = p.state.lock();
            let mut v = Vec::new();
            for vol in st.slots.iter().flatten() {
                for (vc, at) in vol.map.mapped(0, vol.vclusters()) {
                    if let Loc::Packed(x) = at
                        && held.contains(&x.cluster(per))
                    {
                        v.push((vol.clone(), vc, x));
                    }
                }
            }
            v
        };
        let before = p.alloc.lock().used;
        let started = Instant::now();
        for (vol, vc, x) in chunks {
            if stop.load(Ordering::Acquire) {
                break;
            }
            p.check_poisoned().map_err(|_| ThinError::Poisoned)?;
            match self.move_chunk(&vol, vc, x).await {
                Ok(true) => {
                    report.chunks_moved += 1;
                    report.bytes_moved += u64::from(x.blocks) * PACK_BLOCK;
                }
                Ok(false) => {}
                // Out of space for the move: what moved so far stays moved.
                Err(BlockError::NoSpace) => break,
                Err(e) => return Err(e.into()),
            }
            if opts.rate_bytes_per_sec > 0 {
                let due = report.bytes_moved as f64 / opts.rate_bytes_per_sec as f64;
                let ahead = due - started.elapsed().as_secs_f64();
                if ahead > 0.0 {
                    tokio::time::sleep(Duration::from_secs_f64(ahead)).await;
                }
            }
        }
        let after = p.alloc.lock().used;
        report.clusters_freed = before.saturating_sub(after);
        Ok(())
    }

    /// Moves chunk `x` of `vol`'s `vc` to new blocks; `false` when it is
    /// no longer there.
    async fn move_chunk(
        &self,
        vol: &Arc<VolInner>,
        vc: u64,
        x: Packed,
    ) -> Result<bool, BlockError> {
        let p = &self.inner;
        let set = readers(&p.state.lock(), vol);
        let mut guards = Vec::with_capacity(set.len());
        for v in &set {
            guards.push(v.lock(vc).write().await);
        }
        {
            let st = p.state.lock();
            let here = st.slots[usize::from(vol.slot)]
                .as_ref()
                .is_some_and(|v| Arc::ptr_eq(v, vol));
            // A clone made meanwhile would read without its lock held.
            if !here || !same(&readers(&st, vol), &set) {
                return Ok(false);
            }
        }
        if vol.map.get(vc) != Some(Loc::Packed(x)) {
            return Ok(false);
        }
        let len = u64::from(x.blocks) * PACK_BLOCK;
        let (b, r) = p
            .io(BlockOp::Read, p.packed_at(x), len, abuf(len as usize))
            .await;
        if let Err(e) = r {
            recycle(b);
            return Err(e);
        }
        let found = p.packer.lock().take(x.blocks, &mut None);
        let to = match found {
            Some(t) => t,
            None => {
                let mut spare = Some(p.reserve(1)?[0]);
                let t = p.packer.lock().take(x.blocks, &mut spare);
                p.release(&spare.into_iter().collect::<Vec<_>>());
                t.expect("a free cluster holds any chunk")
            }
        };
        let w = BlockOp::Write { fua: false };
        let (b, r) = p.io(w, p.packed_at(to), len, b).await;
        recycle(b);
        if let Err(e) = r {
            p.unpack(to);
            return Err(e);
        }
        let rec = Record::PMap {
            slot: vol.slot,
            vc,
            at: to,
        };
        p.commit(vec![rec]).await?;
        drop(guards);
        Ok(true)
    }
}

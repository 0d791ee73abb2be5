//! Reads: straight from the member when it holds the data, else the
//! stripe's missing columns reconstructed from the others (degraded read).

use std::sync::atomic::Ordering;

use blockdev::{AlignedBuf, BlockError, BlockOp, IoDone, SplitBuf};
use futures_util::future::join_all;

use super::member_io::{Batch, abuf, collect_failed, dev_io, io_err, recycle};
use super::{Inner, OpError, View};
use crate::layout::Extent;
use crate::parity::Code;

/// The caller's buffer back from [`AlignedBuf::split_mut`] once every
/// member has returned its view. Should a view outlive its read (no backend
/// keeps one), the bytes cannot be trusted: a fresh buffer of the same size
/// and an I/O error come back instead.
fn unsplit(held: SplitBuf, len: usize, cap: usize) -> Result<AlignedBuf, (AlignedBuf, BlockError)> {
    held.try_unwrap().map_err(|h| {
        tracing::error!("{} views of a read buffer outlived the read", h.views());
        let mut b = AlignedBuf::new(cap);
        b.set_len(len);
        (b, io_err("a member kept the read buffer".into()))
    })
}

impl Inner {
    pub(crate) async fn read(&self, lba: u64, blocks: u64, mut buf: AlignedBuf) -> IoDone {
        let exts = self.layout.extents(lba, blocks);
        // One strip, healthy: the member reads straight into the caller's buffer.
        if exts.len() == 1 {
            let e = exts[0];
            let view = self.view();
            if let Some(member) = self.read_member(&view, &e) {
                let len = (e.blocks * self.bs) as usize;
                let (b, r) = dev_io(
                    &view.devs[member],
                    BlockOp::Read,
                    self.data_byte(e.member_lba),
                    len,
                    buf,
                )
                .await;
                buf = b;
                match r {
                    Ok(()) => {
                        return IoDone {
                            buf,
                            result: Ok(()),
                        };
                    }
                    Err(e) if !self.redundant() => {
                        return IoDone {
                            buf,
                            result: Err(e),
                        };
                    }
                    Err(_) => self.mark_failed(member),
                }
            }
        }
        let groups: Vec<&[Extent]> = exts.chunk_by(|a, b| a.stripe == b.stripe).collect();
        if let [group] = groups[..] {
            // One stripe: no split, no join.
            let (buf, result) = self.read_stripe(group, buf).await;
            return IoDone { buf, result };
        }
        // Each stripe lands in its own writable view of the caller's buffer.
        let mut ranges = Vec::with_capacity(groups.len());
        let mut at = 0;
        for group in &groups {
            let bytes = (group.iter().map(|e| e.blocks).sum::<u64>() * self.bs) as usize;
            ranges.push(at..at + bytes);
            at += bytes;
        }
        let (len, cap) = (buf.len(), buf.capacity());
        let (held, views) = buf.split_mut(&ranges);
        let futs = groups
            .iter()
            .zip(views)
            .map(|(group, out)| self.read_stripe(group, out));
        let mut result = Ok(());
        for (view, r) in join_all(futs).await {
            drop(view);
            if result.is_ok() {
                result = r;
            }
        }
        match unsplit(held, len, cap) {
            Ok(buf) => IoDone { buf, result },
            Err((buf, e)) => IoDone {
                buf,
                result: Err(e),
            },
        }
    }

    /// The member to read an extent from when it can be read directly.
    pub(crate) fn read_member(&self, view: &View, e: &Extent) -> Option<usize> {
        if self.parity.code == Code::Mirror {
            // Spread reads of a mirror over its copies.
            let n = self.layout.members();
            return (0..n)
                .map(|i| (e.stripe as usize + i) % n)
                .find(|&mbr| view.avail(mbr, e.stripe));
        }
        // A failed member of raid0 or concat is not read either: its
        // extents fail (see `read_stripe`).
        view.avail(e.member, e.stripe).then_some(e.member)
    }

    /// Reads the extents of one stripe into `out` (their bytes back to
    /// back) and gives it back. Healthy members read straight into writable
    /// views of `out`; degraded reads reconstruct into buffers of their own
    /// and copy.
    pub(crate) async fn read_stripe(
        &self,
        exts: &[Extent],
        mut out: AlignedBuf,
    ) -> (AlignedBuf, Result<(), BlockError>) {
        let stripe = exts[0].stripe;
        let base = exts[0].offset;
        for _attempt in 0..=self.layout.members() {
            if self.fence.is_set() {
                return (out, Err(self.fence.error()));
            }
            let view = self.view();
            let direct: Option<Vec<usize>> =
                exts.iter().map(|e| self.read_member(&view, e)).collect();
            if let Some(members) = direct {
                let ranges: Vec<std::ops::Range<usize>> = exts
                    .iter()
                    .map(|e| {
                        let at = ((e.offset - base) * self.bs) as usize;
                        at..at + (e.blocks * self.bs) as usize
                    })
                    .collect();
                let (len, cap) = (out.len(), out.capacity());
                let (held, views) = out.split_mut(&ranges);
                let mut reads = Batch::with_capacity(exts.len());
                for ((e, &mbr), v) in exts.iter().zip(&members).zip(views) {
                    self.submit_read_into(&mut reads, &view, mbr, e.member_lba, v);
                }
                // The views come back in the results; dropping them (on
                // success or failure) is what lets `unsplit` succeed.
                let r = reads.finish().await.map(drop);
                out = match unsplit(held, len, cap) {
                    Ok(b) => b,
                    Err((b, e)) => return (b, Err(e)),
                };
                match r {
                    Ok(()) => return (out, Ok(())),
                    Err(OpError::Members(failed)) if self.redundant() => {
                        failed.iter().for_each(|&f| self.mark_failed(f));
                        continue;
                    }
                    Err(OpError::Members(failed)) => {
                        return (out, Err(self.failed_error(failed)));
                    }
                    Err(OpError::Fatal(e)) => return (out, Err(e)),
                }
            }
            if !self.redundant() {
                // No redundancy: what the failed member held is gone.
                return (out, Err(self.too_many_failed(&view)));
            }
            // Degraded: rebuild the missing columns from the others, under the
            // stripe lock so a concurrent write cannot mix old and new.
            let _g = self.stripe_lock(stripe).lock().await;
            let view = self.view();
            self.stats.degraded_reads.fetch_add(1, Ordering::Relaxed);
            let lo = exts.iter().map(|e| e.row).min().expect("non-empty");
            let hi = exts
                .iter()
                .map(|e| e.row + e.blocks)
                .max()
                .expect("non-empty");
            match self.read_reconstructed(&view, stripe, lo, hi).await {
                Ok(cols) => {
                    for e in exts {
                        let at = ((e.offset - base) * self.bs) as usize;
                        let len = (e.blocks * self.bs) as usize;
                        let from = ((e.row - lo) * self.bs) as usize;
                        out[at..at + len].copy_from_slice(&cols[e.col][from..from + len]);
                    }
                    cols.into_iter().for_each(recycle);
                    return (out, Ok(()));
                }
                Err(OpError::Members(failed)) => {
                    failed.iter().for_each(|&f| self.mark_failed(f));
                }
                Err(OpError::Fatal(e)) => return (out, Err(e)),
            }
        }
        let e = self.too_many_failed(&self.view());
        (out, Err(e))
    }

    /// The k data columns of rows `lo..hi` of `stripe`, read or reconstructed
    /// from just the columns needed, followed by m buffers of the parity's
    /// size whose contents are unspecified. The caller holds the stripe lock.
    pub(crate) async fn read_reconstructed(
        &self,
        view: &View,
        stripe: u64,
        lo: u64,
        hi: u64,
    ) -> Result<Vec<AlignedBuf>, OpError> {
        let n = self.layout.members();
        let len = ((hi - lo) * self.bs) as usize;
        let present: Vec<bool> = (0..n)
            .map(|c| view.avail(self.layout.column_member(stripe, c), stripe))
            .collect();
        if present.iter().filter(|&&p| !p).count() > self.parity.m {
            return Err(OpError::Fatal(self.too_many_failed(view)));
        }
        let read = self.parity.sources(&present);
        let lba = self.layout.strip_lba(stripe, lo);
        let res = join_all((0..n).map(|c| {
            let mbr = self.layout.column_member(stripe, c);
            let want = read[c];
            async move {
                if want {
                    self.col_read(view, mbr, lba, hi - lo).await
                } else {
                    Ok(abuf(len))
                }
            }
        }))
        .await;
        let mut cols = collect_failed(res)?;
        let mut refs: Vec<&mut [u8]> = cols.iter_mut().map(|b| &mut b[..]).collect();
        self.parity.reconstruct_data(&mut refs, &read)?;
        Ok(cols)
    }
}

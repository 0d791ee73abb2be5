//! The stripe writer: full-stripe, reconstruct-write and read-modify-write,
//! degraded updates with their journal record, and WriteZeroes/Deallocate.

use std::sync::atomic::Ordering;

use blockdev::{AlignedBuf, BlockError, BlockOp, SharedBuf};
use futures_util::future::join_all;

use super::member_io::{Batch, abuf, abuf_from, collect_failed, dev_io, io_err, recycle, zbuf};
use super::{Inner, OpError, View, ZERO_PIECE_BYTES};
use crate::journal::{HEADER_BYTES, Record, RecordKind};
use crate::layout::{Extent, MAX_MEMBERS};
use crate::parity::{Code, ParityError};

/// Per data column: touched rows and where the new data starts in the source.
#[derive(Clone, Copy)]
pub(crate) struct Touch {
    lo: u64,
    hi: u64,
    src: usize,
}

/// The data of a write (or of one stripe of it): a window of the host's
/// buffer, shared so that members are handed read-only views of it instead
/// of copies (no extra copy below the target).
#[derive(Clone, Copy)]
pub(crate) struct Src<'a> {
    buf: &'a SharedBuf,
    at: usize,
    len: usize,
}

impl<'a> Src<'a> {
    /// The first `len` bytes of `buf`.
    pub(crate) fn new(buf: &'a SharedBuf, len: usize) -> Src<'a> {
        assert!(
            len <= buf.len(),
            "write of {len} bytes from a {} byte buffer",
            buf.len()
        );
        Src { buf, at: 0, len }
    }
    /// Bytes `off..off + len` of this window, as a window.
    fn sub(&self, off: usize, len: usize) -> Src<'a> {
        assert!(off + len <= self.len);
        Src {
            buf: self.buf,
            at: self.at + off,
            len,
        }
    }
    pub(crate) fn bytes(&self) -> &'a [u8] {
        &self.buf[self.at..self.at + self.len]
    }
    /// A read-only view of bytes `off..off + len` (block-aligned), for a
    /// member write.
    fn view(&self, off: usize, len: usize) -> AlignedBuf {
        assert!(off + len <= self.len);
        self.buf.view(self.at + off..self.at + off + len)
    }
}

/// The host's buffer back from [`AlignedBuf::share`] once every member has
/// returned its view. A view kept past the I/O (no backend does) would cost
/// a copy here, not a wrong answer.
pub(crate) fn unshare(shared: SharedBuf) -> AlignedBuf {
    shared.try_unwrap().unwrap_or_else(|s| {
        tracing::warn!(
            "{} views of a write buffer outlived the write; copying",
            s.views()
        );
        let mut b = AlignedBuf::new(s.len());
        b.set_len(s.len());
        b.copy_from_slice(&s);
        b
    })
}

impl Inner {
    pub(crate) async fn write(
        &self,
        lba: u64,
        blocks: u64,
        src: &SharedBuf,
        fua: bool,
    ) -> Result<(), BlockError> {
        let exts = self.layout.extents(lba, blocks);
        let src = Src::new(src, (blocks * self.bs) as usize);
        if !self.redundant() {
            let view = self.view();
            self.check_present(&view, &exts)?;
            let res = join_all(exts.iter().map(|e| {
                let at = (e.offset * self.bs) as usize;
                let b = src.view(at, (e.blocks * self.bs) as usize);
                self.col_write(&view, e.member, e.member_lba, b, fua)
            }))
            .await;
            return match collect_failed(res) {
                Ok(_) => Ok(()),
                Err(OpError::Members(failed)) => Err(self.failed_error(failed)),
                Err(OpError::Fatal(e)) => Err(e),
            };
        }
        let (seq, _in_flight) = self.gather.enter(lba, blocks);
        if exts[0].stripe == exts[exts.len() - 1].stripe {
            // One stripe (most requests): no join.
            self.write_stripe_gathered(&exts, src, fua, seq, blocks)
                .await?;
        } else {
            let futs = exts
                .chunk_by(|a, b| a.stripe == b.stripe)
                .map(|group| {
                    let at = (group[0].offset * self.bs) as usize;
                    let len = (group.iter().map(|e| e.blocks).sum::<u64>() * self.bs) as usize;
                    self.write_stripe_gathered(group, src.sub(at, len), fua, seq, blocks)
                })
                .collect::<Vec<_>>();
            let r: Result<(), BlockError> = join_all(futs).await.into_iter().collect();
            r?;
        }
        // A member skipped because it failed must be recorded as failed before
        // the write is acknowledged (on the superblocks and, in a cluster,
        // outside: a record that cannot land fences the volume).
        self.persist_superblock(false).await;
        if self.fence.is_set() {
            return Err(self.fence.error());
        }
        Ok(())
    }

    pub(crate) async fn write_stripe(
        &self,
        exts: &[Extent],
        src: Src<'_>,
        fua: bool,
    ) -> Result<(), BlockError> {
        let stripe = exts[0].stripe;
        self.intent_begin(stripe).await;
        let guard = self.stripe_lock(stripe).lock().await;
        let mut result = Err(io_err("no attempt".into()));
        for _attempt in 0..=self.layout.members() {
            if self.fence.is_set() {
                result = Err(self.fence.error());
                break;
            }
            let view = self.view();
            match self.write_stripe_once(&view, exts, src, fua).await {
                Ok(()) => {
                    result = Ok(());
                    break;
                }
                Err(OpError::Members(failed)) => {
                    failed.iter().for_each(|&f| self.mark_failed(f));
                    result = Err(self.too_many_failed(&self.view()));
                }
                Err(OpError::Fatal(e)) => {
                    result = Err(e);
                    break;
                }
            }
        }
        drop(guard);
        self.intent_end(stripe);
        result
    }

    pub(crate) async fn write_stripe_once(
        &self,
        view: &View,
        exts: &[Extent],
        src: Src<'_>,
        fua: bool,
    ) -> Result<(), OpError> {
        let stripe = exts[0].stripe;
        let (k, m) = (self.parity.k, self.parity.m);
        let n = k + m;
        let bs = self.bs;
        let base = exts[0].offset;
        let lo = exts.iter().map(|e| e.row).min().expect("non-empty");
        let hi = exts
            .iter()
            .map(|e| e.row + e.blocks)
            .max()
            .expect("non-empty");
        let rows = hi - lo;
        let len = (rows * bs) as usize;
        let lba = self.layout.strip_lba(stripe, lo);
        let member = |c: usize| self.layout.column_member(stripe, c);
        // On the stack: this runs for every write.
        let mut avail = [false; MAX_MEMBERS];
        for (c, a) in avail[..n].iter_mut().enumerate() {
            *a = view.avail(member(c), stripe);
        }
        let avail = &avail[..n];
        let missing = avail.iter().filter(|&&a| !a).count();
        if missing > m {
            return Err(OpError::Fatal(self.too_many_failed(view)));
        }
        let mut touch = [None::<Touch>; MAX_MEMBERS];
        let touch = &mut touch[..k];
        for e in exts {
            touch[e.col] = Some(Touch {
                lo: e.row,
                hi: e.row + e.blocks,
                src: ((e.offset - base) * bs) as usize,
            });
        }
        let new_data = |t: &Touch| &src.bytes()[t.src..t.src + ((t.hi - t.lo) * bs) as usize];
        // What members write: views of the host's buffer, not copies.
        let new_view = |t: &Touch| src.view(t.src, ((t.hi - t.lo) * bs) as usize);
        if missing > 0 {
            self.stats.degraded_writes.fetch_add(1, Ordering::Relaxed);
        }

        if self.parity.code == Code::Mirror {
            let t = touch[0].expect("a mirror write touches column 0");
            let mut writes = Batch::with_capacity(n);
            for c in (0..n).filter(|&c| avail[c]) {
                // Every copy gets a view of the same bytes.
                let b = new_view(&t);
                self.submit_write(&mut writes, view, member(c), lba, b, fua);
            }
            return writes.finish_writes().await;
        }

        let touched_rows = |d: usize| touch[d].map_or(0, |t| t.hi - t.lo);
        let covered = |d: usize| touched_rows(d) == rows;
        let par_avail = (k..n).filter(|&c| avail[c]).count();
        if par_avail == 0 {
            // No parity left to keep up (so no data column is missing either).
            let mut writes = Batch::with_capacity(k);
            for (d, t) in touch.iter().enumerate() {
                if let Some(t) = t {
                    let at = self.layout.strip_lba(stripe, t.lo);
                    let b = new_view(t);
                    self.submit_write(&mut writes, view, member(d), at, b, fua);
                }
            }
            return writes.finish_writes().await;
        }
        // Read-modify-write needs the old contents of every column it
        // writes; reconstruct-write those of every column it does not cover.
        let rmw_ok = (0..k).all(|d| touch[d].is_none() || avail[d]);
        let rcw_ok = (0..k).all(|d| avail[d] || covered(d));
        let rcw_reads: u64 = (0..k)
            .filter(|&d| avail[d])
            .map(|d| rows - touched_rows(d))
            .sum();
        let rmw_reads: u64 = (0..k).map(touched_rows).sum::<u64>() + par_avail as u64 * rows;
        if rmw_ok && (!rcw_ok || rmw_reads < rcw_reads) {
            if missing == 0 {
                self.stats.rmw.fetch_add(1, Ordering::Relaxed);
            }
            return self.rmw(view, stripe, lo, hi, touch, avail, src, fua).await;
        }
        if missing == 0 {
            if rcw_reads == 0 {
                self.stats.full.fetch_add(1, Ordering::Relaxed);
            } else {
                self.stats.rcw.fetch_add(1, Ordering::Relaxed);
            }
        }

        // Both ways below end with every data column of rows lo..hi in hand:
        // a column this write covers is its slice of the host's buffer, any
        // other is a buffer of its old rows with the new ones copied in
        // (parity needs whole columns). Parity goes to new buffers.
        let mut cols: Vec<AlignedBuf> = if rcw_ok {
            // Reconstruct-write: read what this write leaves alone.
            let mut spans = Vec::new();
            let mut reads = Batch::with_capacity(2 * k);
            for d in (0..k).filter(|&d| avail[d]) {
                let (tlo, thi) = touch[d].map_or((hi, hi), |t| (t.lo, t.hi));
                for (a, b) in [(lo, tlo), (thi.max(lo), hi)] {
                    if a < b {
                        spans.push((d, a));
                        let at = self.layout.strip_lba(stripe, a);
                        self.submit_read(&mut reads, view, member(d), at, b - a);
                    }
                }
            }
            let got = if spans.is_empty() {
                Vec::new()
            } else {
                reads.finish().await?
            };
            // No buffer for covered columns (empty() allocates nothing).
            let mut cols: Vec<AlignedBuf> = (0..n)
                .map(|c| {
                    if c < k && covered(c) {
                        AlignedBuf::empty()
                    } else {
                        abuf(len)
                    }
                })
                .collect();
            for (&(d, a), b) in spans.iter().zip(got) {
                let at = ((a - lo) * bs) as usize;
                cols[d][at..at + b.len()].copy_from_slice(&b);
                recycle(b);
            }
            cols
        } else {
            // A missing column keeps rows this write does not cover: rebuild it.
            // (Its covered columns' old contents are read and not used.)
            self.read_reconstructed(view, stripe, lo, hi).await?
        };
        for d in 0..k {
            if let Some(t) = touch[d]
                && !covered(d)
            {
                let at = ((t.lo - lo) * bs) as usize;
                let nd = new_data(&t);
                cols[d][at..at + nd.len()].copy_from_slice(nd);
            }
        }
        {
            let (data, par) = cols.split_at_mut(k);
            let data = &*data;
            let drefs: Vec<&[u8]> = (0..k)
                .map(|d| match touch[d] {
                    Some(t) if covered(d) => new_data(&t),
                    _ => &data[d][..],
                })
                .collect();
            let mut prefs: Vec<&mut [u8]> = par.iter_mut().map(|b| &mut b[..]).collect();
            self.parity.encode(&drefs, &mut prefs)?;
        }
        let _record = if (0..k).any(|d| !avail[d]) {
            // Recovery recomputes parity from the present data as it lands and
            // the missing columns' new contents.
            let ranges = (0..k).filter(|&d| avail[d]).map(|d| (d, lo, hi)).collect();
            let payload: Vec<(usize, &[u8])> = (0..k)
                .filter(|&d| !avail[d])
                .map(|d| match touch[d] {
                    Some(t) if covered(d) => (d, new_data(&t)),
                    _ => (d, &cols[d][..]),
                })
                .collect();
            self.journal_record(
                view,
                stripe,
                avail,
                lo,
                rows,
                RecordKind::Data,
                ranges,
                &payload,
            )
            .await?
        } else {
            None
        };
        let mut writes = Batch::with_capacity(n);
        for (c, col) in cols.into_iter().enumerate() {
            if c >= k {
                if avail[c] {
                    self.submit_write(&mut writes, view, member(c), lba, col, fua);
                } else {
                    recycle(col);
                }
                continue;
            }
            // Data goes out as views of the host's buffer, whole column or not.
            recycle(col);
            if let Some(t) = touch[c]
                && avail[c]
            {
                let at = self.layout.strip_lba(stripe, t.lo);
                self.submit_write(&mut writes, view, member(c), at, new_view(&t), fua);
            }
        }
        writes.finish_writes().await
    }

    /// `par[j] ^= parity_j(cols)`, where each `(d, row, bytes)` puts data
    /// column `d`'s bytes at `row` of rows `lo..` (`len` bytes in all) and
    /// every other column is zero.
    pub(crate) fn fold_parity<'a>(
        &self,
        lo: u64,
        len: usize,
        cols: impl Iterator<Item = (usize, u64, &'a [u8])>,
        par: &mut [AlignedBuf],
    ) -> Result<(), ParityError> {
        let bs = self.bs;
        if self.parity.code == Code::Xor {
            // XOR parity is position-wise: fold each column in at its rows.
            for (_, row, b) in cols {
                let at = ((row - lo) * bs) as usize;
                crate::parity::xor_into(&mut par[0][at..at + b.len()], b);
            }
            return Ok(());
        }
        // Reed-Solomon wants whole columns: pad those that cover part of the rows.
        let mut padded: Vec<Option<AlignedBuf>> = (0..self.parity.k).map(|_| None).collect();
        let mut whole: Vec<Option<&[u8]>> = vec![None; self.parity.k];
        for (d, row, b) in cols {
            if b.len() == len {
                whole[d] = Some(b);
            } else {
                let mut full = zbuf(len);
                let at = ((row - lo) * bs) as usize;
                full[at..at + b.len()].copy_from_slice(b);
                padded[d] = Some(full);
            }
        }
        let drefs: Vec<Option<&[u8]>> = whole
            .iter()
            .zip(&padded)
            .map(|(w, p)| p.as_deref().or(*w))
            .collect();
        let mut prefs: Vec<&mut [u8]> = par.iter_mut().map(|b| &mut b[..]).collect();
        self.parity.apply_delta(&drefs, &mut prefs)
    }

    /// Read-modify-write: old data of the touched rows and old parity in,
    /// parity of the data delta XORed into the parity, new data and parity
    /// out. With a data column missing (not one this write touches), a
    /// partial-parity record goes to the journal first.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn rmw(
        &self,
        view: &View,
        stripe: u64,
        lo: u64,
        hi: u64,
        touch: &[Option<Touch>],
        avail: &[bool],
        src: Src<'_>,
        fua: bool,
    ) -> Result<(), OpError> {
        let (k, m) = (self.parity.k, self.parity.m);
        let bs = self.bs;
        let len = ((hi - lo) * bs) as usize;
        let member = |c: usize| self.layout.column_member(stripe, c);
        let lba = self.layout.strip_lba(stripe, lo);
        let touched = || {
            touch
                .iter()
                .enumerate()
                .filter_map(|(d, t)| t.map(|t| (d, t)))
        };
        let new_data = |t: &Touch| &src.bytes()[t.src..t.src + ((t.hi - t.lo) * bs) as usize];
        // Old data of the touched rows, then old parity.
        let nt = touched().count();
        let mut reads = Batch::with_capacity(nt + m);
        for (d, t) in touched() {
            let at = self.layout.strip_lba(stripe, t.lo);
            self.submit_read(&mut reads, view, member(d), at, t.hi - t.lo);
        }
        for j in 0..m {
            if avail[k + j] {
                self.submit_read(&mut reads, view, member(k + j), lba, hi - lo);
            } else {
                // A missing parity column: computed along, never written.
                reads.hold(abuf(len));
            }
        }
        let mut bufs = reads.finish().await?;
        let (old, par) = bufs.split_at_mut(nt);
        // old ^= new: the deltas.
        for ((_, t), o) in touched().zip(old.iter_mut()) {
            crate::parity::xor_into(o, new_data(&t));
        }
        self.fold_parity(
            lo,
            len,
            touched()
                .zip(old.iter())
                .map(|((d, t), b)| (d, t.lo, &b[..])),
            par,
        )?;
        let _record = if (0..k).any(|d| !avail[d]) {
            // pp = parity of what this write leaves in place = P_new ^ parity(new).
            let mut pp: Vec<AlignedBuf> = par.iter().map(|p| abuf_from(p)).collect();
            self.fold_parity(
                lo,
                len,
                touched().map(|(d, t)| (d, t.lo, new_data(&t))),
                &mut pp,
            )?;
            let ranges = touched().map(|(d, t)| (d, t.lo, t.hi)).collect();
            let payload: Vec<(usize, &[u8])> = (0..m)
                .filter(|&j| avail[k + j])
                .map(|j| (j, &pp[j][..]))
                .collect();
            let hold = self
                .journal_record(
                    view,
                    stripe,
                    avail,
                    lo,
                    hi - lo,
                    RecordKind::PartialParity,
                    ranges,
                    &payload,
                )
                .await;
            pp.into_iter().for_each(recycle);
            hold?
        } else {
            None
        };
        let mut writes = Batch::with_capacity(nt + m);
        for (d, t) in touched() {
            let at = self.layout.strip_lba(stripe, t.lo);
            // A view of the host's buffer, not a copy.
            let b = src.view(t.src, ((t.hi - t.lo) * bs) as usize);
            self.submit_write(&mut writes, view, member(d), at, b, fua);
        }
        for (i, p) in bufs.into_iter().enumerate() {
            // The first nt are the deltas.
            match i.checked_sub(nt) {
                Some(j) if avail[k + j] => {
                    self.submit_write(&mut writes, view, member(k + j), lba, p, fua);
                }
                _ => recycle(p),
            }
        }
        writes.finish_writes().await
    }

    /// Writes the journal record of a degraded update of `stripe` and waits
    /// for it to be durable. The slot stays held (and the record needed)
    /// until the returned hold is dropped, after the in-place writes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn journal_record(
        &self,
        view: &View,
        stripe: u64,
        avail: &[bool],
        lo: u64,
        rows: u64,
        kind: RecordKind,
        ranges: Vec<(usize, u64, u64)>,
        payload: &[(usize, &[u8])],
    ) -> Result<Option<crate::journal::SlotHold<'_>>, OpError> {
        let Some(j) = &self.journal else {
            return Ok(None);
        };
        let k = self.parity.k;
        let member = |c: usize| self.layout.column_member(stripe, c);
        // On the first present parity member: this update writes it anyway.
        let Some(jc) = (k..avail.len()).find(|&c| avail[c]) else {
            return Ok(None);
        };
        let mbr = member(jc);
        let missing = (0..avail.len())
            .filter(|&c| !avail[c])
            .fold(0u64, |acc, c| acc | 1u64 << member(c));
        let total = HEADER_BYTES + payload.iter().map(|p| p.1.len()).sum::<usize>();
        let mut buf = abuf(total);
        let mut at = HEADER_BYTES;
        for (_, p) in payload {
            buf[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        // A stripe's records stay on one member while its members do; should
        // one be left elsewhere, it goes first, so it cannot outlive this one.
        self.retire_journal(stripe, Some(mbr)).await;
        let mut hold = j.acquire(mbr, stripe).await;
        let rec = Record {
            seq: j.next_seq(),
            stripe,
            lo,
            rows,
            kind,
            missing,
            ranges,
            cols: payload.iter().map(|p| p.0).collect(),
        };
        rec.encode(&self.journal_shape(), &mut buf);
        self.stats.journal_writes.fetch_add(1, Ordering::Relaxed);
        self.stats
            .journal_bytes
            .fetch_add(total as u64, Ordering::Relaxed);
        let (buf, r) = dev_io(
            &view.devs[mbr],
            BlockOp::Write { fua: true },
            j.slot_offset(hold.slot),
            total,
            buf,
        )
        .await;
        recycle(buf);
        match r {
            Ok(()) => {
                hold.written(stripe);
                Ok(Some(hold))
            }
            Err(e) => {
                tracing::debug!("member {mbr} journal write error: {e}");
                Err(OpError::Members(vec![mbr]))
            }
        }
    }

    /// Without redundancy: an I/O that touches a failed member fails
    /// whole, before any member is written.
    fn check_present(&self, view: &View, exts: &[Extent]) -> Result<(), BlockError> {
        let mut failed: Vec<usize> = exts
            .iter()
            .map(|e| e.member)
            .filter(|&m| !view.present(m))
            .collect();
        if failed.is_empty() {
            return Ok(());
        }
        failed.sort_unstable();
        failed.dedup();
        Err(self.failed_error(failed))
    }

    pub(crate) async fn zero(&self, op: BlockOp, lba: u64, blocks: u64) -> Result<(), BlockError> {
        if !self.redundant() {
            let view = self.view();
            let exts = self.layout.extents(lba, blocks);
            self.check_present(&view, &exts)?;
            let res = join_all(exts.iter().map(|e| {
                let dev = &view.devs[e.member];
                let off = self.data_byte(e.member_lba);
                let len = (e.blocks * self.bs) as usize;
                async move { dev_io(dev, op, off, len, AlignedBuf::new(0)).await.1 }
            }))
            .await;
            return res.into_iter().collect();
        }
        // Parity must cover the zeroes too: write them through the stripe engine.
        let piece = (ZERO_PIECE_BYTES / self.bs).max(1);
        // One buffer of zeroes, lent as views to every piece's members.
        let zeroes = zbuf((piece.min(blocks) * self.bs) as usize).share();
        let mut at = lba;
        while at < lba + blocks {
            let n = piece.min(lba + blocks - at);
            self.write(at, n, &zeroes, false).await?;
            at += n;
        }
        Ok(())
    }
}

//! A thin volume as a `BlockDevice`: reads of mapped clusters, writes that
//! allocate on first touch, and WriteZeroes/Deallocate that unmap.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use blockdev::{
    AlignedBuf, BlockDevice, BlockError, BlockOp, Geometry, IoDone, IoFuture, IoRequest,
    check_request,
};
use futures_util::future::join_all;
use parking_lot::Mutex;

use super::format::{Record, zbuf};
use super::state::{Loc, PoolInner, VolInner};
use super::{LOCK_SHARDS, ThinInfo, UNMAP_CHUNK, info};
use crate::superblock::uuid_string;
use crate::volume::member_io::{abuf, recycle};

/// A thin volume: a [`BlockDevice`] whose clusters come from its pool on
/// first write. Cheap to clone.
#[derive(Clone)]
pub struct ThinVolume {
    pub(crate) pool: Arc<PoolInner>,
    pub(crate) vol: Arc<VolInner>,
}

impl std::fmt::Debug for ThinVolume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThinVolume")
            .field("info", &self.info())
            .finish()
    }
}

/// The part of a request that falls in one cluster.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Piece {
    pub(crate) vc: u64,
    /// Byte offset in the cluster.
    pub(crate) off: u64,
    pub(crate) len: u64,
    /// Byte offset in the request's buffer.
    pub(crate) at: usize,
}

/// The one piece of a request that lies within a cluster (the common case,
/// which then needs no allocation).
pub(crate) fn single_piece(cluster_bytes: u64, start: u64, end: u64) -> Option<Piece> {
    (start / cluster_bytes == (end - 1) / cluster_bytes).then_some(Piece {
        vc: start / cluster_bytes,
        off: start % cluster_bytes,
        len: end - start,
        at: 0,
    })
}

pub(crate) fn pieces(cluster_bytes: u64, start: u64, end: u64) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut pos = start;
    while pos < end {
        let vc = pos / cluster_bytes;
        let off = pos % cluster_bytes;
        let len = (cluster_bytes - off).min(end - pos);
        out.push(Piece {
            vc,
            off,
            len,
            at: (pos - start) as usize,
        });
        pos += len;
    }
    out
}

impl ThinVolume {
    pub fn name(&self) -> &str {
        &self.vol.meta.name
    }

    pub fn uuid(&self) -> String {
        uuid_string(&self.vol.meta.uuid)
    }

    pub fn info(&self) -> ThinInfo {
        info(&self.vol, self.pool.geom.cluster_bytes)
    }

    pub fn allocated_bytes(&self) -> u64 {
        self.vol.allocated.load(Ordering::Relaxed) * self.pool.geom.cluster_bytes
    }

    /// Allocated clusters as (virtual, physical) pairs, for tests and
    /// tools; a compressed chunk names its pack cluster.
    pub fn mapped_clusters(&self) -> Vec<(u64, u64)> {
        let per = self.pool.geom.pack_blocks;
        self.vol
            .map
            .mapped(0, self.vol.vclusters())
            .into_iter()
            .map(|(v, at)| match at {
                Loc::Raw(p) => (v, u64::from(p)),
                Loc::Packed(x) => (v, u64::from(x.cluster(per))),
            })
            .collect()
    }

    pub(crate) fn bs(&self) -> u64 {
        u64::from(self.vol.meta.block_size)
    }
}

impl BlockDevice for ThinVolume {
    fn geometry(&self) -> Geometry {
        Geometry {
            block_size: self.vol.meta.block_size,
            num_blocks: self.vol.size() / self.bs(),
        }
    }

    fn submit(&self, req: IoRequest) -> IoFuture {
        if let Err(e) = check_request(self.geometry(), &req) {
            return IoFuture::ready(req.buf, Err(e));
        }
        if self.vol.meta.snapshot && !matches!(req.op, BlockOp::Read | BlockOp::Flush) {
            let e = BlockError::ReadOnly(format!(
                "thin volume {} is a snapshot; clone it to write",
                self.vol.meta.name
            ));
            return IoFuture::ready(req.buf, Err(e));
        }
        if req.blocks == 0 && req.op != BlockOp::Flush {
            return IoFuture::ready(req.buf, Ok(()));
        }
        let io = ThinIo {
            pool: self.pool.clone(),
            vol: self.vol.clone(),
        };
        // Checked above, except for Flush, whose LBA means nothing.
        let bs = self.bs();
        let start = req.lba.wrapping_mul(bs);
        let end = start.wrapping_add(u64::from(req.blocks) * bs);
        IoFuture::Pending(Box::pin(async move {
            match req.op {
                BlockOp::Read => io.read(start, end, req.buf).await,
                BlockOp::Write { fua } => io.write(start, end, req.buf, fua).await,
                BlockOp::Flush => {
                    let r = io.pool.flush_dev().await;
                    IoDone {
                        buf: req.buf,
                        result: r,
                    }
                }
                BlockOp::WriteZeroes | BlockOp::Deallocate => {
                    let r = io.zero(start, end).await;
                    IoDone {
                        buf: req.buf,
                        result: r,
                    }
                }
            }
        }))
    }

    fn deallocate_reads_zeroes(&self) -> bool {
        true
    }

    fn read_only(&self) -> bool {
        self.vol.meta.snapshot
    }

    fn describe(&self) -> String {
        let v = &self.vol.meta;
        format!(
            "thin volume {} {} ({} MiB, {} MiB allocated) on pool {}",
            v.name,
            uuid_string(&v.uuid),
            v.size_bytes >> 20,
            self.allocated_bytes() >> 20,
            uuid_string(&self.pool.geom.uuid)
        )
    }
}

/// What a new cluster's piece holds.
pub(crate) enum Fill {
    Data(AlignedBuf),
    Zero,
}

impl Fill {
    pub(crate) fn into_buf(self) -> Option<AlignedBuf> {
        match self {
            Fill::Data(b) => Some(b),
            Fill::Zero => None,
        }
    }
}

/// One request's view of its volume and pool.
pub(crate) struct ThinIo {
    pub(crate) pool: Arc<PoolInner>,
    pub(crate) vol: Arc<VolInner>,
}

impl ThinIo {
    fn bs(&self) -> u64 {
        u64::from(self.vol.meta.block_size)
    }

    /// The error for a piece of data that reaches past the volume's end
    /// (or a piece of zeroes that starts there): shrunk below it after the
    /// request was checked, while it waited for a lock the shrink held.
    /// Checked under the piece's lock (a shrink takes them all), so not
    /// even the cut part of the last cluster is written: a later grow must
    /// read zeroes there. Zeroes past the end are what it reads anyway (a
    /// Deallocate to the end zeroes the last cluster whole).
    pub(crate) fn cut_off(&self, p: Piece, zeroes: bool) -> Option<BlockError> {
        let cb = self.pool.geom.cluster_bytes;
        let size = self.vol.size();
        let start = p.vc * cb + p.off;
        let past = if zeroes {
            start >= size
        } else {
            start + p.len > size
        };
        past.then(|| BlockError::OutOfRange {
            lba: start / self.bs(),
            blocks: p.len / self.bs(),
            num_blocks: size / self.bs(),
        })
    }

    pub(crate) async fn read(&self, start: u64, end: u64, mut buf: AlignedBuf) -> IoDone {
        let cb = self.pool.geom.cluster_bytes;
        if let Some(p) = single_piece(cb, start, end) {
            let (buf, result) = self.read_piece(p, buf).await;
            return IoDone { buf, result };
        }
        let ps = pieces(cb, start, end);
        let res = join_all(ps.iter().map(|&p| self.read_piece(p, zbuf(p.len as usize)))).await;
        let mut result = Ok(());
        for (p, (b, r)) in ps.iter().zip(res) {
            match r {
                Ok(()) => buf[p.at..p.at + p.len as usize].copy_from_slice(&b[..p.len as usize]),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        IoDone { buf, result }
    }

    /// Reads one piece into `buf[..len]`.
    pub(crate) async fn read_piece(
        &self,
        p: Piece,
        mut buf: AlignedBuf,
    ) -> (AlignedBuf, Result<(), BlockError>) {
        if self.vol.surely_unmapped(p.vc) {
            // Unallocated (a write racing this read may be allocating it;
            // either order is a valid outcome). A snapshot taken meanwhile
            // sets the parent before it clears the map, and a merge of the
            // parent fills the map before it changes the parent, so a miss
            // with no parent on both sides of it was a true miss.
            buf[..p.len as usize].fill(0);
            return (buf, self.vol.check_live());
        }
        // The shard lock also keeps a merge (snapshot delete) from freeing
        // an ancestor's cluster this read resolves to.
        let _g = self.vol.lock(p.vc).read().await;
        if let Err(e) = self.vol.check_live() {
            return (buf, Err(e));
        }
        match self.vol.resolve(p.vc) {
            None => {
                buf[..p.len as usize].fill(0);
                (buf, Ok(()))
            }
            Some(Loc::Raw(c)) => {
                let at = self.pool.cluster_at(c) + p.off;
                self.pool.io(BlockOp::Read, at, p.len, buf).await
            }
            Some(Loc::Packed(x)) => self.read_packed(x, p, buf).await,
        }
    }

    pub(crate) async fn write(&self, start: u64, end: u64, buf: AlignedBuf, fua: bool) -> IoDone {
        if let Err(e) = self
            .pool
            .check_poisoned()
            .and_then(|()| self.vol.check_live())
        {
            return IoDone {
                buf,
                result: Err(e),
            };
        }
        let cb = self.pool.geom.cluster_bytes;
        let single = single_piece(cb, start, end);
        let ps = match single {
            Some(_) => Vec::new(),
            None => pieces(cb, start, end),
        };
        // Take every cluster the write will need up front, so a write that
        // runs out of space fails before it changes anything.
        // (In a compressed pool a piece may need a cluster unless it is
        // written in place into a raw one.)
        let unmapped = |p: &Piece| !matches!(self.vol.map.get(p.vc), Some(Loc::Raw(_)));
        let need = match &single {
            Some(p) => usize::from(unmapped(p)),
            None => ps.iter().filter(|p| unmapped(p)).count(),
        };
        let reserved = match self.pool.reserve(need) {
            Ok(r) => Mutex::new(r),
            Err(e) => {
                return IoDone {
                    buf,
                    result: Err(e),
                };
            }
        };
        let (buf, result) = if let Some(p) = single {
            self.write_piece(p, buf, fua, &reserved).await
        } else {
            let res = join_all(ps.iter().map(|&p| {
                let mut b = zbuf(p.len as usize);
                b.copy_from_slice(&buf[p.at..p.at + p.len as usize]);
                self.write_piece(p, b, fua, &reserved)
            }))
            .await;
            (buf, res.into_iter().try_for_each(|(_, r)| r))
        };
        self.pool.release(&reserved.into_inner());
        IoDone { buf, result }
    }

    /// Writes piece `p` in place, under its shard lock shared, when this
    /// volume maps its cluster raw; else gives the buffer back.
    pub(crate) async fn write_in_place(
        &self,
        p: Piece,
        buf: AlignedBuf,
        fua: bool,
    ) -> Result<(AlignedBuf, Result<(), BlockError>), AlignedBuf> {
        let raw = |s: &Self| s.vol.map.get(p.vc).and_then(Loc::raw);
        if raw(self).is_none() {
            return Err(buf);
        }
        let _g = self.vol.lock(p.vc).read().await;
        if let Some(e) = self
            .vol
            .check_live()
            .err()
            .or_else(|| self.cut_off(p, false))
        {
            return Ok((buf, Err(e)));
        }
        match raw(self) {
            Some(c) => {
                let at = self.pool.cluster_at(c) + p.off;
                Ok(self.pool.io(BlockOp::Write { fua }, at, p.len, buf).await)
            }
            None => Err(buf),
        }
    }

    /// Writes one piece from `buf[..len]`, allocating its cluster if needed.
    pub(crate) async fn write_piece(
        &self,
        p: Piece,
        buf: AlignedBuf,
        fua: bool,
        reserved: &Mutex<Vec<u32>>,
    ) -> (AlignedBuf, Result<(), BlockError>) {
        if self.pool.compressed() {
            return self.write_compressed(p, buf, fua, reserved).await;
        }
        let buf = match self.write_in_place(p, buf, fua).await {
            Ok(done) => return done,
            Err(buf) => buf,
        };
        let lock = self.vol.lock(p.vc);
        let raw = |s: &Self| s.vol.map.get(p.vc).and_then(Loc::raw);
        let _g = lock.write().await;
        if let Some(e) = self
            .vol
            .check_live()
            .err()
            .or_else(|| self.cut_off(p, false))
        {
            return (buf, Err(e));
        }
        if let Some(c) = raw(self) {
            // Another write allocated it while this one waited.
            let at = self.pool.cluster_at(c) + p.off;
            return self.pool.io(BlockOp::Write { fua }, at, p.len, buf).await;
        }
        // None reserved: deallocated since the reservation was counted.
        let c = match self.take_reserved(reserved) {
            Ok(c) => c,
            Err(e) => return (buf, Err(e)),
        };
        let (buf, r) = self.fill_new(c, p, Fill::Data(buf)).await;
        (buf.expect("data fill gives its buffer back"), r)
    }

    /// Fills new cluster `c` for piece `p` of a cluster this volume does not
    /// map yet, and maps it: the piece's data (or zeroes), the rest zeroes
    /// or, copy-on-write, what an ancestor holds there. The caller holds the
    /// piece's shard lock exclusively. On failure `c` is released (or, if
    /// the record failed, the pool is poisoned and `c` stays taken).
    pub(crate) async fn fill_new(
        &self,
        c: u32,
        p: Piece,
        fill: Fill,
    ) -> (Option<AlignedBuf>, Result<(), BlockError>) {
        if let Some(e) = self.cut_off(p, matches!(fill, Fill::Zero)) {
            self.pool.release(&[c]);
            return (fill.into_buf(), Err(e));
        }
        if self.pool.compressed() {
            return self.fill_packed(c, p, fill).await;
        }
        let cb = self.pool.geom.cluster_bytes;
        let base = self.pool.cluster_at(c);
        let whole = p.off == 0 && p.len == cb;
        // Without compression every place is a raw cluster.
        let (buf, r) = match (self.vol.inherited(p.vc).and_then(Loc::raw), fill) {
            (Some(src), fill) if !whole => {
                // Copy-on-write: the ancestor's cluster with this piece over it.
                let (mut cbuf, r) = self
                    .pool
                    .io(
                        BlockOp::Read,
                        self.pool.cluster_at(src),
                        cb,
                        // A pooled buffer: a fresh zeroed one faults in
                        // every page and is unmapped again, per write.
                        abuf(cb as usize),
                    )
                    .await;
                let range = p.off as usize..(p.off + p.len) as usize;
                let buf = match fill {
                    Fill::Data(b) => {
                        cbuf[range].copy_from_slice(&b[..p.len as usize]);
                        Some(b)
                    }
                    Fill::Zero => {
                        cbuf[range].fill(0);
                        None
                    }
                };
                let r = match r {
                    Ok(()) => {
                        let w = BlockOp::Write { fua: false };
                        let (cbuf, r) = self.pool.io(w, base, cb, cbuf).await;
                        recycle(cbuf);
                        r
                    }
                    Err(e) => Err(e),
                };
                (buf, r)
            }
            (_, Fill::Zero) => {
                let z = BlockOp::WriteZeroes;
                (None, self.pool.io(z, base, cb, AlignedBuf::new(0)).await.1)
            }
            (_, Fill::Data(buf)) => {
                let zero = |off: u64, len: u64| async move {
                    if len == 0 {
                        return Ok(());
                    }
                    let z = BlockOp::WriteZeroes;
                    self.pool.io(z, base + off, len, AlignedBuf::new(0)).await.1
                };
                let tail = p.off + p.len;
                let (head, (buf, data), tail) = futures_util::future::join3(
                    zero(0, p.off),
                    self.pool
                        .io(BlockOp::Write { fua: false }, base + p.off, p.len, buf),
                    zero(tail, cb - tail),
                )
                .await;
                (Some(buf), head.and(data).and(tail))
            }
        };
        if let Err(e) = r {
            self.pool.release(&[c]);
            return (buf, Err(e));
        }
        let r = self
            .pool
            .commit(vec![Record::Map {
                slot: self.vol.slot,
                vc: p.vc,
                p: c,
            }])
            .await;
        // On error the pool is poisoned and the cluster stays taken.
        (buf, r)
    }

    /// Write Zeroes and Deallocate: clusters covered whole are freed (or,
    /// where an ancestor snapshot holds data this volume must now hide,
    /// zeroed in place or given a zeroed cluster of their own); the covered
    /// part of others is zeroed.
    pub(crate) async fn zero(&self, start: u64, end: u64) -> Result<(), BlockError> {
        self.pool.check_poisoned()?;
        self.vol.check_live()?;
        let cb = self.pool.geom.cluster_bytes;
        let size = self.vol.size();
        // A cluster is covered whole when the range covers its readable part.
        let first_full = start.div_ceil(cb);
        let end_full = if end == size {
            self.vol.vclusters()
        } else {
            end / cb
        };
        let mut partial = Vec::new();
        if first_full < end_full {
            partial.extend(pieces(cb, start, (first_full * cb).min(end)));
            partial.extend(pieces(cb, (end_full * cb).min(end), end));
        } else {
            partial.extend(pieces(cb, start, end));
        }
        // Every cluster that reads as non-zero now: this volume's own and
        // its ancestors'. (A snapshot taken meanwhile moves own clusters to
        // an ancestor, so each is decided again under its lock.)
        let cands = if first_full < end_full {
            self.vol.mapped_in_chain(first_full, end_full)
        } else {
            Vec::new()
        };
        // Hiding an ancestor's data takes a cluster: take them all first, so
        // that running out of space fails before anything changes.
        // (A compressed chunk of its own is rewritten to a new place too.)
        let cow = |vc: u64| match self.vol.map.get(vc) {
            None => self.vol.inherited(vc).is_some(),
            Some(at) => at.raw().is_none(),
        };
        // A whole cluster takes one only where unmapping it would show an
        // ancestor's data and it cannot be zeroed in place: a compressed
        // chunk of its own with no ancestor's below is just unmapped
        // (`zero_clusters`).
        let hide = |vc: u64| {
            !matches!(self.vol.map.get(vc), Some(Loc::Raw(_))) && self.vol.inherited(vc).is_some()
        };
        let need = partial.iter().filter(|p| cow(p.vc)).count()
            + cands.iter().filter(|&&vc| hide(vc)).count();
        let reserved = Mutex::new(self.pool.reserve(need)?);
        let r = async {
            let res = join_all(partial.iter().map(|&p| self.zero_piece(p, &reserved))).await;
            res.into_iter().collect::<Result<(), _>>()?;
            for chunk in cands.chunks(UNMAP_CHUNK) {
                self.zero_clusters(chunk, &reserved).await?;
            }
            Ok(())
        }
        .await;
        self.pool.release(&reserved.into_inner());
        r
    }

    /// A cluster reserved for this request, or a new one.
    pub(crate) fn take_reserved(&self, reserved: &Mutex<Vec<u32>>) -> Result<u32, BlockError> {
        match reserved.lock().pop() {
            Some(c) => Ok(c),
            None => Ok(self.pool.reserve(1)?[0]),
        }
    }

    /// Zeroes whole clusters `vcs` (one chunk, under its shard locks).
    async fn zero_clusters(
        &self,
        vcs: &[u64],
        reserved: &Mutex<Vec<u32>>,
    ) -> Result<(), BlockError> {
        let cb = self.pool.geom.cluster_bytes;
        let mut shards: Vec<usize> = vcs.iter().map(|&vc| vc as usize % LOCK_SHARDS).collect();
        shards.sort_unstable();
        shards.dedup();
        let mut guards = Vec::with_capacity(shards.len());
        for s in shards {
            guards.push(self.vol.locks[s].write().await);
        }
        self.vol.check_live()?;
        let (mut recs, mut in_place, mut cow) = (Vec::new(), Vec::new(), Vec::new());
        let slot = self.vol.slot;
        for &vc in vcs {
            match (self.vol.map.get(vc), self.vol.inherited(vc)) {
                (Some(Loc::Raw(p)), None) => recs.push(Record::Unmap { slot, vc, p }),
                (Some(Loc::Packed(at)), None) => recs.push(Record::PUnmap { slot, vc, at }),
                // Unmapping would show the ancestor's data.
                (Some(Loc::Raw(p)), Some(_)) => in_place.push(p),
                // A chunk of zeroes replaces it (a few bytes compressed).
                (Some(Loc::Packed(_)), Some(_)) | (None, Some(_)) => cow.push(vc),
                (None, None) => {}
            }
        }
        if !recs.is_empty() {
            self.pool.commit(recs).await?;
        }
        let z = BlockOp::WriteZeroes;
        let res = join_all(in_place.iter().map(|&c| {
            let at = self.pool.cluster_at(c);
            async move { self.pool.io(z, at, cb, AlignedBuf::new(0)).await.1 }
        }))
        .await;
        res.into_iter().collect::<Result<(), _>>()?;
        if cow.is_empty() {
            return Ok(());
        }
        let mut new = Vec::with_capacity(cow.len());
        for _ in &cow {
            match self.take_reserved(reserved) {
                Ok(c) => new.push(c),
                Err(e) => {
                    self.pool.release(&new);
                    return Err(e);
                }
            }
        }
        let res = join_all(cow.iter().zip(new).map(|(&vc, c)| {
            let p = Piece {
                vc,
                off: 0,
                len: cb,
                at: 0,
            };
            async move { self.fill_new(c, p, Fill::Zero).await.1 }
        }))
        .await;
        drop(guards);
        res.into_iter().collect()
    }

    pub(crate) async fn zero_piece(
        &self,
        p: Piece,
        reserved: &Mutex<Vec<u32>>,
    ) -> Result<(), BlockError> {
        if self.vol.surely_unmapped(p.vc) {
            return Ok(());
        }
        let lock = self.vol.lock(p.vc);
        let raw = |s: &Self| s.vol.map.get(p.vc).and_then(Loc::raw);
        if raw(self).is_some() {
            let _g = lock.read().await;
            self.vol.check_live()?;
            if let Some(c) = raw(self) {
                return self.zero_at(c, p).await;
            }
        }
        // An ancestor's data may show here: this volume needs a cluster of
        // its own (or, compressed, a new chunk).
        let _g = lock.write().await;
        self.vol.check_live()?;
        match (self.vol.map.get(p.vc), self.vol.inherited(p.vc)) {
            (Some(Loc::Raw(c)), _) => self.zero_at(c, p).await,
            (Some(Loc::Packed(_)), _) | (None, Some(_)) => {
                let c = self.take_reserved(reserved)?;
                self.fill_new(c, p, Fill::Zero).await.1
            }
            (None, None) => Ok(()),
        }
    }

    /// Zeroes piece `p` in place in cluster `c`.
    async fn zero_at(&self, c: u32, p: Piece) -> Result<(), BlockError> {
        let at = self.pool.cluster_at(c) + p.off;
        let z = BlockOp::WriteZeroes;
        self.pool.io(z, at, p.len, AlignedBuf::new(0)).await.1
    }
}

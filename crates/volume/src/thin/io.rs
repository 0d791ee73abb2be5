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
use super::state::{PoolInner, VolInner};
use super::{LOCK_SHARDS, ThinInfo, UNMAP_CHUNK, info};
use crate::superblock::uuid_string;

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

    /// Allocated clusters as (virtual, physical) pairs, for tests and tools.
    pub fn mapped_clusters(&self) -> Vec<(u64, u64)> {
        self.vol
            .map
            .mapped(0, self.vol.vclusters())
            .into_iter()
            .map(|(v, p)| (v, u64::from(p)))
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

/// One request's view of its volume and pool.
pub(crate) struct ThinIo {
    pub(crate) pool: Arc<PoolInner>,
    pub(crate) vol: Arc<VolInner>,
}

impl ThinIo {
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
        if self.vol.map.get(p.vc).is_none() {
            // Unallocated (a write racing this read may be allocating it;
            // either order is a valid outcome).
            buf[..p.len as usize].fill(0);
            return (buf, self.vol.check_live());
        }
        let _g = self.vol.lock(p.vc).read().await;
        if let Err(e) = self.vol.check_live() {
            return (buf, Err(e));
        }
        match self.vol.map.get(p.vc) {
            None => {
                buf[..p.len as usize].fill(0);
                (buf, Ok(()))
            }
            Some(c) => {
                let at = self.pool.cluster_at(c) + p.off;
                self.pool.io(BlockOp::Read, at, p.len, buf).await
            }
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
        let unmapped = |p: &Piece| self.vol.map.get(p.vc).is_none();
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

    /// Writes one piece from `buf[..len]`, allocating its cluster if needed.
    pub(crate) async fn write_piece(
        &self,
        p: Piece,
        buf: AlignedBuf,
        fua: bool,
        reserved: &Mutex<Vec<u32>>,
    ) -> (AlignedBuf, Result<(), BlockError>) {
        let lock = self.vol.lock(p.vc);
        if self.vol.map.get(p.vc).is_some() {
            let _g = lock.read().await;
            if let Err(e) = self.vol.check_live() {
                return (buf, Err(e));
            }
            if let Some(c) = self.vol.map.get(p.vc) {
                let at = self.pool.cluster_at(c) + p.off;
                return self.pool.io(BlockOp::Write { fua }, at, p.len, buf).await;
            }
        }
        let _g = lock.write().await;
        if let Err(e) = self.vol.check_live() {
            return (buf, Err(e));
        }
        if let Some(c) = self.vol.map.get(p.vc) {
            // Another write allocated it while this one waited.
            let at = self.pool.cluster_at(c) + p.off;
            return self.pool.io(BlockOp::Write { fua }, at, p.len, buf).await;
        }
        let c = match reserved.lock().pop() {
            Some(c) => c,
            // Deallocated since the reservation was counted.
            None => match self.pool.reserve(1) {
                Ok(v) => v[0],
                Err(e) => return (buf, Err(e)),
            },
        };
        let cb = self.pool.geom.cluster_bytes;
        let base = self.pool.cluster_at(c);
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
        if let Err(e) = head.and(data).and(tail) {
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

    /// Write Zeroes and Deallocate: clusters covered whole are freed; the
    /// covered part of others is zeroed if they are allocated.
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
        let res = join_all(partial.iter().map(|&p| self.zero_piece(p))).await;
        res.into_iter().collect::<Result<(), _>>()?;
        if first_full >= end_full {
            return Ok(());
        }
        let mapped = self.vol.map.mapped(first_full, end_full);
        for chunk in mapped.chunks(UNMAP_CHUNK) {
            let mut shards: Vec<usize> = chunk
                .iter()
                .map(|&(vc, _)| vc as usize % LOCK_SHARDS)
                .collect();
            shards.sort_unstable();
            shards.dedup();
            let mut guards = Vec::with_capacity(shards.len());
            for s in shards {
                guards.push(self.vol.locks[s].write().await);
            }
            self.vol.check_live()?;
            let recs: Vec<Record> = chunk
                .iter()
                .filter_map(|&(vc, _)| {
                    self.vol.map.get(vc).map(|p| Record::Unmap {
                        slot: self.vol.slot,
                        vc,
                        p,
                    })
                })
                .collect();
            if !recs.is_empty() {
                self.pool.commit(recs).await?;
            }
        }
        Ok(())
    }

    pub(crate) async fn zero_piece(&self, p: Piece) -> Result<(), BlockError> {
        if self.vol.map.get(p.vc).is_none() {
            return Ok(());
        }
        let _g = self.vol.lock(p.vc).read().await;
        self.vol.check_live()?;
        match self.vol.map.get(p.vc) {
            None => Ok(()),
            Some(c) => {
                let at = self.pool.cluster_at(c) + p.off;
                let z = BlockOp::WriteZeroes;
                self.pool.io(z, at, p.len, AlignedBuf::new(0)).await.1
            }
        }
    }
}

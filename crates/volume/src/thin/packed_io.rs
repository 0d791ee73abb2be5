//! The I/O path of a compressed pool: a chunk is read whole and
//! decompressed; a write that is not an in-place write to a raw cluster
//! builds the whole new chunk (what the cluster held, or an ancestor, with
//! the piece over it), compresses it and stores it in a new place, and one
//! journal record moves the virtual cluster there and frees the old place.
//! The old place is freed only once that record is durable, so a crash at
//! any point leaves the old chunk or the new one, never a mix.

use blockdev::{AlignedBuf, BlockError, BlockOp};
use parking_lot::Mutex;

use super::format::{Record, io_err};
use super::io::{Fill, Piece, ThinIo};
use super::pack::{Compression, PACK_BLOCK, Packed, compress, decompress, looks_incompressible};
use super::state::Loc;
use crate::volume::member_io::{abuf, recycle};

/// Compresses `chunk` on tokio's blocking threads when there is a
/// runtime: a 64 KiB chunk is some 40 µs of LZ4 (more of zstd), which
/// would otherwise hold up every connection the reactor serves, and this
/// way chunks of concurrent writes compress on other cores.
async fn compress_off(
    algo: Compression,
    chunk: AlignedBuf,
) -> Result<(AlignedBuf, Option<AlignedBuf>), BlockError> {
    // The probe is cheap (two 4 KiB samples): not worth a thread hop.
    if algo == Compression::None || looks_incompressible(&chunk) {
        return Ok((chunk, None));
    }
    match tokio::runtime::Handle::try_current() {
        Ok(h) => h
            .spawn_blocking(move || {
                let z = compress(algo, &chunk);
                (chunk, z)
            })
            .await
            .map_err(|e| io_err(format!("thin pool: compression task: {e}"))),
        Err(_) => {
            let z = compress(algo, &chunk);
            Ok((chunk, z))
        }
    }
}

impl ThinIo {
    /// The whole chunk at `at`, uncompressed, in a buffer of the cluster's size.
    pub(crate) async fn load_chunk(&self, at: Loc) -> Result<AlignedBuf, BlockError> {
        let cb = self.pool.geom.cluster_bytes;
        let (addr, len) = match at {
            Loc::Raw(c) => (self.pool.cluster_at(c), cb),
            Loc::Packed(x) => (self.pool.packed_at(x), u64::from(x.blocks) * PACK_BLOCK),
        };
        let (stored, r) = self
            .pool
            .io(BlockOp::Read, addr, len, abuf(len as usize))
            .await;
        if let Err(e) = r {
            recycle(stored);
            return Err(e);
        }
        if let Loc::Raw(_) = at {
            return Ok(stored);
        }
        let mut out = abuf(cb as usize);
        let d = decompress(&stored, &mut out);
        recycle(stored);
        match d {
            Ok(()) => Ok(out),
            Err(e) => {
                recycle(out);
                // Name the volume and the place, for the operator.
                Err(io_err(format!(
                    "thin volume {}: {e} ({at:?})",
                    self.vol.meta.name
                )))
            }
        }
    }

    /// Reads piece `p` of compressed chunk `x` into `buf[..len]`.
    pub(crate) async fn read_packed(
        &self,
        x: Packed,
        p: Piece,
        mut buf: AlignedBuf,
    ) -> (AlignedBuf, Result<(), BlockError>) {
        match self.load_chunk(Loc::Packed(x)).await {
            Ok(chunk) => {
                let (off, len) = (p.off as usize, p.len as usize);
                buf[..len].copy_from_slice(&chunk[off..off + len]);
                recycle(chunk);
                (buf, Ok(()))
            }
            Err(e) => (buf, Err(e)),
        }
    }

    /// A write to a compressed pool: in place into a raw cluster the piece
    /// does not cover whole, else a new chunk.
    pub(crate) async fn write_compressed(
        &self,
        p: Piece,
        buf: AlignedBuf,
        fua: bool,
        reserved: &Mutex<Vec<u32>>,
    ) -> (AlignedBuf, Result<(), BlockError>) {
        let whole = p.off == 0 && p.len == self.pool.geom.cluster_bytes;
        let buf = if whole {
            buf
        } else {
            match self.write_in_place(p, buf, fua).await {
                Ok(done) => return done,
                Err(buf) => buf,
            }
        };
        let _g = self.vol.lock(p.vc).write().await;
        if let Err(e) = self.vol.check_live() {
            return (buf, Err(e));
        }
        let (buf, r) = self.store_chunk(p, Fill::Data(buf), fua, reserved).await;
        (buf.expect("data fill gives its buffer back"), r)
    }

    /// `fill_new` in a compressed pool: `c` is a cluster reserved for the
    /// piece, used if the chunk is stored raw or needs a new pack cluster.
    pub(crate) async fn fill_packed(
        &self,
        c: u32,
        p: Piece,
        fill: Fill,
    ) -> (Option<AlignedBuf>, Result<(), BlockError>) {
        let reserved = Mutex::new(vec![c]);
        let r = self.store_chunk(p, fill, false, &reserved).await;
        self.pool.release(&reserved.into_inner());
        r
    }

    /// Stores piece `p` (data or zeroes) of its cluster as a new chunk, or
    /// in place when the cluster is raw and stays so. The caller holds the
    /// piece's shard lock exclusively. Clusters it needs come from
    /// `reserved` first.
    async fn store_chunk(
        &self,
        p: Piece,
        fill: Fill,
        fua: bool,
        reserved: &Mutex<Vec<u32>>,
    ) -> (Option<AlignedBuf>, Result<(), BlockError>) {
        let cb = self.pool.geom.cluster_bytes;
        let (off, len) = (p.off as usize, p.len as usize);
        if let Some(e) = self.cut_off(p, matches!(fill, Fill::Zero)) {
            return (fill.into_buf(), Err(e));
        }
        let own = self.vol.map.get(p.vc);
        let whole = p.off == 0 && p.len == cb;
        if let (Some(Loc::Raw(c)), false) = (own, whole) {
            let at = self.pool.cluster_at(c) + p.off;
            return match fill {
                Fill::Data(b) => {
                    let (b, r) = self.pool.io(BlockOp::Write { fua }, at, p.len, b).await;
                    (Some(b), r)
                }
                Fill::Zero => {
                    let z = BlockOp::WriteZeroes;
                    (None, self.pool.io(z, at, p.len, AlignedBuf::new(0)).await.1)
                }
            };
        }
        // The new chunk: what the cluster reads as now, with the piece over it.
        let mut chunk = if whole {
            abuf(cb as usize)
        } else {
            match own.or_else(|| self.vol.inherited(p.vc)) {
                Some(at) => match self.load_chunk(at).await {
                    Ok(c) => c,
                    Err(e) => return (fill.into_buf(), Err(e)),
                },
                None => {
                    let mut z = abuf(cb as usize);
                    z.fill(0);
                    z
                }
            }
        };
        let buf = match fill {
            Fill::Data(b) => {
                chunk[off..off + len].copy_from_slice(&b[..len]);
                Some(b)
            }
            Fill::Zero => {
                chunk[off..off + len].fill(0);
                None
            }
        };
        let (chunk, z) = match compress_off(self.pool.geom.compression, chunk).await {
            Ok(c) => c,
            Err(e) => return (buf, Err(e)),
        };
        let r = match z {
            // A cluster of its own, uncompressed, is written in place when
            // no room is left for the compressed chunk: an overwrite needs
            // no space (and a multi-cluster write reserved none for it).
            // It draws on no cluster the write reserved for its other
            // pieces (none was reserved for it).
            Some(z) if matches!(own, Some(Loc::Raw(_))) => {
                let mine = Mutex::new(Vec::new());
                let r = self.store_packed(p.vc, z, &mine).await;
                self.pool.release(&mine.into_inner());
                match r {
                    Err(BlockError::NoSpace) => {
                        self.store_raw(p.vc, own, chunk, fua, reserved).await
                    }
                    r => {
                        recycle(chunk);
                        r
                    }
                }
            }
            Some(z) => {
                recycle(chunk);
                self.store_packed(p.vc, z, reserved).await
            }
            None => self.store_raw(p.vc, own, chunk, fua, reserved).await,
        };
        (buf, r)
    }

    /// Writes compressed chunk `z` to new blocks and maps `vc` there.
    async fn store_packed(
        &self,
        vc: u64,
        z: AlignedBuf,
        reserved: &Mutex<Vec<u32>>,
    ) -> Result<(), BlockError> {
        let n = (z.len() as u64 / PACK_BLOCK) as u32;
        let found = self.pool.packer.lock().take(n, &mut None);
        let x = match found {
            Some(x) => x,
            None => {
                let mut spare = Some(self.take_reserved(reserved)?);
                let x = self
                    .pool
                    .packer
                    .lock()
                    .take(n, &mut spare)
                    .expect("a free cluster holds any chunk");
                // Another write made room meanwhile: the spare goes back.
                reserved.lock().extend(spare);
                x
            }
        };
        let w = BlockOp::Write { fua: false };
        let len = z.len() as u64;
        let (zb, r) = self.pool.io(w, self.pool.packed_at(x), len, z).await;
        recycle(zb);
        if let Err(e) = r {
            self.pool.unpack(x);
            return Err(e);
        }
        let slot = self.vol.slot;
        // On error the pool is poisoned and the blocks stay taken.
        self.pool
            .commit(vec![Record::PMap { slot, vc, at: x }])
            .await
    }

    /// Writes uncompressed chunk `chunk` in place (its raw cluster) or to a
    /// new raw cluster, which `vc` is then mapped to.
    async fn store_raw(
        &self,
        vc: u64,
        own: Option<Loc>,
        chunk: AlignedBuf,
        fua: bool,
        reserved: &Mutex<Vec<u32>>,
    ) -> Result<(), BlockError> {
        let cb = self.pool.geom.cluster_bytes;
        if let Some(Loc::Raw(c)) = own {
            let w = BlockOp::Write { fua };
            let (b, r) = self.pool.io(w, self.pool.cluster_at(c), cb, chunk).await;
            recycle(b);
            return r;
        }
        let c = match self.take_reserved(reserved) {
            Ok(c) => c,
            Err(e) => {
                recycle(chunk);
                return Err(e);
            }
        };
        let w = BlockOp::Write { fua: false };
        let (b, r) = self.pool.io(w, self.pool.cluster_at(c), cb, chunk).await;
        recycle(b);
        if let Err(e) = r {
            self.pool.release(&[c]);
            return Err(e);
        }
        let slot = self.vol.slot;
        self.pool.commit(vec![Record::Map { slot, vc, p: c }]).await
    }
}

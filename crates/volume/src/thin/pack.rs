//! Compression: chunks (one cluster of a volume each) stored compressed,
//! packed at 4 KiB granularity into *pack clusters*.
//!
//! A pack cluster is an ordinary pool cluster whose owner entry is
//! [`PACK_OWNER`]; its 4 KiB blocks are handed out to compressed chunks,
//! each a run of contiguous blocks in one pack cluster. Where a chunk lives
//! is a [`Packed`] (first block, block count), kept per volume in a second
//! map beside the raw one. The checkpoint carries one owner code per block
//! of every cluster (`(slot + 1) << 48 | virtual cluster`, 0 when free): a
//! chunk is the run of blocks with one code, since a virtual cluster of a
//! volume has one place at a time. A chunk that would not save a block is
//! stored raw, in a cluster of its own, as in a pool without compression.
//!
//! A chunk on the device: a 16-byte header (magic, algorithm, compressed
//! length, CRC32C of the compressed bytes), the compressed bytes, zeroes
//! to the block's end. The CRC means a chunk that is not what its record
//! says fails the read with an error instead of returning garbage.

use std::cell::RefCell;
use std::collections::HashMap;

use blockdev::{AlignedBuf, BlockError};

use super::le::{le_u32, put_u32};
use crate::volume::member_io::{abuf, recycle};

/// Compression of a pool's chunks, chosen at format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Compression {
    #[default]
    None,
    /// LZ4: fast, a modest ratio.
    Lz4,
    /// zstd level 1: a better ratio for more CPU.
    Zstd,
}

impl Compression {
    pub(crate) fn code(self) -> u32 {
        match self {
            Compression::None => 0,
            Compression::Lz4 => 1,
            Compression::Zstd => 2,
        }
    }

    pub(crate) fn from_code(c: u32) -> Option<Compression> {
        match c {
            0 => Some(Compression::None),
            1 => Some(Compression::Lz4),
            2 => Some(Compression::Zstd),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" | "off" => Ok(Compression::None),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd),
            _ => Err(format!(
                "compression {s:?} is not known; use lz4, zstd or none"
            )),
        }
    }
}

/// CRC32C of chunk data, in hardware: it is on the data path.
fn crc32c(data: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

/// Owner-table entry of a pack cluster.
pub(crate) const PACK_OWNER: u64 = u64::MAX;
pub(crate) const PACK_BLOCK: u64 = 4096;
const CHUNK_MAGIC: [u8; 4] = *b"FPZ1";
const CHUNK_HDR: usize = 16;
/// Smallest and largest cluster a compressed pool may have: the block
/// count of a chunk must fit a byte.
pub const MIN_PACKED_CLUSTER: u64 = 16 << 10;
pub const MAX_PACKED_CLUSTER: u64 = 1 << 20;

/// Where a compressed chunk lives: its first block (pool-wide: cluster
/// times blocks per cluster, plus the block in it) and its block count.
/// Encoded in a map word as `blocks << 48 | first`, never 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Packed {
    pub(crate) first: u64,
    pub(crate) blocks: u32,
}

impl Packed {
    pub(crate) fn word(self) -> u64 {
        (u64::from(self.blocks) << 48) | self.first
    }

    pub(crate) fn from_word(w: u64) -> Option<Packed> {
        (w != 0).then_some(Packed {
            first: w & ((1 << 48) - 1),
            blocks: (w >> 48) as u32,
        })
    }

    /// The pack cluster it lies in.
    pub(crate) fn cluster(self, per_cluster: u64) -> u32 {
        (self.first / per_cluster) as u32
    }

    /// Its first block within that cluster.
    pub(crate) fn offset(self, per_cluster: u64) -> u64 {
        self.first % per_cluster
    }
}

/// Whether a chunk looks incompressible: LZ4 on two 4 KiB samples (its
/// start and middle) saves under 1/16 of either. Decides random or
/// already compressed data at a tenth of the cost of trying it whole.
pub(crate) fn looks_incompressible(chunk: &[u8]) -> bool {
    const SAMPLE: usize = 4096;
    if chunk.len() < 4 * SAMPLE {
        return false;
    }
    let mid = chunk.len() / 2;
    [&chunk[..SAMPLE], &chunk[mid..mid + SAMPLE]]
        .iter()
        .all(|s| lz4_flex::block::compress(s).len() > SAMPLE - SAMPLE / 16)
}

thread_local! {
    // zstd contexts are costly to make (tens of µs): one per thread, reused.
    static ZSTD_C: RefCell<Option<zstd::bulk::Compressor<'static>>> = const { RefCell::new(None) };
    static ZSTD_D: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

fn zstd_compress(chunk: &[u8], room: &mut [u8]) -> Option<usize> {
    ZSTD_C.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_none() {
            *c = zstd::bulk::Compressor::new(1).ok();
        }
        c.as_mut()?.compress_to_buffer(chunk, room).ok()
    })
}

fn zstd_decompress(body: &[u8], out: &mut [u8]) -> std::io::Result<usize> {
    ZSTD_D.with(|d| {
        let mut d = d.borrow_mut();
        if d.is_none() {
            *d = Some(zstd::bulk::Decompressor::new()?);
        }
        d.as_mut()
            .expect("made above")
            .decompress_to_buffer(body, out)
    })
}

/// Compresses `chunk` (a whole cluster) into a buffer of whole blocks, or
/// `None` when that would not save at least one block. The compressor
/// writes straight into the (pooled) buffer that goes to the device.
pub(crate) fn compress(algo: Compression, chunk: &[u8]) -> Option<AlignedBuf> {
    let limit = chunk.len() - PACK_BLOCK as usize;
    if algo == Compression::None || looks_incompressible(chunk) {
        return None;
    }
    // LZ4's encoder wants room for its worst case; what does not save a
    // block is refused after.
    let max = lz4_flex::block::get_maximum_output_size(chunk.len());
    let mut out = abuf(CHUNK_HDR + max);
    let n = match algo {
        Compression::None => None,
        Compression::Lz4 => lz4_flex::block::compress_into(chunk, &mut out[CHUNK_HDR..]).ok(),
        // (zstd says so itself when the output does not fit the room.)
        Compression::Zstd => zstd_compress(chunk, &mut out[CHUNK_HDR..limit]),
    };
    let Some(n) = n.filter(|&n| CHUNK_HDR + n <= limit) else {
        recycle(out);
        return None;
    };
    let total = (CHUNK_HDR + n).next_multiple_of(PACK_BLOCK as usize);
    let crc = crc32c(&out[CHUNK_HDR..CHUNK_HDR + n]);
    out[..CHUNK_HDR].fill(0);
    out[0..4].copy_from_slice(&CHUNK_MAGIC);
    out[4] = algo.code() as u8;
    put_u32(&mut out, 8, n as u32);
    put_u32(&mut out, 12, crc);
    out[CHUNK_HDR + n..total].fill(0);
    out.set_len(total);
    Some(out)
}

/// Decompresses a chunk read from its blocks into `out` (the cluster's
/// size). Anything that is not a sound chunk of exactly that size is an
/// I/O error.
pub(crate) fn decompress(stored: &[u8], out: &mut [u8]) -> Result<(), BlockError> {
    let bad = |why: &str| {
        BlockError::Io(std::io::Error::other(format!(
            "thin pool: compressed chunk unreadable: {why}"
        )))
    };
    if stored.len() < CHUNK_HDR || stored[0..4] != CHUNK_MAGIC {
        return Err(bad("no chunk header"));
    }
    let len = le_u32(stored, 8) as usize;
    let body = stored
        .get(CHUNK_HDR..CHUNK_HDR + len)
        .ok_or_else(|| bad("length past its blocks"))?;
    if crc32c(body) != le_u32(stored, 12) {
        return Err(bad("checksum mismatch"));
    }
    let n = match Compression::from_code(u32::from(stored[4])) {
        Some(Compression::Lz4) => {
            lz4_flex::block::decompress_into(body, out).map_err(|e| bad(&e.to_string()))?
        }
        Some(Compression::Zstd) => zstd_decompress(body, out).map_err(|e| bad(&e.to_string()))?,
        _ => return Err(bad("unknown algorithm")),
    };
    if n != out.len() {
        return Err(bad("wrong decompressed size"));
    }
    Ok(())
}

/// Which blocks of the pack clusters are taken: committed, being written,
/// or freed but not durably so. A pack cluster whose blocks are all free
/// goes back to the cluster allocator.
#[derive(Clone, Default)]
pub(crate) struct Packer {
    per_cluster: u64,
    /// Per pack cluster, a bit per block (set: taken), and how many are set.
    clusters: HashMap<u32, (Vec<u64>, u32)>,
    /// Pack clusters with free blocks, the newest last.
    open: Vec<u32>,
    /// Pack clusters being emptied by compaction: no new chunks go there.
    held: Vec<u32>,
}

/// Candidates one allocation looks at before it takes a new cluster.
const SCAN: usize = 32;

impl Packer {
    pub(crate) fn new(per_cluster: u64) -> Packer {
        Packer {
            per_cluster,
            ..Packer::default()
        }
    }

    /// Marks blocks taken (at open, from the committed state; or by `take`).
    pub(crate) fn mark(&mut self, at: Packed) {
        let (p, off) = (at.cluster(self.per_cluster), at.offset(self.per_cluster));
        let words = self.per_cluster.div_ceil(64) as usize;
        let e = self.clusters.entry(p).or_insert_with(|| {
            if !self.held.contains(&p) {
                self.open.push(p);
            }
            (vec![0; words], 0)
        });
        for b in off..off + u64::from(at.blocks) {
            let (w, bit) = ((b / 64) as usize, 1u64 << (b % 64));
            debug_assert!(e.0[w] & bit == 0, "pack block taken twice");
            e.0[w] |= bit;
        }
        e.1 += at.blocks;
    }

    fn fit(&self, p: u32, n: u32) -> Option<u64> {
        let (bits, used) = self.clusters.get(&p)?;
        if self.per_cluster - u64::from(*used) < u64::from(n) {
            return None;
        }
        let mut run = 0u64;
        for b in 0..self.per_cluster {
            if bits[(b / 64) as usize] & (1 << (b % 64)) == 0 {
                run += 1;
                if run == u64::from(n) {
                    return Some(b + 1 - run);
                }
            } else {
                run = 0;
            }
        }
        None
    }

    /// Takes `n` contiguous blocks in a pack cluster that has them, else in
    /// `spare` (a free cluster the caller reserved, which becomes a pack
    /// cluster). `None` when neither fits.
    pub(crate) fn take(&mut self, n: u32, spare: &mut Option<u32>) -> Option<Packed> {
        let found = self
            .open
            .iter()
            .rev()
            .take(SCAN)
            .find_map(|&p| self.fit(p, n).map(|off| (p, off)));
        let (p, off) = match found {
            Some(f) => f,
            None => (spare.take()?, 0),
        };
        let at = Packed {
            first: u64::from(p) * self.per_cluster + off,
            blocks: n,
        };
        self.mark(at);
        if self.clusters[&p].1 as u64 == self.per_cluster {
            self.open.retain(|&q| q != p);
        }
        Some(at)
    }

    /// Frees blocks; returns the pack cluster when it is now wholly free
    /// (the caller gives it back to the cluster allocator).
    pub(crate) fn put(&mut self, at: Packed) -> Option<u32> {
        let (p, off) = (at.cluster(self.per_cluster), at.offset(self.per_cluster));
        let e = self.clusters.get_mut(&p)?;
        let was_full = u64::from(e.1) == self.per_cluster;
        for b in off..off + u64::from(at.blocks) {
            let (w, bit) = ((b / 64) as usize, 1u64 << (b % 64));
            debug_assert!(e.0[w] & bit != 0, "pack block freed twice");
            e.0[w] &= !bit;
        }
        e.1 -= at.blocks;
        if e.1 == 0 {
            // Back to the cluster allocator, which may hand it out again
            // as a new pack cluster: no longer held.
            self.clusters.remove(&p);
            self.open.retain(|&q| q != p);
            self.held.retain(|&q| q != p);
            return Some(p);
        }
        if was_full && !self.held.contains(&p) {
            self.open.push(p);
        }
        None
    }

    /// Keeps new chunks out of pack clusters `ps` (compaction empties them).
    pub(crate) fn hold(&mut self, ps: &[u32]) {
        self.held.extend_from_slice(ps);
        self.open.retain(|q| !ps.contains(q));
    }

    /// Ends [`Packer::hold`]: those still in use take chunks again.
    pub(crate) fn unhold(&mut self) {
        for p in std::mem::take(&mut self.held) {
            if self
                .clusters
                .get(&p)
                .is_some_and(|e| u64::from(e.1) < self.per_cluster)
            {
                self.open.push(p);
            }
        }
    }

    /// Blocks taken in pack cluster `p` (for checks and compaction).
    pub(crate) fn used(&self, p: u32) -> Option<u32> {
        self.clusters.get(&p).map(|e| e.1)
    }

    /// How many pack clusters hold blocks.
    pub(crate) fn cluster_count(&self) -> usize {
        self.clusters.len()
    }

    /// Pack clusters and their taken blocks.
    pub(crate) fn fill(&self) -> Vec<(u32, u32)> {
        self.clusters.iter().map(|(&p, e)| (p, e.1)).collect()
    }

    pub(crate) fn is_taken(&self, first: u64) -> bool {
        let p = (first / self.per_cluster) as u32;
        let b = first % self.per_cluster;
        self.clusters
            .get(&p)
            .is_some_and(|e| e.0[(b / 64) as usize] & (1 << (b % 64)) != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_round_trip_and_incompressible_ones_are_refused() {
        let mut chunk = vec![0u8; 64 << 10];
        for (i, b) in chunk.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        for algo in [Compression::Lz4, Compression::Zstd] {
            let c = compress(algo, &chunk).expect("compressible");
            assert!(c.len() < chunk.len() && c.len().is_multiple_of(4096));
            let mut out = vec![0u8; chunk.len()];
            decompress(&c, &mut out).unwrap();
            assert_eq!(out, chunk);
            // A flipped byte fails the checksum, never returns garbage.
            let mut bad = c.to_vec();
            bad[20] ^= 1;
            assert!(decompress(&bad, &mut out).is_err());
            // Another size is refused.
            let mut short = vec![0u8; chunk.len() / 2];
            assert!(decompress(&c, &mut short).is_err());
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for b in chunk.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        assert!(compress(Compression::Lz4, &chunk).is_none());
        assert!(compress(Compression::Zstd, &chunk).is_none());
        assert!(decompress(&[0u8; 4096], &mut [0u8; 4096]).is_err());
    }

    #[test]
    fn the_packer_fills_clusters_and_gives_empty_ones_back() {
        let mut p = Packer::new(16);
        let mut spare = Some(7);
        let a = p.take(10, &mut spare).unwrap();
        assert_eq!((a.first, a.blocks, spare), (7 * 16, 10, None));
        let b = p.take(6, &mut None).unwrap();
        assert_eq!(b.first, 7 * 16 + 10);
        // Full: the next one needs a spare.
        assert!(p.take(1, &mut None).is_none());
        assert_eq!(p.put(a), None);
        let c = p.take(4, &mut None).unwrap();
        assert_eq!(c.first, 7 * 16);
        assert_eq!(p.put(b), None);
        assert_eq!(p.put(c), Some(7));
        assert_eq!(p.used(7), None);
        assert_eq!(
            Packed::from_word(
                Packed {
                    first: 5,
                    blocks: 3
                }
                .word()
            ),
            Some(Packed {
                first: 5,
                blocks: 3
            })
        );
        assert_eq!(Packed::from_word(0), None);
    }
}

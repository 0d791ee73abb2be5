//! The pool's on-device format: geometry block, volume table entries,
//! journal records, and the little-endian and CRC helpers they share.

use blockdev::{AlignedBuf, BlockError};

pub(crate) use super::le::{le_u32, le_u64, put_u32, put_u64};
use super::pack::{Compression, MAX_PACKED_CLUSTER, MIN_PACKED_CLUSTER, PACK_BLOCK, Packed};
use super::{
    BLOCK, BLOCK_USIZE, CRC_AT, DEFAULT_CLUSTER_BYTES, MAX_CLUSTERS, MAX_NAME_BYTES,
    MAX_VOLUME_CLUSTERS, MAX_VOLUMES, SB_MAGIC, ThinError, VC_BITS, VC_MASK, VERSION, VOL_ENTRY,
    VOL_TABLE_BYTES,
};
use crate::crc::crc32c;

/// Where the areas of a pool lie on its device (the superblock's content).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PoolGeom {
    pub(crate) uuid: [u8; 16],
    pub(crate) cluster_bytes: u64,
    pub(crate) clusters: u64,
    pub(crate) checkpoint_bytes: u64,
    pub(crate) checkpoint_at: [u64; 2],
    pub(crate) journal_at: u64,
    pub(crate) journal_blocks: u64,
    pub(crate) data_at: u64,
    pub(crate) device_bytes: u64,
    pub(crate) compression: Compression,
    /// 4 KiB blocks per cluster in a compressed pool (its checkpoint holds
    /// an owner code per block); 0 without compression.
    pub(crate) pack_blocks: u64,
}

/// Bytes of owner entries one cluster takes in a checkpoint.
pub(crate) fn owner_entry_bytes(pack_blocks: u64) -> u64 {
    8 * (1 + pack_blocks)
}

pub(crate) fn checkpoint_bytes(clusters: u64, pack_blocks: u64) -> u64 {
    (BLOCK + VOL_TABLE_BYTES + clusters * owner_entry_bytes(pack_blocks)).next_multiple_of(BLOCK)
}

/// 64 bytes of journal per cluster (4 records), 64 KiB to 64 MiB: a
/// checkpoint then costs about as much as the commits that filled the journal.
pub(crate) fn journal_blocks(clusters: u64) -> u64 {
    (clusters * 64 / BLOCK).clamp(16, 16384)
}

/// Seals a 4 KiB metadata block with its CRC32C in the last 4 bytes.
pub(crate) fn seal(b: &mut [u8]) {
    let crc = crc32c(&b[..CRC_AT]);
    put_u32(b, CRC_AT, crc);
}

pub(crate) fn sealed(b: &[u8]) -> bool {
    b.len() >= BLOCK_USIZE && le_u32(b, CRC_AT) == crc32c(&b[..CRC_AT])
}

impl PoolGeom {
    pub(crate) fn plan(
        device_bytes: u64,
        cluster_bytes: u64,
        uuid: [u8; 16],
        compression: Compression,
    ) -> Result<PoolGeom, ThinError> {
        if !cluster_bytes.is_power_of_two() || !(BLOCK..=1 << 30).contains(&cluster_bytes) {
            return Err(ThinError::Config(format!(
                "cluster size {cluster_bytes} bytes is not a power of two from 4 KiB to 1 GiB; \
                 use {DEFAULT_CLUSTER_BYTES}"
            )));
        }
        let pack_blocks = if compression == Compression::None {
            0
        } else if (MIN_PACKED_CLUSTER..=MAX_PACKED_CLUSTER).contains(&cluster_bytes) {
            cluster_bytes / PACK_BLOCK
        } else {
            return Err(ThinError::Config(format!(
                "a compressed pool needs clusters of {} KiB to {} KiB (each is compressed \
                 whole); {cluster_bytes} bytes is outside that, use 65536",
                MIN_PACKED_CLUSTER >> 10,
                MAX_PACKED_CLUSTER >> 10
            )));
        };
        let layout = |c: u64| {
            let cp = checkpoint_bytes(c, pack_blocks);
            let jb = journal_blocks(c);
            let journal_at = BLOCK + 2 * cp;
            let data_at = (journal_at + jb * BLOCK).next_multiple_of(cluster_bytes);
            PoolGeom {
                uuid,
                cluster_bytes,
                clusters: c,
                checkpoint_bytes: cp,
                checkpoint_at: [BLOCK, BLOCK + cp],
                journal_at,
                journal_blocks: jb,
                data_at,
                device_bytes,
                compression,
                pack_blocks,
            }
        };
        let mut c = (device_bytes / cluster_bytes).min(MAX_CLUSTERS);
        loop {
            if c == 0 {
                let need = layout(1).data_at + cluster_bytes;
                return Err(ThinError::Config(format!(
                    "the pool device holds {device_bytes} bytes, too few for the metadata and one \
                     {cluster_bytes}-byte cluster; use a device of at least {need} bytes"
                )));
            }
            let g = layout(c);
            let end = g.data_at + c * cluster_bytes;
            if end <= device_bytes {
                if c == MAX_CLUSTERS && device_bytes / cluster_bytes > MAX_CLUSTERS {
                    tracing::warn!(
                        "thin pool: only the first {MAX_CLUSTERS} clusters of the device are used; \
                         use a larger cluster size to use all of it"
                    );
                }
                return Ok(g);
            }
            c -= (end - device_bytes).div_ceil(cluster_bytes).min(c);
        }
    }

    pub(crate) fn encode(&self) -> AlignedBuf {
        let mut b = zbuf(BLOCK_USIZE);
        b[0..8].copy_from_slice(&SB_MAGIC);
        // Version 2 marks a compressed pool, which a build that does not
        // know compression must not open.
        let version = if self.pack_blocks == 0 { VERSION } else { 2 };
        put_u32(&mut b, 8, version);
        b[16..32].copy_from_slice(&self.uuid);
        put_u64(&mut b, 32, self.cluster_bytes);
        put_u64(&mut b, 40, self.clusters);
        put_u64(&mut b, 48, self.checkpoint_bytes);
        put_u64(&mut b, 56, self.checkpoint_at[0]);
        put_u64(&mut b, 64, self.checkpoint_at[1]);
        put_u64(&mut b, 72, self.journal_at);
        put_u64(&mut b, 80, self.journal_blocks);
        put_u64(&mut b, 88, self.data_at);
        put_u64(&mut b, 96, self.device_bytes);
        put_u32(&mut b, 104, MAX_VOLUMES as u32);
        put_u32(&mut b, 108, self.compression.code());
        seal(&mut b);
        b
    }

    pub(crate) fn decode(b: &[u8], device: &str) -> Result<PoolGeom, ThinError> {
        let magic: [u8; 8] = b[0..8].try_into().expect("8 bytes");
        if magic != SB_MAGIC {
            return Err(ThinError::NotAPool {
                device: device.to_string(),
                magic,
            });
        }
        if !sealed(b) {
            return Err(ThinError::Corrupt(format!(
                "{device}: the pool superblock (block 0) fails its checksum"
            )));
        }
        let version = le_u32(b, 8);
        let compression = match version {
            VERSION => Compression::None,
            2 => Compression::from_code(le_u32(b, 108))
                .filter(|&c| c != Compression::None)
                .ok_or_else(|| {
                    ThinError::Corrupt(format!(
                        "{device}: the pool superblock names compression {}",
                        le_u32(b, 108)
                    ))
                })?,
            v => return Err(ThinError::Version(v)),
        };
        let g = PoolGeom {
            uuid: b[16..32].try_into().expect("16 bytes"),
            cluster_bytes: le_u64(b, 32),
            clusters: le_u64(b, 40),
            checkpoint_bytes: le_u64(b, 48),
            checkpoint_at: [le_u64(b, 56), le_u64(b, 64)],
            journal_at: le_u64(b, 72),
            journal_blocks: le_u64(b, 80),
            data_at: le_u64(b, 88),
            device_bytes: le_u64(b, 96),
            compression,
            pack_blocks: 0,
        };
        let max_volumes = le_u32(b, 104);
        // The layout must be exactly what format would have planned.
        let planned = PoolGeom::plan(g.device_bytes, g.cluster_bytes, g.uuid, compression).ok();
        let g = PoolGeom {
            pack_blocks: planned.map_or(0, |p| p.pack_blocks),
            ..g
        };
        if max_volumes as usize != MAX_VOLUMES || planned != Some(g) {
            return Err(ThinError::Corrupt(format!(
                "{device}: the pool superblock describes an impossible layout: {g:?}"
            )));
        }
        Ok(g)
    }
}

/// What the volume table stores of one thin volume or snapshot.
///
/// Entry layout (128 bytes): 0 in use, 1 name length, 2 flags, 4 block
/// size, 8 size, 16 uuid, 32 name (64), 96 parent slot + 1 (0: none),
/// 104 creation time (Unix seconds). Pools written before snapshots have
/// zeroes in flags and parent, which read as plain volumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VolMeta {
    pub(crate) name: String,
    pub(crate) uuid: [u8; 16],
    pub(crate) size_bytes: u64,
    pub(crate) block_size: u32,
    /// A read-only point-in-time image whose clusters its children share.
    pub(crate) snapshot: bool,
    /// A deleted snapshot kept because two or more children still read
    /// through it; it has no name in the pool and is not listed.
    pub(crate) hidden: bool,
    /// The snapshot this one reads unwritten clusters from.
    pub(crate) parent: Option<u16>,
    pub(crate) created: u64,
}

const FLAG_SNAPSHOT: u8 = 1;
const FLAG_HIDDEN: u8 = 2;

impl VolMeta {
    pub(crate) fn encode(&self, b: &mut [u8]) {
        b[..VOL_ENTRY].fill(0);
        b[0] = 1;
        b[1] = self.name.len() as u8;
        b[2] = if self.snapshot { FLAG_SNAPSHOT } else { 0 }
            | if self.hidden { FLAG_HIDDEN } else { 0 };
        put_u32(b, 4, self.block_size);
        put_u64(b, 8, self.size_bytes);
        b[16..32].copy_from_slice(&self.uuid);
        b[32..32 + self.name.len()].copy_from_slice(self.name.as_bytes());
        let parent = self.parent.map_or(0, |p| p + 1);
        b[96..98].copy_from_slice(&parent.to_le_bytes());
        put_u64(b, 104, self.created);
    }

    pub(crate) fn decode(
        b: &[u8],
        slot: usize,
        cluster_bytes: u64,
    ) -> Result<Option<VolMeta>, String> {
        match b[0] {
            0 => return Ok(None),
            1 => {}
            x => return Err(format!("volume slot {slot}: in-use byte {x}")),
        }
        let flags = b[2];
        if flags & !(FLAG_SNAPSHOT | FLAG_HIDDEN) != 0 || flags == FLAG_HIDDEN {
            return Err(format!("volume slot {slot}: flags {flags:#x}"));
        }
        let parent = u16::from_le_bytes([b[96], b[97]]);
        if usize::from(parent) > MAX_VOLUMES || usize::from(parent) == slot + 1 {
            return Err(format!("volume slot {slot}: parent slot {parent} - 1"));
        }
        let len = usize::from(b[1]);
        let name = std::str::from_utf8(b.get(32..32 + len).unwrap_or(&[]))
            .map_err(|_| format!("volume slot {slot}: name is not UTF-8"))?;
        let m = VolMeta {
            name: name.to_string(),
            uuid: b[16..32].try_into().expect("16 bytes"),
            size_bytes: le_u64(b, 8),
            block_size: le_u32(b, 4),
            snapshot: flags & FLAG_SNAPSHOT != 0,
            hidden: flags & FLAG_HIDDEN != 0,
            parent: parent.checked_sub(1),
            created: le_u64(b, 104),
        };
        validate_volume(&m.name, m.size_bytes, m.block_size, cluster_bytes, 512)
            .map_err(|e| format!("volume slot {slot}: {e}"))?;
        Ok(Some(m))
    }
}

pub(crate) fn validate_name(name: &str) -> Result<(), ThinError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "-_.:".contains(c);
    if name.is_empty() || name.len() > MAX_NAME_BYTES || !name.chars().all(ok_char) {
        return Err(ThinError::Config(format!(
            "thin volume name {} must be 1 to {MAX_NAME_BYTES} characters of \
             A-Z a-z 0-9 - _ . :",
            super::shown(name)
        )));
    }
    Ok(())
}

pub(crate) fn validate_volume(
    name: &str,
    size_bytes: u64,
    block_size: u32,
    cluster_bytes: u64,
    device_block: u32,
) -> Result<(), ThinError> {
    validate_name(name)?;
    if block_size != 512 && block_size != 4096 {
        return Err(ThinError::Config(format!(
            "block size {block_size} is not supported; use 4096 or 512"
        )));
    }
    if block_size < device_block {
        return Err(ThinError::Config(format!(
            "block size {block_size} is smaller than the pool device's {device_block}-byte \
             blocks; use {device_block}"
        )));
    }
    let bs = u64::from(block_size);
    if size_bytes == 0 || !size_bytes.is_multiple_of(bs) {
        return Err(ThinError::Config(format!(
            "size {size_bytes} bytes is not a non-zero multiple of the {block_size}-byte block; \
             use {}",
            size_bytes.max(1).next_multiple_of(bs)
        )));
    }
    if size_bytes.div_ceil(cluster_bytes) > MAX_VOLUME_CLUSTERS {
        return Err(ThinError::Config(format!(
            "size {size_bytes} bytes spans more than {MAX_VOLUME_CLUSTERS} clusters of \
             {cluster_bytes} bytes; use at most {} bytes or a pool with larger clusters",
            MAX_VOLUME_CLUSTERS * cluster_bytes
        )));
    }
    Ok(())
}

pub(crate) fn owner_code(slot: u16, vc: u64) -> u64 {
    ((u64::from(slot) + 1) << VC_BITS) | vc
}

pub(crate) fn owner_slot_vc(code: u64) -> (u64, u64) {
    // (A corrupt entry with no slot bits wraps to a slot that is refused.)
    ((code >> VC_BITS).wrapping_sub(1), code & VC_MASK)
}

/// One journal record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Record {
    /// Virtual cluster `vc` of volume `slot` now lives in physical cluster
    /// `p` (and no longer in the compressed chunk it may have had).
    Map { slot: u16, vc: u64, p: u32 },
    /// Virtual cluster `vc` of volume `slot` (in `p`) is unallocated again.
    Unmap { slot: u16, vc: u64, p: u32 },
    /// Virtual cluster `vc` of volume `slot` now lives compressed `at` (and
    /// no longer where it lived before, raw or compressed).
    PMap { slot: u16, vc: u64, at: Packed },
    /// Virtual cluster `vc` of volume `slot` (compressed `at`) is
    /// unallocated again.
    PUnmap { slot: u16, vc: u64, at: Packed },
}

impl Record {
    /// Layout (16 bytes): 0 kind, 1 block count (compressed), 2 slot, 4 the
    /// physical cluster (or the low 32 bits of the first block), 8 the
    /// virtual cluster (48 bits; the first block's high 16 bits above).
    pub(crate) fn encode(&self, b: &mut [u8]) {
        let (kind, slot, vc, p, blocks) = match *self {
            Record::Map { slot, vc, p } => (1u8, slot, vc, u64::from(p), 0),
            Record::Unmap { slot, vc, p } => (2u8, slot, vc, u64::from(p), 0),
            Record::PMap { slot, vc, at } => (3u8, slot, vc, at.first, at.blocks),
            Record::PUnmap { slot, vc, at } => (4u8, slot, vc, at.first, at.blocks),
        };
        b[0] = kind;
        b[1] = blocks as u8;
        b[2..4].copy_from_slice(&slot.to_le_bytes());
        put_u32(b, 4, p as u32);
        put_u64(b, 8, (vc & VC_MASK) | ((p >> 32) << VC_BITS));
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Record, String> {
        let slot = u16::from_le_bytes([b[2], b[3]]);
        let p = le_u32(b, 4);
        let w = le_u64(b, 8);
        let (vc, high) = (w & VC_MASK, w >> VC_BITS);
        let at = Packed {
            first: (high << 32) | u64::from(p),
            blocks: u32::from(b[1]),
        };
        let plain = b[1] == 0 && high == 0;
        match b[0] {
            1 if plain => Ok(Record::Map { slot, vc, p }),
            2 if plain => Ok(Record::Unmap { slot, vc, p }),
            3 if b[1] != 0 => Ok(Record::PMap { slot, vc, at }),
            4 if b[1] != 0 => Ok(Record::PUnmap { slot, vc, at }),
            k => Err(format!("journal record kind {k} with {} blocks", b[1])),
        }
    }
}

pub(crate) fn zbuf(len: usize) -> AlignedBuf {
    let mut b = AlignedBuf::new(len);
    b.set_len(len);
    b
}

pub(crate) fn io_err(msg: String) -> BlockError {
    BlockError::Io(std::io::Error::other(msg))
}

pub(crate) fn poisoned_err() -> BlockError {
    io_err(ThinError::Poisoned.to_string())
}

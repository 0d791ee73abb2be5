//! Thin provisioning: thin volumes carved out of one pool device.
//!
//! A [`ThinPool`] lives on one [`BlockDevice`] (typically a protected
//! [`Volume`](crate::Volume)). It hands out [`ThinVolume`]s, each itself a
//! `BlockDevice` whose virtual size may exceed what the pool holds. Space is
//! taken in clusters (default [`DEFAULT_CLUSTER_BYTES`]) on the first write to
//! a cluster and given back by Deallocate (Dataset Management) or Write
//! Zeroes of whole clusters. Unallocated ranges read back as zeroes. A write
//! that needs a cluster when none is free fails with [`BlockError::NoSpace`]
//! (the target answers NVMe "Capacity Exceeded") and changes nothing.
//!
//! # On-device format
//!
//! All integers little-endian; metadata moves in 4 KiB blocks, each with a
//! CRC32C.
//!
//! | where | what |
//! |---|---|
//! | block 0 | pool superblock: magic `FLPLTHN1`, version, pool uuid, cluster bytes, cluster count, where each area below starts. Written once, at format. |
//! | checkpoint A, B | two copies of the whole metadata: a 4 KiB header (magic `FLPLTCP1`, pool uuid, epoch, CRC of the body), then a table of [`MAX_VOLUMES`] volume entries (name, uuid, size, block size; 128 bytes each), then the *owner table*: one u64 per physical cluster, 0 for free or `(slot + 1) << 48 \| virtual cluster`. The copy for epoch `e` is at `e % 2`. |
//! | journal | 4 KiB blocks (magic `FLPLTJN1`, pool uuid, epoch, block index, records) of 16-byte map records: `Map`/`Unmap` (slot, virtual cluster, physical cluster). |
//! | data | `cluster count` clusters, the first aligned to the cluster size. |
//!
//! The owner table is indexed by physical cluster, so it has a fixed size
//! (8 bytes per cluster, 8 MiB for a 1 TiB pool of 1 MiB clusters) and no
//! physical cluster can be in two maps by construction. The per-volume maps
//! (virtual -> physical) are rebuilt from it in memory at open.
//!
//! # Crash safety
//!
//! * **Allocation** (first write to a cluster): pick a cluster free in
//!   memory; write the data and zero the rest of the cluster; flush the pool
//!   device; append a `Map` record to the journal with FUA; only then update
//!   the in-memory map and acknowledge. A crash before the journal write
//!   leaves the cluster free on disk (nothing leaks) and loses only the
//!   unacknowledged write. The flush before the record means a record never
//!   names a cluster whose new contents are not durable, so a volume never
//!   reads another volume's stale data.
//! * **Free** (Deallocate, Write Zeroes, delete): the `Unmap` record (or the
//!   checkpoint without the volume) is made durable *before* the cluster
//!   becomes allocatable again, so a reused cluster is never still owned by
//!   its old volume after a crash.
//! * **Journal**: every group commit appends whole new blocks, never
//!   rewriting one, so a torn write only loses the blocks of the commit in
//!   flight (their CRC fails, or their epoch or index is wrong). Replay stops
//!   at the first block that is not the next valid one of the current epoch.
//! * **Checkpoint**: when the journal is full, at open, at create, delete and
//!   close, the whole state is written to the *other* checkpoint copy with the
//!   next epoch, then flushed; from then on the journal starts again at block
//!   0 in the new epoch, so older blocks no longer replay. A torn checkpoint
//!   fails its CRC and open uses the older copy and its journal, which is
//!   still intact because no block of the new epoch is written before the new
//!   checkpoint is durable. Open always writes a fresh checkpoint, so blocks
//!   left past a torn commit can never be replayed after later appends.
//! * The superblock and checkpoints carry the pool uuid, so metadata of an
//!   earlier pool on the same device is never taken for this one's. Format
//!   first zeroes block 0, so a format cut short leaves no pool at all.
//! * A failed metadata write leaves memory ahead of the device; the pool then
//!   refuses writes (reads go on) until it is reopened, which replays what did
//!   land.
//!
//! # Concurrency
//!
//! Each thin volume has a table of async reader-writer locks sharded by
//! virtual cluster. Reads and writes of an allocated cluster share the lock,
//! so they run concurrently and a Deallocate (exclusive) cannot free and
//! reuse a cluster under them. The first write to a cluster takes it
//! exclusively and checks the map again, so two first writes allocate once.
//! Map records from all volumes are *group-committed*: one task writes every
//! record queued while the previous commit was in flight, with one flush and
//! one journal write for all of them. Lookups of the in-memory map are lock
//! free (atomics in lazily allocated pages).
//!
//! Zero-filling a new cluster (instead of tracking which blocks were written)
//! keeps the map one entry per cluster; the pool device's Write Zeroes does
//! the filling, which drives and files can do without moving data.
//! Volume create and delete write a checkpoint rather than a journal record:
//! they are rare, and it keeps the journal to one record shape.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use blockdev::{
    AlignedBuf, BlockDevice, BlockError, BlockOp, Geometry, IoDone, IoFuture, IoRequest,
    check_request,
};
use futures_util::future::join_all;
use parking_lot::Mutex;
use tokio::sync::RwLock;

use crate::superblock::{crc32c, new_uuid, uuid_string};

/// Default allocation unit: 1 MiB, as LVM thin and most arrays use.
pub const DEFAULT_CLUSTER_BYTES: u64 = 1 << 20;
/// Thin volumes one pool can hold.
pub const MAX_VOLUMES: usize = 1024;
/// Longest thin volume name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;
/// Largest number of clusters one thin volume may span (its map's index).
pub const MAX_VOLUME_CLUSTERS: u64 = 1 << 32;

const BLOCK: u64 = 4096;
const BLOCK_USIZE: usize = 4096;
const SB_MAGIC: [u8; 8] = *b"FLPLTHN1";
const CP_MAGIC: [u8; 8] = *b"FLPLTCP1";
const JN_MAGIC: [u8; 8] = *b"FLPLTJN1";
const VERSION: u32 = 1;
const CRC_AT: usize = BLOCK_USIZE - 4;
const VOL_ENTRY: usize = 128;
const VOL_TABLE_BYTES: u64 = (MAX_VOLUMES * VOL_ENTRY) as u64;
const JOURNAL_HDR: usize = 48;
const RECORD_BYTES: usize = 16;
const RECORDS_PER_BLOCK: usize = (CRC_AT - JOURNAL_HDR) / RECORD_BYTES;
/// No physical cluster (in-memory map entry).
const NONE: u32 = u32::MAX;
/// Largest physical cluster count (cluster indexes are u32, NONE excluded).
const MAX_CLUSTERS: u64 = (u32::MAX - 1) as u64;
const MAP_PAGE: u64 = 4096;
const LOCK_SHARDS: usize = 256;
/// Largest single metadata I/O.
const META_IO: u64 = 1 << 20;
/// Clusters freed per commit by one Deallocate.
const UNMAP_CHUNK: usize = 256;
const VC_BITS: u32 = 48;
const VC_MASK: u64 = (1 << VC_BITS) - 1;

#[derive(Debug, thiserror::Error)]
pub enum ThinError {
    #[error(
        "{device}: no thin pool superblock at block 0 (magic is {magic:02x?}); \
         create one with ThinPool::format (`flashpool pool create`)"
    )]
    NotAPool { device: String, magic: [u8; 8] },
    #[error("thin pool format version {0} is not supported (this build reads version 1)")]
    Version(u32),
    #[error("thin pool metadata is corrupt: {0}")]
    Corrupt(String),
    #[error("thin pool: {0}")]
    Config(String),
    #[error(
        "a thin volume named {0:?} already exists in this pool; pick another name or delete it"
    )]
    NameTaken(String),
    #[error("no thin volume named {0:?} in this pool; ThinPool::volumes lists them")]
    NoSuchVolume(String),
    #[error("the pool already holds {0} thin volumes, the most it can; delete one first")]
    TooManyVolumes(usize),
    #[error(
        "a thin pool metadata write failed earlier, so the pool refuses changes; \
         reopen it (ThinPool::open) once the device is healthy"
    )]
    Poisoned,
    #[error("thin pool I/O: {0}")]
    Io(#[from] BlockError),
}

/// Space accounting of a pool. `allocated` counts clusters whose map record
/// is committed; clusters taken by writes still in flight count as free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolUsage {
    pub capacity_bytes: u64,
    pub allocated_bytes: u64,
    pub free_bytes: u64,
    pub cluster_bytes: u64,
    pub total_clusters: u64,
    pub allocated_clusters: u64,
    pub free_clusters: u64,
    pub volumes: usize,
    /// Sum of the thin volumes' virtual sizes (may exceed the capacity).
    pub provisioned_bytes: u64,
    /// Bytes of the pool device used by metadata (superblock, checkpoints, journal).
    pub metadata_bytes: u64,
}

/// One thin volume as [`ThinPool::volumes`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThinInfo {
    pub name: String,
    pub uuid: String,
    pub size_bytes: u64,
    pub block_size: u32,
    /// Allocated clusters times the cluster size.
    pub allocated_bytes: u64,
}

/// Metadata traffic, to see what group commit saves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Journal commits (each one flush plus one journal write).
    pub commits: u64,
    /// Map records committed.
    pub records: u64,
    pub journal_blocks: u64,
    pub checkpoints: u64,
}

// ---------------------------------------------------------------- format

/// Where the areas of a pool lie on its device (the superblock's content).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PoolGeom {
    uuid: [u8; 16],
    cluster_bytes: u64,
    clusters: u64,
    checkpoint_bytes: u64,
    checkpoint_at: [u64; 2],
    journal_at: u64,
    journal_blocks: u64,
    data_at: u64,
    device_bytes: u64,
}

fn checkpoint_bytes(clusters: u64) -> u64 {
    (BLOCK + VOL_TABLE_BYTES + clusters * 8).next_multiple_of(BLOCK)
}

/// 64 bytes of journal per cluster (4 records), 64 KiB to 64 MiB: a
/// checkpoint then costs about as much as the commits that filled the journal.
fn journal_blocks(clusters: u64) -> u64 {
    (clusters * 64 / BLOCK).clamp(16, 16384)
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Seals a 4 KiB metadata block with its CRC32C in the last 4 bytes.
fn seal(b: &mut [u8]) {
    let crc = crc32c(&b[..CRC_AT]);
    put_u32(b, CRC_AT, crc);
}

fn sealed(b: &[u8]) -> bool {
    b.len() >= BLOCK_USIZE && le_u32(b, CRC_AT) == crc32c(&b[..CRC_AT])
}

impl PoolGeom {
    fn plan(device_bytes: u64, cluster_bytes: u64, uuid: [u8; 16]) -> Result<PoolGeom, ThinError> {
        if !cluster_bytes.is_power_of_two() || !(BLOCK..=1 << 30).contains(&cluster_bytes) {
            return Err(ThinError::Config(format!(
                "cluster size {cluster_bytes} bytes is not a power of two from 4 KiB to 1 GiB; \
                 use {DEFAULT_CLUSTER_BYTES}"
            )));
        }
        let layout = |c: u64| {
            let cp = checkpoint_bytes(c);
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

    fn encode(&self) -> AlignedBuf {
        let mut b = zbuf(BLOCK_USIZE);
        b[0..8].copy_from_slice(&SB_MAGIC);
        put_u32(&mut b, 8, VERSION);
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
        seal(&mut b);
        b
    }

    fn decode(b: &[u8], device: &str) -> Result<PoolGeom, ThinError> {
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
        if version != VERSION {
            return Err(ThinError::Version(version));
        }
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
        };
        let max_volumes = le_u32(b, 104);
        // The layout must be exactly what format would have planned.
        let planned = PoolGeom::plan(g.device_bytes, g.cluster_bytes, g.uuid).ok();
        if max_volumes as usize != MAX_VOLUMES || planned != Some(g) {
            return Err(ThinError::Corrupt(format!(
                "{device}: the pool superblock describes an impossible layout: {g:?}"
            )));
        }
        Ok(g)
    }

    fn capacity(&self) -> u64 {
        self.clusters * self.cluster_bytes
    }
}

/// What the volume table stores of one thin volume.
#[derive(Debug, Clone, PartialEq, Eq)]
struct VolMeta {
    name: String,
    uuid: [u8; 16],
    size_bytes: u64,
    block_size: u32,
}

impl VolMeta {
    fn encode(&self, b: &mut [u8]) {
        b[..VOL_ENTRY].fill(0);
        b[0] = 1;
        b[1] = self.name.len() as u8;
        put_u32(b, 4, self.block_size);
        put_u64(b, 8, self.size_bytes);
        b[16..32].copy_from_slice(&self.uuid);
        b[32..32 + self.name.len()].copy_from_slice(self.name.as_bytes());
    }

    fn decode(b: &[u8], slot: usize, cluster_bytes: u64) -> Result<Option<VolMeta>, String> {
        match b[0] {
            0 => return Ok(None),
            1 => {}
            x => return Err(format!("volume slot {slot}: in-use byte {x}")),
        }
        let len = usize::from(b[1]);
        let name = std::str::from_utf8(b.get(32..32 + len).unwrap_or(&[]))
            .map_err(|_| format!("volume slot {slot}: name is not UTF-8"))?;
        let m = VolMeta {
            name: name.to_string(),
            uuid: b[16..32].try_into().expect("16 bytes"),
            size_bytes: le_u64(b, 8),
            block_size: le_u32(b, 4),
        };
        validate_volume(&m.name, m.size_bytes, m.block_size, cluster_bytes, 512)
            .map_err(|e| format!("volume slot {slot}: {e}"))?;
        Ok(Some(m))
    }
}

fn validate_volume(
    name: &str,
    size_bytes: u64,
    block_size: u32,
    cluster_bytes: u64,
    device_block: u32,
) -> Result<(), ThinError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "-_.:".contains(c);
    if name.is_empty() || name.len() > MAX_NAME_BYTES || !name.chars().all(ok_char) {
        return Err(ThinError::Config(format!(
            "thin volume name {name:?} must be 1 to {MAX_NAME_BYTES} characters of \
             A-Z a-z 0-9 - _ . :"
        )));
    }
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

fn owner_code(slot: u16, vc: u64) -> u64 {
    ((u64::from(slot) + 1) << VC_BITS) | vc
}

fn owner_slot_vc(code: u64) -> (u64, u64) {
    ((code >> VC_BITS) - 1, code & VC_MASK)
}

/// One journal record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Record {
    /// Virtual cluster `vc` of volume `slot` now lives in physical cluster `p`.
    Map { slot: u16, vc: u64, p: u32 },
    /// Virtual cluster `vc` of volume `slot` (in `p`) is unallocated again.
    Unmap { slot: u16, vc: u64, p: u32 },
}

impl Record {
    fn encode(&self, b: &mut [u8]) {
        let (kind, slot, vc, p) = match *self {
            Record::Map { slot, vc, p } => (1u8, slot, vc, p),
            Record::Unmap { slot, vc, p } => (2u8, slot, vc, p),
        };
        b[0] = kind;
        b[1] = 0;
        b[2..4].copy_from_slice(&slot.to_le_bytes());
        put_u32(b, 4, p);
        put_u64(b, 8, vc);
    }

    fn decode(b: &[u8]) -> Result<Record, String> {
        let slot = u16::from_le_bytes([b[2], b[3]]);
        let p = le_u32(b, 4);
        let vc = le_u64(b, 8);
        match b[0] {
            1 => Ok(Record::Map { slot, vc, p }),
            2 => Ok(Record::Unmap { slot, vc, p }),
            k => Err(format!("journal record kind {k}")),
        }
    }
}

fn zbuf(len: usize) -> AlignedBuf {
    let mut b = AlignedBuf::new(len);
    b.set_len(len);
    b
}

fn io_err(msg: String) -> BlockError {
    BlockError::Io(std::io::Error::other(msg))
}

fn poisoned_err() -> BlockError {
    io_err(ThinError::Poisoned.to_string())
}

// ---------------------------------------------------------------- memory state

/// Virtual -> physical cluster map of one thin volume: pages of atomics,
/// allocated on first use, so lookups take no lock and an empty volume of
/// any size costs 16 bytes per 4096 clusters.
struct ClusterMap {
    pages: Box<[OnceLock<Box<[AtomicU32]>>]>,
}

impl ClusterMap {
    fn new(vclusters: u64) -> ClusterMap {
        let n = vclusters.div_ceil(MAP_PAGE) as usize;
        ClusterMap {
            pages: (0..n).map(|_| OnceLock::new()).collect(),
        }
    }

    fn get(&self, vc: u64) -> Option<u32> {
        let page = self.pages.get((vc / MAP_PAGE) as usize)?.get()?;
        let p = page[(vc % MAP_PAGE) as usize].load(Ordering::Acquire);
        (p != NONE).then_some(p)
    }

    fn set(&self, vc: u64, p: u32) {
        let page = self.pages[(vc / MAP_PAGE) as usize]
            .get_or_init(|| (0..MAP_PAGE).map(|_| AtomicU32::new(NONE)).collect());
        page[(vc % MAP_PAGE) as usize].store(p, Ordering::Release);
    }

    /// Allocated (virtual, physical) pairs with `lo <= virtual < hi`.
    fn mapped(&self, lo: u64, hi: u64) -> Vec<(u64, u32)> {
        let mut out = Vec::new();
        let mut vc = lo;
        while vc < hi {
            let page_end = ((vc / MAP_PAGE + 1) * MAP_PAGE).min(hi);
            match self
                .pages
                .get((vc / MAP_PAGE) as usize)
                .and_then(|p| p.get())
            {
                None => {}
                Some(page) => {
                    for v in vc..page_end {
                        let p = page[(v % MAP_PAGE) as usize].load(Ordering::Acquire);
                        if p != NONE {
                            out.push((v, p));
                        }
                    }
                }
            }
            vc = page_end;
        }
        out
    }
}

/// One thin volume's in-memory state, shared by its handles and the pool.
struct VolInner {
    slot: u16,
    meta: VolMeta,
    vclusters: u64,
    map: ClusterMap,
    locks: Box<[RwLock<()>]>,
    deleted: AtomicBool,
    /// Committed allocated clusters.
    allocated: AtomicU64,
}

impl VolInner {
    fn new(slot: u16, meta: VolMeta, cluster_bytes: u64) -> VolInner {
        let vclusters = meta.size_bytes.div_ceil(cluster_bytes);
        VolInner {
            slot,
            vclusters,
            map: ClusterMap::new(vclusters),
            locks: (0..LOCK_SHARDS).map(|_| RwLock::new(())).collect(),
            deleted: AtomicBool::new(false),
            allocated: AtomicU64::new(0),
            meta,
        }
    }

    fn lock(&self, vc: u64) -> &RwLock<()> {
        &self.locks[vc as usize % LOCK_SHARDS]
    }

    fn check_live(&self) -> Result<(), BlockError> {
        if self.deleted.load(Ordering::Acquire) {
            Err(io_err(format!(
                "thin volume {} was deleted",
                self.meta.name
            )))
        } else {
            Ok(())
        }
    }
}

/// The committed metadata: exactly what checkpoint plus journal on the
/// device say. Changed only by the task holding the journal lock.
struct State {
    owner: Vec<u64>,
    slots: Vec<Option<Arc<VolInner>>>,
    names: HashMap<String, u16>,
    allocated: u64,
}

impl State {
    fn empty(clusters: u64) -> State {
        State {
            owner: vec![0; clusters as usize],
            slots: vec![None; MAX_VOLUMES],
            names: HashMap::new(),
            allocated: 0,
        }
    }

    fn add_volume(&mut self, vol: Arc<VolInner>) {
        self.names.insert(vol.meta.name.clone(), vol.slot);
        let slot = usize::from(vol.slot);
        self.slots[slot] = Some(vol);
    }

    fn vol(&self, slot: u16) -> Result<&Arc<VolInner>, String> {
        self.slots
            .get(usize::from(slot))
            .and_then(|s| s.as_ref())
            .ok_or_else(|| format!("record names volume slot {slot}, which is not in use"))
    }

    /// Applies one record; returns the physical cluster it freed.
    fn apply(&mut self, r: &Record) -> Result<Option<u32>, String> {
        match *r {
            Record::Map { slot, vc, p } => {
                let vol = self.vol(slot)?;
                let owner = self.owner.get(p as usize).copied();
                if owner != Some(0) || vc >= vol.vclusters || vol.map.get(vc).is_some() {
                    return Err(format!(
                        "{r:?}: cluster owner {owner:?}, volume has {} clusters, maps it to {:?}",
                        vol.vclusters,
                        vol.map.get(vc)
                    ));
                }
                vol.map.set(vc, p);
                vol.allocated.fetch_add(1, Ordering::Relaxed);
                self.owner[p as usize] = owner_code(slot, vc);
                self.allocated += 1;
                Ok(None)
            }
            Record::Unmap { slot, vc, p } => {
                let vol = self.vol(slot)?;
                let owner = self.owner.get(p as usize).copied();
                if owner != Some(owner_code(slot, vc)) || vol.map.get(vc) != Some(p) {
                    return Err(format!(
                        "{r:?}: cluster owner {owner:?}, volume maps it to {:?}",
                        vol.map.get(vc)
                    ));
                }
                vol.map.set(vc, NONE);
                vol.allocated.fetch_sub(1, Ordering::Relaxed);
                self.owner[p as usize] = 0;
                self.allocated -= 1;
                Ok(Some(p))
            }
        }
    }
}

/// Free-cluster bitmap for allocation: a set bit is a cluster that is
/// allocated, being allocated, or freed but not yet durably so.
struct Alloc {
    bits: Vec<u64>,
    total: u64,
    used: u64,
    hint: usize,
}

impl Alloc {
    fn new(total: u64) -> Alloc {
        let words = total.div_ceil(64).max(1) as usize;
        let mut bits = vec![0u64; words];
        // Bits past the end read as taken, so the scan needs no bound check.
        for p in total..words as u64 * 64 {
            bits[(p / 64) as usize] |= 1 << (p % 64);
        }
        Alloc {
            bits,
            total,
            used: 0,
            hint: 0,
        }
    }

    fn mark(&mut self, p: u32) {
        self.bits[p as usize / 64] |= 1 << (p % 64);
        self.used += 1;
    }

    /// Takes `n` free clusters, or none if fewer are free. Scans on from the
    /// last allocation, so a sequential writer gets contiguous clusters.
    fn take(&mut self, n: usize) -> Option<Vec<u32>> {
        if self.total - self.used < n as u64 {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        let mut w = self.hint;
        loop {
            let mut free = !self.bits[w];
            while free != 0 && out.len() < n {
                let b = free.trailing_zeros();
                free &= free - 1;
                self.bits[w] |= 1 << b;
                out.push((w * 64) as u32 + b);
            }
            if out.len() == n {
                break;
            }
            w = (w + 1) % self.bits.len();
        }
        self.hint = w;
        self.used += n as u64;
        Some(out)
    }

    fn put(&mut self, p: u32) {
        let (w, b) = (p as usize / 64, p % 64);
        debug_assert!(self.bits[w] & (1 << b) != 0, "cluster {p} freed twice");
        self.bits[w] &= !(1 << b);
        self.used -= 1;
    }
}

struct Pending {
    records: Vec<Record>,
    /// The batch that records queued now will be committed in.
    open: u64,
}

/// Journal position; its async mutex serialises commits and checkpoints.
struct Journal {
    epoch: u64,
    next_block: u64,
    /// Last batch that is durable.
    durable: u64,
}

#[derive(Default)]
struct Counters {
    commits: AtomicU64,
    records: AtomicU64,
    journal_blocks: AtomicU64,
    checkpoints: AtomicU64,
}

struct PoolInner {
    dev: Arc<dyn BlockDevice>,
    dev_bs: u64,
    geom: PoolGeom,
    state: Mutex<State>,
    alloc: Mutex<Alloc>,
    pending: Mutex<Pending>,
    journal: tokio::sync::Mutex<Journal>,
    poisoned: AtomicBool,
    counters: Counters,
}

// ---------------------------------------------------------------- pool

/// A thin pool on one device. Cheap to clone; all clones are the same pool.
#[derive(Clone)]
pub struct ThinPool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for ThinPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThinPool")
            .field("uuid", &self.uuid())
            .field("device", &self.inner.dev.describe())
            .field("usage", &self.usage())
            .finish()
    }
}

fn check_device(dev: &Arc<dyn BlockDevice>) -> Result<u64, ThinError> {
    let bs = dev.geometry().block_size;
    if bs == 0 || !4096u32.is_multiple_of(bs) {
        return Err(ThinError::Config(format!(
            "{}: {bs}-byte blocks do not divide 4 KiB; a pool needs a device with 512 or \
             4096-byte blocks",
            dev.describe()
        )));
    }
    Ok(u64::from(bs))
}

impl ThinPool {
    /// Makes `dev` an empty pool with clusters of `cluster_bytes` (a power of
    /// two, 4 KiB to 1 GiB; [`DEFAULT_CLUSTER_BYTES`] unless there is a reason).
    /// Whatever the device held is forgotten.
    pub async fn format(
        dev: Arc<dyn BlockDevice>,
        cluster_bytes: u64,
    ) -> Result<ThinPool, ThinError> {
        let dev_bs = check_device(&dev)?;
        let geom = PoolGeom::plan(dev.geometry().size_bytes(), cluster_bytes, new_uuid())?;
        let pool = PoolInner::new(dev, dev_bs, geom, State::empty(geom.clusters), 0, 0);
        // No superblock while the rest is being written: a format cut short
        // must not leave the old pool half overwritten but openable.
        pool.write_meta(0, &zbuf(BLOCK_USIZE), false).await?;
        pool.flush_dev().await?;
        {
            let mut j = pool.journal.lock().await;
            pool.checkpoint(&mut j).await?;
        }
        pool.write_meta(0, &geom.encode(), true).await?;
        pool.flush_dev().await?;
        tracing::info!(
            "formatted thin pool {} on {}: {} clusters of {} KiB",
            uuid_string(&geom.uuid),
            pool.dev.describe(),
            geom.clusters,
            geom.cluster_bytes >> 10
        );
        Ok(ThinPool {
            inner: Arc::new(pool),
        })
    }

    /// Whether `dev` holds a thin pool superblock (valid magic and checksum).
    pub async fn is_pool(dev: &Arc<dyn BlockDevice>) -> bool {
        if check_device(dev).is_err() || dev.geometry().size_bytes() < BLOCK {
            return false;
        }
        let b = read_block0(dev).await;
        b.is_ok_and(|b| b[0..8] == SB_MAGIC && sealed(&b))
    }

    /// Opens the pool on `dev`: reads the newest valid checkpoint, replays
    /// the journal, and writes a fresh checkpoint. Fails with
    /// [`ThinError::NotAPool`] on a device that was never formatted.
    pub async fn open(dev: Arc<dyn BlockDevice>) -> Result<ThinPool, ThinError> {
        let dev_bs = check_device(&dev)?;
        let device = dev.describe();
        let size = dev.geometry().size_bytes();
        if size < BLOCK {
            return Err(ThinError::NotAPool {
                device,
                magic: [0; 8],
            });
        }
        let b0 = read_block0(&dev).await?;
        let geom = PoolGeom::decode(&b0, &device)?;
        if size < geom.device_bytes {
            return Err(ThinError::Config(format!(
                "{device} holds {size} bytes but the pool on it was formatted for {} bytes; \
                 is it the right device?",
                geom.device_bytes
            )));
        }
        let pool = PoolInner::new(dev, dev_bs, geom, State::empty(geom.clusters), 0, 0);
        let (epoch, state) = pool.load_checkpoint().await?;
        *pool.state.lock() = state;
        let next_block = pool.replay(epoch).await?;
        {
            let st = pool.state.lock();
            let mut a = pool.alloc.lock();
            for (p, &code) in st.owner.iter().enumerate() {
                if code != 0 {
                    a.mark(p as u32);
                }
            }
        }
        let mut j = pool.journal.lock().await;
        j.epoch = epoch;
        j.next_block = next_block;
        pool.checkpoint(&mut j).await?;
        drop(j);
        let pool = ThinPool {
            inner: Arc::new(pool),
        };
        let u = pool.usage();
        tracing::info!(
            "opened thin pool {} on {}: {} volumes, {} of {} clusters allocated \
             (checkpoint {epoch} + {next_block} journal blocks)",
            pool.uuid(),
            pool.inner.dev.describe(),
            u.volumes,
            u.allocated_clusters,
            u.total_clusters
        );
        Ok(pool)
    }

    /// Creates a thin volume of `size_bytes` (may exceed the pool's capacity)
    /// with `block_size`-byte blocks (4096 or 512, no smaller than the pool
    /// device's). The name must be unique in the pool.
    pub async fn create_volume(
        &self,
        name: &str,
        size_bytes: u64,
        block_size: u32,
    ) -> Result<ThinVolume, ThinError> {
        let p = &self.inner;
        validate_volume(
            name,
            size_bytes,
            block_size,
            p.geom.cluster_bytes,
            p.dev_bs as u32,
        )?;
        let mut j = p.journal.lock().await;
        p.check_poisoned().map_err(|_| ThinError::Poisoned)?;
        let vol = {
            let mut st = p.state.lock();
            if st.names.contains_key(name) {
                return Err(ThinError::NameTaken(name.to_string()));
            }
            let slot = st
                .slots
                .iter()
                .position(|s| s.is_none())
                .ok_or(ThinError::TooManyVolumes(MAX_VOLUMES))?;
            let meta = VolMeta {
                name: name.to_string(),
                uuid: new_uuid(),
                size_bytes,
                block_size,
            };
            let vol = Arc::new(VolInner::new(slot as u16, meta, p.geom.cluster_bytes));
            st.add_volume(vol.clone());
            vol
        };
        p.checkpoint(&mut j).await?;
        tracing::info!(
            "thin pool {}: created volume {name} ({size_bytes} bytes)",
            self.uuid()
        );
        Ok(ThinVolume {
            pool: p.clone(),
            vol,
        })
    }

    /// A handle on the thin volume called `name`.
    pub fn volume(&self, name: &str) -> Option<ThinVolume> {
        let st = self.inner.state.lock();
        let slot = *st.names.get(name)?;
        let vol = st.slots[usize::from(slot)].clone()?;
        Some(ThinVolume {
            pool: self.inner.clone(),
            vol,
        })
    }

    /// All thin volumes, by name.
    pub fn volumes(&self) -> Vec<ThinInfo> {
        let cb = self.inner.geom.cluster_bytes;
        let st = self.inner.state.lock();
        let mut out: Vec<ThinInfo> = st.slots.iter().flatten().map(|v| info(v, cb)).collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Deletes the thin volume `name` and frees its clusters. I/O in flight
    /// on it finishes first; later I/O through its handles fails.
    pub async fn delete_volume(&self, name: &str) -> Result<(), ThinError> {
        let p = &self.inner;
        let vol = self
            .volume(name)
            .ok_or_else(|| ThinError::NoSuchVolume(name.to_string()))?
            .vol;
        p.check_poisoned().map_err(|_| ThinError::Poisoned)?;
        vol.deleted.store(true, Ordering::Release);
        // Wait out the I/O that holds a cluster lock (in ascending order, as
        // Deallocate takes several).
        let mut guards = Vec::with_capacity(LOCK_SHARDS);
        for l in vol.locks.iter() {
            guards.push(l.write().await);
        }
        let mut j = p.journal.lock().await;
        if let Err(e) = p.check_poisoned() {
            vol.deleted.store(false, Ordering::Release);
            return Err(e.into());
        }
        let freed: Vec<u32> = {
            let mut st = p.state.lock();
            // A delete that raced this one may have removed it (and a create
            // may have reused the slot or the name) while this one waited.
            let same = st.slots[usize::from(vol.slot)]
                .as_ref()
                .is_some_and(|v| Arc::ptr_eq(v, &vol));
            if !same {
                return Err(ThinError::NoSuchVolume(name.to_string()));
            }
            let freed: Vec<u32> = vol
                .map
                .mapped(0, vol.vclusters)
                .into_iter()
                .map(|(_, c)| c)
                .collect();
            for &c in &freed {
                st.owner[c as usize] = 0;
            }
            st.allocated -= freed.len() as u64;
            st.names.remove(name);
            st.slots[usize::from(vol.slot)] = None;
            freed
        };
        p.checkpoint(&mut j).await?;
        {
            let mut a = p.alloc.lock();
            for &c in &freed {
                a.put(c);
            }
        }
        drop(j);
        drop(guards);
        tracing::info!(
            "thin pool {}: deleted volume {name}, freed {} clusters",
            self.uuid(),
            freed.len()
        );
        Ok(())
    }

    pub fn usage(&self) -> PoolUsage {
        let g = &self.inner.geom;
        let st = self.inner.state.lock();
        let vols: Vec<_> = st.slots.iter().flatten().collect();
        PoolUsage {
            capacity_bytes: g.capacity(),
            allocated_bytes: st.allocated * g.cluster_bytes,
            free_bytes: (g.clusters - st.allocated) * g.cluster_bytes,
            cluster_bytes: g.cluster_bytes,
            total_clusters: g.clusters,
            allocated_clusters: st.allocated,
            free_clusters: g.clusters - st.allocated,
            volumes: vols.len(),
            provisioned_bytes: vols.iter().map(|v| v.meta.size_bytes).sum(),
            metadata_bytes: g.data_at,
        }
    }

    pub fn stats(&self) -> PoolStats {
        let c = &self.inner.counters;
        PoolStats {
            commits: c.commits.load(Ordering::Relaxed),
            records: c.records.load(Ordering::Relaxed),
            journal_blocks: c.journal_blocks.load(Ordering::Relaxed),
            checkpoints: c.checkpoints.load(Ordering::Relaxed),
        }
    }

    pub fn uuid(&self) -> String {
        uuid_string(&self.inner.geom.uuid)
    }

    pub fn cluster_bytes(&self) -> u64 {
        self.inner.geom.cluster_bytes
    }

    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.inner.dev
    }

    /// Writes a checkpoint and flushes the device, so the next open replays
    /// nothing. The pool stays usable; the device is not shut down (its owner
    /// does that, e.g. `Volume::close` then `shutdown`).
    pub async fn close(&self) -> Result<(), ThinError> {
        let p = &self.inner;
        let mut j = p.journal.lock().await;
        p.check_poisoned().map_err(|_| ThinError::Poisoned)?;
        p.checkpoint(&mut j).await?;
        Ok(())
    }

    /// Cross-checks the in-memory metadata: every map entry owned by its
    /// volume in the owner table and the other way round, no physical cluster
    /// in two maps, counts and the free bitmap agreeing. Call it with no I/O
    /// in flight (a write allocating a cluster holds one the bitmap counts).
    pub fn check(&self) -> Result<(), String> {
        let g = &self.inner.geom;
        let st = self.inner.state.lock();
        let a = self.inner.alloc.lock();
        let mut seen = vec![false; g.clusters as usize];
        let mut total = 0u64;
        for (slot, vol) in st.slots.iter().enumerate() {
            let Some(vol) = vol else { continue };
            if st.names.get(&vol.meta.name) != Some(&(slot as u16)) {
                return Err(format!("volume {} not in the name index", vol.meta.name));
            }
            let mapped = vol.map.mapped(0, vol.vclusters);
            for &(vc, p) in &mapped {
                if std::mem::replace(&mut seen[p as usize], true) {
                    return Err(format!("cluster {p} is in two maps"));
                }
                if st.owner[p as usize] != owner_code(slot as u16, vc) {
                    return Err(format!(
                        "volume {} maps {vc} to {p}, whose owner entry is {:#x}",
                        vol.meta.name, st.owner[p as usize]
                    ));
                }
            }
            let n = mapped.len() as u64;
            if vol.allocated.load(Ordering::Relaxed) != n {
                return Err(format!(
                    "volume {} counts {} clusters but maps {n}",
                    vol.meta.name,
                    vol.allocated.load(Ordering::Relaxed)
                ));
            }
            total += n;
        }
        for (p, &code) in st.owner.iter().enumerate() {
            if (code != 0) != seen[p] {
                return Err(format!("cluster {p}: owner entry {code:#x} but in no map"));
            }
            let taken = a.bits[p / 64] & (1 << (p % 64)) != 0;
            if taken != seen[p] {
                return Err(format!(
                    "cluster {p}: free bitmap says taken = {taken}, maps say {}",
                    seen[p]
                ));
            }
        }
        if total != st.allocated || a.used != total {
            return Err(format!(
                "maps hold {total} clusters, pool counts {}, bitmap {}",
                st.allocated, a.used
            ));
        }
        Ok(())
    }
}

fn info(v: &VolInner, cluster_bytes: u64) -> ThinInfo {
    ThinInfo {
        name: v.meta.name.clone(),
        uuid: uuid_string(&v.meta.uuid),
        size_bytes: v.meta.size_bytes,
        block_size: v.meta.block_size,
        allocated_bytes: v.allocated.load(Ordering::Relaxed) * cluster_bytes,
    }
}

async fn read_block0(dev: &Arc<dyn BlockDevice>) -> Result<AlignedBuf, BlockError> {
    let bs = u64::from(dev.geometry().block_size);
    let done = dev
        .submit(IoRequest {
            op: BlockOp::Read,
            lba: 0,
            blocks: (BLOCK / bs) as u32,
            buf: zbuf(BLOCK_USIZE),
        })
        .await;
    done.result.map(|()| done.buf)
}

impl PoolInner {
    fn new(
        dev: Arc<dyn BlockDevice>,
        dev_bs: u64,
        geom: PoolGeom,
        state: State,
        epoch: u64,
        next_block: u64,
    ) -> PoolInner {
        PoolInner {
            dev,
            dev_bs,
            geom,
            state: Mutex::new(state),
            alloc: Mutex::new(Alloc::new(geom.clusters)),
            pending: Mutex::new(Pending {
                records: Vec::new(),
                open: 1,
            }),
            journal: tokio::sync::Mutex::new(Journal {
                epoch,
                next_block,
                durable: 0,
            }),
            poisoned: AtomicBool::new(false),
            counters: Counters::default(),
        }
    }

    fn check_poisoned(&self) -> Result<(), BlockError> {
        if self.poisoned.load(Ordering::Acquire) {
            Err(poisoned_err())
        } else {
            Ok(())
        }
    }

    fn poison(&self, why: &str) {
        if !self.poisoned.swap(true, Ordering::AcqRel) {
            tracing::error!(
                "thin pool {}: metadata write failed ({why}); refusing writes until reopened",
                uuid_string(&self.geom.uuid)
            );
        }
    }

    fn cluster_at(&self, p: u32) -> u64 {
        self.geom.data_at + u64::from(p) * self.geom.cluster_bytes
    }

    async fn io(
        &self,
        op: BlockOp,
        byte_off: u64,
        bytes: u64,
        buf: AlignedBuf,
    ) -> (AlignedBuf, Result<(), BlockError>) {
        let IoDone { buf, result } = self
            .dev
            .submit(IoRequest {
                op,
                lba: byte_off / self.dev_bs,
                blocks: (bytes / self.dev_bs) as u32,
                buf,
            })
            .await;
        (buf, result)
    }

    async fn flush_dev(&self) -> Result<(), BlockError> {
        self.io(BlockOp::Flush, 0, 0, AlignedBuf::new(0)).await.1
    }

    /// Writes metadata bytes at `at`, in pieces of at most [`META_IO`].
    async fn write_meta(&self, at: u64, data: &[u8], fua: bool) -> Result<(), BlockError> {
        let res = join_all(data.chunks(META_IO as usize).enumerate().map(|(i, c)| {
            let mut b = zbuf(c.len());
            b.copy_from_slice(c);
            let off = at + i as u64 * META_IO;
            async move {
                self.io(BlockOp::Write { fua }, off, c.len() as u64, b)
                    .await
                    .1
            }
        }))
        .await;
        res.into_iter().collect()
    }

    async fn read_meta(&self, at: u64, len: u64) -> Result<Vec<u8>, BlockError> {
        let pieces = len.div_ceil(META_IO);
        let res = join_all((0..pieces).map(|i| {
            let n = META_IO.min(len - i * META_IO);
            self.io(BlockOp::Read, at + i * META_IO, n, zbuf(n as usize))
        }))
        .await;
        let mut out = Vec::with_capacity(len as usize);
        for (b, r) in res {
            r?;
            out.extend_from_slice(&b);
        }
        Ok(out)
    }

    // ---- checkpoints

    fn encode_checkpoint(&self, epoch: u64) -> Vec<u8> {
        let g = &self.geom;
        let mut b = vec![0u8; g.checkpoint_bytes as usize];
        let st = self.state.lock();
        let mut nvol = 0u32;
        for (slot, v) in st.slots.iter().enumerate() {
            if let Some(v) = v {
                let at = BLOCK_USIZE + slot * VOL_ENTRY;
                v.meta.encode(&mut b[at..at + VOL_ENTRY]);
                nvol += 1;
            }
        }
        let owners_at = (BLOCK + VOL_TABLE_BYTES) as usize;
        for (i, &code) in st.owner.iter().enumerate() {
            put_u64(&mut b, owners_at + i * 8, code);
        }
        drop(st);
        let body_crc = crc32c(&b[BLOCK_USIZE..]);
        b[0..8].copy_from_slice(&CP_MAGIC);
        b[8..24].copy_from_slice(&g.uuid);
        put_u64(&mut b, 24, epoch);
        put_u64(&mut b, 32, g.clusters);
        put_u32(&mut b, 40, body_crc);
        put_u32(&mut b, 44, nvol);
        seal(&mut b[..BLOCK_USIZE]);
        b
    }

    /// Writes the committed state as checkpoint `epoch + 1` into the copy not
    /// holding the current one, flushes, and restarts the journal. The caller
    /// holds the journal lock. A failure poisons the pool.
    async fn checkpoint(&self, j: &mut Journal) -> Result<(), BlockError> {
        let epoch = j.epoch + 1;
        let b = self.encode_checkpoint(epoch);
        let at = self.geom.checkpoint_at[(epoch % 2) as usize];
        let r = match self.write_meta(at, &b, false).await {
            Ok(()) => self.flush_dev().await,
            Err(e) => Err(e),
        };
        if let Err(e) = r {
            self.poison(&format!("checkpoint: {e}"));
            return Err(e);
        }
        j.epoch = epoch;
        j.next_block = 0;
        self.counters.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The epoch of a checkpoint header, if it is a valid one of this pool's.
    fn checkpoint_epoch(&self, b: &[u8]) -> Option<u64> {
        (b[0..8] == CP_MAGIC
            && sealed(b)
            && b[8..24] == self.geom.uuid
            && le_u64(b, 32) == self.geom.clusters)
            .then(|| le_u64(b, 24))
    }

    /// Reads both checkpoint copies and builds the state of the newest valid one.
    async fn load_checkpoint(&self) -> Result<(u64, State), ThinError> {
        let g = &self.geom;
        let mut headers = Vec::new();
        for i in 0..2 {
            let h = self.read_meta(g.checkpoint_at[i], BLOCK).await?;
            if let Some(e) = self.checkpoint_epoch(&h) {
                headers.push((e, i, le_u32(&h, 40)));
            }
        }
        headers.sort_unstable_by_key(|h| std::cmp::Reverse(h.0));
        let mut why = Vec::new();
        for (epoch, i, body_crc) in headers {
            let b = self
                .read_meta(g.checkpoint_at[i], g.checkpoint_bytes)
                .await?;
            if crc32c(&b[BLOCK_USIZE..]) != body_crc {
                tracing::warn!(
                    "thin pool {}: checkpoint copy {i} (epoch {epoch}) is torn; using the other",
                    uuid_string(&g.uuid)
                );
                why.push(format!("copy {i} (epoch {epoch}) fails its body checksum"));
                continue;
            }
            return self
                .decode_state(&b)
                .map(|st| (epoch, st))
                .map_err(|e| ThinError::Corrupt(format!("checkpoint epoch {epoch}: {e}")));
        }
        if why.is_empty() {
            why.push("neither copy has a valid header".into());
        }
        Err(ThinError::Corrupt(format!(
            "no valid metadata checkpoint: {}",
            why.join("; ")
        )))
    }

    fn decode_state(&self, b: &[u8]) -> Result<State, String> {
        let g = &self.geom;
        let mut st = State::empty(g.clusters);
        for slot in 0..MAX_VOLUMES {
            let at = BLOCK_USIZE + slot * VOL_ENTRY;
            if let Some(meta) = VolMeta::decode(&b[at..at + VOL_ENTRY], slot, g.cluster_bytes)? {
                if st.names.contains_key(&meta.name) {
                    return Err(format!("two volumes are named {:?}", meta.name));
                }
                st.add_volume(Arc::new(VolInner::new(slot as u16, meta, g.cluster_bytes)));
            }
        }
        let owners_at = (BLOCK + VOL_TABLE_BYTES) as usize;
        for p in 0..g.clusters as usize {
            let code = le_u64(b, owners_at + p * 8);
            if code == 0 {
                continue;
            }
            let (slot, vc) = owner_slot_vc(code);
            let slot = u16::try_from(slot)
                .map_err(|_| format!("cluster {p}: owner entry {code:#x} names no slot"))?;
            st.apply(&Record::Map {
                slot,
                vc,
                p: p as u32,
            })
            .map_err(|e| format!("owner table: {e}"))?;
        }
        Ok(st)
    }

    // ---- journal

    /// Replays the journal blocks of `epoch`; returns how many there were.
    async fn replay(&self, epoch: u64) -> Result<u64, ThinError> {
        let g = &self.geom;
        let per_read = META_IO / BLOCK;
        let mut block = 0u64;
        let mut records = 0u64;
        'outer: while block < g.journal_blocks {
            let n = per_read.min(g.journal_blocks - block);
            let b = self
                .read_meta(g.journal_at + block * BLOCK, n * BLOCK)
                .await?;
            for blk in b.chunks(BLOCK_USIZE) {
                let valid = blk[0..8] == JN_MAGIC
                    && sealed(blk)
                    && blk[8..24] == g.uuid
                    && le_u64(blk, 24) == epoch
                    && le_u64(blk, 32) == block;
                if !valid {
                    break 'outer;
                }
                let count = le_u32(blk, 40) as usize;
                if count > RECORDS_PER_BLOCK {
                    return Err(ThinError::Corrupt(format!(
                        "journal block {block} holds {count} records"
                    )));
                }
                let mut st = self.state.lock();
                for i in 0..count {
                    let at = JOURNAL_HDR + i * RECORD_BYTES;
                    // Freed clusters need no bookkeeping: the free bitmap is
                    // built from the owner table after replay.
                    Record::decode(&blk[at..at + RECORD_BYTES])
                        .and_then(|r| st.apply(&r))
                        .map_err(|e| {
                            ThinError::Corrupt(format!("journal block {block} record {i}: {e}"))
                        })?;
                }
                records += count as u64;
                block += 1;
            }
        }
        tracing::debug!(
            "thin pool {}: replayed {block} journal blocks, {records} records",
            uuid_string(&g.uuid)
        );
        Ok(block)
    }

    /// Makes `records` durable (group commit): queues them, and the first
    /// task to get the journal lock writes everything queued so far. On
    /// return the records are applied to the in-memory state.
    async fn commit(&self, records: Vec<Record>) -> Result<(), BlockError> {
        let mine = {
            let mut p = self.pending.lock();
            p.records.extend(records);
            p.open
        };
        let mut j = self.journal.lock().await;
        if j.durable >= mine {
            return Ok(());
        }
        self.check_poisoned()?;
        let (batch, recs) = {
            let mut p = self.pending.lock();
            let b = p.open;
            p.open += 1;
            (b, std::mem::take(&mut p.records))
        };
        match self.write_batch(&mut j, &recs).await {
            Ok(()) => {
                j.durable = batch;
                Ok(())
            }
            Err(e) => {
                self.poison(&format!("journal: {e}"));
                Err(e)
            }
        }
    }

    async fn write_batch(&self, j: &mut Journal, recs: &[Record]) -> Result<(), BlockError> {
        if recs.is_empty() {
            return Ok(());
        }
        // The data of newly mapped clusters must be durable before their record.
        if recs.iter().any(|r| matches!(r, Record::Map { .. })) {
            self.flush_dev().await?;
        }
        let g = &self.geom;
        let mut rest = recs;
        while !rest.is_empty() {
            if j.next_block >= g.journal_blocks {
                self.checkpoint(j).await?;
            }
            let room = (g.journal_blocks - j.next_block).min(META_IO / BLOCK) as usize;
            let n = rest.len().min(room * RECORDS_PER_BLOCK);
            let (now, later) = rest.split_at(n);
            let blocks = now.len().div_ceil(RECORDS_PER_BLOCK);
            let mut b = zbuf(blocks * BLOCK_USIZE);
            for (i, (blk, chunk)) in b
                .chunks_mut(BLOCK_USIZE)
                .zip(now.chunks(RECORDS_PER_BLOCK))
                .enumerate()
            {
                blk[0..8].copy_from_slice(&JN_MAGIC);
                blk[8..24].copy_from_slice(&g.uuid);
                put_u64(blk, 24, j.epoch);
                put_u64(blk, 32, j.next_block + i as u64);
                put_u32(blk, 40, chunk.len() as u32);
                for (k, r) in chunk.iter().enumerate() {
                    let at = JOURNAL_HDR + k * RECORD_BYTES;
                    r.encode(&mut blk[at..at + RECORD_BYTES]);
                }
                seal(blk);
            }
            let at = g.journal_at + j.next_block * BLOCK;
            let len = b.len() as u64;
            let (_, r) = self.io(BlockOp::Write { fua: true }, at, len, b).await;
            r?;
            j.next_block += blocks as u64;
            self.apply_durable(now)?;
            self.counters.commits.fetch_add(1, Ordering::Relaxed);
            self.counters
                .records
                .fetch_add(now.len() as u64, Ordering::Relaxed);
            self.counters
                .journal_blocks
                .fetch_add(blocks as u64, Ordering::Relaxed);
            rest = later;
        }
        Ok(())
    }

    /// Applies records that are durable; clusters they free become allocatable.
    fn apply_durable(&self, recs: &[Record]) -> Result<(), BlockError> {
        let mut freed = Vec::new();
        {
            let mut st = self.state.lock();
            for r in recs {
                match st.apply(r) {
                    Ok(Some(p)) => freed.push(p),
                    Ok(None) => {}
                    Err(e) => {
                        // A bug, not bad input: memory and journal now disagree.
                        self.poison(&format!("internal: {e}"));
                        return Err(io_err(format!("thin pool internal error: {e}")));
                    }
                }
            }
        }
        if !freed.is_empty() {
            let mut a = self.alloc.lock();
            for p in freed {
                a.put(p);
            }
        }
        Ok(())
    }

    fn reserve(&self, n: usize) -> Result<Vec<u32>, BlockError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        self.alloc.lock().take(n).ok_or(BlockError::NoSpace)
    }

    fn release(&self, clusters: &[u32]) {
        if clusters.is_empty() {
            return;
        }
        let mut a = self.alloc.lock();
        for &p in clusters {
            a.put(p);
        }
    }
}

// ---------------------------------------------------------------- thin volume

/// A thin volume: a [`BlockDevice`] whose clusters come from its pool on
/// first write. Cheap to clone.
#[derive(Clone)]
pub struct ThinVolume {
    pool: Arc<PoolInner>,
    vol: Arc<VolInner>,
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
struct Piece {
    vc: u64,
    /// Byte offset in the cluster.
    off: u64,
    len: u64,
    /// Byte offset in the request's buffer.
    at: usize,
}

/// The one piece of a request that lies within a cluster (the common case,
/// which then needs no allocation).
fn single_piece(cluster_bytes: u64, start: u64, end: u64) -> Option<Piece> {
    (start / cluster_bytes == (end - 1) / cluster_bytes).then_some(Piece {
        vc: start / cluster_bytes,
        off: start % cluster_bytes,
        len: end - start,
        at: 0,
    })
}

fn pieces(cluster_bytes: u64, start: u64, end: u64) -> Vec<Piece> {
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
            .mapped(0, self.vol.vclusters)
            .into_iter()
            .map(|(v, p)| (v, u64::from(p)))
            .collect()
    }

    fn bs(&self) -> u64 {
        u64::from(self.vol.meta.block_size)
    }
}

impl BlockDevice for ThinVolume {
    fn geometry(&self) -> Geometry {
        Geometry {
            block_size: self.vol.meta.block_size,
            num_blocks: self.vol.meta.size_bytes / self.bs(),
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
struct ThinIo {
    pool: Arc<PoolInner>,
    vol: Arc<VolInner>,
}

impl ThinIo {
    async fn read(&self, start: u64, end: u64, mut buf: AlignedBuf) -> IoDone {
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
    async fn read_piece(
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

    async fn write(&self, start: u64, end: u64, buf: AlignedBuf, fua: bool) -> IoDone {
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
    async fn write_piece(
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
    async fn zero(&self, start: u64, end: u64) -> Result<(), BlockError> {
        self.pool.check_poisoned()?;
        self.vol.check_live()?;
        let cb = self.pool.geom.cluster_bytes;
        let size = self.vol.meta.size_bytes;
        // A cluster is covered whole when the range covers its readable part.
        let first_full = start.div_ceil(cb);
        let end_full = if end == size {
            self.vol.vclusters
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

    async fn zero_piece(&self, p: Piece) -> Result<(), BlockError> {
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

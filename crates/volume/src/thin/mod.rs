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
//! | block 0 | pool superblock: magic `FLPLTHN1`, version (1; 2 for a compressed pool, which builds before compression refuse), pool uuid, cluster bytes, cluster count, where each area below starts, the compression (offset 108: 0 none, 1 LZ4, 2 zstd). Written once, at format. |
//! | checkpoint A, B | two copies of the whole metadata: a 4 KiB header (magic `FLPLTCP1`, pool uuid, epoch, CRC of the body), then a table of [`MAX_VOLUMES`] volume entries (name, uuid, size, block size, snapshot and hidden flags, parent slot, creation time; 128 bytes each), then the *owner table*: one u64 per physical cluster, 0 for free, `u64::MAX` for a pack cluster, else `(slot + 1) << 48 \| virtual cluster`; a compressed pool then has one such code per 4 KiB block of every cluster (see `pack.rs`). The copy for epoch `e` is at `e % 2`. |
//! | journal | 4 KiB blocks (magic `FLPLTJN1`, pool uuid, epoch, block index, records) of 16-byte map records: `Map`/`Unmap` (slot, virtual cluster, physical cluster) and, compressed, `PMap`/`PUnmap` (slot, virtual cluster, first block and block count of a chunk). |
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
//! # Snapshots and clones
//!
//! Volumes form a tree (`tree.rs`): a snapshot takes its volume's clusters
//! and becomes its parent; a clone is a volume whose parent is a snapshot;
//! unwritten clusters are read from the nearest ancestor that has them and
//! copied on first write. Each physical cluster keeps exactly one owner, so
//! the owner table and its crash safety are unchanged; snapshot, clone,
//! revert and delete are each one checkpoint.
//!
//! # Compression
//!
//! A pool formatted with [`Compression::Lz4`] or [`Compression::Zstd`]
//! compresses each cluster (a *chunk*) whole and packs it at 4 KiB
//! granularity into shared *pack clusters*; a chunk that would not save a
//! block stays raw, in a cluster of its own, written in place as above.
//! Any other write builds the new chunk and stores it in a new place, and
//! one journal record moves the cluster there (`packed_io.rs`); compaction
//! empties sparse pack clusters in the background (`compact.rs`).
//!
//! Zero-filling a new cluster (instead of tracking which blocks were written)
//! keeps the map one entry per cluster; the pool device's Write Zeroes does
//! the filling, which drives and files can do without moving data.
//! Volume create and delete write a checkpoint rather than a journal record:
//! they are rare, and it keeps the journal to one record shape.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use blockdev::{AlignedBuf, BlockDevice, BlockError, BlockOp, IoRequest};

use crate::superblock::{new_uuid, uuid_string};

mod check;
mod compact;
mod extent;
mod format;
mod io;
mod le;
mod meta_journal;
mod pack;
mod packed_io;
mod state;
mod tree;

pub use check::PoolCheck;
pub use extent::{ExtentInfo, ExtentLabel, MAX_EXTENTS};
use format::{PoolGeom, sealed, validate_volume, zbuf};
pub use io::ThinVolume;
pub use pack::{Compression, MAX_PACKED_CLUSTER, MIN_PACKED_CLUSTER};
use state::{PoolInner, State, VolInner};

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
/// Largest physical cluster count (cluster indexes are u32, the top one
/// kept out).
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
    #[error("thin pool format version {0} is not supported (this build reads versions 1 and 2)")]
    Version(u32),
    #[error("thin pool metadata is corrupt: {0}")]
    Corrupt(String),
    #[error("thin pool: {0}")]
    Config(String),
    #[error(
        "a thin volume named {} already exists in this pool; pick another name or delete it",
        shown(.0)
    )]
    NameTaken(String),
    #[error(
        "no thin volume named {} in this pool; ThinPool::volumes lists them",
        shown(.0)
    )]
    NoSuchVolume(String),
    #[error("the pool already holds {0} thin volumes, the most it can; delete one first")]
    TooManyVolumes(usize),
    #[error(
        "thin volume {} is {size} bytes; {asked} would shrink it, which loses its end: \
         shrinking needs force, and only an end that holds no data is cut",
        shown(.name)
    )]
    Shrink { name: String, size: u64, asked: u64 },
    #[error(
        "thin volume {} is {size} bytes; shrinking it to {asked} would cut cluster {cluster}, \
         which holds data (deallocate the end first, e.g. blkdiscard, or shrink less); \
         nothing was changed",
        shown(.name)
    )]
    ShrinkInUse {
        name: String,
        size: u64,
        asked: u64,
        cluster: u64,
    },
    #[error(
        "a thin pool metadata write failed earlier, so the pool refuses changes; \
         reopen it (ThinPool::open) once the device is healthy"
    )]
    Poisoned,
    #[error(
        "the pool's metadata names extent {0}, which none of the devices given holds; \
         assemble the volume it lies on first (the pool is not opened without it)"
    )]
    MissingExtent(String),
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
    /// Thin volumes (clones included, snapshots not).
    pub volumes: usize,
    pub snapshots: usize,
    /// Deleted snapshots kept while two or more clones read through them.
    pub hidden_snapshots: usize,
    /// Sum of the thin volumes' virtual sizes (may exceed the capacity).
    pub provisioned_bytes: u64,
    /// Bytes used by metadata (superblock, checkpoints, journal; extents' headers and parts).
    pub metadata_bytes: u64,
    /// What the volumes' and snapshots' chunks hold, uncompressed (their
    /// clusters times the cluster size).
    pub logical_bytes: u64,
    /// What those chunks take on the device: raw clusters whole, compressed
    /// chunks their 4 KiB blocks. Equal to `logical_bytes` without compression.
    pub stored_bytes: u64,
    /// Clusters that hold compressed chunks (counted in `allocated_clusters`).
    pub pack_clusters: u64,
    pub compression: Compression,
}

/// What [`ThinPool::compact`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactOptions {
    /// Pack clusters at most this full (percent of their blocks) are
    /// emptied: their chunks move to fuller ones or a new one.
    pub below_fill_pct: u8,
    /// Bytes moved per second at most (0: no limit).
    pub rate_bytes_per_sec: u64,
}

impl Default for CompactOptions {
    fn default() -> Self {
        CompactOptions {
            below_fill_pct: 50,
            rate_bytes_per_sec: 64 << 20,
        }
    }
}

/// What one compaction pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactReport {
    pub chunks_moved: u64,
    pub bytes_moved: u64,
    /// Pack clusters given back to the pool.
    pub clusters_freed: u64,
}

/// One thin volume as [`ThinPool::volumes`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThinInfo {
    pub name: String,
    pub uuid: String,
    pub size_bytes: u64,
    pub block_size: u32,
    /// Its own clusters times the cluster size (for a snapshot: what it
    /// holds of the volume as it was; its clones may read them too).
    pub allocated_bytes: u64,
    /// Read-only point-in-time image of a volume.
    pub snapshot: bool,
    /// The snapshot this one was taken after (a volume, a snapshot) or
    /// cloned from (a clone): the nearest one that was not deleted.
    pub parent: Option<String>,
    /// Bytes this one reads from its snapshots, shared with them (clusters
    /// it has not written since).
    pub shared_bytes: u64,
    /// When it was made (Unix seconds; 0 in pools made before snapshots).
    pub created: u64,
    /// What its own clusters take on the device (compressed chunks their
    /// 4 KiB blocks); `allocated_bytes` without compression.
    pub stored_bytes: u64,
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
        Self::format_compressed(dev, cluster_bytes, Compression::None).await
    }

    /// [`ThinPool::format`] for a pool whose chunks (clusters of 16 KiB to
    /// 1 MiB) are stored compressed with `compression` where that saves a
    /// 4 KiB block, packed at 4 KiB granularity (see `pack.rs`).
    pub async fn format_compressed(
        dev: Arc<dyn BlockDevice>,
        cluster_bytes: u64,
        compression: Compression,
    ) -> Result<ThinPool, ThinError> {
        let dev_bs = check_device(&dev)?;
        let size = dev.geometry().size_bytes();
        let geom = PoolGeom::plan(size, cluster_bytes, new_uuid(), compression)?;
        let empty = State::empty(geom.clusters, geom.pack_blocks);
        let pool = PoolInner::new(dev, dev_bs, geom, empty, 0, 0);
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
        Self::open_with_extents(dev, &[]).await
    }

    /// [`ThinPool::open`] for a pool that may have grown: `extents` are
    /// devices that may hold its extents (others are ignored; an extent of
    /// this pool that its metadata does not name, left by an
    /// [`ThinPool::add_extent`] cut short, is ignored too). Fails with
    /// [`ThinError::MissingExtent`] when one it names is not among them.
    pub async fn open_with_extents(
        dev: Arc<dyn BlockDevice>,
        extents: &[Arc<dyn BlockDevice>],
    ) -> Result<ThinPool, ThinError> {
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
        let mut found = Vec::new();
        for x in extents {
            if let Some(h) = extent::read_header(x).await
                && h.pool == geom.uuid
            {
                found.push((h, x.clone()));
            }
        }
        let empty = State::empty(geom.clusters, geom.pack_blocks);
        let pool = PoolInner::new(dev, dev_bs, geom, empty, 0, 0);
        let (epoch, mut state, exts) = pool.load_checkpoint(&found).await?;
        let total = state.owner.len() as u64;
        pool.ext.store(Arc::new(exts));
        let next_block = pool.replay(epoch, &mut state).await?;
        *pool.packer.lock() = state.pack.clone();
        *pool.state.lock() = state;
        {
            let st = pool.state.lock();
            let mut a = pool.alloc.lock();
            *a = state::Alloc::new(total);
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
        // A crash between a delete and the reclaim it starts leaves a
        // deleted snapshot that nothing reads through any more.
        pool.reclaim_hidden().await?;
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
            let (size, cb) = ((size_bytes, block_size), p.geom.cluster_bytes);
            tree::new_entry(&mut st, name, size, false, None, cb)?
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

    /// Grows thin volume `name` to `size_bytes`: instant (its size is a
    /// number in the volume table, the map needs nothing), and durable
    /// before this returns. The same size changes nothing; a smaller one is
    /// refused. Handles see the new size at once (`geometry`).
    pub async fn grow_volume(&self, name: &str, size_bytes: u64) -> Result<(), ThinError> {
        let p = &self.inner;
        let vol = self
            .volume(name)
            .ok_or_else(|| ThinError::NoSuchVolume(name.to_string()))?
            .vol;
        validate_volume(
            name,
            size_bytes,
            vol.meta.block_size,
            p.geom.cluster_bytes,
            p.dev_bs as u32,
        )?;
        if vol.meta.snapshot {
            return Err(ThinError::Config(format!(
                "{} is a snapshot, which keeps the size it was taken at",
                shown(name)
            )));
        }
        let mut j = p.journal.lock().await;
        p.check_poisoned().map_err(|_| ThinError::Poisoned)?;
        vol.check_live()?;
        let old = vol.size();
        if size_bytes < old {
            return Err(ThinError::Shrink {
                name: name.to_string(),
                size: old,
                asked: size_bytes,
            });
        }
        if size_bytes == old {
            return Ok(());
        }
        vol.set_size(size_bytes);
        if let Err(e) = p.checkpoint(&mut j).await {
            // nobody was told the new size yet: the old one stands
            vol.set_size(old);
            return Err(e.into());
        }
        tracing::info!(
            "thin pool {}: grew volume {name} from {old} to {size_bytes} bytes",
            self.uuid()
        );
        Ok(())
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
        let mut out: Vec<ThinInfo> = st
            .slots
            .iter()
            .flatten()
            .filter(|v| !v.hidden.load(Ordering::Acquire))
            .map(|v| info(v, cb))
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    pub fn usage(&self) -> PoolUsage {
        let st = self.inner.state.lock();
        self.usage_of(&st)
    }

    fn usage_of(&self, st: &State) -> PoolUsage {
        let g = &self.inner.geom;
        let total = st.owner.len() as u64;
        let ext_meta: u64 = self.inner.ext.load().iter().map(|e| e.data_at).sum();
        let all: Vec<_> = st.slots.iter().flatten().collect();
        let vols: Vec<_> = all.iter().filter(|v| !v.meta.snapshot).collect();
        let visible = |v: &&&Arc<VolInner>| !v.hidden.load(Ordering::Acquire);
        PoolUsage {
            capacity_bytes: total * g.cluster_bytes,
            allocated_bytes: st.allocated * g.cluster_bytes,
            free_bytes: (total - st.allocated) * g.cluster_bytes,
            cluster_bytes: g.cluster_bytes,
            total_clusters: total,
            allocated_clusters: st.allocated,
            free_clusters: total - st.allocated,
            volumes: vols.len(),
            snapshots: all
                .iter()
                .filter(|v| v.meta.snapshot)
                .filter(visible)
                .count(),
            hidden_snapshots: all
                .iter()
                .filter(|v| v.hidden.load(Ordering::Acquire))
                .count(),
            provisioned_bytes: vols.iter().map(|v| v.size()).sum(),
            metadata_bytes: g.data_at + ext_meta,
            logical_bytes: all
                .iter()
                .map(|v| v.allocated.load(Ordering::Relaxed))
                .sum::<u64>()
                * g.cluster_bytes,
            stored_bytes: all.iter().map(|v| v.stored.load(Ordering::Relaxed)).sum(),
            // (The committed packer holds exactly the pack clusters.)
            pack_clusters: st.pack.cluster_count() as u64,
            compression: g.compression,
        }
    }

    pub fn compression(&self) -> Compression {
        self.inner.geom.compression
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
}

fn info(v: &VolInner, cluster_bytes: u64) -> ThinInfo {
    let mut parent = None;
    let mut shared = std::collections::HashSet::new();
    let mut at = v.parent.load_full();
    while let Some(a) = at {
        if parent.is_none() && !a.hidden.load(Ordering::Acquire) {
            parent = Some(a.meta.name.clone());
        }
        for (vc, _) in a.map.mapped(0, v.vclusters()) {
            if v.map.get(vc).is_none() {
                shared.insert(vc);
            }
        }
        at = a.parent.load_full();
    }
    ThinInfo {
        name: v.meta.name.clone(),
        uuid: uuid_string(&v.meta.uuid),
        size_bytes: v.size(),
        block_size: v.meta.block_size,
        allocated_bytes: v.allocated.load(Ordering::Relaxed) * cluster_bytes,
        snapshot: v.meta.snapshot,
        parent,
        shared_bytes: shared.len() as u64 * cluster_bytes,
        created: v.meta.created,
        stored_bytes: v.stored.load(Ordering::Relaxed),
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

/// A name as error messages quote it: whole when short, else its first 64
/// characters and its length, so that a huge name does not come back whole.
pub(crate) fn shown(name: &str) -> String {
    match name.char_indices().nth(64) {
        None => format!("{name:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes)", &name[..cut], name.len()),
    }
}

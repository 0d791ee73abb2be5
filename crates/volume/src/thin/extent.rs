//! Pool growth: extents. A pool starts on one device (its base) and grows
//! by whole devices appended as extents, each one another volume of the
//! same node (its own drives, its own protection). Nothing moves: the new
//! clusters are numbered after the last ones, and the new extent carries
//! the owner-table entries of its clusters in two checkpoint areas of its
//! own, written with the base checkpoint of the same epoch.
//!
//! Why not relocate or resize the base's metadata: the base checkpoint
//! area is sized for the base's clusters, and moving it would need a
//! superblock rewrite, the one write whose tearing loses the pool. Here the
//! superblock never changes; which extents belong to the pool is part of
//! the checkpoint (double-buffered, checksummed), so growth commits like
//! any other metadata change and a cut at any point leaves the old pool or
//! the grown one.
//!
//! Extent layout: block 0 is a header naming the pool (written before the
//! checkpoint that adopts the extent, never changed after), then the two
//! checkpoint parts, then the clusters.

use std::sync::Arc;

use blockdev::{BlockDevice, BlockError, BlockOp, IoRequest};

use super::format::{le_u64, owner_entry_bytes, put_u64, seal, sealed, zbuf};
use super::{BLOCK, BLOCK_USIZE, MAX_CLUSTERS, ThinError, ThinPool, check_device};
use crate::superblock::{new_uuid, uuid_string};

const EXT_MAGIC: [u8; 8] = *b"FLPLTEX1";
/// Extents a pool can have (the base checkpoint header lists them).
pub const MAX_EXTENTS: usize = 64;
/// Pool-internal byte addresses carry the extent number above this bit:
/// extent 0 is the base device.
pub(crate) const EXT_SHIFT: u32 = 56;
pub(crate) const EXT_OFF_MASK: u64 = (1 << EXT_SHIFT) - 1;
/// Where the base checkpoint header lists extents: 32 bytes each.
pub(crate) const EXT_LIST_AT: usize = 64;
pub(crate) const EXT_LIST_ENTRY: usize = 32;

/// One extent of a pool (not the base).
#[derive(Clone)]
pub(crate) struct Extent {
    pub(crate) uuid: [u8; 16],
    pub(crate) dev: Arc<dyn BlockDevice>,
    pub(crate) dev_bs: u64,
    /// Its first cluster in the pool's numbering.
    pub(crate) first: u64,
    pub(crate) clusters: u64,
    pub(crate) part_at: [u64; 2],
    pub(crate) part_bytes: u64,
    pub(crate) data_at: u64,
}

/// An extent as the pool lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtentInfo {
    pub uuid: String,
    /// The device (e.g. the volume) it lies on.
    pub device: String,
    pub first_cluster: u64,
    pub clusters: u64,
    pub capacity_bytes: u64,
}

/// Which pool an extent device was added to (UUIDs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtentLabel {
    pub pool: String,
    pub extent: String,
}

/// What an extent's block 0 says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ExtentHeader {
    pub(crate) pool: [u8; 16],
    pub(crate) uuid: [u8; 16],
    pub(crate) cluster_bytes: u64,
    pub(crate) clusters: u64,
}

/// A part holds the owner entries of the extent's clusters, then (in a
/// compressed pool) the owner codes of their blocks.
pub(crate) fn part_bytes(clusters: u64, pack_blocks: u64) -> u64 {
    (clusters * owner_entry_bytes(pack_blocks)).next_multiple_of(BLOCK)
}

/// The layout an extent of `clusters` clusters has: parts after the
/// header, data from the next cluster boundary.
fn layout(clusters: u64, cluster_bytes: u64, pack_blocks: u64) -> ([u64; 2], u64, u64) {
    let pb = part_bytes(clusters, pack_blocks);
    let data_at = (BLOCK + 2 * pb).next_multiple_of(cluster_bytes);
    ([BLOCK, BLOCK + pb], pb, data_at)
}

/// The most clusters a device of `bytes` holds as an extent.
fn plan_clusters(bytes: u64, cluster_bytes: u64, pack_blocks: u64) -> u64 {
    let mut c = bytes / cluster_bytes;
    while c > 0 && layout(c, cluster_bytes, pack_blocks).2 + c * cluster_bytes > bytes {
        c -= 1;
    }
    c
}

impl ExtentHeader {
    fn encode(&self) -> blockdev::AlignedBuf {
        let mut b = zbuf(BLOCK_USIZE);
        b[0..8].copy_from_slice(&EXT_MAGIC);
        b[8..24].copy_from_slice(&self.pool);
        b[24..40].copy_from_slice(&self.uuid);
        put_u64(&mut b, 40, self.cluster_bytes);
        put_u64(&mut b, 48, self.clusters);
        seal(&mut b);
        b
    }

    /// `None` unless `b` is a sealed extent header.
    pub(crate) fn decode(b: &[u8]) -> Option<ExtentHeader> {
        (b.len() >= BLOCK_USIZE && b[0..8] == EXT_MAGIC && sealed(b)).then(|| ExtentHeader {
            pool: b[8..24].try_into().expect("16 bytes"),
            uuid: b[24..40].try_into().expect("16 bytes"),
            cluster_bytes: le_u64(b, 40),
            clusters: le_u64(b, 48),
        })
    }
}

impl Extent {
    /// The extent on `dev` that header `h` describes, as cluster `first` on.
    pub(crate) fn from_header(
        dev: Arc<dyn BlockDevice>,
        h: &ExtentHeader,
        first: u64,
        pack_blocks: u64,
    ) -> Result<Extent, ThinError> {
        let dev_bs = check_device(&dev)?;
        let (part_at, part_bytes, data_at) = layout(h.clusters, h.cluster_bytes, pack_blocks);
        let end = data_at + h.clusters * h.cluster_bytes;
        if h.clusters == 0 || end > dev.geometry().size_bytes() {
            return Err(ThinError::Corrupt(format!(
                "extent {} on {}: its header says {} clusters, which the device ({} bytes) \
                 cannot hold",
                uuid_string(&h.uuid),
                dev.describe(),
                h.clusters,
                dev.geometry().size_bytes()
            )));
        }
        Ok(Extent {
            uuid: h.uuid,
            dev,
            dev_bs,
            first,
            clusters: h.clusters,
            part_at,
            part_bytes,
            data_at,
        })
    }

    pub(crate) fn info(&self, cluster_bytes: u64) -> ExtentInfo {
        ExtentInfo {
            uuid: uuid_string(&self.uuid),
            device: self.dev.describe(),
            first_cluster: self.first,
            clusters: self.clusters,
            capacity_bytes: self.clusters * cluster_bytes,
        }
    }
}

/// Block 0 of `dev`, if it holds an extent header.
pub(crate) async fn read_header(dev: &Arc<dyn BlockDevice>) -> Option<ExtentHeader> {
    if check_device(dev).is_err() || dev.geometry().size_bytes() < BLOCK {
        return None;
    }
    ExtentHeader::decode(&super::read_block0(dev).await.ok()?)
}

impl ThinPool {
    /// What `dev`'s extent header says, if it has one: the pool it was
    /// added to and the extent's UUID.
    pub async fn extent_of(dev: &Arc<dyn BlockDevice>) -> Option<ExtentLabel> {
        read_header(dev).await.map(|h| ExtentLabel {
            pool: uuid_string(&h.pool),
            extent: uuid_string(&h.uuid),
        })
    }

    /// The pool's extents after its base, in cluster order.
    pub fn extents(&self) -> Vec<ExtentInfo> {
        let cb = self.inner.geom.cluster_bytes;
        self.inner.ext.load().iter().map(|e| e.info(cb)).collect()
    }

    /// Grows the pool by all of `dev` (e.g. another volume of the same
    /// protection): writes the extent's header, then one checkpoint that
    /// names it, which is the commit. Until then the pool is as it was; if
    /// that checkpoint fails the pool refuses changes until reopened, and
    /// reopens without the extent. What `dev` held is forgotten.
    pub async fn add_extent(&self, dev: Arc<dyn BlockDevice>) -> Result<ExtentInfo, ThinError> {
        let p = &self.inner;
        let cb = p.geom.cluster_bytes;
        let bs = check_device(&dev)?;
        if bs > p.dev_bs {
            return Err(ThinError::Config(format!(
                "{}: {bs}-byte blocks, larger than the pool device's {}; thin volumes with \
                 smaller blocks could not use it",
                dev.describe(),
                p.dev_bs
            )));
        }
        let clusters = plan_clusters(dev.geometry().size_bytes(), cb, p.geom.pack_blocks);
        if clusters == 0 {
            return Err(ThinError::Config(format!(
                "{} holds {} bytes, too few for an extent header, its metadata and one \
                 {cb}-byte cluster",
                dev.describe(),
                dev.geometry().size_bytes()
            )));
        }
        let mut j = p.journal.lock().await;
        p.check_poisoned().map_err(|_| ThinError::Poisoned)?;
        let cur = p.ext.load_full();
        if cur.len() >= MAX_EXTENTS {
            return Err(ThinError::Config(format!(
                "the pool has {} extents, the most it can; add a larger device",
                cur.len()
            )));
        }
        let in_use = read_header(&dev)
            .await
            .is_some_and(|h| h.pool == p.geom.uuid && cur.iter().any(|e| e.uuid == h.uuid));
        if in_use || cur.iter().any(|e| Arc::ptr_eq(&e.dev, &dev)) || Arc::ptr_eq(&p.dev, &dev) {
            return Err(ThinError::Config(format!(
                "{} is already part of this pool",
                dev.describe()
            )));
        }
        let first = p.total_clusters();
        if first + clusters > MAX_CLUSTERS {
            return Err(ThinError::Config(format!(
                "the pool would hold {} clusters, more than {MAX_CLUSTERS}",
                first + clusters
            )));
        }
        let h = ExtentHeader {
            pool: p.geom.uuid,
            uuid: new_uuid(),
            cluster_bytes: cb,
            clusters,
        };
        let e = Extent::from_header(dev.clone(), &h, first, p.geom.pack_blocks)?;
        // The header first: an extent that no checkpoint names is ignored.
        write_block0(&dev, h.encode()).await?;
        let mut list = (*cur).clone();
        list.push(e.clone());
        p.state.lock().owner.resize((first + clusters) as usize, 0);
        // The extent is found by its clusters before any is handed out: a
        // write given one before would be mapped past the base device.
        p.ext.store(Arc::new(list));
        p.alloc.lock().grow(first + clusters);
        p.checkpoint(&mut j).await?;
        tracing::info!(
            "thin pool {}: added extent {} on {}: {clusters} clusters of {} KiB (now {} in all)",
            uuid_string(&p.geom.uuid),
            uuid_string(&h.uuid),
            dev.describe(),
            cb >> 10,
            first + clusters
        );
        Ok(e.info(cb))
    }
}

async fn write_block0(
    dev: &Arc<dyn BlockDevice>,
    b: blockdev::AlignedBuf,
) -> Result<(), BlockError> {
    let bs = u64::from(dev.geometry().block_size);
    let done = dev
        .submit(IoRequest {
            op: BlockOp::Write { fua: true },
            lba: 0,
            blocks: (BLOCK / bs) as u32,
            buf: b,
        })
        .await;
    done.result?;
    let done = dev
        .submit(IoRequest {
            op: BlockOp::Flush,
            lba: 0,
            blocks: 0,
            buf: blockdev::AlignedBuf::new(0),
        })
        .await;
    done.result
}

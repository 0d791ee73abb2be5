//! The stripe engine: a [`Volume`] is a [`BlockDevice`] over member devices.
//!
//! A request splits into per-stripe pieces that run concurrently. A write to
//! a redundant layout marks its region in the write-intent bitmap, takes the
//! stripe's lock (a sharded table of async mutexes), and then either
//! reconstruct-writes (reads the data it does not overwrite) or
//! read-modify-writes (reads old data and old parity), whichever reads fewer
//! blocks; a full-stripe write reads nothing. Parity is computed over just the
//! rows the write touches. Members that error are marked failed and the
//! stripe is retried degraded; the failure reaches the superblocks before the
//! write is acknowledged, so a restart never trusts a member that missed it.
//! An update of a stripe with a data column missing first writes a record to
//! the write journal (`journal.rs`), so a crash in its middle cannot corrupt the
//! missing column (the write hole the bitmap alone cannot close). Degraded
//! updates read-modify-write too when the columns they write are present, so
//! only writes into a missing column need a Reed-Solomon decode.
//!
//! Member I/O goes out in batches (`Batch`): every I/O of a step is
//! submitted before any is awaited (a device starts an I/O at submit), so a
//! step needs no join unless a device is still busy; requests see the
//! members through one shared snapshot (`View`), replaced when a member's
//! state changes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use blockdev::{
    AlignedBuf, BlockDevice, BlockError, BlockOp, Geometry, IoDone, IoFuture, IoRequest,
    check_request,
};
use futures_util::future::join_all;
use parking_lot::RwLock;

use crate::intent::{BITMAP_BLOCK, IntentLog};
use crate::journal::{HEADER_BYTES, Journal, Record, RecordKind};
use crate::layout::{Extent, Layout, LayoutError, LayoutKind, MAX_MEMBERS};
use crate::parity::{Code, Parity, ParityError};
use crate::rebuild::RebuildState;
use crate::records;
use crate::superblock::{
    MemberEntry, MemberState, SB_BYTES, Superblock, SuperblockError, new_uuid, uuid_string,
};

/// Default strip: 64 KiB per member per stripe.
pub const DEFAULT_STRIP_BYTES: u32 = 64 << 10;
/// Default metadata region at the start of each member (superblock, bitmap,
/// write journal).
pub const DEFAULT_META_BYTES: u64 = 1 << 20;
const LOCK_SHARDS: usize = 1024;
/// Default member bytes covered by one intent-bitmap bit (as md's 64 MiB chunk).
pub const DEFAULT_REGION_BYTES: u64 = 64 << 20;
/// How long a region must be idle before a flush clears its bit.
const INTENT_CLEAR_AGE: Duration = Duration::from_secs(2);
/// Largest piece a WriteZeroes/Deallocate is cut into on redundant layouts.
const ZERO_PIECE_BYTES: u64 = 1 << 20;

/// How to build a new volume.
#[derive(Debug, Clone)]
pub struct VolumeConfig {
    pub layout: LayoutKind,
    /// Bytes per strip: a power of two and a multiple of `block_size`.
    pub strip_bytes: u32,
    /// Volume block size, 4096 or 512.
    pub block_size: u32,
    /// Bytes reserved at the start of each member for the superblock, the
    /// write-intent bitmap and the write journal; data starts after it.
    /// Multiple of 4 KiB, >= 8 KiB. Parity layouts need room for one journal
    /// slot of 4 KiB + m strips after a bitmap block (1 MiB holds 3 to 14
    /// slots of 64 KiB strips); with less, degraded writes have no journal.
    pub meta_bytes: u64,
    /// Member bytes per write-intent bit (rounded to a power-of-two number of
    /// stripes; grown if the bitmap would not fit in `meta_bytes`). Larger:
    /// fewer bitmap writes; smaller: shorter resync after a crash.
    pub region_bytes: u64,
    /// Skip the initial parity sync because the members are known to read as
    /// zeroes (fresh RAM or freshly deallocated drives).
    pub assume_clean: bool,
    /// Keep the write-intent bitmap (default). Off only to show, in tests,
    /// what it protects against.
    #[doc(hidden)]
    pub intent_log: bool,
    /// Keep the write journal for degraded updates (default). Off only to
    /// show, in tests and benchmarks, what it protects against and costs.
    #[doc(hidden)]
    pub write_journal: bool,
    /// The operator's name, stored in the superblocks (at most 63 bytes).
    pub name: String,
}

impl VolumeConfig {
    pub fn new(layout: LayoutKind) -> VolumeConfig {
        VolumeConfig {
            layout,
            strip_bytes: DEFAULT_STRIP_BYTES,
            block_size: 4096,
            meta_bytes: DEFAULT_META_BYTES,
            region_bytes: DEFAULT_REGION_BYTES,
            assume_clean: false,
            intent_log: true,
            write_journal: true,
            name: String::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("volume config: {0}")]
    Config(String),
    #[error("volume layout: {0}")]
    Layout(#[from] LayoutError),
    #[error("parity: {0}")]
    Parity(#[from] ParityError),
    #[error("member {index}: I/O error: {source}")]
    MemberIo { index: usize, source: BlockError },
    #[error("member {index}: {source}; is it a member of this volume?")]
    NoSuperblock {
        index: usize,
        source: SuperblockError,
    },
    #[error("member {index} does not belong with the others: {detail}")]
    Mismatch { index: usize, detail: String },
    #[error(
        "member {index} (position {position}) is stale: its generation is {member_generation} \
         but the volume is at generation {volume_generation}; it missed updates, so replace it \
         (replace_member) instead of assembling with it"
    )]
    Stale {
        index: usize,
        position: usize,
        member_generation: u64,
        volume_generation: u64,
    },
    #[error(
        "{failed} members are failed or missing ({which:?}) but {layout} survives only {tolerated}"
    )]
    TooManyFailed {
        failed: usize,
        which: Vec<usize>,
        layout: LayoutKind,
        tolerated: usize,
    },
    #[error("rebuild: {0}")]
    Rebuild(String),
}

/// Counters of what the stripe engine did, for tests and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VolumeStats {
    pub full_stripe_writes: u64,
    pub rcw_writes: u64,
    pub rmw_writes: u64,
    pub degraded_writes: u64,
    pub degraded_reads: u64,
    pub intent_writes: u64,
    pub resynced_stripes: u64,
    /// Journal records written (degraded updates).
    pub journal_writes: u64,
    /// Bytes of those records, headers included.
    pub journal_bytes: u64,
    /// Stripes whose journal record was replayed at assembly.
    pub journal_replayed: u64,
}

#[derive(Default)]
pub(crate) struct Stats {
    full: AtomicU64,
    rcw: AtomicU64,
    rmw: AtomicU64,
    degraded_writes: AtomicU64,
    degraded_reads: AtomicU64,
    intent_writes: AtomicU64,
    resynced: AtomicU64,
    pub(crate) journal_writes: AtomicU64,
    pub(crate) journal_bytes: AtomicU64,
    pub(crate) journal_replayed: AtomicU64,
}

/// What a scrub found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubReport {
    pub stripes_checked: u64,
    /// Stripes whose parity disagreed with their data (first 1000).
    pub inconsistent: Vec<u64>,
    pub inconsistent_count: u64,
    pub repaired: u64,
    /// Stripes that could not be checked because a data member is missing.
    pub skipped: u64,
}

/// A protected (or striped, or concatenated) volume over member devices.
#[derive(Clone)]
pub struct Volume {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Members {
    pub devs: Vec<Arc<dyn BlockDevice>>,
    pub states: Vec<MemberState>,
    pub generation: u64,
    /// Bumped on every change the superblocks must record.
    pub version: u64,
    /// The `version` the superblocks on disk record.
    pub persisted_version: u64,
    pub clean: bool,
    /// The operator's name for the volume, kept in the superblocks.
    pub name: String,
    /// `devs` and `states` as requests see them, shared until they change
    /// (whoever changes them calls [`Members::changed`]).
    snapshot: Option<Arc<View>>,
}

impl Members {
    /// `devs` or `states` changed: the next request takes a new snapshot.
    pub fn changed(&mut self) {
        self.snapshot = None;
    }
}

pub(crate) struct Inner {
    pub layout: Layout,
    pub parity: Parity,
    pub uuid: [u8; 16],
    pub bs: u64,
    pub strip_bytes: u32,
    pub meta_bytes: u64,
    data_blocks: Vec<u64>,
    pub members: RwLock<Members>,
    sb_lock: tokio::sync::Mutex<()>,
    locks: Box<[tokio::sync::Mutex<()>]>,
    pub intent: IntentLog,
    use_intent: bool,
    /// Milliseconds a region must be idle before a flush clears its bit.
    intent_clear_ms: AtomicU64,
    pub stats: Stats,
    pub rebuild: RebuildState,
    /// The write journal of degraded updates; None for layouts without a
    /// write hole (no parity, mirrors) or when turned off.
    pub journal: Option<Journal>,
    /// Member byte offset of the device-kept record area; 0: none.
    pub records_at: u64,
    /// The newest record and its generation; held across a store.
    records: parking_lot::Mutex<RecordState>,
}

#[derive(Default)]
struct RecordState {
    generation: u64,
    data: Option<Vec<u8>>,
}

/// Member devices and states as one request saw them.
pub(crate) struct View {
    pub devs: Vec<Arc<dyn BlockDevice>>,
    pub states: Vec<MemberState>,
}

impl View {
    /// Whether `member` holds good data for `stripe`.
    pub fn avail(&self, member: usize, stripe: u64) -> bool {
        match self.states[member] {
            MemberState::Active => true,
            MemberState::Failed => false,
            MemberState::Rebuilding { checkpoint } => stripe < checkpoint,
        }
    }
    /// Whether `member` should get metadata (superblock, bitmap) writes.
    pub fn present(&self, member: usize) -> bool {
        self.states[member] != MemberState::Failed
    }
}

pub(crate) enum OpError {
    /// These members failed; mark them and retry.
    Members(Vec<usize>),
    Fatal(BlockError),
}

impl From<ParityError> for OpError {
    fn from(e: ParityError) -> Self {
        OpError::Fatal(BlockError::Io(std::io::Error::other(e.to_string())))
    }
}

thread_local! {
    /// Member I/O buffers for reuse, by power-of-two capacity class.
    static POOL: std::cell::RefCell<Vec<Vec<AlignedBuf>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}
const POOL_MAX_CLASS: usize = 1 << 20;
/// Bytes each size class may keep per thread (at least 4 buffers).
const POOL_CLASS_BYTES: usize = 4 << 20;

/// A buffer of `len` bytes from this thread's pool. Its contents are
/// arbitrary: callers fill all `len` bytes (use [`zbuf`] for zeroes).
pub(crate) fn abuf(len: usize) -> AlignedBuf {
    let cap = len.max(4096).next_power_of_two();
    let mut b = if cap <= POOL_MAX_CLASS {
        POOL.with(|p| {
            p.borrow_mut()
                .get_mut(cap.trailing_zeros() as usize)
                .and_then(|v| v.pop())
        })
        .unwrap_or_else(|| AlignedBuf::new(cap))
    } else {
        AlignedBuf::new(len)
    };
    b.set_len(len);
    b
}

/// Returns a buffer to this thread's pool.
pub(crate) fn recycle(buf: AlignedBuf) {
    let cap = buf.capacity();
    if !cap.is_power_of_two() || cap > POOL_MAX_CLASS {
        return;
    }
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        let class = cap.trailing_zeros() as usize;
        if p.len() <= class {
            p.resize_with(class + 1, Vec::new);
        }
        if p[class].len() < (POOL_CLASS_BYTES / cap).max(4) {
            p[class].push(buf);
        }
    });
}

/// Whether updates of `layout` can leave a write hole the journal must close:
/// parity computed over two or more data columns.
fn journal_wanted(layout: &Layout) -> bool {
    layout.data_columns() >= 2 && layout.parity_columns() >= 1
}

/// A zeroed buffer of `len` bytes.
pub(crate) fn zbuf(len: usize) -> AlignedBuf {
    let mut b = AlignedBuf::new(len);
    b.set_len(len);
    b
}

fn abuf_from(src: &[u8]) -> AlignedBuf {
    let mut b = abuf(src.len());
    b.copy_from_slice(src);
    b
}

fn io_err(msg: String) -> BlockError {
    BlockError::Io(std::io::Error::other(msg))
}

/// One I/O to a member at a byte offset.
pub(crate) async fn dev_io(
    dev: &Arc<dyn BlockDevice>,
    op: BlockOp,
    byte_off: u64,
    bytes: usize,
    buf: AlignedBuf,
) -> (AlignedBuf, Result<(), BlockError>) {
    // Block sizes are powers of two: shift, do not divide.
    let mbs = dev.geometry().block_size;
    debug_assert!(mbs.is_power_of_two());
    let shift = mbs.trailing_zeros();
    let req = IoRequest {
        op,
        lba: byte_off >> shift,
        blocks: (bytes as u64 >> shift) as u32,
        buf,
    };
    let IoDone { buf, result } = dev.submit(req).await;
    (buf, result)
}

/// Member I/Os of one step of a stripe operation, started together and
/// awaited together. A device starts an I/O when it is submitted (the
/// `BlockDevice` contract: drives queue it, RAM copies at once), so
/// submitting them all before awaiting any keeps them concurrent; only
/// futures still pending are joined, and ones that finished at submit (RAM
/// members) never touch a join or the heap beyond this batch's two vectors.
pub(crate) struct Batch {
    ios: Vec<(usize, IoFuture)>,
}

impl Batch {
    pub fn with_capacity(n: usize) -> Batch {
        Batch {
            ios: Vec::with_capacity(n),
        }
    }

    /// Starts an I/O of `bytes` at byte `off` of member `member`.
    pub fn submit(
        &mut self,
        view: &View,
        member: usize,
        op: BlockOp,
        off: u64,
        bytes: usize,
        buf: AlignedBuf,
    ) {
        let dev = &view.devs[member];
        let mbs = dev.geometry().block_size;
        debug_assert!(mbs.is_power_of_two());
        let shift = mbs.trailing_zeros();
        let io = dev.submit(IoRequest {
            op,
            lba: off >> shift,
            blocks: (bytes as u64 >> shift) as u32,
            buf,
        });
        self.ios.push((member, io));
    }

    /// A buffer that comes back in its place in the results, with no I/O.
    pub fn hold(&mut self, buf: AlignedBuf) {
        self.ios.push((usize::MAX, IoFuture::ready(buf, Ok(()))));
    }

    /// The buffers in submission order, or the members that failed.
    pub async fn finish(self) -> Result<Vec<AlignedBuf>, OpError> {
        let mut done: Vec<(usize, Option<IoDone>)> = Vec::with_capacity(self.ios.len());
        let mut pending = Vec::new();
        for (i, (member, io)) in self.ios.into_iter().enumerate() {
            match io {
                IoFuture::Ready(Some(d)) => done.push((member, Some(d))),
                io => {
                    pending.push((i, io));
                    done.push((member, None));
                }
            }
        }
        if !pending.is_empty() {
            let (at, ios): (Vec<usize>, Vec<IoFuture>) = pending.into_iter().unzip();
            for (i, d) in at.into_iter().zip(join_all(ios).await) {
                done[i].1 = Some(d);
            }
        }
        let mut failed = Vec::new();
        let mut bufs = Vec::with_capacity(done.len());
        for (member, d) in done {
            let d = d.expect("every I/O completed");
            if let Err(e) = d.result {
                tracing::debug!("member {member} I/O error: {e}");
                failed.push(member);
            }
            bufs.push(d.buf);
        }
        if failed.is_empty() {
            Ok(bufs)
        } else {
            bufs.into_iter().for_each(recycle);
            failed.sort_unstable();
            failed.dedup();
            Err(OpError::Members(failed))
        }
    }

    /// For writes: waits, recycles the buffers.
    pub async fn finish_writes(self) -> Result<(), OpError> {
        self.finish().await?.into_iter().for_each(recycle);
        Ok(())
    }
}

pub(crate) fn collect_failed<T>(results: Vec<Result<T, usize>>) -> Result<Vec<T>, OpError> {
    let mut failed = Vec::new();
    let mut ok = Vec::with_capacity(results.len());
    for r in results {
        match r {
            Ok(v) => ok.push(v),
            Err(i) => failed.push(i),
        }
    }
    if failed.is_empty() {
        Ok(ok)
    } else {
        failed.sort_unstable();
        failed.dedup();
        Err(OpError::Members(failed))
    }
}

/// Per data column: touched rows and where the new data starts in the source.
#[derive(Clone, Copy)]
struct Touch {
    lo: u64,
    hi: u64,
    src: usize,
}

impl Volume {
    /// Builds a new volume on `members`, writing fresh superblocks and an empty
    /// intent bitmap. Unless `assume_clean`, parity is computed for every stripe.
    pub async fn create(
        members: Vec<Arc<dyn BlockDevice>>,
        cfg: VolumeConfig,
    ) -> Result<Volume, VolumeError> {
        let bs = cfg.block_size;
        if bs != 512 && bs != 4096 {
            return Err(VolumeError::Config(format!(
                "block_size = {bs} is not supported; use 4096 or 512"
            )));
        }
        if cfg.strip_bytes == 0
            || !cfg.strip_bytes.is_power_of_two()
            || !cfg.strip_bytes.is_multiple_of(bs)
        {
            return Err(VolumeError::Config(format!(
                "strip_bytes = {} is not a power of two multiple of the {bs} B block; use e.g. 65536",
                cfg.strip_bytes
            )));
        }
        if cfg.meta_bytes < 2 * SB_BYTES as u64 || !cfg.meta_bytes.is_multiple_of(SB_BYTES as u64) {
            return Err(VolumeError::Config(format!(
                "meta_bytes = {} must be a multiple of 4096 and at least 8192; use 1048576",
                cfg.meta_bytes
            )));
        }
        let mut data_blocks = Vec::with_capacity(members.len());
        for (i, d) in members.iter().enumerate() {
            if let Some(j) = members[..i].iter().position(|o| Arc::ptr_eq(o, d)) {
                return Err(VolumeError::Config(format!(
                    "member {i} is the same device as member {j}; give each position its own device"
                )));
            }
            let g = d.geometry();
            if !bs.is_multiple_of(g.block_size) {
                return Err(VolumeError::Config(format!(
                    "member {i} has {} B blocks, which do not divide the volume's {bs} B blocks; \
                     use block_size = {}",
                    g.block_size, g.block_size
                )));
            }
            if g.size_bytes() <= cfg.meta_bytes {
                return Err(VolumeError::Config(format!(
                    "member {i} holds {} bytes, no more than the {} bytes of metadata; use a larger member",
                    g.size_bytes(),
                    cfg.meta_bytes
                )));
            }
            data_blocks.push((g.size_bytes() - cfg.meta_bytes) / u64::from(bs));
        }
        let layout = Layout::new(cfg.layout, u64::from(cfg.strip_bytes / bs), &data_blocks)?;
        let mut bitmap_bytes = cfg.meta_bytes - SB_BYTES as u64;
        let mut journal_bytes = 0;
        if cfg.write_journal && journal_wanted(&layout) {
            // The bitmap (at least one block) leaves room for a journal slot;
            // without one, Inner::new warns that degraded writes have a hole.
            let slot = Journal::slot_bytes(layout.parity_columns(), u64::from(cfg.strip_bytes));
            if cfg.meta_bytes >= (SB_BYTES + BITMAP_BLOCK) as u64 + slot {
                bitmap_bytes -= slot;
                journal_bytes = slot;
            }
        }
        // Then room for the device-kept records at the end of the metadata
        // area, where there is some after a bitmap block and a journal slot
        // (without it the volume keeps no records, `keeps_records` is false).
        let records_at = if cfg.meta_bytes
            >= (SB_BYTES + BITMAP_BLOCK) as u64 + journal_bytes + records::AREA_BYTES
        {
            bitmap_bytes -= records::AREA_BYTES;
            cfg.meta_bytes - records::AREA_BYTES
        } else {
            0
        };
        let wanted = (cfg.region_bytes / u64::from(cfg.strip_bytes))
            .max(1)
            .next_power_of_two();
        let region_stripes =
            IntentLog::region_stripes_for(layout.stripes().max(1), bitmap_bytes).max(wanted);
        let states = vec![MemberState::Active; members.len()];
        let inner = Inner::new(
            layout,
            new_uuid(),
            cfg.block_size,
            cfg.strip_bytes,
            cfg.meta_bytes,
            region_stripes,
            data_blocks,
            members,
            states,
            0,
            cfg.intent_log,
            cfg.write_journal,
            records_at,
        )?;
        let vol = Volume {
            inner: Arc::new(inner),
        };
        // Empty bitmaps first, so a crash before the superblock lands leaves no
        // half-made volume that assembles.
        vol.inner.members.write().name = cfg.name.clone();
        vol.inner.write_bitmap_all_zero().await?;
        vol.inner.wipe_journal().await;
        vol.inner.persist_superblock(true).await;
        if !cfg.assume_clean && vol.inner.parity.code != Code::None {
            for s in 0..vol.inner.layout.stripes() {
                vol.inner
                    .sync_stripe(s, true)
                    .await
                    .map_err(|e| VolumeError::Rebuild(format!("initial sync: {e}")))?;
            }
        }
        tracing::info!("created {}", vol.describe());
        Ok(vol)
    }

    /// Reassembles a volume from its members alone (in any order), resyncs
    /// every region the intent bitmaps mark dirty, and marks the volume open.
    /// Members that cannot be read count as failed; members of another
    /// volume, or stale ones, are refused with an error naming them.
    pub async fn assemble(members: Vec<Arc<dyn BlockDevice>>) -> Result<Volume, VolumeError> {
        Self::assemble_with(members, true, true).await
    }

    /// The tests' negative controls: `intent_log: false` keeps no bitmap and
    /// resyncs nothing; `write_journal: false` journals and replays nothing.
    pub(crate) async fn assemble_with(
        members: Vec<Arc<dyn BlockDevice>>,
        intent_log: bool,
        write_journal: bool,
    ) -> Result<Volume, VolumeError> {
        let reads = join_all(members.iter().map(|d| async move {
            let (buf, r) = dev_io(d, BlockOp::Read, 0, SB_BYTES, abuf(SB_BYTES)).await;
            r.map(|_| buf)
        }))
        .await;
        let mut sbs: Vec<Option<Superblock>> = Vec::with_capacity(members.len());
        for (i, r) in reads.into_iter().enumerate() {
            match r {
                Ok(buf) => match Superblock::decode(&buf) {
                    Ok(sb) => sbs.push(Some(sb)),
                    Err(source) => return Err(VolumeError::NoSuperblock { index: i, source }),
                },
                Err(e) => {
                    tracing::warn!(
                        "member {i}: superblock unreadable ({e}); treating it as failed"
                    );
                    sbs.push(None);
                }
            }
        }
        let newest = sbs
            .iter()
            .flatten()
            .max_by_key(|sb| sb.generation)
            .cloned()
            .ok_or_else(|| VolumeError::Config("no member has a readable superblock".into()))?;
        let n = newest.members.len();
        let mut slot: Vec<Option<usize>> = vec![None; n];
        for (i, sb) in sbs.iter().enumerate() {
            let Some(sb) = sb else { continue };
            if sb.uuid != newest.uuid {
                return Err(VolumeError::Mismatch {
                    index: i,
                    detail: format!(
                        "it belongs to volume {}, the others to {}",
                        uuid_string(&sb.uuid),
                        uuid_string(&newest.uuid)
                    ),
                });
            }
            if !sb.same_shape(&newest) {
                return Err(VolumeError::Mismatch {
                    index: i,
                    detail: format!(
                        "its layout ({} of {} members, {} B strips) differs from the volume's ({} of {}, {} B)",
                        sb.kind,
                        sb.members.len(),
                        sb.strip_bytes,
                        newest.kind,
                        n,
                        newest.strip_bytes
                    ),
                });
            }
            let p = usize::from(sb.position);
            if let Some(other) = slot[p] {
                return Err(VolumeError::Mismatch {
                    index: i,
                    detail: format!("it claims position {p}, as member {other} does"),
                });
            }
            slot[p] = Some(i);
        }
        let mut devs: Vec<Arc<dyn BlockDevice>> = Vec::with_capacity(n);
        let mut states = Vec::with_capacity(n);
        let template = members[slot
            .iter()
            .flatten()
            .copied()
            .next()
            .expect("newest exists")]
        .geometry();
        for (p, entry) in newest.members.iter().enumerate() {
            match slot[p] {
                Some(i) => {
                    let sb = sbs[i].as_ref().expect("slotted members have superblocks");
                    let state = entry.state;
                    if state != MemberState::Failed && sb.generation + 1 < newest.generation {
                        return Err(VolumeError::Stale {
                            index: i,
                            position: p,
                            member_generation: sb.generation,
                            volume_generation: newest.generation,
                        });
                    }
                    if state == MemberState::Failed {
                        tracing::warn!("member {i} (position {p}) is marked failed; not using it");
                    } else if sb.generation < newest.generation {
                        // One behind: the last superblock update was cut short.
                        tracing::info!(
                            "member {i} (position {p}) is at generation {} of {}; taking the newer superblock",
                            sb.generation,
                            newest.generation
                        );
                    }
                    devs.push(members[i].clone());
                    states.push(state);
                }
                None => {
                    if entry.state != MemberState::Failed {
                        tracing::warn!("member at position {p} is missing; running degraded");
                    }
                    devs.push(Arc::new(MissingDevice(template)) as Arc<dyn BlockDevice>);
                    states.push(MemberState::Failed);
                }
            }
        }
        let failed: Vec<usize> = (0..n)
            .filter(|&p| states[p] == MemberState::Failed)
            .collect();
        let data_blocks: Vec<u64> = newest.members.iter().map(|e| e.data_blocks).collect();
        let layout = Layout::new(
            newest.kind,
            u64::from(newest.strip_bytes / newest.block_size),
            &data_blocks,
        )?;
        if failed.len() > layout.parity_columns() {
            return Err(VolumeError::TooManyFailed {
                failed: failed.len(),
                which: failed,
                layout: newest.kind,
                tolerated: layout.parity_columns(),
            });
        }
        let inner = Inner::new(
            layout,
            newest.uuid,
            newest.block_size,
            newest.strip_bytes,
            newest.meta_bytes,
            newest.region_stripes,
            data_blocks,
            devs,
            states,
            newest.generation,
            intent_log,
            write_journal,
            newest.records_at,
        )?;
        let vol = Volume {
            inner: Arc::new(inner),
        };
        {
            let mut m = vol.inner.members.write();
            m.version += 1;
            m.name = newest.name.clone();
        }
        // Journal first: the bitmap resync cannot fix stripes missing data.
        vol.inner.replay_journal().await?;
        if intent_log {
            vol.inner.resync_dirty_regions().await?;
        }
        vol.inner.load_records().await;
        vol.inner.persist_superblock(true).await;
        tracing::info!("assembled {}", vol.describe());
        Ok(vol)
    }

    /// Makes everything durable and marks the superblocks clean. Call before
    /// dropping the volume at shutdown; I/O after it marks the volume dirty again.
    pub async fn close(&self) -> Result<(), BlockError> {
        self.inner.flush_clearing(Duration::ZERO).await?;
        self.inner.members.write().clean = true;
        self.inner.persist_superblock(true).await;
        self.inner.members.write().clean = false;
        Ok(())
    }

    /// Tests: make flushes clear intent bits of regions idle for `age`.
    #[cfg(test)]
    pub(crate) fn set_intent_clear_age(&self, age: Duration) {
        self.inner
            .intent_clear_ms
            .store(age.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn layout(&self) -> &Layout {
        &self.inner.layout
    }

    /// The name stored in the superblocks (empty if none was given).
    pub fn name(&self) -> String {
        self.inner.members.read().name.clone()
    }

    pub fn uuid(&self) -> String {
        uuid_string(&self.inner.uuid)
    }

    pub fn generation(&self) -> u64 {
        self.inner.members.read().generation
    }

    pub fn member_states(&self) -> Vec<MemberState> {
        self.inner.members.read().states.clone()
    }

    pub fn stats(&self) -> VolumeStats {
        let s = &self.inner.stats;
        VolumeStats {
            full_stripe_writes: s.full.load(Ordering::Relaxed),
            rcw_writes: s.rcw.load(Ordering::Relaxed),
            rmw_writes: s.rmw.load(Ordering::Relaxed),
            degraded_writes: s.degraded_writes.load(Ordering::Relaxed),
            degraded_reads: s.degraded_reads.load(Ordering::Relaxed),
            intent_writes: s.intent_writes.load(Ordering::Relaxed),
            resynced_stripes: s.resynced.load(Ordering::Relaxed),
            journal_writes: s.journal_writes.load(Ordering::Relaxed),
            journal_bytes: s.journal_bytes.load(Ordering::Relaxed),
            journal_replayed: s.journal_replayed.load(Ordering::Relaxed),
        }
    }

    /// Marks a member failed (as `flashpool drive fail` does) and records it
    /// in the other members' superblocks.
    pub async fn fail_member(&self, index: usize) -> Result<(), VolumeError> {
        if index >= self.inner.layout.members() {
            return Err(VolumeError::Config(format!(
                "member {index} does not exist; the volume has {}",
                self.inner.layout.members()
            )));
        }
        self.inner.mark_failed(index);
        self.inner.persist_superblock(false).await;
        Ok(())
    }

    /// Checks every stripe's parity against its data; with `repair`, rewrites
    /// parity that disagrees.
    pub async fn scrub(&self, repair: bool) -> ScrubReport {
        let mut rep = ScrubReport::default();
        if self.inner.parity.code == Code::None {
            return rep;
        }
        for s in 0..self.inner.layout.stripes() {
            match self.inner.sync_stripe(s, repair).await {
                Ok(Some(true)) => rep.stripes_checked += 1,
                Ok(Some(false)) => {
                    rep.stripes_checked += 1;
                    rep.inconsistent_count += 1;
                    if rep.inconsistent.len() < 1000 {
                        rep.inconsistent.push(s);
                    }
                    if repair {
                        rep.repaired += 1;
                    }
                }
                Ok(None) | Err(_) => rep.skipped += 1,
            }
        }
        rep
    }
}

impl Inner {
    #[allow(clippy::too_many_arguments)]
    fn new(
        layout: Layout,
        uuid: [u8; 16],
        block_size: u32,
        strip_bytes: u32,
        meta_bytes: u64,
        region_stripes: u64,
        data_blocks: Vec<u64>,
        devs: Vec<Arc<dyn BlockDevice>>,
        states: Vec<MemberState>,
        generation: u64,
        use_intent: bool,
        use_journal: bool,
        records_at: u64,
    ) -> Result<Inner, VolumeError> {
        let parity = Parity::new(layout.data_columns(), layout.parity_columns())?;
        let intent = IntentLog::new(layout.stripes().max(1), region_stripes.max(1));
        if (SB_BYTES + intent.bytes()) as u64 > meta_bytes {
            return Err(VolumeError::Config(format!(
                "the intent bitmap needs {} bytes but meta_bytes = {meta_bytes}",
                intent.bytes() + SB_BYTES
            )));
        }
        let start = (SB_BYTES + intent.bytes()) as u64;
        if records_at != 0 && records_at < start {
            return Err(VolumeError::Config(format!(
                "the record area at {records_at} overlaps the intent bitmap, which ends at {start}"
            )));
        }
        // The journal takes what the superblock and bitmap leave of the
        // metadata area up to the record area (all of it in volumes made
        // before records), so its place follows from the superblock alone.
        let journal_end = if records_at != 0 {
            records_at
        } else {
            meta_bytes
        };
        let slot = Journal::slot_bytes(layout.parity_columns(), u64::from(strip_bytes));
        let slots = if journal_wanted(&layout) {
            ((journal_end - start) / slot) as usize
        } else {
            0
        };
        // A volume made before records adopts the end of its metadata area
        // when the journal slots (counted even where the journal is off, as
        // a later assembly turns it on) leave that much unused: nothing ever
        // wrote there.
        let records_at = if records_at == 0
            && meta_bytes - (start + slots as u64 * slot) >= records::AREA_BYTES
        {
            meta_bytes - records::AREA_BYTES
        } else {
            records_at
        };
        let journal = if use_journal && journal_wanted(&layout) {
            if slots == 0 {
                tracing::warn!(
                    "meta_bytes = {meta_bytes} leaves no room for a write-journal slot of {slot} \
                     bytes (4 KiB + {} strips); a crash during a degraded partial-stripe write can \
                     corrupt the missing member's data; use meta_bytes >= {} for new volumes",
                    layout.parity_columns(),
                    (SB_BYTES + BITMAP_BLOCK) as u64 + slot
                );
                None
            } else {
                Some(Journal::new(start, slot, slots, layout.members()))
            }
        } else {
            None
        };
        Ok(Inner {
            parity,
            uuid,
            bs: u64::from(block_size),
            strip_bytes,
            meta_bytes,
            data_blocks,
            members: RwLock::new(Members {
                devs,
                states,
                generation,
                version: 0,
                persisted_version: 0,
                clean: false,
                name: String::new(),
                snapshot: None,
            }),
            sb_lock: tokio::sync::Mutex::new(()),
            locks: (0..LOCK_SHARDS)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            intent,
            use_intent: use_intent && layout.parity_columns() > 0,
            intent_clear_ms: AtomicU64::new(INTENT_CLEAR_AGE.as_millis() as u64),
            stats: Stats::default(),
            rebuild: RebuildState::default(),
            journal,
            records_at,
            records: parking_lot::Mutex::new(RecordState::default()),
            layout,
        })
    }

    /// The members as this request sees them (one reference count, no copy).
    pub fn view(&self) -> Arc<View> {
        if let Some(v) = &self.members.read().snapshot {
            return v.clone();
        }
        let mut m = self.members.write();
        let v = Arc::new(View {
            devs: m.devs.clone(),
            states: m.states.clone(),
        });
        m.snapshot = Some(v.clone());
        v
    }

    pub fn stripe_lock(&self, stripe: u64) -> &tokio::sync::Mutex<()> {
        &self.locks[(stripe % LOCK_SHARDS as u64) as usize]
    }

    fn redundant(&self) -> bool {
        self.parity.code != Code::None
    }

    pub fn mark_failed(&self, member: usize) {
        let mut m = self.members.write();
        if m.states[member] != MemberState::Failed {
            tracing::warn!("member {member} failed ({})", m.devs[member].describe());
            m.states[member] = MemberState::Failed;
            m.version += 1;
            m.changed();
        }
    }

    fn data_byte(&self, member_lba: u64) -> u64 {
        self.meta_bytes + member_lba * self.bs
    }

    /// Starts a read of `blocks` volume blocks at `member_lba` of a member's data area.
    fn submit_read(&self, b: &mut Batch, view: &View, member: usize, member_lba: u64, blocks: u64) {
        let len = (blocks * self.bs) as usize;
        b.submit(
            view,
            member,
            BlockOp::Read,
            self.data_byte(member_lba),
            len,
            abuf(len),
        );
    }

    /// Starts a write of `buf` at `member_lba` of a member's data area.
    fn submit_write(
        &self,
        b: &mut Batch,
        view: &View,
        member: usize,
        member_lba: u64,
        buf: AlignedBuf,
        fua: bool,
    ) {
        let len = buf.len();
        b.submit(
            view,
            member,
            BlockOp::Write { fua },
            self.data_byte(member_lba),
            len,
            buf,
        );
    }

    /// Reads `blocks` volume blocks at `member_lba` of a member's data area.
    pub(crate) async fn col_read(
        &self,
        view: &View,
        member: usize,
        member_lba: u64,
        blocks: u64,
    ) -> Result<AlignedBuf, usize> {
        let len = (blocks * self.bs) as usize;
        let (buf, r) = dev_io(
            &view.devs[member],
            BlockOp::Read,
            self.data_byte(member_lba),
            len,
            abuf(len),
        )
        .await;
        r.map(|_| buf).map_err(|e| {
            tracing::debug!("member {member} read error: {e}");
            member
        })
    }

    pub(crate) async fn col_write(
        &self,
        view: &View,
        member: usize,
        member_lba: u64,
        buf: AlignedBuf,
        fua: bool,
    ) -> Result<(), usize> {
        let len = buf.len();
        let (buf, r) = dev_io(
            &view.devs[member],
            BlockOp::Write { fua },
            self.data_byte(member_lba),
            len,
            buf,
        )
        .await;
        recycle(buf);
        r.map_err(|e| {
            tracing::debug!("member {member} write error: {e}");
            member
        })
    }

    fn too_many_failed(&self, view: &View) -> BlockError {
        let failed: Vec<usize> = (0..view.states.len())
            .filter(|&i| view.states[i] == MemberState::Failed)
            .collect();
        io_err(format!(
            "volume has {} failed members ({failed:?}); {} tolerates {}",
            failed.len(),
            self.layout.kind(),
            self.layout.parity_columns()
        ))
    }

    // ---- requests ----

    pub async fn handle(self: Arc<Self>, req: IoRequest) -> IoDone {
        let IoRequest {
            op,
            lba,
            blocks,
            buf,
        } = req;
        match op {
            BlockOp::Read => self.read(lba, u64::from(blocks), buf).await,
            BlockOp::Write { fua } => {
                let r = self.write(lba, u64::from(blocks), &buf, fua).await;
                IoDone { buf, result: r }
            }
            BlockOp::Flush => IoDone {
                buf,
                result: self.flush().await,
            },
            BlockOp::WriteZeroes | BlockOp::Deallocate => IoDone {
                buf,
                result: self.zero(op, lba, u64::from(blocks)).await,
            },
        }
    }

    async fn read(&self, lba: u64, blocks: u64, mut buf: AlignedBuf) -> IoDone {
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
        let total = (blocks * self.bs) as usize;
        let mut rest: &mut [u8] = &mut buf[..total];
        let mut futs = Vec::new();
        for group in exts.chunk_by(|a, b| a.stripe == b.stripe) {
            let bytes = (group.iter().map(|e| e.blocks).sum::<u64>() * self.bs) as usize;
            let (head, tail) = rest.split_at_mut(bytes);
            rest = tail;
            futs.push(self.read_stripe(group, head));
        }
        let result = join_all(futs).await.into_iter().collect::<Result<(), _>>();
        IoDone { buf, result }
    }

    /// The member to read an extent from when it can be read directly.
    fn read_member(&self, view: &View, e: &Extent) -> Option<usize> {
        if self.parity.code == Code::Mirror {
            // Spread reads of a mirror over its copies.
            let n = self.layout.members();
            return (0..n)
                .map(|i| (e.stripe as usize + i) % n)
                .find(|&mbr| view.avail(mbr, e.stripe));
        }
        if !self.redundant() || view.avail(e.member, e.stripe) {
            Some(e.member)
        } else {
            None
        }
    }

    async fn read_stripe(&self, exts: &[Extent], out: &mut [u8]) -> Result<(), BlockError> {
        let stripe = exts[0].stripe;
        let base = exts[0].offset;
        for _attempt in 0..=self.layout.members() {
            let view = self.view();
            let direct: Option<Vec<usize>> =
                exts.iter().map(|e| self.read_member(&view, e)).collect();
            if let Some(members) = direct {
                let mut reads = Batch::with_capacity(exts.len());
                for (e, &mbr) in exts.iter().zip(&members) {
                    self.submit_read(&mut reads, &view, mbr, e.member_lba, e.blocks);
                }
                match reads.finish().await {
                    Ok(bufs) => {
                        for (e, b) in exts.iter().zip(bufs) {
                            let at = ((e.offset - base) * self.bs) as usize;
                            out[at..at + b.len()].copy_from_slice(&b);
                            recycle(b);
                        }
                        return Ok(());
                    }
                    Err(OpError::Members(failed)) if self.redundant() => {
                        failed.iter().for_each(|&f| self.mark_failed(f));
                        continue;
                    }
                    Err(_) => {
                        return Err(io_err(format!(
                            "read of stripe {stripe} failed on a member and {} has no redundancy",
                            self.layout.kind()
                        )));
                    }
                }
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
                    return Ok(());
                }
                Err(OpError::Members(failed)) => {
                    failed.iter().for_each(|&f| self.mark_failed(f));
                }
                Err(OpError::Fatal(e)) => return Err(e),
            }
        }
        Err(self.too_many_failed(&self.view()))
    }

    /// The k data columns of rows `lo..hi` of `stripe`, read or reconstructed
    /// from just the columns needed, followed by m buffers of the parity's
    /// size whose contents are unspecified. The caller holds the stripe lock.
    async fn read_reconstructed(
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

    async fn write(
        &self,
        lba: u64,
        blocks: u64,
        src: &AlignedBuf,
        fua: bool,
    ) -> Result<(), BlockError> {
        let exts = self.layout.extents(lba, blocks);
        if !self.redundant() {
            let view = self.view();
            let res = join_all(exts.iter().map(|e| {
                let at = (e.offset * self.bs) as usize;
                let b = abuf_from(&src[at..at + (e.blocks * self.bs) as usize]);
                self.col_write(&view, e.member, e.member_lba, b, fua)
            }))
            .await;
            return match collect_failed(res) {
                Ok(_) => Ok(()),
                Err(_) => Err(io_err(format!(
                    "write failed on a member and {} has no redundancy",
                    self.layout.kind()
                ))),
            };
        }
        if exts[0].stripe == exts[exts.len() - 1].stripe {
            // One stripe (most requests): no join.
            let len = (blocks * self.bs) as usize;
            self.write_stripe(&exts, &src[..len], fua).await?;
        } else {
            let futs = exts
                .chunk_by(|a, b| a.stripe == b.stripe)
                .map(|group| {
                    let at = (group[0].offset * self.bs) as usize;
                    let len = (group.iter().map(|e| e.blocks).sum::<u64>() * self.bs) as usize;
                    self.write_stripe(group, &src[at..at + len], fua)
                })
                .collect::<Vec<_>>();
            let r: Result<(), BlockError> = join_all(futs).await.into_iter().collect();
            r?;
        }
        // A member skipped because it failed must be recorded as failed before
        // the write is acknowledged.
        self.persist_superblock(false).await;
        Ok(())
    }

    /// Marks the stripe's region in the intent bitmap (on disk before return).
    async fn intent_begin(&self, stripe: u64) {
        if !self.use_intent {
            return;
        }
        let region = self.intent.region_of(stripe);
        if !self.intent.begin(region) {
            return;
        }
        let _io = self.intent.io.lock().await;
        let Some((block, snap)) = self.intent.snapshot_for(region) else {
            return;
        };
        self.stats.intent_writes.fetch_add(1, Ordering::Relaxed);
        self.write_bitmap_block(block, &snap).await;
        self.intent.written(block, &snap);
    }

    fn intent_end(&self, stripe: u64) {
        if self.use_intent {
            self.intent.end(self.intent.region_of(stripe));
        }
    }

    /// Writes one bitmap block to every present member with FUA.
    async fn write_bitmap_block(&self, block: usize, snap: &[u8]) {
        let off = (SB_BYTES + block * BITMAP_BLOCK) as u64;
        self.write_meta_all(off, snap).await;
    }

    /// Writes `bytes` at byte `off` of every present member with FUA; a
    /// member whose write fails is marked failed (the next superblock flush
    /// records it). Returns how many members took it, and the last error.
    async fn write_meta_all(&self, off: u64, bytes: &[u8]) -> (usize, Option<BlockError>) {
        let view = self.view();
        let res = join_all((0..view.devs.len()).filter(|&i| view.present(i)).map(|i| {
            let b = abuf_from(bytes);
            let dev = &view.devs[i];
            async move {
                let (b, r) = dev_io(dev, BlockOp::Write { fua: true }, off, bytes.len(), b).await;
                recycle(b);
                r.map_err(|e| (i, e))
            }
        }))
        .await;
        let mut written = 0;
        let mut last_err = None;
        for r in res {
            match r {
                Ok(()) => written += 1,
                Err((i, e)) => {
                    self.mark_failed(i);
                    last_err = Some(e);
                }
            }
        }
        (written, last_err)
    }

    /// Clears on disk the bits of regions idle for at least `age`.
    async fn intent_clear_idle(&self, age: Duration) {
        if !self.use_intent {
            return;
        }
        for block in self.intent.clear_idle(age) {
            let _io = self.intent.io.lock().await;
            let snap = self.intent.snapshot_block(block);
            self.write_bitmap_block(block, &snap).await;
            self.intent.written(block, &snap);
        }
    }

    async fn write_bitmap_all_zero(&self) -> Result<(), VolumeError> {
        let view = self.view();
        let bytes = self.intent.bytes();
        let res = join_all((0..view.devs.len()).filter(|&i| view.present(i)).map(|i| {
            let dev = &view.devs[i];
            async move {
                let (_, r) = dev_io(
                    dev,
                    BlockOp::Write { fua: true },
                    SB_BYTES as u64,
                    bytes,
                    zbuf(bytes),
                )
                .await;
                r.map_err(|source| VolumeError::MemberIo { index: i, source })
            }
        }))
        .await;
        res.into_iter().collect()
    }

    async fn write_stripe(&self, exts: &[Extent], src: &[u8], fua: bool) -> Result<(), BlockError> {
        let stripe = exts[0].stripe;
        self.intent_begin(stripe).await;
        let guard = self.stripe_lock(stripe).lock().await;
        let mut result = Err(io_err("no attempt".into()));
        for _attempt in 0..=self.layout.members() {
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

    async fn write_stripe_once(
        &self,
        view: &View,
        exts: &[Extent],
        src: &[u8],
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
        let new_data = |t: &Touch| &src[t.src..t.src + ((t.hi - t.lo) * bs) as usize];
        if missing > 0 {
            self.stats.degraded_writes.fetch_add(1, Ordering::Relaxed);
        }

        if self.parity.code == Code::Mirror {
            let t = touch[0].expect("a mirror write touches column 0");
            let mut writes = Batch::with_capacity(n);
            for c in (0..n).filter(|&c| avail[c]) {
                let b = abuf_from(new_data(&t));
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
                    let b = abuf_from(new_data(t));
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

        // Both ways below end with all k data columns of rows lo..hi in hand.
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
            let mut cols: Vec<AlignedBuf> = (0..n).map(|_| abuf(len)).collect();
            for (&(d, a), b) in spans.iter().zip(got) {
                let at = ((a - lo) * bs) as usize;
                cols[d][at..at + b.len()].copy_from_slice(&b);
                recycle(b);
            }
            cols
        } else {
            // A missing column keeps rows this write does not cover: rebuild it.
            self.read_reconstructed(view, stripe, lo, hi).await?
        };
        if self.parity.code == Code::Xor && (0..k).all(covered) {
            // Full stripe: copy each column's new data in and fold it into
            // the parity in one pass over the source.
            let (data, par) = cols.split_at_mut(k);
            let mut drefs: Vec<&mut [u8]> = data.iter_mut().map(|b| &mut b[..]).collect();
            let srcs: Vec<&[u8]> = touch
                .iter()
                .map(|t| new_data(t.as_ref().expect("covered")))
                .collect();
            crate::parity::copy_xor(&mut drefs, &srcs, &mut par[0]);
        } else {
            for d in 0..k {
                if let Some(t) = touch[d] {
                    let at = ((t.lo - lo) * bs) as usize;
                    let nd = new_data(&t);
                    cols[d][at..at + nd.len()].copy_from_slice(nd);
                }
            }
            let (data, par) = cols.split_at_mut(k);
            let drefs: Vec<&[u8]> = data.iter().map(|b| &b[..]).collect();
            let mut prefs: Vec<&mut [u8]> = par.iter_mut().map(|b| &mut b[..]).collect();
            self.parity.encode(&drefs, &mut prefs)?;
        }
        let _record = if (0..k).any(|d| !avail[d]) {
            // Recovery recomputes parity from the present data as it lands and
            // the missing columns' new contents.
            let ranges = (0..k).filter(|&d| avail[d]).map(|d| (d, lo, hi)).collect();
            let payload: Vec<(usize, &[u8])> = (0..k)
                .filter(|&d| !avail[d])
                .map(|d| (d, &cols[d][..]))
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
            if !avail[c] {
                recycle(col);
                continue;
            }
            if c >= k {
                self.submit_write(&mut writes, view, member(c), lba, col, fua);
                continue;
            }
            let Some(t) = touch[c] else {
                recycle(col);
                continue;
            };
            let b = if covered(c) {
                col
            } else {
                let at = ((t.lo - lo) * bs) as usize;
                let b = abuf_from(&col[at..at + ((t.hi - t.lo) * bs) as usize]);
                recycle(col);
                b
            };
            let at = self.layout.strip_lba(stripe, t.lo);
            self.submit_write(&mut writes, view, member(c), at, b, fua);
        }
        writes.finish_writes().await
    }

    /// `par[j] ^= parity_j(cols)`, where each `(d, row, bytes)` puts data
    /// column `d`'s bytes at `row` of rows `lo..` (`len` bytes in all) and
    /// every other column is zero.
    fn fold_parity<'a>(
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
    async fn rmw(
        &self,
        view: &View,
        stripe: u64,
        lo: u64,
        hi: u64,
        touch: &[Option<Touch>],
        avail: &[bool],
        src: &[u8],
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
        let new_data = |t: &Touch| &src[t.src..t.src + ((t.hi - t.lo) * bs) as usize];
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
            let b = abuf_from(new_data(&t));
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
    async fn journal_record(
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

    pub async fn flush(&self) -> Result<(), BlockError> {
        let age = Duration::from_millis(self.intent_clear_ms.load(Ordering::Relaxed));
        self.flush_clearing(age).await
    }

    async fn flush_clearing(&self, age: Duration) -> Result<(), BlockError> {
        self.intent_clear_idle(age).await;
        let view = self.view();
        let res = join_all((0..view.devs.len()).filter(|&i| view.present(i)).map(|i| {
            let dev = &view.devs[i];
            async move {
                let (_, r) = dev_io(dev, BlockOp::Flush, 0, 0, AlignedBuf::new(0)).await;
                r.map_err(|_| i)
            }
        }))
        .await;
        if let Err(OpError::Members(failed)) = collect_failed(res) {
            if !self.redundant() {
                return Err(io_err(format!("flush failed on members {failed:?}")));
            }
            failed.iter().for_each(|&f| self.mark_failed(f));
            let view = self.view();
            let n_failed = view
                .states
                .iter()
                .filter(|s| **s == MemberState::Failed)
                .count();
            if n_failed > self.parity.m {
                return Err(self.too_many_failed(&view));
            }
        }
        self.persist_superblock(false).await;
        Ok(())
    }

    async fn zero(&self, op: BlockOp, lba: u64, blocks: u64) -> Result<(), BlockError> {
        if !self.redundant() {
            let view = self.view();
            let exts = self.layout.extents(lba, blocks);
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
        let zeroes = zbuf((piece.min(blocks) * self.bs) as usize);
        let mut at = lba;
        while at < lba + blocks {
            let n = piece.min(lba + blocks - at);
            self.write(at, n, &zeroes, false).await?;
            at += n;
        }
        Ok(())
    }

    // ---- superblocks, resync ----

    /// Writes the superblocks (a new generation) to every present member when
    /// member states changed, or always with `force`.
    pub async fn persist_superblock(&self, force: bool) {
        // Lock-free when nothing changed: the common case on the write path.
        // While another task's persist is in flight, persisted_version still
        // lags, so this waits for it below.
        if !force && {
            let st = self.members.read();
            st.version == st.persisted_version
        } {
            return;
        }
        let _g = self.sb_lock.lock().await;
        let mut force = force;
        loop {
            let (view, sbs, version) = {
                let mut st = self.members.write();
                if !force && st.version == st.persisted_version {
                    return;
                }
                force = false;
                st.generation += 1;
                let version = st.version;
                let entries: Vec<MemberEntry> = st
                    .states
                    .iter()
                    .zip(&self.data_blocks)
                    .map(|(&state, &data_blocks)| MemberEntry { state, data_blocks })
                    .collect();
                let sbs: Vec<Option<[u8; SB_BYTES]>> = (0..st.devs.len())
                    .map(|p| {
                        (st.states[p] != MemberState::Failed).then(|| {
                            Superblock {
                                uuid: self.uuid,
                                generation: st.generation,
                                position: p as u16,
                                kind: self.layout.kind(),
                                clean: st.clean,
                                block_size: self.bs as u32,
                                strip_bytes: self.strip_bytes,
                                meta_bytes: self.meta_bytes,
                                region_stripes: self.intent.region_stripes,
                                records_at: self.records_at,
                                members: entries.clone(),
                                name: st.name.clone(),
                            }
                            .encode()
                        })
                    })
                    .collect();
                (
                    View {
                        devs: st.devs.clone(),
                        states: st.states.clone(),
                    },
                    sbs,
                    version,
                )
            };
            let res = join_all(sbs.iter().enumerate().filter_map(|(p, sb)| {
                let sb = sb.as_ref()?;
                let dev = &view.devs[p];
                Some(async move {
                    let (_, r) = dev_io(
                        dev,
                        BlockOp::Write { fua: true },
                        0,
                        SB_BYTES,
                        abuf_from(sb),
                    )
                    .await;
                    r.map_err(|_| p)
                })
            }))
            .await;
            for r in res {
                if let Err(p) = r {
                    self.mark_failed(p);
                }
            }
            let mut st = self.members.write();
            st.persisted_version = st.persisted_version.max(version);
            if st.version == st.persisted_version {
                return;
            }
        }
    }

    /// Reads both record slots of every present member and keeps the newest
    /// valid record (a torn or missing copy leaves the others).
    async fn load_records(&self) {
        if self.records_at == 0 {
            return;
        }
        let view = self.view();
        let bytes = records::AREA_BYTES as usize;
        let reads = join_all((0..view.devs.len()).filter(|&i| view.present(i)).map(|i| {
            let dev = &view.devs[i];
            async move {
                let (buf, r) =
                    dev_io(dev, BlockOp::Read, self.records_at, bytes, abuf(bytes)).await;
                (i, buf, r)
            }
        }))
        .await;
        let mut best: Option<(u64, Vec<u8>)> = None;
        for (i, buf, r) in reads {
            if let Err(e) = r {
                tracing::warn!(
                    "member {i}: record area unreadable ({e}); using the other members'"
                );
                continue;
            }
            for slot in buf.chunks(records::SLOT_BYTES) {
                if let Some((g, data)) =
                    records::decode(slot, &self.uuid, blockdev::RecordKind::Reservations)
                    && best.as_ref().is_none_or(|(bg, _)| g > *bg)
                {
                    best = Some((g, data));
                }
            }
            recycle(buf);
        }
        let mut st = self.records.lock();
        if let Some((generation, data)) = best {
            st.generation = generation;
            st.data = Some(data);
        }
    }

    /// Writes `data` as generation `generation` of the record to every
    /// present member (FUA), into the slot the previous generation does not use.
    async fn write_record(
        &self,
        generation: u64,
        kind: blockdev::RecordKind,
        data: &[u8],
    ) -> Result<(), BlockError> {
        let slot = records::encode(&self.uuid, generation, kind, data);
        let at = records::slot_at(self.records_at, generation);
        match self.write_meta_all(at, &slot).await {
            (0, e) => Err(io_err(format!(
                "volume {}: the {kind:?} record reached no member{}",
                uuid_string(&self.uuid),
                e.map(|e| format!(" (last error: {e})")).unwrap_or_default()
            ))),
            _ => Ok(()),
        }
    }

    /// The record area as a new member must carry it: the current record in
    /// its slot, the other slot empty.
    pub(crate) fn record_area_image(&self) -> Vec<u8> {
        let mut area = vec![0u8; records::AREA_BYTES as usize];
        let st = self.records.lock();
        if let Some(data) = &st.data {
            let at = (records::slot_at(0, st.generation)) as usize;
            let slot = records::encode(
                &self.uuid,
                st.generation,
                blockdev::RecordKind::Reservations,
                data,
            );
            area[at..at + records::SLOT_BYTES].copy_from_slice(&slot);
        }
        area
    }

    /// Recomputes parity of every stripe in a region marked dirty on any member.
    async fn resync_dirty_regions(&self) -> Result<(), VolumeError> {
        if !self.redundant() {
            return Ok(());
        }
        let view = self.view();
        let bytes = self.intent.bytes();
        let mut merged = vec![0u8; bytes];
        for i in (0..view.devs.len()).filter(|&i| view.present(i)) {
            let (buf, r) = dev_io(
                &view.devs[i],
                BlockOp::Read,
                SB_BYTES as u64,
                bytes,
                abuf(bytes),
            )
            .await;
            match r {
                Ok(()) => {
                    for (a, b) in merged.iter_mut().zip(buf.iter()) {
                        *a |= *b;
                    }
                }
                Err(_) => self.mark_failed(i),
            }
        }
        let regions = self.intent.dirty_regions(&merged);
        if !regions.is_empty() {
            tracing::info!("resyncing {} dirty regions", regions.len());
        }
        let mut unsynced = 0u64;
        for r in &regions {
            let first = r * self.intent.region_stripes;
            let last = (first + self.intent.region_stripes).min(self.layout.stripes());
            for s in first..last {
                match self.sync_stripe(s, true).await {
                    Ok(Some(_)) => {
                        self.stats.resynced.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(None) => unsynced += 1,
                    Err(e) => {
                        return Err(VolumeError::Rebuild(format!("resync of stripe {s}: {e}")));
                    }
                }
            }
        }
        if unsynced > 0 {
            tracing::warn!(
                "{unsynced} dirty stripes could not be resynced because a data member is missing; \
                 their parity may disagree with data written before the crash"
            );
        }
        if !regions.is_empty() {
            self.write_bitmap_all_zero().await?;
        }
        Ok(())
    }

    /// Checks one stripe's parity; with `repair` rewrites it when it differs.
    /// Ok(None) when a data column is unavailable, Ok(Some(consistent)) otherwise.
    pub async fn sync_stripe(&self, stripe: u64, repair: bool) -> Result<Option<bool>, BlockError> {
        let _g = self.stripe_lock(stripe).lock().await;
        let (k, m) = (self.parity.k, self.parity.m);
        let rows = self.layout.strip_blocks();
        for _attempt in 0..=self.layout.members() {
            let view = self.view();
            // A mirror checks its copies against the first readable one.
            let order: Vec<usize> = if self.parity.code == Code::Mirror {
                let Some(first) =
                    (0..k + m).find(|&c| view.avail(self.layout.column_member(stripe, c), stripe))
                else {
                    return Ok(None);
                };
                std::iter::once(first)
                    .chain((0..k + m).filter(|&c| c != first))
                    .collect()
            } else {
                (0..k + m).collect()
            };
            let member = |c: usize| self.layout.column_member(stripe, order[c]);
            if (0..k).any(|d| !view.avail(member(d), stripe)) {
                return Ok(None);
            }
            let lba = self.layout.strip_lba(stripe, 0);
            let res = join_all((0..k + m).map(|c| {
                let want = view.avail(member(c), stripe);
                let view = &view;
                async move {
                    if want {
                        self.col_read(view, member(c), lba, rows).await.map(Some)
                    } else {
                        Ok(None)
                    }
                }
            }))
            .await;
            let cols = match collect_failed(res) {
                Ok(c) => c,
                Err(OpError::Members(f)) => {
                    f.iter().for_each(|&i| self.mark_failed(i));
                    continue;
                }
                Err(OpError::Fatal(e)) => return Err(e),
            };
            let len = (rows * self.bs) as usize;
            let mut fresh: Vec<AlignedBuf> = (0..m).map(|_| abuf(len)).collect();
            {
                let drefs: Vec<&[u8]> = cols[..k]
                    .iter()
                    .map(|c| &c.as_ref().expect("data present")[..])
                    .collect();
                let mut prefs: Vec<&mut [u8]> = fresh.iter_mut().map(|b| &mut b[..]).collect();
                self.parity
                    .encode(&drefs, &mut prefs)
                    .map_err(|e| io_err(e.to_string()))?;
            }
            let bad: Vec<usize> = (0..m)
                .filter(|&j| {
                    cols[k + j]
                        .as_ref()
                        .is_some_and(|old| old[..] != fresh[j][..])
                })
                .collect();
            if bad.is_empty() || !repair {
                return Ok(Some(bad.is_empty()));
            }
            let res = join_all(
                fresh
                    .into_iter()
                    .enumerate()
                    .filter(|(j, _)| bad.contains(j))
                    .map(|(j, p)| self.col_write(&view, member(k + j), lba, p, true)),
            )
            .await;
            match collect_failed(res) {
                Ok(_) => return Ok(Some(false)),
                Err(OpError::Members(f)) => f.iter().for_each(|&i| self.mark_failed(i)),
                Err(OpError::Fatal(e)) => return Err(e),
            }
        }
        Err(self.too_many_failed(&self.view()))
    }
}

impl BlockDevice for Volume {
    fn geometry(&self) -> Geometry {
        Geometry {
            block_size: self.inner.bs as u32,
            num_blocks: self.inner.layout.volume_blocks(),
        }
    }

    fn submit(&self, req: IoRequest) -> IoFuture {
        if let Err(e) = check_request(self.geometry(), &req) {
            return IoFuture::ready(req.buf, Err(e));
        }
        if req.blocks == 0 && matches!(req.op, BlockOp::Read | BlockOp::Write { .. }) {
            return IoFuture::ready(req.buf, Ok(()));
        }
        let inner = self.inner.clone();
        IoFuture::Pending(Box::pin(inner.handle(req)))
    }

    fn deallocate_reads_zeroes(&self) -> bool {
        if self.inner.redundant() {
            true
        } else {
            self.inner
                .members
                .read()
                .devs
                .iter()
                .all(|d| d.deallocate_reads_zeroes())
        }
    }

    /// Records live in the members' metadata area ([`crate::records`]);
    /// volumes whose metadata area had no room for them keep none.
    fn keeps_records(&self) -> bool {
        self.inner.records_at != 0
    }

    fn load_record(&self, _kind: blockdev::RecordKind) -> Result<Option<Vec<u8>>, BlockError> {
        Ok(self.inner.records.lock().data.clone())
    }

    /// Blocks the calling thread until every present member has the record
    /// (or has failed out); members that complete I/O on their own threads
    /// (files, RAM) are fine, a member needing this thread's async runtime is not.
    fn store_record(&self, kind: blockdev::RecordKind, data: &[u8]) -> Result<(), BlockError> {
        if self.inner.records_at == 0 {
            return Err(BlockError::Config(format!(
                "{}: keeps no {kind:?} record: its metadata area ({} bytes) has no room for the \
                 {}-byte record area; create the volume with a larger meta_bytes (e.g. {})",
                self.describe(),
                self.inner.meta_bytes,
                records::AREA_BYTES,
                DEFAULT_META_BYTES
            )));
        }
        if data.len() > blockdev::RECORD_MAX {
            return Err(BlockError::Config(format!(
                "{}: a {kind:?} record of {} bytes is over the {}-byte limit",
                self.describe(),
                data.len(),
                blockdev::RECORD_MAX
            )));
        }
        let mut st = self.inner.records.lock();
        // The generation moves only once a member holds it: a store that
        // reached none is retried into the same slot, so the previous good
        // record in the other slot survives a crash during the retry.
        let next = st.generation + 1;
        blockdev::block_on(self.inner.write_record(next, kind, data))?;
        st.generation = next;
        st.data = Some(data.to_vec());
        Ok(())
    }

    /// Shuts the members down. Call [`Volume::close`] first to leave the
    /// superblocks clean and the intent bitmaps empty.
    fn shutdown(&self) -> Result<(), BlockError> {
        let devs = self.inner.members.read().devs.clone();
        let mut first_err = None;
        for d in devs {
            if let Err(e) = d.shutdown() {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn describe(&self) -> String {
        let l = &self.inner.layout;
        let states = self.member_states();
        let failed = states.iter().filter(|s| **s == MemberState::Failed).count();
        let rebuilding = states
            .iter()
            .filter(|s| matches!(s, MemberState::Rebuilding { .. }))
            .count();
        let health = match (failed, rebuilding) {
            (0, 0) => "healthy".to_string(),
            (f, 0) => format!("degraded, {f} failed"),
            (f, r) => format!("degraded, {f} failed, {r} rebuilding"),
        };
        format!(
            "volume {} {} ({}+{} of {} members, {} KiB strips, {} MiB, {health})",
            uuid_string(&self.inner.uuid),
            l.kind(),
            l.data_columns(),
            l.parity_columns(),
            l.members(),
            self.inner.strip_bytes / 1024,
            (l.volume_blocks() * self.inner.bs) >> 20
        )
    }
}

/// Stands in for a member that was not given at assembly: every I/O fails.
struct MissingDevice(Geometry);

impl BlockDevice for MissingDevice {
    fn geometry(&self) -> Geometry {
        self.0
    }
    fn submit(&self, req: IoRequest) -> IoFuture {
        IoFuture::ready(req.buf, Err(io_err("member missing".into())))
    }
    fn deallocate_reads_zeroes(&self) -> bool {
        false
    }
    fn describe(&self) -> String {
        "missing member".into()
    }
}

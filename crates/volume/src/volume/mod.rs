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
    BlockDevice, BlockError, BlockOp, Geometry, IoDone, IoFuture, IoRequest, check_request,
};
use parking_lot::RwLock;

use crate::crypt::{CryptPath, DataKey, KeyEnvelope};
use crate::intent::IntentLog;
use crate::journal::Journal;
use crate::layout::{Layout, LayoutError, LayoutKind};
use crate::parity::{Code, Parity, ParityError};
use crate::rebuild::RebuildState;
use crate::records;
use crate::superblock::{MemberState, Superblock, SuperblockError, VolumeRole, uuid_string};

mod assemble;
mod encrypt;
mod fence;
mod force;
mod gather;
pub(crate) mod member_io;
mod meta;
mod read;
mod readd;
mod rebuild;
mod replay;
mod resync;
mod state_hook;
mod sync;
mod write;

pub(crate) use fence::Fence;
pub use force::{ForceReport, ForcedFrom, ForcedMember, StaleRange};
pub(crate) use member_io::collect_failed;
pub use readd::ReAddReport;
pub use state_hook::{StateHook, StateRecord};
pub use sync::SyncControl;

/// Default strip: 64 KiB per member per stripe.
pub const DEFAULT_STRIP_BYTES: u32 = 64 << 10;
/// Default metadata region at the start of each member (superblock, bitmap,
/// write journal).
pub const DEFAULT_META_BYTES: u64 = 1 << 20;
const LOCK_SHARDS: usize = 1024;
/// Coarsest automatic intent region: member bytes per bitmap bit on large
/// members (as md's 64 MiB bitmap chunk).
pub const AUTO_REGION_MAX_BYTES: u64 = 64 << 20;
/// Finest automatic intent region. Each region's first write after it went
/// idle costs one FUA bitmap write to every member; 1 MiB keeps that under
/// one per 256 sequential 4 KiB writes.
pub const AUTO_REGION_MIN_BYTES: u64 = 1 << 20;
/// An automatic region is at most this fraction of a member, so a crash
/// resyncs what was written lately, not the whole member. With one 64 MiB
/// region over a 32 MiB member the bitmap says nothing: a `kill -9` of a
/// mirror's owner made the next owner copy every member whole.
pub const AUTO_REGIONS_PER_MEMBER: u64 = 1024;
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
    /// fewer bitmap writes; smaller: shorter resync after a crash. 0 (the
    /// default): 1/[`AUTO_REGIONS_PER_MEMBER`] of a member, between
    /// [`AUTO_REGION_MIN_BYTES`] and [`AUTO_REGION_MAX_BYTES`].
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
    /// Recorded in the superblocks (`Unknown` unless the caller says).
    pub role: VolumeRole,
    /// Encrypt the volume (AES-XTS-256, [`crate::crypt`]) with this data
    /// key, kept in the superblocks as this envelope (the key wrapped by a
    /// key-encryption key). None: not encrypted.
    pub key: Option<(KeyEnvelope, DataKey)>,
}

impl VolumeConfig {
    pub fn new(layout: LayoutKind) -> VolumeConfig {
        VolumeConfig {
            layout,
            strip_bytes: DEFAULT_STRIP_BYTES,
            block_size: 4096,
            meta_bytes: DEFAULT_META_BYTES,
            region_bytes: 0,
            assume_clean: false,
            intent_log: true,
            write_journal: true,
            name: String::new(),
            role: VolumeRole::Unknown,
            key: None,
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
    /// The volume fenced itself (see [`Volume::fence`]): it does no more I/O.
    #[error("fenced: {0}")]
    Fenced(String),
    /// `re_add` refused the device; nothing changed.
    #[error("re-add of member {index} refused: {reason}")]
    ReAddRefused { index: usize, reason: String },
    /// A forced assembly cannot bring the volume up; nothing changed.
    #[error("forced assembly refused: {0}")]
    ForceRefused(String),
    /// A replacement cannot be rebuilt (no redundancy, or too many other
    /// members missing); nothing changed.
    #[error("{0}")]
    CannotRebuild(String),
    /// Something the change needed kept changing under it (the record
    /// while a member joined); nothing changed, and a retry may pass.
    #[error("{0}")]
    Busy(String),
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
    /// Full stripes written from the parts of several partial-stripe
    /// writes of a stream (`gather.rs`); each also counts in `full_stripe_writes`.
    pub gathered_stripes: u64,
    /// Gathering windows that ended without a full stripe (each part then
    /// wrote itself).
    pub gather_timeouts: u64,
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
    /// The pass was stopped before its end.
    pub cancelled: bool,
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
    /// What the volume is for, kept in the superblocks.
    pub role: VolumeRole,
    /// An encrypted volume's wrapped data key, kept in the superblocks.
    pub key: Option<KeyEnvelope>,
    /// Per member: for a failed member, the generation at which it failed
    /// while the intent bitmap was kept from then on (every region written
    /// since is set on the others' bitmaps), so it can be re-added through
    /// the bitmap; 0: not known, a re-add rebuilds it in full.
    pub failed_at: Vec<u64>,
    /// Regions a re-added (Resyncing) member may hold stale data in.
    pub stale: Option<Arc<StaleRegions>>,
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
    /// Held by a replacement or re-add from its check that the member is
    /// Failed until it returns: two at one position would both pass the
    /// check, and the second would zero the journal of a device the first
    /// had already put in. One per volume (changes of membership are rare):
    /// a joining device that hangs holds up the volume's other changes of
    /// membership too, not its I/O.
    pub(crate) membership: tokio::sync::Mutex<()>,
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
    /// Raised on a member's Reservation Conflict or by [`Volume::fence`].
    pub(crate) fence: Arc<Fence>,
    /// Regions whose parity has not been computed since `create` (the
    /// initial sync runs in the background): each holds one write-intent
    /// reference, so its bit stays on disk until it is synced.
    pub(crate) unsynced: parking_lot::Mutex<Vec<u64>>,
    /// Records member state changes outside (`state_hook.rs`).
    pub(crate) state_hook: parking_lot::Mutex<state_hook::HookSlot>,
    /// Whether the volume is encrypted (fixed when made); its I/O then
    /// needs `crypt`, the unwrapped key, and fails while it is None.
    pub(crate) encrypted: std::sync::atomic::AtomicBool,
    pub(crate) crypt: arc_swap::ArcSwapOption<CryptPath>,
    /// Partial-stripe writes of a stream waiting to make full stripes.
    pub(crate) gather: gather::Gather,
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
    pub stale: Option<Arc<StaleRegions>>,
}

/// The regions a re-added member missed writes in (a copy of the intent
/// bitmap when it came back): it serves everything else.
pub(crate) struct StaleRegions {
    pub region_stripes: u64,
    pub bits: Vec<u64>,
}

impl StaleRegions {
    pub fn stale(&self, stripe: u64) -> bool {
        let r = stripe / self.region_stripes;
        self.bits
            .get((r / 64) as usize)
            .is_some_and(|w| w & (1 << (r % 64)) != 0)
    }
}

impl View {
    /// Whether `member` holds good data for `stripe`.
    pub fn avail(&self, member: usize, stripe: u64) -> bool {
        match self.states[member] {
            MemberState::Active => true,
            MemberState::Failed => false,
            MemberState::Rebuilding { checkpoint } => stripe < checkpoint,
            MemberState::Resyncing { checkpoint } => {
                // Without the stale set (not loaded yet, or no bitmap):
                // everything at or above the checkpoint is stale.
                stripe < checkpoint || self.stale.as_ref().is_some_and(|s| !s.stale(stripe))
            }
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

/// Whether updates of `layout` can leave a write hole the journal must close:
/// parity computed over two or more data columns.
fn journal_wanted(layout: &Layout) -> bool {
    layout.data_columns() >= 2 && layout.parity_columns() >= 1
}

impl Volume {
    /// Makes everything durable and marks the superblocks clean. Call before
    /// dropping the volume at shutdown; I/O after it marks the volume dirty again.
    pub async fn close(&self) -> Result<(), BlockError> {
        if self.inner.fence.is_set() {
            return Err(self.inner.fence.error());
        }
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
    /// What it was made for (`Unknown` for volumes made before roles).
    pub fn role(&self) -> VolumeRole {
        self.inner.members.read().role
    }

    pub fn name(&self) -> String {
        self.inner.members.read().name.clone()
    }

    pub fn uuid(&self) -> String {
        uuid_string(&self.inner.uuid)
    }

    pub fn generation(&self) -> u64 {
        self.inner.members.read().generation
    }

    /// Each member's state: Active, Failed, Rebuilding (replaced, being
    /// rebuilt in full) or Resyncing (re-added, its stale regions being
    /// resynced); the checkpoints say how far, [`Volume::rebuild_progress`]
    /// how fast.
    pub fn member_states(&self) -> Vec<MemberState> {
        self.inner.members.read().states.clone()
    }

    /// Whether the volume fenced itself (a member answered Reservation
    /// Conflict, or [`Volume::fence`] was called): every I/O then fails
    /// with [`BlockError::Fenced`] and nothing reaches the members.
    pub fn is_fenced(&self) -> bool {
        self.inner.fence.is_set()
    }

    /// As md's bitmap daemon: makes the writes of regions that went idle
    /// durable (a flush of the members) and clears the bits of regions
    /// idle for the clear age since, as a host's flush does; so a crash or
    /// a takeover resyncs only what was written lately, also under hosts
    /// that never flush. No I/O when no written region is idle. The node
    /// calls it every second.
    pub async fn settle_intents(&self) -> Result<(), BlockError> {
        if !self.inner.use_intent || self.is_fenced() || !self.inner.intent.has_idle() {
            return Ok(());
        }
        self.inner.flush().await
    }

    /// Whether `other` is this same open volume (a handle of it), not
    /// another one assembled from the same drives.
    pub fn same(&self, other: &Volume) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Why the volume is fenced, if it is.
    pub fn fence_reason(&self) -> Option<String> {
        self.inner.fence.reason()
    }

    /// Fences the volume (for the node to call on other signals, such as a
    /// lost ownership lease): from now on every I/O, rebuild, resync and
    /// metadata write fails with [`BlockError::Fenced`] and nothing more is
    /// written to any member. There is no unfence: assemble the volume
    /// again once this node owns it again. Returns false when it already was.
    pub fn fence(&self, reason: &str) -> bool {
        self.inner.fence.set(reason.to_string())
    }

    /// [`Self::fence`] of a volume retired on purpose (deleted): the same
    /// fence, without the error it is logged as otherwise.
    pub fn retire(&self, reason: &str) -> bool {
        self.inner.fence.set_as(reason.to_string(), false)
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
            gathered_stripes: self.inner.gather.merged.load(Ordering::Relaxed),
            gather_timeouts: self.inner.gather.expired.load(Ordering::Relaxed),
        }
    }

    /// Positions of the members that do not hold all of their data now:
    /// failed, being rebuilt (replaced) or being resynced (re-added).
    pub fn incomplete_members(&self) -> Vec<usize> {
        self.inner
            .members
            .read()
            .states
            .iter()
            .enumerate()
            .filter(|(_, s)| **s != MemberState::Active)
            .map(|(i, _)| i)
            .collect()
    }

    /// Whether more members are incomplete than the layout tolerates, so
    /// that some data can be neither read nor rebuilt: the volume has
    /// failed. Reads and writes that need a missing member fail with
    /// [`BlockError::TooManyFailed`]; on raid0 and concat that is every I/O
    /// touching a failed member.
    pub fn is_failed(&self) -> bool {
        self.incomplete_members().len() > self.inner.layout.parity_columns()
    }

    /// Marks a member failed (as `flashpool drive fail` does) and records it
    /// in the other members' superblocks. On every layout the member gets
    /// no more I/O; beyond the layout's tolerance the volume has failed
    /// ([`Volume::is_failed`]).
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
}

impl Inner {
    /// The members as this request sees them (one reference count, no copy).
    pub fn view(&self) -> Arc<View> {
        if let Some(v) = &self.members.read().snapshot {
            return v.clone();
        }
        let mut m = self.members.write();
        let v = Arc::new(View {
            devs: m.devs.clone(),
            states: m.states.clone(),
            stale: m.stale.clone(),
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

    /// A member failed: run degraded without it. From here on the intent
    /// bitmap keeps every bit it sets (see [`Inner::hold_bitmap`]), so the
    /// member can be re-added through it. A fenced volume changes nothing:
    /// its members did not fail, this node lost them.
    pub fn mark_failed(&self, member: usize) {
        if self.fence.is_set() {
            return;
        }
        let mut m = self.members.write();
        if m.states[member] != MemberState::Failed {
            tracing::warn!("member {member} failed ({})", m.devs[member].describe());
            // Before anyone sees the member failed (the members lock is held):
            // a write that goes degraded because of it must find bits held.
            self.hold_bitmap(true);
            let was_failed_at = m.failed_at[member];
            m.failed_at[member] = match m.states[member] {
                // A member failing again during its re-add keeps the older
                // mark: its stale regions are still stale.
                MemberState::Resyncing { .. } if was_failed_at != 0 => was_failed_at,
                _ if self.use_intent => m.generation.max(1),
                _ => 0,
            };
            m.states[member] = MemberState::Failed;
            m.version += 1;
            m.changed();
        }
    }

    /// Keeps (true) or again lets flushes clear (false) idle intent bits.
    /// Held while any member is not Active: the bits are then the record of
    /// what a returning member missed.
    pub(crate) fn hold_bitmap(&self, hold: bool) {
        if self.use_intent {
            self.intent.set_hold(hold);
        }
    }

    pub async fn handle(self: Arc<Self>, req: IoRequest) -> IoDone {
        if self.fence.is_set() {
            return IoDone {
                buf: req.buf,
                result: Err(self.fence.error()),
            };
        }
        let mut done = self.handle_op(req).await;
        // An error while fenced (a retry that found the fence up, a member
        // that answered Reservation Conflict) is the fence's.
        if done.result.is_err() && self.fence.is_set() {
            done.result = Err(self.fence.error());
        }
        done
    }

    async fn handle_op(&self, req: IoRequest) -> IoDone {
        let IoRequest {
            op,
            lba,
            blocks,
            buf,
        } = req;
        match op {
            BlockOp::Read => self.read(lba, u64::from(blocks), buf).await,
            BlockOp::Write { fua } => {
                // Members get views of the host's buffer; it comes back whole
                // once they have all returned them.
                let shared = buf.share();
                let r = self.write(lba, u64::from(blocks), &shared, fua).await;
                IoDone {
                    buf: write::unshare(shared),
                    result: r,
                }
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
        if self.inner.encrypted.load(Ordering::Relaxed)
            && matches!(req.op, BlockOp::Read | BlockOp::Write { .. })
        {
            return self.submit_encrypted(req);
        }
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
        if self.inner.fence.is_set() {
            return Err(self.inner.fence.error());
        }
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
            _ if self.is_failed() => format!("FAILED, {failed} failed, {rebuilding} rebuilding"),
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

/// The superblock with the highest generation: the volume as it was last
/// recorded.
pub(crate) fn newest_superblock(sbs: &[Option<Superblock>]) -> Result<Superblock, VolumeError> {
    sbs.iter()
        .flatten()
        .max_by_key(|sb| sb.generation)
        .cloned()
        .ok_or_else(|| VolumeError::Config("no member has a readable superblock".into()))
}

//! Block devices behind namespaces and volumes.
//!
//! The target speaks to storage only through [`BlockDevice`]. A request owns its
//! data buffer ([`AlignedBuf`]) for the whole I/O and gets it back in [`IoDone`],
//! so a backend that hands the buffer to the kernel (io_uring, O_DIRECT) never
//! races a caller that gave up waiting. Backends that finish at once (RAM, null)
//! return [`IoFuture::Ready`], which costs no allocation.

mod buf;
mod check;
pub mod file;
mod forward;
pub mod mem;
pub mod null;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

pub use buf::{AlignedBuf, SharedBuf, SplitBuf, VIEW_ALIGN};
pub use check::{Checked, IoCheck};
pub use file::{FileDevice, FileOptions};
pub use mem::{MemAllocation, MemDevice};
pub use null::NullDevice;

/// Size of a device: logical block size in bytes and number of blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub block_size: u32,
    pub num_blocks: u64,
}

impl Geometry {
    pub fn size_bytes(&self) -> u64 {
        self.num_blocks * u64::from(self.block_size)
    }

    /// Checks a backend's configured size and block size; `what` names the device
    /// in the error (e.g. `"mem device"` or a path).
    pub(crate) fn checked(
        what: &str,
        size_bytes: u64,
        block_size: u32,
    ) -> Result<Geometry, BlockError> {
        if block_size != 512 && block_size != 4096 {
            return Err(BlockError::Config(format!(
                "{what}: block_size = {block_size} is not supported; use 512 or 4096"
            )));
        }
        let bs = u64::from(block_size);
        if size_bytes == 0 || !size_bytes.is_multiple_of(bs) {
            let suggest = size_bytes.max(1).next_multiple_of(bs);
            return Err(BlockError::Config(format!(
                "{what}: size = {size_bytes} bytes is not a non-zero multiple of block_size {block_size}; \
                 use a multiple such as {suggest}"
            )));
        }
        Ok(Geometry {
            block_size,
            num_blocks: size_bytes / bs,
        })
    }
}

/// `1 GiB`, `512 MiB`, `12 KiB`, `100 bytes`: the largest unit that divides evenly.
pub(crate) fn human_size(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    for (unit, name) in UNITS {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{} {name}", bytes / unit);
        }
    }
    if bytes >= 1 << 20 {
        return format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64);
    }
    format!("{bytes} bytes")
}

/// What a request asks of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockOp {
    /// Fill `buf[..blocks * block_size]` from `lba`.
    Read,
    /// Store `buf[..blocks * block_size]` at `lba`; `fua` makes it durable before completion.
    Write { fua: bool },
    /// Make every completed write durable. `lba`/`blocks` are ignored.
    Flush,
    /// Make `blocks` blocks from `lba` read back as zeroes. The buffer is not used.
    WriteZeroes,
    /// The host no longer needs these blocks; they read back as zeroes afterwards
    /// (we advertise DLFEAT "reads return zeroes" only where the backend keeps that promise).
    Deallocate,
}

/// One I/O. `buf` must hold at least `blocks * block_size` bytes for reads and writes.
#[derive(Debug)]
pub struct IoRequest {
    pub op: BlockOp,
    pub lba: u64,
    pub blocks: u32,
    pub buf: AlignedBuf,
}

/// A finished I/O: the buffer comes back with the outcome.
#[derive(Debug)]
pub struct IoDone {
    pub buf: AlignedBuf,
    pub result: Result<(), BlockError>,
}

#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    #[error("LBA range {lba}+{blocks} is beyond the device's {num_blocks} blocks")]
    OutOfRange {
        lba: u64,
        blocks: u64,
        num_blocks: u64,
    },
    #[error("buffer of {have} bytes is smaller than the {need} bytes the request moves")]
    BufferTooSmall { have: usize, need: usize },
    #[error("device has no space left")]
    NoSpace,
    /// A write to a read-only device (a snapshot): NVMe "Namespace Is
    /// Write Protected".
    #[error("read-only: {0}")]
    ReadOnly(String),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Config(String),
    /// A reservation held by another host refused this access (NVMe
    /// Reservation Conflict from a remote drive).
    #[error("reservation conflict: {0}")]
    ReservationConflict(String),
    /// The device's owner was fenced: another owner preempted its
    /// reservation on a member, so this node must not write any more.
    #[error("fenced: {0}")]
    Fenced(String),
    /// A remote device stayed unreachable past its limit.
    #[error("{what} unreachable for {after_ms} ms: {why}")]
    Unreachable {
        what: String,
        after_ms: u64,
        why: String,
    },
    /// A remote namespace is no longer the one that was attached (its
    /// NGUID/UUID changed): a reconnect must never land on another drive.
    #[error("{0}")]
    IdentityChanged(String),
    /// More members failed than the layout tolerates.
    #[error(
        "volume {volume} has {} failed members ({failed:?}); {layout} tolerates {tolerates}",
        failed.len()
    )]
    TooManyFailed {
        volume: String,
        layout: String,
        failed: Vec<usize>,
        tolerates: usize,
    },
}

/// The future a device returns for one request.
pub enum IoFuture {
    Ready(Option<IoDone>),
    Pending(Pin<Box<dyn Future<Output = IoDone> + Send>>),
    /// Pending, with the completion checks of the wrappers it passed
    /// ([`IoFuture::then_check`]).
    Checked(Checked),
}

impl IoFuture {
    pub fn ready(buf: AlignedBuf, result: Result<(), BlockError>) -> Self {
        IoFuture::Ready(Some(IoDone { buf, result }))
    }
}

impl Future for IoFuture {
    type Output = IoDone;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<IoDone> {
        match self.get_mut() {
            IoFuture::Ready(done) => {
                Poll::Ready(done.take().expect("IoFuture polled after completion"))
            }
            IoFuture::Pending(fut) => fut.as_mut().poll(cx),
            IoFuture::Checked(c) => Pin::new(c).poll(cx),
        }
    }
}

/// A store of fixed-size blocks: RAM, a file, a block device, a volume, a remote namespace.
pub trait BlockDevice: Send + Sync + 'static {
    fn geometry(&self) -> Geometry;
    /// Starts one I/O. Range and buffer checks are the device's job too: a bad
    /// request completes with an error, it never panics.
    fn submit(&self, req: IoRequest) -> IoFuture;
    /// A hint that a read or write of `blocks` blocks from `lba` will be
    /// submitted soon, e.g. for the other commands of a batch just received. A
    /// RAM device starts loading the first cache lines, so that the misses of
    /// several I/Os overlap. Never fails (a bad range is ignored) and does
    /// nothing by default.
    fn prefetch(&self, _lba: u64, _blocks: u32) {}
    /// Whether deallocated blocks read back as zeroes (reported to hosts in DLFEAT).
    fn deallocate_reads_zeroes(&self) -> bool;
    /// Blocks that hold storage now, for a thin device (Identify Namespace
    /// NUSE, with NSFEAT thin provisioning). None: fully provisioned.
    fn allocated_blocks(&self) -> Option<u64> {
        None
    }
    /// Whether writes are refused ([`BlockError::ReadOnly`]), e.g. a
    /// snapshot; reported to hosts as a write-protected namespace (NSATTR).
    fn read_only(&self) -> bool {
        false
    }
    /// One line for logs and the startup banner, e.g. `file /var/lib/x.img (O_DIRECT, io_uring)`.
    fn describe(&self) -> String;
    /// Flush and release at shutdown. Called once; I/O after it is not allowed.
    fn shutdown(&self) -> Result<(), BlockError> {
        Ok(())
    }
    /// Whether this device keeps small records in its own metadata (see
    /// `load_record`), so that state kept there survives a restart with the data.
    fn keeps_records(&self) -> bool {
        false
    }
    /// The record of `kind` kept in the device's own metadata, if any. These
    /// records travel with the data (a file, a volume's members), never in a
    /// side file that could go stale.
    fn load_record(&self, _kind: RecordKind) -> Result<Option<Vec<u8>>, BlockError> {
        Ok(None)
    }
    /// Replaces the record of `kind` durably and atomically (after a crash
    /// the old or the new record is found, never a mix), at most
    /// `RECORD_MAX` bytes. Synchronous: callers are rare control commands.
    fn store_record(&self, kind: RecordKind, _data: &[u8]) -> Result<(), BlockError> {
        Err(BlockError::Config(format!(
            "{} keeps no {kind:?} record",
            self.describe()
        )))
    }
}

/// What a device-kept record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// NVMe reservations and registrations with Persist Through Power Loss.
    Reservations,
}

/// Largest record `store_record` accepts.
pub const RECORD_MAX: usize = 2048;

/// Checks `lba + blocks` against the geometry and the buffer; every backend calls it first.
pub fn check_request(geo: Geometry, req: &IoRequest) -> Result<(), BlockError> {
    if matches!(req.op, BlockOp::Flush) {
        return Ok(());
    }
    let end = req.lba.checked_add(u64::from(req.blocks));
    if end.is_none_or(|e| e > geo.num_blocks) {
        return Err(BlockError::OutOfRange {
            lba: req.lba,
            blocks: u64::from(req.blocks),
            num_blocks: geo.num_blocks,
        });
    }
    if matches!(req.op, BlockOp::Read | BlockOp::Write { .. }) {
        let need = req.blocks as usize * geo.block_size as usize;
        if req.buf.len() < need {
            return Err(BlockError::BufferTooSmall {
                have: req.buf.len(),
                need,
            });
        }
    }
    Ok(())
}

struct ThreadWaker(std::thread::Thread);

impl std::task::Wake for ThreadWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.0.unpark();
    }
}

std::thread_local! {
    /// How deep this thread is in [`block_on`].
    static BLOCKED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether this thread is inside [`block_on`]: it runs nothing else until
/// that returns, so a device must not hand the I/O it starts now to work
/// that only this thread drives (a connection task bound to this thread's
/// runtime): the I/O would never complete.
pub fn in_block_on() -> bool {
    BLOCKED.with(|b| b.get() > 0)
}

/// Runs a future to completion on the current thread, parking between
/// polls. For rare synchronous calls (`store_record`) over devices whose I/O
/// completes on their own threads, and for tests.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    struct Depth;
    impl Drop for Depth {
        fn drop(&mut self) {
            BLOCKED.with(|b| b.set(b.get() - 1));
        }
    }
    BLOCKED.with(|b| b.set(b.get() + 1));
    let _depth = Depth;
    let mut fut = std::pin::pin!(fut);
    let waker = std::task::Waker::from(std::sync::Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

/// Test helpers (executor, RNG, backend checks), also for crates built on blockdev.
#[cfg(any(test, feature = "testutil"))]
pub mod testutil;

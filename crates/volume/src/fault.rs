//! A member wrapper that injects faults: a drive that dies after N writes, or
//! a power cut that silently drops every write after a shared crash point.
//! Used by the tests here and meant for integration tests elsewhere.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};

use blockdev::{BlockDevice, BlockError, BlockOp, IoFuture, IoRequest};

/// A power cut shared by several members: writes (of any member sharing it)
/// numbered at or past the crash point complete successfully but are not
/// stored, as if the machine lost power with them in flight.
#[derive(Debug)]
pub struct CrashSwitch {
    writes: AtomicU64,
    crash_at: AtomicU64,
    dropped: AtomicU64,
}

impl Default for CrashSwitch {
    fn default() -> Self {
        CrashSwitch {
            writes: AtomicU64::new(0),
            crash_at: AtomicU64::new(u64::MAX),
            dropped: AtomicU64::new(0),
        }
    }
}

impl CrashSwitch {
    pub fn new() -> Arc<CrashSwitch> {
        Arc::new(CrashSwitch::default())
    }
    /// Drops every write after `more` further writes.
    pub fn arm(&self, more: u64) {
        let now = self.writes.load(Ordering::SeqCst);
        self.crash_at.store(now + more, Ordering::SeqCst);
    }
    /// Whether any write has been dropped yet.
    pub fn crashed(&self) -> bool {
        self.dropped.load(Ordering::SeqCst) > 0
    }
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::SeqCst)
    }
    /// Returns true when this write must be dropped.
    fn take(&self) -> bool {
        let n = self.writes.fetch_add(1, Ordering::SeqCst);
        if n >= self.crash_at.load(Ordering::SeqCst) {
            self.dropped.fetch_add(1, Ordering::SeqCst);
            true
        } else {
            false
        }
    }
}

/// I/O counts of one member, for tests that check how many reads a write cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    pub reads: u64,
    pub read_blocks: u64,
    pub writes: u64,
    pub write_blocks: u64,
    pub flushes: u64,
    pub fua_writes: u64,
}

/// Wraps a member and fails or drops its I/O on command.
pub struct FaultDevice {
    inner: Arc<dyn BlockDevice>,
    crash: Option<Arc<CrashSwitch>>,
    failed: AtomicBool,
    /// Every I/O answers Reservation Conflict (another host preempted us).
    conflict: AtomicBool,
    /// Every I/O answers Unreachable (a remote drive gone quiet).
    unreachable: AtomicBool,
    /// The member dies when its write count reaches this.
    fail_at_write: AtomicU64,
    reads: AtomicU64,
    read_blocks: AtomicU64,
    writes: AtomicU64,
    write_blocks: AtomicU64,
    flushes: AtomicU64,
    fua_writes: AtomicU64,
    /// Completions yield to the executor up to this many times.
    max_yields: AtomicU32,
    rng: AtomicU64,
    /// I/O submitted while set completes only once it is cleared.
    hung: Arc<Hung>,
    /// The member hangs when its write count reaches this.
    hang_at_write: AtomicU64,
}

/// A hung device's gate: the completions waiting for it to clear.
#[derive(Default)]
struct Hung {
    on: AtomicBool,
    waiting: parking_lot::Mutex<Vec<std::task::Waker>>,
}

/// An I/O of a hung device: done at submit, answered once the gate clears.
struct HeldIo {
    io: IoFuture,
    hung: Arc<Hung>,
}

impl Future for HeldIo {
    type Output = blockdev::IoDone;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.hung.on.load(Ordering::SeqCst) {
            let mut waiting = self.hung.waiting.lock();
            if !waiting.iter().any(|w| w.will_wake(cx.waker())) {
                waiting.push(cx.waker().clone());
            }
            drop(waiting);
            // Cleared between the check and the push: not lost.
            if self.hung.on.load(Ordering::SeqCst) {
                return Poll::Pending;
            }
        }
        Pin::new(&mut self.io).poll(cx)
    }
}

/// Completes an I/O only after yielding `left` times, so concurrent requests
/// interleave at member I/O even on RAM members.
struct Yielding {
    io: IoFuture,
    left: u32,
}

impl Future for Yielding {
    type Output = blockdev::IoDone;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.left > 0 {
            self.left -= 1;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        Pin::new(&mut self.io).poll(cx)
    }
}

impl FaultDevice {
    pub fn new(inner: Arc<dyn BlockDevice>) -> Arc<FaultDevice> {
        Self::build(inner, None)
    }

    /// A member whose writes stop landing when `crash` fires.
    pub fn with_crash(inner: Arc<dyn BlockDevice>, crash: Arc<CrashSwitch>) -> Arc<FaultDevice> {
        Self::build(inner, Some(crash))
    }

    fn build(inner: Arc<dyn BlockDevice>, crash: Option<Arc<CrashSwitch>>) -> Arc<FaultDevice> {
        Arc::new(FaultDevice {
            inner,
            crash,
            failed: AtomicBool::new(false),
            conflict: AtomicBool::new(false),
            unreachable: AtomicBool::new(false),
            fail_at_write: AtomicU64::new(u64::MAX),
            reads: AtomicU64::new(0),
            read_blocks: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            write_blocks: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            fua_writes: AtomicU64::new(0),
            max_yields: AtomicU32::new(0),
            rng: AtomicU64::new(0x9E37_79B9_7F4A_7C15),
            hung: Arc::default(),
            hang_at_write: AtomicU64::new(u64::MAX),
        })
    }

    /// Each I/O completes after 0..=`max` yields to the executor (the I/O
    /// itself happens at submit, as a drive's DMA does before its completion).
    pub fn set_yields(&self, max: u32, seed: u64) {
        self.max_yields.store(max, Ordering::SeqCst);
        self.rng.store(seed | 1, Ordering::SeqCst);
    }

    fn yields(&self) -> u32 {
        let max = self.max_yields.load(Ordering::Relaxed);
        if max == 0 {
            return 0;
        }
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.store(x, Ordering::Relaxed);
        (x % u64::from(max + 1)) as u32
    }

    fn deliver(&self, io: IoFuture) -> IoFuture {
        let io = if self.hung.on.load(Ordering::SeqCst) {
            IoFuture::Pending(Box::pin(HeldIo {
                io,
                hung: self.hung.clone(),
            }))
        } else {
            io
        };
        match self.yields() {
            0 => io,
            left => IoFuture::Pending(Box::pin(Yielding { io, left })),
        }
    }

    /// From its `n`th write on (0: the next one), the device answers no
    /// I/O until [`FaultDevice::unhang`], as a drive that stopped completing
    /// commands (each I/O is done at submit; only its answer waits).
    pub fn hang_after_writes(&self, n: u64) {
        let done = self.writes.load(Ordering::SeqCst);
        self.hang_at_write.store(done + n, Ordering::SeqCst);
    }

    /// Whether it hangs now.
    pub fn is_hung(&self) -> bool {
        self.hung.on.load(Ordering::SeqCst)
    }

    /// Answers the I/O held since it hung.
    pub fn unhang(&self) {
        self.hung.on.store(false, Ordering::SeqCst);
        for w in self.hung.waiting.lock().drain(..) {
            w.wake();
        }
    }

    /// Every I/O from now on fails, as from a pulled drive.
    pub fn fail_now(&self) {
        self.failed.store(true, Ordering::SeqCst);
    }
    /// The drive dies after `n` more writes.
    pub fn fail_after_writes(&self, n: u64) {
        let now = self.writes.load(Ordering::SeqCst);
        self.fail_at_write.store(now + n, Ordering::SeqCst);
    }
    /// Every I/O from now on answers Reservation Conflict, as a remote
    /// drive does once another host preempted this one's reservation.
    pub fn reservation_conflict_now(&self) {
        self.conflict.store(true, Ordering::SeqCst);
    }
    /// Every I/O from now on answers Unreachable, as a remote drive whose
    /// connection stayed down past its limit.
    pub fn unreachable_now(&self) {
        self.unreachable.store(true, Ordering::SeqCst);
    }
    pub fn heal(&self) {
        self.conflict.store(false, Ordering::SeqCst);
        self.unreachable.store(false, Ordering::SeqCst);
        self.failed.store(false, Ordering::SeqCst);
        self.fail_at_write.store(u64::MAX, Ordering::SeqCst);
    }
    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }
    pub fn inner(&self) -> &Arc<dyn BlockDevice> {
        &self.inner
    }
    pub fn stats(&self) -> FaultStats {
        FaultStats {
            reads: self.reads.load(Ordering::SeqCst),
            read_blocks: self.read_blocks.load(Ordering::SeqCst),
            writes: self.writes.load(Ordering::SeqCst),
            write_blocks: self.write_blocks.load(Ordering::SeqCst),
            flushes: self.flushes.load(Ordering::SeqCst),
            fua_writes: self.fua_writes.load(Ordering::SeqCst),
        }
    }
}

impl BlockDevice for FaultDevice {
    // Kept as the trait's defaults: `shutdown` (the inner device is shared
    // with the test, which may go on using it after a volume over this one
    // closes) and `allocated_blocks` (None: a namespace over it reports as
    // before, not thin).
    blockdev::forward_block_device!(self => self.inner, except [
        submit,
        describe,
        shutdown,
        allocated_blocks,
    ]);

    fn submit(&self, req: IoRequest) -> IoFuture {
        let is_write = matches!(
            req.op,
            BlockOp::Write { .. } | BlockOp::WriteZeroes | BlockOp::Deallocate
        );
        if is_write {
            let n = self.writes.fetch_add(1, Ordering::SeqCst);
            self.write_blocks
                .fetch_add(u64::from(req.blocks), Ordering::SeqCst);
            if matches!(req.op, BlockOp::Write { fua: true }) {
                self.fua_writes.fetch_add(1, Ordering::SeqCst);
            }
            if n >= self.fail_at_write.load(Ordering::SeqCst) {
                self.failed.store(true, Ordering::SeqCst);
            }
            if n >= self.hang_at_write.load(Ordering::SeqCst) {
                self.hang_at_write.store(u64::MAX, Ordering::SeqCst);
                self.hung.on.store(true, Ordering::SeqCst);
            }
        } else if req.op == BlockOp::Read {
            self.reads.fetch_add(1, Ordering::SeqCst);
            self.read_blocks
                .fetch_add(u64::from(req.blocks), Ordering::SeqCst);
        } else {
            self.flushes.fetch_add(1, Ordering::SeqCst);
        }
        if self.conflict.load(Ordering::SeqCst) {
            let err = BlockError::ReservationConflict("injected: preempted by another host".into());
            return self.deliver(IoFuture::ready(req.buf, Err(err)));
        }
        if self.unreachable.load(Ordering::SeqCst) {
            let err = BlockError::Unreachable {
                what: "injected remote member".into(),
                after_ms: 1000,
                why: "connection refused".into(),
            };
            return self.deliver(IoFuture::ready(req.buf, Err(err)));
        }
        if self.failed.load(Ordering::SeqCst) {
            let err = BlockError::Io(std::io::Error::other("injected member failure"));
            return self.deliver(IoFuture::ready(req.buf, Err(err)));
        }
        if is_write && self.crash.as_ref().is_some_and(|c| c.take()) {
            return self.deliver(IoFuture::ready(req.buf, Ok(())));
        }
        self.deliver(self.inner.submit(req))
    }

    fn describe(&self) -> String {
        format!("fault-injecting {}", self.inner.describe())
    }
}

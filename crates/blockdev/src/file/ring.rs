//! The io_uring half of a [`FileDevice`](super::FileDevice): the ring shared
//! by submitters and the reaper thread, the heap `Record` each request lives
//! in while the kernel works on it, and the reaper that completes them
//! (short transfers, retries and the WriteZeroes/Deallocate fallbacks).

use std::collections::VecDeque;
use std::fs::File;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};
use std::task::{Context, Poll, Waker};

use io_uring::{IoUring, opcode, squeue, types};
use parking_lot::{Mutex, RwLock};

use super::open::{BLKDISCARD, Kind, errno_error, last_errno, shut_down};
use crate::{
    AlignedBuf, BlockError, BlockOp, Geometry, IoDone, IoFuture, IoRequest, check_request,
};

/// Submission queue depth; more requests than this in flight just means a
/// submitter flushes the queue to the kernel before pushing.
pub(super) const SQ_ENTRIES: u32 = 256;
/// Completion queue depth (the kernel also buffers overflow, IORING_FEAT_NODROP).
const CQ_ENTRIES: u32 = 4096;
/// Size of the shared zero buffer used when WriteZeroes falls back to writes.
pub(super) const ZERO_CHUNK: usize = 1 << 20;
/// Largest single read/write SQE (its length field is 32 bits); bigger requests
/// go through in pieces, like short transfers.
const MAX_SQE_BYTES: usize = 1 << 30;
/// Retries of one SQE that failed with EAGAIN/EINTR before giving up.
const MAX_RETRIES: u8 = 8;
/// `user_data` of the NOP that wakes the reaper to stop; records are never at 0.
const WAKE_USER_DATA: u64 = 0;

/// State shared by submitters and the reaper thread.
pub(super) struct Inner {
    ring: IoUring,
    /// Guards the submission queue (single producer). The bool: shut down, no new requests.
    sq: Mutex<bool>,
    /// False while the reaper is (about to be) blocked in `io_uring_enter`: a
    /// submitter must then enter the kernel itself for its SQE to be seen.
    reaper_awake: AtomicBool,
    /// Records handed to the kernel and not yet completed to their slot.
    in_flight: AtomicUsize,
    /// Set by shutdown/drop: the reaper exits once `in_flight` is zero.
    stop: AtomicBool,
    /// Raw descriptor of `file`, used in SQEs; valid while `file` is `Some`,
    /// which it stays until shutdown has drained every request.
    fd: RawFd,
    pub(super) file: RwLock<Option<File>>,
    kind: Kind,
    pub(super) geo: Geometry,
    /// FALLOC_FL_ZERO_RANGE works; cleared on the first EOPNOTSUPP.
    pub(super) zero_range: AtomicBool,
    /// Punching holes works, so deallocated blocks read back as zeroes.
    pub(super) punch_hole: bool,
    /// Source for WriteZeroes when it has to write (never written to).
    zeroes: AlignedBuf,
}

/// What a record asks of the kernel, and how to carry on after a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RecOp {
    Read,
    /// `dsync`: FUA, done as RWF_DSYNC on this write.
    Write {
        dsync: bool,
    },
    Fsync,
    /// fallocate(ZERO_RANGE); becomes `WriteZeroes` where that is unsupported.
    ZeroRange,
    /// fallocate(PUNCH_HOLE); becomes `WriteZeroes` where that is unsupported.
    PunchHole,
    /// Plain writes from the shared zero buffer, ZERO_CHUNK at a time.
    WriteZeroes,
}

/// One request while the kernel works on it. Owns the caller's buffer.
struct Record {
    op: RecOp,
    buf: AlignedBuf,
    /// Device byte offset of the whole request.
    offset: u64,
    /// Bytes the request moves (or zeroes).
    len: usize,
    /// Bytes already done; a short transfer resubmits from here.
    done: usize,
    retries: u8,
    slot: Arc<Slot>,
}

/// Where the reaper leaves the outcome for the caller's future.
#[derive(Default)]
struct Slot {
    state: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    done: Option<IoDone>,
    waker: Option<Waker>,
}

impl Slot {
    fn complete(&self, done: IoDone) {
        let waker = {
            let mut st = self.state.lock();
            st.done = Some(done);
            st.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

struct PendingIo {
    slot: Arc<Slot>,
}

impl Future for PendingIo {
    type Output = IoDone;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<IoDone> {
        let mut st = self.slot.state.lock();
        if let Some(done) = st.done.take() {
            return Poll::Ready(done);
        }
        match &st.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => st.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl Record {
    /// The SQE for the next piece of this record (`done..` of `len`).
    fn entry(&mut self, fd: RawFd, zeroes: &AlignedBuf) -> squeue::Entry {
        let fd = types::Fd(fd);
        let at = self.offset + self.done as u64;
        let rest = self.len - self.done;
        match self.op {
            RecOp::Read => {
                let n = rest.min(MAX_SQE_BYTES);
                // SAFETY: done < len <= buf.len(), so the pointer stays inside the buffer.
                let ptr = unsafe { self.buf.as_mut_ptr().add(self.done) };
                opcode::Read::new(fd, ptr, n as u32).offset(at).build()
            }
            RecOp::Write { dsync } => {
                let n = rest.min(MAX_SQE_BYTES);
                // SAFETY: as for reads.
                let ptr = unsafe { self.buf.as_ptr().add(self.done) };
                opcode::Write::new(fd, ptr, n as u32)
                    .offset(at)
                    .rw_flags(if dsync { libc::RWF_DSYNC } else { 0 })
                    .build()
            }
            RecOp::WriteZeroes => {
                let n = rest.min(zeroes.len());
                opcode::Write::new(fd, zeroes.as_ptr(), n as u32)
                    .offset(at)
                    .build()
            }
            RecOp::Fsync => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            RecOp::ZeroRange => opcode::Fallocate::new(fd, rest as u64)
                .offset(at)
                .mode(libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE)
                .build(),
            RecOp::PunchHole => opcode::Fallocate::new(fd, rest as u64)
                .offset(at)
                .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
                .build(),
        }
    }
}

impl Inner {
    /// Sets up the ring for the open `file`; the caller starts the reaper.
    pub(super) fn new(
        shown: &str,
        file: File,
        kind: Kind,
        geo: Geometry,
        punch_hole: bool,
    ) -> Result<Arc<Inner>, BlockError> {
        let ring = IoUring::builder()
            .setup_cqsize(CQ_ENTRIES)
            .build(SQ_ENTRIES)
            .map_err(|e| {
                BlockError::Config(format!(
                    "{shown}: cannot set up io_uring: {e}; it may be disabled \
                     (sysctl kernel.io_uring_disabled) or blocked by a seccomp profile"
                ))
            })?;

        let mut zeroes = AlignedBuf::new(ZERO_CHUNK);
        zeroes.set_len(ZERO_CHUNK);
        Ok(Arc::new(Inner {
            ring,
            sq: Mutex::new(false),
            reaper_awake: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            fd: file.as_raw_fd(),
            file: RwLock::new(Some(file)),
            kind,
            geo,
            zero_range: AtomicBool::new(true),
            punch_hole,
            zeroes,
        }))
    }

    /// No new requests; the reaper exits once in-flight I/O is done.
    pub(super) fn request_stop(&self) {
        *self.sq.lock() = true;
        self.stop.store(true, Ordering::SeqCst);
        self.wake_reaper();
    }

    /// Turns a request into a record and queues it (or answers at once).
    pub(super) fn submit(&self, req: IoRequest) -> IoFuture {
        let inner = self;
        if let Err(e) = check_request(inner.geo, &req) {
            return IoFuture::ready(req.buf, Err(e));
        }
        let bs = u64::from(inner.geo.block_size);
        // Flush ignores lba/blocks, which need not be in range.
        let (offset, len) = match req.op {
            BlockOp::Flush => (0, 0),
            _ => (req.lba * bs, (u64::from(req.blocks) * bs) as usize),
        };
        if len == 0 && req.op != BlockOp::Flush {
            return IoFuture::ready(req.buf, Ok(()));
        }
        let op = match req.op {
            BlockOp::Read => RecOp::Read,
            BlockOp::Write { fua } => RecOp::Write { dsync: fua },
            BlockOp::Flush => RecOp::Fsync,
            BlockOp::WriteZeroes if inner.kind == Kind::BlockDevice => {
                // fallocate(ZERO_RANGE) on a block device is blkdev_issue_zeroout, what
                // BLKZEROOUT does, but asynchronous here.
                RecOp::ZeroRange
            }
            BlockOp::WriteZeroes if inner.zero_range.load(Ordering::Relaxed) => RecOp::ZeroRange,
            BlockOp::WriteZeroes => RecOp::WriteZeroes,
            BlockOp::Deallocate if inner.kind == Kind::BlockDevice => {
                let result = inner.discard(offset, len as u64);
                return IoFuture::ready(req.buf, result);
            }
            BlockOp::Deallocate if inner.punch_hole => RecOp::PunchHole,
            // Advisory, and we did not promise zeroes: nothing to do.
            BlockOp::Deallocate => return IoFuture::ready(req.buf, Ok(())),
        };
        let slot = Arc::new(Slot::default());
        let rec = Box::new(Record {
            op,
            buf: req.buf,
            offset,
            len,
            done: 0,
            retries: 0,
            slot: Arc::clone(&slot),
        });
        match inner.push_fresh(rec) {
            Ok(()) => IoFuture::Pending(Box::pin(PendingIo { slot })),
            Err(rec) => IoFuture::ready(rec.buf, Err(shut_down())),
        }
    }

    /// Queues a new request's first SQE; gives the record back once shut down.
    fn push_fresh(&self, mut rec: Box<Record>) -> Result<(), Box<Record>> {
        let closed = self.sq.lock();
        if *closed {
            return Err(rec);
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        while let Err(back) = self.try_push_locked(rec) {
            rec = back;
            // Full: hand what is queued to the kernel to make room.
            self.enter_submit();
        }
        drop(closed);
        // Pairs with the reaper's fence: either it sees our SQE when it next enters
        // the kernel, or we see that it is asleep and enter ourselves.
        fence(Ordering::SeqCst);
        if !self.reaper_awake.load(Ordering::SeqCst) {
            self.enter_submit();
        }
        Ok(())
    }

    /// From the reaper: queues the next SQE of an accepted request. If the queue
    /// stays full (the kernel is pushing back), the record comes back to be
    /// retried after the next wait, instead of spinning on the thread that
    /// would drain the completions.
    fn push_again(&self, rec: Box<Record>) -> Result<(), Box<Record>> {
        let _guard = self.sq.lock();
        match self.try_push_locked(rec) {
            Ok(()) => Ok(()),
            Err(rec) => {
                self.enter_submit();
                self.try_push_locked(rec)
            }
        }
    }

    /// Pushes the record's next SQE; the caller holds the `sq` lock.
    fn try_push_locked(&self, mut rec: Box<Record>) -> Result<(), Box<Record>> {
        let entry = rec.entry(self.fd, &self.zeroes);
        let raw = Box::into_raw(rec);
        let entry = entry.user_data(raw as u64);
        // SAFETY: the caller holds the `sq` mutex, so this is the only SubmissionQueue.
        let mut sq = unsafe { self.ring.submission_shared() };
        // SAFETY: the SQE points into the record's own buffer (or the device's zero
        // buffer). The record stays alive and unmoved until the reaper takes it back
        // from user_data after the completion; the zero buffer lives in `Inner`, which
        // the reaper keeps alive until every record is done.
        if unsafe { sq.push(&entry) }.is_ok() {
            sq.sync();
            return Ok(());
        }
        // SAFETY: the push failed, so the kernel never saw `raw`; we own it again.
        Err(unsafe { Box::from_raw(raw) })
    }

    fn enter_submit(&self) {
        loop {
            match self.ring.submitter().submit() {
                Ok(_) => return,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                // EBUSY/EAGAIN: completions are backed up; the reaper is about to
                // drain them and submits the queue on its next enter.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EAGAIN)) => return,
                Err(e) => {
                    tracing::error!(error = %e, "io_uring submit failed");
                    return;
                }
            }
        }
    }

    /// Queues a NOP so a reaper blocked in the kernel wakes up and checks `stop`.
    fn wake_reaper(&self) {
        let nop = opcode::Nop::new().build().user_data(WAKE_USER_DATA);
        {
            let _guard = self.sq.lock();
            loop {
                // SAFETY: the `sq` mutex is held: the only SubmissionQueue.
                let mut sq = unsafe { self.ring.submission_shared() };
                // SAFETY: a NOP references no memory.
                if unsafe { sq.push(&nop) }.is_ok() {
                    sq.sync();
                    break;
                }
                drop(sq);
                self.enter_submit();
            }
        }
        self.enter_submit();
    }

    /// The reaper thread: submit what is queued, wait for completions, finish records.
    pub(super) fn reap(self: Arc<Self>) {
        // Follow-up SQEs the full queue did not take yet (rare).
        let mut backlog: VecDeque<Box<Record>> = VecDeque::new();
        loop {
            self.reaper_awake.store(false, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if self.stop.load(Ordering::SeqCst) && self.in_flight.load(Ordering::SeqCst) == 0 {
                break;
            }
            if let Err(e) = self.ring.submitter().submit_and_wait(1)
                && !matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)
                )
            {
                tracing::error!(error = %e, "io_uring wait failed");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            self.reaper_awake.store(true, Ordering::SeqCst);
            for rec in std::mem::take(&mut backlog) {
                self.resubmit(rec, &mut backlog);
            }
            // SAFETY: only this thread ever takes the completion queue.
            let cq = unsafe { self.ring.completion_shared() };
            for cqe in cq {
                if cqe.user_data() == WAKE_USER_DATA {
                    continue;
                }
                // SAFETY: every other user_data is a Box<Record> leaked in `try_push_locked`,
                // completed exactly once; the kernel is done with its buffers.
                let rec = unsafe { Box::from_raw(cqe.user_data() as *mut Record) };
                self.complete(rec, cqe.result(), &mut backlog);
            }
        }
    }

    /// Handles one completion: finish the record, or resubmit what is left.
    fn complete(&self, mut rec: Box<Record>, res: i32, backlog: &mut VecDeque<Box<Record>>) {
        if res < 0 {
            let errno = -res;
            if matches!(errno, libc::EAGAIN | libc::EINTR) && rec.retries < MAX_RETRIES {
                rec.retries += 1;
                return self.resubmit(rec, backlog);
            }
            if errno == libc::EOPNOTSUPP && rec.op == RecOp::ZeroRange {
                if self.zero_range.swap(false, Ordering::Relaxed) {
                    tracing::info!(
                        "FALLOC_FL_ZERO_RANGE unsupported here; WriteZeroes writes zeroes"
                    );
                }
                rec.op = RecOp::WriteZeroes;
                return self.resubmit(rec, backlog);
            }
            if errno == libc::EOPNOTSUPP && rec.op == RecOp::PunchHole {
                // We promised zeroes after Deallocate; keep the promise by writing them.
                rec.op = RecOp::WriteZeroes;
                return self.resubmit(rec, backlog);
            }
            return self.finish(*rec, Err(errno_error(errno)));
        }
        match rec.op {
            RecOp::Fsync | RecOp::ZeroRange | RecOp::PunchHole => self.finish(*rec, Ok(())),
            RecOp::Read | RecOp::Write { .. } | RecOp::WriteZeroes => {
                if res == 0 {
                    let e = match rec.op {
                        RecOp::Read => io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!(
                                "read hit end of file at byte {}",
                                rec.offset + rec.done as u64
                            ),
                        ),
                        _ => io::Error::new(
                            io::ErrorKind::WriteZero,
                            format!(
                                "write made no progress at byte {}",
                                rec.offset + rec.done as u64
                            ),
                        ),
                    };
                    return self.finish(*rec, Err(BlockError::Io(e)));
                }
                rec.done += res as usize;
                rec.retries = 0;
                if rec.done < rec.len {
                    self.resubmit(rec, backlog)
                } else {
                    self.finish(*rec, Ok(()))
                }
            }
        }
    }

    fn resubmit(&self, rec: Box<Record>, backlog: &mut VecDeque<Box<Record>>) {
        if let Err(rec) = self.push_again(rec) {
            backlog.push_back(rec);
        }
    }

    fn finish(&self, rec: Record, result: Result<(), BlockError>) {
        let Record { buf, slot, .. } = rec;
        slot.complete(IoDone { buf, result });
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    /// BLKDISCARD on a block device. Synchronous: discards are rare and short.
    fn discard(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        let file = self.file.read();
        let Some(file) = file.as_ref() else {
            return Err(shut_down());
        };
        let range = [offset, len];
        // SAFETY: BLKDISCARD reads two u64 (start, length) from the pointer.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKDISCARD as _, range.as_ptr()) };
        if rc < 0 {
            let errno = last_errno();
            // Deallocate is advisory: a device without discard just keeps the data.
            if errno == libc::EOPNOTSUPP {
                return Ok(());
            }
            return Err(errno_error(errno));
        }
        Ok(())
    }
}

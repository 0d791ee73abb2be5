//! File and block-device backend: O_DIRECT I/O through one io_uring per device.
//!
//! Any thread may submit. The submission queue is single-producer, so pushing an
//! SQE happens under a small mutex; one reaper thread per device waits in
//! `io_uring_enter` for completions and, each time it wakes, also hands the
//! kernel whatever SQEs were queued meanwhile. A submitter makes the syscall
//! itself only when the reaper is asleep in the kernel, so under load many
//! requests share one `io_uring_enter`.
//!
//! Each request lives in a heap `Record` that owns its [`AlignedBuf`] while the
//! kernel may touch it; the SQE's `user_data` is the record's address. The
//! caller's future only holds the `Slot` the reaper fills in, so a dropped
//! future cannot free memory the kernel is still writing.

use std::collections::VecDeque;
use std::ffi::CStr;
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;

use io_uring::{IoUring, opcode, squeue, types};
use parking_lot::{Mutex, RwLock};

use crate::{
    AlignedBuf, BlockDevice, BlockError, BlockOp, Geometry, IoDone, IoFuture, IoRequest,
    RECORD_MAX, RecordKind, check_request, human_size,
};

/// Submission queue depth; more requests than this in flight just means a
/// submitter flushes the queue to the kernel before pushing.
const SQ_ENTRIES: u32 = 256;
/// Completion queue depth (the kernel also buffers overflow, IORING_FEAT_NODROP).
const CQ_ENTRIES: u32 = 4096;
/// Size of the shared zero buffer used when WriteZeroes falls back to writes.
const ZERO_CHUNK: usize = 1 << 20;
/// Largest single read/write SQE (its length field is 32 bits); bigger requests
/// go through in pieces, like short transfers.
const MAX_SQE_BYTES: usize = 1 << 30;
/// Retries of one SQE that failed with EAGAIN/EINTR before giving up.
const MAX_RETRIES: u8 = 8;
/// `user_data` of the NOP that wakes the reaper to stop; records are never at 0.
const WAKE_USER_DATA: u64 = 0;

// <linux/fs.h> block-device ioctls (the `_IO`/`_IOR` encodings of x86-64 and arm64).
const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKDISCARD: libc::c_ulong = 0x1277;
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

/// Where a [`FileDevice`] keeps its blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileOptions {
    /// A regular file or a block device (`/dev/nvme0n1`).
    pub path: PathBuf,
    /// Bytes to use. `None`: the whole file or device. Required when `create`
    /// makes a new file. Never grows an existing file.
    pub size: Option<u64>,
    /// Logical block size, 512 or 4096.
    pub block_size: u32,
    /// Create the file (with `size`) if it does not exist.
    pub create: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    BlockDevice,
}

/// A file or block device served through io_uring, O_DIRECT where the
/// filesystem allows it.
pub struct FileDevice {
    inner: Arc<Inner>,
    reaper: Mutex<Option<JoinHandle<()>>>,
    describe: String,
    path: PathBuf,
    /// Whether device-kept records work here; the error says why not.
    records: Result<(), String>,
}

/// State shared by submitters and the reaper thread.
struct Inner {
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
    file: RwLock<Option<File>>,
    kind: Kind,
    geo: Geometry,
    /// FALLOC_FL_ZERO_RANGE works; cleared on the first EOPNOTSUPP.
    zero_range: AtomicBool,
    /// Punching holes works, so deallocated blocks read back as zeroes.
    punch_hole: bool,
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

fn config(msg: String) -> BlockError {
    BlockError::Config(msg)
}

fn errno_error(errno: i32) -> BlockError {
    if errno == libc::ENOSPC {
        BlockError::NoSpace
    } else {
        BlockError::Io(io::Error::from_raw_os_error(errno))
    }
}

fn last_errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

impl FileDevice {
    /// Opens (or creates) the file or block device `opts.path` with O_DIRECT,
    /// falling back to buffered I/O where the filesystem refuses O_DIRECT.
    pub fn open(opts: FileOptions) -> Result<FileDevice, BlockError> {
        Self::open_with(opts, true)
    }

    /// `try_direct: false` skips O_DIRECT, as if the filesystem refused it (tests).
    fn open_with(opts: FileOptions, try_direct: bool) -> Result<FileDevice, BlockError> {
        let path = opts.path.as_path();
        let shown = path.display();
        let bs = u64::from(opts.block_size);
        if let Some(size) = opts.size {
            Geometry::checked(&shown.to_string(), size, opts.block_size)?;
        } else {
            // Only the block size: the size is checked once known.
            Geometry::checked(&shown.to_string(), bs, opts.block_size)?;
        }

        let meta = match std::fs::metadata(path) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(config(format!("{shown}: cannot stat: {e}"))),
        };
        let kind = match &meta {
            None => Kind::File,
            Some(m) if m.file_type().is_block_device() => Kind::BlockDevice,
            Some(m) if m.is_file() => Kind::File,
            Some(_) => {
                return Err(config(format!(
                    "{shown} is neither a regular file nor a block device; give a file or a /dev path"
                )));
            }
        };
        if meta.is_none() {
            if !opts.create {
                return Err(config(format!(
                    "{shown} does not exist; set create = true (with a size) or create it first, \
                     e.g. `truncate -s 1G {shown}`"
                )));
            }
            let Some(size) = opts.size else {
                return Err(config(format!(
                    "{shown} does not exist and create = true needs a size to make it; \
                     set size = <bytes>, a multiple of block_size {bs}"
                )));
            };
            create_file(path, size)?;
        }

        let (file, direct) = open_direct_or_buffered(path, kind, opts.block_size, try_direct)?;
        let fd = file.as_raw_fd();
        // Two servers writing one backing store would corrupt it: take an
        // exclusive advisory lock for as long as the device is open.
        // SAFETY: flock on a descriptor we own; no memory is involved.
        if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            return Err(config(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                format!(
                    "{shown} is in use by another process (locked); stop it or use another path"
                )
            } else {
                format!("{shown}: cannot lock: {e}")
            }));
        }

        let size = match kind {
            Kind::File => {
                let len = file
                    .metadata()
                    .map_err(|e| config(format!("{shown}: cannot stat: {e}")))?
                    .len();
                match opts.size {
                    Some(size) if size > len => {
                        return Err(config(format!(
                            "{shown} is {len} bytes, smaller than size = {size}; grow it \
                             (`truncate -s {size} {shown}`) or set size <= {len}"
                        )));
                    }
                    Some(size) => size,
                    None if len == 0 || !len.is_multiple_of(bs) => {
                        let fit = len - len % bs;
                        return Err(config(format!(
                            "{shown} is {len} bytes, not a non-zero multiple of block_size {bs}; \
                             set size (e.g. size = {fit}) or resize the file"
                        )));
                    }
                    None => len,
                }
            }
            Kind::BlockDevice => {
                let dev_size = ioctl_u64(fd, BLKGETSIZE64)
                    .map_err(|e| config(format!("{shown}: BLKGETSIZE64 failed: {e}")))?;
                let lbs = ioctl_int(fd, BLKSSZGET)
                    .map_err(|e| config(format!("{shown}: BLKSSZGET failed: {e}")))?;
                if u64::from(lbs.unsigned_abs()) > bs {
                    return Err(config(format!(
                        "{shown} has a logical block size of {lbs} bytes, larger than block_size = {bs}; \
                         set block_size = {lbs}"
                    )));
                }
                match opts.size {
                    Some(size) if size > dev_size => {
                        return Err(config(format!(
                            "{shown} holds {dev_size} bytes, less than size = {size}; set size <= {dev_size}"
                        )));
                    }
                    Some(size) => size,
                    None => dev_size - dev_size % bs,
                }
            }
        };
        let geo = Geometry::checked(&shown.to_string(), size, opts.block_size)?;

        let punch_hole = kind == Kind::File && probe_punch_hole(&file, bs);
        let records = match kind {
            Kind::File => probe_records(fd),
            Kind::BlockDevice => Err(BLOCK_DEVICE_NO_RECORDS.to_string()),
        };

        let ring = IoUring::builder()
            .setup_cqsize(CQ_ENTRIES)
            .build(SQ_ENTRIES)
            .map_err(|e| {
                config(format!(
                    "{shown}: cannot set up io_uring: {e}; it may be disabled \
                     (sysctl kernel.io_uring_disabled) or blocked by a seccomp profile"
                ))
            })?;

        let mut zeroes = AlignedBuf::new(ZERO_CHUNK);
        zeroes.set_len(ZERO_CHUNK);
        let inner = Arc::new(Inner {
            ring,
            sq: Mutex::new(false),
            reaper_awake: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            fd,
            file: RwLock::new(Some(file)),
            kind,
            geo,
            zero_range: AtomicBool::new(true),
            punch_hole,
            zeroes,
        });
        let reaper = {
            let inner = Arc::clone(&inner);
            std::thread::Builder::new()
                .name("blockdev-uring".into())
                .spawn(move || inner.reap())
                .map_err(|e| {
                    config(format!(
                        "{shown}: cannot start the io_uring reaper thread: {e}"
                    ))
                })?
        };

        let describe = format!(
            "{} {} ({}, {}, io_uring)",
            match kind {
                Kind::File => "file",
                Kind::BlockDevice => "block device",
            },
            shown,
            human_size(size),
            if direct {
                "O_DIRECT"
            } else {
                "buffered: O_DIRECT refused"
            },
        );
        tracing::debug!(device = %describe, "opened");
        Ok(FileDevice {
            inner,
            reaper: Mutex::new(Some(reaper)),
            describe,
            path: path.to_owned(),
            records,
        })
    }

    /// Tells the reaper to exit once in-flight I/O is done, and waits for it.
    /// The caller holds the `reaper` lock, so a concurrent shutdown waits for this one.
    fn stop_reaper(&self, reaper: &mut Option<JoinHandle<()>>) -> Result<(), BlockError> {
        let Some(handle) = reaper.take() else {
            return Ok(());
        };
        *self.inner.sq.lock() = true;
        self.inner.stop.store(true, Ordering::SeqCst);
        self.inner.wake_reaper();
        handle
            .join()
            .map_err(|_| BlockError::Io(io::Error::other("io_uring reaper thread panicked")))
    }

    #[cfg(test)]
    fn force_zero_writes(&self) {
        self.inner.zero_range.store(false, Ordering::Relaxed);
    }
}

// Device-kept records (`BlockDevice::store_record`) of a regular file live in
// an extended attribute of the file itself: they travel with it (`cp -a`,
// `rsync -X`), cannot go stale beside it, and leave its size alone. Setting
// one attribute replaces its value atomically in the filesystem (journaled
// metadata on ext4/xfs), and an fsync of the file makes it durable.
//
// A block device has nowhere like that: device nodes take no user xattrs,
// and every byte of the device is the namespace's data, which users already
// have on it; taking some silently would destroy it. So a block device keeps
// no records; a volume over it does (in its members' metadata area).
const BLOCK_DEVICE_NO_RECORDS: &str = "a block device keeps no records: device nodes take no \
     extended attributes and its every byte is namespace data flashpool will not take; \
     serve it as a member of a volume (which keeps records in its metadata area) or from a file";

/// The extended attribute that keeps the record of `kind` on a regular file.
pub fn record_xattr(kind: RecordKind) -> &'static CStr {
    match kind {
        RecordKind::Reservations => c"user.flashpool.rec.reservations",
    }
}

/// Whether the file's filesystem keeps user extended attributes, without
/// changing the file.
fn probe_records(fd: RawFd) -> Result<(), String> {
    let name = record_xattr(RecordKind::Reservations);
    // SAFETY: a NUL-terminated name and a null buffer of size 0 (asks the size).
    let r = unsafe { libc::fgetxattr(fd, name.as_ptr(), std::ptr::null_mut(), 0) };
    if r >= 0 {
        return Ok(());
    }
    match last_errno() {
        libc::ENODATA => {}
        e => return Err(xattr_reason(e)),
    }
    // Replacing an attribute that is not there fails with ENODATA where user
    // attributes work, and with ENOTSUP where they do not; nothing changes.
    // SAFETY: a NUL-terminated name and an empty value.
    let r = unsafe { libc::fsetxattr(fd, name.as_ptr(), std::ptr::null(), 0, libc::XATTR_REPLACE) };
    match (r, last_errno()) {
        (0, _) | (_, libc::ENODATA) => Ok(()),
        (_, e) => Err(xattr_reason(e)),
    }
}

fn xattr_reason(errno: i32) -> String {
    let e = io::Error::from_raw_os_error(errno);
    if errno == libc::ENOTSUP {
        format!(
            "its filesystem does not support user extended attributes ({e}); \
             put the file on ext4, xfs or tmpfs (with user_xattr)"
        )
    } else {
        format!("its extended attributes cannot be used: {e}")
    }
}

fn create_file(path: &Path, size: u64) -> Result<(), BlockError> {
    let shown = path.display();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
        .map_err(|e| config(format!("{shown}: cannot create: {e}")))?;
    file.set_len(size).map_err(|e| {
        config(format!(
            "{shown}: cannot size the new file to {size} bytes: {e}"
        ))
    })?;
    tracing::info!(path = %shown, size, "created backing file");
    Ok(())
}

/// Opens read-write with O_DIRECT and proves it with one aligned read; on EINVAL
/// (tmpfs and some FUSE filesystems, or a filesystem needing bigger alignment
/// than `block_size`) reopens buffered. Returns whether O_DIRECT is on.
fn open_direct_or_buffered(
    path: &Path,
    kind: Kind,
    block_size: u32,
    try_direct: bool,
) -> Result<(File, bool), BlockError> {
    let shown = path.display();
    let open = |flags: i32| {
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(flags)
            .open(path)
    };
    let direct = if try_direct {
        open(libc::O_DIRECT)
    } else {
        Err(io::Error::from_raw_os_error(libc::EINVAL))
    };
    let refusal = match direct {
        Ok(file) => {
            let mut probe = AlignedBuf::new(block_size as usize);
            // SAFETY: `probe` owns at least block_size writable bytes at an aligned address.
            let n = unsafe {
                libc::pread(
                    file.as_raw_fd(),
                    probe.as_mut_ptr().cast(),
                    block_size as usize,
                    0,
                )
            };
            if n >= 0 {
                return Ok((file, true));
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(config(format!("{shown}: test read failed: {e}")));
            }
            format!("{block_size}-byte O_DIRECT read refused ({e})")
        }
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            format!("open with O_DIRECT refused ({e})")
        }
        Err(e) => return Err(open_error(path, e)),
    };
    if kind == Kind::BlockDevice {
        // Block devices always take O_DIRECT at their logical block size.
        return Err(config(format!("{shown}: {refusal}; check block_size")));
    }
    tracing::warn!(path = %shown, "{refusal}; using buffered I/O (page cache), durability still via fdatasync");
    let file = open(0).map_err(|e| open_error(path, e))?;
    Ok((file, false))
}

fn open_error(path: &Path, e: io::Error) -> BlockError {
    let hint = if e.kind() == io::ErrorKind::PermissionDenied {
        "; it needs read and write permission"
    } else {
        ""
    };
    config(format!(
        "{}: cannot open read-write: {e}{hint}",
        path.display()
    ))
}

/// Punches a hole past the end of the file, where there is no data: succeeds
/// exactly where the filesystem supports it.
fn probe_punch_hole(file: &File, bs: u64) -> bool {
    let Ok(meta) = file.metadata() else {
        return false;
    };
    let at = meta.len().next_multiple_of(bs);
    // SAFETY: plain syscall on a descriptor we own; the range lies past EOF and KEEP_SIZE
    // leaves the size alone, so no data changes.
    let rc = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            at as libc::off_t,
            bs as libc::off_t,
        )
    };
    if rc != 0 {
        tracing::info!(error = %io::Error::last_os_error(), "punch hole unsupported; deallocated blocks may not read as zeroes");
    }
    rc == 0
}

fn ioctl_u64(fd: RawFd, req: libc::c_ulong) -> io::Result<u64> {
    let mut v: u64 = 0;
    // SAFETY: `req` is BLKGETSIZE64, which writes one u64 to the pointer we pass.
    let rc = unsafe { libc::ioctl(fd, req as _, &mut v as *mut u64) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(v)
    }
}

fn ioctl_int(fd: RawFd, req: libc::c_ulong) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    // SAFETY: `req` is BLKSSZGET, which writes one int to the pointer we pass.
    let rc = unsafe { libc::ioctl(fd, req as _, &mut v as *mut libc::c_int) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(v)
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
    fn reap(self: Arc<Self>) {
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

fn shut_down() -> BlockError {
    BlockError::Io(io::Error::other("device is shut down"))
}

impl BlockDevice for FileDevice {
    fn geometry(&self) -> Geometry {
        self.inner.geo
    }

    fn submit(&self, req: IoRequest) -> IoFuture {
        let inner = &*self.inner;
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

    fn deallocate_reads_zeroes(&self) -> bool {
        self.inner.punch_hole
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn keeps_records(&self) -> bool {
        self.records.is_ok()
    }

    fn load_record(&self, kind: RecordKind) -> Result<Option<Vec<u8>>, BlockError> {
        if self.records.is_err() {
            return Ok(None);
        }
        let file = self.inner.file.read();
        let Some(file) = file.as_ref() else {
            return Err(shut_down());
        };
        let name = record_xattr(kind);
        let mut buf = vec![0u8; RECORD_MAX];
        // SAFETY: a NUL-terminated name and a buffer of `buf.len()` bytes we own.
        let r = unsafe {
            libc::fgetxattr(
                file.as_raw_fd(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if r < 0 {
            return match last_errno() {
                libc::ENODATA => Ok(None),
                libc::ERANGE => Err(config(format!(
                    "{}: extended attribute {} is larger than {RECORD_MAX} bytes, \
                     so not a flashpool {kind:?} record; remove it (`setfattr -x {} {}`)",
                    self.path.display(),
                    name.to_string_lossy(),
                    name.to_string_lossy(),
                    self.path.display()
                ))),
                e => Err(BlockError::Io(io::Error::new(
                    io::Error::from_raw_os_error(e).kind(),
                    format!(
                        "{}: reading extended attribute {}: {}",
                        self.path.display(),
                        name.to_string_lossy(),
                        io::Error::from_raw_os_error(e)
                    ),
                ))),
            };
        }
        buf.truncate(r as usize);
        Ok(Some(buf))
    }

    fn store_record(&self, kind: RecordKind, data: &[u8]) -> Result<(), BlockError> {
        let name = record_xattr(kind);
        if let Err(reason) = &self.records {
            return Err(config(format!(
                "{}: cannot keep the {kind:?} record: {reason}",
                self.path.display()
            )));
        }
        if data.len() > RECORD_MAX {
            return Err(config(format!(
                "{}: a {kind:?} record of {} bytes is over the {RECORD_MAX}-byte limit",
                self.path.display(),
                data.len()
            )));
        }
        let file = self.inner.file.read();
        let Some(file) = file.as_ref() else {
            return Err(shut_down());
        };
        // SAFETY: a NUL-terminated name and `data.len()` readable bytes.
        let r = unsafe {
            libc::fsetxattr(
                file.as_raw_fd(),
                name.as_ptr(),
                data.as_ptr().cast(),
                data.len(),
                0,
            )
        };
        if r != 0 {
            let e = io::Error::last_os_error();
            return Err(BlockError::Io(io::Error::new(
                e.kind(),
                format!(
                    "{}: setting extended attribute {} ({} bytes): {e}",
                    self.path.display(),
                    name.to_string_lossy(),
                    data.len()
                ),
            )));
        }
        // The attribute is inode metadata: fsync, not fdatasync, makes it durable.
        file.sync_all().map_err(|e| {
            BlockError::Io(io::Error::new(
                e.kind(),
                format!(
                    "{}: fsync after storing the {kind:?} record: {e}",
                    self.path.display()
                ),
            ))
        })
    }

    /// Waits for in-flight I/O, stops the reaper, makes the data durable and closes.
    fn shutdown(&self) -> Result<(), BlockError> {
        let mut reaper = self.reaper.lock();
        let stopped = self.stop_reaper(&mut reaper);
        // Only now, with nothing in flight or queued, may the descriptor go.
        let Some(file) = self.inner.file.write().take() else {
            return stopped;
        };
        let synced = file.sync_data().map_err(BlockError::Io);
        drop(file);
        stopped.and(synced)
    }
}

impl Drop for FileDevice {
    fn drop(&mut self) {
        // In-flight records own buffers the kernel may still write: let them finish.
        let mut reaper = self.reaper.get_mut().take();
        if let Err(e) = self.stop_reaper(&mut reaper) {
            tracing::error!(error = %e, device = %self.describe, "stopping io_uring reaper");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;
    use crate::testutil::*;

    /// A fresh directory, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(base: &Path, tag: &str) -> TempDir {
            static N: AtomicU32 = AtomicU32::new(0);
            let n = N.fetch_add(1, Ordering::Relaxed);
            let dir = base.join(format!(
                "flashpool-blockdev-{}-{tag}-{n}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).expect("create test dir");
            TempDir(dir)
        }
        fn file(&self, name: &str) -> PathBuf {
            self.0.join(name)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The system temp dir, the workspace's target dir (a real filesystem) and
    /// /dev/shm (tmpfs) where there is one.
    fn bases() -> Vec<PathBuf> {
        let mut v = vec![
            std::env::temp_dir(),
            Path::new(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../target/blockdev-tests"
            ))
            .canonicalize()
            .unwrap_or_else(|_| {
                let p = Path::new(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../../target/blockdev-tests"
                ));
                std::fs::create_dir_all(p).expect("create target/blockdev-tests");
                p.canonicalize().expect("canonical target dir")
            }),
        ];
        if Path::new("/dev/shm").is_dir() {
            v.push(PathBuf::from("/dev/shm"));
        }
        v
    }

    fn new_file(path: &Path, size: u64, block_size: u32) -> FileDevice {
        FileDevice::open(FileOptions {
            path: path.to_owned(),
            size: Some(size),
            block_size,
            create: true,
        })
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
    }

    fn open_err(path: &Path, size: Option<u64>, block_size: u32, create: bool) -> String {
        match FileDevice::open(FileOptions {
            path: path.to_owned(),
            size,
            block_size,
            create,
        }) {
            Ok(dev) => panic!("opened {}: {}", path.display(), dev.describe()),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn roundtrip_and_persist_across_reopen() {
        for base in bases() {
            let dir = TempDir::new(&base, "persist");
            for bs in [4096u32, 512] {
                let path = dir.file(&format!("disk-{bs}.img"));
                let dev = new_file(&path, 1 << 20, bs);
                let desc = dev.describe();
                eprintln!("{desc}");
                assert!(
                    desc.contains(&*path.to_string_lossy()) && desc.contains("io_uring"),
                    "{desc}"
                );
                check_random_roundtrip(&dev, u64::from(bs), 200);
                let mut data = vec![0u8; 8 * bs as usize];
                Rng::new(42).fill(&mut data);
                write(&dev, 17, &data);
                dev.shutdown().expect("shutdown");
                drop(dev);

                let dev = FileDevice::open(FileOptions {
                    path: path.clone(),
                    size: None,
                    block_size: bs,
                    create: false,
                })
                .expect("reopen");
                assert_eq!(dev.geometry().size_bytes(), 1 << 20);
                assert_eq!(read(&dev, 17, 8), data, "{desc}: data after reopen");
            }
        }
    }

    #[test]
    fn buffered_fallback_works_and_says_so() {
        let dir = TempDir::new(&std::env::temp_dir(), "buffered");
        let path = dir.file("b.img");
        let opts = FileOptions {
            path: path.clone(),
            size: Some(1 << 20),
            block_size: 512,
            create: true,
        };
        let dev = FileDevice::open_with(opts.clone(), false).expect("buffered open");
        assert!(dev.describe().contains("buffered"), "{}", dev.describe());
        check_random_roundtrip(&dev, 11, 100);
        check_zeroing(&dev, 12);
        let mut data = vec![0u8; 3 * 512];
        Rng::new(13).fill(&mut data);
        write(&dev, 1, &data);
        dev.shutdown().unwrap();
        drop(dev);
        let dev = FileDevice::open_with(opts, false).expect("buffered reopen");
        assert_eq!(read(&dev, 1, 3), data);
    }

    #[test]
    fn bad_requests_error_not_panic() {
        let dir = TempDir::new(&std::env::temp_dir(), "bad");
        let dev = new_file(&dir.file("d.img"), 64 * 4096, 4096);
        check_bad_requests(&dev);
        dev.shutdown().unwrap();
        // After shutdown requests are refused, and the buffer still comes back.
        let done = io(&dev, BlockOp::Read, 0, 1, buf_of(4096));
        assert!(done.result.is_err());
        assert_eq!(done.buf.len(), 4096);
        dev.shutdown().expect("second shutdown is harmless");
    }

    #[test]
    fn zeroing_reads_back_zeroes() {
        for base in bases() {
            let dir = TempDir::new(&base, "zero");
            let dev = new_file(&dir.file("z.img"), 3 << 20, 4096);
            assert!(
                dev.deallocate_reads_zeroes(),
                "punch hole on {}",
                base.display()
            );
            check_zeroing(&dev, 5);
            // Again with WriteZeroes forced onto plain writes of the zero buffer,
            // over ranges bigger than one ZERO_CHUNK.
            dev.force_zero_writes();
            check_zeroing(&dev, 6);
            check_random_roundtrip(&dev, 7, 20);
        }
    }

    #[test]
    fn fua_and_flush() {
        let dir = TempDir::new(&std::env::temp_dir(), "fua");
        let dev = new_file(&dir.file("f.img"), 1 << 20, 4096);
        let mut buf = buf_of(4096);
        buf.fill(9);
        io(&dev, BlockOp::Write { fua: true }, 3, 1, buf)
            .result
            .expect("fua write");
        io(&dev, BlockOp::Flush, 0, 0, AlignedBuf::new(0))
            .result
            .expect("flush");
        assert!(read(&dev, 3, 1).iter().all(|&b| b == 9));
    }

    #[test]
    fn concurrent_threads() {
        let dir = TempDir::new(&std::env::temp_dir(), "conc");
        let dev: Arc<dyn BlockDevice> = Arc::new(new_file(&dir.file("c.img"), 2 << 20, 4096));
        check_concurrent(Arc::clone(&dev), 6, 40);
        dev.shutdown().unwrap();
    }

    #[test]
    fn dropped_futures_and_drop_with_io_in_flight() {
        let dir = TempDir::new(&std::env::temp_dir(), "drop");
        let path = dir.file("d.img");
        let dev = new_file(&path, 1 << 20, 512);
        // More requests than the submission queue holds, all in flight at once.
        let n = 3 * SQ_ENTRIES as u64;
        let pattern = |lba: u64| (lba % 251) as u8 + 1;
        for lba in 0..n {
            let mut buf = buf_of(512);
            buf.fill(pattern(lba));
            // The future is dropped at once: the record keeps the buffer alive.
            drop(dev.submit(IoRequest {
                op: BlockOp::Write { fua: false },
                lba,
                blocks: 1,
                buf,
            }));
        }
        // Dropping without shutdown waits for those writes and stops the reaper.
        drop(dev);
        let dev = FileDevice::open(FileOptions {
            path,
            size: None,
            block_size: 512,
            create: false,
        })
        .unwrap();
        // Reads with many in flight too, awaited after all are submitted.
        let futs: Vec<_> = (0..n)
            .map(|lba| {
                dev.submit(IoRequest {
                    op: BlockOp::Read,
                    lba,
                    blocks: 1,
                    buf: buf_of(512),
                })
            })
            .collect();
        for (lba, f) in (0..n).zip(futs) {
            let done = block_on(f);
            done.result.expect("read");
            assert!(done.buf.iter().all(|&b| b == pattern(lba)), "block {lba}");
        }
    }

    #[test]
    #[ignore = "needs FLASHPOOL_TEST_BLOCKDEV=/dev/... (destroyed)"]
    fn block_device() {
        let Some(path) = std::env::var_os("FLASHPOOL_TEST_BLOCKDEV") else {
            return;
        };
        let opts = FileOptions {
            path: path.into(),
            size: None,
            block_size: 4096,
            create: false,
        };
        let dev = FileDevice::open(opts.clone()).expect("open block device");
        eprintln!("{}", dev.describe());
        assert!(dev.describe().starts_with("block device"));
        assert!(!dev.deallocate_reads_zeroes());
        assert!(
            !dev.keeps_records(),
            "no xattrs on device nodes, no data area taken"
        );
        let e = dev
            .store_record(RecordKind::Reservations, b"x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("block device keeps no records"), "{e}");
        let small = FileDevice::open(FileOptions {
            size: Some(4 << 20),
            ..opts.clone()
        })
        .expect("open a prefix");
        check_random_roundtrip(&small, 21, 200);
        check_zeroing(&small, 22);
        check_bad_requests(&small);
        small.shutdown().unwrap();
        let e = FileDevice::open(FileOptions {
            size: Some(dev.geometry().size_bytes() + 4096),
            ..opts
        })
        .err()
        .expect("too big")
        .to_string();
        assert!(e.contains("less than size"), "{e}");
    }

    #[test]
    fn records_live_in_an_xattr_and_survive_reopen() {
        // The target dir (ext4/xfs here) and /dev/shm (tmpfs).
        for base in bases() {
            let dir = TempDir::new(&base, "records");
            let path = dir.file("r.img");
            let dev = new_file(&path, 1 << 20, 4096);
            if !dev.keeps_records() {
                let e = dev
                    .store_record(RecordKind::Reservations, b"x")
                    .unwrap_err()
                    .to_string();
                eprintln!("{}: no records: {e}", base.display());
                assert!(e.contains(&*path.to_string_lossy()), "{e}");
                continue;
            }
            assert_eq!(dev.load_record(RecordKind::Reservations).unwrap(), None);
            let data = b"first".to_vec();
            write(&dev, 3, &[7u8; 4096]);
            dev.store_record(RecordKind::Reservations, &data).unwrap();
            assert_eq!(
                dev.load_record(RecordKind::Reservations).unwrap(),
                Some(data)
            );
            let mut big = vec![0u8; RECORD_MAX];
            Rng::new(9).fill(&mut big);
            dev.store_record(RecordKind::Reservations, &big).unwrap();
            assert_eq!(
                dev.load_record(RecordKind::Reservations).unwrap().as_ref(),
                Some(&big),
                "replaced"
            );
            let e = dev
                .store_record(RecordKind::Reservations, &vec![1u8; RECORD_MAX + 1])
                .unwrap_err()
                .to_string();
            assert!(e.contains("2049 bytes") && e.contains("2048"), "{e}");
            assert_eq!(
                dev.load_record(RecordKind::Reservations).unwrap().as_ref(),
                Some(&big),
                "a refused record leaves the old one"
            );
            dev.store_record(RecordKind::Reservations, b"").unwrap();
            assert_eq!(
                dev.load_record(RecordKind::Reservations).unwrap(),
                Some(vec![])
            );
            dev.store_record(RecordKind::Reservations, b"kept").unwrap();
            dev.shutdown().unwrap();
            assert!(dev.load_record(RecordKind::Reservations).is_err());
            drop(dev);

            // A new device on the same path sees it; the size is unchanged.
            let dev = FileDevice::open(FileOptions {
                path: path.clone(),
                size: None,
                block_size: 4096,
                create: false,
            })
            .unwrap();
            assert!(dev.keeps_records());
            assert_eq!(dev.geometry().size_bytes(), 1 << 20);
            assert_eq!(read(&dev, 3, 1), vec![7u8; 4096]);
            assert_eq!(
                dev.load_record(RecordKind::Reservations).unwrap(),
                Some(b"kept".to_vec())
            );
            // It is in the file's own metadata, under the documented name.
            let name = record_xattr(RecordKind::Reservations);
            let f = File::open(&path).unwrap();
            let mut buf = [0u8; 16];
            // SAFETY: NUL-terminated name, buffer of 16 bytes we own.
            let n = unsafe {
                libc::fgetxattr(
                    f.as_raw_fd(),
                    name.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            assert_eq!(n, 4);
            assert_eq!(&buf[..4], b"kept");
        }
    }

    #[test]
    fn records_refused_with_the_reason() {
        let dir = TempDir::new(&std::env::temp_dir(), "norec");
        let path = dir.file("n.img");
        let mut dev = new_file(&path, 1 << 20, 4096);
        // As a filesystem without user xattrs (ENOTSUP) reports it.
        dev.records = Err(xattr_reason(libc::ENOTSUP));
        assert!(!dev.keeps_records());
        assert_eq!(dev.load_record(RecordKind::Reservations).unwrap(), None);
        let e = dev
            .store_record(RecordKind::Reservations, b"x")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&*path.to_string_lossy()) && e.contains("extended attributes"),
            "{e}"
        );
        // A block device says why it keeps none.
        dev.records = Err(BLOCK_DEVICE_NO_RECORDS.to_string());
        let e = dev
            .store_record(RecordKind::Reservations, b"x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("volume"), "{e}");
    }

    #[test]
    fn open_errors_name_path_value_and_fix() {
        let dir = TempDir::new(&std::env::temp_dir(), "errs");
        let missing = dir.file("missing.img");
        let shown = missing.display().to_string();

        let e = open_err(&missing, Some(1 << 20), 4096, false);
        assert!(e.contains(&shown) && e.contains("create = true"), "{e}");
        let e = open_err(&missing, None, 4096, true);
        assert!(e.contains(&shown) && e.contains("size"), "{e}");
        let e = open_err(&missing, Some(1000), 4096, true);
        assert!(e.contains("1000") && e.contains("4096"), "{e}");
        let e = open_err(&missing, Some(1 << 20), 1000, true);
        assert!(
            e.contains("block_size = 1000") && e.contains("512 or 4096"),
            "{e}"
        );
        assert!(!missing.exists(), "failed opens create nothing");

        // An existing file is never grown.
        let small = dir.file("small.img");
        std::fs::write(&small, vec![1u8; 8192]).unwrap();
        let e = open_err(&small, Some(1 << 20), 4096, true);
        assert!(
            e.contains("8192") && e.contains("1048576") && e.contains("truncate"),
            "{e}"
        );
        assert_eq!(std::fs::metadata(&small).unwrap().len(), 8192);

        // Without a size the file's length must fit whole blocks.
        let odd = dir.file("odd.img");
        std::fs::write(&odd, vec![1u8; 5000]).unwrap();
        let e = open_err(&odd, None, 4096, false);
        assert!(e.contains("5000") && e.contains("size = 4096"), "{e}");
        let dev = FileDevice::open(FileOptions {
            path: odd,
            size: Some(4096),
            block_size: 4096,
            create: false,
        })
        .expect("explicit size inside the file");
        assert_eq!(dev.geometry().num_blocks, 1);
        assert_eq!(read(&dev, 0, 1), vec![1u8; 4096]);

        let e = open_err(&dir.0, None, 4096, false);
        assert!(
            e.contains("neither a regular file nor a block device"),
            "{e}"
        );
    }
}

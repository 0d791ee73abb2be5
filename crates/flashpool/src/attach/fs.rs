//! The FUSE filesystem: a directory with one regular file, `disk`, whose
//! bytes are the attached namespace's ([`Disk`]).
//!
//! The FUSE threads only decode a request, copy a write's bytes and start
//! a task on the attach runtime; the task answers the kernel when the I/O
//! completes. So the kernel's whole queue (`max_background`, async direct
//! I/O) is in flight at once, spread over the namespace's I/O queues.

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, WriteFlags,
};

use super::disk::{Disk, DiskError};

/// The only file's inode.
pub const DISK_INO: INodeNo = INodeNo(2);
/// Its name in the mount's directory.
pub const DISK_NAME: &str = "disk";
/// Attributes never change behind the kernel's back but the size is fixed
/// anyway: a long TTL saves a getattr per open.
const TTL: Duration = Duration::from_secs(60);
/// Largest read or write the kernel sends in one request.
const MAX_IO: u32 = 1 << 20;

const FALLOC_FL_KEEP_SIZE: i32 = 0x01;
const FALLOC_FL_PUNCH_HOLE: i32 = 0x02;
const FALLOC_FL_ZERO_RANGE: i32 = 0x10;

pub struct DiskFs {
    disk: Arc<Disk>,
    rt: tokio::runtime::Handle,
    /// Requests the kernel may keep in flight (FUSE max_background).
    queue: u16,
    /// Every open goes around the page cache (FOPEN_DIRECT_IO).
    direct_io: bool,
    uid: u32,
    gid: u32,
    born: SystemTime,
}

impl DiskFs {
    pub fn new(disk: Arc<Disk>, rt: tokio::runtime::Handle, queue: u16, direct_io: bool) -> DiskFs {
        // SAFETY: getuid/getgid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        DiskFs {
            disk,
            rt,
            queue: queue.max(1),
            direct_io,
            uid,
            gid,
            born: SystemTime::now(),
        }
    }

    fn attr(&self, ino: INodeNo) -> Option<FileAttr> {
        let (kind, perm, size, nlink) = match ino {
            INodeNo::ROOT => (FileType::Directory, 0o755, 0, 2),
            DISK_INO => (FileType::RegularFile, 0o600, self.disk.size(), 1),
            _ => return None,
        };
        Some(FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.born,
            mtime: self.born,
            ctime: self.born,
            crtime: self.born,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: self.disk.block_size().max(4096),
            flags: 0,
        })
    }
}

fn errno(e: &DiskError) -> Errno {
    Errno::from_i32(e.errno())
}

/// Logs a failed I/O once per request, with what it was.
fn failed(what: std::fmt::Arguments<'_>, e: &DiskError) -> Errno {
    match e {
        DiskError::PastEnd { .. } => tracing::debug!("{what}: {e}"),
        DiskError::Device(_) => tracing::warn!("{what}: {e}"),
    }
    errno(e)
}

impl Filesystem for DiskFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_IO);
        let _ = config.set_max_readahead(MAX_IO);
        let _ = config.set_max_background(self.queue);
        let _ = config.set_congestion_threshold((u32::from(self.queue) * 3 / 4).max(1) as u16);
        // Asynchronous direct I/O: an O_DIRECT reader or writer with a queue
        // (io_uring, libaio, the loop driver) gets several requests in flight.
        for cap in [InitFlags::FUSE_ASYNC_DIO, InitFlags::FUSE_ASYNC_READ] {
            if config.add_capabilities(cap).is_err() {
                tracing::debug!("FUSE: the kernel lacks {cap:?}");
            }
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match (parent, name.to_str()) {
            (INodeNo::ROOT, Some(DISK_NAME)) => {
                let a = self.attr(DISK_INO).expect("the disk's attributes");
                reply.entry(&TTL, &a, Generation(0));
            }
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    /// Only what changes nothing is accepted: the size is the namespace's,
    /// and owner, mode and times are the mount's.
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let Some(a) = self.attr(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let changes = size.is_some_and(|s| s != a.size)
            || mode.is_some_and(|m| m & 0o7777 != u32::from(a.perm))
            || uid.is_some_and(|u| u != a.uid)
            || gid.is_some_and(|g| g != a.gid);
        if changes {
            // Truncating (O_TRUNC, `dd` without conv=notrunc) would not
            // resize a namespace: refuse rather than pretend.
            return reply.error(Errno::EPERM);
        }
        reply.attr(&TTL, &a);
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino != DISK_INO {
            return reply.error(Errno::EISDIR);
        }
        let mut f = FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES;
        if self.direct_io {
            f |= FopenFlags::FOPEN_DIRECT_IO;
        }
        reply.opened(FileHandle(0), f);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino != DISK_INO {
            return reply.error(Errno::EISDIR);
        }
        let disk = self.disk.clone();
        self.rt.spawn(async move {
            match disk.read(offset, size).await {
                Ok(out) => reply.data(&out),
                Err(e) => reply.error(failed(format_args!("read {offset}+{size}"), &e)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if ino != DISK_INO {
            return reply.error(Errno::EISDIR);
        }
        let len = data.len();
        let job = match self.disk.write(offset, data) {
            Ok(j) => j,
            Err(e) => return reply.error(failed(format_args!("write {offset}+{len}"), &e)),
        };
        self.rt.spawn(async move {
            match job.run().await {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(failed(format_args!("write {offset}+{len}"), &e)),
            }
        });
    }

    /// close(2): every write was already answered by the namespace; there is
    /// nothing to push (fsync makes it durable).
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    /// fsync/fdatasync: NVMe Flush.
    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let disk = self.disk.clone();
        self.rt.spawn(async move {
            match disk.flush().await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(failed(format_args!("fsync"), &e)),
            }
        });
    }

    /// Punching a hole deallocates (NVMe Dataset Management) where the
    /// namespace reads deallocated blocks as zeroes, else writes zeroes;
    /// zeroing a range writes zeroes; preallocating inside the disk changes
    /// nothing. The loop driver sends its discards and write-zeroes here.
    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if ino != DISK_INO {
            return reply.error(Errno::EISDIR);
        }
        let end = offset.saturating_add(length);
        let keep_size = mode & FALLOC_FL_KEEP_SIZE != 0;
        if end > self.disk.size() && !keep_size {
            return reply.error(Errno::EFBIG);
        }
        let dealloc = match mode & !FALLOC_FL_KEEP_SIZE {
            0 => return reply.ok(),
            FALLOC_FL_PUNCH_HOLE if keep_size => true,
            FALLOC_FL_ZERO_RANGE => false,
            _ => return reply.error(Errno::EOPNOTSUPP),
        };
        let disk = self.disk.clone();
        self.rt.spawn(async move {
            match disk.zero(offset, length, dealloc).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(failed(
                    format_args!("fallocate {offset}+{length} mode {mode:#x}"),
                    &e,
                )),
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (INodeNo::ROOT, FileType::Directory, "."),
            (INodeNo::ROOT, FileType::Directory, ".."),
            (DISK_INO, FileType::RegularFile, DISK_NAME),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    /// No extended attributes: ENOSYS tells the kernel once for all, so
    /// writes stop asking for `security.capability`.
    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let bs = self.disk.block_size();
        let blocks = self.disk.size() / u64::from(bs);
        reply.statfs(blocks, 0, 0, 2, 0, bs, 255, bs);
    }
}

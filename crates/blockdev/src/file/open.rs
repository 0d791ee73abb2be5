//! Opening a [`FileDevice`](super::FileDevice)'s backing store: creating the
//! file, O_DIRECT with its buffered fallback, the block-device ioctls, and
//! the errno-to-error helpers the rest of the backend shares.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::{AlignedBuf, BlockError};

// <linux/fs.h> block-device ioctls (the `_IO`/`_IOR` encodings of x86-64 and arm64).
pub(super) const BLKSSZGET: libc::c_ulong = 0x1268;
pub(super) const BLKDISCARD: libc::c_ulong = 0x1277;
pub(super) const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

/// What the backing store is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    File,
    BlockDevice,
}

pub(super) fn config(msg: String) -> BlockError {
    BlockError::Config(msg)
}

pub(super) fn errno_error(errno: i32) -> BlockError {
    if errno == libc::ENOSPC {
        BlockError::NoSpace
    } else {
        BlockError::Io(io::Error::from_raw_os_error(errno))
    }
}

pub(super) fn last_errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

pub(super) fn shut_down() -> BlockError {
    BlockError::Io(io::Error::other("device is shut down"))
}

pub(super) fn create_file(path: &Path, size: u64) -> Result<(), BlockError> {
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
pub(super) fn open_direct_or_buffered(
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

pub(super) fn open_error(path: &Path, e: io::Error) -> BlockError {
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
pub(super) fn probe_punch_hole(file: &File, bs: u64) -> bool {
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

pub(super) fn ioctl_u64(fd: RawFd, req: libc::c_ulong) -> io::Result<u64> {
    let mut v: u64 = 0;
    // SAFETY: `req` is BLKGETSIZE64, which writes one u64 to the pointer we pass.
    let rc = unsafe { libc::ioctl(fd, req as _, &mut v as *mut u64) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(v)
    }
}

pub(super) fn ioctl_int(fd: RawFd, req: libc::c_ulong) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    // SAFETY: `req` is BLKSSZGET, which writes one int to the pointer we pass.
    let rc = unsafe { libc::ioctl(fd, req as _, &mut v as *mut libc::c_int) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(v)
    }
}

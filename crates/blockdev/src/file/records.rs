//! Device-kept records of a file-backed device: the extended attribute
//! each record lives in, and the probe of whether the file's filesystem
//! keeps user extended attributes at all.

use std::ffi::CStr;
use std::io;
use std::os::fd::RawFd;

use super::open::last_errno;
use crate::RecordKind;

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
pub(super) const BLOCK_DEVICE_NO_RECORDS: &str = "a block device keeps no records: device nodes take no \
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
pub(super) fn probe_records(fd: RawFd) -> Result<(), String> {
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

pub(super) fn xattr_reason(errno: i32) -> String {
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

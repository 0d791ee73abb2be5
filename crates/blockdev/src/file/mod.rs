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
//!
//! This file opens the device and answers the `BlockDevice` calls; `open.rs`
//! opens the backing store, `ring.rs` holds the ring and its reaper, and
//! `records.rs` the extended attributes device-kept records live in.

mod open;
mod records;
mod ring;
#[cfg(test)]
mod tests;

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use crate::{
    BlockDevice, BlockError, Geometry, IoFuture, IoRequest, RECORD_MAX, RecordKind, human_size,
};
use open::{
    BLKGETSIZE64, BLKSSZGET, Kind, config, create_file, ioctl_int, ioctl_u64, last_errno,
    open_direct_or_buffered, probe_punch_hole, shut_down,
};
pub use records::record_xattr;
use records::{BLOCK_DEVICE_NO_RECORDS, probe_records};
use ring::Inner;

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

        let inner = Inner::new(&shown.to_string(), file, kind, geo, punch_hole)?;
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
        self.inner.request_stop();
        handle
            .join()
            .map_err(|_| BlockError::Io(io::Error::other("io_uring reaper thread panicked")))
    }

    #[cfg(test)]
    fn force_zero_writes(&self) {
        self.inner
            .zero_range
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

impl BlockDevice for FileDevice {
    fn geometry(&self) -> Geometry {
        self.inner.geo
    }

    fn submit(&self, req: IoRequest) -> IoFuture {
        self.inner.submit(req)
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

//! Drives: the node's raw devices (RAM, files, block devices), from which
//! volumes are built.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use blockdev::{
    BlockDevice, BlockOp, FileDevice, FileOptions, IoCheck, IoDone, IoFuture, IoRequest,
    MemAllocation, MemDevice,
};

/// A drive as the TOML file declares it.
#[derive(Debug, Clone, Default)]
pub struct DriveSpec {
    pub name: String,
    /// "mem" or "file".
    pub backend: String,
    pub size: Option<u64>,
    pub path: Option<PathBuf>,
    pub create: bool,
    pub block_size: u32,
    /// Served to other nodes (JBOF mode).
    pub export: bool,
    pub export_hosts: Vec<String>,
    /// backend = "remote": where it is (None: resolved from `peer:drive`).
    pub url: Option<String>,
    /// backend = "mem": all the RAM up front (`thin = false`), else on first write.
    pub preallocate: bool,
}

pub struct Drive {
    pub name: String,
    pub backend: String,
    pub dev: Arc<dyn BlockDevice>,
    /// Failed by the operator (`flashpool drive fail`) or by I/O errors
    /// while it was a volume member; a failed drive is not used again.
    pub failed: bool,
    /// Never written since the node opened it and reads as zeroes (a new
    /// RAM drive): a volume made only of fresh drives needs no initial sync.
    pub fresh: bool,
    /// A file or block device: its path.
    pub path: Option<PathBuf>,
    /// Served to other nodes (JBOF mode).
    pub export: Option<super::DriveExport>,
    /// Another node's drive, reached over NVMe/TCP (the same device as `dev`).
    pub remote: Option<Arc<nvmf_host::remote::RemoteDevice>>,
    /// Declared in the TOML (else a remote drive opened through the API,
    /// kept in `state_dir/remote-drives.json`).
    pub from_config: bool,
    /// A hot spare (`spare = true`): taken by itself when a member of a
    /// redundant volume fails.
    pub spare: bool,
    /// What went through `dev` (for metrics).
    pub io: Arc<DriveIoStats>,
}

impl DriveSpec {
    /// Opens the drive. Errors name the drive and say what to change.
    pub fn open(&self) -> Result<Drive, String> {
        let key = format!("drive {}", self.name);
        let dev: Arc<dyn BlockDevice> = match self.backend.as_str() {
            "mem" => {
                let size = self.size.ok_or_else(|| {
                    format!("{key}: a mem drive needs a size, e.g. size = \"1GiB\"")
                })?;
                let alloc = if self.preallocate {
                    MemAllocation::Full
                } else {
                    MemAllocation::Ahead
                };
                Arc::new(
                    MemDevice::with_allocation(size, self.block_size, alloc)
                        .map_err(|e| format!("{key}: {e}"))?,
                )
            }
            "file" => {
                let path = self.path.clone().ok_or_else(|| {
                    format!("{key}: a file drive needs path = \"/dev/... or /path/to/file\"")
                })?;
                Arc::new(
                    FileDevice::open(FileOptions {
                        path,
                        size: self.size,
                        block_size: self.block_size,
                        create: self.create,
                    })
                    .map_err(|e| format!("{key}: {e}"))?,
                )
            }
            "remote" => {
                return Err(format!(
                    "{key}: a remote drive is opened by the node (Node::open_remote)"
                ));
            }
            b => {
                return Err(format!(
                    "{key}: backend = {b:?} is unknown; use \"mem\", \"file\" or \"remote\""
                ));
            }
        };
        let (dev, io) = MeteredDevice::wrap(dev);
        Ok(Drive {
            name: self.name.clone(),
            backend: self.backend.clone(),
            fresh: self.backend == "mem",
            dev,
            io,
            failed: false,
            path: self.path.clone(),
            export: None,
            remote: None,
            from_config: true,
            spare: false,
        })
    }
}

impl IoCheck for DriveIoStats {
    fn on_done(&self, d: &mut IoDone) {
        if d.result.is_err() {
            self.errors.fetch_add(1, Relaxed);
        }
    }
}

/// Per drive: what its users (volumes, remote hosts of an exported drive)
/// asked of it, counted by [`MeteredDevice`] as requests are submitted, and
/// the requests that failed, counted as they complete.
#[derive(Default)]
pub struct DriveIoStats {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    /// Flush, Write Zeroes, Deallocate.
    pub other: AtomicU64,
    pub errors: AtomicU64,
}

/// A drive's device with its counters: every user of the drive goes
/// through it. Requests are counted as submitted; failures as they complete,
/// by a check that rides on the drive's own future (no allocation).
pub struct MeteredDevice {
    inner: Arc<dyn BlockDevice>,
    stats: Arc<DriveIoStats>,
    /// The drive's block size (fixed), so a request's bytes cost no call.
    block_size: u64,
}

impl MeteredDevice {
    pub fn wrap(inner: Arc<dyn BlockDevice>) -> (Arc<dyn BlockDevice>, Arc<DriveIoStats>) {
        let stats = Arc::<DriveIoStats>::default();
        let dev = Arc::new(MeteredDevice {
            block_size: u64::from(inner.geometry().block_size),
            inner,
            stats: stats.clone(),
        });
        (dev, stats)
    }
}

impl BlockDevice for MeteredDevice {
    blockdev::forward_block_device!(self => self.inner, except [submit]);

    fn submit(&self, req: IoRequest) -> IoFuture {
        let s = &self.stats;
        let bytes = u64::from(req.blocks) * self.block_size;
        match req.op {
            BlockOp::Read => {
                s.reads.fetch_add(1, Relaxed);
                s.read_bytes.fetch_add(bytes, Relaxed);
            }
            BlockOp::Write { .. } => {
                s.writes.fetch_add(1, Relaxed);
                s.write_bytes.fetch_add(bytes, Relaxed);
            }
            BlockOp::Flush | BlockOp::WriteZeroes | BlockOp::Deallocate => {
                s.other.fetch_add(1, Relaxed);
            }
        }
        self.inner.submit(req).then_check(&self.stats)
    }
}

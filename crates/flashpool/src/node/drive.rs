//! Drives: the node's raw devices (RAM, files, block devices), from which
//! volumes are built.

use std::path::PathBuf;
use std::sync::Arc;

use blockdev::{BlockDevice, FileDevice, FileOptions, MemDevice};

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
                Arc::new(MemDevice::new(size, self.block_size).map_err(|e| format!("{key}: {e}"))?)
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
        Ok(Drive {
            name: self.name.clone(),
            backend: self.backend.clone(),
            fresh: self.backend == "mem",
            dev,
            failed: false,
            path: self.path.clone(),
            export: None,
            remote: None,
            from_config: true,
            spare: false,
        })
    }
}

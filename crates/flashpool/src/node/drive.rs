//! Drives: the node's raw devices (RAM, files, block devices), from which
//! volumes are built.

use std::path::PathBuf;
use std::sync::Arc;

use blockdev::{BlockDevice, FileDevice, FileOptions, MemDevice};

/// A drive as the TOML file declares it.
#[derive(Debug, Clone)]
pub struct DriveSpec {
    pub name: String,
    /// "mem" or "file".
    pub backend: String,
    pub size: Option<u64>,
    pub path: Option<PathBuf>,
    pub create: bool,
    pub block_size: u32,
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
            b => {
                return Err(format!(
                    "{key}: backend = {b:?} is unknown; use \"mem\" or \"file\""
                ));
            }
        };
        Ok(Drive {
            name: self.name.clone(),
            backend: self.backend.clone(),
            fresh: self.backend == "mem",
            dev,
            failed: false,
        })
    }
}

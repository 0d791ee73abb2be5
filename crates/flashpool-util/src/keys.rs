//! Secrets in the TOML are file references: a key file holds one line and,
//! like an ssh key, must not be readable by group or others. No error quotes
//! the file's content.

use std::path::Path;

use anyhow::{Result, bail};

/// The text of the private key file `path` (TOML key `key`), holding `what`;
/// `make` says how to make one, for the error when it cannot be read.
pub fn read_private(key: &str, path: &Path, what: &str, make: &str) -> Result<String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| {
        anyhow::anyhow!(
            "config: {key} = {:?}: cannot read the key file: {e}; check the path \
             (make one with `{make}; chmod 600 FILE`)",
            path.display()
        )
    })?;
    if !meta.is_file() {
        bail!(
            "config: {key} = {:?} is not a regular file; give the file that holds the {what}",
            path.display()
        );
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        bail!(
            "config: {key} = {:?}: the key file is accessible by group or others (mode {mode:04o}); \
             a {what} must be private: chmod 600 {}",
            path.display(),
            path.display()
        );
    }
    std::fs::read_to_string(path).map_err(|e| {
        anyhow::anyhow!(
            "config: {key} = {:?}: cannot read the key file: {e}",
            path.display()
        )
    })
}

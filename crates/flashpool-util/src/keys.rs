//! Secrets in the TOML (and on the bench's command line) are file
//! references: a key file holds one line and, like an ssh key, must not be
//! readable by group or others. No error quotes the file's content.
//!
//! Here: the private file itself, a DH-HMAC-CHAP secret (`DHHC-1:hh:base64:`,
//! as `nvme gen-dhchap-key` prints it) or a host/controller pair of them, and
//! a configured TLS PSK (`NVMeTLSkey-1:hh:base64:`). The node's config and
//! `flashpool bench` read keys the same way, with the same words.

use std::path::Path;

use anyhow::{Result, bail};
use nvme_wire::auth::dhchap::Secret;
use nvme_wire::tls_psk::ConfiguredPsk;

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

/// Reads and parses the secret in `path`, for the TOML key `key`. Refuses a
/// file that group or others may read or write (`chmod 600` fixes it).
pub fn read_secret(key: &str, path: &Path) -> Result<Secret> {
    let text = read_private(
        key,
        path,
        "DH-HMAC-CHAP secret",
        "nvme gen-dhchap-key --nqn <hostnqn> > FILE",
    )?;
    Secret::parse(&text).map_err(|e| {
        anyhow::anyhow!(
            "config: {key} = {:?}: not a DH-HMAC-CHAP secret: {e}; \
             the file holds one line as printed by `nvme gen-dhchap-key`",
            path.display()
        )
    })
}

/// A host key and an optional controller key, read from their files;
/// `None` when neither is given. A controller key alone is refused.
pub fn key_pair(
    key: &str,
    host_key: Option<&Path>,
    ctrl_key: Option<&Path>,
) -> Result<Option<(Secret, Option<Secret>)>> {
    match (host_key, ctrl_key) {
        (None, None) => Ok(None),
        (None, Some(_)) => bail!(
            "config: {key}.dhchap_ctrl_key_file is set without dhchap_key_file; \
             bidirectional authentication needs the host's secret too: add dhchap_key_file"
        ),
        (Some(h), c) => {
            let host = read_secret(&format!("{key}.dhchap_key_file"), h)?;
            let ctrl = c
                .map(|c| read_secret(&format!("{key}.dhchap_ctrl_key_file"), c))
                .transpose()?;
            if ctrl.as_ref() == Some(&host) {
                bail!(
                    "config: {key}: dhchap_ctrl_key_file holds the same secret as dhchap_key_file; \
                     give the controller its own secret (Linux refuses the pair too)"
                );
            }
            Ok(Some((host, ctrl)))
        }
    }
}

/// Reads a configured TLS PSK (`NVMeTLSkey-1:hh:base64:`) from a private file.
pub fn read_psk(key: &str, path: &Path) -> Result<ConfiguredPsk> {
    let text = read_private(key, path, "TLS PSK", "nvme gen-tls-key --hmac=1 > FILE")?;
    ConfiguredPsk::parse(&text).map_err(|e| {
        anyhow::anyhow!(
            "config: {key} = {:?}: not a configured TLS PSK: {e}; \
             the file holds one line as printed by `nvme gen-tls-key`",
            path.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    const KEY1: &str = "DHHC-1:01:bSgQW88LJfmZUWiLUJp+QZFfzn4NYW39jUAuKJq6lE1goHr6:";
    const PSK: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";

    /// A fresh directory for key files.
    fn key_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "flashpool-util-keys-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// `text` in a new file `name` of `dir`, with `mode`.
    fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn key_files_are_private_and_valid() {
        let dir = key_dir();
        let good = write(&dir, "k", &format!("{KEY1}\n"), 0o600);
        assert!(read_secret("x", &good).is_ok());
        let open = write(&dir, "open", KEY1, 0o644);
        let e = read_secret("subsystem[0].host[0].dhchap_key_file", &open)
            .unwrap_err()
            .to_string();
        assert!(e.contains("subsystem[0].host[0].dhchap_key_file"), "{e}");
        assert!(e.contains("chmod 600") && e.contains("0644"), "{e}");
        assert!(!e.contains("bSgQW88"), "the secret leaked: {e}");
        let bad = write(
            &dir,
            "bad",
            "DHHC-1:01:bSgQW88LJfmZUWiLUJp+QZFfzn4NYW39jUAuKJq6lE1goHr7:",
            0o600,
        );
        let e = read_secret("k", &bad).unwrap_err().to_string();
        assert!(e.contains("not a DH-HMAC-CHAP secret"), "{e}");
        assert!(!e.contains("bSgQW88"), "the secret leaked: {e}");
        let e = read_secret("k", &dir.join("none")).unwrap_err().to_string();
        assert!(e.contains("cannot read the key file"), "{e}");
        let e = key_pair("node", None, Some(&good)).unwrap_err().to_string();
        assert!(e.contains("add dhchap_key_file"), "{e}");
        let e = key_pair("node", Some(&good), Some(&good))
            .unwrap_err()
            .to_string();
        assert!(e.contains("its own secret"), "{e}");
    }

    #[test]
    fn psk_files_are_private_and_well_formed() {
        let d = key_dir();
        let ok = write(&d, "ok.psk", PSK, 0o600);
        let psk = read_psk("k", &ok).unwrap();
        assert_eq!(psk.to_interchange(), PSK);
        let open = write(&d, "open.psk", PSK, 0o644);
        let e = read_psk("k", &open).unwrap_err().to_string();
        assert!(e.contains("chmod 600") && !e.contains(&PSK[16..]), "{e}");
        let bad = write(&d, "bad.psk", &PSK.replace("VRL", "WRL"), 0o600);
        let e = read_psk("k", &bad).unwrap_err().to_string();
        assert!(e.contains("CRC-32") && !e.contains(&PSK[20..]), "{e}");
        let dh = write(&d, "dh.psk", "DHHC-1:00:x:", 0o600);
        assert!(
            read_psk("k", &dh)
                .unwrap_err()
                .to_string()
                .contains("NVMeTLSkey-1:")
        );
    }
}

//! DH-HMAC-CHAP secrets in the TOML: always as key files, never inline, so
//! the configuration can be shown and copied without them. A key file holds
//! one `DHHC-1:hh:base64:` string (what `nvme gen-dhchap-key` prints) and,
//! like an ssh key, must not be readable by group or others. No error and no
//! log line quotes a secret.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use nvme_wire::auth::dhchap::Secret;
use serde::Deserialize;

/// `[[subsystem.host]]`: a host allowed on the subsystem, with the secrets
/// it authenticates with (none: it connects without authentication unless
/// the subsystem has `require_auth = true`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubsystemHostSection {
    pub nqn: String,
    /// The host's secret: the host must prove it knows it.
    pub dhchap_key_file: Option<PathBuf>,
    /// The controller's secret (bidirectional): the target proves it to a
    /// host that asks (`nvme connect --dhchap-ctrl-secret`).
    pub dhchap_ctrl_key_file: Option<PathBuf>,
    /// The host's configured TLS PSK (`NVMeTLSkey-1:`): the host must then
    /// connect over TLS 1.3 (see `config::tls`).
    pub tls_key_file: Option<PathBuf>,
    /// The host derives version 0 TLS PSK identities as libnvme before 1.16
    /// does (nvme-cli up to 2.15, e.g. Debian 13); see `config::tls`.
    #[serde(default)]
    pub tls_key_compat: bool,
}

/// Reads and parses the secret in `path`, for the TOML key `key`. Refuses a
/// file that group or others may read or write (`chmod 600` fixes it).
pub fn read_secret(key: &str, path: &Path) -> Result<Secret> {
    let text = super::keyfile::read_private(
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const KEY1: &str = "DHHC-1:01:bSgQW88LJfmZUWiLUJp+QZFfzn4NYW39jUAuKJq6lE1goHr6:";

    /// A fresh directory for key files.
    pub(crate) fn key_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "flashpool-keys-{}-{:?}",
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
    pub(crate) fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
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
}

//! DH-HMAC-CHAP secrets in the TOML: always as key files, never inline, so
//! the configuration can be shown and copied without them. A key file holds
//! one `DHHC-1:hh:base64:` string (what `nvme gen-dhchap-key` prints) and,
//! like an ssh key, must not be readable by group or others. No error and no
//! log line quotes a secret.

use std::path::PathBuf;

use anyhow::{Result, bail};
use nvme_wire::auth::dhchap::{DhGroup, HashId, Secret};
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
    /// Hash functions the controller may pick for this host, in its order
    /// of preference (`"sha256"`, `"sha384"`, `"sha512"`); default all three.
    /// The host offers its own list and the controller picks the first of
    /// these that the host offers.
    pub dhchap_hashes: Option<Vec<String>>,
    /// DH groups likewise (`"null"`, `"ffdhe2048"` .. `"ffdhe8192"`);
    /// default the FFDHE groups from 2048 up, then `"null"`.
    pub dhchap_dhgroups: Option<Vec<String>>,
    /// The host's configured TLS PSK (`NVMeTLSkey-1:`): the host must then
    /// connect over TLS 1.3 (see `config::tls`).
    pub tls_key_file: Option<PathBuf>,
    /// The host derives version 0 TLS PSK identities as libnvme before 1.16
    /// does (nvme-cli up to 2.15, e.g. Debian 13); see `config::tls`.
    #[serde(default)]
    pub tls_key_compat: bool,
}

/// The TOML spelling of a hash function: `hmac(sha256)` -> `sha256`.
fn hash_name(h: HashId) -> &'static str {
    h.name().trim_start_matches("hmac(").trim_end_matches(')')
}

/// `names` as values of `all` (spelled by `name`), in the given order: none
/// unknown, none twice, not empty.
fn pick<T: Copy + PartialEq>(
    key: &str,
    names: &[String],
    all: &[T],
    name: fn(T) -> &'static str,
) -> Result<Vec<T>> {
    let known = || {
        all.iter()
            .map(|&v| format!("{:?}", name(v)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if names.is_empty() {
        bail!("config: {key} is empty; name at least one of {}", known());
    }
    let mut out = Vec::with_capacity(names.len());
    for n in names {
        let Some(&v) = all.iter().find(|&&v| name(v) == n.as_str()) else {
            bail!("config: {key}: {n:?} is not known; use {}", known());
        };
        if out.contains(&v) {
            bail!("config: {key}: {n:?} appears twice; name each once");
        }
        out.push(v);
    }
    Ok(out)
}

/// The controller's side of DH-HMAC-CHAP for the host of `[[subsystem.host]]`
/// `h` (TOML key `key`), with its secrets and its `dhchap_hashes` /
/// `dhchap_dhgroups` (default: everything, as `HostAuth::new`).
pub fn host_auth(
    key: &str,
    h: &SubsystemHostSection,
    host_key: Secret,
    ctrl_key: Option<Secret>,
) -> Result<nvmf_target::auth::HostAuth> {
    let mut a = nvmf_target::auth::HostAuth::new(host_key, ctrl_key);
    if let Some(names) = &h.dhchap_hashes {
        a.hashes = pick(
            &format!("{key}.dhchap_hashes"),
            names,
            &HashId::ALL,
            hash_name,
        )?;
    }
    if let Some(names) = &h.dhchap_dhgroups {
        a.dh_groups = pick(
            &format!("{key}.dhchap_dhgroups"),
            names,
            &DhGroup::ALL,
            DhGroup::name,
        )?;
    }
    Ok(a)
}

// Key files are read the same way by `flashpool bench`: the readers live in
// the crate both share.
pub use flashpool_util::keys::key_pair;

#[cfg(test)]
pub(crate) mod tests {
    use std::path::Path;

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
}

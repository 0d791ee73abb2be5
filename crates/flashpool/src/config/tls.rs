//! TLS 1.3 for NVMe/TCP (TP 8011) in the TOML: `[[listener]] tls`,
//! `[[subsystem]] require_tls` and `[[subsystem.host]] tls_key_file`.
//!
//! A host with a `tls_key_file` must come over TLS with a PSK derived from
//! that key (its Connect over plain TCP is refused); `require_tls` refuses
//! every plain connection to the subsystem.

use std::path::Path;

use anyhow::{Result, bail};
use nvme_wire::tls_psk::ConfiguredPsk;
use nvmf_target::{ListenerConfig, Subsystem, TlsMode};

use super::SubsystemSection;

/// `[[listener]] tls`: "none" (default), "optional" or "required".
pub fn listener_mode(key: &str, v: Option<&str>) -> Result<TlsMode> {
    Ok(match v.unwrap_or("none") {
        "none" => TlsMode::None,
        "optional" => TlsMode::Optional,
        "required" => TlsMode::Required,
        v => bail!("config: {key} = {v:?} is unknown; use \"none\", \"optional\" or \"required\""),
    })
}

/// Reads a configured TLS PSK (`NVMeTLSkey-1:hh:base64:`) from a private file.
pub fn read_psk(key: &str, path: &Path) -> Result<ConfiguredPsk> {
    let text =
        super::keyfile::read_private(key, path, "TLS PSK", "nvme gen-tls-key --hmac=1 > FILE")?;
    ConfiguredPsk::parse(&text).map_err(|e| {
        anyhow::anyhow!(
            "config: {key} = {:?}: not a configured TLS PSK: {e}; \
             the file holds one line as printed by `nvme gen-tls-key`",
            path.display()
        )
    })
}

/// Applies `require_tls` and each host's `tls_key_file` to `sub`.
pub fn apply(key: &str, s: &SubsystemSection, sub: &mut Subsystem) -> Result<()> {
    sub.set_require_tls(s.require_tls);
    for (j, h) in s.host.iter().enumerate() {
        if let Some(p) = &h.tls_key_file {
            let psk = read_psk(&format!("{key}.host[{j}].tls_key_file"), p)?;
            tracing::info!(
                "subsystem {}: host {} must connect over TLS (PSK hash {:02})",
                s.nqn,
                h.nqn,
                psk.hash().id()
            );
            sub.set_host_tls(h.nqn.clone(), psk);
        }
    }
    Ok(())
}

/// A TLS listener that no host can use, or a subsystem that requires TLS
/// with no TLS listener, is a configuration that cannot work: refused.
pub fn check(listeners: &[ListenerConfig], subs: &[SubsystemSection]) -> Result<()> {
    let tls_listener = listeners.iter().any(|l| l.tls != TlsMode::None);
    let keys = subs
        .iter()
        .any(|s| s.host.iter().any(|h| h.tls_key_file.is_some()));
    if let Some(l) = listeners.iter().find(|l| l.tls == TlsMode::Required)
        && !keys
    {
        bail!(
            "config: the listener on {} requires TLS but no [[subsystem.host]] has a tls_key_file, \
             so no host could connect; give the hosts their keys or set tls = \"optional\"/\"none\"",
            l.addr
        );
    }
    if !tls_listener
        && let Some(s) = subs
            .iter()
            .find(|s| s.require_tls || s.host.iter().any(|h| h.tls_key_file.is_some()))
    {
        bail!(
            "config: subsystem {} needs TLS (require_tls or a host's tls_key_file) but no \
             [[listener]] has tls = \"required\" or \"optional\"; add tls to a listener",
            s.nqn
        );
    }
    Ok(())
}

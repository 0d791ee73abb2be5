//! TLS 1.3 for NVMe/TCP (TP 8011) in the TOML: `[[listener]] tls`,
//! `[[subsystem]] require_tls` and `[[subsystem.host]] tls_key_file`.
//!
//! A host with a `tls_key_file` must come over TLS with a PSK derived from
//! that key (its Connect over plain TCP is refused); `require_tls` refuses
//! every plain connection to the subsystem.

use anyhow::{Result, bail};
use nvme_wire::tls_psk::Derivation;
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

// Shared with `flashpool bench --tls-key-file`.
pub use flashpool_util::keys::read_psk;

/// Applies `require_tls` and each host's `tls_key_file` to `sub`.
pub fn apply(key: &str, s: &SubsystemSection, sub: &mut Subsystem) -> Result<()> {
    sub.set_require_tls(s.require_tls);
    for (j, h) in s.host.iter().enumerate() {
        if h.tls_key_compat && h.tls_key_file.is_none() {
            bail!(
                "config: {key}.host[{j}].tls_key_compat is set without tls_key_file; \
                 give the host its key or remove tls_key_compat"
            );
        }
        if let Some(p) = &h.tls_key_file {
            let psk = read_psk(&format!("{key}.host[{j}].tls_key_file"), p)?.with_derivation(
                if h.tls_key_compat {
                    Derivation::LibnvmeCompat
                } else {
                    Derivation::Rfc8446
                },
            );
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
/// `peer_keys`: some `[[peer]]` has a `tls_key_file` (for drive exports).
pub fn check(
    listeners: &[ListenerConfig],
    subs: &[SubsystemSection],
    peer_keys: bool,
) -> Result<()> {
    let tls_listener = listeners.iter().any(|l| l.tls != TlsMode::None);
    let keys = peer_keys
        || subs
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
    if !tls_listener && peer_keys {
        bail!(
            "config: a [[peer]] has a tls_key_file (it must reach this node's drive exports over \
             TLS) but no [[listener]] has tls = \"required\" or \"optional\"; add tls to a listener"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::auth::tests::{key_dir, write};

    const KEY: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";

    fn checked(toml: &str) -> Result<()> {
        let cfg = crate::config::parse(toml, "test").unwrap();
        let ls = crate::config::listeners(&cfg).unwrap();
        check(
            &ls,
            &cfg.subsystem,
            cfg.peer.iter().any(|p| p.tls_key_file.is_some()),
        )
    }

    #[test]
    fn listener_modes_and_a_wrong_one() {
        assert_eq!(listener_mode("k", None).unwrap(), TlsMode::None);
        assert_eq!(
            listener_mode("k", Some("optional")).unwrap(),
            TlsMode::Optional
        );
        assert_eq!(
            listener_mode("k", Some("required")).unwrap(),
            TlsMode::Required
        );
        let e = listener_mode("listener[1].tls", Some("yes"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("listener[1].tls = \"yes\" is unknown"), "{e}");
    }

    #[test]
    fn configurations_that_cannot_work_are_refused() {
        let d = key_dir();
        let k = write(&d, "h.psk", KEY, 0o600);
        let sub = |extra: &str| {
            format!(
                "[[subsystem]]\nnqn = \"nqn.2026-01.io.flashpool:t\"\n{extra}\
                 [[subsystem.namespace]]\nnsid = 1\nbackend = \"null\"\nsize = \"1MiB\"\n"
            )
        };
        let host =
            format!("[[subsystem.host]]\nnqn = \"nqn.2014-08.org.x:h\"\ntls_key_file = {k:?}\n");
        let tls_l = "[[listener]]\naddress = \"127.0.0.1\"\nport = 4420\ntls = \"required\"\n";
        // required listener, no key anywhere
        let e = checked(&format!("{tls_l}{}", sub("")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("requires TLS but no [[subsystem.host]]"), "{e}");
        // a key, or require_tls, without a TLS listener
        let e = checked(&sub(&host)).unwrap_err().to_string();
        assert!(e.contains("needs TLS"), "{e}");
        let e = checked(&sub("require_tls = true\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs TLS"), "{e}");
        let peer =
            format!("[[peer]]\nname = \"e\"\naddress = \"127.0.0.1:1\"\ntls_key_file = {k:?}\n");
        let e = checked(&format!("{peer}{}", sub("")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("[[peer]] has a tls_key_file"), "{e}");
        // and what works
        checked(&format!("{tls_l}{}", sub(&host))).unwrap();
        checked(&format!("{tls_l}{peer}{}", sub(""))).unwrap();
        checked(&sub("")).unwrap();
    }
}

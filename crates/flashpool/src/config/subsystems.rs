//! `[[subsystem]]` and its namespaces and hosts: what the target serves
//! and to whom, checked and turned into the target's subsystems.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Result, bail};
use blockdev::{BlockDevice, FileDevice, FileOptions, MemAllocation, MemDevice, NullDevice};
use nvmf_target::{Namespace, Subsystem};
use serde::Deserialize;

use super::auth::{self, SubsystemHostSection};
use super::tls;
use super::values::{Size, derived_id, fnv, mem_thin, parse_hex, range};
use crate::node::VolumeNamespace;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubsystemSection {
    pub nqn: String,
    pub serial: Option<String>,
    pub model: Option<String>,
    #[serde(default)]
    pub allow_any_host: bool,
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Hosts with their DH-HMAC-CHAP key files (`[[subsystem.host]]`);
    /// each is allowed, as if listed in `hosts`.
    #[serde(default)]
    pub host: Vec<SubsystemHostSection>,
    /// Every host must authenticate: refuses `allow_any_host` and a host
    /// without `dhchap_key_file`.
    #[serde(default)]
    pub require_auth: bool,
    /// Every host must connect over TLS 1.3 (see `config::tls`).
    #[serde(default)]
    pub require_tls: bool,
    #[serde(default)]
    pub namespace: Vec<NamespaceSection>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceSection {
    pub nsid: u32,
    pub backend: String,
    pub size: Option<Size>,
    #[serde(default = "bs512")]
    pub block_size: u32,
    pub path: Option<PathBuf>,
    #[serde(default)]
    pub create: bool,
    pub uuid: Option<String>,
    pub nguid: Option<String>,
    /// For backend = "volume": the volume's name.
    pub volume: Option<String>,
    /// backend = "mem": false allocates all the RAM up front (in the
    /// background, from the start); true (the default) on first write.
    pub thin: Option<bool>,
}

fn bs512() -> u32 {
    512
}

/// Finds the device of a `backend = "volume"` namespace: (volume, nqn, nsid).
pub type VolumeResolver<'a> = &'a dyn Fn(&str, &str, u32) -> VolumeNamespace;

pub(super) fn subsystem(
    key: &str,
    s: &SubsystemSection,
    volumes: VolumeResolver<'_>,
) -> Result<Subsystem> {
    let serial = s
        .serial
        .clone()
        .unwrap_or_else(|| format!("FP{:016X}", fnv(s.nqn.as_bytes(), 1)));
    if serial.is_empty() || serial.len() > 20 || !serial.bytes().all(|c| (0x20..0x7f).contains(&c))
    {
        bail!("config: {key}.serial = {serial:?} must be 1 to 20 printable ASCII characters");
    }
    let model = s.model.clone().unwrap_or_else(|| "flashpool".into());
    if model.is_empty() || model.len() > 40 || !model.bytes().all(|c| (0x20..0x7f).contains(&c)) {
        bail!("config: {key}.model = {model:?} must be 1 to 40 printable ASCII characters");
    }
    if !s.allow_any_host && s.hosts.is_empty() && s.host.is_empty() {
        bail!(
            "config: {key} ({}) allows no host: set allow_any_host = true or list host NQNs in hosts",
            s.nqn
        );
    }
    for (j, h) in s.hosts.iter().enumerate() {
        if !h.starts_with("nqn.") || h.len() > 223 {
            bail!(
                "config: {key}.hosts[{j}] = {h:?} is not a valid host NQN (nqn...., at most 223 bytes)"
            );
        }
    }
    let mut hosts = s.hosts.clone();
    let mut auth = Vec::new();
    let mut seen = HashSet::new();
    for (j, h) in s.host.iter().enumerate() {
        let hkey = format!("{key}.host[{j}]");
        if !h.nqn.starts_with("nqn.") || h.nqn.len() > 223 {
            bail!(
                "config: {hkey}.nqn = {:?} is not a valid host NQN (nqn...., at most 223 bytes)",
                h.nqn
            );
        }
        if !seen.insert(h.nqn.as_str()) {
            bail!(
                "config: {hkey}.nqn = {:?} appears twice in [[subsystem.host]] of {}; keep one entry per host",
                h.nqn,
                s.nqn
            );
        }
        if !hosts.contains(&h.nqn) {
            hosts.push(h.nqn.clone());
        }
        let pair = auth::key_pair(
            &hkey,
            h.dhchap_key_file.as_deref(),
            h.dhchap_ctrl_key_file.as_deref(),
        )?;
        match pair {
            Some((host_key, ctrl_key)) => auth.push((
                h.nqn.clone(),
                auth::host_auth(&hkey, h, host_key, ctrl_key)?,
            )),
            None if h.dhchap_hashes.is_some() || h.dhchap_dhgroups.is_some() => bail!(
                "config: {hkey} ({}): dhchap_hashes and dhchap_dhgroups choose how the host \
                 authenticates, but it has no dhchap_key_file; add one or remove them",
                h.nqn
            ),
            None if s.require_auth => bail!(
                "config: {hkey} ({}): subsystem {} has require_auth = true but this host has no \
                 dhchap_key_file; give it one or set require_auth = false",
                h.nqn,
                s.nqn
            ),
            None => {}
        }
    }
    if s.require_auth {
        if s.allow_any_host {
            bail!(
                "config: {key} ({}): require_auth = true and allow_any_host = true conflict \
                 (an unknown host has no secret); set allow_any_host = false and give each host \
                 a [[subsystem.host]] with dhchap_key_file",
                s.nqn
            );
        }
        if let Some(h) = s.hosts.iter().find(|h| !seen.contains(h.as_str())) {
            bail!(
                "config: {key} ({}): require_auth = true but host {h:?} in hosts has no secret; \
                 give it a [[subsystem.host]] with nqn = {h:?} and dhchap_key_file",
                s.nqn
            );
        }
    }
    let mut nsids = HashSet::new();
    let mut namespaces = Vec::new();
    for (j, n) in s.namespace.iter().enumerate() {
        let nkey = format!("{key}.namespace[{j}]");
        range(
            &format!("{nkey}.nsid"),
            n.nsid,
            1,
            nvmf_target::subsystem::MAX_NSID,
        )?;
        if !nsids.insert(n.nsid) {
            bail!(
                "config: {nkey}.nsid = {} is used twice in {}; give each namespace its own nsid",
                n.nsid,
                s.nqn
            );
        }
        let dev = if n.backend == "volume" {
            let name = n.volume.as_deref().ok_or_else(|| {
                anyhow::anyhow!(
                    "config: {nkey}.volume is missing; backend = \"volume\" needs volume = \"NAME\""
                )
            })?;
            if n.size.is_some() || n.path.is_some() {
                bail!(
                    "config: {nkey}: a volume namespace takes its size from the volume; remove size and path"
                );
            }
            match volumes(name, &s.nqn, n.nsid) {
                VolumeNamespace::Device(d) => d,
                VolumeNamespace::NotServed(why) => {
                    tracing::error!(
                        "config: {nkey} (nsid {} of {}): not served: {why}",
                        n.nsid,
                        s.nqn
                    );
                    continue;
                }
                VolumeNamespace::Unknown => bail!(
                    "config: {nkey}.volume = {name:?}: no such volume; declare it in [[volume]] (or create it with `flashpool volume create`)"
                ),
            }
        } else {
            if n.volume.is_some() {
                bail!(
                    "config: {nkey}.volume is only for backend = \"volume\"; remove it or change the backend"
                );
            }
            device(&nkey, n)?
        };
        let uuid = match &n.uuid {
            Some(u) => parse_hex(&format!("{nkey}.uuid"), u)?,
            None => derived_id(&s.nqn, n.nsid, 11),
        };
        let nguid = match &n.nguid {
            Some(u) => parse_hex(&format!("{nkey}.nguid"), u)?,
            None => derived_id(&s.nqn, n.nsid, 29),
        };
        namespaces.push(Namespace::new(n.nsid, dev, uuid, nguid));
    }
    namespaces.sort_by_key(|n| n.nsid);
    let mut sub = Subsystem::new(
        s.nqn.clone(),
        serial,
        model,
        s.allow_any_host,
        hosts,
        namespaces,
    );
    for (nqn, a) in auth {
        tracing::info!(
            "subsystem {}: host {nqn} must authenticate (DH-HMAC-CHAP{})",
            s.nqn,
            if a.ctrl_key.is_some() {
                ", bidirectional"
            } else {
                ""
            }
        );
        tracing::debug!(
            "subsystem {}: host {nqn} may use hashes {:?} and DH groups {:?}",
            s.nqn,
            a.hashes.iter().map(|h| h.name()).collect::<Vec<_>>(),
            a.dh_groups.iter().map(|g| g.name()).collect::<Vec<_>>()
        );
        sub.set_host_auth(nqn, a);
    }
    tls::apply(key, s, &mut sub)?;
    Ok(sub)
}

fn device(key: &str, n: &NamespaceSection) -> Result<Arc<dyn BlockDevice>> {
    if n.block_size != 512 && n.block_size != 4096 {
        bail!(
            "config: {key}.block_size = {} is not supported; use 512 or 4096",
            n.block_size
        );
    }
    let size = n.size.map(Size::bytes);
    let need_size = || -> Result<u64> {
        let s = size.ok_or_else(|| {
            anyhow::anyhow!(
                "config: {key}.size is missing; a {} namespace needs a size, e.g. size = \"1GiB\"",
                n.backend
            )
        })?;
        if s == 0 || s % u64::from(n.block_size) != 0 {
            bail!(
                "config: {key}.size = {s} is not a non-zero multiple of block_size {}; use e.g. {}",
                n.block_size,
                (s / u64::from(n.block_size)).max(1) * u64::from(n.block_size)
            );
        }
        Ok(s)
    };
    if n.path.is_some() && n.backend != "file" {
        bail!("config: {key}.path is only for backend = \"file\"; remove it or change the backend");
    }
    let thin = mem_thin(key, &n.backend, n.thin)?;
    let dev: Arc<dyn BlockDevice> = match n.backend.as_str() {
        "mem" => Arc::new(
            MemDevice::with_allocation(
                need_size()?,
                n.block_size,
                if thin == Some(false) {
                    MemAllocation::Full
                } else {
                    MemAllocation::Ahead
                },
            )
            .map_err(|e| anyhow::anyhow!("config: {key}: {e}"))?,
        ),
        "null" => Arc::new(
            NullDevice::new(need_size()?, n.block_size)
                .map_err(|e| anyhow::anyhow!("config: {key}: {e}"))?,
        ),
        "file" => {
            let path = n.path.clone().ok_or_else(|| {
                anyhow::anyhow!("config: {key}.path is missing; a file namespace needs path = \"/path/to/file-or-device\"")
            })?;
            if size.is_some() {
                need_size()?;
            }
            Arc::new(
                FileDevice::open(FileOptions {
                    path,
                    size,
                    block_size: n.block_size,
                    create: n.create,
                })
                .map_err(|e| anyhow::anyhow!("config: {key}: {e}"))?,
            )
        }
        b => bail!(
            "config: {key}.backend = {b:?} is unknown; use \"mem\", \"null\", \"file\" or \"volume\""
        ),
    };
    Ok(dev)
}

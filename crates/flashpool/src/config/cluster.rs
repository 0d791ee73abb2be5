//! The parts of the TOML that reach other nodes: this node's identity as a
//! host, its `[[peer]]`s (whose drives it may use), the `[remote]` settings of
//! remote drives, and which of its own drives it exports (JBOF mode).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Result, bail};
use serde::Deserialize;

use super::NodeConfig;

/// Prefix of every NQN flashpool makes up for itself.
pub const NQN_PREFIX: &str = "nqn.2026-01.io.flashpool";

/// Another node whose exported drives this node may use as `peer:drive`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerSection {
    pub name: String,
    /// `ADDR:PORT` of the peer's NVMe/TCP I/O listener.
    pub address: String,
    /// The peer's host NQN, allowed on this node's exported drives
    /// (default `nqn.2026-01.io.flashpool:node:<name>`).
    pub host_nqn: Option<String>,
    /// The DH-HMAC-CHAP secret the peer must present on this node's
    /// exported drives (the peer's `[node] dhchap_key_file`).
    pub dhchap_key_file: Option<std::path::PathBuf>,
    /// The secret this node's exports prove to the peer (the peer's
    /// `[node] dhchap_ctrl_key_file`).
    pub dhchap_ctrl_key_file: Option<std::path::PathBuf>,
    /// The configured TLS PSK the peer must connect with to this node's
    /// exported drives (the peer's `[node] tls_key_file`).
    pub tls_key_file: Option<std::path::PathBuf>,
}

/// How remote drives behave when their node goes away.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteSection {
    /// A remote drive unreachable this long is failed (the volume runs
    /// degraded, and re-adds it when it is back).
    #[serde(default = "d_fail_after")]
    pub fail_after_ms: u64,
    /// A command unanswered this long ends its connection (then reconnect).
    #[serde(default = "d_io_timeout")]
    pub io_timeout_ms: u64,
    /// Keep-alive timeout asked of the remote controller.
    #[serde(default = "d_kato")]
    pub kato_ms: u32,
    /// I/O queues (TCP connections) per remote drive.
    #[serde(default = "d_queues")]
    pub queues: u16,
    /// Commands in flight per queue.
    #[serde(default = "d_depth")]
    pub queue_depth: u16,
}

fn d_fail_after() -> u64 {
    2000
}
fn d_io_timeout() -> u64 {
    4000
}
fn d_kato() -> u32 {
    2000
}
fn d_queues() -> u16 {
    2
}
fn d_depth() -> u16 {
    64
}

impl Default for RemoteSection {
    fn default() -> Self {
        RemoteSection {
            fail_after_ms: d_fail_after(),
            io_timeout_ms: d_io_timeout(),
            kato_ms: d_kato(),
            queues: d_queues(),
            queue_depth: d_depth(),
        }
    }
}

/// What this node is to other nodes, checked.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub node_name: String,
    pub host_nqn: String,
    pub host_id: [u8; 16],
    pub peers: Vec<Peer>,
    pub remote: RemoteSettings,
    /// The secrets this node presents on other nodes' exports.
    pub dhchap: Option<nvmf_host::DhchapKeys>,
    /// The TLS PSK this node connects to other nodes' exports with.
    pub tls: Option<nvmf_host::ConfiguredPsk>,
}

#[derive(Debug, Clone)]
pub struct Peer {
    pub name: String,
    pub addr: SocketAddr,
    pub host_nqn: String,
    /// What the peer must authenticate with on this node's exports.
    pub auth: Option<nvmf_target::auth::HostAuth>,
    /// The TLS PSK the peer must use on this node's exports.
    pub tls: Option<nvmf_host::ConfiguredPsk>,
}

#[derive(Debug, Clone, Copy)]
pub struct RemoteSettings {
    pub fail_after: Duration,
    pub io_timeout: Duration,
    pub kato_ms: u32,
    pub queues: u16,
    pub queue_depth: u16,
}

/// The host NQN a flashpool node called `name` uses by default.
pub fn node_host_nqn(name: &str) -> String {
    format!("{NQN_PREFIX}:node:{name}")
}

/// The subsystem NQN under which node `node` exports its drive `drive`.
pub fn drive_nqn(node: &str, drive: &str) -> String {
    format!("{NQN_PREFIX}:drive:{node}:{drive}")
}

/// A stable 16-byte identity from a text: the same node name gives the same
/// host ID on every start, so its reservations stay its own.
pub fn stable_id(text: &str) -> [u8; 16] {
    nvmf_host::host_id_from(text)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "flashpool".into())
}

/// Checks the cluster-facing keys of the file.
pub fn cluster(cfg: &NodeConfig) -> Result<Cluster> {
    let n = &cfg.node;
    let node_name = n.name.clone().unwrap_or_else(hostname);
    crate::node::check_name("config: node.name:", &node_name)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let host_nqn = n
        .host_nqn
        .clone()
        .unwrap_or_else(|| node_host_nqn(&node_name));
    super::check_nqn("node.host_nqn", &host_nqn)?;
    let host_id = match &n.host_id {
        Some(s) => nvmf_host::parse_uuid(s).ok_or_else(|| {
            anyhow::anyhow!(
                "config: node.host_id = {s:?} is not a UUID; use 32 hex digits, e.g. \"5f7d6a3c-1b2e-4c8d-9a0b-112233445566\""
            )
        })?,
        None => stable_id(&host_nqn),
    };
    let dhchap = super::auth::key_pair(
        "node",
        n.dhchap_key_file.as_deref(),
        n.dhchap_ctrl_key_file.as_deref(),
    )?
    .map(|(h, c)| nvmf_host::DhchapKeys::new(h, c));
    let tls = n
        .tls_key_file
        .as_deref()
        .map(|p| super::tls::read_psk("node.tls_key_file", p))
        .transpose()?;
    let mut peers = Vec::new();
    let mut seen = HashSet::new();
    for (i, p) in cfg.peer.iter().enumerate() {
        let key = format!("peer[{i}]");
        crate::node::check_name(&format!("config: {key}.name:"), &p.name)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        if !seen.insert(p.name.clone()) || p.name == node_name {
            bail!(
                "config: {key}.name = {:?} is used twice (or is this node's own name); give each peer its own name",
                p.name
            );
        }
        let addr: SocketAddr = p.address.parse().map_err(|_| {
            anyhow::anyhow!(
                "config: {key}.address = {:?} is not ADDR:PORT; use e.g. \"10.0.0.12:4420\"",
                p.address
            )
        })?;
        let host_nqn = p.host_nqn.clone().unwrap_or_else(|| node_host_nqn(&p.name));
        super::check_nqn(&format!("{key}.host_nqn"), &host_nqn)?;
        let auth = super::auth::key_pair(
            &key,
            p.dhchap_key_file.as_deref(),
            p.dhchap_ctrl_key_file.as_deref(),
        )?
        .map(|(h, c)| nvmf_target::auth::HostAuth::new(h, c));
        let tls = p
            .tls_key_file
            .as_deref()
            .map(|f| super::tls::read_psk(&format!("{key}.tls_key_file"), f))
            .transpose()?;
        peers.push(Peer {
            name: p.name.clone(),
            addr,
            host_nqn,
            auth,
            tls,
        });
    }
    let r = &cfg.remote;
    super::range("remote.fail_after_ms", r.fail_after_ms, 100, 600_000)?;
    super::range("remote.io_timeout_ms", r.io_timeout_ms, 100, 600_000)?;
    super::range("remote.kato_ms", r.kato_ms, 500, 600_000)?;
    super::range("remote.queues", r.queues, 1, 64)?;
    super::range("remote.queue_depth", r.queue_depth, 2, 1024)?;
    for (i, d) in cfg.drive.iter().enumerate() {
        let key = format!("drive[{i}]");
        if !d.export && !d.export_hosts.is_empty() {
            bail!(
                "config: {key}.export_hosts is set but export is not; add export = true or remove export_hosts"
            );
        }
        for (j, h) in d.export_hosts.iter().enumerate() {
            super::check_nqn(&format!("{key}.export_hosts[{j}]"), h)?;
        }
        if d.export && d.export_hosts.is_empty() && peers.is_empty() {
            bail!(
                "config: {key}: drive {} is exported but no host may connect to it; \
                 list the owner nodes' host NQNs in export_hosts, or declare them as [[peer]]s",
                d.name
            );
        }
        if d.export && d.backend == "remote" {
            bail!(
                "config: {key}: drive {} is remote; only a node's own drives can be exported",
                d.name
            );
        }
    }
    Ok(Cluster {
        node_name,
        host_nqn,
        host_id,
        peers,
        remote: RemoteSettings {
            fail_after: Duration::from_millis(r.fail_after_ms),
            io_timeout: Duration::from_millis(r.io_timeout_ms),
            kato_ms: r.kato_ms,
            queues: r.queues,
            queue_depth: r.queue_depth,
        },
        dhchap,
        tls,
    })
}

impl Cluster {
    /// Who may connect to this node's exported drives by default.
    pub fn peer_hosts(&self) -> Vec<String> {
        self.peers.iter().map(|p| p.host_nqn.clone()).collect()
    }

    /// The secrets host `nqn` must authenticate with on this node's
    /// exported drives: those of the `[[peer]]` with that host NQN.
    pub fn export_auth(&self, nqn: &str) -> Option<nvmf_target::auth::HostAuth> {
        self.peers
            .iter()
            .find(|p| p.host_nqn == nqn)
            .and_then(|p| p.auth.clone())
    }

    /// The TLS PSK host `nqn` must use on this node's exported drives.
    pub fn export_tls(&self, nqn: &str) -> Option<nvmf_host::ConfiguredPsk> {
        self.peers
            .iter()
            .find(|p| p.host_nqn == nqn)
            .and_then(|p| p.tls.clone())
    }

    /// The URL of `peer:drive`, or of a `tcp://` URL given as is.
    pub fn resolve(&self, name: &str) -> Result<String, String> {
        if name.starts_with("tcp://") {
            return Ok(name.to_string());
        }
        let Some((peer, drive)) = name.split_once(':') else {
            return Err(format!(
                "drive {} is not remote: a remote drive is PEER:DRIVE or tcp://ADDR:PORT/NQN?nsid=N",
                crate::echo::Echo(name)
            ));
        };
        let p = self.peers.iter().find(|p| p.name == peer).ok_or_else(|| {
            format!(
                "drive {}: no [[peer]] named {} in the node's TOML; declare it with its address",
                crate::echo::Echo(name),
                crate::echo::Echo(peer)
            )
        })?;
        Ok(format!(
            "tcp://{}/{}?nsid=1",
            p.addr,
            drive_nqn(&p.name, drive)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> NodeConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn identity_is_stable_and_peers_resolve() {
        let c = cluster(&cfg(
            "[node]\nname = \"n1\"\n[[peer]]\nname = \"e2\"\naddress = \"10.77.0.12:4420\"\n",
        ))
        .unwrap();
        assert_eq!(c.host_nqn, "nqn.2026-01.io.flashpool:node:n1");
        assert_eq!(c.host_id, stable_id("nqn.2026-01.io.flashpool:node:n1"));
        assert_eq!(c.peer_hosts(), ["nqn.2026-01.io.flashpool:node:e2"]);
        assert_eq!(
            c.resolve("e2:d3").unwrap(),
            "tcp://10.77.0.12:4420/nqn.2026-01.io.flashpool:drive:e2:d3?nsid=1"
        );
        assert!(
            c.resolve("e9:d3")
                .unwrap_err()
                .contains("no [[peer]] named \"e9\"")
        );
        assert!(c.resolve("d3").unwrap_err().contains("is not remote"));
        let u = "tcp://127.0.0.1:4420/nqn.x:y?nsid=2";
        assert_eq!(c.resolve(u).unwrap(), u);
    }

    #[test]
    fn bad_cluster_keys_are_named() {
        let err = |t: &str| cluster(&cfg(t)).unwrap_err().to_string();
        assert!(err("[[peer]]\nname = \"e\"\naddress = \"nowhere\"\n").contains("peer[0].address"));
        assert!(err("[node]\nhost_id = \"12\"\n").contains("node.host_id"));
        assert!(
            err("[[drive]]\nname = \"d\"\nbackend = \"mem\"\nsize = 4096\nexport = true\n")
                .contains("no host may connect")
        );
        assert!(err("[remote]\nfail_after_ms = 1\n").contains("remote.fail_after_ms"));
    }
}

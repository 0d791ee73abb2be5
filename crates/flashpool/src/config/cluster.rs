//! The parts of the TOML that reach other nodes: this node's identity as a
//! host, its `[[peer]]`s (whose drives it may use), the `[remote]` settings of
//! remote drives, and which of its own drives it exports (JBOF mode); checked
//! and turned into the node's [`Cluster`] (`node::identity`).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Result, bail};
use serde::Deserialize;

use super::NodeConfig;
use crate::node::identity::{Cluster, Peer, RemoteSettings, hostname, node_host_nqn, stable_id};

/// Another node whose exported drives this node may use as `peer:drive`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerSection {
    pub name: String,
    /// `ADDR:PORT` of the peer's NVMe/TCP I/O listener, where this node
    /// connects to the peer's drives. Needed where this node uses them (a
    /// `[cluster]` node, or a `[[drive]]` named `PEER:DRIVE` without a url);
    /// an enclosure that only exports its drives to the peer leaves it out.
    pub address: Option<String>,
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
    /// How long a takeover waits for each member's connection; one that
    /// does not answer is left out if the layout tolerates it.
    #[serde(default = "d_takeover_wait")]
    pub takeover_wait_ms: u64,
    /// The most standby member links kept open to the drives of volumes
    /// this node would take over (0: none; takeovers then connect).
    #[serde(default = "d_standby_links")]
    pub standby_links: usize,
    /// One more queue per remote drive for each reactor, whose connection
    /// runs on that reactor's thread: member I/O wakes no other thread.
    /// Off: every reactor shares the `queues` (measured in docs/performance.md).
    #[serde(default = "d_reactor_queues")]
    pub reactor_queues: bool,
}

fn d_fail_after() -> u64 {
    RemoteSettings::DEFAULT_FAIL_AFTER_MS
}
fn d_io_timeout() -> u64 {
    RemoteSettings::DEFAULT_IO_TIMEOUT_MS
}
fn d_kato() -> u32 {
    RemoteSettings::DEFAULT_KATO_MS
}
fn d_queues() -> u16 {
    RemoteSettings::DEFAULT_QUEUES
}
fn d_depth() -> u16 {
    RemoteSettings::DEFAULT_QUEUE_DEPTH
}
fn d_takeover_wait() -> u64 {
    RemoteSettings::DEFAULT_TAKEOVER_WAIT_MS
}
fn d_standby_links() -> usize {
    RemoteSettings::DEFAULT_STANDBY_LINKS
}
fn d_reactor_queues() -> bool {
    true
}

impl Default for RemoteSection {
    fn default() -> Self {
        RemoteSection {
            fail_after_ms: d_fail_after(),
            io_timeout_ms: d_io_timeout(),
            kato_ms: d_kato(),
            queues: d_queues(),
            queue_depth: d_depth(),
            takeover_wait_ms: d_takeover_wait(),
            standby_links: d_standby_links(),
            reactor_queues: d_reactor_queues(),
        }
    }
}

/// Why this node connects to `peer`'s drives (so needs its address), if it does.
fn uses_drives_of(cfg: &NodeConfig, peer: &str) -> Option<String> {
    if cfg.cluster.is_some() {
        return Some(
            "this node is a [cluster] node, whose volumes are on its peers' drives".into(),
        );
    }
    cfg.drive
        .iter()
        .enumerate()
        .find(|(_, d)| {
            d.backend == "remote"
                && d.url.is_none()
                && d.name.split_once(':').is_some_and(|(p, _)| p == peer)
        })
        .map(|(i, d)| format!("drive[{i}] {:?} is on it", d.name))
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
    super::values::check_nqn("node.host_nqn", &host_nqn)?;
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
        let addr: Option<SocketAddr> = match &p.address {
            Some(a) => Some(a.parse().map_err(|_| {
                anyhow::anyhow!(
                    "config: {key}.address = {a:?} is not ADDR:PORT; use e.g. \"10.0.0.12:4420\""
                )
            })?),
            None => {
                if let Some(why) = uses_drives_of(cfg, &p.name) {
                    bail!(
                        "config: {key}.address is missing: {why}, so it connects to {}'s \
                         drives; set address = \"ADDR:PORT\" of {}'s NVMe/TCP I/O listener \
                         (only a node that uses none of a peer's drives, such as an enclosure \
                         that exports its own, may leave it out)",
                        p.name,
                        p.name
                    );
                }
                None
            }
        };
        let host_nqn = p.host_nqn.clone().unwrap_or_else(|| node_host_nqn(&p.name));
        super::values::check_nqn(&format!("{key}.host_nqn"), &host_nqn)?;
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
    super::values::range("remote.fail_after_ms", r.fail_after_ms, 100, 600_000)?;
    super::values::range("remote.io_timeout_ms", r.io_timeout_ms, 100, 600_000)?;
    super::values::range("remote.kato_ms", r.kato_ms, 500, 600_000)?;
    super::values::range("remote.queues", r.queues, 1, 64)?;
    super::values::range("remote.queue_depth", r.queue_depth, 2, 1024)?;
    super::values::range("remote.takeover_wait_ms", r.takeover_wait_ms, 50, 60_000)?;
    super::values::range("remote.standby_links", r.standby_links, 0, 100_000)?;
    for (i, d) in cfg.drive.iter().enumerate() {
        let key = format!("drive[{i}]");
        if !d.export && !d.export_hosts.is_empty() {
            bail!(
                "config: {key}.export_hosts is set but export is not; add export = true or remove export_hosts"
            );
        }
        for (j, h) in d.export_hosts.iter().enumerate() {
            super::values::check_nqn(&format!("{key}.export_hosts[{j}]"), h)?;
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
            takeover_wait: Duration::from_millis(r.takeover_wait_ms),
            standby_links: r.standby_links,
            reactor_queues: r.reactor_queues,
        },
        dhchap,
        tls,
    })
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
        // and back: the name a cluster volume's spec was made with
        let e2d3 = c.resolve("e2:d3").unwrap();
        assert_eq!(c.name_of(&e2d3).as_deref(), Some("e2:d3"));
        assert_eq!(c.name_of(u), None);
        let elsewhere = "tcp://10.77.0.99:4420/nqn.2026-01.io.flashpool:drive:e2:d3?nsid=1";
        assert_eq!(c.name_of(elsewhere), None);
    }

    /// An enclosure's `[[peer]]` needs no address (it never connects to
    /// the peer); a node that uses the peer's drives does, and says so.
    #[test]
    fn a_peer_address_is_needed_only_where_its_drives_are_used() {
        let enclosure = "[node]\nname = \"e1\"\n[[peer]]\nname = \"c1\"\n\
                         [[drive]]\nname = \"d0\"\nbackend = \"mem\"\nsize = 4096\nexport = true\n";
        let c = cluster(&cfg(enclosure)).unwrap();
        assert_eq!(c.peer_hosts(), ["nqn.2026-01.io.flashpool:node:c1"]);
        assert!(c.peers[0].addr.is_none());
        let e = c.resolve("c1:d0").unwrap_err();
        assert!(e.contains("[[peer]] \"c1\" has no address"), "{e}");
        let err = |t: &str| cluster(&cfg(t)).unwrap_err().to_string();
        let e = err("[node]\nname = \"c1\"\n[[peer]]\nname = \"e1\"\n\
                     [[drive]]\nname = \"e1:d0\"\nbackend = \"remote\"\n");
        assert!(
            e.contains("peer[0].address is missing: drive[0] \"e1:d0\" is on it"),
            "{e}"
        );
        let e = err("[node]\nname = \"c1\"\n[[peer]]\nname = \"e1\"\n\
                     [cluster]\nname = \"c\"\netcd = [\"http://127.0.0.1:2379\"]\n");
        assert!(
            e.contains("peer[0].address is missing: this node is a [cluster] node"),
            "{e}"
        );
        // a remote drive with its own url names no peer's address
        cluster(&cfg(
            "[[peer]]\nname = \"e1\"\n[[drive]]\nname = \"e1:d0\"\n\
                      backend = \"remote\"\nurl = \"tcp://127.0.0.1:4420/nqn.x:y?nsid=1\"\n",
        ))
        .unwrap();
    }

    #[test]
    fn a_node_without_a_toml_is_the_empty_files_node() {
        let from_file = cluster(&NodeConfig::default()).unwrap();
        let alone = Cluster::standalone();
        assert_eq!(from_file.node_name, alone.node_name);
        assert_eq!(from_file.host_nqn, alone.host_nqn);
        assert_eq!(from_file.host_id, alone.host_id);
        assert!(from_file.peers.is_empty() && alone.peers.is_empty());
        let (a, b) = (from_file.remote, alone.remote);
        assert_eq!(
            (
                a.fail_after,
                a.io_timeout,
                a.kato_ms,
                a.queues,
                a.queue_depth,
                a.takeover_wait,
                a.standby_links
            ),
            (
                b.fail_after,
                b.io_timeout,
                b.kato_ms,
                b.queues,
                b.queue_depth,
                b.takeover_wait,
                b.standby_links
            )
        );
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

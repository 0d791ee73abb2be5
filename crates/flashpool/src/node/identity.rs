//! Who this node is to other nodes: its name, host NQN and host ID, its
//! peers (whose drives it may use and who may use its own), how remote
//! drives behave, and the NQNs flashpool makes up for nodes and drives.
//!
//! `config/cluster.rs` builds a [`Cluster`] from the TOML; the node only
//! reads it, so the node never depends on the file format.

use std::net::SocketAddr;
use std::time::Duration;

/// Prefix of every NQN flashpool makes up for itself.
pub const NQN_PREFIX: &str = "nqn.2026-01.io.flashpool";

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
    /// Its NVMe/TCP I/O listener; `None` on a node that uses none of its
    /// drives (an enclosure that only exports its own to it).
    pub addr: Option<SocketAddr>,
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
    /// How long a takeover waits for each member before running degraded
    /// without it (`node/degraded.rs`).
    pub takeover_wait: Duration,
    /// The most standby member links (`node/standby.rs`) this node keeps
    /// open; 0: none.
    pub standby_links: usize,
    /// Whether a remote drive asks its enclosure for a queue per reactor
    /// (`[remote] reactor_queues`).
    pub reactor_queues: bool,
}

impl RemoteSettings {
    /// `[remote]`'s defaults (the TOML's `RemoteSection` takes them from here).
    pub const DEFAULT_FAIL_AFTER_MS: u64 = 2000;
    pub const DEFAULT_IO_TIMEOUT_MS: u64 = 4000;
    pub const DEFAULT_KATO_MS: u32 = 2000;
    pub const DEFAULT_QUEUES: u16 = 2;
    pub const DEFAULT_QUEUE_DEPTH: u16 = 64;
    pub const DEFAULT_TAKEOVER_WAIT_MS: u64 = 1000;
    /// Each link is one controller (1 + `queues` connections) on an
    /// enclosure: 256 covers 48 volumes of 5 members with room to spare.
    pub const DEFAULT_STANDBY_LINKS: usize = 256;
}

impl Default for RemoteSettings {
    fn default() -> Self {
        RemoteSettings {
            fail_after: Duration::from_millis(Self::DEFAULT_FAIL_AFTER_MS),
            io_timeout: Duration::from_millis(Self::DEFAULT_IO_TIMEOUT_MS),
            kato_ms: Self::DEFAULT_KATO_MS,
            queues: Self::DEFAULT_QUEUES,
            queue_depth: Self::DEFAULT_QUEUE_DEPTH,
            takeover_wait: Duration::from_millis(Self::DEFAULT_TAKEOVER_WAIT_MS),
            standby_links: Self::DEFAULT_STANDBY_LINKS,
            reactor_queues: true,
        }
    }
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

/// The machine's hostname: a node's name when its TOML gives none.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "flashpool".into())
}

impl Cluster {
    /// A node without a TOML: named after the host, with no peers, no
    /// secrets and the default `[remote]` settings.
    pub fn standalone() -> Cluster {
        let node_name = hostname();
        let host_nqn = node_host_nqn(&node_name);
        Cluster {
            host_id: stable_id(&host_nqn),
            node_name,
            host_nqn,
            peers: Vec::new(),
            remote: RemoteSettings::default(),
            dhchap: None,
            tls: None,
        }
    }

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

    /// The `peer:drive` name of a URL that [`Cluster::resolve`] makes, so a
    /// node that opens a cluster volume's members names them as its spec did.
    pub fn name_of(&self, url: &str) -> Option<String> {
        self.peers.iter().find_map(|p| {
            let head = format!("tcp://{}/{}", p.addr?, drive_nqn(&p.name, ""));
            let drive = url.strip_prefix(&head)?.strip_suffix("?nsid=1")?;
            let name = format!("{}:{drive}", p.name);
            (!drive.is_empty() && self.resolve(&name).as_deref() == Ok(url)).then_some(name)
        })
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
        let addr = p.addr.ok_or_else(|| {
            format!(
                "drive {}: [[peer]] {} has no address in the node's TOML; a node that uses a \
                 peer's drives needs it: set address = \"ADDR:PORT\" of its NVMe/TCP I/O listener",
                crate::echo::Echo(name),
                crate::echo::Echo(peer)
            )
        })?;
        Ok(format!("tcp://{addr}/{}?nsid=1", drive_nqn(&p.name, drive)))
    }
}

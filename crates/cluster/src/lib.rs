//! Cluster state in etcd: node sessions under leases,
//! controller-ID slots, volume specs, owners guarded by epochs, hand-offs,
//! drain marks, and a fast process-death signal between nodes.
//!
//! This is the only crate that talks to etcd. Every key lives under
//! `/flashpool/<cluster>/`; `keys.rs` holds the schema (which keys, their
//! values and leases).

mod claim;
mod drives;
mod etcd;
mod extent;
mod keepalive;
mod keys;
mod liveness;
mod qos;
mod session;
#[cfg(feature = "testing")]
pub mod testing;
mod thin;
mod watch;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use claim::VolumeRead;
pub use drives::DriveTake;
pub use liveness::{LivenessListener, PeerGone, watch_peer_death};
pub use qos::{PassView, QosOf, QosSpec, QosWrite};
pub use session::Session;

/// Highest controller-ID slot (63 slots of 1024 IDs each fit below 0xFFEF).
pub const MAX_SLOT: u16 = 62;
/// ANA group IDs handed out by [`Session::free_ana_group`].
pub const ANA_GROUPS: std::ops::RangeInclusive<u32> = 1..=128;

/// How a node reaches etcd and how long its lease lives.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub endpoints: Vec<String>,
    pub cluster: String,
    pub node: String,
    /// Lease TTL; etcd TTLs are whole seconds: rounded up, at least 1 s.
    pub lease_ttl: Duration,
    /// How often the keep-alive task refreshes the lease.
    pub keepalive_every: Duration,
    /// Subtracted from the lease's expiry to get the self-fencing deadline.
    pub fence_margin: Duration,
}

impl ClusterConfig {
    /// A config with the defaults: TTL 2 s, keep-alive every TTL/5, margin TTL/4.
    pub fn new(endpoints: Vec<String>, cluster: &str, node: &str) -> Self {
        Self::with_ttl(endpoints, cluster, node, Duration::from_secs(2))
    }

    /// A config with the given TTL and the derived defaults (keep-alive TTL/5, margin TTL/4).
    pub fn with_ttl(endpoints: Vec<String>, cluster: &str, node: &str, ttl: Duration) -> Self {
        ClusterConfig {
            endpoints,
            cluster: cluster.to_string(),
            node: node.to_string(),
            lease_ttl: ttl,
            keepalive_every: ttl / 5,
            fence_margin: ttl / 4,
        }
    }

    /// The TTL asked of etcd, in whole seconds (rounded up, at least 1).
    pub fn ttl_secs(&self) -> i64 {
        let s = self.lease_ttl.as_secs() + u64::from(self.lease_ttl.subsec_nanos() > 0);
        s.max(1) as i64
    }

    /// `/flashpool/<cluster>/`
    pub fn prefix(&self) -> String {
        keys::cluster_prefix(&self.cluster)
    }
}

/// An NVMe/TCP transport address.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Portal {
    pub traddr: String,
    pub trsvcid: String,
}

/// What a node publishes under `nodes/<name>` while its lease lives.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct NodeRecord {
    pub name: String,
    pub portals: Vec<Portal>,
    pub discovery: Vec<Portal>,
    pub api: Option<String>,
    /// host:port of the node's liveness listener.
    pub liveness: Option<String>,
    pub host_nqn: String,
    pub host_id: String,
    /// Controller-ID slot; filled by [`Session::join`].
    #[serde(default)]
    pub slot: u16,
    /// Lease ID; filled by [`Session::join`].
    #[serde(default)]
    pub lease: i64,
}

/// A volume's description (`volumes/<v>/spec`). Written once, then only by
/// its owner: a pool's extents grow, a member replace changes `drives`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct VolumeSpec {
    pub name: String,
    pub uuid: String,
    pub nqn: String,
    pub nsid: u32,
    pub ana_group: u32,
    pub size_bytes: u64,
    pub block_size: u32,
    /// Member drive URLs.
    pub drives: Vec<String>,
    /// Drives a member replace is putting in (`drive replace`): an owner
    /// opens them beside `drives`, and each position goes to the newest
    /// superblock that claims it, so a replace cut short at any point
    /// assembles from whichever drive holds the position.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub joining: Vec<String>,
    pub layout: String,
    /// Host NQNs allowed; empty = any host.
    pub hosts: Vec<String>,
    pub serial: String,
    pub model: String,
    /// A cluster pool: the volume is formatted as a thin pool and not
    /// served itself (`nsid` 0); its thin volumes ([`ThinSpec`]) are the
    /// namespaces, all in its ANA group, and move with it.
    #[serde(default)]
    pub thin_pool: bool,
    /// A cluster pool's extents (`pool expand`), in the order it grew by
    /// them: each a volume of its own on other drives, owned and moved
    /// with the pool, assembled before it (`extent.rs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extents: Vec<ExtentSpec>,
    /// A delete has begun ([`Session::mark_deleting`]): its owner wipes the
    /// drives next, so no node may take it over or serve it any more; a
    /// delete on any node finishes it ([`Session::finish_delete`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleting: bool,
}

impl VolumeSpec {
    /// The volume or extent of this spec that has drive `url` as a member
    /// or is putting it in (`joining`): its name, or `None`. A drive that
    /// a spec names is taken, whatever state the volume is in (a volume
    /// being deleted still holds its drives until the spec is gone).
    pub fn holder_of(&self, url: &str) -> Option<&str> {
        let has = |d: &[String], j: &[String]| d.iter().chain(j).any(|x| x == url);
        if has(&self.drives, &self.joining) {
            return Some(&self.name);
        }
        let x = self.extents.iter().find(|x| has(&x.drives, &x.joining))?;
        Some(&x.name)
    }
}

/// One extent of a cluster pool, as [`VolumeSpec::extents`] lists it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ExtentSpec {
    /// Its volume's name (in its superblocks; unique in the cluster).
    pub name: String,
    /// Member drive URLs.
    pub drives: Vec<String>,
    /// As [`VolumeSpec::joining`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub joining: Vec<String>,
    pub layout: String,
}

/// `volumes/<pool>/thin/<name>`: a thin volume of cluster pool `pool`,
/// served by every node as `nsid` of the pool's subsystem, in the pool's
/// ANA group. Written only by the pool's owner (guarded by its epoch).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ThinSpec {
    pub name: String,
    pub pool: String,
    pub uuid: String,
    /// 0: recorded but not served (a snapshot nobody asked to export).
    pub nsid: u32,
    pub size_bytes: u64,
    pub block_size: u32,
    pub serial: String,
    /// A snapshot: served (if at all) write-protected. The pool's metadata
    /// holds the snapshot tree; records older than snapshots read false.
    #[serde(default)]
    pub snapshot: bool,
    /// What it was made from, as of its making: the volume a snapshot was
    /// taken of, the snapshot a clone was made from (later snapshots and
    /// deletes change the pool's live tree, not this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

/// `volumes/<v>/owner`: which node serves the volume, and since which epoch.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub node: String,
    pub epoch: u64,
}

/// `volumes/<v>/state`, written only by the owner of `epoch`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct VolumeState {
    pub epoch: u64,
    pub generation: u64,
    pub members: Vec<String>,
    pub note: String,
    /// The owner of `epoch` serves it (its group Optimized): a move is
    /// over. The owner records the states before it serves; then it
    /// records this at once after a create, or where a move may wait for
    /// it (a handoff recorded, or unknown); otherwise (a takeover) with its
    /// next record.
    #[serde(default)]
    pub serving: bool,
}

/// `volumes/<v>/handoff`: the owner of `epoch` is asked to hand the volume to `to`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Handoff {
    pub to: String,
    /// The owner epoch it applies to.
    pub epoch: u64,
}

/// Everything etcd holds on one volume, as [`Session::volumes`] reads it.
#[derive(Clone, Debug, PartialEq)]
pub struct VolumeRecord {
    pub spec: VolumeSpec,
    pub owner: Option<Owner>,
    pub state: Option<VolumeState>,
    pub handoff: Option<Handoff>,
}

/// A decoded change under the cluster prefix.
#[derive(Clone, Debug, PartialEq)]
pub enum ClusterEvent {
    NodeUp(NodeRecord),
    NodeDown(String),
    SpecPut(VolumeSpec),
    SpecDeleted(String),
    OwnerSet(String, Owner),
    OwnerGone(String),
    HandoffSet(String, Handoff),
    HandoffCleared(String),
    /// A thin volume of cluster pool `.0` was put, changed or deleted.
    ThinChanged(String),
    /// The QoS limits of volume or thin volume `.0` were set...
    QosSet(String, QosSpec),
    /// ...or cleared (unlimited, or the volume deleted).
    QosCleared(String),
    Drain(String, bool),
    /// The watch was restarted: events may have been missed, re-read everything.
    Resync,
}

/// Whether this node's lease can still be trusted.
#[derive(Debug, Clone)]
pub enum LeaseHealth {
    /// Trust it until `valid_until` (monotonic) unless refreshed.
    Live { valid_until: std::time::Instant },
    /// The session is dead for good: fence, then join again.
    Lost(String),
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("etcd: {0}")]
    Etcd(String),
    #[error(
        "volume {volume}: not owned by this node at epoch {epoch} (deposed): fence and re-read the owner"
    )]
    Deposed { volume: String, epoch: u64 },
    #[error("volume {volume}: has no owner")]
    NotOwned { volume: String },
    #[error("volume {0} already exists: pick another name or delete it first")]
    VolumeExists(String),
    #[error(
        "node name {0} is in use by another live node: pick another name or wait for its lease to expire"
    )]
    NodeNameInUse(String),
    #[error("no free controller-ID slot (0..={MAX_SLOT} all taken by live nodes)")]
    NoFreeSlot,
    #[error("nsid {nsid} of {nqn} serves another cluster volume already")]
    NsidTaken { nqn: String, nsid: u32 },
    #[error("thin volume {0} changed meanwhile (another request): nothing was done; retry")]
    ThinChanged(String),
    #[error("volume {0} changed meanwhile (another request): nothing was done; retry")]
    SpecChanged(String),
    #[error(
        "drive {drive} is being taken by a change of volume {by} on node {node} (a create, grow or replace under way): nothing was changed; retry once it is done"
    )]
    DriveTaken {
        drive: String,
        by: String,
        node: String,
    },
    #[error("no free ANA group (1..=128 all used by volume specs)")]
    NoFreeAnaGroup,
    #[error("cannot decode etcd key {key}: {err}")]
    Decode { key: String, err: String },
    /// etcd no longer knows this session's lease (expired or revoked).
    #[error("this node's etcd lease is gone ({0}): fence and join again")]
    LeaseLost(String),
}

/// Orders `nodes` by highest-random-weight for `volume` (first = preferred).
/// The hash is FNV-1a with a fixed finaliser: the same on every node and run.
pub fn rendezvous<'a>(volume: &str, nodes: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut v: Vec<(u64, &'a str)> = nodes
        .into_iter()
        .map(|n| (hrw_weight(volume, n), n))
        .collect();
    v.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    v.dedup_by(|a, b| a.1 == b.1);
    v.into_iter().map(|(_, n)| n).collect()
}

fn hrw_weight(volume: &str, node: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in volume.bytes().chain([0xff]).chain(node.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // splitmix64 finaliser: FNV's low bits alone mix poorly for short names.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_rounds_up() {
        let mut c = ClusterConfig::new(vec![], "c", "n");
        assert_eq!(c.ttl_secs(), 2);
        assert_eq!(c.keepalive_every, Duration::from_millis(400));
        assert_eq!(c.fence_margin, Duration::from_millis(500));
        c.lease_ttl = Duration::from_millis(1500);
        assert_eq!(c.ttl_secs(), 2);
        c.lease_ttl = Duration::from_millis(10);
        assert_eq!(c.ttl_secs(), 1);
    }

    /// A spec written before pools grew reads with no extents, and a spec
    /// with none is written as before (nodes of both kinds read it).
    #[test]
    fn specs_without_extents_read_and_write_as_before() {
        let old = serde_json::json!({
            "name": "p", "uuid": "u", "nqn": "q", "nsid": 0, "ana_group": 1,
            "size_bytes": 1, "block_size": 4096, "drives": ["nvme://a/1"],
            "layout": "raid1", "hosts": [], "serial": "S", "model": "m", "thin_pool": true,
        });
        let mut spec: VolumeSpec = serde_json::from_value(old.clone()).unwrap();
        assert!(spec.extents.is_empty());
        assert_eq!(serde_json::to_value(&spec).unwrap(), old);
        spec.extents.push(ExtentSpec {
            name: "p-x1".into(),
            drives: vec!["nvme://b/1".into()],
            joining: Vec::new(),
            layout: "raid1".into(),
        });
        let back: VolumeSpec =
            serde_json::from_str(&serde_json::to_string(&spec).unwrap()).unwrap();
        assert_eq!(back, spec);
    }

    #[test]
    fn rendezvous_is_stable_and_spreads() {
        let nodes = ["a", "b", "c", "d"];
        let o1 = rendezvous("vol1", nodes);
        assert_eq!(o1, rendezvous("vol1", nodes.iter().rev().copied()));
        assert_eq!(o1.len(), 4);
        // removing a non-first node keeps the first
        let rest: Vec<&str> = nodes.iter().copied().filter(|n| *n != o1[1]).collect();
        assert_eq!(rendezvous("vol1", rest)[0], o1[0]);
        let mut firsts = std::collections::HashMap::new();
        for i in 0..400 {
            *firsts
                .entry(rendezvous(&format!("v{i}"), nodes)[0])
                .or_insert(0) += 1;
        }
        for n in nodes {
            let c = firsts.get(n).copied().unwrap_or(0);
            assert!((50..=150).contains(&c), "{n} first {c} times of 400");
        }
    }
}

//! Cluster calls' bodies: `GET /v1/cluster`, planned moves, drains and
//! the reachability probe.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub cluster: String,
    pub node: String,
    pub nodes: Vec<NodeStatus>,
    pub volumes: Vec<VolumeStatus>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeStatus {
    pub name: String,
    pub slot: u16,
    pub lease: String,
    pub ttl_left_s: Option<i64>,
    #[serde(default)]
    pub draining: bool,
    #[serde(default)]
    pub portals: Vec<String>,
    pub api: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VolumeStatus {
    pub name: String,
    pub owner: Option<String>,
    pub epoch: Option<u64>,
    pub generation: Option<u64>,
    /// optimal, degraded, rebuilding (as its owner last recorded), unowned,
    /// or deleting (a delete began and did not finish: run it again).
    pub state: String,
    pub handoff: Option<String>,
    pub nqn: String,
    pub nsid: u32,
    pub ana_group: u32,
    #[serde(default)]
    pub drives: Vec<String>,
    /// Drives a `drive replace` under way is putting in a member's place
    /// (owners assemble from them too; see docs/cluster.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub joining: Vec<String>,
    /// What its owner last noted: who owns it, or why no node could run it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// A cluster pool's extents (`pool expand`), owned and moved with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extents: Vec<ExtentStatus>,
}

/// One extent of a cluster pool, as the cluster records it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExtentStatus {
    pub name: String,
    pub layout: String,
    /// Member drive URLs.
    pub drives: Vec<String>,
    /// Drives a replace under way is putting in a member's place.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub joining: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoveRequest {
    pub to: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MoveResult {
    pub volume: String,
    pub from: String,
    pub to: String,
    pub epoch: u64,
    pub took_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DrainResult {
    pub node: String,
    pub draining: bool,
    /// Volumes it still owns (none once a drain is done).
    pub owns: Vec<String>,
}

/// `POST /v1/cluster/probe/{name}`: this node reaches every member.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeResult {
    pub reachable: bool,
    pub volume: String,
}

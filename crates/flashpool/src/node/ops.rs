//! The bodies of the node's volume and drive requests and answers, as the
//! API reads and writes them (the operations themselves are in
//! `volumes.rs`, `volume_export.rs`, `views.rs` and `drive_ops.rs`).

use serde::{Deserialize, Serialize};

use super::Export;

/// `POST /v1/volumes`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    pub name: String,
    /// concat, raid0, raid1, raid5, raid6 or ecK+M (e.g. ec8+2); with `drives`.
    #[serde(default)]
    pub layout: Option<String>,
    #[serde(default)]
    pub drives: Vec<String>,
    /// Format the new volume as a thin pool, to hold thin volumes.
    #[serde(default)]
    pub thin_pool: bool,
    /// Thin pool allocation unit, e.g. "1MiB" (default).
    #[serde(default)]
    pub cluster: Option<String>,
    /// A thin volume in the pool on this volume (instead of layout + drives)...
    #[serde(default)]
    pub pool: Option<String>,
    /// ...of this virtual size, e.g. "100GiB" (may exceed the pool).
    #[serde(default)]
    pub size: Option<String>,
    /// Strip size per member, e.g. "64KiB" (default).
    #[serde(default)]
    pub strip: Option<String>,
    /// 4096 (default) or 512.
    #[serde(default)]
    pub block_size: Option<u32>,
    /// Rebuild speed limit, e.g. "200MiB" (per second); default unlimited.
    #[serde(default)]
    pub rebuild_rate: Option<String>,
    /// Serve it at once as this namespace.
    #[serde(default)]
    pub export: Option<ExportRequest>,
}

/// `POST /v1/volumes/{name}/export`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportRequest {
    pub nqn: String,
    pub nsid: u32,
}

#[derive(Debug, Serialize)]
pub struct MemberInfo {
    pub position: usize,
    pub drive: String,
    /// active, failed, rebuilding, or resyncing; for an offline volume
    /// also missing (no drive holds the position).
    pub state: String,
}

#[derive(Debug, Serialize)]
pub struct RebuildInfo {
    pub running: bool,
    pub members: Vec<usize>,
    /// The drives being rebuilt now, and those waiting for the next pass
    /// (the ETA covers both).
    pub drives: Vec<String>,
    pub queued_drives: Vec<String>,
    pub done_stripes: u64,
    pub total_stripes: u64,
    pub percent: f64,
    pub bytes: u64,
    pub mb_per_sec: f64,
    pub eta_secs: Option<f64>,
    pub last_error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct VolumeInfo {
    pub name: String,
    pub uuid: String,
    pub layout: String,
    pub size_bytes: u64,
    pub block_size: u32,
    pub strip_bytes: u64,
    /// optimal, degraded, rebuilding, resyncing, failed (more members
    /// failed or not yet rebuilt than the layout tolerates: I/O that needs
    /// them fails), or offline (not assembled: not served).
    pub state: String,
    /// Why the volume is failed or offline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub generation: u64,
    pub members: Vec<MemberInfo>,
    pub export: Option<Export>,
    pub from_config: bool,
    pub rebuild: RebuildInfo,
    /// Thin volumes: the volume whose pool holds it, and its allocated bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocated_bytes: Option<u64>,
    /// Pool volumes: the pool's space.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thin_pool: Option<PoolInfo>,
    /// The jobs running on it (initial sync, rebuild, scrub).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<super::jobs::JobInfo>,
    /// How its last scrub (on this node, since it started) ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_scrub: Option<super::jobs::JobInfo>,
    /// Assembled with force: which members were forced back and what may
    /// be stale (until the node restarts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forced: Option<super::ForcedInfo>,
}

#[derive(Debug, Serialize)]
pub struct PoolInfo {
    pub cluster_bytes: u64,
    pub capacity_bytes: u64,
    pub allocated_bytes: u64,
    pub free_bytes: u64,
    /// Sum of the thin volumes' sizes (may exceed the capacity).
    pub provisioned_bytes: u64,
    pub volumes: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct DriveInfo {
    pub name: String,
    pub backend: String,
    pub size_bytes: u64,
    pub block_size: u32,
    pub device: String,
    /// free, spare (a free hot spare), member, exported, or failed.
    pub state: String,
    pub volume: Option<String>,
    pub position: Option<usize>,
    /// Exported to other nodes: the subsystem NQN and the hosts allowed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub export: Option<super::DriveExport>,
    /// A remote drive: its link (connected, reconnecting, down...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
}

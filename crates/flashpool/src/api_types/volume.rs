//! Volume calls' bodies: what `POST /v1/volumes` and the assemble and
//! export calls take, and a volume as `GET /v1/volumes/{name}` shows it.

use serde::{Deserialize, Serialize};

use super::job::JobInfo;

/// `POST /v1/volumes`.
#[derive(Debug, Clone, Serialize, Deserialize)]
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
    /// Thin pool allocation unit, e.g. "1MiB" (default; "64KiB" when
    /// `compression` is set).
    #[serde(default)]
    pub cluster: Option<String>,
    /// Thin pools: compress each chunk (cluster) inline, "lz4", "zstd" or
    /// "none" (default). Fixed when the pool is formatted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
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
    /// Encrypt it at rest (AES-XTS-256, a data key of its own wrapped by
    /// the node's key-encryption key). A thin pool's key covers its thin
    /// volumes, snapshots and clones: a thin volume is encrypted when its
    /// pool is (`encrypt` on it asks for that and is refused otherwise).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypt: bool,
}

/// `POST /v1/volumes/{name}/export`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportRequest {
    pub nqn: String,
    pub nsid: u32,
}

/// `POST /v1/volumes/{name}/grow`: a thin volume's new size.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrowRequest {
    /// The new size, e.g. "200GiB" (smaller than now only with `force`).
    pub size: String,
    /// A smaller size shrinks the volume, when the end it cuts holds no data.
    #[serde(default)]
    pub force: bool,
}

/// `POST /v1/volumes/{pool}/expand`: grow a thin pool by a new volume on
/// `drives`, added as an extent of the pool.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpandPool {
    pub drives: Vec<String>,
    /// The extent volume's name (default `POOL-xN`).
    #[serde(default)]
    pub name: Option<String>,
    /// Its layout (default: the pool volume's own).
    #[serde(default)]
    pub layout: Option<String>,
    /// Its strip size (default: the pool volume's own).
    #[serde(default)]
    pub strip: Option<String>,
}

/// `POST /v1/volumes/assemble`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssembleVolume {
    /// The volume's drives, in any order (`peer:drive`, URLs or local names).
    pub drives: Vec<String>,
    /// Preempt another node's reservation on the remote members (and abort
    /// its writes): for a volume whose owner is gone or must be deposed.
    #[serde(default)]
    pub takeover: bool,
    /// Serve it at once as this namespace.
    #[serde(default)]
    pub export: Option<ExportRequest>,
    /// md's `--assemble --force`: when more members are failed or stale
    /// than the layout tolerates, take the freshest back as active, just
    /// enough to run; the answer's `forced` says what may be stale.
    #[serde(default)]
    pub force: bool,
    /// Assemble only the volume of this name: drives holding another
    /// volume's superblock are left out, not an error (a cluster owner's
    /// assembly, where a drive a replace was putting in may still hold an
    /// old volume's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub only: Option<String>,
}

/// `POST /v1/volumes/{name}/assemble`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssembleByName {
    #[serde(default)]
    pub force: bool,
}

/// `{"force": true}` of the calls that lose data without it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForceRequest {
    #[serde(default)]
    pub force: bool,
}

/// `?force=true` (for DELETE, whose body some clients cannot send).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ForceQuery {
    #[serde(default)]
    pub force: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
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
    /// Encrypted at rest (AES-XTS-256); a thin volume when its pool is.
    #[serde(default)]
    pub encrypted: bool,
    /// Why the volume is failed or offline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub generation: u64,
    pub members: Vec<MemberInfo>,
    pub export: Option<Export>,
    #[serde(default)]
    pub from_config: bool,
    pub rebuild: RebuildInfo,
    /// Thin volumes: the volume whose pool holds it, and its allocated bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocated_bytes: Option<u64>,
    /// Thin volumes: a read-only snapshot (served write-protected).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub snapshot: bool,
    /// Thin volumes: the snapshot it was taken after or cloned from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Thin volumes: bytes it reads from its snapshots (shared with them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_bytes: Option<u64>,
    /// Thin volumes: what its own chunks take on the device (less than
    /// `allocated_bytes` when its pool compresses them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_bytes: Option<u64>,
    /// Thin volumes: when it was made (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<u64>,
    /// Pool volumes: the pool's space.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thin_pool: Option<PoolInfo>,
    /// The jobs running on it (initial sync, rebuild, scrub).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<JobInfo>,
    /// How its last scrub (on this node, since it started) ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_scrub: Option<JobInfo>,
    /// Assembled with force: which members were forced back and what may
    /// be stale (until the node restarts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forced: Option<ForcedInfo>,
    /// Cluster volumes: the node that owns it (runs it), as this node knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Cluster volumes: its ANA group's state on this node (optimized on
    /// the owner, inaccessible where it is served on standby).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ana_state: Option<String>,
    /// An extent of this thin pool (`pool expand`): not served itself,
    /// deleted with its pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extent_of: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberInfo {
    pub position: usize,
    pub drive: String,
    /// active, failed, rebuilding, or resyncing; for an offline volume
    /// also missing (no drive holds the position).
    pub state: String,
}

/// A volume's rebuild; the default is none running.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RebuildInfo {
    pub running: bool,
    pub members: Vec<usize>,
    /// The drives being rebuilt now, and those waiting for the next pass
    /// (the ETA covers both).
    pub drives: Vec<String>,
    #[serde(default)]
    pub queued_drives: Vec<String>,
    pub done_stripes: u64,
    pub total_stripes: u64,
    pub percent: f64,
    pub bytes: u64,
    pub mb_per_sec: f64,
    pub eta_secs: Option<f64>,
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolInfo {
    pub cluster_bytes: u64,
    pub capacity_bytes: u64,
    pub allocated_bytes: u64,
    pub free_bytes: u64,
    /// Sum of the thin volumes' sizes (may exceed the capacity).
    pub provisioned_bytes: u64,
    /// Its thin volumes and snapshots, by name.
    pub volumes: Vec<String>,
    #[serde(default)]
    pub snapshots: usize,
    /// Deleted snapshots still read by two or more clones (space they hold
    /// is freed when fewer are left).
    #[serde(default)]
    pub hidden_snapshots: usize,
    /// The volumes it grew by (`pool expand`), in cluster order.
    #[serde(default)]
    pub extents: Vec<PoolExtentInfo>,
    /// How chunks are stored: "none", "lz4" or "zstd".
    #[serde(default = "no_compression")]
    pub compression: String,
    /// What the chunks of its volumes and snapshots hold, uncompressed
    /// (their clusters times the cluster size).
    #[serde(default)]
    pub logical_bytes: u64,
    /// What those chunks take on the device (compressed chunks their 4 KiB
    /// blocks); `logical_bytes` without compression.
    #[serde(default)]
    pub stored_bytes: u64,
    /// Clusters that hold compressed chunks, packed (counted in
    /// `allocated_bytes`).
    #[serde(default)]
    pub pack_clusters: u64,
}

fn no_compression() -> String {
    "none".into()
}

/// One extent of a thin pool.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PoolExtentInfo {
    /// The volume it lies on (empty if the node does not know it).
    pub volume: String,
    pub uuid: String,
    pub capacity_bytes: u64,
}

/// `POST /v1/volumes/{name}/snapshots`: one snapshot.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    pub name: String,
    /// Cluster mode: serve the snapshot (write-protected) in its pool's
    /// subsystem, as `nsid` (0: a free one). A node running alone exports
    /// snapshots with `POST /v1/volumes/{name}/export` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export: Option<ExportRequest>,
}

/// One pair of `POST /v1/snapshots`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotPair {
    pub volume: String,
    pub name: String,
    /// As [`SnapshotRequest::export`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export: Option<ExportRequest>,
}

/// `POST /v1/snapshots`: snapshots of several volumes of one pool at one
/// instant (a consistency group).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotGroupRequest {
    pub snapshots: Vec<SnapshotPair>,
}

/// `POST /v1/volumes/{snapshot}/clone`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloneRequest {
    pub name: String,
    #[serde(default)]
    pub export: Option<ExportRequest>,
}

/// `POST /v1/volumes/{name}/revert`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevertRequest {
    pub snapshot: String,
    #[serde(default)]
    pub force: bool,
}

/// `GET /v1/volumes/{pool}/check`: the thin pool's metadata check.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolCheckInfo {
    pub pool: String,
    /// No cluster in two maps, none taken that no map holds, the volume
    /// tree sound, and memory equal to what the device says.
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    pub volumes: usize,
    pub snapshots: usize,
    pub hidden_snapshots: usize,
    pub allocated_clusters: u64,
    pub total_clusters: u64,
    pub journal_blocks: u64,
}

/// Where a volume is served.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Export {
    pub nqn: String,
    pub nsid: u32,
    /// Declared in the TOML (else made through the API, and kept in the
    /// node's state file when it has one).
    #[serde(default)]
    pub from_config: bool,
}

/// What a forced assembly did and risks, kept on the volume until the
/// node restarts (`GET /v1/volumes/{name}` shows it as `forced`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForcedInfo {
    pub members: Vec<ForcedMemberInfo>,
    /// Positions still failed or missing (replace or re-add them).
    pub still_failed: Vec<usize>,
    /// Stale members not needed, left out as failed.
    pub left_out: Vec<usize>,
    /// The ranges written while the forced members were away (from the
    /// held intent bitmap; a superset). Absent when there is no record:
    /// then `unknown` says why and any block may be stale.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_ranges: Option<Vec<StaleRangeInfo>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
    pub message: String,
}

/// A member forced back by `volume assemble --force`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForcedMemberInfo {
    pub position: usize,
    pub drive: String,
    /// failed (marked failed in the superblocks) or stale (older superblock).
    pub was: String,
    /// The generation it was marked failed at, when recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed_at: Option<u64>,
    /// Its own superblock's generation, against the volume's.
    pub generation: u64,
    pub volume_generation: u64,
}

/// Volume bytes that may hold old data after a forced assembly.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StaleRangeInfo {
    pub offset_bytes: u64,
    pub len_bytes: u64,
    pub first_region: u64,
    pub regions: u64,
}

/// `DELETE /v1/volumes/{name}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VolumeDeleted {
    pub deleted: String,
}

/// `GET /v1/volumes/{name}/rebuild` (fields in the order the JSON has
/// them).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RebuildStatus {
    pub members: Vec<MemberInfo>,
    pub rebuild: RebuildInfo,
    pub state: String,
    pub volume: String,
}

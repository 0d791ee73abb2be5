//! The bodies of the management API's calls and answers, shared by the
//! server ([`crate::api`], [`crate::node`], [`crate::agent`]) and its
//! client ([`crate::client`], the CLI): one definition of the JSON that
//! `docs/api.md` documents. Field names, optional fields and enum names are
//! the wire format; a field an older node may leave out has a default.
//! Nothing here imports the node: the node builds these, the CLI reads them.

mod cluster;
mod drive;
mod event;
mod job;
mod qos;
#[cfg(test)]
mod tests;
mod volume;

use serde::{Deserialize, Serialize};

pub use cluster::{
    ClusterStatus, DrainResult, ExtentStatus, MoveRequest, MoveResult, NodeStatus, ProbeResult,
    VolumeStatus,
};
pub use drive::{
    DriveExport, DriveInfo, ExportDriveRequest, FailRequest, ReAddInfo, ReplaceRequest,
};
pub use event::{Event, EventKind, Hello, Lagged, StepTime, TokenRotated};
pub use job::{JobInfo, JobKind, JobState, ScrubRequest};
pub use qos::{QosInfo, QosLimitsInfo, QosRequest, Rate};
pub use volume::{
    AssembleByName, AssembleVolume, CloneRequest, CreateVolume, ExpandPool, Export, ExportRequest,
    ForceQuery, ForceRequest, ForcedInfo, ForcedMemberInfo, GrowRequest, MemberInfo, PoolCheckInfo,
    PoolExtentInfo, PoolInfo, RebuildInfo, RebuildStatus, RevertRequest, SnapshotGroupRequest,
    SnapshotPair, SnapshotRequest, StaleRangeInfo, VolumeDeleted, VolumeInfo,
};

/// Every error answer: `{"error": "..."}`, with the status that says whose
/// fault it was.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}

//! The bodies of the node's volume and drive requests and answers, as the
//! API reads and writes them: defined with the API's other types
//! (`api_types`), named here for the node's operations (`volumes.rs`,
//! `volume_export.rs`, `views.rs`, `drive_ops.rs`).

pub use crate::api_types::{
    CreateVolume, DriveInfo, ExpandPool, ExportRequest, MemberInfo, PoolExtentInfo, PoolInfo,
    RebuildInfo, VolumeInfo,
};

//! Drive calls' bodies: a drive as `GET /v1/drives` shows it, and what
//! the fail, replace, re-add and export calls take and answer.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
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
    pub export: Option<DriveExport>,
    /// A remote drive: its link (connected, reconnecting, down...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link: Option<String>,
}

/// How a drive is exported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriveExport {
    pub nqn: String,
    pub hosts: Vec<String>,
    /// Declared in the TOML (else made through the API and kept in
    /// `state_dir/drive-exports.json`).
    #[serde(default)]
    pub from_config: bool,
}

/// `POST /v1/drives/{name}/export`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportDriveRequest {
    /// Host NQNs allowed to connect (default: the `[[peer]]`s').
    #[serde(default)]
    pub hosts: Vec<String>,
}

/// `POST /v1/drives/{name}/fail`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailRequest {
    /// Fail it even when that takes its volume beyond its redundancy.
    #[serde(default)]
    pub force: bool,
}

/// `POST /v1/drives/{name}/replace`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplaceRequest {
    pub with: String,
}

/// `POST /v1/drives/{name}/re-add`: what the re-add did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReAddInfo {
    pub drive: String,
    /// member (back in its volume) or free (a failed spare, back in service).
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<usize>,
    /// resync (only the regions written while it was away), full-rebuild,
    /// or none (a spare: nothing to copy).
    pub rebuild: String,
    /// Intent-bitmap regions and stripes to resync (0 for a full rebuild).
    pub stale_regions: u64,
    pub stale_stripes: u64,
    /// Why a full rebuild, when it is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The same in one sentence, as the log says it.
    pub message: String,
}

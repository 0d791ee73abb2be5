//! Events as `GET /v1/events` sends them (one JSON object each, or an
//! array with `follow=false`), the stream's `hello` and `lagged` messages,
//! and the answer of `POST /v1/api/token/rotate`.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

/// What happened. The names are the `kind` field of the JSON form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    DriveFailed,
    DriveReadded,
    SpareTaken,
    RebuildStarted,
    RebuildFinished,
    RebuildFailed,
    VolumeOptimal,
    VolumeDegraded,
    VolumeFailed,
    VolumeOffline,
    SyncStarted,
    SyncFinished,
    ScrubStarted,
    ScrubFinished,
    ScrubMismatch,
    ThinPoolUsage,
    /// A volume's QoS limits changed (the message says from what to what).
    QosChanged,
    /// A snapshot of a thin volume was taken.
    SnapshotTaken,
    /// A thin volume was reverted to one of its snapshots.
    VolumeReverted,
    /// A thin pool grew by an extent (`pool expand`).
    PoolExpanded,
    /// The node's key-encryption key was rotated (`rotate-kek`): every
    /// encrypted volume's key is wrapped by the new one.
    KekRotated,
    HostConnected,
    HostRefused,
    /// Cluster mode: this node's etcd lease is gone; every volume owned
    /// here was fenced.
    LeaseLost,
    /// Cluster mode: a volume owned here stopped taking I/O (and why).
    Fenced,
    /// Cluster mode: a volume run here was let go without writing.
    SteppedDown,
    /// Cluster mode: this node took a volume over (with its step times).
    TookOver,
    /// Cluster mode: this node claimed a volume but could not run it (too
    /// many members unreachable or untrusted, ...); it let it go again.
    TakeoverFailed,
    /// Cluster mode: a pool owned here is not served yet: its thin volumes'
    /// host reservations could not be read from etcd (hosts wait).
    PoolHeld,
    /// Cluster mode: a held pool is served: its reservations were read.
    PoolReleased,
    /// Cluster mode: a planned move: this node handed a volume over cleanly.
    HandedOff,
    /// Cluster mode: a planned move ended here: this node serves the volume.
    Moved,
    NodeJoined,
    NodeLeft,
    EtcdUnreachable,
    EtcdBack,
}

impl EventKind {
    pub fn name(self) -> &'static str {
        match self {
            EventKind::DriveFailed => "drive_failed",
            EventKind::DriveReadded => "drive_readded",
            EventKind::SpareTaken => "spare_taken",
            EventKind::RebuildStarted => "rebuild_started",
            EventKind::RebuildFinished => "rebuild_finished",
            EventKind::RebuildFailed => "rebuild_failed",
            EventKind::VolumeOptimal => "volume_optimal",
            EventKind::VolumeDegraded => "volume_degraded",
            EventKind::VolumeFailed => "volume_failed",
            EventKind::VolumeOffline => "volume_offline",
            EventKind::SyncStarted => "sync_started",
            EventKind::SyncFinished => "sync_finished",
            EventKind::ScrubStarted => "scrub_started",
            EventKind::ScrubFinished => "scrub_finished",
            EventKind::ScrubMismatch => "scrub_mismatch",
            EventKind::ThinPoolUsage => "thin_pool_usage",
            EventKind::QosChanged => "qos_changed",
            EventKind::SnapshotTaken => "snapshot_taken",
            EventKind::VolumeReverted => "volume_reverted",
            EventKind::PoolExpanded => "pool_expanded",
            EventKind::KekRotated => "kek_rotated",
            EventKind::HostConnected => "host_connected",
            EventKind::HostRefused => "host_refused",
            EventKind::LeaseLost => "lease_lost",
            EventKind::Fenced => "fenced",
            EventKind::SteppedDown => "stepped_down",
            EventKind::TookOver => "took_over",
            EventKind::TakeoverFailed => "takeover_failed",
            EventKind::PoolHeld => "pool_held",
            EventKind::PoolReleased => "pool_released",
            EventKind::HandedOff => "handed_off",
            EventKind::Moved => "moved",
            EventKind::NodeJoined => "node_joined",
            EventKind::NodeLeft => "node_left",
            EventKind::EtcdUnreachable => "etcd_unreachable",
            EventKind::EtcdBack => "etcd_back",
        }
    }

    /// How urgent it is: `critical` wants a person now (data at risk),
    /// `warning` soon, `info` never.
    pub fn severity(self) -> &'static str {
        match self {
            EventKind::VolumeFailed
            | EventKind::VolumeOffline
            | EventKind::RebuildFailed
            | EventKind::LeaseLost
            | EventKind::TakeoverFailed => "critical",
            EventKind::DriveFailed
            | EventKind::VolumeDegraded
            | EventKind::ScrubMismatch
            | EventKind::ThinPoolUsage
            | EventKind::HostRefused
            | EventKind::Fenced
            | EventKind::SteppedDown
            | EventKind::PoolHeld
            | EventKind::NodeLeft
            | EventKind::EtcdUnreachable => "warning",
            _ => "info",
        }
    }
}

/// One event, as the API streams it and the log writes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Event {
    /// Increases by one per event on this node, from 1 at start.
    pub seq: u64,
    /// Wall-clock time, RFC 3339 in UTC.
    pub time: String,
    pub kind: EventKind,
    pub severity: Cow<'static, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drive: Option<String>,
    /// A host NQN (host events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// A cluster node (cluster events: the other node, when it is not this one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// How long each step took (`took_over`, `moved`), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepTime>,
    /// What a person reads: what happened, and what to do when it matters.
    pub message: String,
}

/// One step of a cluster action and its duration in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepTime {
    pub step: Cow<'static, str>,
    pub ms: f64,
}

/// The stream's first message: the node's run (numbers count within it)
/// and its newest event number.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    pub boot: String,
    pub last_seq: u64,
}

/// `event: lagged`: events `missed_from..=missed_to` are lost to this
/// client (fields in the order the JSON has them).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Lagged {
    pub message: String,
    pub missed_from: u64,
    pub missed_to: u64,
}

/// `POST /v1/api/token/rotate`: the new token, and the files it went to.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenRotated {
    #[serde(default)]
    pub files: Vec<std::path::PathBuf>,
    pub token: String,
    pub token_id: String,
}

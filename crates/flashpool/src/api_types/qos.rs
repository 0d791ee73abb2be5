//! Per-volume QoS: what `POST /v1/volumes/{name}/qos` (and `qos` in
//! `POST /v1/volumes`) takes, and what `GET /v1/volumes/{name}/qos` shows.

use serde::{Deserialize, Serialize};

/// A rate as JSON gives it: a number, or a size with a unit ("20MiB",
/// meaning per second).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Rate {
    Number(u64),
    Text(String),
}

/// A change of a volume's limits. An absent field keeps its value, 0 is
/// unlimited, `clear` starts from no limits (and the default burst).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosRequest {
    /// Commands per second, reads and writes together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_iops: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_iops: Option<u64>,
    /// Bytes per second, reads and writes together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<Rate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_bandwidth: Option<Rate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bandwidth: Option<Rate>,
    /// How much of each limit an idle volume may run ahead, in
    /// milliseconds of it (1 to 60000; default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_ms: Option<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub clear: bool,
}

/// A volume's limits (0: unlimited), as shown and as kept in the node's
/// state directory (`qos.json`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosLimitsInfo {
    #[serde(default)]
    pub iops: u64,
    #[serde(default)]
    pub read_iops: u64,
    #[serde(default)]
    pub write_iops: u64,
    /// Bytes per second.
    #[serde(default)]
    pub bandwidth: u64,
    #[serde(default)]
    pub read_bandwidth: u64,
    #[serde(default)]
    pub write_bandwidth: u64,
    /// 0: the default (100).
    #[serde(default)]
    pub burst_ms: u32,
}

/// `GET /v1/volumes/{name}/qos`, and the answer of a change.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QosInfo {
    pub volume: String,
    #[serde(flatten)]
    pub limits: QosLimitsInfo,
    /// No limit set.
    pub unlimited: bool,
    /// Time its commands were held by the limits, added up (since the node
    /// started), and how many were held.
    pub throttled_seconds: f64,
    pub throttled_commands: u64,
}

//! Jobs as `GET /v1/jobs` shows them (initial sync, rebuild, scrub), and
//! what `POST /v1/volumes/{name}/scrub` takes.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobKind {
    /// Parity of a new volume's stripes.
    Sync,
    /// Replaced or re-added members rebuilt from the others.
    Rebuild,
    /// Parity checked against data (and repaired when asked).
    Scrub,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "error")]
pub enum JobState {
    Running,
    Finished,
    /// Stopped by the operator (a scrub) or by the node shutting down.
    Stopped,
    Failed(String),
}

impl JobKind {
    /// The name the JSON gives it.
    pub fn name(self) -> &'static str {
        match self {
            JobKind::Sync => "sync",
            JobKind::Rebuild => "rebuild",
            JobKind::Scrub => "scrub",
        }
    }
}

impl JobState {
    /// The `state` the JSON gives it.
    pub fn name(&self) -> &'static str {
        match self {
            JobState::Running => "running",
            JobState::Finished => "finished",
            JobState::Stopped => "stopped",
            JobState::Failed(_) => "failed",
        }
    }

    /// A failed job's error.
    pub fn error(&self) -> Option<&str> {
        match self {
            JobState::Failed(e) => Some(e),
            _ => None,
        }
    }
}

/// A job as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobInfo {
    pub id: u64,
    pub kind: JobKind,
    pub volume: String,
    #[serde(flatten)]
    pub state: JobState,
    pub started: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished: Option<String>,
    pub elapsed_secs: f64,
    /// Stripes done and to do (a rebuild: this pass and the queued ones).
    pub done_stripes: u64,
    pub total_stripes: u64,
    pub percent: f64,
    pub mb_per_sec: f64,
    /// Time left at the rate so far, for all of the job's work.
    pub eta_secs: Option<f64>,
    /// A rebuild: the drives being rebuilt now, and those queued after.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drives: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queued_drives: Vec<String>,
    /// A scrub: whether it rewrites parity that disagrees.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repair: Option<bool>,
    #[serde(default)]
    pub mismatches: u64,
    #[serde(default)]
    pub repaired: u64,
    /// Stripes that could not be checked (a data member missing).
    #[serde(default)]
    pub skipped: u64,
}

/// `POST /v1/volumes/{name}/scrub`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScrubRequest {
    /// Rewrite parity that disagrees with the data (md's "repair"); else
    /// only count (md's "check").
    #[serde(default)]
    pub repair: bool,
    /// Bytes of stripe data per second, e.g. "100MiB"; default unlimited.
    #[serde(default)]
    pub rate: Option<String>,
}

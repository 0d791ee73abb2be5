//! Background jobs: the initial parity sync of a new volume, rebuilds, and
//! scrubs. Each runs as a task that never holds the node's state lock while
//! it works, so the API answers during it; each is listed (`GET /v1/jobs`)
//! with progress, rate and ETA, and kept for a while after it ends.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use volume::{ScrubReport, SyncControl, Volume};

pub use crate::api_types::{JobInfo, JobKind, JobState};
use crate::events::now_rfc3339;

/// Finished jobs kept for `GET /v1/jobs`.
const KEEP_FINISHED: usize = 64;

/// One job. Progress of syncs and scrubs is in `ctl`; a rebuild's is the
/// volume's own rebuild progress.
pub struct Job {
    pub id: u64,
    pub kind: JobKind,
    pub volume: String,
    pub repair: bool,
    pub ctl: Arc<SyncControl>,
    vol: Volume,
    started: String,
    began: std::time::Instant,
    end: parking_lot::Mutex<Option<(JobState, String, f64)>>,
    ended: parking_lot::Mutex<Option<std::time::Instant>>,
    report: parking_lot::Mutex<Option<ScrubReport>>,
    /// Drive names by member position, as the volume had them when the
    /// job (or its last rebuild pass) began.
    drives: parking_lot::Mutex<Vec<String>>,
}

impl Job {
    pub fn is_running(&self) -> bool {
        self.end.lock().is_none()
    }

    pub fn state(&self) -> JobState {
        self.end
            .lock()
            .as_ref()
            .map_or(JobState::Running, |e| e.0.clone())
    }

    /// How long ago the job ended (zero while it runs).
    pub fn ended_ago(&self) -> std::time::Duration {
        self.ended
            .lock()
            .map_or(std::time::Duration::ZERO, |t| t.elapsed())
    }

    pub fn report(&self) -> Option<ScrubReport> {
        self.report.lock().clone()
    }

    pub fn set_drives(&self, drives: Vec<String>) {
        *self.drives.lock() = drives;
    }

    /// A rebuild's totals, kept in `ctl` when it ends (the volume's own
    /// progress describes the next rebuild after that).
    pub fn record_rebuild(&self) {
        let p = self.vol.rebuild_progress();
        let c = &self.ctl;
        c.done.fetch_add(p.done_stripes, Ordering::Relaxed);
        c.total.fetch_add(p.total_stripes, Ordering::Relaxed);
        c.bytes.fetch_add(p.bytes, Ordering::Relaxed);
    }

    /// Marks the job ended (once).
    pub fn finish(&self, state: JobState, report: Option<ScrubReport>) {
        let mut end = self.end.lock();
        if end.is_none() {
            *end = Some((state, now_rfc3339(), self.began.elapsed().as_secs_f64()));
            *self.ended.lock() = Some(std::time::Instant::now());
            *self.report.lock() = report;
        }
    }

    pub fn info(&self) -> JobInfo {
        let end = self.end.lock().clone();
        let (state, finished, elapsed) = match end {
            Some((s, t, e)) => (s, Some(t), e),
            None => (JobState::Running, None, self.began.elapsed().as_secs_f64()),
        };
        let running = finished.is_none();
        let c = &self.ctl;
        let mut info = JobInfo {
            id: self.id,
            kind: self.kind,
            volume: self.volume.clone(),
            state,
            started: self.started.clone(),
            finished,
            elapsed_secs: elapsed,
            done_stripes: c.done.load(Ordering::Relaxed),
            total_stripes: c.total.load(Ordering::Relaxed),
            percent: 0.0,
            // Frozen once the job ends.
            mb_per_sec: if running {
                c.bytes_per_sec() / 1e6
            } else if elapsed > 0.0 {
                c.bytes.load(Ordering::Relaxed) as f64 / elapsed / 1e6
            } else {
                0.0
            },
            eta_secs: if running {
                c.eta().map(|d| d.as_secs_f64())
            } else {
                None
            },
            drives: Vec::new(),
            queued_drives: Vec::new(),
            repair: (self.kind == JobKind::Scrub).then_some(self.repair),
            mismatches: c.mismatches.load(Ordering::Relaxed),
            repaired: c.repaired.load(Ordering::Relaxed),
            skipped: c.skipped.load(Ordering::Relaxed),
        };
        if self.kind == JobKind::Rebuild && running {
            let p = self.vol.rebuild_progress();
            let names = self.drives.lock();
            let name = |i: &usize| names.get(*i).cloned().unwrap_or_else(|| format!("#{i}"));
            info.drives = p.members.iter().map(name).collect();
            info.queued_drives = p.queued_members.iter().map(name).collect();
            info.done_stripes = p.done_stripes;
            info.total_stripes = p.total_stripes + p.queued_stripes;
            info.mb_per_sec = p.bytes_per_sec / 1e6;
            info.eta_secs = if running {
                p.eta.map(|d| d.as_secs_f64())
            } else {
                None
            };
        }
        info.percent = if info.total_stripes == 0 {
            if running { 0.0 } else { 100.0 }
        } else {
            100.0 * info.done_stripes as f64 / info.total_stripes as f64
        };
        info
    }
}

/// The node's jobs, running and recently ended.
#[derive(Default)]
pub struct Jobs {
    next_id: AtomicU64,
    list: parking_lot::Mutex<VecDeque<Arc<Job>>>,
}

impl Jobs {
    /// Registers a running job.
    pub fn start(
        &self,
        kind: JobKind,
        volume: &str,
        vol: &Volume,
        repair: bool,
        ctl: Arc<SyncControl>,
        drives: Vec<String>,
    ) -> Arc<Job> {
        let job = Arc::new(Job {
            id: self.next_id.fetch_add(1, Ordering::Relaxed) + 1,
            kind,
            volume: volume.to_string(),
            repair,
            ctl,
            vol: vol.clone(),
            started: now_rfc3339(),
            began: std::time::Instant::now(),
            end: parking_lot::Mutex::new(None),
            ended: parking_lot::Mutex::new(None),
            report: parking_lot::Mutex::new(None),
            drives: parking_lot::Mutex::new(drives),
        });
        let mut list = self.list.lock();
        list.push_back(job.clone());
        // Ended jobs beyond the newest KEEP_FINISHED go; running ones stay.
        let ended = list.iter().filter(|j| !j.is_running()).count();
        if ended > KEEP_FINISHED {
            let mut drop = ended - KEEP_FINISHED;
            list.retain(|j| {
                if drop > 0 && !j.is_running() {
                    drop -= 1;
                    false
                } else {
                    true
                }
            });
        }
        job
    }

    pub fn all(&self) -> Vec<Arc<Job>> {
        self.list.lock().iter().cloned().collect()
    }

    pub fn get(&self, id: u64) -> Option<Arc<Job>> {
        self.list.lock().iter().find(|j| j.id == id).cloned()
    }

    /// The running job of `kind` on `volume`, if any.
    pub fn running(&self, volume: &str, kind: JobKind) -> Option<Arc<Job>> {
        self.list
            .lock()
            .iter()
            .find(|j| j.volume == volume && j.kind == kind && j.is_running())
            .cloned()
    }

    /// Stops the sync and scrub jobs of `volume` (every volume when None)
    /// and waits until they have ended: a delete or a shutdown must not
    /// race their writes. (A rebuild ends by itself; a delete refuses it.)
    pub async fn stop(&self, volume: Option<&str>) {
        let jobs: Vec<Arc<Job>> = self
            .list
            .lock()
            .iter()
            .filter(|j| j.is_running() && j.kind != JobKind::Rebuild)
            .filter(|j| volume.is_none_or(|v| j.volume == v))
            .cloned()
            .collect();
        for j in &jobs {
            j.ctl.cancel.store(true, Ordering::Relaxed);
        }
        for j in &jobs {
            let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while j.is_running() && std::time::Instant::now() < until {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            if j.is_running() {
                tracing::warn!(
                    "job {} ({:?} of {}) did not stop within 60 s",
                    j.id,
                    j.kind,
                    j.volume
                );
            }
        }
    }

    /// The newest ended job of `kind` on `volume`.
    pub fn last(&self, volume: &str, kind: JobKind) -> Option<Arc<Job>> {
        self.list
            .lock()
            .iter()
            .rev()
            .find(|j| j.volume == volume && j.kind == kind && !j.is_running())
            .cloned()
    }
}

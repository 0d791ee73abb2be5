//! Parity passes as jobs: the initial sync of a new volume, and scrub
//! (started by the operator or on the TOML's schedule, stopped on request).

use std::sync::Arc;
use std::time::Duration;

use volume::{ScrubReport, SyncControl, Volume};

use super::jobs::{JobInfo, JobKind, JobState};
use super::validate::find_volume;
use super::{Node, NodeError, NodeResult, NodeState};
pub use crate::api_types::ScrubRequest;
use crate::events::{EventKind, NewEvent};

/// `[scrub]` of the TOML: every redundant volume is scrubbed when its last
/// scrub ended longer than `interval` ago.
#[derive(Debug, Clone)]
pub struct ScrubSchedule {
    pub interval: Duration,
    pub repair: bool,
    pub rate: Option<u64>,
}

/// Why a volume's parity sync runs in the background.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SyncWhy {
    /// A new volume (created without an inline sync).
    Create,
    /// A takeover served first the regions its crashed owner left dirty.
    CrashResync,
}

impl SyncWhy {
    fn what(self) -> &'static str {
        match self {
            SyncWhy::Create => "initial parity sync",
            SyncWhy::CrashResync => "crash resync of the regions its last owner left dirty",
        }
    }
}

impl Node {
    /// Starts the background parity sync of a volume's unsynced regions
    /// as a job.
    pub(super) fn spawn_sync(
        self: &Arc<Self>,
        st: &NodeState,
        name: &str,
        vol: &Volume,
        why: SyncWhy,
    ) {
        let ctl = Arc::new(SyncControl::default());
        let job = st
            .jobs
            .start(JobKind::Sync, name, vol, true, ctl.clone(), Vec::new());
        let (vol, name, events) = (vol.clone(), name.to_string(), self.events.clone());
        events.emit(
            NewEvent::new(
                EventKind::SyncStarted,
                format!(
                    "volume {name}: {} started (job {}, {} regions); until it ends the volume \
                     has no redundancy where it is not yet synced",
                    why.what(),
                    job.id,
                    vol.unsynced_regions()
                ),
            )
            .volume(&name),
        );
        let what = why.what();
        let foreground = self.foreground.clone();
        tokio::spawn(async move {
            if why == SyncWhy::CrashResync {
                foreground.wait_idle(super::foreground::MAX_WAIT).await;
            }
            let r = vol.initial_sync(&ctl).await;
            let (state, msg) = match &r {
                // Let go (moved, taken over, fenced): the next owner syncs
                // what is left; not a failure of the sync.
                Err(_) if vol.is_fenced() => (
                    JobState::Stopped,
                    format!(
                        "volume {name}: {what} stopped, as the volume was let go ({}); the next \
                         owner syncs the rest",
                        vol.fence_reason().unwrap_or_default()
                    ),
                ),
                Ok(rep) if rep.cancelled => (
                    JobState::Stopped,
                    format!(
                        "volume {name}: {what} stopped; the rest is synced at the next assembly"
                    ),
                ),
                Ok(rep) if rep.skipped > 0 => (
                    JobState::Finished,
                    format!(
                        "volume {name}: {what} finished; {} stripes could not be synced \
                         (a data member is missing): they have no redundancy",
                        rep.skipped
                    ),
                ),
                Ok(_) => (
                    JobState::Finished,
                    format!("volume {name}: {what} finished"),
                ),
                Err(e) => (
                    JobState::Failed(e.to_string()),
                    format!(
                        "volume {name}: {what} failed: {e}; it is retried at the next assembly"
                    ),
                ),
            };
            job.finish(state, r.ok());
            events.emit(NewEvent::new(EventKind::SyncFinished, msg).volume(&name));
        });
    }

    /// Starts a scrub of volume `name` as a job.
    pub async fn scrub_volume(
        self: &Arc<Self>,
        name: &str,
        req: ScrubRequest,
    ) -> NodeResult<JobInfo> {
        let rate = req
            .rate
            .as_deref()
            .map(|r| {
                crate::units::parse_size(r).map_err(|e| NodeError::BadRequest(format!("rate: {e}")))
            })
            .transpose()?;
        let st = self.state.lock().await;
        self.start_scrub(&st, name, req.repair, rate)
    }

    fn start_scrub(
        self: &Arc<Self>,
        st: &NodeState,
        name: &str,
        repair: bool,
        rate: Option<u64>,
    ) -> NodeResult<JobInfo> {
        let e = st
            .volumes
            .get(name)
            .ok_or_else(|| NodeError::no_volume(name))?;
        if let Some(o) = e.offline() {
            return Err(NodeError::Conflict(format!(
                "volume {name} is offline ({}); nothing runs to scrub",
                o.reason
            )));
        }
        let Some(vol) = e.on_drives().cloned() else {
            return Err(NodeError::BadRequest(format!(
                "volume {name} is a thin volume; scrub its pool's volume instead"
            )));
        };
        if vol.layout().parity_columns() == 0 {
            return Err(NodeError::BadRequest(format!(
                "volume {name} is {}: it has no parity or copies to check",
                vol.layout().kind()
            )));
        }
        if vol.is_fenced() {
            return Err(NodeError::Conflict(format!(
                "volume {name} is fenced; this node no longer owns it"
            )));
        }
        for (kind, what) in [
            (JobKind::Scrub, "a scrub"),
            (JobKind::Sync, "its initial sync"),
            (JobKind::Rebuild, "a rebuild"),
        ] {
            if let Some(j) = st.jobs.running(name, kind) {
                return Err(NodeError::Conflict(format!(
                    "volume {name}: {what} runs (job {}); scrub after it ends",
                    j.id
                )));
            }
        }
        if vol.unsynced_regions() > 0 {
            return Err(NodeError::Conflict(format!(
                "volume {name}: {} regions have not had their initial sync; it runs at the next start",
                vol.unsynced_regions()
            )));
        }
        let ctl = Arc::new(SyncControl::with_rate(rate));
        let job = st.jobs.start(
            JobKind::Scrub,
            name,
            &vol,
            repair,
            ctl.clone(),
            e.drives.clone(),
        );
        let info = job.info();
        let what = if repair { "repair" } else { "check" };
        self.events.emit(
            NewEvent::new(
                EventKind::ScrubStarted,
                format!("volume {name}: scrub ({what}) started (job {})", job.id),
            )
            .volume(name),
        );
        let (name, events) = (name.to_string(), self.events.clone());
        tokio::spawn(async move {
            let rep = vol.scrub_with(repair, &ctl).await;
            let state = if rep.cancelled {
                JobState::Stopped
            } else {
                JobState::Finished
            };
            if rep.inconsistent_count > 0 {
                events.emit(
                    NewEvent::new(EventKind::ScrubMismatch, mismatch_text(&name, &rep, repair))
                        .volume(&name),
                );
            }
            let msg = format!(
                "volume {name}: scrub {}: {} stripes checked, {} mismatched, {} repaired, {} skipped",
                if rep.cancelled { "stopped" } else { "finished" },
                rep.stripes_checked,
                rep.inconsistent_count,
                rep.repaired,
                rep.skipped
            );
            job.finish(state, Some(rep));
            events.emit(NewEvent::new(EventKind::ScrubFinished, msg).volume(&name));
        });
        Ok(info)
    }

    /// Stops the running scrub of `name`; what it found so far is kept.
    pub async fn stop_scrub(&self, name: &str) -> NodeResult<JobInfo> {
        let mut st = self.state.lock().await;
        find_volume(&mut st, name)?;
        let job = st.jobs.running(name, JobKind::Scrub).ok_or_else(|| {
            NodeError::Conflict(format!("volume {name}: no scrub runs; nothing was changed"))
        })?;
        job.ctl
            .cancel
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(job.info())
    }

    pub async fn jobs(&self) -> Vec<JobInfo> {
        let jobs = self.state.lock().await.jobs.clone();
        jobs.all().iter().map(|j| j.info()).collect()
    }

    pub async fn job(&self, id: u64) -> NodeResult<JobInfo> {
        let jobs = self.state.lock().await.jobs.clone();
        jobs.get(id).map(|j| j.info()).ok_or_else(|| {
            NodeError::NotFound(format!(
                "no job {id} (ended jobs are kept for a while); list them with `flashpool job list`"
            ))
        })
    }

    /// Runs the TOML's scrub schedule until the node stops: each redundant
    /// volume is scrubbed once its last scrub (on this node, since it
    /// started) ended `interval` ago.
    pub fn spawn_scrub_schedule(self: &Arc<Self>, s: ScrubSchedule) {
        let node = Arc::downgrade(self);
        let started = std::time::Instant::now();
        tokio::spawn(async move {
            let tick = (s.interval / 10).clamp(Duration::from_millis(200), Duration::from_secs(60));
            loop {
                tokio::time::sleep(tick).await;
                let Some(n) = node.upgrade() else { return };
                let st = n.state.lock().await;
                let due: Vec<String> = st
                    .volumes
                    .values()
                    .filter(|e| {
                        e.on_drives()
                            .is_some_and(|v| v.layout().parity_columns() > 0 && !v.is_fenced())
                    })
                    .filter(|e| {
                        let last = st
                            .jobs
                            .last(&e.name, JobKind::Scrub)
                            .map_or(started.elapsed(), |j| j.ended_ago());
                        last >= s.interval
                    })
                    .map(|e| e.name.clone())
                    .collect();
                for name in due {
                    if st.jobs.running(&name, JobKind::Scrub).is_some() {
                        continue;
                    }
                    match n.start_scrub(&st, &name, s.repair, s.rate) {
                        Ok(j) => tracing::info!("volume {name}: scheduled scrub (job {})", j.id),
                        Err(e) => {
                            tracing::debug!("volume {name}: scheduled scrub not started: {e}")
                        }
                    }
                }
            }
        });
    }
}

fn mismatch_text(name: &str, rep: &ScrubReport, repair: bool) -> String {
    let first: Vec<String> = rep
        .inconsistent
        .iter()
        .take(8)
        .map(u64::to_string)
        .collect();
    format!(
        "volume {name}: scrub found {} stripes whose parity disagrees with their data (first: {}); {}",
        rep.inconsistent_count,
        first.join(", "),
        if repair {
            "parity was rewritten from the data"
        } else {
            "run `flashpool volume scrub --repair` to rewrite parity from the data, after \
             checking the drives' health"
        }
    )
}

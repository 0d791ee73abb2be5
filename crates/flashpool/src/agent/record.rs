//! The owner's record of its volumes' member states in etcd.
//!
//! A node that takes a volume over while some members are unreachable
//! trusts the members it does reach only as far as this record allows
//! (`node/degraded.rs`), so the owner writes it before a write that depends
//! on a member-state change is acknowledged (`volume::StateHook`). It is
//! written with the owner's epoch as the guard: a deposed owner cannot
//! write it, and a write that fails fences the volume.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cluster::VolumeState;
use volume::{StateHook, StateRecord};

use super::Agent;
use crate::node::member_state_name;

/// A record that takes longer than this fences the volume: by then the
/// owner's lease is about gone anyway.
const RECORD_TIMEOUT: Duration = Duration::from_secs(2);

impl Agent {
    /// Installs the record hook on volume `name`, owned here at `epoch`,
    /// and writes the first record. Before the volume takes any I/O.
    ///
    /// Returns the switch turned on once the volume is served (written
    /// at once by [`Agent::record_serving`] after a create or a planned
    /// move; after a takeover the next record carries it): the records say
    /// so from then on. Only then: a planned move answers when it reads
    /// that flag, so a first record that said "served" would answer before
    /// the group is Optimized.
    pub(super) async fn start_recording(
        self: &Arc<Self>,
        name: &str,
        epoch: u64,
    ) -> Result<Arc<AtomicBool>, String> {
        let serving = Arc::new(AtomicBool::new(false));
        let hook = self.state_hook(name, None, epoch, serving.clone());
        self.node
            .record_member_states(name, Some(hook))
            .await
            .map_err(|e| e.to_string())?;
        Ok(serving)
    }

    /// [`Agent::start_recording`] for extent `x` of cluster pool `pool`
    /// (`extents.rs`): its record is the pool's, under the pool's epoch.
    pub(super) async fn start_recording_extent(
        self: &Arc<Self>,
        pool: &str,
        x: &str,
        epoch: u64,
    ) -> Result<(), String> {
        let hook = self.extent_hook(pool, x, epoch);
        self.node
            .record_member_states(x, Some(hook))
            .await
            .map_err(|e| e.to_string())
    }

    /// The hook that records extent `x` of pool `pool`, owned at `epoch`.
    pub(super) fn extent_hook(self: &Arc<Self>, pool: &str, x: &str, epoch: u64) -> StateHook {
        self.state_hook(x, Some(pool), epoch, Arc::default())
    }

    /// The volume is served here now: recorded (a planned move waits for
    /// it), in order with the member-state records.
    pub(super) async fn record_serving(&self, name: &str, serving: &AtomicBool) {
        serving.store(true, Ordering::SeqCst);
        if let Err(e) = self.node.record_member_states(name, None).await {
            tracing::warn!("volume {name}: recording that it is served here: {e}");
        }
    }

    /// The hook that records volume `name`'s member states: as its own
    /// record, or with `pool` as that pool's record of its extent `name`.
    fn state_hook(
        self: &Arc<Self>,
        name: &str,
        pool: Option<&str>,
        epoch: u64,
        serving: Arc<AtomicBool>,
    ) -> StateHook {
        let agent = Arc::downgrade(self);
        let name = name.to_string();
        let pool = pool.map(str::to_string);
        // The etcd client needs a tokio runtime; the volume's I/O may run on
        // another executor, so the record runs on the agent's runtime.
        let rt = tokio::runtime::Handle::current();
        Arc::new(move |rec: StateRecord| {
            let (agent, name, rt) = (agent.clone(), name.clone(), rt.clone());
            let pool = pool.clone();
            let serving = serving.load(Ordering::SeqCst);
            Box::pin(async move {
                let a = agent.upgrade().ok_or("the cluster agent stopped")?;
                let st = VolumeState {
                    epoch,
                    generation: rec.generation,
                    members: rec
                        .states
                        .iter()
                        .map(|s| member_state_name(*s).to_string())
                        .collect(),
                    note: format!("owned by {} at epoch {epoch}", a.name()),
                    serving,
                };
                let s = a.session();
                drop(a);
                let task = rt.spawn(async move {
                    let put = async {
                        match &pool {
                            Some(p) => s.put_extent_state(p, &name, &st).await,
                            None => s.put_state(&name, &st).await,
                        }
                    };
                    tokio::time::timeout(RECORD_TIMEOUT, put).await
                });
                match task.await {
                    Ok(Ok(Ok(()))) => Ok(()),
                    Ok(Ok(Err(e))) => Err(e.to_string()),
                    Ok(Err(_)) => Err(format!(
                        "etcd did not answer in {} ms",
                        RECORD_TIMEOUT.as_millis()
                    )),
                    Err(e) => Err(format!("the record task failed: {e}")),
                }
            })
        })
    }
}

//! What cluster mode needs of the node: the device of a volume it owns, and
//! the two ways of letting a volume go. A deposed or fenced owner drops it
//! without writing a byte; a planned move closes it cleanly first, so that
//! the next owner assembles it clean.

use std::sync::Arc;

use blockdev::BlockDevice;
use volume::StateHook;

use super::{Node, NodeError, NodeResult, NodeState};

impl Node {
    /// The device a namespace of volume `name` serves, if the node runs it.
    pub async fn volume_device(&self, name: &str) -> Option<Arc<dyn BlockDevice>> {
        self.state
            .lock()
            .await
            .volumes
            .get(name)
            .map(|e| e.device())
    }

    /// Member writes this node's target accepted from hosts whose
    /// registration another host had preempted (must stay 0).
    pub fn stale_write_audit(&self) -> u64 {
        self.target().map(|t| t.stale_write_audit()).unwrap_or(0)
    }

    /// Installs `hook` on volume `name` (a cluster owner records its member
    /// states in etcd, `volume::StateHook`), or keeps the installed one with
    /// `None`, and records the current states through it. An error: the
    /// volume is gone, or the record failed.
    pub async fn record_member_states(
        &self,
        name: &str,
        hook: Option<StateHook>,
    ) -> NodeResult<()> {
        let v = {
            let st = self.state.lock().await;
            st.volumes
                .get(name)
                .and_then(|e| e.on_drives())
                .cloned()
                .ok_or_else(|| NodeError::Internal(format!("volume {name} vanished")))?
        };
        if hook.is_some() {
            v.set_state_hook(hook);
        }
        v.record_states_now().await.map_err(|e| {
            NodeError::Unavailable(format!(
                "volume {name}: recording its member states in the cluster: {e}"
            ))
        })
    }

    /// Whether the node's volume `name` fenced itself (a member answered
    /// Reservation Conflict: another node took it over). A pool is fenced
    /// when one of its extents is: it cannot serve what lies there.
    pub async fn volume_fenced(&self, name: &str) -> Option<String> {
        fence_of(&*self.state.lock().await, name)
    }

    /// The volumes run here that have fenced themselves (one lock for all).
    pub async fn fenced_volumes(&self) -> std::collections::HashSet<String> {
        let st = self.state.lock().await;
        st.volumes
            .keys()
            .filter(|n| fence_of(&st, n).is_some())
            .cloned()
            .collect()
    }

    /// Lets go of volume `name` without writing anything: fences it (its
    /// queued and future I/O fail with a path error), forgets it and closes
    /// its remote drives. The reservations stay as they are: the next owner
    /// preempts them.
    ///
    /// A pool's extents go with it, the same way.
    pub async fn drop_fenced(&self, name: &str, why: &str) {
        let mut st = self.state.lock().await;
        let extents = super::volumes::extents_of(&st, name);
        drop_one(&mut st, name, why).await;
        for x in extents {
            drop_one(&mut st, &x, why).await;
        }
    }

    /// The extents of thin pool `name` (open here) that the node runs.
    pub async fn pool_extents(&self, name: &str) -> Vec<String> {
        super::volumes::extents_of(&*self.state.lock().await, name)
    }

    /// Open thin pool `name`'s extents as its metadata lists them: the
    /// names of those the node runs, and whether it lists one that the node
    /// does not run. None when no such pool is open here.
    pub async fn pool_listed_extents(&self, name: &str) -> Option<(Vec<String>, bool)> {
        let st = self.state.lock().await;
        let e = st.volumes.get(name)?;
        if e.pool_waiting.is_some() {
            return None;
        }
        let p = e.thin_pool()?;
        let (pool, listed) = (p.uuid(), p.extents());
        let running: Vec<(&str, &str)> = st
            .volumes
            .values()
            .filter_map(|v| {
                let x = v.extent.as_ref().filter(|x| x.pool == pool)?;
                Some((v.name.as_str(), x.extent.as_str()))
            })
            .filter(|(_, u)| listed.iter().any(|i| i.uuid == *u))
            .collect();
        let missing = listed
            .iter()
            .any(|i| !running.iter().any(|(_, u)| *u == i.uuid));
        Some((
            running.iter().map(|(n, _)| n.to_string()).collect(),
            missing,
        ))
    }

    /// Why thin pool `name` is not open here, when it waits for extents
    /// that are not assembled (`None`: open, or no such pool).
    pub async fn pool_waiting(&self, name: &str) -> Option<String> {
        let st = self.state.lock().await;
        st.volumes.get(name)?.pool_waiting.clone()
    }

    /// Lets go of volume `name` for a planned move: makes it durable and
    /// clean, gives up the reservations, forgets it and closes its remote
    /// drives. The caller has stopped new I/O and waited for the rest. A
    /// pool's extents are closed after the pool (which writes to them).
    pub async fn hand_over(&self, name: &str) -> NodeResult<()> {
        let extents = super::volumes::extents_of(&*self.state.lock().await, name);
        self.hand_over_one(name).await?;
        let mut failed = None;
        for x in extents {
            if let Err(e) = self.hand_over_one(&x).await {
                // the pool is closed: the next owner finds the extent as a
                // crashed owner leaves it, which its journal covers
                drop_one(&mut *self.state.lock().await, &x, "clean handover failed").await;
                failed.get_or_insert(e);
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// [`Node::hand_over`] of one volume.
    ///
    /// The closing I/O (the pool's and the volume's metadata, the members'
    /// reservations) runs outside the node's lock: a drain hands many
    /// volumes over at once, and one volume's close must not wait for
    /// another's. The agent's task for `name` is the only one acting on it
    /// meanwhile; the entry stays in the map until the volume is closed.
    async fn hand_over_one(&self, name: &str) -> NodeResult<()> {
        let (compactor, pool, vol, drives, remotes) = {
            let st = self.state.lock().await;
            let Some(e) = st.volumes.get(name) else {
                return Err(NodeError::NotFound(format!(
                    "no volume {} on this node",
                    crate::echo::Echo(name)
                )));
            };
            let remotes = super::remote::remotes_of(&st, &e.drives);
            (
                st.compactor.clone(),
                e.thin_pool().cloned(),
                e.on_drives().cloned(),
                e.drives.clone(),
                remotes,
            )
        };
        // A pool's chunk map is made durable before the volume below it,
        // once its compaction has ended.
        compactor.finish(Some(name)).await;
        if let Some(p) = pool {
            p.close()
                .await
                .map_err(|err| NodeError::Internal(format!("pool {name}: close: {err}")))?;
        }
        if let Some(v) = vol {
            v.close()
                .await
                .map_err(|err| NodeError::Internal(format!("volume {name}: close: {err}")))?;
            // Closed clean: nothing of this node may touch it or its record
            // again (a background job would see its members go as the
            // drives close, and record them failed for the next owner).
            v.set_state_hook(None);
            v.fence("handed over to another node");
        }
        self.unclaim_remotes(&remotes).await;
        let mut st = self.state.lock().await;
        st.volumes.remove(name);
        drop_thin_of(&mut st, name);
        // Kept open as standby links: a move back (or a takeover after the
        // next owner dies) need not connect again.
        for (n, dev) in take_remotes(&mut st, &drives) {
            self.unwatch_link(&n);
            self.park_standby(&n, dev);
        }
        tracing::info!("volume {name}: handed over (clean, reservations released)");
        Ok(())
    }
}

/// Why volume `name` (or, a pool, one of its extents) is fenced, if it is.
fn fence_of(st: &NodeState, name: &str) -> Option<String> {
    let fenced = |n: &str| {
        let v = st.volumes.get(n)?.on_drives()?;
        v.is_fenced().then(|| v.fence_reason().unwrap_or_default())
    };
    fenced(name).or_else(|| {
        super::volumes::extents_of(st, name)
            .iter()
            .find_map(|x| fenced(x).map(|why| format!("its extent {x}: {why}")))
    })
}

/// [`Node::drop_fenced`] of one volume.
async fn drop_one(st: &mut NodeState, name: &str, why: &str) {
    // Its pool's compaction ends first (its writes would fail anyway).
    st.compactor.clone().stop(name).await;
    let Some(e) = st.volumes.remove(name) else {
        return;
    };
    if let Some(v) = e.on_drives() {
        v.fence(why);
        v.set_state_hook(None);
    }
    // A pool's thin volumes go with it (their I/O fails through it).
    drop_thin_of(st, name);
    close_remotes(st, &e.drives);
    tracing::warn!("volume {name}: let go without writing ({why})");
}

/// Forgets the thin volumes of pool `pool`.
fn drop_thin_of(st: &mut NodeState, pool: &str) {
    st.volumes
        .retain(|_, e| !matches!(&e.backing, super::Backing::Thin { pool: p, .. } if p == pool));
}

/// Closes and forgets the remote drives among `names`.
fn close_remotes(st: &mut NodeState, names: &[String]) {
    for (_, dev) in take_remotes(st, names) {
        let _ = dev.shutdown();
    }
}

/// Forgets the remote drives among `names` and returns their handles.
fn take_remotes(
    st: &mut NodeState,
    names: &[String],
) -> Vec<(String, Arc<nvmf_host::remote::RemoteDevice>)> {
    let mut out = Vec::new();
    for n in names {
        // One an assembly has set aside (this volume's offline entry
        // giving way to it) stays open for that assembly.
        if st.drives.get(n).is_some_and(|d| d.remote.is_some())
            && st.check_not_assembling(n).is_ok()
            && let Some(d) = st.drives.remove(n)
            && let Some(r) = d.remote
        {
            out.push((n.clone(), r));
        }
    }
    out
}

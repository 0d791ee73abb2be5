//! What an operator does to a volume's drives: fail one, replace it, and
//! the rebuild that follows.

use std::sync::Arc;

use volume::{MemberState, RebuildOptions, Volume};

use super::ops::{DriveInfo, VolumeInfo};
use super::validate::no_drive;
use super::{Node, NodeError, NodeResult, NodeState, wipe_head};

impl Node {
    /// Marks a drive failed: its volume goes on degraded and the drive is
    /// not used again until the node restarts. Failing a member beyond
    /// what its volume's layout tolerates (any member of raid0 or concat,
    /// a second of raid5, ...) loses data: without `force` it is refused
    /// and nothing changes; with it the volume is `failed`.
    pub async fn fail_drive(&self, name: &str, force: bool) -> NodeResult<DriveInfo> {
        let mut st = self.state.lock().await;
        if !st.drives.contains_key(name) {
            return Err(no_drive(name));
        }
        st.check_not_assembling(name)?;
        if let Some((v, p)) = st.user_of(name) {
            let v = v.to_string();
            let e = &st.volumes[&v];
            if let Some(o) = e.offline() {
                return Err(NodeError::Conflict(format!(
                    "drive {name} holds position {p} of volume {v}, which is offline ({}); \
                     nothing runs on it to fail",
                    o.reason
                )));
            }
            let vol = e.on_drives().expect("drive users are on drives");
            if vol.member_states()[p] != MemberState::Failed {
                if let Some(loss) = loss_if_failed(vol, &e.drives, p) {
                    if !force {
                        return Err(NodeError::Conflict(format!(
                            "failing drive {name} would fail volume {v}: {loss}. Nothing was \
                             changed; to fail it anyway use --force (API: {{\"force\": true}})"
                        )));
                    }
                    tracing::error!(
                        "drive {name}: failed by the operator with force; volume {v} has failed: {loss}"
                    );
                } else {
                    tracing::warn!(
                        "drive {name}: failed by the operator; volume {v} runs degraded"
                    );
                }
                vol.fail_member(p)
                    .await
                    .map_err(|err| NodeError::Internal(format!("volume {v}: {err}")))?;
            }
        }
        if let Some(d) = st.drives.get_mut(name) {
            d.failed = true;
        }
        self.note_failed_drives(&st);
        Ok(st.drive_info(name).expect("exists"))
    }

    /// Puts drive `with` in the place of `name` in its volume and starts the
    /// rebuild. A drive that has not failed yet is failed first.
    pub async fn replace_drive(self: &Arc<Self>, name: &str, with: &str) -> NodeResult<VolumeInfo> {
        self.replace_drive_as(name, with, false).await
    }

    /// [`Node::replace_drive`]; with `preempt`, another node's reservation
    /// on `with` is preempted rather than refused (a cluster owner finishing
    /// a replace that a deposed owner began on that drive).
    pub async fn replace_drive_as(
        self: &Arc<Self>,
        name: &str,
        with: &str,
        preempt: bool,
    ) -> NodeResult<VolumeInfo> {
        let run = self.replace_drive_inner(name, with, preempt);
        self.undo_remotes_on_err(&[with.to_string()], run).await
    }

    async fn replace_drive_inner(
        self: &Arc<Self>,
        name: &str,
        with: &str,
        preempt: bool,
    ) -> NodeResult<VolumeInfo> {
        let mut st = self.state.lock().await;
        if !st.drives.contains_key(name) {
            return Err(no_drive(name));
        }
        st.check_not_assembling(name)?;
        let Some((v, p)) = st.user_of(name).map(|(v, p)| (v.to_string(), p)) else {
            return Err(NodeError::Conflict(format!(
                "drive {name} is not in any volume; nothing to replace"
            )));
        };
        self.replace_at(&mut st, &v, p, Some(name), with, preempt)
            .await
    }

    /// Puts drive `with` at position `p` of volume `v`, which no drive
    /// holds (`-`: its member was not found when the volume was assembled,
    /// as after a cluster replace cut short), and starts the rebuild.
    pub async fn replace_missing(
        self: &Arc<Self>,
        v: &str,
        p: usize,
        with: &str,
        preempt: bool,
    ) -> NodeResult<VolumeInfo> {
        let run = async {
            let mut st = self.state.lock().await;
            let Some(e) = st.volumes.get(v) else {
                return Err(NodeError::no_volume(v));
            };
            if e.drives.get(p).is_none_or(|d| d != "-") {
                return Err(NodeError::Conflict(format!(
                    "volume {v}: position {p} is held by a drive; replace that drive"
                )));
            }
            self.replace_at(&mut st, v, p, None, with, preempt).await
        };
        self.undo_remotes_on_err(&[with.to_string()], run).await
    }

    /// Replaces the member of `v` at `p` (drive `old`, when a drive holds
    /// it) by `with`: every check first, then fail, replace, rebuild.
    async fn replace_at(
        self: &Arc<Self>,
        st: &mut NodeState,
        v: &str,
        p: usize,
        old: Option<&str>,
        with: &str,
        preempt: bool,
    ) -> NodeResult<VolumeInfo> {
        let name = old.unwrap_or("-");
        st.check_not_assembling(with)?;
        if let Some(o) = st.volumes[v].offline() {
            return Err(NodeError::Conflict(format!(
                "volume {v} is offline ({}); a drive of an offline volume cannot be replaced",
                o.reason
            )));
        }
        let with_list = [with.to_string()];
        self.open_named_remotes(st, &with_list).await?;
        let dev = st.claimable(&with_list)?[0].clone();
        let vol = st.volumes[v]
            .on_drives()
            .expect("drive users are on drives")
            .clone();
        // Everything is checked before anything changes: a refused replace
        // leaves the drive, the volume and the spare as they were.
        if vol.is_fenced() {
            return Err(NodeError::Conflict(format!(
                "volume {v} is fenced ({}); this node no longer owns it",
                vol.fence_reason().unwrap_or_default()
            )));
        }
        vol.check_replacement(p, &dev).map_err(|err| match err {
            volume::VolumeError::CannotRebuild(_) => NodeError::Conflict(format!(
                "volume {v}: drive {name} cannot be replaced: {err}; nothing was changed"
            )),
            _ => NodeError::BadRequest(format!(
                "volume {v}: drive {with} cannot replace {name}: {err}; nothing was changed"
            )),
        })?;
        self.claim(st, &with_list, preempt).await?;
        if vol.member_states()[p] != MemberState::Failed {
            vol.fail_member(p)
                .await
                .map_err(|err| NodeError::Internal(format!("volume {v}: {err}")))?;
        }
        vol.replace_member(p, dev).await.map_err(|err| match err {
            volume::VolumeError::Busy(_) => NodeError::Conflict(format!("volume {v}: {err}")),
            _ => NodeError::BadRequest(format!("volume {v}: {err}")),
        })?;
        let e = st.volumes.get_mut(v).expect("checked above");
        e.drives[p] = with.to_string();
        if let Some(d) = st.drives.get_mut(with) {
            d.fresh = false;
        }
        if let Some(d) = old.and_then(|o| st.drives.get_mut(o)) {
            d.failed = true;
            // Best effort: the old drive may be dead. Wiped, it cannot claim
            // its old position at the next start.
            let _ = wipe_head(&d.dev).await;
        }
        self.note_failed_drives(st);
        tracing::info!("volume {v}: drive {with} replaces {name} at position {p}; rebuilding");
        self.spawn_rebuild(st, v);
        Ok(st.volume_info(v).expect("exists"))
    }

    /// Starts a volume's rebuild in the background unless one is already
    /// on its way. The task rebuilds every member in the Rebuilding state and
    /// looks again when done, under the state lock that `replace_drive` holds,
    /// so a drive replaced while a rebuild runs is never left behind. Its
    /// outcome is kept for `rebuild-status`.
    pub(super) fn spawn_rebuild(self: &Arc<Self>, st: &mut NodeState, name: &str) {
        let Some(e) = st.volumes.get_mut(name) else {
            return;
        };
        let Some(vol) = e.on_drives().cloned() else {
            return;
        };
        if e.rebuild_task {
            // The running job names the new drive from now on.
            if let Some(j) = st.jobs.running(name, super::jobs::JobKind::Rebuild) {
                j.set_drives(e.drives.clone());
            }
            return;
        }
        e.rebuild_task = true;
        let opts = RebuildOptions {
            rate_bytes_per_sec: e.rebuild_rate,
            ..RebuildOptions::default()
        };
        let job = st.jobs.start(
            super::jobs::JobKind::Rebuild,
            name,
            &vol,
            false,
            Arc::default(),
            e.drives.clone(),
        );
        let node = self.clone();
        let name = name.to_string();
        tokio::spawn(async move {
            // A takeover's resync starts once this node's takeovers are done.
            node.foreground.wait_idle(super::foreground::MAX_WAIT).await;
            loop {
                // Only while the node still runs this volume under its name
                // (a delete refuses while the task is due; a drop fences). A
                // volume assembled again under it has a task of its own.
                match node.state.lock().await.volumes.get(&name) {
                    Some(e) if e.on_drives().is_some_and(|v| v.same(&vol)) => {
                        job.set_drives(e.drives.clone());
                    }
                    _ => {
                        job.finish(super::jobs::JobState::Stopped, None);
                        return;
                    }
                }
                let before = vol.member_states();
                let mut outcome = vol.rebuild(opts.clone()).await.err().map(|e| e.to_string());
                job.record_rebuild();
                if outcome.is_none() && vol.member_states() == before {
                    // Nothing moved: another pass would spin.
                    outcome = Some(format!("the rebuild made no progress (members {before:?})"));
                }
                match &outcome {
                    None => tracing::info!("volume {name}: rebuild finished"),
                    Some(e) => tracing::error!("volume {name}: rebuild failed: {e}"),
                }
                let mut st = node.state.lock().await;
                let Some(e) = st
                    .volumes
                    .get_mut(&name)
                    .filter(|e| e.on_drives().is_some_and(|v| v.same(&vol)))
                else {
                    // Gone, or another volume under its name now: not this
                    // task's to record or to clear.
                    job.finish(super::jobs::JobState::Stopped, None);
                    return;
                };
                e.last_rebuild_error = outcome.clone();
                let more = outcome.is_none()
                    && vol.member_states().iter().any(|s| {
                        matches!(
                            s,
                            MemberState::Rebuilding { .. } | MemberState::Resyncing { .. }
                        )
                    });
                if !more {
                    e.rebuild_task = false;
                    job.finish(
                        match outcome {
                            None => super::jobs::JobState::Finished,
                            Some(err) => super::jobs::JobState::Failed(err),
                        },
                        None,
                    );
                    return;
                }
                tracing::info!(
                    "volume {name}: a member was replaced or re-added meanwhile; rebuilding it"
                );
            }
        });
    }

    /// Waits until no rebuild of `name` runs.
    #[cfg(test)]
    pub async fn wait_rebuild(
        &self,
        name: &str,
        timeout: std::time::Duration,
    ) -> NodeResult<VolumeInfo> {
        let until = std::time::Instant::now() + timeout;
        loop {
            let info = self.volume(name).await?;
            if !info.rebuild.running {
                return Ok(info);
            }
            if std::time::Instant::now() > until {
                return Ok(info);
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// What failing member `p` of `vol` would lose, if it takes the volume
/// beyond its layout's tolerance; None if the volume survives it.
fn loss_if_failed(vol: &Volume, drives: &[String], p: usize) -> Option<String> {
    let l = vol.layout();
    let mut gone = vol.incomplete_members();
    if !gone.contains(&p) {
        gone.push(p);
        gone.sort_unstable();
    }
    if gone.len() <= l.parity_columns() {
        return None;
    }
    let names: Vec<&str> = gone
        .iter()
        .map(|&i| drives.get(i).map(String::as_str).unwrap_or("-"))
        .collect();
    let what = if l.parity_columns() == 0 {
        format!(
            "{} has no redundancy, so every block on it becomes unreadable and unwritable",
            l.kind()
        )
    } else {
        format!(
            "{} of its {} members would be failed or not yet rebuilt ({}), more than the {} \
             {} tolerates, so the data that needs them becomes unreadable and can no longer \
             be rebuilt",
            gone.len(),
            l.members(),
            names.join(", "),
            l.parity_columns(),
            l.kind()
        )
    };
    Some(format!(
        "{what}; the volume's I/O that needs them fails (Unrecovered Read Error / Write Fault)"
    ))
}

//! Owning a cluster volume: gathering what etcd and this node show of it,
//! and carrying out what `decide.rs` says: taking it over, and the two ways
//! of letting it go (fenced, or handed over cleanly).
//!
//! [`Agent::settle`] is one volume's whole pass (gather, decide, act) and
//! [`Agent::act`] runs one volume's plan; neither touches another volume,
//! so `runner.rs` calls them for many volumes at once, each in its own
//! task with its own slot; a volume that waits (its turn, its back-off)
//! asks to be settled again when the wait is over.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cluster::{ClusterError, Handoff, Session, VolumeRead, VolumeSpec, VolumeState};
use nvmf_target::AnaState;

use super::decide::{self, Action, COOLDOWN, LocalVolume, Members, Plan, VolumeView, Wait};
use super::observe::{self, Steps};
use super::runner::PassRead;
use super::{Agent, OwnedGroup, Served};
use crate::node::{AssembleVolume, Degraded, Recorded};

/// How soon a pool whose ANA group is held is settled again.
const HELD_RETRY: Duration = Duration::from_millis(250);

/// A pool owned here whose ANA group is held (see [`OwnedGroup::held`]):
/// what its release does, once the pool is served.
pub(super) struct Held {
    /// The flag of its state records that says it is served.
    serving: Arc<std::sync::atomic::AtomicBool>,
    since: Instant,
    /// The takeover's report, told at the release: hosts are served then,
    /// not at the claim or assembly.
    report: TakeoverReport,
}

/// What a takeover tells once the volume is served: its event, its
/// histogram sample and the end of the planned move that brought it.
struct TakeoverReport {
    epoch: u64,
    from: Option<String>,
    steps: Steps,
    handoff_seen: Option<(Handoff, Instant)>,
    /// The volume's handoff now, when known without a read.
    handoff_now: Option<Option<Handoff>>,
}

/// The keys of a volume that a decision was made on: read for it, or its
/// pass's read ([`PassRead::usable`]), which a claim trusts no further than
/// its own compare.
#[derive(Clone, Copy)]
pub(super) struct Seen<'a> {
    read: &'a VolumeRead,
    of_pass: bool,
}

impl Agent {
    /// Brings one volume's ownership where etcd says it should be: reads
    /// its keys, decides, acts. `slot` is the volume as served here (none
    /// for a spec not served here yet); `pass`: its keys as its pass read
    /// them, decided on where [`PassRead::usable`] allows.
    pub(super) async fn settle(
        self: &Arc<Self>,
        s: &Session,
        members: &Members,
        spec: &VolumeSpec,
        slot: &mut Option<Served>,
        pass: Option<PassRead>,
    ) -> Result<(), ClusterError> {
        let name = &spec.name;
        let me = s.node();
        // The parts of a spec that change: a pool's extents (`extents.rs`),
        // and the drives a replace put in (`replace.rs`).
        if let Some(sv) = slot.as_mut() {
            if sv.spec.extents != spec.extents {
                sv.spec.extents = spec.extents.clone();
            }
            if sv.spec.drives != spec.drives || sv.spec.joining != spec.joining {
                sv.spec.drives = spec.drives.clone();
                sv.spec.joining = spec.joining.clone();
            }
        }
        // One round trip for the owner, handoff, epoch and state keys: a
        // claim and a takeover go on from this read (`cluster/claim.rs`).
        // None at all for a volume the pass's own read may stand for: a
        // survivor of a node that owned N volumes reads none of them again.
        let run_here = slot.as_ref().is_some_and(|sv| sv.epoch.is_some());
        let (read, of_pass) = match pass.and_then(|p| p.usable(me, run_here)) {
            Some(r) => (r, true),
            None => {
                #[cfg(test)]
                if !run_here {
                    self.volume_reads
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                (s.read_volume(name).await?, false)
            }
        };
        let owner = read.owner.clone();
        self.seen_owner(name, spec.ana_group, owner.as_ref());
        let handoff = if decide::handoff_matters(owner.as_ref(), me) {
            read.handoff.clone()
        } else {
            None
        };
        // Only a volume run here can have fenced itself.
        let fenced = match slot.as_ref().and_then(|sv| sv.epoch) {
            Some(_) => self.node.volume_fenced(name).await,
            None => None,
        };
        let here = self.local_volume(name, slot.as_ref(), fenced);
        let view = VolumeView {
            name: name.clone(),
            owner,
            handoff,
            // this read is newer than the pass's list of specs
            deleting: read.deleting,
        };
        let plan = decide::decide_volume(members, me, &view, &here, Instant::now());
        let seen = Seen {
            read: &read,
            of_pass,
        };
        self.act(s, spec, slot, plan, Some(seen)).await?;
        // A pool's thin volumes: served as etcd lists them (one range read).
        if spec.thin_pool
            && let Some(sv) = slot
        {
            let ready = self.sync_thins(s, sv, false).await?;
            self.release_held(s, name, ready).await;
        }
        Ok(())
    }

    /// Pool `name`, owned here with its group held (see
    /// [`OwnedGroup::held`]): Optimized and served once every
    /// thin volume is served with its reservations (`ready`); until then
    /// it is settled again soon.
    async fn release_held(self: &Arc<Self>, s: &Session, name: &str, ready: bool) {
        let released = {
            let mut owned = self.owned.lock();
            let Some(o) = owned.get_mut(name).filter(|o| o.held.is_some()) else {
                return;
            };
            if ready && s.is_valid() {
                self.target.set_ana_state(o.group, AnaState::Optimized);
                tracing::info!(
                    "pool {name}: its thin volumes' host reservations are read; ANA group {} \
                     optimized",
                    o.group
                );
                o.held.take()
            } else {
                None
            }
        };
        match released {
            Some(Held {
                serving,
                since,
                mut report,
            }) => {
                self.node
                    .events
                    .emit(observe::pool_released(name, since.elapsed()));
                report.steps.serving = Instant::now();
                self.report_served(s, name, &serving, report).await;
            }
            None => self.kick_after(name, HELD_RETRY),
        }
    }

    /// This node's side of one volume, for a decision.
    pub(super) fn local_volume(
        &self,
        name: &str,
        sv: Option<&Served>,
        fenced: Option<String>,
    ) -> LocalVolume {
        LocalVolume {
            served: sv.is_some(),
            epoch: sv.and_then(|sv| sv.epoch),
            fenced,
            memory: self.memory.lock().get(name).cloned().unwrap_or_default(),
        }
    }

    /// Stores a decision's memory of `name`.
    fn remember(&self, name: &str, m: decide::Memory) {
        let mut all = self.memory.lock();
        if m == decide::Memory::default() {
            // nothing to remember: as if never seen (keeps the map small)
            all.remove(name);
        } else {
            all.insert(name.to_string(), m);
        }
    }

    /// Changes what is remembered of `name` after an action's outcome.
    pub(super) fn memory_of(&self, name: &str, f: impl FnOnce(&mut decide::Memory)) {
        let mut all = self.memory.lock();
        let m = all.entry(name.to_string()).or_default();
        f(m);
        if *m == decide::Memory::default() {
            all.remove(name);
        }
    }

    /// Carries out one volume's plan, step by step; an etcd error ends it
    /// (and the pass, as before the plans existed). `seen`: the read the
    /// plan was made on, which a claim goes on from.
    pub(super) async fn act(
        self: &Arc<Self>,
        s: &Session,
        spec: &VolumeSpec,
        slot: &mut Option<Served>,
        plan: Plan,
        seen: Option<Seen<'_>>,
    ) -> Result<(), ClusterError> {
        let mut memory = Some(plan.memory);
        for step in plan.steps {
            if step != Action::ServeStandby
                && let Some(m) = memory.take()
            {
                self.remember(&spec.name, m);
            }
            if !self.act_one(s, spec, slot, step, seen).await? {
                break;
            }
        }
        Ok(())
    }

    /// One step; `false` when the volume's later steps must wait for the
    /// next pass.
    async fn act_one(
        self: &Arc<Self>,
        s: &Session,
        spec: &VolumeSpec,
        slot: &mut Option<Served>,
        step: Action,
        seen: Option<Seen<'_>>,
    ) -> Result<bool, ClusterError> {
        let name = &spec.name;
        match step {
            Action::ServeStandby => match self.serve_standby(spec) {
                Ok(sw) => {
                    *slot = Some(Served::new(spec.clone(), sw, None));
                }
                Err(e) => {
                    tracing::error!("cluster volume {name}: cannot serve it here: {e}");
                    return Ok(false);
                }
            },
            Action::Unserve => {
                match slot.as_ref() {
                    Some(sv) => self.unserve_all(sv),
                    None => self.unserve(spec),
                }
                self.forget(name);
                *slot = None;
            }
            Action::StepDown { why } => {
                if let Some(sv) = slot {
                    self.step_down(sv, &why).await;
                }
            }
            Action::Fence { why, epoch } => {
                if let Some(sv) = slot {
                    self.tell_fenced(name, &why);
                    self.step_down(sv, &why).await;
                }
                s.release(name, epoch).await?;
            }
            Action::Release { epoch } => {
                // Claimed in an earlier attempt that did not finish: give it
                // back, so that whoever can serve it takes it.
                tracing::warn!(
                    "volume {name}: owned here at epoch {epoch} but not running; releasing it"
                );
                s.release(name, epoch).await?;
            }
            Action::HandOff { to, epoch } => {
                if let Some(sv) = slot {
                    self.hand_off(s, sv, epoch, &to).await;
                }
            }
            Action::AskHandOff { to, epoch } => {
                tracing::info!("volume {name}: this node drains; handing it to {to}");
                s.set_handoff(name, &Handoff { to, epoch }).await?;
            }
            Action::Claim { .. } => {
                let Some(sv) = slot else { return Ok(true) };
                let (unowned_since, handoff_seen) = {
                    let m = self.memory.lock();
                    let m = m.get(name);
                    (
                        m.and_then(|m| m.unowned_since),
                        m.and_then(|m| m.handoff_seen.clone()),
                    )
                };
                let claim_started = Instant::now();
                let claimed = match seen {
                    // Only on that read: had anything claimed, released or
                    // marked it since, that comes as a watch event, and the
                    // volume is settled again on a newer read.
                    Some(Seen {
                        read,
                        of_pass: true,
                    }) => s.claim_on(name, read).await?.map(|o| (o, true)),
                    Some(Seen { read, .. }) => s.claim_from(name, read).await?,
                    None => s.claim(name).await?.map(|o| (o, false)),
                };
                let Some((o, unchanged)) = claimed else {
                    // another node won
                    return Ok(true);
                };
                // the state record as of the claim, when the read still holds it
                let current = seen.map(|x| x.read).filter(|_| unchanged);
                let claimed = Instant::now();
                self.memory_of(name, |m| m.unowned_since = None);
                // from the first pass that saw it unowned, or from when its
                // task was queued if that came first (waiting for a slot)
                let queued = self.queued.lock().get(name.as_str()).copied();
                let first_seen = unowned_since
                    .unwrap_or(claim_started)
                    .min(queued.unwrap_or(claim_started));
                let steps = Steps {
                    first_seen,
                    claim_started,
                    claimed,
                    assembled: claimed,
                    serving: claimed,
                };
                self.take_over(s, sv, o.epoch, steps, handoff_seen, current)
                    .await;
            }
            Action::Wait(Wait::Turn { due, .. }) => {
                self.kick_after(name, due.saturating_duration_since(Instant::now()));
            }
            Action::Wait(_) | Action::Keep(_) => {}
        }
        Ok(true)
    }

    /// Takes over a volume just claimed at `epoch`: connects to its members,
    /// preempts the old owner's reservations, assembles (journal replay,
    /// resync), and turns its group Optimized. On failure it gives the
    /// volume back and leaves it to the others for a while.
    ///
    /// `steps` has the claim's times (the rest is measured here);
    /// `handoff_seen` is a handoff this node remembers and since when: a
    /// planned move began then, if it is the handoff that brought the
    /// volume here (an older one is not). `current`: the claim's read, when
    /// nobody came between it and the claim (`cluster/claim.rs`): its
    /// member-state record and handoff are still the current ones then
    /// (else both are read again).
    async fn take_over(
        self: &Arc<Self>,
        s: &Session,
        sv: &mut Served,
        epoch: u64,
        mut steps: Steps,
        handoff_seen: Option<(Handoff, Instant)>,
        current: Option<&VolumeRead>,
    ) {
        let t0 = Instant::now();
        let name = sv.spec.name.clone();
        let from = self.last_owner(&name);
        #[cfg(test)]
        {
            let stall = self.stall.lock().get(&name).copied();
            if let Some(d) = stall {
                tokio::time::sleep(d).await;
            }
        }
        // What the last owner recorded of the members: one that it failed
        // (or that is older than its record) is not trusted (`degraded.rs`).
        let recorded = match current {
            Some(r) => Ok(r.state.clone()),
            None => s.state(&name).await,
        };
        let t_state = t0.elapsed();
        let req = AssembleVolume {
            // By the peer:drive names the volume was made with, as its creator shows them.
            drives: self.member_names(&sv.spec),
            takeover: true,
            export: None,
            force: false,
            only: Some(sv.spec.name.clone()),
        };
        // A pool's extents first: the pool opens with them.
        let mut strays = Vec::new();
        let extents_up = match (&recorded, sv.spec.extents.is_empty()) {
            (Ok(_), false) => self.assemble_extents(s, &sv.spec, epoch).await,
            _ => Vec::new(),
        };
        let res = match &recorded {
            Ok(rec) => {
                let degraded = Degraded {
                    wait: self.node.cluster().remote.takeover_wait,
                    recorded: rec.as_ref().map(|r| Recorded {
                        generation: r.generation,
                        members: r.members.clone(),
                    }),
                };
                self.node.assemble_volume_with(req, Some(degraded)).await
            }
            Err(e) => Err(crate::node::NodeError::Unavailable(format!(
                "reading its member-state record in etcd: {e}"
            ))),
        };
        let res = match res {
            Ok(info) if info.name == name => match self.node.pool_waiting(&name).await {
                None => {
                    strays = self.drop_stray_extents(&sv.spec, &extents_up).await;
                    Ok(info)
                }
                Some(why) => {
                    self.node
                        .drop_fenced(&name, "its pool waits for extents")
                        .await;
                    Err(format!("its thin pool cannot open: {why}"))
                }
            },
            Ok(info) => {
                self.node
                    .drop_fenced(&info.name, "not the volume etcd names")
                    .await;
                Err(format!(
                    "the drives hold volume {:?}, not {name:?}",
                    info.name
                ))
            }
            Err(e) => Err(e.to_string()),
        };
        let t_assembled = t0.elapsed();
        // Its first record before it takes any I/O.
        let res = match res {
            Ok(info) => match self.node.volume_device(&name).await {
                Some(dev) => match self.start_recording(&name, epoch).await {
                    Ok(serving) => Ok((info, dev, serving)),
                    Err(e) => {
                        self.node.drop_fenced(&name, &e).await;
                        Err(e)
                    }
                },
                None => Err("assembled, then gone".to_string()),
            },
            Err(e) => Err(e),
        };
        let (info, dev, serving) = match res {
            Ok(r) => r,
            Err(why) => {
                // extents assembled for a pool that could not be run
                for x in &extents_up {
                    self.node.drop_fenced(x, "its pool's takeover failed").await;
                }
                self.takeover_failed(s, &name, epoch, &why, recorded.ok().flatten())
                    .await;
                return;
            }
        };
        steps.assembled = Instant::now();
        tracing::debug!(
            "volume {name}: takeover steps: member-state record read {:?}, assembly {:?}, \
             first state record {:?}",
            t_state,
            t_assembled - t_state,
            t0.elapsed() - t_assembled
        );
        sv.switch.activate(dev);
        sv.epoch = Some(epoch);
        // A pool's thin volumes are served with it, in its ANA group: one
        // step for all of them.
        let ready = !sv.spec.thin_pool
            || match self.sync_thins(s, sv, true).await {
                Ok(ready) => ready,
                Err(e) => {
                    tracing::error!(
                        "pool {name}: reading its thin volumes: {e}; serving the ones known"
                    );
                    self.activate_thins(sv, true).await
                }
            };
        let mut owned = OwnedGroup::new(sv.spec.ana_group, sv.switches());
        steps.serving = Instant::now();
        let report = TakeoverReport {
            epoch,
            from,
            steps,
            handoff_seen,
            // Only this owner writes a handoff now; a held pool may have
            // written one by its release, so that one reads it again.
            handoff_now: current.filter(|_| ready).map(|r| r.handoff.clone()),
        };
        let report = if ready {
            self.target
                .set_ana_state(sv.spec.ana_group, AnaState::Optimized);
            Some(report)
        } else {
            tracing::warn!(
                "pool {name}: owned here at epoch {epoch}; its ANA group stays inaccessible \
                 until its thin volumes' host reservations are read"
            );
            self.node
                .events
                .emit(observe::pool_held(&name, epoch, HELD_RETRY));
            self.kick_after(&name, HELD_RETRY);
            owned.held = Some(Held {
                serving: serving.clone(),
                since: Instant::now(),
                report,
            });
            None
        };
        self.owned.lock().insert(name.clone(), owned);
        tracing::info!(
            "volume {name}: owned here at epoch {epoch}, generation {} (takeover {} ms)",
            info.generation,
            t0.elapsed().as_millis()
        );
        // A held pool tells this when it is released (`release_held`).
        if let Some(report) = report {
            self.report_served(s, &name, &serving, report).await;
        }
        self.forget_stray_extents(s, sv, epoch, &strays).await;
    }

    /// Tells that `name` is served here since `report.steps.serving`: as the
    /// end of a planned move if the handoff that brought it is still
    /// current (and clears that handoff), else as a takeover.
    ///
    /// Only where a move may wait for it (`cluster_ops.rs`) is a record
    /// written now to say the volume is served; after a takeover nobody
    /// waits for it, and `serving` is in the volume's next record anyway:
    /// one etcd write less per volume when a node's many volumes are taken
    /// over at once.
    async fn report_served(
        self: &Arc<Self>,
        s: &Session,
        name: &str,
        serving: &AtomicBool,
        report: TakeoverReport,
    ) {
        let TakeoverReport {
            epoch,
            from,
            steps,
            handoff_seen,
            handoff_now,
        } = report;
        let current = match handoff_now {
            Some(h) => Ok(h),
            None => s.handoff(name).await,
        };
        // Written at once wherever a move may wait for it: a handoff to
        // here, one to another node (a second move asked for while a pool
        // was held here: the first one's mover still waits), or no answer.
        if !matches!(current, Ok(None)) {
            self.record_serving(name, serving).await;
        } else {
            serving.store(true, Ordering::SeqCst);
        }
        let current = current.ok().flatten();
        let planned = current.as_ref().is_some_and(|h| h.to == s.node());
        let move_from = match handoff_seen {
            Some((h, at)) if current.as_ref() == Some(&h) => at.min(steps.first_seen),
            _ => steps.first_seen,
        };
        if let Some(h) = current.as_ref().filter(|_| planned) {
            if let Err(e) = s.clear_handoff(name, h).await {
                // Served all the same: a handoff left over is ignored once
                // stale (decide.rs), and the next move overwrites it.
                tracing::warn!("volume {name}: served, but its handoff was not cleared: {e}");
            }
            let took = steps.serving.saturating_duration_since(move_from);
            self.obs.moves.record(took);
            let e = observe::moved(name, epoch, from.as_deref(), took, &steps);
            self.node.events.emit(e);
        } else {
            self.obs.takeovers.record(steps.total());
            let e = observe::took_over(name, epoch, from.as_deref(), &steps);
            self.node.events.emit(e);
        }
        self.memory_of(name, |m| m.handoff_seen = None);
    }

    /// A claimed volume could not be run here: says why (log, event, and
    /// the note of its record, which `cluster status` shows), gives it
    /// back, and tries again after a back-off (enough members may answer
    /// by then).
    async fn takeover_failed(
        self: &Arc<Self>,
        s: &Session,
        name: &str,
        epoch: u64,
        why: &str,
        recorded: Option<VolumeState>,
    ) {
        tracing::error!("volume {name}: cannot take it over at epoch {epoch}: {why}");
        self.memory_of(name, |m| m.cooldown_until = Some(Instant::now() + COOLDOWN));
        // this volume alone retries, when its back-off is over
        self.kick_after(name, COOLDOWN);
        self.node
            .events
            .emit(observe::takeover_failed(name, epoch, why, COOLDOWN));
        if let Some(mut st) = recorded {
            // the record's members and generation stay as they are
            st.epoch = epoch;
            // at this epoch it is not served: a move waiting for the flag
            // must not read the last owner's
            st.serving = false;
            st.note = format!("not served: {} could not run it: {why}", s.node());
            if let Err(e) = s.put_state(name, &st).await {
                tracing::warn!("volume {name}: noting why it is not served: {e}");
            }
        }
        if let Err(e) = s.release(name, epoch).await {
            tracing::warn!("volume {name}: releasing after a failed takeover: {e}");
        }
    }

    /// Lets go of a volume without writing: group Inaccessible first (the
    /// host stops sending), then the switch, then the volume itself.
    pub(super) async fn step_down(&self, sv: &mut Served, why: &str) {
        let name = sv.spec.name.clone();
        self.target
            .set_ana_state(sv.spec.ana_group, AnaState::Inaccessible);
        for sw in sv.switches() {
            sw.deactivate();
        }
        self.owned.lock().remove(&name);
        self.node.drop_fenced(&name, why).await;
        self.drop_unlisted_extents(sv, why).await;
        sv.epoch = None;
        self.node.events.emit(observe::stepped_down(&name, why));
    }

    /// Lets go of pool `sv`'s recorded extents that still run here once the
    /// pool itself is let go: those its pool lists went with it; one it
    /// does not list yet (an expansion cut short) would stay open here,
    /// holding drives that the next owner frees.
    async fn drop_unlisted_extents(&self, sv: &Served, why: &str) {
        for x in &sv.spec.extents {
            self.node.drop_fenced(&x.name, why).await;
        }
    }

    /// The lease is lost: every volume run here steps down. etcd's view
    /// plays no part (it may be unreachable): [`decide::decide`] with
    /// [`decide::Lease::Lost`] plans step-downs only.
    pub(super) async fn step_down_all(self: &Arc<Self>, why: &str) {
        let mut served = self.served.lock().await;
        let local = decide::LocalView {
            me: self.name().to_string(),
            lease: decide::Lease::Lost(why.to_string()),
            volumes: served
                .iter()
                .map(|(n, sv)| (n.clone(), self.local_volume(n, Some(sv), None)))
                .collect(),
        };
        let s = self.session();
        let plans = decide::decide(&decide::ClusterView::default(), &local, Instant::now());
        for plan in plans {
            let Some(sv) = served.remove(&plan.volume) else {
                continue;
            };
            let spec = sv.spec.clone();
            let mut slot = Some(sv);
            // only step-downs: no etcd call, no error
            let r = self.act(&s, &spec, &mut slot, plan, None).await;
            if let Some(sv) = slot {
                served.insert(spec.name.clone(), sv);
            }
            if let Err(e) = r {
                tracing::warn!("volume {}: stepping down: {e}", spec.name);
            }
        }
    }

    /// A planned move: the group goes to Change (the host holds its I/O),
    /// commands in flight finish, the volume is closed clean and its
    /// reservations released, then ownership; `to` claims it at once.
    async fn hand_off(&self, s: &Session, sv: &mut Served, epoch: u64, to: &str) {
        let t0 = Instant::now();
        let name = sv.spec.name.clone();
        let g = sv.spec.ana_group;
        self.target.set_ana_state(g, AnaState::Change);
        let switches = sv.switches();
        for sw in &switches {
            sw.deactivate();
        }
        let mut drained = true;
        for sw in &switches {
            drained &= sw.drain(Duration::from_secs(5)).await;
        }
        self.owned.lock().remove(&name);
        let mut clean = drained;
        if !drained {
            self.node
                .drop_fenced(&name, "commands still running after 5 s of a planned move")
                .await;
        } else if let Err(e) = self.node.hand_over(&name).await {
            tracing::error!("volume {name}: clean handover failed ({e}); letting go fenced");
            self.node.drop_fenced(&name, "clean handover failed").await;
            clean = false;
        }
        self.drop_unlisted_extents(sv, "not an extent of its pool, which moved")
            .await;
        sv.epoch = None;
        if let Err(e) = s.release(&name, epoch).await {
            tracing::warn!("volume {name}: releasing ownership: {e}");
        }
        self.target.set_ana_state(g, AnaState::Inaccessible);
        let e = observe::handed_off(&name, to, epoch, clean, t0.elapsed());
        self.node.events.emit(e);
    }
}

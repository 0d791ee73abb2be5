//! The cluster's management calls: status, create and delete of cluster
//! volumes, planned moves, drains, and the reachability probe a move asks
//! of its target node first. Each call validates everything before it
//! changes anything: a refused call changes nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::{ClusterError, Handoff, Session, VolumeSpec, VolumeState};
use nvmf_target::AnaState;

use super::etcd;
use super::{Agent, OwnedGroup, Served};
use crate::api_types::{
    ClusterStatus, DrainResult, ExtentStatus, MoveResult, NodeStatus, QosRequest, VolumeStatus,
};
use crate::client::{PeerApi, PeerError};
use crate::node::{CreateVolume, NodeError, NodeResult, VolumeInfo};

/// Volumes whose deletes fail at the etcd step, as if etcd were cut off
/// just then (`delete_tests.rs`).
#[cfg(test)]
pub(super) static FAIL_ETCD_DELETE: parking_lot::Mutex<Vec<String>> =
    parking_lot::Mutex::new(Vec::new());

/// The error of a delete whose drives are wiped but whose cluster record
/// could not be removed: the record stays, marked deleting.
fn not_finished(name: &str, e: ClusterError) -> NodeError {
    NodeError::Unavailable(format!(
        "cluster volume {name}: deleted on this node, but its cluster record could not be \
         removed ({e}); it stays marked deleting, served by no node. Run the delete again \
         (on any node) to finish it"
    ))
}

/// A volume's state in one word from the member states its owner recorded.
fn state_word(st: &VolumeState) -> &'static str {
    if st.members.iter().all(|m| m == "active") {
        "optimal"
    } else if st
        .members
        .iter()
        .any(|m| m == "rebuilding" || m == "resyncing")
    {
        "rebuilding"
    } else {
        "degraded"
    }
}

impl Agent {
    /// Fills in how a cluster volume is exported: the agent serves it
    /// through its switch device, not through the node's own export.
    pub async fn annotate(&self, v: &mut VolumeInfo) {
        if v.export.is_some() {
            return;
        }
        let served = self.served.lock().await;
        if let Some(sv) = served.get(&v.name) {
            v.export = (!sv.spec.thin_pool).then(|| crate::node::Export {
                nqn: sv.spec.nqn.clone(),
                nsid: sv.spec.nsid,
                from_config: false,
            });
        } else if let Some((sv, t)) = v
            .pool
            .as_ref()
            .and_then(|p| served.get(p))
            .and_then(|sv| Some((sv, sv.thins.get(&v.name)?)))
            .filter(|(_, t)| t.spec.nsid != 0)
        {
            v.export = Some(crate::node::Export {
                nqn: sv.spec.nqn.clone(),
                nsid: t.spec.nsid,
                from_config: false,
            });
        }
    }

    pub async fn status(&self) -> NodeResult<ClusterStatus> {
        let s = self.session();
        let nodes = s.nodes().await.map_err(etcd)?;
        let draining = s.draining().await.map_err(etcd)?;
        let mut ns = Vec::new();
        for n in nodes {
            ns.push(NodeStatus {
                ttl_left_s: s.lease_ttl_left(n.lease).await.ok().flatten(),
                draining: draining.contains(&n.name),
                portals: n
                    .portals
                    .iter()
                    .map(|p| format!("{}:{}", p.traddr, p.trsvcid))
                    .collect(),
                name: n.name,
                slot: n.slot,
                lease: format!("{:#x}", n.lease),
                api: n.api,
            });
        }
        let mut vs = Vec::new();
        // One range read for every volume's keys (not three reads each).
        for rec in s.volumes().await.map_err(etcd)? {
            let cluster::VolumeRecord {
                spec,
                owner,
                state: st,
                handoff,
            } = rec;
            let state = match (&owner, &st) {
                _ if spec.deleting => "deleting".to_string(),
                (None, _) => "unowned".to_string(),
                (Some(_), Some(st)) => state_word(st).to_string(),
                (Some(_), None) => "unknown".to_string(),
            };
            vs.push(VolumeStatus {
                owner: owner.as_ref().map(|o| o.node.clone()),
                epoch: owner.as_ref().map(|o| o.epoch),
                generation: st.as_ref().map(|s| s.generation),
                state,
                handoff: handoff.map(|h| h.to),
                nqn: spec.nqn,
                nsid: spec.nsid,
                ana_group: spec.ana_group,
                drives: spec.drives,
                joining: spec.joining,
                name: spec.name,
                note: st.map(|s| s.note).filter(|n| !n.is_empty()),
                extents: spec
                    .extents
                    .into_iter()
                    .map(|x| ExtentStatus {
                        name: x.name,
                        layout: x.layout,
                        drives: x.drives,
                        joining: x.joining,
                    })
                    .collect(),
            });
        }
        Ok(ClusterStatus {
            cluster: self.m.name.clone(),
            node: self.name().to_string(),
            nodes: ns,
            volumes: vs,
        })
    }

    /// `POST /v1/volumes` in cluster mode: a volume on remote drives, owned
    /// by this node and served by every node.
    pub async fn create(self: &Arc<Self>, req: CreateVolume) -> NodeResult<VolumeInfo> {
        self.create_qos(req, None).await
    }

    /// [`Agent::create`] under QoS limits (`qos` of `POST /v1/volumes`),
    /// recorded with the volume in one etcd transaction.
    pub async fn create_qos(
        self: &Arc<Self>,
        mut req: CreateVolume,
        qos: Option<QosRequest>,
    ) -> NodeResult<VolumeInfo> {
        let limits = super::qos::create_limits(qos.as_ref())?;
        if req.pool.is_some() {
            return self.create_thin(req, qos).await;
        }
        if req.thin_pool && limits.is_some() {
            return Err(NodeError::BadRequest(
                "a cluster pool is not served itself: give QoS limits to its thin volumes".into(),
            ));
        }
        let Some(x) = req.export.take() else {
            return Err(NodeError::BadRequest(if req.thin_pool {
                "a cluster pool's thin volumes are served by every node: give it --export NQN \
                 (their subsystem)"
                    .into()
            } else {
                "a cluster volume is served by every node: give it --export NQN --nsid N".into()
            }));
        };
        if !req.thin_pool && x.nsid == 0 {
            return Err(NodeError::BadRequest(
                "a cluster volume is served by every node: give it --export NQN --nsid N".into(),
            ));
        }
        if req.thin_pool && x.nsid != 0 {
            return Err(NodeError::BadRequest(format!(
                "a cluster pool is not a namespace itself (its thin volumes are): give --export \
                 {} without --nsid",
                x.nqn
            )));
        }
        crate::node::check_name("volume", &req.name)?;
        let mut urls = Vec::new();
        for d in &req.drives {
            urls.push(self.node.cluster().resolve(d).map_err(|e| {
                NodeError::BadRequest(format!("{e} (cluster volumes use remote drives only)"))
            })?);
        }
        let s = self.session();
        if s.spec(&req.name).await.map_err(etcd)?.is_some() {
            return Err(NodeError::Conflict(format!(
                "cluster volume {} exists already",
                req.name
            )));
        }
        if !req.thin_pool && s.thin_nsids(&x.nqn).await.map_err(etcd)?.contains(&x.nsid) {
            return Err(NodeError::Conflict(format!(
                "nsid {} of {} serves a thin volume already; pick another nsid",
                x.nsid, x.nqn
            )));
        }
        if s.pool_of(&req.name).await.map_err(etcd)?.is_some() {
            return Err(NodeError::Conflict(format!(
                "a thin volume is called {} already",
                req.name
            )));
        }
        // Taken until its spec is recorded: another create, grow or replace
        // cannot pass the check below on them meanwhile (`cluster/src/drives.rs`).
        let taken = super::TakenDrives::take(&s, &urls, &req.name).await?;
        let r = async {
            let specs = s.specs().await.map_err(etcd)?;
            super::drives_free(&specs, &urls)?;
            for spec in specs {
                if !req.thin_pool && spec.nqn == x.nqn && spec.nsid == x.nsid {
                    return Err(NodeError::Conflict(format!(
                        "nsid {} of {} serves cluster volume {} already; pick another nsid",
                        x.nsid, x.nqn, spec.name
                    )));
                }
            }
            if let Some(sub) = self.target.subsystem(&x.nqn)
                && !sub.cluster_wide()
            {
                return Err(NodeError::Conflict(format!(
                    "subsystem {} is this node's own ([[subsystem]] in its TOML); cluster volumes need a subsystem of their own",
                    x.nqn
                )));
            }
            let ana_group = s.free_ana_group().await.map_err(etcd)?;
            let Some(owner) = s.claim_new(&req.name).await.map_err(etcd)? else {
                return Err(NodeError::Conflict(format!(
                    "cluster volume {} is being made by another node",
                    req.name
                )));
            };
            let name = req.name.clone();
            let req_thin_pool = req.thin_pool;
            let info = match self.node.create_volume(req).await {
                Ok(i) => i,
                Err(e) => {
                    let _ = s.release(&name, owner.epoch).await;
                    return Err(e);
                }
            };
            let spec = VolumeSpec {
                name: name.clone(),
                uuid: info.uuid.clone(),
                nqn: x.nqn.clone(),
                nsid: x.nsid,
                ana_group,
                size_bytes: info.size_bytes,
                block_size: info.block_size,
                drives: urls,
                joining: Vec::new(),
                layout: info.layout.clone(),
                hosts: Vec::new(),
                serial: serial_of(&info.uuid),
                model: "flashpool cluster volume".into(),
                thin_pool: req_thin_pool,
                extents: Vec::new(),
                deleting: false,
            };
            // Served here before etcd tells the others, owned before it is seen,
            // and limited from its first command.
            if let Some(l) = limits {
                self.qos_learnt(&name, l);
            }
            let mut served = self.served.lock().await;
            let undo = async |why: String| {
                self.node.drop_fenced(&name, &why).await;
                let _ = s.release(&name, owner.epoch).await;
                NodeError::Internal(why)
            };
            let sw = match self.serve_standby(&spec) {
                Ok(sw) => sw,
                Err(e) => return Err(undo(format!("serving {name}: {e}")).await),
            };
            let qos_spec = limits.as_ref().map(super::qos::spec_of);
            if let Err(e) = s.create_spec_qos(&spec, qos_spec.as_ref()).await {
                self.unserve(&spec);
                return Err(undo(format!("recording {name} in etcd: {e}")).await);
            }
            if let Some(l) = limits {
                // learnt again once recorded: a pass that read etcd before
                // does not take them away (`qos.rs`)
                self.qos_learnt(&name, l);
            }
            // Its member states recorded before it takes any I/O (`record.rs`).
            // A refused create leaves nothing: not served, not recorded, not owned.
            let recorded = match self.node.volume_device(&name).await {
                Some(dev) => self
                    .start_recording(&name, owner.epoch)
                    .await
                    .map(|serving| (dev, serving)),
                None => Err(format!("volume {name} vanished after its assembly")),
            };
            let (dev, serving) = match recorded {
                Ok(r) => r,
                Err(e) => {
                    self.unserve(&spec);
                    let _ = s.delete_volume(&name, owner.epoch).await;
                    return Err(undo(e).await);
                }
            };
            sw.activate(dev);
            self.owned
                .lock()
                .insert(name.clone(), OwnedGroup::new(ana_group, vec![sw.clone()]));
            served.insert(name.clone(), Served::new(spec, sw, Some(owner.epoch)));
            self.target.set_ana_state(ana_group, AnaState::Optimized);
            self.record_serving(&name, &serving).await;
            tracing::info!(
                "cluster volume {name}: created, owned here at epoch {}, nsid {} of {} (ANA group {ana_group})",
                owner.epoch,
                x.nsid,
                x.nqn
            );
            drop(served);
            if let Some(l) = limits {
                self.tell_qos(&name, &Default::default(), &l);
            }
            // The agent serves it, not the node: the answer says where.
            let mut v = self.node.volume(&name).await?;
            v.export = (!req_thin_pool).then_some(crate::node::Export {
                nqn: x.nqn,
                nsid: x.nsid,
                from_config: false,
            });
            Ok(v)
        }
        .await;
        taken.release().await;
        r
    }

    /// `DELETE /v1/volumes/{name}` of a cluster volume, on its owner.
    /// Like any volume on drives it holds data: without `force` the delete
    /// is refused before anything changes.
    pub async fn delete(&self, name: &str, force: bool) -> NodeResult<Option<()>> {
        let s = self.session();
        let Some(spec) = s.spec(name).await.map_err(etcd)? else {
            return self.delete_thin(name, force).await;
        };
        if spec.deleting {
            return self.finish_delete(&spec).await;
        }
        if spec.thin_pool {
            let thins = s.thin_specs(name).await.map_err(etcd)?;
            if !thins.is_empty() {
                return Err(NodeError::Conflict(format!(
                    "cluster pool {name} holds {} thin volume(s) ({}); delete them first. \
                     Nothing was changed",
                    thins.len(),
                    thins
                        .iter()
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        if !force {
            return Err(NodeError::Conflict(format!(
                "cluster volume {name} holds data (on drives {}); deleting it loses all of it. \
                 Nothing was changed; to delete it anyway use --force (API: {{\"force\": true}})",
                spec.drives.join(", ")
            )));
        }
        let mut served = self.served.lock().await;
        let Some(sv) = served.get_mut(name) else {
            return Err(NodeError::Conflict(format!(
                "cluster volume {name} is not served here yet; retry"
            )));
        };
        let Some(epoch) = sv.epoch else {
            let owner = s.owner(name).await.map_err(etcd)?;
            return Err(NodeError::Conflict(format!(
                "cluster volume {name} is owned by {}; delete it through that node's API",
                owner
                    .map(|o| o.node)
                    .unwrap_or_else(|| "no node right now".into())
            )));
        };
        // refused before the hosts lose it: a refused delete changes nothing
        if let Some(why) = self.node.delete_waits(name).await {
            return Err(NodeError::Conflict(why));
        }
        self.target
            .set_ana_state(sv.spec.ana_group, AnaState::Inaccessible);
        let switch = sv.switch.clone();
        let switches = sv.switches();
        for sw in &switches {
            sw.deactivate();
        }
        // The drain (up to 5 s a switch) without the map: meanwhile the
        // tasks of the node's other volumes (a takeover) go on.
        drop(served);
        for sw in &switches {
            sw.drain(Duration::from_secs(5)).await;
        }
        let mut served = self.served.lock().await;
        let Some(sv) = served
            .get_mut(name)
            .filter(|sv| sv.epoch == Some(epoch) && Arc::ptr_eq(&sv.switch, &switch))
        else {
            return Err(NodeError::Conflict(format!(
                "cluster volume {name} changed while its delete waited for its I/O (this node \
                 stepped down or let it go); nothing was deleted, look again"
            )));
        };
        // Checked again: a rebuild may have come due during the drain. Then
        // marked in etcd: no node takes it over once its drives are wiped.
        let marked = match self.node.delete_waits(name).await {
            Some(why) => Err(NodeError::Conflict(why)),
            None => match s.spec(name).await {
                Ok(Some(now)) => s.mark_deleting(&now, epoch).await.map_err(etcd),
                Ok(None) => Err(NodeError::Conflict(format!(
                    "cluster volume {name} was deleted meanwhile (another request)"
                ))),
                Err(e) => Err(etcd(e)),
            },
        };
        let res = match marked {
            Ok(m) => self
                .node
                .delete_volume(name, true)
                .await
                .map_err(|e| (e, Some(m))),
            Err(e) => Err((e, None)),
        };
        if let Err((e, marked)) = res {
            // Refused before it changed anything: served again, as it was.
            // (No thin volumes: a pool that has any is refused above.)
            if let Some(m) = marked
                && let Err(err) = s.unmark_deleting(&m, epoch).await
            {
                tracing::error!(
                    "cluster volume {name}: its delete was refused ({e}), but its record \
                     stays marked deleting ({err}): a delete will finish it"
                );
                return Err(NodeError::Unavailable(format!(
                    "cluster volume {name}: the delete was refused ({e}), and its record could \
                     not be taken back from \"deleting\" ({err}): no node serves it now. Run \
                     the delete again (with --force) to finish it"
                )));
            }
            // Only while etcd still names this node at `epoch`: a mark
            // refused because ownership moved during the drain must not
            // advertise the volume here again (the next pass steps down).
            let still_mine = s
                .owner(name)
                .await
                .ok()
                .flatten()
                .is_some_and(|o| o.node == s.node() && o.epoch == epoch);
            if still_mine && let Some(dev) = self.node.volume_device(name).await {
                sv.switch.activate(dev);
                self.target
                    .set_ana_state(sv.spec.ana_group, AnaState::Optimized);
            }
            return Err(e);
        }
        self.owned.lock().remove(name);
        let sv = served.remove(name).expect("found");
        self.unserve_all(&sv);
        #[cfg(test)]
        if FAIL_ETCD_DELETE.lock().iter().any(|n| n == name) {
            let e = ClusterError::Etcd("refused by the test".into());
            return Err(not_finished(name, e));
        }
        s.delete_volume(name, epoch)
            .await
            .map_err(|e| not_finished(name, e))?;
        Ok(Some(()))
    }

    /// A delete of volume `marked`, marked deleting by an earlier delete
    /// whose etcd part failed (or whose owner died meanwhile): whatever is
    /// left of it here is deleted, then its cluster record. Refused while
    /// another live node owns it (that node may still be wiping its
    /// drives).
    async fn finish_delete(&self, marked: &VolumeSpec) -> NodeResult<Option<()>> {
        let name = &marked.name;
        let s = self.session();
        let mut served = self.served.lock().await;
        if let Some(o) = s.owner(name).await.map_err(etcd)?
            && o.node != s.node()
            && s.nodes()
                .await
                .map_err(etcd)?
                .iter()
                .any(|n| n.name == o.node)
        {
            return Err(NodeError::Conflict(format!(
                "cluster volume {name} is being deleted by node {}; retry the delete there",
                o.node
            )));
        }
        let ran_here = match self.node.delete_volume(name, true).await {
            Ok(()) => true,
            Err(NodeError::Missing { .. }) => false,
            Err(e) => return Err(e),
        };
        if let Some(sv) = served.remove(name) {
            self.owned.lock().remove(name);
            self.unserve_all(&sv);
        }
        // The wipe (seconds for a drive that does not answer) without the
        // map: the tasks of the node's other volumes go on meanwhile.
        drop(served);
        if !ran_here {
            // Its owner may have stopped before it wiped the drives: wiped
            // here (again, if it did), while the record still keeps every
            // other volume off them.
            self.wipe_marked(&s, marked).await?;
        }
        s.finish_delete(marked)
            .await
            .map_err(|e| not_finished(name, e))?;
        tracing::info!("cluster volume {name}: the delete begun earlier is finished");
        Ok(Some(()))
    }

    /// The wipe of a delete finished where the volume did not run: every
    /// drive its record names (members, joining, extents'), while the
    /// record still reads as `marked` (another node may have finished the
    /// delete meanwhile, and a new volume taken a drive), and only a drive
    /// whose superblock is the volume's or one of its extents', or none;
    /// with the drives taken in etcd meanwhile, as a create takes them.
    async fn wipe_marked(&self, s: &Session, marked: &VolumeSpec) -> NodeResult<()> {
        let name = &marked.name;
        let mut urls: Vec<String> = marked
            .drives
            .iter()
            .chain(&marked.joining)
            .cloned()
            .collect();
        for x in &marked.extents {
            urls.extend(x.drives.iter().chain(&x.joining).cloned());
        }
        // Taken, then the record read again: had another node finished the
        // delete meanwhile, a create could own a drive by now (it takes the
        // drive before its check, and its check would have met this record).
        let taken = super::TakenDrives::take(s, &urls, name).await?;
        let r = async {
            if s.spec(name).await.map_err(etcd)?.as_ref() != Some(marked) {
                return Err(NodeError::Conflict(format!(
                    "cluster volume {name} changed while its delete was being finished (another \
                     node finished it?); nothing was wiped here, look again"
                )));
            }
            let ours = |sb: &volume::superblock::Superblock| {
                let uuid = volume::superblock::uuid_string(&sb.uuid);
                (sb.name == *name && uuid == marked.uuid)
                    || marked.extents.iter().any(|x| x.name == sb.name)
            };
            let failed = self.node.wipe_remotes(&urls, ours).await;
            if failed.is_empty() {
                tracing::info!(
                    "cluster volume {name}: its drives ({}) wiped here, where it did not run",
                    urls.join(", ")
                );
                return Ok(());
            }
            let why: Vec<String> = failed.iter().map(|(u, e)| format!("{u}: {e}")).collect();
            tracing::warn!(
                "cluster volume {name}: its delete is finished, but {} of its drives were not \
                 wiped here ({}): one that did not answer may still hold its superblock, its data \
                 and its old owner's reservation",
                failed.len(),
                why.join("; ")
            );
            Ok(())
        }
        .await;
        taken.release().await;
        r
    }

    /// `POST /v1/volumes/{name}/move`: a planned move to node `to`.
    pub async fn move_volume(&self, name: &str, to: &str) -> NodeResult<MoveResult> {
        let s = self.session();
        let spec = s
            .spec(name)
            .await
            .map_err(etcd)?
            .ok_or_else(|| NodeError::NotFound(format!("no cluster volume {name}")))?;
        if spec.deleting {
            return Err(NodeError::Conflict(format!(
                "cluster volume {name} is being deleted; finish that with \
                 `flashpool volume delete {name} --force`"
            )));
        }
        let owner = s.owner(name).await.map_err(etcd)?.ok_or_else(|| {
            NodeError::Conflict(format!(
                "cluster volume {name} has no owner right now (a takeover is under way); retry"
            ))
        })?;
        if owner.node == to {
            return Err(NodeError::Conflict(format!(
                "node {to} owns {name} already"
            )));
        }
        let nodes = s.nodes().await.map_err(etcd)?;
        let Some(target) = nodes.iter().find(|n| n.name == to) else {
            return Err(NodeError::BadRequest(format!(
                "node {to} is not in the cluster (live nodes: {})",
                nodes
                    .iter()
                    .map(|n| n.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        if s.draining().await.map_err(etcd)?.iter().any(|d| d == to) {
            return Err(NodeError::Conflict(format!(
                "node {to} is draining; undrain it first (flashpool node undrain {to})"
            )));
        }
        self.ask_probe(target, &spec).await?;
        let t0 = Instant::now();
        s.set_handoff(
            name,
            &Handoff {
                to: to.to_string(),
                epoch: owner.epoch,
            },
        )
        .await
        .map_err(etcd)?;
        // Answered once `to` serves it (Optimized there: the new owner
        // records `serving` at its epoch only after that), not
        // when the old owner lets go; `took_ms` is what a host sees.
        let end = t0 + MOVE_WAIT;
        loop {
            let o = s.owner(name).await.map_err(etcd)?;
            if let Some(o) = &o
                && o.node == to
                && s.state(name)
                    .await
                    .map_err(etcd)?
                    .is_some_and(|st| st.epoch == o.epoch && st.serving)
            {
                return Ok(MoveResult {
                    volume: name.to_string(),
                    from: owner.node,
                    to: to.to_string(),
                    epoch: o.epoch,
                    took_ms: t0.elapsed().as_millis() as u64,
                });
            }
            if Instant::now() > end {
                let now = match o {
                    Some(o) if o.node == to => {
                        format!(
                            "{to} owns it at epoch {} but does not serve it yet",
                            o.epoch
                        )
                    }
                    Some(o) => format!("{} owns it at epoch {}", o.node, o.epoch),
                    None => "no node owns it".into(),
                };
                return Err(NodeError::Internal(format!(
                    "the move of {name} to {to} did not finish in {} s ({now}); \
                     see `flashpool cluster status` and both nodes' logs",
                    MOVE_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Asks node `n` whether it reaches every member of `spec`.
    async fn ask_probe(&self, n: &cluster::NodeRecord, spec: &VolumeSpec) -> NodeResult<()> {
        if n.name == self.name() {
            return probe(spec).await;
        }
        let Some(api) = n.api.clone() else {
            return Err(NodeError::Conflict(format!(
                "node {} has no management API to ask whether it reaches the members",
                n.name
            )));
        };
        let vol = spec.name.clone();
        let who = n.name.clone();
        let peer_api = self
            .peer_api
            .lock()
            .clone()
            .unwrap_or_else(|| Arc::new(PeerApi::anonymous()));
        tokio::task::spawn_blocking(move || match peer_api.probe(&api, &vol) {
            Ok(_) => Ok(()),
            Err(PeerError::Unreachable(e)) => Err(NodeError::Conflict(format!(
                "node {who} ({api}) does not answer: {e}"
            ))),
            Err(PeerError::Refused(why) | PeerError::Answered { why, .. }) => {
                Err(NodeError::Conflict(format!(
                    "node {who} cannot serve {vol}: {why}; nothing changed"
                )))
            }
        })
        .await
        .map_err(|e| NodeError::Internal(e.to_string()))?
    }

    /// `POST /v1/cluster/probe/{name}`: whether this node reaches every member.
    pub async fn probe(&self, name: &str) -> NodeResult<()> {
        let spec = self
            .session()
            .spec(name)
            .await
            .map_err(etcd)?
            .ok_or_else(|| NodeError::NotFound(format!("no cluster volume {name}")))?;
        probe(&spec).await
    }

    /// `POST /v1/nodes/{node}/drain` (or undrain): waits until it owns
    /// nothing and another node serves each volume it owned.
    pub async fn drain(&self, node: &str, on: bool) -> NodeResult<DrainResult> {
        let s = self.session();
        let nodes = s.nodes().await.map_err(etcd)?;
        if on && !nodes.iter().any(|n| n.name == node) {
            return Err(NodeError::NotFound(format!(
                "node {node} is not in the cluster"
            )));
        }
        if on && nodes.len() < 2 {
            return Err(NodeError::Conflict(format!(
                "node {node} is the only node; there is nowhere to move its volumes"
            )));
        }
        s.set_drain(node, on).await.map_err(etcd)?;
        if !on {
            return Ok(DrainResult {
                node: node.to_string(),
                draining: false,
                owns: owned_by(&s, node).await.map_err(etcd)?,
            });
        }
        // Answered once another node serves each volume the drained node
        // owned (its state recorded at the new owner's epoch, which comes
        // after Optimized there), not when the drained node lets go.
        let moving: Vec<String> = owned_by(&s, node).await.map_err(etcd)?;
        let end = Instant::now() + DRAIN_WAIT;
        loop {
            let vols = s.volumes().await.map_err(etcd)?;
            let left: Vec<String> = moving
                .iter()
                .filter(|v| {
                    vols.iter().find(|r| r.spec.name == **v).is_some_and(|r| {
                        !matches!((&r.owner, &r.state), (Some(o), Some(st))
                            if o.node != node && st.epoch == o.epoch)
                    })
                })
                .cloned()
                .collect();
            let owns: Vec<String> = vols
                .iter()
                .filter(|r| r.owner.as_ref().is_some_and(|o| o.node == node))
                .map(|r| r.spec.name.clone())
                .collect();
            if left.is_empty() && owns.is_empty() {
                return Ok(DrainResult {
                    node: node.to_string(),
                    draining: true,
                    owns,
                });
            }
            if Instant::now() > end {
                let what = left
                    .iter()
                    .map(|v| {
                        let r = vols.iter().find(|r| r.spec.name == *v);
                        match r.and_then(|r| r.owner.as_ref()) {
                            Some(o) if o.node == node => format!("{v} (still on {node})"),
                            Some(o) => format!("{v} (owned by {}, not served yet)", o.node),
                            None => format!("{v} (no owner)"),
                        }
                    })
                    .chain(
                        owns.iter()
                            .filter(|v| !left.contains(v))
                            .map(|v| format!("{v} (still on {node})")),
                    )
                    .collect::<Vec<_>>();
                return Err(NodeError::Conflict(format!(
                    "node {node} is draining, but after {} s these volumes are not served \
                     elsewhere yet: {}; see `flashpool cluster status`",
                    DRAIN_WAIT.as_secs(),
                    what.join(", ")
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// How long `volume move` waits for the new owner to serve the volume.
const MOVE_WAIT: Duration = Duration::from_secs(15);
/// How long `node drain` waits for every volume to be served elsewhere.
const DRAIN_WAIT: Duration = Duration::from_secs(30);

async fn owned_by(s: &Session, node: &str) -> Result<Vec<String>, ClusterError> {
    Ok(s.volumes()
        .await?
        .into_iter()
        // a volume being deleted moves nowhere: a delete finishes it
        .filter(|r| !r.spec.deleting && r.owner.as_ref().is_some_and(|o| o.node == node))
        .map(|r| r.spec.name)
        .collect())
}

/// Whether every member's node accepts a TCP connection from here (a
/// pool's extents' members too: the pool does not open without them).
async fn probe(spec: &VolumeSpec) -> NodeResult<()> {
    let extents = spec.extents.iter().flat_map(|x| &x.drives);
    for url in spec.drives.iter().chain(extents) {
        let addr = url
            .strip_prefix("tcp://")
            .and_then(|r| r.split('/').next())
            .unwrap_or(url);
        let c = tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr))
            .await;
        match c {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(NodeError::Conflict(format!(
                    "member {url} is unreachable: {e}"
                )));
            }
            Err(_) => {
                return Err(NodeError::Conflict(format!(
                    "member {url} is unreachable: no answer in 1 s"
                )));
            }
        }
    }
    Ok(())
}

/// A 20-character serial number from the volume's UUID, the same on every node.
pub(super) fn serial_of(uuid: &str) -> String {
    let hex: String = uuid.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    format!("FPC{}", &hex[..hex.len().min(17)]).to_uppercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(drives: Vec<String>) -> VolumeSpec {
        VolumeSpec {
            name: "v".into(),
            uuid: "00112233-4455-6677-8899-aabbccddeeff".into(),
            nqn: "nqn.x:y".into(),
            nsid: 1,
            ana_group: 1,
            size_bytes: 1 << 20,
            block_size: 4096,
            drives,
            joining: Vec::new(),
            layout: "raid1".into(),
            hosts: Vec::new(),
            serial: serial_of("00112233-4455-6677-8899-aabbccddeeff"),
            model: "m".into(),
            thin_pool: false,
            extents: Vec::new(),
            deleting: false,
        }
    }

    #[tokio::test]
    async fn probe_names_the_unreachable_member() {
        let open = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (a, b) = (open.local_addr().unwrap(), closed.local_addr().unwrap());
        drop(closed);
        let good = format!("tcp://{a}/nqn.x:d0?nsid=1");
        let bad = format!("tcp://{b}/nqn.x:d1?nsid=1");
        probe(&spec(vec![good.clone()])).await.unwrap();
        let e = probe(&spec(vec![good, bad.clone()])).await.unwrap_err();
        assert!(
            matches!(&e, NodeError::Conflict(m) if m.contains(&bad)),
            "{e}"
        );
    }

    #[test]
    fn serial_is_stable_and_short() {
        let s = serial_of("1ca673a0-4e20-4fab-9dc7-072456c184c6");
        assert_eq!(s, "FPC1CA673A04E204FAB9");
        assert!(s.len() <= 20);
    }

    #[test]
    fn state_word_from_member_states() {
        let st = |m: &[&str]| VolumeState {
            epoch: 1,
            generation: 1,
            members: m.iter().map(|s| s.to_string()).collect(),
            note: String::new(),
            serving: false,
        };
        assert_eq!(state_word(&st(&["active", "active"])), "optimal");
        assert_eq!(state_word(&st(&["active", "failed"])), "degraded");
        assert_eq!(state_word(&st(&["active", "resyncing"])), "rebuilding");
    }
}

//! Create and delete of cluster volumes. A create takes its drives in
//! etcd, checks and records the spec, and serves the volume here first; a
//! delete marks the record, stops serving, wipes, and removes the record,
//! and a node that did not run the volume can finish a delete cut short.
//! Each call validates everything before it changes anything: a refused
//! call changes nothing.

use std::sync::Arc;
use std::time::Duration;

use cluster::{ClusterError, Session, VolumeSpec};
use nvmf_target::AnaState;

use super::cluster_ops::serial_of;
use super::etcd;
use super::{Agent, OwnedGroup, Served};
use crate::api_types::QosRequest;
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

impl Agent {
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
        super::with_drives(&s, &urls.clone(), &req.name.clone(), async {
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
        })
        .await
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
        super::with_drives(s, &urls, name, async {
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
                "cluster volume {name}: finishing its delete, {} of its drives were not wiped \
                 here ({}): one that did not answer may still hold its superblock, its data and \
                 its old owner's reservation (the delete goes on; it is not retried)",
                failed.len(),
                why.join("; ")
            );
            Ok(())
        })
        .await
    }
}

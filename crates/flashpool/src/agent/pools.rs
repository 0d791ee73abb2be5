//! Cluster pools: a thin pool on a cluster volume (RAID/EC across
//! enclosures), carved into thin volumes that every node serves as
//! namespaces of the pool's subsystem.
//!
//! The pool is the unit of ownership: its owner runs the pool and every
//! thin volume in it, and a takeover or move carries them all in one step.
//! All of a pool's namespaces are in the pool's one ANA group: a host sees
//! one ANA change per pool, however many thin volumes it holds, and the
//! cluster never runs into the host's limit on ANA groups (ANAGRPMAX,
//! 128 here) before its limit on namespaces.
//!
//! The thin volumes' specs are in etcd (`volumes/<pool>/thin/<t>`), written
//! by the pool's owner at its epoch. A create makes the thin volume in the
//! pool first and records it after (a create cut short leaves a thin volume
//! no spec names: never served, logged); a delete removes the record first.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use cluster::{ClusterError, Session, ThinSpec, VolumeSpec};
use nvmf_target::qos::QosLimits;

use super::cluster_ops::serial_of;
use super::{Agent, Served, SwitchDevice};
use crate::api_types::{CreateVolume, QosRequest};
use crate::client::{PeerApi, PeerError};
use crate::node::{Export, NodeError, NodeResult, VolumeInfo};

/// One thin volume of a cluster pool as this node serves it.
pub(super) struct ThinServed {
    pub(super) spec: ThinSpec,
    pub(super) switch: Arc<SwitchDevice>,
}

/// How many times a create picks another free NSID when a concurrent
/// create took the one it picked.
const NSID_TRIES: usize = 8;

fn etcd(e: ClusterError) -> NodeError {
    match e {
        ClusterError::Deposed { .. } => NodeError::Conflict(format!(
            "{e}; the pool changed owner meanwhile, nothing was done; retry"
        )),
        ClusterError::VolumeExists(_) | ClusterError::NsidTaken { .. } => {
            NodeError::Conflict(e.to_string())
        }
        _ => NodeError::Internal(format!("cluster state (etcd): {e}")),
    }
}

impl Agent {
    /// The namespace of thin volume `t` of pool `pool`: standby (nothing
    /// behind its switch), in the pool's ANA group.
    fn serve_thin(&self, pool: &VolumeSpec, t: &ThinSpec) -> anyhow::Result<Arc<SwitchDevice>> {
        let geometry = blockdev::Geometry {
            block_size: t.block_size,
            num_blocks: t.size_bytes / u64::from(t.block_size.max(1)),
        };
        let sw = SwitchDevice::new(&t.name, geometry, self.clock.clone());
        let mut ns = crate::node::volume_namespace(t.nsid, sw.clone(), &t.uuid)
            .with_ana_group(pool.ana_group)?
            .with_qos(self.ns_qos(&t.name, &pool.nqn, t.nsid));
        ns.resv = sw.reservations();
        self.target
            .add_namespace(&pool.nqn, ns)
            .inspect_err(|_| self.qos_unserved(&t.name))?;
        tracing::info!(
            "thin volume {} of cluster pool {}: served as nsid {} of {}",
            t.name,
            pool.name,
            t.nsid,
            pool.nqn
        );
        Ok(sw)
    }

    pub(super) fn unserve_thin(&self, pool: &VolumeSpec, t: &ThinSpec) {
        let _ = self.target.remove_namespace(&pool.nqn, t.nsid);
        self.qos_unserved(&t.name);
        tracing::info!(
            "thin volume {} of cluster pool {}: no longer served here",
            t.name,
            pool.name
        );
    }

    /// Serves pool `sv`'s thin volumes as etcd lists them: new ones
    /// added (passing I/O on at once where the pool is owned here), deleted
    /// ones removed, grown ones served at their new size. One range read.
    /// `taken_over`: the pool was just assembled here, so the thin volumes
    /// it holds that no record names are told (at no other time: a create
    /// in flight makes the thin volume before it records it).
    pub(super) async fn sync_thins(
        &self,
        s: &Session,
        sv: &mut Served,
        taken_over: bool,
    ) -> Result<(), ClusterError> {
        let specs = s.thin_specs(&sv.spec.name).await?;
        let want: BTreeSet<&str> = specs.iter().map(|t| t.name.as_str()).collect();
        let gone: Vec<String> = sv
            .thins
            .keys()
            .filter(|n| !want.contains(n.as_str()))
            .cloned()
            .collect();
        for n in gone {
            if let Some(t) = sv.thins.remove(&n) {
                t.switch.deactivate();
                self.unserve_thin(&sv.spec, &t.spec);
            }
        }
        for t in specs {
            if let Some(ts) = sv.thins.get_mut(&t.name) {
                if t.size_bytes > ts.spec.size_bytes {
                    // grown by the pool's owner: served at the new size
                    ts.switch.grow_to(t.size_bytes);
                    ts.spec = t;
                    if let Err(e) = self.target.namespace_resized(&sv.spec.nqn, ts.spec.nsid) {
                        tracing::error!("thin volume {}: its namespace: {e}", ts.spec.name);
                    }
                }
                continue;
            }
            match self.serve_thin(&sv.spec, &t) {
                Ok(switch) => {
                    sv.thins
                        .insert(t.name.clone(), ThinServed { spec: t, switch });
                }
                Err(e) => tracing::error!(
                    "thin volume {} of cluster pool {}: cannot serve it here: {e}",
                    t.name,
                    sv.spec.name
                ),
            }
        }
        if sv.epoch.is_some() {
            self.activate_thins(sv, taken_over).await;
            if let Some(o) = self.owned.lock().get_mut(&sv.spec.name) {
                o.1 = sv.switches();
            }
        }
        Ok(())
    }

    /// On the pool's owner: every thin switch not yet active passes I/O
    /// to the thin volume the pool holds. One the pool does not hold is
    /// left standby (logged); with `orphans`, so are the pool's thin
    /// volumes that no record names.
    pub(super) async fn activate_thins(&self, sv: &Served, orphans: bool) {
        for t in sv.thins.values().filter(|t| !t.switch.is_active()) {
            match self.node.volume_device(&t.spec.name).await {
                Some(dev) => t.switch.activate(dev),
                None => tracing::error!(
                    "thin volume {} is recorded in cluster pool {} but the pool does not hold it; \
                     not served",
                    t.spec.name,
                    sv.spec.name
                ),
            }
        }
        if !orphans {
            return;
        }
        for v in self.node.volumes().await {
            if v.pool.as_deref() == Some(sv.spec.name.as_str()) && !sv.thins.contains_key(&v.name) {
                tracing::warn!(
                    "thin volume {} of cluster pool {} is not recorded in the cluster (a create \
                     or delete cut short); not served. Delete it with `flashpool volume delete {} \
                     --force` on this node",
                    v.name,
                    sv.spec.name,
                    v.name
                );
            }
        }
    }

    /// `POST /v1/volumes` with a pool: a thin volume of a cluster pool
    /// (made by the pool's owner; another node passes the request on), or
    /// of a pool of this node's own.
    pub(super) async fn create_thin(
        self: &Arc<Self>,
        req: CreateVolume,
        qos: Option<QosRequest>,
    ) -> NodeResult<VolumeInfo> {
        let pool = req.pool.clone().unwrap_or_default();
        let s = self.session();
        let Some(spec) = s.spec(&pool).await.map_err(etcd)? else {
            // not a cluster pool: this node's own
            return self.node.create_volume_qos(req, qos).await;
        };
        if !spec.thin_pool {
            return Err(NodeError::BadRequest(format!(
                "cluster volume {pool} is not a pool; make one with --thin-pool"
            )));
        }
        crate::node::check_name("volume", &req.name)?;
        if let Some(x) = &req.export
            && x.nqn != spec.nqn
        {
            return Err(NodeError::BadRequest(format!(
                "the thin volumes of cluster pool {pool} are served in its subsystem {}; \
                 leave out --export or give that NQN",
                spec.nqn
            )));
        }
        let owner = s.owner(&pool).await.map_err(etcd)?.ok_or_else(|| {
            NodeError::Conflict(format!(
                "cluster pool {pool} has no owner right now (a takeover is under way); retry"
            ))
        })?;
        if owner.node != s.node() {
            return self
                .on_owner(&s, &owner.node, move |p, api| {
                    p.create_volume_qos(api, &req, qos.as_ref())
                })
                .await;
        }
        let limits = super::qos::create_limits(qos.as_ref())?;
        self.create_thin_here(&s, &spec, owner.epoch, req, limits)
            .await
    }

    /// Makes thin volume `req` in pool `spec`, owned here at `epoch`.
    async fn create_thin_here(
        &self,
        s: &Session,
        spec: &VolumeSpec,
        epoch: u64,
        mut req: CreateVolume,
        limits: Option<QosLimits>,
    ) -> NodeResult<VolumeInfo> {
        let pool = spec.name.clone();
        let served_epoch = self.served.lock().await.get(&pool).and_then(|sv| sv.epoch);
        if served_epoch != Some(epoch) {
            return Err(NodeError::Conflict(format!(
                "cluster pool {pool} is not served here yet (owned at epoch {epoch}); retry"
            )));
        }
        // Refused before the pool changes: a name or NSID taken.
        if s.spec(&req.name).await.map_err(etcd)?.is_some()
            || s.pool_of(&req.name).await.map_err(etcd)?.is_some()
        {
            return Err(NodeError::Conflict(format!(
                "a cluster volume is called {} already",
                req.name
            )));
        }
        let want_nsid = req.export.take().map(|x| x.nsid).filter(|n| *n != 0);
        if let Some(n) = want_nsid
            && self.nsid_used(s, &spec.nqn, n).await?
        {
            return Err(NodeError::Conflict(format!(
                "nsid {n} of {} serves another cluster volume already; pick another or leave \
                 it out",
                spec.nqn
            )));
        }
        let name = req.name.clone();
        let info = self.node.create_volume(req).await?;
        let mut t = ThinSpec {
            name: name.clone(),
            pool: pool.clone(),
            uuid: info.uuid.clone(),
            nsid: 0,
            size_bytes: info.size_bytes,
            block_size: info.block_size,
            serial: serial_of(&info.uuid),
        };
        // Known before it is recorded: the pool's own pass may serve it
        // as soon as it is (learnt again after, see `qos.rs`).
        let qos = limits.as_ref().map(super::qos::spec_of);
        if let Some(l) = limits {
            self.qos_learnt(&name, l);
        }
        let mut recorded = Err(NodeError::Internal("no NSID tried".into()));
        for _ in 0..NSID_TRIES {
            t.nsid = match want_nsid {
                Some(n) => n,
                None => match self.free_nsid(s, &spec.nqn).await {
                    Ok(n) => n,
                    Err(e) => {
                        recorded = Err(e);
                        break;
                    }
                },
            };
            match s.create_thin_qos(&t, &spec.nqn, epoch, qos.as_ref()).await {
                Ok(()) => {
                    recorded = Ok(());
                    break;
                }
                Err(ClusterError::NsidTaken { .. }) if want_nsid.is_none() => continue,
                Err(e) => {
                    recorded = Err(etcd(e));
                    break;
                }
            }
        }
        if let Err(e) = recorded {
            // A refused request changes nothing: the new thin volume goes.
            if let Err(d) = self.node.delete_volume(&name, true).await {
                tracing::error!("thin volume {name}: undoing its create: {d}");
            }
            return Err(e);
        }
        // Served here at once (the pool's own pass would, a moment later),
        // limited from its first command.
        if let Some(l) = limits {
            self.qos_learnt(&name, l);
            self.tell_qos(&name, &Default::default(), &l);
        }
        {
            let mut served = self.served.lock().await;
            if let Some(sv) = served.get_mut(&pool)
                && !sv.thins.contains_key(&name)
            {
                match self.serve_thin(&sv.spec, &t) {
                    Ok(switch) => {
                        if let Some(dev) = self.node.volume_device(&name).await {
                            switch.activate(dev);
                        }
                        sv.thins.insert(
                            name.clone(),
                            ThinServed {
                                spec: t.clone(),
                                switch,
                            },
                        );
                        if let Some(o) = self.owned.lock().get_mut(&pool) {
                            o.1 = sv.switches();
                        }
                    }
                    Err(e) => tracing::error!("thin volume {name}: cannot serve it here: {e}"),
                }
            }
        }
        tracing::info!(
            "thin volume {name}: created in cluster pool {pool}, nsid {} of {}",
            t.nsid,
            spec.nqn
        );
        let mut v = self.node.volume(&name).await?;
        v.export = Some(Export {
            nqn: spec.nqn.clone(),
            nsid: t.nsid,
            from_config: false,
        });
        v.owner = Some(self.name().to_string());
        Ok(v)
    }

    /// `POST /v1/volumes/{name}/grow` of a thin volume of a cluster pool:
    /// grown by the pool's owner (another node passes it on), recorded,
    /// and served at the new size by every node. `None` when no cluster
    /// pool holds a thin volume of that name.
    pub async fn grow(&self, name: &str, size: &str) -> NodeResult<Option<VolumeInfo>> {
        let s = self.session();
        if s.spec(name).await.map_err(etcd)?.is_some() {
            return Err(NodeError::BadRequest(format!(
                "cluster volume {name} is not a thin volume: it takes its drives whole; make \
                 thin volumes in a cluster pool to grow them"
            )));
        }
        let Some(Located { spec, t, owner }) = locate(&s, name).await? else {
            return Ok(None);
        };
        let pool = spec.name.clone();
        if owner.node != s.node() {
            let (n, sz) = (name.to_string(), size.to_string());
            let v = self
                .on_owner(&s, &owner.node, move |p, api| p.grow_volume(api, &n, &sz))
                .await?;
            return Ok(Some(v));
        }
        let mut served = self.served.lock().await;
        let sv = owned_pool(&mut served, &pool, owner.epoch)?;
        // The pool first (durable), then the record: a record cut short is
        // redone by the same request (growing to the same size is nothing).
        let mut v = self.node.grow_volume(name, size).await?;
        let grown = ThinSpec {
            size_bytes: v.size_bytes,
            ..t.clone()
        };
        if grown.size_bytes > t.size_bytes {
            s.update_thin(&grown, owner.epoch).await.map_err(|e| {
                NodeError::Conflict(format!(
                    "thin volume {name} grew in pool {pool} but the cluster has not recorded \
                     it ({e}); run the same grow again"
                ))
            })?;
        }
        if let Some(ts) = sv.thins.get_mut(name)
            && grown.size_bytes > ts.spec.size_bytes
        {
            ts.switch.grow_to(grown.size_bytes);
            ts.spec = grown.clone();
            if let Err(e) = self.target.namespace_resized(&sv.spec.nqn, grown.nsid) {
                tracing::error!("thin volume {name}: its namespace: {e}");
            }
        }
        drop(served);
        tracing::info!(
            "thin volume {name} of cluster pool {pool}: {} bytes",
            grown.size_bytes
        );
        v.export = Some(Export {
            nqn: spec.nqn,
            nsid: t.nsid,
            from_config: false,
        });
        v.owner = Some(self.name().to_string());
        Ok(Some(v))
    }

    /// Whether `nsid` of `nqn` serves a cluster volume or a thin volume.
    async fn nsid_used(&self, s: &Session, nqn: &str, nsid: u32) -> NodeResult<bool> {
        Ok(self.used_nsids(s, nqn).await?.contains(&nsid))
    }

    async fn used_nsids(&self, s: &Session, nqn: &str) -> NodeResult<BTreeSet<u32>> {
        let mut used: BTreeSet<u32> = s.thin_nsids(nqn).await.map_err(etcd)?.into_iter().collect();
        used.extend(
            s.specs()
                .await
                .map_err(etcd)?
                .iter()
                .filter(|v| v.nqn == nqn && !v.thin_pool)
                .map(|v| v.nsid),
        );
        Ok(used)
    }

    /// The lowest NSID of `nqn` that nothing in the cluster serves.
    async fn free_nsid(&self, s: &Session, nqn: &str) -> NodeResult<u32> {
        let used = self.used_nsids(s, nqn).await?;
        (1..=MAX_NSID)
            .find(|n| !used.contains(n))
            .ok_or_else(|| NodeError::Conflict(format!("every nsid of {nqn} is in use")))
    }

    /// `DELETE /v1/volumes/{name}` of a thin volume of a cluster pool; `None`
    /// when no cluster pool holds one of that name.
    pub(super) async fn delete_thin(&self, name: &str, force: bool) -> NodeResult<Option<()>> {
        let s = self.session();
        let Some(Located { spec, t, owner }) = locate(&s, name).await? else {
            return Ok(None);
        };
        let pool = spec.name.clone();
        if owner.node != s.node() {
            let n = name.to_string();
            self.on_owner(&s, &owner.node, move |p, api| {
                p.delete_volume(api, &n, force)
            })
            .await?;
            return Ok(Some(()));
        }
        let mut served = self.served.lock().await;
        let sv = owned_pool(&mut served, &pool, owner.epoch)?;
        // Refused before anything changes: data would be lost.
        let v = self.node.volume(name).await?;
        if !force && v.allocated_bytes.unwrap_or(0) > 0 {
            return Err(NodeError::Conflict(format!(
                "thin volume {name} holds data ({} allocated in pool {pool}); deleting it \
                 loses all of it. Nothing was changed; to delete it anyway use --force \
                 (API: {{\"force\": true}})",
                crate::units::human_bytes(v.allocated_bytes.unwrap_or(0))
            )));
        }
        // The record first: a delete cut short leaves a thin volume that no
        // spec names (never served again), not a spec without its data.
        s.delete_thin(&t, &spec.nqn, owner.epoch)
            .await
            .map_err(etcd)?;
        if let Some(ts) = sv.thins.remove(name) {
            ts.switch.deactivate();
            ts.switch.drain(Duration::from_secs(5)).await;
            self.unserve_thin(&sv.spec, &ts.spec);
        }
        if let Some(o) = self.owned.lock().get_mut(&pool) {
            o.1 = sv.switches();
        }
        drop(served);
        self.node.delete_volume(name, true).await?;
        tracing::info!("thin volume {name}: deleted from cluster pool {pool}");
        Ok(Some(()))
    }

    /// Passes a call on to node `node` (the owner of a pool), through its
    /// management API.
    async fn on_owner<T: Send + 'static>(
        &self,
        s: &Session,
        node: &str,
        call: impl FnOnce(&PeerApi, &str) -> Result<T, PeerError> + Send + 'static,
    ) -> NodeResult<T> {
        let rec = s
            .nodes()
            .await
            .map_err(etcd)?
            .into_iter()
            .find(|n| n.name == node)
            .ok_or_else(|| {
                NodeError::Conflict(format!("node {node} owns the pool but is not live; retry"))
            })?;
        let Some(api) = rec.api else {
            return Err(NodeError::Conflict(format!(
                "node {node} owns the pool but has no management API; call it there"
            )));
        };
        let peer_api = self
            .peer_api
            .lock()
            .clone()
            .unwrap_or_else(|| Arc::new(PeerApi::anonymous()));
        let who = node.to_string();
        tokio::task::spawn_blocking(move || match call(&peer_api, &api) {
            Ok(v) => Ok(v),
            Err(PeerError::Unreachable(e)) => Err(NodeError::Unavailable(format!(
                "node {who} ({api}) owns the pool and does not answer: {e}"
            ))),
            Err(PeerError::Refused(why)) => Err(NodeError::Conflict(format!("{who}: {why}"))),
        })
        .await
        .map_err(|e| NodeError::Internal(e.to_string()))?
    }
}

/// A thin volume of a cluster pool as etcd records it: its pool's spec,
/// its own, and the pool's owner.
struct Located {
    spec: VolumeSpec,
    t: ThinSpec,
    owner: cluster::Owner,
}

/// Where thin volume `name` is: `None` when no cluster pool holds it;
/// refused while its pool has no owner.
async fn locate(s: &Session, name: &str) -> NodeResult<Option<Located>> {
    let Some(pool) = s.pool_of(name).await.map_err(etcd)? else {
        return Ok(None);
    };
    let spec = s.spec(&pool).await.map_err(etcd)?;
    let t = s
        .thin_specs(&pool)
        .await
        .map_err(etcd)?
        .into_iter()
        .find(|t| t.name == name);
    let (Some(spec), Some(t)) = (spec, t) else {
        return Ok(None);
    };
    let owner = s.owner(&pool).await.map_err(etcd)?.ok_or_else(|| {
        NodeError::Conflict(format!(
            "cluster pool {pool} has no owner right now (a takeover is under way); retry"
        ))
    })?;
    Ok(Some(Located { spec, t, owner }))
}

/// Pool `pool` as served here, owned at `epoch`.
fn owned_pool<'a>(
    served: &'a mut std::collections::BTreeMap<String, Served>,
    pool: &str,
    epoch: u64,
) -> NodeResult<&'a mut Served> {
    served
        .get_mut(pool)
        .filter(|sv| sv.epoch == Some(epoch))
        .ok_or_else(|| {
            NodeError::Conflict(format!("cluster pool {pool} is not served here yet; retry"))
        })
}

/// The highest NSID handed out to thin volumes (the target's).
const MAX_NSID: u32 = nvmf_target::subsystem::MAX_NSID;

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
//! Snapshots, clones and revert follow the same rules (`pool_snaps.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
#[cfg(test)]
use std::sync::atomic::Ordering;
use std::time::Duration;

use cluster::{ClusterError, Session, ThinSpec, VolumeSpec};
use nvmf_target::qos::QosLimits;

use super::cluster_ops::serial_of;
use super::thin_resv::ThinResvDevice;
use super::{Agent, Served, SwitchDevice, etcd};
use crate::api_types::{CreateVolume, QosRequest};
use crate::client::{PeerApi, PeerError};
use crate::node::{Export, NodeError, NodeResult, VolumeInfo};

/// One thin volume of a cluster pool as this node serves it.
pub(super) struct ThinServed {
    pub(super) spec: ThinSpec,
    pub(super) switch: Arc<SwitchDevice>,
}

/// The waits before the second and third tries of the read of a pool's
/// thin volumes' host reservations when a takeover serves them (after the
/// third, a later pass tries again).
const RESV_READ_RETRIES: [Duration; 2] = [Duration::from_millis(50), Duration::from_millis(150)];

/// How many times a create picks another free NSID when a concurrent
/// create took the one it picked.
pub(super) const NSID_TRIES: usize = 8;

/// Which NSID a thin volume being recorded is served as.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum NsidChoice {
    /// None: recorded, not served (a snapshot nobody asked to export).
    Unserved,
    /// The lowest free one.
    Free,
    Given(u32),
}

/// The error of a spec write (`update_spec`) of `what` (a volume or pool
/// name), `doing` what: nothing was changed either way.
pub(super) fn spec_error(e: ClusterError, what: &str, doing: &str) -> NodeError {
    match e {
        ClusterError::Deposed { .. } => NodeError::Conflict(format!(
            "{what}: its spec changed in etcd meanwhile, or this node no longer owns it; \
             nothing was changed, retry"
        )),
        e => NodeError::Unavailable(format!("{what}: {doing} in etcd: {e}; nothing was changed")),
    }
}

impl Agent {
    /// The namespace of thin volume `t` of pool `pool`: standby (nothing
    /// behind its switch), in the pool's ANA group; write-protected for a
    /// snapshot. A snapshot with no NSID gets its switch only (no namespace).
    fn serve_thin(&self, pool: &VolumeSpec, t: &ThinSpec) -> anyhow::Result<Arc<SwitchDevice>> {
        let geometry = blockdev::Geometry {
            block_size: t.block_size,
            num_blocks: t.size_bytes / u64::from(t.block_size.max(1)),
        };
        let sw = SwitchDevice::new(&t.name, geometry, self.clock.clone());
        if t.snapshot {
            sw.set_read_only();
        }
        self.add_thin_ns(pool, t, &sw)?;
        Ok(sw)
    }

    /// Serves switch `sw` of thin volume `t` as `t.nsid` of the pool's
    /// subsystem (nothing for NSID 0).
    pub(super) fn add_thin_ns(
        &self,
        pool: &VolumeSpec,
        t: &ThinSpec,
        sw: &Arc<SwitchDevice>,
    ) -> anyhow::Result<()> {
        if t.nsid == 0 {
            return Ok(());
        }
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
        Ok(())
    }

    /// Thin volume `old`, served through `sw`, is now served as `new.nsid`
    /// (exported or unexported by the pool's owner): its namespace moves.
    pub(super) fn reserve_thin(
        &self,
        pool: &VolumeSpec,
        old: &ThinSpec,
        new: &ThinSpec,
        sw: &Arc<SwitchDevice>,
    ) {
        self.unserve_thin(pool, old);
        if let Err(e) = self.add_thin_ns(pool, new, sw) {
            tracing::error!(
                "thin volume {} of cluster pool {}: cannot serve it here as nsid {}: {e}",
                new.name,
                pool.name,
                new.nsid
            );
        }
    }

    pub(super) fn unserve_thin(&self, pool: &VolumeSpec, t: &ThinSpec) {
        if t.nsid == 0 {
            return;
        }
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
    ///
    /// On the owner: false while some thin volume waits for its host
    /// reservations (see [`Agent::activate_thins`]).
    pub(super) async fn sync_thins(
        &self,
        s: &Session,
        sv: &mut Served,
        taken_over: bool,
    ) -> Result<bool, ClusterError> {
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
                if t.nsid != ts.spec.nsid {
                    // exported or unexported by the pool's owner
                    self.reserve_thin(&sv.spec, &ts.spec, &t, &ts.switch);
                }
                if t.size_bytes != ts.spec.size_bytes {
                    // grown or shrunk by the pool's owner: served at the new size
                    ts.switch.resize_to(t.size_bytes);
                    if t.nsid != 0
                        && let Err(e) = self.target.namespace_resized(&sv.spec.nqn, t.nsid)
                    {
                        tracing::error!("thin volume {}: its namespace: {e}", t.name);
                    }
                }
                ts.spec = t;
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
        let mut ready = true;
        if sv.epoch.is_some() {
            ready = self.activate_thins(sv, taken_over).await;
            if let Some(o) = self.owned.lock().get_mut(&sv.spec.name) {
                o.switches = sv.switches();
            }
        }
        Ok(ready)
    }

    /// On the pool's owner: every thin switch not yet active passes I/O
    /// to the thin volume the pool holds. One the pool does not hold is
    /// left standby (logged); with `orphans`, so are the pool's thin
    /// volumes that no record names.
    ///
    /// Each thin volume is served with its host reservations, which the
    /// pool's owner keeps in etcd (`thin_resv.rs`): all of the pool's are
    /// read in one range read first. If that read fails (a few tries), none
    /// is served: serving one without its reservations would let a host
    /// that holds none write. They stay standby, and false says so: the
    /// caller holds the pool's ANA group and the next pass tries again.
    pub(super) async fn activate_thins(&self, sv: &Served, orphans: bool) -> bool {
        let pending: Vec<&ThinServed> = sv
            .thins
            .values()
            .filter(|t| !t.switch.is_active())
            .collect();
        let (Some(epoch), false) = (sv.epoch, pending.is_empty()) else {
            self.log_orphans(sv, orphans).await;
            return true;
        };
        let s = self.session();
        let mut retries = RESV_READ_RETRIES.into_iter();
        let records = loop {
            match self.thin_resvs(&s, &sv.spec.name).await {
                Ok(r) => break Some(r),
                Err(e) => tracing::warn!(
                    "pool {}: reading its thin volumes' host reservations: {e}",
                    sv.spec.name
                ),
            }
            match retries.next() {
                Some(wait) => tokio::time::sleep(wait).await,
                None => break None,
            }
        };
        let Some(mut records) = records else {
            tracing::error!(
                "pool {}: its thin volumes' host reservations could not be read from etcd; \
                 they are not served until they are (hosts wait)",
                sv.spec.name
            );
            return false;
        };
        for t in pending {
            match self.node.volume_device(&t.spec.name).await {
                Some(dev) => {
                    let record = records.remove(&t.spec.name);
                    let dev = ThinResvDevice::wrap(
                        dev,
                        s.clone(),
                        &sv.spec.name,
                        &t.spec.name,
                        epoch,
                        record,
                    );
                    t.switch.activate(dev)
                }
                None => tracing::error!(
                    "thin volume {} is recorded in cluster pool {} but the pool does not hold it; \
                     not served",
                    t.spec.name,
                    sv.spec.name
                ),
            }
        }
        self.log_orphans(sv, orphans).await;
        true
    }

    /// One range read of pool `pool`'s thin volumes' host reservations.
    async fn thin_resvs(
        &self,
        s: &Session,
        pool: &str,
    ) -> Result<BTreeMap<String, Vec<u8>>, ClusterError> {
        #[cfg(test)]
        if self
            .fail_resv_reads
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(ClusterError::Etcd("test: the read failed".into()));
        }
        s.thin_resvs(pool).await
    }

    /// With `orphans`: logs the pool's thin volumes that no record names.
    async fn log_orphans(&self, sv: &Served, orphans: bool) {
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
        let want_nsid = req.export.take().map(|x| x.nsid).filter(|n| *n != 0);
        // Refused before the pool changes: a name or NSID taken.
        self.check_new(s, spec, epoch, &[(&req.name, want_nsid)])
            .await?;
        let name = req.name.clone();
        let info = self.node.create_volume(req).await?;
        let t = ThinSpec {
            name: name.clone(),
            pool: pool.clone(),
            uuid: info.uuid.clone(),
            nsid: 0,
            size_bytes: info.size_bytes,
            block_size: info.block_size,
            serial: serial_of(&info.uuid),
            snapshot: false,
            origin: None,
        };
        // Known before it is recorded: the pool's own pass may serve it
        // as soon as it is (learnt again after, see `qos.rs`).
        let qos = limits.as_ref().map(super::qos::spec_of);
        if let Some(l) = limits {
            self.qos_learnt(&name, l);
        }
        let choice = want_nsid.map_or(NsidChoice::Free, NsidChoice::Given);
        let t = match self
            .record_thin(s, spec, epoch, t, choice, qos.as_ref())
            .await
        {
            Ok(t) => t,
            Err(e) => {
                // A refused request changes nothing: the new thin volume goes.
                if let Err(d) = self.node.delete_volume(&name, true).await {
                    tracing::error!("thin volume {name}: undoing its create: {d}");
                }
                return Err(e);
            }
        };
        // Limited from its first command here.
        if let Some(l) = limits {
            self.qos_learnt(&name, l);
            self.tell_qos(&name, &Default::default(), &l);
        }
        self.serve_new_thin(&pool, &t).await;
        tracing::info!(
            "thin volume {name}: created in cluster pool {pool}, nsid {} of {}",
            t.nsid,
            spec.nqn
        );
        self.thin_info(spec, &t).await
    }

    /// Refuses, before the pool changes, new thin volumes (or snapshots)
    /// `new` of pool `spec` (name, NSID asked for) when the pool is not
    /// served here at `epoch` yet, a name is taken, or an NSID is.
    pub(super) async fn check_new(
        &self,
        s: &Session,
        spec: &VolumeSpec,
        epoch: u64,
        new: &[(&str, Option<u32>)],
    ) -> NodeResult<()> {
        let pool = &spec.name;
        let served_epoch = self.served.lock().await.get(pool).and_then(|sv| sv.epoch);
        if served_epoch != Some(epoch) {
            return Err(NodeError::Conflict(format!(
                "cluster pool {pool} is not served here yet (owned at epoch {epoch}); retry"
            )));
        }
        for (i, &(name, nsid)) in new.iter().enumerate() {
            if s.spec(name).await.map_err(etcd)?.is_some()
                || s.pool_of(name).await.map_err(etcd)?.is_some()
            {
                return Err(NodeError::Conflict(format!(
                    "a cluster volume is called {name} already"
                )));
            }
            let Some(n) = nsid else { continue };
            if new[..i].iter().any(|&(_, m)| m == Some(n)) {
                return Err(NodeError::BadRequest(format!(
                    "nsid {n} is asked for twice; give each its own or leave it out"
                )));
            }
            if self.nsid_used(s, &spec.nqn, n).await? {
                return Err(NodeError::Conflict(format!(
                    "nsid {n} of {} serves another cluster volume already; pick another or \
                     leave it out",
                    spec.nqn
                )));
            }
        }
        Ok(())
    }

    /// Records `t`, just made in pool `spec` owned here at `epoch`, with
    /// the NSID `choice` says (another free one when a concurrent create
    /// took the one picked). The caller undoes what the pool made when
    /// this is refused.
    pub(super) async fn record_thin(
        &self,
        s: &Session,
        spec: &VolumeSpec,
        epoch: u64,
        mut t: ThinSpec,
        choice: NsidChoice,
        qos: Option<&cluster::QosSpec>,
    ) -> NodeResult<ThinSpec> {
        for _ in 0..NSID_TRIES {
            t.nsid = match choice {
                NsidChoice::Unserved => 0,
                NsidChoice::Given(n) => n,
                NsidChoice::Free => self.free_nsid(s, &spec.nqn).await?,
            };
            match s.create_thin_qos(&t, &spec.nqn, epoch, qos).await {
                Ok(()) => return Ok(t),
                Err(ClusterError::NsidTaken { .. }) if choice == NsidChoice::Free => continue,
                Err(e) => return Err(etcd(e)),
            }
        }
        Err(NodeError::Conflict(format!(
            "the free nsids of {} were taken by other creates meanwhile; nothing was changed, \
             retry",
            spec.nqn
        )))
    }

    /// Serves thin volume `t` of pool `pool`, just recorded, here at once
    /// (the pool's own pass would, a moment later).
    pub(super) async fn serve_new_thin(&self, pool: &str, t: &ThinSpec) {
        let mut served = self.served.lock().await;
        let Some(sv) = served.get_mut(pool) else {
            return;
        };
        if sv.thins.contains_key(&t.name) {
            return;
        }
        match self.serve_thin(&sv.spec, t) {
            Ok(switch) => {
                if let (Some(epoch), Some(dev)) = (sv.epoch, self.node.volume_device(&t.name).await)
                {
                    // new: no reservations yet (its create cleared any record)
                    let s = self.session();
                    let dev = ThinResvDevice::wrap(dev, s, pool, &t.name, epoch, None);
                    switch.activate(dev);
                }
                sv.thins.insert(
                    t.name.clone(),
                    ThinServed {
                        spec: t.clone(),
                        switch,
                    },
                );
                if let Some(o) = self.owned.lock().get_mut(pool) {
                    o.switches = sv.switches();
                }
            }
            Err(e) => tracing::error!("thin volume {}: cannot serve it here: {e}", t.name),
        }
    }

    /// What the API answers of thin volume `t` of pool `spec`, owned here.
    pub(super) async fn thin_info(
        &self,
        spec: &VolumeSpec,
        t: &ThinSpec,
    ) -> NodeResult<VolumeInfo> {
        let mut v = self.node.volume(&t.name).await?;
        v.export = (t.nsid != 0).then(|| Export {
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
        self.resize(name, size, false).await
    }

    /// As [`Agent::grow`]; with `force` a smaller size shrinks the thin
    /// volume, as on a node running alone (refused when the end it cuts
    /// holds data, its own or a snapshot's, or for a snapshot).
    pub async fn resize(
        &self,
        name: &str,
        size: &str,
        force: bool,
    ) -> NodeResult<Option<VolumeInfo>> {
        let s = self.session();
        if let Some(v) = s.spec(name).await.map_err(etcd)? {
            return Err(not_thin(&v, force));
        }
        let Some(Located { spec, t, owner }) = locate(&s, name).await? else {
            return Ok(None);
        };
        let pool = spec.name.clone();
        if owner.node != s.node() {
            let (n, sz) = (name.to_string(), size.to_string());
            let v = self
                .on_owner(&s, &owner.node, move |p, api| {
                    p.grow_volume(api, &n, &sz, force)
                })
                .await?;
            return Ok(Some(v));
        }
        let mut served = self.served.lock().await;
        let sv = owned_pool(&mut served, &pool, owner.epoch)?;
        // The pool first (durable; it refuses a shrink that would cut
        // data), then the record: a record cut short is redone by the same
        // request (resizing to the size the pool has is nothing). Until
        // then the nodes serve the recorded size: after a shrink, I/O past
        // the new end fails on the owner.
        let mut v = self.node.resize_volume(name, size, force).await?;
        let resized = ThinSpec {
            size_bytes: v.size_bytes,
            ..t.clone()
        };
        if resized.size_bytes != t.size_bytes {
            s.update_thin(&resized, owner.epoch).await.map_err(|e| {
                NodeError::Conflict(format!(
                    "thin volume {name} was resized in pool {pool} but the cluster has not \
                     recorded it ({e}); run the same request again"
                ))
            })?;
        }
        if let Some(ts) = sv.thins.get_mut(name)
            && resized.size_bytes != ts.spec.size_bytes
        {
            ts.switch.resize_to(resized.size_bytes);
            ts.spec = resized.clone();
            if resized.nsid != 0
                && let Err(e) = self.target.namespace_resized(&sv.spec.nqn, resized.nsid)
            {
                tracing::error!("thin volume {name}: its namespace: {e}");
            }
        }
        drop(served);
        tracing::info!(
            "thin volume {name} of cluster pool {pool}: {} bytes",
            resized.size_bytes
        );
        v.export = (resized.nsid != 0).then_some(Export {
            nqn: spec.nqn,
            nsid: resized.nsid,
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
    pub(super) async fn free_nsid(&self, s: &Session, nqn: &str) -> NodeResult<u32> {
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
        // A clone's data may all be shared with its snapshot: still its data.
        let v = self.node.volume(name).await?;
        let held = v.allocated_bytes.unwrap_or(0) + v.shared_bytes.unwrap_or(0);
        if !force && held > 0 {
            return Err(NodeError::Conflict(format!(
                "thin volume {name} holds data ({} written, its own or shared with snapshots, \
                 in pool {pool}); deleting it loses all of it. Nothing was changed; to delete \
                 it anyway use --force (API: {{\"force\": true}})",
                crate::units::human_bytes(held)
            )));
        }
        // The record first: a delete cut short leaves a thin volume that no
        // spec names (never served again), not a spec without its data.
        s.delete_thin(&t, &spec.nqn, owner.epoch)
            .await
            .map_err(etcd)?;
        // Unserved under the map (its NSID, free in etcd now, may be given
        // to a new thin volume at once), drained without it: up to 5 s of
        // waiting for its I/O must not hold up the node's other volumes.
        let ts = sv.thins.remove(name);
        if let Some(ts) = &ts {
            ts.switch.deactivate();
            self.unserve_thin(&sv.spec, &ts.spec);
        }
        if let Some(o) = self.owned.lock().get_mut(&pool) {
            o.switches = sv.switches();
        }
        drop(served);
        if let Some(ts) = ts {
            ts.switch.drain(Duration::from_secs(5)).await;
        }
        // A create of the same name meanwhile is refused by the node (the
        // volume still exists there) until this delete is done.
        self.node.delete_volume(name, true).await?;
        tracing::info!("thin volume {name}: deleted from cluster pool {pool}");
        Ok(Some(()))
    }

    /// Passes a call on to node `node` (the owner of a pool), through its
    /// management API.
    pub(super) async fn on_owner<T: Send + 'static>(
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
            // The owner's refusal, answered as it answered it (a name
            // unknown there is 404 here too); any other as a conflict.
            Err(PeerError::Answered { status: 400, why }) => {
                Err(NodeError::BadRequest(format!("{who}: {why}")))
            }
            Err(PeerError::Answered { status: 404, why }) => {
                Err(NodeError::NotFound(format!("{who}: {why}")))
            }
            Err(PeerError::Refused(why) | PeerError::Answered { why, .. }) => {
                Err(NodeError::Conflict(format!("{who}: {why}")))
            }
        })
        .await
        .map_err(|e| NodeError::Internal(e.to_string()))?
    }
}

/// A thin volume of a cluster pool as etcd records it: its pool's spec,
/// its own, and the pool's owner.
pub(super) struct Located {
    pub(super) spec: VolumeSpec,
    pub(super) t: ThinSpec,
    pub(super) owner: cluster::Owner,
}

/// Where thin volume `name` is: `None` when no cluster pool holds it;
/// refused while its pool has no owner.
pub(super) async fn locate(s: &Session, name: &str) -> NodeResult<Option<Located>> {
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
pub(super) fn owned_pool<'a>(
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

/// Why cluster volume `v` (on drives, or a pool) is not resized here.
fn not_thin(v: &VolumeSpec, shrink: bool) -> NodeError {
    let name = &v.name;
    NodeError::BadRequest(if v.thin_pool {
        format!(
            "cluster volume {name} is a pool: its thin volumes grow and shrink, not the pool; \
             nothing was changed"
        )
    } else if shrink {
        format!(
            "cluster volume {name} is not a thin volume: it takes its drives whole and its \
             layout ({}) stripes a host's data over all of it, so no end of it is known to be \
             free to give back; shrinking it is refused and nothing was changed. Make thin \
             volumes in a cluster pool to shrink them",
            v.layout
        )
    } else {
        format!(
            "cluster volume {name} is not a thin volume: it takes its drives whole; make \
             thin volumes in a cluster pool to grow them; nothing was changed"
        )
    })
}

/// The highest NSID handed out to thin volumes (the target's).
const MAX_NSID: u32 = nvmf_target::subsystem::MAX_NSID;

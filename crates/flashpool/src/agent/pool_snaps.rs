//! Snapshots, clones and revert of the thin volumes of cluster pools.
//!
//! Each is done by the pool's owner (another node passes the request on,
//! as a create is) and, like a create, made in the pool first and recorded
//! in etcd after: a snapshot is a thin spec marked `snapshot`, served
//! write-protected by every node when asked (`export`), else recorded with
//! NSID 0 and served by none; a clone is a thin volume like a created one,
//! served by every node in the pool's ANA group. A record refused undoes
//! what the pool made (a snapshot deleted is merged back into its volume),
//! so a refused request changes nothing. The pool's metadata holds the
//! snapshot tree, so a move or takeover carries it; the records carry the
//! names and NSIDs.
//!
//! A revert is refused while hosts are connected to the pool's subsystem
//! on the owner (unless forced): hosts of a cluster connect to every node,
//! and the owner is the one path that passes I/O.

use std::sync::Arc;

use cluster::{Session, ThinSpec, VolumeSpec};

use super::Agent;
use super::cluster_ops::serial_of;
use super::etcd;
use super::pools::{Located, NsidChoice, locate, owned_pool};
use crate::api_types::{
    CloneRequest, ExportRequest, RevertRequest, SnapshotGroupRequest, SnapshotPair,
};
use crate::node::{NodeError, NodeResult, VolumeInfo};

impl Agent {
    /// `POST /v1/volumes/{v}/snapshots` and `POST /v1/snapshots` in
    /// cluster mode: snapshots of thin volumes of one cluster pool at one
    /// instant, taken by the pool's owner; of this node's own pools, by
    /// the node.
    pub async fn snapshot(
        self: &Arc<Self>,
        pairs: Vec<SnapshotPair>,
    ) -> NodeResult<Vec<VolumeInfo>> {
        if pairs.is_empty() {
            return Err(NodeError::BadRequest(
                "no volume to snapshot; give one or more {\"volume\", \"name\"} pairs".into(),
            ));
        }
        let s = self.session();
        let mut found = Vec::with_capacity(pairs.len());
        for p in &pairs {
            not_drives(&s, &p.volume).await?;
            found.push(locate(&s, &p.volume).await?);
        }
        if found.iter().all(Option::is_none) {
            for p in &pairs {
                self.local_only(&s, &p.volume).await?;
            }
            return self.node.snapshot_volumes(&node_pairs(&pairs)?).await;
        }
        let mut at: Option<Located> = None;
        for (p, l) in pairs.iter().zip(found) {
            let Some(l) = l else {
                return Err(NodeError::BadRequest(format!(
                    "volume {} is not in a cluster pool; one snapshot at one instant is of \
                     volumes of one pool",
                    p.volume
                )));
            };
            if let Some(first) = &at
                && first.spec.name != l.spec.name
            {
                return Err(NodeError::BadRequest(format!(
                    "volumes {} and {} are in different pools ({} and {}); one snapshot at \
                     one instant is of volumes of one pool",
                    first.t.name, p.volume, first.spec.name, l.spec.name
                )));
            }
            in_subsystem(&l.spec, p.export.as_ref())?;
            at.get_or_insert(l);
        }
        let Located { spec, owner, .. } = at.expect("one pair at least");
        if owner.node != s.node() {
            let req = SnapshotGroupRequest { snapshots: pairs };
            return self
                .on_owner(&s, &owner.node, move |p, api| p.snapshot_volumes(api, &req))
                .await;
        }
        self.snapshot_here(&s, &spec, owner.epoch, pairs).await
    }

    /// Takes the snapshots `pairs` in pool `spec`, owned here at `epoch`,
    /// and records them.
    async fn snapshot_here(
        &self,
        s: &Session,
        spec: &VolumeSpec,
        epoch: u64,
        pairs: Vec<SnapshotPair>,
    ) -> NodeResult<Vec<VolumeInfo>> {
        let choices: Vec<NsidChoice> = pairs
            .iter()
            .map(|p| match &p.export {
                None => NsidChoice::Unserved,
                Some(x) if x.nsid == 0 => NsidChoice::Free,
                Some(x) => NsidChoice::Given(x.nsid),
            })
            .collect();
        let new: Vec<(&str, Option<u32>)> = pairs
            .iter()
            .zip(&choices)
            .map(|(p, c)| match c {
                NsidChoice::Given(n) => (p.name.as_str(), Some(*n)),
                _ => (p.name.as_str(), None),
            })
            .collect();
        self.check_new(s, spec, epoch, &new).await?;
        let names: Vec<(String, String)> = pairs
            .iter()
            .map(|p| (p.volume.clone(), p.name.clone()))
            .collect();
        let made = self.node.snapshot_volumes(&names).await?;
        let mut recorded: Vec<ThinSpec> = Vec::with_capacity(made.len());
        for ((info, (vol, _)), choice) in made.iter().zip(&names).zip(&choices) {
            let t = ThinSpec {
                name: info.name.clone(),
                pool: spec.name.clone(),
                uuid: info.uuid.clone(),
                nsid: 0,
                size_bytes: info.size_bytes,
                block_size: info.block_size,
                serial: serial_of(&info.uuid),
                snapshot: true,
                origin: Some(vol.clone()),
            };
            match self.record_thin(s, spec, epoch, t, *choice, None).await {
                Ok(t) => recorded.push(t),
                Err(e) => {
                    // A refused request changes nothing: the records made go,
                    // then the snapshots (each merged back into its volume).
                    for t in &recorded {
                        if let Err(d) = s.delete_thin(t, &spec.nqn, epoch).await {
                            tracing::error!("snapshot {}: undoing its record: {d}", t.name);
                        }
                    }
                    for (_, snap) in &names {
                        if let Err(d) = self.node.delete_volume(snap, true).await {
                            tracing::error!("snapshot {snap}: undoing it: {d}");
                        }
                    }
                    return Err(e);
                }
            }
        }
        let mut out = Vec::with_capacity(recorded.len());
        for t in &recorded {
            self.serve_new_thin(&spec.name, t).await;
            tracing::info!(
                "snapshot {} of thin volume {} in cluster pool {}: {}",
                t.name,
                t.origin.as_deref().unwrap_or("-"),
                spec.name,
                if t.nsid == 0 {
                    "not served".to_string()
                } else {
                    format!("served write-protected as nsid {} of {}", t.nsid, spec.nqn)
                }
            );
            out.push(self.thin_info(spec, t).await?);
        }
        Ok(out)
    }

    /// `POST /v1/volumes/{snapshot}/clone` in cluster mode: a writable thin
    /// volume made by the pool's owner from a snapshot of a cluster pool,
    /// recorded and served by every node like a created one.
    pub async fn clone_volume(
        self: &Arc<Self>,
        snapshot: &str,
        req: CloneRequest,
    ) -> NodeResult<VolumeInfo> {
        let s = self.session();
        not_drives(&s, snapshot).await?;
        let Some(Located { spec, t, owner }) = locate(&s, snapshot).await? else {
            self.local_only(&s, snapshot).await?;
            return self
                .node
                .clone_volume(snapshot, &req.name, req.export)
                .await;
        };
        if !t.snapshot {
            return Err(NodeError::BadRequest(format!(
                "{snapshot} is not a snapshot; take a snapshot of it and clone that"
            )));
        }
        in_subsystem(&spec, req.export.as_ref())?;
        crate::node::check_name("clone", &req.name)?;
        if owner.node != s.node() {
            let snap = snapshot.to_string();
            return self
                .on_owner(&s, &owner.node, move |p, api| {
                    p.clone_volume(api, &snap, &req)
                })
                .await;
        }
        let want = req.export.as_ref().map(|x| x.nsid).filter(|n| *n != 0);
        self.check_new(&s, &spec, owner.epoch, &[(&req.name, want)])
            .await?;
        let info = self.node.clone_volume(snapshot, &req.name, None).await?;
        let c = ThinSpec {
            name: req.name.clone(),
            pool: spec.name.clone(),
            uuid: info.uuid.clone(),
            nsid: 0,
            size_bytes: info.size_bytes,
            block_size: info.block_size,
            serial: serial_of(&info.uuid),
            snapshot: false,
            origin: Some(snapshot.to_string()),
        };
        let choice = want.map_or(NsidChoice::Free, NsidChoice::Given);
        let c = match self
            .record_thin(&s, &spec, owner.epoch, c, choice, None)
            .await
        {
            Ok(c) => c,
            Err(e) => {
                if let Err(d) = self.node.delete_volume(&req.name, true).await {
                    tracing::error!("clone {}: undoing it: {d}", req.name);
                }
                return Err(e);
            }
        };
        self.serve_new_thin(&spec.name, &c).await;
        tracing::info!(
            "clone {} of snapshot {snapshot} in cluster pool {}: nsid {} of {}",
            c.name,
            spec.name,
            c.nsid,
            spec.nqn
        );
        self.thin_info(&spec, &c).await
    }

    /// `POST /v1/volumes/{name}/revert` in cluster mode: on the pool's
    /// owner, refused while hosts are connected to the pool's subsystem
    /// there, unless `force`.
    pub async fn revert(self: &Arc<Self>, name: &str, r: RevertRequest) -> NodeResult<VolumeInfo> {
        let s = self.session();
        not_drives(&s, name).await?;
        let Some(Located { spec, t, owner }) = locate(&s, name).await? else {
            self.local_only(&s, name).await?;
            return self.node.revert_volume(name, &r.snapshot, r.force).await;
        };
        if t.snapshot {
            return Err(NodeError::BadRequest(format!(
                "{name} is a snapshot, which never changes; revert the volume it was taken of"
            )));
        }
        if owner.node != s.node() {
            let n = name.to_string();
            return self
                .on_owner(&s, &owner.node, move |p, api| p.revert_volume(api, &n, &r))
                .await;
        }
        let mut served = self.served.lock().await;
        owned_pool(&mut served, &spec.name, owner.epoch)?;
        let hosts = self.target.hosts_connected(&spec.nqn);
        if !hosts.is_empty() && !r.force {
            return Err(NodeError::Conflict(format!(
                "thin volume {name} is served as nsid {} of {} and hosts are connected to \
                 that subsystem on its owner {} ({}); a revert changes its data under them. \
                 Disconnect them first, or use --force (API: {{\"force\": true}}). Nothing \
                 was changed",
                t.nsid,
                spec.nqn,
                self.name(),
                hosts.join(", ")
            )));
        }
        // The node refuses a snapshot that is not one of the volume's.
        self.node.revert_volume(name, &r.snapshot, true).await?;
        if t.nsid != 0
            && let Err(e) = self.target.namespace_resized(&spec.nqn, t.nsid)
        {
            tracing::error!("thin volume {name}: its namespace after the revert: {e}");
        }
        drop(served);
        tracing::info!(
            "thin volume {name} of cluster pool {}: reverted to snapshot {}",
            spec.name,
            r.snapshot
        );
        self.thin_info(&spec, &t).await
    }

    /// `POST /v1/volumes/{pool}/expand` in cluster mode, of a name that is
    /// no cluster volume ([`Agent::expand`] grows a cluster pool): a node's
    /// own pool grows as on a node running alone; a thin volume of a
    /// cluster pool is refused, saying why (nothing was changed).
    pub async fn check_expand(&self, pool: &str) -> NodeResult<()> {
        let s = self.session();
        if locate(&s, pool).await?.is_some() {
            return Err(NodeError::Conflict(format!(
                "{pool} is a thin volume of a cluster pool, not a pool; only a pool grows by an \
                 extent (grow a thin volume with `flashpool volume grow`). Nothing was changed"
            )));
        }
        self.local_only(&s, pool).await
    }

    /// A volume the cluster has no record of is this node's own, unless it
    /// is in a cluster pool (made by a create cut short): only the cluster
    /// changes those.
    pub(super) async fn local_only(&self, s: &Session, name: &str) -> NodeResult<()> {
        let Ok(v) = self.node.volume(name).await else {
            return Ok(());
        };
        if let Some(p) = &v.pool
            && s.spec(p).await.map_err(etcd)?.is_some()
        {
            return Err(NodeError::Conflict(format!(
                "thin volume {name} of cluster pool {p} is not recorded in the cluster (a \
                 create cut short); delete it with `flashpool volume delete {name} --force` \
                 on this node. Nothing was changed"
            )));
        }
        Ok(())
    }
}

/// Refuses a cluster volume on drives (or a pool) as the volume of a
/// snapshot, clone or revert: those are of thin volumes.
async fn not_drives(s: &Session, name: &str) -> NodeResult<()> {
    match s.spec(name).await.map_err(etcd)? {
        Some(v) if v.thin_pool => Err(NodeError::Conflict(format!(
            "cluster volume {name} is a pool; snapshots, clones and reverts are of its thin \
             volumes. Nothing was changed"
        ))),
        Some(_) => Err(NodeError::Conflict(format!(
            "cluster volume {name} is not a thin volume: it takes its drives whole, and \
             snapshots, clones and reverts are of thin volumes; make thin volumes in a cluster \
             pool (--pool) to snapshot them. Nothing was changed"
        ))),
        None => Ok(()),
    }
}

/// Refuses an export in another subsystem than the pool's.
pub(super) fn in_subsystem(spec: &VolumeSpec, x: Option<&ExportRequest>) -> NodeResult<()> {
    match x {
        Some(x) if x.nqn != spec.nqn => Err(NodeError::BadRequest(format!(
            "the thin volumes and snapshots of cluster pool {} are served in its subsystem {}; \
             leave out the export or give that NQN",
            spec.name, spec.nqn
        ))),
        _ => Ok(()),
    }
}

/// The pairs as a node running alone takes them: it exports a snapshot
/// with `POST /v1/volumes/{name}/export`, not as it is taken.
pub fn node_pairs(pairs: &[SnapshotPair]) -> NodeResult<Vec<(String, String)>> {
    if let Some(p) = pairs.iter().find(|p| p.export.is_some()) {
        return Err(NodeError::BadRequest(format!(
            "snapshot {} of a node's own pool is exported with `flashpool volume export` \
             (POST /v1/volumes/{{name}}/export) once taken; leave out the export",
            p.name
        )));
    }
    Ok(pairs
        .iter()
        .map(|p| (p.volume.clone(), p.name.clone()))
        .collect())
}

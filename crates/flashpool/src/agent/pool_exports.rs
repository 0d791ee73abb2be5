//! Export and unexport of the recorded thin volumes and snapshots of
//! cluster pools, after they were made: `POST /v1/volumes/{name}/export`
//! and `/unexport` asked of any node are done by the pool's owner (another
//! node passes them on), which records the new NSID in the thin volume's
//! spec and claims it (`nsids/<nqn>/<nsid>`) in one transaction, freeing
//! the old one; every node then serves (or stops serving) the namespace as
//! the record says, a snapshot write-protected. Nothing is recorded while
//! the request can still be refused, so a refusal changes nothing.
//!
//! A cluster volume on drives is served as recorded at its create and a
//! pool is never served itself: both are refused here.

use std::sync::Arc;
use std::time::Duration;

use cluster::{ClusterError, Session, ThinSpec, VolumeSpec};

use super::Agent;
use super::etcd;
use super::pool_snaps::in_subsystem;
use super::pools::{Located, NSID_TRIES, locate, owned_pool};
use crate::api_types::ExportRequest;
use crate::node::{NodeError, NodeResult, VolumeInfo};

impl Agent {
    /// `POST /v1/volumes/{name}/export` in cluster mode: a thin volume or
    /// snapshot of a cluster pool served from now on as `x.nsid` of the
    /// pool's subsystem (0: the lowest free one) by every node. `None`
    /// when the cluster has no record of `name` (the node's own volume).
    pub async fn export(
        self: &Arc<Self>,
        name: &str,
        x: ExportRequest,
    ) -> NodeResult<Option<VolumeInfo>> {
        let s = self.session();
        if let Some(v) = s.spec(name).await.map_err(etcd)? {
            return Err(not_thin(&v, "exported"));
        }
        let Some(Located { spec, t, owner }) = locate(&s, name).await? else {
            self.local_only(&s, name).await?;
            return Ok(None);
        };
        in_subsystem(&spec, Some(&x))?;
        if t.nsid != 0 {
            return Err(NodeError::Conflict(format!(
                "{name} is already served as nsid {} of {}; unexport it first. Nothing was \
                 changed",
                t.nsid, spec.nqn
            )));
        }
        if owner.node != s.node() {
            let n = name.to_string();
            let v = self
                .on_owner(&s, &owner.node, move |p, api| p.export_volume(api, &n, &x))
                .await?;
            return Ok(Some(v));
        }
        let mut served = self.served.lock().await;
        let sv = owned_pool(&mut served, &spec.name, owner.epoch)?;
        let new = self.record_nsid(&s, &spec, owner.epoch, &t, x.nsid).await?;
        match sv.thins.get_mut(name) {
            Some(ts) => {
                self.reserve_thin(&sv.spec, &ts.spec, &new, &ts.switch);
                ts.spec = new.clone();
            }
            // The pool's next pass serves it as recorded.
            None => tracing::warn!("{name}: exported before this node served it; served soon"),
        }
        drop(served);
        tracing::info!(
            "{} {name} of cluster pool {}: exported as nsid {} of {}",
            if new.snapshot {
                "snapshot"
            } else {
                "thin volume"
            },
            spec.name,
            new.nsid,
            spec.nqn
        );
        self.thin_info(&spec, &new).await.map(Some)
    }

    /// Records thin volume `t` as served as `nsid` (0: the lowest free
    /// one, another if a concurrent request took it) of pool `spec`, owned
    /// here at `epoch`. Refused, recording nothing, when the NSID asked for
    /// serves another volume, in the cluster or in this node's target.
    async fn record_nsid(
        &self,
        s: &Session,
        spec: &VolumeSpec,
        epoch: u64,
        t: &ThinSpec,
        nsid: u32,
    ) -> NodeResult<ThinSpec> {
        let taken = || {
            NodeError::Conflict(format!(
                "nsid {nsid} of {} serves another volume already; pick another or leave it \
                 out. Nothing was changed",
                spec.nqn
            ))
        };
        if nsid != 0 && self.local_nsid(&spec.nqn, nsid) {
            return Err(taken());
        }
        for _ in 0..NSID_TRIES {
            let n = match nsid {
                0 => self.free_nsid(s, &spec.nqn).await?,
                n => n,
            };
            match s.set_thin_nsid(t, &spec.nqn, n, epoch).await {
                Ok(new) => return Ok(new),
                Err(ClusterError::NsidTaken { .. }) if nsid == 0 => continue,
                Err(ClusterError::NsidTaken { .. }) => return Err(taken()),
                Err(e) => return Err(etcd(e)),
            }
        }
        Err(NodeError::Conflict(format!(
            "the free nsids of {} were taken by other requests meanwhile; nothing was \
             changed, retry",
            spec.nqn
        )))
    }

    /// Whether this node's target serves `nsid` of `nqn` already.
    fn local_nsid(&self, nqn: &str, nsid: u32) -> bool {
        self.target
            .subsystem(nqn)
            .is_some_and(|sub| sub.namespace(nsid).is_some())
    }

    /// `POST /v1/volumes/{name}/unexport` in cluster mode: a thin volume or
    /// snapshot of a cluster pool no longer served by any node (recorded
    /// with NSID 0, its NSID freed). Refused while hosts are connected to
    /// the pool's subsystem on its owner, unless `force`. `None` when the
    /// cluster has no record of `name`.
    pub async fn unexport(
        self: &Arc<Self>,
        name: &str,
        force: bool,
    ) -> NodeResult<Option<VolumeInfo>> {
        let s = self.session();
        if let Some(v) = s.spec(name).await.map_err(etcd)? {
            return Err(not_thin(&v, "unexported"));
        }
        let Some(Located { spec, t, owner }) = locate(&s, name).await? else {
            self.local_only(&s, name).await?;
            return Ok(None);
        };
        if t.nsid == 0 {
            return Err(NodeError::Conflict(format!(
                "{name} is not exported (no node serves it)"
            )));
        }
        if owner.node != s.node() {
            let n = name.to_string();
            let v = self
                .on_owner(&s, &owner.node, move |p, api| {
                    p.unexport_volume(api, &n, force)
                })
                .await?;
            return Ok(Some(v));
        }
        let mut served = self.served.lock().await;
        let sv = owned_pool(&mut served, &spec.name, owner.epoch)?;
        let hosts = self.target.hosts_connected(&spec.nqn);
        if !hosts.is_empty() {
            if !force {
                return Err(NodeError::Conflict(format!(
                    "{name} is nsid {} of {}, to which hosts are connected on its owner {} \
                     ({}): unexporting it takes the namespace away under them on every node, \
                     and their I/O to it fails. Nothing was changed; disconnect them first, \
                     or use --force (API: {{\"force\": true}})",
                    t.nsid,
                    spec.nqn,
                    self.name(),
                    hosts.join(", ")
                )));
            }
            tracing::warn!(
                "{name}: unexported with force while hosts {hosts:?} are connected to {}",
                spec.nqn
            );
        }
        let new = s
            .set_thin_nsid(&t, &spec.nqn, 0, owner.epoch)
            .await
            .map_err(etcd)?;
        if let Some(ts) = sv.thins.get_mut(name) {
            self.reserve_thin(&sv.spec, &ts.spec, &new, &ts.switch);
            ts.spec = new.clone();
            // Commands passed on before finish; a flush makes them durable.
            ts.switch.drain(Duration::from_secs(5)).await;
        }
        drop(served);
        if let Some(dev) = self.node.volume_device(name).await
            && let Err(e) = crate::node::flush(&*dev).await
        {
            tracing::error!("{name}: flush after its unexport: {e}");
        }
        tracing::info!(
            "{name} of cluster pool {}: no longer exported (was nsid {} of {})",
            spec.name,
            t.nsid,
            spec.nqn
        );
        self.thin_info(&spec, &new).await.map(Some)
    }
}

/// Why cluster volume `v` (on drives, or a pool) is not `what` here.
fn not_thin(v: &VolumeSpec, what: &str) -> NodeError {
    NodeError::Conflict(if v.thin_pool {
        format!(
            "cluster volume {} is a pool, never served itself; its thin volumes and snapshots \
             are {what}. Nothing was changed",
            v.name
        )
    } else {
        format!(
            "cluster volume {} is served by every node as nsid {} of {}, as recorded at its \
             create; it is not {what} later. Nothing was changed",
            v.name, v.nsid, v.nqn
        )
    })
}

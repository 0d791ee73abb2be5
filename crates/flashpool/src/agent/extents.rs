//! Cluster pools that grow (`pool expand`): a pool grows by an extent, a
//! volume of its own on other drives (its own layout, rebuild and scrub),
//! which the pool's owner makes and adds to the pool as a node alone does
//! (`node/expand.rs`).
//!
//! The extent is part of the pool in the cluster too: the pool's spec lists
//! it (`VolumeSpec::extents`), its member states are recorded under the
//! pool (`volumes/<pool>/extent-state/<x>`, guarded by the pool's epoch),
//! and it has no owner key, namespace or ANA group of its own. Whoever
//! owns the pool runs its extents: a takeover or a move assembles them
//! (preempting their members' reservations) before the pool, and lets go
//! of them with it (`node/owned.rs`).
//!
//! An expansion is recorded before the extent is made: a record cut short
//! names an extent that no pool holds, which the next owner skips (the
//! pool opens without it) and then takes out of the spec, freeing its
//! drives. The other order could leave a pool that holds clusters on a
//! volume no record names, which no other node could open.

use std::sync::Arc;

use cluster::{ExtentSpec, Session, VolumeSpec};

use super::Agent;
use super::etcd;
use super::pools::{owned_pool, spec_error};
use crate::api_types::ExpandPool;
use crate::node::{AssembleVolume, Degraded, NodeError, NodeResult, Recorded, VolumeInfo};

impl Agent {
    /// `POST /v1/volumes/{pool}/expand` of a cluster pool: grown by its
    /// owner (another node passes the request on). `None` when the cluster
    /// has no volume of that name (a node's own pool grows as on a node
    /// alone). A refused expansion changes nothing.
    pub async fn expand(
        self: &Arc<Self>,
        pool: &str,
        req: ExpandPool,
    ) -> NodeResult<Option<VolumeInfo>> {
        let s = self.session();
        let Some(spec) = s.spec(pool).await.map_err(etcd)? else {
            return Ok(None);
        };
        if !spec.thin_pool {
            return Err(NodeError::Conflict(format!(
                "cluster volume {pool} is not a pool (pools are made with --thin-pool); only a \
                 pool grows by an extent. Nothing was changed"
            )));
        }
        let owner = s.owner(pool).await.map_err(etcd)?.ok_or_else(|| {
            NodeError::Conflict(format!(
                "cluster pool {pool} has no owner right now (a takeover is under way); retry"
            ))
        })?;
        if owner.node != s.node() {
            let (p, r) = (pool.to_string(), req);
            let v = self
                .on_owner(&s, &owner.node, move |api, at| api.expand_pool(at, &p, &r))
                .await?;
            return Ok(Some(v));
        }
        let name = crate::node::extent_name(pool, &req, spec.extents.len())?;
        crate::node::check_name("volume", &name)?;
        let mut urls = Vec::new();
        for d in &req.drives {
            urls.push(self.node.cluster().resolve(d).map_err(|e| {
                NodeError::BadRequest(format!("{e} (a cluster pool grows on remote drives only)"))
            })?);
        }
        super::with_drives(&s, &urls.clone(), pool, async {
            check_free(&s, &name, &urls).await?;
            if self.node.volume(&name).await.is_ok() {
                return Err(NodeError::Conflict(format!(
                    "this node has a volume called {name} already; name the extent otherwise (name)"
                )));
            }
            // The map is held only for this check and to note the new extent,
            // not while the extent is made (connects, superblocks, a sync): no
            // other volume's takeover waits for an expansion. A settle
            // meanwhile takes the extents from etcd as well, and one that closes
            // the pool (a move) waits for the node's expansion, which then
            // fails or is recorded already (see the module's comment).
            owned_pool(&mut *self.served.lock().await, pool, owner.epoch)?;
            let mut grown = spec.clone();
            grown.extents.push(ExtentSpec {
                name: name.clone(),
                drives: urls,
                joining: Vec::new(),
                layout: req.layout.clone().unwrap_or_else(|| spec.layout.clone()),
            });
            // Recorded first (see the module's comment).
            s.update_spec(&spec, &grown, owner.epoch)
                .await
                .map_err(|e| {
                    spec_error(
                        e,
                        &format!("pool {pool}"),
                        &format!("recording its new extent {name}"),
                    )
                })?;
            let r = ExpandPool {
                name: Some(name.clone()),
                ..req
            };
            // Its member states recorded before the pool can write to it.
            let hook = self.extent_hook(pool, &name, owner.epoch);
            let res = self.node.expand_pool_with(pool, r, Some(hook)).await;
            // The extent's volume is kept when the pool may name it (a failed
            // metadata write labels it so): its record stays then, for the
            // next owner. (No volume of that name was here before.)
            let kept = res.is_ok()
                || self
                    .node
                    .volume(&name)
                    .await
                    .is_ok_and(|v| v.extent_of.as_deref().is_some_and(|p| !p.is_empty()));
            if !kept {
                if let Err(e) = s.update_spec(&grown, &spec, owner.epoch).await {
                    tracing::warn!(
                        "pool {pool}: extent {name} was not made, and its record stays ({e}); the \
                         pool's next owner finds no volume there and opens the pool without it"
                    );
                }
                return res.map(Some);
            }
            if let Some(sv) = self.served.lock().await.get_mut(pool) {
                sv.spec.extents = grown.extents;
            }
            let mut v = res?;
            v.owner = Some(self.name().to_string());
            Ok(Some(v))
        })
        .await
    }

    /// Assembles cluster pool `spec`'s extents for a takeover at `epoch`,
    /// concurrently, before the pool: members preempted, degraded as each
    /// extent's own record allows. One that fails is logged: the pool then
    /// waits for it if its checkpoint lists it, and opens without it if not
    /// (an expansion cut short), and the takeover says so.
    ///
    /// Returns the names of the extents assembled here.
    pub(super) async fn assemble_extents(
        self: &Arc<Self>,
        s: &Session,
        spec: &VolumeSpec,
        epoch: u64,
    ) -> Vec<String> {
        let pool = spec.name.as_str();
        let each = spec.extents.iter().map(|x| async move {
            match self.assemble_extent(s, pool, x, epoch).await {
                Ok(()) => Some(x.name.clone()),
                Err(e) => {
                    tracing::warn!("pool {pool}: its extent {} is not assembled: {e}", x.name);
                    None
                }
            }
        });
        futures_util::future::join_all(each)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Lets go of the extents assembled for pool `spec` (`up`) that its
    /// open pool does not list: made by an expansion cut short before the
    /// pool took them. Returns the recorded extents that the pool does not
    /// list, for [`Self::forget_stray_extents`]: those assembled here, and
    /// the others too when every extent the pool lists runs here (else one
    /// of them may be an extent that could not be assembled now).
    pub(super) async fn drop_stray_extents(&self, spec: &VolumeSpec, up: &[String]) -> Vec<String> {
        let pool = spec.name.as_str();
        let Some((listed, missing)) = self.node.pool_listed_extents(pool).await else {
            return Vec::new();
        };
        let mut strays = Vec::new();
        for x in spec.extents.iter().filter(|x| !listed.contains(&x.name)) {
            // Assembled now, or still running here from an expansion this
            // node began before (a step-down lets go of the extents its pool
            // lists, not of this one): let go of either before its drives
            // are free again.
            let assembled =
                up.contains(&x.name) || self.node.volume_device(&x.name).await.is_some();
            if assembled {
                tracing::warn!(
                    "pool {pool}: volume {}, recorded as its extent, is not one of the pool's \
                     (an expansion cut short); not kept open",
                    x.name
                );
                self.node
                    .drop_fenced(&x.name, "not an extent of its pool's open pool")
                    .await;
            }
            if assembled || !missing {
                strays.push(x.name.clone());
            }
        }
        strays
    }

    /// Takes the records of pool `sv`'s extents `strays` out of its spec
    /// (and their member-state records), once the pool is served here at
    /// `epoch`: an expansion cut short left them, naming drives that no
    /// volume uses, which would stay unusable for anything else. Left for
    /// the next owner when etcd refuses.
    pub(super) async fn forget_stray_extents(
        &self,
        s: &Session,
        sv: &mut super::Served,
        epoch: u64,
        strays: &[String],
    ) {
        if strays.is_empty() {
            return;
        }
        let pool = sv.spec.name.clone();
        let mut kept = sv.spec.clone();
        kept.extents.retain(|x| !strays.contains(&x.name));
        match s.drop_extents(&sv.spec, &kept, epoch, strays).await {
            Ok(()) => {
                tracing::warn!(
                    "pool {pool}: the records of extent(s) {} that the pool does not hold (an \
                     expansion cut short) are removed; their drives are free again",
                    strays.join(", ")
                );
                sv.spec.extents = kept.extents;
            }
            Err(e) => tracing::warn!(
                "pool {pool}: extent record(s) {} name no extent of the pool (an expansion \
                 cut short), and stay ({e}); the next owner tries again",
                strays.join(", ")
            ),
        }
    }

    async fn assemble_extent(
        self: &Arc<Self>,
        s: &Session,
        pool: &str,
        x: &ExtentSpec,
        epoch: u64,
    ) -> Result<(), String> {
        let rec = s
            .extent_state(pool, &x.name)
            .await
            .map_err(|e| format!("reading its member-state record in etcd: {e}"))?;
        let req = AssembleVolume {
            drives: self.names_of(
                &x.drives
                    .iter()
                    .chain(&x.joining)
                    .cloned()
                    .collect::<Vec<_>>(),
            ),
            takeover: true,
            export: None,
            force: false,
            only: Some(x.name.clone()),
        };
        let degraded = Degraded {
            wait: self.node.cluster().remote.takeover_wait,
            recorded: rec.map(|r| Recorded {
                generation: r.generation,
                members: r.members,
            }),
        };
        let info = self
            .node
            .assemble_volume_with(req, Some(degraded))
            .await
            .map_err(|e| e.to_string())?;
        if info.name != x.name {
            self.node
                .drop_fenced(&info.name, "not the extent etcd names")
                .await;
            return Err(format!("its drives hold volume {:?}", info.name));
        }
        if let Err(e) = self.start_recording_extent(pool, &x.name, epoch).await {
            self.node.drop_fenced(&x.name, &e).await;
            return Err(e);
        }
        Ok(())
    }
}

/// Refuses an extent named `name` on drives `urls` when the cluster has a
/// volume, thin volume or extent of that name, or a volume or extent on
/// one of those drives.
async fn check_free(s: &Session, name: &str, urls: &[String]) -> NodeResult<()> {
    if s.pool_of(name).await.map_err(etcd)?.is_some() {
        return Err(NodeError::Conflict(format!(
            "a thin volume is called {name} already; name the extent otherwise (name)"
        )));
    }
    let specs = s.specs().await.map_err(etcd)?;
    for v in &specs {
        if let Some(x) = v.extents.iter().find(|x| x.name == name) {
            return Err(NodeError::Conflict(format!(
                "extent {} of pool {} exists already; name the extent otherwise (name)",
                x.name, v.name
            )));
        }
        if v.name == name {
            return Err(NodeError::Conflict(format!(
                "cluster volume {name} exists already; name the extent otherwise (name)"
            )));
        }
    }
    super::drives_free(&specs, urls)
}

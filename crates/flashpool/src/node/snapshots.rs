//! Snapshots, clones, revert and the pool check of thin volumes: the node's
//! side of `volume::thin`'s volume tree. A snapshot and a clone are thin
//! volumes of the node like any other (listed, exported, deleted by name);
//! a snapshot is served read-only (a write-protected namespace).

use nvmf_target::qos::QosLimits;
use volume::thin::{ThinPool, ThinVolume};

use super::ops::{ExportRequest, VolumeInfo};
use super::validate::check_name;
use super::volumes::thin_err;
use super::{Backing, Node, NodeError, NodeResult, NodeState, Object, VolumeEntry};
use crate::api_types::PoolCheckInfo;
use crate::echo::Echo;
use crate::events::{EventKind, NewEvent};

impl NodeState {
    /// The pool (name and handle) that thin volume `name` lives in.
    pub(super) fn thin_of(&self, name: &str) -> NodeResult<(String, ThinPool, &VolumeEntry)> {
        let e = self
            .volumes
            .get(name)
            .ok_or_else(|| NodeError::no_volume(name))?;
        let Backing::Thin { pool, .. } = &e.backing else {
            return Err(NodeError::BadRequest(format!(
                "volume {name} is not a thin volume; snapshots and clones are of thin volumes \
                 (made in a pool with --pool)"
            )));
        };
        let p = self
            .volumes
            .get(pool)
            .and_then(|p| p.thin_pool())
            .cloned()
            .ok_or_else(|| NodeError::Conflict(format!("pool {pool} of {name} is not running")))?;
        Ok((pool.clone(), p, e))
    }

    fn name_free(&self, name: &str) -> NodeResult<()> {
        check_name("snapshot or clone", name)?;
        if self.volumes.contains_key(name) {
            return Err(NodeError::AlreadyExists {
                kind: Object::Volume,
                name: name.to_string(),
            });
        }
        Ok(())
    }
}

impl Node {
    /// Takes a snapshot of each `(volume, snapshot)` pair at one instant (a
    /// consistency group: every volume must be in the same pool). Crash
    /// consistent: writes acknowledged before it are in it, later ones not.
    pub async fn snapshot_volumes(
        &self,
        pairs: &[(String, String)],
    ) -> NodeResult<Vec<VolumeInfo>> {
        if pairs.is_empty() {
            return Err(NodeError::BadRequest(
                "no volume to snapshot; give one or more {\"volume\", \"name\"} pairs".into(),
            ));
        }
        let mut st = self.state.lock().await;
        let mut pool: Option<(String, ThinPool)> = None;
        for (vol, snap) in pairs {
            let (pn, p, _) = st.thin_of(vol)?;
            match &pool {
                Some((first, _)) if *first != pn => {
                    return Err(NodeError::BadRequest(format!(
                        "volumes {} and {} are in different pools ({first} and {pn}); one \
                         snapshot at one instant is of volumes of one pool",
                        Echo(&pairs[0].0),
                        Echo(vol)
                    )));
                }
                _ => pool = Some((pn, p)),
            }
            st.name_free(snap)?;
        }
        let (pool_name, pool) = pool.expect("at least one pair");
        let refs: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(v, s)| (v.as_str(), s.as_str()))
            .collect();
        let snaps = pool.snapshot(&refs).await.map_err(thin_err)?;
        let mut out = Vec::with_capacity(snaps.len());
        for (tv, (vol, snap)) in snaps.into_iter().zip(pairs) {
            out.push(self.add_thin(&mut st, &pool_name, tv, None)?);
            self.events.emit(
                NewEvent::new(
                    EventKind::SnapshotTaken,
                    format!("snapshot {snap} of volume {vol} (pool {pool_name})"),
                )
                .volume(vol.as_str()),
            );
        }
        Ok(out)
    }

    /// Makes `name`, a writable thin volume that starts as snapshot
    /// `snapshot` and shares its data until written; exported if asked.
    pub async fn clone_volume(
        &self,
        snapshot: &str,
        name: &str,
        export: Option<ExportRequest>,
    ) -> NodeResult<VolumeInfo> {
        let mut st = self.state.lock().await;
        let (pool_name, pool, _) = st.thin_of(snapshot)?;
        st.name_free(name)?;
        if let Some(x) = &export {
            self.check_export_free(x)?;
        }
        let tv = pool.clone_volume(snapshot, name).await.map_err(thin_err)?;
        let info = self.add_thin(&mut st, &pool_name, tv, export)?;
        tracing::info!("volume {name}: clone of snapshot {snapshot} in pool {pool_name}");
        Ok(info)
    }

    /// Reverts thin volume `name` to its snapshot `snapshot`. Refused while
    /// hosts are connected to its subsystem unless `force` (they would see
    /// their data change under them); with `force` they get a Namespace
    /// Attribute Changed event.
    pub async fn revert_volume(
        &self,
        name: &str,
        snapshot: &str,
        force: bool,
    ) -> NodeResult<VolumeInfo> {
        let st = self.state.lock().await;
        let (pool_name, pool, e) = st.thin_of(name)?;
        let export = e.export.clone();
        if let Some(x) = &export
            && let Some(t) = self.running_target()
        {
            let hosts = t.hosts_connected(&x.nqn);
            if !hosts.is_empty() && !force {
                return Err(NodeError::Conflict(format!(
                    "volume {name} is exported as nsid {} of {} and hosts are connected ({}); \
                     a revert changes its data under them. Disconnect them first, or use \
                     --force (API: {{\"force\": true}}). Nothing was changed",
                    x.nsid,
                    x.nqn,
                    hosts.join(", ")
                )));
            }
        }
        pool.revert_volume(name, snapshot).await.map_err(thin_err)?;
        if let Some(x) = &export
            && let Some(t) = self.running_target()
            && let Err(err) = t.namespace_resized(&x.nqn, x.nsid)
        {
            tracing::error!("volume {name}: its namespace after the revert: {err}");
        }
        self.events.emit(
            NewEvent::new(
                EventKind::VolumeReverted,
                format!("volume {name} reverted to snapshot {snapshot} (pool {pool_name})"),
            )
            .volume(name),
        );
        drop(st);
        self.volume(name).await
    }

    /// Checks the metadata of the thin pool on volume `pool`, in memory and
    /// against its device.
    pub async fn check_pool(&self, pool: &str) -> NodeResult<PoolCheckInfo> {
        let p = {
            let st = self.state.lock().await;
            let e = st
                .volumes
                .get(pool)
                .ok_or_else(|| NodeError::no_volume(pool))?;
            e.thin_pool().cloned().ok_or_else(|| {
                NodeError::BadRequest(format!(
                    "volume {pool} is not a thin pool; `flashpool volume list` shows which are"
                ))
            })?
        };
        let mut info = PoolCheckInfo {
            pool: pool.to_string(),
            ok: true,
            problem: None,
            volumes: 0,
            snapshots: 0,
            hidden_snapshots: 0,
            allocated_clusters: 0,
            total_clusters: 0,
            journal_blocks: 0,
        };
        match p.check_with_device().await {
            Ok(c) => {
                info.volumes = c.volumes;
                info.snapshots = c.snapshots;
                info.hidden_snapshots = c.hidden_snapshots;
                info.allocated_clusters = c.allocated_clusters;
                info.total_clusters = c.total_clusters;
                info.journal_blocks = c.journal_blocks;
            }
            Err(e) => {
                tracing::error!("pool {pool}: check failed: {e}");
                info.ok = false;
                info.problem = Some(e.to_string());
            }
        }
        Ok(info)
    }

    /// Enters a thin volume the pool just made in the node.
    fn add_thin(
        &self,
        st: &mut NodeState,
        pool: &str,
        tv: ThinVolume,
        export: Option<ExportRequest>,
    ) -> NodeResult<VolumeInfo> {
        let name = tv.name().to_string();
        let entry = VolumeEntry::new(
            &name,
            Backing::Thin {
                pool: pool.to_string(),
                tv,
            },
            Vec::new(),
            None,
        );
        self.register(st, entry, export, QosLimits::default())
    }
}

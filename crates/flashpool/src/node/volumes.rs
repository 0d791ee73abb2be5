//! Making and deleting volumes: on drives (found on them or formatted),
//! thin pools and the thin volumes in them, offline entries for volumes
//! that cannot be assembled, and deletes that refuse to lose data unasked.

use std::sync::Arc;

use blockdev::BlockDevice;
use volume::superblock::VolumeRole;
use volume::thin::{ThinError, ThinPool};
use volume::{Volume, VolumeConfig};

use crate::echo::Echo;

use nvmf_target::qos::QosLimits;

use super::ops::{CreateVolume, ExportRequest, VolumeInfo};
use super::validate::{check_name, find_volume, parse_layout, pool_format, size_arg};
use super::{
    Backing, Node, NodeError, NodeResult, NodeState, Object, Offline, VolumeEntry, wipe_head,
};
use crate::api_types::QosRequest;

pub(super) fn thin_err(e: ThinError) -> NodeError {
    match e {
        ThinError::NameTaken(_) | ThinError::ShrinkInUse { .. } => {
            NodeError::Conflict(e.to_string())
        }
        ThinError::NoSuchVolume(_) => NodeError::NotFound(e.to_string()),
        ThinError::Config(_) | ThinError::TooManyVolumes(_) | ThinError::Shrink { .. } => {
            NodeError::BadRequest(e.to_string())
        }
        _ => NodeError::Internal(e.to_string()),
    }
}

impl NodeState {
    /// Checks that `names` are existing, distinct, healthy drives no volume uses.
    pub(super) fn claimable(&self, names: &[String]) -> NodeResult<Vec<Arc<dyn BlockDevice>>> {
        let mut devs = Vec::with_capacity(names.len());
        for (i, n) in names.iter().enumerate() {
            if names[..i].contains(n) {
                return Err(NodeError::BadRequest(format!(
                    "drive {} is listed twice; give each position its own drive",
                    Echo(n)
                )));
            }
            let d = self.drives.get(n).ok_or_else(|| {
                NodeError::BadRequest(format!(
                    "drive {} does not exist; list the drives with `flashpool drive list`",
                    Echo(n)
                ))
            })?;
            if let Some((v, p)) = self.user_of(n) {
                return Err(NodeError::Conflict(format!(
                    "drive {n} is already in use by volume {v} (position {p}); pick a free drive"
                )));
            }
            self.check_not_assembling(n)?;
            if d.failed {
                return Err(NodeError::Conflict(format!(
                    "drive {n} has failed; pick a healthy drive"
                )));
            }
            if let Some(x) = &d.export {
                return Err(NodeError::Conflict(format!(
                    "drive {n} is exported to other nodes as {}; unexport it first",
                    x.nqn
                )));
            }
            devs.push(d.dev.clone());
        }
        Ok(devs)
    }
}

impl Node {
    /// A `[[volume]]` of the TOML file: found on its drives, or made on them.
    pub async fn ensure_volume(self: &Arc<Self>, req: CreateVolume) -> anyhow::Result<()> {
        let existing = {
            let mut st = self.state.lock().await;
            match st.volumes.get_mut(&req.name) {
                Some(e) if req.pool.is_some() => {
                    let want = req.pool.as_deref().unwrap_or_default();
                    match &e.backing {
                        Backing::Thin { pool, .. } if pool == want => {}
                        _ => anyhow::bail!(
                            "volume {}: the TOML says it is a thin volume in pool {want}, but a \
                             volume of that name exists elsewhere; fix the TOML",
                            req.name
                        ),
                    }
                    e.from_config = true;
                    true
                }
                Some(e) if e.offline().is_some() => {
                    let o = e.offline().expect("checked");
                    let want = req.layout.clone().unwrap_or_else(|| "thin".into());
                    if !o.layout.is_empty() && o.layout != want {
                        anyhow::bail!(
                            "volume {}: the TOML says layout {want} but its drives hold a {} \
                             volume (offline: {}); fix the TOML or delete the volume",
                            req.name,
                            o.layout,
                            o.reason
                        );
                    }
                    tracing::error!(
                        "volume {}: declared in the TOML but offline: {}",
                        req.name,
                        o.reason
                    );
                    e.from_config = true;
                    true
                }
                Some(e) => {
                    let Some(vol) = e.on_drives() else {
                        anyhow::bail!(
                            "volume {}: the TOML says layout {:?} but it is a thin volume; fix the TOML",
                            req.name,
                            req.layout
                        );
                    };
                    let want = parse_layout(req.layout.as_deref().unwrap_or_default())?;
                    let have = vol.layout().kind();
                    if req.thin_pool && e.thin_pool().is_none() {
                        anyhow::bail!(
                            "volume {}: the TOML says thin_pool = true but the volume on its drives \
                             is not a pool; formatting it would destroy its data, so remove \
                             thin_pool or delete the volume",
                            req.name
                        );
                    }
                    if want != have {
                        anyhow::bail!(
                            "volume {}: the TOML says layout {want} but its drives hold a {have} volume; \
                             fix the TOML or delete the volume",
                            req.name
                        );
                    }
                    if let (Some(want), Some(p)) = (&req.compression, e.thin_pool())
                        && want.parse::<volume::Compression>().ok() != Some(p.compression())
                    {
                        tracing::warn!(
                            "volume {}: the TOML says compression = {want:?} but the pool on its \
                             drives was made with {} (fixed when a pool is made); it stays so",
                            req.name,
                            p.compression()
                        );
                    }
                    // Encrypting in place would turn its data into garbage.
                    if req.encrypt && !vol.is_encrypted() {
                        anyhow::bail!(
                            "volume {}: the TOML says encrypt = true but the volume on its drives is \
                             not encrypted (a volume is encrypted when it is made); remove encrypt, \
                             or copy the data to a new encrypted volume",
                            req.name
                        );
                    }
                    if e.drives != req.drives {
                        tracing::warn!(
                            "volume {}: runs on drives {:?} but the TOML lists {:?} (a drive was replaced); update the TOML",
                            req.name,
                            e.drives,
                            req.drives
                        );
                    }
                    e.from_config = true;
                    if let Some(r) = &req.rebuild_rate {
                        e.rebuild_rate = Some(size_arg("rebuild_rate", r)?);
                    }
                    true
                }
                None => false,
            }
        };
        if !existing {
            self.create_volume(req.clone()).await?;
            let mut st = self.state.lock().await;
            if let Some(e) = st.volumes.get_mut(&req.name) {
                e.from_config = true;
            }
        }
        Ok(())
    }

    /// At start, for each `[[volume]]`: [`Node::ensure_volume`], and when
    /// that fails, the volume is entered offline with the reason (unless
    /// one of that name runs) and the error logged: one volume never keeps
    /// the node from starting.
    pub async fn ensure_volume_or_offline(self: &Arc<Self>, req: CreateVolume) {
        let name = req.name.clone();
        let Err(e) = self.ensure_volume(req.clone()).await else {
            return;
        };
        tracing::error!("config: volume {name}: {e:#}");
        let mut st = self.state.lock().await;
        if st.volumes.contains_key(&name) {
            return;
        }
        let block_size = req.block_size.unwrap_or(4096);
        let size_bytes = req
            .size
            .as_deref()
            .and_then(|s| crate::units::parse_size(s).ok())
            .unwrap_or(0);
        let o = Offline {
            reason: format!("{e:#}"),
            layout: req.layout.clone().unwrap_or_else(|| "thin".into()),
            size_bytes,
            block_size,
            ..Offline::default()
        };
        // No drives: they may hold something else, which a delete must not wipe.
        let mut entry = VolumeEntry::new(&name, Backing::Offline(o), Vec::new(), None);
        entry.from_config = true;
        st.volumes.insert(name.clone(), entry);
        tracing::error!("volume {name}: offline (not made, not served)");
    }

    pub async fn create_volume(self: &Arc<Self>, req: CreateVolume) -> NodeResult<VolumeInfo> {
        self.create_volume_qos(req, None).await
    }

    /// [`Node::create_volume`] under QoS limits (`qos` of `POST /v1/volumes`),
    /// checked before anything is made and set before it is served.
    pub async fn create_volume_qos(
        self: &Arc<Self>,
        req: CreateVolume,
        qos: Option<QosRequest>,
    ) -> NodeResult<VolumeInfo> {
        let limits = Self::create_qos(qos.as_ref())?;
        let drives = req.drives.clone();
        self.undo_remotes_on_err(&drives, self.create_volume_inner(req, limits, false))
            .await
    }

    /// A volume on drives made to be a thin pool's extent (`pool expand`):
    /// its superblocks say so, and it is never served.
    pub(super) async fn create_extent_volume(
        self: &Arc<Self>,
        req: CreateVolume,
    ) -> NodeResult<VolumeInfo> {
        let drives = req.drives.clone();
        let limits = Self::create_qos(None)?;
        self.undo_remotes_on_err(&drives, self.create_volume_inner(req, limits, true))
            .await
    }

    async fn create_volume_inner(
        self: &Arc<Self>,
        req: CreateVolume,
        limits: QosLimits,
        extent: bool,
    ) -> NodeResult<VolumeInfo> {
        check_name("volume", &req.name)?;
        if req.pool.is_some() {
            return self.create_thin(req, limits).await;
        }
        if req.thin_pool && !limits.is_unlimited() {
            return Err(NodeError::BadRequest(format!(
                "volume {}: a thin pool is not served itself; set QoS on its thin volumes",
                req.name
            )));
        }
        let (Some(layout), false) = (req.layout.as_deref(), req.drives.is_empty()) else {
            return Err(NodeError::BadRequest(format!(
                "volume {}: give a layout and drives (a volume on drives), or a pool and a size \
                 (a thin volume)",
                req.name
            )));
        };
        if req.size.is_some() {
            return Err(NodeError::BadRequest(format!(
                "volume {}: a volume on drives takes all of them; size is for thin volumes (with pool)",
                req.name
            )));
        }
        let (cluster, compression) = pool_format(&req)?;
        if req.thin_pool && req.export.is_some() {
            return Err(NodeError::BadRequest(format!(
                "volume {}: a thin pool is not served itself; export its thin volumes",
                req.name
            )));
        }
        let kind = parse_layout(layout)?;
        kind.shape(req.drives.len())
            .map_err(|e| NodeError::BadRequest(format!("volume {}: {e}", req.name)))?;
        let mut cfg = VolumeConfig::new(kind);
        cfg.role = match (req.thin_pool, extent) {
            (true, _) => VolumeRole::ThinPool,
            (false, true) => VolumeRole::PoolExtent,
            (false, false) => VolumeRole::Plain,
        };
        if let Some(s) = &req.strip {
            let b = size_arg("strip", s)?;
            cfg.strip_bytes = u32::try_from(b).map_err(|_| {
                NodeError::BadRequest(format!("strip {} is too large; use e.g. 64KiB", Echo(s)))
            })?;
        }
        if let Some(bs) = req.block_size {
            cfg.block_size = bs;
        }
        let rebuild_rate = req
            .rebuild_rate
            .as_deref()
            .map(|r| size_arg("rebuild_rate", r))
            .transpose()?;
        cfg.name = req.name.clone();
        if req.encrypt {
            cfg.key = Some(self.new_volume_key(&req.name)?);
        }
        let mut st = self.state.lock().await;
        if st.volumes.contains_key(&req.name) {
            return Err(NodeError::AlreadyExists {
                kind: Object::Volume,
                name: req.name.clone(),
            });
        }
        self.open_named_remotes(&mut st, &req.drives).await?;
        let devs = st.claimable(&req.drives)?;
        if let Some(x) = &req.export {
            self.check_export_free(x)?;
        }
        // Before the superblocks are written: a drive another node owns is refused.
        self.claim(&st, &req.drives, false).await?;
        cfg.assume_clean = req.drives.iter().all(|d| st.drives[d].fresh);
        let vol = Volume::create(devs, cfg)
            .await
            .map_err(|e| NodeError::BadRequest(format!("volume {}: {e}", req.name)))?;
        for d in &req.drives {
            if let Some(dr) = st.drives.get_mut(d) {
                dr.fresh = false;
            }
        }
        // Block 0 of a volume says whether it is a thin pool or a pool's
        // extent: one made on drives a deleted pool used must not say so.
        if !req.thin_pool
            && let Err(e) = wipe_head(&(Arc::new(vol.clone()) as Arc<dyn BlockDevice>)).await
        {
            tracing::warn!("volume {}: clearing its first block: {e}", req.name);
        }
        let pool = if req.thin_pool {
            let pool = ThinPool::format_compressed(Arc::new(vol.clone()), cluster, compression)
                .await
                .map_err(|e| {
                    NodeError::BadRequest(format!("volume {}: thin pool: {e}", req.name))
                })?;
            Some(pool)
        } else {
            None
        };
        let entry = VolumeEntry::new(
            &req.name,
            Backing::Drives { vol, pool },
            req.drives.clone(),
            rebuild_rate,
        );
        let info = self.register(&mut st, entry, req.export, limits)?;
        if let Some(vol) = st.volumes.get(&req.name).and_then(|e| e.on_drives())
            && vol.unsynced_regions() > 0
        {
            let vol = vol.clone();
            self.spawn_sync(&st, &req.name, &vol, super::scrub::SyncWhy::Create);
        }
        tracing::info!(
            "volume {}: created ({} on {:?}{}{})",
            req.name,
            kind,
            req.drives,
            if req.encrypt { ", encrypted" } else { "" },
            match (req.thin_pool, compression) {
                (false, _) => String::new(),
                (true, volume::Compression::None) => ", a thin pool".into(),
                (true, c) => format!(", a thin pool compressed with {c}"),
            }
        );
        Ok(info)
    }

    /// A thin volume in the pool on volume `req.pool`.
    async fn create_thin(&self, req: CreateVolume, limits: QosLimits) -> NodeResult<VolumeInfo> {
        let pool_name = req.pool.clone().unwrap_or_default();
        if req.layout.is_some() || !req.drives.is_empty() || req.thin_pool || req.strip.is_some() {
            return Err(NodeError::BadRequest(format!(
                "volume {}: a thin volume takes a pool and a size; layout, drives, strip and \
                 thin_pool are for volumes on drives",
                req.name
            )));
        }
        if let Some(c) = &req.compression {
            return Err(NodeError::BadRequest(format!(
                "volume {}: compression {} is set on a thin pool when it is made (its thin \
                 volumes are compressed when it is); remove it here",
                req.name,
                Echo(c)
            )));
        }
        let size = req.size.as_deref().ok_or_else(|| {
            NodeError::BadRequest(format!(
                "volume {}: a thin volume needs a size, e.g. \"100GiB\"",
                req.name
            ))
        })?;
        let size = size_arg("size", size)?;
        let bs = req.block_size.unwrap_or(4096);
        if bs != 512 && bs != 4096 {
            return Err(NodeError::BadRequest(format!(
                "volume {}: block_size {bs} is not supported; use 4096 or 512",
                req.name
            )));
        }
        if size < u64::from(bs) || !size.is_multiple_of(u64::from(bs)) {
            return Err(NodeError::BadRequest(format!(
                "volume {}: size {size} is too small or not a multiple of the {bs} B block; use e.g. 1GiB",
                req.name
            )));
        }
        let mut st = self.state.lock().await;
        if st.volumes.contains_key(&req.name) {
            return Err(NodeError::AlreadyExists {
                kind: Object::Volume,
                name: req.name.clone(),
            });
        }
        let pool = match st.volumes.get(&pool_name) {
            None => {
                return Err(NodeError::BadRequest(format!(
                    "pool {} does not exist; create a volume with thin_pool (--thin-pool) first",
                    Echo(&pool_name)
                )));
            }
            Some(e) if e.offline().is_some() => {
                return Err(NodeError::Conflict(format!(
                    "pool {pool_name} is offline: {}",
                    e.offline().expect("checked").reason
                )));
            }
            Some(e) => e.thin_pool().cloned().ok_or_else(|| {
                NodeError::BadRequest(format!(
                    "volume {} is not a thin pool; create one with thin_pool (--thin-pool)",
                    Echo(&pool_name)
                ))
            })?,
        };
        if req.encrypt
            && !st
                .volumes
                .get(&pool_name)
                .is_some_and(|e| match &e.backing {
                    Backing::Drives { vol, .. } => vol.is_encrypted(),
                    _ => false,
                })
        {
            return Err(NodeError::BadRequest(format!(
                "volume {}: pool {pool_name} is not encrypted; a thin volume is encrypted with its \
                 pool's key, so create the pool with --encrypt (or leave encrypt out)",
                req.name
            )));
        }
        if let Some(x) = &req.export {
            self.check_export_free(x)?;
        }
        let tv = pool
            .create_volume(&req.name, size, bs)
            .await
            .map_err(thin_err)?;
        let entry = VolumeEntry::new(
            &req.name,
            Backing::Thin {
                pool: pool_name.clone(),
                tv,
            },
            Vec::new(),
            None,
        );
        let info = self.register(&mut st, entry, req.export, limits)?;
        tracing::info!(
            "volume {}: thin, {} in pool {pool_name}",
            req.name,
            crate::units::human_bytes(size)
        );
        Ok(info)
    }

    /// Adds a new volume to the node, under its limits, exported if asked.
    pub(super) fn register(
        &self,
        st: &mut NodeState,
        mut entry: VolumeEntry,
        export: Option<ExportRequest>,
        limits: QosLimits,
    ) -> NodeResult<VolumeInfo> {
        // Before the export: the namespace is limited from its first command.
        entry.qos.set(limits);
        if let Some(x) = export {
            self.export_entry(&mut entry, x)?;
        }
        let name = entry.name.clone();
        st.volumes.insert(name.clone(), entry);
        self.save_exports(st)?;
        self.note_new_qos(st, &name, limits)?;
        Ok(st.volume_info(&name).expect("just inserted"))
    }

    /// Deletes a volume. One that holds data (any volume on drives, a thin
    /// volume with allocated clusters) needs `force`: without it the delete
    /// is refused, saying what would be lost, and nothing changes.
    pub async fn delete_volume(&self, name: &str, force: bool) -> NodeResult<()> {
        let extents = {
            let st = self.state.lock().await;
            if let Some(why) = rebuilding(&st, name) {
                return Err(NodeError::Conflict(why));
            }
            extents_of(&st, name)
        };
        self.delete_one_volume(name, force).await?;
        // A pool's extents go with it: nothing else can use their clusters.
        for x in extents {
            tracing::info!("volume {x}: deleted with its thin pool {name}");
            if let Err(e) = self.delete_one_volume(&x, true).await {
                tracing::error!("volume {x}: an extent of deleted pool {name}, not deleted: {e}");
            }
        }
        Ok(())
    }

    async fn delete_one_volume(&self, name: &str, force: bool) -> NodeResult<()> {
        let mut st = self.state.lock().await;
        let jobs = st.jobs.clone();
        let compactor = st.compactor.clone();
        if let Some(why) = extent_in_use(&st, name) {
            return Err(NodeError::Conflict(why));
        }
        let e = find_volume(&mut st, name)?;
        if let Some(x) = &e.export {
            return Err(NodeError::Conflict(format!(
                "volume {name} is exported as nsid {} of {}; unexport it first \
                 (flashpool volume unexport {name}), after the hosts let go of it",
                x.nsid, x.nqn
            )));
        }
        if e.from_config {
            return Err(NodeError::Conflict(format!(
                "volume {name} is declared in the node's TOML; remove it there and restart, \
                 or it would be made again"
            )));
        }
        if rebuild_due(e) {
            return Err(NodeError::Conflict(format!(
                "volume {name} is rebuilding; wait for the rebuild to finish"
            )));
        }
        if let Some(p) = e.thin_pool() {
            let thins: Vec<String> = p.volumes().into_iter().map(|t| t.name).collect();
            if !thins.is_empty() {
                return Err(NodeError::Conflict(format!(
                    "volume {name} is the thin pool of {}; delete them first",
                    thins.join(", ")
                )));
            }
        }
        if !force && let Some(what) = data_held(e) {
            return Err(NodeError::Conflict(format!(
                "volume {name} holds data ({what}); deleting it loses all of it. Nothing was \
                 changed; to delete it anyway use --force (API: {{\"force\": true}})"
            )));
        }
        let limited = !e.qos.limits().is_unlimited();
        // Its sync or scrub must not write to drives that are free again.
        jobs.stop(Some(name)).await;
        // A pool's compaction must not write to volumes being closed and wiped.
        compactor.stop(name).await;
        if let Backing::Thin { pool, .. } = &e.backing {
            let pool = pool.clone();
            let p = st
                .volumes
                .get(&pool)
                .and_then(|pe| pe.thin_pool())
                .cloned()
                .ok_or_else(|| NodeError::Internal(format!("the pool of {name} is gone")))?;
            p.delete_volume(name).await.map_err(thin_err)?;
            st.volumes.remove(name);
            if limited {
                self.forget_qos(&st, name);
            }
            tracing::info!(
                "volume {name}: deleted from pool {pool}; its clusters are free (an encrypted \
                 pool's key stays: it is erased with the pool)"
            );
            return Ok(());
        }
        let e = st.volumes.remove(name).expect("found above");
        if limited {
            self.forget_qos(&st, name);
        }
        if e.offline().is_some() {
            // Its drives hold its superblocks (and the data): wiped, they
            // are free; a missing position has no drive.
            for d in e.drives.iter().filter(|d| d.as_str() != "-") {
                if let Some(dr) = st.drives.get(d)
                    && let Err(err) = wipe_head(&dr.dev).await
                {
                    tracing::warn!(
                        "drive {d}: wiping the superblock of deleted volume {name}: {err}"
                    );
                }
            }
            self.unclaim(&st, &e.drives).await;
            tracing::info!(
                "volume {name} (offline): deleted; drives {:?} are free",
                e.drives
            );
            return Ok(());
        }
        if let Some(p) = e.thin_pool()
            && let Err(err) = p.close().await
        {
            tracing::warn!("volume {name}: closing its thin pool before delete: {err}");
        }
        if let Some(vol) = e.on_drives() {
            if let Err(err) = vol.close().await {
                tracing::warn!("volume {name}: close before delete: {err}");
            }
            // Nothing may write to its drives any more: they are free.
            vol.retire("the volume was deleted");
        }
        for d in &e.drives {
            if let Some(dr) = st.drives.get(d)
                && let Err(err) = wipe_head(&dr.dev).await
            {
                tracing::warn!("drive {d}: wiping the superblock of deleted volume {name}: {err}");
            }
        }
        self.unclaim(&st, &e.drives).await;
        // The superblocks held the only copies of an encrypted volume's
        // wrapped key: with them gone its data is unreadable (crypto-erase).
        let erased = e.on_drives().is_some_and(|v| v.is_encrypted());
        tracing::info!(
            "volume {name}: deleted; drives {:?} are free{}",
            e.drives,
            if erased {
                "; its data key is destroyed (crypto-erased)"
            } else {
                ""
            }
        );
        Ok(())
    }
}

/// What a volume holds that a delete would lose, in words; None when it
/// holds nothing (a thin volume never written). A volume on drives keeps no
/// record of having been written, so it counts as holding data.
impl Node {
    /// Why deleting volume `name` is refused while a rebuild runs on it or
    /// on one of its extents (nothing is changed then).
    pub async fn delete_waits(&self, name: &str) -> Option<String> {
        rebuilding(&*self.state.lock().await, name)
    }
}

/// Whether a rebuild of `e` runs or is on its way: a takeover's resync
/// waits for the node's other takeovers before it starts, and a rebuild
/// that found more to do starts another pass.
fn rebuild_due(e: &VolumeEntry) -> bool {
    e.rebuild_task || e.on_drives().is_some_and(|v| v.rebuild_progress().running)
}

fn rebuilding(st: &NodeState, name: &str) -> Option<String> {
    let running = |n: &str| st.volumes.get(n).is_some_and(rebuild_due);
    std::iter::once(name.to_string())
        .chain(extents_of(st, name))
        .find(|n| running(n))
        .map(|n| match n == name {
            true => format!("volume {name} is rebuilding; wait for the rebuild to finish"),
            false => format!(
                "volume {n}, an extent of pool {name}, is rebuilding; wait for the rebuild to \
                 finish. Nothing was changed"
            ),
        })
}

/// The extents of thin pool `pool` (open here) that the node runs, by
/// name: they go where the pool goes (deleted, handed over, dropped).
pub(super) fn extents_of(st: &NodeState, pool: &str) -> Vec<String> {
    let Some(p) = st.volumes.get(pool).and_then(|e| e.thin_pool()) else {
        return Vec::new();
    };
    st.volumes
        .values()
        .filter(|e| e.extent.as_ref().is_some_and(|x| x.pool == p.uuid()))
        .map(|e| e.name.clone())
        .collect()
}

/// Why volume `name`, an extent, cannot be deleted on its own: a pool
/// holds clusters on it (or may: a pool waiting for its extents).
fn extent_in_use(st: &NodeState, name: &str) -> Option<String> {
    let x = st.volumes.get(name)?.extent.as_ref()?;
    let named = st.volumes.values().find(|e| {
        e.thin_pool()
            .is_some_and(|p| p.uuid() == x.pool && p.extents().iter().any(|i| i.uuid == x.extent))
    });
    if let Some(pool) = named {
        return Some(format!(
            "volume {name} is an extent of thin pool {}, which holds clusters on it; it is \
             deleted with the pool (delete the pool's thin volumes, then the pool)",
            pool.name
        ));
    }
    let waiting: Vec<&str> = st
        .volumes
        .values()
        .filter(|e| e.pool_waiting.is_some())
        .map(|e| e.name.as_str())
        .collect();
    (!waiting.is_empty()).then(|| {
        format!(
            "volume {name} is an extent of thin pool {}, and pool(s) {} wait for their \
             extents; assemble them first",
            x.pool,
            waiting.join(", ")
        )
    })
}

fn data_held(e: &VolumeEntry) -> Option<String> {
    let size = |b: u64| crate::units::human_bytes(b);
    match &e.backing {
        Backing::Thin { tv, .. } => {
            // A clone's data may all be shared with its snapshot: still its data.
            let t = tv.info();
            let a = t.allocated_bytes + t.shared_bytes;
            (a > 0).then(|| {
                format!(
                    "{} written (its own or shared with snapshots) of {}",
                    size(a),
                    size(e.device().geometry().size_bytes())
                )
            })
        }
        Backing::Drives { .. } => Some(format!(
            "{} on drives {}",
            size(e.device().geometry().size_bytes()),
            e.drives.join(", ")
        )),
        Backing::Offline(o) => Some(format!(
            "{} on drives {}, offline",
            size(o.size_bytes),
            e.drives
                .iter()
                .filter(|d| d.as_str() != "-")
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

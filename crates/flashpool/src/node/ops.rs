//! What an operator can do to a node: make, find, export and delete volumes,
//! fail and replace drives, follow rebuilds. The API and `serve` call these;
//! each takes the node's state lock for its whole run.

use std::collections::BTreeMap;
use std::sync::Arc;

use blockdev::BlockDevice;
use nvmf_target::{Namespace, NamespaceError};

use volume::superblock::MAX_NAME_BYTES;
use volume::thin::{DEFAULT_CLUSTER_BYTES, ThinError, ThinPool};
use volume::{LayoutKind, MemberState, Volume, VolumeConfig};

use crate::echo::Echo;

use super::{
    Backing, Export, Node, NodeError, NodeResult, NodeState, Offline, VolumeEntry, wipe_head,
};
pub use crate::api_types::{
    CreateVolume, DriveInfo, ExportRequest, MemberInfo, PoolInfo, RebuildInfo, VolumeInfo,
};

/// Parses `concat`, `raid0`, `raid1`, `raid5`, `raid6`, `ecK+M`.
pub fn parse_layout(s: &str) -> NodeResult<LayoutKind> {
    let bad = || {
        NodeError::BadRequest(format!(
            "layout {} is unknown; use concat, raid0, raid1, raid5, raid6 or ecK+M (e.g. ec8+2)",
            Echo(s)
        ))
    };
    Ok(match s {
        "concat" => LayoutKind::Concat,
        "raid0" => LayoutKind::Raid0,
        "raid1" => LayoutKind::Raid1,
        "raid5" => LayoutKind::Raid5,
        "raid6" => LayoutKind::Raid6,
        _ => {
            let (k, m) = s
                .strip_prefix("ec")
                .and_then(|r| r.split_once('+'))
                .ok_or_else(bad)?;
            let k: usize = k.parse().map_err(|_| bad())?;
            let m: usize = m.parse().map_err(|_| bad())?;
            LayoutKind::Erasure { k, m }
        }
    })
}

/// Volume and drive names: 1 to 63 of `A-Z a-z 0-9 . _ -`, starting with a
/// letter or digit (they appear in URLs, logs and superblocks).
pub fn check_name(what: &str, name: &str) -> NodeResult<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(NodeError::BadRequest(format!(
            "{what} name {} is not valid: use 1 to {MAX_NAME_BYTES} letters, digits, '.', '_' or '-', starting with a letter or digit",
            Echo(name)
        )))
    }
}

fn size_arg(what: &str, s: &str) -> NodeResult<u64> {
    crate::units::parse_size(s).map_err(|e| NodeError::BadRequest(format!("{what}: {e}")))
}

fn uuid_bytes(uuid: &str) -> [u8; 16] {
    let hex: Vec<u8> = uuid.bytes().filter(|c| c.is_ascii_hexdigit()).collect();
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).take(16).enumerate() {
        let s = std::str::from_utf8(pair).unwrap_or("0");
        out[i] = u8::from_str_radix(s, 16).unwrap_or(0);
    }
    out
}

pub(super) fn member_state_name(s: MemberState) -> &'static str {
    match s {
        MemberState::Active => "active",
        MemberState::Failed => "failed",
        MemberState::Rebuilding { .. } => "rebuilding",
        MemberState::Resyncing { .. } => "resyncing",
    }
}

fn rebuild_info(vol: &Volume, drives: &[String], last_error: Option<String>) -> RebuildInfo {
    let p = vol.rebuild_progress();
    let name = |i: &usize| drives.get(*i).cloned().unwrap_or_else(|| "-".into());
    let total = p.total_stripes + p.queued_stripes;
    RebuildInfo {
        running: p.running,
        members: p.members.clone(),
        drives: p.members.iter().map(name).collect(),
        queued_drives: p.queued_members.iter().map(name).collect(),
        done_stripes: p.done_stripes,
        total_stripes: total,
        percent: if total == 0 {
            0.0
        } else {
            100.0 * p.done_stripes as f64 / total as f64
        },
        bytes: p.bytes,
        mb_per_sec: p.bytes_per_sec / 1e6,
        eta_secs: p.eta.map(|d| d.as_secs_f64()),
        last_error,
    }
}

fn volume_state(vol: &Volume) -> &'static str {
    let states = vol.member_states();
    if vol.is_failed() {
        "failed"
    } else if states.iter().any(|s| matches!(s, MemberState::Failed)) {
        "degraded"
    } else if states
        .iter()
        .any(|s| matches!(s, MemberState::Rebuilding { .. }))
    {
        "rebuilding"
    } else if states
        .iter()
        .any(|s| matches!(s, MemberState::Resyncing { .. }))
    {
        "resyncing"
    } else {
        "optimal"
    }
}

/// Why a volume has failed: which members, and what the layout tolerates.
fn failed_reason(vol: &Volume, drives: &[String]) -> Option<String> {
    if !vol.is_failed() {
        return None;
    }
    let names: Vec<String> = vol
        .incomplete_members()
        .iter()
        .map(|&p| {
            let d = drives.get(p).map(String::as_str).unwrap_or("-");
            format!(
                "{d} (position {p}, {})",
                member_state_name(vol.member_states()[p])
            )
        })
        .collect();
    let l = vol.layout();
    Some(format!(
        "{} of {} members do not hold their data ({}), more than the {} {} tolerates: \
         reads and writes that need them fail (Unrecovered Read Error / Write Fault)",
        names.len(),
        l.members(),
        names.join(", "),
        l.parity_columns(),
        l.kind()
    ))
}

fn thin_err(e: ThinError) -> NodeError {
    match e {
        ThinError::NameTaken(_) => NodeError::Conflict(e.to_string()),
        ThinError::NoSuchVolume(_) => NodeError::NotFound(e.to_string()),
        ThinError::Config(_) | ThinError::TooManyVolumes(_) => NodeError::BadRequest(e.to_string()),
        _ => NodeError::Internal(e.to_string()),
    }
}

impl NodeState {
    /// A volume as the API shows it. A thin volume's state is its pool
    /// volume's: it is degraded when the drives under it are.
    pub fn volume_info(&self, name: &str) -> Option<VolumeInfo> {
        let e = self.volumes.get(name)?;
        let geo = e.device().geometry();
        let mut info = VolumeInfo {
            name: e.name.clone(),
            uuid: e.uuid(),
            layout: "thin".into(),
            size_bytes: geo.size_bytes(),
            block_size: geo.block_size,
            strip_bytes: 0,
            state: "optimal".into(),
            reason: None,
            generation: 0,
            members: Vec::new(),
            export: e.export.clone(),
            from_config: e.from_config,
            rebuild: RebuildInfo {
                running: false,
                members: Vec::new(),
                drives: Vec::new(),
                queued_drives: Vec::new(),
                done_stripes: 0,
                total_stripes: 0,
                percent: 0.0,
                bytes: 0,
                mb_per_sec: 0.0,
                eta_secs: None,
                last_error: None,
            },
            pool: None,
            allocated_bytes: None,
            thin_pool: None,
            jobs: self
                .jobs
                .all()
                .iter()
                .filter(|j| j.volume == e.name && j.is_running())
                .map(|j| j.info())
                .collect(),
            last_scrub: self
                .jobs
                .last(&e.name, super::jobs::JobKind::Scrub)
                .map(|j| j.info()),
            forced: e.forced.clone(),
        };
        match &e.backing {
            Backing::Drives { vol, pool } => {
                let states = vol.member_states();
                info.layout = vol.layout().kind().to_string();
                info.strip_bytes = vol.layout().strip_blocks() * u64::from(geo.block_size);
                info.state = volume_state(vol).into();
                if info.state == "optimal" && vol.unsynced_regions() > 0 {
                    info.state = "resyncing".into();
                }
                info.reason = failed_reason(vol, &e.drives);
                info.generation = vol.generation();
                info.members = states
                    .iter()
                    .enumerate()
                    .map(|(i, s)| MemberInfo {
                        position: i,
                        drive: e.drives.get(i).cloned().unwrap_or_else(|| "-".into()),
                        state: member_state_name(*s).into(),
                    })
                    .collect();
                info.rebuild = rebuild_info(vol, &e.drives, e.last_rebuild_error.clone());
                // A rebuild is on its way from the moment a drive is replaced.
                info.rebuild.running |= e.rebuild_task;
                if let Some(p) = pool {
                    let u = p.usage();
                    info.thin_pool = Some(PoolInfo {
                        cluster_bytes: u.cluster_bytes,
                        capacity_bytes: u.capacity_bytes,
                        allocated_bytes: u.allocated_bytes,
                        free_bytes: u.free_bytes,
                        provisioned_bytes: u.provisioned_bytes,
                        volumes: p.volumes().into_iter().map(|t| t.name).collect(),
                    });
                }
            }
            Backing::Thin { pool, tv } => {
                info.pool = Some(pool.clone());
                info.allocated_bytes = Some(tv.allocated_bytes());
                if let Some(pe) = self.volumes.get(pool)
                    && let Some(vol) = pe.on_drives()
                {
                    info.state = volume_state(vol).into();
                    info.reason =
                        failed_reason(vol, &pe.drives).map(|r| format!("pool {pool}: {r}"));
                }
            }
            Backing::Offline(o) => {
                info.layout = o.layout.clone();
                info.strip_bytes = o.strip_bytes;
                info.state = "offline".into();
                info.reason = Some(o.reason.clone());
                info.generation = o.generation;
                info.members = o
                    .member_states
                    .iter()
                    .enumerate()
                    .map(|(i, s)| MemberInfo {
                        position: i,
                        drive: e.drives.get(i).cloned().unwrap_or_else(|| "-".into()),
                        state: s.clone(),
                    })
                    .collect();
            }
        }
        Some(info)
    }
}

impl VolumeEntry {
    fn namespace(&self, nsid: u32) -> Namespace {
        volume_namespace(nsid, self.device(), &self.uuid())
    }
}

/// A volume's namespace: its UUID and NGUID come from the volume's UUID, so
/// every node that serves it (cluster mode) reports the same identity.
pub fn volume_namespace(nsid: u32, dev: Arc<dyn BlockDevice>, uuid: &str) -> Namespace {
    let id = uuid_bytes(uuid);
    let mut nguid = id;
    nguid[0] ^= 0x5A;
    Namespace::new(nsid, dev, id, nguid)
}

impl NodeState {
    pub(super) fn drive_info(&self, name: &str) -> Option<DriveInfo> {
        let d = self.drives.get(name)?;
        let geo = d.dev.geometry();
        let user = self.user_of(name);
        let state = match (user, d.failed) {
            (Some((v, p)), _) => {
                let failed = self.volumes.get(v).is_some_and(|e| match e.offline() {
                    Some(o) => o.member_states.get(p).is_some_and(|s| s == "failed"),
                    None => e
                        .on_drives()
                        .is_some_and(|v| v.member_states()[p] == MemberState::Failed),
                });
                if failed { "failed" } else { "member" }
            }
            (None, true) => "failed",
            (None, false) if d.export.is_some() => "exported",
            (None, false) if d.spare => "spare",
            (None, false) => "free",
        };
        Some(DriveInfo {
            name: d.name.clone(),
            backend: d.backend.clone(),
            size_bytes: geo.size_bytes(),
            block_size: geo.block_size,
            device: d.dev.describe(),
            state: state.into(),
            volume: user.map(|(v, _)| v.to_string()),
            position: user.map(|(_, p)| p),
            export: d.export.clone(),
            link: super::remote_link(d),
        })
    }

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
        let drives = req.drives.clone();
        self.undo_remotes_on_err(&drives, self.create_volume_inner(req))
            .await
    }

    async fn create_volume_inner(self: &Arc<Self>, req: CreateVolume) -> NodeResult<VolumeInfo> {
        check_name("volume", &req.name)?;
        if req.pool.is_some() {
            return self.create_thin(req).await;
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
        let cluster = match &req.cluster {
            Some(c) if !req.thin_pool => {
                return Err(NodeError::BadRequest(format!(
                    "volume {}: cluster {c:?} is for thin pools; add thin_pool or remove cluster",
                    req.name
                )));
            }
            Some(c) => size_arg("cluster", c)?,
            None => DEFAULT_CLUSTER_BYTES,
        };
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
        let mut st = self.state.lock().await;
        if st.volumes.contains_key(&req.name) {
            return Err(NodeError::Conflict(format!(
                "volume {} already exists; pick another name",
                req.name
            )));
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
        let pool = if req.thin_pool {
            let pool = ThinPool::format(Arc::new(vol.clone()), cluster)
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
        let info = self.register(&mut st, entry, req.export)?;
        if let Some(vol) = st.volumes.get(&req.name).and_then(|e| e.on_drives())
            && vol.unsynced_regions() > 0
        {
            let vol = vol.clone();
            self.spawn_sync(&st, &req.name, &vol);
        }
        tracing::info!(
            "volume {}: created ({} on {:?})",
            req.name,
            kind,
            req.drives
        );
        Ok(info)
    }

    /// A thin volume in the pool on volume `req.pool`.
    async fn create_thin(&self, req: CreateVolume) -> NodeResult<VolumeInfo> {
        let pool_name = req.pool.clone().unwrap_or_default();
        if req.layout.is_some() || !req.drives.is_empty() || req.thin_pool || req.strip.is_some() {
            return Err(NodeError::BadRequest(format!(
                "volume {}: a thin volume takes a pool and a size; layout, drives, strip and \
                 thin_pool are for volumes on drives",
                req.name
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
            return Err(NodeError::Conflict(format!(
                "volume {} already exists; pick another name",
                req.name
            )));
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
        let info = self.register(&mut st, entry, req.export)?;
        tracing::info!(
            "volume {}: thin, {} in pool {pool_name}",
            req.name,
            crate::units::human_bytes(size)
        );
        Ok(info)
    }

    /// Adds a new volume to the node, exported if asked.
    fn register(
        &self,
        st: &mut NodeState,
        mut entry: VolumeEntry,
        export: Option<ExportRequest>,
    ) -> NodeResult<VolumeInfo> {
        if let Some(x) = export {
            self.export_entry(&mut entry, x)?;
        }
        let name = entry.name.clone();
        st.volumes.insert(name.clone(), entry);
        self.save_exports(st)?;
        Ok(st.volume_info(&name).expect("just inserted"))
    }

    pub(super) fn check_export_free(&self, x: &ExportRequest) -> NodeResult<()> {
        let t = self.target()?;
        let sub = t.subsystem(&x.nqn).ok_or_else(|| {
            NodeError::BadRequest(format!(
                "no subsystem {}; declare it in the node's TOML ([[subsystem]])",
                Echo(&x.nqn)
            ))
        })?;
        if sub.namespace(x.nsid).is_some() {
            return Err(NodeError::Conflict(format!(
                "subsystem {} already has namespace {}; pick another nsid",
                x.nqn, x.nsid
            )));
        }
        Ok(())
    }

    pub(super) fn export_entry(&self, e: &mut VolumeEntry, x: ExportRequest) -> NodeResult<()> {
        if let Some(o) = e.offline() {
            return Err(NodeError::Conflict(format!(
                "volume {} is offline (not assembled: {}); an offline volume is not served",
                e.name, o.reason
            )));
        }
        if e.thin_pool().is_some() {
            return Err(NodeError::Conflict(format!(
                "volume {} is a thin pool; export its thin volumes instead",
                e.name
            )));
        }
        if let Some(cur) = &e.export {
            return Err(NodeError::Conflict(format!(
                "volume {} is already exported as nsid {} of {}; unexport it first",
                e.name, cur.nsid, cur.nqn
            )));
        }
        self.target()?
            .add_namespace(&x.nqn, e.namespace(x.nsid))
            .map_err(|err| match err {
                NamespaceError::NsidInUse { .. } => NodeError::Conflict(err.to_string()),
                _ => NodeError::BadRequest(err.to_string()),
            })?;
        tracing::info!(
            "volume {}: exported as nsid {} of {}",
            e.name,
            x.nsid,
            x.nqn
        );
        e.export = Some(Export {
            nqn: x.nqn,
            nsid: x.nsid,
            from_config: false,
        });
        Ok(())
    }

    /// The device for a TOML `backend = "volume"` namespace; records the
    /// export. An offline volume's namespace is left out, with an error.
    pub async fn config_namespace(
        &self,
        volume: &str,
        nqn: &str,
        nsid: u32,
    ) -> crate::config::VolumeNamespace {
        use crate::config::VolumeNamespace;
        let mut st = self.state.lock().await;
        let Some(e) = st.volumes.get_mut(volume) else {
            return VolumeNamespace::Unknown;
        };
        if let Some(o) = e.offline() {
            return VolumeNamespace::NotServed(format!("volume {volume} is offline: {}", o.reason));
        }
        if e.thin_pool().is_some() {
            tracing::error!("volume {volume} is a thin pool; export its thin volumes instead");
            return VolumeNamespace::Unknown;
        }
        e.export = Some(Export {
            nqn: nqn.into(),
            nsid,
            from_config: true,
        });
        VolumeNamespace::Device(e.device())
    }

    pub async fn export(&self, name: &str, x: ExportRequest) -> NodeResult<VolumeInfo> {
        let mut st = self.state.lock().await;
        let e = find_volume(&mut st, name)?;
        self.export_entry(e, x)?;
        self.save_exports(&st)?;
        Ok(st.volume_info(name).expect("exists"))
    }

    /// Writes the API-made exports to the state file (atomically: a crash
    /// leaves the old file or the new one, never half of one).
    pub(super) fn save_exports(&self, st: &NodeState) -> NodeResult<()> {
        let Some(path) = &self.exports_file else {
            return Ok(());
        };
        let list: BTreeMap<&str, &Export> = st
            .volumes
            .values()
            .filter_map(|v| {
                v.export
                    .as_ref()
                    .filter(|x| !x.from_config)
                    .map(|x| (v.name.as_str(), x))
            })
            .collect();
        let text = serde_json::to_string_pretty(&list).expect("exports serialize");
        super::write_atomic(path, text.as_bytes()).map_err(|e| {
            NodeError::Internal(format!(
                "the export is made, but saving {} failed: {e}; it will not survive a restart",
                path.display()
            ))
        })
    }

    /// At start, after the TOML's exports: the API-made exports of the last run.
    pub async fn restore_exports(&self) -> anyhow::Result<()> {
        let Some(path) = &self.exports_file else {
            return Ok(());
        };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => anyhow::bail!("cannot read {}: {e}", path.display()),
        };
        let list: BTreeMap<String, Export> = serde_json::from_str(&text).map_err(|e| {
            anyhow::anyhow!(
                "{} is not an exports file ({e}); fix or remove it",
                path.display()
            )
        })?;
        let mut st = self.state.lock().await;
        for (name, x) in list {
            let Some(e) = st.volumes.get_mut(&name) else {
                tracing::warn!(
                    "{}: volume {name} is gone; not exporting it",
                    path.display()
                );
                continue;
            };
            let req = ExportRequest {
                nqn: x.nqn.clone(),
                nsid: x.nsid,
            };
            match self.export_entry(e, req) {
                Ok(()) => {}
                Err(err) => tracing::warn!("volume {name}: not exported again: {err}"),
            }
        }
        Ok(())
    }

    /// Stops serving a volume. Hosts connected to its subsystem lose the
    /// namespace (their I/O to it fails): without `force` that is refused,
    /// naming them, and nothing changes.
    pub async fn unexport(&self, name: &str, force: bool) -> NodeResult<VolumeInfo> {
        let mut st = self.state.lock().await;
        let e = find_volume(&mut st, name)?;
        let Some(x) = e.export.clone() else {
            return Err(NodeError::Conflict(format!(
                "volume {name} is not exported"
            )));
        };
        let hosts = self.target()?.hosts_connected(&x.nqn);
        if !hosts.is_empty() {
            if !force {
                return Err(NodeError::Conflict(format!(
                    "volume {name} is nsid {} of {}, to which {} connected ({}): unexporting \
                     it takes the namespace away under them, and their I/O to it fails (writes \
                     they have not flushed are lost to them). Nothing was changed; disconnect \
                     them first (nvme disconnect), or use --force (API: {{\"force\": true}})",
                    x.nsid,
                    x.nqn,
                    if hosts.len() == 1 {
                        "1 host is".to_string()
                    } else {
                        format!("{} hosts are", hosts.len())
                    },
                    hosts.join(", ")
                )));
            }
            tracing::warn!(
                "volume {name}: unexported with force while hosts {hosts:?} are connected to {}",
                x.nqn
            );
        }
        self.target()?
            .remove_namespace(&x.nqn, x.nsid)
            .map_err(|err| NodeError::Internal(err.to_string()))?;
        e.export = None;
        self.save_exports(&st)?;
        let dev = find_volume(&mut st, name)?.device();
        // Commands that were in flight on the old snapshot finish before the
        // volume is used again for anything but I/O; a flush makes them durable.
        super::flush(&*dev)
            .await
            .map_err(|err| NodeError::Internal(format!("volume {name}: flush: {err}")))?;
        tracing::info!(
            "volume {name}: no longer exported (was nsid {} of {})",
            x.nsid,
            x.nqn
        );
        Ok(st.volume_info(name).expect("exists"))
    }

    /// Deletes a volume. One that holds data (any volume on drives, a thin
    /// volume with allocated clusters) needs `force`: without it the delete
    /// is refused, saying what would be lost, and nothing changes.
    pub async fn delete_volume(&self, name: &str, force: bool) -> NodeResult<()> {
        let mut st = self.state.lock().await;
        let jobs = st.jobs.clone();
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
        if e.on_drives().is_some_and(|v| v.rebuild_progress().running) {
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
        // Its sync or scrub must not write to drives that are free again.
        jobs.stop(Some(name)).await;
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
            tracing::info!("volume {name}: deleted from pool {pool}; its clusters are free");
            return Ok(());
        }
        let e = st.volumes.remove(name).expect("found above");
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
        if let Some(vol) = e.on_drives()
            && let Err(err) = vol.close().await
        {
            tracing::warn!("volume {name}: close before delete: {err}");
        }
        for d in &e.drives {
            if let Some(dr) = st.drives.get(d)
                && let Err(err) = wipe_head(&dr.dev).await
            {
                tracing::warn!("drive {d}: wiping the superblock of deleted volume {name}: {err}");
            }
        }
        self.unclaim(&st, &e.drives).await;
        tracing::info!("volume {name}: deleted; drives {:?} are free", e.drives);
        Ok(())
    }

    pub async fn volumes(&self) -> Vec<VolumeInfo> {
        let st = self.state.lock().await;
        st.volumes
            .keys()
            .filter_map(|n| st.volume_info(n))
            .collect()
    }

    pub async fn volume(&self, name: &str) -> NodeResult<VolumeInfo> {
        let mut st = self.state.lock().await;
        find_volume(&mut st, name)?;
        Ok(st.volume_info(name).expect("exists"))
    }

    pub async fn drives(&self) -> Vec<DriveInfo> {
        let st = self.state.lock().await;
        st.drives.keys().filter_map(|n| st.drive_info(n)).collect()
    }

    pub async fn drive(&self, name: &str) -> NodeResult<DriveInfo> {
        let st = self.state.lock().await;
        st.drive_info(name).ok_or_else(|| no_drive(name))
    }
}

/// What a volume holds that a delete would lose, in words; None when it
/// holds nothing (a thin volume never written). A volume on drives keeps no
/// record of having been written, so it counts as holding data.
fn data_held(e: &VolumeEntry) -> Option<String> {
    let size = |b: u64| crate::units::human_bytes(b);
    match &e.backing {
        Backing::Thin { tv, .. } => {
            let a = tv.allocated_bytes();
            (a > 0).then(|| {
                format!(
                    "{} written of {}",
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

pub(super) fn find_volume<'a>(
    st: &'a mut NodeState,
    name: &str,
) -> NodeResult<&'a mut VolumeEntry> {
    st.volumes.get_mut(name).ok_or_else(|| {
        NodeError::NotFound(format!(
            "no volume {}; list them with `flashpool volume list`",
            Echo(name)
        ))
    })
}

pub(super) fn no_drive(name: &str) -> NodeError {
    NodeError::NotFound(format!(
        "no drive {}; list them with `flashpool drive list`",
        Echo(name)
    ))
}

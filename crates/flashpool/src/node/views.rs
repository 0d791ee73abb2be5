//! What the API shows of volumes and drives: their state, members,
//! rebuild progress and exports, read under the node's state lock.

use volume::{MemberState, Volume};

use super::ops::{DriveInfo, MemberInfo, PoolExtentInfo, PoolInfo, RebuildInfo, VolumeInfo};
use super::validate::{find_volume, no_drive};
use super::{Backing, Node, NodeResult, NodeState};

pub(crate) fn member_state_name(s: MemberState) -> &'static str {
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

impl NodeState {
    /// A volume as the API shows it. A thin volume's state is its pool
    /// volume's: it is degraded when the drives under it are.
    /// The name of the thin pool with UUID `uuid` (the UUID itself when
    /// the node has no such pool open).
    fn pool_named(&self, uuid: &str) -> String {
        self.volumes
            .values()
            .find(|e| e.thin_pool().is_some_and(|p| p.uuid() == uuid))
            .map_or_else(|| uuid.to_string(), |e| e.name.clone())
    }

    /// The volume holding extent `uuid`.
    fn extent_volume(&self, uuid: &str) -> Option<String> {
        self.volumes
            .values()
            .find(|e| e.extent.as_ref().is_some_and(|x| x.extent == uuid))
            .map(|e| e.name.clone())
    }

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
            encrypted: false,
            reason: None,
            generation: 0,
            members: Vec::new(),
            export: e.export.clone(),
            from_config: e.from_config,
            rebuild: RebuildInfo::default(),
            pool: None,
            allocated_bytes: None,
            snapshot: false,
            parent: None,
            shared_bytes: None,
            stored_bytes: None,
            created: None,
            thin_pool: None,
            owner: None,
            ana_state: None,
            extent_of: e.extent.as_ref().map(|x| self.pool_named(&x.pool)),
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
                info.encrypted = vol.is_encrypted();
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
                        snapshots: u.snapshots,
                        hidden_snapshots: u.hidden_snapshots,
                        extents: p
                            .extents()
                            .into_iter()
                            .map(|x| PoolExtentInfo {
                                volume: self.extent_volume(&x.uuid).unwrap_or_default(),
                                uuid: x.uuid,
                                capacity_bytes: x.capacity_bytes,
                            })
                            .collect(),
                        compression: u.compression.to_string(),
                        logical_bytes: u.logical_bytes,
                        stored_bytes: u.stored_bytes,
                        pack_clusters: u.pack_clusters,
                    });
                }
            }
            Backing::Thin { pool, tv } => {
                let t = tv.info();
                info.pool = Some(pool.clone());
                info.allocated_bytes = Some(t.allocated_bytes);
                info.snapshot = t.snapshot;
                info.parent = t.parent;
                info.shared_bytes = Some(t.shared_bytes);
                info.stored_bytes = Some(t.stored_bytes);
                info.created = (t.created > 0).then_some(t.created);
                if let Some(pe) = self.volumes.get(pool)
                    && let Some(vol) = pe.on_drives()
                {
                    info.state = volume_state(vol).into();
                    info.encrypted = vol.is_encrypted();
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

impl NodeState {
    pub(crate) fn drive_info(&self, name: &str) -> Option<DriveInfo> {
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
}

impl Node {
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

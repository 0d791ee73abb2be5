//! Finding volumes on drives: at start on every drive the node has, and on
//! request (`POST /v1/volumes/assemble`) from a list of drives, local or
//! remote. A volume's superblocks, bitmap and journal live on its members,
//! so any node that reaches the drives can assemble it; the reservation on
//! remote members says which node owns it.

use std::collections::BTreeMap;
use std::sync::Arc;

use blockdev::BlockDevice;
use serde::Deserialize;
use volume::superblock::Superblock;
use volume::thin::ThinPool;
use volume::{MemberState, Volume};

use super::ops::{ExportRequest, VolumeInfo};
use super::{Backing, Node, NodeError, NodeResult, NodeState, VolumeEntry, read_head, wipe_head};

/// `POST /v1/volumes/assemble`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssembleVolume {
    /// The volume's drives, in any order (`peer:drive`, URLs or local names).
    pub drives: Vec<String>,
    /// Preempt another node's reservation on the remote members (and abort
    /// its writes): for a volume whose owner is gone or must be deposed.
    #[serde(default)]
    pub takeover: bool,
    /// Serve it at once as this namespace.
    #[serde(default)]
    pub export: Option<ExportRequest>,
}

/// Drives of one volume, by position, as their superblocks say.
struct Found {
    newest: Superblock,
    chosen: BTreeMap<u16, String>,
}

impl Node {
    /// At start: reads every drive's superblock, groups drives by volume,
    /// and assembles each volume. A drive that lost its position to a newer
    /// one (it was replaced) is left alone, and wiped, with a warning. A
    /// volume that cannot be assembled (too many members missing, owned by
    /// another node) is left out with an error in the log; the others run.
    pub async fn assemble_found(self: &Arc<Self>) -> anyhow::Result<()> {
        let mut st = self.state.lock().await;
        let names: Vec<String> = st
            .drives
            .iter()
            .filter(|(_, d)| d.export.is_none())
            .map(|(n, _)| n.clone())
            .collect();
        for f in group_by_volume(&st, &names).await {
            let name = f.newest.name.clone();
            if let Err(e) = self.assemble_group(&mut st, f, false).await {
                tracing::error!("volume {name:?}: not assembled: {e}");
            }
        }
        Ok(())
    }

    /// Assembles the volume on `req.drives` (opening the remote ones), e.g.
    /// on a node that takes over a volume whose owner died.
    pub async fn assemble_volume(self: &Arc<Self>, req: AssembleVolume) -> NodeResult<VolumeInfo> {
        let drives = req.drives.clone();
        self.undo_remotes_on_err(&drives, self.assemble_volume_inner(req))
            .await
    }

    async fn assemble_volume_inner(
        self: &Arc<Self>,
        req: AssembleVolume,
    ) -> NodeResult<VolumeInfo> {
        let mut st = self.state.lock().await;
        self.open_named_remotes(&mut st, &req.drives).await?;
        for d in &req.drives {
            if !st.drives.contains_key(d) {
                return Err(NodeError::BadRequest(format!(
                    "drive {} does not exist; list the drives with `flashpool drive list`",
                    crate::echo::Echo(d)
                )));
            }
            if let Some((v, _)) = st.user_of(d) {
                return Err(NodeError::Conflict(format!(
                    "drive {d} is already in volume {v} on this node"
                )));
            }
        }
        let mut groups = group_by_volume(&st, &req.drives).await;
        let f = match groups.len() {
            1 => groups.remove(0),
            0 => {
                return Err(NodeError::BadRequest(format!(
                    "no volume superblock on drives {:?}; they hold no volume",
                    req.drives
                )));
            }
            _ => {
                return Err(NodeError::BadRequest(format!(
                    "drives {:?} hold {} different volumes ({}); assemble one at a time",
                    req.drives,
                    groups.len(),
                    groups
                        .iter()
                        .map(|g| g.newest.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        };
        if let Some(x) = &req.export {
            self.check_export_free(x)?;
        }
        let name = self.assemble_group(&mut st, f, req.takeover).await?;
        if let Some(x) = req.export {
            let e = st.volumes.get_mut(&name).expect("just assembled");
            self.export_entry(e, x)?;
            self.save_exports(&st)?;
        }
        Ok(st.volume_info(&name).expect("exists"))
    }

    /// Claims the remote members, assembles, opens a thin pool on it, and
    /// enters the volume; resumes an interrupted rebuild. Returns its name.
    async fn assemble_group(
        self: &Arc<Self>,
        st: &mut NodeState,
        f: Found,
        takeover: bool,
    ) -> NodeResult<String> {
        let Found { newest, chosen } = f;
        let drive_names: Vec<String> = chosen.values().cloned().collect();
        // Before any write: the superblocks are written at assembly.
        self.claim(st, &drive_names, takeover).await?;
        let n = newest.members.len();
        let members: Vec<Arc<dyn BlockDevice>> =
            chosen.values().map(|d| st.drives[d].dev.clone()).collect();
        let vol = Volume::assemble(members).await.map_err(|e| {
            NodeError::Conflict(format!(
                "volume {:?} on drives {drive_names:?}: {e}",
                newest.name
            ))
        })?;
        let mut name = vol.name();
        if name.is_empty() || st.volumes.contains_key(&name) {
            name = format!("vol-{}", &vol.uuid()[..8]);
        }
        let drives = (0..n)
            .map(|p| {
                chosen
                    .get(&(p as u16))
                    .cloned()
                    .unwrap_or_else(|| "-".into())
            })
            .collect();
        for d in chosen.values() {
            if let Some(dr) = st.drives.get_mut(d) {
                dr.fresh = false;
            }
        }
        tracing::info!("volume {name}: assembled on {drive_names:?}");
        let resume = vol
            .member_states()
            .iter()
            .any(|s| matches!(s, MemberState::Rebuilding { .. }));
        let as_dev: Arc<dyn BlockDevice> = Arc::new(vol.clone());
        let pool = if ThinPool::is_pool(&as_dev).await {
            let p = ThinPool::open(as_dev)
                .await
                .map_err(|e| NodeError::Internal(format!("volume {name}: its thin pool: {e}")))?;
            for t in p.volumes() {
                let Some(tv) = p.volume(&t.name) else {
                    continue;
                };
                if st.volumes.contains_key(&t.name) {
                    tracing::warn!(
                        "thin volume {} in pool {name}: another volume has that name; not served",
                        t.name
                    );
                    continue;
                }
                tracing::info!("thin volume {} found in pool {name}", t.name);
                st.volumes.insert(
                    t.name.clone(),
                    VolumeEntry::new(
                        &t.name,
                        Backing::Thin {
                            pool: name.clone(),
                            tv,
                        },
                        Vec::new(),
                        None,
                    ),
                );
            }
            Some(p)
        } else {
            None
        };
        st.volumes.insert(
            name.clone(),
            VolumeEntry::new(&name, Backing::Drives { vol, pool }, drives, None),
        );
        if resume {
            tracing::info!("volume {name}: resuming the rebuild that was interrupted");
            self.spawn_rebuild(st, &name);
        }
        Ok(name)
    }
}

/// Reads the superblocks of `names` and groups the drives by volume, one
/// drive per position (the newest claim wins; an older one is wiped).
async fn group_by_volume(st: &NodeState, names: &[String]) -> Vec<Found> {
    let mut groups: BTreeMap<[u8; 16], Vec<(String, Superblock)>> = BTreeMap::new();
    for name in names {
        let Some(d) = st.drives.get(name) else {
            continue;
        };
        let head = match read_head(&d.dev).await {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!("drive {name}: cannot read its superblock: {e}");
                continue;
            }
        };
        if let Ok(sb) = Superblock::decode(&head) {
            groups.entry(sb.uuid).or_default().push((name.clone(), sb));
        }
    }
    let mut out = Vec::new();
    for (_, mut found) in groups {
        found.sort_by_key(|(_, sb)| std::cmp::Reverse(sb.generation));
        let newest = found[0].1.clone();
        let mut chosen: BTreeMap<u16, String> = BTreeMap::new();
        for (drive, sb) in &found {
            if chosen.contains_key(&sb.position) {
                tracing::warn!(
                    "drive {drive} claims position {} of volume {:?} at generation {}, \
                     but a newer member holds it; leaving {drive} out and wiping it",
                    sb.position,
                    newest.name,
                    sb.generation
                );
                if let Some(d) = st.drives.get(drive) {
                    let _ = wipe_head(&d.dev).await;
                }
                continue;
            }
            chosen.insert(sb.position, drive.clone());
        }
        out.push(Found { newest, chosen });
    }
    out
}

//! The way back (md's `--re-add` and `--assemble --force`): a failed drive
//! put back into its volume, a failed spare returned to service, an offline
//! volume forced up; and the record of failed drives that keeps a failed
//! spare failed across a restart (`state_dir/failed-drives.json`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use blockdev::BlockDevice;
use serde::{Deserialize, Serialize};
use volume::{ForceReport, ForcedFrom, MemberState, Volume, VolumeError};

use super::ops::VolumeInfo;
use super::validate::{find_volume, no_drive};
use super::views::member_state_name;
use super::{AssembleVolume, Node, NodeError, NodeResult, NodeState};
pub use crate::api_types::{ForcedInfo, ForcedMemberInfo, ReAddInfo, StaleRangeInfo};

impl ForcedInfo {
    pub(super) fn new(rep: &ForceReport, drives: &[String]) -> ForcedInfo {
        let drive = |p: usize| drives.get(p).cloned().unwrap_or_else(|| "-".into());
        let members: Vec<ForcedMemberInfo> = rep
            .forced
            .iter()
            .map(|f| ForcedMemberInfo {
                position: f.position,
                drive: drive(f.position),
                was: match f.from {
                    ForcedFrom::Failed { .. } => "failed".into(),
                    ForcedFrom::Stale => "stale".into(),
                },
                failed_at: match f.from {
                    ForcedFrom::Failed { failed_at } if failed_at > 0 => Some(failed_at),
                    _ => None,
                },
                generation: f.generation,
                volume_generation: rep.volume_generation,
            })
            .collect();
        let message = if members.is_empty() {
            "nothing needed forcing: the volume assembled as it is".to_string()
        } else {
            let who = members
                .iter()
                .map(|m| {
                    format!(
                        "{} (position {}, {} at generation {} of {})",
                        m.drive, m.position, m.was, m.generation, m.volume_generation
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            let what = match (&rep.stale_ranges, &rep.unknown) {
                (Some(r), _) if r.is_empty() => {
                    "the intent bitmap records no writes while they were away".to_string()
                }
                (Some(r), _) => format!(
                    "{} bytes in {} ranges were written while they were away and may hold old \
                     data (listed in stale_ranges)",
                    rep.stale_bytes().unwrap_or(0),
                    r.len()
                ),
                (None, Some(why)) => format!("{why}: any block may hold old data"),
                (None, None) => String::new(),
            };
            format!(
                "forced back in as active: {who}; {what}. Check the file system (fsck) before \
                 trusting it{}",
                if rep.still_failed.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; positions {:?} are still failed: replace or re-add them",
                        rep.still_failed
                    )
                }
            )
        };
        ForcedInfo {
            members,
            still_failed: rep.still_failed.clone(),
            left_out: rep.left_out.clone(),
            stale_ranges: rep.stale_ranges.as_ref().map(|r| {
                r.iter()
                    .map(|s| StaleRangeInfo {
                        offset_bytes: s.offset_bytes,
                        len_bytes: s.len_bytes,
                        first_region: s.first_region,
                        regions: s.regions,
                    })
                    .collect()
            }),
            stale_bytes: rep.stale_bytes(),
            unknown: rep.unknown.clone(),
            message,
        }
    }
}

/// A failed drive as `failed-drives.json` keeps it: enough to tell a
/// different device under the same name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct FailedDrive {
    backend: String,
    #[serde(default)]
    path: Option<PathBuf>,
    size_bytes: u64,
}

impl FailedDrive {
    fn of(d: &super::Drive) -> FailedDrive {
        FailedDrive {
            backend: d.backend.clone(),
            path: d.path.clone(),
            size_bytes: d.dev.geometry().size_bytes(),
        }
    }
}

fn read_failed_file(path: &std::path::Path) -> BTreeMap<String, FailedDrive> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).unwrap_or_else(|e| {
            tracing::error!(
                "{}: not a failed-drives file ({e}); no drive is marked failed from it",
                path.display()
            );
            BTreeMap::new()
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
        Err(e) => {
            tracing::error!("{}: {e}; no drive is marked failed from it", path.display());
            BTreeMap::new()
        }
    }
}

/// At start: marks the drives `failed-drives.json` names failed again, when
/// they are the same device (backend, path, size); a different device under
/// the name is not, with a warning.
pub(super) fn load_failed_drives(st: &mut NodeState, dir: Option<&std::path::Path>) {
    let Some(dir) = dir else { return };
    let path = dir.join(FAILED_DRIVES_FILE);
    for (name, rec) in read_failed_file(&path) {
        let Some(d) = st.drives.get_mut(&name) else {
            continue;
        };
        if FailedDrive::of(d) == rec {
            tracing::warn!(
                "drive {name}: failed before the restart; it stays failed until re-added"
            );
            d.failed = true;
        } else {
            tracing::warn!(
                "drive {name}: {} records a failed drive of that name ({:?}), but this is \
                 another device ({:?}); not marking it failed",
                path.display(),
                rec,
                FailedDrive::of(d)
            );
        }
    }
}

const FAILED_DRIVES_FILE: &str = "failed-drives.json";

impl Node {
    fn failed_drives_file(&self) -> Option<PathBuf> {
        self.exports_file
            .as_ref()
            .map(|p| p.with_file_name(FAILED_DRIVES_FILE))
    }

    /// Writes which drives are failed to the state directory (atomically).
    /// Records of drives the node does not have now (a remote drive not
    /// reachable yet) are kept as they were.
    pub(super) fn save_failed_drives(&self, st: &NodeState) -> NodeResult<()> {
        let Some(path) = self.failed_drives_file() else {
            return Ok(());
        };
        let mut list: BTreeMap<String, FailedDrive> = read_failed_file(&path)
            .into_iter()
            .filter(|(n, _)| !st.drives.contains_key(n))
            .collect();
        for (n, d) in &st.drives {
            if d.failed {
                list.insert(n.clone(), FailedDrive::of(d));
            }
        }
        let text = serde_json::to_string_pretty(&list).expect("failed drives serialize");
        super::write_atomic(&path, text.as_bytes()).map_err(|e| {
            NodeError::Internal(format!(
                "saving {} failed: {e}; which drives are failed will not survive a restart",
                path.display()
            ))
        })
    }

    /// [`Node::save_failed_drives`] where the change is already made: an
    /// error is logged.
    pub(super) fn note_failed_drives(&self, st: &NodeState) {
        if let Err(e) = self.save_failed_drives(st) {
            tracing::error!("{e}");
        }
    }

    /// `drive re-add NAME`: a failed member goes back into its volume (only
    /// what it missed is resynced when the intent bitmap says what that
    /// is, else it is rebuilt in full); a failed drive in no volume is
    /// returned to service (free). Anything else is refused, unchanged.
    pub async fn re_add_drive(self: &Arc<Self>, name: &str) -> NodeResult<ReAddInfo> {
        let mut st = self.state.lock().await;
        if !st.drives.contains_key(name) {
            return Err(no_drive(name));
        }
        if st.user_of(name).is_none() {
            let d = st.drives.get_mut(name).expect("exists");
            if !d.failed {
                return Err(NodeError::Conflict(format!(
                    "drive {name} is not failed and in no volume; there is nothing to re-add"
                )));
            }
            d.failed = false;
            if let Err(e) = self.save_failed_drives(&st) {
                if let Some(d) = st.drives.get_mut(name) {
                    d.failed = true;
                }
                return Err(e);
            }
            let message = format!(
                "drive {name} is no longer marked failed: it is free (its contents are as they \
                 were; a volume made on it overwrites them)"
            );
            tracing::info!("{message}");
            return Ok(ReAddInfo {
                drive: name.into(),
                state: "free".into(),
                volume: None,
                position: None,
                rebuild: "none".into(),
                stale_regions: 0,
                stale_stripes: 0,
                reason: None,
                message,
            });
        }
        self.re_add_member(&mut st, name, false).await
    }

    /// Puts drive `name` back at its failed position (the operator's
    /// `re-add`, and a remote drive whose link came back) and starts the
    /// resync. Every refusal is decided before anything changes.
    ///
    /// With `distrusted` (a member left out at a takeover, `degraded.rs`),
    /// the last owner's reservation on it is preempted, and a device that
    /// another owner wrote since is rebuilt in full rather than refused.
    pub(super) async fn re_add_member(
        self: &Arc<Self>,
        st: &mut NodeState,
        name: &str,
        distrusted: bool,
    ) -> NodeResult<ReAddInfo> {
        let Some((v, p)) = st.user_of(name).map(|(v, p)| (v.to_string(), p)) else {
            return Err(NodeError::Conflict(format!(
                "drive {name} is in no volume; nothing to re-add it to"
            )));
        };
        let e = &st.volumes[&v];
        if let Some(o) = e.offline() {
            return Err(NodeError::Conflict(format!(
                "drive {name} holds position {p} of volume {v}, which is offline ({}); nothing \
                 runs to re-add it to. Assemble the volume (flashpool volume assemble {v}, with \
                 --force if it has too few members)",
                o.reason
            )));
        }
        let vol = e.on_drives().expect("drive users are on drives").clone();
        if vol.is_fenced() {
            return Err(NodeError::Conflict(format!(
                "volume {v} is fenced ({}); this node no longer owns it, so nothing is re-added",
                vol.fence_reason().unwrap_or_default()
            )));
        }
        let state = vol.member_states()[p];
        if state != MemberState::Failed {
            return Err(NodeError::Conflict(format!(
                "drive {name} is {} at position {p} of volume {v}, not failed; only a failed \
                 member can be re-added",
                member_state_name(state)
            )));
        }
        if vol.layout().parity_columns() == 0 {
            return Err(NodeError::Conflict(format!(
                "volume {v} is {}: it has no redundancy to resync drive {name} from, so it \
                 cannot be re-added; nothing was changed (its data is lost unless the drive \
                 comes back as it was: delete and recreate the volume, or restore from backup)",
                vol.layout().kind()
            )));
        }
        let dev = st.drives[name].dev.clone();
        self.claim(st, &[name.to_string()], distrusted).await?;
        let rep = if distrusted {
            vol.re_add_distrusted(p, dev).await
        } else {
            vol.re_add(p, dev).await
        };
        let rep = rep.map_err(|err| match err {
            VolumeError::ReAddRefused { .. } | VolumeError::Fenced(_) | VolumeError::Busy(_) => {
                NodeError::Conflict(format!(
                    "volume {v}: drive {name}: {err}; nothing was changed"
                ))
            }
            _ => NodeError::Internal(format!("volume {v}: re-add of drive {name}: {err}")),
        })?;
        if let Some(d) = st.drives.get_mut(name) {
            d.failed = false;
        }
        self.note_failed_drives(st);
        let message = if rep.full_rebuild {
            format!(
                "volume {v}: drive {name} is back at position {p} and is rebuilt in full: {}",
                rep.reason
                    .as_deref()
                    .unwrap_or("no record of what it missed")
            )
        } else {
            format!(
                "volume {v}: drive {name} is back at position {p}; resyncing the {} stripes of \
                 the {} regions written while it was away",
                rep.stale_stripes, rep.stale_regions
            )
        };
        if rep.full_rebuild {
            tracing::warn!("{message}");
        } else {
            tracing::info!("{message}");
        }
        self.spawn_rebuild(st, &v);
        Ok(ReAddInfo {
            drive: name.into(),
            state: "member".into(),
            volume: Some(v),
            position: Some(p),
            rebuild: if rep.full_rebuild {
                "full-rebuild".into()
            } else {
                "resync".into()
            },
            stale_regions: rep.stale_regions,
            stale_stripes: rep.stale_stripes,
            reason: rep.reason,
            message,
        })
    }

    /// `POST /v1/volumes/{name}/assemble`: assembles an offline volume from
    /// the drives its entry records; with `force`, as `assemble --force`.
    pub async fn assemble_by_name(
        self: &Arc<Self>,
        name: &str,
        force: bool,
    ) -> NodeResult<VolumeInfo> {
        let drives: Vec<String> = {
            let mut st = self.state.lock().await;
            let e = find_volume(&mut st, name)?;
            if e.offline().is_none() {
                return Err(NodeError::Conflict(format!(
                    "volume {name} is assembled already; only an offline volume is assembled \
                     again"
                )));
            }
            e.drives
                .iter()
                .filter(|d| d.as_str() != "-")
                .cloned()
                .collect()
        };
        if drives.is_empty() {
            return Err(NodeError::Conflict(format!(
                "volume {name} has none of its drives on this node; nothing to assemble"
            )));
        }
        self.assemble_volume(AssembleVolume {
            drives,
            takeover: false,
            export: None,
            force,
            only: None,
        })
        .await
    }
}

/// What `--force` would do, for a refusal: which drives it would take back
/// and what that risks. Reads superblocks only.
pub(super) async fn force_hint(members: &[Arc<dyn BlockDevice>], drives: &[String]) -> String {
    match Volume::force_preview(members).await {
        Ok(f) if !f.is_empty() => format!(
            ". Nothing was changed. With --force (API: {{\"force\": true}}) the node would take \
             back {} as active; blocks written while they were away may then hold old data \
             (the answer lists the ranges the intent bitmap records), so check the file system \
             (fsck) afterwards",
            f.iter()
                .map(|m| format!(
                    "{} (position {}, {} at generation {})",
                    drives.get(m.index).map(String::as_str).unwrap_or("-"),
                    m.position,
                    match m.from {
                        ForcedFrom::Failed { .. } => "failed",
                        ForcedFrom::Stale => "stale",
                    },
                    m.generation
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Ok(_) => ". Nothing was changed".into(),
        Err(e) => format!(". Nothing was changed; --force cannot help either: {e}"),
    }
}

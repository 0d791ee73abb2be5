//! `drive replace` of a cluster volume's member (or of a cluster pool's
//! extent's member), by the volume's owner (any other node passes the
//! request on), in three steps that leave the volume assemblable by the
//! next owner whenever the owner dies:
//!
//! 1. The spec lists the new drive as `joining` (etcd, guarded by the
//!    owner's epoch). An owner opens joining drives beside the members, and
//!    each position goes to the newest superblock claiming it: the new
//!    drive holds none yet, so the old member keeps its place.
//! 2. The owner's node replaces the member as on a node alone (fails the
//!    old one, writes the new drive's superblock at a newer generation,
//!    wipes the old one, rebuilds in the background). From here on the new
//!    drive wins the position at any assembly.
//! 3. The spec names the new drive in the member's place.
//!
//! A replace the node refuses takes the joining entry back out; if that
//! write fails, the entry is harmless (the blank drive claims nothing).
//! An owner assembles with `only` its volume's name, so a joining drive
//! that still holds an old volume's superblock is left out, not an error.

use std::sync::Arc;

use cluster::{ClusterError, VolumeSpec};

use super::Agent;
use super::etcd;
use super::pools::spec_error;
use crate::node::{NodeError, NodeResult, VolumeInfo};

/// Where a drive's URL sits in the cluster's specs.
struct Place {
    /// The cluster volume (or pool) whose owner runs it.
    spec: VolumeSpec,
    /// The extent it belongs to, by index into `spec.extents`; None: the
    /// volume's own members.
    extent: Option<usize>,
    position: usize,
}

impl Place {
    /// The member `url` is, in any spec.
    fn find(specs: &[VolumeSpec], url: &str) -> Option<Place> {
        specs.iter().find_map(|spec| {
            if let Some(position) = spec.drives.iter().position(|d| d == url) {
                return Some(Place {
                    spec: spec.clone(),
                    extent: None,
                    position,
                });
            }
            let (x, position) = spec
                .extents
                .iter()
                .enumerate()
                .find_map(|(x, e)| Some((x, e.drives.iter().position(|d| d == url)?)))?;
            Some(Place {
                spec: spec.clone(),
                extent: Some(x),
                position,
            })
        })
    }

    /// The volume the node runs: the cluster volume, or the extent.
    fn volume(&self) -> &str {
        match self.extent {
            None => &self.spec.name,
            Some(x) => &self.spec.extents[x].name,
        }
    }

    fn joining(&self) -> &[String] {
        match self.extent {
            None => &self.spec.joining,
            Some(x) => &self.spec.extents[x].joining,
        }
    }

    /// `spec` changed in this place's drive lists by `f(drives, joining)`.
    fn edit(
        &self,
        spec: &VolumeSpec,
        f: impl FnOnce(&mut Vec<String>, &mut Vec<String>),
    ) -> VolumeSpec {
        let mut s = spec.clone();
        match self.extent {
            None => f(&mut s.drives, &mut s.joining),
            Some(x) => {
                let e = &mut s.extents[x];
                f(&mut e.drives, &mut e.joining)
            }
        }
        s
    }
}

impl Agent {
    /// `POST /v1/drives/{name}/replace` for a member of a cluster volume:
    /// done by the volume's owner (another node passes the request on), in
    /// the steps the module's comment gives. `None` when no cluster volume
    /// has the drive (a node's own drive is replaced as on a node alone).
    /// A refused replace changes nothing.
    pub async fn replace_drive(
        self: &Arc<Self>,
        name: &str,
        with: &str,
    ) -> NodeResult<Option<VolumeInfo>> {
        let c = self.node.cluster();
        let Ok(url) = c.resolve(name) else {
            return Ok(None);
        };
        let s = self.session();
        let specs = s.specs().await.map_err(etcd)?;
        let Some(place) = Place::find(&specs, &url) else {
            if let Some(v) = specs.iter().find(|v| v.holder_of(&url).is_some()) {
                // Only listed as joining: a replace of v's under way or cut
                // short, which the spec does not place yet.
                return Err(NodeError::Conflict(format!(
                    "drive {name} is joining cluster volume {} (a replace under way or cut \
                     short); finish that replace first by asking for it again (`flashpool \
                     drive replace OLD --with {name}`); nothing was changed",
                    v.name
                )));
            }
            return Ok(None);
        };
        let volume = place.spec.name.clone();
        let owner = s.owner(&volume).await.map_err(etcd)?.ok_or_else(|| {
            NodeError::Conflict(format!(
                "cluster volume {volume} has no owner right now (a takeover is under way); retry"
            ))
        })?;
        if owner.node != s.node() {
            let (n, w) = (name.to_string(), with.to_string());
            let v = self
                .on_owner(&s, &owner.node, move |api, at| {
                    api.replace_drive(at, &n, &w)
                })
                .await?;
            return Ok(Some(v));
        }
        let with_url = c.resolve(with).map_err(|e| {
            NodeError::BadRequest(format!(
                "{e} (a cluster volume's member is replaced by a remote drive only); nothing \
                 was changed"
            ))
        })?;
        // A drive this place was already putting in (a replace cut short)
        // may be asked for again; any other in a spec is taken.
        let again = place.joining().contains(&with_url);
        // Taken until the spec lists it, and the specs read again under it:
        // no create, grow or other replace can take it meanwhile
        // (`cluster/src/drives.rs`).
        super::with_drives(&s, std::slice::from_ref(&with_url), &volume, async {
            let specs = s.specs().await.map_err(etcd)?;
            if !again && let Some(v) = specs.iter().find(|v| v.holder_of(&with_url).is_some()) {
                return Err(NodeError::Conflict(format!(
                    "drive {with} is a member of {} already; nothing was changed",
                    v.name
                )));
            }
            let served_here = {
                let served = self.served.lock().await;
                served
                    .get(&volume)
                    .is_some_and(|sv| sv.epoch == Some(owner.epoch))
            };
            if !served_here {
                return Err(NodeError::Conflict(format!(
                    "cluster volume {volume} is not served here yet; retry"
                )));
            }
            // The node's own name for the member (the name it opened it by), or
            // `-` where no drive holds the position (a replace cut short whose
            // old drive is gone).
            let run = place.volume().to_string();
            let member = self
                .node
                .volume(&run)
                .await?
                .members
                .get(place.position)
                .map(|m| m.drive.clone())
                .ok_or_else(|| {
                    NodeError::Internal(format!("volume {run} has no position {}", place.position))
                })?;
            // 1. Recorded as joining.
            let joined = place.edit(&place.spec, |_, j| {
                if !j.contains(&with_url) {
                    j.push(with_url.clone());
                }
            });
            if joined != place.spec {
                s.update_spec(&place.spec, &joined, owner.epoch)
                    .await
                    .map_err(|e| {
                        spec_error(
                            e,
                            &format!("cluster volume {volume}"),
                            &format!("recording drive {with}"),
                        )
                    })?;
            }
            // 2. Replaced by the node.
            let with_name = self.names_of(std::slice::from_ref(&with_url)).remove(0);
            // Asked again, a deposed owner may hold the drive's reservation from
            // its own try: the drive is this volume's (the spec says so), so it
            // is preempted.
            let res = if member == with_name {
                // Put in already (a replace cut short after its node's step):
                // only the record is left to finish.
                self.node.volume(&run).await
            } else if member == "-" {
                self.node
                    .replace_missing(&run, place.position, &with_name, again)
                    .await
            } else {
                self.node.replace_drive_as(&member, &with_name, again).await
            };
            let mut v = match res {
                Ok(v) => v,
                Err(e) => {
                    // Not taken back where the drive got the position all the
                    // same (an error after its superblock was written).
                    let placed = self.node.volume(&run).await.is_ok_and(|v| {
                        v.members
                            .get(place.position)
                            .is_some_and(|m| m.drive == with_name)
                    });
                    if joined != place.spec
                        && !placed
                        && let Err(back) = s.update_spec(&joined, &place.spec, owner.epoch).await
                    {
                        tracing::warn!(
                            "cluster volume {volume}: the replace of {name} was refused ({e}); {with} \
                             stays listed as joining ({back}), which claims no position"
                        );
                    }
                    return Err(e);
                }
            };
            // 3. In the member's place: over the spec as it is now (another
            // change, an extent, may have come between), once more if it moved.
            let mut recorded = Err(ClusterError::Deposed {
                volume: volume.clone(),
                epoch: owner.epoch,
            });
            for _ in 0..2 {
                let Some(now) = s.spec(&volume).await.map_err(etcd)? else {
                    break;
                };
                let done = place.edit(&now, |d, j| {
                    d[place.position] = with_url.clone();
                    j.retain(|x| *x != with_url);
                });
                recorded = s.update_spec(&now, &done, owner.epoch).await;
                if recorded.is_ok() {
                    if let Some(sv) = self.served.lock().await.get_mut(&volume) {
                        sv.spec.drives = done.drives;
                        sv.spec.joining = done.joining;
                        sv.spec.extents = done.extents;
                    }
                    break;
                }
            }
            if let Err(e) = recorded {
                // The new drive holds the position at a newer generation: every
                // owner assembles from it while it is listed as joining.
                return Err(NodeError::Unavailable(format!(
                    "cluster volume {volume}: {with} replaced {name} and is being rebuilt, but the \
                     spec still lists it as joining ({e}); owners assemble from it all the same. \
                     Ask for the replace again to finish the record"
                )));
            }
            if place.extent.is_none() {
                v.owner = Some(self.name().to_string());
            }
            Ok(Some(v))
        })
        .await
    }
}

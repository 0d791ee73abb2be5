//! `drive replace` of a cluster volume's member (or of a cluster pool's
//! extent's member): the volume's spec in etcd names the new drive before
//! the owner puts it in place, so every later takeover and move assembles
//! the volume from the drive that holds its data, not from the one taken
//! out (wiped by the replace, or dead).
//!
//! Recorded first: a replace cut short (its owner dies in between) leaves a
//! spec that names a blank drive at that position, which a takeover leaves
//! out as it does an unreachable member (the volume runs degraded within
//! its tolerance, and the replace can be asked again). The other order
//! would leave the spec naming the wiped drive and the new member unknown
//! to every other node. A replace the owner's node refuses puts the old
//! spec back.

use std::sync::Arc;

use cluster::{ClusterError, VolumeSpec};

use super::Agent;
use super::pools::etcd;
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
    fn find(specs: Vec<VolumeSpec>, url: &str) -> Option<Place> {
        specs.into_iter().find_map(|spec| {
            if let Some(position) = spec.drives.iter().position(|d| d == url) {
                return Some(Place {
                    spec,
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
                spec,
                extent: Some(x),
                position,
            })
        })
    }

    /// The spec with `url` in this place.
    fn with(&self, url: &str) -> VolumeSpec {
        let mut s = self.spec.clone();
        match self.extent {
            None => s.drives[self.position] = url.to_string(),
            Some(x) => s.extents[x].drives[self.position] = url.to_string(),
        }
        s
    }
}

impl Agent {
    /// `POST /v1/drives/{name}/replace` for a member of a cluster volume:
    /// done by the volume's owner (another node passes the request on),
    /// with the spec in etcd updated first (see the module's comment).
    /// `None` when no cluster volume has the drive (a node's own drive is
    /// replaced as on a node alone). A refused replace changes nothing.
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
        let Some(place) = Place::find(specs.clone(), &url) else {
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
        if let Some(holder) = Place::find(specs, &with_url) {
            return Err(NodeError::Conflict(format!(
                "drive {with} is a member of {} already; nothing was changed",
                holder.spec.name
            )));
        }
        // The map is held only for this check and to note the new spec, not
        // across the replace, which connects to the new drive: no other
        // volume's takeover waits for it. (A settle meanwhile takes the
        // spec's drives from etcd as well.)
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
        let new = place.with(&with_url);
        s.update_spec(&place.spec, &new, owner.epoch)
            .await
            .map_err(|e| match e {
                ClusterError::Deposed { .. } => NodeError::Conflict(format!(
                    "cluster volume {volume}: its spec changed in etcd meanwhile, or this node \
                     no longer owns it; nothing was changed, retry"
                )),
                e => NodeError::Unavailable(format!(
                    "cluster volume {volume}: recording drive {with} in place of {name} in \
                     etcd: {e}; nothing was changed"
                )),
            })?;
        // The node knows its members by the names the owner opened them by.
        let names = self.names_of(&[url, with_url]);
        match self.node.replace_drive(&names[0], &names[1]).await {
            Ok(mut v) => {
                if let Some(sv) = self.served.lock().await.get_mut(&volume) {
                    sv.spec.drives = new.drives;
                    sv.spec.extents = new.extents;
                }
                if place.extent.is_none() {
                    v.owner = Some(self.name().to_string());
                }
                Ok(Some(v))
            }
            Err(e) => {
                if let Err(back) = s.update_spec(&new, &place.spec, owner.epoch).await {
                    tracing::warn!(
                        "cluster volume {volume}: the replace of {name} was refused ({e}), and \
                         its spec still names {with} ({back}): the next owner finds {with} \
                         blank and runs the volume without that position until it is replaced"
                    );
                }
                Err(e)
            }
        }
    }
}

//! The cluster's management calls: status, planned moves, drains, and the
//! reachability probe a move asks of its target node first (create and
//! delete: `lifecycle.rs`). Each call validates everything before it
//! changes anything: a refused call changes nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cluster::{ClusterError, Handoff, Session, VolumeSpec, VolumeState};

use super::Agent;
use super::etcd;
use crate::api_types::{
    ClusterStatus, DrainResult, ExtentStatus, MoveResult, NodeStatus, VolumeStatus,
};
use crate::client::{PeerApi, PeerError};
use crate::node::{NodeError, NodeResult, VolumeInfo};

/// A volume's state in one word from the member states its owner recorded.
fn state_word(st: &VolumeState) -> &'static str {
    if st.members.iter().all(|m| m == "active") {
        "optimal"
    } else if st
        .members
        .iter()
        .any(|m| m == "rebuilding" || m == "resyncing")
    {
        "rebuilding"
    } else {
        "degraded"
    }
}

impl Agent {
    /// Fills in how a cluster volume is exported: the agent serves it
    /// through its switch device, not through the node's own export.
    pub async fn annotate(&self, v: &mut VolumeInfo) {
        if v.export.is_some() {
            return;
        }
        let served = self.served.lock().await;
        if let Some(sv) = served.get(&v.name) {
            v.export = (!sv.spec.thin_pool).then(|| crate::node::Export {
                nqn: sv.spec.nqn.clone(),
                nsid: sv.spec.nsid,
                from_config: false,
            });
        } else if let Some((sv, t)) = v
            .pool
            .as_ref()
            .and_then(|p| served.get(p))
            .and_then(|sv| Some((sv, sv.thins.get(&v.name)?)))
            .filter(|(_, t)| t.spec.nsid != 0)
        {
            v.export = Some(crate::node::Export {
                nqn: sv.spec.nqn.clone(),
                nsid: t.spec.nsid,
                from_config: false,
            });
        }
    }

    pub async fn status(&self) -> NodeResult<ClusterStatus> {
        let s = self.session();
        let nodes = s.nodes().await.map_err(etcd)?;
        let draining = s.draining().await.map_err(etcd)?;
        let mut ns = Vec::new();
        for n in nodes {
            ns.push(NodeStatus {
                ttl_left_s: s.lease_ttl_left(n.lease).await.ok().flatten(),
                draining: draining.contains(&n.name),
                portals: n
                    .portals
                    .iter()
                    .map(|p| format!("{}:{}", p.traddr, p.trsvcid))
                    .collect(),
                name: n.name,
                slot: n.slot,
                lease: format!("{:#x}", n.lease),
                api: n.api,
            });
        }
        let mut vs = Vec::new();
        // One range read for every volume's keys (not three reads each).
        for rec in s.volumes().await.map_err(etcd)? {
            let cluster::VolumeRecord {
                spec,
                owner,
                state: st,
                handoff,
            } = rec;
            let state = match (&owner, &st) {
                _ if spec.deleting => "deleting".to_string(),
                (None, _) => "unowned".to_string(),
                (Some(_), Some(st)) => state_word(st).to_string(),
                (Some(_), None) => "unknown".to_string(),
            };
            vs.push(VolumeStatus {
                owner: owner.as_ref().map(|o| o.node.clone()),
                epoch: owner.as_ref().map(|o| o.epoch),
                generation: st.as_ref().map(|s| s.generation),
                state,
                handoff: handoff.map(|h| h.to),
                nqn: spec.nqn,
                nsid: spec.nsid,
                ana_group: spec.ana_group,
                drives: spec.drives,
                joining: spec.joining,
                name: spec.name,
                note: st.map(|s| s.note).filter(|n| !n.is_empty()),
                extents: spec
                    .extents
                    .into_iter()
                    .map(|x| ExtentStatus {
                        name: x.name,
                        layout: x.layout,
                        drives: x.drives,
                        joining: x.joining,
                    })
                    .collect(),
            });
        }
        Ok(ClusterStatus {
            cluster: self.m.name.clone(),
            node: self.name().to_string(),
            nodes: ns,
            volumes: vs,
        })
    }

    /// `POST /v1/volumes/{name}/move`: a planned move to node `to`.
    pub async fn move_volume(&self, name: &str, to: &str) -> NodeResult<MoveResult> {
        let s = self.session();
        let spec = s
            .spec(name)
            .await
            .map_err(etcd)?
            .ok_or_else(|| NodeError::NotFound(format!("no cluster volume {name}")))?;
        if spec.deleting {
            return Err(NodeError::Conflict(format!(
                "cluster volume {name} is being deleted; finish that with \
                 `flashpool volume delete {name} --force`"
            )));
        }
        let owner = s.owner(name).await.map_err(etcd)?.ok_or_else(|| {
            NodeError::Conflict(format!(
                "cluster volume {name} has no owner right now (a takeover is under way); retry"
            ))
        })?;
        if owner.node == to {
            return Err(NodeError::Conflict(format!(
                "node {to} owns {name} already"
            )));
        }
        let nodes = s.nodes().await.map_err(etcd)?;
        let Some(target) = nodes.iter().find(|n| n.name == to) else {
            return Err(NodeError::BadRequest(format!(
                "node {to} is not in the cluster (live nodes: {})",
                nodes
                    .iter()
                    .map(|n| n.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        if s.draining().await.map_err(etcd)?.iter().any(|d| d == to) {
            return Err(NodeError::Conflict(format!(
                "node {to} is draining; undrain it first (flashpool node undrain {to})"
            )));
        }
        self.ask_probe(target, &spec).await?;
        let t0 = Instant::now();
        s.set_handoff(
            name,
            &Handoff {
                to: to.to_string(),
                epoch: owner.epoch,
            },
        )
        .await
        .map_err(etcd)?;
        // Answered once `to` serves it (Optimized there: the new owner
        // records `serving` at its epoch only after that), not
        // when the old owner lets go; `took_ms` is what a host sees.
        let end = t0 + MOVE_WAIT;
        loop {
            let o = s.owner(name).await.map_err(etcd)?;
            if let Some(o) = &o
                && o.node == to
                && s.state(name)
                    .await
                    .map_err(etcd)?
                    .is_some_and(|st| st.epoch == o.epoch && st.serving)
            {
                return Ok(MoveResult {
                    volume: name.to_string(),
                    from: owner.node,
                    to: to.to_string(),
                    epoch: o.epoch,
                    took_ms: t0.elapsed().as_millis() as u64,
                });
            }
            if Instant::now() > end {
                let now = match o {
                    Some(o) if o.node == to => {
                        format!(
                            "{to} owns it at epoch {} but does not serve it yet",
                            o.epoch
                        )
                    }
                    Some(o) => format!("{} owns it at epoch {}", o.node, o.epoch),
                    None => "no node owns it".into(),
                };
                return Err(NodeError::Internal(format!(
                    "the move of {name} to {to} did not finish in {} s ({now}); \
                     see `flashpool cluster status` and both nodes' logs",
                    MOVE_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Asks node `n` whether it reaches every member of `spec`.
    async fn ask_probe(&self, n: &cluster::NodeRecord, spec: &VolumeSpec) -> NodeResult<()> {
        if n.name == self.name() {
            return probe(spec).await;
        }
        let Some(api) = n.api.clone() else {
            return Err(NodeError::Conflict(format!(
                "node {} has no management API to ask whether it reaches the members",
                n.name
            )));
        };
        let vol = spec.name.clone();
        let who = n.name.clone();
        let peer_api = self
            .peer_api
            .lock()
            .clone()
            .unwrap_or_else(|| Arc::new(PeerApi::anonymous()));
        tokio::task::spawn_blocking(move || match peer_api.probe(&api, &vol) {
            Ok(_) => Ok(()),
            Err(PeerError::Unreachable(e)) => Err(NodeError::Conflict(format!(
                "node {who} ({api}) does not answer: {e}"
            ))),
            Err(PeerError::Refused(why) | PeerError::Answered { why, .. }) => {
                Err(NodeError::Conflict(format!(
                    "node {who} cannot serve {vol}: {why}; nothing changed"
                )))
            }
        })
        .await
        .map_err(|e| NodeError::Internal(e.to_string()))?
    }

    /// `POST /v1/cluster/probe/{name}`: whether this node reaches every member.
    pub async fn probe(&self, name: &str) -> NodeResult<()> {
        let spec = self
            .session()
            .spec(name)
            .await
            .map_err(etcd)?
            .ok_or_else(|| NodeError::NotFound(format!("no cluster volume {name}")))?;
        probe(&spec).await
    }

    /// `POST /v1/nodes/{node}/drain` (or undrain): waits until it owns
    /// nothing and another node serves each volume it owned.
    pub async fn drain(&self, node: &str, on: bool) -> NodeResult<DrainResult> {
        let s = self.session();
        let nodes = s.nodes().await.map_err(etcd)?;
        if on && !nodes.iter().any(|n| n.name == node) {
            return Err(NodeError::NotFound(format!(
                "node {node} is not in the cluster"
            )));
        }
        if on && nodes.len() < 2 {
            return Err(NodeError::Conflict(format!(
                "node {node} is the only node; there is nowhere to move its volumes"
            )));
        }
        s.set_drain(node, on).await.map_err(etcd)?;
        if !on {
            return Ok(DrainResult {
                node: node.to_string(),
                draining: false,
                owns: owned_by(&s, node).await.map_err(etcd)?,
            });
        }
        // Answered once another node serves each volume the drained node
        // owned (its state recorded at the new owner's epoch, which comes
        // after Optimized there), not when the drained node lets go.
        let moving: Vec<String> = owned_by(&s, node).await.map_err(etcd)?;
        let end = Instant::now() + DRAIN_WAIT;
        loop {
            let vols = s.volumes().await.map_err(etcd)?;
            let left: Vec<String> = moving
                .iter()
                .filter(|v| {
                    vols.iter().find(|r| r.spec.name == **v).is_some_and(|r| {
                        !matches!((&r.owner, &r.state), (Some(o), Some(st))
                            if o.node != node && st.epoch == o.epoch)
                    })
                })
                .cloned()
                .collect();
            let owns: Vec<String> = vols
                .iter()
                .filter(|r| r.owner.as_ref().is_some_and(|o| o.node == node))
                .map(|r| r.spec.name.clone())
                .collect();
            if left.is_empty() && owns.is_empty() {
                return Ok(DrainResult {
                    node: node.to_string(),
                    draining: true,
                    owns,
                });
            }
            if Instant::now() > end {
                let what = left
                    .iter()
                    .map(|v| {
                        let r = vols.iter().find(|r| r.spec.name == *v);
                        match r.and_then(|r| r.owner.as_ref()) {
                            Some(o) if o.node == node => format!("{v} (still on {node})"),
                            Some(o) => format!("{v} (owned by {}, not served yet)", o.node),
                            None => format!("{v} (no owner)"),
                        }
                    })
                    .chain(
                        owns.iter()
                            .filter(|v| !left.contains(v))
                            .map(|v| format!("{v} (still on {node})")),
                    )
                    .collect::<Vec<_>>();
                return Err(NodeError::Conflict(format!(
                    "node {node} is draining, but after {} s these volumes are not served \
                     elsewhere yet: {}; see `flashpool cluster status`",
                    DRAIN_WAIT.as_secs(),
                    what.join(", ")
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// How long `volume move` waits for the new owner to serve the volume.
const MOVE_WAIT: Duration = Duration::from_secs(15);
/// How long `node drain` waits for every volume to be served elsewhere.
const DRAIN_WAIT: Duration = Duration::from_secs(30);

async fn owned_by(s: &Session, node: &str) -> Result<Vec<String>, ClusterError> {
    Ok(s.volumes()
        .await?
        .into_iter()
        // a volume being deleted moves nowhere: a delete finishes it
        .filter(|r| !r.spec.deleting && r.owner.as_ref().is_some_and(|o| o.node == node))
        .map(|r| r.spec.name)
        .collect())
}

/// Whether every member's node accepts a TCP connection from here (a
/// pool's extents' members too: the pool does not open without them).
async fn probe(spec: &VolumeSpec) -> NodeResult<()> {
    let extents = spec.extents.iter().flat_map(|x| &x.drives);
    for url in spec.drives.iter().chain(extents) {
        let addr = url
            .strip_prefix("tcp://")
            .and_then(|r| r.split('/').next())
            .unwrap_or(url);
        let c = tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr))
            .await;
        match c {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                return Err(NodeError::Conflict(format!(
                    "member {url} is unreachable: {e}"
                )));
            }
            Err(_) => {
                return Err(NodeError::Conflict(format!(
                    "member {url} is unreachable: no answer in 1 s"
                )));
            }
        }
    }
    Ok(())
}

/// A 20-character serial number from the volume's UUID, the same on every node.
pub(super) fn serial_of(uuid: &str) -> String {
    let hex: String = uuid.chars().filter(|c| c.is_ascii_hexdigit()).collect();
    format!("FPC{}", &hex[..hex.len().min(17)]).to_uppercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(drives: Vec<String>) -> VolumeSpec {
        VolumeSpec {
            name: "v".into(),
            uuid: "00112233-4455-6677-8899-aabbccddeeff".into(),
            nqn: "nqn.x:y".into(),
            nsid: 1,
            ana_group: 1,
            size_bytes: 1 << 20,
            block_size: 4096,
            drives,
            joining: Vec::new(),
            layout: "raid1".into(),
            hosts: Vec::new(),
            serial: serial_of("00112233-4455-6677-8899-aabbccddeeff"),
            model: "m".into(),
            thin_pool: false,
            extents: Vec::new(),
            deleting: false,
        }
    }

    #[tokio::test]
    async fn probe_names_the_unreachable_member() {
        let open = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (a, b) = (open.local_addr().unwrap(), closed.local_addr().unwrap());
        drop(closed);
        let good = format!("tcp://{a}/nqn.x:d0?nsid=1");
        let bad = format!("tcp://{b}/nqn.x:d1?nsid=1");
        probe(&spec(vec![good.clone()])).await.unwrap();
        let e = probe(&spec(vec![good, bad.clone()])).await.unwrap_err();
        assert!(
            matches!(&e, NodeError::Conflict(m) if m.contains(&bad)),
            "{e}"
        );
    }

    #[test]
    fn serial_is_stable_and_short() {
        let s = serial_of("1ca673a0-4e20-4fab-9dc7-072456c184c6");
        assert_eq!(s, "FPC1CA673A04E204FAB9");
        assert!(s.len() <= 20);
    }

    #[test]
    fn state_word_from_member_states() {
        let st = |m: &[&str]| VolumeState {
            epoch: 1,
            generation: 1,
            members: m.iter().map(|s| s.to_string()).collect(),
            note: String::new(),
            serving: false,
        };
        assert_eq!(state_word(&st(&["active", "active"])), "optimal");
        assert_eq!(state_word(&st(&["active", "failed"])), "degraded");
        assert_eq!(state_word(&st(&["active", "resyncing"])), "rebuilding");
    }
}

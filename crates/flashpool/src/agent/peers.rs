//! The other nodes: their portals in this node's discovery log, and their
//! liveness ports, through which a dead process is seen at once. etcd alone
//! would wait for the dead node's lease to run out; a refused connection
//! proves the process is gone (a frozen or cut-off node refuses nothing),
//! so its lease can be revoked and its volumes taken over now.

use std::sync::Arc;

use cluster::NodeRecord;
use nvmf_target::PeerPortal;

use super::Agent;

impl Agent {
    pub(super) fn update_peers(self: &Arc<Self>, nodes: &[NodeRecord]) {
        let me = self.name();
        let portals: Vec<PeerPortal> = nodes
            .iter()
            .filter(|n| n.name != me)
            .flat_map(|n| n.portals.iter())
            .map(|p| PeerPortal {
                traddr: p.traddr.clone(),
                trsvcid: p.trsvcid.clone(),
            })
            .collect();
        self.target.set_peer_portals(portals);
        for n in nodes.iter().filter(|n| n.name != me) {
            let Some(addr) = n.liveness.clone() else {
                continue;
            };
            let key = (n.name.clone(), n.lease);
            if !self.watching.lock().insert(key.clone()) {
                continue;
            }
            let agent = Arc::downgrade(self);
            tokio::spawn(async move {
                cluster::watch_peer_death(&addr).await;
                let Some(a) = agent.upgrade() else { return };
                a.watching.lock().remove(&key);
                let (name, lease) = key;
                let s = a.session();
                // Only that life of the node: a restarted one has a new lease.
                let same = s
                    .nodes()
                    .await
                    .map(|ns| ns.iter().any(|r| r.name == name && r.lease == lease))
                    .unwrap_or(false);
                if same {
                    tracing::warn!(
                        "node {name}: its process is gone ({addr} refuses connections); \
                         revoking its lease so that its volumes move now"
                    );
                    if let Err(e) = s.revoke_node(&name).await {
                        tracing::warn!("node {name}: revoking its lease: {e}");
                    }
                }
            });
        }
    }
}

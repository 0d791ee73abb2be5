//! Set-up shared by the test binaries that run against a real etcd: node
//! records, specs and sessions. Each binary uses a part of it.
#![allow(dead_code)]

use std::time::Duration;

use cluster::{ClusterConfig, ClusterEvent, NodeRecord, Session, ThinSpec, VolumeSpec};
use tokio::sync::broadcast;

pub fn rec(name: &str) -> NodeRecord {
    NodeRecord {
        name: name.into(),
        portals: vec![],
        discovery: vec![],
        api: None,
        liveness: None,
        host_nqn: format!("nqn.2014-08.org.nvmexpress:uuid:{name}"),
        host_id: name.into(),
        slot: 0,
        lease: 0,
    }
}

pub fn spec(name: &str, ana_group: u32, thin_pool: bool) -> VolumeSpec {
    VolumeSpec {
        name: name.into(),
        uuid: "00000000-0000-0000-0000-000000000001".into(),
        nqn: "nqn.2024-01.io.flashpool:q".into(),
        nsid: if thin_pool { 0 } else { ana_group },
        ana_group,
        size_bytes: 1 << 30,
        block_size: 4096,
        drives: vec!["nvme://a/1".into()],
        joining: Vec::new(),
        layout: "raid1".into(),
        hosts: vec![],
        serial: "S1".into(),
        model: "flashpool".into(),
        thin_pool,
        extents: Vec::new(),
        deleting: false,
    }
}

/// A thin volume's spec, from JSON (fields added later keep their defaults).
pub fn thin(name: &str, pool: &str, nsid: u32) -> ThinSpec {
    serde_json::from_value(serde_json::json!({
        "name": name, "pool": pool, "uuid": "00000000-0000-0000-0000-000000000009",
        "nsid": nsid, "size_bytes": 1u64 << 30, "block_size": 4096, "serial": "T",
    }))
    .unwrap()
}

pub async fn join(eps: &[String], name: &str) -> Session {
    Session::join(ClusterConfig::new(eps.to_vec(), "t", name), rec(name))
        .await
        .unwrap()
}

/// A fresh etcd and two sessions on it, `a` and `b`; `None` without etcd.
pub async fn two() -> Option<(cluster::testing::EtcdServer, Session, Session)> {
    if !cluster::testing::etcd_available() {
        return None;
    }
    let etcd = cluster::testing::EtcdServer::start().unwrap();
    let eps = vec![etcd.endpoint()];
    let a = join(&eps, "a").await;
    let b = join(&eps, "b").await;
    Some((etcd, a, b))
}

/// The next event that `want` accepts, within `within`.
pub async fn next_event(
    rx: &mut broadcast::Receiver<ClusterEvent>,
    want: impl Fn(&ClusterEvent) -> bool,
    within: Duration,
) -> ClusterEvent {
    tokio::time::timeout(within, async {
        loop {
            let e = rx.recv().await.unwrap();
            if want(&e) {
                return e;
            }
        }
    })
    .await
    .expect("event did not arrive in time")
}

//! A thin volume's NSID changed after it was recorded (export and unexport
//! of cluster pools' thin volumes and snapshots), against a real etcd: the
//! spec and the `nsids/` claim move in one transaction, only from the
//! record read and only by the pool's owner; a refusal writes nothing.

use cluster::testing::{EtcdServer, etcd_available};
use cluster::{ClusterConfig, ClusterError, NodeRecord, Session, ThinSpec, VolumeSpec};

fn rec(name: &str) -> NodeRecord {
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

fn spec(name: &str, ana_group: u32, thin_pool: bool) -> VolumeSpec {
    VolumeSpec {
        name: name.into(),
        uuid: "00000000-0000-0000-0000-000000000001".into(),
        nqn: "nqn.2024-01.io.flashpool:q".into(),
        nsid: if thin_pool { 0 } else { ana_group },
        ana_group,
        size_bytes: 1 << 30,
        block_size: 4096,
        drives: vec!["nvme://a/1".into()],
        layout: "raid1".into(),
        hosts: vec![],
        serial: "S1".into(),
        model: "flashpool".into(),
        thin_pool,
    }
}

/// A thin volume's spec, from JSON (fields added later keep their defaults).
fn thin(name: &str, pool: &str, nsid: u32) -> ThinSpec {
    serde_json::from_value(serde_json::json!({
        "name": name, "pool": pool, "uuid": "00000000-0000-0000-0000-000000000009",
        "nsid": nsid, "size_bytes": 1u64 << 30, "block_size": 4096, "serial": "T",
    }))
    .unwrap()
}

async fn join(eps: &[String], name: &str) -> Session {
    Session::join(ClusterConfig::new(eps.to_vec(), "t", name), rec(name))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thin_volume_is_served_as_another_nsid_only_by_its_pools_owner() {
    if !etcd_available() {
        return;
    }
    let etcd = EtcdServer::start().unwrap();
    let eps = vec![etcd.endpoint()];
    let a = join(&eps, "a").await;
    let b = join(&eps, "b").await;
    let nqn = "nqn.2024-01.io.flashpool:q";
    a.create_spec(&spec("p", 2, true)).await.unwrap();
    let p = a.claim("p").await.unwrap().unwrap();
    let s0 = thin("s", "p", 0);
    a.create_thin(&s0, nqn, p.epoch).await.unwrap();
    a.create_thin(&thin("t", "p", 3), nqn, p.epoch)
        .await
        .unwrap();
    let nsids = async |x: &Session| {
        let mut v = x.thin_nsids(nqn).await.unwrap();
        v.sort();
        v
    };
    assert_eq!(nsids(&a).await, vec![3]);

    // Refused, writing nothing: an NSID taken, another node than the
    // owner, a record that is not the one read.
    assert!(matches!(
        a.set_thin_nsid(&s0, nqn, 3, p.epoch).await,
        Err(ClusterError::NsidTaken { nsid: 3, .. })
    ));
    assert!(matches!(
        b.set_thin_nsid(&s0, nqn, 4, p.epoch).await,
        Err(ClusterError::Deposed { .. })
    ));
    let stale = ThinSpec {
        size_bytes: 1,
        ..s0.clone()
    };
    assert!(matches!(
        a.set_thin_nsid(&stale, nqn, 4, p.epoch).await,
        Err(ClusterError::ThinChanged(_))
    ));
    assert_eq!(nsids(&a).await, vec![3]);
    assert_eq!(a.thin_specs("p").await.unwrap()[0], s0);

    // Exported as 4, moved to 5, unexported: the claim follows the spec.
    let s4 = a.set_thin_nsid(&s0, nqn, 4, p.epoch).await.unwrap();
    assert_eq!(s4.nsid, 4);
    assert_eq!(nsids(&b).await, vec![3, 4]);
    let s5 = a.set_thin_nsid(&s4, nqn, 5, p.epoch).await.unwrap();
    assert_eq!(nsids(&b).await, vec![3, 5]);
    assert!(matches!(
        a.set_thin_nsid(&s4, nqn, 6, p.epoch).await,
        Err(ClusterError::ThinChanged(_))
    ));
    let gone = a.set_thin_nsid(&s5, nqn, 0, p.epoch).await.unwrap();
    assert_eq!(nsids(&b).await, vec![3]);
    let got = b.thin_specs("p").await.unwrap();
    assert!(got.contains(&gone) && gone.nsid == 0, "{got:?}");
    // The freed NSID is free for another.
    a.create_thin(&thin("u", "p", 5), nqn, p.epoch)
        .await
        .unwrap();
}

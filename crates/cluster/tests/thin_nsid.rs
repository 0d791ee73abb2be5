//! A thin volume's NSID changed after it was recorded (export and unexport
//! of cluster pools' thin volumes and snapshots), against a real etcd: the
//! spec and the `nsids/` claim move in one transaction, only from the
//! record read and only by the pool's owner; a refusal writes nothing.

use cluster::{ClusterError, Session, ThinSpec};

mod common;
use common::{spec, thin, two};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thin_volume_is_served_as_another_nsid_only_by_its_pools_owner() {
    let Some((_etcd, a, b)) = two().await else {
        return;
    };
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

//! QoS limits in etcd (`volumes/<v>/qos`), against a real etcd: written
//! with a volume in one transaction, changed by any node only from the
//! revision it read, refused for a volume that is gone, carried by the
//! watch with their value, read with the specs, and deleted with the
//! volume or thin volume.

use std::time::Duration;

use cluster::testing::{EtcdServer, etcd_available};
use cluster::{ClusterEvent, QosOf, QosSpec, QosWrite};
use tokio::sync::broadcast;

mod common;
use common::{join, next_event, spec, thin};

async fn next_qos_event(rx: &mut broadcast::Receiver<ClusterEvent>) -> ClusterEvent {
    let qos =
        |e: &ClusterEvent| matches!(e, ClusterEvent::QosSet(..) | ClusterEvent::QosCleared(_));
    next_event(rx, qos, Duration::from_secs(5)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_kept_with_the_volume_and_changed_from_the_revision_read() {
    if !etcd_available() {
        return;
    }
    let etcd = EtcdServer::start().unwrap();
    let eps = vec![etcd.endpoint()];
    let b = join(&eps, "b").await;
    let mut rx = b.events();
    let a = join(&eps, "a").await;
    // b's watch is live once it reports a's arrival
    tokio::time::timeout(Duration::from_secs(5), async {
        while !matches!(rx.recv().await.unwrap(), ClusterEvent::NodeUp(r) if r.name == "a") {}
    })
    .await
    .expect("b's watch to report a");
    let q = QosSpec {
        iops: 300,
        ..Default::default()
    };
    // Made with the volume, in the same transaction.
    a.create_spec_qos(&spec("v", 1, false), Some(&q))
        .await
        .unwrap();
    assert_eq!(
        next_qos_event(&mut rx).await,
        ClusterEvent::QosSet("v".into(), q)
    );
    let (got, rev) = b.qos("v").await.unwrap();
    assert!(got == q && rev > 0);

    // Any node changes them, only from the revision it read.
    let q2 = QosSpec {
        bandwidth: 20 << 20,
        burst_ms: 50,
        ..q
    };
    assert_eq!(
        b.set_qos("v", &QosOf::Volume, &q2, rev).await.unwrap(),
        QosWrite::Done
    );
    assert_eq!(
        a.set_qos("v", &QosOf::Volume, &QosSpec::default(), rev)
            .await
            .unwrap(),
        QosWrite::Changed,
        "a stale revision changes nothing"
    );
    assert_eq!(
        next_qos_event(&mut rx).await,
        ClusterEvent::QosSet("v".into(), q2)
    );
    let (got, rev2) = a.qos("v").await.unwrap();
    assert!(got == q2 && rev2 > rev);
    // The pass's one range read has them with the specs.
    let (specs, all) = a.specs_and_qos().await.unwrap();
    assert_eq!(specs.len(), 1);
    assert_eq!(all.get("v"), Some(&q2));

    // Unlimited: the key goes.
    assert_eq!(
        a.set_qos("v", &QosOf::Volume, &QosSpec::default(), rev2)
            .await
            .unwrap(),
        QosWrite::Done
    );
    assert_eq!(
        next_qos_event(&mut rx).await,
        ClusterEvent::QosCleared("v".into())
    );
    assert_eq!(a.qos("v").await.unwrap(), (QosSpec::default(), 0));
    // From "no key" (revision 0) it is set again.
    assert_eq!(
        a.set_qos("v", &QosOf::Volume, &q, 0).await.unwrap(),
        QosWrite::Done
    );

    // A volume that does not exist takes none.
    assert_eq!(
        a.set_qos("nope", &QosOf::Volume, &q, 0).await.unwrap(),
        QosWrite::Gone
    );
    assert_eq!(a.qos("nope").await.unwrap().1, 0);

    // Deleted with the volume.
    let o = a.claim("v").await.unwrap().unwrap();
    a.delete_volume("v", o.epoch).await.unwrap();
    assert_eq!(a.qos("v").await.unwrap().1, 0);

    // A thin volume: kept by its name, refused once it is gone, deleted
    // with it; a new one of the same name starts with no limits.
    let nqn = "nqn.2024-01.io.flashpool:q";
    a.create_spec(&spec("p", 2, true)).await.unwrap();
    let p = a.claim("p").await.unwrap().unwrap();
    a.create_thin_qos(&thin("t", "p", 1), nqn, p.epoch, Some(&q))
        .await
        .unwrap();
    let (got, rev) = b.qos("t").await.unwrap();
    assert_eq!(got, q);
    let of = QosOf::Thin("p".into());
    assert_eq!(b.set_qos("t", &of, &q2, rev).await.unwrap(), QosWrite::Done);
    assert_eq!(
        b.set_qos("t", &QosOf::Thin("other".into()), &q, 0)
            .await
            .unwrap(),
        QosWrite::Gone
    );
    a.delete_thin(&thin("t", "p", 1), nqn, p.epoch)
        .await
        .unwrap();
    assert_eq!(a.qos("t").await.unwrap().1, 0);
    let (_, rev) = a.qos("t").await.unwrap();
    assert_eq!(b.set_qos("t", &of, &q, rev).await.unwrap(), QosWrite::Gone);
    a.create_thin(&thin("t", "p", 1), nqn, p.epoch)
        .await
        .unwrap();
    assert_eq!(a.qos("t").await.unwrap().1, 0);
}

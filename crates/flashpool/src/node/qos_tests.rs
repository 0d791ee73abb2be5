//! Volumes' QoS limits through the node: set at create and live, applied
//! to the served namespace, refused whole when wrong, kept over a restart.

use std::sync::Arc;

use super::testing::{TestNode, volume};
use super::tests::tempdir;
use super::*;
use crate::api_types::{ExportRequest, QosRequest, Rate};
use crate::events::EventKind;

const NQN: &str = "nqn.2026-01.io.flashpool:qos";
const MIB: u64 = 1 << 20;

fn node(dir: Option<&std::path::Path>) -> Arc<Node> {
    TestNode::new()
        .mem_drives(4, 8 * MIB)
        .state_dir(dir)
        .target(NQN)
        .build()
}

fn exported(name: &str, drives: &[&str], nsid: u32) -> CreateVolume {
    let mut r = volume(name, "raid1", drives);
    r.export = Some(ExportRequest {
        nqn: NQN.into(),
        nsid,
    });
    r
}

/// The limits the target applies to namespace `nsid`.
fn served_limits(n: &Node, nsid: u32) -> nvmf_target::qos::QosLimits {
    n.target()
        .unwrap()
        .subsystem(NQN)
        .unwrap()
        .namespace(nsid)
        .expect("exported")
        .qos
        .limits()
}

fn qos_events(n: &Node) -> Vec<String> {
    n.events
        .recent()
        .iter()
        .filter(|e| e.kind == EventKind::QosChanged)
        .map(|e| e.message.clone())
        .collect()
}

#[tokio::test]
async fn limits_set_at_create_and_live_reach_the_namespace() {
    let n = node(None);
    let q = QosRequest {
        iops: Some(500),
        bandwidth: Some(Rate::Text("20MiB".into())),
        ..Default::default()
    };
    n.create_volume_qos(exported("v", &["d0", "d1"], 1), Some(q))
        .await
        .unwrap();
    let l = served_limits(&n, 1);
    assert_eq!((l.iops, l.bandwidth), (500, 20 * MIB));
    assert!(
        n.target()
            .unwrap()
            .subsystem(NQN)
            .unwrap()
            .namespace(1)
            .unwrap()
            .qos
            .enabled()
    );
    // an unlimited neighbour stays off
    n.create_volume(exported("w", &["d2", "d3"], 2))
        .await
        .unwrap();
    assert!(served_limits(&n, 2).is_unlimited());
    let page = n.metrics().await;
    let lim = format!(
        "flashpool_namespace_qos_limit{{subsystem=\"{NQN}\",nsid=\"1\",volume=\"v\",limit=\"iops\"}} 500\n"
    );
    assert!(page.contains(&lim), "{page}");
    assert!(!page.contains("volume=\"w\",limit="), "{page}");
    assert!(page.contains(&format!(
        "flashpool_namespace_qos_throttled_seconds_total{{subsystem=\"{NQN}\",nsid=\"2\",volume=\"w\"}} 0"
    )));

    // live: absent fields keep their value
    let info = n
        .set_volume_qos(
            "v",
            QosRequest {
                write_iops: Some(100),
                burst_ms: Some(250),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (
            info.limits.iops,
            info.limits.write_iops,
            info.limits.bandwidth
        ),
        (500, 100, 20 * MIB)
    );
    assert_eq!(info.limits.burst_ms, 250);
    let l = served_limits(&n, 1);
    assert_eq!((l.iops, l.write_iops, l.burst_ms), (500, 100, 250));
    // 0 lifts one limit, clear all of them
    n.set_volume_qos(
        "v",
        QosRequest {
            iops: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(served_limits(&n, 1).iops, 0);
    let info = n
        .set_volume_qos(
            "v",
            QosRequest {
                clear: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(info.unlimited && served_limits(&n, 1).is_unlimited());
    assert!(
        !n.target()
            .unwrap()
            .subsystem(NQN)
            .unwrap()
            .namespace(1)
            .unwrap()
            .qos
            .enabled()
    );
    let ev = qos_events(&n);
    assert_eq!(ev.len(), 4, "{ev:?}");
    assert!(
        ev[0].contains("iops 500") && ev[0].contains("was unlimited"),
        "{ev:?}"
    );
    assert!(ev[3].contains("QoS unlimited"), "{ev:?}");
    // an unchanged request is no change: no event
    n.set_volume_qos("v", QosRequest::default()).await.unwrap();
    assert_eq!(qos_events(&n).len(), 4);

    // the limits stay with the volume when it is unexported and exported again
    n.set_volume_qos(
        "v",
        QosRequest {
            read_iops: Some(42),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    n.unexport("v", false).await.unwrap();
    n.export(
        "v",
        ExportRequest {
            nqn: NQN.into(),
            nsid: 3,
        },
    )
    .await
    .unwrap();
    assert_eq!(served_limits(&n, 3).read_iops, 42);
}

#[tokio::test]
async fn refused_requests_change_nothing() {
    let dir = tempdir();
    let n = node(Some(&dir));
    n.create_volume_qos(
        exported("v", &["d0", "d1"], 1),
        Some(QosRequest {
            iops: Some(2000),
            ..Default::default()
        }),
    )
    .await
    .unwrap();
    let file = std::fs::read_to_string(dir.join("qos.json")).unwrap();
    let events = qos_events(&n).len();
    let bad = [
        (
            QosRequest {
                iops: Some(10),
                bandwidth: Some(Rate::Text("20 parsecs".into())),
                ..Default::default()
            },
            "bandwidth",
        ),
        (
            QosRequest {
                write_bandwidth: Some(Rate::Number(100)),
                ..Default::default()
            },
            "below 4096",
        ),
        (
            QosRequest {
                burst_ms: Some(0),
                ..Default::default()
            },
            "burst_ms 0",
        ),
        (
            QosRequest {
                iops: Some(1),
                burst_ms: Some(60_001),
                ..Default::default()
            },
            "1 to 60000",
        ),
    ];
    for (req, want) in bad {
        let e = n.set_volume_qos("v", req).await.unwrap_err();
        assert!(matches!(e, NodeError::BadRequest(_)), "{e:?}");
        assert!(e.to_string().contains(want), "{e}");
        assert_eq!(served_limits(&n, 1).iops, 2000);
        assert_eq!(served_limits(&n, 1).bandwidth, 0);
    }
    let e = n
        .set_volume_qos("nope", QosRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.status(), axum::http::StatusCode::NOT_FOUND);
    // a create with bad limits makes nothing: its drives stay free
    let e = n
        .create_volume_qos(
            exported("x", &["d2", "d3"], 2),
            Some(QosRequest {
                burst_ms: Some(0),
                ..Default::default()
            }),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, NodeError::BadRequest(_)), "{e:?}");
    assert!(n.volume("x").await.is_err());
    n.create_volume(volume("x", "raid1", &["d2", "d3"]))
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(dir.join("qos.json")).unwrap(), file);
    assert_eq!(qos_events(&n).len(), events);
}

#[tokio::test]
async fn a_thin_pool_takes_no_limits() {
    let n = node(None);
    let mut p = volume("p", "raid1", &["d0", "d1"]);
    p.thin_pool = true;
    let e = n
        .create_volume_qos(
            p.clone(),
            Some(QosRequest {
                iops: Some(5),
                ..Default::default()
            }),
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("thin pool"), "{e}");
    n.create_volume(p).await.unwrap();
    let e = n
        .set_volume_qos(
            "p",
            QosRequest {
                iops: Some(5),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("thin pool"), "{e}");
}

#[tokio::test]
async fn limits_survive_a_restart_and_leave_with_the_volume() {
    let dir = tempdir();
    {
        let n = node(Some(&dir));
        n.create_volume(exported("v", &["d0", "d1"], 1))
            .await
            .unwrap();
        n.set_volume_qos(
            "v",
            QosRequest {
                iops: Some(700),
                read_bandwidth: Some(Rate::Number(1 << 20)),
                burst_ms: Some(20),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    }
    // the next run (its volume made again here: mem drives forget)
    let n = node(Some(&dir));
    n.create_volume(exported("v", &["d0", "d1"], 1))
        .await
        .unwrap();
    n.restore_qos().await.unwrap();
    let l = served_limits(&n, 1);
    assert_eq!((l.iops, l.read_bandwidth, l.burst_ms), (700, 1 << 20, 20));
    // deleted: gone from the file too
    n.unexport("v", false).await.unwrap();
    n.delete_volume("v", true).await.unwrap();
    let file = std::fs::read_to_string(dir.join("qos.json")).unwrap();
    assert!(!file.contains("\"v\""), "{file}");
}

//! Takeovers with members unreachable (`degraded.rs`), in one process:
//! enclosures on 127.0.0.1 and owner nodes over NVMe/TCP.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_host::remote::{RemoteDevice, RemoteOptions};

use super::remote_tests::{Enclosure, create, hosts, owner, read, served, stamp, wait_for, write};
use super::*;
use crate::node::identity::{Peer, drive_nqn, node_host_nqn};

/// A node of the test cluster whose peers are enclosures `encs`.
fn node_of(name: &str, encs: &[&Enclosure]) -> Arc<Node> {
    let first = owner(name, encs[0]);
    let mut c = first.cluster().clone();
    for e in &encs[1..] {
        c.peers.push(Peer {
            name: e.name.clone(),
            addr: Some(e.addr),
            host_nqn: node_host_nqn(&e.name),
            auth: None,
            tls: None,
        });
    }
    let n = super::testing::TestNode::new().cluster(c).build();
    n.attach_target(first.target().unwrap().clone());
    n
}

fn takeover(drives: &[&str]) -> AssembleVolume {
    AssembleVolume {
        drives: drives.iter().map(|d| d.to_string()).collect(),
        takeover: true,
        export: Some(ExportRequest {
            nqn: "nqn.2026-01.io.flashpool:test".into(),
            nsid: 1,
        }),
        force: false,
        only: None,
    }
}

fn degraded(recorded: Option<Recorded>) -> Option<Degraded> {
    Some(Degraded {
        wait: Duration::from_millis(500),
        recorded,
    })
}

/// Who holds the reservation on enclosure `e`'s drive `d`, as host `as_`.
async fn holder(e: &Enclosure, d: &str, as_: &str) -> Option<u64> {
    let url = format!("tcp://{}/{}?nsid=1", e.addr, drive_nqn(&e.name, d));
    let mut o = RemoteOptions::default();
    o.host.hostnqn = node_host_nqn(as_);
    o.host.hostid = crate::node::identity::stable_id(&o.host.hostnqn);
    let r = RemoteDevice::connect(&url, o).await.unwrap();
    let h = r.report().await.unwrap().holder().map(|h| h.rkey);
    let _ = r.shutdown();
    h
}

/// The owner dies while one enclosure of its mirror is down: another node
/// takes the volume over degraded from the copy it reaches, within the
/// wait; the old owner's writes end there; when the enclosure is back, its
/// member is preempted and re-added through the bitmap, and holds every
/// write made meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_with_an_enclosure_down_runs_degraded_and_re_adds_it_later() {
    let e1 = Enclosure::new("e1", 1, &hosts(&["a", "b"]));
    let mut e2 = Enclosure::new("e2", 1, &hosts(&["a", "b"]));
    let a = node_of("a", &[&e1, &e2]);
    a.create_volume(create("m", "raid1", &["e1:d0", "e2:d0"]))
        .await
        .unwrap();
    let dev_a = served(&a);
    let lbas: Vec<u64> = (0..32).map(|i| i * 37).collect();
    for &l in &lbas {
        write(&*dev_a, l, 1).await.unwrap();
    }
    e2.stop();
    let b = node_of("b", &[&e1, &e2]);
    let t = Instant::now();
    let info = b
        .assemble_volume_with(takeover(&["e1:d0", "e2:d0"]), degraded(None))
        .await
        .unwrap();
    let took = t.elapsed();
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert_eq!(info.state, "degraded", "{info:?}");
    assert_eq!(info.members[1].state, "failed", "{info:?}");
    let dev_b = served(&b);
    for &l in &lbas {
        let got = read(&*dev_b, l).await.unwrap();
        assert!(got[..] == stamp(l, 1)[..], "LBA {l}: lost at the takeover");
        write(&*dev_b, l, 2).await.unwrap();
    }
    // The old owner was preempted on the member B reached.
    assert!(write(&*dev_a, 3, 9).await.is_err(), "A still writes");
    e2.start();
    wait_for(
        "e2:d0 re-added and resynced",
        Duration::from_secs(30),
        async || b.volume("m").await.unwrap().state == "optimal",
    )
    .await;
    assert_eq!(holder(&e2, "d0", "b").await, Some(b.resv_key()));
    // The member that came back holds the writes made without it.
    b.fail_drive("e1:d0", false).await.unwrap();
    for &l in &lbas {
        let got = read(&*dev_b, l).await.unwrap();
        assert!(
            got[..] == stamp(l, 2)[..],
            "LBA {l}: not on the re-added member"
        );
    }
}

/// The only member a node reaches is one the cluster recorded as failed (the
/// last owner wrote on without it): the takeover is refused before anything
/// is claimed, naming why, and nothing is left open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_recorded_failed_is_not_served_alone_and_nothing_is_claimed() {
    let mut e1 = Enclosure::new("e1", 1, &hosts(&["a", "b"]));
    let e2 = Enclosure::new("e2", 1, &hosts(&["a", "b"]));
    let a = node_of("a", &[&e1, &e2]);
    let info = a
        .create_volume(create("m", "raid1", &["e1:d0", "e2:d0"]))
        .await
        .unwrap();
    e1.stop();
    let b = node_of("b", &[&e1, &e2]);
    let rec = Recorded {
        generation: info.generation + 1,
        members: vec!["active".into(), "failed".into()],
    };
    let e = b
        .assemble_volume_with(takeover(&["e1:d0", "e2:d0"]), degraded(Some(rec)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cannot run") && e.contains("e2:d0 not trusted"),
        "{e}"
    );
    assert!(e.contains("unreachable: e1:d0"), "{e}");
    assert!(b.drives().await.is_empty(), "the refusal left drives open");
    assert_eq!(
        holder(&e2, "d0", "b").await,
        Some(a.resv_key()),
        "the refused takeover claimed a member"
    );
    // Beyond the tolerance without any record too: nothing runs from no copy.
    let e = b
        .assemble_volume_with(takeover(&["e1:d0"]), degraded(None))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("no drive") && e.contains("e1:d0"), "{e}");
}

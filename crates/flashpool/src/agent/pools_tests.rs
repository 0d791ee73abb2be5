//! Cluster pools with two nodes in one process, a real etcd and an
//! enclosure of RAM drives: thin volumes made through either node (the
//! other passes the request to the pool's owner), served by both in the
//! pool's ANA group, carried by a planned move and by a takeover in one
//! step, and refused requests that change nothing; their snapshots, clones
//! and reverts asked of either node, carried the same way.

use std::sync::Arc;

use blockdev::{BlockDevice, BlockError};
use nvmf_target::{AnaState, Target};

use super::Agent;
use super::tests::{NQN, Pair, io, pair, wait};
use crate::api_types::{CloneRequest, RevertRequest, SnapshotPair};
use crate::node::{CreateVolume, ExportRequest, NodeError, NodeResult, VolumeInfo};

pub(super) fn ns(t: &Target, nsid: u32) -> Option<Arc<dyn BlockDevice>> {
    Some(t.subsystem(NQN)?.namespace(nsid)?.dev.clone())
}

fn req(name: &str) -> CreateVolume {
    CreateVolume {
        layout: None,
        ..crate::node::testing::volume(name, "", &[])
    }
}

pub(super) fn thin(name: &str, nsid: Option<u32>) -> CreateVolume {
    CreateVolume {
        pool: Some("p".into()),
        size: Some("32MiB".into()),
        export: nsid.map(|nsid| ExportRequest {
            nqn: NQN.into(),
            nsid,
        }),
        ..req(name)
    }
}

async fn thin_count(a: &Agent) -> usize {
    a.session().thin_specs("p").await.unwrap().len()
}

/// Pool `p`: raid5 on e1's three drives, its thin volumes served in [`NQN`].
pub(super) fn pool_req(nsid: u32) -> CreateVolume {
    CreateVolume {
        layout: Some("raid5".into()),
        drives: vec!["e1:d0".into(), "e1:d1".into(), "e1:d2".into()],
        thin_pool: true,
        export: Some(ExportRequest {
            nqn: NQN.into(),
            nsid,
        }),
        ..req("p")
    }
}

pub(super) fn nsid_of(v: &VolumeInfo) -> Option<u32> {
    v.export.as_ref().map(|x| x.nsid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_pool_carries_its_thin_volumes_through_a_move_and_a_takeover() {
    let Some(Pair {
        etcd: _etcd,
        enc: _enc,
        a,
        ta,
        b,
        tb,
    }) = pair().await
    else {
        return;
    };
    // A pool is not a namespace: --export NQN without an nsid.
    assert!(matches!(
        a.create(pool_req(3)).await,
        Err(NodeError::BadRequest(m)) if m.contains("without --nsid")
    ));
    let p = a.create(pool_req(0)).await.unwrap();
    assert!(p.export.is_none(), "{p:?}");
    let g = a.status().await.unwrap().volumes[0].ana_group;
    assert_eq!(ta.ana_state(g), AnaState::Optimized);

    // Thin volumes through the owner, and through b (passed on to a).
    let t1 = a.create(thin("t1", None)).await.unwrap();
    let t2 = b.create(thin("t2", None)).await.unwrap();
    let t3 = a.create(thin("t3", Some(7))).await.unwrap();
    let nsid = nsid_of;
    assert_eq!(
        (nsid(&t1), nsid(&t2), nsid(&t3)),
        (Some(1), Some(2), Some(7))
    );
    assert_eq!(t2.owner.as_deref(), Some("a"));
    wait(
        "b to serve the three thin volumes on standby",
        10,
        async || [1, 2, 7].iter().all(|n| ns(&tb, *n).is_some()),
    )
    .await;
    for n in [1, 2, 7] {
        let (x, y) = (ta.subsystem(NQN).unwrap(), tb.subsystem(NQN).unwrap());
        let (x, y) = (x.namespace(n).unwrap(), y.namespace(n).unwrap());
        assert_eq!(x.nguid, y.nguid, "nsid {n}: the same NGUID on both nodes");
        assert_eq!(x.ana_group, g, "nsid {n}: in the pool's ANA group");
    }
    io(&ns(&ta, 1).unwrap(), Some(0xA1)).await.unwrap();
    io(&ns(&ta, 2).unwrap(), Some(0xA2)).await.unwrap();
    assert!(matches!(
        io(&ns(&tb, 1).unwrap(), None).await,
        Err(BlockError::Fenced(_))
    ));
    // b lists them on standby, with their pool and owner.
    let mut listed = b.node.volumes().await;
    b.list_cluster(&mut listed).await;
    let l2 = listed.iter().find(|v| v.name == "t2").expect("b lists t2");
    assert_eq!(
        (l2.state.as_str(), l2.pool.as_deref(), l2.owner.as_deref()),
        ("standby", Some("p"), Some("a"))
    );
    let mut listed = a.node.volumes().await;
    a.list_cluster(&mut listed).await;
    let l1 = listed.iter().find(|v| v.name == "t1").expect("a lists t1");
    assert_eq!(l1.ana_state.as_deref(), Some("optimized"));

    // Grown through b (passed on to a): both nodes serve the new size; a
    // smaller size, or the pool itself, is refused.
    let blocks = |t: &Target, n: u32| t.subsystem(NQN).unwrap().namespace(n).unwrap().num_blocks;
    assert_eq!(blocks(&tb, 1), (32 << 20) / 4096);
    let g1 = b.grow("t1", "64MiB").await.unwrap().unwrap();
    assert_eq!(g1.size_bytes, 64 << 20);
    assert_eq!(blocks(&ta, 1), (64 << 20) / 4096);
    wait("b to serve t1 at its new size", 10, async || {
        blocks(&tb, 1) == (64 << 20) / 4096
    })
    .await;
    assert_eq!(ns(&ta, 1).unwrap().geometry().num_blocks, (64 << 20) / 4096);
    assert!(b.grow("t1", "16MiB").await.is_err());
    assert!(matches!(
        a.grow("p", "1GiB").await,
        Err(NodeError::BadRequest(_))
    ));
    assert_eq!(
        a.grow("nothing", "1GiB").await.unwrap().map(|v| v.name),
        None
    );
    assert_eq!(
        blocks(&ta, 1),
        (64 << 20) / 4096,
        "a refusal changes nothing"
    );

    // Refused, and nothing changes: a name taken (here or as the pool), an
    // nsid taken, another subsystem, a pool that still holds thin volumes.
    for (r, what) in [
        (thin("t1", None), "exists"),
        (thin("p", None), "exists"),
        (thin("t4", Some(7)), "nsid 7"),
    ] {
        let e = b.create(r).await.unwrap_err();
        assert!(
            e.to_string().contains(what) || e.to_string().contains("already"),
            "{e}"
        );
    }
    let mut other = thin("t5", None);
    other.export = Some(ExportRequest {
        nqn: "nqn.2026-01.io.flashpool:other".into(),
        nsid: 0,
    });
    assert!(matches!(
        a.create(other).await,
        Err(NodeError::BadRequest(_))
    ));
    assert!(matches!(a.delete("p", true).await, Err(NodeError::Conflict(m)) if m.contains("t1")));
    assert_eq!(thin_count(&a).await, 3);
    assert!(a.node.volume("t4").await.is_err() && a.node.volume("t5").await.is_err());

    // A planned move carries the pool and all its thin volumes.
    let m = a.move_volume("p", "b").await.unwrap();
    assert_eq!(m.epoch, 2);
    assert_eq!(tb.ana_state(g), AnaState::Optimized);
    assert_eq!(ta.ana_state(g), AnaState::Inaccessible);
    assert_eq!(
        io(&ns(&tb, 1).unwrap(), None).await.unwrap(),
        vec![0xA1; 16384]
    );
    assert_eq!(
        io(&ns(&tb, 2).unwrap(), None).await.unwrap(),
        vec![0xA2; 16384]
    );
    assert!(
        a.node.volume("t1").await.is_err(),
        "a let go of the thin volumes"
    );
    io(&ns(&tb, 7).unwrap(), Some(0xB7)).await.unwrap();

    // Deleted through a (passed on to b); one holding data needs force.
    assert!(matches!(
        a.delete("t3", false).await,
        Err(NodeError::Conflict(m)) if m.contains("holds data")
    ));
    a.delete("t3", true).await.unwrap().unwrap();
    wait("nsid 7 gone from both nodes", 10, async || {
        ns(&ta, 7).is_none() && ns(&tb, 7).is_none()
    })
    .await;
    assert_eq!(thin_count(&a).await, 2);

    // b's lease is revoked: a takes the pool over, with its thin volumes.
    assert!(a.session().revoke_node("b").await.unwrap());
    wait("a to take the pool over", 15, async || {
        ta.ana_state(g) == AnaState::Optimized
    })
    .await;
    assert_eq!(
        io(&ns(&ta, 1).unwrap(), None).await.unwrap(),
        vec![0xA1; 16384]
    );
    assert_eq!(
        io(&ns(&ta, 2).unwrap(), None).await.unwrap(),
        vec![0xA2; 16384]
    );
    assert_eq!(blocks(&ta, 1), (64 << 20) / 4096, "the grown size survives");
    assert!(matches!(
        io(&ns(&tb, 2).unwrap(), None).await,
        Err(BlockError::Fenced(_))
    ));
    // the name and nsid of the deleted one are free again
    let t3 = a.create(thin("t3", None)).await.unwrap();
    assert_eq!(nsid(&t3), Some(3));
}

pub(super) fn snap(volume: &str, name: &str, nsid: Option<u32>) -> SnapshotPair {
    SnapshotPair {
        volume: volume.into(),
        name: name.into(),
        export: nsid.map(|nsid| ExportRequest {
            nqn: NQN.into(),
            nsid,
        }),
    }
}

/// What `GET /v1/volumes` lists on node `ag`.
async fn listed(ag: &Agent) -> Vec<VolumeInfo> {
    let mut vs = ag.node.volumes().await;
    for v in &mut vs {
        ag.annotate(v).await;
    }
    ag.list_cluster(&mut vs).await;
    vs
}

/// What `GET /v1/snapshots` lists on node `ag`: the names.
async fn snapshot_names(ag: &Agent) -> Vec<String> {
    let mut v: Vec<String> = listed(ag)
        .await
        .into_iter()
        .filter(|v| v.snapshot)
        .map(|v| v.name)
        .collect();
    v.sort();
    v
}

/// The pool's thin specs (etcd) and the thin volumes the owner's node
/// holds: what a refused request must leave as it was.
pub(super) async fn pool_state(a: &Agent) -> (Vec<cluster::ThinSpec>, Vec<String>) {
    let mut specs = a.session().thin_specs("p").await.unwrap();
    specs.sort_by(|x, y| x.name.cmp(&y.name));
    let mut held: Vec<String> = a
        .node
        .volumes()
        .await
        .into_iter()
        .filter(|v| v.pool.as_deref() == Some("p"))
        .map(|v| format!("{} {:?}", v.name, v.parent))
        .collect();
    held.sort();
    (specs, held)
}

/// Reads nsid `n` as `t` serves it.
pub(super) async fn read(t: &Target, n: u32) -> Result<Vec<u8>, BlockError> {
    io(&ns(t, n).unwrap(), None).await
}

fn revert(snapshot: &str) -> RevertRequest {
    RevertRequest {
        snapshot: snapshot.into(),
        force: false,
    }
}

fn clone_req(name: &str) -> CloneRequest {
    CloneRequest {
        name: name.into(),
        export: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_pool_snapshots_clones_and_reverts_through_either_node() {
    let Some(Pair {
        etcd: _etcd,
        enc: _enc,
        a,
        ta,
        b,
        tb,
    }) = pair().await
    else {
        return;
    };
    a.create(pool_req(0)).await.unwrap();
    let g = a.status().await.unwrap().volumes[0].ana_group;
    a.create(thin("t1", None)).await.unwrap();
    a.create(thin("t2", None)).await.unwrap();
    io(&ns(&ta, 1).unwrap(), Some(0xA1)).await.unwrap();
    io(&ns(&ta, 2).unwrap(), Some(0xA2)).await.unwrap();

    // A snapshot asked of b, taken by the owner a, served write-protected
    // as asked: what was written before is in it, what is written after
    // is not.
    let s1 = b.snapshot(vec![snap("t1", "s1", Some(0))]).await.unwrap();
    let s1 = &s1[0];
    assert!(s1.snapshot, "{s1:?}");
    assert_eq!((nsid_of(s1), s1.owner.as_deref()), (Some(3), Some("a")));
    io(&ns(&ta, 1).unwrap(), Some(0xB1)).await.unwrap();
    assert_eq!(read(&ta, 3).await.unwrap(), vec![0xA1; 16384]);
    assert_eq!(read(&ta, 1).await.unwrap(), vec![0xB1; 16384]);
    assert!(matches!(
        io(&ns(&ta, 3).unwrap(), Some(0xEE)).await,
        Err(BlockError::ReadOnly(_))
    ));
    wait("b to serve s1 on standby", 10, async || {
        ns(&tb, 3).is_some()
    })
    .await;
    for t in [&ta, &tb] {
        let sub = t.subsystem(NQN).unwrap();
        let n = sub.namespace(3).unwrap();
        assert!(n.dev.read_only(), "write-protected on every path");
        assert_eq!(n.ana_group, g, "in the pool's ANA group");
        assert!(!sub.namespace(1).unwrap().dev.read_only());
    }
    // Two at one instant, not asked to be served: recorded, listed, and
    // no namespace on either node.
    let gs = b
        .snapshot(vec![snap("t1", "g1", None), snap("t2", "g2", None)])
        .await
        .unwrap();
    assert!(
        gs.iter().all(|v| v.snapshot && v.export.is_none()),
        "{gs:?}"
    );
    wait("both nodes to list the three snapshots", 10, async || {
        snapshot_names(&b).await == ["g1", "g2", "s1"]
    })
    .await;
    assert_eq!(snapshot_names(&a).await, ["g1", "g2", "s1"]);
    let on_b = listed(&b).await;
    let l = |n: &str| on_b.iter().find(|v| v.name == n).unwrap().clone();
    assert_eq!(
        (
            l("s1").owner.as_deref(),
            nsid_of(&l("s1")),
            nsid_of(&l("g1"))
        ),
        (Some("a"), Some(3), None)
    );
    assert!(!l("t1").snapshot);
    for t in [&ta, &tb] {
        assert_eq!(t.subsystem(NQN).unwrap().namespaces().len(), 3);
    }

    // A clone asked of b: writable, and neither its snapshot nor the
    // snapshot's volume sees its writes.
    let c1 = b.clone_volume("s1", clone_req("c1")).await.unwrap();
    assert_eq!((nsid_of(&c1), c1.snapshot), (Some(4), false));
    assert_eq!(read(&ta, 4).await.unwrap(), vec![0xA1; 16384]);
    io(&ns(&ta, 4).unwrap(), Some(0xC1)).await.unwrap();
    assert_eq!(read(&ta, 4).await.unwrap(), vec![0xC1; 16384]);
    assert_eq!(read(&ta, 3).await.unwrap(), vec![0xA1; 16384]);
    assert_eq!(read(&ta, 1).await.unwrap(), vec![0xB1; 16384]);
    wait("b to serve c1 on standby", 10, async || {
        ns(&tb, 4).is_some()
    })
    .await;
    assert!(!ns(&tb, 4).unwrap().read_only());

    // Refused, and nothing changes: etcd's records and the pool as they were.
    let before = pool_state(&a).await;
    let other = SnapshotPair {
        export: Some(ExportRequest {
            nqn: "nqn.2026-01.io.flashpool:other".into(),
            nsid: 0,
        }),
        ..snap("t1", "x", None)
    };
    let refusals: Vec<(&str, NodeResult<()>)> = vec![
        (
            "unknown",
            b.snapshot(vec![snap("nothing", "x", None)]).await.map(drop),
        ),
        (
            "pool",
            b.snapshot(vec![snap("p", "x", None)]).await.map(drop),
        ),
        (
            "name taken",
            b.snapshot(vec![snap("t1", "c1", None)]).await.map(drop),
        ),
        (
            "nsid taken",
            b.snapshot(vec![snap("t1", "x", Some(1))]).await.map(drop),
        ),
        ("other subsystem", b.snapshot(vec![other]).await.map(drop)),
        (
            "of a snapshot",
            b.snapshot(vec![snap("s1", "x", None)]).await.map(drop),
        ),
        (
            "group, one name taken",
            b.snapshot(vec![snap("t1", "x", None), snap("t2", "s1", None)])
                .await
                .map(drop),
        ),
        (
            "clone of a volume",
            b.clone_volume("t1", clone_req("x")).await.map(drop),
        ),
        (
            "clone, name taken",
            b.clone_volume("s1", clone_req("t2")).await.map(drop),
        ),
        (
            "clone of nothing",
            b.clone_volume("nothing", clone_req("x")).await.map(drop),
        ),
        (
            "revert a snapshot",
            b.revert("s1", revert("g1")).await.map(drop),
        ),
        (
            "revert to another's",
            b.revert("t2", revert("s1")).await.map(drop),
        ),
        (
            "revert the pool",
            b.revert("p", revert("s1")).await.map(drop),
        ),
        (
            "on the owner too",
            a.snapshot(vec![snap("p", "x", None)]).await.map(drop),
        ),
        (
            "revert to nothing",
            b.revert("t1", revert("nothing")).await.map(drop),
        ),
    ];
    for (what, r) in &refusals {
        assert!(r.is_err(), "{what}: {r:?}");
    }
    let kind = |i: usize| refusals[i].1.as_ref().unwrap_err();
    assert!(
        matches!(kind(0), NodeError::Missing { .. }),
        "{:?}",
        kind(0)
    );
    assert!(
        matches!(kind(1), NodeError::Conflict(m) if m.contains("is a pool")),
        "{:?}",
        kind(1)
    );
    assert!(
        matches!(kind(2), NodeError::Conflict(m) if m.contains("already")),
        "{:?}",
        kind(2)
    );
    assert!(
        matches!(kind(3), NodeError::Conflict(m) if m.contains("nsid 1")),
        "{:?}",
        kind(3)
    );
    assert!(matches!(kind(4), NodeError::BadRequest(_)), "{:?}", kind(4));
    assert!(matches!(kind(7), NodeError::BadRequest(m) if m.contains("not a snapshot")));
    assert!(
        matches!(kind(9), NodeError::Missing { .. }),
        "{:?}",
        kind(9)
    );
    assert!(
        matches!(kind(10), NodeError::BadRequest(_)),
        "{:?}",
        kind(10)
    );
    // Refused by the owner, answered by b as the owner answered it.
    assert!(matches!(kind(5), NodeError::BadRequest(m) if m.starts_with("a: ")));
    assert!(matches!(kind(11), NodeError::BadRequest(m) if m.starts_with("a: ")));
    assert!(matches!(kind(14), NodeError::NotFound(m) if m.starts_with("a: ")));
    assert_eq!(pool_state(&a).await, before, "the refusals changed nothing");
    assert_eq!(ta.subsystem(NQN).unwrap().namespaces().len(), 4);

    // A revert asked of b: t1 reads as s1 again; g1 keeps what t1 held.
    let r = b.revert("t1", revert("s1")).await.unwrap();
    assert_eq!((r.name.as_str(), nsid_of(&r)), ("t1", Some(1)));
    assert_eq!(read(&ta, 1).await.unwrap(), vec![0xA1; 16384]);
    let g1 = a.node.volume_device("g1").await.unwrap();
    assert_eq!(io(&g1, None).await.unwrap(), vec![0xB1; 16384]);
    // A snapshot deleted through b before its volume: merged into it.
    b.delete("g2", true).await.unwrap().unwrap();
    assert_eq!(read(&ta, 2).await.unwrap(), vec![0xA2; 16384]);

    // A planned move carries the snapshots and clones: served by b, with
    // the same NSIDs, the same data, still write-protected.
    a.move_volume("p", "b").await.unwrap();
    assert_eq!(tb.ana_state(g), AnaState::Optimized);
    for (n, want) in [(1, 0xA1), (2, 0xA2), (3, 0xA1), (4, 0xC1)] {
        assert_eq!(read(&tb, n).await.unwrap(), vec![want; 16384], "nsid {n}");
    }
    assert!(matches!(
        io(&ns(&tb, 3).unwrap(), Some(0xEE)).await,
        Err(BlockError::ReadOnly(_))
    ));
    let g1 = b.node.volume_device("g1").await.unwrap();
    assert_eq!(io(&g1, None).await.unwrap(), vec![0xB1; 16384]);
    assert_eq!(snapshot_names(&a).await, ["g1", "s1"]);
    assert_eq!(snapshot_names(&b).await, ["g1", "s1"]);

    // ...and so does a takeover.
    assert!(a.session().revoke_node("b").await.unwrap());
    wait("a to take the pool over", 15, async || {
        ta.ana_state(g) == AnaState::Optimized
    })
    .await;
    for (n, want) in [(1, 0xA1), (2, 0xA2), (3, 0xA1), (4, 0xC1)] {
        assert_eq!(read(&ta, n).await.unwrap(), vec![want; 16384], "nsid {n}");
    }
    assert!(ns(&ta, 3).unwrap().read_only());
    assert_eq!(snapshot_names(&a).await, ["g1", "s1"]);

    // Deleted in any order: the snapshot first (a volume, a snapshot and a
    // clone read from it; it holds data, so force), then the volume, the
    // clone, the last snapshot. Each time the others read as before.
    assert!(matches!(
        a.delete("s1", false).await,
        Err(NodeError::Conflict(m)) if m.contains("holds data")
    ));
    a.delete("s1", true).await.unwrap().unwrap();
    assert!(ns(&ta, 3).is_none());
    assert_eq!(read(&ta, 1).await.unwrap(), vec![0xA1; 16384]);
    assert_eq!(read(&ta, 4).await.unwrap(), vec![0xC1; 16384]);
    a.delete("t1", true).await.unwrap().unwrap();
    assert_eq!(read(&ta, 4).await.unwrap(), vec![0xC1; 16384]);
    a.delete("c1", true).await.unwrap().unwrap();
    let g1 = a.node.volume_device("g1").await.unwrap();
    assert_eq!(io(&g1, None).await.unwrap(), vec![0xB1; 16384]);
    a.delete("g1", true).await.unwrap().unwrap();
    a.delete("t2", true).await.unwrap().unwrap();
    assert_eq!(thin_count(&a).await, 0);
    let c = a.node.check_pool("p").await.unwrap();
    assert!(c.ok, "{c:?}");
    assert_eq!((c.volumes, c.snapshots, c.hidden_snapshots), (0, 0, 0));
    assert!(snapshot_names(&a).await.is_empty());
}

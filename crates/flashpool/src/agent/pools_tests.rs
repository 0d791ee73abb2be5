//! Cluster pools with two nodes in one process, a real etcd and an
//! enclosure of RAM drives: thin volumes made through either node (the
//! other passes the request to the pool's owner), served by both in the
//! pool's ANA group, carried by a planned move and by a takeover in one
//! step, and refused requests that change nothing.

use std::sync::Arc;

use blockdev::{BlockDevice, BlockError};
use nvmf_target::{AnaState, Target};

use super::Agent;
use super::tests::{NQN, Pair, io, pair, wait};
use crate::node::{CreateVolume, ExportRequest, NodeError};

fn ns(t: &Target, nsid: u32) -> Option<Arc<dyn BlockDevice>> {
    Some(t.subsystem(NQN)?.namespace(nsid)?.dev.clone())
}

fn req(name: &str) -> CreateVolume {
    CreateVolume {
        layout: None,
        ..crate::node::testing::volume(name, "", &[])
    }
}

fn thin(name: &str, nsid: Option<u32>) -> CreateVolume {
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
    let pool = |nsid| CreateVolume {
        layout: Some("raid5".into()),
        drives: vec!["e1:d0".into(), "e1:d1".into(), "e1:d2".into()],
        thin_pool: true,
        export: Some(ExportRequest {
            nqn: NQN.into(),
            nsid,
        }),
        ..req("p")
    };
    assert!(matches!(
        a.create(pool(3)).await,
        Err(NodeError::BadRequest(m)) if m.contains("without --nsid")
    ));
    let p = a.create(pool(0)).await.unwrap();
    assert!(p.export.is_none(), "{p:?}");
    let g = a.status().await.unwrap().volumes[0].ana_group;
    assert_eq!(ta.ana_state(g), AnaState::Optimized);

    // Thin volumes through the owner, and through b (passed on to a).
    let t1 = a.create(thin("t1", None)).await.unwrap();
    let t2 = b.create(thin("t2", None)).await.unwrap();
    let t3 = a.create(thin("t3", Some(7))).await.unwrap();
    let nsid = |v: &crate::node::VolumeInfo| v.export.as_ref().map(|x| x.nsid);
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

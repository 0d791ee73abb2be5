//! A cluster pool that grows: an extent made through either node (the
//! other passes the request on to the pool's owner), recorded with the
//! pool, holding the pool's data past its base, and carried with the pool
//! by a planned move and a takeover; refused expansions that change
//! nothing; deleted with the pool.

use std::sync::Arc;

use blockdev::{BlockDevice, BlockError};
use nvmf_target::AnaState;

use super::Agent;
use super::pools_tests::{ns, pool_req, thin};
use super::tests::{Pair, io_at, pair_with, wait};
use crate::api_types::ExpandPool;
use crate::node::CreateVolume;

const MIB: usize = 1 << 20;

/// Writes (`Some(fill)`) or reads one MiB at MiB `i` of `dev`.
async fn mib(dev: &Arc<dyn BlockDevice>, i: u64, fill: Option<u8>) -> Result<Vec<u8>, BlockError> {
    io_at(dev, i * (MIB as u64 / 4096), MIB, fill).await
}

/// An extent of raid1 on `drives`.
pub(super) fn grow_on(drives: &[&str]) -> ExpandPool {
    ExpandPool {
        drives: drives.iter().map(|d| d.to_string()).collect(),
        name: None,
        layout: Some("raid1".into()),
        strip: None,
    }
}

/// Pool `p`'s capacity and extents as node `ag` runs it.
async fn pool_of(ag: &Agent) -> (u64, Vec<String>) {
    let p = ag.node.volume("p").await.unwrap().thin_pool.unwrap();
    (
        p.capacity_bytes,
        p.extents.iter().map(|x| x.volume.clone()).collect(),
    )
}

/// Extent `p-x1`'s member-state record, as `ag` reads it.
async fn extent_record(ag: &Agent) -> cluster::VolumeState {
    let st = ag.session().extent_state("p", "p-x1").await.unwrap();
    st.expect("a record of extent p-x1")
}

async fn recorded_extents(ag: &Agent) -> Vec<String> {
    let spec = ag.session().spec("p").await.unwrap().unwrap();
    spec.extents.iter().map(|x| x.name.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_pool_grows_and_its_extent_moves_with_it() {
    let Some(Pair {
        etcd,
        enc: _enc,
        a,
        ta,
        b,
        tb,
    }) = pair_with(6).await
    else {
        return;
    };
    a.create(pool_req(0)).await.unwrap();
    a.create(CreateVolume {
        size: Some("64MiB".into()),
        ..thin("t1", Some(1))
    })
    .await
    .unwrap();
    let g = a.status().await.unwrap().volumes[0].ana_group;
    let (base, none) = pool_of(&a).await;
    assert!(none.is_empty());

    // Refused, and nothing changes: a member of the pool, a name taken, no
    // drives, a thin volume, a drive no peer has.
    for (r, what) in [
        (grow_on(&["e1:d3", "e1:d1"]), "member of p"),
        (
            ExpandPool {
                name: Some("t1".into()),
                ..grow_on(&["e1:d3", "e1:d4"])
            },
            "t1",
        ),
        (grow_on(&[]), "drives"),
        (grow_on(&["e9:d0", "e1:d4"]), "e9"),
    ] {
        let e = b.expand("p", r).await.unwrap_err();
        assert!(e.to_string().contains(what), "{what}: {e}");
    }
    assert!(matches!(
        a.expand("t1", grow_on(&["e1:d3", "e1:d4"])).await,
        Ok(None)
    ));
    assert!(recorded_extents(&a).await.is_empty());
    assert_eq!(pool_of(&a).await, (base, vec![]));
    assert!(a.node.volume("p-x1").await.is_err());

    // Grown through b (passed on to a, the owner): recorded with the pool.
    let v = b
        .expand("p", grow_on(&["e1:d3", "e1:d4"]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v.owner.as_deref(), Some("a"));
    let (grown, extents) = pool_of(&a).await;
    assert!(grown > base + (8 << 20), "{base} -> {grown}");
    assert_eq!(extents, ["p-x1"]);
    assert_eq!(recorded_extents(&a).await, ["p-x1"]);
    let on_b = b.status().await.unwrap().volumes[0].extents.clone();
    assert_eq!((on_b[0].name.as_str(), on_b[0].drives.len()), ("p-x1", 2));
    assert_eq!(extent_record(&a).await.members, ["active", "active"]);
    // Its drives are taken now.
    let e = a
        .expand("p", grow_on(&["e1:d4", "e1:d5"]))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("member of p-x1"), "{e}");

    // Data past the base's capacity lands on the extent.
    let dev = ns(&ta, 1).unwrap();
    let n = (base as usize / MIB + 4).min(64) as u64;
    for i in 0..n {
        mib(&dev, i, Some(i as u8 + 1)).await.unwrap();
    }
    let used = a.node.volume("p").await.unwrap().thin_pool.unwrap();
    assert!(used.allocated_bytes > base, "{used:?}");

    let check = async |dev: &Arc<dyn BlockDevice>| {
        for i in 0..n {
            let got = mib(dev, i, None).await.unwrap();
            assert!(got.iter().all(|b| *b == i as u8 + 1), "MiB {i}");
        }
    };

    // A planned move carries the extent: b opens the pool with it.
    a.move_volume("p", "b").await.unwrap();
    assert_eq!(tb.ana_state(g), AnaState::Optimized);
    assert_eq!(pool_of(&b).await, (grown, vec!["p-x1".to_string()]));
    assert!(a.node.volume("p-x1").await.is_err(), "a let go of it");
    check(&ns(&tb, 1).unwrap()).await;

    // b's lease is revoked: a takes the pool over, extent and all.
    assert!(a.session().revoke_node("b").await.unwrap());
    wait("a to take the pool over", 15, async || {
        ta.ana_state(g) == AnaState::Optimized
    })
    .await;
    assert_eq!(pool_of(&a).await, (grown, vec!["p-x1".to_string()]));
    check(&ns(&ta, 1).unwrap()).await;
    wait("b to let go of the extent", 10, async || {
        b.node.volume("p-x1").await.is_err()
    })
    .await;
    // The extent's record is the new owner's.
    let owner = a.session().owner("p").await.unwrap().unwrap();
    assert_eq!(extent_record(&a).await.epoch, owner.epoch);

    // Deleted with the pool: its volume and its record (once the
    // takeover's resync of the extent is over: refused until then, and
    // nothing changed).
    a.delete("t1", true).await.unwrap().unwrap();
    let resyncing = async || {
        let x = a.node.volume("p-x1").await.unwrap();
        x.rebuild.running || x.state != "optimal"
    };
    if resyncing().await {
        let e = a.delete("p", true).await.unwrap_err();
        assert!(e.to_string().contains("p-x1"), "{e}");
        assert_eq!(
            ta.ana_state(g),
            AnaState::Optimized,
            "the pool is still served"
        );
    }
    wait("the extent's resync", 20, async || !resyncing().await).await;
    a.delete("p", true).await.unwrap().unwrap();
    let x = a.node.volume("p-x1").await;
    assert!(x.is_err(), "{x:?}");
    let left = cluster::testing::keys_under(&etcd.endpoint(), "/flashpool/t/volumes/p/")
        .await
        .unwrap();
    assert!(left.is_empty(), "{left:?}");
    assert!(matches!(
        a.expand("p", grow_on(&["e1:d3", "e1:d4"])).await,
        Ok(None)
    ));
}

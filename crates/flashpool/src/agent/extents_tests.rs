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
use super::tests::{Pair, io_at, member_of, pair_with, wait};
use crate::api_types::ExpandPool;
use crate::node::CreateVolume;
use crate::node::identity::node_host_nqn;
use crate::node::remote_tests::Enclosure;

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

/// Writes MiB after MiB (MiB `i` holds `i + 1`) to thin volume `dev` of
/// pool `p`, run by `ag`, until the pool holds more than `base` bytes (its
/// base's capacity): the last ones are on its extent. How many it wrote.
async fn fill_past(ag: &Agent, dev: &Arc<dyn BlockDevice>, base: u64) -> u64 {
    let n = (base as usize / MIB + 4).min(64) as u64;
    for i in 0..n {
        mib(dev, i, Some(i as u8 + 1)).await.unwrap();
    }
    let used = ag.node.volume("p").await.unwrap().thin_pool.unwrap();
    assert!(used.allocated_bytes > base, "{used:?}");
    n
}

/// What [`fill_past`] wrote reads back.
async fn check_mibs(dev: &Arc<dyn BlockDevice>, n: u64) {
    for i in 0..n {
        let got = mib(dev, i, None).await.unwrap();
        assert!(got.iter().all(|b| *b == i as u8 + 1), "MiB {i}");
    }
}

/// Pool `p` (raid5 on e1:d0..d2) made through `ag`, with thin volume `t1`
/// of 64 MiB as nsid 1; the pool's ANA group.
async fn pool_with_t1(ag: &Arc<Agent>) -> u32 {
    ag.create(pool_req(0)).await.unwrap();
    ag.create(CreateVolume {
        size: Some("64MiB".into()),
        ..thin("t1", Some(1))
    })
    .await
    .unwrap();
    ag.status().await.unwrap().volumes[0].ana_group
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
    let g = pool_with_t1(&a).await;
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
    // A drive held by a change under way: refused, nothing changed.
    let d4 = vec![b.node.cluster().resolve("e1:d4").unwrap()];
    let held = b.session().take_drives(&d4, "vother").await.unwrap();
    let e = b
        .expand("p", grow_on(&["e1:d3", "e1:d4"]))
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("being taken by a change of volume vother"),
        "{e}"
    );
    b.session().release_drives(&held).await.unwrap();
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
    let n = fill_past(&a, &ns(&ta, 1).unwrap(), base).await;
    let check = async |dev: &Arc<dyn BlockDevice>| check_mibs(dev, n).await;

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

/// An extent that lost a member with its enclosure, and an owner killed
/// after: the survivor takes the pool over with the extent degraded (its
/// record says which member failed), serving everything written, and the
/// member comes back by resync once its enclosure does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_is_taken_over_with_its_extent_degraded() {
    if !cluster::testing::etcd_available() && std::env::var("FLASHPOOL_SKIP_ETCD").is_ok() {
        return;
    }
    let etcd = cluster::testing::EtcdServer::start().expect("etcd");
    let hosts = [node_host_nqn("a"), node_host_nqn("b")];
    let e1 = Enclosure::new("e1", 4, &hosts);
    let mut e2 = Enclosure::new("e2", 1, &hosts);
    let (a, ta) = member_of("a", &[&e1, &e2], &etcd.endpoint()).await;
    let (b, tb) = member_of("b", &[&e1, &e2], &etcd.endpoint()).await;
    let g = pool_with_t1(&a).await;
    let (base, _) = pool_of(&a).await;
    a.expand("p", grow_on(&["e1:d3", "e2:d0"]))
        .await
        .unwrap()
        .unwrap();
    let n = fill_past(&a, &ns(&ta, 1).unwrap(), base).await;

    // e2 goes away: the owner fails the extent's member there (recorded).
    e2.stop();
    wait("a to fail the extent's member on e2", 15, async || {
        mib(&ns(&ta, 1).unwrap(), n - 1, Some(n as u8))
            .await
            .is_ok()
            && extent_record(&a)
                .await
                .members
                .contains(&"failed".to_string())
    })
    .await;
    // then a's lease is revoked: b takes the pool over, the extent degraded
    assert!(b.session().revoke_node("a").await.unwrap());
    wait("b to take the pool over", 15, async || {
        tb.ana_state(g) == AnaState::Optimized
    })
    .await;
    let dev = ns(&tb, 1).unwrap();
    check_mibs_but_last(&dev, n).await;
    let x = b.node.volume("p-x1").await.unwrap();
    assert_eq!(x.state, "degraded", "{x:?}");
    assert_eq!(ta.ana_state(g), AnaState::Inaccessible);

    // e2 is back: the member is resynced from the one b kept.
    e2.start();
    wait("the extent to be optimal again", 30, async || {
        b.node
            .volume("p-x1")
            .await
            .is_ok_and(|x| x.state == "optimal")
    })
    .await;
    check_mibs_but_last(&dev, n).await;
}

/// [`check_mibs`], the last MiB rewritten with `n` after the first fill.
async fn check_mibs_but_last(dev: &Arc<dyn BlockDevice>, n: u64) {
    check_mibs(dev, n - 1).await;
    let last = mib(dev, n - 1, None).await.unwrap();
    assert!(last.iter().all(|b| *b == n as u8));
}

/// An expansion cut short after its first step (recorded, then the owner
/// died before it made the extent): the next owner opens the pool without
/// it, then takes the record out, so that its drives are free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_of_an_expansion_cut_short_is_taken_out_by_the_next_owner() {
    let Some(Pair {
        etcd: _etcd,
        enc: _enc,
        a,
        ta: _ta,
        b,
        tb,
    }) = pair_with(6).await
    else {
        return;
    };
    let g = pool_with_t1(&a).await;
    let s = a.session();
    let spec = s.spec("p").await.unwrap().unwrap();
    let owner = s.owner("p").await.unwrap().unwrap();
    let mut cut = spec.clone();
    let url = |d: &str| a.node.cluster().resolve(d).unwrap();
    cut.extents.push(cluster::ExtentSpec {
        name: "p-x1".into(),
        drives: vec![url("e1:d3"), url("e1:d4")],
        joining: Vec::new(),
        layout: spec.layout.clone(),
    });
    s.update_spec(&spec, &cut, owner.epoch).await.unwrap();
    // While recorded, its drives are taken.
    let e = a
        .expand("p", grow_on(&["e1:d4", "e1:d5"]))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("member of p-x1"), "{e}");
    // The cut-short expansion had made its volume here already: the move
    // lets go of it with the pool (before, it stayed open here for ever,
    // on drives the next owner frees).
    a.node
        .create_volume(crate::node::testing::volume(
            "p-x1",
            "raid1",
            &["e1:d3", "e1:d4"],
        ))
        .await
        .unwrap();

    a.move_volume("p", "b").await.unwrap();
    assert_eq!(tb.ana_state(g), AnaState::Optimized);
    assert!(a.node.volume_device("p-x1").await.is_none());
    wait("b to take the record out", 10, async || {
        recorded_extents(&b).await.is_empty()
    })
    .await;
    // The drives are free: the pool grows on them.
    b.expand("p", grow_on(&["e1:d3", "e1:d4"]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(recorded_extents(&b).await, ["p-x1"]);
    assert_eq!(pool_of(&b).await.1, ["p-x1"]);
}

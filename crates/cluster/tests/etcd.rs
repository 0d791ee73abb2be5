//! Against a real etcd (`apt-get install etcd-server`).

use std::time::{Duration, Instant};

use cluster::testing::{EtcdServer, etcd_available};
use cluster::{
    ClusterConfig, ClusterError, ClusterEvent, Handoff, LeaseHealth, Session, VolumeSpec,
    VolumeState,
};

mod common;
use common::{join, next_event, rec};

/// A volume spec of its own subsystem, as NSID 1.
fn spec(name: &str, ana_group: u32) -> VolumeSpec {
    VolumeSpec {
        nqn: format!("nqn.2024-01.io.flashpool:{name}"),
        nsid: 1,
        ..common::spec(name, ana_group, false)
    }
}

macro_rules! etcd {
    () => {{
        if !etcd_available() {
            return;
        }
        EtcdServer::start().unwrap()
    }};
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_gives_distinct_slots_and_refuses_a_live_name() {
    let etcd = etcd!();
    let eps = vec![etcd.endpoint()];
    let a = join(&eps, "a").await;
    let b = join(&eps, "b").await;
    let c = join(&eps, "c").await;
    let mut slots = vec![a.slot(), b.slot(), c.slot()];
    slots.sort();
    assert_eq!(slots, [0, 1, 2]);
    assert_eq!(
        a.cntlid_range()
            .0
            .max(b.cntlid_range().0)
            .max(c.cntlid_range().0),
        2048
    );
    assert!(a.is_valid());
    let nodes = a.nodes().await.unwrap();
    assert_eq!(nodes.len(), 3);
    assert!(nodes.iter().all(|n| n.lease != 0));
    assert!(
        a.lease_ttl_left(b.lease_id())
            .await
            .unwrap()
            .is_some_and(|t| t >= 1)
    );

    match Session::join(ClusterConfig::new(eps.clone(), "t", "b"), rec("b")).await {
        Err(ClusterError::NodeNameInUse(n)) => assert_eq!(n, "b"),
        Err(e) => panic!("expected NodeNameInUse, got {e}"),
        Ok(_) => panic!("expected NodeNameInUse, joined"),
    }
    // a dead node's slot stays its home: a newcomer takes another one (a
    // host may still hold the dead node's controller IDs), and the node
    // gets its own back when it returns
    let bs = b.slot();
    b.leave().await;
    assert!(!b.is_valid());
    let d = join(&eps, "d").await;
    assert_eq!(d.slot(), 3);
    assert_eq!(a.lease_ttl_left(b.lease_id()).await.unwrap(), None);
    let b2 = join(&eps, "b").await;
    assert_eq!(b2.slot(), bs);
}

/// A start that fails after its join takes back what the join wrote: the
/// record and slot (with the lease) and a home slot it had not had before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_join_leaves_no_home_slot_it_did_not_have() {
    let etcd = etcd!();
    let eps = vec![etcd.endpoint()];
    let homes = || async {
        cluster::testing::keys_under(&eps[0], "/flashpool/t/slot-home/")
            .await
            .unwrap()
    };
    let a = join(&eps, "a").await;
    assert_eq!(a.slot(), 0);
    a.abandon().await;
    assert!(!a.is_valid());
    assert_eq!(homes().await, vec![], "a's first start failed: no home");
    // so a newcomer may take slot 0
    let b = join(&eps, "b").await;
    assert_eq!(b.slot(), 0);
    b.leave().await;
    // b's home (0) was its own before this start: an abandoned start keeps it
    let b2 = join(&eps, "b").await;
    assert_eq!(b2.slot(), 0);
    b2.abandon().await;
    assert_eq!(
        homes().await,
        vec![("/flashpool/t/slot-home/b".to_string(), "0".to_string())]
    );
    assert_eq!(join(&eps, "c").await.slot(), 1, "0 is still b's home");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_race_has_one_winner_and_revoke_frees_the_volume() {
    let etcd = etcd!();
    let eps = vec![etcd.endpoint()];
    let mut sessions = Vec::new();
    for i in 0..8 {
        sessions.push(join(&eps, &format!("n{i}")).await);
    }
    let watcher = join(&eps, "w").await;
    let mut ev = watcher.events();
    watcher.create_spec(&spec("v1", 1)).await.unwrap();
    assert!(matches!(
        watcher.create_spec(&spec("v1", 1)).await,
        Err(ClusterError::VolumeExists(_))
    ));
    assert_eq!(watcher.free_ana_group().await.unwrap(), 2);

    let results = futures_join(sessions.iter().map(|s| {
        let s = s.clone();
        async move { s.claim("v1").await }
    }))
    .await;
    let winners: Vec<_> = results
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.as_ref().unwrap().clone().map(|o| (i, o)))
        .collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    let (wi, owner) = winners[0].clone();
    assert_eq!(owner.epoch, 1);
    assert_eq!(owner.node, format!("n{wi}"));
    assert_eq!(watcher.owner("v1").await.unwrap(), Some(owner.clone()));
    // the winner claiming again keeps it; a loser gets None
    assert_eq!(sessions[wi].claim("v1").await.unwrap(), Some(owner.clone()));
    assert_eq!(sessions[(wi + 1) % 8].claim("v1").await.unwrap(), None);

    // revoke the winner's lease: owner key goes, OwnerGone arrives, next claim is epoch 2
    assert!(watcher.revoke_node(&owner.node).await.unwrap());
    // both come from one revision, in either order
    let (mut owner_gone, mut node_down) = (false, false);
    while !(owner_gone && node_down) {
        let e = next_event(
            &mut ev,
            |e| matches!(e, ClusterEvent::OwnerGone(_) | ClusterEvent::NodeDown(_)),
            Duration::from_secs(2),
        )
        .await;
        owner_gone |= e == ClusterEvent::OwnerGone("v1".into());
        node_down |= e == ClusterEvent::NodeDown(owner.node.clone());
    }
    assert_eq!(watcher.owner("v1").await.unwrap(), None);
    let other = &sessions[(wi + 1) % 8];
    let o2 = other.claim("v1").await.unwrap().unwrap();
    assert_eq!(o2.epoch, 2);
    assert!(matches!(
        next_event(&mut ev, |e| matches!(e, ClusterEvent::OwnerSet(..)), Duration::from_secs(2)).await,
        ClusterEvent::OwnerSet(v, o) if v == "v1" && o == o2
    ));
}

async fn futures_join<F: std::future::Future + Send + 'static>(
    fs: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let hs: Vec<_> = fs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in hs {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_and_handoff_are_guarded_by_the_epoch() {
    let etcd = etcd!();
    let eps = vec![etcd.endpoint()];
    let a = join(&eps, "a").await;
    let b = join(&eps, "b").await;
    a.create_spec(&spec("v", 1)).await.unwrap();
    assert!(matches!(
        a.set_handoff(
            "v",
            &Handoff {
                to: "b".into(),
                epoch: 1
            }
        )
        .await,
        Err(ClusterError::NotOwned { .. })
    ));
    let o = a.claim("v").await.unwrap().unwrap();
    let st = VolumeState {
        epoch: o.epoch,
        generation: 7,
        members: vec!["m".into()],
        note: "ok".into(),
        serving: false,
    };
    a.put_state("v", &st).await.unwrap();
    assert_eq!(b.state("v").await.unwrap(), Some(st.clone()));
    // b is not the owner
    assert!(matches!(
        b.put_state("v", &st).await,
        Err(ClusterError::Deposed { .. })
    ));
    // a moves on: release, b claims epoch 2, a's stale epoch is refused
    assert!(!a.release("v", o.epoch + 1).await.unwrap());
    assert!(a.release("v", o.epoch).await.unwrap());
    let o2 = b.claim("v").await.unwrap().unwrap();
    assert_eq!(o2.epoch, 2);
    match a.put_state("v", &st).await {
        Err(ClusterError::Deposed { volume, epoch }) => {
            assert_eq!((volume.as_str(), epoch), ("v", 1))
        }
        r => panic!("expected Deposed, got {r:?}"),
    }
    // handoff only for the current epoch
    let mut ev = a.events();
    assert!(matches!(
        a.set_handoff(
            "v",
            &Handoff {
                to: "a".into(),
                epoch: 1
            }
        )
        .await,
        Err(ClusterError::Deposed { .. })
    ));
    let h = Handoff {
        to: "a".into(),
        epoch: 2,
    };
    a.set_handoff("v", &h).await.unwrap();
    assert_eq!(b.handoff("v").await.unwrap(), Some(h.clone()));
    next_event(
        &mut ev,
        |e| *e == ClusterEvent::HandoffSet("v".into(), h.clone()),
        Duration::from_secs(2),
    )
    .await;
    // Only the handoff named: a newer one stays.
    let other = Handoff {
        to: "c".into(),
        epoch: 2,
    };
    b.clear_handoff("v", &other).await.unwrap();
    assert_eq!(b.handoff("v").await.unwrap(), Some(h.clone()));
    b.clear_handoff("v", &h).await.unwrap();
    next_event(
        &mut ev,
        |e| *e == ClusterEvent::HandoffCleared("v".into()),
        Duration::from_secs(2),
    )
    .await;
    assert_eq!(a.handoff("v").await.unwrap(), None);
    // delete is guarded too
    assert!(matches!(
        a.delete_volume("v", 2).await,
        Err(ClusterError::Deposed { .. })
    ));
    b.delete_volume("v", 2).await.unwrap();
    assert_eq!(a.spec("v").await.unwrap(), None);
    assert_eq!(a.owner("v").await.unwrap(), None);
    assert_eq!(a.state("v").await.unwrap(), None);
    // A claim after the delete (a node that read the volume before it, a
    // drain's pass) takes nothing, and leaves no key behind.
    let before = a.read_volume("v").await.unwrap();
    assert_eq!(a.claim_from("v", &before).await.unwrap(), None);
    assert_eq!(a.claim("v").await.unwrap(), None);
    assert_eq!(a.owner("v").await.unwrap(), None);
    let left = cluster::testing::keys_under(&etcd.endpoint(), "/")
        .await
        .unwrap();
    assert!(
        !left.iter().any(|(k, _)| k.contains("/volumes/v/")),
        "{left:?}"
    );
    next_event(
        &mut ev,
        |e| *e == ClusterEvent::SpecDeleted("v".into()),
        Duration::from_secs(2),
    )
    .await;
    // drain marks
    a.set_drain("b", true).await.unwrap();
    assert_eq!(a.draining().await.unwrap(), ["b"]);
    next_event(
        &mut ev,
        |e| *e == ClusterEvent::Drain("b".into(), true),
        Duration::from_secs(2),
    )
    .await;
    a.set_drain("b", false).await.unwrap();
    assert!(a.draining().await.unwrap().is_empty());
    next_event(
        &mut ev,
        |e| *e == ClusterEvent::Drain("b".into(), false),
        Duration::from_secs(2),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_reports_nodes_and_specs() {
    let etcd = etcd!();
    let eps = vec![etcd.endpoint()];
    let a = join(&eps, "a").await;
    let mut ev = a.events();
    let b = join(&eps, "b").await;
    match next_event(
        &mut ev,
        |e| matches!(e, ClusterEvent::NodeUp(_)),
        Duration::from_secs(2),
    )
    .await
    {
        ClusterEvent::NodeUp(r) => {
            assert_eq!(
                (r.name.as_str(), r.slot, r.lease),
                ("b", b.slot(), b.lease_id())
            );
            assert_eq!(r.portals, rec("b").portals);
        }
        e => panic!("{e:?}"),
    }
    b.create_spec(&spec("v9", 3)).await.unwrap();
    assert_eq!(
        next_event(
            &mut ev,
            |e| matches!(e, ClusterEvent::SpecPut(_)),
            Duration::from_secs(2)
        )
        .await,
        ClusterEvent::SpecPut(spec("v9", 3))
    );
    assert_eq!(a.specs().await.unwrap(), [spec("v9", 3)]);
    assert_eq!(a.free_ana_group().await.unwrap(), 1);
    b.leave().await;
    next_event(
        &mut ev,
        |e| *e == ClusterEvent::NodeDown("b".into()),
        Duration::from_secs(2),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_loss_is_reported_by_the_deadline_and_owner_keys_vanish() {
    let etcd = etcd!();
    let eps = vec![etcd.endpoint()];
    let a = join(&eps, "a").await;
    let b = join(&eps, "b").await;
    let mut ev = b.events();
    a.create_spec(&spec("v", 1)).await.unwrap();
    let o = a.claim("v").await.unwrap().unwrap();
    // keep-alives run: after two TTLs it is still live
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(a.is_valid());
    let mut health = a.health();
    let t0 = Instant::now();
    let before = a.valid_until().unwrap();
    a.pause_keepalive_for_test(Duration::from_secs(30));
    tokio::time::timeout(
        Duration::from_secs(2),
        health.wait_for(|h| matches!(h, LeaseHealth::Lost(_))),
    )
    .await
    .expect("health did not turn Lost within the TTL")
    .unwrap();
    let lost_after = t0.elapsed();
    assert!(Instant::now() >= before, "lost before the deadline");
    assert!(!a.is_valid());
    assert_eq!(a.valid_until(), None);
    eprintln!("lease lost {lost_after:?} after keep-alives stopped");
    // the owner key goes with the lease (etcd expiry or the watchdog's revoke)
    next_event(
        &mut ev,
        |e| *e == ClusterEvent::OwnerGone("v".into()),
        Duration::from_secs(3),
    )
    .await;
    assert_eq!(b.owner("v").await.unwrap(), None);
    assert!(matches!(
        a.put_state(
            "v",
            &VolumeState {
                epoch: o.epoch,
                generation: 1,
                members: vec![],
                note: String::new(),
                serving: false,
            }
        )
        .await,
        Err(ClusterError::Deposed { .. })
    ));
    // the dead session cannot claim: its lease is gone
    b.create_spec(&spec("w", 2)).await.unwrap();
    match a.claim("w").await {
        Err(ClusterError::LeaseLost(m)) => eprintln!("claim on a lost session: {m}"),
        r => panic!("expected LeaseLost, got {r:?}"),
    }
    // the node can join again with a new session
    let a2 = join(&eps, "a").await;
    assert_eq!(a2.claim("v").await.unwrap().unwrap().epoch, 2);
}

/// `Session::volumes` reads every volume's keys in one range and answers
/// what reading each key on its own does: specs in name order, owned or
/// not, with or without state and handoff, and `v1` and `v10` kept apart.
#[tokio::test]
async fn one_range_read_gives_what_reads_per_volume_give() {
    let etcd = etcd!();
    let eps = vec![etcd.endpoint()];
    let a = join(&eps, "a").await;
    for (i, v) in ["v2", "v1", "v10", "v3"].iter().enumerate() {
        a.create_spec(&spec(v, i as u32 + 1)).await.unwrap();
    }
    for v in ["v1", "v10", "v3"] {
        a.claim(v).await.unwrap().unwrap();
    }
    let st = VolumeState {
        epoch: 1,
        generation: 3,
        members: vec!["m".into()],
        note: "ok".into(),
        serving: false,
    };
    a.put_state("v1", &st).await.unwrap();
    a.put_state("v3", &st).await.unwrap();
    let h = Handoff {
        to: "b".into(),
        epoch: 1,
    };
    a.set_handoff("v3", &h).await.unwrap();
    let mut one_by_one = Vec::new();
    for spec in a.specs().await.unwrap() {
        let v = spec.name.clone();
        one_by_one.push(cluster::VolumeRecord {
            spec,
            owner: a.owner(&v).await.unwrap(),
            state: a.state(&v).await.unwrap(),
            handoff: a.handoff(&v).await.unwrap(),
        });
    }
    let ranged = a.volumes().await.unwrap();
    assert_eq!(ranged, one_by_one);
    let names: Vec<&str> = ranged.iter().map(|r| r.spec.name.as_str()).collect();
    assert_eq!(names, ["v1", "v10", "v2", "v3"]);
    assert_eq!(ranged[3].handoff, Some(h));
    assert!(ranged[2].owner.is_none() && ranged[2].state.is_none());
    // A pass's view holds each volume's keys as read_volume reads them, its
    // epoch (which a claim on the read compares) included.
    let view = a.pass_view().await.unwrap();
    assert_eq!(view.reads.len(), 4);
    for v in ["v1", "v10", "v2", "v3"] {
        assert_eq!(view.reads[v], a.read_volume(v).await.unwrap(), "{v}");
    }
    // A claim on a pass's read fails once another claim came between
    // (the epoch key moved on, although the volume is unowned again):
    // claim_on then claims nothing; claim_from reads again and claims.
    let stale = view.reads["v2"].clone();
    let b = join(&eps, "b").await;
    assert_eq!(b.claim("v2").await.unwrap().unwrap().epoch, 1);
    assert!(b.release("v2", 1).await.unwrap());
    assert_eq!(a.claim_on("v2", &stale).await.unwrap(), None);
    let (o, unchanged) = a.claim_from("v2", &stale).await.unwrap().unwrap();
    assert_eq!((o.epoch, unchanged), (2, false));
    // On a read nobody came after, the claim holds, its read still current.
    a.create_spec(&spec("v4", 5)).await.unwrap();
    let view = a.pass_view().await.unwrap();
    let o = a.claim_on("v4", &view.reads["v4"]).await.unwrap().unwrap();
    assert_eq!(o.epoch, 1);
    // A read that shows an owner is not claimed on, whatever came since.
    let owned = a.read_volume("v4").await.unwrap();
    assert_eq!(b.claim_on("v4", &owned).await.unwrap(), None);
}

fn thin(name: &str, pool: &str, nsid: u32) -> cluster::ThinSpec {
    cluster::ThinSpec {
        name: name.into(),
        pool: pool.into(),
        uuid: format!("00000000-0000-0000-0000-0000000000{nsid:02}"),
        nsid,
        size_bytes: 1 << 30,
        block_size: 4096,
        serial: format!("T{nsid}"),
        snapshot: false,
        origin: None,
    }
}

/// Thin volumes of cluster pools: only the pool's owner at its epoch
/// writes them; names and NSIDs are unique across pools and against
/// volumes; a refused create writes nothing; the watch names the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thin_volumes_are_guarded_by_the_pool_owner_and_unique() {
    let etcd = etcd!();
    let eps = vec![etcd.endpoint()];
    let a = join(&eps, "a").await;
    let b = join(&eps, "b").await;
    let mut rx = b.events();
    let nqn = "nqn.2024-01.io.flashpool:pools";
    for (p, g) in [("p1", 1), ("p2", 2)] {
        let mut sp = spec(p, g);
        sp.thin_pool = true;
        a.create_spec(&sp).await.unwrap();
    }
    a.create_spec(&spec("vol", 3)).await.unwrap();
    let p1 = a.claim("p1").await.unwrap().unwrap();
    let p2 = b.claim("p2").await.unwrap().unwrap();
    a.create_thin(&thin("t1", "p1", 1), nqn, p1.epoch)
        .await
        .unwrap();
    let e = next_event(
        &mut rx,
        |e| matches!(e, ClusterEvent::ThinChanged(_)),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(e, ClusterEvent::ThinChanged("p1".into()));
    // not the owner of p1 (b), or an old epoch: refused
    assert!(matches!(
        b.create_thin(&thin("t2", "p1", 2), nqn, p1.epoch).await,
        Err(ClusterError::Deposed { .. })
    ));
    assert!(matches!(
        a.create_thin(&thin("t2", "p1", 2), nqn, p1.epoch + 1).await,
        Err(ClusterError::Deposed { .. })
    ));
    // the name taken by a thin volume of another pool, or by a volume
    assert!(matches!(
        b.create_thin(&thin("t1", "p2", 5), nqn, p2.epoch).await,
        Err(ClusterError::VolumeExists(n)) if n == "t1"
    ));
    assert!(matches!(
        b.create_thin(&thin("vol", "p2", 5), nqn, p2.epoch).await,
        Err(ClusterError::VolumeExists(n)) if n == "vol"
    ));
    // the NSID taken in the same subsystem; another subsystem is fine
    assert!(matches!(
        b.create_thin(&thin("t3", "p2", 1), nqn, p2.epoch).await,
        Err(ClusterError::NsidTaken { nsid: 1, .. })
    ));
    b.create_thin(
        &thin("t3", "p2", 1),
        "nqn.2024-01.io.flashpool:other",
        p2.epoch,
    )
    .await
    .unwrap();
    assert_eq!(a.thin_specs("p1").await.unwrap(), vec![thin("t1", "p1", 1)]);
    assert_eq!(a.thin_specs("p2").await.unwrap(), vec![thin("t3", "p2", 1)]);
    assert_eq!(a.pool_of("t3").await.unwrap().as_deref(), Some("p2"));
    assert_eq!(a.thin_nsids(nqn).await.unwrap(), vec![1]);
    // a thin volume does not show as a volume spec, even named like a key
    a.create_thin(&thin("spec", "p1", 9), nqn, p1.epoch)
        .await
        .unwrap();
    let mut names: Vec<String> = a
        .specs()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    names.sort();
    assert_eq!(names, ["p1", "p2", "vol"]);
    assert_eq!(a.volumes().await.unwrap().len(), 3);
    // grown by its owner only
    let mut grown = thin("t1", "p1", 1);
    grown.size_bytes *= 2;
    assert!(b.update_thin(&grown, p1.epoch).await.is_err());
    a.update_thin(&grown, p1.epoch).await.unwrap();
    assert_eq!(a.thin_specs("p1").await.unwrap()[1], grown);
    // deleted by its owner only; the name and NSID are free again
    assert!(b.delete_thin(&grown, nqn, p1.epoch).await.is_err());
    a.delete_thin(&grown, nqn, p1.epoch).await.unwrap();
    assert_eq!(a.pool_of("t1").await.unwrap(), None);
    b.create_thin(&thin("t1", "p2", 1), nqn, p2.epoch)
        .await
        .unwrap();
    // snapshots not served (NSID 0) claim no NSID: any number of them,
    // and a delete frees no NSID another holds
    let snap = |n: &str| cluster::ThinSpec {
        snapshot: true,
        origin: Some("t1".into()),
        ..thin(n, "p2", 0)
    };
    b.create_thin(&snap("s1"), nqn, p2.epoch).await.unwrap();
    b.create_thin(&snap("s2"), nqn, p2.epoch).await.unwrap();
    assert!(matches!(
        b.create_thin(&snap("s1"), nqn, p2.epoch).await,
        Err(ClusterError::VolumeExists(n)) if n == "s1"
    ));
    assert_eq!(a.thin_nsids(nqn).await.unwrap(), vec![1, 9]);
    b.delete_thin(&snap("s1"), nqn, p2.epoch).await.unwrap();
    assert_eq!(a.thin_nsids(nqn).await.unwrap(), vec![1, 9]);
    let left = a.thin_specs("p2").await.unwrap();
    assert_eq!(left.len(), 3, "{left:?}");
    assert!(left.contains(&snap("s2")));
    // deleting a pool removes what is left of its thin volumes
    a.delete_volume("p1", p1.epoch).await.unwrap();
    assert_eq!(a.thin_specs("p1").await.unwrap(), vec![]);
}

/// A claim on a read (`claim_from`): the read's state record is still the
/// current one when the claim's transaction succeeded on it; a read that
/// another claim overtook falls back to a fresh claim, which loses; a
/// read that shows an owner claims nothing new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_a_read_keeps_its_state_only_when_nobody_came_between() {
    let etcd = etcd!();
    let eps = vec![etcd.endpoint()];
    let (a, b) = (join(&eps, "a").await, join(&eps, "b").await);
    a.create_spec(&spec("v1", 1)).await.unwrap();
    let o1 = a.claim("v1").await.unwrap().unwrap();
    let st = VolumeState {
        epoch: o1.epoch,
        generation: 7,
        members: vec!["active".into()],
        note: "a".into(),
        serving: true,
    };
    a.put_state("v1", &st).await.unwrap();
    let r = b.read_volume("v1").await.unwrap();
    assert_eq!(
        (r.owner.clone(), r.state.clone()),
        (Some(o1.clone()), Some(st.clone()))
    );
    assert_eq!(b.claim_from("v1", &r).await.unwrap(), None, "owned by a");

    // a goes; b reads once and claims on that read: the state is current
    assert!(b.revoke_node("a").await.unwrap());
    let seen = b.read_volume("v1").await.unwrap();
    assert_eq!(
        (seen.owner.clone(), seen.state.clone()),
        (None, Some(st.clone()))
    );
    let (o2, unchanged) = b.claim_from("v1", &seen).await.unwrap().unwrap();
    assert_eq!((o2.node.as_str(), o2.epoch, unchanged), ("b", 2, true));

    // c read before b released; d claims in between: c's claim loses
    let (c, d) = (join(&eps, "c").await, join(&eps, "d").await);
    assert!(b.release("v1", o2.epoch).await.unwrap());
    let stale = c.read_volume("v1").await.unwrap();
    assert_eq!(stale.owner, None);
    let o3 = d.claim("v1").await.unwrap().unwrap();
    assert_eq!(o3.epoch, 3);
    assert_eq!(c.claim_from("v1", &stale).await.unwrap(), None);
    // ... and once d is gone, c's stale read still claims, freshly
    assert!(c.revoke_node("d").await.unwrap());
    let (o4, unchanged) = c.claim_from("v1", &stale).await.unwrap().unwrap();
    assert_eq!(
        (o4.epoch, unchanged),
        (4, false),
        "the state may have changed"
    );
}

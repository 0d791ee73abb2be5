//! A three-member etcd losing its leader, then restarted member by member,
//! under two sessions that write all along. In a binary of its own: its
//! leases must outlive the elections, which other tests' etcd servers
//! running beside it on a small machine can delay.

use std::time::{Duration, Instant};

use cluster::testing::{EtcdCluster, etcd_available};
use cluster::{ClusterConfig, ClusterEvent, LeaseHealth, Session, VolumeState};

mod common;
use common::{join, next_event, rec};

fn spec(name: &str, ana_group: u32) -> cluster::VolumeSpec {
    common::spec(name, ana_group, false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_survive_losing_the_leader() {
    if !etcd_available() {
        return;
    }
    let mut etcd = EtcdCluster::start().unwrap();
    let eps = etcd.endpoints();
    let a = join(&eps, "a").await;
    let b = join(&eps, "b").await;
    a.create_spec(&spec("va", 1)).await.unwrap();
    b.create_spec(&spec("vb", 2)).await.unwrap();
    let oa = a.claim("va").await.unwrap().unwrap();
    let ob = b.claim("vb").await.unwrap().unwrap();
    let mut ha = a.health();
    let mut hb = b.health();
    let mut ev = a.events();
    let stream = |s: Session, vol: &'static str, epoch: u64| {
        tokio::spawn(async move {
            let mut ok = 0u64;
            let mut last_err = None;
            let end = Instant::now() + Duration::from_secs(4);
            while Instant::now() < end {
                let st = VolumeState {
                    epoch,
                    generation: ok,
                    members: vec![],
                    note: String::new(),
                    serving: false,
                };
                match s.put_state(vol, &st).await {
                    Ok(()) => ok += 1,
                    Err(e) => last_err = Some(e.to_string()),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (ok, last_err)
        })
    };
    let ta = stream(a.clone(), "va", oa.epoch);
    let tb = stream(b.clone(), "vb", ob.epoch);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let leader = etcd.leader_index().expect("a leader");
    let killed_at = Instant::now();
    let mut hlog = a.health();
    let logger = tokio::spawn(async move {
        let mut gaps = Vec::new();
        let mut last = Instant::now();
        while hlog.changed().await.is_ok() {
            let h = hlog.borrow_and_update().clone();
            gaps.push(format!(
                "{:?}:{}",
                last.elapsed(),
                matches!(h, LeaseHealth::Live { .. })
            ));
            last = Instant::now();
            if killed_at.elapsed() > Duration::from_secs(3) {
                break;
            }
        }
        gaps
    });
    etcd.kill(leader);
    // a new leader appears, and claims work through it
    let c = loop {
        if let Ok(c) = Session::join(ClusterConfig::new(eps.clone(), "t", "c"), rec("c")).await {
            break c;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(5),
            "no new leader"
        );
    };
    c.create_spec(&spec("vc", 3)).await.unwrap();
    assert_eq!(c.claim("vc").await.unwrap().unwrap().epoch, 1);
    if let Ok(Ok(g)) = tokio::time::timeout(Duration::from_secs(1), logger).await {
        eprintln!("health updates of a (gap:live): {g:?}");
    }
    let (oka, ea) = ta.await.unwrap();
    let (okb, eb) = tb.await.unwrap();
    eprintln!(
        "put_state during leader loss: a {oka} ok (last error {ea:?}), b {okb} ok (last error {eb:?}); new leader {:?}",
        etcd.leader_index()
    );
    for (h, n) in [(&mut ha, "a"), (&mut hb, "b")] {
        assert!(
            matches!(&*h.borrow_and_update(), LeaseHealth::Live { .. }),
            "{n}: {:?}",
            *h.borrow()
        );
    }
    assert!(a.is_valid() && b.is_valid());
    // both still own their volumes and can write
    let st = VolumeState {
        epoch: oa.epoch,
        generation: 999,
        members: vec![],
        note: "after".into(),
        serving: false,
    };
    a.put_state("va", &st).await.unwrap();
    assert_eq!(b.state("va").await.unwrap(), Some(st));
    assert_eq!(b.owner("vb").await.unwrap(), Some(ob));
    tokio::task::block_in_place(|| etcd.restart(leader)).unwrap();
    assert!(a.is_valid() && b.is_valid());
    // a rolling restart breaks every member's streams: the watch comes back
    // with Resync, the leases stay live
    for i in 0..3 {
        etcd.kill(i);
        tokio::time::sleep(Duration::from_millis(200)).await;
        tokio::task::block_in_place(|| etcd.restart(i)).unwrap();
    }
    next_event(
        &mut ev,
        |e| *e == ClusterEvent::Resync,
        Duration::from_secs(2),
    )
    .await;
    assert!(
        a.is_valid() && b.is_valid(),
        "{:?} {:?}",
        a.health().borrow().clone(),
        b.health().borrow().clone()
    );
    a.put_state(
        "va",
        &VolumeState {
            epoch: oa.epoch,
            generation: 1000,
            members: vec![],
            note: String::new(),
            serving: false,
        },
    )
    .await
    .unwrap();
    // the watch may still be re-connecting to a restarted member: the
    // event must come all the same (it resumes at its last revision)
    a.set_drain("x", true).await.unwrap();
    next_event(
        &mut ev,
        |e| *e == ClusterEvent::Drain("x".into(), true),
        Duration::from_secs(5),
    )
    .await;
}

//! Two cluster nodes in one process, a real etcd, and an enclosure that
//! exports RAM drives over NVMe/TCP on loopback: create, planned move, and
//! takeover from a node whose lease is gone (it must fence itself); a drain
//! (the owner asks for its own handoff) and a delete seen by the standby.
//! The decisions themselves are tabled in `decide_tests.rs`; these check
//! that the actor carries them out against etcd.

use std::sync::Arc;
use std::time::{Duration, Instant};

use blockdev::{AlignedBuf, BlockDevice, BlockError, BlockOp, IoRequest};
use cluster::testing::EtcdServer;
use nvmf_target::{AnaState, Target, TransportConfig};

use super::Agent;
use crate::config::Membership;
use crate::node::identity::{Cluster, Peer, node_host_nqn, stable_id};
use crate::node::remote_tests::{Enclosure, settings};
use crate::node::{CreateVolume, ExportRequest, Node, NodeState};

pub(super) const NQN: &str = "nqn.2026-01.io.flashpool:cluster-test";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(super) async fn member(name: &str, enc: &Enclosure, etcd: &str) -> (Arc<Agent>, Arc<Target>) {
    member_of(name, &[enc], etcd).await
}

/// [`member`] with every enclosure of `encs` as a `[[peer]]`.
pub(super) async fn member_of(
    name: &str,
    encs: &[&Enclosure],
    etcd: &str,
) -> (Arc<Agent>, Arc<Target>) {
    let node = Node::with_state_dir(NodeState::default(), None);
    let host_nqn = node_host_nqn(name);
    node.set_cluster(Cluster {
        node_name: name.into(),
        host_id: stable_id(&host_nqn),
        host_nqn,
        peers: encs
            .iter()
            .map(|enc| Peer {
                name: enc.name.clone(),
                addr: Some(enc.addr),
                host_nqn: node_host_nqn(&enc.name),
                auth: None,
                tls: None,
            })
            .collect(),
        remote: settings(),
        dhchap: None,
        tls: None,
    });
    let target = Arc::new(Target::new(TransportConfig::default(), Vec::new()));
    node.attach_target(target.clone());
    let m = Membership {
        name: "t".into(),
        etcd: vec![etcd.to_string()],
        lease_ttl: Duration::from_secs(2),
        io: vec![format!("127.0.0.1:{}", free_port()).parse().unwrap()],
        discovery: Vec::new(),
        liveness: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
    };
    // Bound before the join: a port picked and bound later may be taken
    // meanwhile (the join's own connections use ephemeral ports too).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = listener.local_addr().unwrap().to_string();
    let a = Agent::join(node.clone(), target.clone(), m, Some(api.clone()))
        .await
        .unwrap();
    a.spawn();
    let app = crate::api::router(crate::api::App {
        node,
        agent: Some(a.clone()),
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    (a, target)
}

/// Two cluster nodes a and b on a fresh etcd and one enclosure e1 of three
/// drives; None when etcd is missing and FLASHPOOL_SKIP_ETCD is set.
pub(super) struct Pair {
    pub etcd: EtcdServer,
    pub enc: Enclosure,
    pub a: Arc<Agent>,
    pub ta: Arc<Target>,
    pub b: Arc<Agent>,
    pub tb: Arc<Target>,
}

pub(super) async fn pair() -> Option<Pair> {
    pair_with(3).await
}

/// [`pair`] with `drives` drives in e1.
pub(super) async fn pair_with(drives: usize) -> Option<Pair> {
    if !cluster::testing::etcd_available() && std::env::var("FLASHPOOL_SKIP_ETCD").is_ok() {
        return None;
    }
    let etcd = EtcdServer::start().expect("etcd (apt-get install etcd-server)");
    let enc = Enclosure::new("e1", drives, &[node_host_nqn("a"), node_host_nqn("b")]);
    let (a, ta) = member("a", &enc, &etcd.endpoint()).await;
    let (b, tb) = member("b", &enc, &etcd.endpoint()).await;
    Some(Pair {
        etcd,
        enc,
        a,
        ta,
        b,
        tb,
    })
}

/// The kept events of `a`'s node of `kind` (about `volume` when given).
pub(super) fn events_of(
    a: &Agent,
    kind: &str,
    volume: Option<&str>,
) -> Vec<Arc<crate::events::Event>> {
    a.node
        .events
        .recent()
        .into_iter()
        .filter(|e| e.kind.name() == kind && (volume.is_none() || e.volume.as_deref() == volume))
        .collect()
}

pub(super) async fn wait(what: &str, secs: u64, mut ok: impl AsyncFnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while !ok().await {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn ns_dev(t: &Target) -> Option<Arc<dyn BlockDevice>> {
    Some(t.subsystem(NQN)?.namespace(1)?.dev.clone())
}

pub(super) async fn io(
    dev: &Arc<dyn BlockDevice>,
    write: Option<u8>,
) -> Result<Vec<u8>, BlockError> {
    io_at(dev, 8, 16384, write).await
}

/// Writes `bytes` of `write` at 4 KiB block `lba` of `dev`, or (`None`)
/// reads them.
pub(super) async fn io_at(
    dev: &Arc<dyn BlockDevice>,
    lba: u64,
    bytes: usize,
    write: Option<u8>,
) -> Result<Vec<u8>, BlockError> {
    let mut buf = AlignedBuf::new(bytes);
    buf.set_len(bytes);
    let op = match write {
        Some(b) => {
            buf.fill(b);
            BlockOp::Write { fua: false }
        }
        None => BlockOp::Read,
    };
    let done = dev
        .submit(IoRequest {
            op,
            lba,
            blocks: (bytes / 4096) as u32,
            buf,
        })
        .await;
    done.result.map(|_| done.buf[..bytes].to_vec())
}

/// Creates `v` (raid5 on e1:d0..d2, nsid 1 of [`NQN`]) through `a`.
pub(super) async fn create_v(a: &Arc<Agent>) -> crate::node::VolumeInfo {
    a.create(CreateVolume {
        name: "v".into(),
        layout: Some("raid5".into()),
        drives: vec!["e1:d0".into(), "e1:d1".into(), "e1:d2".into()],
        thin_pool: false,
        cluster: None,
        compression: None,
        pool: None,
        size: None,
        strip: None,
        block_size: None,
        rebuild_rate: None,
        export: Some(ExportRequest {
            nqn: NQN.into(),
            nsid: 1,
        }),
        encrypt: false,
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_move_and_take_over() {
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

    // Created on a: a owns it, b serves the same namespace on standby.
    let info = create_v(&a).await;
    let st = a.status().await.unwrap();
    let g = st.volumes[0].ana_group;
    assert_eq!(st.volumes[0].owner.as_deref(), Some("a"));
    assert_eq!(ta.ana_state(g), AnaState::Optimized);
    wait("b to serve v on standby", 10, async || {
        ns_dev(&tb).is_some()
    })
    .await;
    assert_eq!(tb.ana_state(g), AnaState::Inaccessible);
    let (na, nb) = (ns_dev(&ta).unwrap(), ns_dev(&tb).unwrap());
    assert_eq!(
        ta.subsystem(NQN).unwrap().namespace(1).unwrap().nguid,
        tb.subsystem(NQN).unwrap().namespace(1).unwrap().nguid,
        "the same NGUID on every node"
    );
    assert_eq!(info.name, "v");
    // The create answer says where it is served (the CLI prints it).
    let x = info
        .export
        .clone()
        .expect("the create answer has the export");
    assert_eq!((x.nqn.as_str(), x.nsid), (NQN, 1));
    // b, serving it on standby, lists it with its owner and b's ANA state.
    let mut listed = b.node.volumes().await;
    b.list_cluster(&mut listed).await;
    let v = listed.iter().find(|v| v.name == "v").expect("b lists v");
    assert_eq!(v.owner.as_deref(), Some("a"));
    assert_eq!(v.ana_state.as_deref(), Some("inaccessible"));
    assert_eq!(v.state, "standby");
    let names: Vec<&str> = v.members.iter().map(|m| m.drive.as_str()).collect();
    assert_eq!(names, ["e1:d0", "e1:d1", "e1:d2"]);
    let mut listed = a.node.volumes().await;
    a.list_cluster(&mut listed).await;
    assert_eq!(listed.len(), 1, "the owner lists v once");
    assert_eq!(listed[0].owner.as_deref(), Some("a"));
    assert_eq!(listed[0].ana_state.as_deref(), Some("optimized"));
    let mut shown = info;
    shown.export = None;
    a.annotate(&mut shown).await;
    let x = shown.export.expect("a cluster volume shows its export");
    assert_eq!((x.nqn.as_str(), x.nsid), (NQN, 1));
    io(&na, Some(0xA1)).await.unwrap();
    assert!(matches!(io(&nb, None).await, Err(BlockError::Fenced(_))));

    // A move that cannot work is refused and changes nothing.
    assert!(a.move_volume("v", "nobody").await.is_err());
    assert!(a.move_volume("v", "a").await.is_err());
    assert_eq!(a.status().await.unwrap().volumes[0].epoch, Some(1));

    // Planned move to b: the data moves with it.
    let m = a.move_volume("v", "b").await.unwrap();
    assert_eq!((m.from.as_str(), m.to.as_str(), m.epoch), ("a", "b", 2));
    // The move answers once b serves it, not when a lets go.
    assert_eq!(tb.ana_state(g), AnaState::Optimized, "{m:?}");
    assert_eq!(ta.ana_state(g), AnaState::Inaccessible);
    // b opened the members by the names the volume was made with.
    let on_b = b.node.volume("v").await.unwrap();
    let names: Vec<&str> = on_b.members.iter().map(|m| m.drive.as_str()).collect();
    assert_eq!(names, ["e1:d0", "e1:d1", "e1:d2"], "not renamed to URLs");
    assert_eq!(io(&nb, None).await.unwrap(), vec![0xA1; 16384]);
    assert!(io(&na, None).await.is_err());
    io(&nb, Some(0xB2)).await.unwrap();
    // The move is told on both sides, and timed where it ended.
    wait("a's handed_off and b's moved events", 10, async || {
        !events_of(&a, "handed_off", Some("v")).is_empty()
            && !events_of(&b, "moved", Some("v")).is_empty()
    })
    .await;
    let m = events_of(&b, "moved", Some("v"));
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(
        m[0].message.contains("moved here from a at epoch 2"),
        "{m:?}"
    );
    assert_eq!(b.metrics_page().moves.count, 1);

    // b's lease is revoked behind its back (as a peer does when b's process
    // looks dead): a takes over and preempts b; b fences itself.
    assert!(a.session().revoke_node("b").await.unwrap());
    wait("a to take over", 10, async || {
        ta.ana_state(g) == AnaState::Optimized
    })
    .await;
    let st = a.status().await.unwrap();
    assert_eq!(st.volumes[0].owner.as_deref(), Some("a"));
    assert_eq!(st.volumes[0].epoch, Some(3));
    assert_eq!(io(&na, None).await.unwrap(), vec![0xB2; 16384]);
    assert!(matches!(io(&nb, None).await, Err(BlockError::Fenced(_))));
    wait("b to step down", 10, async || {
        tb.ana_state(g) == AnaState::Inaccessible
    })
    .await;

    // Told: a took it over (with its steps' times), b lost its lease and
    // stepped down (fenced as well when its lease went first).
    wait("a's took_over event", 10, async || {
        !events_of(&a, "took_over", Some("v")).is_empty()
    })
    .await;
    let t = events_of(&a, "took_over", Some("v"));
    assert_eq!(t.len(), 1, "{t:?}");
    assert!(
        t[0].message.contains("taken over here from b at epoch 3"),
        "{t:?}"
    );
    let steps: Vec<&str> = t[0].steps.iter().map(|s| &*s.step).collect();
    assert_eq!(steps, ["detect", "claim", "assemble", "serve", "total"]);
    let total = t[0].steps.last().unwrap().ms;
    assert!(t[0].steps.iter().all(|s| s.ms <= total), "{t:?}");
    wait("b's lease_lost and stepped_down events", 10, async || {
        !events_of(&b, "lease_lost", None).is_empty()
            && !events_of(&b, "stepped_down", Some("v")).is_empty()
    })
    .await;
    let l = events_of(&b, "lease_lost", None);
    assert_eq!(&*l[0].severity, "critical");
    assert!(l[0].message.contains("lease is lost"), "{l:?}");

    // a's metrics: it owns v at epoch 3, Optimized here; one takeover.
    let page = a.metrics_page();
    assert_eq!(page.takeovers.count, 1);
    let text = a.node.metrics_with(Some(&page)).await;
    for line in [
        "flashpool_cluster_volume_owner{volume=\"v\",node=\"a\"} 1\n",
        "flashpool_cluster_volume_is_owner{volume=\"v\"} 1\n",
        "flashpool_cluster_volume_epoch{volume=\"v\"} 3\n",
        "flashpool_cluster_volume_ana_state{volume=\"v\",state=\"optimized\"} 1\n",
        "flashpool_cluster_takeover_duration_seconds_count 1\n",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
    assert!(page.lease_left > Duration::ZERO);
    crate::metrics::check_exposition(&text);
    // b joins again as a standby node.
    wait("b back in the cluster", 15, async || {
        a.status()
            .await
            .map(|s| s.nodes.len() == 2)
            .unwrap_or(false)
    })
    .await;
    // a saw b leave (its lease revoked) and join again.
    wait(
        "a's node_left and node_joined events for b",
        10,
        async || {
            let left = events_of(&a, "node_left", None);
            let joined = events_of(&a, "node_joined", None);
            left.iter().any(|e| e.node.as_deref() == Some("b"))
                && joined
                    .iter()
                    .any(|j| j.node.as_deref() == Some("b") && left.iter().any(|l| l.seq < j.seq))
        },
    )
    .await;
    a.leave().await;
    b.leave().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_hands_over_and_a_delete_unserves_the_standby() {
    let Some(Pair {
        etcd,
        enc: _enc,
        a,
        ta,
        b,
        tb,
    }) = pair().await
    else {
        return;
    };
    create_v(&a).await;
    let g = a.status().await.unwrap().volumes[0].ana_group;
    wait("b to serve v on standby", 10, async || {
        ns_dev(&tb).is_some()
    })
    .await;
    io(&ns_dev(&ta).unwrap(), Some(0xC3)).await.unwrap();

    // Draining a: a asks for its own handoff to b, hands over; b claims.
    let d = b.drain("a", true).await.unwrap();
    assert!(d.owns.is_empty(), "a still owns {:?}", d.owns);
    // The drain answers once b serves it, not when a lets go.
    assert_eq!(tb.ana_state(g), AnaState::Optimized);
    assert_eq!(ta.ana_state(g), AnaState::Inaccessible);
    let st = b.status().await.unwrap();
    assert_eq!(st.volumes[0].owner.as_deref(), Some("b"));
    assert_eq!(st.volumes[0].epoch, Some(2));
    let nb = ns_dev(&tb).unwrap();
    assert_eq!(io(&nb, None).await.unwrap(), vec![0xC3; 16384]);
    b.drain("a", false).await.unwrap();

    // Deleted on its owner: the standby stops serving it.
    b.delete("v", true).await.unwrap().expect("found");
    assert!(ns_dev(&tb).is_none());
    wait("a to stop serving v", 10, async || ns_dev(&ta).is_none()).await;

    // etcd goes: the cluster view says so in words (a 503), and a pass
    // tells it as an event; no transport dump.
    drop(etcd);
    let e = a.status_or_unreachable().await.unwrap_err();
    assert_eq!(e.status(), axum::http::StatusCode::SERVICE_UNAVAILABLE);
    let m = e.to_string();
    assert!(m.starts_with("this node cannot reach etcd ("), "{m}");
    assert!(m.contains("no volume is owned here"), "{m}");
    assert!(m.len() < 400, "{m}");
    // What `flashpool cluster status` prints: the same words, from the API.
    let api = a.record.api.clone().expect("member() gives an API");
    let cli = tokio::task::spawn_blocking(move || {
        let c = crate::client::Client::new(&crate::client::Endpoint {
            api,
            ..Default::default()
        })
        .unwrap();
        c.get("/cluster").map(|_| ()).unwrap_err().to_string()
    })
    .await
    .unwrap();
    assert!(cli.starts_with("this node cannot reach etcd ("), "{cli}");
    wait("an etcd_unreachable event", 10, async || {
        !events_of(&a, "etcd_unreachable", None).is_empty()
    })
    .await;
    assert!(!a.metrics_page().etcd_reachable);
}

/// Creates `v<i>` (raid1 on e1:d<2i>, e1:d<2i+1>, nsid i+1) through `a`.
async fn create_raid1(a: &Arc<Agent>, i: usize) {
    a.create(CreateVolume {
        name: format!("v{i}"),
        layout: Some("raid1".into()),
        drives: vec![format!("e1:d{}", 2 * i), format!("e1:d{}", 2 * i + 1)],
        thin_pool: false,
        cluster: None,
        compression: None,
        pool: None,
        size: None,
        strip: None,
        block_size: None,
        rebuild_rate: None,
        export: Some(ExportRequest {
            nqn: NQN.into(),
            nsid: i as u32 + 1,
        }),
        encrypt: false,
    })
    .await
    .unwrap();
}

/// Revokes `from`'s lease, as a peer does when `from`'s process looks
/// dead (`from` stays out: it does not join again), and waits until `t`
/// has every group in `groups` Optimized; the time from the revoke to each
/// group's takeover, by group index, and how many volume settles `to` ran
/// meanwhile.
async fn revoke_and_time(
    to: &Arc<Agent>,
    t: &Arc<Target>,
    from: &Arc<Agent>,
    groups: &[u32],
) -> (Vec<Duration>, usize) {
    from.leaving
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let settles = || to.settles.load(std::sync::atomic::Ordering::Relaxed);
    let before = settles();
    let t0 = Instant::now();
    assert!(to.session().revoke_node(from.name()).await.unwrap());
    let mut done: Vec<Option<Duration>> = vec![None; groups.len()];
    while done.iter().any(Option::is_none) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "timed out: taken over {done:?}"
        );
        for (i, g) in groups.iter().enumerate() {
            if done[i].is_none() && t.ana_state(*g) == AnaState::Optimized {
                done[i] = Some(t0.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    (
        done.into_iter().map(Option::unwrap).collect(),
        settles() - before,
    )
}

/// Moves every volume to `to` (planned) and waits until it serves them all.
async fn move_all(from: &Arc<Agent>, to: &Arc<Agent>, tt: &Arc<Target>, groups: &[u32]) {
    wait(
        "the new node to serve every volume on standby",
        15,
        async || {
            let sub = tt.subsystem(NQN);
            (1..=groups.len() as u32)
                .all(|n| sub.as_ref().is_some_and(|s| s.namespace(n).is_some()))
        },
    )
    .await;
    for (i, g) in groups.iter().enumerate() {
        from.move_volume(&format!("v{i}"), to.name()).await.unwrap();
        assert_eq!(tt.ana_state(*g), AnaState::Optimized, "v{i} answered moved");
    }
}

/// Prints first/median/last, and checks that the volume settles (one
/// owner read each) grew with the volumes, not with the events times the
/// volumes: the takeover itself, plus every volume once a second for the
/// periodic resync. Before the passes followed the events, each of the
/// ~2N events (owner gone, owner set) settled all N volumes.
fn report(what: &str, took: &[Duration], settles: usize) {
    let mut s = took.to_vec();
    s.sort();
    let n = s.len();
    let ticks = s[n - 1].as_secs() as usize + 1;
    assert!(
        settles <= 3 * n + n * ticks,
        "{what}: {settles} volume settles for {n} volumes in {:?}",
        s[n - 1]
    );
    eprintln!(
        "{what}: {} volumes, first {:?}, median {:?}, last {:?}, {settles} volume settles",
        s.len(),
        s[0],
        s[s.len() / 2],
        s[s.len() - 1]
    );
}

/// Eight volumes owned by one node, whose lease is revoked (and which
/// stays out): a takes them all over one at a time (concurrency 1, as
/// the serial runner did), then concurrently, then with v0's takeover stalled:
/// the other seven must not wait for it. Each round the volumes are first
/// moved to a fresh node (b, c, d).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn takes_over_many_volumes_concurrently() {
    if !cluster::testing::etcd_available() && std::env::var("FLASHPOOL_SKIP_ETCD").is_ok() {
        return;
    }
    const N: usize = 8;
    let etcd = EtcdServer::start().expect("etcd (apt-get install etcd-server)");
    let hosts: Vec<String> = ["a", "b", "c", "d"].map(node_host_nqn).to_vec();
    let enc = Enclosure::new("e1", 2 * N, &hosts);
    let (a, ta) = member("a", &enc, &etcd.endpoint()).await;
    let (b, tb) = member("b", &enc, &etcd.endpoint()).await;
    for i in 0..N {
        create_raid1(&b, i).await;
    }
    let st = b.status().await.unwrap();
    let mut vols: Vec<_> = st.volumes.iter().collect();
    vols.sort_by_key(|v| v.name[1..].parse::<usize>().unwrap());
    let groups: Vec<u32> = vols.iter().map(|v| v.ana_group).collect();
    assert_eq!(groups.len(), N);
    assert!(
        groups
            .iter()
            .all(|g| tb.ana_state(*g) == AnaState::Optimized)
    );
    wait("a to serve every volume on standby", 10, async || {
        let sub = ta.subsystem(NQN);
        (1..=N as u32).all(|n| sub.as_ref().is_some_and(|s| s.namespace(n).is_some()))
    })
    .await;

    // One at a time.
    *a.permits.lock() = Arc::new(tokio::sync::Semaphore::new(1));
    let (serial, n1) = revoke_and_time(&a, &ta, &b, &groups).await;
    report("serial takeover", &serial, n1);
    let st = a.status().await.unwrap();
    assert!(st.volumes.iter().all(|v| v.owner.as_deref() == Some("a")));
    assert!(st.volumes.iter().all(|v| v.epoch == Some(2)));

    // All at once.
    let (c, tc) = member("c", &enc, &etcd.endpoint()).await;
    move_all(&a, &c, &tc, &groups).await;
    *a.permits.lock() = Arc::new(tokio::sync::Semaphore::new(super::runner::concurrency()));
    let reads = || a.volume_reads.load(std::sync::atomic::Ordering::Relaxed);
    let reads_before = reads();
    let (concurrent, n2) = revoke_and_time(&a, &ta, &c, &groups).await;
    let reads2 = reads() - reads_before;
    report("concurrent takeover", &concurrent, n2);
    // Each settle of the takeover decided on its pass's range read: no
    // volume's keys were read again one by one (`runner.rs`, `PassRead`);
    // a periodic pass's settle of a volume run here may read its own.
    eprintln!("concurrent takeover: {reads2} reads of one volume's keys");
    assert!(
        reads2 < N / 2,
        "{reads2} reads of one volume's keys to take over {N} volumes"
    );
    // One settle per volume, for its owner key's deletion: the claims'
    // own owner events are noted without another settle
    // (`runner.rs`, `owner_news`); before, each took a second one.
    assert!(n2 < 2 * N, "{n2} settles to take over {N} volumes");

    // v0's takeover hangs (a slow member, before the node's assembly):
    // the others are served long before it.
    let (d, td) = member("d", &enc, &etcd.endpoint()).await;
    move_all(&a, &d, &td, &groups).await;
    let stall = Duration::from_secs(4);
    a.stall.lock().insert("v0".into(), stall);
    let (stalled, n3) = revoke_and_time(&a, &ta, &d, &groups).await;
    report("v0 stalled", &stalled, n3);
    let others = stalled[1..].iter().max().unwrap();
    assert!(
        *others < stall && stalled[0] >= stall,
        "the others waited for v0: {stalled:?}"
    );
    let st = a.status().await.unwrap();
    assert!(st.volumes.iter().all(|v| v.owner.as_deref() == Some("a")));
    assert!(st.volumes.iter().all(|v| v.epoch == Some(6)));
    a.leave().await;
}

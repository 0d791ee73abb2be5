//! QoS limits of cluster volumes with two nodes in one process and a real
//! etcd: set at create and live through either node, carried by both
//! nodes' namespaces (so a move and a takeover keep them), refused
//! requests that change nothing, and a limited namespace that a host
//! reaching it over NVMe/TCP finds held at its rate.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use blockdev::{AlignedBuf, BlockDevice, BlockOp, IoRequest};
use nvmf_target::qos::QosLimits;
use nvmf_target::{AnaState, Target};

use super::Agent;
use super::tests::{NQN, Pair, events_of, pair, wait};
use crate::api_types::{QosRequest, Rate};
use crate::node::{CreateVolume, ExportRequest, NodeError};

const MIB: u64 = 1 << 20;

/// The limits `t`'s namespace `nsid` of [`NQN`] enforces.
fn limits(t: &Target, nsid: u32) -> Option<QosLimits> {
    Some(t.subsystem(NQN)?.namespace(nsid)?.qos.limits())
}

fn iops(n: u64) -> QosRequest {
    QosRequest {
        iops: Some(n),
        ..Default::default()
    }
}

fn volume(name: &str, nsid: u32) -> CreateVolume {
    CreateVolume {
        layout: Some("raid5".into()),
        drives: vec!["e1:d0".into(), "e1:d1".into(), "e1:d2".into()],
        export: Some(ExportRequest {
            nqn: NQN.into(),
            nsid,
        }),
        ..crate::node::testing::volume(name, "", &[])
    }
}

/// `METHOD /v1<path>` on `a`'s API: (status, JSON answer).
async fn call(a: &Agent, method: &'static str, path: &str, body: Option<String>) -> (u16, String) {
    let url = format!("http://{}/v1{path}", a.record.api.clone().unwrap());
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut r = match (method, body) {
            ("GET", _) => agent.get(&url).call(),
            (_, Some(b)) => agent.post(&url).send(b.as_str()),
            (_, None) => agent.post(&url).send_empty(),
        }
        .unwrap();
        (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_follow_a_cluster_volume_to_every_node_through_a_move_and_a_takeover() {
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
    // Bad limits at create: 400, nothing made.
    let bad = QosRequest {
        burst_ms: Some(0),
        ..iops(300)
    };
    assert!(matches!(
        a.create_qos(volume("v", 1), Some(bad)).await,
        Err(NodeError::BadRequest(m)) if m.contains("burst_ms")
    ));
    assert!(a.session().spec("v").await.unwrap().is_none());
    assert!(a.node.volume("v").await.is_err());

    // Made with limits: the owner's namespace has them at once, b's soon.
    a.create_qos(volume("v", 1), Some(iops(300))).await.unwrap();
    assert_eq!(limits(&ta, 1).unwrap().iops, 300);
    wait("b's namespace to carry the limits", 10, async || {
        limits(&tb, 1).is_some_and(|l| l.iops == 300)
    })
    .await;
    assert_eq!(events_of(&a, "qos_changed", Some("v")).len(), 1);

    // Changed live through b, which does not own it: both namespaces.
    let q = QosRequest {
        iops: Some(500),
        bandwidth: Some(Rate::Text("20MiB".into())),
        ..Default::default()
    };
    let i = b.set_volume_qos("v", q).await.unwrap().unwrap();
    assert_eq!((i.limits.iops, i.limits.bandwidth), (500, 20 * MIB));
    let l = limits(&tb, 1).unwrap();
    assert_eq!((l.iops, l.bandwidth), (500, 20 * MIB), "b at once");
    wait("a's namespace to carry the change", 10, async || {
        limits(&ta, 1).is_some_and(|l| l.iops == 500 && l.bandwidth == 20 * MIB)
    })
    .await;
    let told = events_of(&b, "qos_changed", Some("v"));
    assert_eq!(told.len(), 1, "from the node that made the change");
    assert!(
        told[0].message.contains("set through b"),
        "{}",
        told[0].message
    );
    assert_eq!(events_of(&a, "qos_changed", Some("v")).len(), 1);
    let got = a.volume_qos("v").await.unwrap().unwrap();
    assert_eq!((got.limits.iops, got.unlimited), (500, false));

    // Refused through the API, and nothing changes anywhere.
    for (body, status) in [
        (r#"{"burst_ms": 0}"#, 400),
        (r#"{"bandwidth": "1B"}"#, 400),
        (r#"{"bandwidth": "lots"}"#, 400),
        (r#"{"iops": -1}"#, 400),
        (r#"{"nonsense": 1}"#, 400),
    ] {
        let (s, answer) = call(&b, "POST", "/volumes/v/qos", Some(body.into())).await;
        assert_eq!(s, status, "{body}: {answer}");
    }
    let (s, answer) = call(&b, "POST", "/volumes/nope/qos", Some("{}".into())).await;
    assert_eq!(s, 404, "{answer}");
    let (s, answer) = call(&a, "GET", "/volumes/nope/qos", None).await;
    assert_eq!(s, 404, "{answer}");
    let (s, answer) = call(&a, "GET", "/volumes/v/qos", None).await;
    assert_eq!(s, 200, "{answer}");
    let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(v["iops"], 500, "{answer}");
    for t in [&ta, &tb] {
        let l = limits(t, 1).unwrap();
        assert_eq!((l.iops, l.bandwidth, l.burst_ms), (500, 20 * MIB, 0));
    }
    let (kept, _) = a.session().qos("v").await.unwrap();
    assert_eq!((kept.iops, kept.bandwidth), (500, 20 * MIB));
    assert_eq!(events_of(&b, "qos_changed", Some("v")).len(), 1);

    // A planned move: b enforces them from its first command.
    a.move_volume("v", "b").await.unwrap();
    let g = a.status().await.unwrap().volumes[0].ana_group;
    assert_eq!(tb.ana_state(g), AnaState::Optimized);
    assert_eq!(limits(&tb, 1).unwrap().iops, 500);

    // Through the API of a (no longer the owner): cleared, then set again.
    let (s, answer) = call(
        &a,
        "POST",
        "/volumes/v/qos",
        Some(r#"{"clear": true}"#.into()),
    )
    .await;
    assert_eq!(s, 200, "{answer}");
    wait("both namespaces unlimited", 10, async || {
        [&ta, &tb]
            .iter()
            .all(|t| limits(t, 1).is_some_and(|l| l.is_unlimited()))
    })
    .await;
    assert_eq!(a.session().qos("v").await.unwrap().1, 0, "no key left");
    a.set_volume_qos("v", iops(200)).await.unwrap().unwrap();
    wait("b to carry the new limits", 10, async || {
        limits(&tb, 1).is_some_and(|l| l.iops == 200)
    })
    .await;

    // b's lease is revoked: a takes over and its namespace has them.
    assert!(a.session().revoke_node("b").await.unwrap());
    wait("a to take v over", 15, async || {
        ta.ana_state(g) == AnaState::Optimized
    })
    .await;
    assert_eq!(limits(&ta, 1).unwrap().iops, 200);

    // Deleted: its limits go with it (a new v starts unlimited).
    a.delete("v", true).await.unwrap().unwrap();
    assert_eq!(a.session().qos("v").await.unwrap().1, 0);
    assert!(matches!(a.set_volume_qos("v", iops(10)).await, Ok(None)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thin_volumes_of_a_cluster_pool_take_limits_through_either_node() {
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
    let pool = CreateVolume {
        thin_pool: true,
        export: Some(ExportRequest {
            nqn: NQN.into(),
            nsid: 0,
        }),
        ..volume("p", 0)
    };
    // A pool is not served: no limits on it.
    assert!(matches!(
        a.create_qos(pool.clone(), Some(iops(100))).await,
        Err(NodeError::BadRequest(_))
    ));
    a.create(pool).await.unwrap();
    let thin = |name: &str| CreateVolume {
        layout: None,
        drives: Vec::new(),
        pool: Some("p".into()),
        size: Some("32MiB".into()),
        export: None,
        ..crate::node::testing::volume(name, "", &[])
    };
    // Made through b (passed on to a, the pool's owner) with limits; a bad
    // request makes nothing.
    assert!(matches!(
        b.create_qos(
            thin("t0"),
            Some(QosRequest {
                burst_ms: Some(70_000),
                ..iops(5)
            })
        )
        .await,
        Err(NodeError::BadRequest(_))
    ));
    assert!(a.session().pool_of("t0").await.unwrap().is_none());
    let t1 = b.create_qos(thin("t1"), Some(iops(250))).await.unwrap();
    let nsid = t1.export.unwrap().nsid;
    let t2 = a.create(thin("t2")).await.unwrap();
    let nsid2 = t2.export.unwrap().nsid;
    assert_eq!(limits(&ta, nsid).unwrap().iops, 250, "the owner at once");
    wait("b's namespace of t1 to carry the limits", 10, async || {
        limits(&tb, nsid).is_some_and(|l| l.iops == 250)
    })
    .await;

    // Changed through b; the pool itself is refused.
    let q = QosRequest {
        write_bandwidth: Some(Rate::Number(8 * MIB)),
        ..Default::default()
    };
    let i = b.set_volume_qos("t1", q).await.unwrap().unwrap();
    assert_eq!((i.limits.iops, i.limits.write_bandwidth), (250, 8 * MIB));
    wait("a to carry the change", 10, async || {
        limits(&ta, nsid).is_some_and(|l| l.write_bandwidth == 8 * MIB)
    })
    .await;
    assert!(matches!(
        b.set_volume_qos("p", iops(5)).await,
        Err(NodeError::BadRequest(m)) if m.contains("pool")
    ));
    // Through the non-owner, GET answers what its namespace enforces.
    let got = b.volume_qos("t1").await.unwrap().unwrap();
    assert_eq!((got.limits.iops, got.throttled_commands), (250, 0));

    // A move of the pool keeps them on b.
    a.move_volume("p", "b").await.unwrap();
    assert_eq!(limits(&tb, nsid).unwrap().iops, 250);

    // Deleted (through a, passed on to b): its limits go with it.
    a.delete("t1", true).await.unwrap().unwrap();
    assert_eq!(a.session().qos("t1").await.unwrap().1, 0);

    // etcd unreachable: 503 in words, and nothing changes on either node;
    // GET still answers from the namespace.
    wait("a to serve t2", 10, async || limits(&ta, nsid2).is_some()).await;
    drop(etcd);
    let e = a.set_volume_qos("t2", iops(100)).await.unwrap_err();
    assert_eq!(
        e.status(),
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "{e}"
    );
    assert!(
        e.to_string().contains("etcd") && e.to_string().contains("nothing was changed"),
        "{e}"
    );
    for t in [&ta, &tb] {
        assert!(limits(t, nsid2).unwrap().is_unlimited());
    }
    assert!(a.volume_qos("t2").await.unwrap().unwrap().unlimited);
    assert!(events_of(&a, "qos_changed", Some("t2")).is_empty());
}

/// A host on NVMe/TCP reads the volume through a's target as fast as it
/// can, unlimited then at 200 IOPS set through b: the held rate is the
/// limit (plus the burst), and the metrics tell the volume's held time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_cluster_namespace_is_held_at_its_rate() {
    let Some(Pair {
        etcd: _etcd,
        enc: _enc,
        a,
        ta,
        b,
        tb: _tb,
    }) = pair().await
    else {
        return;
    };
    a.create(volume("v", 1)).await.unwrap();
    let server = nvmf_target::Server::start(
        ta.clone(),
        &[nvmf_target::ListenerConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
            kind: nvmf_target::ListenerKind::Io,
            tls: nvmf_target::TlsMode::None,
        }],
    )
    .unwrap();
    let url = format!("tcp://{}/{NQN}?nsid=1", server.local_addrs()[0].0);
    let host: Arc<dyn BlockDevice> = Arc::new(
        nvmf_host::remote::RemoteDevice::connect(&url, Default::default())
            .await
            .unwrap(),
    );
    let free = reads_for(&host, Duration::from_millis(500)).await;
    b.set_volume_qos("v", iops(200)).await.unwrap().unwrap();
    wait("a to enforce 200 IOPS", 10, async || {
        limits(&ta, 1).is_some_and(|l| l.iops == 200)
    })
    .await;
    let held = reads_for(&host, Duration::from_secs(1)).await;
    eprintln!("unlimited: {free} reads in 0.5 s; at 200 IOPS: {held} reads in 1 s");
    // 200 in the second, plus the 100 ms burst a bucket starts with.
    assert!(
        (150..=300).contains(&held),
        "{held} reads in 1 s at 200 IOPS"
    );
    // Without the limit the same host goes well past it: the limit, not
    // the machine, held it.
    assert!(
        free * 2 > 600,
        "unlimited: {free} reads in 0.5 s; the test needs more than 300"
    );
    let q = ta.subsystem(NQN).unwrap().namespace(1).unwrap().qos.clone();
    assert!(q.throttled().1 > 0, "commands were held");
    let page = a.node.metrics_with(Some(&a.metrics_page())).await;
    let line = page
        .lines()
        .find(|l| {
            l.starts_with("flashpool_namespace_qos_throttled_commands_total{")
                && l.contains("volume=\"v\"")
        })
        .unwrap_or_else(|| panic!("no throttled line for v:\n{page}"));
    let n: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n > 0, "{line}");
    assert!(
        page.lines()
            .any(|l| l.starts_with("flashpool_namespace_qos_limit{")
                && l.contains("volume=\"v\"")
                && l.contains("limit=\"iops\"")
                && l.ends_with(" 200")),
        "{page}"
    );
    drop(host);
    server.shutdown();
}

/// Reads of 4 KiB by 8 tasks for `d`: how many completed.
async fn reads_for(dev: &Arc<dyn BlockDevice>, d: Duration) -> u64 {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let end = Instant::now() + d;
    let mut tasks = Vec::new();
    for i in 0..8u64 {
        let (dev, done, stop) = (dev.clone(), done.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut lba = i;
            while !stop.load(Ordering::Relaxed) {
                let mut buf = AlignedBuf::new(4096);
                buf.set_len(4096);
                let r = dev
                    .submit(IoRequest {
                        op: BlockOp::Read,
                        lba: lba % 1024,
                        blocks: 1,
                        buf,
                    })
                    .await;
                r.result.unwrap();
                if Instant::now() <= end {
                    done.fetch_add(1, Ordering::Relaxed);
                }
                lba += 8;
            }
        }));
    }
    tokio::time::sleep_until(end.into()).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    done.load(Ordering::Relaxed)
}

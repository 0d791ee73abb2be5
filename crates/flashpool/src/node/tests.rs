//! The node's operations end to end: mem and file drives, a real target for
//! exports, data written through the served namespace and read back after
//! failures, replacements, rebuilds and restarts.

use std::sync::Arc;
use std::time::Duration;

use blockdev::{AlignedBuf, BlockDevice, BlockOp, IoRequest, RecordKind};

use super::testing::{TestNode, mem_drive, volume};
use super::*;

pub(super) const NQN: &str = "nqn.2026-01.io.flashpool:test";
pub(super) const MIB: u64 = 1 << 20;

/// Namespace 1 of the test subsystem.
pub(super) fn ns1() -> ExportRequest {
    ExportRequest {
        nqn: NQN.into(),
        nsid: 1,
    }
}

pub(super) fn node_of(specs: &[DriveSpec]) -> Arc<Node> {
    node_in(specs, None)
}

fn node_in(specs: &[DriveSpec], state_dir: Option<&std::path::Path>) -> Arc<Node> {
    TestNode::new()
        .drives(specs)
        .state_dir(state_dir)
        .target(NQN)
        .build()
}

pub(super) fn mem_node(n: usize, size: u64) -> Arc<Node> {
    TestNode::new().mem_drives(n, size).target(NQN).build()
}

pub(super) fn req(name: &str, layout: &str, drives: &[&str]) -> CreateVolume {
    volume(name, layout, drives)
}

fn stamp(lba: u64, seed: u64) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    for (i, w) in b.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&(lba ^ seed.rotate_left(7) ^ (i as u64 * 0x9E37)).to_le_bytes());
    }
    b
}

pub(super) async fn io(
    dev: &dyn BlockDevice,
    op: BlockOp,
    lba: u64,
    data: Option<&[u8]>,
) -> Vec<u8> {
    let mut buf = AlignedBuf::new(4096);
    buf.set_len(4096);
    if let Some(d) = data {
        buf.copy_from_slice(d);
    }
    let done = dev
        .submit(IoRequest {
            op,
            lba,
            blocks: 1,
            buf,
        })
        .await;
    done.result.unwrap();
    done.buf[..4096].to_vec()
}

pub(super) async fn write_all(dev: &dyn BlockDevice, lbas: &[u64], seed: u64) {
    for &l in lbas {
        io(dev, BlockOp::Write { fua: false }, l, Some(&stamp(l, seed))).await;
    }
}

pub(super) async fn check_all(dev: &dyn BlockDevice, lbas: &[u64], seed: u64) {
    for &l in lbas {
        let got = io(dev, BlockOp::Read, l, None).await;
        assert!(
            got == stamp(l, seed),
            "LBA {l} does not read back what was written"
        );
    }
}

pub(super) fn served(node: &Node) -> Arc<dyn BlockDevice> {
    node.target()
        .unwrap()
        .subsystem(NQN)
        .unwrap()
        .namespace(1)
        .expect("exported")
        .dev
}

fn lbas(dev: &dyn BlockDevice) -> Vec<u64> {
    let n = dev.geometry().num_blocks;
    (0..200).map(|i| (i * 7919) % n).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors_and_change_nothing() {
    let node = mem_node(6, 16 * MIB);
    let err = |r: NodeResult<VolumeInfoAlias>| r.expect_err("must fail").to_string();
    type VolumeInfoAlias = ops::VolumeInfo;

    let e = err(node.create_volume(req("v", "raid5", &["d0", "d1"])).await);
    assert!(e.contains("raid5 needs at least 3 members"), "{e}");
    let e = err(node
        .create_volume(req("v", "raid7", &["d0", "d1", "d2"]))
        .await);
    assert!(e.contains("layout \"raid7\" is unknown"), "{e}");
    let e = err(node.create_volume(req("v", "raid1", &["d0", "d9"])).await);
    assert!(e.contains("drive \"d9\" does not exist"), "{e}");
    let e = err(node.create_volume(req("v", "raid1", &["d0", "d0"])).await);
    assert!(e.contains("listed twice"), "{e}");
    let e = err(node
        .create_volume(req("bad/name", "raid1", &["d0", "d1"]))
        .await);
    assert!(e.contains("not valid"), "{e}");
    let mut small = req("v", "raid1", &["d0", "d1"]);
    small.strip = Some("3KiB".into());
    let e = err(node.create_volume(small).await);
    assert!(e.contains("strip"), "{e}");
    assert!(
        node.volumes().await.is_empty(),
        "failed creates leave nothing behind"
    );

    node.create_volume(req("a", "raid5", &["d0", "d1", "d2"]))
        .await
        .unwrap();
    let e = err(node.create_volume(req("b", "raid1", &["d2", "d3"])).await);
    assert!(e.contains("drive d2 is already in use by volume a"), "{e}");
    let e = err(node.create_volume(req("a", "raid1", &["d3", "d4"])).await);
    assert!(e.contains("already exists"), "{e}");

    // No NSID: a node running alone does not pick one (a cluster does).
    let e = err(node.export("a", ExportRequest { nsid: 0, ..ns1() }).await);
    assert!(e.contains("--nsid N"), "{e}");
    node.export("a", ns1()).await.unwrap();
    let e = node.delete_volume("a", true).await.unwrap_err().to_string();
    assert!(
        e.contains("is exported as nsid 1") && e.contains("unexport"),
        "{e}"
    );
    let e = node
        .export(
            "a",
            ExportRequest {
                nqn: "nqn.2026-01.io.flashpool:none".into(),
                nsid: 2,
            },
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("already exported"), "{e}");
    node.create_volume(req("b", "raid1", &["d3", "d4"]))
        .await
        .unwrap();
    let e = node.export("b", ns1()).await.unwrap_err();
    assert!(matches!(e, NodeError::Conflict(_)), "{e}");
    assert!(matches!(
        node.delete_volume("nope", true).await,
        Err(NodeError::Missing {
            kind: Object::Volume,
            ..
        })
    ));
    assert!(matches!(
        node.replace_drive("d5", "d3").await,
        Err(NodeError::Conflict(_))
    ));

    // Nothing was lost by the refusals: the exported volume still serves data.
    let dev = served(&node);
    let l = lbas(&*dev);
    write_all(&*dev, &l, 1).await;
    node.unexport("a", false).await.unwrap();
    node.delete_volume("a", true).await.unwrap();
    let names: Vec<String> = node.volumes().await.into_iter().map(|v| v.name).collect();
    assert_eq!(names, ["b"]);
    let d0 = node.drive("d0").await.unwrap();
    assert_eq!(d0.state, "free");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raid6_survives_two_failed_drives_and_rebuilds_onto_spares() {
    let node = mem_node(8, 16 * MIB);
    let mut r = req("r6", "raid6", &["d0", "d1", "d2", "d3", "d4", "d5"]);
    r.export = Some(ns1());
    node.create_volume(r).await.unwrap();
    let dev = served(&node);
    let l = lbas(&*dev);
    write_all(&*dev, &l, 11).await;

    node.fail_drive("d1", false).await.unwrap();
    assert_eq!(node.volume("r6").await.unwrap().state, "degraded");
    check_all(&*dev, &l, 11).await;
    write_all(&*dev, &l[..100], 12).await;
    node.fail_drive("d4", false).await.unwrap();
    check_all(&*dev, &l[..100], 12).await;
    check_all(&*dev, &l[100..], 11).await;
    assert_eq!(node.drive("d4").await.unwrap().state, "failed");

    node.replace_drive("d1", "d6").await.unwrap();
    let v = node
        .wait_rebuild("r6", Duration::from_secs(60))
        .await
        .unwrap();
    assert!(v.rebuild.last_error.is_none(), "{:?}", v.rebuild.last_error);
    node.replace_drive("d4", "d7").await.unwrap();
    let v = node
        .wait_rebuild("r6", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(v.state, "optimal", "{v:?}");
    let drives: Vec<String> = v.members.iter().map(|m| m.drive.clone()).collect();
    assert_eq!(drives, ["d0", "d6", "d2", "d3", "d7", "d5"]);
    check_all(&*dev, &l[..100], 12).await;
    check_all(&*dev, &l[100..], 11).await;

    // The rebuilt drives hold the data: fail two of the originals, read again.
    node.fail_drive("d0", false).await.unwrap();
    node.fail_drive("d2", false).await.unwrap();
    check_all(&*dev, &l[..100], 12).await;
    check_all(&*dev, &l[100..], 11).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_come_back_from_their_drives_after_a_restart() {
    let dir = tempdir();
    let specs: Vec<DriveSpec> = (0..5)
        .map(|i| DriveSpec {
            name: format!("f{i}"),
            backend: "file".into(),
            size: Some(8 * MIB),
            path: Some(dir.join(format!("f{i}.img"))),
            create: true,
            block_size: 4096,
            ..Default::default()
        })
        .collect();
    let l;
    {
        let node = node_in(&specs, Some(&dir));
        let mut r = req("keep", "raid5", &["f0", "f1", "f2"]);
        r.export = Some(ns1());
        node.create_volume(r).await.unwrap();
        let dev = served(&node);
        l = lbas(&*dev);
        write_all(&*dev, &l, 21).await;
        // The namespace's device-kept record (reservations with PTPL) goes
        // to the volume's members, and to the replacement below.
        assert!(dev.keeps_records(), "a served volume keeps records");
        dev.store_record(RecordKind::Reservations, b"node record")
            .unwrap();
        node.replace_drive("f1", "f3").await.unwrap();
        node.wait_rebuild("keep", Duration::from_secs(60))
            .await
            .unwrap();
        node.shutdown().await;
    }
    let node = node_of(&specs);
    node.assemble_found(&[]).await.unwrap();
    let v = node
        .volume("keep")
        .await
        .expect("found by name on its drives");
    let drives: Vec<String> = v.members.iter().map(|m| m.drive.clone()).collect();
    assert_eq!(drives, ["f0", "f3", "f2"], "the replaced drive stays out");
    assert_eq!(v.state, "optimal");
    assert_eq!(node.drive("f1").await.unwrap().state, "free");
    node.export("keep", ns1()).await.unwrap();
    check_all(&*served(&node), &l, 21).await;
    assert_eq!(
        served(&node).load_record(RecordKind::Reservations).unwrap(),
        Some(b"node record".to_vec())
    );
    node.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A 1.5 MB name (or layout, size, host NQN) comes back as its first 64
/// characters and its length, wherever it is checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_input_is_not_echoed_whole_in_errors() {
    let node = mem_node(3, 16 * MIB);
    let huge = "n".repeat(1_500_000);
    let cut = format!("\"{}\"… (1500000 bytes)", "n".repeat(64));
    let check = |what: &str, e: String| {
        assert!(e.len() < 400, "{what}: {} bytes: {}", e.len(), &e[..400]);
        assert!(e.contains(&cut), "{what}: {e}");
    };
    let e = node.create_volume(req(&huge, "raid1", &["d0", "d1"])).await;
    check("volume name", e.unwrap_err().to_string());
    let e = node.create_volume(req("v", &huge, &["d0", "d1"])).await;
    check("layout", e.unwrap_err().to_string());
    let e = node.create_volume(req("v", "raid1", &["d0", &huge])).await;
    check("unknown drive", e.unwrap_err().to_string());
    let e = node.create_volume(req("v", "raid1", &[&huge, &huge])).await;
    check("drive listed twice", e.unwrap_err().to_string());
    let mut r = req("v", "raid1", &["d0", "d1"]);
    r.strip = Some(huge.clone());
    check(
        "strip",
        node.create_volume(r).await.unwrap_err().to_string(),
    );
    let mut thin = req("t", "raid1", &[]);
    thin.layout = None;
    thin.pool = Some(huge.clone());
    thin.size = Some("1MiB".into());
    check(
        "pool",
        node.create_volume(thin).await.unwrap_err().to_string(),
    );
    check("volume", node.volume(&huge).await.unwrap_err().to_string());
    check("drive", node.drive(&huge).await.unwrap_err().to_string());
    check(
        "delete",
        node.delete_volume(&huge, true)
            .await
            .unwrap_err()
            .to_string(),
    );
    let e = node
        .export_drive(
            "d2",
            ExportDriveRequest {
                hosts: vec![format!("nqn.{huge}")],
            },
            false,
        )
        .await;
    let e = e.unwrap_err().to_string();
    assert!(
        e.len() < 400 && e.contains("… (1500004 bytes)"),
        "{}",
        &e[..400]
    );
    check(
        "export",
        node.export_drive(&huge, Default::default(), false)
            .await
            .unwrap_err()
            .to_string(),
    );
    check(
        "unexport",
        node.unexport_drive(&huge).await.unwrap_err().to_string(),
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_answers_json_with_status_codes() {
    let node = mem_node(3, 16 * MIB);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            crate::api::router(crate::api::App { node, agent: None }),
        )
        .await
        .unwrap()
    });
    let call = move |method: &'static str, path: &'static str, body: Option<&'static str>| {
        tokio::task::spawn_blocking(move || {
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .http_status_as_error(false)
                .build()
                .into();
            let url = format!("http://{addr}/v1{path}");
            let mut r = match (method, body) {
                ("GET", _) => agent.get(&url).call(),
                ("DELETE", _) => agent.delete(&url).call(),
                (_, Some(b)) => agent.post(&url).send(b),
                (_, None) => agent.post(&url).send_empty(),
            }
            .unwrap();
            let status = r.status().as_u16();
            let v: serde_json::Value =
                serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
            (status, v)
        })
    };
    let (s, v) = call(
        "POST",
        "/volumes",
        Some(r#"{"name":"m","layout":"raid1","drives":["d0","d1"]}"#),
    )
    .await
    .unwrap();
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["layout"], "raid1");
    let (s, v) = call("POST", "/volumes", Some(r#"{"name":"x","layout":"raid1"}"#))
        .await
        .unwrap();
    assert_eq!(s, 400);
    let msg = v["error"].as_str().unwrap();
    assert!(msg.contains("give a layout and drives"), "{v}");
    let (s, v) = call(
        "POST",
        "/volumes",
        Some(r#"{"layout":"raid1","drives":["d0"]}"#),
    )
    .await
    .unwrap();
    assert_eq!(s, 400);
    let msg = v["error"].as_str().unwrap();
    assert!(msg.contains("missing field `name`"), "{v}");
    let (s, v) = call("POST", "/volumes", Some(r#"{"name":"x","layuot":"raid1"}"#))
        .await
        .unwrap();
    assert_eq!(s, 400);
    let msg = v["error"].as_str().unwrap();
    assert!(msg.contains("unknown field `layuot`"), "{v}");
    let (s, v) = call("POST", "/volumes", Some("not json")).await.unwrap();
    assert_eq!(s, 400, "{v}");
    let (s, v) = call(
        "POST",
        "/volumes",
        Some(r#"{"name":"y","layout":"raid1","drives":["d1","d2"]}"#),
    )
    .await
    .unwrap();
    assert_eq!(s, 409);
    assert!(
        v["error"].as_str().unwrap().contains("already in use"),
        "{v}"
    );
    let (s, _) = call("GET", "/volumes/none", None).await.unwrap();
    assert_eq!(s, 404);
    let (s, v) = call("GET", "/drives", None).await.unwrap();
    assert_eq!(s, 200);
    assert_eq!(v.as_array().unwrap().len(), 3);
    let (s, v) = call("POST", "/drives/d0/fail", None).await.unwrap();
    assert_eq!((s, v["state"].as_str()), (200, Some("failed")));
    let (s, v) = call("POST", "/drives/d0/replace", Some(r#"{"with":"d2"}"#))
        .await
        .unwrap();
    assert_eq!(s, 200, "{v}");
    let (s, v) = call("GET", "/volumes/m/rebuild", None).await.unwrap();
    assert_eq!(s, 200);
    assert!(v["rebuild"]["total_stripes"].is_u64(), "{v}");
    let (s, _) = call("GET", "/nothing/here", None).await.unwrap();
    assert_eq!(s, 404);
}

pub(super) fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "flashpool-node-test-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub(super) fn thin_req(name: &str, pool: &str, size: &str) -> CreateVolume {
    CreateVolume {
        name: name.into(),
        layout: None,
        drives: Vec::new(),
        thin_pool: false,
        cluster: None,
        compression: None,
        pool: Some(pool.into()),
        size: Some(size.into()),
        strip: None,
        block_size: None,
        rebuild_rate: None,
        export: None,
        encrypt: false,
    }
}

async fn try_write(dev: &dyn BlockDevice, lba: u64, seed: u64) -> Result<(), blockdev::BlockError> {
    let mut buf = AlignedBuf::new(4096);
    buf.set_len(4096);
    buf.copy_from_slice(&stamp(lba, seed));
    dev.submit(IoRequest {
        op: BlockOp::Write { fua: false },
        lba,
        blocks: 1,
        buf,
    })
    .await
    .result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thin_volumes_in_a_raid5_pool_run_out_of_space_cleanly() {
    let node = mem_node(4, 16 * MIB);
    let mut p = req("p", "raid5", &["d0", "d1", "d2"]);
    p.thin_pool = true;
    p.cluster = Some("1MiB".into());
    let info = node.create_volume(p).await.unwrap();
    let cap = info.thin_pool.as_ref().unwrap().capacity_bytes;
    assert!(cap > 16 * MIB && cap < 32 * MIB, "{info:?}");

    let e = node
        .create_volume(thin_req("t", "d3", "1GiB"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("pool \"d3\" does not exist"), "{e}");
    node.create_volume(req("plain", "raid0", &["d3"]))
        .await
        .unwrap();
    let e = node
        .create_volume(thin_req("t", "plain", "1GiB"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not a thin pool"), "{e}");
    let e = node
        .create_volume(thin_req("t", "p", "0"))
        .await
        .unwrap_err();
    assert!(matches!(e, NodeError::BadRequest(_)), "{e}");
    let e = node.export("p", ns1()).await.unwrap_err();
    assert!(e.to_string().contains("is a thin pool"), "{e}");

    // Over-provisioned: 64 MiB of thin volume on a ~30 MiB pool.
    let mut t = thin_req("t", "p", "64MiB");
    t.export = Some(ns1());
    let v = node.create_volume(t).await.unwrap();
    assert_eq!((v.layout.as_str(), v.size_bytes), ("thin", 64 * MIB));
    assert_eq!(v.allocated_bytes, Some(0));
    let dev = served(&node);
    assert!(
        io(&*dev, BlockOp::Read, 100, None)
            .await
            .iter()
            .all(|&b| b == 0)
    );

    // One block per 1 MiB cluster until the pool is full.
    let mut written = Vec::new();
    let mut full_at = None;
    for c in 0..64u64 {
        let lba = c * 256 + 3;
        match try_write(&*dev, lba, 31).await {
            Ok(()) => written.push(lba),
            Err(blockdev::BlockError::NoSpace) => {
                full_at = Some(c);
                break;
            }
            Err(e) => panic!("cluster {c}: {e}"),
        }
    }
    let full_at = full_at.expect("the pool fills before 64 clusters");
    assert_eq!(written.len() as u64, full_at);
    check_all(&*dev, &written, 31).await;
    let v = node.volume("t").await.unwrap();
    assert_eq!(v.allocated_bytes, Some(full_at * MIB));
    let pool = node.volume("p").await.unwrap().thin_pool.unwrap();
    assert_eq!(pool.allocated_bytes, full_at * MIB);
    assert_eq!(pool.provisioned_bytes, 64 * MIB);
    assert_eq!(pool.volumes, ["t"]);

    let e = node.delete_volume("p", true).await.unwrap_err();
    assert!(e.to_string().contains("thin pool of t"), "{e}");
    // A degraded pool volume shows in its thin volumes' state; data stays.
    node.fail_drive("d1", false).await.unwrap();
    assert_eq!(node.volume("t").await.unwrap().state, "degraded");
    check_all(&*dev, &written, 31).await;

    node.unexport("t", false).await.unwrap();
    node.delete_volume("t", true).await.unwrap();
    let pool = node.volume("p").await.unwrap().thin_pool.unwrap();
    assert_eq!((pool.allocated_bytes, pool.volumes.len()), (0, 0));
    node.delete_volume("p", true).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thin_volumes_come_back_with_their_pool() {
    let dir = tempdir();
    let specs: Vec<DriveSpec> = (0..3)
        .map(|i| DriveSpec {
            name: format!("f{i}"),
            backend: "file".into(),
            size: Some(8 * MIB),
            path: Some(dir.join(format!("f{i}.img"))),
            create: true,
            block_size: 4096,
            ..Default::default()
        })
        .collect();
    let l: Vec<u64> = (0..50).map(|i| i * 331).collect();
    {
        let node = node_of(&specs);
        let mut p = req("pool", "raid5", &["f0", "f1", "f2"]);
        p.thin_pool = true;
        p.cluster = Some("256KiB".into());
        node.create_volume(p).await.unwrap();
        let mut t = thin_req("thin1", "pool", "1GiB");
        t.export = Some(ns1());
        node.create_volume(t).await.unwrap();
        write_all(&*served(&node), &l, 41).await;
        node.shutdown().await;
    }
    let node = node_of(&specs);
    node.assemble_found(&[]).await.unwrap();
    let v = node.volume("thin1").await.expect("found in its pool");
    assert_eq!((v.pool.as_deref(), v.size_bytes), (Some("pool"), 1 << 30));
    node.export("thin1", ns1()).await.unwrap();
    check_all(&*served(&node), &l, 41).await;
    node.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The second replacement lands while the first rebuild is starting or
/// running: the rebuild task picks it up when its pass ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replacements_in_a_row_are_both_rebuilt() {
    let node = mem_node(8, 16 * MIB);
    let mut r = req("r6", "raid6", &["d0", "d1", "d2", "d3", "d4", "d5"]);
    r.export = Some(ns1());
    r.rebuild_rate = Some("64MiB".into());
    node.create_volume(r).await.unwrap();
    let dev = served(&node);
    let l = lbas(&*dev);
    write_all(&*dev, &l, 51).await;
    node.replace_drive("d1", "d6").await.unwrap();
    assert!(node.volume("r6").await.unwrap().rebuild.running);
    node.replace_drive("d4", "d7").await.unwrap();
    let v = node
        .wait_rebuild("r6", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(v.state, "optimal", "{v:?}");
    node.fail_drive("d0", false).await.unwrap();
    node.fail_drive("d2", false).await.unwrap();
    check_all(&*dev, &l, 51).await;
}

pub(super) fn file_specs(dir: &std::path::Path, n: usize, size: u64) -> Vec<DriveSpec> {
    (0..n)
        .map(|i| DriveSpec {
            name: format!("f{i}"),
            backend: "file".into(),
            size: Some(size),
            path: Some(dir.join(format!("f{i}.img"))),
            create: true,
            block_size: 4096,
            ..Default::default()
        })
        .collect()
}

/// Everything the API shows of the node: volumes and drives, as JSON.
pub(super) async fn api_state(node: &Node) -> serde_json::Value {
    serde_json::json!({
        "volumes": node.volumes().await,
        "drives": node.drives().await,
    })
}

async fn io_result(
    dev: &dyn BlockDevice,
    op: BlockOp,
    lba: u64,
) -> Result<(), blockdev::BlockError> {
    let mut buf = AlignedBuf::new(4096);
    buf.set_len(4096);
    dev.submit(IoRequest {
        op,
        lba,
        blocks: 1,
        buf,
    })
    .await
    .result
}

/// A dead volume never keeps the node down: a raid0 member failed (with force), and a raid5 that
/// lost two drives. The next start still runs every other volume; the dead
/// ones come up offline with the reason, are listed, not served, and can be
/// deleted. Before, the raid0 declared in the TOML was made again, empty,
/// on its old drives, and the raid5 was not listed at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_always_starts_and_dead_volumes_come_up_offline() {
    let dir = tempdir();
    let specs = file_specs(&dir, 7, 8 * MIB);
    let l;
    {
        let node = node_in(&specs, Some(&dir));
        // As the TOML's [[volume]] would make it.
        node.ensure_volume_or_offline(req("z0r0", "raid0", &["f0", "f1"]))
            .await;
        node.create_volume(req("r5", "raid5", &["f2", "f3", "f4"]))
            .await
            .unwrap();
        let mut keep = req("keep", "raid1", &["f5", "f6"]);
        keep.export = Some(ns1());
        node.create_volume(keep).await.unwrap();
        let dev = served(&node);
        l = lbas(&*dev);
        write_all(&*dev, &l, 31).await;
        node.export(
            "z0r0",
            ExportRequest {
                nqn: NQN.into(),
                nsid: 2,
            },
        )
        .await
        .unwrap();
        let z = node.volume_device("z0r0").await.unwrap();
        write_all(&*z, &[0, 1, 2, 3], 32).await;

        node.fail_drive("f1", true).await.unwrap();
        let v = node.volume("z0r0").await.unwrap();
        assert_eq!(v.state, "failed", "{v:?}");
        assert!(v.reason.as_deref().unwrap().contains("f1"), "{v:?}");
        node.fail_drive("f2", false).await.unwrap();
        node.fail_drive("f3", true).await.unwrap();
        assert_eq!(node.volume("r5").await.unwrap().state, "failed");
        node.shutdown().await;
    }
    let node = node_in(&specs, Some(&dir));
    node.assemble_found(&[]).await.unwrap();
    node.ensure_volume_or_offline(req("z0r0", "raid0", &["f0", "f1"]))
        .await;
    node.restore_exports().await.unwrap();

    // The healthy volume serves, as before.
    let keep = node.volume("keep").await.unwrap();
    assert_eq!(keep.state, "optimal");
    check_all(&*served(&node), &l, 31).await;

    // The dead ones are listed, offline, with the reason.
    let z = node.volume("z0r0").await.unwrap();
    assert_eq!(z.state, "offline", "{z:?}");
    let why = z.reason.clone().unwrap();
    assert!(why.contains("raid0 survives only 0"), "{why}");
    assert!(z.from_config);
    assert_eq!(z.layout, "raid0");
    let states: Vec<&str> = z.members.iter().map(|m| m.state.as_str()).collect();
    assert_eq!(states, ["active", "failed"], "{z:?}");
    let r5 = node.volume("r5").await.unwrap();
    assert_eq!(r5.state, "offline", "{r5:?}");
    assert!(r5.reason.unwrap().contains("raid5 survives only 1"));
    assert!(r5.size_bytes > 0);
    assert_eq!(node.drive("f0").await.unwrap().state, "member");
    assert_eq!(node.drive("f1").await.unwrap().state, "failed");

    // Not served: no namespace 2 came back, and none can be made.
    let t = node.target().unwrap().subsystem(NQN).unwrap();
    assert!(
        t.namespace(2).is_none(),
        "an offline volume is not exported"
    );
    let e = node.export("r5", ns1()).await.unwrap_err();
    assert!(
        matches!(e, NodeError::Conflict(_)) && e.to_string().contains("offline"),
        "{e}"
    );
    assert!(matches!(
        node.config_namespace("z0r0", NQN, 3).await,
        crate::node::VolumeNamespace::NotServed(_)
    ));
    let before = api_state(&node).await;
    assert!(node.fail_drive("f4", true).await.is_err());
    assert!(node.replace_drive("f0", "f2").await.is_err());
    assert_eq!(api_state(&node).await, before, "refusals change nothing");
    // The one from the TOML is deleted by removing it there; the other now.
    assert!(node.delete_volume("z0r0", true).await.is_err());
    node.delete_volume("r5", true).await.unwrap();
    assert_eq!(node.drive("f4").await.unwrap().state, "free");
    // Failed by the operator before the restart: they stay failed
    // (state_dir/failed-drives.json) until re-added.
    for d in ["f2", "f3"] {
        assert_eq!(node.drive(d).await.unwrap().state, "failed", "{d}");
        assert_eq!(node.re_add_drive(d).await.unwrap().state, "free", "{d}");
    }
    node.shutdown().await;

    // Restarted without the TOML entry: it is offline, and deletable.
    let node = node_in(&specs, Some(&dir));
    node.assemble_found(&[]).await.unwrap();
    let names: Vec<(String, String)> = node
        .volumes()
        .await
        .into_iter()
        .map(|v| (v.name, v.state))
        .collect();
    assert_eq!(
        names,
        [
            ("keep".to_string(), "optimal".to_string()),
            ("z0r0".to_string(), "offline".to_string())
        ]
    );
    node.delete_volume("z0r0", true).await.unwrap();
    assert_eq!(node.drive("f0").await.unwrap().state, "free");
    node.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `drive fail` on a raid0 (or concat) member beyond the
/// tolerance is refused without force and changes nothing; with force the
/// member gets no more I/O, what touches it fails with the volume's error
/// (Unrecovered Read Error / Write Fault to a host), and the volume says failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_a_member_beyond_tolerance_needs_force_and_then_is_real() {
    for layout in ["raid0", "concat"] {
        let node = mem_node(3, 16 * MIB);
        let mut r = req("v", layout, &["d0", "d1"]);
        r.export = Some(ns1());
        node.create_volume(r).await.unwrap();
        let dev = served(&node);
        let l = lbas(&*dev);
        write_all(&*dev, &l, 41).await;

        let before = api_state(&node).await;
        let e = node.fail_drive("d1", false).await.unwrap_err();
        assert!(matches!(e, NodeError::Conflict(_)), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("no redundancy") && msg.contains("--force") && msg.contains("Nothing was"),
            "{msg}"
        );
        assert_eq!(
            api_state(&node).await,
            before,
            "{layout}: a refusal changes nothing"
        );
        check_all(&*dev, &l, 41).await;

        node.fail_drive("d1", true).await.unwrap();
        let v = node.volume("v").await.unwrap();
        assert_eq!(v.state, "failed", "{layout}: {v:?}");
        assert_eq!(node.drive("d1").await.unwrap().state, "failed");
        let vol = node.state.lock().await.volumes["v"]
            .on_drives()
            .unwrap()
            .clone();
        let (mut ok, mut failed) = (0, 0);
        for &lba in &l {
            let on_d1 = vol.layout().extents(lba, 1)[0].member == 1;
            let r = io_result(&*dev, BlockOp::Read, lba).await;
            let w = io_result(&*dev, BlockOp::Write { fua: false }, lba).await;
            if on_d1 {
                failed += 1;
                for e in [r.unwrap_err(), w.unwrap_err()] {
                    assert!(
                        matches!(e, blockdev::BlockError::TooManyFailed { .. }),
                        "{layout} LBA {lba}: {e}"
                    );
                    let st = nvmf_target::io::status_of(&e, BlockOp::Read);
                    assert_eq!(
                        (st.sc, st.dnr),
                        (nvme_wire::status::SC_UNRECOVERED_READ, true)
                    );
                }
            } else {
                ok += 1;
                r.unwrap();
                w.unwrap();
            }
        }
        assert!(ok > 0 && failed > 0, "{layout}: {ok} ok, {failed} failed");
        // It cannot be rebuilt: a replace is refused and changes nothing.
        let before = api_state(&node).await;
        let e = node.replace_drive("d1", "d2").await.unwrap_err();
        assert!(matches!(e, NodeError::Conflict(_)), "{e}");
        assert!(e.to_string().contains("no redundancy"), "{e}");
        assert_eq!(
            api_state(&node).await,
            before,
            "{layout}: a refused replace"
        );
        node.shutdown().await;
    }
}

/// A replace that is refused (spare too small, a volume that
/// cannot be rebuilt) leaves the drive, the volume and the spare as they
/// were; failing a second raid5 member needs force and makes it failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_change_nothing() {
    let mut specs: Vec<DriveSpec> = (0..5)
        .map(|i| mem_drive(&format!("d{i}"), 16 * MIB))
        .collect();
    specs.push(mem_drive("small", 4 * MIB));
    let node = node_of(&specs);
    let mut r = req("r5", "raid5", &["d0", "d1", "d2"]);
    r.export = Some(ns1());
    node.create_volume(r).await.unwrap();
    let dev = served(&node);
    let l = lbas(&*dev);
    write_all(&*dev, &l, 61).await;

    // A spare too small: d0 stays active, the volume optimal, small free.
    let before = api_state(&node).await;
    let e = node.replace_drive("d0", "small").await.unwrap_err();
    assert!(matches!(e, NodeError::BadRequest(_)), "{e}");
    assert!(e.to_string().contains("needs at least"), "{e}");
    assert_eq!(
        api_state(&node).await,
        before,
        "a refused replace changes nothing"
    );
    assert_eq!(node.volume("r5").await.unwrap().state, "optimal");

    // A second failure needs force, and says what is lost.
    node.fail_drive("d0", false).await.unwrap();
    assert_eq!(node.volume("r5").await.unwrap().state, "degraded");
    let before = api_state(&node).await;
    let e = node.fail_drive("d1", false).await.unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("2 of its 3 members") && msg.contains("d0, d1") && msg.contains("--force"),
        "{msg}"
    );
    assert_eq!(
        api_state(&node).await,
        before,
        "a refused fail changes nothing"
    );
    check_all(&*dev, &l, 61).await;
    // Failing it again is no change, and needs no force.
    node.fail_drive("d0", false).await.unwrap();
    assert_eq!(api_state(&node).await, before);

    node.fail_drive("d1", true).await.unwrap();
    let v = node.volume("r5").await.unwrap();
    assert_eq!(v.state, "failed", "{v:?}");
    assert!(v.reason.unwrap().contains("tolerates"));

    // Nothing can be rebuilt now: the replace is refused before it fails
    // the drive, takes the spare or wipes anything.
    let before = api_state(&node).await;
    let e = node.replace_drive("d0", "d3").await.unwrap_err();
    assert!(matches!(e, NodeError::Conflict(_)), "{e}");
    assert!(e.to_string().contains("cannot be rebuilt"), "{e}");
    assert_eq!(
        api_state(&node).await,
        before,
        "a refused replace changes nothing"
    );
    assert_eq!(node.drive("d3").await.unwrap().state, "free");
    node.shutdown().await;
}

/// An enclosure exports drives that are members of another node's volume:
/// at its start it must not enter that volume (offline) over them, or the
/// drives could no longer be exported and the enclosure would not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exported_drives_are_not_assembled_into_local_volumes() {
    let dir = tempdir();
    let specs = file_specs(&dir, 3, 8 * MIB);
    {
        let node = node_in(&specs, Some(&dir));
        node.create_volume(req("theirs", "raid5", &["f0", "f1", "f2"]))
            .await
            .unwrap();
        node.shutdown().await;
    }
    // Only one member is here now, and the TOML exports it.
    {
        let node = node_of(&specs[..1]);
        node.assemble_found(&["f0".to_string()]).await.unwrap();
        assert!(node.volumes().await.is_empty(), "no volume entered");
        node.shutdown().await;
    }
    // Without the export, the same start enters it offline (it is missing
    // two of its three members).
    let node = node_of(&specs[..1]);
    node.assemble_found(&[]).await.unwrap();
    let v = node.volume("theirs").await.unwrap();
    assert_eq!(v.state, "offline", "{v:?}");
}

mod jobs;
#[path = "recovery_tests.rs"]
mod recovery_tests;

//! Recovery and refusals: re-add, failed spares across a restart, forced
//! assembly, and the operations that lose data needing force. Every
//! refusal is checked to change nothing the API shows.

use super::*;

/// [`api_state`] without the rebuild rate, which moves with the clock.
async fn state_of(node: &Node) -> serde_json::Value {
    let mut v = api_state(node).await;
    for vol in v["volumes"].as_array_mut().unwrap() {
        vol["rebuild"]["mb_per_sec"] = serde_json::Value::Null;
        vol["rebuild"]["eta_secs"] = serde_json::Value::Null;
    }
    v
}

async fn head_of(node: &Node, drive: &str) -> Vec<u8> {
    let dev = node.state.lock().await.drives[drive].dev.clone();
    read_head(&dev).await.unwrap()
}

async fn put_head(node: &Node, drive: &str, head: &[u8]) {
    let dev = node.state.lock().await.drives[drive].dev.clone();
    io(&*dev, BlockOp::Write { fua: true }, 0, Some(head)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_add_puts_a_failed_drive_back_and_refusals_change_nothing() {
    let node = mem_node(7, 16 * MIB);
    let mut r5 = req("r5", "raid5", &["d0", "d1", "d2"]);
    r5.export = Some(ns1());
    node.create_volume(r5).await.unwrap();
    node.create_volume(req("z", "raid0", &["d4", "d5"]))
        .await
        .unwrap();
    let dev = served(&node);
    let l = lbas(&*dev);
    write_all(&*dev, &l, 1).await;

    let refused = async |name: &str, what: &str| {
        let before = state_of(&node).await;
        let e = node.re_add_drive(name).await.unwrap_err();
        assert_eq!(
            state_of(&node).await,
            before,
            "{what}: a refusal changes nothing"
        );
        e
    };
    let e = refused("d0", "active member").await;
    assert!(
        matches!(e, NodeError::Conflict(_)) && e.to_string().contains("not failed"),
        "{e}"
    );
    let e = refused("d3", "healthy free drive").await;
    assert!(e.to_string().contains("nothing to re-add"), "{e}");
    let e = refused("nope", "no such drive").await;
    assert!(
        matches!(
            e,
            NodeError::Missing {
                kind: Object::Drive,
                ..
            }
        ),
        "{e}"
    );
    node.fail_drive("d4", true).await.unwrap();
    let e = refused("d4", "raid0").await;
    assert!(e.to_string().contains("no redundancy"), "{e}");

    // Failed, written meanwhile, re-added: only what it missed is resynced.
    node.fail_drive("d1", false).await.unwrap();
    write_all(&*dev, &l[..4], 2).await;
    let r = node.re_add_drive("d1").await.unwrap();
    assert_eq!(r.rebuild, "resync", "{r:?}");
    assert!(
        r.stale_stripes > 0 && r.message.contains("resyncing"),
        "{r:?}"
    );
    assert_eq!(r.volume.as_deref(), Some("r5"));
    let v = node
        .wait_rebuild("r5", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(v.state, "optimal", "{v:?}");
    assert_eq!(node.drive("d1").await.unwrap().state, "member");
    check_all(&*dev, &l[..4], 2).await;
    check_all(&*dev, &l[4..], 1).await;

    // A device that is not (any longer) what the position needs is refused.
    node.fail_drive("d2", false).await.unwrap();
    let own = head_of(&node, "d2").await;
    put_head(&node, "d2", &head_of(&node, "d5").await).await;
    let e = refused("d2", "another volume's drive").await;
    assert!(e.to_string().contains("belongs to volume"), "{e}");
    let mut newer = volume::superblock::Superblock::decode(&own).unwrap();
    newer.generation += 100;
    put_head(&node, "d2", &newer.encode()).await;
    let e = refused("d2", "newer generation").await;
    assert!(e.to_string().contains("generation"), "{e}");
    put_head(&node, "d2", &own).await;
    let r = node.re_add_drive("d2").await.unwrap();
    assert_eq!(r.rebuild, "resync", "{r:?}");
    let v = node
        .wait_rebuild("r5", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(v.state, "optimal", "{v:?}");
    check_all(&*dev, &l[..4], 2).await;
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_spare_stays_failed_after_a_restart_until_re_added() {
    let dir = tempdir();
    let specs = file_specs(&dir, 3, 8 * MIB);
    {
        let node = node_in(&specs, Some(&dir));
        node.fail_drive("f2", false).await.unwrap();
        assert_eq!(node.drive("f2").await.unwrap().state, "failed");
        node.shutdown().await;
    }
    // Another device under the name is not the failed one.
    let mut other = specs.clone();
    other[2].size = Some(4 * MIB);
    other[2].path = Some(dir.join("other.img"));
    let n2 = node_in(&other, Some(&dir));
    assert_eq!(n2.drive("f2").await.unwrap().state, "free");
    n2.shutdown().await;
    drop(n2);
    let node = node_in(&specs, Some(&dir));
    assert_eq!(
        node.drive("f2").await.unwrap().state,
        "failed",
        "kept across the restart"
    );
    assert!(
        node.create_volume(req("v", "raid1", &["f1", "f2"]))
            .await
            .is_err()
    );
    // Re-added (un-failed): free, and it stays free after a restart.
    let r = node.re_add_drive("f2").await.unwrap();
    assert_eq!(r.state, "free", "{r:?}");
    assert_eq!(node.drive("f2").await.unwrap().state, "free");
    node.shutdown().await;
    let node = node_in(&specs, Some(&dir));
    assert_eq!(node.drive("f2").await.unwrap().state, "free");
    node.create_volume(req("v", "raid1", &["f1", "f2"]))
        .await
        .unwrap();
    node.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offline_raid5_is_force_assembled_by_name() {
    let dir = tempdir();
    let specs = file_specs(&dir, 3, 8 * MIB);
    let l;
    {
        let node = node_in(&specs, Some(&dir));
        let mut r5 = req("r5", "raid5", &["f0", "f1", "f2"]);
        r5.export = Some(ns1());
        node.create_volume(r5).await.unwrap();
        let dev = served(&node);
        l = lbas(&*dev);
        write_all(&*dev, &l, 5).await;
        node.fail_drive("f1", false).await.unwrap();
        write_all(&*dev, &l[..8], 6).await;
        node.fail_drive("f2", true).await.unwrap();
        node.shutdown().await;
    }
    let node = node_in(&specs, Some(&dir));
    node.assemble_found(&[]).await.unwrap();
    let v = node.volume("r5").await.unwrap();
    assert_eq!(v.state, "offline", "{v:?}");
    let why = v.reason.unwrap();
    assert!(
        why.contains("--force") && why.contains("f2 (position 2"),
        "{why}"
    );

    // Without force: refused, with what force would do; nothing changed.
    let before = state_of(&node).await;
    let e = node.assemble_by_name("r5", false).await.unwrap_err();
    assert!(e.to_string().contains("would take back f2"), "{e}");
    assert_eq!(
        state_of(&node).await,
        before,
        "a refused assembly changes nothing"
    );
    let e = node.assemble_by_name("nope", true).await.unwrap_err();
    assert!(
        matches!(
            e,
            NodeError::Missing {
                kind: Object::Volume,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(state_of(&node).await, before);

    let v = node.assemble_by_name("r5", true).await.unwrap();
    assert_eq!(v.state, "degraded", "{v:?}");
    let f = v.forced.clone().expect("the answer says what was forced");
    assert_eq!(f.members.len(), 1, "{f:?}");
    assert_eq!(f.members[0].drive, "f2");
    assert_eq!(f.members[0].was, "failed");
    assert!(
        f.members[0].generation < f.members[0].volume_generation,
        "{f:?}"
    );
    assert_eq!(f.still_failed, vec![1]);
    assert!(f.stale_bytes.unwrap() > 0, "{f:?}");
    assert!(f.message.contains("fsck"), "{}", f.message);
    assert_eq!(node.drive("f2").await.unwrap().state, "member");
    // f2 had every write before it failed: nothing was lost here.
    node.export("r5", ns1()).await.unwrap();
    let dev = served(&node);
    check_all(&*dev, &l[..8], 6).await;
    check_all(&*dev, &l[8..], 5).await;
    // f1 comes back through the held bitmap.
    let r = node.re_add_drive("f1").await.unwrap();
    assert_eq!(r.rebuild, "resync", "{r:?}");
    let v = node
        .wait_rebuild("r5", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(v.state, "optimal", "{v:?}");
    check_all(&*dev, &l[..8], 6).await;
    node.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unexport_under_a_host_and_delete_of_data_need_force() {
    use nvmf_target::controller::{Controller, CtrlKind};
    let node = mem_node(4, 16 * MIB);
    let mut a = req("a", "raid1", &["d0", "d1"]);
    a.export = Some(ns1());
    node.create_volume(a).await.unwrap();
    let target = node.target().unwrap().clone();
    let sub = target.subsystem(NQN).unwrap();
    let ctrl = target
        .add_controller(|id| {
            Controller::new(
                id,
                CtrlKind::Io(sub.clone()),
                "nqn.2014-08.org.nvmexpress:host-a".into(),
                [7; 16],
                0,
                32,
                4,
            )
        })
        .unwrap();
    let before = state_of(&node).await;
    let e = node.unexport("a", false).await.unwrap_err();
    assert!(
        matches!(e, NodeError::Conflict(_))
            && e.to_string().contains("host-a")
            && e.to_string().contains("--force"),
        "{e}"
    );
    assert_eq!(
        state_of(&node).await,
        before,
        "a refused unexport changes nothing"
    );
    assert!(sub.namespace(1).is_some());
    node.unexport("a", true).await.unwrap();
    assert!(sub.namespace(1).is_none());
    target.remove_controller(&ctrl, nvmf_target::controller::FreeReason::HostDisconnected);

    // A volume on drives holds data: its delete needs force.
    let before = state_of(&node).await;
    let e = node.delete_volume("a", false).await.unwrap_err();
    assert!(
        e.to_string().contains("holds data") && e.to_string().contains("MiB on drives d0, d1"),
        "{e}"
    );
    assert_eq!(
        state_of(&node).await,
        before,
        "a refused delete changes nothing"
    );
    node.delete_volume("a", true).await.unwrap();

    // A thin volume never written holds nothing; once written it does.
    let mut p = req("p", "raid1", &["d2", "d3"]);
    p.thin_pool = true;
    node.create_volume(p).await.unwrap();
    node.create_volume(thin_req("t", "p", "8MiB"))
        .await
        .unwrap();
    node.create_volume(thin_req("u", "p", "8MiB"))
        .await
        .unwrap();
    node.delete_volume("u", false).await.unwrap();
    let t = node.volume_device("t").await.unwrap();
    io(&*t, BlockOp::Write { fua: true }, 0, Some(&stamp(0, 1))).await;
    let before = state_of(&node).await;
    let e = node.delete_volume("t", false).await.unwrap_err();
    assert!(e.to_string().contains("written"), "{e}");
    assert_eq!(state_of(&node).await, before);
    node.delete_volume("t", true).await.unwrap();
    node.shutdown().await;
}

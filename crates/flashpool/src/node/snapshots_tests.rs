//! Snapshots and clones on one node: a snapshot served write-protected
//! keeps the past, a clone exported beside it takes writes the origin never
//! sees, a consistency group, revert (refused while hosts are connected
//! unless forced), deletes in any order, the pool check, and refusals that
//! change nothing.

use blockdev::{AlignedBuf, BlockDevice, BlockError, BlockOp, IoRequest};

use super::testing::{TestNode, volume};
use super::{CreateVolume, ExportRequest, NodeError};

const MIB: u64 = 1 << 20;
const NQN: &str = "nqn.2026-01.io.flashpool:snap-test";

fn thin(name: &str, nsid: Option<u32>) -> CreateVolume {
    CreateVolume {
        pool: Some("p".into()),
        size: Some("8MiB".into()),
        export: nsid.map(|nsid| ExportRequest {
            nqn: NQN.into(),
            nsid,
        }),
        layout: None,
        ..volume(name, "", &[])
    }
}

async fn write(dev: &dyn BlockDevice, lba: u64, byte: u8) -> Result<(), BlockError> {
    let mut buf = AlignedBuf::new(4096);
    buf.set_len(4096);
    buf.fill(byte);
    let op = BlockOp::Write { fua: true };
    let r = dev.submit(IoRequest {
        op,
        lba,
        blocks: 1,
        buf,
    });
    r.await.result
}

async fn read(dev: &dyn BlockDevice, lba: u64) -> u8 {
    let mut buf = AlignedBuf::new(4096);
    buf.set_len(4096);
    let r = dev
        .submit(IoRequest {
            op: BlockOp::Read,
            lba,
            blocks: 1,
            buf,
        })
        .await;
    r.result.unwrap();
    assert!(r.buf[..4096].iter().all(|&b| b == r.buf[0]));
    r.buf[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_and_clones_are_served_and_refusals_change_nothing() {
    let node = TestNode::new().mem_drives(3, 32 * MIB).target(NQN).build();
    let mut p = volume("p", "raid1", &["d0", "d1"]);
    p.thin_pool = true;
    node.create_volume(p).await.unwrap();
    node.create_volume(volume("plain", "raid0", &["d2"]))
        .await
        .unwrap();
    node.create_volume(thin("t", Some(1))).await.unwrap();
    node.create_volume(thin("u", None)).await.unwrap();
    let target = node.running_target().unwrap().clone();
    let ns = |nsid| target.subsystem(NQN).unwrap().namespace(nsid).unwrap().dev;
    write(&*ns(1), 0, 1).await.unwrap();
    write(&*ns(1), 300, 1).await.unwrap();

    // Refused, and nothing changes.
    let pair = |v: &str, s: &str| (v.to_string(), s.to_string());
    for (pairs, what) in [
        (vec![pair("plain", "s")], "not a thin volume"),
        (vec![pair("t", "u")], "already exists"),
        (vec![pair("t", "bad name!")], "name"),
        (vec![], "no volume"),
    ] {
        let e = node.snapshot_volumes(&pairs).await.unwrap_err();
        assert!(e.to_string().contains(what), "{pairs:?}: {e}");
    }
    assert!(matches!(
        node.snapshot_volumes(&[pair("none", "s")]).await,
        Err(NodeError::Missing { .. })
    ));
    assert_eq!(node.volumes().await.len(), 4);

    // A consistency group of t and u; then t moves on.
    let snaps = node
        .snapshot_volumes(&[pair("t", "t-1"), pair("u", "u-1")])
        .await
        .unwrap();
    assert!(snaps.iter().all(|s| s.snapshot));
    assert_eq!(snaps[0].parent, None);
    write(&*ns(1), 0, 2).await.unwrap();
    let t = node.volume("t").await.unwrap();
    assert_eq!(t.parent.as_deref(), Some("t-1"));
    assert_eq!(t.allocated_bytes, Some(MIB), "one cluster copied on write");

    // The snapshot exported: write-protected, reads the past.
    node.export(
        "t-1",
        ExportRequest {
            nqn: NQN.into(),
            nsid: 2,
        },
    )
    .await
    .unwrap();
    assert!(ns(2).read_only());
    assert_eq!(read(&*ns(2), 0).await, 1);
    assert!(matches!(
        write(&*ns(2), 0, 9).await,
        Err(BlockError::ReadOnly(_))
    ));

    // A clone, exported at create: shares, then diverges from both.
    let c = node
        .clone_volume(
            "t-1",
            "c",
            Some(ExportRequest {
                nqn: NQN.into(),
                nsid: 3,
            }),
        )
        .await
        .unwrap();
    assert_eq!(
        (c.parent.as_deref(), c.allocated_bytes),
        (Some("t-1"), Some(0))
    );
    assert_eq!(read(&*ns(3), 300).await, 1);
    write(&*ns(3), 300, 3).await.unwrap();
    assert_eq!(
        (
            read(&*ns(1), 300).await,
            read(&*ns(2), 300).await,
            read(&*ns(3), 300).await
        ),
        (1, 1, 3)
    );
    assert!(matches!(
        node.clone_volume("t", "c2", None).await,
        Err(NodeError::BadRequest(_))
    ));

    // Revert: refused while hosts are connected is covered by interop (no
    // host here); unexported, t goes back to the snapshot.
    let e = node.revert_volume("t", "u-1", false).await.unwrap_err();
    assert!(e.to_string().contains("not a snapshot of volume"), "{e}");
    assert_eq!(read(&*ns(1), 0).await, 2);
    node.revert_volume("t", "t-1", false).await.unwrap();
    assert_eq!(read(&*ns(1), 0).await, 1);

    // Deletes in any order; a snapshot with data needs force.
    node.unexport("t-1", false).await.unwrap();
    let e = node.delete_volume("t-1", false).await.unwrap_err();
    assert!(e.to_string().contains("--force"), "{e}");
    node.delete_volume("t-1", true).await.unwrap();
    let pool = node.volume("p").await.unwrap().thin_pool.unwrap();
    assert_eq!((pool.snapshots, pool.hidden_snapshots), (1, 1));
    assert_eq!(
        read(&*ns(3), 0).await,
        1,
        "the clone still reads the deleted snapshot"
    );
    let check = node.check_pool("p").await.unwrap();
    assert!(check.ok, "{check:?}");
    assert_eq!((check.snapshots, check.hidden_snapshots), (1, 1));
    node.unexport("c", false).await.unwrap();
    node.delete_volume("c", true).await.unwrap();
    let pool = node.volume("p").await.unwrap().thin_pool.unwrap();
    assert_eq!(pool.hidden_snapshots, 0, "merged into t once c was gone");
    assert_eq!(read(&*ns(1), 300).await, 1);
    assert!(node.check_pool("p").await.unwrap().ok);
    assert!(matches!(
        node.check_pool("plain").await,
        Err(NodeError::BadRequest(_))
    ));
}

//! Online growth of a thin volume on one node: the namespace serving it
//! takes the new size (hosts get the Namespace Attribute Changed event),
//! the new end is written, and every refusal changes nothing.

use blockdev::{AlignedBuf, BlockOp, IoRequest};

use super::testing::{TestNode, volume};
use super::{CreateVolume, ExportRequest, NodeError};

const MIB: u64 = 1 << 20;
const NQN: &str = "nqn.2026-01.io.flashpool:grow-test";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thin_volume_grows_while_served_and_refusals_change_nothing() {
    let node = TestNode::new().mem_drives(3, 16 * MIB).target(NQN).build();
    let mut p = volume("p", "raid1", &["d0", "d1"]);
    p.thin_pool = true;
    node.create_volume(p).await.unwrap();
    node.create_volume(volume("plain", "raid0", &["d2"]))
        .await
        .unwrap();
    let t = CreateVolume {
        pool: Some("p".into()),
        size: Some("8MiB".into()),
        export: Some(ExportRequest {
            nqn: NQN.into(),
            nsid: 1,
        }),
        ..volume("t", "", &[])
    };
    let t = CreateVolume { layout: None, ..t };
    node.create_volume(t).await.unwrap();
    let target = node.running_target().unwrap().clone();
    let ns = || target.subsystem(NQN).unwrap().namespace(1).unwrap();
    assert_eq!(ns().num_blocks, 8 * MIB / 4096);

    // Refused, and nothing changes.
    for (name, size, what) in [
        ("t", "4MiB", "shrink"),
        ("t", "8MiB+1", "size"),
        ("plain", "1GiB", "not a thin volume"),
        ("p", "1GiB", "not a thin volume"),
    ] {
        let e = node.grow_volume(name, size).await.unwrap_err();
        assert!(matches!(e, NodeError::BadRequest(_)), "{name} {size}: {e}");
        assert!(e.to_string().contains(what), "{name} {size}: {e}");
    }
    assert!(matches!(
        node.grow_volume("none", "1GiB").await,
        Err(NodeError::Missing { .. })
    ));
    assert_eq!(node.volume("t").await.unwrap().size_bytes, 8 * MIB);
    assert_eq!(ns().num_blocks, 8 * MIB / 4096);

    // Grown: the namespace serves the new size, the new end takes I/O.
    let v = node.grow_volume("t", "24MiB").await.unwrap();
    assert_eq!(v.size_bytes, 24 * MIB);
    assert_eq!(ns().num_blocks, 24 * MIB / 4096);
    let last = 24 * MIB / 4096 - 1;
    let mut buf = AlignedBuf::new(4096);
    buf.set_len(4096);
    buf.fill(0x6B);
    let dev = ns().dev;
    let w = dev
        .submit(IoRequest {
            op: BlockOp::Write { fua: true },
            lba: last,
            blocks: 1,
            buf,
        })
        .await;
    w.result.unwrap();
    let mut buf = AlignedBuf::new(4096);
    buf.set_len(4096);
    let r = dev
        .submit(IoRequest {
            op: BlockOp::Read,
            lba: last,
            blocks: 1,
            buf,
        })
        .await;
    r.result.unwrap();
    assert!(r.buf[..4096].iter().all(|&b| b == 0x6B));
    // Shrink: refused without force, and with force while the end holds data.
    let e = node.resize_volume("t", "16MiB", false).await.unwrap_err();
    assert!(e.to_string().contains("shrink"), "{e}");
    let e = node.resize_volume("t", "16MiB", true).await.unwrap_err();
    assert!(matches!(e, NodeError::Conflict(_)), "{e}");
    assert_eq!(ns().num_blocks, 24 * MIB / 4096);
    // The end deallocated: the shrink goes through, and the namespace follows.
    let dev = ns().dev;
    let d = dev
        .submit(IoRequest {
            op: BlockOp::Deallocate,
            lba: 16 * MIB / 4096,
            blocks: (8 * MIB / 4096) as u32,
            buf: AlignedBuf::new(0),
        })
        .await;
    d.result.unwrap();
    let v = node.resize_volume("t", "16MiB", true).await.unwrap();
    assert_eq!(v.size_bytes, 16 * MIB);
    assert_eq!(ns().num_blocks, 16 * MIB / 4096);
    node.grow_volume("t", "24MiB").await.unwrap();
    // The same size again: nothing changes.
    assert_eq!(
        node.grow_volume("t", "24MiB").await.unwrap().size_bytes,
        24 * MIB
    );
}

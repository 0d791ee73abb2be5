//! Cluster pools, two nodes in one process and a real etcd: a thin volume
//! shrunk (force) through either node, recorded and served at its new
//! size by both; a snapshot taken unexported and exported later (and
//! unexported again) through either node, served write-protected by both
//! and carried by a move; pool growth refused for a cluster pool. Every
//! refusal changes nothing.

use std::sync::Arc;

use blockdev::{AlignedBuf, BlockDevice, BlockError, BlockOp, IoRequest};
use nvmf_target::Target;

use super::Agent;
use super::extents_tests::grow_on;
use super::pools_tests::{ns, nsid_of, pool_req, pool_state, read, snap, thin};
use super::tests::{NQN, Pair, create_v, io, pair, wait};
use crate::node::{ExportRequest, NodeError};

const MIB: u64 = 1 << 20;

/// Writes 16 KiB of `byte` at byte offset `at` of `dev`.
async fn write_at(dev: &Arc<dyn BlockDevice>, at: u64, byte: u8) -> Result<(), BlockError> {
    let mut buf = AlignedBuf::new(16384);
    buf.set_len(16384);
    buf.fill(byte);
    let r = dev
        .submit(IoRequest {
            op: BlockOp::Write { fua: true },
            lba: at / 4096,
            blocks: 4,
            buf,
        })
        .await;
    r.result.map(|_| ())
}

fn blocks(t: &Target, n: u32) -> u64 {
    t.subsystem(NQN).unwrap().namespace(n).unwrap().num_blocks
}

async fn recorded(a: &Agent, name: &str) -> cluster::ThinSpec {
    let s = a.session().thin_specs("p").await.unwrap();
    s.into_iter().find(|t| t.name == name).unwrap()
}

fn x(nsid: u32) -> ExportRequest {
    ExportRequest {
        nqn: NQN.into(),
        nsid,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thin_volume_of_a_cluster_pool_shrinks_through_either_node() {
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
    a.create(pool_req(0)).await.unwrap();
    a.create(thin("t1", None)).await.unwrap();
    io(&ns(&ta, 1).unwrap(), Some(0xA1)).await.unwrap();
    wait("b to serve t1", 10, async || ns(&tb, 1).is_some()).await;

    // Data at 12 MiB: a shrink to 8 MiB would cut it, refused through
    // b (the owner's refusal); nothing changes anywhere.
    write_at(&ns(&ta, 1).unwrap(), 12 * MIB, 0xC1)
        .await
        .unwrap();
    let before = pool_state(&a).await;
    let e = b.resize("t1", "8MiB", true).await.unwrap_err();
    assert!(e.to_string().contains("t1"), "{e}");
    // Without force a smaller size is refused too.
    assert!(b.resize("t1", "16MiB", false).await.is_err());
    assert_eq!(pool_state(&a).await, before, "a refusal changes nothing");
    assert_eq!(blocks(&ta, 1), 32 * MIB / 4096);
    assert_eq!(blocks(&tb, 1), 32 * MIB / 4096);

    // Shrunk to 16 MiB through b: done by the owner a, recorded, served
    // at the new size by both nodes; the data kept.
    let v = b.resize("t1", "16MiB", true).await.unwrap().unwrap();
    assert_eq!((v.size_bytes, v.owner.as_deref()), (16 * MIB, Some("a")));
    assert_eq!(nsid_of(&v), Some(1));
    assert_eq!(recorded(&a, "t1").await.size_bytes, 16 * MIB);
    assert_eq!(a.node.volume("t1").await.unwrap().size_bytes, 16 * MIB);
    assert_eq!(blocks(&ta, 1), 16 * MIB / 4096);
    assert_eq!(ns(&ta, 1).unwrap().geometry().num_blocks, 16 * MIB / 4096);
    wait("b to serve t1 at its new size", 10, async || {
        blocks(&tb, 1) == 16 * MIB / 4096
    })
    .await;
    assert_eq!(read(&ta, 1).await.unwrap(), vec![0xA1; 16384]);
    // The same request again changes nothing; a grow still works.
    b.resize("t1", "16MiB", true).await.unwrap().unwrap();
    assert_eq!(recorded(&a, "t1").await.size_bytes, 16 * MIB);

    // A snapshot holds what t1 holds at 12 MiB: shrinking t1 below it is
    // refused, and so is shrinking the snapshot; nothing changes.
    a.snapshot(vec![snap("t1", "s1", None)]).await.unwrap();
    let before = pool_state(&a).await;
    let e = b.resize("t1", "8MiB", true).await.unwrap_err();
    assert!(
        matches!(e, NodeError::Conflict(_) | NodeError::BadRequest(_)),
        "{e}"
    );
    let e = a.resize("s1", "8MiB", true).await.unwrap_err();
    assert!(e.to_string().contains("snapshot"), "{e}");
    assert_eq!(pool_state(&a).await, before, "a refusal changes nothing");
    assert_eq!(blocks(&tb, 1), 16 * MIB / 4096);

    // The pool itself is refused, saying nothing was changed.
    let e = b.resize("p", "1MiB", true).await.unwrap_err();
    assert!(
        matches!(&e, NodeError::BadRequest(m) if m.contains("pool") && m.contains("nothing was changed")),
        "{e}"
    );
    // Grown again through b, served at the new size by both.
    b.resize("t1", "48MiB", false).await.unwrap().unwrap();
    wait("b to serve t1 grown again", 10, async || {
        blocks(&tb, 1) == 48 * MIB / 4096
    })
    .await;
    assert_eq!(blocks(&ta, 1), 48 * MIB / 4096);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_volume_on_drives_is_not_shrunk_nor_exported_later() {
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
    let v = create_v(&a).await;
    let spec = a.session().spec("v").await.unwrap();
    let e = b.resize("v", "1MiB", true).await.unwrap_err();
    assert!(
        matches!(&e, NodeError::BadRequest(m) if m.contains("raid5") && m.contains("nothing was changed")),
        "{e}"
    );
    assert!(matches!(
        b.export("v", x(5)).await,
        Err(NodeError::Conflict(_))
    ));
    assert!(matches!(
        a.unexport("v", true).await,
        Err(NodeError::Conflict(_))
    ));
    assert!(matches!(
        a.expand("v", grow_on(&["e1:d0"])).await,
        Err(NodeError::Conflict(m)) if m.contains("not a pool")
    ));
    assert_eq!(a.session().spec("v").await.unwrap(), spec);
    assert_eq!(blocks(&ta, 1) * 4096, v.size_bytes);
    assert!(ta.subsystem(NQN).unwrap().namespace(5).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_a_cluster_pool_is_exported_later_through_either_node() {
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
    a.create(pool_req(0)).await.unwrap();
    a.create(thin("t1", None)).await.unwrap();
    a.create(thin("t2", Some(5))).await.unwrap();
    io(&ns(&ta, 1).unwrap(), Some(0xA1)).await.unwrap();

    // Taken unexported: recorded with nsid 0, served by none.
    let s1 = b.snapshot(vec![snap("t1", "s1", None)]).await.unwrap();
    assert_eq!(nsid_of(&s1[0]), None);
    io(&ns(&ta, 1).unwrap(), Some(0xA9)).await.unwrap();

    // Refused, changing nothing: another subsystem, an nsid taken (in
    // the cluster), a pool, an unexport of what is not exported.
    let before = pool_state(&a).await;
    let other = ExportRequest {
        nqn: "nqn.2026-01.io.flashpool:other".into(),
        nsid: 0,
    };
    assert!(matches!(
        b.export("s1", other).await,
        Err(NodeError::BadRequest(_))
    ));
    let e = b.export("s1", x(5)).await.unwrap_err();
    assert!(
        matches!(&e, NodeError::Conflict(m) if m.contains("nsid 5")),
        "{e}"
    );
    assert!(matches!(
        a.export("p", x(0)).await,
        Err(NodeError::Conflict(_))
    ));
    assert!(matches!(
        b.unexport("s1", false).await,
        Err(NodeError::Conflict(_))
    ));
    assert!(
        matches!(b.expand("p", grow_on(&["e1:d0"])).await, Err(NodeError::Conflict(m)) if m.contains("member of p"))
    );
    assert!(matches!(
        a.check_expand("t1").await,
        Err(NodeError::Conflict(_))
    ));
    assert_eq!(pool_state(&a).await, before, "a refusal changes nothing");
    assert!(a.session().thin_nsids(NQN).await.unwrap().len() == 2);
    // Not the cluster's: the node answers (here: no such volume).
    assert!(a.export("nothing", x(0)).await.unwrap().is_none());
    assert!(a.check_expand("nothing").await.is_ok());

    // Exported through b as the lowest free nsid: recorded by the owner
    // a, served write-protected by both nodes, as it was taken.
    let v = b.export("s1", x(0)).await.unwrap().unwrap();
    assert_eq!((nsid_of(&v), v.owner.as_deref()), (Some(2), Some("a")));
    let r = recorded(&a, "s1").await;
    assert_eq!((r.nsid, r.snapshot), (2, true));
    let mut held = a.session().thin_nsids(NQN).await.unwrap();
    held.sort();
    assert_eq!(held, vec![1, 2, 5]);
    assert_eq!(read(&ta, 2).await.unwrap(), vec![0xA1; 16384]);
    assert!(ns(&ta, 2).unwrap().read_only());
    assert!(io(&ns(&ta, 2).unwrap(), Some(0xEE)).await.is_err());
    wait("b to serve s1", 10, async || ns(&tb, 2).is_some()).await;
    assert!(ns(&tb, 2).unwrap().read_only());
    let (x2, y2) = (ta.subsystem(NQN).unwrap(), tb.subsystem(NQN).unwrap());
    assert_eq!(
        x2.namespace(2).unwrap().nguid,
        y2.namespace(2).unwrap().nguid
    );
    // Exported twice: refused.
    assert!(matches!(
        a.export("s1", x(0)).await,
        Err(NodeError::Conflict(_))
    ));

    // t2 unexported through b (nsid 5 freed on both nodes), exported
    // again as nsid 9 through a.
    let v = b.unexport("t2", false).await.unwrap().unwrap();
    assert_eq!(nsid_of(&v), None);
    wait("nsid 5 gone from both nodes", 10, async || {
        ns(&ta, 5).is_none() && ns(&tb, 5).is_none()
    })
    .await;
    assert_eq!(recorded(&a, "t2").await.nsid, 0);
    let v = a.export("t2", x(9)).await.unwrap().unwrap();
    assert_eq!(nsid_of(&v), Some(9));
    io(&ns(&ta, 9).unwrap(), Some(0xB9)).await.unwrap();
    wait("b to serve t2 as nsid 9", 10, async || ns(&tb, 9).is_some()).await;

    // A move carries them: b serves s1 and t2 as recorded.
    a.move_volume("p", "b").await.unwrap();
    assert_eq!(read(&tb, 2).await.unwrap(), vec![0xA1; 16384]);
    assert_eq!(read(&tb, 9).await.unwrap(), vec![0xB9; 16384]);
    assert!(io(&ns(&tb, 2).unwrap(), Some(0xEE)).await.is_err());

    // Unexported through a (passed on to the owner b): served by none.
    a.unexport("s1", false).await.unwrap().unwrap();
    wait("nsid 2 gone from both nodes", 10, async || {
        ns(&ta, 2).is_none() && ns(&tb, 2).is_none()
    })
    .await;
    assert_eq!(recorded(&a, "s1").await.nsid, 0);
}

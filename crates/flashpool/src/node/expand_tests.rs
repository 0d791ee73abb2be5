//! `pool expand` on one node: a full pool grows by a volume on other
//! drives, thin volumes write into the new space, the pool comes back with
//! its extent after a restart, and the extent is guarded and deleted with
//! its pool; refusals change nothing.

use super::NodeError;
use super::ops::ExpandPool;
use super::tests::{
    MIB, check_all, file_specs, node_of, ns1, req, served, tempdir, thin_req, write_all,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_grows_by_an_extent_and_comes_back_with_it() {
    let dir = tempdir();
    let specs = file_specs(&dir, 5, 8 * MIB);
    // One LBA in each 256 KiB cluster of a 64 MiB thin volume: more
    // clusters than the pool holds until it grows.
    let per_cluster = |n: u64| -> Vec<u64> { (0..n).map(|i| i * 64 + (i % 64)).collect() };
    let l;
    {
        let node = node_of(&specs);
        let mut p = req("pool", "raid1", &["f0", "f1"]);
        p.thin_pool = true;
        p.cluster = Some("256KiB".into());
        node.create_volume(p).await.unwrap();
        let mut t = thin_req("t", "pool", "64MiB");
        t.export = Some(ns1());
        node.create_volume(t).await.unwrap();
        let dev = served(&node);
        let before = node.volume("pool").await.unwrap().thin_pool.unwrap();
        let n = before.capacity_bytes / before.cluster_bytes;
        l = per_cluster(n + n / 2);
        let (first, rest) = l.split_at(n as usize / 2);
        write_all(&*dev, first, 5).await;

        // Refusals change nothing.
        let grow = |drives: &[&str]| ExpandPool {
            drives: drives.iter().map(|d| d.to_string()).collect(),
            ..Default::default()
        };
        for (pool, drives, what) in [
            ("t", &["f2", "f3"][..], "not a thin pool"),
            ("pool", &["f0", "f2"][..], "f0"),
            ("pool", &[][..], "drives"),
            ("nope", &["f2", "f3"][..], "nope"),
        ] {
            let e = node.expand_pool(pool, grow(drives)).await.unwrap_err();
            assert!(e.to_string().contains(what), "{pool} {drives:?}: {e}");
        }
        assert_eq!(node.volumes().await.len(), 2, "no volume left behind");

        let v = node.expand_pool("pool", grow(&["f2", "f3"])).await.unwrap();
        let after = v.thin_pool.unwrap();
        assert_eq!(after.extents.len(), 1);
        assert_eq!(after.extents[0].volume, "pool-x1");
        let grown = after.extents[0].capacity_bytes;
        assert!(grown > 6 * MIB, "{after:?}");
        assert_eq!(after.capacity_bytes, before.capacity_bytes + grown);
        assert_eq!(
            after.free_bytes,
            before.free_bytes - after.allocated_bytes + grown
        );
        let x = node.volume("pool-x1").await.unwrap();
        assert_eq!(
            (x.layout.as_str(), x.extent_of.as_deref()),
            ("raid1", Some("pool"))
        );
        // The extent is not served, nor deleted on its own.
        let e = node.export("pool-x1", ns1()).await.unwrap_err();
        assert!(e.to_string().contains("extent"), "{e}");
        let e = node.delete_volume("pool-x1", true).await.unwrap_err();
        assert!(matches!(e, NodeError::Conflict(_)), "{e}");

        // Past the old capacity: the writes land in the new extent.
        write_all(&*dev, rest, 5).await;
        check_all(&*dev, &l, 5).await;
        let check = node.check_pool("pool").await.unwrap();
        assert!(check.ok, "{check:?}");
        node.shutdown().await;
    }
    let node = node_of(&specs);
    node.assemble_found(&[]).await.unwrap();
    let p = node
        .volume("pool")
        .await
        .unwrap()
        .thin_pool
        .expect("opened");
    assert_eq!(p.extents.len(), 1, "{p:?}");
    node.export("t", ns1()).await.unwrap();
    check_all(&*served(&node), &l, 5).await;

    // The pool goes with its extent.
    node.unexport("t", true).await.unwrap();
    node.delete_volume("t", true).await.unwrap();
    node.delete_volume("pool", true).await.unwrap();
    assert!(node.volumes().await.is_empty());
    node.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A host that writes what looks like a thin pool (or an extent header)
/// at the start of its plain volume does not turn it into one: the
/// volume's superblocks record what it is for, and only pools and extents
/// have block 0 read as metadata.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_cannot_make_its_volume_a_pool() {
    use blockdev::BlockDevice;
    use std::sync::Arc;
    use volume::thin::ThinPool;

    let dir = tempdir();
    let specs = file_specs(&dir, 2, 8 * MIB);
    // A real pool superblock, made elsewhere.
    let fake = blockdev::mem::MemDevice::new(8 * MIB, 4096).unwrap();
    let fake: Arc<dyn BlockDevice> = Arc::new(fake);
    ThinPool::format(fake.clone(), 256 << 10).await.unwrap();
    let block0 = |d: Arc<dyn BlockDevice>| async move {
        let mut b = blockdev::AlignedBuf::new(4096);
        b.set_len(4096);
        let r = d
            .submit(blockdev::IoRequest {
                op: blockdev::BlockOp::Read,
                lba: 0,
                blocks: 1,
                buf: b,
            })
            .await;
        r.result.unwrap();
        r.buf[..4096].to_vec()
    };
    let sb = block0(fake).await;
    {
        let node = node_of(&specs);
        let mut v = req("v", "raid1", &["f0", "f1"]);
        v.export = Some(ns1());
        node.create_volume(v).await.unwrap();
        let mut b = blockdev::AlignedBuf::new(4096);
        b.set_len(4096);
        b.copy_from_slice(&sb);
        let w = served(&node)
            .submit(blockdev::IoRequest {
                op: blockdev::BlockOp::Write { fua: true },
                lba: 0,
                blocks: 1,
                buf: b,
            })
            .await;
        w.result.unwrap();
        node.shutdown().await;
    }
    let node = node_of(&specs);
    node.assemble_found(&[]).await.unwrap();
    let v = node.volume("v").await.unwrap();
    assert!(v.thin_pool.is_none() && v.extent_of.is_none(), "{v:?}");
    node.export("v", ns1()).await.unwrap();
    assert_eq!(
        block0(served(&node)).await,
        sb,
        "the host's data is untouched"
    );
    node.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

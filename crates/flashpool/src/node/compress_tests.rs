//! Compressed thin pools through the node: made with `compression`, written
//! through the served namespace, shown (pool and thin volume views, metrics)
//! with what their chunks hold against what they take; refused requests
//! change nothing; the compaction task's choice of pools and its stop.

use std::sync::Arc;

use blockdev::{AlignedBuf, BlockDevice, BlockOp, IoRequest};
use volume::CompactOptions;

use super::tests::{MIB, api_state, io, mem_node, ns1, req, served, thin_req};
use super::*;
use crate::api_types::PoolInfo;

/// A block of text that compresses well (and differs per LBA, so no two
/// blocks are alike).
fn text_block(lba: u64) -> Vec<u8> {
    let line = format!("block {lba:08}: flashpool stores this line compressed. ");
    line.bytes().cycle().take(4096).collect()
}

fn pool_req(name: &str, drives: &[&str], compression: Option<&str>) -> CreateVolume {
    let mut p = req(name, "raid5", drives);
    p.thin_pool = true;
    p.compression = compression.map(str::to_string);
    p
}

/// Writes text to the first `blocks` blocks of `dev`, then reads them back.
async fn write_text(dev: &dyn BlockDevice, blocks: u64) {
    for lba in 0..blocks {
        io(
            dev,
            BlockOp::Write { fua: false },
            lba,
            Some(&text_block(lba)),
        )
        .await;
    }
    for lba in 0..blocks {
        let got = io(dev, BlockOp::Read, lba, None).await;
        assert!(got == text_block(lba), "LBA {lba} reads back other data");
    }
}

fn metric(page: &str, series: &str) -> u64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in the page"))
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_pool_stores_text_in_fewer_bytes_than_it_holds() {
    for (compression, drives) in [("lz4", ["d0", "d1", "d2"]), ("zstd", ["d3", "d4", "d5"])] {
        let node = mem_node(6, 16 * MIB);
        let pool = format!("p{compression}");
        let info = node
            .create_volume(pool_req(&pool, &drives, Some(compression)))
            .await
            .unwrap();
        let p = info.thin_pool.unwrap();
        // No cluster asked for: 64 KiB, as chunks are compressed whole.
        assert_eq!(
            (p.compression.as_str(), p.cluster_bytes),
            (compression, 64 << 10)
        );
        assert_eq!(
            (p.logical_bytes, p.stored_bytes, p.pack_clusters),
            (0, 0, 0)
        );

        let mut t = thin_req("t", &pool, "64MiB");
        t.export = Some(ns1());
        node.create_volume(t).await.unwrap();
        // 1 MiB of text: 16 chunks of 64 KiB.
        write_text(&*served(&node), 256).await;

        let p = node.volume(&pool).await.unwrap().thin_pool.unwrap();
        assert_eq!(p.logical_bytes, MIB, "{p:?}");
        assert!(
            p.stored_bytes > 0 && p.stored_bytes * 4 < p.logical_bytes,
            "{compression}: text should compress at least 4:1: {p:?}"
        );
        assert!(p.pack_clusters > 0, "{p:?}");
        eprintln!(
            "{compression}: {} B of chunks stored in {} B ({:.1}x), {} pack cluster(s)",
            p.logical_bytes,
            p.stored_bytes,
            p.logical_bytes as f64 / p.stored_bytes as f64,
            p.pack_clusters
        );
        let v = node.volume("t").await.unwrap();
        assert_eq!(v.allocated_bytes, Some(MIB));
        assert_eq!(v.stored_bytes, Some(p.stored_bytes), "{v:?}");
        // The pool's chunks are the thin volume's, as the metrics say too.
        let page = node.metrics().await;
        let l = format!("{{pool=\"{pool}\"}}");
        assert_eq!(
            metric(&page, &format!("flashpool_thin_pool_logical_bytes{l}")),
            MIB
        );
        assert_eq!(
            metric(&page, &format!("flashpool_thin_pool_stored_bytes{l}")),
            p.stored_bytes
        );
        let l = format!("{{volume=\"t\",pool=\"{pool}\"}}");
        assert_eq!(
            metric(&page, &format!("flashpool_thin_volume_stored_bytes{l}")),
            p.stored_bytes
        );

        // The compaction task looks at this pool (it holds pack clusters).
        let names = compact::candidates(&*node.state.lock().await);
        assert_eq!(names, [pool.as_str()]);
        assert!(node.compact_pools(CompactOptions::default()).await);
        write_text(&*served(&node), 256).await;

        node.unexport("t", false).await.unwrap();
        node.delete_volume("t", true).await.unwrap();
        let p = node.volume(&pool).await.unwrap().thin_pool.unwrap();
        assert_eq!((p.logical_bytes, p.stored_bytes), (0, 0), "{p:?}");
        node.delete_volume(&pool, true).await.unwrap();
        node.shutdown().await;
        // Shut down, the node compacts nothing any more.
        assert!(!node.compact_pools(CompactOptions::default()).await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_without_compression_stores_what_it_holds() {
    let node = mem_node(3, 16 * MIB);
    let info = node
        .create_volume(pool_req("p", &["d0", "d1", "d2"], Some("none")))
        .await
        .unwrap();
    let p = info.thin_pool.unwrap();
    assert_eq!((p.compression.as_str(), p.cluster_bytes), ("none", MIB));
    let mut t = thin_req("t", "p", "64MiB");
    t.export = Some(ns1());
    node.create_volume(t).await.unwrap();
    write_text(&*served(&node), 16).await;
    let p = node.volume("p").await.unwrap().thin_pool.unwrap();
    assert_eq!(
        (p.logical_bytes, p.stored_bytes, p.pack_clusters),
        (MIB, MIB, 0)
    );
    assert!(compact::candidates(&*node.state.lock().await).is_empty());
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_compression_requests_change_nothing() {
    let node = mem_node(3, 16 * MIB);
    let before = api_state(&node).await;
    let refused = async |r: CreateVolume, says: &[&str]| {
        let e = node.create_volume(r).await.unwrap_err();
        assert!(matches!(e, NodeError::BadRequest(_)), "{e}");
        let msg = e.to_string();
        assert!(says.iter().all(|s| msg.contains(s)), "{msg}");
    };
    let d = ["d0", "d1", "d2"];
    refused(
        pool_req("p", &d, Some("gzip")),
        &["\"gzip\"", "lz4, zstd or none"],
    )
    .await;
    let mut r = req("p", "raid5", &d);
    r.compression = Some("lz4".into());
    refused(r, &["for thin pools"]).await;
    let mut r = pool_req("p", &d, Some("lz4"));
    r.cluster = Some("4KiB".into());
    refused(r, &["16 KiB to 1 MiB"]).await;
    let mut r = pool_req("p", &d, Some("zstd"));
    r.cluster = Some("2MiB".into());
    refused(r, &["16 KiB to 1 MiB"]).await;
    assert_eq!(api_state(&node).await, before, "nothing was made");

    // The drives are still free: a compressed pool is made on them.
    node.create_volume(pool_req("p", &d, Some("lz4")))
        .await
        .unwrap();
    let before = api_state(&node).await;
    let mut t = thin_req("t", "p", "1GiB");
    t.compression = Some("lz4".into());
    refused(t, &["set on a thin pool"]).await;
    assert_eq!(api_state(&node).await, before, "no thin volume was made");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_takes_compression_and_refuses_unknown_names() {
    let node = mem_node(3, 16 * MIB);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = crate::api::App {
        node: node.clone(),
        agent: None,
    };
    tokio::spawn(async move {
        axum::serve(listener, crate::api::router(app))
            .await
            .unwrap()
    });
    let post = move |body: &'static str| {
        tokio::task::spawn_blocking(move || {
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .http_status_as_error(false)
                .build()
                .into();
            let mut r = agent
                .post(format!("http://{addr}/v1/volumes"))
                .send(body)
                .unwrap();
            let v: serde_json::Value =
                serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
            (r.status().as_u16(), v)
        })
    };
    let (s, v) = post(
        r#"{"name":"p","layout":"raid5","drives":["d0","d1","d2"],"thin_pool":true,"compression":"brotli"}"#,
    )
    .await
    .unwrap();
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("use lz4, zstd or none"),
        "{v}"
    );
    let (s, v) =
        post(r#"{"name":"p","layout":"raid5","drives":["d0","d1","d2"],"compression":"lz4"}"#)
            .await
            .unwrap();
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("for thin pools"),
        "{v}"
    );
    assert!(node.volumes().await.is_empty());
    let (s, v) = post(
        r#"{"name":"p","layout":"raid5","drives":["d0","d1","d2"],"thin_pool":true,"compression":"zstd"}"#,
    )
    .await
    .unwrap();
    assert_eq!(s, 201, "{v}");
    let p = &v["thin_pool"];
    assert_eq!(
        (&p["compression"], &p["cluster_bytes"], &p["stored_bytes"]),
        (&"zstd".into(), &(64 << 10).into(), &0.into()),
        "{v}"
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pools_compaction_is_stopped_before_it_goes() {
    let node = mem_node(3, 16 * MIB);
    node.create_volume(pool_req("p", &["d0", "d1", "d2"], Some("lz4")))
        .await
        .unwrap();
    let c = node.state.lock().await.compactor.clone();
    assert_eq!(c.running(), None);
    // Stopping a pool that is not being compacted returns at once.
    tokio::time::timeout(std::time::Duration::from_secs(5), c.stop("p"))
        .await
        .unwrap();
    let n: Arc<Node> = node.clone();
    n.spawn_compaction_every(
        std::time::Duration::from_millis(10),
        CompactOptions::default(),
    );
    node.delete_volume("p", true).await.unwrap();
    assert!(node.volume("p").await.is_err());
    assert_eq!(c.running(), None);
    node.shutdown().await;
}

/// Deallocates the 16 blocks (one 64 KiB chunk) from `lba`.
async fn deallocate_chunk(dev: &dyn BlockDevice, lba: u64) {
    let done = dev
        .submit(IoRequest {
            op: BlockOp::Deallocate,
            lba,
            blocks: 16,
            buf: AlignedBuf::new(0),
        })
        .await;
    done.result.unwrap();
}

/// Thin volume `t` of pool `p` on d0..d2 (made here), exported as nsid 1,
/// with 64 chunks of text written and three in four freed again: the pool
/// before and after the frees.
async fn sparse_pool(node: &Arc<Node>) -> (Arc<dyn BlockDevice>, PoolInfo, PoolInfo) {
    node.create_volume(pool_req("p", &["d0", "d1", "d2"], Some("lz4")))
        .await
        .unwrap();
    let mut t = thin_req("t", "p", "64MiB");
    t.export = Some(ns1());
    node.create_volume(t).await.unwrap();
    let dev = served(node);
    // 64 chunks of text, one 4 KiB block each once compressed.
    write_text(&*dev, 64 * 16).await;
    let full = node.volume("p").await.unwrap().thin_pool.unwrap();
    assert!(full.pack_clusters >= 4, "{full:?}");
    // Three chunks in four freed: every pack cluster a quarter full.
    for c in (0..64u64).filter(|c| c % 4 != 0) {
        deallocate_chunk(&*dev, c * 16).await;
    }
    let sparse = node.volume("p").await.unwrap().thin_pool.unwrap();
    (dev, full, sparse)
}

/// Chunks freed leave holes in their pack clusters; a pass of the node's
/// compaction moves the rest together and gives clusters back, and every
/// chunk left reads as it was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_gives_sparse_pack_clusters_back() {
    let node = mem_node(3, 16 * MIB);
    let (dev, full, sparse) = sparse_pool(&node).await;
    assert_eq!(sparse.logical_bytes, 16 * (64 << 10), "{sparse:?}");
    // (A pack cluster all of whose chunks went is free at once.)
    assert!(sparse.pack_clusters >= 3, "{sparse:?}");

    assert!(node.compact_pools(CompactOptions::default()).await);
    let after = node.volume("p").await.unwrap().thin_pool.unwrap();
    eprintln!(
        "pack clusters: {} full, {} after frees, {} after compaction",
        full.pack_clusters, sparse.pack_clusters, after.pack_clusters
    );
    assert!(after.pack_clusters < sparse.pack_clusters, "{after:?}");
    assert!(after.allocated_bytes < sparse.allocated_bytes, "{after:?}");
    assert_eq!(
        (after.logical_bytes, after.stored_bytes),
        (sparse.logical_bytes, sparse.stored_bytes)
    );
    for c in 0..64u64 {
        for lba in [c * 16, c * 16 + 15] {
            let got = io(&*dev, BlockOp::Read, lba, None).await;
            if c % 4 == 0 {
                assert!(got == text_block(lba), "LBA {lba} changed in compaction");
            } else {
                assert!(got.iter().all(|&b| b == 0), "LBA {lba} was deallocated");
            }
        }
    }
    node.shutdown().await;
}

/// A slow pass (32 KiB/s: its 16 chunks take half a second) is dropped at
/// once by `stop` (the pool goes: delete, fenced), and ended after the
/// chunk in flight by `finish` (the pool is closed and opened again:
/// hand-over, shutdown), which leaves the pool sound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_is_dropped_by_stop_and_waited_for_by_finish() {
    use std::time::{Duration, Instant};
    let slow = CompactOptions {
        below_fill_pct: 50,
        rate_bytes_per_sec: 32 << 10,
    };
    let started = async |node: &Arc<Node>| {
        let c = node.state.lock().await.compactor.clone();
        let n = node.clone();
        let pass = tokio::spawn(async move { n.compact_pools(slow).await });
        while c.running().is_none() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        (c, pass)
    };

    let node = mem_node(3, 16 * MIB);
    sparse_pool(&node).await;
    let (c, pass) = started(&node).await;
    let t = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), c.stop("p"))
        .await
        .expect("stop drops the pass");
    assert!(
        t.elapsed() < Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(c.running(), None);
    assert!(pass.await.unwrap());
    // (The pool is not used after a drop: that is for pools that go.)
    node.shutdown().await;

    let node = mem_node(3, 16 * MIB);
    let (_dev, _, sparse) = sparse_pool(&node).await;
    let (c, pass) = started(&node).await;
    let t = Instant::now();
    c.finish(Some("p")).await;
    assert!(
        t.elapsed() < Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(c.running(), None);
    assert!(pass.await.unwrap());
    let p = node.volume("p").await.unwrap().thin_pool.unwrap();
    // (Cut short, the pass may hold one pack cluster more than before.)
    assert_eq!(p.stored_bytes, sparse.stored_bytes, "{p:?}");
    let check = node.check_pool("p").await.unwrap();
    assert!(check.ok, "{check:?}");
    node.shutdown().await;
}

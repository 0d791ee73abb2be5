//! Compressed thin pools on RAM devices: data round trips through
//! compressed and raw chunks, the space they take, reopen, snapshots and
//! clones, deallocation, compaction, and the refusals.

use blockdev::{BlockDevice, BlockOp};

use crate::testutil::{Rng, block_on};
use crate::thin::{CompactOptions, Compression, ThinError, ThinPool};
use crate::thin_tests::{BS, dev, mem, rand_data, tread, twrite, tzero};

const CB: u64 = 64 << 10;

/// Data LZ4 and zstd shrink to about a quarter: runs of one random byte.
pub(crate) fn compressible(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    for run in v.chunks_mut(16) {
        let b = rng.below(256) as u8;
        run.fill(b);
    }
    v
}

#[test]
fn compressible_chunks_are_stored_in_fewer_blocks_and_read_back() {
    for algo in [Compression::Lz4, Compression::Zstd] {
        block_on(async {
            let m = mem(16 << 20);
            let pool = ThinPool::format_compressed(dev(&m), CB, algo)
                .await
                .unwrap();
            assert_eq!(pool.compression(), algo);
            let v = pool.create_volume("v", 8 << 20, 4096).await.unwrap();
            let mut rng = Rng::new(7);
            let mut model = vec![0u8; 8 << 20];
            // Whole chunks, then 4 KiB writes into them and into new ones.
            for c in 0..32u64 {
                let d = compressible(&mut rng, CB as usize);
                twrite(&v, c * CB / BS, &d).await.unwrap();
                model[(c * CB) as usize..((c + 1) * CB) as usize].copy_from_slice(&d);
            }
            for _ in 0..200 {
                let lba = rng.below(64 * CB / BS);
                let d = compressible(&mut rng, BS as usize);
                twrite(&v, lba, &d).await.unwrap();
                model[(lba * BS) as usize..((lba + 1) * BS) as usize].copy_from_slice(&d);
            }
            let got = tread(&v, 0, 64 * CB / BS).await;
            assert!(got == model[..(64 * CB) as usize], "{algo}: data differs");
            let u = pool.usage();
            assert!(
                u.logical_bytes > 0 && u.stored_bytes * 2 < u.logical_bytes,
                "{u:?}"
            );
            assert!(u.pack_clusters > 0 && u.allocated_clusters < u.logical_bytes / CB);
            assert_eq!(v.info().stored_bytes, u.stored_bytes);
            pool.check().unwrap();
            pool.check_with_device().await.unwrap();
            // Reopen: the checkpoint and journal give the same chunks.
            pool.close().await.unwrap();
            drop((v, pool));
            let pool = ThinPool::open(dev(&m)).await.unwrap();
            assert_eq!(pool.compression(), algo);
            let v = pool.volume("v").unwrap();
            assert!(tread(&v, 0, 64 * CB / BS).await == model[..(64 * CB) as usize]);
            assert_eq!(pool.usage().stored_bytes, u.stored_bytes);
            pool.check_with_device().await.unwrap();
        });
    }
}

#[test]
fn incompressible_chunks_stay_raw_and_a_compressible_rewrite_packs_them() {
    block_on(async {
        let m = mem(8 << 20);
        let pool = ThinPool::format_compressed(dev(&m), CB, Compression::Lz4)
            .await
            .unwrap();
        let v = pool.create_volume("v", 4 << 20, 4096).await.unwrap();
        let mut rng = Rng::new(3);
        let r = rand_data(&mut rng, (4 * CB) as usize);
        twrite(&v, 0, &r).await.unwrap();
        let u = pool.usage();
        assert_eq!((u.stored_bytes, u.pack_clusters), (4 * CB, 0), "{u:?}");
        // A 4 KiB write into a raw chunk goes in place.
        let d = compressible(&mut rng, BS as usize);
        twrite(&v, 1, &d).await.unwrap();
        assert_eq!(pool.usage().stored_bytes, 4 * CB);
        // A whole compressible chunk over a raw one frees the raw cluster.
        let c = compressible(&mut rng, CB as usize);
        twrite(&v, CB / BS, &c).await.unwrap();
        let u = pool.usage();
        assert!(u.stored_bytes < 4 * CB && u.pack_clusters == 1, "{u:?}");
        assert_eq!(u.allocated_clusters, 4);
        let got = tread(&v, 0, 2 * CB / BS).await;
        assert_eq!(&got[..BS as usize], &r[..BS as usize]);
        assert_eq!(&got[BS as usize..2 * BS as usize], &d[..]);
        assert_eq!(&got[CB as usize..], &c[..]);
        pool.check_with_device().await.unwrap();
    });
}

#[test]
fn snapshots_clones_and_deallocate_work_on_compressed_chunks() {
    block_on(async {
        let m = mem(16 << 20);
        let pool = ThinPool::format_compressed(dev(&m), CB, Compression::Lz4)
            .await
            .unwrap();
        let v = pool.create_volume("v", 4 << 20, 4096).await.unwrap();
        let mut rng = Rng::new(11);
        let base = compressible(&mut rng, (8 * CB) as usize);
        twrite(&v, 0, &base).await.unwrap();
        let s = pool.snapshot(&[("v", "s")]).await.unwrap().remove(0);
        // Copy-on-write of a compressed chunk, 4 KiB into it.
        let d = compressible(&mut rng, BS as usize);
        twrite(&v, 3, &d).await.unwrap();
        let mut now = base.clone();
        now[3 * BS as usize..4 * BS as usize].copy_from_slice(&d);
        assert!(tread(&v, 0, 8 * CB / BS).await == now);
        assert!(tread(&s, 0, 8 * CB / BS).await == base);
        let c = pool.clone_volume("s", "c").await.unwrap();
        assert!(tread(&c, 0, 8 * CB / BS).await == base);
        // Deallocate: a whole chunk of its own goes; one over the snapshot's
        // data reads as zeroes; part of a chunk is zeroed.
        tzero(&v, BlockOp::Deallocate, 0, CB / BS).await.unwrap();
        tzero(&v, BlockOp::WriteZeroes, CB / BS + 2, 3)
            .await
            .unwrap();
        now[..CB as usize].fill(0);
        now[(CB + 2 * BS) as usize..(CB + 5 * BS) as usize].fill(0);
        assert!(tread(&v, 0, 8 * CB / BS).await == now);
        assert!(tread(&s, 0, 8 * CB / BS).await == base);
        pool.check_with_device().await.unwrap();
        // Deleting the snapshot merges its chunks into its one child... it
        // has two (v and c): it hides; delete the clone, then it merges.
        pool.delete_volume("s").await.unwrap();
        pool.delete_volume("c").await.unwrap();
        assert!(tread(&v, 0, 8 * CB / BS).await == now);
        pool.check_with_device().await.unwrap();
        pool.delete_volume("v").await.unwrap();
        let u = pool.usage();
        assert_eq!((u.stored_bytes, u.allocated_clusters), (0, 0), "{u:?}");
        pool.check_with_device().await.unwrap();
    });
}

#[test]
fn compaction_gives_sparse_pack_clusters_back_and_keeps_the_data() {
    block_on(async {
        let m = mem(32 << 20);
        let pool = ThinPool::format_compressed(dev(&m), CB, Compression::Lz4)
            .await
            .unwrap();
        let v = pool.create_volume("v", 16 << 20, 4096).await.unwrap();
        let s0 = pool.create_volume("w", 16 << 20, 4096).await.unwrap();
        let mut rng = Rng::new(5);
        let n = 96u64;
        let mut model = vec![vec![0u8; (n * CB) as usize]; 2];
        for (i, vol) in [&v, &s0].into_iter().enumerate() {
            for c in 0..n {
                let d = compressible(&mut rng, CB as usize);
                twrite(vol, c * CB / BS, &d).await.unwrap();
                model[i][(c * CB) as usize..((c + 1) * CB) as usize].copy_from_slice(&d);
            }
        }
        // A snapshot of w: compaction moves chunks its clone reads too.
        pool.snapshot(&[("w", "ws")]).await.unwrap();
        let c = pool.clone_volume("ws", "wc").await.unwrap();
        // Free most chunks of v: its pack clusters become sparse.
        for c in 0..n {
            if c % 4 != 0 {
                tzero(&v, BlockOp::Deallocate, c * CB / BS, CB / BS)
                    .await
                    .unwrap();
                model[0][(c * CB) as usize..((c + 1) * CB) as usize].fill(0);
            }
        }
        let before = pool.usage();
        // A pass told to stop moves nothing and leaves the pool sound.
        let stop = std::sync::atomic::AtomicBool::new(true);
        let none = pool
            .compact_until(CompactOptions::default(), &stop)
            .await
            .unwrap();
        assert_eq!(none.chunks_moved, 0);
        pool.check().unwrap();
        let rep = pool
            .compact(CompactOptions {
                below_fill_pct: 50,
                rate_bytes_per_sec: 0,
            })
            .await
            .unwrap();
        let after = pool.usage();
        assert!(rep.chunks_moved > 0 && rep.clusters_freed > 0, "{rep:?}");
        assert_eq!(
            before.allocated_clusters - after.allocated_clusters,
            rep.clusters_freed
        );
        assert_eq!(before.stored_bytes, after.stored_bytes);
        assert!(tread(&v, 0, n * CB / BS).await == model[0]);
        assert!(tread(&c, 0, n * CB / BS).await == model[1]);
        pool.check_with_device().await.unwrap();
        // A second pass finds nothing sparse enough to pay.
        let again = pool.compact(CompactOptions::default()).await.unwrap();
        assert!(again.clusters_freed <= 1, "{again:?}");
        pool.close().await.unwrap();
        drop((v, c, s0, pool));
        let pool = ThinPool::open(dev(&m)).await.unwrap();
        let v = pool.volume("v").unwrap();
        assert!(tread(&v, 0, n * CB / BS).await == model[0]);
        pool.check_with_device().await.unwrap();
    });
}

#[test]
fn compression_is_refused_where_it_cannot_work() {
    block_on(async {
        for cb in [4096u64, 2 << 20] {
            let m = mem(16 << 20);
            let e = ThinPool::format_compressed(dev(&m), cb, Compression::Zstd).await;
            assert!(matches!(e, Err(ThinError::Config(_))), "{cb}: {e:?}");
            // Nothing was written: the device holds no pool.
            assert!(!ThinPool::is_pool(&(m.clone() as std::sync::Arc<dyn BlockDevice>)).await);
        }
        assert_eq!("lz4".parse::<Compression>(), Ok(Compression::Lz4));
        assert!("gzip".parse::<Compression>().is_err());
        // A pool without compression keeps format version 1.
        let m = mem(4 << 20);
        let pool = ThinPool::format(dev(&m), CB).await.unwrap();
        assert_eq!(pool.compression(), Compression::None);
        let b = tread(&*dev(&m), 0, 1).await;
        assert_eq!(u32::from_le_bytes(b[8..12].try_into().unwrap()), 1);
    });
}

#[test]
fn a_compressed_pool_grows_by_an_extent_and_its_chunks_there_survive_reopen() {
    block_on(async {
        let (base, x1) = (mem(4 << 20), mem(4 << 20));
        let pool = ThinPool::format_compressed(dev(&base), CB, Compression::Lz4)
            .await
            .unwrap();
        let v = pool.create_volume("v", 64 << 20, 4096).await.unwrap();
        let mut rng = Rng::new(13);
        // Random chunks fill the base raw, then the pool grows and the
        // compressible ones pack into the extent's clusters.
        let mut written = Vec::new();
        let mut c = 0u64;
        loop {
            let d = rand_data(&mut rng, CB as usize);
            match twrite(&v, c * CB / BS, &d).await {
                Ok(()) => written.push((c, d)),
                Err(blockdev::BlockError::NoSpace) => break,
                Err(e) => panic!("{e}"),
            }
            c += 1;
        }
        let total = pool.usage().total_clusters;
        pool.add_extent(dev(&x1)).await.unwrap();
        for _ in 0..40 {
            let d = compressible(&mut rng, CB as usize);
            twrite(&v, c * CB / BS, &d).await.unwrap();
            written.push((c, d));
            c += 1;
        }
        let packs: Vec<u64> = v
            .mapped_clusters()
            .into_iter()
            .filter(|&(vc, _)| vc >= total)
            .map(|(_, p)| p)
            .collect();
        assert!(packs.iter().all(|&p| p >= total), "{packs:?}");
        assert!(pool.usage().pack_clusters > 0);
        pool.check_with_device().await.unwrap();
        pool.close().await.unwrap();
        drop((v, pool));
        let pool = ThinPool::open_with_extents(dev(&base), &[dev(&x1)])
            .await
            .unwrap();
        let v = pool.volume("v").unwrap();
        for (c, d) in &written {
            assert!(&tread(&v, c * CB / BS, CB / BS).await == d, "chunk {c}");
        }
        pool.check_with_device().await.unwrap();
    });
}

/// A 4 MiB LZ4 pool whose volume "v" was written with whole chunks of
/// `data` from chunk 0 on until the pool was full; how many went in.
async fn full_pool(
    rng: &mut Rng,
    data: fn(&mut Rng, usize) -> Vec<u8>,
) -> (ThinPool, crate::thin::ThinVolume, u64) {
    let pool = ThinPool::format_compressed(dev(&mem(4 << 20)), CB, Compression::Lz4)
        .await
        .unwrap();
    let v = pool.create_volume("v", 64 << 20, 4096).await.unwrap();
    let mut c = 0u64;
    loop {
        match twrite(&v, c * CB / BS, &data(rng, CB as usize)).await {
            Ok(()) => c += 1,
            Err(blockdev::BlockError::NoSpace) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(c > 4, "{c} chunks");
    (pool, v, c)
}

/// On a full pool, a compressible overwrite of an uncompressed chunk of the
/// volume's own is written in place (it needs no space); it was refused
/// for want of room for the compressed chunk.
#[test]
fn a_compressible_overwrite_on_a_full_pool_is_written_in_place() {
    block_on(async {
        let mut rng = Rng::new(21);
        let (pool, v, n) = full_pool(&mut rng, rand_data).await;
        let d = compressible(&mut rng, CB as usize);
        twrite(&v, 0, &d).await.unwrap();
        assert!(tread(&v, 0, CB / BS).await == d);
        // One write of two chunks with one cluster free: the compressible
        // overwrite of its own raw chunk must not take the cluster reserved
        // for the new chunk beside it (which then found none, after the
        // first had gone in).
        tzero(&v, BlockOp::Deallocate, (n - 1) * CB / BS, CB / BS)
            .await
            .unwrap();
        let mut two = compressible(&mut rng, CB as usize);
        two.extend(rand_data(&mut rng, CB as usize));
        twrite(&v, (n - 2) * CB / BS, &two).await.unwrap();
        assert!(tread(&v, (n - 2) * CB / BS, 2 * CB / BS).await == two);
        pool.check_with_device().await.unwrap();
    });
}

/// Deallocating compressed chunks of the volume's own frees them without
/// taking a cluster each; on a full pool it was refused (No Space), just
/// when space was to be reclaimed.
#[test]
fn deallocating_compressed_chunks_on_a_full_pool_needs_no_space() {
    block_on(async {
        let mut rng = Rng::new(22);
        let (pool, v, n) = full_pool(&mut rng, compressible).await;
        tzero(&v, BlockOp::Deallocate, 0, n * CB / BS)
            .await
            .unwrap();
        assert!(tread(&v, 0, n * CB / BS).await.iter().all(|&b| b == 0));
        pool.check_with_device().await.unwrap();
    });
}

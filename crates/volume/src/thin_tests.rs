//! Thin pool tests on RAM devices: zero reads, allocation and freeing,
//! out-of-space, reopen, crash-restart loops for the metadata, concurrent
//! first writes, and a pool on a raid5 volume.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use blockdev::testutil::{
    check_bad_requests, check_concurrent, check_random_roundtrip, check_zeroing,
};
use blockdev::{AlignedBuf, BlockDevice, BlockError, BlockOp, IoRequest, MemDevice};
use futures_util::future::join_all;

use crate::fault::{CrashSwitch, FaultDevice};
use crate::layout::LayoutKind;
use crate::testutil::{Rng, block_on};
use crate::thin::{CompactOptions, Compression, ThinError, ThinPool, ThinVolume};
use crate::volume::{Volume, VolumeConfig};

/// Small clusters keep the tests quick: 4 blocks of 4 KiB per cluster.
pub(crate) const CB: u64 = 16 << 10;
pub(crate) const BS: u64 = 4096;

pub(crate) fn mem(bytes: u64) -> Arc<MemDevice> {
    Arc::new(MemDevice::new(bytes, 4096).unwrap())
}

pub(crate) fn dev(m: &Arc<MemDevice>) -> Arc<dyn BlockDevice> {
    m.clone()
}

fn buf_with(data: &[u8]) -> AlignedBuf {
    let mut b = AlignedBuf::new(data.len());
    b.set_len(data.len());
    b.copy_from_slice(data);
    b
}

pub(crate) fn rand_data(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill(&mut v);
    v
}

pub(crate) async fn twrite(d: &dyn BlockDevice, lba: u64, data: &[u8]) -> Result<(), BlockError> {
    let bs = d.geometry().block_size as usize;
    d.submit(IoRequest {
        op: BlockOp::Write { fua: false },
        lba,
        blocks: (data.len() / bs) as u32,
        buf: buf_with(data),
    })
    .await
    .result
}

pub(crate) async fn tread(d: &dyn BlockDevice, lba: u64, blocks: u64) -> Vec<u8> {
    let bs = d.geometry().block_size as usize;
    let mut b = AlignedBuf::new(blocks as usize * bs);
    b.set_len(blocks as usize * bs);
    b.fill(0xA5);
    let done = d
        .submit(IoRequest {
            op: BlockOp::Read,
            lba,
            blocks: blocks as u32,
            buf: b,
        })
        .await;
    done.result.expect("thin read");
    done.buf.to_vec()
}

pub(crate) async fn tzero(
    d: &dyn BlockDevice,
    op: BlockOp,
    lba: u64,
    blocks: u64,
) -> Result<(), BlockError> {
    d.submit(IoRequest {
        op,
        lba,
        blocks: blocks as u32,
        buf: AlignedBuf::new(0),
    })
    .await
    .result
}

pub(crate) async fn tflush(d: &dyn BlockDevice) -> Result<(), BlockError> {
    tzero(d, BlockOp::Flush, 0, 0).await
}

fn vcs(v: &ThinVolume) -> HashSet<u64> {
    v.mapped_clusters().into_iter().map(|(vc, _)| vc).collect()
}

#[test]
fn fresh_volume_reads_zeroes() {
    block_on(async {
        let pool = ThinPool::format(dev(&mem(4 << 20)), CB).await.unwrap();
        // 64 MiB on a 4 MiB pool: thin.
        let v = pool.create_volume("v0", 64 << 20, 4096).await.unwrap();
        let g = v.geometry();
        assert_eq!(g.size_bytes(), 64 << 20);
        assert!(tread(&v, 0, 64).await.iter().all(|&b| b == 0));
        assert!(tread(&v, g.num_blocks - 3, 3).await.iter().all(|&b| b == 0));
        assert!(v.deallocate_reads_zeroes());
        assert_eq!(v.allocated_bytes(), 0);
        let u = pool.usage();
        assert_eq!(u.allocated_bytes, 0);
        assert_eq!(u.free_bytes, u.capacity_bytes);
        assert_eq!(u.provisioned_bytes, 64 << 20);
        assert_eq!(u.volumes, 1);
        assert!(u.capacity_bytes + u.metadata_bytes <= 4 << 20);
        pool.check().unwrap();
    });
}

#[test]
fn new_cluster_is_zero_filled_over_old_pool_data() {
    let m = mem(4 << 20);
    block_on(async {
        // Garbage where the clusters will be.
        let junk = vec![0xEEu8; 4 << 20];
        twrite(&*m, 0, &junk).await.unwrap();
        let pool = ThinPool::format(dev(&m), CB).await.unwrap();
        let v = pool.create_volume("v", 1 << 20, 4096).await.unwrap();
        twrite(&v, 5, &[7u8; 4096]).await.unwrap();
        let got = tread(&v, 4, 4).await;
        assert!(got[..4096].iter().all(|&b| b == 0), "head of the cluster");
        assert!(got[4096..8192].iter().all(|&b| b == 7));
        assert!(got[8192..].iter().all(|&b| b == 0), "tail of the cluster");
    });
}

#[test]
fn behaves_as_a_block_device() {
    let (pool, v4, v512) = block_on(async {
        let pool = ThinPool::format(dev(&mem(8 << 20)), CB).await.unwrap();
        let v4 = pool.create_volume("four-k", 1 << 20, 4096).await.unwrap();
        let v512 = pool.create_volume("small", (1 << 20) + 512, 512).await;
        (pool, v4, v512)
    });
    // A 512-byte volume needs a pool device with 512-byte blocks.
    assert!(matches!(v512, Err(ThinError::Config(_))), "{v512:?}");
    check_bad_requests(&v4);
    check_random_roundtrip(&v4, 1, 400);
    check_zeroing(&v4, 2);
    check_concurrent(Arc::new(v4.clone()), 4, 40);
    pool.check().unwrap();

    let m512 = Arc::new(MemDevice::new(8 << 20, 512).unwrap());
    let v = block_on(async {
        let pool = ThinPool::format(m512, CB).await.unwrap();
        // Not a multiple of the cluster: the last cluster is partly used.
        pool.create_volume("odd", (1 << 20) + 3 * 512, 512)
            .await
            .unwrap()
    });
    check_bad_requests(&v);
    check_random_roundtrip(&v, 3, 400);
    check_zeroing(&v, 4);
}

#[test]
fn first_write_allocates_clusters() {
    block_on(async {
        let pool = ThinPool::format(dev(&mem(4 << 20)), CB).await.unwrap();
        let v = pool.create_volume("v", 1 << 20, 4096).await.unwrap();
        twrite(&v, 1, &[1u8; 4096]).await.unwrap();
        assert_eq!(v.allocated_bytes(), CB);
        // Blocks 7..10 straddle clusters 1 and 2.
        twrite(&v, 7, &[2u8; 3 * 4096]).await.unwrap();
        assert_eq!(v.allocated_bytes(), 3 * CB);
        assert_eq!(vcs(&v), HashSet::from([0, 1, 2]));
        // Overwrites take nothing new.
        twrite(&v, 0, &[3u8; 12 * 4096]).await.unwrap();
        assert_eq!(v.allocated_bytes(), 3 * CB);
        let u = pool.usage();
        assert_eq!(u.allocated_clusters, 3);
        assert_eq!(u.allocated_bytes, 3 * CB);
        assert_eq!(u.free_clusters, u.total_clusters - 3);
        let info = pool.volumes();
        assert_eq!(info.len(), 1);
        assert_eq!(info[0].name, "v");
        assert_eq!(info[0].allocated_bytes, 3 * CB);
        assert_eq!(info[0].uuid, v.uuid());
        assert!(tread(&v, 0, 12).await.iter().all(|&b| b == 3));
        assert!(tread(&v, 12, 4).await.iter().all(|&b| b == 0));
        // Distinct physical clusters.
        let phys: HashSet<u64> = v.mapped_clusters().iter().map(|&(_, p)| p).collect();
        assert_eq!(phys.len(), 3);
        pool.check().unwrap();
    });
}

#[test]
fn deallocate_frees_clusters_and_reads_zeroes() {
    block_on(async {
        let pool = ThinPool::format(dev(&mem(4 << 20)), CB).await.unwrap();
        // 8.5 clusters: the last one is half used.
        let v = pool
            .create_volume("v", 8 * CB + CB / 2, 4096)
            .await
            .unwrap();
        let n = v.geometry().num_blocks;
        let mut rng = Rng::new(9);
        let mut model = rand_data(&mut rng, (n * BS) as usize);
        twrite(&v, 0, &model).await.unwrap();
        assert_eq!(vcs(&v).len(), 9);
        let zero = |model: &mut Vec<u8>, lba: u64, blocks: u64| {
            model[(lba * BS) as usize..((lba + blocks) * BS) as usize].fill(0);
        };
        // Half of cluster 0: zeroed in place, still allocated.
        tzero(&v, BlockOp::Deallocate, 0, 2).await.unwrap();
        zero(&mut model, 0, 2);
        assert_eq!(vcs(&v).len(), 9);
        // Blocks 6..14: the end of cluster 1, all of 2, the start of 3.
        tzero(&v, BlockOp::Deallocate, 6, 8).await.unwrap();
        zero(&mut model, 6, 8);
        assert!(!vcs(&v).contains(&2));
        assert_eq!(vcs(&v).len(), 8);
        // Write Zeroes of whole clusters frees them too.
        tzero(&v, BlockOp::WriteZeroes, 16, 8).await.unwrap();
        zero(&mut model, 16, 8);
        assert_eq!(vcs(&v), HashSet::from([0, 1, 3, 6, 7, 8]));
        // To the end of the volume: the half-used last cluster counts as whole.
        tzero(&v, BlockOp::Deallocate, 32, n - 32).await.unwrap();
        zero(&mut model, 32, n - 32);
        assert_eq!(vcs(&v), HashSet::from([0, 1, 3, 6, 7]));
        assert_eq!(tread(&v, 0, n).await, model);
        assert_eq!(pool.usage().allocated_clusters, 5);
        pool.check().unwrap();
        // Freed clusters are reused, and come back zero-filled.
        twrite(&v, 9, &[5u8; 4096]).await.unwrap();
        model[(9 * BS) as usize..(10 * BS) as usize].fill(5);
        assert_eq!(tread(&v, 0, n).await, model);
        // Everything.
        tzero(&v, BlockOp::Deallocate, 0, n).await.unwrap();
        assert_eq!(pool.usage().allocated_clusters, 0);
        assert!(tread(&v, 0, n).await.iter().all(|&b| b == 0));
        pool.check().unwrap();
    });
}

#[test]
fn out_of_space_fails_with_no_space_and_keeps_data() {
    block_on(async {
        let pool = ThinPool::format(dev(&mem(1 << 20)), CB).await.unwrap();
        let total = pool.usage().total_clusters;
        assert!(total > 8, "{:?}", pool.usage());
        let a = pool.create_volume("a", 4 << 20, 4096).await.unwrap();
        let b = pool.create_volume("b", 4 << 20, 4096).await.unwrap();
        let per = CB / BS;
        let mut rng = Rng::new(5);
        // Fill the pool from `a`, one cluster at a time; the first
        // failure must come exactly when it is full.
        let mut stored: Vec<Vec<u8>> = Vec::new();
        loop {
            let data = rand_data(&mut rng, CB as usize);
            match twrite(&a, stored.len() as u64 * per, &data).await {
                Ok(()) => stored.push(data),
                Err(BlockError::NoSpace) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(stored.len() as u64, total);
        let u = pool.usage();
        assert_eq!((u.free_clusters, u.free_bytes), (0, 0));
        // Writes needing a cluster fail, whole: this one spans an allocated
        // cluster and a new one, and must not touch the allocated one.
        let r = twrite(&a, (total - 1) * per + 1, &vec![9u8; (2 * CB) as usize]).await;
        assert!(matches!(r, Err(BlockError::NoSpace)), "{r:?}");
        let r = twrite(&b, 0, &[1u8; 4096]).await;
        assert!(matches!(r, Err(BlockError::NoSpace)), "{r:?}");
        // Allocated clusters can still be overwritten.
        let data = rand_data(&mut rng, CB as usize);
        twrite(&a, 0, &data).await.unwrap();
        stored[0] = data;
        let check = |stored: &Vec<Vec<u8>>| {
            let all: Vec<u8> = stored.concat();
            let a = a.clone();
            async move {
                let got = tread(&a, 0, all.len() as u64 / BS).await;
                assert!(got == all, "data of a changed");
            }
        };
        check(&stored).await;
        pool.check().unwrap();
        // Free one cluster: one more fits.
        tzero(&a, BlockOp::Deallocate, 3 * per, per).await.unwrap();
        stored[3].fill(0);
        twrite(&b, 0, &[1u8; 4096]).await.unwrap();
        assert!(matches!(
            twrite(&b, per, &[1u8; 4096]).await,
            Err(BlockError::NoSpace)
        ));
        check(&stored).await;
        // Delete `a`: `b` gets the whole pool.
        pool.delete_volume("a").await.unwrap();
        for i in 1..total {
            twrite(&b, i * per, &[2u8; 4096]).await.unwrap();
        }
        assert_eq!(pool.usage().allocated_clusters, total);
        assert!(tread(&b, 0, 1).await.iter().all(|&x| x == 1));
        pool.check().unwrap();
    });
}

#[test]
fn reopen_keeps_data_and_usage() {
    let m = mem(4 << 20);
    block_on(async {
        let pool = ThinPool::format(dev(&m), CB).await.unwrap();
        let a = pool.create_volume("a", 2 << 20, 4096).await.unwrap();
        let b = pool.create_volume("b", 1 << 20, 4096).await.unwrap();
        let mut rng = Rng::new(3);
        let mut ma = vec![0u8; 2 << 20];
        let mut mb = vec![0u8; 1 << 20];
        // Many small commits: the journal (16 blocks here) fills and is
        // checkpointed several times.
        for i in 0..100u64 {
            let (v, m) = if i % 3 == 0 {
                (&b, &mut mb)
            } else {
                (&a, &mut ma)
            };
            let n = v.geometry().num_blocks;
            let lba = rng.below(n - 2);
            let data = rand_data(&mut rng, 2 * BS as usize);
            twrite(v, lba, &data).await.unwrap();
            m[(lba * BS) as usize..((lba + 2) * BS) as usize].copy_from_slice(&data);
            if i % 10 == 9 {
                let lba = rng.below(n - 8);
                tzero(v, BlockOp::Deallocate, lba, 8).await.unwrap();
                m[(lba * BS) as usize..((lba + 8) * BS) as usize].fill(0);
            }
        }
        assert!(pool.stats().checkpoints > 3, "{:?}", pool.stats());
        let usage = pool.usage();
        let vols = pool.volumes();
        let (mapped_a, mapped_b) = (a.mapped_clusters(), b.mapped_clusters());
        let verify = |pool: ThinPool| {
            let (ma, mb) = (ma.clone(), mb.clone());
            let (usage, vols) = (usage, vols.clone());
            let (mapped_a, mapped_b) = (mapped_a.clone(), mapped_b.clone());
            async move {
                pool.check().unwrap();
                assert_eq!(pool.usage(), usage);
                assert_eq!(pool.volumes(), vols);
                let a = pool.volume("a").unwrap();
                let b = pool.volume("b").unwrap();
                assert_eq!(a.mapped_clusters(), mapped_a);
                assert_eq!(b.mapped_clusters(), mapped_b);
                assert!(tread(&a, 0, 512).await == ma);
                assert!(tread(&b, 0, 256).await == mb);
            }
        };
        // Without close: the journal replays.
        drop((a, b, pool));
        let pool = ThinPool::open(dev(&m)).await.unwrap();
        verify(pool.clone()).await;
        // Clean close, then open again.
        pool.close().await.unwrap();
        drop(pool);
        verify(ThinPool::open(dev(&m)).await.unwrap()).await;
    });
}

#[test]
fn torn_newest_checkpoint_falls_back_to_the_older_copy_and_journal() {
    let m = mem(4 << 20);
    block_on(async {
        let pool = ThinPool::format(dev(&m), CB).await.unwrap();
        let v = pool.create_volume("v", 1 << 20, 4096).await.unwrap();
        // A few commits (fewer than the journal holds) after open's checkpoint.
        drop((v, pool));
        let pool = ThinPool::open(dev(&m)).await.unwrap();
        let v = pool.volume("v").unwrap();
        let mut rng = Rng::new(4);
        let data = rand_data(&mut rng, 20 * BS as usize);
        for i in 0..5 {
            let at = i * 4 * BS as usize;
            twrite(&v, i as u64 * 4, &data[at..at + 4 * BS as usize])
                .await
                .unwrap();
        }
        let stats = pool.stats();
        assert!(
            stats.journal_blocks >= 5 && stats.checkpoints == 1,
            "{stats:?}"
        );
        // close writes the next checkpoint; tear its body.
        pool.close().await.unwrap();
        drop((v, pool));
        // Superblock, then copy 0 and copy 1 of equal size; find the newest.
        let b0 = tread(&*m, 0, 1).await;
        let cp_bytes = u64::from_le_bytes(b0[48..56].try_into().unwrap());
        let copy_at = [
            u64::from_le_bytes(b0[56..64].try_into().unwrap()),
            u64::from_le_bytes(b0[64..72].try_into().unwrap()),
        ];
        let epoch = |h: &[u8]| u64::from_le_bytes(h[24..32].try_into().unwrap());
        let h0 = tread(&*m, copy_at[0] / BS, 1).await;
        let h1 = tread(&*m, copy_at[1] / BS, 1).await;
        let newest = if epoch(&h0) > epoch(&h1) { 0 } else { 1 };
        let victim = (copy_at[newest] + cp_bytes) / BS - 1;
        let mut blk = tread(&*m, victim, 1).await;
        blk[100] ^= 0xFF;
        twrite(&*m, victim, &blk).await.unwrap();
        let pool = ThinPool::open(dev(&m)).await.unwrap();
        pool.check().unwrap();
        let v = pool.volume("v").unwrap();
        assert_eq!(tread(&v, 0, 20).await, data);
        assert_eq!(pool.usage().allocated_clusters, 5);
    });
}

#[test]
fn open_refuses_a_device_without_a_pool() {
    block_on(async {
        let d = dev(&mem(4 << 20));
        assert!(!ThinPool::is_pool(&d).await);
        let e = ThinPool::open(d.clone()).await.unwrap_err();
        assert!(matches!(e, ThinError::NotAPool { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("no thin pool superblock") && msg.contains("format"),
            "{msg}"
        );
        // A raid volume's member is not a pool either.
        let tiny = dev(&mem(4096));
        assert!(!ThinPool::is_pool(&tiny).await);
        let e = ThinPool::format(tiny, CB).await.unwrap_err();
        assert!(e.to_string().contains("too few"), "{e}");
        let e = ThinPool::format(d.clone(), 3000).await.unwrap_err();
        assert!(e.to_string().contains("power of two"), "{e}");
        ThinPool::format(d.clone(), CB).await.unwrap();
        assert!(ThinPool::is_pool(&d).await);
        // A damaged superblock is reported as such, not as "no pool".
        let mut b0 = tread(&*d, 0, 1).await;
        b0[40] ^= 1;
        twrite(&*d, 0, &b0).await.unwrap();
        assert!(!ThinPool::is_pool(&d).await);
        let e = ThinPool::open(d).await.unwrap_err();
        assert!(matches!(e, ThinError::Corrupt(_)), "{e}");
    });
}

#[test]
fn a_huge_name_is_not_echoed_whole() {
    let m = mem(4 << 20);
    block_on(async {
        let pool = ThinPool::format(dev(&m), CB).await.unwrap();
        let huge = "n".repeat(1_500_000);
        let e = pool.create_volume(&huge, 1 << 20, 4096).await.unwrap_err();
        let msg = e.to_string();
        assert!(msg.len() < 300, "{} bytes", msg.len());
        assert!(
            msg.contains(&format!("\"{}\"… (1500000 bytes)", "n".repeat(64))),
            "{msg}"
        );
        let e = pool.delete_volume(&huge).await.unwrap_err();
        assert!(e.to_string().len() < 300, "{} bytes", e.to_string().len());
    });
}

#[test]
fn names_create_and_delete() {
    let m = mem(4 << 20);
    block_on(async {
        let pool = ThinPool::format(dev(&m), CB).await.unwrap();
        let a = pool.create_volume("a", 1 << 20, 4096).await.unwrap();
        let e = pool.create_volume("a", 1 << 20, 4096).await.unwrap_err();
        assert!(matches!(e, ThinError::NameTaken(ref n) if n == "a"), "{e}");
        for bad in ["", "has space", "x/y", &"n".repeat(65)] {
            let e = pool.create_volume(bad, 1 << 20, 4096).await.unwrap_err();
            assert!(matches!(e, ThinError::Config(_)), "{bad:?}: {e}");
        }
        let e = pool.create_volume("b", 1000, 4096).await.unwrap_err();
        assert!(e.to_string().contains("multiple"), "{e}");
        let e = pool.delete_volume("nope").await.unwrap_err();
        assert!(matches!(e, ThinError::NoSuchVolume(_)), "{e}");
        twrite(&a, 0, &vec![4u8; 8 * BS as usize]).await.unwrap();
        assert_eq!(pool.usage().allocated_clusters, 2);
        pool.delete_volume("a").await.unwrap();
        assert_eq!(pool.usage().allocated_clusters, 0);
        assert!(pool.volume("a").is_none());
        assert!(pool.volumes().is_empty());
        // Old handles fail instead of touching clusters now free.
        assert!(twrite(&a, 0, &[1u8; 4096]).await.is_err());
        assert!(pool.delete_volume("a").await.is_err());
        // The name is free again; the reused clusters read as zeroes.
        let a2 = pool.create_volume("a", 1 << 20, 4096).await.unwrap();
        assert_ne!(a2.uuid(), a.uuid());
        twrite(&a2, 1, &[6u8; 4096]).await.unwrap();
        let got = tread(&a2, 0, 8).await;
        assert!(got[..4096].iter().all(|&x| x == 0));
        assert!(got[8192..].iter().all(|&x| x == 0));
        pool.check().unwrap();
        drop((a, a2, pool));
        let pool = ThinPool::open(dev(&m)).await.unwrap();
        assert_eq!(pool.volumes().len(), 1);
        assert_eq!(pool.usage().allocated_clusters, 1);
        pool.check().unwrap();
    });
}

#[test]
fn concurrent_first_writes_to_one_cluster_allocate_it_once() {
    let m = mem(4 << 20);
    let f = FaultDevice::new(dev(&m));
    f.set_yields(4, 77);
    let v = block_on(async {
        let pool = ThinPool::format(f.clone(), CB).await.unwrap();
        let v = pool.create_volume("v", 1 << 20, 4096).await.unwrap();
        for c in 0..16u64 {
            // Every block of cluster c at once.
            let writes = (0..4u64).map(|i| {
                let v = v.clone();
                async move {
                    let lba = c * 4 + i;
                    twrite(&v, lba, &[(lba as u8) ^ 0x5A; 4096]).await
                }
            });
            for r in join_all(writes).await {
                r.unwrap();
            }
            assert_eq!(pool.usage().allocated_clusters, c + 1, "cluster {c}");
        }
        for lba in 0..64u64 {
            let got = tread(&v, lba, 1).await;
            assert!(got.iter().all(|&x| x == (lba as u8) ^ 0x5A), "block {lba}");
        }
        pool.check().unwrap();
        // Group commit: concurrent allocations shared commits.
        let s = pool.stats();
        assert_eq!(s.records, 16);
        v
    });
    // And from many threads, each with its own blocks in the same clusters.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .unwrap();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for t in 0..4u64 {
            let v = v.clone();
            tasks.push(tokio::spawn(async move {
                for c in 16..48u64 {
                    twrite(&v, c * 4 + t, &[(c ^ t) as u8; 4096]).await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        for c in 16..48u64 {
            let got = tread(&v, c * 4, 4).await;
            for t in 0..4 {
                let blk = &got[(t * BS) as usize..((t + 1) * BS) as usize];
                assert!(
                    blk.iter().all(|&x| x == (c ^ t) as u8),
                    "cluster {c} block {t}"
                );
            }
        }
        assert_eq!(v.allocated_bytes(), 48 * CB);
    });
}

#[test]
fn many_writes_in_flight_share_commits() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .unwrap();
    rt.block_on(async {
        let m = mem(16 << 20);
        let f = FaultDevice::new(dev(&m));
        f.set_yields(2, 5);
        let pool = ThinPool::format(f, CB).await.unwrap();
        let vols = [
            pool.create_volume("x", 8 << 20, 4096).await.unwrap(),
            pool.create_volume("y", 8 << 20, 4096).await.unwrap(),
        ];
        // 128 writers at once; writer t owns the blocks with lba % 64 == t / 2
        // of its volume, so neighbours share clusters but never blocks.
        let mut tasks = Vec::new();
        for t in 0..128u64 {
            let v = vols[(t % 2) as usize].clone();
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng::new(t);
                let mut mine = HashMap::new();
                for _ in 0..16 {
                    let lba = rng.below(32) * 64 + t / 2;
                    let fill = rng.next_u64() as u8;
                    twrite(&v, lba, &[fill; 4096]).await.unwrap();
                    mine.insert(lba, fill);
                }
                (t % 2, mine)
            }));
        }
        for task in tasks {
            let (vi, mine) = task.await.unwrap();
            for (lba, fill) in mine {
                let got = tread(&vols[vi as usize], lba, 1).await;
                assert!(got.iter().all(|&x| x == fill), "volume {vi} block {lba}");
            }
        }
        pool.check().unwrap();
        let s = pool.stats();
        let allocated = pool.usage().allocated_clusters;
        assert_eq!(s.records, allocated);
        assert!(s.commits <= s.records, "{s:?}");
    });
}

// ---------------------------------------------------------------- crashes

/// What one thin volume should hold, with the alternatives a crash allows.
struct VolModel {
    data: Vec<u8>,
    /// Virtual clusters that must be allocated (acknowledged writes).
    must: HashSet<u64>,
    /// Clusters an unacknowledged operation touched: either way is right.
    maybe_vc: HashSet<u64>,
    /// Blocks whose content may also be this (unacknowledged write or zeroes).
    maybe: HashMap<u64, Vec<u8>>,
}

enum Op {
    Write {
        vol: usize,
        lba: u64,
        data: Vec<u8>,
    },
    Zero {
        vol: usize,
        lba: u64,
        blocks: u64,
        dealloc: bool,
    },
}

impl Op {
    fn range(&self) -> (usize, u64, u64) {
        match self {
            Op::Write { vol, lba, data } => (*vol, *lba, data.len() as u64 / BS),
            Op::Zero {
                vol, lba, blocks, ..
            } => (*vol, *lba, *blocks),
        }
    }
}

/// Clusters a Deallocate/Write Zeroes of `lba + blocks` frees (covered whole).
fn freed_clusters(lba: u64, blocks: u64, size_blocks: u64) -> std::ops::Range<u64> {
    let per = CB / BS;
    let first = lba.div_ceil(per);
    let end = if lba + blocks == size_blocks {
        size_blocks.div_ceil(per)
    } else {
        (lba + blocks) / per
    };
    first..end.max(first)
}

fn random_op(rng: &mut Rng, sizes: &[u64], compressible: bool) -> Op {
    let vol = rng.below(sizes.len() as u64) as usize;
    let n = sizes[vol];
    let per = CB / BS;
    match rng.below(8) {
        0 | 1 => {
            // Cluster-aligned, or anything.
            let (lba, blocks) = if rng.below(2) == 0 {
                let c = rng.below(n / per);
                (c * per, per * (1 + rng.below(3)).min(n / per - c))
            } else {
                let lba = rng.below(n);
                (lba, 1 + rng.below((3 * per).min(n - lba)))
            };
            Op::Zero {
                vol,
                lba,
                blocks,
                dealloc: rng.below(2) == 0,
            }
        }
        _ => {
            let lba = rng.below(n);
            let blocks = 1 + rng.below((2 * per + 2).min(n - lba));
            let len = (blocks * BS) as usize;
            let data = if compressible && rng.below(2) == 0 {
                crate::thin_pack_tests::compressible(rng, len)
            } else {
                rand_data(rng, len)
            };
            Op::Write { vol, lba, data }
        }
    }
}

/// Power cuts at random points of random writes and deallocations on two
/// thin volumes (over-provisioned, so some writes hit NoSpace), then reopen:
/// every acknowledged write reads back, unacknowledged ones are old or new
/// per block, every acknowledged allocation is mapped, nothing else is (no
/// leak), and the metadata cross-checks (no cluster in two maps, counts agree).
///
/// In a compressed pool half the writes are compressible (rewrites of chunks
/// in new places, partial ones read-modify-write) and compaction runs
/// beside some batches, so cuts land in moves too.
fn crash_loop(iterations: u64, seed: u64, compression: Compression) {
    let packed = compression != Compression::None;
    block_on(async {
        // About 100 clusters for 192 of volumes: writes run out of space.
        let m = mem(2 << 20);
        let names = ["a", "b"];
        let sizes_bytes = [2 << 20, (1 << 20) + 3 * BS];
        {
            let pool = ThinPool::format_compressed(dev(&m), CB, compression)
                .await
                .unwrap();
            for (n, s) in names.iter().zip(sizes_bytes) {
                pool.create_volume(n, s, 4096).await.unwrap();
            }
        }
        let sizes: Vec<u64> = sizes_bytes.iter().map(|s| s / BS).collect();
        let mut models: Vec<VolModel> = sizes_bytes
            .iter()
            .map(|&s| VolModel {
                data: vec![0; s as usize],
                must: HashSet::new(),
                maybe_vc: HashSet::new(),
                maybe: HashMap::new(),
            })
            .collect();
        let mut rng = Rng::new(seed);
        let bs = BS as usize;
        let mut nospace = 0;
        let mut max_alloc = 0;
        let (mut packs, mut moved) = (0, 0);
        for it in 0..iterations {
            let crash = CrashSwitch::new();
            let f = FaultDevice::with_crash(dev(&m), crash.clone());
            f.set_yields(3, seed ^ (it << 8));
            let pool = ThinPool::open(f.clone()).await.unwrap();
            pool.check()
                .unwrap_or_else(|e| panic!("iteration {it}: {e}"));
            let vols: Vec<ThinVolume> = names.iter().map(|n| pool.volume(n).unwrap()).collect();
            let mut total_mapped = 0;
            for (vi, (v, md)) in vols.iter().zip(models.iter_mut()).enumerate() {
                let all = tread(v, 0, sizes[vi]).await;
                for b in 0..sizes[vi] as usize {
                    let got = &all[b * bs..(b + 1) * bs];
                    if got == &md.data[b * bs..(b + 1) * bs] {
                        continue;
                    }
                    match md.maybe.get(&(b as u64)) {
                        Some(alt) if alt[..] == *got => {
                            md.data[b * bs..(b + 1) * bs].copy_from_slice(got)
                        }
                        _ => panic!(
                            "iteration {it}: volume {vi} block {b} lost an acknowledged write"
                        ),
                    }
                }
                let mapped = vcs(v);
                for vc in &md.must {
                    assert!(
                        mapped.contains(vc) || md.maybe_vc.contains(vc),
                        "iteration {it}: volume {vi} cluster {vc} was acknowledged but is unmapped"
                    );
                }
                for vc in &mapped {
                    assert!(
                        md.must.contains(vc) || md.maybe_vc.contains(vc),
                        "iteration {it}: volume {vi} cluster {vc} is mapped but no acknowledged \
                         write allocated it (leak)"
                    );
                }
                total_mapped += mapped.len() as u64;
                md.must = mapped;
                md.maybe_vc.clear();
                md.maybe.clear();
            }
            let u = pool.usage();
            assert_eq!(u.logical_bytes / CB, total_mapped);
            if !packed {
                assert_eq!(u.allocated_clusters, total_mapped);
            }
            max_alloc = max_alloc.max(total_mapped);
            packs = packs.max(u.pack_clusters);

            crash.arm(1 + rng.below(60));
            while !crash.crashed() {
                let mut batch: Vec<Op> = Vec::new();
                for _ in 0..1 + rng.below(6) {
                    let op = random_op(&mut rng, &sizes, packed);
                    let (v, l, n) = op.range();
                    let overlaps = batch.iter().any(|o| {
                        let (ov, ol, on) = o.range();
                        ov == v && l < ol + on && ol < l + n
                    });
                    if !overlaps {
                        batch.push(op);
                    }
                }
                let flushes = rng.below(3);
                let run = join_all(batch.iter().map(|op| {
                    let vols = &vols;
                    let crash = &crash;
                    async move {
                        let r = match op {
                            Op::Write { vol, lba, data } => twrite(&vols[*vol], *lba, data).await,
                            Op::Zero {
                                vol,
                                lba,
                                blocks,
                                dealloc,
                            } => {
                                let o = if *dealloc {
                                    BlockOp::Deallocate
                                } else {
                                    BlockOp::WriteZeroes
                                };
                                tzero(&vols[*vol], o, *lba, *blocks).await
                            }
                        };
                        (r, crash.crashed())
                    }
                }));
                let compact = packed && rng.below(4) == 0;
                let fl = async {
                    for i in 0..flushes {
                        let _ = tflush(&vols[i as usize % 2]).await;
                    }
                    if compact {
                        let o = CompactOptions {
                            below_fill_pct: 75,
                            rate_bytes_per_sec: 0,
                        };
                        if let Ok(r) = pool.compact(o).await {
                            moved += r.chunks_moved;
                        }
                    }
                };
                let (results, ()) = futures_util::future::join(run, fl).await;
                for (op, (r, crashed)) in batch.iter().zip(results) {
                    let (vi, lba, blocks) = op.range();
                    let md = &mut models[vi];
                    let s = (lba * BS) as usize;
                    let e = ((lba + blocks) * BS) as usize;
                    let acked = r.is_ok() && !crashed;
                    if !acked && !crashed {
                        // Before the crash, the only failure is NoSpace, and
                        // it changes nothing.
                        assert!(matches!(r, Err(BlockError::NoSpace)), "{r:?}");
                        nospace += 1;
                        continue;
                    }
                    let per = CB / BS;
                    let touched = lba / per..(lba + blocks).div_ceil(per);
                    match op {
                        Op::Write { data, .. } if acked => {
                            md.data[s..e].copy_from_slice(data);
                            md.must.extend(touched);
                        }
                        Op::Write { data, .. } => {
                            for (i, blk) in data.chunks(bs).enumerate() {
                                md.maybe.insert(lba + i as u64, blk.to_vec());
                            }
                            md.maybe_vc.extend(touched);
                        }
                        Op::Zero { .. } if acked => {
                            md.data[s..e].fill(0);
                            for vc in freed_clusters(lba, blocks, sizes[vi]) {
                                md.must.remove(&vc);
                            }
                        }
                        Op::Zero { .. } => {
                            for b in lba..lba + blocks {
                                md.maybe.insert(b, vec![0; bs]);
                            }
                            md.maybe_vc.extend(touched);
                        }
                    }
                }
            }
            drop(vols);
            drop(pool);
        }
        // The loop must have exercised both a full pool and frees.
        assert!(nospace > 0, "no write ran out of space");
        assert!(max_alloc > 0);
        if packed {
            assert!(
                packs > 0 && moved > 0,
                "packs {packs}, compaction moved {moved}"
            );
        }
    });
}

#[test]
fn crash_restart_loop() {
    crash_loop(300, 1, Compression::None);
}

#[test]
fn crash_restart_loop_other_seed() {
    crash_loop(150, 2, Compression::None);
}

#[test]
fn crash_restart_loop_compressed_lz4() {
    crash_loop(300, 3, Compression::Lz4);
}

#[test]
fn crash_restart_loop_compressed_zstd() {
    crash_loop(150, 4, Compression::Zstd);
}

/// Power cuts during create, write, delete: after reopen the pool holds
/// exactly the volumes of the operations acknowledged before the cut (the one
/// in flight either way), and the metadata cross-checks.
#[test]
fn crash_during_create_and_delete() {
    for k in 1..60u64 {
        block_on(async {
            let m = mem(2 << 20);
            {
                let pool = ThinPool::format(dev(&m), CB).await.unwrap();
                let keep = pool.create_volume("keep", 1 << 20, 4096).await.unwrap();
                twrite(&keep, 0, &[1u8; 4096 * 6]).await.unwrap();
            }
            let crash = CrashSwitch::new();
            let f = FaultDevice::with_crash(dev(&m), crash.clone());
            let pool = ThinPool::open(f).await.unwrap();
            crash.arm(k);
            // (step, acknowledged)
            let mut acked = Vec::new();
            let r = pool.create_volume("x", 1 << 20, 4096).await;
            acked.push(r.is_ok() && !crash.crashed());
            let x = pool.volume("x");
            let r = match &x {
                Some(x) => twrite(x, 2, &[2u8; 4096 * 5]).await,
                None => Err(BlockError::NoSpace),
            };
            acked.push(r.is_ok() && !crash.crashed());
            let r = pool.delete_volume("keep").await;
            acked.push(r.is_ok() && !crash.crashed());
            let r = pool.create_volume("y", 1 << 20, 4096).await;
            acked.push(r.is_ok() && !crash.crashed());
            drop((x, pool));
            // Steps run in order: those before the first unacknowledged one
            // are durable, that one may be, the rest are not.
            let done = acked.iter().take_while(|&&a| a).count();
            let pool = ThinPool::open(dev(&m)).await.unwrap();
            pool.check().unwrap_or_else(|e| panic!("k {k}: {e}"));
            let has = |n: &str| pool.volume(n).is_some();
            let may = |step: usize| step <= done; // may be done
            let must = |step: usize| step < done;
            assert!(!must(0) || has("x"), "k {k}: x lost");
            assert!(may(0) || !has("x"), "k {k}: x appeared");
            assert!(!must(2) || !has("keep"), "k {k}: keep came back");
            assert!(may(2) || has("keep"), "k {k}: keep vanished");
            assert!(!must(3) || has("y"), "k {k}: y lost");
            assert!(may(3) || !has("y"), "k {k}: y appeared");
            if let Some(keep) = pool.volume("keep") {
                let got = tread(&keep, 0, 8).await;
                assert!(got[..6 * 4096].iter().all(|&b| b == 1), "k {k}");
                assert!(got[6 * 4096..].iter().all(|&b| b == 0), "k {k}");
            }
            if let Some(x) = pool.volume("x") {
                let got = tread(&x, 0, 8).await;
                let (head, mid, tail) = (&got[..8192], &got[8192..7 * 4096], &got[7 * 4096..]);
                assert!(head.iter().chain(tail).all(|&b| b == 0), "k {k}");
                if must(1) {
                    assert!(mid.iter().all(|&b| b == 2), "k {k}: x's write lost");
                }
            }
            let mapped: u64 = pool.volumes().iter().map(|i| i.allocated_bytes / CB).sum();
            assert_eq!(pool.usage().allocated_clusters, mapped, "k {k}");
        });
    }
}

// ---------------------------------------------------------------- raid

#[test]
fn thin_volume_on_a_raid5_volume() {
    const STRIP: u32 = 8 << 10;
    const META: u64 = 16 << 10;
    let size = META + 1024 * u64::from(STRIP);
    let mems: Vec<Arc<dyn BlockDevice>> = (0..4)
        .map(|_| Arc::new(MemDevice::new(size, 4096).unwrap()) as Arc<dyn BlockDevice>)
        .collect();
    let cfg = VolumeConfig {
        strip_bytes: STRIP,
        meta_bytes: META,
        assume_clean: true,
        ..VolumeConfig::new(LayoutKind::Raid5)
    };
    let (raid, pool, thin) = block_on(async {
        let raid = Volume::create(mems.clone(), cfg).await.unwrap();
        let pool = ThinPool::format(Arc::new(raid.clone()), 64 << 10)
            .await
            .unwrap();
        let thin = pool.create_volume("t", 16 << 20, 4096).await.unwrap();
        (raid, pool, thin)
    });
    check_random_roundtrip(&thin, 11, 300);
    check_zeroing(&thin, 12);
    let snapshot = block_on(async {
        let n = thin.geometry().num_blocks;
        let mut rng = Rng::new(13);
        let data = rand_data(&mut rng, 40 * BS as usize);
        twrite(&thin, n / 2, &data).await.unwrap();
        let all = tread(&thin, 0, n).await;
        assert!(raid.scrub(false).await.inconsistent_count == 0);
        pool.check().unwrap();
        pool.close().await.unwrap();
        raid.close().await.unwrap();
        (all, pool.usage())
    });
    drop((thin, pool, raid));
    block_on(async {
        let raid = Volume::assemble(mems).await.unwrap();
        let pool = ThinPool::open(Arc::new(raid)).await.unwrap();
        assert_eq!(pool.usage(), snapshot.1);
        let thin = pool.volume("t").unwrap();
        let n = thin.geometry().num_blocks;
        assert!(tread(&thin, 0, n).await == snapshot.0);
        pool.check().unwrap();
    });
}

/// A thin volume grows at once, and durably: handles see the new size, the
/// new end is written and read back, the old data stays, a reopened pool
/// has the new size; a smaller size is refused and changes nothing; the
/// map reaches the largest volume (its far end is mapped and read back).
#[test]
fn a_thin_volume_grows_live_and_durably() {
    let m = mem(4 << 20);
    block_on(async {
        let pool = ThinPool::format(dev(&m), CB).await.unwrap();
        let a = pool.create_volume("a", 1 << 20, 4096).await.unwrap();
        let before = vec![0xA5u8; 2 * BS as usize];
        twrite(&a, 10, &before).await.unwrap();
        let old_end = a.geometry().num_blocks;
        // Beyond the end: refused before it grows.
        assert!(twrite(&a, old_end, &before).await.is_err());
        assert!(matches!(
            pool.grow_volume("a", 512 << 10).await,
            Err(ThinError::Shrink { .. })
        ));
        assert!(matches!(
            pool.grow_volume("nope", 2 << 20).await,
            Err(ThinError::NoSuchVolume(_))
        ));
        assert!(
            pool.grow_volume("a", (2 << 20) + 1).await.is_err(),
            "not whole blocks"
        );
        assert_eq!(
            a.geometry().num_blocks,
            old_end,
            "a refusal changes nothing"
        );
        pool.grow_volume("a", 3 << 20).await.unwrap();
        pool.grow_volume("a", 3 << 20).await.unwrap(); // the same size: nothing
        assert_eq!(a.geometry().num_blocks, 3 * old_end);
        let after = vec![0x5Au8; 2 * BS as usize];
        let last = a.geometry().num_blocks - 2;
        twrite(&a, last, &after).await.unwrap();
        assert_eq!(tread(&a, last, 2).await, after);
        assert_eq!(tread(&a, 10, 2).await, before);
        assert_eq!(pool.usage().provisioned_bytes, 3 << 20);
        // The largest volume: its map reaches the far end.
        let max = crate::thin::MAX_VOLUME_CLUSTERS * CB;
        pool.grow_volume("a", max).await.unwrap();
        let end = a.geometry().num_blocks;
        twrite(&a, end - 2, &after).await.unwrap();
        assert_eq!(tread(&a, end - 2, 2).await, after);
        assert!(pool.grow_volume("a", max + CB).await.is_err());
        pool.check().unwrap();
        drop((a, pool));
        // Reopened (journal replay, no clean close): the grown size holds.
        let pool = ThinPool::open(dev(&m)).await.unwrap();
        pool.check().unwrap();
        let a = pool.volume("a").unwrap();
        assert_eq!(a.geometry().num_blocks, end);
        assert_eq!(tread(&a, 10, 2).await, before);
        assert_eq!(tread(&a, last, 2).await, after);
        assert_eq!(tread(&a, end - 2, 2).await, after);
    });
}

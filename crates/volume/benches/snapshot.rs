//! Snapshot cost, in process on RAM: 4 KiB random writes at QD 32 on a thin
//! volume with no snapshot, then with 1 and with 8 snapshots (a chain: the
//! data sits in the oldest, so a first write looks through all of them):
//! the first write to each cluster after the snapshot (copy-on-write of one
//! cluster, a map record) and later writes (the cluster is the volume's own
//! again), as ratios to no snapshot; also 4 KiB random reads through the
//! chain before any write.
//!
//! `cargo bench -p volume --bench snapshot`. `SNAP_BENCH_MIB` sets the
//! volume's size (default 1 GiB: 1,024 first writes at 1 MiB clusters), `SNAP_BENCH_OPS` the I/Os of the
//! random-write runs (default 100000). One thread drives everything, so the
//! numbers are CPU and memory-copy cost per I/O, not device speed; RAM
//! completes after 0 to 2 executor yields, as a drive completes later.

mod common;

use blockdev::BlockOp;
use blockdev::testutil::{Rng, block_on};
use common::{BS, QD, async_mem, env, fill, random_lbas, run};
use volume::ThinPool;

/// One LBA in each cluster, clusters in random order: every write is a first.
fn one_per_cluster(clusters: u64, per: u64, seed: u64) -> Vec<u64> {
    let mut rng = Rng::new(seed);
    let mut v: Vec<u64> = (0..clusters).map(|c| c * per + rng.below(per)).collect();
    for i in (1..v.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
    v
}

fn main() {
    let size = env("SNAP_BENCH_MIB", 1024) << 20;
    let ops = env("SNAP_BENCH_OPS", 100_000);
    let blocks = size / BS;
    let w = BlockOp::Write { fua: false };
    println!(
        "4 KiB, QD {QD}, thin volume of {} MiB, written whole first, one thread",
        size >> 20
    );
    println!(
        "{:>8} {:>6} {:>12} {:>12} {:>8} {:>12} {:>8} {:>12} {:>8}",
        "cluster",
        "snaps",
        "rand write/s",
        "first/s",
        "ratio",
        "later/s",
        "ratio",
        "read/s",
        "ratio"
    );
    block_on(async {
        for cluster in [1u64 << 20, 64 << 10] {
            let per = cluster / BS;
            let clusters = size / cluster;
            let mut base = (0.0, 0.0);
            for snaps in [0usize, 1, 8] {
                // Room for the origin and one copy of every cluster, plus metadata.
                let dev = async_mem(2 * size + (64 << 20));
                // Touch every page of the RAM drive first, as a drive's cells
                // exist: else first writes measure the kernel zeroing pages.
                fill(&*dev, dev.geometry().num_blocks).await;
                let pool = ThinPool::format(dev, cluster).await.unwrap();
                let vol = pool.create_volume("v", size, 4096).await.unwrap();
                fill(&vol, blocks).await;
                for i in 0..snaps {
                    let name = format!("s{i}");
                    pool.snapshot(&[("v", name.as_str())]).await.unwrap();
                }
                let reads = random_lbas(blocks, ops, 5);
                let read = run(&vol, BlockOp::Read, &reads).await;
                let firsts = one_per_cluster(clusters, per, 3);
                let first = if snaps == 0 {
                    f64::NAN
                } else {
                    run(&vol, w, &firsts).await
                };
                let lbas = random_lbas(blocks, ops, 4);
                let later = run(&vol, w, &lbas).await;
                pool.check().unwrap();
                if snaps == 0 {
                    base = (later, read);
                }
                println!(
                    "{:>6}Ki {snaps:>6} {:>12.0} {first:>12.0} {:>8.2} {later:>12.0} {:>8.2} {read:>12.0} {:>8.2}",
                    cluster >> 10,
                    base.0,
                    first / base.0,
                    later / base.0,
                    read / base.1
                );
            }
        }
    });
}

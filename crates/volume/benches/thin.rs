//! Thin provisioning cost, in process on RAM: 4 KiB random writes at QD 32
//! on the pool device directly, on a fresh thin volume (most writes allocate
//! a cluster: zero-fill plus a group-committed map record), and on the same
//! volume once allocated (lock and map lookup only); then 4 KiB random reads.
//!
//! `cargo bench -p volume --bench thin`. `THIN_BENCH_MIB` sets the range
//! written (default 512 MiB), `THIN_BENCH_OPS` the I/Os per measurement
//! (default 100000). One thread drives everything, so the numbers are CPU
//! cost per I/O, not device speed. Every device completes its I/O after 0 to
//! 2 executor yields (as a drive completes later than it is submitted), so
//! concurrent allocations can share a commit.

mod common;

use blockdev::BlockOp;
use blockdev::testutil::block_on;
use common::{BS, QD, async_mem, env, fill, random_lbas, run};
use volume::ThinPool;

fn main() {
    let range = env("THIN_BENCH_MIB", 512) << 20;
    let ops = env("THIN_BENCH_OPS", 100_000);
    let blocks = range / BS;
    block_on(async {
        let direct = async_mem(range);
        let w = BlockOp::Write { fua: false };
        fill(&*direct, blocks).await;
        let raw_w = run(&*direct, w, &random_lbas(blocks, ops, 1)).await;
        let raw_r = run(&*direct, BlockOp::Read, &random_lbas(blocks, ops, 2)).await;
        drop(direct);
        println!(
            "4 KiB random, QD {QD}, {} MiB range, {ops} I/Os, one thread",
            range >> 20
        );
        println!("pool device (mem), written before: write {raw_w:>9.0}/s  read {raw_r:>9.0}/s");
        for cluster in [1u64 << 20, 64 << 10] {
            // Room for the metadata beside the range.
            let dev = async_mem(range + (64 << 20));
            let pool = ThinPool::format(dev, cluster).await.unwrap();
            let vol = pool.create_volume("bench", range, 4096).await.unwrap();
            let clusters = range / cluster;
            // Fresh: as many writes as there are clusters, so most allocate.
            let fresh_ops = clusters.min(ops);
            let before = pool.stats();
            let fresh = run(&vol, w, &random_lbas(blocks, fresh_ops, 3)).await;
            let after = pool.stats();
            let allocated = pool.usage().allocated_clusters;
            let commits = after.commits - before.commits;
            let records = after.records - before.records;
            fill(&vol, blocks).await;
            let over = run(&vol, w, &random_lbas(blocks, ops, 4)).await;
            let read = run(&vol, BlockOp::Read, &random_lbas(blocks, ops, 5)).await;
            println!(
                "thin, {:>4} KiB clusters: fresh write {fresh:>9.0}/s ({fresh_ops} writes, \
                 {allocated} allocations, {records} records in {commits} commits, {:.1}/commit) \
                 | allocated: write {over:>9.0}/s ({:.2}x direct)  read {read:>9.0}/s ({:.2}x direct)",
                cluster >> 10,
                records as f64 / commits.max(1) as f64,
                over / raw_w,
                read / raw_r,
            );
        }
    });
}

//! Compressed thin pools against one without compression, in process on
//! RAM (`cargo bench -p volume --bench compress`): what the data takes on
//! the device beside what LZ4 and zstd alone make of the same 64 KiB
//! chunks, and 128 KiB sequential writes (first and over) and reads, plus
//! 4 KiB random reads, at QD 16, on pools of 64 KiB clusters. One thread
//! drives everything, so the figures are CPU cost, not device speed.
//!
//! Data: `COMPRESS_DATA` names a file (docs/bench/compress.sh makes one
//! with RocksDB's db_bench, `--compression_ratio=0.5`, no compression in
//! RocksDB), else the same generator RocksDB uses is run here; and random
//! data. `COMPRESS_MIB` (default 64) is how much is written,
//! `COMPRESS_ROUNDS` (default 3) the rounds, whose medians are shown.

// (`fill` is for the other benches.)
#[allow(dead_code)]
mod common;

use std::time::Instant;

use blockdev::testutil::{Rng, block_on};
use blockdev::{AlignedBuf, BlockDevice, BlockOp, IoRequest};
use common::{async_mem, env, random_lbas, run};
use futures_util::future::join_all;
use volume::{Compression, ThinPool};

const CB: u64 = 64 << 10;
const IO: u64 = 128 << 10;
const QD: u64 = 16;

/// RocksDB's `CompressibleString`: `ratio` x 100 random printable bytes,
/// repeated to fill each 100 bytes.
fn rocksdb_like(len: usize, ratio: f64, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(len + 100);
    let raw = ((100.0 * ratio) as usize).max(1);
    while out.len() < len {
        let piece: Vec<u8> = (0..raw).map(|_| b' ' + rng.below(95) as u8).collect();
        for i in 0..100 {
            out.push(piece[i % raw]);
        }
    }
    out.truncate(len);
    out
}

fn random(len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Rng::new(99).fill(&mut v);
    v
}

/// Bytes LZ4 and zstd alone make of `data` in 64 KiB chunks.
fn alone(data: &[u8]) -> (u64, u64) {
    let (mut l, mut z) = (0u64, 0u64);
    for c in data.chunks(CB as usize) {
        l += (lz4_flex::block::compress(c).len() as u64).min(CB);
        z += (zstd::bulk::compress(c, 1).unwrap().len() as u64).min(CB);
    }
    (l, z)
}

/// 128 KiB I/Os over `data`'s range in order, QD at a time; MB/s.
async fn seq(dev: &dyn BlockDevice, op: BlockOp, data: &[u8]) -> f64 {
    let ios = data.len() as u64 / IO;
    let start = Instant::now();
    let mut next = 0u64;
    while next < ios {
        let batch = (next..(next + QD).min(ios)).map(|i| {
            let mut buf = AlignedBuf::new(IO as usize);
            buf.set_len(IO as usize);
            if matches!(op, BlockOp::Write { .. }) {
                buf.copy_from_slice(&data[(i * IO) as usize..((i + 1) * IO) as usize]);
            }
            dev.submit(IoRequest {
                op,
                lba: i * IO / 4096,
                blocks: (IO / 4096) as u32,
                buf,
            })
        });
        for d in join_all(batch).await {
            d.result.expect("bench I/O");
        }
        next += QD;
    }
    data.len() as f64 / start.elapsed().as_secs_f64() / 1e6
}

struct Round {
    first: f64,
    over: f64,
    read: f64,
    rand4k: f64,
    stored: u64,
}

async fn round(c: Compression, data: &[u8]) -> Round {
    let len = data.len() as u64;
    let pool = ThinPool::format_compressed(async_mem(len + len / 4 + (16 << 20)), CB, c)
        .await
        .unwrap();
    let v = pool.create_volume("b", len, 4096).await.unwrap();
    let w = BlockOp::Write { fua: false };
    let first = seq(&v, w, data).await;
    let over = seq(&v, w, data).await;
    let read = seq(&v, BlockOp::Read, data).await;
    let rand4k = run(&v, BlockOp::Read, &random_lbas(len / 4096, 20_000, 3)).await;
    let stored = pool.usage().stored_bytes;
    // The bench reads back what it wrote, so a broken pool shows.
    let mut b = AlignedBuf::new(IO as usize);
    b.set_len(IO as usize);
    let d = v
        .submit(IoRequest {
            op: BlockOp::Read,
            lba: 0,
            blocks: (IO / 4096) as u32,
            buf: b,
        })
        .await;
    assert!(d.result.is_ok() && d.buf[..] == data[..IO as usize]);
    Round {
        first,
        over,
        read,
        rand4k,
        stored,
    }
}

/// Runs the bench on one thread, or (`COMPRESS_RUNTIME=tokio`) in a
/// current-thread tokio runtime, as a reactor of the target does, where a
/// compressed pool compresses on tokio's blocking threads.
fn drive<F: std::future::Future>(f: F) -> F::Output {
    if std::env::var("COMPRESS_RUNTIME").as_deref() == Ok("tokio") {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    } else {
        block_on(f)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mib = env("COMPRESS_MIB", 64);
    let rounds = env("COMPRESS_ROUNDS", 3).max(1);
    let len = (mib << 20) as usize;
    let dbb = match std::env::var("COMPRESS_DATA") {
        Ok(p) => {
            let mut d = std::fs::read(&p).expect("COMPRESS_DATA");
            assert!(d.len() >= len, "{p} holds under {mib} MiB");
            d.truncate(len);
            ("db_bench data (file)", d)
        }
        Err(_) => ("RocksDB generator, ratio 0.5", rocksdb_like(len, 0.5, 1)),
    };
    println!(
        "64 KiB clusters, {mib} MiB, 128 KiB sequential at QD {QD}, 4 KiB random reads at QD \
         32; medians of {rounds} rounds, one thread"
    );
    for (name, data) in [dbb, ("random", random(len))] {
        let (l, z) = alone(&data);
        println!(
            "\n{name}: LZ4 alone stores {:.3} of it, zstd alone {:.3} (64 KiB chunks)",
            l as f64 / len as f64,
            z as f64 / len as f64
        );
        let mut base = None;
        for c in [Compression::None, Compression::Lz4, Compression::Zstd] {
            let rs: Vec<Round> = (0..rounds).map(|_| drive(round(c, &data))).collect();
            let m = |f: fn(&Round) -> f64| median(rs.iter().map(f).collect());
            let (first, over, read, r4) = (
                m(|r| r.first),
                m(|r| r.over),
                m(|r| r.read),
                m(|r| r.rand4k),
            );
            let stored = rs[0].stored as f64 / len as f64;
            let (bf, bo, br, b4) = *base.get_or_insert((first, over, read, r4));
            println!(
                "{c:>5}: stored {stored:.3} | write first {first:>7.0} MB/s ({:.2}x)  over \
                 {over:>7.0} MB/s ({:.2}x) | read {read:>7.0} MB/s ({:.2}x) | 4 KiB read \
                 {r4:>8.0}/s ({:.2}x)",
                first / bf,
                over / bo,
                read / br,
                r4 / b4
            );
        }
    }
}

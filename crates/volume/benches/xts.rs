//! Encryption cost: AES-XTS-256 (OpenSSL) per core, and an encrypted
//! volume against the same volume unencrypted, in process on RAM members.
//!
//! Part 1: one thread encrypts (into another buffer, as writes do) and
//! decrypts (in place, as reads do) 4 KiB and 128 KiB requests of 4 KiB
//! and 512 B data units; GB/s per core.
//!
//! Part 2: raid0 over 4 RAM members, 64 KiB strips, 4 KiB random I/O at
//! QD 32 and 128 KiB I/O at QD 8, one thread, unencrypted then encrypted,
//! each run repeated `XTS_BENCH_REPEAT` times (median). RAM members make
//! the ratio a worst case: nothing hides the cipher's cost.
//!
//! `cargo bench -p volume --bench xts`. `XTS_BENCH_SECS` (default 0.5).

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockdev::testutil::{Rng, block_on};
use blockdev::{AlignedBuf, BlockDevice, BlockOp, IoRequest, MemDevice};
use futures_util::future::join_all;
use volume::crypt::{DataKey, Kek, Xts};
use volume::{LayoutKind, Volume, VolumeConfig};

const BS: u64 = 4096;

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn cipher(secs: f64) {
    let xts = Xts::new(DataKey::generate().unwrap()).unwrap();
    println!(
        "AES-XTS-256 (OpenSSL {}), one thread:",
        openssl::version::version()
    );
    println!(
        "{:>8} {:>6} {:>12} {:>12}",
        "request", "unit", "encrypt GB/s", "decrypt GB/s"
    );
    for req in [4096usize, 128 << 10] {
        for unit in [4096usize, 512] {
            let src = vec![0x5au8; req];
            let mut dst = vec![0u8; req];
            let mut n = 0u64;
            let t = Instant::now();
            while t.elapsed().as_secs_f64() < secs {
                for _ in 0..64 {
                    xts.encrypt(n, unit, &src, &mut dst).unwrap();
                    n += 1;
                }
            }
            let enc = (n as f64 * req as f64) / t.elapsed().as_secs_f64() / 1e9;
            let mut n = 0u64;
            let t = Instant::now();
            while t.elapsed().as_secs_f64() < secs {
                for _ in 0..64 {
                    xts.decrypt_in_place(n, unit, &mut dst).unwrap();
                    n += 1;
                }
            }
            let dec = (n as f64 * req as f64) / t.elapsed().as_secs_f64() / 1e9;
            println!("{:>7}K {:>6} {enc:>12.2} {dec:>12.2}", req >> 10, unit);
        }
    }
}

async fn run(
    dev: &dyn BlockDevice,
    op: BlockOp,
    range: u64,
    bytes: u64,
    qd: usize,
    secs: f64,
) -> f64 {
    let slots = range / bytes;
    let blocks = (bytes / BS) as u32;
    let done_ops = Cell::new(0u64);
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(secs);
    join_all((0..qd).map(|q| {
        let done_ops = &done_ops;
        async move {
            let mut rng = Rng::new(q as u64 + 1);
            let mut buf = AlignedBuf::new(bytes as usize);
            buf.set_len(bytes as usize);
            rng.fill(&mut buf);
            loop {
                let done = dev
                    .submit(IoRequest {
                        op,
                        lba: rng.below(slots) * bytes / BS,
                        blocks,
                        buf,
                    })
                    .await;
                done.result.expect("bench I/O");
                buf = done.buf;
                done_ops.set(done_ops.get() + 1);
                if done_ops.get().is_multiple_of(32) && Instant::now() >= until {
                    break;
                }
            }
        }
    }))
    .await;
    done_ops.get() as f64 / start.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn volume(encrypted: bool, range: u64) -> Volume {
    let members: Vec<Arc<dyn BlockDevice>> = (0..4)
        .map(|_| Arc::new(MemDevice::new((1 << 20) + range / 4 + (1 << 20), 4096).unwrap()) as _)
        .collect();
    let mut cfg = VolumeConfig::new(LayoutKind::Raid0);
    cfg.assume_clean = true;
    if encrypted {
        let kek = Kek::generate().unwrap();
        let key = DataKey::generate().unwrap();
        cfg.key = Some((kek.wrap(&key).unwrap(), key));
    }
    block_on(Volume::create(members, cfg)).unwrap()
}

fn main() {
    let secs: f64 = env("XTS_BENCH_SECS", 0.5);
    let repeat: usize = env("XTS_BENCH_REPEAT", 3);
    cipher(secs);
    let range: u64 = 64 << 20;
    let plain = volume(false, range);
    let enc = volume(true, range);
    for v in [&plain, &enc] {
        // Touch every chunk of the RAM members before timing.
        block_on(run(
            v,
            BlockOp::Write { fua: false },
            range,
            1 << 20,
            1,
            0.3,
        ));
    }
    println!(
        "\nraid0 x4 RAM members, one thread, median of {repeat} x {secs} s; IOPS and ratio encrypted/plain"
    );
    println!(
        "{:<22} {:>12} {:>12} {:>7}",
        "case", "plain", "encrypted", "ratio"
    );
    for (name, op, bytes, qd) in [
        ("4K randread QD32", BlockOp::Read, 4096u64, 32usize),
        ("4K randwrite QD32", BlockOp::Write { fua: false }, 4096, 32),
        ("128K read QD8", BlockOp::Read, 128 << 10, 8),
        (
            "128K write QD8",
            BlockOp::Write { fua: false },
            128 << 10,
            8,
        ),
    ] {
        let mut p = Vec::new();
        let mut e = Vec::new();
        for _ in 0..repeat {
            p.push(block_on(run(&plain, op, range, bytes, qd, secs)));
            e.push(block_on(run(&enc, op, range, bytes, qd, secs)));
        }
        let (p, e) = (median(p), median(e));
        println!("{name:<22} {p:>12.0} {e:>12.0} {:>7.2}", e / p);
    }
}

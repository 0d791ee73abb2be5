//! Volume data path cost, in process on RAM members: random aligned reads
//! and writes of 4 KiB, 128 KiB and one full stripe on raid0 (4 members),
//! raid1 (2-way and 3-way), raid5 (4) and raid6 (6), 64 KiB strips. One thread
//! drives `QD` requests at a time through `BlockDevice::submit`, so the
//! numbers are CPU (mostly memory bandwidth) per I/O, not device speed: what
//! the volume adds on top of its members, copies included.
//!
//! Prints wall-clock IOPS, MiB/s and us per I/O, and the thread's CPU us per
//! I/O (steadier on a shared machine).
//!
//! `cargo bench -p volume --bench volume_io`. `VOL_BENCH_SECS` sets the
//! seconds per measurement (default 0.4), `VOL_BENCH_REPEAT` the repeats
//! whose median is printed (default 3), `VOL_BENCH_MIB` the volume range
//! touched (default 64), `VOL_BENCH_ONLY` a substring of the case names
//! (e.g. `raid5`) to run only those, `VOL_BENCH_REGION_MIB` the intent
//! region (default 0: the volume's automatic size).
//!
//! The first line of each layout, `fill seq 1m`, is the one write of every
//! block of the range, 1 MiB at a time at QD 1, on members already touched:
//! each write enters a region whose intent bit is clear, so it shows what
//! the region size costs a sequential writer.

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockdev::testutil::{Rng, block_on};
use blockdev::{AlignedBuf, BlockDevice, BlockOp, IoRequest, MemDevice};
use futures_util::future::join_all;
use volume::{LayoutKind, Volume, VolumeConfig};

const QD: usize = 8;
const BS: u64 = 4096;
const STRIP: u64 = 64 << 10;
const META: u64 = 1 << 20;

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// This thread's CPU time in seconds: on a shared machine it counts what
/// the data path costs, not time spent waiting for a core.
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill; the clock id is a constant.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Random `bytes`-sized, `bytes`-aligned I/Os over the first `range` bytes,
/// `QD` at a time, for `secs`; returns I/Os per second (wall clock) and
/// CPU microseconds per I/O.
async fn run(dev: &dyn BlockDevice, op: BlockOp, range: u64, bytes: u64, secs: f64) -> (f64, f64) {
    let slots = range / bytes;
    let blocks = (bytes / BS) as u32;
    let done_ops = Cell::new(0u64);
    let cpu0 = thread_cpu();
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(secs);
    join_all((0..QD).map(|q| {
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
                if done_ops.get().is_multiple_of(64) && Instant::now() >= until {
                    break;
                }
            }
        }
    }))
    .await;
    let ops = done_ops.get() as f64;
    (
        ops / start.elapsed().as_secs_f64(),
        (thread_cpu() - cpu0) * 1e6 / ops,
    )
}

/// Writes every block of the range once, 1 MiB at a time.
async fn fill(dev: &dyn BlockDevice, range: u64) {
    let per = 1 << 20;
    let mut at = 0;
    // One buffer, reused: the allocator's mmap threshold moved timings 3x.
    let mut buf = AlignedBuf::new(per as usize);
    buf.set_len(per as usize);
    buf.fill(0x5A);
    while at < range {
        let n = per.min(range - at);
        buf.set_len(n as usize);
        let done = dev
            .submit(IoRequest {
                op: BlockOp::Write { fua: false },
                lba: at / BS,
                blocks: (n / BS) as u32,
                buf,
            })
            .await;
        done.result.expect("fill");
        buf = done.buf;
        at += n;
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let secs: f64 = env("VOL_BENCH_SECS", 0.4);
    let repeat: usize = env("VOL_BENCH_REPEAT", 3);
    let range: u64 = env::<u64>("VOL_BENCH_MIB", 64) << 20;
    let only: String = env("VOL_BENCH_ONLY", String::new());
    let region: u64 = env::<u64>("VOL_BENCH_REGION_MIB", 0) << 20;
    let layouts: [(&str, LayoutKind, usize); 5] = [
        ("raid0x4", LayoutKind::Raid0, 4),
        ("raid1x2", LayoutKind::Raid1, 2),
        ("raid1x3", LayoutKind::Raid1, 3),
        ("raid5x4", LayoutKind::Raid5, 4),
        ("raid6x6", LayoutKind::Raid6, 6),
    ];
    println!(
        "volume over RAM members, {} KiB strips, QD {QD}, one thread, {} MiB range, \
         median of {repeat} x {secs} s",
        STRIP >> 10,
        range >> 20
    );
    println!(
        "{:<26} {:>10} {:>10} {:>9} {:>10}",
        "case", "IOPS", "MiB/s", "us/IO", "cpu us/IO"
    );
    block_on(async {
        for (name, kind, n) in layouts {
            if !only.is_empty() && !name.contains(&only) {
                continue;
            }
            let data_cols = match kind {
                LayoutKind::Raid0 => n as u64,
                LayoutKind::Raid1 => 1,
                LayoutKind::Raid5 => n as u64 - 1,
                LayoutKind::Raid6 => n as u64 - 2,
                _ => unreachable!(),
            };
            let member_bytes = META + range.div_ceil(data_cols).next_multiple_of(STRIP) + 4 * STRIP;
            let members: Vec<Arc<dyn BlockDevice>> = (0..n)
                .map(|_| Arc::new(MemDevice::new(member_bytes, 4096).unwrap()) as _)
                .collect();
            // The RAM members' chunks allocated first, so the fill times the volume.
            for m in &members {
                fill(&**m, member_bytes).await;
            }
            let cfg = VolumeConfig {
                strip_bytes: STRIP as u32,
                meta_bytes: META,
                region_bytes: region,
                assume_clean: true,
                ..VolumeConfig::new(kind)
            };
            let vol = Volume::create(members, cfg).await.expect("create volume");
            let t = Instant::now();
            fill(&vol, range).await;
            let s = t.elapsed().as_secs_f64();
            let ios = range.div_ceil(1 << 20) as f64;
            println!(
                "{:<26} {:>10.0} {:>10.0} {:>9.2} {:>10}",
                format!("{name} fill seq 1m"),
                ios / s,
                (range >> 20) as f64 / s,
                s * 1e6 / ios,
                "-"
            );
            let stripe = data_cols * STRIP;
            let mut sizes = vec![("4k", BS), ("128k", 128 << 10)];
            if data_cols > 1 && stripe != 128 << 10 {
                sizes.push(("stripe", stripe));
            }
            for (sname, bytes) in sizes {
                for (oname, op) in [
                    ("write", BlockOp::Write { fua: false }),
                    ("read", BlockOp::Read),
                ] {
                    let case = format!("{name} {oname} {sname}");
                    let mut v = Vec::with_capacity(repeat);
                    let mut c = Vec::with_capacity(repeat);
                    for _ in 0..repeat {
                        let (iops, cpu) = run(&vol, op, range, bytes, secs).await;
                        v.push(iops);
                        c.push(cpu);
                    }
                    let iops = median(v);
                    println!(
                        "{case:<26} {iops:>10.0} {:>10.0} {:>9.2} {:>10.2}",
                        iops * bytes as f64 / (1 << 20) as f64,
                        1e6 / iops,
                        median(c)
                    );
                }
            }
        }
    });
}

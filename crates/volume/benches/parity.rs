//! Parity kernels and the stripe engine, per core.
//!
//! `cargo bench -p volume` prints encode and decode GB/s (of data, i.e. k
//! strips per stripe) for the shapes the issue names, then sequential and
//! random write throughput of volumes on RAM members relative to raid0.
//! `BENCH_SECS` sets the time per measurement (default 1).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockdev::{AlignedBuf, BlockDevice, BlockOp, IoRequest, MemDevice};
use volume::{LayoutKind, Parity, Volume, VolumeConfig};

fn secs() -> Duration {
    let s: f64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    Duration::from_secs_f64(s)
}

/// Runs `f` repeatedly for the bench time; returns calls per second.
fn rate(mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    let limit = secs();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < limit {
        f();
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn fill(seed: u64, v: &mut [u8]) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for c in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
}

fn bench_code(k: usize, m: usize, strip: usize) {
    let p = Parity::new(k, m).unwrap();
    let mut data: Vec<Vec<u8>> = (0..k).map(|_| vec![0u8; strip]).collect();
    for (i, d) in data.iter_mut().enumerate() {
        fill(i as u64 + 1, d);
    }
    let mut par: Vec<Vec<u8>> = (0..m).map(|_| vec![0u8; strip]).collect();
    let enc = rate(|| {
        let d: Vec<&[u8]> = data.iter().map(|v| &v[..]).collect();
        let mut pr: Vec<&mut [u8]> = par.iter_mut().map(|v| &mut v[..]).collect();
        p.encode(&d, &mut pr).unwrap();
        black_box(&pr);
    });
    // Decode: lose min(m, k) data columns.
    let lost = m.min(k);
    let mut cols: Vec<Vec<u8>> = data.iter().chain(par.iter()).cloned().collect();
    let present: Vec<bool> = (0..k + m).map(|c| c >= lost).collect();
    let dec = rate(|| {
        let mut refs: Vec<&mut [u8]> = cols.iter_mut().map(|v| &mut v[..]).collect();
        p.reconstruct(&mut refs, &present).unwrap();
        black_box(&refs);
    });
    assert_eq!(cols[0], data[0], "decode restores the data");
    let bytes = (k * strip) as f64;
    println!(
        "parity {:>5} {:?} strip {:>3} KiB: encode {:6.2} GB/s, decode ({lost} lost) {:6.2} GB/s",
        format!("{k}+{m}"),
        p.code,
        strip >> 10,
        enc * bytes / 1e9,
        dec * bytes / 1e9
    );
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    // Members are RAM devices: every future is ready at once or after
    // in-process wakeups, so a spin-poll executor is enough.
    use std::task::{Context, Poll, Waker};
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::yield_now();
    }
}

fn volume_on_mem(kind: LayoutKind, n: usize, member_bytes: u64) -> Volume {
    let members: Vec<Arc<dyn BlockDevice>> = (0..n)
        .map(|_| Arc::new(MemDevice::new(member_bytes, 4096).unwrap()) as Arc<dyn BlockDevice>)
        .collect();
    let cfg = VolumeConfig {
        assume_clean: true,
        ..VolumeConfig::new(kind)
    };
    block_on(Volume::create(members, cfg)).unwrap()
}

/// Bytes/s of `bs`-byte writes, sequential or at pseudo-random aligned offsets.
fn write_rate(vol: &Volume, bs: usize, random: bool) -> f64 {
    let blocks = (bs / 4096) as u64;
    let total = vol.geometry().num_blocks / blocks;
    let mut buf = AlignedBuf::new(bs);
    buf.set_len(bs);
    fill(9, &mut buf);
    let mut buf = Some(buf);
    let mut i = 0u64;
    let r = rate(|| {
        let slot = if random {
            (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11) % total
        } else {
            i % total
        };
        i += 1;
        let done = block_on(vol.submit(IoRequest {
            op: BlockOp::Write { fua: false },
            lba: slot * blocks,
            blocks: blocks as u32,
            buf: buf.take().unwrap(),
        }));
        done.result.unwrap();
        buf = Some(done.buf);
    });
    r * bs as f64
}

fn prefill(vol: &Volume, bs: usize) {
    let blocks = (bs / 4096) as u64;
    let mut buf = AlignedBuf::new(bs);
    buf.set_len(bs);
    for slot in 0..vol.geometry().num_blocks / blocks {
        let done = block_on(vol.submit(IoRequest {
            op: BlockOp::Write { fua: false },
            lba: slot * blocks,
            blocks: blocks as u32,
            buf,
        }));
        done.result.unwrap();
        buf = done.buf;
    }
}

fn bench_volumes() {
    let member = 128u64 << 20;
    let shapes = [
        ("raid0 8", LayoutKind::Raid0, 8usize),
        ("raid5 7+1", LayoutKind::Raid5, 8),
        ("raid6 6+2", LayoutKind::Raid6, 8),
        // Again, to show how much the machine drifted during the run.
        ("raid0 8", LayoutKind::Raid0, 8),
    ];
    let mut base = (0.0, 0.0);
    for (name, kind, n) in shapes {
        let vol = volume_on_mem(kind, n, member);
        // A full stripe per write where the layout has one (raid0: 8 strips).
        let stripe = (vol.layout().stripe_data_blocks() * 4096) as usize;
        // Write everything once so RAM allocation (page faults) is not measured.
        prefill(&vol, stripe);
        // Best of three: shared build machines are noisy.
        let best = |f: &dyn Fn() -> f64| (0..3).map(|_| f()).fold(0.0, f64::max);
        let seq = best(&|| write_rate(&vol, stripe, false));
        let rnd = best(&|| write_rate(&vol, 4096, true)) / 4096.0;
        if kind == LayoutKind::Raid0 && base.0 == 0.0 {
            base = (seq, rnd);
        }
        println!(
            "volume {name:>9} on mem, 1 core: seq write ({:>4} KiB) {:6.2} GB/s ({:5.1}% of raid0), \
             4 KiB random write {:8.0} IOPS ({:5.1}% of raid0)",
            stripe >> 10,
            seq / 1e9,
            100.0 * seq / base.0,
            rnd,
            100.0 * rnd / base.1
        );
    }
}

/// Bytes/s of sequential full-stripe reads.
fn read_rate(vol: &Volume, bs: usize) -> f64 {
    let blocks = (bs / 4096) as u64;
    let total = vol.geometry().num_blocks / blocks;
    let mut buf = Some({
        let mut b = AlignedBuf::new(bs);
        b.set_len(bs);
        b
    });
    let mut i = 0u64;
    rate(|| {
        let done = block_on(vol.submit(IoRequest {
            op: BlockOp::Read,
            lba: (i % total) * blocks,
            blocks: blocks as u32,
            buf: buf.take().unwrap(),
        }));
        i += 1;
        done.result.unwrap();
        buf = Some(done.buf);
    }) * bs as f64
}

fn bench_degraded_and_rebuild() {
    let member = 128u64 << 20;
    for (name, kind, fail) in [
        ("raid5 7+1", LayoutKind::Raid5, 1usize),
        ("raid6 6+2", LayoutKind::Raid6, 1),
        ("raid6 6+2", LayoutKind::Raid6, 2),
    ] {
        let vol = volume_on_mem(kind, 8, member);
        let stripe = (vol.layout().stripe_data_blocks() * 4096) as usize;
        prefill(&vol, stripe);
        let healthy = read_rate(&vol, stripe);
        for i in 0..fail {
            block_on(vol.fail_member(i)).unwrap();
        }
        let degraded = read_rate(&vol, stripe);
        for i in 0..fail {
            let spare = Arc::new(MemDevice::new(member, 4096).unwrap());
            block_on(vol.replace_member(i, spare)).unwrap();
        }
        let start = Instant::now();
        block_on(vol.rebuild(volume::RebuildOptions::default())).unwrap();
        let secs = start.elapsed().as_secs_f64();
        let p = vol.rebuild_progress();
        println!(
            "volume {name:>9} on mem, 1 core: seq read healthy {:6.2} GB/s, {fail} failed {:6.2} GB/s; \
             rebuild of {fail} x {} MiB: {:6.2} GB/s written ({:.2} s)",
            healthy / 1e9,
            degraded / 1e9,
            p.bytes >> 20 >> (fail - 1),
            p.bytes as f64 / secs / 1e9,
            secs
        );
    }
}

fn main() {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let want = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));
    if want("parity") {
        for strip in [64 << 10, 4096] {
            bench_code(8, 2, strip);
            bench_code(6, 2, strip);
            bench_code(7, 1, strip);
            bench_code(16, 4, strip);
        }
    }
    if want("volume") {
        bench_volumes();
    }
    if want("degraded") || want("rebuild") {
        bench_degraded_and_rebuild();
    }
}

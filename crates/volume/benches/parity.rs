//! Parity kernels and the stripe engine, per core.
//!
//! `cargo bench -p volume --bench parity [group]` prints, for the groups
//! whose name contains `group` (all by default):
//!
//! - `parity`: encode and decode GB/s (of data, i.e. k strips per stripe);
//! - `volume`: full-stripe sequential and 4 KiB random write throughput of
//!   raid5 7+1 and raid6 6+2 on 8 RAM members, relative to raid0 on the same
//!   members;
//! - `journal`: the same writes on degraded volumes (one member failed),
//!   with the write journal on and off: what the write-hole protection costs;
//! - `degraded`: sequential reads healthy and degraded, and rebuild speed.
//!
//! Shapes are measured in interleaved rounds (`BENCH_ROUNDS`, default 5, of
//! `BENCH_SECS` per measurement, default 0.5) and reported as medians, ratios
//! taken within a round, so a machine that drifts affects both sides alike.
//! `BENCH_ONLY=raid5` restricts the volume groups to shapes whose name
//! contains it, `BENCH_PATTERN=seq` or `rand` to one access pattern (for
//! profiling); `BENCH_NO_INTENT=1` turns the intent bitmap off.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockdev::{AlignedBuf, BlockDevice, BlockOp, IoRequest, MemDevice};
use volume::{LayoutKind, Parity, Volume, VolumeConfig};

fn secs() -> Duration {
    let s: f64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.5);
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
        "parity {:>5} {:?} strip {:>3} KiB: encode {:6.2} GB/s, decode ({lost} lost) {:6.2} GB/s \
         ({:6.1} us per stripe)",
        format!("{k}+{m}"),
        p.code,
        strip >> 10,
        enc * bytes / 1e9,
        dec * bytes / 1e9,
        1e6 / dec
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

fn rounds() -> usize {
    std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn selected(name: &str) -> bool {
    std::env::var("BENCH_ONLY").map_or(true, |f| name.contains(&f))
}

const MEMBER_BYTES: u64 = 128 << 20;

fn volume_on_mem(kind: LayoutKind, n: usize, journal: bool) -> Volume {
    let members: Vec<Arc<dyn BlockDevice>> = (0..n)
        .map(|_| Arc::new(MemDevice::new(MEMBER_BYTES, 4096).unwrap()) as Arc<dyn BlockDevice>)
        .collect();
    let cfg = VolumeConfig {
        assume_clean: true,
        write_journal: journal,
        intent_log: std::env::var("BENCH_NO_INTENT").is_err(),
        ..VolumeConfig::new(kind)
    };
    let vol = block_on(Volume::create(members, cfg)).unwrap();
    // Write everything once so RAM allocation (page faults) is not measured.
    prefill(&vol, (vol.layout().stripe_data_blocks() * 4096) as usize);
    vol
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

/// Full-stripe sequential write (bytes/s) and 4 KiB random write (IOPS).
/// `BENCH_PATTERN=seq` or `rand` measures only that one (for profiling).
fn seq_and_random(vol: &Volume) -> (f64, f64) {
    let stripe = (vol.layout().stripe_data_blocks() * 4096) as usize;
    let pattern = std::env::var("BENCH_PATTERN").unwrap_or_default();
    (
        if pattern != "rand" {
            write_rate(vol, stripe, false)
        } else {
            f64::NAN
        },
        if pattern != "seq" {
            write_rate(vol, 4096, true) / 4096.0
        } else {
            f64::NAN
        },
    )
}

/// Measures `shapes` in interleaved rounds; returns per shape the (seq,
/// random) results of every round.
fn interleaved(shapes: &[(String, Volume)]) -> Vec<Vec<(f64, f64)>> {
    let mut out = vec![Vec::new(); shapes.len()];
    for _ in 0..rounds() {
        for (i, (_, vol)) in shapes.iter().enumerate() {
            out[i].push(seq_and_random(vol));
        }
    }
    out
}

fn bench_volumes() {
    let mut shapes: Vec<(String, Volume)> = Vec::new();
    for (name, kind) in [
        ("raid0 8", LayoutKind::Raid0),
        ("raid5 7+1", LayoutKind::Raid5),
        ("raid6 6+2", LayoutKind::Raid6),
    ] {
        if name.starts_with("raid0") || selected(name) {
            shapes.push((name.to_string(), volume_on_mem(kind, 8, true)));
        }
    }
    let res = interleaved(&shapes);
    for (i, (name, vol)) in shapes.iter().enumerate() {
        let stripe = vol.layout().stripe_data_blocks() * 4;
        // Ratios within each round, against that round's raid0.
        let seq_ratio = median(res[i].iter().zip(&res[0]).map(|(a, b)| a.0 / b.0).collect());
        let rnd_ratio = median(res[i].iter().zip(&res[0]).map(|(a, b)| a.1 / b.1).collect());
        println!(
            "volume {name:>9} on mem, 1 core: seq write ({stripe:>4} KiB) {:6.2} GB/s \
             ({:5.1}% of raid0), 4 KiB random write {:8.0} IOPS ({:5.1}% of raid0) \
             [medians of {}]",
            median(res[i].iter().map(|r| r.0).collect()) / 1e9,
            100.0 * seq_ratio,
            median(res[i].iter().map(|r| r.1).collect()),
            100.0 * rnd_ratio,
            res[i].len()
        );
    }
}

/// Degraded writes with the journal on and off, interleaved.
fn bench_journal() {
    for (name, kind, fail) in [
        ("raid5 7+1", LayoutKind::Raid5, 1usize),
        ("raid6 6+2", LayoutKind::Raid6, 1),
        ("raid6 6+2", LayoutKind::Raid6, 2),
    ] {
        if !selected(name) {
            continue;
        }
        let shapes: Vec<(String, Volume)> = [true, false]
            .into_iter()
            .map(|journal| {
                let vol = volume_on_mem(kind, 8, journal);
                for i in 0..fail {
                    block_on(vol.fail_member(i)).unwrap();
                }
                (
                    format!("journal {}", if journal { "on" } else { "off" }),
                    vol,
                )
            })
            .collect();
        let before: Vec<_> = shapes.iter().map(|(_, v)| v.stats()).collect();
        let res = interleaved(&shapes);
        let seq_ratio = median(res[0].iter().zip(&res[1]).map(|(a, b)| a.0 / b.0).collect());
        let rnd_ratio = median(res[0].iter().zip(&res[1]).map(|(a, b)| a.1 / b.1).collect());
        for (i, (what, vol)) in shapes.iter().enumerate() {
            let st = vol.stats();
            let writes = st.degraded_writes - before[i].degraded_writes;
            let recs = st.journal_writes - before[i].journal_writes;
            println!(
                "volume {name:>9} {fail} failed, {what:>11}: seq write {:6.2} GB/s, 4 KiB random \
                 write {:8.0} IOPS; {:.0}% of degraded stripe writes journaled, {:.1} KiB each",
                median(res[i].iter().map(|r| r.0).collect()) / 1e9,
                median(res[i].iter().map(|r| r.1).collect()),
                100.0 * recs as f64 / writes.max(1) as f64,
                (st.journal_bytes - before[i].journal_bytes) as f64 / recs.max(1) as f64 / 1024.0
            );
        }
        println!(
            "volume {name:>9} {fail} failed: journal on / off = seq {:5.1}%, random {:5.1}% \
             [medians of {} rounds]",
            100.0 * seq_ratio,
            100.0 * rnd_ratio,
            res[0].len()
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
    for (name, kind, fail) in [
        ("raid5 7+1", LayoutKind::Raid5, 1usize),
        ("raid6 6+2", LayoutKind::Raid6, 1),
        ("raid6 6+2", LayoutKind::Raid6, 2),
    ] {
        if !selected(name) {
            continue;
        }
        let vol = volume_on_mem(kind, 8, true);
        let stripe = (vol.layout().stripe_data_blocks() * 4096) as usize;
        let healthy = median((0..rounds()).map(|_| read_rate(&vol, stripe)).collect());
        for i in 0..fail {
            block_on(vol.fail_member(i)).unwrap();
        }
        let degraded = median((0..rounds()).map(|_| read_rate(&vol, stripe)).collect());
        for i in 0..fail {
            let spare = Arc::new(MemDevice::new(MEMBER_BYTES, 4096).unwrap());
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
    if want("journal") {
        bench_journal();
    }
    if want("degraded") || want("rebuild") {
        bench_degraded_and_rebuild();
    }
}

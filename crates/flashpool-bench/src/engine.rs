//! One job: a thread with its own current-thread runtime (pinned when asked)
//! running `qd` workers, each with its own buffer, over the job's region.
//! Nothing on the per-I/O path allocates or takes a lock; the only shared
//! writes are three relaxed counters the progress line reads.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;

use crate::backend::JobIo;
use crate::spec::{Rw, Workload};
use crate::verify::{self, Bad};

/// Latency histograms: 1 ns to 60 s at 3 significant digits.
pub(crate) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds")
}

/// Counters the main thread reads for the progress line; one cache line per job.
#[repr(align(64))]
#[derive(Default)]
pub(crate) struct Live {
    pub ios: AtomicU64,
    pub bytes: AtomicU64,
    pub lat_ns: AtomicU64,
}

/// What all jobs share.
pub(crate) struct Shared {
    pub stop: AtomicBool,
    pub live: Vec<Live>,
}

/// What one job does.
#[derive(Clone)]
pub(crate) struct JobPlan {
    pub index: usize,
    pub w: Arc<Workload>,
    pub cpu: Option<usize>,
    /// First LBA of the job's region, and its size in I/O units of `bs`.
    pub region_lba: u64,
    pub region_units: u64,
    pub lba_size: u32,
    /// Set when the run starts.
    pub start: Instant,
    pub measure_from: Instant,
    pub rate_interval: Option<Duration>,
}

impl JobPlan {
    fn lbas_per_io(&self) -> u32 {
        self.w.bs / self.lba_size
    }
}

#[derive(Debug, Default, Clone)]
pub(crate) struct VerifyCounts {
    pub checked_blocks: u64,
    pub skipped_blocks: u64,
    pub readback_blocks: u64,
    pub mismatches: u64,
    pub first: Vec<(u64, Bad)>,
}

/// A job's measurements (I/Os issued from `measure_from` on).
pub(crate) struct JobResult {
    pub read: Histogram<u64>,
    pub write: Histogram<u64>,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub last_done: Option<Instant>,
    pub verify: VerifyCounts,
}

impl JobResult {
    fn new() -> Self {
        JobResult {
            read: new_histogram(),
            write: new_histogram(),
            read_bytes: 0,
            write_bytes: 0,
            last_done: None,
            verify: VerifyCounts::default(),
        }
    }
}

const KEEP_MISMATCHES: usize = 10;

/// One I/O that came back.
struct Done {
    is_read: bool,
    unit: u64,
    lba: u64,
    t0: Instant,
    t1: Instant,
}

struct JobState {
    rng: u64,
    seq_next: u64,
    /// One pass (no runtime): I/Os left to issue.
    pass_left: Option<u64>,
    /// One random pass visits every unit once: a full-period LCG modulo the
    /// next power of two, skipping values past the region (state, mask, increment).
    perm: Option<(u64, u64, u64)>,
    rate_k: u64,
    /// Units written in this run (with --verify).
    written: Vec<u64>,
    /// Units in flight (with --verify), so that no two I/Os touch one block at once.
    inflight: Vec<u64>,
    generation: u64,
    error: Option<anyhow::Error>,
    res: JobResult,
}

impl JobState {
    fn rand(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.rand()) * u128::from(n)) >> 64) as u64
    }

    fn next_io(&mut self, p: &JobPlan) -> Option<(bool, u64)> {
        if let Some(left) = self.pass_left.as_mut() {
            if *left == 0 {
                return None;
            }
            *left -= 1;
        }
        let w = &p.w;
        let is_read = match w.rw {
            Rw::Read | Rw::Randread => true,
            Rw::Write | Rw::Randwrite => false,
            Rw::Randrw => self.below(100) < u64::from(w.mix),
        };
        let unit = if let Some((x, mask, c)) = self.perm.as_mut() {
            loop {
                // a = 5 (mod 4 == 1) and an odd c give period mask + 1.
                *x = x
                    .wrapping_mul(0x5851_F42D_4C95_7F2D & !3 | 1)
                    .wrapping_add(*c)
                    & *mask;
                if *x < p.region_units {
                    break *x;
                }
            }
        } else if w.rw.random() {
            let mut u = self.below(p.region_units);
            if w.verify {
                for _ in 0..8 {
                    if !self.inflight.contains(&u) {
                        break;
                    }
                    u = self.below(p.region_units);
                }
            }
            u
        } else {
            let u = self.seq_next;
            self.seq_next = (u + 1) % p.region_units;
            u
        };
        if w.verify {
            self.inflight.push(unit);
        }
        Some((is_read, unit))
    }

    /// Accounts one finished I/O: counters, histograms, verification. False: the job must stop.
    fn finish(&mut self, p: &JobPlan, live: &Live, d: Done, buf: &[u8], r: Result<()>) -> bool {
        let w = &*p.w;
        self.release(d.unit);
        if let Err(e) = r {
            let what = if d.is_read { "read" } else { "write" };
            self.error.get_or_insert(e.context(format!(
                "job {}: {what} of {} bytes at LBA {}",
                p.index, w.bs, d.lba
            )));
            return false;
        }
        let ns = d.t1.duration_since(d.t0).as_nanos() as u64;
        live.ios.fetch_add(1, Relaxed);
        live.bytes.fetch_add(u64::from(w.bs), Relaxed);
        live.lat_ns.fetch_add(ns, Relaxed);
        if d.t0 >= p.measure_from {
            let (h, bytes) = if d.is_read {
                (&mut self.res.read, &mut self.res.read_bytes)
            } else {
                (&mut self.res.write, &mut self.res.write_bytes)
            };
            h.saturating_record(ns.max(1));
            *bytes += u64::from(w.bs);
            self.res.last_done = Some(d.t1);
        }
        if w.verify && !d.is_read {
            self.mark_written(d.unit);
        } else if w.verify {
            // Blocks written in this run, or all of them when the user named the
            // seed, must carry it; a read-only run without --seed takes any seed;
            // a mixed run cannot judge blocks it has not written.
            let seed = if self.is_written(d.unit) || w.seed_given {
                Some(Some(w.seed))
            } else if !w.rw.writes() {
                Some(None)
            } else {
                None
            };
            match seed {
                Some(seed) => self.check(p, d.unit, buf, seed, false),
                None => self.res.verify.skipped_blocks += u64::from(p.lbas_per_io()),
            }
        }
        true
    }

    fn release(&mut self, unit: u64) {
        if let Some(i) = self.inflight.iter().position(|&u| u == unit) {
            self.inflight.swap_remove(i);
        }
    }

    fn is_written(&self, unit: u64) -> bool {
        self.written
            .get((unit / 64) as usize)
            .is_some_and(|w| w & (1 << (unit % 64)) != 0)
    }

    fn mark_written(&mut self, unit: u64) {
        if let Some(w) = self.written.get_mut((unit / 64) as usize) {
            *w |= 1 << (unit % 64);
        }
    }

    fn mismatch(&mut self, lba: u64, bad: Bad) {
        let v = &mut self.res.verify;
        v.mismatches += 1;
        if v.first.len() < KEEP_MISMATCHES {
            v.first.push((lba, bad));
        }
    }

    /// Checks the blocks of a read of `unit`; `seed`: what they must carry, if known.
    fn check(&mut self, p: &JobPlan, unit: u64, buf: &[u8], seed: Option<u64>, readback: bool) {
        let first = p.region_lba + unit * u64::from(p.lbas_per_io());
        for (i, blk) in buf.chunks_exact(p.lba_size as usize).enumerate() {
            let lba = first + i as u64;
            match verify::check(blk, lba, seed) {
                Ok(()) => {}
                Err(bad) => self.mismatch(lba, bad),
            }
            if readback {
                self.res.verify.readback_blocks += 1;
            } else {
                self.res.verify.checked_blocks += 1;
            }
        }
    }
}

/// Runs the job to its end: the timed phase, then (for verified writes) the read-back.
/// `main_done` is called between the two.
pub(crate) async fn run_job<I: JobIo + 'static>(
    io: Rc<I>,
    plan: Rc<JobPlan>,
    shared: Arc<Shared>,
    main_done: impl FnOnce(),
) -> Result<JobResult> {
    let w = plan.w.clone();
    let units = plan.region_units;
    let st = Rc::new(RefCell::new(JobState {
        rng: (w.seed ^ (plan.index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1,
        seq_next: 0,
        pass_left: w.runtime.is_none().then_some(units),
        perm: None,
        rate_k: 0,
        written: if w.verify && w.rw.writes() {
            vec![0; units.div_ceil(64) as usize]
        } else {
            Vec::new()
        },
        inflight: Vec::with_capacity(w.qd as usize),
        generation: 1,
        error: None,
        res: JobResult::new(),
    }));
    if w.runtime.is_none() && w.rw.random() {
        let mut s = st.borrow_mut();
        let mask = units.next_power_of_two() - 1;
        let (x, c) = (s.rand() & mask, s.rand() | 1);
        s.perm = Some((x, mask, c));
    }
    let mut tasks = Vec::with_capacity(w.qd as usize);
    for _ in 0..w.qd {
        tasks.push(tokio::task::spawn_local(worker(
            io.clone(),
            st.clone(),
            plan.clone(),
            shared.clone(),
        )));
    }
    for t in tasks {
        t.await.context("bench worker panicked")?;
    }
    main_done();
    if st.borrow().error.is_none() && w.verify && w.rw.writes() {
        readback(io, st.clone(), plan.clone()).await?;
    }
    let st = Rc::into_inner(st).expect("workers are done").into_inner();
    match st.error {
        Some(e) => Err(e),
        None => Ok(st.res),
    }
}

async fn worker<I: JobIo>(
    io: Rc<I>,
    st: Rc<RefCell<JobState>>,
    p: Rc<JobPlan>,
    shared: Arc<Shared>,
) {
    let w = &*p.w;
    let nlb = p.lbas_per_io();
    let live = &shared.live[p.index];
    let mut buf = io.alloc(w.bs as usize);
    let mut done_since_yield = 0u32;
    loop {
        if shared.stop.load(Relaxed) {
            break;
        }
        if let Some(iv) = p.rate_interval {
            let k = {
                let mut s = st.borrow_mut();
                s.rate_k += 1;
                s.rate_k - 1
            };
            let due = p.start + Duration::from_nanos((iv.as_nanos() as u64).saturating_mul(k));
            if due > Instant::now() {
                tokio::time::sleep_until(due.into()).await;
                if shared.stop.load(Relaxed) {
                    break;
                }
            }
        }
        let Some((is_read, unit)) = st.borrow_mut().next_io(&p) else {
            break;
        };
        let lba = p.region_lba + unit * u64::from(nlb);
        if w.verify && !is_read {
            let generation = {
                let mut s = st.borrow_mut();
                s.generation += 1;
                s.generation
            };
            for (i, blk) in buf.chunks_exact_mut(p.lba_size as usize).enumerate() {
                verify::stamp(blk, lba + i as u64, w.seed, generation);
            }
        }
        let t0 = Instant::now();
        let (b, r) = if is_read {
            io.read(lba, nlb, buf).await
        } else {
            io.write(lba, nlb, buf).await
        };
        let t1 = Instant::now();
        buf = b;
        let done = Done {
            is_read,
            unit,
            lba,
            t0,
            t1,
        };
        if !st.borrow_mut().finish(&p, live, done, &buf, r) {
            shared.stop.store(true, Relaxed);
            break;
        }
        // A device that completes at once (RAM) never returns Pending: let the others run.
        done_since_yield += 1;
        if done_since_yield >= 64 {
            done_since_yield = 0;
            tokio::task::yield_now().await;
        }
    }
}

/// Reads back every unit written in this run and checks it.
async fn readback<I: JobIo + 'static>(
    io: Rc<I>,
    st: Rc<RefCell<JobState>>,
    p: Rc<JobPlan>,
) -> Result<()> {
    let units: Rc<Vec<u64>> = {
        let s = st.borrow();
        Rc::new((0..p.region_units).filter(|&u| s.is_written(u)).collect())
    };
    let cursor = Rc::new(std::cell::Cell::new(0usize));
    let mut tasks = Vec::new();
    for _ in 0..p.w.qd {
        let (io, st, p, units, cursor) = (
            io.clone(),
            st.clone(),
            p.clone(),
            units.clone(),
            cursor.clone(),
        );
        tasks.push(tokio::task::spawn_local(async move {
            let nlb = p.lbas_per_io();
            let mut buf = io.alloc(p.w.bs as usize);
            loop {
                let i = cursor.get();
                let Some(&unit) = units.get(i) else { return };
                cursor.set(i + 1);
                let lba = p.region_lba + unit * u64::from(nlb);
                let (b, r) = io.read(lba, nlb, buf).await;
                buf = b;
                let mut s = st.borrow_mut();
                if let Err(e) = r {
                    s.error.get_or_insert(
                        e.context(format!("job {}: verify read-back at LBA {lba}", p.index)),
                    );
                    return;
                }
                s.check(&p, unit, &buf, Some(p.w.seed), true);
            }
        }));
    }
    for t in tasks {
        t.await.context("bench read-back worker panicked")?;
    }
    Ok(())
}

/// Pins the calling thread to `cpus`.
pub(crate) fn pin_to(cpus: &[usize]) -> Result<()> {
    if cpus.is_empty() {
        return Ok(());
    }
    // SAFETY: cpu_set_t is plain data, zeroed is its empty set; sched_setaffinity(0, ..)
    // only changes the calling thread's affinity.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        anyhow::bail!(
            "cannot pin to CPUs {cpus:?}: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(rw: Rw, units: u64, verify: bool) -> JobPlan {
        let now = Instant::now();
        JobPlan {
            index: 0,
            w: Arc::new(Workload {
                rw,
                verify,
                qd: 4,
                ..Workload::default()
            }),
            cpu: None,
            region_lba: 0,
            region_units: units,
            lba_size: 512,
            start: now,
            measure_from: now,
            rate_interval: None,
        }
    }

    fn state(pass: Option<u64>) -> JobState {
        JobState {
            rng: 7,
            seq_next: 0,
            pass_left: pass,
            perm: None,
            rate_k: 0,
            written: vec![0; 4],
            inflight: Vec::new(),
            generation: 1,
            error: None,
            res: JobResult::new(),
        }
    }

    #[test]
    fn sequential_wraps_and_one_pass_ends() {
        let p = plan(Rw::Write, 3, false);
        let mut s = state(Some(5));
        let got: Vec<_> = std::iter::from_fn(|| s.next_io(&p)).collect();
        assert_eq!(
            got,
            vec![(false, 0), (false, 1), (false, 2), (false, 0), (false, 1)]
        );
    }

    #[test]
    fn one_random_pass_visits_every_unit_once() {
        for units in [1u64, 2, 7, 64, 1000] {
            let p = plan(Rw::Randwrite, units, false);
            let mut s = state(Some(units));
            let mask = units.next_power_of_two() - 1;
            s.perm = Some((3 & mask, mask, 0x1234_5679));
            let mut got: Vec<u64> = std::iter::from_fn(|| s.next_io(&p))
                .map(|(_, u)| u)
                .collect();
            got.sort_unstable();
            assert_eq!(got, (0..units).collect::<Vec<_>>(), "{units} units");
        }
    }

    #[test]
    fn random_stays_in_region_and_mix_is_respected() {
        let mut p = plan(Rw::Randrw, 1000, false);
        Arc::get_mut(&mut p.w).unwrap().mix = 70;
        let mut s = state(None);
        let mut reads = 0;
        for _ in 0..10_000 {
            let (r, u) = s.next_io(&p).unwrap();
            assert!(u < 1000);
            reads += u32::from(r);
        }
        assert!(
            (6500..7500).contains(&reads),
            "{reads} reads of 10000 at mix 70"
        );
    }

    #[test]
    fn verify_avoids_units_in_flight() {
        let p = plan(Rw::Randwrite, 2, true);
        let mut s = state(None);
        let (_, a) = s.next_io(&p).unwrap();
        let (_, b) = s.next_io(&p).unwrap();
        assert_ne!(a, b, "with two units, the second I/O takes the free one");
        s.release(a);
        assert_eq!(s.inflight, vec![b]);
        s.mark_written(130);
        assert!(s.is_written(130) && !s.is_written(131));
    }
}

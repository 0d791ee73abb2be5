//! One measurement of one target: open it, start a thread per job, release
//! them together, sample CPU time at the edges of the measured window, and
//! merge the jobs' histograms into a [`Summary`].

use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use blockdev::BlockDevice;
use nvmf_host::Controller;
use tokio::sync::{mpsc, watch};

use crate::backend::{DevIo, JobIo, TcpIo};
use crate::engine::{self, JobPlan, JobResult, Live, Shared, VerifyCounts};
use crate::open::{Device, Opened, open};
use crate::progress::Progress;
use crate::spec::{self, Rw, Target, Workload};
use crate::stats::{self, Cpu, Rates, Summary, VerifySummary};

/// Runs `w` against `target` and measures it. Blocks the calling thread;
/// the jobs run on threads of their own.
pub fn run_workload(target: &Target, w: &Workload) -> Result<Summary> {
    // The main thread (progress, admin queue, keep-alive) and the helper
    // threads it starts stay on the bench CPUs, away from a pinned target.
    engine::pin_to(&w.cpus)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the bench runtime")?;
    let prefill = prefill_workload(target, w)?;
    let dev = rt.block_on(open(target, w))?;
    let r = match prefill {
        None => rt.block_on(drive(&dev, target, w)),
        Some(p) => rt
            .block_on(drive(&dev, target, &p))
            .context("--prefill")
            .and_then(|_| rt.block_on(drive(&dev, target, w))),
    };
    match dev.opened {
        Opened::Tcp { ctrl, .. } => {
            if let Some(c) = Arc::into_inner(ctrl)
                && let Err(e) = rt.block_on(c.disconnect())
            {
                tracing::warn!("disconnect from {target}: {e}");
            }
        }
        Opened::Dev(d) => {
            if let Err(e) = d.shutdown() {
                tracing::warn!("closing {target}: {e}");
            }
        }
        Opened::Remote(d) => {
            if let Err(e) = d.shutdown() {
                tracing::warn!("closing {target}: {e}");
            }
        }
    }
    r
}

/// `--prefill`: one sequential pass of large writes over the region first, so
/// that reads return stored data (a fresh `mem:` device reads as zeroes without
/// touching memory, which would flatter the in-process numbers).
fn prefill_workload(target: &Target, w: &Workload) -> Result<Option<Workload>> {
    if !w.prefill {
        return Ok(None);
    }
    if matches!(target, Target::Tcp { .. }) {
        bail!(
            "--prefill is for file: and mem: targets; fill a tcp:// namespace with a write run first \
             (e.g. --rw write --bs 128k --size ...)"
        );
    }
    let bs = if w.bs.is_multiple_of(128 << 10) {
        w.bs
    } else if (128 << 10) % w.bs == 0 {
        128 << 10
    } else {
        w.bs
    };
    Ok(Some(Workload {
        rw: Rw::Write,
        bs,
        qd: w.qd.min(16),
        runtime: None,
        ramp: Duration::ZERO,
        rate_iops: None,
        verify: false,
        prefill: false,
        progress: false,
        ..w.clone()
    }))
}

enum Msg {
    Ready(usize, Result<()>),
    MainDone,
    Finished(usize, Box<Result<JobResult>>),
}

enum Source {
    Tcp {
        ctrl: Arc<Controller>,
        nsid: u32,
        qid: u16,
    },
    Dev(Arc<dyn BlockDevice>),
}

async fn drive(d: &Device, target: &Target, w: &Workload) -> Result<Summary> {
    if !w.bs.is_multiple_of(d.lba_size) {
        bail!(
            "--bs {} is not a multiple of the target's {}-byte LBAs",
            w.bs,
            d.lba_size
        );
    }
    let per_io = u64::from(w.bs / d.lba_size);
    let capacity = d.num_blocks * u64::from(d.lba_size);
    let region_lbas = match w.size {
        Some(sz) if sz > capacity => bail!(
            "--size {} is larger than the target ({} bytes)",
            spec::human_bytes(sz),
            capacity
        ),
        Some(sz) => sz / u64::from(d.lba_size),
        None => d.num_blocks,
    };
    let jobs = w.jobs as usize;
    let units = region_lbas / jobs as u64 / per_io;
    if units == 0 {
        bail!(
            "the region ({} bytes) split over {} jobs leaves less than one {}-byte I/O per job",
            region_lbas * u64::from(d.lba_size),
            jobs,
            w.bs
        );
    }
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        live: (0..jobs).map(|_| Live::default()).collect(),
    });
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (start_tx, start_rx) = watch::channel::<Option<Instant>>(None);
    let wa = Arc::new(w.clone());
    let mut threads = Vec::with_capacity(jobs);
    for j in 0..jobs {
        let now = Instant::now();
        let plan = JobPlan {
            index: j,
            w: wa.clone(),
            cpu: (!w.cpus.is_empty()).then(|| w.cpus[j % w.cpus.len()]),
            region_lba: j as u64 * units * per_io,
            region_units: units,
            lba_size: d.lba_size,
            start: now,
            measure_from: now,
            rate_interval: w
                .rate_iops
                .map(|r| Duration::from_secs_f64(jobs as f64 / r as f64)),
        };
        let src = match &d.opened {
            Opened::Tcp { ctrl, nsid } => Source::Tcp {
                ctrl: ctrl.clone(),
                nsid: *nsid,
                qid: (j + 1) as u16,
            },
            Opened::Dev(dev) => Source::Dev(dev.clone()),
            Opened::Remote(dev) => Source::Dev(dev.clone()),
        };
        let (shared, start_rx, tx) = (shared.clone(), start_rx.clone(), tx.clone());
        let h = std::thread::Builder::new()
            .name(format!("fp-bench-{j}"))
            .spawn(move || job_thread(src, plan, shared, start_rx, tx))
            .context("cannot start a bench thread")?;
        threads.push(h);
    }
    drop(tx);
    let abort = |shared: &Shared, start_tx: &watch::Sender<Option<Instant>>| {
        shared.stop.store(true, Relaxed);
        let _ = start_tx.send(Some(Instant::now()));
    };

    let mut ready = 0;
    while ready < jobs {
        match rx.recv().await {
            Some(Msg::Ready(_, Ok(()))) => ready += 1,
            Some(Msg::Ready(j, Err(e))) => {
                abort(&shared, &start_tx);
                join(threads);
                return Err(e.context(format!("job {j} could not start")));
            }
            Some(_) => {}
            None => {
                join(threads);
                bail!("bench jobs ended before starting");
            }
        }
    }

    let start = Instant::now();
    let _ = start_tx.send(Some(start));
    let measure_from = start + w.ramp;
    let stop_at = w.runtime.map(|r| measure_from + r);
    let total = stop_at.map(|s| s.duration_since(start));
    let cpu_sample = || -> Result<CpuSample> {
        let t = match w.target_pid.as_slice() {
            [] => None,
            pids => Some(
                pids.iter()
                    .map(|&p| stats::process_cpu_seconds(p))
                    .sum::<Result<f64>>()?,
            ),
        };
        Ok(CpuSample {
            bench: stats::self_cpu_seconds(),
            target: t,
            machine: stats::machine_busy_seconds(),
            load: stats::load_average(),
        })
    };
    let mut cpu0 = None;
    let mut cpu1 = None;
    let mut progress = Progress::new(w, &shared, start);
    let mut next_tick = start + Duration::from_secs(1);
    let mut stopped = false;
    let mut main_done = 0;
    let mut results: Vec<Option<Result<JobResult>>> = (0..jobs).map(|_| None).collect();
    let mut finished = 0;
    while finished < jobs {
        let mut deadline = next_tick;
        if cpu0.is_none() {
            deadline = deadline.min(measure_from);
        }
        if let (Some(s), false) = (stop_at, stopped) {
            deadline = deadline.min(s);
        }
        tokio::select! {
            m = rx.recv() => match m {
                Some(Msg::MainDone) => {
                    main_done += 1;
                    if main_done == jobs {
                        if cpu0.is_none() {
                            cpu0 = Some(cpu_sample()?);
                        }
                        cpu1 = Some(cpu_sample()?);
                    }
                }
                Some(Msg::Finished(j, r)) => {
                    if r.is_err() {
                        shared.stop.store(true, Relaxed);
                    }
                    results[j] = Some(*r);
                    finished += 1;
                }
                Some(Msg::Ready(..)) => {}
                None => break,
            },
            _ = tokio::time::sleep_until(deadline.into()) => {
                let now = Instant::now();
                if cpu0.is_none() && now >= measure_from {
                    cpu0 = Some(cpu_sample()?);
                }
                if let Some(s) = stop_at && !stopped && now >= s {
                    stopped = true;
                    shared.stop.store(true, Relaxed);
                }
                if now >= next_tick {
                    progress.tick(now, measure_from, total);
                    next_tick += Duration::from_secs(1);
                }
            }
        }
    }
    progress.finish();
    join(threads);

    let mut read = engine::new_histogram();
    let mut write = engine::new_histogram();
    let (mut read_bytes, mut write_bytes) = (0, 0);
    let mut last_done = measure_from;
    let mut vc = VerifyCounts::default();
    for (j, r) in results.into_iter().enumerate() {
        let r = r.with_context(|| format!("job {j} sent no result"))?;
        let r = r?;
        read.add(&r.read).context("merging histograms")?;
        write.add(&r.write).context("merging histograms")?;
        read_bytes += r.read_bytes;
        write_bytes += r.write_bytes;
        if let Some(t) = r.last_done {
            last_done = last_done.max(t);
        }
        vc.checked_blocks += r.verify.checked_blocks;
        vc.skipped_blocks += r.verify.skipped_blocks;
        vc.readback_blocks += r.verify.readback_blocks;
        vc.mismatches += r.verify.mismatches;
        vc.first.extend(r.verify.first);
    }
    vc.first.sort_by_key(|(lba, _)| *lba);
    vc.first.truncate(10);
    let elapsed = last_done
        .saturating_duration_since(measure_from)
        .as_secs_f64();
    if read.is_empty() && write.is_empty() {
        bail!("no I/O completed after the ramp; lengthen --runtime or shorten --ramp");
    }
    let mut all = read.clone();
    all.add(&write).context("merging histograms")?;
    let ios = all.len();
    let (c0, c1) = (cpu0.unwrap_or_default(), cpu1.unwrap_or_default());
    let per_mio = |s: f64| s / (ios as f64 / 1e6);
    let bench_s = c1.bench - c0.bench;
    let target_s = match (c0.target, c1.target) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    // A tcp:// target's own work is only known with --target-pid; without
    // it, it would count as other work.
    let target_known = target_s.is_some() || !matches!(target, Target::Tcp { .. });
    let other_s = match (c0.machine, c1.machine) {
        (Some(a), Some(b)) if target_known => {
            Some((b - a - bench_s - target_s.unwrap_or(0.0)).max(0.0))
        }
        _ => None,
    };
    let mixed = !read.is_empty() && !write.is_empty();
    Ok(Summary {
        target: target.to_string(),
        target_detail: match &d.opened {
            // Described now: a RAM device tells how much it holds after the run.
            Opened::Dev(dev) => dev.describe(),
            Opened::Tcp { .. } => d.detail.clone(),
            // What the link went through: a run that rode out an outage says so.
            Opened::Remote(dev) => format!(
                "{}; {} connection{} made",
                d.detail,
                dev.connects(),
                if dev.connects() == 1 { "" } else { "s" }
            ),
        },
        workload: w.clone(),
        elapsed_s: elapsed,
        all: Rates::of(&all, read_bytes + write_bytes, elapsed),
        read: mixed.then(|| Rates::of(&read, read_bytes, elapsed)),
        write: mixed.then(|| Rates::of(&write, write_bytes, elapsed)),
        offered_iops: w.rate_iops,
        cpu: Cpu {
            bench_s,
            bench_s_per_million_ios: per_mio(bench_s),
            target_s,
            target_s_per_million_ios: target_s.map(per_mio),
            other_s,
            load_1m: c0.load,
        },
        verify: w.verify.then(|| VerifySummary::of(w.seed, &vc)),
        rounds: None,
    })
}

/// CPU time at one instant: this process, the target, the whole machine.
#[derive(Default, Clone, Copy)]
struct CpuSample {
    bench: f64,
    target: Option<f64>,
    machine: Option<f64>,
    load: Option<f64>,
}

fn join(threads: Vec<std::thread::JoinHandle<()>>) {
    for t in threads {
        let _ = t.join();
    }
}

fn job_thread(
    src: Source,
    plan: JobPlan,
    shared: Arc<Shared>,
    start_rx: watch::Receiver<Option<Instant>>,
    tx: mpsc::UnboundedSender<Msg>,
) {
    let idx = plan.index;
    let setup = || -> Result<(tokio::runtime::Runtime, tokio::task::LocalSet)> {
        if let Some(c) = plan.cpu {
            engine::pin_to(&[c])?;
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start a job runtime")?;
        Ok((rt, tokio::task::LocalSet::new()))
    };
    let (rt, local) = match setup() {
        Ok(x) => x,
        Err(e) => {
            let _ = tx.send(Msg::Ready(idx, Err(e)));
            return;
        }
    };
    local.block_on(&rt, async move {
        match src {
            Source::Tcp { ctrl, nsid, qid } => {
                let q = match ctrl.add_io_queue(qid).await {
                    Ok(q) => q,
                    Err(e) => {
                        let _ = tx.send(Msg::Ready(idx, Err(e.into())));
                        return;
                    }
                };
                drop(ctrl);
                job(Rc::new(TcpIo { q, nsid }), plan, shared, start_rx, tx).await;
            }
            Source::Dev(dev) => job(Rc::new(DevIo { dev }), plan, shared, start_rx, tx).await,
        }
    });
}

async fn job<I: JobIo + 'static>(
    io: Rc<I>,
    mut plan: JobPlan,
    shared: Arc<Shared>,
    mut start_rx: watch::Receiver<Option<Instant>>,
    tx: mpsc::UnboundedSender<Msg>,
) {
    let idx = plan.index;
    let _ = tx.send(Msg::Ready(idx, Ok(())));
    let start = match start_rx.wait_for(Option::is_some).await {
        Ok(s) => s.expect("waited for Some"),
        Err(_) => return,
    };
    plan.start = start;
    plan.measure_from = start + plan.w.ramp;
    let done_tx = tx.clone();
    let r = engine::run_job(io, Rc::new(plan), shared, move || {
        let _ = done_tx.send(Msg::MainDone);
    })
    .await;
    let _ = tx.send(Msg::Finished(idx, Box::new(r)));
}

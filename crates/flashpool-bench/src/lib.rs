//! `flashpool bench`: a load generator in the spirit of fio, against an
//! NVMe/TCP namespace (`tcp://`), a local file or block device through
//! io_uring with O_DIRECT (`file:`), or RAM in this process (`mem:`).
//!
//! [`run_workload`] is the whole measurement of one target; the CLI is a thin
//! layer over it, so a comparison across targets can call it in a loop.

mod backend;
mod engine;
mod report;
mod rounds;
mod spec;
mod stats;
mod verify;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use blockdev::{BlockDevice, FileDevice, FileOptions, MemDevice};
use nvmf_host::remote::{RemoteDevice, RemoteOptions};
use nvmf_host::{Controller, HostOptions};
use tokio::sync::{mpsc, watch};

use backend::{DevIo, JobIo, TcpIo};
use engine::{JobPlan, JobResult, Live, Shared, VerifyCounts};
pub use report::Matrix;
pub use spec::{Engine, Rw, Target, Workload};
pub use stats::Summary;
use stats::{Cpu, Rates, VerifySummary};

use crate::output::out;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// What to load: tcp://ADDR:PORT/NQN[?nsid=N], file:PATH (io_uring, O_DIRECT) or mem:SIZE (in process).
    #[arg(long, required_unless_present = "compare", conflicts_with = "compare")]
    target: Option<String>,
    /// Run --matrix on each of these targets (2 or more, same forms as --target) and write a
    /// report to --report; the first target is the baseline of the ratios.
    #[arg(long, num_args = 2.., value_name = "TARGET", requires = "matrix")]
    compare: Vec<String>,
    /// With --compare: the workloads to run on each target (docs/bench.md).
    #[arg(long, value_enum, requires = "compare")]
    matrix: Option<Matrix>,
    /// With --compare: directory for report.md, report.html, results.json and charts/ [default: bench-report].
    #[arg(long, value_name = "DIR", requires = "compare")]
    report: Option<PathBuf>,
    /// With --compare: offered loads in the latency sweep, rising geometrically from 10% to 120%
    /// of the IOPS the target reached in the matrix's 4 KiB random read cell.
    #[arg(long, value_name = "N", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(2..=32), requires = "compare")]
    sweep_steps: u32,
    /// I/O pattern (fixed by --matrix).
    #[arg(
        long,
        value_enum,
        default_value = "randread",
        conflicts_with = "matrix"
    )]
    rw: Rw,
    /// Percentage of reads for --rw randrw.
    #[arg(long, default_value_t = 70, value_parser = clap::value_parser!(u8).range(0..=100),
          conflicts_with = "matrix")]
    mix: u8,
    /// Bytes per I/O (4k, 128k, ...): a multiple of the target's LBA size (fixed by --matrix).
    #[arg(long, default_value = "4k", conflicts_with = "matrix")]
    bs: String,
    /// I/Os in flight per job (fixed by --matrix).
    #[arg(long, default_value_t = 32, conflicts_with = "matrix")]
    qd: u32,
    /// Jobs: one I/O queue (TCP connection) each for tcp://, one task each for file: and mem:
    /// (fixed by --matrix).
    #[arg(long, default_value_t = 1, conflicts_with = "matrix")]
    jobs: u32,
    /// Measured run time (10s, 500ms, 2m). Default 10s, or one pass over --size when that is given;
    /// with --compare, per cell, default 5s.
    #[arg(long)]
    runtime: Option<String>,
    /// Use the first SIZE bytes of the target (split among the jobs); without --runtime, one pass over them.
    #[arg(long)]
    size: Option<String>,
    /// Run this long before measuring [default: 0s; 1s per cell with --compare].
    #[arg(long)]
    ramp: Option<String>,
    /// Offered load in I/Os per second for all jobs together (open loop; --matrix sets its own).
    #[arg(long, conflicts_with = "matrix")]
    rate_iops: Option<u64>,
    /// Stamp written blocks (LBA, seed, CRC32C) and check every read; a mismatch fails the run.
    #[arg(long)]
    verify: bool,
    /// Seed for --verify; give the seed of the run that wrote the blocks to check them in a later run.
    #[arg(long)]
    seed: Option<String>,
    /// CPUs for the jobs, e.g. 1 or 2-3 (job i on the i-th listed CPU, round robin).
    #[arg(long)]
    cpus: Option<String>,
    /// Also write the summary, histograms included, as JSON to FILE (--compare writes results.json).
    #[arg(long, conflicts_with = "compare")]
    json: Option<PathBuf>,
    /// Also report the CPU time of this process (the target's), from /proc/PID/stat
    /// (with --compare: for the tcp:// targets).
    #[arg(long)]
    target_pid: Option<u32>,
    /// tcp: ask for header digests.
    #[arg(long)]
    hdr_digest: bool,
    /// tcp: ask for data digests.
    #[arg(long)]
    data_digest: bool,
    /// tcp: keep polling the socket for this many microseconds after activity instead of
    /// sleeping (saves the wake-up of an idle CPU; burns the bench CPU while it polls).
    #[arg(long, default_value_t = 0)]
    poll_us: u32,
    /// Run the workload this many times, each after its own ramp, and report the
    /// median round (by IOPS) with every round and the spread; a round that
    /// overlapped other work on the machine runs once more.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20),
          conflicts_with = "compare")]
    rounds: u32,
    /// tcp: put at most this much write data in a command capsule (less if the
    /// target's IOCCSZ allows less); larger writes go by R2T and H2CData. 0: every
    /// write by R2T. [default: what the target allows]
    #[arg(long, value_name = "BYTES", value_parser = parse_in_capsule)]
    in_capsule: Option<u32>,
    /// tcp: hand each PDU to the kernel in a write of its own, the way a client
    /// that does not batch sends (default: one writev for whatever is queued).
    #[arg(long)]
    pdu_per_write: bool,
    /// tcp: how the jobs reach the target: `queue`, one I/O queue per job on the job's own
    /// thread; `remote`, one shared RemoteDevice (the path volumes take to remote drives:
    /// queues on its own runtime, keep-alive, timeouts, reconnect with one retry).
    #[arg(long, value_enum, default_value = "queue")]
    engine: Engine,
    /// --engine remote: I/O queues (TCP connections) of the shared device [default: --jobs].
    #[arg(long)]
    queues: Option<u32>,
    /// --engine remote: unreachable this long, the device fails its I/O [default: 2s, as a
    /// volume's remote member]; a run rides out a shorter outage (reconnect, one retry).
    #[arg(long, value_name = "DURATION")]
    fail_after: Option<String>,
    /// tcp: host NQN to connect as (default: /etc/nvme/hostnqn or one derived from the machine id).
    #[arg(long)]
    hostnqn: Option<String>,
    /// tcp: authenticate with DH-HMAC-CHAP, with the secret in this file (`DHHC-1:...`, as
    /// `nvme gen-dhchap-key` prints it; mode 0600), for the host NQN of --hostnqn.
    #[arg(long, value_name = "FILE")]
    dhchap_key_file: Option<std::path::PathBuf>,
    /// tcp: also authenticate the target (bidirectional) with the controller secret in this file.
    #[arg(long, value_name = "FILE", requires = "dhchap_key_file")]
    dhchap_ctrl_key_file: Option<std::path::PathBuf>,
    /// tcp: connect over TLS 1.3 (TP 8011) with the configured PSK in this file
    /// (`NVMeTLSkey-1:...`, as `nvme gen-tls-key` prints it; mode 0600), for --hostnqn.
    #[arg(long, value_name = "FILE")]
    tls_key_file: Option<std::path::PathBuf>,
    /// tcp: the TLS PSK identity version to offer: 0 (`NVMe0Rhh host sub`) or 1 (with the
    /// PSK digest).
    #[arg(long, value_name = "0|1", default_value_t = 0, requires = "tls_key_file",
          value_parser = clap::value_parser!(u8).range(0..=1))]
    tls_identity: u8,
    /// tcp: derive the TLS PSK as libnvme before 1.16 does (nvme-cli up to 2.15, e.g. Debian
    /// 13), for a Linux nvmet target whose key was inserted by such an nvme-cli.
    #[arg(long, requires = "tls_key_file")]
    tls_compat: bool,
    /// file:/mem: write the region once before the run, so that reads return stored data.
    /// With --compare: every target, tcp:// included, is written once before it is read.
    #[arg(long)]
    prefill: bool,
    /// No progress line.
    #[arg(long, short)]
    quiet: bool,
}

/// `--in-capsule`: a size ("8k", "4096", "0").
fn parse_in_capsule(s: &str) -> std::result::Result<u32, String> {
    let n = spec::parse_size(s).map_err(|e| e.to_string())?;
    u32::try_from(n).map_err(|_| format!("{s} is more than a capsule can hold"))
}

impl BenchArgs {
    /// The workload of a single run, or (`compare`) the base each matrix cell overrides.
    fn workload_for(&self, compare: bool) -> Result<Workload> {
        let bs = spec::parse_size(&self.bs).context("--bs")?;
        if bs == 0 || !bs.is_multiple_of(512) || bs > 16 << 20 {
            bail!("--bs {} must be a multiple of 512 bytes up to 16M", self.bs);
        }
        if !(1..=1024).contains(&self.qd) {
            bail!("--qd {} is out of range; use 1 to 1024", self.qd);
        }
        if !(1..=256).contains(&self.jobs) {
            bail!("--jobs {} is out of range; use 1 to 256", self.jobs);
        }
        let size = self
            .size
            .as_deref()
            .map(spec::parse_size)
            .transpose()
            .context("--size")?;
        let runtime = match (&self.runtime, size) {
            (Some(r), _) => Some(spec::parse_duration(r).context("--runtime")?),
            (None, _) if compare => Some(Duration::from_secs(5)),
            (None, Some(_)) => None,
            (None, None) => Some(Duration::from_secs(10)),
        };
        if runtime.is_some_and(|r| r.is_zero()) {
            bail!("--runtime must be above zero");
        }
        if self.rate_iops == Some(0) {
            bail!("--rate-iops must be above zero (leave it out for no limit)");
        }
        let (queues, fail_after) = self.engine_options()?;
        let seed = match &self.seed {
            Some(s) => {
                let t = s.trim();
                let v = match t.strip_prefix("0x") {
                    Some(h) => u64::from_str_radix(h, 16),
                    None => t.parse(),
                };
                v.ok()
                    .with_context(|| format!("--seed {s:?} is not a number (decimal or 0x hex)"))?
            }
            None => {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64);
                t ^ (u64::from(std::process::id()) << 32)
            }
        };
        Ok(Workload {
            rw: self.rw,
            mix: self.mix,
            bs: bs as u32,
            qd: self.qd,
            jobs: self.jobs,
            runtime,
            size,
            ramp: match &self.ramp {
                Some(r) => spec::parse_duration(r).context("--ramp")?,
                None if compare => Duration::from_secs(1),
                None => Duration::ZERO,
            },
            rate_iops: self.rate_iops,
            verify: self.verify,
            seed,
            seed_given: self.seed.is_some(),
            cpus: self
                .cpus
                .as_deref()
                .map(spec::parse_cpus)
                .transpose()?
                .unwrap_or_default(),
            target_pid: self.target_pid,
            hdr_digest: self.hdr_digest,
            data_digest: self.data_digest,
            hostnqn: self.hostnqn.clone(),
            dhchap: crate::config::auth::key_pair(
                "bench",
                self.dhchap_key_file.as_deref(),
                self.dhchap_ctrl_key_file.as_deref(),
            )
            .map_err(|e| {
                // The config's wording, with the option's name.
                anyhow::anyhow!(
                    "{}",
                    e.to_string()
                        .replace("config: bench.dhchap_key_file", "--dhchap-key-file")
                        .replace(
                            "config: bench.dhchap_ctrl_key_file",
                            "--dhchap-ctrl-key-file"
                        )
                )
            })?
            .map(|(h, c)| nvmf_host::DhchapKeys::new(h, c)),
            tls: self
                .tls_key_file
                .as_deref()
                .map(|p| {
                    crate::config::tls::read_psk("--tls-key-file", p)
                        .map_err(|e| anyhow::anyhow!("{}", e.to_string().replace("config: ", "")))
                })
                .transpose()?
                .map(|key| nvmf_host::TlsKey {
                    key: key.with_derivation(if self.tls_compat {
                        nvme_wire::tls_psk::Derivation::LibnvmeCompat
                    } else {
                        nvme_wire::tls_psk::Derivation::Rfc8446
                    }),
                    identity_version: self.tls_identity,
                }),
            poll_us: self.poll_us,
            in_capsule: self.in_capsule,
            pdu_per_write: self.pdu_per_write,
            engine: self.engine,
            queues,
            fail_after,
            prefill: self.prefill,
            progress: !self.quiet,
        })
    }
}

impl BenchArgs {
    /// `--queues` and `--fail-after`, and the options the engine does not take.
    fn engine_options(&self) -> Result<(Option<u32>, Option<Duration>)> {
        match self.engine {
            Engine::Queue => {
                for (given, opt) in [
                    (self.queues.is_some(), "--queues"),
                    (self.fail_after.is_some(), "--fail-after"),
                ] {
                    if given {
                        bail!(
                            "{opt} is for --engine remote; the default queue engine opens one \
                             I/O queue per job (--jobs) and has no reconnect"
                        );
                    }
                }
                Ok((None, None))
            }
            Engine::Remote => {
                if self.poll_us > 0 {
                    bail!(
                        "--poll-us {} is per-job socket polling of the queue engine; with \
                         --engine remote the device's queues run on its own runtime and do not \
                         poll: leave --poll-us out (or use --engine queue)",
                        self.poll_us
                    );
                }
                for (given, opt) in [
                    (self.pdu_per_write, "--pdu-per-write"),
                    (self.in_capsule.is_some(), "--in-capsule"),
                ] {
                    if given {
                        bail!(
                            "{opt} shapes the sends of the queue engine's own connections; \
                             --engine remote sends as a volume's remote drive does: leave {opt} \
                             out (or use --engine queue)"
                        );
                    }
                }
                if let Some(q) = self.queues
                    && !(1..=256).contains(&q)
                {
                    bail!("--queues {q} is out of range; use 1 to 256");
                }
                let fail_after = self
                    .fail_after
                    .as_deref()
                    .map(spec::parse_duration)
                    .transpose()
                    .context("--fail-after")?;
                if fail_after.is_some_and(|d| d.is_zero()) {
                    bail!("--fail-after must be above zero");
                }
                Ok((self.queues, fail_after))
            }
        }
    }
}

/// `flashpool bench ...`
pub fn run(args: BenchArgs) -> Result<()> {
    if !args.compare.is_empty() {
        let matrix = args
            .matrix
            .context("--compare needs --matrix (the only one: seeds)")?;
        return report::run(&args, matrix);
    }
    if args.matrix.is_some() {
        // clap lets this through: --compare, which --matrix requires, conflicts with --target.
        bail!(
            "--matrix is for --compare A B ...; for one --target give --rw, --bs, --qd and --jobs"
        );
    }
    let target = Target::parse(
        args.target
            .as_deref()
            .context("give --target, or --compare A B ... --matrix seeds")?,
    )?;
    let w = args.workload_for(false)?;
    if w.engine == Engine::Remote && !matches!(target, Target::Tcp { .. }) {
        bail!(
            "--engine remote is for tcp:// targets ({target} is local: its jobs already share one \
             BlockDevice)"
        );
    }
    let summary = rounds::run(args.rounds, || run_workload(&target, &w))?;
    out!("{}", summary.render());
    if let Some(p) = &args.json {
        summary.write_json(p)?;
    }
    if summary.verify_failed()
        && let Some(v) = &summary.verify
    {
        let first = v.first.first().map_or(String::new(), |m| {
            format!(", first at LBA {}: {}", m.lba, m.message)
        });
        bail!(
            "verify failed: {} mismatching block{}{first}",
            v.mismatches,
            if v.mismatches == 1 { "" } else { "s" }
        );
    }
    Ok(())
}

/// The target, opened.
enum Opened {
    Tcp {
        ctrl: Arc<Controller>,
        nsid: u32,
    },
    Dev(Arc<dyn BlockDevice>),
    /// `--engine remote`: the jobs share it as a `BlockDevice`.
    Remote(Arc<RemoteDevice>),
}

struct Device {
    opened: Opened,
    lba_size: u32,
    num_blocks: u64,
    detail: String,
}

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

async fn open(target: &Target, w: &Workload) -> Result<Device> {
    // Local devices: 4 KiB blocks when the I/O size allows (O_DIRECT on 4Kn drives), else 512.
    let local_bs = if w.bs.is_multiple_of(4096) { 4096 } else { 512 };
    match target {
        Target::Tcp { addr, nqn, nsid } if w.engine == Engine::Remote => {
            open_remote(target, w, *addr, nqn, *nsid).await
        }
        Target::Tcp { addr, nqn, nsid } => {
            let mut o = HostOptions {
                hdr_digest: w.hdr_digest,
                data_digest: w.data_digest,
                nr_io_queues: w.jobs.min(u32::from(u16::MAX)) as u16,
                queue_depth: w.qd.clamp(2, u32::from(u16::MAX)) as u16,
                lazy_io_queues: true,
                poll_us: w.poll_us,
                in_capsule_max: w.in_capsule,
                pdu_per_write: w.pdu_per_write,
                ..HostOptions::default()
            };
            if let Some(h) = &w.hostnqn {
                o.hostnqn = h.clone();
            }
            o.dhchap = w.dhchap.clone();
            o.tls = w.tls.clone();
            let ctrl = Controller::connect(*addr, nqn, o).await?;
            if u32::from(ctrl.granted_io_queues()) < w.jobs {
                bail!(
                    "{target}: the target grants {} I/O queues, --jobs {} needs one each; lower --jobs \
                     (or raise the target's transport.max_io_queues)",
                    ctrl.granted_io_queues(),
                    w.jobs
                );
            }
            if u32::from(ctrl.io_queue_depth()) < w.qd {
                bail!(
                    "{target}: the target takes at most {} commands per queue, --qd {} is more; lower --qd \
                     (or raise the target's transport.max_queue_depth)",
                    ctrl.io_queue_depth(),
                    w.qd
                );
            }
            let nsid =
                match nsid {
                    Some(n) => *n,
                    None => *ctrl.active_namespaces().await?.first().with_context(|| {
                        format!("{target}: the subsystem has no active namespace")
                    })?,
                };
            let ns = ctrl.identify_namespace(nsid).await?;
            let info = ctrl.info();
            let (hd, dd) = ctrl.digests();
            let onoff = |b: bool| if b { "on" } else { "off" };
            let detail = format!(
                "NVMe/TCP {addr} {nqn} nsid {nsid}: {}, {} B LBAs; controller {} \"{}\" serial {}; \
                 digests header {} data {}; in-capsule {} B, MAXH2CDATA {} B",
                spec::human_bytes(ns.size_bytes()),
                ns.lba_size,
                ctrl.cntlid(),
                info.model,
                info.serial,
                onoff(hd),
                onoff(dd),
                info.in_capsule_data(),
                ctrl.max_h2c_data()
            );
            if let Some(mt) = info.max_transfer()
                && u64::from(w.bs) > mt
            {
                bail!(
                    "{target}: --bs {} is over the controller's largest transfer ({mt} bytes, MDTS)",
                    w.bs
                );
            }
            Ok(Device {
                opened: Opened::Tcp {
                    ctrl: Arc::new(ctrl),
                    nsid,
                },
                lba_size: ns.lba_size,
                num_blocks: ns.nsze,
                detail,
            })
        }
        Target::File(path) => {
            let dev = FileDevice::open(FileOptions {
                path: path.clone(),
                size: None,
                block_size: local_bs,
                create: false,
            })
            .with_context(|| format!("{target}"))?;
            Ok(local(Arc::new(dev)))
        }
        Target::Mem(size) => {
            let size = size - size % u64::from(local_bs);
            let dev = MemDevice::new(size, local_bs).with_context(|| format!("{target}"))?;
            Ok(local(Arc::new(dev)))
        }
    }
}

/// `--engine remote`: one `RemoteDevice` for all jobs, with the options a
/// volume's remote member gets unless the command line says otherwise.
async fn open_remote(
    target: &Target,
    w: &Workload,
    addr: std::net::SocketAddr,
    nqn: &str,
    nsid: Option<u32>,
) -> Result<Device> {
    let queues = w.queues.unwrap_or(w.jobs);
    let mut o = RemoteOptions {
        io_queues: queues.min(u32::from(u16::MAX)) as u16,
        ..RemoteOptions::default()
    };
    // Every job's I/Os at once fit in the queues (more would wait for a slot);
    // the connect clamps this to what the target takes (CAP.MQES).
    let depth = (w.qd * w.jobs)
        .div_ceil(queues)
        .clamp(2, u32::from(u16::MAX));
    o.host.queue_depth = (depth as u16).max(o.host.queue_depth);
    o.host.hdr_digest = w.hdr_digest;
    o.host.data_digest = w.data_digest;
    if let Some(h) = &w.hostnqn {
        o.host.hostnqn = h.clone();
    }
    o.host.dhchap = w.dhchap.clone();
    o.host.tls = w.tls.clone();
    if let Some(f) = w.fail_after {
        o.fail_after = f;
    }
    let fail_after = o.fail_after;
    let url = format!("tcp://{addr}/{nqn}?nsid={}", nsid.unwrap_or(1));
    let dev = RemoteDevice::connect(&url, o)
        .await
        .with_context(|| format!("{target}: --engine remote"))?;
    if (dev.io_queues() as u32) < queues {
        bail!(
            "{target}: the target grants {} I/O queues, --engine remote asked for {queues}; lower \
             --queues (or --jobs), or raise the target's transport.max_io_queues",
            dev.io_queues()
        );
    }
    let g = dev.geometry();
    let detail = format!(
        "{} (engine remote: {} queues shared by {} jobs, {} B LBAs, {}; digests header {} data {}; \
         reservations {}; fail after {:?})",
        dev.describe(),
        dev.io_queues(),
        w.jobs,
        g.block_size,
        spec::human_bytes(g.num_blocks * u64::from(g.block_size)),
        onoff(w.hdr_digest),
        onoff(w.data_digest),
        if dev.supports_reservations() {
            "supported"
        } else {
            "not supported"
        },
        fail_after,
    );
    Ok(Device {
        lba_size: g.block_size,
        num_blocks: g.num_blocks,
        detail,
        opened: Opened::Remote(Arc::new(dev)),
    })
}

fn onoff(b: bool) -> &'static str {
    if b { "on" } else { "off" }
}

fn local(dev: Arc<dyn BlockDevice>) -> Device {
    let g = dev.geometry();
    Device {
        detail: dev.describe(),
        lba_size: g.block_size,
        num_blocks: g.num_blocks,
        opened: Opened::Dev(dev),
    }
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
        let t = w.target_pid.map(stats::process_cpu_seconds).transpose()?;
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

/// The line on stderr, once a second.
struct Progress<'a> {
    on: bool,
    tty: bool,
    shared: &'a Shared,
    start: Instant,
    last: (Instant, u64, u64, u64),
    rw: &'static str,
    printed: bool,
}

impl<'a> Progress<'a> {
    fn new(w: &Workload, shared: &'a Shared, start: Instant) -> Self {
        Progress {
            on: w.progress,
            tty: std::io::stderr().is_terminal(),
            shared,
            start,
            last: (start, 0, 0, 0),
            rw: w.rw.name(),
            printed: false,
        }
    }

    fn totals(&self) -> (u64, u64, u64) {
        self.shared.live.iter().fold((0, 0, 0), |(a, b, c), l| {
            (
                a + l.ios.load(Relaxed),
                b + l.bytes.load(Relaxed),
                c + l.lat_ns.load(Relaxed),
            )
        })
    }

    fn tick(&mut self, now: Instant, measure_from: Instant, total: Option<Duration>) {
        if !self.on {
            return;
        }
        let (ios, bytes, lat) = self.totals();
        let (t0, ios0, bytes0, lat0) = self.last;
        let dt = now.duration_since(t0).as_secs_f64().max(1e-9);
        let dios = ios - ios0;
        let mean_us = if dios > 0 {
            (lat - lat0) as f64 / dios as f64 / 1000.0
        } else {
            0.0
        };
        let elapsed = now.duration_since(self.start).as_secs_f64();
        let of = total.map_or(String::new(), |t| format!("/{:.0}", t.as_secs_f64()));
        let line = format!(
            "[{elapsed:>4.0}{of} s] {} {:>10} IOPS {:>9.1} MB/s  mean {:>8.1} us{}",
            self.rw,
            stats::fmt_thousands(dios as f64 / dt),
            (bytes - bytes0) as f64 / dt / 1e6,
            mean_us,
            if now < measure_from { "  (ramp)" } else { "" }
        );
        let mut e = std::io::stderr().lock();
        let _ = if self.tty {
            write!(e, "\r\x1b[K{line}")
        } else {
            writeln!(e, "{line}")
        };
        let _ = e.flush();
        self.printed = true;
        self.last = (now, ios, bytes, lat);
    }

    fn finish(&self) {
        if self.on && self.tty && self.printed {
            eprintln!();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvmf_target::{
        ListenerConfig, ListenerKind, Namespace, Server, Subsystem, TransportConfig,
    };

    fn quick(rw: Rw) -> Workload {
        Workload {
            rw,
            qd: 8,
            runtime: Some(Duration::from_millis(300)),
            verify: true,
            seed: 0xfeed,
            ..Workload::default()
        }
    }

    #[test]
    fn mem_randrw_verifies_and_reads_back() {
        // Long enough that a loaded machine still reads back blocks written
        // in the same run (300 ms once checked none under a load of 8).
        let w = Workload {
            runtime: Some(Duration::from_secs(1)),
            ..quick(Rw::Randrw)
        };
        let s = run_workload(&Target::Mem(8 << 20), &w).unwrap();
        let v = s.verify.as_ref().unwrap();
        assert_eq!(v.mismatches, 0, "{}", s.render());
        assert!(
            v.checked_blocks > 0 && v.readback_blocks > 0,
            "{}",
            s.render()
        );
        assert!(s.read.is_some() && s.write.is_some());
        assert!(s.all.ios > 0 && s.all.lat.p50_us > 0.0);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["workload"]["rw"], "randrw");
        assert!(
            json["all"]["histogram"]["buckets"]
                .as_array()
                .unwrap()
                .len()
                > 1
        );
    }

    fn server() -> (Server, Target) {
        let dev = Arc::new(MemDevice::new(16 << 20, 512).unwrap());
        let (s, addr) = server_on(dev, "127.0.0.1:0".parse().unwrap());
        let target =
            Target::parse(&format!("tcp://{addr}/nqn.2026-01.io.flashpool:benchtest")).unwrap();
        (s, target)
    }

    /// A target serving `dev` on `addr`; the same `dev` again gives the same namespace
    /// (data and NGUID), as a restarted node would.
    fn server_on(
        dev: Arc<MemDevice>,
        addr: std::net::SocketAddr,
    ) -> (Server, std::net::SocketAddr) {
        let sub = Subsystem::new(
            "nqn.2026-01.io.flashpool:benchtest".into(),
            "BT1".into(),
            "bench test".into(),
            true,
            Vec::new(),
            vec![Namespace::new(1, dev, [1; 16], [2; 16])],
        );
        let t = Arc::new(nvmf_target::Target::new(
            TransportConfig::default(),
            vec![Arc::new(sub)],
        ));
        let s = Server::start(
            t,
            &[ListenerConfig {
                addr,
                kind: ListenerKind::Io,
                tls: nvmf_target::TlsMode::None,
            }],
        )
        .unwrap();
        let addr = s.local_addrs()[0].0;
        (s, addr)
    }

    #[test]
    fn tcp_write_then_verified_read_and_a_seed_mismatch_fails() {
        let (srv, target) = server();
        // One sequential verified pass over 1 MiB with two jobs (two I/O queues), 8 KiB I/Os (R2T path).
        let write = Workload {
            rw: Rw::Write,
            bs: 8192,
            jobs: 2,
            runtime: None,
            size: Some(1 << 20),
            ..quick(Rw::Write)
        };
        let s = run_workload(&target, &write).unwrap();
        let v = s.verify.as_ref().unwrap();
        assert_eq!(s.all.ios, 128, "{}", s.render());
        assert_eq!(
            (v.readback_blocks, v.mismatches),
            (2048, 0),
            "{}",
            s.render()
        );
        // A later run with the same seed checks every block it reads.
        let read = Workload {
            rw: Rw::Randread,
            seed_given: true,
            size: Some(1 << 20),
            ..quick(Rw::Randread)
        };
        let s = run_workload(&target, &read).unwrap();
        let v = s.verify.as_ref().unwrap();
        assert!(v.checked_blocks > 0 && v.mismatches == 0, "{}", s.render());
        // Another seed: every block is stale, and the run fails.
        let s = run_workload(&target, &Workload { seed: 7, ..read }).unwrap();
        assert!(s.verify_failed(), "{}", s.render());
        assert!(s.render().contains("expected 0x7"), "{}", s.render());
        srv.shutdown();
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn refusal(args: &[&str]) -> String {
        use clap::Parser;
        let a = Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
            .unwrap()
            .bench;
        match a.workload_for(false) {
            Err(e) => e.to_string(),
            Ok(_) => run(a).unwrap_err().to_string(),
        }
    }

    #[test]
    fn remote_engine_options_are_checked() {
        let tcp = ["--target", "tcp://127.0.0.1:9/nqn.2026-01.io.flashpool:x"];
        let with = |extra: &[&str]| refusal(&[&tcp[..], extra].concat());
        let e = with(&["--engine", "remote", "--poll-us", "50"]);
        assert!(
            e.contains("--poll-us 50") && e.contains("--engine remote"),
            "{e}"
        );
        for opt in [["--pdu-per-write"].as_slice(), &["--in-capsule", "0"]] {
            let e = with(&[&["--engine", "remote"], opt].concat());
            assert!(e.contains(opt[0]) && e.contains("--engine remote"), "{e}");
        }
        for opt in [["--queues", "2"], ["--fail-after", "5s"]] {
            let e = with(&opt);
            assert!(e.contains(opt[0]) && e.contains("--engine remote"), "{e}");
        }
        let e = with(&["--engine", "remote", "--queues", "0"]);
        assert!(e.contains("--queues 0"), "{e}");
        let e = with(&["--engine", "remote", "--fail-after", "0s"]);
        assert!(e.contains("--fail-after"), "{e}");
        let e = refusal(&["--target", "mem:1M", "--engine", "remote"]);
        assert!(e.contains("tcp://") && e.contains("mem:1 MiB"), "{e}");
        // The default engine and its workload are what they were.
        let w = {
            use clap::Parser;
            Cli::try_parse_from(["bench", tcp[0], tcp[1]])
                .unwrap()
                .bench
        }
        .workload_for(false)
        .unwrap();
        assert_eq!(
            (w.engine, w.queues, w.fail_after, w.poll_us),
            (Engine::Queue, None, None, 0)
        );
    }

    #[test]
    fn remote_engine_writes_what_the_queue_engine_reads() {
        let (srv, target) = server();
        // Three jobs share one RemoteDevice with two queues; 8 KiB I/Os (R2T path).
        let write = Workload {
            rw: Rw::Write,
            bs: 8192,
            jobs: 3,
            engine: Engine::Remote,
            queues: Some(2),
            runtime: None,
            size: Some(3 << 20),
            ..quick(Rw::Write)
        };
        let s = run_workload(&target, &write).unwrap();
        let v = s.verify.as_ref().unwrap();
        assert_eq!(s.all.ios, 384, "{}", s.render());
        assert_eq!(
            (v.readback_blocks, v.mismatches),
            (6144, 0),
            "{}",
            s.render()
        );
        assert!(
            s.target_detail.contains("2 queues shared by 3 jobs")
                && s.target_detail.contains("reservations supported")
                && s.target_detail.ends_with("1 connection made"),
            "{}",
            s.target_detail
        );
        assert!(s.render().contains("(engine remote)"), "{}", s.render());
        // The per-job queue engine reads the same blocks back, and the other way round.
        let read = Workload {
            rw: Rw::Read,
            seed_given: true,
            jobs: 3,
            runtime: None,
            size: Some(3 << 20),
            ..quick(Rw::Read)
        };
        let s = run_workload(&target, &read).unwrap();
        let v = s.verify.as_ref().unwrap();
        assert_eq!(
            (v.checked_blocks, v.mismatches),
            (6144, 0),
            "{}",
            s.render()
        );
        assert!(!s.render().contains("engine"), "{}", s.render());
        let s = run_workload(
            &target,
            &Workload {
                engine: Engine::Remote,
                ..read
            },
        )
        .unwrap();
        let v = s.verify.as_ref().unwrap();
        assert_eq!(
            (v.checked_blocks, v.mismatches),
            (6144, 0),
            "{}",
            s.render()
        );
        srv.shutdown();
    }

    #[test]
    fn remote_engine_rides_out_a_target_restart() {
        let dev = Arc::new(MemDevice::new(16 << 20, 512).unwrap());
        let (srv, addr) = server_on(dev.clone(), "127.0.0.1:0".parse().unwrap());
        let target =
            Target::parse(&format!("tcp://{addr}/nqn.2026-01.io.flashpool:benchtest")).unwrap();
        let w = Workload {
            rw: Rw::Randrw,
            jobs: 2,
            engine: Engine::Remote,
            fail_after: Some(Duration::from_secs(20)),
            runtime: Some(Duration::from_secs(3)),
            size: Some(4 << 20),
            ..quick(Rw::Randrw)
        };
        let run = std::thread::spawn(move || run_workload(&target, &w));
        // The target goes away for a moment in the middle of the run, and comes back
        // on the same address with the same namespace.
        std::thread::sleep(Duration::from_millis(1000));
        srv.shutdown();
        std::thread::sleep(Duration::from_millis(300));
        let (srv, _) = server_on(dev, addr);
        let s = run.join().unwrap().unwrap();
        let v = s.verify.as_ref().unwrap();
        assert!(
            v.mismatches == 0 && v.checked_blocks > 0 && v.readback_blocks > 0,
            "{}",
            s.render()
        );
        assert!(
            !s.target_detail.ends_with(" 1 connection made"),
            "no reconnect: {}",
            s.target_detail
        );
        srv.shutdown();
    }
}

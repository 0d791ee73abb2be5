//! The command line of `flashpool bench` (clap's `Args`, flattened into the
//! binary's `bench` subcommand) and its checks: what a run or a `--compare`
//! matrix is asked to do, as a [`Workload`].

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::report::Matrix;
use crate::spec::{self, Engine, Rw, Workload};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// What to load: tcp://ADDR:PORT/NQN[?nsid=N], file:PATH (io_uring, O_DIRECT) or mem:SIZE (in process).
    #[arg(long, required_unless_present_any = ["compare", "render"], conflicts_with_all = ["compare", "render"])]
    pub(crate) target: Option<String>,
    /// Run --matrix on each of these targets (2 or more, same forms as --target) and write a
    /// report to --report; the first target is the baseline of the ratios.
    #[arg(long, num_args = 2.., value_name = "TARGET", requires = "matrix")]
    pub(crate) compare: Vec<String>,
    /// Draw a report of numbers measured elsewhere (tables and charts in a JSON spec, e.g.
    /// docs/bench/apps.sh's) into DIR: report.md, report.html, charts/ (docs/bench.md).
    #[arg(long, num_args = 2, value_names = ["SPEC.json", "DIR"], conflicts_with = "compare")]
    pub(crate) render: Vec<PathBuf>,
    /// With --compare: the workloads to run on each target (docs/bench.md).
    #[arg(long, value_enum, requires = "compare")]
    pub(crate) matrix: Option<Matrix>,
    /// With --compare: directory for report.md, report.html, results.json and charts/ [default: bench-report].
    #[arg(long, value_name = "DIR", requires = "compare")]
    pub(crate) report: Option<PathBuf>,
    /// With --compare: offered loads in the latency sweep, rising geometrically from 10% to 120%
    /// of the IOPS the target reached in the matrix's 4 KiB random read cell.
    #[arg(long, value_name = "N", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(2..=32), requires = "compare")]
    pub(crate) sweep_steps: u32,
    /// I/O pattern (fixed by --matrix).
    #[arg(
        long,
        value_enum,
        default_value = "randread",
        conflicts_with = "matrix"
    )]
    pub(crate) rw: Rw,
    /// Percentage of reads for --rw randrw.
    #[arg(long, default_value_t = 70, value_parser = clap::value_parser!(u8).range(0..=100),
          conflicts_with = "matrix")]
    pub(crate) mix: u8,
    /// Bytes per I/O (4k, 128k, ...): a multiple of the target's LBA size (fixed by --matrix).
    #[arg(long, default_value = "4k", conflicts_with = "matrix")]
    pub(crate) bs: String,
    /// I/Os in flight per job (fixed by --matrix).
    #[arg(long, default_value_t = 32, conflicts_with = "matrix")]
    pub(crate) qd: u32,
    /// Jobs: one I/O queue (TCP connection) each for tcp://, one task each for file: and mem:
    /// (fixed by --matrix).
    #[arg(long, default_value_t = 1, conflicts_with = "matrix")]
    pub(crate) jobs: u32,
    /// Measured run time (10s, 500ms, 2m). Default 10s, or one pass over --size when that is given;
    /// with --compare, per cell, default 5s.
    #[arg(long)]
    pub(crate) runtime: Option<String>,
    /// Use the first SIZE bytes of the target (split among the jobs); without --runtime, one pass over them.
    #[arg(long)]
    pub(crate) size: Option<String>,
    /// Run this long before measuring [default: 0s; 1s per cell with --compare].
    #[arg(long)]
    pub(crate) ramp: Option<String>,
    /// Offered load in I/Os per second for all jobs together (open loop; --matrix sets its own).
    #[arg(long, conflicts_with = "matrix")]
    pub(crate) rate_iops: Option<u64>,
    /// Stamp written blocks (LBA, seed, CRC32C) and check every read; a mismatch fails the run.
    #[arg(long)]
    pub(crate) verify: bool,
    /// Seed for --verify; give the seed of the run that wrote the blocks to check them in a later run.
    #[arg(long)]
    pub(crate) seed: Option<String>,
    /// CPUs for the jobs, e.g. 1 or 2-3 (job i on the i-th listed CPU, round robin).
    #[arg(long)]
    pub(crate) cpus: Option<String>,
    /// Also write the summary, histograms included, as JSON to FILE (--compare writes results.json).
    #[arg(long, conflicts_with = "compare")]
    pub(crate) json: Option<PathBuf>,
    /// Also report the CPU time of this process (the target's), from /proc/PID/stat
    /// (with --compare: for the tcp:// targets). A comma-separated list sums the
    /// processes: a volume's owner node and the enclosures that hold its drives.
    #[arg(long, value_delimiter = ',')]
    pub(crate) target_pid: Vec<u32>,
    /// tcp: ask for header digests.
    #[arg(long)]
    pub(crate) hdr_digest: bool,
    /// tcp: ask for data digests.
    #[arg(long)]
    pub(crate) data_digest: bool,
    /// tcp: keep polling the socket for this many microseconds after activity instead of
    /// sleeping (saves the wake-up of an idle CPU; burns the bench CPU while it polls).
    #[arg(long, default_value_t = 0)]
    pub(crate) poll_us: u32,
    /// Run the workload this many times, each after its own ramp, and report the
    /// median round (by IOPS) with every round and the spread; a round that
    /// overlapped other work on the machine runs once more.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20),
          conflicts_with = "compare")]
    pub(crate) rounds: u32,
    /// tcp: put at most this much write data in a command capsule (less if the
    /// target's IOCCSZ allows less); larger writes go by R2T and H2CData. 0: every
    /// write by R2T. [default: what the target allows]
    #[arg(long, value_name = "BYTES", value_parser = parse_in_capsule)]
    pub(crate) in_capsule: Option<u32>,
    /// tcp: hand each PDU to the kernel in a write of its own, the way a client
    /// that does not batch sends (default: one writev for whatever is queued).
    #[arg(long)]
    pub(crate) pdu_per_write: bool,
    /// tcp: how the jobs reach the target: `queue`, one I/O queue per job on the job's own
    /// thread; `remote`, one shared RemoteDevice (the path volumes take to remote drives:
    /// queues on its own runtime, keep-alive, timeouts, reconnect with one retry).
    #[arg(long, value_enum, default_value = "queue")]
    pub(crate) engine: Engine,
    /// --engine remote: I/O queues (TCP connections) of the shared device [default: --jobs].
    #[arg(long)]
    pub(crate) queues: Option<u32>,
    /// --engine remote: unreachable this long, the device fails its I/O [default: 2s, as a
    /// volume's remote member]; a run rides out a shorter outage (reconnect, one retry).
    #[arg(long, value_name = "DURATION")]
    pub(crate) fail_after: Option<String>,
    /// tcp: host NQN to connect as (default: /etc/nvme/hostnqn or one derived from the machine id).
    #[arg(long)]
    pub(crate) hostnqn: Option<String>,
    /// tcp: authenticate with DH-HMAC-CHAP, with the secret in this file (`DHHC-1:...`, as
    /// `nvme gen-dhchap-key` prints it; mode 0600), for the host NQN of --hostnqn.
    #[arg(long, value_name = "FILE")]
    pub(crate) dhchap_key_file: Option<std::path::PathBuf>,
    /// tcp: also authenticate the target (bidirectional) with the controller secret in this file.
    #[arg(long, value_name = "FILE", requires = "dhchap_key_file")]
    pub(crate) dhchap_ctrl_key_file: Option<std::path::PathBuf>,
    /// tcp: connect over TLS 1.3 (TP 8011) with the configured PSK in this file
    /// (`NVMeTLSkey-1:...`, as `nvme gen-tls-key` prints it; mode 0600), for --hostnqn.
    #[arg(long, value_name = "FILE")]
    pub(crate) tls_key_file: Option<std::path::PathBuf>,
    /// tcp: the TLS PSK identity version to offer: 0 (`NVMe0Rhh host sub`) or 1 (with the
    /// PSK digest).
    #[arg(long, value_name = "0|1", default_value_t = 0, requires = "tls_key_file",
          value_parser = clap::value_parser!(u8).range(0..=1))]
    pub(crate) tls_identity: u8,
    /// tcp: derive the TLS PSK as libnvme before 1.16 does (nvme-cli up to 2.15, e.g. Debian
    /// 13), for a Linux nvmet target whose key was inserted by such an nvme-cli.
    #[arg(long, requires = "tls_key_file")]
    pub(crate) tls_compat: bool,
    /// file:/mem: write the region once before the run, so that reads return stored data.
    /// With --compare: every target, tcp:// included, is written once before it is read.
    #[arg(long)]
    pub(crate) prefill: bool,
    /// No progress line.
    #[arg(long, short)]
    pub(crate) quiet: bool,
}

/// `--in-capsule`: a size ("8k", "4096", "0").
fn parse_in_capsule(s: &str) -> std::result::Result<u32, String> {
    let n = spec::parse_size(s).map_err(|e| e.to_string())?;
    u32::try_from(n).map_err(|_| format!("{s} is more than a capsule can hold"))
}

impl BenchArgs {
    /// The workload of a single run, or (`compare`) the base each matrix cell overrides.
    pub(crate) fn workload_for(&self, compare: bool) -> Result<Workload> {
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
            target_pid: self.target_pid.clone(),
            hdr_digest: self.hdr_digest,
            data_digest: self.data_digest,
            hostnqn: self.hostnqn.clone(),
            dhchap: flashpool_util::keys::key_pair(
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
                    flashpool_util::keys::read_psk("--tls-key-file", p)
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
    pub(crate) fn engine_options(&self) -> Result<(Option<u32>, Option<Duration>)> {
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

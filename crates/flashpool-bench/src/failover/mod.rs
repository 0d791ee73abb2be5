//! `flashpool failover-probe` (hidden; `docs/bench/cluster-scale.sh` runs it):
//! when does a survivor serve each volume after a fault?
//!
//! The probe connects to every controller of the cluster as a multipath host
//! does, checks that the `--owner` serves every volume (ANA Optimized), writes
//! one block to each through it, then does the fault itself (a signal to a
//! pid, or a shell command such as `flashpool node drain`), so that the fault
//! and the per-volume times share one monotonic clock. It then polls the ANA
//! log of every other controller; a volume is *served* once a survivor says
//! Optimized and a probe through it reads the block written before the fault
//! back unchanged, writes a new one and reads that back. Meanwhile it samples
//! the CPU time of `--watch` processes, until `--after` past the last volume.

mod ana;
mod cpu;
mod probe;
mod stamp;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// The command line of `flashpool failover-probe`.
#[derive(clap::Args, Debug)]
pub struct FailoverArgs {
    /// A node that may serve the volumes: NAME=ADDR:PORT (its NVMe/TCP I/O listener); every
    /// node of the cluster, the owner included.
    #[arg(long = "ctrl", required = true, value_name = "NAME=ADDR:PORT")]
    pub(crate) ctrls: Vec<String>,
    /// The subsystem that exports the volumes.
    #[arg(long)]
    pub(crate) nqn: String,
    /// A volume: NAME=NSID in --nqn (repeat, or comma separated).
    #[arg(
        long = "volume",
        required = true,
        value_delimiter = ',',
        value_name = "NAME=NSID"
    )]
    pub(crate) volumes: Vec<String>,
    /// The node that owns every volume before the fault (one of --ctrl).
    #[arg(long)]
    pub(crate) owner: String,
    /// The fault: send this signal (KILL, STOP, TERM) to --pid.
    #[arg(
        long,
        requires = "pid",
        conflicts_with = "run",
        required_unless_present = "run"
    )]
    pub(crate) signal: Option<String>,
    /// The process that gets --signal.
    #[arg(long)]
    pub(crate) pid: Option<u32>,
    /// The fault: run this shell command (sh -c); the clock starts as it is started.
    #[arg(long)]
    pub(crate) run: Option<String>,
    /// Give up on the volumes not served this long after the fault.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub(crate) timeout: Duration,
    /// How often each survivor's ANA log is read.
    #[arg(long, default_value = "5ms", value_parser = humantime::parse_duration)]
    pub(crate) interval: Duration,
    /// A process whose CPU time is sampled: NAME=PID (repeat).
    #[arg(long = "watch", value_name = "NAME=PID")]
    pub(crate) watch: Vec<String>,
    /// How often the CPU time of --watch is sampled.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    pub(crate) cpu_interval: Duration,
    /// Sample the CPU this long before the fault (the idle baseline).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub(crate) baseline: Duration,
    /// Keep sampling this long after the last volume is served.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub(crate) after: Duration,
    /// Quiet: the --watch processes together use at most this many CPUs more than in the
    /// baseline (before the fault), in every --quiet-window from then on.
    #[arg(long, default_value_t = 0.1)]
    pub(crate) quiet_cores: f64,
    /// Quiet is judged over windows this long (sliding by one sampling interval).
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    pub(crate) quiet_window: Duration,
    /// Write the result as JSON to this file.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Host NQN to connect as (default: as `flashpool bench`).
    #[arg(long)]
    pub(crate) hostnqn: Option<String>,
}

/// The fault the probe does.
#[derive(Debug, Clone)]
pub(crate) enum Fault {
    Signal {
        pid: libc::pid_t,
        sig: libc::c_int,
        name: String,
    },
    Run(String),
}

/// What the arguments name, checked.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) ctrls: Vec<(String, SocketAddr)>,
    pub(crate) owner: usize,
    pub(crate) volumes: Vec<(String, u32)>,
    pub(crate) watch: Vec<(String, u32)>,
    pub(crate) fault: Fault,
}

fn pair(s: &str, what: &str) -> Result<(String, String)> {
    let (a, b) = s
        .split_once('=')
        .with_context(|| format!("{what} {s:?}: expected NAME=VALUE"))?;
    if a.is_empty() || b.is_empty() {
        bail!("{what} {s:?}: expected NAME=VALUE");
    }
    Ok((a.to_string(), b.to_string()))
}

impl FailoverArgs {
    pub(crate) fn plan(&self) -> Result<Plan> {
        let mut ctrls = Vec::new();
        for c in &self.ctrls {
            let (n, a) = pair(c, "--ctrl")?;
            let addr = a
                .parse::<SocketAddr>()
                .with_context(|| format!("--ctrl {c}: {a} is not ADDR:PORT"))?;
            if ctrls.iter().any(|(m, _)| *m == n) {
                bail!("--ctrl {n} given twice");
            }
            ctrls.push((n, addr));
        }
        let owner = ctrls
            .iter()
            .position(|(n, _)| *n == self.owner)
            .with_context(|| format!("--owner {} is not one of --ctrl", self.owner))?;
        if ctrls.len() < 2 {
            bail!("give the owner and at least one other node as --ctrl");
        }
        let mut volumes = Vec::new();
        for v in &self.volumes {
            let (n, id) = pair(v, "--volume")?;
            let nsid = id
                .parse::<u32>()
                .ok()
                .filter(|&x| x != 0 && x != u32::MAX)
                .with_context(|| format!("--volume {v}: {id} is not a namespace ID"))?;
            if volumes.iter().any(|(_, m)| *m == nsid) {
                bail!("--volume: nsid {nsid} given twice");
            }
            volumes.push((n, nsid));
        }
        let mut watch = Vec::new();
        for w in &self.watch {
            let (n, p) = pair(w, "--watch")?;
            watch.push((
                n,
                p.parse()
                    .with_context(|| format!("--watch {w}: {p} is not a pid"))?,
            ));
        }
        let fault = match (&self.signal, self.pid, &self.run) {
            (Some(s), Some(pid), None) => {
                let sig = match s.trim_start_matches("SIG").to_ascii_uppercase().as_str() {
                    "KILL" | "9" => libc::SIGKILL,
                    "STOP" => libc::SIGSTOP,
                    "TERM" | "15" => libc::SIGTERM,
                    _ => bail!("--signal {s}: KILL, STOP or TERM"),
                };
                let pid = libc::pid_t::try_from(pid)
                    .ok()
                    .filter(|&p| p > 1)
                    .with_context(|| format!("--pid {pid}: not a process to signal"))?;
                Fault::Signal {
                    pid,
                    sig,
                    name: format!("SIG{}", s.trim_start_matches("SIG").to_ascii_uppercase()),
                }
            }
            (None, _, Some(cmd)) => Fault::Run(cmd.clone()),
            _ => bail!("give --signal SIG --pid PID, or --run COMMAND"),
        };
        Ok(Plan {
            ctrls,
            owner,
            volumes,
            watch,
            fault,
        })
    }
}

/// `flashpool failover-probe ...`: exits 1 unless every volume was served
/// elsewhere with no verify error.
pub fn run(args: FailoverArgs) -> Result<()> {
    let plan = args.plan()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = rt.block_on(probe::run(&args, &plan))?;
    let text = serde_json::to_string_pretty(&report)?;
    if let Some(p) = &args.json {
        std::fs::write(p, format!("{text}\n"))
            .with_context(|| format!("writing {}", p.display()))?;
    }
    flashpool_util::output::outln!("{}", probe::summary(&report));
    let served = report["served"].as_u64().unwrap_or(0) as usize;
    let errors = report["verify_errors"].as_u64().unwrap_or(1);
    if served != plan.volumes.len() || errors != 0 {
        bail!(
            "{} of {} volumes served elsewhere, {errors} verify errors",
            served,
            plan.volumes.len()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: FailoverArgs,
    }

    fn parse(extra: &[&str]) -> Result<Plan> {
        let mut v = vec![
            "x",
            "--ctrl",
            "c1=10.0.0.1:4420",
            "--ctrl",
            "c2=10.0.0.2:4420",
            "--nqn",
            "n",
        ];
        v.extend_from_slice(extra);
        Cli::try_parse_from(v)?.a.plan()
    }

    #[test]
    fn a_plan_from_the_arguments() {
        let p = parse(&[
            "--owner",
            "c1",
            "--volume",
            "v1=1,v2=2",
            "--volume",
            "v3=3",
            "--signal",
            "KILL",
            "--pid",
            "1234",
            "--watch",
            "c2=99",
        ])
        .unwrap();
        assert_eq!(p.owner, 0);
        assert_eq!(p.volumes.len(), 3);
        assert_eq!(p.volumes[2], ("v3".to_string(), 3));
        assert_eq!(p.watch, vec![("c2".to_string(), 99)]);
        assert!(matches!(
            p.fault,
            Fault::Signal {
                pid: 1234,
                sig: libc::SIGKILL,
                ..
            }
        ));
        let p = parse(&["--owner", "c2", "--volume", "v=1", "--run", "true"]).unwrap();
        assert!(matches!(p.fault, Fault::Run(ref c) if c == "true"));
    }

    #[test]
    fn refuses_what_cannot_be_meant() {
        for bad in [
            &["--owner", "c9", "--volume", "v=1", "--run", "true"][..],
            &["--owner", "c1", "--volume", "v=0", "--run", "true"],
            &["--owner", "c1", "--volume", "v=1,w=1", "--run", "true"],
            &["--owner", "c1", "--volume", "v", "--run", "true"],
            &[
                "--owner", "c1", "--volume", "v=1", "--signal", "HUP", "--pid", "5",
            ],
            &[
                "--owner", "c1", "--volume", "v=1", "--signal", "KILL", "--pid", "1",
            ],
            &["--owner", "c1", "--volume", "v=1"],
            &[
                "--owner", "c1", "--volume", "v=1", "--signal", "KILL", "--pid", "5", "--run", "x",
            ],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}

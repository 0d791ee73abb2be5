//! What to benchmark (`Target`) and how (`Workload`), parsed from the
//! command line's words.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::Serialize;

/// Where the I/O goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// NVMe/TCP: a subsystem's namespace (the first active one unless `nsid`).
    Tcp {
        addr: SocketAddr,
        nqn: String,
        nsid: Option<u32>,
    },
    /// A file or block device through io_uring with O_DIRECT: the local baseline.
    File(PathBuf),
    /// A RAM device in this process: the engine without network or device.
    Mem(u64),
}

impl Target {
    /// `tcp://ADDR:PORT/NQN[?nsid=N]`, `file:PATH` or `mem:SIZE`.
    pub fn parse(s: &str) -> Result<Target> {
        if let Some(rest) = s.strip_prefix("tcp://") {
            let (hostport, tail) = rest.split_once('/').with_context(|| {
                format!("target {s:?}: give the subsystem NQN after the port, e.g. tcp://127.0.0.1:4420/nqn.2026-01.io.flashpool:default")
            })?;
            let addr = hostport
                .to_socket_addrs()
                .with_context(|| {
                    format!("target {s:?}: {hostport:?} is not ADDR:PORT (e.g. 127.0.0.1:4420)")
                })?
                .next()
                .with_context(|| format!("target {s:?}: {hostport:?} resolves to no address"))?;
            let (nqn, query) = match tail.split_once('?') {
                Some((n, q)) => (n, Some(q)),
                None => (tail, None),
            };
            if !nqn.starts_with("nqn.") {
                bail!("target {s:?}: {nqn:?} is not an NQN (they start with \"nqn.\")");
            }
            let mut nsid = None;
            for kv in query.into_iter().flat_map(|q| q.split('&')) {
                match kv.split_once('=') {
                    Some(("nsid", v)) => {
                        let n: u32 = v.parse().ok().filter(|&n| n > 0).with_context(|| {
                            format!("target {s:?}: nsid={v} is not a namespace id (1, 2, ...)")
                        })?;
                        nsid = Some(n);
                    }
                    _ => bail!("target {s:?}: unknown option {kv:?}; the only one is nsid=N"),
                }
            }
            return Ok(Target::Tcp {
                addr,
                nqn: nqn.to_string(),
                nsid,
            });
        }
        if let Some(p) = s.strip_prefix("file:") {
            if p.is_empty() {
                bail!(
                    "target {s:?}: give a path, e.g. file:/dev/nvme0n1 or file:/var/tmp/bench.img"
                );
            }
            return Ok(Target::File(PathBuf::from(p)));
        }
        if let Some(sz) = s.strip_prefix("mem:") {
            let n = parse_size(sz).with_context(|| format!("target {s:?}"))?;
            if n == 0 {
                bail!("target {s:?}: a RAM device needs a size above zero, e.g. mem:1G");
            }
            return Ok(Target::Mem(n));
        }
        bail!(
            "target {s:?} is not understood; use tcp://ADDR:PORT/NQN[?nsid=N], file:PATH or mem:SIZE"
        )
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Tcp { addr, nqn, nsid } => {
                write!(f, "tcp://{addr}/{nqn}")?;
                if let Some(n) = nsid {
                    write!(f, "?nsid={n}")?;
                }
                Ok(())
            }
            Target::File(p) => write!(f, "file:{}", p.display()),
            Target::Mem(n) => write!(f, "mem:{}", human_bytes(*n)),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Rw {
    Read,
    Write,
    Randread,
    Randwrite,
    Randrw,
}

impl Rw {
    pub fn random(self) -> bool {
        matches!(self, Rw::Randread | Rw::Randwrite | Rw::Randrw)
    }
    pub fn writes(self) -> bool {
        matches!(self, Rw::Write | Rw::Randwrite | Rw::Randrw)
    }
    pub fn name(self) -> &'static str {
        match self {
            Rw::Read => "read",
            Rw::Write => "write",
            Rw::Randread => "randread",
            Rw::Randwrite => "randwrite",
            Rw::Randrw => "randrw",
        }
    }
}

/// How the jobs reach a `tcp://` target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// One NVMe/TCP I/O queue per job, connected and polled on the job's own thread.
    #[default]
    Queue,
    /// One `nvmf_host::remote::RemoteDevice` shared by the jobs (its queues on
    /// its own runtime, keep-alive, timeouts, reconnect): the path a volume
    /// takes to a remote drive.
    Remote,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::Queue => "queue",
            Engine::Remote => "remote",
        }
    }
}

/// How to load the target.
#[derive(Debug, Clone, Serialize)]
pub struct Workload {
    pub rw: Rw,
    /// Percentage of reads in `randrw`.
    pub mix: u8,
    /// Bytes per I/O.
    pub bs: u32,
    /// I/Os in flight per job.
    pub qd: u32,
    pub jobs: u32,
    /// Time-based run over the region (loops); `None` with `size`: one pass.
    #[serde(serialize_with = "ser_opt_secs")]
    pub runtime: Option<Duration>,
    /// Bytes of the target to use (from offset 0, split among jobs); `None`: all of it.
    pub size: Option<u64>,
    #[serde(serialize_with = "ser_secs")]
    pub ramp: Duration,
    /// Offered load for all jobs together (open loop); `None`: as fast as the queue depth allows.
    pub rate_iops: Option<u64>,
    pub verify: bool,
    /// Seed stamped into verified blocks.
    pub seed: u64,
    /// The seed came from the user: reads expect blocks written with it.
    pub seed_given: bool,
    /// CPUs for the jobs (job i on cpus[i % len]); empty = not pinned.
    pub cpus: Vec<usize>,
    /// Also report these processes' CPU time, summed (the target's).
    pub target_pid: Vec<u32>,
    /// NVMe/TCP options.
    pub hdr_digest: bool,
    pub data_digest: bool,
    pub hostnqn: Option<String>,
    /// tcp: DH-HMAC-CHAP secrets (reported as "none", "host" or
    /// "bidirectional", never the keys).
    #[serde(serialize_with = "ser_dhchap")]
    pub dhchap: Option<nvmf_host::DhchapKeys>,
    /// tcp: a TLS 1.3 channel with this configured PSK (reported as "none"
    /// or the PSK hash and identity version, never the key).
    #[serde(serialize_with = "ser_tls")]
    pub tls: Option<nvmf_host::TlsKey>,
    /// Host-side adaptive polling window, microseconds.
    pub poll_us: u32,
    /// Most write data in a command capsule; None: what the target allows.
    pub in_capsule: Option<u32>,
    /// One PDU per write system call.
    pub pdu_per_write: bool,
    /// How the jobs reach a tcp:// target.
    pub engine: Engine,
    /// `Engine::Remote`: I/O queues of the shared device; `None`: one per job.
    pub queues: Option<u32>,
    /// `Engine::Remote`: unreachable this long, I/O fails; `None`: the device's default.
    #[serde(serialize_with = "ser_opt_secs")]
    pub fail_after: Option<Duration>,
    /// Write the region once before the run (local targets).
    pub prefill: bool,
    /// Print the progress line each second.
    pub progress: bool,
}

fn ser_dhchap<S: serde::Serializer>(
    k: &Option<nvmf_host::DhchapKeys>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_str(match k {
        None => "none",
        Some(k) if k.ctrl_key.is_some() => "bidirectional",
        Some(_) => "host",
    })
}

fn ser_tls<S: serde::Serializer>(k: &Option<nvmf_host::TlsKey>, s: S) -> Result<S::Ok, S::Error> {
    match k {
        None => s.serialize_str("none"),
        Some(k) => s.serialize_str(&format!(
            "tls1.3, PSK hash {:02}, identity v{}, {:?}",
            k.key.hash().id(),
            k.identity_version,
            k.key.derivation()
        )),
    }
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            rw: Rw::Randread,
            mix: 70,
            bs: 4096,
            qd: 32,
            jobs: 1,
            runtime: Some(Duration::from_secs(10)),
            size: None,
            ramp: Duration::ZERO,
            rate_iops: None,
            verify: false,
            seed: 1,
            seed_given: false,
            cpus: Vec::new(),
            target_pid: Vec::new(),
            hdr_digest: false,
            data_digest: false,
            hostnqn: None,
            dhchap: None,
            tls: None,
            poll_us: 0,
            in_capsule: None,
            pdu_per_write: false,
            engine: Engine::Queue,
            queues: None,
            fail_after: None,
            prefill: false,
            progress: false,
        }
    }
}

fn ser_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

fn ser_opt_secs<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

pub use flashpool_util::units::{parse_duration, parse_size};

/// "1", "0,2", "0-3", "0-1,4".
pub fn parse_cpus(s: &str) -> Result<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("--cpus {s:?}: {part:?} is not a CPU number or range like 0-3");
        match part.split_once('-') {
            Some((a, b)) => {
                let a: usize = a.trim().parse().ok().with_context(bad)?;
                let b: usize = b.trim().parse().ok().with_context(bad)?;
                if a > b {
                    bail!("{}", bad());
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok().with_context(bad)?),
        }
    }
    // Not available_parallelism(): that counts only the CPUs this process may use now (taskset).
    // SAFETY: sysconf only reads a configuration value.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize;
    if let Some(&c) = out.iter().find(|&&c| c >= n) {
        bail!(
            "--cpus {s:?}: CPU {c} does not exist here ({n} CPUs: 0..{})",
            n - 1
        );
    }
    Ok(out)
}

/// 1073741824 -> "1 GiB", 4096 -> "4 KiB", 1536 -> "1.5 KiB".
pub fn human_bytes(n: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    for (u, name) in UNITS {
        if n >= u {
            let v = n as f64 / u as f64;
            return if n.is_multiple_of(u) {
                format!("{} {name}", n / u)
            } else {
                format!("{v:.1} {name}")
            };
        }
    }
    format!("{n} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        let t = Target::parse("tcp://127.0.0.1:4420/nqn.2026-01.io.flashpool:vol0?nsid=2").unwrap();
        assert_eq!(
            t,
            Target::Tcp {
                addr: "127.0.0.1:4420".parse().unwrap(),
                nqn: "nqn.2026-01.io.flashpool:vol0".into(),
                nsid: Some(2)
            }
        );
        assert_eq!(
            t.to_string(),
            "tcp://127.0.0.1:4420/nqn.2026-01.io.flashpool:vol0?nsid=2"
        );
        assert!(matches!(
            Target::parse("tcp://[::1]:4420/nqn.x").unwrap(),
            Target::Tcp { nsid: None, .. }
        ));
        assert_eq!(Target::parse("mem:1G").unwrap(), Target::Mem(1 << 30));
        assert_eq!(
            Target::parse("file:/tmp/x").unwrap(),
            Target::File("/tmp/x".into())
        );
        for bad in [
            "tcp://127.0.0.1:4420",
            "tcp://127.0.0.1:4420/foo",
            "tcp://x/nqn.a",
            "nvme:1",
            "mem:0",
            "tcp://127.0.0.1:1/nqn.a?nsid=0",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad}");
        }
        let e = Target::parse("tcp://127.0.0.1:4420/nqn.a?ns=1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("nsid=N"), "{e}");
    }

    #[test]
    fn sizes_durations_cpus() {
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("128KiB").unwrap(), 128 << 10);
        assert_eq!(parse_size("1.5M").unwrap(), 3 << 19);
        assert!(parse_size("1x").is_err());
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("3 parsecs").is_err());
        assert_eq!(parse_cpus("0").unwrap(), vec![0]);
        assert!(parse_cpus("100000").is_err());
        assert_eq!(human_bytes(1 << 30), "1 GiB");
        assert_eq!(human_bytes(1536), "1.5 KiB");
    }
}

//! What `flashpool attach` attaches: `tcp://HOST:PORT/NQN?nsid=N` (a
//! namespace through the user-space host, [`nvmf_host::remote`]), or for
//! baselines `mem:SIZE` (RAM in this process) and `file:PATH` (a local file
//! or block device through io_uring, O_DIRECT).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use blockdev::{BlockDevice, FileDevice, FileOptions, MemDevice};
use nvmf_host::remote::{RemoteDevice, RemoteOptions, RemoteUrl};
use nvmf_host::{Controller, HostOptions, discover_with};

use super::multipath::{AnaPath, Multipath};

/// A parsed target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Tcp(RemoteUrl),
    Mem(u64),
    File(PathBuf),
}

impl Target {
    pub fn parse(s: &str) -> Result<Target> {
        if s.starts_with("tcp://") {
            // The remote drive's own parser: one grammar for every tcp:// URL.
            return Ok(Target::Tcp(RemoteUrl::parse(s)?));
        }
        if let Some(sz) = s.strip_prefix("mem:") {
            let n = crate::units::parse_size(sz).with_context(|| format!("target {s:?}"))?;
            if n == 0 {
                bail!("target {s:?}: a RAM disk needs a size above zero, e.g. mem:1G");
            }
            return Ok(Target::Mem(n));
        }
        if let Some(p) = s.strip_prefix("file:") {
            if p.is_empty() {
                bail!(
                    "target {s:?}: give a path, e.g. file:/var/tmp/disk.img or file:/dev/nvme0n1"
                );
            }
            return Ok(Target::File(PathBuf::from(p)));
        }
        bail!(
            "target {s:?} is not understood; use tcp://HOST:PORT/NQN?nsid=N, mem:SIZE or file:PATH"
        )
    }
}

/// How to open a target.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// I/O queues (TCP connections) to a tcp:// namespace.
    pub queues: u16,
    /// Commands per queue.
    pub queue_depth: u16,
    /// How long I/O waits for a lost namespace to come back before it fails.
    pub fail_after: Duration,
    /// Block size of a mem: disk (and of a new file: one).
    pub block_size: u32,
    pub hostnqn: Option<String>,
    /// Discovery service (ADDR:PORT) to find every portal of a tcp://
    /// subsystem (ANA multipath); None: the URL's portal alone.
    pub discovery: Option<String>,
}

/// Opens `t` as a block device.
pub async fn open(t: &Target, o: &OpenOptions) -> Result<Arc<dyn BlockDevice>> {
    match t {
        Target::Mem(n) => {
            let size = n.next_multiple_of(u64::from(o.block_size));
            Ok(Arc::new(MemDevice::new(size, o.block_size)?))
        }
        Target::File(p) => {
            let f = FileDevice::open(FileOptions {
                path: p.clone(),
                size: None,
                block_size: o.block_size,
                create: false,
            })
            .with_context(|| format!("file:{}", p.display()))?;
            Ok(Arc::new(f))
        }
        Target::Tcp(url) => {
            let host = host_options(o);
            check_namespace(url, &host).await?;
            let opts = RemoteOptions {
                host: host.clone(),
                io_queues: o.queues,
                fail_after: o.fail_after,
                ..RemoteOptions::default()
            };
            let portals = match &o.discovery {
                Some(d) => portals(url, d, &host).await,
                None => Vec::new(),
            };
            if portals.len() > 1 {
                return multipath(url, portals, opts, o.fail_after).await;
            }
            let dev = RemoteDevice::connect(&url.to_string(), opts)
                .await
                .with_context(|| format!("cannot attach {url}"))?;
            Ok(Arc::new(dev))
        }
    }
}

/// The portals (address, port) the discovery service at `disc` lists for
/// `url`'s subsystem; none if it cannot be asked (a node without discovery:
/// the URL's portal alone is used).
async fn portals(url: &RemoteUrl, disc: &str, host: &HostOptions) -> Vec<(String, u16)> {
    let addr = match tokio::net::lookup_host(disc).await.map(|mut a| a.next()) {
        Ok(Some(a)) => a,
        _ => {
            tracing::info!("discovery {disc}: cannot resolve it; one path, to {url}");
            return Vec::new();
        }
    };
    let opts = HostOptions {
        timeout: Duration::from_secs(3),
        ..host.clone()
    };
    let log = match tokio::time::timeout(Duration::from_secs(5), discover_with(addr, opts)).await {
        Ok(Ok(log)) => log,
        Ok(Err(e)) => {
            tracing::info!("discovery {addr}: {e}; one path, to {url}");
            return Vec::new();
        }
        Err(_) => {
            tracing::info!("discovery {addr}: no answer in 5 s; one path, to {url}");
            return Vec::new();
        }
    };
    let mut out: Vec<(String, u16)> = Vec::new();
    for e in log.iter().filter(|e| e.subnqn == url.nqn) {
        if let Ok(port) = e.trsvcid.trim().parse::<u16>() {
            let p = (e.traddr.trim().to_string(), port);
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    tracing::info!("discovery {addr}: {} portal(s) for {}", out.len(), url.nqn);
    out
}

/// One path per portal, as one device that follows ANA. A portal that
/// cannot be reached now, or shows another namespace, is left out.
async fn multipath(
    url: &RemoteUrl,
    portals: Vec<(String, u16)>,
    opts: RemoteOptions,
    fail_after: Duration,
) -> Result<Arc<dyn BlockDevice>> {
    // A path gives up on a lost connection at once (it reconnects in the
    // background); the request moves on to whichever path is Optimized,
    // waiting for one for up to `fail_after` in all, as the kernel does.
    let per_path = RemoteOptions {
        fail_after: fail_after.min(Duration::from_millis(100)),
        ..opts
    };
    let mut paths: Vec<Arc<dyn AnaPath>> = Vec::new();
    let mut identity = None;
    for (host, port) in portals {
        let u = RemoteUrl {
            host,
            port,
            nqn: url.nqn.clone(),
            nsid: url.nsid,
        };
        let dev = match RemoteDevice::connect(&u.to_string(), per_path.clone()).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!("path {u}: {e}; left out");
                continue;
            }
        };
        let id = dev.identity();
        match &identity {
            None => identity = id,
            Some(want) if id.as_ref() != Some(want) => {
                tracing::warn!("path {u}: another namespace ({id:?}, not {want}); left out");
                continue;
            }
            Some(_) => {}
        }
        paths.push(Arc::new(dev));
    }
    if paths.is_empty() {
        bail!(
            "{url}: no portal that discovery lists for {} could be reached",
            url.nqn
        );
    }
    Ok(Arc::new(Multipath::new(paths, fail_after).await))
}

fn host_options(o: &OpenOptions) -> HostOptions {
    let mut h = HostOptions {
        queue_depth: o.queue_depth,
        timeout: Duration::from_secs(5),
        ..HostOptions::default()
    };
    if let Some(n) = &o.hostnqn {
        h.hostnqn = n.clone();
    }
    h
}

/// The first address `url`'s host resolves to.
pub async fn resolve(url: &RemoteUrl) -> Result<SocketAddr> {
    tokio::net::lookup_host((url.host.as_str(), url.port))
        .await
        .with_context(|| format!("{url}: cannot resolve {:?}", url.host))?
        .next()
        .ok_or_else(|| anyhow!("{url}: {:?} resolves to no address", url.host))
}

/// Connects once to say plainly what is wrong before the device is built:
/// nothing listening, no such subsystem, no such namespace (an inactive
/// NSID identifies as an empty namespace, which would attach as a 0-byte disk).
async fn check_namespace(url: &RemoteUrl, host: &HostOptions) -> Result<()> {
    let addr = resolve(url).await?;
    let opts = HostOptions {
        nr_io_queues: 0,
        kato_ms: 0,
        ..host.clone()
    };
    let ctrl = tokio::time::timeout(
        Duration::from_secs(10),
        Controller::connect(addr, &url.nqn, opts),
    )
    .await
    .map_err(|_| {
        anyhow!("{url}: no answer from {addr} within 10 s (is a flashpool node serving there?)")
    })?
    .map_err(|e| {
        anyhow!(
            "{url}: cannot connect to subsystem {} at {addr}: {e}",
            url.nqn
        )
    })?;
    let active = ctrl.active_namespaces().await;
    let _ = ctrl.disconnect().await;
    let active = active.with_context(|| format!("{url}: cannot list its namespaces"))?;
    if !active.contains(&url.nsid) {
        let list = active
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        bail!(
            "{url}: subsystem {} has no namespace {} (its active namespaces: {}); name one with ?nsid=N",
            url.nqn,
            url.nsid,
            if list.is_empty() { "none".into() } else { list }
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_bad_ones_say_why() {
        assert_eq!(Target::parse("mem:64M").unwrap(), Target::Mem(64 << 20));
        assert_eq!(
            Target::parse("file:/tmp/x.img").unwrap(),
            Target::File("/tmp/x.img".into())
        );
        let Target::Tcp(u) =
            Target::parse("tcp://127.0.0.1:4420/nqn.2026-01.io.flashpool:v?nsid=2").unwrap()
        else {
            panic!("tcp");
        };
        assert_eq!((u.port, u.nsid), (4420, 2));
        for (s, want) in [
            ("mem:0", "above zero"),
            ("mem:abc", "not a number"),
            ("file:", "give a path"),
            ("nvme://x", "not understood"),
            ("tcp://h:1/notnqn", "must start with \"nqn.\""),
            ("tcp://h:1/nqn.x?nsid=0", "nsid \"0\""),
        ] {
            let e = format!("{:#}", Target::parse(s).unwrap_err());
            assert!(e.contains(want), "{s}: {e}");
        }
    }
}

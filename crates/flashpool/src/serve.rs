//! `flashpool serve`: start the target, print how to attach, stop cleanly on SIGINT/SIGTERM.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use blockdev::{BlockDevice, NullDevice};
use nvmf_target::{ListenerKind, Server, Target};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::config;
use crate::node::{Node, NodeState};
use crate::output::outln;

pub fn run(
    path: Option<&Path>,
    check_only: bool,
    log_format: Option<config::LogFormat>,
) -> Result<()> {
    let (cfg, origin) = config::load(path)?;
    init_logging(&cfg.node.log, log_format.unwrap_or(cfg.node.log_format));
    // Signals are caught from here on, so a SIGTERM during start-up is not lost.
    let stop = stop_signals()?;
    let Checked {
        drive_specs,
        volume_specs,
        cluster,
        membership,
    } = check(&cfg)?;
    if check_only {
        // Volumes are not assembled here (that writes superblocks): a
        // declared volume stands in as a placeholder.
        let declared: HashSet<&str> = volume_specs.iter().map(|v| v.name.as_str()).collect();
        let built = config::build(&cfg, &|v, _, _| {
            if declared.contains(v) {
                crate::node::VolumeNamespace::Device(Arc::new(
                    NullDevice::new(1 << 20, 4096).expect("placeholder"),
                ) as Arc<dyn BlockDevice>)
            } else {
                crate::node::VolumeNamespace::Unknown
            }
        })?;
        outln!(
            "config {origin}: OK ({} subsystems, {} drives, {} volumes)",
            built.subsystems.len(),
            drive_specs.len(),
            volume_specs.len()
        );
        return Ok(());
    }
    raise_open_file_limit();
    // The management runtime: the API, volume assembly, rebuilds. The I/O
    // path stays on the reactors.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("flashpool-mgmt")
        .enable_all()
        .build()
        .context("cannot start the management runtime")?;
    let scrub = cfg.scrub.as_ref().map(|s| s.schedule()).transpose()?;
    let mut state = NodeState::default();
    for d in drive_specs.iter().filter(|d| d.backend != "remote") {
        let mut drive = d.open().map_err(|e| anyhow::anyhow!("config: {e}"))?;
        drive.spare = cfg.drive.iter().any(|s| s.name == d.name && s.spare);
        state.drives.insert(d.name.clone(), drive);
    }
    if let Some(d) = &cfg.node.state_dir {
        std::fs::create_dir_all(d).with_context(|| {
            format!("config: node.state_dir = {}: cannot create it", d.display())
        })?;
    }
    let node = Node::with_state_dir(state, cfg.node.state_dir.as_deref());
    if let Some(p) = cfg.node.kek_path() {
        node.set_keyring(crate::node::keys::load_keyring(&p).context("config: node.kek_file")?);
    }
    node.set_cluster(cluster);
    rt.block_on(async {
        node.open_configured_remotes(&drive_specs).await;
        let exported: Vec<String> = drive_specs
            .iter()
            .filter(|d| d.export)
            .map(|d| d.name.clone())
            .collect();
        node.assemble_found(&exported).await?;
        // A volume that cannot be assembled or made is entered offline
        // (listed with its reason, not served): the others still run.
        for v in volume_specs {
            node.ensure_volume_or_offline(v).await;
        }
        anyhow::Ok(())
    })?;
    let built = config::build(&cfg, &|v, nqn, nsid| {
        rt.block_on(node.config_namespace(v, nqn, nsid))
    })?;
    let target = Arc::new(Target::new(built.transport, built.subsystems));
    target.set_connect_observer(Arc::new(crate::host_events::HostEvents::new(
        node.events.clone(),
    )));
    node.attach_target(target.clone());
    rt.block_on(node.restore_exports())?;
    rt.block_on(node.restore_qos())?;
    let drive_exports: Vec<(String, Vec<String>)> = drive_specs
        .iter()
        .filter(|d| d.export)
        .map(|d| (d.name.clone(), d.export_hosts.clone()))
        .collect();
    rt.block_on(node.restore_drive_exports(&drive_exports))?;
    let agent = match membership {
        Some(m) => {
            // Peers call it by this: with its scheme when it is HTTPS.
            let api = cfg.api.enabled.then(|| match &cfg.api.tls_cert {
                Some(_) => format!("https://{}", cfg.api.address),
                None => cfg.api.address.clone(),
            });
            let cluster_name = m.name.clone();
            let join = crate::agent::Agent::join(node.clone(), target.clone(), m, api);
            // The join waits for etcd as long as it takes: a stop ends the wait.
            let joined = rt.block_on(async {
                tokio::select! {
                    a = join => Some(a),
                    _ = stopped(stop.clone()) => None,
                }
            });
            match joined {
                Some(a) => Some(a?),
                None => {
                    tracing::info!(
                        "signal {}: stopping while waiting to join cluster {cluster_name} (nothing was served)",
                        stop.borrow().unwrap_or_default()
                    );
                    rt.block_on(node.shutdown());
                    tracing::info!("stopped cleanly");
                    return Ok(());
                }
            }
        }
        None => None,
    };
    {
        // From here on, what changes is reported (`GET /v1/events`); the
        // first sample reports the volumes that start unwell.
        let _in_rt = rt.enter();
        crate::node::monitor::spawn(&node);
        crate::node::intents::spawn(&node);
    }
    let (server, api) = match listen(&rt, &cfg, &built.listeners, &target, &node, &agent) {
        Ok(up) => up,
        Err(e) => {
            if let Some(a) = &agent {
                // Nothing was served: the slot and home slot the join took
                // go back (the home would keep a slot from other nodes).
                rt.block_on(a.session().abandon());
            }
            return Err(e);
        }
    };
    if let Some(a) = &agent {
        let _in_rt = rt.enter();
        a.spawn();
    }
    {
        let _in_rt = rt.enter();
        if let Some(s) = scrub {
            node.spawn_scrub_schedule(s);
        }
        node.spawn_compaction();
        if agent.is_none() {
            // Cluster volumes are on remote drives any node can reach; a
            // local spare would tie one to this node, so spares are for
            // nodes that run alone.
            node.spawn_spare_watch();
        }
    }
    // The CLI's copy of the token goes with the node (the state_dir's stays).
    let api_auth = api.as_ref().map(|a| a.auth.clone());
    print_banner(&server, &origin, api, &rt, &node);
    let sig = rt.block_on(stopped(stop));
    tracing::info!("signal {sig}: stopping (in-flight I/O completes, files are flushed)");
    if let Some(a) = &agent {
        // The others take over at once: the lease is revoked, not left to expire.
        rt.block_on(a.leave());
    }
    server.shutdown();
    rt.block_on(node.shutdown());
    if let Some(a) = api_auth {
        a.remove_runtime_token();
    }
    tracing::info!("stopped cleanly");
    Ok(())
}

/// Raises the soft open-file limit to the hard one, as servers do: a node
/// holds a socket per queue of every host, and per remote member drive up to
/// 2 + its reactors' queues, so 48 volumes of 5 remote members on 16
/// reactors need about 4,300 descriptors before a host connects (Debian's
/// default soft limit is 1,024). Returns the limit now in force.
fn raise_open_file_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read or fill the struct passed.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
    }
    let before = lim.rlim_cur;
    let nr_open = || {
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse().ok())
    };
    if let Some(goal) = open_file_goal(lim.rlim_cur, lim.rlim_max, nr_open) {
        lim.rlim_cur = goal;
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            tracing::warn!(
                "cannot raise the open-file limit from {before} to {goal}: {}",
                std::io::Error::last_os_error()
            );
            return before;
        }
        tracing::debug!("open-file limit raised from {before} to {goal}");
    }
    if lim.rlim_cur < 4096 {
        tracing::warn!(
            "open-file limit is {}: a node with many volumes or hosts may run out \
             (raise it with `ulimit -n` or systemd's LimitNOFILE=)",
            lim.rlim_cur
        );
    }
    lim.rlim_cur
}

/// The soft open-file limit to raise `soft` to, if any: the hard limit, or
/// the kernel's `fs.nr_open` when the hard limit is unlimited.
fn open_file_goal(soft: u64, hard: u64, nr_open: impl FnOnce() -> Option<u64>) -> Option<u64> {
    let most = if hard == libc::RLIM_INFINITY {
        nr_open().unwrap_or(1 << 20)
    } else {
        hard
    };
    (soft < most).then_some(most)
}

/// SIGINT and SIGTERM, caught from the call on: the last one seen, for
/// whatever waits (the cluster join, or the node serving).
fn stop_signals() -> Result<tokio::sync::watch::Receiver<Option<i32>>> {
    let mut signals = Signals::new([SIGINT, SIGTERM])?;
    let (tx, rx) = tokio::sync::watch::channel(None);
    std::thread::Builder::new()
        .name("flashpool-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                tx.send_replace(Some(sig));
            }
        })
        .context("cannot start the signal thread")?;
    Ok(rx)
}

/// The first stop signal (at once if one came already).
async fn stopped(mut rx: tokio::sync::watch::Receiver<Option<i32>>) -> i32 {
    match rx.wait_for(Option::is_some).await {
        Ok(sig) => sig.unwrap_or_default(),
        // The signal thread never ends; were it gone, nothing could stop us.
        Err(_) => std::future::pending().await,
    }
}

/// Opens the NVMe/TCP listeners and the API: the last steps of a start
/// that can fail.
fn listen(
    rt: &tokio::runtime::Runtime,
    cfg: &config::NodeConfig,
    listeners: &[nvmf_target::ListenerConfig],
    target: &Arc<Target>,
    node: &Arc<Node>,
    agent: &Option<Arc<crate::agent::Agent>>,
) -> Result<(Server, Option<crate::api::Started>)> {
    let server = Server::start(target.clone(), listeners)?;
    if cfg.remote.reactor_queues {
        nvmf_host::remote::bind_reactors(server.reactor_handles());
    }
    if !cfg.api.enabled {
        return Ok((server, None));
    }
    let app = crate::api::App {
        node: node.clone(),
        agent: agent.clone(),
    };
    let started = crate::api::start(rt, app, &cfg.api, cfg.node.state_dir.as_deref())?;
    if let Some(a) = agent {
        a.set_peer_api(Arc::new(crate::client::PeerApi::new(
            started.auth.clone(),
            &cfg.api,
        )?));
    }
    Ok((server, Some(started)))
}

/// What `serve` takes from the file, checked without touching a drive, a
/// port or etcd.
struct Checked {
    drive_specs: Vec<crate::node::DriveSpec>,
    volume_specs: Vec<crate::node::CreateVolume>,
    cluster: crate::node::identity::Cluster,
    membership: Option<config::Membership>,
}

/// The checks `serve --check` makes and `serve` makes first: one function
/// for both, so that a file the check passes is not refused at start (and
/// a start that would be refused fails before it joins a cluster).
fn check(cfg: &config::NodeConfig) -> Result<Checked> {
    let (drive_specs, volume_specs) = config::node_specs(cfg)?;
    let cluster = config::identity(cfg)?;
    let membership = match &cfg.cluster {
        Some(c) => Some(config::membership::membership(c, &config::listeners(cfg)?)?),
        None => None,
    };
    if cfg.api.enabled {
        // The address (HTTPS off loopback), the HTTPS files and the client
        // certificate settings.
        crate::api::check(&cfg.api)?;
    }
    Ok(Checked {
        drive_specs,
        volume_specs,
        cluster,
        membership,
    })
}

fn init_logging(level: &str, format: config::LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        config::LogFormat::Text => b
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_target(false)
            .try_init(),
        // One object per line: time, level, target (flashpool::event for
        // events), and the fields (seq, kind, volume, ...) flattened
        // beside the message, for log shippers.
        config::LogFormat::Json => b
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_target(true)
            .try_init(),
    };
}

fn print_banner(
    server: &Server,
    origin: &str,
    api: Option<crate::api::Started>,
    rt: &tokio::runtime::Runtime,
    node: &Arc<Node>,
) {
    let t = server.target();
    outln!(
        "flashpool {} serving NVMe/TCP ({origin})",
        env!("CARGO_PKG_VERSION")
    );
    for s in t.subsystems().iter() {
        let who = if s.allow_any_host {
            "any host".to_string()
        } else {
            format!("hosts {}", s.hosts.join(", "))
        };
        outln!("  subsystem {} (serial {}, {who})", s.nqn, s.serial);
        for ns in s.namespaces().iter() {
            outln!("    nsid {}: {}", ns.nsid, ns.dev.describe());
        }
    }
    for v in rt.block_on(node.volumes()) {
        outln!(
            "  volume {}: {} {}, {} on drives {}",
            v.name,
            v.layout,
            crate::units::human_bytes(v.size_bytes),
            v.state,
            v.members
                .iter()
                .map(|m| m.drive.as_str())
                .collect::<Vec<_>>()
                .join(",")
        );
    }
    if let Some(a) = api {
        let files: Vec<String> = a
            .auth
            .token_files()
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let api_arg = if a.url.starts_with("https") {
            a.url.clone()
        } else {
            a.addr.to_string()
        };
        outln!(
            "  management API: {}/v1/ (flashpool volume list --api {api_arg}); token in {}",
            a.url,
            files.join(" and ")
        );
    }
    for line in attach_lines(&t.subsystems(), server.local_addrs(), node.cluster()) {
        outln!("{line}");
    }
}

/// The banner's lines on attaching: `nvme discover` and `nvme connect` for
/// the subsystems that are for hosts. A drive export is not: only the nodes
/// on its allow-list may connect (a Linux host's own NQN is refused), and
/// they do so by themselves; those get a line saying who may use them.
fn attach_lines(
    subsystems: &[Arc<nvmf_target::Subsystem>],
    addrs: &[(std::net::SocketAddr, ListenerKind)],
    cluster: &crate::node::identity::Cluster,
) -> Vec<String> {
    let mut out = Vec::new();
    let drive_prefix = crate::node::identity::drive_nqn(&cluster.node_name, "");
    let (exports, for_hosts): (Vec<_>, Vec<_>) = subsystems
        .iter()
        .partition(|s| s.nqn.starts_with(&drive_prefix));
    if !exports.is_empty() {
        out.push(
            "Drives exported to other nodes (they connect by themselves; no other host may):"
                .to_string(),
        );
        for s in &exports {
            // A peer's host NQN by the peer's name.
            let who: Vec<String> = s
                .hosts
                .iter()
                .map(|h| match cluster.peers.iter().find(|p| p.host_nqn == *h) {
                    Some(p) => format!("node {}", p.name),
                    None => h.clone(),
                })
                .collect();
            out.push(format!(
                "  drive {}: {} for {}",
                &s.nqn[drive_prefix.len()..],
                s.nqn,
                who.join(", ")
            ));
        }
        if for_hosts.is_empty() {
            return out;
        }
    }
    let host_addr = |a: std::net::SocketAddr| {
        if a.ip().is_unspecified() {
            "<this-node-ip>".to_string()
        } else {
            a.ip().to_string()
        }
    };
    out.push("Attach a Linux host (nvme-cli):".to_string());
    out.push("  modprobe nvme-tcp".to_string());
    for (a, k) in addrs {
        if *k == ListenerKind::Discovery {
            out.push(format!(
                "  nvme discover -t tcp -a {} -s {}",
                host_addr(*a),
                a.port()
            ));
        }
    }
    if let Some((a, _)) = addrs.iter().find(|(_, k)| *k == ListenerKind::Io) {
        for s in &for_hosts {
            out.push(format!(
                "  nvme connect -t tcp -a {} -s {} -n {}",
                host_addr(*a),
                a.port(),
                s.nqn
            ));
        }
    }
    out
}

#[cfg(test)]
#[path = "serve_tests.rs"]
mod tests;

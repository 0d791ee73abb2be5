//! `flashpool serve`: start the target, print how to attach, stop cleanly on SIGINT/SIGTERM.

use std::path::Path;
use std::sync::Arc;

use anyhow::Result;
use nvmf_target::{ListenerKind, Server, Target};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::config;

pub fn run(path: Option<&Path>, check_only: bool) -> Result<()> {
    let (cfg, origin) = config::load(path)?;
    init_logging(&cfg.node.log);
    // Signals are blocked from here on, so a SIGTERM during start-up is not lost.
    let mut signals = Signals::new([SIGINT, SIGTERM])?;
    let built = config::build(&cfg)?;
    if check_only {
        println!(
            "config {origin}: OK ({} subsystems)",
            built.subsystems.len()
        );
        return Ok(());
    }
    let target = Arc::new(Target::new(built.transport, built.subsystems));
    let server = Server::start(target.clone(), &built.listeners)?;
    print_banner(&server, &origin);
    if let Some(sig) = signals.forever().next() {
        tracing::info!("signal {sig}: stopping (in-flight I/O completes, files are flushed)");
    }
    server.shutdown();
    tracing::info!("stopped cleanly");
    Ok(())
}

fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

fn print_banner(server: &Server, origin: &str) {
    let t = server.target();
    println!(
        "flashpool {} serving NVMe/TCP ({origin})",
        env!("CARGO_PKG_VERSION")
    );
    for s in &t.subsystems {
        let who = if s.allow_any_host {
            "any host".to_string()
        } else {
            format!("hosts {}", s.hosts.join(", "))
        };
        println!("  subsystem {} (serial {}, {who})", s.nqn, s.serial);
        for ns in s.namespaces().iter() {
            println!("    nsid {}: {}", ns.nsid, ns.dev.describe());
        }
    }
    let host_addr = |a: std::net::SocketAddr| {
        if a.ip().is_unspecified() {
            "<this-node-ip>".to_string()
        } else {
            a.ip().to_string()
        }
    };
    println!("Attach a Linux host (nvme-cli):");
    println!("  modprobe nvme-tcp");
    for (a, k) in server.local_addrs() {
        if *k == ListenerKind::Discovery {
            println!(
                "  nvme discover -t tcp -a {} -s {}",
                host_addr(*a),
                a.port()
            );
        }
    }
    if let Some((a, _)) = server
        .local_addrs()
        .iter()
        .find(|(_, k)| *k == ListenerKind::Io)
    {
        for s in &t.subsystems {
            println!(
                "  nvme connect -t tcp -a {} -s {} -n {}",
                host_addr(*a),
                a.port(),
                s.nqn
            );
        }
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
}

//! flashpool: disaggregated flash over NVMe/TCP.

// Standard output goes through `output::outln!`: `println!` panics on a closed pipe.
#![deny(clippy::print_stdout)]

mod agent;
mod api;
mod api_types;
mod attach;
mod cli;
mod client;
mod config;
mod events;
mod host_events;
mod metrics;
mod node;
mod serve;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};
// At the root, so the modules name them `crate::output`, `crate::units`, `crate::echo`.
use flashpool_util::{echo, output, units};

#[derive(Parser)]
#[command(
    name = "flashpool",
    version,
    about = "Software-defined flash storage over NVMe/TCP"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve subsystems over NVMe/TCP. Without -c: a 1 GiB RAM namespace on 127.0.0.1:4420.
    Serve {
        /// Node configuration (TOML, see docs/config.md).
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// Check the configuration and exit without serving.
        #[arg(long)]
        check: bool,
        /// Log lines as text or JSON objects (overrides [node] log_format).
        #[arg(long, value_enum)]
        log_format: Option<config::LogFormat>,
    },
    /// Volumes of a running node (through its management API).
    Volume {
        #[command(flatten)]
        api: cli::ApiArgs,
        #[command(subcommand)]
        cmd: cli::volume::VolumeCmd,
    },
    /// Snapshots of thin volumes (through the management API).
    Snapshot {
        #[command(flatten)]
        api: cli::ApiArgs,
        #[command(subcommand)]
        cmd: cli::snapshot::SnapshotCmd,
    },
    /// Thin pools: the metadata check.
    Pool {
        #[command(flatten)]
        api: cli::ApiArgs,
        #[command(subcommand)]
        cmd: cli::snapshot::PoolCmd,
    },
    /// Drives of a running node (through its management API).
    Drive {
        #[command(flatten)]
        api: cli::ApiArgs,
        #[command(subcommand)]
        cmd: cli::drive::DriveCmd,
    },
    /// Background jobs of a running node: initial sync, rebuild, scrub.
    Job {
        #[command(flatten)]
        api: cli::ApiArgs,
        #[command(subcommand)]
        cmd: cli::job::JobCmd,
    },
    /// The cluster a node belongs to (through its management API).
    Cluster {
        #[command(flatten)]
        api: cli::ApiArgs,
        #[command(subcommand)]
        cmd: cli::cluster::ClusterCmd,
    },
    /// Cluster nodes: drain one before maintenance.
    Node {
        #[command(flatten)]
        api: cli::ApiArgs,
        #[command(subcommand)]
        cmd: cli::cluster::NodeCmd,
    },
    /// What the node reports: drives failed, rebuilds, volume states, thin pools filling,
    /// hosts connected or refused. --follow streams them as `mdadm --monitor` does.
    Events {
        #[command(flatten)]
        api: cli::ApiArgs,
        #[command(flatten)]
        args: cli::events::EventsArgs,
    },
    /// The management API itself: rotate its token.
    Api {
        #[command(flatten)]
        api: cli::ApiArgs,
        #[command(subcommand)]
        cmd: cli::token::ApiCmd,
    },
    /// A namespace as a local file through FUSE, without the kernel's NVMe/TCP host:
    /// DIR/disk is tcp://HOST:PORT/NQN?nsid=N (or mem:SIZE, file:PATH). Ctrl-C unmounts.
    Attach(Box<attach::AttachArgs>),
    /// Load a target and measure it: tcp://ADDR:PORT/NQN, file:PATH (io_uring, O_DIRECT) or mem:SIZE.
    Bench(Box<flashpool_bench::BenchArgs>),
    /// After a fault, when does a survivor serve each volume (ANA Optimized and a verified
    /// write+read)? For docs/bench/cluster-scale.sh.
    #[command(hide = true)]
    FailoverProbe(Box<flashpool_bench::FailoverArgs>),
}

fn main() {
    let cli = Cli::parse();
    let r: Result<()> = match cli.cmd {
        Cmd::Serve {
            config,
            check,
            log_format,
        } => serve::run(config.as_deref(), check, log_format),
        Cmd::Bench(args) => flashpool_bench::run(*args),
        Cmd::Attach(args) => attach::run(*args),
        Cmd::FailoverProbe(args) => flashpool_bench::failover_probe(*args),
        Cmd::Volume { api, cmd } => cli::volume::volume(api, cmd),
        Cmd::Snapshot { api, cmd } => cli::snapshot::snapshot(api, cmd),
        Cmd::Pool { api, cmd } => cli::snapshot::pool(api, cmd),
        Cmd::Drive { api, cmd } => cli::drive::drive(api, cmd),
        Cmd::Job { api, cmd } => cli::job::job(api, cmd),
        Cmd::Cluster { api, cmd } => cli::cluster::cluster(api, cmd),
        Cmd::Node { api, cmd } => cli::cluster::node(api, cmd),
        Cmd::Events { api, args } => cli::events::events(api, args),
        Cmd::Api { api, cmd } => cli::token::api(api, cmd),
    };
    if let Err(e) = r {
        // Not eprintln!: it panics when stderr is closed too.
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "flashpool: error: {e:#}");
        std::process::exit(1);
    }
    if output::failed() {
        std::process::exit(1);
    }
}

//! `flashpool bench`: a load generator in the spirit of fio, against an
//! NVMe/TCP namespace (`tcp://`), a local file or block device through
//! io_uring with O_DIRECT (`file:`), or RAM in this process (`mem:`).
//!
//! [`run_workload`] is the whole measurement of one target; the CLI is a thin
//! layer over it, so a comparison across targets can call it in a loop.
//!
//! A crate of its own, below the `flashpool` binary: it loads targets as a
//! host does (through `nvmf-host` and `blockdev`) and never imports the
//! node's code.

// Standard output goes through `out!`: `println!` panics on a closed pipe.
#![deny(clippy::print_stdout)]

mod args;
mod backend;
mod drive;
mod engine;
mod failover;
mod open;
mod progress;
mod report;
mod rounds;
mod spec;
mod stats;
mod verify;

use anyhow::{Context, Result, bail};
use flashpool_util::output::{out, outln};

pub use args::BenchArgs;
pub use drive::run_workload;
pub use failover::{FailoverArgs, run as failover_probe};
pub use report::Matrix;
pub use spec::{Engine, Rw, Target, Workload};
pub use stats::Summary;

/// `flashpool bench ...`
pub fn run(args: BenchArgs) -> Result<()> {
    if let [spec, dir] = args.render.as_slice() {
        for f in report::doc::render(spec, dir)? {
            outln!("{}", f.display());
        }
        return Ok(());
    }
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

#[cfg(test)]
mod tests;

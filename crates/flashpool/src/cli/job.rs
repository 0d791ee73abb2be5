//! `flashpool job ...` and `flashpool volume scrub`: background jobs of a
//! running node (initial sync, rebuild, scrub) with progress and ETA.

use std::time::Duration;

use anyhow::Result;

use super::ApiArgs;
use crate::api_types::{JobInfo, JobKind, ScrubRequest};
use crate::client::Client;
use crate::output::outln;

#[derive(clap::Subcommand, Debug)]
pub enum JobCmd {
    /// Running and recently ended jobs.
    List,
    /// One job; --wait follows it until it ends.
    Show {
        id: u64,
        #[arg(long)]
        wait: bool,
    },
}

#[derive(clap::Args, Debug)]
pub struct ScrubArgs {
    pub name: String,
    /// Rewrite parity that disagrees with the data (else only count).
    #[arg(long, conflicts_with = "stop")]
    pub repair: bool,
    /// Speed limit per second, e.g. 100MiB.
    #[arg(long, conflicts_with = "stop")]
    pub rate: Option<String>,
    /// Stop the running scrub (what it found so far is kept).
    #[arg(long)]
    pub stop: bool,
    /// Wait until it ends, printing progress.
    #[arg(long, conflicts_with = "stop")]
    pub wait: bool,
}

/// `flashpool job ...`.
pub fn job(api: ApiArgs, cmd: JobCmd) -> Result<()> {
    let c = api.client()?;
    match cmd {
        JobCmd::List => {
            let a = c.get("/jobs")?;
            if api.json {
                return api.print_json(a.json());
            }
            outln!(
                "{:>4} {:<8} {:<14} {:<9} {:>7} {:>9} {:>8}  detail",
                "ID",
                "KIND",
                "VOLUME",
                "STATE",
                "DONE",
                "MB/S",
                "ETA"
            );
            let jobs: Vec<JobInfo> = a.parse()?;
            for j in &jobs {
                outln!("{}", job_line(j));
            }
            Ok(())
        }
        JobCmd::Show { id, wait } => follow(&c, id, wait, api.json),
    }
}

/// `flashpool volume scrub`.
pub fn scrub(api: ApiArgs, a: ScrubArgs) -> Result<()> {
    let c = api.client()?;
    let name = &a.name;
    let answer = if a.stop {
        c.post::<()>(
            &format!("/volumes/{}/scrub/stop", crate::client::segment(name)),
            None,
        )?
    } else {
        let req = ScrubRequest {
            repair: a.repair,
            rate: a.rate.clone(),
        };
        c.post(
            &format!("/volumes/{}/scrub", crate::client::segment(name)),
            Some(&req),
        )?
    };
    let id = answer.parse::<JobInfo>()?.id;
    if a.wait {
        return follow(&c, id, true, api.json);
    }
    if api.json {
        api.print_json(answer.json())?;
    } else if a.stop {
        outln!("volume {name}: scrub job {id} is stopping");
    } else {
        outln!("volume {name}: scrub started as job {id} (flashpool job show {id} --wait)");
    }
    Ok(())
}

fn follow(c: &Client, id: u64, wait: bool, as_json: bool) -> Result<()> {
    loop {
        let a = c.get(&format!("/jobs/{id}"))?;
        let j: JobInfo = a.parse()?;
        if as_json {
            outln!("{}", serde_json::to_string(a.json())?);
        } else {
            outln!("{}", job_line(&j));
        }
        let running = j.state.name() == "running";
        if !wait || !running || crate::output::reader_gone() {
            if let Some(e) = j.state.error() {
                anyhow::bail!("job {id} failed: {e}");
            }
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn job_line(j: &JobInfo) -> String {
    let eta = j.eta_secs.map_or("-".to_string(), |s| format!("{s:.0}s"));
    let mut detail = Vec::new();
    if !j.drives.is_empty() {
        detail.push(format!("rebuilding {}", j.drives.join(",")));
    }
    if !j.queued_drives.is_empty() {
        detail.push(format!("then {}", j.queued_drives.join(",")));
    }
    if j.kind == JobKind::Scrub {
        detail.push(format!(
            "{}: {} mismatched, {} repaired",
            if j.repair == Some(true) {
                "repair"
            } else {
                "check"
            },
            j.mismatches,
            j.repaired
        ));
    }
    if j.skipped > 0 {
        detail.push(format!("{} stripes skipped", j.skipped));
    }
    if let Some(e) = j.state.error() {
        detail.push(format!("error: {e}"));
    }
    format!(
        "{:>4} {:<8} {:<14} {:<9} {:>6.1}% {:>9.1} {:>8}  {}",
        j.id,
        j.kind.name(),
        j.volume,
        j.state.name(),
        j.percent,
        j.mb_per_sec,
        eta,
        detail.join("; ")
    )
}

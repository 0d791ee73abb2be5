//! `flashpool job ...` and `flashpool volume scrub`: background jobs of a
//! running node (initial sync, rebuild, scrub) with progress and ETA.

use std::time::Duration;

use anyhow::Result;
use serde_json::{Value, json};

use crate::cli::{ApiArgs, Client};
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

pub fn job(api: ApiArgs, cmd: JobCmd) -> Result<()> {
    let c = Client::new(&api)?;
    match cmd {
        JobCmd::List => {
            let v = c.call("GET", "/jobs", None)?;
            if api.json {
                outln!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
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
            for j in v.as_array().into_iter().flatten() {
                outln!("{}", job_line(j));
            }
            Ok(())
        }
        JobCmd::Show { id, wait } => follow(&c, id, wait, api.json),
    }
}

pub fn scrub(api: ApiArgs, a: ScrubArgs) -> Result<()> {
    let c = Client::new(&api)?;
    let name = &a.name;
    let v = if a.stop {
        c.call("POST", &format!("/volumes/{name}/scrub/stop"), None)?
    } else {
        let mut body = json!({ "repair": a.repair });
        if let Some(r) = &a.rate {
            body["rate"] = json!(r);
        }
        c.call("POST", &format!("/volumes/{name}/scrub"), Some(body))?
    };
    let id = v["id"].as_u64().unwrap_or(0);
    if a.wait {
        return follow(&c, id, true, api.json);
    }
    if api.json {
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else if a.stop {
        outln!("volume {name}: scrub job {id} is stopping");
    } else {
        outln!("volume {name}: scrub started as job {id} (flashpool job show {id} --wait)");
    }
    Ok(())
}

fn follow(c: &Client, id: u64, wait: bool, as_json: bool) -> Result<()> {
    loop {
        let j = c.call("GET", &format!("/jobs/{id}"), None)?;
        if as_json {
            outln!("{}", serde_json::to_string(&j)?);
        } else {
            outln!("{}", job_line(&j));
        }
        let running = j["state"].as_str() == Some("running");
        if !wait || !running || crate::output::reader_gone() {
            if let Some(e) = j["error"].as_str() {
                anyhow::bail!("job {id} failed: {e}");
            }
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn job_line(j: &Value) -> String {
    let eta = j["eta_secs"]
        .as_f64()
        .map_or("-".to_string(), |s| format!("{s:.0}s"));
    let mut detail = Vec::new();
    let drives = |k: &str| -> Vec<String> {
        j[k].as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d.as_str().map(String::from))
            .collect()
    };
    let (now, queued) = (drives("drives"), drives("queued_drives"));
    if !now.is_empty() {
        detail.push(format!("rebuilding {}", now.join(",")));
    }
    if !queued.is_empty() {
        detail.push(format!("then {}", queued.join(",")));
    }
    if j["kind"].as_str() == Some("scrub") {
        detail.push(format!(
            "{}: {} mismatched, {} repaired",
            if j["repair"].as_bool() == Some(true) {
                "repair"
            } else {
                "check"
            },
            j["mismatches"],
            j["repaired"]
        ));
    }
    if j["skipped"].as_u64().unwrap_or(0) > 0 {
        detail.push(format!("{} stripes skipped", j["skipped"]));
    }
    if let Some(e) = j["error"].as_str() {
        detail.push(format!("error: {e}"));
    }
    format!(
        "{:>4} {:<8} {:<14} {:<9} {:>6.1}% {:>9.1} {:>8}  {}",
        j["id"].as_u64().unwrap_or(0),
        j["kind"].as_str().unwrap_or("?"),
        j["volume"].as_str().unwrap_or("?"),
        j["state"].as_str().unwrap_or("?"),
        j["percent"].as_f64().unwrap_or(0.0),
        j["mb_per_sec"].as_f64().unwrap_or(0.0),
        eta,
        detail.join("; ")
    )
}

//! `flashpool volume ...` and `flashpool drive ...`: a thin client of the
//! management API of a running `flashpool serve`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::config::DEFAULT_API_ADDRESS;
use crate::output::outln;
use crate::units::human_bytes;

#[derive(clap::Args, Debug)]
pub struct ApiArgs {
    /// Management API of the node (ADDR:PORT).
    #[arg(long, global = true, env = "FLASHPOOL_API", default_value = DEFAULT_API_ADDRESS)]
    pub(crate) api: String,
    /// Print the API's JSON answer instead of a table.
    #[arg(long, global = true)]
    pub(crate) json: bool,
}

#[derive(clap::Subcommand, Debug)]
pub enum VolumeCmd {
    /// Make a volume on free drives (--layout, --drives), or a thin volume in a pool (--pool, --size).
    Create {
        name: String,
        /// concat, raid0, raid1, raid5, raid6 or ecK+M (e.g. ec8+2).
        #[arg(long, requires = "drives", conflicts_with = "pool")]
        layout: Option<String>,
        /// Drives by member position, comma separated (d0,d1,d2).
        #[arg(long, value_delimiter = ',', requires = "layout")]
        drives: Vec<String>,
        /// Format the new volume as a thin pool.
        #[arg(long, requires = "layout")]
        thin_pool: bool,
        /// Thin pool allocation unit (default 1MiB).
        #[arg(long, requires = "thin_pool")]
        cluster: Option<String>,
        /// A thin volume in the pool on this volume...
        #[arg(long, requires = "size")]
        pool: Option<String>,
        /// ...of this size (e.g. 100GiB; may exceed the pool).
        #[arg(long, requires = "pool")]
        size: Option<String>,
        /// Strip size per member (default 64KiB).
        #[arg(long)]
        strip: Option<String>,
        /// Volume block size: 4096 (default) or 512.
        #[arg(long)]
        block_size: Option<u32>,
        /// Rebuild speed limit per second, e.g. 200MiB.
        #[arg(long)]
        rebuild_rate: Option<String>,
        /// Serve it at once in this subsystem...
        #[arg(long, requires = "nsid")]
        export: Option<String>,
        /// ...as this namespace ID.
        #[arg(long, requires = "export")]
        nsid: Option<u32>,
    },
    /// All volumes.
    List,
    /// One volume in detail.
    Show { name: String },
    /// Delete a volume that is not exported; its drives become free.
    Delete {
        name: String,
        /// Delete it even though it holds data (every volume on drives, a thin
        /// volume with data): all of it is lost.
        #[arg(long)]
        force: bool,
    },
    /// Serve a volume as namespace NSID of subsystem NQN.
    Export {
        name: String,
        #[arg(long)]
        nqn: String,
        #[arg(long)]
        nsid: u32,
    },
    /// Stop serving a volume.
    Unexport {
        name: String,
        /// Unexport it even while hosts are connected (their I/O to it fails).
        #[arg(long)]
        force: bool,
    },
    /// Assemble a volume from its drives (local, PEER:DRIVE or tcp:// URLs), e.g. on the
    /// node that takes over from a dead owner; or an offline volume by NAME, from the drives
    /// the node knows it by.
    Assemble {
        /// An offline volume of this node (instead of --drives).
        #[arg(conflicts_with = "drives", required_unless_present = "drives")]
        name: Option<String>,
        /// The volume's drives, in any order, comma separated.
        #[arg(long, value_delimiter = ',')]
        drives: Vec<String>,
        /// When more members are failed or stale than the layout tolerates, take the
        /// freshest back as active, just enough to run (mdadm --assemble --force). Blocks
        /// written while they were away may hold old data: the answer lists the ranges; fsck.
        #[arg(long)]
        force: bool,
        /// Preempt the owner's reservation on the remote drives and abort its writes:
        /// only when that node is gone or must be deposed.
        #[arg(long)]
        takeover: bool,
        /// Serve it at once in this subsystem...
        #[arg(long, requires = "nsid")]
        export: Option<String>,
        /// ...as this namespace ID.
        #[arg(long, requires = "export")]
        nsid: Option<u32>,
    },
    /// Move a cluster volume to another node (planned: the host's I/O pauses, nothing fails).
    Move {
        name: String,
        /// The node that takes it over.
        #[arg(long)]
        to: String,
    },
    /// Rebuild progress and ETA.
    RebuildStatus {
        name: String,
        /// Wait until the rebuild is over, printing progress.
        #[arg(long)]
        wait: bool,
    },
}

#[derive(clap::Subcommand, Debug)]
pub enum DriveCmd {
    /// All drives and what uses them.
    List,
    /// Mark a drive failed; its volume runs degraded. Refused when that
    /// would take the volume beyond its redundancy (data lost), unless --force.
    Fail {
        name: String,
        /// Fail it even if its volume then fails (the error says what is lost).
        #[arg(long)]
        force: bool,
    },
    /// Put drive WITH in the place of NAME in its volume and rebuild onto it.
    Replace {
        name: String,
        #[arg(long)]
        with: String,
    },
    /// Serve a drive to other nodes (JBOF mode) as nqn.2026-01.io.flashpool:drive:NODE:NAME.
    Export {
        name: String,
        /// Host NQNs allowed to connect, comma separated (default: the [[peer]]s').
        #[arg(long, value_delimiter = ',')]
        hosts: Vec<String>,
    },
    /// Stop serving a drive to other nodes; their connections end.
    Unexport { name: String },
    /// Put a failed drive back: into its volume (resyncing only what it missed, or
    /// rebuilding it in full when that is unknown), or, in no volume, back to free.
    ReAdd { name: String },
}

pub(crate) struct Client {
    base: String,
    agent: ureq::Agent,
}

impl Client {
    pub(crate) fn new(api: &str) -> Client {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(3600)))
            .build()
            .into();
        Client {
            base: format!("http://{api}/v1"),
            agent,
        }
    }

    /// One call; an error answer becomes an error carrying the API's message.
    pub(crate) fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        let sent = match (method, body) {
            ("GET", _) => self.agent.get(&url).call(),
            ("DELETE", _) => self.agent.delete(&url).call(),
            (_, Some(b)) => self
                .agent
                .post(&url)
                .header("Content-Type", "application/json")
                .send(b.to_string()),
            (_, None) => self.agent.post(&url).send_empty(),
        };
        let mut resp = sent.with_context(|| {
            format!(
                "cannot reach the management API at {}: is `flashpool serve` running? (set --api or FLASHPOOL_API)",
                self.base
            )
        })?;
        let status = resp.status();
        let text = resp
            .body_mut()
            .read_to_string()
            .context("reading the API's answer")?;
        let v: Value = serde_json::from_str(&text).with_context(|| {
            format!("the API answered {status} with something that is not JSON: {text}")
        })?;
        if !status.is_success() {
            let msg = v["error"].as_str().unwrap_or(&text);
            bail!("{msg}");
        }
        Ok(v)
    }
}

pub fn volume(api: ApiArgs, cmd: VolumeCmd) -> Result<()> {
    let c = Client::new(&api.api);
    let v = match cmd {
        VolumeCmd::Create {
            name,
            layout,
            drives,
            thin_pool,
            cluster,
            pool,
            size,
            strip,
            block_size,
            rebuild_rate,
            export,
            nsid,
        } => {
            let mut b = json!({ "name": name });
            if let Some(l) = layout {
                b["layout"] = json!(l);
                b["drives"] = json!(drives);
            }
            if thin_pool {
                b["thin_pool"] = json!(true);
            }
            if let Some(c) = cluster {
                b["cluster"] = json!(c);
            }
            if let (Some(p), Some(sz)) = (pool, size) {
                b["pool"] = json!(p);
                b["size"] = json!(sz);
            }
            if let Some(s) = strip {
                b["strip"] = json!(s);
            }
            if let Some(s) = block_size {
                b["block_size"] = json!(s);
            }
            if let Some(s) = rebuild_rate {
                b["rebuild_rate"] = json!(s);
            }
            if let (Some(nqn), Some(nsid)) = (export, nsid) {
                b["export"] = json!({ "nqn": nqn, "nsid": nsid });
            }
            c.call("POST", "/volumes", Some(b))?
        }
        VolumeCmd::List => {
            let v = c.call("GET", "/volumes", None)?;
            if api.json {
                outln!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print_volume_table(&v);
            }
            return Ok(());
        }
        VolumeCmd::Show { name } => c.call("GET", &format!("/volumes/{name}"), None)?,
        VolumeCmd::Delete { name, force } => {
            let q = if force { "?force=true" } else { "" };
            let v = c.call("DELETE", &format!("/volumes/{name}{q}"), None)?;
            if api.json {
                outln!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                outln!("volume {}: deleted", v["deleted"].as_str().unwrap_or(&name));
            }
            return Ok(());
        }
        VolumeCmd::Export { name, nqn, nsid } => c.call(
            "POST",
            &format!("/volumes/{name}/export"),
            Some(json!({ "nqn": nqn, "nsid": nsid })),
        )?,
        VolumeCmd::Unexport { name, force } => c.call(
            "POST",
            &format!("/volumes/{name}/unexport"),
            force.then(|| json!({ "force": true })),
        )?,
        VolumeCmd::Assemble {
            name: Some(name),
            force,
            ..
        } => {
            let v = c.call(
                "POST",
                &format!("/volumes/{name}/assemble"),
                Some(json!({ "force": force })),
            )?;
            print_forced(&v, api.json)?;
            v
        }
        VolumeCmd::Assemble {
            name: None,
            drives,
            takeover,
            force,
            export,
            nsid,
        } => {
            let mut b = json!({ "drives": drives, "takeover": takeover, "force": force });
            if let (Some(nqn), Some(nsid)) = (export, nsid) {
                b["export"] = json!({ "nqn": nqn, "nsid": nsid });
            }
            let v = c.call("POST", "/volumes/assemble", Some(b))?;
            print_forced(&v, api.json)?;
            v
        }
        VolumeCmd::Move { name, to } => {
            let v = c.call(
                "POST",
                &format!("/volumes/{name}/move"),
                Some(json!({ "to": to })),
            )?;
            if api.json {
                outln!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                outln!(
                    "volume {name}: moved from {} to {} (epoch {}) in {} ms",
                    v["from"].as_str().unwrap_or("?"),
                    v["to"].as_str().unwrap_or("?"),
                    v["epoch"],
                    v["took_ms"]
                );
            }
            return Ok(());
        }
        VolumeCmd::RebuildStatus { name, wait } => {
            return rebuild_status(&c, &name, wait, api.json);
        }
    };
    if api.json {
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_volume(&v);
    }
    Ok(())
}

pub fn drive(api: ApiArgs, cmd: DriveCmd) -> Result<()> {
    let c = Client::new(&api.api);
    let v = match cmd {
        DriveCmd::List => c.call("GET", "/drives", None)?,
        DriveCmd::Fail { name, force } => c.call(
            "POST",
            &format!("/drives/{name}/fail"),
            force.then(|| json!({ "force": true })),
        )?,
        DriveCmd::Export { name, hosts } => c.call(
            "POST",
            &format!("/drives/{name}/export"),
            Some(json!({ "hosts": hosts })),
        )?,
        DriveCmd::Unexport { name } => c.call("DELETE", &format!("/drives/{name}/export"), None)?,
        DriveCmd::ReAdd { name } => {
            let v = c.call("POST", &format!("/drives/{name}/re-add"), None)?;
            if api.json {
                outln!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                outln!("{}", v["message"].as_str().unwrap_or("re-added"));
            }
            return Ok(());
        }
        DriveCmd::Replace { name, with } => {
            let v = c.call(
                "POST",
                &format!("/drives/{name}/replace"),
                Some(json!({ "with": with })),
            )?;
            if api.json {
                outln!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print_volume(&v);
            }
            return Ok(());
        }
    };
    if api.json {
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let rows = match &v {
        Value::Array(a) => a.clone(),
        one => vec![one.clone()],
    };
    outln!(
        "{:<12} {:<7} {:>10} {:<8} {:<12} device",
        "DRIVE",
        "BACKEND",
        "SIZE",
        "STATE",
        "VOLUME"
    );
    let note = |d: &Value| -> String {
        let mut s = String::new();
        if let Some(n) = d["export"]["nqn"].as_str() {
            s += &format!(" [exported as {n}]");
        }
        if let Some(l) = d["link"].as_str() {
            s += &format!(" [link {l}]");
        }
        s
    };
    for d in rows {
        let user = match (d["volume"].as_str(), d["position"].as_u64()) {
            (Some(v), Some(p)) => format!("{v}[{p}]"),
            _ => "-".into(),
        };
        outln!(
            "{:<12} {:<7} {:>10} {:<8} {:<12} {}{}",
            d["name"].as_str().unwrap_or("?"),
            d["backend"].as_str().unwrap_or("?"),
            human_bytes(d["size_bytes"].as_u64().unwrap_or(0)),
            d["state"].as_str().unwrap_or("?"),
            user,
            d["device"].as_str().unwrap_or(""),
            note(&d)
        );
    }
    Ok(())
}

fn export_text(v: &Value) -> String {
    match v["export"].as_object() {
        Some(x) => format!(
            "nsid {} of {}",
            x["nsid"].as_u64().unwrap_or(0),
            x["nqn"].as_str().unwrap_or("?")
        ),
        None => "-".into(),
    }
}

fn print_volume_table(v: &Value) {
    outln!(
        "{:<14} {:<8} {:>10} {:<10} {:<24} exported as",
        "VOLUME",
        "LAYOUT",
        "SIZE",
        "STATE",
        "DRIVES"
    );
    for x in v.as_array().into_iter().flatten() {
        let drives: Vec<&str> = x["members"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| m["drive"].as_str().unwrap_or("?"))
            .collect();
        outln!(
            "{:<14} {:<8} {:>10} {:<10} {:<24} {}",
            x["name"].as_str().unwrap_or("?"),
            x["layout"].as_str().unwrap_or("?"),
            human_bytes(x["size_bytes"].as_u64().unwrap_or(0)),
            x["state"].as_str().unwrap_or("?"),
            drives.join(","),
            export_text(x)
        );
        if let Some(r) = x["reason"].as_str() {
            outln!("  {r}");
        }
    }
}

/// A forced assembly's account of what may be stale, before the volume
/// (on stderr with --json, so the JSON stays one document).
fn print_forced(v: &Value, json: bool) -> Result<()> {
    let f = &v["forced"];
    if f.is_null() {
        return Ok(());
    }
    let msg = f["message"].as_str().unwrap_or("assembled with --force");
    if json {
        eprintln!("WARNING: {msg}");
        return Ok(());
    }
    outln!("WARNING: {msg}");
    for r in f["stale_ranges"].as_array().into_iter().flatten().take(32) {
        let at = r["offset_bytes"].as_u64().unwrap_or(0);
        let len = r["len_bytes"].as_u64().unwrap_or(0);
        outln!(
            "  may be stale: bytes {at}..{} ({})",
            at + len,
            human_bytes(len)
        );
    }
    Ok(())
}

fn print_volume(v: &Value) {
    outln!(
        "volume {} ({})",
        v["name"].as_str().unwrap_or("?"),
        v["uuid"].as_str().unwrap_or("?")
    );
    outln!(
        "  {} {}, {} B blocks, {} strips, {}, generation {}",
        v["layout"].as_str().unwrap_or("?"),
        human_bytes(v["size_bytes"].as_u64().unwrap_or(0)),
        v["block_size"].as_u64().unwrap_or(0),
        human_bytes(v["strip_bytes"].as_u64().unwrap_or(0)),
        v["state"].as_str().unwrap_or("?"),
        v["generation"].as_u64().unwrap_or(0)
    );
    if let Some(r) = v["reason"].as_str() {
        outln!("  {}: {r}", v["state"].as_str().unwrap_or("?"));
    }
    outln!("  exported as: {}", export_text(v));
    if let Some(p) = v["pool"].as_str() {
        outln!(
            "  thin, in pool {p}: {} of {} allocated",
            human_bytes(v["allocated_bytes"].as_u64().unwrap_or(0)),
            human_bytes(v["size_bytes"].as_u64().unwrap_or(0))
        );
    }
    if let Some(p) = v["thin_pool"].as_object() {
        let g = |k: &str| human_bytes(p[k].as_u64().unwrap_or(0));
        outln!(
            "  thin pool: {} allocated, {} free of {}, {} provisioned to {} thin volume(s), {} clusters",
            g("allocated_bytes"),
            g("free_bytes"),
            g("capacity_bytes"),
            g("provisioned_bytes"),
            p["volumes"].as_array().map_or(0, |a| a.len()),
            g("cluster_bytes")
        );
    }
    for m in v["members"].as_array().into_iter().flatten() {
        outln!(
            "  member {:>2}: {:<12} {}",
            m["position"].as_u64().unwrap_or(0),
            m["drive"].as_str().unwrap_or("?"),
            m["state"].as_str().unwrap_or("?")
        );
    }
    print_rebuild(&v["rebuild"]);
}

fn print_rebuild(r: &Value) {
    if r["running"].as_bool() == Some(true) {
        let eta = r["eta_secs"]
            .as_f64()
            .map_or("?".to_string(), |s| format!("{s:.0}s"));
        outln!(
            "  rebuild: {:.1}% ({} of {} stripes), {:.1} MB/s, ETA {eta}",
            r["percent"].as_f64().unwrap_or(0.0),
            r["done_stripes"].as_u64().unwrap_or(0),
            r["total_stripes"].as_u64().unwrap_or(0),
            r["mb_per_sec"].as_f64().unwrap_or(0.0)
        );
    } else if let Some(e) = r["last_error"].as_str() {
        outln!("  rebuild: failed: {e}");
    } else {
        outln!("  rebuild: not running");
    }
}

fn rebuild_status(c: &Client, name: &str, wait: bool, as_json: bool) -> Result<()> {
    let start = Instant::now();
    loop {
        let v = c.call("GET", &format!("/volumes/{name}/rebuild"), None)?;
        let running = v["rebuild"]["running"].as_bool() == Some(true)
            || matches!(v["state"].as_str(), Some("rebuilding" | "resyncing"));
        if as_json {
            outln!("{}", serde_json::to_string(&v)?);
        } else {
            outln!("volume {name}: {}", v["state"].as_str().unwrap_or("?"));
            print_rebuild(&v["rebuild"]);
        }
        // Nobody reads the progress any more (`| head`): stop waiting.
        if !wait || !running || crate::output::reader_gone() {
            if let Some(e) = v["rebuild"]["last_error"].as_str() {
                bail!("volume {name}: the last rebuild failed: {e}");
            }
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(24 * 3600) {
            bail!("volume {name}: still rebuilding after a day; giving up waiting");
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

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
    /// Management API of the node (ADDR:PORT, or https://ADDR:PORT).
    #[arg(long, global = true, env = "FLASHPOOL_API", default_value = DEFAULT_API_ADDRESS)]
    pub(crate) api: String,
    /// The file with the API token. Default: $FLASHPOOL_TOKEN, else the file the node
    /// left for this --api address (see docs/api.md, Authentication).
    #[arg(long, global = true, env = "FLASHPOOL_TOKEN_FILE")]
    pub(crate) token_file: Option<std::path::PathBuf>,
    /// CA certificates (PEM) that an https:// --api's certificate is checked against.
    #[arg(long, global = true, env = "FLASHPOOL_CA_FILE")]
    pub(crate) ca_file: Option<std::path::PathBuf>,
    /// A client certificate chain (PEM) for an https:// --api whose node asks for one
    /// ([api] client_ca); with --client-key.
    #[arg(
        long,
        global = true,
        env = "FLASHPOOL_CLIENT_CERT",
        requires = "client_key"
    )]
    pub(crate) client_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of --client-cert.
    #[arg(
        long,
        global = true,
        env = "FLASHPOOL_CLIENT_KEY",
        requires = "client_cert"
    )]
    pub(crate) client_key: Option<std::path::PathBuf>,
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
    /// Check (or with --repair, fix) a volume's parity against its data, as a job.
    Scrub(crate::jobs_cli::ScrubArgs),
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
    token: ApiToken,
}

/// The API token the CLI sends, and where it found it (for the error that
/// a refused one gets).
pub(crate) struct ApiToken {
    header: Option<String>,
    from: String,
}

impl ApiToken {
    /// `FLASHPOOL_TOKEN`, `--token-file` (`FLASHPOOL_TOKEN_FILE`), then the
    /// file the node left for this address in the runtime directory.
    pub(crate) fn find(api: &ApiArgs) -> Result<ApiToken> {
        let bearer = |t: &str| Some(format!("Bearer {}", t.trim()));
        if let Ok(t) = std::env::var("FLASHPOOL_TOKEN")
            && !t.trim().is_empty()
        {
            return Ok(ApiToken {
                header: bearer(&t),
                from: "FLASHPOOL_TOKEN".into(),
            });
        }
        if let Some(f) = &api.token_file {
            let t = std::fs::read_to_string(f)
                .with_context(|| format!("--token-file {}: cannot read it", f.display()))?;
            return Ok(ApiToken {
                header: bearer(&t),
                from: f.display().to_string(),
            });
        }
        let (_, hostport) = api_base(&api.api);
        let f = crate::api_auth::runtime_token_path(hostport);
        Ok(match std::fs::read_to_string(&f) {
            Ok(t) => ApiToken {
                header: bearer(&t),
                from: f.display().to_string(),
            },
            Err(e) => ApiToken {
                header: None,
                from: format!(
                    "nowhere: not in FLASHPOOL_TOKEN, no --token-file, and {}: {e}",
                    f.display()
                ),
            },
        })
    }

    pub(crate) fn apply<B>(&self, r: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.header {
            Some(h) => r.header("Authorization", h),
            None => r,
        }
    }

    /// What to add to a refusal's message.
    pub(crate) fn hint(&self, status: u16) -> String {
        if status == 401 {
            format!(
                " (the CLI took the token from {}; set FLASHPOOL_TOKEN or --token-file to the node's \
                 token file, see docs/api.md, Authentication)",
                self.from
            )
        } else {
            String::new()
        }
    }
}

/// `http://ADDR:PORT` (or the `https://` given) and `ADDR:PORT` of `--api`.
pub(crate) fn api_base(api: &str) -> (String, &str) {
    let api = api.trim_end_matches('/');
    if let Some(h) = api.strip_prefix("https://") {
        (format!("https://{h}"), h)
    } else {
        let h = api.strip_prefix("http://").unwrap_or(api);
        (format!("http://{h}"), h)
    }
}

/// An agent for `--api` (with `--ca-file`'s roots and `--client-cert` for
/// https).
pub(crate) fn api_agent(
    api: &ApiArgs,
    f: impl FnOnce(
        ureq::config::ConfigBuilder<ureq::typestate::AgentScope>,
    ) -> ureq::config::ConfigBuilder<ureq::typestate::AgentScope>,
) -> Result<ureq::Agent> {
    use crate::api_auth::tls;
    let roots = match &api.ca_file {
        Some(ca) => Some(tls::pem_certs("--ca-file", ca)?),
        None => None,
    };
    let cert = match (&api.client_cert, &api.client_key) {
        (Some(c), Some(k)) => Some(tls::client_cert(c, k, ["--client-cert", "--client-key"])?),
        _ => None,
    };
    let b = f(ureq::Agent::config_builder().http_status_as_error(false))
        .tls_config(tls::client_tls(roots.as_deref(), cert));
    Ok(b.build().into())
}

impl Client {
    pub(crate) fn new(api: &ApiArgs) -> Result<Client> {
        let agent = api_agent(api, |b| b.timeout_global(Some(Duration::from_secs(3600))))?;
        Ok(Client {
            base: format!("{}/v1", api_base(&api.api).0),
            agent,
            token: ApiToken::find(api)?,
        })
    }

    /// One call; an error answer becomes an error carrying the API's message.
    pub(crate) fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        let t = &self.token;
        let sent = match (method, body) {
            ("GET", _) => t.apply(self.agent.get(&url)).call(),
            ("DELETE", _) => t.apply(self.agent.delete(&url)).call(),
            (_, Some(b)) => t
                .apply(self.agent.post(&url))
                .header("Content-Type", "application/json")
                .send(b.to_string()),
            (_, None) => t.apply(self.agent.post(&url)).send_empty(),
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
            bail!("{msg}{}", self.token.hint(status.as_u16()));
        }
        Ok(v)
    }
}

#[derive(clap::Subcommand, Debug)]
pub enum ApiCmd {
    /// Replace the node's API token: the node writes the new one to its token files
    /// (mode 0600) and the old one stops working at once.
    RotateToken,
}

/// `flashpool api ...`.
pub fn api(api: ApiArgs, cmd: ApiCmd) -> Result<()> {
    let c = Client::new(&api)?;
    match cmd {
        ApiCmd::RotateToken => {
            let v = c.call("POST", "/api/token/rotate", None)?;
            if api.json {
                outln!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let files: Vec<&str> = v["files"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|f| f.as_str())
                    .collect();
                outln!(
                    "API token rotated: the new one is {} (id), written to {}; the old one no longer works",
                    v["token_id"].as_str().unwrap_or("?"),
                    if files.is_empty() {
                        "no file (the node has none; --json shows the token)".to_string()
                    } else {
                        files.join(" and ")
                    }
                );
            }
        }
    }
    Ok(())
}

pub fn volume(api: ApiArgs, cmd: VolumeCmd) -> Result<()> {
    let c = Client::new(&api)?;
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
        VolumeCmd::Scrub(a) => return crate::jobs_cli::scrub(api, a),
    };
    if api.json {
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_volume(&v);
    }
    Ok(())
}

pub fn drive(api: ApiArgs, cmd: DriveCmd) -> Result<()> {
    let c = Client::new(&api)?;
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
    for j in v["jobs"].as_array().into_iter().flatten() {
        outln!(
            "  job {} {}: {:.1}%",
            j["id"],
            j["kind"].as_str().unwrap_or("?"),
            j["percent"].as_f64().unwrap_or(0.0)
        );
    }
    if let Some(s) = v["last_scrub"].as_object() {
        outln!(
            "  last scrub: {} at {}, {} mismatched, {} repaired",
            s["state"].as_str().unwrap_or("?"),
            s.get("finished").and_then(|f| f.as_str()).unwrap_or("?"),
            s["mismatches"],
            s["repaired"]
        );
    }
}

fn print_rebuild(r: &Value) {
    if r["running"].as_bool() == Some(true) {
        let eta = r["eta_secs"]
            .as_f64()
            .map_or("?".to_string(), |s| format!("{s:.0}s"));
        let names = |k: &str| -> String {
            let v: Vec<&str> = r[k]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|d| d.as_str())
                .collect();
            v.join(",")
        };
        let (now, queued) = (names("drives"), names("queued_drives"));
        let mut onto = if now.is_empty() {
            "starting".to_string()
        } else {
            format!("onto {now}")
        };
        if !queued.is_empty() {
            onto += &format!(", then {queued}");
        }
        outln!(
            "  rebuild {onto}: {:.1}% ({} of {} stripes), {:.1} MB/s, ETA {eta}",
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

#[derive(clap::Args, Debug)]
pub struct EventsArgs {
    /// Keep streaming new events (reconnecting when the node restarts or
    /// the connection drops), as `mdadm --monitor` does.
    #[arg(long, short)]
    follow: bool,
    /// Events after this sequence number (0: every event the node keeps).
    /// Without it: the kept events, or with --follow only new ones.
    #[arg(long)]
    since: Option<u64>,
}

/// `flashpool events`.
pub fn events(api: ApiArgs, args: EventsArgs) -> Result<()> {
    if !args.follow {
        let c = Client::new(&api)?;
        let q = args
            .since
            .map(|s| format!("&since={s}"))
            .unwrap_or_default();
        let v = c.call("GET", &format!("/events?follow=false{q}"), None)?;
        for e in v.as_array().into_iter().flatten() {
            print_event(e, api.json)?;
        }
        return Ok(());
    }
    follow_events(&api, args.since)
}

/// One event: `TIME SEVERITY KIND [volume=V] [drive=D] [host=H] MESSAGE`,
/// or its JSON on one line.
fn print_event(e: &Value, as_json: bool) -> Result<()> {
    if as_json {
        outln!("{}", serde_json::to_string(e)?);
        return Ok(());
    }
    outln!("{}", event_line(e));
    Ok(())
}

fn event_line(e: &Value) -> String {
    let mut about = String::new();
    for k in ["volume", "drive", "host"] {
        if let Some(v) = e[k].as_str() {
            about += &format!("{k}={v} ");
        }
    }
    format!(
        "{} {:<8} {:<16} {}{}",
        e["time"].as_str().unwrap_or("?"),
        e["severity"].as_str().unwrap_or("?"),
        e["kind"].as_str().unwrap_or("?"),
        about,
        e["message"].as_str().unwrap_or("")
    )
}

/// One server-sent message.
#[derive(Debug, Default, PartialEq)]
struct SseMessage {
    id: Option<String>,
    event: String,
    data: String,
}

/// Reads the next message from an event stream; None at its end.
fn read_sse(r: &mut impl std::io::BufRead) -> std::io::Result<Option<SseMessage>> {
    let mut m = SseMessage::default();
    let mut any = false;
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        let l = line.trim_end_matches(['\r', '\n']);
        if l.is_empty() {
            if any {
                return Ok(Some(m));
            }
            continue;
        }
        if l.starts_with(':') {
            continue; // a keep-alive comment
        }
        let (field, value) = l.split_once(':').unwrap_or((l, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        any = true;
        match field {
            "id" => m.id = Some(value.to_string()),
            "event" => m.event = value.to_string(),
            "data" => {
                if !m.data.is_empty() {
                    m.data.push('\n');
                }
                m.data.push_str(value);
            }
            _ => {}
        }
    }
}

/// Where a follow resumes: the node's run and the last number seen in it.
#[derive(Debug, Default)]
struct Resume {
    boot: Option<String>,
    last: Option<u64>,
}

/// How long the stream may stay silent (keep-alives come every 15 s)
/// before the connection counts as lost.
const EVENTS_SILENCE: Duration = Duration::from_secs(45);

fn follow_events(api: &ApiArgs, since: Option<u64>) -> Result<()> {
    let agent = api_agent(api, |b| {
        b.timeout_connect(Some(Duration::from_secs(5)))
            .timeout_recv_response(Some(Duration::from_secs(10)))
            .timeout_per_read(Some(EVENTS_SILENCE))
    })?;
    let token = ApiToken::find(api)?;
    let url = format!("{}/v1/events", api_base(&api.api).0);
    let mut at = Resume {
        boot: None,
        last: since,
    };
    let mut connected_once = false;
    let mut backoff = Duration::from_millis(250);
    loop {
        let mut req = token.apply(agent.get(&url));
        if let Some(l) = at.last {
            req = req.header("Last-Event-ID", &l.to_string());
        }
        if let Some(b) = &at.boot {
            req = req.query("boot", b);
        }
        let lost = match req.call() {
            Ok(mut resp) if resp.status().is_success() => {
                if connected_once {
                    warn(&format!(
                        "reconnected to {}; resuming after event {}",
                        api.api,
                        at.last.map_or("-".into(), |l| l.to_string())
                    ));
                }
                connected_once = true;
                backoff = Duration::from_millis(250);
                let mut r = std::io::BufReader::new(resp.body_mut().as_reader());
                match stream_events(&mut r, &mut at, api.json) {
                    Ok(Flow::ReaderGone) => return Ok(()),
                    Ok(Flow::Ended) => "the node closed the stream".to_string(),
                    Err(e) => e.to_string(),
                }
            }
            Ok(mut resp) => {
                let text = resp.body_mut().read_to_string().unwrap_or_default();
                let msg = serde_json::from_str::<Value>(&text)
                    .ok()
                    .and_then(|v| v["error"].as_str().map(String::from))
                    .unwrap_or(text);
                bail!(
                    "{url}: {}: {msg}{}",
                    resp.status(),
                    token.hint(resp.status().as_u16())
                );
            }
            Err(e) if !connected_once => {
                return Err(e).with_context(|| {
                    format!(
                        "cannot reach the management API at {url}: is `flashpool serve` running? \
                         (set --api or FLASHPOOL_API)"
                    )
                });
            }
            Err(e) => e.to_string(),
        };
        if crate::output::reader_gone() {
            return Ok(());
        }
        warn(&format!(
            "connection to {} lost ({lost}); reconnecting in {} ms",
            api.api,
            backoff.as_millis()
        ));
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

enum Flow {
    /// Nobody reads stdout any more (`| head`).
    ReaderGone,
    /// The server ended the stream.
    Ended,
}

fn stream_events(r: &mut impl std::io::BufRead, at: &mut Resume, as_json: bool) -> Result<Flow> {
    while let Some(m) = read_sse(r)? {
        match m.event.as_str() {
            "hello" => {
                let v: Value = serde_json::from_str(&m.data).unwrap_or_default();
                let boot = v["boot"].as_str().map(String::from);
                if at.boot.is_some() && boot != at.boot {
                    // The node sends every event it kept in its new run.
                    warn("the node restarted: its event numbers start again; what it kept follows");
                    at.last = Some(0);
                } else if at.last.is_none() {
                    // A live follow: it resumes after what was newest now.
                    at.last = v["last_seq"].as_u64();
                }
                at.boot = boot;
            }
            "lagged" => {
                let v: Value = serde_json::from_str(&m.data).unwrap_or_default();
                warn(&format!(
                    "events were lost: {}",
                    v["message"].as_str().unwrap_or(&m.data)
                ));
            }
            _ => {
                let v: Value = serde_json::from_str(&m.data)
                    .with_context(|| format!("event {:?} is not JSON: {}", m.event, m.data))?;
                print_event(&v, as_json)?;
                if let Some(seq) = v["seq"].as_u64() {
                    at.last = Some(seq);
                }
                if crate::output::reader_gone() {
                    return Ok(Flow::ReaderGone);
                }
            }
        }
    }
    Ok(Flow::Ended)
}

/// A note on stderr (not eprintln!: it panics when stderr is closed).
fn warn(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "flashpool events: {msg}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_messages_are_read_whole() {
        let text = ": keep-alive\n\nevent: hello\ndata: {\"boot\":\"b\",\"last_seq\":4}\n\n\
                    id: 5\nevent: drive_failed\ndata: {\"seq\":5}\n\n: keep-alive\n\n";
        let mut r = std::io::BufReader::new(text.as_bytes());
        let m = read_sse(&mut r).unwrap().unwrap();
        assert_eq!(m.event, "hello");
        assert_eq!(m.id, None);
        let m = read_sse(&mut r).unwrap().unwrap();
        assert_eq!(
            m,
            SseMessage {
                id: Some("5".into()),
                event: "drive_failed".into(),
                data: "{\"seq\":5}".into()
            }
        );
        assert_eq!(read_sse(&mut r).unwrap(), None);
    }

    #[test]
    fn a_hello_from_a_new_run_resumes_from_its_start() {
        let mut at = Resume {
            boot: Some("old".into()),
            last: Some(40),
        };
        let text = "event: hello\ndata: {\"boot\":\"new\",\"last_seq\":3}\n\n";
        let mut r = std::io::BufReader::new(text.as_bytes());
        assert!(matches!(
            stream_events(&mut r, &mut at, true).unwrap(),
            Flow::Ended
        ));
        assert_eq!(at.boot.as_deref(), Some("new"));
        assert_eq!(at.last, Some(0), "the new run's kept events follow");
        // A live follow starts after the newest.
        let mut at = Resume::default();
        let mut r = std::io::BufReader::new(text.as_bytes());
        stream_events(&mut r, &mut at, true).unwrap();
        assert_eq!(at.last, Some(3));
        // Same run: where the client was stays.
        let mut at = Resume {
            boot: Some("new".into()),
            last: Some(2),
        };
        let mut r = std::io::BufReader::new(text.as_bytes());
        stream_events(&mut r, &mut at, true).unwrap();
        assert_eq!(at.last, Some(2));
    }

    #[test]
    fn an_event_line_names_what_it_is_about() {
        let e = json!({"seq": 3, "time": "2026-11-25T13:34:56.123Z", "kind": "drive_failed",
            "severity": "warning", "volume": "v", "drive": "d1", "message": "drive d1 has failed"});
        assert_eq!(
            event_line(&e),
            "2026-11-25T13:34:56.123Z warning  drive_failed     volume=v drive=d1 drive d1 has failed"
        );
    }
}

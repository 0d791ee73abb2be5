//! The node's TOML configuration: parsed strictly, checked completely, and
//! turned into a target. Every error names the key, the value and the fix.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use blockdev::{BlockDevice, FileDevice, FileOptions, MemAllocation, MemDevice, NullDevice};
use nvmf_target::{ListenerConfig, ListenerKind, Namespace, Subsystem, TransportConfig};
use serde::Deserialize;

pub mod auth;
pub mod cluster;
pub mod membership;
pub mod tls;
pub use auth::SubsystemHostSection;
pub use cluster::{Cluster, PeerSection, RemoteSection};
pub use membership::{ClusterSection, Membership};

#[cfg(test)]
pub const DEFAULT_NQN: &str = "nqn.2026-01.io.flashpool:default";

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    #[serde(default)]
    pub node: NodeSection,
    #[serde(default)]
    pub transport: TransportSection,
    #[serde(default)]
    pub listener: Vec<ListenerSection>,
    #[serde(default)]
    pub subsystem: Vec<SubsystemSection>,
    #[serde(default)]
    pub api: ApiSection,
    #[serde(default)]
    pub drive: Vec<DriveSection>,
    #[serde(default)]
    pub volume: Vec<VolumeSection>,
    #[serde(default)]
    pub peer: Vec<PeerSection>,
    #[serde(default)]
    pub remote: RemoteSection,
    /// Cluster mode (etcd); absent: the node runs alone.
    pub cluster: Option<ClusterSection>,
    /// Scheduled scrubs; absent: scrubs run only when asked.
    pub scrub: Option<ScrubSection>,
}

/// The management API (HTTP + JSON). Local only by default.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiSection {
    #[serde(default = "default_api_address")]
    pub address: String,
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The API token's file (mode 0600): read if it is there, else made.
    /// Default `<state_dir>/api-token`; without either, a new token each
    /// start, in the runtime file only (docs/api.md, Authentication).
    pub token_file: Option<PathBuf>,
    /// HTTPS: certificate chain and key (PEM). Required off loopback.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// The CA (PEM) this node trusts when it calls other nodes' APIs over
    /// HTTPS; default its own `tls_cert`.
    pub tls_ca: Option<PathBuf>,
    /// HTTPS only: the CA (PEM) of client certificates. A call on a
    /// connection with a certificate it signed needs no token.
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: every connection needs a client certificate, and
    /// every call the token as well.
    #[serde(default)]
    pub require_client_cert: bool,
    /// Names besides the bound address that `Host` may say (DNS names).
    #[serde(default)]
    pub host_names: Vec<String>,
    /// Also serve the API on this Unix socket; who may connect is decided
    /// by its mode (`unix_socket_mode`, default 0600), not by a token.
    pub unix_socket: Option<PathBuf>,
    pub unix_socket_mode: Option<String>,
}

impl Default for ApiSection {
    fn default() -> Self {
        ApiSection {
            address: default_api_address(),
            enabled: true,
            token_file: None,
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            client_ca: None,
            require_client_cert: false,
            host_names: Vec::new(),
            unix_socket: None,
            unix_socket_mode: None,
        }
    }
}

/// Where `flashpool serve` answers the management API and the CLI looks for it.
pub const DEFAULT_API_ADDRESS: &str = "127.0.0.1:9410";

fn default_api_address() -> String {
    DEFAULT_API_ADDRESS.into()
}
fn yes() -> bool {
    true
}

/// A raw device volumes are built from.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriveSection {
    pub name: String,
    pub backend: String,
    pub size: Option<Size>,
    pub path: Option<PathBuf>,
    #[serde(default)]
    pub create: bool,
    #[serde(default = "bs4096")]
    pub block_size: u32,
    /// Serve this drive to other nodes (JBOF mode) as
    /// `nqn.2026-01.io.flashpool:drive:<node>:<drive>`, nsid 1.
    #[serde(default)]
    pub export: bool,
    /// Host NQNs allowed on the export (default: the `[[peer]]`s').
    #[serde(default)]
    pub export_hosts: Vec<String>,
    /// backend = "remote": `tcp://ADDR:PORT/NQN?nsid=N` (default: from the
    /// name `peer:drive` and that `[[peer]]`'s address).
    pub url: Option<String>,
    /// A hot spare: taken by itself when a member of a redundant volume
    /// fails (a `spare_taken` event says which).
    #[serde(default)]
    pub spare: bool,
    /// backend = "mem": false allocates all the RAM up front (in the
    /// background, from the start); true (the default) on first write.
    pub thin: Option<bool>,
}

/// `[scrub]`: scrub every redundant volume on a schedule.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScrubSection {
    /// How long after a volume's last scrub the next one starts, e.g.
    /// "7d", "24h", "30m".
    pub interval: String,
    /// Rewrite parity that disagrees with the data (else only count).
    #[serde(default)]
    pub repair: bool,
    /// Speed limit per second, e.g. "100MiB" (default unlimited).
    pub rate: Option<Size>,
}

impl ScrubSection {
    pub fn schedule(&self) -> anyhow::Result<crate::node::ScrubSchedule> {
        let interval = humantime::parse_duration(&self.interval).map_err(|e| {
            anyhow::anyhow!(
                "config: scrub.interval = {:?}: {e}; use a duration such as \"7d\", \"24h\" or \"30m\"",
                self.interval
            )
        })?;
        if interval < std::time::Duration::from_secs(1) {
            anyhow::bail!(
                "config: scrub.interval = {:?} is shorter than a second; use e.g. \"7d\"",
                self.interval
            );
        }
        Ok(crate::node::ScrubSchedule {
            interval,
            repair: self.repair,
            rate: self.rate.map(Size::bytes),
        })
    }
}

fn bs4096() -> u32 {
    4096
}

/// A volume over drives: found on them at start, or made if they are blank.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeSection {
    pub name: String,
    /// With `drives`: a volume on drives.
    pub layout: Option<String>,
    #[serde(default)]
    pub drives: Vec<String>,
    pub strip: Option<Size>,
    pub block_size: Option<u32>,
    /// Rebuild speed limit in bytes per second, e.g. "200MiB".
    pub rebuild_rate: Option<Size>,
    /// Format the volume as a thin pool when it is made.
    #[serde(default)]
    pub thin_pool: bool,
    pub cluster: Option<Size>,
    /// A thin volume in the pool on this volume, of `size` bytes.
    pub pool: Option<String>,
    pub size: Option<Size>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSection {
    /// Reactor threads; 0 (the default) means one per CPU.
    #[serde(default)]
    pub reactors: usize,
    #[serde(default)]
    pub cpus: Vec<usize>,
    #[serde(default = "info")]
    pub log: String,
    /// How log lines are written: `text` (default) or `json`, one object
    /// per line with the event fields as keys (`flashpool serve --log-format`
    /// overrides it).
    #[serde(default)]
    pub log_format: LogFormat,
    /// Microseconds a connection keeps polling after activity before it
    /// sleeps (adaptive polling): an idle target still costs no CPU.
    #[serde(default = "default_poll_us")]
    pub poll_us: u32,
    /// Where the node keeps what the API changed (exports.json,
    /// drive-exports.json, remote-drives.json; docs/config.md). Without it,
    /// those changes last until the node stops.
    pub state_dir: Option<PathBuf>,
    /// This node's name among its peers (default: the hostname).
    pub name: Option<String>,
    /// The host NQN this node uses on other nodes' drives
    /// (default `nqn.2026-01.io.flashpool:node:<name>`).
    pub host_nqn: Option<String>,
    /// Its host ID, a UUID (default: derived from the host NQN, so stable).
    pub host_id: Option<String>,
    /// The DH-HMAC-CHAP secret this node presents on other nodes' drive
    /// exports (a file holding `DHHC-1:...`, mode 0600).
    pub dhchap_key_file: Option<PathBuf>,
    /// The secret those exports must prove (bidirectional authentication).
    pub dhchap_ctrl_key_file: Option<PathBuf>,
    /// This node's configured TLS PSK, for TLS to other nodes' exports
    /// (their `[[peer]] tls_key_file` holds the same key).
    pub tls_key_file: Option<PathBuf>,
}

impl Default for NodeSection {
    fn default() -> Self {
        NodeSection {
            reactors: 0,
            cpus: Vec::new(),
            log: info(),
            log_format: LogFormat::default(),
            poll_us: default_poll_us(),
            state_dir: None,
            name: None,
            host_nqn: None,
            host_id: None,
            dhchap_key_file: None,
            dhchap_ctrl_key_file: None,
            tls_key_file: None,
        }
    }
}

/// `[node] log_format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

fn default_poll_us() -> u32 {
    50
}
fn info() -> String {
    "info".into()
}

/// A byte size: an integer, or a string like "1GiB", "512KiB", "4096".
#[derive(Debug, Clone, Copy)]
pub struct Size(u64);

impl Size {
    pub fn bytes(self) -> u64 {
        self.0
    }
}

/// The fix every size error ends with.
const SIZE_HINT: &str = "use e.g. 64MiB, 10GiB or a byte count";

/// By hand rather than `#[serde(untagged)]`, whose error ("data did not
/// match any variant") names neither the value nor the fix; [`load`] adds
/// the key.
impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Size, D::Error> {
        struct SizeVisitor;
        impl serde::de::Visitor<'_> for SizeVisitor {
            type Value = Size;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "a size; {SIZE_HINT}")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Size, E> {
                Ok(Size(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Size, E> {
                u64::try_from(v).map(Size).map_err(|_| {
                    E::custom(format_args!("{v} is not a size (negative); {SIZE_HINT}"))
                })
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Size, E> {
                Err(E::custom(format_args!(
                    "{v} is not a size (bytes are whole; quote sizes with a fraction, e.g. \"1.5GiB\"); {SIZE_HINT}"
                )))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Size, E> {
                use crate::units::SizeError;
                crate::units::size_bytes(s).map(Size).map_err(|e| match e {
                    SizeError::NotANumber => E::custom(format_args!(
                        "{} is not a size; {SIZE_HINT}",
                        crate::echo::Echo(s)
                    )),
                    e => E::custom(format_args!(
                        "{} is not a size ({e}); {SIZE_HINT}",
                        crate::echo::Echo(s)
                    )),
                })
            }
        }
        d.deserialize_any(SizeVisitor)
    }
}

/// Parses "1GiB", "128KiB", "4096", "1G" (binary units).
#[cfg(test)]
pub fn parse_size(s: &str) -> Result<u64, String> {
    crate::units::parse_size(s).map_err(|e| e.to_string())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportSection {
    pub max_queue_depth: Option<u32>,
    pub max_io_queues: Option<u32>,
    pub in_capsule_data: Option<Size>,
    pub max_transfer: Option<Size>,
    pub max_h2c_data: Option<Size>,
    pub header_digest: Option<bool>,
    pub data_digest: Option<bool>,
    pub kato_max_ms: Option<u32>,
    /// A host that must authenticate and has not within this long after a
    /// queue's Connect loses that queue.
    pub auth_timeout_ms: Option<u32>,
}

impl Default for TransportSection {
    fn default() -> Self {
        toml::from_str("").expect("empty transport section")
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerSection {
    pub address: String,
    pub port: u16,
    #[serde(default = "io_kind")]
    pub kind: String,
    /// TLS 1.3 (TP 8011): "none" (default), "optional" or "required".
    pub tls: Option<String>,
}

fn io_kind() -> String {
    "io".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubsystemSection {
    pub nqn: String,
    pub serial: Option<String>,
    pub model: Option<String>,
    #[serde(default)]
    pub allow_any_host: bool,
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Hosts with their DH-HMAC-CHAP key files (`[[subsystem.host]]`);
    /// each is allowed, as if listed in `hosts`.
    #[serde(default)]
    pub host: Vec<SubsystemHostSection>,
    /// Every host must authenticate: refuses `allow_any_host` and a host
    /// without `dhchap_key_file`.
    #[serde(default)]
    pub require_auth: bool,
    /// Every host must connect over TLS 1.3 (see `config::tls`).
    #[serde(default)]
    pub require_tls: bool,
    #[serde(default)]
    pub namespace: Vec<NamespaceSection>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceSection {
    pub nsid: u32,
    pub backend: String,
    pub size: Option<Size>,
    #[serde(default = "bs512")]
    pub block_size: u32,
    pub path: Option<PathBuf>,
    #[serde(default)]
    pub create: bool,
    pub uuid: Option<String>,
    pub nguid: Option<String>,
    /// For backend = "volume": the volume's name.
    pub volume: Option<String>,
    /// backend = "mem": false allocates all the RAM up front (in the
    /// background, from the start); true (the default) on first write.
    pub thin: Option<bool>,
}

/// `thin` of a drive or namespace: only a `mem` backend has the choice.
fn mem_thin(key: &str, backend: &str, thin: Option<bool>) -> anyhow::Result<Option<bool>> {
    if thin.is_some() && backend != "mem" {
        bail!(
            "config: {key}.thin is only for backend = \"mem\" (a RAM device allocated on first \
             write or up front); remove it"
        );
    }
    Ok(thin)
}

fn bs512() -> u32 {
    512
}

/// The embedded default: one 1 GiB RAM namespace, I/O on 4420, discovery on 8009.
pub const EMBEDDED_DEFAULT: &str = r#"
[[listener]]
address = "127.0.0.1"
port = 4420
kind = "io"

[[listener]]
address = "127.0.0.1"
port = 8009
kind = "discovery"

[[subsystem]]
nqn = "nqn.2026-01.io.flashpool:default"
serial = "FPDEFAULT0001"
model = "flashpool RAM"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
backend = "mem"
size = "1GiB"
block_size = 512
"#;

pub fn load(path: Option<&Path>) -> Result<(NodeConfig, String)> {
    let (text, origin) = match path {
        Some(p) => (
            std::fs::read_to_string(p).with_context(|| {
                format!(
                    "cannot read config file {}: check the path given to -c",
                    p.display()
                )
            })?,
            p.display().to_string(),
        ),
        None => (EMBEDDED_DEFAULT.to_string(), "embedded default".to_string()),
    };
    let cfg = parse(&text, &origin)?;
    Ok((cfg, origin))
}

/// Parses the TOML; a value of the wrong kind is reported with its line and
/// key, the array entry named by its own name (`drive "d0": size: ...`).
pub fn parse(text: &str, origin: &str) -> Result<NodeConfig> {
    // A syntax error: toml's own message shows the line and a caret.
    let de =
        toml::Deserializer::parse(text).map_err(|e| anyhow::anyhow!("config {origin}: {e}"))?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let line = e
            .inner()
            .span()
            .map(|s| format!(", line {}", 1 + text[..s.start].matches('\n').count()))
            .unwrap_or_default();
        let key = key_of(text, e.path());
        let key = if key.is_empty() {
            key
        } else {
            format!(" {key}:")
        };
        anyhow::anyhow!("config {origin}{line}:{key} {}", e.inner().message())
    })
}

/// `drive[0].size` as people know it: `drive "d0": size`, `subsystem
/// "nqn...": namespace nsid 1: size`, `transport.max_transfer`.
fn key_of(text: &str, path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    // The syntax is valid (the typed parse got this far), so this parses.
    let mut at: Option<toml::Value> = toml::from_str::<toml::Table>(text)
        .ok()
        .map(toml::Value::Table);
    let mut out = String::new();
    let mut last_key = "";
    for seg in path.iter() {
        match seg {
            Segment::Map { key } => {
                if !out.is_empty() && !out.ends_with(": ") {
                    out.push('.');
                }
                out.push_str(key);
                at = at.and_then(|v| v.get(key.as_str()).cloned());
                last_key = key;
            }
            Segment::Seq { index } => {
                at = at.and_then(|v| v.get(*index).cloned());
                // The entry's name stands for the array's key and index.
                if !last_key.is_empty() && out.ends_with(last_key) {
                    out.truncate(out.len() - last_key.len());
                }
                let field = |k: &str| at.as_ref().and_then(|v| v.get(k)).cloned();
                match (field("name"), field("nqn"), field("nsid")) {
                    (Some(toml::Value::String(n)), _, _) | (_, Some(toml::Value::String(n)), _) => {
                        out += &format!("{last_key} {}", crate::echo::Echo(&n));
                    }
                    (_, _, Some(toml::Value::Integer(n))) => out += &format!("{last_key} nsid {n}"),
                    _ => out += &format!("{last_key}[{index}]"),
                }
                out.push_str(": ");
                last_key = "";
            }
            Segment::Enum { .. } | Segment::Unknown => {}
        }
    }
    out.trim_end_matches(": ").to_string()
}

/// Everything `serve` needs, validated.
pub struct Built {
    pub transport: TransportConfig,
    pub listeners: Vec<ListenerConfig>,
    pub subsystems: Vec<Arc<Subsystem>>,
}

/// What a `backend = "volume"` namespace serves.
pub enum VolumeNamespace {
    Device(Arc<dyn BlockDevice>),
    /// The volume exists but is not served (offline): the namespace is
    /// left out, with this reason in the log; the node starts.
    NotServed(String),
    /// No such volume: a configuration error.
    Unknown,
}

/// Finds the device of a `backend = "volume"` namespace: (volume, nqn, nsid).
pub type VolumeResolver<'a> = &'a dyn Fn(&str, &str, u32) -> VolumeNamespace;

/// The drives and volumes of the file, checked for what can be checked
/// without touching the drives.
pub fn node_specs(
    cfg: &NodeConfig,
) -> Result<(Vec<crate::node::DriveSpec>, Vec<crate::node::CreateVolume>)> {
    let mut drives = Vec::new();
    let mut names = HashSet::new();
    for (i, d) in cfg.drive.iter().enumerate() {
        let key = format!("drive[{i}]");
        if d.backend == "remote" {
            // `peer:drive`, so the name alone says where it lives.
            for part in d.name.splitn(2, ':') {
                crate::node::check_name(&format!("config: {key}.name:"), part)
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
            }
            if !d.name.contains(':') && d.url.is_none() {
                bail!(
                    "config: {key}: a remote drive is named PEER:DRIVE (e.g. \"e2:d0\"), or has url = \"tcp://ADDR:PORT/NQN?nsid=N\""
                );
            }
            if d.size.is_some() || d.path.is_some() || d.create {
                bail!(
                    "config: {key}: a remote drive takes only name and url; its size is the remote namespace's"
                );
            }
        } else {
            crate::node::check_name(&format!("config: {key}.name:"), &d.name)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            if d.url.is_some() {
                bail!("config: {key}.url is only for backend = \"remote\"");
            }
        }
        if !names.insert(d.name.clone()) {
            bail!(
                "config: {key}.name = {:?} is used twice; give each drive its own name",
                d.name
            );
        }
        if d.block_size != 512 && d.block_size != 4096 {
            bail!(
                "config: {key}.block_size = {} is not supported; use 512 or 4096",
                d.block_size
            );
        }
        match d.backend.as_str() {
            "mem" if d.size.is_none() => {
                bail!(
                    "config: {key}.size is missing; a mem drive needs a size, e.g. size = \"1GiB\""
                )
            }
            "file" if d.path.is_none() => {
                bail!(
                    "config: {key}.path is missing; a file drive needs path = \"/dev/sdX\" or a file"
                )
            }
            "mem" | "file" | "remote" => {}
            b => bail!(
                "config: {key}.backend = {b:?} is unknown; use \"mem\", \"file\" or \"remote\""
            ),
        }
        if d.path.is_some() && d.backend != "file" {
            bail!(
                "config: {key}.path is only for backend = \"file\"; remove it or change the backend"
            );
        }
        if let Some(sz) = d.size
            && (sz.bytes() == 0 || !sz.bytes().is_multiple_of(u64::from(d.block_size)))
        {
            bail!(
                "config: {key}.size = {} is not a non-zero multiple of block_size {}",
                sz.bytes(),
                d.block_size
            );
        }
        drives.push(crate::node::DriveSpec {
            name: d.name.clone(),
            backend: d.backend.clone(),
            size: d.size.map(Size::bytes),
            path: d.path.clone(),
            create: d.create,
            block_size: d.block_size,
            export: d.export,
            export_hosts: d.export_hosts.clone(),
            url: d.url.clone(),
            preallocate: mem_thin(&key, &d.backend, d.thin)?.is_some_and(|t| !t),
        });
    }
    let mut volumes = Vec::new();
    let mut vnames = HashSet::new();
    let mut claimed: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
    for (i, v) in cfg.volume.iter().enumerate() {
        let key = format!("volume[{i}]");
        crate::node::check_name(&format!("config: {key}.name:"), &v.name)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        if !vnames.insert(v.name.clone()) {
            bail!(
                "config: {key}.name = {:?} is used twice; give each volume its own name",
                v.name
            );
        }
        if v.pool.is_some() {
            if v.layout.is_some() || !v.drives.is_empty() || v.thin_pool {
                bail!(
                    "config: {key}: a thin volume (pool = ...) takes only a size; remove layout, drives and thin_pool"
                );
            }
            if v.size.is_none() {
                bail!(
                    "config: {key}.size is missing; a thin volume needs one, e.g. size = \"100GiB\""
                );
            }
        } else {
            let layout = v.layout.as_deref().ok_or_else(|| {
                anyhow::anyhow!(
                    "config: {key}.layout is missing; give layout and drives (or pool and size for a thin volume)"
                )
            })?;
            let kind = crate::node::parse_layout(layout)
                .map_err(|e| anyhow::anyhow!("config: {key}.layout: {e}"))?;
            kind.shape(v.drives.len())
                .map_err(|e| anyhow::anyhow!("config: {key}.drives: {e}"))?;
            if v.size.is_some() {
                bail!(
                    "config: {key}.size: a volume on drives takes all of them; size is for thin volumes"
                );
            }
        }
        for d in &v.drives {
            if !names.contains(d) {
                bail!(
                    "config: {key}.drives names {d:?}, which no [[drive]] declares; add it or fix the name"
                );
            }
            if let Some(other) = claimed.insert(d, &v.name) {
                bail!(
                    "config: {key}.drives: drive {d:?} is already used by volume {other:?}; a drive serves one volume"
                );
            }
        }
        volumes.push(crate::node::CreateVolume {
            name: v.name.clone(),
            layout: v.layout.clone(),
            drives: v.drives.clone(),
            strip: v.strip.map(|s| s.bytes().to_string()),
            block_size: v.block_size,
            rebuild_rate: v.rebuild_rate.map(|s| s.bytes().to_string()),
            thin_pool: v.thin_pool,
            cluster: v.cluster.map(|s| s.bytes().to_string()),
            pool: v.pool.clone(),
            size: v.size.map(|s| s.bytes().to_string()),
            export: None,
        });
    }
    // Pools before the thin volumes they hold.
    volumes.sort_by_key(|v| v.pool.is_some());
    Ok((drives, volumes))
}

pub fn build(cfg: &NodeConfig, volumes: VolumeResolver<'_>) -> Result<Built> {
    let transport = transport(cfg)?;
    let listeners = listeners(cfg)?;
    tls::check(
        &listeners,
        &cfg.subsystem,
        cfg.peer.iter().any(|p| p.tls_key_file.is_some()),
    )?;
    if cfg.subsystem.is_empty() && !cfg.drive.iter().any(|d| d.export) && cfg.cluster.is_none() {
        bail!(
            "config: no [[subsystem]] defined; add one with an nqn and at least one [[subsystem.namespace]]"
        );
    }
    let mut seen = HashSet::new();
    let mut subsystems = Vec::new();
    for (i, s) in cfg.subsystem.iter().enumerate() {
        let key = format!("subsystem[{i}]");
        check_nqn(&format!("{key}.nqn"), &s.nqn)?;
        if !seen.insert(s.nqn.clone()) {
            bail!(
                "config: {key}.nqn = {:?} is defined twice; each subsystem needs its own NQN",
                s.nqn
            );
        }
        subsystems.push(Arc::new(subsystem(&key, s, volumes)?));
    }
    Ok(Built {
        transport,
        listeners,
        subsystems,
    })
}

fn range<T: PartialOrd + std::fmt::Display + Copy>(key: &str, v: T, lo: T, hi: T) -> Result<T> {
    if v < lo || v > hi {
        bail!("config: {key} = {v} is out of range; use a value from {lo} to {hi}");
    }
    Ok(v)
}

fn transport(cfg: &NodeConfig) -> Result<TransportConfig> {
    let t = &cfg.transport;
    let d = TransportConfig::default();
    let n = &cfg.node;
    // All configured CPUs, not just those in this process's affinity mask
    // (`taskset -c 0 flashpool serve` may still pin reactors elsewhere).
    // SAFETY: sysconf has no memory effects.
    let ncpu = match unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) } {
        n if n > 0 => n as usize,
        _ => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    for (i, &c) in n.cpus.iter().enumerate() {
        if c >= ncpu {
            bail!(
                "config: node.cpus[{i}] = {c} does not exist on this machine ({ncpu} CPUs: 0..{})",
                ncpu - 1
            );
        }
    }
    let max_transfer = t
        .max_transfer
        .map_or(u64::from(d.max_transfer), Size::bytes);
    if !max_transfer.is_power_of_two() || !(4096..=8 << 20).contains(&max_transfer) {
        bail!(
            "config: transport.max_transfer = {max_transfer} must be a power of two from 4KiB to 8MiB"
        );
    }
    let icd = t
        .in_capsule_data
        .map_or(u64::from(d.in_capsule_data), Size::bytes);
    if icd > 128 * 1024 || !icd.is_multiple_of(16) {
        bail!(
            "config: transport.in_capsule_data = {icd} must be a multiple of 16 up to 131072 (128KiB)"
        );
    }
    let h2c = t
        .max_h2c_data
        .map_or(u64::from(d.max_h2c_data), Size::bytes);
    if h2c < 4096 || !h2c.is_multiple_of(4) || h2c > 16 << 20 {
        bail!("config: transport.max_h2c_data = {h2c} must be a multiple of 4 from 4096 to 16MiB");
    }
    Ok(TransportConfig {
        max_queue_depth: range(
            "transport.max_queue_depth",
            t.max_queue_depth.unwrap_or(128),
            2,
            1024,
        )? as u16,
        max_io_queues: range(
            "transport.max_io_queues",
            t.max_io_queues.unwrap_or(8),
            1,
            64,
        )? as u16,
        in_capsule_data: icd as u32,
        max_transfer: max_transfer as u32,
        max_h2c_data: h2c as u32,
        header_digest: t.header_digest.unwrap_or(true),
        data_digest: t.data_digest.unwrap_or(true),
        kato_max_ms: range(
            "transport.kato_max_ms",
            t.kato_max_ms.unwrap_or(120_000),
            1000,
            3_600_000,
        )?,
        reactors: if n.reactors == 0 {
            ncpu.min(64)
        } else {
            range("node.reactors", n.reactors, 1, 64)?
        },
        cpus: n.cpus.clone(),
        poll_us: range("node.poll_us", n.poll_us, 0, 10_000)?,
        auth_timeout_ms: range(
            "transport.auth_timeout_ms",
            t.auth_timeout_ms.unwrap_or(30_000),
            1000,
            600_000,
        )?,
    })
}

pub fn listeners(cfg: &NodeConfig) -> Result<Vec<ListenerConfig>> {
    if cfg.listener.is_empty() {
        return Ok(vec![
            ListenerConfig {
                addr: "127.0.0.1:4420".parse().expect("addr"),
                kind: ListenerKind::Io,
                tls: nvmf_target::TlsMode::None,
            },
            ListenerConfig {
                addr: "127.0.0.1:8009".parse().expect("addr"),
                kind: ListenerKind::Discovery,
                tls: nvmf_target::TlsMode::None,
            },
        ]);
    }
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for (i, l) in cfg.listener.iter().enumerate() {
        let ip: IpAddr = l.address.parse().map_err(|_| {
            anyhow::anyhow!(
                "config: listener[{i}].address = {:?} is not an IP address; use e.g. \"127.0.0.1\" or \"0.0.0.0\"",
                l.address
            )
        })?;
        let kind = match l.kind.as_str() {
            "io" => ListenerKind::Io,
            "discovery" => ListenerKind::Discovery,
            k => {
                bail!("config: listener[{i}].kind = {k:?} is unknown; use \"io\" or \"discovery\"")
            }
        };
        let addr = SocketAddr::new(ip, l.port);
        if !seen.insert(addr) {
            bail!("config: listener[{i}] {addr} is listed twice; remove one");
        }
        let tls = tls::listener_mode(&format!("listener[{i}].tls"), l.tls.as_deref())?;
        out.push(ListenerConfig { addr, kind, tls });
    }
    Ok(out)
}

fn check_nqn(key: &str, nqn: &str) -> Result<()> {
    if !nqn.starts_with("nqn.")
        || nqn.len() > 223
        || !nqn.is_ascii()
        || nqn.contains(char::is_whitespace)
    {
        bail!(
            "config: {key} = {nqn:?} is not a valid NQN; use \"nqn.YYYY-MM.reverse.domain:name\", ASCII, at most 223 bytes"
        );
    }
    if nqn == nvme_wire::fabrics::DISCOVERY_NQN {
        bail!("config: {key} = {nqn:?} is the discovery service's NQN; pick another name");
    }
    Ok(())
}

fn subsystem(key: &str, s: &SubsystemSection, volumes: VolumeResolver<'_>) -> Result<Subsystem> {
    let serial = s
        .serial
        .clone()
        .unwrap_or_else(|| format!("FP{:016X}", fnv(s.nqn.as_bytes(), 1)));
    if serial.is_empty() || serial.len() > 20 || !serial.bytes().all(|c| (0x20..0x7f).contains(&c))
    {
        bail!("config: {key}.serial = {serial:?} must be 1 to 20 printable ASCII characters");
    }
    let model = s.model.clone().unwrap_or_else(|| "flashpool".into());
    if model.is_empty() || model.len() > 40 || !model.bytes().all(|c| (0x20..0x7f).contains(&c)) {
        bail!("config: {key}.model = {model:?} must be 1 to 40 printable ASCII characters");
    }
    if !s.allow_any_host && s.hosts.is_empty() && s.host.is_empty() {
        bail!(
            "config: {key} ({}) allows no host: set allow_any_host = true or list host NQNs in hosts",
            s.nqn
        );
    }
    for (j, h) in s.hosts.iter().enumerate() {
        if !h.starts_with("nqn.") || h.len() > 223 {
            bail!(
                "config: {key}.hosts[{j}] = {h:?} is not a valid host NQN (nqn...., at most 223 bytes)"
            );
        }
    }
    let mut hosts = s.hosts.clone();
    let mut auth = Vec::new();
    let mut seen = HashSet::new();
    for (j, h) in s.host.iter().enumerate() {
        let hkey = format!("{key}.host[{j}]");
        if !h.nqn.starts_with("nqn.") || h.nqn.len() > 223 {
            bail!(
                "config: {hkey}.nqn = {:?} is not a valid host NQN (nqn...., at most 223 bytes)",
                h.nqn
            );
        }
        if !seen.insert(h.nqn.as_str()) {
            bail!(
                "config: {hkey}.nqn = {:?} appears twice in [[subsystem.host]] of {}; keep one entry per host",
                h.nqn,
                s.nqn
            );
        }
        if !hosts.contains(&h.nqn) {
            hosts.push(h.nqn.clone());
        }
        let pair = auth::key_pair(
            &hkey,
            h.dhchap_key_file.as_deref(),
            h.dhchap_ctrl_key_file.as_deref(),
        )?;
        match pair {
            Some((host_key, ctrl_key)) => auth.push((
                h.nqn.clone(),
                auth::host_auth(&hkey, h, host_key, ctrl_key)?,
            )),
            None if h.dhchap_hashes.is_some() || h.dhchap_dhgroups.is_some() => bail!(
                "config: {hkey} ({}): dhchap_hashes and dhchap_dhgroups choose how the host \
                 authenticates, but it has no dhchap_key_file; add one or remove them",
                h.nqn
            ),
            None if s.require_auth => bail!(
                "config: {hkey} ({}): subsystem {} has require_auth = true but this host has no \
                 dhchap_key_file; give it one or set require_auth = false",
                h.nqn,
                s.nqn
            ),
            None => {}
        }
    }
    if s.require_auth {
        if s.allow_any_host {
            bail!(
                "config: {key} ({}): require_auth = true and allow_any_host = true conflict \
                 (an unknown host has no secret); set allow_any_host = false and give each host \
                 a [[subsystem.host]] with dhchap_key_file",
                s.nqn
            );
        }
        if let Some(h) = s.hosts.iter().find(|h| !seen.contains(h.as_str())) {
            bail!(
                "config: {key} ({}): require_auth = true but host {h:?} in hosts has no secret; \
                 give it a [[subsystem.host]] with nqn = {h:?} and dhchap_key_file",
                s.nqn
            );
        }
    }
    let mut nsids = HashSet::new();
    let mut namespaces = Vec::new();
    for (j, n) in s.namespace.iter().enumerate() {
        let nkey = format!("{key}.namespace[{j}]");
        range(
            &format!("{nkey}.nsid"),
            n.nsid,
            1,
            nvmf_target::subsystem::MAX_NSID,
        )?;
        if !nsids.insert(n.nsid) {
            bail!(
                "config: {nkey}.nsid = {} is used twice in {}; give each namespace its own nsid",
                n.nsid,
                s.nqn
            );
        }
        let dev = if n.backend == "volume" {
            let name = n.volume.as_deref().ok_or_else(|| {
                anyhow::anyhow!(
                    "config: {nkey}.volume is missing; backend = \"volume\" needs volume = \"NAME\""
                )
            })?;
            if n.size.is_some() || n.path.is_some() {
                bail!(
                    "config: {nkey}: a volume namespace takes its size from the volume; remove size and path"
                );
            }
            match volumes(name, &s.nqn, n.nsid) {
                VolumeNamespace::Device(d) => d,
                VolumeNamespace::NotServed(why) => {
                    tracing::error!(
                        "config: {nkey} (nsid {} of {}): not served: {why}",
                        n.nsid,
                        s.nqn
                    );
                    continue;
                }
                VolumeNamespace::Unknown => bail!(
                    "config: {nkey}.volume = {name:?}: no such volume; declare it in [[volume]] (or create it with `flashpool volume create`)"
                ),
            }
        } else {
            if n.volume.is_some() {
                bail!(
                    "config: {nkey}.volume is only for backend = \"volume\"; remove it or change the backend"
                );
            }
            device(&nkey, n)?
        };
        let uuid = match &n.uuid {
            Some(u) => parse_hex(&format!("{nkey}.uuid"), u)?,
            None => derived_id(&s.nqn, n.nsid, 11),
        };
        let nguid = match &n.nguid {
            Some(u) => parse_hex(&format!("{nkey}.nguid"), u)?,
            None => derived_id(&s.nqn, n.nsid, 29),
        };
        namespaces.push(Namespace::new(n.nsid, dev, uuid, nguid));
    }
    namespaces.sort_by_key(|n| n.nsid);
    let mut sub = Subsystem::new(
        s.nqn.clone(),
        serial,
        model,
        s.allow_any_host,
        hosts,
        namespaces,
    );
    for (nqn, a) in auth {
        tracing::info!(
            "subsystem {}: host {nqn} must authenticate (DH-HMAC-CHAP{})",
            s.nqn,
            if a.ctrl_key.is_some() {
                ", bidirectional"
            } else {
                ""
            }
        );
        tracing::debug!(
            "subsystem {}: host {nqn} may use hashes {:?} and DH groups {:?}",
            s.nqn,
            a.hashes.iter().map(|h| h.name()).collect::<Vec<_>>(),
            a.dh_groups.iter().map(|g| g.name()).collect::<Vec<_>>()
        );
        sub.set_host_auth(nqn, a);
    }
    tls::apply(key, s, &mut sub)?;
    Ok(sub)
}

fn device(key: &str, n: &NamespaceSection) -> Result<Arc<dyn BlockDevice>> {
    if n.block_size != 512 && n.block_size != 4096 {
        bail!(
            "config: {key}.block_size = {} is not supported; use 512 or 4096",
            n.block_size
        );
    }
    let size = n.size.map(Size::bytes);
    let need_size = || -> Result<u64> {
        let s = size.ok_or_else(|| {
            anyhow::anyhow!(
                "config: {key}.size is missing; a {} namespace needs a size, e.g. size = \"1GiB\"",
                n.backend
            )
        })?;
        if s == 0 || s % u64::from(n.block_size) != 0 {
            bail!(
                "config: {key}.size = {s} is not a non-zero multiple of block_size {}; use e.g. {}",
                n.block_size,
                (s / u64::from(n.block_size)).max(1) * u64::from(n.block_size)
            );
        }
        Ok(s)
    };
    if n.path.is_some() && n.backend != "file" {
        bail!("config: {key}.path is only for backend = \"file\"; remove it or change the backend");
    }
    let thin = mem_thin(key, &n.backend, n.thin)?;
    let dev: Arc<dyn BlockDevice> = match n.backend.as_str() {
        "mem" => Arc::new(
            MemDevice::with_allocation(
                need_size()?,
                n.block_size,
                if thin == Some(false) {
                    MemAllocation::Full
                } else {
                    MemAllocation::Ahead
                },
            )
            .map_err(|e| anyhow::anyhow!("config: {key}: {e}"))?,
        ),
        "null" => Arc::new(
            NullDevice::new(need_size()?, n.block_size)
                .map_err(|e| anyhow::anyhow!("config: {key}: {e}"))?,
        ),
        "file" => {
            let path = n.path.clone().ok_or_else(|| {
                anyhow::anyhow!("config: {key}.path is missing; a file namespace needs path = \"/path/to/file-or-device\"")
            })?;
            if size.is_some() {
                need_size()?;
            }
            Arc::new(
                FileDevice::open(FileOptions {
                    path,
                    size,
                    block_size: n.block_size,
                    create: n.create,
                })
                .map_err(|e| anyhow::anyhow!("config: {key}: {e}"))?,
            )
        }
        b => bail!(
            "config: {key}.backend = {b:?} is unknown; use \"mem\", \"null\", \"file\" or \"volume\""
        ),
    };
    Ok(dev)
}

fn parse_hex(key: &str, s: &str) -> Result<[u8; 16]> {
    let hex: String = s.chars().filter(|&c| c != '-').collect();
    if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        bail!(
            "config: {key} = {s:?} must be 32 hex digits (dashes allowed), e.g. \"5f7d6a3c-0000-4000-8000-00000000001\""
        );
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex digits");
    }
    Ok(out)
}

fn fnv(bytes: &[u8], seed: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed.wrapping_mul(0x100_0000_01b3);
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// A stable 128-bit identifier from the NQN and NSID (RFC 9562 version 8 layout),
/// so a restarted node presents the same namespace identity to hosts.
fn derived_id(nqn: &str, nsid: u32, seed: u64) -> [u8; 16] {
    let mut key = nqn.as_bytes().to_vec();
    key.extend_from_slice(&nsid.to_le_bytes());
    let a = fnv(&key, seed).to_be_bytes();
    let b = fnv(&key, seed + 1).to_be_bytes();
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&a);
    out[8..].copy_from_slice(&b);
    out[6] = (out[6] & 0x0F) | 0x80;
    out[8] = (out[8] & 0x3F) | 0x80;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn err(text: &str) -> String {
        let cfg = parse(text, "t.toml");
        match cfg {
            Err(e) => e.to_string(),
            Ok(c) => match build(&c, &|_, _, _| VolumeNamespace::Unknown) {
                Err(e) => e.to_string(),
                Ok(_) => "ok".into(),
            },
        }
    }

    const NS: &str = "[[subsystem.namespace]]\nnsid = 1\nbackend = \"mem\"\nsize = \"1MiB\"\n";

    #[test]
    fn a_bad_size_names_its_key_value_and_fix() {
        let text = "[[drive]]\nname = \"d0\"\nbackend = \"mem\"\nsize = \"64MiB\"\n\n\
                    [[drive]]\nname = \"d1\"\nbackend = \"mem\"\nsize = \"12 XB\"\n";
        let e = err(text);
        assert_eq!(
            e,
            "config t.toml, line 9: drive \"d1\": size: \"12 XB\" is not a size \
             (unknown unit \"XB\"); use e.g. 64MiB, 10GiB or a byte count"
        );
        let e = err("[transport]\nmax_transfer = \"lots\"\n");
        assert_eq!(
            e,
            "config t.toml, line 2: transport.max_transfer: \"lots\" is not a size; \
             use e.g. 64MiB, 10GiB or a byte count"
        );
        let e = err(&format!(
            "[[subsystem]]\nnqn = \"nqn.2026-01.io.flashpool:a\"\nallow_any_host = true\n{NS}\
             [[subsystem.namespace]]\nnsid = 2\nbackend = \"mem\"\nsize = -4096\n"
        ));
        assert!(
            e.contains("subsystem \"nqn.2026-01.io.flashpool:a\": namespace nsid 2: size: -4096 is not a size (negative); use e.g. 64MiB"),
            "{e}"
        );
        let e = err("[[volume]]\nname = \"v\"\nstrip = 1.5\n");
        assert!(e.contains("volume \"v\": strip: 1.5 is not a size"), "{e}");
        let e = err("[[volume]]\nname = \"v\"\nstrip = \"0.3k\"\n");
        assert!(e.contains("(not a whole number of bytes)"), "{e}");
        // An entry without a name is known by its position.
        let e = err("[[drive]]\nbackend = \"mem\"\nsize = true\n");
        assert!(
            e.contains("drive[0]: size: invalid type: boolean `true`, expected a size"),
            "{e}"
        );
        // Sizes as integers and as text still parse.
        let cfg = parse(
            "[[drive]]\nname = \"d\"\nbackend = \"mem\"\nsize = 4096\n\
                         [transport]\nmax_transfer = \"128KiB\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(cfg.drive[0].size.unwrap().bytes(), 4096);
        assert_eq!(cfg.transport.max_transfer.unwrap().bytes(), 128 << 10);
    }

    /// Every key the parser takes is in docs/config.md, as `key = ...` in an
    /// example or as `` `key` `` in a table or the text.
    #[test]
    fn docs_config_md_names_every_key() {
        let doc = include_str!("../../../../docs/config.md");
        let sections = [
            ("", ""),
            ("node", "[node]"),
            ("transport", "[transport]"),
            ("listener", "[[listener]]"),
            ("subsystem", "[[subsystem]]"),
            (
                "subsystem.namespace",
                "[[subsystem]]\n[[subsystem.namespace]]",
            ),
            ("subsystem.host", "[[subsystem]]\n[[subsystem.host]]"),
            ("api", "[api]"),
            ("drive", "[[drive]]"),
            ("volume", "[[volume]]"),
            ("peer", "[[peer]]"),
            ("remote", "[remote]"),
            ("cluster", "[cluster]"),
            ("scrub", "[scrub]\ninterval = \"1d\""),
        ];
        let mut missing = Vec::new();
        for (section, header) in sections {
            // The parser lists the keys a section takes when it meets one it does not.
            let e = err(&format!("{header}\nzz_no_such_key = 1\n"));
            let (_, list) = e
                .split_once("expected ")
                .unwrap_or_else(|| panic!("{section}: {e}"));
            let list = list.trim_start_matches("one of ").replace(" or ", ", ");
            for key in list.split(", ").map(|k| k.trim_matches('`')) {
                let documented = if section.is_empty() {
                    doc.contains(&format!("[{key}]")) || doc.contains(&format!("[[{key}]]"))
                } else {
                    doc.contains(&format!("\n{key} ="))
                        || doc.contains(&format!("# {key} ="))
                        || doc.contains(&format!("`{key}`"))
                        || doc.contains(&format!("[[{section}.{key}]]"))
                };
                if !documented {
                    missing.push(format!("{section}.{key}"));
                }
            }
        }
        assert!(missing.is_empty(), "not in docs/config.md: {missing:?}");
    }

    #[test]
    fn a_huge_bad_value_is_not_echoed_whole() {
        let big = "9".repeat(100_000) + "XB";
        let e = err(&format!("[[volume]]\nname = \"v\"\nstrip = \"{big}\"\n"));
        assert!(e.len() < 400, "{} bytes: {}", e.len(), &e[..400]);
        assert!(e.contains("… (100002 bytes)"), "{e}");
    }

    #[test]
    fn embedded_default_builds() {
        let (cfg, _) = load(None).unwrap();
        let b = build(&cfg, &|_, _, _| VolumeNamespace::Unknown).unwrap();
        assert_eq!(b.subsystems[0].nqn, DEFAULT_NQN);
        assert_eq!(b.subsystems[0].namespaces()[0].num_blocks, (1 << 30) / 512);
        assert_eq!(b.listeners.len(), 2);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("128KiB").unwrap(), 128 << 10);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("12XB").unwrap_err().contains("unknown unit"));
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn errors_name_key_value_and_fix() {
        let e = err("[node]\nreactorz = 2\n");
        assert!(e.contains("unknown field") && e.contains("reactorz"), "{e}");
        let e = err(&format!(
            "[[subsystem]]\nnqn = \"nqn.a:x\"\nallow_any_host = true\n{NS}[[subsystem]]\nnqn = \"nqn.a:x\"\nallow_any_host = true\n{NS}"
        ));
        assert!(
            e.contains("subsystem[1].nqn") && e.contains("defined twice"),
            "{e}"
        );
        let e = err(&format!(
            "[[subsystem]]\nnqn = \"nqn.a:x\"\nallow_any_host = true\n{NS}{NS}"
        ));
        assert!(e.contains("nsid = 1 is used twice"), "{e}");
        let e = err(
            "[[subsystem]]\nnqn = \"nqn.a:x\"\nallow_any_host = true\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"mem\"\nsize = 1000\n",
        );
        assert!(
            e.contains("size = 1000")
                && e.contains("multiple of block_size 512")
                && e.contains("use e.g. 512"),
            "{e}"
        );
        let e = err(
            "[[subsystem]]\nnqn = \"nqn.a:x\"\nallow_any_host = true\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"file\"\npath = \"/nonexistent/x.img\"\n",
        );
        assert!(
            e.contains("namespace[0]") && e.contains("/nonexistent/x.img"),
            "{e}"
        );
        let e = err(&format!("[[subsystem]]\nnqn = \"nqn.a:x\"\n{NS}"));
        assert!(e.contains("allows no host"), "{e}");
        let e = err(&format!(
            "[[subsystem]]\nnqn = \"bad\"\nallow_any_host = true\n{NS}"
        ));
        assert!(e.contains("not a valid NQN"), "{e}");
        let e = err(&format!(
            "[transport]\nmax_queue_depth = 5000\n[[subsystem]]\nnqn = \"nqn.a:x\"\nallow_any_host = true\n{NS}"
        ));
        assert!(
            e.contains("transport.max_queue_depth = 5000 is out of range"),
            "{e}"
        );
        let e = err(&format!(
            "[[listener]]\naddress = \"localhost\"\nport = 1\n[[subsystem]]\nnqn = \"nqn.a:x\"\nallow_any_host = true\n{NS}"
        ));
        assert!(e.contains("listener[0].address"), "{e}");
    }

    #[test]
    fn thin_is_for_mem_and_false_allocates_up_front() {
        let sub = "[[subsystem]]\nnqn = \"nqn.a:x\"\nallow_any_host = true\n[[subsystem.namespace]]\nnsid = 1\n";
        let e = err(&format!(
            "{sub}backend = \"null\"\nsize = \"1MiB\"\nthin = false\n"
        ));
        assert!(e.contains("thin is only for backend = \"mem\""), "{e}");

        let c = parse(
            &format!("{sub}backend = \"mem\"\nsize = \"4MiB\"\nthin = false\n"),
            "t.toml",
        )
        .unwrap();
        let built = build(&c, &|_, _, _| VolumeNamespace::Unknown).unwrap();
        let ns = &built.subsystems[0].namespaces()[0];
        assert!(ns.dev.describe().contains("thick"), "{}", ns.dev.describe());
        let c = parse(
            &format!("{sub}backend = \"mem\"\nsize = \"4MiB\"\n"),
            "t.toml",
        )
        .unwrap();
        let built = build(&c, &|_, _, _| VolumeNamespace::Unknown).unwrap();
        let ns = &built.subsystems[0].namespaces()[0];
        assert!(ns.dev.describe().contains("thin"), "{}", ns.dev.describe());
    }

    #[test]
    fn derived_ids_are_stable_and_distinct() {
        assert_eq!(derived_id("nqn.a", 1, 11), derived_id("nqn.a", 1, 11));
        assert_ne!(derived_id("nqn.a", 1, 11), derived_id("nqn.a", 2, 11));
        assert_eq!(
            parse_hex("k", "00112233-4455-6677-8899-aabbccddeeff").unwrap()[15],
            0xff
        );
    }
}

#[cfg(test)]
mod node_tests {
    use super::*;

    fn specs_err(text: &str) -> String {
        let cfg: NodeConfig = toml::from_str(text).unwrap();
        node_specs(&cfg).expect_err("must be refused").to_string()
    }

    #[test]
    fn thin_is_for_mem_drives() {
        let e =
            specs_err("[[drive]]\nname = \"d0\"\nbackend = \"file\"\npath = \"/x\"\nthin = true\n");
        assert!(e.contains("drive[0].thin is only for"), "{e}");
    }

    const DRIVES: &str = "[[drive]]\nname = \"a\"\nbackend = \"mem\"\nsize = \"8MiB\"\n\
        [[drive]]\nname = \"b\"\nbackend = \"mem\"\nsize = \"8MiB\"\n\
        [[drive]]\nname = \"c\"\nbackend = \"mem\"\nsize = \"8MiB\"\n";

    #[test]
    fn drives_and_volumes_are_checked_before_any_drive_is_touched() {
        let ok: NodeConfig = toml::from_str(&format!(
            "{DRIVES}[[volume]]\nname = \"v\"\nlayout = \"raid5\"\ndrives = [\"a\", \"b\", \"c\"]\nstrip = \"128KiB\"\n"
        ))
        .unwrap();
        let (d, v) = node_specs(&ok).unwrap();
        assert_eq!(d.len(), 3);
        assert_eq!(v[0].strip.as_deref(), Some("131072"));

        let e = specs_err(&format!(
            "{DRIVES}[[volume]]\nname = \"v\"\nlayout = \"raid5\"\ndrives = [\"a\", \"b\"]\n"
        ));
        assert!(
            e.contains("volume[0].drives") && e.contains("at least 3"),
            "{e}"
        );
        let e = specs_err(&format!(
            "{DRIVES}[[volume]]\nname = \"v\"\nlayout = \"raid1\"\ndrives = [\"a\", \"z\"]\n"
        ));
        assert!(e.contains("\"z\", which no [[drive]] declares"), "{e}");
        let e = specs_err(&format!(
            "{DRIVES}[[volume]]\nname = \"v\"\nlayout = \"raid1\"\ndrives = [\"a\", \"b\"]\n\
             [[volume]]\nname = \"w\"\nlayout = \"raid0\"\ndrives = [\"b\"]\n"
        ));
        assert!(
            e.contains("drive \"b\" is already used by volume \"v\""),
            "{e}"
        );
        let e = specs_err(&format!(
            "{DRIVES}[[volume]]\nname = \"v\"\nlayout = \"raid9\"\ndrives = [\"a\"]\n"
        ));
        assert!(
            e.contains("volume[0].layout") && e.contains("unknown"),
            "{e}"
        );
        let e = specs_err("[[drive]]\nname = \"a\"\nbackend = \"mem\"\n");
        assert!(e.contains("drive[0].size is missing"), "{e}");
        let e = specs_err(&format!(
            "{DRIVES}[[drive]]\nname = \"a\"\nbackend = \"mem\"\nsize = 4096\n"
        ));
        assert!(e.contains("used twice"), "{e}");
    }

    #[test]
    fn a_volume_namespace_must_name_a_volume() {
        let text = "[[subsystem]]\nnqn = \"nqn.a:x\"\nallow_any_host = true\n\
                    [[subsystem.namespace]]\nnsid = 1\nbackend = \"volume\"\nvolume = \"nope\"\n";
        let cfg: NodeConfig = toml::from_str(text).unwrap();
        let e = build(&cfg, &|_, _, _| VolumeNamespace::Unknown)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("volume = \"nope\": no such volume"), "{e}");
        let empty: NodeConfig =
            toml::from_str("[[subsystem]]\nnqn = \"nqn.a:x\"\nallow_any_host = true\n").unwrap();
        let b = build(&empty, &|_, _, _| VolumeNamespace::Unknown).unwrap();
        assert!(
            b.subsystems[0].namespaces().is_empty(),
            "a subsystem may start empty"
        );
    }

    /// `[[subsystem.host]]` with key files: the host is allowed and must
    /// authenticate; `require_auth` refuses any way in without a secret.
    #[test]
    fn subsystem_hosts_with_key_files() {
        use super::auth::tests::{KEY1, key_dir, write};
        let dir = key_dir();
        let k = write(&dir, "k", KEY1, 0o600);
        let c = write(
            &dir,
            "c",
            &nvme_wire::auth::dhchap::Secret::from_key(None, &[5; 48])
                .unwrap()
                .to_dhhc(),
            0o400,
        );
        let open = write(&dir, "open", KEY1, 0o640);
        const H1: &str = "nqn.2014-08.org.nvmexpress:uuid:1";
        const H2: &str = "nqn.2014-08.org.nvmexpress:uuid:2";
        let sub = |extra: &str| {
            format!(
                "[[subsystem]]\nnqn = \"nqn.2026-01.io.flashpool:a\"\n{extra}\n\
                 [[subsystem.namespace]]\nnsid = 1\nbackend = \"null\"\nsize = 4096\n"
            )
        };
        let host = |nqn: &str, keys: &str| format!("[[subsystem.host]]\nnqn = \"{nqn}\"\n{keys}\n");
        let keys = format!("dhchap_key_file = {k:?}\ndhchap_ctrl_key_file = {c:?}\n");
        let text = sub(&format!("hosts = [\"{H2}\"]\n{}", host(H1, &keys)));
        let b = build(&parse(&text, "t").unwrap(), &|_, _, _| {
            VolumeNamespace::Unknown
        })
        .unwrap();
        let s = &b.subsystems[0];
        assert_eq!(s.hosts, [H2, H1]);
        let a = s.host_auth(H1).expect("H1 must authenticate");
        assert!(a.ctrl_key.is_some());
        assert!(
            s.host_auth(H2).is_none(),
            "H2 has no key: connects as before"
        );
        // A group-readable key file: refused, naming the key and the fix.
        let e = super::tests::err(&sub(&host(H1, &format!("dhchap_key_file = {open:?}"))));
        assert!(
            e.contains("subsystem[0].host[0].dhchap_key_file") && e.contains("chmod 600"),
            "{e}"
        );
        assert!(!e.contains("DHHC"), "{e}");
        // require_auth: no host without a secret, no allow_any_host.
        let e = super::tests::err(&sub(&format!(
            "require_auth = true\nhosts = [\"{H2}\"]\n{}",
            host(H1, &keys)
        )));
        assert!(e.contains("require_auth") && e.contains(H2), "{e}");
        let e = super::tests::err(&sub(&format!(
            "require_auth = true\nallow_any_host = true\n{}",
            host(H1, &keys)
        )));
        assert!(e.contains("allow_any_host"), "{e}");
        let e = super::tests::err(&sub(&format!("require_auth = true\n{}", host(H1, ""))));
        assert!(e.contains("no dhchap_key_file"), "{e}");
        assert_eq!(
            super::tests::err(&sub(&format!("require_auth = true\n{}", host(H1, &keys)))),
            "ok"
        );
        let e = super::tests::err(&sub(&format!("{}{}", host(H1, ""), host(H1, ""))));
        assert!(e.contains("appears twice"), "{e}");
        let e = super::tests::err(&sub(&host(H1, &format!("dhchap_ctrl_key_file = {c:?}"))));
        assert!(e.contains("add dhchap_key_file"), "{e}");
    }

    /// `dhchap_hashes` / `dhchap_dhgroups`: what the controller may pick for
    /// a host, in its order; unknown, repeated or missing names are refused.
    #[test]
    fn subsystem_host_hashes_and_groups() {
        use super::auth::tests::{KEY1, key_dir, write};
        use nvme_wire::auth::dhchap::{DhGroup, HashId};
        let k = write(&key_dir(), "k", KEY1, 0o600);
        const H1: &str = "nqn.2014-08.org.nvmexpress:uuid:1";
        let sub = |extra: &str| {
            format!(
                "[[subsystem]]\nnqn = \"nqn.2026-01.io.flashpool:a\"\nrequire_auth = true\n\
                 [[subsystem.host]]\nnqn = \"{H1}\"\ndhchap_key_file = {k:?}\n{extra}\n\
                 [[subsystem.namespace]]\nnsid = 1\nbackend = \"null\"\nsize = 4096\n"
            )
        };
        let auth = |extra: &str| {
            let b = build(&parse(&sub(extra), "t").unwrap(), &|_, _, _| {
                VolumeNamespace::Unknown
            })
            .unwrap();
            b.subsystems[0].host_auth(H1).unwrap()
        };
        // Default: every hash and group, FFDHE first.
        let a = auth("");
        assert_eq!(a.hashes, HashId::ALL);
        assert_eq!(a.dh_groups[0], DhGroup::Ffdhe2048);
        assert_eq!(a.dh_groups.len(), 6);
        let a = auth(
            "dhchap_hashes = [\"sha512\", \"sha256\"]\ndhchap_dhgroups = [\"null\", \"ffdhe8192\"]",
        );
        assert_eq!(a.hashes, [HashId::Sha512, HashId::Sha256]);
        assert_eq!(a.dh_groups, [DhGroup::Null, DhGroup::Ffdhe8192]);
        let a = auth("dhchap_dhgroups = [\"ffdhe3072\"]");
        assert_eq!(a.dh_groups, [DhGroup::Ffdhe3072]);
        assert_eq!(a.hashes, HashId::ALL);
        // Refusals name the key, the value and what is known.
        for (toml, want) in [
            (
                r#"dhchap_hashes = ["md5"]"#,
                &[
                    "subsystem[0].host[0].dhchap_hashes",
                    r#""md5" is not known"#,
                    r#""sha384""#,
                ][..],
            ),
            (r#"dhchap_hashes = ["hmac(sha256)"]"#, &["is not known"]),
            (
                r#"dhchap_dhgroups = ["ffdhe1024"]"#,
                &[
                    "dhchap_dhgroups",
                    r#""ffdhe1024" is not known"#,
                    r#""null""#,
                ],
            ),
            (r#"dhchap_dhgroups = ["null", "null"]"#, &["appears twice"]),
            ("dhchap_hashes = []", &["dhchap_hashes is empty"]),
            (r#"dhchap_dhgroups = "null""#, &["dhchap_dhgroups"]),
        ] {
            let e = super::tests::err(&sub(toml));
            assert!(want.iter().all(|w| e.contains(w)), "{toml}: {e}");
        }
        // Without a secret they would choose nothing.
        let e = super::tests::err(&format!(
            "[[subsystem]]\nnqn = \"nqn.2026-01.io.flashpool:a\"\n\
             [[subsystem.host]]\nnqn = \"{H1}\"\ndhchap_hashes = [\"sha256\"]\n"
        ));
        assert!(e.contains("no dhchap_key_file"), "{e}");
    }
}

//! The node's TOML configuration: parsed strictly, checked completely, and
//! turned into what the node is built from (its identity, drive and volume
//! specs) and into a target. Every error names the key, the value and the fix.
//!
//! One file per section family; this one holds the file as a whole.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use nvmf_target::{ListenerConfig, Subsystem, TransportConfig};
use serde::Deserialize;

pub mod auth;
pub mod cluster;
mod daemon;
mod drives;
pub mod membership;
#[cfg(test)]
mod node_tests;
mod subsystems;
mod target;
#[cfg(test)]
mod tests;
pub mod tls;
mod values;
mod volumes;

pub use cluster::{PeerSection, RemoteSection};
pub use daemon::{ApiSection, DEFAULT_API_ADDRESS, LogFormat, NodeSection};
pub use drives::DriveSection;
pub use membership::{ClusterSection, Membership};
pub use subsystems::{SubsystemSection, VolumeResolver};
pub use target::{ListenerSection, TransportSection};
pub use volumes::{ScrubSection, VolumeSection};

#[cfg(test)]
use crate::node::VolumeNamespace;
use crate::node::{CreateVolume, DriveSpec};
#[cfg(test)]
use values::{derived_id, parse_hex, parse_size};

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

/// The drives and volumes of the file, checked for what can be checked
/// without touching the drives.
pub fn node_specs(cfg: &NodeConfig) -> Result<(Vec<DriveSpec>, Vec<CreateVolume>)> {
    let drives = drives::drive_specs(&cfg.drive)?;
    let names: HashSet<String> = drives.iter().map(|d| d.name.clone()).collect();
    let volumes = volumes::volume_specs(&cfg.volume, &names)?;
    Ok((drives, volumes))
}

/// This node as other nodes know it: name, host NQN and ID, peers.
pub fn identity(cfg: &NodeConfig) -> Result<crate::node::identity::Cluster> {
    cluster::cluster(cfg)
}

/// The listeners of the file (`[[listener]]`).
pub fn listeners(cfg: &NodeConfig) -> Result<Vec<ListenerConfig>> {
    target::listeners(&cfg.listener)
}

fn transport(cfg: &NodeConfig) -> Result<TransportConfig> {
    target::transport(&cfg.node, &cfg.transport)
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
        values::check_nqn(&format!("{key}.nqn"), &s.nqn)?;
        if !seen.insert(s.nqn.clone()) {
            bail!(
                "config: {key}.nqn = {:?} is defined twice; each subsystem needs its own NQN",
                s.nqn
            );
        }
        subsystems.push(Arc::new(subsystems::subsystem(&key, s, volumes)?));
    }
    Ok(Built {
        transport,
        listeners,
        subsystems,
    })
}

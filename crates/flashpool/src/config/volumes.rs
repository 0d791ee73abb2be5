//! `[[volume]]` and `[scrub]`: the volumes the node makes or finds on its
//! drives, and when it scrubs them, checked and turned into node specs.

use std::collections::{HashMap, HashSet};

use anyhow::{Result, bail};
use serde::Deserialize;

use super::values::Size;
use crate::node::{CreateVolume, ScrubSchedule, check_name, parse_layout};

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
    /// A thin pool's inline compression: "lz4", "zstd" or "none" (default).
    pub compression: Option<String>,
    /// A thin volume in the pool on this volume, of `size` bytes.
    pub pool: Option<String>,
    pub size: Option<Size>,
    /// Encrypt the volume when it is made (AES-XTS-256, `[node] kek_file`).
    #[serde(default)]
    pub encrypt: bool,
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
    pub fn schedule(&self) -> anyhow::Result<ScrubSchedule> {
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
        Ok(ScrubSchedule {
            interval,
            repair: self.repair,
            rate: self.rate.map(Size::bytes),
        })
    }
}

/// The `[[volume]]`s over the drives named `drives`, checked; pools come
/// before the thin volumes they hold.
pub fn volume_specs(
    sections: &[VolumeSection],
    drives: &HashSet<String>,
) -> Result<Vec<CreateVolume>> {
    let mut volumes = Vec::new();
    let mut vnames = HashSet::new();
    let mut claimed: HashMap<&str, &str> = HashMap::new();
    for (i, v) in sections.iter().enumerate() {
        let key = format!("volume[{i}]");
        check_name(&format!("config: {key}.name:"), &v.name).map_err(|e| anyhow::anyhow!("{e}"))?;
        if !vnames.insert(v.name.clone()) {
            bail!(
                "config: {key}.name = {:?} is used twice; give each volume its own name",
                v.name
            );
        }
        if v.pool.is_some() {
            if v.layout.is_some() || !v.drives.is_empty() || v.thin_pool || v.compression.is_some()
            {
                bail!(
                    "config: {key}: a thin volume (pool = ...) takes only a size; remove layout, drives, thin_pool and compression"
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
            let kind =
                parse_layout(layout).map_err(|e| anyhow::anyhow!("config: {key}.layout: {e}"))?;
            kind.shape(v.drives.len())
                .map_err(|e| anyhow::anyhow!("config: {key}.drives: {e}"))?;
            if v.size.is_some() {
                bail!(
                    "config: {key}.size: a volume on drives takes all of them; size is for thin volumes"
                );
            }
            if let Some(c) = &v.compression {
                if !v.thin_pool {
                    bail!(
                        "config: {key}.compression: compression is for thin pools; add thin_pool = true or remove it"
                    );
                }
                c.parse::<volume::Compression>()
                    .map_err(|e| anyhow::anyhow!("config: {key}.compression: {e}"))?;
            }
        }
        for d in &v.drives {
            if !drives.contains(d) {
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
        volumes.push(CreateVolume {
            name: v.name.clone(),
            layout: v.layout.clone(),
            drives: v.drives.clone(),
            strip: v.strip.map(|s| s.bytes().to_string()),
            block_size: v.block_size,
            rebuild_rate: v.rebuild_rate.map(|s| s.bytes().to_string()),
            thin_pool: v.thin_pool,
            cluster: v.cluster.map(|s| s.bytes().to_string()),
            compression: v.compression.clone(),
            pool: v.pool.clone(),
            size: v.size.map(|s| s.bytes().to_string()),
            export: None,
            encrypt: v.encrypt,
        });
    }
    // Pools before the thin volumes they hold.
    volumes.sort_by_key(|v| v.pool.is_some());
    Ok(volumes)
}

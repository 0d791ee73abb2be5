//! `[[drive]]`: the raw devices volumes are built from (mem, file, or a
//! peer's exported drive), checked and turned into the node's drive specs.

use std::collections::HashSet;
use std::path::PathBuf;

use anyhow::{Result, bail};
use serde::Deserialize;

use super::values::{Size, mem_thin};
use crate::node::{DriveSpec, check_name};

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

fn bs4096() -> u32 {
    4096
}

/// The `[[drive]]`s, checked for what can be checked without touching them.
pub fn drive_specs(sections: &[DriveSection]) -> Result<Vec<DriveSpec>> {
    let mut drives = Vec::new();
    let mut names = HashSet::new();
    for (i, d) in sections.iter().enumerate() {
        let key = format!("drive[{i}]");
        if d.backend == "remote" {
            // `peer:drive`, so the name alone says where it lives.
            for part in d.name.splitn(2, ':') {
                check_name(&format!("config: {key}.name:"), part)
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
            check_name(&format!("config: {key}.name:"), &d.name)
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
        drives.push(DriveSpec {
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
    Ok(drives)
}

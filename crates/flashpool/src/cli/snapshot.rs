//! `flashpool snapshot create|list|delete` and `flashpool pool
//! check|expand`: snapshots of thin volumes (one, or several of one pool at
//! one instant), the thin pool's metadata check, and its growth.

use anyhow::{Result, bail};

use super::ApiArgs;
use super::volume::print_volume;
use crate::api_types::{
    ExpandPool, ExportRequest, PoolCheckInfo, SnapshotGroupRequest, SnapshotPair, VolumeDeleted,
    VolumeInfo,
};
use crate::output::outln;
use crate::units::human_bytes;

#[derive(clap::Subcommand, Debug)]
pub enum SnapshotCmd {
    /// Take a snapshot: VOLUME SNAPSHOT; several pairs (volumes of one pool)
    /// are taken at one instant, as a consistency group.
    Create {
        /// VOLUME SNAPSHOT [VOLUME SNAPSHOT ...]
        #[arg(required = true, num_args = 2..)]
        pairs: Vec<String>,
        /// Cluster mode: serve the snapshot(s), write-protected, in the
        /// pool's subsystem NQN (a node's own pool: `volume export` after).
        #[arg(long)]
        export: Option<String>,
        /// ...as this namespace ID (one snapshot; default: a free one).
        #[arg(long, requires = "export")]
        nsid: Option<u32>,
    },
    /// All snapshots.
    List,
    /// Delete a snapshot (its clones keep their data).
    Delete {
        name: String,
        /// Delete it even though it holds data.
        #[arg(long)]
        force: bool,
    },
}

#[derive(clap::Subcommand, Debug)]
pub enum PoolCmd {
    /// Check a thin pool's metadata: no cluster in two maps, none leaked,
    /// the snapshot tree sound, memory equal to the device. Exits 1 if not.
    Check { pool: String },
    /// Grow a thin pool: make a volume on DRIVES (by default with the
    /// pool's layout and strip) and add it to the pool as an extent. Its
    /// clusters are free at once; the volume is not served itself and is
    /// deleted with the pool.
    Expand {
        pool: String,
        /// The new extent's drives, comma-separated (e.g. d6,d7,d8,d9).
        #[arg(long, value_delimiter = ',', required = true)]
        drives: Vec<String>,
        /// Its layout (default: the pool volume's).
        #[arg(long)]
        layout: Option<String>,
        /// Its strip size, e.g. 64KiB (default: the pool volume's).
        #[arg(long)]
        strip: Option<String>,
        /// Its volume name (default POOL-xN).
        #[arg(long)]
        name: Option<String>,
    },
}

/// `flashpool snapshot ...`.
pub fn snapshot(api: ApiArgs, cmd: SnapshotCmd) -> Result<()> {
    let c = api.client()?;
    match cmd {
        SnapshotCmd::Create {
            pairs,
            export,
            nsid,
        } => {
            if pairs.len() % 2 != 0 {
                bail!(
                    "give VOLUME SNAPSHOT pairs: {} names is an odd count",
                    pairs.len()
                );
            }
            if nsid.is_some_and(|n| n != 0) && pairs.len() > 2 {
                bail!("--nsid serves one snapshot; leave it out to give each a free one");
            }
            let req = SnapshotGroupRequest {
                snapshots: pairs
                    .chunks(2)
                    .map(|p| SnapshotPair {
                        volume: p[0].clone(),
                        name: p[1].clone(),
                        export: export.clone().map(|nqn| ExportRequest {
                            nqn,
                            nsid: nsid.unwrap_or(0),
                        }),
                    })
                    .collect(),
            };
            let a = c.post("/snapshots", Some(&req))?;
            if api.json {
                return api.print_json(a.json());
            }
            for s in a.parse::<Vec<VolumeInfo>>()? {
                print_volume(&s);
            }
        }
        SnapshotCmd::List => {
            let a = c.get("/snapshots")?;
            if api.json {
                return api.print_json(a.json());
            }
            outln!(
                "{:<20} {:<14} {:>10} {:>10} {:<20}",
                "SNAPSHOT",
                "POOL",
                "SIZE",
                "OWN",
                "AFTER"
            );
            for s in a.parse::<Vec<VolumeInfo>>()? {
                outln!(
                    "{:<20} {:<14} {:>10} {:>10} {:<20}",
                    s.name,
                    s.pool.as_deref().unwrap_or("-"),
                    human_bytes(s.size_bytes),
                    human_bytes(s.allocated_bytes.unwrap_or(0)),
                    s.parent.as_deref().unwrap_or("-")
                );
            }
        }
        SnapshotCmd::Delete { name, force } => {
            let q = if force { "?force=true" } else { "" };
            let a = c.delete(&format!("/volumes/{}{q}", crate::client::segment(&name)))?;
            if api.json {
                return api.print_json(a.json());
            }
            let d: VolumeDeleted = a.parse()?;
            outln!("snapshot {}: deleted", d.deleted);
        }
    }
    Ok(())
}

/// `flashpool pool ...`.
pub fn pool(api: ApiArgs, cmd: PoolCmd) -> Result<()> {
    let c = api.client()?;
    let pool = match cmd {
        PoolCmd::Check { pool } => pool,
        PoolCmd::Expand {
            pool,
            drives,
            layout,
            strip,
            name,
        } => {
            let req = ExpandPool {
                drives,
                name,
                layout,
                strip,
            };
            let a = c.post(
                &format!("/volumes/{}/expand", crate::client::segment(&pool)),
                Some(&req),
            )?;
            if api.json {
                return api.print_json(a.json());
            }
            print_volume(&a.parse::<VolumeInfo>()?);
            return Ok(());
        }
    };
    let a = c.get(&format!("/volumes/{}/check", crate::client::segment(&pool)))?;
    let r: PoolCheckInfo = a.parse()?;
    if api.json {
        api.print_json(a.json())?;
    } else if r.ok {
        outln!(
            "pool {}: ok: {} volume(s), {} snapshot(s), {} deleted snapshot(s) still read by \
             clones; {} of {} clusters allocated, each in exactly one map; memory matches the \
             device (checkpoint + {} journal blocks)",
            r.pool,
            r.volumes,
            r.snapshots,
            r.hidden_snapshots,
            r.allocated_clusters,
            r.total_clusters,
            r.journal_blocks
        );
    }
    if !r.ok {
        bail!(
            "pool {}: check FAILED: {}",
            r.pool,
            r.problem.as_deref().unwrap_or("?")
        );
    }
    Ok(())
}

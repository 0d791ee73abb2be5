//! `flashpool volume ...`: make, list, show, export, assemble, move and
//! delete volumes, and follow their rebuilds.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::ApiArgs;
use super::job::ScrubArgs;
use super::qos::QosArgs;
use crate::api_types::{
    AssembleByName, AssembleVolume, CloneRequest, CreateVolume, ExportRequest, ForceRequest,
    GrowRequest, MoveRequest, MoveResult, PoolInfo, QosInfo, RebuildInfo, RebuildStatus,
    RevertRequest, VolumeDeleted, VolumeInfo,
};
use crate::client::{Answer, Client};
use crate::output::outln;
use crate::units::human_bytes;

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
        /// Thin pool allocation unit (default 1MiB; 64KiB with --compression).
        #[arg(long, requires = "thin_pool")]
        cluster: Option<String>,
        /// Compress the thin pool's chunks inline: lz4, zstd or none (default).
        #[arg(long, requires = "thin_pool")]
        compression: Option<String>,
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
        /// Encrypt it at rest (AES-XTS-256, a key of its own wrapped by the
        /// node's kek_file); a thin volume is encrypted when its pool is.
        #[arg(long)]
        encrypt: bool,
        /// Serve it at once in this subsystem (a cluster pool: where its
        /// thin volumes are served)...
        #[arg(long)]
        export: Option<String>,
        /// ...as this namespace ID (a thin volume of a cluster pool: the
        /// lowest free one when left out).
        #[arg(long, requires = "export")]
        nsid: Option<u32>,
        /// QoS limits, held by the target from the first command.
        #[command(flatten)]
        qos: Box<QosArgs>,
    },
    /// Show a volume's QoS limits, or change them live (0 or --clear: unlimited;
    /// a limit not given keeps its value).
    Qos {
        name: String,
        #[command(flatten)]
        limits: Box<QosArgs>,
        /// Start from no limits (and the default burst), then apply the flags given.
        #[arg(long)]
        clear: bool,
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
    /// Grow a thin volume online: hosts see the new size by themselves
    /// (Namespace Attribute Changed); then e.g. `resize2fs` on the host.
    Grow {
        name: String,
        /// The new size, e.g. 200GiB (smaller than now only with --force).
        #[arg(long)]
        size: String,
        /// Shrink to a smaller size, when the end it cuts holds no data
        /// (shrink the filesystem first; deallocate the end, e.g. blkdiscard).
        #[arg(long)]
        force: bool,
    },
    /// A writable thin volume NEW from snapshot SNAPSHOT, sharing its data
    /// until written (instant).
    Clone {
        snapshot: String,
        new: String,
        /// Serve it at once in this subsystem...
        #[arg(long, requires = "nsid")]
        export: Option<String>,
        /// ...as this namespace ID.
        #[arg(long, requires = "export")]
        nsid: Option<u32>,
    },
    /// Revert a thin volume to one of its snapshots (what was written since
    /// is lost). Refused while hosts are connected, unless --force.
    Revert {
        name: String,
        snapshot: String,
        /// Revert even while hosts are connected (their data changes under them).
        #[arg(long)]
        force: bool,
    },
    /// Serve a volume as namespace NSID of subsystem NQN; in cluster mode a
    /// thin volume or snapshot of a cluster pool, served by every node
    /// (NQN: the pool's subsystem; without --nsid the lowest free one).
    Export {
        name: String,
        #[arg(long, alias = "export")]
        nqn: String,
        /// Required on a node's own volumes.
        #[arg(long)]
        nsid: Option<u32>,
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
    Scrub(ScrubArgs),
    /// Rebuild progress and ETA.
    RebuildStatus {
        name: String,
        /// Wait until the rebuild is over, printing progress.
        #[arg(long)]
        wait: bool,
    },
}

/// `flashpool volume ...`.
pub fn volume(api: ApiArgs, cmd: VolumeCmd) -> Result<()> {
    let c = api.client()?;
    let a = match cmd {
        VolumeCmd::Create {
            name,
            layout,
            drives,
            thin_pool,
            cluster,
            compression,
            pool,
            size,
            strip,
            block_size,
            rebuild_rate,
            encrypt,
            export,
            nsid,
            qos,
        } => {
            let (pool, size) = match (pool, size) {
                (Some(p), Some(sz)) => (Some(p), Some(sz)),
                _ => (None, None),
            };
            let req = CreateVolume {
                name,
                drives: if layout.is_some() { drives } else { Vec::new() },
                layout,
                thin_pool,
                cluster,
                compression,
                pool,
                size,
                strip,
                block_size,
                rebuild_rate,
                export: export_request(export, nsid),
                encrypt,
            };
            let mut body = serde_json::to_value(&req)?;
            if let Some(q) = qos.request(false)? {
                body["qos"] = serde_json::to_value(q)?;
            }
            c.post("/volumes", Some(&body))?
        }
        VolumeCmd::Qos {
            name,
            limits,
            clear,
        } => {
            let a = super::qos::qos(&c, &name, &limits, clear)?;
            if api.json {
                api.print_json(a.json())?;
            } else {
                outln!("{}", super::qos::qos_text(&a.parse::<QosInfo>()?));
            }
            return Ok(());
        }
        VolumeCmd::List => {
            let a = c.get("/volumes")?;
            if api.json {
                api.print_json(a.json())?;
            } else {
                print_volume_table(&a.parse::<Vec<VolumeInfo>>()?);
            }
            return Ok(());
        }
        VolumeCmd::Show { name } => {
            c.get(&format!("/volumes/{}", crate::client::segment(&name)))?
        }
        VolumeCmd::Delete { name, force } => {
            let q = if force { "?force=true" } else { "" };
            let a = c.delete(&format!("/volumes/{}{q}", crate::client::segment(&name)))?;
            if api.json {
                api.print_json(a.json())?;
            } else {
                let d: VolumeDeleted = a.parse()?;
                outln!("volume {}: deleted", d.deleted);
            }
            return Ok(());
        }
        VolumeCmd::Grow { name, size, force } => c.post(
            &format!("/volumes/{}/grow", crate::client::segment(&name)),
            Some(&GrowRequest { size, force }),
        )?,
        VolumeCmd::Clone {
            snapshot,
            new,
            export,
            nsid,
        } => c.post(
            &format!("/volumes/{}/clone", crate::client::segment(&snapshot)),
            Some(&CloneRequest {
                name: new,
                export: export_request(export, nsid),
            }),
        )?,
        VolumeCmd::Revert {
            name,
            snapshot,
            force,
        } => c.post(
            &format!("/volumes/{}/revert", crate::client::segment(&name)),
            Some(&RevertRequest { snapshot, force }),
        )?,
        VolumeCmd::Export { name, nqn, nsid } => c.post(
            &format!("/volumes/{}/export", crate::client::segment(&name)),
            Some(&ExportRequest {
                nqn,
                nsid: nsid.unwrap_or(0),
            }),
        )?,
        VolumeCmd::Unexport { name, force } => c.post(
            &format!("/volumes/{}/unexport", crate::client::segment(&name)),
            force.then_some(&ForceRequest { force: true }),
        )?,
        VolumeCmd::Assemble {
            name: Some(name),
            force,
            ..
        } => {
            let a = c.post(
                &format!("/volumes/{}/assemble", crate::client::segment(&name)),
                Some(&AssembleByName { force }),
            )?;
            print_forced(&a, api.json)?;
            a
        }
        VolumeCmd::Assemble {
            name: None,
            drives,
            takeover,
            force,
            export,
            nsid,
        } => {
            let req = AssembleVolume {
                drives,
                takeover,
                export: export_request(export, nsid),
                force,
                only: None,
            };
            let a = c.post("/volumes/assemble", Some(&req))?;
            print_forced(&a, api.json)?;
            a
        }
        VolumeCmd::Move { name, to } => {
            let a = c.post(
                &format!("/volumes/{}/move", crate::client::segment(&name)),
                Some(&MoveRequest { to }),
            )?;
            if api.json {
                api.print_json(a.json())?;
            } else {
                let m: MoveResult = a.parse()?;
                outln!(
                    "volume {name}: moved from {} to {} (epoch {}) in {} ms",
                    m.from,
                    m.to,
                    m.epoch,
                    m.took_ms
                );
            }
            return Ok(());
        }
        VolumeCmd::RebuildStatus { name, wait } => {
            return rebuild_status(&c, &name, wait, api.json);
        }
        VolumeCmd::Scrub(s) => return super::job::scrub(api, s),
    };
    if api.json {
        api.print_json(a.json())?;
    } else {
        print_volume(&a.parse()?);
    }
    Ok(())
}

/// `--export NQN [--nsid N]` as a request's `export` (nsid 0: none given).
fn export_request(nqn: Option<String>, nsid: Option<u32>) -> Option<ExportRequest> {
    nqn.map(|nqn| ExportRequest {
        nqn,
        nsid: nsid.unwrap_or(0),
    })
}

fn export_text(v: &VolumeInfo) -> String {
    match &v.export {
        Some(x) => format!("nsid {} of {}", x.nsid, x.nqn),
        None => "-".into(),
    }
}

fn print_volume_table(vs: &[VolumeInfo]) {
    for l in volume_table(vs) {
        outln!("{l}");
    }
}

/// The list's lines. Cluster volumes add who owns each and the ANA state
/// this node reports (a node lists those it serves on standby too).
fn volume_table(vs: &[VolumeInfo]) -> Vec<String> {
    let cluster = vs
        .iter()
        .any(|x| x.owner.is_some() || x.ana_state.is_some());
    let mut head = format!(
        "{:<14} {:<8} {:>10} {:<10} {:<24}",
        "VOLUME", "LAYOUT", "SIZE", "STATE", "DRIVES"
    );
    if cluster {
        head += &format!(" {:<10} {:<13}", "OWNER", "ANA");
    }
    let mut out = vec![head + " exported as"];
    for x in vs {
        let drives: Vec<&str> = x.members.iter().map(|m| m.drive.as_str()).collect();
        let mut l = format!(
            "{:<14} {:<8} {:>10} {:<10} {:<24}",
            x.name,
            x.layout,
            human_bytes(x.size_bytes),
            x.state,
            drives.join(",")
        );
        if cluster {
            l += &format!(
                " {:<10} {:<13}",
                x.owner.as_deref().unwrap_or("-"),
                x.ana_state.as_deref().unwrap_or("-")
            );
        }
        out.push(format!("{l} {}", export_text(x)));
        if let Some(r) = &x.reason {
            out.push(format!("  {r}"));
        }
        if let Some(p) = x.thin_pool.as_ref().filter(|p| p.compression != "none") {
            out.push(format!("  {}", compression_text(p)));
        }
    }
    out
}

/// logical / stored, e.g. "2.41x" ("-" before anything is stored).
fn ratio(logical: u64, stored: u64) -> String {
    if stored == 0 {
        "-".into()
    } else {
        format!("{:.2}x", logical as f64 / stored as f64)
    }
}

/// A pool's compression and what it saves.
fn compression_text(p: &PoolInfo) -> String {
    format!(
        "compression {}: {} of chunks stored in {} ({}), {} pack cluster(s)",
        p.compression,
        human_bytes(p.logical_bytes),
        human_bytes(p.stored_bytes),
        ratio(p.logical_bytes, p.stored_bytes),
        p.pack_clusters
    )
}

/// A forced assembly's account of what may be stale, before the volume
/// (on stderr with --json, so the JSON stays one document).
fn print_forced(a: &Answer, json: bool) -> Result<()> {
    let v: VolumeInfo = a.parse()?;
    let Some(f) = &v.forced else {
        return Ok(());
    };
    let msg = &f.message;
    if json {
        eprintln!("WARNING: {msg}");
        return Ok(());
    }
    outln!("WARNING: {msg}");
    for r in f.stale_ranges.iter().flatten().take(32) {
        let (at, len) = (r.offset_bytes, r.len_bytes);
        outln!(
            "  may be stale: bytes {at}..{} ({})",
            at + len,
            human_bytes(len)
        );
    }
    Ok(())
}

/// One volume in detail (also what drive replace answers).
pub(super) fn print_volume(v: &VolumeInfo) {
    outln!("volume {} ({})", v.name, v.uuid);
    outln!(
        "  {} {}, {} B blocks, {} strips, {}, generation {}",
        v.layout,
        human_bytes(v.size_bytes),
        v.block_size,
        human_bytes(v.strip_bytes),
        v.state,
        v.generation
    );
    if let Some(r) = &v.reason {
        outln!("  {}: {r}", v.state);
    }
    if v.encrypted {
        outln!("  encrypted at rest (AES-XTS-256)");
    }
    outln!("  exported as: {}", export_text(v));
    if let Some(p) = &v.pool {
        let kind = if v.snapshot {
            "snapshot (read-only)"
        } else {
            "thin"
        };
        let allocated = v.allocated_bytes.unwrap_or(0);
        outln!(
            "  {kind}, in pool {p}: {} of {} allocated, {} shared with snapshots",
            human_bytes(allocated),
            human_bytes(v.size_bytes),
            human_bytes(v.shared_bytes.unwrap_or(0))
        );
        if let Some(st) = v.stored_bytes.filter(|&st| st != allocated) {
            outln!(
                "  stored compressed: {} ({})",
                human_bytes(st),
                ratio(allocated, st)
            );
        }
        if let Some(parent) = &v.parent {
            let how = if v.snapshot {
                "taken after"
            } else {
                "from snapshot"
            };
            outln!("  {how}: {parent}");
        }
    }
    if let Some(p) = &v.thin_pool {
        outln!(
            "  thin pool: {} allocated, {} free of {}, {} provisioned to {} thin volume(s), {} clusters",
            human_bytes(p.allocated_bytes),
            human_bytes(p.free_bytes),
            human_bytes(p.capacity_bytes),
            human_bytes(p.provisioned_bytes),
            p.volumes.len(),
            human_bytes(p.cluster_bytes)
        );
        if p.compression != "none" {
            outln!("  {}", compression_text(p));
        }
        for x in &p.extents {
            outln!(
                "  extent: volume {} ({}), {}",
                if x.volume.is_empty() { "?" } else { &x.volume },
                x.uuid,
                human_bytes(x.capacity_bytes)
            );
        }
    }
    if let Some(p) = &v.extent_of {
        outln!("  extent of thin pool {p} (not served itself; deleted with the pool)");
    }
    for m in &v.members {
        outln!("  member {:>2}: {:<12} {}", m.position, m.drive, m.state);
    }
    print_rebuild(&v.rebuild);
    for j in &v.jobs {
        outln!("  job {} {}: {:.1}%", j.id, j.kind.name(), j.percent);
    }
    if let Some(s) = &v.last_scrub {
        outln!(
            "  last scrub: {} at {}, {} mismatched, {} repaired",
            s.state.name(),
            s.finished.as_deref().unwrap_or("?"),
            s.mismatches,
            s.repaired
        );
    }
}

fn print_rebuild(r: &RebuildInfo) {
    if r.running {
        let eta = r.eta_secs.map_or("?".to_string(), |s| format!("{s:.0}s"));
        let (now, queued) = (r.drives.join(","), r.queued_drives.join(","));
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
            r.percent,
            r.done_stripes,
            r.total_stripes,
            r.mb_per_sec
        );
    } else if let Some(e) = &r.last_error {
        outln!("  rebuild: failed: {e}");
    } else {
        outln!("  rebuild: not running");
    }
}

fn rebuild_status(c: &Client, name: &str, wait: bool, as_json: bool) -> Result<()> {
    let start = Instant::now();
    loop {
        let a = c.get(&format!(
            "/volumes/{}/rebuild",
            crate::client::segment(name)
        ))?;
        let v: RebuildStatus = a.parse()?;
        let running = v.rebuild.running || matches!(v.state.as_str(), "rebuilding" | "resyncing");
        if as_json {
            outln!("{}", serde_json::to_string(a.json())?);
        } else {
            outln!("volume {name}: {}", v.state);
            print_rebuild(&v.rebuild);
        }
        // Nobody reads the progress any more (`| head`): stop waiting.
        if !wait || !running || crate::output::reader_gone() {
            if let Some(e) = &v.rebuild.last_error {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn standby() -> VolumeInfo {
        serde_json::from_value(serde_json::json!({
            "name": "v", "uuid": "u", "layout": "raid1", "size_bytes": 1u64 << 30,
            "block_size": 4096, "strip_bytes": 0, "state": "standby", "generation": 3,
            "members": [{"position": 0, "drive": "e1:d0", "state": "active"},
                        {"position": 1, "drive": "e2:d0", "state": "active"}],
            "export": {"nqn": "nqn.x:c", "nsid": 1},
            "rebuild": {"running": false, "members": [], "drives": [], "done_stripes": 0,
                        "total_stripes": 0, "percent": 0.0, "bytes": 0, "mb_per_sec": 0.0,
                        "eta_secs": null, "last_error": null},
            "owner": "a", "ana_state": "inaccessible"
        }))
        .unwrap()
    }

    #[test]
    fn the_list_shows_a_cluster_volumes_owner_and_ana_state() {
        let t = volume_table(&[standby()]);
        assert!(t[0].contains("OWNER") && t[0].contains("ANA"), "{t:?}");
        assert!(
            t[1].contains("e1:d0,e2:d0") && t[1].contains(" a ") && t[1].contains("inaccessible"),
            "{t:?}"
        );
        assert!(t[1].ends_with("nsid 1 of nqn.x:c"), "{t:?}");
        let mut local = standby();
        (local.owner, local.ana_state) = (None, None);
        assert!(!volume_table(&[local])[0].contains("OWNER"));
    }

    #[test]
    fn the_list_shows_a_compressed_pools_ratio() {
        let mut pool = standby();
        (pool.owner, pool.ana_state, pool.export) = (None, None, None);
        pool.thin_pool = Some(
            serde_json::from_value(serde_json::json!({
                "cluster_bytes": 65536, "capacity_bytes": 1u64 << 30, "allocated_bytes": 3u64 << 20,
                "free_bytes": 1021u64 << 20, "provisioned_bytes": 1u64 << 30, "volumes": ["t"],
                "compression": "lz4", "logical_bytes": 10u64 << 20, "stored_bytes": 4u64 << 20,
                "pack_clusters": 64
            }))
            .unwrap(),
        );
        let t = volume_table(&[pool.clone()]);
        assert_eq!(t.len(), 3, "{t:?}");
        assert!(
            t[2].contains("compression lz4")
                && t[2].contains("(2.50x)")
                && t[2].contains("64 pack"),
            "{t:?}"
        );
        // Without compression (or from a node that does not say): no line.
        let p = pool.thin_pool.as_mut().unwrap();
        p.compression = "none".into();
        assert_eq!(volume_table(&[pool]).len(), 2);
        assert_eq!(ratio(0, 0), "-");
    }
}

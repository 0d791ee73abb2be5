//! The node's own families: volumes (state, members, rebuilds, jobs, thin
//! pools) and drives (state, size, I/O counters kept by the node's
//! `MeteredDevice`), read from the node's state at scrape time.

use std::sync::atomic::Ordering::Relaxed;

use super::registry::{Exposition, Kind};
use super::{DRIVE_STATES, VOLUME_STATES};
use crate::api_types::DriveInfo;
use crate::node::jobs::{JobInfo, JobKind, JobState};
use crate::node::{Drive, DriveIoStats, NodeState};

pub(super) fn volumes(p: &mut Exposition, st: &NodeState) {
    let infos: Vec<_> = st
        .volumes
        .keys()
        .filter_map(|n| st.volume_info(n))
        .collect();
    let mut f = p.family(
        "flashpool_volume_state",
        Kind::Gauge,
        "1 for the volume's state (optimal, degraded, rebuilding, resyncing, failed, offline), 0 for the others.",
    );
    for v in &infos {
        for s in VOLUME_STATES {
            f.int(
                &[("volume", &v.name), ("state", s)],
                u64::from(v.state == s),
            );
        }
    }
    let mut f = p.family(
        "flashpool_volume_size_bytes",
        Kind::Gauge,
        "The volume's size as hosts see it.",
    );
    for v in &infos {
        f.int(&[("volume", &v.name)], v.size_bytes);
    }
    let mut f = p.family(
        "flashpool_volume_encrypted",
        Kind::Gauge,
        "1 when the volume's data is encrypted at rest (AES-XTS-256 above its members), else 0.",
    );
    for v in &infos {
        f.int(&[("volume", &v.name)], u64::from(v.encrypted));
    }

    // The stripe engine's counters (volumes on drives).
    let engine: Vec<_> = st
        .volumes
        .values()
        .filter_map(|e| Some((e.name.as_str(), e.on_drives()?)))
        .collect();
    let stats: Vec<_> = engine.iter().map(|(n, v)| (*n, v.stats())).collect();
    type Pick = fn(&volume::VolumeStats) -> u64;
    let counters: [(&'static str, &'static str, Pick); 10] = [
        (
            "flashpool_volume_degraded_reads_total",
            "Reads that reconstructed data of a missing member from parity.",
            |s| s.degraded_reads,
        ),
        (
            "flashpool_volume_degraded_writes_total",
            "Writes to a stripe with a missing member.",
            |s| s.degraded_writes,
        ),
        (
            "flashpool_volume_read_modify_writes_total",
            "Partial-stripe writes done by read-modify-write (old data and parity read).",
            |s| s.rmw_writes,
        ),
        (
            "flashpool_volume_reconstruct_writes_total",
            "Partial-stripe writes done by reconstruct-write (the other data read).",
            |s| s.rcw_writes,
        ),
        (
            "flashpool_volume_full_stripe_writes_total",
            "Writes that covered whole stripes (no reads).",
            |s| s.full_stripe_writes,
        ),
        (
            "flashpool_volume_gathered_stripe_writes_total",
            "Full-stripe writes made of the parts of several partial-stripe writes of a sequential stream (also counted as full-stripe writes).",
            |s| s.gathered_stripes,
        ),
        (
            "flashpool_volume_gather_timeouts_total",
            "Partial-stripe writes of a stream that waited for the rest of their stripe in vain (each part then wrote itself).",
            |s| s.gather_timeouts,
        ),
        (
            "flashpool_volume_journal_writes_total",
            "Write-journal records written (degraded parity updates).",
            |s| s.journal_writes,
        ),
        (
            "flashpool_volume_journal_bytes_total",
            "Bytes of write-journal records, headers included.",
            |s| s.journal_bytes,
        ),
        (
            "flashpool_volume_intent_writes_total",
            "Intent bitmap writes.",
            |s| s.intent_writes,
        ),
    ];
    for (name, help, pick) in counters {
        let mut f = p.family(name, Kind::Counter, help);
        for (v, s) in &stats {
            f.int(&[("volume", v)], pick(s));
        }
    }

    let mut f = p.family(
        "flashpool_volume_rebuild_running",
        Kind::Gauge,
        "1 while a rebuild or resync runs (or is about to) on the volume.",
    );
    for v in infos.iter().filter(|v| !v.members.is_empty()) {
        f.int(&[("volume", &v.name)], u64::from(v.rebuild.running));
    }
    let mut f = p.family(
        "flashpool_volume_rebuild_stripes_done",
        Kind::Gauge,
        "Stripes the current (or last) rebuild has done.",
    );
    for v in infos.iter().filter(|v| !v.members.is_empty()) {
        f.int(&[("volume", &v.name)], v.rebuild.done_stripes);
    }
    let mut f = p.family(
        "flashpool_volume_rebuild_stripes",
        Kind::Gauge,
        "Stripes the current (or last) rebuild has to do.",
    );
    for v in infos.iter().filter(|v| !v.members.is_empty()) {
        f.int(&[("volume", &v.name)], v.rebuild.total_stripes);
    }
    let mut f = p.family(
        "flashpool_volume_rebuild_written_bytes",
        Kind::Gauge,
        "Bytes the current (or last) rebuild wrote to new members.",
    );
    for v in infos.iter().filter(|v| !v.members.is_empty()) {
        f.int(&[("volume", &v.name)], v.rebuild.bytes);
    }

    let mut f = p.family(
        "flashpool_volume_rebuild_progress_ratio",
        Kind::Gauge,
        "Done stripes of the current (or last) rebuild over its stripes, 0 to 1.",
    );
    for v in infos.iter().filter(|v| !v.members.is_empty()) {
        f.float(&[("volume", &v.name)], v.rebuild.percent / 100.0);
    }

    // Initial syncs and scrubs: the node's jobs, the running one or else
    // the last (series appear once a job of the kind ran on the volume).
    let job_of = |kind: JobKind| -> Vec<(&str, JobInfo)> {
        engine
            .iter()
            .filter_map(|(n, _)| {
                let j = st.jobs.running(n, kind).or_else(|| st.jobs.last(n, kind))?;
                Some((*n, j.info()))
            })
            .collect()
    };
    type JobPick = fn(&JobInfo) -> u64;
    let running: JobPick = |j| u64::from(j.state == JobState::Running);
    let done: JobPick = |j| j.done_stripes;
    let total: JobPick = |j| j.total_stripes;
    /// A family: its name, help, and what it reads from a job.
    type JobFamily = (&'static str, &'static str, JobPick);
    let job_families: [(JobKind, [JobFamily; 3]); 2] = [
        (
            JobKind::Scrub,
            [
                (
                    "flashpool_volume_scrub_running",
                    "1 while a parity scrub runs on the volume.",
                    running,
                ),
                (
                    "flashpool_volume_scrub_stripes_done",
                    "Stripes the current (or last) scrub has checked.",
                    done,
                ),
                (
                    "flashpool_volume_scrub_stripes",
                    "Stripes the current (or last) scrub has to check.",
                    total,
                ),
            ],
        ),
        (
            JobKind::Sync,
            [
                (
                    "flashpool_volume_sync_running",
                    "1 while the initial parity sync of a new volume runs.",
                    running,
                ),
                (
                    "flashpool_volume_sync_stripes_done",
                    "Stripes the current (or last) initial sync has done.",
                    done,
                ),
                (
                    "flashpool_volume_sync_stripes",
                    "Stripes the current (or last) initial sync has to do.",
                    total,
                ),
            ],
        ),
    ];
    for (kind, fams) in job_families {
        let jobs = job_of(kind);
        for (name, help, pick) in fams {
            let mut f = p.family(name, Kind::Gauge, help);
            for (v, j) in &jobs {
                f.int(&[("volume", v)], pick(j));
            }
        }
    }
    let scrubs = job_of(JobKind::Scrub);
    let mut f = p.family(
        "flashpool_volume_scrub_mismatched_stripes",
        Kind::Gauge,
        "Stripes whose parity disagreed with their data in the current (or last) scrub.",
    );
    for (v, j) in &scrubs {
        f.int(&[("volume", v)], j.mismatches);
    }
    let mut f = p.family(
        "flashpool_volume_scrub_repaired_stripes",
        Kind::Gauge,
        "Stripes whose parity the current (or last) scrub rewrote.",
    );
    for (v, j) in &scrubs {
        f.int(&[("volume", v)], j.repaired);
    }

    // Thin provisioning.
    let pools: Vec<(&str, [u64; 5])> = infos
        .iter()
        .filter_map(|v| {
            let p = v.thin_pool.as_ref()?;
            let values = [
                p.capacity_bytes,
                p.allocated_bytes,
                p.provisioned_bytes,
                p.logical_bytes,
                p.stored_bytes,
            ];
            Some((v.name.as_str(), values))
        })
        .collect();
    // In the order of `values` above.
    let pool_gauges: [(&'static str, &'static str); 5] = [
        (
            "flashpool_thin_pool_capacity_bytes",
            "Bytes the thin pool on the volume can allocate.",
        ),
        (
            "flashpool_thin_pool_allocated_bytes",
            "Bytes of the thin pool allocated to thin volumes.",
        ),
        (
            "flashpool_thin_pool_provisioned_bytes",
            "Sum of the thin volumes' sizes (may exceed the capacity).",
        ),
        (
            "flashpool_thin_pool_logical_bytes",
            "What the chunks of the pool's volumes and snapshots hold, uncompressed.",
        ),
        (
            "flashpool_thin_pool_stored_bytes",
            "What those chunks take on the device (less than logical when compressed).",
        ),
    ];
    for (k, (name, help)) in pool_gauges.into_iter().enumerate() {
        let mut f = p.family(name, Kind::Gauge, help);
        for (v, values) in &pools {
            f.int(&[("pool", v)], values[k]);
        }
    }
    let mut f = p.family(
        "flashpool_thin_volume_allocated_bytes",
        Kind::Gauge,
        "Bytes of its pool a thin volume holds.",
    );
    for v in &infos {
        if let (Some(pool), Some(a)) = (&v.pool, v.allocated_bytes) {
            f.int(&[("volume", &v.name), ("pool", pool)], a);
        }
    }
    let mut f = p.family(
        "flashpool_thin_volume_stored_bytes",
        Kind::Gauge,
        "Bytes a thin volume's own chunks take on the device (less than allocated when compressed).",
    );
    for v in &infos {
        if let (Some(pool), Some(b)) = (&v.pool, v.stored_bytes) {
            f.int(&[("volume", &v.name), ("pool", pool)], b);
        }
    }
}

pub(super) fn drives(p: &mut Exposition, st: &NodeState) {
    let infos: Vec<_> = st
        .drives
        .keys()
        .filter_map(|n| Some((st.drive_info(n)?, &st.drives[n])))
        .collect();
    let mut f = p.family(
        "flashpool_drive_state",
        Kind::Gauge,
        "1 for the drive's state (free, spare, member, exported, failed), 0 for the others.",
    );
    for (i, _) in &infos {
        for s in DRIVE_STATES {
            f.int(&[("drive", &i.name), ("state", s)], u64::from(i.state == s));
        }
    }
    let mut f = p.family(
        "flashpool_drive_size_bytes",
        Kind::Gauge,
        "The drive's size.",
    );
    for (i, _) in &infos {
        f.int(&[("drive", &i.name), ("backend", &i.backend)], i.size_bytes);
    }
    type Pick = fn(&DriveIoStats) -> u64;
    let counters: [(&'static str, &'static str, Pick); 6] = [
        (
            "flashpool_drive_reads_total",
            "Reads submitted to the drive (by its volume, or hosts of an exported drive).",
            |s| s.reads.load(Relaxed),
        ),
        (
            "flashpool_drive_writes_total",
            "Writes submitted to the drive.",
            |s| s.writes.load(Relaxed),
        ),
        (
            "flashpool_drive_read_bytes_total",
            "Bytes read from the drive.",
            |s| s.read_bytes.load(Relaxed),
        ),
        (
            "flashpool_drive_written_bytes_total",
            "Bytes written to the drive.",
            |s| s.write_bytes.load(Relaxed),
        ),
        (
            "flashpool_drive_other_ops_total",
            "Flush, Write Zeroes and Deallocate requests submitted to the drive.",
            |s| s.other.load(Relaxed),
        ),
        (
            "flashpool_drive_errors_total",
            "Requests the drive failed.",
            |s| s.errors.load(Relaxed),
        ),
    ];
    for (name, help, pick) in counters {
        let mut f = p.family(name, Kind::Counter, help);
        for (i, d) in &infos {
            f.int(&[("drive", &i.name)], pick(&d.io));
        }
    }
    remote_drives(p, &infos);
}

/// The links of remote drives: whether connected, how often, and their
/// queues (the shared ones and those bound to reactors).
fn remote_drives(p: &mut Exposition, infos: &[(DriveInfo, &Drive)]) {
    let remotes: Vec<_> = infos
        .iter()
        .filter_map(|(i, d)| Some((i.name.as_str(), d.remote.as_ref()?)))
        .collect();
    let mut f = p.family(
        "flashpool_remote_drive_connected",
        Kind::Gauge,
        "1 while the link to a remote drive serves I/O, 0 while it reconnects or is down.",
    );
    for (name, r) in &remotes {
        let up = r.link_state() == nvmf_host::remote::LinkState::Connected;
        f.int(&[("drive", name)], u64::from(up));
    }
    let mut f = p.family(
        "flashpool_remote_drive_connects_total",
        Kind::Counter,
        "Connections made to a remote drive (the first and every reconnect).",
    );
    for (name, r) in &remotes {
        f.int(&[("drive", name)], r.connects());
    }
    let mut f = p.family(
        "flashpool_remote_drive_io_queues",
        Kind::Gauge,
        "I/O queues of a remote drive's connection: shared by every thread, or bound to one reactor.",
    );
    for (name, r) in &remotes {
        let (bound, _) = r.reactor_queues();
        let shared = if r.link_state() == nvmf_host::remote::LinkState::Connected {
            r.io_queues() as u64
        } else {
            0
        };
        f.int(&[("drive", name), ("kind", "shared")], shared);
        f.int(&[("drive", name), ("kind", "reactor")], bound as u64);
    }
    let mut f = p.family(
        "flashpool_remote_drive_reactor_requests_total",
        Kind::Counter,
        "Requests that reactors sent on their own queues of a remote drive (restarts at a reconnect).",
    );
    for (name, r) in &remotes {
        f.int(&[("drive", name)], r.reactor_queues().1);
    }
}

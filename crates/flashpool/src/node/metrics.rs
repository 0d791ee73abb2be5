//! `GET /metrics`: the node's metrics, read at scrape time. I/O counters
//! come from atomics the I/O path keeps (per namespace in the target, per
//! drive in [`super::drive::MeteredDevice`], per volume in the volume
//! engine); states, progress and usage from the node's state. `docs/metrics.md`
//! lists the families.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;

use super::{Node, NodeState};
use crate::prom::{Exposition, Kind, bounded};

/// Volume states, each a series of `flashpool_volume_state` (1 for the
/// volume's state, 0 for the others).
const VOLUME_STATES: [&str; 6] = [
    "optimal",
    "degraded",
    "rebuilding",
    "resyncing",
    "failed",
    "offline",
];
const DRIVE_STATES: [&str; 5] = ["free", "spare", "member", "exported", "failed"];

impl Node {
    /// The Prometheus text page.
    pub async fn metrics(&self) -> String {
        let mut p = Exposition::default();
        p.family(
            "flashpool_build_info",
            Kind::Gauge,
            "The running flashpool's version (always 1).",
        )
        .int(&[("version", env!("CARGO_PKG_VERSION"))], 1);
        let st = self.state.lock().await;
        volumes(&mut p, &st);
        drives(&mut p, &st);
        if let Some(t) = self.target.get() {
            namespaces(&mut p, &st, t);
            drop(st);
            controllers(&mut p, t);
        }
        p.finish()
    }
}

fn volumes(p: &mut Exposition, st: &NodeState) {
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

    // The stripe engine's counters (volumes on drives).
    let engine: Vec<_> = st
        .volumes
        .values()
        .filter_map(|e| Some((e.name.as_str(), e.on_drives()?)))
        .collect();
    let stats: Vec<_> = engine.iter().map(|(n, v)| (*n, v.stats())).collect();
    type Pick = fn(&volume::VolumeStats) -> u64;
    let counters: [(&'static str, &'static str, Pick); 8] = [
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
    use super::jobs::{JobInfo, JobKind, JobState};
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
    let pools: Vec<_> = infos
        .iter()
        .filter_map(|v| Some((v.name.as_str(), v.thin_pool.as_ref()?)))
        .collect();
    type PoolPick = fn(&super::ops::PoolInfo) -> u64;
    let pool_gauges: [(&'static str, &'static str, PoolPick); 3] = [
        (
            "flashpool_thin_pool_capacity_bytes",
            "Bytes the thin pool on the volume can allocate.",
            |p| p.capacity_bytes,
        ),
        (
            "flashpool_thin_pool_allocated_bytes",
            "Bytes of the thin pool allocated to thin volumes.",
            |p| p.allocated_bytes,
        ),
        (
            "flashpool_thin_pool_provisioned_bytes",
            "Sum of the thin volumes' sizes (may exceed the capacity).",
            |p| p.provisioned_bytes,
        ),
    ];
    for (name, help, pick) in pool_gauges {
        let mut f = p.family(name, Kind::Gauge, help);
        for (v, pi) in &pools {
            f.int(&[("pool", v)], pick(pi));
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
}

fn drives(p: &mut Exposition, st: &NodeState) {
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
    type Pick = fn(&super::drive::DriveIoStats) -> u64;
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
}

/// What a namespace serves, as labels: its volume or drive.
fn served(st: &NodeState) -> HashMap<(String, u32), (&'static str, String)> {
    let mut m = HashMap::new();
    for v in st.volumes.values() {
        if let Some(x) = &v.export {
            m.insert((x.nqn.clone(), x.nsid), ("volume", v.name.clone()));
        }
    }
    for d in st.drives.values() {
        if let Some(x) = &d.export {
            m.insert((x.nqn.clone(), 1), ("drive", d.name.clone()));
        }
    }
    m
}

fn namespaces(p: &mut Exposition, st: &NodeState, t: &nvmf_target::Target) {
    let names = served(st);
    let mut rows = Vec::new();
    for sub in t.subsystems().iter() {
        for ns in sub.namespaces().iter() {
            let nsid = ns.nsid.to_string();
            let what = names.get(&(sub.nqn.clone(), ns.nsid)).cloned();
            rows.push((sub.nqn.clone(), nsid, what, ns.stats.clone()));
        }
    }
    let labels = |(nqn, nsid, what, _): &(String, String, Option<(&'static str, String)>, _)| {
        let mut l: Vec<(&'static str, String)> =
            vec![("subsystem", nqn.clone()), ("nsid", nsid.clone())];
        if let Some((k, v)) = what {
            l.push((k, v.clone()));
        }
        l
    };
    type Pick = fn(&nvmf_target::stats::NsIoStats) -> u64;
    let counters: [(&'static str, &'static str, Pick); 6] = [
        (
            "flashpool_namespace_reads_total",
            "Read commands the namespace completed successfully.",
            |s| s.reads.load(Relaxed),
        ),
        (
            "flashpool_namespace_writes_total",
            "Write commands the namespace completed successfully.",
            |s| s.writes.load(Relaxed),
        ),
        (
            "flashpool_namespace_read_bytes_total",
            "Bytes read by hosts.",
            |s| s.read_bytes.load(Relaxed),
        ),
        (
            "flashpool_namespace_written_bytes_total",
            "Bytes written by hosts.",
            |s| s.write_bytes.load(Relaxed),
        ),
        (
            "flashpool_namespace_read_errors_total",
            "Read commands the device failed.",
            |s| s.read_errors.load(Relaxed),
        ),
        (
            "flashpool_namespace_write_errors_total",
            "Write commands the device failed.",
            |s| s.write_errors.load(Relaxed),
        ),
    ];
    for (name, help, pick) in counters {
        let mut f = p.family(name, Kind::Counter, help);
        for r in &rows {
            let l = labels(r);
            f.int(&as_refs(&l), pick(&r.3));
        }
    }
    let mut f = p.family(
        "flashpool_namespace_read_latency_seconds",
        Kind::Histogram,
        "Read commands from arrival to the device's completion.",
    );
    for r in &rows {
        let l = labels(r);
        f.histogram(&as_refs(&l), &r.3.read_latency.snapshot());
    }
    let mut f = p.family(
        "flashpool_namespace_write_latency_seconds",
        Kind::Histogram,
        "Write commands from arrival (host data included) to the device's completion.",
    );
    for r in &rows {
        let l = labels(r);
        f.histogram(&as_refs(&l), &r.3.write_latency.snapshot());
    }
}

fn as_refs<'a>(l: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    l.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// Per controller, with its host NQN cut to a bounded length.
struct CtrlRow {
    labels: Vec<(&'static str, String)>,
    depth: u64,
    io_queues: u64,
    reads: u64,
    writes: u64,
    digest_errors: u64,
    media_errors: u64,
    errors: u64,
}

fn controllers(p: &mut Exposition, t: &nvmf_target::Target) {
    let c = &t.counters;
    let opened = c.connections_opened.load(Relaxed);
    let closed = c.connections_closed.load(Relaxed);
    p.family(
        "flashpool_nvmf_connections",
        Kind::Gauge,
        "NVMe/TCP connections open now (each is one queue).",
    )
    .int(&[], opened.saturating_sub(closed));
    p.family(
        "flashpool_nvmf_connections_total",
        Kind::Counter,
        "NVMe/TCP connections accepted.",
    )
    .int(&[], opened);
    p.family(
        "flashpool_nvmf_protocol_errors_total",
        Kind::Counter,
        "Connections ended by a fatal transport error (malformed PDU, header digest).",
    )
    .int(&[], c.protocol_errors.load(Relaxed));
    p.family(
        "flashpool_nvmf_tls_handshakes_total",
        Kind::Counter,
        "TLS 1.3 handshakes (TP 8011), by result: ok, or refused (unknown identity, wrong key, \
         plain TCP on a TLS-only listener, timeout).",
    )
    .int(&[("result", "ok")], c.tls_handshakes.load(Relaxed))
    .int(
        &[("result", "refused")],
        c.tls_handshake_failures.load(Relaxed),
    );
    p.family(
        "flashpool_nvmf_digest_errors_total",
        Kind::Counter,
        "PDUs whose CRC32C digest did not match, by kind (header or data).",
    )
    .int(&[("kind", "header")], c.header_digest_errors.load(Relaxed))
    .int(&[("kind", "data")], c.data_digest_errors.load(Relaxed));

    let ctrls = t.controllers();
    let mut per_sub: std::collections::BTreeMap<String, u64> = Default::default();
    let rows: Vec<CtrlRow> = ctrls
        .iter()
        .map(|ctrl| {
            *per_sub.entry(ctrl.subnqn().to_string()).or_default() += 1;
            let queues = ctrl.stats.lock().clone();
            let sum = |f: fn(&nvmf_target::controller::QueueStats) -> u64| {
                queues.iter().map(|q| f(q)).sum::<u64>()
            };
            let (io_queues, errors) = {
                let s = ctrl.state.lock();
                (
                    s.io_queues.iter().skip(1).filter(|&&c| c).count() as u64,
                    s.error_count,
                )
            };
            CtrlRow {
                labels: vec![
                    ("subsystem", ctrl.subnqn().to_string()),
                    ("cntlid", ctrl.cntlid.to_string()),
                    ("host", bounded(&ctrl.hostnqn)),
                ],
                depth: sum(|q| q.depth.load(Relaxed)),
                io_queues,
                reads: sum(|q| q.read_cmds.load(Relaxed)),
                writes: sum(|q| q.write_cmds.load(Relaxed)),
                digest_errors: sum(|q| q.digest_errors.load(Relaxed)),
                media_errors: sum(|q| q.media_errors.load(Relaxed)),
                errors,
            }
        })
        .collect();
    let mut f = p.family(
        "flashpool_nvmf_controllers",
        Kind::Gauge,
        "Live controllers per subsystem (discovery included).",
    );
    for (nqn, n) in &per_sub {
        f.int(&[("subsystem", nqn)], *n);
    }
    type Pick = fn(&CtrlRow) -> u64;
    let fams: [(&'static str, Kind, &'static str, Pick); 7] = [
        (
            "flashpool_nvmf_controller_queue_depth",
            Kind::Gauge,
            "Commands outstanding on the controller's queues now (held AERs included).",
            |r| r.depth,
        ),
        (
            "flashpool_nvmf_controller_io_queues",
            Kind::Gauge,
            "I/O queues connected to the controller.",
            |r| r.io_queues,
        ),
        (
            "flashpool_nvmf_controller_reads_total",
            Kind::Counter,
            "Read commands the controller completed successfully.",
            |r| r.reads,
        ),
        (
            "flashpool_nvmf_controller_writes_total",
            Kind::Counter,
            "Write commands the controller completed successfully.",
            |r| r.writes,
        ),
        (
            "flashpool_nvmf_controller_digest_errors_total",
            Kind::Counter,
            "Command capsules or host data with a bad data digest.",
            |r| r.digest_errors,
        ),
        (
            "flashpool_nvmf_controller_media_errors_total",
            Kind::Counter,
            "Commands that failed with a media error.",
            |r| r.media_errors,
        ),
        (
            "flashpool_nvmf_controller_errors_total",
            Kind::Counter,
            "Commands that failed (entries made in the controller's error log).",
            |r| r.errors,
        ),
    ];
    for (name, kind, help, pick) in fams {
        let mut f = p.family(name, kind, help);
        for r in &rows {
            f.int(&as_refs(&r.labels), pick(r));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use blockdev::{AlignedBuf, BlockOp, IoRequest};
    use nvmf_target::{Subsystem, Target, TransportConfig};

    use super::super::{CreateVolume, DriveSpec, ExportRequest};
    use super::*;

    const NQN: &str = "nqn.2026-01.io.flashpool:metrics";

    fn node() -> Arc<Node> {
        let mut st = NodeState::default();
        for i in 0..4 {
            let spec = DriveSpec {
                name: format!("d{i}"),
                backend: "mem".into(),
                size: Some(16 << 20),
                block_size: 4096,
                ..Default::default()
            };
            st.drives.insert(spec.name.clone(), spec.open().unwrap());
        }
        let node = Node::with_state_dir(st, None);
        let sub = Subsystem::new(NQN.into(), "T".into(), "T".into(), true, vec![], vec![]);
        node.attach_target(Arc::new(Target::new(
            TransportConfig::default(),
            vec![Arc::new(sub)],
        )));
        node
    }

    /// The value of the sample whose line starts with `series ` (name and labels).
    fn value(page: &str, series: &str) -> f64 {
        page.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in\n{page}"))
            .parse()
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_scrape_reads_volume_drive_and_namespace_counters() {
        let node = node();
        let drives = ["d0", "d1", "d2"].map(String::from).to_vec();
        node.create_volume(CreateVolume {
            name: "v1".into(),
            layout: Some("raid5".into()),
            drives,
            thin_pool: false,
            cluster: None,
            pool: None,
            size: None,
            strip: None,
            block_size: None,
            rebuild_rate: None,
            export: None,
        })
        .await
        .unwrap();
        node.export(
            "v1",
            ExportRequest {
                nqn: NQN.into(),
                nsid: 1,
            },
        )
        .await
        .unwrap();
        let ns = node
            .target()
            .unwrap()
            .subsystem(NQN)
            .unwrap()
            .namespace(1)
            .unwrap();
        // One partial-stripe write through the volume, as the target would.
        let mut buf = AlignedBuf::new(4096);
        buf.set_len(4096);
        let done = ns
            .dev
            .submit(IoRequest {
                op: BlockOp::Write { fua: false },
                lba: 0,
                blocks: 1,
                buf,
            })
            .await;
        done.result.unwrap();
        // What the queue core records per command.
        ns.stats.reads.fetch_add(7, Relaxed);
        ns.stats
            .read_latency
            .record(std::time::Duration::from_micros(80));

        let page = node.metrics().await;
        let ns_labels = format!("{{subsystem=\"{NQN}\",nsid=\"1\",volume=\"v1\"}}");
        assert_eq!(
            value(
                &page,
                &format!("flashpool_namespace_reads_total{ns_labels}")
            ),
            7.0
        );
        assert_eq!(
            value(
                &page,
                &format!(
                    "flashpool_namespace_read_latency_seconds_bucket{{subsystem=\"{NQN}\",nsid=\"1\",volume=\"v1\",le=\"0.0001\"}}"
                )
            ),
            1.0
        );
        assert_eq!(
            value(
                &page,
                "flashpool_volume_state{volume=\"v1\",state=\"optimal\"}"
            ),
            1.0
        );
        assert_eq!(
            value(
                &page,
                "flashpool_volume_state{volume=\"v1\",state=\"degraded\"}"
            ),
            0.0
        );
        // Partial-stripe writes read old data or the other strips.
        let rmw = value(
            &page,
            "flashpool_volume_read_modify_writes_total{volume=\"v1\"}",
        ) + value(
            &page,
            "flashpool_volume_reconstruct_writes_total{volume=\"v1\"}",
        );
        assert!(rmw >= 1.0, "{page}");
        assert_eq!(
            value(&page, "flashpool_drive_state{drive=\"d3\",state=\"free\"}"),
            1.0
        );
        assert_eq!(
            value(
                &page,
                "flashpool_drive_state{drive=\"d0\",state=\"member\"}"
            ),
            1.0
        );
        let written: f64 = ["d0", "d1", "d2"]
            .iter()
            .map(|d| {
                value(
                    &page,
                    &format!("flashpool_drive_writes_total{{drive=\"{d}\"}}"),
                )
            })
            .sum();
        assert!(written >= 2.0, "data and parity written: {page}");
        assert_eq!(value(&page, "flashpool_nvmf_connections"), 0.0);
        // Every family once, HELP before TYPE before samples.
        let mut seen = std::collections::HashSet::new();
        for l in page.lines().filter(|l| l.starts_with("# TYPE ")) {
            let name = l.split(' ').nth(2).unwrap();
            assert!(seen.insert(name.to_string()), "{name} twice");
        }
        assert!(seen.contains("flashpool_volume_degraded_reads_total"));
        assert!(seen.contains("flashpool_volume_rebuild_stripes"));
        // Every line is valid exposition syntax, histograms included.
        crate::prom::check_exposition(&page);
        assert!(page.contains("# TYPE flashpool_namespace_reads_total counter\n"));
    }
}

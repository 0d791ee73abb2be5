//! The target's families: namespaces (I/O counters and latency histograms
//! kept by the target's I/O path, labelled with the volume or drive they
//! serve) and controllers (queues, depth, errors, by host).

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;

use super::registry::{Exposition, Kind, bounded};
use crate::node::NodeState;
use nvmf_target::stats::NsIoStats;

/// What a namespace serves, as labels: its volume or drive (`cluster`: the
/// namespaces of cluster volumes, which the agent serves, not the node).
fn served(
    st: &NodeState,
    cluster: &[(String, u32, String)],
) -> HashMap<(String, u32), (&'static str, String)> {
    let mut m = HashMap::new();
    for (nqn, nsid, v) in cluster {
        m.insert((nqn.clone(), *nsid), ("volume", v.clone()));
    }
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

pub(super) fn namespaces(
    p: &mut Exposition,
    st: &NodeState,
    t: &nvmf_target::Target,
    cluster: &[(String, u32, String)],
) {
    let names = served(st, cluster);
    let mut rows = Vec::new();
    let mut qos = Vec::new();
    for sub in t.subsystems().iter() {
        for ns in sub.namespaces().iter() {
            let nsid = ns.nsid.to_string();
            let what = names.get(&(sub.nqn.clone(), ns.nsid)).cloned();
            rows.push((sub.nqn.clone(), nsid, what, ns.stats.clone()));
            qos.push(ns.qos.clone());
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
    qos_families(p, &rows, &qos, labels);
}

type Row = (
    String,
    String,
    Option<(&'static str, String)>,
    std::sync::Arc<NsIoStats>,
);

/// QoS: time held and commands held (every namespace), and the limits of
/// those that have any.
fn qos_families(
    p: &mut Exposition,
    rows: &[Row],
    qos: &[std::sync::Arc<nvmf_target::qos::NsQos>],
    labels: impl Fn(&Row) -> Vec<(&'static str, String)>,
) {
    let mut f = p.family(
        "flashpool_namespace_qos_throttled_seconds_total",
        Kind::Counter,
        "Time the namespace's commands were held by its QoS limits, added up over commands.",
    );
    for (r, q) in rows.iter().zip(qos) {
        f.float_counter(&as_refs(&labels(r)), q.throttled().0.as_secs_f64());
    }
    let mut f = p.family(
        "flashpool_namespace_qos_throttled_commands_total",
        Kind::Counter,
        "Commands held by the namespace's QoS limits before they ran.",
    );
    for (r, q) in rows.iter().zip(qos) {
        f.int(&as_refs(&labels(r)), q.throttled().1);
    }
    let mut f = p.family(
        "flashpool_namespace_qos_limit",
        Kind::Gauge,
        "The namespace's QoS limits now, by limit (iops, read_iops, write_iops in commands per \
         second; bandwidth, read_bandwidth, write_bandwidth in bytes per second; burst_ms); \
         absent: unlimited.",
    );
    for (r, q) in rows.iter().zip(qos) {
        let l = q.limits();
        if l.is_unlimited() {
            continue;
        }
        let base = labels(r);
        for (name, v) in [
            ("iops", l.iops),
            ("read_iops", l.read_iops),
            ("write_iops", l.write_iops),
            ("bandwidth", l.bandwidth),
            ("read_bandwidth", l.read_bandwidth),
            ("write_bandwidth", l.write_bandwidth),
            ("burst_ms", l.burst().as_millis() as u64),
        ] {
            if v > 0 {
                let mut lab = base.clone();
                lab.push(("limit", name.to_string()));
                f.int(&as_refs(&lab), v);
            }
        }
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

pub(super) fn controllers(p: &mut Exposition, t: &nvmf_target::Target) {
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

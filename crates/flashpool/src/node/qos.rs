//! Volumes' QoS limits: checked, applied live to the namespace that serves
//! the volume (the target holds commands over a limit, see
//! `nvmf_target::qos`), kept in `state_dir/qos.json` so a restart keeps
//! them, and announced as a `qos_changed` event.

use std::collections::BTreeMap;

use nvmf_target::qos::{MAX_BURST_MS, QosLimits};

use crate::api_types::{QosInfo, QosLimitsInfo, QosRequest, Rate};
use crate::echo::Echo;
use crate::events::{EventKind, NewEvent};

use super::validate::find_volume;
use super::{Node, NodeError, NodeResult, NodeState, VolumeEntry};

/// The smallest bandwidth limit: one 4 KiB block a second (below it a
/// single command would wait more than a second).
pub const MIN_BANDWIDTH: u64 = 4096;

fn bytes_per_sec(what: &str, r: &Rate) -> NodeResult<u64> {
    let v = match r {
        Rate::Number(n) => *n,
        Rate::Text(t) => crate::units::parse_size(t).map_err(|e| {
            NodeError::BadRequest(format!(
                "{what}: {e}; give bytes per second, e.g. 20MiB, or 0 for unlimited"
            ))
        })?,
    };
    if v != 0 && v < MIN_BANDWIDTH {
        return Err(NodeError::BadRequest(format!(
            "{what} {v} B/s is below {MIN_BANDWIDTH} B/s (one 4 KiB block a second); give 0 for \
             unlimited or at least {MIN_BANDWIDTH}"
        )));
    }
    Ok(v)
}

/// `cur` changed by `req`, checked whole before anything changes.
pub fn apply_request(cur: QosLimits, req: &QosRequest) -> NodeResult<QosLimits> {
    let mut l = if req.clear { QosLimits::default() } else { cur };
    if let Some(ms) = req.burst_ms {
        if ms == 0 || ms > MAX_BURST_MS {
            return Err(NodeError::BadRequest(format!(
                "burst_ms {ms} is out of range; use 1 to {MAX_BURST_MS} (milliseconds of each \
                 limit an idle volume may run ahead; default 100)"
            )));
        }
        l.burst_ms = ms;
    }
    let bw = |what: &str, r: &Option<Rate>, cur: u64| -> NodeResult<u64> {
        r.as_ref().map_or(Ok(cur), |r| bytes_per_sec(what, r))
    };
    l.bandwidth = bw("bandwidth", &req.bandwidth, l.bandwidth)?;
    l.read_bandwidth = bw("read_bandwidth", &req.read_bandwidth, l.read_bandwidth)?;
    l.write_bandwidth = bw("write_bandwidth", &req.write_bandwidth, l.write_bandwidth)?;
    l.iops = req.iops.unwrap_or(l.iops);
    l.read_iops = req.read_iops.unwrap_or(l.read_iops);
    l.write_iops = req.write_iops.unwrap_or(l.write_iops);
    Ok(l)
}

pub fn limits_info(l: &QosLimits) -> QosLimitsInfo {
    QosLimitsInfo {
        iops: l.iops,
        read_iops: l.read_iops,
        write_iops: l.write_iops,
        bandwidth: l.bandwidth,
        read_bandwidth: l.read_bandwidth,
        write_bandwidth: l.write_bandwidth,
        burst_ms: l.burst().as_millis() as u32,
    }
}

fn limits_of(i: &QosLimitsInfo) -> QosLimits {
    QosLimits {
        iops: i.iops,
        read_iops: i.read_iops,
        write_iops: i.write_iops,
        bandwidth: i.bandwidth,
        read_bandwidth: i.read_bandwidth,
        write_bandwidth: i.write_bandwidth,
        burst_ms: i.burst_ms.min(MAX_BURST_MS),
    }
}

/// The limits in words, for events and logs: "unlimited" or
/// "iops 500, bandwidth 19.1 MiB/s, burst 100 ms".
pub fn describe(l: &QosLimits) -> String {
    if l.is_unlimited() {
        return "unlimited".into();
    }
    let bw = |b: u64| format!("{}/s", crate::units::human_bytes(b));
    let mut parts = Vec::new();
    for (name, v) in [
        ("iops", l.iops),
        ("read iops", l.read_iops),
        ("write iops", l.write_iops),
    ] {
        if v > 0 {
            parts.push(format!("{name} {v}"));
        }
    }
    for (name, v) in [
        ("bandwidth", l.bandwidth),
        ("read bandwidth", l.read_bandwidth),
        ("write bandwidth", l.write_bandwidth),
    ] {
        if v > 0 {
            parts.push(format!("{name} {}", bw(v)));
        }
    }
    parts.push(format!("burst {} ms", l.burst().as_millis()));
    parts.join(", ")
}

impl VolumeEntry {
    pub fn qos_info(&self) -> QosInfo {
        let l = self.qos.limits();
        let (waited, held) = self.qos.throttled();
        QosInfo {
            volume: self.name.clone(),
            limits: limits_info(&l),
            unlimited: l.is_unlimited(),
            throttled_seconds: waited.as_secs_f64(),
            throttled_commands: held,
        }
    }
}

/// Refuses QoS on a thin pool: it is never served itself.
fn check_servable(e: &VolumeEntry) -> NodeResult<()> {
    if e.thin_pool().is_some() {
        return Err(NodeError::BadRequest(format!(
            "volume {} is a thin pool, which is not served itself; set QoS on its thin volumes",
            e.name
        )));
    }
    Ok(())
}

impl Node {
    pub async fn volume_qos(&self, name: &str) -> NodeResult<QosInfo> {
        let mut st = self.state.lock().await;
        Ok(find_volume(&mut st, name)?.qos_info())
    }

    /// Changes a volume's limits live: checked whole, saved, then applied
    /// to its namespace (the next command sees them). A refused request
    /// changes nothing.
    pub async fn set_volume_qos(&self, name: &str, req: QosRequest) -> NodeResult<QosInfo> {
        let mut st = self.state.lock().await;
        let e = find_volume(&mut st, name)?;
        check_servable(e)?;
        let old = e.qos.limits();
        let new = apply_request(old, &req)?;
        let qos = e.qos.clone();
        if new != old {
            self.save_qos_with(&st, name, new)?;
            qos.set(new);
            self.note_qos_change(name, &old, &new);
        }
        Ok(find_volume(&mut st, name)?.qos_info())
    }

    /// Limits given when the volume is made: checked before it is made.
    pub(super) fn create_qos(req: Option<&QosRequest>) -> NodeResult<QosLimits> {
        req.map_or(Ok(QosLimits::default()), |r| {
            apply_request(QosLimits::default(), r)
        })
    }

    /// A new volume's limits, once it is registered: announced and saved
    /// (its namespace had them from the start: see `register`).
    pub(super) fn note_new_qos(&self, st: &NodeState, name: &str, l: QosLimits) -> NodeResult<()> {
        if l.is_unlimited() {
            return Ok(());
        }
        self.note_qos_change(name, &QosLimits::default(), &l);
        self.save_qos_with(st, name, l)
    }

    fn note_qos_change(&self, name: &str, old: &QosLimits, new: &QosLimits) {
        self.events.emit(
            NewEvent::new(
                EventKind::QosChanged,
                format!(
                    "volume {name}: QoS {} (was {})",
                    describe(new),
                    describe(old)
                ),
            )
            .volume(name),
        );
    }

    /// Writes every volume's limits, with `name`'s as `limits` (what is
    /// about to be applied), atomically.
    fn save_qos_with(&self, st: &NodeState, name: &str, limits: QosLimits) -> NodeResult<()> {
        let Some(path) = &self.qos_file else {
            return Ok(());
        };
        let mut list: BTreeMap<&str, QosLimitsInfo> = st
            .volumes
            .values()
            .map(|v| (v.name.as_str(), v.qos.limits()))
            .filter(|(_, l)| !l.is_unlimited())
            .map(|(n, l)| (n, limits_info(&l)))
            .collect();
        list.remove(name);
        if !limits.is_unlimited() {
            list.insert(name, limits_info(&limits));
        }
        let text = serde_json::to_string_pretty(&list).expect("qos serializes");
        super::write_atomic(path, text.as_bytes()).map_err(|e| {
            NodeError::Internal(format!(
                "saving {} failed: {e}; the limits were not changed",
                path.display()
            ))
        })
    }

    /// After a delete: the volume's limits leave the file too.
    pub(super) fn forget_qos(&self, st: &NodeState, name: &str) {
        if let Err(e) = self.save_qos_with(st, name, QosLimits::default()) {
            tracing::warn!("volume {name}: deleted, but its QoS limits stay on file: {e}");
        }
    }

    /// At start, once the volumes are known: the limits of the last run.
    pub async fn restore_qos(&self) -> anyhow::Result<()> {
        let Some(path) = &self.qos_file else {
            return Ok(());
        };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => anyhow::bail!("cannot read {}: {e}", path.display()),
        };
        let list: BTreeMap<String, QosLimitsInfo> = serde_json::from_str(&text).map_err(|e| {
            anyhow::anyhow!(
                "{} is not a QoS file ({e}); fix or remove it",
                path.display()
            )
        })?;
        let st = self.state.lock().await;
        for (name, l) in list {
            match st.volumes.get(&name) {
                Some(e) => {
                    let l = limits_of(&l);
                    e.qos.set(l);
                    tracing::info!("volume {name}: QoS {}", describe(&l));
                }
                None => tracing::warn!(
                    "{}: volume {} is gone; its QoS limits are not applied",
                    path.display(),
                    Echo(&name)
                ),
            }
        }
        Ok(())
    }
}

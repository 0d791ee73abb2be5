//! The node's watcher, as `mdadm --monitor` is: it samples the volumes,
//! drives and thin pools every [`PERIOD`] and turns what changed into
//! events (drive failed, rebuild started/finished/failed, volume
//! optimal/degraded/failed/offline, thin pool above 80/90/95%).
//!
//! Sampling, not hooks in the operations: a state reached by any path (the
//! API, an I/O error, a takeover in cluster mode, a rebuild task) is seen
//! the same way. A change that comes and goes between two samples is
//! inferred where it leaves a trace: a member replaced and rebuilt within
//! one period still gives `rebuild_started` and `rebuild_finished`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::events::{EventKind, NewEvent};

use super::{Node, NodeState};

/// How often the node is sampled.
pub const PERIOD: Duration = Duration::from_millis(250);

/// Thin pool fill levels that raise an event when crossed upward.
pub const POOL_THRESHOLDS: [u8; 3] = [80, 90, 95];

/// Percentage points a pool must fall below a level before crossing it
/// again raises a new event (so a pool at 80% ± a cluster does not flap).
pub const POOL_HYSTERESIS: f64 = 3.0;

/// One volume as the monitor compares it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VolumeSample {
    /// optimal, degraded, rebuilding, resyncing, failed or offline.
    pub state: String,
    pub reason: Option<String>,
    /// A thin volume: its state is its pool's, reported there.
    pub thin: bool,
    /// Drive name and member state, by position.
    pub members: Vec<(String, String)>,
    pub rebuild_running: bool,
    pub rebuild_error: Option<String>,
    /// A thin pool's allocated share of its capacity, in percent.
    pub pool_percent: Option<f64>,
}

/// One drive as the monitor compares it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DriveSample {
    /// free, member, exported or failed.
    pub state: String,
    pub volume: Option<String>,
    pub position: Option<usize>,
}

/// The node at one instant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    pub volumes: BTreeMap<String, VolumeSample>,
    pub drives: BTreeMap<String, DriveSample>,
}

impl Sample {
    pub fn of(st: &NodeState) -> Sample {
        let volumes = st
            .volumes
            .keys()
            .filter_map(|n| st.volume_info(n))
            .map(|v| {
                let pool_percent = v.thin_pool.as_ref().and_then(|p| {
                    (p.capacity_bytes > 0)
                        .then(|| 100.0 * p.allocated_bytes as f64 / p.capacity_bytes as f64)
                });
                let s = VolumeSample {
                    state: v.state,
                    reason: v.reason,
                    thin: v.pool.is_some(),
                    members: v.members.into_iter().map(|m| (m.drive, m.state)).collect(),
                    rebuild_running: v.rebuild.running,
                    rebuild_error: v.rebuild.last_error,
                    pool_percent,
                };
                (v.name, s)
            })
            .collect();
        let drives = st
            .drives
            .keys()
            .filter_map(|n| st.drive_info(n))
            .map(|d| {
                let s = DriveSample {
                    state: d.state,
                    volume: d.volume,
                    position: d.position,
                };
                (d.name, s)
            })
            .collect();
        Sample { volumes, drives }
    }
}

/// What the monitor remembers between samples.
#[derive(Debug, Default)]
pub struct Monitor {
    prev: Option<Sample>,
    /// Per thin pool: the highest threshold reported and not yet re-armed.
    pool_level: BTreeMap<String, u8>,
}

impl Monitor {
    /// Compares `cur` with the previous sample and returns the events, in
    /// the order things happen (a drive fails, then its volume degrades; a
    /// rebuild finishes, then the volume is optimal).
    pub fn step(&mut self, cur: Sample) -> Vec<NewEvent> {
        let mut out = Vec::new();
        let first = self.prev.is_none();
        let prev = self.prev.take().unwrap_or_default();
        for (name, d) in &cur.drives {
            let was_failed = prev.drives.get(name).is_some_and(|p| p.state == "failed");
            if !first && d.state == "failed" && !was_failed && prev.drives.contains_key(name) {
                out.push(drive_failed(name, prev.drives.get(name).unwrap_or(d)));
            }
        }
        for (name, v) in &cur.volumes {
            let pv = prev.volumes.get(name);
            if let Some(pv) = pv {
                rebuild_events(name, pv, v, &mut out);
            }
            // A volume seen for the first time (at start, made, assembled,
            // taken over) is reported only when it is not well.
            let before = pv.map(|p| p.state.as_str()).unwrap_or("optimal");
            if !v.thin
                && v.state != before
                && let Some(e) = volume_state_event(name, v)
            {
                out.push(e);
            }
            if let Some(pct) = v.pool_percent {
                let level = self.pool_level.entry(name.clone()).or_insert(0);
                if let Some(e) = pool_event(name, pct, level) {
                    out.push(e);
                }
            }
        }
        self.pool_level
            .retain(|n, _| cur.volumes.get(n).is_some_and(|v| v.pool_percent.is_some()));
        self.prev = Some(cur);
        out
    }
}

fn drive_failed(name: &str, was: &DriveSample) -> NewEvent {
    let e = NewEvent::new(
        EventKind::DriveFailed,
        match (&was.volume, was.position) {
            (Some(v), Some(p)) => format!(
                "drive {name} (volume {v}, position {p}) has failed; replace it: \
                 flashpool drive replace {name} --with SPARE"
            ),
            _ => format!("drive {name} has failed; it is not used until the node restarts"),
        },
    )
    .drive(name);
    match &was.volume {
        Some(v) => e.volume(v),
        None => e,
    }
}

/// The drives at the positions whose drive changed or that are rebuilding.
fn rebuilt_drives(pv: &VolumeSample, v: &VolumeSample) -> Vec<String> {
    v.members
        .iter()
        .enumerate()
        .filter(|(i, (d, s))| {
            s == "rebuilding" || pv.members.get(*i).is_some_and(|(pd, _)| pd != d)
        })
        .map(|(_, (d, _))| d.clone())
        .collect()
}

fn rebuild_events(name: &str, pv: &VolumeSample, v: &VolumeSample, out: &mut Vec<NewEvent>) {
    let drives = rebuilt_drives(pv, v);
    let new_error = v.rebuild_error.is_some() && v.rebuild_error != pv.rebuild_error;
    // A member replaced (or a new failure recorded) without a running
    // rebuild in either sample: the rebuild came and went in between.
    let missed = !pv.rebuild_running
        && !v.rebuild_running
        && (new_error
            || v.members
                .iter()
                .zip(&pv.members)
                .any(|((d, _), (pd, _))| d != pd));
    let on = |e: NewEvent| match drives.first() {
        Some(d) => e.volume(name).drive(d),
        None => e.volume(name),
    };
    let onto = if drives.is_empty() {
        String::new()
    } else {
        format!(" onto {}", drives.join(", "))
    };
    if (v.rebuild_running && !pv.rebuild_running) || missed {
        out.push(on(NewEvent::new(
            EventKind::RebuildStarted,
            format!("volume {name}: rebuild started{onto}; follow it: flashpool volume rebuild-status {name} --wait"),
        )));
    }
    if (pv.rebuild_running && !v.rebuild_running) || missed {
        out.push(on(match &v.rebuild_error {
            Some(err) if new_error => NewEvent::new(
                EventKind::RebuildFailed,
                format!(
                    "volume {name}: rebuild failed: {err}; the volume stays without full redundancy"
                ),
            ),
            _ => NewEvent::new(
                EventKind::RebuildFinished,
                format!("volume {name}: rebuild finished{onto}"),
            ),
        }));
    }
}

fn volume_state_event(name: &str, v: &VolumeSample) -> Option<NewEvent> {
    let why = v
        .reason
        .as_deref()
        .map(|r| format!(": {r}"))
        .unwrap_or_default();
    let failed_drives: Vec<&str> = v
        .members
        .iter()
        .filter(|(_, s)| s == "failed" || s == "missing")
        .map(|(d, _)| d.as_str())
        .collect();
    let (kind, msg) = match v.state.as_str() {
        "optimal" => (
            EventKind::VolumeOptimal,
            format!("volume {name} is optimal: every member holds its data"),
        ),
        "degraded" => (
            EventKind::VolumeDegraded,
            format!(
                "volume {name} is degraded (failed: {}): it runs with less redundancy; \
                 replace the failed drive with a spare",
                failed_drives.join(", ")
            ),
        ),
        "failed" => (
            EventKind::VolumeFailed,
            format!("volume {name} has failed{why}"),
        ),
        "offline" => (
            EventKind::VolumeOffline,
            format!("volume {name} is offline (not served){why}"),
        ),
        // Rebuilding and resyncing have events of their own.
        _ => return None,
    };
    let e = NewEvent::new(kind, msg).volume(name);
    Some(match failed_drives.first() {
        Some(d) if kind == EventKind::VolumeDegraded => e.drive(*d),
        _ => e,
    })
}

/// One event when the pool crosses a threshold upward (the highest one
/// crossed); the level re-arms once the pool is [`POOL_HYSTERESIS`] points
/// under it.
fn pool_event(name: &str, pct: f64, level: &mut u8) -> Option<NewEvent> {
    let reached = POOL_THRESHOLDS
        .iter()
        .copied()
        .filter(|&t| pct >= f64::from(t))
        .max()
        .unwrap_or(0);
    if reached > *level {
        *level = reached;
        return Some(
            NewEvent::new(
                EventKind::ThinPoolUsage,
                format!(
                    "thin pool on volume {name} is {pct:.1}% allocated (above {reached}%); \
                     when it is full, writes to unallocated blocks of its thin volumes fail: \
                     delete thin volumes or make a larger pool"
                ),
            )
            .volume(name),
        );
    }
    let keep = POOL_THRESHOLDS
        .iter()
        .copied()
        .filter(|&t| pct >= f64::from(t) - POOL_HYSTERESIS)
        .max()
        .unwrap_or(0);
    if keep < *level {
        *level = keep;
    }
    None
}

/// Samples `node` every [`PERIOD`] and emits what changed, until the
/// runtime stops. The first sample is the baseline: only volumes that are
/// not well at start are reported.
pub fn spawn(node: &Arc<Node>) {
    let node = node.clone();
    tokio::spawn(async move {
        let mut m = Monitor::default();
        let mut tick = tokio::time::interval(PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let sample = Sample::of(&*node.state.lock().await);
            for e in m.step(sample) {
                node.events.emit(e);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vol(state: &str, members: &[(&str, &str)]) -> VolumeSample {
        VolumeSample {
            state: state.into(),
            members: members
                .iter()
                .map(|(d, s)| (d.to_string(), s.to_string()))
                .collect(),
            ..VolumeSample::default()
        }
    }

    fn drive(state: &str, vol: Option<(&str, usize)>) -> DriveSample {
        DriveSample {
            state: state.into(),
            volume: vol.map(|v| v.0.into()),
            position: vol.map(|v| v.1),
        }
    }

    fn sample(vols: &[(&str, VolumeSample)], drives: &[(&str, DriveSample)]) -> Sample {
        Sample {
            volumes: vols
                .iter()
                .map(|(n, v)| (n.to_string(), v.clone()))
                .collect(),
            drives: drives
                .iter()
                .map(|(n, d)| (n.to_string(), d.clone()))
                .collect(),
        }
    }

    fn kinds(evs: &[NewEvent]) -> Vec<&'static str> {
        evs.iter().map(|e| e.kind().name()).collect()
    }

    #[test]
    fn the_first_sample_reports_only_volumes_that_are_not_well() {
        let mut m = Monitor::default();
        let s = sample(
            &[
                ("ok", vol("optimal", &[("d0", "active")])),
                (
                    "deg",
                    vol("degraded", &[("d1", "failed"), ("d2", "active")]),
                ),
                ("off", vol("offline", &[])),
                ("bad", vol("failed", &[])),
                ("rb", vol("rebuilding", &[])),
            ],
            &[("d1", drive("failed", Some(("deg", 0))))],
        );
        let evs = m.step(s.clone());
        // BTreeMap order: bad, deg, off.
        assert_eq!(
            kinds(&evs),
            ["volume_failed", "volume_degraded", "volume_offline"]
        );
        assert!(m.step(s).is_empty(), "nothing changed, nothing reported");
    }

    #[test]
    fn fail_then_replace_then_rebuild() {
        let mut m = Monitor::default();
        let optimal = vol("optimal", &[("d0", "active"), ("d1", "active")]);
        let member = |p| drive("member", Some(("v", p)));
        m.step(sample(
            &[("v", optimal.clone())],
            &[
                ("d0", member(0)),
                ("d1", member(1)),
                ("s", drive("free", None)),
            ],
        ));
        let degraded = vol("degraded", &[("d0", "active"), ("d1", "failed")]);
        let failed_d1 = drive("failed", Some(("v", 1)));
        let evs = m.step(sample(
            &[("v", degraded)],
            &[
                ("d0", member(0)),
                ("d1", failed_d1),
                ("s", drive("free", None)),
            ],
        ));
        assert_eq!(kinds(&evs), ["drive_failed", "volume_degraded"]);
        assert_eq!(evs[0].drive_name(), Some("d1"));
        assert_eq!(evs[1].drive_name(), Some("d1"));
        let mut rebuilding = vol("rebuilding", &[("d0", "active"), ("s", "rebuilding")]);
        rebuilding.rebuild_running = true;
        let after = [
            ("d0", member(0)),
            ("d1", drive("failed", None)),
            ("s", member(1)),
        ];
        let evs = m.step(sample(&[("v", rebuilding)], &after));
        assert_eq!(kinds(&evs), ["rebuild_started"]);
        assert_eq!(evs[0].drive_name(), Some("s"));
        let done = vol("optimal", &[("d0", "active"), ("s", "active")]);
        let evs = m.step(sample(&[("v", done)], &after));
        assert_eq!(kinds(&evs), ["rebuild_finished", "volume_optimal"]);
    }

    #[test]
    fn a_rebuild_between_two_samples_is_still_reported() {
        let mut m = Monitor::default();
        m.step(sample(
            &[("v", vol("degraded", &[("d0", "active"), ("d1", "failed")]))],
            &[],
        ));
        let evs = m.step(sample(
            &[("v", vol("optimal", &[("d0", "active"), ("s", "active")]))],
            &[],
        ));
        assert_eq!(
            kinds(&evs),
            ["rebuild_started", "rebuild_finished", "volume_optimal"]
        );
    }

    #[test]
    fn a_failed_rebuild_is_critical() {
        let mut m = Monitor::default();
        let mut rb = vol("rebuilding", &[("d0", "active"), ("s", "rebuilding")]);
        rb.rebuild_running = true;
        m.step(sample(&[("v", rb)], &[]));
        let mut after = vol("degraded", &[("d0", "active"), ("s", "failed")]);
        after.rebuild_error = Some("read error on d0".into());
        let evs = m.step(sample(&[("v", after)], &[]));
        assert_eq!(kinds(&evs), ["rebuild_failed", "volume_degraded"]);
        assert_eq!(evs[0].kind().severity(), "critical");
    }

    #[test]
    fn thin_volumes_do_not_repeat_their_pools_state() {
        let mut m = Monitor::default();
        let mut t = vol("optimal", &[]);
        t.thin = true;
        m.step(sample(&[("t", t.clone())], &[]));
        t.state = "degraded".into();
        assert!(m.step(sample(&[("t", t)], &[])).is_empty());
    }

    #[test]
    fn pool_thresholds_fire_once_upward_and_rearm_below_the_hysteresis() {
        let mut level = 0;
        let mut fire = |pct: f64| pool_event("p", pct, &mut level).is_some();
        assert!(!fire(50.0));
        assert!(fire(80.0));
        assert!(!fire(81.0));
        // Flapping around 80: nothing.
        assert!(!fire(79.5));
        assert!(!fire(80.2));
        // Straight past 90 and 95: one event, for 95.
        assert!(fire(96.0));
        assert!(!fire(95.5));
        // Under 95 - 3: re-armed for 95, still at 90.
        assert!(!fire(91.0));
        assert!(fire(95.0));
        // Well under everything, then back up: 80 again.
        assert!(!fire(10.0));
        assert!(fire(85.0));
        let mut level = 0;
        let e = pool_event("p", 92.0, &mut level).unwrap();
        assert_eq!(e.kind(), EventKind::ThinPoolUsage);
        assert!(e.message_text().contains("above 90%"), "{e:?}");
    }

    #[test]
    fn the_monitor_tracks_pool_levels_per_pool() {
        let mut m = Monitor::default();
        let mut p = vol("optimal", &[]);
        p.pool_percent = Some(10.0);
        m.step(sample(&[("p", p.clone())], &[]));
        p.pool_percent = Some(85.0);
        assert_eq!(
            kinds(&m.step(sample(&[("p", p.clone())], &[]))),
            ["thin_pool_usage"]
        );
        assert!(m.step(sample(&[("p", p)], &[])).is_empty());
    }
}

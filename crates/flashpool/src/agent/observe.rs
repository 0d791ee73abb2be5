//! What the agent tells an operator: its events (lease lost, fenced,
//! stepped down, took over with each step's time, handed off, moved, node
//! joined/left, etcd unreachable/back), its metrics (what it last read of
//! each volume, lease time left, fences, takeover and move durations), and
//! the answer of `GET /v1/cluster` when etcd cannot be reached.
//!
//! The event constructors are pure (they say what happened and what to do);
//! the acting parts (`own.rs`, `runner.rs`, `mod.rs`) emit them, never
//! `decide.rs`. Nothing here is read on the I/O path, and a scrape reads no
//! etcd: it shows what the last pass read.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use cluster::{ClusterError, ClusterEvent, NodeRecord, Owner};
use parking_lot::Mutex;

use super::Agent;
use crate::api_types::ClusterStatus;
use crate::events::{EventKind, NewEvent};
use crate::metrics::cluster::{ClusterPage, ClusterVolume, DurationHistogram};
use crate::node::{NodeError, NodeResult};

/// What the agent keeps for its metrics and for events that need a before.
#[derive(Default)]
pub(super) struct Observed {
    pub(super) fences: AtomicU64,
    pub(super) takeovers: DurationHistogram,
    pub(super) moves: DurationHistogram,
    /// Per volume settled here: its ANA group and the owner last read.
    volumes: Mutex<BTreeMap<String, Seen>>,
    /// The live nodes last seen (None until the first pass read them).
    nodes: Mutex<Option<BTreeSet<String>>>,
    /// Since when etcd could not be reached (None: it answers).
    etcd_down: Mutex<Option<Instant>>,
    /// Set once etcd failed; cleared when it answers again.
    etcd_flag: AtomicBool,
}

#[derive(Clone, Default)]
struct Seen {
    group: u32,
    owner: Option<Owner>,
    /// The last node seen owning it (a move's or takeover's "from").
    last_owner: Option<String>,
}

/// When each step of a takeover began and ended, as `own.rs` measures them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Steps {
    /// The first pass that saw the volume unowned (or the claim, when the
    /// volume was never seen owned-then-gone).
    pub first_seen: Instant,
    pub claim_started: Instant,
    pub claimed: Instant,
    /// Members connected, old owner preempted, journal replayed, resync started.
    pub assembled: Instant,
    /// Group Optimized: hosts send I/O here.
    pub serving: Instant,
}

impl Steps {
    pub(super) fn total(&self) -> Duration {
        self.serving.saturating_duration_since(self.first_seen)
    }
}

fn list(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

pub(super) fn lease_lost(why: &str, owned: &[String]) -> NewEvent {
    NewEvent::new(
        EventKind::LeaseLost,
        format!(
            "this node's etcd lease is lost ({why}): the volumes owned here ({}) are fenced and \
             serve no I/O here; the other nodes take them over; this node joins again as soon as \
             etcd answers. Check the network path to etcd if it happens again",
            list(owned)
        ),
    )
}

pub(super) fn fenced(volume: &str, why: &str) -> NewEvent {
    NewEvent::new(
        EventKind::Fenced,
        format!(
            "volume {volume}: fenced here: {why}; it takes no more I/O on this node (hosts go to \
             the owner `flashpool cluster status` shows)"
        ),
    )
    .volume(volume)
}

pub(super) fn stepped_down(volume: &str, why: &str) -> NewEvent {
    NewEvent::new(
        EventKind::SteppedDown,
        format!("volume {volume}: stepped down here without writing: {why}; standby now"),
    )
    .volume(volume)
}

pub(super) fn took_over(volume: &str, epoch: u64, from: Option<&str>, st: &Steps) -> NewEvent {
    let from = from.map(|f| format!(" from {f}")).unwrap_or_default();
    let e = NewEvent::new(
        EventKind::TookOver,
        format!(
            "volume {volume}: taken over here{from} at epoch {epoch}, served {} ms after this \
             node first saw it unowned",
            ms(st.total())
        ),
    )
    .volume(volume);
    with_steps(e, st)
}

pub(super) fn takeover_failed(volume: &str, epoch: u64, why: &str, retry: Duration) -> NewEvent {
    NewEvent::new(
        EventKind::TakeoverFailed,
        format!(
            "volume {volume}: claimed here at epoch {epoch} but not run: {why}; released, no \
             node serves it now; this node tries again in {} s",
            retry.as_secs()
        ),
    )
    .volume(volume)
}

pub(super) fn pool_held(pool: &str, epoch: u64, retry: Duration) -> NewEvent {
    NewEvent::new(
        EventKind::PoolHeld,
        format!(
            "pool {pool}: owned here at epoch {epoch} but not served: its thin volumes' host \
             reservations could not be read from etcd, and none is served without them; its \
             ANA group stays inaccessible (hosts wait); tried again every {} ms",
            retry.as_millis()
        ),
    )
    .volume(pool)
}

pub(super) fn pool_released(pool: &str, held: Duration) -> NewEvent {
    NewEvent::new(
        EventKind::PoolReleased,
        format!(
            "pool {pool}: its thin volumes' host reservations are read; served after {} ms held",
            held.as_millis()
        ),
    )
    .volume(pool)
}

fn with_steps(e: NewEvent, st: &Steps) -> NewEvent {
    let d = |a: Instant, b: Instant| b.saturating_duration_since(a);
    e.step("detect", d(st.first_seen, st.claim_started))
        .step("claim", d(st.claim_started, st.claimed))
        .step("assemble", d(st.claimed, st.assembled))
        .step("serve", d(st.assembled, st.serving))
        .step("total", st.total())
}

pub(super) fn moved(
    volume: &str,
    epoch: u64,
    from: Option<&str>,
    took: Duration,
    st: &Steps,
) -> NewEvent {
    let from = from.map(|f| format!(" from {f}")).unwrap_or_default();
    let e = NewEvent::new(
        EventKind::Moved,
        format!(
            "volume {volume}: moved here{from} at epoch {epoch}, served {} ms after the handoff \
             was seen",
            ms(took)
        ),
    )
    .volume(volume);
    with_steps(e, st).step("move", took)
}

pub(super) fn handed_off(
    volume: &str,
    to: &str,
    epoch: u64,
    clean: bool,
    took: Duration,
) -> NewEvent {
    let how = if clean {
        "closed clean"
    } else {
        "let go fenced (commands were still running or the clean close failed)"
    };
    NewEvent::new(
        EventKind::HandedOff,
        format!(
            "volume {volume}: handed off to {to} (epoch {epoch} released, {how}) in {} ms here",
            ms(took)
        ),
    )
    .volume(volume)
    .node(to)
}

pub(super) fn node_joined(node: &str) -> NewEvent {
    NewEvent::new(
        EventKind::NodeJoined,
        format!("node {node} joined the cluster"),
    )
    .node(node)
}

pub(super) fn node_left(node: &str) -> NewEvent {
    NewEvent::new(
        EventKind::NodeLeft,
        format!(
            "node {node} left the cluster (its lease ended: stopped, dead or cut off); the volumes \
             it owned are taken over by the others"
        ),
    )
    .node(node)
}

pub(super) fn etcd_unreachable(err: &str, lease_left: Duration, owned: &[String]) -> NewEvent {
    NewEvent::new(
        EventKind::EtcdUnreachable,
        format!(
            "etcd cannot be reached from this node ({err}); the volumes owned here ({}) keep \
             serving for at most {:.1} s more (the lease), then stop serving I/O and the other \
             nodes take them over. Check the network path to etcd (cluster.etcd)",
            list(owned),
            lease_left.as_secs_f64()
        ),
    )
}

pub(super) fn etcd_back(after: Duration) -> NewEvent {
    NewEvent::new(
        EventKind::EtcdBack,
        format!(
            "etcd answers this node again (after {:.1} s)",
            after.as_secs_f64()
        ),
    )
}

/// The answer of `GET /v1/cluster` on a node that cannot reach etcd.
pub(super) fn unreachable_answer(err: &str, lease_left: Duration, owned: &[String]) -> NodeError {
    let what = if owned.is_empty() {
        "no volume is owned here".to_string()
    } else if lease_left.is_zero() {
        format!(
            "its lease has run out: the volumes it owned ({}) are fenced here and served by \
             the other nodes, if they can reach etcd",
            list(owned)
        )
    } else {
        format!(
            "the volumes owned here ({}) stop serving I/O when its lease runs out in {:.1} s, \
             and the other nodes take them over",
            list(owned),
            lease_left.as_secs_f64()
        )
    };
    NodeError::Unavailable(format!(
        "this node cannot reach etcd ({err}), so it cannot tell the cluster's state; {what}. \
         Ask another node (--api), or check the network path to etcd (cluster.etcd)"
    ))
}

impl Agent {
    /// What etcd named as `name`'s owner at this pass (`own.rs`).
    pub(super) fn seen_owner(&self, name: &str, group: u32, owner: Option<&Owner>) {
        let mut v = self.obs.volumes.lock();
        let e = v.entry(name.to_string()).or_default();
        e.group = group;
        e.owner = owner.cloned();
        if let Some(o) = owner {
            e.last_owner = Some(o.node.clone());
        }
    }

    /// The last node other than this one seen owning `name`.
    pub(super) fn last_owner(&self, name: &str) -> Option<String> {
        let v = self.obs.volumes.lock();
        v.get(name)
            .and_then(|s| s.last_owner.clone())
            .filter(|o| o != self.name())
    }

    /// `name` is no longer served here.
    pub(super) fn forget(&self, name: &str) {
        self.obs.volumes.lock().remove(name);
    }

    fn owned_names(&self) -> Vec<String> {
        self.owned.lock().keys().cloned().collect()
    }

    fn lease_left(&self) -> Duration {
        self.session().valid_until().map_or(Duration::ZERO, |t| {
            t.saturating_duration_since(Instant::now())
        })
    }

    /// The lease is lost: one event naming what was fenced.
    pub(super) fn tell_lease_lost(&self, why: &str) {
        // a clean leave revokes the lease on purpose: nothing to tell
        if self.leaving.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let owned = self.owned_names();
        self.node.events.emit(lease_lost(why, &owned));
    }

    /// A watch event about nodes: joined or left.
    pub(super) fn observe_event(&self, e: &ClusterEvent) {
        match e {
            ClusterEvent::NodeUp(r) => self.node_seen(&r.name, true),
            ClusterEvent::NodeDown(n) => self.node_seen(n, false),
            _ => {}
        }
    }

    fn node_seen(&self, name: &str, up: bool) {
        if name == self.name() {
            return;
        }
        let mut nodes = self.obs.nodes.lock();
        let Some(known) = nodes.as_mut() else { return };
        let changed = if up {
            known.insert(name.to_string())
        } else {
            known.remove(name)
        };
        drop(nodes);
        if changed {
            let e = if up {
                node_joined(name)
            } else {
                node_left(name)
            };
            self.node.events.emit(e);
        }
    }

    /// The live nodes a pass read: the first read sets what is known, a
    /// later one tells the changes the watch did not.
    pub(super) fn seen_nodes(&self, nodes: &[NodeRecord]) {
        let now: BTreeSet<String> = nodes
            .iter()
            .map(|n| n.name.clone())
            .filter(|n| n != self.name())
            .collect();
        let before = self.obs.nodes.lock().replace(now.clone());
        let Some(before) = before else { return };
        for n in now.difference(&before) {
            self.node.events.emit(node_joined(n));
        }
        for n in before.difference(&now) {
            self.node.events.emit(node_left(n));
        }
    }

    /// Whether etcd answered a pass: tells when that changes.
    pub(super) fn etcd_answered(&self, r: &Result<(), ClusterError>) {
        match r {
            Err(ClusterError::Etcd(err)) => {
                if !self.obs.etcd_flag.swap(true, Relaxed) {
                    *self.obs.etcd_down.lock() = Some(Instant::now());
                    let owned = self.owned_names();
                    self.node
                        .events
                        .emit(etcd_unreachable(err, self.lease_left(), &owned));
                }
            }
            Ok(()) => {
                if self.obs.etcd_flag.swap(false, Relaxed) {
                    let since = self.obs.etcd_down.lock().take();
                    let after = since.map_or(Duration::ZERO, |t| t.elapsed());
                    self.node.events.emit(etcd_back(after));
                }
            }
            Err(_) => {}
        }
    }

    /// A volume fenced here (counted, told).
    pub(super) fn tell_fenced(&self, volume: &str, why: &str) {
        self.obs.fences.fetch_add(1, Relaxed);
        self.node.events.emit(fenced(volume, why));
    }

    /// What `GET /metrics` adds in cluster mode.
    pub fn metrics_page(&self) -> ClusterPage {
        let volumes = self
            .obs
            .volumes
            .lock()
            .iter()
            .map(|(name, s)| ClusterVolume {
                name: name.clone(),
                owner: s.owner.as_ref().map(|o| o.node.clone()),
                epoch: s.owner.as_ref().map(|o| o.epoch),
                ana: self.target.ana_state(s.group),
            })
            .collect();
        ClusterPage {
            node: self.name().to_string(),
            lease_left: self.lease_left(),
            etcd_reachable: !self.obs.etcd_flag.load(Relaxed),
            volumes,
            fences: self.obs.fences.load(Relaxed),
            takeovers: self.obs.takeovers.snapshot(),
            moves: self.obs.moves.snapshot(),
            namespaces: self.qos_namespaces(),
        }
    }

    /// `GET /v1/cluster`: the status, or, when etcd cannot be reached from
    /// here, a 503 that says so and what it means for the volumes owned
    /// here (not the etcd client's transport error).
    pub async fn status_or_unreachable(&self) -> NodeResult<ClusterStatus> {
        let s = self.session();
        let err = match tokio::time::timeout(Duration::from_secs(3), s.nodes()).await {
            Ok(Ok(_)) => return self.status().await,
            Ok(Err(ClusterError::Etcd(e))) => short(&e),
            Ok(Err(_)) => return self.status().await,
            Err(_) => "no answer in 3 s".to_string(),
        };
        Err(unreachable_answer(
            &err,
            self.lease_left(),
            &self.owned_names(),
        ))
    }
}

/// The first line of an etcd client error, cut short (they can carry a
/// whole transport chain).
fn short(e: &str) -> String {
    let line = e.lines().next().unwrap_or("");
    let mut end = line.len().min(120);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    if end < line.len() {
        format!("{}…", &line[..end])
    } else {
        line.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_say_what_happened_with_the_right_kind_and_fields() {
        let e = lease_lost("keep-alive failed", &["v1".into(), "v2".into()]);
        assert_eq!(e.kind(), EventKind::LeaseLost);
        assert_eq!(e.kind().severity(), "critical");
        assert!(e.message_text().contains("(v1, v2) are fenced"));
        let e = fenced("v", "deposed at epoch 3");
        assert_eq!(
            (e.kind().name(), e.kind().severity()),
            ("fenced", "warning")
        );
        assert!(e.message_text().contains("deposed at epoch 3"));
        let e = stepped_down("v", "lease lost");
        assert_eq!(e.kind().name(), "stepped_down");
        assert_eq!(node_left("b").kind().severity(), "warning");
        assert_eq!(node_joined("b").kind().severity(), "info");
        let e = handed_off("v", "b", 2, true, Duration::from_millis(12));
        assert!(e.message_text().contains("handed off to b"));
        let e = etcd_unreachable("connect refused", Duration::from_millis(1500), &[]);
        assert!(e.message_text().contains("1.5 s"), "{}", e.message_text());
        assert_eq!(etcd_back(Duration::ZERO).kind().name(), "etcd_back");
    }

    #[test]
    fn a_takeover_event_carries_each_step_in_order() {
        let t = Instant::now();
        let at = |ms| t + Duration::from_millis(ms);
        let st = Steps {
            first_seen: t,
            claim_started: at(20),
            claimed: at(23),
            assembled: at(80),
            serving: at(81),
        };
        let ev = crate::events::Events::default();
        let e = ev.emit(took_over("v", 3, Some("b"), &st));
        assert_eq!(e.kind, EventKind::TookOver);
        assert_eq!(e.volume.as_deref(), Some("v"));
        let steps: Vec<(&str, f64)> = e.steps.iter().map(|s| (&*s.step, s.ms)).collect();
        assert_eq!(
            steps,
            [
                ("detect", 20.0),
                ("claim", 3.0),
                ("assemble", 57.0),
                ("serve", 1.0),
                ("total", 81.0)
            ]
        );
        assert!(
            e.message.contains("from b at epoch 3, served 81 ms"),
            "{}",
            e.message
        );
        let json = serde_json::to_string(&*e).unwrap();
        assert!(
            json.contains(r#""steps":[{"step":"detect","ms":20.0}"#),
            "{json}"
        );
        let e = ev.emit(moved("v", 4, None, Duration::from_millis(90), &st));
        assert_eq!(e.steps.last().unwrap().step, "move");
    }

    #[test]
    fn the_unreachable_answer_says_what_it_means_for_owned_volumes() {
        let e = unreachable_answer("connection refused", Duration::from_secs(2), &["v".into()]);
        assert_eq!(e.status(), axum::http::StatusCode::SERVICE_UNAVAILABLE);
        let m = e.to_string();
        assert!(
            m.starts_with("this node cannot reach etcd (connection refused)"),
            "{m}"
        );
        assert!(
            m.contains("(v) stop serving I/O when its lease runs out in 2.0 s"),
            "{m}"
        );
        let m = unreachable_answer("x", Duration::ZERO, &["v".into()]).to_string();
        assert!(m.contains("its lease has run out"), "{m}");
        let m = unreachable_answer("x", Duration::ZERO, &[]).to_string();
        assert!(m.contains("no volume is owned here"), "{m}");
        assert_eq!(short("a\nb"), "a");
        assert!(short(&"é".repeat(100)).ends_with('…'));
    }
}

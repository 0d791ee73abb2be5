//! The node's event channel: what an operator watches, as `mdadm --monitor`
//! reports it. Every event gets a sequence number, is kept in a bounded
//! ring (so a client that reconnects can ask for what it missed), is sent
//! to every live subscriber, and goes to the log as one structured line.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;

pub use crate::api_types::{Event, EventKind, StepTime};
use tokio::sync::broadcast;

/// How many past events the node keeps for clients that (re)connect.
pub const RING: usize = 1024;

/// An event before the bus numbers it.
#[derive(Debug, Clone)]
pub struct NewEvent {
    kind: EventKind,
    volume: Option<String>,
    drive: Option<String>,
    host: Option<String>,
    node: Option<String>,
    steps: Vec<StepTime>,
    message: String,
}

impl NewEvent {
    pub fn new(kind: EventKind, message: impl Into<String>) -> Self {
        NewEvent {
            kind,
            volume: None,
            drive: None,
            host: None,
            node: None,
            steps: Vec::new(),
            message: message.into(),
        }
    }
    pub fn volume(mut self, v: impl Into<String>) -> Self {
        self.volume = Some(v.into());
        self
    }
    pub fn drive(mut self, d: impl Into<String>) -> Self {
        self.drive = Some(d.into());
        self
    }
    pub fn host(mut self, h: impl Into<String>) -> Self {
        self.host = Some(h.into());
        self
    }
    pub fn node(mut self, n: impl Into<String>) -> Self {
        self.node = Some(n.into());
        self
    }
    /// A step's duration (kept in the order given).
    pub fn step(mut self, step: &'static str, d: std::time::Duration) -> Self {
        let ms = (d.as_secs_f64() * 1e6).round() / 1e3;
        self.steps.push(StepTime {
            step: step.into(),
            ms,
        });
        self
    }
    pub fn kind(&self) -> EventKind {
        self.kind
    }
    pub fn drive_name(&self) -> Option<&str> {
        self.drive.as_deref()
    }
    pub fn message_text(&self) -> &str {
        &self.message
    }
}

/// The bus. Cheap to emit on: a lock around a ring push and a broadcast.
pub struct Events {
    inner: Mutex<Ring>,
    tx: broadcast::Sender<Arc<Event>>,
    /// Names this run of the node: sequence numbers start again at 1 when
    /// it restarts, so a client's last seen number means something only
    /// with the run it came from.
    boot: String,
}

/// What [`Events::subscribe_after`] finds.
pub struct Subscription {
    /// Kept events after the asked number, oldest first.
    pub past: Vec<Arc<Event>>,
    /// Every event after `past` (or after `last_seq` when `past` is empty).
    pub rx: broadcast::Receiver<Arc<Event>>,
    /// The newest event's number when subscribing (0: none yet).
    pub last_seq: u64,
    /// Events after the asked number that are no longer kept: `from..=to`.
    pub missed: Option<(u64, u64)>,
}

struct Ring {
    next_seq: u64,
    recent: VecDeque<Arc<Event>>,
}

impl Default for Events {
    fn default() -> Self {
        let (tx, _) = broadcast::channel(RING);
        Events {
            inner: Mutex::new(Ring {
                next_seq: 1,
                recent: VecDeque::with_capacity(RING),
            }),
            tx,
            boot: boot_id(),
        }
    }
}

/// This run's name: its start time in milliseconds and the process ID, in hex.
fn boot_id() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    format!("{ms:x}-{:x}", std::process::id())
}

impl Events {
    /// Numbers, keeps, logs and sends one event; returns it.
    pub fn emit(&self, e: NewEvent) -> Arc<Event> {
        let mut ring = self.inner.lock();
        let ev = Arc::new(Event {
            seq: ring.next_seq,
            time: now_rfc3339(),
            kind: e.kind,
            severity: e.kind.severity().into(),
            volume: e.volume,
            drive: e.drive,
            host: e.host,
            node: e.node,
            steps: e.steps,
            message: e.message,
        });
        ring.next_seq += 1;
        if ring.recent.len() == RING {
            ring.recent.pop_front();
        }
        ring.recent.push_back(ev.clone());
        // Sent under the lock, so that a subscriber that took the ring's
        // tail under the same lock sees every later event exactly once.
        let _ = self.tx.send(ev.clone());
        drop(ring);
        log(&ev);
        ev
    }

    /// The kept events after `since` (all kept when None), and a receiver
    /// for every later one, with no gap and no repeat between the two.
    pub fn subscribe(
        &self,
        since: Option<u64>,
    ) -> (Vec<Arc<Event>>, broadcast::Receiver<Arc<Event>>) {
        let ring = self.inner.lock();
        let past = ring
            .recent
            .iter()
            .filter(|e| since.is_none_or(|s| e.seq > s))
            .cloned()
            .collect();
        (past, self.tx.subscribe())
    }

    /// The kept events, oldest first.
    pub fn recent(&self) -> Vec<Arc<Event>> {
        self.subscribe(None).0
    }

    /// This run of the node (see the field).
    pub fn boot(&self) -> &str {
        &self.boot
    }

    /// Like [`Events::subscribe`] with `Some(since)`, and says which events
    /// after `since` were dropped from the ring (a client that comes back
    /// too late, or a subscriber that fell behind). A `since` beyond the
    /// newest event is from an earlier run of the node: every kept event
    /// is new to that client, so it gets them all.
    pub fn subscribe_after(&self, since: u64) -> Subscription {
        let ring = self.inner.lock();
        let last_seq = ring.next_seq - 1;
        let since = if since > last_seq { 0 } else { since };
        let past: Vec<Arc<Event>> = ring
            .recent
            .iter()
            .filter(|e| e.seq > since)
            .cloned()
            .collect();
        let first_kept = past.first().map_or(last_seq + 1, |e| e.seq);
        let missed = (first_kept > since + 1).then(|| (since + 1, first_kept - 1));
        Subscription {
            past,
            rx: self.tx.subscribe(),
            last_seq,
            missed,
        }
    }

    /// The newest event's number (0: none yet).
    pub fn last_seq(&self) -> u64 {
        self.inner.lock().next_seq - 1
    }
}

/// One structured log line per event: its fields as tracing fields, so
/// that `log_format = "json"` writes them as JSON keys.
fn log(e: &Event) {
    let volume = e.volume.as_deref().unwrap_or("");
    let drive = e.drive.as_deref().unwrap_or("");
    let host = e.host.as_deref().unwrap_or("");
    let node = e.node.as_deref().unwrap_or("");
    let steps = e
        .steps
        .iter()
        .map(|s| format!("{}={}", s.step, s.ms))
        .collect::<Vec<_>>()
        .join(",");
    let steps_ms = steps.as_str();
    let kind = e.kind.name();
    match e.severity.as_ref() {
        "critical" => {
            tracing::error!(target: "flashpool::event", seq = e.seq, kind, volume, drive, host, node, steps_ms, "{}", e.message)
        }
        "warning" => {
            tracing::warn!(target: "flashpool::event", seq = e.seq, kind, volume, drive, host, node, steps_ms, "{}", e.message)
        }
        _ => {
            tracing::info!(target: "flashpool::event", seq = e.seq, kind, volume, drive, host, node, steps_ms, "{}", e.message)
        }
    }
}

/// Now as RFC 3339 UTC with milliseconds.
pub fn now_rfc3339() -> String {
    rfc3339(std::time::SystemTime::now())
}

fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_known_dates() {
        let at = |s: u64, ms: u64| {
            rfc3339(std::time::UNIX_EPOCH + std::time::Duration::from_millis(s * 1000 + ms))
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(at(1_795_613_696, 123), "2026-11-25T13:34:56.123Z");
    }

    #[tokio::test]
    async fn subscribe_has_no_gap_and_no_repeat() {
        let ev = Events::default();
        ev.emit(NewEvent::new(EventKind::DriveFailed, "a").drive("d0"));
        let (past, mut rx) = ev.subscribe(None);
        ev.emit(NewEvent::new(EventKind::VolumeDegraded, "b").volume("v"));
        assert_eq!(past.iter().map(|e| e.seq).collect::<Vec<_>>(), [1]);
        assert_eq!(rx.recv().await.unwrap().seq, 2);
        let (past, _) = ev.subscribe(Some(1));
        assert_eq!(past.iter().map(|e| e.seq).collect::<Vec<_>>(), [2]);
    }

    #[test]
    fn subscribe_after_says_what_was_dropped() {
        let ev = Events::default();
        for i in 0..RING + 10 {
            ev.emit(NewEvent::new(EventKind::HostConnected, format!("{i}")));
        }
        let s = ev.subscribe_after(5);
        assert_eq!(s.missed, Some((6, 10)));
        assert_eq!(s.past[0].seq, 11);
        let s = ev.subscribe_after(20);
        assert_eq!(s.missed, None);
        assert_eq!(s.past[0].seq, 21);
        let s = ev.subscribe_after((RING + 10) as u64);
        assert!(s.past.is_empty() && s.missed.is_none());
        assert_eq!(s.last_seq, (RING + 10) as u64);
        // From an earlier run (beyond the newest): all kept, the rest missed.
        let s = ev.subscribe_after(99_999);
        assert_eq!(s.past.len(), RING);
        assert_eq!(s.missed, Some((1, 10)));
        let fresh = Events::default();
        let s = fresh.subscribe_after(7);
        assert!(s.past.is_empty() && s.missed.is_none());
    }

    #[test]
    fn ring_keeps_the_newest() {
        let ev = Events::default();
        for i in 0..RING + 10 {
            ev.emit(NewEvent::new(EventKind::HostConnected, format!("{i}")));
        }
        let r = ev.recent();
        assert_eq!(r.len(), RING);
        assert_eq!(r[0].seq, 11);
        assert_eq!(r.last().unwrap().seq, (RING + 10) as u64);
    }
}

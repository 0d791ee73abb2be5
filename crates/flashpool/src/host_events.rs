//! Hosts connecting and being refused, from the target's Connect handling
//! to the event bus. Refusals are rate-limited per peer address: a client
//! that retries a bad Connect in a loop (or a flood of them) costs a few
//! events per window, not the whole ring.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_target::{ConnectObserver, HostConnected, HostRefused};
use parking_lot::Mutex;

use crate::events::{EventKind, Events, NewEvent};

/// Refusals reported per peer address per [`REFUSED_WINDOW`]; the rest are
/// counted and the count told with the next one reported.
pub const REFUSED_PER_WINDOW: u32 = 3;
pub const REFUSED_WINDOW: Duration = Duration::from_secs(60);
/// Peers tracked at most (the oldest windows are forgotten beyond it).
const MAX_PEERS: usize = 4096;

pub struct HostEvents {
    events: Arc<Events>,
    refused: Mutex<HashMap<String, Window>>,
}

struct Window {
    start: Instant,
    reported: u32,
    suppressed: u64,
}

impl HostEvents {
    pub fn new(events: Arc<Events>) -> Self {
        HostEvents {
            events,
            refused: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a refusal from `peer` is reported now, and how many were
    /// left out before it.
    fn admit(&self, peer: &str, now: Instant) -> Option<u64> {
        let mut m = self.refused.lock();
        if m.len() >= MAX_PEERS && !m.contains_key(peer) {
            m.retain(|_, w| now.duration_since(w.start) < REFUSED_WINDOW);
            if m.len() >= MAX_PEERS {
                // Still full of live windows: a flood from many addresses.
                // Drop them all rather than grow (a few more events).
                m.clear();
            }
        }
        let w = m.entry(peer.to_string()).or_insert(Window {
            start: now,
            reported: 0,
            suppressed: 0,
        });
        if now.duration_since(w.start) >= REFUSED_WINDOW {
            w.start = now;
            w.reported = 0;
        }
        if w.reported < REFUSED_PER_WINDOW {
            w.reported += 1;
            Some(std::mem::take(&mut w.suppressed))
        } else {
            w.suppressed += 1;
            None
        }
    }
}

/// The address without its port: a client's reconnects come from new ports.
fn peer_ip(peer: &str) -> &str {
    match peer.rsplit_once(':') {
        Some((ip, port)) if port.bytes().all(|b| b.is_ascii_digit()) => ip,
        _ => peer,
    }
}

impl ConnectObserver for HostEvents {
    fn host_connected(&self, c: &HostConnected) {
        self.events.emit(
            NewEvent::new(
                EventKind::HostConnected,
                format!(
                    "host {} connected to {} from {} (controller {})",
                    c.hostnqn, c.subnqn, c.peer, c.cntlid
                ),
            )
            .host(&c.hostnqn),
        );
    }

    fn host_refused(&self, r: &HostRefused) {
        let Some(left_out) = self.admit(peer_ip(&r.peer), Instant::now()) else {
            return;
        };
        let more = if left_out > 0 {
            format!(" ({left_out} more refusals from this address were not reported)")
        } else {
            String::new()
        };
        let what = if r.not_allowed {
            "; add it to the subsystem's hosts (or allow_any_host) if it should connect".to_string()
        } else {
            String::new()
        };
        self.events.emit(
            NewEvent::new(
                EventKind::HostRefused,
                format!(
                    "host {} refused on {} from {} (qid {}): {}{what}{more}",
                    crate::echo::Echo(&r.hostnqn),
                    crate::echo::Echo(&r.subnqn),
                    r.peer,
                    r.qid,
                    r.reason
                ),
            )
            .host(&r.hostnqn),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(peer: &str) -> HostRefused {
        HostRefused {
            subnqn: "nqn.s".into(),
            hostnqn: "nqn.bad".into(),
            qid: 0,
            reason: "host not allowed on this subsystem",
            not_allowed: true,
            peer: peer.into(),
        }
    }

    #[test]
    fn a_flood_of_refusals_costs_a_few_events_per_peer() {
        let ev = Arc::new(Events::default());
        let h = HostEvents::new(ev.clone());
        for port in 0..1000 {
            h.host_refused(&refused(&format!("10.0.0.1:{port}")));
        }
        h.host_refused(&refused("10.0.0.2:1"));
        let r = ev.recent();
        assert_eq!(r.len(), REFUSED_PER_WINDOW as usize + 1);
        assert!(r.iter().all(|e| e.kind == EventKind::HostRefused));
        assert_eq!(r[0].host.as_deref(), Some("nqn.bad"));
    }

    #[test]
    fn the_next_window_tells_how_many_were_left_out() {
        let h = HostEvents::new(Arc::default());
        let t0 = Instant::now();
        for _ in 0..REFUSED_PER_WINDOW {
            assert_eq!(h.admit("a", t0), Some(0));
        }
        assert_eq!(h.admit("a", t0), None);
        assert_eq!(h.admit("a", t0), None);
        assert_eq!(h.admit("a", t0 + REFUSED_WINDOW), Some(2));
    }

    #[test]
    fn peer_ip_drops_the_port() {
        assert_eq!(peer_ip("10.1.2.3:4420"), "10.1.2.3");
        assert_eq!(peer_ip("[::1]:5"), "[::1]");
        assert_eq!(peer_ip("weird"), "weird");
    }
}

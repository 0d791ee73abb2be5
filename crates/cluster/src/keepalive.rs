//! The lease's keep-alive task and its fencing watchdog: the keep-alive
//! moves the session's deadline on every acknowledged keep-alive; the
//! watchdog declares the lease lost when the deadline passes unmoved, even
//! if etcd never answers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::Client;
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::LeaseHealth;

fn set_lost(health: &watch::Sender<LeaseHealth>, why: String) {
    health.send_if_modified(|h| match h {
        LeaseHealth::Live { .. } => {
            tracing::error!("etcd lease lost: {why}");
            *h = LeaseHealth::Lost(why);
            true
        }
        LeaseHealth::Lost(_) => false,
    });
}

/// Flips health to Lost at the deadline unless a keep-alive moved it, even
/// if etcd never answers. Then revokes the lease (best effort) so a new
/// session of the same node can join without waiting for the TTL.
pub(crate) async fn watchdog(health: Arc<watch::Sender<LeaseHealth>>, client: Client, lease: i64) {
    let mut rx = health.subscribe();
    loop {
        let deadline = match &*rx.borrow_and_update() {
            LeaseHealth::Live { valid_until } => *valid_until,
            LeaseHealth::Lost(_) => break,
        };
        tokio::select! {
            _ = tokio::time::sleep_until(deadline.into()) => {
                let expired = matches!(&*health.borrow(), LeaseHealth::Live { valid_until } if Instant::now() >= *valid_until);
                if expired {
                    set_lost(&health, "no keep-alive acknowledged before the fencing deadline".into());
                    break;
                }
            }
            r = rx.changed() => if r.is_err() { return },
        }
    }
    let mut c = client;
    let _ = tokio::time::timeout(Duration::from_secs(2), c.lease_revoke(lease)).await;
}

/// The keep-alive task: one keep-alive every `every`, each acknowledged one
/// moving the deadline to send time + granted TTL - `margin`.
pub(crate) struct KeepAlive {
    pub(crate) client: Client,
    pub(crate) lease: i64,
    pub(crate) every: Duration,
    pub(crate) margin: Duration,
    pub(crate) ttl: Duration,
    pub(crate) health: Arc<watch::Sender<LeaseHealth>>,
    /// Sends nothing before this (`Session::pause_keepalive_for_test`).
    pub(crate) pause_until: Arc<Mutex<Option<Instant>>>,
}

impl KeepAlive {
    fn deadline(&self) -> Option<Instant> {
        match &*self.health.borrow() {
            LeaseHealth::Live { valid_until } => Some(*valid_until),
            LeaseHealth::Lost(_) => None,
        }
    }

    /// Records an acknowledged keep-alive sent at `sent` granting `ttl_s`.
    fn acked(&self, sent: Instant, ttl_s: i64) -> bool {
        if ttl_s <= 0 {
            set_lost(
                &self.health,
                format!("etcd says lease {:x} is gone (TTL 0)", self.lease),
            );
            return false;
        }
        let until = sent + Duration::from_secs(ttl_s as u64).saturating_sub(self.margin);
        self.health.send_if_modified(|h| match h {
            LeaseHealth::Live { valid_until } if until > *valid_until => {
                *valid_until = until;
                true
            }
            _ => false,
        });
        true
    }

    pub(crate) async fn run(self) {
        let mut stream: Option<(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream)> =
            None;
        let mut next = Instant::now() + self.every;
        // One attempt waits at most this long before trying another stream
        // (possibly another member).
        let attempt_for = (self.ttl / 3).max(Duration::from_millis(100));
        loop {
            tokio::time::sleep_until(next.into()).await;
            next = (next + self.every).max(Instant::now());
            let Some(deadline) = self.deadline() else {
                return;
            };
            let paused = self.pause_until.lock().is_some_and(|t| Instant::now() < t);
            if paused {
                stream = None;
                continue;
            }
            let give_up = deadline.min(Instant::now() + attempt_for);
            let res = tokio::time::timeout_at(give_up.into(), async {
                loop {
                    let sent = Instant::now();
                    let r = match stream.as_mut() {
                        Some((keeper, s)) => match keeper.keep_alive().await {
                            Ok(()) => s.message().await.and_then(|m| {
                                m.map(|m| m.ttl()).ok_or_else(|| {
                                    etcd_client::Error::LeaseKeepAliveError("stream ended".into())
                                })
                            }),
                            Err(e) => Err(e),
                        },
                        None => {
                            let mut lc = self.client.lease_client();
                            match lc.keep_alive(self.lease).await {
                                Ok(pair) => {
                                    // keep_alive() sent one request and got a live answer
                                    stream = Some(pair);
                                    Ok(self.ttl.as_secs() as i64)
                                }
                                Err(etcd_client::Error::LeaseKeepAliveError(m))
                                    if m.contains("not found") =>
                                {
                                    Ok(0)
                                }
                                Err(e) => Err(e),
                            }
                        }
                    };
                    let r = match r {
                        Err(etcd_client::Error::GRpcStatus(s))
                            if s.code() == tonic::Code::NotFound =>
                        {
                            Ok(0)
                        }
                        r => r,
                    };
                    match r {
                        Ok(ttl) => return (sent, ttl),
                        Err(e) => {
                            tracing::debug!(lease = self.lease, "keep-alive: {e}; reopening");
                            stream = None;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            })
            .await;
            match res {
                Ok((sent, ttl)) => {
                    if !self.acked(sent, ttl) {
                        return;
                    }
                }
                Err(_) => {
                    tracing::debug!(
                        lease = self.lease,
                        "keep-alive unanswered after {attempt_for:?}; new stream"
                    );
                    stream = None;
                    next = Instant::now();
                }
            }
        }
    }
}

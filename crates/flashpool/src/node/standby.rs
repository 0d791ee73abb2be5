//! Standby member links: connections a cluster node keeps open to the
//! members of volumes it would take over, before it has to.
//!
//! Opening a remote drive is about a dozen round trips (TCP, ICReq, the
//! admin queue's Connect and Identify, every I/O queue's Connect): 40-50% of
//! a takeover's assembly when a survivor takes dozens of volumes at once.
//! The agent names the drives this node is next in line for (the rendezvous
//! successor of each volume's owner, `agent/runner.rs`); the node keeps a
//! link to each, unregistered (it holds no reservation and writes nothing),
//! and an assembly takes the link instead of connecting. A planned move
//! parks the handed-over members here, for a move back.
//!
//! A link no longer wanted is closed after [`GRACE`], so that owners
//! flapping between nodes do not churn connections; one that went down or
//! changed identity is dropped at once (the assembly connects afresh).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use nvmf_host::remote::{LinkState, RemoteDevice};

use super::Node;

/// How long a link nobody wants stays open.
pub(crate) const GRACE: Duration = Duration::from_secs(10);

/// How many links a refresh opens at once (each is a few round trips of
/// CPU on both ends; a takeover's own connects must not queue behind them).
const OPEN_AT_ONCE: usize = 8;

/// How long a drive that could not be reached waits for the next try (a
/// dead enclosure is not dialled on every pass).
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// The longest a standby link may take to answer before a takeover uses it.
const PROBE_MAX: Duration = Duration::from_millis(500);

/// The longest a refresh waits for this node's takeovers to end.
const FOREGROUND_WAIT: Duration = Duration::from_secs(5);

/// The node's standby links, by drive name (as an assembly names it).
#[derive(Default)]
pub struct Standby {
    pub(super) links: HashMap<String, Arc<RemoteDevice>>,
    /// Being opened by a refresh now.
    opening: HashSet<String>,
    /// Links not wanted by the last refresh, and since when.
    unwanted_since: HashMap<String, Instant>,
    /// Drives that could not be reached: not tried again before then.
    retry_after: HashMap<String, Instant>,
    /// A refresh runs (one at a time).
    refreshing: bool,
    /// The last refresh wanted more links than `remote.standby_links`.
    capped: bool,
}

/// At most `cap` of `wanted`: the drives linked already first (a cap that
/// is reached does not churn links), then the rest by name.
pub(crate) fn within_cap(
    wanted: BTreeSet<String>,
    cap: usize,
    linked: impl Fn(&str) -> bool,
) -> BTreeSet<String> {
    if wanted.len() <= cap {
        return wanted;
    }
    let (have, rest): (Vec<String>, Vec<String>) = wanted.into_iter().partition(|n| linked(n));
    have.into_iter().chain(rest).take(cap).collect()
}

impl Node {
    /// Keeps standby links to exactly the drives in `wanted` (names as an
    /// assembly gives them, `peer:drive` or a URL): opens the missing ones
    /// (a few at a time), closes the ones not wanted for [`GRACE`], drops
    /// the broken ones. Returns at once if a refresh runs already.
    pub async fn refresh_standby(self: &Arc<Self>, wanted: BTreeSet<String>) {
        let now = Instant::now();
        let cap = self.cluster().remote.standby_links;
        let (to_open, to_close) = {
            let mut sb = self.standby.lock();
            if sb.refreshing {
                return;
            }
            let asked = wanted.len();
            let wanted = within_cap(wanted, cap, |n| sb.links.contains_key(n));
            if (asked > cap) != sb.capped {
                sb.capped = asked > cap;
                if sb.capped {
                    tracing::info!(
                        "standby links: {asked} drives wanted, keeping {cap} \
                         (remote.standby_links); takeovers connect to the others"
                    );
                }
            }
            let mut close = Vec::new();
            let names: Vec<String> = sb.links.keys().cloned().collect();
            for n in names {
                let broken = !matches!(
                    sb.links[&n].link_state(),
                    LinkState::Connected | LinkState::Reconnecting { .. }
                );
                if wanted.contains(&n) && !broken {
                    sb.unwanted_since.remove(&n);
                    continue;
                }
                let since = *sb.unwanted_since.entry(n.clone()).or_insert(now);
                if broken || now.duration_since(since) >= GRACE {
                    sb.unwanted_since.remove(&n);
                    close.extend(sb.links.remove(&n).map(|d| (n, d)));
                }
            }
            sb.retry_after.retain(|n, t| *t > now && wanted.contains(n));
            let open: Vec<String> = wanted
                .into_iter()
                .filter(|n| {
                    !sb.links.contains_key(n)
                        && !sb.opening.contains(n)
                        && !sb.retry_after.contains_key(n)
                })
                .collect();
            sb.opening.extend(open.iter().cloned());
            sb.refreshing = !open.is_empty();
            (open, close)
        };
        for (n, d) in to_close {
            tracing::debug!("drive {n}: standby link closed");
            use blockdev::BlockDevice;
            let _ = d.shutdown();
        }
        if to_open.is_empty() {
            return;
        }
        // Not while this node takes volumes over: those connects come first.
        self.foreground.wait_idle(FOREGROUND_WAIT).await;
        futures_util::stream::iter(to_open)
            .for_each_concurrent(OPEN_AT_ONCE, |n| async move {
                let dev = self.open_standby(&n).await;
                let mut sb = self.standby.lock();
                sb.opening.remove(&n);
                match dev {
                    Some(d) => {
                        sb.links.insert(n, d);
                    }
                    None => {
                        sb.retry_after.insert(n, Instant::now() + RETRY_AFTER);
                    }
                }
            })
            .await;
        self.standby.lock().refreshing = false;
    }

    /// One standby link, or none (logged) when the drive is not reachable
    /// now: the takeover connects it then.
    async fn open_standby(&self, name: &str) -> Option<Arc<RemoteDevice>> {
        let url = match self.cluster().resolve(name) {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!("standby link: {e}");
                return None;
            }
        };
        match self.dial(&url).await {
            Ok(d) => {
                tracing::debug!("drive {name}: standby link open");
                Some(d)
            }
            Err(e) => {
                tracing::debug!("drive {name} ({url}): no standby link: {e}");
                None
            }
        }
    }

    /// The standby link to `name` at `url`, taken out of the standby set,
    /// if one is connected and answers an admin command within
    /// [`PROBE_MAX`]: a link whose enclosure just went silent still reads
    /// connected until its keep-alive expires, and an assembly on it would
    /// wait for the I/O timeout, not for the takeover's bounded wait. A
    /// link that fails is closed; the caller connects afresh.
    pub(crate) async fn take_live_standby(
        &self,
        name: &str,
        url: &str,
    ) -> Option<Arc<RemoteDevice>> {
        let d = self.take_standby(name, url)?;
        match tokio::time::timeout(PROBE_MAX, d.ana_state()).await {
            Ok(Ok(_)) => Some(d),
            res => {
                let why = match res {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer in {} ms", PROBE_MAX.as_millis()),
                };
                tracing::info!("drive {name}: standby link not used ({why}); connecting afresh");
                use blockdev::BlockDevice;
                let _ = d.shutdown();
                None
            }
        }
    }

    /// [`Node::take_live_standby`] without the probe.
    fn take_standby(&self, name: &str, url: &str) -> Option<Arc<RemoteDevice>> {
        let mut sb = self.standby.lock();
        sb.unwanted_since.remove(name);
        let d = sb.links.remove(name)?;
        let same = nvmf_host::remote::RemoteUrl::parse(url).is_ok_and(|u| &u == d.url());
        if same && d.link_state() == LinkState::Connected {
            return Some(d);
        }
        drop(sb);
        use blockdev::BlockDevice;
        let _ = d.shutdown();
        None
    }

    /// Keeps `dev`, a member this node let go of cleanly (no reservation
    /// left), as a standby link: the next refresh closes it if unwanted.
    pub(crate) fn park_standby(&self, name: &str, dev: Arc<RemoteDevice>) {
        let old = {
            let mut sb = self.standby.lock();
            sb.unwanted_since.remove(name);
            sb.links.insert(name.to_string(), dev)
        };
        if let Some(o) = old {
            use blockdev::BlockDevice;
            let _ = o.shutdown();
        }
    }

    /// Closes every standby link (the node stops).
    pub(crate) fn close_standby(&self) {
        let links: Vec<Arc<RemoteDevice>> =
            self.standby.lock().links.drain().map(|(_, d)| d).collect();
        for d in links {
            use blockdev::BlockDevice;
            let _ = d.shutdown();
        }
    }

    /// The drive names with a standby link now.
    #[cfg(test)]
    pub fn standby_links(&self) -> BTreeSet<String> {
        self.standby.lock().links.keys().cloned().collect()
    }
}

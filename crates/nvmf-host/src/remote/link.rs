//! One association at a time to the remote namespace, and the task that
//! watches it and reconnects.
//!
//! The I/O path reads the current [`Session`] (one read lock) and, when a
//! command fails on the transport, reports the session broken; the link
//! task then closes every queue of it (commands still in flight fail and
//! are retried by their callers), publishes `Reconnecting`, and connects
//! again with back-off. Past `fail_after` it publishes `Down` (waiters and
//! new I/O fail at once) and keeps trying. A connect that finds another
//! namespace publishes `IdentityChanged` and stops for good.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use blockdev::BlockError;
use nvme_wire::identify::nidt;
use parking_lot::{Mutex, RwLock};
use tokio::sync::{Notify, watch};

use super::{LinkState, NsIdentity, RemoteOptions, RemoteUrl, reactors};
use crate::controller::Controller;
use crate::error::HostError;
use crate::identify::NamespaceInfo;
use crate::io::{IoQueue, MAX_NLB};
use crate::options::HostOptions;

/// How often the link task looks at the health of its connections (a
/// failed keep-alive or command closes a connection; this notices it).
const HEALTH_EVERY: Duration = Duration::from_millis(100);

/// One association: the controller (admin queue, keep-alive) and its I/O queues.
pub(crate) struct Session {
    /// Counts connects, from 1.
    pub generation: u64,
    pub ctrl: Controller,
    /// The shared queues: any thread may use them.
    pub queues: Vec<Arc<IoQueue>>,
    /// One queue per reactor (by reactor index), on that reactor's runtime,
    /// for the controller's queue ids after the shared ones; empty until its
    /// reactor sends a steady load and the link binds it ([`Link::bind_reactors`]).
    pub local: Vec<ReactorQueue>,
    pub ns: NamespaceInfo,
    pub identity: NsIdentity,
    /// Most blocks one Read/Write moves (MDTS and the NLB field).
    pub max_blocks: u32,
}

/// A reactor sends this many requests on the shared queues before its own
/// queue is opened: a steady load gets one within its first milliseconds,
/// while the few checks a takeover or a standby link makes open none. (Opened
/// at the first request, the 96 connections of 48 volumes taken over at once
/// delayed the last of them by 50 ms on the 2-vCPU VM.)
const BIND_AFTER: u32 = 256;

/// A reactor's queue of a session: connected once its reactor sends the
/// drive a steady load, tried once.
#[derive(Default)]
pub(crate) struct ReactorQueue {
    queue: OnceLock<Arc<IoQueue>>,
    /// Requests its reactor sent on the shared queues (only it counts, up
    /// to [`BIND_AFTER`]: then the link connects the queue).
    asked: AtomicU32,
    tried: AtomicBool,
    /// Requests sent on it (only its reactor counts: no contention).
    used: AtomicU64,
}

thread_local! {
    static NEXT_QUEUE: Cell<usize> = const { Cell::new(0) };
}

impl Session {
    /// The queue for this thread: its reactor's own, if it has one;
    /// otherwise the shared queues, round robin per thread, no shared counter.
    pub fn pick(&self) -> &Arc<IoQueue> {
        if let Some(l) = reactors::current().and_then(|r| self.local.get(r)) {
            if let Some(q) = l.queue.get() {
                l.used
                    .store(l.used.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                return q;
            }
            // Only this reactor writes it: no read-modify-write needed.
            let n = l.asked.load(Ordering::Relaxed);
            if n < BIND_AFTER {
                l.asked.store(n + 1, Ordering::Relaxed);
            }
        }
        let i = NEXT_QUEUE.with(|c| {
            let i = c.get();
            c.set(i.wrapping_add(1));
            i
        });
        &self.queues[i % self.queues.len()]
    }

    /// Why this session can no longer be used, if it cannot.
    fn broken(&self) -> Option<HostError> {
        self.ctrl
            .error()
            .or_else(|| self.all_queues().find_map(|q| q.error()))
    }

    fn all_queues(&self) -> impl Iterator<Item = &Arc<IoQueue>> {
        self.queues
            .iter()
            .chain(self.local.iter().filter_map(|l| l.queue.get()))
    }

    /// Reactor queues in use, and the requests sent on them.
    pub fn bound(&self) -> (usize, u64) {
        self.local
            .iter()
            .filter(|l| l.queue.get().is_some())
            .fold((0, 0), |(n, u), l| {
                (n + 1, u + l.used.load(Ordering::Relaxed))
            })
    }

    /// Closes every connection; commands in flight fail (and are retried).
    fn close(&self) {
        for q in self.all_queues() {
            q.close();
        }
    }
}

enum ConnectError {
    Host(HostError),
    Identity(String),
}

pub(crate) struct Link {
    pub url: RemoteUrl,
    pub opts: RemoteOptions,
    state: watch::Sender<LinkState>,
    session: RwLock<Option<Arc<Session>>>,
    /// The identity every connect must find (the first one's, or the expected one).
    identity: Mutex<Option<NsIdentity>>,
    gens: AtomicU64,
    /// Generation the I/O path found broken.
    broken_gen: AtomicU64,
    kick: Notify,
    closed: AtomicBool,
}

impl Link {
    /// Connects once (on the link's runtime) and starts the link task.
    pub async fn start(url: RemoteUrl, opts: RemoteOptions) -> Result<Arc<Link>, BlockError> {
        let link = Arc::new(Link {
            state: watch::Sender::new(LinkState::Connected),
            session: RwLock::new(None),
            identity: Mutex::new(opts.expect.clone()),
            gens: AtomicU64::new(0),
            broken_gen: AtomicU64::new(0),
            kick: Notify::new(),
            closed: AtomicBool::new(false),
            url,
            opts,
        });
        let s = match link.connect().await {
            Ok(s) => s,
            Err(ConnectError::Identity(why)) => return Err(BlockError::IdentityChanged(why)),
            Err(ConnectError::Host(e)) => {
                return Err(BlockError::Unreachable {
                    what: format!("remote {}", link.url),
                    after_ms: 0,
                    why: e.to_string(),
                });
            }
        };
        *link.session.write() = Some(Arc::new(s));
        tokio::spawn(run(Arc::downgrade(&link)));
        Ok(link)
    }

    pub fn state(&self) -> LinkState {
        self.state.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<LinkState> {
        self.state.subscribe()
    }

    /// The current session, if connected.
    pub fn current(&self) -> Option<Arc<Session>> {
        self.session.read().clone()
    }

    /// A session of generation `min_gen` or later: the current one, or the
    /// next one after a reconnect. Fails at once while Down.
    pub async fn session(&self, min_gen: u64) -> Result<Arc<Session>, BlockError> {
        let mut rx = self.state.subscribe();
        loop {
            if let Some(s) = self.current().filter(|s| s.generation >= min_gen) {
                return Ok(s);
            }
            if let Some(e) = self.state_error(&rx.borrow_and_update()) {
                return Err(e);
            }
            if rx.changed().await.is_err() {
                return Err(self.closed_error());
            }
        }
    }

    /// The error I/O gets in `state`, if it must not wait.
    pub fn state_error(&self, state: &LinkState) -> Option<BlockError> {
        match state {
            LinkState::Connected | LinkState::Reconnecting { .. } => None,
            LinkState::Down { since, why } => Some(BlockError::Unreachable {
                what: format!("remote {}", self.url),
                after_ms: since.elapsed().as_millis() as u64,
                why: why.clone(),
            }),
            LinkState::IdentityChanged { why } => Some(BlockError::IdentityChanged(why.clone())),
            LinkState::Closed => Some(self.closed_error()),
        }
    }

    fn closed_error(&self) -> BlockError {
        BlockError::Io(std::io::Error::other(format!(
            "remote {} is shut down",
            self.url
        )))
    }

    /// The I/O path saw a transport error on session `generation`.
    pub fn report_broken(&self, generation: u64, e: &HostError) {
        if self.broken_gen.fetch_max(generation, Ordering::AcqRel) < generation {
            tracing::warn!("remote {}: connection {generation} failed: {e}", self.url);
        }
        self.kick.notify_one();
    }

    pub fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(s) = self.session.write().take() {
            s.close();
        }
        self.state.send_replace(LinkState::Closed);
        self.kick.notify_one();
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Asks for the shared queues and one per reactor: the registered ones,
    /// or as many as this machine has CPUs when none is registered yet (a
    /// node opens its configured remote drives before its reactors start).
    /// Only the shared ones are connected here.
    fn host_options(&self) -> HostOptions {
        let per_reactor = match reactors::reactor_count() {
            _ if !self.opts.reactor_queues => 0,
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        HostOptions {
            nr_io_queues: self
                .opts
                .io_queues
                .max(1)
                .saturating_add(per_reactor.min(usize::from(u16::MAX)) as u16),
            kato_ms: self.opts.kato.as_millis().min(u128::from(u32::MAX)) as u32,
            lazy_io_queues: true,
            ..self.opts.host.clone()
        }
    }

    /// Starts connecting a queue, on that reactor's runtime, for each
    /// reactor that sent this session a steady load and that it has room
    /// for. Each connect is a task of its own, bounded by the connect
    /// timeout: the link's health checks never wait for a reactor, which may
    /// be busy or blocked (a synchronous record store), and a stalled connect
    /// delays no reconnect. A queue that fails to connect is not tried again
    /// in this session: its reactor's I/O keeps to the shared queues.
    pub(crate) fn bind_reactors(&self, s: &Arc<Session>) {
        let due = |l: &ReactorQueue| {
            l.asked.load(Ordering::Relaxed) >= BIND_AFTER && !l.tried.load(Ordering::Relaxed)
        };
        if !s.local.iter().any(due) {
            return;
        }
        let shared = s.queues.len() as u16;
        let limit = self.opts.host.timeout * 2;
        for (i, rt) in reactors::reactors()
            .into_iter()
            .enumerate()
            .take(s.local.len())
        {
            let l = &s.local[i];
            if !due(l) || l.tried.swap(true, Ordering::AcqRel) {
                continue;
            }
            let qid = shared + 1 + i as u16;
            let (s, url) = (s.clone(), self.url.to_string());
            tokio::spawn(async move {
                let r = tokio::time::timeout(limit, s.ctrl.add_io_queue_on(qid, Some(&rt))).await;
                match r {
                    Ok(Ok(q)) => {
                        let _ = s.local[i].queue.set(q);
                    }
                    Ok(Err(e)) => tracing::info!(
                        "remote {url}: no queue on reactor {i} (its I/O uses the shared queues): {e}"
                    ),
                    Err(_) => tracing::info!(
                        "remote {url}: no queue on reactor {i} after {limit:?} (its I/O uses \
                         the shared queues)"
                    ),
                }
            });
        }
    }

    /// One association: connect, identify, check the identity.
    async fn connect(&self) -> Result<Session, ConnectError> {
        let host_err = ConnectError::Host;
        let addr = tokio::net::lookup_host((self.url.host.as_str(), self.url.port))
            .await
            .map_err(|e| {
                host_err(HostError::Invalid(format!(
                    "cannot resolve {}: {e}",
                    self.url.host
                )))
            })?
            .next()
            .ok_or_else(|| {
                host_err(HostError::Invalid(format!(
                    "{} has no address",
                    self.url.host
                )))
            })?;
        let t0 = Instant::now();
        let mut o = self.host_options();
        // The I/O queues take the command timeout: a late command kills its connection.
        let connect_timeout = o.timeout;
        o.timeout = self.opts.io_timeout;
        let ctrl = tokio::time::timeout(
            connect_timeout * 4,
            Controller::connect(addr, &self.url.nqn, o),
        )
        .await
        .map_err(|_| {
            host_err(HostError::Timeout {
                addr,
                what: "controller bring-up".into(),
                after: connect_timeout * 4,
            })
        })?
        .map_err(host_err)?;
        let t_ctrl = t0.elapsed();
        let nsid = self.url.nsid;
        // Both at once (the admin queue takes several commands).
        let (ns, descs) = tokio::join!(ctrl.identify_namespace(nsid), ctrl.ns_descriptors(nsid));
        let (ns, descs) = (ns.map_err(host_err)?, descs.map_err(host_err)?);
        tracing::debug!(
            "remote {}: connect steps: controller {t_ctrl:?}, identify {:?}",
            self.url,
            t0.elapsed() - t_ctrl
        );
        let mut id = NsIdentity {
            subnqn: ctrl.info().subnqn.clone(),
            nguid: ns.nguid,
            eui64: ns.eui64,
            uuid: None,
        };
        for (t, v) in descs {
            match (t, v.len()) {
                (nidt::UUID, 16) => id.uuid = v.try_into().ok(),
                (nidt::NGUID, 16) if id.nguid == [0; 16] => {
                    id.nguid = v.try_into().expect("16 bytes")
                }
                (nidt::EUI64, 8) if id.eui64 == [0; 8] => id.eui64 = v.try_into().expect("8 bytes"),
                _ => {}
            }
        }
        {
            let mut want = self.identity.lock();
            match &*want {
                Some(w) if *w != id => {
                    return Err(ConnectError::Identity(format!(
                        "remote {}: the namespace behind this address changed identity: \
                         expected {w}, got {id}; it is not the drive that was attached, \
                         so no I/O goes to it (re-add the member to accept the new drive)",
                        self.url
                    )));
                }
                Some(_) => {}
                None => *want = Some(id.clone()),
            }
        }
        // All at once: each is its own TCP connection, ICReq and Connect.
        let shared = ctrl.granted_io_queues().min(self.opts.io_queues.max(1));
        let queues = futures_util::future::join_all((1..=shared).map(|q| ctrl.add_io_queue(q)))
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(host_err)?;
        if queues.is_empty() {
            return Err(host_err(HostError::Invalid(format!(
                "{} granted no I/O queue",
                self.url
            ))));
        }
        let mdts_blocks = ctrl
            .info()
            .max_transfer()
            .map_or(u64::from(MAX_NLB), |b| b / u64::from(ns.lba_size));
        let generation = self.gens.fetch_add(1, Ordering::AcqRel) + 1;
        let local = (shared..ctrl.granted_io_queues())
            .map(|_| ReactorQueue::default())
            .collect();
        Ok(Session {
            generation,
            max_blocks: mdts_blocks.clamp(1, u64::from(MAX_NLB)) as u32,
            ctrl,
            queues,
            local,
            ns,
            identity: id,
        })
    }
}

/// The link task: watch the session, reconnect when it breaks.
async fn run(weak: Weak<Link>) {
    loop {
        // Watch the current session until it breaks.
        let why = loop {
            let Some(link) = weak.upgrade() else { return };
            if link.is_closed() {
                return;
            }
            let Some(s) = link.current() else { break None };
            if link.broken_gen.load(Ordering::Acquire) >= s.generation {
                break s.broken().or(Some(HostError::Invalid(
                    "a command failed on the transport".into(),
                )));
            }
            if let Some(e) = s.broken() {
                break Some(e);
            }
            link.bind_reactors(&s);
            let kicked = link.kick.notified();
            drop(s);
            tokio::select! {
                _ = kicked => {}
                _ = tokio::time::sleep(HEALTH_EVERY) => {}
            }
        };
        let Some(link) = weak.upgrade() else { return };
        let since = Instant::now();
        if let Some(s) = link.session.write().take() {
            s.close();
        }
        if link.is_closed() {
            return;
        }
        let mut last = why.map_or_else(|| "connection lost".to_string(), |e| e.to_string());
        tracing::warn!("remote {}: reconnecting: {last}", link.url);
        link.state.send_replace(LinkState::Reconnecting { since });
        let mut down = false;
        let mut backoff = link.opts.reconnect_min;
        drop(link);
        loop {
            let Some(link) = weak.upgrade() else { return };
            if link.is_closed() {
                return;
            }
            let deadline = tokio::time::Instant::from_std(since + link.opts.fail_after);
            let r = {
                let attempt = link.connect();
                tokio::pin!(attempt);
                loop {
                    tokio::select! {
                        r = &mut attempt => break r,
                        _ = tokio::time::sleep_until(deadline), if !down => {
                            down = true;
                            link.mark_down(since, &last);
                        }
                    }
                }
            };
            match r {
                Ok(s) => {
                    let generation = s.generation;
                    *link.session.write() = Some(Arc::new(s));
                    if link.is_closed() {
                        link.close_session();
                        return;
                    }
                    tracing::info!(
                        "remote {}: connected again (connection {generation}) after {:?}",
                        link.url,
                        since.elapsed()
                    );
                    link.state.send_replace(LinkState::Connected);
                    break;
                }
                Err(ConnectError::Identity(why)) => {
                    tracing::error!("{why}");
                    link.state
                        .send_replace(LinkState::IdentityChanged { why: why.clone() });
                    return;
                }
                Err(ConnectError::Host(e)) => {
                    last = e.to_string();
                    tracing::debug!("remote {}: reconnect failed: {last}", link.url);
                }
            }
            let pause = backoff;
            backoff = (backoff * 2).min(link.opts.reconnect_max);
            drop(link);
            let wake = tokio::time::Instant::now() + pause;
            if !down && wake > deadline {
                tokio::time::sleep_until(deadline).await;
                down = true;
                let Some(link) = weak.upgrade() else { return };
                link.mark_down(since, &last);
            }
            tokio::time::sleep_until(wake).await;
        }
    }
}

impl Link {
    fn mark_down(&self, since: Instant, why: &str) {
        if self.is_closed() {
            return;
        }
        tracing::warn!(
            "remote {}: unreachable for {:?}, failing its I/O until it is back: {why}",
            self.url,
            since.elapsed()
        );
        self.state.send_replace(LinkState::Down {
            since,
            why: why.to_string(),
        });
    }

    fn close_session(&self) {
        if let Some(s) = self.session.write().take() {
            s.close();
        }
    }
}

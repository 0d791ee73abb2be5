//! Cluster mode: the node as one of many that share volumes through etcd.
//!
//! Every node serves every cluster volume under the same subsystem NQN,
//! NSID and NGUID, each volume in its own ANA group. Exactly one node owns
//! a volume (an etcd key under its lease, with an epoch that only grows);
//! it reports the group Optimized and runs the volume, the others report it
//! Inaccessible. When the owner's key goes (its process died, its lease ran
//! out, or it handed the volume over) the live nodes compete by transaction
//! and the winner takes over: it preempts the old owner's reservations on
//! the members, assembles, and turns its group Optimized.
//!
//! The owner stops writing on its own before anyone can take over: its
//! switch devices refuse I/O past the lease deadline (monotonic clock), and
//! a member that answers Reservation Conflict fences the volume.
//!
//! `mod.rs` holds the state and the loop; `decide.rs` what each volume
//! needs, as a pure function of what etcd and this node show; `runner.rs`
//! which volumes a pass settles and the per-volume tasks that settle them,
//! concurrently; `own.rs` gathers one volume's views and carries its
//! actions out (taking over, letting go); `peers.rs` the other nodes,
//! `lifecycle.rs` the create and delete of cluster volumes, `cluster_ops.rs`
//! the other calls from the API (move, drain, status); `pools.rs` and `pool_snaps.rs` the cluster
//! pools' thin volumes, snapshots and clones; `views.rs` what the volume
//! list shows of them; `observe.rs` the events and metrics it tells;
//! `qos.rs` the volumes' QoS limits, kept in etcd and applied by every node.

mod cluster_ops;
mod decide;
#[cfg(test)]
mod delete_tests;
mod extents;
#[cfg(test)]
mod extents_tests;
mod lifecycle;
mod observe;
mod own;
mod peers;
mod pool_exports;
#[cfg(test)]
mod pool_ops_tests;
mod pool_snaps;
mod pools;
#[cfg(test)]
mod pools_tests;
mod qos;
#[cfg(test)]
mod qos_tests;
mod record;
#[cfg(test)]
mod record_tests;
mod replace;
#[cfg(test)]
mod replace_tests;
#[cfg(test)]
mod resv_tests;
mod runner;
mod switch;
#[cfg(test)]
mod tests;
mod thin_resv;
mod views;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use cluster::{
    ClusterConfig, ClusterError, LeaseHealth, LivenessListener, NodeRecord, Portal, Session,
    VolumeSpec,
};
use nvmf_target::{AnaState, Subsystem, Target};
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::config::Membership;
use crate::node::{Node, NodeError, NodeResult};

pub use pool_snaps::node_pairs;
pub use switch::{LeaseClock, SwitchDevice};

/// ANA transition time reported to hosts: the longest a group stays in
/// Change during a planned move before it is Optimized or Inaccessible.
pub const ANATT_SECS: u8 = 5;

/// An owned volume's ANA group and every switch it serves through (its
/// own, and a pool's thin volumes').
struct OwnedGroup {
    group: u32,
    switches: Vec<Arc<SwitchDevice>>,
    /// Some: the group is held Inaccessible although the volume is owned
    /// here: a pool whose thin volumes wait for their host reservations
    /// (their etcd read failed at the takeover). Hosts wait rather than
    /// write past a reservation; a pass turns it Optimized once they are
    /// loaded, and sets this flag of the volume's state records then
    /// (`record.rs`: a planned move waits for it).
    held: Option<own::Held>,
}

impl OwnedGroup {
    fn new(group: u32, switches: Vec<Arc<SwitchDevice>>) -> OwnedGroup {
        OwnedGroup {
            group,
            switches,
            held: None,
        }
    }
}

/// One cluster volume as this node serves it.
struct Served {
    spec: VolumeSpec,
    switch: Arc<SwitchDevice>,
    /// The epoch this node owns it at, when it does.
    epoch: Option<u64>,
    /// A cluster pool's thin volumes, each a namespace of its own in the
    /// pool's ANA group (`pools.rs`); empty for any other volume.
    thins: BTreeMap<String, pools::ThinServed>,
}

impl Served {
    fn new(spec: VolumeSpec, switch: Arc<SwitchDevice>, epoch: Option<u64>) -> Served {
        Served {
            spec,
            switch,
            epoch,
            thins: BTreeMap::new(),
        }
    }

    /// Every switch of the volume: its own and its thin volumes'.
    fn switches(&self) -> Vec<Arc<SwitchDevice>> {
        std::iter::once(self.switch.clone())
            .chain(self.thins.values().map(|t| t.switch.clone()))
            .collect()
    }
}

pub struct Agent {
    node: Arc<Node>,
    target: Arc<Target>,
    m: Membership,
    record: NodeRecord,
    session: Mutex<Session>,
    clock: Arc<LeaseClock>,
    /// The volumes served here; each volume's task takes its own out while
    /// it acts (see `runner.rs`).
    served: runner::ServedMap,
    /// What the next pass settles (marked by watch events, ticks, kicks).
    dirty: Mutex<runner::Dirty>,
    /// Volumes whose task runs now; `true`: settle it again after.
    acting: Mutex<HashMap<String, bool>>,
    /// When each volume's task was first started and not yet done: a
    /// takeover's time counts from there (it may wait for a slot).
    queued: Mutex<HashMap<String, Instant>>,
    /// Bounds how many volumes are settled at once.
    permits: Mutex<Arc<tokio::sync::Semaphore>>,
    /// Tests: a volume's takeover waits this long first (a slow member).
    #[cfg(test)]
    stall: Mutex<HashMap<String, Duration>>,
    /// Tests: how many volume settles ran.
    #[cfg(test)]
    settles: std::sync::atomic::AtomicUsize,
    /// Tests: how many of them read their volume's keys (not their pass's read).
    #[cfg(test)]
    volume_reads: std::sync::atomic::AtomicUsize,
    /// Tests: how many reads of a pool's thin volumes' reservations fail.
    #[cfg(test)]
    fail_resv_reads: std::sync::atomic::AtomicUsize,
    /// The owned volumes' groups and switches, for the fence path, which
    /// must not wait for the loop.
    owned: Mutex<BTreeMap<String, OwnedGroup>>,
    /// Peers whose liveness port is watched, by (name, lease).
    watching: Mutex<HashSet<(String, i64)>>,
    /// What the decisions remember of each volume between passes (claim
    /// delays, handoffs seen, back-off), by volume; see [`decide::Memory`].
    memory: Mutex<HashMap<String, decide::Memory>>,
    kick: Notify,
    lost: Notify,
    /// Set at shutdown: a lost lease is then not followed by a new join.
    leaving: std::sync::atomic::AtomicBool,
    rejoined: Notify,
    _liveness: LivenessListener,
    /// How to call other nodes' APIs (set once this node's API is up).
    peer_api: Mutex<Option<Arc<crate::client::PeerApi>>>,
    /// What the events and metrics need (see `observe.rs`).
    obs: observe::Observed,
    /// The volumes' QoS limits and the namespaces they apply to (`qos.rs`).
    qos: Mutex<qos::QosTable>,
}

impl Agent {
    /// Calls to other nodes' APIs go with this node's token (and TLS trust).
    pub fn set_peer_api(&self, p: Arc<crate::client::PeerApi>) {
        *self.peer_api.lock() = Some(p);
    }

    /// Joins the cluster (waiting for etcd as long as it takes), sets the
    /// target's controller-ID range and ANA transition time. Call before
    /// the target listens.
    pub async fn join(
        node: Arc<Node>,
        target: Arc<Target>,
        m: Membership,
        api: Option<String>,
    ) -> anyhow::Result<Arc<Agent>> {
        let c = node.cluster().clone();
        let portals = |v: &[std::net::SocketAddr]| {
            v.iter()
                .map(|a| Portal {
                    traddr: a.ip().to_string(),
                    trsvcid: a.port().to_string(),
                })
                .collect::<Vec<_>>()
        };
        let record = NodeRecord {
            name: c.node_name.clone(),
            portals: portals(&m.io),
            discovery: portals(&m.discovery),
            api,
            liveness: Some(m.liveness.to_string()),
            host_nqn: c.host_nqn.clone(),
            host_id: hex(&c.host_id),
            slot: 0,
            lease: 0,
        };
        let liveness = LivenessListener::bind(&m.liveness.to_string())
            .await
            .with_context(|| {
                format!(
                    "cluster: cannot listen on {} (cluster.liveness); pick a free port",
                    m.liveness
                )
            })?;
        let session = join_until_done(&m, &record).await;
        let (lo, hi) = session.cntlid_range();
        if let Err(e) = target.set_cntlid_range(lo, hi) {
            // Nothing was served: the start takes back what the join took.
            session.abandon().await;
            return Err(e.into());
        }
        target.set_anatt(ANATT_SECS);
        // The deadline as of now: the ANA log and the I/O path trust nothing
        // past it, even before the lease watcher runs.
        let clock = LeaseClock::new();
        clock.set(session.valid_until());
        target.set_ana_lease(Some(clock.clone()));
        node.set_etcd_managed();
        tracing::info!(
            "cluster {}: joined as {} (slot {}, controller IDs {lo}..={hi}, lease {:#x})",
            m.name,
            record.name,
            session.slot(),
            session.lease_id()
        );
        Ok(Arc::new(Agent {
            node,
            target,
            m,
            record,
            session: Mutex::new(session),
            clock,
            served: runner::ServedMap::new(),
            dirty: Mutex::new(runner::Dirty::default()),
            acting: Mutex::new(HashMap::new()),
            queued: Mutex::new(HashMap::new()),
            permits: Mutex::new(Arc::new(tokio::sync::Semaphore::new(runner::concurrency()))),
            #[cfg(test)]
            stall: Mutex::new(HashMap::new()),
            #[cfg(test)]
            settles: std::sync::atomic::AtomicUsize::new(0),
            #[cfg(test)]
            volume_reads: std::sync::atomic::AtomicUsize::new(0),
            #[cfg(test)]
            fail_resv_reads: std::sync::atomic::AtomicUsize::new(0),
            owned: Mutex::new(BTreeMap::new()),
            watching: Mutex::new(HashSet::new()),
            memory: Mutex::new(HashMap::new()),
            kick: Notify::new(),
            lost: Notify::new(),
            leaving: std::sync::atomic::AtomicBool::new(false),
            rejoined: Notify::new(),
            _liveness: liveness,
            peer_api: Mutex::new(None),
            obs: observe::Observed::default(),
            qos: Mutex::default(),
        }))
    }

    /// Starts the agent's tasks (call inside the management runtime).
    pub fn spawn(self: &Arc<Self>) {
        tokio::spawn(self.clone().run());
        tokio::spawn(self.clone().fence_watch());
    }

    pub fn session(&self) -> Session {
        self.session.lock().clone()
    }

    pub fn name(&self) -> &str {
        &self.record.name
    }

    /// The stale-write audit of this node's target.
    pub fn target(&self) -> &Arc<Target> {
        &self.target
    }

    /// Leaves the cluster at shutdown: hands nothing over (the others take
    /// over at once, as the lease is revoked), fences what it owns.
    pub async fn leave(&self) {
        self.leaving
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.fence_fast("the node is shutting down");
        let names: Vec<String> = self.owned.lock().keys().cloned().collect();
        for n in names {
            self.node.drop_fenced(&n, "the node is shutting down").await;
        }
        self.session().leave().await;
    }

    /// The loop: a pass (`runner.rs`) after every burst of etcd events,
    /// every second (the volumes not [`runner::steady`]; all of them every
    /// [`runner::FULL_EVERY`] s), and when a volume asks; steps down and
    /// joins again when the lease is lost.
    async fn run(self: Arc<Self>) {
        use tokio::sync::broadcast::error::{RecvError, TryRecvError};
        loop {
            let s = self.session();
            let mut events = s.events();
            self.mark_all();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let mut ticks = 0u64;
            let why = loop {
                self.pass(&s).await;
                tokio::select! {
                    e = events.recv() => match e {
                        Ok(e) => {
                            self.observe_event(&e);
                            self.mark_event(&e)
                        }
                        Err(RecvError::Lagged(_)) => self.mark_all(),
                        Err(RecvError::Closed) => break "the etcd watch ended".to_string(),
                    },
                    _ = tick.tick() => {
                        ticks += 1;
                        if ticks.is_multiple_of(runner::FULL_EVERY) {
                            self.mark_all()
                        } else {
                            self.mark_tick()
                        }
                    }
                    _ = self.kick.notified() => {}
                    _ = self.lost.notified() => break "the ownership lease was lost".to_string(),
                }
                // the rest of the burst joins this pass
                loop {
                    match events.try_recv() {
                        Ok(e) => {
                            self.observe_event(&e);
                            self.mark_event(&e)
                        }
                        Err(TryRecvError::Lagged(_)) => self.mark_all(),
                        Err(TryRecvError::Empty | TryRecvError::Closed) => break,
                    }
                }
            };
            tracing::error!(
                "cluster {}: {why}; every volume owned here is fenced, joining again",
                self.m.name
            );
            self.step_down_all(&why).await;
            if self.leaving.load(std::sync::atomic::Ordering::SeqCst) {
                return;
            }
            let s = join_until_done(&self.m, &self.record).await;
            let (lo, hi) = s.cntlid_range();
            if let Err(e) = self.target.set_cntlid_range(lo, hi) {
                tracing::error!("cluster: controller IDs {lo}..={hi}: {e}");
            }
            *self.session.lock() = s;
            self.rejoined.notify_one();
        }
    }

    /// Copies the lease deadline to the I/O path, and fences at once when
    /// the lease is lost (the loop may be busy with a takeover). The
    /// deadline passing unmoved (a node woken from SIGSTOP) turns the owned
    /// groups Inaccessible first, before the lease is declared lost; should
    /// a keep-alive move the deadline after all, they are Optimized again.
    async fn fence_watch(self: Arc<Self>) {
        loop {
            let mut h = self.session().health();
            // The groups the passed deadline turned Inaccessible, once it passed.
            let mut flipped: Option<Vec<u32>> = None;
            loop {
                let cur = h.borrow_and_update().clone();
                match cur {
                    LeaseHealth::Live { valid_until } => {
                        self.clock.set(Some(valid_until));
                        if self.clock.valid()
                            && let Some(groups) = flipped.take()
                        {
                            self.ana_unfence(groups);
                        }
                    }
                    LeaseHealth::Lost(why) => {
                        self.clock.set(None);
                        self.tell_lease_lost(&why);
                        self.fence_fast(&why);
                        self.lost.notify_one();
                        break;
                    }
                }
                let until = self.clock.until();
                let changed = loop {
                    tokio::select! {
                        r = h.changed() => break r,
                        // once passed (even with nothing owned), only the watcher wakes us
                        _ = sleep_until(until), if flipped.is_none() && until.is_some() => {
                            if !self.clock.valid() {
                                flipped = Some(self.ana_fence("the lease deadline passed"));
                            }
                        }
                    }
                };
                if changed.is_err() {
                    self.clock.set(None);
                    self.tell_lease_lost("the lease watch ended");
                    self.fence_fast("the lease watch ended");
                    self.lost.notify_one();
                    break;
                }
            }
            self.rejoined.notified().await;
        }
    }

    /// Turns every owned group Inaccessible (the switch devices refuse I/O
    /// past the deadline on their own); the groups it turned.
    fn ana_fence(&self, why: &str) -> Vec<u32> {
        let mut v = Vec::new();
        for (name, o) in self.owned.lock().iter() {
            let g = o.group;
            self.target.set_ana_state(g, AnaState::Inaccessible);
            tracing::warn!("volume {name}: ANA group {g} inaccessible: {why}");
            v.push(g);
        }
        v
    }

    /// The lease holds after all: the groups [`Agent::ana_fence`] turned and
    /// still owned here are Optimized again.
    /// A held group (see [`OwnedGroup::held`]) stays Inaccessible.
    fn ana_unfence(&self, groups: Vec<u32>) {
        for (name, o) in self.owned.lock().iter() {
            let g = o.group;
            if groups.contains(&g) && o.held.is_none() {
                self.target.set_ana_state(g, AnaState::Optimized);
                tracing::warn!("volume {name}: the lease was renewed; ANA group {g} optimized");
            }
        }
    }

    /// Turns every owned group Inaccessible and stops passing I/O on: the
    /// host retries elsewhere. The volumes are dropped by the loop.
    fn fence_fast(&self, why: &str) {
        for (name, o) in self.owned.lock().iter() {
            self.target.set_ana_state(o.group, AnaState::Inaccessible);
            for sw in &o.switches {
                sw.deactivate();
            }
            self.tell_fenced(name, why);
        }
    }

    /// The standby namespace of `spec`: its subsystem (made if missing),
    /// its ANA group Inaccessible, a switch device with nothing behind it.
    fn serve_standby(&self, spec: &VolumeSpec) -> anyhow::Result<Arc<SwitchDevice>> {
        if self.target.subsystem(&spec.nqn).is_none() {
            self.target.add_subsystem(Arc::new(Subsystem::new(
                spec.nqn.clone(),
                spec.serial.clone(),
                spec.model.clone(),
                spec.hosts.is_empty(),
                spec.hosts.clone(),
                Vec::new(),
            )))?;
        }
        self.target.set_cluster_wide(&spec.nqn, true)?;
        if spec.thin_pool {
            // A pool is not a namespace; its thin volumes are (`pools.rs`).
            self.target
                .set_ana_state(spec.ana_group, AnaState::Inaccessible);
            self.target.bind_ana_group_to_lease(spec.ana_group, true);
            tracing::info!(
                "cluster pool {}: served on standby (ANA group {} of {})",
                spec.name,
                spec.ana_group,
                spec.nqn
            );
            let geometry = blockdev::Geometry {
                block_size: spec.block_size,
                num_blocks: spec.size_bytes / u64::from(spec.block_size.max(1)),
            };
            return Ok(SwitchDevice::new(&spec.name, geometry, self.clock.clone()));
        }
        let geometry = blockdev::Geometry {
            block_size: spec.block_size,
            num_blocks: spec.size_bytes / u64::from(spec.block_size.max(1)),
        };
        let sw = SwitchDevice::new(&spec.name, geometry, self.clock.clone());
        self.target
            .set_ana_state(spec.ana_group, AnaState::Inaccessible);
        self.target.bind_ana_group_to_lease(spec.ana_group, true);
        let mut ns = crate::node::volume_namespace(spec.nsid, sw.clone(), &spec.uuid)
            .with_ana_group(spec.ana_group)?
            .with_qos(self.ns_qos(&spec.name, &spec.nqn, spec.nsid));
        // reservations kept with the volume, not with this node
        ns.resv = sw.reservations();
        self.target
            .add_namespace(&spec.nqn, ns)
            .inspect_err(|_| self.qos_unserved(&spec.name))?;
        tracing::info!(
            "cluster volume {}: served as nsid {} of {} (ANA group {}, standby)",
            spec.name,
            spec.nsid,
            spec.nqn,
            spec.ana_group
        );
        Ok(sw)
    }

    /// Stops serving a volume here, with its thin volumes if it is a pool.
    fn unserve_all(&self, sv: &Served) {
        for t in sv.thins.values() {
            self.unserve_thin(&sv.spec, &t.spec);
        }
        self.unserve(&sv.spec);
    }

    fn unserve(&self, spec: &VolumeSpec) {
        if !spec.thin_pool {
            let _ = self.target.remove_namespace(&spec.nqn, spec.nsid);
            self.qos_unserved(&spec.name);
        }
        self.target.bind_ana_group_to_lease(spec.ana_group, false);
        if let Some(sub) = self.target.subsystem(&spec.nqn)
            && sub.cluster_wide()
            && sub.namespaces().is_empty()
        {
            let _ = self.target.remove_subsystem(&spec.nqn);
        }
        tracing::info!("cluster volume {}: no longer served here", spec.name);
    }
}

/// Joins, retrying every half second (etcd down, or the node's previous
/// life still holding its name until its lease expires).
async fn join_until_done(m: &Membership, record: &NodeRecord) -> Session {
    let mut last = String::new();
    loop {
        let cfg = ClusterConfig::with_ttl(m.etcd.clone(), &m.name, &record.name, m.lease_ttl);
        match Session::join(cfg, record.clone()).await {
            Ok(s) => return s,
            Err(e) => {
                let msg = e.to_string();
                if msg != last {
                    tracing::warn!(
                        "cluster {}: cannot join yet: {msg}; retrying (SIGINT or SIGTERM stops)",
                        m.name
                    );
                    last = msg;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Sleeps until `t` (forever without one).
async fn sleep_until(t: Option<std::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// An etcd error of a management call, as its answer: conflicts (the
/// owner changed, a name, NSID or record changed meanwhile) are 409, the
/// rest 500. Nothing was changed either way.
pub(super) fn etcd(e: ClusterError) -> NodeError {
    match e {
        ClusterError::Deposed { .. } => NodeError::Conflict(format!(
            "{e}; the volume or pool changed owner meanwhile, nothing was done; look again \
             and retry"
        )),
        ClusterError::VolumeExists(_)
        | ClusterError::DriveTaken { .. }
        | ClusterError::SpecChanged(_)
        | ClusterError::NsidTaken { .. }
        | ClusterError::ThinChanged(_) => NodeError::Conflict(e.to_string()),
        _ => NodeError::Internal(format!("cluster state (etcd): {e}")),
    }
}

/// Runs `change` with `urls` taken in etcd ([`Session::take_drives`]) for
/// a change of volume `what`: taken before the change checks that no spec
/// names them ([`drives_free`], which `change` reads after the take) and
/// held until its own spec is recorded, then let go before the answer, so
/// a retry right after it does not meet them. A change that meets a held
/// drive is refused (409) before `change` starts.
pub(super) async fn with_drives<T>(
    s: &Session,
    urls: &[String],
    what: &str,
    change: impl std::future::Future<Output = NodeResult<T>>,
) -> NodeResult<T> {
    let taken = TakenDrives::take(s, urls, what).await?;
    let r = change.await;
    taken.release().await;
    r
}

/// Drives taken for one change; let go when dropped, on every path
/// (a cancelled change included).
struct TakenDrives {
    s: Session,
    take: Option<cluster::DriveTake>,
}

impl TakenDrives {
    async fn take(s: &Session, urls: &[String], what: &str) -> NodeResult<Self> {
        let take = s.take_drives(urls, what).await.map_err(etcd)?;
        Ok(TakenDrives {
            s: s.clone(),
            take: Some(take),
        })
    }

    /// Lets go now, awaited. What could not be let go is tried again in
    /// the background (as on drop).
    async fn release(mut self) {
        if let Some(take) = self.take.take()
            && self.s.release_drives(&take).await.is_err()
        {
            self.take = Some(take);
        }
    }
}

impl Drop for TakenDrives {
    fn drop(&mut self) {
        let (s, Some(take)) = (self.s.clone(), self.take.take()) else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                "drives {} taken for a change: not let go (no runtime); they stay taken until \
                 this node stops",
                take.urls().join(", ")
            );
            return;
        };
        rt.spawn(async move {
            let mut last = None;
            for wait in [0, 500, 2000] {
                tokio::time::sleep(Duration::from_millis(wait)).await;
                match s.release_drives(&take).await {
                    Ok(()) => return,
                    Err(e) => last = Some(e),
                }
            }
            // Held until this node's lease ends (it stops): a change on
            // them meanwhile is refused (docs/cluster.md, `drive-claims/`).
            tracing::warn!(
                "drives {} taken for a change: not let go: {}; they stay taken until this node \
                 stops, or `etcdctl del` of their drive-claims/ keys",
                take.urls().join(", "),
                last.map_or_else(String::new, |e| e.to_string())
            );
        });
    }
}

/// Refuses drives that a cluster volume or extent holds (a member, or
/// joining one): writing a new superblock there would destroy it.
pub(super) fn drives_free(specs: &[VolumeSpec], urls: &[String]) -> NodeResult<()> {
    for d in urls {
        if let Some(holder) = specs.iter().find_map(|v| v.holder_of(d)) {
            return Err(NodeError::Conflict(format!(
                "drive {d} is a member of {holder} already; nothing was changed"
            )));
        }
    }
    Ok(())
}

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
//! needs, as a pure function of what etcd and this node show; `own.rs`
//! gathers those views and carries the actions out (taking over, letting
//! go); `peers.rs` the other nodes, `cluster_ops.rs` the cluster operations
//! the API calls into (create, move, drain, status).

mod cluster_ops;
mod decide;
mod own;
mod peers;
mod switch;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use cluster::{
    ClusterConfig, ClusterError, LeaseHealth, LivenessListener, NodeRecord, Portal, Session,
    VolumeSpec,
};
use nvmf_target::{AnaState, Subsystem, Target};
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::config::Membership;
use crate::node::Node;

pub use switch::{LeaseClock, SwitchDevice};

/// ANA transition time reported to hosts: the longest a group stays in
/// Change during a planned move before it is Optimized or Inaccessible.
pub const ANATT_SECS: u8 = 5;

/// One cluster volume as this node serves it.
struct Served {
    spec: VolumeSpec,
    switch: Arc<SwitchDevice>,
    /// The epoch this node owns it at, when it does.
    epoch: Option<u64>,
}

pub struct Agent {
    node: Arc<Node>,
    target: Arc<Target>,
    m: Membership,
    record: NodeRecord,
    session: Mutex<Session>,
    clock: Arc<LeaseClock>,
    served: tokio::sync::Mutex<BTreeMap<String, Served>>,
    /// The owned volumes' groups and switches, for the fence path, which
    /// must not wait for the loop.
    owned: Mutex<BTreeMap<String, (u32, Arc<SwitchDevice>)>>,
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
            clock: LeaseClock::new(),
            served: tokio::sync::Mutex::new(BTreeMap::new()),
            owned: Mutex::new(BTreeMap::new()),
            watching: Mutex::new(HashSet::new()),
            memory: Mutex::new(HashMap::new()),
            kick: Notify::new(),
            lost: Notify::new(),
            leaving: std::sync::atomic::AtomicBool::new(false),
            rejoined: Notify::new(),
            _liveness: liveness,
            peer_api: Mutex::new(None),
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

    /// The loop: reconciles on every etcd event, every second, and when
    /// asked; steps down and joins again when the lease is lost.
    async fn run(self: Arc<Self>) {
        loop {
            let s = self.session();
            let mut events = s.events();
            self.reconcile().await;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let why = loop {
                tokio::select! {
                    e = events.recv() => match e {
                        Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                            self.reconcile().await
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                            break "the etcd watch ended".to_string()
                        }
                    },
                    _ = tick.tick() => self.reconcile().await,
                    _ = self.kick.notified() => self.reconcile().await,
                    _ = self.lost.notified() => break "the ownership lease was lost".to_string(),
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
    /// the lease is lost (the loop may be busy with a takeover).
    async fn fence_watch(self: Arc<Self>) {
        loop {
            let mut h = self.session().health();
            loop {
                let cur = h.borrow_and_update().clone();
                match cur {
                    LeaseHealth::Live { valid_until } => self.clock.set(Some(valid_until)),
                    LeaseHealth::Lost(why) => {
                        self.clock.set(None);
                        self.fence_fast(&why);
                        self.lost.notify_one();
                        break;
                    }
                }
                if h.changed().await.is_err() {
                    self.clock.set(None);
                    self.fence_fast("the lease watch ended");
                    self.lost.notify_one();
                    break;
                }
            }
            self.rejoined.notified().await;
        }
    }

    /// Turns every owned group Inaccessible and stops passing I/O on: the
    /// host retries elsewhere. The volumes are dropped by the loop.
    fn fence_fast(&self, why: &str) {
        for (name, (g, sw)) in self.owned.lock().iter() {
            self.target.set_ana_state(*g, AnaState::Inaccessible);
            sw.deactivate();
            tracing::warn!("volume {name}: fenced: {why}");
        }
    }

    async fn reconcile(self: &Arc<Self>) {
        if let Err(e) = self.reconcile_inner().await {
            tracing::warn!("cluster {}: {e}", self.m.name);
        }
    }

    /// One pass: reads the members, then for each volume gathers what etcd
    /// and this node show, decides (`decide.rs`) and acts (`own.rs`). The
    /// volumes are settled one after another under the `served` lock; their
    /// plans are independent, so a runner that settles them concurrently
    /// (issue 21) needs only to hand each its own slot.
    async fn reconcile_inner(self: &Arc<Self>) -> Result<(), ClusterError> {
        let s = self.session();
        // decide::decide plans nothing either while the lease is not valid
        if !s.is_valid() {
            return Ok(());
        }
        let nodes = s.nodes().await?;
        let members = decide::Members {
            live: nodes.iter().map(|n| n.name.clone()).collect(),
            draining: s.draining().await?.into_iter().collect(),
        };
        self.update_peers(&nodes);
        let specs = s.specs().await?;
        let mut served = self.served.lock().await;
        let names: HashSet<&str> = specs.iter().map(|v| v.name.as_str()).collect();
        let gone: Vec<String> = served
            .keys()
            .filter(|n| !names.contains(n.as_str()))
            .cloned()
            .collect();
        for name in gone {
            let sv = served.remove(&name).expect("listed");
            let here = self.local_volume(&name, Some(&sv), None);
            let Some(plan) = decide::decide_gone(&name, &here) else {
                continue;
            };
            let spec = sv.spec.clone();
            let mut slot = Some(sv);
            let r = self.act(&s, &spec, &mut slot, plan).await;
            if let Some(sv) = slot {
                served.insert(name, sv);
            }
            r?;
        }
        for spec in specs {
            let mut slot = served.remove(&spec.name);
            let r = self.settle(&s, &members, &spec, &mut slot).await;
            if let Some(sv) = slot {
                served.insert(spec.name.clone(), sv);
            }
            r?;
        }
        Ok(())
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
        let geometry = blockdev::Geometry {
            block_size: spec.block_size,
            num_blocks: spec.size_bytes / u64::from(spec.block_size.max(1)),
        };
        let sw = SwitchDevice::new(&spec.name, geometry, self.clock.clone());
        self.target
            .set_ana_state(spec.ana_group, AnaState::Inaccessible);
        let ns = crate::node::volume_namespace(spec.nsid, sw.clone(), &spec.uuid)
            .with_ana_group(spec.ana_group)?;
        self.target.add_namespace(&spec.nqn, ns)?;
        tracing::info!(
            "cluster volume {}: served as nsid {} of {} (ANA group {}, standby)",
            spec.name,
            spec.nsid,
            spec.nqn,
            spec.ana_group
        );
        Ok(sw)
    }

    fn unserve(&self, spec: &VolumeSpec) {
        let _ = self.target.remove_namespace(&spec.nqn, spec.nsid);
        if let Some(sub) = self.target.subsystem(&spec.nqn)
            && sub.cluster_wide()
            && sub.namespaces().is_empty()
        {
            let _ = self.target.remove_subsystem(&spec.nqn);
        }
        tracing::info!("cluster volume {}: no longer served here", spec.name);
    }

    /// Asks for a reconcile after `d` (a claim delay runs out).
    fn kick_after(self: &Arc<Self>, d: Duration) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(d).await;
            if let Some(a) = me.upgrade() {
                a.kick.notify_one();
            }
        });
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

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

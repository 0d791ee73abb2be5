//! A node's membership in the cluster: its lease, keep-alive, watch and the
//! guarded transactions on volume keys.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, PutOptions, Txn,
    TxnOp, TxnOpResponse, WatchOptions,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use crate::{
    ANA_GROUPS, ClusterConfig, ClusterError, ClusterEvent, Handoff, LeaseHealth, MAX_SLOT,
    NodeRecord, Owner, VolumeSpec, VolumeState,
};

/// How long one operation keeps retrying transient etcd errors (leader
/// change, a member going away) before it reports them.
const RETRY_FOR: Duration = Duration::from_secs(4);

/// A node's live membership. Clone-able; the keep-alive and watch tasks stop
/// when the last clone is dropped (the lease then expires after its TTL).
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    cfg: ClusterConfig,
    prefix: String,
    slot: u16,
    lease: i64,
    health: Arc<watch::Sender<LeaseHealth>>,
    events: broadcast::Sender<ClusterEvent>,
    pause_until: Arc<Mutex<Option<Instant>>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

fn etcd_err(cfg: &ClusterConfig, what: &str, e: etcd_client::Error) -> ClusterError {
    if let etcd_client::Error::GRpcStatus(s) = &e
        && s.code() == tonic::Code::NotFound
        && s.message().contains("lease")
    {
        return ClusterError::LeaseLost(format!("{what}: {}", s.message()));
    }
    ClusterError::Etcd(format!(
        "{what} (endpoints {}): {e}",
        cfg.endpoints.join(",")
    ))
}

/// Errors worth retrying: the request may not have reached a leader.
fn transient(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match e {
        E::TransportError(_) | E::IoError(_) => true,
        E::GRpcStatus(s) => matches!(
            s.code(),
            tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Cancelled
                | tonic::Code::Unknown
                | tonic::Code::Internal
        ),
        _ => false,
    }
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("serialising a plain struct cannot fail")
}

fn decode<T: DeserializeOwned>(kv: &KeyValue) -> Result<T, ClusterError> {
    serde_json::from_slice(kv.value()).map_err(|e| ClusterError::Decode {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        err: e.to_string(),
    })
}

fn txn_gets(resp: &etcd_client::TxnResponse) -> Vec<Vec<KeyValue>> {
    resp.op_responses()
        .into_iter()
        .filter_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g.kvs().to_vec()),
            _ => None,
        })
        .collect()
}

/// The controller-ID slot a joining node takes: its own home slot when
/// free, else the lowest free slot that is no other node's home, else the
/// lowest free slot.
fn pick_slot(me: &str, taken: &[u16], homes: &[(String, u16)]) -> Option<u16> {
    let free = |s: &u16| !taken.contains(s);
    if let Some((_, s)) = homes
        .iter()
        .find(|(n, s)| n == me && free(s) && *s <= MAX_SLOT)
    {
        return Some(*s);
    }
    let homed = |s: &u16| homes.iter().any(|(n, h)| n != me && h == s);
    (0..=MAX_SLOT)
        .find(|s| free(s) && !homed(s))
        .or_else(|| (0..=MAX_SLOT).find(free))
}

impl Session {
    /// Joins the cluster: grants a lease, takes a free controller-ID
    /// slot (its home slot when it can, see `pick_slot`) and publishes `nodes/<name>`, all under the lease; then starts the
    /// keep-alive (with its fencing watchdog) and the watch.
    pub async fn join(cfg: ClusterConfig, mut rec: NodeRecord) -> Result<Session, ClusterError> {
        let opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_millis(500))
            .with_keep_alive(Duration::from_millis(500), Duration::from_millis(1000))
            .with_timeout(Duration::from_secs(3));
        let client = Client::connect(&cfg.endpoints, Some(opts))
            .await
            .map_err(|e| etcd_err(&cfg, "connect", e))?;
        let prefix = cfg.prefix();
        rec.name = cfg.node.clone();

        let granted = retry(&cfg, "lease grant", || {
            let mut c = client.clone();
            let ttl = cfg.ttl_secs();
            async move { c.lease_grant(ttl, None).await }
        })
        .await?;
        let lease = granted.id();
        let ttl_granted = Duration::from_secs(granted.ttl().max(1) as u64);
        let abandon = |client: &Client| {
            let mut c = client.clone();
            async move {
                let _ = c.lease_revoke(lease).await;
            }
        };

        let node_key = format!("{prefix}nodes/{}", cfg.node);
        let home_key = format!("{prefix}slot-home/{}", cfg.node);
        let slot = loop {
            // The slots in use, and every node's home slot (the one it had
            // last: a host may still hold a dead node's controllers, whose
            // IDs another node must not hand out again).
            let read = |k: String| {
                let client = client.clone();
                let cfg = cfg.clone();
                async move {
                    retry(&cfg, "read slots", || {
                        let mut c = client.clone();
                        let k = k.clone();
                        async move { c.get(k, Some(GetOptions::new().with_prefix())).await }
                    })
                    .await
                }
            };
            let (used, homes) = match (
                read(format!("{prefix}slots/")).await,
                read(format!("{prefix}slot-home/")).await,
            ) {
                (Ok(u), Ok(h)) => (u, h),
                (Err(e), _) | (_, Err(e)) => {
                    abandon(&client).await;
                    return Err(e);
                }
            };
            let taken: Vec<u16> = used
                .kvs()
                .iter()
                .filter_map(|kv| kv.key_str().ok()?.rsplit('/').next()?.parse().ok())
                .collect();
            let home_of = |kv: &etcd_client::KeyValue| -> Option<(String, u16)> {
                let node = kv.key_str().ok()?.rsplit('/').next()?.to_string();
                Some((node, kv.value_str().ok()?.parse().ok()?))
            };
            let homes: Vec<(String, u16)> = homes.kvs().iter().filter_map(home_of).collect();
            let Some(slot) = pick_slot(&cfg.node, &taken, &homes) else {
                abandon(&client).await;
                return Err(ClusterError::NoFreeSlot);
            };
            rec.slot = slot;
            rec.lease = lease;
            let slot_key = format!("{prefix}slots/{slot}");
            let txn = Txn::new()
                .when([
                    Compare::version(slot_key.clone(), CompareOp::Equal, 0),
                    Compare::version(node_key.clone(), CompareOp::Equal, 0),
                ])
                .and_then([
                    TxnOp::put(
                        slot_key.clone(),
                        cfg.node.clone(),
                        Some(PutOptions::new().with_lease(lease)),
                    ),
                    TxnOp::put(
                        node_key.clone(),
                        encode(&rec),
                        Some(PutOptions::new().with_lease(lease)),
                    ),
                    TxnOp::put(home_key.clone(), slot.to_string(), None),
                ])
                .or_else([TxnOp::get(node_key.clone(), None)]);
            let resp = match retry(&cfg, "join txn", || {
                let mut c = client.clone();
                let t = txn.clone();
                async move { c.txn(t).await }
            })
            .await
            {
                Ok(r) => r,
                Err(e) => {
                    abandon(&client).await;
                    return Err(e);
                }
            };
            if resp.succeeded() {
                break slot;
            }
            let existing = txn_gets(&resp).into_iter().flatten().next();
            if let Some(kv) = existing {
                if kv.lease() == lease {
                    // our own earlier attempt went through
                    break decode::<NodeRecord>(&kv).map(|r| r.slot).unwrap_or(slot);
                }
                abandon(&client).await;
                return Err(ClusterError::NodeNameInUse(cfg.node.clone()));
            }
            // the slot was taken under us: read again
        };
        // The steps above may have waited out a leader election: refresh
        // the lease now so the fencing deadline starts from a fresh ack.
        let sent = Instant::now();
        let refreshed = tokio::time::timeout(ttl_granted.saturating_sub(cfg.fence_margin), async {
            let mut lc = client.lease_client();
            loop {
                match lc.keep_alive(lease).await {
                    Ok(_) => return Ok(()),
                    Err(e) if transient(&e) => tokio::time::sleep(Duration::from_millis(25)).await,
                    Err(e) => return Err(e),
                }
            }
        })
        .await;
        match refreshed {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                abandon(&client).await;
                return Err(etcd_err(
                    &cfg,
                    &format!("keep-alive of new lease {lease:x}"),
                    e,
                ));
            }
            Err(_) => {
                abandon(&client).await;
                return Err(ClusterError::Etcd(format!(
                    "keep-alive of new lease {lease:x} unanswered (endpoints {})",
                    cfg.endpoints.join(",")
                )));
            }
        }
        let valid_until = sent + ttl_granted.saturating_sub(cfg.fence_margin);
        tracing::info!(node = %cfg.node, slot, lease, "joined cluster {}", cfg.cluster);

        let (health_tx, _) = watch::channel(LeaseHealth::Live { valid_until });
        let health = Arc::new(health_tx);
        let (events, _) = broadcast::channel(1024);
        let pause_until = Arc::new(Mutex::new(None));
        let inner = Inner {
            client: client.clone(),
            cfg: cfg.clone(),
            prefix: prefix.clone(),
            slot,
            lease,
            health: health.clone(),
            events: events.clone(),
            pause_until: pause_until.clone(),
            tasks: Mutex::new(Vec::new()),
        };
        let ka = KeepAlive {
            client: client.clone(),
            lease,
            every: cfg.keepalive_every.max(Duration::from_millis(10)),
            margin: cfg.fence_margin,
            ttl: ttl_granted,
            health: health.clone(),
            pause_until,
        };
        let tasks = vec![
            tokio::spawn(ka.run()),
            tokio::spawn(watchdog(health.clone(), client.clone(), lease)),
            tokio::spawn(watch_task(client, prefix, events)),
        ];
        *inner.tasks.lock().unwrap() = tasks;
        Ok(Session {
            inner: Arc::new(inner),
        })
    }

    pub fn node(&self) -> &str {
        &self.inner.cfg.node
    }

    pub fn slot(&self) -> u16 {
        self.inner.slot
    }

    pub fn lease_id(&self) -> i64 {
        self.inner.lease
    }

    pub fn config(&self) -> &ClusterConfig {
        &self.inner.cfg
    }

    /// This node's controller IDs: `slot*1024 ..= slot*1024+1023`, clipped to 1..=0xFFEF.
    pub fn cntlid_range(&self) -> (u16, u16) {
        cntlid_range(self.inner.slot)
    }

    pub fn health(&self) -> watch::Receiver<LeaseHealth> {
        self.inner.health.subscribe()
    }

    /// Send time of the last acknowledged keep-alive + granted TTL - fence
    /// margin (monotonic); `None` once the lease is lost.
    pub fn valid_until(&self) -> Option<Instant> {
        match &*self.inner.health.borrow() {
            LeaseHealth::Live { valid_until } => Some(*valid_until),
            LeaseHealth::Lost(_) => None,
        }
    }

    /// Live and not past the deadline (checks the clock, not only the watchdog).
    pub fn is_valid(&self) -> bool {
        self.valid_until().is_some_and(|t| Instant::now() < t)
    }

    /// Test hook: the keep-alive task sends nothing for `d` (the watchdog still runs).
    pub fn pause_keepalive_for_test(&self, d: Duration) {
        *self.inner.pause_until.lock().unwrap() = Some(Instant::now() + d);
    }

    fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.inner.prefix)
    }

    fn vkey(&self, vol: &str, leaf: &str) -> String {
        format!("{}volumes/{vol}/{leaf}", self.inner.prefix)
    }

    async fn op<T, F, Fut>(&self, what: &str, f: F) -> Result<T, ClusterError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        retry(&self.inner.cfg, what, || f(self.inner.client.clone())).await
    }

    async fn get_one(&self, key: &str) -> Result<Option<KeyValue>, ClusterError> {
        let r = self
            .op(&format!("get {key}"), |mut c| {
                let k = key.to_string();
                async move { c.get(k, None).await }
            })
            .await?;
        Ok(r.kvs().first().cloned())
    }

    async fn get_prefix(&self, key: &str) -> Result<Vec<KeyValue>, ClusterError> {
        let r = self
            .op(&format!("get {key}*"), |mut c| {
                let k = key.to_string();
                async move { c.get(k, Some(GetOptions::new().with_prefix())).await }
            })
            .await?;
        Ok(r.kvs().to_vec())
    }

    async fn txn(&self, what: &str, txn: Txn) -> Result<etcd_client::TxnResponse, ClusterError> {
        self.op(what, |mut c| {
            let t = txn.clone();
            async move { c.txn(t).await }
        })
        .await
    }

    /// Every live node (their records are under their leases).
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>, ClusterError> {
        self.get_prefix(&self.key("nodes/"))
            .await?
            .iter()
            .map(|kv| {
                let mut r: NodeRecord = decode(kv)?;
                r.lease = kv.lease();
                Ok(r)
            })
            .collect()
    }

    /// Seconds left on `lease`; `None` if it has expired or never existed.
    pub async fn lease_ttl_left(&self, lease: i64) -> Result<Option<i64>, ClusterError> {
        let r = self
            .op("lease time-to-live", |mut c| async move {
                c.lease_time_to_live(lease, None).await
            })
            .await?;
        Ok((r.ttl() >= 0).then_some(r.ttl()))
    }

    /// Revokes node `name`'s lease, so all its leased keys (node record, slot,
    /// volume owners) go at once. `false` if the node is not registered.
    pub async fn revoke_node(&self, name: &str) -> Result<bool, ClusterError> {
        let Some(kv) = self.get_one(&self.key(&format!("nodes/{name}"))).await? else {
            return Ok(false);
        };
        let lease = kv.lease();
        if lease == 0 {
            return Ok(false);
        }
        let mut c = self.inner.client.clone();
        match c.lease_revoke(lease).await {
            Ok(_) => {
                tracing::warn!(node = name, lease, "revoked node's lease");
                Ok(true)
            }
            Err(etcd_client::Error::GRpcStatus(s)) if s.message().contains("not found") => {
                Ok(false)
            }
            Err(e) => Err(etcd_err(
                &self.inner.cfg,
                &format!("revoke lease {lease} of node {name}"),
                e,
            )),
        }
    }

    /// Creates `volumes/<v>/spec`; `VolumeExists` if there is one.
    pub async fn create_spec(&self, spec: &VolumeSpec) -> Result<(), ClusterError> {
        let key = self.vkey(&spec.name, "spec");
        let txn = Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), encode(spec), None)]);
        let r = self.txn(&format!("create {key}"), txn).await?;
        if r.succeeded() {
            return Ok(());
        }
        Err(ClusterError::VolumeExists(spec.name.clone()))
    }

    pub async fn specs(&self) -> Result<Vec<VolumeSpec>, ClusterError> {
        self.get_prefix(&self.key("volumes/"))
            .await?
            .iter()
            .filter(|kv| kv.key().ends_with(b"/spec"))
            .map(decode)
            .collect()
    }

    pub async fn spec(&self, vol: &str) -> Result<Option<VolumeSpec>, ClusterError> {
        self.get_one(&self.vkey(vol, "spec"))
            .await?
            .as_ref()
            .map(decode)
            .transpose()
    }

    /// Deletes the volume's keys (spec, owner, state, handoff, epoch), only
    /// while this node owns it at `epoch`.
    pub async fn delete_volume(&self, vol: &str, epoch: u64) -> Result<(), ClusterError> {
        let me = Owner {
            node: self.node().to_string(),
            epoch,
        };
        let txn = Txn::new()
            .when([Compare::value(
                self.vkey(vol, "owner"),
                CompareOp::Equal,
                encode(&me),
            )])
            .and_then(
                ["spec", "owner", "state", "handoff", "epoch"]
                    .map(|leaf| TxnOp::delete(self.vkey(vol, leaf), None)),
            );
        if self
            .txn(&format!("delete volume {vol}"), txn)
            .await?
            .succeeded()
        {
            Ok(())
        } else {
            Err(ClusterError::Deposed {
                volume: vol.to_string(),
                epoch,
            })
        }
    }

    /// Lowest ANA group in 1..=128 that no spec uses.
    pub async fn free_ana_group(&self) -> Result<u32, ClusterError> {
        let used: Vec<u32> = self.specs().await?.iter().map(|s| s.ana_group).collect();
        ANA_GROUPS
            .into_iter()
            .find(|g| !used.contains(g))
            .ok_or(ClusterError::NoFreeAnaGroup)
    }

    pub async fn owner(&self, vol: &str) -> Result<Option<Owner>, ClusterError> {
        self.get_one(&self.vkey(vol, "owner"))
            .await?
            .as_ref()
            .map(decode)
            .transpose()
    }

    /// Tries to become the owner of `vol` at epoch = last epoch + 1. `Some`
    /// when this node owns it (now or already, under this lease), `None` when
    /// another node does. Of N concurrent claimers exactly one wins.
    pub async fn claim(&self, vol: &str) -> Result<Option<Owner>, ClusterError> {
        let owner_key = self.vkey(vol, "owner");
        let epoch_key = self.vkey(vol, "epoch");
        loop {
            let read = Txn::new().and_then([
                TxnOp::get(owner_key.clone(), None),
                TxnOp::get(epoch_key.clone(), None),
            ]);
            let r = self.txn(&format!("read {owner_key}"), read).await?;
            let gets = txn_gets(&r);
            if let Some(kv) = gets.first().and_then(|g| g.first()) {
                let o: Owner = decode(kv)?;
                return Ok((o.node == self.node() && kv.lease() == self.inner.lease).then_some(o));
            }
            let (epoch, rev) = match gets.get(1).and_then(|g| g.first()) {
                Some(kv) => (decode::<u64>(kv)?, kv.mod_revision()),
                None => (0, 0),
            };
            let me = Owner {
                node: self.node().to_string(),
                epoch: epoch + 1,
            };
            let txn = Txn::new()
                .when([
                    Compare::version(owner_key.clone(), CompareOp::Equal, 0),
                    Compare::mod_revision(epoch_key.clone(), CompareOp::Equal, rev),
                ])
                .and_then([
                    TxnOp::put(
                        owner_key.clone(),
                        encode(&me),
                        Some(PutOptions::new().with_lease(self.inner.lease)),
                    ),
                    TxnOp::put(epoch_key.clone(), encode(&me.epoch), None),
                ]);
            if self
                .txn(&format!("claim {owner_key}"), txn)
                .await?
                .succeeded()
            {
                tracing::info!(volume = vol, epoch = me.epoch, "claimed volume");
                return Ok(Some(me));
            }
        }
    }

    /// Deletes the owner key iff it is this node at `epoch`.
    pub async fn release(&self, vol: &str, epoch: u64) -> Result<bool, ClusterError> {
        let key = self.vkey(vol, "owner");
        let me = Owner {
            node: self.node().to_string(),
            epoch,
        };
        let txn = Txn::new()
            .when([Compare::value(key.clone(), CompareOp::Equal, encode(&me))])
            .and_then([TxnOp::delete(key.clone(), None)]);
        Ok(self.txn(&format!("release {key}"), txn).await?.succeeded())
    }

    /// Writes the volume state, only while this node owns it at `st.epoch`.
    pub async fn put_state(&self, vol: &str, st: &VolumeState) -> Result<(), ClusterError> {
        let me = Owner {
            node: self.node().to_string(),
            epoch: st.epoch,
        };
        let txn = Txn::new()
            .when([Compare::value(
                self.vkey(vol, "owner"),
                CompareOp::Equal,
                encode(&me),
            )])
            .and_then([TxnOp::put(self.vkey(vol, "state"), encode(st), None)]);
        if self
            .txn(&format!("put state of {vol}"), txn)
            .await?
            .succeeded()
        {
            Ok(())
        } else {
            Err(ClusterError::Deposed {
                volume: vol.to_string(),
                epoch: st.epoch,
            })
        }
    }

    pub async fn state(&self, vol: &str) -> Result<Option<VolumeState>, ClusterError> {
        self.get_one(&self.vkey(vol, "state"))
            .await?
            .as_ref()
            .map(decode)
            .transpose()
    }

    /// Asks the owner of `h.epoch` to hand the volume over; `Deposed` if the
    /// owner is at another epoch, `NotOwned` if there is none.
    pub async fn set_handoff(&self, vol: &str, h: &Handoff) -> Result<(), ClusterError> {
        let owner_key = self.vkey(vol, "owner");
        loop {
            let Some(kv) = self.get_one(&owner_key).await? else {
                return Err(ClusterError::NotOwned {
                    volume: vol.to_string(),
                });
            };
            let o: Owner = decode(&kv)?;
            if o.epoch != h.epoch {
                return Err(ClusterError::Deposed {
                    volume: vol.to_string(),
                    epoch: h.epoch,
                });
            }
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    owner_key.clone(),
                    CompareOp::Equal,
                    kv.mod_revision(),
                )])
                .and_then([TxnOp::put(self.vkey(vol, "handoff"), encode(h), None)]);
            if self
                .txn(&format!("set handoff of {vol}"), txn)
                .await?
                .succeeded()
            {
                return Ok(());
            }
        }
    }

    pub async fn handoff(&self, vol: &str) -> Result<Option<Handoff>, ClusterError> {
        self.get_one(&self.vkey(vol, "handoff"))
            .await?
            .as_ref()
            .map(decode)
            .transpose()
    }

    pub async fn clear_handoff(&self, vol: &str) -> Result<(), ClusterError> {
        let key = self.vkey(vol, "handoff");
        self.op(&format!("delete {key}"), |mut c| {
            let k = key.clone();
            async move { c.delete(k, None).await }
        })
        .await
        .map(|_| ())
    }

    /// Marks (or unmarks) `node` as draining; persistent, not leased.
    pub async fn set_drain(&self, node: &str, on: bool) -> Result<(), ClusterError> {
        let key = self.key(&format!("drain/{node}"));
        self.op(&format!("set {key}"), |mut c| {
            let k = key.clone();
            async move {
                if on {
                    c.put(k, "true", None).await.map(|_| ())
                } else {
                    c.delete(k, None).await.map(|_| ())
                }
            }
        })
        .await
    }

    pub async fn draining(&self) -> Result<Vec<String>, ClusterError> {
        let p = self.key("drain/");
        Ok(self
            .get_prefix(&p)
            .await?
            .iter()
            .filter_map(|kv| Some(kv.key_str().ok()?.strip_prefix(&p)?.to_string()))
            .collect())
    }

    /// Decoded changes under the cluster prefix (one watch per session,
    /// started at join). A receiver that falls more than 1024 events behind
    /// gets `RecvError::Lagged`: treat it like [`ClusterEvent::Resync`].
    pub fn events(&self) -> broadcast::Receiver<ClusterEvent> {
        self.inner.events.subscribe()
    }

    /// Clean shutdown: stops the tasks and revokes the lease, so this node's
    /// record, slot and owner keys go now rather than after the TTL.
    pub async fn leave(&self) {
        for t in self.inner.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
        self.inner
            .health
            .send_replace(LeaseHealth::Lost("left the cluster".into()));
        let mut c = self.inner.client.clone();
        if let Err(e) = c.lease_revoke(self.inner.lease).await {
            tracing::warn!(lease = self.inner.lease, "revoking own lease on leave: {e}");
        }
    }
}

pub(crate) fn cntlid_range(slot: u16) -> (u16, u16) {
    let lo = (u32::from(slot) * 1024).max(1);
    let hi = (u32::from(slot) * 1024 + 1023).min(0xFFEF);
    (lo as u16, hi as u16)
}

async fn retry<T, F, Fut>(cfg: &ClusterConfig, what: &str, mut f: F) -> Result<T, ClusterError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    let give_up = Instant::now() + RETRY_FOR;
    let mut backoff = Duration::from_millis(25);
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if transient(&e) && Instant::now() + backoff < give_up => {
                tracing::debug!("{what}: {e}; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
            Err(e) => return Err(etcd_err(cfg, what, e)),
        }
    }
}

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
async fn watchdog(health: Arc<watch::Sender<LeaseHealth>>, client: Client, lease: i64) {
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

struct KeepAlive {
    client: Client,
    lease: i64,
    every: Duration,
    margin: Duration,
    ttl: Duration,
    health: Arc<watch::Sender<LeaseHealth>>,
    pause_until: Arc<Mutex<Option<Instant>>>,
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

    async fn run(self) {
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
            let paused = {
                self.pause_until
                    .lock()
                    .unwrap()
                    .is_some_and(|t| Instant::now() < t)
            };
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

fn decode_event(prefix: &str, ev: &etcd_client::Event) -> Option<ClusterEvent> {
    let kv = ev.kv()?;
    let key = kv.key_str().ok()?.strip_prefix(prefix)?;
    let put = ev.event_type() == EventType::Put;
    let warn = |e: ClusterError| tracing::warn!("ignoring undecodable cluster event: {e}");
    let mut parts = key.splitn(3, '/');
    match (parts.next()?, parts.next(), parts.next()) {
        ("nodes", Some(_), None) if put => match decode::<NodeRecord>(kv) {
            Ok(mut r) => {
                r.lease = kv.lease();
                Some(ClusterEvent::NodeUp(r))
            }
            Err(e) => {
                warn(e);
                None
            }
        },
        ("nodes", Some(n), None) => Some(ClusterEvent::NodeDown(n.to_string())),
        ("drain", Some(n), None) => Some(ClusterEvent::Drain(n.to_string(), put)),
        ("volumes", Some(v), Some(leaf)) => {
            let v = v.to_string();
            let r = match (leaf, put) {
                ("spec", true) => decode(kv).map(ClusterEvent::SpecPut),
                ("spec", false) => Ok(ClusterEvent::SpecDeleted(v)),
                ("owner", true) => decode(kv).map(|o| ClusterEvent::OwnerSet(v, o)),
                ("owner", false) => Ok(ClusterEvent::OwnerGone(v)),
                ("handoff", true) => decode(kv).map(|h| ClusterEvent::HandoffSet(v, h)),
                ("handoff", false) => Ok(ClusterEvent::HandoffCleared(v)),
                _ => return None,
            };
            r.map_err(warn).ok()
        }
        _ => None,
    }
}

/// One watch on the whole prefix; restarted whenever it fails. A restart
/// resumes after the last revision it delivered, so no event is lost to an
/// etcd member going away; it still sends Resync (the receiver re-reads
/// what it needs), and when etcd has compacted that revision away the
/// watch starts from now.
async fn watch_task(client: Client, prefix: String, events: broadcast::Sender<ClusterEvent>) {
    let mut first = true;
    // The next revision to deliver (None: from now).
    let mut resume: Option<i64> = None;
    loop {
        let mut wc = client.watch_client();
        let mut opts = WatchOptions::new().with_prefix();
        if let Some(r) = resume {
            opts = opts.with_start_revision(r);
        }
        let (watcher, mut stream) = match wc.watch(prefix.clone(), Some(opts)).await {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!("watch {prefix}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if !first {
            let _ = events.send(ClusterEvent::Resync);
        }
        first = false;
        loop {
            match stream.message().await {
                Ok(Some(resp)) => {
                    if resp.canceled() {
                        if resp.compact_revision() > 0 {
                            // our resume point is gone: from now, after a Resync
                            resume = None;
                        }
                        tracing::warn!("watch {prefix} canceled: {}", resp.cancel_reason());
                        break;
                    }
                    for ev in resp.events() {
                        if let Some(e) = decode_event(&prefix, ev) {
                            let _ = events.send(e);
                        }
                        if let Some(kv) = ev.kv() {
                            resume = Some(resume.unwrap_or(0).max(kv.mod_revision() + 1));
                        }
                    }
                    if let Some(h) = resp.header() {
                        // everything up to the header's revision is delivered
                        resume = Some(resume.unwrap_or(0).max(h.revision() + 1));
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!("watch {prefix}: {e}; re-establishing");
                    break;
                }
            }
        }
        drop(watcher);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use crate::MAX_SLOT;

    #[test]
    fn cntlid_ranges() {
        assert_eq!(super::cntlid_range(0), (1, 1023));
        assert_eq!(super::cntlid_range(1), (1024, 2047));
        assert_eq!(super::cntlid_range(62), (63488, 64511));
    }

    #[test]
    fn a_node_keeps_its_home_slot_and_leaves_others_theirs() {
        use super::pick_slot;
        let h = |v: &[(&str, u16)]| -> Vec<(String, u16)> {
            v.iter().map(|(n, s)| (n.to_string(), *s)).collect()
        };
        let homes = h(&[("a", 0), ("b", 1), ("c", 2)]);
        assert_eq!(pick_slot("b", &[0, 2], &homes), Some(1), "home, free");
        assert_eq!(pick_slot("d", &[0], &homes), Some(3), "not b's or c's");
        assert_eq!(pick_slot("b", &[1], &homes), Some(3), "home taken");
        assert_eq!(pick_slot("x", &[], &[]), Some(0));
        // every slot is someone's home: the lowest free one, then none
        let all: Vec<(String, u16)> = (0..=MAX_SLOT).map(|s| (format!("n{s}"), s)).collect();
        assert_eq!(pick_slot("new", &[0, 1], &all), Some(2));
        let busy: Vec<u16> = (0..=MAX_SLOT).collect();
        assert_eq!(pick_slot("new", &busy, &all), None);
    }
}

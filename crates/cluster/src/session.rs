//! A node's membership in the cluster: joining (lease, controller-ID slot,
//! node record) and the guarded transactions on volume keys. The lease's
//! keep-alive is in `keepalive.rs`, the watch in `watch.rs`, the key
//! layout in `keys.rs`.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, PutOptions, Txn, TxnOp,
};
use parking_lot::Mutex;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use crate::etcd::{decode, encode, etcd_err, retry, transient, txn_gets};
use crate::keepalive::{KeepAlive, watchdog};
use crate::keys::{Keys, VolumeKey};
use crate::watch::watch_task;
use crate::{
    ANA_GROUPS, ClusterConfig, ClusterError, ClusterEvent, Handoff, LeaseHealth, MAX_SLOT,
    NodeRecord, Owner, VolumeRecord, VolumeSpec, VolumeState,
};

/// A node's live membership. Clone-able; the keep-alive and watch tasks stop
/// when the last clone is dropped (the lease then expires after its TTL).
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    cfg: ClusterConfig,
    keys: Keys,
    slot: u16,
    lease: i64,
    /// `slot-home/<name>` as the join found it, for [`Session::abandon`].
    home_before: Option<u16>,
    health: Arc<watch::Sender<LeaseHealth>>,
    events: broadcast::Sender<ClusterEvent>,
    /// Shared with the keep-alive task, for `pause_keepalive_for_test`.
    #[cfg(feature = "testing")]
    pause_until: Arc<Mutex<Option<Instant>>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for t in self.tasks.lock().drain(..) {
            t.abort();
        }
    }
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
        let keys = Keys::new(&cfg.cluster);
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

        let node_key = keys.node(&cfg.node);
        let home_key = keys.slot_home(&cfg.node);
        let mut home_before: Option<u16>;
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
            let (used, homes) = match (read(keys.slots()).await, read(keys.slot_homes()).await) {
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
            home_before = homes.iter().find(|(n, _)| *n == cfg.node).map(|(_, s)| *s);
            let Some(slot) = pick_slot(&cfg.node, &taken, &homes) else {
                abandon(&client).await;
                return Err(ClusterError::NoFreeSlot);
            };
            rec.slot = slot;
            rec.lease = lease;
            let slot_key = keys.slot(slot);
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
            keys: keys.clone(),
            slot,
            lease,
            home_before,
            health: health.clone(),
            events: events.clone(),
            #[cfg(feature = "testing")]
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
            tokio::spawn(watch_task(client, keys, events)),
        ];
        *inner.tasks.lock() = tasks;
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
    #[cfg(feature = "testing")]
    pub fn pause_keepalive_for_test(&self, d: Duration) {
        *self.inner.pause_until.lock() = Some(Instant::now() + d);
    }

    pub(crate) fn keys(&self) -> &Keys {
        &self.inner.keys
    }

    pub(crate) fn vkey(&self, vol: &str, key: VolumeKey) -> String {
        self.inner.keys.volume(vol, key)
    }

    async fn op<T, F, Fut>(&self, what: &str, f: F) -> Result<T, ClusterError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        tracing::trace!("etcd request: {what}");
        retry(&self.inner.cfg, what, || f(self.inner.client.clone())).await
    }

    pub(crate) async fn get_one(&self, key: &str) -> Result<Option<KeyValue>, ClusterError> {
        let r = self
            .op(&format!("get {key}"), |mut c| {
                let k = key.to_string();
                async move { c.get(k, None).await }
            })
            .await?;
        Ok(r.kvs().first().cloned())
    }

    pub(crate) async fn get_prefix(&self, key: &str) -> Result<Vec<KeyValue>, ClusterError> {
        let r = self
            .op(&format!("get {key}*"), |mut c| {
                let k = key.to_string();
                async move { c.get(k, Some(GetOptions::new().with_prefix())).await }
            })
            .await?;
        Ok(r.kvs().to_vec())
    }

    pub(crate) async fn txn(
        &self,
        what: &str,
        txn: Txn,
    ) -> Result<etcd_client::TxnResponse, ClusterError> {
        self.op(what, |mut c| {
            let t = txn.clone();
            async move { c.txn(t).await }
        })
        .await
    }

    /// Every live node (their records are under their leases).
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>, ClusterError> {
        self.get_prefix(&self.inner.keys.nodes())
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
        let Some(kv) = self.get_one(&self.inner.keys.node(name)).await? else {
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
        self.create_spec_qos(spec, None).await
    }

    /// Creates `volumes/<v>/spec` with QoS limits `qos` (none: any limits
    /// a volume of that name left are cleared), in one transaction.
    pub async fn create_spec_qos(
        &self,
        spec: &VolumeSpec,
        qos: Option<&crate::QosSpec>,
    ) -> Result<(), ClusterError> {
        let key = self.vkey(&spec.name, VolumeKey::Spec);
        let txn = Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key.clone(), encode(spec), None),
                crate::qos::qos_op(self.vkey(&spec.name, VolumeKey::Qos), qos),
            ]);
        let r = self.txn(&format!("create {key}"), txn).await?;
        if r.succeeded() {
            return Ok(());
        }
        Err(ClusterError::VolumeExists(spec.name.clone()))
    }

    pub async fn specs(&self) -> Result<Vec<VolumeSpec>, ClusterError> {
        let keys = &self.inner.keys;
        self.get_prefix(&keys.volumes())
            .await?
            .iter()
            .filter(|kv| {
                let key = std::str::from_utf8(kv.key()).unwrap_or_default();
                matches!(
                    keys.parse(key),
                    Some(crate::keys::Key::Volume(_, VolumeKey::Spec))
                )
            })
            .map(decode)
            .collect()
    }

    /// Every volume with a spec, with its owner, state and handoff: one
    /// range read (a consistent snapshot), however many volumes there are.
    pub async fn volumes(&self) -> Result<Vec<VolumeRecord>, ClusterError> {
        let kvs = self.get_prefix(&self.inner.keys.volumes()).await?;
        let mut by_vol: std::collections::BTreeMap<&str, Vec<(VolumeKey, &KeyValue)>> =
            std::collections::BTreeMap::new();
        for kv in &kvs {
            let key = std::str::from_utf8(kv.key()).unwrap_or_default();
            if let Some(crate::keys::Key::Volume(v, k)) = self.inner.keys.parse(key) {
                by_vol.entry(v).or_default().push((k, kv));
            }
        }
        let mut out = Vec::new();
        for keys in by_vol.into_values() {
            let get = |want: VolumeKey| keys.iter().find(|(k, _)| *k == want).map(|(_, kv)| *kv);
            let Some(spec) = get(VolumeKey::Spec) else {
                continue;
            };
            out.push(VolumeRecord {
                spec: decode(spec)?,
                owner: get(VolumeKey::Owner).map(decode).transpose()?,
                state: get(VolumeKey::State).map(decode).transpose()?,
                handoff: get(VolumeKey::Handoff).map(decode).transpose()?,
            });
        }
        Ok(out)
    }

    pub async fn spec(&self, vol: &str) -> Result<Option<VolumeSpec>, ClusterError> {
        self.get_one(&self.vkey(vol, VolumeKey::Spec))
            .await?
            .as_ref()
            .map(decode)
            .transpose()
    }

    /// Deletes the volume's keys (spec, owner, state, handoff, epoch, qos;
    /// a pool's thin volumes and extent records), only
    /// while this node owns it at `epoch`.
    pub async fn delete_volume(&self, vol: &str, epoch: u64) -> Result<(), ClusterError> {
        let me = Owner {
            node: self.node().to_string(),
            epoch,
        };
        let txn = Txn::new()
            .when([Compare::value(
                self.vkey(vol, VolumeKey::Owner),
                CompareOp::Equal,
                encode(&me),
            )])
            .and_then(self.delete_ops(vol));
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

    /// Every key of volume `vol`, deleted.
    fn delete_ops(&self, vol: &str) -> Vec<TxnOp> {
        VolumeKey::ALL
            .map(|key| TxnOp::delete(self.vkey(vol, key), None))
            .into_iter()
            .chain(
                [
                    self.inner.keys.thins(vol),
                    self.inner.keys.extent_states(vol),
                ]
                .map(|prefix| {
                    TxnOp::delete(
                        prefix,
                        Some(etcd_client::DeleteOptions::new().with_prefix()),
                    )
                }),
            )
            .collect()
    }

    /// The first step of a delete: marks `spec` deleting, only while this
    /// node owns it at `epoch` and the spec still reads as `spec`. From
    /// then on no node takes the volume over or serves it (its drives are
    /// about to be wiped), and a delete on any node may finish it
    /// ([`Session::finish_delete`]). Returns the marked spec.
    pub async fn mark_deleting(
        &self,
        spec: &VolumeSpec,
        epoch: u64,
    ) -> Result<VolumeSpec, ClusterError> {
        let marked = VolumeSpec {
            deleting: true,
            ..spec.clone()
        };
        self.update_spec_with(spec, &marked, epoch, Vec::new())
            .await?;
        Ok(marked)
    }

    /// Takes back [`Session::mark_deleting`] for a delete refused before it
    /// changed anything.
    pub async fn unmark_deleting(
        &self,
        marked: &VolumeSpec,
        epoch: u64,
    ) -> Result<(), ClusterError> {
        let spec = VolumeSpec {
            deleting: false,
            ..marked.clone()
        };
        self.update_spec_with(marked, &spec, epoch, Vec::new())
            .await
    }

    /// Deletes the keys of a volume whose spec reads as `marked` (marked
    /// deleting), whoever owns it: the volume is condemned, so the etcd
    /// part of a delete that failed there may be finished by any node.
    /// Done already (no spec) is success.
    pub async fn finish_delete(&self, marked: &VolumeSpec) -> Result<(), ClusterError> {
        let vol = &marked.name;
        let key = self.vkey(vol, VolumeKey::Spec);
        let changed = || ClusterError::SpecChanged(vol.clone());
        let seen = match self.get_one(&key).await? {
            None => return Ok(()),
            Some(kv) if marked.deleting && decode::<VolumeSpec>(&kv)? == *marked => {
                kv.mod_revision()
            }
            Some(_) => return Err(changed()),
        };
        let txn = Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, seen)])
            .and_then(self.delete_ops(vol));
        match self
            .txn(&format!("finish deleting volume {vol}"), txn)
            .await?
            .succeeded()
        {
            true => Ok(()),
            false => Err(changed()),
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
        self.get_one(&self.vkey(vol, VolumeKey::Owner))
            .await?
            .as_ref()
            .map(decode)
            .transpose()
    }

    /// Deletes the owner key iff it is this node at `epoch`.
    pub async fn release(&self, vol: &str, epoch: u64) -> Result<bool, ClusterError> {
        let key = self.vkey(vol, VolumeKey::Owner);
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
                self.vkey(vol, VolumeKey::Owner),
                CompareOp::Equal,
                encode(&me),
            )])
            .and_then([TxnOp::put(
                self.vkey(vol, VolumeKey::State),
                encode(st),
                None,
            )]);
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
        self.get_one(&self.vkey(vol, VolumeKey::State))
            .await?
            .as_ref()
            .map(decode)
            .transpose()
    }

    /// Asks the owner of `h.epoch` to hand the volume over; `Deposed` if the
    /// owner is at another epoch, `NotOwned` if there is none.
    pub async fn set_handoff(&self, vol: &str, h: &Handoff) -> Result<(), ClusterError> {
        let owner_key = self.vkey(vol, VolumeKey::Owner);
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
                .and_then([TxnOp::put(
                    self.vkey(vol, VolumeKey::Handoff),
                    encode(h),
                    None,
                )]);
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
        self.get_one(&self.vkey(vol, VolumeKey::Handoff))
            .await?
            .as_ref()
            .map(decode)
            .transpose()
    }

    /// Removes handoff `h` of `vol`, done (its new owner serves it). Only
    /// `h`: a newer one (another move asked for since) stays.
    pub async fn clear_handoff(&self, vol: &str, h: &Handoff) -> Result<(), ClusterError> {
        let key = self.vkey(vol, VolumeKey::Handoff);
        let txn = Txn::new()
            .when([Compare::value(key.clone(), CompareOp::Equal, encode(h))])
            .and_then([TxnOp::delete(key.clone(), None)]);
        self.txn(&format!("delete {key}"), txn).await.map(|_| ())
    }

    /// Marks (or unmarks) `node` as draining; persistent, not leased.
    pub async fn set_drain(&self, node: &str, on: bool) -> Result<(), ClusterError> {
        let key = self.inner.keys.drain(node);
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
        let p = self.inner.keys.drains();
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
        for t in self.inner.tasks.lock().drain(..) {
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

impl Session {
    /// Undoes a join whose node then failed to start (it served nothing):
    /// leaves (its record and slot go with the lease) and gives
    /// `slot-home/<name>` back the value it had before the join, removing
    /// it when there was none. A home no host has seen is no one's to keep;
    /// one another join has rewritten since is left alone.
    pub async fn abandon(&self) {
        self.leave().await;
        let before = self.inner.home_before;
        if before == Some(self.inner.slot) {
            return;
        }
        let key = self.inner.keys.slot_home(&self.inner.cfg.node);
        let undo = match before {
            Some(s) => TxnOp::put(key.clone(), s.to_string(), None),
            None => TxnOp::delete(key.clone(), None),
        };
        let txn = Txn::new()
            .when([Compare::value(
                key.clone(),
                CompareOp::Equal,
                self.inner.slot.to_string(),
            )])
            .and_then([undo]);
        match self.txn(&format!("restore {key}"), txn).await {
            Ok(_) => tracing::info!(
                node = %self.inner.cfg.node,
                "start abandoned: {key} restored ({})",
                before.map_or("removed".to_string(), |s| format!("slot {s}"))
            ),
            Err(e) => tracing::warn!("start abandoned, but {key} stays: {e}"),
        }
    }
}

pub(crate) fn cntlid_range(slot: u16) -> (u16, u16) {
    let lo = (u32::from(slot) * 1024).max(1);
    let hi = (u32::from(slot) * 1024 + 1023).min(0xFFEF);
    (lo as u16, hi as u16)
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

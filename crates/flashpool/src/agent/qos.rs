//! QoS limits of cluster volumes and of the thin volumes of cluster pools.
//!
//! The limits follow the volume: they are kept in etcd
//! (`volumes/<v>/qos`, see `cluster::QosSpec`) and every node applies them
//! to its own namespace of the volume, owner and standby alike, so a node
//! that takes the volume over or receives it in a move enforces them from
//! its first command.
//!
//! Every node keeps what etcd says ([`QosTable::want`]) and the namespaces
//! it serves ([`QosTable::served`]): a namespace is made with the limits
//! already known, a watch event (which carries the value) changes them at
//! once without an etcd read, and every pass re-reads them in the range
//! read it makes of the specs anyway (a missed event, a restarted watch).
//!
//! Any node may change them: the change is one etcd transaction on the
//! key's mod revision (a concurrent change is recomputed, not lost), so it
//! needs neither the owner nor an owner at all (a takeover under way).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use cluster::{ClusterError, ClusterEvent, QosOf, QosSpec, QosWrite, Session};
use nvmf_target::qos::{NsQos, QosLimits};

use super::Agent;
use crate::api_types::{QosInfo, QosRequest};
use crate::events::{EventKind, NewEvent};
use crate::node::{NodeError, NodeResult, apply_request, describe_qos, qos_limits_info};

/// How many times a change is recomputed when another change came first.
const TRIES: usize = 5;

/// What this node knows of the cluster's limits, and where it applies them.
#[derive(Default)]
pub(super) struct QosTable {
    /// The limits etcd holds, by volume, and when this node learnt them
    /// (a pass's older read does not undo a newer change).
    want: HashMap<String, (QosLimits, Instant)>,
    /// The namespaces served here, by volume.
    served: HashMap<String, ServedNs>,
}

struct ServedNs {
    nqn: String,
    nsid: u32,
    qos: Arc<NsQos>,
}

impl QosTable {
    fn limits(&self, name: &str) -> QosLimits {
        self.want.get(name).map(|w| w.0).unwrap_or_default()
    }

    /// Applies `l` to `name`'s namespace, if served here and different.
    fn enforce(&self, name: &str, l: QosLimits) {
        if let Some(s) = self.served.get(name)
            && s.qos.limits() != l
        {
            s.qos.set(l);
            tracing::info!(
                "cluster volume {name}: QoS {} (nsid {} of {})",
                describe_qos(&l),
                s.nsid,
                s.nqn
            );
        }
    }
}

pub(super) fn limits_of(q: &QosSpec) -> QosLimits {
    QosLimits {
        iops: q.iops,
        read_iops: q.read_iops,
        write_iops: q.write_iops,
        bandwidth: q.bandwidth,
        read_bandwidth: q.read_bandwidth,
        write_bandwidth: q.write_bandwidth,
        burst_ms: q.burst_ms,
    }
}

pub(super) fn spec_of(l: &QosLimits) -> QosSpec {
    QosSpec {
        iops: l.iops,
        read_iops: l.read_iops,
        write_iops: l.write_iops,
        bandwidth: l.bandwidth,
        read_bandwidth: l.read_bandwidth,
        write_bandwidth: l.write_bandwidth,
        burst_ms: l.burst_ms,
    }
}

/// The limits a create asks for, checked before anything is made; `None`
/// when it asks for none.
pub(super) fn create_limits(req: Option<&QosRequest>) -> NodeResult<Option<QosLimits>> {
    let Some(r) = req else { return Ok(None) };
    let l = apply_request(QosLimits::default(), r)
        .map_err(|e| NodeError::BadRequest(format!("qos: {e}")))?;
    Ok((!l.is_unlimited()).then_some(l))
}

/// An etcd failure of a QoS call: unreachable is 503, nothing changed.
fn etcd(e: ClusterError) -> NodeError {
    match e {
        ClusterError::Etcd(m) => NodeError::Unavailable(format!(
            "the cluster state (etcd) cannot be reached: {m}; nothing was changed, retry"
        )),
        e => NodeError::Internal(format!("cluster state (etcd): {e}; nothing was changed")),
    }
}

/// What a name is in the cluster, for QoS.
enum Kind {
    /// A cluster pool: not served itself.
    Pool,
    Served(QosOf),
}

fn info(name: &str, l: &QosLimits, throttled: (std::time::Duration, u64)) -> QosInfo {
    QosInfo {
        volume: name.to_string(),
        limits: qos_limits_info(l),
        unlimited: l.is_unlimited(),
        throttled_seconds: throttled.0.as_secs_f64(),
        throttled_commands: throttled.1,
    }
}

impl Agent {
    /// The limits for the namespace of `name` about to be served here as
    /// `nsid` of `nqn`: give them to it (`Namespace::with_qos`).
    pub(super) fn ns_qos(&self, name: &str, nqn: &str, nsid: u32) -> Arc<NsQos> {
        let mut t = self.qos.lock();
        let q = Arc::new(NsQos::new(t.limits(name)));
        t.served.insert(
            name.to_string(),
            ServedNs {
                nqn: nqn.to_string(),
                nsid,
                qos: q.clone(),
            },
        );
        q
    }

    /// `name`'s namespace is no longer served here.
    pub(super) fn qos_unserved(&self, name: &str) {
        self.qos.lock().served.remove(name);
    }

    /// A watch event about limits, applied at once; `false` for any other.
    pub(super) fn qos_event(&self, e: &ClusterEvent) -> bool {
        match e {
            ClusterEvent::QosSet(v, q) => self.qos_learnt(v, limits_of(q)),
            ClusterEvent::QosCleared(v) => self.qos_learnt(v, QosLimits::default()),
            _ => return false,
        }
        true
    }

    /// `name`'s limits are `l` (etcd said so, or this node wrote them).
    pub(super) fn qos_learnt(&self, name: &str, l: QosLimits) {
        let mut t = self.qos.lock();
        t.want.insert(name.to_string(), (l, Instant::now()));
        t.enforce(name, l);
    }

    /// Every limit etcd held when a pass read it (at `read_at` or after):
    /// what this node learnt since is newer and stays.
    pub(super) fn qos_sync(&self, all: BTreeMap<String, QosSpec>, read_at: Instant) {
        let mut t = self.qos.lock();
        let stale = |t: &QosTable, n: &str| t.want.get(n).is_none_or(|w| w.1 <= read_at);
        let gone: Vec<String> = t
            .want
            .keys()
            .filter(|n| !all.contains_key(*n))
            .cloned()
            .collect();
        for n in gone {
            if stale(&t, &n) {
                t.want.remove(&n);
                t.enforce(&n, QosLimits::default());
            }
        }
        for (n, q) in all {
            if stale(&t, &n) {
                let l = limits_of(&q);
                t.want.insert(n.clone(), (l, read_at));
                t.enforce(&n, l);
            }
        }
    }

    /// The namespaces served here, as (nqn, nsid, volume), for the labels
    /// of their metrics.
    pub(super) fn qos_namespaces(&self) -> Vec<(String, u32, String)> {
        self.qos
            .lock()
            .served
            .iter()
            .map(|(n, s)| (s.nqn.clone(), s.nsid, n.clone()))
            .collect()
    }

    async fn qos_kind(&self, s: &Session, name: &str) -> NodeResult<Option<Kind>> {
        if let Some(spec) = s.spec(name).await.map_err(etcd)? {
            return Ok(Some(if spec.thin_pool {
                Kind::Pool
            } else {
                Kind::Served(QosOf::Volume)
            }));
        }
        Ok(s.pool_of(name)
            .await
            .map_err(etcd)?
            .map(|p| Kind::Served(QosOf::Thin(p))))
    }

    /// `GET /v1/volumes/{name}/qos` of a cluster volume or thin volume:
    /// the limits its namespace here enforces, and how long it held
    /// commands here (on a standby node: none). `None`: not one of them.
    pub async fn volume_qos(&self, name: &str) -> NodeResult<Option<QosInfo>> {
        if let Some(i) = self.served_qos(name) {
            return Ok(Some(i));
        }
        // The node's own volumes (and a pool owned here) answer without etcd.
        if let Ok(i) = self.node.volume_qos(name).await {
            return Ok(Some(i));
        }
        // Not served here yet: as etcd has it.
        let s = self.session();
        match self.qos_kind(&s, name).await? {
            None => Ok(None),
            Some(Kind::Pool) => Ok(Some(info(name, &QosLimits::default(), Default::default()))),
            Some(Kind::Served(_)) => {
                let (q, _) = s.qos(name).await.map_err(etcd)?;
                Ok(Some(info(name, &limits_of(&q), Default::default())))
            }
        }
    }

    fn served_qos(&self, name: &str) -> Option<QosInfo> {
        let t = self.qos.lock();
        let q = &t.served.get(name)?.qos;
        Some(info(name, &q.limits(), q.throttled()))
    }

    /// `POST /v1/volumes/{name}/qos` of a cluster volume or thin volume,
    /// on any node: checked whole, recorded in etcd (from where every node
    /// applies it), applied here at once, told as `qos_changed`. `None`:
    /// not one of them (the node's own volume). A refusal changes nothing.
    pub async fn set_volume_qos(&self, name: &str, req: QosRequest) -> NodeResult<Option<QosInfo>> {
        let s = self.session();
        let of = match self.qos_kind(&s, name).await {
            Ok(None) => return Ok(None),
            Ok(Some(Kind::Pool)) => {
                return Err(NodeError::BadRequest(format!(
                    "volume {name} is a cluster pool, which is not served itself; set QoS on \
                     its thin volumes"
                )));
            }
            Ok(Some(Kind::Served(of))) => of,
            // etcd unreachable: the node's own volumes need no etcd.
            Err(e) => {
                let cluster = self.qos.lock().served.contains_key(name);
                if !cluster && self.node.volume(name).await.is_ok() {
                    return Ok(None);
                }
                return Err(e);
            }
        };
        for _ in 0..TRIES {
            let (cur, seen) = s.qos(name).await.map_err(etcd)?;
            let old = limits_of(&cur);
            let new = apply_request(old, &req)?;
            if new == old {
                return Ok(Some(self.answer(name, &new)));
            }
            match s.set_qos(name, &of, &spec_of(&new), seen).await {
                Ok(QosWrite::Done) => {
                    self.qos_learnt(name, new);
                    self.tell_qos(name, &old, &new);
                    return Ok(Some(self.answer(name, &new)));
                }
                Ok(QosWrite::Changed) => continue,
                Ok(QosWrite::Gone) => {
                    return Err(NodeError::NotFound(format!(
                        "no cluster volume {name} (deleted meanwhile); nothing was changed"
                    )));
                }
                Err(e) => return Err(etcd(e)),
            }
        }
        Err(NodeError::Conflict(format!(
            "the limits of {name} were changed by others {TRIES} times while this change was \
             made; nothing was changed, retry"
        )))
    }

    fn answer(&self, name: &str, l: &QosLimits) -> QosInfo {
        self.served_qos(name)
            .unwrap_or_else(|| info(name, l, Default::default()))
    }

    /// A change of `name`'s limits, made through this node.
    pub(super) fn tell_qos(&self, name: &str, old: &QosLimits, new: &QosLimits) {
        self.node.events.emit(
            NewEvent::new(
                EventKind::QosChanged,
                format!(
                    "cluster volume {name}: QoS {} (was {}), for every node, set through {}",
                    describe_qos(new),
                    describe_qos(old),
                    self.name()
                ),
            )
            .volume(name)
            .node(self.name()),
        );
    }
}

//! QoS limits of cluster volumes and of the thin volumes of cluster pools:
//! `volumes/<v>/qos`, one key per served volume (thin volumes' names are
//! unique across the cluster, so they share the layout).
//!
//! The limits are a key of their own, not a field of the spec: specs are
//! written once (a volume's) or only by the pool's owner at its epoch (a
//! thin volume's, rewritten when it grows), while the limits change at any
//! time, from any node, even while the volume has no owner. A change is
//! one transaction that compares the key's mod revision with the one the
//! change was computed from (a concurrent change is not lost) and that the
//! volume still exists; the watch carries the new value to every node, and
//! the agent's full pass reads it in the same range read as the specs.

use std::collections::BTreeMap;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use crate::etcd::{decode, encode};
use crate::keys::{Key, VolumeKey};
use crate::{ClusterError, Handoff, Owner, Session, VolumeRead, VolumeSpec, VolumeState};

/// `volumes/<v>/qos`: a served volume's limits (0: none), as every node
/// applies them to its namespace. No key: unlimited.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QosSpec {
    /// Commands per second, reads and writes together.
    #[serde(default)]
    pub iops: u64,
    #[serde(default)]
    pub read_iops: u64,
    #[serde(default)]
    pub write_iops: u64,
    /// Bytes per second, reads and writes together.
    #[serde(default)]
    pub bandwidth: u64,
    #[serde(default)]
    pub read_bandwidth: u64,
    #[serde(default)]
    pub write_bandwidth: u64,
    /// 0: the default burst.
    #[serde(default)]
    pub burst_ms: u32,
}

impl QosSpec {
    /// No limit set (the key is then deleted, not written).
    pub fn is_unlimited(&self) -> bool {
        [
            self.iops,
            self.read_iops,
            self.write_iops,
            self.bandwidth,
            self.read_bandwidth,
            self.write_bandwidth,
        ]
        .iter()
        .all(|&r| r == 0)
    }
}

/// Which kind of volume the limits are for: what must still exist when
/// they are written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QosOf {
    /// A cluster volume (`volumes/<v>/spec`).
    Volume,
    /// A thin volume of cluster pool `.0` (`volumes/<pool>/thin/<t>`).
    Thin(String),
}

/// How [`Session::set_qos`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QosWrite {
    /// Written (or deleted, when unlimited).
    Done,
    /// Another change came first: read again and recompute.
    Changed,
    /// The volume is gone: nothing was written.
    Gone,
}

impl Session {
    /// `vol`'s limits and the key's mod revision (0: no key, unlimited).
    pub async fn qos(&self, vol: &str) -> Result<(QosSpec, i64), ClusterError> {
        match self.get_one(&self.vkey(vol, VolumeKey::Qos)).await? {
            Some(kv) => Ok((decode(&kv)?, kv.mod_revision())),
            None => Ok((QosSpec::default(), 0)),
        }
    }

    /// Sets `vol`'s limits to `q` if the key is still at mod revision
    /// `seen` (from [`Session::qos`]) and the volume exists; any node may.
    pub async fn set_qos(
        &self,
        vol: &str,
        of: &QosOf,
        q: &QosSpec,
        seen: i64,
    ) -> Result<QosWrite, ClusterError> {
        let key = self.vkey(vol, VolumeKey::Qos);
        let exists = match of {
            QosOf::Volume => self.vkey(vol, VolumeKey::Spec),
            QosOf::Thin(pool) => self.keys().thin(pool, vol),
        };
        let txn = Txn::new()
            .when([
                Compare::mod_revision(key.clone(), CompareOp::Equal, seen),
                Compare::version(exists.clone(), CompareOp::Greater, 0),
            ])
            .and_then([qos_op(key, Some(q))])
            .or_else([TxnOp::get(exists, None)]);
        let r = self
            .txn(&format!("set the QoS limits of {vol}"), txn)
            .await?;
        if r.succeeded() {
            return Ok(QosWrite::Done);
        }
        let gone = crate::etcd::txn_gets(&r)
            .first()
            .is_none_or(|g| g.is_empty());
        Ok(if gone {
            QosWrite::Gone
        } else {
            QosWrite::Changed
        })
    }

    /// Every volume's spec and every limit set: one range read (the one
    /// the agent's pass makes anyway). A limit that cannot be decoded is
    /// left out (logged): it must not stop the pass.
    pub async fn specs_and_qos(
        &self,
    ) -> Result<(Vec<VolumeSpec>, BTreeMap<String, QosSpec>), ClusterError> {
        let v = self.pass_view().await?;
        Ok((v.specs, v.qos))
    }

    /// What a pass over every volume needs, from one range read: the specs,
    /// the limits (as [`Session::specs_and_qos`]), each owner, and which
    /// volumes have a handoff. The agent settles only the volumes whose
    /// owner and handoff this shows changed from what it runs.
    pub async fn pass_view(&self) -> Result<PassView, ClusterError> {
        let keys = self.keys();
        let kvs = self.get_prefix(&keys.volumes()).await?;
        let mut v = PassView::default();
        let mut parts: BTreeMap<&str, ReadParts> = BTreeMap::new();
        for kv in &kvs {
            let key = std::str::from_utf8(kv.key()).unwrap_or_default();
            let Some(Key::Volume(n, k)) = keys.parse(key) else {
                continue;
            };
            let part = parts.entry(n).or_default();
            match k {
                VolumeKey::Spec => {
                    let spec: VolumeSpec = decode(kv)?;
                    part.spec = Some(spec.deleting);
                    v.specs.push(spec);
                }
                VolumeKey::Qos => match decode(kv) {
                    Ok(q) => {
                        v.qos.insert(n.to_string(), q);
                    }
                    Err(e) => tracing::warn!("ignoring QoS limits: {e}"),
                },
                VolumeKey::Owner => {
                    let o: Owner = decode(kv)?;
                    part.owner = Some(o.clone());
                    v.owners.insert(n.to_string(), o);
                }
                VolumeKey::Handoff => {
                    v.handoffs.insert(n.to_string());
                    part.handoff = Some(decode(kv));
                }
                VolumeKey::State => part.state = Some(decode(kv)),
                VolumeKey::Epoch => part.epoch = Some(kv),
            }
        }
        // Each volume's keys as `read_volume` reads them, from the same
        // snapshot; a volume whose handoff, record or epoch does not decode
        // gets none (its settle reads it again, and fails alone).
        for (n, p) in parts {
            if let Some(deleting) = p.spec
                && let Ok(r) = p.read(deleting)
            {
                v.reads.insert(n.to_string(), r);
            }
        }
        Ok(v)
    }
}

/// One volume's keys in [`Session::pass_view`]'s range, gathered.
#[derive(Default)]
struct ReadParts<'a> {
    spec: Option<bool>,
    owner: Option<Owner>,
    handoff: Option<Result<Handoff, ClusterError>>,
    state: Option<Result<VolumeState, ClusterError>>,
    epoch: Option<&'a etcd_client::KeyValue>,
}

impl ReadParts<'_> {
    fn read(self, deleting: bool) -> Result<VolumeRead, ClusterError> {
        VolumeRead::new(
            self.owner,
            self.handoff.transpose()?,
            self.state.transpose()?,
            deleting,
            self.epoch,
        )
    }
}

/// [`Session::pass_view`]: one consistent read of every volume's keys.
#[derive(Debug, Default)]
pub struct PassView {
    pub specs: Vec<VolumeSpec>,
    pub qos: BTreeMap<String, QosSpec>,
    pub owners: BTreeMap<String, Owner>,
    /// Volumes with a planned move recorded.
    pub handoffs: std::collections::BTreeSet<String>,
    /// Every volume with a spec (but one whose handoff, record or epoch key
    /// does not decode): its keys as [`Session::read_volume`] reads them,
    /// at this view's revision (a settle that starts at once may
    /// decide on it instead of reading its keys again: `agent/runner.rs`).
    pub reads: BTreeMap<String, VolumeRead>,
}

/// The op that leaves `key` holding `q`: a put, or a delete when `q` is
/// unlimited or absent (a new volume starts with no stale limits).
pub(crate) fn qos_op(key: String, q: Option<&QosSpec>) -> TxnOp {
    match q.filter(|q| !q.is_unlimited()) {
        Some(q) => TxnOp::put(key, encode(q), None),
        None => TxnOp::delete(key, None),
    }
}

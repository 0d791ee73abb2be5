//! Drives taken for a change in progress: `drive-claims/<drive>`, under the
//! taking node's lease. A create, a pool's grow by an extent and a member's
//! replace each check that no volume's spec names their new drives, and
//! only later record a spec that does: two such changes could both pass
//! the check and write their superblocks over each other. Each takes its
//! drives here first, then checks the specs, then records its spec, then
//! lets go: of two changes on one drive the second either meets the
//! first's key or, taking it after the first let go, reads the first's
//! spec. The finish of a delete takes them too, before it wipes.
//!
//! Each take writes a value of its own (`<volume>@<node>#<take>`), so a
//! second change of the same volume on the same node (a client's retry
//! while the first still runs) is refused like any other, and a release
//! removes only what its own take wrote. The keys die with the node's
//! lease: a node that stopped mid-change holds no drive past its lease.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};

use crate::{ClusterError, Session};

/// Tells this process's takes apart (with the lease, which tells nodes and
/// their restarts apart).
static TAKES: AtomicU64 = AtomicU64::new(0);

/// Drives held by one take: what [`Session::release_drives`] lets go of.
#[derive(Clone, Debug)]
pub struct DriveTake {
    urls: Vec<String>,
    value: String,
}

impl DriveTake {
    pub fn urls(&self) -> &[String] {
        &self.urls
    }
}

impl Session {
    /// Takes drives `urls` for a change of volume `what`, all or none:
    /// `DriveTaken` naming the first that another change holds, nothing
    /// taken then. A drive listed twice is taken once.
    pub async fn take_drives(
        &self,
        urls: &[String],
        what: &str,
    ) -> Result<DriveTake, ClusterError> {
        let urls: Vec<String> = urls
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let keys: Vec<String> = urls.iter().map(|u| self.keys().drive_claim(u)).collect();
        let n = TAKES.fetch_add(1, Ordering::Relaxed);
        let value = format!("{what}@{}#{:x}.{n}", self.node(), self.lease_id());
        // Keys this take wrote already (a transaction that went through
        // but whose answer was lost, then retried), at their revisions.
        let mut mine: HashMap<&str, i64> = HashMap::new();
        for _ in 0..8 {
            let when: Vec<Compare> = keys
                .iter()
                .map(|k| match mine.get(k.as_str()) {
                    Some(&rev) => Compare::mod_revision(k.clone(), CompareOp::Equal, rev),
                    None => Compare::create_revision(k.clone(), CompareOp::Equal, 0),
                })
                .collect();
            let put = PutOptions::new().with_lease(self.lease_id());
            let txn = Txn::new()
                .when(when)
                .and_then(
                    keys.iter()
                        .filter(|k| !mine.contains_key(k.as_str()))
                        .map(|k| TxnOp::put(k.clone(), value.clone(), Some(put.clone())))
                        .collect::<Vec<_>>(),
                )
                .or_else(
                    keys.iter()
                        .map(|k| TxnOp::get(k.clone(), None))
                        .collect::<Vec<_>>(),
                );
            let r = self.txn(&format!("take drives for {what}"), txn).await?;
            if r.succeeded() {
                return Ok(DriveTake { urls, value });
            }
            mine.clear();
            for ((url, k), op) in urls.iter().zip(&keys).zip(r.op_responses()) {
                let TxnOpResponse::Get(g) = op else { continue };
                let Some(kv) = g.kvs().first() else { continue };
                let by = kv.value_str().unwrap_or("?");
                if by != value {
                    let by = by.split_once('#').map_or(by, |(b, _)| b);
                    let (by, node) = by.rsplit_once('@').unwrap_or((by, "?"));
                    return Err(ClusterError::DriveTaken {
                        drive: url.clone(),
                        by: by.to_string(),
                        node: node.to_string(),
                    });
                }
                mine.insert(k.as_str(), kv.mod_revision());
            }
        }
        Err(ClusterError::SpecChanged(format!(
            "{what} (its drives {} changed under every try to take them)",
            urls.join(", ")
        )))
    }

    /// Lets go of the drives of `take`, each that it still holds (one
    /// another change holds now is left to it). Tries every drive; the
    /// first error, if any.
    pub async fn release_drives(&self, take: &DriveTake) -> Result<(), ClusterError> {
        let mut first = None;
        for url in &take.urls {
            let k = self.keys().drive_claim(url);
            let txn = Txn::new()
                .when([Compare::value(
                    k.clone(),
                    CompareOp::Equal,
                    take.value.clone(),
                )])
                .and_then([TxnOp::delete(k, None)]);
            if let Err(e) = self.txn(&format!("release drive {url}"), txn).await {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

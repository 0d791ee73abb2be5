//! Drives taken for a change in progress: `drive-claims/<drive>`, under the
//! taking node's lease. A create, a pool's grow by an extent and a member's
//! replace each check that no volume's spec names their new drives, and
//! only later record a spec that does: two such changes on two nodes could
//! both pass the check and write their superblocks over each other. Each
//! takes its drives here first, then checks the specs, then records its
//! spec, then lets go: of two changes on one drive the second either meets
//! the first's key or, taking it after the first let go, reads the first's
//! spec. The key dies with its node's lease, so a node that stopped
//! mid-change holds no drive for longer than its lease.

use std::collections::HashMap;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};

use crate::{ClusterError, Session};

impl Session {
    /// Takes drives `urls` for `what` (a volume's name: what the error of a
    /// change that meets them names), all or none: `DriveTaken` naming the
    /// first taken by another change, nothing taken then. A drive this
    /// node took for the same `what` is taken again (a retry).
    pub async fn take_drives(&self, urls: &[String], what: &str) -> Result<(), ClusterError> {
        let keys: Vec<String> = urls.iter().map(|u| self.keys().drive_claim(u)).collect();
        let value = format!("{what}@{}", self.node());
        // The revision of each key this change holds already (a retry), as
        // last read: kept as it is; every other key must be absent.
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
                return Ok(());
            }
            mine.clear();
            for ((url, k), op) in urls.iter().zip(&keys).zip(r.op_responses()) {
                let TxnOpResponse::Get(g) = op else { continue };
                let Some(kv) = g.kvs().first() else { continue };
                let by = kv.value_str().unwrap_or("?");
                if by != value || kv.lease() != self.lease_id() {
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
        Err(ClusterError::Etcd(format!(
            "drives {} for {what}: changed under every try to take them; retry",
            urls.join(", ")
        )))
    }

    /// Lets go of drives `urls` taken for `what` (a drive another change
    /// holds now is left to it).
    pub async fn release_drives(&self, urls: &[String], what: &str) -> Result<(), ClusterError> {
        let value = format!("{what}@{}", self.node());
        for url in urls {
            let k = self.keys().drive_claim(url);
            let txn = Txn::new()
                .when([Compare::value(k.clone(), CompareOp::Equal, value.clone())])
                .and_then([TxnOp::delete(k, None)]);
            self.txn(&format!("release drive {url} of {what}"), txn)
                .await?;
        }
        Ok(())
    }
}

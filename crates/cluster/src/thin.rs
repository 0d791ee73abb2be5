//! The thin volumes of cluster pools: their specs under
//! `volumes/<pool>/thin/`, written only by the pool's owner, each with its
//! name (`names/`) and namespace ID (`nsids/`) claimed in the same
//! transaction, so that two owners of two pools can never hand out the
//! same name or NSID.

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use crate::etcd::{decode, encode};
use crate::keys::VolumeKey;
use crate::{ClusterError, Owner, Session, ThinSpec};

impl Session {
    /// The thin volumes of cluster pool `pool`: one range read.
    pub async fn thin_specs(&self, pool: &str) -> Result<Vec<ThinSpec>, ClusterError> {
        self.get_prefix(&self.keys().thins(pool))
            .await?
            .iter()
            .map(decode)
            .collect()
    }

    /// Which pool holds thin volume `name`, if any.
    pub async fn pool_of(&self, name: &str) -> Result<Option<String>, ClusterError> {
        self.get_one(&self.keys().thin_name(name))
            .await?
            .as_ref()
            .map(decode)
            .transpose()
    }

    /// Records thin volume `t` of the pool this node owns at `pool_epoch`,
    /// served as `t.nsid` of `nqn` (none claimed for NSID 0: not served). Refused (nothing written) when the pool
    /// changed owner (`Deposed`), the name is taken by a volume or another
    /// thin volume (`VolumeExists`), or the NSID is (`NsidTaken`).
    pub async fn create_thin(
        &self,
        t: &ThinSpec,
        nqn: &str,
        pool_epoch: u64,
    ) -> Result<(), ClusterError> {
        self.create_thin_qos(t, nqn, pool_epoch, None).await
    }

    /// [`Session::create_thin`] with QoS limits `qos` recorded in the same
    /// transaction (none: any limits a volume of that name left are cleared).
    pub async fn create_thin_qos(
        &self,
        t: &ThinSpec,
        nqn: &str,
        pool_epoch: u64,
        qos: Option<&crate::QosSpec>,
    ) -> Result<(), ClusterError> {
        let keys = self.keys();
        let me = Owner {
            node: self.node().to_string(),
            epoch: pool_epoch,
        };
        let owner_key = self.vkey(&t.pool, VolumeKey::Owner);
        let name_key = keys.thin_name(&t.name);
        let nsid_key = keys.nsid(nqn, t.nsid);
        let spec_key = self.vkey(&t.name, VolumeKey::Spec);
        let mut when = vec![
            Compare::value(owner_key.clone(), CompareOp::Equal, encode(&me)),
            Compare::version(name_key.clone(), CompareOp::Equal, 0),
            Compare::version(spec_key.clone(), CompareOp::Equal, 0),
        ];
        let mut then = vec![
            TxnOp::put(keys.thin(&t.pool, &t.name), encode(t), None),
            TxnOp::put(name_key.clone(), encode(&t.pool), None),
            crate::qos::qos_op(self.vkey(&t.name, VolumeKey::Qos), qos),
            // a new thin volume starts with no host reservations
            TxnOp::delete(keys.thin_resv(&t.pool, &t.name), None),
        ];
        // NSID 0 (a snapshot not served) claims no NSID.
        if t.nsid != 0 {
            when.push(Compare::version(nsid_key.clone(), CompareOp::Equal, 0));
            then.push(TxnOp::put(nsid_key.clone(), encode(&t.name), None));
        }
        let txn = Txn::new().when(when).and_then(then).or_else([
            TxnOp::get(owner_key, None),
            TxnOp::get(name_key, None),
            TxnOp::get(spec_key, None),
            TxnOp::get(nsid_key, None),
        ]);
        let r = self
            .txn(&format!("create thin volume {}", t.name), txn)
            .await?;
        if r.succeeded() {
            return Ok(());
        }
        let gets = crate::etcd::txn_gets(&r);
        let found = |i: usize| gets.get(i).and_then(|g| g.first());
        let owner_ok = found(0)
            .map(decode::<Owner>)
            .transpose()?
            .is_some_and(|o| o == me);
        if !owner_ok {
            return Err(ClusterError::Deposed {
                volume: t.pool.clone(),
                epoch: pool_epoch,
            });
        }
        if found(1).is_some() || found(2).is_some() {
            return Err(ClusterError::VolumeExists(t.name.clone()));
        }
        Err(ClusterError::NsidTaken {
            nqn: nqn.to_string(),
            nsid: t.nsid,
        })
    }

    /// Rewrites thin volume `t` (its size grew), while this node owns its
    /// pool at `pool_epoch` and the thin volume is recorded.
    pub async fn update_thin(&self, t: &ThinSpec, pool_epoch: u64) -> Result<(), ClusterError> {
        let key = self.keys().thin(&t.pool, &t.name);
        let txn = Txn::new()
            .when([
                self.owned_at(&t.pool, pool_epoch),
                Compare::version(key.clone(), CompareOp::Greater, 0),
            ])
            .and_then([TxnOp::put(key, encode(t), None)]);
        self.guarded(
            &format!("update thin volume {}", t.name),
            txn,
            t,
            pool_epoch,
        )
        .await
    }

    /// Serves recorded thin volume `old` as `nsid` of `nqn` from now on (0:
    /// served by none), freeing its old NSID and claiming the new one in
    /// one transaction, while this node owns its pool at `pool_epoch` and
    /// the record is still `old`. Refused (nothing written) when the pool
    /// changed owner (`Deposed`), the record changed meanwhile
    /// (`ThinChanged`), or the NSID is taken (`NsidTaken`). The new record.
    pub async fn set_thin_nsid(
        &self,
        old: &ThinSpec,
        nqn: &str,
        nsid: u32,
        pool_epoch: u64,
    ) -> Result<ThinSpec, ClusterError> {
        let keys = self.keys();
        let key = keys.thin(&old.pool, &old.name);
        let new = ThinSpec {
            nsid,
            ..old.clone()
        };
        let new_key = keys.nsid(nqn, nsid);
        // From the revision that reads as `old` (its bytes may be of an
        // older version's encoding).
        let seen = match self.get_one(&key).await? {
            Some(kv) if decode::<ThinSpec>(&kv)? == *old => kv.mod_revision(),
            _ => return Err(ClusterError::ThinChanged(old.name.clone())),
        };
        let mut when = vec![
            self.owned_at(&old.pool, pool_epoch),
            Compare::mod_revision(key.clone(), CompareOp::Equal, seen),
        ];
        let mut then = vec![TxnOp::put(key.clone(), encode(&new), None)];
        if old.nsid != 0 {
            then.push(TxnOp::delete(keys.nsid(nqn, old.nsid), None));
        }
        if nsid != 0 {
            when.push(Compare::version(new_key.clone(), CompareOp::Equal, 0));
            then.push(TxnOp::put(new_key.clone(), encode(&new.name), None));
        }
        let txn = Txn::new().when(when).and_then(then).or_else([
            TxnOp::get(self.vkey(&old.pool, VolumeKey::Owner), None),
            TxnOp::get(key, None),
        ]);
        let r = self
            .txn(
                &format!("serve thin volume {} as nsid {nsid}", old.name),
                txn,
            )
            .await?;
        if r.succeeded() {
            return Ok(new);
        }
        let gets = crate::etcd::txn_gets(&r);
        let found = |i: usize| gets.get(i).and_then(|g| g.first());
        let me = Owner {
            node: self.node().to_string(),
            epoch: pool_epoch,
        };
        if !found(0)
            .map(decode::<Owner>)
            .transpose()?
            .is_some_and(|o| o == me)
        {
            return Err(ClusterError::Deposed {
                volume: old.pool.clone(),
                epoch: pool_epoch,
            });
        }
        if found(1).map(|kv| kv.mod_revision()) != Some(seen) {
            return Err(ClusterError::ThinChanged(old.name.clone()));
        }
        Err(ClusterError::NsidTaken {
            nqn: nqn.to_string(),
            nsid,
        })
    }

    /// Deletes thin volume `t` (and frees its name and NSID, and drops its
    /// QoS limits and host reservations), while this node owns its pool at `pool_epoch`.
    pub async fn delete_thin(
        &self,
        t: &ThinSpec,
        nqn: &str,
        pool_epoch: u64,
    ) -> Result<(), ClusterError> {
        let keys = self.keys();
        let mut ops = vec![
            TxnOp::delete(keys.thin(&t.pool, &t.name), None),
            TxnOp::delete(keys.thin_name(&t.name), None),
            TxnOp::delete(self.vkey(&t.name, VolumeKey::Qos), None),
            TxnOp::delete(keys.thin_resv(&t.pool, &t.name), None),
        ];
        if t.nsid != 0 {
            ops.push(TxnOp::delete(keys.nsid(nqn, t.nsid), None));
        }
        let txn = Txn::new()
            .when([self.owned_at(&t.pool, pool_epoch)])
            .and_then(ops);
        self.guarded(
            &format!("delete thin volume {}", t.name),
            txn,
            t,
            pool_epoch,
        )
        .await
    }

    /// The host reservation records of pool `pool`'s thin volumes, by
    /// thin volume name: one range read (a takeover or move of the pool
    /// loads them all before its namespaces turn Optimized).
    pub async fn thin_resvs(
        &self,
        pool: &str,
    ) -> Result<std::collections::BTreeMap<String, Vec<u8>>, ClusterError> {
        let prefix = self.keys().thin_resvs(pool);
        Ok(self
            .get_prefix(&prefix)
            .await?
            .iter()
            .filter_map(|kv| {
                let k = std::str::from_utf8(kv.key()).ok()?;
                Some((k.strip_prefix(&prefix)?.to_string(), kv.value().to_vec()))
            })
            .collect())
    }

    /// Stores thin volume `thin`'s host reservation record, only while this
    /// node owns its pool `pool` at `pool_epoch` (`Deposed` otherwise,
    /// nothing written): a deposed owner cannot change what the next one
    /// loads, as the members' reservations keep it from the data.
    pub async fn put_thin_resv(
        &self,
        pool: &str,
        thin: &str,
        pool_epoch: u64,
        record: &[u8],
    ) -> Result<(), ClusterError> {
        let txn = Txn::new()
            .when([self.owned_at(pool, pool_epoch)])
            .and_then([TxnOp::put(
                self.keys().thin_resv(pool, thin),
                record.to_vec(),
                None,
            )]);
        if self
            .txn(
                &format!("store the reservations of thin volume {thin}"),
                txn,
            )
            .await?
            .succeeded()
        {
            Ok(())
        } else {
            Err(ClusterError::Deposed {
                volume: pool.to_string(),
                epoch: pool_epoch,
            })
        }
    }

    /// The NSIDs of `nqn` that thin volumes hold.
    pub async fn thin_nsids(&self, nqn: &str) -> Result<Vec<u32>, ClusterError> {
        let prefix = self.keys().nsid(nqn, 0);
        let prefix = prefix.trim_end_matches('0');
        Ok(self
            .get_prefix(prefix)
            .await?
            .iter()
            .filter_map(|kv| {
                let k = std::str::from_utf8(kv.key()).ok()?;
                k.strip_prefix(prefix)?.parse().ok()
            })
            .collect())
    }

    pub(crate) fn owned_at(&self, pool: &str, epoch: u64) -> Compare {
        let me = Owner {
            node: self.node().to_string(),
            epoch,
        };
        Compare::value(
            self.vkey(pool, VolumeKey::Owner),
            CompareOp::Equal,
            encode(&me),
        )
    }

    async fn guarded(
        &self,
        what: &str,
        txn: Txn,
        t: &ThinSpec,
        pool_epoch: u64,
    ) -> Result<(), ClusterError> {
        if self.txn(what, txn).await?.succeeded() {
            Ok(())
        } else {
            Err(ClusterError::Deposed {
                volume: t.pool.clone(),
                epoch: pool_epoch,
            })
        }
    }
}

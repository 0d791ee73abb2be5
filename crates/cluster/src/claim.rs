//! Claiming a volume: the one read a decision needs, and the claim.
//!
//! A takeover used to read the owner key, then the handoff key, then (in
//! the claim) the owner and epoch keys again, then after the claim the
//! member-state record: five round trips to etcd in a row, each one queued
//! behind every other volume's when a survivor takes dozens at once.
//! [`Session::read_volume`] reads the four keys in one transaction, at one
//! revision; [`Session::claim_from`] claims on that read, and when its
//! transaction succeeds the read's state record is still the current one:
//! the claim compares the epoch key's revision, so no node owned the
//! volume in between, and only an owner writes the record
//! ([`Session::put_state`]). Two round trips instead of five.

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp};

use crate::etcd::{decode, encode, txn_gets};
use crate::keys::VolumeKey;
use crate::{ClusterError, Handoff, Owner, Session, VolumeSpec, VolumeState};

/// One volume's owner, handoff, state record and epoch, read at one
/// revision by [`Session::read_volume`].
#[derive(Clone, Debug, PartialEq)]
pub struct VolumeRead {
    pub owner: Option<Owner>,
    pub handoff: Option<Handoff>,
    pub state: Option<VolumeState>,
    /// The spec, read in the same transaction, is marked deleting (a pass
    /// that listed the specs earlier may not know yet).
    pub deleting: bool,
    /// The last epoch handed out, and the epoch key's mod revision (0: none).
    epoch: (u64, i64),
}

impl VolumeRead {
    /// From the keys read at one revision; `epoch`: the epoch key's.
    pub(crate) fn new(
        owner: Option<Owner>,
        handoff: Option<Handoff>,
        state: Option<VolumeState>,
        deleting: bool,
        epoch: Option<&KeyValue>,
    ) -> Result<VolumeRead, ClusterError> {
        Ok(VolumeRead {
            owner,
            handoff,
            state,
            deleting,
            epoch: epoch_of(epoch)?,
        })
    }
}

impl Session {
    /// Reads `vol`'s owner, handoff, state and epoch keys in one
    /// transaction (one round trip, one revision).
    pub async fn read_volume(&self, vol: &str) -> Result<VolumeRead, ClusterError> {
        let keys = [
            VolumeKey::Owner,
            VolumeKey::Handoff,
            VolumeKey::State,
            VolumeKey::Epoch,
            VolumeKey::Spec,
        ];
        let read = Txn::new().and_then(keys.map(|k| TxnOp::get(self.vkey(vol, k), None)));
        let r = self.txn(&format!("read volume {vol}"), read).await?;
        let gets = txn_gets(&r);
        let kv = |i: usize| gets.get(i).and_then(|g| g.first());
        VolumeRead::new(
            kv(0).map(decode).transpose()?,
            kv(1).map(decode).transpose()?,
            kv(2).map(decode).transpose()?,
            kv(4)
                .map(decode::<VolumeSpec>)
                .transpose()?
                .is_some_and(|s| s.deleting),
            kv(3),
        )
    }

    /// Tries to become the owner of `vol` at epoch = last epoch + 1. `Some`
    /// when this node owns it (now or already, under this lease), `None` when
    /// another node does, or when `vol` has no spec (deleted). Of N
    /// concurrent claimers exactly one wins.
    pub async fn claim(&self, vol: &str) -> Result<Option<Owner>, ClusterError> {
        self.claim_with(vol, true).await
    }

    /// [`Session::claim`] of a volume about to be made: it has no spec yet
    /// (its creator writes it once it owns the name).
    pub async fn claim_new(&self, vol: &str) -> Result<Option<Owner>, ClusterError> {
        self.claim_with(vol, false).await
    }

    async fn claim_with(&self, vol: &str, need_spec: bool) -> Result<Option<Owner>, ClusterError> {
        let owner_key = self.vkey(vol, VolumeKey::Owner);
        let epoch_key = self.vkey(vol, VolumeKey::Epoch);
        loop {
            let read = Txn::new().and_then([
                TxnOp::get(owner_key.clone(), None),
                TxnOp::get(epoch_key.clone(), None),
                TxnOp::get(
                    self.vkey(vol, VolumeKey::Spec),
                    Some(GetOptions::new().with_keys_only()),
                ),
            ]);
            let r = self.txn(&format!("read {owner_key}"), read).await?;
            let gets = txn_gets(&r);
            if let Some(kv) = gets.first().and_then(|g| g.first()) {
                let o: Owner = decode(kv)?;
                return Ok((o.node == self.node() && kv.lease() == self.lease_id()).then_some(o));
            }
            if need_spec && gets.get(2).is_none_or(|g| g.is_empty()) {
                // Deleted: nothing to own.
                return Ok(None);
            }
            let epoch = epoch_of(gets.get(1).and_then(|g| g.first()))?;
            if let Some(me) = self.try_claim(vol, epoch, need_spec).await? {
                return Ok(Some(me));
            }
        }
    }

    /// [`Session::claim`] on what `seen` read: the claim's own read is
    /// skipped while `seen` shows no owner. With the claim, whether `seen`'s
    /// state record is still the current one (it is when this claim's
    /// transaction succeeded on `seen`: nobody owned the volume since).
    pub async fn claim_from(
        &self,
        vol: &str,
        seen: &VolumeRead,
    ) -> Result<Option<(Owner, bool)>, ClusterError> {
        if seen.owner.is_none()
            && let Some(me) = self.try_claim(vol, seen.epoch, true).await?
        {
            return Ok(Some((me, true)));
        }
        Ok(self.claim(vol).await?.map(|o| (o, false)))
    }

    /// A claim on `seen` and nothing else: `None` when `seen` shows an
    /// owner or the claim's transaction fails (something claimed, released
    /// or deleted the volume since `seen`), where [`Session::claim_from`]
    /// would read again and claim whatever it finds unowned then. On
    /// success `seen`'s state record is still the current one.
    pub async fn claim_on(
        &self,
        vol: &str,
        seen: &VolumeRead,
    ) -> Result<Option<Owner>, ClusterError> {
        if seen.owner.is_some() {
            return Ok(None);
        }
        self.try_claim(vol, seen.epoch, true).await
    }

    /// One claim transaction: owner key absent and the epoch key as
    /// `(epoch, rev)` says; `Some` when it succeeded.
    async fn try_claim(
        &self,
        vol: &str,
        (epoch, rev): (u64, i64),
        need_spec: bool,
    ) -> Result<Option<Owner>, ClusterError> {
        let owner_key = self.vkey(vol, VolumeKey::Owner);
        let epoch_key = self.vkey(vol, VolumeKey::Epoch);
        let me = Owner {
            node: self.node().to_string(),
            epoch: epoch + 1,
        };
        let mut when = vec![
            Compare::version(owner_key.clone(), CompareOp::Equal, 0),
            Compare::mod_revision(epoch_key.clone(), CompareOp::Equal, rev),
        ];
        if need_spec {
            // A volume deleted since the claimer read it is not claimed (the
            // delete took its epoch key too, which then reads as never claimed).
            when.push(Compare::version(
                self.vkey(vol, VolumeKey::Spec),
                CompareOp::Greater,
                0,
            ));
        }
        let txn = Txn::new().when(when).and_then([
            TxnOp::put(
                owner_key.clone(),
                encode(&me),
                Some(PutOptions::new().with_lease(self.lease_id())),
            ),
            TxnOp::put(epoch_key, encode(&me.epoch), None),
        ]);
        if !self
            .txn(&format!("claim {owner_key}"), txn)
            .await?
            .succeeded()
        {
            return Ok(None);
        }
        tracing::info!(volume = vol, epoch = me.epoch, "claimed volume");
        Ok(Some(me))
    }
}

/// The epoch key's value and mod revision; (0, 0) when there is none.
fn epoch_of(kv: Option<&KeyValue>) -> Result<(u64, i64), ClusterError> {
    Ok(match kv {
        Some(kv) => (decode::<u64>(kv)?, kv.mod_revision()),
        None => (0, 0),
    })
}

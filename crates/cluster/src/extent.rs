//! The extents of cluster pools (`pool expand`): listed in the pool's spec,
//! each with a member-state record of its own under
//! `volumes/<pool>/extent-state/`. Both are written only by the pool's
//! owner, guarded by its epoch, as the pool's own record is.

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use crate::etcd::{decode, encode};
use crate::keys::VolumeKey;
use crate::{ClusterError, Session, VolumeSpec, VolumeState};

impl Session {
    /// Rewrites `spec` (its extents or a drive changed), while this node owns the
    /// volume at `epoch` and its spec is still `old`: two changes cannot
    /// overwrite each other. `Deposed` otherwise; nothing is written then.
    pub async fn update_spec(
        &self,
        old: &VolumeSpec,
        spec: &VolumeSpec,
        epoch: u64,
    ) -> Result<(), ClusterError> {
        self.update_spec_with(old, spec, epoch, Vec::new()).await
    }

    /// [`Self::update_spec`] of pool `spec`, which no longer lists extents
    /// `dropped`: their member-state records go in the same transaction.
    pub async fn drop_extents(
        &self,
        old: &VolumeSpec,
        spec: &VolumeSpec,
        epoch: u64,
        dropped: &[String],
    ) -> Result<(), ClusterError> {
        let ops = dropped
            .iter()
            .map(|x| TxnOp::delete(self.keys().extent_state(&spec.name, x), None))
            .collect();
        self.update_spec_with(old, spec, epoch, ops).await
    }

    pub(crate) async fn update_spec_with(
        &self,
        old: &VolumeSpec,
        spec: &VolumeSpec,
        epoch: u64,
        mut ops: Vec<TxnOp>,
    ) -> Result<(), ClusterError> {
        let key = self.vkey(&spec.name, VolumeKey::Spec);
        // From the revision that reads as `old`: its bytes may be of an
        // older version's encoding (a field added since), which comparing
        // the value would take for a change, refusing every update for ever.
        let seen = match self.get_one(&key).await? {
            Some(kv) if decode::<VolumeSpec>(&kv)? == *old => kv.mod_revision(),
            _ => {
                return Err(ClusterError::Deposed {
                    volume: spec.name.clone(),
                    epoch,
                });
            }
        };
        let txn = Txn::new()
            .when([
                self.owned_at(&spec.name, epoch),
                Compare::mod_revision(key.clone(), CompareOp::Equal, seen),
            ])
            .and_then({
                ops.push(TxnOp::put(key.clone(), encode(spec), None));
                ops
            });
        if self.txn(&format!("update {key}"), txn).await?.succeeded() {
            return Ok(());
        }
        Err(ClusterError::Deposed {
            volume: spec.name.clone(),
            epoch,
        })
    }

    /// Writes extent `x`'s member states, only while this node owns pool
    /// `pool` at `st.epoch`.
    pub async fn put_extent_state(
        &self,
        pool: &str,
        x: &str,
        st: &VolumeState,
    ) -> Result<(), ClusterError> {
        let key = self.keys().extent_state(pool, x);
        let txn = Txn::new()
            .when([self.owned_at(pool, st.epoch)])
            .and_then([TxnOp::put(key.clone(), encode(st), None)]);
        if self.txn(&format!("put {key}"), txn).await?.succeeded() {
            return Ok(());
        }
        Err(ClusterError::Deposed {
            volume: pool.to_string(),
            epoch: st.epoch,
        })
    }

    /// Extent `x` of pool `pool`: its last owner's record of its members.
    pub async fn extent_state(
        &self,
        pool: &str,
        x: &str,
    ) -> Result<Option<VolumeState>, ClusterError> {
        self.get_one(&self.keys().extent_state(pool, x))
            .await?
            .as_ref()
            .map(decode)
            .transpose()
    }
}

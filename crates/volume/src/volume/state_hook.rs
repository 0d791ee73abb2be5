//! Recording member states outside the volume before a write that depends
//! on them is acknowledged.
//!
//! The superblocks say which members failed, but only on the members that
//! are present. A node that takes the volume over while some members are
//! unreachable cannot read what those say: a member it does reach may be
//! one that the last owner failed (and then went on writing without), and
//! serving from it would lose acknowledged writes. So a volume owned in a
//! cluster records its member states where every node can read them (etcd,
//! guarded by the owner's epoch) each time they change, and a write that
//! skipped a member is acknowledged only once that record has landed. When
//! it cannot land, the volume fences itself: the owner is cut off or
//! deposed, and the writes are refused rather than acknowledged on members
//! nobody else knows are the good ones.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::superblock::MemberState;

use super::{Inner, Volume};

/// The member states at one superblock generation, as recorded outside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRecord {
    pub generation: u64,
    pub states: Vec<MemberState>,
}

/// Records a [`StateRecord`] (e.g. in etcd); an error fences the volume.
pub type StateHook = Arc<
    dyn Fn(StateRecord) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync,
>;

/// The installed hook and the states it last recorded.
#[derive(Default)]
pub(crate) struct HookSlot {
    hook: Option<StateHook>,
    recorded: Vec<MemberState>,
}

impl Volume {
    /// Installs (or, with `None`, removes) the hook that records member
    /// state changes; the current states count as recorded.
    pub fn set_state_hook(&self, hook: Option<StateHook>) {
        let states = self.inner.members.read().states.clone();
        let mut slot = self.inner.state_hook.lock();
        slot.hook = hook;
        slot.recorded = states;
    }
}

impl Volume {
    /// Records the current states through the hook now (a new owner's
    /// first record), in order with the records of later changes.
    pub async fn record_states_now(&self) -> Result<(), String> {
        let inner = &self.inner;
        let _g = inner.sb_lock.lock().await;
        let hook = inner
            .state_hook
            .lock()
            .hook
            .clone()
            .ok_or("no state hook installed")?;
        let (generation, states) = {
            let m = inner.members.read();
            (m.generation, m.states.clone())
        };
        hook(StateRecord {
            generation,
            states: states.clone(),
        })
        .await?;
        inner.state_hook.lock().recorded = states;
        Ok(())
    }
}

impl Inner {
    /// Called under the superblock lock after a superblock write: records
    /// the states if they changed since the last record; a failure fences.
    pub(crate) async fn record_states(&self, generation: u64, states: &[MemberState]) {
        let hook = {
            let slot = self.state_hook.lock();
            match &slot.hook {
                Some(h) if slot.recorded != states => h.clone(),
                _ => return,
            }
        };
        let rec = StateRecord {
            generation,
            states: states.to_vec(),
        };
        match hook(rec).await {
            Ok(()) => self.state_hook.lock().recorded = states.to_vec(),
            Err(e) => {
                let why = format!("its member states could not be recorded in the cluster: {e}");
                tracing::error!("volume {}: fenced: {why}", self.members.read().name);
                self.fence.set(why);
            }
        }
    }
}

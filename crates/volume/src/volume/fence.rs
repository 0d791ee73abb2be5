//! Self-fencing. A member that answers Reservation Conflict means another
//! node preempted this node's reservation: this node no longer owns the
//! volume. Marking the member failed and running degraded would let two
//! owners write, so the volume fences itself instead: from then on every
//! I/O, the retries of requests in flight, rebuild, resync and every
//! metadata write fail with [`BlockError::Fenced`], and nothing more is
//! submitted to any member.
//!
//! The check sits where every member I/O passes: each member is wrapped in a
//! [`FencedMember`] that refuses I/O once the fence is up and raises it when
//! the member answers Reservation Conflict. I/Os already submitted to other
//! members when the fence goes up still complete (they cannot be recalled);
//! their requests are not acknowledged as successful.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use blockdev::{
    BlockDevice, BlockError, IoCheck, IoDone, IoFuture, IoRequest, RecordKind as DevRecordKind,
};

/// Whether the volume is fenced, and why.
#[derive(Default)]
pub(crate) struct Fence {
    on: AtomicBool,
    reason: parking_lot::Mutex<Option<String>>,
}

impl Fence {
    pub(crate) fn is_set(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// Raises the fence; the first reason given is kept. Returns true when
    /// this call raised it.
    pub(crate) fn set(&self, reason: String) -> bool {
        self.set_as(reason, true)
    }

    /// [`Self::set`]; `alarm`: log it as the error a fence usually is (not
    /// for a volume the node retires on purpose, such as a deleted one).
    pub(crate) fn set_as(&self, reason: String, alarm: bool) -> bool {
        let mut r = self.reason.lock();
        if r.is_some() {
            return false;
        }
        if alarm {
            tracing::error!("volume fenced: {reason}; no further I/O reaches any member");
        }
        *r = Some(reason);
        self.on.store(true, Ordering::Release);
        true
    }

    pub(crate) fn reason(&self) -> Option<String> {
        self.reason.lock().clone()
    }

    /// The error every I/O answers once fenced.
    pub(crate) fn error(&self) -> BlockError {
        BlockError::Fenced(self.reason().unwrap_or_else(|| "volume fenced".into()))
    }
}

/// A member as the volume uses it: refused once the fence is up; a
/// Reservation Conflict raises the fence. The check rides on the member's
/// own future ([`IoCheck`]): no future of its own per member I/O.
pub(crate) struct FencedMember(Arc<MemberFence>);

/// What the check of a member's completions needs.
struct MemberFence {
    dev: Arc<dyn BlockDevice>,
    index: usize,
    fence: Arc<Fence>,
}

impl FencedMember {
    pub(crate) fn wrap(
        dev: Arc<dyn BlockDevice>,
        index: usize,
        fence: &Arc<Fence>,
    ) -> Arc<dyn BlockDevice> {
        Arc::new(FencedMember(Arc::new(MemberFence {
            dev,
            index,
            fence: fence.clone(),
        })))
    }
}

impl IoCheck for MemberFence {
    /// Only a conflict costs anything here: `describe` is asked for then.
    fn on_done(&self, d: &mut IoDone) {
        if let Err(BlockError::ReservationConflict(why)) = &d.result {
            self.fence.set(format!(
                "member {} ({}) answered reservation conflict ({why}): another node \
                 took the volume over",
                self.index,
                self.dev.describe()
            ));
            d.result = Err(self.fence.error());
        }
    }
}

impl BlockDevice for FencedMember {
    blockdev::forward_block_device!(self => self.0.dev, except [submit, store_record]);

    fn submit(&self, req: IoRequest) -> IoFuture {
        let m = &self.0;
        if m.fence.is_set() {
            return IoFuture::ready(req.buf, Err(m.fence.error()));
        }
        m.dev.submit(req).then_check(&self.0)
    }

    fn store_record(&self, kind: DevRecordKind, data: &[u8]) -> Result<(), BlockError> {
        if self.0.fence.is_set() {
            return Err(self.0.fence.error());
        }
        self.0.dev.store_record(kind, data)
    }
}

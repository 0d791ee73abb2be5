//! Block-range locks for the writes of an attached disk.
//!
//! A write that does not cover whole blocks is a read-modify-write of its
//! edge blocks; two of them on the same block, or one beside a whole-block
//! write there, would otherwise store a stale copy of the other's bytes
//! and lose an acknowledged write. So every write holds its block range
//! while it runs: whole-block writes shared (they never read, and the order
//! of two overlapping ones is the caller's to choose), read-modify-writes
//! exclusive. The number of writes in flight is bounded by what the kernel
//! sends (its FUSE queue), so a list scanned under a mutex is enough.

use std::ops::RangeInclusive;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

#[derive(Default)]
pub struct RangeLocks {
    held: Mutex<Vec<Held>>,
    freed: Notify,
    next_id: std::sync::atomic::AtomicU64,
}

struct Held {
    id: u64,
    first: u64,
    last: u64,
    exclusive: bool,
}

/// Releases its range on drop.
pub struct RangeGuard {
    locks: Arc<RangeLocks>,
    id: u64,
}

impl RangeLocks {
    /// Waits until `blocks` overlaps no conflicting holder, then holds it.
    pub async fn lock(
        self: &Arc<Self>,
        blocks: RangeInclusive<u64>,
        exclusive: bool,
    ) -> RangeGuard {
        let (first, last) = (*blocks.start(), *blocks.end());
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        loop {
            // Registered before the check, so a release between the check
            // and the wait still wakes us.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut held = self.held.lock();
                let conflict = held
                    .iter()
                    .any(|h| h.first <= last && first <= h.last && (exclusive || h.exclusive));
                if !conflict {
                    held.push(Held {
                        id,
                        first,
                        last,
                        exclusive,
                    });
                    return RangeGuard {
                        locks: self.clone(),
                        id,
                    };
                }
            }
            freed.await;
        }
    }

    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.held.lock().len()
    }
}

impl Drop for RangeGuard {
    fn drop(&mut self) {
        self.locks.held.lock().retain(|h| h.id != self.id);
        self.locks.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn shared_ranges_overlap_exclusive_ones_wait() {
        let l = Arc::new(RangeLocks::default());
        let a = l.lock(0..=3, false).await;
        let _b = l.lock(2..=5, false).await; // shared with shared: no wait
        assert_eq!(l.held(), 2);
        // An exclusive lock beside them (no overlap) goes through.
        let _c = l.lock(6..=6, true).await;
        // One overlapping `a` waits until `a` is dropped... and `_b`.
        let l2 = l.clone();
        let waiter = tokio::spawn(async move {
            let _g = l2.lock(1..=1, true).await;
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !waiter.is_finished(),
            "an exclusive lock went past a holder"
        );
        drop(a);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter got the range once it was free")
            .unwrap();
        assert_eq!(l.held(), 2);
    }
}

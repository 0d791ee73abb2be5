//! Foreground work that background passes give way to. A node taking over
//! many volumes at once (a dead peer's) serves each one before its crash
//! resync or rebuild; those passes then start once the takeovers are done
//! (or after [`MAX_WAIT`]), so that the bulk copies of the first volumes do
//! not take the CPU and the members' bandwidth from the assembly of the
//! last ones. As md's resync yields to other I/O, only coarser.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// The longest a background pass waits for foreground work to end: a node
/// that keeps taking volumes over must still resync them.
pub const MAX_WAIT: Duration = Duration::from_secs(3);

/// Counts the foreground tasks running now.
#[derive(Debug, Default)]
pub struct Foreground {
    running: AtomicUsize,
    idle: Notify,
}

/// One foreground task; it ends when dropped.
pub struct ForegroundGuard(Arc<Foreground>);

impl Drop for ForegroundGuard {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Foreground {
    /// Marks a foreground task as running until the guard drops.
    pub fn enter(self: &Arc<Self>) -> ForegroundGuard {
        self.running.fetch_add(1, Ordering::AcqRel);
        ForegroundGuard(self.clone())
    }

    pub fn running(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }

    /// Returns once no foreground task runs, or after `max`.
    pub async fn wait_idle(&self, max: Duration) {
        let _ = tokio::time::timeout(max, async {
            loop {
                let idle = self.idle.notified();
                tokio::pin!(idle);
                // Registered before the check: a drop in between wakes it.
                idle.as_mut().enable();
                if self.running() == 0 {
                    return;
                }
                idle.await;
            }
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waits_for_the_last_task_and_no_longer_than_max() {
        let f = Arc::new(Foreground::default());
        let t0 = tokio::time::Instant::now();
        f.wait_idle(Duration::from_secs(5)).await;
        assert!(t0.elapsed() < Duration::from_millis(50), "idle: no wait");
        let (a, b) = (f.enter(), f.enter());
        let f2 = f.clone();
        let waiter = tokio::spawn(async move {
            let t0 = tokio::time::Instant::now();
            f2.wait_idle(Duration::from_secs(5)).await;
            t0.elapsed()
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        drop(a);
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!waiter.is_finished(), "one task still runs");
        drop(b);
        let waited = waiter.await.unwrap();
        assert!(waited >= Duration::from_millis(55), "{waited:?}");
        assert!(waited < Duration::from_secs(2), "{waited:?}");
        // A task that never ends holds a pass back for `max` only.
        let _c = f.enter();
        let t0 = tokio::time::Instant::now();
        f.wait_idle(Duration::from_millis(100)).await;
        assert!(t0.elapsed() >= Duration::from_millis(100));
        assert_eq!(f.running(), 1);
    }
}

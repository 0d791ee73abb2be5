//! Completion checks: what a wrapping device does when an I/O that it passed
//! on completes (count an error, look at the status, release an in-flight
//! count). A wrapper that awaited the inner future in a future of its own
//! would cost an allocation per I/O per wrapper; a volume's member I/O passes
//! two or three wrappers (fence, metering, ownership). A check instead rides
//! on the inner future, in a few inline slots, and runs when it completes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::{IoDone, IoFuture};

/// What a wrapper does when an I/O that it passed on ends.
pub trait IoCheck: Send + Sync + 'static {
    /// The I/O completed; the check may change its result.
    fn on_done(&self, done: &mut IoDone);
    /// The I/O's future was dropped before it completed (its request was
    /// abandoned): a check that holds a count releases it here.
    fn on_abandoned(&self) {}
}

/// Checks carried inline; one more wraps the future once (never seen today).
const INLINE: usize = 3;

/// A pending I/O with the checks of the wrappers it passed, innermost first.
pub struct Checked {
    fut: Pin<Box<dyn Future<Output = IoDone> + Send>>,
    checks: [Option<Arc<dyn IoCheck>>; INLINE],
    finished: bool,
}

impl Future for Checked {
    type Output = IoDone;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<IoDone> {
        // Checked is Unpin (its future is boxed).
        let this = self.get_mut();
        let mut done = std::task::ready!(this.fut.as_mut().poll(cx));
        this.finished = true;
        for c in this.checks.iter().flatten() {
            c.on_done(&mut done);
        }
        Poll::Ready(done)
    }
}

impl Drop for Checked {
    fn drop(&mut self) {
        if !self.finished {
            for c in self.checks.iter().flatten() {
                c.on_abandoned();
            }
        }
    }
}

impl IoFuture {
    /// Runs `check` when this I/O completes (at once if it already has),
    /// after the checks added before it. No allocation for the first few.
    pub fn then_check<C: IoCheck>(self, check: &Arc<C>) -> IoFuture {
        match self {
            IoFuture::Ready(Some(mut d)) => {
                check.on_done(&mut d);
                IoFuture::Ready(Some(d))
            }
            // No result will come (a spent future): the wrapper must not wait for one.
            IoFuture::Ready(None) => {
                check.on_abandoned();
                IoFuture::Ready(None)
            }
            IoFuture::Pending(fut) => IoFuture::Checked(Checked {
                fut,
                checks: [Some(check.clone()), None, None],
                finished: false,
            }),
            IoFuture::Checked(mut c) => {
                if let Some(slot) = c.checks.iter_mut().find(|s| s.is_none()) {
                    *slot = Some(check.clone());
                    return IoFuture::Checked(c);
                }
                IoFuture::Checked(Checked {
                    fut: Box::pin(c),
                    checks: [Some(check.clone()), None, None],
                    finished: false,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::Waker;

    use super::*;
    use crate::{AlignedBuf, BlockError};

    /// Records the order in which checks ran, and what they saw.
    struct Log {
        name: &'static str,
        seen: Arc<Mutex<Vec<String>>>,
        fail: bool,
    }

    impl IoCheck for Log {
        fn on_done(&self, d: &mut IoDone) {
            self.seen
                .lock()
                .unwrap()
                .push(format!("{}:{}", self.name, d.result.is_ok()));
            if self.fail {
                d.result = Err(BlockError::Config(self.name.into()));
            }
        }
        fn on_abandoned(&self) {
            self.seen
                .lock()
                .unwrap()
                .push(format!("{}:abandoned", self.name));
        }
    }

    fn log(name: &'static str, seen: &Arc<Mutex<Vec<String>>>, fail: bool) -> Arc<Log> {
        Arc::new(Log {
            name,
            seen: seen.clone(),
            fail,
        })
    }

    /// An I/O that completes once `gate` is set.
    struct Gated(Arc<AtomicBool>);
    impl Future for Gated {
        type Output = IoDone;
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<IoDone> {
            if !self.0.load(Ordering::Acquire) {
                return Poll::Pending;
            }
            Poll::Ready(IoDone {
                buf: AlignedBuf::new(512),
                result: Ok(()),
            })
        }
    }

    fn pending() -> (Arc<AtomicBool>, IoFuture) {
        let gate = Arc::new(AtomicBool::new(false));
        (gate.clone(), IoFuture::Pending(Box::pin(Gated(gate))))
    }

    fn poll(f: &mut IoFuture) -> Poll<IoDone> {
        Pin::new(f).poll(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn checks_run_innermost_first_and_may_change_the_result() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (gate, mut f) = pending();
        // Five checks: three inline, then two more that wrap once.
        for (i, name) in ["a", "b", "c", "d", "e"].into_iter().enumerate() {
            f = f.then_check(&log(name, &seen, i == 1));
        }
        assert!(poll(&mut f).is_pending());
        assert!(seen.lock().unwrap().is_empty());
        gate.store(true, Ordering::Release);
        let Poll::Ready(d) = poll(&mut f) else {
            panic!("the I/O completed");
        };
        assert!(matches!(d.result, Err(BlockError::Config(ref s)) if s == "b"));
        assert_eq!(
            *seen.lock().unwrap(),
            ["a:true", "b:true", "c:false", "d:false", "e:false"]
        );
        drop(f);
        assert_eq!(
            seen.lock().unwrap().len(),
            5,
            "a completed I/O is not abandoned"
        );
    }

    #[test]
    fn a_completed_io_is_checked_at_once() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let f = IoFuture::ready(AlignedBuf::new(512), Ok(()));
        let f = f.then_check(&log("a", &seen, true));
        assert_eq!(*seen.lock().unwrap(), ["a:true"]);
        let IoFuture::Ready(Some(d)) = f else {
            panic!("a ready future stays ready");
        };
        assert!(d.result.is_err());
    }

    #[test]
    fn an_abandoned_io_tells_every_check_once() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (_gate, mut f) = pending();
        for name in ["a", "b", "c", "d"] {
            f = f.then_check(&log(name, &seen, false));
        }
        assert!(poll(&mut f).is_pending());
        drop(f);
        let mut s = seen.lock().unwrap().clone();
        s.sort();
        assert_eq!(
            s,
            ["a:abandoned", "b:abandoned", "c:abandoned", "d:abandoned"]
        );
    }
}

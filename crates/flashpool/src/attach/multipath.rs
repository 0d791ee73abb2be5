//! ANA multipath for a cluster subsystem, as the kernel's native multipath
//! does it: one [`RemoteDevice`] per portal that discovery lists for the
//! NQN, I/O to the path whose controller reports the namespace's ANA group
//! Optimized (else Non-Optimized), and a request that fails on its path (a
//! lost connection, an ANA Inaccessible answer from a node that no longer
//! owns the volume) sent again on whichever path is Optimized next, for up
//! to `fail_after`. A task reads every path's ANA log a few times a second,
//! so a planned move is followed before any I/O fails.
//!
//! A write retried on another path after a transport error may have reached
//! the first node too; both carry the same bytes to the same blocks, as with
//! the kernel's multipath.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use blockdev::{BlockDevice, BlockError, Geometry, IoDone, IoFuture, IoRequest, check_request};
use nvme_wire::log_page::ana::{STATE_NON_OPTIMIZED, STATE_OPTIMIZED};
use nvmf_host::remote::RemoteDevice;
use tokio::sync::{Notify, watch};

/// How often every path's ANA state is read.
const POLL: Duration = Duration::from_millis(200);
/// A path whose ANA log does not come back this fast is not chosen this round.
const ANA_TIMEOUT: Duration = Duration::from_millis(500);
/// Pause before a failed request tries again when no other path is ready.
const RETRY_PAUSE: Duration = Duration::from_millis(20);
/// A path whose state is not known (never read, or it just failed).
const UNKNOWN: u8 = 0xFF;
/// No usable path.
const NONE: usize = usize::MAX;

type AnaFuture<'a> = Pin<Box<dyn Future<Output = Result<Option<u8>, BlockError>> + Send + 'a>>;

/// One path: a device, and what its controller says of the namespace's ANA
/// group (`None`: it keeps no ANA log, so the path is as good as any).
pub trait AnaPath: BlockDevice {
    fn ana_state(&self) -> AnaFuture<'_>;
}

impl AnaPath for RemoteDevice {
    fn ana_state(&self) -> AnaFuture<'_> {
        Box::pin(RemoteDevice::ana_state(self))
    }
}

struct Inner {
    paths: Vec<Arc<dyn AnaPath>>,
    states: Vec<AtomicU8>,
    /// Index of the path I/O goes to, or NONE.
    active: watch::Sender<usize>,
    kick: Notify,
    fail_after: Duration,
    closed: AtomicBool,
}

/// The paths as one block device.
pub struct Multipath {
    inner: Arc<Inner>,
    geo: Geometry,
}

impl Multipath {
    /// Over `paths` (one namespace, checked by the caller); reads their ANA
    /// states once, then keeps reading them on the current runtime.
    pub async fn new(paths: Vec<Arc<dyn AnaPath>>, fail_after: Duration) -> Multipath {
        let geo = paths[0].geometry();
        let inner = Arc::new(Inner {
            states: paths.iter().map(|_| AtomicU8::new(UNKNOWN)).collect(),
            paths,
            active: watch::Sender::new(NONE),
            kick: Notify::new(),
            fail_after,
            closed: AtomicBool::new(false),
        });
        inner.refresh().await;
        tokio::spawn(poll(inner.clone()));
        Multipath { inner, geo }
    }

    /// The path I/O goes to now, if any.
    #[cfg(test)]
    fn active(&self) -> Option<usize> {
        Some(*self.inner.active.borrow()).filter(|&i| i != NONE)
    }
}

/// Reads every path's state every POLL (or at once when kicked) until the
/// device is dropped or shut down (which sets `closed` and kicks).
async fn poll(m: Arc<Inner>) {
    while !m.closed.load(Ordering::Acquire) {
        tokio::select! {
            _ = m.kick.notified() => {}
            _ = tokio::time::sleep(POLL) => {}
        }
        if m.closed.load(Ordering::Acquire) {
            return;
        }
        m.refresh().await;
    }
}

impl Inner {
    async fn refresh(&self) {
        let mut set = tokio::task::JoinSet::new();
        for (i, p) in self.paths.iter().enumerate() {
            let p = p.clone();
            set.spawn(async move {
                let r = tokio::time::timeout(ANA_TIMEOUT, p.ana_state()).await;
                (i, r)
            });
        }
        while let Some(done) = set.join_next().await {
            let Ok((i, r)) = done else { continue };
            let s = match r {
                Ok(Ok(Some(s))) => s,
                Ok(Ok(None)) => STATE_OPTIMIZED,
                Ok(Err(e)) => {
                    tracing::debug!("path {}: ANA state: {e}", self.paths[i].describe());
                    UNKNOWN
                }
                Err(_) => UNKNOWN,
            };
            self.states[i].store(s, Ordering::Release);
            // At once: a survivor that says Optimized need not wait for a
            // dead path's read to time out.
            self.choose();
        }
    }

    /// Points I/O at the best path: the current one while it stays
    /// Optimized, else the first Optimized, else the first Non-Optimized.
    fn choose(&self) {
        let states: Vec<u8> = self
            .states
            .iter()
            .map(|s| s.load(Ordering::Acquire))
            .collect();
        let cur = *self.active.borrow();
        let next = pick(&states, cur);
        if next != cur {
            match next {
                NONE => tracing::warn!("no path is Optimized or Non-Optimized; I/O waits"),
                i => tracing::info!(
                    "I/O now goes to {} (ANA {})",
                    self.paths[i].describe(),
                    if states[i] == STATE_OPTIMIZED {
                        "Optimized"
                    } else {
                        "Non-Optimized"
                    }
                ),
            }
            self.active.send_replace(next);
        }
    }

    /// Path `i` failed a request: not chosen again until its ANA state is read.
    fn failed(&self, i: usize) {
        self.states[i].store(UNKNOWN, Ordering::Release);
        self.choose();
        self.kick.notify_one();
    }
}

/// The path to use given each one's state: `cur` while Optimized, else the
/// first Optimized, else the first Non-Optimized, else NONE.
fn pick(states: &[u8], cur: usize) -> usize {
    if states.get(cur) == Some(&STATE_OPTIMIZED) {
        return cur;
    }
    for want in [STATE_OPTIMIZED, STATE_NON_OPTIMIZED] {
        if let Some(i) = states.iter().position(|&s| s == want) {
            return i;
        }
    }
    NONE
}

/// Whether another path could answer differently: a real answer about the
/// request (range, space, a reservation) stands on every path.
fn retryable(e: &BlockError) -> bool {
    matches!(
        e,
        BlockError::Io(_) | BlockError::Unreachable { .. } | BlockError::IdentityChanged(_)
    )
}

impl BlockDevice for Multipath {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn submit(&self, req: IoRequest) -> IoFuture {
        if let Err(e) = check_request(self.geo, &req) {
            return IoFuture::ready(req.buf, Err(e));
        }
        IoFuture::Pending(Box::pin(run_io(self.inner.clone(), req)))
    }

    fn deallocate_reads_zeroes(&self) -> bool {
        self.inner.paths.iter().all(|p| p.deallocate_reads_zeroes())
    }

    fn describe(&self) -> String {
        let paths: Vec<String> = self.inner.paths.iter().map(|p| p.describe()).collect();
        format!("multipath ({} paths: {})", paths.len(), paths.join(", "))
    }

    fn shutdown(&self) -> Result<(), BlockError> {
        self.inner.closed.store(true, Ordering::Release);
        self.inner.kick.notify_one();
        for p in &self.inner.paths {
            let _ = p.shutdown();
        }
        Ok(())
    }
}

impl Drop for Multipath {
    fn drop(&mut self) {
        self.inner.closed.store(true, Ordering::Release);
        self.inner.kick.notify_one();
    }
}

/// One request: on the active path; after a path error again on the next
/// active one, until `fail_after` has passed.
async fn run_io(m: Arc<Inner>, req: IoRequest) -> IoDone {
    let deadline = tokio::time::Instant::now() + m.fail_after;
    let mut rx = m.active.subscribe();
    let mut buf = req.buf;
    let mut last: Option<BlockError> = None;
    loop {
        let i = *rx.borrow_and_update();
        if i == NONE {
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_ok()
            {
                continue;
            }
            let why = last.map_or_else(
                || "no path reports the namespace Optimized or Non-Optimized".to_string(),
                |e| e.to_string(),
            );
            let result = Err(BlockError::Unreachable {
                what: "every path".into(),
                after_ms: m.fail_after.as_millis() as u64,
                why,
            });
            return IoDone { buf, result };
        }
        let done = m.paths[i]
            .submit(IoRequest {
                op: req.op,
                lba: req.lba,
                blocks: req.blocks,
                buf,
            })
            .await;
        buf = done.buf;
        let e = match done.result {
            Ok(()) => {
                return IoDone {
                    buf,
                    result: Ok(()),
                };
            }
            Err(e) if !retryable(&e) => {
                return IoDone {
                    buf,
                    result: Err(e),
                };
            }
            Err(e) => e,
        };
        if tokio::time::Instant::now() >= deadline {
            return IoDone {
                buf,
                result: Err(e),
            };
        }
        tracing::warn!(
            "{:?} of {}+{} failed on {}: {e}; trying the next path",
            req.op,
            req.lba,
            req.blocks,
            m.paths[i].describe()
        );
        m.failed(i);
        last = Some(e);
        if *rx.borrow() == i {
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }
}

#[cfg(test)]
#[path = "multipath_tests.rs"]
mod tests;

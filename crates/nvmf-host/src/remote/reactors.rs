//! Queues bound to reactors: a remote drive's I/O submitted on a thread that
//! runs a runtime of its own (a target reactor: a volume's member I/O) goes
//! to a queue whose connection task runs on that same thread, as SPDK gives
//! each poll group its own queue pairs. Otherwise every member command
//! wakes a thread of the shared remote runtime to send it, and every
//! completion wakes the reactor back: two cross-thread wake-ups per
//! command, which measured most of the owner's CPU per I/O of a volume on
//! remote drives (docs/performance.md, "two hops").
//!
//! The process registers its reactors once ([`bind_reactors`]); a link then
//! adds an I/O queue for a reactor beside its shared queues, on that
//! reactor's runtime, once that reactor has sent it a few hundred requests
//! (at the link's next health check, 100 ms; until then the shared queues
//! carry them), as far as the controller grants queues for them. A thread
//! inside [`blockdev::block_on`] (a synchronous record store) runs no task
//! until it returns, so its I/O goes to the shared queues.

use std::cell::Cell;

use parking_lot::RwLock;
use tokio::runtime::Handle;

static REACTORS: RwLock<Vec<Handle>> = RwLock::new(Vec::new());

thread_local! {
    /// This thread's reactor index, once its marker task ran.
    static REACTOR: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Registers `handles` as this process's reactors: current-thread runtimes,
/// each driven by one thread that submits I/O from async code (a target's
/// reactors). Replaces an earlier registration (a server started again).
pub fn bind_reactors(handles: &[Handle]) {
    let mut r = REACTORS.write();
    *r = handles.to_vec();
    for (i, h) in handles.iter().enumerate() {
        // Runs on the reactor's own thread (a current-thread runtime).
        drop(h.spawn(async move { REACTOR.with(|c| c.set(Some(i))) }));
    }
}

/// The registered reactors' runtimes, by index.
pub(crate) fn reactors() -> Vec<Handle> {
    REACTORS.read().clone()
}

/// How many reactors are registered.
pub(crate) fn reactor_count() -> usize {
    REACTORS.read().len()
}

/// The reactor this thread is, when its bound queues may be used now.
pub(crate) fn current() -> Option<usize> {
    REACTOR.with(Cell::get).filter(|_| !blockdev::in_block_on())
}

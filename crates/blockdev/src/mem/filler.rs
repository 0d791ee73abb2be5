//! A RAM device's background allocator: faults new memory in on its own
//! thread, at low priority, so that a write to a chunk never written before
//! costs a memcpy on the I/O path instead of page faults and the kernel's
//! zeroing of 2 MiB (measured: a fresh `mem` namespace took 128 KiB writes at
//! two thirds the speed of a written one, p99 4 ms; docs/performance.md).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Condvar, Mutex};

use super::Chunk;
use super::chunk::ChunkMem;

/// Chunks kept ready for a thin device: up to 16 MiB, a few milliseconds
/// of writes at memory speed, refilled as they are taken; at most an
/// eighth of a small device.
const READY: usize = 8;

/// How a RAM device comes by its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemAllocation {
    /// On first write, on the writing thread (tests, in-process benches).
    OnWrite,
    /// Thin: on first write, from a few chunks a background thread keeps
    /// faulted in and ready.
    Ahead,
    /// Thick: all of it, by a background thread from the start; a chunk
    /// freed by a deallocation is mapped again at once.
    Full,
}

struct State {
    ready: Vec<ChunkMem>,
    /// Full: a chunk may be missing (start, or a deallocation).
    holes: bool,
    stop: bool,
}

pub(super) struct Filler {
    state: Mutex<State>,
    wake: Condvar,
    full: bool,
    /// Ahead: how many chunks to keep ready.
    ready_max: usize,
    /// Full: every chunk has been allocated once (for `describe`).
    filled_once: AtomicBool,
}

impl Filler {
    /// Starts the allocator thread of a device with `chunks`; None for
    /// `OnWrite` or when the thread cannot start (then writes allocate).
    pub fn start(mode: MemAllocation, chunks: &Arc<[Chunk]>) -> Option<Arc<Filler>> {
        if mode == MemAllocation::OnWrite {
            return None;
        }
        let f = Arc::new(Filler {
            state: Mutex::new(State {
                ready: Vec::new(),
                holes: true,
                stop: false,
            }),
            wake: Condvar::new(),
            full: mode == MemAllocation::Full,
            ready_max: (chunks.len() / 8).clamp(1, READY),
            filled_once: AtomicBool::new(false),
        });
        let (f2, chunks) = (f.clone(), chunks.clone());
        match std::thread::Builder::new()
            .name("fp-mem-alloc".into())
            .spawn(move || f2.run(&chunks))
        {
            Ok(_) => Some(f),
            Err(e) => {
                tracing::warn!(
                    "mem device: cannot start its allocator thread ({e}); memory is allocated \
                     on first write instead"
                );
                None
            }
        }
    }

    /// A ready chunk, if one is; the thread makes another.
    pub fn take(&self) -> Option<ChunkMem> {
        let mut st = self.state.lock();
        let c = st.ready.pop();
        self.wake.notify_one();
        c
    }

    /// A chunk was freed (Full: map it again).
    pub fn hole(&self) {
        if self.full {
            self.state.lock().holes = true;
            self.wake.notify_one();
        }
    }

    /// Ends the thread after the chunk it is on; ready chunks are freed.
    pub fn stop(&self) {
        let mut st = self.state.lock();
        st.stop = true;
        st.ready.clear();
        self.wake.notify_one();
    }

    #[cfg(test)]
    pub fn ready_bytes(&self) -> u64 {
        (self.state.lock().ready.len() * super::chunk::CHUNK) as u64
    }

    pub fn full(&self) -> bool {
        self.full
    }

    pub fn filled_once(&self) -> bool {
        self.filled_once.load(Ordering::Relaxed)
    }

    fn run(&self, chunks: &[Chunk]) {
        lower_priority();
        loop {
            {
                let mut st = self.state.lock();
                loop {
                    if st.stop {
                        return;
                    }
                    let work = if self.full {
                        st.holes
                    } else {
                        st.ready.len() < self.ready_max
                    };
                    if work {
                        break;
                    }
                    // Woken by take, hole and stop: nothing to do until then.
                    self.wake.wait(&mut st);
                }
                st.holes = false;
            }
            if self.full {
                self.fill_holes(chunks);
                self.filled_once.store(true, Ordering::Relaxed);
            } else {
                let c = ChunkMem::populated();
                let mut st = self.state.lock();
                if !st.stop {
                    st.ready.push(c);
                }
            }
        }
    }

    fn fill_holes(&self, chunks: &[Chunk]) {
        for c in chunks {
            if self.state.lock().stop {
                return;
            }
            if c.data.read().is_some() {
                continue;
            }
            let m = ChunkMem::populated();
            let mut slot = c.data.write();
            if slot.is_none() {
                c.addr.store(m.addr(), Ordering::Relaxed);
                *slot = Some(m);
            }
        }
    }
}

/// The allocator yields to the reactors when they share a CPU (nice 19).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid and setpriority on this thread only; failure is harmless.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 19);
    }
}

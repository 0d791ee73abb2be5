//! The NVMe/TCP transport: listeners, reactor threads, connections.
//!
//! Thread per core: each reactor is a single-threaded runtime pinned to a
//! CPU that owns whole connections (one connection = one queue pair), so a
//! queue's I/O path takes no lock and never hops threads. An acceptor thread
//! hands new connections to reactors round-robin.

mod conn;
mod io;
mod out;
pub mod pdu_check;
mod poll;
mod r2t;
mod secure;

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::{mpsc, watch};

use crate::Target;
use crate::config::{ListenerConfig, ListenerKind, TlsMode};
use crate::controller::FreeReason;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(
        "cannot listen on {addr} ([[listener]] address/port): address already in use; \
         stop the process holding it (another flashpool, or the kernel nvmet target) or pick another port"
    )]
    AddrInUse { addr: SocketAddr },
    #[error(
        "cannot listen on {addr} ([[listener]] address/port): {source}; \
         use an address this machine owns, e.g. 127.0.0.1 or 0.0.0.0"
    )]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start thread: {0}")]
    Thread(std::io::Error),
    #[error("cannot set up TLS for the TLS listeners: {0}")]
    Tls(#[from] nvme_tls::TlsError),
}

/// A connection on its way to a reactor, with its listener's TLS mode.
type Accepted = (std::net::TcpStream, TlsMode);

/// A running target. Dropping it without `shutdown` leaves threads running.
pub struct Server {
    target: Arc<Target>,
    shutdown: watch::Sender<bool>,
    threads: Vec<JoinHandle<()>>,
    acceptor: Option<JoinHandle<()>>,
    addrs: Vec<(SocketAddr, ListenerKind)>,
    /// Each reactor's runtime: work spawned on one runs on that reactor's thread.
    reactors: Vec<tokio::runtime::Handle>,
}

impl Server {
    pub fn start(target: Arc<Target>, listeners: &[ListenerConfig]) -> Result<Server, StartError> {
        let mut bound = Vec::new();
        for l in listeners {
            let sock = std::net::TcpListener::bind(l.addr).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AddrInUse {
                    StartError::AddrInUse { addr: l.addr }
                } else {
                    StartError::Bind {
                        addr: l.addr,
                        source: e,
                    }
                }
            })?;
            sock.set_nonblocking(true).map_err(|e| StartError::Bind {
                addr: l.addr,
                source: e,
            })?;
            let addr = sock.local_addr().map_err(|e| StartError::Bind {
                addr: l.addr,
                source: e,
            })?;
            bound.push((
                sock,
                ListenerConfig {
                    addr,
                    kind: l.kind,
                    tls: l.tls,
                },
            ));
        }
        *target.listeners.write() = bound.iter().map(|(_, l)| l.clone()).collect();
        let addrs = bound.iter().map(|(_, l)| (l.addr, l.kind)).collect();
        let tls = bound
            .iter()
            .any(|(_, l)| l.tls != TlsMode::None)
            .then(|| secure::acceptor(&target))
            .transpose()?;

        let (shutdown, shutdown_rx) = watch::channel(false);
        let mut threads = Vec::new();
        let mut senders = Vec::new();
        let mut reactors = Vec::new();
        let n = target.transport.reactors.max(1);
        for i in 0..n {
            let (tx, rx) = mpsc::unbounded_channel::<Accepted>();
            senders.push(tx);
            let cpu = (!target.transport.cpus.is_empty())
                .then(|| target.transport.cpus[i % target.transport.cpus.len()]);
            let target = target.clone();
            let sd = shutdown_rx.clone();
            let tls = tls.clone();
            let rt = runtime();
            reactors.push(rt.handle().clone());
            let h = std::thread::Builder::new()
                .name(format!("fp-reactor-{i}"))
                .spawn(move || reactor_main(i, cpu, rt, rx, target, tls, sd))
                .map_err(StartError::Thread)?;
            threads.push(h);
        }
        let sd = shutdown_rx.clone();
        let acceptor = std::thread::Builder::new()
            .name("fp-acceptor".into())
            .spawn(move || acceptor_main(bound, senders, sd))
            .map_err(StartError::Thread)?;
        Ok(Server {
            target,
            shutdown,
            threads,
            acceptor: Some(acceptor),
            addrs,
            reactors,
        })
    }

    pub fn local_addrs(&self) -> &[(SocketAddr, ListenerKind)] {
        &self.addrs
    }

    pub fn target(&self) -> &Arc<Target> {
        &self.target
    }

    /// The reactors' runtimes, one per reactor thread (current-thread
    /// runtimes: what is spawned on one runs on its reactor, beside the
    /// connections it serves).
    pub fn reactor_handles(&self) -> &[tokio::runtime::Handle] {
        &self.reactors
    }

    /// Stops accepting, lets in-flight I/O complete and answers go out,
    /// closes every connection, then flushes and closes the devices.
    pub fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.target.kill_all(FreeReason::Shutdown);
        for s in self.target.subsystems().iter() {
            for ns in s.namespaces().iter() {
                if let Err(e) = ns.dev.shutdown() {
                    tracing::error!("{} nsid {}: {}: {e}", s.nqn, ns.nsid, ns.dev.describe());
                }
            }
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio current-thread runtime")
}

fn acceptor_main(
    listeners: Vec<(std::net::TcpListener, ListenerConfig)>,
    reactors: Vec<mpsc::UnboundedSender<Accepted>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let rt = runtime();
    rt.block_on(async move {
        let (tx, mut rx) = mpsc::unbounded_channel();
        for (sock, cfg) in listeners {
            let l = tokio::net::TcpListener::from_std(sock).expect("listener into tokio");
            tracing::info!(
                "listening on {} ({})",
                cfg.addr,
                match cfg.kind {
                    ListenerKind::Io => "io",
                    ListenerKind::Discovery => "discovery",
                }
            );
            let tx = tx.clone();
            tokio::spawn(async move {
                loop {
                    match l.accept().await {
                        Ok((s, _)) => {
                            if tx.send((s, cfg.tls)).is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            // EMFILE and friends: back off instead of spinning.
                            tracing::warn!("accept on {}: {e}", cfg.addr);
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        }
                    }
                }
            });
        }
        let mut next = 0usize;
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                s = rx.recv() => {
                    let Some((s, tls)) = s else { return };
                    let _ = s.set_nodelay(true);
                    let Ok(s) = s.into_std() else { continue };
                    if reactors[next % reactors.len()].send((s, tls)).is_err() {
                        return;
                    }
                    next += 1;
                }
            }
        }
    });
}

fn reactor_main(
    index: usize,
    cpu: Option<usize>,
    rt: tokio::runtime::Runtime,
    mut rx: mpsc::UnboundedReceiver<Accepted>,
    target: Arc<Target>,
    tls: Option<nvme_tls::TlsAcceptor>,
    mut shutdown: watch::Receiver<bool>,
) {
    if let Some(cpu) = cpu {
        pin_to_cpu(cpu);
    }
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let mut conns = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                s = rx.recv() => {
                    let Some((s, mode)) = s else { break };
                    let Ok(s) = tokio::net::TcpStream::from_std(s) else { continue };
                    conns.spawn_local(conn::serve(s, mode, tls.clone(), target.clone(), shutdown.clone()));
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
        while conns.join_next().await.is_some() {}
        tracing::debug!("reactor {index} stopped");
    });
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; sched_setaffinity(0, ..) only affects this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            tracing::warn!(
                "cannot pin reactor to CPU {cpu}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

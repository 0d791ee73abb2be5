//! A fast process-death signal between nodes. etcd leases catch a silent
//! node only after the TTL; a peer whose process died is seen at once: its
//! kernel resets the connection and refuses new ones. A frozen (SIGSTOP) or
//! cut-off peer does neither, so it is left to the lease.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// Accepts connections and holds them open, never writing. Runs until dropped.
pub struct LivenessListener {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl LivenessListener {
    pub async fn bind(addr: &str) -> io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let mut held = JoinSet::new();
            loop {
                tokio::select! {
                    r = listener.accept() => match r {
                        Ok((mut s, _)) => {
                            held.spawn(async move {
                                let mut buf = [0u8; 64];
                                while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
                            });
                        }
                        Err(e) => {
                            tracing::warn!("liveness listener {addr}: accept: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    },
                    Some(_) = held.join_next(), if !held.is_empty() => {}
                }
            }
        });
        Ok(LivenessListener { addr, task })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for LivenessListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The peer's process is gone (its connection ended and its port refuses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerGone {
    pub addr: String,
}

/// How long a refused re-connect may take to count as "the process is dead".
const REFUSED_WITHIN: Duration = Duration::from_millis(200);

/// Returns only when an established connection to `addr` ends (EOF or
/// reset) and a fresh connect is refused within 200 ms: the process is dead.
/// While it cannot connect at all it keeps retrying; a frozen or cut-off
/// peer never makes it return.
pub async fn watch_peer_death(addr: &str) -> PeerGone {
    loop {
        let mut s = match TcpStream::connect(addr).await {
            Ok(s) => s,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let mut buf = [0u8; 64];
        while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
        drop(s);
        // A dying process can still complete a handshake for a moment after
        // its connections end: keep trying for the whole window.
        let window = tokio::time::Instant::now() + REFUSED_WITHIN;
        while let Ok(r) = tokio::time::timeout_at(window, TcpStream::connect(addr)).await {
            match r {
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    tracing::info!(
                        peer = addr,
                        "peer process is gone (connection ended, port refuses)"
                    );
                    return PeerGone {
                        addr: addr.to_string(),
                    };
                }
                // accepted or another error: not proof of death (yet)
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }
}

//! Listeners that tell [`PeerInfo`] (the plain one, the TLS one and the
//! Unix socket), for `axum::serve` with connect info.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use super::auth::PeerInfo;

/// How long a client has to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at most; more connections wait.
const MAX_HANDSHAKES: usize = 64;

async fn accept_tcp(l: &TcpListener) -> (TcpStream, SocketAddr, SocketAddr) {
    loop {
        match l.accept().await {
            Ok((s, peer)) => {
                let local = s.local_addr().unwrap_or(peer);
                return (s, peer, local);
            }
            Err(e) => {
                tracing::debug!("management API: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

pub struct Plain(pub TcpListener);

impl Listener for Plain {
    type Io = TcpStream;
    type Addr = PeerInfo;
    async fn accept(&mut self) -> (TcpStream, PeerInfo) {
        let (s, peer, local) = accept_tcp(&self.0).await;
        (
            s,
            PeerInfo::Tcp {
                peer,
                local,
                cert: None,
            },
        )
    }
    fn local_addr(&self) -> io::Result<PeerInfo> {
        let a = self.0.local_addr()?;
        Ok(PeerInfo::Tcp {
            peer: a,
            local: a,
            cert: None,
        })
    }
}

/// HTTPS: each connection's handshake runs in its own task (bounded in
/// time and number), so one slow client holds up no other.
pub struct Tls {
    rx: tokio::sync::mpsc::Receiver<(tokio_rustls::server::TlsStream<TcpStream>, PeerInfo)>,
    local: SocketAddr,
}

impl Tls {
    pub fn new(l: TcpListener, cfg: Arc<rustls::ServerConfig>) -> io::Result<Tls> {
        let local = l.local_addr()?;
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let (s, peer, local) = accept_tcp(&l).await;
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let r = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(s)).await;
                    drop(slot);
                    match r {
                        Ok(Ok(tls)) => {
                            // Only a certificate that `[api] client_ca`
                            // verified gets this far (none is asked for
                            // without it).
                            let cert = tls
                                .get_ref()
                                .1
                                .peer_certificates()
                                .and_then(|c| c.first())
                                .map(super::tls::identity);
                            let _ = tx.send((tls, PeerInfo::Tcp { peer, local, cert })).await;
                        }
                        // A refused client certificate is a refused call:
                        // logged as one. Other failures (a scanner, plain
                        // HTTP) are not worth a warning.
                        Ok(Err(e)) if super::tls::refused_client_cert(&e) => tracing::warn!(
                            target: "flashpool::api::audit",
                            peer = %peer, reason = %e,
                            "management API connection refused: client certificate"
                        ),
                        Ok(Err(e)) => tracing::debug!("management API: TLS from {peer}: {e}"),
                        Err(_) => {
                            tracing::debug!("management API: TLS from {peer}: handshake timed out")
                        }
                    }
                });
            }
        });
        Ok(Tls { rx, local })
    }
}

impl Listener for Tls {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    type Addr = PeerInfo;
    async fn accept(&mut self) -> (Self::Io, PeerInfo) {
        match self.rx.recv().await {
            Some(c) => c,
            None => std::future::pending().await,
        }
    }
    fn local_addr(&self) -> io::Result<PeerInfo> {
        Ok(PeerInfo::Tcp {
            peer: self.local,
            local: self.local,
            cert: None,
        })
    }
}

/// The Unix socket: its file mode (0600 or 0660) says who may call.
pub struct Unix(pub UnixListener);

impl Listener for Unix {
    type Io = UnixStream;
    type Addr = PeerInfo;
    async fn accept(&mut self) -> (UnixStream, PeerInfo) {
        loop {
            match self.0.accept().await {
                Ok((s, _)) => {
                    let cred = s.peer_cred().ok();
                    let info = PeerInfo::Unix {
                        uid: cred.map(|c| c.uid()),
                        pid: cred.and_then(|c| c.pid()),
                    };
                    return (s, info);
                }
                Err(e) => {
                    tracing::debug!("management API socket: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
    fn local_addr(&self) -> io::Result<PeerInfo> {
        Ok(PeerInfo::Unix {
            uid: None,
            pid: None,
        })
    }
}

impl Connected<IncomingStream<'_, Plain>> for PeerInfo {
    fn connect_info(s: IncomingStream<'_, Plain>) -> Self {
        s.remote_addr().clone()
    }
}
impl Connected<IncomingStream<'_, Tls>> for PeerInfo {
    fn connect_info(s: IncomingStream<'_, Tls>) -> Self {
        s.remote_addr().clone()
    }
}
impl Connected<IncomingStream<'_, Unix>> for PeerInfo {
    fn connect_info(s: IncomingStream<'_, Unix>) -> Self {
        s.remote_addr().clone()
    }
}

/// Binds the Unix socket at `path` with `mode` (a stale socket file is
/// replaced; anything else there is an error).
pub fn bind_unix(path: &Path, mode: u32) -> Result<Unix> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_socket() {
            anyhow::bail!(
                "config: api.unix_socket = {}: something that is not a socket is there; remove it or choose another path",
                path.display()
            );
        }
        std::fs::remove_file(path)?;
    }
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)
            .with_context(|| format!("config: api.unix_socket: cannot make {}", d.display()))?;
    }
    // Made with no permission for anyone, then opened up to `mode`:
    // no one connects before the mode is set.
    // SAFETY: umask only swaps the process's file mode mask.
    let old = unsafe { libc::umask(0o777) };
    let l = UnixListener::bind(path);
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(old) };
    let l = l.with_context(|| {
        format!(
            "config: api.unix_socket = {}: cannot listen there",
            path.display()
        )
    })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(Unix(l))
}

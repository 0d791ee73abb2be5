//! A new connection's channel, before any NVMe/TCP PDU: plain TCP, or a
//! TLS 1.3 handshake whose PSK is looked up in the target's subsystems by
//! the identity the host offers (TP 8011).

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use nvme_tls::{PskStore, Stream, TlsAcceptor};
use nvme_wire::tls_psk::{ConfiguredPsk, PskIdentity};
use tokio::net::TcpStream;

use crate::Target;
use crate::config::TlsMode;

/// How long a host may take to start and finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The first byte of a TLS handshake record (content type 22).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The target's hosts' keys, as the TLS server asks for them.
struct TargetPsks(Arc<Target>);

impl PskStore for TargetPsks {
    fn configured_psk(&self, hostnqn: &str, subnqn: &str) -> Option<ConfiguredPsk> {
        self.0.tls_psk(hostnqn, subnqn)
    }
}

/// The TLS server of `target`, shared by every TLS listener.
pub(super) fn acceptor(target: &Arc<Target>) -> Result<TlsAcceptor, nvme_tls::TlsError> {
    TlsAcceptor::new(Arc::new(TargetPsks(target.clone())))
}

/// The channel of a new connection, and the identity TLS proved; None when
/// the connection is refused (logged here, with the peer and the reason).
pub(super) async fn open(
    tcp: TcpStream,
    mode: TlsMode,
    tls: Option<&TlsAcceptor>,
    target: &Target,
    peer: &str,
) -> Option<(Stream, Option<PskIdentity>)> {
    let (TlsMode::Optional | TlsMode::Required, Some(acc)) = (mode, tls) else {
        return Some((Stream::Plain(tcp), None));
    };
    let fail = |why: String| {
        target.counters.tls_handshake_failures.fetch_add(1, Relaxed);
        tracing::warn!("{peer}: TLS refused: {why}");
        None
    };
    let mut b = [0u8; 1];
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tcp.peek(&mut b)).await {
        Ok(Ok(1)) if b[0] == TLS_HANDSHAKE_RECORD => {}
        Ok(Ok(1)) if mode == TlsMode::Optional => return Some((Stream::Plain(tcp), None)),
        Ok(Ok(1)) => {
            return fail(format!(
                "this listener requires TLS, but the host sent a byte {:#04x} instead of \
                 a TLS handshake (plain NVMe/TCP? connect with --tls)",
                b[0]
            ));
        }
        Err(_) => return fail(format!("the host sent nothing for {HANDSHAKE_TIMEOUT:?}")),
        // Closed or failed before a byte: nothing to serve either way.
        _ => return None,
    }
    match acc.accept(tcp, HANDSHAKE_TIMEOUT).await {
        Ok(a) => {
            target.counters.tls_handshakes.fetch_add(1, Relaxed);
            tracing::info!(
                "{peer}: TLS 1.3 channel ({}), identity {}",
                a.stream.cipher().unwrap_or("?"),
                a.identity.encode()
            );
            Some((a.stream, Some(a.identity)))
        }
        Err(e) => fail(e.to_string()),
    }
}

//! The NVMe/TCP secure channel (TP 8011): TLS 1.3 only, authenticated by a
//! PSK alone (no certificates), TLS_AES_128_GCM_SHA256 and
//! TLS_AES_256_GCM_SHA384. The PSK of a connection is derived from the
//! host's configured `NVMeTLSkey-1:` key and the identity the host offers
//! (see `nvme_wire::tls_psk`); the target looks the key up by the identity's
//! host and subsystem NQNs.
//!
//! The stack is OpenSSL: rustls has no external-PSK support (docs/config.md,
//! "Why OpenSSL"), and the Linux host's `tlshd` (GnuTLS) is what we must meet.
//! No session tickets are sent: the Linux host hands the socket to kTLS
//! after the handshake and treats any later handshake record as an error.

mod client;
mod coalesce;
mod ffi;
mod server;
mod stream;

pub use client::{ClientPsk, connect};
pub use server::{Accepted, PskStore, TlsAcceptor};
pub use stream::Stream;

/// Why a secure channel was not set up. The messages never quote a key.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS setup: {0}")]
    Setup(#[from] openssl::error::ErrorStack),
    #[error("TLS handshake: {0}")]
    Handshake(String),
    #[error("TLS handshake did not finish within {0:?}")]
    Timeout(std::time::Duration),
}

/// The TLS 1.3 cipher suites NVMe/TCP uses, in OpenSSL's names.
const CIPHER_SUITES: &str = "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384";

/// A context builder for either side: TLS 1.3 only, partial writes on (the
/// connection retries with the same queued bytes), no session cache.
fn base_context(
    method: openssl::ssl::SslMethod,
    suites: &str,
) -> Result<openssl::ssl::SslContextBuilder, openssl::error::ErrorStack> {
    use openssl::ssl::{SslContextBuilder, SslMode, SslSessionCacheMode, SslVersion};
    let mut b = SslContextBuilder::new(method)?;
    b.set_min_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_max_proto_version(Some(SslVersion::TLS1_3))?;
    b.set_ciphersuites(suites)?;
    b.set_mode(SslMode::ENABLE_PARTIAL_WRITE | SslMode::ACCEPT_MOVING_WRITE_BUFFER);
    b.set_session_cache_mode(SslSessionCacheMode::OFF);
    // Read whole batches of records per syscall, not a 5-byte header and
    // then a body per record; readiness then looks at SSL_has_pending.
    b.set_read_ahead(true);
    Ok(b)
}

/// The handshake's own error, or OpenSSL's reason for it.
fn handshake_error(e: openssl::ssl::Error) -> String {
    if let Some(stack) = e.ssl_error() {
        let reasons: Vec<String> = stack
            .errors()
            .iter()
            .map(|x| x.reason().unwrap_or("unknown").to_string())
            .collect();
        if !reasons.is_empty() {
            return reasons.join("; ");
        }
    }
    match e.io_error() {
        Some(io) => io.to_string(),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests;

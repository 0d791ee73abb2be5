//! The host side: a TLS 1.3 client that offers one PSK identity.

use std::os::raw::{c_int, c_uchar};
use std::panic::AssertUnwindSafe;
use std::sync::OnceLock;
use std::time::Duration;

use nvme_wire::tls_psk::{ConfiguredPsk, PskHash};
use openssl::ex_data::Index;
use openssl::ssl::{Ssl, SslMethod, SslVerifyMode};
use openssl_sys::{EVP_MD, SSL, SSL_SESSION};
use tokio::net::TcpStream;

use crate::{Stream, TlsError, base_context, ffi, handshake_error};

/// The identity and TLS PSK a host offers on one connection.
pub struct ClientPsk {
    identity: Vec<u8>,
    psk: Vec<u8>,
    hash: PskHash,
}

impl ClientPsk {
    /// From the host's configured key, for `subnqn` (identity version 0 or 1).
    pub fn new(key: &ConfiguredPsk, hostnqn: &str, subnqn: &str, version: u8) -> ClientPsk {
        let (id, psk) = key.derive(hostnqn, subnqn, version);
        ClientPsk {
            identity: id.encode().into_bytes(),
            psk,
            hash: id.hash,
        }
    }

    pub fn identity(&self) -> &str {
        std::str::from_utf8(&self.identity).unwrap_or("?")
    }
}

fn psk_index() -> Index<Ssl, ClientPsk> {
    static I: OnceLock<Index<Ssl, ClientPsk>> = OnceLock::new();
    *I.get_or_init(|| Ssl::new_ex_index().expect("OpenSSL ex_data index"))
}

/// Runs the client handshake on `tcp` with `psk`, within `timeout`.
pub async fn connect(
    tcp: TcpStream,
    psk: ClientPsk,
    timeout: Duration,
) -> Result<Stream, TlsError> {
    let suite = match psk.hash {
        PskHash::Sha256 => "TLS_AES_128_GCM_SHA256",
        PskHash::Sha384 => "TLS_AES_256_GCM_SHA384",
    };
    let mut b = base_context(SslMethod::tls_client(), suite)?;
    // No CA is trusted: a target that answers with a certificate instead
    // of our PSK fails the handshake.
    b.set_verify(SslVerifyMode::PEER);
    // SAFETY: the context is live; the callback only uses what OpenSSL passes it.
    unsafe { ffi::SSL_CTX_set_psk_use_session_callback(b.as_ptr(), Some(use_session)) };
    let ctx = b.build();
    let mut ssl = Ssl::new(&ctx)?;
    let identity = psk.identity().to_string();
    ssl.set_ex_data(psk_index(), psk);
    // The host's non-blocking writes go straight to the socket.
    let mut s = tokio_openssl::SslStream::new(ssl, crate::coalesce::Coalesce::new(tcp, 0))?;
    match tokio::time::timeout(timeout, std::pin::Pin::new(&mut s).connect()).await {
        Err(_) => Err(TlsError::Timeout(timeout)),
        Ok(Err(e)) => Err(TlsError::Handshake(format!(
            "{} (offered identity {identity})",
            handshake_error(e)
        ))),
        Ok(Ok(())) if !s.ssl().session_reused() => Err(TlsError::Handshake(format!(
            "the target did not take the PSK (offered identity {identity})"
        ))),
        Ok(Ok(())) => Ok(Stream::tls(s)),
    }
}

/// `SSL_psk_use_session_cb_func`: offers our identity, unless a
/// HelloRetryRequest chose a hash our PSK is not for.
unsafe extern "C" fn use_session(
    ssl: *mut SSL,
    md: *const EVP_MD,
    id: *mut *const c_uchar,
    idlen: *mut usize,
    sess: *mut *mut SSL_SESSION,
) -> c_int {
    let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: OpenSSL passes the live SSL for the callback's duration.
        let ssl = unsafe { ffi::ssl_mut(ssl) };
        let psk = ssl.ex_data(psk_index())?;
        let (cipher, cmd) = ffi::cipher(ssl, psk.hash)?;
        if !md.is_null() && md != cmd {
            return None;
        }
        let s = ffi::psk_session(cipher, &psk.psk);
        (!s.is_null()).then_some((s, psk.identity.as_ptr(), psk.identity.len()))
    }));
    match r {
        Ok(found) => {
            let (s, p, n) = found.unwrap_or((std::ptr::null_mut(), std::ptr::null(), 0));
            // SAFETY: OpenSSL's out pointers; the identity lives in the SSL's
            // ex_data as long as the SSL, which outlives the handshake.
            unsafe {
                *sess = s;
                *id = p;
                *idlen = n;
            }
            1
        }
        Err(_) => 0,
    }
}

//! The target side: a TLS 1.3 server that takes only PSKs, chosen by the
//! identity the host offers.

use std::os::raw::{c_int, c_uchar};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use nvme_wire::tls_psk::{ConfiguredPsk, Derivation, PskHash, PskIdentity};
use openssl::ex_data::Index;
use openssl::ssl::{Ssl, SslContext, SslContextRef, SslMethod, SslOptions};
use openssl_sys::{SSL, SSL_SESSION};
use tokio::net::TcpStream;

use crate::{CIPHER_SUITES, Stream, TlsError, base_context, ffi, handshake_error};

/// Where the target keeps its hosts' configured PSKs.
pub trait PskStore: Send + Sync {
    /// The configured PSK `hostnqn` uses on `subnqn` (which may be the
    /// discovery NQN), if it has one.
    fn configured_psk(&self, hostnqn: &str, subnqn: &str) -> Option<ConfiguredPsk>;
}

/// A finished handshake: the channel and the identity it proved.
pub struct Accepted {
    pub stream: Stream,
    pub identity: PskIdentity,
}

/// What the PSK lookup made of the host's identity, kept for the log.
enum Lookup {
    Chosen(PskIdentity),
    Refused(String),
}

fn store_index() -> Index<SslContext, Arc<dyn PskStore>> {
    static I: OnceLock<Index<SslContext, Arc<dyn PskStore>>> = OnceLock::new();
    *I.get_or_init(|| SslContext::new_ex_index().expect("OpenSSL ex_data index"))
}

fn lookup_index() -> Index<Ssl, Lookup> {
    static I: OnceLock<Index<Ssl, Lookup>> = OnceLock::new();
    *I.get_or_init(|| Ssl::new_ex_index().expect("OpenSSL ex_data index"))
}

/// A TLS server context for one target; cheap to share between listeners.
#[derive(Clone)]
pub struct TlsAcceptor {
    ctx: SslContext,
}

impl TlsAcceptor {
    pub fn new(store: Arc<dyn PskStore>) -> Result<TlsAcceptor, TlsError> {
        let mut b = base_context(SslMethod::tls_server(), CIPHER_SUITES)?;
        // Tickets would reach the Linux host's kTLS socket as a handshake
        // record after the handshake, which it refuses.
        b.set_num_tickets(0)?;
        b.set_options(SslOptions::NO_TICKET);
        b.set_ex_data(store_index(), store);
        // SAFETY: the context is live; the callback only uses what OpenSSL passes it.
        unsafe { ffi::SSL_CTX_set_psk_find_session_callback(b.as_ptr(), Some(find_session)) };
        Ok(TlsAcceptor { ctx: b.build() })
    }

    /// Runs the server handshake on `tcp`, within `timeout`.
    pub async fn accept(&self, tcp: TcpStream, timeout: Duration) -> Result<Accepted, TlsError> {
        let ssl = Ssl::new(&self.ctx)?;
        // Records of one flush leave together (see coalesce.rs).
        let tcp = crate::coalesce::Coalesce::new(tcp, 64 * 1024);
        let mut s = tokio_openssl::SslStream::new(ssl, tcp)?;
        let r = tokio::time::timeout(timeout, std::pin::Pin::new(&mut s).accept()).await;
        let lookup = s.ssl().ex_data(lookup_index());
        let who = match lookup {
            Some(Lookup::Chosen(id)) => format!(" (identity {})", id.encode()),
            Some(Lookup::Refused(why)) => format!(" ({why})"),
            None => " (the host offered no PSK identity)".into(),
        };
        match r {
            Err(_) => return Err(TlsError::Timeout(timeout)),
            Ok(Err(e)) => {
                let why = handshake_error(e);
                // GnuTLS before 3.8.10 (tlshd on Debian 13 and the like)
                // computes every PSK binder with SHA-256, so a SHA-384 PSK's
                // binder has the wrong length and OpenSSL calls it a bad
                // extension.
                let hint = match lookup {
                    Some(Lookup::Chosen(id))
                        if id.hash == PskHash::Sha384 && why.contains("bad extension") =>
                    {
                        "; a SHA-384 PSK with a binder of the wrong length: GnuTLS before \
                         3.8.10 (tlshd) computes it with SHA-256, use a hash 01 key with such hosts"
                    }
                    _ => "",
                };
                return Err(TlsError::Handshake(format!("{why}{who}{hint}")));
            }
            Ok(Ok(())) => {}
        }
        // The only way in is our PSK: a session not resumed from it did not use one.
        match (s.ssl().session_reused(), lookup) {
            (true, Some(Lookup::Chosen(id))) => Ok(Accepted {
                identity: id.clone(),
                stream: Stream::tls(s),
            }),
            _ => Err(TlsError::Handshake(format!("no PSK was used{who}"))),
        }
    }
}

fn store_of(ctx: &SslContextRef) -> Option<Arc<dyn PskStore>> {
    ctx.ex_data(store_index()).cloned()
}

/// What to do with the identity a host offered.
fn choose(store: &dyn PskStore, raw: &[u8]) -> Result<(PskIdentity, Vec<u8>), String> {
    let shown = String::from_utf8_lossy(&raw[..raw.len().min(300)]).into_owned();
    let id = PskIdentity::parse(raw).map_err(|e| format!("PSK identity {shown:?}: {e}"))?;
    let key = store
        .configured_psk(&id.hostnqn, &id.subnqn)
        .ok_or_else(|| format!("no TLS PSK for host {} on {}", id.hostnqn, id.subnqn))?;
    let (psk, derivation) = id.tls_psk_from(&key).ok_or_else(|| {
        format!(
            "the TLS PSK of host {} on {} does not fit identity {shown:?} (another hash or digest)",
            id.hostnqn, id.subnqn
        )
    })?;
    if derivation == Derivation::LibnvmeCompat {
        tracing::debug!("identity {shown:?}: PSK derived as libnvme before 1.16 does");
    }
    Ok((id, psk))
}

/// `SSL_psk_find_session_cb_func`: 1 with a session = this PSK, 1 with
/// none = unknown identity (the handshake fails), 0 = abort.
unsafe extern "C" fn find_session(
    ssl: *mut SSL,
    identity: *const c_uchar,
    len: usize,
    sess: *mut *mut SSL_SESSION,
) -> c_int {
    let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: OpenSSL passes the live SSL and `len` readable identity bytes.
        let ssl = unsafe { ffi::ssl_mut(ssl) };
        let raw = if identity.is_null() {
            &[][..]
        } else {
            // SAFETY: as above.
            unsafe { std::slice::from_raw_parts(identity, len) }
        };
        let Some(store) = store_of(ssl.ssl_context()) else {
            return std::ptr::null_mut();
        };
        match choose(store.as_ref(), raw) {
            Ok((id, psk)) => {
                let Some((cipher, _)) = ffi::cipher(ssl, id.hash) else {
                    ssl.set_ex_data(lookup_index(), Lookup::Refused("no cipher suite".into()));
                    return std::ptr::null_mut();
                };
                let s = ffi::psk_session(cipher, &psk);
                ssl.set_ex_data(lookup_index(), Lookup::Chosen(id));
                s
            }
            Err(why) => {
                ssl.set_ex_data(lookup_index(), Lookup::Refused(why));
                std::ptr::null_mut()
            }
        }
    }));
    match r {
        Ok(s) => {
            // SAFETY: `sess` is OpenSSL's out pointer; it takes our reference.
            unsafe { *sess = s };
            1
        }
        Err(_) => 0,
    }
}

//! The OpenSSL calls the `openssl` crates do not wrap: TLS 1.3 external-PSK
//! callbacks, which pick a PSK per identity and per hash (the legacy PSK
//! callbacks that `openssl` wraps only ever give TLS 1.3 a SHA-256 PSK, so
//! TLS_AES_256_GCM_SHA384 keys would be refused).

use std::os::raw::{c_int, c_uchar};

use foreign_types::ForeignTypeRef;
use nvme_wire::tls_psk::PskHash;
use openssl::ssl::SslRef;
use openssl_sys::{EVP_MD, SSL, SSL_CIPHER, SSL_CTX, SSL_SESSION};

/// `SSL_psk_find_session_cb_func`.
pub type FindSessionCb =
    unsafe extern "C" fn(*mut SSL, *const c_uchar, usize, *mut *mut SSL_SESSION) -> c_int;
/// `SSL_psk_use_session_cb_func`.
pub type UseSessionCb = unsafe extern "C" fn(
    *mut SSL,
    *const EVP_MD,
    *mut *const c_uchar,
    *mut usize,
    *mut *mut SSL_SESSION,
) -> c_int;

unsafe extern "C" {
    pub fn SSL_CTX_set_psk_find_session_callback(ctx: *mut SSL_CTX, cb: Option<FindSessionCb>);
    pub fn SSL_CTX_set_psk_use_session_callback(ctx: *mut SSL_CTX, cb: Option<UseSessionCb>);
    fn SSL_SESSION_new() -> *mut SSL_SESSION;
    fn SSL_SESSION_set1_master_key(s: *mut SSL_SESSION, key: *const c_uchar, len: usize) -> c_int;
    fn SSL_SESSION_set_cipher(s: *mut SSL_SESSION, c: *const SSL_CIPHER) -> c_int;
    fn SSL_SESSION_set_protocol_version(s: *mut SSL_SESSION, v: c_int) -> c_int;
    fn SSL_CIPHER_find(ssl: *mut SSL, code: *const c_uchar) -> *const SSL_CIPHER;
    fn SSL_CIPHER_get_handshake_digest(c: *const SSL_CIPHER) -> *const EVP_MD;
    fn SSL_has_pending(ssl: *const SSL) -> c_int;
}

/// Whether OpenSSL holds bytes not yet returned to the caller: decrypted
/// plaintext, or (with read-ahead) raw records read from the socket but not
/// yet processed. Either way a read makes progress without the socket.
pub fn has_pending(ssl: &SslRef) -> bool {
    // SAFETY: `ssl` is a live SSL; the call only reads its buffers' state.
    unsafe { SSL_has_pending(ssl.as_ptr()) == 1 }
}

const TLS1_3_VERSION: c_int = 0x0304;

/// The cipher suite of `hash` and its handshake digest, as this SSL knows them.
pub fn cipher(ssl: &SslRef, hash: PskHash) -> Option<(*const SSL_CIPHER, *const EVP_MD)> {
    let code = hash.cipher_suite();
    // SAFETY: `ssl` is a live SSL; SSL_CIPHER_find reads two bytes of `code`.
    let c = unsafe { SSL_CIPHER_find(ssl.as_ptr(), code.as_ptr()) };
    if c.is_null() {
        return None;
    }
    // SAFETY: `c` is a static cipher description returned by OpenSSL.
    let md = unsafe { SSL_CIPHER_get_handshake_digest(c) };
    Some((c, md))
}

/// A TLS 1.3 session holding `psk` for `cipher`; the caller hands its
/// reference to OpenSSL. Null if OpenSSL refused any part of it.
pub fn psk_session(cipher: *const SSL_CIPHER, psk: &[u8]) -> *mut SSL_SESSION {
    // SAFETY: a fresh session is ours until returned; every setter copies
    // what it is given; on failure the session is freed here.
    unsafe {
        let s = SSL_SESSION_new();
        if s.is_null() {
            return s;
        }
        if SSL_SESSION_set1_master_key(s, psk.as_ptr(), psk.len()) != 1
            || SSL_SESSION_set_cipher(s, cipher) != 1
            || SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION) != 1
        {
            openssl_sys::SSL_SESSION_free(s);
            return std::ptr::null_mut();
        }
        s
    }
}

/// The `SslRef` of a callback's SSL pointer.
///
/// # Safety
/// `ssl` must be the live SSL OpenSSL passed to the callback.
pub unsafe fn ssl_mut<'a>(ssl: *mut SSL) -> &'a mut SslRef {
    // SAFETY: per the contract, valid for the callback's duration.
    unsafe { SslRef::from_ptr_mut(ssl) }
}

//! Encryption at rest: AES-XTS-256 above the members.
//!
//! A volume made encrypted has a random 512-bit data key (two AES-256 keys,
//! as XTS takes), kept only wrapped by a key-encryption key (KEK, AES key
//! wrap, RFC 3394) in a [`KeyEnvelope`] in every member's superblock, with a
//! key check value beside it. The owner unwraps it at assembly and encrypts
//! every block before it leaves for a member, so members, the wire to them,
//! rebuild and scrub (which work on members) only ever see ciphertext and
//! need no key. A wrong or missing KEK refuses to unlock the volume; it never
//! serves garbage.
//!
//! The XTS data unit is the volume's logical block (512 B or 4 KiB) and its
//! tweak the block's LBA (little-endian, as IEEE 1619's data unit sequence
//! number), so a block encrypts the same wherever the request that carried
//! it started.
//!
//! Blocks whose ciphertext is all zeroes read back as zeroes: members that
//! were never written, and ranges deallocated or written as zeroes, read as
//! zeroes through the volume as they do unencrypted (a real ciphertext unit
//! is all zeroes with probability 2^-4096). The price: whoever holds the
//! drives sees which blocks are zero, as with dm-crypt and discard.
//!
//! The cipher is OpenSSL's `EVP_aes_256_xts` (already linked for TLS, see
//! `nvme-tls`): maintained, constant time, with AES-NI (and VAES on newer
//! builds); `benches/xts.rs` measures it.

mod device;
mod key;
mod xts;

#[cfg(test)]
mod tests;

pub use device::EncryptedDevice;
pub(crate) use device::{CryptPath, decrypt_read, encrypt_write, finish_write};
pub use key::{DATA_KEY_BYTES, DataKey, ENVELOPE_BYTES, KEK_BYTES, Kek, KekId, KeyEnvelope, wipe};
pub use xts::Xts;

/// Why a key could not be made, wrapped or used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CryptError {
    #[error(
        "the volume key was wrapped by key-encryption key {wanted}, but this node has {have}; \
         give the node the kek_file the volume was made with (every node of a cluster needs the same one)"
    )]
    WrongKek { wanted: KekId, have: String },
    #[error(
        "the volume key does not unwrap with key-encryption key {0} (the wrapped key or the KEK is \
         corrupt); the volume stays locked"
    )]
    Unwrap(KekId),
    #[error(
        "the volume key does not match its key check value; the volume stays locked rather than \
         serve garbage"
    )]
    KeyCheck,
    #[error("key envelope: {0}")]
    Envelope(String),
    #[error("crypto library: {0}")]
    Library(String),
}

impl From<openssl::error::ErrorStack> for CryptError {
    fn from(e: openssl::error::ErrorStack) -> Self {
        CryptError::Library(e.to_string())
    }
}

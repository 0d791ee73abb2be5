//! Data keys, key-encryption keys and the envelope that carries a wrapped
//! data key in the superblocks.
//!
//! Envelope layout (128 bytes, in the superblock at `superblock::KEY_AT`):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | cipher: 1 = AES-XTS-256 (0: not encrypted) |
//! | 8 | 8 | id of the KEK that wrapped the key ([`KekId`]) |
//! | 16 | 72 | the 64-byte data key wrapped by the KEK (AES-256 key wrap, RFC 3394) |
//! | 88 | 16 | key check value: HMAC-SHA256(data key, "flashpool key check"), first 16 bytes |
//! | 104 | 24 | zero |

use openssl::aes::{AesKey, unwrap_key, wrap_key};
use openssl::hash::MessageDigest;
use openssl::memcmp;
use openssl::pkey::PKey;
use openssl::sign::Signer;

use super::CryptError;

/// An XTS-AES-256 data key: two AES-256 keys.
pub const DATA_KEY_BYTES: usize = 64;
/// An AES-256 key-encryption key.
pub const KEK_BYTES: usize = 32;
/// Bytes of an encoded [`KeyEnvelope`].
pub const ENVELOPE_BYTES: usize = 128;
const WRAPPED_BYTES: usize = DATA_KEY_BYTES + 8;
const KCV_BYTES: usize = 16;
const CIPHER_XTS_256: u8 = 1;

fn hmac16(key: &[u8], msg: &[u8]) -> Result<[u8; 16], CryptError> {
    let pkey = PKey::hmac(key)?;
    let mut s = Signer::new(MessageDigest::sha256(), &pkey)?;
    s.update(msg)?;
    let full = s.sign_to_vec()?;
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    Ok(out)
}

/// A volume's data key. Never printed (Debug shows only that it is one),
/// zeroed when dropped.
#[derive(Clone)]
pub struct DataKey(Box<[u8; DATA_KEY_BYTES]>);

impl DataKey {
    /// A fresh key from OpenSSL's CSPRNG. The two halves differ (XTS with
    /// equal halves is refused by OpenSSL and weak).
    pub fn generate() -> Result<DataKey, CryptError> {
        let mut k = Box::new([0u8; DATA_KEY_BYTES]);
        loop {
            openssl::rand::rand_bytes(&mut k[..])?;
            if k[..32] != k[32..] {
                return Ok(DataKey(k));
            }
        }
    }

    /// A key from its bytes (tests, known-answer vectors).
    pub fn from_bytes(b: [u8; DATA_KEY_BYTES]) -> DataKey {
        DataKey(Box::new(b))
    }

    pub(crate) fn bytes(&self) -> &[u8; DATA_KEY_BYTES] {
        &self.0
    }

    /// The key check value stored beside the wrapped key.
    pub fn check_value(&self) -> Result<[u8; KCV_BYTES], CryptError> {
        hmac16(&self.0[..], b"flashpool key check")
    }
}

impl Drop for DataKey {
    fn drop(&mut self) {
        wipe(&mut self.0[..]);
    }
}

impl std::fmt::Debug for DataKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DataKey(..)")
    }
}

/// Overwrites key bytes; volatile so the stores are not optimised away.
pub fn wipe(b: &mut [u8]) {
    for x in b.iter_mut() {
        // SAFETY: x is a valid, aligned, exclusive reference to a u8.
        unsafe { std::ptr::write_volatile(x, 0) };
    }
}

/// Names a KEK without revealing it: the first 8 bytes of
/// HMAC-SHA256(KEK, "flashpool kek id"), shown as 16 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KekId(pub [u8; 8]);

impl std::fmt::Display for KekId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for KekId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KekId({self})")
    }
}

/// A key-encryption key (the node's `kek_file`). Never printed, zeroed on drop.
pub struct Kek {
    key: Box<[u8; KEK_BYTES]>,
    id: KekId,
}

impl Kek {
    pub fn generate() -> Result<Kek, CryptError> {
        let mut k = [0u8; KEK_BYTES];
        openssl::rand::rand_bytes(&mut k)?;
        let kek = Kek::from_bytes(&k);
        wipe(&mut k);
        kek
    }

    /// A KEK from its 32 bytes (as read from the kek file).
    pub fn from_bytes(b: &[u8]) -> Result<Kek, CryptError> {
        let key: [u8; KEK_BYTES] = b.try_into().map_err(|_| {
            CryptError::Envelope(format!(
                "a key-encryption key is {KEK_BYTES} bytes, not {}",
                b.len()
            ))
        })?;
        let mut id = [0u8; 8];
        id.copy_from_slice(&hmac16(&key, b"flashpool kek id")?[..8]);
        Ok(Kek {
            key: Box::new(key),
            id: KekId(id),
        })
    }

    pub fn id(&self) -> KekId {
        self.id
    }

    pub fn bytes(&self) -> &[u8; KEK_BYTES] {
        &self.key
    }

    /// Wraps `key` into an envelope for the superblocks.
    pub fn wrap(&self, key: &DataKey) -> Result<KeyEnvelope, CryptError> {
        let aes = AesKey::new_encrypt(&self.key[..])
            .map_err(|_| CryptError::Library("AES key wrap: bad KEK".into()))?;
        let mut wrapped = [0u8; WRAPPED_BYTES];
        let n = wrap_key(&aes, None, &mut wrapped, &key.0[..])
            .map_err(|_| CryptError::Library("AES key wrap failed".into()))?;
        if n != WRAPPED_BYTES {
            return Err(CryptError::Library(format!("AES key wrap gave {n} bytes")));
        }
        Ok(KeyEnvelope {
            kek: self.id,
            wrapped,
            kcv: key.check_value()?,
        })
    }

    /// Unwraps an envelope's key and checks it against the key check value.
    pub fn unwrap(&self, env: &KeyEnvelope) -> Result<DataKey, CryptError> {
        if env.kek != self.id {
            return Err(CryptError::WrongKek {
                wanted: env.kek,
                have: self.id.to_string(),
            });
        }
        let aes = AesKey::new_decrypt(&self.key[..])
            .map_err(|_| CryptError::Library("AES key unwrap: bad KEK".into()))?;
        let mut out = Box::new([0u8; DATA_KEY_BYTES]);
        match unwrap_key(&aes, None, &mut out[..], &env.wrapped) {
            Ok(DATA_KEY_BYTES) => {}
            _ => return Err(CryptError::Unwrap(env.kek)),
        }
        let key = DataKey(out);
        env.check(&key)?;
        Ok(key)
    }
}

impl Drop for Kek {
    fn drop(&mut self) {
        wipe(&mut self.key[..]);
    }
}

impl std::fmt::Debug for Kek {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kek({})", self.id)
    }
}

/// A data key wrapped by a KEK, with its key check value: what the
/// superblocks keep. Holds no secret a member's holder can use.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KeyEnvelope {
    pub kek: KekId,
    pub wrapped: [u8; WRAPPED_BYTES],
    pub kcv: [u8; KCV_BYTES],
}

impl std::fmt::Debug for KeyEnvelope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyEnvelope(aes-xts-256, kek {})", self.kek)
    }
}

impl KeyEnvelope {
    /// Whether `key` is the key this envelope holds (constant time).
    pub fn check(&self, key: &DataKey) -> Result<(), CryptError> {
        if memcmp::eq(&key.check_value()?, &self.kcv) {
            Ok(())
        } else {
            Err(CryptError::KeyCheck)
        }
    }

    pub fn encode(&self) -> [u8; ENVELOPE_BYTES] {
        let mut b = [0u8; ENVELOPE_BYTES];
        b[0] = CIPHER_XTS_256;
        b[8..16].copy_from_slice(&self.kek.0);
        b[16..16 + WRAPPED_BYTES].copy_from_slice(&self.wrapped);
        b[88..88 + KCV_BYTES].copy_from_slice(&self.kcv);
        b
    }

    /// None for an all-zero cipher byte (not encrypted: volumes made before
    /// encryption have zeroes there).
    pub fn decode(b: &[u8]) -> Result<Option<KeyEnvelope>, CryptError> {
        if b.len() < ENVELOPE_BYTES {
            return Err(CryptError::Envelope(format!(
                "{} bytes, need {ENVELOPE_BYTES}",
                b.len()
            )));
        }
        match b[0] {
            0 => Ok(None),
            CIPHER_XTS_256 => Ok(Some(KeyEnvelope {
                kek: KekId(b[8..16].try_into().expect("8 bytes")),
                wrapped: b[16..16 + WRAPPED_BYTES].try_into().expect("72 bytes"),
                kcv: b[88..88 + KCV_BYTES].try_into().expect("16 bytes"),
            })),
            c => Err(CryptError::Envelope(format!(
                "cipher {c} is not known to this build (1: AES-XTS-256)"
            ))),
        }
    }
}

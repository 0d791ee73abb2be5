//! XTS-AES-256 over runs of data units (blocks), through OpenSSL.

use openssl::cipher::Cipher;
use openssl::cipher_ctx::CipherCtx;
use parking_lot::Mutex;

use super::{CryptError, DataKey};

/// One encrypt and one decrypt context with the key schedule loaded; only
/// the tweak (IV) changes per data unit.
struct Pair {
    enc: CipherCtx,
    dec: CipherCtx,
}

/// A data key ready to encrypt and decrypt blocks. Contexts are pooled: a
/// request takes one pair for all of its blocks, so reactors on several
/// threads share the key without sharing a context.
pub struct Xts {
    key: DataKey,
    pool: Mutex<Vec<Pair>>,
}

impl std::fmt::Debug for Xts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Xts(aes-256-xts)")
    }
}

/// IEEE 1619's tweak: the data unit's sequence number, little-endian in 16 bytes.
fn tweak(unit: u64) -> [u8; 16] {
    u128::from(unit).to_le_bytes()
}

impl Xts {
    pub fn new(key: DataKey) -> Result<Xts, CryptError> {
        let xts = Xts {
            key,
            pool: Mutex::new(Vec::new()),
        };
        // Fails here, not on the I/O path, if the library refuses the key.
        let p = xts.pair()?;
        xts.pool.lock().push(p);
        Ok(xts)
    }

    /// This key wrapped by `kek` (KEK rotation).
    pub fn wrap_with(&self, kek: &super::Kek) -> Result<super::KeyEnvelope, CryptError> {
        kek.wrap(&self.key)
    }

    fn pair(&self) -> Result<Pair, CryptError> {
        let c = Cipher::aes_256_xts();
        let mut enc = CipherCtx::new()?;
        enc.encrypt_init(Some(c), Some(&self.key.bytes()[..]), None)?;
        let mut dec = CipherCtx::new()?;
        dec.decrypt_init(Some(c), Some(&self.key.bytes()[..]), None)?;
        Ok(Pair { enc, dec })
    }

    fn with_pair<T>(
        &self,
        f: impl FnOnce(&mut Pair) -> Result<T, CryptError>,
    ) -> Result<T, CryptError> {
        let popped = self.pool.lock().pop();
        let mut p = match popped {
            Some(p) => p,
            None => self.pair()?,
        };
        let r = f(&mut p);
        self.pool.lock().push(p);
        r
    }

    /// Encrypts `src` (whole units of `unit` bytes, the first at data unit
    /// `first`) into `dst`, which is at least as long.
    pub fn encrypt(
        &self,
        first: u64,
        unit: usize,
        src: &[u8],
        dst: &mut [u8],
    ) -> Result<(), CryptError> {
        check_units(unit, src.len())?;
        if dst.len() < src.len() {
            return Err(CryptError::Library(format!(
                "output of {} bytes for {} bytes of input",
                dst.len(),
                src.len()
            )));
        }
        self.with_pair(|p| {
            for (i, (s, d)) in src.chunks(unit).zip(dst.chunks_mut(unit)).enumerate() {
                p.enc
                    .encrypt_init(None, None, Some(&tweak(first + i as u64)))?;
                p.enc.cipher_update(s, Some(d))?;
            }
            Ok(())
        })
    }

    /// Decrypts `buf` in place (whole units, the first at data unit
    /// `first`). A unit whose ciphertext is all zeroes stays zeroes (see the
    /// module docs: never-written and deallocated blocks read as zeroes).
    pub fn decrypt_in_place(
        &self,
        first: u64,
        unit: usize,
        buf: &mut [u8],
    ) -> Result<(), CryptError> {
        self.in_place(false, first, unit, buf)
    }

    /// Encrypts `buf` in place (tests and benches).
    pub fn encrypt_in_place(
        &self,
        first: u64,
        unit: usize,
        buf: &mut [u8],
    ) -> Result<(), CryptError> {
        self.in_place(true, first, unit, buf)
    }

    fn in_place(
        &self,
        encrypt: bool,
        first: u64,
        unit: usize,
        buf: &mut [u8],
    ) -> Result<(), CryptError> {
        check_units(unit, buf.len())?;
        self.with_pair(|p| {
            let ctx = if encrypt { &mut p.enc } else { &mut p.dec };
            for (i, u) in buf.chunks_mut(unit).enumerate() {
                if !encrypt && is_zero(u) {
                    continue;
                }
                let iv = tweak(first + i as u64);
                if encrypt {
                    ctx.encrypt_init(None, None, Some(&iv))?;
                } else {
                    ctx.decrypt_init(None, None, Some(&iv))?;
                }
                let n = u.len();
                ctx.cipher_update_inplace(u, n)?;
            }
            Ok(())
        })
    }
}

fn check_units(unit: usize, len: usize) -> Result<(), CryptError> {
    if unit < 16 || !len.is_multiple_of(unit) {
        return Err(CryptError::Library(format!(
            "{len} bytes are not whole data units of {unit} bytes"
        )));
    }
    Ok(())
}

/// Whether a unit is all zeroes. Ciphertext fails on its first word, so
/// the scan costs only for units that really are zero.
fn is_zero(u: &[u8]) -> bool {
    let (head, words, tail) = {
        // SAFETY: u64 has no invalid bit patterns; align_to gives the aligned middle.
        unsafe { u.align_to::<u64>() }
    };
    head.iter().all(|&b| b == 0) && words.iter().all(|&w| w == 0) && tail.iter().all(|&b| b == 0)
}

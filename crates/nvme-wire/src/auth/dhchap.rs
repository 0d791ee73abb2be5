//! DH-HMAC-CHAP cryptography, as Linux `drivers/nvme/common/auth.c` and
//! nvmet's `auth.c` compute it: secrets in the `DHHC-1:` representation,
//! the key transformation, the host and controller responses, the
//! augmented challenge, and finite-field Diffie-Hellman over the RFC 7919
//! groups. Deterministic: callers bring the random bytes (challenges,
//! private exponents), so this crate stays free of I/O.

use base64::Engine as _;
use crypto_bigint::modular::{BoxedMontyForm, BoxedMontyParams};
use crypto_bigint::{BoxedUint, Odd};
use hmac::{KeyInit, Mac};
use sha2::Digest as _;

use super::ffdhe;

/// HMAC hash functions (the HashID of a Challenge and of a Negotiate list).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HashId {
    Sha256 = 1,
    Sha384 = 2,
    Sha512 = 3,
}

impl HashId {
    pub const ALL: [HashId; 3] = [HashId::Sha256, HashId::Sha384, HashId::Sha512];

    pub fn from_id(id: u8) -> Option<HashId> {
        match id {
            1 => Some(HashId::Sha256),
            2 => Some(HashId::Sha384),
            3 => Some(HashId::Sha512),
            _ => None,
        }
    }
    pub fn id(self) -> u8 {
        self as u8
    }
    /// Digest length: the HL of the messages.
    #[allow(clippy::len_without_is_empty)] // a digest length, not a collection
    pub fn len(self) -> usize {
        match self {
            HashId::Sha256 => 32,
            HashId::Sha384 => 48,
            HashId::Sha512 => 64,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            HashId::Sha256 => "hmac(sha256)",
            HashId::Sha384 => "hmac(sha384)",
            HashId::Sha512 => "hmac(sha512)",
        }
    }
    pub fn digest(self, data: &[u8]) -> Vec<u8> {
        match self {
            HashId::Sha256 => sha2::Sha256::digest(data).to_vec(),
            HashId::Sha384 => sha2::Sha384::digest(data).to_vec(),
            HashId::Sha512 => sha2::Sha512::digest(data).to_vec(),
        }
    }
    /// HMAC of the concatenation of `parts` under `key`.
    pub fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        fn run<M: Mac + KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
            let mut m = <M as KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
            for p in parts {
                m.update(p);
            }
            m.finalize().into_bytes().to_vec()
        }
        match self {
            HashId::Sha256 => run::<hmac::Hmac<sha2::Sha256>>(key, parts),
            HashId::Sha384 => run::<hmac::Hmac<sha2::Sha384>>(key, parts),
            HashId::Sha512 => run::<hmac::Hmac<sha2::Sha512>>(key, parts),
        }
    }
}

/// Diffie-Hellman groups (DHGID): NULL (none) and the RFC 7919 groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DhGroup {
    Null = 0,
    Ffdhe2048 = 1,
    Ffdhe3072 = 2,
    Ffdhe4096 = 3,
    Ffdhe6144 = 4,
    Ffdhe8192 = 5,
}

impl DhGroup {
    pub const ALL: [DhGroup; 6] = [
        DhGroup::Null,
        DhGroup::Ffdhe2048,
        DhGroup::Ffdhe3072,
        DhGroup::Ffdhe4096,
        DhGroup::Ffdhe6144,
        DhGroup::Ffdhe8192,
    ];

    pub fn from_id(id: u8) -> Option<DhGroup> {
        DhGroup::ALL.into_iter().find(|g| g.id() == id)
    }
    pub fn id(self) -> u8 {
        self as u8
    }
    pub fn name(self) -> &'static str {
        match self {
            DhGroup::Null => "null",
            DhGroup::Ffdhe2048 => "ffdhe2048",
            DhGroup::Ffdhe3072 => "ffdhe3072",
            DhGroup::Ffdhe4096 => "ffdhe4096",
            DhGroup::Ffdhe6144 => "ffdhe6144",
            DhGroup::Ffdhe8192 => "ffdhe8192",
        }
    }
    /// The prime, big-endian; `None` for the NULL group.
    pub fn prime(self) -> Option<&'static [u8]> {
        match self {
            DhGroup::Null => None,
            DhGroup::Ffdhe2048 => Some(&ffdhe::FFDHE2048),
            DhGroup::Ffdhe3072 => Some(&ffdhe::FFDHE3072),
            DhGroup::Ffdhe4096 => Some(&ffdhe::FFDHE4096),
            DhGroup::Ffdhe6144 => Some(&ffdhe::FFDHE6144),
            DhGroup::Ffdhe8192 => Some(&ffdhe::FFDHE8192),
        }
    }
    /// Length of a public value and of the shared secret (DHVLEN): the prime's.
    pub fn value_len(self) -> usize {
        self.prime().map_or(0, <[u8]>::len)
    }
    /// Bits of private exponent: twice the group's security strength
    /// (RFC 7919 section 5.2; what Linux's `dh_safe_prime` uses).
    pub fn private_bits(self) -> u32 {
        match self {
            DhGroup::Null => 0,
            DhGroup::Ffdhe2048 => 224,
            DhGroup::Ffdhe3072 => 256,
            DhGroup::Ffdhe4096 => 304,
            DhGroup::Ffdhe6144 => 352,
            DhGroup::Ffdhe8192 => 400,
        }
    }
    /// Random bytes a key pair needs.
    pub fn private_len(self) -> usize {
        (self.private_bits() as usize).div_ceil(8)
    }
}

/// A secret in the NVMe representation `DHHC-1:<hh>:<base64(key || crc32)>:`.
/// `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    /// hh: 0 = used as is, else the hash that transforms it.
    transform: Option<HashId>,
    key: Vec<u8>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Secret(DHHC-1:{:02}, {} bytes)",
            self.transform.map_or(0, HashId::id),
            self.key.len()
        )
    }
}

/// Why a `DHHC-1:` string was refused; none of them quotes the secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("a DH-HMAC-CHAP secret starts with \"DHHC-1:\"")]
    Prefix,
    #[error("the hash field must be 00, 01, 02 or 03")]
    Hash,
    #[error("the key is not valid base64")]
    Base64,
    #[error("the key is {0} bytes; it must be 32, 48 or 64 (plus a 4-byte CRC)")]
    Length(usize),
    #[error("the key's CRC-32 does not match (a typing error?)")]
    Crc,
}

impl Secret {
    /// Parses `DHHC-1:hh:base64:` (the trailing colon and surrounding
    /// white space are optional), as `nvme gen-dhchap-key` prints it.
    pub fn parse(s: &str) -> Result<Secret, SecretError> {
        let s = s.trim();
        let rest = s.strip_prefix("DHHC-1:").ok_or(SecretError::Prefix)?;
        let (hh, b64) = rest.split_once(':').ok_or(SecretError::Hash)?;
        let transform = match hh {
            "00" => None,
            "01" | "02" | "03" => HashId::from_id(hh.as_bytes()[1] - b'0'),
            _ => return Err(SecretError::Hash),
        };
        let b64 = b64.strip_suffix(':').unwrap_or(b64);
        let raw = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| SecretError::Base64)?;
        if raw.len() < 4 {
            return Err(SecretError::Length(0));
        }
        let (key, crc) = raw.split_at(raw.len() - 4);
        if ![32, 48, 64].contains(&key.len()) {
            return Err(SecretError::Length(key.len()));
        }
        if crc32fast::hash(key).to_le_bytes() != crc {
            return Err(SecretError::Crc);
        }
        Ok(Secret {
            transform,
            key: key.to_vec(),
        })
    }

    /// A secret from raw key bytes (32, 48 or 64 of them).
    pub fn from_key(transform: Option<HashId>, key: &[u8]) -> Result<Secret, SecretError> {
        if ![32, 48, 64].contains(&key.len()) {
            return Err(SecretError::Length(key.len()));
        }
        Ok(Secret {
            transform,
            key: key.to_vec(),
        })
    }

    /// The `DHHC-1:` representation.
    pub fn to_dhhc(&self) -> String {
        let mut raw = self.key.clone();
        raw.extend_from_slice(&crc32fast::hash(&self.key).to_le_bytes());
        format!(
            "DHHC-1:{:02}:{}:",
            self.transform.map_or(0, HashId::id),
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }

    /// The key the responses are computed with: the secret itself (hh 00)
    /// or HMAC(hh, secret, nqn || "NVMe-over-Fabrics"), with the host NQN
    /// for a host secret and the subsystem NQN for a controller secret.
    pub fn transformed(&self, nqn: &str) -> Vec<u8> {
        match self.transform {
            None => self.key.clone(),
            Some(h) => h.hmac(&self.key, &[nqn.as_bytes(), b"NVMe-over-Fabrics"]),
        }
    }
}

/// The values a response covers, besides the key and the challenge.
#[derive(Debug, Clone, Copy)]
pub struct ResponseCtx<'a> {
    pub seqnum: u32,
    pub t_id: u16,
    pub hostnqn: &'a str,
    pub subnqn: &'a str,
}

/// R1 = HMAC(Kh, C1 || S1 LE32 || T_ID LE16 || SC_C (0) || "HostHost" ||
/// hostnqn || 00h || subnqn), `challenge` already augmented with a DH group.
pub fn host_response(hash: HashId, key: &[u8], challenge: &[u8], cx: ResponseCtx<'_>) -> Vec<u8> {
    hash.hmac(
        key,
        &[
            challenge,
            &cx.seqnum.to_le_bytes(),
            &cx.t_id.to_le_bytes(),
            &[0],
            b"HostHost",
            cx.hostnqn.as_bytes(),
            &[0],
            cx.subnqn.as_bytes(),
        ],
    )
}

/// R2 = HMAC(Kc, C2 || S2 LE32 || T_ID LE16 || SC_C (0) || "Controller" ||
/// subnqn || 00h || hostnqn).
pub fn ctrl_response(hash: HashId, key: &[u8], challenge: &[u8], cx: ResponseCtx<'_>) -> Vec<u8> {
    hash.hmac(
        key,
        &[
            challenge,
            &cx.seqnum.to_le_bytes(),
            &cx.t_id.to_le_bytes(),
            &[0],
            b"Controller",
            cx.subnqn.as_bytes(),
            &[0],
            cx.hostnqn.as_bytes(),
        ],
    )
}

/// Ca = HMAC(H(g^xy mod p), C): the challenge once a DH group is in use.
pub fn augmented_challenge(hash: HashId, shared: &[u8], challenge: &[u8]) -> Vec<u8> {
    hash.hmac(&hash.digest(shared), &[challenge])
}

/// Compares two MACs in constant time.
pub fn macs_equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why a peer's DH public value was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DhError {
    #[error("DH value of {have} bytes; the group needs {want}")]
    Length { have: usize, want: usize },
    #[error("DH value outside 1 < y < p-1")]
    Range,
    #[error("the NULL group has no DH values")]
    NullGroup,
}

/// One side's ephemeral DH key pair.
pub struct DhKey {
    group: DhGroup,
    params: BoxedMontyParams,
    private: BoxedUint,
    bits: u32,
    /// g^x mod p, big-endian, the prime's length.
    pub public: Vec<u8>,
}

impl DhKey {
    /// A key pair from `random` (at least `group.private_len()` bytes).
    /// `None` for the NULL group.
    pub fn new(group: DhGroup, random: &[u8]) -> Option<DhKey> {
        let p = group.prime()?;
        let bits = (p.len() * 8) as u32;
        let modulus = BoxedUint::from_be_slice(p, bits).expect("prime fits");
        let params = BoxedMontyParams::new(
            Odd::new(modulus)
                .into_option()
                .expect("an FFDHE prime is odd"),
        );
        let n = group.private_len().min(random.len());
        let mut x = random[..n].to_vec();
        // A zero exponent would make the public value 1.
        if let Some(last) = x.last_mut() {
            *last |= 1;
        }
        let private = BoxedUint::from_be_slice(&x, bits).expect("shorter than the prime");
        let xbits = (n * 8) as u32;
        let g = BoxedMontyForm::new(BoxedUint::from_be_slice(&[2], bits).expect("2"), &params);
        let public = pad(&g.pow_bounded_exp(&private, xbits).retrieve(), p.len());
        Some(DhKey {
            group,
            params,
            private,
            bits: xbits,
            public,
        })
    }

    pub fn group(&self) -> DhGroup {
        self.group
    }

    /// g^xy mod p from the peer's public value, the prime's length. The
    /// value must be exactly that long and 1 < y < p-1 (SP 800-56A 5.6.2.3.1).
    pub fn shared_secret(&self, peer: &[u8]) -> Result<Vec<u8>, DhError> {
        check_public(self.group, peer)?;
        let p = self.group.prime().ok_or(DhError::NullGroup)?;
        let y = BoxedUint::from_be_slice(peer, (p.len() * 8) as u32).expect("length checked");
        let y = BoxedMontyForm::new(y, &self.params);
        Ok(pad(
            &y.pow_bounded_exp(&self.private, self.bits).retrieve(),
            p.len(),
        ))
    }
}

/// Checks a peer's public value without a key pair: length and range.
pub fn check_public(group: DhGroup, y: &[u8]) -> Result<(), DhError> {
    let p = group.prime().ok_or(DhError::NullGroup)?;
    if y.len() != p.len() {
        return Err(DhError::Length {
            have: y.len(),
            want: p.len(),
        });
    }
    // Big-endian byte strings of equal length compare like the numbers.
    // Every FFDHE prime ends in ...FF, so p-1 is p with its last byte FE.
    let mut p_minus_1 = p.to_vec();
    *p_minus_1.last_mut().expect("non-empty") -= 1;
    let mut one = vec![0u8; p.len()];
    *one.last_mut().expect("non-empty") = 1;
    if y <= one.as_slice() || y >= p_minus_1.as_slice() {
        return Err(DhError::Range);
    }
    Ok(())
}

fn pad(v: &BoxedUint, len: usize) -> Vec<u8> {
    let b = v.to_be_bytes();
    let mut out = vec![0u8; len];
    let n = b.len().min(len);
    out[len - n..].copy_from_slice(&b[b.len() - n..]);
    out
}

#[cfg(test)]
mod tests;

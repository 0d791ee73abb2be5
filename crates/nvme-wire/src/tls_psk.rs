//! TLS pre-shared keys for NVMe/TCP (TP 8011; NVMe/TCP transport spec
//! "Pre-Shared Key"): the configured-PSK interchange format
//! `NVMeTLSkey-1:hh:base64(key || crc32):`, the retained PSK, the PSK
//! identity a host offers, and the TLS PSK both sides feed to TLS 1.3.
//!
//! Derivations, as RFC 8446's HKDF-Expand-Label with the hash of the PSK:
//! - retained = HKDF-Expand-Label(HKDF-Extract(0, configured), "HostNQN",
//!   host NQN, length of the configured PSK); hh 00 keeps it as is;
//! - identity v0 = `NVMe0Rhh <hostnqn> <subnqn>`, TLS PSK =
//!   HKDF-Expand-Label(HKDF-Extract(0, retained), "nvme-tls-psk", identity, L);
//! - identity v1 = `NVMe1Rhh <hostnqn> <subnqn> <digest>`, digest =
//!   base64(HMAC(retained, hostnqn " " subnqn " NVMe-over-Fabrics")), and the
//!   TLS PSK context is `hh <digest>`.
//!
//! libnvme up to 1.15 (nvme-cli 2.15; Debian 13 ships 1.13) built the HKDF
//! info differently: a little-endian length and no length bytes before the
//! label and the context. Keys it put in a host's keyring are derived that
//! way, so a target must speak both: [`Derivation::LibnvmeCompat`].

use base64::Engine;

use crate::auth::dhchap::HashId;

/// How HKDF-Expand-Label's info is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Derivation {
    /// RFC 8446 7.1, as the NVMe/TCP spec, SPDK and libnvme 1.16+ do.
    Rfc8446,
    /// libnvme before 1.16: `le16(L) || "tls13 " label || context`.
    LibnvmeCompat,
}

/// The hash of a PSK, which is also the hash of the TLS 1.3 cipher suite
/// it may be used with (01: TLS_AES_128_GCM_SHA256, 02: TLS_AES_256_GCM_SHA384).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PskHash {
    Sha256,
    Sha384,
}

impl PskHash {
    /// The two-digit specifier of identities and the interchange format.
    pub fn id(self) -> u8 {
        match self {
            PskHash::Sha256 => 1,
            PskHash::Sha384 => 2,
        }
    }

    pub fn from_id(id: u8) -> Option<PskHash> {
        match id {
            1 => Some(PskHash::Sha256),
            2 => Some(PskHash::Sha384),
            _ => None,
        }
    }

    /// Output length of the hash: the length of every PSK derived with it.
    pub fn key_len(self) -> usize {
        match self {
            PskHash::Sha256 => 32,
            PskHash::Sha384 => 48,
        }
    }

    /// The TLS 1.3 cipher suite that uses this hash, as its two-byte code.
    pub fn cipher_suite(self) -> [u8; 2] {
        match self {
            PskHash::Sha256 => [0x13, 0x01],
            PskHash::Sha384 => [0x13, 0x02],
        }
    }

    fn hkdf(self, d: Derivation, ikm: &[u8], label: &str, context: &[u8], len: usize) -> Vec<u8> {
        let mut info = Vec::with_capacity(4 + 6 + label.len() + context.len());
        match d {
            Derivation::Rfc8446 => {
                info.extend_from_slice(&(len as u16).to_be_bytes());
                info.push((6 + label.len()) as u8);
                info.extend_from_slice(b"tls13 ");
                info.extend_from_slice(label.as_bytes());
                info.push(context.len() as u8);
            }
            Derivation::LibnvmeCompat => {
                info.extend_from_slice(&(len as u16).to_le_bytes());
                info.extend_from_slice(b"tls13 ");
                info.extend_from_slice(label.as_bytes());
            }
        }
        info.extend_from_slice(context);
        let mut out = vec![0u8; len];
        let ok = match self {
            PskHash::Sha256 => hkdf::Hkdf::<sha2::Sha256>::new(None, ikm).expand(&info, &mut out),
            PskHash::Sha384 => hkdf::Hkdf::<sha2::Sha384>::new(None, ikm).expand(&info, &mut out),
        };
        ok.expect("HKDF output of one hash length");
        out
    }

    fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        let h = match self {
            PskHash::Sha256 => HashId::Sha256,
            PskHash::Sha384 => HashId::Sha384,
        };
        h.hmac(key, parts)
    }
}

/// Why a `NVMeTLSkey-1:` string was refused; none of them quotes the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PskError {
    #[error("a configured TLS PSK starts with \"NVMeTLSkey-1:\"")]
    Prefix,
    #[error("the hash field must be 00, 01 or 02")]
    Hash,
    #[error("the key is not valid base64")]
    Base64,
    #[error(
        "the key is {0} bytes; hash 01 takes 32, hash 02 takes 48, 00 either (plus a 4-byte CRC)"
    )]
    Length(usize),
    #[error("the key's CRC-32 does not match (a typing error?)")]
    Crc,
}

/// A configured PSK. `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct ConfiguredPsk {
    /// hh: None = the key is the retained PSK as is.
    transform: Option<PskHash>,
    key: Vec<u8>,
    /// How identities of version 0 are derived (version 1 identities carry
    /// a digest that tells).
    derivation: Derivation,
}

impl std::fmt::Debug for ConfiguredPsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ConfiguredPsk(NVMeTLSkey-1:{:02}, {} bytes, {:?})",
            self.transform.map_or(0, PskHash::id),
            self.key.len(),
            self.derivation
        )
    }
}

impl ConfiguredPsk {
    /// Parses `NVMeTLSkey-1:hh:base64:` as `nvme gen-tls-key` prints it
    /// (surrounding white space and the trailing colon are optional).
    pub fn parse(s: &str) -> Result<ConfiguredPsk, PskError> {
        let rest = s
            .trim()
            .strip_prefix("NVMeTLSkey-1:")
            .ok_or(PskError::Prefix)?;
        let (hh, b64) = rest.split_once(':').ok_or(PskError::Hash)?;
        let transform = match hh {
            "00" => None,
            "01" => Some(PskHash::Sha256),
            "02" => Some(PskHash::Sha384),
            _ => return Err(PskError::Hash),
        };
        let b64 = b64.strip_suffix(':').unwrap_or(b64);
        let raw = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| PskError::Base64)?;
        if raw.len() < 4 {
            return Err(PskError::Length(0));
        }
        let (key, crc) = raw.split_at(raw.len() - 4);
        Self::check_len(transform, key.len())?;
        if crc32fast::hash(key).to_le_bytes() != crc {
            return Err(PskError::Crc);
        }
        Ok(ConfiguredPsk {
            transform,
            key: key.to_vec(),
            derivation: Derivation::Rfc8446,
        })
    }

    fn check_len(transform: Option<PskHash>, len: usize) -> Result<(), PskError> {
        let ok = match transform {
            Some(h) => len == h.key_len(),
            None => len == 32 || len == 48,
        };
        if ok {
            Ok(())
        } else {
            Err(PskError::Length(len))
        }
    }

    /// A configured PSK from raw key bytes.
    pub fn from_key(transform: Option<PskHash>, key: &[u8]) -> Result<ConfiguredPsk, PskError> {
        Self::check_len(transform, key.len())?;
        Ok(ConfiguredPsk {
            transform,
            key: key.to_vec(),
            derivation: Derivation::Rfc8446,
        })
    }

    /// The same key, derived for identities of version 0 the way `d` does.
    pub fn with_derivation(mut self, d: Derivation) -> ConfiguredPsk {
        self.derivation = d;
        self
    }

    pub fn derivation(&self) -> Derivation {
        self.derivation
    }

    /// The interchange representation.
    pub fn to_interchange(&self) -> String {
        let mut raw = self.key.clone();
        raw.extend_from_slice(&crc32fast::hash(&self.key).to_le_bytes());
        format!(
            "NVMeTLSkey-1:{:02}:{}:",
            self.transform.map_or(0, PskHash::id),
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }

    /// The hash of identities and TLS PSKs made from this key: the transform
    /// hash, or for hh 00 the one that matches the key length.
    pub fn hash(&self) -> PskHash {
        self.transform.unwrap_or(if self.key.len() == 48 {
            PskHash::Sha384
        } else {
            PskHash::Sha256
        })
    }

    /// The retained PSK of `hostnqn`.
    pub fn retained(&self, hostnqn: &str, d: Derivation) -> Vec<u8> {
        match self.transform {
            None => self.key.clone(),
            Some(h) => h.hkdf(d, &self.key, "HostNQN", hostnqn.as_bytes(), self.key.len()),
        }
    }

    /// The identity and TLS PSK a host offers to `subnqn`, derived as this
    /// key's [`Derivation`] says.
    pub fn derive(&self, hostnqn: &str, subnqn: &str, version: u8) -> (PskIdentity, Vec<u8>) {
        let d = self.derivation;
        let retained = self.retained(hostnqn, d);
        let hash = self.hash();
        let digest = (version == 1).then(|| psk_digest(hash, &retained, hostnqn, subnqn));
        let id = PskIdentity {
            version: if version == 1 { 1 } else { 0 },
            hash,
            hostnqn: hostnqn.to_string(),
            subnqn: subnqn.to_string(),
            digest,
        };
        let psk = id.tls_psk(&retained, d);
        (id, psk)
    }
}

/// The PSK digest of identity version 1.
pub fn psk_digest(hash: PskHash, retained: &[u8], hostnqn: &str, subnqn: &str) -> String {
    let mac = hash.hmac(
        retained,
        &[
            hostnqn.as_bytes(),
            b" ",
            subnqn.as_bytes(),
            b" ",
            b"NVMe-over-Fabrics",
        ],
    );
    base64::engine::general_purpose::STANDARD.encode(mac)
}

/// Why a PSK identity was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("a PSK identity is \"NVMe<v>R<hh> <hostnqn> <subnqn>[ <digest>]\"")]
    Format,
    #[error("PSK identity version {0} is not supported (0 and 1 are)")]
    Version(u8),
    #[error("PSK identity: a generated PSK (G) needs DH-HMAC-CHAP secure concatenation")]
    Generated,
    #[error("PSK identity hash {0:02} is not 01 or 02")]
    Hash(u8),
}

/// A TLS PSK identity (`NVMe0R01 <hostnqn> <subnqn>` and the like).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PskIdentity {
    pub version: u8,
    pub hash: PskHash,
    pub hostnqn: String,
    pub subnqn: String,
    /// Version 1 only.
    pub digest: Option<String>,
}

impl PskIdentity {
    /// Parses the identity bytes of a ClientHello (untrusted).
    pub fn parse(b: &[u8]) -> Result<PskIdentity, IdentityError> {
        let s = std::str::from_utf8(b).map_err(|_| IdentityError::Format)?;
        let mut parts = s.split(' ');
        let head = parts.next().ok_or(IdentityError::Format)?.as_bytes();
        if head.len() != 8 || &head[..4] != b"NVMe" || !head[4].is_ascii_digit() {
            return Err(IdentityError::Format);
        }
        let version = head[4] - b'0';
        match head[5] {
            b'R' => {}
            b'G' => return Err(IdentityError::Generated),
            _ => return Err(IdentityError::Format),
        }
        if !head[6].is_ascii_digit() || !head[7].is_ascii_digit() {
            return Err(IdentityError::Format);
        }
        let hh = (head[6] - b'0') * 10 + (head[7] - b'0');
        let hash = PskHash::from_id(hh).ok_or(IdentityError::Hash(hh))?;
        let hostnqn = parts.next().filter(|n| !n.is_empty());
        let subnqn = parts.next().filter(|n| !n.is_empty());
        let (Some(hostnqn), Some(subnqn)) = (hostnqn, subnqn) else {
            return Err(IdentityError::Format);
        };
        let digest = match version {
            0 => None,
            1 => Some(
                parts
                    .next()
                    .filter(|d| !d.is_empty())
                    .ok_or(IdentityError::Format)?,
            ),
            v => return Err(IdentityError::Version(v)),
        };
        if parts.next().is_some() || hostnqn.len() > 223 || subnqn.len() > 223 {
            return Err(IdentityError::Format);
        }
        Ok(PskIdentity {
            version,
            hash,
            hostnqn: hostnqn.to_string(),
            subnqn: subnqn.to_string(),
            digest: digest.map(str::to_string),
        })
    }

    /// The identity string.
    pub fn encode(&self) -> String {
        let mut s = format!(
            "NVMe{}R{:02} {} {}",
            self.version,
            self.hash.id(),
            self.hostnqn,
            self.subnqn
        );
        if let Some(d) = &self.digest {
            s.push(' ');
            s.push_str(d);
        }
        s
    }

    /// The TLS PSK of this identity, from the host's retained PSK.
    pub fn tls_psk(&self, retained: &[u8], d: Derivation) -> Vec<u8> {
        let context = match &self.digest {
            None => self.encode(),
            Some(dg) => format!("{:02} {dg}", self.hash.id()),
        };
        self.hash.hkdf(
            d,
            retained,
            "nvme-tls-psk",
            context.as_bytes(),
            self.hash.key_len(),
        )
    }

    /// The TLS PSK for this identity from a configured PSK, after checking
    /// that the key fits the identity (same hash, and a version 1 digest
    /// that matches), and how it was derived. A version 1 digest tells the
    /// derivation; version 0 takes the key's. None: this key cannot have
    /// made the identity.
    pub fn tls_psk_from(&self, key: &ConfiguredPsk) -> Option<(Vec<u8>, Derivation)> {
        if key.hash() != self.hash {
            return None;
        }
        let Some(digest) = &self.digest else {
            let d = key.derivation;
            return Some((self.tls_psk(&key.retained(&self.hostnqn, d), d), d));
        };
        [Derivation::Rfc8446, Derivation::LibnvmeCompat]
            .into_iter()
            .find_map(|d| {
                let retained = key.retained(&self.hostnqn, d);
                let want = psk_digest(self.hash, &retained, &self.hostnqn, &self.subnqn);
                (want.as_bytes() == digest.as_bytes()).then(|| (self.tls_psk(&retained, d), d))
            })
    }
}

#[cfg(test)]
mod tests;

//! The values every section shares and checks the same way: sizes ("1GiB"),
//! ranges, NQNs, hex identifiers, and the stable IDs derived from names.

use anyhow::{Result, bail};
use serde::Deserialize;

/// A byte size: an integer, or a string like "1GiB", "512KiB", "4096".
#[derive(Debug, Clone, Copy)]
pub struct Size(u64);

impl Size {
    pub fn bytes(self) -> u64 {
        self.0
    }
}

/// The fix every size error ends with.
const SIZE_HINT: &str = "use e.g. 64MiB, 10GiB or a byte count";

/// By hand rather than `#[serde(untagged)]`, whose error ("data did not
/// match any variant") names neither the value nor the fix; [`load`] adds
/// the key.
impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Size, D::Error> {
        struct SizeVisitor;
        impl serde::de::Visitor<'_> for SizeVisitor {
            type Value = Size;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "a size; {SIZE_HINT}")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Size, E> {
                Ok(Size(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Size, E> {
                u64::try_from(v).map(Size).map_err(|_| {
                    E::custom(format_args!("{v} is not a size (negative); {SIZE_HINT}"))
                })
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Size, E> {
                Err(E::custom(format_args!(
                    "{v} is not a size (bytes are whole; quote sizes with a fraction, e.g. \"1.5GiB\"); {SIZE_HINT}"
                )))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Size, E> {
                use crate::units::SizeError;
                crate::units::size_bytes(s).map(Size).map_err(|e| match e {
                    SizeError::NotANumber => E::custom(format_args!(
                        "{} is not a size; {SIZE_HINT}",
                        crate::echo::Echo(s)
                    )),
                    e => E::custom(format_args!(
                        "{} is not a size ({e}); {SIZE_HINT}",
                        crate::echo::Echo(s)
                    )),
                })
            }
        }
        d.deserialize_any(SizeVisitor)
    }
}

/// Parses "1GiB", "128KiB", "4096", "1G" (binary units).
#[cfg(test)]
pub fn parse_size(s: &str) -> Result<u64, String> {
    crate::units::parse_size(s).map_err(|e| e.to_string())
}

pub(super) fn range<T: PartialOrd + std::fmt::Display + Copy>(
    key: &str,
    v: T,
    lo: T,
    hi: T,
) -> Result<T> {
    if v < lo || v > hi {
        bail!("config: {key} = {v} is out of range; use a value from {lo} to {hi}");
    }
    Ok(v)
}

pub(super) fn check_nqn(key: &str, nqn: &str) -> Result<()> {
    if !nqn.starts_with("nqn.")
        || nqn.len() > 223
        || !nqn.is_ascii()
        || nqn.contains(char::is_whitespace)
    {
        bail!(
            "config: {key} = {nqn:?} is not a valid NQN; use \"nqn.YYYY-MM.reverse.domain:name\", ASCII, at most 223 bytes"
        );
    }
    if nqn == nvme_wire::fabrics::DISCOVERY_NQN {
        bail!("config: {key} = {nqn:?} is the discovery service's NQN; pick another name");
    }
    Ok(())
}

/// `thin` of a drive or namespace: only a `mem` backend has the choice.
pub(super) fn mem_thin(
    key: &str,
    backend: &str,
    thin: Option<bool>,
) -> anyhow::Result<Option<bool>> {
    if thin.is_some() && backend != "mem" {
        bail!(
            "config: {key}.thin is only for backend = \"mem\" (a RAM device allocated on first \
             write or up front); remove it"
        );
    }
    Ok(thin)
}

pub(super) fn parse_hex(key: &str, s: &str) -> Result<[u8; 16]> {
    let hex: String = s.chars().filter(|&c| c != '-').collect();
    if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        bail!(
            "config: {key} = {s:?} must be 32 hex digits (dashes allowed), e.g. \"5f7d6a3c-0000-4000-8000-00000000001\""
        );
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex digits");
    }
    Ok(out)
}

pub(super) fn fnv(bytes: &[u8], seed: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed.wrapping_mul(0x100_0000_01b3);
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// A stable 128-bit identifier from the NQN and NSID (RFC 9562 version 8 layout),
/// so a restarted node presents the same namespace identity to hosts.
pub(super) fn derived_id(nqn: &str, nsid: u32, seed: u64) -> [u8; 16] {
    let mut key = nqn.as_bytes().to_vec();
    key.extend_from_slice(&nsid.to_le_bytes());
    let a = fnv(&key, seed).to_be_bytes();
    let b = fnv(&key, seed + 1).to_be_bytes();
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&a);
    out[8..].copy_from_slice(&b);
    out[6] = (out[6] & 0x0F) | 0x80;
    out[8] = (out[8] & 0x3F) | 0x80;
    out
}

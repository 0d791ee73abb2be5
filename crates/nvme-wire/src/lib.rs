//! NVMe and NVMe/TCP wire formats: bytes only, no I/O, no async, no `unsafe`.
//!
//! Every decoder takes untrusted bytes and returns `Result`; the fuzzers in
//! `fuzz/` feed them garbage. Encoders write into caller-provided buffers so
//! the data path allocates nothing per command.

#![forbid(unsafe_code)]

pub mod auth;
pub mod cqe;
pub mod digest;
pub mod fabrics;
pub mod identify;
pub mod log_page;
pub mod pdu;
pub mod reservation;
pub mod sqe;
pub mod status;
pub mod tls_psk;

/// Reads a little-endian integer at `off`. Callers check lengths first; these
/// helpers exist so that every field offset in this crate is written once.
pub(crate) fn le16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
pub(crate) fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}
pub(crate) fn le64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}
pub(crate) fn put16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn put64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// Copies `s` into a fixed-width field, padded with `pad` (spaces for
/// Identify strings, NULs for NQNs). Longer strings are cut.
pub fn put_str(field: &mut [u8], s: &str, pad: u8) {
    field.fill(pad);
    let n = s.len().min(field.len());
    field[..n].copy_from_slice(&s.as_bytes()[..n]);
}

/// Reads a NUL-terminated (or full-width) ASCII field, e.g. an NQN.
pub fn get_str(field: &[u8]) -> Result<&str, WireError> {
    let end = field.iter().position(|&c| c == 0).unwrap_or(field.len());
    std::str::from_utf8(&field[..end]).map_err(|_| WireError::NotUtf8)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("buffer holds {have} bytes, need {need}")]
    Short { have: usize, need: usize },
    #[error("string field is not valid UTF-8")]
    NotUtf8,
}

pub(crate) fn need(b: &[u8], n: usize) -> Result<(), WireError> {
    if b.len() < n {
        Err(WireError::Short {
            have: b.len(),
            need: n,
        })
    } else {
        Ok(())
    }
}

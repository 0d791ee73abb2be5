//! CRC32C (Castagnoli) header and data digests, hardware accelerated by `crc-fast`.

use crc_fast::{CrcAlgorithm, Digest};

pub const DIGEST_LEN: usize = 4;

/// CRC32C of `bytes` (initial 0xFFFFFFFF, final XOR 0xFFFFFFFF), as NVMe/TCP uses it.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::checksum(CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

/// A data digest over data that arrives in pieces (several H2CData PDUs).
pub struct DataDigest(Digest);

impl DataDigest {
    pub fn new() -> Self {
        DataDigest(Digest::new(CrcAlgorithm::Crc32Iscsi))
    }
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    pub fn finish(&self) -> u32 {
        self.0.finalize() as u32
    }
}

impl Default for DataDigest {
    fn default() -> Self {
        Self::new()
    }
}

/// The data digest covers the data padded with zeroes to a multiple of 4.
pub fn data_digest(data: &[u8]) -> u32 {
    let pad = (4 - data.len() % 4) % 4;
    if pad == 0 {
        return crc32c(data);
    }
    let mut d = DataDigest::new();
    d.update(data);
    d.update(&[0u8; 3][..pad]);
    d.finish()
}

/// The 4 bytes that follow a PDU's data when data digests are on.
pub fn data_digest_trailer(data: &[u8]) -> [u8; DIGEST_LEN] {
    data_digest(data).to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        // RFC 3720 B.4: 32 bytes of zeroes -> 0x8A9136AA; "123456789" -> 0xE3069283.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn incremental_equals_one_shot() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let mut d = DataDigest::new();
        d.update(&data[..333]);
        d.update(&data[333..]);
        assert_eq!(d.finish(), crc32c(&data));
    }

    #[test]
    fn padding_to_dword() {
        assert_eq!(data_digest(b"abc"), crc32c(b"abc\0"));
        assert_eq!(data_digest_trailer(b"abc"), crc32c(b"abc\0").to_le_bytes());
    }
}

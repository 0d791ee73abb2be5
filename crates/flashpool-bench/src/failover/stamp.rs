//! The blocks the probe writes: a block that names its volume, its kind
//! (written before the fault, or through the survivor) and the run, so that a
//! block of another volume, another run or a lost write never reads as right.

const MAGIC: &[u8; 8] = b"FPFAILPR";

/// Written through the owner before the fault (LBA 0); read back on the survivor.
pub(crate) const BEFORE: u32 = 0;
/// Written and read back through the survivor (LBA 1).
pub(crate) const AFTER: u32 = 1;

/// The block of `kind` for namespace `nsid` in the run `seed`: a header, then
/// a xorshift stream seeded from all three.
pub(crate) fn block(len: usize, seed: u64, nsid: u32, kind: u32) -> Vec<u8> {
    let mut b = vec![0u8; len];
    let head = 24.min(len);
    let mut h = [0u8; 24];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&nsid.to_le_bytes());
    h[12..16].copy_from_slice(&kind.to_le_bytes());
    h[16..24].copy_from_slice(&seed.to_le_bytes());
    b[..head].copy_from_slice(&h[..head]);
    let mut x = seed ^ (u64::from(nsid) << 32) ^ u64::from(kind) ^ 0x9E37_79B9_7F4A_7C15;
    for c in b[head..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differs_by_run_volume_and_kind() {
        let a = block(4096, 1, 1, BEFORE);
        assert_eq!(a, block(4096, 1, 1, BEFORE));
        assert_ne!(a, block(4096, 2, 1, BEFORE));
        assert_ne!(a, block(4096, 1, 2, BEFORE));
        assert_ne!(a, block(4096, 1, 1, AFTER));
        assert_ne!(a, vec![0u8; 4096]);
        assert_eq!(block(512, 3, 4, AFTER).len(), 512);
        // the tail differs too, not just the header
        assert_ne!(a[24..], block(4096, 2, 1, BEFORE)[24..]);
    }
}

//! `--verify`: every written logical block carries a header (magic, CRC32C,
//! its LBA, the run's seed, a write generation) and seed-derived filler; a
//! read checks all of it, so a block that comes back from the wrong place,
//! from another run, torn, or corrupted is caught and named by its LBA.

use std::fmt;

use nvme_wire::digest::crc32c;
use serde::Serialize;

const MAGIC: u32 = 0x3156_5046; // "FPV1"
const OFF_CRC: usize = 4;
const OFF_LBA: usize = 8;
const OFF_SEED: usize = 16;
const OFF_GEN: usize = 24;
/// The CRC covers everything after it.
const CRC_FROM: usize = 8;
const HEADER: usize = 32;

/// Fills `block` (one logical block) for `lba`.
pub fn stamp(block: &mut [u8], lba: u64, seed: u64, generation: u64) {
    let mut x = mix(seed ^ mix(lba) ^ generation.rotate_left(32)) | 1;
    for w in block[HEADER..].chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes());
    }
    block[..4].copy_from_slice(&MAGIC.to_le_bytes());
    block[OFF_LBA..OFF_LBA + 8].copy_from_slice(&lba.to_le_bytes());
    block[OFF_SEED..OFF_SEED + 8].copy_from_slice(&seed.to_le_bytes());
    block[OFF_GEN..OFF_GEN + 8].copy_from_slice(&generation.to_le_bytes());
    let crc = crc32c(&block[CRC_FROM..]);
    block[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Why a block failed its check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Bad {
    Zeroes,
    NoHeader,
    Checksum { stored: u32, computed: u32 },
    WrongLba { found: u64 },
    WrongSeed { found: u64, expected: u64 },
}

impl fmt::Display for Bad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bad::Zeroes => write!(
                f,
                "the block reads as zeroes (never written, or deallocated)"
            ),
            Bad::NoHeader => write!(f, "no verify header (not written by a verifying bench run)"),
            Bad::Checksum { stored, computed } => {
                write!(
                    f,
                    "CRC32C mismatch: stored {stored:#010x}, computed {computed:#010x} (corrupt or torn)"
                )
            }
            Bad::WrongLba { found } => write!(
                f,
                "the block carries LBA {found} (data from the wrong place)"
            ),
            Bad::WrongSeed { found, expected } => write!(
                f,
                "written with seed {found:#x}, expected {expected:#x} (stale data from another run?)"
            ),
        }
    }
}

/// Checks one logical block read from `lba`. `seed`: the seed it must carry, if known.
pub fn check(block: &[u8], lba: u64, seed: Option<u64>) -> Result<(), Bad> {
    let le32 = |o: usize| u32::from_le_bytes(block[o..o + 4].try_into().expect("4 bytes"));
    let le64 = |o: usize| u64::from_le_bytes(block[o..o + 8].try_into().expect("8 bytes"));
    if le32(0) != MAGIC {
        return Err(if block.iter().all(|&b| b == 0) {
            Bad::Zeroes
        } else {
            Bad::NoHeader
        });
    }
    let stored = le32(OFF_CRC);
    let computed = crc32c(&block[CRC_FROM..]);
    if stored != computed {
        return Err(Bad::Checksum { stored, computed });
    }
    if le64(OFF_LBA) != lba {
        return Err(Bad::WrongLba {
            found: le64(OFF_LBA),
        });
    }
    match seed {
        Some(expected) if le64(OFF_SEED) != expected => Err(Bad::WrongSeed {
            found: le64(OFF_SEED),
            expected,
        }),
        _ => Ok(()),
    }
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_then_check() {
        for bs in [512usize, 4096] {
            let mut b = vec![0u8; bs];
            assert_eq!(check(&b, 5, None), Err(Bad::Zeroes));
            stamp(&mut b, 5, 42, 1);
            assert_eq!(check(&b, 5, Some(42)), Ok(()));
            assert_eq!(check(&b, 5, None), Ok(()));
            assert_eq!(check(&b, 6, Some(42)), Err(Bad::WrongLba { found: 5 }));
            assert_eq!(
                check(&b, 5, Some(7)),
                Err(Bad::WrongSeed {
                    found: 42,
                    expected: 7
                })
            );
            b[bs - 1] ^= 1;
            assert!(matches!(check(&b, 5, Some(42)), Err(Bad::Checksum { .. })));
            b[0] ^= 1;
            assert_eq!(check(&b, 5, Some(42)), Err(Bad::NoHeader));
        }
        // Generations differ in content, so a stale copy of the same block is not the same bytes.
        let (mut a, mut b) = (vec![0u8; 512], vec![0u8; 512]);
        stamp(&mut a, 1, 1, 1);
        stamp(&mut b, 1, 1, 2);
        assert_ne!(a[HEADER..], b[HEADER..]);
        assert!(Bad::Zeroes.to_string().contains("zeroes"));
    }
}

//! The superblock each member carries in its first 4 KiB, so a node can
//! reassemble a volume from its members alone.
//!
//! Layout (little-endian):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `FLPLVOL1` |
//! | 8 | 4 | format version (1) |
//! | 16 | 16 | volume uuid |
//! | 32 | 8 | generation (bumped on every superblock update) |
//! | 40 | 2 | this member's position |
//! | 42 | 2 | member count n |
//! | 44 | 1 | layout kind, 45: clean (1) / dirty (0), 46: k, 47: m |
//! | 48 | 4 | volume block size |
//! | 52 | 4 | strip bytes |
//! | 56 | 8 | metadata bytes at the start of each member (data starts after) |
//! | 64 | 8 | stripes per intent-bitmap bit |
//! | 72 | 8 | member byte offset of the device-kept record area ([`crate::records`]); 0: none (volumes made before it: zero here) |
//! | 80 | 24 * n | member table: state (0 active, 1 failed, 2 rebuilding, 3 resyncing), pad, then 8 bytes: the rebuild or resync checkpoint (stripe) for states 2 and 3, for state 1 the generation at which the member failed with the intent bitmap kept from then on (0: unknown), then data-area blocks |
//! | 3072 | 64 | name: length byte, then up to 63 bytes of UTF-8 (zero when unnamed) |
//! | 3136 | 128 | format version 2 only: the wrapped data key of an encrypted volume ([`crate::crypt::KeyEnvelope`]) |
//! | 4092 | 4 | CRC32C of bytes 0..4092 |
//!
//! Compatibility (format version stays 1): state 3 (resyncing, a re-added
//! member) and the failed-at generation in state 1's checkpoint field came
//! with re-add. Superblocks written before them decode unchanged (a failed
//! member with 0 there is simply not re-addable through the bitmap: a re-add
//! rebuilds it in full). A build from before re-add refuses a superblock
//! with a member in state 3 ("member i state 3"), and reads state 1 while
//! ignoring the failed-at field (and clears it, as it also clears the
//! bitmap while degraded), so after such a build ran, re-add falls back to
//! a full rebuild, which is safe.

//! Encrypted volumes (with a key envelope) are written as format version 2,
//! every other volume as version 1, as before: a build from before
//! encryption refuses an encrypted volume ("format version 2 is not
//! supported") instead of serving its ciphertext as data, and reads every
//! volume it made itself unchanged.

// Public here as before it had a module of its own.
pub use crate::crc::crc32c;
use crate::crypt::{ENVELOPE_BYTES, KeyEnvelope};
use crate::layout::{LayoutKind, MAX_MEMBERS};

pub const SB_BYTES: usize = 4096;
pub const MAGIC: [u8; 8] = *b"FLPLVOL1";
const VERSION: u32 = 1;
/// The format of an encrypted volume's superblocks (a key envelope at [`KEY_AT`]).
const VERSION_ENCRYPTED: u32 = 2;
/// Where an encrypted volume's key envelope lives.
pub const KEY_AT: usize = NAME_AT + 64;
const TABLE_AT: usize = 80;
const ENTRY: usize = 24;
const CRC_AT: usize = SB_BYTES - 4;
const NAME_AT: usize = 3072;
/// Longest volume name the superblock holds, in bytes.
pub const MAX_NAME_BYTES: usize = 63;

/// A member's state as the volume sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    Active,
    Failed,
    /// Being rebuilt: stripes below `checkpoint` hold good data.
    Rebuilding {
        checkpoint: u64,
    },
    /// Re-added after a failure (`Volume::re_add`): it holds good data but
    /// in the regions written while it was away; those at or above
    /// `checkpoint` are being resynced from the others.
    Resyncing {
        checkpoint: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberEntry {
    pub state: MemberState,
    /// Data-area size in volume blocks (concat members differ).
    pub data_blocks: u64,
    /// For a failed member: the generation at which it failed with the
    /// intent bitmap kept from then on; 0: unknown (see the module comment).
    pub failed_at: u64,
}

/// What a volume is for, recorded at create so that the node never takes
/// data a host wrote at the volume's start for pool metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VolumeRole {
    /// Made before roles were recorded: what block 0 holds decides.
    #[default]
    Unknown,
    /// Served to hosts (or unused): block 0 is theirs.
    Plain,
    /// Formatted as a thin pool.
    ThinPool,
    /// An extent of a thin pool.
    PoolExtent,
}

impl VolumeRole {
    pub fn code(self) -> u8 {
        match self {
            VolumeRole::Unknown => 0,
            VolumeRole::Plain => 1,
            VolumeRole::ThinPool => 2,
            VolumeRole::PoolExtent => 3,
        }
    }

    pub fn from_code(c: u8) -> Option<VolumeRole> {
        Some(match c {
            0 => VolumeRole::Unknown,
            1 => VolumeRole::Plain,
            2 => VolumeRole::ThinPool,
            3 => VolumeRole::PoolExtent,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub uuid: [u8; 16],
    pub generation: u64,
    pub position: u16,
    pub kind: LayoutKind,
    pub clean: bool,
    pub block_size: u32,
    pub strip_bytes: u32,
    pub meta_bytes: u64,
    pub region_stripes: u64,
    /// Where the device-kept records live in each member; 0: nowhere.
    pub records_at: u64,
    /// Byte 12 (zero in volumes made before it: `Unknown`).
    pub role: VolumeRole,
    pub members: Vec<MemberEntry>,
    /// The operator's name for the volume; names longer than
    /// [`MAX_NAME_BYTES`] are cut at a character boundary.
    pub name: String,
    /// An encrypted volume's wrapped data key; None: not encrypted.
    pub key: Option<KeyEnvelope>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SuperblockError {
    #[error("no flashpool volume superblock (magic is {0:02x?})")]
    NoMagic([u8; 8]),
    #[error("superblock checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum { stored: u32, computed: u32 },
    #[error("superblock format version {0} is not supported (this build reads 1 and 2)")]
    Version(u32),
    #[error("superblock is inconsistent: {0}")]
    Bad(String),
}

impl Superblock {
    pub fn encode(&self) -> [u8; SB_BYTES] {
        let mut b = [0u8; SB_BYTES];
        b[0..8].copy_from_slice(&MAGIC);
        let version = if self.key.is_some() {
            VERSION_ENCRYPTED
        } else {
            VERSION
        };
        b[8..12].copy_from_slice(&version.to_le_bytes());
        b[12] = self.role.code();
        b[16..32].copy_from_slice(&self.uuid);
        b[32..40].copy_from_slice(&self.generation.to_le_bytes());
        b[40..42].copy_from_slice(&self.position.to_le_bytes());
        b[42..44].copy_from_slice(&(self.members.len() as u16).to_le_bytes());
        b[44] = self.kind.code();
        b[45] = u8::from(self.clean);
        if let LayoutKind::Erasure { k, m } = self.kind {
            b[46] = k as u8;
            b[47] = m as u8;
        }
        b[48..52].copy_from_slice(&self.block_size.to_le_bytes());
        b[52..56].copy_from_slice(&self.strip_bytes.to_le_bytes());
        b[56..64].copy_from_slice(&self.meta_bytes.to_le_bytes());
        b[64..72].copy_from_slice(&self.region_stripes.to_le_bytes());
        b[72..80].copy_from_slice(&self.records_at.to_le_bytes());
        for (i, e) in self.members.iter().enumerate() {
            let at = TABLE_AT + i * ENTRY;
            let (state, cp) = match e.state {
                MemberState::Active => (0u8, 0u64),
                MemberState::Failed => (1, e.failed_at),
                MemberState::Rebuilding { checkpoint } => (2, checkpoint),
                MemberState::Resyncing { checkpoint } => (3, checkpoint),
            };
            b[at] = state;
            b[at + 8..at + 16].copy_from_slice(&cp.to_le_bytes());
            b[at + 16..at + 24].copy_from_slice(&e.data_blocks.to_le_bytes());
        }
        let mut len = self.name.len().min(MAX_NAME_BYTES);
        while !self.name.is_char_boundary(len) {
            len -= 1;
        }
        b[NAME_AT] = len as u8;
        b[NAME_AT + 1..NAME_AT + 1 + len].copy_from_slice(&self.name.as_bytes()[..len]);
        if let Some(k) = &self.key {
            b[KEY_AT..KEY_AT + ENVELOPE_BYTES].copy_from_slice(&k.encode());
        }
        let crc = crc32c(&b[..CRC_AT]);
        b[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Superblock, SuperblockError> {
        if b.len() < SB_BYTES {
            return Err(SuperblockError::Bad(format!(
                "{} bytes, need {SB_BYTES}",
                b.len()
            )));
        }
        let magic: [u8; 8] = b[0..8].try_into().expect("8 bytes");
        if magic != MAGIC {
            return Err(SuperblockError::NoMagic(magic));
        }
        let u16_at = |at: usize| u16::from_le_bytes(b[at..at + 2].try_into().expect("2"));
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4"));
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8"));
        let stored = u32_at(CRC_AT);
        let computed = crc32c(&b[..CRC_AT]);
        if stored != computed {
            return Err(SuperblockError::Checksum { stored, computed });
        }
        let version = u32_at(8);
        let key = match version {
            VERSION => None,
            VERSION_ENCRYPTED => Some(
                KeyEnvelope::decode(&b[KEY_AT..KEY_AT + ENVELOPE_BYTES])
                    .map_err(|e| SuperblockError::Bad(e.to_string()))?
                    .ok_or_else(|| {
                        SuperblockError::Bad("format version 2 without a key envelope".into())
                    })?,
            ),
            _ => return Err(SuperblockError::Version(version)),
        };
        let n = u16_at(42) as usize;
        if n == 0 || n > MAX_MEMBERS {
            return Err(SuperblockError::Bad(format!("member count {n}")));
        }
        let position = u16_at(40);
        if usize::from(position) >= n {
            return Err(SuperblockError::Bad(format!(
                "position {position} of {n} members"
            )));
        }
        let kind = LayoutKind::from_code(b[44], b[46].into(), b[47].into())
            .ok_or_else(|| SuperblockError::Bad(format!("layout code {}", b[44])))?;
        let (meta_bytes, records_at) = (u64_at(56), u64_at(72));
        if records_at != 0
            && (!records_at.is_multiple_of(SB_BYTES as u64)
                || records_at < SB_BYTES as u64
                || records_at.saturating_add(crate::records::AREA_BYTES) > meta_bytes)
        {
            return Err(SuperblockError::Bad(format!(
                "record area at {records_at} does not fit the {meta_bytes}-byte metadata area"
            )));
        }
        let role = VolumeRole::from_code(b[12])
            .ok_or_else(|| SuperblockError::Bad(format!("volume role {}", b[12])))?;
        let mut members = Vec::with_capacity(n);
        for i in 0..n {
            let at = TABLE_AT + i * ENTRY;
            let state = match b[at] {
                0 => MemberState::Active,
                1 => MemberState::Failed,
                2 => MemberState::Rebuilding {
                    checkpoint: u64_at(at + 8),
                },
                3 => MemberState::Resyncing {
                    checkpoint: u64_at(at + 8),
                },
                s => return Err(SuperblockError::Bad(format!("member {i} state {s}"))),
            };
            members.push(MemberEntry {
                state,
                data_blocks: u64_at(at + 16),
                failed_at: if state == MemberState::Failed {
                    u64_at(at + 8)
                } else {
                    0
                },
            });
        }
        Ok(Superblock {
            uuid: b[16..32].try_into().expect("16 bytes"),
            generation: u64_at(32),
            position,
            kind,
            clean: b[45] == 1,
            block_size: u32_at(48),
            strip_bytes: u32_at(52),
            meta_bytes,
            region_stripes: u64_at(64),
            records_at,
            role,
            members,
            name: {
                let len = usize::from(b[NAME_AT]);
                if len > MAX_NAME_BYTES {
                    return Err(SuperblockError::Bad(format!("name length {len}")));
                }
                String::from_utf8(b[NAME_AT + 1..NAME_AT + 1 + len].to_vec())
                    .map_err(|_| SuperblockError::Bad("name is not UTF-8".into()))?
            },
            key,
        })
    }

    /// Whether two superblocks describe the same volume shape (all but
    /// generation, position, clean flag and member states).
    pub fn same_shape(&self, o: &Superblock) -> bool {
        self.uuid == o.uuid
            && self.kind == o.kind
            && self.block_size == o.block_size
            && self.strip_bytes == o.strip_bytes
            && self.meta_bytes == o.meta_bytes
            && self.region_stripes == o.region_stripes
            && self.members.len() == o.members.len()
            && self
                .members
                .iter()
                .zip(&o.members)
                .all(|(a, b)| a.data_blocks == b.data_blocks)
    }
}

/// Formats a uuid as 8-4-4-4-12 hex.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// A random (v4-style) uuid from the OS-seeded std hasher and the clock.
pub fn new_uuid() -> [u8; 16] {
    use std::hash::{BuildHasher, Hasher};
    let mut out = [0u8; 16];
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    for (i, half) in out.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(now);
        h.write_usize(i);
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    out[6] = (out[6] & 0x0f) | 0x40;
    out[8] = (out[8] & 0x3f) | 0x80;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        Superblock {
            uuid: new_uuid(),
            generation: 42,
            position: 2,
            kind: LayoutKind::Erasure { k: 8, m: 2 },
            clean: true,
            block_size: 4096,
            strip_bytes: 65536,
            meta_bytes: 1 << 20,
            region_stripes: 4,
            records_at: (1 << 20) - 8192,
            role: VolumeRole::ThinPool,
            members: (0..10)
                .map(|i| MemberEntry {
                    state: match i {
                        3 => MemberState::Failed,
                        4 => MemberState::Rebuilding { checkpoint: 77 },
                        5 => MemberState::Resyncing { checkpoint: 12 },
                        _ => MemberState::Active,
                    },
                    data_blocks: 1000 + i,
                    failed_at: if i == 3 { 41 } else { 0 },
                })
                .collect(),
            name: "vol-ü".into(),
            key: None,
        }
    }

    #[test]
    fn key_envelope_makes_format_version_2() {
        use crate::crypt::{DataKey, Kek};
        // Not encrypted: version 1, zeroes where the envelope would be.
        let plain = sample().encode();
        assert_eq!(u32::from_le_bytes(plain[8..12].try_into().unwrap()), 1);
        assert!(
            plain[KEY_AT..KEY_AT + ENVELOPE_BYTES]
                .iter()
                .all(|&b| b == 0)
        );
        let mut sb = sample();
        let kek = Kek::generate().unwrap();
        sb.key = Some(kek.wrap(&DataKey::generate().unwrap()).unwrap());
        let b = sb.encode();
        assert_eq!(u32::from_le_bytes(b[8..12].try_into().unwrap()), 2);
        assert_eq!(Superblock::decode(&b).unwrap(), sb);
        // Version 2 without an envelope is refused, not read as plaintext.
        let mut bad = b;
        bad[KEY_AT..KEY_AT + ENVELOPE_BYTES].fill(0);
        let crc = crc32c(&bad[..CRC_AT]);
        bad[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            Superblock::decode(&bad),
            Err(SuperblockError::Bad(_))
        ));
    }

    #[test]
    fn long_names_are_cut_at_a_character_boundary() {
        let mut sb = sample();
        sb.name = format!("{}é", "a".repeat(62));
        let back = Superblock::decode(&sb.encode()).unwrap();
        assert_eq!(back.name, "a".repeat(62));
    }

    #[test]
    fn roundtrip() {
        let sb = sample();
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
    }

    #[test]
    fn record_area_field() {
        // Volumes made before records have zeroes at 72..80: no record area.
        let mut sb = sample();
        sb.records_at = 0;
        let b = sb.encode();
        assert_eq!(b[72..80], [0u8; 8]);
        assert_eq!(Superblock::decode(&b).unwrap().records_at, 0);
        // An area past the metadata is refused.
        sb.records_at = sb.meta_bytes - 4096;
        let e = Superblock::decode(&sb.encode()).unwrap_err();
        assert!(matches!(e, SuperblockError::Bad(_)), "{e}");
    }

    #[test]
    fn corruption_is_caught() {
        let mut b = sample().encode();
        b[100] ^= 1;
        assert!(matches!(
            Superblock::decode(&b),
            Err(SuperblockError::Checksum { .. })
        ));
        let e = Superblock::decode(&[0u8; SB_BYTES]).unwrap_err();
        assert!(matches!(e, SuperblockError::NoMagic(_)), "{e}");
    }
}

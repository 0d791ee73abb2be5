//! Protected volumes over [`blockdev::BlockDevice`] members: concat, raid0,
//! raid1 (n-way), raid5, raid6 and k+m Reed-Solomon, with a write-intent
//! bitmap against the write hole, degraded I/O, and throttled, resumable
//! rebuild. A [`Volume`] is itself a `BlockDevice`, so the target serves it
//! like any other namespace. A volume made with a key ([`crypt`]) encrypts
//! every block (AES-XTS-256) before it leaves for a member.
//!
//! On-member format: the first `meta_bytes` of every member hold the
//! [`superblock`] (4 KiB), then the [`intent`] bitmap, then the write
//! journal, and at the end the device-kept [`records`]; data starts after.

mod crc;
pub mod crypt;
#[cfg(feature = "testing")]
pub mod fault;
pub mod intent;
mod journal;
pub mod layout;
pub mod parity;
pub mod rebuild;
pub mod records;
pub mod superblock;
pub mod thin;
mod volume;

#[cfg(test)]
mod isal_oracle;
#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod testutil;
#[cfg(test)]
mod thin_extent_tests;
#[cfg(test)]
mod thin_pack_tests;
#[cfg(test)]
mod thin_snap_tests;
#[cfg(test)]
mod thin_tests;

#[cfg(feature = "testing")]
pub use fault::{CrashSwitch, FaultDevice, FaultStats};
pub use layout::{Layout, LayoutError, LayoutKind};
pub use parity::{Code, Parity, ParityError};
pub use rebuild::{RebuildOptions, RebuildProgress};
pub use superblock::MemberState;
pub use thin::{
    CompactOptions, CompactReport, Compression, DEFAULT_CLUSTER_BYTES, PoolStats, PoolUsage,
    ThinError, ThinInfo, ThinPool, ThinVolume,
};
pub use volume::{
    AUTO_REGION_MAX_BYTES, AUTO_REGION_MIN_BYTES, AUTO_REGIONS_PER_MEMBER, DEFAULT_META_BYTES,
    DEFAULT_STRIP_BYTES, ForceReport, ForcedFrom, ForcedMember, ReAddReport, ScrubReport,
    StaleRange, StateHook, StateRecord, SyncControl, Volume, VolumeConfig, VolumeError,
    VolumeStats,
};

//! The checks every request goes through: names, layouts and sizes as the
//! operator wrote them, and the lookups that answer "no such volume/drive".

use volume::superblock::MAX_NAME_BYTES;
use volume::thin::DEFAULT_CLUSTER_BYTES;
use volume::{Compression, LayoutKind};

use crate::echo::Echo;

use super::{CreateVolume, NodeError, NodeResult, NodeState, VolumeEntry};

/// The cluster of a compressed pool unless one is asked for. Each chunk
/// (cluster) is compressed whole, so a 4 KiB write reads, recompresses and
/// rewrites its whole chunk: the default 1 MiB would make that 256 times
/// the write; 64 KiB keeps it at 16 while giving the compressor enough to
/// find repeats in.
pub const COMPRESSED_CLUSTER_BYTES: u64 = 64 << 10;

/// Clusters a compressed pool may have (the volume crate's limits: a
/// chunk's block count must fit a byte), checked here so that a refused
/// pool leaves its drives untouched.
const PACKED_CLUSTERS: std::ops::RangeInclusive<u64> =
    volume::thin::MIN_PACKED_CLUSTER..=volume::thin::MAX_PACKED_CLUSTER;

/// The cluster size and compression of a new thin pool (`cluster` and
/// `compression` of `POST /v1/volumes`), checked before anything is made.
/// Both are refused on a volume that is not a pool.
pub(super) fn pool_format(req: &CreateVolume) -> NodeResult<(u64, Compression)> {
    let name = &req.name;
    if !req.thin_pool {
        if let Some(c) = &req.cluster {
            return Err(NodeError::BadRequest(format!(
                "volume {name}: cluster {} is for thin pools; add thin_pool or remove cluster",
                Echo(c)
            )));
        }
        if let Some(c) = &req.compression {
            return Err(NodeError::BadRequest(format!(
                "volume {name}: compression {} is for thin pools (a thin volume is compressed \
                 when its pool is); add thin_pool or remove compression",
                Echo(c)
            )));
        }
        return Ok((DEFAULT_CLUSTER_BYTES, Compression::None));
    }
    let compression = match req.compression.as_deref() {
        None => Compression::None,
        Some(c) => c.parse::<Compression>().map_err(|_| {
            NodeError::BadRequest(format!(
                "volume {name}: compression {} is not known; use lz4, zstd or none",
                Echo(c)
            ))
        })?,
    };
    let cluster = match (&req.cluster, compression) {
        (Some(c), _) => size_arg("cluster", c)?,
        (None, Compression::None) => DEFAULT_CLUSTER_BYTES,
        (None, _) => COMPRESSED_CLUSTER_BYTES,
    };
    if !cluster.is_power_of_two() || !(4096..=1 << 30).contains(&cluster) {
        return Err(NodeError::BadRequest(format!(
            "volume {name}: cluster {cluster} bytes is not a power of two from 4 KiB to 1 GiB; \
             use e.g. 1MiB"
        )));
    }
    if compression != Compression::None && !PACKED_CLUSTERS.contains(&cluster) {
        return Err(NodeError::BadRequest(format!(
            "volume {name}: a compressed pool needs clusters of 16 KiB to 1 MiB (each is \
             compressed whole); {} is outside that, use 64KiB (the default with compression)",
            crate::units::human_bytes(cluster)
        )));
    }
    Ok((cluster, compression))
}

/// Parses `concat`, `raid0`, `raid1`, `raid5`, `raid6`, `ecK+M`.
pub fn parse_layout(s: &str) -> NodeResult<LayoutKind> {
    let bad = || {
        NodeError::BadRequest(format!(
            "layout {} is unknown; use concat, raid0, raid1, raid5, raid6 or ecK+M (e.g. ec8+2)",
            Echo(s)
        ))
    };
    Ok(match s {
        "concat" => LayoutKind::Concat,
        "raid0" => LayoutKind::Raid0,
        "raid1" => LayoutKind::Raid1,
        "raid5" => LayoutKind::Raid5,
        "raid6" => LayoutKind::Raid6,
        _ => {
            let (k, m) = s
                .strip_prefix("ec")
                .and_then(|r| r.split_once('+'))
                .ok_or_else(bad)?;
            let k: usize = k.parse().map_err(|_| bad())?;
            let m: usize = m.parse().map_err(|_| bad())?;
            LayoutKind::Erasure { k, m }
        }
    })
}

/// Volume and drive names: 1 to 63 of `A-Z a-z 0-9 . _ -`, starting with a
/// letter or digit (they appear in URLs, logs and superblocks).
pub fn check_name(what: &str, name: &str) -> NodeResult<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(NodeError::BadRequest(format!(
            "{what} name {} is not valid: use 1 to {MAX_NAME_BYTES} letters, digits, '.', '_' or '-', starting with a letter or digit",
            Echo(name)
        )))
    }
}

pub(super) fn size_arg(what: &str, s: &str) -> NodeResult<u64> {
    crate::units::parse_size(s).map_err(|e| NodeError::BadRequest(format!("{what}: {e}")))
}

pub(super) fn find_volume<'a>(
    st: &'a mut NodeState,
    name: &str,
) -> NodeResult<&'a mut VolumeEntry> {
    st.volumes
        .get_mut(name)
        .ok_or_else(|| NodeError::no_volume(name))
}

pub(super) fn no_drive(name: &str) -> NodeError {
    NodeError::no_drive(name)
}

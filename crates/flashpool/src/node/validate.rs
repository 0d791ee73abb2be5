//! The checks every request goes through: names, layouts and sizes as the
//! operator wrote them, and the lookups that answer "no such volume/drive".

use volume::LayoutKind;
use volume::superblock::MAX_NAME_BYTES;

use crate::echo::Echo;

use super::{NodeError, NodeResult, NodeState, VolumeEntry};

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

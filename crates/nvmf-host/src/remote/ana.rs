//! The ANA state of one namespace in a controller's ANA log page (NVMe 2.0
//! section 5.16.1.13), for a host that picks its path itself (`flashpool
//! attach` on a cluster subsystem). The log is untrusted input.

use nvme_wire::log_page::ana::{DESC_LEN, HEADER_LEN};

/// Bytes of ANA log asked for: the header, and room for 400 groups with
/// one NSID each (the target pads a longer request with zeroes).
pub(crate) const ANA_LOG_LEN: u64 = (HEADER_LEN + 400 * (DESC_LEN + 4)) as u64;

/// The state (low nibble of the group's state byte) of `nsid`'s group;
/// `Ok(None)` if no group lists it; `Err` if the log is cut short or
/// claims more NSIDs than it holds.
pub(crate) fn state_of(log: &[u8], nsid: u32) -> Result<Option<u8>, String> {
    let short = || format!("ANA log of {} bytes is cut short", log.len());
    let le32 =
        |o: usize| -> Option<u32> { Some(u32::from_le_bytes(log.get(o..o + 4)?.try_into().ok()?)) };
    let ngrps = u16::from_le_bytes(log.get(8..10).ok_or_else(short)?.try_into().expect("2"));
    let mut off = HEADER_LEN;
    for _ in 0..ngrps {
        let nnsids = le32(off + 4).ok_or_else(short)? as usize;
        let state = *log.get(off + 16).ok_or_else(short)? & 0x0F;
        off += DESC_LEN;
        if nnsids > log.len().saturating_sub(off) / 4 {
            return Err(format!(
                "ANA group lists {nnsids} NSIDs, more than the log holds"
            ));
        }
        for i in 0..nnsids {
            if le32(off + 4 * i) == Some(nsid) {
                return Ok(Some(state));
            }
        }
        off += 4 * nnsids;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme_wire::log_page::ana::{self, Group, STATE_INACCESSIBLE, STATE_OPTIMIZED};

    #[test]
    fn finds_the_namespace_group_and_refuses_a_lying_log() {
        let groups = [
            Group {
                grpid: 1,
                state: STATE_INACCESSIBLE,
                nsids: &[1, 7],
            },
            Group {
                grpid: 2,
                state: STATE_OPTIMIZED,
                nsids: &[2],
            },
        ];
        let mut b = vec![0; ana::log_len(&groups, false) + 64];
        ana::encode(3, &groups, false, &mut b);
        assert_eq!(state_of(&b, 7), Ok(Some(STATE_INACCESSIBLE)));
        assert_eq!(state_of(&b, 2), Ok(Some(STATE_OPTIMIZED)));
        assert_eq!(state_of(&b, 9), Ok(None));
        assert!(state_of(&b[..5], 2).is_err());
        b[HEADER_LEN + 4..HEADER_LEN + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(state_of(&b, 2).is_err());
        assert!(ANA_LOG_LEN as usize >= ana::log_len(&groups, false));
    }
}

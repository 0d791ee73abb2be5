//! The ANA log page (NVMe 2.0 section 5.16.1.13) as a host reads it: which
//! namespaces the controller reports Optimized.

use std::collections::HashMap;

use nvme_wire::log_page::ana::{DESC_LEN, HEADER_LEN};

/// The ANA state of each namespace the log lists (the low nibble of the
/// group's state byte). `None` if the log is cut short or malformed: a
/// controller's answer is untrusted input.
pub(crate) fn states(log: &[u8]) -> Option<HashMap<u32, u8>> {
    let le32 =
        |o: usize| -> Option<u32> { Some(u32::from_le_bytes(log.get(o..o + 4)?.try_into().ok()?)) };
    let ngrps = u16::from_le_bytes(log.get(8..10)?.try_into().ok()?);
    let mut out = HashMap::new();
    let mut off = HEADER_LEN;
    for _ in 0..ngrps {
        let nnsids = le32(off + 4)? as usize;
        let state = *log.get(off + 16)? & 0x0F;
        off += DESC_LEN;
        // nnsids comes from the wire: bound it by what the log holds
        if nnsids > log.len().saturating_sub(off) / 4 {
            return None;
        }
        for i in 0..nnsids {
            out.insert(le32(off + 4 * i)?, state);
        }
        off += 4 * nnsids;
    }
    Some(out)
}

/// Bytes to ask for: the header, one group per volume and every NSID, and a
/// margin for groups this probe does not know of.
pub(crate) fn len_for(volumes: usize) -> u64 {
    (HEADER_LEN + volumes * (DESC_LEN + 4) + 4096) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme_wire::log_page::ana::{self, Group, STATE_INACCESSIBLE, STATE_OPTIMIZED};

    #[test]
    fn reads_what_the_target_encodes() {
        let groups = [
            Group {
                grpid: 1,
                state: STATE_OPTIMIZED,
                nsids: &[1, 7],
            },
            Group {
                grpid: 2,
                state: STATE_INACCESSIBLE,
                nsids: &[2],
            },
            Group {
                grpid: 3,
                state: STATE_OPTIMIZED,
                nsids: &[],
            },
        ];
        let mut b = vec![0xAA; ana::log_len(&groups, false) + 100];
        ana::encode(5, &groups, false, &mut b);
        let s = states(&b).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[&1], STATE_OPTIMIZED);
        assert_eq!(s[&7], STATE_OPTIMIZED);
        assert_eq!(s[&2], STATE_INACCESSIBLE);
    }

    #[test]
    fn refuses_a_short_or_lying_log() {
        let groups = [Group {
            grpid: 1,
            state: STATE_OPTIMIZED,
            nsids: &[1, 2, 3],
        }];
        let mut b = vec![0; ana::log_len(&groups, false)];
        ana::encode(1, &groups, false, &mut b);
        assert!(states(&b[..b.len() - 1]).is_none());
        assert!(states(&b[..5]).is_none());
        // a group that claims more NSIDs than the log holds
        b[HEADER_LEN + 4..HEADER_LEN + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(states(&b).is_none());
    }

    #[test]
    fn asks_for_enough() {
        let nsids: Vec<u32> = (1..=500).collect();
        let groups: Vec<Group> = nsids
            .iter()
            .map(|n| Group {
                grpid: *n,
                state: STATE_OPTIMIZED,
                nsids: std::slice::from_ref(n),
            })
            .collect();
        assert!(len_for(500) as usize >= ana::log_len(&groups, false));
    }
}

//! Asymmetric Namespace Access. A single node serves every namespace from one
//! group in the optimized state; the cluster layer will move groups between
//! nodes by changing the state reported here.

use nvme_wire::log_page::ana;

use crate::subsystem::Namespace;

pub const DEFAULT_GROUP: u32 = 1;
/// Groups a controller may report (ANAGRPMAX, NANAGRPID).
pub const MAX_GROUPS: u32 = 1;
/// ANA transition time in seconds.
pub const ANATT: u8 = 10;
/// ANACAP: reports optimized, non-optimized, inaccessible, persistent loss,
/// change; ANAGRPID does not change while attached (bit 6).
pub const ANACAP: u8 = 0x1F | (1 << 6);

/// Builds the ANA log for `namespaces`; `rgo` leaves out the NSID lists.
pub fn ana_log(namespaces: &[Namespace], rgo: bool) -> Vec<u8> {
    let nsids: Vec<u32> = namespaces
        .iter()
        .filter(|n| n.ana_group == DEFAULT_GROUP)
        .map(|n| n.nsid)
        .collect();
    let groups = [ana::Group {
        grpid: DEFAULT_GROUP,
        state: ana::STATE_OPTIMIZED,
        nsids: &nsids,
    }];
    let mut b = vec![0u8; ana::log_len(&groups, rgo)];
    ana::encode(1, &groups, rgo, &mut b);
    b
}

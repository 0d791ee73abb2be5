//! The discovery controller's log: every subsystem this host may reach, on
//! every I/O listener, plus the discovery service itself.

use nvme_wire::fabrics::DISCOVERY_NQN;
use nvme_wire::fabrics::discovery::{self, Entry};

use crate::Target;
use crate::config::ListenerKind;

/// Admin queue size hosts should ask for (ASQSZ).
pub const ADMIN_SQ_SIZE: u16 = 32;

pub fn discovery_log(target: &Target, hostnqn: &str) -> Vec<u8> {
    let listeners = target.listeners.read();
    let mut entries = Vec::new();
    for (i, l) in listeners.iter().enumerate() {
        let adrfam = if l.addr.is_ipv4() {
            discovery::ADRFAM_IPV4
        } else {
            discovery::ADRFAM_IPV6
        };
        let entry = |subtype, subnqn: &str| Entry {
            adrfam,
            subtype,
            treq: discovery::TREQ_DISABLE_SQFLOW,
            portid: (i + 1) as u16,
            cntlid: nvme_wire::fabrics::CNTLID_DYNAMIC,
            asqsz: ADMIN_SQ_SIZE,
            trsvcid: l.addr.port().to_string(),
            subnqn: subnqn.to_string(),
            traddr: l.addr.ip().to_string(),
        };
        match l.kind {
            ListenerKind::Io => {
                for s in target.subsystems.iter().filter(|s| s.host_allowed(hostnqn)) {
                    entries.push(entry(discovery::SUBTYPE_NVME, &s.nqn));
                }
            }
            ListenerKind::Discovery => {
                entries.push(entry(discovery::SUBTYPE_CURRENT_DISCOVERY, DISCOVERY_NQN));
            }
        }
    }
    let mut b = vec![0u8; discovery::log_len(entries.len())];
    discovery::encode_log(target.discovery_genctr, &entries, &mut b);
    b
}

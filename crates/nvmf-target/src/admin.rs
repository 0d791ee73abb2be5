//! Admin commands: Identify, Get Log Page, Set/Get Features, Async Event
//! Request, Keep Alive, Abort. Discovery controllers accept a subset.

use nvme_wire::identify::{
    self, ControllerInfo, CsIndepNamespaceInfo, IDENTIFY_LEN, NamespaceInfo, NvmControllerInfo,
};
use nvme_wire::log_page::{self, GetLogPage, SmartLog, lid};
use nvme_wire::sqe::{Sqe, admin_opc, io_opc};
use nvme_wire::status::{self, Status};

use crate::Target;
use crate::controller::{AER_LIMIT, Controller, DEFAULT_OVER_TEMP_K, ERROR_LOG_SLOTS};
use crate::subsystem::MAX_NSID;

pub mod fid {
    pub const ARBITRATION: u8 = 0x01;
    pub const POWER_MGMT: u8 = 0x02;
    pub const TEMP_THRESHOLD: u8 = 0x04;
    pub const ERROR_RECOVERY: u8 = 0x05;
    pub const VOLATILE_WC: u8 = 0x06;
    pub const NUM_QUEUES: u8 = 0x07;
    /// Interrupt Coalescing and Interrupt Vector Configuration: PCIe only;
    /// NVMe over Fabrics has no interrupts (nvmet refuses them on fabrics too).
    pub const IRQ_COALESCE: u8 = 0x08;
    pub const IRQ_CONFIG: u8 = 0x09;
    pub const WRITE_ATOMICITY: u8 = 0x0A;
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0B;
    pub const KATO: u8 = 0x0F;
    pub const IO_COMMAND_SET_PROFILE: u8 = 0x19;
}

/// Get Features SEL (CDW10 bits 10:8).
pub mod sel {
    pub const CURRENT: u8 = 0b000;
    pub const DEFAULT: u8 = 0b001;
    pub const SAVED: u8 = 0b010;
    pub const SUPPORTED_CAPABILITIES: u8 = 0b011;
}

/// Supported capabilities (Get Features SEL 011b, dword 0): bit 0
/// saveable, bit 1 namespace specific, bit 2 changeable.
const CAP_CHANGEABLE: u32 = 1 << 2;

/// Composite temperature sensor (TMPSEL 0h) and, for Set Features, all
/// implemented sensors (TMPSEL Fh): we implement only the composite.
const TMPSEL_COMPOSITE: u32 = 0x0;
const TMPSEL_ALL: u32 = 0xF;
const THSEL_OVER: u32 = 0b00;
const THSEL_UNDER: u32 = 0b01;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminOutcome {
    /// Completed: status, dword 0, and whether `out` holds data for the host.
    Complete {
        status: Status,
        dw0: u32,
        data: bool,
    },
    /// An Async Event Request to hold until an event occurs.
    HoldAer,
}

fn done(status: Status) -> AdminOutcome {
    AdminOutcome::Complete {
        status,
        dw0: 0,
        data: false,
    }
}

fn ok_dw0(dw0: u32) -> AdminOutcome {
    AdminOutcome::Complete {
        status: Status::SUCCESS,
        dw0,
        data: false,
    }
}

fn ok_data() -> AdminOutcome {
    AdminOutcome::Complete {
        status: Status::SUCCESS,
        dw0: 0,
        data: true,
    }
}

fn invalid_field() -> AdminOutcome {
    done(Status::generic(status::SC_INVALID_FIELD))
}

/// Bytes this admin command returns to the host (None: no data). The SGL
/// must describe exactly this many, as for any NVMe command.
pub fn data_in_len(sqe: &Sqe) -> Option<u64> {
    match sqe.opcode {
        admin_opc::IDENTIFY => Some(IDENTIFY_LEN as u64),
        admin_opc::GET_LOG_PAGE => Some(GetLogPage::from_sqe(sqe).len),
        _ => None,
    }
}

pub struct AdminCtx<'a> {
    pub target: &'a Target,
    pub ctrl: &'a Controller,
    /// AERs the admin queue holds now.
    pub outstanding_aers: usize,
    /// The local address of this connection (for the discovery log).
    pub local_ip: Option<std::net::IpAddr>,
}

/// Runs one admin command. `out` is the host's data buffer (its length is the
/// transfer length from the SGL) for commands that return data.
pub fn execute(cx: &AdminCtx<'_>, sqe: &Sqe, out: &mut [u8]) -> AdminOutcome {
    let ctrl = cx.ctrl;
    if !ctrl.enabled() {
        return done(Status::generic(status::SC_CMD_SEQ_ERROR));
    }
    if ctrl.is_discovery()
        && !matches!(
            sqe.opcode,
            admin_opc::IDENTIFY
                | admin_opc::GET_LOG_PAGE
                | admin_opc::SET_FEATURES
                | admin_opc::GET_FEATURES
                | admin_opc::ASYNC_EVENT_REQUEST
                | admin_opc::KEEP_ALIVE
        )
    {
        return done(Status::generic(status::SC_INVALID_OPCODE));
    }
    match sqe.opcode {
        admin_opc::IDENTIFY => identify(cx, sqe, out),
        admin_opc::GET_LOG_PAGE => get_log_page(cx, sqe, out),
        admin_opc::SET_FEATURES => set_features(cx, sqe),
        admin_opc::GET_FEATURES => get_features(cx, sqe),
        admin_opc::ASYNC_EVENT_REQUEST => async_event_request(cx),
        admin_opc::KEEP_ALIVE => {
            ctrl.touch();
            done(Status::SUCCESS)
        }
        // We never abort: dword 0 bit 0 set means "command not aborted".
        admin_opc::ABORT => ok_dw0(1),
        _ => done(Status::generic(status::SC_INVALID_OPCODE)),
    }
}

fn copy_out(src: &[u8], offset: usize, out: &mut [u8]) {
    out.fill(0);
    if offset < src.len() {
        let n = (src.len() - offset).min(out.len());
        out[..n].copy_from_slice(&src[offset..offset + n]);
    }
}

fn identify(cx: &AdminCtx<'_>, sqe: &Sqe, out: &mut [u8]) -> AdminOutcome {
    let cns = sqe.cdw10 as u8;
    let ctrl = cx.ctrl;
    let t = &cx.target.transport;
    let mut b = [0u8; IDENTIFY_LEN];
    if ctrl.is_discovery() && cns != identify::cns::CONTROLLER {
        return invalid_field();
    }
    let csi = identify::identify_csi(sqe.cdw11);
    match cns {
        identify::cns::CONTROLLER => {
            let (serial, model) = match ctrl.subsystem() {
                Some(s) => (s.serial.as_str(), s.model.as_str()),
                None => ("", "flashpool discovery"),
            };
            let io = !ctrl.is_discovery();
            ControllerInfo {
                vid: crate::VENDOR_ID,
                serial,
                model,
                firmware: crate::FIRMWARE_REV,
                cntlid: ctrl.cntlid,
                version: nvme_wire::fabrics::prop::VS_1_4,
                cntrltype: if io {
                    identify::CNTRLTYPE_IO
                } else {
                    identify::CNTRLTYPE_DISCOVERY
                },
                mdts: t.mdts(),
                oaes: if io {
                    identify::OAES_NS_ATTR | identify::OAES_ANA_CHANGE
                } else {
                    identify::OAES_DISC_LOG_CHANGE
                },
                ctratt: identify::CTRATT_HOSTID_128 | identify::CTRATT_TBKAS,
                cmic: if io {
                    identify::CMIC_MULTI_PORT | identify::CMIC_MULTI_CTRL | identify::CMIC_ANA
                } else {
                    0
                },
                aerl: (AER_LIMIT - 1) as u8,
                elpe: (ERROR_LOG_SLOTS - 1) as u8,
                kas: 10,
                maxcmd: t.max_queue_depth,
                nn: if io { MAX_NSID } else { 0 },
                oncs: if io {
                    identify::ONCS_DSM
                        | identify::ONCS_WRITE_ZEROES
                        | identify::ONCS_SAVE_SELECT
                        | nvme_wire::reservation::ONCS_RESERVATIONS
                } else {
                    0
                },
                vwc: if io {
                    identify::VWC_PRESENT_NO_BROADCAST_FLUSH
                } else {
                    0
                },
                wctemp: if io { DEFAULT_OVER_TEMP_K } else { 0 },
                subnqn: ctrl.subnqn(),
                in_capsule_data: t.in_capsule_data,
                ana: io.then_some((
                    crate::ana::ANATT,
                    crate::ana::ANACAP,
                    crate::ana::MAX_GROUPS,
                    crate::ana::MAX_GROUPS,
                )),
            }
            .encode(&mut b);
        }
        identify::cns::NAMESPACE => {
            if sqe.nsid == 0 || sqe.nsid > MAX_NSID {
                return done(Status::generic(status::SC_INVALID_NS));
            }
            // An inactive NSID in range gets a zeroed structure.
            if let Some(ns) = crate::subsystem::find_namespace(&ctrl.namespaces(), sqe.nsid) {
                let opt_blocks = (4096 / ns.block_size).max(1) as u16;
                let allocated = ns.dev.allocated_blocks();
                NamespaceInfo {
                    nsze: ns.num_blocks,
                    nuse: allocated.unwrap_or(ns.num_blocks),
                    thin: allocated.is_some(),
                    lba_shift: ns.lba_shift,
                    dealloc_reads_zeroes: ns.dev.deallocate_reads_zeroes(),
                    shared: true,
                    anagrpid: ns.ana_group,
                    nguid: ns.nguid,
                    eui64: [0; 8],
                    npwg: opt_blocks,
                    rescap: crate::resv_cmd::rescap(ns),
                }
                .encode(&mut b);
            }
        }
        identify::cns::ACTIVE_NS_LIST => {
            if sqe.nsid >= 0xFFFF_FFFE {
                return done(Status::generic(status::SC_INVALID_NS));
            }
            identify::encode_active_ns_list(
                ctrl.namespaces().iter().map(|n| n.nsid),
                sqe.nsid,
                &mut b,
            );
        }
        identify::cns::NS_ID_DESCRIPTORS => {
            let namespaces = ctrl.namespaces();
            let Some(ns) = crate::subsystem::find_namespace(&namespaces, sqe.nsid) else {
                return done(Status::generic(status::SC_INVALID_NS));
            };
            identify::encode_ns_descriptors(&ns.nguid, &ns.uuid, &mut b);
        }
        // The NVM command set is our only one (CNS 1Ch); another CSI is an invalid field.
        identify::cns::CS_NAMESPACE | identify::cns::CS_CONTROLLER if csi != identify::csi::NVM => {
            return invalid_field();
        }
        identify::cns::CS_NAMESPACE | identify::cns::CS_INDEP_NAMESPACE => {
            // As CNS 00h: NSID 0 and FFFFFFFFh (and beyond NN) are invalid;
            // an inactive NSID in range gets a zeroed structure.
            if sqe.nsid == 0 || sqe.nsid > MAX_NSID {
                return done(Status::generic(status::SC_INVALID_NS));
            }
            if let Some(ns) = crate::subsystem::find_namespace(&ctrl.namespaces(), sqe.nsid) {
                if cns == identify::cns::CS_NAMESPACE {
                    identify::encode_nvm_namespace(&mut b);
                } else {
                    CsIndepNamespaceInfo {
                        thin: ns.dev.allocated_blocks().is_some(),
                        shared: true,
                        anagrpid: ns.ana_group,
                        ready: true,
                    }
                    .encode(&mut b);
                }
            }
        }
        // No Verify, no Write Uncorrectable, and no Write Zeroes or Dataset
        // Management limits beyond the commands' own: all zero, as nvmet.
        identify::cns::CS_CONTROLLER => NvmControllerInfo::default().encode(&mut b),
        identify::cns::IO_COMMAND_SETS => identify::encode_io_command_sets(&mut b),
        _ => return invalid_field(),
    }
    copy_out(&b, 0, out);
    ok_data()
}

fn get_log_page(cx: &AdminCtx<'_>, sqe: &Sqe, out: &mut [u8]) -> AdminOutcome {
    let g = GetLogPage::from_sqe(sqe);
    let ctrl = cx.ctrl;
    if !g.offset.is_multiple_of(4) {
        return invalid_field();
    }
    // Pages that reading consumes: a refused read must consume nothing.
    let consumed_len = match g.lid {
        lid::CHANGED_NS => log_page::CHANGED_NS_LEN,
        nvme_wire::reservation::LID_RESERVATION_NOTIFICATION => {
            nvme_wire::reservation::RESV_LOG_LEN
        }
        _ => usize::MAX,
    };
    if !ctrl.is_discovery() && g.offset != 0 && g.offset >= consumed_len as u64 {
        return invalid_field();
    }
    let page: Vec<u8> = if ctrl.is_discovery() {
        match g.lid {
            lid::DISCOVERY => {
                crate::discovery::discovery_log(cx.target, &ctrl.hostnqn, cx.local_ip)
            }
            _ => return done(Status::cmd_specific(status::SC_INVALID_LOG_PAGE)),
        }
    } else {
        match g.lid {
            lid::SUPPORTED_LOGS => {
                let mut b = vec![0u8; log_page::SUPPORTED_LOGS_LEN];
                log_page::encode_supported_logs(
                    &[
                        lid::SUPPORTED_LOGS,
                        lid::ERROR,
                        lid::SMART,
                        lid::FW_SLOT,
                        lid::CHANGED_NS,
                        lid::CMD_EFFECTS,
                        lid::ANA,
                        nvme_wire::reservation::LID_RESERVATION_NOTIFICATION,
                    ],
                    &mut b,
                );
                b
            }
            lid::ERROR => {
                let st = ctrl.state.lock();
                let mut b = vec![0u8; ERROR_LOG_SLOTS * log_page::ERROR_ENTRY_LEN];
                for (i, e) in st.errors.iter().enumerate() {
                    e.encode(&mut b[i * log_page::ERROR_ENTRY_LEN..]);
                }
                b
            }
            lid::SMART => {
                let mut s = SmartLog {
                    power_on_hours: ctrl.created.elapsed().as_secs() / 3600,
                    error_log_entries: ctrl.state.lock().error_count,
                    ..Default::default()
                };
                for q in ctrl.stats.lock().iter() {
                    use std::sync::atomic::Ordering::Relaxed;
                    s.read_cmds += q.read_cmds.load(Relaxed);
                    s.write_cmds += q.write_cmds.load(Relaxed);
                    s.bytes_read += q.bytes_read.load(Relaxed);
                    s.bytes_written += q.bytes_written.load(Relaxed);
                    s.media_errors += q.media_errors.load(Relaxed);
                }
                let mut b = vec![0u8; log_page::SMART_LEN];
                s.encode(&mut b);
                b
            }
            lid::FW_SLOT => {
                let mut b = vec![0u8; log_page::FW_SLOT_LEN];
                log_page::encode_fw_slot(crate::FIRMWARE_REV, &mut b);
                b
            }
            lid::CHANGED_NS => {
                let mut st = ctrl.state.lock();
                let mut b = vec![0u8; log_page::CHANGED_NS_LEN];
                for (i, nsid) in st.changed_ns.iter().take(1024).enumerate() {
                    b[i * 4..i * 4 + 4].copy_from_slice(&nsid.to_le_bytes());
                }
                if !g.rae {
                    st.changed_ns.clear();
                }
                b
            }
            lid::CMD_EFFECTS => {
                let mut b = vec![0u8; log_page::CMD_EFFECTS_LEN];
                log_page::encode_cmd_effects(
                    &[
                        admin_opc::GET_LOG_PAGE,
                        admin_opc::IDENTIFY,
                        admin_opc::ABORT,
                        admin_opc::SET_FEATURES,
                        admin_opc::GET_FEATURES,
                        admin_opc::ASYNC_EVENT_REQUEST,
                        admin_opc::KEEP_ALIVE,
                    ],
                    &[
                        (io_opc::FLUSH, false),
                        (io_opc::WRITE, true),
                        (io_opc::READ, false),
                        (io_opc::WRITE_ZEROES, true),
                        (io_opc::DATASET_MANAGEMENT, true),
                        (io_opc::RESV_REGISTER, false),
                        (io_opc::RESV_REPORT, false),
                        (io_opc::RESV_ACQUIRE, false),
                        (io_opc::RESV_RELEASE, false),
                    ],
                    &mut b,
                );
                b
            }
            nvme_wire::reservation::LID_RESERVATION_NOTIFICATION => {
                crate::resv_cmd::notification_log(ctrl, g.rae)
            }
            lid::ANA => {
                crate::ana::ana_log(&ctrl.namespaces(), g.lsp & log_page::ana::LSP_RGO != 0)
            }
            _ => return done(Status::cmd_specific(status::SC_INVALID_LOG_PAGE)),
        }
    };
    if g.offset >= page.len() as u64 && g.offset != 0 {
        return invalid_field();
    }
    copy_out(&page, g.offset as usize, out);
    ok_data()
}

fn set_features(cx: &AdminCtx<'_>, sqe: &Sqe) -> AdminOutcome {
    let fid = sqe.cdw10 as u8;
    if sqe.cdw10 & (1 << 31) != 0 {
        return done(Status::cmd_specific(status::SC_FEATURE_NOT_SAVEABLE));
    }
    let ctrl = cx.ctrl;
    let io = !ctrl.is_discovery();
    let t = &cx.target.transport;
    let v = sqe.cdw11;
    if io && let Some(r) = crate::resv_cmd::set_feature(ctrl, fid, sqe.nsid, v) {
        return done(r.err().unwrap_or(Status::SUCCESS));
    }
    let mut st = ctrl.state.lock();
    match fid {
        fid::NUM_QUEUES if io => {
            let nsqr = v & 0xFFFF;
            let ncqr = v >> 16;
            if nsqr == 0xFFFF || ncqr == 0xFFFF {
                return invalid_field();
            }
            let n = (nsqr.max(ncqr) + 1).min(u32::from(t.max_io_queues)) as u16;
            st.io_queues_granted = n;
            let v = u32::from(n - 1);
            ok_dw0(v | (v << 16))
        }
        fid::ASYNC_EVENT_CONFIG => {
            if v & !aec_supported(ctrl) != 0 {
                return invalid_field();
            }
            st.async_event_config = v;
            done(Status::SUCCESS)
        }
        fid::KATO => {
            st.kato_ms = v.min(t.kato_max_ms);
            drop(st);
            ctrl.touch();
            done(Status::SUCCESS)
        }
        fid::ARBITRATION if io => {
            // Round robin only (CAP.AMS 0): the burst is kept, weights are unused.
            st.features.arbitration = v & !0xF8;
            done(Status::SUCCESS)
        }
        fid::POWER_MGMT if io => {
            // NPSS is 0: power state 0 is the only one.
            if v & 0x1F != 0 {
                return invalid_field();
            }
            st.features.power_mgmt = v & 0xFF;
            done(Status::SUCCESS)
        }
        fid::TEMP_THRESHOLD if io => {
            let tmpth = v as u16;
            let tmpsel = (v >> 16) & 0xF;
            let thsel = (v >> 20) & 0x3;
            if !matches!(tmpsel, TMPSEL_COMPOSITE | TMPSEL_ALL) {
                return invalid_field();
            }
            match thsel {
                THSEL_OVER => st.features.over_temp_k = tmpth,
                THSEL_UNDER => st.features.under_temp_k = tmpth,
                _ => return invalid_field(),
            }
            done(Status::SUCCESS)
        }
        fid::ERROR_RECOVERY if io => {
            // DULBE needs deallocated-block errors (NSFEAT bit 2), which we do not have.
            if v & (1 << 16) != 0 {
                return invalid_field();
            }
            st.features.tler = v as u16;
            done(Status::SUCCESS)
        }
        // The cache cannot be turned off: every backend acknowledges writes
        // before they are durable, so WCE 0 is refused and WCE 1 is a no-op.
        fid::VOLATILE_WC if io => {
            if v & 1 == 0 {
                return invalid_field();
            }
            done(Status::SUCCESS)
        }
        fid::WRITE_ATOMICITY if io => {
            st.features.write_atomicity_dn = v & 1 != 0;
            done(Status::SUCCESS)
        }
        fid::IO_COMMAND_SET_PROFILE if io => {
            // Index 0 of the CNS 1Ch vector (NVM) is the only combination.
            if v & 0x1FF != 0 {
                return done(Status::cmd_specific(status::SC_IOCS_COMBINATION_REJECTED));
            }
            done(Status::SUCCESS)
        }
        _ => invalid_field(),
    }
}

/// Async Event Configuration bits the host may set: the SMART / Health
/// critical warnings (7:0) and the notices OAES advertises.
fn aec_supported(ctrl: &Controller) -> u32 {
    if ctrl.is_discovery() {
        identify::OAES_DISC_LOG_CHANGE
    } else {
        0xFF | identify::OAES_NS_ATTR | identify::OAES_ANA_CHANGE
    }
}

fn get_features(cx: &AdminCtx<'_>, sqe: &Sqe) -> AdminOutcome {
    let fid = sqe.cdw10 as u8;
    let select = ((sqe.cdw10 >> 8) & 0x7) as u8;
    let ctrl = cx.ctrl;
    let io = !ctrl.is_discovery();
    let max_q = cx.target.transport.max_io_queues;
    let queues = |n: u16| {
        let v = u32::from(n - 1);
        v | (v << 16)
    };
    let resv = io
        .then(|| crate::resv_cmd::get_feature(ctrl, fid, sqe.nsid))
        .flatten();
    let st = ctrl.state.lock();
    // (current, default, changeable) of each feature we support here.
    let (current, default, changeable) = match fid {
        _ if let Some(r) = resv => match r {
            Ok((v, changeable)) => (v, 0, changeable),
            Err(e) => return done(e),
        },
        fid::NUM_QUEUES if io => {
            let n = if st.io_queues_granted > 0 {
                st.io_queues_granted
            } else {
                max_q
            };
            (queues(n), queues(max_q), true)
        }
        fid::ASYNC_EVENT_CONFIG => (st.async_event_config, 0, true),
        fid::KATO => (st.kato_ms, st.connect_kato_ms, true),
        fid::ARBITRATION if io => (
            st.features.arbitration,
            crate::controller::FeatureValues::default().arbitration,
            true,
        ),
        fid::POWER_MGMT if io => (st.features.power_mgmt, 0, true),
        fid::TEMP_THRESHOLD if io => {
            let tmpsel = (sqe.cdw11 >> 16) & 0xF;
            let thsel = (sqe.cdw11 >> 20) & 0x3;
            if tmpsel != TMPSEL_COMPOSITE {
                return invalid_field();
            }
            let sel_bits = (tmpsel << 16) | (thsel << 20);
            let (cur, def) = match thsel {
                THSEL_OVER => (st.features.over_temp_k, DEFAULT_OVER_TEMP_K),
                THSEL_UNDER => (st.features.under_temp_k, 0),
                _ => return invalid_field(),
            };
            (u32::from(cur) | sel_bits, u32::from(def) | sel_bits, true)
        }
        fid::ERROR_RECOVERY if io => (u32::from(st.features.tler), 0, true),
        fid::VOLATILE_WC if io => (1, 1, false),
        fid::WRITE_ATOMICITY if io => (u32::from(st.features.write_atomicity_dn), 0, true),
        fid::IO_COMMAND_SET_PROFILE if io => (0, 0, false),
        _ => return invalid_field(),
    };
    match select {
        sel::CURRENT => ok_dw0(current),
        // Nothing is saveable, so "saved" reads the default, as the spec says.
        sel::DEFAULT | sel::SAVED => ok_dw0(default),
        sel::SUPPORTED_CAPABILITIES => {
            // Reservation features are set per namespace (bit 1).
            let ns_specific = if resv.is_some() { 1 << 1 } else { 0 };
            ok_dw0(if changeable { CAP_CHANGEABLE } else { 0 } | ns_specific)
        }
        _ => invalid_field(),
    }
}

fn async_event_request(cx: &AdminCtx<'_>) -> AdminOutcome {
    if cx.outstanding_aers >= AER_LIMIT {
        return done(Status::cmd_specific(status::SC_ASYNC_LIMIT));
    }
    match cx.ctrl.state.lock().pending_events.pop_front() {
        Some(ev) => ok_dw0(ev.0),
        None => AdminOutcome::HoldAer,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use nvme_wire::fabrics::{CNTLID_DYNAMIC, ConnectCmd, ConnectData, DISCOVERY_NQN, prop};
    use nvme_wire::identify::{cns, csi};
    use nvme_wire::sqe::Sqe;

    use super::*;
    use crate::config::TransportConfig;
    use crate::subsystem::{Namespace, Subsystem};

    const NQN: &str = "nqn.2026-01.io.flashpool:t";
    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:1";

    fn target() -> Target {
        let dev = Arc::new(blockdev::MemDevice::new(64 << 20, 512).unwrap());
        let ns = Namespace::new(1, dev, [1; 16], [2; 16]);
        let sub = Arc::new(Subsystem::new(
            NQN.into(),
            "SN".into(),
            "MODEL".into(),
            true,
            Vec::new(),
            vec![ns],
        ));
        Target::new(TransportConfig::default(), vec![sub])
    }

    fn connect_cmd() -> ConnectCmd {
        ConnectCmd {
            recfmt: 0,
            qid: 0,
            sqsize: 31,
            cattr: 0,
            kato_ms: 0,
        }
    }

    fn connect(t: &Target, subnqn: &str) -> Arc<Controller> {
        let data = ConnectData {
            hostid: [9; 16],
            cntlid: CNTLID_DYNAMIC,
            subnqn: subnqn.into(),
            hostnqn: HOST.into(),
        };
        let c = crate::fabrics::connect_admin(t, &connect_cmd(), &data).unwrap();
        let cc = prop::CC_EN | (6 << prop::CC_IOSQES_SHIFT) | (4 << prop::CC_IOCQES_SHIFT);
        c.property_set(prop::CC, false, u64::from(cc | (6 << prop::CC_CSS_SHIFT)))
            .unwrap();
        assert!(c.enabled());
        c
    }

    fn run(t: &Target, c: &Controller, sqe: &Sqe, out: &mut [u8]) -> (Status, u32) {
        let cx = AdminCtx {
            target: t,
            ctrl: c,
            outstanding_aers: 0,
            local_ip: None,
        };
        match execute(&cx, sqe, out) {
            AdminOutcome::Complete { status, dw0, .. } => (status, dw0),
            AdminOutcome::HoldAer => panic!("held"),
        }
    }

    fn identify_sqe(cns: u8, nsid: u32, csi: u8) -> Sqe {
        let mut s = Sqe::new(admin_opc::IDENTIFY, 1);
        s.cdw10 = u32::from(cns);
        s.cdw11 = u32::from(csi) << 24;
        s.nsid = nsid;
        s
    }

    fn identify(t: &Target, c: &Controller, cns: u8, nsid: u32, csi: u8) -> (Status, Vec<u8>) {
        let mut out = vec![0xEEu8; IDENTIFY_LEN];
        let (st, _) = run(t, c, &identify_sqe(cns, nsid, csi), &mut out);
        (st, out)
    }

    fn le16(b: &[u8], o: usize) -> u16 {
        u16::from_le_bytes([b[o], b[o + 1]])
    }
    fn le32(b: &[u8], o: usize) -> u32 {
        u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
    }
    fn le64(b: &[u8], o: usize) -> u64 {
        u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
    }

    const INVALID_FIELD: Status = Status::generic(status::SC_INVALID_FIELD);
    const INVALID_NS: Status = Status::generic(status::SC_INVALID_NS);

    #[test]
    fn identify_controller_is_consistent() {
        let t = target();
        let c = connect(&t, NQN);
        let (st, b) = identify(&t, &c, cns::CONTROLLER, 0, 0);
        assert_eq!(st, Status::SUCCESS);
        assert_eq!(le16(&b, 0), 0, "VID");
        assert_eq!(le32(&b, 80), prop::VS_1_4, "VER");
        assert_eq!(le16(&b, 256), 0, "OACS");
        assert_eq!(b[263], 0, "NPSS");
        assert_eq!(le16(&b, 266), 343, "WCTEMP");
        let oncs = le16(&b, 520);
        assert_eq!(
            oncs & identify::ONCS_SAVE_SELECT,
            identify::ONCS_SAVE_SELECT
        );
        assert_ne!(oncs & (1 << 5), 0, "reservations");
        assert_eq!(le16(&b, 522), 0, "FUSES");
        assert_eq!(b[525], 0b101, "VWC: present, no broadcast flush");
        assert_eq!(b[76] & identify::CMIC_ANA, identify::CMIC_ANA);

        let d = connect(&t, DISCOVERY_NQN);
        let (st, b) = identify(&t, &d, cns::CONTROLLER, 0, 0);
        assert_eq!(st, Status::SUCCESS);
        assert_eq!(b[111], identify::CNTRLTYPE_DISCOVERY);
        assert_eq!(le32(&b, 80), prop::VS_1_4);
    }

    #[test]
    fn identify_namespace_reports_thin_usage() {
        let t = target();
        let c = connect(&t, NQN);
        let (st, b) = identify(&t, &c, cns::NAMESPACE, 1, 0);
        assert_eq!(st, Status::SUCCESS);
        assert_eq!(le64(&b, 0), (64 << 20) / 512, "NSZE");
        assert_eq!(le64(&b, 8), le64(&b, 0), "NCAP");
        assert_eq!(le64(&b, 16), 0, "NUSE: nothing written yet");
        assert_eq!(b[24] & identify::NSFEAT_THIN, identify::NSFEAT_THIN);
        // A null device is fully provisioned.
        let null = Arc::new(blockdev::NullDevice::new(1 << 20, 512).unwrap());
        t.add_namespace(NQN, Namespace::new(2, null, [3; 16], [4; 16]))
            .unwrap();
        let (_, b) = identify(&t, &c, cns::NAMESPACE, 2, 0);
        assert_eq!(le64(&b, 16), le64(&b, 0));
        assert_eq!(b[24] & identify::NSFEAT_THIN, 0);
    }

    #[test]
    fn identify_command_set_structures() {
        let t = target();
        let c = connect(&t, NQN);
        // CNS 05h: NVM-specific namespace, all zero for us.
        let (st, b) = identify(&t, &c, cns::CS_NAMESPACE, 1, csi::NVM);
        assert_eq!(st, Status::SUCCESS);
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(identify(&t, &c, cns::CS_NAMESPACE, 1, 1).0, INVALID_FIELD);
        assert_eq!(identify(&t, &c, cns::CS_NAMESPACE, 1, 2).0, INVALID_FIELD);
        // CNS 06h: NVM-specific controller, no limits.
        let (st, b) = identify(&t, &c, cns::CS_CONTROLLER, 0, csi::NVM);
        assert_eq!(st, Status::SUCCESS);
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(identify(&t, &c, cns::CS_CONTROLLER, 0, 2).0, INVALID_FIELD);
        // CNS 08h: command set independent namespace.
        let (st, b) = identify(&t, &c, cns::CS_INDEP_NAMESPACE, 1, 0);
        assert_eq!(st, Status::SUCCESS);
        assert_eq!(b[0], identify::NSFEAT_THIN);
        assert_eq!(b[1], identify::NMIC_SHARED);
        assert_eq!(le32(&b, 4), crate::ana::DEFAULT_GROUP);
        assert_eq!(b[14], identify::NSTAT_READY);
        // CNS 1Ch: one combination, NVM only.
        let (st, b) = identify(&t, &c, cns::IO_COMMAND_SETS, 0, 0);
        assert_eq!(st, Status::SUCCESS);
        assert_eq!(le64(&b, 0), 1);
        assert!(b[8..].iter().all(|&x| x == 0));
        // CNS 03h carries the CSI descriptor (type 4, length 1, NVM).
        let (st, b) = identify(&t, &c, cns::NS_ID_DESCRIPTORS, 1, 0);
        assert_eq!(st, Status::SUCCESS);
        let mut off = 0;
        let mut found = false;
        while b[off] != 0 {
            let len = usize::from(b[off + 1]);
            if b[off] == identify::nidt::CSI {
                assert_eq!((len, b[off + 4]), (1, csi::NVM));
                found = true;
            }
            off += 4 + len;
        }
        assert!(found);
    }

    #[test]
    fn identify_namespace_ids_edge_cases() {
        let t = target();
        let c = connect(&t, NQN);
        for cns in [cns::NAMESPACE, cns::CS_NAMESPACE, cns::CS_INDEP_NAMESPACE] {
            for nsid in [0, u32::MAX, MAX_NSID + 1] {
                assert_eq!(
                    identify(&t, &c, cns, nsid, 0).0,
                    INVALID_NS,
                    "cns {cns} nsid {nsid:#x}"
                );
            }
            // Inactive but in range: zero-filled.
            let (st, b) = identify(&t, &c, cns, 5, 0);
            assert_eq!(st, Status::SUCCESS, "cns {cns}");
            assert!(b.iter().all(|&x| x == 0), "cns {cns}");
        }
        // The discovery controller answers CNS 01h only.
        let d = connect(&t, DISCOVERY_NQN);
        for cns in [
            cns::NAMESPACE,
            cns::CS_NAMESPACE,
            cns::CS_CONTROLLER,
            cns::CS_INDEP_NAMESPACE,
            cns::IO_COMMAND_SETS,
        ] {
            assert_eq!(identify(&t, &d, cns, 1, 0).0, INVALID_FIELD, "cns {cns}");
        }
    }

    fn set_feat(t: &Target, c: &Controller, fid: u8, cdw11: u32) -> (Status, u32) {
        let mut s = Sqe::new(admin_opc::SET_FEATURES, 2);
        s.cdw10 = u32::from(fid);
        s.cdw11 = cdw11;
        run(t, c, &s, &mut [])
    }

    fn get_feat(t: &Target, c: &Controller, fid: u8, sel: u8, cdw11: u32) -> (Status, u32) {
        let mut s = Sqe::new(admin_opc::GET_FEATURES, 3);
        s.cdw10 = u32::from(fid) | (u32::from(sel) << 8);
        s.cdw11 = cdw11;
        run(t, c, &s, &mut [])
    }

    fn ok(v: u32) -> (Status, u32) {
        (Status::SUCCESS, v)
    }

    #[test]
    fn arbitration_and_power_management() {
        let t = target();
        let c = connect(&t, NQN);
        assert_eq!(get_feat(&t, &c, fid::ARBITRATION, sel::CURRENT, 0), ok(7));
        assert_eq!(
            set_feat(&t, &c, fid::ARBITRATION, 0x0302_01FA).0,
            Status::SUCCESS
        );
        assert_eq!(
            get_feat(&t, &c, fid::ARBITRATION, sel::CURRENT, 0),
            ok(0x0302_0102)
        );
        assert_eq!(get_feat(&t, &c, fid::ARBITRATION, sel::DEFAULT, 0), ok(7));

        assert_eq!(get_feat(&t, &c, fid::POWER_MGMT, sel::CURRENT, 0), ok(0));
        assert_eq!(set_feat(&t, &c, fid::POWER_MGMT, 1).0, INVALID_FIELD);
        assert_eq!(set_feat(&t, &c, fid::POWER_MGMT, 0x1F).0, INVALID_FIELD);
        assert_eq!(set_feat(&t, &c, fid::POWER_MGMT, 0).0, Status::SUCCESS);
        assert_eq!(get_feat(&t, &c, fid::POWER_MGMT, sel::CURRENT, 0), ok(0));
    }

    #[test]
    fn temperature_thresholds() {
        let t = target();
        let c = connect(&t, NQN);
        let under = 1 << 20;
        assert_eq!(
            get_feat(&t, &c, fid::TEMP_THRESHOLD, sel::CURRENT, 0),
            ok(343)
        );
        assert_eq!(
            get_feat(&t, &c, fid::TEMP_THRESHOLD, sel::CURRENT, under),
            ok(under)
        );
        assert_eq!(
            set_feat(&t, &c, fid::TEMP_THRESHOLD, 350).0,
            Status::SUCCESS
        );
        assert_eq!(
            set_feat(&t, &c, fid::TEMP_THRESHOLD, under | 260).0,
            Status::SUCCESS
        );
        assert_eq!(
            get_feat(&t, &c, fid::TEMP_THRESHOLD, sel::CURRENT, 0),
            ok(350)
        );
        assert_eq!(
            get_feat(&t, &c, fid::TEMP_THRESHOLD, sel::CURRENT, under),
            ok(under | 260)
        );
        assert_eq!(
            get_feat(&t, &c, fid::TEMP_THRESHOLD, sel::DEFAULT, 0),
            ok(343)
        );
        assert_eq!(
            get_feat(&t, &c, fid::TEMP_THRESHOLD, sel::SAVED, under),
            ok(under)
        );
        // All sensors (Fh) sets the composite; sensor 1 does not exist; THSEL 10b is reserved.
        assert_eq!(
            set_feat(&t, &c, fid::TEMP_THRESHOLD, (0xF << 16) | 351).0,
            Status::SUCCESS
        );
        assert_eq!(
            get_feat(&t, &c, fid::TEMP_THRESHOLD, sel::CURRENT, 0),
            ok(351)
        );
        assert_eq!(
            set_feat(&t, &c, fid::TEMP_THRESHOLD, (1 << 16) | 300).0,
            INVALID_FIELD
        );
        assert_eq!(
            set_feat(&t, &c, fid::TEMP_THRESHOLD, (2 << 20) | 300).0,
            INVALID_FIELD
        );
        assert_eq!(
            get_feat(&t, &c, fid::TEMP_THRESHOLD, sel::CURRENT, 1 << 16).0,
            INVALID_FIELD
        );
    }

    #[test]
    fn error_recovery_wc_atomicity() {
        let t = target();
        let c = connect(&t, NQN);
        assert_eq!(set_feat(&t, &c, fid::ERROR_RECOVERY, 25).0, Status::SUCCESS);
        assert_eq!(
            get_feat(&t, &c, fid::ERROR_RECOVERY, sel::CURRENT, 0),
            ok(25)
        );
        assert_eq!(
            set_feat(&t, &c, fid::ERROR_RECOVERY, 1 << 16).0,
            INVALID_FIELD,
            "DULBE"
        );
        assert_eq!(
            get_feat(&t, &c, fid::ERROR_RECOVERY, sel::CURRENT, 0),
            ok(25)
        );
        assert_eq!(
            get_feat(&t, &c, fid::ERROR_RECOVERY, sel::DEFAULT, 0),
            ok(0)
        );

        assert_eq!(get_feat(&t, &c, fid::VOLATILE_WC, sel::CURRENT, 0), ok(1));
        assert_eq!(set_feat(&t, &c, fid::VOLATILE_WC, 1).0, Status::SUCCESS);
        assert_eq!(set_feat(&t, &c, fid::VOLATILE_WC, 0).0, INVALID_FIELD);
        assert_eq!(
            get_feat(&t, &c, fid::VOLATILE_WC, sel::SUPPORTED_CAPABILITIES, 0),
            ok(0)
        );

        assert_eq!(
            get_feat(&t, &c, fid::WRITE_ATOMICITY, sel::CURRENT, 0),
            ok(0)
        );
        assert_eq!(set_feat(&t, &c, fid::WRITE_ATOMICITY, 1).0, Status::SUCCESS);
        assert_eq!(
            get_feat(&t, &c, fid::WRITE_ATOMICITY, sel::CURRENT, 0),
            ok(1)
        );
        assert_eq!(
            get_feat(&t, &c, fid::WRITE_ATOMICITY, sel::SUPPORTED_CAPABILITIES, 0),
            ok(CAP_CHANGEABLE)
        );
    }

    #[test]
    fn queues_aec_kato_profile_and_interrupts() {
        let t = target();
        let c = connect(&t, NQN);
        assert_eq!(
            get_feat(&t, &c, fid::NUM_QUEUES, sel::CURRENT, 0),
            ok(0x0007_0007)
        );
        assert_eq!(
            set_feat(&t, &c, fid::NUM_QUEUES, 0x0001_0001),
            ok(0x0001_0001)
        );
        assert_eq!(
            get_feat(&t, &c, fid::NUM_QUEUES, sel::CURRENT, 0),
            ok(0x0001_0001)
        );
        assert_eq!(
            get_feat(&t, &c, fid::NUM_QUEUES, sel::DEFAULT, 0),
            ok(0x0007_0007)
        );

        let aec = identify::OAES_NS_ATTR | identify::OAES_ANA_CHANGE | 0x1F;
        assert_eq!(
            set_feat(&t, &c, fid::ASYNC_EVENT_CONFIG, aec).0,
            Status::SUCCESS
        );
        assert_eq!(
            get_feat(&t, &c, fid::ASYNC_EVENT_CONFIG, sel::CURRENT, 0),
            ok(aec)
        );
        assert_eq!(
            set_feat(&t, &c, fid::ASYNC_EVENT_CONFIG, 1 << 9).0,
            INVALID_FIELD
        );
        assert_eq!(
            get_feat(&t, &c, fid::ASYNC_EVENT_CONFIG, sel::DEFAULT, 0),
            ok(0)
        );

        assert_eq!(set_feat(&t, &c, fid::KATO, 5000).0, Status::SUCCESS);
        assert_eq!(get_feat(&t, &c, fid::KATO, sel::CURRENT, 0), ok(5000));
        assert_eq!(get_feat(&t, &c, fid::KATO, sel::DEFAULT, 0), ok(0));

        assert_eq!(
            get_feat(&t, &c, fid::IO_COMMAND_SET_PROFILE, sel::CURRENT, 0),
            ok(0)
        );
        assert_eq!(
            set_feat(&t, &c, fid::IO_COMMAND_SET_PROFILE, 0).0,
            Status::SUCCESS
        );
        assert_eq!(
            set_feat(&t, &c, fid::IO_COMMAND_SET_PROFILE, 1).0,
            Status::cmd_specific(status::SC_IOCS_COMBINATION_REJECTED)
        );

        for f in [fid::IRQ_COALESCE, fid::IRQ_CONFIG] {
            assert_eq!(set_feat(&t, &c, f, 0).0, INVALID_FIELD);
            assert_eq!(get_feat(&t, &c, f, sel::CURRENT, 0).0, INVALID_FIELD);
        }
        // Reserved SEL values; nothing is saveable.
        assert_eq!(get_feat(&t, &c, fid::KATO, 4, 0).0, INVALID_FIELD);
        assert_eq!(get_feat(&t, &c, fid::KATO, 7, 0).0, INVALID_FIELD);
        let mut s = Sqe::new(admin_opc::SET_FEATURES, 2);
        s.cdw10 = u32::from(fid::KATO) | (1 << 31);
        assert_eq!(
            run(&t, &c, &s, &mut []).0,
            Status::cmd_specific(status::SC_FEATURE_NOT_SAVEABLE)
        );

        // Discovery controllers: AEC (discovery log change only) and KATO.
        let d = connect(&t, DISCOVERY_NQN);
        assert_eq!(
            set_feat(
                &t,
                &d,
                fid::ASYNC_EVENT_CONFIG,
                identify::OAES_DISC_LOG_CHANGE
            )
            .0,
            Status::SUCCESS
        );
        assert_eq!(
            set_feat(&t, &d, fid::ASYNC_EVENT_CONFIG, identify::OAES_NS_ATTR).0,
            INVALID_FIELD
        );
        for f in [
            fid::ARBITRATION,
            fid::POWER_MGMT,
            fid::TEMP_THRESHOLD,
            fid::NUM_QUEUES,
        ] {
            assert_eq!(get_feat(&t, &d, f, sel::CURRENT, 0).0, INVALID_FIELD);
        }
    }

    fn connect_data(hostnqn: &str, hostid: [u8; 16]) -> Vec<u8> {
        let mut b = ConnectData {
            hostid,
            cntlid: CNTLID_DYNAMIC,
            subnqn: NQN.into(),
            hostnqn: "x".into(),
        }
        .encode();
        b[512..768].fill(0);
        b[512..512 + hostnqn.len()].copy_from_slice(hostnqn.as_bytes());
        b.to_vec()
    }

    #[test]
    fn connect_host_nqn_and_host_id() {
        let t = target();
        let cmd = connect_cmd();
        // An empty host NQN is not an NQN: refused, even on an allow-any-host subsystem.
        let e = crate::fabrics::connect(&t, &cmd, &connect_data("", [1; 16]), "peer:1")
            .err()
            .expect("refused");
        assert_eq!(
            e.status,
            Status::cmd_specific(status::SC_CONNECT_INVALID_PARAM)
        );
        assert_eq!(
            e.dw0,
            crate::fabrics::ipo_iattr(true, nvme_wire::fabrics::CONNECT_DATA_OFF_HOSTNQN)
        );
        // A zero host identifier is accepted, as Linux nvmet does.
        let c = crate::fabrics::connect(&t, &cmd, &connect_data(HOST, [0; 16]), "peer:1").unwrap();
        assert_eq!(c.hostid, [0; 16]);
    }
}

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

#[derive(Debug, PartialEq, Eq)]
pub enum AdminOutcome {
    /// Completed: status, dword 0, and whether `out` holds data for the host.
    Complete {
        status: Status,
        dw0: u32,
        data: bool,
    },
    /// An Async Event Request to hold until an event occurs.
    HoldAer,
    /// Completes with this future's status (a reservation record stored
    /// off the reactor); no data.
    Storing(Storing),
}

/// A command's record store under way (see [`AdminOutcome::Storing`]).
pub struct Storing(
    pub std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Status>> + Send>>,
);

impl std::fmt::Debug for Storing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Storing(..)")
    }
}

/// The same store only (for tests' comparisons of outcomes).
impl PartialEq for Storing {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(&*self.0, &*other.0)
    }
}

impl Eq for Storing {}

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
                    cx.target.ana.anatt(),
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
                    write_protected: ns.dev.read_only(),
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
                        write_protected: ns.dev.read_only(),
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
                if !g.rae {
                    ctrl.unmask_notice(identify::OAES_DISC_LOG_CHANGE);
                }
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
                if !g.rae {
                    ctrl.unmask_notice(identify::OAES_ANA_CHANGE);
                }
                let rgo = g.lsp & log_page::ana::LSP_RGO != 0;
                let members: Vec<(u32, u32)> = ctrl
                    .namespaces()
                    .iter()
                    .map(|n| (n.nsid, n.ana_group))
                    .collect();
                cx.target.ana.log(&members, rgo)
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
        return match r {
            Ok(crate::resv_cmd::FeatureSet::Done) => done(Status::SUCCESS),
            Ok(crate::resv_cmd::FeatureSet::Storing(f)) => AdminOutcome::Storing(Storing(f)),
            Err(st) => done(st),
        };
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
#[path = "admin_tests.rs"]
mod tests;

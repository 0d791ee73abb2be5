//! Admin commands: Identify, Get Log Page, Set/Get Features, Async Event
//! Request, Keep Alive, Abort. Discovery controllers accept a subset.

use nvme_wire::identify::{self, ControllerInfo, IDENTIFY_LEN, NamespaceInfo};
use nvme_wire::log_page::{self, GetLogPage, SmartLog, lid};
use nvme_wire::sqe::{Sqe, admin_opc, io_opc};
use nvme_wire::status::{self, Status};

use crate::Target;
use crate::controller::{AER_LIMIT, Controller, ERROR_LOG_SLOTS};
use crate::subsystem::MAX_NSID;

pub mod fid {
    pub const TEMP_THRESHOLD: u8 = 0x04;
    pub const VOLATILE_WC: u8 = 0x06;
    pub const NUM_QUEUES: u8 = 0x07;
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0B;
    pub const KATO: u8 = 0x0F;
}

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
                version: nvme_wire::fabrics::prop::VS_1_3,
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
                    identify::ONCS_DSM | identify::ONCS_WRITE_ZEROES
                } else {
                    0
                },
                vwc: u8::from(io),
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
                NamespaceInfo {
                    nsze: ns.num_blocks,
                    lba_shift: ns.lba_shift,
                    dealloc_reads_zeroes: ns.dev.deallocate_reads_zeroes(),
                    shared: true,
                    anagrpid: ns.ana_group,
                    nguid: ns.nguid,
                    eui64: [0; 8],
                    npwg: opt_blocks,
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
                    ],
                    &mut b,
                );
                b
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
    let t = &cx.target.transport;
    let mut st = ctrl.state.lock();
    match fid {
        fid::NUM_QUEUES if !ctrl.is_discovery() => {
            let nsqr = sqe.cdw11 & 0xFFFF;
            let ncqr = sqe.cdw11 >> 16;
            if nsqr == 0xFFFF || ncqr == 0xFFFF {
                return invalid_field();
            }
            let n = (nsqr.max(ncqr) + 1).min(u32::from(t.max_io_queues)) as u16;
            st.io_queues_granted = n;
            let v = u32::from(n - 1);
            ok_dw0(v | (v << 16))
        }
        fid::ASYNC_EVENT_CONFIG => {
            st.async_event_config = sqe.cdw11;
            done(Status::SUCCESS)
        }
        fid::KATO => {
            st.kato_ms = sqe.cdw11.min(t.kato_max_ms);
            drop(st);
            ctrl.touch();
            done(Status::SUCCESS)
        }
        // The write cache is always on and thresholds are informational: accept and keep.
        fid::VOLATILE_WC | fid::TEMP_THRESHOLD if !ctrl.is_discovery() => done(Status::SUCCESS),
        _ => invalid_field(),
    }
}

fn get_features(cx: &AdminCtx<'_>, sqe: &Sqe) -> AdminOutcome {
    let fid = sqe.cdw10 as u8;
    let ctrl = cx.ctrl;
    let st = ctrl.state.lock();
    match fid {
        fid::NUM_QUEUES if !ctrl.is_discovery() => {
            let n = if st.io_queues_granted > 0 {
                st.io_queues_granted
            } else {
                cx.target.transport.max_io_queues
            };
            let v = u32::from(n - 1);
            ok_dw0(v | (v << 16))
        }
        fid::ASYNC_EVENT_CONFIG => ok_dw0(st.async_event_config),
        fid::KATO => ok_dw0(st.kato_ms),
        fid::VOLATILE_WC if !ctrl.is_discovery() => ok_dw0(1),
        fid::TEMP_THRESHOLD if !ctrl.is_discovery() => ok_dw0(273 + 70),
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

//! The command core driven without sockets: a recording transport stands in
//! for TCP. Connect sequencing, CC/CSTS, admin and I/O commands, data
//! fetching, AERs, and a property test over random command sequences.

use std::collections::HashMap;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use blockdev::{AlignedBuf, IoFuture, MemDevice};
use nvme_wire::cqe::Cqe;
use nvme_wire::fabrics::{ConnectCmd, ConnectData, PropertyCmd, fctype, prop};
use nvme_wire::sqe::{SGL_DATA_BLOCK_OFFSET, SglDesc, Sqe, admin_opc, io_opc};
use nvme_wire::status;
use proptest::prelude::*;

use super::{QueueCore, Transport};
use crate::Target;
use crate::config::TransportConfig;
use crate::controller::{AsyncEvent, FreeReason};
use crate::subsystem::{Namespace, Subsystem};

pub(crate) const NQN: &str = "nqn.2026-01.io.flashpool:core";
pub(crate) const HOST: &str =
    "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
pub(crate) const CC_ENABLE: u64 = 1 | (6 << 16) | (4 << 20);
const BLOCK: u32 = 512;

#[derive(Debug)]
pub(crate) enum Ev {
    Resp(Cqe),
    Data {
        cid: u16,
        bytes: Vec<u8>,
        success: bool,
    },
    NeedData {
        tag: u16,
        cid: u16,
        len: usize,
    },
    Disconnect,
}

/// A transport that records what the core asks of it.
#[derive(Default)]
pub(crate) struct Rec {
    pub ev: Vec<Ev>,
    pub waiting: Vec<(u16, IoFuture)>,
    pub bufs: HashMap<u16, AlignedBuf>,
}

impl Transport for Rec {
    fn respond(&mut self, cqe: Cqe) {
        self.ev.push(Ev::Resp(cqe));
    }
    fn send_data(&mut self, cid: u16, buf: AlignedBuf, len: usize, success: bool) {
        self.ev.push(Ev::Data {
            cid,
            bytes: buf[..len].to_vec(),
            success,
        });
    }
    fn request_data(&mut self, tag: u16, cid: u16, buf: AlignedBuf) {
        self.ev.push(Ev::NeedData {
            tag,
            cid,
            len: buf.len(),
        });
        self.bufs.insert(tag, buf);
    }
    fn wait_io(&mut self, tag: u16, fut: IoFuture) {
        self.waiting.push((tag, fut));
    }
    fn disconnect(&mut self) {
        self.ev.push(Ev::Disconnect);
    }
}

impl Rec {
    /// The completions recorded since the last call.
    pub fn take_resps(&mut self) -> Vec<Cqe> {
        std::mem::take(&mut self.ev)
            .into_iter()
            .filter_map(|e| match e {
                Ev::Resp(c) => Some(c),
                _ => None,
            })
            .collect()
    }

    /// The one completion recorded since the last call.
    pub fn one(&mut self) -> Cqe {
        let r = self.take_resps();
        assert_eq!(r.len(), 1, "expected one completion, got {r:?}");
        r[0]
    }
}

/// Polls every device I/O the core handed out until all are done.
pub(crate) fn drain(core: &mut QueueCore, rec: &mut Rec) {
    let mut cx = Context::from_waker(Waker::noop());
    for n in 0..5000 {
        if rec.waiting.is_empty() {
            return;
        }
        if n > 0 {
            // A file device completes on its own thread.
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let mut still = Vec::new();
        for (tag, mut fut) in std::mem::take(&mut rec.waiting) {
            match std::pin::Pin::new(&mut fut).poll(&mut cx) {
                Poll::Ready(done) => core.on_io_done(tag, done, rec),
                Poll::Pending => still.push((tag, fut)),
            }
        }
        rec.waiting.extend(still);
    }
    panic!("device I/O never completed");
}

pub(crate) fn target_with(sub: Subsystem) -> Arc<Target> {
    let t = TransportConfig {
        max_queue_depth: 32,
        max_io_queues: 4,
        max_transfer: 64 * 1024,
        ..TransportConfig::default()
    };
    Arc::new(Target::new(t, vec![Arc::new(sub)]))
}

pub(crate) fn target() -> Arc<Target> {
    let dev = Arc::new(MemDevice::new(1 << 20, BLOCK).unwrap());
    target_with(Subsystem::new(
        NQN.into(),
        "CORE0001".into(),
        "flashpool core test".into(),
        true,
        Vec::new(),
        vec![Namespace::new(1, dev, [1; 16], [2; 16])],
    ))
}

pub(crate) fn in_capsule(mut s: Sqe, len: usize) -> Sqe {
    s.sgl = SglDesc {
        addr: 0,
        length: len as u32,
        type_byte: SGL_DATA_BLOCK_OFFSET,
    };
    s
}

pub(crate) fn xfer(mut s: Sqe, len: u32) -> Sqe {
    s.sgl.length = len;
    s
}

pub(crate) fn connect_sqe(cid: u16, qid: u16) -> Sqe {
    let s = ConnectCmd {
        recfmt: 0,
        qid,
        sqsize: 31,
        cattr: 0,
        kato_ms: 0,
    }
    .to_sqe(cid);
    in_capsule(s, 1024)
}

pub(crate) fn connect_data(
    cntlid: u16,
    subnqn: &str,
    hostnqn: &str,
    hostid: [u8; 16],
) -> [u8; 1024] {
    ConnectData {
        hostid,
        cntlid,
        subnqn: subnqn.into(),
        hostnqn: hostnqn.into(),
    }
    .encode()
}

pub(crate) fn prop_set(cid: u16, offset: u32, value: u64) -> Sqe {
    PropertyCmd {
        size8: false,
        offset,
        value,
    }
    .to_sqe(fctype::PROPERTY_SET, cid)
}

pub(crate) fn prop_get(cid: u16, offset: u32, size8: bool) -> Sqe {
    PropertyCmd {
        size8,
        offset,
        value: 0,
    }
    .to_sqe(fctype::PROPERTY_GET, cid)
}

/// An admin queue connected and enabled for `hostid`; returns the controller ID.
pub(crate) fn admin_queue(t: &Arc<Target>, hostid: [u8; 16]) -> (QueueCore, Rec, u16) {
    let mut core = QueueCore::new(t.clone(), "test".into(), None);
    let mut rec = Rec::default();
    let d = connect_data(0xFFFF, NQN, HOST, hostid);
    core.on_command(&connect_sqe(1, 0), &d, true, &mut rec);
    let c = rec.one();
    assert!(c.status.is_success(), "{c:?}");
    let cntlid = c.dw0 as u16;
    core.on_command(&prop_set(2, prop::CC, CC_ENABLE), &[], true, &mut rec);
    assert!(rec.one().status.is_success());
    (core, rec, cntlid)
}

/// I/O queue 1 of controller `cntlid`.
pub(crate) fn io_queue(t: &Arc<Target>, cntlid: u16, hostid: [u8; 16]) -> (QueueCore, Rec) {
    let mut core = QueueCore::new(t.clone(), "test".into(), None);
    let mut rec = Rec::default();
    let d = connect_data(cntlid, NQN, HOST, hostid);
    core.on_command(&connect_sqe(1, 1), &d, true, &mut rec);
    let c = rec.one();
    assert!(c.status.is_success(), "{c:?}");
    (core, rec)
}

fn rw(opc: u8, cid: u16, slba: u64, nlb: u32) -> Sqe {
    let mut s = Sqe::new(opc, cid);
    s.nsid = 1;
    s.cdw10 = slba as u32;
    s.cdw11 = (slba >> 32) as u32;
    s.cdw12 = nlb - 1;
    s
}

pub(crate) fn fabrics_sqe(fctype: u8, cid: u16) -> Sqe {
    let mut s = Sqe::new(nvme_wire::sqe::FABRICS_OPCODE, cid);
    s.nsid = u32::from(fctype);
    s
}

fn sc(c: &Cqe) -> (u8, u8) {
    (c.status.sct, c.status.sc)
}

const GENERIC: u8 = status::SCT_GENERIC;

#[test]
fn commands_before_connect_are_sequence_errors() {
    let t = target();
    let mut core = QueueCore::new(t.clone(), "test".into(), None);
    let mut rec = Rec::default();
    core.on_command(
        &xfer(Sqe::new(admin_opc::IDENTIFY, 5), 4096),
        &[],
        true,
        &mut rec,
    );
    assert_eq!(sc(&rec.one()), (GENERIC, status::SC_CMD_SEQ_ERROR));
    core.on_command(&prop_get(6, prop::CAP, true), &[], true, &mut rec);
    assert_eq!(sc(&rec.one()), (GENERIC, status::SC_CMD_SEQ_ERROR));
    let disc = fabrics_sqe(fctype::DISCONNECT, 7);
    core.on_command(&disc, &[], true, &mut rec);
    assert_eq!(sc(&rec.one()), (GENERIC, status::SC_CMD_SEQ_ERROR));
    assert_eq!(t.controller_count(), 0);
}

#[test]
fn connect_then_second_connect_is_a_sequence_error() {
    let t = target();
    let (mut core, mut rec, cntlid) = admin_queue(&t, [7; 16]);
    assert!(cntlid >= 1);
    assert_eq!(core.qid(), Some(0));
    let d = connect_data(0xFFFF, NQN, HOST, [7; 16]);
    core.on_command(&connect_sqe(9, 0), &d, true, &mut rec);
    let c = rec.one();
    assert_eq!(sc(&c), (GENERIC, status::SC_CMD_SEQ_ERROR));
    assert_eq!(c.cid, 9);
    core.close(FreeReason::ConnectionClosed);
    assert_eq!(t.controller_count(), 0);
}

#[test]
fn connect_data_by_r2t_arrives_through_on_data() {
    let t = target();
    let mut core = QueueCore::new(t.clone(), "test".into(), None);
    let mut rec = Rec::default();
    let mut s = connect_sqe(3, 0);
    s.sgl = SglDesc {
        addr: 0,
        length: 1024,
        type_byte: nvme_wire::sqe::SGL_TRANSPORT_DATA_BLOCK,
    };
    core.on_command(&s, &[], true, &mut rec);
    let Some(Ev::NeedData {
        tag,
        cid: 3,
        len: 1024,
    }) = rec.ev.pop()
    else {
        panic!("expected a data request: {:?}", rec.ev);
    };
    // A second Connect while the first waits for its data.
    core.on_command(&connect_sqe(4, 0), &[0; 1024], true, &mut rec);
    assert_eq!(sc(&rec.one()), (GENERIC, status::SC_CMD_SEQ_ERROR));
    let mut buf = rec.bufs.remove(&tag).unwrap();
    buf.copy_from_slice(&connect_data(0xFFFF, NQN, HOST, [1; 16]));
    core.on_data(tag, buf, true, &mut rec);
    let c = rec.one();
    assert!(c.status.is_success());
    assert_eq!(c.cid, 3);
    assert!(core.controller().is_some());
}

#[test]
fn bad_data_digest_is_a_retryable_transient_error() {
    let t = target();
    let (mut core, mut rec, _) = admin_queue(&t, [1; 16]);
    core.on_command(
        &in_capsule(Sqe::new(admin_opc::KEEP_ALIVE, 8), 4),
        &[0; 4],
        false,
        &mut rec,
    );
    let c = rec.one();
    assert_eq!(sc(&c), (GENERIC, super::SC_TRANSIENT_TRANSPORT));
    assert!(!c.status.dnr);
    let digest_errors = |core: &QueueCore| {
        use std::sync::atomic::Ordering::Relaxed;
        let b = core.bound.as_ref().unwrap();
        (
            t.counters.data_digest_errors.load(Relaxed),
            b.stats.digest_errors.load(Relaxed),
        )
    };
    assert_eq!(digest_errors(&core), (1, 1));
}

#[test]
fn cc_enable_reset_and_shutdown_through_the_core() {
    let t = target();
    let mut core = QueueCore::new(t.clone(), "test".into(), None);
    let mut rec = Rec::default();
    core.on_command(
        &connect_sqe(1, 0),
        &connect_data(0xFFFF, NQN, HOST, [1; 16]),
        true,
        &mut rec,
    );
    rec.one();
    // Admin commands need CC.EN first.
    core.on_command(&Sqe::new(admin_opc::KEEP_ALIVE, 2), &[], true, &mut rec);
    assert_eq!(sc(&rec.one()), (GENERIC, status::SC_CMD_SEQ_ERROR));
    core.on_command(&prop_get(3, prop::CAP, true), &[], true, &mut rec);
    let cap = rec.one();
    assert!(cap.status.is_success());
    assert_eq!(cap.dw0 & 0xFFFF, 31, "MQES");
    core.on_command(&prop_set(4, prop::CC, CC_ENABLE), &[], true, &mut rec);
    rec.one();
    core.on_command(&prop_get(5, prop::CSTS, false), &[], true, &mut rec);
    assert_eq!(rec.one().dw0 & 1, 1, "CSTS.RDY");
    core.on_command(&Sqe::new(admin_opc::KEEP_ALIVE, 6), &[], true, &mut rec);
    assert!(rec.one().status.is_success());
    // Property Get of CC with an 8-byte size: invalid field.
    core.on_command(&prop_get(7, prop::CC, true), &[], true, &mut rec);
    assert_eq!(sc(&rec.one()), (GENERIC, status::SC_INVALID_FIELD));
    // Shutdown: CSTS.SHST reports complete; EOF then means the host left.
    core.on_command(
        &prop_set(8, prop::CC, CC_ENABLE | (1 << 14)),
        &[],
        true,
        &mut rec,
    );
    rec.one();
    core.on_command(&prop_get(9, prop::CSTS, false), &[], true, &mut rec);
    assert_eq!(rec.one().dw0 & 0xC, 0x8);
    assert_eq!(core.eof_reason(), FreeReason::HostDisconnected);
}

#[test]
fn identify_returns_data_then_completion() {
    let t = target();
    let (mut core, mut rec, cntlid) = admin_queue(&t, [1; 16]);
    let mut s = xfer(Sqe::new(admin_opc::IDENTIFY, 10), 4096);
    s.cdw10 = 1;
    core.on_command(&s, &[], true, &mut rec);
    assert_eq!(rec.ev.len(), 2, "{:?}", rec.ev);
    let Ev::Data {
        cid: 10,
        bytes,
        success: false,
    } = &rec.ev[0]
    else {
        panic!("{:?}", rec.ev[0]);
    };
    assert_eq!(u16::from_le_bytes([bytes[78], bytes[79]]), cntlid);
    let c = rec.take_resps()[0];
    assert!(c.status.is_success());
    // A wrong transfer length: no data, an SGL error.
    core.on_command(&xfer(s, 512), &[], true, &mut rec);
    assert_eq!(sc(&rec.one()), (GENERIC, status::SC_SGL_INVALID_DATA_LEN));
    // In-capsule data for a command that returns data: invalid field.
    core.on_command(&in_capsule(s, 16), &[0; 16], true, &mut rec);
    assert_eq!(sc(&rec.one()), (GENERIC, status::SC_INVALID_FIELD));
}

#[test]
fn failed_admin_commands_land_in_the_error_log() {
    let t = target();
    let (mut core, mut rec, _) = admin_queue(&t, [1; 16]);
    core.on_command(&Sqe::new(0xC5, 11), &[], true, &mut rec);
    assert_eq!(sc(&rec.one()), (GENERIC, status::SC_INVALID_OPCODE));
    let ctrl = core.controller().unwrap().clone();
    let st = ctrl.state.lock();
    assert_eq!(st.error_count, 1);
    assert_eq!(st.errors[0].cid, 11);
}

#[test]
fn aers_are_held_until_an_event_and_limited() {
    let t = target();
    let (mut core, mut rec, _) = admin_queue(&t, [1; 16]);
    for cid in 0..crate::controller::AER_LIMIT as u16 {
        core.on_command(
            &Sqe::new(admin_opc::ASYNC_EVENT_REQUEST, 20 + cid),
            &[],
            true,
            &mut rec,
        );
    }
    assert!(rec.take_resps().is_empty());
    assert!(core.holds_aers());
    core.on_command(
        &Sqe::new(admin_opc::ASYNC_EVENT_REQUEST, 30),
        &[],
        true,
        &mut rec,
    );
    let c = rec.one();
    assert_eq!(
        (c.status.sct, c.status.sc),
        (status::SCT_CMD_SPECIFIC, status::SC_ASYNC_LIMIT)
    );
    let ctrl = core.controller().unwrap().clone();
    ctrl.queue_event(AsyncEvent::NS_CHANGED);
    core.on_events(&mut rec);
    let c = rec.one();
    assert_eq!((c.cid, c.dw0), (20, AsyncEvent::NS_CHANGED.0));
    // An event already queued completes the next AER at once.
    ctrl.queue_event(AsyncEvent::ANA_CHANGE);
    ctrl.state.lock().pending_events.clear();
    core.on_events(&mut rec);
    assert!(rec.take_resps().is_empty());
    ctrl.state
        .lock()
        .pending_events
        .push_back(AsyncEvent::ANA_CHANGE);
    core.on_command(
        &Sqe::new(admin_opc::ASYNC_EVENT_REQUEST, 31),
        &[],
        true,
        &mut rec,
    );
    let c = rec.one();
    assert_eq!((c.cid, c.dw0), (31, AsyncEvent::ANA_CHANGE.0));
}

#[test]
fn io_queue_needs_an_enabled_controller() {
    let t = target();
    let mut a = QueueCore::new(t.clone(), "test".into(), None);
    let mut rec = Rec::default();
    a.on_command(
        &connect_sqe(1, 0),
        &connect_data(0xFFFF, NQN, HOST, [1; 16]),
        true,
        &mut rec,
    );
    let cntlid = rec.one().dw0 as u16;
    let mut q = QueueCore::new(t.clone(), "test".into(), None);
    q.on_command(
        &connect_sqe(1, 1),
        &connect_data(cntlid, NQN, HOST, [1; 16]),
        true,
        &mut rec,
    );
    assert_eq!(sc(&rec.one()), (GENERIC, status::SC_CMD_SEQ_ERROR));
    a.on_command(&prop_set(2, prop::CC, CC_ENABLE), &[], true, &mut rec);
    rec.one();
    q.on_command(
        &connect_sqe(1, 1),
        &connect_data(cntlid, NQN, HOST, [1; 16]),
        true,
        &mut rec,
    );
    assert!(rec.one().status.is_success());
    // The same QID twice.
    let mut q2 = QueueCore::new(t.clone(), "test".into(), None);
    q2.on_command(
        &connect_sqe(1, 1),
        &connect_data(cntlid, NQN, HOST, [1; 16]),
        true,
        &mut rec,
    );
    assert_eq!(rec.one().status.sct, status::SCT_CMD_SPECIFIC);
    // Closing the I/O queue frees its QID.
    q.close(FreeReason::ConnectionClosed);
    q2.on_command(
        &connect_sqe(1, 1),
        &connect_data(cntlid, NQN, HOST, [1; 16]),
        true,
        &mut rec,
    );
    assert!(rec.one().status.is_success());
}

#[test]
fn write_in_capsule_and_by_r2t_then_read_back() {
    let t = target();
    let (_a, _, cntlid) = admin_queue(&t, [1; 16]);
    let (mut q, mut rec) = io_queue(&t, cntlid, [1; 16]);
    let data: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
    q.on_command(
        &in_capsule(rw(io_opc::WRITE, 40, 8, 8), 4096),
        &data,
        true,
        &mut rec,
    );
    drain(&mut q, &mut rec);
    assert!(rec.one().status.is_success());
    // 8 KiB by R2T.
    q.on_command(
        &xfer(rw(io_opc::WRITE, 41, 16, 16), 8192),
        &[],
        true,
        &mut rec,
    );
    let Some(Ev::NeedData {
        tag,
        cid: 41,
        len: 8192,
    }) = rec.ev.pop()
    else {
        panic!("{:?}", rec.ev);
    };
    let mut buf = rec.bufs.remove(&tag).unwrap();
    buf.fill(0xAB);
    q.on_data(tag, buf, true, &mut rec);
    drain(&mut q, &mut rec);
    assert!(rec.one().status.is_success());
    q.on_command(
        &xfer(rw(io_opc::READ, 42, 8, 24), 24 * 512),
        &[],
        true,
        &mut rec,
    );
    drain(&mut q, &mut rec);
    let Ev::Data {
        cid: 42,
        bytes,
        success: false,
    } = &rec.ev[0]
    else {
        panic!("{:?}", rec.ev);
    };
    assert_eq!(&bytes[..4096], &data[..]);
    assert!(bytes[4096..].iter().all(|&b| b == 0xAB));
    assert!(rec.take_resps()[0].status.is_success());
    let stats = q.bound.as_ref().unwrap().stats.clone();
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(stats.write_cmds.load(Relaxed), 2);
    assert_eq!(stats.read_cmds.load(Relaxed), 1);
    assert_eq!(stats.depth.load(Relaxed), 0, "every command answered");
    // The namespace's own counters, as metrics read them.
    let ns = t.subsystem(NQN).unwrap().namespace(1).unwrap();
    let s = &ns.stats;
    assert_eq!(s.writes.load(Relaxed), 2);
    assert_eq!(s.write_bytes.load(Relaxed), 4096 + 8192);
    assert_eq!(s.reads.load(Relaxed), 1);
    assert_eq!(s.read_bytes.load(Relaxed), 24 * 512);
    assert_eq!(s.read_errors.load(Relaxed), 0);
    assert_eq!(s.write_latency.snapshot().count, 2);
    assert_eq!(s.read_latency.snapshot().count, 1);
}

#[test]
fn io_checks_before_any_data_moves() {
    let t = target();
    let (_a, _, cntlid) = admin_queue(&t, [1; 16]);
    let (mut q, mut rec) = io_queue(&t, cntlid, [1; 16]);
    let cases = [
        (
            xfer(rw(io_opc::READ, 1, 2047, 2), 1024),
            status::SC_LBA_RANGE,
        ),
        (xfer(rw(0x7E, 2, 0, 1), 512), status::SC_INVALID_OPCODE),
        (
            xfer(rw(io_opc::READ, 3, 0, 8), 512),
            status::SC_SGL_INVALID_DATA_LEN,
        ),
        (
            xfer(rw(io_opc::READ, 4, 0, 256), 256 * 512),
            status::SC_INVALID_FIELD,
        ),
        (
            in_capsule(rw(io_opc::READ, 5, 0, 1), 512),
            status::SC_INVALID_FIELD,
        ),
        (
            xfer(rw(io_opc::WRITE, 6, 0, 8), 512),
            status::SC_SGL_INVALID_DATA_LEN,
        ),
        (
            xfer(rw(io_opc::FLUSH, 7, 0, 1), 512),
            status::SC_SGL_INVALID_DATA_LEN,
        ),
    ];
    for (s, want) in cases {
        let data = vec![
            0u8;
            if s.sgl.type_byte == SGL_DATA_BLOCK_OFFSET {
                s.sgl.length as usize
            } else {
                0
            }
        ];
        q.on_command(&s, &data, true, &mut rec);
        let c = rec.one();
        assert_eq!((c.cid, c.status.sc), (s.cid, want), "{s:?}");
        assert!(rec.bufs.is_empty() && rec.waiting.is_empty());
    }
    let mut bad_ns = rw(io_opc::READ, 8, 0, 1);
    bad_ns.nsid = 9;
    q.on_command(&xfer(bad_ns, 512), &[], true, &mut rec);
    assert_eq!(rec.one().status.sc, status::SC_INVALID_NS);
    // Fused commands are refused.
    let mut fused = xfer(rw(io_opc::READ, 9, 0, 1), 512);
    fused.flags |= 1;
    q.on_command(&fused, &[], true, &mut rec);
    assert_eq!(rec.one().status.sc, status::SC_INVALID_FIELD);
    // Admin opcodes on an I/O queue and vice versa.
    q.on_command(
        &xfer(Sqe::new(admin_opc::IDENTIFY, 10), 4096),
        &[],
        true,
        &mut rec,
    );
    assert_eq!(rec.one().status.sc, status::SC_INVALID_OPCODE);
    q.on_command(&prop_get(11, prop::CAP, true), &[], true, &mut rec);
    assert_eq!(rec.one().status.sc, status::SC_INVALID_OPCODE);
}

#[test]
fn io_after_controller_reset_is_a_sequence_error() {
    let t = target();
    let (mut a, mut arec, cntlid) = admin_queue(&t, [1; 16]);
    let (mut q, mut rec) = io_queue(&t, cntlid, [1; 16]);
    a.on_command(&prop_set(3, prop::CC, 0), &[], true, &mut arec);
    arec.one();
    q.on_command(&xfer(rw(io_opc::READ, 1, 0, 1), 512), &[], true, &mut rec);
    assert_eq!(rec.one().status.sc, status::SC_CMD_SEQ_ERROR);
}

#[test]
fn a_full_queue_answers_without_a_slot() {
    let t = target();
    let (_a, _, cntlid) = admin_queue(&t, [1; 16]);
    let (mut q, mut rec) = io_queue(&t, cntlid, [1; 16]);
    let n = q.slot_count() as u16;
    // Writes by R2T hold their slots until data comes.
    for cid in 0..n {
        q.on_command(
            &xfer(rw(io_opc::WRITE, cid, 0, 1), 512),
            &[],
            true,
            &mut rec,
        );
    }
    assert_eq!(rec.bufs.len(), n as usize);
    q.on_command(
        &xfer(rw(io_opc::WRITE, 999, 0, 1), 512),
        &[],
        true,
        &mut rec,
    );
    let c = rec.take_resps();
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0].cid, c[0].status.sc, c[0].status.dnr),
        (999, status::SC_INTERNAL, false)
    );
}

#[test]
fn disconnect_answers_then_closes() {
    let t = target();
    let (mut core, mut rec, _) = admin_queue(&t, [1; 16]);
    let s = fabrics_sqe(fctype::DISCONNECT, 12);
    core.on_command(&s, &[], true, &mut rec);
    assert!(
        matches!(rec.ev[..], [Ev::Resp(c), Ev::Disconnect] if c.cid == 12 && c.status.is_success())
    );
}

#[test]
fn dsm_deallocate_checks_ranges() {
    let t = target();
    let (_a, _, cntlid) = admin_queue(&t, [1; 16]);
    let (mut q, mut rec) = io_queue(&t, cntlid, [1; 16]);
    let mut s = Sqe::new(io_opc::DATASET_MANAGEMENT, 50);
    s.nsid = 1;
    s.cdw10 = 1; // two ranges
    s.cdw11 = nvme_wire::sqe::DSM_ATTR_DEALLOCATE;
    let mut d = [0u8; 32];
    nvme_wire::sqe::DsmRange {
        attributes: 0,
        nlb: 8,
        slba: 0,
    }
    .encode(&mut d[..16]);
    nvme_wire::sqe::DsmRange {
        attributes: 0,
        nlb: 8,
        slba: 8,
    }
    .encode(&mut d[16..]);
    q.on_command(&in_capsule(s, 32), &d, true, &mut rec);
    drain(&mut q, &mut rec);
    assert!(rec.one().status.is_success());
    nvme_wire::sqe::DsmRange {
        attributes: 0,
        nlb: 8,
        slba: 2044,
    }
    .encode(&mut d[16..]);
    q.on_command(&in_capsule(s, 32), &d, true, &mut rec);
    drain(&mut q, &mut rec);
    assert_eq!(rec.one().status.sc, status::SC_LBA_RANGE);
}

/// A random command for the property test.
fn arb_cmd() -> impl Strategy<Value = (u8, u8, u32, u32, u32, u8, u32, bool, bool)> {
    (
        prop_oneof![
            Just(0u8),
            Just(1),
            Just(2),
            Just(8),
            Just(9),
            Just(6),
            Just(0x7F),
            any::<u8>()
        ],
        prop_oneof![Just(0x40u8), any::<u8>()],
        prop_oneof![Just(1u32), any::<u32>()],
        any::<u32>(),
        prop_oneof![Just(0u32), 0u32..16],
        prop_oneof![Just(0x5Au8), Just(0x01), any::<u8>()],
        prop_oneof![Just(512u32), Just(4096), 0u32..9000],
        any::<bool>(),
        any::<bool>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random commands on an admin queue and an I/O queue: no panic, every
    /// command answered exactly once (by a completion, or data with SUCCESS),
    /// and the SQ head moves by one per command, modulo the queue depth.
    #[test]
    fn random_commands_are_each_answered_once(cmds in proptest::collection::vec(arb_cmd(), 1..120)) {
        let t = target();
        let (mut a, mut arec, cntlid) = admin_queue(&t, [1; 16]);
        let (mut q, mut rec) = io_queue(&t, cntlid, [1; 16]);
        let mut expect_head = 1u16; // after the Connect
        for (n, (opc, flags, nsid, cdw10, cdw12, sgl_type, len, admin, digest_ok)) in cmds.into_iter().enumerate() {
            let cid = n as u16 + 100;
            let mut s = Sqe::new(opc, cid);
            s.flags = flags & !0x03 | (flags & 0x40);
            s.nsid = nsid;
            s.cdw10 = cdw10;
            s.cdw12 = cdw12;
            s.sgl = SglDesc { addr: 0, length: len, type_byte: sgl_type };
            if opc == 0x7F {
                s.cdw10 = cdw10 & 0x0F; // a fabrics command type
            }
            let data = if sgl_type == SGL_DATA_BLOCK_OFFSET { vec![0u8; len.min(9000) as usize] } else { Vec::new() };
            let (core, r) = if admin { (&mut a, &mut arec) } else { (&mut q, &mut rec) };
            core.on_command(&s, &data, digest_ok, r);
            // Fetch any requested data at once, then finish device I/O.
            while let Some(pos) = r.ev.iter().position(|e| matches!(e, Ev::NeedData { .. })) {
                let Ev::NeedData { tag, .. } = r.ev.remove(pos) else { unreachable!() };
                let buf = r.bufs.remove(&tag).unwrap();
                core.on_data(tag, buf, true, r);
            }
            drain(core, r);
            let answers: Vec<(u16, Option<u16>)> = r.ev.drain(..).filter_map(|e| match e {
                Ev::Resp(c) => Some((c.cid, Some(c.sqhd))),
                Ev::Data { cid, success: true, .. } => Some((cid, None)),
                _ => None,
            }).collect();
            let held_aer = admin && opc == admin_opc::ASYNC_EVENT_REQUEST && answers.is_empty();
            if !held_aer {
                prop_assert_eq!(answers.len(), 1, "command {} answered {:?}", cid, answers);
                prop_assert_eq!(answers[0].0, cid);
            }
            if !admin {
                expect_head = (expect_head + 1) % 32;
                if let Some((_, Some(h))) = answers.first() {
                    prop_assert_eq!(*h, expect_head);
                }
            }
        }
    }
}

/// Every log page the controller lists answers with data through the core;
/// an unknown one is Invalid Log Page; Abort says "not aborted"; Keep Alive
/// and Get/Set Features of the number of queues answer.
#[test]
fn every_admin_command_answers_through_the_core() {
    let t = target();
    let (mut core, mut rec, _) = admin_queue(&t, [1; 16]);
    for (lid, len) in [
        (0x00u32, 1024u32),
        (0x01, 64 * 64),
        (0x02, 512),
        (0x03, 512),
        (0x04, 4096),
        (0x05, 4096),
        (0x0C, 4096),
        (0x80, 64),
    ] {
        let mut s = xfer(Sqe::new(admin_opc::GET_LOG_PAGE, 60), len);
        s.nsid = 0xFFFF_FFFF;
        s.cdw10 = lid | ((len / 4 - 1) << 16);
        core.on_command(&s, &[], true, &mut rec);
        assert!(
            matches!(&rec.ev[..], [Ev::Data { cid: 60, bytes, .. }, Ev::Resp(c)] if bytes.len() == len as usize && c.status.is_success()),
            "log page {lid:#x}: {:?}",
            rec.ev
        );
        rec.ev.clear();
    }
    // The supported-logs page lists the reservation notification page.
    let mut s = xfer(Sqe::new(admin_opc::GET_LOG_PAGE, 61), 1024);
    s.cdw10 = (1024 / 4 - 1) << 16;
    core.on_command(&s, &[], true, &mut rec);
    let Ev::Data { bytes, .. } = &rec.ev[0] else {
        panic!()
    };
    assert_ne!(bytes[0x80 * 4], 0, "LSUPP of log page 80h");
    rec.ev.clear();
    let mut s = xfer(Sqe::new(admin_opc::GET_LOG_PAGE, 62), 512);
    s.cdw10 = 0x7F | ((512 / 4 - 1) << 16);
    core.on_command(&s, &[], true, &mut rec);
    let c = rec.one();
    assert_eq!(
        (c.status.sct, c.status.sc),
        (status::SCT_CMD_SPECIFIC, status::SC_INVALID_LOG_PAGE)
    );
    core.on_command(&Sqe::new(admin_opc::ABORT, 63), &[], true, &mut rec);
    let c = rec.one();
    assert!(c.status.is_success());
    assert_eq!(c.dw0 & 1, 1, "not aborted");
    core.on_command(&Sqe::new(admin_opc::KEEP_ALIVE, 64), &[], true, &mut rec);
    assert!(rec.one().status.is_success());
    let mut s = Sqe::new(admin_opc::SET_FEATURES, 65);
    s.cdw10 = 0x07;
    s.cdw11 = 1 | (1 << 16);
    core.on_command(&s, &[], true, &mut rec);
    let c = rec.one();
    assert!(c.status.is_success());
    assert_eq!(c.dw0, 1 | (1 << 16), "two I/O queues granted");
    let mut s = Sqe::new(admin_opc::GET_FEATURES, 66);
    s.cdw10 = 0x07;
    core.on_command(&s, &[], true, &mut rec);
    assert_eq!(rec.one().dw0, 1 | (1 << 16));
    // Reservation persistence of a RAM namespace: off and not changeable.
    let mut s = Sqe::new(admin_opc::GET_FEATURES, 67);
    s.cdw10 = 0x83 | (3 << 8);
    s.nsid = 1;
    core.on_command(&s, &[], true, &mut rec);
    let c = rec.one();
    assert!(c.status.is_success());
    assert_eq!(
        c.dw0 & 0x6,
        0x2,
        "PTPL: namespace specific, not changeable on a RAM namespace"
    );
    let mut s = Sqe::new(admin_opc::SET_FEATURES, 68);
    s.cdw10 = 0x83;
    s.cdw11 = 1;
    s.nsid = 1;
    core.on_command(&s, &[], true, &mut rec);
    assert_eq!(rec.one().status.sc, status::SC_INVALID_FIELD);
}

/// CC.EN 1 -> 0 deletes the I/O queues (Base spec 3.7.2): the old queue
/// answers Command Sequence Error even after re-enable, its QID may be
/// connected again, and held AERs end.
#[test]
fn controller_reset_deletes_io_queues_and_ends_aers() {
    let t = target();
    let (mut a, mut arec, cntlid) = admin_queue(&t, [1; 16]);
    let (mut q, mut rec) = io_queue(&t, cntlid, [1; 16]);
    a.on_command(
        &Sqe::new(admin_opc::ASYNC_EVENT_REQUEST, 70),
        &[],
        true,
        &mut arec,
    );
    assert!(arec.take_resps().is_empty());
    a.on_command(&prop_set(71, prop::CC, 0), &[], true, &mut arec);
    let r = arec.take_resps();
    assert_eq!(r.len(), 2, "{r:?}");
    assert_eq!((r[0].cid, r[0].status.sc), (70, status::SC_INTERNAL));
    assert!(r[1].status.is_success());
    a.on_command(&prop_set(72, prop::CC, CC_ENABLE), &[], true, &mut arec);
    arec.one();
    q.on_command(&xfer(rw(io_opc::READ, 73, 0, 1), 512), &[], true, &mut rec);
    assert_eq!(rec.one().status.sc, status::SC_CMD_SEQ_ERROR);
    let (mut q2, mut rec2) = io_queue(&t, cntlid, [1; 16]);
    q2.on_command(&xfer(rw(io_opc::READ, 74, 0, 1), 512), &[], true, &mut rec2);
    drain(&mut q2, &mut rec2);
    assert!(rec2.take_resps()[0].status.is_success());
}

//! Command execution without a socket: input bytes are an SQE and its data,
//! run through the I/O planner (and the RAM device), the admin commands on a
//! controller made by Connect, Connect itself, and Property Get/Set.
//!
//! Input: byte 0 picks the path (low 3 bits) and options (high bits);
//! bytes 1..65 are the SQE (zero-padded); the rest is the data.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};

use blockdev::{AlignedBuf, BlockOp, IoRequest};
use flashpool_fuzz::*;
use libfuzzer_sys::fuzz_target;
use nvme_wire::fabrics::{
    CNTLID_DYNAMIC, ConnectCmd, ConnectData, DISCOVERY_NQN, PropertyCmd, fctype, prop,
};
use nvme_wire::sqe::{SQE_LEN, Sqe};
use nvmf_target::admin::{self, AdminCtx, AdminOutcome};
use nvmf_target::controller::AsyncEvent;
use nvmf_target::io::{self, IoPlan};
use nvmf_target::{Controller, FreeReason, Target, fabrics};

struct Fixture {
    target: Arc<Target>,
    /// An enabled controller of `NQN_OPEN` for I/O queue Connects.
    ctrl: Arc<Controller>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let target = make_target(1);
        let (sqe, data) = connect(1, 0, CNTLID_DYNAMIC, NQN_OPEN, HOST_NQN, 0);
        let data = ConnectData::decode(&data).unwrap();
        let ctrl = fabrics::connect_admin(&target, &ConnectCmd::from_sqe(&sqe), &data)
            .expect("admin connect");
        ctrl.property_set(prop::CC, false, CC_ENABLE).unwrap();
        assert!(ctrl.enabled());
        Fixture { target, ctrl }
    })
}

fuzz_target!(|input: &[u8]| {
    let f = fixture();
    let sel = input.first().copied().unwrap_or(0);
    let mut raw = [0u8; SQE_LEN];
    let body = input.get(1..).unwrap_or(&[]);
    let n = body.len().min(SQE_LEN);
    raw[..n].copy_from_slice(&body[..n]);
    let sqe = Sqe::decode(&raw).unwrap();
    let data = body.get(SQE_LEN..).unwrap_or(&[]);
    match sel & 7 {
        0 | 1 => io_path(f, &sqe, data),
        2 | 3 => admin_path(f, sel, &sqe, data),
        4 | 5 => connect_path(f, sel, &sqe, data),
        6 => property_path(f, sel, &sqe, data),
        _ => admin_sequence(f, sel, body),
    }
});

fn poll_ready<F: std::future::Future + Unpin>(mut fut: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match std::pin::Pin::new(&mut fut).poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("RAM device I/O did not complete at once"),
    }
}

fn io_path(f: &Fixture, sqe: &Sqe, data: &[u8]) {
    let sub = f.target.subsystem(NQN_OPEN).unwrap();
    let max = f.target.transport.max_transfer;
    let namespaces = sub.namespaces();
    let Ok((ns, plan)) = io::plan(&namespaces, sqe, max) else {
        return;
    };
    let bs = ns.block_size;
    let h2c = plan.host_to_ctrl_len(bs);
    let c2h = plan.ctrl_to_host_len(bs);
    assert!(
        h2c <= max.max(4096) && c2h <= max,
        "{plan:?} moves more than MDTS"
    );
    let len = h2c.max(c2h) as usize;
    let mut buf = AlignedBuf::new(len);
    buf.set_len(len);
    let k = data.len().min(len);
    buf[..k].copy_from_slice(&data[..k]);
    let req = |op, lba, blocks, buf| IoRequest {
        op,
        lba,
        blocks,
        buf,
    };
    let done = match plan {
        IoPlan::Read { lba, blocks } => {
            poll_ready(ns.dev.submit(req(BlockOp::Read, lba, blocks, buf)))
        }
        IoPlan::Write { lba, blocks, fua } => {
            poll_ready(ns.dev.submit(req(BlockOp::Write { fua }, lba, blocks, buf)))
        }
        IoPlan::Flush => poll_ready(ns.dev.submit(req(BlockOp::Flush, 0, 0, buf))),
        IoPlan::WriteZeroes { lba, blocks } => {
            poll_ready(ns.dev.submit(req(BlockOp::WriteZeroes, lba, blocks, buf)))
        }
        IoPlan::Dsm { ranges, deallocate } => {
            if let Ok(list) = io::dsm_ranges(ns, &buf, ranges)
                && deallocate
            {
                for r in list {
                    let mut b = AlignedBuf::new(0);
                    b.set_len(0);
                    let d = poll_ready(ns.dev.submit(req(BlockOp::Deallocate, r.slba, r.nlb, b)));
                    assert!(
                        d.result.is_ok(),
                        "deallocate of a checked range failed: {:?}",
                        d.result
                    );
                }
            }
            return;
        }
    };
    // The planner checked the range: the device must accept it.
    if let Err(e) = &done.result {
        panic!("planned {plan:?} failed on the device: {e}");
    }
}

/// A fresh controller (an NVM one, or the discovery controller).
fn new_controller(f: &Fixture, discovery: bool, enable: bool) -> Arc<Controller> {
    let nqn = if discovery { DISCOVERY_NQN } else { NQN_OPEN };
    let (sqe, data) = connect(1, 0, CNTLID_DYNAMIC, nqn, HOST_NQN, 0);
    let data = ConnectData::decode(&data).unwrap();
    let ctrl = fabrics::connect_admin(&f.target, &ConnectCmd::from_sqe(&sqe), &data)
        .expect("admin connect");
    if enable {
        ctrl.property_set(prop::CC, false, CC_ENABLE).unwrap();
    }
    ctrl
}

fn run_admin(f: &Fixture, ctrl: &Controller, sqe: &Sqe, aers: usize) {
    // As the connection does: the buffer is exactly the command's transfer
    // (which the SGL must match), refused over MDTS.
    let len = match admin::data_in_len(sqe) {
        Some(want) if want > u64::from(f.target.transport.max_transfer) => return,
        Some(want) => want as usize,
        None => 0,
    };
    let mut out = vec![0u8; len];
    let cx = AdminCtx {
        target: &f.target,
        ctrl,
        outstanding_aers: aers,
        local_ip: Some(std::net::Ipv4Addr::LOCALHOST.into()),
    };
    if let AdminOutcome::Complete { status, data, .. } = admin::execute(&cx, sqe, &mut out) {
        assert!(!data || status.is_success(), "data with an error status");
    }
}

fn admin_path(f: &Fixture, sel: u8, sqe: &Sqe, data: &[u8]) {
    let ctrl = new_controller(f, sel & 0x08 != 0, sel & 0x30 != 0x30);
    if sel & 0x40 != 0 {
        ctrl.queue_event(AsyncEvent::NS_CHANGED);
        ctrl.state.lock().changed_ns.push(1);
    }
    let aers = usize::from(data.first().copied().unwrap_or(0) % 6);
    run_admin(f, &ctrl, sqe, aers);
    f.target
        .remove_controller(&ctrl, FreeReason::HostDisconnected);
}

/// Several admin commands on one controller, 64 bytes each.
fn admin_sequence(f: &Fixture, sel: u8, body: &[u8]) {
    let ctrl = new_controller(f, sel & 0x08 != 0, true);
    for chunk in body.chunks(SQE_LEN).take(16) {
        let mut raw = [0u8; SQE_LEN];
        raw[..chunk.len()].copy_from_slice(chunk);
        let sqe = Sqe::decode(&raw).unwrap();
        if sqe.is_fabrics() {
            let p = PropertyCmd::from_sqe(&sqe);
            let cap = prop::cap(f.target.transport.max_queue_depth, 15);
            if sqe.fctype() == fctype::PROPERTY_GET {
                let _ = ctrl.property_get(p.offset, p.size8, cap);
            } else {
                let _ = ctrl.property_set(p.offset, p.size8, p.value);
            }
        } else {
            run_admin(f, &ctrl, &sqe, 0);
        }
    }
    f.target
        .remove_controller(&ctrl, FreeReason::HostDisconnected);
}

fn connect_path(f: &Fixture, sel: u8, sqe: &Sqe, data: &[u8]) {
    let cmd = ConnectCmd::from_sqe(sqe);
    let mut buf = [0u8; 1024];
    let k = data.len().min(1024);
    buf[..k].copy_from_slice(&data[..k]);
    // Options patch in names the target knows, so the checks past them are reached.
    if sel & 0x08 != 0 {
        let nqn = [NQN_OPEN, NQN_CLOSED, DISCOVERY_NQN, NQN_OPEN][usize::from(sel >> 6)];
        nvme_wire::put_str(&mut buf[256..512], nqn, 0);
    }
    if sel & 0x10 != 0 {
        let host = if sel & 0x40 != 0 {
            HOST_ALLOWED
        } else {
            HOST_NQN
        };
        nvme_wire::put_str(&mut buf[512..768], host, 0);
    }
    if sel & 0x20 != 0 {
        let cntlid = if cmd.qid == 0 {
            CNTLID_DYNAMIC
        } else {
            f.ctrl.cntlid
        };
        buf[16..18].copy_from_slice(&cntlid.to_le_bytes());
    }
    let input = if sel & 0x01 != 0 { &buf[..] } else { &buf[..k] };
    let res = fabrics::decode_connect_data(input).and_then(|d| {
        if cmd.qid == 0 {
            fabrics::connect_admin(&f.target, &cmd, &d)
        } else {
            fabrics::connect_io(&f.target, &cmd, &d)
        }
    });
    match res {
        Ok(ctrl) if cmd.qid == 0 => f
            .target
            .remove_controller(&ctrl, FreeReason::HostDisconnected),
        Ok(ctrl) => {
            assert_eq!(ctrl.cntlid, f.ctrl.cntlid);
            fabrics::release_io_queue(&ctrl, cmd.qid);
        }
        Err(e) => assert!(
            !e.status.is_success(),
            "a refused Connect with status success"
        ),
    }
}

fn property_path(f: &Fixture, sel: u8, sqe: &Sqe, data: &[u8]) {
    let ctrl = new_controller(f, sel & 0x08 != 0, sel & 0x10 != 0);
    let cap = prop::cap(f.target.transport.max_queue_depth, 15);
    let p = PropertyCmd::from_sqe(sqe);
    let _ = ctrl.property_get(p.offset, p.size8, cap);
    let _ = ctrl.property_set(p.offset, p.size8, p.value);
    // More Property Sets from the data: offset u32, value u64, size8.
    for c in data.chunks_exact(13).take(8) {
        let off = u32::from_le_bytes(c[0..4].try_into().unwrap());
        let val = u64::from_le_bytes(c[4..12].try_into().unwrap());
        let _ = ctrl.property_set(off, c[12] & 1 != 0, val);
        let _ = ctrl.property_get(prop::CSTS, false, cap);
    }
    let _ = ctrl.enabled();
    f.target
        .remove_controller(&ctrl, FreeReason::HostDisconnected);
}

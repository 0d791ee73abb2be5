//! The transport-free command core (`nvmf_target::queue::QueueCore`) driven
//! without a socket, exactly as the TCP connection drives it: an SQE and its
//! in-capsule data go in, host data asked for is handed back, device I/O is
//! polled to completion. Checks that every command is answered at most once,
//! and exactly once unless it is a held AER.
//!
//! Input: byte 0 picks the queue (low 3 bits) and options (high bits);
//! bytes 1..65 are the SQE (zero-padded); the rest is the in-capsule data,
//! or the host data handed over after a data request.
//! - 0, 1: an I/O queue of an enabled controller
//! - 2, 3: the enabled admin queue
//! - 4, 5: a fresh connection (Connect comes first)
//! - 6: an admin queue not yet enabled (Property Get/Set)
//! - 7: a sequence of 65-byte (selector, SQE) records on the admin queue
//! - bit 3: the capsule's data digest failed; bit 4: the host data's did
#![no_main]

use std::collections::HashMap;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use blockdev::{AlignedBuf, IoFuture};
use flashpool_fuzz::*;
use libfuzzer_sys::fuzz_target;
use nvme_wire::cqe::Cqe;
use nvme_wire::fabrics::CNTLID_DYNAMIC;
use nvme_wire::sqe::{SGL_DATA_BLOCK_OFFSET, SQE_LEN, Sqe, admin_opc};
use nvmf_target::queue::{QueueCore, Transport};
use nvmf_target::{FreeReason, Target};

/// Counts answers per command ID and keeps what the core hands out.
#[derive(Default)]
struct Rec {
    answers: HashMap<u16, u32>,
    need: Vec<(u16, AlignedBuf)>,
    waiting: Vec<(u16, IoFuture)>,
}

impl Transport for Rec {
    fn respond(&mut self, cqe: Cqe) {
        *self.answers.entry(cqe.cid).or_default() += 1;
    }
    fn send_data(&mut self, cid: u16, buf: AlignedBuf, len: usize, success: bool) {
        assert!(len <= buf.len(), "data length beyond its buffer");
        if success {
            *self.answers.entry(cid).or_default() += 1;
        }
    }
    fn request_data(&mut self, tag: u16, _cid: u16, buf: AlignedBuf) {
        self.need.push((tag, buf));
    }
    fn wait_io(&mut self, tag: u16, fut: IoFuture) {
        self.waiting.push((tag, fut));
    }
    fn disconnect(&mut self) {}
}

fn settle(core: &mut QueueCore, rec: &mut Rec, data: &[u8], bad_digest: bool) {
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..64 {
        for (tag, mut buf) in std::mem::take(&mut rec.need) {
            let k = data.len().min(buf.len());
            buf[..k].copy_from_slice(&data[..k]);
            core.on_data(tag, buf, !bad_digest, rec);
        }
        for (tag, mut fut) in std::mem::take(&mut rec.waiting) {
            match std::pin::Pin::new(&mut fut).poll(&mut cx) {
                Poll::Ready(done) => core.on_io_done(tag, done, rec),
                Poll::Pending => panic!("RAM device I/O did not complete at once"),
            }
        }
        if rec.need.is_empty() && rec.waiting.is_empty() {
            return;
        }
    }
    panic!("the core kept asking for data or I/O");
}

fn run(core: &mut QueueCore, rec: &mut Rec, sel: u8, sqe: &Sqe, data: &[u8]) {
    let capsule = if sqe.sgl.type_byte == SGL_DATA_BLOCK_OFFSET {
        &data[..data.len().min(sqe.sgl.length as usize)]
    } else {
        &[][..]
    };
    let before = rec.answers.get(&sqe.cid).copied().unwrap_or(0);
    core.on_command(sqe, capsule, sel & 0x08 == 0, rec);
    settle(core, rec, data, sel & 0x10 != 0);
    let after = rec.answers.get(&sqe.cid).copied().unwrap_or(0);
    let held_aer = sqe.opcode == admin_opc::ASYNC_EVENT_REQUEST && core.holds_aers();
    assert!(
        after == before + 1 || (held_aer && after == before),
        "cid {} answered {} times",
        sqe.cid,
        after - before
    );
}

fn command(cid: u16, sqe: Sqe, data: &[u8], rec: &mut Rec, core: &mut QueueCore) -> u16 {
    core.on_command(&sqe, data, true, rec);
    assert_eq!(rec.answers.get(&sqe.cid), Some(&1), "setup cid {cid}");
    rec.answers.clear();
    cid
}

/// An admin queue connected to `NQN_OPEN`, enabled when `enable`.
fn admin_core(target: &Arc<Target>, enable: bool) -> (QueueCore, Rec) {
    let mut core = QueueCore::new(target.clone(), "fuzz".into(), None);
    let mut rec = Rec::default();
    let (sqe, data) = connect(1, 0, CNTLID_DYNAMIC, NQN_OPEN, HOST_NQN, 0);
    command(1, sqe, &data, &mut rec, &mut core);
    if enable {
        command(2, enable_sqe(2), &[], &mut rec, &mut core);
    }
    (core, rec)
}

fuzz_target!(|input: &[u8]| {
    let target = make_target(1);
    let sel = input.first().copied().unwrap_or(0);
    let body = input.get(1..).unwrap_or(&[]);
    let mut raw = [0u8; SQE_LEN];
    let n = body.len().min(SQE_LEN);
    raw[..n].copy_from_slice(&body[..n]);
    let sqe = Sqe::decode(&raw).unwrap();
    let data = body.get(SQE_LEN..).unwrap_or(&[]);
    match sel & 7 {
        0 | 1 => {
            let (mut admin, _) = admin_core(&target, true);
            let cntlid = admin.controller().unwrap().cntlid;
            let mut q = QueueCore::new(target.clone(), "fuzz".into(), None);
            let mut rec = Rec::default();
            let (c, d) = connect(1, 1, cntlid, NQN_OPEN, HOST_NQN, 0);
            command(1, c, &d, &mut rec, &mut q);
            run(&mut q, &mut rec, sel, &sqe, data);
            q.close(FreeReason::ConnectionClosed);
            admin.close(FreeReason::ConnectionClosed);
        }
        2 | 3 => {
            let (mut core, mut rec) = admin_core(&target, true);
            run(&mut core, &mut rec, sel, &sqe, data);
            core.close(FreeReason::ConnectionClosed);
        }
        4 | 5 => {
            let mut core = QueueCore::new(target.clone(), "fuzz".into(), None);
            let mut rec = Rec::default();
            run(&mut core, &mut rec, sel, &sqe, data);
            core.close(FreeReason::ConnectionClosed);
        }
        6 => {
            let (mut core, mut rec) = admin_core(&target, false);
            run(&mut core, &mut rec, sel, &sqe, data);
            core.close(FreeReason::ConnectionClosed);
        }
        _ => {
            let (mut core, mut rec) = admin_core(&target, true);
            for rec_bytes in body.chunks(1 + SQE_LEN) {
                let mut raw = [0u8; SQE_LEN];
                let k = rec_bytes.len().saturating_sub(1);
                raw[..k].copy_from_slice(&rec_bytes[1..]);
                let s = Sqe::decode(&raw).unwrap();
                run(&mut core, &mut rec, rec_bytes[0] & 0x18, &s, &[]);
            }
            core.close(FreeReason::ConnectionClosed);
        }
    }
    assert_eq!(target.controller_count(), 0, "a closed admin queue left its controller");
});

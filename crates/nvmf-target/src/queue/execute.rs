//! Admin and I/O command execution on a bound queue: admin commands go to
//! `admin.rs`, I/O commands are checked (namespace, ANA, reservations),
//! planned and handed to the device, reservation commands to `resv_cmd.rs`.
//!
//! A second `impl QueueCore` block beside the command core in `mod.rs`.

use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Instant;

use blockdev::{AlignedBuf, BlockOp, IoDone, IoFuture, IoRequest};
use nvme_wire::status::{self, Status};
use parking_lot::Mutex;

use super::sgl::Sgl;
use super::{AfterData, QueueCore, SlotState, Transport};
use crate::admin::{self, AdminCtx, AdminOutcome};
use crate::io::{self, IoPlan, IoReject, ns_instance};
use crate::qos;
use crate::reservation::Access;
use crate::resv_cmd;
use crate::subsystem::find_namespace;

/// Returns once the queue closes (or is gone).
async fn closed(mut rx: tokio::sync::watch::Receiver<bool>) {
    loop {
        let now = *rx.borrow_and_update();
        if now || rx.changed().await.is_err() {
            return;
        }
    }
}

/// A held command whose queue closed before its turn.
fn abandoned() -> blockdev::BlockError {
    blockdev::BlockError::Unreachable {
        what: "namespace".into(),
        after_ms: 0,
        why: "the queue closed while QoS held the command; it was not run".into(),
    }
}

impl QueueCore {
    pub(super) fn admin<T: Transport>(&mut self, i: u16, sgl: Sgl, t: &mut T) {
        let ctrl = self.bound.as_ref().expect("admin queue").ctrl.clone();
        ctrl.touch();
        let sqe = self.slots[usize::from(i)].sqe;
        let mut buf = None;
        if let Some(want) = admin::data_in_len(&sqe) {
            let st = if sgl.in_capsule {
                Some(status::SC_INVALID_FIELD)
            } else if u64::from(sgl.len) != want {
                Some(status::SC_SGL_INVALID_DATA_LEN)
            } else if sgl.len > self.target.transport.max_transfer {
                Some(status::SC_INVALID_FIELD)
            } else {
                None
            };
            if let Some(sc) = st {
                return self.complete(i, Status::generic(sc), 0, 0, t);
            }
            buf = Some(self.pool.get(sgl.len as usize));
        }
        let cx = AdminCtx {
            target: &self.target,
            ctrl: &ctrl,
            outstanding_aers: self.aers.len(),
            local_ip: self.local_ip,
        };
        let outcome = admin::execute(&cx, &sqe, buf.as_deref_mut().unwrap_or(&mut []));
        match outcome {
            AdminOutcome::Complete { status, dw0, data } => {
                match buf {
                    Some(b) if data && status.is_success() => {
                        let len = b.len();
                        t.send_data(sqe.cid, b, len, false);
                    }
                    Some(b) => self.pool.put(b),
                    None => {}
                }
                self.complete(i, status, dw0, 0, t);
            }
            AdminOutcome::HoldAer => {
                self.slots[usize::from(i)].state = SlotState::Aer;
                self.aers.push_back(i);
                self.on_events(t);
            }
            AdminOutcome::Storing(admin::Storing(f)) => {
                let buf = buf.unwrap_or_else(|| self.pool.get(0));
                self.wait_store(i, async move { f.await.map(|()| None) }, buf, t);
            }
        }
    }

    /// Completes command `i` once `stored` resolves: with its status, after
    /// the drain it returns, if any. The status comes back through
    /// `resv_status` (an I/O's result has no room for these statuses).
    fn wait_store<T: Transport>(
        &mut self,
        i: u16,
        stored: impl std::future::Future<Output = Result<Option<resv_cmd::Drain>, Status>>
        + Send
        + 'static,
        buf: AlignedBuf,
        t: &mut T,
    ) {
        let cell = Arc::new(Mutex::new(None));
        self.resv_status.push((i, cell.clone()));
        let fut = async move {
            match stored.await {
                Ok(Some(d)) => d.wait().await,
                Ok(None) => {}
                Err(st) => *cell.lock() = Some(st),
            }
            IoDone {
                buf,
                result: Ok(()),
            }
        };
        t.wait_io(i, IoFuture::Pending(Box::pin(fut)));
    }

    // ---- I/O

    pub(super) fn io<T: Transport>(&mut self, i: u16, sgl: Sgl, data: &[u8], t: &mut T) {
        let b = self.bound.as_mut().expect("I/O queue");
        if let Some(sub) = b.ctrl.subsystem() {
            let v = sub.ns_version();
            if v != b.ns_version {
                b.namespaces = sub.namespaces();
                b.ns_version = v;
                self.qos.retain(b.namespaces.iter().map(|n| &n.qos));
            }
        }
        if b.ctrl.reset_generation() != b.reset_gen {
            // The host reset the controller (CC.EN 1 -> 0): its I/O queues are gone.
            return self.complete(i, Status::generic(status::SC_CMD_SEQ_ERROR), 0, 0, t);
        }
        let slot = &mut self.slots[usize::from(i)];
        slot.started = self.now.unwrap_or_else(Instant::now);
        let sqe = slot.sqe;
        let planned = self
            .target
            .plan_io(&b.namespaces, &sqe)
            .and_then(|(ns, plan)| {
                // Refused before any data moves; writes are checked again
                // when they reach the device (see `execute_io`).
                if let Some(access) = Access::of_io_opcode(sqe.opcode) {
                    ns.resv
                        .check(&b.ctrl.hostid, access)
                        .map_err(|status| IoReject { status, lba: 0 })?;
                }
                Ok((ns.nsid, ns_instance(ns), ns.block_size, plan))
            });
        let (nsid, inst, bs, plan) = match planned {
            Ok(p) => p,
            Err(rej) => return self.complete_lba(i, rej.status, rej.lba, t),
        };
        let c2h = plan.ctrl_to_host_len(bs);
        let h2c = plan.host_to_ctrl_len(bs);
        if c2h > 0 {
            let st = if sgl.in_capsule {
                Some(status::SC_INVALID_FIELD)
            } else if sgl.len != c2h {
                Some(status::SC_SGL_INVALID_DATA_LEN)
            } else {
                None
            };
            if let Some(sc) = st {
                return self.complete(i, Status::generic(sc), 0, 0, t);
            }
            let buf = self.pool.get(c2h as usize);
            self.execute_io(i, nsid, None, plan, buf, t);
        } else if h2c > 0 {
            self.slots[usize::from(i)].after = AfterData::Io { nsid, inst, plan };
            if let Some(buf) = self.fetch_host_data(i, sgl, h2c, data, t) {
                self.execute_io(i, nsid, None, plan, buf, t);
            }
        } else if sgl.len != 0 {
            // No data moves for this command, yet the host described some.
            self.complete(i, Status::generic(status::SC_SGL_INVALID_DATA_LEN), 0, 0, t)
        } else {
            let buf = self.pool.get(0);
            self.execute_io(i, nsid, None, plan, buf, t);
        }
    }

    /// Runs a planned command. `inst`: the namespace instance it was
    /// planned on, when its data arrived later.
    pub(super) fn execute_io<T: Transport>(
        &mut self,
        i: u16,
        nsid: u32,
        inst: Option<usize>,
        plan: IoPlan,
        buf: AlignedBuf,
        t: &mut T,
    ) {
        let b = self.bound.as_ref().expect("I/O queue");
        let found = find_namespace(&b.namespaces, nsid)
            .filter(|ns| inst.is_none_or(|p| p == ns_instance(ns)));
        let Some(ns) = found else {
            // Removed (or replaced) while its data was in flight.
            self.pool.put(buf);
            return self.complete(i, Status::generic(status::SC_INVALID_NS), 0, 0, t);
        };
        if let IoPlan::Reservation(cmd) = plan {
            return self.reservation(i, nsid, cmd, buf, t);
        }
        if Access::of_io_opcode(self.slots[usize::from(i)].sqe.opcode) == Some(Access::Write) {
            // Counted before the check: a Preempt and Abort that changes the
            // reservation after this check waits for this write.
            b.stats.writes_started.fetch_add(1, SeqCst);
            self.slots[usize::from(i)].counted_write = true;
            if let Err(st) = ns.resv.check_write(&b.ctrl.hostid, plan.modifies_data()) {
                self.pool.put(buf);
                return self.complete(i, st, 0, 0, t);
            }
        }
        let dev = ns.dev.clone();
        // Dataset Management ranges are checked before the command can be held.
        let dsm = match plan {
            IoPlan::Dsm { ranges, deallocate } => match io::dsm_ranges(ns, &buf, ranges) {
                Err(rej) => {
                    self.pool.put(buf);
                    return self.complete_lba(i, rej.status, rej.lba, t);
                }
                Ok(_) if !deallocate => None,
                Ok(list) => Some(list),
            },
            _ => None,
        };
        // QoS: an unlimited namespace pays this one relaxed load.
        let hold = if ns.qos.enabled() {
            self.qos_hold(nsid, &plan)
        } else {
            None
        };
        let start = move |buf: AlignedBuf| {
            let req = |op, lba, blocks, buf| IoRequest {
                op,
                lba,
                blocks,
                buf,
            };
            match plan {
                IoPlan::Read { lba, blocks } => dev.submit(req(BlockOp::Read, lba, blocks, buf)),
                IoPlan::Write { lba, blocks, fua } => {
                    dev.submit(req(BlockOp::Write { fua }, lba, blocks, buf))
                }
                IoPlan::Flush => dev.submit(req(BlockOp::Flush, 0, 0, buf)),
                IoPlan::WriteZeroes { lba, blocks } => {
                    dev.submit(req(BlockOp::WriteZeroes, lba, blocks, buf))
                }
                IoPlan::Dsm { .. } => match dsm {
                    None => IoFuture::ready(buf, Ok(())),
                    Some(list) => io::deallocate_all(dev, list, buf),
                },
                IoPlan::Reservation(_) => unreachable!("run above"),
            }
        };
        let fut = match hold {
            None => start(buf),
            // Held, not failed: the device sees it when the namespace's
            // limits let it go; the queue's other commands go on meanwhile.
            // If the queue closes first, it never reaches the device.
            Some(until) => {
                let gone = self.held_watch();
                IoFuture::Pending(Box::pin(async move {
                    tokio::select! {
                        biased;
                        _ = closed(gone) => IoDone {
                            buf,
                            result: Err(abandoned()),
                        },
                        _ = tokio::time::sleep_until(until.into()) => start(buf).await,
                    }
                }))
            }
        };
        match fut {
            IoFuture::Ready(Some(done)) => self.on_io_done(i, done, t),
            fut => t.wait_io(i, fut),
        }
    }

    /// What held commands watch: true once the queue closes.
    fn held_watch(&mut self) -> tokio::sync::watch::Receiver<bool> {
        self.held
            .get_or_insert_with(|| tokio::sync::watch::channel(false).0)
            .subscribe()
    }

    /// The connection is closing: commands held by QoS end now, unrun
    /// (answered, if at all, as retryable Namespace Not Ready), so that
    /// teardown does not wait out their holds nor run them afterwards.
    pub fn abandon_held(&self) {
        if let Some(tx) = &self.held {
            tx.send_replace(true);
        }
    }

    /// A limited namespace's command: when it may start, if not now.
    #[cold]
    fn qos_hold(&mut self, nsid: u32, plan: &IoPlan) -> Option<Instant> {
        let b = self.bound.as_ref().expect("I/O queue");
        let ns = find_namespace(&b.namespaces, nsid)?;
        let cost = plan.qos_cost(ns.block_size)?;
        let now = self.now.unwrap_or_else(Instant::now);
        let at = qos::clock_ns(now);
        let go = ns.qos.admit(self.qos.get(&ns.qos), &cost, at);
        (go > at).then(|| qos::instant_of(go, now))
    }

    /// Runs a reservation command; Report returns its data, Preempt and
    /// Abort completes once the preempted hosts' writes have drained.
    fn reservation<T: Transport>(
        &mut self,
        i: u16,
        nsid: u32,
        cmd: resv_cmd::ResvCmd,
        mut buf: AlignedBuf,
        t: &mut T,
    ) {
        let b = self.bound.as_ref().expect("I/O queue");
        let ns = find_namespace(&b.namespaces, nsid).expect("checked by the caller");
        if matches!(cmd, resv_cmd::ResvCmd::Report(_)) {
            // Past the structure the host reads zeroes, not a pooled buffer's past.
            buf.fill(0);
        }
        let res = resv_cmd::execute(&self.target, &b.ctrl, ns, cmd, &mut buf);
        let cid = self.slots[usize::from(i)].sqe.cid;
        match res {
            Err(st) => {
                self.pool.put(buf);
                self.complete(i, st, 0, 0, t)
            }
            Ok(_) if matches!(cmd, resv_cmd::ResvCmd::Report(_)) => {
                let len = buf.len();
                t.send_data(cid, buf, len, false);
                self.complete(i, Status::SUCCESS, 0, 0, t)
            }
            Ok(resv_cmd::Ran::Storing(stored)) => {
                self.wait_store(i, async move { stored.await.map(|d| d.drain) }, buf, t);
            }
            Ok(resv_cmd::Ran::Done(resv_cmd::ResvDone { drain: Some(drain) }))
                if !drain.is_done() =>
            {
                let fut = async move {
                    drain.wait().await;
                    IoDone {
                        buf,
                        result: Ok(()),
                    }
                };
                t.wait_io(i, IoFuture::Pending(Box::pin(fut)));
            }
            Ok(_) => {
                self.pool.put(buf);
                self.complete(i, Status::SUCCESS, 0, 0, t)
            }
        }
    }
}

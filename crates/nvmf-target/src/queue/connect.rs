//! Fabrics commands on a queue (Connect, Property Get/Set, Disconnect) and
//! DH-HMAC-CHAP authentication (Authentication Send/Receive): how a
//! connection becomes a bound admin or I/O queue.
//!
//! A second `impl QueueCore` block beside the command core in `mod.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use blockdev::AlignedBuf;
use nvme_wire::auth::{AuthCmd, CONNECT_AUTHREQ_ATR};
use nvme_wire::fabrics::{CATTR_DISABLE_SQFLOW, ConnectCmd, PropertyCmd, fctype};
use nvme_wire::status::{self, Status};

use super::sgl::Sgl;
use super::{AUTH_MAX_LEN, AfterData, Bound, QueueCore, Transport};
use crate::auth::{self, AuthSession};
use crate::fabrics;

impl QueueCore {
    pub(super) fn fabrics<T: Transport>(&mut self, i: u16, sgl: Sgl, data: &[u8], t: &mut T) {
        let sqe = self.slots[usize::from(i)].sqe;
        let seq_error = Status::generic(status::SC_CMD_SEQ_ERROR);
        match sqe.fctype() {
            fctype::CONNECT => {
                if self.bound.is_some() || self.connecting {
                    return self.complete(i, seq_error, 0, 0, t);
                }
                self.slots[usize::from(i)].after = AfterData::Connect;
                self.connecting = true;
                let len = nvme_wire::fabrics::CONNECT_DATA_LEN as u32;
                if let Some(buf) = self.fetch_host_data(i, sgl, len, data, t) {
                    self.do_connect(i, buf, t);
                }
            }
            fctype::PROPERTY_GET | fctype::PROPERTY_SET => {
                let Some(b) = self.bound.as_ref() else {
                    return self.complete(i, seq_error, 0, 0, t);
                };
                if b.qid != 0 {
                    let st = Status::generic(status::SC_INVALID_OPCODE);
                    return self.complete(i, st, 0, 0, t);
                }
                let ctrl = b.ctrl.clone();
                ctrl.touch();
                let p = PropertyCmd::from_sqe(&sqe);
                let res = if sqe.fctype() == fctype::PROPERTY_GET {
                    let cap =
                        nvme_wire::fabrics::prop::cap(self.target.transport.max_queue_depth, 15);
                    ctrl.property_get(p.offset, p.size8, cap)
                } else {
                    let before = ctrl.reset_generation();
                    let r = ctrl.property_set(p.offset, p.size8, p.value).map(|()| 0);
                    if ctrl.reset_generation() != before {
                        // A reset ends every outstanding command, held AERs too
                        // (as nvmet: Internal Error, do not retry).
                        while let Some(a) = self.aers.pop_front() {
                            self.complete(a, Status::generic(status::SC_INTERNAL), 0, 0, t);
                        }
                    }
                    r
                };
                match res {
                    Ok(v) => self.complete(i, Status::SUCCESS, v as u32, (v >> 32) as u32, t),
                    Err(st) => self.complete(i, st, 0, 0, t),
                }
            }
            fctype::AUTH_SEND | fctype::AUTH_RECV => self.auth_cmd(i, sgl, data, t),
            fctype::DISCONNECT => {
                if self.bound.is_none() {
                    return self.complete(i, seq_error, 0, 0, t);
                }
                self.complete(i, Status::SUCCESS, 0, 0, t);
                t.disconnect();
            }
            _ => self.complete(i, Status::generic(status::SC_INVALID_OPCODE), 0, 0, t),
        }
    }

    pub(super) fn do_connect<T: Transport>(&mut self, i: u16, buf: AlignedBuf, t: &mut T) {
        let sqe = self.slots[usize::from(i)].sqe;
        let cmd = ConnectCmd::from_sqe(&sqe);
        let res = fabrics::connect(&self.target, &cmd, &buf, &self.peer, self.tls.as_ref());
        self.pool.put(buf);
        match res {
            Ok(ctrl) => {
                let (namespaces, ns_version) = match ctrl.subsystem() {
                    Some(s) => (s.namespaces(), s.ns_version()),
                    None => (Arc::from(Vec::new()), 0),
                };
                self.sqhd = 1 % (cmd.sqsize + 1);
                let auth = ctrl.subsystem().and_then(|s| s.host_auth(&ctrl.hostnqn));
                let authreq = if auth.is_some() {
                    CONNECT_AUTHREQ_ATR
                } else {
                    0
                };
                let stats = ctrl.register_queue_stats();
                self.target
                    .register_queue(ctrl.hostid, ctrl.subnqn(), &stats);
                self.bound = Some(Bound {
                    reset_gen: ctrl.reset_generation(),
                    stats,
                    depth: cmd.sqsize + 1,
                    sqflow_off: cmd.cattr & CATTR_DISABLE_SQFLOW != 0,
                    qid: cmd.qid,
                    namespaces,
                    ns_version,
                    auth_by: auth.as_ref().map(|_| {
                        Instant::now()
                            + Duration::from_millis(u64::from(
                                self.target.transport.auth_timeout_ms,
                            ))
                    }),
                    auth: auth
                        .map(|a| AuthSession::new(a, &ctrl.hostnqn, ctrl.subnqn(), auth::os_rng)),
                    ctrl: ctrl.clone(),
                });
                tracing::debug!(
                    "{}: queue {} of controller {} connected",
                    self.peer,
                    cmd.qid,
                    ctrl.cntlid
                );
                let dw0 = u32::from(ctrl.cntlid) | authreq;
                self.complete(i, Status::SUCCESS, dw0, 0, t);
            }
            // fabrics::connect logged why.
            Err(e) => self.complete(i, e.status, e.dw0, 0, t),
        }
    }

    // ---- Authentication (DH-HMAC-CHAP)

    /// Authentication Send and Receive: checked as nvmet checks them, then
    /// handed to the queue's `AuthSession`.
    fn auth_cmd<T: Transport>(&mut self, i: u16, sgl: Sgl, data: &[u8], t: &mut T) {
        let sqe = self.slots[usize::from(i)].sqe;
        let Some(b) = self.bound.as_ref() else {
            return self.complete(i, Status::generic(status::SC_CMD_SEQ_ERROR), 0, 0, t);
        };
        if b.auth.is_none() {
            // Nothing to authenticate: this host is not required to.
            return self.complete(i, Status::generic(status::SC_INVALID_FIELD), 0, 0, t);
        }
        let cmd = AuthCmd::from_sqe(&sqe);
        if cmd.bad_field().is_some() || cmd.len > AUTH_MAX_LEN {
            return self.complete(i, Status::generic(status::SC_INVALID_FIELD), 0, 0, t);
        }
        if sqe.fctype() == fctype::AUTH_SEND {
            self.slots[usize::from(i)].after = AfterData::AuthSend;
            if let Some(buf) = self.fetch_host_data(i, sgl, cmd.len, data, t) {
                self.do_auth_send(i, buf, t);
            }
            return;
        }
        if sgl.in_capsule {
            return self.complete(i, Status::generic(status::SC_INVALID_FIELD), 0, 0, t);
        }
        if sgl.len != cmd.len {
            return self.complete(i, Status::generic(status::SC_SGL_INVALID_DATA_LEN), 0, 0, t);
        }
        let b = self.bound.as_mut().expect("checked");
        let a = b.auth.as_mut().expect("checked");
        match a.on_receive(cmd.len as usize) {
            Err(auth::TooShort) => {
                self.complete(i, Status::generic(status::SC_INVALID_FIELD), 0, 0, t)
            }
            Ok((msg, ev)) => {
                let (host, qid) = (b.ctrl.hostnqn.clone(), b.qid);
                self.log_auth(&host, qid, ev);
                let mut buf = self.pool.get(cmd.len as usize);
                buf.fill(0);
                buf[..msg.len()].copy_from_slice(&msg);
                let len = buf.len();
                t.send_data(sqe.cid, buf, len, false);
                self.complete(i, Status::SUCCESS, 0, 0, t)
            }
        }
    }

    pub(super) fn do_auth_send<T: Transport>(&mut self, i: u16, buf: AlignedBuf, t: &mut T) {
        let Some(b) = self.bound.as_mut() else {
            self.pool.put(buf);
            return self.complete(i, Status::generic(status::SC_CMD_SEQ_ERROR), 0, 0, t);
        };
        let ev = b
            .auth
            .as_mut()
            .map_or(auth::Event::Nothing, |a| a.on_send(&buf));
        let (host, qid) = (b.ctrl.hostnqn.clone(), b.qid);
        self.pool.put(buf);
        self.log_auth(&host, qid, ev);
        self.complete(i, Status::SUCCESS, 0, 0, t)
    }

    /// One line per outcome, with the host and the reason; never a secret.
    fn log_auth(&self, host: &str, qid: u16, ev: auth::Event) {
        match ev {
            auth::Event::Nothing => {}
            auth::Event::Authenticated => tracing::debug!(
                "{}: host {host} authenticated queue {qid} (DH-HMAC-CHAP)",
                self.peer
            ),
            auth::Event::Failed { explanation, why } => tracing::warn!(
                "{}: authentication refused for host {host} on queue {qid}: {why} (explanation {explanation:#x})",
                self.peer
            ),
        }
    }
}

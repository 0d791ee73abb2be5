//! Fabrics commands: Connect (admin and I/O queues), Property Get/Set, Disconnect.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use nvme_wire::fabrics::{
    CNTLID_DYNAMIC, ConnectCmd, ConnectData, ConnectDataError, DISCOVERY_NQN, NQN_FIELD_LEN,
};
use nvme_wire::fabrics::{
    CONNECT_DATA_OFF_CNTLID, CONNECT_DATA_OFF_HOSTNQN, CONNECT_DATA_OFF_SUBNQN,
    CONNECT_SQE_OFF_QID, CONNECT_SQE_OFF_SQSIZE,
};
use nvme_wire::status::{self, Status};
use nvme_wire::tls_psk::PskIdentity;

use crate::Target;
use crate::controller::{Controller, CtrlKind};

/// A refused Connect: the status, dword 0 (IATTR/IPO for invalid
/// parameters), and why, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectError {
    pub status: Status,
    pub dw0: u32,
    pub reason: &'static str,
}

/// Connect response dword 0 for a bad parameter: IPO (byte offset of the
/// field) in bits 15:0, IATTR in bits 23:16 (1 = in the Connect data, 0 = in the SQE).
pub fn ipo_iattr(in_data: bool, ipo: u16) -> u32 {
    u32::from(ipo) | (u32::from(in_data) << 16)
}

/// "Connect Invalid Parameters" pointing at a field.
fn invalid_param(in_data: bool, ipo: u16, reason: &'static str) -> ConnectError {
    ConnectError {
        status: Status::cmd_specific(status::SC_CONNECT_INVALID_PARAM),
        dw0: ipo_iattr(in_data, ipo),
        reason,
    }
}

fn plain(status: Status, reason: &'static str) -> ConnectError {
    ConnectError {
        status,
        dw0: 0,
        reason,
    }
}

/// Reads the Connect data. An empty or over-long NQN is refused: the spec
/// makes SUBNQN and HOSTNQN NVMe Qualified Names, and "" is none.
pub fn decode_connect_data(b: &[u8]) -> Result<ConnectData, ConnectError> {
    ConnectData::decode(b).map_err(|e| match e {
        ConnectDataError::Short => plain(
            Status::generic(status::SC_SGL_INVALID_DATA_LEN),
            "connect data shorter than 1024 bytes",
        ),
        ConnectDataError::BadSubNqn => invalid_param(
            true,
            CONNECT_DATA_OFF_SUBNQN,
            "subsystem NQN empty, not UTF-8 or over 223 bytes",
        ),
        ConnectDataError::BadHostNqn => invalid_param(
            true,
            CONNECT_DATA_OFF_HOSTNQN,
            "host NQN empty, not UTF-8 or over 223 bytes",
        ),
    })
}

/// Decodes the Connect data, connects the admin queue (qid 0) or an I/O
/// queue, and logs every refusal with the host, the subsystem and the peer.
/// This is what a transport calls.
pub fn connect(
    target: &Target,
    cmd: &ConnectCmd,
    data: &[u8],
    peer: &str,
    tls: Option<&PskIdentity>,
) -> Result<Arc<Controller>, ConnectError> {
    let res = decode_connect_data(data).and_then(|d| {
        check_channel(target, &d, tls)?;
        if cmd.qid == 0 {
            connect_admin(target, cmd, &d)
        } else {
            connect_io(target, cmd, &d)
        }
    });
    if let (Ok(ctrl), Some(o)) = (&res, target.connect_observer())
        && cmd.qid == 0
        && !ctrl.is_discovery()
    {
        o.host_connected(&crate::HostConnected {
            subnqn: ctrl.subnqn().to_string(),
            hostnqn: ctrl.hostnqn.clone(),
            cntlid: ctrl.cntlid,
            peer: peer.to_string(),
        });
    }
    if let Err(e) = &res {
        // The NQN fields as sent, even when they did not decode.
        let field = |off: usize| {
            let f = data.get(off..off + NQN_FIELD_LEN).unwrap_or(&[]);
            let end = f.iter().position(|&c| c == 0).unwrap_or(f.len());
            String::from_utf8_lossy(&f[..end]).into_owned()
        };
        let not_allowed = e.reason == HOST_NOT_ALLOWED;
        if let Some(o) = target.connect_observer() {
            o.host_refused(&crate::HostRefused {
                subnqn: field(usize::from(CONNECT_DATA_OFF_SUBNQN)),
                hostnqn: field(usize::from(CONNECT_DATA_OFF_HOSTNQN)),
                qid: cmd.qid,
                reason: e.reason,
                not_allowed,
                peer: peer.to_string(),
            });
        }
        if not_allowed {
            // The stable line docs/config.md promises to log readers.
            tracing::warn!(
                "host {} not allowed on {} ({peer}, qid {})",
                field(usize::from(CONNECT_DATA_OFF_HOSTNQN)),
                field(usize::from(CONNECT_DATA_OFF_SUBNQN)),
                cmd.qid,
            );
            return res;
        }
        tracing::warn!(
            "{peer}: connect refused (qid {}): {}; host NQN {:?}, subsystem NQN {:?}, status {:#x}/{:#x}, dw0 {:#x}",
            cmd.qid,
            e.reason,
            field(usize::from(CONNECT_DATA_OFF_HOSTNQN)),
            field(usize::from(CONNECT_DATA_OFF_SUBNQN)),
            e.status.sct,
            e.status.sc,
            e.dw0,
        );
    }
    res
}

/// The reason of a Connect refused because the host is not in the list.
const HOST_NOT_ALLOWED: &str = "host not allowed on this subsystem";

/// The channel must fit the Connect: over TLS, the NQNs of the PSK identity
/// (a host's PSK opens its own associations only); over plain TCP, no
/// subsystem that requires TLS of this host.
fn check_channel(
    target: &Target,
    d: &ConnectData,
    tls: Option<&PskIdentity>,
) -> Result<(), ConnectError> {
    let not_allowed = |reason| ConnectError {
        status: Status::cmd_specific(status::SC_CONNECT_INVALID_HOST),
        dw0: ipo_iattr(true, CONNECT_DATA_OFF_HOSTNQN),
        reason,
    };
    match tls {
        Some(id) if id.hostnqn != d.hostnqn => Err(not_allowed(
            "the host NQN differs from the TLS PSK identity's",
        )),
        Some(id) if id.subnqn != d.subnqn => Err(invalid_param(
            true,
            CONNECT_DATA_OFF_SUBNQN,
            "the subsystem NQN differs from the TLS PSK identity's",
        )),
        Some(_) => Ok(()),
        None if d.subnqn != DISCOVERY_NQN
            && target
                .subsystem(&d.subnqn)
                .is_some_and(|s| s.tls_required_for(&d.hostnqn)) =>
        {
            Err(not_allowed("this host must connect over TLS"))
        }
        None => Ok(()),
    }
}

fn check_sqsize(target: &Target, cmd: &ConnectCmd) -> Result<(), ConnectError> {
    // sqsize is 0-based; a queue needs at least two entries.
    if cmd.sqsize == 0 || u32::from(cmd.sqsize) + 1 > u32::from(target.transport.max_queue_depth) {
        return Err(invalid_param(
            false,
            CONNECT_SQE_OFF_SQSIZE,
            "SQSIZE is 0 or over the queue depth limit",
        ));
    }
    Ok(())
}

/// Admin queue Connect: creates a controller (dynamic controller model).
pub fn connect_admin(
    target: &Target,
    cmd: &ConnectCmd,
    data: &ConnectData,
) -> Result<Arc<Controller>, ConnectError> {
    if cmd.recfmt != 0 {
        return Err(plain(
            Status::cmd_specific(status::SC_CONNECT_FORMAT),
            "unsupported RECFMT",
        ));
    }
    check_sqsize(target, cmd)?;
    if data.cntlid != CNTLID_DYNAMIC {
        return Err(invalid_param(
            true,
            CONNECT_DATA_OFF_CNTLID,
            "admin queue CNTLID is not FFFFh (dynamic controller model)",
        ));
    }
    let kind = if data.subnqn == DISCOVERY_NQN {
        CtrlKind::Discovery
    } else {
        let Some(sub) = target.subsystem(&data.subnqn) else {
            return Err(invalid_param(
                true,
                CONNECT_DATA_OFF_SUBNQN,
                "no such subsystem",
            ));
        };
        if !sub.host_allowed(&data.hostnqn) {
            return Err(ConnectError {
                status: Status::cmd_specific(status::SC_CONNECT_INVALID_HOST),
                dw0: ipo_iattr(true, CONNECT_DATA_OFF_HOSTNQN),
                reason: HOST_NOT_ALLOWED,
            });
        }
        CtrlKind::Io(sub.clone())
    };
    if data.hostid == [0; 16] {
        // Accepted as nvmet does; a zero HOSTID cannot tell hosts apart for reservations.
        tracing::info!(
            "host {} connects to {} with a zero host identifier",
            data.hostnqn,
            data.subnqn
        );
    }
    let kato = cmd.kato_ms.min(target.transport.kato_max_ms);
    let ctrl = target
        .add_controller(|id| {
            Controller::new(
                id,
                kind,
                data.hostnqn.clone(),
                data.hostid,
                kato,
                cmd.sqsize + 1,
                target.transport.max_io_queues,
            )
        })
        .ok_or(plain(
            Status::cmd_specific(status::SC_CONNECT_CTRL_BUSY),
            "no free controller ID",
        ))?;
    ctrl.touch();
    tracing::info!(
        "controller {} created: subsystem {}, host {}",
        ctrl.cntlid,
        ctrl.subnqn(),
        ctrl.hostnqn
    );
    Ok(ctrl)
}

/// I/O queue Connect: attaches queue `qid` to an existing, enabled controller.
pub fn connect_io(
    target: &Target,
    cmd: &ConnectCmd,
    data: &ConnectData,
) -> Result<Arc<Controller>, ConnectError> {
    if cmd.recfmt != 0 {
        return Err(plain(
            Status::cmd_specific(status::SC_CONNECT_FORMAT),
            "unsupported RECFMT",
        ));
    }
    let Some(ctrl) = target.controller(data.cntlid) else {
        return Err(invalid_param(
            true,
            CONNECT_DATA_OFF_CNTLID,
            "no such controller",
        ));
    };
    if ctrl.subnqn() != data.subnqn {
        return Err(invalid_param(
            true,
            CONNECT_DATA_OFF_SUBNQN,
            "subsystem NQN differs from the controller's",
        ));
    }
    if ctrl.hostnqn != data.hostnqn {
        return Err(invalid_param(
            true,
            CONNECT_DATA_OFF_HOSTNQN,
            "host NQN differs from the controller's",
        ));
    }
    if ctrl.hostid != data.hostid {
        // Accepted, as nvmet and SPDK do (hosts in the field send a fresh
        // Host ID per Connect): the host NQN and controller ID above tie
        // the queue to the association, and reservations keep naming the
        // registrant by the admin queue's Host ID, which the controller holds.
        // Once per controller: a host that does this does it on every queue.
        if !ctrl.other_hostid_seen.swap(true, Ordering::Relaxed) {
            tracing::info!(
                "controller {} ({}): I/O queue {} connects with another host identifier than \
                 the admin queue's; accepted, and the admin queue's stays the host's for \
                 reservations (logged once per controller)",
                ctrl.cntlid,
                ctrl.hostnqn,
                cmd.qid
            );
        }
    }
    if ctrl.is_discovery() {
        return Err(invalid_param(
            false,
            CONNECT_SQE_OFF_QID,
            "a discovery controller has no I/O queues",
        ));
    }
    check_sqsize(target, cmd)?;
    let mut st = ctrl.state.lock();
    if st.csts & nvme_wire::fabrics::prop::CSTS_RDY == 0 {
        return Err(plain(
            Status::generic(status::SC_CMD_SEQ_ERROR),
            "controller not enabled (CSTS.RDY clear)",
        ));
    }
    let limit = if st.io_queues_granted > 0 {
        st.io_queues_granted
    } else {
        target.transport.max_io_queues
    };
    let qid = usize::from(cmd.qid);
    if cmd.qid == 0 || cmd.qid > limit || st.io_queues.get(qid).copied().unwrap_or(true) {
        return Err(invalid_param(
            false,
            CONNECT_SQE_OFF_QID,
            "QID out of range or already connected",
        ));
    }
    st.io_queues[qid] = true;
    drop(st);
    ctrl.touch();
    Ok(ctrl)
}

/// An I/O queue went away: its qid may be connected again.
pub fn release_io_queue(ctrl: &Controller, qid: u16) {
    if let Some(q) = ctrl.state.lock().io_queues.get_mut(usize::from(qid)) {
        *q = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observer::{ConnectObserver, HostConnected, HostRefused};
    use crate::subsystem::Subsystem;
    use nvme_wire::fabrics::ConnectData;
    use parking_lot::Mutex;

    #[derive(Default)]
    struct Seen {
        connected: Mutex<Vec<HostConnected>>,
        refused: Mutex<Vec<HostRefused>>,
    }

    impl ConnectObserver for Seen {
        fn host_connected(&self, c: &HostConnected) {
            self.connected.lock().push(c.clone());
        }
        fn host_refused(&self, r: &HostRefused) {
            self.refused.lock().push(r.clone());
        }
    }

    /// An admin queue Connect (qid 0, 32 entries, no keep-alive).
    fn admin_connect() -> ConnectCmd {
        ConnectCmd {
            recfmt: 0,
            qid: 0,
            sqsize: 31,
            cattr: 0,
            kato_ms: 0,
        }
    }

    fn data(subnqn: &str, hostnqn: &str) -> [u8; 1024] {
        ConnectData {
            hostid: [7; 16],
            cntlid: CNTLID_DYNAMIC,
            subnqn: subnqn.into(),
            hostnqn: hostnqn.into(),
        }
        .encode()
    }

    /// A target with subsystem `nqn.test:s`, which `nqn.test:good` may use.
    fn one_subsystem() -> Target {
        let sub = Subsystem::new(
            "nqn.test:s".into(),
            "S1".into(),
            "m".into(),
            false,
            vec!["nqn.test:good".into()],
            Vec::new(),
        );
        Target::new(Default::default(), vec![Arc::new(sub)])
    }

    #[test]
    fn the_observer_hears_connects_and_refusals() {
        let t = one_subsystem();
        let seen = Arc::new(Seen::default());
        t.set_connect_observer(seen.clone());
        let cmd = admin_connect();
        let c = connect(
            &t,
            &cmd,
            &data("nqn.test:s", "nqn.test:good"),
            "10.0.0.1:5",
            None,
        )
        .unwrap();
        assert!(
            connect(
                &t,
                &cmd,
                &data("nqn.test:s", "nqn.test:bad"),
                "10.0.0.2:6",
                None
            )
            .is_err()
        );
        // Discovery is not a host attaching: not reported.
        connect(
            &t,
            &cmd,
            &data(DISCOVERY_NQN, "nqn.test:bad"),
            "10.0.0.2:7",
            None,
        )
        .unwrap();
        assert_eq!(
            *seen.connected.lock(),
            [HostConnected {
                subnqn: "nqn.test:s".into(),
                hostnqn: "nqn.test:good".into(),
                cntlid: c.cntlid,
                peer: "10.0.0.1:5".into(),
            }]
        );
        let r = seen.refused.lock();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].hostnqn, "nqn.test:bad");
        assert_eq!(r[0].subnqn, "nqn.test:s");
        assert!(r[0].not_allowed);
        assert_eq!(r[0].peer, "10.0.0.2:6");
    }

    #[test]
    fn an_io_queue_may_bring_another_host_id_and_the_admin_queues_stays() {
        let t = one_subsystem();
        let c = connect(
            &t,
            &admin_connect(),
            &data("nqn.test:s", "nqn.test:good"),
            "10.0.0.1:5",
            None,
        )
        .unwrap();
        c.state.lock().csts |= nvme_wire::fabrics::prop::CSTS_RDY;
        let io = ConnectCmd {
            qid: 1,
            ..admin_connect()
        };
        let other = |hostnqn: &str, hostid: [u8; 16]| {
            ConnectData {
                hostid,
                cntlid: c.cntlid,
                subnqn: "nqn.test:s".into(),
                hostnqn: hostnqn.into(),
            }
            .encode()
        };
        let q = connect(
            &t,
            &io,
            &other("nqn.test:good", [8; 16]),
            "10.0.0.1:6",
            None,
        )
        .unwrap();
        assert_eq!(q.cntlid, c.cntlid);
        assert_eq!(
            c.hostid, [7; 16],
            "the admin queue's Host ID names the host"
        );
        assert!(
            c.other_hostid_seen.load(Ordering::Relaxed),
            "noted, so it is logged once for this controller"
        );
        // The host NQN still must match.
        let io2 = ConnectCmd {
            qid: 2,
            ..admin_connect()
        };
        assert!(connect(&t, &io2, &other("nqn.test:x", [7; 16]), "10.0.0.1:7", None).is_err());
    }

    #[test]
    fn a_tls_channel_opens_only_its_identitys_association() {
        use nvme_wire::tls_psk::{ConfiguredPsk, PskHash};
        let key = ConfiguredPsk::from_key(Some(PskHash::Sha256), &[3; 32]).unwrap();
        let mut a = Subsystem::new(
            "nqn.test:a".into(),
            "A".into(),
            "m".into(),
            false,
            vec!["nqn.test:h".into(), "nqn.test:other".into()],
            Vec::new(),
        );
        a.set_host_tls("nqn.test:h".into(), key.clone());
        let mut b = Subsystem::new(
            "nqn.test:b".into(),
            "B".into(),
            "m".into(),
            true,
            Vec::new(),
            Vec::new(),
        );
        b.set_require_tls(true);
        let t = Target::new(Default::default(), vec![Arc::new(a), Arc::new(b)]);
        let cmd = admin_connect();
        let (id_a, _) = key.derive("nqn.test:h", "nqn.test:a", 0);
        let p = "10.0.0.9:1";
        // the identity's own association
        connect(&t, &cmd, &data("nqn.test:a", "nqn.test:h"), p, Some(&id_a)).unwrap();
        // another host NQN, or another subsystem, on that channel
        let e = connect(
            &t,
            &cmd,
            &data("nqn.test:a", "nqn.test:other"),
            p,
            Some(&id_a),
        )
        .err()
        .unwrap();
        assert_eq!(
            e.status,
            Status::cmd_specific(status::SC_CONNECT_INVALID_HOST)
        );
        let e = connect(&t, &cmd, &data("nqn.test:b", "nqn.test:h"), p, Some(&id_a))
            .err()
            .unwrap();
        assert_eq!(
            e.status,
            Status::cmd_specific(status::SC_CONNECT_INVALID_PARAM)
        );
        // plain TCP: the host with a key is refused, the one without is not;
        // a require_tls subsystem refuses everyone
        let e = connect(&t, &cmd, &data("nqn.test:a", "nqn.test:h"), p, None)
            .err()
            .unwrap();
        assert_eq!(e.reason, "this host must connect over TLS");
        connect(&t, &cmd, &data("nqn.test:a", "nqn.test:other"), p, None).unwrap();
        let e = connect(&t, &cmd, &data("nqn.test:b", "nqn.test:any"), p, None)
            .err()
            .unwrap();
        assert_eq!(
            e.status,
            Status::cmd_specific(status::SC_CONNECT_INVALID_HOST)
        );
        // discovery over plain TCP stays open; over TLS with the discovery identity too
        connect(&t, &cmd, &data(DISCOVERY_NQN, "nqn.test:h"), p, None).unwrap();
        let (id_d, _) = key.derive("nqn.test:h", DISCOVERY_NQN, 0);
        connect(&t, &cmd, &data(DISCOVERY_NQN, "nqn.test:h"), p, Some(&id_d)).unwrap();
        // the PSK lookup: per subsystem, and any of the host's keys for discovery
        assert_eq!(t.tls_psk("nqn.test:h", "nqn.test:a"), Some(key.clone()));
        assert_eq!(t.tls_psk("nqn.test:h", DISCOVERY_NQN), Some(key));
        assert_eq!(t.tls_psk("nqn.test:h", "nqn.test:b"), None);
        assert_eq!(t.tls_psk("nqn.test:other", "nqn.test:a"), None);
    }
}

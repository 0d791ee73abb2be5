//! Fabrics commands: Connect (admin and I/O queues), Property Get/Set, Disconnect.

use std::sync::Arc;

use nvme_wire::fabrics::{
    CNTLID_DYNAMIC, ConnectCmd, ConnectData, ConnectDataError, DISCOVERY_NQN,
};
use nvme_wire::fabrics::{
    CONNECT_DATA_OFF_CNTLID, CONNECT_DATA_OFF_HOSTNQN, CONNECT_DATA_OFF_SUBNQN,
    CONNECT_SQE_OFF_QID, CONNECT_SQE_OFF_SQSIZE,
};
use nvme_wire::status::{self, Status};

use crate::Target;
use crate::controller::{Controller, CtrlKind};

/// A refused Connect: the status and dword 0 (IATTR/IPO for invalid parameters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectError {
    pub status: Status,
    pub dw0: u32,
}

/// Connect response dword 0 for a bad parameter: IPO (byte offset of the
/// field) in bits 15:0, IATTR in bits 23:16 (1 = in the Connect data, 0 = in the SQE).
pub fn ipo_iattr(in_data: bool, ipo: u16) -> u32 {
    u32::from(ipo) | (u32::from(in_data) << 16)
}

/// "Connect Invalid Parameters" pointing at a field.
fn invalid_param(in_data: bool, ipo: u16) -> ConnectError {
    ConnectError {
        status: Status::cmd_specific(status::SC_CONNECT_INVALID_PARAM),
        dw0: ipo_iattr(in_data, ipo),
    }
}

fn plain(status: Status) -> ConnectError {
    ConnectError { status, dw0: 0 }
}

pub fn decode_connect_data(b: &[u8]) -> Result<ConnectData, ConnectError> {
    ConnectData::decode(b).map_err(|e| match e {
        ConnectDataError::Short => plain(Status::generic(status::SC_SGL_INVALID_DATA_LEN)),
        ConnectDataError::BadSubNqn => invalid_param(true, CONNECT_DATA_OFF_SUBNQN),
        ConnectDataError::BadHostNqn => invalid_param(true, CONNECT_DATA_OFF_HOSTNQN),
    })
}

fn check_sqsize(target: &Target, cmd: &ConnectCmd) -> Result<(), ConnectError> {
    // sqsize is 0-based; a queue needs at least two entries.
    if cmd.sqsize == 0 || u32::from(cmd.sqsize) + 1 > u32::from(target.transport.max_queue_depth) {
        return Err(invalid_param(false, CONNECT_SQE_OFF_SQSIZE));
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
        return Err(plain(Status::cmd_specific(status::SC_CONNECT_FORMAT)));
    }
    check_sqsize(target, cmd)?;
    if data.cntlid != CNTLID_DYNAMIC {
        return Err(invalid_param(true, CONNECT_DATA_OFF_CNTLID));
    }
    let kind = if data.subnqn == DISCOVERY_NQN {
        CtrlKind::Discovery
    } else {
        let Some(sub) = target.subsystem(&data.subnqn) else {
            tracing::info!(
                "connect to unknown subsystem {} from {}",
                data.subnqn,
                data.hostnqn
            );
            return Err(invalid_param(true, CONNECT_DATA_OFF_SUBNQN));
        };
        if !sub.host_allowed(&data.hostnqn) {
            tracing::warn!("host {} not allowed on {}", data.hostnqn, sub.nqn);
            return Err(ConnectError {
                status: Status::cmd_specific(status::SC_CONNECT_INVALID_HOST),
                dw0: ipo_iattr(true, CONNECT_DATA_OFF_HOSTNQN),
            });
        }
        CtrlKind::Io(sub.clone())
    };
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
        .ok_or(plain(Status::cmd_specific(status::SC_CONNECT_CTRL_BUSY)))?;
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
        return Err(plain(Status::cmd_specific(status::SC_CONNECT_FORMAT)));
    }
    let Some(ctrl) = target.controller(data.cntlid) else {
        return Err(invalid_param(true, CONNECT_DATA_OFF_CNTLID));
    };
    if ctrl.subnqn() != data.subnqn {
        return Err(invalid_param(true, CONNECT_DATA_OFF_SUBNQN));
    }
    if ctrl.hostnqn != data.hostnqn {
        return Err(invalid_param(true, CONNECT_DATA_OFF_HOSTNQN));
    }
    if ctrl.is_discovery() {
        return Err(invalid_param(false, CONNECT_SQE_OFF_QID));
    }
    check_sqsize(target, cmd)?;
    let mut st = ctrl.state.lock();
    if st.csts & nvme_wire::fabrics::prop::CSTS_RDY == 0 {
        return Err(plain(Status::generic(status::SC_CMD_SEQ_ERROR)));
    }
    let limit = if st.io_queues_granted > 0 {
        st.io_queues_granted
    } else {
        target.transport.max_io_queues
    };
    let qid = usize::from(cmd.qid);
    if cmd.qid == 0 || cmd.qid > limit || st.io_queues.get(qid).copied().unwrap_or(true) {
        return Err(invalid_param(false, CONNECT_SQE_OFF_QID));
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

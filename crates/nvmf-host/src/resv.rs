//! Reservation commands on an I/O queue: Register (0Dh), Acquire (11h),
//! Release (15h) and Report (0Eh, extended data structure with 128-bit host
//! identifiers, the only one our target and hosts with a 128-bit Host ID
//! use). The registrant is the host identified by the Connect's Host ID.
//!
//! A refused command comes back as [`HostError::Status`]; a Reservation
//! Conflict (SCT 0, SC 83h) is recognised by
//! [`HostError::is_reservation_conflict`].

use nvme_wire::reservation::{
    AcquireAction, AcquireCdw10, AcquireData, REPORT_EXT_ENTRY_LEN, REPORT_EXT_HEADER_LEN,
    RegisterAction, RegisterCdw10, RegisterData, RegisteredCtrl, ReleaseAction, ReleaseCdw10,
    ReleaseData, ReportCmd, ReportHeader, ResvType, decode_report_ext,
};
use nvme_wire::sqe::{Sqe, io_opc};

use crate::error::{HostError, Result};
use crate::io::IoQueue;
use crate::queue::{buf_from, zeroed_buf};
use crate::slot::DataDir;

/// What Reservation Report returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationStatus {
    /// Generation (PRGEN).
    pub generation: u32,
    /// The reservation held now, if any.
    pub rtype: Option<ResvType>,
    /// Persist Through Power Loss state.
    pub ptpls: bool,
    /// Every registered controller, with its host's ID and key.
    pub registrants: Vec<RegisteredCtrl>,
}

impl ReservationStatus {
    /// The holder's registration (for an all-registrants type: the first one).
    pub fn holder(&self) -> Option<&RegisteredCtrl> {
        self.registrants.iter().find(|r| r.holds)
    }

    /// The key registered by host `hostid`, if it is registered.
    pub fn key_of(&self, hostid: &[u8; 16]) -> Option<u64> {
        self.registrants
            .iter()
            .find(|r| &r.hostid == hostid)
            .map(|r| r.rkey)
    }
}

impl From<(ReportHeader, Vec<RegisteredCtrl>)> for ReservationStatus {
    fn from((h, registrants): (ReportHeader, Vec<RegisteredCtrl>)) -> Self {
        ReservationStatus {
            generation: h.generation,
            rtype: ResvType::from_raw(h.rtype),
            ptpls: h.ptpls,
            registrants,
        }
    }
}

impl IoQueue {
    /// Reservation Register: `Register` registers `nrkey`, `Unregister`
    /// removes the registration (`crkey` must match unless `iekey`),
    /// `Replace` swaps `crkey` for `nrkey`. `cptpl` is one of
    /// `nvme_wire::reservation::cptpl` (0: no change).
    pub async fn resv_register(
        &self,
        nsid: u32,
        action: RegisterAction,
        crkey: u64,
        nrkey: u64,
        iekey: bool,
        cptpl: u8,
    ) -> Result<()> {
        let mut sqe = Sqe::new(io_opc::RESV_REGISTER, 0);
        sqe.nsid = nsid;
        sqe.cdw10 = RegisterCdw10 {
            rrega: action as u8,
            iekey,
            cptpl,
        }
        .encode();
        let data = buf_from(&RegisterData { crkey, nrkey }.encode());
        self.run(sqe, DataDir::FromHost, data, || {
            format!("Reservation Register ({action:?}) nsid {nsid}")
        })
        .await
        .1
    }

    /// Reservation Acquire: `Acquire` takes a reservation of `rtype` with
    /// our key `crkey`; `Preempt` / `PreemptAndAbort` remove the
    /// registrations with key `prkey` (and take the reservation from its
    /// holder); the abort variant also ends their commands in flight.
    pub async fn resv_acquire(
        &self,
        nsid: u32,
        action: AcquireAction,
        rtype: ResvType,
        crkey: u64,
        prkey: u64,
        iekey: bool,
    ) -> Result<()> {
        let mut sqe = Sqe::new(io_opc::RESV_ACQUIRE, 0);
        sqe.nsid = nsid;
        sqe.cdw10 = AcquireCdw10 {
            racqa: action as u8,
            iekey,
            rtype: rtype.raw(),
        }
        .encode();
        let data = buf_from(&AcquireData { crkey, prkey }.encode());
        self.run(sqe, DataDir::FromHost, data, || {
            format!("Reservation Acquire ({action:?}, {rtype:?}) nsid {nsid}")
        })
        .await
        .1
    }

    /// Reservation Release: `Release` gives up our reservation of `rtype`;
    /// `Clear` removes the reservation and every registration.
    pub async fn resv_release(
        &self,
        nsid: u32,
        action: ReleaseAction,
        rtype: ResvType,
        crkey: u64,
        iekey: bool,
    ) -> Result<()> {
        let mut sqe = Sqe::new(io_opc::RESV_RELEASE, 0);
        sqe.nsid = nsid;
        sqe.cdw10 = ReleaseCdw10 {
            rrela: action as u8,
            iekey,
            rtype: rtype.raw(),
        }
        .encode();
        let data = buf_from(&ReleaseData { crkey }.encode());
        self.run(sqe, DataDir::FromHost, data, || {
            format!("Reservation Release ({action:?}) nsid {nsid}")
        })
        .await
        .1
    }

    /// Reservation Report, extended data structure (EDS = 1): reads room for
    /// 63 registrants first and again with room for all if there are more.
    pub async fn resv_report(&self, nsid: u32) -> Result<ReservationStatus> {
        let mut len = 4096;
        loop {
            let r = ReportCmd::for_len(len, true);
            let mut sqe = Sqe::new(io_opc::RESV_REPORT, 0);
            sqe.nsid = nsid;
            (sqe.cdw10, sqe.cdw11) = r.encode();
            let (buf, res) = self
                .run(sqe, DataDir::ToHost, zeroed_buf(len), || {
                    format!("Reservation Report nsid {nsid}")
                })
                .await;
            res?;
            let (h, ctrls) = decode_report_ext(&buf)
                .map_err(|e| HostError::Invalid(format!("Reservation Report nsid {nsid}: {e}")))?;
            let need = REPORT_EXT_HEADER_LEN + usize::from(h.regctl) * REPORT_EXT_ENTRY_LEN;
            if need <= len {
                return Ok((h, ctrls).into());
            }
            len = need.next_multiple_of(4096);
        }
    }
}

//! I/O commands: Read, Write, Flush, Write Zeroes, Dataset Management.
//! `plan` checks a command completely before any data moves, so a bad LBA or
//! NSID never costs an R2T round trip.

use std::sync::Arc;

use blockdev::{AlignedBuf, BlockDevice, BlockError, BlockOp, IoDone, IoFuture, IoRequest};
use nvme_wire::sqe::{DSM_ATTR_DEALLOCATE, DSM_RANGE_LEN, DsmRange, Sqe, io_opc};
use nvme_wire::status::{self, Status};

use crate::ana::AnaGroups;
use crate::resv_cmd::ResvCmd;

use crate::subsystem::Namespace;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoPlan {
    Read {
        lba: u64,
        blocks: u32,
    },
    Write {
        lba: u64,
        blocks: u32,
        fua: bool,
    },
    Flush,
    WriteZeroes {
        lba: u64,
        blocks: u32,
    },
    /// `ranges` range descriptors follow as host data.
    Dsm {
        ranges: u32,
        deallocate: bool,
    },
    /// Reservation Register, Acquire, Release or Report: run by the core,
    /// not the device.
    Reservation(ResvCmd),
}

impl IoPlan {
    /// Write, Write Zeroes, Dataset Management: the commands the stale
    /// write audit counts (see `NsReservations::check_write`).
    pub fn modifies_data(&self) -> bool {
        matches!(
            self,
            IoPlan::Write { .. } | IoPlan::WriteZeroes { .. } | IoPlan::Dsm { .. }
        )
    }
    /// Bytes the host sends (write data, DSM ranges).
    pub fn host_to_ctrl_len(&self, block_size: u32) -> u32 {
        match *self {
            IoPlan::Write { blocks, .. } => blocks * block_size,
            IoPlan::Dsm { ranges, .. } => ranges * DSM_RANGE_LEN as u32,
            IoPlan::Reservation(c) => c.host_to_ctrl_len(),
            _ => 0,
        }
    }
    /// Bytes the controller returns (read data).
    pub fn ctrl_to_host_len(&self, block_size: u32) -> u32 {
        match *self {
            IoPlan::Read { blocks, .. } => blocks * block_size,
            // Bounded by the transfer limit in `plan`.
            IoPlan::Reservation(c) => c.ctrl_to_host_len() as u32,
            _ => 0,
        }
    }
}

/// An I/O command that failed: its status and the LBA for the error log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoReject {
    pub status: Status,
    pub lba: u64,
}

fn reject(sc: u8, lba: u64) -> IoReject {
    IoReject {
        status: Status::generic(sc),
        lba,
    }
}

impl crate::Target {
    /// `plan` with this target's ANA states and transfer limit.
    #[inline]
    pub(crate) fn plan_io<'a>(
        &self,
        namespaces: &'a [Namespace],
        sqe: &Sqe,
    ) -> Result<(&'a Namespace, IoPlan), IoReject> {
        plan(&self.ana, namespaces, sqe, self.transport.max_transfer)
    }
}

/// Validates an I/O command against its namespace, the namespace's ANA
/// group state, and the transfer limit.
pub fn plan<'a>(
    ana: &AnaGroups,
    namespaces: &'a [Namespace],
    sqe: &Sqe,
    max_transfer: u32,
) -> Result<(&'a Namespace, IoPlan), IoReject> {
    let resv = ResvCmd::from_sqe(sqe);
    let known = matches!(
        sqe.opcode,
        io_opc::FLUSH
            | io_opc::WRITE
            | io_opc::READ
            | io_opc::WRITE_ZEROES
            | io_opc::DATASET_MANAGEMENT
    ) || resv.is_some();
    if !known {
        return Err(reject(status::SC_INVALID_OPCODE, 0));
    }
    let Some(ns) = crate::subsystem::find_namespace(namespaces, sqe.nsid) else {
        return Err(reject(status::SC_INVALID_NS, 0));
    };
    // Before any other check, as nvmet: a host must retry on another path
    // whatever else is wrong with the command here.
    ana.io_gate(ns.ana_group)
        .map_err(|status| IoReject { status, lba: 0 })?;
    let range = |lba: u64, blocks: u32| -> Result<(), IoReject> {
        match lba.checked_add(u64::from(blocks)) {
            Some(end) if end <= ns.num_blocks => Ok(()),
            _ => Err(reject(status::SC_LBA_RANGE, lba)),
        }
    };
    let plan = match sqe.opcode {
        io_opc::READ | io_opc::WRITE => {
            let (lba, blocks) = (sqe.slba(), sqe.nlb());
            range(lba, blocks)?;
            if u64::from(blocks) * u64::from(ns.block_size) > u64::from(max_transfer) {
                return Err(reject(status::SC_INVALID_FIELD, lba));
            }
            if sqe.opcode == io_opc::READ {
                IoPlan::Read { lba, blocks }
            } else {
                IoPlan::Write {
                    lba,
                    blocks,
                    fua: sqe.fua(),
                }
            }
        }
        io_opc::FLUSH => IoPlan::Flush,
        _ if let Some(cmd) = resv => {
            if cmd.ctrl_to_host_len() > u64::from(max_transfer) {
                return Err(reject(status::SC_INVALID_FIELD, 0));
            }
            IoPlan::Reservation(cmd)
        }
        io_opc::WRITE_ZEROES => {
            let (lba, blocks) = (sqe.slba(), sqe.nlb());
            range(lba, blocks)?;
            IoPlan::WriteZeroes { lba, blocks }
        }
        _ => IoPlan::Dsm {
            ranges: (sqe.cdw10 & 0xFF) + 1,
            deallocate: sqe.cdw11 & DSM_ATTR_DEALLOCATE != 0,
        },
    };
    Ok((ns, plan))
}

/// Tells namespace instances apart: the address of their shared
/// reservation state, made once per `Namespace::new`.
pub(crate) fn ns_instance(ns: &Namespace) -> usize {
    Arc::as_ptr(&ns.resv) as usize
}

/// Decodes and checks DSM ranges against the namespace.
pub fn dsm_ranges(ns: &Namespace, data: &[u8], count: u32) -> Result<Vec<DsmRange>, IoReject> {
    let mut out = Vec::with_capacity(count as usize);
    for i in 0..count as usize {
        let r = DsmRange::decode(&data[i * DSM_RANGE_LEN..])
            .map_err(|_| reject(status::SC_SGL_INVALID_DATA_LEN, 0))?;
        match r.slba.checked_add(u64::from(r.nlb)) {
            Some(end) if end <= ns.num_blocks => {}
            _ => return Err(reject(status::SC_LBA_RANGE, r.slba)),
        }
        if r.nlb > 0 {
            out.push(r);
        }
    }
    Ok(out)
}

/// Deallocates `ranges` one after another; the first failure ends it.
pub fn deallocate_all(
    dev: Arc<dyn BlockDevice>,
    ranges: Vec<DsmRange>,
    buf: AlignedBuf,
) -> IoFuture {
    IoFuture::Pending(Box::pin(async move {
        let mut buf = buf;
        for r in ranges {
            let d = dev
                .submit(IoRequest {
                    op: BlockOp::Deallocate,
                    lba: r.slba,
                    blocks: r.nlb,
                    buf,
                })
                .await;
            buf = d.buf;
            if d.result.is_err() {
                return IoDone {
                    buf,
                    result: d.result,
                };
            }
        }
        IoDone {
            buf,
            result: Ok(()),
        }
    }))
}

impl IoPlan {
    /// What the command costs against its namespace's QoS limits: reads
    /// and writes count against their side and the total; Write Zeroes and
    /// Dataset Management as write commands without bytes; Flush and
    /// reservation commands are never held.
    pub fn qos_cost(&self, block_size: u32) -> Option<crate::qos::QosCost> {
        use crate::qos::QosCost;
        let bytes = |blocks: u32| u64::from(blocks) * u64::from(block_size);
        match *self {
            IoPlan::Read { blocks, .. } => Some(QosCost::read(bytes(blocks))),
            IoPlan::Write { blocks, .. } => Some(QosCost::write(bytes(blocks))),
            IoPlan::WriteZeroes { .. } | IoPlan::Dsm { .. } => Some(QosCost::write(0)),
            IoPlan::Flush | IoPlan::Reservation(_) => None,
        }
    }
}

/// The status a failed backend I/O reports to the host.
pub fn status_of(err: &BlockError, op: BlockOp) -> Status {
    match err {
        BlockError::OutOfRange { .. } => Status::generic(status::SC_LBA_RANGE),
        BlockError::NoSpace => Status::generic(status::SC_CAP_EXCEEDED),
        // Retrying cannot help: the namespace is a snapshot.
        BlockError::ReadOnly(_) => Status {
            dnr: true,
            ..Status::generic(status::SC_NS_WRITE_PROTECTED)
        },
        BlockError::Io(_) | BlockError::IdentityChanged(_) => match op {
            BlockOp::Read => Status::media(status::SC_UNRECOVERED_READ),
            _ => Status::media(status::SC_WRITE_FAULT),
        },
        // A volume beyond its redundancy (it has failed): the same media
        // errors, with Do Not Retry, as no retry can succeed until an
        // operator brings members back.
        BlockError::TooManyFailed { .. } => Status {
            dnr: true,
            ..match op {
                BlockOp::Read => Status::media(status::SC_UNRECOVERED_READ),
                _ => Status::media(status::SC_WRITE_FAULT),
            }
        },
        BlockError::ReservationConflict(_) => Status::generic(status::SC_RESERVATION_CONFLICT),
        // A fenced owner must send the host to another path, never fail its I/O for good.
        BlockError::Fenced(_) => Status::path(status::SC_ANA_INACCESSIBLE),
        // Retryable: the device may come back (a member's limit is the volume's business).
        BlockError::Unreachable { .. } => Status::generic(status::SC_NS_NOT_READY).retryable(),
        BlockError::BufferTooSmall { .. } | BlockError::Config(_) => {
            Status::generic(status::SC_INTERNAL)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns() -> Vec<Namespace> {
        let dev = Arc::new(blockdev::NullDevice::new(1 << 20, 512).unwrap());
        vec![Namespace::new(1, dev, [1; 16], [2; 16])]
    }

    fn rw(opc: u8, nsid: u32, slba: u64, nlb: u32) -> Sqe {
        let mut s = Sqe::new(opc, 1);
        s.nsid = nsid;
        s.cdw10 = slba as u32;
        s.cdw11 = (slba >> 32) as u32;
        s.cdw12 = nlb - 1;
        s
    }

    #[test]
    fn a_failed_volume_answers_media_errors_without_retry() {
        let e = BlockError::TooManyFailed {
            volume: "z".into(),
            layout: "raid0".into(),
            failed: vec![1],
            tolerates: 0,
        };
        let r = status_of(&e, BlockOp::Read);
        assert_eq!((r.sct, r.sc, r.dnr), (2, status::SC_UNRECOVERED_READ, true));
        let w = status_of(&e, BlockOp::Write { fua: false });
        assert_eq!((w.sct, w.sc, w.dnr), (2, status::SC_WRITE_FAULT, true));
        let f = status_of(&e, BlockOp::Flush);
        assert_eq!((f.sc, f.dnr), (status::SC_WRITE_FAULT, true));
    }

    #[test]
    fn flush_and_reservations_cost_no_qos() {
        assert_eq!(IoPlan::Flush.qos_cost(512), None);
        let wz = IoPlan::WriteZeroes { lba: 0, blocks: 8 }
            .qos_cost(512)
            .unwrap();
        assert_eq!(wz, crate::qos::QosCost::write(0));
        let r = IoPlan::Read { lba: 0, blocks: 8 }.qos_cost(512).unwrap();
        assert_eq!(r, crate::qos::QosCost::read(4096));
    }

    #[test]
    fn a_write_to_a_snapshot_answers_write_protected_without_retry() {
        let e = BlockError::ReadOnly("snapshot s".into());
        let w = status_of(&e, BlockOp::Write { fua: false });
        assert_eq!(
            (w.sct, w.sc, w.dnr),
            (0, status::SC_NS_WRITE_PROTECTED, true)
        );
    }

    #[test]
    fn checks_nsid_range_and_mdts() {
        let n = ns();
        let ana = AnaGroups::default();
        let p = |s: &Sqe| plan(&ana, &n, s, 64 * 1024).map(|(_, p)| p);
        assert_eq!(
            p(&rw(io_opc::READ, 1, 0, 8)),
            Ok(IoPlan::Read { lba: 0, blocks: 8 })
        );
        assert_eq!(
            p(&rw(io_opc::READ, 2, 0, 8)).unwrap_err().status.sc,
            status::SC_INVALID_NS
        );
        assert_eq!(
            p(&rw(io_opc::READ, 1, 2047, 2)).unwrap_err().status.sc,
            status::SC_LBA_RANGE
        );
        assert_eq!(
            p(&rw(io_opc::WRITE, 1, u64::MAX, 1)).unwrap_err().status.sc,
            status::SC_LBA_RANGE
        );
        assert_eq!(
            p(&rw(io_opc::WRITE, 1, 0, 256)).unwrap_err().status.sc,
            status::SC_INVALID_FIELD
        );
        assert_eq!(
            p(&rw(0x06, 1, 0, 1)).unwrap_err().status.sc,
            status::SC_INVALID_OPCODE
        );
    }

    #[test]
    fn dsm_ranges_are_checked() {
        let n = ns();
        let mut data = vec![0u8; 32];
        DsmRange {
            attributes: 0,
            nlb: 8,
            slba: 0,
        }
        .encode(&mut data[..16]);
        DsmRange {
            attributes: 0,
            nlb: 8,
            slba: 2044,
        }
        .encode(&mut data[16..]);
        assert_eq!(
            dsm_ranges(&n[0], &data, 2).unwrap_err().status.sc,
            status::SC_LBA_RANGE
        );
        assert_eq!(dsm_ranges(&n[0], &data, 1).unwrap().len(), 1);
    }
}

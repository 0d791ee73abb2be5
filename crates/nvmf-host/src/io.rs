//! I/O commands on one I/O queue: Read, Write, Flush, Write Zeroes, Dataset
//! Management (deallocate).
//!
//! The `*_buf` methods move an owned, 4 KiB-aligned buffer (the
//! `BlockDevice` request's own) through the queue and hand it back: write
//! data goes from it to the socket and read data lands in it, with no copy
//! in between. The slice methods copy through a small per-queue pool.

use blockdev::AlignedBuf;
use nvme_wire::sqe::{DSM_ATTR_DEALLOCATE, DSM_RANGE_LEN, DsmRange, Sqe, io_opc};
use parking_lot::Mutex;

use crate::conn::command_name;
use crate::error::{CmdStatus, HostError, Result};
use crate::queue::{Queue, zeroed_buf};
use crate::slot::DataDir;

/// Most blocks one Read/Write/Write Zeroes moves (NLB is a 16-bit 0-based field).
pub const MAX_NLB: u32 = 65536;
/// Most ranges in one Dataset Management command.
pub const MAX_DSM_RANGES: usize = 256;
/// Buffers kept for the slice methods.
const POOL_KEEP: usize = 32;
/// Force Unit Access: Read/Write command dword 12 bit 30.
pub const RW_FUA: u32 = 1 << 30;

/// A connected I/O queue.
pub struct IoQueue {
    q: Queue,
    qid: u16,
    pool: Mutex<Vec<AlignedBuf>>,
}

impl IoQueue {
    pub(crate) fn new(q: Queue, qid: u16) -> Self {
        IoQueue {
            q,
            qid,
            pool: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn queue(&self) -> &Queue {
        &self.q
    }

    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// Commands this queue keeps in flight at most; more wait for a free slot.
    pub fn depth(&self) -> u16 {
        self.q.params().depth
    }

    /// Write data up to this size travels in the command capsule.
    pub fn in_capsule_limit(&self) -> u32 {
        self.q.params().icd_limit
    }

    /// The error that ended this queue's connection, if it ended.
    pub fn error(&self) -> Option<HostError> {
        self.q.dead()
    }

    /// Reads `nlb` blocks at `slba` into `buf`; its length is the transfer size.
    pub async fn read_buf(
        &self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        buf: AlignedBuf,
    ) -> (AlignedBuf, Result<()>) {
        self.rw(io_opc::READ, nsid, slba, nlb, 0, buf).await
    }

    /// Writes `buf` (its length is the transfer size) to `nlb` blocks at `slba`.
    pub async fn write_buf(
        &self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        buf: AlignedBuf,
    ) -> (AlignedBuf, Result<()>) {
        self.write_buf_fua(nsid, slba, nlb, false, buf).await
    }

    /// [`IoQueue::write_buf`] with Force Unit Access: durable before it completes.
    pub async fn write_buf_fua(
        &self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        fua: bool,
        buf: AlignedBuf,
    ) -> (AlignedBuf, Result<()>) {
        let flags = if fua { RW_FUA } else { 0 };
        self.rw(io_opc::WRITE, nsid, slba, nlb, flags, buf).await
    }

    pub async fn read(&self, nsid: u32, slba: u64, nlb: u32, dst: &mut [u8]) -> Result<()> {
        let b = self.pool_get(dst.len());
        let (b, r) = self.read_buf(nsid, slba, nlb, b).await;
        if r.is_ok() {
            dst.copy_from_slice(&b);
        }
        self.pool_put(b);
        r
    }

    pub async fn write(&self, nsid: u32, slba: u64, nlb: u32, src: &[u8]) -> Result<()> {
        let mut b = self.pool_get(src.len());
        b.copy_from_slice(src);
        let (b, r) = self.write_buf(nsid, slba, nlb, b).await;
        self.pool_put(b);
        r
    }

    pub async fn flush(&self, nsid: u32) -> Result<()> {
        let mut sqe = Sqe::new(io_opc::FLUSH, 0);
        sqe.nsid = nsid;
        self.run(sqe, DataDir::None, AlignedBuf::empty(), || {
            format!("Flush nsid {nsid}")
        })
        .await
        .1
    }

    pub async fn write_zeroes(&self, nsid: u32, slba: u64, nlb: u32) -> Result<()> {
        let sqe = rw_sqe(io_opc::WRITE_ZEROES, nsid, slba, nlb)?;
        self.run(sqe, DataDir::None, AlignedBuf::empty(), || {
            format!("Write Zeroes nsid {nsid} LBA {slba}+{nlb}")
        })
        .await
        .1
    }

    /// Dataset Management, attribute Deallocate, over `(slba, nlb)` ranges.
    pub async fn deallocate(&self, nsid: u32, ranges: &[(u64, u32)]) -> Result<()> {
        if ranges.is_empty() || ranges.len() > MAX_DSM_RANGES {
            return Err(HostError::Invalid(format!(
                "deallocate takes 1 to {MAX_DSM_RANGES} ranges, got {}",
                ranges.len()
            )));
        }
        let mut data = zeroed_buf(ranges.len() * DSM_RANGE_LEN);
        for (i, &(slba, nlb)) in ranges.iter().enumerate() {
            DsmRange {
                attributes: 0,
                nlb,
                slba,
            }
            .encode(&mut data[i * DSM_RANGE_LEN..]);
        }
        let mut sqe = Sqe::new(io_opc::DATASET_MANAGEMENT, 0);
        sqe.nsid = nsid;
        sqe.cdw10 = (ranges.len() - 1) as u32;
        sqe.cdw11 = DSM_ATTR_DEALLOCATE;
        self.run(sqe, DataDir::FromHost, data, || {
            format!(
                "Dataset Management (deallocate) nsid {nsid}, {} ranges",
                ranges.len()
            )
        })
        .await
        .1
    }

    /// Closes the connection; commands in flight fail.
    pub fn close(&self) {
        self.q.close();
    }

    pub(crate) async fn close_and_wait(&self) {
        self.q.close_and_wait().await;
    }

    async fn rw(
        &self,
        opc: u8,
        nsid: u32,
        slba: u64,
        nlb: u32,
        cdw12_flags: u32,
        buf: AlignedBuf,
    ) -> (AlignedBuf, Result<()>) {
        let sqe = match rw_sqe(opc, nsid, slba, nlb) {
            Ok(mut s) => {
                s.cdw12 |= cdw12_flags;
                s
            }
            Err(e) => return (buf, Err(e)),
        };
        if buf.is_empty() {
            return (
                buf,
                Err(HostError::Invalid(
                    "a read or write needs a non-empty buffer".into(),
                )),
            );
        }
        let qid = self.qid;
        let dir = if opc == io_opc::READ {
            DataDir::ToHost
        } else {
            DataDir::FromHost
        };
        self.run(sqe, dir, buf, || {
            format!(
                "{} nsid {nsid} LBA {slba}+{nlb} on queue {qid}",
                command_name(qid, opc, None)
            )
        })
        .await
    }

    pub(crate) async fn run(
        &self,
        sqe: Sqe,
        dir: DataDir,
        buf: AlignedBuf,
        what: impl FnOnce() -> String,
    ) -> (AlignedBuf, Result<()>) {
        let (buf, r) = self.q.execute(sqe, dir, buf).await;
        let r = match r {
            Err(e) => Err(e),
            Ok(resp) if resp.status.is_success() => Ok(()),
            Ok(resp) => Err(HostError::Status {
                addr: self.q.params().addr,
                what: what(),
                status: CmdStatus {
                    status: resp.status,
                    fabrics: false,
                },
            }),
        };
        (buf, r)
    }

    /// A buffer of `len` bytes in use, from the pool when one is big enough.
    fn pool_get(&self, len: usize) -> AlignedBuf {
        let b = {
            let mut p = self.pool.lock();
            p.iter()
                .position(|b| b.capacity() >= len)
                .map(|i| p.swap_remove(i))
        };
        match b {
            Some(mut b) => {
                b.set_len(len);
                b
            }
            None => zeroed_buf(len),
        }
    }

    /// Keeps `b` for the slice methods; a view of a shared buffer (whose
    /// memory is its parent's) is dropped instead.
    fn pool_put(&self, b: AlignedBuf) {
        let mut p = self.pool.lock();
        if p.len() < POOL_KEEP && b.capacity() > 0 && !b.is_view() {
            p.push(b);
        }
    }
}

fn rw_sqe(opc: u8, nsid: u32, slba: u64, nlb: u32) -> Result<Sqe> {
    if nlb == 0 || nlb > MAX_NLB {
        return Err(HostError::Invalid(format!(
            "block count {nlb} is out of range; one command moves 1 to {MAX_NLB} blocks"
        )));
    }
    let mut s = Sqe::new(opc, 0);
    s.nsid = nsid;
    s.cdw10 = slba as u32;
    s.cdw11 = (slba >> 32) as u32;
    s.cdw12 = nlb - 1;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rw_fields() {
        let s = rw_sqe(io_opc::WRITE, 2, 0x1_0000_0005, 8).unwrap();
        assert_eq!((s.nsid, s.slba(), s.nlb()), (2, 0x1_0000_0005, 8));
        assert!(rw_sqe(io_opc::READ, 1, 0, 0).is_err());
        assert!(rw_sqe(io_opc::READ, 1, 0, MAX_NLB + 1).is_err());
        assert_eq!(rw_sqe(io_opc::READ, 1, 0, MAX_NLB).unwrap().nlb(), MAX_NLB);
    }
}

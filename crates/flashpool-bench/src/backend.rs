//! The I/O one job issues: through an NVMe/TCP I/O queue of its own, or to a
//! `BlockDevice` (file/block device through io_uring, RAM, or a remote
//! namespace). Both move the same 4 KiB-aligned owned buffers
//! ([`AlignedBuf`]) that travel with the I/O, so a job reuses the same few
//! buffers, and over TCP they go to the socket and come back from it with no
//! copy (the path `nvmf_host::remote::RemoteDevice` takes too).

use std::future::Future;
use std::sync::Arc;

use anyhow::Result;
use blockdev::{AlignedBuf, BlockDevice, BlockOp, IoRequest};
use nvmf_host::IoQueue;

pub(crate) trait JobIo {
    fn alloc(&self, len: usize) -> AlignedBuf {
        nvmf_host::zeroed_buf(len)
    }
    fn read(
        &self,
        lba: u64,
        nlb: u32,
        buf: AlignedBuf,
    ) -> impl Future<Output = (AlignedBuf, Result<()>)>;
    fn write(
        &self,
        lba: u64,
        nlb: u32,
        buf: AlignedBuf,
    ) -> impl Future<Output = (AlignedBuf, Result<()>)>;
}

/// One NVMe/TCP I/O queue of the job's own, connected on the job's thread:
/// the bench keeps its per-job queue and thread placement, which a
/// `RemoteDevice` (queues on its own runtime) would not.
pub(crate) struct TcpIo {
    pub q: Arc<IoQueue>,
    pub nsid: u32,
}

impl JobIo for TcpIo {
    async fn read(&self, lba: u64, nlb: u32, buf: AlignedBuf) -> (AlignedBuf, Result<()>) {
        let (b, r) = self.q.read_buf(self.nsid, lba, nlb, buf).await;
        (b, r.map_err(Into::into))
    }

    async fn write(&self, lba: u64, nlb: u32, buf: AlignedBuf) -> (AlignedBuf, Result<()>) {
        let (b, r) = self.q.write_buf(self.nsid, lba, nlb, buf).await;
        (b, r.map_err(Into::into))
    }
}

/// A device, shared by the jobs.
pub(crate) struct DevIo {
    pub dev: Arc<dyn BlockDevice>,
}

impl DevIo {
    async fn io(
        &self,
        op: BlockOp,
        lba: u64,
        blocks: u32,
        buf: AlignedBuf,
    ) -> (AlignedBuf, Result<()>) {
        let done = self
            .dev
            .submit(IoRequest {
                op,
                lba,
                blocks,
                buf,
            })
            .await;
        (done.buf, done.result.map_err(Into::into))
    }
}

impl JobIo for DevIo {
    async fn read(&self, lba: u64, nlb: u32, buf: AlignedBuf) -> (AlignedBuf, Result<()>) {
        self.io(BlockOp::Read, lba, nlb, buf).await
    }

    async fn write(&self, lba: u64, nlb: u32, buf: AlignedBuf) -> (AlignedBuf, Result<()>) {
        self.io(BlockOp::Write { fua: false }, lba, nlb, buf).await
    }
}

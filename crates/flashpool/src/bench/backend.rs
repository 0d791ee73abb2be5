//! The I/O one job issues: through an NVMe/TCP I/O queue, or to a local
//! `BlockDevice` (file/block device through io_uring, or RAM). Buffers are
//! owned and travel with the I/O, so a job reuses the same few buffers.

use std::future::Future;
use std::ops::DerefMut;
use std::sync::Arc;

use anyhow::Result;
use blockdev::{AlignedBuf, BlockDevice, BlockOp, IoRequest};
use nvmf_host::IoQueue;

pub(crate) trait JobIo {
    type Buf: DerefMut<Target = [u8]> + 'static;
    fn alloc(&self, len: usize) -> Self::Buf;
    fn read(
        &self,
        lba: u64,
        nlb: u32,
        buf: Self::Buf,
    ) -> impl Future<Output = (Self::Buf, Result<()>)>;
    fn write(
        &self,
        lba: u64,
        nlb: u32,
        buf: Self::Buf,
    ) -> impl Future<Output = (Self::Buf, Result<()>)>;
}

/// One NVMe/TCP I/O queue of the job's own.
pub(crate) struct TcpIo {
    pub q: Arc<IoQueue>,
    pub nsid: u32,
}

impl JobIo for TcpIo {
    type Buf = Vec<u8>;

    fn alloc(&self, len: usize) -> Vec<u8> {
        vec![0; len]
    }

    async fn read(&self, lba: u64, nlb: u32, buf: Vec<u8>) -> (Vec<u8>, Result<()>) {
        let (b, r) = self.q.read_buf(self.nsid, lba, nlb, buf).await;
        (b, r.map_err(Into::into))
    }

    async fn write(&self, lba: u64, nlb: u32, buf: Vec<u8>) -> (Vec<u8>, Result<()>) {
        let (b, r) = self.q.write_buf(self.nsid, lba, nlb, buf).await;
        (b, r.map_err(Into::into))
    }
}

/// A local device, shared by the jobs.
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
    type Buf = AlignedBuf;

    fn alloc(&self, len: usize) -> AlignedBuf {
        let mut b = AlignedBuf::new(len);
        b.set_len(len);
        b
    }

    async fn read(&self, lba: u64, nlb: u32, buf: AlignedBuf) -> (AlignedBuf, Result<()>) {
        self.io(BlockOp::Read, lba, nlb, buf).await
    }

    async fn write(&self, lba: u64, nlb: u32, buf: AlignedBuf) -> (AlignedBuf, Result<()>) {
        self.io(BlockOp::Write { fua: false }, lba, nlb, buf).await
    }
}

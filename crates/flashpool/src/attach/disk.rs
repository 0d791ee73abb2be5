//! The attached disk: byte offsets of `DIR/disk` onto the blocks of a
//! [`BlockDevice`] (a remote namespace, RAM or a local file).
//!
//! Reads fetch the blocks that cover the range and hand back the bytes
//! asked for. Writes of whole blocks go straight through; a write that
//! starts or ends inside a block reads that block first and writes it back
//! whole (read-modify-write), under an exclusive range lock
//! ([`super::ranges`]) so that no concurrent write to the block is lost.
//! The file's size is the device's: a write past it is refused whole
//! (nothing is written), a read past it is short, as at the end of a file.

use std::ops::Range;
use std::sync::Arc;

use blockdev::{AlignedBuf, BlockDevice, BlockError, BlockOp, IoRequest};

use super::ranges::RangeLocks;

/// Most blocks one Deallocate or Write Zeroes request covers; a larger
/// punch is sent as several.
const ZERO_CHUNK_BLOCKS: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("{end} is past the end of the disk ({size} bytes): the disk does not grow")]
    PastEnd { end: u64, size: u64 },
    #[error(transparent)]
    Device(#[from] BlockError),
}

impl DiskError {
    /// The errno the file operation fails with.
    pub fn errno(&self) -> i32 {
        match self {
            DiskError::PastEnd { .. } => libc::EFBIG,
            DiskError::Device(BlockError::NoSpace) => libc::ENOSPC,
            DiskError::Device(BlockError::OutOfRange { .. }) => libc::EFBIG,
            DiskError::Device(_) => libc::EIO,
        }
    }
}

/// What a read returns: the blocks read, and the window of them asked for.
pub struct ReadOut {
    buf: AlignedBuf,
    range: Range<usize>,
}

impl std::ops::Deref for ReadOut {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.range.clone()]
    }
}

/// A write whose bytes are already copied into a block-aligned buffer (so
/// that the caller's slice may go), waiting to be run.
pub struct WriteJob {
    disk: Arc<Disk>,
    /// First block and how many.
    first: u64,
    blocks: u64,
    /// Bytes of the caller in `buf[head..head + len]`.
    head: usize,
    len: usize,
    buf: AlignedBuf,
}

pub struct Disk {
    dev: Arc<dyn BlockDevice>,
    bs: u64,
    size: u64,
    locks: Arc<RangeLocks>,
}

impl Disk {
    pub fn new(dev: Arc<dyn BlockDevice>) -> Arc<Disk> {
        let geo = dev.geometry();
        Arc::new(Disk {
            bs: u64::from(geo.block_size),
            size: geo.size_bytes(),
            dev,
            locks: Arc::default(),
        })
    }

    /// Bytes in the disk (the device's size).
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn block_size(&self) -> u32 {
        self.bs as u32
    }

    pub fn describe(&self) -> String {
        self.dev.describe()
    }

    /// Blocks `first..first + blocks` as `op`, on `buf` (the buffer comes back).
    async fn io(
        &self,
        op: BlockOp,
        first: u64,
        blocks: u64,
        buf: AlignedBuf,
    ) -> (AlignedBuf, Result<(), BlockError>) {
        let Ok(blocks) = u32::try_from(blocks) else {
            return (
                buf,
                Err(BlockError::OutOfRange {
                    lba: first,
                    blocks,
                    num_blocks: self.size / self.bs,
                }),
            );
        };
        let done = self
            .dev
            .submit(IoRequest {
                op,
                lba: first,
                blocks,
                buf,
            })
            .await;
        (done.buf, done.result)
    }

    /// Up to `len` bytes from `off`; fewer at the end of the disk, none past it.
    pub async fn read(&self, off: u64, len: u32) -> Result<ReadOut, DiskError> {
        let end = off.saturating_add(u64::from(len)).min(self.size);
        if off >= end {
            return Ok(ReadOut {
                buf: AlignedBuf::empty(),
                range: 0..0,
            });
        }
        let first = off / self.bs;
        let blocks = end.div_ceil(self.bs) - first;
        let mut buf = AlignedBuf::new((blocks * self.bs) as usize);
        buf.set_len((blocks * self.bs) as usize);
        let (buf, r) = self.io(BlockOp::Read, first, blocks, buf).await;
        r?;
        let head = (off - first * self.bs) as usize;
        Ok(ReadOut {
            buf,
            range: head..head + (end - off) as usize,
        })
    }

    /// Copies `data` (to go at `off`) into a block buffer; refuses a write
    /// that would pass the end of the disk.
    pub fn write(self: &Arc<Self>, off: u64, data: &[u8]) -> Result<WriteJob, DiskError> {
        let end = off
            .checked_add(data.len() as u64)
            .filter(|&e| e <= self.size)
            .ok_or(DiskError::PastEnd {
                end: off.saturating_add(data.len() as u64),
                size: self.size,
            })?;
        let first = off / self.bs;
        let blocks = end.div_ceil(self.bs) - first;
        let head = (off - first * self.bs) as usize;
        let mut buf = AlignedBuf::new((blocks * self.bs) as usize);
        buf.set_len((blocks * self.bs) as usize);
        buf[head..head + data.len()].copy_from_slice(data);
        Ok(WriteJob {
            disk: self.clone(),
            first,
            blocks,
            head,
            len: data.len(),
            buf,
        })
    }

    /// Makes every completed write durable (NVMe Flush).
    pub async fn flush(&self) -> Result<(), DiskError> {
        let (_, r) = self.io(BlockOp::Flush, 0, 0, AlignedBuf::empty()).await;
        Ok(r?)
    }

    /// `off..off + len` reads back as zeroes: whole blocks deallocated
    /// (`dealloc`, where the device promises zeroes after it) or written
    /// as zeroes, partial blocks at the edges written with zeroes. The
    /// range is cut at the end of the disk (as a punched hole is).
    pub async fn zero(
        self: &Arc<Self>,
        off: u64,
        len: u64,
        dealloc: bool,
    ) -> Result<(), DiskError> {
        let end = off.saturating_add(len).min(self.size);
        if off >= end {
            return Ok(());
        }
        let first_whole = off.div_ceil(self.bs);
        let end_whole = end / self.bs; // exclusive
        if first_whole >= end_whole {
            // Within one block (or across one boundary without a whole block).
            let zeroes = vec![0u8; (end - off) as usize];
            return self.write(off, &zeroes)?.run().await.map(|_| ());
        }
        if off < first_whole * self.bs {
            let zeroes = vec![0u8; (first_whole * self.bs - off) as usize];
            self.write(off, &zeroes)?.run().await?;
        }
        if end > end_whole * self.bs {
            let zeroes = vec![0u8; (end - end_whole * self.bs) as usize];
            self.write(end_whole * self.bs, &zeroes)?.run().await?;
        }
        let op = if dealloc && self.dev.deallocate_reads_zeroes() {
            BlockOp::Deallocate
        } else {
            BlockOp::WriteZeroes
        };
        let mut at = first_whole;
        while at < end_whole {
            let n = (end_whole - at).min(ZERO_CHUNK_BLOCKS);
            // Held exclusive: a read-modify-write beside it must not put back old bytes.
            let _g = self.locks.lock(at..=at + n - 1, true).await;
            let (_, r) = self.io(op, at, n, AlignedBuf::empty()).await;
            r?;
            at += n;
        }
        Ok(())
    }
}

impl WriteJob {
    /// Writes the blocks (reading the partial ones at the edges first);
    /// answers the bytes written.
    pub async fn run(mut self) -> Result<u32, DiskError> {
        let d = self.disk.clone();
        let bs = d.bs as usize;
        let tail = self.head + self.len;
        let last = self.first + self.blocks - 1;
        let partial_head = self.head != 0;
        let partial_tail = !tail.is_multiple_of(bs);
        let _g = d
            .locks
            .lock(self.first..=last, partial_head || partial_tail)
            .await;
        // Read-modify-write: the edge blocks' bytes outside the caller's range.
        let tail_at = (self.blocks as usize - 1) * bs;
        match (partial_head, partial_tail) {
            (true, true) if self.blocks == 1 => {
                self.merge_block(0, 0..self.head, Some(tail..bs)).await?
            }
            (head, tail_partial) => {
                if head {
                    self.merge_block(0, 0..self.head, None).await?;
                }
                if tail_partial {
                    self.merge_block(self.blocks - 1, tail - tail_at..bs, None)
                        .await?;
                }
            }
        }
        let buf = std::mem::replace(&mut self.buf, AlignedBuf::empty());
        let (_, r) = d
            .io(BlockOp::Write { fua: false }, self.first, self.blocks, buf)
            .await;
        r?;
        Ok(self.len as u32)
    }

    /// Reads block `i` of the job and copies `keep` and `also` (offsets
    /// within the block) from it into the job's buffer.
    async fn merge_block(
        &mut self,
        i: u64,
        keep: Range<usize>,
        also: Option<Range<usize>>,
    ) -> Result<(), DiskError> {
        let bs = self.disk.bs as usize;
        let mut one = AlignedBuf::new(bs);
        one.set_len(bs);
        let (one, r) = self.disk.io(BlockOp::Read, self.first + i, 1, one).await;
        r?;
        let at = i as usize * bs;
        for k in std::iter::once(keep).chain(also) {
            self.buf[at + k.start..at + k.end].copy_from_slice(&one[k.clone()]);
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "disk_tests.rs"]
mod tests;

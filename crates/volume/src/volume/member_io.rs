//! Member I/O: pooled aligned buffers, one I/O to a member (`dev_io`), a
//! batch of I/Os started together (`Batch`), and column reads and writes
//! in a member's data area.

use std::sync::Arc;

use blockdev::{
    AlignedBuf, BlockDevice, BlockError, BlockOp, Geometry, IoDone, IoFuture, IoRequest,
};
use futures_util::future::join_all;

use super::{Inner, OpError, View};
use crate::superblock::{MemberState, uuid_string};

thread_local! {
    /// Member I/O buffers for reuse, by power-of-two capacity class.
    static POOL: std::cell::RefCell<Vec<Vec<AlignedBuf>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}
pub(crate) const POOL_MAX_CLASS: usize = 1 << 20;
/// Bytes each size class may keep per thread (at least 4 buffers).
pub(crate) const POOL_CLASS_BYTES: usize = 4 << 20;

/// A buffer of `len` bytes from this thread's pool. Its contents are
/// arbitrary: callers fill all `len` bytes (use [`zbuf`] for zeroes).
pub(crate) fn abuf(len: usize) -> AlignedBuf {
    let cap = len.max(4096).next_power_of_two();
    let mut b = if cap <= POOL_MAX_CLASS {
        POOL.with(|p| {
            p.borrow_mut()
                .get_mut(cap.trailing_zeros() as usize)
                .and_then(|v| v.pop())
        })
        .unwrap_or_else(|| AlignedBuf::new(cap))
    } else {
        AlignedBuf::new(len)
    };
    b.set_len(len);
    b
}

/// Returns a buffer to this thread's pool. Views of a shared buffer (the
/// host's data, lent to members) are dropped instead: their memory is the
/// parent's.
pub(crate) fn recycle(buf: AlignedBuf) {
    let cap = buf.capacity();
    if buf.is_view() || !cap.is_power_of_two() || cap > POOL_MAX_CLASS {
        return;
    }
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        let class = cap.trailing_zeros() as usize;
        if p.len() <= class {
            p.resize_with(class + 1, Vec::new);
        }
        if p[class].len() < (POOL_CLASS_BYTES / cap).max(4) {
            p[class].push(buf);
        }
    });
}

/// A zeroed buffer of `len` bytes.
pub(crate) fn zbuf(len: usize) -> AlignedBuf {
    let mut b = AlignedBuf::new(len);
    b.set_len(len);
    b
}

pub(crate) fn abuf_from(src: &[u8]) -> AlignedBuf {
    let mut b = abuf(src.len());
    b.copy_from_slice(src);
    b
}

pub(crate) fn io_err(msg: String) -> BlockError {
    BlockError::Io(std::io::Error::other(msg))
}

/// One I/O to a member at a byte offset.
pub(crate) async fn dev_io(
    dev: &Arc<dyn BlockDevice>,
    op: BlockOp,
    byte_off: u64,
    bytes: usize,
    buf: AlignedBuf,
) -> (AlignedBuf, Result<(), BlockError>) {
    // Block sizes are powers of two: shift, do not divide.
    let mbs = dev.geometry().block_size;
    debug_assert!(mbs.is_power_of_two());
    let shift = mbs.trailing_zeros();
    let req = IoRequest {
        op,
        lba: byte_off >> shift,
        blocks: (bytes as u64 >> shift) as u32,
        buf,
    };
    let IoDone { buf, result } = dev.submit(req).await;
    (buf, result)
}

/// Member I/Os of one step of a stripe operation, started together and
/// awaited together. A device starts an I/O when it is submitted (the
/// `BlockDevice` contract: drives queue it, RAM copies at once), so
/// submitting them all before awaiting any keeps them concurrent; only
/// futures still pending are joined, and ones that finished at submit (RAM
/// members) never touch a join or the heap beyond this batch's two vectors.
pub(crate) struct Batch {
    ios: Vec<(usize, IoFuture)>,
}

impl Batch {
    pub fn with_capacity(n: usize) -> Batch {
        Batch {
            ios: Vec::with_capacity(n),
        }
    }

    /// Starts an I/O of `bytes` at byte `off` of member `member`.
    pub fn submit(
        &mut self,
        view: &View,
        member: usize,
        op: BlockOp,
        off: u64,
        bytes: usize,
        buf: AlignedBuf,
    ) {
        let dev = &view.devs[member];
        let mbs = dev.geometry().block_size;
        debug_assert!(mbs.is_power_of_two());
        let shift = mbs.trailing_zeros();
        let io = dev.submit(IoRequest {
            op,
            lba: off >> shift,
            blocks: (bytes as u64 >> shift) as u32,
            buf,
        });
        self.ios.push((member, io));
    }

    /// A buffer that comes back in its place in the results, with no I/O.
    pub fn hold(&mut self, buf: AlignedBuf) {
        self.ios.push((usize::MAX, IoFuture::ready(buf, Ok(()))));
    }

    /// The buffers in submission order, or the members that failed.
    pub async fn finish(self) -> Result<Vec<AlignedBuf>, OpError> {
        let mut done: Vec<(usize, Option<IoDone>)> = Vec::with_capacity(self.ios.len());
        let mut pending = Vec::new();
        for (i, (member, io)) in self.ios.into_iter().enumerate() {
            match io {
                IoFuture::Ready(Some(d)) => done.push((member, Some(d))),
                io => {
                    pending.push((i, io));
                    done.push((member, None));
                }
            }
        }
        if !pending.is_empty() {
            let (at, ios): (Vec<usize>, Vec<IoFuture>) = pending.into_iter().unzip();
            for (i, d) in at.into_iter().zip(join_all(ios).await) {
                done[i].1 = Some(d);
            }
        }
        let mut failed = Vec::new();
        let mut bufs = Vec::with_capacity(done.len());
        for (member, d) in done {
            let d = d.expect("every I/O completed");
            if let Err(e) = d.result {
                tracing::debug!("member {member} I/O error: {e}");
                failed.push(member);
            }
            bufs.push(d.buf);
        }
        if failed.is_empty() {
            Ok(bufs)
        } else {
            bufs.into_iter().for_each(recycle);
            failed.sort_unstable();
            failed.dedup();
            Err(OpError::Members(failed))
        }
    }

    /// For writes: waits, recycles the buffers.
    pub async fn finish_writes(self) -> Result<(), OpError> {
        self.finish().await?.into_iter().for_each(recycle);
        Ok(())
    }
}

pub(crate) fn collect_failed<T>(results: Vec<Result<T, usize>>) -> Result<Vec<T>, OpError> {
    let mut failed = Vec::new();
    let mut ok = Vec::with_capacity(results.len());
    for r in results {
        match r {
            Ok(v) => ok.push(v),
            Err(i) => failed.push(i),
        }
    }
    if failed.is_empty() {
        Ok(ok)
    } else {
        failed.sort_unstable();
        failed.dedup();
        Err(OpError::Members(failed))
    }
}

impl Inner {
    pub(crate) fn data_byte(&self, member_lba: u64) -> u64 {
        self.meta_bytes + member_lba * self.bs
    }

    /// Starts a read of `blocks` volume blocks at `member_lba` of a member's data area.
    pub(crate) fn submit_read(
        &self,
        b: &mut Batch,
        view: &View,
        member: usize,
        member_lba: u64,
        blocks: u64,
    ) {
        let len = (blocks * self.bs) as usize;
        b.submit(
            view,
            member,
            BlockOp::Read,
            self.data_byte(member_lba),
            len,
            abuf(len),
        );
    }

    /// Starts a read into `buf` (all of its `len`) at `member_lba` of a
    /// member's data area: a writable view of the caller's buffer, so the
    /// data lands in place.
    pub(crate) fn submit_read_into(
        &self,
        b: &mut Batch,
        view: &View,
        member: usize,
        member_lba: u64,
        buf: AlignedBuf,
    ) {
        let len = buf.len();
        b.submit(
            view,
            member,
            BlockOp::Read,
            self.data_byte(member_lba),
            len,
            buf,
        );
    }

    /// Starts a write of `buf` at `member_lba` of a member's data area.
    pub(crate) fn submit_write(
        &self,
        b: &mut Batch,
        view: &View,
        member: usize,
        member_lba: u64,
        buf: AlignedBuf,
        fua: bool,
    ) {
        let len = buf.len();
        b.submit(
            view,
            member,
            BlockOp::Write { fua },
            self.data_byte(member_lba),
            len,
            buf,
        );
    }

    /// Reads `blocks` volume blocks at `member_lba` of a member's data area.
    pub(crate) async fn col_read(
        &self,
        view: &View,
        member: usize,
        member_lba: u64,
        blocks: u64,
    ) -> Result<AlignedBuf, usize> {
        let len = (blocks * self.bs) as usize;
        let (buf, r) = dev_io(
            &view.devs[member],
            BlockOp::Read,
            self.data_byte(member_lba),
            len,
            abuf(len),
        )
        .await;
        r.map(|_| buf).map_err(|e| {
            tracing::debug!("member {member} read error: {e}");
            member
        })
    }

    pub(crate) async fn col_write(
        &self,
        view: &View,
        member: usize,
        member_lba: u64,
        buf: AlignedBuf,
        fua: bool,
    ) -> Result<(), usize> {
        let len = buf.len();
        let (buf, r) = dev_io(
            &view.devs[member],
            BlockOp::Write { fua },
            self.data_byte(member_lba),
            len,
            buf,
        )
        .await;
        recycle(buf);
        r.map_err(|e| {
            tracing::debug!("member {member} write error: {e}");
            member
        })
    }

    pub(crate) fn too_many_failed(&self, view: &View) -> BlockError {
        let failed: Vec<usize> = (0..view.states.len())
            .filter(|&i| view.states[i] == MemberState::Failed)
            .collect();
        self.failed_error(failed)
    }

    /// The error of an I/O that `failed` members (indexes) left undone:
    /// the fence's when fenced, else [`BlockError::TooManyFailed`].
    pub(crate) fn failed_error(&self, failed: Vec<usize>) -> BlockError {
        if self.fence.is_set() {
            return self.fence.error();
        }
        let volume = {
            let m = self.members.read();
            if m.name.is_empty() {
                uuid_string(&self.uuid)
            } else {
                m.name.clone()
            }
        };
        BlockError::TooManyFailed {
            volume,
            layout: self.layout.kind().to_string(),
            failed,
            tolerates: self.layout.parity_columns(),
        }
    }
}

/// Stands in for a member that was not given at assembly: every I/O fails.
pub(crate) struct MissingDevice(pub(crate) Geometry);

impl BlockDevice for MissingDevice {
    fn geometry(&self) -> Geometry {
        self.0
    }
    fn submit(&self, req: IoRequest) -> IoFuture {
        IoFuture::ready(req.buf, Err(io_err("member missing".into())))
    }
    fn deallocate_reads_zeroes(&self) -> bool {
        false
    }
    fn describe(&self) -> String {
        "missing member".into()
    }
}

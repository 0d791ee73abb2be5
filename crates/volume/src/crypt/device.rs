//! Encryption on the I/O path: writes encrypt into a buffer of their own
//! (the caller's buffer may be a read-only view, and may be reused for a
//! retry, so it is never changed), reads decrypt in place once the members
//! filled the buffer. Shared by [`EncryptedDevice`] and the [`crate::Volume`]
//! of an encrypted volume.

use std::sync::Arc;

use blockdev::{
    AlignedBuf, BlockDevice, BlockError, BlockOp, IoDone, IoFuture, IoRequest, check_request,
};
use parking_lot::Mutex;

use super::Xts;

/// Ciphertext buffers kept for reuse per key (a write allocates none in
/// the steady state).
const POOLED_BUFS: usize = 64;

/// A key and the ciphertext buffers of its writes.
pub(crate) struct CryptPath {
    pub xts: Xts,
    bufs: Mutex<Vec<AlignedBuf>>,
}

impl CryptPath {
    pub fn new(xts: Xts) -> CryptPath {
        CryptPath {
            xts,
            bufs: Mutex::new(Vec::new()),
        }
    }

    fn take(&self, len: usize) -> AlignedBuf {
        let mut bufs = self.bufs.lock();
        if let Some(i) = bufs.iter().position(|b| b.capacity() >= len) {
            let mut b = bufs.swap_remove(i);
            b.set_len(len);
            return b;
        }
        drop(bufs);
        let mut b = AlignedBuf::new(len);
        b.set_len(len);
        b
    }

    fn give(&self, b: AlignedBuf) {
        if b.is_view() || !b.is_writable() {
            return;
        }
        let mut bufs = self.bufs.lock();
        if bufs.len() < POOLED_BUFS {
            bufs.push(b);
        }
    }
}

fn crypt_error(what: &str, e: super::CryptError) -> BlockError {
    BlockError::Io(std::io::Error::other(format!("{what}: {e}")))
}

/// Encrypts a checked write's data into a buffer of its own: the request
/// to send down and the caller's buffer to hand back after it.
pub(crate) fn encrypt_write(
    c: &CryptPath,
    bs: u32,
    req: IoRequest,
) -> Result<(IoRequest, AlignedBuf), IoDone> {
    let len = req.blocks as usize * bs as usize;
    let mut out = c.take(len);
    let r = c.xts.encrypt(
        req.lba,
        bs as usize,
        &req.buf[..len],
        &mut out.spare()[..len],
    );
    if let Err(e) = r {
        c.give(out);
        return Err(IoDone {
            buf: req.buf,
            result: Err(crypt_error("encrypting a write", e)),
        });
    }
    let down = IoRequest {
        op: req.op,
        lba: req.lba,
        blocks: req.blocks,
        buf: out,
    };
    Ok((down, req.buf))
}

/// A write's ciphertext came back: the caller gets its own buffer.
pub(crate) fn finish_write(c: &CryptPath, done: IoDone, caller: AlignedBuf) -> IoDone {
    c.give(done.buf);
    IoDone {
        buf: caller,
        result: done.result,
    }
}

/// Decrypts a read's buffer in place after the members filled it.
pub(crate) fn decrypt_read(
    c: &CryptPath,
    bs: u32,
    lba: u64,
    blocks: u32,
    mut done: IoDone,
) -> IoDone {
    if done.result.is_err() {
        return done;
    }
    let len = blocks as usize * bs as usize;
    if !done.buf.is_writable() || done.buf.len() < len {
        done.result = Err(BlockError::Config(
            "caller bug: a read's buffer is read-only or short".into(),
        ));
        return done;
    }
    if let Err(e) = c
        .xts
        .decrypt_in_place(lba, bs as usize, &mut done.buf[..len])
    {
        // Never hand back ciphertext as data.
        done.buf[..len].fill(0);
        done.result = Err(crypt_error("decrypting a read", e));
    }
    done
}

/// Encrypts every block on its way to `inner` and decrypts it on its way
/// back; everything else passes through. The block is the XTS data unit
/// and its LBA the tweak.
pub struct EncryptedDevice {
    inner: Arc<dyn BlockDevice>,
    path: Arc<CryptPath>,
}

impl EncryptedDevice {
    pub fn new(inner: Arc<dyn BlockDevice>, xts: Xts) -> EncryptedDevice {
        EncryptedDevice {
            inner,
            path: Arc::new(CryptPath::new(xts)),
        }
    }
}

impl BlockDevice for EncryptedDevice {
    blockdev::forward_block_device!(self => self.inner, except [submit, describe]);

    fn submit(&self, req: IoRequest) -> IoFuture {
        let geo = self.inner.geometry();
        match req.op {
            BlockOp::Read | BlockOp::Write { .. } => {}
            _ => return self.inner.submit(req),
        }
        if let Err(e) = check_request(geo, &req) {
            return IoFuture::ready(req.buf, Err(e));
        }
        let path = self.path.clone();
        let bs = geo.block_size;
        match req.op {
            BlockOp::Write { .. } => match encrypt_write(&path, bs, req) {
                Err(done) => IoFuture::Ready(Some(done)),
                Ok((down, caller)) => {
                    let fut = self.inner.submit(down);
                    IoFuture::Pending(Box::pin(
                        async move { finish_write(&path, fut.await, caller) },
                    ))
                }
            },
            _ => {
                let (lba, blocks) = (req.lba, req.blocks);
                let fut = self.inner.submit(req);
                IoFuture::Pending(Box::pin(async move {
                    decrypt_read(&path, bs, lba, blocks, fut.await)
                }))
            }
        }
    }

    fn describe(&self) -> String {
        format!("aes-xts-256 over {}", self.inner.describe())
    }
}

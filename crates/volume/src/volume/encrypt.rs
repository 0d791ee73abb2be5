//! An encrypted volume's key and I/O: unlock with the unwrapped data key,
//! rewrap under a new key-encryption key, and the encrypting submit path
//! (above the stripe engine, so members, rebuild and scrub see ciphertext).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use blockdev::{BlockError, BlockOp, IoDone, IoFuture, IoRequest};

use super::{Volume, VolumeError};
use crate::crypt::{self, CryptPath, DataKey, KeyEnvelope, Xts};

impl Volume {
    /// Whether the volume is encrypted (its superblocks hold a key envelope).
    pub fn is_encrypted(&self) -> bool {
        self.inner.encrypted.load(Ordering::Relaxed)
    }

    /// The wrapped data key of an encrypted volume, as the superblocks keep it.
    pub fn key_envelope(&self) -> Option<KeyEnvelope> {
        self.inner.members.read().key
    }

    /// Whether the volume is encrypted and its key not given yet: its reads
    /// and writes fail until [`Volume::unlock`].
    pub fn is_locked(&self) -> bool {
        self.is_encrypted() && self.inner.crypt.load().is_none()
    }

    /// Gives an encrypted volume its data key (unwrapped from
    /// [`Volume::key_envelope`]). A key that does not match the key check
    /// value is refused and the volume stays locked.
    pub fn unlock(&self, key: &DataKey) -> Result<(), VolumeError> {
        let Some(env) = self.key_envelope() else {
            return Err(VolumeError::Config(format!(
                "volume {} is not encrypted; it takes no key",
                self.describe_name()
            )));
        };
        env.check(key)
            .map_err(|e| VolumeError::Config(format!("volume {}: {e}", self.describe_name())))?;
        let xts = Xts::new(key.clone())
            .map_err(|e| VolumeError::Config(format!("volume {}: {e}", self.describe_name())))?;
        self.inner.crypt.store(Some(Arc::new(CryptPath::new(xts))));
        Ok(())
    }

    /// Replaces the wrapped key in every superblock with `env`, the same data
    /// key wrapped by another key-encryption key (KEK rotation); the data is
    /// not rewritten. Refused (nothing changes) unless `env` holds the key the
    /// volume is unlocked with.
    pub async fn rewrap(&self, env: KeyEnvelope) -> Result<(), VolumeError> {
        let Some(old) = self.key_envelope() else {
            return Err(VolumeError::Config(format!(
                "volume {} is not encrypted; there is no key to rewrap",
                self.describe_name()
            )));
        };
        if env.kcv != old.kcv {
            return Err(VolumeError::Config(format!(
                "volume {}: the new envelope holds another data key; a rewrap keeps the key",
                self.describe_name()
            )));
        }
        if self.inner.fence.is_set() {
            return Err(VolumeError::Fenced(self.inner.fence.error().to_string()));
        }
        {
            let mut m = self.inner.members.write();
            m.key = Some(env);
            m.version += 1;
        }
        self.inner.persist_superblock(true).await;
        Ok(())
    }

    /// The data key the volume is unlocked with, wrapped by `kek` (for a
    /// KEK rotation). None while locked or not encrypted.
    pub fn wrap_key(&self, kek: &crypt::Kek) -> Result<Option<KeyEnvelope>, VolumeError> {
        let Some(c) = self.inner.crypt.load_full() else {
            return Ok(None);
        };
        c.xts
            .wrap_with(kek)
            .map(Some)
            .map_err(|e| VolumeError::Config(format!("volume {}: {e}", self.describe_name())))
    }

    fn describe_name(&self) -> String {
        let n = self.name();
        if n.is_empty() { self.uuid() } else { n }
    }

    /// A read or write of an encrypted volume (already checked).
    pub(super) fn submit_encrypted(&self, req: IoRequest) -> IoFuture {
        let Some(path) = self.inner.crypt.load_full() else {
            return IoFuture::ready(
                req.buf,
                Err(BlockError::Config(format!(
                    "volume {} is encrypted and locked: its key was not unwrapped (see the \
                     node's log for why); nothing is read or written",
                    self.describe_name()
                ))),
            );
        };
        let bs = self.inner.bs as u32;
        let inner = self.inner.clone();
        match req.op {
            BlockOp::Write { .. } => match crypt::encrypt_write(&path, bs, req) {
                Err(done) => IoFuture::Ready(Some(done)),
                Ok((down, caller)) => IoFuture::Pending(Box::pin(async move {
                    let done: IoDone = inner.handle(down).await;
                    crypt::finish_write(&path, done, caller)
                })),
            },
            _ => {
                let (lba, blocks) = (req.lba, req.blocks);
                IoFuture::Pending(Box::pin(async move {
                    let done = inner.handle(req).await;
                    crypt::decrypt_read(&path, bs, lba, blocks, done)
                }))
            }
        }
    }
}

//! Host reservations of the thin volumes of a cluster pool, kept in etcd.
//!
//! A cluster volume keeps its reservations in its members' record area
//! (`switch.rs`). A thin volume has no members of its own, and the pool's
//! record area (8 KiB) cannot hold the registrations of hundreds of thin
//! volumes. So each thin volume's record lives beside its spec, under
//! `volumes/<pool>/thin-resv/<thin>`, where everything else about it lives
//! (name, NSID, size), and is written by the pool's owner under its epoch:
//! the transaction compares the pool's owner key, so a deposed owner cannot
//! change what the next owner loads, however late its write arrives. The
//! next owner reads all of a pool's records in one range read before the
//! pool's ANA group turns Optimized; if that read fails, the group is held
//! Inaccessible until one succeeds (`pools.rs`), so no thin volume is ever
//! served without its reservations.
//!
//! [`ThinResvDevice`] is the thin volume as the owner's switch serves it:
//! every method forwards to the thin volume but the three record ones.

use std::sync::Arc;
use std::time::Duration;

use blockdev::{BlockDevice, BlockError, RecordKind};
use cluster::{ClusterError, Session};
use parking_lot::Mutex;

/// How long a reservation command waits for etcd before it is refused.
const STORE_TIMEOUT: Duration = Duration::from_secs(2);

pub(super) struct ThinResvDevice {
    thin: Arc<dyn BlockDevice>,
    session: Session,
    rt: tokio::runtime::Handle,
    pool: String,
    name: String,
    /// The pool's epoch under which this node serves it.
    epoch: u64,
    /// The record as this owner read (or last wrote) it; None: none stored.
    known: Mutex<Option<Vec<u8>>>,
}

impl ThinResvDevice {
    /// Thin volume `name` of `pool`, owned here at `epoch`, with the record
    /// the pool's range read found (`None`: none stored). Call on the
    /// agent's runtime: stores run their etcd transaction there.
    pub(super) fn wrap(
        thin: Arc<dyn BlockDevice>,
        session: Session,
        pool: &str,
        name: &str,
        epoch: u64,
        record: Option<Vec<u8>>,
    ) -> Arc<dyn BlockDevice> {
        Arc::new(ThinResvDevice {
            thin,
            session,
            rt: tokio::runtime::Handle::current(),
            pool: pool.to_string(),
            name: name.to_string(),
            epoch,
            known: Mutex::new(record),
        })
    }

    /// Runs `f`'s etcd call on the agent's runtime and waits for it, at most
    /// [`STORE_TIMEOUT`] (and a second more on this side, in case that
    /// runtime is busy: its one worker may itself wait for this namespace's
    /// reservations, in `reload` at an activation). The caller's thread
    /// blocks: the namespace's reservation store thread, never a reactor.
    /// A caller on the agent's own runtime is refused: the management
    /// runtime has one worker, which would wait for itself.
    fn etcd<T: Send + 'static>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = Result<T, ClusterError>> + Send + 'static,
    ) -> Result<T, BlockError> {
        if tokio::runtime::Handle::try_current().is_ok_and(|h| h.id() == self.rt.id()) {
            return Err(BlockError::Config(format!(
                "thin volume {}: {what}: asked on the management runtime, which would wait \
                 for itself (a bug; the command is refused)",
                self.name
            )));
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let task = self.rt.spawn(async move {
            let _ = tx.send(tokio::time::timeout(STORE_TIMEOUT, f).await);
        });
        let fail = |why: String| {
            BlockError::Config(format!(
                "thin volume {}: {what} in the cluster (etcd): {why}",
                self.name
            ))
        };
        let late = || fail(format!("no answer within {} s", STORE_TIMEOUT.as_secs()));
        match rx.recv_timeout(STORE_TIMEOUT + Duration::from_secs(1)) {
            Ok(Ok(Ok(v))) => Ok(v),
            Ok(Ok(Err(ClusterError::Deposed { volume, epoch }))) => Err(BlockError::Fenced(
                format!("pool {volume} is no longer owned here at epoch {epoch}"),
            )),
            Ok(Ok(Err(e))) => Err(fail(e.to_string())),
            Ok(Err(_)) => Err(late()),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                // Not started yet, it never starts: a refused command changes nothing.
                task.abort();
                Err(late())
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Err(fail("the management runtime dropped the request".into()))
            }
        }
    }
}

impl BlockDevice for ThinResvDevice {
    blockdev::forward_block_device!(self => self.thin, except [keeps_records, load_record, store_record]);

    fn keeps_records(&self) -> bool {
        true
    }

    /// What the pool's range read found. Called when the switch starts
    /// serving, on the management runtime, so it never waits for etcd.
    fn load_record(&self, _kind: RecordKind) -> Result<Option<Vec<u8>>, BlockError> {
        Ok(self.known.lock().clone())
    }

    /// A change is stored before the command completes; one whose store
    /// fails is refused and changes nothing.
    fn store_record(&self, kind: RecordKind, data: &[u8]) -> Result<(), BlockError> {
        if data.len() > blockdev::RECORD_MAX {
            return Err(BlockError::Config(format!(
                "thin volume {}: a {kind:?} record of {} bytes is over the {}-byte limit",
                self.name,
                data.len(),
                blockdev::RECORD_MAX
            )));
        }
        let (s, pool, name, epoch, rec) = (
            self.session.clone(),
            self.pool.clone(),
            self.name.clone(),
            self.epoch,
            data.to_vec(),
        );
        self.etcd("storing its reservations", async move {
            s.put_thin_resv(&pool, &name, epoch, &rec).await
        })?;
        *self.known.lock() = Some(data.to_vec());
        Ok(())
    }
}

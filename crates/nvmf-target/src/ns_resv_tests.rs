//! `NsReservations` on a device that keeps records: the shared (cluster
//! volume) mode stores every change and reloads it elsewhere; a store that
//! fails refuses the command and changes nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use blockdev::{BlockDevice, BlockError, MemDevice, RecordKind};
use nvme_wire::status;
use parking_lot::Mutex;

use super::NsReservations;
use crate::reservation::{HostRef, ReservationState};

/// A RAM device that keeps one record, as a volume keeps it on its members;
/// `fail` makes every store fail (a fenced or lost volume); while `held`
/// (see [`RecordDev::hold`]) a store waits, at most [`HOLD_MAX`], as one over
/// a member that stopped answering.
pub(crate) struct RecordDev {
    mem: MemDevice,
    pub(crate) record: Mutex<Option<Vec<u8>>>,
    pub(crate) fail: AtomicBool,
    pub(crate) stores: AtomicUsize,
    /// Stores begun (held ones included).
    pub(crate) started: AtomicUsize,
    /// Every record stored, in order.
    pub(crate) history: Mutex<Vec<Vec<u8>>>,
    held: std::sync::Mutex<bool>,
    let_go: std::sync::Condvar,
}

/// The longest a held store waits: a test against code that stores on the
/// calling thread fails on its assertions instead of hanging.
pub(crate) const HOLD_MAX: std::time::Duration = std::time::Duration::from_secs(30);

impl RecordDev {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(RecordDev {
            mem: MemDevice::new(1 << 20, 512).unwrap(),
            record: Mutex::new(None),
            fail: AtomicBool::new(false),
            stores: AtomicUsize::new(0),
            started: AtomicUsize::new(0),
            history: Mutex::new(Vec::new()),
            held: std::sync::Mutex::new(false),
            let_go: std::sync::Condvar::new(),
        })
    }

    /// Makes stores wait (`true`) until called with `false`.
    pub(crate) fn hold(&self, on: bool) {
        *self.held.lock().unwrap() = on;
        self.let_go.notify_all();
    }

    /// Waits until `n` stores have begun (on another thread).
    pub(crate) fn wait_started(&self, n: usize) {
        for _ in 0..5000 {
            if self.started.load(Ordering::SeqCst) >= n {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("{n} store(s) never began");
    }
}

impl BlockDevice for RecordDev {
    blockdev::forward_block_device!(self => self.mem, except [keeps_records, load_record, store_record]);

    fn keeps_records(&self) -> bool {
        true
    }
    fn load_record(&self, _kind: RecordKind) -> Result<Option<Vec<u8>>, BlockError> {
        Ok(self.record.lock().clone())
    }
    fn store_record(&self, _kind: RecordKind, data: &[u8]) -> Result<(), BlockError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        let held = self.held.lock().unwrap();
        drop(
            self.let_go
                .wait_timeout_while(held, HOLD_MAX, |h| *h)
                .unwrap(),
        );
        if self.fail.load(Ordering::SeqCst) {
            return Err(BlockError::Fenced("test: the volume is fenced".into()));
        }
        self.stores.fetch_add(1, Ordering::SeqCst);
        self.history.lock().push(data.to_vec());
        *self.record.lock() = Some(data.to_vec());
        Ok(())
    }
}

fn host(n: u8) -> HostRef {
    HostRef {
        hostid: [n; 16],
        cntlid: u16::from(n),
    }
}

fn register(r: &NsReservations, dev: &RecordDev, n: u8, key: u64) -> Result<(), u8> {
    r.apply(dev, |s| s.register(&host(n), 0, false, 0, key, 0))
        .map(|_| ())
        .map_err(|e| e.sc)
}

/// Host 1 and 2 registered, 1 holds Write Exclusive, 3 was preempted by 2.
fn setup(r: &NsReservations, dev: &RecordDev) {
    for (n, key) in [(1, 11), (2, 22), (3, 33)] {
        register(r, dev, n, key).unwrap();
    }
    r.apply(dev, |s| s.acquire(&host(1), 0, false, 1, 11, 0))
        .unwrap();
    r.apply(dev, |s| s.acquire(&host(2), 1, false, 1, 22, 33))
        .unwrap();
}

#[test]
fn shared_state_is_stored_on_every_change_and_reloaded_elsewhere() {
    let dev = RecordDev::new();
    let a = NsReservations::shared();
    assert!(a.persistent() && a.is_shared());
    setup(&a, &dev);
    // every change stored, PTPL off all along
    assert!(!a.ptpl() && a.may_store(false));
    assert_eq!(dev.stores.load(Ordering::SeqCst), 5);
    assert_eq!(a.preempted_hosts(), [[3; 16]]);

    // another node starts serving the device
    let b = NsReservations::shared();
    b.reload(&*dev).unwrap();
    assert_eq!(b.snapshot(), a.snapshot());
    assert_eq!(b.snapshot().generation(), 4);
    assert_eq!(b.snapshot().holder(), Some([1; 16]));
    assert_eq!(b.preempted_hosts(), [[3; 16]]);
    assert!(b.check_write(&[2; 16], true).is_err(), "write exclusive");
    assert!(b.check_write(&[1; 16], true).is_ok());
    assert!(b.check_write(&[3; 16], true).is_err());

    // host 3 registers again through the new node: no longer preempted,
    // and the first node, serving again, sees that
    register(&b, &dev, 3, 34).unwrap();
    assert!(b.preempted_hosts().is_empty());
    a.reload(&*dev).unwrap();
    assert_eq!(a.snapshot(), b.snapshot());
    assert!(a.preempted_hosts().is_empty());
}

#[test]
fn a_failed_store_refuses_the_command_and_changes_nothing() {
    let dev = RecordDev::new();
    let r = NsReservations::shared();
    setup(&r, &dev);
    let before = (r.snapshot(), r.preempted_hosts(), dev.record.lock().clone());
    dev.fail.store(true, Ordering::SeqCst);
    // Fenced: a path error, so that the host retries on another path.
    assert_eq!(register(&r, &dev, 4, 44), Err(status::SC_ANA_INACCESSIBLE));
    // a preempt (which would also move host 1 into the preempted set)
    let e = r
        .apply(&*dev, |s| s.acquire(&host(2), 2, false, 1, 22, 11))
        .unwrap_err();
    assert_eq!(
        (e.sct, e.sc),
        (status::SCT_PATH, status::SC_ANA_INACCESSIBLE)
    );
    assert_eq!(
        r.apply(&*dev, |s| s.release(&host(1), 0, false, 1, 11))
            .unwrap_err()
            .sc,
        status::SC_ANA_INACCESSIBLE
    );
    assert_eq!(
        (r.snapshot(), r.preempted_hosts(), dev.record.lock().clone()),
        before
    );
    assert!(r.check_write(&[1; 16], true).is_ok(), "still the holder");
    // a command that changes nothing needs no store
    r.apply(&*dev, |s| s.release(&host(2), 0, false, 1, 22))
        .unwrap();
    dev.fail.store(false, Ordering::SeqCst);
    register(&r, &dev, 4, 44).unwrap();
    assert!(r.snapshot().is_registered(&[4; 16]));
}

#[test]
fn reload_without_a_record_is_empty_and_a_bad_one_is_an_error() {
    let dev = RecordDev::new();
    let r = NsReservations::shared();
    setup(&r, &dev);
    let saved = dev.record.lock().take();
    r.reload(&*dev).unwrap();
    assert_eq!(r.snapshot(), ReservationState::new());
    assert!(r.preempted_hosts().is_empty());
    assert!(r.check_write(&[2; 16], true).is_ok());

    setup(&r, &dev);
    let mut bad = saved.unwrap();
    bad[10] ^= 1;
    *dev.record.lock() = Some(bad);
    assert!(r.reload(&*dev).is_err());
    assert_eq!(r.snapshot(), ReservationState::new(), "never stale state");
    assert!(r.preempted_hosts().is_empty());
}

/// A device of one node (not shared) stores only with PTPL on, as before.
#[test]
fn a_local_namespace_stores_only_with_ptpl() {
    let dev = RecordDev::new();
    let r = NsReservations::load(&*dev);
    assert!(r.persistent() && !r.is_shared());
    // With PTPL off a command stores nothing, so it runs on the reactor;
    // one that sets PTPL goes to the store worker.
    assert!(!r.may_store(false) && r.may_store(true));
    register(&r, &dev, 1, 11).unwrap();
    assert_eq!(dev.stores.load(Ordering::SeqCst), 0);
    r.set_ptpl(&*dev, true).unwrap();
    assert_eq!(dev.stores.load(Ordering::SeqCst), 1);
    assert!(r.may_store(false));
    // a PTPL record comes back on a restart of this node
    let again = NsReservations::load(&*dev);
    assert_eq!(again.snapshot(), r.snapshot());
}

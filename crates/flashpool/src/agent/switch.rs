//! The namespace a cluster volume is served through on every node. On the
//! owner it passes I/O to the volume; elsewhere (and on an owner whose lease
//! ran out) it refuses I/O with an ANA path error, so the host retries on
//! another path. The namespace itself never changes, so the host sees the
//! same NSID, NGUID and size on every path and through every takeover.
//!
//! The namespace's reservations live with the volume too: the switch holds
//! them in shared mode ([`NsReservations::shared`]), so every change is
//! stored in the volume's record area (members' metadata, written by the
//! owner alone and fenced with the data), and [`SwitchDevice::activate`]
//! reloads them before the node serves the volume.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use blockdev::{
    BlockDevice, BlockError, Geometry, IoCheck, IoDone, IoFuture, IoRequest, RecordKind,
};
use nvmf_target::ns_resv::NsReservations;

/// The ownership lease as the I/O path sees it: a monotonic deadline past
/// which this node must not write, whatever etcd says later.
pub struct LeaseClock {
    base: Instant,
    /// Nanoseconds after `base`; 0: not valid.
    until_ns: AtomicU64,
}

impl LeaseClock {
    pub fn new() -> Arc<Self> {
        Arc::new(LeaseClock {
            base: Instant::now(),
            until_ns: AtomicU64::new(0),
        })
    }

    pub fn set(&self, until: Option<Instant>) {
        let ns = until
            .map(|u| u.saturating_duration_since(self.base).as_nanos().max(1) as u64)
            .unwrap_or(0);
        self.until_ns.store(ns, Ordering::Release);
    }

    pub fn valid(&self) -> bool {
        let until = self.until_ns.load(Ordering::Acquire);
        until != 0 && (self.base.elapsed().as_nanos() as u64) < until
    }

    /// The deadline, when there is one.
    pub fn until(&self) -> Option<Instant> {
        match self.until_ns.load(Ordering::Acquire) {
            0 => None,
            ns => Some(self.base + Duration::from_nanos(ns)),
        }
    }
}

/// The ANA log of a lease-bound group consults the same deadline as the
/// I/O path: a node that wakes past it reports Inaccessible at once.
impl nvmf_target::ana::AnaLease for LeaseClock {
    fn valid(&self) -> bool {
        LeaseClock::valid(self)
    }
}

pub struct SwitchDevice {
    block_size: u32,
    /// The size every node serves (a thin volume of a cluster pool grows).
    num_blocks: AtomicU64,
    name: String,
    active: ArcSwapOption<Arc<dyn BlockDevice>>,
    lease: Arc<LeaseClock>,
    inflight: Arc<InflightCount>,
    /// The namespace's reservations (shared mode): kept in the volume.
    resv: Arc<NsReservations>,
    /// A snapshot's: write-protected on every node, owner or standby, so
    /// Identify Namespace reads the same on every path.
    read_only: AtomicBool,
}

impl SwitchDevice {
    pub fn new(name: &str, geometry: Geometry, lease: Arc<LeaseClock>) -> Arc<Self> {
        Arc::new(SwitchDevice {
            block_size: geometry.block_size,
            num_blocks: AtomicU64::new(geometry.num_blocks),
            name: name.to_string(),
            active: ArcSwapOption::empty(),
            lease,
            inflight: Arc::new(InflightCount(AtomicUsize::new(0))),
            resv: Arc::new(NsReservations::shared()),
            read_only: AtomicBool::new(false),
        })
    }

    /// Serves a snapshot: write-protected (the owner's thin volume refuses
    /// writes too, with the same status).
    pub fn set_read_only(&self) {
        self.read_only.store(true, Ordering::Release);
    }

    /// The reservations of the namespace this switch is served through:
    /// give them to that namespace (`Namespace::resv`).
    pub fn reservations(&self) -> Arc<NsReservations> {
        self.resv.clone()
    }

    /// Serves `dev` (this node owns the volume now). The registrations and
    /// the reservation the volume keeps are loaded first, while the ANA
    /// group still refuses commands: the host's first command here sees
    /// what it registered through the previous owner. A record that cannot
    /// be read leaves them empty (logged): the volume is served all the same.
    pub fn activate(&self, dev: Arc<dyn BlockDevice>) {
        if let Err(e) = self.resv.reload(&*dev) {
            tracing::error!(
                "volume {}: host reservations lost: {e}; serving it without them",
                self.name
            );
        }
        let r = self.resv.snapshot();
        if !r.registrants().is_empty() {
            tracing::info!(
                "volume {}: {} host registration(s), {}, generation {}, loaded from the volume",
                self.name,
                r.registrants().len(),
                if r.is_reserved() {
                    "reserved"
                } else {
                    "not reserved"
                },
                r.generation()
            );
        }
        self.active.store(Some(Arc::new(dev)));
    }

    /// Serves `bytes` from now on (the volume grew or shrank, as its
    /// record says). The caller tells the target
    /// ([`nvmf_target::Target::namespace_resized`]).
    pub fn resize_to(&self, bytes: u64) {
        let blocks = bytes / u64::from(self.block_size.max(1));
        self.num_blocks.store(blocks, Ordering::Release);
    }

    /// Whether it passes I/O on (this node owns the volume).
    pub fn is_active(&self) -> bool {
        self.active.load().is_some()
    }

    /// Stops passing I/O on; commands already passed on complete.
    pub fn deactivate(&self) {
        self.active.store(None);
    }

    /// Waits until every command passed on has completed, at most `limit`;
    /// false if some are still running.
    pub async fn drain(&self, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        while self.inflight.0.load(Ordering::Acquire) > 0 {
            if Instant::now() >= end {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        true
    }
}

/// The commands passed on and not yet completed (or dropped). An I/O's
/// count is released by a check on its own future (no allocation per I/O).
struct InflightCount(AtomicUsize);

impl IoCheck for InflightCount {
    fn on_done(&self, _: &mut IoDone) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
    fn on_abandoned(&self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Releases one count when dropped: held by a reservation store while it
/// runs, and by `submit` until the I/O's completion check holds the count
/// (so a panic in the volume's submit does not leave a drain waiting).
struct Inflight<'a>(&'a InflightCount);

impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl BlockDevice for SwitchDevice {
    // While this node owns the volume, the prefetch hint and the device-kept
    // records (reservations) go to it; on standby they get the trait's
    // defaults (no records). A store is a write: see `store_record`. `allocated_blocks` stays the default (None) on every node:
    // it sets the Identify Namespace thin bit, which must read the same on
    // every path.
    blockdev::forward_block_device!(self => if let Some(d) = self.active.load().as_ref(), except [
        geometry,
        submit,
        deallocate_reads_zeroes,
        describe,
        shutdown,
        allocated_blocks,
        store_record,
        read_only,
    ]);

    fn read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
    }

    fn geometry(&self) -> Geometry {
        Geometry {
            block_size: self.block_size,
            num_blocks: self.num_blocks.load(Ordering::Acquire),
        }
    }

    fn submit(&self, req: IoRequest) -> IoFuture {
        let guard = self.active.load();
        let Some(dev) = guard.as_ref() else {
            return IoFuture::ready(
                req.buf,
                Err(BlockError::Fenced(format!(
                    "volume {} is not owned by this node",
                    self.name
                ))),
            );
        };
        // The lease is checked per command: a node frozen past its lease
        // (SIGSTOP, a stalled VM) must not write when it wakes, even before
        // its lease watcher has run.
        if !self.lease.valid() {
            return IoFuture::ready(
                req.buf,
                Err(BlockError::Fenced(format!(
                    "volume {}: this node's ownership lease ran out",
                    self.name
                ))),
            );
        }
        self.inflight.0.fetch_add(1, Ordering::AcqRel);
        let unwinding = Inflight(&self.inflight);
        let io = dev.submit(req).then_check(&self.inflight);
        // The check releases the count from here on.
        std::mem::forget(unwinding);
        io
    }

    /// A reservation change: like a write, refused off the owner and past
    /// the lease, and counted in flight, so that a planned move's drain
    /// waits for it and the next owner loads what the host was told.
    fn store_record(&self, kind: RecordKind, data: &[u8]) -> Result<(), BlockError> {
        // Counted before the owner is looked at: a drain that saw none in
        // flight was after `deactivate`, so this store finds no device.
        self.inflight.0.fetch_add(1, Ordering::AcqRel);
        let _count = Inflight(&self.inflight);
        let guard = self.active.load();
        let Some(dev) = guard.as_ref() else {
            return Err(BlockError::Fenced(format!(
                "volume {} is not owned by this node",
                self.name
            )));
        };
        if !self.lease.valid() {
            return Err(BlockError::Fenced(format!(
                "volume {}: this node's ownership lease ran out",
                self.name
            )));
        }
        dev.store_record(kind, data)
    }

    fn deallocate_reads_zeroes(&self) -> bool {
        self.active
            .load()
            .as_ref()
            .is_some_and(|d| d.deallocate_reads_zeroes())
    }

    fn describe(&self) -> String {
        match self.active.load().as_ref() {
            Some(d) => format!(
                "cluster volume {} (owned here): {}",
                self.name,
                d.describe()
            ),
            None => format!(
                "cluster volume {} (standby: owned by another node)",
                self.name
            ),
        }
    }

    fn shutdown(&self) -> Result<(), BlockError> {
        // The volume below belongs to the node, which closes it.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockdev::{AlignedBuf, BlockOp, MemDevice};

    fn read(d: &SwitchDevice) -> Result<(), BlockError> {
        let mut buf = AlignedBuf::new(4096);
        buf.set_len(4096);
        blockdev::block_on(d.submit(IoRequest {
            op: BlockOp::Read,
            lba: 0,
            blocks: 1,
            buf,
        }))
        .result
    }

    #[test]
    fn passes_io_only_while_active_and_leased() {
        let mem: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(1 << 20, 4096).unwrap());
        let clock = LeaseClock::new();
        let s = SwitchDevice::new("v", mem.geometry(), clock.clone());
        assert!(matches!(read(&s), Err(BlockError::Fenced(_))));
        s.activate(mem);
        assert!(matches!(read(&s), Err(BlockError::Fenced(m)) if m.contains("lease")));
        clock.set(Some(Instant::now() + Duration::from_secs(5)));
        assert!(read(&s).is_ok());
        clock.set(Some(Instant::now() - Duration::from_millis(1)));
        assert!(matches!(read(&s), Err(BlockError::Fenced(m)) if m.contains("lease")));
        clock.set(Some(Instant::now() + Duration::from_secs(5)));
        s.deactivate();
        assert!(matches!(read(&s), Err(BlockError::Fenced(m)) if m.contains("not owned")));
        assert_eq!(s.inflight.0.load(Ordering::Relaxed), 0);
    }

    /// A device whose submit panics (a bug below the switch).
    struct Panicking(MemDevice);

    impl BlockDevice for Panicking {
        blockdev::forward_block_device!(self => self.0, except [submit]);
        fn submit(&self, _: IoRequest) -> IoFuture {
            panic!("submit failed")
        }
    }

    /// A submit that unwinds leaves no I/O counted in flight, or a planned
    /// move's drain would wait for it for ever.
    #[test]
    fn a_submit_that_panics_is_not_left_in_flight() {
        let clock = LeaseClock::new();
        clock.set(Some(Instant::now() + Duration::from_secs(5)));
        let dev = Arc::new(Panicking(MemDevice::new(1 << 20, 4096).unwrap()));
        let s = SwitchDevice::new("v", dev.geometry(), clock);
        s.activate(dev);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read(&s)));
        assert!(r.is_err());
        assert_eq!(s.inflight.0.load(Ordering::Relaxed), 0);
        // One that completes is released by its check.
        let mem: Arc<dyn BlockDevice> = Arc::new(MemDevice::new(1 << 20, 4096).unwrap());
        s.activate(mem);
        read(&s).unwrap();
        assert_eq!(s.inflight.0.load(Ordering::Relaxed), 0);
    }

    /// A RAM device that keeps one record, as a volume keeps it on its members.
    struct Recording {
        mem: MemDevice,
        record: parking_lot::Mutex<Option<Vec<u8>>>,
    }

    impl BlockDevice for Recording {
        blockdev::forward_block_device!(self => self.mem, except [keeps_records, load_record, store_record]);
        fn keeps_records(&self) -> bool {
            true
        }
        fn load_record(&self, _: RecordKind) -> Result<Option<Vec<u8>>, BlockError> {
            Ok(self.record.lock().clone())
        }
        fn store_record(&self, _: RecordKind, data: &[u8]) -> Result<(), BlockError> {
            *self.record.lock() = Some(data.to_vec());
            Ok(())
        }
    }

    /// The reservations the volume keeps are loaded when the switch starts
    /// passing I/O to it; a store is refused off the owner and past the
    /// lease, like a write.
    #[test]
    fn activation_loads_the_reservations_and_stores_obey_the_lease() {
        use nvmf_target::reservation::{HostRef, ReservationState};
        let mut kept = ReservationState::new();
        let h = HostRef {
            hostid: [7; 16],
            cntlid: 1,
        };
        kept.register(&h, 0, false, 0, 0x77, 0).unwrap();
        kept.acquire(&h, 0, false, 1, 0x77, 0).unwrap();
        let rec = Arc::new(Recording {
            mem: MemDevice::new(1 << 20, 4096).unwrap(),
            record: parking_lot::Mutex::new(Some(nvmf_target::resv_record::encode(&kept, &[]))),
        });
        let clock = LeaseClock::new();
        clock.set(Some(Instant::now() + Duration::from_secs(5)));
        let s = SwitchDevice::new("v", rec.geometry(), clock.clone());
        let r = s.reservations();
        assert!(r.is_shared() && r.snapshot() == ReservationState::new());
        assert!(matches!(
            s.store_record(RecordKind::Reservations, b"x"),
            Err(BlockError::Fenced(m)) if m.contains("not owned")
        ));
        s.activate(rec.clone());
        assert_eq!(r.snapshot(), kept, "loaded before the first command");
        s.store_record(RecordKind::Reservations, b"new").unwrap();
        assert_eq!(rec.record.lock().as_deref(), Some(&b"new"[..]));
        clock.set(Some(Instant::now() - Duration::from_millis(1)));
        assert!(matches!(
            s.store_record(RecordKind::Reservations, b"late"),
            Err(BlockError::Fenced(m)) if m.contains("lease")
        ));
        assert_eq!(rec.record.lock().as_deref(), Some(&b"new"[..]));
        assert_eq!(s.inflight.0.load(Ordering::Relaxed), 0);
    }

    /// A node frozen past its lease deadline (SIGSTOP) and woken: before
    /// its agent runs, its ANA log already says Inaccessible (a host that
    /// reads it right after SIGCONT must not see Optimized).
    #[test]
    fn the_ana_log_reads_inaccessible_past_the_lease_deadline() {
        use nvmf_target::{AnaState, Target, TransportConfig};
        let t = Target::new(TransportConfig::default(), Vec::new());
        let clock = LeaseClock::new();
        clock.set(Some(Instant::now() + Duration::from_secs(5)));
        t.set_ana_lease(Some(clock.clone()));
        t.bind_ana_group_to_lease(7, true);
        t.set_ana_state(7, AnaState::Optimized);
        assert_eq!(t.ana_state(7), AnaState::Optimized);
        assert!(clock.until().is_some_and(|u| u > Instant::now()));
        // The deadline passed while the process was stopped: nobody has
        // set anything since.
        clock.set(Some(Instant::now() - Duration::from_millis(1)));
        assert_eq!(t.ana_state(7), AnaState::Inaccessible);
        assert_eq!(t.ana_state(8), AnaState::Optimized, "not lease-bound");
        clock.set(None);
        assert_eq!(t.ana_state(7), AnaState::Inaccessible);
        assert_eq!(clock.until(), None);
    }
}

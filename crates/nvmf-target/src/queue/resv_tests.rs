//! Reservations through the command core: two hosts on one namespace, the
//! access checks on their I/O, notifications, and Preempt and Abort draining
//! the preempted host's in-flight writes.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use nvme_wire::reservation::{AcquireData, RegisterData, ReleaseData, log_type};
use nvme_wire::sqe::{Sqe, admin_opc, io_opc};
use nvme_wire::status;

use super::QueueCore;
use super::tests::*;
use crate::controller::AsyncEvent;

const A: [u8; 16] = [0xA; 16];
const B: [u8; 16] = [0xB; 16];

/// Host `hostid`'s admin queue (enabled, reservation AENs armed) and I/O queue.
struct Host {
    admin: QueueCore,
    arec: Rec,
    io: QueueCore,
    rec: Rec,
}

fn host(t: &Arc<crate::Target>, hostid: [u8; 16]) -> Host {
    let (admin, arec, cntlid) = admin_queue(t, hostid);
    let (io, rec) = io_queue(t, cntlid, hostid);
    Host {
        admin,
        arec,
        io,
        rec,
    }
}

fn resv(opc: u8, cid: u16, cdw10: u32, data: &[u8]) -> (Sqe, Vec<u8>) {
    let mut s = Sqe::new(opc, cid);
    s.nsid = 1;
    s.cdw10 = cdw10;
    (in_capsule(s, data.len()), data.to_vec())
}

impl Host {
    /// Runs one I/O command; returns its status code (type, code).
    fn cmd(&mut self, s: &Sqe, data: &[u8]) -> (u8, u8) {
        self.io.on_command(s, data, true, &mut self.rec);
        drain(&mut self.io, &mut self.rec);
        let c = self.rec.one();
        (c.status.sct, c.status.sc)
    }
    fn register(&mut self, rrega: u32, crkey: u64, nrkey: u64) -> (u8, u8) {
        let (s, d) = resv(
            io_opc::RESV_REGISTER,
            1,
            rrega,
            &RegisterData { crkey, nrkey }.encode(),
        );
        self.cmd(&s, &d)
    }
    fn acquire(&mut self, racqa: u32, rtype: u32, crkey: u64, prkey: u64) -> (u8, u8) {
        let d = AcquireData { crkey, prkey }.encode();
        let (s, d) = resv(io_opc::RESV_ACQUIRE, 2, racqa | (rtype << 8), &d);
        self.cmd(&s, &d)
    }
    fn release(&mut self, rrela: u32, rtype: u32, crkey: u64) -> (u8, u8) {
        let (s, d) = resv(
            io_opc::RESV_RELEASE,
            3,
            rrela | (rtype << 8),
            &ReleaseData { crkey }.encode(),
        );
        self.cmd(&s, &d)
    }
    fn write(&mut self) -> (u8, u8) {
        let mut s = Sqe::new(io_opc::WRITE, 4);
        s.nsid = 1;
        self.cmd(&in_capsule(s, 512), &[0x5A; 512])
    }
    fn read(&mut self) -> (u8, u8) {
        let mut s = Sqe::new(io_opc::READ, 5);
        s.nsid = 1;
        self.io.on_command(&xfer(s, 512), &[], true, &mut self.rec);
        drain(&mut self.io, &mut self.rec);
        let c = self.rec.take_resps()[0];
        (c.status.sct, c.status.sc)
    }
    /// Reservation Report (extended): (generation, rtype, registrant count).
    fn report(&mut self) -> (u32, u8, u16) {
        let mut s = Sqe::new(io_opc::RESV_REPORT, 6);
        s.nsid = 1;
        s.cdw10 = 4096 / 4 - 1;
        s.cdw11 = 1;
        self.io.on_command(&xfer(s, 4096), &[], true, &mut self.rec);
        let Some(Ev::Data { bytes, .. }) = self.rec.ev.first() else {
            panic!("no report data: {:?}", self.rec.ev);
        };
        let r = (
            u32::from_le_bytes(bytes[0..4].try_into().unwrap()),
            bytes[4],
            u16::from_le_bytes([bytes[5], bytes[6]]),
        );
        assert!(self.rec.take_resps()[0].status.is_success());
        r
    }
}

const OK: (u8, u8) = (0, 0);
const CONFLICT: (u8, u8) = (status::SCT_GENERIC, status::SC_RESERVATION_CONFLICT);

#[test]
fn write_exclusive_then_preempt_and_abort() {
    let t = target();
    let mut a = host(&t, A);
    let mut b = host(&t, B);
    assert_eq!(a.register(0, 0, 0xA1), OK);
    assert_eq!(b.register(0, 0, 0xB2), OK);
    assert_eq!(a.report(), (2, 0, 2));
    assert_eq!(a.acquire(0, 1, 0xA1, 0), OK);
    // Write Exclusive: the other host reads but does not write.
    assert_eq!(b.write(), CONFLICT);
    assert_eq!(b.read(), OK);
    assert_eq!(a.write(), OK);
    // A wrong key is a conflict and changes nothing.
    assert_eq!(b.acquire(2, 1, 0xBAD, 0xA1), CONFLICT);
    assert_eq!(a.write(), OK);
    // Preempt and abort: B holds it now, A is no longer registered.
    assert_eq!(b.acquire(2, 1, 0xB2, 0xA1), OK);
    assert_eq!(a.write(), CONFLICT);
    assert_eq!(b.write(), OK);
    assert_eq!(b.report(), (3, 1, 1));
    // A was told: an AEN for log page 80h, whose entry names the preemption.
    a.admin.on_command(
        &Sqe::new(admin_opc::ASYNC_EVENT_REQUEST, 9),
        &[],
        true,
        &mut a.arec,
    );
    let c = a.arec.one();
    assert_eq!(c.dw0, AsyncEvent::RESV_LOG.0);
    let mut s = Sqe::new(admin_opc::GET_LOG_PAGE, 10);
    s.cdw10 = 0x80 | ((64 / 4 - 1) << 16);
    s.nsid = 0xFFFF_FFFF;
    a.admin.on_command(&xfer(s, 64), &[], true, &mut a.arec);
    let Some(Ev::Data { bytes, .. }) = a.arec.ev.first() else {
        panic!("{:?}", a.arec.ev);
    };
    assert_eq!(bytes[8], log_type::REGISTRATION_PREEMPTED);
    assert_eq!(u32::from_le_bytes(bytes[12..16].try_into().unwrap()), 1);
    a.arec.take_resps();
    // Release, then clear.
    assert_eq!(b.release(0, 1, 0xB2), OK);
    assert_eq!(a.write(), OK);
    assert_eq!(b.release(1, 0, 0xB2), OK);
    assert_eq!(b.report().2, 0);
}

#[test]
fn bad_reservation_commands_are_refused() {
    let t = target();
    let mut a = host(&t, A);
    // Unknown acquire action: invalid field; nothing changed.
    assert_eq!(a.register(0, 0, 1), OK);
    assert_eq!(
        a.acquire(5, 1, 1, 0),
        (status::SCT_GENERIC, status::SC_INVALID_FIELD)
    );
    assert_eq!(a.report().1, 0);
    // Data length other than the command's: an SGL error.
    let (s, _) = resv(io_opc::RESV_REGISTER, 7, 0, &[0; 8]);
    assert_eq!(a.cmd(&s, &[0; 8]).1, status::SC_SGL_INVALID_DATA_LEN);
    // Classic report format with 128-bit host IDs: Host ID Inconsistent Format.
    let mut s = Sqe::new(io_opc::RESV_REPORT, 8);
    s.nsid = 1;
    s.cdw10 = 63;
    a.io.on_command(&xfer(s, 256), &[], true, &mut a.rec);
    assert_eq!(a.rec.one().status.sc, status::SC_HOST_ID_INCONSISTENT);
    // A report over the transfer limit.
    s.cdw10 = u32::MAX;
    s.cdw11 = 1;
    a.io.on_command(&xfer(s, 0), &[], true, &mut a.rec);
    assert_eq!(a.rec.one().status.sc, status::SC_INVALID_FIELD);
}

#[test]
fn a_zero_host_id_cannot_register() {
    let t = target();
    let mut z = host(&t, [0; 16]);
    assert_eq!(z.register(0, 0, 1).1, status::SC_HOST_ID_INCONSISTENT);
}

#[tokio::test]
async fn preempt_and_abort_waits_for_the_preempted_writes() {
    let t = target();
    let mut a = host(&t, A);
    let mut b = host(&t, B);
    assert_eq!(a.register(0, 0, 0xA1), OK);
    assert_eq!(b.register(0, 0, 0xB2), OK);
    assert_eq!(a.acquire(0, 1, 0xA1, 0), OK);
    // A write of A's that passed its check and is still on the device.
    let stats = a.io.bound.as_ref().unwrap().stats.clone();
    stats.writes_started.fetch_add(1, Ordering::SeqCst);
    // A's admin queue goes away first (keep-alive, EOF): its controller
    // leaves the target's map, but its I/O queue's write is still out.
    a.admin.close(crate::FreeReason::ConnectionClosed);
    let d = AcquireData {
        crkey: 0xB2,
        prkey: 0xA1,
    }
    .encode();
    let (s, d) = resv(io_opc::RESV_ACQUIRE, 20, 2 | (1 << 8), &d);
    b.io.on_command(&s, &d, true, &mut b.rec);
    assert!(
        b.rec.take_resps().is_empty(),
        "completed while A's write was in flight"
    );
    let (tag, mut fut) = b.rec.waiting.pop().expect("a drain to wait on");
    let waited = tokio::time::timeout(std::time::Duration::from_millis(20), &mut fut).await;
    assert!(waited.is_err(), "drain finished with the write still out");
    // More writes of A starting after the preempt do not hold it up.
    stats.writes_started.fetch_add(5, Ordering::SeqCst);
    stats.writes_done.fetch_add(1, Ordering::SeqCst);
    let done = tokio::time::timeout(std::time::Duration::from_secs(5), fut)
        .await
        .expect("drain did not finish");
    b.io.on_io_done(tag, done, &mut b.rec);
    assert!(b.rec.one().status.is_success());
    assert_eq!(a.write(), CONFLICT);
}

#[test]
fn writes_count_in_flight_until_they_complete() {
    let t = target();
    let mut a = host(&t, A);
    let stats = a.io.bound.as_ref().unwrap().stats.clone();
    assert_eq!(a.write(), OK);
    let in_flight =
        || stats.writes_started.load(Ordering::SeqCst) - stats.writes_done.load(Ordering::SeqCst);
    assert_eq!(stats.writes_started.load(Ordering::SeqCst), 1);
    assert_eq!(in_flight(), 0);
    // A refused write leaves no count behind.
    let mut b = host(&t, B);
    assert_eq!(b.register(0, 0, 2), OK);
    assert_eq!(b.acquire(0, 2, 2, 0), OK);
    assert_eq!(a.write(), CONFLICT);
    assert_eq!(a.read(), CONFLICT, "exclusive access");
    assert_eq!(in_flight(), 0);
}

/// A file namespace: registrations made with CPTPL = 11b (persist) and the
/// reservation come back after a "restart" (a new device on the same file);
/// CPTPL = 10b clears them for the next start.
#[test]
fn ptpl_keeps_registrations_across_a_restart() {
    use crate::subsystem::{Namespace, Subsystem};
    use blockdev::{BlockDevice, FileDevice, FileOptions};
    let dir = std::env::temp_dir().join(format!("fp-ptpl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ns.img");
    let _ = std::fs::remove_file(&path);
    let open = || -> Arc<dyn BlockDevice> {
        Arc::new(
            FileDevice::open(FileOptions {
                path: path.clone(),
                size: Some(1 << 20),
                block_size: 512,
                create: true,
            })
            .unwrap(),
        )
    };
    let start = |dev: Arc<dyn BlockDevice>| {
        target_with(Subsystem::new(
            NQN.into(),
            "CORE0002".into(),
            "flashpool core test".into(),
            true,
            Vec::new(),
            vec![Namespace::new(1, dev, [1; 16], [2; 16])],
        ))
    };
    let dev = open();
    if !dev.keeps_records() {
        eprintln!("skipped: {} keeps no records here", path.display());
        return;
    }
    {
        let t = start(dev.clone());
        let mut a = host(&t, A);
        let mut b = host(&t, B);
        assert_eq!(
            a.register(3 << 30, 0, 0xA1),
            OK,
            "register with CPTPL = persist"
        );
        assert_eq!(b.register(0, 0, 0xB2), OK);
        assert_eq!(a.acquire(0, 1, 0xA1, 0), OK);
        assert_eq!(a.report(), (2, 1, 2));
        dev.shutdown().unwrap();
    }
    drop(dev);
    let dev = open();
    {
        let t = start(dev.clone());
        let mut b = host(&t, B);
        let (generation, rtype, n) = b.report();
        assert_eq!(
            (generation, rtype, n),
            (2, 1, 2),
            "kept through the restart"
        );
        assert_eq!(b.write(), CONFLICT, "A's Write Exclusive still holds");
        let mut a = host(&t, A);
        assert_eq!(a.write(), OK);
        // Persistence off: the next start finds nothing.
        assert_eq!(a.register(2 << 30, 0xA1, 0xA1), OK);
        dev.shutdown().unwrap();
    }
    drop(dev);
    let t = start(open());
    let mut b = host(&t, B);
    assert_eq!(b.report().2, 0);
    assert_eq!(b.write(), OK);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One reservation AEN until the host reads log page 80h with RAE cleared;
/// a refused read (offset past the page) consumes nothing.
#[test]
fn reservation_aen_is_masked_until_the_log_is_read() {
    let t = target();
    let mut a = host(&t, A);
    let mut b = host(&t, B);
    assert_eq!(a.register(0, 0, 0xA1), OK);
    assert_eq!(b.register(0, 0, 0xB2), OK);
    assert_eq!(a.acquire(0, 4, 0xA1, 0), OK);
    // Two notifications for B: released (type change by preempt is A's own;
    // here A releases a registrants-only reservation, then takes it again
    // and releases again).
    assert_eq!(a.release(0, 4, 0xA1), OK);
    assert_eq!(a.acquire(0, 4, 0xA1, 0), OK);
    assert_eq!(a.release(0, 4, 0xA1), OK);
    let ctrl = b.admin.controller().unwrap().clone();
    assert_eq!(ctrl.state.lock().resv_log.len(), 2);
    let events = ctrl
        .state
        .lock()
        .pending_events
        .iter()
        .filter(|e| **e == AsyncEvent::RESV_LOG)
        .count();
    assert_eq!(events, 1, "one AEN for both");
    let log = |b: &mut Host, cid: u16, offset: u64, rae: bool| {
        let mut s = Sqe::new(admin_opc::GET_LOG_PAGE, cid);
        s.nsid = 0xFFFF_FFFF;
        s.cdw10 = 0x80 | ((64 / 4 - 1) << 16) | (u32::from(rae) << 15);
        s.cdw12 = offset as u32;
        b.admin.on_command(&xfer(s, 64), &[], true, &mut b.arec);
        let r = b.arec.ev.iter().find_map(|e| match e {
            Ev::Data { bytes, .. } => Some(bytes.clone()),
            _ => None,
        });
        let c = b.arec.take_resps()[0];
        (c.status.sc, r)
    };
    assert_eq!(log(&mut b, 80, 64, false).0, status::SC_INVALID_FIELD);
    assert_eq!(
        ctrl.state.lock().resv_log.len(),
        2,
        "refused read consumed nothing"
    );
    // Read with RAE set: the event stays masked.
    let (sc, page) = log(&mut b, 81, 0, true);
    assert_eq!(sc, 0);
    assert_eq!(page.unwrap()[8], log_type::RESERVATION_RELEASED);
    ctrl.state.lock().pending_events.clear();
    assert_eq!(a.acquire(0, 4, 0xA1, 0), OK);
    assert_eq!(a.release(0, 4, 0xA1), OK);
    assert!(
        ctrl.state.lock().pending_events.is_empty(),
        "masked until read with RAE = 0"
    );
    // RAE cleared: unmasked, and with entries left the AEN comes again.
    let (_, page) = log(&mut b, 82, 0, false);
    assert_eq!(page.unwrap()[9], 1, "one more available");
    assert_eq!(ctrl.state.lock().pending_events.len(), 1);
}

impl Host {
    /// Write Zeroes or Dataset Management (deallocate LBA 0..8): no host
    /// data for the first, one range for the second.
    fn zeroes_or_dsm(&mut self, dsm: bool) -> (u8, u8) {
        if !dsm {
            let mut s = Sqe::new(io_opc::WRITE_ZEROES, 7);
            s.nsid = 1;
            return self.cmd(&s, &[]);
        }
        let mut s = Sqe::new(io_opc::DATASET_MANAGEMENT, 7);
        s.nsid = 1;
        s.cdw11 = nvme_wire::sqe::DSM_ATTR_DEALLOCATE;
        let mut range = [0u8; 16];
        nvme_wire::sqe::DsmRange {
            attributes: 0,
            nlb: 8,
            slba: 0,
        }
        .encode(&mut range);
        self.cmd(&in_capsule(s, 16), &range)
    }
}

/// The fencing audit: writes of a host a Preempt removed are refused while
/// a Write Exclusive reservation stands (the count stays 0); once nothing
/// is reserved they are accepted, and each accepted one counts until the
/// host registers again.
#[test]
fn stale_write_audit_counts_accepted_writes_of_preempted_hosts() {
    let t = target();
    let ns = t.subsystems()[0].namespace(1).unwrap();
    let mut a = host(&t, A);
    let mut b = host(&t, B);
    assert_eq!(a.register(0, 0, 0xA1), OK);
    assert_eq!(b.register(0, 0, 0xB2), OK);
    assert_eq!(a.acquire(0, 1, 0xA1, 0), OK);
    assert_eq!(a.write(), OK);
    // B takes over: Preempt and Abort of A's key.
    assert_eq!(b.acquire(2, 1, 0xB2, 0xA1), OK);
    assert_eq!(ns.resv.preempted_hosts(), [A]);
    assert_eq!(a.write(), CONFLICT);
    assert_eq!(a.zeroes_or_dsm(false), CONFLICT);
    assert_eq!(a.zeroes_or_dsm(true), CONFLICT);
    assert_eq!(b.write(), OK);
    assert_eq!(t.stale_write_audit(), 0, "fenced: nothing of A landed");

    // Test only: B releases, nothing is reserved, so A's writes are
    // accepted again; the audit sees each of them (not B's, not reads).
    assert_eq!(b.release(0, 1, 0xB2), OK);
    assert_eq!(a.write(), OK);
    assert_eq!(a.zeroes_or_dsm(false), OK);
    assert_eq!(a.zeroes_or_dsm(true), OK);
    assert_eq!(a.read(), OK);
    assert_eq!(b.write(), OK);
    assert_eq!(ns.resv.stale_writes(), 3);
    assert_eq!(t.stale_write_audit(), 3);

    // A registers again: no longer a preempted host.
    assert_eq!(a.register(0, 0, 0xA3), OK);
    assert!(ns.resv.preempted_hosts().is_empty());
    assert_eq!(a.write(), OK);
    assert_eq!(t.stale_write_audit(), 3);

    // A plain Preempt puts it back in the set; B's reservation fences it.
    assert_eq!(b.acquire(0, 1, 0xB2, 0), OK);
    assert_eq!(b.acquire(1, 1, 0xB2, 0xA3), OK);
    assert_eq!(ns.resv.preempted_hosts(), [A]);
    assert_eq!(a.write(), CONFLICT);
    assert_eq!(t.stale_write_audit(), 3);
}

/// An Inaccessible group through the core: every I/O command, reservation
/// commands too, ends with the path status and moves no data.
#[test]
fn io_on_an_inaccessible_group_gets_the_ana_status() {
    use crate::AnaState;
    let t = target();
    let mut a = host(&t, A);
    assert_eq!(a.register(0, 0, 0xA1), OK);
    let path = |sc| (status::SCT_PATH, sc);
    t.set_ana_state(1, AnaState::Inaccessible);
    assert_eq!(a.write(), path(status::SC_ANA_INACCESSIBLE));
    assert_eq!(a.zeroes_or_dsm(true), path(status::SC_ANA_INACCESSIBLE));
    assert_eq!(a.register(0, 0, 0xA1), path(status::SC_ANA_INACCESSIBLE));
    let mut s = Sqe::new(io_opc::READ, 5);
    s.nsid = 1;
    a.io.on_command(&xfer(s, 512), &[], true, &mut a.rec);
    drain(&mut a.io, &mut a.rec);
    assert!(!a.rec.ev.iter().any(|e| matches!(e, Ev::Data { .. })));
    let c = a.rec.take_resps()[0];
    assert_eq!((c.status.sct, c.status.sc, c.status.dnr), (3, 2, false));
    t.set_ana_state(1, AnaState::Change);
    assert_eq!(a.write(), path(status::SC_ANA_TRANSITION));
    t.set_ana_state(1, AnaState::PersistentLoss);
    assert_eq!(a.write(), path(status::SC_ANA_PERSISTENT_LOSS));
    t.set_ana_state(1, AnaState::NonOptimized);
    assert_eq!(a.write(), OK);
    assert_eq!(a.read(), OK);
}

/// A target whose namespace keeps its reservation record on `dev`.
fn target_on_records(dev: Arc<crate::ns_resv::tests::RecordDev>) -> Arc<crate::Target> {
    use crate::subsystem::{Namespace, Subsystem};
    target_with(Subsystem::new(
        NQN.into(),
        "CORE0003".into(),
        "flashpool core test".into(),
        true,
        Vec::new(),
        vec![Namespace::new(1, dev, [1; 16], [2; 16])],
    ))
}

/// Sends a Register with CPTPL = persist (a record store) without waiting.
fn register_persist(h: &mut Host, cid: u16, nrkey: u64) {
    let (s, d) = resv(
        io_opc::RESV_REGISTER,
        cid,
        3 << 30,
        &RegisterData { crkey: 0, nrkey }.encode(),
    );
    h.io.on_command(&s, &d, true, &mut h.rec);
}

/// A record store that takes long (a volume member that stopped answering)
/// holds only the commands that store: the queue goes on serving the others
/// on the state before it, and commands that store wait in order behind it.
#[test]
fn a_slow_record_store_holds_only_the_commands_that_store() {
    let dev = crate::ns_resv::tests::RecordDev::new();
    let t = target_on_records(dev.clone());
    let mut a = host(&t, A);
    let mut b = host(&t, B);
    dev.hold(true);
    register_persist(&mut a, 1, 0xA1);
    assert!(
        a.rec.take_resps().is_empty(),
        "the register completes only once its record is stored"
    );
    dev.wait_started(1);
    assert_eq!(b.write(), OK, "other commands are served meanwhile");
    assert_eq!(b.read(), OK);
    assert_eq!(b.report(), (0, 0, 0), "on the state before the register");
    register_persist(&mut b, 7, 0xB2);
    assert!(
        b.rec.take_resps().is_empty(),
        "queued behind the first store"
    );
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(dev.started.load(Ordering::SeqCst), 1, "B's waits for A's");
    dev.hold(false);
    drain(&mut a.io, &mut a.rec);
    drain(&mut b.io, &mut b.rec);
    assert!(a.rec.one().status.is_success());
    assert!(b.rec.one().status.is_success());
    assert_eq!(b.report(), (2, 0, 2));
    // Stored in the order they came: A's record, then both.
    let h = dev.history.lock().clone();
    let registered = |rec: &[u8]| {
        let (s, _) = crate::resv_record::decode(rec).unwrap();
        (s.is_registered(&A), s.is_registered(&B))
    };
    assert_eq!(h.len(), 2);
    assert_eq!(
        (registered(&h[0]), registered(&h[1])),
        ((true, false), (true, true))
    );
}

/// A store that fails refuses its command and changes nothing; a fenced
/// device's refusal is a path error, so the host retries on another path.
#[test]
fn a_failed_store_on_the_worker_refuses_the_command() {
    let dev = crate::ns_resv::tests::RecordDev::new();
    let t = target_on_records(dev.clone());
    let mut a = host(&t, A);
    dev.fail.store(true, Ordering::SeqCst);
    register_persist(&mut a, 1, 0xA1);
    drain(&mut a.io, &mut a.rec);
    let c = a.rec.one();
    assert_eq!(
        (c.status.sct, c.status.sc),
        (status::SCT_PATH, status::SC_ANA_INACCESSIBLE)
    );
    assert_eq!(a.report(), (0, 0, 0));
    dev.fail.store(false, Ordering::SeqCst);
    register_persist(&mut a, 1, 0xA1);
    drain(&mut a.io, &mut a.rec);
    assert!(a.rec.one().status.is_success());
    assert_eq!(a.report(), (1, 0, 1));
}

/// Set Features Reservation Persistence stores the record the same way: the
/// admin queue goes on answering while it is stored, and Get Features reads
/// the new value once it completes.
#[test]
fn set_ptpl_stores_off_the_admin_queue() {
    use nvme_wire::reservation::FID_RESV_PERSISTENCE;
    let dev = crate::ns_resv::tests::RecordDev::new();
    let t = target_on_records(dev.clone());
    let mut a = host(&t, A);
    assert_eq!(a.register(0, 0, 0xA1), OK, "no store: PTPL is off");
    assert_eq!(dev.stores.load(Ordering::SeqCst), 0);
    let feature = |opc, cid| {
        let mut s = Sqe::new(opc, cid);
        s.nsid = 1;
        s.cdw10 = u32::from(FID_RESV_PERSISTENCE);
        s.cdw11 = 1;
        s
    };
    dev.hold(true);
    a.admin.on_command(
        &feature(admin_opc::SET_FEATURES, 20),
        &[],
        true,
        &mut a.arec,
    );
    assert!(a.arec.take_resps().is_empty(), "waits for its store");
    dev.wait_started(1);
    a.admin.on_command(
        &feature(admin_opc::GET_FEATURES, 21),
        &[],
        true,
        &mut a.arec,
    );
    let c = a.arec.one();
    assert_eq!(
        (c.cid, c.dw0),
        (21, 0),
        "answered meanwhile, PTPL still off"
    );
    dev.hold(false);
    drain(&mut a.admin, &mut a.arec);
    let c = a.arec.one();
    assert!(c.cid == 20 && c.status.is_success(), "{c:?}");
    assert_eq!(dev.stores.load(Ordering::SeqCst), 1);
    a.admin.on_command(
        &feature(admin_opc::GET_FEATURES, 22),
        &[],
        true,
        &mut a.arec,
    );
    assert_eq!(a.arec.one().dw0, 1);
}

/// Set Features PTPL over every namespace (NSID FFFFFFFFh) is all or
/// nothing: a store refused on one namespace sets the others back.
#[test]
fn set_ptpl_on_every_namespace_is_undone_where_it_took_when_one_fails() {
    use crate::subsystem::{Namespace, Subsystem};
    use nvme_wire::reservation::FID_RESV_PERSISTENCE;
    let good = crate::ns_resv::tests::RecordDev::new();
    let bad = crate::ns_resv::tests::RecordDev::new();
    bad.fail.store(true, Ordering::SeqCst);
    let t = target_with(Subsystem::new(
        NQN.into(),
        "CORE0004".into(),
        "flashpool core test".into(),
        true,
        Vec::new(),
        vec![
            Namespace::new(1, good.clone(), [1; 16], [2; 16]),
            Namespace::new(2, bad.clone(), [3; 16], [4; 16]),
        ],
    ));
    let mut a = host(&t, A);
    let feature = |opc, cid, nsid| {
        let mut s = Sqe::new(opc, cid);
        s.nsid = nsid;
        s.cdw10 = u32::from(FID_RESV_PERSISTENCE);
        s.cdw11 = 1;
        s
    };
    a.admin.on_command(
        &feature(admin_opc::SET_FEATURES, 30, 0xFFFF_FFFF),
        &[],
        true,
        &mut a.arec,
    );
    drain(&mut a.admin, &mut a.arec);
    let c = a.arec.one();
    assert!(c.cid == 30 && !c.status.is_success(), "{c:?}");
    for (nsid, cid) in [(1, 31), (2, 32)] {
        a.admin.on_command(
            &feature(admin_opc::GET_FEATURES, cid, nsid),
            &[],
            true,
            &mut a.arec,
        );
        assert_eq!(a.arec.one().dw0, 0, "nsid {nsid}: PTPL stays off");
    }
    // Namespace 1 stored PTPL on, then off again; its record says off.
    assert_eq!(good.stores.load(Ordering::SeqCst), 2);
    let again = crate::ns_resv::NsReservations::load(&*good);
    assert!(!again.ptpl());
}

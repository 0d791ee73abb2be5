//! NVMe reservations over raw TCP: malformed Register/Acquire/Release/Report
//! commands each get the spec's status and leave the queue (and another
//! connection) working; two hosts fence each other with Write Exclusive and
//! Preempt and Abort, with the AEN and log page 80h that follow; an I/O queue
//! Connect with another Host Identifier than its controller's is accepted (as
//! nvmet and SPDK do) and the controller's stays the registrant's.

use fault_tests::*;
use nvme_wire::cqe::Cqe;
use nvme_wire::log_page::GetLogPage;
use nvme_wire::reservation::{
    LID_RESERVATION_NOTIFICATION, REPORT_EXT_ENTRY_LEN, REPORT_EXT_HEADER_LEN, RESV_LOG_LEN,
    ResvLogEntry, log_type,
};
use nvme_wire::sqe::{SGL_TRANSPORT_DATA_BLOCK, SglDesc, Sqe, admin_opc, io_opc};
use nvme_wire::status::{self, SCT_CMD_SPECIFIC, SCT_GENERIC};

const HOST_A: [u8; 16] = [0xA1; 16];
const HOST_B: [u8; 16] = [0xB2; 16];
const KEY_A: u64 = 0xAAAA_0000_0000_0001;
const KEY_B: u64 = 0xBBBB_0000_0000_0002;

/// RTYPE 1: Write Exclusive.
const WRITE_EXCLUSIVE: u8 = 1;
/// RACQA values.
const ACQUIRE: u8 = 0;
const PREEMPT_AND_ABORT: u8 = 2;
/// Async event: type 6 (I/O command specific), info 0 (reservation log page available), log 80h.
const AEN_RESV_LOG: u32 = 0x0080_0006;

/// A block of the lower half of the namespace (the healthy controller
/// writes only in the upper half).
const LBA: u64 = 64;

fn resv_sqe(h: &mut Host, opc: u8, nsid: u32, cdw10: u32) -> Sqe {
    let cid = h.next_cid();
    let mut s = Sqe::new(opc, cid);
    s.nsid = nsid;
    s.cdw10 = cdw10;
    s
}

fn key_data(a: u64, b: u64) -> [u8; 16] {
    let mut d = [0u8; 16];
    d[..8].copy_from_slice(&a.to_le_bytes());
    d[8..].copy_from_slice(&b.to_le_bytes());
    d
}

/// Reservation Register (RREGA in bits 2:0), data in capsule.
fn register(h: &mut Host, nsid: u32, rrega: u8, crkey: u64, nrkey: u64) -> Cqe {
    let s = resv_sqe(h, io_opc::RESV_REGISTER, nsid, u32::from(rrega));
    let c = h.data_out(s, &key_data(crkey, nrkey), true);
    assert_eq!(c.cid, s.cid);
    c
}

fn acquire(h: &mut Host, nsid: u32, racqa: u8, rtype: u8, crkey: u64, prkey: u64) -> Cqe {
    let s = resv_sqe(
        h,
        io_opc::RESV_ACQUIRE,
        nsid,
        u32::from(racqa) | (u32::from(rtype) << 8),
    );
    let c = h.data_out(s, &key_data(crkey, prkey), true);
    assert_eq!(c.cid, s.cid);
    c
}

fn release(h: &mut Host, nsid: u32, rrela: u8, rtype: u8, crkey: u64) -> Cqe {
    let s = resv_sqe(
        h,
        io_opc::RESV_RELEASE,
        nsid,
        u32::from(rrela) | (u32::from(rtype) << 8),
    );
    let c = h.data_out(s, &crkey.to_le_bytes(), true);
    assert_eq!(c.cid, s.cid);
    c
}

/// Reservation Report with `numd` (0-based dwords) and EDS; the SGL asks
/// for `sgl_len` bytes.
fn report_raw(h: &mut Host, nsid: u32, numd: u32, eds: bool, sgl_len: u32) -> (Cqe, Vec<u8>) {
    let mut s = resv_sqe(h, io_opc::RESV_REPORT, nsid, numd);
    s.cdw11 = u32::from(eds);
    let (c, d) = h.data_in(s, sgl_len);
    assert_eq!(c.cid, s.cid);
    (c, d)
}

/// Extended report of 4 KiB that must succeed.
fn report(h: &mut Host) -> Vec<u8> {
    let (c, d) = report_raw(h, 1, 4096 / 4 - 1, true, 4096);
    assert_status(&c, 0, 0, "Reservation Report (EDS 1)");
    assert_eq!(d.len(), 4096, "Report returns what NUMD asked for");
    d
}

struct ReportView {
    generation: u32,
    rtype: u8,
    regctl: u16,
    /// (cntlid, holds, rkey, hostid)
    entries: Vec<(u16, bool, u64, [u8; 16])>,
}

fn parse_report(d: &[u8]) -> ReportView {
    let regctl = u16::from_le_bytes([d[5], d[6]]);
    let mut entries = Vec::new();
    for i in 0..usize::from(regctl) {
        let e = &d[REPORT_EXT_HEADER_LEN + i * REPORT_EXT_ENTRY_LEN..][..REPORT_EXT_ENTRY_LEN];
        entries.push((
            u16::from_le_bytes([e[0], e[1]]),
            e[2] & 1 != 0,
            u64::from_le_bytes(e[8..16].try_into().expect("8")),
            e[16..32].try_into().expect("16"),
        ));
    }
    ReportView {
        generation: u32::from_le_bytes(d[0..4].try_into().expect("4")),
        rtype: d[4],
        regctl,
        entries,
    }
}

fn expect_generic_dnr(c: &Cqe, sc: u8, what: &str) {
    assert_status(c, SCT_GENERIC, sc, what);
    assert!(c.status.dnr, "{what}: DNR must be set for SC {sc:#x}");
}

/// A normal 1-block Read on `io` must still work.
fn read_ok(io: &mut Host, what: &str) {
    let (c, _) = match io.try_read(1, LBA, 1) {
        Ok(r) => r,
        Err(e) => panic!("Read after {what}: {e}"),
    };
    assert_status(&c, 0, 0, &format!("Read after {what}"));
}

/// A Read on the other (healthy) controller, which may be fenced from writing.
fn other_reads(h: &mut Healthy) {
    let (c, _) = h.io.read(1, NS_BLOCKS / 2, 1);
    assert_status(&c, 0, 0, "Read on the other connection");
}

// ---------------------------------------------------------------- malformed commands

#[test]
fn register_with_wrong_data_length_is_sgl_invalid_data_length() {
    let t = TestTarget::start();
    let mut healthy = t.healthy();
    healthy.verify();
    let (_admin, mut io) = t.admin_and_io_hostid(HOST_A, true);
    // 8 bytes instead of 16, in the capsule: SGL Data Length Invalid (0Fh).
    for (len, in_capsule) in [
        (8usize, true),
        (8, false),
        (24, true),
        (32, false),
        (0, true),
    ] {
        let s = resv_sqe(&mut io, io_opc::RESV_REGISTER, 1, 0);
        let data = vec![0x5Au8; len];
        let c = if len == 0 {
            io.send_capsule(&s, &[]);
            io.expect_resp()
        } else {
            // An R2T would be a failure here: the length is refused before any data moves.
            io.data_out(s, &data, in_capsule)
        };
        assert_eq!(c.cid, s.cid);
        let what = format!("Register with {len} bytes (in capsule {in_capsule})");
        expect_generic_dnr(&c, status::SC_SGL_INVALID_DATA_LEN, &what);
        read_ok(&mut io, &what);
    }
    // Acquire with 8 bytes, Release with 16.
    let s = resv_sqe(
        &mut io,
        io_opc::RESV_ACQUIRE,
        1,
        u32::from(WRITE_EXCLUSIVE) << 8,
    );
    let c = io.data_out(s, &[0u8; 8], true);
    expect_generic_dnr(&c, status::SC_SGL_INVALID_DATA_LEN, "Acquire with 8 bytes");
    let s = resv_sqe(
        &mut io,
        io_opc::RESV_RELEASE,
        1,
        u32::from(WRITE_EXCLUSIVE) << 8,
    );
    let c = io.data_out(s, &[0u8; 16], true);
    expect_generic_dnr(&c, status::SC_SGL_INVALID_DATA_LEN, "Release with 16 bytes");
    // Nothing got registered by the refused commands.
    let r = parse_report(&report(&mut io));
    assert_eq!(
        (r.regctl, r.rtype),
        (0, 0),
        "no registrant after refused Registers"
    );
    read_ok(&mut io, "refused Acquire/Release");
    healthy.verify();
}

#[test]
fn register_by_r2t_works() {
    let t = TestTarget::start();
    let mut healthy = t.healthy();
    let (admin, mut io) = t.admin_and_io_hostid(HOST_A, true);
    let s = resv_sqe(&mut io, io_opc::RESV_REGISTER, 1, 0);
    let c = io.data_out(s, &key_data(0, KEY_A), false);
    assert_status(&c, 0, 0, "Register with data by R2T");
    let r = parse_report(&report(&mut io));
    assert_eq!(r.regctl, 1);
    assert_eq!(r.entries, vec![(admin.cntlid, false, KEY_A, HOST_A)]);
    // Acquire and Release by R2T too.
    let s = resv_sqe(
        &mut io,
        io_opc::RESV_ACQUIRE,
        1,
        u32::from(WRITE_EXCLUSIVE) << 8,
    );
    let c = io.data_out(s, &key_data(KEY_A, 0), false);
    assert_status(&c, 0, 0, "Acquire by R2T");
    assert_eq!(parse_report(&report(&mut io)).rtype, WRITE_EXCLUSIVE);
    let s = resv_sqe(
        &mut io,
        io_opc::RESV_RELEASE,
        1,
        u32::from(WRITE_EXCLUSIVE) << 8,
    );
    let c = io.data_out(s, &KEY_A.to_le_bytes(), false);
    assert_status(&c, 0, 0, "Release by R2T");
    // Unregister (RREGA 1) by R2T.
    let s = resv_sqe(&mut io, io_opc::RESV_REGISTER, 1, 1);
    let c = io.data_out(s, &key_data(KEY_A, 0), false);
    assert_status(&c, 0, 0, "Unregister by R2T");
    assert_eq!(parse_report(&report(&mut io)).regctl, 0);
    read_ok(&mut io, "R2T reservation commands");
    healthy.verify();
}

#[test]
fn acquire_and_release_field_errors() {
    let t = TestTarget::start();
    let mut healthy = t.healthy();
    let (_admin, mut io) = t.admin_and_io_hostid(HOST_A, true);
    let c = register(&mut io, 1, 0, 0, KEY_A);
    assert_status(&c, 0, 0, "Register");

    // Unknown RACQA (3..=7) with the right key: Invalid Field.
    for racqa in [3u8, 5, 7] {
        let c = acquire(&mut io, 1, racqa, WRITE_EXCLUSIVE, KEY_A, 0);
        let what = format!("Acquire with RACQA {racqa}");
        expect_generic_dnr(&c, status::SC_INVALID_FIELD, &what);
        read_ok(&mut io, &what);
    }
    // RTYPE 0 and 7 (and 255): Invalid Field.
    for rtype in [0u8, 7, 0xFF] {
        let c = acquire(&mut io, 1, ACQUIRE, rtype, KEY_A, 0);
        let what = format!("Acquire with RTYPE {rtype}");
        expect_generic_dnr(&c, status::SC_INVALID_FIELD, &what);
        read_ok(&mut io, &what);
    }
    // A wrong CRKEY: Reservation Conflict.
    let c = acquire(&mut io, 1, ACQUIRE, WRITE_EXCLUSIVE, KEY_A ^ 1, 0);
    assert_status(
        &c,
        SCT_GENERIC,
        status::SC_RESERVATION_CONFLICT,
        "Acquire with a wrong CRKEY",
    );
    read_ok(&mut io, "Acquire with a wrong CRKEY");
    // None of those took the reservation.
    assert_eq!(
        parse_report(&report(&mut io)).rtype,
        0,
        "no reservation after refusals"
    );
    other_reads(&mut healthy);
    healthy.verify();

    // Hold Write Exclusive; a Release naming another type is Invalid Field.
    let c = acquire(&mut io, 1, ACQUIRE, WRITE_EXCLUSIVE, KEY_A, 0);
    assert_status(&c, 0, 0, "Acquire Write Exclusive");
    for rtype in [2u8, 3, 6, 0, 7] {
        let c = release(&mut io, 1, 0, rtype, KEY_A);
        let what = format!("Release of type {rtype} while holding type 1");
        expect_generic_dnr(&c, status::SC_INVALID_FIELD, &what);
        read_ok(&mut io, &what);
    }
    // Unknown RRELA (2): Invalid Field; wrong key: Reservation Conflict.
    let c = release(&mut io, 1, 2, WRITE_EXCLUSIVE, KEY_A);
    expect_generic_dnr(&c, status::SC_INVALID_FIELD, "Release with RRELA 2");
    let c = release(&mut io, 1, 0, WRITE_EXCLUSIVE, KEY_B);
    assert_status(
        &c,
        SCT_GENERIC,
        status::SC_RESERVATION_CONFLICT,
        "Release with a wrong CRKEY",
    );
    // Still held by us.
    let r = parse_report(&report(&mut io));
    assert_eq!(r.rtype, WRITE_EXCLUSIVE);
    assert_eq!(r.entries.len(), 1);
    assert!(r.entries[0].1, "still the holder");
    // The other controller (not a registrant) may read but not write.
    other_reads(&mut healthy);
    let c = healthy.io.write(1, NS_BLOCKS / 2, &[7u8; 512]);
    assert_status(
        &c,
        SCT_GENERIC,
        status::SC_RESERVATION_CONFLICT,
        "unregistered host's Write",
    );

    let c = release(&mut io, 1, 0, WRITE_EXCLUSIVE, KEY_A);
    assert_status(&c, 0, 0, "Release");
    // Unknown RREGA (3..=7): Invalid Field.
    for rrega in [3u8, 7] {
        let c = register(&mut io, 1, rrega, KEY_A, KEY_B);
        expect_generic_dnr(
            &c,
            status::SC_INVALID_FIELD,
            &format!("Register with RREGA {rrega}"),
        );
    }
    let c = register(&mut io, 1, 1, KEY_A, 0);
    assert_status(&c, 0, 0, "Unregister");
    read_ok(&mut io, "Unregister");
    healthy.verify();
}

#[test]
fn report_errors_and_short_report() {
    let t = TestTarget::start();
    let mut healthy = t.healthy();
    let (admin, mut io) = t.admin_and_io_hostid(HOST_A, true);
    let c = register(&mut io, 1, 0, 0, KEY_A);
    assert_status(&c, 0, 0, "Register");

    // EDS = 0 (64-bit host IDs): Host Identifier Inconsistent Format.
    let (c, d) = report_raw(&mut io, 1, 4096 / 4 - 1, false, 4096);
    expect_generic_dnr(&c, status::SC_HOST_ID_INCONSISTENT, "Report with EDS 0");
    assert!(d.is_empty(), "no data with an error");
    read_ok(&mut io, "Report with EDS 0");

    // NUMD FFFFFFFFh is 16 GiB, far over MDTS: Invalid Field, no data.
    let (c, d) = report_raw(&mut io, 1, 0xFFFF_FFFF, true, 4096);
    expect_generic_dnr(&c, status::SC_INVALID_FIELD, "Report with NUMD FFFFFFFFh");
    assert!(d.is_empty());
    read_ok(&mut io, "Report with NUMD FFFFFFFFh");
    // Just over MDTS.
    let (c, _) = report_raw(&mut io, 1, MAX_TRANSFER / 4, true, MAX_TRANSFER + 4);
    expect_generic_dnr(&c, status::SC_INVALID_FIELD, "Report of MDTS + 4 bytes");
    read_ok(&mut io, "Report of MDTS + 4 bytes");

    // The SGL must describe what NUMD asks for.
    let (c, d) = report_raw(&mut io, 1, 4096 / 4 - 1, true, 512);
    expect_generic_dnr(
        &c,
        status::SC_SGL_INVALID_DATA_LEN,
        "Report with SGL shorter than NUMD",
    );
    assert!(d.is_empty());
    read_ok(&mut io, "Report with SGL shorter than NUMD");

    // The full report, then a short one (NUMD 4: 5 dwords, 20 bytes) that is
    // exactly its first 20 bytes.
    let full = report(&mut io);
    let r = parse_report(&full);
    assert_eq!((r.rtype, r.regctl), (0, 1));
    assert_eq!(r.entries, vec![(admin.cntlid, false, KEY_A, HOST_A)]);
    for numd in [0u32, 1, 4, 5, 15] {
        let len = (numd + 1) * 4;
        let (c, d) = report_raw(&mut io, 1, numd, true, len);
        assert_status(&c, 0, 0, &format!("Report NUMD {numd}"));
        assert_eq!(
            d.len(),
            len as usize,
            "Report NUMD {numd} returns exactly {len} bytes"
        );
        assert_eq!(
            &d[..],
            &full[..len as usize],
            "short report is the head of the full one"
        );
        assert_eq!(
            u32::from_le_bytes(d[0..4].try_into().expect("4")),
            r.generation,
            "generation"
        );
        if len >= 7 {
            assert_eq!(
                u16::from_le_bytes([d[5], d[6]]),
                1,
                "REGCTL in a short report"
            );
        }
        read_ok(&mut io, &format!("Report NUMD {numd}"));
    }
    let c = register(&mut io, 1, 1, KEY_A, 0);
    assert_status(&c, 0, 0, "Unregister");
    healthy.verify();
}

/// The Report buffer past the Reservation Status structure must not carry
/// stale bytes of earlier commands on the queue (Connect data, write data).
#[test]
fn report_past_the_structure_is_zero() {
    let t = TestTarget::start();
    let (_admin, mut io) = t.admin_and_io_hostid(HOST_A, true);
    assert_status(&register(&mut io, 1, 0, 0, KEY_A), 0, 0, "Register");
    // Leave a recognisable pattern in the queue's buffers.
    assert_status(&io.write(1, LBA, &[0x5A; 4096]), 0, 0, "Write");
    let (c, _) = io.read(1, LBA, 8);
    assert_status(&c, 0, 0, "Read");
    let full = report(&mut io);
    let end = REPORT_EXT_HEADER_LEN + REPORT_EXT_ENTRY_LEN;
    let tail = &full[end..];
    let first = tail.iter().position(|&b| b != 0);
    assert!(
        first.is_none(),
        "bytes past the last entry must be zero; {} of {} are not, first at offset {:?}: {:02x?}",
        tail.iter().filter(|&&b| b != 0).count(),
        tail.len(),
        first.map(|i| i + end),
        first.map(|i| &tail[i..(i + 32).min(tail.len())])
    );
}

#[test]
fn reservation_opcodes_on_admin_queue_are_invalid_opcode() {
    let t = TestTarget::start();
    let mut healthy = t.healthy();
    let (mut admin, mut io) = t.admin_and_io_hostid(HOST_A, false);
    for (opc, data) in [
        (io_opc::RESV_REGISTER, key_data(0, KEY_A).to_vec()),
        (io_opc::RESV_ACQUIRE, key_data(KEY_A, 0).to_vec()),
        (io_opc::RESV_RELEASE, KEY_A.to_le_bytes().to_vec()),
    ] {
        let s = resv_sqe(&mut admin, opc, 1, 0);
        let c = admin.data_out(s, &data, true);
        expect_generic_dnr(
            &c,
            status::SC_INVALID_OPCODE,
            &format!("admin opcode {opc:#x}"),
        );
    }
    let mut s = resv_sqe(&mut admin, io_opc::RESV_REPORT, 1, 4096 / 4 - 1);
    s.cdw11 = 1;
    let (c, d) = admin.data_in(s, 4096);
    expect_generic_dnr(&c, status::SC_INVALID_OPCODE, "admin opcode 0x0e");
    assert!(d.is_empty());
    // The admin queue still works, nothing got registered.
    let ka = Sqe::new(admin_opc::KEEP_ALIVE, 999);
    admin.send_capsule(&ka, &[]);
    admin.expect_status(999, 0, 0);
    assert_eq!(parse_report(&report(&mut io)).regctl, 0);
    read_ok(&mut io, "reservation opcodes on the admin queue");
    healthy.verify();
}

#[test]
fn reservation_commands_on_invalid_nsid_are_invalid_namespace() {
    let t = TestTarget::start();
    let mut healthy = t.healthy();
    let (_admin, mut io) = t.admin_and_io_hostid(HOST_A, true);
    for nsid in [0u32, 2, 0x1000, 0xFFFF_FFFE, 0xFFFF_FFFF] {
        let c = register(&mut io, nsid, 0, 0, KEY_A);
        expect_generic_dnr(
            &c,
            status::SC_INVALID_NS,
            &format!("Register nsid {nsid:#x}"),
        );
        let c = acquire(&mut io, nsid, ACQUIRE, WRITE_EXCLUSIVE, KEY_A, 0);
        expect_generic_dnr(
            &c,
            status::SC_INVALID_NS,
            &format!("Acquire nsid {nsid:#x}"),
        );
        let c = release(&mut io, nsid, 0, WRITE_EXCLUSIVE, KEY_A);
        expect_generic_dnr(
            &c,
            status::SC_INVALID_NS,
            &format!("Release nsid {nsid:#x}"),
        );
        let (c, d) = report_raw(&mut io, nsid, 4096 / 4 - 1, true, 4096);
        expect_generic_dnr(&c, status::SC_INVALID_NS, &format!("Report nsid {nsid:#x}"));
        assert!(d.is_empty());
        read_ok(&mut io, &format!("reservation commands on nsid {nsid:#x}"));
    }
    // R2T form with a bad nsid: refused before any R2T.
    let s = resv_sqe(&mut io, io_opc::RESV_REGISTER, 0, 0);
    let c = io.data_out(s, &key_data(0, KEY_A), false);
    expect_generic_dnr(&c, status::SC_INVALID_NS, "Register nsid 0 by R2T");
    assert_eq!(parse_report(&report(&mut io)).regctl, 0);
    read_ok(&mut io, "bad nsids");
    healthy.verify();
}

// ---------------------------------------------------------------- two hosts

fn post_aer(admin: &mut Host) -> u16 {
    let cid = admin.next_cid();
    let s = Sqe::new(admin_opc::ASYNC_EVENT_REQUEST, cid);
    admin.send_capsule(&s, &[]);
    cid
}

fn resv_log(admin: &mut Host) -> ResvLogEntry {
    let cid = admin.next_cid();
    let mut s = GetLogPage {
        lid: LID_RESERVATION_NOTIFICATION,
        lsp: 0,
        rae: false,
        len: RESV_LOG_LEN as u64,
        offset: 0,
    }
    .to_sqe(cid);
    s.sgl = SglDesc {
        addr: 0,
        length: RESV_LOG_LEN as u32,
        type_byte: SGL_TRANSPORT_DATA_BLOCK,
    };
    let (c, d) = admin.data_in(s, RESV_LOG_LEN as u32);
    assert_status(&c, 0, 0, "Get Log Page 80h");
    assert_eq!(d.len(), RESV_LOG_LEN);
    ResvLogEntry::decode(&d).expect("log 80h decodes")
}

#[test]
fn two_hosts_write_exclusive_and_preempt_and_abort() {
    let t = TestTarget::start();
    let mut healthy = t.healthy();
    healthy.verify();
    let (mut admin_a, mut io_a) = t.admin_and_io_hostid(HOST_A, true);
    let (admin_b, mut io_b) = t.admin_and_io_hostid(HOST_B, true);
    assert_ne!(admin_a.cntlid, admin_b.cntlid);

    // A posts an AER before anything happens; nothing completes it yet.
    let aer = post_aer(&mut admin_a);
    assert!(
        admin_a.quiet_for(std::time::Duration::from_millis(200)),
        "AER held"
    );

    assert_status(&register(&mut io_a, 1, 0, 0, KEY_A), 0, 0, "A registers");
    assert_status(&register(&mut io_b, 1, 0, 0, KEY_B), 0, 0, "B registers");
    assert_status(
        &acquire(&mut io_a, 1, ACQUIRE, WRITE_EXCLUSIVE, KEY_A, 0),
        0,
        0,
        "A acquires Write Exclusive",
    );
    let r = parse_report(&report(&mut io_b));
    assert_eq!((r.rtype, r.regctl), (WRITE_EXCLUSIVE, 2));
    let mut ents = r.entries.clone();
    ents.sort();
    let mut want = vec![
        (admin_a.cntlid, true, KEY_A, HOST_A),
        (admin_b.cntlid, false, KEY_B, HOST_B),
    ];
    want.sort();
    assert_eq!(ents, want, "report as seen by B");

    // A (holder) writes; B (registrant, not holder, type 1) may only read.
    assert_status(&io_a.write(1, LBA, &[0xA1; 4096]), 0, 0, "holder A writes");
    let c = io_b.write(1, LBA, &[0xB2; 4096]);
    assert_status(
        &c,
        SCT_GENERIC,
        status::SC_RESERVATION_CONFLICT,
        "B's Write under A's WE",
    );
    // R2T-sized writes are fenced too, before any data moves.
    let c = io_b.write(1, LBA, &[0xB2; 3 * ICD as usize]);
    assert_status(
        &c,
        SCT_GENERIC,
        status::SC_RESERVATION_CONFLICT,
        "B's R2T Write",
    );
    let (c, d) = io_b.read(1, LBA, 8);
    assert_status(&c, 0, 0, "B's Read under A's WE");
    assert_eq!(d, vec![0xA1; 4096], "B reads what A wrote");
    // Write Zeroes and DSM are writes too.
    let s = io_b.rw_sqe(io_opc::WRITE_ZEROES, 1, LBA, 1);
    io_b.send_capsule(&s, &[]);
    io_b.expect_status(s.cid, SCT_GENERIC, status::SC_RESERVATION_CONFLICT);

    // B preempts A and aborts A's commands.
    let c = acquire(
        &mut io_b,
        1,
        PREEMPT_AND_ABORT,
        WRITE_EXCLUSIVE,
        KEY_B,
        KEY_A,
    );
    assert_status(&c, 0, 0, "B preempt-and-aborts A");

    // A's registration is gone: its writes conflict, reads work.
    let c = io_a.write(1, LBA, &[0xA2; 512]);
    assert_status(
        &c,
        SCT_GENERIC,
        status::SC_RESERVATION_CONFLICT,
        "A's Write after preemption",
    );
    let (c, _) = io_a.read(1, LBA, 1);
    assert_status(&c, 0, 0, "A's Read after preemption");
    assert_status(
        &io_b.write(1, LBA, &[0xB3; 512]),
        0,
        0,
        "new holder B writes",
    );

    // A's AER completes: Reservation Log Page Available (type 6, info 0, log 80h).
    let c = admin_a.expect_resp();
    assert_eq!(c.cid, aer, "the AER completes");
    assert_status(&c, 0, 0, "AER");
    assert_eq!(c.dw0, AEN_RESV_LOG, "AER dw0 {:#x}", c.dw0);

    let e = resv_log(&mut admin_a);
    assert_eq!(
        e.log_type,
        log_type::REGISTRATION_PREEMPTED,
        "log 80h type: {e:?}"
    );
    assert_eq!(e.nsid, 1, "log 80h nsid: {e:?}");
    assert_ne!(e.count, 0, "log 80h count: {e:?}");
    // Read to empty; the page then reads back as an empty entry.
    let mut left = e.available;
    let mut guard = 0;
    while left > 0 && guard < 300 {
        left = resv_log(&mut admin_a).available;
        guard += 1;
    }
    let empty = resv_log(&mut admin_a);
    assert_eq!(
        empty.log_type,
        log_type::EMPTY,
        "log 80h after reading all: {empty:?}"
    );

    let r = parse_report(&report(&mut io_b));
    assert_eq!(r.rtype, WRITE_EXCLUSIVE);
    assert_eq!(
        r.entries,
        vec![(admin_b.cntlid, true, KEY_B, HOST_B)],
        "only B, holding"
    );

    // A's admin queue still works; A may register again.
    let ka = Sqe::new(admin_opc::KEEP_ALIVE, 4000);
    admin_a.send_capsule(&ka, &[]);
    admin_a.expect_status(4000, 0, 0);
    assert_status(
        &register(&mut io_a, 1, 0, 0, KEY_A),
        0,
        0,
        "A registers again",
    );

    // B clears everything; the healthy (unregistered) controller writes again.
    let c = release(&mut io_b, 1, 1, 0, KEY_B);
    assert_status(&c, 0, 0, "B clears");
    let r = parse_report(&report(&mut io_a));
    assert_eq!((r.rtype, r.regctl), (0, 0));
    assert_status(
        &io_a.write(1, LBA, &[0xA4; 512]),
        0,
        0,
        "A writes after clear",
    );
    healthy.verify();
}

// ---------------------------------------------------------------- Connect host ID

#[test]
fn io_connect_with_another_host_id_is_accepted_and_the_controllers_stays() {
    let t = TestTarget::start();
    let mut healthy = t.healthy();
    let mut admin = t.host_ic(true);
    let c = admin.connect_admin_hostid(NQN_OPEN, HOST_NQN, HOST_A);
    assert_status(&c, 0, 0, "admin Connect");
    admin.cntlid = c.dw0 as u16;
    admin.enable();
    let mut flipped = HOST_A;
    flipped[15] ^= 1;
    let mut kept = Vec::new();
    // Hosts in the field send a fresh Host ID per Connect: nvmet and SPDK
    // accept the queue, and so do we.
    for (qid, other) in [(1u16, HOST_B), (2, [0u8; 16]), (3, flipped)] {
        let mut io = t.host_ic(true);
        let c = io.connect_io_hostid(admin.cntlid, qid, NQN_OPEN, HOST_NQN, other);
        assert_status(
            &c,
            0,
            0,
            &format!("I/O Connect qid {qid} with host ID {other:02x?}"),
        );
        io.cntlid = admin.cntlid;
        read_ok(&mut io, "I/O Connect with another host ID");
        kept.push(io);
    }
    // A registration through the queue that came with HOST_B is the
    // controller's host's: HOST_A, as its admin queue said.
    let c = register(&mut kept[0], 1, 0, 0, 0xA1);
    assert_status(&c, 0, 0, "Register through that queue");
    let r = parse_report(&report(&mut kept[1]));
    assert_eq!(r.regctl, 1);
    assert_eq!(
        r.entries[0].3, HOST_A,
        "the registrant is the controller's host"
    );
    let c = register(&mut kept[0], 1, 1, 0xA1, 0);
    assert_status(&c, 0, 0, "Unregister");
    // The host NQN must still match the controller's.
    let mut io = t.host_ic(true);
    let c = io.connect_io_hostid(admin.cntlid, 4, NQN_OPEN, HOST_ALLOWED, HOST_A);
    assert_status(
        &c,
        SCT_CMD_SPECIFIC,
        status::SC_CONNECT_INVALID_PARAM,
        "other host NQN",
    );
    assert_eq!(c.dw0, (1 << 16) | 512, "IATTR 1, IPO 512 (HOSTNQN)");
    for q in &mut kept {
        read_ok(q, "the other I/O queues");
    }
    let ka = Sqe::new(admin_opc::KEEP_ALIVE, 77);
    admin.send_capsule(&ka, &[]);
    admin.expect_status(77, 0, 0);
    healthy.verify();
}

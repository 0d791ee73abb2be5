//! Raw-TCP fault tests: a host that sends wrong sizes, bad digests, commands
//! out of order and out-of-range LBAs gets the spec's status code or a
//! C2HTermReq followed by a close; never a hang, a panic, or harm to another
//! connection.
//!
//! Each case runs against its own in-process target on an ephemeral port,
//! with a healthy controller (admin + I/O queue) connected before the abuse
//! and checked with verified writes and reads after it. One more test runs
//! every abuse again while a healthy I/O loop runs without pause.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fault_tests::*;
use nvme_wire::cqe::Cqe;
use nvme_wire::fabrics::{CNTLID_DYNAMIC, prop};
use nvme_wire::pdu::{CommonHeader, Fes, ICReq, PduType, R2THdr};
use nvme_wire::sqe::{
    SGL_DATA_BLOCK_OFFSET, SGL_TRANSPORT_DATA_BLOCK, SglDesc, Sqe, admin_opc, io_opc,
};
use nvme_wire::status::{self, SCT_CMD_SPECIFIC, SCT_GENERIC};

const FES_HEADER: u16 = Fes::InvalidHeaderField as u16;
const FES_SEQUENCE: u16 = Fes::PduSequenceError as u16;
const FES_HDGST: u16 = Fes::HeaderDigestError as u16;
const FES_RANGE: u16 = Fes::DataTransferOutOfRange as u16;
const FES_LIMIT: u16 = Fes::DataTransferLimitExceeded as u16;
/// Generic status 0x22: Transient Transport Error.
const SC_TRANSIENT_TRANSPORT: u8 = 0x22;

/// Runs `abuse` against a fresh target while a healthy controller, connected
/// before it, must still do verified I/O afterwards.
fn case(abuse: Abuse) {
    let t = TestTarget::start();
    let mut healthy = t.healthy();
    healthy.verify();
    abuse(&t);
    healthy.verify();
    t.shutdown();
}

/// A CapsuleCmd header with an explicit common header (no digests).
fn raw_capsule(hlen: u8, pdo: u8, plen: u32) -> Vec<u8> {
    let mut b = vec![0u8; 72];
    CommonHeader {
        pdu_type: PduType::CapsuleCmd as u8,
        flags: 0,
        hlen,
        pdo,
        plen,
    }
    .encode(&mut b);
    b[8..72].copy_from_slice(&Sqe::new(admin_opc::KEEP_ALIVE, 1).encode());
    b
}

/// A bare PDU of `pdu_type`: `len` bytes, all but the common header zero, hlen = plen = `hlen`.
fn raw_pdu(pdu_type: u8, len: usize, hlen: u8) -> Vec<u8> {
    let mut b = vec![0u8; len];
    CommonHeader {
        pdu_type,
        flags: 0,
        hlen,
        pdo: 0,
        plen: u32::from(hlen),
    }
    .encode(&mut b);
    b
}

/// An ICReq with `pfv` and `hpda`, no digests.
fn icreq(pfv: u16, hpda: u8) -> Vec<u8> {
    ICReq {
        pfv,
        hpda,
        dgst: 0,
        maxr2t: 0,
    }
    .encode()
    .to_vec()
}

/// An SGL for `len` bytes of in-capsule data.
fn in_capsule(len: u32) -> SglDesc {
    SglDesc {
        addr: 0,
        length: len,
        type_byte: SGL_DATA_BLOCK_OFFSET,
    }
}

/// An SGL for `len` bytes moved by R2T (writes) or C2HData (reads).
fn transported(len: u32) -> SglDesc {
    SglDesc {
        addr: 0,
        length: len,
        type_byte: SGL_TRANSPORT_DATA_BLOCK,
    }
}

fn expect_generic_dnr(c: &Cqe, sc: u8, what: &str) {
    assert_status(c, SCT_GENERIC, sc, what);
    assert!(c.status.dnr, "{what}: DNR must be set for SC {sc:#x}");
}

/// An admin queue connected with a keep-alive timeout of `kato_ms` and enabled.
fn enabled_admin(t: &TestTarget, kato_ms: u32) -> Host {
    let mut h = t.host_ic(false);
    h.connect_admin_ok(NQN_OPEN, HOST_NQN, kato_ms);
    h.enable();
    h
}

/// Sends a Write with an SGL for `len` bytes moved by R2T; returns its SQE and the R2T.
fn write_awaiting_r2t(io: &mut Host, slba: u64, len: u32) -> (Sqe, R2THdr) {
    let mut sqe = io.rw_sqe(io_opc::WRITE, 1, slba, len / BLOCK);
    sqe.sgl = transported(len);
    io.send_capsule(&sqe, &[]);
    let p = io.expect_pdu("R2T");
    assert_eq!(
        p.kind(),
        Some(PduType::R2T),
        "expected an R2T, got {:?}",
        p.ch
    );
    let r = R2THdr::decode(&p.bytes).expect("R2T decodes");
    assert_eq!((r.cccid, r.r2to, r.r2tl), (sqe.cid, 0, len), "R2T fields");
    (sqe, r)
}

// ---------------------------------------------------------------- PDU headers

/// The connection a raw PDU goes out on.
#[derive(Clone, Copy)]
enum On {
    /// A fresh connection, before ICReq.
    Fresh,
    /// After ICReq/ICResp (no digests).
    Ic,
    /// A connected admin queue, with header and data digests or without.
    Admin(bool),
}

/// What the target must answer a bad PDU with.
#[derive(Clone, Copy)]
enum Answer {
    /// A C2HTermReq with this FES (and FEI).
    Term(u16, Option<u32>),
    /// The same within a second: only the header went out, so a target that waits for the
    /// body hangs.
    TermAtOnce(u16, Option<u32>),
    /// A close without an answer.
    Closed,
    /// An ICResp: the PDU was fine after all.
    IcResp,
}

/// A row: the abuse it belongs to, what it names, the values it runs with (one connection
/// each), where the PDU goes, the PDU (built from the value) and the answer.
type PduRow = (
    &'static str,
    &'static str,
    &'static [u32],
    On,
    fn(&Host, u32) -> Vec<u8>,
    Answer,
);

/// Bad PDU headers, bad ICReqs and PDUs out of sequence, one row per shape of wrong.
const PDU_ROWS: &[PduRow] = &[
    (
        "capsule_wrong_hlen",
        "CapsuleCmd hlen",
        &[71, 0, 24, 128, 255],
        On::Ic,
        |_, hlen| raw_capsule(hlen as u8, 0, 72),
        Answer::Term(FES_HEADER, Some(2)),
    ),
    (
        "capsule_wrong_hlen",
        "H2CData with a CapsuleCmd's hlen",
        &[72],
        On::Ic,
        |_, hlen| {
            let mut b = raw_pdu(PduType::H2CData as u8, 24, 24);
            b[2] = hlen as u8;
            b
        },
        Answer::Term(FES_HEADER, Some(2)),
    ),
    (
        "capsule_plen_below_hlen",
        "CapsuleCmd plen",
        &[71, 60, 24, 8, 0],
        On::Ic,
        |_, plen| raw_capsule(72, 0, plen),
        Answer::Term(FES_HEADER, Some(4)),
    ),
    (
        "capsule_plen_over_limit",
        "CapsuleCmd header alone, plen",
        &[0x7fff_ffff, 0xffff_ffff, 72 + ICD + 256 + 8],
        On::Ic,
        |_, plen| raw_capsule(72, 72, plen),
        Answer::TermAtOnce(FES_HEADER, Some(4)),
    ),
    (
        "capsule_plen_over_limit",
        "the same on an admin queue with digests on, plen",
        &[0x7fff_ffff],
        On::Admin(true),
        |_, plen| {
            let mut b = raw_capsule(72, 76, plen);
            b[1] = nvme_wire::pdu::FLAG_HDGSTF;
            b
        },
        Answer::Term(FES_HEADER, Some(4)),
    ),
    (
        "unknown_pdu_type",
        "PDU type",
        &[0x42, 0x08, 0x0A, 0x0F, 0xFF],
        On::Ic,
        |_, ty| raw_pdu(ty as u8, 24, 24),
        Answer::Term(FES_HEADER, Some(0)),
    ),
    (
        "controller_to_host_types",
        "controller-to-host PDU type",
        &[
            PduType::CapsuleResp as u32,
            PduType::ICResp as u32,
            PduType::C2HTermReq as u32,
            PduType::C2HData as u32,
            PduType::R2T as u32,
        ],
        On::Ic,
        // (an ICResp with its own length)
        |_, ty| match ty == PduType::ICResp as u32 {
            true => raw_pdu(ty as u8, 128, 128),
            false => raw_pdu(ty as u8, 24, 24),
        },
        Answer::Term(FES_HEADER, Some(0)),
    ),
    (
        "pdu_before_icreq",
        "CapsuleCmd before ICReq",
        &[0],
        On::Fresh,
        |h, _| h.capsule_pdu(&Sqe::new(admin_opc::KEEP_ALIVE, 1), &[]),
        Answer::Term(FES_SEQUENCE, None),
    ),
    (
        "pdu_before_icreq",
        "H2CData before ICReq",
        &[0],
        On::Fresh,
        |h, _| h.h2c_pdu(1, 0, 0, &[0u8; 512], true),
        Answer::Term(FES_SEQUENCE, None),
    ),
    (
        "second_icreq",
        "a second ICReq",
        &[0],
        On::Ic,
        |_, _| icreq(0, 0),
        Answer::Term(FES_SEQUENCE, None),
    ),
    (
        "second_icreq",
        "a second ICReq on a connected queue",
        &[0],
        On::Admin(false),
        |_, _| icreq(0, 0),
        Answer::Term(FES_SEQUENCE, None),
    ),
    (
        "icreq_fields",
        "ICReq PFV",
        &[1],
        On::Fresh,
        |_, pfv| icreq(pfv as u16, 0),
        Answer::Term(FES_HEADER, Some(8)),
    ),
    (
        "icreq_fields",
        "ICReq HPDA",
        &[32],
        On::Fresh,
        |_, hpda| icreq(0, hpda as u8),
        Answer::Term(FES_HEADER, Some(10)),
    ),
    (
        "icreq_fields",
        "ICReq plen",
        &[129, 127, 0x7fff_ffff],
        On::Fresh,
        |_, plen| {
            let mut b = icreq(0, 0);
            b[4..8].copy_from_slice(&plen.to_le_bytes());
            b
        },
        Answer::Term(FES_HEADER, Some(4)),
    ),
    (
        "icreq_fields",
        "ICReq hlen",
        &[72],
        On::Fresh,
        |_, hlen| {
            let mut b = icreq(0, 0);
            b[2] = hlen as u8;
            b
        },
        Answer::Term(FES_HEADER, Some(2)),
    ),
    // HPDA 31 is the largest legal value: C2HData then starts at byte 128.
    (
        "icreq_fields",
        "ICReq HPDA (the largest legal)",
        &[31],
        On::Fresh,
        |_, hpda| icreq(0, hpda as u8),
        Answer::IcResp,
    ),
    // Data must start after the header (and its digest) and inside the PDU.
    (
        "capsule_bad_pdo",
        "CapsuleCmd pdo << 16 | plen",
        &[
            10 << 16 | (72 + 512),
            72 + 512,
            71 << 16 | (72 + 512),
            200 << 16 | (72 + 100),
        ],
        On::Ic,
        |_, v| {
            let plen = v & 0xFFFF;
            let mut b = raw_capsule(72, (v >> 16) as u8, plen);
            b.resize(plen as usize, 0);
            b
        },
        Answer::Term(FES_HEADER, Some(3)),
    ),
    // With a header digest the data may not start inside the digest.
    (
        "capsule_bad_pdo",
        "CapsuleCmd with digests, pdo",
        &[72],
        On::Admin(true),
        |h, pdo| {
            let mut sqe = Sqe::new(io_opc::WRITE, 3);
            sqe.sgl = in_capsule(512);
            let mut b = h.capsule_pdu(&sqe, &[0u8; 512]);
            b[3] = pdo as u8;
            let d = nvme_wire::digest::crc32c(&b[..72]);
            b[72..76].copy_from_slice(&d.to_le_bytes());
            b
        },
        Answer::Term(FES_HEADER, Some(3)),
    ),
    // The host ends the connection: the target closes without answering.
    (
        "host_term_req",
        "H2CTermReq",
        &[1],
        On::Admin(false),
        |_, fes| {
            let mut b = raw_pdu(PduType::H2CTermReq as u8, 24, 24);
            b[8] = fes as u8;
            b
        },
        Answer::Closed,
    ),
    // A TermReq with a plen over 152 is itself a bad header.
    (
        "host_term_req",
        "H2CTermReq plen",
        &[200],
        On::Ic,
        |_, plen| {
            let mut b = raw_pdu(PduType::H2CTermReq as u8, 24, 24);
            b[4..8].copy_from_slice(&plen.to_le_bytes());
            b
        },
        Answer::Term(FES_HEADER, Some(4)),
    ),
];

/// Runs the rows of `abuse` in [`PDU_ROWS`], each value on a connection of its own; a
/// failing row is named with its value.
fn pdu_rows(t: &TestTarget, abuse: &str) {
    let mut ran = 0;
    for &(_, what, values, on, pdu, answer) in PDU_ROWS.iter().filter(|r| r.0 == abuse) {
        for &v in values {
            named_row(abuse, &format!("{what} {v:#x}"), || {
                pdu_row(t, on, pdu, answer, v)
            });
            ran += 1;
        }
    }
    assert!(ran > 0, "no PDU_ROWS for {abuse}");
}

/// Runs one row; a panic in it panics again with the abuse and the row named.
fn named_row(abuse: &str, what: &str, row: impl FnOnce()) {
    if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(row)) {
        let msg = e
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| e.downcast_ref::<&str>().copied())
            .unwrap_or("panic");
        panic!("{abuse}: {what}: {msg}");
    }
}

fn pdu_row(t: &TestTarget, on: On, pdu: fn(&Host, u32) -> Vec<u8>, answer: Answer, v: u32) {
    let mut h = match on {
        On::Fresh => t.host(),
        On::Ic => t.host_ic(false),
        On::Admin(digests) => t.admin(digests),
    };
    let b = pdu(&h, v);
    let start = Instant::now();
    h.send(&b);
    match answer {
        Answer::Term(fes, fei) => {
            h.expect_term(fes, fei);
        }
        Answer::TermAtOnce(fes, fei) => {
            h.expect_term(fes, fei);
            assert!(
                start.elapsed() < Duration::from_secs(1),
                "TermReq took {:?}",
                start.elapsed()
            );
        }
        Answer::Closed => h.expect_closed(),
        Answer::IcResp => {
            let p = h.expect_pdu("ICResp");
            assert_eq!(p.kind(), Some(PduType::ICResp));
        }
    }
}

// ---------------------------------------------------------------- digests

fn abuse_header_digest_mismatch(t: &TestTarget) {
    // CapsuleCmd on the admin queue.
    let mut h = t.admin(true);
    let sqe = Sqe::new(admin_opc::KEEP_ALIVE, 77);
    let mut b = h.capsule_pdu(&sqe, &[]);
    b[72] ^= 0x01;
    h.send(&b);
    h.expect_term(FES_HDGST, None);

    // H2CData on an I/O queue.
    let (_admin, mut io) = t.admin_and_io(true);
    let (sqe, r) = write_awaiting_r2t(&mut io, 0, 4096);
    let mut b = io.h2c_pdu(sqe.cid, r.ttag, 0, &[7u8; 4096], true);
    b[24] ^= 0x80;
    io.send(&b);
    io.expect_term(FES_HDGST, None);

    // The header digest flag missing although digests were negotiated.
    let mut h = t.admin(true);
    let mut b = h.capsule_pdu(&Sqe::new(admin_opc::KEEP_ALIVE, 78), &[]);
    b[1] = 0;
    h.send(&b[..72]);
    h.expect_term(FES_HEADER, Some(1));
}

fn abuse_in_capsule_data_digest(t: &TestTarget) {
    let (_admin, mut io) = t.admin_and_io(true);
    let lba = 64;
    let before = pattern(1, 4096);
    assert!(io.write(1, lba, &before).status.is_success());

    let data = pattern(2, 4096);
    let mut sqe = io.rw_sqe(io_opc::WRITE, 1, lba, 8);
    sqe.sgl = in_capsule(4096);
    let mut b = io.capsule_pdu(&sqe, &data);
    let n = b.len();
    b[n - 1] ^= 0x55;
    io.send(&b);
    expect_retryable_digest_error(&mut io, sqe.cid, lba, &before, &data);
}

/// After a write `cid` of `data` at `lba` whose data digest was wrong: Transient Transport
/// Error without DNR, `before` still there, and the queue still writes and reads.
fn expect_retryable_digest_error(io: &mut Host, cid: u16, lba: u64, before: &[u8], data: &[u8]) {
    let nlb = data.len() as u32 / BLOCK;
    let c = io.expect_status(cid, SCT_GENERIC, SC_TRANSIENT_TRANSPORT);
    assert!(
        !c.status.dnr,
        "a digest error is retryable: DNR must be clear"
    );

    // The queue stays usable and the bad data was not written.
    let (c, got) = io.read(1, lba, nlb);
    assert!(c.status.is_success());
    assert!(
        got == before,
        "a write with a bad data digest changed the data"
    );
    assert!(io.write(1, lba, data).status.is_success());
    let (_, got) = io.read(1, lba, nlb);
    assert!(got == data);
}

fn abuse_h2c_data_digest(t: &TestTarget) {
    let (_admin, mut io) = t.admin_and_io(true);
    let lba = 128;
    let before = pattern(3, 32 * 1024);
    assert!(io.write(1, lba, &before).status.is_success());

    let data = pattern(4, 32 * 1024);
    let (sqe, r) = write_awaiting_r2t(&mut io, lba, 32 * 1024);
    let half = 16 * 1024;
    let mut b = io.h2c_pdu(sqe.cid, r.ttag, 0, &data[..half], false);
    let n = b.len();
    b[n - 2] ^= 0x01;
    io.send(&b);
    // Nothing comes back until the transfer is complete.
    assert!(
        io.quiet_for(Duration::from_millis(100)),
        "answer before the transfer completed"
    );
    io.send(&io.h2c_pdu(sqe.cid, r.ttag, half as u32, &data[half..], true));
    expect_retryable_digest_error(&mut io, sqe.cid, lba, &before, &data);
}

// ---------------------------------------------------------------- H2CData

/// One H2CData PDU of a row: how far its CCCID and TTAG are off the command's and its R2T's,
/// DATAO, its data length and LAST_PDU.
type H2cPdu = (u16, u16, u32, usize, bool);

/// A row: the abuse it belongs to, what it names, the length of the write whose R2T the
/// PDUs answer (0: no write, the PDUs name CID 1 and TTAG 0), the PDUs, the TermReq's FES
/// and FEI. Each row on a new controller.
type H2cRow = (&'static str, &'static str, u32, &'static [H2cPdu], u16, u32);

const H2C_ROWS: &[H2cRow] = &[
    (
        "h2c_unknown_ttag",
        "TTAG + 1",
        4096,
        &[(0, 1, 0, 4096, true)],
        FES_HEADER,
        10,
    ),
    (
        "h2c_unknown_ttag",
        "TTAG + 7",
        4096,
        &[(0, 7, 0, 4096, true)],
        FES_HEADER,
        10,
    ),
    (
        "h2c_unknown_ttag",
        "TTAG + 0x7fff",
        4096,
        &[(0, 0x7fff, 0, 4096, true)],
        FES_HEADER,
        10,
    ),
    (
        "h2c_unknown_ttag",
        "no R2T outstanding at all",
        0,
        &[(0, 0, 0, 512, true)],
        FES_HEADER,
        10,
    ),
    (
        "h2c_wrong_cccid",
        "CCCID + 100",
        4096,
        &[(100, 0, 0, 4096, true)],
        FES_HEADER,
        8,
    ),
    (
        "h2c_datao_gap",
        "DATAO 512 first",
        8192,
        &[(0, 0, 512, 4096, false)],
        FES_RANGE,
        12,
    ),
    (
        "h2c_datao_gap",
        "a repeated DATAO after the first PDU",
        8192,
        &[(0, 0, 0, 4096, false), (0, 0, 0, 4096, true)],
        FES_RANGE,
        12,
    ),
    (
        "h2c_past_r2t_range",
        "8 KiB + 512 for 8 KiB",
        8192,
        &[(0, 0, 0, 8192 + 512, true)],
        FES_RANGE,
        16,
    ),
    (
        "h2c_past_r2t_range",
        "the second PDU past the end",
        8192,
        &[(0, 0, 0, 4096, false), (0, 0, 4096, 8192, true)],
        FES_RANGE,
        16,
    ),
];

/// Runs the rows of `abuse` in [`H2C_ROWS`].
fn h2c_rows(t: &TestTarget, abuse: &str) {
    let mut ran = 0;
    for &(_, what, len, pdus, fes, fei) in H2C_ROWS.iter().filter(|r| r.0 == abuse) {
        named_row(abuse, what, || {
            let (_admin, mut io) = t.admin_and_io(false);
            let (cid, ttag) = match len {
                0 => (1, 0),
                _ => {
                    let (sqe, r) = write_awaiting_r2t(&mut io, 0, len);
                    (sqe.cid, r.ttag)
                }
            };
            for &(dc, dt, datao, n, last) in pdus {
                let b = io.h2c_pdu(
                    cid.wrapping_add(dc),
                    ttag.wrapping_add(dt),
                    datao,
                    &vec![1u8; n],
                    last,
                );
                io.send(&b);
            }
            io.expect_term(fes, Some(fei));
        });
        ran += 1;
    }
    assert!(ran > 0, "no H2C_ROWS for {abuse}");
}

fn abuse_h2c_datal_mismatch(t: &TestTarget) {
    // DATAL disagrees with the data the PDU carries.
    let (_admin, mut io) = t.admin_and_io(false);
    let (sqe, r) = write_awaiting_r2t(&mut io, 0, 8192);
    let mut b = io.h2c_pdu(sqe.cid, r.ttag, 0, &[1u8; 4096], false);
    b[16..20].copy_from_slice(&2048u32.to_le_bytes());
    io.send(&b);
    io.expect_term(FES_HEADER, Some(16));
}

/// An H2CData PDU over MAXH2CDATA: the target must answer with a TermReq at
/// once (from the header alone), not wait for or buffer the data.
fn abuse_h2c_over_maxh2cdata_terminates(t: &TestTarget) {
    let (_admin, mut io) = t.admin_and_io(false);
    assert_eq!(io.maxh2cdata, MAX_H2C);
    let (sqe, r) = write_awaiting_r2t(&mut io, 0, 32 * 1024);
    let b = io.h2c_pdu(
        sqe.cid,
        r.ttag,
        0,
        &vec![1u8; MAX_H2C as usize + 4096],
        true,
    );
    // The header only: the answer must not depend on the body.
    io.send(&b[..24]);
    let p = io.expect_pdu("C2HTermReq");
    assert_eq!(p.kind(), Some(PduType::C2HTermReq), "got {:?}", p.ch);
    let tr = nvme_wire::pdu::TermReq::decode(&p.bytes).unwrap();
    assert_eq!(
        tr.fes, FES_LIMIT,
        "FES for DATAL over MAXH2CDATA (FEI {})",
        tr.fei
    );
    io.expect_closed();
}

/// An H2CData PDU whose DATAL is over MAXH2CDATA is FES 05h, "Data Transfer
/// Limit Exceeded" (Linux: NVME_TCP_FES_DATA_LIMIT_EXCEEDED), FEI = DATAL's
/// offset. (It used to be FES 1 FEI 4 from the PLEN check in
/// pdu_check::check_header, which made conn.rs's FES 5 check dead code.)
#[test]
fn h2c_over_maxh2cdata_is_fes5_data_transfer_limit_exceeded() {
    let t = TestTarget::start();
    let (_admin, mut io) = t.admin_and_io(false);
    let (sqe, r) = write_awaiting_r2t(&mut io, 0, 32 * 1024);
    let b = io.h2c_pdu(
        sqe.cid,
        r.ttag,
        0,
        &vec![1u8; MAX_H2C as usize + 4096],
        true,
    );
    io.send(&b[..24]);
    io.expect_term(FES_LIMIT, Some(16));
    t.shutdown();
}

// ---------------------------------------------------------------- SGLs

fn abuse_sgl(t: &TestTarget) {
    let (_admin, mut io) = t.admin_and_io(false);
    let data = [9u8; 512];

    // In-capsule data block with a non-zero offset.
    for addr in [16u64, 1, 0xffff_ffff_ffff_ffff] {
        let mut sqe = io.rw_sqe(io_opc::WRITE, 1, 0, 1);
        sqe.sgl = SglDesc {
            addr,
            length: 512,
            type_byte: SGL_DATA_BLOCK_OFFSET,
        };
        io.send_capsule(&sqe, &data);
        let c = io.expect_status(sqe.cid, SCT_GENERIC, status::SC_SGL_INVALID_OFFSET);
        assert!(c.status.dnr);
    }

    // SGL length differs from the in-capsule data length.
    for (sgl_len, sent) in [(1024u32, 512usize), (512, 1024), (0, 512)] {
        let mut sqe = io.rw_sqe(io_opc::WRITE, 1, 0, 1);
        sqe.sgl = in_capsule(sgl_len);
        io.send_capsule(&sqe, &vec![3u8; sent]);
        let c = io.expect_status(sqe.cid, SCT_GENERIC, status::SC_SGL_INVALID_DATA_LEN);
        assert!(c.status.dnr);
    }

    // Unknown / unsupported descriptor types (segment, last segment, keyed, data block with address).
    for ty in [0x20u8, 0x30, 0x40, 0x00, 0xF0, 0x5B] {
        let mut sqe = io.rw_sqe(io_opc::WRITE, 1, 0, 1);
        sqe.sgl = SglDesc {
            addr: 0,
            length: 512,
            type_byte: ty,
        };
        io.send_capsule(&sqe, &[]);
        let c = io.expect_status(sqe.cid, SCT_GENERIC, status::SC_SGL_INVALID_TYPE);
        assert!(c.status.dnr, "type {ty:#x}");
    }

    // PRPs (PSDT 0) mean nothing on a fabric.
    for opc in [io_opc::WRITE, io_opc::READ] {
        let mut sqe = io.rw_sqe(opc, 1, 0, 1);
        sqe.flags = 0;
        sqe.sgl = transported(512);
        io.send_capsule(&sqe, &[]);
        expect_generic_dnr(&io.expect_resp(), status::SC_INVALID_FIELD, "PRP");
    }

    // In-capsule data on a Read.
    let mut sqe = io.rw_sqe(io_opc::READ, 1, 0, 1);
    sqe.sgl = in_capsule(512);
    io.send_capsule(&sqe, &data);
    let c = io.expect_status(sqe.cid, SCT_GENERIC, status::SC_INVALID_FIELD);
    assert!(c.status.dnr);

    // Transport SGL length differs from the command's length.
    let mut sqe = io.rw_sqe(io_opc::READ, 1, 0, 2);
    sqe.sgl = transported(512);
    io.send_capsule(&sqe, &[]);
    io.expect_status(sqe.cid, SCT_GENERIC, status::SC_SGL_INVALID_DATA_LEN);

    // The queue is still fine.
    assert!(io.write(1, 0, &data).status.is_success());
    let (c, got) = io.read(1, 0, 1);
    assert!(c.status.is_success() && got == data);
}

// ---------------------------------------------------------------- namespaces and LBAs

/// How a command's data moves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Data {
    /// No data (Write Zeroes).
    None,
    /// In the capsule.
    InCapsule,
    /// By R2T and H2CData (writes) or C2HData (reads).
    Transported,
}

/// The ways a read or write reaches the target: what it is, its opcode, how its data moves.
const RW_SHAPES: [(&str, u8, Data); 4] = [
    ("read", io_opc::READ, Data::Transported),
    ("in-capsule write", io_opc::WRITE, Data::InCapsule),
    // refused before any R2T goes out
    ("R2T write", io_opc::WRITE, Data::Transported),
    ("write zeroes", io_opc::WRITE_ZEROES, Data::None),
];

/// Sends a read or write of `nlb` blocks whose data moves as `data` (in-capsule data: a
/// fill); returns its SQE.
fn send_rw(io: &mut Host, opc: u8, nsid: u32, slba: u64, nlb: u32, data: Data) -> Sqe {
    let mut sqe = io.rw_sqe(opc, nsid, slba, nlb);
    let len = nlb * BLOCK;
    match data {
        Data::None => io.send_capsule(&sqe, &[]),
        Data::InCapsule => {
            sqe.sgl = in_capsule(len);
            io.send_capsule(&sqe, &vec![5u8; len as usize]);
        }
        Data::Transported => {
            sqe.sgl = transported(len);
            io.send_capsule(&sqe, &[]);
        }
    }
    sqe
}

fn abuse_lba_out_of_range(t: &TestTarget) {
    let (_admin, mut io) = t.admin_and_io(false);
    let cases: [(u64, u32); 6] = [
        (NS_BLOCKS, 1),
        (NS_BLOCKS - 1, 2),
        (NS_BLOCKS - 7, 8 + 1),
        (u64::MAX, 1),
        (u64::MAX - 3, 8),
        (1 << 40, 1),
    ];
    for (slba, nlb) in cases {
        for (what, opc, data) in RW_SHAPES {
            let sqe = send_rw(&mut io, opc, 1, slba, nlb, data);
            let c = io.expect_resp();
            if data != Data::None {
                assert_eq!(c.cid, sqe.cid);
            }
            expect_generic_dnr(
                &c,
                status::SC_LBA_RANGE,
                &format!("{what} slba {slba:#x} nlb {nlb}"),
            );
        }
    }
    // The last block is fine.
    let data = pattern(9, 512);
    assert!(io.write(1, NS_BLOCKS - 1, &data).status.is_success());
    let (c, got) = io.read(1, NS_BLOCKS - 1, 1);
    assert!(c.status.is_success() && got == data);
}

fn abuse_invalid_nsid(t: &TestTarget) {
    let (_admin, mut io) = t.admin_and_io(false);
    for nsid in [0u32, 2, 1024, 0xFFFF_FFFF] {
        for (opc, nlb, data, dnr) in [
            (io_opc::READ, 1, Data::Transported, true),
            (io_opc::WRITE, 1, Data::InCapsule, true),
            (io_opc::WRITE, 16, Data::Transported, false),
        ] {
            let sqe = send_rw(&mut io, opc, nsid, 0, nlb, data);
            let c = io.expect_status(sqe.cid, SCT_GENERIC, status::SC_INVALID_NS);
            assert!(c.status.dnr || !dnr, "nsid {nsid:#x} opcode {opc:#x}: DNR");
        }
    }
}

fn abuse_over_mdts(t: &TestTarget) {
    let (_admin, mut io) = t.admin_and_io(false);
    let nlb = MAX_TRANSFER / BLOCK + 1;
    send_rw(&mut io, io_opc::READ, 1, 0, nlb, Data::Transported);
    expect_generic_dnr(
        &io.expect_resp(),
        status::SC_INVALID_FIELD,
        "read over MDTS",
    );

    send_rw(&mut io, io_opc::WRITE, 1, 0, nlb, Data::Transported);
    // No R2T: the refusal comes first.
    expect_generic_dnr(
        &io.expect_resp(),
        status::SC_INVALID_FIELD,
        "write over MDTS",
    );

    // Exactly MDTS is fine.
    let data = pattern(11, MAX_TRANSFER as usize);
    assert!(io.write(1, 0, &data).status.is_success());
    let (c, got) = io.read(1, 0, MAX_TRANSFER / BLOCK);
    assert!(c.status.is_success() && got == data);
}

// ---------------------------------------------------------------- opcodes per queue

fn abuse_io_opcode_on_admin(t: &TestTarget) {
    let mut admin = t.admin(false);
    // Write with in-capsule data (0x01 is Create I/O SQ on the admin queue).
    let mut sqe = admin.rw_sqe(io_opc::WRITE, 1, 0, 1);
    sqe.sgl = in_capsule(512);
    admin.send_capsule(&sqe, &[1u8; 512]);
    admin.expect_status(sqe.cid, SCT_GENERIC, status::SC_INVALID_OPCODE);
    // Flush (0x00 is Delete I/O SQ).
    let sqe = admin.rw_sqe(io_opc::FLUSH, 1, 0, 1);
    admin.send_capsule(&sqe, &[]);
    admin.expect_status(sqe.cid, SCT_GENERIC, status::SC_INVALID_OPCODE);
    // Compare (0x05, Create I/O CQ on the admin queue) and a vendor opcode.
    for opc in [0x05u8, 0xC1] {
        let sqe = admin.rw_sqe(opc, 1, 0, 1);
        admin.send_capsule(&sqe, &[]);
        admin.expect_status(sqe.cid, SCT_GENERIC, status::SC_INVALID_OPCODE);
    }
    // Still a working admin queue.
    let ka = Sqe::new(admin_opc::KEEP_ALIVE, 999);
    admin.send_capsule(&ka, &[]);
    admin.expect_status(999, 0, 0);
}

fn abuse_admin_opcode_on_io(t: &TestTarget) {
    let (_admin, mut io) = t.admin_and_io(false);
    let mut ident = Sqe::new(admin_opc::IDENTIFY, 500);
    ident.cdw10 = 1;
    ident.sgl = transported(4096);
    io.send_capsule(&ident, &[]);
    io.expect_status(500, SCT_GENERIC, status::SC_INVALID_OPCODE);
    for (cid, opc) in [
        (501u16, admin_opc::KEEP_ALIVE),
        (502, admin_opc::ASYNC_EVENT_REQUEST),
        (503, admin_opc::GET_FEATURES),
    ] {
        let mut s = Sqe::new(opc, cid);
        s.nsid = 1;
        io.send_capsule(&s, &[]);
        io.expect_status(cid, SCT_GENERIC, status::SC_INVALID_OPCODE);
    }
    // Property Get/Set are admin-queue commands too.
    let c = io.property_get(prop::CAP, true);
    assert_status(
        &c,
        SCT_GENERIC,
        status::SC_INVALID_OPCODE,
        "Property Get on an I/O queue",
    );
    let c = io.property_set(prop::CC, false, 0);
    assert_status(
        &c,
        SCT_GENERIC,
        status::SC_INVALID_OPCODE,
        "Property Set on an I/O queue",
    );
    assert!(io.write(1, 0, &[1u8; 512]).status.is_success());
}

// ---------------------------------------------------------------- Connect and properties

/// A Connect refused with Connect Invalid Parameters (`what` names it when it was not).
fn expect_connect_invalid(c: &Cqe, what: &str) {
    assert_status(c, SCT_CMD_SPECIFIC, status::SC_CONNECT_INVALID_PARAM, what);
}

const UNKNOWN_NQN: &str = "nqn.2026-01.io.flashpool:no-such-subsystem";

fn abuse_connect_unknown_subsystem(t: &TestTarget) {
    let mut h = t.host_ic(false);
    let c = h.connect_admin(UNKNOWN_NQN, HOST_NQN, 0);
    expect_connect_invalid(&c, "unknown subnqn");
    assert!(c.status.dnr);
    // The queue is still unconnected: a good Connect works.
    h.connect_admin_ok(NQN_OPEN, HOST_NQN, 0);
}

fn abuse_io_connect_unknown_cntlid(t: &TestTarget) {
    let _admin = t.admin(false);
    for cntlid in [0x1234u16, 0, CNTLID_DYNAMIC] {
        let mut h = t.host_ic(false);
        let c = h.connect_io(cntlid, 1, NQN_OPEN, HOST_NQN);
        expect_connect_invalid(&c, "unknown cntlid");
        assert!(c.status.dnr);
    }
}

fn abuse_connect_host_not_allowed(t: &TestTarget) {
    let mut h = t.host_ic(false);
    let c = h.connect_admin(NQN_CLOSED, HOST_NQN, 0);
    assert_status(
        &c,
        SCT_CMD_SPECIFIC,
        status::SC_CONNECT_INVALID_HOST,
        "host not allowed",
    );
    assert!(c.status.dnr);
    // The listed host gets in.
    let mut h = t.host_ic(false);
    h.connect_admin_ok(NQN_CLOSED, HOST_ALLOWED, 0);
    // An I/O queue Connect with another host NQN than the controller's is refused.
    h.enable();
    let mut io = t.host_ic(false);
    let c = io.connect_io(h.cntlid, 1, NQN_CLOSED, HOST_NQN);
    assert!(
        !c.status.is_success(),
        "I/O Connect with a foreign host NQN succeeded"
    );
}

fn abuse_command_before_connect(t: &TestTarget) {
    let mut h = t.host_ic(false);
    let mut ident = Sqe::new(admin_opc::IDENTIFY, 10);
    ident.cdw10 = 1;
    ident.sgl = transported(4096);
    h.send_capsule(&ident, &[]);
    h.expect_status(10, SCT_GENERIC, status::SC_CMD_SEQ_ERROR);
    let mut rd = Sqe::new(io_opc::READ, 11);
    rd.nsid = 1;
    rd.sgl = transported(512);
    h.send_capsule(&rd, &[]);
    h.expect_status(11, SCT_GENERIC, status::SC_CMD_SEQ_ERROR);
    let mut wr = Sqe::new(io_opc::WRITE, 12);
    wr.nsid = 1;
    wr.sgl = in_capsule(512);
    h.send_capsule(&wr, &[0u8; 512]);
    h.expect_status(12, SCT_GENERIC, status::SC_CMD_SEQ_ERROR);
    let c = h.property_get(prop::CAP, true);
    assert_status(
        &c,
        SCT_GENERIC,
        status::SC_CMD_SEQ_ERROR,
        "Property Get before Connect",
    );
    let c = h.property_set(prop::CC, false, CC_ENABLE);
    assert_status(
        &c,
        SCT_GENERIC,
        status::SC_CMD_SEQ_ERROR,
        "Property Set before Connect",
    );
    // Then a normal bring-up on the same connection.
    h.connect_admin_ok(NQN_OPEN, HOST_NQN, 0);
    h.enable();
}

fn abuse_io_connect_qid_beyond_granted(t: &TestTarget) {
    let mut admin = t.admin(false);
    // Without Set Features: the limit is the target's max (4).
    for qid in [5u16, 100, 0xFFFF] {
        let mut h = t.host_ic(false);
        let c = h.connect_io(admin.cntlid, qid, NQN_OPEN, HOST_NQN);
        expect_connect_invalid(&c, &format!("qid {qid}"));
        assert!(c.status.dnr);
    }
    // Grant 2 queues: qid 3 is refused, 2 is fine, a second qid 2 is refused.
    let c = admin.set_num_queues(2);
    assert_status(&c, 0, 0, "Set Features Number of Queues");
    assert_eq!(c.dw0, 1 | (1 << 16));
    let mut h = t.host_ic(false);
    let c = h.connect_io(admin.cntlid, 3, NQN_OPEN, HOST_NQN);
    expect_connect_invalid(&c, "qid 3 of 2");
    let mut q2 = t.host_ic(false);
    assert_status(
        &q2.connect_io(admin.cntlid, 2, NQN_OPEN, HOST_NQN),
        0,
        0,
        "qid 2 of 2",
    );
    let mut dup = t.host_ic(false);
    let c = dup.connect_io(admin.cntlid, 2, NQN_OPEN, HOST_NQN);
    expect_connect_invalid(&c, "qid 2 twice");
    drop(q2);
}

fn abuse_admin_before_enable(t: &TestTarget) {
    let mut h = t.host_ic(false);
    h.connect_admin_ok(NQN_OPEN, HOST_NQN, 0);
    let mut ident = Sqe::new(admin_opc::IDENTIFY, 20);
    ident.cdw10 = 1;
    ident.sgl = transported(4096);
    h.send_capsule(&ident, &[]);
    h.expect_status(20, SCT_GENERIC, status::SC_CMD_SEQ_ERROR);
    for (cid, opc, cdw10) in [
        (21u16, admin_opc::GET_FEATURES, 0x07u32),
        (22, admin_opc::SET_FEATURES, 0x07),
        (23, admin_opc::KEEP_ALIVE, 0),
    ] {
        let mut s = Sqe::new(opc, cid);
        s.cdw10 = cdw10;
        h.send_capsule(&s, &[]);
        h.expect_status(cid, SCT_GENERIC, status::SC_CMD_SEQ_ERROR);
    }
    // An I/O queue cannot attach to a controller that is not ready.
    let mut io = t.host_ic(false);
    let c = io.connect_io(h.cntlid, 1, NQN_OPEN, HOST_NQN);
    assert_status(
        &c,
        SCT_GENERIC,
        status::SC_CMD_SEQ_ERROR,
        "I/O Connect before CC.EN",
    );
    // Properties work before enabling, and enabling unlocks the rest.
    let c = h.property_get(prop::CAP, true);
    assert_status(&c, 0, 0, "Property Get CAP");
    h.enable();
    h.send_capsule(&ident, &[]);
    let p = h.expect_pdu("Identify data");
    assert_eq!(p.kind(), Some(PduType::C2HData));
    h.expect_status(20, 0, 0);
}

fn abuse_property_sizes(t: &TestTarget) {
    let mut h = t.admin(false);
    let c = h.property_get(prop::CAP, false);
    expect_generic_dnr(
        &c,
        status::SC_INVALID_FIELD,
        "Property Get CAP with 4 bytes",
    );
    let c = h.property_get(prop::CAP, true);
    assert_status(&c, 0, 0, "Property Get CAP with 8 bytes");
    assert_eq!(c.dw0 & 0xFFFF, 31, "CAP.MQES");
    let c = h.property_set(prop::CSTS, false, 1);
    expect_generic_dnr(&c, status::SC_INVALID_FIELD, "Property Set CSTS");
    let c = h.property_set(prop::CAP, true, 0);
    expect_generic_dnr(&c, status::SC_INVALID_FIELD, "Property Set CAP");
    let c = h.property_set(prop::CC, true, CC_ENABLE);
    expect_generic_dnr(&c, status::SC_INVALID_FIELD, "Property Set CC with 8 bytes");
    let c = h.property_get(0x1000, false);
    expect_generic_dnr(
        &c,
        status::SC_INVALID_FIELD,
        "Property Get of an unknown offset",
    );
    // CSTS did not change.
    let c = h.property_get(prop::CSTS, false);
    assert_eq!(c.dw0, prop::CSTS_RDY);
}

/// Asserts "Connect Invalid Parameters" pointing at `ipo` (in the data when `in_data`).
fn expect_invalid_param(c: &Cqe, in_data: bool, ipo: u32, what: &str) {
    assert_status(c, SCT_CMD_SPECIFIC, status::SC_CONNECT_INVALID_PARAM, what);
    assert!(c.status.dnr, "{what}: DNR");
    assert_eq!(
        (c.dw0 & 0xFFFF, (c.dw0 >> 16) & 0xFF),
        (ipo, u32::from(in_data)),
        "{what}: IPO/IATTR in dw0 {:#010x}",
        c.dw0
    );
}

fn abuse_connect_bad_fields(t: &TestTarget) {
    let data = |cntlid, sub: &str, host: &str| Host::connect_data(cntlid, sub, host);
    // recfmt != 0: Incompatible Format.
    let mut h = t.host_ic(false);
    let mut sqe = h.connect_sqe(0, 31, 0);
    sqe.cdw10 |= 1;
    h.send_capsule(&sqe, &data(CNTLID_DYNAMIC, NQN_OPEN, HOST_NQN));
    let c = h.expect_status(sqe.cid, SCT_CMD_SPECIFIC, status::SC_CONNECT_FORMAT);
    assert!(c.status.dnr);
    // sqsize over CAP.MQES, and 0.
    for sqsize in [32u16, 0, 0xFFFF] {
        let sqe = h.connect_sqe(0, sqsize, 0);
        h.send_capsule(&sqe, &data(CNTLID_DYNAMIC, NQN_OPEN, HOST_NQN));
        expect_invalid_param(&h.expect_resp(), false, 44, &format!("sqsize {sqsize}"));
    }
    // A static controller ID on the admin queue (this target is dynamic only).
    let sqe = h.connect_sqe(0, 31, 0);
    h.send_capsule(&sqe, &data(5, NQN_OPEN, HOST_NQN));
    expect_invalid_param(&h.expect_resp(), true, 16, "admin cntlid 5");
    // Bad NQN fields: empty, and 256 bytes without a NUL.
    let sqe = h.connect_sqe(0, 31, 0);
    h.send_capsule(&sqe, &data(CNTLID_DYNAMIC, "", HOST_NQN));
    expect_invalid_param(&h.expect_resp(), true, 256, "empty subnqn");
    let sqe = h.connect_sqe(0, 31, 0);
    let mut d = data(CNTLID_DYNAMIC, NQN_OPEN, HOST_NQN);
    d[512..768].fill(b'h');
    h.send_capsule(&sqe, &d);
    expect_invalid_param(&h.expect_resp(), true, 512, "hostnqn without NUL");
    // Connect data of the wrong length.
    let mut sqe = h.connect_sqe(0, 31, 0);
    sqe.sgl.length = 512;
    h.send_capsule(&sqe, &d[..512]);
    let c = h.expect_status(sqe.cid, SCT_GENERIC, status::SC_SGL_INVALID_DATA_LEN);
    assert!(c.status.dnr);
    // After all that the queue is still unconnected and can connect.
    h.connect_admin_ok(NQN_OPEN, HOST_NQN, 0);
    h.enable();
    // I/O queue Connects that do not match the controller.
    let mut io = t.host_ic(false);
    let c = io.connect_io(h.cntlid, 1, NQN_CLOSED, HOST_NQN);
    expect_invalid_param(&c, true, 256, "I/O Connect, other subnqn");
    let c = io.connect_io(h.cntlid, 1, NQN_OPEN, HOST_ALLOWED);
    expect_invalid_param(&c, true, 512, "I/O Connect, other hostnqn");
    let c = io.connect_io(h.cntlid, 0xFFFF, NQN_OPEN, HOST_NQN);
    expect_invalid_param(&c, false, 42, "I/O Connect, qid 0xFFFF");
    assert_status(
        &io.connect_io(h.cntlid, 1, NQN_OPEN, HOST_NQN),
        0,
        0,
        "I/O Connect",
    );
}

/// HPDA 31: C2HData must put its data at a 128-byte boundary.
fn abuse_hpda_alignment(t: &TestTarget) {
    for digests in [false, true] {
        let admin = t.admin(digests);
        let mut io = t.host();
        io.send(
            &ICReq {
                pfv: 0,
                hpda: 31,
                dgst: if digests { 3 } else { 0 },
                maxr2t: 0,
            }
            .encode(),
        );
        let p = io.expect_pdu("ICResp");
        let resp = nvme_wire::pdu::ICResp::decode(&p.bytes).unwrap();
        io.hdgst = resp.dgst & 1 != 0;
        io.ddgst = resp.dgst & 2 != 0;
        io.maxh2cdata = resp.maxh2cdata;
        assert_status(
            &io.connect_io(admin.cntlid, 1, NQN_OPEN, HOST_NQN),
            0,
            0,
            "I/O Connect",
        );
        let data = pattern(31, 1024);
        assert!(io.write(1, 200, &data).status.is_success());
        let mut sqe = io.rw_sqe(io_opc::READ, 1, 200, 2);
        sqe.sgl = transported(1024);
        io.send_capsule(&sqe, &[]);
        let p = io.expect_pdu("C2HData");
        assert_eq!(p.kind(), Some(PduType::C2HData));
        assert_eq!(
            p.ch.pdo, 128,
            "C2HData PDO with HPDA 31 (digests {digests})"
        );
        assert!(p.bytes[128..128 + 1024] == data[..]);
        io.expect_status(sqe.cid, 0, 0);
    }
}

fn abuse_second_connect(t: &TestTarget) {
    let mut h = t.admin(false);
    let c = h.connect_admin(NQN_OPEN, HOST_NQN, 0);
    assert!(
        !c.status.is_success(),
        "a second Connect on a connected queue succeeded"
    );
    let ka = Sqe::new(admin_opc::KEEP_ALIVE, 4000);
    h.send_capsule(&ka, &[]);
    h.expect_status(4000, 0, 0);
}

fn abuse_unknown_fctype(t: &TestTarget) {
    let mut h = t.admin(false);
    for (cid, fct) in [(60u16, 0x42u8), (61, 0x7F), (62, 0x05), (63, 0x06)] {
        let mut s = Sqe::new(nvme_wire::sqe::FABRICS_OPCODE, cid);
        s.nsid = u32::from(fct);
        h.send_capsule(&s, &[]);
        let c = h.expect_resp();
        assert_eq!(c.cid, cid);
        assert!(!c.status.is_success(), "fctype {fct:#x} succeeded");
        assert!(c.status.dnr, "fctype {fct:#x}: DNR");
    }
    let ka = Sqe::new(admin_opc::KEEP_ALIVE, 64);
    h.send_capsule(&ka, &[]);
    h.expect_status(64, 0, 0);
}

fn abuse_aer_limit(t: &TestTarget) {
    let mut h = t.admin(false);
    // AERL + 1 requests are held without an answer; one more is refused.
    for cid in 70..74u16 {
        h.send_capsule(&Sqe::new(admin_opc::ASYNC_EVENT_REQUEST, cid), &[]);
    }
    assert!(
        h.quiet_for(Duration::from_millis(100)),
        "an AER was answered without an event"
    );
    h.send_capsule(&Sqe::new(admin_opc::ASYNC_EVENT_REQUEST, 74), &[]);
    let c = h.expect_status(74, SCT_CMD_SPECIFIC, status::SC_ASYNC_LIMIT);
    assert!(c.status.dnr);
    let ka = Sqe::new(admin_opc::KEEP_ALIVE, 75);
    h.send_capsule(&ka, &[]);
    h.expect_status(75, 0, 0);
}

/// NVMe-oF Connect response dword 0 for "Connect Invalid Parameters": bits
/// 15:00 IPO (the offset of the bad field), bits 23:16 IATTR (bit 16: the
/// field is in the Connect data). Linux nvmet builds it as
/// `(1 << 16) | offsetof(struct nvmf_connect_data, x)` (IPO_IATTR_CONNECT_DATA)
/// and SPDK as `struct { u16 ipo; u8 iattr; u8 rsvd; }`; the Linux host
/// decodes it the same way (nvmf_log_connect_error).
#[test]
fn connect_invalid_parameters_dw0_is_ipo_low_iattr_high() {
    let t = TestTarget::start();
    let mut h = t.host_ic(false);
    let c = h.connect_admin(UNKNOWN_NQN, HOST_NQN, 0);
    expect_connect_invalid(&c, "unknown subnqn");
    assert_eq!(
        (c.dw0 & 0xFFFF, (c.dw0 >> 16) & 0xFF),
        (256, 1),
        "IPO 256 IATTR 1: dw0 {:#010x}",
        c.dw0
    );

    let admin = t.admin(false);
    let mut h = t.host_ic(false);
    let c = h.connect_io(0x1234, 1, NQN_OPEN, HOST_NQN);
    expect_connect_invalid(&c, "unknown cntlid");
    assert_eq!(
        (c.dw0 & 0xFFFF, (c.dw0 >> 16) & 0xFF),
        (16, 1),
        "IPO 16 IATTR 1: dw0 {:#010x}",
        c.dw0
    );

    let mut h = t.host_ic(false);
    let c = h.connect_io(admin.cntlid, 42, NQN_OPEN, HOST_NQN);
    expect_connect_invalid(&c, "qid 42");
    assert_eq!(
        (c.dw0 & 0xFFFF, (c.dw0 >> 16) & 0xFF),
        (42, 0),
        "IPO 42 IATTR 0: dw0 {:#010x}",
        c.dw0
    );

    // sqsize 0 (a queue needs two entries): IPO 44 in the SQE.
    let mut h = t.host_ic(false);
    let mut sqe = h.connect_sqe(0, 0, 0);
    sqe.cdw11 = 0;
    h.send_capsule(
        &sqe,
        &Host::connect_data(CNTLID_DYNAMIC, NQN_OPEN, HOST_NQN),
    );
    let c = h.expect_resp();
    expect_connect_invalid(&c, "sqsize 0");
    assert_eq!(
        (c.dw0 & 0xFFFF, (c.dw0 >> 16) & 0xFF),
        (44, 0),
        "IPO 44 IATTR 0: dw0 {:#010x}",
        c.dw0
    );
    t.shutdown();
}

/// Two Connects on one connection, the first waiting for its data (R2T)
/// while the second is in-capsule: at most one may succeed, and once the
/// connection is gone no controller may be left behind. (Both used to
/// succeed, the second controller overwrote the queue and the first leaked.)
#[test]
fn two_connects_in_flight_do_not_leak_a_controller() {
    let t = TestTarget::start();
    let mut h = t.host_ic(false);
    let mut s1 = h.connect_sqe(0, 31, 0);
    s1.sgl = transported(1024);
    h.send_capsule(&s1, &[]);
    let p = h.expect_pdu("R2T for the Connect data");
    assert_eq!(p.kind(), Some(PduType::R2T), "got {:?}", p.ch);
    let r = R2THdr::decode(&p.bytes).unwrap();

    let s2 = h.connect_sqe(0, 31, 0);
    h.send_capsule(&s2, &Host::connect_data(CNTLID_DYNAMIC, NQN_OPEN, HOST_NQN));
    let c2 = h.expect_resp();
    assert_eq!(c2.cid, s2.cid);

    let data = Host::connect_data(CNTLID_DYNAMIC, NQN_OPEN, HOST_NQN);
    h.send(&h.h2c_pdu(s1.cid, r.ttag, 0, &data, true));
    let c1 = h.expect_resp();
    assert_eq!(c1.cid, s1.cid);
    let both = c1.status.is_success() && c2.status.is_success();
    drop(h);
    let left = t.wait_controllers(0, Duration::from_secs(3));
    assert!(
        !both && left == 0,
        "both Connects on one queue succeeded: {both} (cntlid {} and {}); controllers left after \
         the connection closed: {left}",
        c1.dw0 as u16,
        c2.dw0 as u16
    );
    t.shutdown();
}

// ---------------------------------------------------------------- keep-alive

#[test]
fn keep_alive_timeout_tears_down_controller() {
    let t = TestTarget::start();
    let mut admin = enabled_admin(&t, 1000);
    let mut io = t.host_ic(false);
    let c = io.connect_io(admin.cntlid, 1, NQN_OPEN, HOST_NQN);
    assert_status(&c, 0, 0, "I/O Connect");
    assert_eq!(t.target.controller_count(), 1);
    let start = Instant::now();
    // Silence on both queues: the admin connection must be closed by the target.
    admin.expect_closed();
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(800),
        "closed after {took:?}, before KATO"
    );
    assert!(took <= Duration::from_millis(3000), "closed after {took:?}");
    io.expect_closed();
    assert_eq!(
        t.wait_controllers(0, Duration::from_secs(2)),
        0,
        "controller not freed"
    );
    // A new controller can be made afterwards.
    let mut h = t.admin(false);
    h.set_num_queues(1);
    t.shutdown();
}

#[test]
fn keep_alive_traffic_keeps_controller() {
    let t = TestTarget::start();
    let mut admin = enabled_admin(&t, 1000);
    for i in 0..5u16 {
        std::thread::sleep(Duration::from_millis(400));
        let ka = Sqe::new(admin_opc::KEEP_ALIVE, 100 + i);
        admin.send_capsule(&ka, &[]);
        admin.expect_status(100 + i, 0, 0);
    }
    assert_eq!(t.target.controller_count(), 1);
    t.shutdown();
}

// ---------------------------------------------------------------- isolation

type Abuse = fn(&TestTarget);

/// Every abuse, once: its own `#[test]` (on a fresh target, beside a healthy controller
/// that must still do verified I/O after it) and a row of `ABUSES`, which
/// `abuse_while_healthy_io_runs` replays on one shared target, in this order.
macro_rules! abuses {
    ($($test:ident: $name:literal => $abuse:expr,)*) => {
        $(
            #[test]
            fn $test() {
                case($abuse);
            }
        )*

        const ABUSES: &[(&str, Abuse)] = &[$(($name, $abuse)),*];
    };
}

abuses! {
    capsule_wrong_hlen_is_fes1_fei2: "capsule_wrong_hlen" => |t| pdu_rows(t, "capsule_wrong_hlen"),
    capsule_plen_below_hlen_is_fes1_fei4: "capsule_plen_below_hlen" => |t| pdu_rows(t, "capsule_plen_below_hlen"),
    capsule_plen_over_limit_is_fes1_fei4_without_waiting: "capsule_plen_over_limit" => |t| pdu_rows(t, "capsule_plen_over_limit"),
    unknown_pdu_type_is_fes1_fei0: "unknown_pdu_type" => |t| pdu_rows(t, "unknown_pdu_type"),
    capsule_bad_pdo_is_fes1_fei3: "capsule_bad_pdo" => |t| pdu_rows(t, "capsule_bad_pdo"),
    host_term_req_closes_the_connection: "host_term_req" => |t| pdu_rows(t, "host_term_req"),
    controller_to_host_pdu_from_host_is_fes1_fei0: "controller_to_host_types" => |t| pdu_rows(t, "controller_to_host_types"),
    pdu_before_icreq_is_sequence_error: "pdu_before_icreq" => |t| pdu_rows(t, "pdu_before_icreq"),
    second_icreq_is_sequence_error: "second_icreq" => |t| pdu_rows(t, "second_icreq"),
    icreq_bad_fields_point_at_the_field: "icreq_fields" => |t| pdu_rows(t, "icreq_fields"),
    header_digest_mismatch_is_fes3: "header_digest_mismatch" => abuse_header_digest_mismatch,
    in_capsule_data_digest_mismatch_is_transient_error_and_queue_lives: "in_capsule_data_digest" => abuse_in_capsule_data_digest,
    h2c_data_digest_mismatch_is_transient_error_after_transfer: "h2c_data_digest" => abuse_h2c_data_digest,
    h2c_unknown_ttag_is_fes1_fei10: "h2c_unknown_ttag" => |t| h2c_rows(t, "h2c_unknown_ttag"),
    h2c_wrong_cccid_is_fes1_fei8: "h2c_wrong_cccid" => |t| h2c_rows(t, "h2c_wrong_cccid"),
    h2c_datao_gap_is_fes4_fei12: "h2c_datao_gap" => |t| h2c_rows(t, "h2c_datao_gap"),
    h2c_past_r2t_range_is_fes4_fei16: "h2c_past_r2t_range" => |t| h2c_rows(t, "h2c_past_r2t_range"),
    h2c_datal_not_matching_plen_is_fes1_fei16: "h2c_datal_mismatch" => abuse_h2c_datal_mismatch,
    h2c_over_maxh2cdata_ends_in_termreq: "h2c_over_maxh2cdata" => abuse_h2c_over_maxh2cdata_terminates,
    bad_sgls_get_sgl_status_codes: "sgl" => abuse_sgl,
    lba_out_of_range_is_0x80_with_dnr: "lba_out_of_range" => abuse_lba_out_of_range,
    invalid_nsid_is_0x0b: "invalid_nsid" => abuse_invalid_nsid,
    transfer_over_mdts_is_invalid_field: "over_mdts" => abuse_over_mdts,
    io_opcode_on_admin_queue_is_invalid_opcode: "io_opcode_on_admin" => abuse_io_opcode_on_admin,
    admin_opcode_on_io_queue_is_invalid_opcode: "admin_opcode_on_io" => abuse_admin_opcode_on_io,
    connect_unknown_subsystem_is_0x82: "connect_unknown_subsystem" => abuse_connect_unknown_subsystem,
    io_connect_unknown_cntlid_is_0x82: "io_connect_unknown_cntlid" => abuse_io_connect_unknown_cntlid,
    connect_host_not_allowed_is_0x84: "connect_host_not_allowed" => abuse_connect_host_not_allowed,
    command_before_connect_is_sequence_error: "command_before_connect" => abuse_command_before_connect,
    io_connect_qid_beyond_granted_is_0x82: "io_connect_qid_beyond_granted" => abuse_io_connect_qid_beyond_granted,
    admin_command_before_enable_is_sequence_error: "admin_before_enable" => abuse_admin_before_enable,
    property_wrong_size_or_read_only_is_invalid_field: "property_sizes" => abuse_property_sizes,
    second_connect_on_a_connected_queue_fails: "second_connect" => abuse_second_connect,
    connect_bad_fields_point_at_the_field: "connect_bad_fields" => abuse_connect_bad_fields,
    hpda_aligns_c2h_data: "hpda_alignment" => abuse_hpda_alignment,
    unknown_fabrics_command_type_fails_with_dnr: "unknown_fctype" => abuse_unknown_fctype,
    aer_over_limit_is_async_event_limit_exceeded: "aer_limit" => abuse_aer_limit,
}

/// Every abuse above, run while another controller's I/O loop keeps going on
/// the same target (and the same reactor thread): the loop must never fail.
#[test]
fn abuse_while_healthy_io_runs() {
    let mut cfg = test_transport();
    cfg.reactors = 2;
    let t = Arc::new(TestTarget::with(cfg));
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let mut loops = Vec::new();
    for _ in 0..2 {
        let mut healthy = t.healthy();
        let (stop, rounds) = (stop.clone(), rounds.clone());
        loops.push(std::thread::spawn(move || -> Result<(), String> {
            while !stop.load(Ordering::Relaxed) {
                healthy.try_verify()?;
                rounds.fetch_add(1, Ordering::Relaxed);
            }
            healthy.try_verify()
        }));
    }
    for (name, abuse) in ABUSES {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| abuse(&t)));
        if r.is_err() {
            stop.store(true, Ordering::Relaxed);
            panic!("abuse {name} failed while the healthy loop ran");
        }
    }
    stop.store(true, Ordering::Relaxed);
    for l in loops {
        l.join()
            .expect("healthy loop thread")
            .expect("healthy I/O loop");
    }
    assert!(
        rounds.load(Ordering::Relaxed) >= 2,
        "the healthy loop barely ran"
    );
    match Arc::try_unwrap(t) {
        Ok(t) => t.shutdown(),
        Err(_) => panic!("target still shared"),
    }
}

// ---------------------------------------------------------------- robustness

/// What a garbage iteration sets up before its garbage.
#[derive(Debug, Clone, Copy)]
enum Stage {
    AfterIcreq,
    AdminEnabled,
    IoQueue,
}

fn garbage(rng: &mut Rng, h: &Host, stage: Stage) -> Vec<u8> {
    let mut out = Vec::new();
    match rng.below(6) {
        0 => {
            let n = 1 + rng.below(600) as usize;
            out.resize(n, 0);
            rng.fill(&mut out);
        }
        1 => {
            // A common header with plausible types and random lengths, then some bytes.
            let ty = [0u8, 2, 4, 6, 1, 3, 5, 7, 9, rng.byte()][rng.below(10) as usize];
            let hlen = [24u8, 72, 128, rng.byte()][rng.below(4) as usize];
            let plen = match rng.below(4) {
                0 => u32::from(hlen) + rng.below(64) as u32,
                1 => rng.below(20_000) as u32,
                2 => rng.next_u64() as u32,
                _ => u32::from(hlen),
            };
            let mut b = vec![0u8; 8 + rng.below(300) as usize];
            rng.fill(&mut b);
            CommonHeader {
                pdu_type: ty,
                flags: rng.byte() & 0x0F,
                hlen,
                pdo: rng.byte(),
                plen,
            }
            .encode(&mut b);
            out = b;
        }
        2 | 3 => {
            // Well-framed capsules with random commands.
            for _ in 0..1 + rng.below(4) {
                let opc = [
                    0x00u8,
                    0x01,
                    0x02,
                    0x08,
                    0x09,
                    0x7F,
                    0x7F,
                    0x06,
                    0x0C,
                    0x18,
                    0x0A,
                    rng.byte(),
                ][rng.below(12) as usize];
                let mut sqe = Sqe::new(opc, rng.next_u64() as u16);
                let mut raw = sqe.encode();
                rng.fill(&mut raw[40..64]);
                sqe = Sqe::decode(&raw).unwrap();
                sqe.opcode = opc;
                sqe.flags = [0x40u8, 0x40, 0x40, 0x00, rng.byte()][rng.below(5) as usize];
                sqe.nsid = if opc == 0x7F {
                    [0u32, 1, 4, 8, 5, 6, rng.byte().into()][rng.below(7) as usize]
                } else {
                    [0u32, 1, 1, 1, 2, 0xFFFF_FFFF, rng.next_u64() as u32][rng.below(7) as usize]
                };
                if rng.chance(2) {
                    sqe.cdw10 = rng.below(64) as u32;
                    sqe.cdw11 = 0;
                    sqe.cdw12 = rng.below(300) as u32;
                }
                let dlen = [0usize, 0, 512, 1024, rng.below(9000) as usize][rng.below(5) as usize];
                let ty = [SGL_DATA_BLOCK_OFFSET, SGL_TRANSPORT_DATA_BLOCK, rng.byte()]
                    [rng.below(3) as usize];
                let len = if rng.chance(4) {
                    rng.next_u64() as u32
                } else {
                    dlen as u32
                };
                sqe.sgl = SglDesc {
                    addr: if rng.chance(8) { rng.next_u64() } else { 0 },
                    length: len,
                    type_byte: ty,
                };
                let mut data = vec![0u8; if ty == SGL_DATA_BLOCK_OFFSET { dlen } else { 0 }];
                rng.fill(&mut data);
                out.extend_from_slice(&h.capsule_pdu(&sqe, &data));
            }
        }
        4 => {
            // A write waiting for data and random H2CData (fields and flags mutated).
            let len = 512 * (1 + rng.below(64) as u32);
            let mut sqe = Sqe::new(io_opc::WRITE, 7);
            sqe.nsid = 1;
            sqe.cdw12 = len / 512 - 1;
            sqe.sgl = transported(len);
            out.extend_from_slice(&h.capsule_pdu(&sqe, &[]));
            let mut off = 0u32;
            for _ in 0..1 + rng.below(4) {
                let n = (512 * (1 + rng.below(40) as u32)).min(MAX_H2C + 1024);
                let cccid = if rng.chance(6) {
                    rng.next_u64() as u16
                } else {
                    7
                };
                let ttag = if rng.chance(3) {
                    rng.below(40) as u16
                } else {
                    0
                };
                let datao = if rng.chance(5) {
                    rng.next_u64() as u32
                } else {
                    off
                };
                let data = vec![0xA5u8; n as usize];
                let mut b = h.h2c_pdu(cccid, ttag, datao, &data, rng.chance(2));
                if rng.chance(4) {
                    let i = rng.below(b.len() as u64) as usize;
                    b[i] ^= 1 << rng.below(8);
                }
                out.extend_from_slice(&b);
                off = off.wrapping_add(n);
            }
        }
        _ => {
            // A valid command with a few flipped bits anywhere.
            let mut sqe = Sqe::new(io_opc::WRITE, 9);
            sqe.nsid = 1;
            sqe.sgl = in_capsule(512);
            let mut b = h.capsule_pdu(&sqe, &[0x5Au8; 512]);
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(b.len() as u64) as usize;
                b[i] ^= 1 << rng.below(8);
            }
            out = b;
        }
    }
    let _ = stage;
    out
}

/// Random garbage after a valid handshake, a new connection each time: each
/// iteration must end (the target closes once the host half-closes, with
/// well-formed PDUs before) within the timeout, and the target must keep
/// serving a healthy controller throughout.
#[test]
fn random_garbage_never_hangs_or_kills_target() {
    let t = TestTarget::start();
    let mut healthy = t.healthy();
    let baseline = t.target.controller_count();
    // FAULT_GARBAGE_SEED / FAULT_GARBAGE_ITERS widen the search by hand.
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let seed = env("FAULT_GARBAGE_SEED", 0xF1A5_4B00_1234);
    let iterations = env("FAULT_GARBAGE_ITERS", 300);
    let mut rng = Rng::new(seed);
    let mut term_reqs = 0;
    let mut responses = 0;
    let start = Instant::now();
    for i in 0..iterations {
        let digests = rng.chance(2);
        let stage = match rng.below(3) {
            0 => Stage::AfterIcreq,
            1 => Stage::AdminEnabled,
            _ => Stage::IoQueue,
        };
        let (_admin, mut h) = match stage {
            Stage::AfterIcreq => (None, t.host_ic(digests)),
            Stage::AdminEnabled => (None, t.admin(digests)),
            Stage::IoQueue => {
                let (a, io) = t.admin_and_io(digests);
                (Some(a), io)
            }
        };
        let g = garbage(&mut rng, &h, stage);
        // The target may close early; a failed send is fine.
        let _ = h.send_raw(&g);
        h.half_close();
        match h.drain_until_closed(Duration::from_secs(3)) {
            Ok(pdus) => {
                for p in &pdus {
                    match p.kind() {
                        Some(PduType::C2HTermReq) => term_reqs += 1,
                        Some(PduType::CapsuleResp) => responses += 1,
                        Some(PduType::C2HData | PduType::R2T) => {}
                        other => panic!(
                            "iteration {i} ({stage:?}): target sent {other:?}: {:?}",
                            p.ch
                        ),
                    }
                }
            }
            Err(e) => panic!(
                "iteration {i} ({stage:?}): {e}; garbage {:02x?}",
                &g[..g.len().min(200)]
            ),
        }
        if i % 50 == 49 {
            healthy.verify();
        }
    }
    healthy.verify();
    eprintln!(
        "garbage: seed {seed:#x}, {iterations} iterations in {:?}: {term_reqs} TermReqs, {responses} responses",
        start.elapsed()
    );
    // Every controller the iterations made is gone again.
    let left = t.wait_controllers(baseline, Duration::from_secs(3));
    assert_eq!(
        left, baseline,
        "controllers left behind by garbage connections"
    );
    assert!(
        term_reqs > 0 && responses > 0,
        "garbage never reached the checks"
    );
    assert!(
        iterations > 300 || start.elapsed() < Duration::from_secs(15),
        "garbage loop took {:?}",
        start.elapsed()
    );
    t.shutdown();
}

// ---------------------------------------------------------------- slow readers

/// Fills the admin connection's send path: Get Log Page commands with 128 KiB
/// of data each, and the host never reads an answer.
fn stall_admin_queue(h: &mut Host) {
    let mut burst = Vec::new();
    for cid in 0..200u16 {
        let mut s = Sqe::new(admin_opc::GET_LOG_PAGE, 1000 + cid);
        let numd = MAX_TRANSFER / 4 - 1;
        s.cdw10 = 0x02 | ((numd & 0xFFFF) << 16);
        s.cdw11 = numd >> 16;
        s.nsid = 0xFFFF_FFFF;
        s.sgl = transported(MAX_TRANSFER);
        burst.extend_from_slice(&h.capsule_pdu(&s, &[]));
    }
    // The target stops reading once it is stuck; a send that times out is fine.
    h.s.set_write_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let _ = h.send_raw(&burst);
}

/// A host that stops reading (a paused VM, a wedged initiator) must still be
/// subject to keep-alive: after KATO without commands the controller goes.
/// (conn.rs used to await its flush outside the select!, so the connection
/// blocked in the write forever and never saw keep-alive, kill or shutdown.)
#[test]
fn slow_reader_admin_queue_still_times_out() {
    let t = TestTarget::start();
    let mut h = enabled_admin(&t, 1000);
    stall_admin_queue(&mut h);
    let left = t.wait_controllers(0, Duration::from_secs(4));
    assert_eq!(
        left, 0,
        "controller still there 4 s after KATO 1 s of silence (host not reading)"
    );
    t.shutdown();
}

/// Server::shutdown must finish while a host that stopped reading is connected.
#[test]
fn slow_reader_does_not_block_shutdown() {
    let t = TestTarget::start();
    let mut h = enabled_admin(&t, 0);
    stall_admin_queue(&mut h);
    std::thread::sleep(Duration::from_millis(200));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        t.shutdown();
        let _ = tx.send(());
    });
    let done = rx.recv_timeout(Duration::from_secs(6));
    // Keep the host's socket open (not reading) until the verdict.
    drop(h);
    assert!(
        done.is_ok(),
        "Server::shutdown() still running after 6 s with a non-reading host"
    );
}

// ---------------------------------------------------------------- controller reset

/// CC.EN 1 -> 0 is a Controller Level Reset: the I/O queues are gone (NVMe
/// base spec, "Controller Level Reset"; NVMe-oF: the host must reconnect
/// them). An I/O command on such a queue must not run: Linux nvmet answers
/// Command Sequence Error (nvmet_check_ctrl_status); closing the queue is
/// fine too.
#[test]
fn io_after_controller_reset_does_not_run() {
    let t = TestTarget::start();
    let (mut admin, mut io) = t.admin_and_io(false);
    let before = pattern(21, 512);
    assert!(io.write(1, 0, &before).status.is_success());
    let c = admin.property_set(prop::CC, false, 0);
    assert_status(&c, 0, 0, "Property Set CC.EN = 0");
    let c = admin.property_get(prop::CSTS, false);
    assert_eq!(c.dw0 & prop::CSTS_RDY, 0, "CSTS.RDY after reset");
    let after = pattern(22, 512);
    match io.try_write(1, 0, &after) {
        Ok(c) => assert_status(
            &c,
            SCT_GENERIC,
            status::SC_CMD_SEQ_ERROR,
            "write after reset",
        ),
        Err(e) => assert!(
            e.contains("closed") || e.contains("TermReq"),
            "write after reset: {e}"
        ),
    }
    // Whatever the I/O queue did, the data must be the old one.
    admin.enable();
    let mut io2 = t.host_ic(false);
    assert_status(
        &io2.connect_io(admin.cntlid, 2, NQN_OPEN, HOST_NQN),
        0,
        0,
        "reconnect",
    );
    let (_, got) = io2.read(1, 0, 1);
    assert!(
        got == before,
        "a write on a reset controller's I/O queue changed the data"
    );
    t.shutdown();
}

// ---------------------------------------------------------------- admin transfer lengths

/// The SGL of an admin command that returns data must describe exactly the
/// command's transfer (Identify: 4096 bytes; Get Log Page: NUMD + 1 dwords);
/// SGLS (0x100001) does not claim bit 18 (SGL longer than the data), and a
/// shorter one is always "Data SGL Length Invalid" (0x0F). I/O commands get
/// this right (tcp/conn.rs io()); Linux nvmet checks it for every command
/// (nvmet_check_transfer_len).
#[test]
fn admin_sgl_length_must_match_transfer() {
    let t = TestTarget::start();
    let mut h = t.admin(false);
    let mut ident = Sqe::new(admin_opc::IDENTIFY, 90);
    ident.cdw10 = 1;
    ident.sgl = transported(100);
    h.send_capsule(&ident, &[]);
    let p = h.expect_pdu("answer to Identify with a 100-byte SGL");
    let c = pdu_to_cqe(&p).unwrap_or_else(|e| panic!("Identify with a 100-byte SGL: {e}"));
    assert_status(
        &c,
        SCT_GENERIC,
        status::SC_SGL_INVALID_DATA_LEN,
        "Identify, SGL 100",
    );

    let mut glp = Sqe::new(admin_opc::GET_LOG_PAGE, 91);
    let numd = 512 / 4 - 1;
    glp.cdw10 = 0x02 | (numd << 16);
    glp.nsid = 0xFFFF_FFFF;
    glp.sgl = transported(4096);
    h.send_capsule(&glp, &[]);
    let p = h.expect_pdu("answer to Get Log Page with NUMD 512 B, SGL 4 KiB");
    let c = pdu_to_cqe(&p).unwrap_or_else(|e| panic!("Get Log Page NUMD/SGL mismatch: {e}"));
    assert_status(
        &c,
        SCT_GENERIC,
        status::SC_SGL_INVALID_DATA_LEN,
        "Get Log Page, NUMD != SGL",
    );
    t.shutdown();
}

// ---------------------------------------------------------------- direct receive of large H2CData

/// A large H2CData whose payload trickles in after its header is read
/// straight into the command's buffer (tcp/conn.rs start_direct_rx). Data
/// must land intact at the right offsets whatever the split, and the next
/// PDUs on the same connection must parse normally afterwards.
#[test]
fn h2c_payload_arriving_in_pieces_lands_intact() {
    let t = TestTarget::start();
    let (_admin, mut io) = t.admin_and_io(false);
    let len = 64 * 1024u32;
    let data = pattern(77, len as usize);
    let (sqe, r) = write_awaiting_r2t(&mut io, 64, len);
    let mut off = 0u32;
    // Two H2CData PDUs of MAX_H2C each would not cover 64 KiB with MAX_H2C = 16 KiB:
    // send MAX_H2C-sized PDUs, each header alone first, then its payload in uneven pieces.
    while off < len {
        let n = MAX_H2C.min(len - off);
        let pdu = io.h2c_pdu(
            sqe.cid,
            r.ttag,
            off,
            &data[off as usize..(off + n) as usize],
            off + n == len,
        );
        io.send(&pdu[..24]);
        std::thread::sleep(Duration::from_millis(5));
        let body = &pdu[24..];
        for chunk in body.chunks(5000) {
            io.send(chunk);
            std::thread::sleep(Duration::from_millis(2));
        }
        off += n;
    }
    let c = io.expect_resp();
    assert!(c.status.is_success(), "write status {:?}", c.status);
    let (st, got) = io.read(1, 64, len / BLOCK);
    assert!(st.status.is_success(), "read status {:?}", st.status);
    assert!(got == data, "data written in pieces reads back different");
    t.shutdown();
}

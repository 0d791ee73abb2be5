//! Writes the seed corpora in fuzz/seeds/<target>/: small, valid inputs that
//! get each fuzzer past the first checks. Run from fuzz/:
//!   cargo run --example gen_seeds
//! (the checked-in seeds were made this way; rerun after changing a format).

use std::path::Path;

use flashpool_fuzz::*;
use nvme_wire::fabrics::{CNTLID_DYNAMIC, PropertyCmd, discovery, fctype, prop};
use nvme_wire::pdu::{CommonHeader, PduType, TermReq};
use nvme_wire::sqe::{
    DSM_ATTR_DEALLOCATE, DsmRange, SGL_DATA_BLOCK_OFFSET, SGL_TRANSPORT_DATA_BLOCK, SglDesc, Sqe,
    admin_opc, io_opc,
};

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn tdb(len: u32) -> SglDesc {
    SglDesc {
        addr: 0,
        length: len,
        type_byte: SGL_TRANSPORT_DATA_BLOCK,
    }
}

fn icd(len: u32) -> SglDesc {
    SglDesc {
        addr: 0,
        length: len,
        type_byte: SGL_DATA_BLOCK_OFFSET,
    }
}

fn identify(cid: u16, cns: u32, nsid: u32) -> Sqe {
    let mut s = Sqe::new(admin_opc::IDENTIFY, cid);
    s.cdw10 = cns;
    s.nsid = nsid;
    s.sgl = tdb(4096);
    s
}

fn get_log(cid: u16, lid: u8, len: u32) -> Sqe {
    let mut s = Sqe::new(admin_opc::GET_LOG_PAGE, cid);
    let numd = len / 4 - 1;
    s.cdw10 = u32::from(lid) | ((numd & 0xFFFF) << 16);
    s.cdw11 = numd >> 16;
    s.nsid = 0xFFFF_FFFF;
    s.sgl = tdb(len);
    s
}

fn features(set: bool, cid: u16, fid: u32, val: u32) -> Sqe {
    let mut s = Sqe::new(
        if set {
            admin_opc::SET_FEATURES
        } else {
            admin_opc::GET_FEATURES
        },
        cid,
    );
    s.cdw10 = fid;
    s.cdw11 = val;
    s
}

fn dsm_data() -> Vec<u8> {
    let mut d = vec![0u8; 32];
    DsmRange {
        attributes: 0,
        nlb: 8,
        slba: 0,
    }
    .encode(&mut d[..16]);
    DsmRange {
        attributes: 0,
        nlb: 16,
        slba: 100,
    }
    .encode(&mut d[16..]);
    d
}

fn dsm_sqe(cid: u16, sgl: SglDesc) -> Sqe {
    let mut s = Sqe::new(io_opc::DATASET_MANAGEMENT, cid);
    s.nsid = 1;
    s.cdw10 = 1;
    s.cdw11 = DSM_ATTR_DEALLOCATE;
    s.sgl = sgl;
    s
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let w512 = vec![0xA5u8; 512];
    let w4k = vec![0x5Au8; 4096];

    // ---- pdu_decode: selector byte (1 = after ICReq, 3/7 = digests) + a PDU or structure.
    let d = root.join("pdu_decode");
    let after_ic_8k = 1 | (3 << 3) | (2 << 5); // ic_done, capsule limit 8192, maxh2cdata 512
    let dg = 1 | 2 | 4 | (3 << 3) | (4 << 5);
    write(&d, "icreq", &cat(&[&[0], &icreq(false)]));
    write(&d, "icreq_digests", &cat(&[&[0], &icreq(true)]));
    let (c, cd) = connect(1, 0, CNTLID_DYNAMIC, NQN_OPEN, HOST_NQN, 5000);
    write(
        &d,
        "connect_capsule",
        &cat(&[&[after_ic_8k], &capsule(&c, &cd, false)]),
    );
    write(
        &d,
        "connect_capsule_digests",
        &cat(&[&[dg], &capsule(&c, &cd, true)]),
    );
    write(&d, "connect_data", &cat(&[&[0], &cd]));
    write(
        &d,
        "read",
        &cat(&[
            &[after_ic_8k],
            &capsule(&rw(io_opc::READ, 3, 0, 8, tdb(4096)), &[], false),
        ]),
    );
    write(
        &d,
        "write_icd",
        &cat(&[
            &[after_ic_8k],
            &capsule(&rw(io_opc::WRITE, 4, 8, 1, icd(512)), &w512, false),
        ]),
    );
    write(
        &d,
        "h2c_data",
        &cat(&[&[after_ic_8k], &h2c(4, 0, 0, &w512, false)]),
    );
    write(
        &d,
        "h2c_data_digests",
        &cat(&[&[dg], &h2c(4, 0, 0, &w512, true)]),
    );
    let mut tr = [0u8; 152];
    let n = TermReq { fes: 1, fei: 2 }.encode(PduType::H2CTermReq, &[0u8; 72], &mut tr);
    write(&d, "h2c_term_req", &cat(&[&[1], &tr[..n]]));
    let mut cqe = nvme_wire::cqe::Cqe {
        dw0: 1,
        dw1: 0,
        sqhd: 1,
        sqid: 0,
        cid: 1,
        status: nvme_wire::status::Status::SUCCESS,
    }
    .encode()
    .to_vec();
    cqe.insert(0, 0);
    write(&d, "cqe", &cqe);
    let mut entry = vec![0u8; 1025];
    discovery::Entry {
        adrfam: discovery::ADRFAM_IPV4,
        subtype: discovery::SUBTYPE_NVME,
        treq: 0,
        portid: 1,
        cntlid: CNTLID_DYNAMIC,
        asqsz: 32,
        trsvcid: "4420".into(),
        subnqn: NQN_OPEN.into(),
        traddr: "127.0.0.1".into(),
    }
    .encode(&mut entry[1..]);
    write(&d, "discovery_entry", &entry);
    write(&d, "dsm_ranges", &cat(&[&[0], &dsm_data()]));
    let mut bad = vec![0u8; 9];
    CommonHeader {
        pdu_type: 4,
        flags: 0,
        hlen: 72,
        pdo: 0,
        plen: 0x7fff_ffff,
    }
    .encode(&mut bad[1..]);
    bad[0] = after_ic_8k;
    write(&d, "huge_plen", &bad);

    // ---- command_dispatch: path byte + SQE + data.
    let d = root.join("command_dispatch");
    let sq = |sel: u8, s: &Sqe, data: &[u8]| cat(&[&[sel], &s.encode(), data]);
    write(
        &d,
        "io_read",
        &sq(0, &rw(io_opc::READ, 1, 0, 8, tdb(4096)), &[]),
    );
    write(
        &d,
        "io_write",
        &sq(0, &rw(io_opc::WRITE, 2, 16, 8, icd(4096)), &w4k),
    );
    write(
        &d,
        "io_write_zeroes",
        &sq(0, &rw(io_opc::WRITE_ZEROES, 3, 0, 64, tdb(0)), &[]),
    );
    let mut fl = Sqe::new(io_opc::FLUSH, 4);
    fl.nsid = 1;
    write(&d, "io_flush", &sq(1, &fl, &[]));
    write(&d, "io_dsm", &sq(1, &dsm_sqe(5, icd(32)), &dsm_data()));
    for (i, cns) in [1u32, 0, 2, 3].into_iter().enumerate() {
        write(
            &d,
            &format!("admin_identify_cns{cns}"),
            &sq(
                2,
                &identify(10 + i as u16, cns, if cns == 1 { 0 } else { 1 }),
                &[],
            ),
        );
    }
    write(
        &d,
        "admin_identify_discovery",
        &sq(2 | 0x08, &identify(9, 1, 0), &[]),
    );
    for (i, (lid, len)) in [
        (0x00u8, 1024u32),
        (0x01, 4096),
        (0x02, 512),
        (0x04, 4096),
        (0x05, 4096),
        (0x0C, 4096),
        (0x03, 512),
    ]
    .into_iter()
    .enumerate()
    {
        write(
            &d,
            &format!("admin_log_{lid:02x}"),
            &sq(3 | 0x40, &get_log(20 + i as u16, lid, len), &[]),
        );
    }
    write(
        &d,
        "admin_log_discovery",
        &sq(2 | 0x08, &get_log(30, 0x70, 4096), &[]),
    );
    write(
        &d,
        "admin_set_queues",
        &sq(2, &features(true, 40, 7, 0x0003_0003), &[]),
    );
    write(
        &d,
        "admin_set_kato",
        &sq(2, &features(true, 41, 0x0F, 5000), &[]),
    );
    write(
        &d,
        "admin_get_queues",
        &sq(2, &features(false, 42, 7, 0), &[]),
    );
    write(
        &d,
        "admin_aer",
        &sq(
            2 | 0x40,
            &Sqe::new(admin_opc::ASYNC_EVENT_REQUEST, 43),
            &[2],
        ),
    );
    write(
        &d,
        "admin_keep_alive",
        &sq(2, &Sqe::new(admin_opc::KEEP_ALIVE, 44), &[]),
    );
    write(
        &d,
        "admin_abort",
        &sq(2, &Sqe::new(admin_opc::ABORT, 45), &[]),
    );
    write(
        &d,
        "admin_not_enabled",
        &sq(2 | 0x30, &identify(46, 1, 0), &[]),
    );
    let (c, cd) = connect(50, 0, CNTLID_DYNAMIC, NQN_OPEN, HOST_NQN, 5000);
    write(&d, "connect_admin", &sq(4, &c, &cd));
    let (c, cd) = connect(51, 0, CNTLID_DYNAMIC, NQN_CLOSED, HOST_ALLOWED, 0);
    write(&d, "connect_admin_closed", &sq(4, &c, &cd));
    let (c, cd) = connect(
        52,
        0,
        CNTLID_DYNAMIC,
        nvme_wire::fabrics::DISCOVERY_NQN,
        HOST_NQN,
        0,
    );
    write(&d, "connect_discovery", &sq(4, &c, &cd));
    let (c, cd) = connect(53, 1, 1, NQN_OPEN, HOST_NQN, 0);
    write(
        &d,
        "connect_io_patched",
        &sq(5 | 0x08 | 0x10 | 0x20, &c, &cd),
    );
    let (c, cd) = connect(54, 2, 1, NQN_OPEN, HOST_NQN, 0);
    write(&d, "connect_io", &sq(4, &c, &cd));
    let pg = PropertyCmd {
        size8: true,
        offset: prop::CAP,
        value: 0,
    }
    .to_sqe(fctype::PROPERTY_GET, 60);
    let mut props = Vec::new();
    for (off, val) in [
        (prop::CC, CC_ENABLE),
        (prop::CC, CC_ENABLE | (1 << 14)),
        (prop::CC, 0),
        (prop::CC, 1 | (1 << 7)),
    ] {
        props.extend_from_slice(&off.to_le_bytes());
        props.extend_from_slice(&val.to_le_bytes());
        props.push(0);
    }
    write(&d, "property", &sq(6, &pg, &props));
    let mut seq = Vec::new();
    for s in [
        features(true, 1, 7, 0x0001_0001),
        features(false, 2, 7, 0),
        features(true, 3, 0x0B, 0x0900),
        features(false, 4, 0x0B, 0),
        identify(5, 2, 0),
        get_log(6, 0x01, 4096),
        PropertyCmd {
            size8: false,
            offset: prop::CC,
            value: 0,
        }
        .to_sqe(fctype::PROPERTY_SET, 7),
        identify(8, 1, 0),
    ] {
        seq.extend_from_slice(&s.encode());
    }
    write(&d, "admin_sequence", &cat(&[&[7], &seq]));

    // ---- conn_stream: set-up byte + bytes on the wire.
    let d = root.join("conn_stream");
    write(&d, "raw_icreq", &cat(&[&[0], &icreq(false)]));
    write(&d, "raw_icreq_digests", &cat(&[&[0], &icreq(true)]));
    let (c, cd) = connect(1, 0, CNTLID_DYNAMIC, NQN_OPEN, HOST_NQN, 0);
    write(
        &d,
        "ic_connect_enable_identify",
        &cat(&[
            &[1],
            &capsule(&c, &cd, false),
            &capsule(&enable_sqe(2), &[], false),
            &capsule(&identify(3, 1, 0), &[], false),
        ]),
    );
    let (c, _) = connect(1, 0, CNTLID_DYNAMIC, NQN_OPEN, HOST_NQN, 0);
    let mut c_r2t = c;
    c_r2t.sgl = tdb(1024);
    write(
        &d,
        "ic_connect_by_r2t",
        &cat(&[
            &[1],
            &capsule(&c_r2t, &[], false),
            &h2c(1, 0, 0, &cd, false),
        ]),
    );
    for (name, sel, dg) in [("admin", 2u8, false), ("admin_digests", 6, true)] {
        write(
            &d,
            &format!("{name}_commands"),
            &cat(&[
                &[sel],
                &capsule(&identify(3, 1, 0), &[], dg),
                &capsule(&get_log(4, 0x02, 512), &[], dg),
                &capsule(&features(true, 5, 7, 0x0001_0001), &[], dg),
                &capsule(&Sqe::new(admin_opc::ASYNC_EVENT_REQUEST, 6), &[], dg),
                &capsule(&Sqe::new(admin_opc::KEEP_ALIVE, 7), &[], dg),
            ]),
        );
    }
    write(
        &d,
        "admin_not_enabled",
        &cat(&[&[2 | 8], &capsule(&identify(3, 1, 0), &[], false)]),
    );
    for (name, sel, dg) in [("io", 3u8, false), ("io_digests", 7, true)] {
        write(
            &d,
            &format!("{name}_write_read"),
            &cat(&[
                &[sel],
                &capsule(&rw(io_opc::WRITE, 10, 0, 1, icd(512)), &w512, dg),
                &capsule(&rw(io_opc::READ, 11, 0, 1, tdb(512)), &[], dg),
                &capsule(&rw(io_opc::WRITE, 12, 8, 8, tdb(4096)), &[], dg),
                &h2c(12, 0, 0, &w4k, dg),
                &capsule(&rw(io_opc::READ, 13, 8, 8, tdb(4096)), &[], dg),
                &capsule(&rw(io_opc::WRITE_ZEROES, 14, 0, 8, tdb(0)), &[], dg),
                &capsule(&dsm_sqe(15, icd(32)), &dsm_data(), dg),
                &capsule(&Sqe::new(io_opc::FLUSH, 16), &[], dg),
            ]),
        );
    }
    let mut disc = Sqe::new(0x7F, 20);
    disc.nsid = u32::from(fctype::DISCONNECT);
    write(
        &d,
        "io_disconnect",
        &cat(&[&[3], &capsule(&disc, &[], false)]),
    );
    println!("seeds written under {}", root.display());
}

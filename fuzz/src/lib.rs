//! Shared pieces of the fuzz targets and the seed generator: a small target
//! with a RAM namespace, and PDU builders.

use std::sync::Arc;

use blockdev::MemDevice;
use nvme_wire::digest::{crc32c, data_digest};
use nvme_wire::fabrics::{ConnectCmd, ConnectData, PropertyCmd, fctype, prop};
use nvme_wire::pdu::{
    CommonHeader, FLAG_DDGSTF, FLAG_HDGSTF, FLAG_LAST_PDU, H2CDataHdr, ICReq, PduType,
};
use nvme_wire::sqe::{SGL_DATA_BLOCK_OFFSET, SglDesc, Sqe};
use nvmf_target::{Namespace, Subsystem, Target, TransportConfig};

pub const NQN_OPEN: &str = "nqn.2026-01.io.flashpool:fuzz-open";
pub const NQN_CLOSED: &str = "nqn.2026-01.io.flashpool:fuzz-closed";
pub const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:f0220000-0000-4000-8000-000000000001";
pub const HOST_ALLOWED: &str =
    "nqn.2014-08.org.nvmexpress:uuid:f0220000-0000-4000-8000-0000000000aa";
pub const BLOCK: u32 = 512;
/// 1 MiB: one lazily allocated chunk of the RAM device at most.
pub const NS_BYTES: u64 = 1 << 20;
/// CC value that enables a controller (64-byte SQEs, 16-byte CQEs).
pub const CC_ENABLE: u64 = 1 | (6 << 16) | (4 << 20);

pub fn transport(reactors: usize) -> TransportConfig {
    TransportConfig {
        max_queue_depth: 32,
        max_io_queues: 4,
        in_capsule_data: 8192,
        max_transfer: 64 * 1024,
        max_h2c_data: 16 * 1024,
        header_digest: true,
        data_digest: true,
        kato_max_ms: 120_000,
        reactors,
        cpus: Vec::new(),
        poll_us: 0,
        auth_timeout_ms: 30_000,
    }
}

fn subsystem(nqn: &str, allow_any_host: bool, hosts: Vec<String>) -> Arc<Subsystem> {
    let dev = Arc::new(MemDevice::new(NS_BYTES, BLOCK).expect("mem device"));
    Arc::new(Subsystem::new(
        nqn.into(),
        "FUZZ0001".into(),
        "flashpool fuzz".into(),
        allow_any_host,
        hosts,
        vec![Namespace::new(1, dev, [1; 16], [2; 16])],
    ))
}

/// A target with an open subsystem (nsid 1) and one that admits only `HOST_ALLOWED`.
pub fn make_target(reactors: usize) -> Arc<Target> {
    Arc::new(Target::new(
        transport(reactors),
        vec![
            subsystem(NQN_OPEN, true, Vec::new()),
            subsystem(NQN_CLOSED, false, vec![HOST_ALLOWED.into()]),
        ],
    ))
}

pub fn icreq(digests: bool) -> [u8; 128] {
    ICReq {
        pfv: 0,
        hpda: 0,
        dgst: if digests { 3 } else { 0 },
        maxr2t: 0,
    }
    .encode()
}

/// A CapsuleCmd PDU (digests when `digests`).
pub fn capsule(sqe: &Sqe, data: &[u8], digests: bool) -> Vec<u8> {
    let hd = if digests { 4 } else { 0 };
    let dd = if digests && !data.is_empty() { 4 } else { 0 };
    let pdo = if data.is_empty() { 0 } else { 72 + hd };
    let plen = 72 + hd + data.len() + dd;
    let mut b = vec![0u8; plen];
    let mut flags = 0;
    if hd > 0 {
        flags |= FLAG_HDGSTF;
    }
    if dd > 0 {
        flags |= FLAG_DDGSTF;
    }
    CommonHeader {
        pdu_type: PduType::CapsuleCmd as u8,
        flags,
        hlen: 72,
        pdo: pdo as u8,
        plen: plen as u32,
    }
    .encode(&mut b);
    b[8..72].copy_from_slice(&sqe.encode());
    if hd > 0 {
        let d = crc32c(&b[..72]);
        b[72..76].copy_from_slice(&d.to_le_bytes());
    }
    if !data.is_empty() {
        b[pdo..pdo + data.len()].copy_from_slice(data);
        if dd > 0 {
            let d = data_digest(data);
            b[pdo + data.len()..].copy_from_slice(&d.to_le_bytes());
        }
    }
    b
}

/// An H2CData PDU carrying `data` (digests when `digests`).
pub fn h2c(cccid: u16, ttag: u16, datao: u32, data: &[u8], digests: bool) -> Vec<u8> {
    let hd = if digests { 4 } else { 0 };
    let dd = if digests { 4 } else { 0 };
    let pdo = 24 + hd;
    let plen = pdo + data.len() + dd;
    let mut b = vec![0u8; plen];
    let mut flags = FLAG_LAST_PDU;
    if digests {
        flags |= FLAG_HDGSTF | FLAG_DDGSTF;
    }
    H2CDataHdr {
        cccid,
        ttag,
        datao,
        datal: data.len() as u32,
    }
    .encode(
        &mut b,
        CommonHeader {
            pdu_type: PduType::H2CData as u8,
            flags,
            hlen: 24,
            pdo: pdo as u8,
            plen: plen as u32,
        },
    );
    if hd > 0 {
        let d = crc32c(&b[..24]);
        b[24..28].copy_from_slice(&d.to_le_bytes());
    }
    b[pdo..pdo + data.len()].copy_from_slice(data);
    if dd > 0 {
        let d = data_digest(data);
        b[pdo + data.len()..].copy_from_slice(&d.to_le_bytes());
    }
    b
}

/// A Connect SQE with in-capsule data, and its 1024-byte data.
pub fn connect(
    cid: u16,
    qid: u16,
    cntlid: u16,
    subnqn: &str,
    hostnqn: &str,
    kato_ms: u32,
) -> (Sqe, [u8; 1024]) {
    let mut s = ConnectCmd {
        recfmt: 0,
        qid,
        sqsize: 31,
        cattr: 0,
        kato_ms,
    }
    .to_sqe(cid);
    s.sgl = SglDesc {
        addr: 0,
        length: 1024,
        type_byte: SGL_DATA_BLOCK_OFFSET,
    };
    let d = ConnectData {
        hostid: [0x5A; 16],
        cntlid,
        subnqn: subnqn.into(),
        hostnqn: hostnqn.into(),
    }
    .encode();
    (s, d)
}

/// Property Set CC.EN = 1.
pub fn enable_sqe(cid: u16) -> Sqe {
    PropertyCmd {
        size8: false,
        offset: prop::CC,
        value: CC_ENABLE,
    }
    .to_sqe(fctype::PROPERTY_SET, cid)
}

/// A Read or Write SQE for `nlb` blocks at `slba` of nsid 1.
pub fn rw(opcode: u8, cid: u16, slba: u64, nlb: u32, sgl: SglDesc) -> Sqe {
    let mut s = Sqe::new(opcode, cid);
    s.nsid = 1;
    s.cdw10 = slba as u32;
    s.cdw11 = (slba >> 32) as u32;
    s.cdw12 = nlb - 1;
    s.sgl = sgl;
    s
}

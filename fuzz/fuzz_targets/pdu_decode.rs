//! Every nvme-wire decoder and the target's PDU header check on arbitrary
//! bytes: nothing may panic, decoded values survive a round trip, and a
//! header that passes `check_header` describes a layout inside its PDU.
//!
//! Input: byte 0 picks the negotiated state for `check_header`; the rest is
//! the PDU (or structure) under test.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvme_wire::cqe::Cqe;
use nvme_wire::fabrics::{ConnectCmd, ConnectData, PropertyCmd, discovery};
use nvme_wire::pdu::{
    C2HDataHdr, CommonHeader, H2CDataHdr, ICReq, ICResp, PduType, R2THdr, TERMREQ_HLEN,
    TERMREQ_MAX_DATA, TermReq,
};
use nvme_wire::sqe::{DsmRange, Sqe};
use nvmf_target::tcp::pdu_check::{Negotiated, check_header};

fuzz_target!(|input: &[u8]| {
    let (sel, data) = match input.split_first() {
        Some((s, d)) => (*s, d),
        None => (0, input),
    };

    if let Ok(ch) = CommonHeader::decode(data) {
        let mut b = [0u8; 8];
        ch.encode(&mut b);
        assert_eq!(&b[..], &data[..8]);
        check(&ch, sel, data);
    }
    if let Ok(r) = ICReq::decode(data) {
        assert_eq!(ICReq::decode(&r.encode()).unwrap(), r);
    }
    if let Ok(r) = ICResp::decode(data) {
        assert_eq!(ICResp::decode(&r.encode()).unwrap(), r);
    }
    let ch = CommonHeader {
        pdu_type: PduType::H2CData as u8,
        flags: 0,
        hlen: 24,
        pdo: 24,
        plen: 24,
    };
    let mut b = [0u8; 24];
    if let Ok(h) = H2CDataHdr::decode(data) {
        h.encode(&mut b, ch);
        assert_eq!(H2CDataHdr::decode(&b).unwrap(), h);
    }
    if let Ok(h) = C2HDataHdr::decode(data) {
        h.encode(&mut b, ch);
        assert_eq!(C2HDataHdr::decode(&b).unwrap(), h);
    }
    if let Ok(h) = R2THdr::decode(data) {
        h.encode(&mut b, ch);
        assert_eq!(R2THdr::decode(&b).unwrap(), h);
    }
    if let Ok(t) = TermReq::decode(data) {
        let mut out = [0u8; TERMREQ_HLEN + TERMREQ_MAX_DATA];
        let n = t.encode(PduType::C2HTermReq, data, &mut out);
        assert!((TERMREQ_HLEN..=TERMREQ_HLEN + TERMREQ_MAX_DATA).contains(&n));
        assert_eq!(TermReq::decode(&out[..n]).unwrap(), t);
    }
    if let Ok(s) = Sqe::decode(data) {
        let again = Sqe::decode(&s.encode()).unwrap();
        assert_eq!(again, s);
        // The command-field views must not panic either.
        let _ = (s.slba(), s.nlb(), s.fua(), s.fctype(), s.data_direction());
        let c = ConnectCmd::from_sqe(&s);
        let _ = ConnectCmd::from_sqe(&c.to_sqe(s.cid));
        let p = PropertyCmd::from_sqe(&s);
        assert_eq!(PropertyCmd::from_sqe(&p.to_sqe(s.fctype(), s.cid)), p);
        let _ = nvme_wire::log_page::GetLogPage::from_sqe(&s);
    }
    if let Ok(c) = Cqe::decode(data) {
        assert_eq!(Cqe::decode(&c.encode()).unwrap(), c);
    }
    if let Ok(d) = ConnectData::decode(data) {
        assert_eq!(ConnectData::decode(&d.encode()).unwrap(), d);
    }
    let _ = nvmf_target::fabrics::decode_connect_data(data);
    if let Ok(r) = DsmRange::decode(data) {
        let mut b = [0u8; 16];
        r.encode(&mut b);
        assert_eq!(DsmRange::decode(&b).unwrap(), r);
    }
    let _ = discovery::Entry::decode(data);
    let _ = nvme_wire::get_str(data);
});

/// `check_header` under the negotiated state `sel` picks; an accepted header
/// must describe a layout that lies inside its PLEN.
fn check(ch: &CommonHeader, sel: u8, pdu: &[u8]) {
    let limits = [
        0u32,
        512,
        4096,
        8192,
        65536,
        1 << 20,
        u32::MAX - 1024,
        u32::MAX,
    ];
    let neg = Negotiated {
        ic_done: sel & 1 != 0,
        hdgst: sel & 2 != 0,
        ddgst: sel & 4 != 0,
        max_capsule_data: limits[usize::from(sel >> 3) & 7],
        maxh2cdata: limits[usize::from(sel >> 5) & 7],
    };
    let Ok(l) = check_header(ch, &neg) else {
        return;
    };
    assert_eq!(l.plen, ch.plen as usize);
    assert_eq!(l.pdu_type as u8, ch.pdu_type);
    assert_eq!(l.hlen, usize::from(ch.hlen));
    assert_eq!(l.hlen, l.pdu_type.hlen());
    assert!(l.hlen + l.hd <= l.plen, "{l:?}");
    assert!(l.data_off >= l.hlen + l.hd, "{l:?}");
    let tail = if l.dd { 4 } else { 0 };
    assert!(l.data_off + l.data_len + tail <= l.plen, "{l:?}");
    match l.pdu_type {
        PduType::CapsuleCmd => assert!(l.data_len <= neg.max_capsule_data as usize),
        PduType::H2CData => assert!(l.data_len <= neg.maxh2cdata as usize),
        PduType::ICReq => assert!(!neg.ic_done && l.plen == 128),
        PduType::H2CTermReq => assert!(l.plen <= TERMREQ_HLEN + TERMREQ_MAX_DATA),
        t => panic!("check_header accepted a {t:?} from a host"),
    }
    if l.pdu_type != PduType::ICReq && l.pdu_type != PduType::H2CTermReq {
        assert!(neg.ic_done, "{l:?} accepted before ICReq");
    }
    // What the connection does with a complete PDU of this layout.
    if pdu.len() >= l.plen {
        let p = &pdu[..l.plen];
        let _ = &p[l.data_off..l.data_off + l.data_len];
        if l.pdu_type == PduType::H2CData {
            let _ = H2CDataHdr::decode(p).unwrap();
        }
        if l.pdu_type == PduType::CapsuleCmd {
            let _ = Sqe::decode(&p[8..72]).unwrap();
        }
    }
}

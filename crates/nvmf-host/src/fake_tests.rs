//! The queue against a scripted fake target: the failures and PDU shapes a
//! well-behaved target never produces.

use std::net::SocketAddr;
use std::time::Duration;

use blockdev::AlignedBuf;
use nvme_wire::cqe::Cqe;
use nvme_wire::digest::{crc32c, data_digest};
use nvme_wire::pdu::{
    C2HDataHdr, CommonHeader, DigestMode, FLAG_DDGSTF, FLAG_HDGSTF, FLAG_LAST_PDU, H2CDataHdr,
    ICResp, PDU_HDR_MAX, PduType, R2THdr, TermReq, encode_capsule_resp,
};
use nvme_wire::sqe::{Sqe, io_opc};
use nvme_wire::status::Status;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::error::HostError;
use crate::queue::{Queue, buf_from, zeroed_buf};
use crate::slot::{DataDir, QueueParams};

async fn read_pdu(s: &mut TcpStream) -> Option<(CommonHeader, Vec<u8>)> {
    let mut ch = [0u8; 8];
    s.read_exact(&mut ch).await.ok()?;
    let h = CommonHeader::decode(&ch).unwrap();
    let mut pdu = vec![0u8; h.plen as usize];
    pdu[..8].copy_from_slice(&ch);
    s.read_exact(&mut pdu[8..]).await.ok()?;
    Some((h, pdu))
}

/// Accepts one connection and answers the ICReq with `icresp`; the script does the rest.
async fn fake<F, Fut>(icresp: ICResp, script: F) -> SocketAddr
where
    F: FnOnce(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let (h, _) = read_pdu(&mut s).await.unwrap();
        assert_eq!(h.pdu_type, PduType::ICReq as u8);
        s.write_all(&icresp.encode()).await.unwrap();
        script(s).await;
    });
    addr
}

fn icresp(dgst: u8, maxh2cdata: u32) -> ICResp {
    ICResp {
        pfv: 0,
        cpda: 0,
        dgst,
        maxh2cdata,
    }
}

fn params(addr: SocketAddr, hd: bool, dd: bool) -> QueueParams {
    QueueParams {
        addr,
        qid: 1,
        depth: 4,
        hdr_digest: hd,
        data_digest: dd,
        timeout: Duration::from_secs(5),
        icd_limit: 0,
        poll: Duration::ZERO,
        pdu_per_write: false,
        tls: None,
    }
}

fn capsule_resp(cid: u16, hd: bool) -> Vec<u8> {
    let cqe = Cqe {
        dw0: 0,
        dw1: 0,
        sqhd: 0,
        sqid: 1,
        cid,
        status: Status::SUCCESS,
    }
    .encode();
    let mut b = [0u8; PDU_HDR_MAX];
    let dm = DigestMode {
        header: hd,
        data: false,
    };
    let n = encode_capsule_resp(&cqe, dm, &mut b);
    b[..n].to_vec()
}

fn read_sqe(nlb_bytes: u32) -> Sqe {
    let mut s = Sqe::new(io_opc::READ, 0);
    s.nsid = 1;
    s.cdw12 = nlb_bytes / 512 - 1;
    s
}

#[tokio::test]
async fn header_digest_error_closes_with_h2c_termreq() {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let addr = fake(icresp(1, 8192), |mut s| async move {
        let (_, cmd) = read_pdu(&mut s).await.unwrap();
        let cid = u16::from_le_bytes([cmd[10], cmd[11]]);
        let mut r = capsule_resp(cid, true);
        r[27] ^= 0xFF;
        s.write_all(&r).await.unwrap();
        let (h, pdu) = read_pdu(&mut s).await.unwrap();
        assert_eq!(h.pdu_type, PduType::H2CTermReq as u8);
        let _ = tx.send(TermReq::decode(&pdu).unwrap());
    })
    .await;
    let q = Queue::connect(params(addr, true, false)).await.unwrap();
    let (_, r) = q
        .execute(
            Sqe::new(io_opc::FLUSH, 0),
            DataDir::None,
            AlignedBuf::empty(),
        )
        .await;
    let e = r.unwrap_err();
    assert!(
        matches!(
            e,
            HostError::HeaderDigest {
                pdu: "CapsuleResp",
                ..
            }
        ),
        "{e}"
    );
    let t = rx.await.unwrap();
    assert_eq!((t.fes, t.fei), (3, 0), "FES 3: header digest error");
    // Later commands fail at once with the same cause.
    let (_, r) = q
        .execute(
            Sqe::new(io_opc::FLUSH, 0),
            DataDir::None,
            AlignedBuf::empty(),
        )
        .await;
    assert!(matches!(r.unwrap_err(), HostError::HeaderDigest { .. }));
}

#[tokio::test]
async fn target_termreq_reports_fes_and_fei() {
    let addr = fake(icresp(0, 8192), |mut s| async move {
        let _ = read_pdu(&mut s).await.unwrap();
        let mut b = [0u8; 152];
        let n = TermReq { fes: 1, fei: 4 }.encode(PduType::C2HTermReq, &[0xAA; 72], &mut b);
        s.write_all(&b[..n]).await.unwrap();
        let _ = read_pdu(&mut s).await;
    })
    .await;
    let q = Queue::connect(params(addr, false, false)).await.unwrap();
    let (_, r) = q
        .execute(
            Sqe::new(io_opc::FLUSH, 0),
            DataDir::None,
            AlignedBuf::empty(),
        )
        .await;
    let e = r.unwrap_err();
    assert!(
        matches!(e, HostError::TermReq { fes: 1, fei: 4, .. }),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("FES 0x1 (invalid PDU header field), FEI 0x4"),
        "{e}"
    );
}

#[tokio::test]
async fn unanswered_command_times_out() {
    let addr = fake(icresp(0, 8192), |mut s| async move {
        while read_pdu(&mut s).await.is_some() {}
    })
    .await;
    let mut p = params(addr, false, false);
    p.timeout = Duration::from_millis(200);
    let q = Queue::connect(p).await.unwrap();
    let (_, r) = q
        .execute(read_sqe(4096), DataDir::ToHost, zeroed_buf(4096))
        .await;
    let e = r.unwrap_err();
    assert!(matches!(e, HostError::Timeout { .. }), "{e}");
    assert!(e.to_string().contains("Read (command id"), "{e}");
}

#[tokio::test]
async fn bad_icresp_is_refused() {
    let addr = fake(icresp(0, 1000), |_| async {}).await;
    let e = Queue::connect(params(addr, false, false))
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("MAXH2CDATA is 1000"), "{e}");
}

#[tokio::test]
async fn read_data_in_pieces_with_padding_and_a_bad_data_digest() {
    let addr = fake(icresp(2, 8192), |mut s| async move {
        for round in 0..2 {
            let (_, cmd) = read_pdu(&mut s).await.unwrap();
            let cid = u16::from_le_bytes([cmd[10], cmd[11]]);
            let data: Vec<u8> = (0..20000u32).map(|i| (i % 251) as u8).collect();
            // Three C2HData PDUs, PDO 32 (8 bytes of padding, more than HPDA 0 asks:
            // built by hand), the last with SUCCESS.
            for (off, len) in [(0usize, 4096usize), (4096, 15000), (19096, 904)] {
                let piece = &data[off..off + len];
                let last = off + len == data.len();
                let mut b = vec![0u8; 32];
                C2HDataHdr {
                    cccid: cid,
                    datao: off as u32,
                    datal: len as u32,
                }
                .encode(
                    &mut b,
                    CommonHeader {
                        pdu_type: PduType::C2HData as u8,
                        flags: FLAG_DDGSTF | if last { FLAG_LAST_PDU | 0x08 } else { 0 },
                        hlen: 24,
                        pdo: 32,
                        plen: (32 + len + 4) as u32,
                    },
                );
                b.extend_from_slice(piece);
                let mut d = data_digest(piece);
                if round == 1 && off == 4096 {
                    d ^= 1;
                }
                b.extend_from_slice(&d.to_le_bytes());
                // Dribble the bytes so that every parser state sees partial input.
                for c in b.chunks(999) {
                    s.write_all(c).await.unwrap();
                    s.flush().await.unwrap();
                }
            }
        }
        let _ = read_pdu(&mut s).await;
    })
    .await;
    let q = Queue::connect(params(addr, false, true)).await.unwrap();
    let want: Vec<u8> = (0..20000u32).map(|i| (i % 251) as u8).collect();
    let (b, r) = q
        .execute(read_sqe(20480), DataDir::ToHost, zeroed_buf(20000))
        .await;
    r.unwrap();
    assert!(b[..] == want[..]);
    let (_, r) = q
        .execute(read_sqe(20480), DataDir::ToHost, zeroed_buf(20000))
        .await;
    let e = r.unwrap_err();
    assert!(matches!(e, HostError::DataDigest { .. }), "{e}");
}

#[tokio::test]
async fn r2t_offsets_and_lengths_are_honoured() {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let addr = fake(icresp(3, 4096), |mut s| async move {
        let (_, cmd) = read_pdu(&mut s).await.unwrap();
        let cid = u16::from_le_bytes([cmd[10], cmd[11]]);
        let mut got = vec![0u8; 20000];
        let mut seen = Vec::new();
        // Two R2Ts: bytes 12000..20000 first, then 0..12000.
        for (r2to, r2tl) in [(12000u32, 8000u32), (0, 12000)] {
            let mut b = [0u8; PDU_HDR_MAX];
            let n = R2THdr {
                cccid: cid,
                ttag: 7,
                r2to,
                r2tl,
            }
            .encode_pdu(DigestMode::from_dgst(3), &mut b);
            s.write_all(&b[..n]).await.unwrap();
            let mut at = r2to;
            while at < r2to + r2tl {
                let (h, pdu) = read_pdu(&mut s).await.unwrap();
                assert_eq!(h.pdu_type, PduType::H2CData as u8);
                assert_eq!(
                    crc32c(&pdu[..24]),
                    u32::from_le_bytes(pdu[24..28].try_into().unwrap())
                );
                let hd = H2CDataHdr::decode(&pdu).unwrap();
                assert_eq!((hd.cccid, hd.ttag, hd.datao), (cid, 7, at));
                let data = &pdu[usize::from(h.pdo)..usize::from(h.pdo) + hd.datal as usize];
                let dd = u32::from_le_bytes(pdu[pdu.len() - 4..].try_into().unwrap());
                assert_eq!(dd, data_digest(data));
                got[at as usize..at as usize + data.len()].copy_from_slice(data);
                seen.push((hd.datao, hd.datal, h.flags & FLAG_LAST_PDU != 0));
                at += hd.datal;
            }
        }
        s.write_all(&capsule_resp(cid, true)).await.unwrap();
        let _ = tx.send((got, seen));
        let _ = read_pdu(&mut s).await;
    })
    .await;
    let q = Queue::connect(params(addr, true, true)).await.unwrap();
    let data: Vec<u8> = (0..20000u32).map(|i| (i * 7 % 253) as u8).collect();
    let mut w = Sqe::new(io_opc::WRITE, 0);
    w.nsid = 1;
    let (_, r) = q.execute(w, DataDir::FromHost, buf_from(&data)).await;
    r.unwrap();
    let (got, seen) = rx.await.unwrap();
    assert!(got == data);
    // At most MAXH2CDATA (4096) per PDU; LAST_PDU ends each R2T's burst.
    assert_eq!(
        seen,
        vec![
            (12000, 4096, false),
            (16096, 3904, true),
            (0, 4096, false),
            (4096, 4096, false),
            (8192, 3808, true)
        ]
    );
}

#[tokio::test]
async fn data_we_send_is_padded_to_cpda() {
    let (tx, rx) = tokio::sync::oneshot::channel();
    // CPDA 7: data starts on a 32-byte boundary; header digests on.
    let mut resp = icresp(1, 4096);
    resp.cpda = 7;
    let addr = fake(resp, |mut s| async move {
        let mut got = Vec::new();
        // In-capsule write: 72 + 4 -> PDO 96.
        let (h, cmd) = read_pdu(&mut s).await.unwrap();
        assert_eq!((h.flags, h.pdo, h.plen), (FLAG_HDGSTF, 96, 96 + 1000));
        assert!(cmd[76..96].iter().all(|&b| b == 0));
        got.push(cmd[96..].to_vec());
        let cid = u16::from_le_bytes([cmd[10], cmd[11]]);
        s.write_all(&capsule_resp(cid, true)).await.unwrap();
        // R2T write: H2CData 24 + 4 -> PDO 32.
        let (_, cmd) = read_pdu(&mut s).await.unwrap();
        let cid = u16::from_le_bytes([cmd[10], cmd[11]]);
        let mut b = [0u8; PDU_HDR_MAX];
        let r2t = R2THdr {
            cccid: cid,
            ttag: 1,
            r2to: 0,
            r2tl: 5000,
        };
        let n = r2t.encode_pdu(DigestMode::from_dgst(1), &mut b);
        s.write_all(&b[..n]).await.unwrap();
        for want in [4096u32, 904] {
            let (h, pdu) = read_pdu(&mut s).await.unwrap();
            assert_eq!(h.pdu_type, PduType::H2CData as u8);
            assert_eq!((h.pdo, h.plen), (32, 32 + want));
            assert!(pdu[28..32].iter().all(|&b| b == 0));
            assert_eq!(H2CDataHdr::decode(&pdu).unwrap().datal, want);
            got.push(pdu[32..].to_vec());
        }
        s.write_all(&capsule_resp(cid, true)).await.unwrap();
        let _ = tx.send(got.concat());
        let _ = read_pdu(&mut s).await;
    })
    .await;
    let mut p = params(addr, true, false);
    p.icd_limit = 1024;
    let q = Queue::connect(p).await.unwrap();
    let data: Vec<u8> = (0..6000u32).map(|i| (i * 13 % 251) as u8).collect();
    let mut w = Sqe::new(io_opc::WRITE, 0);
    w.nsid = 1;
    let (_, r) = q
        .execute(w, DataDir::FromHost, buf_from(&data[..1000]))
        .await;
    r.unwrap();
    let (_, r) = q
        .execute(w, DataDir::FromHost, buf_from(&data[1000..]))
        .await;
    r.unwrap();
    assert!(rx.await.unwrap() == data);
}

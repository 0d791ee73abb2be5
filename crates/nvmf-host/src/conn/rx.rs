//! The receive half of a queue's connection task: reads the socket, parses
//! CapsuleResp, C2HData, R2T and C2HTermReq PDUs out of the receive buffer,
//! and reads large C2HData payloads straight into the command's buffer.
//!
//! A second `impl Conn` block beside the send path in `mod.rs`; the struct
//! and its helpers stay private to `conn`.

use std::io::ErrorKind;

use nvme_wire::cqe::Cqe;
use nvme_wire::digest::{DIGEST_LEN, DataDigest, crc32c};
use nvme_wire::pdu::{
    C2HDataHdr, CH_LEN, CH_OFF_HLEN, CH_OFF_PDO, CH_OFF_PLEN, CH_OFF_TYPE, CommonHeader,
    FLAG_DDGSTF, FLAG_HDGSTF, FLAG_LAST_PDU, FLAG_SUCCESS, Fes, PduType, R2THdr, TERMREQ_HLEN,
    TERMREQ_MAX_DATA, TermReq,
};
use nvme_wire::status::Status;

use crate::error::HostError;
use crate::slot::{DataDir, Response};

use super::{Conn, DIRECT_MIN, DataRx, Fatal, READ_BUDGET, pdu_name};

impl Conn {
    pub(super) fn read_some(&mut self) -> Result<bool, Fatal> {
        let mut progress = false;
        for _ in 0..READ_BUDGET {
            if self.rx_start == self.rx_end {
                self.rx_start = 0;
                self.rx_end = 0;
            }
            let direct = self.rx_data.as_ref().is_some_and(|d| {
                d.skip == 0 && d.left >= DIRECT_MIN && self.rx_start == self.rx_end
            });
            let r = if direct {
                self.read_direct()
            } else {
                if self.rx_end == self.rx.len() {
                    self.rx.copy_within(self.rx_start..self.rx_end, 0);
                    self.rx_end -= self.rx_start;
                    self.rx_start = 0;
                }
                self.stream
                    .try_read(&mut self.rx[self.rx_end..])
                    .inspect(|&n| self.rx_end += n)
            };
            match r {
                Ok(0) => {
                    return Err(HostError::ConnectionLost {
                        addr: self.addr(),
                        msg: "the target closed the connection".into(),
                    }
                    .into());
                }
                Ok(_) => progress = true,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.lost(e)),
            }
            self.parse()?;
        }
        Ok(progress)
    }

    /// Reads payload bytes straight into the command's buffer.
    fn read_direct(&mut self) -> std::io::Result<usize> {
        let d = self
            .rx_data
            .as_mut()
            .expect("direct read has a payload in progress");
        let f = self.table.cmds[usize::from(d.cid)]
            .as_mut()
            .expect("payload for an outstanding command");
        let dst = &mut f.buf[d.off..d.off + d.left];
        let n = self.stream.try_read(dst)?;
        if let Some(dg) = d.digest.as_mut() {
            dg.update(&dst[..n]);
        }
        d.off += n;
        d.left -= n;
        Ok(n)
    }

    /// Handles every whole PDU (and payload piece) in the receive buffer.
    fn parse(&mut self) -> Result<(), Fatal> {
        loop {
            if self.rx_data.is_some() {
                if !self.take_payload() {
                    return Ok(());
                }
                let d = self.rx_data.take().expect("payload complete");
                self.finish_payload(d)?;
                continue;
            }
            let avail = self.rx_end - self.rx_start;
            if avail < CH_LEN {
                return Ok(());
            }
            let head = &self.rx[self.rx_start..self.rx_end];
            let ch = CommonHeader::decode(head).expect("8 bytes");
            let t = match PduType::from_u8(ch.pdu_type) {
                Some(
                    t @ (PduType::CapsuleResp
                    | PduType::C2HData
                    | PduType::R2T
                    | PduType::C2HTermReq),
                ) => t,
                _ => {
                    let msg = format!(
                        "unexpected PDU type {:#04x} (a target sends CapsuleResp, C2HData, R2T or C2HTermReq)",
                        ch.pdu_type
                    );
                    return Err(self.protocol(
                        msg,
                        Fes::InvalidHeaderField,
                        CH_OFF_TYPE,
                        &head[..CH_LEN],
                    ));
                }
            };
            let hlen = t.hlen();
            if usize::from(ch.hlen) != hlen {
                let msg = format!("{t:?} PDU with HLEN {}, expected {hlen}", ch.hlen);
                return Err(self.protocol(
                    msg,
                    Fes::InvalidHeaderField,
                    CH_OFF_HLEN,
                    &head[..CH_LEN],
                ));
            }
            let (need, hd) = if t == PduType::C2HTermReq {
                let plen = ch.plen as usize;
                if !(TERMREQ_HLEN..=TERMREQ_HLEN + TERMREQ_MAX_DATA).contains(&plen) {
                    let msg = format!("C2HTermReq with PLEN {plen}");
                    return Err(self.protocol(
                        msg,
                        Fes::InvalidHeaderField,
                        CH_OFF_PLEN,
                        &head[..CH_LEN],
                    ));
                }
                (plen, 0)
            } else {
                if (ch.flags & FLAG_HDGSTF != 0) != self.sh.neg.hdgst {
                    let msg = format!(
                        "{t:?} PDU header digest flag is {}, but header digests are {}",
                        ch.flags & FLAG_HDGSTF != 0,
                        if self.sh.neg.hdgst { "on" } else { "off" }
                    );
                    return Err(self.protocol(msg, Fes::InvalidHeaderField, 1, &head[..CH_LEN]));
                }
                let hd = if self.sh.neg.hdgst { DIGEST_LEN } else { 0 };
                (hlen + hd, hd)
            };
            if avail < need {
                return Ok(());
            }
            let mut hdr = [0u8; TERMREQ_HLEN + TERMREQ_MAX_DATA];
            hdr[..need].copy_from_slice(&head[..need]);
            let hdr = &hdr[..need];
            self.rx_start += need;
            if hd > 0 {
                let computed = crc32c(&hdr[..hlen]);
                let received = u32::from_le_bytes(hdr[hlen..hlen + 4].try_into().expect("4 bytes"));
                if computed != received {
                    return Err(Fatal {
                        err: HostError::HeaderDigest {
                            addr: self.addr(),
                            pdu: pdu_name(t),
                            computed,
                            received,
                        },
                        term: Some((Fes::HeaderDigestError, 0, hdr[..hlen].to_vec())),
                    });
                }
            }
            match t {
                PduType::C2HTermReq => {
                    let tr = TermReq::decode(hdr).expect("24 bytes");
                    return Err(HostError::TermReq {
                        addr: self.addr(),
                        fes: tr.fes,
                        fei: tr.fei,
                    }
                    .into());
                }
                PduType::CapsuleResp | PduType::R2T if ch.plen as usize != need => {
                    let msg = format!("{t:?} PDU with PLEN {}, expected {need}", ch.plen);
                    return Err(self.protocol(msg, Fes::InvalidHeaderField, CH_OFF_PLEN, hdr));
                }
                PduType::CapsuleResp => {
                    let cqe = Cqe::decode(&hdr[CH_LEN..]).expect("16 bytes");
                    self.on_response(cqe, hdr)?;
                }
                PduType::R2T => {
                    let r = R2THdr::decode(hdr).expect("24 bytes");
                    self.on_r2t(r, hdr)?;
                }
                _ => self.on_c2h_header(&ch, hd, hdr)?,
            }
        }
    }

    fn on_c2h_header(&mut self, ch: &CommonHeader, hd: usize, hdr: &[u8]) -> Result<(), Fatal> {
        let h = C2HDataHdr::decode(hdr).expect("24 bytes");
        let hlen = PduType::C2HData.hlen();
        let datal = h.datal as usize;
        let dd = ch.flags & FLAG_DDGSTF != 0;
        let pdo = usize::from(ch.pdo);
        let tail = if dd { DIGEST_LEN } else { 0 };
        let fail = |s: &Self, msg: String, fes, fei| Err(s.protocol(msg, fes, fei, hdr));
        if dd != self.sh.neg.ddgst {
            let msg = format!(
                "C2HData data digest flag is {dd}, but data digests are {}",
                if self.sh.neg.ddgst { "on" } else { "off" }
            );
            return fail(self, msg, Fes::InvalidHeaderField, 1);
        }
        if datal == 0 || pdo < hlen + hd || pdo > 255 {
            let msg = format!("C2HData with DATAL {datal} and PDO {pdo}");
            return fail(self, msg, Fes::InvalidHeaderField, CH_OFF_PDO);
        }
        if ch.plen as usize != pdo + datal + tail {
            let msg = format!(
                "C2HData PLEN {} does not match PDO {pdo} + DATAL {datal} + digest {tail}",
                ch.plen
            );
            return fail(self, msg, Fes::InvalidHeaderField, CH_OFF_PLEN);
        }
        let success = ch.flags & FLAG_SUCCESS != 0;
        if success && ch.flags & FLAG_LAST_PDU == 0 {
            return fail(
                self,
                "C2HData with SUCCESS but not LAST_PDU".into(),
                Fes::InvalidHeaderField,
                1,
            );
        }
        let Some(f) = self
            .table
            .cmds
            .get(usize::from(h.cccid))
            .and_then(Option::as_ref)
        else {
            let msg = format!(
                "C2HData for command id {}, which is not outstanding",
                h.cccid
            );
            return fail(self, msg, Fes::InvalidHeaderField, 8);
        };
        if f.dir != DataDir::ToHost {
            let msg = format!("C2HData for command id {}, which reads no data", h.cccid);
            return fail(self, msg, Fes::InvalidHeaderField, 8);
        }
        if h.datao as usize != f.received || h.datao as usize + datal > f.buf.len() {
            let msg = format!(
                "C2HData for command id {} carries bytes {}..{} after {} of {} bytes",
                h.cccid,
                h.datao,
                h.datao as usize + datal,
                f.received,
                f.buf.len()
            );
            return fail(self, msg, Fes::DataTransferOutOfRange, 12);
        }
        self.rx_data = Some(DataRx {
            cid: h.cccid,
            skip: pdo - hlen - hd,
            off: h.datao as usize,
            left: datal,
            datal,
            digest: dd.then(DataDigest::new),
            dgst: [0; DIGEST_LEN],
            dgst_left: tail,
            success,
        });
        Ok(())
    }

    /// Moves payload bytes from the receive buffer; true once the payload (and its digest) is complete.
    fn take_payload(&mut self) -> bool {
        let d = self.rx_data.as_mut().expect("payload in progress");
        let mut avail = self.rx_end - self.rx_start;
        let n = d.skip.min(avail);
        d.skip -= n;
        self.rx_start += n;
        avail -= n;
        if d.skip > 0 {
            return false;
        }
        if d.left > 0 {
            let n = d.left.min(avail);
            let f = self.table.cmds[usize::from(d.cid)]
                .as_mut()
                .expect("payload for an outstanding command");
            let src = &self.rx[self.rx_start..self.rx_start + n];
            f.buf[d.off..d.off + n].copy_from_slice(src);
            if let Some(dg) = d.digest.as_mut() {
                dg.update(src);
            }
            d.off += n;
            d.left -= n;
            self.rx_start += n;
            avail -= n;
            if d.left > 0 {
                return false;
            }
        }
        let n = d.dgst_left.min(avail);
        let at = DIGEST_LEN - d.dgst_left;
        d.dgst[at..at + n].copy_from_slice(&self.rx[self.rx_start..self.rx_start + n]);
        d.dgst_left -= n;
        self.rx_start += n;
        d.dgst_left == 0
    }

    fn finish_payload(&mut self, mut d: DataRx) -> Result<(), Fatal> {
        let addr = self.addr();
        let f = self.table.cmds[usize::from(d.cid)]
            .as_mut()
            .expect("payload for an outstanding command");
        f.received += d.datal;
        if let Some(dg) = d.digest.as_mut() {
            let pad = (4 - d.datal % 4) % 4;
            dg.update(&[0u8; 3][..pad]);
            let computed = dg.finish();
            let received = u32::from_le_bytes(d.dgst);
            if computed != received && f.data_error.is_none() {
                tracing::warn!(
                    "{addr}: data digest error on C2HData for command id {}",
                    d.cid
                );
                f.data_error = Some(HostError::DataDigest {
                    addr,
                    cid: d.cid,
                    computed,
                    received,
                });
            }
        }
        if d.success {
            if f.received != f.buf.len() {
                let msg = format!(
                    "C2HData with SUCCESS for command id {} after {} of {} bytes",
                    d.cid,
                    f.received,
                    f.buf.len()
                );
                return Err(self.protocol(msg, Fes::PduSequenceError, 0, &[]));
            }
            let outcome = match f.data_error.take() {
                Some(e) => Err(e),
                None => Ok(Response {
                    status: Status::SUCCESS,
                    dw0: 0,
                    dw1: 0,
                }),
            };
            self.complete(d.cid, outcome);
        }
        Ok(())
    }

    fn on_response(&mut self, cqe: Cqe, hdr: &[u8]) -> Result<(), Fatal> {
        let addr = self.addr();
        let Some(f) = self
            .table
            .cmds
            .get_mut(usize::from(cqe.cid))
            .and_then(Option::as_mut)
        else {
            let msg = format!(
                "CapsuleResp for command id {}, which is not outstanding",
                cqe.cid
            );
            return Err(self.protocol(msg, Fes::InvalidHeaderField, 20, hdr));
        };
        if f.out_refs > 0 || self.rx_data.as_ref().is_some_and(|d| d.cid == cqe.cid) {
            let msg = format!(
                "CapsuleResp for command id {} before its data transfer ended",
                cqe.cid
            );
            return Err(self.protocol(msg, Fes::PduSequenceError, 0, hdr));
        }
        let outcome = if let Some(e) = f.data_error.take() {
            Err(e)
        } else if cqe.status.is_success() && f.dir == DataDir::ToHost && f.received != f.buf.len() {
            Err(HostError::Protocol {
                addr,
                msg: format!(
                    "the target completed command id {} with success after sending {} of {} bytes",
                    cqe.cid,
                    f.received,
                    f.buf.len()
                ),
            })
        } else {
            Ok(Response {
                status: cqe.status,
                dw0: cqe.dw0,
                dw1: cqe.dw1,
            })
        };
        self.complete(cqe.cid, outcome);
        Ok(())
    }
}

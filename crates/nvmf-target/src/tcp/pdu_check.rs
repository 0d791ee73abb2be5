//! Checks a PDU's common header against the connection's negotiated state
//! before any of its body is read: a bad length must never make us wait for
//! (or buffer) bytes that will not come.

use nvme_wire::digest::DIGEST_LEN;
use nvme_wire::pdu::{
    CH_OFF_FLAGS, CH_OFF_HLEN, CH_OFF_PDO, CH_OFF_PLEN, CH_OFF_TYPE, CommonHeader, FLAG_DDGSTF,
    FLAG_HDGSTF, Fes, H2C_OFF_DATAL, PduType, TERMREQ_HLEN, TERMREQ_MAX_DATA,
};

/// A fatal transport error: the TermReq we send before closing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermError {
    pub fes: Fes,
    pub fei: u32,
}

impl TermError {
    pub fn new(fes: Fes, fei: u32) -> Self {
        TermError { fes, fei }
    }
    fn header(fei: u32) -> Self {
        TermError::new(Fes::InvalidHeaderField, fei)
    }
}

/// What the connection has negotiated so far.
#[derive(Debug, Clone, Copy)]
pub struct Negotiated {
    pub ic_done: bool,
    pub hdgst: bool,
    pub ddgst: bool,
    /// Largest in-capsule data we accept on this queue.
    pub max_capsule_data: u32,
    pub maxh2cdata: u32,
}

/// Where a PDU's parts lie once its header passed the checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PduLayout {
    pub pdu_type: PduType,
    pub hlen: usize,
    /// Header digest bytes after the header (0 or 4).
    pub hd: usize,
    pub data_off: usize,
    pub data_len: usize,
    /// Whether a data digest follows the data.
    pub dd: bool,
    pub plen: usize,
}

/// Largest padding between header and data we accept (PDO is one byte).
const MAX_PAD: u32 = 255;

pub fn check_header(ch: &CommonHeader, neg: &Negotiated) -> Result<PduLayout, TermError> {
    let Some(t) = PduType::from_u8(ch.pdu_type) else {
        return Err(TermError::header(CH_OFF_TYPE));
    };
    match t {
        PduType::ICReq | PduType::H2CTermReq | PduType::CapsuleCmd | PduType::H2CData => {}
        // Controller-to-host types never come from a host.
        _ => return Err(TermError::header(CH_OFF_TYPE)),
    }
    if !neg.ic_done && !matches!(t, PduType::ICReq | PduType::H2CTermReq) {
        return Err(TermError::new(Fes::PduSequenceError, CH_OFF_TYPE));
    }
    if neg.ic_done && t == PduType::ICReq {
        return Err(TermError::new(Fes::PduSequenceError, CH_OFF_TYPE));
    }
    let hlen = t.hlen();
    if usize::from(ch.hlen) != hlen {
        return Err(TermError::header(CH_OFF_HLEN));
    }
    let plen = ch.plen;
    let simple = |plen_ok: bool| -> Result<PduLayout, TermError> {
        if !plen_ok {
            return Err(TermError::header(CH_OFF_PLEN));
        }
        Ok(PduLayout {
            pdu_type: t,
            hlen,
            hd: 0,
            data_off: hlen,
            data_len: plen as usize - hlen,
            dd: false,
            plen: plen as usize,
        })
    };
    match t {
        PduType::ICReq => return simple(plen as usize == hlen),
        PduType::H2CTermReq => {
            return simple(
                (TERMREQ_HLEN..=TERMREQ_HLEN + TERMREQ_MAX_DATA).contains(&(plen as usize)),
            );
        }
        _ => {}
    }
    // CapsuleCmd and H2CData: digests as negotiated.
    if (ch.flags & FLAG_HDGSTF != 0) != neg.hdgst {
        return Err(TermError::header(CH_OFF_FLAGS));
    }
    let hd = if neg.hdgst { DIGEST_LEN } else { 0 };
    let limit = if t == PduType::CapsuleCmd {
        neg.max_capsule_data
    } else {
        neg.maxh2cdata
    };
    // An H2CData PDU carrying more than MAXH2CDATA is the host breaking the
    // limit we gave it in ICResp: "Data Transfer Limit Exceeded", pointing at DATAL.
    let too_much = if t == PduType::H2CData {
        TermError::new(Fes::DataTransferLimitExceeded, H2C_OFF_DATAL)
    } else {
        TermError::header(CH_OFF_PLEN)
    };
    let max_plen = (hlen + hd) as u64 + u64::from(MAX_PAD) + u64::from(limit) + DIGEST_LEN as u64;
    if (plen as usize) < hlen + hd {
        return Err(TermError::header(CH_OFF_PLEN));
    }
    if u64::from(plen) > max_plen {
        return Err(too_much);
    }
    let plen = plen as usize;
    if plen == hlen + hd {
        return Ok(PduLayout {
            pdu_type: t,
            hlen,
            hd,
            data_off: plen,
            data_len: 0,
            dd: false,
            plen,
        });
    }
    let pdo = usize::from(ch.pdo);
    if pdo < hlen + hd || pdo > plen {
        return Err(TermError::header(CH_OFF_PDO));
    }
    let dd = ch.flags & FLAG_DDGSTF != 0;
    if dd != neg.ddgst {
        return Err(TermError::header(CH_OFF_FLAGS));
    }
    let tail = if dd { DIGEST_LEN } else { 0 };
    if plen < pdo + tail + 1 {
        return Err(TermError::header(CH_OFF_PLEN));
    }
    let data_len = plen - pdo - tail;
    if data_len > limit as usize {
        return Err(too_much);
    }
    Ok(PduLayout {
        pdu_type: t,
        hlen,
        hd,
        data_off: pdo,
        data_len,
        dd,
        plen,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEG: Negotiated = Negotiated {
        ic_done: true,
        hdgst: false,
        ddgst: false,
        max_capsule_data: 8192,
        maxh2cdata: 65536,
    };

    fn ch(t: u8, flags: u8, hlen: u8, pdo: u8, plen: u32) -> CommonHeader {
        CommonHeader {
            pdu_type: t,
            flags,
            hlen,
            pdo,
            plen,
        }
    }

    fn err(c: CommonHeader, n: &Negotiated) -> (Fes, u32) {
        let e = check_header(&c, n).unwrap_err();
        (e.fes, e.fei)
    }

    #[test]
    fn sequence_rules() {
        let pre = Negotiated {
            ic_done: false,
            ..NEG
        };
        assert!(check_header(&ch(0, 0, 128, 0, 128), &pre).is_ok());
        assert_eq!(err(ch(4, 0, 72, 0, 72), &pre), (Fes::PduSequenceError, 0));
        assert_eq!(err(ch(0, 0, 128, 0, 128), &NEG), (Fes::PduSequenceError, 0));
        assert!(check_header(&ch(2, 0, 24, 0, 24), &pre).is_ok());
    }

    #[test]
    fn header_field_errors_point_at_the_field() {
        assert_eq!(
            err(ch(0x42, 0, 72, 0, 72), &NEG),
            (Fes::InvalidHeaderField, 0)
        );
        assert_eq!(err(ch(5, 0, 24, 0, 24), &NEG), (Fes::InvalidHeaderField, 0));
        assert_eq!(err(ch(4, 0, 71, 0, 72), &NEG), (Fes::InvalidHeaderField, 2));
        assert_eq!(err(ch(4, 0, 72, 0, 60), &NEG), (Fes::InvalidHeaderField, 4));
        assert_eq!(
            err(ch(4, 0, 72, 72, 72 + 9000), &NEG),
            (Fes::InvalidHeaderField, 4)
        );
        assert_eq!(
            err(ch(4, 0, 72, 10, 80), &NEG),
            (Fes::InvalidHeaderField, 3)
        );
        assert_eq!(
            err(ch(4, FLAG_HDGSTF, 72, 0, 76), &NEG),
            (Fes::InvalidHeaderField, 1)
        );
        let pre = Negotiated {
            ic_done: false,
            ..NEG
        };
        assert_eq!(
            err(ch(0, 0, 128, 0, 129), &pre),
            (Fes::InvalidHeaderField, 4)
        );
        assert_eq!(
            err(ch(2, 0, 24, 0, 500), &pre),
            (Fes::InvalidHeaderField, 4)
        );
    }

    #[test]
    fn layouts_with_digests() {
        let n = Negotiated {
            hdgst: true,
            ddgst: true,
            ..NEG
        };
        let l = check_header(&ch(4, FLAG_HDGSTF | FLAG_DDGSTF, 72, 76, 76 + 512 + 4), &n).unwrap();
        assert_eq!((l.hd, l.data_off, l.data_len, l.dd), (4, 76, 512, true));
        let l = check_header(&ch(4, FLAG_HDGSTF, 72, 0, 76), &n).unwrap();
        assert_eq!(l.data_len, 0);
        assert_eq!(
            err(ch(6, FLAG_HDGSTF, 24, 28, 28 + 512), &n),
            (Fes::InvalidHeaderField, 1)
        );
        assert_eq!(
            err(ch(6, FLAG_HDGSTF | FLAG_DDGSTF, 24, 28, 28 + 65536 + 8), &n),
            (Fes::DataTransferLimitExceeded, 16)
        );
        assert_eq!(
            err(ch(6, FLAG_HDGSTF, 24, 28, 0x7fff_ffff), &n),
            (Fes::DataTransferLimitExceeded, 16)
        );
    }
}

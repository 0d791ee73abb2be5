//! R2T tracking: the commands waiting for host data after our R2T, by
//! transfer tag, and the checks every H2CData header must pass against them
//! (a failure is a fatal transport error, answered with a C2HTermReq).

use blockdev::AlignedBuf;
use nvme_wire::pdu::{Fes, H2C_OFF_CCCID, H2C_OFF_DATAL, H2C_OFF_DATAO, H2C_OFF_TTAG, H2CDataHdr};

/// A command waiting for its data after our R2T (its tag is the TTAG).
struct R2tPending {
    cid: u16,
    buf: AlignedBuf,
    received: u32,
    digest_error: bool,
}

/// Pending R2Ts by tag (the core's slot index).
pub(super) struct R2tTable {
    slots: Vec<Option<R2tPending>>,
}

impl R2tTable {
    pub fn new(tags: usize) -> Self {
        R2tTable {
            slots: (0..tags).map(|_| None).collect(),
        }
    }

    /// An R2T went out for command `cid`: its data goes into `buf`.
    pub fn insert(&mut self, tag: u16, cid: u16, buf: AlignedBuf) {
        self.slots[usize::from(tag)] = Some(R2tPending {
            cid,
            buf,
            received: 0,
            digest_error: false,
        });
    }

    /// Checks an H2CData header carrying `data_len` bytes; the error is the
    /// FES and the offending field's offset.
    pub fn check(
        &self,
        h: &H2CDataHdr,
        data_len: usize,
        maxh2cdata: u32,
    ) -> Result<(), (Fes, u32)> {
        match self.slots.get(usize::from(h.ttag)).and_then(Option::as_ref) {
            None => Err((Fes::InvalidHeaderField, H2C_OFF_TTAG)),
            Some(p) if p.cid != h.cccid => Err((Fes::InvalidHeaderField, H2C_OFF_CCCID)),
            Some(_) if h.datal as usize != data_len || h.datal == 0 => {
                Err((Fes::InvalidHeaderField, H2C_OFF_DATAL))
            }
            Some(_) if h.datal > maxh2cdata => Err((Fes::DataTransferLimitExceeded, H2C_OFF_DATAL)),
            Some(p) if h.datao != p.received => Err((Fes::DataTransferOutOfRange, H2C_OFF_DATAO)),
            Some(p) if u64::from(h.datao) + u64::from(h.datal) > p.buf.len() as u64 => {
                Err((Fes::DataTransferOutOfRange, H2C_OFF_DATAL))
            }
            Some(_) => Ok(()),
        }
    }

    /// The buffer of a checked tag, where its data lands.
    pub fn buf_mut(&mut self, tag: u16) -> &mut AlignedBuf {
        &mut self.slots[usize::from(tag)]
            .as_mut()
            .expect("checked R2T")
            .buf
    }

    /// `datal` more bytes of `tag`'s data are in its buffer. Once all are,
    /// returns the buffer and whether every data digest matched.
    pub fn received(
        &mut self,
        tag: u16,
        datal: u32,
        bad_digest: bool,
    ) -> Option<(AlignedBuf, bool)> {
        let slot = &mut self.slots[usize::from(tag)];
        let p = slot.as_mut().expect("pending R2T");
        p.received += datal;
        p.digest_error |= bad_digest;
        if (p.received as usize) < p.buf.len() {
            return None;
        }
        let p = slot.take().expect("pending R2T");
        Some((p.buf, !p.digest_error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(cccid: u16, ttag: u16, datao: u32, datal: u32) -> H2CDataHdr {
        H2CDataHdr {
            cccid,
            ttag,
            datao,
            datal,
        }
    }

    #[test]
    fn h2c_headers_are_checked_against_their_r2t() {
        let mut t = R2tTable::new(4);
        let mut buf = AlignedBuf::new(8192);
        buf.set_len(8192);
        t.insert(2, 77, buf);
        let e = |t: &R2tTable, h: H2CDataHdr, n: usize| t.check(&h, n, 4096).unwrap_err();
        assert_eq!(
            e(&t, hdr(77, 3, 0, 4096), 4096),
            (Fes::InvalidHeaderField, H2C_OFF_TTAG)
        );
        assert_eq!(
            e(&t, hdr(77, 9, 0, 4096), 4096),
            (Fes::InvalidHeaderField, H2C_OFF_TTAG)
        );
        assert_eq!(
            e(&t, hdr(78, 2, 0, 4096), 4096),
            (Fes::InvalidHeaderField, H2C_OFF_CCCID)
        );
        assert_eq!(
            e(&t, hdr(77, 2, 0, 4096), 100),
            (Fes::InvalidHeaderField, H2C_OFF_DATAL)
        );
        assert_eq!(
            e(&t, hdr(77, 2, 0, 8192), 8192),
            (Fes::DataTransferLimitExceeded, H2C_OFF_DATAL)
        );
        assert_eq!(
            e(&t, hdr(77, 2, 4096, 4096), 4096),
            (Fes::DataTransferOutOfRange, H2C_OFF_DATAO)
        );
        assert!(t.check(&hdr(77, 2, 0, 4096), 4096, 4096).is_ok());
        assert!(t.received(2, 4096, false).is_none());
        assert_eq!(
            e(&t, hdr(77, 2, 4096, 4096), 4096 + 4),
            (Fes::InvalidHeaderField, H2C_OFF_DATAL)
        );
        assert!(t.check(&hdr(77, 2, 4096, 4096), 4096, 4096).is_ok());
        let (buf, digest_ok) = t.received(2, 4096, true).unwrap();
        assert_eq!((buf.len(), digest_ok), (8192, false));
        assert_eq!(
            e(&t, hdr(77, 2, 8192, 4096), 4096),
            (Fes::InvalidHeaderField, H2C_OFF_TTAG)
        );
    }
}

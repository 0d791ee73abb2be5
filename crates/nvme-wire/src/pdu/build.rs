//! Whole PDU headers as they go on the wire: common header, type-specific
//! fields, header digest, and the zeroed padding up to PDO. Each encoder
//! writes into the caller's buffer (`PDU_HDR_MAX` bytes always suffice) and
//! returns how many bytes to send before the data. The data and its digest
//! (`crate::digest::data_digest_trailer`) are the caller's to send after.

use super::{
    C2HDataHdr, CAPSULE_CMD_HLEN, CAPSULE_RESP_HLEN, CH_LEN, CommonHeader, FLAG_DDGSTF,
    FLAG_HDGSTF, FLAG_LAST_PDU, FLAG_SUCCESS, H2CDataHdr, PduType, R2THdr,
};
use crate::cqe::CQE_LEN;
use crate::digest::{DIGEST_LEN, crc32c};
use crate::sqe::SQE_LEN;

/// Largest HPDA/CPDA value: 32 dwords (128 bytes) of alignment.
pub const MAX_PDA: u8 = 31;

/// Bytes any encoder here writes at most: a CapsuleCmd header with its
/// digest (76 bytes) padded to a 72-byte alignment (PDA 17) ends at 144.
pub const PDU_HDR_MAX: usize = 144;

/// Which digests the connection negotiated (ICReq/ICResp DGST).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DigestMode {
    pub header: bool,
    pub data: bool,
}

impl DigestMode {
    pub const NONE: DigestMode = DigestMode {
        header: false,
        data: false,
    };

    /// From an ICReq/ICResp DGST byte: bit 0 header digest, bit 1 data digest.
    pub const fn from_dgst(dgst: u8) -> Self {
        DigestMode {
            header: dgst & 1 != 0,
            data: dgst & 2 != 0,
        }
    }

    /// The DGST byte of an ICReq/ICResp.
    pub const fn dgst(self) -> u8 {
        self.header as u8 | (self.data as u8) << 1
    }

    /// Bytes of header digest after each digestable header: 4 or 0.
    pub const fn header_len(self) -> usize {
        if self.header { DIGEST_LEN } else { 0 }
    }

    /// Bytes of data digest after each PDU's data: 4 or 0.
    pub const fn data_len(self) -> usize {
        if self.data { DIGEST_LEN } else { 0 }
    }
}

/// Alignment in bytes that an HPDA/CPDA value asks for: (pda + 1) dwords.
/// Values above `MAX_PDA` are reserved; they count as `MAX_PDA` here (the
/// ICReq/ICResp checks refuse them first).
pub const fn pda_align(pda: u8) -> usize {
    let pda = if pda > MAX_PDA { MAX_PDA } else { pda };
    (pda as usize + 1) * 4
}

/// PDO of a PDU of type `t` that carries data: its header and header digest
/// rounded up to the peer's alignment `pda`. At most `PDU_HDR_MAX`.
pub fn data_pdo(t: PduType, dm: DigestMode, pda: u8) -> usize {
    (t.hlen() + dm.header_len()).next_multiple_of(pda_align(pda))
}

/// The common header of a `t` PDU and where its header (with digest and
/// padding) ends. `data`: the data length and the peer's PDA, if it carries data.
fn layout(
    t: PduType,
    mut flags: u8,
    dm: DigestMode,
    data: Option<(u32, u8)>,
) -> (CommonHeader, usize) {
    let hlen = t.hlen();
    let hd = dm.header_len();
    if dm.header {
        flags |= FLAG_HDGSTF;
    }
    let (pdo, end, plen) = match data {
        Some((len, pda)) => {
            if dm.data {
                flags |= FLAG_DDGSTF;
            }
            let pdo = data_pdo(t, dm, pda);
            (pdo, pdo, pdo as u32 + len + dm.data_len() as u32)
        }
        None => (0, hlen + hd, (hlen + hd) as u32),
    };
    let ch = CommonHeader {
        pdu_type: t as u8,
        flags,
        hlen: hlen as u8,
        pdo: pdo as u8,
        plen,
    };
    (ch, end)
}

/// Appends the header digest (when on) and zeroes the padding up to `end`.
fn seal(out: &mut [u8], hlen: usize, dm: DigestMode, end: usize) -> usize {
    let mut at = hlen;
    if dm.header {
        let d = crc32c(&out[..hlen]);
        out[hlen..hlen + DIGEST_LEN].copy_from_slice(&d.to_le_bytes());
        at += DIGEST_LEN;
    }
    out[at..end].fill(0);
    end
}

/// Writes a CapsuleCmd header around the encoded `sqe` (whose SGL the caller
/// set: an offset data block for in-capsule data). With `icd_len` > 0 the
/// capsule carries that many bytes of in-capsule data at PDO, aligned to the
/// controller's `cpda`, and DDGSTF is set when data digests are on.
/// Returns the bytes to send before the data: HLEN + digest, or PDO.
/// Panics if `out` is shorter than that (`PDU_HDR_MAX` always suffices).
pub fn encode_capsule_cmd(
    sqe: &[u8; SQE_LEN],
    icd_len: u32,
    dm: DigestMode,
    cpda: u8,
    out: &mut [u8],
) -> usize {
    let data = (icd_len > 0).then_some((icd_len, cpda));
    let (ch, end) = layout(PduType::CapsuleCmd, 0, dm, data);
    ch.encode(out);
    out[CH_LEN..CAPSULE_CMD_HLEN].copy_from_slice(sqe);
    seal(out, CAPSULE_CMD_HLEN, dm, end)
}

/// Writes a CapsuleResp PDU around the encoded `cqe`: 24 bytes, 28 with a
/// header digest. Returns the PDU length.
pub fn encode_capsule_resp(cqe: &[u8; CQE_LEN], dm: DigestMode, out: &mut [u8]) -> usize {
    let (ch, end) = layout(PduType::CapsuleResp, 0, dm, None);
    ch.encode(out);
    out[CH_LEN..CAPSULE_RESP_HLEN].copy_from_slice(cqe);
    seal(out, CAPSULE_RESP_HLEN, dm, end)
}

impl R2THdr {
    /// Writes the whole R2T PDU (24 bytes, 28 with a header digest); returns its length.
    pub fn encode_pdu(&self, dm: DigestMode, out: &mut [u8]) -> usize {
        let (ch, end) = layout(PduType::R2T, 0, dm, None);
        self.encode(out, ch);
        seal(out, PduType::R2T.hlen(), dm, end)
    }
}

impl H2CDataHdr {
    /// Writes an H2CData header for `self.datal` bytes at PDO, aligned to
    /// the controller's `cpda`; `last` sets LAST_PDU. Returns PDO.
    pub fn encode_pdu(&self, last: bool, dm: DigestMode, cpda: u8, out: &mut [u8]) -> usize {
        let flags = if last { FLAG_LAST_PDU } else { 0 };
        let (ch, end) = layout(PduType::H2CData, flags, dm, Some((self.datal, cpda)));
        self.encode(out, ch);
        seal(out, PduType::H2CData.hlen(), dm, end)
    }
}

impl C2HDataHdr {
    /// Writes a C2HData header for `self.datal` bytes at PDO, aligned to the
    /// host's `hpda`. `last` sets LAST_PDU; `success` sets SUCCESS and, as
    /// the spec requires with it, LAST_PDU. Returns PDO.
    pub fn encode_pdu(
        &self,
        last: bool,
        success: bool,
        dm: DigestMode,
        hpda: u8,
        out: &mut [u8],
    ) -> usize {
        let mut flags = if last || success { FLAG_LAST_PDU } else { 0 };
        if success {
            flags |= FLAG_SUCCESS;
        }
        let (ch, end) = layout(PduType::C2HData, flags, dm, Some((self.datal, hpda)));
        self.encode(out, ch);
        seal(out, PduType::C2HData.hlen(), dm, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cqe::Cqe;
    use crate::sqe::Sqe;
    use crate::status::Status;

    const MODES: [DigestMode; 4] = [
        DigestMode::NONE,
        DigestMode::from_dgst(1),
        DigestMode::from_dgst(2),
        DigestMode::from_dgst(3),
    ];

    /// Checks what every encoded header shares; returns its common header.
    fn check(
        out: &[u8],
        n: usize,
        t: PduType,
        dm: DigestMode,
        data: Option<(u32, u8)>,
    ) -> CommonHeader {
        let ch = CommonHeader::decode(out).unwrap();
        let hlen = t.hlen();
        let hd = dm.header_len();
        assert_eq!(ch.pdu_type, t as u8);
        assert_eq!(usize::from(ch.hlen), hlen);
        assert_eq!(ch.flags & FLAG_HDGSTF != 0, dm.header);
        if dm.header {
            let got = u32::from_le_bytes(out[hlen..hlen + 4].try_into().unwrap());
            assert_eq!(got, crc32c(&out[..hlen]), "header digest of {t:?}");
        }
        assert!(n <= PDU_HDR_MAX);
        match data {
            Some((len, pda)) => {
                let pdo = usize::from(ch.pdo);
                let align = pda_align(pda);
                assert_eq!(n, pdo, "{t:?} {dm:?} pda {pda}");
                assert_eq!(pdo % align, 0);
                assert!(pdo >= hlen + hd && pdo < hlen + hd + align);
                assert!(
                    out[hlen + hd..pdo].iter().all(|&b| b == 0),
                    "padding zeroed"
                );
                assert_eq!(ch.flags & FLAG_DDGSTF != 0, dm.data);
                assert_eq!(ch.plen as usize, pdo + len as usize + dm.data_len());
            }
            None => {
                assert_eq!((ch.pdo, n), (0, hlen + hd));
                assert_eq!(ch.flags & FLAG_DDGSTF, 0);
                assert_eq!(ch.plen as usize, hlen + hd);
            }
        }
        ch
    }

    #[test]
    fn digest_mode_bits() {
        for d in 0..4u8 {
            assert_eq!(DigestMode::from_dgst(d).dgst(), d);
        }
        assert_eq!(DigestMode::from_dgst(1).header_len(), 4);
        assert_eq!(DigestMode::from_dgst(1).data_len(), 0);
        assert_eq!(DigestMode::default(), DigestMode::NONE);
    }

    #[test]
    fn pdo_alignment_for_every_pda() {
        let mut max = 0;
        for pda in 0..=MAX_PDA {
            for dm in MODES {
                for t in [PduType::CapsuleCmd, PduType::H2CData, PduType::C2HData] {
                    let pdo = data_pdo(t, dm, pda);
                    assert_eq!(pdo % ((usize::from(pda) + 1) * 4), 0);
                    assert!(pdo <= usize::from(u8::MAX));
                    max = max.max(pdo);
                }
            }
        }
        assert_eq!(max, PDU_HDR_MAX, "PDU_HDR_MAX is the largest header");
        assert_eq!(pda_align(200), 128, "reserved values count as 31");
    }

    #[test]
    fn capsule_cmd_round_trips() {
        let mut sqe = Sqe::new(crate::sqe::io_opc::WRITE, 0x1234);
        sqe.nsid = 7;
        sqe.cdw10 = 0xDEAD_BEEF;
        let enc = sqe.encode();
        for dm in MODES {
            for pda in 0..=MAX_PDA {
                for icd in [0u32, 1, 512, 8192] {
                    let mut out = [0xEEu8; PDU_HDR_MAX];
                    let n = encode_capsule_cmd(&enc, icd, dm, pda, &mut out);
                    let data = (icd > 0).then_some((icd, pda));
                    check(&out, n, PduType::CapsuleCmd, dm, data);
                    assert_eq!(Sqe::decode(&out[CH_LEN..CAPSULE_CMD_HLEN]).unwrap(), sqe);
                }
            }
        }
    }

    #[test]
    fn capsule_cmd_known_layouts() {
        let sqe = Sqe::new(0, 1).encode();
        let mut out = [0u8; PDU_HDR_MAX];
        // No data: PDO 0, PLEN = HLEN (+ digest).
        assert_eq!(
            encode_capsule_cmd(&sqe, 0, DigestMode::NONE, 0, &mut out),
            72
        );
        assert_eq!(CommonHeader::decode(&out).unwrap().plen, 72);
        assert_eq!(
            encode_capsule_cmd(&sqe, 0, DigestMode::from_dgst(3), 0, &mut out),
            76
        );
        let ch = CommonHeader::decode(&out).unwrap();
        assert_eq!((ch.flags, ch.pdo, ch.plen), (FLAG_HDGSTF, 0, 76));
        // 4 KiB in-capsule, both digests, CPDA 0: 76 + 4096 + 4.
        assert_eq!(
            encode_capsule_cmd(&sqe, 4096, DigestMode::from_dgst(3), 0, &mut out),
            76
        );
        let ch = CommonHeader::decode(&out).unwrap();
        assert_eq!(
            (ch.flags, ch.pdo, ch.plen),
            (FLAG_HDGSTF | FLAG_DDGSTF, 76, 4176)
        );
        // CPDA 7 (32 bytes): 72 -> 96; CPDA 17 (72 bytes) with header digest: 76 -> 144.
        assert_eq!(
            encode_capsule_cmd(&sqe, 100, DigestMode::NONE, 7, &mut out),
            96
        );
        assert_eq!(CommonHeader::decode(&out).unwrap().plen, 196);
        assert_eq!(
            encode_capsule_cmd(&sqe, 100, DigestMode::from_dgst(1), 17, &mut out),
            144
        );
        assert_eq!(CommonHeader::decode(&out).unwrap().plen, 244);
    }

    #[test]
    fn capsule_resp_round_trips() {
        let cqe = Cqe {
            dw0: 1,
            dw1: 2,
            sqhd: 3,
            sqid: 4,
            cid: 5,
            status: Status::SUCCESS,
        };
        for dm in MODES {
            let mut out = [0xEEu8; 32];
            let n = encode_capsule_resp(&cqe.encode(), dm, &mut out);
            assert_eq!(n, 24 + dm.header_len());
            check(&out, n, PduType::CapsuleResp, dm, None);
            assert_eq!(Cqe::decode(&out[CH_LEN..n]).unwrap(), cqe);
        }
    }

    #[test]
    fn r2t_round_trips() {
        let r = R2THdr {
            cccid: 9,
            ttag: 3,
            r2to: 4096,
            r2tl: 65536,
        };
        for dm in MODES {
            let mut out = [0xEEu8; 28];
            let n = r.encode_pdu(dm, &mut out);
            check(&out, n, PduType::R2T, dm, None);
            assert_eq!(R2THdr::decode(&out).unwrap(), r);
        }
    }

    #[test]
    fn data_pdus_round_trip() {
        for dm in MODES {
            for pda in 0..=MAX_PDA {
                for last in [false, true] {
                    let h = H2CDataHdr {
                        cccid: 2,
                        ttag: 5,
                        datao: 8192,
                        datal: 3000,
                    };
                    let mut out = [0xEEu8; PDU_HDR_MAX];
                    let n = h.encode_pdu(last, dm, pda, &mut out);
                    let ch = check(&out, n, PduType::H2CData, dm, Some((3000, pda)));
                    assert_eq!(ch.flags & FLAG_LAST_PDU != 0, last);
                    assert_eq!(ch.flags & FLAG_SUCCESS, 0);
                    assert_eq!(H2CDataHdr::decode(&out).unwrap(), h);
                    assert_eq!(out[20..24], [0; 4], "reserved bytes zeroed");

                    for success in [false, true] {
                        let c = C2HDataHdr {
                            cccid: 11,
                            datao: 0,
                            datal: 4096,
                        };
                        let mut out = [0xEEu8; PDU_HDR_MAX];
                        let n = c.encode_pdu(last, success, dm, pda, &mut out);
                        let ch = check(&out, n, PduType::C2HData, dm, Some((4096, pda)));
                        assert_eq!(ch.flags & FLAG_LAST_PDU != 0, last || success);
                        assert_eq!(ch.flags & FLAG_SUCCESS != 0, success);
                        assert_eq!(C2HDataHdr::decode(&out).unwrap(), c);
                        assert_eq!(out[10..12], [0; 2], "reserved TTAG zeroed");
                    }
                }
            }
        }
    }

    #[test]
    fn c2h_known_layout() {
        // HPDA 7 (32 bytes) with a header digest: 28 -> 32; data digest adds 4 after the data.
        let mut out = [0u8; PDU_HDR_MAX];
        let c = C2HDataHdr {
            cccid: 1,
            datao: 0,
            datal: 512,
        };
        assert_eq!(
            c.encode_pdu(true, true, DigestMode::from_dgst(3), 7, &mut out),
            32
        );
        let ch = CommonHeader::decode(&out).unwrap();
        assert_eq!(
            ch.flags,
            FLAG_HDGSTF | FLAG_DDGSTF | FLAG_LAST_PDU | FLAG_SUCCESS
        );
        assert_eq!((ch.pdo, ch.plen), (32, 32 + 512 + 4));
        // No digests, HPDA 0: PDO is HLEN.
        assert_eq!(
            c.encode_pdu(false, false, DigestMode::NONE, 0, &mut out),
            24
        );
        let ch = CommonHeader::decode(&out).unwrap();
        assert_eq!((ch.flags, ch.pdo, ch.plen), (0, 24, 24 + 512));
    }
}

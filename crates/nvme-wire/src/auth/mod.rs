//! In-band authentication (NVMe base spec 8.13, "DH-HMAC-CHAP"): the
//! Authentication Send/Receive commands (Fabrics fctype 05h/06h) and the
//! messages they carry. Layouts follow Linux `include/linux/nvme.h`
//! (`struct nvmf_auth_dhchap_*`). The cryptography is in [`dhchap`].

pub mod dhchap;
mod ffdhe;

use crate::sqe::{FABRICS_OPCODE, Sqe};
use crate::{le16, le32, put16, put32};

/// SECP for DH-HMAC-CHAP (NVME_AUTH_DHCHAP_PROTOCOL_IDENTIFIER).
pub const SECP_DHCHAP: u8 = 0xE9;
/// SPSP0 and SPSP1 must both be 01h.
pub const SPSP: u8 = 0x01;
/// Connect response dword 0 bit 17: the host must authenticate (AUTHREQ.ATR).
pub const CONNECT_AUTHREQ_ATR: u32 = 1 << 17;
/// Connect response dword 0 bit 18: secure channel concatenation (AUTHREQ.ASCR). Not offered.
pub const CONNECT_AUTHREQ_ASCR: u32 = 1 << 18;

/// AUTH_Type: common (Negotiate, Failure1/2) and DH-HMAC-CHAP messages.
pub const TYPE_COMMON: u8 = 0x00;
pub const TYPE_DHCHAP: u8 = 0x01;

/// AUTH_Id values.
pub mod id {
    pub const NEGOTIATE: u8 = 0x00;
    pub const CHALLENGE: u8 = 0x01;
    pub const REPLY: u8 = 0x02;
    pub const SUCCESS1: u8 = 0x03;
    pub const SUCCESS2: u8 = 0x04;
    pub const FAILURE2: u8 = 0xF0;
    pub const FAILURE1: u8 = 0xF1;
}

/// Failure reason code (there is one) and its explanations.
pub const REASON_FAILED: u8 = 0x01;
pub mod explanation {
    pub const FAILED: u8 = 0x01;
    pub const NOT_USABLE: u8 = 0x02;
    pub const CONCAT_MISMATCH: u8 = 0x03;
    pub const HASH_UNUSABLE: u8 = 0x04;
    pub const DHGROUP_UNUSABLE: u8 = 0x05;
    pub const INCORRECT_PAYLOAD: u8 = 0x06;
    /// Linux: NVME_AUTH_DHCHAP_FAILURE_INCORRECT_MESSAGE.
    pub const INCORRECT_MESSAGE: u8 = 0x07;
}

/// Protocol descriptor AUTHID for DH-HMAC-CHAP.
pub const AUTHID_DHCHAP: u8 = 0x01;
/// SC_C: no secure channel concatenation.
pub const SC_C_NONE: u8 = 0x00;
/// Hash and DH group identifier lists in a descriptor hold at most 30 each.
pub const MAX_IDS: usize = 30;

const OFF_TYPE: usize = 0;
const OFF_ID: usize = 1;
const OFF_TID: usize = 4;
pub const NEGOTIATE_HDR_LEN: usize = 8;
pub const DESCRIPTOR_LEN: usize = 64;
pub const CHALLENGE_HDR_LEN: usize = 16;
pub const REPLY_HDR_LEN: usize = 16;
pub const SUCCESS1_HDR_LEN: usize = 16;
pub const SUCCESS2_LEN: usize = 16;
pub const FAILURE_LEN: usize = 8;

/// Authentication Send (fctype 05h) or Receive (06h): SECP, SPSP0/1 and
/// the transfer length (TL for Send, AL for Receive), from CDW10/CDW11.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthCmd {
    pub secp: u8,
    pub spsp0: u8,
    pub spsp1: u8,
    pub len: u32,
}

/// Byte offsets in the SQE, for error reports.
pub const SQE_OFF_SPSP0: u16 = 41;
pub const SQE_OFF_SPSP1: u16 = 42;
pub const SQE_OFF_SECP: u16 = 43;
pub const SQE_OFF_LEN: u16 = 44;

impl AuthCmd {
    pub fn dhchap(len: u32) -> Self {
        AuthCmd {
            secp: SECP_DHCHAP,
            spsp0: SPSP,
            spsp1: SPSP,
            len,
        }
    }
    pub fn from_sqe(s: &Sqe) -> Self {
        AuthCmd {
            spsp0: (s.cdw10 >> 8) as u8,
            spsp1: (s.cdw10 >> 16) as u8,
            secp: (s.cdw10 >> 24) as u8,
            len: s.cdw11,
        }
    }
    pub fn to_sqe(&self, fctype: u8, cid: u16) -> Sqe {
        let mut s = Sqe::new(FABRICS_OPCODE, cid);
        s.nsid = u32::from(fctype);
        s.cdw10 = (u32::from(self.spsp0) << 8)
            | (u32::from(self.spsp1) << 16)
            | (u32::from(self.secp) << 24);
        s.cdw11 = self.len;
        s
    }
    /// The first field that is not DH-HMAC-CHAP's, as an SQE byte offset.
    pub fn bad_field(&self) -> Option<u16> {
        if self.secp != SECP_DHCHAP {
            Some(SQE_OFF_SECP)
        } else if self.spsp0 != SPSP {
            Some(SQE_OFF_SPSP0)
        } else if self.spsp1 != SPSP {
            Some(SQE_OFF_SPSP1)
        } else if self.len == 0 {
            Some(SQE_OFF_LEN)
        } else {
            None
        }
    }
}

/// One AUTH_Protocol descriptor of a Negotiate message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolDesc {
    pub authid: u8,
    pub hash_ids: Vec<u8>,
    pub dh_ids: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiate {
    pub t_id: u16,
    pub sc_c: u8,
    /// NAPD as sent; `protocols` holds the descriptors that fit (at most NAPD).
    pub napd: u8,
    pub protocols: Vec<ProtocolDesc>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub t_id: u16,
    pub hash_id: u8,
    pub dh_group: u8,
    pub seqnum: u32,
    /// C1: HL bytes.
    pub c: Vec<u8>,
    /// The controller's DH public value (empty with the NULL group).
    pub dhv: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub t_id: u16,
    /// CVALID: C2 is a challenge for the controller (bidirectional).
    pub cvalid: bool,
    /// S2: the host's sequence number for the controller's response (0: none).
    pub seqnum: u32,
    /// R1: HL bytes.
    pub response: Vec<u8>,
    /// C2: HL bytes (zero when not valid).
    pub c2: Vec<u8>,
    pub dhv: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Success1 {
    pub t_id: u16,
    pub hl: u8,
    /// R2 when RVALID.
    pub response: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    pub t_id: u16,
    pub rescode: u8,
    pub explanation: u8,
}

/// Every authentication message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthMsg {
    Negotiate(Negotiate),
    Challenge(Challenge),
    Reply(Reply),
    Success1(Success1),
    Success2 {
        t_id: u16,
    },
    /// From the controller.
    Failure1(Failure),
    /// From the host.
    Failure2(Failure),
}

/// Why a message did not decode. The controller answers each with a
/// Failure1 (explanation INCORRECT_PAYLOAD or INCORRECT_MESSAGE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthDecodeError {
    #[error("authentication message of {have} bytes, need {need}")]
    Short { have: usize, need: usize },
    #[error("unknown AUTH_Type {0:#x} / AUTH_Id {1:#x}")]
    UnknownMessage(u8, u8),
    #[error("a negotiate descriptor lists more than 30 identifiers")]
    TooManyIds,
    #[error("HL is zero")]
    ZeroHashLen,
}

fn need(b: &[u8], n: usize) -> Result<(), AuthDecodeError> {
    if b.len() < n {
        Err(AuthDecodeError::Short {
            have: b.len(),
            need: n,
        })
    } else {
        Ok(())
    }
}

impl AuthMsg {
    pub fn t_id(&self) -> u16 {
        match self {
            AuthMsg::Negotiate(m) => m.t_id,
            AuthMsg::Challenge(m) => m.t_id,
            AuthMsg::Reply(m) => m.t_id,
            AuthMsg::Success1(m) => m.t_id,
            AuthMsg::Success2 { t_id } => *t_id,
            AuthMsg::Failure1(m) | AuthMsg::Failure2(m) => m.t_id,
        }
    }

    /// AUTH_Id of the message.
    pub fn auth_id(&self) -> u8 {
        match self {
            AuthMsg::Negotiate(_) => id::NEGOTIATE,
            AuthMsg::Challenge(_) => id::CHALLENGE,
            AuthMsg::Reply(_) => id::REPLY,
            AuthMsg::Success1(_) => id::SUCCESS1,
            AuthMsg::Success2 { .. } => id::SUCCESS2,
            AuthMsg::Failure1(_) => id::FAILURE1,
            AuthMsg::Failure2(_) => id::FAILURE2,
        }
    }

    /// Decodes one message from the start of `b`; bytes past it are
    /// ignored (a Receive buffer is zero-padded to AL).
    pub fn decode(b: &[u8]) -> Result<AuthMsg, AuthDecodeError> {
        need(b, FAILURE_LEN)?;
        let t_id = le16(b, OFF_TID);
        match (b[OFF_TYPE], b[OFF_ID]) {
            (TYPE_COMMON, id::NEGOTIATE) => {
                let napd = b[7];
                let mut protocols = Vec::new();
                for i in 0..usize::from(napd) {
                    let off = NEGOTIATE_HDR_LEN + i * DESCRIPTOR_LEN;
                    need(b, off + DESCRIPTOR_LEN)?;
                    let d = &b[off..off + DESCRIPTOR_LEN];
                    let (halen, dhlen) = (usize::from(d[2]), usize::from(d[3]));
                    if halen > MAX_IDS || dhlen > MAX_IDS {
                        return Err(AuthDecodeError::TooManyIds);
                    }
                    protocols.push(ProtocolDesc {
                        authid: d[0],
                        hash_ids: d[4..4 + halen].to_vec(),
                        dh_ids: d[34..34 + dhlen].to_vec(),
                    });
                }
                Ok(AuthMsg::Negotiate(Negotiate {
                    t_id,
                    sc_c: b[6],
                    napd,
                    protocols,
                }))
            }
            (TYPE_DHCHAP, id::CHALLENGE) => {
                need(b, CHALLENGE_HDR_LEN)?;
                let hl = usize::from(b[6]);
                if hl == 0 {
                    return Err(AuthDecodeError::ZeroHashLen);
                }
                let dhvlen = usize::from(le16(b, 10));
                need(b, CHALLENGE_HDR_LEN + hl + dhvlen)?;
                let c_end = CHALLENGE_HDR_LEN + hl;
                Ok(AuthMsg::Challenge(Challenge {
                    t_id,
                    hash_id: b[8],
                    dh_group: b[9],
                    seqnum: le32(b, 12),
                    c: b[CHALLENGE_HDR_LEN..c_end].to_vec(),
                    dhv: b[c_end..c_end + dhvlen].to_vec(),
                }))
            }
            (TYPE_DHCHAP, id::REPLY) => {
                need(b, REPLY_HDR_LEN)?;
                let hl = usize::from(b[6]);
                if hl == 0 {
                    return Err(AuthDecodeError::ZeroHashLen);
                }
                let dhvlen = usize::from(le16(b, 10));
                need(b, REPLY_HDR_LEN + 2 * hl + dhvlen)?;
                let r = REPLY_HDR_LEN;
                Ok(AuthMsg::Reply(Reply {
                    t_id,
                    cvalid: b[8] & 1 != 0,
                    seqnum: le32(b, 12),
                    response: b[r..r + hl].to_vec(),
                    c2: b[r + hl..r + 2 * hl].to_vec(),
                    dhv: b[r + 2 * hl..r + 2 * hl + dhvlen].to_vec(),
                }))
            }
            (TYPE_DHCHAP, id::SUCCESS1) => {
                need(b, SUCCESS1_HDR_LEN)?;
                let hl = b[6];
                let response = if b[8] & 1 != 0 {
                    if hl == 0 {
                        return Err(AuthDecodeError::ZeroHashLen);
                    }
                    let end = SUCCESS1_HDR_LEN + usize::from(hl);
                    need(b, end)?;
                    Some(b[SUCCESS1_HDR_LEN..end].to_vec())
                } else {
                    None
                };
                Ok(AuthMsg::Success1(Success1 { t_id, hl, response }))
            }
            (TYPE_DHCHAP, id::SUCCESS2) => {
                need(b, SUCCESS2_LEN)?;
                Ok(AuthMsg::Success2 { t_id })
            }
            (TYPE_COMMON, id::FAILURE1) | (TYPE_COMMON, id::FAILURE2) => {
                let f = Failure {
                    t_id,
                    rescode: b[6],
                    explanation: b[7],
                };
                Ok(if b[OFF_ID] == id::FAILURE1 {
                    AuthMsg::Failure1(f)
                } else {
                    AuthMsg::Failure2(f)
                })
            }
            (t, i) => Err(AuthDecodeError::UnknownMessage(t, i)),
        }
    }

    /// Encodes the message. Vectors longer than their length fields allow
    /// (HL is one byte, DHVLEN two) are the caller's bug and are cut.
    pub fn encode(&self) -> Vec<u8> {
        let hdr = |len: usize, ty: u8, aid: u8, t_id: u16| {
            let mut b = vec![0u8; len];
            b[OFF_TYPE] = ty;
            b[OFF_ID] = aid;
            put16(&mut b, OFF_TID, t_id);
            b
        };
        match self {
            AuthMsg::Negotiate(m) => {
                let mut b = hdr(
                    NEGOTIATE_HDR_LEN + m.protocols.len() * DESCRIPTOR_LEN,
                    TYPE_COMMON,
                    id::NEGOTIATE,
                    m.t_id,
                );
                b[6] = m.sc_c;
                b[7] = m.napd;
                for (i, p) in m.protocols.iter().enumerate() {
                    let d = &mut b[NEGOTIATE_HDR_LEN + i * DESCRIPTOR_LEN..][..DESCRIPTOR_LEN];
                    let (h, g) = (p.hash_ids.len().min(MAX_IDS), p.dh_ids.len().min(MAX_IDS));
                    d[0] = p.authid;
                    d[2] = h as u8;
                    d[3] = g as u8;
                    d[4..4 + h].copy_from_slice(&p.hash_ids[..h]);
                    d[34..34 + g].copy_from_slice(&p.dh_ids[..g]);
                }
                b
            }
            AuthMsg::Challenge(m) => {
                let hl = m.c.len().min(255);
                let dl = m.dhv.len().min(usize::from(u16::MAX));
                let mut b = hdr(
                    CHALLENGE_HDR_LEN + hl + dl,
                    TYPE_DHCHAP,
                    id::CHALLENGE,
                    m.t_id,
                );
                b[6] = hl as u8;
                b[8] = m.hash_id;
                b[9] = m.dh_group;
                put16(&mut b, 10, dl as u16);
                put32(&mut b, 12, m.seqnum);
                b[CHALLENGE_HDR_LEN..CHALLENGE_HDR_LEN + hl].copy_from_slice(&m.c[..hl]);
                b[CHALLENGE_HDR_LEN + hl..].copy_from_slice(&m.dhv[..dl]);
                b
            }
            AuthMsg::Reply(m) => {
                let hl = m.response.len().min(255);
                let dl = m.dhv.len().min(usize::from(u16::MAX));
                let mut b = hdr(REPLY_HDR_LEN + 2 * hl + dl, TYPE_DHCHAP, id::REPLY, m.t_id);
                b[6] = hl as u8;
                b[8] = u8::from(m.cvalid);
                put16(&mut b, 10, dl as u16);
                put32(&mut b, 12, m.seqnum);
                let r = REPLY_HDR_LEN;
                b[r..r + hl].copy_from_slice(&m.response[..hl]);
                let c2 = m.c2.len().min(hl);
                b[r + hl..r + hl + c2].copy_from_slice(&m.c2[..c2]);
                b[r + 2 * hl..].copy_from_slice(&m.dhv[..dl]);
                b
            }
            AuthMsg::Success1(m) => {
                let rl = m.response.as_ref().map_or(0, |r| r.len().min(255));
                let mut b = hdr(SUCCESS1_HDR_LEN + rl, TYPE_DHCHAP, id::SUCCESS1, m.t_id);
                b[6] = m.hl;
                if let Some(r) = &m.response {
                    b[8] = 1;
                    b[SUCCESS1_HDR_LEN..].copy_from_slice(&r[..rl]);
                }
                b
            }
            AuthMsg::Success2 { t_id } => hdr(SUCCESS2_LEN, TYPE_DHCHAP, id::SUCCESS2, *t_id),
            AuthMsg::Failure1(f) | AuthMsg::Failure2(f) => {
                let mut b = hdr(FAILURE_LEN, TYPE_COMMON, self.auth_id(), f.t_id);
                b[6] = f.rescode;
                b[7] = f.explanation;
                b
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabrics::fctype;

    #[test]
    fn auth_cmd_fields_sit_where_nvme_h_puts_them() {
        let s = AuthCmd::dhchap(72).to_sqe(fctype::AUTH_SEND, 5);
        let b = s.encode();
        assert_eq!(b[4], fctype::AUTH_SEND);
        assert_eq!(b[usize::from(SQE_OFF_SPSP0)], 1);
        assert_eq!(b[usize::from(SQE_OFF_SPSP1)], 1);
        assert_eq!(b[usize::from(SQE_OFF_SECP)], 0xE9);
        assert_eq!(le32(&b, usize::from(SQE_OFF_LEN)), 72);
        let back = AuthCmd::from_sqe(&Sqe::decode(&b).unwrap());
        assert_eq!(back, AuthCmd::dhchap(72));
        assert_eq!(back.bad_field(), None);
        assert_eq!(AuthCmd::dhchap(0).bad_field(), Some(SQE_OFF_LEN));
    }

    #[test]
    fn messages_round_trip() {
        let msgs = [
            AuthMsg::Negotiate(Negotiate {
                t_id: 7,
                sc_c: 0,
                napd: 1,
                protocols: vec![ProtocolDesc {
                    authid: AUTHID_DHCHAP,
                    hash_ids: vec![1, 2, 3],
                    dh_ids: vec![0, 1, 2, 3, 4, 5],
                }],
            }),
            AuthMsg::Challenge(Challenge {
                t_id: 7,
                hash_id: 1,
                dh_group: 1,
                seqnum: 0xDEAD_BEEF,
                c: vec![9; 32],
                dhv: vec![3; 256],
            }),
            AuthMsg::Reply(Reply {
                t_id: 7,
                cvalid: true,
                seqnum: 12,
                response: vec![1; 48],
                c2: vec![2; 48],
                dhv: vec![],
            }),
            AuthMsg::Success1(Success1 {
                t_id: 7,
                hl: 64,
                response: Some(vec![4; 64]),
            }),
            AuthMsg::Success1(Success1 {
                t_id: 7,
                hl: 32,
                response: None,
            }),
            AuthMsg::Success2 { t_id: 7 },
            AuthMsg::Failure1(Failure {
                t_id: 7,
                rescode: REASON_FAILED,
                explanation: explanation::FAILED,
            }),
            AuthMsg::Failure2(Failure {
                t_id: 7,
                rescode: REASON_FAILED,
                explanation: explanation::INCORRECT_PAYLOAD,
            }),
        ];
        for m in msgs {
            let mut b = m.encode();
            assert_eq!(AuthMsg::decode(&b).unwrap(), m);
            // Zero padding (a Receive buffer) is ignored.
            b.resize(b.len() + 100, 0);
            assert_eq!(AuthMsg::decode(&b).unwrap(), m);
        }
    }

    #[test]
    fn negotiate_layout_matches_linux() {
        let m = AuthMsg::Negotiate(Negotiate {
            t_id: 0x0102,
            sc_c: 0,
            napd: 1,
            protocols: vec![ProtocolDesc {
                authid: 1,
                hash_ids: vec![1, 2, 3],
                dh_ids: vec![0, 1],
            }],
        })
        .encode();
        assert_eq!(m.len(), 72);
        assert_eq!(&m[..8], &[0, 0, 0, 0, 2, 1, 0, 1]);
        assert_eq!(&m[8..15], &[1, 0, 3, 2, 1, 2, 3]);
        assert_eq!(&m[42..45], &[0, 1, 0]); // DH IDs at descriptor byte 34
    }

    #[test]
    fn truncated_and_garbage_messages_are_errors() {
        for m in [
            AuthMsg::Challenge(Challenge {
                t_id: 1,
                hash_id: 1,
                dh_group: 1,
                seqnum: 1,
                c: vec![1; 32],
                dhv: vec![5; 256],
            }),
            AuthMsg::Reply(Reply {
                t_id: 1,
                cvalid: false,
                seqnum: 0,
                response: vec![1; 32],
                c2: vec![0; 32],
                dhv: vec![5; 256],
            }),
        ] {
            let b = m.encode();
            for n in 0..b.len() {
                assert!(AuthMsg::decode(&b[..n]).is_err(), "{n}");
            }
        }
        assert_eq!(
            AuthMsg::decode(&[9, 9, 0, 0, 0, 0, 0, 0]),
            Err(AuthDecodeError::UnknownMessage(9, 9))
        );
        let mut neg = [0u8; 72];
        neg[7] = 2; // two descriptors, one present
        assert!(matches!(
            AuthMsg::decode(&neg),
            Err(AuthDecodeError::Short { .. })
        ));
        neg[7] = 1;
        neg[8 + 2] = 31;
        assert_eq!(AuthMsg::decode(&neg), Err(AuthDecodeError::TooManyIds));
    }
}

//! DH-HMAC-CHAP, the host's side (NVMe base spec 8.13.5; the shape of
//! Linux `drivers/nvme/host/auth.c`): run on each queue whose Connect
//! response sets AUTHREQ.ATR, before any other command.

use std::net::SocketAddr;

use nvme_wire::auth::dhchap::{
    DhGroup, DhKey, HashId, ResponseCtx, Secret, augmented_challenge, ctrl_response, host_response,
    macs_equal,
};
use nvme_wire::auth::{
    AUTHID_DHCHAP, AuthCmd, AuthMsg, Failure, Negotiate, ProtocolDesc, REASON_FAILED, Reply,
    SC_C_NONE, explanation,
};
use nvme_wire::fabrics::fctype;

use crate::error::{CmdStatus, HostError, Result};
use crate::queue::{Queue, buf_from, zeroed_buf};
use crate::slot::DataDir;

/// The buffer a Receive offers (Linux: CHAP_BUF_SIZE).
const RECV_LEN: u32 = 4096;

/// The host's DH-HMAC-CHAP secrets. `Debug` shows no key.
#[derive(Debug, Clone)]
pub struct DhchapKeys {
    /// This host's secret (`--dhchap-secret`).
    pub host_key: Secret,
    /// The controller's secret: with it the host also authenticates the
    /// controller (bidirectional, `--dhchap-ctrl-secret`).
    pub ctrl_key: Option<Secret>,
    /// Offered hash functions and DH groups, in order.
    pub hashes: Vec<HashId>,
    pub dh_groups: Vec<DhGroup>,
}

impl DhchapKeys {
    /// Offers what Linux offers: SHA-256/384/512, the NULL group and every FFDHE group.
    pub fn new(host_key: Secret, ctrl_key: Option<Secret>) -> Self {
        DhchapKeys {
            host_key,
            ctrl_key,
            hashes: HashId::ALL.to_vec(),
            dh_groups: DhGroup::ALL.to_vec(),
        }
    }
}

fn random(n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).expect("the OS random number generator failed");
    b
}

fn fail(addr: SocketAddr, qid: u16, why: String) -> HostError {
    HostError::Authentication { addr, qid, why }
}

struct Exchange<'a> {
    q: &'a Queue,
    qid: u16,
    t_id: u16,
}

impl Exchange<'_> {
    fn addr(&self) -> SocketAddr {
        self.q.params().addr
    }

    async fn send(&self, msg: &AuthMsg) -> Result<()> {
        let b = msg.encode();
        let sqe = AuthCmd::dhchap(b.len() as u32).to_sqe(fctype::AUTH_SEND, 0);
        let (_, r) = self.q.execute(sqe, DataDir::FromHost, buf_from(&b)).await;
        self.check(r?, "Authentication Send")
    }

    async fn receive(&self) -> Result<AuthMsg> {
        let sqe = AuthCmd::dhchap(RECV_LEN).to_sqe(fctype::AUTH_RECV, 0);
        let (buf, r) = self
            .q
            .execute(sqe, DataDir::ToHost, zeroed_buf(RECV_LEN as usize))
            .await;
        self.check(r?, "Authentication Receive")?;
        let m = AuthMsg::decode(&buf)
            .map_err(|e| fail(self.addr(), self.qid, format!("controller message: {e}")))?;
        if let AuthMsg::Failure1(f) = &m {
            return Err(fail(
                self.addr(),
                self.qid,
                format!(
                    "the controller refused (AUTH_Failure1, explanation {:#x}: {}); check the secret",
                    f.explanation,
                    explain(f.explanation)
                ),
            ));
        }
        if m.t_id() != self.t_id {
            return Err(fail(
                self.addr(),
                self.qid,
                format!("transaction ID {} instead of {}", m.t_id(), self.t_id),
            ));
        }
        Ok(m)
    }

    fn check(&self, r: crate::slot::Response, what: &str) -> Result<()> {
        if r.status.is_success() {
            return Ok(());
        }
        Err(HostError::Status {
            addr: self.addr(),
            what: format!("{what} (queue {})", self.qid),
            status: CmdStatus {
                status: r.status,
                fabrics: true,
            },
        })
    }

    /// Tells the controller why the host gives up (AUTH_Failure2), then fails.
    async fn give_up(&self, explanation: u8, why: String) -> HostError {
        let f = AuthMsg::Failure2(Failure {
            t_id: self.t_id,
            rescode: REASON_FAILED,
            explanation,
        });
        let _ = self.send(&f).await;
        fail(self.addr(), self.qid, why)
    }
}

fn explain(e: u8) -> &'static str {
    match e {
        explanation::FAILED => "authentication failed",
        explanation::NOT_USABLE => "protocol not usable",
        explanation::CONCAT_MISMATCH => "secure channel concatenation mismatch",
        explanation::HASH_UNUSABLE => "no usable hash function",
        explanation::DHGROUP_UNUSABLE => "no usable DH group or a bad DH value",
        explanation::INCORRECT_PAYLOAD => "incorrect payload",
        explanation::INCORRECT_MESSAGE => "incorrect message",
        _ => "unknown",
    }
}

/// Authenticates queue `qid` (one DH-HMAC-CHAP transaction).
pub(crate) async fn authenticate(
    q: &Queue,
    qid: u16,
    hostnqn: &str,
    subnqn: &str,
    keys: &DhchapKeys,
) -> Result<()> {
    let t = random(2);
    let x = Exchange {
        q,
        qid,
        t_id: u16::from_le_bytes([t[0], t[1]]),
    };
    x.send(&AuthMsg::Negotiate(Negotiate {
        t_id: x.t_id,
        sc_c: SC_C_NONE,
        napd: 1,
        protocols: vec![ProtocolDesc {
            authid: AUTHID_DHCHAP,
            hash_ids: keys.hashes.iter().map(|h| h.id()).collect(),
            dh_ids: keys.dh_groups.iter().map(|g| g.id()).collect(),
        }],
    }))
    .await?;
    let AuthMsg::Challenge(c) = x.receive().await? else {
        return Err(x
            .give_up(
                explanation::INCORRECT_MESSAGE,
                "expected a Challenge".into(),
            )
            .await);
    };
    let hash = HashId::from_id(c.hash_id).filter(|h| keys.hashes.contains(h));
    let Some(hash) = hash else {
        let why = format!("the controller chose hash {:#x}, not offered", c.hash_id);
        return Err(x.give_up(explanation::HASH_UNUSABLE, why).await);
    };
    let group = DhGroup::from_id(c.dh_group).filter(|g| keys.dh_groups.contains(g));
    let Some(group) = group else {
        let why = format!(
            "the controller chose DH group {:#x}, not offered",
            c.dh_group
        );
        return Err(x.give_up(explanation::DHGROUP_UNUSABLE, why).await);
    };
    if c.c.len() != hash.len() {
        let why = format!("challenge of {} bytes for {}", c.c.len(), hash.name());
        return Err(x.give_up(explanation::INCORRECT_PAYLOAD, why).await);
    }
    let (dhv, shared) = if group == DhGroup::Null {
        if !c.dhv.is_empty() {
            let why = "DH value with the NULL group".to_string();
            return Err(x.give_up(explanation::INCORRECT_PAYLOAD, why).await);
        }
        (Vec::new(), None)
    } else {
        let k = DhKey::new(group, &random(group.private_len())).expect("not the NULL group");
        match k.shared_secret(&c.dhv) {
            Ok(s) => (k.public.clone(), Some(s)),
            Err(e) => {
                let why = format!("controller DH value: {e}");
                return Err(x.give_up(explanation::DHGROUP_UNUSABLE, why).await);
            }
        }
    };
    let augment = |ch: &[u8]| match &shared {
        Some(s) => augmented_challenge(hash, s, ch),
        None => ch.to_vec(),
    };
    let response = host_response(
        hash,
        &keys.host_key.transformed(hostnqn),
        &augment(&c.c),
        ResponseCtx {
            seqnum: c.seqnum,
            t_id: x.t_id,
            hostnqn,
            subnqn,
        },
    );
    let (c2, s2) = match &keys.ctrl_key {
        Some(_) => {
            let s = random(4);
            (
                random(hash.len()),
                u32::from_le_bytes([s[0], s[1], s[2], s[3]]).max(1),
            )
        }
        None => (vec![0; hash.len()], 0),
    };
    x.send(&AuthMsg::Reply(Reply {
        t_id: x.t_id,
        cvalid: keys.ctrl_key.is_some(),
        seqnum: s2,
        response,
        c2: c2.clone(),
        dhv,
    }))
    .await?;
    let AuthMsg::Success1(s1) = x.receive().await? else {
        return Err(x
            .give_up(explanation::INCORRECT_MESSAGE, "expected Success1".into())
            .await);
    };
    let Some(ctrl_key) = &keys.ctrl_key else {
        return Ok(());
    };
    let want = ctrl_response(
        hash,
        &ctrl_key.transformed(subnqn),
        &augment(&c2),
        ResponseCtx {
            seqnum: s2,
            t_id: x.t_id,
            hostnqn,
            subnqn,
        },
    );
    if !s1.response.as_deref().is_some_and(|r| macs_equal(r, &want)) {
        let why = "the controller's response is wrong: it does not know the controller secret"
            .to_string();
        return Err(x.give_up(explanation::FAILED, why).await);
    }
    x.send(&AuthMsg::Success2 { t_id: x.t_id }).await
}

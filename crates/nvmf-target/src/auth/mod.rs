//! DH-HMAC-CHAP, the controller's side (NVMe base spec 8.13.5; the shape
//! of Linux `drivers/nvme/target/fabrics-cmd-auth.c`). One [`AuthSession`]
//! per queue: the host authenticates every queue, the admin queue first.
//! Authentication Send hands it a message; Authentication Receive asks it
//! for the next one. Every fault (a message that does not decode, one out
//! of order, a wrong transaction ID, a bad DH value, a wrong response)
//! ends the transaction: the next Receive returns AUTH_Failure1 and the
//! queue stays unauthenticated, so it runs nothing but Fabrics commands.

#[cfg(test)]
mod tests;

use nvme_wire::auth::dhchap::{
    DhGroup, DhKey, HashId, ResponseCtx, Secret, augmented_challenge, ctrl_response, host_response,
    macs_equal,
};
use nvme_wire::auth::{
    AUTHID_DHCHAP, AuthMsg, Challenge, Failure, REASON_FAILED, SC_C_NONE, Success1, explanation,
};

/// The secrets one host authenticates with on one subsystem, and what the
/// controller offers. `Debug` shows no key.
#[derive(Debug, Clone)]
pub struct HostAuth {
    /// The host's secret: the host proves it knows it.
    pub host_key: Secret,
    /// The controller's secret, for bidirectional authentication.
    pub ctrl_key: Option<Secret>,
    /// Hash functions in the controller's order of preference.
    pub hashes: Vec<HashId>,
    /// DH groups in the controller's order of preference.
    pub dh_groups: Vec<DhGroup>,
}

impl HostAuth {
    pub fn new(host_key: Secret, ctrl_key: Option<Secret>) -> Self {
        HostAuth {
            host_key,
            ctrl_key,
            hashes: HashId::ALL.to_vec(),
            dh_groups: vec![
                DhGroup::Ffdhe2048,
                DhGroup::Ffdhe3072,
                DhGroup::Ffdhe4096,
                DhGroup::Ffdhe6144,
                DhGroup::Ffdhe8192,
                DhGroup::Null,
            ],
        }
    }
}

/// Random bytes for challenges, sequence numbers and DH exponents.
pub type Rng = fn(&mut [u8]);

/// The operating system's generator.
pub fn os_rng(b: &mut [u8]) {
    getrandom::fill(b).expect("the OS random number generator failed");
}

/// Where the transaction is: what the controller waits for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Waiting for AUTH_Negotiate (Send).
    Negotiate,
    /// The next Receive returns the Challenge.
    Challenge,
    /// Waiting for the Reply (Send).
    Reply,
    /// The next Receive returns Success1.
    Success1,
    /// Waiting for Success2 or Failure2 (Send).
    Success2,
    /// The next Receive returns Failure1.
    Failure1,
}

/// What a Send or Receive did to the queue, for the caller's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Nothing,
    /// The host proved its secret (and, bidirectionally, accepted ours).
    Authenticated,
    /// The transaction failed; `explanation` is the Failure reason code
    /// explanation (Failure1 sent, or Failure2 received).
    Failed {
        explanation: u8,
        why: &'static str,
    },
}

/// A Receive asked for less than the message takes (AL too small).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooShort;

pub struct AuthSession {
    auth: std::sync::Arc<HostAuth>,
    hostnqn: String,
    subnqn: String,
    rng: Rng,
    step: Step,
    authenticated: bool,
    t_id: u16,
    hash: HashId,
    group: DhGroup,
    c1: Vec<u8>,
    s1: u32,
    dh: Option<DhKey>,
    shared: Vec<u8>,
    c2: Option<Vec<u8>>,
    s2: u32,
    failure: u8,
    why: &'static str,
}

impl AuthSession {
    pub fn new(auth: std::sync::Arc<HostAuth>, hostnqn: &str, subnqn: &str, rng: Rng) -> Self {
        AuthSession {
            auth,
            hostnqn: hostnqn.to_string(),
            subnqn: subnqn.to_string(),
            rng,
            step: Step::Negotiate,
            authenticated: false,
            t_id: 0,
            hash: HashId::Sha256,
            group: DhGroup::Null,
            c1: Vec::new(),
            s1: 0,
            dh: None,
            shared: Vec::new(),
            c2: None,
            s2: 0,
            failure: 0,
            why: "",
        }
    }

    /// Whether the queue may run commands other than Fabrics ones.
    pub fn authenticated(&self) -> bool {
        self.authenticated
    }

    pub fn step(&self) -> Step {
        self.step
    }

    fn fail(&mut self, explanation: u8, why: &'static str) -> Event {
        self.step = Step::Failure1;
        self.failure = explanation;
        self.why = why;
        self.authenticated = false;
        self.forget();
        Event::Failed { explanation, why }
    }

    /// Drops the transaction's secrets.
    fn forget(&mut self) {
        self.c1.clear();
        self.dh = None;
        self.shared.clear();
        self.c2 = None;
    }

    /// Authentication Send: the host's message (TL bytes).
    pub fn on_send(&mut self, data: &[u8]) -> Event {
        let msg = match AuthMsg::decode(data) {
            Ok(m) => m,
            Err(_) => {
                return self.fail(
                    explanation::INCORRECT_PAYLOAD,
                    "message does not decode (truncated or unknown type)",
                );
            }
        };
        if let AuthMsg::Negotiate(n) = &msg {
            // A Negotiate starts (or restarts) a transaction at any time:
            // that is re-authentication. The queue keeps its standing
            // until this one ends.
            self.forget();
            self.t_id = n.t_id;
            return self.negotiate(n);
        }
        let expected = match self.step {
            Step::Reply => matches!(msg, AuthMsg::Reply(_)),
            Step::Success2 => matches!(msg, AuthMsg::Success2 { .. } | AuthMsg::Failure2(_)),
            _ => false,
        };
        if !expected {
            return self.fail(explanation::INCORRECT_MESSAGE, "message out of order");
        }
        if msg.t_id() != self.t_id {
            return self.fail(explanation::INCORRECT_PAYLOAD, "wrong transaction ID");
        }
        match msg {
            AuthMsg::Reply(r) => self.reply(&r),
            AuthMsg::Success2 { .. } => {
                self.step = Step::Negotiate;
                self.authenticated = true;
                self.forget();
                Event::Authenticated
            }
            AuthMsg::Failure2(f) => {
                // The host did not accept the controller's response.
                self.step = Step::Negotiate;
                self.authenticated = false;
                self.forget();
                Event::Failed {
                    explanation: f.explanation,
                    why: "the host refused the controller's response (Failure2)",
                }
            }
            _ => unreachable!("checked above"),
        }
    }

    fn negotiate(&mut self, n: &nvme_wire::auth::Negotiate) -> Event {
        if n.sc_c != SC_C_NONE {
            return self.fail(
                explanation::CONCAT_MISMATCH,
                "secure channel concatenation requested (not supported)",
            );
        }
        if n.napd != 1 || n.protocols.len() != 1 {
            return self.fail(
                explanation::HASH_UNUSABLE,
                "NAPD is not 1 (one DH-HMAC-CHAP descriptor)",
            );
        }
        let d = &n.protocols[0];
        if d.authid != AUTHID_DHCHAP {
            return self.fail(explanation::INCORRECT_PAYLOAD, "AUTHID is not DH-HMAC-CHAP");
        }
        let Some(hash) = (self.auth.hashes.iter()).find(|h| d.hash_ids.contains(&h.id())) else {
            return self.fail(explanation::HASH_UNUSABLE, "no hash function in common");
        };
        let Some(group) = (self.auth.dh_groups.iter()).find(|g| d.dh_ids.contains(&g.id())) else {
            return self.fail(explanation::DHGROUP_UNUSABLE, "no DH group in common");
        };
        self.hash = *hash;
        self.group = *group;
        self.step = Step::Challenge;
        Event::Nothing
    }

    fn reply(&mut self, r: &nvme_wire::auth::Reply) -> Event {
        let hl = self.hash.len();
        if r.response.len() != hl {
            return self.fail(
                explanation::INCORRECT_PAYLOAD,
                "HL is not the hash's length",
            );
        }
        let challenge = if self.group == DhGroup::Null {
            if !r.dhv.is_empty() {
                return self.fail(
                    explanation::INCORRECT_PAYLOAD,
                    "DH value sent with the NULL group",
                );
            }
            self.c1.clone()
        } else {
            let Some(dh) = &self.dh else {
                return self.fail(explanation::FAILED, "no DH key");
            };
            match dh.shared_secret(&r.dhv) {
                Ok(s) => self.shared = s,
                Err(_) => {
                    return self.fail(
                        explanation::DHGROUP_UNUSABLE,
                        "host DH value of the wrong length, zero, one or p-1",
                    );
                }
            }
            augmented_challenge(self.hash, &self.shared, &self.c1)
        };
        let key = self.auth.host_key.transformed(&self.hostnqn);
        let want = host_response(
            self.hash,
            &key,
            &challenge,
            ResponseCtx {
                seqnum: self.s1,
                t_id: self.t_id,
                hostnqn: &self.hostnqn,
                subnqn: &self.subnqn,
            },
        );
        if !macs_equal(&want, &r.response) {
            return self.fail(
                explanation::FAILED,
                "host response mismatch (wrong secret?)",
            );
        }
        self.s2 = r.seqnum;
        if r.cvalid && r.seqnum != 0 {
            if self.auth.ctrl_key.is_none() {
                return self.fail(
                    explanation::FAILED,
                    "host asks for bidirectional authentication; no controller secret is set",
                );
            }
            self.c2 = Some(r.c2.clone());
        } else {
            self.authenticated = true;
        }
        self.step = Step::Success1;
        Event::Nothing
    }

    /// Authentication Receive: the controller's next message. `al` is the
    /// host's buffer; the message must fit in it.
    pub fn on_receive(&mut self, al: usize) -> Result<(Vec<u8>, Event), TooShort> {
        match self.step {
            Step::Challenge => {
                let need =
                    nvme_wire::auth::CHALLENGE_HDR_LEN + self.hash.len() + self.group.value_len();
                if al < need {
                    return Err(TooShort);
                }
                let mut c1 = vec![0u8; self.hash.len()];
                (self.rng)(&mut c1);
                let mut s = [0u8; 4];
                (self.rng)(&mut s);
                // A zero sequence number is reserved (it means "none" in a Reply).
                self.s1 = u32::from_le_bytes(s).max(1);
                self.dh = if self.group == DhGroup::Null {
                    None
                } else {
                    let mut x = vec![0u8; self.group.private_len()];
                    (self.rng)(&mut x);
                    DhKey::new(self.group, &x)
                };
                self.c1 = c1.clone();
                let msg = AuthMsg::Challenge(Challenge {
                    t_id: self.t_id,
                    hash_id: self.hash.id(),
                    dh_group: self.group.id(),
                    seqnum: self.s1,
                    c: c1,
                    dhv: self
                        .dh
                        .as_ref()
                        .map(|k| k.public.clone())
                        .unwrap_or_default(),
                });
                self.step = Step::Reply;
                Ok((msg.encode(), Event::Nothing))
            }
            Step::Success1 => {
                let need = nvme_wire::auth::SUCCESS1_HDR_LEN
                    + if self.c2.is_some() {
                        self.hash.len()
                    } else {
                        0
                    };
                if al < need {
                    return Err(TooShort);
                }
                let response = match (&self.c2, &self.auth.ctrl_key) {
                    (Some(c2), Some(k)) => {
                        let challenge = if self.group == DhGroup::Null {
                            c2.clone()
                        } else {
                            augmented_challenge(self.hash, &self.shared, c2)
                        };
                        Some(ctrl_response(
                            self.hash,
                            &k.transformed(&self.subnqn),
                            &challenge,
                            ResponseCtx {
                                seqnum: self.s2,
                                t_id: self.t_id,
                                hostnqn: &self.hostnqn,
                                subnqn: &self.subnqn,
                            },
                        ))
                    }
                    _ => None,
                };
                let msg = AuthMsg::Success1(Success1 {
                    t_id: self.t_id,
                    hl: self.hash.len() as u8,
                    response: response.clone(),
                });
                let ev = if response.is_some() {
                    self.step = Step::Success2;
                    Event::Nothing
                } else {
                    self.step = Step::Negotiate;
                    self.forget();
                    Event::Authenticated
                };
                Ok((msg.encode(), ev))
            }
            Step::Failure1 | Step::Negotiate | Step::Reply | Step::Success2 => {
                if al < nvme_wire::auth::FAILURE_LEN {
                    return Err(TooShort);
                }
                // Failures found on a Send were reported then.
                let ev = if self.step == Step::Failure1 {
                    Event::Nothing
                } else {
                    // A Receive where the host should have sent: out of order.
                    self.fail(explanation::INCORRECT_MESSAGE, "receive out of order")
                };
                let msg = AuthMsg::Failure1(Failure {
                    t_id: self.t_id,
                    rescode: REASON_FAILED,
                    explanation: self.failure,
                });
                self.step = Step::Negotiate;
                self.authenticated = false;
                Ok((msg.encode(), ev))
            }
        }
    }
}

//! DH-HMAC-CHAP over raw TCP: commands before authentication, and bad
//! authentication messages (truncated, oversized, wrong T_ID, replayed,
//! out of order, bad DH values). Each ends in AUTH_Failure1 (or a refused
//! command), never in access, and the target serves other hosts throughout.

use fault_tests::*;
use nvme_wire::auth::dhchap::{
    DhGroup, DhKey, HashId, ResponseCtx, augmented_challenge, host_response,
};
use nvme_wire::auth::{
    AUTHID_DHCHAP, AuthCmd, AuthMsg, CONNECT_AUTHREQ_ATR, Challenge, Negotiate, ProtocolDesc,
    Reply, explanation,
};
use nvme_wire::fabrics::{fctype, prop};
use nvme_wire::identify::{IDENTIFY_LEN, cns};
use nvme_wire::sqe::{Sqe, admin_opc};
use nvme_wire::status::{SC_AUTH_REQUIRED, SCT_CMD_SPECIFIC};

fn connect(t: &TestTarget) -> Host {
    let mut h = t.host_ic(false);
    let c = h.connect_admin(NQN_AUTH, HOST_NQN, 0);
    assert_status(&c, 0, 0, "Connect to the auth subsystem");
    assert_ne!(c.dw0 & CONNECT_AUTHREQ_ATR, 0, "AUTHREQ.ATR set");
    h
}

fn identify_status(h: &mut Host) -> (u8, u8) {
    let cid = h.next_cid();
    let mut s = Sqe::new(admin_opc::IDENTIFY, cid);
    s.cdw10 = u32::from(cns::CONTROLLER);
    let (c, _) = h.data_in(s, IDENTIFY_LEN as u32);
    (c.status.sct, c.status.sc)
}

fn send(h: &mut Host, msg: &[u8]) {
    let cid = h.next_cid();
    let sqe = AuthCmd::dhchap(msg.len() as u32).to_sqe(fctype::AUTH_SEND, cid);
    let c = h.data_out(sqe, msg, true);
    assert_status(&c, 0, 0, "Authentication Send");
}

fn receive(h: &mut Host) -> AuthMsg {
    let cid = h.next_cid();
    let sqe = AuthCmd::dhchap(4096).to_sqe(fctype::AUTH_RECV, cid);
    let (c, b) = h.data_in(sqe, 4096);
    assert_status(&c, 0, 0, "Authentication Receive");
    AuthMsg::decode(&b).expect("the controller's message decodes")
}

fn negotiate(t_id: u16) -> Vec<u8> {
    AuthMsg::Negotiate(Negotiate {
        t_id,
        sc_c: 0,
        napd: 1,
        protocols: vec![ProtocolDesc {
            authid: AUTHID_DHCHAP,
            hash_ids: vec![1],
            dh_ids: vec![1],
        }],
    })
    .encode()
}

fn challenge(h: &mut Host, t_id: u16) -> Challenge {
    send(h, &negotiate(t_id));
    match receive(h) {
        AuthMsg::Challenge(c) => c,
        m => panic!("expected a Challenge, got {m:?}"),
    }
}

fn good_reply(c: &Challenge) -> Reply {
    let k = DhKey::new(DhGroup::Ffdhe2048, &[0x77; 28]).unwrap();
    let s = k.shared_secret(&c.dhv).unwrap();
    let response = host_response(
        HashId::Sha256,
        &auth_secret().transformed(HOST_NQN),
        &augmented_challenge(HashId::Sha256, &s, &c.c),
        ResponseCtx {
            seqnum: c.seqnum,
            t_id: c.t_id,
            hostnqn: HOST_NQN,
            subnqn: NQN_AUTH,
        },
    );
    Reply {
        t_id: c.t_id,
        cvalid: false,
        seqnum: 0,
        c2: vec![0; 32],
        response,
        dhv: k.public.clone(),
    }
}

fn expect_failure1(h: &mut Host, want: u8, what: &str) {
    match receive(h) {
        AuthMsg::Failure1(f) => assert_eq!(f.explanation, want, "{what}"),
        m => panic!("{what}: expected Failure1, got {m:?}"),
    }
    assert_eq!(
        identify_status(h),
        (SCT_CMD_SPECIFIC, SC_AUTH_REQUIRED),
        "{what}: no access after a failure"
    );
}

#[test]
fn commands_before_authentication_are_refused() {
    let t = TestTarget::start();
    let mut healthy = t.healthy();
    let mut h = connect(&t);
    // Property Get/Set are Fabrics commands: allowed, as nvmet allows them.
    assert_status(&h.property_get(prop::CAP, true), 0, 0, "Property Get CAP");
    assert_eq!(
        identify_status(&mut h),
        (SCT_CMD_SPECIFIC, SC_AUTH_REQUIRED)
    );
    // A good exchange opens the queue.
    let c = challenge(&mut h, 3);
    send(&mut h, &AuthMsg::Reply(good_reply(&c)).encode());
    assert!(matches!(receive(&mut h), AuthMsg::Success1(_)));
    h.enable();
    assert_eq!(identify_status(&mut h), (0, 0));
    healthy.verify();
}

/// Builds the bad message from the challenge.
type MakeReply = Box<dyn Fn(&Challenge) -> Vec<u8>>;

#[test]
fn bad_messages_end_in_failure1() {
    let t = TestTarget::start();
    let mut healthy = t.healthy();
    let cases: Vec<(&str, MakeReply, u8)> = vec![
        (
            "truncated reply",
            Box::new(|c| AuthMsg::Reply(good_reply(c)).encode()[..40].to_vec()),
            explanation::INCORRECT_PAYLOAD,
        ),
        (
            "DHVLEN past the data",
            Box::new(|c| {
                let mut b = AuthMsg::Reply(good_reply(c)).encode();
                b[10..12].copy_from_slice(&4000u16.to_le_bytes());
                b
            }),
            explanation::INCORRECT_PAYLOAD,
        ),
        (
            "wrong transaction ID",
            Box::new(|c| {
                let mut r = good_reply(c);
                r.t_id ^= 1;
                AuthMsg::Reply(r).encode()
            }),
            explanation::INCORRECT_PAYLOAD,
        ),
        (
            "out of order (Success2 for a Reply)",
            Box::new(|c| AuthMsg::Success2 { t_id: c.t_id }.encode()),
            explanation::INCORRECT_MESSAGE,
        ),
        (
            "short DH value",
            Box::new(|c| {
                let mut r = good_reply(c);
                r.dhv.truncate(128);
                AuthMsg::Reply(r).encode()
            }),
            explanation::DHGROUP_UNUSABLE,
        ),
        (
            "zero DH value",
            Box::new(|c| {
                let mut r = good_reply(c);
                r.dhv = vec![0; 256];
                AuthMsg::Reply(r).encode()
            }),
            explanation::DHGROUP_UNUSABLE,
        ),
        (
            "identity DH value",
            Box::new(|c| {
                let mut r = good_reply(c);
                r.dhv = vec![0; 256];
                r.dhv[255] = 1;
                AuthMsg::Reply(r).encode()
            }),
            explanation::DHGROUP_UNUSABLE,
        ),
        (
            "garbage",
            Box::new(|_| vec![0xEE; 300]),
            explanation::INCORRECT_PAYLOAD,
        ),
    ];
    for (what, make, want) in cases {
        let mut h = connect(&t);
        let c = challenge(&mut h, 7);
        send(&mut h, &make(&c));
        expect_failure1(&mut h, want, what);
        healthy.verify();
    }
    // Replayed: a Reply that worked on one connection, sent on another.
    let mut h = connect(&t);
    let c = challenge(&mut h, 9);
    let reply = AuthMsg::Reply(good_reply(&c)).encode();
    send(&mut h, &reply);
    assert!(matches!(receive(&mut h), AuthMsg::Success1(_)));
    let mut h2 = connect(&t);
    challenge(&mut h2, 9);
    send(&mut h2, &reply);
    expect_failure1(&mut h2, explanation::FAILED, "replayed reply");
    // Replayed on the same queue after success: out of order.
    send(&mut h, &reply);
    expect_failure1(&mut h, explanation::INCORRECT_MESSAGE, "reply replayed");
    healthy.verify();
}

#[test]
fn bad_auth_command_fields_are_invalid_field() {
    let t = TestTarget::start();
    let mut h = connect(&t);
    let cid = h.next_cid();
    let mut cmd = AuthCmd::dhchap(72);
    cmd.secp = 0xEA;
    let c = h.data_out(cmd.to_sqe(fctype::AUTH_SEND, cid), &negotiate(1), true);
    assert_eq!((c.status.sct, c.status.sc), (0, 0x02));
    let cid = h.next_cid();
    let sqe = AuthCmd::dhchap(1 << 20).to_sqe(fctype::AUTH_RECV, cid);
    let (c, _) = h.data_in(sqe, 1 << 20);
    assert!(!c.status.is_success(), "oversized AL refused");
    assert_eq!(
        identify_status(&mut h),
        (SCT_CMD_SPECIFIC, SC_AUTH_REQUIRED)
    );
}

/// A host that connects to a subsystem that requires authentication and
/// never finishes it (or stops half-way) does not hold its queue and
/// controller forever: after `auth_timeout_ms` the queue is closed and the
/// controller freed; an authenticated host is not affected.
#[test]
fn a_host_that_never_authenticates_is_closed_after_the_timeout() {
    let t = TestTarget::with(nvmf_target::TransportConfig {
        auth_timeout_ms: 1000,
        ..test_transport()
    });
    let mut idle = connect(&t);
    let mut half = connect(&t);
    send(&mut half, &negotiate(7));
    let _challenge = receive(&mut half);
    assert!(
        idle.quiet_for(std::time::Duration::from_millis(500)),
        "open before the timeout"
    );
    assert_eq!(t.wait_controllers(2, std::time::Duration::from_secs(1)), 2);
    // READ_TIMEOUT (3 s) covers the 1 s deadline
    idle.expect_closed();
    half.expect_closed();
    assert_eq!(t.wait_controllers(0, std::time::Duration::from_secs(2)), 0);
    t.shutdown();
}

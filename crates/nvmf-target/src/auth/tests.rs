//! The controller's state machine driven message by message: a good
//! exchange, then every kind of bad input. Each ends in AUTH_Failure1 and
//! an unauthenticated queue, never a panic.

use std::sync::Arc;

use nvme_wire::auth::dhchap::{
    DhGroup, DhKey, HashId, ResponseCtx, Secret, augmented_challenge, host_response,
};
use nvme_wire::auth::{
    AUTHID_DHCHAP, AuthMsg, Challenge, Negotiate, ProtocolDesc, Reply, explanation,
};

use super::*;

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000001";
const SUB: &str = "nqn.2026-01.io.flashpool:t";

fn counter_rng(b: &mut [u8]) {
    for (i, x) in b.iter_mut().enumerate() {
        *x = (i as u8).wrapping_mul(31).wrapping_add(7);
    }
}

fn key() -> Secret {
    Secret::from_key(Some(HashId::Sha256), &[0x11; 32]).unwrap()
}

fn session(group: DhGroup) -> AuthSession {
    let mut a = HostAuth::new(key(), None);
    a.dh_groups = vec![group];
    AuthSession::new(Arc::new(a), HOST, SUB, counter_rng)
}

fn negotiate(t_id: u16) -> Vec<u8> {
    AuthMsg::Negotiate(Negotiate {
        t_id,
        sc_c: 0,
        napd: 1,
        protocols: vec![ProtocolDesc {
            authid: AUTHID_DHCHAP,
            hash_ids: vec![1, 2, 3],
            dh_ids: vec![0, 1, 2, 3, 4, 5],
        }],
    })
    .encode()
}

fn challenge(s: &mut AuthSession) -> Challenge {
    let (b, _) = s.on_receive(4096).unwrap();
    match AuthMsg::decode(&b).unwrap() {
        AuthMsg::Challenge(c) => c,
        m => panic!("{m:?}"),
    }
}

/// A correct Reply to `c`, with `dhv` when the group needs one.
fn reply(c: &Challenge, secret: &Secret) -> Reply {
    let hash = HashId::from_id(c.hash_id).unwrap();
    let group = DhGroup::from_id(c.dh_group).unwrap();
    let (dhv, ch) = match DhKey::new(group, &[0x42; 64]) {
        None => (Vec::new(), c.c.clone()),
        Some(k) => {
            let s = k.shared_secret(&c.dhv).unwrap();
            (k.public.clone(), augmented_challenge(hash, &s, &c.c))
        }
    };
    let response = host_response(
        hash,
        &secret.transformed(HOST),
        &ch,
        ResponseCtx {
            seqnum: c.seqnum,
            t_id: c.t_id,
            hostnqn: HOST,
            subnqn: SUB,
        },
    );
    Reply {
        t_id: c.t_id,
        cvalid: false,
        seqnum: 0,
        c2: vec![0; response.len()],
        response,
        dhv,
    }
}

fn expect_failure1(s: &mut AuthSession, want: u8) {
    let (b, _) = s.on_receive(4096).unwrap();
    match AuthMsg::decode(&b).unwrap() {
        AuthMsg::Failure1(f) => assert_eq!(f.explanation, want),
        m => panic!("{m:?}"),
    }
    assert!(!s.authenticated());
}

#[test]
fn a_good_exchange_authenticates() {
    for g in [DhGroup::Null, DhGroup::Ffdhe2048] {
        let mut s = session(g);
        assert!(!s.authenticated());
        s.on_send(&negotiate(9));
        let c = challenge(&mut s);
        assert_eq!((c.t_id, c.dh_group), (9, g.id()));
        s.on_send(&AuthMsg::Reply(reply(&c, &key())).encode());
        let (b, ev) = s.on_receive(4096).unwrap();
        assert!(matches!(AuthMsg::decode(&b).unwrap(), AuthMsg::Success1(_)));
        assert_eq!(ev, Event::Authenticated);
        assert!(s.authenticated());
    }
}

#[test]
fn a_wrong_secret_is_refused() {
    let mut s = session(DhGroup::Null);
    s.on_send(&negotiate(1));
    let c = challenge(&mut s);
    let other = Secret::from_key(None, &[0x12; 32]).unwrap();
    let ev = s.on_send(&AuthMsg::Reply(reply(&c, &other)).encode());
    assert!(matches!(ev, Event::Failed { .. }));
    expect_failure1(&mut s, explanation::FAILED);
}

#[test]
fn truncated_oversized_and_garbage_messages_fail() {
    let mut s = session(DhGroup::Ffdhe2048);
    s.on_send(&negotiate(1));
    let c = challenge(&mut s);
    let good = AuthMsg::Reply(reply(&c, &key())).encode();
    for n in [0, 1, 7, 15, 16, 40, good.len() - 1] {
        let mut s = session(DhGroup::Ffdhe2048);
        s.on_send(&negotiate(1));
        challenge(&mut s);
        s.on_send(&good[..n]);
        expect_failure1(&mut s, explanation::INCORRECT_PAYLOAD);
    }
    // Oversized: trailing bytes past the message are ignored, but a length
    // field that claims more than was sent fails.
    let mut big = good.clone();
    big[10..12].copy_from_slice(&u16::MAX.to_le_bytes());
    s.on_send(&big);
    expect_failure1(&mut s, explanation::INCORRECT_PAYLOAD);
    let mut s = session(DhGroup::Null);
    s.on_send(&[0xFF; 64]);
    expect_failure1(&mut s, explanation::INCORRECT_PAYLOAD);
}

#[test]
fn wrong_transaction_id_replay_and_order_fail() {
    // Wrong T_ID.
    let mut s = session(DhGroup::Null);
    s.on_send(&negotiate(5));
    let c = challenge(&mut s);
    let mut r = reply(&c, &key());
    r.t_id = 6;
    s.on_send(&AuthMsg::Reply(r).encode());
    expect_failure1(&mut s, explanation::INCORRECT_PAYLOAD);
    // A Reply before any Challenge (out of order).
    let mut s = session(DhGroup::Null);
    s.on_send(&AuthMsg::Reply(reply(&c, &key())).encode());
    expect_failure1(&mut s, explanation::INCORRECT_MESSAGE);
    // Success2 where a Reply belongs.
    let mut s = session(DhGroup::Null);
    s.on_send(&negotiate(5));
    challenge(&mut s);
    s.on_send(&AuthMsg::Success2 { t_id: 5 }.encode());
    expect_failure1(&mut s, explanation::INCORRECT_MESSAGE);
    // A replayed Reply from an earlier transaction: a new challenge, so it fails.
    let mut s = session(DhGroup::Null);
    s.on_send(&negotiate(5));
    let old = challenge(&mut s);
    let old_reply = AuthMsg::Reply(reply(&old, &key())).encode();
    s.on_send(&old_reply);
    s.on_receive(4096).unwrap();
    assert!(s.authenticated());
    s.on_send(&old_reply); // replayed on the same queue: out of order
    expect_failure1(&mut s, explanation::INCORRECT_MESSAGE);
    let mut s = AuthSession::new(
        Arc::new(HostAuth {
            dh_groups: vec![DhGroup::Null],
            ..HostAuth::new(key(), None)
        }),
        HOST,
        SUB,
        |b| b.fill(0x99),
    );
    s.on_send(&negotiate(5));
    challenge(&mut s);
    s.on_send(&old_reply); // another challenge
    expect_failure1(&mut s, explanation::FAILED);
    // A Receive where the host should send.
    let mut s = session(DhGroup::Null);
    expect_failure1(&mut s, explanation::INCORRECT_MESSAGE);
}

#[test]
fn bad_dh_values_fail() {
    let p = DhGroup::Ffdhe2048.prime().unwrap();
    let mut one = vec![0u8; 256];
    one[255] = 1;
    let mut pm1 = p.to_vec();
    pm1[255] -= 1;
    for (dhv, want) in [
        (vec![0u8; 256], explanation::DHGROUP_UNUSABLE),
        (one, explanation::DHGROUP_UNUSABLE),
        (pm1, explanation::DHGROUP_UNUSABLE),
        (p.to_vec(), explanation::DHGROUP_UNUSABLE),
        (vec![5u8; 255], explanation::DHGROUP_UNUSABLE),
        (vec![5u8; 384], explanation::DHGROUP_UNUSABLE),
        (Vec::new(), explanation::DHGROUP_UNUSABLE),
    ] {
        let mut s = session(DhGroup::Ffdhe2048);
        s.on_send(&negotiate(1));
        let c = challenge(&mut s);
        let mut r = reply(&c, &key());
        r.dhv = dhv;
        s.on_send(&AuthMsg::Reply(r).encode());
        expect_failure1(&mut s, want);
    }
    // A DH value with the NULL group.
    let mut s = session(DhGroup::Null);
    s.on_send(&negotiate(1));
    let c = challenge(&mut s);
    let mut r = reply(&c, &key());
    r.dhv = vec![2; 256];
    s.on_send(&AuthMsg::Reply(r).encode());
    expect_failure1(&mut s, explanation::INCORRECT_PAYLOAD);
}

#[test]
fn negotiation_failures() {
    let mut s = session(DhGroup::Ffdhe3072);
    let mut n = negotiate(1);
    n[8 + 34..8 + 40].fill(0); // only the NULL group offered
    n[8 + 3] = 1;
    s.on_send(&n);
    expect_failure1(&mut s, explanation::DHGROUP_UNUSABLE);
    let mut n = negotiate(1);
    n[8 + 2] = 1;
    n[8 + 4] = 9; // an unknown hash only
    s.on_send(&n);
    expect_failure1(&mut s, explanation::HASH_UNUSABLE);
    let mut n = negotiate(1);
    n[6] = 1; // secure channel concatenation
    s.on_send(&n);
    expect_failure1(&mut s, explanation::CONCAT_MISMATCH);
    // AL too small for the challenge: refused, nothing sent.
    let mut s = session(DhGroup::Ffdhe2048);
    s.on_send(&negotiate(1));
    assert_eq!(s.on_receive(100).err(), Some(TooShort));
}

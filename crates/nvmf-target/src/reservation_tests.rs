use super::*;
use NotificationKind::{RegistrationPreempted, ReservationPreempted, ReservationReleased};
use ResvType::*;

const CONFLICT: Status = Status::generic(SC_RESERVATION_CONFLICT);
const INVALID: Status = Status::generic(SC_INVALID_FIELD);

fn h(n: u8) -> HostRef {
    HostRef {
        hostid: [n; 16],
        cntlid: u16::from(n),
    }
}
fn id(n: u8) -> HostId {
    [n; 16]
}
fn reg(s: &mut ReservationState, n: u8, key: u64) {
    s.register(&h(n), 0, false, 0, key, 0).unwrap();
}
fn acq(s: &mut ReservationState, n: u8, key: u64, t: ResvType) -> Result<Outcome, Status> {
    s.acquire(&h(n), 0, false, t.raw(), key, 0)
}
fn preempt(
    s: &mut ReservationState,
    n: u8,
    key: u64,
    prkey: u64,
    t: ResvType,
) -> Result<Outcome, Status> {
    s.acquire(&h(n), 1, false, t.raw(), key, prkey)
}
fn rel(s: &mut ReservationState, n: u8, key: u64, t: u8) -> Result<Outcome, Status> {
    s.release(&h(n), 0, false, t, key)
}
/// Hosts 1, 2, 3 registered with keys 11, 22, 33.
fn three() -> ReservationState {
    let mut s = ReservationState::new();
    reg(&mut s, 1, 11);
    reg(&mut s, 2, 22);
    reg(&mut s, 3, 33);
    s
}

#[test]
fn register_again_same_key_succeeds_other_key_conflicts() {
    let mut s = ReservationState::new();
    let o = s.register(&h(1), 0, false, 0xBAD, 5, 0).unwrap();
    assert!(o.changed && o.notify.is_empty());
    assert_eq!(s.generation(), 1);
    assert_eq!(
        s.registrants(),
        &[Registrant {
            hostid: id(1),
            rkey: 5
        }]
    );
    s.register(&h(1), 0, false, 0, 5, 0).unwrap();
    assert_eq!(s.generation(), 2, "every successful register counts");
    assert_eq!(s.register(&h(1), 0, false, 5, 6, 0), Err(CONFLICT));
    assert_eq!(s.generation(), 2);
    assert_eq!(s.registrants().len(), 1);
    // Another controller of the same host shares the registration.
    let other_ctrl = HostRef {
        hostid: id(1),
        cntlid: 99,
    };
    assert_eq!(s.register(&other_ctrl, 0, false, 0, 7, 0), Err(CONFLICT));
}

#[test]
fn unregister_and_replace_check_the_key() {
    let mut s = three();
    assert_eq!(s.register(&h(1), 1, false, 99, 0, 0), Err(CONFLICT));
    assert_eq!(s.register(&h(9), 1, true, 0, 0, 0), Err(CONFLICT));
    assert_eq!(s.register(&h(9), 2, true, 0, 1, 0), Err(CONFLICT));
    assert_eq!(s.register(&h(2), 2, false, 99, 1, 0), Err(CONFLICT));
    assert_eq!(s.generation(), 3);
    s.register(&h(2), 2, false, 22, 222, 0).unwrap();
    assert_eq!(s.registrants()[1].rkey, 222);
    s.register(&h(2), 2, true, 0, 2222, 0).unwrap();
    assert_eq!(s.registrants()[1].rkey, 2222);
    s.register(&h(1), 1, false, 11, 0, 0).unwrap();
    s.register(&h(3), 1, true, 0, 0, 0).unwrap();
    assert_eq!(
        s.registrants(),
        &[Registrant {
            hostid: id(2),
            rkey: 2222
        }]
    );
    assert_eq!(s.generation(), 7);
}

#[test]
fn replace_by_holder_keeps_the_reservation() {
    let mut s = three();
    acq(&mut s, 1, 11, WriteExclusive).unwrap();
    s.register(&h(1), 2, false, 11, 12, 0).unwrap();
    assert_eq!(s.holder(), Some(id(1)));
    assert_eq!(rel(&mut s, 1, 11, 1), Err(CONFLICT));
    rel(&mut s, 1, 12, 1).unwrap();
    assert!(!s.is_reserved());
}

#[test]
fn reserved_field_values_are_invalid_field() {
    let mut s = three();
    for rrega in 3..8 {
        assert_eq!(s.register(&h(1), rrega, false, 11, 1, 0), Err(INVALID));
    }
    assert_eq!(s.register(&h(1), 0, false, 0, 11, 1), Err(INVALID));
    for racqa in 3..8 {
        assert_eq!(s.acquire(&h(1), racqa, false, 1, 11, 0), Err(INVALID));
    }
    for rtype in [0u8, 7, 8, 255] {
        assert_eq!(s.acquire(&h(1), 0, false, rtype, 11, 0), Err(INVALID));
        assert_eq!(s.acquire(&h(1), 1, false, rtype, 11, 22), Err(INVALID));
    }
    assert_eq!(s.acquire(&h(1), 0, true, 1, 11, 0), Err(INVALID));
    for rrela in 2..8 {
        assert_eq!(s.release(&h(1), rrela, false, 1, 11), Err(INVALID));
    }
    assert_eq!(s.release(&h(1), 0, true, 1, 11), Err(INVALID));
    assert_eq!(s.release(&h(1), 1, true, 0, 11), Err(INVALID));
    assert_eq!(s, three(), "failed commands change nothing");
}

#[test]
fn cptpl_sets_and_clears_persistence() {
    let mut s = ReservationState::new();
    s.register(&h(1), 0, false, 0, 1, 3).unwrap();
    assert!(s.ptpl());
    s.register(&h(1), 2, false, 1, 2, 0).unwrap();
    assert!(s.ptpl(), "0 keeps it");
    assert_eq!(s.register(&h(1), 2, false, 9, 3, 2), Err(CONFLICT));
    assert!(s.ptpl(), "a failed command leaves it");
    s.register(&h(1), 1, false, 2, 0, 2).unwrap();
    assert!(!s.ptpl());
    s.set_ptpl(true);
    assert!(s.ptpl());
}

#[test]
fn too_many_registrants() {
    let mut s = ReservationState::new();
    for i in 0..MAX_REGISTRANTS {
        let mut hid = [0u8; 16];
        hid[0] = i as u8;
        hid[1] = 1;
        s.register(
            &HostRef {
                hostid: hid,
                cntlid: 1,
            },
            0,
            false,
            0,
            1,
            0,
        )
        .unwrap();
    }
    assert_eq!(
        s.register(&h(0xEE), 0, false, 0, 1, 0),
        Err(Status::generic(SC_INTERNAL))
    );
    assert_eq!(s.registrants().len(), MAX_REGISTRANTS);
    assert_eq!(s.generation(), MAX_REGISTRANTS as u32);
}

#[test]
fn acquire_rules() {
    let mut s = three();
    assert_eq!(
        acq(&mut s, 9, 0, WriteExclusive),
        Err(CONFLICT),
        "not registered"
    );
    assert_eq!(
        acq(&mut s, 1, 12, WriteExclusive),
        Err(CONFLICT),
        "wrong key"
    );
    let o = acq(&mut s, 1, 11, WriteExclusive).unwrap();
    assert!(o.changed && o.notify.is_empty() && o.abort.is_empty());
    assert_eq!((s.holder(), s.rtype()), (Some(id(1)), Some(WriteExclusive)));
    let o = acq(&mut s, 1, 11, WriteExclusive).unwrap();
    assert!(!o.changed, "holder re-acquiring the same type");
    assert_eq!(acq(&mut s, 1, 11, ExclusiveAccess), Err(CONFLICT));
    assert_eq!(acq(&mut s, 2, 22, WriteExclusive), Err(CONFLICT));
    assert_eq!(s.generation(), 3, "acquire does not count");
}

#[test]
fn all_registrants_are_holders() {
    let mut s = three();
    acq(&mut s, 2, 22, ExclusiveAccessAllRegistrants).unwrap();
    for n in 1..=3 {
        assert!(s.is_holder(&id(n)));
    }
    assert!(!s.is_holder(&id(9)));
    acq(&mut s, 3, 33, ExclusiveAccessAllRegistrants).unwrap();
    assert_eq!(acq(&mut s, 3, 33, WriteExclusive), Err(CONFLICT));
    // Unregistering holders keeps the reservation until the last one leaves.
    s.register(&h(2), 1, false, 22, 0, 0).unwrap();
    assert_eq!(s.rtype(), Some(ExclusiveAccessAllRegistrants));
    assert!(s.registrants().iter().any(|r| Some(r.hostid) == s.holder()));
    s.register(&h(1), 1, false, 11, 0, 0).unwrap();
    assert!(s.is_reserved());
    let o = s.register(&h(3), 1, false, 33, 0, 0).unwrap();
    assert!(!s.is_reserved());
    assert!(o.notify.is_empty());
}

#[test]
fn release_rules_and_notifications() {
    for t in ResvType::ALL {
        let mut s = three();
        // Nothing held: success, no effect.
        assert_eq!(rel(&mut s, 1, 11, t.raw()), Ok(Outcome::default()));
        acq(&mut s, 1, 11, t).unwrap();
        assert_eq!(rel(&mut s, 1, 99, t.raw()), Err(CONFLICT));
        assert_eq!(rel(&mut s, 9, 0, t.raw()), Err(CONFLICT));
        let other = if t == WriteExclusive { 2 } else { 1 };
        assert_eq!(rel(&mut s, 1, 11, other), Err(INVALID), "{t:?}");
        assert_eq!(rel(&mut s, 1, 11, 0), Err(INVALID));
        if !t.all_registrants() {
            // A registrant that is not the holder: success without effect.
            assert_eq!(rel(&mut s, 2, 22, t.raw()), Ok(Outcome::default()));
            assert!(s.is_reserved());
        }
        let releaser = if t.all_registrants() { 3 } else { 1 };
        let o = rel(&mut s, releaser, u64::from(releaser) * 11, t.raw()).unwrap();
        assert!(!s.is_reserved() && o.changed);
        let want: Vec<_> = if t.registrants_access() {
            (1..=3)
                .filter(|&n| n != releaser)
                .map(|n| (id(n), ReservationReleased))
                .collect()
        } else {
            vec![]
        };
        assert_eq!(o.notify, want, "{t:?}");
        assert_eq!(s.generation(), 3, "release does not count");
        assert_eq!(s.registrants().len(), 3);
    }
}

#[test]
fn clear_removes_everything() {
    let mut s = three();
    acq(&mut s, 2, 22, WriteExclusiveRegistrantsOnly).unwrap();
    assert_eq!(s.release(&h(3), 1, false, 0, 34), Err(CONFLICT));
    let o = s.release(&h(3), 1, false, 0, 33).unwrap();
    assert_eq!(
        o.notify,
        vec![(id(1), ReservationPreempted), (id(2), ReservationPreempted)]
    );
    assert!(s.registrants().is_empty() && !s.is_reserved());
    assert_eq!(s.generation(), 4);
    assert_eq!(s.release(&h(3), 1, false, 0, 33), Err(CONFLICT));
}

#[test]
fn unregistering_holder_releases() {
    for t in [
        WriteExclusive,
        ExclusiveAccess,
        WriteExclusiveRegistrantsOnly,
        ExclusiveAccessRegistrantsOnly,
    ] {
        let mut s = three();
        acq(&mut s, 2, 22, t).unwrap();
        let o = s.register(&h(2), 1, false, 22, 0, 0).unwrap();
        assert!(!s.is_reserved());
        let want: Vec<_> = if t.registrants_access() {
            vec![(id(1), ReservationReleased), (id(3), ReservationReleased)]
        } else {
            vec![]
        };
        assert_eq!(o.notify, want, "{t:?}");
    }
    // A non-holder leaving changes nothing about the reservation.
    let mut s = three();
    acq(&mut s, 2, 22, ExclusiveAccess).unwrap();
    let o = s.register(&h(1), 1, false, 11, 0, 0).unwrap();
    assert!(o.notify.is_empty());
    assert_eq!(s.holder(), Some(id(2)));
}

#[test]
fn preempt_holder_key_transfers_reservation() {
    for abort in [false, true] {
        let mut s = three();
        reg(&mut s, 4, 22); // shares the holder's key
        acq(&mut s, 2, 22, WriteExclusive).unwrap();
        let racqa = if abort { 2 } else { 1 };
        let o = s
            .acquire(
                &h(1),
                racqa,
                false,
                ExclusiveAccessRegistrantsOnly.raw(),
                11,
                22,
            )
            .unwrap();
        assert_eq!(
            (s.holder(), s.rtype()),
            (Some(id(1)), Some(ExclusiveAccessRegistrantsOnly))
        );
        let keys: Vec<_> = s.registrants().iter().map(|r| r.hostid).collect();
        assert_eq!(keys, vec![id(1), id(3)]);
        assert_eq!(
            o.notify,
            vec![
                (id(2), RegistrationPreempted),
                (id(4), RegistrationPreempted),
                (id(3), ReservationReleased),
            ]
        );
        assert_eq!(o.abort, if abort { vec![id(2), id(4)] } else { vec![] });
        assert_eq!(s.generation(), 5);
    }
}

#[test]
fn preempt_same_type_does_not_notify_release() {
    let mut s = three();
    acq(&mut s, 2, 22, WriteExclusive).unwrap();
    let o = preempt(&mut s, 3, 33, 22, WriteExclusive).unwrap();
    assert_eq!(o.notify, vec![(id(2), RegistrationPreempted)]);
    assert_eq!(s.holder(), Some(id(3)));
}

#[test]
fn holder_preempting_itself_changes_type() {
    let mut s = three();
    reg(&mut s, 4, 11);
    acq(&mut s, 1, 11, WriteExclusiveRegistrantsOnly).unwrap();
    let o = s
        .acquire(&h(1), 2, false, ExclusiveAccess.raw(), 11, 11)
        .unwrap();
    assert_eq!(
        (s.holder(), s.rtype()),
        (Some(id(1)), Some(ExclusiveAccess))
    );
    assert!(s.is_registered(&id(1)) && !s.is_registered(&id(4)));
    assert_eq!(o.abort, vec![id(4)], "never the issuer");
    assert_eq!(
        o.notify,
        vec![
            (id(4), RegistrationPreempted),
            (id(2), ReservationReleased),
            (id(3), ReservationReleased),
        ]
    );
}

#[test]
fn preempt_non_holder_key_only_unregisters() {
    let mut s = three();
    acq(&mut s, 1, 11, WriteExclusive).unwrap();
    let o = preempt(&mut s, 2, 22, 33, ExclusiveAccess).unwrap();
    assert_eq!((s.holder(), s.rtype()), (Some(id(1)), Some(WriteExclusive)));
    assert!(!s.is_registered(&id(3)));
    assert_eq!(o.notify, vec![(id(3), RegistrationPreempted)]);
    assert_eq!(s.generation(), 4);
    let before = s.clone();
    assert_eq!(preempt(&mut s, 2, 22, 77, WriteExclusive), Err(CONFLICT));
    assert_eq!(preempt(&mut s, 2, 22, 0, WriteExclusive), Err(INVALID));
    assert_eq!(preempt(&mut s, 2, 23, 11, WriteExclusive), Err(CONFLICT));
    assert_eq!(preempt(&mut s, 9, 0, 11, WriteExclusive), Err(CONFLICT));
    assert_eq!(s, before);
}

#[test]
fn preempt_all_registrants() {
    let mut s = three();
    acq(&mut s, 1, 11, WriteExclusiveAllRegistrants).unwrap();
    // PRKEY != 0 unregisters the matching registrants; the reservation stays.
    let o = preempt(&mut s, 3, 33, 22, WriteExclusive).unwrap();
    assert_eq!(o.notify, vec![(id(2), RegistrationPreempted)]);
    assert_eq!(s.rtype(), Some(WriteExclusiveAllRegistrants));
    assert_eq!(preempt(&mut s, 3, 33, 99, WriteExclusive), Err(CONFLICT));
    reg(&mut s, 2, 22);
    // PRKEY 0 takes it over: everyone else is unregistered.
    let o = s
        .acquire(&h(3), 2, false, WriteExclusive.raw(), 33, 0)
        .unwrap();
    assert_eq!((s.holder(), s.rtype()), (Some(id(3)), Some(WriteExclusive)));
    assert_eq!(
        s.registrants(),
        &[Registrant {
            hostid: id(3),
            rkey: 33
        }]
    );
    assert_eq!(
        o.notify,
        vec![
            (id(1), RegistrationPreempted),
            (id(2), RegistrationPreempted)
        ]
    );
    assert_eq!(o.abort, vec![id(1), id(2)]);
}

#[test]
fn preempt_without_reservation() {
    let mut s = three();
    reg(&mut s, 4, 33);
    let o = preempt(&mut s, 1, 11, 33, WriteExclusive).unwrap();
    assert!(!s.is_reserved(), "preempt does not create a reservation");
    assert_eq!(
        o.notify,
        vec![
            (id(3), RegistrationPreempted),
            (id(4), RegistrationPreempted)
        ]
    );
    assert_eq!(preempt(&mut s, 1, 11, 0, WriteExclusive), Err(CONFLICT));
    // PRKEY equal to the issuer's own key unregisters the issuer, silently.
    let o = s.acquire(&h(1), 2, false, 1, 11, 11).unwrap();
    assert!(!s.is_registered(&id(1)));
    assert!(o.notify.is_empty() && o.abort.is_empty());
    assert_eq!(s.registrants().len(), 1);
}

#[test]
fn generation_wraps() {
    let mut s = ReservationState {
        generation: u32::MAX,
        ..Default::default()
    };
    reg(&mut s, 1, 1);
    assert_eq!(s.generation(), 0);
}

/// The spec's access table: 6 types x holder/registrant/non-registrant x read/write.
#[test]
fn access_table() {
    // (type, holder R, holder W, registrant R, registrant W, other R, other W)
    let table = [
        (WriteExclusive, 1, 1, 1, 0, 1, 0),
        (ExclusiveAccess, 1, 1, 0, 0, 0, 0),
        (WriteExclusiveRegistrantsOnly, 1, 1, 1, 1, 1, 0),
        (ExclusiveAccessRegistrantsOnly, 1, 1, 1, 1, 0, 0),
        (WriteExclusiveAllRegistrants, 1, 1, 1, 1, 1, 0),
        (ExclusiveAccessAllRegistrants, 1, 1, 1, 1, 0, 0),
    ];
    for (t, hr, hw, rr, rw, or, ow) in table {
        let mut s = ReservationState::new();
        reg(&mut s, 1, 1);
        reg(&mut s, 2, 2);
        for n in [1, 2, 3] {
            assert_eq!(s.check(&id(n), Access::Read), Ok(()));
            assert_eq!(s.check(&id(n), Access::Write), Ok(()));
        }
        acq(&mut s, 1, 1, t).unwrap();
        assert!(s.is_reserved());
        let want = |ok: i32| if ok == 1 { Ok(()) } else { Err(CONFLICT) };
        assert_eq!(s.check(&id(1), Access::Read), want(hr), "{t:?}");
        assert_eq!(s.check(&id(1), Access::Write), want(hw), "{t:?}");
        assert_eq!(s.check(&id(2), Access::Read), want(rr), "{t:?}");
        assert_eq!(s.check(&id(2), Access::Write), want(rw), "{t:?}");
        assert_eq!(s.check(&id(3), Access::Read), want(or), "{t:?}");
        assert_eq!(s.check(&id(3), Access::Write), want(ow), "{t:?}");
    }
}

#[test]
fn command_groups() {
    use nvme_wire::sqe::io_opc::*;
    for o in [WRITE, WRITE_ZEROES, DATASET_MANAGEMENT, FLUSH] {
        assert_eq!(Access::of_io_opcode(o), Some(Access::Write));
    }
    assert_eq!(Access::of_io_opcode(READ), Some(Access::Read));
    for o in [RESV_REGISTER, RESV_REPORT, RESV_ACQUIRE, RESV_RELEASE, 0x7F] {
        assert_eq!(Access::of_io_opcode(o), None);
    }
}

#[test]
fn notification_kinds_map_to_log_and_mask() {
    assert_eq!(RegistrationPreempted.log_type(), 1);
    assert_eq!(ReservationReleased.log_type(), 2);
    assert_eq!(ReservationPreempted.log_type(), 3);
    assert_eq!(RegistrationPreempted.mask_bit(), 1 << 1);
    assert_eq!(ReservationReleased.mask_bit(), 1 << 2);
    assert_eq!(ReservationPreempted.mask_bit(), 1 << 3);
}

#[test]
fn report_extended() {
    let mut s = three();
    s.set_ptpl(true);
    acq(&mut s, 2, 22, WriteExclusive).unwrap();
    let ctrls = |hid: &HostId| match hid[0] {
        1 => vec![5, 6],
        2 => vec![7],
        _ => vec![],
    };
    assert_eq!(
        s.report(false, ctrls, &mut [0u8; 64]),
        Err(Status::generic(SC_HOST_ID_INCONSISTENT))
    );
    let mut b = vec![0u8; 4096];
    let n = s.report(true, ctrls, &mut b).unwrap();
    assert_eq!(n, 64 + 4 * 64);
    assert_eq!(u32::from_le_bytes(b[0..4].try_into().unwrap()), 3);
    assert_eq!(b[4], 1);
    assert_eq!(u16::from_le_bytes([b[5], b[6]]), 4);
    assert_eq!(b[9], 1);
    let entry = |i: usize| &b[64 + i * 64..128 + i * 64];
    let cntlids: Vec<u16> = (0..4)
        .map(|i| u16::from_le_bytes([entry(i)[0], entry(i)[1]]))
        .collect();
    assert_eq!(cntlids, vec![5, 6, 7, CNTLID_NONE]);
    let rcsts: Vec<u8> = (0..4).map(|i| entry(i)[2]).collect();
    assert_eq!(rcsts, vec![0, 0, 1, 0]);
    assert_eq!(&entry(2)[16..32], &id(2));
    assert_eq!(u64::from_le_bytes(entry(3)[8..16].try_into().unwrap()), 33);
    // A short NUMD gets the prefix and the full length.
    let mut short = [0u8; 70];
    assert_eq!(s.report(true, ctrls, &mut short), Ok(n));
    assert_eq!(&short[..], &b[..70]);
    // All-registrants: every registrant's controllers report holding it.
    s.release(&h(2), 0, false, 1, 22).unwrap();
    acq(&mut s, 3, 33, ExclusiveAccessAllRegistrants).unwrap();
    let v = s.registered_ctrls(ctrls);
    assert!(v.iter().all(|c| c.holds));
    let mut empty = ReservationState::new();
    assert_eq!(empty.report(true, ctrls, &mut b), Ok(64));
    assert_eq!(b[4], 0);
    empty.set_ptpl(false);
}

#[test]
fn persistent_round_trip() {
    let mut states = vec![ReservationState::new(), three()];
    let mut s = three();
    s.set_ptpl(true);
    acq(&mut s, 3, 33, ExclusiveAccessRegistrantsOnly).unwrap();
    states.push(s.clone());
    s.release(&h(3), 0, false, 4, 33).unwrap();
    acq(&mut s, 2, 22, WriteExclusiveAllRegistrants).unwrap();
    s.generation = u32::MAX - 1;
    states.push(s);
    for s in states {
        let b = s.encode_persistent();
        assert_eq!(b.len(), 16 + 24 * s.registrants().len() + 4);
        assert_eq!(ReservationState::decode_persistent(&b), Ok(s));
    }
}

/// Re-signs a hand-edited record so that the semantic checks are reached.
fn resign(b: &mut Vec<u8>) {
    b.truncate(b.len() - 4);
    let crc = crc32c(b);
    b.extend_from_slice(&crc.to_le_bytes());
}

#[test]
fn persistent_rejects_corruption() {
    let mut s = three();
    acq(&mut s, 1, 11, ExclusiveAccess).unwrap();
    let good = s.encode_persistent();
    for i in 0..good.len() {
        for bit in 0..8 {
            let mut b = good.clone();
            b[i] ^= 1 << bit;
            assert!(
                ReservationState::decode_persistent(&b).is_err(),
                "byte {i} bit {bit}"
            );
        }
    }
    for n in 0..good.len() {
        assert!(ReservationState::decode_persistent(&good[..n]).is_err());
    }
    let mut long = good.clone();
    long.push(0);
    assert!(ReservationState::decode_persistent(&long).is_err());

    let edit = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.clone();
        f(&mut b);
        resign(&mut b);
        ReservationState::decode_persistent(&b)
    };
    assert_eq!(edit(&|b| b[4] = 2), Err(PersistError::Version(2)));
    assert_eq!(edit(&|b| b[0] = b'X'), Err(PersistError::Magic));
    assert!(matches!(edit(&|b| b[5] = 2), Err(PersistError::Invalid(_))));
    assert!(matches!(edit(&|b| b[6] = 7), Err(PersistError::Invalid(_))));
    assert!(matches!(edit(&|b| b[6] = 0), Err(PersistError::Invalid(_))));
    assert!(matches!(
        edit(&|b| b[14] = 3),
        Err(PersistError::Invalid(_))
    ));
    assert!(matches!(
        edit(&|b| b[14..16].copy_from_slice(&[0xFF, 0xFF])),
        Err(PersistError::Invalid(_))
    ));
    assert!(matches!(edit(&|b| b[12] = 2), Err(PersistError::Length(_))));
    assert!(matches!(
        edit(&|b| {
            let first: Vec<u8> = b[16..32].to_vec();
            b[40..56].copy_from_slice(&first);
        }),
        Err(PersistError::Invalid(_))
    ));
    // A well-formed record with too many entries.
    let mut big = vec![0u8; 16 + 65 * 24 + 4];
    big[..5].copy_from_slice(b"FPRV\x01");
    big[12] = 65;
    big[14..16].copy_from_slice(&[0xFF, 0xFF]);
    resign(&mut big);
    assert_eq!(
        ReservationState::decode_persistent(&big),
        Err(PersistError::TooMany(65))
    );
}

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn random_operations_keep_invariants() {
    let mut garbage = Rng(7);
    for _ in 0..2000 {
        let len = garbage.below(200) as usize;
        let b: Vec<u8> = (0..len).map(|_| garbage.next() as u8).collect();
        let _ = ReservationState::decode_persistent(&b);
    }
    for seed in 1..=20u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut s = ReservationState::new();
        for _ in 0..2000 {
            let host = h(1 + rng.below(3) as u8);
            // Keys from a small set so that matches are frequent.
            let key = |r: &mut Rng| r.below(4);
            let before = s.clone();
            let (res, counts) = match rng.below(4) {
                0 => {
                    let (a, ie, c, n) = (
                        rng.below(4) as u8,
                        rng.below(2) == 0,
                        key(&mut rng),
                        key(&mut rng),
                    );
                    let cp = [0u8, 0, 2, 3, 1][rng.below(5) as usize];
                    (s.register(&host, a, ie, c, n, cp), true)
                }
                1 => {
                    let a = rng.below(4) as u8;
                    let t = rng.below(8) as u8;
                    let ie = rng.below(20) == 0;
                    let (c, p) = (key(&mut rng), key(&mut rng));
                    (s.acquire(&host, a, ie, t, c, p), a != 0)
                }
                2 => {
                    let a = rng.below(3) as u8;
                    let t = rng.below(8) as u8;
                    let c = key(&mut rng);
                    (s.release(&host, a, false, t, c), a == 1)
                }
                _ => {
                    let access = if rng.below(2) == 0 {
                        Access::Read
                    } else {
                        Access::Write
                    };
                    let _ = s.check(&host.hostid, access);
                    continue;
                }
            };
            match &res {
                Err(_) => assert_eq!(s, before, "a failed command changed the state"),
                Ok(o) => {
                    let want = if counts {
                        before.generation().wrapping_add(1)
                    } else {
                        before.generation()
                    };
                    assert_eq!(s.generation(), want);
                    assert!(o.notify.iter().all(|(hid, _)| *hid != host.hostid));
                    assert!(o.abort.iter().all(|hid| *hid != host.hostid));
                    assert!(o.changed || s == before);
                }
            }
            // Invariants.
            let regs = s.registrants();
            for (i, r) in regs.iter().enumerate() {
                assert!(regs[i + 1..].iter().all(|o| o.hostid != r.hostid));
            }
            if let Some(hd) = s.holder() {
                assert!(s.is_registered(&hd), "holder must be a registrant");
                let holders = (1..=3).filter(|&n| s.is_holder(&id(n))).count();
                if !s.rtype().unwrap().all_registrants() {
                    assert_eq!(holders, 1);
                } else {
                    assert_eq!(holders, regs.len());
                }
                assert_eq!(s.check(&hd, Access::Write), Ok(()));
            } else {
                assert!(s.rtype().is_none());
            }
            assert_eq!(
                ReservationState::decode_persistent(&s.encode_persistent()).as_ref(),
                Ok(&s)
            );
        }
    }
}

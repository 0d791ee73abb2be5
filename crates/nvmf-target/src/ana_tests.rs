//! ANA groups: states at run time, the I/O gate, the ANA log and its notice.

use std::sync::Arc;

use nvme_wire::fabrics::{CNTLID_DYNAMIC, ConnectCmd, ConnectData, prop};
use nvme_wire::identify;
use nvme_wire::log_page::{GetLogPage, lid};
use nvme_wire::sqe::{Sqe, admin_opc, io_opc};
use nvme_wire::status::{SC_ANA_INACCESSIBLE, SC_ANA_PERSISTENT_LOSS, SC_ANA_TRANSITION, SCT_PATH};

use super::*;
use crate::admin::{AdminCtx, AdminOutcome};
use crate::config::TransportConfig;
use crate::controller::{AsyncEvent, Controller};
use crate::subsystem::Namespace;
use crate::subsystem::Subsystem;
use crate::{Target, io};

fn ns(nsid: u32, grp: u32) -> Namespace {
    let dev = Arc::new(blockdev::NullDevice::new(1 << 20, 512).unwrap());
    Namespace::new(nsid, dev, [nsid as u8; 16], [nsid as u8; 16])
        .with_ana_group(grp)
        .unwrap()
}

fn sub(nqn: &str, namespaces: Vec<Namespace>) -> Arc<Subsystem> {
    Arc::new(Subsystem::new(
        nqn.into(),
        "S".into(),
        "M".into(),
        true,
        Vec::new(),
        namespaces,
    ))
}

/// Two subsystems: "a" with NSID 1 in group 5 and NSID 2 in group 7, "b"
/// with NSID 1 in group 9.
fn target() -> Target {
    Target::new(
        TransportConfig::default(),
        vec![
            sub("nqn.t:a", vec![ns(1, 5), ns(2, 7)]),
            sub("nqn.t:b", vec![ns(1, 9)]),
        ],
    )
}

/// An enabled admin controller on `nqn` with `aec` as its Async Event Configuration.
fn connect(t: &Target, nqn: &str, aec: u32) -> Arc<Controller> {
    let cmd = ConnectCmd {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato_ms: 0,
    };
    let data = ConnectData {
        hostid: [9; 16],
        cntlid: CNTLID_DYNAMIC,
        subnqn: nqn.into(),
        hostnqn: "nqn.h:1".into(),
    };
    let c = crate::fabrics::connect_admin(t, &cmd, &data).unwrap();
    let cc = prop::CC_EN | (6 << prop::CC_IOSQES_SHIFT) | (4 << prop::CC_IOCQES_SHIFT);
    c.property_set(prop::CC, false, u64::from(cc)).unwrap();
    c.state.lock().async_event_config = aec;
    c
}

fn admin(t: &Target, c: &Controller, sqe: &Sqe, len: usize) -> Vec<u8> {
    let cx = AdminCtx {
        target: t,
        ctrl: c,
        outstanding_aers: 0,
        local_ip: None,
    };
    let mut out = vec![0u8; len];
    let r = crate::admin::execute(&cx, sqe, &mut out);
    assert!(
        matches!(r, AdminOutcome::Complete { status, .. } if status.is_success()),
        "{r:?}"
    );
    out
}

fn ana_log(t: &Target, c: &Controller, rgo: bool, rae: bool) -> Vec<u8> {
    let g = GetLogPage {
        lid: lid::ANA,
        lsp: if rgo { 1 } else { 0 },
        rae,
        len: 4096,
        offset: 0,
    };
    admin(t, c, &g.to_sqe(1), 4096)
}

fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}

fn events(c: &Controller) -> Vec<AsyncEvent> {
    c.state.lock().pending_events.drain(..).collect()
}

#[test]
fn states_have_the_spec_values_and_statuses() {
    let all = [
        (AnaState::Optimized, 1, None),
        (AnaState::NonOptimized, 2, None),
        (AnaState::Inaccessible, 3, Some(SC_ANA_INACCESSIBLE)),
        (AnaState::PersistentLoss, 4, Some(SC_ANA_PERSISTENT_LOSS)),
        (AnaState::Change, 0xF, Some(SC_ANA_TRANSITION)),
    ];
    for (s, v, sc) in all {
        assert_eq!(s.to_wire(), v);
        assert_eq!(AnaState::from_wire(v), Some(s));
        assert_eq!(
            s.io_status().map(|st| (st.sct, st.sc, st.dnr)),
            sc.map(|sc| (SCT_PATH, sc, false))
        );
    }
    assert_eq!(AnaState::from_wire(0), None);
    assert_eq!(AnaState::from_wire(5), None);
}

#[test]
fn groups_are_checked_and_default_optimized() {
    let dev = Arc::new(blockdev::NullDevice::new(1 << 20, 512).unwrap());
    let n = Namespace::new(1, dev, [0; 16], [0; 16]);
    assert!(n.clone().with_ana_group(0).is_err());
    assert!(n.clone().with_ana_group(MAX_GROUPS + 1).is_err());
    assert_eq!(n.with_ana_group(MAX_GROUPS).unwrap().ana_group, MAX_GROUPS);
    let t = target();
    assert_eq!(t.ana_state(5), AnaState::Optimized);
    // Out of range: ignored, nothing moves.
    t.set_ana_state(0, AnaState::Inaccessible);
    t.set_ana_state(MAX_GROUPS + 1, AnaState::Inaccessible);
    assert_eq!(t.ana.change_count(), 0);
    assert_eq!(t.ana_state(MAX_GROUPS + 1), AnaState::Optimized);
}

#[test]
fn the_host_ana_log_fits_the_default_transfer() {
    assert_eq!(
        host_ana_log_len(crate::subsystem::MAX_NSID),
        16 + 128 * 32 + 1024 * 4
    );
    assert!(
        host_ana_log_len(crate::subsystem::MAX_NSID)
            <= TransportConfig::default().max_transfer as usize
    );
}

#[test]
fn io_on_a_gated_group_gets_the_path_status_first() {
    let t = target();
    let n = t.subsystem("nqn.t:a").unwrap().namespaces();
    let cmd = |opc: u8, nsid: u32, slba: u64| {
        let mut s = Sqe::new(opc, 1);
        s.nsid = nsid;
        s.cdw10 = slba as u32;
        s.cdw11 = (slba >> 32) as u32;
        s
    };
    let opcodes = [
        io_opc::READ,
        io_opc::WRITE,
        io_opc::FLUSH,
        io_opc::WRITE_ZEROES,
        io_opc::DATASET_MANAGEMENT,
        io_opc::RESV_REGISTER,
        io_opc::RESV_REPORT,
        io_opc::RESV_ACQUIRE,
        io_opc::RESV_RELEASE,
    ];
    for (state, sc) in [
        (AnaState::Inaccessible, Some(SC_ANA_INACCESSIBLE)),
        (AnaState::PersistentLoss, Some(SC_ANA_PERSISTENT_LOSS)),
        (AnaState::Change, Some(SC_ANA_TRANSITION)),
        (AnaState::NonOptimized, None),
        (AnaState::Optimized, None),
    ] {
        t.set_ana_state(5, state);
        for opc in opcodes {
            let r = t.plan_io(&n, &cmd(opc, 1, 0)).map(|(_, p)| p);
            match sc {
                Some(sc) => {
                    let st = r.unwrap_err().status;
                    assert_eq!(
                        (st.sct, st.sc, st.dnr),
                        (SCT_PATH, sc, false),
                        "{state:?} {opc:#x}"
                    );
                }
                None => assert!(r.is_ok(), "{state:?} {opc:#x}: {r:?}"),
            }
            // Group 7 is untouched.
            assert!(t.plan_io(&n, &cmd(opc, 2, 0)).is_ok());
        }
    }
    // The path status comes before a bad LBA, as in nvmet.
    t.set_ana_state(5, AnaState::Inaccessible);
    let r = t.plan_io(&n, &cmd(io_opc::READ, 1, u64::MAX));
    let st = r.map(|(_, p)| p).unwrap_err().status;
    assert_eq!((st.sct, st.sc), (SCT_PATH, SC_ANA_INACCESSIBLE));
    // An unknown NSID is still Invalid Namespace.
    let r = io::plan(&t.ana, &n, &cmd(io_opc::READ, 3, 0), 1 << 20);
    let st = r.map(|(_, p)| p).unwrap_err().status;
    assert_eq!(st.sc, nvme_wire::status::SC_INVALID_NS);
}

#[test]
fn a_state_change_notifies_the_group_s_controllers_once_until_read() {
    let t = target();
    let on = connect(&t, "nqn.t:a", identify::OAES_ANA_CHANGE);
    let off = connect(&t, "nqn.t:a", 0);
    let other = connect(&t, "nqn.t:b", identify::OAES_ANA_CHANGE);
    let disc = connect(
        &t,
        nvme_wire::fabrics::DISCOVERY_NQN,
        identify::OAES_DISC_LOG_CHANGE,
    );

    t.set_ana_state(5, AnaState::Inaccessible);
    assert_eq!(t.ana_state(5), AnaState::Inaccessible);
    assert_eq!(t.ana.change_count(), 1);
    assert_eq!(events(&on), [AsyncEvent::ANA_CHANGE]);
    assert!(events(&off).is_empty(), "not enabled");
    assert!(events(&other).is_empty(), "no namespace in group 5");
    assert!(events(&disc).is_empty());

    // The same state: nothing at all.
    t.set_ana_state(5, AnaState::Inaccessible);
    assert_eq!(t.ana.change_count(), 1);
    assert!(events(&on).is_empty());

    // Masked until the host reads the log with RAE cleared.
    t.set_ana_state(7, AnaState::Change);
    assert_eq!(t.ana.change_count(), 2);
    assert!(events(&on).is_empty());
    ana_log(&t, &on, false, true);
    t.set_ana_state(7, AnaState::NonOptimized);
    assert!(events(&on).is_empty(), "RAE set keeps it masked");
    ana_log(&t, &on, false, false);
    t.set_ana_state(7, AnaState::Optimized);
    assert_eq!(events(&on), [AsyncEvent::ANA_CHANGE]);

    t.set_ana_state(9, AnaState::Inaccessible);
    assert_eq!(events(&other), [AsyncEvent::ANA_CHANGE]);
    assert!(events(&on).is_empty());
}

#[test]
fn the_log_lists_the_subsystem_s_groups_with_their_states() {
    let t = target();
    let a = connect(&t, "nqn.t:a", 0);
    let b = connect(&t, "nqn.t:b", 0);
    t.set_ana_state(7, AnaState::Inaccessible);
    t.set_ana_state(9, AnaState::PersistentLoss);

    let log = ana_log(&t, &a, false, false);
    assert_eq!(u64::from_le_bytes(log[0..8].try_into().unwrap()), 2);
    assert_eq!(u16::from_le_bytes([log[8], log[9]]), 2);
    // Group 5: NSID 1, optimized; group 7: NSID 2, inaccessible.
    assert_eq!((le32(&log, 16), le32(&log, 20), log[32]), (5, 1, 1));
    assert_eq!(le32(&log, 48), 1);
    assert_eq!((le32(&log, 52), le32(&log, 56), log[68]), (7, 1, 3));
    assert_eq!(le32(&log, 84), 2);
    assert!(log[88..].iter().all(|&b| b == 0));

    // RGO: descriptors without NSIDs.
    let log = ana_log(&t, &a, true, false);
    assert_eq!((le32(&log, 16), le32(&log, 20)), (5, 0));
    assert_eq!((le32(&log, 48), le32(&log, 52), log[64]), (7, 0, 3));

    let log = ana_log(&t, &b, false, false);
    assert_eq!(u16::from_le_bytes([log[8], log[9]]), 1);
    assert_eq!(
        (le32(&log, 16), le32(&log, 20), log[32], le32(&log, 48)),
        (9, 1, 4, 1)
    );
}

#[test]
fn identify_reports_anatt_and_the_group_limits() {
    let t = target();
    let c = connect(&t, "nqn.t:a", 0);
    let id = |c: &Controller| {
        let mut s = Sqe::new(admin_opc::IDENTIFY, 1);
        s.cdw10 = u32::from(identify::cns::CONTROLLER);
        admin(&t, c, &s, identify::IDENTIFY_LEN)
    };
    let b = id(&c);
    assert_eq!((b[342], b[343]), (ANATT, ANACAP));
    assert_eq!((le32(&b, 344), le32(&b, 348)), (MAX_GROUPS, MAX_GROUPS));
    t.set_anatt(3);
    assert_eq!(id(&c)[342], 3);
    t.set_anatt(0);
    assert_eq!(id(&c)[342], 1, "0 is taken as 1");
    // Identify Namespace reports the namespace's group.
    let mut s = Sqe::new(admin_opc::IDENTIFY, 1);
    s.nsid = 2;
    let b = admin(&t, &c, &s, identify::IDENTIFY_LEN);
    assert_eq!(le32(&b, 92), 7);
}

/// A lease the test ends at will.
struct TestLease(std::sync::atomic::AtomicBool);

impl AnaLease for TestLease {
    fn valid(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[test]
fn a_lease_bound_group_reads_inaccessible_once_its_lease_ran_out() {
    let t = target();
    let a = connect(&t, "nqn.t:a", 0);
    let lease = Arc::new(TestLease(true.into()));
    t.set_ana_lease(Some(lease.clone()));
    t.bind_ana_group_to_lease(5, true);
    let state_of = |log: &[u8]| (log[32], log[68]);
    assert_eq!(state_of(&ana_log(&t, &a, false, false)), (1, 1));
    // The deadline passes (a node woken by SIGCONT) before anyone set a
    // state: the log already says Inaccessible for the bound group only.
    lease.0.store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(state_of(&ana_log(&t, &a, false, false)), (3, 1));
    assert_eq!(t.ana_state(5), AnaState::Inaccessible);
    assert_eq!(t.ana_state(7), AnaState::Optimized);
    // A state that is not accessible anyway stays as set.
    t.set_ana_state(5, AnaState::Change);
    assert_eq!(t.ana_state(5), AnaState::Change);
    t.set_ana_state(5, AnaState::Optimized);
    lease.0.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(t.ana_state(5), AnaState::Optimized);
    t.bind_ana_group_to_lease(5, false);
    lease.0.store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(t.ana_state(5), AnaState::Optimized);
}

//! Admin command tests: Identify, features, Connect checks.

use std::sync::Arc;

use nvme_wire::fabrics::{CNTLID_DYNAMIC, ConnectCmd, ConnectData, DISCOVERY_NQN, prop};
use nvme_wire::identify::{cns, csi};
use nvme_wire::sqe::Sqe;

use super::*;
use crate::config::TransportConfig;
use crate::subsystem::{Namespace, Subsystem};

const NQN: &str = "nqn.2026-01.io.flashpool:t";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:1";

fn target() -> Target {
    let dev = Arc::new(blockdev::MemDevice::new(64 << 20, 512).unwrap());
    let ns = Namespace::new(1, dev, [1; 16], [2; 16]);
    let sub = Arc::new(Subsystem::new(
        NQN.into(),
        "SN".into(),
        "MODEL".into(),
        true,
        Vec::new(),
        vec![ns],
    ));
    Target::new(TransportConfig::default(), vec![sub])
}

fn connect_cmd() -> ConnectCmd {
    ConnectCmd {
        recfmt: 0,
        qid: 0,
        sqsize: 31,
        cattr: 0,
        kato_ms: 0,
    }
}

fn connect(t: &Target, subnqn: &str) -> Arc<Controller> {
    let data = ConnectData {
        hostid: [9; 16],
        cntlid: CNTLID_DYNAMIC,
        subnqn: subnqn.into(),
        hostnqn: HOST.into(),
    };
    let c = crate::fabrics::connect_admin(t, &connect_cmd(), &data).unwrap();
    let cc = prop::CC_EN | (6 << prop::CC_IOSQES_SHIFT) | (4 << prop::CC_IOCQES_SHIFT);
    c.property_set(prop::CC, false, u64::from(cc | (6 << prop::CC_CSS_SHIFT)))
        .unwrap();
    assert!(c.enabled());
    c
}

fn run(t: &Target, c: &Controller, sqe: &Sqe, out: &mut [u8]) -> (Status, u32) {
    let cx = AdminCtx {
        target: t,
        ctrl: c,
        outstanding_aers: 0,
        local_ip: None,
    };
    match execute(&cx, sqe, out) {
        AdminOutcome::Complete { status, dw0, .. } => (status, dw0),
        AdminOutcome::HoldAer => panic!("held"),
        AdminOutcome::Storing(_) => panic!("storing"),
    }
}

fn identify_sqe(cns: u8, nsid: u32, csi: u8) -> Sqe {
    let mut s = Sqe::new(admin_opc::IDENTIFY, 1);
    s.cdw10 = u32::from(cns);
    s.cdw11 = u32::from(csi) << 24;
    s.nsid = nsid;
    s
}

fn identify(t: &Target, c: &Controller, cns: u8, nsid: u32, csi: u8) -> (Status, Vec<u8>) {
    let mut out = vec![0xEEu8; IDENTIFY_LEN];
    let (st, _) = run(t, c, &identify_sqe(cns, nsid, csi), &mut out);
    (st, out)
}

fn le16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn le64(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

const INVALID_FIELD: Status = Status::generic(status::SC_INVALID_FIELD);
const INVALID_NS: Status = Status::generic(status::SC_INVALID_NS);

#[test]
fn identify_controller_is_consistent() {
    let t = target();
    let c = connect(&t, NQN);
    let (st, b) = identify(&t, &c, cns::CONTROLLER, 0, 0);
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(le16(&b, 0), 0, "VID");
    assert_eq!(le32(&b, 80), prop::VS_1_4, "VER");
    assert_eq!(le16(&b, 256), 0, "OACS");
    assert_eq!(b[263], 0, "NPSS");
    assert_eq!(le16(&b, 266), 343, "WCTEMP");
    let oncs = le16(&b, 520);
    assert_eq!(
        oncs & identify::ONCS_SAVE_SELECT,
        identify::ONCS_SAVE_SELECT
    );
    assert_ne!(oncs & (1 << 5), 0, "reservations");
    assert_eq!(le16(&b, 522), 0, "FUSES");
    assert_eq!(b[525], 0b101, "VWC: present, no broadcast flush");
    assert_eq!(b[76] & identify::CMIC_ANA, identify::CMIC_ANA);

    let d = connect(&t, DISCOVERY_NQN);
    let (st, b) = identify(&t, &d, cns::CONTROLLER, 0, 0);
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(b[111], identify::CNTRLTYPE_DISCOVERY);
    assert_eq!(le32(&b, 80), prop::VS_1_4);
}

#[test]
fn identify_namespace_reports_thin_usage() {
    let t = target();
    let c = connect(&t, NQN);
    let (st, b) = identify(&t, &c, cns::NAMESPACE, 1, 0);
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(le64(&b, 0), (64 << 20) / 512, "NSZE");
    assert_eq!(le64(&b, 8), le64(&b, 0), "NCAP");
    assert_eq!(le64(&b, 16), 0, "NUSE: nothing written yet");
    assert_eq!(b[24] & identify::NSFEAT_THIN, identify::NSFEAT_THIN);
    // A null device is fully provisioned.
    let null = Arc::new(blockdev::NullDevice::new(1 << 20, 512).unwrap());
    t.add_namespace(NQN, Namespace::new(2, null, [3; 16], [4; 16]))
        .unwrap();
    let (_, b) = identify(&t, &c, cns::NAMESPACE, 2, 0);
    assert_eq!(le64(&b, 16), le64(&b, 0));
    assert_eq!(b[24] & identify::NSFEAT_THIN, 0);
}

#[test]
fn identify_command_set_structures() {
    let t = target();
    let c = connect(&t, NQN);
    // CNS 05h: NVM-specific namespace, all zero for us.
    let (st, b) = identify(&t, &c, cns::CS_NAMESPACE, 1, csi::NVM);
    assert_eq!(st, Status::SUCCESS);
    assert!(b.iter().all(|&x| x == 0));
    assert_eq!(identify(&t, &c, cns::CS_NAMESPACE, 1, 1).0, INVALID_FIELD);
    assert_eq!(identify(&t, &c, cns::CS_NAMESPACE, 1, 2).0, INVALID_FIELD);
    // CNS 06h: NVM-specific controller, no limits.
    let (st, b) = identify(&t, &c, cns::CS_CONTROLLER, 0, csi::NVM);
    assert_eq!(st, Status::SUCCESS);
    assert!(b.iter().all(|&x| x == 0));
    assert_eq!(identify(&t, &c, cns::CS_CONTROLLER, 0, 2).0, INVALID_FIELD);
    // CNS 08h: command set independent namespace.
    let (st, b) = identify(&t, &c, cns::CS_INDEP_NAMESPACE, 1, 0);
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(b[0], identify::NSFEAT_THIN);
    assert_eq!(b[1], identify::NMIC_SHARED);
    assert_eq!(le32(&b, 4), crate::ana::DEFAULT_GROUP);
    assert_eq!(b[14], identify::NSTAT_READY);
    // CNS 1Ch: one combination, NVM only.
    let (st, b) = identify(&t, &c, cns::IO_COMMAND_SETS, 0, 0);
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(le64(&b, 0), 1);
    assert!(b[8..].iter().all(|&x| x == 0));
    // CNS 03h carries the CSI descriptor (type 4, length 1, NVM).
    let (st, b) = identify(&t, &c, cns::NS_ID_DESCRIPTORS, 1, 0);
    assert_eq!(st, Status::SUCCESS);
    let mut off = 0;
    let mut found = false;
    while b[off] != 0 {
        let len = usize::from(b[off + 1]);
        if b[off] == identify::nidt::CSI {
            assert_eq!((len, b[off + 4]), (1, csi::NVM));
            found = true;
        }
        off += 4 + len;
    }
    assert!(found);
}

#[test]
fn identify_namespace_ids_edge_cases() {
    let t = target();
    let c = connect(&t, NQN);
    for cns in [cns::NAMESPACE, cns::CS_NAMESPACE, cns::CS_INDEP_NAMESPACE] {
        for nsid in [0, u32::MAX, MAX_NSID + 1] {
            assert_eq!(
                identify(&t, &c, cns, nsid, 0).0,
                INVALID_NS,
                "cns {cns} nsid {nsid:#x}"
            );
        }
        // Inactive but in range: zero-filled.
        let (st, b) = identify(&t, &c, cns, 5, 0);
        assert_eq!(st, Status::SUCCESS, "cns {cns}");
        assert!(b.iter().all(|&x| x == 0), "cns {cns}");
    }
    // The discovery controller answers CNS 01h only.
    let d = connect(&t, DISCOVERY_NQN);
    for cns in [
        cns::NAMESPACE,
        cns::CS_NAMESPACE,
        cns::CS_CONTROLLER,
        cns::CS_INDEP_NAMESPACE,
        cns::IO_COMMAND_SETS,
    ] {
        assert_eq!(identify(&t, &d, cns, 1, 0).0, INVALID_FIELD, "cns {cns}");
    }
}

fn set_feat(t: &Target, c: &Controller, fid: u8, cdw11: u32) -> (Status, u32) {
    let mut s = Sqe::new(admin_opc::SET_FEATURES, 2);
    s.cdw10 = u32::from(fid);
    s.cdw11 = cdw11;
    run(t, c, &s, &mut [])
}

fn get_feat(t: &Target, c: &Controller, fid: u8, sel: u8, cdw11: u32) -> (Status, u32) {
    let mut s = Sqe::new(admin_opc::GET_FEATURES, 3);
    s.cdw10 = u32::from(fid) | (u32::from(sel) << 8);
    s.cdw11 = cdw11;
    run(t, c, &s, &mut [])
}

fn ok(v: u32) -> (Status, u32) {
    (Status::SUCCESS, v)
}

#[test]
fn arbitration_and_power_management() {
    let t = target();
    let c = connect(&t, NQN);
    assert_eq!(get_feat(&t, &c, fid::ARBITRATION, sel::CURRENT, 0), ok(7));
    assert_eq!(
        set_feat(&t, &c, fid::ARBITRATION, 0x0302_01FA).0,
        Status::SUCCESS
    );
    assert_eq!(
        get_feat(&t, &c, fid::ARBITRATION, sel::CURRENT, 0),
        ok(0x0302_0102)
    );
    assert_eq!(get_feat(&t, &c, fid::ARBITRATION, sel::DEFAULT, 0), ok(7));

    assert_eq!(get_feat(&t, &c, fid::POWER_MGMT, sel::CURRENT, 0), ok(0));
    assert_eq!(set_feat(&t, &c, fid::POWER_MGMT, 1).0, INVALID_FIELD);
    assert_eq!(set_feat(&t, &c, fid::POWER_MGMT, 0x1F).0, INVALID_FIELD);
    assert_eq!(set_feat(&t, &c, fid::POWER_MGMT, 0).0, Status::SUCCESS);
    assert_eq!(get_feat(&t, &c, fid::POWER_MGMT, sel::CURRENT, 0), ok(0));
}

#[test]
fn temperature_thresholds() {
    let t = target();
    let c = connect(&t, NQN);
    let under = 1 << 20;
    assert_eq!(
        get_feat(&t, &c, fid::TEMP_THRESHOLD, sel::CURRENT, 0),
        ok(343)
    );
    assert_eq!(
        get_feat(&t, &c, fid::TEMP_THRESHOLD, sel::CURRENT, under),
        ok(under)
    );
    assert_eq!(
        set_feat(&t, &c, fid::TEMP_THRESHOLD, 350).0,
        Status::SUCCESS
    );
    assert_eq!(
        set_feat(&t, &c, fid::TEMP_THRESHOLD, under | 260).0,
        Status::SUCCESS
    );
    assert_eq!(
        get_feat(&t, &c, fid::TEMP_THRESHOLD, sel::CURRENT, 0),
        ok(350)
    );
    assert_eq!(
        get_feat(&t, &c, fid::TEMP_THRESHOLD, sel::CURRENT, under),
        ok(under | 260)
    );
    assert_eq!(
        get_feat(&t, &c, fid::TEMP_THRESHOLD, sel::DEFAULT, 0),
        ok(343)
    );
    assert_eq!(
        get_feat(&t, &c, fid::TEMP_THRESHOLD, sel::SAVED, under),
        ok(under)
    );
    // All sensors (Fh) sets the composite; sensor 1 does not exist; THSEL 10b is reserved.
    assert_eq!(
        set_feat(&t, &c, fid::TEMP_THRESHOLD, (0xF << 16) | 351).0,
        Status::SUCCESS
    );
    assert_eq!(
        get_feat(&t, &c, fid::TEMP_THRESHOLD, sel::CURRENT, 0),
        ok(351)
    );
    assert_eq!(
        set_feat(&t, &c, fid::TEMP_THRESHOLD, (1 << 16) | 300).0,
        INVALID_FIELD
    );
    assert_eq!(
        set_feat(&t, &c, fid::TEMP_THRESHOLD, (2 << 20) | 300).0,
        INVALID_FIELD
    );
    assert_eq!(
        get_feat(&t, &c, fid::TEMP_THRESHOLD, sel::CURRENT, 1 << 16).0,
        INVALID_FIELD
    );
}

#[test]
fn error_recovery_wc_atomicity() {
    let t = target();
    let c = connect(&t, NQN);
    assert_eq!(set_feat(&t, &c, fid::ERROR_RECOVERY, 25).0, Status::SUCCESS);
    assert_eq!(
        get_feat(&t, &c, fid::ERROR_RECOVERY, sel::CURRENT, 0),
        ok(25)
    );
    assert_eq!(
        set_feat(&t, &c, fid::ERROR_RECOVERY, 1 << 16).0,
        INVALID_FIELD,
        "DULBE"
    );
    assert_eq!(
        get_feat(&t, &c, fid::ERROR_RECOVERY, sel::CURRENT, 0),
        ok(25)
    );
    assert_eq!(
        get_feat(&t, &c, fid::ERROR_RECOVERY, sel::DEFAULT, 0),
        ok(0)
    );

    assert_eq!(get_feat(&t, &c, fid::VOLATILE_WC, sel::CURRENT, 0), ok(1));
    assert_eq!(set_feat(&t, &c, fid::VOLATILE_WC, 1).0, Status::SUCCESS);
    assert_eq!(set_feat(&t, &c, fid::VOLATILE_WC, 0).0, INVALID_FIELD);
    assert_eq!(
        get_feat(&t, &c, fid::VOLATILE_WC, sel::SUPPORTED_CAPABILITIES, 0),
        ok(0)
    );

    assert_eq!(
        get_feat(&t, &c, fid::WRITE_ATOMICITY, sel::CURRENT, 0),
        ok(0)
    );
    assert_eq!(set_feat(&t, &c, fid::WRITE_ATOMICITY, 1).0, Status::SUCCESS);
    assert_eq!(
        get_feat(&t, &c, fid::WRITE_ATOMICITY, sel::CURRENT, 0),
        ok(1)
    );
    assert_eq!(
        get_feat(&t, &c, fid::WRITE_ATOMICITY, sel::SUPPORTED_CAPABILITIES, 0),
        ok(CAP_CHANGEABLE)
    );
}

#[test]
fn queues_aec_kato_profile_and_interrupts() {
    let t = target();
    let c = connect(&t, NQN);
    assert_eq!(
        get_feat(&t, &c, fid::NUM_QUEUES, sel::CURRENT, 0),
        ok(0x0007_0007)
    );
    assert_eq!(
        set_feat(&t, &c, fid::NUM_QUEUES, 0x0001_0001),
        ok(0x0001_0001)
    );
    assert_eq!(
        get_feat(&t, &c, fid::NUM_QUEUES, sel::CURRENT, 0),
        ok(0x0001_0001)
    );
    assert_eq!(
        get_feat(&t, &c, fid::NUM_QUEUES, sel::DEFAULT, 0),
        ok(0x0007_0007)
    );

    let aec = identify::OAES_NS_ATTR | identify::OAES_ANA_CHANGE | 0x1F;
    assert_eq!(
        set_feat(&t, &c, fid::ASYNC_EVENT_CONFIG, aec).0,
        Status::SUCCESS
    );
    assert_eq!(
        get_feat(&t, &c, fid::ASYNC_EVENT_CONFIG, sel::CURRENT, 0),
        ok(aec)
    );
    assert_eq!(
        set_feat(&t, &c, fid::ASYNC_EVENT_CONFIG, 1 << 9).0,
        INVALID_FIELD
    );
    assert_eq!(
        get_feat(&t, &c, fid::ASYNC_EVENT_CONFIG, sel::DEFAULT, 0),
        ok(0)
    );

    assert_eq!(set_feat(&t, &c, fid::KATO, 5000).0, Status::SUCCESS);
    assert_eq!(get_feat(&t, &c, fid::KATO, sel::CURRENT, 0), ok(5000));
    // A 1 s KATO (the multipath setups' floor) is taken as is.
    assert_eq!(set_feat(&t, &c, fid::KATO, 1000).0, Status::SUCCESS);
    assert_eq!(c.kato_ms(), 1000);
    assert_eq!(set_feat(&t, &c, fid::KATO, 5000).0, Status::SUCCESS);
    assert_eq!(get_feat(&t, &c, fid::KATO, sel::DEFAULT, 0), ok(0));

    assert_eq!(
        get_feat(&t, &c, fid::IO_COMMAND_SET_PROFILE, sel::CURRENT, 0),
        ok(0)
    );
    assert_eq!(
        set_feat(&t, &c, fid::IO_COMMAND_SET_PROFILE, 0).0,
        Status::SUCCESS
    );
    assert_eq!(
        set_feat(&t, &c, fid::IO_COMMAND_SET_PROFILE, 1).0,
        Status::cmd_specific(status::SC_IOCS_COMBINATION_REJECTED)
    );

    for f in [fid::IRQ_COALESCE, fid::IRQ_CONFIG] {
        assert_eq!(set_feat(&t, &c, f, 0).0, INVALID_FIELD);
        assert_eq!(get_feat(&t, &c, f, sel::CURRENT, 0).0, INVALID_FIELD);
    }
    // Reserved SEL values; nothing is saveable.
    assert_eq!(get_feat(&t, &c, fid::KATO, 4, 0).0, INVALID_FIELD);
    assert_eq!(get_feat(&t, &c, fid::KATO, 7, 0).0, INVALID_FIELD);
    let mut s = Sqe::new(admin_opc::SET_FEATURES, 2);
    s.cdw10 = u32::from(fid::KATO) | (1 << 31);
    assert_eq!(
        run(&t, &c, &s, &mut []).0,
        Status::cmd_specific(status::SC_FEATURE_NOT_SAVEABLE)
    );

    // Discovery controllers: AEC (discovery log change only) and KATO.
    let d = connect(&t, DISCOVERY_NQN);
    assert_eq!(
        set_feat(
            &t,
            &d,
            fid::ASYNC_EVENT_CONFIG,
            identify::OAES_DISC_LOG_CHANGE
        )
        .0,
        Status::SUCCESS
    );
    assert_eq!(
        set_feat(&t, &d, fid::ASYNC_EVENT_CONFIG, identify::OAES_NS_ATTR).0,
        INVALID_FIELD
    );
    for f in [
        fid::ARBITRATION,
        fid::POWER_MGMT,
        fid::TEMP_THRESHOLD,
        fid::NUM_QUEUES,
    ] {
        assert_eq!(get_feat(&t, &d, f, sel::CURRENT, 0).0, INVALID_FIELD);
    }
}

fn connect_data(hostnqn: &str, hostid: [u8; 16]) -> Vec<u8> {
    let mut b = ConnectData {
        hostid,
        cntlid: CNTLID_DYNAMIC,
        subnqn: NQN.into(),
        hostnqn: "x".into(),
    }
    .encode();
    b[512..768].fill(0);
    b[512..512 + hostnqn.len()].copy_from_slice(hostnqn.as_bytes());
    b.to_vec()
}

#[test]
fn connect_host_nqn_and_host_id() {
    let t = target();
    let cmd = connect_cmd();
    // An empty host NQN is not an NQN: refused, even on an allow-any-host subsystem.
    let e = crate::fabrics::connect(&t, &cmd, &connect_data("", [1; 16]), "peer:1", None)
        .err()
        .expect("refused");
    assert_eq!(
        e.status,
        Status::cmd_specific(status::SC_CONNECT_INVALID_PARAM)
    );
    assert_eq!(
        e.dw0,
        crate::fabrics::ipo_iattr(true, nvme_wire::fabrics::CONNECT_DATA_OFF_HOSTNQN)
    );
    // A zero host identifier is accepted, as Linux nvmet does.
    let c =
        crate::fabrics::connect(&t, &cmd, &connect_data(HOST, [0; 16]), "peer:1", None).unwrap();
    assert_eq!(c.hostid, [0; 16]);
}

//! Controller enable over raw TCP: every CC.CSS value on an I/O controller
//! and on the discovery controller, CAP/VS as a 1.4 host reads them, and the
//! Identify CNS values that go with CAP.CSS bit 43 (05h, 06h, 1Ch, and the
//! CSI descriptor of CNS 03h).

use fault_tests::*;
use nvme_wire::fabrics::{DISCOVERY_NQN, prop};
use nvme_wire::identify::{IDENTIFY_LEN, cns};
use nvme_wire::sqe::{Sqe, admin_opc};
use nvme_wire::status::{self, SCT_GENERIC};

/// CC with EN = 1, IOSQES = 6, IOCQES = 4 and the given CSS.
fn cc_with_css(css: u32) -> u64 {
    u64::from(
        prop::CC_EN
            | (css << prop::CC_CSS_SHIFT)
            | (prop::CC_IOSQES_NVM << prop::CC_IOSQES_SHIFT)
            | (prop::CC_IOCQES_NVM << prop::CC_IOCQES_SHIFT),
    )
}

/// Connects a fresh admin queue to `subnqn` (not enabled), sets CC with
/// `css` and returns the host and CSTS as read back.
fn enable_with_css(t: &TestTarget, subnqn: &str, css: u32) -> (Host, u32) {
    let mut h = t.host_ic(false);
    h.connect_admin_ok(subnqn, HOST_NQN, 0);
    let c = h.property_set(prop::CC, false, cc_with_css(css));
    assert_status(&c, 0, 0, &format!("Property Set CC with CSS {css:03b}"));
    let c = h.property_get(prop::CSTS, false);
    assert_status(&c, 0, 0, "Property Get CSTS");
    // CC reads back as written either way.
    let cc = h.property_get(prop::CC, false);
    assert_status(&cc, 0, 0, "Property Get CC");
    assert_eq!(
        u64::from(cc.dw0),
        cc_with_css(css),
        "CC reads back as written (CSS {css:03b})"
    );
    (h, c.dw0)
}

fn identify_sqe(h: &mut Host, cns: u8, nsid: u32, csi: u8) -> Sqe {
    let cid = h.next_cid();
    let mut s = Sqe::new(admin_opc::IDENTIFY, cid);
    s.nsid = nsid;
    s.cdw10 = u32::from(cns);
    s.cdw11 = u32::from(csi) << 24;
    s
}

fn identify(h: &mut Host, cns: u8, nsid: u32, csi: u8) -> (nvme_wire::cqe::Cqe, Vec<u8>) {
    let s = identify_sqe(h, cns, nsid, csi);
    let (c, b) = h.data_in(s, IDENTIFY_LEN as u32);
    if c.status.is_success() {
        assert_eq!(b.len(), IDENTIFY_LEN, "Identify CNS {cns:#x} returns 4 KiB");
    } else {
        assert!(b.is_empty(), "a failed Identify CNS {cns:#x} sent data");
    }
    (c, b)
}

#[test]
fn io_controller_enables_with_css_000_and_110_only() {
    let t = TestTarget::start();
    let mut healthy = t.healthy();
    healthy.verify();
    for css in 0..=7u32 {
        let (mut h, csts) = enable_with_css(&t, NQN_OPEN, css);
        let ok = css == prop::CC_CSS_NVM || css == prop::CC_CSS_ALL_IOCS;
        if ok {
            assert_eq!(
                csts & (prop::CSTS_RDY | prop::CSTS_CFS),
                prop::CSTS_RDY,
                "I/O controller, CSS {css:03b}: CSTS {csts:#x} should be RDY without CFS"
            );
            // Enabled for real: Identify Controller works and an I/O queue connects.
            let (c, _) = identify(&mut h, cns::CONTROLLER, 0, 0);
            assert_status(
                &c,
                0,
                0,
                &format!("Identify after enable with CSS {css:03b}"),
            );
            let mut io = t.host_ic(false);
            let c = io.connect_io(h.cntlid, 1, NQN_OPEN, HOST_NQN);
            assert_status(&c, 0, 0, &format!("I/O Connect after CSS {css:03b}"));
            io.cntlid = h.cntlid;
            let c = io.write(1, 100, &[css as u8; 512]);
            assert_status(&c, 0, 0, "write");
            let (c, d) = io.read(1, 100, 1);
            assert_status(&c, 0, 0, "read");
            assert_eq!(d, vec![css as u8; 512]);
        } else {
            assert_eq!(
                csts & (prop::CSTS_RDY | prop::CSTS_CFS),
                prop::CSTS_CFS,
                "I/O controller, CSS {css:03b}: CSTS {csts:#x} should be CFS without RDY"
            );
            // Not enabled: admin commands are a sequence error, I/O queues refused.
            let (c, _) = identify(&mut h, cns::CONTROLLER, 0, 0);
            assert_status(
                &c,
                SCT_GENERIC,
                status::SC_CMD_SEQ_ERROR,
                &format!("Identify on a controller that failed to enable (CSS {css:03b})"),
            );
            let mut io = t.host_ic(false);
            let c = io.connect_io(h.cntlid, 1, NQN_OPEN, HOST_NQN);
            assert_status(
                &c,
                SCT_GENERIC,
                status::SC_CMD_SEQ_ERROR,
                &format!("I/O Connect to a CFS controller (CSS {css:03b})"),
            );
        }
        healthy.verify();
    }
    healthy.verify();
}

#[test]
fn discovery_controller_enables_with_any_css() {
    let t = TestTarget::start();
    let mut healthy = t.healthy();
    for css in 0..=7u32 {
        let (mut h, csts) = enable_with_css(&t, DISCOVERY_NQN, css);
        assert_eq!(
            csts & (prop::CSTS_RDY | prop::CSTS_CFS),
            prop::CSTS_RDY,
            "discovery controller, CSS {css:03b}: CSTS {csts:#x} should be RDY"
        );
        let (c, b) = identify(&mut h, cns::CONTROLLER, 0, 0);
        assert_status(&c, 0, 0, &format!("discovery Identify, CSS {css:03b}"));
        // CNTRLTYPE (byte 111) = 2: discovery.
        assert_eq!(b[111], nvme_wire::identify::CNTRLTYPE_DISCOVERY);
    }
    healthy.verify();
}

#[test]
fn cap_and_vs_advertise_nvm_and_io_command_sets() {
    let t = TestTarget::start();
    for subnqn in [NQN_OPEN, DISCOVERY_NQN] {
        let mut h = t.host_ic(false);
        h.connect_admin_ok(subnqn, HOST_NQN, 0);
        // Readable before enable, as a host reads CAP first.
        let c = h.property_get(prop::CAP, true);
        assert_status(&c, 0, 0, "Property Get CAP");
        let cap = u64::from(c.dw0) | (u64::from(c.dw1) << 32);
        assert_ne!(
            cap & (1 << 37),
            0,
            "{subnqn}: CAP.CSS bit 37 (NVM), CAP {cap:#x}"
        );
        assert_ne!(
            cap & (1 << 43),
            0,
            "{subnqn}: CAP.CSS bit 43 (I/O command sets), CAP {cap:#x}"
        );
        assert_eq!(
            cap & (1 << 44),
            0,
            "{subnqn}: CAP.CSS bit 44 (admin only) not advertised"
        );
        let c = h.property_get(prop::VS, false);
        assert_status(&c, 0, 0, "Property Get VS");
        assert_eq!(c.dw0, 0x0001_0400, "{subnqn}: VS 1.4");
        h.enable();
        let c = h.property_get(prop::VS, false);
        assert_eq!(c.dw0, 0x0001_0400, "{subnqn}: VS 1.4 after enable");
    }
}

#[test]
fn identify_io_command_set_cns_values() {
    let t = TestTarget::start();
    let mut healthy = t.healthy();
    let mut h = t.admin(true);

    // CNS 1Ch: I/O Command Set data structure; entry 0 (8 bytes) has bit 0 (NVM).
    let (c, b) = identify(&mut h, cns::IO_COMMAND_SETS, 0, 0);
    assert_status(&c, 0, 0, "Identify CNS 1Ch");
    let v0 = u64::from_le_bytes(b[0..8].try_into().expect("8"));
    assert_eq!(
        v0 & 1,
        1,
        "CNS 1Ch entry 0 has the NVM command set, got {v0:#x}"
    );

    // CNS 05h (NVM-specific Identify Namespace) and 06h (NVM-specific
    // Identify Controller): CSI 0 succeeds, CSI 1 (Key Value) is not ours.
    let (c, _) = identify(&mut h, cns::CS_NAMESPACE, 1, 0);
    assert_status(&c, 0, 0, "Identify CNS 05h CSI 0");
    let (c, _) = identify(&mut h, cns::CS_CONTROLLER, 0, 0);
    assert_status(&c, 0, 0, "Identify CNS 06h CSI 0");
    for (cns, nsid) in [(cns::CS_NAMESPACE, 1u32), (cns::CS_CONTROLLER, 0)] {
        let (c, _) = identify(&mut h, cns, nsid, 1);
        assert_status(
            &c,
            SCT_GENERIC,
            status::SC_INVALID_FIELD,
            &format!("Identify CNS {cns:#x} CSI 1"),
        );
        assert!(c.status.dnr, "Invalid Field sets DNR");
    }

    // CNS 03h: the descriptor list includes CSI (NIDT 4, NIDL 1, value 0).
    let (c, b) = identify(&mut h, cns::NS_ID_DESCRIPTORS, 1, 0);
    assert_status(&c, 0, 0, "Identify CNS 03h");
    let mut off = 0;
    let mut csi = None;
    while off + 4 <= b.len() && b[off] != 0 {
        let (nidt, nidl) = (b[off], usize::from(b[off + 1]));
        assert!(off + 4 + nidl <= b.len(), "descriptor runs past the page");
        if nidt == 4 {
            assert!(csi.is_none(), "two CSI descriptors");
            csi = Some((nidl, b[off + 4]));
        }
        off += 4 + nidl;
    }
    assert_eq!(csi, Some((1, 0)), "CNS 03h CSI descriptor (NIDL 1, CSI 0)");

    // The admin queue and the other controller are still fine.
    let (c, _) = identify(&mut h, cns::CONTROLLER, 0, 0);
    assert_status(&c, 0, 0, "Identify Controller afterwards");
    healthy.verify();
}

//! A controller: the state one host's association holds across its queues.
//! Properties (CC/CSTS), keep-alive, features, async events, the error log.
//! Its queues may run on different reactors; everything here that changes
//! sits behind one mutex that only admin commands and Connects take.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use nvme_wire::fabrics::prop;
use nvme_wire::log_page::ErrorEntry;
use nvme_wire::reservation::ResvLogEntry;
use nvme_wire::status::{self, Status};
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};

use crate::subsystem::{Namespace, Subsystem};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreeReason {
    HostDisconnected,
    ConnectionClosed,
    KeepAliveTimeout(u32),
    /// The host did not finish DH-HMAC-CHAP in time.
    AuthTimeout(u32),
    Shutdown,
    ConnectionError,
}

impl std::fmt::Display for FreeReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FreeReason::HostDisconnected => write!(f, "host disconnected"),
            FreeReason::ConnectionClosed => write!(f, "connection closed"),
            FreeReason::KeepAliveTimeout(ms) => write!(f, "keep-alive timeout (KATO {ms} ms)"),
            FreeReason::AuthTimeout(ms) => {
                write!(f, "authentication not completed within {ms} ms")
            }
            FreeReason::Shutdown => write!(f, "shutdown"),
            FreeReason::ConnectionError => write!(f, "connection error"),
        }
    }
}

/// The subsystem a controller belongs to: an NVM subsystem or the discovery service.
pub enum CtrlKind {
    Io(Arc<Subsystem>),
    Discovery,
}

/// Per-controller I/O counters for the SMART log. Each queue adds to its own
/// `QueueStats`; the log sums them, so the I/O path never shares a cache line.
#[derive(Default)]
pub struct QueueStats {
    pub read_cmds: AtomicU64,
    pub write_cmds: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub media_errors: AtomicU64,
    /// Writes that passed (or are passing) the reservation check, and
    /// those of them that are over. Preempt and Abort reads `writes_started`
    /// of the preempted hosts' queues and waits until `writes_done` reaches
    /// it: ever-growing counters, so a busy host cannot starve the wait.
    pub writes_started: AtomicU64,
    pub writes_done: AtomicU64,
    /// Commands the queue holds now (written on every change; a gauge).
    pub depth: AtomicU64,
    /// Command capsules or host data with a bad data digest.
    pub digest_errors: AtomicU64,
}

pub const ERROR_LOG_SLOTS: usize = 64;
/// AERs a host may keep outstanding (AERL + 1).
pub const AER_LIMIT: usize = 4;

/// Async event to report: the AER completion's dword 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent(pub u32);

impl AsyncEvent {
    /// Notice: namespace attribute changed (log page 0x04).
    pub const NS_CHANGED: AsyncEvent = AsyncEvent(0x02 | (0x04 << 16));
    /// Notice: ANA change (log page 0x0C).
    pub const ANA_CHANGE: AsyncEvent = AsyncEvent(0x02 | (0x03 << 8) | (0x0C << 16));
    /// I/O command set specific: reservation log page available (log page 0x80).
    pub const RESV_LOG: AsyncEvent = AsyncEvent(0x06 | (0x80 << 16));
    /// Notice: discovery log changed (log page 0x70).
    pub const DISC_CHANGE: AsyncEvent = AsyncEvent(0x02 | (0xF0 << 8) | (0x70 << 16));
}

/// Feature values a host changes with Set Features (those not kept elsewhere in
/// `CtrlState`). Nothing is saveable: a new controller starts from `Default`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureValues {
    /// Arbitration (01h): AB, LPW, MPW, HPW as in CDW11 (reserved bits 7:3 clear).
    pub arbitration: u32,
    /// Power Management (02h): PS (always 0, NPSS is 0) and WH.
    pub power_mgmt: u32,
    /// Temperature Threshold (04h) for the composite temperature, in kelvin.
    pub over_temp_k: u16,
    pub under_temp_k: u16,
    /// Error Recovery (05h): TLER in 100 ms units (DULBE is not supported).
    pub tler: u16,
    /// Write Atomicity Normal (0Ah): DN.
    pub write_atomicity_dn: bool,
}

/// Default over temperature threshold: the Identify Controller WCTEMP (70 °C).
pub const DEFAULT_OVER_TEMP_K: u16 = 273 + 70;

impl Default for FeatureValues {
    fn default() -> Self {
        FeatureValues {
            // AB 111b: no arbitration burst limit; weights unused (round robin only).
            arbitration: 0b111,
            power_mgmt: 0,
            over_temp_k: DEFAULT_OVER_TEMP_K,
            under_temp_k: 0,
            tler: 0,
            write_atomicity_dn: false,
        }
    }
}

pub struct CtrlState {
    pub cc: u32,
    pub csts: u32,
    pub kato_ms: u32,
    /// KATO from the Connect command: Get Features KATO's default value.
    pub connect_kato_ms: u32,
    pub features: FeatureValues,
    pub async_event_config: u32,
    /// Granted I/O queues (Set Features Number of Queues), 0 until set.
    pub io_queues_granted: u16,
    /// qid -> connected.
    pub io_queues: Vec<bool>,
    pub error_count: u64,
    pub errors: VecDeque<ErrorEntry>,
    pub pending_events: VecDeque<AsyncEvent>,
    pub changed_ns: Vec<u32>,
    pub shutdown_requested: bool,
    /// Reservation Notification log (80h) entries not yet read, oldest first.
    pub resv_log: VecDeque<ResvLogEntry>,
    /// Log Page Count of the last entry made.
    pub resv_log_count: u64,
    /// Reservation Notification Mask (feature 81h) per NSID.
    pub resv_masks: HashMap<u32, u32>,
    /// A reservation AEN went out (or is queued) and the host has not yet
    /// read log page 80h with RAE cleared: no further one until it does.
    pub resv_aen_masked: bool,
    /// Notices (by their Async Event Configuration bit) sent and masked
    /// until the host reads their log page with RAE cleared.
    pub notices_masked: u32,
}

pub struct Controller {
    pub cntlid: u16,
    pub kind: CtrlKind,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    /// Queue depth of the admin queue from its Connect (sqsize + 1).
    pub admin_depth: u16,
    pub state: Mutex<CtrlState>,
    pub stats: Mutex<Vec<Arc<QueueStats>>>,
    /// Set once when the controller is torn down; every queue watches it.
    kill: watch::Sender<Option<FreeReason>>,
    /// Bumped by each controller reset (CC.EN 1 -> 0): I/O queues connected
    /// before it are gone (Base spec 3.7.2). I/O queues connect only to a
    /// ready controller, so this one load per command is also their CC.EN
    /// check.
    reset_gen: AtomicU64,
    /// Milliseconds since `epoch` of the last command, for traffic-based keep-alive.
    last_activity_ms: AtomicU64,
    epoch: Instant,
    /// Wakes the admin queue when an async event is queued.
    pub event_notify: Notify,
    pub created: Instant,
    /// Set by the first I/O queue Connect that brings another Host ID than
    /// the admin queue's, so that is logged once per controller, not per queue.
    pub other_hostid_seen: AtomicBool,
}

impl Controller {
    pub fn new(
        cntlid: u16,
        kind: CtrlKind,
        hostnqn: String,
        hostid: [u8; 16],
        kato_ms: u32,
        admin_depth: u16,
        max_io_queues: u16,
    ) -> Self {
        let now = Instant::now();
        Controller {
            cntlid,
            kind,
            hostnqn,
            hostid,
            admin_depth,
            state: Mutex::new(CtrlState {
                cc: 0,
                csts: 0,
                kato_ms,
                connect_kato_ms: kato_ms,
                features: FeatureValues::default(),
                async_event_config: 0,
                io_queues_granted: 0,
                io_queues: vec![false; usize::from(max_io_queues) + 1],
                error_count: 0,
                errors: VecDeque::new(),
                pending_events: VecDeque::new(),
                changed_ns: Vec::new(),
                shutdown_requested: false,
                resv_log: VecDeque::new(),
                resv_log_count: 0,
                resv_masks: HashMap::new(),
                resv_aen_masked: false,
                notices_masked: 0,
            }),
            stats: Mutex::new(Vec::new()),
            kill: watch::channel(None).0,
            reset_gen: AtomicU64::new(0),
            last_activity_ms: AtomicU64::new(0),
            epoch: now,
            event_notify: Notify::new(),
            other_hostid_seen: AtomicBool::new(false),
            created: now,
        }
    }

    pub fn subsystem(&self) -> Option<&Arc<Subsystem>> {
        match &self.kind {
            CtrlKind::Io(s) => Some(s),
            CtrlKind::Discovery => None,
        }
    }

    /// The subsystem's namespaces now (empty for discovery).
    pub fn namespaces(&self) -> Arc<[Namespace]> {
        match &self.kind {
            CtrlKind::Io(s) => s.namespaces(),
            CtrlKind::Discovery => Arc::new([]),
        }
    }

    pub fn subnqn(&self) -> &str {
        match &self.kind {
            CtrlKind::Io(s) => &s.nqn,
            CtrlKind::Discovery => nvme_wire::fabrics::DISCOVERY_NQN,
        }
    }

    pub fn is_discovery(&self) -> bool {
        matches!(self.kind, CtrlKind::Discovery)
    }

    pub fn enabled(&self) -> bool {
        self.state.lock().csts & prop::CSTS_RDY != 0
    }

    /// Which reset the controller is at (see `reset_gen`).
    pub fn reset_generation(&self) -> u64 {
        self.reset_gen.load(Ordering::Acquire)
    }

    pub fn watch_kill(&self) -> watch::Receiver<Option<FreeReason>> {
        self.kill.subscribe()
    }

    /// Tears the controller down once; later calls keep the first reason.
    pub fn kill(&self, reason: FreeReason) -> bool {
        self.kill.send_if_modified(|r| {
            if r.is_none() {
                *r = Some(reason);
                true
            } else {
                false
            }
        })
    }

    pub fn killed(&self) -> Option<FreeReason> {
        *self.kill.borrow()
    }

    pub fn touch(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.last_activity_ms.store(ms, Ordering::Relaxed);
    }

    /// Milliseconds since the host last showed it is alive.
    pub fn idle_ms(&self) -> u64 {
        let now = self.epoch.elapsed().as_millis() as u64;
        now.saturating_sub(self.last_activity_ms.load(Ordering::Relaxed))
    }

    pub fn kato_ms(&self) -> u32 {
        self.state.lock().kato_ms
    }

    pub fn register_queue_stats(&self) -> Arc<QueueStats> {
        let s = Arc::new(QueueStats::default());
        self.stats.lock().push(s.clone());
        s
    }

    pub fn record_error(&self, sqid: u16, cid: u16, st: Status, nsid: u32, lba: u64) {
        let mut s = self.state.lock();
        s.error_count += 1;
        let e = ErrorEntry {
            error_count: s.error_count,
            sqid,
            cid,
            status: st.to_field(),
            param_location: 0xFFFF,
            lba,
            nsid,
        };
        if s.errors.len() == ERROR_LOG_SLOTS {
            s.errors.pop_back();
        }
        s.errors.push_front(e);
    }

    pub fn queue_event(&self, ev: AsyncEvent) {
        self.state.lock().pending_events.push_back(ev);
        self.event_notify.notify_one();
    }

    /// A reservation notification for this host on `nsid`: unless masked
    /// (feature 81h), a log page 80h entry and, when it is the only one
    /// queued, the AEN that tells the host to read it. At most 255 entries
    /// wait; beyond that the oldest are dropped (the count shows the gap).
    pub fn note_reservation(&self, nsid: u32, log_type: u8, mask_bit: u32) {
        let mut s = self.state.lock();
        if s.resv_masks.get(&nsid).copied().unwrap_or(0) & mask_bit != 0 {
            return;
        }
        s.resv_log_count = s.resv_log_count.wrapping_add(1).max(1);
        let count = s.resv_log_count;
        if s.resv_log.len() == 255 {
            s.resv_log.pop_front();
        }
        s.resv_log.push_back(ResvLogEntry {
            count,
            log_type,
            available: 0,
            nsid,
        });
        drop(s);
        self.queue_reservation_event();
    }

    /// Queues the "reservation log page available" AEN unless one is
    /// outstanding (the event type stays masked until the log is read).
    pub fn queue_reservation_event(&self) {
        let mut s = self.state.lock();
        if s.resv_aen_masked {
            return;
        }
        s.resv_aen_masked = true;
        s.pending_events.push_back(AsyncEvent::RESV_LOG);
        drop(s);
        self.event_notify.notify_one();
    }

    /// Queues notice `ev` when the host enabled it (Async Event
    /// Configuration bit `aec_bit`) and it is not masked: once sent, the
    /// notice stays masked until its log page is read with RAE cleared
    /// (`unmask_notice`), so a burst of changes is one event.
    pub fn queue_notice(&self, ev: AsyncEvent, aec_bit: u32) {
        let mut s = self.state.lock();
        if s.async_event_config & aec_bit == 0 || s.notices_masked & aec_bit != 0 {
            return;
        }
        s.notices_masked |= aec_bit;
        s.pending_events.push_back(ev);
        drop(s);
        self.event_notify.notify_one();
    }

    /// The host read the notice's log page with RAE cleared.
    pub fn unmask_notice(&self, aec_bit: u32) {
        self.state.lock().notices_masked &= !aec_bit;
    }

    /// Records a namespace added or removed at run time in the Changed
    /// Namespace List log and, when the host enabled Namespace Attribute
    /// Notices (Set Features Async Event Configuration bit 8), queues the
    /// AEN that makes it rescan. More than 1024 changes collapse into the
    /// log's overflow entry FFFFFFFFh.
    pub fn note_namespace_changed(&self, nsid: u32) {
        let mut s = self.state.lock();
        if s.changed_ns.first() != Some(&u32::MAX) && !s.changed_ns.contains(&nsid) {
            if s.changed_ns.len() >= 1024 {
                s.changed_ns = vec![u32::MAX];
            } else {
                s.changed_ns.push(nsid);
            }
        }
        let enabled = s.async_event_config & nvme_wire::identify::OAES_NS_ATTR != 0;
        if enabled && !s.pending_events.contains(&AsyncEvent::NS_CHANGED) {
            s.pending_events.push_back(AsyncEvent::NS_CHANGED);
            drop(s);
            self.event_notify.notify_one();
        }
    }

    /// Property Get: CAP (8 bytes), VS, CC, CSTS (4 bytes).
    pub fn property_get(&self, offset: u32, size8: bool, cap: u64) -> Result<u64, Status> {
        let s = self.state.lock();
        match (offset, size8) {
            (prop::CAP, true) => Ok(cap),
            (prop::VS, false) => Ok(u64::from(prop::VS_1_4)),
            (prop::CC, false) => Ok(u64::from(s.cc)),
            (prop::CSTS, false) => Ok(u64::from(s.csts)),
            _ => Err(Status::generic(status::SC_INVALID_FIELD)),
        }
    }

    /// Whether CC may enable this controller: the checks Linux nvmet makes on
    /// CC.EN 0 -> 1. CAP says MPSMIN = MPSMAX = 4 KiB (MPS 0), AMS round robin
    /// only (CAP.AMS 0), CSS NVM (000b) or all I/O command sets (110b, CAP.CSS
    /// bit 43); 111b needs CAP.CSS bit 44, which we do not set. I/O controllers
    /// need 64-byte SQ and 16-byte CQ entries. A discovery controller has no I/O
    /// queues and no I/O command set, so its IOSQES/IOCQES/CSS are not checked.
    pub fn cc_valid_for_enable(&self, cc: u32) -> bool {
        let mps = (cc >> prop::CC_MPS_SHIFT) & 0xF;
        let ams = (cc >> prop::CC_AMS_SHIFT) & 0x7;
        if mps != 0 || ams != 0 {
            return false;
        }
        if self.is_discovery() {
            return true;
        }
        let iosqes = (cc >> prop::CC_IOSQES_SHIFT) & 0xF;
        let iocqes = (cc >> prop::CC_IOCQES_SHIFT) & 0xF;
        let css = (cc >> prop::CC_CSS_SHIFT) & 0x7;
        iosqes == prop::CC_IOSQES_NVM
            && iocqes == prop::CC_IOCQES_NVM
            && matches!(css, prop::CC_CSS_NVM | prop::CC_CSS_ALL_IOCS)
    }

    /// Property Set: only CC is writable. Enabling checks CC (see
    /// `cc_valid_for_enable`); a bad value sets CSTS.CFS, as a PCIe
    /// controller would.
    pub fn property_set(&self, offset: u32, size8: bool, value: u64) -> Result<(), Status> {
        if offset != prop::CC || size8 {
            return Err(Status::generic(status::SC_INVALID_FIELD));
        }
        let new = value as u32;
        let mut s = self.state.lock();
        let old = s.cc;
        s.cc = new;
        let en_old = old & prop::CC_EN != 0;
        let en_new = new & prop::CC_EN != 0;
        if en_new && !en_old {
            s.csts = if self.cc_valid_for_enable(new) {
                prop::CSTS_RDY
            } else {
                tracing::info!(
                    "controller {}: CC {:#x} not valid, CSTS.CFS set",
                    self.cntlid,
                    new
                );
                prop::CSTS_CFS
            };
        } else if !en_new && en_old {
            // Controller reset: not ready, shutdown state cleared, and the
            // I/O queues deleted: their QIDs may be connected again.
            s.csts = 0;
            s.io_queues.fill(false);
            self.reset_gen.fetch_add(1, Ordering::AcqRel);
        }
        let shn_old = (old >> prop::CC_SHN_SHIFT) & 3;
        let shn_new = (new >> prop::CC_SHN_SHIFT) & 3;
        if shn_new != 0 && shn_old == 0 {
            s.csts = (s.csts & !prop::CSTS_SHST_MASK) | prop::CSTS_SHST_COMPLETE;
            s.shutdown_requested = true;
        } else if shn_new == 0 && shn_old != 0 {
            s.csts &= !prop::CSTS_SHST_MASK;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctrl() -> Controller {
        Controller::new(1, CtrlKind::Discovery, "h".into(), [0; 16], 0, 32, 4)
    }

    #[test]
    fn enable_and_shutdown() {
        let c = ctrl();
        assert!(!c.enabled());
        c.property_set(prop::CC, false, 1 | (6 << 16) | (4 << 20))
            .unwrap();
        assert!(c.enabled());
        assert_eq!(c.property_get(prop::CSTS, false, 0).unwrap(), 1);
        c.property_set(prop::CC, false, 1 | (1 << 14) | (6 << 16) | (4 << 20))
            .unwrap();
        assert_eq!(c.property_get(prop::CSTS, false, 0).unwrap() & 0xC, 0x8);
        c.property_set(prop::CC, false, 0).unwrap();
        assert!(!c.enabled());
    }

    #[test]
    fn bad_property_access() {
        let c = ctrl();
        assert!(c.property_get(prop::CAP, false, 1).is_err());
        assert!(c.property_get(prop::CC, true, 1).is_err());
        assert!(c.property_get(0x40, false, 1).is_err());
        assert!(c.property_set(prop::CSTS, false, 1).is_err());
        assert_eq!(c.property_get(prop::CAP, true, 7).unwrap(), 7);
    }

    #[test]
    fn bad_page_size_sets_cfs() {
        let c = ctrl();
        c.property_set(prop::CC, false, 1 | (1 << 7)).unwrap();
        assert_eq!(
            c.property_get(prop::CSTS, false, 0).unwrap(),
            u64::from(prop::CSTS_CFS)
        );
    }

    fn io_ctrl() -> Controller {
        let sub = Arc::new(Subsystem::new(
            "nqn.a:s".into(),
            "S".into(),
            "M".into(),
            true,
            Vec::new(),
            Vec::new(),
        ));
        Controller::new(1, CtrlKind::Io(sub), "h".into(), [0; 16], 0, 32, 4)
    }

    /// CC with EN, the NVM queue entry sizes, and `css`.
    fn cc(css: u32) -> u64 {
        u64::from(prop::CC_EN | (css << prop::CC_CSS_SHIFT) | (6 << 16) | (4 << 20))
    }

    #[test]
    fn css_on_enable_for_io_and_discovery() {
        for css in 0..8u32 {
            let c = io_ctrl();
            c.property_set(prop::CC, false, cc(css)).unwrap();
            let ok = css == prop::CC_CSS_NVM || css == prop::CC_CSS_ALL_IOCS;
            let want = if ok { prop::CSTS_RDY } else { prop::CSTS_CFS };
            assert_eq!(
                c.property_get(prop::CSTS, false, 0).unwrap(),
                u64::from(want),
                "I/O controller, CSS {css:03b}"
            );
            assert_eq!(c.enabled(), ok);
            // A discovery controller has no I/O command set: any CSS enables it.
            let d = ctrl();
            d.property_set(prop::CC, false, cc(css)).unwrap();
            assert!(d.enabled(), "discovery controller, CSS {css:03b}");
        }
    }

    #[test]
    fn other_cc_fields_on_enable() {
        let bad = [
            (1u64 << prop::CC_MPS_SHIFT, "MPS 8 KiB"),
            (1 << prop::CC_AMS_SHIFT, "AMS weighted round robin"),
            (7 << prop::CC_AMS_SHIFT, "AMS vendor specific"),
        ];
        for (bits, what) in bad {
            for c in [io_ctrl(), ctrl()] {
                c.property_set(prop::CC, false, cc(0) | bits).unwrap();
                assert!(!c.enabled(), "{what}");
                assert_eq!(
                    c.property_get(prop::CSTS, false, 0).unwrap(),
                    u64::from(prop::CSTS_CFS)
                );
            }
        }
        // Queue entry sizes matter to I/O controllers only.
        let sizes = u64::from(prop::CC_EN);
        let c = io_ctrl();
        c.property_set(prop::CC, false, sizes | (7 << 16) | (4 << 20))
            .unwrap();
        assert!(!c.enabled());
        let c = io_ctrl();
        c.property_set(prop::CC, false, sizes | (6 << 16) | (5 << 20))
            .unwrap();
        assert!(!c.enabled());
        let d = ctrl();
        d.property_set(prop::CC, false, sizes).unwrap();
        assert!(d.enabled());
        // After CFS a reset (EN 0) and a good CC enable it.
        let c = io_ctrl();
        c.property_set(prop::CC, false, cc(7)).unwrap();
        c.property_set(prop::CC, false, 0).unwrap();
        assert_eq!(c.property_get(prop::CSTS, false, 0).unwrap(), 0);
        c.property_set(prop::CC, false, cc(6)).unwrap();
        assert!(c.enabled());
    }

    #[test]
    fn version_and_shutdown_edges() {
        let c = io_ctrl();
        assert_eq!(
            c.property_get(prop::VS, false, 0).unwrap(),
            u64::from(prop::VS_1_4)
        );
        c.property_set(prop::CC, false, cc(0)).unwrap();
        let shn = u64::from(1u32 << prop::CC_SHN_SHIFT);
        c.property_set(prop::CC, false, cc(0) | shn).unwrap();
        let csts = c.property_get(prop::CSTS, false, 0).unwrap() as u32;
        assert_eq!(csts & prop::CSTS_SHST_MASK, prop::CSTS_SHST_COMPLETE);
        // SHN back to 0 with EN still 1: no shutdown state any more.
        c.property_set(prop::CC, false, cc(0)).unwrap();
        let csts = c.property_get(prop::CSTS, false, 0).unwrap() as u32;
        assert_eq!(csts, prop::CSTS_RDY);
    }

    #[test]
    fn kill_keeps_first_reason() {
        let c = ctrl();
        assert!(c.kill(FreeReason::ConnectionClosed));
        assert!(!c.kill(FreeReason::Shutdown));
        assert_eq!(c.killed(), Some(FreeReason::ConnectionClosed));
    }
}

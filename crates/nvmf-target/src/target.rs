//! The target: its subsystems, listeners and live controllers.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use crate::ana::{AnaGroups, AnaState};
use crate::config::{ListenerConfig, TransportConfig};
use crate::controller::{AsyncEvent, Controller, FreeReason, QueueStats};
use crate::subsystem::{Namespace, NamespaceError, Subsystem};

pub struct Target {
    pub transport: TransportConfig,
    /// Transport counters for metrics.
    pub counters: crate::stats::TargetCounters,
    /// Swapped whole on change (drive exports come and go at run time);
    /// readers take a snapshot.
    subsystems: RwLock<Arc<[Arc<Subsystem>]>>,
    /// Bound listener addresses (the real ports when 0 was asked for).
    pub listeners: RwLock<Vec<ListenerConfig>>,
    controllers: Mutex<HashMap<u16, Arc<Controller>>>,
    /// Every live queue's write counters by host and subsystem. Kept apart
    /// from `controllers`: a controller leaves that map when its admin queue
    /// closes, while its I/O queues may still have writes on the devices.
    queues: Mutex<Vec<QueueEntry>>,
    /// The next dynamic controller ID to try and the range IDs come from.
    cntlids: Mutex<CntlidAlloc>,
    /// Discovery log generation counter, bumped when subsystems come or go.
    discovery_genctr: AtomicU64,
    /// ANA group states (the I/O path reads them), change count, ANATT.
    pub(crate) ana: AnaGroups,
    /// Other nodes' I/O portals, listed for cluster-wide subsystems.
    peer_portals: RwLock<Vec<PeerPortal>>,
    /// Told of every host connected and Connect refused (operator events).
    connect_observer: std::sync::OnceLock<Arc<dyn crate::ConnectObserver>>,
}

/// Another node's I/O portal: where a host reaches a cluster-wide
/// subsystem besides this node's own listeners.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PeerPortal {
    pub traddr: String,
    pub trsvcid: String,
}

struct CntlidAlloc {
    next: u16,
    min: u16,
    max: u16,
}

/// A controller ID range that cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "controller ID range {min}..={max} is invalid; use 1 <= min <= max <= 65519 (0xFFEF), disjoint per node"
)]
pub struct CntlidRangeError {
    pub min: u16,
    pub max: u16,
}

struct QueueEntry {
    hostid: [u8; 16],
    nqn: String,
    stats: std::sync::Weak<QueueStats>,
}

/// Controller IDs 0xFFF0..=0xFFFF are reserved.
const MAX_CNTLID: u16 = 0xFFEF;

impl Target {
    pub fn new(transport: TransportConfig, subsystems: Vec<Arc<Subsystem>>) -> Self {
        if (transport.max_transfer as usize)
            < crate::ana::host_ana_log_len(crate::subsystem::MAX_NSID)
        {
            // The Linux host would turn ANA (and so multipath failover) off.
            tracing::warn!(
                "max transfer {} B is below the {} B ANA log a Linux host reads in one command; \
                 it will disable ANA: use 16 KiB or more",
                transport.max_transfer,
                crate::ana::host_ana_log_len(crate::subsystem::MAX_NSID)
            );
        }
        Target {
            transport,
            counters: Default::default(),
            subsystems: RwLock::new(subsystems.into()),
            listeners: RwLock::new(Vec::new()),
            controllers: Mutex::new(HashMap::new()),
            queues: Mutex::new(Vec::new()),
            cntlids: Mutex::new(CntlidAlloc {
                next: 1,
                min: 1,
                max: MAX_CNTLID,
            }),
            discovery_genctr: AtomicU64::new(1),
            ana: AnaGroups::default(),
            peer_portals: RwLock::new(Vec::new()),
            connect_observer: std::sync::OnceLock::new(),
        }
    }

    /// Sets the observer of Connects (once; a second call is ignored).
    pub fn set_connect_observer(&self, o: Arc<dyn crate::ConnectObserver>) {
        let _ = self.connect_observer.set(o);
    }

    pub(crate) fn connect_observer(&self) -> Option<&Arc<dyn crate::ConnectObserver>> {
        self.connect_observer.get()
    }

    /// The current subsystems.
    pub fn subsystems(&self) -> Arc<[Arc<Subsystem>]> {
        self.subsystems.read().clone()
    }

    pub fn subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        self.subsystems
            .read()
            .iter()
            .find(|s| s.nqn == nqn)
            .cloned()
    }

    /// The configured TLS PSK `hostnqn` uses on `subnqn`. For the discovery
    /// NQN: its key on any subsystem (a host has one retained PSK; the
    /// identity's subsystem NQN still makes the TLS PSK differ).
    pub fn tls_psk(
        &self,
        hostnqn: &str,
        subnqn: &str,
    ) -> Option<nvme_wire::tls_psk::ConfiguredPsk> {
        let subs = self.subsystems();
        if subnqn == nvme_wire::fabrics::DISCOVERY_NQN {
            return subs.iter().find_map(|s| s.host_tls(hostnqn).cloned());
        }
        let s = subs.iter().find(|s| s.nqn == subnqn)?;
        s.host_tls(hostnqn).cloned()
    }

    pub fn discovery_genctr(&self) -> u64 {
        self.discovery_genctr.load(Ordering::Relaxed)
    }

    /// Adds a subsystem while the target runs (a drive export). Hosts see it
    /// in the discovery log from now on.
    pub fn add_subsystem(&self, sub: Arc<Subsystem>) -> Result<(), NamespaceError> {
        let mut w = self.subsystems.write();
        if w.iter().any(|s| s.nqn == sub.nqn) {
            return Err(NamespaceError::SubsystemExists(sub.nqn.clone()));
        }
        let mut v: Vec<_> = w.iter().cloned().collect();
        v.push(sub);
        *w = v.into();
        drop(w);
        self.discovery_changed();
        Ok(())
    }

    /// Removes a subsystem: its controllers are killed (their hosts see the
    /// connection end) and new Connects are refused. Returns it so the caller
    /// can wait for its namespaces' in-flight I/O.
    pub fn remove_subsystem(&self, nqn: &str) -> Result<Arc<Subsystem>, NamespaceError> {
        let sub = {
            let mut w = self.subsystems.write();
            let Some(pos) = w.iter().position(|s| s.nqn == nqn) else {
                return Err(NamespaceError::NoSuchSubsystem(nqn.to_string()));
            };
            let mut v: Vec<_> = w.iter().cloned().collect();
            let sub = v.remove(pos);
            *w = v.into();
            sub
        };
        self.discovery_changed();
        let ctrls: Vec<_> = self.controllers.lock().values().cloned().collect();
        for c in ctrls.iter().filter(|c| c.subnqn() == nqn) {
            self.remove_controller(c, FreeReason::Shutdown);
        }
        Ok(sub)
    }

    /// The discovery log changed: a new generation, and the Discovery Log
    /// Change notice to every discovery controller that enabled it.
    fn discovery_changed(&self) {
        self.discovery_genctr.fetch_add(1, Ordering::Relaxed);
        let ctrls: Vec<_> = self.controllers.lock().values().cloned().collect();
        for c in ctrls.iter().filter(|c| c.is_discovery()) {
            c.queue_notice(
                AsyncEvent::DISC_CHANGE,
                nvme_wire::identify::OAES_DISC_LOG_CHANGE,
            );
        }
    }

    /// Sets the other nodes' I/O portals. Cluster-wide subsystems are
    /// listed on each of them too; a different set is a discovery log change.
    pub fn set_peer_portals(&self, mut portals: Vec<PeerPortal>) {
        portals.sort();
        portals.dedup();
        {
            let mut w = self.peer_portals.write();
            if *w == portals {
                return;
            }
            *w = portals;
        }
        self.discovery_changed();
    }

    pub fn peer_portals(&self) -> Vec<PeerPortal> {
        self.peer_portals.read().clone()
    }

    /// Marks subsystem `nqn` cluster-wide (listed on the peer portals too);
    /// a change is a discovery log change when there are peers.
    pub fn set_cluster_wide(&self, nqn: &str, on: bool) -> Result<(), NamespaceError> {
        let sub = self
            .subsystem(nqn)
            .ok_or_else(|| NamespaceError::NoSuchSubsystem(nqn.to_string()))?;
        if sub.set_cluster_wide(on) != on && !self.peer_portals.read().is_empty() {
            self.discovery_changed();
        }
        Ok(())
    }

    /// Sets ANA group `grpid`'s state for every subsystem. A change bumps the
    /// ANA log change count and sends the ANA Change notice to the live
    /// controllers of the subsystems with a namespace in the group; the same
    /// state again does nothing. A group outside 1..=MAX_GROUPS is ignored.
    pub fn set_ana_state(&self, grpid: u32, state: AnaState) {
        if !AnaGroups::valid_group(grpid) {
            tracing::warn!(
                "ANA group {grpid} is out of range 1..={}; state {state:?} ignored",
                crate::ana::MAX_GROUPS
            );
            return;
        }
        if !self.ana.set(grpid, state) {
            return;
        }
        tracing::info!("ANA group {grpid} is now {state:?}");
        let subs = self.subsystems();
        let in_group = |nqn: &str| {
            subs.iter()
                .filter(|s| s.nqn == nqn)
                .any(|s| s.namespaces().iter().any(|n| n.ana_group == grpid))
        };
        let ctrls: Vec<_> = self.controllers.lock().values().cloned().collect();
        for c in ctrls
            .iter()
            .filter(|c| !c.is_discovery() && in_group(c.subnqn()))
        {
            c.queue_notice(AsyncEvent::ANA_CHANGE, nvme_wire::identify::OAES_ANA_CHANGE);
        }
    }

    /// The lease that lease-bound groups' accessible states hang on (the
    /// cluster's ownership lease); see [`crate::ana::AnaLease`].
    pub fn set_ana_lease(&self, lease: Option<Arc<dyn crate::ana::AnaLease>>) {
        self.ana.set_lease(lease);
    }

    /// Binds group `grpid` to the lease: while the lease has run out, the
    /// ANA log reports the group Inaccessible even if it was set Optimized.
    pub fn bind_ana_group_to_lease(&self, grpid: u32, on: bool) {
        self.ana.bind_to_lease(grpid, on);
    }

    /// Group `grpid`'s state as the ANA log reports it (Optimized until set).
    pub fn ana_state(&self, grpid: u32) -> AnaState {
        self.ana.state(grpid)
    }

    /// ANA Transition Time reported in Identify Controller (default 10 s;
    /// 0 is taken as 1).
    pub fn set_anatt(&self, secs: u8) {
        self.ana.set_anatt(secs);
    }

    /// Dynamic controller IDs come from `min..=max` only (nodes serving one
    /// subsystem need disjoint ranges: the Linux host refuses a second
    /// controller with an ID it already has in the subsystem).
    pub fn set_cntlid_range(&self, min: u16, max: u16) -> Result<(), CntlidRangeError> {
        if min == 0 || min > max || max > MAX_CNTLID {
            return Err(CntlidRangeError { min, max });
        }
        let mut a = self.cntlids.lock();
        a.min = min;
        a.max = max;
        a.next = a.next.clamp(min, max);
        Ok(())
    }

    /// Writes accepted from hosts whose registration a Preempt removed, on
    /// every namespace of every subsystem (see `NsReservations::stale_writes`).
    pub fn stale_write_audit(&self) -> u64 {
        let mut n = 0;
        for s in self.subsystems().iter() {
            n += s
                .namespaces()
                .iter()
                .map(|ns| ns.resv.stale_writes())
                .sum::<u64>();
        }
        n
    }

    /// Adds a namespace to a subsystem while hosts are connected; their
    /// controllers get the Namespace Attribute Changed event.
    pub fn add_namespace(&self, nqn: &str, ns: Namespace) -> Result<(), NamespaceError> {
        let sub = self
            .subsystem(nqn)
            .ok_or_else(|| NamespaceError::NoSuchSubsystem(nqn.to_string()))?;
        let nsid = ns.nsid;
        sub.insert_namespace(ns)?;
        self.notify_namespace_changed(nqn, nsid);
        Ok(())
    }

    /// Removes a namespace from a subsystem; returns it so the caller can
    /// close its device once in-flight commands are done with it.
    pub fn remove_namespace(&self, nqn: &str, nsid: u32) -> Result<Namespace, NamespaceError> {
        let sub = self
            .subsystem(nqn)
            .ok_or_else(|| NamespaceError::NoSuchSubsystem(nqn.to_string()))?;
        let ns = sub.take_namespace(nsid)?;
        self.notify_namespace_changed(nqn, nsid);
        Ok(ns)
    }

    /// A namespace's device changed size (a volume grew): the namespace
    /// takes the device's size and the hosts get the Namespace Attribute
    /// Changed event (the Linux host then re-reads its size by itself).
    /// Returns the old and new block counts.
    pub fn namespace_resized(&self, nqn: &str, nsid: u32) -> Result<(u64, u64), NamespaceError> {
        let sub = self
            .subsystem(nqn)
            .ok_or_else(|| NamespaceError::NoSuchSubsystem(nqn.to_string()))?;
        let r = sub.refresh_size(nsid)?;
        if r.0 != r.1 {
            self.notify_namespace_changed(nqn, nsid);
        }
        Ok(r)
    }

    fn notify_namespace_changed(&self, nqn: &str, nsid: u32) {
        let ctrls: Vec<_> = self.controllers.lock().values().cloned().collect();
        for c in ctrls.iter().filter(|c| c.subnqn() == nqn) {
            c.note_namespace_changed(nsid);
        }
    }

    /// Allocates a controller ID from the range (skipping IDs in use,
    /// wrapping) and registers the controller built with it. Returns None
    /// when all IDs of the range are in use.
    pub fn add_controller(&self, make: impl FnOnce(u16) -> Controller) -> Option<Arc<Controller>> {
        let mut map = self.controllers.lock();
        let mut a = self.cntlids.lock();
        for _ in 0..=(a.max - a.min) {
            let id = a.next;
            a.next = if id >= a.max { a.min } else { id + 1 };
            if let std::collections::hash_map::Entry::Vacant(slot) = map.entry(id) {
                let c = Arc::new(make(id));
                slot.insert(c.clone());
                return Some(c);
            }
        }
        None
    }

    pub fn controller(&self, cntlid: u16) -> Option<Arc<Controller>> {
        self.controllers.lock().get(&cntlid).cloned()
    }

    /// Kills and forgets a controller; logs once.
    pub fn remove_controller(&self, ctrl: &Controller, reason: FreeReason) {
        ctrl.kill(reason);
        let removed = self.controllers.lock().remove(&ctrl.cntlid).is_some();
        if removed {
            let reason = ctrl.killed().unwrap_or(reason);
            tracing::info!("controller {} freed: {}", ctrl.cntlid, reason);
        }
    }

    /// Registers a connected queue's counters. The entry lives as long as
    /// the queue holds them (its connection drains its I/O before letting go).
    pub fn register_queue(&self, hostid: [u8; 16], nqn: &str, stats: &Arc<QueueStats>) {
        let mut q = self.queues.lock();
        q.retain(|e| e.stats.strong_count() > 0);
        q.push(QueueEntry {
            hostid,
            nqn: nqn.to_string(),
            stats: Arc::downgrade(stats),
        });
    }

    /// The counters of every queue of host `hostid` on `nqn` that may still
    /// have writes on a device, including queues of controllers already freed.
    pub fn queues_of(&self, hostid: &[u8; 16], nqn: &str) -> Vec<Arc<QueueStats>> {
        self.queues
            .lock()
            .iter()
            .filter(|e| &e.hostid == hostid && e.nqn == nqn)
            .filter_map(|e| e.stats.upgrade())
            .collect()
    }

    /// The live controllers of host `hostid` on subsystem `nqn`.
    pub fn controllers_of(&self, hostid: &[u8; 16], nqn: &str) -> Vec<Arc<Controller>> {
        let map = self.controllers.lock();
        let mut v: Vec<_> = map
            .values()
            .filter(|c| &c.hostid == hostid && c.subnqn() == nqn)
            .cloned()
            .collect();
        v.sort_by_key(|c| c.cntlid);
        v
    }

    /// Their controller IDs (Reservation Report).
    pub fn controller_ids_of(&self, hostid: &[u8; 16], nqn: &str) -> Vec<u16> {
        self.controllers_of(hostid, nqn)
            .iter()
            .map(|c| c.cntlid)
            .collect()
    }

    /// Every live controller (discovery ones too), by controller ID.
    pub fn controllers(&self) -> Vec<Arc<Controller>> {
        let mut v: Vec<_> = self.controllers.lock().values().cloned().collect();
        v.sort_by_key(|c| c.cntlid);
        v
    }

    /// The host NQNs with a live I/O controller on subsystem `nqn` (sorted,
    /// each once): who would lose a namespace removed from it.
    pub fn hosts_connected(&self, nqn: &str) -> Vec<String> {
        let map = self.controllers.lock();
        let mut v: Vec<String> = map
            .values()
            .filter(|c| matches!(c.kind, crate::controller::CtrlKind::Io(_)) && c.subnqn() == nqn)
            .map(|c| c.hostnqn.clone())
            .collect();
        v.sort();
        v.dedup();
        v
    }

    pub fn controller_count(&self) -> usize {
        self.controllers.lock().len()
    }

    /// Kills every controller (target shutdown).
    pub fn kill_all(&self, reason: FreeReason) {
        let all: Vec<_> = self.controllers.lock().values().cloned().collect();
        for c in all {
            c.kill(reason);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::{AsyncEvent, CtrlKind};

    fn ns(nsid: u32) -> Namespace {
        let dev = Arc::new(blockdev::NullDevice::new(1 << 20, 512).unwrap());
        Namespace::new(nsid, dev, [nsid as u8; 16], [nsid as u8; 16])
    }

    #[test]
    fn subsystems_come_and_go_at_run_time() {
        let sub = |nqn: &str| {
            Arc::new(Subsystem::new(
                nqn.into(),
                "S".into(),
                "M".into(),
                false,
                vec!["h".into()],
                vec![ns(1)],
            ))
        };
        let t = Target::new(TransportConfig::default(), vec![sub("nqn.a:s")]);
        let g0 = t.discovery_genctr();
        t.add_subsystem(sub("nqn.a:drive")).unwrap();
        assert!(matches!(
            t.add_subsystem(sub("nqn.a:drive")),
            Err(NamespaceError::SubsystemExists(_))
        ));
        assert_eq!(t.subsystems().len(), 2);
        assert!(t.discovery_genctr() > g0);
        let s = t.subsystem("nqn.a:drive").unwrap();
        let c = t
            .add_controller(|id| {
                Controller::new(id, CtrlKind::Io(s), "h".into(), [0; 16], 0, 32, 4)
            })
            .unwrap();
        t.remove_subsystem("nqn.a:drive").unwrap();
        assert!(t.subsystem("nqn.a:drive").is_none());
        assert!(c.killed().is_some(), "its controllers end with it");
        assert_eq!(t.controller_count(), 0);
        assert!(t.remove_subsystem("nqn.a:drive").is_err());
    }

    fn io_ctrl(t: &Target, sub: &Arc<Subsystem>) -> Option<Arc<Controller>> {
        t.add_controller(|id| {
            Controller::new(id, CtrlKind::Io(sub.clone()), "h".into(), [0; 16], 0, 32, 4)
        })
    }

    #[test]
    fn controller_ids_come_from_the_range() {
        let s = Arc::new(Subsystem::new(
            "nqn.a:s".into(),
            "S".into(),
            "M".into(),
            true,
            Vec::new(),
            vec![ns(1)],
        ));
        let t = Target::new(TransportConfig::default(), vec![s.clone()]);
        for (min, max) in [(0, 5), (6, 5), (1, 0xFFF0), (0xFFF0, 0xFFFF)] {
            assert_eq!(
                t.set_cntlid_range(min, max),
                Err(CntlidRangeError { min, max })
            );
        }
        assert_eq!(
            io_ctrl(&t, &s).unwrap().cntlid,
            1,
            "default range starts at 1"
        );
        t.set_cntlid_range(0x100, 0x102).unwrap();
        let ids: Vec<u16> = (0..3).map(|_| io_ctrl(&t, &s).unwrap().cntlid).collect();
        assert_eq!(ids, [0x100, 0x101, 0x102]);
        // Full: Connect gets Controller Busy (see fabrics::connect_admin).
        assert!(io_ctrl(&t, &s).is_none());
        // A freed ID is reused; allocation wraps and skips IDs in use.
        let c = t.controller(0x101).unwrap();
        t.remove_controller(&c, FreeReason::HostDisconnected);
        assert_eq!(io_ctrl(&t, &s).unwrap().cntlid, 0x101);
        let c = t.controller(0x100).unwrap();
        t.remove_controller(&c, FreeReason::HostDisconnected);
        assert_eq!(io_ctrl(&t, &s).unwrap().cntlid, 0x100);
        // The top of the space is usable.
        t.set_cntlid_range(MAX_CNTLID, MAX_CNTLID).unwrap();
        assert_eq!(io_ctrl(&t, &s).unwrap().cntlid, MAX_CNTLID);
        assert!(io_ctrl(&t, &s).is_none());
    }

    #[test]
    fn discovery_changes_notify_discovery_controllers() {
        let s = Arc::new(Subsystem::new(
            "nqn.a:s".into(),
            "S".into(),
            "M".into(),
            true,
            Vec::new(),
            vec![ns(1)],
        ));
        let t = Target::new(TransportConfig::default(), vec![s.clone()]);
        let disc = |aec: u32| {
            let c = t
                .add_controller(|id| {
                    Controller::new(id, CtrlKind::Discovery, "h".into(), [0; 16], 0, 32, 4)
                })
                .unwrap();
            c.state.lock().async_event_config = aec;
            c
        };
        let on = disc(nvme_wire::identify::OAES_DISC_LOG_CHANGE);
        let off = disc(0);
        let io = io_ctrl(&t, &s).unwrap();
        io.state.lock().async_event_config = u32::MAX;
        let events = |c: &Controller| -> Vec<AsyncEvent> {
            c.state.lock().pending_events.drain(..).collect()
        };
        let peer = |a: &str| PeerPortal {
            traddr: a.into(),
            trsvcid: "4420".into(),
        };
        let g0 = t.discovery_genctr();
        t.set_peer_portals(vec![peer("10.0.0.2"), peer("10.0.0.3")]);
        assert_eq!(t.discovery_genctr(), g0 + 1);
        assert_eq!(events(&on), [AsyncEvent::DISC_CHANGE]);
        assert!(events(&off).is_empty());
        assert!(events(&io).is_empty());
        // The same set in another order: no change.
        t.set_peer_portals(vec![peer("10.0.0.3"), peer("10.0.0.2"), peer("10.0.0.2")]);
        assert_eq!(t.discovery_genctr(), g0 + 1);
        // Masked until the log is read with RAE clear.
        t.set_peer_portals(vec![peer("10.0.0.3")]);
        assert_eq!(t.discovery_genctr(), g0 + 2);
        assert!(events(&on).is_empty());
        on.unmask_notice(nvme_wire::identify::OAES_DISC_LOG_CHANGE);
        t.set_cluster_wide("nqn.a:s", true).unwrap();
        assert!(s.cluster_wide());
        assert_eq!(t.discovery_genctr(), g0 + 3);
        assert_eq!(events(&on), [AsyncEvent::DISC_CHANGE]);
        t.set_cluster_wide("nqn.a:s", true).unwrap();
        assert_eq!(t.discovery_genctr(), g0 + 3);
        assert!(t.set_cluster_wide("nqn.a:none", true).is_err());
        // Subsystems coming and going are changes too.
        on.unmask_notice(nvme_wire::identify::OAES_DISC_LOG_CHANGE);
        t.remove_subsystem("nqn.a:s").unwrap();
        assert_eq!(t.discovery_genctr(), g0 + 4);
        assert_eq!(events(&on), [AsyncEvent::DISC_CHANGE]);
    }

    #[test]
    fn runtime_namespaces_reach_controllers_as_events() {
        let sub = Arc::new(Subsystem::new(
            "nqn.a:s".into(),
            "S".into(),
            "M".into(),
            true,
            Vec::new(),
            vec![ns(1)],
        ));
        let t = Target::new(TransportConfig::default(), vec![sub.clone()]);
        let mk = |enable: bool| {
            let c = t
                .add_controller(|id| {
                    Controller::new(id, CtrlKind::Io(sub.clone()), "h".into(), [0; 16], 0, 32, 4)
                })
                .unwrap();
            if enable {
                c.state.lock().async_event_config = nvme_wire::identify::OAES_NS_ATTR;
            }
            c
        };
        let on = mk(true);
        let off = mk(false);
        let v0 = sub.ns_version();
        t.add_namespace("nqn.a:s", ns(7)).unwrap();
        assert!(sub.ns_version() > v0);
        assert_eq!(
            sub.namespaces().iter().map(|n| n.nsid).collect::<Vec<_>>(),
            [1, 7]
        );
        assert_eq!(
            on.state
                .lock()
                .pending_events
                .iter()
                .copied()
                .collect::<Vec<_>>(),
            [AsyncEvent::NS_CHANGED]
        );
        assert_eq!(on.state.lock().changed_ns, [7]);
        // Not enabled: logged, but no event.
        assert!(off.state.lock().pending_events.is_empty());
        assert_eq!(off.state.lock().changed_ns, [7]);

        assert!(matches!(
            t.add_namespace("nqn.a:s", ns(7)),
            Err(NamespaceError::NsidInUse { nsid: 7, .. })
        ));
        assert!(matches!(
            t.add_namespace("nqn.a:none", ns(2)),
            Err(NamespaceError::NoSuchSubsystem(_))
        ));
        assert!(matches!(
            t.add_namespace("nqn.a:s", ns(0)),
            Err(NamespaceError::NsidOutOfRange { .. })
        ));
        let gone = t.remove_namespace("nqn.a:s", 1).unwrap();
        assert_eq!(gone.nsid, 1);
        assert_eq!(on.state.lock().changed_ns, [7, 1]);
        // One pending event covers both changes until the host reads it.
        assert_eq!(on.state.lock().pending_events.len(), 1);
        assert!(matches!(
            t.remove_namespace("nqn.a:s", 1),
            Err(NamespaceError::NoSuchNamespace { nsid: 1, .. })
        ));
    }

    /// A device whose size the test sets (a volume that grows).
    struct Growing {
        inner: blockdev::NullDevice,
        blocks: std::sync::atomic::AtomicU64,
    }

    impl blockdev::BlockDevice for Growing {
        blockdev::forward_block_device!(self => self.inner, except [geometry]);
        fn geometry(&self) -> blockdev::Geometry {
            blockdev::Geometry {
                block_size: 512,
                num_blocks: self.blocks.load(std::sync::atomic::Ordering::Relaxed),
            }
        }
    }

    #[test]
    fn a_grown_device_grows_its_namespace_with_an_event() {
        let dev = Arc::new(Growing {
            inner: blockdev::NullDevice::new(1 << 30, 512).unwrap(),
            blocks: 2048.into(),
        });
        let sub = Arc::new(Subsystem::new(
            "nqn.a:s".into(),
            "S".into(),
            "M".into(),
            true,
            Vec::new(),
            vec![Namespace::new(3, dev.clone(), [3; 16], [3; 16]), ns(5)],
        ));
        let t = Target::new(TransportConfig::default(), vec![sub.clone()]);
        let c = t
            .add_controller(|id| {
                Controller::new(id, CtrlKind::Io(sub.clone()), "h".into(), [0; 16], 0, 32, 4)
            })
            .unwrap();
        c.state.lock().async_event_config = nvme_wire::identify::OAES_NS_ATTR;
        // The same size: no event.
        assert_eq!(t.namespace_resized("nqn.a:s", 3).unwrap(), (2048, 2048));
        assert!(c.state.lock().pending_events.is_empty());
        dev.blocks.store(8192, std::sync::atomic::Ordering::Relaxed);
        let v0 = sub.ns_version();
        assert_eq!(t.namespace_resized("nqn.a:s", 3).unwrap(), (2048, 8192));
        assert!(sub.ns_version() > v0, "queues reload the namespaces");
        assert_eq!(sub.namespace(3).unwrap().num_blocks, 8192);
        assert_eq!(sub.namespace(5).unwrap().num_blocks, ns(5).num_blocks);
        assert_eq!(c.state.lock().changed_ns, [3]);
        assert_eq!(
            c.state
                .lock()
                .pending_events
                .iter()
                .copied()
                .collect::<Vec<_>>(),
            [AsyncEvent::NS_CHANGED]
        );
        assert!(matches!(
            t.namespace_resized("nqn.a:s", 9),
            Err(NamespaceError::NoSuchNamespace { nsid: 9, .. })
        ));
    }
}

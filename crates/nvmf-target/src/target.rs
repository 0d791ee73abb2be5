//! The target: its subsystems, listeners and live controllers.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::config::{ListenerConfig, TransportConfig};
use crate::controller::{Controller, FreeReason};
use crate::subsystem::Subsystem;

pub struct Target {
    pub transport: TransportConfig,
    pub subsystems: Vec<Arc<Subsystem>>,
    /// Bound listener addresses (the real ports when 0 was asked for).
    pub listeners: RwLock<Vec<ListenerConfig>>,
    controllers: Mutex<HashMap<u16, Arc<Controller>>>,
    next_cntlid: Mutex<u16>,
    /// Discovery log generation counter; the configuration is static for now.
    pub discovery_genctr: u64,
}

/// Controller IDs 0xFFF0..=0xFFFF are reserved.
const MAX_CNTLID: u16 = 0xFFEF;

impl Target {
    pub fn new(transport: TransportConfig, subsystems: Vec<Arc<Subsystem>>) -> Self {
        Target {
            transport,
            subsystems,
            listeners: RwLock::new(Vec::new()),
            controllers: Mutex::new(HashMap::new()),
            next_cntlid: Mutex::new(1),
            discovery_genctr: 1,
        }
    }

    pub fn subsystem(&self, nqn: &str) -> Option<&Arc<Subsystem>> {
        self.subsystems.iter().find(|s| s.nqn == nqn)
    }

    /// Allocates a controller ID and registers the controller built with it.
    /// Returns None when all IDs are in use.
    pub fn add_controller(&self, make: impl FnOnce(u16) -> Controller) -> Option<Arc<Controller>> {
        let mut map = self.controllers.lock();
        let mut next = self.next_cntlid.lock();
        for _ in 0..MAX_CNTLID {
            let id = *next;
            *next = if id >= MAX_CNTLID { 1 } else { id + 1 };
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

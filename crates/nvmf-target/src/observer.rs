//! Who connects: an optional observer the target tells of every host that
//! gets a controller and every Connect it refuses (the node turns these into
//! operator events). Kept free of the node's types; called on the queue's
//! thread, so an observer must be quick and must not block.

/// A host got a controller on an I/O subsystem (admin queue Connect).
/// Discovery controllers are not reported: hosts make them all the time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostConnected {
    pub subnqn: String,
    pub hostnqn: String,
    pub cntlid: u16,
    /// The host's address as `ip:port`.
    pub peer: String,
}

/// A Connect the target refused, admin or I/O queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRefused {
    /// As sent (lossily decoded; empty when the data was short).
    pub subnqn: String,
    pub hostnqn: String,
    pub qid: u16,
    /// Why, in words (`host not allowed on this subsystem`, ...).
    pub reason: &'static str,
    /// The refusal was for a host NQN not in the subsystem's allowed list.
    pub not_allowed: bool,
    pub peer: String,
}

/// What the target calls; set with [`crate::Target::set_connect_observer`].
pub trait ConnectObserver: Send + Sync {
    fn host_connected(&self, c: &HostConnected);
    fn host_refused(&self, r: &HostRefused);
}

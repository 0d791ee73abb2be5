//! Remote drives: the drives other nodes export, used here as volume
//! members over NVMe/TCP (`nvmf_host::RemoteDevice`).
//!
//! A volume's owner holds a Write Exclusive - Registrants Only reservation on
//! every remote member, under a key derived from its host ID. Another node
//! that takes the volume over preempts that key and aborts its writes; from
//! then on this node's writes end in Reservation Conflict and the volume
//! fences itself. When a remote drive that had failed (its node died, its
//! link was cut) comes back, the owner claims it again and re-adds it through
//! the write-intent bitmap.

use std::sync::Arc;

use blockdev::BlockDevice;
use nvmf_host::ResvType;
use nvmf_host::remote::{LinkState, RemoteDevice, RemoteOptions};
use volume::MemberState;
use volume::superblock::Superblock;

use super::{Drive, Node, NodeError, NodeResult, NodeState};

/// The reservation type a volume owner holds on its members.
const OWNER_RTYPE: ResvType = ResvType::WriteExclusiveRegistrantsOnly;

impl Node {
    /// This node's reservation key: from its host ID, never zero.
    pub fn resv_key(&self) -> u64 {
        let id = self.cluster().host_id;
        u64::from_be_bytes(id[..8].try_into().expect("8 bytes")) | 1
    }

    pub(super) fn remote_options(&self, url: &str) -> RemoteOptions {
        let c = self.cluster();
        let r = c.remote;
        let mut o = RemoteOptions::default();
        o.host.hostnqn = c.host_nqn.clone();
        o.host.hostid = c.host_id;
        o.host.dhchap = c.dhchap.clone();
        o.host.tls = c.tls.clone().map(|key| nvmf_host::TlsKey {
            key,
            identity_version: 1,
        });
        o.kato = std::time::Duration::from_millis(u64::from(r.kato_ms));
        o.io_queues = r.queues;
        o.host.queue_depth = r.queue_depth;
        o.io_timeout = r.io_timeout;
        o.fail_after = r.fail_after;
        o.reactor_queues = r.reactor_queues;
        tracing::debug!("remote drive {url}: {o:?}");
        o
    }

    /// A new link to the remote drive at `url`, with this node's host
    /// identity and link settings (a drive opened, or a standby link).
    pub(crate) async fn dial(&self, url: &str) -> Result<Arc<RemoteDevice>, String> {
        RemoteDevice::connect(url, self.remote_options(url))
            .await
            .map(Arc::new)
            .map_err(|e| e.to_string())
    }

    /// Connects to a remote drive: `peer:drive` (through `[[peer]]`) or a
    /// `tcp://` URL. Errors say which drive and why.
    pub(crate) async fn connect_remote(&self, name: &str, url: Option<&str>) -> NodeResult<Drive> {
        let url = match url {
            Some(u) => u.to_string(),
            None => self
                .cluster()
                .resolve(name)
                .map_err(NodeError::BadRequest)?,
        };
        let dev = match self.take_live_standby(name, &url).await {
            Some(d) => {
                tracing::debug!("drive {name}: taken from the standby links");
                d
            }
            None => self
                .dial(&url)
                .await
                .map_err(|e| NodeError::Conflict(format!("drive {name} ({url}): {e}")))?,
        };
        let (metered, io) = super::drive::MeteredDevice::wrap(dev.clone());
        Ok(Drive {
            name: name.to_string(),
            backend: "remote".into(),
            dev: metered,
            io,
            failed: false,
            fresh: false,
            path: None,
            export: None,
            remote: Some(dev),
            from_config: false,
            spare: false,
        })
    }

    /// Opens the remote drives that `names` mention and the node does not
    /// know yet (`peer:drive` or URLs given to `volume create`).
    pub(crate) async fn open_named_remotes(
        self: &Arc<Self>,
        st: &mut NodeState,
        names: &[String],
    ) -> NodeResult<()> {
        for n in names {
            if st.drives.contains_key(n) || !(n.contains(':')) {
                continue;
            }
            st.check_not_assembling(n)?;
            let d = self.connect_remote(n, None).await?;
            tracing::info!("drive {n}: {}", d.dev.describe());
            if let Some(r) = &d.remote {
                self.watch_link(n, r);
            }
            st.drives.insert(n.clone(), d);
            self.save_remote_drives(st)?;
        }
        Ok(())
    }

    /// Runs `op`, a request that may open the remote drives in `names`. If
    /// it fails, the ones it opened and no volume uses are closed and
    /// forgotten again: a refused request changes nothing.
    pub(crate) async fn undo_remotes_on_err<T>(
        &self,
        names: &[String],
        op: impl std::future::Future<Output = NodeResult<T>>,
    ) -> NodeResult<T> {
        let before: std::collections::HashSet<String> =
            self.state.lock().await.drives.keys().cloned().collect();
        let out = op.await;
        if out.is_err() {
            let mut st = self.state.lock().await;
            let opened: Vec<String> = names
                .iter()
                .filter(|n| !before.contains(*n) && st.user_of(n).is_none())
                .filter(|n| st.drives.get(*n).is_some_and(|d| d.remote.is_some()))
                .cloned()
                .collect();
            for n in &opened {
                if let Some(d) = st.drives.remove(n) {
                    let _ = d.dev.shutdown();
                    tracing::info!("drive {n}: closed again (the request failed)");
                }
            }
            if !opened.is_empty()
                && let Err(e) = self.save_remote_drives(&st)
            {
                tracing::warn!("{e}");
            }
        }
        out
    }

    fn remote_drives_file(&self) -> Option<std::path::PathBuf> {
        self.exports_file
            .as_ref()
            .map(|f| f.with_file_name("remote-drives.json"))
    }

    /// Keeps the remote drives opened through the API (not declared in the
    /// TOML) in `state_dir/remote-drives.json`, so that their volumes are
    /// found again at the next start.
    pub(super) fn save_remote_drives(&self, st: &NodeState) -> NodeResult<()> {
        let Some(path) = self.remote_drives_file() else {
            return Ok(());
        };
        if self.etcd_managed() {
            return Ok(());
        }
        let list: std::collections::BTreeMap<&str, String> = st
            .drives
            .iter()
            .filter(|(_, d)| !d.from_config)
            .filter_map(|(n, d)| Some((n.as_str(), d.remote.as_ref()?.url().to_string())))
            .collect();
        let text = serde_json::to_string_pretty(&list).expect("plain data");
        super::write_atomic(&path, text.as_bytes()).map_err(|e| {
            NodeError::Internal(format!(
                "the drive is open, but saving {} failed: {e}; it will not be found at the next start",
                path.display()
            ))
        })
    }

    /// Takes the owner's reservation on every remote drive in `names`:
    /// registers this node's key, then acquires, or, with `takeover`,
    /// preempts the holder and aborts its commands. Without `takeover` a
    /// drive reserved by another node is refused, and nothing is claimed.
    pub(crate) async fn claim(
        &self,
        st: &NodeState,
        names: &[String],
        takeover: bool,
    ) -> NodeResult<()> {
        let remotes: Vec<(&str, &Arc<RemoteDevice>)> = names
            .iter()
            .filter_map(|n| Some((n.as_str(), st.drives.get(n)?.remote.as_ref()?)))
            .collect();
        self.claim_remotes(&remotes, takeover).await
    }

    /// [`Node::claim`] on drive handles, without the node's state (an
    /// assembly claims its members outside the lock).
    pub(crate) async fn claim_remotes(
        &self,
        remotes: &[(&str, &Arc<RemoteDevice>)],
        takeover: bool,
    ) -> NodeResult<()> {
        let key = self.resv_key();
        // Look before touching anything: a refused claim changes nothing.
        if !takeover {
            for (n, r) in remotes {
                let rep = r.report().await.map_err(|e| {
                    NodeError::Conflict(format!("drive {n}: reservation report: {e}"))
                })?;
                if let Some(holder) = rep.holder().map(|h| h.rkey)
                    && holder != key
                {
                    return Err(NodeError::Conflict(format!(
                        "drive {n} is reserved by another node (key {holder:#x}); it owns the volume. \
                         Take it over with --takeover only if that node is gone or must be deposed"
                    )));
                }
            }
        }
        // Every member at once (each claim is 3 round trips to its own
        // enclosure); the caller writes nothing before all of them are done.
        let claims = futures_util::future::join_all(
            remotes
                .iter()
                .map(|(n, r)| async move { (n, claim_one(r, key, takeover).await) }),
        )
        .await;
        for (n, r) in claims {
            r.map_err(|e| {
                NodeError::Conflict(format!("drive {n}: cannot take the reservation: {e}"))
            })?;
        }
        Ok(())
    }

    /// Gives up this node's reservation on the remote drives in `names`
    /// (volume deleted). Best effort: a drive that is gone keeps nothing.
    pub(crate) async fn unclaim(&self, st: &NodeState, names: &[String]) {
        self.unclaim_remotes(&remotes_of(st, names)).await;
    }

    /// [`Node::unclaim`] on drive handles, every drive at once.
    pub(crate) async fn unclaim_remotes(&self, remotes: &[(String, Arc<RemoteDevice>)]) {
        let key = self.resv_key();
        futures_util::future::join_all(remotes.iter().map(|(n, r)| async move {
            if let Err(e) = r.unregister(key).await {
                tracing::warn!("drive {n}: unregister: {e}");
            }
        }))
        .await;
    }

    /// Wipes the superblocks of remote drives `urls` that no volume here
    /// has open: a cluster delete finished on a node where the volume did
    /// not run, after its owner stopped between marking the delete and
    /// wiping. Each drive is dialled and its superblock read first (reads
    /// need no reservation): a drive whose superblock `ours` does not own
    /// holds another volume now and is left alone, untouched. Any other is
    /// claimed over whichever node held it (that owner is gone or deposed:
    /// its writes end there), wiped and let go, every drive at once. Best
    /// effort: returns the drives not wiped, each with why.
    pub(crate) async fn wipe_remotes(
        &self,
        urls: &[String],
        ours: impl Fn(&Superblock) -> bool,
    ) -> Vec<(String, String)> {
        let ours = &ours;
        let wipe = async |url: &String| -> Result<(), String> {
            let r = self.dial(url).await?;
            let dev: Arc<dyn BlockDevice> = r.clone();
            let head = super::read_head(&dev).await.map_err(|e| e.to_string())?;
            if let Ok(sb) = Superblock::decode(&head)
                && !ours(&sb)
            {
                return Err(format!(
                    "it holds volume {:?} now (uuid {}); left alone",
                    sb.name,
                    volume::superblock::uuid_string(&sb.uuid)
                ));
            }
            // Let go on every path once claimed: a key left registered
            // could still write under Registrants Only.
            let wiped = match self.claim_remotes(&[(url.as_str(), &r)], true).await {
                Ok(()) => super::wipe_head(&dev).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            self.unclaim_remotes(&[(url.clone(), r)]).await;
            wiped
        };
        let done = futures_util::future::join_all(urls.iter().map(wipe)).await;
        urls.iter()
            .zip(done)
            .filter_map(|(u, r)| Some((u.clone(), r.err()?)))
            .collect()
    }

    /// Follows a remote drive's link. When it comes back after its member
    /// was failed, the owner claims it again (its node may have restarted
    /// without the reservation) and re-adds it through the bitmap.
    /// One task per drive name: a drive opened again (a standby link
    /// taken back) replaces the task that followed it before.
    pub(crate) fn watch_link(self: &Arc<Self>, name: &str, r: &RemoteDevice) {
        let task = tokio::spawn(link_task(
            Arc::downgrade(self),
            name.to_string(),
            r.subscribe(),
        ));
        let old = self
            .link_watchers
            .lock()
            .insert(name.to_string(), task.abort_handle());
        if let Some(o) = old {
            o.abort();
        }
    }

    /// Stops following drive `name`'s link (parked as a standby link).
    pub(crate) fn unwatch_link(&self, name: &str) {
        if let Some(o) = self.link_watchers.lock().remove(name) {
            o.abort();
        }
    }

    /// At start: the TOML's remote drives. One that cannot be reached is
    /// left out with an error (its volume assembles degraded if it can).
    pub async fn open_configured_remotes(self: &Arc<Self>, specs: &[super::DriveSpec]) {
        let mut all: Vec<(String, Option<String>, bool)> = specs
            .iter()
            .filter(|d| d.backend == "remote")
            .map(|d| (d.name.clone(), d.url.clone(), true))
            .collect();
        if let Some(path) = self.remote_drives_file() {
            match std::fs::read_to_string(&path) {
                Ok(text) => {
                    match serde_json::from_str::<std::collections::BTreeMap<String, String>>(&text)
                    {
                        Ok(saved) => all.extend(
                            saved
                                .into_iter()
                                .filter(|(n, _)| !all.iter().any(|(m, _, _)| m == n))
                                .map(|(n, u)| (n, Some(u), false))
                                .collect::<Vec<_>>(),
                        ),
                        Err(e) => {
                            tracing::error!("{}: {e}; its drives are left out", path.display())
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::error!("{}: {e}; its drives are left out", path.display()),
            }
        }
        for (name, url, from_config) in all {
            match self.connect_remote(&name, url.as_deref()).await {
                Ok(mut drive) => {
                    drive.from_config = from_config;
                    let d = &drive;
                    tracing::info!("drive {name}: {}", d.dev.describe());
                    if let Some(r) = &d.remote {
                        self.watch_link(&name, r);
                    }
                    self.state.lock().await.drives.insert(name, drive);
                }
                Err(e) => tracing::error!(
                    "{e}; not reachable at start, so left out (a volume using it runs degraded)"
                ),
            }
        }
    }

    /// Re-adds remote drive `name` to its volume if its member failed
    /// (as `drive re-add` does: [`Node::re_add_member`]).
    async fn re_add_remote(self: &Arc<Self>, name: &str) {
        let mut st = self.state.lock().await;
        let Some((v, p)) = st.user_of(name).map(|(v, p)| (v.to_string(), p)) else {
            return;
        };
        let Some(vol) = st.volumes.get(&v).and_then(|e| e.on_drives()).cloned() else {
            return;
        };
        if vol.member_states()[p] != MemberState::Failed || vol.is_fenced() {
            return;
        }
        if let Err(e) = self.re_add_member(&mut st, name, false).await {
            tracing::warn!("volume {v}: drive {name} is back but not re-added: {e}");
        }
    }
}

/// The remote drives among `names`, by name (the handles outlive the lock).
pub(crate) fn remotes_of(st: &NodeState, names: &[String]) -> Vec<(String, Arc<RemoteDevice>)> {
    names
        .iter()
        .filter_map(|n| Some((n.clone(), st.drives.get(n)?.remote.clone()?)))
        .collect()
}

async fn link_task(
    node: std::sync::Weak<Node>,
    name: String,
    mut rx: tokio::sync::watch::Receiver<LinkState>,
) {
    let mut was_down = false;
    loop {
        let state = rx.borrow_and_update().clone();
        match state {
            LinkState::Connected => {
                if was_down {
                    tracing::info!("drive {name}: reachable again");
                    let Some(n) = node.upgrade() else { return };
                    n.re_add_remote(&name).await;
                }
                was_down = false;
            }
            LinkState::Down { .. } | LinkState::IdentityChanged { .. } => {
                if !was_down {
                    tracing::warn!("drive {name}: {}", link_text(&state));
                }
                was_down = true;
            }
            LinkState::Reconnecting { .. } => {}
            LinkState::Closed => break,
        }
        if rx.changed().await.is_err() {
            break;
        }
    }
    // The link is gone: this task's entry goes too, unless a newer task
    // follows a drive of the same name now.
    if let Some(n) = node.upgrade() {
        let me = tokio::task::id();
        let mut w = n.link_watchers.lock();
        if w.get(&name).is_some_and(|h| h.id() == me) {
            w.remove(&name);
        }
    }
}

/// Registers `key` (replacing whatever this host had) and holds the owner's
/// reservation; with `takeover`, preempts another holder and aborts its writes.
async fn claim_one(r: &RemoteDevice, key: u64, takeover: bool) -> Result<(), String> {
    r.register(key)
        .await
        .map_err(|e| format!("register: {e}"))?;
    let rep = r.report().await.map_err(|e| format!("report: {e}"))?;
    match rep.holder().map(|h| h.rkey) {
        Some(h) if h == key => Ok(()),
        None => r
            .acquire(key, OWNER_RTYPE)
            .await
            .map_err(|e| format!("acquire: {e}")),
        Some(h) if takeover => {
            tracing::warn!(
                "{}: preempting reservation key {h:#x} (and aborting its commands)",
                r.describe()
            );
            r.preempt_abort(key, h, OWNER_RTYPE)
                .await
                .map_err(|e| format!("preempt: {e}"))
        }
        Some(h) => Err(format!("held by key {h:#x}")),
    }
}

/// A link state in words, for logs and `drive list`.
pub(crate) fn link_text(s: &LinkState) -> String {
    match s {
        LinkState::Connected => "connected".into(),
        LinkState::Reconnecting { since } => {
            format!("reconnecting for {} ms", since.elapsed().as_millis())
        }
        LinkState::Down { since, why } => {
            format!("down for {} s: {why}", since.elapsed().as_secs())
        }
        LinkState::IdentityChanged { why } => format!("identity changed: {why}"),
        LinkState::Closed => "closed".into(),
    }
}

//! Finding volumes on drives: at start on every drive the node has, and on
//! request (`POST /v1/volumes/assemble`) from a list of drives, local or
//! remote. A volume's superblocks, bitmap and journal live on its members,
//! so any node that reaches the drives can assemble it; the reservation on
//! remote members says which node owns it.

use std::collections::BTreeMap;
use std::sync::Arc;

use blockdev::BlockDevice;
use volume::superblock::{Superblock, VolumeRole, uuid_string};
use volume::thin::{ThinError, ThinPool};
use volume::{Layout, MemberState, Volume};

use super::ops::VolumeInfo;
use super::scrub::SyncWhy;
use super::views::member_state_name;
use super::{
    Backing, Degraded, Node, NodeError, NodeResult, NodeState, Offline, VolumeEntry, read_head,
    wipe_head,
};
pub use crate::api_types::AssembleVolume;

/// Drives of one volume, by position, as their superblocks say.
#[derive(Clone)]
struct Found {
    newest: Superblock,
    chosen: BTreeMap<u16, String>,
    /// The generation of each chosen drive's superblock.
    generations: BTreeMap<u16, u64>,
    /// Assemble with force (`AssembleVolume::force`).
    force: bool,
}

impl Node {
    /// At start: reads every drive's superblock, groups drives by volume,
    /// and assembles each volume. A drive that lost its position to a newer
    /// one (it was replaced) is left alone, and wiped, with a warning. A
    /// volume that cannot be assembled (too many members failed or missing,
    /// members that disagree) is entered `offline` with the reason, in the
    /// log and the API: listed, deletable, not served; the others run. One
    /// owned by another node (its remote drives reserved) is left out.
    ///
    /// `exported` names the drives the TOML exports (JBOF): a volume found
    /// on them belongs to the node that assembles it over the fabric, not
    /// to this one, so it is neither assembled nor entered offline here
    /// (that would keep the drive from being exported).
    pub async fn assemble_found(self: &Arc<Self>, exported: &[String]) -> anyhow::Result<()> {
        let mut st = self.state.lock().await;
        let names: Vec<String> = st
            .drives
            .iter()
            .filter(|(n, d)| d.export.is_none() && !exported.contains(n))
            .map(|(n, _)| n.clone())
            .collect();
        let handles: BTreeMap<String, Handle> = names
            .iter()
            .map(|n| {
                let d = &st.drives[n];
                let h = Handle {
                    dev: d.dev.clone(),
                    remote: d.remote.clone(),
                };
                (n.clone(), h)
            })
            .collect();
        for f in group_by_volume(&handles, &names).await {
            let name = f.newest.name.clone();
            if let Err(e) = self.assemble_group(&mut st, f, false, true).await {
                tracing::error!("volume {name:?}: not assembled: {e}");
            }
        }
        self.open_waiting_pools(&mut st).await;
        Ok(())
    }

    /// Assembles the volume on `req.drives` (opening the remote ones), e.g.
    /// on a node that takes over a volume whose owner died.
    ///
    /// The node's lock is held only to set the drives aside and, at the
    /// end, to enter what was assembled: connecting the remote members
    /// (concurrently), reading their superblocks, claiming them and
    /// assembling run without it, so a slow member of one volume delays no
    /// other request. A request that fails closes the drives it opened.
    pub async fn assemble_volume(self: &Arc<Self>, req: AssembleVolume) -> NodeResult<VolumeInfo> {
        self.assemble_volume_with(req, None).await
    }

    /// [`Node::assemble_volume`]; with `degraded` (a takeover), members
    /// that do not answer within its wait, or that the cluster's record
    /// does not trust, are left out when the layout tolerates it
    /// (`degraded.rs`), and brought back by re-add when they answer.
    pub async fn assemble_volume_with(
        self: &Arc<Self>,
        req: AssembleVolume,
        degraded: Option<Degraded>,
    ) -> NodeResult<VolumeInfo> {
        let t0 = std::time::Instant::now();
        let mut r = self.reserve(&req).await?;
        let t_reserve = t0.elapsed();
        let unreachable = self
            .connect_missing(&mut r, degraded.as_ref().map(|d| d.wait))
            .await?;
        let t_connect = t0.elapsed();
        let handles = r.handles();
        let mut groups = group_by_volume(&handles, &req.drives).await;
        if let Some(only) = &req.only {
            groups.retain(|g| g.newest.name == *only);
        }
        let t_heads = t0.elapsed();
        groups.iter_mut().for_each(|g| g.force = req.force);
        let f = match groups.len() {
            1 => groups.remove(0),
            0 if !unreachable.is_empty() => {
                return Err(NodeError::Conflict(format!(
                    "no drive of {:?} answered with a volume superblock; unreachable: {}",
                    req.drives,
                    unreachable
                        .iter()
                        .map(|(d, why)| format!("{d} ({why})"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            0 => {
                return Err(NodeError::BadRequest(format!(
                    "no volume superblock on drives {:?}; they hold no volume",
                    req.drives
                )));
            }
            _ => {
                return Err(NodeError::BadRequest(format!(
                    "drives {:?} hold {} different volumes ({}); assemble one at a time",
                    req.drives,
                    groups.len(),
                    groups
                        .iter()
                        .map(|g| g.newest.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        };
        // Look before any write: a drive of another (offline) volume is
        // refused, and so is a degraded takeover beyond the tolerance.
        let uuid = uuid_string(&f.newest.uuid);
        parked_offline(&*self.state.lock().await, &req.drives, &uuid)?;
        let mut f = f;
        let mut left_out: Vec<String> = unreachable.iter().map(|(d, _)| d.clone()).collect();
        if let Some(d) = &degraded {
            let out = d.check(&f.newest, &f.chosen, &f.generations, &unreachable)?;
            for p in out.distrusted {
                if let Some(name) = f.chosen.remove(&p) {
                    tracing::warn!(
                        "volume {:?}: drive {name} (position {p}) is left out: the cluster's \
                         record does not trust it; it comes back through re-add",
                        f.newest.name
                    );
                    left_out.push(name);
                }
            }
            if !unreachable.is_empty() {
                tracing::warn!(
                    "volume {:?}: taken over degraded; not reachable: {}",
                    f.newest.name,
                    unreachable
                        .iter()
                        .map(|(d, why)| format!("{d} ({why})"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        // a pool opens at once when the node runs its extents already (a
        // cluster takeover assembles them first)
        let extents = extent_devices(&*self.state.lock().await);
        let opened = self
            .open_group(&handles, f, req.takeover, &extents)
            .await
            .map_err(AssembleError::into_inner)?;
        let t_opened = t0.elapsed();

        let mut st = self.state.lock().await;
        let offline = parked_offline(&st, &req.drives, &uuid)?;
        if let Some(x) = &req.export {
            self.check_export_free(x)?;
        }
        let new: Vec<String> = r.opened.iter().map(|d| d.name.clone()).collect();
        for d in std::mem::take(&mut r.opened) {
            if let Some(rd) = &d.remote {
                self.watch_link(&d.name, rd);
            }
            st.drives.insert(d.name.clone(), d);
        }
        if !new.is_empty()
            && let Err(e) = self.save_remote_drives(&st)
        {
            for n in &new {
                if let Some(d) = st.drives.remove(n) {
                    let _ = d.dev.shutdown();
                }
            }
            return Err(e);
        }
        // The volume's own offline entry gives way to the assembly.
        let parked: Vec<VolumeEntry> = offline
            .iter()
            .filter_map(|v| st.volumes.remove(v))
            .collect();
        let name = self.enter_group(&mut st, opened);
        self.open_waiting_pools(&mut st).await;
        r.release();
        for d in left_out {
            self.spawn_rejoin(name.clone(), uuid.clone(), d);
        }
        if let Some(p) = parked.first() {
            if let Some(e) = st.volumes.get_mut(&name) {
                e.from_config |= p.from_config;
            }
            tracing::info!("volume {name}: was offline ({}); now assembled", p.name);
        }
        if let Some(x) = req.export {
            let e = st.volumes.get_mut(&name).expect("just assembled");
            self.export_entry(e, x)?;
            self.save_exports(&st)?;
        }
        tracing::debug!(
            "volume {name}: assembly steps: reserve {t_reserve:?}, connect {:?}, \
             superblock heads {:?}, claim+assemble {:?}, enter {:?}",
            t_connect - t_reserve,
            t_heads - t_connect,
            t_opened - t_heads,
            t0.elapsed() - t_opened
        );
        Ok(st.volume_info(&name).expect("exists"))
    }

    /// Under the lock: checks that `req.drives` are free (or in this
    /// volume's own offline entry) and sets them aside for the request.
    async fn reserve(&self, req: &AssembleVolume) -> NodeResult<Reserved> {
        let st = self.state.lock().await;
        let mut present = BTreeMap::new();
        let mut missing = Vec::new();
        for d in &req.drives {
            st.check_not_assembling(d)?;
            match st.drives.get(d) {
                Some(dr) => {
                    present.insert(
                        d.clone(),
                        Handle {
                            dev: dr.dev.clone(),
                            remote: dr.remote.clone(),
                        },
                    );
                }
                None if d.contains(':') => missing.push(d.clone()),
                None => {
                    return Err(NodeError::BadRequest(format!(
                        "drive {} does not exist; list the drives with `flashpool drive list`",
                        crate::echo::Echo(d)
                    )));
                }
            }
            if let Some((v, _)) = st.user_of(d)
                && st.volumes[v].offline().is_none()
            {
                return Err(NodeError::Conflict(format!(
                    "drive {d} is already in volume {v} on this node"
                )));
            }
        }
        if let Some(x) = &req.export {
            self.check_export_free(x)?;
        }
        st.assembling.lock().extend(req.drives.iter().cloned());
        Ok(Reserved {
            set: st.assembling.clone(),
            names: req.drives.clone(),
            present,
            missing,
            opened: Vec::new(),
        })
    }

    /// Connects the reserved remote drives the node does not have yet, all
    /// at once: each may take up to the connect timeout. With `wait` (a
    /// takeover), a drive that fails or does not answer within it is
    /// returned with the reason instead of failing the request.
    async fn connect_missing(
        self: &Arc<Self>,
        r: &mut Reserved,
        wait: Option<std::time::Duration>,
    ) -> NodeResult<Vec<(String, String)>> {
        let mut tasks = tokio::task::JoinSet::new();
        for (i, n) in r.missing.iter().enumerate() {
            let (node, n) = (self.clone(), n.clone());
            tasks.spawn(async move {
                let res = match wait {
                    Some(w) => tokio::time::timeout(w, node.connect_remote(&n, None))
                        .await
                        .unwrap_or_else(|_| {
                            Err(NodeError::Unavailable(format!(
                                "drive {n}: no answer in {} ms",
                                w.as_millis()
                            )))
                        }),
                    None => node.connect_remote(&n, None).await,
                };
                (i, n, res)
            });
        }
        let mut first_err: Option<(usize, NodeError)> = None;
        let mut unreachable = Vec::new();
        while let Some(res) = tasks.join_next().await {
            match res {
                Ok((_, _, Ok(d))) => {
                    tracing::info!("drive {}: {}", d.name, d.dev.describe());
                    r.opened.push(d);
                }
                Ok((_, n, Err(e))) if wait.is_some() => unreachable.push((n, e.to_string())),
                Ok((i, _, Err(e))) => {
                    if first_err.as_ref().is_none_or(|(j, _)| i < *j) {
                        first_err = Some((i, e));
                    }
                }
                Err(e) => return Err(NodeError::Internal(format!("connecting a drive: {e}"))),
            }
        }
        unreachable.sort();
        match first_err {
            Some((_, e)) => Err(e),
            None => Ok(unreachable),
        }
    }

    /// Claims the remote members, assembles, opens a thin pool on it, and
    /// enters the volume; resumes an interrupted rebuild. Returns its name.
    /// With `offline_on_failure`, a volume that cannot be assembled (or its
    /// pool opened) is entered offline with the reason (the error still
    /// comes back).
    async fn assemble_group(
        self: &Arc<Self>,
        st: &mut NodeState,
        f: Found,
        takeover: bool,
        offline_on_failure: bool,
    ) -> NodeResult<String> {
        let found = f.clone();
        let out = self.assemble_group_inner(st, f, takeover).await;
        if let Err(AssembleError::Volume(e)) = &out
            && offline_on_failure
        {
            let (name, entry) = offline_entry(st, &found, e.to_string());
            tracing::error!(
                "volume {name}: offline (not assembled, not served): {}; \
                 its drives are kept as they are",
                e
            );
            st.volumes.insert(name, entry);
        }
        out.map_err(AssembleError::into_inner)
    }

    async fn assemble_group_inner(
        self: &Arc<Self>,
        st: &mut NodeState,
        f: Found,
        takeover: bool,
    ) -> Result<String, AssembleError> {
        let handles: BTreeMap<String, Handle> = f
            .chosen
            .values()
            .filter_map(|n| {
                let d = st.drives.get(n)?;
                Some((
                    n.clone(),
                    Handle {
                        dev: d.dev.clone(),
                        remote: d.remote.clone(),
                    },
                ))
            })
            .collect();
        let extents = extent_devices(st);
        let opened = self.open_group(&handles, f, takeover, &extents).await?;
        Ok(self.enter_group(st, opened))
    }

    /// Claims the remote members, assembles and opens a thin pool on the
    /// volume: the slow part, on drive handles only (no node state).
    async fn open_group(
        &self,
        handles: &BTreeMap<String, Handle>,
        f: Found,
        takeover: bool,
        extents: &[Arc<dyn BlockDevice>],
    ) -> Result<Opened, AssembleError> {
        let Found {
            newest,
            chosen,
            force,
            ..
        } = f;
        let drive_names: Vec<String> = chosen.values().cloned().collect();
        // Before any write: the superblocks are written at assembly.
        let remotes: Vec<(&str, &Arc<nvmf_host::remote::RemoteDevice>)> = drive_names
            .iter()
            .filter_map(|n| Some((n.as_str(), handles.get(n)?.remote.as_ref()?)))
            .collect();
        let t0 = std::time::Instant::now();
        self.claim_remotes(&remotes, takeover)
            .await
            .map_err(AssembleError::Claim)?;
        let t_claim = t0.elapsed();
        let members: Vec<Arc<dyn BlockDevice>> =
            chosen.values().map(|d| handles[d].dev.clone()).collect();
        let assembled = if force {
            Volume::assemble_force(members.clone())
                .await
                .map(|(v, r)| (v, Some(r)))
        } else if takeover {
            // A takeover serves first: a mirror's crash resync runs after
            // (`enter_group` starts it), its other copies Resyncing till then.
            Volume::assemble_deferring_resync(members.clone())
                .await
                .map(|(v, _)| (v, None))
        } else {
            Volume::assemble(members.clone()).await.map(|v| (v, None))
        };
        let (vol, forced) = match assembled {
            Ok(v) => v,
            Err(e) => {
                let hint = match &e {
                    volume::VolumeError::TooManyFailed { .. }
                    | volume::VolumeError::Stale { .. } => {
                        super::recovery::force_hint(&members, &drive_names).await
                    }
                    _ => String::new(),
                };
                return Err(AssembleError::Volume(NodeError::Conflict(format!(
                    "volume {:?} on drives {drive_names:?}: {e}{hint}",
                    newest.name
                ))));
            }
        };
        tracing::debug!(
            "volume {}: claim {t_claim:?}, volume assembly {:?}",
            newest.name,
            t0.elapsed() - t_claim
        );
        if let Err(why) = self.unlock_volume(&vol) {
            // Locked, it would serve nothing; it never serves ciphertext.
            return Err(AssembleError::Volume(NodeError::Conflict(format!(
                "volume {:?} on drives {drive_names:?}: {why}",
                newest.name
            ))));
        }
        tracing::info!(
            "volume {}: assembled on {drive_names:?}{}",
            vol.name(),
            if vol.is_encrypted() {
                " (encrypted, key unwrapped)"
            } else {
                ""
            }
        );
        let as_dev: Arc<dyn BlockDevice> = Arc::new(vol.clone());
        let (mut pool, mut extent, mut pool_waiting) = (None, None, None);
        // Block 0 is read as pool metadata only where the superblocks say
        // the volume holds some (or, made before roles, where it looks so):
        // on a plain volume it is the hosts' data.
        let role = vol.role();
        let pool_role = match role {
            VolumeRole::ThinPool => true,
            VolumeRole::Unknown => ThinPool::is_pool(&as_dev).await,
            VolumeRole::Plain | VolumeRole::PoolExtent => false,
        };
        if pool_role {
            match ThinPool::open_with_extents(as_dev, extents).await {
                Ok(p) => pool = Some(p),
                // Its extents are other volumes, perhaps not assembled yet.
                Err(e @ ThinError::MissingExtent(_)) => {
                    tracing::info!("volume {}: its thin pool waits: {e}", vol.name());
                    pool_waiting = Some(e.to_string());
                }
                Err(e) => {
                    return Err(AssembleError::Volume(NodeError::Internal(format!(
                        "volume {}: its thin pool: {e}",
                        vol.name()
                    ))));
                }
            }
        } else if matches!(role, VolumeRole::PoolExtent | VolumeRole::Unknown) {
            extent = ThinPool::extent_of(&as_dev).await;
            if extent.is_none() && role == VolumeRole::PoolExtent {
                // Made for an expansion that was cut before the pool took it.
                extent = Some(volume::thin::ExtentLabel {
                    pool: String::new(),
                    extent: String::new(),
                });
            }
        }
        Ok(Opened {
            members: newest.members.len(),
            chosen,
            vol,
            forced,
            pool,
            extent,
            pool_waiting,
        })
    }

    /// Enters an assembled volume (and its thin volumes) in the node's
    /// state; resumes an interrupted rebuild. Returns its name.
    fn enter_group(self: &Arc<Self>, st: &mut NodeState, o: Opened) -> String {
        let Opened {
            members: n,
            chosen,
            vol,
            forced,
            pool,
            extent,
            pool_waiting,
        } = o;
        let mut name = vol.name();
        if name.is_empty() || st.volumes.contains_key(&name) {
            name = format!("vol-{}", &vol.uuid()[..8]);
        }
        let drives = (0..n)
            .map(|p| {
                chosen
                    .get(&(p as u16))
                    .cloned()
                    .unwrap_or_else(|| "-".into())
            })
            .collect();
        for d in chosen.values() {
            if let Some(dr) = st.drives.get_mut(d) {
                dr.fresh = false;
            }
        }
        // A rebuild cut short, or re-added members (or a takeover's
        // deferred crash resync) whose stale regions wait to be copied.
        let resume = vol.member_states().iter().any(|s| {
            matches!(
                s,
                MemberState::Rebuilding { .. } | MemberState::Resyncing { .. }
            )
        });
        // A takeover's deferred crash resync of a parity layout.
        let unsynced = (vol.unsynced_regions() > 0).then(|| vol.clone());
        if let Some(p) = &pool {
            enter_thins(st, &name, p);
        }
        let mut entry = VolumeEntry::new(&name, Backing::Drives { vol, pool }, drives, None);
        entry.extent = extent;
        entry.pool_waiting = pool_waiting;
        if let Some(rep) = forced {
            let info = super::ForcedInfo::new(&rep, &entry.drives);
            tracing::warn!("volume {name}: assembled with --force: {}", info.message);
            for m in &info.members {
                if let Some(d) = st.drives.get_mut(&m.drive) {
                    d.failed = false;
                }
            }
            entry.forced = Some(info);
            st.volumes.insert(name.clone(), entry);
            self.note_failed_drives(st);
        } else {
            st.volumes.insert(name.clone(), entry);
        }
        if resume {
            tracing::info!("volume {name}: resuming the rebuild or resync that was interrupted");
            self.spawn_rebuild(st, &name);
        }
        if let Some(vol) = unsynced {
            self.spawn_sync(st, &name, &vol, SyncWhy::CrashResync);
        }
        name
    }
}

/// Enters the thin volumes of pool `name` (on assembly, or once its
/// extents are there).
fn enter_thins(st: &mut NodeState, name: &str, p: &ThinPool) {
    for t in p.volumes() {
        let Some(tv) = p.volume(&t.name) else {
            continue;
        };
        if st.volumes.contains_key(&t.name) {
            tracing::warn!(
                "thin volume {} in pool {name}: another volume has that name; not served",
                t.name
            );
            continue;
        }
        tracing::info!("thin volume {} found in pool {name}", t.name);
        let backing = Backing::Thin {
            pool: name.to_string(),
            tv,
        };
        st.volumes.insert(
            t.name.clone(),
            VolumeEntry::new(&t.name, backing, Vec::new(), None),
        );
    }
}

impl Node {
    /// Opens the thin pools that wait for extents, with every extent the
    /// node has assembled: at start after all volumes, and after each
    /// assembly on request.
    pub(super) async fn open_waiting_pools(&self, st: &mut NodeState) {
        let waiting: Vec<String> = st
            .volumes
            .iter()
            .filter(|(_, e)| e.pool_waiting.is_some())
            .map(|(n, _)| n.clone())
            .collect();
        for name in waiting {
            let Some(vol) = st.volumes.get(&name).and_then(|e| e.on_drives()).cloned() else {
                continue;
            };
            let extents = extent_devices(st);
            let opened = ThinPool::open_with_extents(Arc::new(vol.clone()), &extents).await;
            let e = st.volumes.get_mut(&name).expect("listed above");
            match opened {
                Ok(p) => {
                    tracing::info!(
                        "volume {name}: its thin pool is open with {} extent(s)",
                        p.extents().len()
                    );
                    e.backing = Backing::Drives {
                        vol,
                        pool: Some(p.clone()),
                    };
                    e.pool_waiting = None;
                    enter_thins(st, &name, &p);
                }
                Err(err) => {
                    if !matches!(err, ThinError::MissingExtent(_)) {
                        tracing::error!("volume {name}: its thin pool: {err}");
                    }
                    e.pool_waiting = Some(err.to_string());
                }
            }
        }
    }
}

/// The extent volumes the node runs: a pool being opened picks its own.
fn extent_devices(st: &NodeState) -> Vec<Arc<dyn BlockDevice>> {
    st.volumes
        .values()
        .filter(|e| e.extent.is_some())
        .filter_map(|e| e.on_drives())
        .map(|v| Arc::new(v.clone()) as Arc<dyn BlockDevice>)
        .collect()
}

/// A drive as an assembly uses it outside the node's lock.
#[derive(Clone)]
struct Handle {
    dev: Arc<dyn BlockDevice>,
    remote: Option<Arc<nvmf_host::remote::RemoteDevice>>,
}

/// What [`Node::open_group`] assembled, for [`Node::enter_group`].
struct Opened {
    /// The volume's member count (its superblock's).
    members: usize,
    chosen: BTreeMap<u16, String>,
    vol: Volume,
    forced: Option<volume::ForceReport>,
    pool: Option<ThinPool>,
    extent: Option<volume::thin::ExtentLabel>,
    pool_waiting: Option<String>,
}

/// The drives one assembly request has set aside in
/// `NodeState::assembling`, and the remote drives it opened and has not
/// entered yet. Dropped before `release` (an error, or the request
/// cancelled), it gives the drives back and closes the ones it opened.
struct Reserved {
    set: Arc<parking_lot::Mutex<std::collections::BTreeSet<String>>>,
    names: Vec<String>,
    present: BTreeMap<String, Handle>,
    missing: Vec<String>,
    opened: Vec<super::Drive>,
}

impl Reserved {
    fn handles(&self) -> BTreeMap<String, Handle> {
        let mut h = self.present.clone();
        for d in &self.opened {
            h.insert(
                d.name.clone(),
                Handle {
                    dev: d.dev.clone(),
                    remote: d.remote.clone(),
                },
            );
        }
        h
    }

    /// The drives are entered in the node's state (under its lock).
    fn release(&mut self) {
        let mut set = self.set.lock();
        for n in self.names.drain(..) {
            set.remove(&n);
        }
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.release();
        for d in self.opened.drain(..) {
            let _ = d.dev.shutdown();
            tracing::info!("drive {}: closed again (the request failed)", d.name);
        }
    }
}

/// The offline entries of the volume with `uuid` that hold some of
/// `drives` (they give way to its assembly); a drive in another volume's
/// offline entry is refused.
fn parked_offline(st: &NodeState, drives: &[String], uuid: &str) -> NodeResult<Vec<String>> {
    let mut offline: Vec<String> = Vec::new();
    for d in drives {
        if let Some((v, _)) = st.user_of(d)
            && !offline.iter().any(|o| o == v)
        {
            if st.volumes[v].offline().is_none() {
                return Err(NodeError::Conflict(format!(
                    "drive {d} is already in volume {v} on this node"
                )));
            }
            if st.volumes[v].uuid() != uuid {
                return Err(NodeError::Conflict(format!(
                    "drive {d} is in volume {v} on this node (offline); delete it first"
                )));
            }
            offline.push(v.to_string());
        }
    }
    Ok(offline)
}

/// Why an assembly failed: the claim of the remote members (another node
/// owns the volume), or the volume itself.
enum AssembleError {
    Claim(NodeError),
    Volume(NodeError),
}

impl AssembleError {
    fn into_inner(self) -> NodeError {
        match self {
            AssembleError::Claim(e) | AssembleError::Volume(e) => e,
        }
    }
}

/// The offline entry of a volume found on drives that cannot be assembled:
/// what its newest superblock says, and the drives by position.
fn offline_entry(st: &NodeState, f: &Found, reason: String) -> (String, VolumeEntry) {
    let sb = &f.newest;
    let uuid = uuid_string(&sb.uuid);
    let mut name = sb.name.clone();
    if name.is_empty() || st.volumes.contains_key(&name) {
        name = format!("vol-{}", &uuid[..8]);
    }
    let data_blocks: Vec<u64> = sb.members.iter().map(|m| m.data_blocks).collect();
    let bs = sb.block_size.max(1);
    let size_bytes = Layout::new(sb.kind, u64::from(sb.strip_bytes / bs), &data_blocks)
        .map(|l| l.volume_blocks() * u64::from(bs))
        .unwrap_or(0);
    let n = sb.members.len();
    let drives: Vec<String> = (0..n)
        .map(|p| {
            f.chosen
                .get(&(p as u16))
                .cloned()
                .unwrap_or_else(|| "-".into())
        })
        .collect();
    let member_states = (0..n)
        .map(|p| {
            if f.chosen.contains_key(&(p as u16)) {
                member_state_name(sb.members[p].state).to_string()
            } else {
                "missing".to_string()
            }
        })
        .collect();
    let o = Offline {
        reason,
        uuid,
        layout: sb.kind.to_string(),
        size_bytes,
        block_size: sb.block_size,
        strip_bytes: u64::from(sb.strip_bytes),
        generation: sb.generation,
        member_states,
    };
    let entry = VolumeEntry::new(&name, Backing::Offline(o), drives, None);
    (name, entry)
}

/// Reads the superblocks of `names` and groups the drives by volume, one
/// drive per position (the newest claim wins; an older one is wiped).
async fn group_by_volume(handles: &BTreeMap<String, Handle>, names: &[String]) -> Vec<Found> {
    let mut groups: BTreeMap<[u8; 16], Vec<(String, Superblock)>> = BTreeMap::new();
    // All at once: each is a round trip to a remote drive.
    let heads = futures_util::future::join_all(
        names
            .iter()
            .filter_map(|n| Some((n, handles.get(n)?)))
            .map(|(n, d)| async move { (n, read_head(&d.dev).await) }),
    )
    .await;
    for (name, head) in heads {
        let head = match head {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!("drive {name}: cannot read its superblock: {e}");
                continue;
            }
        };
        if let Ok(sb) = Superblock::decode(&head) {
            groups.entry(sb.uuid).or_default().push((name.clone(), sb));
        }
    }
    let mut out = Vec::new();
    for (_, mut found) in groups {
        found.sort_by_key(|(_, sb)| std::cmp::Reverse(sb.generation));
        let newest = found[0].1.clone();
        let mut chosen: BTreeMap<u16, String> = BTreeMap::new();
        let mut generations: BTreeMap<u16, u64> = BTreeMap::new();
        for (drive, sb) in &found {
            if chosen.contains_key(&sb.position) {
                tracing::warn!(
                    "drive {drive} claims position {} of volume {:?} at generation {}, \
                     but a newer member holds it; leaving {drive} out and wiping it",
                    sb.position,
                    newest.name,
                    sb.generation
                );
                if let Some(d) = handles.get(drive) {
                    let _ = wipe_head(&d.dev).await;
                }
                continue;
            }
            chosen.insert(sb.position, drive.clone());
            generations.insert(sb.position, sb.generation);
        }
        out.push(Found {
            newest,
            chosen,
            generations,
            force: false,
        });
    }
    out
}

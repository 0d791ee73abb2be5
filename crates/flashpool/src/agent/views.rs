//! What `GET /v1/volumes` shows of the cluster volumes this node serves:
//! every node serves every cluster volume, so every node lists them, each
//! with its owner and the ANA state this node reports for it (a node that
//! serves one on standby has no volume of its own to list).

use nvmf_target::AnaState;

use super::Agent;
use crate::api_types::{MemberInfo, RebuildInfo};
use crate::node::{Export, VolumeInfo};

/// An ANA state as the API names it (the NVMe spec's words).
pub fn ana_word(s: AnaState) -> &'static str {
    match s {
        AnaState::Optimized => "optimized",
        AnaState::NonOptimized => "non-optimized",
        AnaState::Inaccessible => "inaccessible",
        AnaState::PersistentLoss => "persistent-loss",
        AnaState::Change => "change",
    }
}

impl Agent {
    /// Marks the cluster volumes in `vs` (the node's own list) with their
    /// owner and ANA state, and adds those served here on standby.
    pub async fn list_cluster(&self, vs: &mut Vec<VolumeInfo>) {
        let (specs, thins): (Vec<_>, Vec<_>) = {
            let served = self.served.lock().await;
            (
                served
                    .values()
                    .map(|sv| (sv.spec.clone(), sv.epoch.is_some()))
                    .collect(),
                served
                    .values()
                    .flat_map(|sv| sv.thins.values().map(|t| (sv.spec.clone(), t.spec.clone())))
                    .collect(),
            )
        };
        let s = self.session();
        self.list_thins(vs, &s, thins).await;
        for (spec, owned) in specs {
            let ana = ana_word(self.target.ana_state(spec.ana_group)).to_string();
            if let Some(v) = vs.iter_mut().find(|v| v.name == spec.name) {
                if owned {
                    v.owner = Some(self.name().to_string());
                }
                v.ana_state = Some(ana);
                continue;
            }
            // Standby: what etcd says of it (unknown while etcd does not answer).
            let owner = s.owner(&spec.name).await.ok().flatten().map(|o| o.node);
            let st = s.state(&spec.name).await.ok().flatten();
            let c = self.node.cluster();
            let members = spec
                .drives
                .iter()
                .enumerate()
                .map(|(i, u)| MemberInfo {
                    position: i,
                    drive: c.name_of(u).unwrap_or_else(|| u.clone()),
                    state: st
                        .as_ref()
                        .and_then(|st| st.members.get(i).cloned())
                        .unwrap_or_else(|| "unknown".into()),
                })
                .collect();
            let mut v = standby(&spec.name, &spec.uuid, owner, ana);
            v.layout = spec.layout.clone();
            v.size_bytes = spec.size_bytes;
            v.block_size = spec.block_size;
            v.generation = st.as_ref().map_or(0, |st| st.generation);
            v.members = members;
            v.export = (!spec.thin_pool).then(|| Export {
                nqn: spec.nqn.clone(),
                nsid: spec.nsid,
                from_config: false,
            });
            vs.push(v);
        }
        vs.sort_by(|a, b| a.name.cmp(&b.name));
    }

    /// The thin volumes of cluster pools: marked where the pool runs here,
    /// added as standby elsewhere.
    async fn list_thins(
        &self,
        vs: &mut Vec<VolumeInfo>,
        s: &cluster::Session,
        thins: Vec<(cluster::VolumeSpec, cluster::ThinSpec)>,
    ) {
        let mut owners = std::collections::BTreeMap::new();
        for (pool, t) in thins {
            let ana = ana_word(self.target.ana_state(pool.ana_group)).to_string();
            if let Some(v) = vs.iter_mut().find(|v| v.name == t.name) {
                v.owner = Some(self.name().to_string());
                v.ana_state = Some(ana);
                continue;
            }
            if !owners.contains_key(&pool.name) {
                let o = s.owner(&pool.name).await.ok().flatten().map(|o| o.node);
                owners.insert(pool.name.clone(), o);
            }
            let owner = owners[&pool.name].clone();
            let mut v = standby(&t.name, &t.uuid, owner, ana);
            let made = match (&t.origin, t.snapshot) {
                (Some(o), true) => format!("snapshot of {o} "),
                (Some(o), false) => format!("clone of {o} "),
                (None, true) => "snapshot ".into(),
                (None, false) => String::new(),
            };
            v.reason = Some(format!(
                "{made}in cluster pool {}, {}",
                pool.name,
                v.reason.unwrap_or_default()
            ));
            v.layout = "thin".into();
            v.size_bytes = t.size_bytes;
            v.block_size = t.block_size;
            v.snapshot = t.snapshot;
            // NSID 0: a snapshot recorded but not served.
            v.export = (t.nsid != 0).then(|| Export {
                nqn: pool.nqn.clone(),
                nsid: t.nsid,
                from_config: false,
            });
            v.pool = Some(pool.name.clone());
            vs.push(v);
        }
    }
}

/// What a node lists of a cluster volume it serves on standby (the
/// caller fills in its shape).
fn standby(name: &str, uuid: &str, owner: Option<String>, ana: String) -> VolumeInfo {
    VolumeInfo {
        name: name.to_string(),
        uuid: uuid.to_string(),
        layout: String::new(),
        size_bytes: 0,
        block_size: 0,
        strip_bytes: 0,
        state: "standby".into(),
        encrypted: false,
        reason: Some(format!(
            "owned by {}; served here on standby",
            owner.as_deref().unwrap_or("no node right now")
        )),
        generation: 0,
        members: Vec::new(),
        export: None,
        from_config: false,
        rebuild: RebuildInfo::default(),
        pool: None,
        allocated_bytes: None,
        snapshot: false,
        parent: None,
        shared_bytes: None,
        stored_bytes: None,
        created: None,
        thin_pool: None,
        jobs: Vec::new(),
        last_scrub: None,
        forced: None,
        owner,
        ana_state: Some(ana),
        extent_of: None,
    }
}

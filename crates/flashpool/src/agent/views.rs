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
        let specs: Vec<_> = {
            let served = self.served.lock().await;
            served
                .values()
                .map(|sv| (sv.spec.clone(), sv.epoch.is_some()))
                .collect()
        };
        let s = self.session();
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
            vs.push(VolumeInfo {
                name: spec.name.clone(),
                uuid: spec.uuid.clone(),
                layout: spec.layout.clone(),
                size_bytes: spec.size_bytes,
                block_size: spec.block_size,
                strip_bytes: 0,
                state: "standby".into(),
                reason: Some(format!(
                    "owned by {}; served here on standby",
                    owner.as_deref().unwrap_or("no node right now")
                )),
                generation: st.as_ref().map_or(0, |st| st.generation),
                members,
                export: Some(Export {
                    nqn: spec.nqn.clone(),
                    nsid: spec.nsid,
                    from_config: false,
                }),
                from_config: false,
                rebuild: RebuildInfo::default(),
                pool: None,
                allocated_bytes: None,
                thin_pool: None,
                jobs: Vec::new(),
                last_scrub: None,
                forced: None,
                owner,
                ana_state: Some(ana),
            });
        }
        vs.sort_by(|a, b| a.name.cmp(&b.name));
    }
}

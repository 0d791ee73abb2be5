//! The etcd key schema: every key and prefix the cluster uses is built (and
//! the watched ones parsed) here, so the layout lives in one place. Every
//! key lives under `/flashpool/<cluster>/`:
//!
//! | key                     | value            | lease        |
//! |-------------------------|------------------|--------------|
//! | `nodes/<name>`          | [`NodeRecord`]   | node's       |
//! | `slots/<k>`             | node name        | node's       |
//! | `slot-home/<name>`      | its last slot    | none         |
//! | `volumes/<v>/spec`      | [`VolumeSpec`]   | none         |
//! | `volumes/<v>/owner`     | [`Owner`]        | owner's      |
//! | `volumes/<v>/epoch`     | last owner epoch | none         |
//! | `volumes/<v>/state`     | [`VolumeState`]  | none         |
//! | `volumes/<v>/handoff`   | [`Handoff`]      | none         |
//! | `volumes/<v>/qos`       | [`QosSpec`]      | none         |
//! | `volumes/<p>/thin/<t>`  | [`ThinSpec`]     | none         |
//! | `volumes/<p>/thin-resv/<t>` | reservation record | none     |
//! | `volumes/<p>/extent-state/<x>` | [`VolumeState`] of extent `x` | none |
//! | `names/<t>`             | pool of thin `t` | none         |
//! | `nsids/<nqn>/<nsid>`    | thin volume name | none         |
//! | `drain/<name>`          | `true`           | none         |
//! | `drive-claims/<drive>`  | `<volume>@<node>` | taker's     |
//!
//! [`NodeRecord`]: crate::NodeRecord
//! [`VolumeSpec`]: crate::VolumeSpec
//! [`Owner`]: crate::Owner
//! [`VolumeState`]: crate::VolumeState
//! [`Handoff`]: crate::Handoff
//! [`ThinSpec`]: crate::ThinSpec
//! [`QosSpec`]: crate::QosSpec
//!
//! `names/` and `nsids/` keep thin volume names and namespace IDs unique
//! across pools: a thin volume is created with both in one transaction.
//! `volumes/<v>/qos` is kept for thin volumes too (by the thin volume's
//! name, which no volume shares).

/// `/flashpool/<cluster>/`: the prefix of every key of one cluster.
pub(crate) fn cluster_prefix(cluster: &str) -> String {
    format!("/flashpool/{cluster}/")
}

/// The keys a volume has under `volumes/<v>/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum VolumeKey {
    Spec,
    Owner,
    Epoch,
    State,
    Handoff,
    /// QoS limits (`qos.rs`): of a volume, or of a thin volume.
    Qos,
}

impl VolumeKey {
    /// Every key of a volume (what deleting a volume removes).
    pub(crate) const ALL: [VolumeKey; 6] = [
        VolumeKey::Spec,
        VolumeKey::Owner,
        VolumeKey::State,
        VolumeKey::Handoff,
        VolumeKey::Epoch,
        VolumeKey::Qos,
    ];

    fn leaf(self) -> &'static str {
        match self {
            VolumeKey::Spec => "spec",
            VolumeKey::Owner => "owner",
            VolumeKey::Epoch => "epoch",
            VolumeKey::State => "state",
            VolumeKey::Handoff => "handoff",
            VolumeKey::Qos => "qos",
        }
    }

    fn parse(leaf: &str) -> Option<VolumeKey> {
        Some(match leaf {
            "spec" => VolumeKey::Spec,
            "owner" => VolumeKey::Owner,
            "epoch" => VolumeKey::Epoch,
            "state" => VolumeKey::State,
            "handoff" => VolumeKey::Handoff,
            "qos" => VolumeKey::Qos,
            _ => return None,
        })
    }
}

/// A watched key, parsed back from its path under the cluster prefix.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Key<'a> {
    Node(&'a str),
    Drain(&'a str),
    Volume(&'a str, VolumeKey),
    /// A thin volume of a cluster pool: (pool, thin volume).
    Thin(&'a str, &'a str),
}

/// The keys of one cluster.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    pub(crate) fn new(cluster: &str) -> Keys {
        Keys {
            prefix: cluster_prefix(cluster),
        }
    }

    /// The whole cluster (what the session's watch covers).
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn nodes(&self) -> String {
        format!("{}nodes/", self.prefix)
    }

    pub(crate) fn node(&self, name: &str) -> String {
        format!("{}nodes/{name}", self.prefix)
    }

    pub(crate) fn slots(&self) -> String {
        format!("{}slots/", self.prefix)
    }

    pub(crate) fn slot(&self, slot: u16) -> String {
        format!("{}slots/{slot}", self.prefix)
    }

    pub(crate) fn slot_homes(&self) -> String {
        format!("{}slot-home/", self.prefix)
    }

    pub(crate) fn slot_home(&self, name: &str) -> String {
        format!("{}slot-home/{name}", self.prefix)
    }

    /// Every volume key (specs are the ones ending in `/spec`).
    pub(crate) fn volumes(&self) -> String {
        format!("{}volumes/", self.prefix)
    }

    pub(crate) fn volume(&self, vol: &str, key: VolumeKey) -> String {
        format!("{}volumes/{vol}/{}", self.prefix, key.leaf())
    }

    /// Every thin volume of cluster pool `pool`.
    pub(crate) fn thins(&self, pool: &str) -> String {
        format!("{}volumes/{pool}/thin/", self.prefix)
    }

    pub(crate) fn thin(&self, pool: &str, name: &str) -> String {
        format!("{}volumes/{pool}/thin/{name}", self.prefix)
    }

    /// The host reservations of every thin volume of cluster pool `pool`.
    pub(crate) fn thin_resvs(&self, pool: &str) -> String {
        format!("{}volumes/{pool}/thin-resv/", self.prefix)
    }

    /// Thin volume `name`'s host reservations (the target's record bytes).
    pub(crate) fn thin_resv(&self, pool: &str, name: &str) -> String {
        format!("{}volumes/{pool}/thin-resv/{name}", self.prefix)
    }

    /// The member-state records of cluster pool `pool`'s extents.
    pub(crate) fn extent_states(&self, pool: &str) -> String {
        format!("{}volumes/{pool}/extent-state/", self.prefix)
    }

    /// Extent `x`'s member-state record, written by `pool`'s owner.
    pub(crate) fn extent_state(&self, pool: &str, x: &str) -> String {
        format!("{}volumes/{pool}/extent-state/{x}", self.prefix)
    }

    /// Which pool holds thin volume `name` (unique across pools).
    pub(crate) fn thin_name(&self, name: &str) -> String {
        format!("{}names/{name}", self.prefix)
    }

    /// Which thin volume is `nsid` of `nqn` (a `/` in the NQN is escaped).
    pub(crate) fn nsid(&self, nqn: &str, nsid: u32) -> String {
        format!("{}nsids/{}/{nsid}", self.prefix, nqn.replace('/', "%2F"))
    }

    /// A drive taken for a change in progress (`drives.rs`; a `/` in the
    /// drive's URL is escaped).
    pub(crate) fn drive_claim(&self, url: &str) -> String {
        format!("{}drive-claims/{}", self.prefix, url.replace('/', "%2F"))
    }

    pub(crate) fn drains(&self) -> String {
        format!("{}drain/", self.prefix)
    }

    pub(crate) fn drain(&self, node: &str) -> String {
        format!("{}drain/{node}", self.prefix)
    }

    /// What a key under the prefix is; `None` for slots, slot homes and
    /// keys outside the schema.
    pub(crate) fn parse<'a>(&self, key: &'a str) -> Option<Key<'a>> {
        let key = key.strip_prefix(&self.prefix)?;
        let mut parts = key.splitn(3, '/');
        match (parts.next()?, parts.next(), parts.next()) {
            ("nodes", Some(n), None) => Some(Key::Node(n)),
            ("drain", Some(n), None) => Some(Key::Drain(n)),
            ("volumes", Some(v), Some(leaf)) => match leaf.strip_prefix("thin/") {
                Some(t) if !t.is_empty() && !t.contains('/') => Some(Key::Thin(v, t)),
                Some(_) => None,
                None => Some(Key::Volume(v, VolumeKey::parse(leaf)?)),
            },
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Key, Keys, VolumeKey};

    #[test]
    fn keys_build_and_parse_back() {
        let k = Keys::new("c1");
        assert_eq!(k.prefix(), "/flashpool/c1/");
        assert_eq!(k.node("a"), "/flashpool/c1/nodes/a");
        assert_eq!(k.slot(3), "/flashpool/c1/slots/3");
        assert_eq!(k.slot_home("a"), "/flashpool/c1/slot-home/a");
        assert_eq!(k.drain("a"), "/flashpool/c1/drain/a");
        assert_eq!(
            k.volume("v", VolumeKey::Owner),
            "/flashpool/c1/volumes/v/owner"
        );
        assert_eq!(k.parse(&k.node("a")), Some(Key::Node("a")));
        assert_eq!(k.parse(&k.drain("a")), Some(Key::Drain("a")));
        for vk in VolumeKey::ALL {
            assert_eq!(k.parse(&k.volume("v", vk)), Some(Key::Volume("v", vk)));
        }
        assert_eq!(k.parse(&k.thin("p", "t1")), Some(Key::Thin("p", "t1")));
        // a thin volume named like a volume key is still a thin volume
        assert_eq!(k.parse(&k.thin("p", "spec")), Some(Key::Thin("p", "spec")));
        assert_eq!(k.parse("/flashpool/c1/volumes/p/thin/"), None);
        assert_eq!(k.parse("/flashpool/c1/volumes/p/thin/a/b"), None);
        // read by the pool's owner alone: no event, no volume key
        assert_eq!(k.parse(&k.thin_resv("p", "t1")), None);
        assert!(k.thin_resv("p", "t1").starts_with(&k.thin_resvs("p")));
        assert!(!k.thin_resv("p", "t1").starts_with(&k.thins("p")));
        assert_eq!(k.nsid("nqn.x:a/b", 7), "/flashpool/c1/nsids/nqn.x:a%2Fb/7");
        assert_eq!(
            k.drive_claim("nvme://e1/d0"),
            "/flashpool/c1/drive-claims/nvme:%2F%2Fe1%2Fd0"
        );
        assert_eq!(k.parse(&k.drive_claim("nvme://e1/d0")), None);
        assert_eq!(k.parse(&k.slot(3)), None);
        assert_eq!(k.parse(&k.slot_home("a")), None);
        assert_eq!(k.parse("/flashpool/c1/nodes/a/b"), None);
        assert_eq!(k.parse("/flashpool/c1/volumes/v/other"), None);
        assert_eq!(k.parse("/flashpool/c2/nodes/a"), None);
    }
}

//! Tests of the node specs (`[[drive]]`, `[[volume]]`) and of subsystem
//! hosts with their secrets.

use super::*;

fn specs_err(text: &str) -> String {
    let cfg: NodeConfig = toml::from_str(text).unwrap();
    node_specs(&cfg).expect_err("must be refused").to_string()
}

#[test]
fn thin_is_for_mem_drives() {
    let e = specs_err("[[drive]]\nname = \"d0\"\nbackend = \"file\"\npath = \"/x\"\nthin = true\n");
    assert!(e.contains("drive[0].thin is only for"), "{e}");
}

const DRIVES: &str = "[[drive]]\nname = \"a\"\nbackend = \"mem\"\nsize = \"8MiB\"\n\
    [[drive]]\nname = \"b\"\nbackend = \"mem\"\nsize = \"8MiB\"\n\
    [[drive]]\nname = \"c\"\nbackend = \"mem\"\nsize = \"8MiB\"\n";

#[test]
fn drives_and_volumes_are_checked_before_any_drive_is_touched() {
    let ok: NodeConfig = toml::from_str(&format!(
        "{DRIVES}[[volume]]\nname = \"v\"\nlayout = \"raid5\"\ndrives = [\"a\", \"b\", \"c\"]\nstrip = \"128KiB\"\n"
    ))
    .unwrap();
    let (d, v) = node_specs(&ok).unwrap();
    assert_eq!(d.len(), 3);
    assert_eq!(v[0].strip.as_deref(), Some("131072"));

    let e = specs_err(&format!(
        "{DRIVES}[[volume]]\nname = \"v\"\nlayout = \"raid5\"\ndrives = [\"a\", \"b\"]\n"
    ));
    assert!(
        e.contains("volume[0].drives") && e.contains("at least 3"),
        "{e}"
    );
    let e = specs_err(&format!(
        "{DRIVES}[[volume]]\nname = \"v\"\nlayout = \"raid1\"\ndrives = [\"a\", \"z\"]\n"
    ));
    assert!(e.contains("\"z\", which no [[drive]] declares"), "{e}");
    let e = specs_err(&format!(
        "{DRIVES}[[volume]]\nname = \"v\"\nlayout = \"raid1\"\ndrives = [\"a\", \"b\"]\n\
         [[volume]]\nname = \"w\"\nlayout = \"raid0\"\ndrives = [\"b\"]\n"
    ));
    assert!(
        e.contains("drive \"b\" is already used by volume \"v\""),
        "{e}"
    );
    let e = specs_err(&format!(
        "{DRIVES}[[volume]]\nname = \"v\"\nlayout = \"raid9\"\ndrives = [\"a\"]\n"
    ));
    assert!(
        e.contains("volume[0].layout") && e.contains("unknown"),
        "{e}"
    );
    let e = specs_err("[[drive]]\nname = \"a\"\nbackend = \"mem\"\n");
    assert!(e.contains("drive[0].size is missing"), "{e}");
    let e = specs_err(&format!(
        "{DRIVES}[[drive]]\nname = \"a\"\nbackend = \"mem\"\nsize = 4096\n"
    ));
    assert!(e.contains("used twice"), "{e}");
}

#[test]
fn a_volume_namespace_must_name_a_volume() {
    let text = "[[subsystem]]\nnqn = \"nqn.a:x\"\nallow_any_host = true\n\
                [[subsystem.namespace]]\nnsid = 1\nbackend = \"volume\"\nvolume = \"nope\"\n";
    let cfg: NodeConfig = toml::from_str(text).unwrap();
    let e = build(&cfg, &|_, _, _| VolumeNamespace::Unknown)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("volume = \"nope\": no such volume"), "{e}");
    let empty: NodeConfig =
        toml::from_str("[[subsystem]]\nnqn = \"nqn.a:x\"\nallow_any_host = true\n").unwrap();
    let b = build(&empty, &|_, _, _| VolumeNamespace::Unknown).unwrap();
    assert!(
        b.subsystems[0].namespaces().is_empty(),
        "a subsystem may start empty"
    );
}

/// `[[subsystem.host]]` with key files: the host is allowed and must
/// authenticate; `require_auth` refuses any way in without a secret.
#[test]
fn subsystem_hosts_with_key_files() {
    use super::auth::tests::{KEY1, key_dir, write};
    let dir = key_dir();
    let k = write(&dir, "k", KEY1, 0o600);
    let c = write(
        &dir,
        "c",
        &nvme_wire::auth::dhchap::Secret::from_key(None, &[5; 48])
            .unwrap()
            .to_dhhc(),
        0o400,
    );
    let open = write(&dir, "open", KEY1, 0o640);
    const H1: &str = "nqn.2014-08.org.nvmexpress:uuid:1";
    const H2: &str = "nqn.2014-08.org.nvmexpress:uuid:2";
    let sub = |extra: &str| {
        format!(
            "[[subsystem]]\nnqn = \"nqn.2026-01.io.flashpool:a\"\n{extra}\n\
             [[subsystem.namespace]]\nnsid = 1\nbackend = \"null\"\nsize = 4096\n"
        )
    };
    let host = |nqn: &str, keys: &str| format!("[[subsystem.host]]\nnqn = \"{nqn}\"\n{keys}\n");
    let keys = format!("dhchap_key_file = {k:?}\ndhchap_ctrl_key_file = {c:?}\n");
    let text = sub(&format!("hosts = [\"{H2}\"]\n{}", host(H1, &keys)));
    let b = build(&parse(&text, "t").unwrap(), &|_, _, _| {
        VolumeNamespace::Unknown
    })
    .unwrap();
    let s = &b.subsystems[0];
    assert_eq!(s.hosts, [H2, H1]);
    let a = s.host_auth(H1).expect("H1 must authenticate");
    assert!(a.ctrl_key.is_some());
    assert!(
        s.host_auth(H2).is_none(),
        "H2 has no key: connects as before"
    );
    // A group-readable key file: refused, naming the key and the fix.
    let e = super::tests::err(&sub(&host(H1, &format!("dhchap_key_file = {open:?}"))));
    assert!(
        e.contains("subsystem[0].host[0].dhchap_key_file") && e.contains("chmod 600"),
        "{e}"
    );
    assert!(!e.contains("DHHC"), "{e}");
    // require_auth: no host without a secret, no allow_any_host.
    let e = super::tests::err(&sub(&format!(
        "require_auth = true\nhosts = [\"{H2}\"]\n{}",
        host(H1, &keys)
    )));
    assert!(e.contains("require_auth") && e.contains(H2), "{e}");
    let e = super::tests::err(&sub(&format!(
        "require_auth = true\nallow_any_host = true\n{}",
        host(H1, &keys)
    )));
    assert!(e.contains("allow_any_host"), "{e}");
    let e = super::tests::err(&sub(&format!("require_auth = true\n{}", host(H1, ""))));
    assert!(e.contains("no dhchap_key_file"), "{e}");
    assert_eq!(
        super::tests::err(&sub(&format!("require_auth = true\n{}", host(H1, &keys)))),
        "ok"
    );
    let e = super::tests::err(&sub(&format!("{}{}", host(H1, ""), host(H1, ""))));
    assert!(e.contains("appears twice"), "{e}");
    let e = super::tests::err(&sub(&host(H1, &format!("dhchap_ctrl_key_file = {c:?}"))));
    assert!(e.contains("add dhchap_key_file"), "{e}");
}

/// `dhchap_hashes` / `dhchap_dhgroups`: what the controller may pick for
/// a host, in its order; unknown, repeated or missing names are refused.
#[test]
fn subsystem_host_hashes_and_groups() {
    use super::auth::tests::{KEY1, key_dir, write};
    use nvme_wire::auth::dhchap::{DhGroup, HashId};
    let k = write(&key_dir(), "k", KEY1, 0o600);
    const H1: &str = "nqn.2014-08.org.nvmexpress:uuid:1";
    let sub = |extra: &str| {
        format!(
            "[[subsystem]]\nnqn = \"nqn.2026-01.io.flashpool:a\"\nrequire_auth = true\n\
             [[subsystem.host]]\nnqn = \"{H1}\"\ndhchap_key_file = {k:?}\n{extra}\n\
             [[subsystem.namespace]]\nnsid = 1\nbackend = \"null\"\nsize = 4096\n"
        )
    };
    let auth = |extra: &str| {
        let b = build(&parse(&sub(extra), "t").unwrap(), &|_, _, _| {
            VolumeNamespace::Unknown
        })
        .unwrap();
        b.subsystems[0].host_auth(H1).unwrap()
    };
    // Default: every hash and group, FFDHE first.
    let a = auth("");
    assert_eq!(a.hashes, HashId::ALL);
    assert_eq!(a.dh_groups[0], DhGroup::Ffdhe2048);
    assert_eq!(a.dh_groups.len(), 6);
    let a = auth(
        "dhchap_hashes = [\"sha512\", \"sha256\"]\ndhchap_dhgroups = [\"null\", \"ffdhe8192\"]",
    );
    assert_eq!(a.hashes, [HashId::Sha512, HashId::Sha256]);
    assert_eq!(a.dh_groups, [DhGroup::Null, DhGroup::Ffdhe8192]);
    let a = auth("dhchap_dhgroups = [\"ffdhe3072\"]");
    assert_eq!(a.dh_groups, [DhGroup::Ffdhe3072]);
    assert_eq!(a.hashes, HashId::ALL);
    // Refusals name the key, the value and what is known.
    for (toml, want) in [
        (
            r#"dhchap_hashes = ["md5"]"#,
            &[
                "subsystem[0].host[0].dhchap_hashes",
                r#""md5" is not known"#,
                r#""sha384""#,
            ][..],
        ),
        (r#"dhchap_hashes = ["hmac(sha256)"]"#, &["is not known"]),
        (
            r#"dhchap_dhgroups = ["ffdhe1024"]"#,
            &[
                "dhchap_dhgroups",
                r#""ffdhe1024" is not known"#,
                r#""null""#,
            ],
        ),
        (r#"dhchap_dhgroups = ["null", "null"]"#, &["appears twice"]),
        ("dhchap_hashes = []", &["dhchap_hashes is empty"]),
        (r#"dhchap_dhgroups = "null""#, &["dhchap_dhgroups"]),
    ] {
        let e = super::tests::err(&sub(toml));
        assert!(want.iter().all(|w| e.contains(w)), "{toml}: {e}");
    }
    // Without a secret they would choose nothing.
    let e = super::tests::err(&format!(
        "[[subsystem]]\nnqn = \"nqn.2026-01.io.flashpool:a\"\n\
         [[subsystem.host]]\nnqn = \"{H1}\"\ndhchap_hashes = [\"sha256\"]\n"
    ));
    assert!(e.contains("no dhchap_key_file"), "{e}");
}

#[test]
fn kek_file_defaults_to_the_state_dir() {
    let c: NodeConfig = toml::from_str("[node]\nstate_dir = \"/var/lib/fp\"\n").unwrap();
    assert_eq!(c.node.kek_path(), Some("/var/lib/fp/kek".into()));
    let c: NodeConfig =
        toml::from_str("[node]\nstate_dir = \"/var/lib/fp\"\nkek_file = \"/etc/fp/kek\"\n")
            .unwrap();
    assert_eq!(c.node.kek_path(), Some("/etc/fp/kek".into()));
    let c: NodeConfig = toml::from_str("").unwrap();
    assert_eq!(c.node.kek_path(), None);
}

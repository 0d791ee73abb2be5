//! The configuration's tests: every error names its key, value and fix.

use super::*;

pub(super) fn err(text: &str) -> String {
    let cfg = parse(text, "t.toml");
    match cfg {
        Err(e) => e.to_string(),
        Ok(c) => match build(&c, &|_, _, _| VolumeNamespace::Unknown) {
            Err(e) => e.to_string(),
            Ok(_) => "ok".into(),
        },
    }
}

const NS: &str = "[[subsystem.namespace]]\nnsid = 1\nbackend = \"mem\"\nsize = \"1MiB\"\n";

#[test]
fn a_bad_size_names_its_key_value_and_fix() {
    let text = "[[drive]]\nname = \"d0\"\nbackend = \"mem\"\nsize = \"64MiB\"\n\n\
                [[drive]]\nname = \"d1\"\nbackend = \"mem\"\nsize = \"12 XB\"\n";
    let e = err(text);
    assert_eq!(
        e,
        "config t.toml, line 9: drive \"d1\": size: \"12 XB\" is not a size \
         (unknown unit \"XB\"); use e.g. 64MiB, 10GiB or a byte count"
    );
    let e = err("[transport]\nmax_transfer = \"lots\"\n");
    assert_eq!(
        e,
        "config t.toml, line 2: transport.max_transfer: \"lots\" is not a size; \
         use e.g. 64MiB, 10GiB or a byte count"
    );
    let e = err(&format!(
        "[[subsystem]]\nnqn = \"nqn.2026-01.io.flashpool:a\"\nallow_any_host = true\n{NS}\
         [[subsystem.namespace]]\nnsid = 2\nbackend = \"mem\"\nsize = -4096\n"
    ));
    assert!(
        e.contains("subsystem \"nqn.2026-01.io.flashpool:a\": namespace nsid 2: size: -4096 is not a size (negative); use e.g. 64MiB"),
        "{e}"
    );
    let e = err("[[volume]]\nname = \"v\"\nstrip = 1.5\n");
    assert!(e.contains("volume \"v\": strip: 1.5 is not a size"), "{e}");
    let e = err("[[volume]]\nname = \"v\"\nstrip = \"0.3k\"\n");
    assert!(e.contains("(not a whole number of bytes)"), "{e}");
    // An entry without a name is known by its position.
    let e = err("[[drive]]\nbackend = \"mem\"\nsize = true\n");
    assert!(
        e.contains("drive[0]: size: invalid type: boolean `true`, expected a size"),
        "{e}"
    );
    // Sizes as integers and as text still parse.
    let cfg = parse(
        "[[drive]]\nname = \"d\"\nbackend = \"mem\"\nsize = 4096\n\
                     [transport]\nmax_transfer = \"128KiB\"\n",
        "t",
    )
    .unwrap();
    assert_eq!(cfg.drive[0].size.unwrap().bytes(), 4096);
    assert_eq!(cfg.transport.max_transfer.unwrap().bytes(), 128 << 10);
}

/// Every key the parser takes is in docs/config.md, as `key = ...` in an
/// example or as `` `key` `` in a table or the text.
#[test]
fn docs_config_md_names_every_key() {
    let doc = include_str!("../../../../docs/config.md");
    let sections = [
        ("", ""),
        ("node", "[node]"),
        ("transport", "[transport]"),
        ("listener", "[[listener]]"),
        ("subsystem", "[[subsystem]]"),
        (
            "subsystem.namespace",
            "[[subsystem]]\n[[subsystem.namespace]]",
        ),
        ("subsystem.host", "[[subsystem]]\n[[subsystem.host]]"),
        ("api", "[api]"),
        ("drive", "[[drive]]"),
        ("volume", "[[volume]]"),
        ("peer", "[[peer]]"),
        ("remote", "[remote]"),
        ("cluster", "[cluster]"),
        ("scrub", "[scrub]\ninterval = \"1d\""),
    ];
    let mut missing = Vec::new();
    for (section, header) in sections {
        // The parser lists the keys a section takes when it meets one it does not.
        let e = err(&format!("{header}\nzz_no_such_key = 1\n"));
        let (_, list) = e
            .split_once("expected ")
            .unwrap_or_else(|| panic!("{section}: {e}"));
        let list = list.trim_start_matches("one of ").replace(" or ", ", ");
        for key in list.split(", ").map(|k| k.trim_matches('`')) {
            let documented = if section.is_empty() {
                doc.contains(&format!("[{key}]")) || doc.contains(&format!("[[{key}]]"))
            } else {
                doc.contains(&format!("\n{key} ="))
                    || doc.contains(&format!("# {key} ="))
                    || doc.contains(&format!("`{key}`"))
                    || doc.contains(&format!("[[{section}.{key}]]"))
            };
            if !documented {
                missing.push(format!("{section}.{key}"));
            }
        }
    }
    assert!(missing.is_empty(), "not in docs/config.md: {missing:?}");
}

#[test]
fn a_huge_bad_value_is_not_echoed_whole() {
    let big = "9".repeat(100_000) + "XB";
    let e = err(&format!("[[volume]]\nname = \"v\"\nstrip = \"{big}\"\n"));
    assert!(e.len() < 400, "{} bytes: {}", e.len(), &e[..400]);
    assert!(e.contains("… (100002 bytes)"), "{e}");
}

#[test]
fn embedded_default_builds() {
    let (cfg, _) = load(None).unwrap();
    let b = build(&cfg, &|_, _, _| VolumeNamespace::Unknown).unwrap();
    assert_eq!(b.subsystems[0].nqn, DEFAULT_NQN);
    assert_eq!(b.subsystems[0].namespaces()[0].num_blocks, (1 << 30) / 512);
    assert_eq!(b.listeners.len(), 2);
}

#[test]
fn sizes() {
    assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
    assert_eq!(parse_size("128KiB").unwrap(), 128 << 10);
    assert_eq!(parse_size("4096").unwrap(), 4096);
    assert!(parse_size("12XB").unwrap_err().contains("unknown unit"));
    assert!(parse_size("lots").is_err());
}

#[test]
fn errors_name_key_value_and_fix() {
    let e = err("[node]\nreactorz = 2\n");
    assert!(e.contains("unknown field") && e.contains("reactorz"), "{e}");
    let e = err(&format!(
        "[[subsystem]]\nnqn = \"nqn.a:x\"\nallow_any_host = true\n{NS}[[subsystem]]\nnqn = \"nqn.a:x\"\nallow_any_host = true\n{NS}"
    ));
    assert!(
        e.contains("subsystem[1].nqn") && e.contains("defined twice"),
        "{e}"
    );
    let e = err(&format!(
        "[[subsystem]]\nnqn = \"nqn.a:x\"\nallow_any_host = true\n{NS}{NS}"
    ));
    assert!(e.contains("nsid = 1 is used twice"), "{e}");
    let e = err(
        "[[subsystem]]\nnqn = \"nqn.a:x\"\nallow_any_host = true\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"mem\"\nsize = 1000\n",
    );
    assert!(
        e.contains("size = 1000")
            && e.contains("multiple of block_size 512")
            && e.contains("use e.g. 512"),
        "{e}"
    );
    let e = err(
        "[[subsystem]]\nnqn = \"nqn.a:x\"\nallow_any_host = true\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"file\"\npath = \"/nonexistent/x.img\"\n",
    );
    assert!(
        e.contains("namespace[0]") && e.contains("/nonexistent/x.img"),
        "{e}"
    );
    let e = err(&format!("[[subsystem]]\nnqn = \"nqn.a:x\"\n{NS}"));
    assert!(e.contains("allows no host"), "{e}");
    let e = err(&format!(
        "[[subsystem]]\nnqn = \"bad\"\nallow_any_host = true\n{NS}"
    ));
    assert!(e.contains("not a valid NQN"), "{e}");
    let e = err(&format!(
        "[transport]\nmax_queue_depth = 5000\n[[subsystem]]\nnqn = \"nqn.a:x\"\nallow_any_host = true\n{NS}"
    ));
    assert!(
        e.contains("transport.max_queue_depth = 5000 is out of range"),
        "{e}"
    );
    let e = err(&format!(
        "[[listener]]\naddress = \"localhost\"\nport = 1\n[[subsystem]]\nnqn = \"nqn.a:x\"\nallow_any_host = true\n{NS}"
    ));
    assert!(e.contains("listener[0].address"), "{e}");
}

#[test]
fn thin_is_for_mem_and_false_allocates_up_front() {
    let sub = "[[subsystem]]\nnqn = \"nqn.a:x\"\nallow_any_host = true\n[[subsystem.namespace]]\nnsid = 1\n";
    let e = err(&format!(
        "{sub}backend = \"null\"\nsize = \"1MiB\"\nthin = false\n"
    ));
    assert!(e.contains("thin is only for backend = \"mem\""), "{e}");

    let c = parse(
        &format!("{sub}backend = \"mem\"\nsize = \"4MiB\"\nthin = false\n"),
        "t.toml",
    )
    .unwrap();
    let built = build(&c, &|_, _, _| VolumeNamespace::Unknown).unwrap();
    let ns = &built.subsystems[0].namespaces()[0];
    assert!(ns.dev.describe().contains("thick"), "{}", ns.dev.describe());
    let c = parse(
        &format!("{sub}backend = \"mem\"\nsize = \"4MiB\"\n"),
        "t.toml",
    )
    .unwrap();
    let built = build(&c, &|_, _, _| VolumeNamespace::Unknown).unwrap();
    let ns = &built.subsystems[0].namespaces()[0];
    assert!(ns.dev.describe().contains("thin"), "{}", ns.dev.describe());
}

#[test]
fn derived_ids_are_stable_and_distinct() {
    assert_eq!(derived_id("nqn.a", 1, 11), derived_id("nqn.a", 1, 11));
    assert_ne!(derived_id("nqn.a", 1, 11), derived_id("nqn.a", 2, 11));
    assert_eq!(
        parse_hex("k", "00112233-4455-6677-8899-aabbccddeeff").unwrap()[15],
        0xff
    );
}

#[test]
fn compression_is_a_thin_pools_and_named() {
    // The drives and volumes, as `serve` checks them.
    let specs = |text: &str| match node_specs(&parse(text, "t.toml").unwrap()) {
        Ok(_) => "ok".to_string(),
        Err(e) => e.to_string(),
    };
    let drives = "[[drive]]\nname = \"d0\"\nbackend = \"mem\"\nsize = \"64MiB\"\n\
                  [[drive]]\nname = \"d1\"\nbackend = \"mem\"\nsize = \"64MiB\"\n";
    let pool = |extra: &str| {
        format!(
            "{drives}[[volume]]\nname = \"p\"\nlayout = \"raid1\"\ndrives = [\"d0\", \"d1\"]\n{extra}"
        )
    };
    assert_eq!(
        specs(&pool("thin_pool = true\ncompression = \"zstd\"\n")),
        "ok"
    );
    let e = specs(&pool("thin_pool = true\ncompression = \"gzip\"\n"));
    assert!(
        e.contains("volume[0].compression") && e.contains("use lz4, zstd or none"),
        "{e}"
    );
    let e = specs(&pool("compression = \"lz4\"\n"));
    assert!(e.contains("add thin_pool = true"), "{e}");
    let e = specs(&format!(
        "{}[[volume]]\nname = \"t\"\npool = \"p\"\nsize = \"1GiB\"\ncompression = \"lz4\"\n",
        pool("thin_pool = true\n")
    ));
    assert!(e.contains("volume[1]") && e.contains("compression"), "{e}");
}

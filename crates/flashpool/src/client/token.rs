//! The API token the CLI sends, and where it finds it: `FLASHPOOL_TOKEN`,
//! `--token-file`, else the file the node left for this `--api` address and
//! this network namespace in the runtime directory ([`runtime_token_path`],
//! which the node writes).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::endpoint::{Endpoint, api_base};

/// The directory the node leaves its token in for the CLI on the same
/// machine, by API address: `/run/flashpool` for root, else
/// `$XDG_RUNTIME_DIR/flashpool`, else `/tmp/flashpool-<uid>`.
pub fn runtime_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from("/run/flashpool");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if Path::new(&d).is_absolute() => Path::new(&d).join("flashpool"),
        _ => PathBuf::from(format!("/tmp/flashpool-{uid}")),
    }
}

/// The network namespace this process is in: the inode of
/// `/proc/self/ns/net`, which any process may stat (`None` where there is no
/// procfs to ask).
pub fn net_ns() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/net").ok().map(|m| m.ino())
}

/// `<runtime_dir>/api-<addr>-net<ns>.token` for API address `addr` in this
/// process's network namespace (see [`runtime_token_name`]).
pub fn runtime_token_path(addr: &str) -> PathBuf {
    runtime_dir().join(runtime_token_name(addr, net_ns()))
}

/// `api-<addr>-net<ns>.token` for API address `addr` (`ADDR:PORT`, as given
/// to `--api`; `:`, `[` and `]` become `_`) in network namespace `ns`:
/// nodes in different namespaces may bind the same loopback address, and
/// each namespace's CLI must find its own node's token. Without a namespace
/// to name (no procfs), `api-<addr>.token`, as before namespaces counted.
pub fn runtime_token_name(addr: &str, ns: Option<u64>) -> String {
    let name: String = addr
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    match ns {
        Some(ns) => format!("api-{name}-net{ns}.token"),
        None => format!("api-{name}.token"),
    }
}

/// The API token the CLI sends, and where it found it (for the error that
/// a refused one gets).
pub struct ApiToken {
    header: Option<String>,
    from: String,
}

impl ApiToken {
    /// `FLASHPOOL_TOKEN`, `--token-file` (`FLASHPOOL_TOKEN_FILE`), then the
    /// file the node left for this address and network namespace in the
    /// runtime directory. Never the address-only file of an older node: it
    /// does not say which namespace it came from, and another namespace's
    /// token sent here would leak it to whatever listens on this address.
    pub fn find(api: &Endpoint) -> Result<ApiToken> {
        let bearer = |t: &str| Some(format!("Bearer {}", t.trim()));
        if let Ok(t) = std::env::var("FLASHPOOL_TOKEN")
            && !t.trim().is_empty()
        {
            return Ok(ApiToken {
                header: bearer(&t),
                from: "FLASHPOOL_TOKEN".into(),
            });
        }
        if let Some(f) = &api.token_file {
            let t = std::fs::read_to_string(f)
                .with_context(|| format!("--token-file {}: cannot read it", f.display()))?;
            return Ok(ApiToken {
                header: bearer(&t),
                from: f.display().to_string(),
            });
        }
        let (_, hostport) = api_base(&api.api);
        let f = runtime_token_path(hostport);
        Ok(match std::fs::read_to_string(&f) {
            Ok(t) => ApiToken {
                header: bearer(&t),
                from: f.display().to_string(),
            },
            Err(e) => ApiToken {
                header: None,
                from: format!(
                    "nowhere: not in FLASHPOOL_TOKEN, no --token-file, and {}: {e}",
                    f.display()
                ),
            },
        })
    }

    pub fn apply<B>(&self, r: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.header {
            Some(h) => r.header("Authorization", h),
            None => r,
        }
    }

    /// What to add to a refusal's message.
    pub fn hint(&self, status: u16) -> String {
        if status == 401 {
            format!(
                " (the CLI took the token from {}; set FLASHPOOL_TOKEN or --token-file to the node's \
                 token file, see docs/api.md, Authentication)",
                self.from
            )
        } else {
            String::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_token_name_is_by_address_and_namespace() {
        let n = runtime_token_name("127.0.0.1:9410", Some(4026531840));
        assert_eq!(n, "api-127.0.0.1_9410-net4026531840.token");
        let n = runtime_token_name("[::1]:9410", Some(7));
        assert_eq!(n, "api-___1__9410-net7.token");
        // Two namespaces, one loopback address: two files.
        assert_ne!(
            runtime_token_name("127.0.0.1:9410", Some(1)),
            runtime_token_name("127.0.0.1:9410", Some(2))
        );
        assert_eq!(
            runtime_token_name("127.0.0.1:9410", None),
            "api-127.0.0.1_9410.token"
        );
    }

    #[test]
    fn runtime_token_path_names_this_namespace() {
        let ns = net_ns().expect("Linux has /proc/self/ns/net");
        let p = runtime_token_path("127.0.0.1:9410");
        assert!(
            p.ends_with(format!("api-127.0.0.1_9410-net{ns}.token")),
            "{}",
            p.display()
        );
    }
}

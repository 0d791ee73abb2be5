//! The API token the CLI sends, and where it finds it: `FLASHPOOL_TOKEN`,
//! `--token-file`, else the file the node left for this `--api` address in
//! the runtime directory ([`runtime_token_path`], which the node writes).

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

/// `<runtime_dir>/api-<addr>.token` for API address `addr` (`ADDR:PORT`,
/// as given to `--api`; `:`, `[` and `]` become `_`).
pub fn runtime_token_path(addr: &str) -> PathBuf {
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
    runtime_dir().join(format!("api-{name}.token"))
}

/// The API token the CLI sends, and where it found it (for the error that
/// a refused one gets).
pub struct ApiToken {
    header: Option<String>,
    from: String,
}

impl ApiToken {
    /// `FLASHPOOL_TOKEN`, `--token-file` (`FLASHPOOL_TOKEN_FILE`), then the
    /// file the node left for this address in the runtime directory.
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
    fn runtime_token_path_is_by_address() {
        let p = runtime_token_path("127.0.0.1:9410");
        assert!(p.ends_with("api-127.0.0.1_9410.token"), "{}", p.display());
        let p = runtime_token_path("[::1]:9410");
        assert!(p.ends_with("api-___1__9410.token"), "{}", p.display());
    }
}

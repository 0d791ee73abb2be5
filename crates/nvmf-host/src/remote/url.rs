//! `tcp://ADDR:PORT/NQN?nsid=N`: where a remote namespace lives.

use std::fmt;

use blockdev::BlockError;
use nvme_wire::fabrics::NQN_MAX_LEN;

/// The NVMe/TCP I/O port when the URL names none.
pub const DEFAULT_PORT: u16 = 4420;

/// A parsed remote namespace address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteUrl {
    /// Host name or IP address, as written (IPv6 without brackets).
    pub host: String,
    pub port: u16,
    /// Subsystem NQN.
    pub nqn: String,
    /// Namespace ID (default 1).
    pub nsid: u32,
}

impl RemoteUrl {
    /// Parses `tcp://ADDR[:PORT]/NQN[?nsid=N]`; ADDR may be `[v6]`.
    pub fn parse(s: &str) -> Result<RemoteUrl, BlockError> {
        let bad = |why: String| {
            BlockError::Config(format!(
                "remote URL {s:?}: {why}; expected tcp://ADDR:PORT/NQN?nsid=N, \
                 e.g. tcp://10.0.0.2:4420/nqn.2026-01.io.flashpool:vol0?nsid=1"
            ))
        };
        let rest = s
            .strip_prefix("tcp://")
            .ok_or_else(|| bad("only the tcp:// scheme is supported".into()))?;
        let (authority, path) = rest
            .split_once('/')
            .ok_or_else(|| bad("no /NQN after the address".into()))?;
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| bad("unclosed [ in the address".into()))?;
            match after {
                "" => (h, None),
                p => (
                    h,
                    Some(
                        p.strip_prefix(':')
                            .ok_or_else(|| bad(format!("junk {p:?} after ]")))?,
                    ),
                ),
            }
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(bad("the address is empty".into()));
        }
        let port = match port {
            None => DEFAULT_PORT,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| bad(format!("port {p:?} is not a number from 1 to 65535")))?,
        };
        let (nqn, query) = match path.split_once('?') {
            Some((n, q)) => (n, Some(q)),
            None => (path, None),
        };
        if nqn.is_empty() || nqn.len() > NQN_MAX_LEN || !nqn.starts_with("nqn.") {
            return Err(bad(format!(
                "subsystem NQN {nqn:?} must start with \"nqn.\" and be at most {NQN_MAX_LEN} bytes"
            )));
        }
        let mut nsid = 1;
        for kv in query.into_iter().flat_map(|q| q.split('&')) {
            match kv.split_once('=') {
                Some(("nsid", v)) => {
                    nsid = v
                        .parse::<u32>()
                        .ok()
                        .filter(|&n| n != 0 && n != u32::MAX)
                        .ok_or_else(|| bad(format!("nsid {v:?} is not a namespace ID")))?;
                }
                _ => return Err(bad(format!("unknown parameter {kv:?} (only nsid=N)"))),
            }
        }
        Ok(RemoteUrl {
            host: host.to_string(),
            port,
            nqn: nqn.to_string(),
            nsid,
        })
    }
}

impl fmt::Display for RemoteUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "tcp://[{}]:{}", self.host, self.port)?;
        } else {
            write!(f, "tcp://{}:{}", self.host, self.port)?;
        }
        write!(f, "/{}?nsid={}", self.nqn, self.nsid)
    }
}

impl std::str::FromStr for RemoteUrl {
    type Err = BlockError;
    fn from_str(s: &str) -> Result<Self, BlockError> {
        RemoteUrl::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        let u =
            RemoteUrl::parse("tcp://10.77.0.12:4420/nqn.2026-01.io.flashpool:d0?nsid=3").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.nqn.as_str(), u.nsid),
            ("10.77.0.12", 4420, "nqn.2026-01.io.flashpool:d0", 3)
        );
        assert_eq!(
            u.to_string(),
            "tcp://10.77.0.12:4420/nqn.2026-01.io.flashpool:d0?nsid=3"
        );
        let u = RemoteUrl::parse("tcp://node-b/nqn.x:y").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.nsid), ("node-b", 4420, 1));
        let u = RemoteUrl::parse("tcp://[::1]:4421/nqn.x:y?nsid=2").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.nsid), ("::1", 4421, 2));
        assert_eq!(u.to_string(), "tcp://[::1]:4421/nqn.x:y?nsid=2");
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        for (s, want) in [
            ("rdma://a:1/nqn.x", "only the tcp://"),
            ("tcp://a:1", "no /NQN"),
            ("tcp://:1/nqn.x", "address is empty"),
            ("tcp://a:99999/nqn.x", "port \"99999\""),
            ("tcp://a:1/foo", "must start with \"nqn.\""),
            ("tcp://a:1/nqn.x?nsid=0", "nsid \"0\""),
            ("tcp://a:1/nqn.x?nsid=abc", "nsid \"abc\""),
            ("tcp://a:1/nqn.x?qid=1", "unknown parameter"),
            ("tcp://[::1/nqn.x", "unclosed ["),
        ] {
            let e = RemoteUrl::parse(s).unwrap_err().to_string();
            assert!(e.contains(want), "{s}: {e}");
            assert!(e.contains("expected tcp://ADDR:PORT/NQN?nsid=N"), "{e}");
        }
    }
}

//! `[node]` and `[api]`: how this daemon runs (reactors, CPUs, logs, state
//! directory, its name and secrets as a host) and where it answers the
//! management API.

use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSection {
    /// Reactor threads; 0 (the default) means one per CPU.
    #[serde(default)]
    pub reactors: usize,
    #[serde(default)]
    pub cpus: Vec<usize>,
    #[serde(default = "info")]
    pub log: String,
    /// How log lines are written: `text` (default) or `json`, one object
    /// per line with the event fields as keys (`flashpool serve --log-format`
    /// overrides it).
    #[serde(default)]
    pub log_format: LogFormat,
    /// Microseconds a connection keeps polling after activity before it
    /// sleeps (adaptive polling): an idle target still costs no CPU.
    #[serde(default = "default_poll_us")]
    pub poll_us: u32,
    /// Where the node keeps what the API changed (exports.json,
    /// drive-exports.json, remote-drives.json; docs/config.md). Without it,
    /// those changes last until the node stops.
    pub state_dir: Option<PathBuf>,
    /// This node's name among its peers (default: the hostname).
    pub name: Option<String>,
    /// The host NQN this node uses on other nodes' drives
    /// (default `nqn.2026-01.io.flashpool:node:<name>`).
    pub host_nqn: Option<String>,
    /// Its host ID, a UUID (default: derived from the host NQN, so stable).
    pub host_id: Option<String>,
    /// The DH-HMAC-CHAP secret this node presents on other nodes' drive
    /// exports (a file holding `DHHC-1:...`, mode 0600).
    pub dhchap_key_file: Option<PathBuf>,
    /// The secret those exports must prove (bidirectional authentication).
    pub dhchap_ctrl_key_file: Option<PathBuf>,
    /// This node's configured TLS PSK, for TLS to other nodes' exports
    /// (their `[[peer]] tls_key_file` holds the same key).
    pub tls_key_file: Option<PathBuf>,
    /// The key-encryption key that wraps encrypted volumes' keys (64 hex
    /// digits, mode 0600), made at the first start when absent. Default
    /// `<state_dir>/kek`. Every node of a cluster needs the same file.
    pub kek_file: Option<PathBuf>,
}

impl NodeSection {
    /// Where the KEK is kept: `kek_file`, else `<state_dir>/kek`; None
    /// without either (the node then refuses to make encrypted volumes).
    pub fn kek_path(&self) -> Option<PathBuf> {
        self.kek_file
            .clone()
            .or_else(|| self.state_dir.as_ref().map(|d| d.join("kek")))
    }
}

impl Default for NodeSection {
    fn default() -> Self {
        NodeSection {
            reactors: 0,
            cpus: Vec::new(),
            log: info(),
            log_format: LogFormat::default(),
            poll_us: default_poll_us(),
            state_dir: None,
            name: None,
            host_nqn: None,
            host_id: None,
            dhchap_key_file: None,
            dhchap_ctrl_key_file: None,
            tls_key_file: None,
            kek_file: None,
        }
    }
}

/// `[node] log_format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

fn default_poll_us() -> u32 {
    50
}

fn info() -> String {
    "info".into()
}

/// The management API (HTTP + JSON). Local only by default.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiSection {
    #[serde(default = "default_api_address")]
    pub address: String,
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The API token's file (mode 0600): read if it is there, else made.
    /// Default `<state_dir>/api-token`; without either, a new token each
    /// start, in the runtime file only (docs/api.md, Authentication).
    pub token_file: Option<PathBuf>,
    /// HTTPS: certificate chain and key (PEM). Required off loopback.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// The CA (PEM) this node trusts when it calls other nodes' APIs over
    /// HTTPS; default its own `tls_cert`.
    pub tls_ca: Option<PathBuf>,
    /// HTTPS only: the CA (PEM) of client certificates. A call on a
    /// connection with a certificate it signed needs no token.
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: every connection needs a client certificate, and
    /// every call the token as well.
    #[serde(default)]
    pub require_client_cert: bool,
    /// Names besides the bound address that `Host` may say (DNS names).
    #[serde(default)]
    pub host_names: Vec<String>,
    /// Also serve the API on this Unix socket; who may connect is decided
    /// by its mode (`unix_socket_mode`, default 0600), not by a token.
    pub unix_socket: Option<PathBuf>,
    pub unix_socket_mode: Option<String>,
}

impl Default for ApiSection {
    fn default() -> Self {
        ApiSection {
            address: default_api_address(),
            enabled: true,
            token_file: None,
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            client_ca: None,
            require_client_cert: false,
            host_names: Vec::new(),
            unix_socket: None,
            unix_socket_mode: None,
        }
    }
}

/// Where `flashpool serve` answers the management API and the CLI looks for it.
pub const DEFAULT_API_ADDRESS: &str = "127.0.0.1:9410";

fn default_api_address() -> String {
    DEFAULT_API_ADDRESS.into()
}

fn yes() -> bool {
    true
}

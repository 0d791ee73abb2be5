//! Which node the client calls and how: `--api`'s URL, and an HTTP agent
//! with the TLS its flags ask for (`--ca-file`, `--client-cert`).

use std::path::PathBuf;

use anyhow::Result;

use super::tls;

/// Which node to call and with what: `--api` and the files the CLI's
/// flags name.
#[derive(Debug, Clone, Default)]
pub struct Endpoint {
    /// `ADDR:PORT`, `http://ADDR:PORT` or `https://ADDR:PORT`.
    pub api: String,
    pub token_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

/// `http://ADDR:PORT` (or the `https://` given) and `ADDR:PORT` of `--api`.
pub fn api_base(api: &str) -> (String, &str) {
    let api = api.trim_end_matches('/');
    if let Some(h) = api.strip_prefix("https://") {
        (format!("https://{h}"), h)
    } else {
        let h = api.strip_prefix("http://").unwrap_or(api);
        (format!("http://{h}"), h)
    }
}

/// An agent for `--api` (with `--ca-file`'s roots and `--client-cert` for
/// https).
pub fn api_agent(
    api: &Endpoint,
    f: impl FnOnce(
        ureq::config::ConfigBuilder<ureq::typestate::AgentScope>,
    ) -> ureq::config::ConfigBuilder<ureq::typestate::AgentScope>,
) -> Result<ureq::Agent> {
    let roots = match &api.ca_file {
        Some(ca) => Some(tls::pem_certs("--ca-file", ca)?),
        None => None,
    };
    let cert = match (&api.client_cert, &api.client_key) {
        (Some(c), Some(k)) => Some(tls::client_cert(c, k, ["--client-cert", "--client-key"])?),
        _ => None,
    };
    let b = f(ureq::Agent::config_builder().http_status_as_error(false))
        .tls_config(tls::client_tls(roots.as_deref(), cert));
    Ok(b.build().into())
}

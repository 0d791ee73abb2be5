//! Node-to-node calls: a node asks another node's API (a move's target
//! whether it reaches a volume's members) with its own token and TLS.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use super::tls;
use crate::config::ApiSection;

/// Where a node's calls get the token they send: the node's current one
/// (the server's token, which rotation may change at any time).
pub trait BearerToken: Send + Sync {
    fn bearer(&self) -> String;
}

/// How this node calls other nodes' APIs (`POST /v1/cluster/probe`): with
/// its own token (a cluster shares one `[api] token_file`), over HTTPS to
/// an address advertised as `https://...`, trusting `[api] tls_ca` (or the
/// node's own `tls_cert`), and presenting its `tls_cert` as its client
/// certificate to a node that asks for one (`[api] client_ca`).
pub struct PeerApi {
    token: Arc<dyn BearerToken>,
    agent: ureq::Agent,
}

impl PeerApi {
    pub fn new(token: Arc<dyn BearerToken>, cfg: &ApiSection) -> Result<PeerApi> {
        let roots = match (&cfg.tls_ca, &cfg.tls_cert) {
            (Some(ca), _) => Some(tls::pem_certs("config: api.tls_ca", ca)?),
            (None, Some(own)) => Some(tls::pem_certs("config: api.tls_cert", own)?),
            (None, None) => None,
        };
        let cert = match (&cfg.tls_cert, &cfg.tls_key) {
            (Some(c), Some(k)) => Some(tls::client_cert(
                c,
                k,
                ["config: api.tls_cert", "config: api.tls_key"],
            )?),
            _ => None,
        };
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(5)))
            .tls_config(tls::client_tls(roots.as_deref(), cert))
            .build()
            .into();
        Ok(PeerApi { token, agent })
    }

    /// `POST <api>/v1<path>` with no body; `api` is a peer's advertised
    /// address (`ADDR:PORT` or `https://ADDR:PORT`).
    pub fn post(
        &self,
        api: &str,
        path: &str,
    ) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
        let url = if api.contains("://") {
            format!("{api}/v1{path}")
        } else {
            format!("http://{api}/v1{path}")
        };
        self.agent
            .post(&url)
            .header("Authorization", &format!("Bearer {}", self.token.bearer()))
            .send_empty()
    }
}

//! Node-to-node calls: a node asks another node's API (a move's target
//! whether it reaches a volume's members) with its own token and TLS.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use super::tls;
use crate::api_types::{ErrorBody, ProbeResult};
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
    /// None: a node with no API of its own (tests, `enabled = false`) has
    /// no token to send.
    token: Option<Arc<dyn BearerToken>>,
    agent: ureq::Agent,
}

/// Why a peer did not confirm a call.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// No answer: refused, timed out, or the TLS handshake failed.
    #[error("{0}")]
    Unreachable(String),
    /// It answered with an error; its message.
    #[error("{0}")]
    Refused(String),
    /// It answered a call passed on to it with an error status (a client
    /// error is the caller's to answer the same way); its message.
    #[error("{why}")]
    Answered { status: u16, why: String },
}

fn agent(tls: ureq::tls::TlsConfig) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .tls_config(tls)
        .build()
        .into()
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
        Ok(PeerApi {
            token: Some(token),
            agent: agent(tls::client_tls(roots.as_deref(), cert)),
        })
    }

    /// Calls without a token, trusting the public roots.
    pub fn anonymous() -> PeerApi {
        PeerApi {
            token: None,
            agent: agent(tls::client_tls(None, None)),
        }
    }

    /// `POST /v1/cluster/probe/{volume}` on the node whose API is `api`:
    /// whether it reaches every member of `volume`.
    pub fn probe(&self, api: &str, volume: &str) -> Result<ProbeResult, PeerError> {
        let mut r = self
            .post(api, &format!("/cluster/probe/{volume}"))
            .map_err(|e| PeerError::Unreachable(e.to_string()))?;
        if r.status().is_success() {
            return r
                .body_mut()
                .read_json()
                .map_err(|e| PeerError::Refused(format!("an answer that is not a probe's: {e}")));
        }
        let why = r.body_mut().read_json::<ErrorBody>().ok();
        Err(PeerError::Refused(
            why.map_or_else(|| "no reason given".to_string(), |b| b.error),
        ))
    }

    /// `POST /v1/volumes` on the node whose API is `api` (a thin volume
    /// of a cluster pool that node owns): its answer.
    pub fn create_volume(
        &self,
        api: &str,
        req: &crate::api_types::CreateVolume,
    ) -> Result<crate::api_types::VolumeInfo, PeerError> {
        let r = self
            .with_token(self.agent.post(&url(api, "/volumes")))
            .send_json(req);
        answer(r)
    }

    /// [`PeerApi::create_volume`] under QoS limits (`qos` of the body).
    pub fn create_volume_qos(
        &self,
        api: &str,
        req: &crate::api_types::CreateVolume,
        qos: Option<&crate::api_types::QosRequest>,
    ) -> Result<crate::api_types::VolumeInfo, PeerError> {
        let Some(qos) = qos else {
            return self.create_volume(api, req);
        };
        let mut body = serde_json::to_value(req)
            .map_err(|e| PeerError::Refused(format!("cannot encode the request: {e}")))?;
        if let Some(m) = body.as_object_mut() {
            m.insert(
                "qos".into(),
                serde_json::to_value(qos)
                    .map_err(|e| PeerError::Refused(format!("cannot encode the limits: {e}")))?,
            );
        }
        let r = self
            .with_token(self.agent.post(&url(api, "/volumes")))
            .send_json(body);
        answer(r)
    }

    /// `POST /v1/volumes/{name}/grow` on the node whose API is `api`.
    pub fn grow_volume(
        &self,
        api: &str,
        name: &str,
        size: &str,
        force: bool,
    ) -> Result<crate::api_types::VolumeInfo, PeerError> {
        let r = self
            .with_token(self.agent.post(&url(
                api,
                &format!("/volumes/{}/grow", super::segment(name)),
            )))
            .send_json(crate::api_types::GrowRequest {
                size: size.to_string(),
                force,
            });
        answer(r)
    }

    /// `POST /v1/drives/{name}/replace` on the node whose API is `api`.
    pub fn replace_drive(
        &self,
        api: &str,
        name: &str,
        with: &str,
    ) -> Result<crate::api_types::VolumeInfo, PeerError> {
        let path = format!("/drives/{}/replace", super::segment(name));
        let r = self
            .with_token(self.agent.post(&url(api, &path)))
            .send_json(crate::api_types::ReplaceRequest {
                with: with.to_string(),
            });
        answer(r)
    }

    /// `POST /v1/volumes/{pool}/expand` on the node whose API is `api`.
    pub fn expand_pool(
        &self,
        api: &str,
        pool: &str,
        req: &crate::api_types::ExpandPool,
    ) -> Result<crate::api_types::VolumeInfo, PeerError> {
        let path = format!("/volumes/{}/expand", super::segment(pool));
        let r = self
            .with_token(self.agent.post(&url(api, &path)))
            .send_json(req);
        answer(r)
    }

    /// `POST /v1/volumes/{name}/export` on the node whose API is `api`.
    pub fn export_volume(
        &self,
        api: &str,
        name: &str,
        req: &crate::api_types::ExportRequest,
    ) -> Result<crate::api_types::VolumeInfo, PeerError> {
        let path = format!("/volumes/{}/export", super::segment(name));
        let r = self
            .with_token(self.agent.post(&url(api, &path)))
            .send_json(req);
        answer(r)
    }

    /// `POST /v1/volumes/{name}/unexport` on the node whose API is `api`.
    pub fn unexport_volume(
        &self,
        api: &str,
        name: &str,
        force: bool,
    ) -> Result<crate::api_types::VolumeInfo, PeerError> {
        let path = format!("/volumes/{}/unexport", super::segment(name));
        let r = self
            .with_token(self.agent.post(&url(api, &path)))
            .send_json(crate::api_types::ForceRequest { force });
        answer(r)
    }

    /// `DELETE /v1/volumes/{name}` on the node whose API is `api`.
    pub fn delete_volume(&self, api: &str, name: &str, force: bool) -> Result<(), PeerError> {
        let path = format!("/volumes/{}?force={force}", super::segment(name));
        let r = self.with_token(self.agent.delete(&url(api, &path))).call();
        answer::<serde_json::Value>(r).map(|_| ())
    }

    /// `POST /v1/snapshots` on the node whose API is `api` (the owner of
    /// the volumes' cluster pool).
    pub fn snapshot_volumes(
        &self,
        api: &str,
        req: &crate::api_types::SnapshotGroupRequest,
    ) -> Result<Vec<crate::api_types::VolumeInfo>, PeerError> {
        let r = self
            .with_token(self.agent.post(&url(api, "/snapshots")))
            .send_json(req);
        answer(r)
    }

    /// `POST /v1/volumes/{snapshot}/clone` on the node whose API is `api`.
    pub fn clone_volume(
        &self,
        api: &str,
        snapshot: &str,
        req: &crate::api_types::CloneRequest,
    ) -> Result<crate::api_types::VolumeInfo, PeerError> {
        let path = format!("/volumes/{}/clone", super::segment(snapshot));
        let r = self
            .with_token(self.agent.post(&url(api, &path)))
            .send_json(req);
        answer(r)
    }

    /// `POST /v1/volumes/{name}/revert` on the node whose API is `api`.
    pub fn revert_volume(
        &self,
        api: &str,
        name: &str,
        req: &crate::api_types::RevertRequest,
    ) -> Result<crate::api_types::VolumeInfo, PeerError> {
        let path = format!("/volumes/{}/revert", super::segment(name));
        let r = self
            .with_token(self.agent.post(&url(api, &path)))
            .send_json(req);
        answer(r)
    }

    fn with_token<B>(&self, req: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(t) => req.header("Authorization", &format!("Bearer {}", t.bearer())),
            None => req,
        }
    }

    /// `POST <api>/v1<path>` with no body; `api` is a peer's advertised
    /// address (`ADDR:PORT` or `https://ADDR:PORT`).
    fn post(&self, api: &str, path: &str) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
        self.with_token(self.agent.post(&url(api, path)))
            .send_empty()
    }
}

/// The URL of `/v1<path>` on a peer's advertised API address.
fn url(api: &str, path: &str) -> String {
    if api.contains("://") {
        format!("{api}/v1{path}")
    } else {
        format!("http://{api}/v1{path}")
    }
}

/// A peer's JSON answer, or why there is none.
fn answer<T: serde::de::DeserializeOwned>(
    r: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
) -> Result<T, PeerError> {
    let mut r = r.map_err(|e| PeerError::Unreachable(e.to_string()))?;
    if r.status().is_success() {
        return r
            .body_mut()
            .read_json()
            .map_err(|e| PeerError::Refused(format!("an answer that cannot be read: {e}")));
    }
    let status = r.status();
    let why = r.body_mut().read_json::<ErrorBody>().ok();
    Err(PeerError::Answered {
        status: status.as_u16(),
        why: why.map_or_else(|| format!("HTTP {status} and no reason given"), |b| b.error),
    })
}

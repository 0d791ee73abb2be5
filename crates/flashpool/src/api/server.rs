//! Serving the API: binds `[api]`'s address (HTTPS with `tls_cert`,
//! required off loopback) and its Unix socket, behind [`super::auth`]'s
//! checks.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};

use super::auth::secure;
use super::auth::{ApiAuth, PeerInfo};
use super::handlers::App;
use super::listen;
use super::router::router;

/// What [`start`] serves on.
pub struct Started {
    /// The TCP address bound (with its scheme: `http://` on loopback only,
    /// else `https://`).
    pub addr: SocketAddr,
    pub url: String,
    pub auth: Arc<ApiAuth>,
}

/// `[api]` checked without binding anything: the address, and the HTTPS
/// server (`None` for plain HTTP, which is for loopback only). [`start`]
/// and `serve --check` both call it, so a file the check passes is not
/// refused at start.
pub fn check(
    cfg: &crate::config::ApiSection,
) -> Result<(SocketAddr, Option<Arc<rustls::ServerConfig>>)> {
    let addr = &cfg.address;
    let sa: SocketAddr = addr.parse().with_context(|| {
        format!("config: api.address = {addr:?} is not ADDR:PORT; use e.g. \"127.0.0.1:9410\"")
    })?;
    let tls = super::tls::server_config(cfg)?;
    if tls.is_none() && !sa.ip().is_loopback() {
        anyhow::bail!(
            "config: api.address = {sa} is not a loopback address, and off loopback the management \
             API is served over HTTPS only: set [api] tls_cert and tls_key (PEM files), or bind it \
             to 127.0.0.1 (see docs/config.md, [api])"
        );
    }
    Ok((sa, tls))
}

/// Binds the API as `[api]` says (HTTPS with `tls_cert`, required off
/// loopback; the Unix socket with `unix_socket`) behind the checks of
/// [`super::auth`], and serves it on `rt` until the process ends.
pub fn start(
    rt: &tokio::runtime::Runtime,
    app: App,
    cfg: &crate::config::ApiSection,
    state_dir: Option<&std::path::Path>,
) -> Result<Started> {
    let (sa, tls) = check(cfg)?;
    // The token files are written before the port opens: a client that
    // sees the port open finds the token already there.
    let auth = match sa.port() {
        0 => None,
        _ => Some(Arc::new(ApiAuth::load(cfg, state_dir, &sa.to_string())?)),
    };
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(sa))
        .with_context(|| {
            format!(
                "management API: cannot listen on {sa}; set [api] address to a free port, or enabled = false"
            )
        })?;
    let bound = listener.local_addr()?;
    let auth = match auth {
        Some(a) => a,
        None => Arc::new(ApiAuth::load(cfg, state_dir, &bound.to_string())?),
    };
    let app = secure(router(app), auth.clone());
    let scheme = if tls.is_some() { "https" } else { "http" };
    if let Some(path) = &cfg.unix_socket {
        let mode = match &cfg.unix_socket_mode {
            None => 0o600,
            Some(m) => u32::from_str_radix(m.trim_start_matches("0o"), 8)
                .ok()
                .filter(|m| *m & !0o777 == 0 && *m & 0o007 == 0)
                .with_context(|| {
                    format!(
                        "config: api.unix_socket_mode = {m:?} is not an octal mode without \
                         permissions for others, e.g. \"0600\" or \"0660\""
                    )
                })?,
        };
        let _in_rt = rt.enter();
        let l = listen::bind_unix(path, mode)?;
        let svc = app
            .clone()
            .into_make_service_with_connect_info::<PeerInfo>();
        tracing::info!("management API on unix:{} (mode {mode:o})", path.display());
        rt.spawn(async move {
            if let Err(e) = axum::serve(l, svc).await {
                tracing::error!("management API socket stopped: {e}");
            }
        });
    }
    let svc = app.into_make_service_with_connect_info::<PeerInfo>();
    match tls {
        Some(c) => {
            let _in_rt = rt.enter();
            let l = listen::Tls::new(listener, c)?;
            rt.spawn(async move {
                if let Err(e) = axum::serve(l, svc).await {
                    tracing::error!("management API stopped: {e}");
                }
            });
        }
        None => {
            rt.spawn(async move {
                if let Err(e) = axum::serve(listen::Plain(listener), svc).await {
                    tracing::error!("management API stopped: {e}");
                }
            });
        }
    }
    let url = format!("{scheme}://{bound}");
    tracing::info!("management API on {url}/v1/");
    Ok(Started {
        addr: bound,
        url,
        auth,
    })
}

//! TLS of the API's clients (the CLI, and a node calling other nodes):
//! the roots an `https://` API's certificate is checked against, and the
//! client certificate presented to a node that asks for one; with the PEM
//! readers the server's configuration ([`crate::api`]) uses too.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates in the PEM file `path`, at least one; an error names
/// the file and `what` named it (`config: api.tls_cert`, `--ca-file`).
pub fn pem_certs(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            anyhow!(
                "{what} = {}: cannot read PEM certificates: {e}",
                path.display()
            )
        })?;
    if certs.is_empty() {
        bail!("{what} = {}: no CERTIFICATE in it", path.display());
    }
    Ok(certs)
}

/// The private key in the PEM file `path`.
pub fn pem_key(what: &str, path: &Path) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| key_error(what, path, &e))
}

pub(crate) fn key_error(what: &str, path: &Path, e: &dyn std::fmt::Display) -> anyhow::Error {
    anyhow!(
        "{what} = {}: cannot read a PEM private key: {e}",
        path.display()
    )
}

/// The client certificate in the PEM files `cert` (a chain) and `key`,
/// for ureq; `what` names the two in errors. Checked to make a usable pair
/// now rather than at the first call.
pub fn client_cert(cert: &Path, key: &Path, what: [&str; 2]) -> Result<ureq::tls::ClientCert> {
    let [cert_what, key_what] = what;
    let chain = pem_certs(cert_what, cert)?;
    let text = std::fs::read(key).map_err(|e| key_error(key_what, key, &e))?;
    let der = PrivateKeyDer::from_pem_slice(&text).map_err(|e| key_error(key_what, key, &e))?;
    rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_client_auth_cert(chain.clone(), der)
        .with_context(|| format!("{cert_what} and {key_what} do not make a usable certificate"))?;
    let key = ureq::tls::PrivateKey::from_pem(&text).map_err(|e| key_error(key_what, key, &e))?;
    Ok(ureq::tls::ClientCert::new_with_certs(
        &ureq_certs(&chain),
        key,
    ))
}

fn ureq_certs(certs: &[CertificateDer<'static>]) -> Vec<ureq::tls::Certificate<'static>> {
    certs
        .iter()
        .map(|c| ureq::tls::Certificate::from_der(c.as_ref()).to_owned())
        .collect()
}

/// TLS for a client of the API: trusting `roots` (else the public web
/// roots), presenting `cert` to a server that asks for one.
pub fn client_tls(
    roots: Option<&[CertificateDer<'static>]>,
    cert: Option<ureq::tls::ClientCert>,
) -> ureq::tls::TlsConfig {
    let mut b = ureq::tls::TlsConfig::builder().client_cert(cert);
    if let Some(roots) = roots {
        b = b.root_certs(ureq::tls::RootCerts::new_with_certs(&ureq_certs(roots)));
    }
    b.build()
}

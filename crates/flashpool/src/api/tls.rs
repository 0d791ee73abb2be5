//! HTTPS for the management API: the server's configuration from `[api]`
//! (`tls_cert`, `tls_key`, and `client_ca` for client certificates), and
//! what a verified client certificate is called in the log. The clients'
//! TLS is [`crate::client::tls`].
//!
//! With `client_ca` the server asks every client for a certificate and
//! verifies one that is presented against that CA; a connection that
//! presents one the CA did not sign is refused in the handshake. Without
//! `require_client_cert` a client may also come with no certificate (and
//! then needs the token); with it, every connection needs a certificate and
//! every call the token as well ([`super::auth::ApiAuth`] decides).

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls_pki_types::{CertificateDer, UnixTime};

use crate::client::tls::{pem_certs, pem_key, provider};
use crate::config::ApiSection;

/// Characters of a certificate's name the log shows at most.
const MAX_NAME_CHARS: usize = 64;

/// The HTTPS server `[api]` describes, `None` for plain HTTP. A setting
/// that would be ignored is an error: client certificates are asked for in
/// the TLS handshake, so `client_ca` needs `tls_cert` and `tls_key`.
pub fn server_config(cfg: &ApiSection) -> Result<Option<Arc<rustls::ServerConfig>>> {
    let (cert, key) = match (&cfg.tls_cert, &cfg.tls_key) {
        (Some(c), Some(k)) => (c, k),
        (None, None) => {
            if let Some(ca) = &cfg.client_ca {
                bail!(
                    "config: api.client_ca = {}: client certificates are checked in the TLS \
                     handshake, and without tls_cert and tls_key the API is plain HTTP; set \
                     [api] tls_cert and tls_key as well, or remove client_ca",
                    ca.display()
                );
            }
            if cfg.require_client_cert {
                bail!(
                    "config: api.require_client_cert = true needs HTTPS with client \
                     certificates: set [api] tls_cert, tls_key and client_ca, or remove it"
                );
            }
            return Ok(None);
        }
        _ => bail!("config: [api] tls_cert and tls_key go together; set both or neither"),
    };
    let certs = pem_certs("config: api.tls_cert", cert)?;
    let key = pem_key("config: api.tls_key", key)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?;
    let builder = match &cfg.client_ca {
        Some(ca) => {
            let v = client_verifier(ca, cfg.require_client_cert)?;
            check_own_cert(v.as_ref(), &certs);
            builder.with_client_cert_verifier(v)
        }
        None if cfg.require_client_cert => bail!(
            "config: api.require_client_cert = true needs api.client_ca, the CA (PEM) that \
             signed the client certificates"
        ),
        None => builder.with_no_client_auth(),
    };
    let mut c = builder
        .with_single_cert(certs, key)
        .context("config: api.tls_cert and tls_key do not make a usable certificate")?;
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(Arc::new(c)))
}

/// Verifies client certificates against the CAs in `ca` (PEM); `required`:
/// a client without one is refused (else it may still use a token).
fn client_verifier(ca: &Path, required: bool) -> Result<Arc<dyn ClientCertVerifier>> {
    let mut roots = rustls::RootCertStore::empty();
    for c in pem_certs("config: api.client_ca", ca)? {
        roots.add(c).map_err(|e| {
            anyhow!(
                "config: api.client_ca = {}: a certificate in it is not a usable CA: {e}",
                ca.display()
            )
        })?;
    }
    let b = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
    let b = if required {
        b
    } else {
        b.allow_unauthenticated()
    };
    b.build()
        .map_err(|e| anyhow!("config: api.client_ca = {}: {e}", ca.display()))
}

/// A node presents its own `tls_cert` when it calls other nodes: warns at
/// start when its own `client_ca` would refuse it, as nodes sharing that
/// CA would (an extendedKeyUsage without clientAuth, another CA).
fn check_own_cert(v: &dyn ClientCertVerifier, chain: &[CertificateDer<'static>]) {
    let Some((leaf, rest)) = chain.split_first() else {
        return;
    };
    if let Err(e) = v.verify_client_cert(leaf, rest, UnixTime::now()) {
        tracing::warn!(
            "management API: [api] tls_cert is not a client certificate that [api] client_ca \
             accepts ({e}); nodes with the same client_ca refuse this node's calls \
             unless it allows clientAuth and that CA signed it"
        );
    }
}

/// Whether a failed handshake is a client certificate refused by
/// `client_ca` (none, or one it did not verify).
pub fn refused_client_cert(e: &std::io::Error) -> bool {
    matches!(
        e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()),
        Some(rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented)
    )
}

/// What a verified client certificate is called in the log and the audit
/// line: `cert:CN=<common name>`, else `cert:DNS=<its first DNS name>`,
/// else `cert:serial=<hex>`.
pub fn identity(cert: &CertificateDer<'_>) -> String {
    let Ok(ee) = webpki::EndEntityCert::try_from(cert) else {
        return "cert:unreadable".into();
    };
    if let Some(cn) = common_name(ee.subject()) {
        return format!("cert:CN={}", printable(&cn));
    }
    if let Some(dns) = ee.valid_dns_names().next() {
        return format!("cert:DNS={}", printable(dns));
    }
    let hex: String = ee.serial().iter().map(|b| format!("{b:02x}")).collect();
    format!("cert:serial={}", printable(&hex))
}

/// A name fit for a log line: no control characters, cut to
/// [`MAX_NAME_CHARS`].
fn printable(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(MAX_NAME_CHARS)
        .collect();
    if s.chars().nth(MAX_NAME_CHARS).is_some() {
        out.push('…');
    }
    out
}

/// One DER element at the start of `d`: its tag, its contents, and what
/// follows it.
fn der_next(d: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, d) = d.split_first()?;
    let (&first, mut d) = d.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let (bytes, rest) = d.split_at_checked(n)?;
        d = rest;
        bytes.iter().fold(0, |a, &b| a << 8 | usize::from(b))
    };
    let (contents, rest) = d.split_at_checked(len)?;
    Some((tag, contents, rest))
}

/// The first commonName in a certificate's subject (the contents of its
/// `Name` SEQUENCE: SETs of attribute type and value).
fn common_name(mut rdns: &[u8]) -> Option<String> {
    const OID: u8 = 0x06;
    const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03]; // 2.5.4.3
    while let Some((_, mut set, rest)) = der_next(rdns) {
        rdns = rest;
        while let Some((_, atv, rest)) = der_next(set) {
            set = rest;
            if let Some((OID, COMMON_NAME, value)) = der_next(atv) {
                let (_, text, _) = der_next(value)?;
                return Some(String::from_utf8_lossy(text).into_owned());
            }
        }
    }
    None
}
#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use axum::Router;
    use axum::routing::post;
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
        ExtendedKeyUsagePurpose, IsCa, KeyPair,
    };

    use super::*;
    use crate::api::auth::{ApiAuth, PeerInfo, secure};
    use crate::api::listen;
    use crate::api::token::Token;
    use crate::api_types::ProbeResult;
    use crate::client::{PeerApi, PeerError};

    fn params(cn: Option<&str>, sans: &[&str]) -> CertificateParams {
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut p = CertificateParams::new(sans).unwrap();
        p.distinguished_name = DistinguishedName::new();
        if let Some(cn) = cn {
            p.distinguished_name.push(DnType::CommonName, cn);
        }
        p
    }

    fn self_signed(cn: Option<&str>, sans: &[&str]) -> CertificateDer<'static> {
        let key = KeyPair::generate().unwrap();
        params(cn, sans).self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn a_certificate_is_named_by_its_common_name_else_its_dns_name_else_its_serial() {
        let c = self_signed(Some("node-b"), &["b.example"]);
        assert_eq!(identity(&c), "cert:CN=node-b");
        assert_eq!(
            identity(&self_signed(None, &["b.example"])),
            "cert:DNS=b.example"
        );
        let key = KeyPair::generate().unwrap();
        let mut p = params(None, &[]);
        p.serial_number = Some(vec![0x01, 0xab].into());
        let c = p.self_signed(&key).unwrap();
        assert_eq!(identity(c.der()), "cert:serial=01ab");
        // What a CA put in a name cannot forge a log line or fill it.
        let c = self_signed(Some(&format!("a\nb{}", "x".repeat(200))), &[]);
        let id = identity(&c);
        assert!(
            id.starts_with("cert:CN=a?bxxx") && id.ends_with('…'),
            "{id}"
        );
        assert!(id.chars().count() < 80, "{id}");
        assert_eq!(
            identity(&CertificateDer::from(vec![0x30, 0x03])),
            "cert:unreadable"
        );
    }

    #[test]
    fn the_der_reader_stops_at_bad_lengths() {
        assert_eq!(
            der_next(&[0x04, 0x02, 1, 2, 9]),
            Some((4, &[1u8, 2][..], &[9u8][..]))
        );
        assert_eq!(
            der_next(&[0x04, 0x81, 0x01, 7]),
            Some((4, &[7u8][..], &[][..]))
        );
        assert_eq!(der_next(&[0x04, 0x03, 1]), None);
        assert_eq!(der_next(&[0x04, 0x80]), None);
        assert_eq!(der_next(&[0x04, 0x85, 1, 1, 1, 1, 1]), None);
        assert_eq!(der_next(&[0x04, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(common_name(&[0x31, 0x05, 0x30, 0x03, 0x06, 0x01]), None);
    }

    /// A CA, and a certificate it signed for a node on 127.0.0.1 that
    /// serves and calls, as PEM files in `dir`: the node's `[api]`, asking
    /// for client certificates from that CA and the token as well.
    fn node_pki(dir: &Path) -> ApiSection {
        let mut ca = params(Some("test CA"), &[]);
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let mut node = params(Some("node-a"), &["127.0.0.1"]);
        node.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = node.signed_by(&key, &ca).unwrap();
        let file = |name: &str, text: String| -> Option<PathBuf> {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            Some(p)
        };
        let ca = file("ca.pem", ca.pem());
        ApiSection {
            tls_ca: ca.clone(),
            client_ca: ca,
            tls_cert: file("node.pem", cert.pem()),
            tls_key: file("node.key", key.serialize_pem()),
            require_client_cert: true,
            ..ApiSection::default()
        }
    }

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("flashpool-mtls-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_node_calls_others_with_its_certificate_and_its_token() {
        let dir = scratch("peer");
        let cfg = node_pki(&dir);
        let server = server_config(&cfg).unwrap().expect("HTTPS");
        let mut auth = ApiAuth::with_token(Token::generate().unwrap(), true);
        auth.cert_and_token = true;
        let auth = Arc::new(auth);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let app = secure(
            Router::new().route(
                "/v1/cluster/probe/{name}",
                post(|| async {
                    axum::Json(ProbeResult {
                        reachable: true,
                        volume: "v1".into(),
                    })
                }),
            ),
            auth.clone(),
        );
        let addr = rt.block_on(async {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let l = listen::Tls::new(l, server).unwrap();
            let svc = app.into_make_service_with_connect_info::<PeerInfo>();
            tokio::spawn(async move { axum::serve(l, svc).await });
            addr
        });
        let api = format!("https://{addr}");
        let call = |auth: &Arc<ApiAuth>, cfg: &ApiSection| {
            PeerApi::new(auth.clone(), cfg).unwrap().probe(&api, "v1")
        };
        // The node's tls_cert is its client certificate; the token goes too.
        assert!(call(&auth, &cfg).unwrap().reachable);
        // Without a certificate of its own the handshake is refused.
        let trust_only = ApiSection {
            tls_ca: cfg.client_ca.clone(),
            ..ApiSection::default()
        };
        assert!(matches!(
            call(&auth, &trust_only),
            Err(PeerError::Unreachable(_))
        ));
        // With the certificate and another token: refused as well.
        let other = Arc::new(ApiAuth::with_token(Token::generate().unwrap(), true));
        match call(&other, &cfg) {
            Err(PeerError::Refused(why)) => assert!(why.contains("token"), "{why}"),
            r => panic!("{r:?}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn client_certificate_settings_that_cannot_work_are_refused() {
        let dir = scratch("cfg");
        let full = node_pki(&dir);
        let err = |cfg: &ApiSection| format!("{:#}", server_config(cfg).unwrap_err());
        // Plain HTTP cannot ask for client certificates.
        let e = err(&ApiSection {
            client_ca: full.client_ca.clone(),
            ..ApiSection::default()
        });
        assert!(e.contains("api.client_ca") && e.contains("tls_cert"), "{e}");
        let e = err(&ApiSection {
            require_client_cert: true,
            ..ApiSection::default()
        });
        assert!(e.contains("require_client_cert"), "{e}");
        let e = err(&ApiSection {
            client_ca: None,
            tls_cert: full.tls_cert.clone(),
            tls_key: full.tls_key.clone(),
            require_client_cert: true,
            ..ApiSection::default()
        });
        assert!(e.contains("needs api.client_ca"), "{e}");
        // An empty or missing CA file is named with its key.
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        for ca in [empty, dir.join("missing.pem")] {
            let e = err(&ApiSection {
                client_ca: Some(ca.clone()),
                tls_cert: full.tls_cert.clone(),
                tls_key: full.tls_key.clone(),
                ..ApiSection::default()
            });
            let named = format!("config: api.client_ca = {}", ca.display());
            assert!(e.contains(&named), "{e}");
        }
        assert!(server_config(&full).unwrap().is_some());
        assert!(server_config(&ApiSection::default()).unwrap().is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

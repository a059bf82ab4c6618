//! `--secure`: the bench runs the proxy as a locked-down deployment would
//! (issue 12): HTTPS with a certificate from a CA the bench makes (rcgen),
//! a static token file with one bench user, and RBAC granting that user only
//! what the scenarios read. The bench's HTTP client then speaks TLS (rustls,
//! ring) trusting that CA and sends the user's bearer token on every request,
//! so the measured cost includes the handshake, record encryption,
//! authentication and the RBAC decision per request.

use std::ffi::OsString;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use hyper::header::HeaderValue;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::CertificateDer;

/// The bench user of the token file.
pub const BENCH_USER: &str = "watchcache-bench";

/// The RBAC policy: the bench user may get, list and watch pods in every
/// namespace (the scenarios write straight to etcd, never through the API).
const POLICY: &str = r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: watchcache-bench-pod-reader}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: watchcache-bench-pod-reader}
subjects:
- {kind: User, name: watchcache-bench, apiGroup: rbac.authorization.k8s.io}
roleRef: {kind: ClusterRole, name: watchcache-bench-pod-reader, apiGroup: rbac.authorization.k8s.io}
"#;

/// What the bench's HTTP client needs to reach a secure proxy.
#[derive(Clone)]
pub struct ClientTls {
    /// ALPN `h2`.
    pub h2: tokio_rustls::TlsConnector,
    /// ALPN `http/1.1`.
    pub h1: tokio_rustls::TlsConnector,
    /// `Bearer <token>` (None: no credentials, as a health probe).
    pub authorization: Option<HeaderValue>,
}

impl ClientTls {
    /// The same TLS settings without credentials: how probes reach the
    /// health endpoints.
    pub fn anonymous(&self) -> ClientTls {
        ClientTls {
            authorization: None,
            ..self.clone()
        }
    }
}

impl std::fmt::Debug for ClientTls {
    /// Never prints the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls { .. }")
    }
}

/// The files a secure daemon is started with, and the matching client.
pub struct SecureSetup {
    /// The daemon's flags (paths into the directory the files were written to).
    pub daemon_args: Vec<OsString>,
    pub client: Arc<ClientTls>,
}

impl SecureSetup {
    /// Writes a CA, a serving certificate for 127.0.0.1, the token file and
    /// the RBAC policy into `dir`. The client sends `token_override` instead
    /// of the bench user's token when given (to check that auth is on).
    pub fn generate(dir: &Path, token_override: Option<&str>) -> Result<SecureSetup> {
        let (ca_pem, ca_der, cert_pem, key_pem) = pki().context("generating certificates")?;
        let token = random_token();
        let files = [
            ("ca.crt", ca_pem),
            ("tls.crt", cert_pem),
            ("tls.key", key_pem),
            (
                "tokens.csv",
                format!("{token},{BENCH_USER},{BENCH_USER},\"watchcache-bench\"\n"),
            ),
            ("rbac.yaml", POLICY.to_string()),
        ];
        for (name, text) in &files {
            std::fs::write(dir.join(name), text)
                .with_context(|| format!("writing {}", dir.join(name).display()))?;
        }
        let arg = |flag: &str, file: &str| [OsString::from(flag), dir.join(file).into_os_string()];
        let mut daemon_args = Vec::new();
        daemon_args.extend(arg("--tls-cert-file", "tls.crt"));
        daemon_args.extend(arg("--tls-private-key-file", "tls.key"));
        daemon_args.extend(arg("--token-auth-file", "tokens.csv"));
        daemon_args.extend(["--authorization-mode".into(), "RBAC".into()]);
        daemon_args.extend(arg("--rbac-policy-file", "rbac.yaml"));

        let sent = token_override.unwrap_or(&token);
        Ok(SecureSetup {
            daemon_args,
            client: ClientTls::trusting(ca_der, sent)?,
        })
    }
}

impl ClientTls {
    /// A client trusting the CA `ca_der` that sends `Bearer token`.
    pub fn trusting(ca_der: CertificateDer<'static>, token: &str) -> Result<Arc<ClientTls>> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca_der).context("trusting the bench CA")?;
        let connector = |alpn: &[u8]| -> Result<tokio_rustls::TlsConnector> {
            let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .context("TLS versions")?
            .with_root_certificates(roots.clone())
            .with_no_client_auth();
            cfg.alpn_protocols = vec![alpn.to_vec()];
            Ok(tokio_rustls::TlsConnector::from(Arc::new(cfg)))
        };
        let authorization = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| anyhow!("the bearer token must be visible ASCII"))?;
        Ok(Arc::new(ClientTls {
            h2: connector(b"h2")?,
            h1: connector(b"http/1.1")?,
            authorization: Some(authorization),
        }))
    }
}

/// (CA PEM, CA DER, serving certificate PEM, serving key PEM).
pub fn pki() -> Result<(String, CertificateDer<'static>, String, String)> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "watchcache-bench-ca");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
    let mut leaf = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])?;
    leaf.distinguished_name
        .push(DnType::CommonName, "watchcache-bench-server");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    let key = KeyPair::generate()?;
    let cert = leaf.signed_by(&key, &ca)?;
    Ok((ca.pem(), ca.der().clone(), cert.pem(), key.serialize_pem()))
}

/// 32 random hex digits.
pub fn random_token() -> String {
    let a: u128 = rand::random();
    format!("{a:032x}")
}

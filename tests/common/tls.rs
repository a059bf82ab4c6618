//! Test PKI (rcgen) and a small HTTPS client (rustls + hyper) for the secure
//! serving tests: a CA, serving and client certificates written as PEM
//! files, and requests with a chosen client certificate or bearer token.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// A certificate authority whose key stays in memory.
pub struct TestCa {
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and its key, as PEM files.
#[derive(Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().expect("ca key");
        let cert = p.self_signed(&key).expect("ca cert");
        TestCa {
            cert_pem: cert.pem(),
            issuer: Issuer::new(p, key),
        }
    }

    /// Writes the CA certificate to `dir/{name}`.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, &self.cert_pem).expect("write ca");
        p
    }

    /// A serving certificate for 127.0.0.1 and localhost.
    pub fn server_cert(&self, dir: &Path, name: &str) -> CertFiles {
        let mut p = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .expect("server params");
        p.distinguished_name.push(DnType::CommonName, name);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(p, dir, name)
    }

    /// A client certificate: CN = user, O = group (kube-apiserver's mapping).
    pub fn client_cert(
        &self,
        dir: &Path,
        user: &str,
        group: Option<&str>,
        expired: bool,
    ) -> CertFiles {
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("client params");
        p.distinguished_name.push(DnType::CommonName, user);
        if let Some(g) = group {
            p.distinguished_name.push(DnType::OrganizationName, g);
        }
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if expired {
            p.not_before = rcgen::date_time_ymd(2001, 1, 1);
            p.not_after = rcgen::date_time_ymd(2002, 1, 1);
        }
        let name = if expired {
            format!("{user}-expired")
        } else {
            user.to_string()
        };
        self.sign(p, dir, &name)
    }

    fn sign(&self, p: CertificateParams, dir: &Path, name: &str) -> CertFiles {
        let key = KeyPair::generate().expect("key");
        let cert = p.signed_by(&key, &self.issuer).expect("sign");
        let files = CertFiles {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
        };
        std::fs::write(&files.cert, cert.pem()).expect("write cert");
        std::fs::write(&files.key, key.serialize_pem()).expect("write key");
        files
    }
}

/// What a test HTTPS request presents.
#[derive(Clone, Default)]
pub struct ClientAuth {
    pub cert: Option<CertFiles>,
    pub token: Option<String>,
}

impl ClientAuth {
    pub fn cert(files: &CertFiles) -> ClientAuth {
        ClientAuth {
            cert: Some(files.clone()),
            token: None,
        }
    }
    pub fn token(t: &str) -> ClientAuth {
        ClientAuth {
            cert: None,
            token: Some(t.to_string()),
        }
    }
    pub fn anonymous() -> ClientAuth {
        ClientAuth::default()
    }
}

/// A rustls client config trusting `ca_pem`, with an optional client
/// certificate, ALPN protocols and TLS versions.
pub fn client_config(
    ca_pem: &str,
    cert: Option<&CertFiles>,
    alpn: &[&[u8]],
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("ca pem")).expect("add root");
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .expect("versions")
    .with_root_certificates(roots);
    let mut config = match cert {
        Some(files) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
                .expect("cert file")
                .collect::<Result<_, _>>()
                .expect("cert pem");
            let key = PrivateKeyDer::from_pem_file(&files.key).expect("key pem");
            builder
                .with_client_auth_cert(chain, key)
                .expect("client cert")
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// A TLS connection to `addr` (the handshake result, to inspect ALPN and
/// the server certificate).
pub async fn connect(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from("127.0.0.1").expect("server name");
    tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
}

/// One HTTP/1.1 request over TLS; returns (status, body as text).
pub async fn request(
    addr: SocketAddr,
    ca_pem: &str,
    auth: &ClientAuth,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> (u16, String) {
    let config = client_config(
        ca_pem,
        auth.cert.as_ref(),
        &[b"http/1.1"],
        rustls::DEFAULT_VERSIONS,
    );
    let tls = connect(addr, config).await.expect("TLS handshake");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .expect("http handshake");
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    if let Some(t) = &auth.token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let bytes = match body {
        Some(v) => {
            req = req.header("content-type", "application/json");
            Bytes::from(v.to_string())
        }
        None => Bytes::new(),
    };
    let resp = sender
        .send_request(req.body(Full::new(bytes)).expect("request"))
        .await
        .expect("response");
    let code = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (code, String::from_utf8_lossy(&body).into_owned())
}

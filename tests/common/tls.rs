//! A small HTTPS client (rustls + hyper) for the secure serving tests:
//! requests with a chosen client certificate ([`super::pki::TestCa`]) or
//! bearer token.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

pub use super::pki::CertFiles;

/// What a test HTTPS request presents.
#[derive(Clone, Default)]
pub struct ClientAuth {
    pub cert: Option<CertFiles>,
    pub token: Option<String>,
    /// Further request headers (impersonation's `Impersonate-*`).
    pub headers: Vec<(String, String)>,
}

impl ClientAuth {
    pub fn cert(files: &CertFiles) -> ClientAuth {
        ClientAuth {
            cert: Some(files.clone()),
            ..ClientAuth::default()
        }
    }
    pub fn token(t: &str) -> ClientAuth {
        ClientAuth {
            token: Some(t.to_string()),
            ..ClientAuth::default()
        }
    }
    pub fn anonymous() -> ClientAuth {
        ClientAuth::default()
    }
    /// The same credentials, sending `name: value` too.
    pub fn with_header(mut self, name: &str, value: &str) -> ClientAuth {
        self.headers.push((name.to_string(), value.to_string()));
        self
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

/// One HTTP/1.1 request over TLS with a JSON body; returns (status, body
/// as text).
pub async fn request(
    addr: SocketAddr,
    ca_pem: &str,
    auth: &ClientAuth,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> (u16, String) {
    let body = body.map(|v| ("application/json", v.to_string()));
    request_with(addr, ca_pem, auth, method, path, body).await
}

/// One HTTP/1.1 request over TLS with a body of the given content type.
pub async fn request_with(
    addr: SocketAddr,
    ca_pem: &str,
    auth: &ClientAuth,
    method: &str,
    path: &str,
    body: Option<(&str, String)>,
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
    for (name, value) in &auth.headers {
        req = req.header(name.as_str(), value.as_str());
    }
    let bytes = match body {
        Some((content_type, text)) => {
            req = req.header("content-type", content_type);
            Bytes::from(text)
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

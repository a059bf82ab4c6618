//! TLS and mutual TLS to etcd (etcd's `TransportConfig{CertFile, KeyFile,
//! TrustedCAFile}`; kube-apiserver's `--etcd-cafile/--etcd-certfile/--etcd-keyfile`).
//!
//! The connection is made by our own connector (rustls, ring provider) under
//! the etcd client's tonic channel, instead of the client's built-in TLS
//! option, for three reasons the built-in option cannot serve: the files
//! are re-read when they change (certificate rotation without restart: the
//! next connection uses the new files), every failed handshake is counted
//! (`watchcache_etcd_tls_handshake_errors_total`) and kept for `/readyz`, and
//! start-up can check the files and one handshake and stop with a message
//! that names the field.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tracing::{info, warn};

use crate::config::EtcdTlsConfig;

/// A TLS setting that cannot work; names the config field and the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    #[error("field `{field}` ({path}): cannot read: {reason}")]
    Read {
        field: &'static str,
        path: String,
        reason: String,
    },
    #[error("field `{field}` ({path}): {reason}")]
    Invalid {
        field: &'static str,
        path: String,
        reason: String,
    },
    #[error("field `{field}`: {reason}")]
    Missing { field: &'static str, reason: String },
    /// etcd's certificate does not verify against `ca_file` (or `server_name`).
    #[error(
        "field `{field}` ({path}): etcd at {endpoint} presented a certificate that does not verify: {reason}"
    )]
    ServerNotVerified {
        field: &'static str,
        path: String,
        endpoint: String,
        reason: String,
    },
    /// etcd refused our client certificate (or its absence).
    #[error(
        "field `{field}` ({path}): etcd at {endpoint} refused the client certificate: {reason}"
    )]
    ClientRefused {
        field: &'static str,
        path: String,
        endpoint: String,
        reason: String,
    },
}

/// How long the start-up probe waits for etcd to speak first.
const PROBE_QUIET: Duration = Duration::from_millis(500);
/// HTTP/2 client connection preface plus an empty SETTINGS frame.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Config field names, as in `[etcd.tls]`.
const CA_FIELD: &str = "etcd.tls.ca_file";
const CERT_FIELD: &str = "etcd.tls.cert_file";
const KEY_FIELD: &str = "etcd.tls.key_file";
const NAME_FIELD: &str = "etcd.tls.server_name";

/// The TLS material of the etcd connection, reloaded when the files change.
pub struct EtcdTls {
    cfg: EtcdTlsConfig,
    loaded: Mutex<Loaded>,
    /// The latest handshake failure, cleared by a successful one (`/readyz`).
    last_error: Mutex<Option<String>>,
}

struct Loaded {
    /// Contents of ca, cert, key when loaded: a change means reload. The
    /// bytes, not mtimes: a rotation within one timestamp tick still counts,
    /// and reading three small files per new connection costs nothing.
    stamps: [Option<Vec<u8>>; 3],
    config: Arc<ClientConfig>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls").field("cfg", &self.cfg).finish()
    }
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

fn stamp(p: Option<&PathBuf>) -> Option<Vec<u8>> {
    std::fs::read(p?).ok()
}

fn read(field: &'static str, p: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(p).map_err(|e| TlsError::Read {
        field,
        path: path_str(p),
        reason: e.to_string(),
    })
}

/// Reads the files and builds the rustls client config; every failure
/// names the field and the file.
fn build(cfg: &EtcdTlsConfig) -> Result<ClientConfig, TlsError> {
    let Some(ca_path) = &cfg.ca_file else {
        return Err(TlsError::Missing {
            field: CA_FIELD,
            reason: "required for https:// endpoints (kube-apiserver: --etcd-cafile)".into(),
        });
    };
    let invalid = |field, p: &Path, reason: String| TlsError::Invalid {
        field,
        path: path_str(p),
        reason,
    };
    let ca_pem = read(CA_FIELD, ca_path)?;
    let mut roots = RootCertStore::empty();
    let mut n = 0;
    for c in CertificateDer::pem_slice_iter(&ca_pem) {
        let c = c.map_err(|e| invalid(CA_FIELD, ca_path, format!("unparsable PEM: {e}")))?;
        roots.add(c).map_err(|e| {
            invalid(
                CA_FIELD,
                ca_path,
                format!("not a usable CA certificate: {e}"),
            )
        })?;
        n += 1;
    }
    if n == 0 {
        return Err(invalid(
            CA_FIELD,
            ca_path,
            "no PEM CERTIFICATE block found".into(),
        ));
    }
    let provider = crate::tls::crypto_provider();
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(CA_FIELD, ca_path, e.to_string()))?
        .with_root_certificates(roots);
    let mut config = match (&cfg.cert_file, &cfg.key_file) {
        (None, None) => builder.with_no_client_auth(),
        (Some(_), None) => {
            return Err(TlsError::Missing {
                field: KEY_FIELD,
                reason: "cert_file is set, so key_file is required (--etcd-keyfile)".into(),
            });
        }
        (None, Some(_)) => {
            return Err(TlsError::Missing {
                field: CERT_FIELD,
                reason: "key_file is set, so cert_file is required (--etcd-certfile)".into(),
            });
        }
        (Some(cert_path), Some(key_path)) => {
            let cert_pem = read(CERT_FIELD, cert_path)?;
            let chain = CertificateDer::pem_slice_iter(&cert_pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| invalid(CERT_FIELD, cert_path, format!("unparsable PEM: {e}")))?;
            if chain.is_empty() {
                return Err(invalid(
                    CERT_FIELD,
                    cert_path,
                    "no PEM CERTIFICATE block found".into(),
                ));
            }
            let key_pem = read(KEY_FIELD, key_path)?;
            let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
                invalid(
                    KEY_FIELD,
                    key_path,
                    format!("no usable PEM private key: {e}"),
                )
            })?;
            CertifiedKey::from_der(chain.clone(), key.clone_key(), &provider).map_err(|e| {
                let reason = match e {
                    rustls::Error::InconsistentKeys(_) => format!(
                        "the private key does not match the certificate in {}",
                        path_str(cert_path)
                    ),
                    e => format!("unusable private key: {e}"),
                };
                invalid(KEY_FIELD, key_path, reason)
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| invalid(KEY_FIELD, key_path, e.to_string()))?
        }
    };
    // etcd's gRPC endpoint speaks HTTP/2 only.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

impl EtcdTls {
    /// Loads the files now, so a bad setting stops start-up.
    pub fn load(cfg: &EtcdTlsConfig) -> Result<Arc<EtcdTls>, TlsError> {
        if let Some(name) = &cfg.server_name
            && ServerName::try_from(name.clone()).is_err()
        {
            return Err(TlsError::Missing {
                field: NAME_FIELD,
                reason: format!("{name:?} is not a DNS name or IP address"),
            });
        }
        let config = Arc::new(build(cfg)?);
        Ok(Arc::new(EtcdTls {
            loaded: Mutex::new(Loaded {
                stamps: Self::stamps(cfg),
                config,
            }),
            cfg: cfg.clone(),
            last_error: Mutex::new(None),
        }))
    }

    fn stamps(cfg: &EtcdTlsConfig) -> [Option<Vec<u8>>; 3] {
        [
            stamp(cfg.ca_file.as_ref()),
            stamp(cfg.cert_file.as_ref()),
            stamp(cfg.key_file.as_ref()),
        ]
    }

    /// The client config for a new connection: rebuilt when a file changed
    /// since the last load. A rotation caught half-written keeps the
    /// previous config (and logs why) until the files are consistent again.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        let stamps = Self::stamps(&self.cfg);
        let mut loaded = self.loaded.lock();
        if stamps != loaded.stamps {
            match build(&self.cfg) {
                Ok(c) => {
                    info!("etcd TLS files changed; new connections use them");
                    loaded.config = Arc::new(c);
                    loaded.stamps = stamps;
                }
                Err(e) => {
                    warn!(error = %e, "etcd TLS files changed but cannot be used; keeping the previous ones");
                }
            }
        }
        Arc::clone(&loaded.config)
    }

    /// The latest handshake failure, if the latest handshake failed.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().clone()
    }

    fn server_name(&self, host: &str) -> Result<ServerName<'static>, String> {
        let name = self.cfg.server_name.as_deref().unwrap_or(host);
        // `[::1]` in a URL is `::1` as a name.
        let name = name.trim_start_matches('[').trim_end_matches(']');
        ServerName::try_from(name.to_string()).map_err(|e| format!("server name {name:?}: {e}"))
    }

    fn handshake_failed(&self, endpoint: &str, reason: String) {
        crate::metrics::metrics()
            .etcd_tls_handshake_errors
            .with_label_values(&[endpoint])
            .inc();
        let msg = format!("TLS handshake with {endpoint} failed: {reason}");
        let mut last = self.last_error.lock();
        if last.as_deref() != Some(msg.as_str()) {
            warn!(endpoint, %reason, "etcd TLS handshake failed");
        }
        *last = Some(msg);
    }

    fn handshake_ok(&self) {
        if self.last_error.lock().take().is_some() {
            info!("etcd TLS handshake succeeded again");
        }
    }

    /// TCP + TLS to one endpoint. `Ok(None)`: the TCP connection failed
    /// (etcd down is not a TLS problem).
    async fn handshake(
        self: &Arc<Self>,
        target: &Target,
    ) -> Result<Option<TlsStream<TcpStream>>, io::Error> {
        let tcp = match TcpStream::connect((target.host.as_str(), target.port)).await {
            Ok(t) => t,
            Err(_) => return Ok(None),
        };
        let _ = tcp.set_nodelay(true);
        let name = self
            .server_name(&target.host)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let connector = TlsConnector::from(self.client_config());
        connector.connect(name, tcp).await.map(Some)
    }

    /// Start-up check against the first endpoint that accepts TCP: a full
    /// handshake, then the HTTP/2 preface, so a client certificate etcd
    /// refuses (reported after the TLS 1.3 handshake) is caught too.
    /// Endpoints that are down are not an error (the connection is lazy).
    pub async fn probe(
        self: &Arc<Self>,
        endpoints: &[String],
        timeout: Duration,
    ) -> Result<(), TlsError> {
        for ep in endpoints {
            let Some(target) = Target::parse(ep) else {
                continue;
            };
            let attempt = async {
                let mut tls = match self.handshake(&target).await {
                    Ok(Some(s)) => s,
                    Ok(None) => return Ok(false),
                    Err(e) => return Err(e),
                };
                // etcd's HTTP/2 server speaks first (SETTINGS), and a
                // refused client certificate arrives as an alert right
                // after the handshake: read before writing, so our bytes
                // cannot race the alert into a connection reset.
                let mut buf = [0u8; 1];
                let first = tokio::time::timeout(PROBE_QUIET, tls.read(&mut buf)).await;
                let n = match first {
                    Ok(r) => r?,
                    Err(_) => {
                        // A server that waits for the client preface.
                        let _ = tls.write_all(H2_PREFACE).await;
                        let _ = tls.flush().await;
                        tls.read(&mut buf).await?
                    }
                };
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "etcd closed the connection",
                    ));
                }
                Ok(true)
            };
            match tokio::time::timeout(timeout, attempt).await {
                Err(_) | Ok(Ok(false)) => continue,
                Ok(Ok(true)) => return Ok(()),
                Ok(Err(e)) => return Err(self.classify(ep, &e)),
            }
        }
        Ok(())
    }

    /// Turns a failed probe into the config error it points at.
    fn classify(&self, endpoint: &str, e: &io::Error) -> TlsError {
        let p = |f: &Option<PathBuf>| f.as_deref().map(path_str).unwrap_or_default();
        match rustls_error(e) {
            Some(rustls::Error::InvalidCertificate(c)) => {
                let not_for_name = matches!(
                    c,
                    rustls::CertificateError::NotValidForName
                        | rustls::CertificateError::NotValidForNameContext { .. }
                );
                TlsError::ServerNotVerified {
                    field: if not_for_name { NAME_FIELD } else { CA_FIELD },
                    path: if not_for_name {
                        self.cfg
                            .server_name
                            .clone()
                            .unwrap_or_else(|| "endpoint host".into())
                    } else {
                        p(&self.cfg.ca_file)
                    },
                    endpoint: endpoint.to_string(),
                    reason: rustls::Error::InvalidCertificate(c.clone()).to_string(),
                }
            }
            Some(err @ rustls::Error::AlertReceived(_)) => TlsError::ClientRefused {
                field: CERT_FIELD,
                path: self
                    .cfg
                    .cert_file
                    .as_deref()
                    .map(path_str)
                    .unwrap_or_else(|| "not set: etcd requires a client certificate".into()),
                endpoint: endpoint.to_string(),
                reason: err.to_string(),
            },
            _ => TlsError::ServerNotVerified {
                field: CA_FIELD,
                path: p(&self.cfg.ca_file),
                endpoint: endpoint.to_string(),
                reason: e.to_string(),
            },
        }
    }
}

/// The rustls error inside an I/O error from tokio-rustls, if any.
fn rustls_error(e: &io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref::<rustls::Error>()
}

/// One `https://host:port` endpoint.
#[derive(Debug, Clone)]
struct Target {
    url: String,
    host: String,
    port: u16,
}

impl Target {
    fn parse(url: &str) -> Option<Target> {
        let rest = url.strip_prefix("https://")?.trim_end_matches('/');
        let (host, port) = rest.rsplit_once(':')?;
        Some(Target {
            url: url.to_string(),
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port: port.parse().ok()?,
        })
    }
}

/// The tonic connector: dials the endpoints in turn (starting with the one
/// that worked last), TLS with the current files, counts failures.
#[derive(Clone)]
pub struct Connector {
    tls: Arc<EtcdTls>,
    targets: Arc<Vec<Target>>,
    current: Arc<AtomicUsize>,
}

impl Connector {
    pub fn new(tls: Arc<EtcdTls>, endpoints: &[String]) -> Connector {
        Connector {
            tls,
            targets: Arc::new(endpoints.iter().filter_map(|e| Target::parse(e)).collect()),
            current: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub async fn connect(self) -> Result<TokioIo<Observed>, io::Error> {
        let n = self.targets.len();
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no https:// etcd endpoint",
            ));
        }
        let start = self.current.load(Ordering::Relaxed);
        let mut last = io::Error::new(
            io::ErrorKind::ConnectionRefused,
            "no etcd endpoint answered",
        );
        for i in 0..n {
            let idx = (start + i) % n;
            let t = &self.targets[idx];
            match self.tls.handshake(t).await {
                Ok(Some(stream)) => {
                    self.current.store(idx, Ordering::Relaxed);
                    return Ok(TokioIo::new(Observed {
                        inner: stream,
                        tls: Arc::clone(&self.tls),
                        endpoint: t.url.clone(),
                        read_ok: false,
                    }));
                }
                Ok(None) => {
                    last = io::Error::new(
                        io::ErrorKind::ConnectionRefused,
                        format!("{}: connection refused or unreachable", t.url),
                    );
                }
                Err(e) => {
                    self.tls.handshake_failed(&t.url, e.to_string());
                    last = e;
                }
            }
        }
        Err(last)
    }
}

/// A TLS stream that reports a TLS alert on its first read as a failed
/// handshake: with TLS 1.3 the server refuses a client certificate only
/// after the client considers the handshake done.
pub struct Observed {
    inner: TlsStream<TcpStream>,
    tls: Arc<EtcdTls>,
    endpoint: String,
    read_ok: bool,
}

impl AsyncRead for Observed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if !self.read_ok {
            match &r {
                // The first bytes from etcd: it accepted us too.
                Poll::Ready(Ok(())) if !buf.filled().is_empty() => {
                    self.read_ok = true;
                    self.tls.handshake_ok();
                }
                Poll::Ready(Err(e)) if rustls_error(e).is_some() => {
                    let reason = e.to_string();
                    self.tls.handshake_failed(&self.endpoint, reason);
                }
                _ => {}
            }
        }
        r
    }
}

impl AsyncWrite for Observed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_files_name_the_field() {
        let cfg = EtcdTlsConfig {
            ca_file: Some("/nonexistent/ca.crt".into()),
            cert_file: None,
            key_file: None,
            server_name: None,
        };
        let e = EtcdTls::load(&cfg).unwrap_err().to_string();
        assert!(
            e.contains(CA_FIELD) && e.contains("/nonexistent/ca.crt"),
            "{e}"
        );
        let e = EtcdTls::load(&EtcdTlsConfig {
            ca_file: None,
            ..cfg.clone()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains(CA_FIELD), "{e}");
    }

    /// (cert PEM, key PEM) of a fresh self-signed certificate.
    fn self_signed() -> (String, String) {
        let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        (c.cert.pem(), c.signing_key.serialize_pem())
    }

    #[test]
    fn files_are_reloaded_on_change_and_a_broken_rotation_keeps_the_old_ones() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, _) = self_signed();
        let (cert, key) = self_signed();
        std::fs::write(dir.path().join("ca.crt"), &ca).unwrap();
        std::fs::write(dir.path().join("c.crt"), &cert).unwrap();
        std::fs::write(dir.path().join("c.key"), &key).unwrap();
        let cfg = EtcdTlsConfig {
            ca_file: Some(dir.path().join("ca.crt")),
            cert_file: Some(dir.path().join("c.crt")),
            key_file: Some(dir.path().join("c.key")),
            server_name: None,
        };
        let tls = EtcdTls::load(&cfg).unwrap();
        let first = tls.client_config();
        assert!(
            Arc::ptr_eq(&first, &tls.client_config()),
            "unchanged files: same config"
        );

        // Half-way through a rotation: new certificate, old key.
        let (cert2, key2) = self_signed();
        std::fs::write(dir.path().join("c.crt"), &cert2).unwrap();
        assert!(
            Arc::ptr_eq(&first, &tls.client_config()),
            "mismatched pair: keep the old"
        );
        assert!(
            EtcdTls::load(&cfg)
                .unwrap_err()
                .to_string()
                .contains("does not match")
        );

        // Rotation complete.
        std::fs::write(dir.path().join("c.key"), &key2).unwrap();
        let second = tls.client_config();
        assert!(!Arc::ptr_eq(&first, &second), "new files: new config");
        assert!(Arc::ptr_eq(&second, &tls.client_config()));
    }

    #[test]
    fn target_parse() {
        let t = Target::parse("https://127.0.0.1:2379").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("127.0.0.1", 2379));
        let t = Target::parse("https://[::1]:2379/").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 2379));
        assert!(Target::parse("http://127.0.0.1:2379").is_none());
    }
}

//! Serving TLS (`--tls-cert-file`, `--tls-private-key-file`,
//! `--tls-min-version`, kube-apiserver's names): a rustls `ServerConfig`
//! (ring provider) with ALPN `h2` and `http/1.1`, the client-certificate
//! request of a verifier (`crate::auth::x509`'s) when a client CA is configured, and a
//! certificate that is re-read when its files change.
//!
//! Reloading: [`ReloadingCert`] holds the current certificate in an
//! `ArcSwap` that handshakes read; [`watch_files`] re-reads the files every
//! few seconds on the blocking pool and swaps in the new pair when its content
//! changed and it parses (a half-written or mismatched pair keeps the old one and logs).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::provider::crypto_provider;

/// How often the certificate files are checked for changes.
pub const RELOAD_CHECK_INTERVAL: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{file}: cannot read: {message}")]
    Read { file: String, message: String },
    #[error("{file}: no certificate found")]
    NoCertificate { file: String },
    #[error("{cert_file}, {key_file}: {message}")]
    KeyPair {
        cert_file: String,
        key_file: String,
        message: String,
    },
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// `--tls-min-version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MinVersion {
    #[default]
    Tls12,
    Tls13,
}

impl MinVersion {
    /// Parses kube-apiserver's names (`VersionTLS12`, `VersionTLS13`).
    pub fn parse(s: &str) -> Result<MinVersion, String> {
        match s {
            "VersionTLS12" => Ok(MinVersion::Tls12),
            "VersionTLS13" => Ok(MinVersion::Tls13),
            "VersionTLS10" | "VersionTLS11" => Err(format!(
                "{s} is not supported (TLS 1.0 and 1.1 are obsolete): use VersionTLS12 or VersionTLS13"
            )),
            _ => Err(format!(
                "unknown TLS version {s:?}: want VersionTLS12 or VersionTLS13"
            )),
        }
    }
}

/// One certificate/key file pair.
#[derive(Debug, Clone)]
struct Files {
    cert: PathBuf,
    key: PathBuf,
}

/// The bytes of both files as read together.
type Contents = (Vec<u8>, Vec<u8>);

impl Files {
    fn read(&self) -> Result<Contents, TlsError> {
        let read = |p: &Path| {
            std::fs::read(p).map_err(|e| TlsError::Read {
                file: p.display().to_string(),
                message: e.to_string(),
            })
        };
        Ok((read(&self.cert)?, read(&self.key)?))
    }

    fn parse(
        &self,
        contents: &Contents,
        provider: &CryptoProvider,
    ) -> Result<CertifiedKey, TlsError> {
        let cert_file = self.cert.display().to_string();
        let key_file = self.key.display().to_string();
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&contents.0)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::Read {
                file: cert_file.clone(),
                message: e.to_string(),
            })?;
        if chain.is_empty() {
            return Err(TlsError::NoCertificate { file: cert_file });
        }
        let key = PrivateKeyDer::from_pem_slice(&contents.1).map_err(|e| TlsError::Read {
            file: key_file.clone(),
            message: e.to_string(),
        })?;
        CertifiedKey::from_der(chain, key, provider).map_err(|e| TlsError::KeyPair {
            cert_file,
            key_file,
            message: e.to_string(),
        })
    }
}

/// The serving certificate, swapped when its files change.
#[derive(Debug)]
pub struct ReloadingCert {
    files: Files,
    provider: Arc<CryptoProvider>,
    current: ArcSwap<CertifiedKey>,
    /// What the files held at the last successful load. Changes are found by
    /// content, not mtime: mtimes tick coarsely, and a Secret volume swaps a
    /// symlink.
    loaded: parking_lot::Mutex<Contents>,
}

impl ReloadingCert {
    pub fn load(cert: &Path, key: &Path) -> Result<ReloadingCert, TlsError> {
        let files = Files {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        };
        let provider = crypto_provider();
        let contents = files.read()?;
        let current = files.parse(&contents, &provider)?;
        Ok(ReloadingCert {
            files,
            provider,
            current: ArcSwap::from_pointee(current),
            loaded: parking_lot::Mutex::new(contents),
        })
    }

    /// Re-reads the files and swaps in the pair if it changed and parses.
    /// Blocking (file I/O): call it off the async runtime. Returns whether a
    /// new certificate is in use.
    pub fn reload_if_changed(&self) -> bool {
        let contents = match self.files.read() {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "serving certificate unreadable; keeping the previous one");
                return false;
            }
        };
        let mut loaded = self.loaded.lock();
        if *loaded == contents {
            return false;
        }
        match self.files.parse(&contents, &self.provider) {
            Ok(key) => {
                self.current.store(Arc::new(key));
                *loaded = contents;
                info!(cert = %self.files.cert.display(), "serving certificate reloaded");
                true
            }
            Err(e) => {
                // Keep serving the old pair; a writer may be half way through.
                warn!(error = %e, "serving certificate changed but cannot be loaded; keeping the previous one");
                false
            }
        }
    }

    /// The certificate handshakes use now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.load_full()
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// Checks the certificate files every [`RELOAD_CHECK_INTERVAL`] until
/// `stop` is cancelled.
pub async fn watch_files(cert: Arc<ReloadingCert>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(RELOAD_CHECK_INTERVAL) => {}
        }
        let c = Arc::clone(&cert);
        let _ = tokio::task::spawn_blocking(move || c.reload_if_changed()).await;
    }
}

/// The server's TLS settings, loaded.
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub cert: Arc<ReloadingCert>,
    pub config: Arc<rustls::ServerConfig>,
}

impl ServerTls {
    /// Loads the certificate pair and builds the rustls config; with a
    /// client certificate verifier (`--client-ca-file`'s), clients are asked for (but not required to send) a
    /// certificate.
    pub fn new(
        cert_file: &Path,
        key_file: &Path,
        min_version: MinVersion,
        client_verifier: Option<Arc<dyn ClientCertVerifier>>,
    ) -> Result<ServerTls, TlsError> {
        let cert = Arc::new(ReloadingCert::load(cert_file, key_file)?);
        let versions: &[&'static rustls::SupportedProtocolVersion] = match min_version {
            MinVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
            MinVersion::Tls13 => &[&rustls::version::TLS13],
        };
        let builder = rustls::ServerConfig::builder_with_provider(crypto_provider())
            .with_protocol_versions(versions)
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = match client_verifier {
            Some(verifier) => builder.with_client_cert_verifier(verifier),
            None => builder.with_no_client_auth(),
        };
        let mut config =
            builder.with_cert_resolver(Arc::clone(&cert) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(ServerTls {
            cert,
            config: Arc::new(config),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, cn: &str) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let cert = p.self_signed(&key).unwrap();
        let (c, k) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    #[test]
    fn min_version_names() {
        assert_eq!(MinVersion::parse("VersionTLS12"), Ok(MinVersion::Tls12));
        assert_eq!(MinVersion::parse("VersionTLS13"), Ok(MinVersion::Tls13));
        assert!(MinVersion::parse("VersionTLS11").is_err());
        assert!(MinVersion::parse("tls12").is_err());
    }

    #[test]
    fn reloads_when_files_change_and_keeps_old_on_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k) = write_pair(dir.path(), "one");
        let tls = ServerTls::new(&c, &k, MinVersion::Tls12, None).unwrap();
        assert_eq!(
            tls.config.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
        let first = tls.cert.current();
        assert!(!tls.cert.reload_if_changed(), "unchanged files: no reload");
        // Garbage: the old certificate stays.
        std::fs::write(&c, "not a certificate").unwrap();
        assert!(!tls.cert.reload_if_changed());
        assert_eq!(tls.cert.current().cert, first.cert);
        // A new pair is picked up.
        write_pair(dir.path(), "two");
        assert!(tls.cert.reload_if_changed());
        assert_ne!(tls.cert.current().cert, first.cert);
    }

    #[test]
    fn errors_name_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let (c, _) = write_pair(dir.path(), "one");
        let other = tempfile::tempdir().unwrap();
        let (_, k2) = write_pair(other.path(), "two");
        let e = ServerTls::new(&c, &k2, MinVersion::Tls12, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("tls.crt") && e.contains("tls.key"), "{e}");
        let e = ServerTls::new(
            &dir.path().join("missing.crt"),
            &k2,
            MinVersion::Tls12,
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("missing.crt"), "{e}");
    }
}

//! The crypto provider of every TLS config of the process (ring).

use std::sync::Arc;

use rustls::crypto::CryptoProvider;

/// The crypto provider of every TLS config of the server (ring), passed
/// explicitly so the process-wide default does not matter.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

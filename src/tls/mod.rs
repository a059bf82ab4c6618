//! TLS, in one place: the crypto provider every TLS config uses
//! ([`provider`]) and the REST API's server side ([`server`]: certificate,
//! reloading, ALPN). It imports nothing from `auth/`: the client
//! certificate verifier comes in as rustls's trait object.

pub mod provider;
pub mod server;

pub use provider::crypto_provider;
pub use server::{MinVersion, ReloadingCert, ServerTls, TlsError, watch_files};

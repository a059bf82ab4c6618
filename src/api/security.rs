//! The security settings loaded at start ([`Security`]): TLS, the
//! authenticator and the authorizer, each read from the files the config
//! names. The filters that apply them to each request are
//! [`crate::api::pipeline::admit`]'s.

use std::sync::Arc;

use crate::auth::rbac::{Policy, RbacError};
use crate::auth::token_file::{TokenFile, TokenFileError};
use crate::auth::x509::{CertAuthenticator, ClientCaError};
use crate::auth::{Authenticator, Authorizer};
use crate::config::{AuthorizationMode, ServerConfig};
use crate::tls::{MinVersion, ServerTls, TlsError};

#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
    #[error("--client-ca-file: {0}")]
    ClientCa(#[from] ClientCaError),
    #[error("--token-auth-file: {0}")]
    Tokens(#[from] TokenFileError),
    #[error("--rbac-policy-file: {0}")]
    Rbac(#[from] RbacError),
    #[error("{0}")]
    Config(String),
}

/// Authentication, authorization and TLS as configured.
pub struct Security {
    pub authenticator: Authenticator,
    pub authorizer: Authorizer,
    pub tls: Option<ServerTls>,
}

impl Security {
    /// Today's default: plain HTTP, everyone anonymous and allowed.
    pub fn insecure() -> Security {
        Security {
            authenticator: Authenticator::anonymous_only(),
            authorizer: Authorizer::AlwaysAllow,
            tls: None,
        }
    }

    /// Reads every file the config names (certificates, token file, policy
    /// files); each error names its file.
    pub fn from_config(cfg: &ServerConfig) -> Result<Security, SecurityError> {
        let authn = &cfg.authentication;
        let x509 = authn
            .client_ca_file
            .as_deref()
            .map(CertAuthenticator::load)
            .transpose()?;
        let tokens = authn
            .token_auth_file
            .as_deref()
            .map(TokenFile::load)
            .transpose()?;
        let tls = match &cfg.tls {
            Some(t) => {
                let min = MinVersion::parse(&t.min_version).map_err(SecurityError::Config)?;
                Some(ServerTls::new(
                    &t.cert_file,
                    &t.private_key_file,
                    min,
                    x509.as_ref().map(CertAuthenticator::handshake_verifier),
                )?)
            }
            None if x509.is_some() => {
                return Err(SecurityError::Config(
                    "--client-ca-file needs TLS (--tls-cert-file, --tls-private-key-file)".into(),
                ));
            }
            None => None,
        };
        let authorizer = match cfg.authorization.mode {
            AuthorizationMode::AlwaysAllow => Authorizer::AlwaysAllow,
            AuthorizationMode::Rbac => {
                Authorizer::Rbac(Arc::new(Policy::load(&cfg.authorization.policy_files)?))
            }
        };
        tracing::info!(
            tls = tls.is_some(),
            client_certificates = x509.is_some(),
            tokens = tokens.as_ref().map_or(0, TokenFile::len),
            anonymous = authn.anonymous_enabled(),
            authorization = if authorizer.is_rbac() {
                "RBAC"
            } else {
                "AlwaysAllow"
            },
            "secure serving"
        );
        Ok(Security {
            authenticator: Authenticator::new(x509, tokens, authn.anonymous_enabled()),
            authorizer,
            tls,
        })
    }
}

//! Secure serving: the security settings loaded at start ([`Security`]) and
//! the filters kube-apiserver runs before every handler, in its order:
//! authentication (401), authorization (403), then the handler; one audit
//! line per mutating or denied request.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::AUTHORIZATION;
use hyper::{Method, Request};
use tracing::debug;

use super::params::Query;
use super::{ApiStatus, State};
use crate::auth::rbac::{Policy, RbacError};
use crate::auth::token_file::{TokenFile, TokenFileError};
use crate::auth::x509::{CertAuthenticator, ClientCaError};
use crate::auth::{
    Attributes, Authenticator, AuthnError, Authorizer, ConnectionIdentity, UserInfo,
};
use crate::config::{AuthorizationMode, ServerConfig};
use crate::server_tls::{MinVersion, ServerTls, TlsError};

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
                    x509.as_ref(),
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
        Ok(Security {
            authenticator: Authenticator::new(x509, tokens, authn.anonymous_enabled()),
            authorizer,
            tls,
        })
    }
}

/// Per-connection facts, put into every request's extensions by the
/// connection task: what the client certificate proved.
#[derive(Clone, Default)]
pub struct Connection {
    pub identity: Arc<ConnectionIdentity>,
}

/// A request that passed authentication and authorization.
pub(crate) struct Admitted {
    pub user: Option<UserInfo>,
    pub attrs: Attributes,
}

/// Paths probes reach without credentials even when anonymous access is off
/// (kube's always-allow health paths).
fn is_health_path(path: &str) -> bool {
    ["/healthz", "/livez", "/readyz"]
        .iter()
        .any(|p| path == *p || path.strip_prefix(p).is_some_and(|r| r.starts_with('/')))
}

/// Authenticates and authorizes `req`; the user is put into the request's
/// extensions for the handlers (self reviews). `Err` is the 401 or 403
/// `Status`, already counted and audited.
pub(crate) fn admit(state: &State, req: &mut Request<Incoming>) -> Result<Admitted, ApiStatus> {
    let attrs = attributes(req);
    let m = crate::metrics::metrics();
    let identity = req
        .extensions()
        .get::<Connection>()
        .map(|c| Arc::clone(&c.identity));
    let none: ConnectionIdentity = None;
    let result = state.security.authenticator.authenticate(
        identity.as_deref().unwrap_or(&none),
        req.headers().get(AUTHORIZATION).map(|v| v.as_bytes()),
    );
    let user = match result {
        Ok(user) => {
            let label = if user.is_anonymous() {
                "anonymous"
            } else {
                "success"
            };
            m.authentication_attempts.with_label_values(&[label]).inc();
            user
        }
        Err(AuthnError::NoCredentials)
            if is_health_path(&attrs.path)
                && (req.method() == Method::GET || req.method() == Method::HEAD) =>
        {
            m.authentication_attempts
                .with_label_values(&["anonymous"])
                .inc();
            return Ok(Admitted { user: None, attrs });
        }
        Err(e) => {
            m.authentication_attempts
                .with_label_values(&["failure"])
                .inc();
            debug!(error = %e, path = %attrs.path, "authentication failed");
            audit(None, &attrs, 401);
            return Err(ApiStatus::new(401, "Unauthorized", "Unauthorized"));
        }
    };
    let decision = state.security.authorizer.authorize(&user, &attrs);
    if !decision.allowed {
        m.authorization_decisions
            .with_label_values(&["denied"])
            .inc();
        audit(Some(&user), &attrs, 403);
        let mut status = ApiStatus::new(
            403,
            "Forbidden",
            attrs.forbidden_message(&user, &decision.reason),
        );
        if attrs.is_resource_request && !attrs.name.is_empty() {
            status = status.with_details(attrs.name.clone(), attrs.resource.clone());
        }
        return Err(status);
    }
    m.authorization_decisions
        .with_label_values(&["allowed"])
        .inc();
    req.extensions_mut().insert(user.clone());
    Ok(Admitted {
        user: Some(user),
        attrs,
    })
}

/// After the handler: the audit line of a mutating request.
pub(crate) fn finish(admitted: &Admitted, code: u16) {
    if admitted.attrs.is_mutating() {
        audit(admitted.user.as_ref(), &admitted.attrs, code);
    }
}

/// One structured line, target `audit`: who did what to which object and
/// the answer's code. Never bodies or credentials.
fn audit(user: Option<&UserInfo>, attrs: &Attributes, code: u16) {
    let (name, groups) = match user {
        Some(u) => (u.name.as_str(), u.groups.join(",")),
        None => ("", String::new()),
    };
    tracing::info!(
        target: "audit",
        user = name,
        groups = %groups,
        verb = %attrs.verb,
        api_group = %attrs.api_group,
        resource = %attrs.resource,
        subresource = %attrs.subresource,
        namespace = %attrs.namespace,
        name = %attrs.name,
        path = %attrs.path,
        code,
        "audit"
    );
}

/// The authorizer's view of a request (kube's RequestInfo rules): resource
/// requests are `/api/{v}/...` and `/apis/{g}/{v}/...` with a resource;
/// everything else is a non-resource request on its path.
pub(crate) fn attributes<B>(req: &Request<B>) -> Attributes {
    let path = req.uri().path();
    let method = req.method();
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["api", v, rest @ ..] if !rest.is_empty() => ("", v, rest),
        ["apis", g, v, rest @ ..] if !rest.is_empty() => (g, v, rest),
        _ => {
            return Attributes::non_resource(method.as_str().to_ascii_lowercase(), path);
        }
    };
    let mut namespace = "";
    let mut parts = rest;
    if parts[0] == "namespaces" && parts.len() > 1 {
        namespace = parts[1];
        if parts.len() > 2 {
            parts = &parts[2..];
        }
    }
    let resource = parts[0];
    let name = parts.get(1).copied().unwrap_or("");
    let subresource = parts.get(2).copied().unwrap_or("");
    let verb = match *method {
        Method::GET | Method::HEAD if name.is_empty() => {
            let watch = Query::parse(req.uri().query())
                .get("watch")
                .is_some_and(|v| v == "1" || v == "true");
            if watch { "watch" } else { "list" }
        }
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if name.is_empty() => "deletecollection",
        Method::DELETE => "delete",
        _ => return Attributes::non_resource(method.as_str().to_ascii_lowercase(), path),
    };
    Attributes {
        verb: verb.into(),
        is_resource_request: true,
        path: path.into(),
        namespace: namespace.into(),
        api_group: group.into(),
        api_version: version.into(),
        resource: resource.into(),
        subresource: subresource.into(),
        name: name.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(method: &str, uri: &str) -> Attributes {
        let req = Request::builder().method(method).uri(uri).body(()).unwrap();
        attributes(&req)
    }

    #[test]
    fn request_attributes_like_kube() {
        let a = attrs("GET", "/api/v1/namespaces/ns1/pods");
        assert_eq!(
            (
                a.verb.as_str(),
                a.namespace.as_str(),
                a.resource.as_str(),
                a.is_resource_request
            ),
            ("list", "ns1", "pods", true)
        );
        assert_eq!(attrs("GET", "/api/v1/pods?watch=true").verb, "watch");
        let a = attrs("GET", "/apis/apps/v1/namespaces/ns1/deployments/web/status");
        assert_eq!(
            (
                a.api_group.as_str(),
                a.name.as_str(),
                a.subresource.as_str(),
                a.verb.as_str()
            ),
            ("apps", "web", "status", "get")
        );
        assert_eq!(
            attrs("DELETE", "/api/v1/namespaces/a/pods").verb,
            "deletecollection"
        );
        assert_eq!(
            attrs("DELETE", "/api/v1/namespaces/a/pods/p").verb,
            "delete"
        );
        assert_eq!(attrs("PATCH", "/api/v1/nodes/n").verb, "patch");
        let a = attrs("GET", "/api/v1/namespaces/foo");
        assert_eq!(
            (a.resource.as_str(), a.name.as_str(), a.namespace.as_str()),
            ("namespaces", "foo", "foo")
        );
        let a = attrs(
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        );
        assert_eq!(
            (a.verb.as_str(), a.resource.as_str()),
            ("create", "selfsubjectaccessreviews")
        );
        for (m, p) in [
            ("GET", "/metrics"),
            ("GET", "/api/v1"),
            ("GET", "/apis/apps"),
            ("GET", "/version"),
        ] {
            let a = attrs(m, p);
            assert!(!a.is_resource_request, "{p}");
            assert_eq!((a.verb.as_str(), a.path.as_str()), ("get", p));
        }
    }

    #[test]
    fn health_paths() {
        assert!(is_health_path("/readyz"));
        assert!(is_health_path("/readyz/etcd"));
        assert!(!is_health_path("/readyzz"));
        assert!(!is_health_path("/metrics"));
    }
}

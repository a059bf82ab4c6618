//! The filters kube-apiserver runs before every handler, in its order:
//! authentication (401), impersonation (400, 403), authorization (403),
//! then the handler; one audit line per mutating or denied request.

use std::sync::{Arc, OnceLock};

use hyper::body::Incoming;
use hyper::header::AUTHORIZATION;
use hyper::{Method, Request};
use prometheus::IntCounter;
use tracing::debug;

use crate::api::request::RequestInfo;
use crate::api::state::State;
use crate::api::status::ApiStatus;
use crate::auth::{Attributes, AuthnError, ConnectionIdentity, UserInfo};

/// The authentication and authorization counters with their labels bound
/// once: every request touches them.
struct Counters {
    authn_success: IntCounter,
    authn_failure: IntCounter,
    authn_anonymous: IntCounter,
    allowed: IntCounter,
    denied: IntCounter,
    impersonated: IntCounter,
    impersonation_denied: IntCounter,
}

fn counters() -> &'static Counters {
    static COUNTERS: OnceLock<Counters> = OnceLock::new();
    COUNTERS.get_or_init(|| {
        let m = crate::metrics::metrics();
        let authn = |r: &str| m.authentication_attempts.with_label_values(&[r]);
        let authz = |d: &str| m.authorization_decisions.with_label_values(&[d]);
        Counters {
            authn_success: authn("success"),
            authn_failure: authn("failure"),
            authn_anonymous: authn("anonymous"),
            allowed: authz("allowed"),
            denied: authz("denied"),
            impersonated: m.impersonation_attempts.with_label_values(&["allowed"]),
            impersonation_denied: m.impersonation_attempts.with_label_values(&["denied"]),
        }
    })
}

/// A request that passed authentication and authorization.
pub(crate) struct Admitted<'a> {
    /// Who the request runs as (the impersonated user, if any).
    pub user: Option<Arc<UserInfo>>,
    /// Who authenticated, when that is not `user` (impersonation).
    pub requestor: Option<Arc<UserInfo>>,
    pub attrs: Attributes<'a>,
}

/// Paths probes reach without credentials even when anonymous access is off
/// (kube's always-allow health paths).
fn is_health_path(path: &str) -> bool {
    ["/healthz", "/livez", "/readyz"]
        .iter()
        .any(|p| path == *p || path.strip_prefix(p).is_some_and(|r| r.starts_with('/')))
}

/// Authenticates and authorizes `req` on a connection whose client
/// certificate proved `identity`; the user goes to the handlers that need
/// it (self reviews) in [`Admitted`]. `Err` is the 401 or 403 `Status`,
/// already counted and audited.
pub(crate) fn admit<'a>(
    state: &State,
    req: &Request<Incoming>,
    identity: &ConnectionIdentity,
    info: &'a RequestInfo,
) -> Result<Admitted<'a>, ApiStatus> {
    let attrs = attributes(info);
    let m = counters();
    let result = state.security.authenticator.authenticate(
        identity,
        req.headers().get(AUTHORIZATION).map(|v| v.as_bytes()),
    );
    let user = match result {
        Ok(user) => {
            if user.is_anonymous() {
                m.authn_anonymous.inc();
            } else {
                m.authn_success.inc();
            }
            user
        }
        Err(AuthnError::NoCredentials)
            if is_health_path(attrs.path)
                && (req.method() == Method::GET || req.method() == Method::HEAD) =>
        {
            m.authn_anonymous.inc();
            return Ok(Admitted {
                user: None,
                requestor: None,
                attrs,
            });
        }
        Err(e) => {
            m.authn_failure.inc();
            debug!(error = %e, path = %attrs.path, "authentication failed");
            audit(None, None, &attrs, 401);
            return Err(ApiStatus::unauthorized());
        }
    };
    let (user, requestor) =
        match super::impersonation::impersonate(&state.security.authorizer, &user, req.headers()) {
            Ok(None) => (user, None),
            Ok(Some(impersonated)) => {
                m.impersonated.inc();
                (Arc::new(impersonated), Some(user))
            }
            Err(status) => {
                m.impersonation_denied.inc();
                audit(Some(&user), None, &attrs, status.code);
                return Err(status);
            }
        };
    let decision = state.security.authorizer.authorize(&user, &attrs);
    if !decision.allowed {
        m.denied.inc();
        audit_as(&user, requestor.as_deref(), &attrs, 403);
        let mut status = ApiStatus::forbidden(attrs.forbidden_message(&user, &decision.reason));
        // kube's NewForbidden(group/resource, name): the resource as the
        // kind, the name and group when there are.
        if attrs.is_resource_request {
            status = if attrs.name.is_empty() {
                status.with_kind(attrs.resource.to_string())
            } else {
                status.with_details(attrs.name.to_string(), attrs.resource.to_string())
            }
            .with_group(attrs.api_group);
        } else {
            status = status.with_empty_details();
        }
        return Err(status);
    }
    m.allowed.inc();
    Ok(Admitted {
        user: Some(user),
        requestor,
        attrs,
    })
}

/// After the handler: the audit line of a mutating request.
pub(crate) fn finish(admitted: &Admitted<'_>, code: u16) {
    if admitted.attrs.is_mutating() {
        match (&admitted.user, &admitted.requestor) {
            (Some(user), requestor) => audit_as(user, requestor.as_deref(), &admitted.attrs, code),
            (None, _) => audit(None, None, &admitted.attrs, code),
        }
    }
}

/// [`audit`] of a request running as `user`: the requestor is who
/// authenticated, and `user` its impersonated user when they differ.
fn audit_as(user: &UserInfo, requestor: Option<&UserInfo>, attrs: &Attributes, code: u16) {
    match requestor {
        Some(r) => audit(Some(r), Some(user), attrs, code),
        None => audit(Some(user), None, attrs, code),
    }
}

/// One structured line, target `audit`: who did what to which object and
/// the answer's code, and, as kube-apiserver's `impersonatedUser`, who the
/// requestor acted as. Never bodies or credentials.
fn audit(user: Option<&UserInfo>, impersonated: Option<&UserInfo>, attrs: &Attributes, code: u16) {
    let (name, groups) = match user {
        Some(u) => (u.name.as_str(), u.groups.join(",")),
        None => ("", String::new()),
    };
    let (imp_name, imp_groups) = match impersonated {
        Some(u) => (u.name.as_str(), u.groups.join(",")),
        None => ("", String::new()),
    };
    tracing::info!(
        target: "audit",
        user = name,
        groups = %groups,
        impersonated_user = imp_name,
        impersonated_groups = %imp_groups,
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

/// The authorizer's view of a request: kube's `authorizer.Attributes` are
/// built from its `RequestInfo` the same way.
pub(crate) fn attributes(info: &RequestInfo) -> Attributes<'_> {
    Attributes {
        verb: info.verb(),
        is_resource_request: info.is_resource_request,
        path: info.path(),
        namespace: info.namespace().unwrap_or_default(),
        api_group: info.api_group(),
        api_version: info.api_version(),
        resource: info.resource(),
        subresource: info.subresource().unwrap_or_default(),
        name: info.name().or(info.selected_name()).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(method: &str, uri: &str) -> Attributes<'static> {
        let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let info = RequestInfo::new(
            &method,
            path,
            &crate::api::request::params::Query::parse(Some(query)),
        )
        .unwrap();
        // Leaked so the attributes can borrow it past this helper (tests only).
        attributes(Box::leak(Box::new(info)))
    }

    #[test]
    fn request_attributes_like_kube() {
        let a = attrs("GET", "/api/v1/namespaces/ns1/pods");
        assert_eq!(
            (a.verb, a.namespace, a.resource, a.is_resource_request),
            ("list", "ns1", "pods", true)
        );
        assert_eq!(attrs("GET", "/api/v1/pods?watch=true").verb, "watch");
        // A list or watch limited to one name is authorized for that name.
        for (uri, verb, name) in [
            (
                "/api/v1/namespaces/ns1/pods?fieldSelector=metadata.name%3Dweb",
                "list",
                "web",
            ),
            (
                "/api/v1/pods?watch=1&fieldSelector=spec.nodeName%3Dn,metadata.name%3D%3Dweb",
                "watch",
                "web",
            ),
            (
                "/api/v1/pods?fieldSelector=metadata.name%21%3Dweb",
                "list",
                "",
            ),
            (
                "/api/v1/pods?fieldSelector=metadata.name%3Da%2Fb",
                "list",
                "",
            ),
            ("/api/v1/pods?fieldSelector=metadata.name%3D..", "list", ""),
            (
                "/api/v1/pods?fieldSelector=metadata.name%3Dweb,bad",
                "list",
                "",
            ),
            (
                "/api/v1/pods?fieldSelector=metadata.name%3Da%5C%2Cb",
                "list",
                "a,b",
            ),
            (
                "/api/v1/watch/pods?fieldSelector=metadata.name%3Dweb",
                "watch",
                "",
            ),
        ] {
            let a = attrs("GET", uri);
            assert_eq!((a.verb, a.name), (verb, name), "{uri}");
        }
        let a = attrs("GET", "/apis/apps/v1/namespaces/ns1/deployments/web/status");
        assert_eq!(
            (a.api_group, a.name, a.subresource, a.verb),
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
            (a.resource, a.name, a.namespace),
            ("namespaces", "foo", "foo")
        );
        let a = attrs(
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        );
        assert_eq!((a.verb, a.resource), ("create", "selfsubjectaccessreviews"));
        for (m, p) in [
            ("GET", "/metrics"),
            ("GET", "/api/v1"),
            ("GET", "/apis/apps"),
            ("GET", "/version"),
        ] {
            let a = attrs(m, p);
            assert!(!a.is_resource_request, "{p}");
            assert_eq!((a.verb, a.path), ("get", p));
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

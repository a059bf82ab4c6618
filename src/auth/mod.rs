//! Authentication and authorization of API requests, after kube-apiserver.
//!
//! Authentication turns a request's credentials into a [`UserInfo`] with the
//! kube-apiserver chain: client certificate ([`x509`]), then bearer token
//! ([`token_file`]), then, when no credential was presented and anonymous
//! access is on, `system:anonymous`. A credential that is presented but
//! invalid is a 401 even when anonymous access is on (kube-apiserver's
//! "fail on error" before the anonymous authenticator).
//!
//! Authorization decides on [`Attributes`] (kube's `authorizer.Attributes`):
//! `AlwaysAllow` or [`rbac`] from policy files.

use std::sync::Arc;

use serde::Serialize;

pub mod rbac;
pub mod token_file;
pub mod x509;

/// The user name of requests without credentials.
pub const ANONYMOUS_USER: &str = "system:anonymous";
/// The group of requests without credentials.
pub const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";
/// The group every authenticated user is in.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";

/// Who made a request (kube's `user.Info`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    /// Extra attributes (set by impersonation's `Impersonate-Extra-*`).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// The user of requests without credentials.
    pub fn anonymous() -> UserInfo {
        UserInfo {
            name: ANONYMOUS_USER.into(),
            uid: String::new(),
            groups: vec![UNAUTHENTICATED_GROUP.into()],
            ..Default::default()
        }
    }

    pub fn is_anonymous(&self) -> bool {
        self.name == ANONYMOUS_USER
    }

    /// Adds `system:authenticated` as kube's `AuthenticatedGroupAdder` does:
    /// not to `system:anonymous` nor to a user already in
    /// `system:unauthenticated` (a token or certificate may name either, and
    /// then must not get what authenticated users get).
    fn authenticated(mut self) -> UserInfo {
        let skip = self.name == ANONYMOUS_USER
            || self
                .groups
                .iter()
                .any(|g| g == AUTHENTICATED_GROUP || g == UNAUTHENTICATED_GROUP);
        if !skip {
            self.groups.push(AUTHENTICATED_GROUP.into());
        }
        self
    }
}

/// Why a request is not authenticated. Logged, never sent: a client only
/// learns `Unauthorized`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthnError {
    #[error("invalid client certificate: {0}")]
    InvalidCertificate(String),
    #[error("invalid bearer token")]
    InvalidToken,
    #[error("no credentials and anonymous access is disabled")]
    NoCredentials,
}

/// What one TLS connection proved: the verified user of its client
/// certificate (in `system:authenticated`, shared by every request on the
/// connection), the verification error, or nothing (no certificate or no
/// `--client-ca-file`). Computed once per connection.
pub type ConnectionIdentity = Option<Result<Arc<UserInfo>, AuthnError>>;

/// The authenticator chain.
#[derive(Debug, Default)]
pub struct Authenticator {
    x509: Option<x509::CertAuthenticator>,
    tokens: Option<token_file::TokenFile>,
    anonymous: bool,
}

impl Authenticator {
    pub fn new(
        x509: Option<x509::CertAuthenticator>,
        tokens: Option<token_file::TokenFile>,
        anonymous: bool,
    ) -> Authenticator {
        Authenticator {
            x509,
            // The group is added once, here, not for every request.
            tokens: tokens.map(|t| t.map_users(UserInfo::authenticated)),
            anonymous,
        }
    }

    /// Everyone is anonymous and allowed in: the behaviour without any
    /// authentication configured.
    pub fn anonymous_only() -> Authenticator {
        Authenticator::new(None, None, true)
    }

    /// The client-certificate authenticator, for the TLS layer.
    pub fn x509(&self) -> Option<&x509::CertAuthenticator> {
        self.x509.as_ref()
    }

    /// Whether any authenticator other than anonymous is configured.
    pub fn has_authenticators(&self) -> bool {
        self.x509.is_some() || self.tokens.is_some()
    }

    pub fn anonymous_enabled(&self) -> bool {
        self.anonymous
    }

    /// Verifies a client certificate chain (end entity first) once per
    /// connection.
    pub fn authenticate_connection(
        &self,
        chain: Option<&[rustls_pki_types::CertificateDer<'static>]>,
    ) -> ConnectionIdentity {
        let chain = chain.filter(|c| !c.is_empty())?;
        Self::connection_identity(self.x509.as_ref()?.authenticate(chain))
    }

    /// The identity of a connection whose certificate gave `verified`
    /// (see [`x509::CertAuthenticator::authenticate`]): the group is added
    /// here, once, not for every request.
    pub fn connection_identity(
        verified: Option<Result<UserInfo, AuthnError>>,
    ) -> ConnectionIdentity {
        verified.map(|r| r.map(|user| Arc::new(user.authenticated())))
    }

    /// Runs the chain for one request: the connection's certificate user,
    /// then the `Authorization: Bearer` token, then anonymous. Any
    /// authenticator that succeeds wins; errors only count when none does.
    ///
    /// The user is shared: the handlers that need it (self reviews) and
    /// the audit line get the same one, and the anonymous one is the same
    /// for every request.
    pub fn authenticate(
        &self,
        connection: &ConnectionIdentity,
        authorization: Option<&[u8]>,
    ) -> Result<Arc<UserInfo>, AuthnError> {
        static ANONYMOUS: std::sync::LazyLock<Arc<UserInfo>> =
            std::sync::LazyLock::new(|| Arc::new(UserInfo::anonymous()));
        let mut error = None;
        match connection {
            Some(Ok(user)) => return Ok(Arc::clone(user)),
            Some(Err(e)) => error = Some(e.clone()),
            None => {}
        }
        if let Some(tokens) = &self.tokens
            && let Some(token) = authorization.and_then(bearer_token)
        {
            match tokens.lookup(token) {
                Some(user) => return Ok(Arc::clone(user)),
                None => error = Some(AuthnError::InvalidToken),
            }
        }
        match error {
            Some(e) => Err(e),
            None if self.anonymous => Ok(Arc::clone(&ANONYMOUS)),
            None => Err(AuthnError::NoCredentials),
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header (scheme
/// case-insensitive, as kube's bearertoken authenticator); None for other
/// schemes or an empty token.
fn bearer_token(header: &[u8]) -> Option<&str> {
    let header = std::str::from_utf8(header).ok()?.trim();
    let (scheme, token) = header.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim();
    (!token.is_empty()).then_some(token)
}

/// The authorizer's input (kube's `authorizer.Attributes` without the
/// user): what a request does. Built once per request from its path.
///
/// It borrows the request's strings: it is built for every request, and
/// copying each part would cost an allocation apiece.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Attributes<'a> {
    /// Kubernetes verb (`get`, `list`, `watch`, `create`, ...) for resource
    /// requests; the lowercased HTTP method for non-resource requests.
    pub verb: &'a str,
    pub is_resource_request: bool,
    /// The request path (non-resource requests are authorized on it).
    pub path: &'a str,
    pub namespace: &'a str,
    pub api_group: &'a str,
    pub api_version: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub name: &'a str,
}

impl<'a> Attributes<'a> {
    /// A non-resource request on `path`.
    pub fn non_resource(verb: &'a str, path: &'a str) -> Attributes<'a> {
        Attributes {
            verb,
            path,
            ..Attributes::default()
        }
    }

    /// Whether the verb changes stored state (these requests are audited).
    pub fn is_mutating(&self) -> bool {
        matches!(
            self.verb,
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }

    /// kube-apiserver's forbidden message (`User "alice" cannot list resource
    /// "pods" in API group "" in the namespace "ns"`), without the
    /// `pods is forbidden: ` prefix that [`Attributes::forbidden_message`] adds.
    fn denial(&self, user: &UserInfo) -> String {
        let name = &user.name;
        if !self.is_resource_request {
            return format!("User {name:?} cannot {} path {:?}", self.verb, self.path);
        }
        let mut resource = self.resource.to_string();
        if !self.subresource.is_empty() {
            resource = format!("{resource}/{}", self.subresource);
        }
        if self.namespace.is_empty() {
            format!(
                "User {name:?} cannot {} resource {resource:?} in API group {:?} at the cluster scope",
                self.verb, self.api_group
            )
        } else {
            format!(
                "User {name:?} cannot {} resource {resource:?} in API group {:?} in the namespace {:?}",
                self.verb, self.api_group, self.namespace
            )
        }
    }

    /// The whole 403 message, as kube's `NewForbidden`: `pods is forbidden:
    /// ...`, `pods "web" is forbidden: ...`, `deployments.apps is forbidden:
    /// ...`, or `forbidden: ...` for non-resource requests.
    pub fn forbidden_message(&self, user: &UserInfo, reason: &str) -> String {
        let mut detail = self.denial(user);
        if !reason.is_empty() {
            detail = format!("{detail}: {reason}");
        }
        if !self.is_resource_request || self.resource.is_empty() {
            return format!("forbidden: {detail}");
        }
        let qualified = if self.api_group.is_empty() {
            self.resource.to_string()
        } else {
            format!("{}.{}", self.resource, self.api_group)
        };
        if self.name.is_empty() {
            format!("{qualified} is forbidden: {detail}")
        } else {
            format!("{qualified} {:?} is forbidden: {detail}", self.name)
        }
    }
}

/// An authorization answer; `reason` says which binding allowed it (RBAC).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

/// `--authorization-mode`.
#[derive(Debug, Clone)]
pub enum Authorizer {
    AlwaysAllow,
    Rbac(Arc<rbac::Policy>),
}

impl Authorizer {
    pub fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Decision {
        match self {
            Authorizer::AlwaysAllow => Decision {
                allowed: true,
                reason: String::new(),
            },
            Authorizer::Rbac(policy) => policy.authorize(user, attrs),
        }
    }

    /// The rules `user` has in `namespace` (cluster-wide ones included),
    /// for SelfSubjectRulesReview; AlwaysAllow has one rule for everything.
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> Vec<rbac::PolicyRule> {
        match self {
            Authorizer::AlwaysAllow => {
                let star = vec!["*".to_string()];
                vec![
                    rbac::PolicyRule {
                        verbs: star.clone(),
                        api_groups: star.clone(),
                        resources: star.clone(),
                        ..rbac::PolicyRule::default()
                    },
                    rbac::PolicyRule {
                        verbs: star.clone(),
                        non_resource_urls: star,
                        ..rbac::PolicyRule::default()
                    },
                ]
            }
            Authorizer::Rbac(policy) => policy.rules_for(user, namespace),
        }
    }

    pub fn is_rbac(&self) -> bool {
        matches!(self, Authorizer::Rbac(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> token_file::TokenFile {
        token_file::TokenFile::parse("t1,alice,u1,\"dev,ops\"\n", "tokens.csv").unwrap()
    }

    #[test]
    fn chain_order_and_groups() {
        let a = Authenticator::new(None, Some(tokens()), true);
        let cert_user = UserInfo {
            name: "bob".into(),
            uid: String::new(),
            groups: vec!["admins".into()],
            ..Default::default()
        };
        // A verified certificate wins over a token.
        let cert = Authenticator::connection_identity(Some(Ok(cert_user)));
        let u = a.authenticate(&cert, Some(b"Bearer t1")).unwrap();
        assert_eq!(u.name, "bob");
        assert_eq!(u.groups, ["admins", AUTHENTICATED_GROUP]);
        // Token.
        let u = a.authenticate(&None, Some(b"bearer  t1 ")).unwrap();
        assert_eq!(u.name, "alice");
        assert_eq!(u.uid, "u1");
        assert_eq!(u.groups, ["dev", "ops", AUTHENTICATED_GROUP]);
        // A bad certificate does not stop a good token.
        let bad = Some(Err(AuthnError::InvalidCertificate("expired".into())));
        assert_eq!(
            a.authenticate(&bad, Some(b"Bearer t1")).unwrap().name,
            "alice"
        );
        // No credentials: anonymous.
        let u = a.authenticate(&None, None).unwrap();
        assert!(u.is_anonymous());
        assert_eq!(u.groups, [UNAUTHENTICATED_GROUP]);
        // Other schemes are no credentials.
        assert!(
            a.authenticate(&None, Some(b"Basic abc"))
                .unwrap()
                .is_anonymous()
        );
    }

    /// kube's AuthenticatedGroupAdder: a credential for `system:anonymous`
    /// or for a user in `system:unauthenticated` does not add the group.
    #[test]
    fn authenticated_group_skips_anonymous_and_unauthenticated() {
        let tokens = token_file::TokenFile::parse(
            "t1,system:anonymous,u1\nt2,bob,u2,system:unauthenticated\nt3,carol,u3,system:authenticated\n",
            "tokens.csv",
        )
        .unwrap();
        let a = Authenticator::new(None, Some(tokens), false);
        let groups = |token: &[u8]| a.authenticate(&None, Some(token)).unwrap().groups.clone();
        assert!(groups(b"Bearer t1").is_empty());
        assert_eq!(groups(b"Bearer t2"), [UNAUTHENTICATED_GROUP]);
        assert_eq!(groups(b"Bearer t3"), [AUTHENTICATED_GROUP]);
        let cert = |name: &str, groups: &[&str]| {
            let user = UserInfo {
                name: name.into(),
                uid: String::new(),
                groups: groups.iter().map(|g| g.to_string()).collect(),
                ..Default::default()
            };
            let id = Authenticator::connection_identity(Some(Ok(user)));
            a.authenticate(&id, None).unwrap().groups.clone()
        };
        assert_eq!(cert(ANONYMOUS_USER, &["dev"]), ["dev"]);
        assert_eq!(
            cert("dave", &[UNAUTHENTICATED_GROUP, "dev"]),
            [UNAUTHENTICATED_GROUP, "dev"]
        );
        assert_eq!(cert("dave", &["dev"]), ["dev", AUTHENTICATED_GROUP]);
    }

    #[test]
    fn invalid_credentials_are_never_anonymous() {
        let a = Authenticator::new(None, Some(tokens()), true);
        assert_eq!(
            a.authenticate(&None, Some(b"Bearer wrong")),
            Err(AuthnError::InvalidToken)
        );
        let bad = Some(Err(AuthnError::InvalidCertificate("unknown CA".into())));
        assert!(matches!(
            a.authenticate(&bad, None),
            Err(AuthnError::InvalidCertificate(_))
        ));
        let closed = Authenticator::new(None, Some(tokens()), false);
        assert_eq!(
            closed.authenticate(&None, None),
            Err(AuthnError::NoCredentials)
        );
    }

    #[test]
    fn without_token_file_a_token_is_ignored() {
        let a = Authenticator::anonymous_only();
        assert!(
            a.authenticate(&None, Some(b"Bearer x"))
                .unwrap()
                .is_anonymous()
        );
    }

    #[test]
    fn forbidden_messages_like_kube() {
        let alice = UserInfo {
            name: "alice".into(),
            ..UserInfo::default()
        };
        let mut a = Attributes {
            verb: "list",
            is_resource_request: true,
            path: "/api/v1/namespaces/kube-system/pods",
            namespace: "kube-system",
            resource: "pods",
            api_version: "v1",
            ..Attributes::default()
        };
        assert_eq!(
            a.forbidden_message(&alice, ""),
            r#"pods is forbidden: User "alice" cannot list resource "pods" in API group "" in the namespace "kube-system""#
        );
        a.namespace = "";
        a.api_group = "apps";
        a.resource = "deployments";
        a.name = "web";
        a.verb = "get";
        assert_eq!(
            a.forbidden_message(&alice, ""),
            r#"deployments.apps "web" is forbidden: User "alice" cannot get resource "deployments" in API group "apps" at the cluster scope"#
        );
        let m = Attributes::non_resource("get", "/metrics");
        assert_eq!(
            m.forbidden_message(&alice, ""),
            r#"forbidden: User "alice" cannot get path "/metrics""#
        );
    }
}

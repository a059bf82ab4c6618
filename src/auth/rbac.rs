//! RBAC authorization from files: `rbac.authorization.k8s.io/v1` Role,
//! ClusterRole, RoleBinding and ClusterRoleBinding objects (YAML, several
//! documents per file, `kind: List` too), evaluated with the rules of
//! Kubernetes' `plugin/pkg/auth/authorizer/rbac`:
//!
//! - ClusterRoleBindings grant their ClusterRole's rules everywhere;
//!   RoleBindings grant their Role's (or ClusterRole's) rules in the
//!   binding's namespace only.
//! - A rule allows a resource request when verb, API group, resource
//!   (`resource/subresource`, `*`, `*/subresource`) and resourceNames (empty
//!   = any) match; a non-resource request when verb and a nonResourceURL
//!   (exact, `*`, or a prefix ending in `*`) match.
//! - Subjects: User (name), Group (any of the user's groups), ServiceAccount
//!   (`system:serviceaccount:NS:NAME`, NS defaulting to the binding's).
//!
//! Kubernetes' bootstrap roles that make a cluster usable are built in
//! ([`BOOTSTRAP_POLICY`]); a file object with the same name replaces one.
//! ClusterRole aggregation rules are not evaluated.
//!
//! Unknown fields are refused outside `metadata`, as `kubectl apply`'s strict
//! validation does: a misspelt `resourceNames` would otherwise drop the
//! restriction and allow every name.

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

use super::{Attributes, Decision, UserInfo};

const RBAC_API_VERSION: &str = "rbac.authorization.k8s.io/v1";

#[derive(Debug, thiserror::Error)]
pub enum RbacError {
    #[error("{file}: cannot read: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}: invalid YAML: {message}")]
    Yaml { file: String, message: String },
    #[error("{file}: document {doc}{what}: {message}")]
    Invalid {
        file: String,
        /// 1-based document number in the file.
        doc: usize,
        /// ` (Kind name)` when known.
        what: String,
        message: String,
    },
}

/// One rule of a Role or ClusterRole. Unknown fields are refused: an
/// ignored typo (`resourceName:`) would widen the rule.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PolicyRule {
    #[serde(default)]
    pub verbs: Vec<String>,
    #[serde(default)]
    pub api_groups: Vec<String>,
    #[serde(default)]
    pub resources: Vec<String>,
    #[serde(default)]
    pub resource_names: Vec<String>,
    #[serde(default, rename = "nonResourceURLs")]
    pub non_resource_urls: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Subject {
    pub kind: String,
    #[serde(default)]
    pub api_group: String,
    pub name: String,
    #[serde(default)]
    pub namespace: String,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RoleRef {
    #[serde(default)]
    pub api_group: String,
    pub kind: String,
    pub name: String,
}

/// Lenient: objects exported from a cluster carry labels, annotations, uid,
/// resourceVersion, managedFields and more, none of which change a grant.
#[derive(Debug, Clone, Default, Deserialize)]
struct Metadata {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
}

/// The fields of every supported kind; which are required depends on `kind`.
/// Unknown fields are refused (a typo of `rules` or `subjects` would
/// otherwise pass unnoticed).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Document {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    metadata: Metadata,
    #[serde(default)]
    rules: Option<Vec<PolicyRule>>,
    #[serde(default)]
    subjects: Option<Vec<Subject>>,
    #[serde(default)]
    role_ref: Option<RoleRef>,
    /// ClusterRole; accepted but not evaluated (a cluster's aggregated
    /// roles already list the aggregated rules).
    #[serde(default)]
    #[allow(dead_code)]
    aggregation_rule: Option<serde::de::IgnoredAny>,
    /// `kind: List`.
    #[serde(default)]
    items: Option<Vec<Document>>,
}

/// A binding: who gets which role, where (`namespace` empty = cluster-wide).
#[derive(Debug, Clone)]
struct Binding {
    kind: &'static str,
    name: String,
    namespace: String,
    subjects: Vec<Subject>,
    role_ref: RoleRef,
}

/// The loaded policy.
#[derive(Debug, Default)]
pub struct Policy {
    cluster_roles: HashMap<String, Vec<PolicyRule>>,
    /// (namespace, name) -> rules.
    roles: HashMap<(String, String), Vec<PolicyRule>>,
    cluster_role_bindings: Vec<Binding>,
    /// namespace -> bindings.
    role_bindings: HashMap<String, Vec<Binding>>,
}

/// Kubernetes' bootstrap policy, the part that matters here:
/// `cluster-admin` for `system:masters`, discovery and health for
/// authenticated users, health and `/version` for everyone, and the
/// self-reviews (`kubectl auth can-i`, `kubectl auth whoami`) for
/// authenticated users.
pub const BOOTSTRAP_POLICY: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: cluster-admin}
rules:
- {apiGroups: ["*"], resources: ["*"], verbs: ["*"]}
- {nonResourceURLs: ["*"], verbs: ["*"]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: cluster-admin}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:masters"}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:discovery"}
rules:
- nonResourceURLs: ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*", "/readyz", "/version", "/version/"]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:discovery"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:discovery"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:authenticated"}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:public-info-viewer"}
rules:
- nonResourceURLs: ["/healthz", "/livez", "/readyz", "/version", "/version/"]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:public-info-viewer"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:public-info-viewer"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:authenticated"}
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:unauthenticated"}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:basic-user"}
rules:
- apiGroups: [authorization.k8s.io]
  resources: [selfsubjectaccessreviews, selfsubjectrulesreviews]
  verbs: [create]
- apiGroups: [authentication.k8s.io]
  resources: [selfsubjectreviews]
  verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:basic-user"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:basic-user"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:authenticated"}
"#;

impl Policy {
    /// The bootstrap policy plus the objects of `files`, in order. Names are
    /// unique per kind (and namespace) across the files; a file object may
    /// replace a bootstrap object of the same name.
    pub fn load(files: &[impl AsRef<Path>]) -> Result<Policy, RbacError> {
        let mut texts = Vec::new();
        for f in files {
            let path = f.as_ref();
            let file = path.display().to_string();
            let text = std::fs::read_to_string(path).map_err(|source| RbacError::Read {
                file: file.clone(),
                source,
            })?;
            texts.push((text, file));
        }
        let refs: Vec<(&str, &str)> = texts
            .iter()
            .map(|(t, f)| (t.as_str(), f.as_str()))
            .collect();
        Policy::parse(&refs)
    }

    /// Like [`Policy::load`] from `(text, file name)` pairs.
    pub fn parse(sources: &[(&str, &str)]) -> Result<Policy, RbacError> {
        let mut policy = Policy::default();
        // One set for all files: a second file's `view` silently replacing
        // the first's would be as surprising as within one file.
        let mut names = Names::default();
        policy.add_text(BOOTSTRAP_POLICY, "bootstrap policy", true, &mut names)?;
        for (text, file) in sources {
            policy.add_text(text, file, false, &mut names)?;
        }
        policy.warn_dangling();
        Ok(policy)
    }

    fn add_text(
        &mut self,
        text: &str,
        file: &str,
        bootstrap: bool,
        names: &mut Names,
    ) -> Result<(), RbacError> {
        // Typed, not via a generic value: a field declared as a string stays
        // a string (`namespace: n` is not YAML 1.1's `false`).
        let docs: Vec<Document> =
            serde_saphyr::from_multiple(text).map_err(|e| RbacError::Yaml {
                file: file.to_string(),
                message: e.to_string(),
            })?;
        for (i, doc) in docs.into_iter().enumerate() {
            self.add_document(doc, file, i + 1, bootstrap, names)?;
        }
        Ok(())
    }

    fn add_document(
        &mut self,
        doc: Document,
        file: &str,
        n: usize,
        bootstrap: bool,
        names: &mut Names,
    ) -> Result<(), RbacError> {
        let invalid = |what: String, message: String| RbacError::Invalid {
            file: file.to_string(),
            doc: n,
            what,
            message,
        };
        let what = if doc.metadata.name.is_empty() {
            format!(" ({})", doc.kind)
        } else {
            format!(" ({} {:?})", doc.kind, doc.metadata.name)
        };
        if doc.kind == "List" {
            for item in doc.items.unwrap_or_default() {
                self.add_document(item, file, n, bootstrap, names)?;
            }
            return Ok(());
        }
        if doc.api_version != RBAC_API_VERSION {
            return Err(invalid(
                what,
                format!(
                    "apiVersion {:?}: want {RBAC_API_VERSION:?}",
                    doc.api_version
                ),
            ));
        }
        if doc.metadata.name.is_empty() {
            return Err(invalid(what, "metadata.name is required".into()));
        }
        let namespaced = matches!(doc.kind.as_str(), "Role" | "RoleBinding");
        if namespaced && doc.metadata.namespace.is_empty() {
            return Err(invalid(what, "metadata.namespace is required".into()));
        }
        let ns = if namespaced {
            doc.metadata.namespace.clone()
        } else {
            String::new()
        };
        if !bootstrap {
            let key = (doc.kind.clone(), ns.clone(), doc.metadata.name.clone());
            match names.seen.entry(key) {
                std::collections::hash_map::Entry::Occupied(first) => {
                    let (first_file, first_doc) = first.get();
                    return Err(invalid(
                        what,
                        format!(
                            "defined twice, first in {first_file} document {first_doc} (names are unique per kind and namespace across the policy files)"
                        ),
                    ));
                }
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert((file.to_string(), n));
                }
            }
        }
        let name = doc.metadata.name;
        match doc.kind.as_str() {
            "ClusterRole" => {
                self.cluster_roles
                    .insert(name, doc.rules.unwrap_or_default());
            }
            "Role" => {
                let rules = doc.rules.unwrap_or_default();
                if rules.iter().any(|r| !r.non_resource_urls.is_empty()) {
                    return Err(invalid(
                        what,
                        "nonResourceURLs are only valid in a ClusterRole".into(),
                    ));
                }
                self.roles.insert((ns, name), rules);
            }
            "ClusterRoleBinding" | "RoleBinding" => {
                let cluster = doc.kind == "ClusterRoleBinding";
                let role_ref = doc
                    .role_ref
                    .ok_or_else(|| invalid(what.clone(), "roleRef is required".into()))?;
                let kind_ok = match role_ref.kind.as_str() {
                    "ClusterRole" => true,
                    "Role" => !cluster,
                    _ => false,
                };
                if !kind_ok {
                    return Err(invalid(
                        what,
                        format!(
                            "roleRef.kind {:?}: want {}",
                            role_ref.kind,
                            if cluster {
                                "ClusterRole"
                            } else {
                                "Role or ClusterRole"
                            }
                        ),
                    ));
                }
                let subjects = doc.subjects.unwrap_or_default();
                for s in &subjects {
                    if !matches!(s.kind.as_str(), "User" | "Group" | "ServiceAccount") {
                        return Err(invalid(
                            what,
                            format!(
                                "subject kind {:?}: want User, Group or ServiceAccount",
                                s.kind
                            ),
                        ));
                    }
                }
                let binding = Binding {
                    kind: if cluster {
                        "ClusterRoleBinding"
                    } else {
                        "RoleBinding"
                    },
                    name,
                    namespace: ns.clone(),
                    subjects,
                    role_ref,
                };
                if cluster {
                    self.cluster_role_bindings
                        .retain(|b| b.name != binding.name);
                    self.cluster_role_bindings.push(binding);
                } else {
                    let list = self.role_bindings.entry(ns).or_default();
                    list.retain(|b| b.name != binding.name);
                    list.push(binding);
                }
            }
            other => {
                return Err(invalid(
                    what,
                    format!(
                        "unsupported kind {other:?}: want Role, ClusterRole, RoleBinding or ClusterRoleBinding"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Bindings to roles that do not exist grant nothing (as in Kubernetes);
    /// say so at load time, since with files that is most likely a typo.
    fn warn_dangling(&self) {
        let all = self
            .cluster_role_bindings
            .iter()
            .chain(self.role_bindings.values().flatten());
        for b in all {
            if self.rules_of(b).is_none() {
                tracing::warn!(
                    binding = %b.name,
                    kind = b.kind,
                    namespace = %b.namespace,
                    role = %b.role_ref.name,
                    role_kind = %b.role_ref.kind,
                    "RBAC binding refers to a role that is not defined; it grants nothing"
                );
            }
        }
    }

    fn rules_of(&self, b: &Binding) -> Option<&[PolicyRule]> {
        match b.role_ref.kind.as_str() {
            "ClusterRole" => self.cluster_roles.get(&b.role_ref.name).map(Vec::as_slice),
            _ => self
                .roles
                .get(&(b.namespace.clone(), b.role_ref.name.clone()))
                .map(Vec::as_slice),
        }
    }

    /// Every rule bound to `user` at cluster scope or in `namespace`
    /// (kube's `RulesFor`).
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> Vec<PolicyRule> {
        let namespaced = (!namespace.is_empty())
            .then(|| self.role_bindings.get(namespace))
            .flatten()
            .into_iter()
            .flatten();
        self.cluster_role_bindings
            .iter()
            .chain(namespaced)
            .filter(|b| b.subjects.iter().any(|s| applies_to(s, user, &b.namespace)))
            .filter_map(|b| self.rules_of(b))
            .flatten()
            .cloned()
            .collect()
    }

    /// kube's RBACAuthorizer: allowed when any rule bound to the user (at
    /// cluster scope, or in the request's namespace) allows the request;
    /// otherwise no opinion, which is a denial with one authorizer.
    pub fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Decision {
        let cluster = self.cluster_role_bindings.iter();
        let namespaced = (!attrs.namespace.is_empty())
            .then(|| self.role_bindings.get(attrs.namespace))
            .flatten()
            .into_iter()
            .flatten();
        for b in cluster.chain(namespaced) {
            let Some(subject) = b
                .subjects
                .iter()
                .find(|s| applies_to(s, user, &b.namespace))
            else {
                continue;
            };
            let Some(rules) = self.rules_of(b) else {
                continue;
            };
            if rules.iter().any(|r| rule_allows(r, attrs)) {
                let scope = if b.namespace.is_empty() {
                    String::new()
                } else {
                    format!(" in namespace {:?}", b.namespace)
                };
                return Decision {
                    allowed: true,
                    reason: format!(
                        "RBAC: allowed by {} {:?} of {} {:?} to {} {:?}{scope}",
                        b.kind,
                        b.name,
                        b.role_ref.kind,
                        b.role_ref.name,
                        subject.kind,
                        subject.name
                    ),
                };
            }
        }
        Decision {
            allowed: false,
            reason: String::new(),
        }
    }
}

/// The objects the policy files defined so far, by (kind, namespace, name),
/// with the file and document that defined them.
#[derive(Default)]
struct Names {
    seen: HashMap<(String, String, String), (String, usize)>,
}

fn applies_to(s: &Subject, user: &UserInfo, binding_namespace: &str) -> bool {
    match s.kind.as_str() {
        "User" => user.name == s.name,
        "Group" => user.groups.contains(&s.name),
        "ServiceAccount" => {
            let ns = if s.namespace.is_empty() {
                binding_namespace
            } else {
                &s.namespace
            };
            !ns.is_empty()
                && user
                    .name
                    .strip_prefix("system:serviceaccount:")
                    .and_then(|rest| rest.split_once(':'))
                    .is_some_and(|(n, name)| n == ns && name == s.name)
        }
        _ => false,
    }
}

fn has_or_star(list: &[String], want: &str) -> bool {
    list.iter().any(|v| v == "*" || v == want)
}

/// kube's `RuleAllows`.
pub fn rule_allows(rule: &PolicyRule, a: &Attributes) -> bool {
    if a.is_resource_request {
        let combined = if a.subresource.is_empty() {
            std::borrow::Cow::Borrowed(a.resource)
        } else {
            std::borrow::Cow::Owned(format!("{}/{}", a.resource, a.subresource))
        };
        has_or_star(&rule.verbs, a.verb)
            && has_or_star(&rule.api_groups, a.api_group)
            && resource_matches(rule, &combined, a.subresource)
            && (rule.resource_names.is_empty() || rule.resource_names.iter().any(|n| n == a.name))
    } else {
        has_or_star(&rule.verbs, a.verb) && non_resource_url_matches(rule, a.path)
    }
}

fn resource_matches(rule: &PolicyRule, combined: &str, subresource: &str) -> bool {
    rule.resources.iter().any(|r| {
        r == "*"
            || r == combined
            || (!subresource.is_empty()
                && r.len() == subresource.len() + 2
                && r.starts_with("*/")
                && r.ends_with(subresource))
    })
}

fn non_resource_url_matches(rule: &PolicyRule, path: &str) -> bool {
    rule.non_resource_urls.iter().any(|u| {
        u == "*"
            || u == path
            || u.strip_suffix('*')
                .is_some_and(|prefix| path.starts_with(prefix))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            name: name.into(),
            uid: String::new(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Default::default()
        }
    }

    fn res<'a>(
        verb: &'a str,
        group: &'a str,
        resource: &'a str,
        ns: &'a str,
        name: &'a str,
    ) -> Attributes<'a> {
        let (resource, sub) = resource.split_once('/').unwrap_or((resource, ""));
        Attributes {
            verb,
            is_resource_request: true,
            path: "",
            namespace: ns,
            api_group: group,
            api_version: "v1",
            resource,
            subresource: sub,
            name,
        }
    }

    const POLICY: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: pod-reader, namespace: team-a}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: alice-reads, namespace: team-a}
subjects:
- {kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}
roleRef: {kind: Role, name: pod-reader, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: widget-admin}
rules:
- apiGroups: ["example.com"]
  resources: ["*"]
  verbs: ["*"]
- apiGroups: [""]
  resources: [nodes]
  resourceNames: [node-1]
  verbs: [get, update]
- apiGroups: ["*"]
  resources: ["*/status"]
  verbs: [patch]
- nonResourceURLs: ["/metrics", "/debug/*"]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ops-widgets}
subjects:
- {kind: Group, name: ops}
- {kind: ServiceAccount, name: prometheus, namespace: monitoring}
roleRef: {kind: ClusterRole, name: widget-admin, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: sa-in-ns, namespace: team-b}
subjects:
- {kind: ServiceAccount, name: builder}
roleRef: {kind: ClusterRole, name: widget-admin, apiGroup: rbac.authorization.k8s.io}
"#;

    fn policy() -> Policy {
        Policy::parse(&[(POLICY, "policy.yaml")]).unwrap()
    }

    #[test]
    fn role_binding_is_limited_to_its_namespace() {
        let p = policy();
        let alice = user("alice", &["system:authenticated"]);
        assert!(
            p.authorize(&alice, &res("list", "", "pods", "team-a", ""))
                .allowed
        );
        assert!(
            p.authorize(&alice, &res("watch", "", "pods", "team-a", ""))
                .allowed
        );
        assert!(
            p.authorize(&alice, &res("get", "", "pods", "team-a", "x"))
                .allowed
        );
        assert!(
            !p.authorize(&alice, &res("delete", "", "pods", "team-a", "x"))
                .allowed
        );
        assert!(
            !p.authorize(&alice, &res("list", "", "pods", "team-b", ""))
                .allowed
        );
        assert!(
            !p.authorize(&alice, &res("list", "", "pods", "", ""))
                .allowed
        );
        assert!(
            !p.authorize(&alice, &res("list", "apps", "pods", "team-a", ""))
                .allowed
        );
        assert!(
            !p.authorize(&alice, &res("get", "", "pods/log", "team-a", "x"))
                .allowed
        );
        let d = p.authorize(&alice, &res("list", "", "pods", "team-a", ""));
        assert!(
            d.reason.contains("RoleBinding \"alice-reads\""),
            "{}",
            d.reason
        );
    }

    #[test]
    fn rules_for_a_user_and_namespace() {
        let p = policy();
        let alice = user("alice", &["system:authenticated"]);
        let in_a = p.rules_for(&alice, "team-a");
        assert!(in_a.iter().any(|r| r.resources == ["pods"]));
        let in_b = p.rules_for(&alice, "team-b");
        assert!(!in_b.iter().any(|r| r.resources == ["pods"]));
        // Bootstrap rules for authenticated users are there everywhere.
        assert!(
            in_b.iter()
                .any(|r| r.non_resource_urls.contains(&"/api".to_string()))
        );
    }

    #[test]
    fn groups_stars_resource_names_subresources() {
        let p = policy();
        let bob = user("bob", &["ops"]);
        assert!(
            p.authorize(&bob, &res("delete", "example.com", "widgets", "x", "w"))
                .allowed
        );
        assert!(
            p.authorize(&bob, &res("create", "example.com", "gadgets", "", ""))
                .allowed
        );
        assert!(
            p.authorize(&bob, &res("get", "", "nodes", "", "node-1"))
                .allowed
        );
        assert!(
            !p.authorize(&bob, &res("get", "", "nodes", "", "node-2"))
                .allowed
        );
        // resourceNames never match a list (no name).
        assert!(!p.authorize(&bob, &res("list", "", "nodes", "", "")).allowed);
        assert!(
            p.authorize(&bob, &res("patch", "apps", "deployments/status", "n", "d"))
                .allowed
        );
        assert!(
            !p.authorize(&bob, &res("patch", "apps", "deployments", "n", "d"))
                .allowed
        );
        let nobody = user("carol", &["dev"]);
        assert!(
            !p.authorize(&nobody, &res("get", "example.com", "widgets", "x", "w"))
                .allowed
        );
    }

    #[test]
    fn non_resource_urls() {
        let p = policy();
        let bob = user("bob", &["ops"]);
        assert!(
            p.authorize(&bob, &Attributes::non_resource("get", "/metrics"))
                .allowed
        );
        assert!(
            p.authorize(&bob, &Attributes::non_resource("get", "/debug/pprof/x"))
                .allowed
        );
        assert!(
            !p.authorize(&bob, &Attributes::non_resource("post", "/metrics"))
                .allowed
        );
        assert!(
            !p.authorize(&bob, &Attributes::non_resource("get", "/metricsz"))
                .allowed
        );
    }

    #[test]
    fn service_accounts() {
        let p = policy();
        let prom = user("system:serviceaccount:monitoring:prometheus", &[]);
        assert!(
            p.authorize(&prom, &Attributes::non_resource("get", "/metrics"))
                .allowed
        );
        let other = user("system:serviceaccount:default:prometheus", &[]);
        assert!(
            !p.authorize(&other, &Attributes::non_resource("get", "/metrics"))
                .allowed
        );
        // The subject's namespace defaults to the RoleBinding's.
        let builder = user("system:serviceaccount:team-b:builder", &[]);
        assert!(
            p.authorize(
                &builder,
                &res("get", "example.com", "widgets", "team-b", "w")
            )
            .allowed
        );
        assert!(
            !p.authorize(
                &builder,
                &res("get", "example.com", "widgets", "team-c", "w")
            )
            .allowed
        );
    }

    #[test]
    fn bootstrap_roles() {
        let p = Policy::parse(&[]).unwrap();
        let anon = UserInfo::anonymous();
        let authed = user("dave", &["system:authenticated"]);
        for path in ["/healthz", "/readyz", "/livez", "/version"] {
            assert!(
                p.authorize(&anon, &Attributes::non_resource("get", path))
                    .allowed,
                "{path}"
            );
        }
        assert!(
            !p.authorize(&anon, &Attributes::non_resource("get", "/api"))
                .allowed
        );
        assert!(
            !p.authorize(&anon, &Attributes::non_resource("get", "/metrics"))
                .allowed
        );
        assert!(
            p.authorize(&authed, &Attributes::non_resource("get", "/apis/apps/v1"))
                .allowed
        );
        assert!(
            !p.authorize(&authed, &Attributes::non_resource("get", "/metrics"))
                .allowed
        );
        let ssar = res(
            "create",
            "authorization.k8s.io",
            "selfsubjectaccessreviews",
            "",
            "",
        );
        assert!(p.authorize(&authed, &ssar).allowed);
        assert!(!p.authorize(&anon, &ssar).allowed);
        let admin = user("root", &["system:masters"]);
        assert!(
            p.authorize(&admin, &res("delete", "", "secrets", "x", "y"))
                .allowed
        );
        assert!(
            p.authorize(&admin, &Attributes::non_resource("get", "/metrics"))
                .allowed
        );
    }

    #[test]
    fn list_kind_and_replacing_bootstrap() {
        let text = r#"
apiVersion: v1
kind: List
items:
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRoleBinding
  metadata: {name: "system:public-info-viewer"}
  roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:public-info-viewer"}
  subjects: []
"#;
        let p = Policy::parse(&[(text, "l.yaml")]).unwrap();
        let anon = UserInfo::anonymous();
        assert!(
            !p.authorize(&anon, &Attributes::non_resource("get", "/healthz"))
                .allowed
        );
    }

    #[test]
    fn errors_name_file_document_and_object() {
        let cases = [
            (
                "kind: Role\napiVersion: rbac.authorization.k8s.io/v1\nmetadata: {name: r}\n",
                "namespace is required",
            ),
            (
                "kind: Pod\napiVersion: rbac.authorization.k8s.io/v1\nmetadata: {name: p}\n",
                "unsupported kind",
            ),
            (
                "kind: Role\napiVersion: v1\nmetadata: {name: r, namespace: n}\n",
                "apiVersion",
            ),
            (
                "---\n---\nkind: ClusterRoleBinding\napiVersion: rbac.authorization.k8s.io/v1\nmetadata: {name: b}\nroleRef: {kind: Role, name: r}\n",
                "roleRef.kind",
            ),
            (
                "kind: ClusterRole\napiVersion: rbac.authorization.k8s.io/v1\nmetadata: {name: c}\nrules: [{verbs: 3}]\n",
                "invalid YAML",
            ),
            (
                "kind: ClusterRole\napiVersion: rbac.authorization.k8s.io/v1\nmetadata: {name: c}\n---\nkind: ClusterRole\napiVersion: rbac.authorization.k8s.io/v1\nmetadata: {name: c}\n",
                "defined twice",
            ),
            ("a: [", "invalid YAML"),
        ];
        for (text, want) in cases {
            let e = Policy::parse(&[(text, "bad.yaml")])
                .unwrap_err()
                .to_string();
            assert!(e.contains("bad.yaml"), "{e}");
            assert!(e.contains(want), "want {want:?} in {e}");
        }
        let e = Policy::parse(&[(
            "kind: ClusterRole\napiVersion: rbac.authorization.k8s.io/v1\nmetadata: {name: c}\n---\nkind: Role\napiVersion: rbac.authorization.k8s.io/v1\nmetadata: {name: r}\n",
            "two.yaml",
        )])
        .unwrap_err()
        .to_string();
        assert!(e.contains("document 2 (Role \"r\")"), "{e}");
    }

    #[test]
    fn misspelt_fields_are_refused() {
        let role = "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: r, namespace: n}\nrules:\n- apiGroups: [\"\"]\n  resources: [pods]\n  resourceName: [web]\n  verbs: [get]\n";
        let e = Policy::parse(&[(role, "roles.yaml")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("roles.yaml"), "{e}");
        assert!(e.contains("resourceName"), "{e}");
        let binding = "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: b, namespace: n}\n";
        for (text, field) in [
            (
                format!(
                    "{binding}subjects: [{{kind: User, nmae: alice}}]\nroleRef: {{kind: Role, name: r}}\n"
                ),
                "nmae",
            ),
            (
                format!(
                    "{binding}subjects: [{{kind: User, name: alice}}]\nroleRef: {{kind: Role, name: r, namespace: n}}\n"
                ),
                "namespace",
            ),
            (
                format!(
                    "{binding}subject: [{{kind: User, name: alice}}]\nroleRef: {{kind: Role, name: r}}\n"
                ),
                "subject",
            ),
        ] {
            let e = Policy::parse(&[(text.as_str(), "bindings.yaml")])
                .unwrap_err()
                .to_string();
            assert!(e.contains("bindings.yaml"), "{e}");
            assert!(e.contains(&format!("`{field}`")), "want {field:?} in {e}");
        }
    }

    /// What `kubectl get -o yaml` prints still loads: metadata is lenient and
    /// a ClusterRole may carry an aggregationRule.
    #[test]
    fn exported_objects_load() {
        let text = r#"
apiVersion: v1
kind: List
metadata: {resourceVersion: ""}
items:
- apiVersion: rbac.authorization.k8s.io/v1
  kind: ClusterRole
  metadata:
    name: view
    uid: 0b6c4d6e-0000-0000-0000-000000000000
    resourceVersion: "42"
    creationTimestamp: "2024-01-01T00:00:00Z"
    labels: {kubernetes.io/bootstrapping: rbac-defaults}
    annotations: {rbac.authorization.kubernetes.io/autoupdate: "true"}
  aggregationRule:
    clusterRoleSelectors:
    - matchLabels: {rbac.authorization.k8s.io/aggregate-to-view: "true"}
  rules:
  - {apiGroups: [""], resources: [pods], verbs: [get]}
"#;
        let p = Policy::parse(&[(text, "export.yaml")]).unwrap();
        assert!(p.cluster_roles.contains_key("view"));
    }

    #[test]
    fn names_are_unique_across_files() {
        let view = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: view}\nrules: []\n";
        let e = Policy::parse(&[(view, "a.yaml"), (view, "b.yaml")])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("b.yaml: "), "{e}");
        assert!(e.contains("a.yaml"), "{e}");
        assert!(e.contains("defined twice"), "{e}");
        // Other kinds and namespaces are other names.
        let role = |ns: &str| {
            format!(
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: view, namespace: {ns}}}\n"
            )
        };
        let (r1, r2) = (role("n1"), role("n2"));
        Policy::parse(&[(view, "a.yaml"), (&r1, "b.yaml"), (&r2, "c.yaml")]).unwrap();
        let e = Policy::parse(&[(&r1, "b.yaml"), (view, "a.yaml"), (&r1, "c.yaml")])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("c.yaml: ") && e.contains("b.yaml"), "{e}");
    }
}

//! What a request is about, resolved once per request from its method, path
//! and query, as kube-apiserver's `RequestInfoFactory.NewRequestInfo`
//! (`k8s.io/apiserver/pkg/endpoints/request/requestinfo.go`) does.
//!
//! [`super::handle`] resolves it before anything else; the HTTP metrics label
//! requests by its verb, the REST routing ([`super::k8s`]) dispatches on it,
//! and authorization (RBAC attributes: verb, apiGroup, resource, subresource,
//! namespace, name) can read the same fields. One resolution means the verb a
//! request is counted as is the verb it is served as.
//!
//! Path forms (segments are taken as sent, not percent-decoded):
//! - resource: `/api/{version}/...`, `/apis/{group}/{version}/...`, then
//!   `[namespaces/{namespace}/]{resource}[/{name}[/{subresource}]]`, or the
//!   legacy `/{prefix}/.../watch/...` form whose verb is `watch`;
//! - anything shorter (`/api`, `/api/v1`, `/apis/{group}[/{version}]`) and
//!   every other path (`/healthz`, `/metrics`, `/version`, `/openapi/v3`) is a
//!   non-resource request whose verb is the lowercased HTTP method.

use std::borrow::Cow;

use hyper::Method;
use smallvec::SmallVec;

use super::params::{Query, list_option_bool};
use crate::api::status::ApiStatus;

/// Path prefixes of resource requests (`APIPrefixes`).
const API_PREFIXES: [&str; 2] = ["api", "apis"];
/// The prefix whose paths carry no group (`GrouplessAPIPrefixes`).
const GROUPLESS_API_PREFIX: &str = "api";
/// Verbs that may stand in the path before the resource (`specialVerbs`).
const SPECIAL_VERBS: [&str; 2] = ["proxy", "watch"];
/// Special verbs after which the third part is not a subresource.
const SPECIAL_VERBS_NO_SUBRESOURCES: [&str; 1] = ["proxy"];
/// Subresources of a namespace object, told apart from namespaced resources
/// in `/namespaces/{ns}/{x}` (`namespaceSubresources`).
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

/// Everything the server knows about a request before serving it. Names
/// follow Kubernetes' `RequestInfo`; absent values are `None` (Kubernetes:
/// the empty string), except `api_group`, which is `""` for the core group
/// as in Kubernetes.
///
/// The parts of the path are kept as byte ranges of [`RequestInfo::path`],
/// read through accessors: resolving a request costs one allocation (the
/// path), not one per part (it runs for every request:
/// `docs/BENCHMARKS.md#get-g1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    /// Whether the path names a resource (`/api/v1/pods`) rather than
    /// discovery, ops or anything else.
    pub is_resource_request: bool,
    /// The URL path, as sent (private: the ranges below index it).
    path: String,
    verb: Cow<'static, str>,
    api_prefix: &'static str,
    api_group: Span,
    api_version: Span,
    namespace: Option<Span>,
    resource: Span,
    subresource: Option<Span>,
    name: Option<Span>,
    /// `{resource}[/{name}[/{subresource}/...]]`; `None` without parts.
    parts: Option<Span>,
    /// The name a list or watch is limited to by `fieldSelector=metadata.name=X`:
    /// authorized as a request for that name, so RBAC `resourceNames` let
    /// `kubectl get pod web -w` and single-object informers through, as in
    /// kube-apiserver. Not a routing name: such a request stays a list.
    selected_name: Option<String>,
}

/// A byte range of [`RequestInfo::path`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Span {
    start: usize,
    end: usize,
}

/// The path's segments (between slashes, outer slashes trimmed) kept before
/// they are read; a path with more is rarer than the allocation is costly.
const INLINE_SEGMENTS: usize = 10;

/// A request whose `RequestInfo` cannot be resolved; such a request is
/// answered without routing (see `super::errors` for its `Status`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestInfoError {
    /// A special verb (`/api/v1/watch`) with nothing after it.
    #[error("unable to determine kind and namespace from url {path}")]
    NoResource {
        /// The URL path.
        path: String,
    },
}

impl RequestInfoError {
    /// The verb such a request is counted as in the HTTP metrics: what
    /// Kubernetes would have resolved (a collection GET with a `watch` value
    /// other than false is a watch there).
    pub fn metric_verb(&self) -> &'static str {
        match self {
            RequestInfoError::NoResource { .. } => "other",
        }
    }

    /// The `Status` answer: such a path addresses nothing.
    pub fn status(&self) -> ApiStatus {
        match self {
            RequestInfoError::NoResource { path } => ApiStatus::not_found(format!(
                "the server could not find the requested resource ({path})"
            )),
        }
    }
}

impl RequestInfo {
    /// Resolves the request info of `method` on `path` with `query`.
    pub fn new(
        method: &Method,
        path: &str,
        query: &Query,
    ) -> Result<RequestInfo, RequestInfoError> {
        let mut info = RequestInfo {
            is_resource_request: false,
            path: path.to_string(),
            verb: method_verb(method),
            api_prefix: "",
            api_group: Span::default(),
            api_version: Span::default(),
            namespace: None,
            resource: Span::default(),
            subresource: None,
            name: None,
            parts: None,
            selected_name: None,
        };
        let all = segments(path);
        let seg = |s: Span| &path[s.start..s.end];
        let mut cur: &[Span] = &all;
        let Some((&prefix, rest)) = cur.split_first() else {
            return Ok(info);
        };
        let Some(&api_prefix) = API_PREFIXES.iter().find(|p| **p == seg(prefix)) else {
            return Ok(info);
        };
        if all.len() < 3 {
            return Ok(info);
        }
        cur = rest;
        let mut api_group = Span::default();
        if api_prefix != GROUPLESS_API_PREFIX {
            // The prefix is consumed: "do we have four parts?"
            match cur {
                [group, rest @ ..] if rest.len() >= 2 => {
                    api_group = *group;
                    cur = rest;
                }
                _ => return Ok(info),
            }
        }
        let [api_version, rest @ ..] = cur else {
            return Ok(info);
        };
        info.is_resource_request = true;
        info.api_prefix = api_prefix;
        info.api_group = api_group;
        info.api_version = *api_version;
        cur = rest;

        let Some(&first) = cur.first() else {
            // Unreachable by the length checks above; kept total.
            return Err(RequestInfoError::NoResource {
                path: path.to_string(),
            });
        };
        let mut verb_from_method = true;
        if let Some(&special) = SPECIAL_VERBS.iter().find(|v| **v == seg(first)) {
            if cur.len() < 2 {
                return Err(RequestInfoError::NoResource {
                    path: path.to_string(),
                });
            }
            info.verb = Cow::Borrowed(special);
            cur = &cur[1..];
            verb_from_method = false;
        } else {
            info.verb = Cow::Borrowed(match *method {
                Method::POST => "create",
                Method::GET | Method::HEAD => "get",
                Method::PUT => "update",
                Method::PATCH => "patch",
                Method::DELETE => "delete",
                _ => "",
            });
        }

        // /namespaces/{namespace}/{resource}/...: parts become relative to
        // the resource, unless the third part is a namespace subresource.
        if cur.first().map(|s| seg(*s)) == Some("namespaces") && cur.len() > 1 {
            info.namespace = Some(cur[1]);
            if cur.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&seg(cur[2])) {
                cur = &cur[2..];
            }
        }
        if let (Some(first), Some(last)) = (cur.first(), cur.last()) {
            info.parts = Some(Span {
                start: first.start,
                end: last.end,
            });
        }
        if let Some(r) = cur.first() {
            info.resource = *r;
        }
        info.name = cur.get(1).copied();
        if let Some(s) = cur.get(2)
            && !SPECIAL_VERBS_NO_SUBRESOURCES.contains(&info.verb())
        {
            info.subresource = Some(*s);
        }

        // No name and a GET: a list, or a watch when ?watch= says so.
        if verb_from_method && info.name.is_none() && info.verb == "get" {
            let watch = query.get("watch").is_some_and(list_option_bool);
            info.verb = Cow::Borrowed(if watch { "watch" } else { "list" });
            info.selected_name = query
                .get("fieldSelector")
                .and_then(crate::object::selector::exact_name)
                .filter(|n| is_path_segment_name(n));
        }
        if info.name.is_none() && info.verb == "delete" {
            info.verb = Cow::Borrowed("deletecollection");
        }
        Ok(info)
    }

    /// The URL path, as sent.
    pub fn path(&self) -> &str {
        &self.path
    }

    fn at(&self, s: Span) -> &str {
        self.path.get(s.start..s.end).unwrap_or("")
    }

    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection` (or `proxy`) for resource requests; the lowercased
    /// HTTP method for the others. Empty for a resource request with a method
    /// the API has no verb for (e.g. `OPTIONS`), as in Kubernetes.
    pub fn verb(&self) -> &str {
        &self.verb
    }

    /// `api` or `apis` (resource requests only).
    pub fn api_prefix(&self) -> &'static str {
        self.api_prefix
    }

    /// The API group; `""` for the core group.
    pub fn api_group(&self) -> &str {
        self.at(self.api_group)
    }

    /// The API version (`v1`).
    pub fn api_version(&self) -> &str {
        self.at(self.api_version)
    }

    /// The namespace in the path; `None` for cluster-wide requests.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.map(|s| self.at(s))
    }

    /// The resource (plural), e.g. `pods`.
    pub fn resource(&self) -> &str {
        self.at(self.resource)
    }

    /// The subresource (`status`, `scale`, ...) if the path has one.
    pub fn subresource(&self) -> Option<&str> {
        self.subresource.map(|s| self.at(s))
    }

    /// The object's name if the path names one.
    pub fn name(&self) -> Option<&str> {
        self.name.map(|s| self.at(s))
    }

    /// The name a list or watch is limited to by its field selector
    /// (`metadata.name=X`), for authorization only.
    pub fn selected_name(&self) -> Option<&str> {
        self.selected_name.as_deref()
    }

    /// The path parts from the resource on:
    /// `{resource}[/{name}[/{subresource}/...]]`.
    pub fn parts(&self) -> impl Iterator<Item = &str> {
        self.parts
            .map(|s| self.at(s))
            .into_iter()
            .flat_map(|p| p.split('/'))
    }

    /// How many [`RequestInfo::parts`] there are.
    pub fn parts_len(&self) -> usize {
        self.parts().count()
    }

    /// The verb as a label value for the HTTP metrics: one of a fixed set,
    /// so a client cannot grow the label's cardinality with made-up methods.
    pub fn metric_verb(&self) -> &'static str {
        const KNOWN: [&str; 13] = [
            "get",
            "list",
            "watch",
            "create",
            "update",
            "patch",
            "delete",
            "deletecollection",
            "proxy",
            "head",
            "post",
            "put",
            "options",
        ];
        KNOWN
            .into_iter()
            .find(|v| *v == self.verb())
            .unwrap_or("other")
    }
}

/// The verb of a non-resource request: the lowercased method, without an
/// allocation for the methods HTTP defines.
fn method_verb(method: &Method) -> Cow<'static, str> {
    const KNOWN: [(Method, &str); 9] = [
        (Method::GET, "get"),
        (Method::HEAD, "head"),
        (Method::POST, "post"),
        (Method::PUT, "put"),
        (Method::PATCH, "patch"),
        (Method::DELETE, "delete"),
        (Method::OPTIONS, "options"),
        (Method::CONNECT, "connect"),
        (Method::TRACE, "trace"),
    ];
    KNOWN
        .iter()
        .find(|(m, _)| m == method)
        .map(|(_, v)| Cow::Borrowed(*v))
        .unwrap_or_else(|| Cow::Owned(method.as_str().to_ascii_lowercase()))
}

/// The byte ranges of `path`'s segments: what `path.trim_matches('/')`
/// splits into at `/` (none for an empty or all-slash path).
fn segments(path: &str) -> SmallVec<[Span; INLINE_SEGMENTS]> {
    let mut out = SmallVec::new();
    let start = path.len() - path.trim_start_matches('/').len();
    let end = path.trim_end_matches('/').len().max(start);
    if start == end {
        return out;
    }
    let mut from = start;
    for (i, b) in path.as_bytes()[start..end].iter().enumerate() {
        if *b == b'/' {
            out.push(Span {
                start: from,
                end: start + i,
            });
            from = start + i + 1;
        }
    }
    out.push(Span { start: from, end });
    out
}

/// apimachinery's `path.IsValidPathSegmentName`: a name that could be a
/// path segment (not `.` or `..`, no `/` or `%`), and not empty.
fn is_path_segment_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '%'])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: Method, uri: &str) -> Result<RequestInfo, RequestInfoError> {
        let (path, query) = match uri.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (uri, None),
        };
        RequestInfo::new(&method, path, &Query::parse(query))
    }

    /// (method, uri, verb, group, version, namespace, resource, name, subresource)
    type Row = (
        Method,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        Option<&'static str>,
        &'static str,
        Option<&'static str>,
        Option<&'static str>,
    );

    #[test]
    fn resource_requests() {
        use Method as M;
        #[rustfmt::skip]
        let rows: Vec<Row> = vec![
            // core, namespaced collection and item
            (M::GET, "/api/v1/namespaces/ns1/pods", "list", "", "v1", Some("ns1"), "pods", None, None),
            (M::GET, "/api/v1/namespaces/ns1/pods/web", "get", "", "v1", Some("ns1"), "pods", Some("web"), None),
            (M::HEAD, "/api/v1/namespaces/ns1/pods/web", "get", "", "v1", Some("ns1"), "pods", Some("web"), None),
            (M::POST, "/api/v1/namespaces/ns1/pods", "create", "", "v1", Some("ns1"), "pods", None, None),
            (M::PUT, "/api/v1/namespaces/ns1/pods/web", "update", "", "v1", Some("ns1"), "pods", Some("web"), None),
            (M::PATCH, "/api/v1/namespaces/ns1/pods/web", "patch", "", "v1", Some("ns1"), "pods", Some("web"), None),
            (M::DELETE, "/api/v1/namespaces/ns1/pods/web", "delete", "", "v1", Some("ns1"), "pods", Some("web"), None),
            (M::DELETE, "/api/v1/namespaces/ns1/pods", "deletecollection", "", "v1", Some("ns1"), "pods", None, None),
            (M::GET, "/api/v1/namespaces/ns1/pods/web/status", "get", "", "v1", Some("ns1"), "pods", Some("web"), Some("status")),
            // core, all namespaces / cluster-scoped
            (M::GET, "/api/v1/pods", "list", "", "v1", None, "pods", None, None),
            (M::GET, "/api/v1/nodes/n1", "get", "", "v1", None, "nodes", Some("n1"), None),
            (M::POST, "/api/v1/nodes", "create", "", "v1", None, "nodes", None, None),
            (M::GET, "/api/v1/nodes/", "list", "", "v1", None, "nodes", None, None),
            // group
            (M::GET, "/apis/example.com/v1/widgets", "list", "example.com", "v1", None, "widgets", None, None),
            (M::GET, "/apis/example.com/v1/widgets/w", "get", "example.com", "v1", None, "widgets", Some("w"), None),
            (M::GET, "/apis/apps/v1/namespaces/ns1/deployments", "list", "apps", "v1", Some("ns1"), "deployments", None, None),
            (M::PATCH, "/apis/apps/v1/namespaces/ns1/deployments/d/scale", "patch", "apps", "v1", Some("ns1"), "deployments", Some("d"), Some("scale")),
            // the namespace object itself and its subresources
            (M::GET, "/api/v1/namespaces", "list", "", "v1", None, "namespaces", None, None),
            (M::GET, "/api/v1/namespaces/ns1", "get", "", "v1", Some("ns1"), "namespaces", Some("ns1"), None),
            (M::PUT, "/api/v1/namespaces/ns1/finalize", "update", "", "v1", Some("ns1"), "namespaces", Some("ns1"), Some("finalize")),
            // watch variants: anything sent but 0 and false is a watch
            (M::GET, "/api/v1/namespaces/ns1/pods?watch=true", "watch", "", "v1", Some("ns1"), "pods", None, None),
            (M::GET, "/api/v1/pods?watch=True", "watch", "", "v1", None, "pods", None, None),
            (M::GET, "/api/v1/pods?watch=TRUE", "watch", "", "v1", None, "pods", None, None),
            (M::GET, "/api/v1/pods?watch=1", "watch", "", "v1", None, "pods", None, None),
            (M::GET, "/api/v1/pods?watch=t", "watch", "", "v1", None, "pods", None, None),
            (M::GET, "/api/v1/pods?limit=5&watch=T", "watch", "", "v1", None, "pods", None, None),
            (M::GET, "/apis/example.com/v1/widgets?watch=true", "watch", "example.com", "v1", None, "widgets", None, None),
            (M::GET, "/api/v1/pods?watch=false", "list", "", "v1", None, "pods", None, None),
            (M::GET, "/api/v1/pods?watch=False", "list", "", "v1", None, "pods", None, None),
            (M::GET, "/api/v1/pods?watch=0", "list", "", "v1", None, "pods", None, None),
            (M::GET, "/api/v1/pods?watch=FALSE", "list", "", "v1", None, "pods", None, None),
            // Anything else sent is true, even nothing (apimachinery's rule).
            (M::GET, "/api/v1/pods?watch=", "watch", "", "v1", None, "pods", None, None),
            (M::GET, "/api/v1/pods?watch", "watch", "", "v1", None, "pods", None, None),
            (M::GET, "/api/v1/pods?watch=yes", "watch", "", "v1", None, "pods", None, None),
            (M::GET, "/api/v1/pods?watch=f", "watch", "", "v1", None, "pods", None, None),
            // the first value counts, as in Kubernetes
            (M::GET, "/api/v1/pods?watch=0&watch=1", "list", "", "v1", None, "pods", None, None),
            // an item GET stays a get, watch or not
            (M::GET, "/api/v1/namespaces/ns1/pods/web?watch=true", "get", "", "v1", Some("ns1"), "pods", Some("web"), None),
            // the legacy watch path
            (M::GET, "/api/v1/watch/pods", "watch", "", "v1", None, "pods", None, None),
            (M::GET, "/api/v1/watch/namespaces/ns1/pods", "watch", "", "v1", Some("ns1"), "pods", None, None),
            (M::GET, "/apis/example.com/v1/watch/widgets/w", "watch", "example.com", "v1", None, "widgets", Some("w"), None),
            // methods without a verb
            (M::OPTIONS, "/api/v1/pods", "", "", "v1", None, "pods", None, None),
        ];
        for (method, uri, verb, group, version, ns, resource, name, sub) in rows {
            let i = info(method.clone(), uri).unwrap_or_else(|e| panic!("{method} {uri}: {e}"));
            let want = (
                true,
                verb,
                group,
                version,
                ns.map(str::to_string),
                resource,
                name.map(str::to_string),
                sub.map(str::to_string),
            );
            let got = (
                i.is_resource_request,
                i.verb(),
                i.api_group(),
                i.api_version(),
                i.namespace().map(str::to_string),
                i.resource(),
                i.name().map(str::to_string),
                i.subresource().map(str::to_string),
            );
            assert_eq!(got, want, "{method} {uri}");
            assert_eq!(i.path(), uri.split('?').next().unwrap_or(uri));
            assert_eq!(i.parts().next(), Some(resource), "{uri}");
            let prefix = if group.is_empty() { "api" } else { "apis" };
            assert_eq!(i.api_prefix(), prefix, "{uri}");
        }
    }

    #[test]
    fn parts_are_relative_to_the_resource() {
        let i = info(Method::GET, "/api/v1/namespaces/ns1/pods/web/log/extra").unwrap();
        assert_eq!(
            i.parts().collect::<Vec<_>>(),
            ["pods", "web", "log", "extra"]
        );
        assert_eq!(i.parts_len(), 4);
        assert_eq!(i.subresource(), Some("log"));
        // proxy takes no subresource
        let i = info(Method::GET, "/api/v1/proxy/namespaces/ns1/pods/web/x").unwrap();
        assert_eq!(i.verb(), "proxy");
        assert_eq!(i.name(), Some("web"));
        assert_eq!(i.subresource(), None);
    }

    #[test]
    fn non_resource_requests() {
        use Method as M;
        for (method, uri, verb) in [
            (M::GET, "/healthz", "get"),
            (M::GET, "/livez", "get"),
            (M::HEAD, "/readyz", "head"),
            (M::GET, "/metrics", "get"),
            (M::GET, "/version", "get"),
            (M::GET, "/", "get"),
            (M::GET, "/api", "get"),
            (M::GET, "/api/v1", "get"),
            (M::GET, "/api/v1/", "get"),
            (M::GET, "/apis", "get"),
            (M::GET, "/apis/example.com", "get"),
            (M::GET, "/apis/example.com/v1", "get"),
            (M::GET, "/openapi/v3/apis/example.com/v1", "get"),
            (M::POST, "/apis/example.com", "post"),
            (M::DELETE, "/healthz", "delete"),
            (M::GET, "/other/v1/pods?watch=true", "get"),
        ] {
            let i = info(method.clone(), uri).unwrap();
            assert!(!i.is_resource_request, "{uri}");
            assert_eq!(i.verb(), verb, "{method} {uri}");
            assert_eq!(i.path(), uri.split('?').next().unwrap_or(uri));
            assert!(i.resource().is_empty() && i.api_group().is_empty() && i.parts_len() == 0);
        }
    }

    #[test]
    fn unresolvable_requests() {
        assert!(matches!(
            info(Method::GET, "/api/v1/watch"),
            Err(RequestInfoError::NoResource { .. })
        ));
        // A watch value on an item GET or a write does not matter.
        assert_eq!(
            info(Method::GET, "/api/v1/nodes/n?watch=maybe").map(|i| i.verb().to_string()),
            Ok("get".into())
        );
        assert!(info(Method::POST, "/api/v1/nodes?watch=maybe").is_ok());
    }

    #[test]
    fn metric_verbs_are_a_closed_set() {
        let q = Query::default();
        let m = |method: &str, path: &str| {
            let method = Method::from_bytes(method.as_bytes()).unwrap();
            RequestInfo::new(&method, path, &q).unwrap().metric_verb()
        };
        assert_eq!(m("GET", "/api/v1/pods"), "list");
        assert_eq!(m("GET", "/healthz"), "get");
        assert_eq!(m("HEAD", "/healthz"), "head");
        assert_eq!(m("POST", "/apis"), "post");
        assert_eq!(m("BREW", "/healthz"), "other");
        assert_eq!(m("BREW", "/api/v1/pods"), "other");
        assert_eq!(m("OPTIONS", "/api/v1/pods"), "other");
    }

    #[test]
    fn segments_are_the_trimmed_path_split_at_slashes() {
        for p in [
            "",
            "/",
            "//",
            "/api",
            "api/v1/",
            "//api//v1///pods//",
            "/a/b/c/d/e/f/g/h/i/j/k/l/m",
        ] {
            let t = p.trim_matches('/');
            let want: Vec<&str> = if t.is_empty() {
                Vec::new()
            } else {
                t.split('/').collect()
            };
            let got: Vec<&str> = segments(p).iter().map(|s| &p[s.start..s.end]).collect();
            assert_eq!(got, want, "{p:?}");
        }
    }

    #[test]
    fn other_methods_are_lowercased_verbs() {
        let method = Method::from_bytes(b"BREW").unwrap();
        let i = RequestInfo::new(&method, "/coffee", &Query::default()).unwrap();
        assert_eq!(i.verb(), "brew");
        let i = RequestInfo::new(&Method::TRACE, "/coffee", &Query::default()).unwrap();
        assert_eq!(i.verb(), "trace");
    }
}

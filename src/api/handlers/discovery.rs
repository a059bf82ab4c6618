//! Discovery documents in the (legacy, non-aggregated) shapes kubectl and
//! client-go expect: `/version`, `/api`, `/api/v1`, `/apis`,
//! `/apis/{group}` and `/apis/{group}/{version}`.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use hyper::header::{ACCEPT, CACHE_CONTROL, ETAG, HeaderMap, IF_NONE_MATCH, VARY};
use hyper::{Method, Response};

use super::aggregated_discovery;
use super::target::not_found_path;
use crate::api::request::RequestInfo;
use crate::api::request::negotiation::{DiscoveryFormat, discovery_format};
use crate::api::response::Body;
use crate::api::response::writers::{full, json_value, response};
use crate::api::state::State;
use crate::api::status::ApiStatus;
use crate::config::ResourceConfig;

/// The Kubernetes version we claim (kubectl warns on large skews).
pub const KUBE_MAJOR: &str = "1";
pub const KUBE_MINOR: &str = "32";

const VERBS: [&str; 7] = [
    "create", "delete", "get", "list", "patch", "update", "watch",
];

pub fn version() -> Value {
    json!({
        "major": KUBE_MAJOR,
        "minor": KUBE_MINOR,
        "gitVersion": format!("v{KUBE_MAJOR}.{KUBE_MINOR}.0-watchcache-{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
        "goVersion": "rust",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    })
}

/// `/api`: the core group's versions.
pub fn core_versions(resources: &[ResourceConfig]) -> Value {
    let mut versions: Vec<&str> = Vec::new();
    for r in resources.iter().filter(|r| r.group.is_empty()) {
        if !versions.contains(&r.version.as_str()) {
            versions.push(&r.version);
        }
    }
    json!({
        "kind": "APIVersions",
        "versions": versions,
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
    })
}

fn groups(resources: &[ResourceConfig]) -> BTreeMap<&str, Vec<&str>> {
    let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for r in resources.iter().filter(|r| !r.group.is_empty()) {
        let versions = groups.entry(r.group.as_str()).or_default();
        if !versions.contains(&r.version.as_str()) {
            versions.push(&r.version);
        }
    }
    groups
}

fn group_json(name: &str, versions: &[&str]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    let preferred = vs.first().cloned().unwrap_or(Value::Null);
    json!({"name": name, "versions": vs, "preferredVersion": preferred})
}

/// The built-in review groups (`kubectl auth can-i`, `kubectl auth whoami`)
/// that no configured resource shadows.
fn review_groups(resources: &[ResourceConfig]) -> Vec<(&'static str, &'static str)> {
    let configured = groups(resources);
    let mut out: Vec<(&'static str, &'static str)> = Vec::new();
    for (g, v, ..) in super::reviews::REVIEW_RESOURCES {
        if !configured.contains_key(g) && !out.contains(&(g, v)) {
            out.push((g, v));
        }
    }
    out
}

/// `/apis`: every non-core group, then the built-in review groups.
pub fn group_list(resources: &[ResourceConfig]) -> Value {
    let mut groups: Vec<Value> = groups(resources)
        .iter()
        .map(|(name, versions)| group_json(name, versions))
        .collect();
    groups.extend(
        review_groups(resources)
            .into_iter()
            .map(|(g, v)| group_json(g, &[v])),
    );
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/{group}`: one group, or None when no resource has it.
pub fn group(resources: &[ResourceConfig], name: &str) -> Option<Value> {
    let groups = groups(resources);
    let mut g = match groups.get(name) {
        Some(versions) => group_json(name, versions),
        None => {
            let (g, v) = review_groups(resources)
                .into_iter()
                .find(|(g, _)| *g == name)?;
            group_json(g, &[v])
        }
    };
    g["kind"] = json!("APIGroup");
    g["apiVersion"] = json!("v1");
    Some(g)
}

/// `/api/{version}` (group "") or `/apis/{group}/{version}`: the resources
/// of one group version, or None when there are none.
pub fn resource_list(resources: &[ResourceConfig], group: &str, version: &str) -> Option<Value> {
    let list: Vec<Value> = resources
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .map(|r| {
            let mut v = json!({
                "name": r.plural,
                "singularName": r.kind.to_ascii_lowercase(),
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": VERBS,
                "storageVersionHash": "",
            });
            // Both omitted when empty, as in kube-apiserver's APIResource.
            let short_names = r.short_names();
            if !short_names.is_empty() {
                v["shortNames"] = json!(short_names);
            }
            let categories = r.categories();
            if !categories.is_empty() {
                v["categories"] = json!(categories);
            }
            v
        })
        .collect();
    let list = if list.is_empty() {
        review_groups(resources)
            .into_iter()
            .filter(|(g, v)| *g == group && *v == version)
            .flat_map(|(g, _)| {
                super::reviews::REVIEW_RESOURCES
                    .iter()
                    .filter(move |r| r.0 == g)
            })
            .map(|(_, _, plural, kind)| {
                json!({
                    "name": plural,
                    "singularName": "",
                    "namespaced": false,
                    "kind": kind,
                    "verbs": ["create"],
                })
            })
            .collect()
    } else {
        list
    };
    if list.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": list,
    }))
}

/// The OpenAPI v3 group-version path of a resource: `api/v1`, `apis/{group}/{version}`.
fn openapi_gv_path(r: &ResourceConfig) -> String {
    r.base_path().trim_start_matches('/').to_string()
}

/// `/openapi/v3`: the index of group-version documents. kubectl reads it to
/// learn that the server validates fields itself (`fieldValidation`), so it
/// does not need client-side schemas.
pub fn openapi_v3_root(resources: &[ResourceConfig]) -> Value {
    let mut paths = serde_json::Map::new();
    for r in resources {
        let gv = openapi_gv_path(r);
        paths.insert(
            gv.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{gv}")}),
        );
    }
    json!({"paths": paths})
}

/// `/openapi/v3/{api/v1 | apis/{group}/{version}}`: a minimal OpenAPI v3
/// document with each resource's item path and its PATCH operation tagged
/// with `x-kubernetes-group-version-kind` and the `fieldValidation` and
/// `dryRun` query parameters. None when no resource has that group version.
pub fn openapi_v3_group_version(resources: &[ResourceConfig], gv_path: &str) -> Option<Value> {
    let mut paths = serde_json::Map::new();
    for r in resources.iter().filter(|r| openapi_gv_path(r) == gv_path) {
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let params = json!([
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        ]);
        let op = |verb: &str| {
            json!({
                "operationId": format!("{verb}{}", r.kind),
                "x-kubernetes-group-version-kind": gvk,
                "x-kubernetes-action": verb,
                "parameters": params,
                "responses": {"200": {"description": "OK"}},
            })
        };
        let (collection, item) = if r.namespaced {
            (
                format!("{}/namespaces/{{namespace}}/{}", r.base_path(), r.plural),
                format!(
                    "{}/namespaces/{{namespace}}/{}/{{name}}",
                    r.base_path(),
                    r.plural
                ),
            )
        } else {
            (
                format!("{}/{}", r.base_path(), r.plural),
                format!("{}/{}/{{name}}", r.base_path(), r.plural),
            )
        };
        paths.insert(collection, json!({"get": op("list"), "post": op("post")}));
        paths.insert(
            item,
            json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")}),
        );
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "watchcache", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

/// `/api` or `/apis` in the form the `Accept` header negotiates: the
/// legacy document, or aggregated discovery with kube-apiserver's ETag,
/// `Vary` and `Cache-Control` (a matching `If-None-Match` is 304).
fn root(
    resources: &[ResourceConfig],
    core: bool,
    headers: &HeaderMap,
) -> Result<Response<Body>, ApiStatus> {
    let accept = headers.get(ACCEPT).and_then(|v| v.to_str().ok());
    match discovery_format(accept) {
        DiscoveryFormat::Legacy if core => Ok(json_value(200, &core_versions(resources))),
        DiscoveryFormat::Legacy => Ok(json_value(200, &group_list(resources))),
        DiscoveryFormat::NotAcceptable => Err(ApiStatus::new(
            406,
            "NotAcceptable",
            "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf",
        )),
        DiscoveryFormat::AggregatedV2 => {
            let reviews: Vec<_> = review_groups(resources)
                .into_iter()
                .flat_map(|(g, v)| {
                    super::reviews::REVIEW_RESOURCES
                        .iter()
                        .filter(move |r| r.0 == g && r.1 == v)
                        .copied()
                })
                .collect();
            let doc = aggregated_discovery::document(resources, core, &reviews);
            let etag = doc.etag();
            let cached = headers
                .get(IF_NONE_MATCH)
                .is_some_and(|v| v.as_bytes() == etag.as_bytes());
            let mut resp = if cached {
                response(304, aggregated_discovery::CONTENT_TYPE, full(Vec::new()))
            } else {
                response(200, aggregated_discovery::CONTENT_TYPE, full(doc.to_body()))
            };
            let h = resp.headers_mut();
            if let Ok(v) = etag.parse() {
                h.insert(ETAG, v);
            }
            h.insert(VARY, hyper::header::HeaderValue::from_static("Accept"));
            h.insert(
                CACHE_CONTROL,
                hyper::header::HeaderValue::from_static("public"),
            );
            if cached {
                h.remove(hyper::header::CONTENT_TYPE);
            }
            Ok(resp)
        }
    }
}

/// Answers a non-resource path: the discovery and OpenAPI documents.
pub(crate) fn serve(
    state: &State,
    info: &RequestInfo,
    method: &Method,
    headers: &HeaderMap,
) -> Result<Response<Body>, ApiStatus> {
    let path = info.path();
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let resources = &state.config.resources;
    match segs.as_slice() {
        ["version"] => {
            get_only(method, path)?;
            Ok(json_value(200, &version()))
        }
        ["api"] => {
            get_only(method, path)?;
            root(resources, true, headers)
        }
        ["apis"] => {
            get_only(method, path)?;
            root(resources, false, headers)
        }
        ["api", version] => {
            get_only(method, path)?;
            resource_list(resources, "", version)
                .map(|v| json_value(200, &v))
                .ok_or_else(|| not_found_path(path))
        }
        ["apis", name] => {
            get_only(method, path)?;
            group(resources, name)
                .map(|v| json_value(200, &v))
                .ok_or_else(|| not_found_path(path))
        }
        ["apis", group, version] => {
            get_only(method, path)?;
            resource_list(resources, group, version)
                .map(|v| json_value(200, &v))
                .ok_or_else(|| not_found_path(path))
        }
        ["openapi", "v3"] => {
            get_only(method, path)?;
            Ok(json_value(200, &openapi_v3_root(resources)))
        }
        ["openapi", "v3", gv @ ..] => {
            get_only(method, path)?;
            openapi_v3_group_version(resources, &gv.join("/"))
                .map(|v| json_value(200, &v))
                .ok_or_else(|| not_found_path(path))
        }
        _ => Err(not_found_path(path)),
    }
}

fn get_only(method: &Method, path: &str) -> Result<(), ApiStatus> {
    if method == Method::GET || method == Method::HEAD {
        Ok(())
    } else {
        Err(ApiStatus::method_not_allowed(format!(
            "{method} is not supported on {path}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn shapes() {
        let cfg = Config::example();
        let api = core_versions(&cfg.resources);
        assert_eq!(api["versions"], json!(["v1"]));
        let apis = group_list(&cfg.resources);
        assert_eq!(apis["groups"][0]["name"], "apps");
        assert_eq!(
            apis["groups"][0]["preferredVersion"]["groupVersion"],
            "apps/v1"
        );
        let v1 = resource_list(&cfg.resources, "", "v1").unwrap();
        let pods = v1["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "pods")
            .unwrap();
        assert_eq!(pods["kind"], "Pod");
        assert_eq!(pods["singularName"], "pod");
        assert_eq!(pods["namespaced"], true);
        // kubectl resolves `po` and `all` only through discovery.
        assert_eq!(pods["shortNames"], json!(["po"]));
        assert_eq!(pods["categories"], json!(["all"]));
        let apps = resource_list(&cfg.resources, "apps", "v1").unwrap();
        let deploy = apps["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "deployments")
            .unwrap();
        assert_eq!(deploy["shortNames"], json!(["deploy"]));
        // Configured names replace Kubernetes' own; none are omitted.
        let mut res = cfg.resources.clone();
        for r in &mut res {
            if r.plural == "pods" {
                r.short_names = Some(vec!["p".into()]);
                r.categories = Some(Vec::new());
            }
        }
        let v1 = resource_list(&res, "", "v1").unwrap();
        let pods = v1["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "pods")
            .unwrap();
        assert_eq!(pods["shortNames"], json!(["p"]));
        assert!(pods.get("categories").is_none(), "{pods}");
        assert!(resource_list(&cfg.resources, "apps", "v2").is_none());
        assert!(group(&cfg.resources, "apps").is_some());
        assert!(group(&cfg.resources, "nope").is_none());
        // The review groups come after the configured ones.
        let names: Vec<&str> = apis["groups"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|g| g["name"].as_str())
            .collect();
        assert_eq!(
            names,
            ["apps", "authentication.k8s.io", "authorization.k8s.io"]
        );
        let ssar = resource_list(&cfg.resources, "authorization.k8s.io", "v1").unwrap();
        assert_eq!(ssar["resources"][0]["name"], "selfsubjectaccessreviews");
        assert!(group(&cfg.resources, "authentication.k8s.io").is_some());
    }
}

//! The Kubernetes-style REST API (DESIGN.md section 2): discovery, list,
//! watch, get, create, update, patch and delete for every configured
//! resource. Reads come from the [`Cacher`](crate::cacher::Cacher); writes go
//! through [`Storage`](crate::storage::Storage) and come back to the cache
//! only through the reflector.
//!
//! This file routes; [`super::writes`] and [`super::reads`] hold the verbs.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use serde_json::Value;

use super::errors::What;
use super::params::Query;
use super::reads::{get, list, watch};
use super::writes::{create, delete, patch, read_body, update};
use super::{ApiStatus, Body, Resource, State, json_response, status_response};
/// Entry point for every path that is not an ops endpoint.
pub async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    match dispatch(state, req).await {
        Ok(resp) => resp,
        Err(status) => status_response(&status),
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

fn not_found_path(path: &str) -> ApiStatus {
    ApiStatus::not_found(format!(
        "the server could not find the requested resource ({path})"
    ))
}

pub(crate) fn json_value(code: u16, v: &Value) -> Response<Body> {
    json_response(code, v.to_string())
}

async fn dispatch(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, ApiStatus> {
    let path = req.uri().path().to_string();
    let segs: Vec<&str> = path
        .trim_start_matches('/')
        .trim_end_matches('/')
        .split('/')
        .collect();
    let resources = &state.config.resources;
    let method = req.method().clone();
    match segs.as_slice() {
        ["version"] => {
            get_only(&method, &path)?;
            Ok(json_value(200, &super::discovery::version()))
        }
        ["api"] => {
            get_only(&method, &path)?;
            Ok(json_value(200, &super::discovery::core_versions(resources)))
        }
        ["apis"] => {
            get_only(&method, &path)?;
            Ok(json_value(200, &super::discovery::group_list(resources)))
        }
        ["api", version] => {
            get_only(&method, &path)?;
            super::discovery::resource_list(resources, "", version)
                .map(|v| json_value(200, &v))
                .ok_or_else(|| not_found_path(&path))
        }
        ["apis", group] => {
            get_only(&method, &path)?;
            super::discovery::group(resources, group)
                .map(|v| json_value(200, &v))
                .ok_or_else(|| not_found_path(&path))
        }
        ["apis", group, version] => {
            get_only(&method, &path)?;
            super::discovery::resource_list(resources, group, version)
                .map(|v| json_value(200, &v))
                .ok_or_else(|| not_found_path(&path))
        }
        ["openapi", "v3"] => {
            get_only(&method, &path)?;
            Ok(json_value(
                200,
                &super::discovery::openapi_v3_root(resources),
            ))
        }
        ["openapi", "v3", gv @ ..] => {
            get_only(&method, &path)?;
            super::discovery::openapi_v3_group_version(resources, &gv.join("/"))
                .map(|v| json_value(200, &v))
                .ok_or_else(|| not_found_path(&path))
        }
        ["api", version, rest @ ..] => {
            let (version, rest) = (version.to_string(), owned(rest));
            resource_request(state, "", &version, &rest, req).await
        }
        ["apis", group, version, rest @ ..] => {
            let (group, version, rest) = (group.to_string(), version.to_string(), owned(rest));
            resource_request(state, &group, &version, &rest, req).await
        }
        _ => Err(not_found_path(&path)),
    }
}

fn owned(segs: &[&str]) -> Vec<String> {
    segs.iter().map(|s| s.to_string()).collect()
}

/// What a resource path addresses.
pub(crate) struct Target<'a> {
    pub resource: &'a Resource,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl Target<'_> {
    pub fn what(&self) -> What {
        What {
            plural: self.resource.config.plural.clone(),
            group: self.resource.config.group.clone(),
            name: self.name.clone(),
        }
    }
}

async fn resource_request(
    state: Arc<State>,
    group: &str,
    version: &str,
    rest: &[String],
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiStatus> {
    let path = req.uri().path().to_string();
    // {plural}[/{name}] or namespaces/{ns}/{plural}[/{name}]
    let (namespace, plural, name) = match rest {
        [ns_kw, ns, plural] if ns_kw == "namespaces" => (Some(ns.clone()), plural, None),
        [ns_kw, ns, plural, name] if ns_kw == "namespaces" => {
            (Some(ns.clone()), plural, Some(name.clone()))
        }
        [plural] => (None, plural, None),
        [plural, name] => (None, plural, Some(name.clone())),
        _ => return Err(not_found_path(&path)),
    };
    let resource = state
        .resource(group, version, plural)
        .ok_or_else(|| not_found_path(&path))?;
    let namespaced = resource.config.namespaced;
    // Scope: a namespaced path for a cluster-scoped resource, or an item path
    // without namespace for a namespaced one, addresses nothing.
    if namespace.is_some() && !namespaced {
        return Err(not_found_path(&path));
    }
    if namespace.is_none() && namespaced && name.is_some() {
        return Err(not_found_path(&path));
    }
    if let Some(ns) = &namespace
        && (ns.is_empty() || ns.contains(['/', '%']))
    {
        return Err(ApiStatus::bad_request(format!("invalid namespace {ns:?}")));
    }
    if let Some(n) = &name
        && n.is_empty()
    {
        return Err(not_found_path(&path));
    }
    let target = Target {
        resource,
        namespace,
        name,
    };
    let query = Query::parse(req.uri().query());
    let method = req.method().clone();
    // Each verb's future is boxed: the request future hyper moves into a task
    // then stays small instead of carrying every verb's state machine inline
    // (a memmove of several KB per request otherwise).
    match (&method, target.name.is_some()) {
        (&Method::GET, false) => {
            if query.bool("watch")? {
                Box::pin(watch(&state, &target, &query, &req)).await
            } else {
                Box::pin(list(&target, &query, &req)).await
            }
        }
        (&Method::GET, true) => Box::pin(get(&target, &query, &req)).await,
        (&Method::POST, false) => {
            if namespaced && target.namespace.is_none() {
                return Err(ApiStatus::method_not_allowed(format!(
                    "POST is not supported on {path}: create in a namespace"
                )));
            }
            let (parts, body) = read_body(&state, req).await?;
            Box::pin(create(&state, &target, &query, &parts, body)).await
        }
        (&Method::PUT, true) => {
            let (parts, body) = read_body(&state, req).await?;
            Box::pin(update(&state, &target, &query, &parts, body)).await
        }
        (&Method::PATCH, true) => {
            let (parts, body) = read_body(&state, req).await?;
            Box::pin(patch(&state, &target, &query, &parts, body)).await
        }
        (&Method::DELETE, true) => {
            let (_, body) = read_body(&state, req).await?;
            Box::pin(delete(&state, &target, &query, body)).await
        }
        _ => Err(ApiStatus::method_not_allowed(format!(
            "{method} is not supported on {path}"
        ))),
    }
}

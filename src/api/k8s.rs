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

use super::connection::ConnectionHandle;
use super::errors::What;
use super::params::Query;
use super::reads::{self, get, list, watch};
use super::request_info::RequestInfo;
use super::writes::{create, delete, patch, read_body, update};
use super::{ApiStatus, Body, Resource, State, json_response, status_response};

/// Entry point for every path that is not an ops endpoint: resource
/// requests by their [`RequestInfo`], discovery by path.
pub(crate) async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
    info: &RequestInfo,
    query: Query,
    conn: &ConnectionHandle,
) -> Response<Body> {
    let result = if info.is_resource_request {
        // Boxed: see `api::handle` (the request future's size).
        Box::pin(resource_request(state, req, info, query, conn)).await
    } else {
        discovery(&state, info, req.method())
    };
    match result {
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

/// The non-resource paths: discovery and OpenAPI documents.
fn discovery(
    state: &State,
    info: &RequestInfo,
    method: &Method,
) -> Result<Response<Body>, ApiStatus> {
    let path = info.path();
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let resources = &state.config.resources;
    match segs.as_slice() {
        ["version"] => {
            get_only(method, path)?;
            Ok(json_value(200, &super::discovery::version()))
        }
        ["api"] => {
            get_only(method, path)?;
            Ok(json_value(200, &super::discovery::core_versions(resources)))
        }
        ["apis"] => {
            get_only(method, path)?;
            Ok(json_value(200, &super::discovery::group_list(resources)))
        }
        ["api", version] => {
            get_only(method, path)?;
            super::discovery::resource_list(resources, "", version)
                .map(|v| json_value(200, &v))
                .ok_or_else(|| not_found_path(path))
        }
        ["apis", group] => {
            get_only(method, path)?;
            super::discovery::group(resources, group)
                .map(|v| json_value(200, &v))
                .ok_or_else(|| not_found_path(path))
        }
        ["apis", group, version] => {
            get_only(method, path)?;
            super::discovery::resource_list(resources, group, version)
                .map(|v| json_value(200, &v))
                .ok_or_else(|| not_found_path(path))
        }
        ["openapi", "v3"] => {
            get_only(method, path)?;
            Ok(json_value(
                200,
                &super::discovery::openapi_v3_root(resources),
            ))
        }
        ["openapi", "v3", gv @ ..] => {
            get_only(method, path)?;
            super::discovery::openapi_v3_group_version(resources, &gv.join("/"))
                .map(|v| json_value(200, &v))
                .ok_or_else(|| not_found_path(path))
        }
        _ => Err(not_found_path(path)),
    }
}

/// What a resource path addresses.
pub(crate) struct Target<'a> {
    pub resource: &'a Resource,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

impl Target<'_> {
    pub fn what(&self) -> What {
        What::of(&self.resource.config, self.name.map(str::to_string))
    }
}

/// A Get answered at once from the cache ([`reads::get_now`]), or `None`
/// for the routed, async path, which also answers every request this one
/// cannot (a path that addresses nothing included, with its Status).
pub(crate) fn get_now(
    state: &State,
    req: &Request<Incoming>,
    info: &RequestInfo,
    query: &Query,
) -> Option<Result<Response<Body>, ApiStatus>> {
    if !info.is_resource_request || info.verb() != "get" || req.method() != Method::GET {
        return None;
    }
    // Without a resourceVersion the read is consistent: it always waits.
    if matches!(query.resource_version(), Ok(None)) {
        return None;
    }
    let target = target(state, info).ok()?;
    reads::get_now(&target, query, req)
}

/// What a resource request's path addresses, or the Status of a path that
/// addresses nothing.
fn target<'a>(state: &'a State, info: &'a RequestInfo) -> Result<Target<'a>, ApiStatus> {
    let path = info.path();
    // No subresources (or proxying) are served.
    if info.parts_len() > 2 || info.verb() == "proxy" {
        return Err(not_found_path(path));
    }
    let resource = state
        .resource(info.api_group(), info.api_version(), info.resource())
        .ok_or_else(|| not_found_path(path))?;
    let namespaced = resource.config.namespaced;
    let mut namespace = info.namespace();
    // `/namespaces/{name}` addresses the (cluster-scoped) namespace object
    // itself; RequestInfo names it as its own namespace, as Kubernetes does.
    if !namespaced && info.resource() == "namespaces" && info.namespace() == info.name() {
        namespace = None;
    }
    let name = info.name();
    // Scope: a namespaced path for a cluster-scoped resource, or an item path
    // without namespace for a namespaced one, addresses nothing.
    if namespace.is_some() && !namespaced {
        return Err(not_found_path(path));
    }
    if namespace.is_none() && namespaced && name.is_some() {
        return Err(not_found_path(path));
    }
    if let Some(ns) = &namespace
        && (ns.is_empty() || ns.contains(['/', '%']))
    {
        return Err(ApiStatus::bad_request(format!("invalid namespace {ns:?}")));
    }
    if let Some(n) = &name
        && n.is_empty()
    {
        return Err(not_found_path(path));
    }
    Ok(Target {
        resource,
        namespace,
        name,
    })
}

async fn resource_request(
    state: Arc<State>,
    req: Request<Incoming>,
    info: &RequestInfo,
    query: Query,
    conn: &ConnectionHandle,
) -> Result<Response<Body>, ApiStatus> {
    let path = info.path();
    let target = target(&state, info)?;
    let namespaced = target.resource.config.namespaced;
    let method = req.method().clone();
    // Each verb's future is boxed: the request future hyper moves into a task
    // then stays small instead of carrying every verb's state machine inline
    // (a memmove of several KB per request otherwise).
    match (info.verb(), &method) {
        ("list", &Method::GET) => Box::pin(list(&target, &query, &req)).await,
        // `?watch=` or the legacy `/watch/` path form, on a collection.
        ("watch", &Method::GET) if target.name.is_none() => {
            Box::pin(watch(&state, &target, &query, &req, conn)).await
        }
        ("get", &Method::GET) => Box::pin(get(&target, &query, &req)).await,
        ("create", &Method::POST) if target.name.is_none() => {
            if namespaced && target.namespace.is_none() {
                return Err(ApiStatus::method_not_allowed(format!(
                    "POST is not supported on {path}: create in a namespace"
                )));
            }
            let (parts, body) = Box::pin(read_body(&state, req)).await?;
            Box::pin(create(&state, &target, &query, &parts, body)).await
        }
        ("update", &Method::PUT) if target.name.is_some() => {
            let (parts, body) = Box::pin(read_body(&state, req)).await?;
            Box::pin(update(&state, &target, &query, &parts, body)).await
        }
        ("patch", &Method::PATCH) if target.name.is_some() => {
            let (parts, body) = Box::pin(read_body(&state, req)).await?;
            Box::pin(patch(&state, &target, &query, &parts, body)).await
        }
        ("delete", &Method::DELETE) if target.name.is_some() => {
            let (_, body) = Box::pin(read_body(&state, req)).await?;
            Box::pin(delete(&state, &target, &query, body)).await
        }
        _ => Err(ApiStatus::method_not_allowed(format!(
            "{method} is not supported on {path}"
        ))),
    }
}

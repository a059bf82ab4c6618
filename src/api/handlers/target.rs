//! What a resource request's path addresses ([`Target`]): its resource,
//! namespace and name, resolved once from the [`RequestInfo`]; a path
//! that addresses nothing is its Status.

use crate::api::request::RequestInfo;
use crate::api::state::{Resource, State};
use crate::api::status::ApiStatus;
use crate::api::status::errors::What;

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

/// What a resource request's path addresses, or the Status of a path that
/// addresses nothing.
pub(crate) fn resolve<'a>(
    state: &'a State,
    info: &'a RequestInfo,
) -> Result<Target<'a>, ApiStatus> {
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

pub(crate) fn not_found_path(path: &str) -> ApiStatus {
    ApiStatus::not_found(format!(
        "the server could not find the requested resource ({path})"
    ))
}

//! Routing: a request, its [`RequestInfo`] resolved and admitted, goes to
//! its handler: the ops endpoints, the self reviews, discovery, or a verb
//! on a resource ([`crate::api::handlers`], one file per verb).

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response};

use crate::api::handlers::target::resolve;
use crate::api::handlers::{
    create, delete, discovery, get, list, ops, patch, reviews, update, watch,
};
use crate::api::request::RequestInfo;
use crate::api::request::body::read_body;
use crate::api::request::connection::ConnectionHandle;
use crate::api::request::params::Query;
use crate::api::response::Body;
use crate::api::response::writers::status_response;
use crate::api::state::State;
use crate::api::status::ApiStatus;
use crate::auth::UserInfo;

pub(crate) async fn route(
    state: Arc<State>,
    req: Request<Incoming>,
    info: &RequestInfo,
    query: Query,
    user: Option<&Arc<UserInfo>>,
    conn: &ConnectionHandle,
) -> Response<Body> {
    match info.path() {
        "/healthz" | "/livez" | "/readyz" | "/metrics" => ops::handle(&state, &req, &query),
        reviews::SSAR_PATH | reviews::SSR_PATH | reviews::SSRR_PATH => {
            match Box::pin(reviews::handle(&state, req, user)).await {
                Some(Ok(resp)) => resp,
                Some(Err(status)) => status_response(&status),
                None => status_response(&ApiStatus::not_found("not found")),
            }
        }
        // Boxed, see `handle`.
        _ => Box::pin(resources(state, req, info, query, conn)).await,
    }
}

/// Entry point for every path that is not an ops endpoint: resource
/// requests by their [`RequestInfo`], discovery by path.
async fn resources(
    state: Arc<State>,
    req: Request<Incoming>,
    info: &RequestInfo,
    query: Query,
    conn: &ConnectionHandle,
) -> Response<Body> {
    let result = if info.is_resource_request {
        // Boxed: see `pipeline::handle` (the request future's size).
        Box::pin(resource_request(state, req, info, query, conn)).await
    } else {
        discovery::serve(&state, info, req.method(), req.headers())
    };
    match result {
        Ok(resp) => resp,
        Err(status) => status_response(&status),
    }
}

async fn resource_request(
    state: Arc<State>,
    req: Request<Incoming>,
    info: &RequestInfo,
    query: Query,
    conn: &ConnectionHandle,
) -> Result<Response<Body>, ApiStatus> {
    let path = info.path();
    let target = resolve(&state, info)?;
    let namespaced = target.resource.config.namespaced;
    let method = req.method().clone();
    // Each verb's future is boxed: the request future hyper moves into a task
    // then stays small instead of carrying every verb's state machine inline
    // (a memmove of several KB per request otherwise).
    match (info.verb(), &method) {
        ("list", &Method::GET) => Box::pin(list::list(&state, &target, &query, &req)).await,
        // `?watch=` or the legacy `/watch/` path form, on a collection.
        ("watch", &Method::GET) if target.name.is_none() => {
            Box::pin(watch::watch(&state, &target, &query, &req, conn)).await
        }
        ("get", &Method::GET) => Box::pin(get::get(&target, &query, &req)).await,
        ("create", &Method::POST) if target.name.is_none() => {
            if namespaced && target.namespace.is_none() {
                return Err(ApiStatus::method_not_allowed(format!(
                    "POST is not supported on {path}: create in a namespace"
                )));
            }
            let (parts, body) = Box::pin(read_body(&state.config.server, req)).await?;
            Box::pin(create::create(&state, &target, &query, &parts, body)).await
        }
        ("update", &Method::PUT) if target.name.is_some() => {
            let (parts, body) = Box::pin(read_body(&state.config.server, req)).await?;
            Box::pin(update::update(&state, &target, &query, &parts, body)).await
        }
        ("patch", &Method::PATCH) if target.name.is_some() => {
            let (parts, body) = Box::pin(read_body(&state.config.server, req)).await?;
            Box::pin(patch::patch(&state, &target, &query, &parts, body)).await
        }
        ("delete", &Method::DELETE) if target.name.is_some() => {
            let (_, body) = Box::pin(read_body(&state.config.server, req)).await?;
            Box::pin(delete::delete(&state, &target, &query, body)).await
        }
        _ => Err(ApiStatus::method_not_allowed(format!(
            "{method} is not supported on {path}"
        ))),
    }
}

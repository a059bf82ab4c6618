//! `GET` of one object, answered by the [`Cacher`](crate::cacher::Cacher):
//! JSON as cached, protobuf, or a Table. A Get the cache answers without
//! waiting is served before any future is made ([`now`]).

use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use serde_json::json;

use super::target::{Target, resolve};
use crate::api::request::RequestInfo;
use crate::api::request::negotiation::{self, IncludeObject, MetadataForm, PROTOBUF};
use crate::api::request::params::Query;
use crate::api::response::writers::{full, json_response, json_value, response};
use crate::api::response::{Body, metadata, printers, protobuf, table};
use crate::api::state::{Resource, State};
use crate::api::status::ApiStatus;
use crate::api::status::errors::cacher_status;
use crate::cacher::GetRequest;
use crate::object::Object;

pub(crate) async fn get(
    target: &Target<'_>,
    query: &Query,
    req: &Request<Incoming>,
) -> Result<Response<Body>, ApiStatus> {
    let (get, form) = get_request(target, query, req)?;
    let obj = target
        .resource
        .cacher
        .get(&get)
        .await
        .map_err(|e| cacher_status(e, &target.what()))?;
    Ok(get_response(target.resource, form, &obj, req))
}

/// A Get answered at once from the cache ([`cached_now`]), or `None`
/// for the routed, async path, which also answers every request this one
/// cannot (a path that addresses nothing included, with its Status).
pub(crate) fn now(
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
    let target = resolve(state, info).ok()?;
    cached_now(&target, query, req)
}

/// [`get`] when the cache answers it without waiting
/// ([`crate::cacher::Cacher::get_now`]); `None`: only [`get`] can.
fn cached_now(
    target: &Target<'_>,
    query: &Query,
    req: &Request<Incoming>,
) -> Option<Result<Response<Body>, ApiStatus>> {
    let (get, form) = match get_request(target, query, req) {
        Ok(r) => r,
        Err(status) => return Some(Err(status)),
    };
    let answer = target.resource.cacher.get_now(&get)?;
    Some(
        answer
            .map(|obj| get_response(target.resource, form, &obj, req))
            .map_err(|e| cacher_status(e, &target.what())),
    )
}

/// The form a Get answers in, besides the object itself.
#[derive(Clone, Copy)]
enum Form {
    Object,
    Table(IncludeObject),
    Metadata(MetadataForm),
}

/// A Get's cacher request and its answer's form, from the request.
fn get_request<'a>(
    target: &Target<'a>,
    query: &Query,
    req: &Request<Incoming>,
) -> Result<(GetRequest<'a>, Form), ApiStatus> {
    let form = match negotiation::table(req, query)? {
        Some(include) => Form::Table(include),
        None => match negotiation::metadata(req, false, &target.resource.config)? {
            Some(m) => Form::Metadata(m),
            None => Form::Object,
        },
    };
    let get = GetRequest {
        namespace: target.namespace,
        name: target.name.unwrap_or_default(),
        resource_version: query.resource_version()?,
    };
    Ok((get, form))
}

/// The response to a Get of `obj`: JSON as stored, protobuf, a Table, or
/// its `PartialObjectMetadata`.
fn get_response(
    res: &Resource,
    form: Form,
    obj: &Object,
    req: &Request<Incoming>,
) -> Response<Body> {
    match form {
        Form::Object if negotiation::protobuf(req, &res.config) => {
            match protobuf::object(&res.config, obj) {
                Ok(body) => response(200, PROTOBUF, full(body)),
                Err(e) => {
                    protobuf::fell_back(&res.config, res.cacher.stats(), &obj.key, &e);
                    json_response(200, obj.wire.clone())
                }
            }
        }
        Form::Object => json_response(200, obj.wire.clone()),
        Form::Metadata(m) => {
            let printer = printers::for_resource(&res.config.group, &res.config.plural);
            let partial = metadata::partial_of_wire(&obj.wire, printer, m.api_version);
            if m.protobuf {
                match metadata::protobuf_body(&partial) {
                    Ok(body) => return response(200, PROTOBUF, full(body)),
                    Err(e) => protobuf::fell_back(&res.config, res.cacher.stats(), &obj.key, &e),
                }
            }
            json_value(200, &partial)
        }
        Form::Table(include) => {
            let columns = table::Columns::of(
                &res.config.group,
                &res.config.plural,
                res.cacher.codec().index_paths(),
            );
            let row = table::object_row(obj, &columns, include, chrono::Utc::now());
            let t = table::table(
                vec![row],
                &columns,
                json!({"resourceVersion": obj.mod_revision.to_string()}),
                true,
            );
            json_value(200, &t)
        }
    }
}

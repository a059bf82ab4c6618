//! `GET` of a collection: a List answered by the
//! [`Cacher`](crate::cacher::Cacher), written from the cached wire bytes
//! (JSON or protobuf), or from the frames kept for the same objects
//! ([`ListBodyCache`](crate::api::response::list_body_cache::ListBodyCache)).
//! Only kubectl's Table requests re-render.

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{Map, Value, json};

use super::target::Target;
use crate::api::request::negotiation::{self, PROTOBUF};
use crate::api::request::params::Query;
use crate::api::response::list::JsonListFrames;
use crate::api::response::list_body_cache::{ListMedia, Lookup, list_frames};
use crate::api::response::protobuf::{self, ProtobufList};
use crate::api::response::writers::{full, json_value, response};
use crate::api::response::{Body, metadata, printers, table};
use crate::api::state::State;
use crate::api::status::ApiStatus;
use crate::api::status::errors::cacher_status;
use crate::cacher::ListRequest;

pub(crate) async fn list(
    state: &State,
    target: &Target<'_>,
    query: &Query,
    req: &Request<Incoming>,
) -> Result<Response<Body>, ApiStatus> {
    let res = target.resource;
    let table = negotiation::table(req, query)?;
    let (label_selector, field_selector) = query.selectors(res.cacher.codec().index_paths())?;
    let shard_selector = query.shard_selector(state.config.server.sharded_list_and_watch)?;
    let list = ListRequest {
        namespace: target.namespace.map(str::to_string),
        label_selector,
        field_selector,
        shard_selector: shard_selector.clone(),
        resource_version: query.resource_version()?,
        resource_version_match: query.resource_version_match()?,
        limit: query.limit()?,
        continue_token: query.continue_token(),
    };
    let result = res
        .cacher
        .list(&list)
        .await
        .map_err(|e| cacher_status(e, &target.what()))?;
    let mut meta = Map::new();
    meta.insert(
        "resourceVersion".into(),
        Value::String(result.resource_version.to_string()),
    );
    if let Some(c) = &result.continue_token {
        meta.insert("continue".into(), Value::String(c.clone()));
    }
    if let Some(n) = result.remaining_item_count {
        meta.insert("remainingItemCount".into(), json!(n));
    }
    if let Some(include) = table {
        let columns = table::Columns::of(
            &res.config.group,
            &res.config.plural,
            res.cacher.codec().index_paths(),
        );
        let now = chrono::Utc::now();
        let rows = result
            .items
            .iter()
            .map(|o| table::object_row(o, &columns, include, now))
            .collect();
        let t = table::table(rows, &columns, Value::Object(meta), true);
        return Ok(json_value(200, &t));
    }
    if let Some(form) = negotiation::metadata(req, true, &res.config)? {
        let printer = printers::for_resource(&res.config.group, &res.config.plural);
        let items = result
            .items
            .iter()
            .map(|o| serde_json::from_slice(&o.wire).unwrap_or_else(|_| json!({})));
        let l = metadata::partial_list(items, printer, form.api_version, meta);
        if form.protobuf {
            match metadata::protobuf_body(&l) {
                Ok(body) => return Ok(response(200, PROTOBUF, full(body))),
                Err(e) => protobuf::fell_back(&res.config, res.cacher.stats(), "", &e),
            }
        }
        return Ok(json_value(200, &l));
    }
    // Only the full List echoes the shard selector: kube-apiserver's Table
    // and PartialObjectMetadataList carry no shardInfo.
    if let Some(sel) = &shard_selector {
        meta.insert("shardInfo".into(), json!({ "selector": sel.to_string() }));
    }
    let items = if negotiation::protobuf(req, &res.config) {
        match protobuf::list(&res.config, &res.list_bodies, meta.clone(), result.items).await? {
            ProtobufList::Body(body) => return Ok(response(200, PROTOBUF, body)),
            ProtobufList::Unencodable { key, error, items } => {
                protobuf::fell_back(&res.config, res.cacher.stats(), &key, &error);
                items
            }
        }
    } else {
        result.items
    };
    let head = json!({
        "apiVersion": res.config.api_version(),
        "kind": format!("{}List", res.config.kind),
        "metadata": Value::Object(meta),
    })
    .to_string();
    // `head` ends with '}': reopen it for the items.
    let mut head = head;
    head.pop();
    head.push_str(",\"items\":[");
    let head = Bytes::from(head);
    // Everything under a prefix: the same bytes for every List of these
    // objects, kept once built.
    let recorder = match res.list_bodies.lookup_items(&items, ListMedia::Json) {
        Lookup::Hit(frames) => {
            return Ok(response(200, "application/json", Body::kept(head, frames)));
        }
        Lookup::Miss(r) => r,
        Lookup::Off => None,
    };
    let frames = list_frames(head, JsonListFrames::new(items.into_cursor()), recorder);
    Ok(response(200, "application/json", Body::produced(frames)))
}

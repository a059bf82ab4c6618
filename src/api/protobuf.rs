//! Serving kube-apiserver's protobuf (`Accept: application/vnd.kubernetes.protobuf`)
//! for get, list and watch of built-in types. Get and list encode the cached
//! JSON with the storage codec ([`crate::object::protobuf`]) per response;
//! watches are served by the watcher itself
//! ([`crate::cacher::Watcher::use_protobuf`]), which shares each history
//! event's encoding among all protobuf watchers.

use bytes::Bytes;
use hyper::Request;
use hyper::body::Incoming;
use hyper::header::ACCEPT;
use serde_json::{Map, Value};

use crate::object::protobuf;

use super::params::wants_protobuf;
use super::{ApiStatus, Resource};

/// Whether to answer this request in protobuf: the client prefers it and the
/// resource is a built-in type (others, like custom resources, stay JSON).
pub(crate) fn negotiated(req: &Request<Incoming>, res: &Resource) -> bool {
    let accept = req.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
    wants_protobuf(accept) && protobuf::is_builtin_type(&res.config.api_version(), &res.config.kind)
}

fn encode_error(e: protobuf::ProtobufError) -> ApiStatus {
    ApiStatus::internal(format!("cannot encode the object as protobuf: {e}"))
}

/// One cached object (its wire JSON) in protobuf.
pub(crate) fn object(wire: &[u8]) -> Result<Bytes, ApiStatus> {
    let v: Value = serde_json::from_slice(wire)
        .map_err(|e| ApiStatus::internal(format!("cached object is not JSON: {e}")))?;
    protobuf::encode(&v).map(Bytes::from).map_err(encode_error)
}

/// A `<Kind>List` in protobuf: `meta` is the ListMeta JSON, `items` the
/// objects' wire JSON (their TypeMeta is the list's, so it is dropped).
pub(crate) fn list<'a>(
    res: &Resource,
    meta: Map<String, Value>,
    items: impl Iterator<Item = &'a [u8]>,
) -> Result<Bytes, ApiStatus> {
    let mut list_items = Vec::new();
    for wire in items {
        let mut v: Value = serde_json::from_slice(wire)
            .map_err(|e| ApiStatus::internal(format!("cached object is not JSON: {e}")))?;
        if let Some(map) = v.as_object_mut() {
            map.remove("apiVersion");
            map.remove("kind");
        }
        list_items.push(v);
    }
    let api_version = res.config.api_version();
    let kind = format!("{}List", res.config.kind);
    let list = serde_json::json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": Value::Object(meta),
        "items": list_items,
    });
    protobuf::encode(&list)
        .map(Bytes::from)
        .map_err(encode_error)
}

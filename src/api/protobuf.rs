//! Serving kube-apiserver's protobuf (`Accept: application/vnd.kubernetes.protobuf`)
//! for get, list and watch of built-in types: the cached JSON is encoded by
//! the storage codec ([`crate::object::protobuf`]) per response. Watch
//! events are `WatchEvent` frames, each prefixed by its length (4 bytes, big
//! endian), as client-go's protobuf watch decoder reads them.
//!
//! Cost: unlike the JSON path (cached bytes written as they are), each
//! protobuf response and each protobuf watcher encodes what it sends.

use bytes::{BufMut, Bytes, BytesMut};
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

/// Turns a watcher's JSON lines (`{"type":..,"object":..}`) into protobuf
/// `WatchEvent` frames.
pub(crate) struct WatchFrames {
    api_version: String,
}

impl WatchFrames {
    pub(crate) fn new(res: &Resource) -> WatchFrames {
        WatchFrames {
            api_version: res.config.api_version(),
        }
    }

    pub(crate) fn convert(&self, data: &[u8]) -> Result<Bytes, ApiStatus> {
        let mut out = BytesMut::with_capacity(data.len());
        for line in data.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let event: Value = serde_json::from_slice(line)
                .map_err(|e| ApiStatus::internal(format!("watch event is not JSON: {e}")))?;
            let ty = event.get("type").and_then(Value::as_str).unwrap_or("");
            let object = event.get("object").cloned().unwrap_or(Value::Null);
            let object = protobuf::encode(&object).map_err(encode_error)?;
            let frame = protobuf::encode_watch_event(ty, object, &self.api_version)
                .map_err(encode_error)?;
            let len = u32::try_from(frame.len())
                .map_err(|_| ApiStatus::internal("watch event too large"))?;
            out.put_u32(len);
            out.put_slice(&frame);
        }
        Ok(out.freeze())
    }
}

//! Serving kube-apiserver's protobuf (`Accept: application/vnd.kubernetes.protobuf`)
//! for get, list and watch of built-in types. Each cached object is encoded
//! once, on its first protobuf read ([`Object::protobuf_message`]); a Get
//! wraps those bytes in the `k8s\0` envelope and a List writes them as its
//! items, streamed in frames like a JSON List. Watches are served by the
//! watcher itself ([`crate::cacher::Watcher::use_protobuf`]), which shares
//! each history event's encoding among all protobuf watchers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{BufMut, Bytes};
use http_body_util::{BodyExt, StreamBody};
use hyper::Request;
use hyper::body::{Frame, Incoming};
use hyper::header::ACCEPT;
use serde_json::{Map, Value};

use crate::cacher::ListItems;
use crate::object::Object;
use crate::object::protobuf::{self, ListEncoder, ProtobufError};

use super::params::wants_protobuf;
use super::reads::Frames;
#[cfg(test)]
use super::reads::LIST_FRAME_BYTES;
use super::{ApiStatus, Body, Resource};

/// Whether to answer this request in protobuf: the client prefers it and the
/// resource is a built-in type (others, like custom resources, stay JSON).
pub(crate) fn negotiated(req: &Request<Incoming>, res: &Resource) -> bool {
    let accept = req.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
    wants_protobuf(accept) && protobuf::is_builtin_type(&res.config.api_version(), &res.config.kind)
}

/// One cached object in protobuf, typed as its resource (as kube-apiserver
/// serves it, whatever TypeMeta the stored JSON carries). An error means
/// the object does not fit its type's schema: the caller answers in JSON
/// ([`fell_back`]).
pub(crate) fn object(res: &Resource, obj: &Object) -> Result<Bytes, ProtobufError> {
    let api_version = res.config.api_version();
    let message = obj.protobuf_message(&api_version, &res.config.kind)?;
    protobuf::wrap_message(&api_version, &res.config.kind, &message).map(Bytes::from)
}

/// A protobuf List, or why there is none.
pub(crate) enum ProtobufList {
    Body(Body),
    /// An object (`key`; empty when the list type itself has no protobuf
    /// message) does not fit the schema: the items come back for a JSON
    /// List.
    Unencodable {
        key: Arc<str>,
        error: ProtobufError,
        items: ListItems,
    },
}

/// A `<Kind>List` in protobuf: `meta` is the ListMeta JSON. The items'
/// messages are gathered first (the envelope's length precedes them), off
/// the runtime's threads since a first protobuf List encodes every object;
/// the body then streams them.
pub(crate) async fn list(
    res: &Resource,
    meta: Map<String, Value>,
    items: ListItems,
) -> Result<ProtobufList, ApiStatus> {
    let api_version: Arc<str> = Arc::from(res.config.api_version());
    let kind: Arc<str> = Arc::from(res.config.kind.as_str());
    let encoder = match ListEncoder::new(&api_version, &kind, Value::Object(meta)) {
        Ok(e) => e,
        Err(error) => {
            let key = Arc::from("");
            return Ok(ProtobufList::Unencodable { key, error, items });
        }
    };
    let (items, gathered) = tokio::task::spawn_blocking(move || {
        let gathered = items
            .iter()
            .map(|o| {
                o.protobuf_message(&api_version, &kind)
                    .map_err(|e| (Arc::clone(&o.key), e))
            })
            .collect::<Result<Vec<Bytes>, _>>();
        (items, gathered)
    })
    .await
    .map_err(|e| ApiStatus::internal(format!("protobuf list encoding failed: {e}")))?;
    match gathered {
        Ok(messages) => {
            let frames = ListFrames::new(encoder, messages);
            let stream = futures::stream::iter(
                frames.map(|b| Ok::<_, std::convert::Infallible>(Frame::data(b))),
            );
            Ok(ProtobufList::Body(StreamBody::new(stream).boxed_unsync()))
        }
        Err((key, error)) => Ok(ProtobufList::Unencodable { key, error, items }),
    }
}

/// A Get or List asked for protobuf gets JSON instead, because `key` does
/// not fit its type's protobuf schema (a field this build's Kubernetes
/// schema does not know, say). client-go accepts JSON too and reads each
/// response by its Content-Type, so the client keeps working. Counted in
/// `watchcache_protobuf_fallbacks_total`; logged at most once a minute.
pub(crate) fn fell_back(res: &Resource, key: &str, error: &ProtobufError) {
    static LAST_LOGGED: AtomicU64 = AtomicU64::new(0);
    res.cacher.stats().protobuf_fallback();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LAST_LOGGED.load(Ordering::Relaxed);
    if now >= last + 60
        && LAST_LOGGED
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(resource = %res.config.kind, key, %error, "object does not fit its protobuf schema: answered in JSON");
    }
}

/// The frames of a protobuf List body ([`Frames`]): head, items (each
/// after its key and length), tail.
struct ListFrames {
    encoder: ListEncoder,
    head: Option<Vec<u8>>,
    items: std::vec::IntoIter<Bytes>,
    done: bool,
    frames: Frames,
}

impl ListFrames {
    fn new(encoder: ListEncoder, items: Vec<Bytes>) -> ListFrames {
        let items_len = items.iter().map(|m| encoder.item_len(m.len())).sum();
        let mut head = Vec::new();
        encoder.head(items_len, &mut head);
        ListFrames {
            encoder,
            head: Some(head),
            items: items.into_iter(),
            done: false,
            frames: Frames::default(),
        }
    }
}

impl Iterator for ListFrames {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        loop {
            if let Some(f) = self.frames.pop() {
                return Some(f);
            }
            if self.done {
                return None;
            }
            if let Some(h) = self.head.take() {
                self.frames.buf().put_slice(&h);
            }
            while !self.frames.full() {
                let Some(item) = self.items.next() else {
                    self.frames.buf().put_slice(self.encoder.tail());
                    self.done = true;
                    break;
                };
                self.encoder.item_prefix(item.len(), self.frames.buf());
                self.frames.put_item(&item);
            }
            self.frames.end_frame();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, pad: usize) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": "7",
                         "annotations": {"pad": "x".repeat(pad)}},
            "spec": {"nodeName": "n1"},
        })
    }

    /// The streamed List is byte for byte the list message encoded whole by
    /// the generic codec (itself checked against Go's bytes by the fixtures),
    /// with small items coalesced and large ones in frames of their own.
    #[test]
    fn streamed_list_is_the_whole_list_encoded() {
        for pads in [
            vec![],
            vec![10],
            vec![10, 100_000, 20],
            vec![300; 2000],
            vec![100_000],
        ] {
            let pods: Vec<Value> = pads
                .iter()
                .enumerate()
                .map(|(i, p)| pod(&format!("p{i}"), *p))
                .collect();
            let meta = json!({"resourceVersion": "12", "continue": "abc"});
            let items: Vec<Bytes> = pods
                .iter()
                .map(|p| {
                    Bytes::from(protobuf::encode_message(p.clone(), "v1", "Pod").expect("pod"))
                })
                .collect();
            let encoder = ListEncoder::new("v1", "Pod", meta.clone()).expect("encoder");
            let frames: Vec<Bytes> = ListFrames::new(encoder, items).collect();
            let body: Vec<u8> = frames.iter().flat_map(|f| f.iter().copied()).collect();
            // Items in a list carry no TypeMeta of their own.
            let bare: Vec<Value> = pods
                .iter()
                .map(|p| {
                    let mut p = p.clone();
                    if let Some(m) = p.as_object_mut() {
                        m.remove("apiVersion");
                        m.remove("kind");
                    }
                    p
                })
                .collect();
            let whole = protobuf::encode(&json!({
                "apiVersion": "v1", "kind": "PodList", "metadata": meta, "items": bare,
            }))
            .expect("list");
            assert!(body == whole, "pads {pads:?}: streamed list differs");
            assert!(
                frames.iter().all(|f| f.len() <= LIST_FRAME_BYTES + 200_000),
                "frames stay bounded"
            );
            if pads.contains(&100_000) {
                assert!(
                    frames
                        .iter()
                        .any(|f| f.len() >= 100_000 && f.len() < 100_100)
                );
            }
            let decoded = protobuf::decode(&body).expect("decodes");
            assert_eq!(decoded["items"].as_array().map_or(0, Vec::len), pads.len());
        }
    }

    #[test]
    fn object_message_is_cached_and_errors_are_typed() {
        let wire = serde_json::to_vec(&pod("a", 5)).expect("json");
        let obj = crate::object::tests::object("ns", "a", wire);
        let first = obj.protobuf_message("v1", "Pod").expect("encodes");
        let second = obj.protobuf_message("v1", "Pod").expect("cached");
        assert_eq!(
            first.as_ptr(),
            second.as_ptr(),
            "the second read shares the bytes"
        );
        let wrapped = protobuf::wrap_message("v1", "Pod", &first).expect("wraps");
        assert_eq!(wrapped, protobuf::encode(&pod("a", 5)).expect("encode"));

        let bad = crate::object::tests::object("ns", "b", &br#"{"spec":{"priority":"high"}}"#[..]);
        assert!(matches!(
            bad.protobuf_message("v1", "Pod"),
            Err(ProtobufError::Json { .. })
        ));
        let fresh = crate::object::tests::object("ns", "c", &br#"{}"#[..]);
        assert!(matches!(
            fresh.protobuf_message("v1", "NoSuchKind"),
            Err(ProtobufError::UnknownKind { .. })
        ));
    }
}

//! Serving kube-apiserver's protobuf (`Accept: application/vnd.kubernetes.protobuf`)
//! for get, list and watch of built-in types. Each cached object is encoded
//! once, on its first protobuf read, or keeps the message it was stored as
//! ([`Object::protobuf_message`]); a Get wraps those bytes in the `k8s\0`
//! envelope and a List writes them as its items, streamed in frames like a
//! JSON List. Watches are served by the
//! watcher itself ([`crate::cacher::Watcher::use_protobuf`]), which shares
//! each history event's encoding among all protobuf watchers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{BufMut, Bytes};
use serde_json::{Map, Value};

use crate::api::status::ApiStatus;
use crate::cacher::list_items::AHEAD;
use crate::cacher::{CacherStats, ListItems};
use crate::config::ResourceConfig;
use crate::object::Object;
use crate::object::protobuf::{self, ListEncoder, ProtobufError};
use crate::prefetch::prefetch;

use super::body::Body;
use super::list::Frames;
#[cfg(test)]
use super::list::LIST_FRAME_BYTES;
use super::list_body_cache::{ListBodyCache, ListMedia, Lookup, Recorder, list_frames};

/// One cached object in protobuf, typed as its resource (as kube-apiserver
/// serves it, whatever TypeMeta the stored JSON carries). An error means
/// the object does not fit its type's schema: the caller answers in JSON
/// ([`fell_back`]).
pub(crate) fn object(config: &ResourceConfig, obj: &Object) -> Result<Bytes, ProtobufError> {
    let api_version = config.api_version();
    let message = obj.protobuf_message(&api_version, &config.kind)?;
    protobuf::wrap_message(&api_version, &config.kind, &message).map(Bytes::from)
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
    config: &ResourceConfig,
    list_bodies: &Arc<ListBodyCache>,
    meta: Map<String, Value>,
    items: ListItems,
) -> Result<ProtobufList, ApiStatus> {
    let api_version: Arc<str> = Arc::from(config.api_version());
    let kind: Arc<str> = Arc::from(config.kind.as_str());
    let encoder = match ListEncoder::new(&api_version, &kind, Value::Object(meta)) {
        Ok(e) => e,
        Err(error) => {
            let key = Arc::from("");
            return Ok(ProtobufList::Unencodable { key, error, items });
        }
    };
    // Everything under a prefix: kept once built, as a JSON List's is
    // (`ListBodyCache`). The kept frames are the items and the tail; the
    // head (the ListMeta, with this List's resourceVersion, and the
    // lengths) is this List's own.
    let recorder = match list_bodies.lookup_items(&items, ListMedia::Protobuf) {
        Lookup::Hit(frames) => {
            let head = kept_head(&encoder, &frames);
            return Ok(ProtobufList::Body(Body::kept(head, frames)));
        }
        Lookup::Miss(r) => r,
        Lookup::Off => None,
    };
    let (items, encoder, gathered) = tokio::task::spawn_blocking(move || {
        let gathered = gather(&items, &api_version, &kind, &encoder);
        (items, encoder, gathered)
    })
    .await
    .map_err(|e| ApiStatus::internal(format!("protobuf list encoding failed: {e}")))?;
    match gathered {
        Ok(gathered) => Ok(ProtobufList::Body(Body::produced(body_frames(
            encoder, gathered, recorder,
        )))),
        Err((key, error)) => Ok(ProtobufList::Unencodable { key, error, items }),
    }
}

/// The List's objects, each with its message encoded (the first protobuf
/// read of an object) or found; the first that does not fit the schema
/// stops it. The objects are spread over the heap: each object's message
/// handle is fetched a few items ahead (otherwise two dependent cache
/// misses per object, a quarter of a List's time when every message is
/// already there).
fn gather(
    items: &ListItems,
    api_version: &str,
    kind: &str,
    encoder: &ListEncoder,
) -> Result<Gathered, (Arc<str>, ProtobufError)> {
    let objects: Vec<Arc<Object>> = items.iter().cloned().collect();
    let mut items_len = 0;
    for (i, o) in objects.iter().enumerate() {
        if let Some(ahead) = objects.get(i + AHEAD) {
            ahead.protobuf.prefetch();
        }
        let message = o
            .protobuf_message_ref(api_version, kind)
            .map_err(|e| (Arc::clone(&o.key), e))?;
        items_len += encoder.item_len(message.len());
    }
    Ok(Gathered { objects, items_len })
}

/// A List's objects, all with their messages, and the encoded length of
/// its `items` field.
struct Gathered {
    objects: Vec<Arc<Object>>,
    items_len: usize,
}

/// A Get or List asked for protobuf gets JSON instead, because `key` does
/// not fit its type's protobuf schema (a field this build's Kubernetes
/// schema does not know, say). client-go accepts JSON too and reads each
/// response by its Content-Type, so the client keeps working. Counted in
/// `watchcache_protobuf_fallbacks_total`; logged at most once a minute.
pub(crate) fn fell_back(
    config: &ResourceConfig,
    stats: &CacherStats,
    key: &str,
    error: &ProtobufError,
) {
    static LAST_LOGGED: AtomicU64 = AtomicU64::new(0);
    stats.protobuf_fallback();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LAST_LOGGED.load(Ordering::Relaxed);
    if now >= last + 60
        && LAST_LOGGED
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(resource = %config.kind, key, %error, "object does not fit its protobuf schema: answered in JSON");
    }
}

/// A protobuf List body: its head (the ListMeta and the lengths), then
/// [`ListFrames`], recorded with `recorder` (see [`list_frames`]).
fn body_frames(
    encoder: ListEncoder,
    gathered: Gathered,
    recorder: Option<Recorder>,
) -> impl Iterator<Item = Bytes> + Send + 'static {
    let Gathered { objects, items_len } = gathered;
    let mut head = Vec::new();
    encoder.head(items_len, &mut head);
    let items = ListFrames {
        encoder,
        objects,
        next: 0,
        done: false,
        frames: Frames::default(),
    };
    list_frames(Bytes::from(head), items, recorder)
}

/// The frames of a protobuf List body after its head ([`Frames`]): the
/// items (each after its key and length), then the tail. The items are
/// [`gather`]ed objects, whose messages are all there.
struct ListFrames {
    encoder: ListEncoder,
    objects: Vec<Arc<Object>>,
    next: usize,
    done: bool,
    frames: Frames,
}

/// The head of a List written from `kept` frames (items, then the tail):
/// this List's ListMeta and the lengths the kept items add up to.
fn kept_head(encoder: &ListEncoder, kept: &[Bytes]) -> Bytes {
    let kept_len: usize = kept.iter().map(Bytes::len).sum();
    let mut head = Vec::new();
    encoder.head(kept_len.saturating_sub(encoder.tail().len()), &mut head);
    Bytes::from(head)
}

/// A gathered object's message (there is one: see [`gather`]).
fn message(o: &Object) -> &Bytes {
    static NONE: Bytes = Bytes::new();
    o.protobuf.get().unwrap_or(&NONE)
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
            while !self.frames.full() {
                let Some(o) = self.objects.get(self.next) else {
                    self.frames.buf().put_slice(self.encoder.tail());
                    self.done = true;
                    break;
                };
                // The message's handle, then its bytes, ahead of the copy.
                if let Some(ahead) = self.objects.get(self.next + AHEAD) {
                    ahead.protobuf.prefetch();
                }
                if let Some(ahead) = self.objects.get(self.next + AHEAD / 2) {
                    prefetch(message(ahead).as_ptr());
                }
                self.next += 1;
                let item = message(o);
                self.encoder.item_prefix(item.len(), self.frames.buf());
                self.frames.put_item(item);
            }
            self.frames.end_frame();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::response::budget::ListBodyBudget;
    use crate::cacher::Snapshot;
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
            let items = ListItems::Collected(
                pods.iter()
                    .enumerate()
                    .map(|(i, p)| {
                        let wire = serde_json::to_vec(p).expect("json");
                        Arc::new(crate::object::tests::object("ns", &format!("p{i}"), wire))
                    })
                    .collect(),
            );
            let encoder = ListEncoder::new("v1", "Pod", meta.clone()).expect("encoder");
            let gathered = gather(&items, "v1", "Pod", &encoder).expect("every pod encodes");
            // Recorded, as the second List of a snapshot is.
            let cache = ListBodyCache::new("protobuf-test", ListBodyBudget::new(64 << 20));
            let snap = Arc::new(Snapshot::empty(1, 0));
            let recorder = cache.second_list(&snap, "/r/", ListMedia::Protobuf);
            let frames: Vec<Bytes> = body_frames(encoder, gathered, Some(recorder)).collect();
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

            // A later List of the same objects, with a ListMeta of its own:
            // its head, then the kept frames, is that List encoded whole.
            let Lookup::Hit(kept) = cache.lookup(&snap, "/r/", ListMedia::Protobuf) else {
                panic!("pads {pads:?}: the body is kept");
            };
            let meta2 = json!({"resourceVersion": "99999"});
            let encoder2 = ListEncoder::new("v1", "Pod", meta2.clone()).expect("encoder");
            let mut again = kept_head(&encoder2, &kept).to_vec();
            again.extend(kept.iter().flat_map(|f| f.iter().copied()));
            let whole2 = protobuf::encode(&json!({
                "apiVersion": "v1", "kind": "PodList", "metadata": meta2, "items": bare,
            }))
            .expect("list");
            assert!(
                again == whole2,
                "pads {pads:?}: list from kept frames differs"
            );
            // Kept apart from a JSON List of the same objects.
            assert!(matches!(
                cache.lookup(&snap, "/r/", ListMedia::Json),
                Lookup::Miss(None)
            ));
        }
    }

    /// The first object that does not fit the schema stops the gathering,
    /// named by its key (the List is then answered in JSON).
    #[test]
    fn gathering_names_the_object_that_does_not_fit() {
        let good = serde_json::to_vec(&pod("a", 5)).expect("json");
        let objects = vec![
            Arc::new(crate::object::tests::object("ns", "a", good.clone())),
            Arc::new(crate::object::tests::object(
                "ns",
                "b",
                &br#"{"spec":{"priority":"high"}}"#[..],
            )),
            Arc::new(crate::object::tests::object("ns", "c", good)),
        ];
        let encoder = ListEncoder::new("v1", "Pod", json!({})).expect("encoder");
        let items = ListItems::Collected(objects.clone());
        match gather(&items, "v1", "Pod", &encoder) {
            Err((key, ProtobufError::Json { .. })) => assert_eq!(key, objects[1].key),
            Err((key, e)) => panic!("{key}: {e}"),
            Ok(_) => panic!("an object outside the schema was gathered"),
        }
        let fine = ListItems::Collected(vec![Arc::clone(&objects[0]), Arc::clone(&objects[2])]);
        let gathered = gather(&fine, "v1", "Pod", &encoder).expect("both fit");
        let each: usize = gathered
            .objects
            .iter()
            .map(|o| encoder.item_len(message(o).len()))
            .sum();
        assert_eq!(gathered.items_len, each);
        assert!(each > 0);
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

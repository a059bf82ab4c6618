//! The read verbs of the REST API: get, list and watch, all answered by the
//! [`Cacher`](crate::cacher::Cacher). Lists and watch events are written from
//! the cached wire bytes; only kubectl's Table requests re-render.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use hyper::body::Incoming;
use hyper::header::ACCEPT;
use hyper::{Request, Response};
use serde_json::{Map, Value, json};
use tokio::sync::OwnedSemaphorePermit;

use crate::cacher::{GetRequest, ListCursor, ListRequest, WatchRequest};
use crate::object::{FieldSelector, LabelSelector, Object, metadata_str};

use super::connection::ConnectionHandle;
use super::errors::cacher_status;
use super::k8s::{Target, json_value};
use super::list_body_cache::{ListMedia, Lookup, list_frames};
use super::params::{PROTOBUF, PROTOBUF_WATCH, Query, list_option_bool, wants_table};
use super::protobuf::{self, ProtobufList};
use super::table::{self, IncludeObject};
use super::watch_stream::WatchStreamParams;
use super::{ApiStatus, Body, Resource, State, full, json_response, response};

/// Frames of a List body are at most about this large (small objects are
/// coalesced; large ones are written as their own frame without copying).
/// Each frame is one socket write and one wake-up of the reader: 256 KiB
/// took a 10,000-object List from about 8 to 7 ms against 64 KiB
/// (docs/BENCHMARKS.md, session 5), and a response never holds more.
pub(super) const LIST_FRAME_BYTES: usize = 256 * 1024;

fn selectors(res: &Resource, query: &Query) -> Result<(LabelSelector, FieldSelector), ApiStatus> {
    let labels = LabelSelector::parse(query.get("labelSelector").unwrap_or(""))
        .map_err(|e| ApiStatus::bad_request(format!("invalid labelSelector: {e}")))?;
    let fields = FieldSelector::parse(
        query.get("fieldSelector").unwrap_or(""),
        res.cacher.codec().index_paths(),
    )
    .map_err(|e| ApiStatus::bad_request(format!("invalid fieldSelector: {e}")))?;
    Ok((labels, fields))
}

fn table_request(
    req: &Request<Incoming>,
    query: &Query,
) -> Result<Option<IncludeObject>, ApiStatus> {
    let accept = req.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
    if !wants_table(accept) {
        return Ok(None);
    }
    IncludeObject::parse(query.get("includeObject"))
        .map(Some)
        .map_err(ApiStatus::bad_request)
}

pub(crate) async fn get(
    target: &Target<'_>,
    query: &Query,
    req: &Request<Incoming>,
) -> Result<Response<Body>, ApiStatus> {
    let (get, table) = get_request(target, query, req)?;
    let obj = target
        .resource
        .cacher
        .get(&get)
        .await
        .map_err(|e| cacher_status(e, &target.what()))?;
    Ok(get_response(target.resource, table, &obj, req))
}

/// [`get`] when the cache answers it without waiting
/// ([`crate::cacher::Cacher::get_now`]); `None`: only [`get`] can.
pub(crate) fn get_now(
    target: &Target<'_>,
    query: &Query,
    req: &Request<Incoming>,
) -> Option<Result<Response<Body>, ApiStatus>> {
    let (get, table) = match get_request(target, query, req) {
        Ok(r) => r,
        Err(status) => return Some(Err(status)),
    };
    let answer = target.resource.cacher.get_now(&get)?;
    Some(
        answer
            .map(|obj| get_response(target.resource, table, &obj, req))
            .map_err(|e| cacher_status(e, &target.what())),
    )
}

/// A Get's cacher request and its Table conversion, from the request.
fn get_request<'a>(
    target: &Target<'a>,
    query: &Query,
    req: &Request<Incoming>,
) -> Result<(GetRequest<'a>, Option<IncludeObject>), ApiStatus> {
    let table = table_request(req, query)?;
    let get = GetRequest {
        namespace: target.namespace,
        name: target.name.unwrap_or_default(),
        resource_version: query.resource_version()?,
    };
    Ok((get, table))
}

/// The response to a Get of `obj`: JSON as stored, protobuf, or a Table.
fn get_response(
    res: &Resource,
    table: Option<IncludeObject>,
    obj: &Object,
    req: &Request<Incoming>,
) -> Response<Body> {
    match table {
        None if protobuf::negotiated(req, res) => match protobuf::object(res, obj) {
            Ok(body) => response(200, PROTOBUF, full(body)),
            Err(e) => {
                protobuf::fell_back(res, &obj.key, &e);
                json_response(200, obj.wire.clone())
            }
        },
        None => json_response(200, obj.wire.clone()),
        Some(include) => {
            let paths = res.cacher.codec().index_paths();
            let t = table::table(
                vec![table::object_row(obj, paths, include)],
                paths,
                json!({"resourceVersion": obj.mod_revision.to_string()}),
                true,
            );
            json_value(200, &t)
        }
    }
}

pub(crate) async fn list(
    target: &Target<'_>,
    query: &Query,
    req: &Request<Incoming>,
) -> Result<Response<Body>, ApiStatus> {
    let res = target.resource;
    let table = table_request(req, query)?;
    let (label_selector, field_selector) = selectors(res, query)?;
    let list = ListRequest {
        namespace: target.namespace.map(str::to_string),
        label_selector,
        field_selector,
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
        let paths = res.cacher.codec().index_paths();
        let rows = result
            .items
            .iter()
            .map(|o| table::object_row(o, paths, include))
            .collect();
        let t = table::table(rows, paths, Value::Object(meta), true);
        return Ok(json_value(200, &t));
    }
    let items = if protobuf::negotiated(req, res) {
        match protobuf::list(res, meta.clone(), result.items).await? {
            ProtobufList::Body(body) => return Ok(response(200, PROTOBUF, body)),
            ProtobufList::Unencodable { key, error, items } => {
                protobuf::fell_back(res, &key, &error);
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
    let frames = list_frames(head, ListFrames::new(items.into_cursor()), recorder);
    Ok(response(200, "application/json", Body::produced(frames)))
}

/// List body frames in the making, for JSON and protobuf Lists alike:
/// small pieces are copied into a frame of about [`LIST_FRAME_BYTES`]; a
/// large item ends that frame and goes out as a frame of its own, uncopied.
#[derive(Default)]
pub(super) struct Frames {
    buf: BytesMut,
    /// Finished frames not yet handed out.
    ready: VecDeque<Bytes>,
}

impl Frames {
    /// Whether the frame being filled should end before the next item.
    pub(super) fn full(&self) -> bool {
        self.buf.len() >= LIST_FRAME_BYTES || !self.ready.is_empty()
    }

    /// The frame being filled, to append small pieces to.
    pub(super) fn buf(&mut self) -> &mut BytesMut {
        if self.buf.capacity() == 0 {
            self.buf.reserve(LIST_FRAME_BYTES);
        }
        &mut self.buf
    }

    /// An item's bytes: copied, or (large) a frame of their own.
    pub(super) fn put_item(&mut self, item: &Bytes) {
        if item.len() >= LIST_FRAME_BYTES / 4 {
            self.end_frame();
            self.ready.push_back(item.clone());
        } else {
            self.buf().put_slice(item);
        }
    }

    /// Ends the frame being filled (if it has anything).
    pub(super) fn end_frame(&mut self) {
        if !self.buf.is_empty() {
            self.ready.push_back(std::mem::take(&mut self.buf).freeze());
        }
    }

    /// The next finished frame.
    pub(super) fn pop(&mut self) -> Option<Bytes> {
        self.ready.pop_front()
    }
}

/// The frames of a List body after its head: the items' cached wire bytes
/// ([`Frames`]), then `]}`. The items are walked a frame at a time, as
/// hyper asks for the next frame.
struct ListFrames {
    items: ListCursor,
    first: bool,
    done: bool,
    frames: Frames,
}

impl ListFrames {
    fn new(items: ListCursor) -> ListFrames {
        ListFrames {
            items,
            first: true,
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
            let (first, frames) = (&mut self.first, &mut self.frames);
            let more = self.items.visit(|obj| {
                if frames.full() {
                    return ControlFlow::Break(());
                }
                if !*first {
                    frames.buf().put_u8(b',');
                }
                *first = false;
                frames.put_item(&obj.wire);
                ControlFlow::Continue(())
            });
            if !more {
                self.frames.buf().put_slice(b"]}");
                self.done = true;
            }
            self.frames.end_frame();
        }
    }
}

/// A watch slot: a permit of `State::watch_slots`, held by the stream and
/// released when it ends (or the client goes away).
fn acquire_watch_slot(state: &State) -> Result<OwnedSemaphorePermit, ApiStatus> {
    Arc::clone(&state.watch_slots)
        .try_acquire_owned()
        .map_err(|_| {
            ApiStatus::too_many_requests(
                format!(
                    "too many concurrent watches (limit {})",
                    state.config.server.max_watches
                ),
                1,
            )
        })
}

/// Turns watch lines into Table watch lines (kubectl `get -w`).
pub(crate) struct TableWatch {
    paths: Vec<Arc<str>>,
    include: IncludeObject,
    first: bool,
}

impl TableWatch {
    pub(crate) fn convert(&mut self, data: &[u8]) -> Bytes {
        let mut out = BytesMut::with_capacity(data.len());
        for line in data.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let converted = serde_json::from_slice::<Value>(line).ok().and_then(|ev| {
                let ty = ev.get("type")?.as_str()?.to_string();
                if !matches!(ty.as_str(), "ADDED" | "MODIFIED" | "DELETED") {
                    return None;
                }
                let obj = ev.get("object")?.clone();
                let rv = metadata_str(&obj, "resourceVersion")
                    .unwrap_or("")
                    .to_string();
                let row = table::row(obj, &self.paths, self.include);
                let t = table::table(
                    vec![row],
                    &self.paths,
                    json!({"resourceVersion": rv}),
                    self.first,
                );
                self.first = false;
                Some(json!({"type": ty, "object": t}).to_string())
            });
            match converted {
                Some(s) => out.put_slice(s.as_bytes()),
                None => out.put_slice(line),
            }
            out.put_u8(b'\n');
        }
        out.freeze()
    }
}

/// A random watch timeout in `[min, 2*min)` seconds (kube-apiserver's
/// `--min-request-timeout` behaviour).
fn default_watch_timeout(min_seconds: u64) -> std::time::Duration {
    let min = min_seconds.max(1);
    std::time::Duration::from_secs(rand::random_range(min..min.saturating_mul(2).max(min + 1)))
}

pub(crate) async fn watch(
    state: &Arc<State>,
    target: &Target<'_>,
    query: &Query,
    req: &Request<Incoming>,
    conn: &ConnectionHandle,
) -> Result<Response<Body>, ApiStatus> {
    let res = target.resource;
    let table = table_request(req, query)?;
    let (label_selector, field_selector) = selectors(res, query)?;
    // Like kube-apiserver: a watch without timeoutSeconds still ends, after a
    // random time in [min, 2*min), so long-lived watches spread over replicas
    // and restarts instead of pinning one connection forever.
    let timeout = match query.timeout()? {
        Some(t) => Some(t),
        None => Some(default_watch_timeout(
            state.config.server.min_request_timeout_seconds,
        )),
    };
    let watch = WatchRequest {
        namespace: target.namespace.map(str::to_string),
        label_selector,
        field_selector,
        resource_version: query.resource_version()?,
        resource_version_match: query.resource_version_match()?,
        allow_bookmarks: query.bool("allowWatchBookmarks"),
        send_initial_events: query.get("sendInitialEvents").map(list_option_bool),
        timeout,
    };
    let permit = acquire_watch_slot(state)?;
    let what = target.what();
    // A watch that cannot be served from history still gets a Watcher,
    // whose only item is the 410: a 200 with an ERROR event, as Kubernetes.
    let mut watcher = res
        .cacher
        .watch(watch)
        .await
        .map_err(|e| cacher_status(e, &what))?;
    let protobuf_watch = table.is_none() && protobuf::negotiated(req, res);
    if protobuf_watch {
        // History events are then encoded once, shared by every such watcher.
        watcher.use_protobuf();
    }
    let content_type = if protobuf_watch {
        PROTOBUF_WATCH
    } else {
        "application/json"
    };
    let table = table.map(|include| TableWatch {
        paths: res.cacher.codec().index_paths().to_vec(),
        include,
        first: true,
    });
    // HTTP/2 streams end through flow control; only an HTTP/1.1 connection
    // is closed when its watch's end cannot be written.
    let http1_connection = (req.version() < hyper::Version::HTTP_2).then(|| conn.clone());
    let body = state.watch_streams.open(
        watcher,
        WatchStreamParams {
            max_buffered_bytes: state.config.server.watch_max_buffered_bytes.max(1),
            cacher: Arc::clone(&res.cacher),
            table,
            permit,
            http1_connection,
            protobuf_api_version: protobuf_watch.then(|| res.config.api_version()),
        },
    );
    let mut resp = response(200, content_type, body);
    resp.headers_mut().insert(
        hyper::header::CACHE_CONTROL,
        hyper::header::HeaderValue::from_static("no-cache, private"),
    );
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::{LIST_FRAME_BYTES, ListFrames, default_watch_timeout};
    use crate::api::list_body_cache::{
        ListBodyBudget, ListBodyCache, ListMedia, Lookup, list_frames,
    };
    use crate::cacher::{ListItems, Snapshot};
    use crate::object::Object;

    fn obj(i: usize, blob: usize) -> Arc<Object> {
        let name = format!("o{i:05}");
        let wire = format!(r#"{{"name":"{name}","blob":"{}"}}"#, "x".repeat(blob));
        Arc::new(crate::object::tests::object("ns", &name, wire))
    }

    /// The frames of a List of objects with these blob sizes, and the names
    /// the joined body lists.
    fn frames(sizes: &[usize]) -> (Vec<Bytes>, Vec<String>) {
        let items: Vec<Arc<Object>> = sizes.iter().enumerate().map(|(i, n)| obj(i, *n)).collect();
        // Recorded as a List of everything would be: what is kept is
        // exactly what was sent after the head.
        let cache = ListBodyCache::new("reads-test", ListBodyBudget::new(64 << 20));
        let snap = Arc::new(Snapshot::empty(1, 0));
        let recorder = cache.second_list(&snap, "/r/pods/ns/", ListMedia::Json);
        let head = Bytes::from_static(br#"{"kind":"PodList","items":["#);
        let frames: Vec<Bytes> = list_frames(
            head.clone(),
            ListFrames::new(ListItems::Collected(items).into_cursor()),
            Some(recorder),
        )
        .collect();
        assert_eq!(frames[0], head, "the head is a frame of its own");
        let Lookup::Hit(kept) = cache.lookup(&snap, "/r/pods/ns/", ListMedia::Json) else {
            panic!("a finished body is kept");
        };
        assert_eq!(frames[1..].concat(), kept.concat());
        let body: Vec<u8> = frames.concat();
        let v: serde_json::Value = serde_json::from_slice(&body).expect("the body is JSON");
        let names = v["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|o| o["name"].as_str().unwrap_or("").to_string())
            .collect();
        (frames, names)
    }

    #[test]
    fn list_frames_coalesce_small_items_and_send_large_ones_uncopied() {
        let large = LIST_FRAME_BYTES / 2;
        let many_small = vec![1000; 3 * LIST_FRAME_BYTES / 1000];
        for sizes in [
            vec![],
            vec![10],
            many_small.clone(),
            vec![10, large, 10],
            vec![large],
            vec![10, large],
            vec![large, large],
            [many_small.as_slice(), &[large], many_small.as_slice()].concat(),
        ] {
            let (frames, names) = frames(&sizes);
            let want: Vec<String> = (0..sizes.len()).map(|i| format!("o{i:05}")).collect();
            assert_eq!(names, want, "sizes {sizes:?}");
            // Every frame is bounded (one item of overshoot at most), and each
            // large item is a frame of its own.
            for f in &frames {
                assert!(f.len() < LIST_FRAME_BYTES + 2000 || f.starts_with(b"{\"name\""));
            }
            let alone = frames
                .iter()
                .filter(|f| {
                    f.len() > large
                        && f.starts_with(b"{\"name\"")
                        && f.ends_with(b"\"}")
                        && !f.windows(3).any(|w| w == b"},{")
                })
                .count();
            assert_eq!(
                alone,
                sizes.iter().filter(|n| **n == large).count(),
                "sizes {sizes:?}"
            );
        }
        // Small items are coalesced: 3 frames' worth take about 3 frames
        // (after the head's).
        let (f, _) = frames(&many_small);
        assert!((4..=5).contains(&f.len()), "{} frames", f.len());
    }

    #[test]
    fn default_watch_timeout_is_in_min_to_twice_min() {
        for _ in 0..1000 {
            let t = default_watch_timeout(1800).as_secs();
            assert!((1800..3600).contains(&t), "{t}");
        }
        assert_eq!(default_watch_timeout(1).as_secs(), 1);
        // Never a zero timeout, even from a zero setting.
        assert!(default_watch_timeout(0).as_secs() >= 1);
    }
}

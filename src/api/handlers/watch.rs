//! `GET` of a collection with `?watch`: a watch stream of the
//! [`Cacher`](crate::cacher::Cacher)'s events, in JSON, protobuf or Table
//! rows, written by [`WatchStreams`](crate::api::response::watch_stream::WatchStreams).

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{CONTENT_ENCODING, HeaderValue, VARY};
use hyper::{Request, Response};
use tokio::sync::OwnedSemaphorePermit;

use super::target::Target;
use crate::api::request::connection::ConnectionHandle;
use crate::api::request::negotiation::{self, PROTOBUF_WATCH};
use crate::api::request::params::{Query, list_option_bool};
use crate::api::response::compression;
use crate::api::response::table::{Columns, TableWatch};
use crate::api::response::watch_stream::WatchStreamParams;
use crate::api::response::writers::response;
use crate::api::response::{Body, metadata, printers};
use crate::api::state::State;
use crate::api::status::ApiStatus;
use crate::api::status::errors::cacher_status;
use crate::cacher::{ConvertedLines, WatchRequest};

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
    let table = negotiation::table(req, query)?;
    let metadata_form = match table {
        Some(_) => None,
        None => negotiation::metadata(req, false, &res.config)?,
    };
    let (label_selector, field_selector) = query.selectors(res.cacher.codec().index_paths())?;
    let shard_selector = query.shard_selector(state.config.server.sharded_list_and_watch)?;
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
        shard_selector,
        resource_version: query.resource_version()?,
        resource_version_match: query.resource_version_match()?,
        allow_bookmarks: query.bool("allowWatchBookmarks"),
        send_initial_events: query.get("sendInitialEvents").map(list_option_bool),
        timeout,
    };
    // A WatchList (its initial events a List's worth of data) is gzipped
    // for a client that accepts it, as kube-apiserver 1.37 does; a plain
    // watch never is.
    let gzip = watch.send_initial_events == Some(true)
        && state.config.server.response_compression
        && compression::accepts_gzip(req.headers());
    let permit = acquire_watch_slot(state)?;
    let what = target.what();
    // A watch that cannot be served from history still gets a Watcher,
    // whose only item is the 410: a 200 with an ERROR event, as Kubernetes.
    let mut watcher = res
        .cacher
        .watch(watch)
        .await
        .map_err(|e| cacher_status(e, &what))?;
    if let Some(form) = metadata_form {
        // History events are then converted once per version, shared by
        // every metadata watcher of this resource.
        let printer = printers::for_resource(&res.config.group, &res.config.plural);
        let (api_version, protobuf) = (form.api_version, form.protobuf);
        watcher.use_converted(ConvertedLines {
            slot: usize::from(api_version != "meta.k8s.io/v1") + 2 * usize::from(protobuf),
            convert: Arc::new(move |lines: &[u8]| {
                metadata::watch_events(lines, printer, api_version, protobuf)
            }),
        });
    }
    let protobuf_watch = match metadata_form {
        Some(form) => form.protobuf,
        None => table.is_none() && negotiation::protobuf(req, &res.config),
    };
    if protobuf_watch && metadata_form.is_none() {
        // History events are then encoded once, shared by every such watcher.
        watcher.use_protobuf();
    }
    let content_type = if protobuf_watch {
        PROTOBUF_WATCH
    } else {
        "application/json"
    };
    let table = table.map(|include| {
        let columns = Columns::of(
            &res.config.group,
            &res.config.plural,
            res.cacher.codec().index_paths(),
        );
        TableWatch::new(columns, include)
    });
    // HTTP/2 streams end through flow control; only an HTTP/1.1 connection
    // is closed when its watch's end cannot be written.
    let http1_connection = (req.version() < hyper::Version::HTTP_2).then(|| conn.clone());
    let body = Body::Watch(state.watch_streams.open(
        watcher,
        WatchStreamParams {
            max_buffered_bytes: state.config.server.watch_max_buffered_bytes.max(1),
            cacher: Arc::clone(&res.cacher),
            table,
            permit,
            http1_connection,
            protobuf: protobuf_watch,
            gzip,
        },
    ));
    let mut resp = response(200, content_type, body);
    if gzip {
        crate::metrics::metrics()
            .api_gzip_responses
            .with_label_values(&["watch"])
            .inc();
        let headers = resp.headers_mut();
        headers.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        headers.append(VARY, HeaderValue::from_static("Accept-Encoding"));
    }
    resp.headers_mut().insert(
        hyper::header::CACHE_CONTROL,
        hyper::header::HeaderValue::from_static("no-cache, private"),
    );
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::default_watch_timeout;

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

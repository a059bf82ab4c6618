//! What the unit tests of every piece of `watch` share: a client stream
//! whose etcd stream is the test's, and etcd's requests and answers.

use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tonic::metadata::MetadataMap;

use etcd_client::proto::*;

use super::state::{ClientStream, CreateSpec, Forwarded, UpstreamWatch};
use super::{Front, OUT_BUFFER};
use crate::config::EtcdConfig;
use crate::grpc::auth::AuthGate;
use crate::grpc::kv_cache::{HeaderSource, KvCache, PUT};
use crate::grpc::upstream::Upstream;
use crate::storage::Storage;

/// A client stream of a front with one ready cache of `/c/` at
/// revision 10, its etcd stream replaced by channels the test holds.
pub(super) struct Harness {
    pub(super) stream: ClientStream,
    pub(super) cache: Arc<KvCache>,
    /// What the client receives.
    pub(super) out: mpsc::Receiver<Result<PbWatchResponse, Status>>,
    /// What the stream asks etcd.
    pub(super) to_etcd: mpsc::Receiver<PbWatchRequest>,
    /// etcd's answers; holds `etcd_buffer` of them.
    pub(super) from_etcd: mpsc::Sender<Result<PbWatchResponse, Status>>,
}

pub(super) async fn harness(etcd_buffer: usize, notify_every: Duration) -> Harness {
    // The client is lazy and never dialled: no test reaches etcd.
    let cfg = EtcdConfig {
        endpoints: vec!["http://127.0.0.1:1".to_string()],
        ..EtcdConfig::default()
    };
    let storage = Storage::connect(&cfg).await.expect("lazy etcd client");
    let changes = Arc::new(tokio::sync::watch::Sender::new(0u64));
    let headers = Arc::new(HeaderSource::default());
    let cache = Arc::new(KvCache::new(
        "/c/",
        100,
        Arc::clone(&changes),
        Arc::clone(&headers),
    ));
    cache.reset_for_test(10);
    let upstream = Upstream::new(storage.channel());
    let front = Arc::new(Front {
        caches: vec![Arc::clone(&cache)],
        auth: Arc::new(AuthGate::new(upstream.clone())),
        upstream,
        storage,
        headers,
        changes,
        consistent_read_timeout: Duration::from_millis(100),
        progress_notify_interval: notify_every,
        shutdown: CancellationToken::new(),
        coalesce_writes: false,
        watchers_cached: AtomicI64::new(0),
        watchers_forwarded: AtomicI64::new(0),
        creations_forwarded: AtomicI64::new(0),
        seen: AtomicI64::new(0),
        keys_only_from_index: Default::default(),
    });
    let (out_tx, out) = mpsc::channel(OUT_BUFFER);
    let (req_tx, to_etcd) = mpsc::channel(64);
    let (from_etcd, responses) = mpsc::channel(etcd_buffer);
    let mut stream = ClientStream::new(front, MetadataMap::new(), out_tx);
    stream.upstream = Some(UpstreamWatch {
        requests: req_tx,
        responses,
    });
    Harness {
        stream,
        cache,
        out,
        to_etcd,
        from_etcd,
    }
}

pub(super) fn spec(key: &str, start_revision: i64) -> CreateSpec {
    CreateSpec {
        key: key.as_bytes().to_vec(),
        range_end: Vec::new(),
        start_revision,
        prev_kv: false,
        filters: Vec::new(),
        fragment: false,
        progress_notify: true,
    }
}

/// A forwarded watch placed by the test, before any progress request: every
/// etcd answer covers it.
pub(super) fn fwd(spec: Option<CreateSpec>) -> Forwarded {
    Forwarded {
        spec,
        generation: 0,
        rechecking: false,
        recheck: None,
        cancel_held: false,
    }
}

pub(super) fn put(key: &str, value: Vec<u8>, rev: i64) -> PbEvent {
    PbEvent {
        r#type: PUT,
        kv: Some(PbKeyValue {
            key: key.as_bytes().to_vec(),
            value,
            mod_revision: rev,
            create_revision: rev,
            version: 1,
            lease: 0,
        }),
        prev_kv: None,
    }
}

/// etcd's answer for watch `id` with one event at `rev`.
pub(super) fn event_answer(id: i64, key: &str, rev: i64) -> PbWatchResponse {
    PbWatchResponse {
        header: Some(PbResponseHeader {
            revision: rev,
            ..Default::default()
        }),
        watch_id: id,
        events: vec![put(key, b"v".to_vec(), rev)],
        ..Default::default()
    }
}

fn request(r: PbWatchRequestUnion) -> PbWatchRequest {
    PbWatchRequest {
        request_union: Some(r),
    }
}

pub(super) fn cancel(id: i64) -> PbWatchRequest {
    super::forwarded::cancel_request(id)
}

pub(super) fn progress_request() -> PbWatchRequest {
    request(PbWatchRequestUnion::ProgressRequest(Default::default()))
}

pub(super) fn create(key: &str) -> PbWatchRequest {
    let mut c = PbWatchRequestUnion::CreateRequest(Default::default());
    if let PbWatchRequestUnion::CreateRequest(r) = &mut c {
        r.key = key.as_bytes().to_vec();
    }
    request(c)
}

/// A creation of `key` from `start_revision`, ids auto-assigned.
pub(super) fn create_from(key: &str, range_end: &str, start_revision: i64) -> PbWatchRequest {
    let mut c = PbWatchRequestUnion::CreateRequest(Default::default());
    if let PbWatchRequestUnion::CreateRequest(r) = &mut c {
        r.key = key.as_bytes().to_vec();
        r.range_end = range_end.as_bytes().to_vec();
        r.start_revision = start_revision;
    }
    request(c)
}

/// Forwards the creation of watch `id` of `key` from `start` (`spec`: a
/// cache could take it over), and hands the stream etcd's `created` at
/// revision `rev`.
pub(super) async fn forward_created(
    s: &mut ClientStream,
    id: i64,
    key: &str,
    start: i64,
    spec: Option<CreateSpec>,
    rev: i64,
) {
    s.forward_create(id, None, spec, create_from(key, "", start))
        .await
        .expect("sent");
    let created = PbWatchResponse {
        header: Some(PbResponseHeader {
            revision: rev,
            ..Default::default()
        }),
        watch_id: id,
        created: true,
        ..Default::default()
    };
    assert!(s.on_upstream(created).is_empty(), "nothing handed over");
}

/// The id of the creation the stream sent etcd last.
pub(super) fn sent_create_id(to_etcd: &mut mpsc::Receiver<PbWatchRequest>) -> Option<i64> {
    match to_etcd.try_recv().ok()?.request_union? {
        PbWatchRequestUnion::CreateRequest(c) => Some(c.watch_id),
        _ => None,
    }
}

//! The Watch service: every client watch whose range lies inside one cached
//! prefix is served from that prefix's [`KvCache`] ring; the rest (other
//! ranges, a start revision the ring no longer holds, a cache not ready)
//! goes to etcd unchanged on one etcd stream per client stream. A forwarded
//! watch over a cached range moves onto the ring once etcd's catch-up
//! reaches it.
//!
//! One task per client stream owns its watches. A cached watch is only a
//! cursor into the ring: the task reads from it when the client can take
//! more (a bounded output), round-robin over the stream's watches, so a
//! slow client costs no queue growth and never slows the cache or other
//! streams; a watch whose cursor the ring overran is canceled with
//! `compact_revision`, as etcd cancels a compacted watch. Progress
//! requests are answered only once every event up to the answered revision
//! was sent (for forwarded watches too: etcd's answer is held until then).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use prost::Message;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};
use tracing::debug;

use etcd_client::proto::*;

use super::Front;
use super::kv_cache::{Cursor, DELETE, KvCache, PUT, Read, RingEvent, in_range};

/// Responses buffered towards one client stream. With [`MAX_BATCH_BYTES`]
/// this bounds what a stream whose client reads slowly holds (the ring
/// holds the rest, shared): about 4 x 128 KiB. 16 x 1 MiB let 10,000
/// watchers on 10 lagging streams hold 21-23 KB each (docs/BENCHMARKS.md).
const OUT_BUFFER: usize = 4;
/// Events read from the ring per watch per turn (whole revisions), and
/// about as many bytes: a response stays well within clients' default
/// receive limits (4 MiB in tonic) unless one revision alone is larger.
const MAX_BATCH_EVENTS: usize = 1000;
const MAX_BATCH_BYTES: usize = 128 * 1024;
/// etcd's default `--max-request-bytes`: `fragment` splits responses above it.
const MAX_REQUEST_BYTES: usize = 1536 * 1024;
/// `WatchCreateRequest.FilterType`.
const FILTER_NOPUT: i32 = 0;
const FILTER_NODELETE: i32 = 1;
/// etcd's watch id of stream-wide answers (progress) and failed creations.
const INVALID_WATCH_ID: i64 = -1;

#[derive(Debug, Clone)]
pub struct WatchService {
    pub(crate) front: Arc<Front>,
}

#[tonic::async_trait]
impl PbWatchService for WatchService {
    type WatchStream = BoxStream<'static, Result<PbWatchResponse, Status>>;

    async fn watch(
        &self,
        req: Request<Streaming<PbWatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let (tx, rx) = mpsc::channel(OUT_BUFFER);
        let md = req.metadata().clone();
        let stream = ClientStream {
            front: Arc::clone(&self.front),
            md,
            out: tx,
            pending: VecDeque::new(),
            watches: Vec::new(),
            rr: 0,
            forwarded: HashMap::new(),
            handing_over: HashSet::new(),
            upstream: None,
            next_id: 0,
            progress: None,
            awaiting_created: None,
            max_sent: 0,
        };
        tokio::spawn(stream.run(req.into_inner()));
        Ok(Response::new(ReceiverStream::new(rx).boxed()))
    }
}

/// One client watch served from a cache.
struct CachedWatch {
    id: i64,
    cache: Arc<KvCache>,
    key: Vec<u8>,
    range_end: Vec<u8>,
    cursor: Cursor,
    /// Events below this revision are skipped (the start revision).
    min_rev: i64,
    prev_kv: bool,
    no_put: bool,
    no_delete: bool,
    fragment: bool,
    progress_notify: bool,
    last_sent: Instant,
}

impl CachedWatch {
    fn wants(&self, ev: &RingEvent) -> bool {
        let kv = &ev.kv;
        kv.mod_revision >= self.min_rev
            && in_range(&kv.key, &self.key, &self.range_end)
            && !(self.no_put && ev.r#type == PUT)
            && !(self.no_delete && ev.r#type == DELETE)
    }
}

/// etcd's watch stream towards one client stream's forwarded watches.
struct UpstreamWatch {
    requests: mpsc::Sender<PbWatchRequest>,
    responses: mpsc::Receiver<Result<PbWatchResponse, Status>>,
}

/// What woke a client stream's task.
enum Step {
    End,
    Continue,
    RequestsEnded,
    Request(PbWatchRequest),
    Upstream(Option<Result<PbWatchResponse, Status>>),
    Tick,
}

/// A progress request not answered yet.
struct PendingProgress {
    /// Forwarded watches exist: etcd was asked too; its revision once answered.
    upstream: Option<Option<i64>>,
    /// The client's request, to ask etcd again.
    request: PbWatchRequest,
}

struct ClientStream {
    front: Arc<Front>,
    md: MetadataMap,
    out: mpsc::Sender<Result<PbWatchResponse, Status>>,
    /// Control answers and the fragments of one batch, in order.
    pending: VecDeque<PbWatchResponse>,
    watches: Vec<CachedWatch>,
    /// Where the next round-robin turn starts.
    rr: usize,
    /// Watches etcd serves; with their creation when a cache could take
    /// them over once etcd's catch-up reaches the ring.
    forwarded: HashMap<i64, Option<CreateSpec>>,
    /// Handed over to a cache; etcd's answers for them (until its
    /// `canceled`) are dropped: the ring delivers those events.
    handing_over: HashSet<i64>,
    upstream: Option<UpstreamWatch>,
    next_id: i64,
    progress: Option<PendingProgress>,
    /// A creation forwarded to etcd and not answered yet: later requests
    /// wait, so `created` answers keep the order of the requests (clients
    /// such as clientv3 match them in order).
    awaiting_created: Option<i64>,
    /// The highest event revision sent on this stream: a progress answer
    /// never goes back behind it.
    max_sent: i64,
}

impl Drop for ClientStream {
    fn drop(&mut self) {
        count_watch(&self.front, "cache", -(self.watches.len() as i64));
        count_watch(&self.front, "etcd", -(self.forwarded.len() as i64));
    }
}

impl ClientStream {
    async fn run(mut self, mut requests: Streaming<PbWatchRequest>) {
        let mut changes = self.front.changes.subscribe();
        // Checked ten times per interval, so a notification is late by a
        // tenth of it at most.
        let every = self.front.progress_notify_interval;
        let mut notify_tick = tokio::time::interval((every / 10).max(Duration::from_millis(1)));
        // Like etcd, a client that closes its side still gets its events
        // until it goes away.
        let mut requests_open = true;
        loop {
            if self.pending.is_empty()
                && !self.next_events()
                && let Some(again) = self.answer_progress()
                && let Err(status) = self.send_upstream(again).await
            {
                let _ = self.out.send(Err(status)).await;
                return;
            }
            let has_out = !self.pending.is_empty();
            // The select only borrows fields; the step is handled after it.
            let step = tokio::select! {
                _ = self.front.shutdown.cancelled() => Step::End,
                permit = self.out.reserve(), if has_out => match permit {
                    Ok(permit) => {
                        if let Some(r) = self.pending.pop_front() {
                            permit.send(Ok(r));
                        }
                        Step::Continue
                    }
                    Err(_) => Step::End, // the client is gone
                },
                req = requests.message(), if requests_open && self.awaiting_created.is_none() => match req {
                    Ok(Some(r)) => Step::Request(r),
                    Ok(None) => Step::RequestsEnded,
                    Err(_) => Step::End, // the client broke the stream
                },
                _ = self.out.closed() => Step::End, // the client is gone
                up = recv_upstream(&mut self.upstream) => Step::Upstream(up),
                _ = changes.changed() => Step::Continue,
                _ = notify_tick.tick() => Step::Tick,
            };
            match step {
                Step::End => return,
                Step::Continue => {}
                Step::RequestsEnded => requests_open = false,
                Step::Request(r) => {
                    if let Err(status) = self.handle(r).await {
                        let _ = self.out.send(Err(status)).await;
                        return;
                    }
                }
                Step::Upstream(Some(Ok(resp))) => {
                    if let Some(cancel) = self.on_upstream(resp)
                        && let Err(status) = self.send_upstream(cancel).await
                    {
                        let _ = self.out.send(Err(status)).await;
                        return;
                    }
                }
                Step::Upstream(Some(Err(status))) => {
                    let _ = self.out.send(Err(status)).await;
                    return;
                }
                Step::Upstream(None) => self.upstream = None,
                Step::Tick => self.progress_notify(),
            }
        }
    }

    fn header(&self, revision: i64) -> Option<PbResponseHeader> {
        Some(self.front.headers.header(revision))
    }

    fn id_in_use(&self, id: i64) -> bool {
        self.forwarded.contains_key(&id)
            || self.handing_over.contains(&id)
            || self.watches.iter().any(|w| w.id == id)
    }

    async fn handle(&mut self, req: PbWatchRequest) -> Result<(), Status> {
        match req.request_union {
            Some(PbWatchRequestUnion::CreateRequest(mut c)) => {
                let id = if c.watch_id != 0 {
                    if self.id_in_use(c.watch_id) {
                        self.failed_create("mvcc: duplicate watch ID provided on the WatchStream");
                        return Ok(());
                    }
                    c.watch_id
                } else {
                    while self.id_in_use(self.next_id) {
                        self.next_id += 1;
                    }
                    self.next_id += 1;
                    self.next_id - 1
                };
                if c.key.is_empty() {
                    c.key = vec![0]; // etcd: the smallest key
                }
                if !matches!(c.range_end.as_slice(), [] | [0]) && c.key >= c.range_end {
                    self.failed_create("mvcc: watcher range is empty");
                    return Ok(());
                }
                let mut spec = CreateSpec {
                    key: c.key.clone(),
                    range_end: c.range_end.clone(),
                    start_revision: c.start_revision,
                    prev_kv: c.prev_kv,
                    filters: c.filters.clone(),
                    fragment: c.fragment,
                    progress_notify: c.progress_notify,
                };
                let mut cache = self.front.cache_for(&spec.key, &spec.range_end).cloned();
                // With etcd's auth on, a caller etcd does not let read this
                // range is not served from the cache: etcd gets the
                // creation and answers it (its refusal) itself.
                let mut placeable = true;
                if cache.is_some()
                    && !self
                        .front
                        .auth
                        .permits(&self.md, &spec.key, &spec.range_end)
                        .await
                {
                    cache = None;
                    placeable = false;
                }
                let cacheable = cache.is_some();
                // "From now" means after etcd's current revision, as etcd
                // means it: the cache must have caught up with it first
                // (bounded; else etcd serves the watch).
                let mut created_at = None;
                if spec.start_revision == 0
                    && let Some(cache) = cache.filter(|c| c.is_ready())
                {
                    placeable = false;
                    if let Ok(fresh) = self.front.storage.fresh_revision().await
                        && cache
                            .wait_for_rev(fresh, self.front.consistent_read_timeout)
                            .await
                    {
                        spec.start_revision = fresh + 1;
                        created_at = Some(fresh);
                        placeable = true;
                    }
                }
                let placed = if placeable {
                    self.place(id, spec.clone())
                } else {
                    None
                };
                if let Some(w) = placed {
                    let rev = created_at.unwrap_or_else(|| w.cache.revision());
                    let created = PbWatchResponse {
                        header: self.header(rev),
                        watch_id: id,
                        created: true,
                        ..Default::default()
                    };
                    self.pending.push_back(created);
                    self.watches.push(w);
                    count_watch(&self.front, "cache", 1);
                    return Ok(());
                }
                // etcd serves it: same request, our id.
                c.watch_id = id;
                self.forwarded.insert(id, cacheable.then_some(spec));
                self.awaiting_created = Some(id);
                count_watch(&self.front, "etcd", 1);
                self.send_upstream(PbWatchRequest {
                    request_union: Some(PbWatchRequestUnion::CreateRequest(c)),
                })
                .await
            }
            Some(PbWatchRequestUnion::CancelRequest(c)) => {
                if let Some(i) = self.watches.iter().position(|w| w.id == c.watch_id) {
                    let w = self.watches.remove(i);
                    count_watch(&self.front, "cache", -1);
                    let canceled = PbWatchResponse {
                        header: self.header(w.cache.revision()),
                        watch_id: w.id,
                        canceled: true,
                        ..Default::default()
                    };
                    self.pending.push_back(canceled);
                    Ok(())
                } else if self.forwarded.contains_key(&c.watch_id) {
                    self.send_upstream(PbWatchRequest {
                        request_union: Some(PbWatchRequestUnion::CancelRequest(c)),
                    })
                    .await
                } else {
                    Ok(()) // etcd ignores an unknown id
                }
            }
            Some(PbWatchRequestUnion::ProgressRequest(p)) => {
                let request = PbWatchRequest {
                    request_union: Some(PbWatchRequestUnion::ProgressRequest(p)),
                };
                let upstream = if self.forwarded.is_empty() {
                    None
                } else {
                    self.send_upstream(request.clone()).await?;
                    Some(None)
                };
                // A second request before the first is answered is answered
                // with it (etcd, asked again, may answer now: it ignores a
                // request while one of its watches catches up).
                match &mut self.progress {
                    Some(pp) => {
                        if !matches!(pp.upstream, Some(Some(_))) {
                            pp.upstream = upstream;
                        }
                    }
                    None => self.progress = Some(PendingProgress { upstream, request }),
                }
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// etcd's answer to a creation it refuses.
    fn failed_create(&mut self, reason: &str) {
        let rev = self.front.revision();
        self.pending.push_back(PbWatchResponse {
            header: self.header(rev),
            watch_id: INVALID_WATCH_ID,
            created: true,
            canceled: true,
            cancel_reason: reason.to_string(),
            ..Default::default()
        });
    }

    /// A cached watch for this creation, if a cache can serve it: the range
    /// inside one cached prefix and the start revision in its ring.
    fn place(&self, id: i64, c: CreateSpec) -> Option<CachedWatch> {
        if c.start_revision < 0 {
            return None; // etcd's own answer
        }
        let cache = self.front.cache_for(&c.key, &c.range_end)?;
        let (cursor, rev) = if c.start_revision > 0 {
            cache.cursor_at(c.start_revision)?
        } else {
            cache.cursor_now()?
        };
        let min_rev = if c.start_revision > 0 {
            c.start_revision
        } else {
            rev + 1
        };
        Some(CachedWatch {
            id,
            cache: Arc::clone(cache),
            key: c.key,
            range_end: c.range_end,
            cursor,
            min_rev,
            prev_kv: c.prev_kv,
            no_put: c.filters.contains(&FILTER_NOPUT),
            no_delete: c.filters.contains(&FILTER_NODELETE),
            fragment: c.fragment,
            progress_notify: c.progress_notify,
            last_sent: Instant::now(),
        })
    }

    async fn send_upstream(&mut self, req: PbWatchRequest) -> Result<(), Status> {
        if self.upstream.is_none() {
            self.upstream = Some(self.open_upstream());
        }
        let Some(up) = &self.upstream else {
            return Err(Status::internal("no etcd watch stream"));
        };
        up.requests
            .send(req)
            .await
            .map_err(|_| Status::unavailable("etcd watch stream closed"))
    }

    /// Opens etcd's stream for this client stream's forwarded watches; a
    /// task pumps its answers into a bounded channel (etcd waits when the
    /// client is slow).
    fn open_upstream(&self) -> UpstreamWatch {
        let (req_tx, req_rx) = mpsc::channel::<PbWatchRequest>(64);
        let (resp_tx, resp_rx) = mpsc::channel(OUT_BUFFER);
        let upstream = self.front.upstream.clone();
        let md = self.md.clone();
        tokio::spawn(async move {
            let mut stream = match upstream
                .streaming::<_, PbWatchResponse, _>(
                    "/etcdserverpb.Watch/Watch",
                    &md,
                    ReceiverStream::new(req_rx),
                )
                .await
            {
                Ok(r) => r.into_inner(),
                Err(s) => {
                    let _ = resp_tx.send(Err(s)).await;
                    return;
                }
            };
            loop {
                tokio::select! {
                    _ = resp_tx.closed() => return,
                    m = stream.message() => {
                        let item = match m {
                            Ok(Some(r)) => Ok(r),
                            Ok(None) => Err(Status::unavailable("etcd closed the watch stream")),
                            Err(s) => Err(s),
                        };
                        let end = item.is_err();
                        if resp_tx.send(item).await.is_err() || end {
                            return;
                        }
                    }
                }
            }
        });
        UpstreamWatch {
            requests: req_tx,
            responses: resp_rx,
        }
    }

    /// An answer from etcd for a forwarded watch, passed on unchanged
    /// (progress answers wait for the cached watches, see `answer_progress`).
    fn on_upstream(&mut self, resp: PbWatchResponse) -> Option<PbWatchRequest> {
        if let Some(h) = &resp.header {
            self.front.headers.learn(h);
        }
        if self.handing_over.contains(&resp.watch_id) {
            if resp.canceled {
                self.handing_over.remove(&resp.watch_id);
            }
            return None;
        }
        let is_progress = resp.watch_id == INVALID_WATCH_ID
            && resp.events.is_empty()
            && !resp.created
            && !resp.canceled;
        if is_progress
            && let Some(PendingProgress {
                upstream: Some(rev @ None),
                ..
            }) = &mut self.progress
        {
            *rev = Some(resp.header.as_ref().map(|h| h.revision).unwrap_or(0));
            return None;
        }
        for e in &resp.events {
            if let Some(kv) = &e.kv {
                self.max_sent = self.max_sent.max(kv.mod_revision);
            }
        }
        if resp.created
            && let Some(id) = self.awaiting_created.take()
            && resp.watch_id != id
        {
            // etcd refused it (id -1) or chose another id (our 0 = "auto").
            let spec = self.forwarded.remove(&id).flatten();
            if resp.canceled {
                count_watch(&self.front, "etcd", -1);
            } else {
                self.forwarded.insert(resp.watch_id, spec);
            }
        }
        if resp.canceled && self.forwarded.remove(&resp.watch_id).is_some() {
            count_watch(&self.front, "etcd", -1);
        }
        let handover = self.handover_point(&resp);
        self.pending.push_back(resp);
        let (id, from) = handover?;
        self.hand_over(id, from)
    }

    /// The revision a forwarded watch could continue from in the ring after
    /// this answer: etcd sent every event of the watch up to the answer's
    /// last one (whole revisions; the last fragment of a split one).
    fn handover_point(&self, resp: &PbWatchResponse) -> Option<(i64, i64)> {
        if resp.fragment || resp.canceled || resp.events.is_empty() {
            return None;
        }
        let spec = self.forwarded.get(&resp.watch_id)?.as_ref()?;
        let cache = self.front.cache_for(&spec.key, &spec.range_end)?;
        let last = resp
            .events
            .iter()
            .filter_map(|e| e.kv.as_ref())
            .map(|kv| kv.mod_revision)
            .max()?;
        cache.cursor_at(last + 1).map(|_| (resp.watch_id, last + 1))
    }

    /// Moves a forwarded watch onto its cache's ring from revision `from`
    /// (etcd sent everything before it) and returns the cancel for etcd.
    fn hand_over(&mut self, id: i64, from: i64) -> Option<PbWatchRequest> {
        let spec = self.forwarded.get(&id)?.clone()?;
        let w = self.place(
            id,
            CreateSpec {
                start_revision: from,
                ..spec
            },
        )?;
        debug!(
            watch_id = id,
            from, "etcd's catch-up reached the ring; handed over"
        );
        self.forwarded.remove(&id);
        self.handing_over.insert(id);
        self.watches.push(w);
        move_watch(&self.front);
        let mut cancel = PbWatchRequestUnion::CancelRequest(Default::default());
        if let PbWatchRequestUnion::CancelRequest(c) = &mut cancel {
            c.watch_id = id;
        }
        Some(PbWatchRequest {
            request_union: Some(cancel),
        })
    }

    /// Reads the next batch of some watch (round robin) into `pending`;
    /// false when every watch is up to date.
    fn next_events(&mut self) -> bool {
        loop {
            let n = self.watches.len();
            let mut moved = false;
            for i in 0..n {
                let idx = (self.rr + i) % n;
                let w = &mut self.watches[idx];
                match w.cache.read(w.cursor, MAX_BATCH_EVENTS, MAX_BATCH_BYTES) {
                    Read::UpToDate { .. } => {}
                    Read::Gone { compact_revision } => {
                        let w = self.watches.remove(idx);
                        count_watch(&self.front, "cache", -1);
                        debug!(
                            watch_id = w.id,
                            compact_revision, "watch fell behind the ring; canceled"
                        );
                        let resp = PbWatchResponse {
                            header: self.header(w.cache.revision()),
                            watch_id: w.id,
                            canceled: true,
                            compact_revision,
                            cancel_reason: "mvcc: required revision has been compacted".to_string(),
                            ..Default::default()
                        };
                        self.pending.push_back(resp);
                        self.rr = idx;
                        return true;
                    }
                    Read::Events { events, next } => {
                        moved = true;
                        w.cursor = next;
                        let last_rev = events.last().map(|e| e.mod_revision()).unwrap_or(0);
                        let out: Vec<PbEvent> = events
                            .iter()
                            .filter(|e| w.wants(e))
                            .map(|e| e.to_pb(w.prev_kv))
                            .collect();
                        if out.is_empty() {
                            continue;
                        }
                        w.last_sent = Instant::now();
                        let resp = PbWatchResponse {
                            header: Some(self.front.headers.header(last_rev)),
                            watch_id: w.id,
                            events: out,
                            ..Default::default()
                        };
                        let fragment = w.fragment;
                        self.push_events(resp, fragment);
                        self.rr = (idx + 1) % n;
                        return true;
                    }
                }
            }
            if !moved {
                return false;
            }
        }
    }

    /// Queues one event response, split as etcd's `sendFragments` does when
    /// the watch asked for fragments and the response is too large.
    fn push_events(&mut self, resp: PbWatchResponse, fragment: bool) {
        for e in &resp.events {
            if let Some(kv) = &e.kv {
                self.max_sent = self.max_sent.max(kv.mod_revision);
            }
        }
        if !fragment || resp.events.len() < 2 || resp.encoded_len() < MAX_REQUEST_BYTES {
            self.pending.push_back(resp);
            return;
        }
        let mut rest = resp.events.into_iter().peekable();
        let base = PbWatchResponse {
            events: Vec::new(),
            ..resp
        };
        while rest.peek().is_some() {
            let mut cur = PbWatchResponse {
                fragment: true,
                ..base.clone()
            };
            while let Some(ev) = rest.peek() {
                cur.events.push(ev.clone());
                if cur.events.len() > 1 && cur.encoded_len() >= MAX_REQUEST_BYTES {
                    cur.events.pop();
                    break;
                }
                rest.next();
            }
            if rest.peek().is_none() {
                cur.fragment = false;
            }
            self.pending.push_back(cur);
        }
    }

    /// Answers a pending progress request once every cached watch is up to
    /// date and etcd answered for the forwarded ones: the revision is the
    /// lowest one every watch of the stream has been sent up to, and never
    /// behind an event already sent (else the caches are asked for
    /// progress, or etcd asked again: `Some(request)` to send it).
    fn answer_progress(&mut self) -> Option<PbWatchRequest> {
        let p = self.progress.as_mut()?;
        if self.forwarded.is_empty() && p.upstream == Some(None) {
            p.upstream = None; // no forwarded watch left to wait for
        }
        let upstream_rev = match p.upstream {
            Some(None) => return None, // etcd has not answered yet
            Some(Some(r)) => Some(r),
            None => None,
        };
        let mut cached: Option<i64> = None;
        for w in &self.watches {
            match w.cache.read(w.cursor, 1, 0) {
                Read::UpToDate { revision } => {
                    cached = Some(cached.map_or(revision, |r| r.min(revision)));
                }
                _ => return None,
            }
        }
        let rev = match (upstream_rev, cached) {
            (Some(u), Some(c)) => u.min(c),
            (Some(u), None) => u,
            (None, Some(c)) => c,
            (None, None) => self.front.revision(),
        };
        if rev < self.max_sent {
            for w in &self.watches {
                if w.cache.revision() < self.max_sent {
                    w.cache.request_progress();
                }
            }
            if let Some(u) = upstream_rev
                && u < self.max_sent
            {
                p.upstream = Some(None);
                return Some(p.request.clone());
            }
            return None;
        }
        self.progress = None;
        self.pending.push_back(PbWatchResponse {
            header: self.header(rev),
            watch_id: INVALID_WATCH_ID,
            ..Default::default()
        });
        None
    }

    /// etcd's periodic progress notification of `progress_notify` watches
    /// that are up to date and sent nothing for the interval.
    fn progress_notify(&mut self) {
        let now = Instant::now();
        let every = self.front.progress_notify_interval;
        let mut out = Vec::new();
        for w in &mut self.watches {
            if !w.progress_notify || now.duration_since(w.last_sent) < every {
                continue;
            }
            if let Read::UpToDate { revision } = w.cache.read(w.cursor, 1, 0) {
                w.last_sent = now;
                out.push((w.id, revision));
            }
        }
        for (id, revision) in out {
            let header = self.header(revision);
            self.pending.push_back(PbWatchResponse {
                header,
                watch_id: id,
                ..Default::default()
            });
        }
    }
}

/// What the front reads of a `WatchCreateRequest` (whose type etcd-client
/// does not export by name).
#[derive(Clone)]
struct CreateSpec {
    key: Vec<u8>,
    range_end: Vec<u8>,
    start_revision: i64,
    prev_kv: bool,
    filters: Vec<i32>,
    fragment: bool,
    progress_notify: bool,
}

async fn recv_upstream(up: &mut Option<UpstreamWatch>) -> Option<Result<PbWatchResponse, Status>> {
    match up {
        Some(u) => u.responses.recv().await,
        None => std::future::pending().await,
    }
}

/// A watch moved from etcd to a cache.
fn move_watch(front: &Front) {
    front.watchers_forwarded.fetch_sub(1, Ordering::Relaxed);
    front.watchers_cached.fetch_add(1, Ordering::Relaxed);
    let g = &crate::metrics::metrics().grpc_watchers;
    g.with_label_values(&["etcd"]).dec();
    g.with_label_values(&["cache"]).inc();
}

fn count_watch(front: &Front, source: &str, delta: i64) {
    match source {
        "cache" => front.watchers_cached.fetch_add(delta, Ordering::Relaxed),
        _ => front.watchers_forwarded.fetch_add(delta, Ordering::Relaxed),
    };
    crate::metrics::metrics()
        .grpc_watchers
        .with_label_values(&[source])
        .add(delta);
    if delta > 0 {
        crate::metrics::metrics()
            .grpc_requests
            .with_label_values(&["watch", source])
            .inc();
    }
}

/// Codec buffer per stream and direction. tonic allocates its default
/// (8 KiB) eagerly for the request and the response side of every stream,
/// which was most of a busy watcher's memory (16 KiB of the front's
/// 16 KiB per watcher against grpc-proxy's 10); watch requests and most
/// responses are small, and the buffers grow for large ones.
const STREAM_BUFFER: usize = 1024;
/// tonic's default: encode this much before yielding.
const YIELD_THRESHOLD: usize = 32 * 1024;

/// etcd's Watch service ([`WatchService`]) with small per-stream codec
/// buffers: what etcd-client's generated `WatchServer` does, bar the
/// buffer sizes it does not let one set.
#[derive(Clone)]
pub struct WatchServer {
    inner: Arc<WatchService>,
    max_encoding_message_size: usize,
}

impl WatchServer {
    pub fn new(inner: WatchService, max_encoding_message_size: usize) -> Self {
        WatchServer {
            inner: Arc::new(inner),
            max_encoding_message_size,
        }
    }
}

impl tonic::server::NamedService for WatchServer {
    const NAME: &'static str = "etcdserverpb.Watch";
}

/// Prost encoding with [`STREAM_BUFFER`]-sized buffers.
struct LeanCodec;

impl tonic::codec::Codec for LeanCodec {
    type Encode = PbWatchResponse;
    type Decode = PbWatchRequest;
    type Encoder = tonic_prost::ProstEncoder<PbWatchResponse>;
    type Decoder = tonic_prost::ProstDecoder<PbWatchRequest>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::new(tonic::codec::BufferSettings::new(
            STREAM_BUFFER,
            YIELD_THRESHOLD,
        ))
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::new(tonic::codec::BufferSettings::new(
            STREAM_BUFFER,
            YIELD_THRESHOLD,
        ))
    }
}

/// The `Watch` method as tonic's streaming service.
struct WatchMethod(Arc<WatchService>);

impl tonic::server::StreamingService<PbWatchRequest> for WatchMethod {
    type Response = PbWatchResponse;
    type ResponseStream = <WatchService as PbWatchService>::WatchStream;
    type Future = tonic::codegen::BoxFuture<Response<Self::ResponseStream>, Status>;

    fn call(&mut self, req: Request<Streaming<PbWatchRequest>>) -> Self::Future {
        let inner = Arc::clone(&self.0);
        Box::pin(async move { <WatchService as PbWatchService>::watch(&inner, req).await })
    }
}

impl<B> tower::Service<tonic::codegen::http::Request<B>> for WatchServer
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = tonic::codegen::http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = tonic::codegen::BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: tonic::codegen::http::Request<B>) -> Self::Future {
        let method = (req.uri().path() == "/etcdserverpb.Watch/Watch")
            .then(|| WatchMethod(Arc::clone(&self.inner)));
        let max = self.max_encoding_message_size;
        Box::pin(async move {
            Ok(match method {
                Some(method) => {
                    let mut grpc = tonic::server::Grpc::new(LeanCodec)
                        .apply_max_message_size_config(None, Some(max));
                    grpc.streaming(method, req).await
                }
                None => Status::unimplemented("").into_http(),
            })
        })
    }
}

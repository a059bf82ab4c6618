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
/// Responses a stream queues (`pending`) before it stops taking etcd's
/// answers and the client's requests: a client that stops reading then
/// holds back etcd (its watch stream's flow control), not the front's
/// memory. One step adds at most one response, or one batch when empty.
const MAX_PENDING: usize = 16;

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
        let stream = ClientStream::new(Arc::clone(&self.front), md, tx);
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
    /// The highest revision the client was already told about for this
    /// watch before the ring served it (etcd's events of a handed-over
    /// watch): progress notifications never go back behind it.
    notified_rev: i64,
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
    /// A progress answer's catch-up took too long.
    CatchUpExpired,
}

/// A creation etcd has not answered yet.
struct AwaitingCreated {
    id: i64,
    /// `next_id` before an auto-assigned `id`: etcd refusing the creation
    /// gives it back, as etcd assigns an id only to a watch it creates.
    prev_next_id: Option<i64>,
}

/// A progress request not answered yet.
struct PendingProgress {
    /// Forwarded watches exist: etcd was asked too; its revision once answered.
    upstream: Option<Option<i64>>,
    /// The client's request, to ask etcd again.
    request: PbWatchRequest,
    /// The revision the cached watches wait for before the answer.
    catch_up: Option<CatchUp>,
}

/// etcd answers a progress request with its current revision; cached
/// watches wait (bounded) for their caches to get there, so the answer is
/// not behind etcd's (kube-apiserver's consistent reads wait for that).
#[derive(Debug, Clone, Copy)]
struct CatchUp {
    /// etcd's revision when the request came.
    revision: i64,
    /// After this, the answer is the revision the caches reached.
    deadline: Instant,
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
    /// Forwarded watches the client canceled, until etcd's `canceled`:
    /// etcd's answers in flight for them are dropped (the client asked for
    /// no more), its `canceled` passed on once.
    canceling: HashSet<i64>,
    upstream: Option<UpstreamWatch>,
    next_id: i64,
    progress: Option<PendingProgress>,
    /// A creation forwarded to etcd and not answered yet: later requests
    /// wait, so `created` answers keep the order of the requests (clients
    /// such as clientv3 match them in order).
    awaiting_created: Option<AwaitingCreated>,
    /// The forwarded watch whose fragmented response is partly queued:
    /// until its last fragment nothing else is queued, as clientv3 drops a
    /// response for another watch while it assembles one, and discards the
    /// fragments it has on a `created` or `canceled`.
    open_fragment: Option<i64>,
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
    fn new(
        front: Arc<Front>,
        md: MetadataMap,
        out: mpsc::Sender<Result<PbWatchResponse, Status>>,
    ) -> ClientStream {
        ClientStream {
            front,
            md,
            out,
            pending: VecDeque::new(),
            watches: Vec::new(),
            rr: 0,
            forwarded: HashMap::new(),
            handing_over: HashSet::new(),
            canceling: HashSet::new(),
            upstream: None,
            next_id: 0,
            progress: None,
            awaiting_created: None,
            open_fragment: None,
            max_sent: 0,
        }
    }

    async fn run<S>(mut self, mut requests: S)
    where
        S: futures::Stream<Item = Result<PbWatchRequest, Status>> + Unpin,
    {
        let mut changes = self.front.changes.subscribe();
        // Checked ten times per interval, so a notification is late by a
        // tenth of it at most.
        let every = self.front.progress_notify_interval;
        let mut notify_tick = tokio::time::interval((every / 10).max(Duration::from_millis(1)));
        // Like etcd, a client that closes its side still gets its events
        // until it goes away.
        let mut requests_open = true;
        loop {
            // Mid-fragment nothing else is queued (see `open_fragment`):
            // cached events stay in the ring, requests unread, progress
            // pending; etcd's fragments are still taken while there is
            // room, and the client's reading makes room.
            let held = self.open_fragment.is_some();
            if !held
                && self.pending.is_empty()
                && !self.next_events()
                && let Some(again) = self.answer_progress()
                && let Err(status) = self.send_upstream(again).await
            {
                let _ = self.out.send(Err(status)).await;
                return;
            }
            let has_out = !self.pending.is_empty();
            // Full: only the client's reading (which drains `pending`) and
            // what adds nothing to it go on; etcd and the client wait.
            let room = self.pending.len() < MAX_PENDING;
            let catch_up_deadline = self
                .progress
                .as_ref()
                .and_then(|p| p.catch_up)
                .map(|c| c.deadline);
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
                req = requests.next(), if room && !held && requests_open && self.awaiting_created.is_none() => match req {
                    Some(Ok(r)) => Step::Request(r),
                    None => Step::RequestsEnded,
                    Some(Err(_)) => Step::End, // the client broke the stream
                },
                _ = self.out.closed() => Step::End, // the client is gone
                up = recv_upstream(&mut self.upstream), if room => Step::Upstream(up),
                _ = changes.changed() => Step::Continue,
                _ = notify_tick.tick() => Step::Tick,
                _ = sleep_until_some(catch_up_deadline) => Step::CatchUpExpired,
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
                Step::Upstream(None) => {
                    self.upstream = None;
                    if held {
                        // The rest of the response never comes: the client
                        // cannot complete it, and resumes after an error.
                        let status = Status::unavailable("etcd's watch stream ended mid-fragment");
                        let _ = self.out.send(Err(status)).await;
                        return;
                    }
                }
                Step::Tick if held => {} // due again at the next tick
                Step::Tick => self.progress_notify(),
                Step::CatchUpExpired => {
                    if let Some(p) = &mut self.progress {
                        p.catch_up = None;
                    }
                }
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
                if c.key.is_empty() {
                    c.key = vec![0]; // etcd: the smallest key
                }
                // Checked before an id is assigned, as etcd's
                // `watchStream.Watch` does: a refused creation uses none.
                if !matches!(c.range_end.as_slice(), [] | [0]) && c.key >= c.range_end {
                    self.failed_create("mvcc: watcher range is empty");
                    return Ok(());
                }
                let mut prev_next_id = None;
                let id = if c.watch_id != 0 {
                    if self.id_in_use(c.watch_id) {
                        self.failed_create("mvcc: duplicate watch ID provided on the WatchStream");
                        return Ok(());
                    }
                    c.watch_id
                } else {
                    prev_next_id = Some(self.next_id);
                    while self.id_in_use(self.next_id) {
                        self.next_id += 1;
                    }
                    self.next_id += 1;
                    self.next_id - 1
                };
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
                self.awaiting_created = Some(AwaitingCreated { id, prev_next_id });
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
                } else if let Some(spec) = self.forwarded.get_mut(&c.watch_id) {
                    // No handover once the client canceled: an event
                    // answer in flight would bring the watch back.
                    *spec = None;
                    if !self.canceling.insert(c.watch_id) {
                        return Ok(()); // asked already; etcd answers once
                    }
                    self.send_upstream(PbWatchRequest {
                        request_union: Some(PbWatchRequestUnion::CancelRequest(c)),
                    })
                    .await
                } else {
                    Ok(()) // etcd ignores an unknown id
                }
            }
            Some(PbWatchRequestUnion::ProgressRequest(p)) => {
                // etcd's `progressIfSync` over no watchers sends nothing.
                let canceled_all = self.forwarded.keys().all(|id| self.canceling.contains(id));
                if self.watches.is_empty() && canceled_all {
                    return Ok(());
                }
                let request = PbWatchRequest {
                    request_union: Some(PbWatchRequestUnion::ProgressRequest(p)),
                };
                let upstream = if self.forwarded.is_empty() {
                    None
                } else {
                    self.send_upstream(request.clone()).await?;
                    Some(None)
                };
                let catch_up = self.catch_up().await;
                // A second request before the first is answered is answered
                // with it (etcd, asked again, may answer now: it ignores a
                // request while one of its watches catches up), at etcd's
                // revision at the later one, by the first one's deadline.
                match &mut self.progress {
                    Some(pp) => {
                        if !matches!(pp.upstream, Some(Some(_))) {
                            pp.upstream = upstream;
                        }
                        if let Some(new) = catch_up {
                            pp.catch_up = Some(match pp.catch_up {
                                Some(old) => CatchUp {
                                    revision: old.revision.max(new.revision),
                                    ..old
                                },
                                None => new,
                            });
                        }
                    }
                    None => {
                        self.progress = Some(PendingProgress {
                            upstream,
                            request,
                            catch_up,
                        })
                    }
                }
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// What the cached watches of a progress request wait for: etcd's
    /// current revision, each of their caches asked for progress so an
    /// idle prefix gets there too. `None` without cached watches, or when
    /// etcd's revision is not known in time (the answer is then what the
    /// caches reached, as before).
    async fn catch_up(&self) -> Option<CatchUp> {
        if self.watches.is_empty() {
            return None;
        }
        let timeout = self.front.consistent_read_timeout;
        let deadline = Instant::now() + timeout;
        let revision = tokio::time::timeout(timeout, self.front.storage.fresh_revision())
            .await
            .ok()?
            .ok()?;
        let mut asked: Vec<&Arc<KvCache>> = Vec::new();
        for w in &self.watches {
            if w.cache.revision() < revision && !asked.iter().any(|c| Arc::ptr_eq(c, &w.cache)) {
                w.cache.request_progress();
                asked.push(&w.cache);
            }
        }
        Some(CatchUp { revision, deadline })
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
            notified_rev: 0,
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
        if self.canceling.contains(&resp.watch_id) {
            if !resp.canceled {
                return None;
            }
            self.canceling.remove(&resp.watch_id);
        }
        let is_progress = resp.watch_id == INVALID_WATCH_ID
            && resp.events.is_empty()
            && !resp.created
            && !resp.canceled;
        if is_progress {
            // Never passed on: etcd's revision says nothing of the cached
            // watches. Kept only for the answer being assembled (a second
            // answer to requests sent back to back is dropped).
            if let Some(PendingProgress {
                upstream: Some(rev @ None),
                ..
            }) = &mut self.progress
            {
                *rev = Some(resp.header.as_ref().map(|h| h.revision).unwrap_or(0));
            }
            return None;
        }
        for e in &resp.events {
            if let Some(kv) = &e.kv {
                self.max_sent = self.max_sent.max(kv.mod_revision);
            }
        }
        if resp.created
            && let Some(AwaitingCreated { id, prev_next_id }) = self.awaiting_created.take()
            && resp.watch_id != id
        {
            // etcd refused it (id -1) or chose another id (our 0 = "auto").
            let spec = self.forwarded.remove(&id).flatten();
            if resp.canceled {
                count_watch(&self.front, "etcd", -1);
                if let Some(n) = prev_next_id {
                    self.next_id = n;
                }
            } else {
                self.forwarded.insert(resp.watch_id, spec);
            }
        }
        if resp.canceled && self.forwarded.remove(&resp.watch_id).is_some() {
            count_watch(&self.front, "etcd", -1);
        }
        let handover = self.handover_point(&resp);
        if resp.fragment {
            self.open_fragment = Some(resp.watch_id);
        } else if self.open_fragment == Some(resp.watch_id) {
            self.open_fragment = None; // its last fragment
        }
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
        self.watches.push(CachedWatch {
            notified_rev: from - 1,
            ..w
        });
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
                            // etcd's compaction cancel has no reason, only
                            // `compact_revision` (clientv3 reads that).
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
    /// date, at etcd's revision of the request (see [`CatchUp`]), and etcd
    /// answered for the forwarded ones: the revision is the
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
        if let (Some(c), Some(t)) = (cached, p.catch_up)
            && c < t.revision
        {
            return None; // the caches are catching up (`CatchUpExpired` ends it)
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
    /// that are up to date and sent nothing for the interval. At most what
    /// fits in `pending`: the others are due at a later tick.
    fn progress_notify(&mut self) {
        let now = Instant::now();
        let every = self.front.progress_notify_interval;
        let room = MAX_PENDING.saturating_sub(self.pending.len());
        let mut out = Vec::new();
        for w in &mut self.watches {
            if out.len() >= room {
                break;
            }
            if !w.progress_notify || now.duration_since(w.last_sent) < every {
                continue;
            }
            if let Read::UpToDate { revision } = w.cache.read(w.cursor, 1, 0)
                && revision >= w.notified_rev
            {
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

/// Sleeps until `deadline`; never without one.
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicI64;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::config::EtcdConfig;
    use crate::grpc::auth::AuthGate;
    use crate::grpc::kv_cache::HeaderSource;
    use crate::grpc::upstream::Upstream;
    use crate::storage::Storage;

    /// A client stream of a front with one ready cache of `/c/` at
    /// revision 10, its etcd stream replaced by channels the test holds.
    struct Harness {
        stream: ClientStream,
        cache: Arc<KvCache>,
        /// What the client receives.
        out: mpsc::Receiver<Result<PbWatchResponse, Status>>,
        /// What the stream asks etcd.
        to_etcd: mpsc::Receiver<PbWatchRequest>,
        /// etcd's answers; holds `etcd_buffer` of them.
        from_etcd: mpsc::Sender<Result<PbWatchResponse, Status>>,
    }

    async fn harness(etcd_buffer: usize, notify_every: Duration) -> Harness {
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

    fn spec(key: &str, start_revision: i64) -> CreateSpec {
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

    fn put(key: &str, value: Vec<u8>, rev: i64) -> PbEvent {
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
    fn event_answer(id: i64, key: &str, rev: i64) -> PbWatchResponse {
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

    fn progress_answer(rev: i64) -> PbWatchResponse {
        PbWatchResponse {
            header: Some(PbResponseHeader {
                revision: rev,
                ..Default::default()
            }),
            watch_id: INVALID_WATCH_ID,
            ..Default::default()
        }
    }

    fn request(r: PbWatchRequestUnion) -> PbWatchRequest {
        PbWatchRequest {
            request_union: Some(r),
        }
    }

    fn cancel(id: i64) -> PbWatchRequest {
        let mut c = PbWatchRequestUnion::CancelRequest(Default::default());
        if let PbWatchRequestUnion::CancelRequest(r) = &mut c {
            r.watch_id = id;
        }
        request(c)
    }

    fn progress_request() -> PbWatchRequest {
        request(PbWatchRequestUnion::ProgressRequest(Default::default()))
    }

    fn create(key: &str) -> PbWatchRequest {
        let mut c = PbWatchRequestUnion::CreateRequest(Default::default());
        if let PbWatchRequestUnion::CreateRequest(r) = &mut c {
            r.key = key.as_bytes().to_vec();
        }
        request(c)
    }

    /// With the clock paused, a sleep ends only once every task waits: the
    /// stream took all it will take.
    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_holds_back_etcd() {
        const N: usize = 100;
        let mut h = harness(2 * N, Duration::from_secs(600)).await;
        let (client, requests) = mpsc::channel(8);
        let from_etcd = h.from_etcd.clone();
        tokio::spawn(h.stream.run(ReceiverStream::new(requests).map(Ok)));
        client.send(create("/x/a")).await.expect("stream runs");
        let asked = h.to_etcd.recv().await.expect("creation sent to etcd");
        assert!(matches!(
            asked.request_union,
            Some(PbWatchRequestUnion::CreateRequest(_))
        ));
        let created = PbWatchResponse {
            watch_id: 0,
            created: true,
            ..Default::default()
        };
        from_etcd.send(Ok(created)).await.expect("stream runs");
        let got = h.out.recv().await.expect("created").expect("ok");
        assert!(got.created);
        // etcd has N large answers ready; the client reads nothing.
        for i in 0..N {
            let mut r = event_answer(0, "/x/a", 11 + i as i64);
            r.events[0].kv.as_mut().expect("kv").value = vec![b'x'; 64 * 1024];
            from_etcd.try_send(Ok(r)).expect("room for every answer");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let taken = N - (2 * N - from_etcd.capacity());
        assert!(
            taken <= MAX_PENDING + OUT_BUFFER,
            "took {taken} of etcd's answers for a client that reads nothing"
        );
        // Reading again takes the rest, in order.
        for i in 0..N {
            let r = tokio::time::timeout(Duration::from_secs(60), h.out.recv())
                .await
                .expect("no deadlock")
                .expect("stream open")
                .expect("ok");
            let rev = r.events[0].kv.as_ref().map(|kv| kv.mod_revision);
            assert_eq!(rev, Some(11 + i as i64));
        }
    }

    #[tokio::test]
    async fn a_second_progress_answer_from_etcd_is_not_passed_on() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        // A cached watch behind the cache (an event at 11 not read yet)
        // and a forwarded one.
        let w = s.place(1, spec("/c/a", 0)).expect("cached watch");
        s.watches.push(w);
        s.forwarded.insert(2, None);
        h.cache.apply(vec![put("/c/a", b"1".to_vec(), 11)], 11);
        // Two requests back to back: etcd is asked (and answers) twice.
        s.handle(progress_request()).await.expect("handled");
        s.handle(progress_request()).await.expect("handled");
        for _ in 0..2 {
            assert!(matches!(
                h.to_etcd.try_recv().map(|r| r.request_union),
                Ok(Some(PbWatchRequestUnion::ProgressRequest(_)))
            ));
        }
        assert!(s.on_upstream(progress_answer(20)).is_none());
        assert!(s.on_upstream(progress_answer(20)).is_none());
        assert!(s.pending.is_empty(), "etcd's answers are not passed on");
        // The answer: after the event, at the cached watch's revision.
        assert!(s.next_events());
        assert!(!s.next_events());
        assert!(s.answer_progress().is_none());
        let revs: Vec<(usize, i64)> = s
            .pending
            .iter()
            .map(|r| (r.events.len(), r.header.as_ref().map_or(0, |h| h.revision)))
            .collect();
        assert_eq!(revs, vec![(1, 11), (0, 11)]);
        assert!(s.progress.is_none());
    }

    /// A progress request that found etcd at `revision`.
    fn pending_progress(revision: i64, wait: Duration) -> PendingProgress {
        PendingProgress {
            upstream: None,
            request: progress_request(),
            catch_up: Some(CatchUp {
                revision,
                deadline: Instant::now() + wait,
            }),
        }
    }

    fn answered(s: &ClientStream) -> Vec<i64> {
        s.pending
            .iter()
            .filter(|r| r.watch_id == INVALID_WATCH_ID)
            .map(|r| r.header.as_ref().map_or(0, |h| h.revision))
            .collect()
    }

    #[tokio::test]
    async fn progress_waits_for_the_caches_to_reach_etcds_revision() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        let w = s.place(1, spec("/c/a", 0)).expect("cached watch");
        s.watches.push(w);
        // etcd was at 20 when the client asked; the idle cache is at 10.
        s.progress = Some(pending_progress(20, Duration::from_secs(600)));
        assert!(!s.next_events());
        assert!(s.answer_progress().is_none());
        assert!(answered(s).is_empty(), "not answered behind etcd's 20");
        // The cache's progress from etcd.
        h.cache.apply(Vec::new(), 21);
        assert!(!s.next_events());
        assert!(s.answer_progress().is_none());
        assert_eq!(answered(s), [21]);
        assert!(s.progress.is_none());
    }

    /// A cache that does not catch up in time delays the answer, bounded:
    /// then it is what the cache reached.
    #[tokio::test(start_paused = true)]
    async fn progress_waits_for_the_caches_only_until_the_deadline() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let quiet = CreateSpec {
            progress_notify: false,
            ..spec("/c/a", 0)
        };
        let w = h.stream.place(1, quiet).expect("cached watch");
        h.stream.watches.push(w);
        h.stream.progress = Some(pending_progress(20, Duration::from_secs(3)));
        let asked = Instant::now();
        let (_client, requests) = mpsc::channel::<PbWatchRequest>(1);
        tokio::spawn(h.stream.run(ReceiverStream::new(requests).map(Ok)));
        let got = tokio::time::timeout(Duration::from_secs(3600), h.out.recv())
            .await
            .expect("answered")
            .expect("stream open")
            .expect("ok");
        assert_eq!(got.watch_id, INVALID_WATCH_ID);
        assert_eq!(got.header.map(|h| h.revision), Some(10));
        assert!(
            asked.elapsed() >= Duration::from_secs(3),
            "after the deadline"
        );
    }

    #[tokio::test]
    async fn a_canceled_forwarded_watch_is_not_handed_over() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        // A forwarded watch catching up over the cached range.
        h.cache.apply(vec![put("/c/a", b"1".to_vec(), 11)], 12);
        s.forwarded.insert(5, Some(spec("/c/a", 11)));
        s.handle(cancel(5)).await.expect("handled");
        s.handle(cancel(5)).await.expect("handled");
        assert!(matches!(
            h.to_etcd.try_recv().map(|r| r.request_union),
            Ok(Some(PbWatchRequestUnion::CancelRequest(c))) if c.watch_id == 5
        ));
        assert!(h.to_etcd.try_recv().is_err(), "etcd is asked once");
        // etcd's event in flight reaches the ring: no handover, not passed on.
        assert!(s.on_upstream(event_answer(5, "/c/a", 11)).is_none());
        assert!(s.watches.is_empty(), "not resurrected as a cached watch");
        assert!(s.pending.is_empty(), "no events after the cancel");
        // etcd's `canceled`, once.
        let canceled = PbWatchResponse {
            watch_id: 5,
            canceled: true,
            ..Default::default()
        };
        assert!(s.on_upstream(canceled).is_none());
        let got: Vec<(i64, bool)> = s.pending.iter().map(|r| (r.watch_id, r.canceled)).collect();
        assert_eq!(got, vec![(5, true)]);
        assert!(s.forwarded.is_empty() && s.canceling.is_empty());
    }

    #[tokio::test]
    async fn progress_notify_never_goes_behind_a_handed_over_watch() {
        let mut h = harness(8, Duration::ZERO).await;
        let s = &mut h.stream;
        s.forwarded.insert(5, Some(spec("/c/a", 5)));
        // etcd, ahead of the cache (at 10), sent the event at 15.
        let cancel = s.on_upstream(event_answer(5, "/c/a", 15));
        assert!(cancel.is_some(), "handed over to the ring");
        assert_eq!(s.watches.len(), 1);
        s.pending.clear();
        s.progress_notify();
        assert!(s.pending.is_empty(), "10 would go back behind 15");
        h.cache.apply(Vec::new(), 16);
        s.progress_notify();
        let got: Vec<(i64, i64)> = s
            .pending
            .iter()
            .map(|r| (r.watch_id, r.header.as_ref().map_or(0, |h| h.revision)))
            .collect();
        assert_eq!(got, vec![(5, 16)]);
    }

    /// A creation of `key` from `start_revision`, ids auto-assigned.
    fn create_from(key: &str, range_end: &str, start_revision: i64) -> PbWatchRequest {
        let mut c = PbWatchRequestUnion::CreateRequest(Default::default());
        if let PbWatchRequestUnion::CreateRequest(r) = &mut c {
            r.key = key.as_bytes().to_vec();
            r.range_end = range_end.as_bytes().to_vec();
            r.start_revision = start_revision;
        }
        request(c)
    }

    /// Fragment `n` of etcd's response for watch 5 at revision 20.
    fn fragment(n: usize, last: bool) -> PbWatchResponse {
        PbWatchResponse {
            fragment: !last,
            ..event_answer(5, &format!("/x/{n}"), 20)
        }
    }

    /// Lets the spawned stream take all it will (the clock is paused).
    async fn settle() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    async fn next_out(
        out: &mut mpsc::Receiver<Result<PbWatchResponse, Status>>,
    ) -> PbWatchResponse {
        tokio::time::timeout(Duration::from_secs(3600), out.recv())
            .await
            .expect("an answer")
            .expect("stream open")
            .expect("ok")
    }

    /// clientv3 drops a response for another watch (or its partial
    /// fragments, on a `canceled`) while assembling a fragmented one: a
    /// cached event and a `canceled` that become due between etcd's
    /// fragments wait for the last one.
    #[tokio::test(start_paused = true)]
    async fn a_fragmented_upstream_response_reaches_the_client_whole() {
        let mut h = harness(8, Duration::from_secs(1_000_000)).await;
        for (id, key) in [(1, "/c/a"), (3, "/c/z")] {
            let w = h.stream.place(id, spec(key, 11)).expect("cached watch");
            h.stream.watches.push(w);
        }
        h.stream.forwarded.insert(5, None);
        let (client, requests) = mpsc::channel(8);
        tokio::spawn(h.stream.run(ReceiverStream::new(requests).map(Ok)));
        h.from_etcd
            .send(Ok(fragment(0, false)))
            .await
            .expect("runs");
        settle().await;
        h.cache.apply(vec![put("/c/a", b"1".to_vec(), 11)], 11);
        settle().await;
        client.send(cancel(3)).await.expect("runs");
        settle().await;
        h.from_etcd
            .send(Ok(fragment(1, false)))
            .await
            .expect("runs");
        settle().await;
        h.from_etcd.send(Ok(fragment(2, true))).await.expect("runs");
        let mut got = Vec::new();
        for _ in 0..5 {
            let r = next_out(&mut h.out).await;
            got.push((r.watch_id, r.fragment, r.canceled, r.events.len()));
        }
        assert_eq!(
            got[..3],
            [
                (5, true, false, 1),
                (5, true, false, 1),
                (5, false, false, 1)
            ],
            "the fragments back to back: {got:?}"
        );
        got[3..].sort();
        assert_eq!(got[3..], [(1, false, false, 1), (3, false, true, 0)]);
    }

    /// A fragmented response etcd never finishes holds nothing back forever:
    /// the client gets an error (and resumes its watches).
    #[tokio::test(start_paused = true)]
    async fn etcds_stream_ending_mid_fragment_ends_the_client_stream() {
        let Harness {
            mut stream,
            cache,
            mut out,
            to_etcd: _to_etcd,
            from_etcd,
        } = harness(8, Duration::from_secs(1_000_000)).await;
        let w = stream.place(1, spec("/c/a", 11)).expect("cached watch");
        stream.watches.push(w);
        stream.forwarded.insert(5, None);
        let (_client, requests) = mpsc::channel::<PbWatchRequest>(1);
        tokio::spawn(stream.run(ReceiverStream::new(requests).map(Ok)));
        from_etcd.send(Ok(fragment(0, false))).await.expect("runs");
        settle().await;
        drop(from_etcd);
        cache.apply(vec![put("/c/a", b"1".to_vec(), 11)], 11);
        assert!(next_out(&mut out).await.fragment);
        let end = tokio::time::timeout(Duration::from_secs(3600), out.recv())
            .await
            .expect("not held forever")
            .expect("stream open");
        assert!(end.is_err(), "an error, not the cached event: {end:?}");
    }

    /// etcd's compaction cancel (`syncWatchers` -> `sendLoop`) carries
    /// `compact_revision` and no `cancel_reason`.
    #[tokio::test]
    async fn a_watch_the_ring_overran_is_canceled_as_etcd_cancels_it() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        let w = s.place(1, spec("/c/a", 11)).expect("cached watch");
        s.watches.push(w);
        let events = (11..=210)
            .map(|rev| put("/c/a", b"v".to_vec(), rev))
            .collect();
        h.cache.apply(events, 210);
        assert!(s.next_events());
        let got: Vec<(i64, bool, i64, &str)> = s
            .pending
            .iter()
            .map(|r| {
                (
                    r.watch_id,
                    r.canceled,
                    r.compact_revision,
                    r.cancel_reason.as_str(),
                )
            })
            .collect();
        assert_eq!(got, vec![(1, true, 111, "")]);
    }

    /// etcd's `progressIfSync` over no watchers sends nothing; a watch the
    /// client canceled does not count.
    #[tokio::test]
    async fn a_progress_request_without_watches_is_not_answered() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        s.handle(progress_request()).await.expect("handled");
        s.forwarded.insert(5, None);
        s.canceling.insert(5);
        s.handle(progress_request()).await.expect("handled");
        assert!(!s.next_events());
        assert!(s.answer_progress().is_none());
        assert!(s.pending.is_empty(), "no answer");
        assert!(s.progress.is_none());
        assert!(h.to_etcd.try_recv().is_err(), "etcd is not asked");
    }

    /// The id of the creation the stream sent etcd last.
    fn sent_create_id(to_etcd: &mut mpsc::Receiver<PbWatchRequest>) -> Option<i64> {
        match to_etcd.try_recv().ok()?.request_union? {
            PbWatchRequestUnion::CreateRequest(c) => Some(c.watch_id),
            _ => None,
        }
    }

    /// etcd checks the range before it assigns an id: a refused creation
    /// does not use one up.
    #[tokio::test]
    async fn an_empty_range_uses_up_no_watch_id() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        s.handle(create_from("/x/b", "/x/a", 0))
            .await
            .expect("handled");
        let got: Vec<(i64, bool, bool)> = s
            .pending
            .iter()
            .map(|r| (r.watch_id, r.created, r.canceled))
            .collect();
        assert_eq!(got, vec![(-1, true, true)]);
        s.handle(create_from("/x/a", "", 0)).await.expect("handled");
        assert_eq!(sent_create_id(&mut h.to_etcd), Some(0));
        assert_eq!(s.awaiting_created.as_ref().map(|a| a.id), Some(0));
    }

    /// A forwarded creation etcd refuses (its auth, say) gives its
    /// auto-assigned id back.
    #[tokio::test]
    async fn a_creation_etcd_refuses_uses_up_no_watch_id() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        s.handle(create_from("/x/a", "", 0)).await.expect("handled");
        assert_eq!(sent_create_id(&mut h.to_etcd), Some(0));
        let created = PbWatchResponse {
            watch_id: 0,
            created: true,
            ..Default::default()
        };
        assert!(s.on_upstream(created).is_none());
        s.handle(create_from("/x/b", "", 0)).await.expect("handled");
        assert_eq!(sent_create_id(&mut h.to_etcd), Some(1));
        let refused = PbWatchResponse {
            watch_id: INVALID_WATCH_ID,
            created: true,
            canceled: true,
            cancel_reason: "etcdserver: permission denied".to_string(),
            ..Default::default()
        };
        assert!(s.on_upstream(refused).is_none());
        s.handle(create_from("/x/c", "", 0)).await.expect("handled");
        assert_eq!(sent_create_id(&mut h.to_etcd), Some(1), "1 again");
        assert_eq!(
            s.forwarded.keys().copied().collect::<HashSet<_>>(),
            HashSet::from([0, 1])
        );
    }
}

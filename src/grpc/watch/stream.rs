//! One client stream: the task that owns its state (`state`) (a loop over what
//! comes first: the client's reading, its requests, etcd's answers, cache
//! changes, ticks), and the client's requests, a creation routed to a cache
//! or to etcd. The other files of `watch` add the rest of `ClientStream`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::time::{Instant, Interval};
use tonic::Status;
use tonic::metadata::MetadataMap;

use etcd_client::proto::*;

use super::forwarded::recv_upstream;
use super::state::{ClientStream, CreateSpec, Pending, Rechecked};
use super::{Front, INVALID_WATCH_ID, MAX_PENDING, MAX_PENDING_BYTES, count_watch};
use crate::grpc::kv::Compaction;

impl Drop for ClientStream {
    fn drop(&mut self) {
        count_watch(&self.front, "cache", -(self.watches.len() as i64));
        count_watch(&self.front, "etcd", -(self.forwarded.len() as i64));
    }
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
    /// etcd's revision for a progress request (`None`: not in time).
    Revision(Option<i64>),
    /// Time to ask etcd for progress (`ask_progress_later`).
    AskProgress,
    /// A re-check of a forwarded creation's start answered.
    Rechecked(Rechecked),
}

/// Why a client stream's task ends: the client or the front went away, or
/// with an error the client is sent last.
enum End {
    Quietly,
    With(Status),
}

impl From<Status> for End {
    fn from(status: Status) -> End {
        End::With(status)
    }
}

/// What a client stream's task waits on besides its own state; kept
/// across turns (the tick's schedule, the last change seen).
struct Inputs<S> {
    requests: S,
    /// Like etcd, a client that closes its side still gets its events
    /// until it goes away.
    requests_open: bool,
    changes: tokio::sync::watch::Receiver<u64>,
    /// Checked ten times per interval, so a notification is late by a
    /// tenth of it at most.
    notify_tick: Interval,
}

impl ClientStream {
    pub(super) fn new(
        front: Arc<Front>,
        md: MetadataMap,
        out: mpsc::Sender<Result<PbWatchResponse, Status>>,
    ) -> ClientStream {
        let (rechecks, rechecked) = mpsc::channel(8);
        ClientStream {
            front,
            md,
            out,
            pending: Pending::default(),
            watches: Vec::new(),
            rr: 0,
            forwarded: HashMap::new(),
            creations_sent: 0,
            progress_asked: VecDeque::new(),
            ask_progress_at: None,
            handing_over: HashSet::new(),
            canceling: HashSet::new(),
            upstream: None,
            next_id: 0,
            progress: None,
            revision_fetch: None,
            awaiting_created: None,
            open_fragment: None,
            max_sent: 0,
            rechecks,
            rechecked,
            compacted_found: Vec::new(),
        }
    }

    /// The stream's task: turns until the client, etcd or the front ends it.
    pub(super) async fn run<S>(mut self, requests: S)
    where
        S: futures::Stream<Item = Result<PbWatchRequest, Status>> + Unpin,
    {
        let every = self.front.progress_notify_interval;
        let mut inputs = Inputs {
            requests,
            requests_open: true,
            changes: self.front.changes.subscribe(),
            notify_tick: tokio::time::interval((every / 10).max(Duration::from_millis(1))),
        };
        loop {
            if let Err(end) = self.turn(&mut inputs).await {
                if let End::With(status) = end {
                    let _ = self.out.send(Err(status)).await;
                }
                return;
            }
        }
    }

    /// One turn: queue what is due when nothing is, wait for what comes
    /// first, handle it.
    async fn turn<S>(&mut self, inputs: &mut Inputs<S>) -> Result<(), End>
    where
        S: futures::Stream<Item = Result<PbWatchRequest, Status>> + Unpin,
    {
        // Mid-fragment nothing else is queued (see `open_fragment`):
        // cached events stay in the ring, requests unread, progress
        // pending; etcd's fragments are still taken while there is
        // room, and the client's reading makes room.
        let held = self.open_fragment.is_some();
        if !held {
            for cancel in self.answer_found_compacted() {
                self.send_upstream(cancel).await?;
            }
        }
        if !held
            && self.pending.is_empty()
            && !self.next_events()
            && let Some(again) = self.answer_progress()
        {
            self.send_upstream(again).await?;
        }
        let step = self.next_step(inputs, held).await;
        self.on_step(step, inputs, held).await
    }

    /// Whether the stream takes more than the client's reading drains.
    pub(super) fn has_room(&self) -> bool {
        self.pending.len() < MAX_PENDING && self.pending.bytes() < MAX_PENDING_BYTES
    }

    /// Waits for what comes first. Full (`has_room`): only the client's
    /// reading (which drains `pending`) and what adds nothing to it go on;
    /// etcd and the client wait.
    async fn next_step<S>(&mut self, inputs: &mut Inputs<S>, held: bool) -> Step
    where
        S: futures::Stream<Item = Result<PbWatchRequest, Status>> + Unpin,
    {
        let has_out = !self.pending.is_empty();
        let room = self.has_room();
        let catch_up_deadline = self
            .progress
            .as_ref()
            .and_then(|p| p.catch_up)
            .map(|c| c.deadline);
        let takes_requests =
            room && !held && inputs.requests_open && self.awaiting_created.is_none();
        // The select only borrows fields; the step is handled after it.
        tokio::select! {
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
            req = inputs.requests.next(), if takes_requests => match req {
                Some(Ok(r)) => Step::Request(r),
                None => Step::RequestsEnded,
                Some(Err(_)) => Step::End, // the client broke the stream
            },
            _ = self.out.closed() => Step::End, // the client is gone
            up = recv_upstream(&mut self.upstream), if room => Step::Upstream(up),
            _ = inputs.changes.changed() => Step::Continue,
            _ = inputs.notify_tick.tick() => Step::Tick,
            _ = sleep_until_some(catch_up_deadline) => Step::CatchUpExpired,
            rev = recv_revision(&mut self.revision_fetch) => Step::Revision(rev),
            _ = sleep_until_some(self.ask_progress_at) => Step::AskProgress,
            r = self.rechecked.recv() => r.map_or(Step::Continue, Step::Rechecked),
        }
    }

    /// Handles what woke the task; `Err` ends the stream.
    async fn on_step<S>(
        &mut self,
        step: Step,
        inputs: &mut Inputs<S>,
        held: bool,
    ) -> Result<(), End> {
        match step {
            Step::End => return Err(End::Quietly),
            Step::Continue => {}
            Step::RequestsEnded => inputs.requests_open = false,
            Step::Request(r) => self.handle(r).await?,
            Step::Upstream(Some(Ok(resp))) => {
                for cancel in self.on_upstream(resp) {
                    self.send_upstream(cancel).await?;
                }
            }
            Step::Upstream(Some(Err(status))) => return Err(End::With(status)),
            Step::Upstream(None) => {
                self.upstream = None;
                if held {
                    // The rest of the response never comes: the client
                    // cannot complete it, and resumes after an error.
                    let status = Status::unavailable("etcd's watch stream ended mid-fragment");
                    return Err(End::With(status));
                }
            }
            Step::Tick if held => {} // due again at the next tick
            Step::Tick => self.progress_notify(),
            Step::Revision(rev) => self.fetched_revision(rev),
            Step::AskProgress => self.ask_progress().await?,
            Step::Rechecked(r) => {
                for cancel in self.on_rechecked(r) {
                    self.send_upstream(cancel).await?;
                }
            }
            Step::CatchUpExpired => {
                if let Some(p) = &mut self.progress {
                    p.catch_up = None;
                }
            }
        }
        Ok(())
    }

    pub(super) fn header(&self, revision: i64) -> Option<PbResponseHeader> {
        Some(self.front.headers.header(revision))
    }

    fn id_in_use(&self, id: i64) -> bool {
        self.forwarded.contains_key(&id)
            || self.handing_over.contains(&id)
            || self.watches.iter().any(|w| w.id == id)
    }

    /// One request of the client. The request itself goes on to etcd when
    /// etcd serves it (a creation with the stream's id).
    pub(super) async fn handle(&mut self, mut req: PbWatchRequest) -> Result<(), Status> {
        match &mut req.request_union {
            Some(PbWatchRequestUnion::CreateRequest(c)) => {
                if c.key.is_empty() {
                    c.key = vec![0]; // etcd: the smallest key
                }
                let Some((id, prev_next_id)) = self.admit(&c.key, &c.range_end, c.watch_id) else {
                    return Ok(());
                };
                // If etcd serves it: same request, our id.
                c.watch_id = id;
                let spec = CreateSpec {
                    key: c.key.clone(),
                    range_end: c.range_end.clone(),
                    start_revision: c.start_revision,
                    prev_kv: c.prev_kv,
                    filters: c.filters.clone(),
                    fragment: c.fragment,
                    progress_notify: c.progress_notify,
                };
                self.create(id, prev_next_id, spec, req).await
            }
            Some(PbWatchRequestUnion::CancelRequest(c)) => {
                let id = c.watch_id;
                if self.cancel_cached(id) {
                    Ok(())
                } else {
                    self.cancel_forwarded(id, req).await
                }
            }
            Some(PbWatchRequestUnion::ProgressRequest(_)) => self.request_progress(req).await,
            None => Ok(()),
        }
    }

    /// A creation's id after etcd's checks, which come before it, as in
    /// etcd's `watchStream.Watch`: a refused creation is answered here and
    /// uses none. With `next_id` before an auto-assigned id, given back if
    /// etcd refuses the creation.
    fn admit(&mut self, key: &[u8], range_end: &[u8], watch_id: i64) -> Option<(i64, Option<i64>)> {
        if !matches!(range_end, [] | [0]) && key >= range_end {
            self.failed_create("mvcc: watcher range is empty");
            return None;
        }
        if watch_id != 0 {
            if self.id_in_use(watch_id) {
                self.failed_create("mvcc: duplicate watch ID provided on the WatchStream");
                return None;
            }
            return Some((watch_id, None));
        }
        let prev_next_id = self.next_id;
        while self.id_in_use(self.next_id) {
            self.next_id += 1;
        }
        self.next_id += 1;
        Some((self.next_id - 1, Some(prev_next_id)))
    }

    /// Serves a creation from a cache when one can, else forwards `req`
    /// (carrying `id`) to etcd.
    async fn create(
        &mut self,
        id: i64,
        prev_next_id: Option<i64>,
        mut spec: CreateSpec,
        req: PbWatchRequest,
    ) -> Result<(), Status> {
        let mut cache = self.front.cache_for(&spec.key, &spec.range_end).cloned();
        // With etcd's auth on, a caller etcd does not let read this
        // range is not served from the cache, nor answered by the front:
        // etcd gets the creation and answers it (its refusal) itself.
        let mut placeable = true;
        if (cache.is_some() || spec.start_revision > 0)
            && !self
                .front
                .auth
                .permits(&self.md, &spec.key, &spec.range_end)
                .await
        {
            cache = None;
            placeable = false;
        }
        // From a revision etcd compacted, etcd cancels the watch with its
        // compact_revision: the front answers so itself, whatever the ring
        // still holds, and whether or not the range is cached (a member
        // that froze between its `created` and its sync loop's cancel
        // would leave the client with neither events nor the cancel).
        // From the compaction revision itself, its events there have no
        // prev_kv (etcd reads it at the revision before): etcd serves it.
        let checked = spec.start_revision - i64::from(spec.prev_kv);
        let mut recheck = None;
        if placeable && spec.start_revision > 0 && checked > 0 {
            match self.front.compaction(&spec.key, checked, &self.md).await {
                Compaction::NotCompacted => {}
                Compaction::At {
                    compact_revision,
                    revision,
                } if spec.start_revision < compact_revision => {
                    self.answer_compacted(id, compact_revision, revision);
                    return Ok(());
                }
                Compaction::At { .. } => {
                    cache = None;
                    placeable = false;
                }
                Compaction::Unknown => {
                    // etcd serves it, and is asked again meanwhile (see
                    // `recheck_at_created`).
                    recheck = Some((spec.key.clone(), checked, spec.start_revision));
                    cache = None;
                    placeable = false;
                }
            }
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
            self.start_cached(w, created_at);
            return Ok(());
        }
        self.forward_create(id, prev_next_id, cacheable.then_some(spec), req)
            .await?;
        if let Some((key, checked, start_revision)) = recheck {
            self.recheck_at_created(id, key, checked, start_revision);
        }
        Ok(())
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
}

/// Sleeps until `deadline`; never without one.
/// The answer of the revision fetch in flight; never without one.
pub(super) async fn recv_revision(fetch: &mut Option<super::state::RevisionFetch>) -> Option<i64> {
    match fetch {
        Some(f) => (&mut f.rx).await.ok().flatten(),
        None => std::future::pending().await,
    }
}

async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use tokio_stream::wrappers::ReceiverStream;

    use super::*;
    use crate::grpc::watch::OUT_BUFFER;
    use crate::grpc::watch::test_support::*;

    /// etcd has `n` answers of one `value_len`-byte event ready for a
    /// forwarded watch whose client reads nothing: how many the stream took
    /// (with the clock paused, a sleep ends only once every task waits: the
    /// stream took all it will take). Reading again then takes the rest, in
    /// order.
    async fn taken_for_a_client_that_reads_nothing(n: usize, value_len: usize) -> usize {
        let mut h = harness(2 * n, Duration::from_secs(600)).await;
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
        for i in 0..n {
            let mut r = event_answer(0, "/x/a", 11 + i as i64);
            r.events[0].kv.as_mut().expect("kv").value = vec![b'x'; value_len];
            from_etcd.try_send(Ok(r)).expect("room for every answer");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let taken = n - (2 * n - from_etcd.capacity());
        for i in 0..n {
            let r = tokio::time::timeout(Duration::from_secs(60), h.out.recv())
                .await
                .expect("no deadlock")
                .expect("stream open")
                .expect("ok");
            let rev = r.events[0].kv.as_ref().map(|kv| kv.mod_revision);
            assert_eq!(rev, Some(11 + i as i64));
        }
        taken
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_holds_back_etcd() {
        let taken = taken_for_a_client_that_reads_nothing(100, 64 * 1024).await;
        assert!(
            taken <= MAX_PENDING + OUT_BUFFER,
            "took {taken} of etcd's answers for a client that reads nothing"
        );
    }

    /// Answers of half a MiB: the queue stops at its byte bound, long
    /// before its count (the soak's revisions of 1.2 MB, replayed to a
    /// dozen slow streams, took the daemon from 30 to 250 MB).
    #[tokio::test(start_paused = true)]
    async fn large_answers_are_held_back_by_their_bytes() {
        let taken = taken_for_a_client_that_reads_nothing(40, 512 * 1024).await;
        assert!(
            taken <= OUT_BUFFER + 3,
            "took {taken} answers of 512 KiB for a client that reads nothing"
        );
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
}

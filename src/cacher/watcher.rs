//! `Watcher`: a cursor into the [`History`](super::History) (docs/DESIGN.md section 5).
//!
//! A watcher owns no queue: it remembers a sequence number, is woken through
//! its route's `watch` channel, and drains everything available into one
//! chunk of pre-rendered, shared event lines. If its next event has left the
//! ring it ends with a 410. Dropping it unregisters it at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::task::AtomicWaker;
use tokio::time::{Instant, Sleep};

use super::CacherError;
use super::history::{ConvertedLines, EventKind, Gone, HistoryEvent};
use super::indexed_watchers::Route;
use super::selection_predicate::SelectionPredicate;
use super::snapshot::Snapshot;
use super::stats::WatchEnd;
use super::watch_cache::{Registration, WatchCache, WatchStart};
use crate::object::wire::{
    EventType, bookmark_line, event_line, protobuf_object_frame, protobuf_watch_frames,
};

/// One item of a watch stream.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchChunk {
    /// One or more complete JSON event lines.
    Data(Bytes),
    /// The stream's last item (e.g. 410 Expired); send as an ERROR event.
    Error(CacherError),
}

/// The line an event becomes for a watcher selecting `pred` (Kubernetes'
/// `cacheWatcher.convertToWatchEvent`), judged on the previous object too:
/// new match only -> ADDED, both -> MODIFIED, old only -> DELETED (the old
/// object at the new RV), neither -> nothing.
fn convert(pred: &SelectionPredicate, ev: &HistoryEvent, selected: bool) -> Option<EventType> {
    if selected || pred.is_everything() {
        return Some(match ev.kind {
            EventKind::Added => EventType::Added,
            EventKind::Modified => EventType::Modified,
            EventKind::Deleted => EventType::Deleted,
        });
    }
    let new_m = ev.object.as_deref().is_some_and(|o| pred.matches(o));
    let old_m = ev.prev.as_deref().is_some_and(|o| pred.matches(o));
    match (old_m, new_m) {
        (false, true) => Some(EventType::Added),
        (true, true) => Some(EventType::Modified),
        (true, false) => Some(EventType::Deleted),
        _ => None,
    }
}

/// Objects one step of a watch's initial events walks at most: see
/// [`SelectionPredicate::initial_step`]. A step that finds nothing wakes
/// its stream again, and the connection's task serves such wakes in up to
/// 16 rounds of one poll (its `FuturesUnordered` polls a stream that woke
/// itself up to twice a round) before it writes and yields, so a poll walks
/// at most about 16,000 objects (a few tenths of a millisecond) before the
/// connection's other streams' responses go out.
pub(crate) const INITIAL_WALK_MAX: usize = 512;

/// About how many bytes of initial events one chunk carries. The HTTP/2
/// layer takes a whole chunk while the client reads it, so with many
/// WatchList streams starting at once this, not the cache, bounds their
/// memory (docs/BENCHMARKS.md, "Against kube-apiserver", K2).
pub(crate) const INITIAL_CHUNK_BYTES: usize = 256 * 1024;

/// Objects in the next initial chunk: [`INITIAL_CHUNK_BYTES`] at the
/// average size seen so far (a few objects first), never more than `max`.
fn initial_count(avg_bytes: usize, max: usize) -> usize {
    INITIAL_CHUNK_BYTES
        .checked_div(avg_bytes)
        .unwrap_or(4)
        .clamp(1, max.max(1))
}

/// Per-watch settings the Cacher passes in.
pub(crate) struct WatcherParams {
    pub(crate) allow_bookmarks: bool,
    pub(crate) bookmark_interval: Duration,
    pub(crate) timeout: Option<Duration>,
    pub(crate) initial_chunk: usize,
}

struct InitialState {
    snapshot: Arc<Snapshot>,
    /// Where the next page of initial events starts (inclusive).
    next_key: Option<String>,
    end_bookmark: bool,
    /// Average bytes of an initial event so far (0: none sent yet).
    avg_bytes: usize,
    /// Objects per chunk at most ([`WatcherParams::initial_chunk`]).
    max_chunk: usize,
}

/// One watch stream.
pub struct Watcher {
    cache: Arc<WatchCache>,
    predicate: SelectionPredicate,
    /// The route this watcher is registered on.
    route: Option<Arc<Route>>,
    /// Where this watcher's task waits for the next apply of its route (or
    /// of any event, unrouted).
    wake: Arc<AtomicWaker>,
    cursor: u64,
    /// The RV of the last event (or bookmark/initial state) sent.
    last_rv: i64,
    /// Boxed, like the error: both are rare or short-lived, and a watch
    /// that is open for hours should not carry their room.
    initial: Option<Box<InitialState>>,
    pending_error: Option<Box<CacherError>>,
    /// Of [`WatcherParams`], what a watch needs after its start (its
    /// `apiVersion` and `kind` are its cache's codec's): a watcher lives as
    /// long as its watch, and every byte counts a 100,000 times
    /// (docs/BENCHMARKS.md, "Against kube-apiserver", K6).
    allow_bookmarks: bool,
    bookmark_interval: Duration,
    next_bookmark: Instant,
    deadline: Option<Instant>,
    done: bool,
    /// Why the server ended this watcher (none: the client closed it).
    end: std::cell::Cell<Option<WatchEnd>>,
    /// Wakes the watcher for its deadline or its next bookmark; one timer
    /// per watcher, reset only when that instant changes.
    /// Created on the first wait; never for a watcher whose owner wakes it
    /// at [`Watcher::wake_at`] itself ([`Watcher::use_external_timer`]).
    timer: Option<Pin<Box<Sleep>>>,
    external_timer: bool,
    /// Set by the external timer's owner: check the deadline and bookmark
    /// on the next poll.
    time_due: bool,
    /// Send kube-apiserver's protobuf watch frames instead of JSON lines
    /// ([`Watcher::use_protobuf`]).
    protobuf: bool,
    /// Send the lines in this converted form ([`Watcher::use_converted`]).
    converted: Option<Box<ConvertedLines>>,
    /// Events up to this RV are not sent: a watch from an RV ahead of the
    /// cache (the client listed on a replica further along) starts after
    /// it, as kube-apiserver's cache watcher does, instead of replaying
    /// what the client already has. 0 for every other watch.
    skip_through: i64,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher")
            .field("cursor", &self.cursor)
            .field("last_rv", &self.last_rv)
            .field("route", &self.predicate.route())
            .finish_non_exhaustive()
    }
}

impl Watcher {
    pub(crate) fn register(
        cache: Arc<WatchCache>,
        predicate: SelectionPredicate,
        start: WatchStart,
        params: WatcherParams,
    ) -> Watcher {
        let Registration {
            route,
            waker,
            snapshot,
            cursor,
        } = cache.register(predicate.route().cloned(), start);
        if predicate.shard().is_some() {
            cache.stats().shard_watcher_added(1);
        }
        let now = Instant::now();
        let mut w = Watcher {
            cache,
            predicate,
            route,
            wake: waker,
            cursor: 0,
            last_rv: snapshot.rv,
            initial: None,
            pending_error: None,
            next_bookmark: now + params.bookmark_interval,
            deadline: params.timeout.map(|t| now + t),
            allow_bookmarks: params.allow_bookmarks,
            bookmark_interval: params.bookmark_interval,
            done: false,
            end: std::cell::Cell::new(None),
            timer: None,
            external_timer: false,
            time_due: false,
            protobuf: false,
            converted: None,
            skip_through: 0,
        };
        match start {
            WatchStart::Initial { end_bookmark } => {
                w.initial = Some(Box::new(InitialState {
                    snapshot,
                    next_key: None,
                    end_bookmark,
                    avg_bytes: 0,
                    max_chunk: params.initial_chunk,
                }));
            }
            WatchStart::Now => {}
            WatchStart::After(n) => {
                w.last_rv = n;
                if n > snapshot.rv {
                    w.skip_through = n;
                }
            }
        }
        match cursor {
            Ok(c) => w.cursor = c,
            Err(g) => w.pending_error = Some(Box::new(w.expired(g))),
        }
        w
    }

    /// Sends protobuf watch frames (length-delimited `WatchEvent`s, see
    /// [`crate::object::wire::protobuf_watch_frames`]) instead of JSON
    /// lines. History events are encoded once and shared by every protobuf
    /// watcher; initial events are framed per watcher from each object's
    /// cached message, and bookmarks are encoded per watcher.
    pub fn use_protobuf(&mut self) {
        self.protobuf = true;
    }

    /// Sends JSON lines converted to `form` (a metadata watch's
    /// `PartialObjectMetadata` events). History events are converted once
    /// per form and shared by every such watcher; initial events and
    /// bookmarks are converted per watcher.
    pub fn use_converted(&mut self, form: ConvertedLines) {
        self.converted = Some(Box::new(form));
    }

    /// Appends JSON lines (initial events, bookmarks) in this watcher's encoding.
    fn push_lines(&self, buf: &mut Chunk, lines: &[u8]) -> Result<(), CacherError> {
        if let Some(form) = &self.converted {
            let converted = (form.convert)(lines).map_err(CacherError::Encoding)?;
            buf.extend_from_slice(&converted);
        } else if self.protobuf {
            let frames =
                protobuf_watch_frames(lines).map_err(|e| CacherError::Encoding(e.to_string()))?;
            buf.extend_from_slice(&frames);
        } else {
            buf.extend_from_slice(lines);
        }
        Ok(())
    }

    fn expired(&self, g: Gone) -> CacherError {
        self.end.set(Some(WatchEnd::Expired));
        CacherError::Expired(format!(
            "too old resource version: {} ({})",
            self.last_rv, g.oldest_rv
        ))
    }

    /// Whether the stream is still sending its initial events: a burst a
    /// client reads at network speed, not a backlog it failed to read.
    pub fn sending_initial_events(&self) -> bool {
        self.initial.is_some()
    }

    /// Ends the stream because its client does not read what it is sent
    /// (counted as `unresponsive`); the client resumes from the last
    /// resourceVersion it received.
    pub fn end_unresponsive(&mut self) {
        self.end_by(WatchEnd::Unresponsive);
    }

    /// The RV of the last event or bookmark sent (for resuming elsewhere).
    pub fn resource_version(&self) -> i64 {
        self.last_rv
    }

    /// The next chunk of the stream; `None` when it has ended (timeout,
    /// shutdown, or after an `Error`).
    pub async fn next(&mut self) -> Option<WatchChunk> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    /// [`next`](Self::next) as a poll: a response body polls its watcher
    /// directly, in the connection's stream task, with no task of its own.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<WatchChunk>> {
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            if let Some(e) = self.pending_error.take() {
                self.done = true;
                return Poll::Ready(Some(WatchChunk::Error(*e)));
            }
            // `WatchCache::close` wakes every watcher to see this.
            if self.cache.is_closed() {
                self.end_by(WatchEnd::Shutdown);
                return Poll::Ready(None);
            }
            if self.initial.is_some() {
                if let Some(chunk) = self.initial_page() {
                    return Poll::Ready(Some(WatchChunk::Data(chunk)));
                }
                if self.initial.is_some() {
                    // A step walked its bound and nothing in it matched:
                    // let the connection's other streams run, then go on.
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                continue;
            }
            // Time-based ends and bookmarks come first, so a stream that
            // always has events still times out and still gets bookmarks.
            // With an external timer the clock is read only when its owner
            // says the time has come (a clock read per poll was the top
            // item of a fan-out profile).
            let now = if !self.external_timer || std::mem::take(&mut self.time_due) {
                Some(Instant::now())
            } else {
                None
            };
            if let Some(now) = now
                && self.deadline.is_some_and(|d| now >= d)
            {
                // The stream's time is up: flush, one last bookmark, end.
                self.end_by(WatchEnd::Timeout);
                let mut buf = Chunk::default();
                let r = if self.allow_bookmarks {
                    self.bookmark(&mut buf, now)
                } else {
                    self.drain(&mut buf, Some(now)).map(|_| ())
                };
                if let Err(e) = r {
                    self.done = false;
                    return Poll::Ready(self.fail(buf, e));
                }
                return Poll::Ready((!buf.is_empty()).then(|| WatchChunk::Data(buf.freeze())));
            }
            let mut buf = Chunk::default();
            let drained = match now {
                Some(now) if self.allow_bookmarks && now >= self.next_bookmark => {
                    self.next_bookmark = now + self.bookmark_interval;
                    self.bookmark(&mut buf, now)
                }
                _ => self.drain(&mut buf, now).map(|_| ()),
            };
            if let Err(e) = drained {
                return Poll::Ready(self.fail(buf, e));
            }
            if !buf.is_empty() {
                return Poll::Ready(Some(WatchChunk::Data(buf.freeze())));
            }

            if !self.external_timer
                && let Some(wake_at) = self.wake_at()
            {
                match &mut self.timer {
                    Some(t) if t.deadline() == wake_at => {}
                    Some(t) => t.as_mut().reset(wake_at),
                    None => self.timer = Some(Box::pin(tokio::time::sleep_until(wake_at))),
                }
            }
            self.wake.register(cx.waker());
            // Registered first, then checked: an apply published between
            // the drain above and the registration is seen now; one after it
            // wakes this task. Closing the cache wakes every watcher, and
            // the loop's top sees the closed flag.
            if self.cache.is_closed()
                || self
                    .cache
                    .may_have_events(self.route.as_deref(), self.cursor)
            {
                continue;
            }
            if let Some(t) = &mut self.timer
                && t.as_mut().poll(cx).is_ready()
            {
                continue;
            }
            return Poll::Pending;
        }
    }

    /// Where this watcher is in the history (the next event it reads).
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// When `timeoutSeconds` ends this watch, if it has one.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// When this watcher next has something to do without an event: its
    /// deadline or its next bookmark (`None`: only events wake it).
    pub fn wake_at(&self) -> Option<Instant> {
        let bookmark = self.allow_bookmarks.then_some(self.next_bookmark);
        match (self.deadline, bookmark) {
            (Some(d), Some(b)) => Some(d.min(b)),
            (d, b) => d.or(b),
        }
    }

    /// The owner wakes this watcher at [`wake_at`](Self::wake_at) itself
    /// (a sweeper that visits every watch anyway), after
    /// [`time_is_due`](Self::time_is_due), so it holds no timer and reads
    /// no clock for that until then.
    pub fn use_external_timer(&mut self) {
        self.external_timer = true;
        self.timer = None;
    }

    /// With an external timer: the next poll checks the deadline and the
    /// bookmark.
    pub fn time_is_due(&mut self) {
        self.time_due = true;
    }

    /// About how many bytes of events this watcher has yet to take (those
    /// of its route, or all of them, before its own filter); `None` once it
    /// is behind the ring. Zero while it sends its initial events.
    pub fn unread_bytes(&self) -> Option<u64> {
        if self.initial.is_some() || self.done {
            return Some(0);
        }
        self.cache
            .unread_bytes(self.route.as_deref(), self.cursor)
            .ok()
    }

    /// Ends the stream at its `timeoutSeconds` without a last chunk: for a
    /// watcher whose client does not even take what it was sent.
    pub fn end_timeout(&mut self) {
        self.end_by(WatchEnd::Timeout);
    }

    /// Ends the stream for `reason` (the first reason recorded wins).
    fn end_by(&mut self, reason: WatchEnd) {
        self.done = true;
        if self.end.get().is_none() {
            self.end.set(Some(reason));
        }
    }

    /// Sends what was drained before the error, then the error.
    fn fail(&mut self, buf: Chunk, e: CacherError) -> Option<WatchChunk> {
        if buf.is_empty() {
            self.done = true;
            Some(WatchChunk::Error(e))
        } else {
            self.pending_error = Some(Box::new(e));
            Some(WatchChunk::Data(buf.freeze()))
        }
    }

    /// One page of initial ADDED events; the end bookmark after the last.
    fn initial_page(&mut self) -> Option<Bytes> {
        let init = self.initial.as_mut()?;
        // A bounded walk per step: a sparse selector over a large cache
        // yields between steps (see `poll_next`) instead of walking it all
        // in one poll of the connection's task.
        let page = self.predicate.initial_step(
            &init.snapshot,
            init.next_key.as_deref(),
            initial_count(init.avg_bytes, init.max_chunk),
            INITIAL_WALK_MAX,
        );
        let mut lines = BytesMut::new();
        // Protobuf initial events are made from each object's cached message
        // (no JSON parse per watcher); only the end bookmark goes through
        // `push_lines` below.
        let mut frames = BytesMut::new();
        let codec = self.cache.codec();
        for o in &page.items {
            if self.protobuf {
                match protobuf_object_frame(
                    EventType::Added,
                    o,
                    o.mod_revision,
                    codec.api_version(),
                    codec.kind(),
                ) {
                    Ok(f) => frames.extend_from_slice(&f),
                    Err(e) => {
                        self.initial = None;
                        self.pending_error = Some(Box::new(CacherError::Encoding(e.to_string())));
                        return (!frames.is_empty()).then(|| frames.freeze());
                    }
                }
            } else {
                lines.extend_from_slice(&event_line(EventType::Added, &o.wire));
            }
        }
        let init = self.initial.as_mut()?;
        if !page.items.is_empty() {
            init.avg_bytes = (lines.len() + frames.len()) / page.items.len();
        }
        match page.resume_after {
            Some(k) => init.next_key = Some(format!("{k}\0")),
            None => {
                let rv = init.snapshot.rv;
                if init.end_bookmark {
                    lines.extend_from_slice(&bookmark_line(
                        codec.api_version(),
                        codec.kind(),
                        rv,
                        true,
                    ));
                }
                self.last_rv = self.last_rv.max(rv);
                self.initial = None;
                // Periodic bookmarks count from the end of the initial events.
                self.next_bookmark = Instant::now() + self.bookmark_interval;
            }
        }
        if let Some(form) = &self.converted {
            if lines.is_empty() {
                return None;
            }
            return match (form.convert)(&lines) {
                Ok(b) => Some(b),
                Err(e) => {
                    self.initial = None;
                    self.pending_error = Some(Box::new(CacherError::Encoding(e)));
                    None
                }
            };
        }
        if !self.protobuf {
            return (!lines.is_empty()).then(|| lines.freeze());
        }
        let mut buf = Chunk::default();
        if !frames.is_empty() {
            buf.push(&frames.freeze());
        }
        if !lines.is_empty()
            && let Err(e) = self.push_lines(&mut buf, &lines)
        {
            self.initial = None;
            self.pending_error = Some(Box::new(e));
        }
        (!buf.is_empty()).then(|| buf.freeze())
    }

    /// Appends the available events for this watcher to `buf`, up to about
    /// [`MAX_CHUNK_BYTES`]; `Ok(true)` if more are left for the next chunk.
    fn drain(&mut self, buf: &mut Chunk, now: Option<Instant>) -> Result<bool, CacherError> {
        if !self
            .cache
            .may_have_events(self.route.as_deref(), self.cursor)
        {
            return Ok(false);
        }
        // Events read from the route's own log need no matching when the
        // route implies the selection (a replay from before the route was
        // created reads every event).
        let selected = self.predicate.route_selects_all()
            && self
                .route
                .as_ref()
                .is_some_and(|r| self.cursor >= r.created_seq);
        let events = match &self.route {
            Some(route) => match self.cache.read_route(route, self.cursor, MAX_READ_EVENTS) {
                Ok((evs, next)) => {
                    self.cursor = next;
                    evs
                }
                Err(g) => return Err(self.expired(g)),
            },
            None => match self.cache.read_all(self.cursor, MAX_READ_EVENTS) {
                Ok(evs) => {
                    self.cursor += evs.len() as u64;
                    evs
                }
                Err(g) => return Err(self.expired(g)),
            },
        };
        if events.is_empty() {
            return Ok(false);
        }
        let now = now.unwrap_or_else(Instant::now);
        let mut sent = 0u64;
        let stats = self.cache.stats();
        // One delay sample per event sent, straight into the shared
        // histogram: a local recorder per chunk cost an allocation and a
        // reference-count round trip per delivery (a chunk is usually one
        // event).
        // A full read may have left more behind it.
        let mut more = events.len() == MAX_READ_EVENTS;
        for ev in events.iter() {
            if buf.len() >= MAX_CHUNK_BYTES {
                // The rest in the next chunk, once the connection has
                // taken this one.
                self.cursor = ev.seq;
                more = true;
                break;
            }
            if ev.rv <= self.skip_through {
                continue;
            }
            let Some(ty) = convert(&self.predicate, ev, selected) else {
                self.last_rv = self.last_rv.max(ev.rv);
                continue;
            };
            let bytes = if let Some(form) = &self.converted {
                match ev.converted_line(ty, form) {
                    Some(Ok(line)) => Some(line),
                    Some(Err(e)) => {
                        if sent > 0 {
                            stats.dispatched(sent);
                        }
                        return Err(CacherError::Encoding(e));
                    }
                    None => None,
                }
            } else if self.protobuf {
                let codec = self.cache.codec();
                match ev.frame(ty, codec.api_version(), codec.kind()) {
                    Some(Ok(frame)) => Some(frame),
                    Some(Err(e)) => {
                        if sent > 0 {
                            stats.dispatched(sent);
                        }
                        return Err(CacherError::Encoding(e.to_string()));
                    }
                    None => None,
                }
            } else {
                ev.line(ty)
            };
            if let Some(bytes) = bytes {
                buf.push(bytes);
                sent += 1;
                stats.event_delay(now.saturating_duration_since(ev.received));
            }
            self.last_rv = self.last_rv.max(ev.rv);
        }
        if sent > 0 {
            stats.dispatched(sent);
        }
        Ok(more)
    }

    /// Drains, then appends a bookmark at the newest RV the watcher has
    /// provably seen everything up to.
    fn bookmark(&mut self, buf: &mut Chunk, now: Instant) -> Result<(), CacherError> {
        let snap = self.cache.current();
        if self.drain(buf, Some(now))? {
            // Not caught up: no RV is provably complete yet.
            return Ok(());
        }
        let rv = snap.rv.max(self.last_rv);
        if rv > 0 {
            self.last_rv = rv;
            let codec = self.cache.codec();
            let line = bookmark_line(codec.api_version(), codec.kind(), rv, false);
            self.push_lines(buf, &line)?;
        }
        Ok(())
    }
}

/// Bytes of events in one chunk, about (one event past it at most): a
/// watcher far behind (a replay from an old resourceVersion) takes the rest
/// in later chunks, as its connection takes them, instead of copying its
/// whole backlog into one buffer for the connection to hold. The backlog
/// stays in the shared history, counted by the sweeper's
/// `watch_max_buffered_bytes`.
pub(crate) const MAX_CHUNK_BYTES: usize = 256 * 1024;

/// Events read from the history per chunk at most, so a watcher far behind
/// does not take a reference to its whole backlog for every chunk.
const MAX_READ_EVENTS: usize = 1024;

/// A chunk being built. One event's shared bytes go out as they are (no
/// per-watcher copy or allocation, the common case under steady load);
/// several are joined into one buffer, written as one frame.
#[derive(Default)]
struct Chunk {
    one: Option<Bytes>,
    many: BytesMut,
}

impl Chunk {
    /// Appends shared bytes, without copying them if they are the first.
    fn push(&mut self, b: &Bytes) {
        if self.one.is_none() && self.many.is_empty() {
            self.one = Some(b.clone());
        } else {
            self.extend_from_slice(b);
        }
    }

    fn extend_from_slice(&mut self, s: &[u8]) {
        if let Some(one) = self.one.take() {
            self.many.reserve(one.len() + s.len());
            self.many.extend_from_slice(&one);
        }
        self.many.extend_from_slice(s);
    }

    fn is_empty(&self) -> bool {
        self.one.is_none() && self.many.is_empty()
    }

    fn len(&self) -> usize {
        self.one.as_ref().map_or(self.many.len(), Bytes::len)
    }

    fn freeze(self) -> Bytes {
        match self.one {
            Some(b) => b,
            None => self.many.freeze(),
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        // A watcher the server did not end was closed by its client.
        self.cache
            .stats()
            .watcher_ended(self.end.get().unwrap_or(WatchEnd::Closed));
        if self.predicate.shard().is_some() {
            self.cache.stats().shard_watcher_added(-1);
        }
        self.cache.unregister(self.route.as_deref(), &self.wake);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_shares_a_single_event_and_joins_several() {
        let a = Bytes::from_static(b"{\"type\":\"ADDED\"}\n");
        let b = Bytes::from(b"{\"type\":\"DELETED\"}\n".to_vec());
        let mut one = Chunk::default();
        assert!(one.is_empty());
        one.push(&b);
        let out = one.freeze();
        // The same allocation, not a copy.
        assert_eq!(out.as_ptr(), b.as_ptr());

        let mut two = Chunk::default();
        two.push(&a);
        two.push(&b);
        two.extend_from_slice(b"tail");
        assert_eq!(
            &two.freeze()[..],
            b"{\"type\":\"ADDED\"}\n{\"type\":\"DELETED\"}\ntail"
        );
    }
}

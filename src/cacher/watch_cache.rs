//! `WatchCache`: the current [`Snapshot`], recent snapshots, the [`History`]
//! ring, readiness, and watch routes (docs/DESIGN.md sections 4, 5).
//!
//! Only the reflector writes (through [`WatchCache::apply`]); readers load
//! the current snapshot through an `ArcSwap` and never block it. Applying a
//! batch and registering a watcher are serialised by one short lock so a new
//! watcher's starting snapshot and its history cursor always agree.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use futures::task::AtomicWaker;
use parking_lot::{Mutex, RwLock};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::history::{EventKind, Events, Gone, History, HistoryEvent, HistoryPolicy};
use super::indexed_watchers::{IndexedWatchers, Route};
use super::snapshot::{IndexKey, Snapshot};
use super::stats::CacherStats;
use crate::object::{Object, ObjectCodec};

/// One change fed to the cache: `new = None` deletes `key`.
#[derive(Debug, Clone)]
pub struct Change {
    pub key: Arc<str>,
    pub new: Option<Arc<Object>>,
    /// The etcd revision of the change (for a relist diff: the list RV).
    pub rv: i64,
}

/// Where a new watcher starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WatchStart {
    /// The current state as ADDED events, then changes.
    Initial { end_bookmark: bool },
    /// Changes after the current state.
    Now,
    /// Changes after RV N (from history).
    After(i64),
}

/// What [`WatchCache::register`] hands a new watcher.
pub(crate) struct Registration {
    pub(crate) route: Option<Arc<Route>>,
    /// Where the watcher registers its task to be woken.
    pub(crate) waker: Arc<AtomicWaker>,
    pub(crate) snapshot: Arc<Snapshot>,
    /// Cursor, or the history's oldest RV when the start was evicted.
    pub(crate) cursor: Result<u64, Gone>,
}

/// How many history events may lie between two snapshots kept for Exact
/// reads and continue tokens ([`WatchCache::snapshot_at`] replays them).
pub const SNAPSHOT_EVERY_EVENTS: u64 = 64;

pub struct WatchCache {
    codec: Arc<ObjectCodec>,
    resource: String,
    index_paths: Vec<Arc<str>>,
    /// Serialises apply vs. watcher registration (both short).
    apply_lock: Mutex<()>,
    current: ArcSwap<Snapshot>,
    /// Snapshots for Exact reads and continue tokens, oldest first.
    recent: Mutex<VecDeque<Arc<Snapshot>>>,
    history: RwLock<History>,
    rv_tx: watch::Sender<i64>,
    ready_tx: watch::Sender<bool>,
    ready: AtomicBool,
    watchers: IndexedWatchers,
    /// The history's next sequence number, published after each apply's
    /// dispatch: a watcher checks it before taking any lock.
    next_seq: AtomicU64,
    /// Set by [`WatchCache::close`]. A plain flag: every watcher checks it
    /// on every wake, and a token's check takes a lock they all share.
    closed: AtomicBool,
    stats: Arc<CacherStats>,
}

impl std::fmt::Debug for WatchCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchCache")
            .field("resource", &self.resource)
            .field("rv", &self.resource_version())
            .finish_non_exhaustive()
    }
}

impl WatchCache {
    pub fn new(
        codec: Arc<ObjectCodec>,
        resource: String,
        history: impl Into<HistoryPolicy>,
    ) -> WatchCache {
        let index_paths = codec.index_paths().to_vec();
        let history = History::new(history, 0);
        let stats = CacherStats::new(&resource, history.capacity());
        WatchCache {
            codec,
            resource,
            index_paths,
            apply_lock: Mutex::new(()),
            current: ArcSwap::from_pointee(Snapshot::empty(0, 0)),
            recent: Mutex::new(VecDeque::new()),
            history: RwLock::new(history),
            rv_tx: watch::Sender::new(0),
            ready_tx: watch::Sender::new(false),
            ready: AtomicBool::new(false),
            watchers: IndexedWatchers::new(),
            closed: AtomicBool::new(false),
            next_seq: AtomicU64::new(0),
            stats,
        }
    }

    pub fn codec(&self) -> &ObjectCodec {
        &self.codec
    }
    pub fn index_paths(&self) -> &[Arc<str>] {
        &self.index_paths
    }
    pub fn stats(&self) -> &Arc<CacherStats> {
        &self.stats
    }
    pub fn resource(&self) -> &str {
        &self.resource
    }
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
    pub fn resource_version(&self) -> i64 {
        self.current.load().rv
    }
    pub fn current(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }
    /// `f` of the current snapshot, without taking a reference to it: a
    /// reader that needs one object does not touch the snapshot's shared
    /// reference count (a cache line every core's reads would contend on).
    pub fn with_current<R>(&self, f: impl FnOnce(&Snapshot) -> R) -> R {
        f(&self.current.load())
    }
    pub fn history_len(&self) -> usize {
        self.history.read().len()
    }
    pub fn history_capacity(&self) -> usize {
        self.history.read().capacity()
    }
    /// The oldest RV a watch can start from.
    pub fn oldest_watch_rv(&self) -> i64 {
        self.history.read().start_rv()
    }
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Ends every watcher: they are woken through their channel and see the
    /// token. Under `apply_lock`, so a route registered concurrently is
    /// either woken here or registered after the token is set.
    pub fn close(&self) {
        let _g = self.apply_lock.lock();
        self.closed.store(true, Ordering::Release);
        self.watchers.close();
    }

    /// The reflector is gone for good: stop serving (not ready, so
    /// `/readyz` fails) and end every watcher.
    pub(crate) fn fail(&self) {
        self.ready.store(false, Ordering::Release);
        self.ready_tx.send_replace(false);
        self.close();
    }

    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let mut rx = self.ready_tx.subscribe();
        matches!(
            tokio::time::timeout(timeout, rx.wait_for(|r| *r)).await,
            Ok(Ok(_))
        )
    }

    /// Waits up to `timeout` for the cache RV to reach `rv`.
    pub async fn wait_for_rv(
        &self,
        rv: i64,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> bool {
        let mut rx = self.rv_tx.subscribe();
        tokio::select! {
            r = tokio::time::timeout(timeout, rx.wait_for(|cur| *cur >= rv)) => matches!(r, Ok(Ok(_))),
            _ = cancel.cancelled() => false,
        }
    }

    /// The state at exactly `rv`: the newest retained snapshot not newer than
    /// it, with the history's events after it up to `rv` applied to a copy
    /// (at most [`SNAPSHOT_EVERY_EVENTS`]). `None` if `rv` is older than what
    /// is kept, or those events have left the history.
    pub fn snapshot_at(&self, rv: i64) -> Option<Arc<Snapshot>> {
        let cur = self.current();
        if rv > cur.rv {
            return None;
        }
        let base = {
            let recent = self.recent.lock();
            let idx = recent.partition_point(|s| s.rv <= rv);
            if idx == 0 {
                return None;
            }
            Arc::clone(recent.get(idx - 1)?)
        };
        // Every event of a revision up to `cur.rv` is in the history (an
        // apply pushes its events before it publishes); events of a later,
        // unpublished revision stop the replay.
        let hist = self.history.read();
        let mut replayed: Option<Snapshot> = None;
        let mut seq = base.next_seq;
        while seq < hist.next_seq() {
            let Some(e) = hist.get(seq) else {
                // Left the history: the state in between is gone.
                return None;
            };
            if e.rv > rv {
                break;
            }
            let s = replayed.get_or_insert_with(|| (*base).clone());
            s.apply(&e.key, e.object.clone(), &self.index_paths);
            s.rv = s.rv.max(e.rv);
            s.next_seq = seq + 1;
            seq += 1;
        }
        Some(replayed.map_or(base, Arc::new))
    }

    /// The oldest RV an Exact read can use.
    pub fn oldest_snapshot_rv(&self) -> i64 {
        self.recent
            .lock()
            .front()
            .map_or_else(|| self.resource_version(), |s| s.rv)
    }

    /// Replaces the whole state (first list): ready afterwards.
    pub(crate) fn init(&self, objects: Vec<Arc<Object>>, rv: i64) {
        let _g = self.apply_lock.lock();
        let mut hist = self.history.write();
        let mut snap = Snapshot::empty(rv, hist.next_seq());
        for o in objects {
            let key = Arc::clone(&o.key);
            snap.apply(&key, Some(o), &self.index_paths);
        }
        hist.set_start_rv_if_empty(rv);
        drop(hist);
        let snap = Arc::new(snap);
        {
            let mut recent = self.recent.lock();
            recent.clear();
            recent.push_back(Arc::clone(&snap));
        }
        self.current.store(snap);
        self.rv_tx.send_replace(rv);
        self.ready.store(true, Ordering::Release);
        self.ready_tx.send_replace(true);
        self.stats.published(rv, self.current.load().len());
    }

    /// The changes that turn the current state into `objects` (a relist at
    /// `rv`): additions and modifications (by mod_revision), then deletions.
    pub(crate) fn diff(&self, objects: Vec<Arc<Object>>, rv: i64) -> Vec<Change> {
        let cur = self.current();
        let mut changes = Vec::new();
        let mut seen: HashSet<Arc<str>> = HashSet::with_capacity(objects.len());
        for o in objects {
            seen.insert(Arc::clone(&o.key));
            match cur.get(&o.key) {
                Some(old) if old.mod_revision == o.mod_revision && old.wire == o.wire => {}
                // After a compaction every change is newer than the cache;
                // a repair (the consistency checker) may find an older one:
                // it is sent at the cache's RV so the history stays ordered.
                _ => changes.push(Change {
                    key: Arc::clone(&o.key),
                    rv: o.mod_revision.max(cur.rv),
                    new: Some(o),
                }),
            }
        }
        // Changed objects in revision order, each at its own revision, then
        // deletions at the list RV: RVs seen by watchers never decrease and
        // match the objects they carry.
        changes.sort_by_key(|c| c.rv);
        for (k, _) in cur.iter() {
            if !seen.contains(k) {
                changes.push(Change {
                    key: Arc::clone(k),
                    new: None,
                    rv,
                });
            }
        }
        changes
    }

    /// Applies one batch (one etcd watch response, or a relist diff) at `rv`
    /// and publishes the new snapshot. `relist`: intermediate states between
    /// the old RV and `rv` are unknown, so older snapshots stop being exact.
    pub(crate) fn apply(&self, changes: Vec<Change>, rv: i64, relist: bool) {
        let received = Instant::now();
        let _g = self.apply_lock.lock();
        let cur = self.current.load_full();
        let mut snap = (*cur).clone();
        // Only apply() pushes to the history and it holds `apply_lock`: the
        // batch is prepared outside the history lock (watchers keep draining
        // meanwhile).
        let mut pending: Vec<(EventKind, Change, Option<Arc<Object>>)> =
            Vec::with_capacity(changes.len());
        for ch in changes {
            let prev = snap.apply(&ch.key, ch.new.clone(), &self.index_paths);
            let kind = match (&prev, &ch.new) {
                (None, Some(_)) => EventKind::Added,
                (Some(_), Some(_)) => EventKind::Modified,
                (Some(_), None) => EventKind::Deleted,
                (None, None) => continue,
            };
            pending.push((kind, ch, prev));
        }
        let mut events: Vec<Arc<HistoryEvent>> = Vec::with_capacity(pending.len());
        let mut hist = self.history.write();
        for (kind, ch, prev) in pending {
            events.push(hist.push(kind, ch.key, ch.new, prev, ch.rv, received));
        }
        let next_seq = hist.next_seq();
        let first_seq = hist.first_seq();
        let start_rv = hist.start_rv();
        let (capacity, len, bytes) = (hist.capacity(), hist.len(), hist.bytes());
        let oldest = hist.oldest_received();
        drop(hist);
        self.stats
            .history(capacity, len, bytes, oldest.map(Instant::into_std));
        snap.rv = snap.rv.max(rv);
        snap.next_seq = next_seq;

        // Dispatch to routes before publishing, so a watcher that sees the
        // snapshot also finds its events in its route log.
        let woken = self
            .watchers
            .dispatch(&events, first_seq, &self.index_paths);
        self.next_seq.store(next_seq, Ordering::Release);

        let snap = Arc::new(snap);
        // `recent` before `current`: a reader that sees the new RV in
        // `current` must find its exact snapshot in `recent` (an Exact read
        // or the consistency check at that RV would otherwise get the
        // previous state).
        {
            let mut recent = self.recent.lock();
            if relist {
                // States between the old RV and the relist are unknown.
                recent.clear();
            }
            // One snapshot per SNAPSHOT_EVERY_EVENTS events: a read between
            // two replays the events after the older one (`snapshot_at`).
            // One per revision would keep each revision's copied map nodes
            // (kilobytes) for the history's whole window.
            let due = recent.back().is_none_or(|last| {
                snap.next_seq.saturating_sub(last.next_seq) >= SNAPSHOT_EVERY_EVENTS
            });
            if due {
                recent.push_back(Arc::clone(&snap));
            }
            // Keep the newest snapshot at or before the history start (the
            // state at start_rv) and everything after it.
            while recent.len() >= 2 && recent.get(1).is_some_and(|s| s.rv <= start_rv) {
                recent.pop_front();
            }
        }
        self.current.store(Arc::clone(&snap));
        self.rv_tx.send_replace(snap.rv);
        drop(_g);

        let n = events.len() as u64;
        self.stats.received(n);
        self.stats.published(snap.rv, snap.len());
        if n > 0 {
            self.watchers.wake(woken);
        }
    }

    /// Test hook: puts `object` at `key` (or removes it) in the published
    /// state WITHOUT an event or a new RV, i.e. makes the cache silently
    /// disagree with etcd, as a bug would. Used by the consistency
    /// checker's tests; never called by the daemon.
    #[doc(hidden)]
    pub fn inject_inconsistency(&self, key: &str, object: Option<Arc<Object>>) {
        let _g = self.apply_lock.lock();
        let mut snap = (*self.current.load_full()).clone();
        snap.apply(&Arc::from(key), object, &self.index_paths);
        let snap = Arc::new(snap);
        self.current.store(Arc::clone(&snap));
        let mut recent = self.recent.lock();
        match recent.back_mut() {
            Some(last) if last.next_seq == snap.next_seq => *last = snap,
            _ => recent.push_back(snap),
        }
    }

    /// Advances the RV without changes (a progress notification).
    pub(crate) fn advance(&self, rv: i64) {
        let _g = self.apply_lock.lock();
        let cur = self.current.load_full();
        if rv <= cur.rv {
            return;
        }
        let mut snap = (*cur).clone();
        snap.rv = rv;
        self.current.store(Arc::new(snap));
        self.rv_tx.send_replace(rv);
    }

    /// Registers a watcher: picks its route and its start consistently with
    /// the published snapshot.
    pub(crate) fn register(&self, route_key: Option<IndexKey>, start: WatchStart) -> Registration {
        let _g = self.apply_lock.lock();
        // Under apply_lock: no event is applied between reading next_seq
        // and a new route becoming visible.
        let next_seq = self.history.read().next_seq();
        let (route, waker) = self.watchers.register(route_key, next_seq);
        let snapshot = self.current.load_full();
        let cursor = match start {
            WatchStart::Initial { .. } | WatchStart::Now => Ok(snapshot.next_seq),
            WatchStart::After(n) if n >= snapshot.rv => Ok(snapshot.next_seq),
            WatchStart::After(n) => self.history.read().seq_after_rv(n),
        };
        self.stats.watcher_added();
        Registration {
            route,
            waker,
            snapshot,
            cursor,
        }
    }

    /// Unregisters a watcher; frees its route when it was the last one on it.
    pub(crate) fn unregister(&self, route: Option<&Route>, waker: &Arc<AtomicWaker>) {
        self.stats.watcher_removed();
        // Under apply_lock for a route: it is not removed while a watcher
        // joins it.
        let _g = route.map(|_| self.apply_lock.lock());
        self.watchers.unregister(route, waker);
    }

    /// About how many bytes of events a watcher of `route` at `cursor` has
    /// yet to take; `Gone` if it is behind the ring.
    pub(crate) fn unread_bytes(&self, route: Option<&Route>, cursor: u64) -> Result<u64, Gone> {
        let hist = self.history.read();
        let gone = || Gone {
            oldest_rv: hist.start_rv(),
        };
        match route {
            None => hist.bytes_since(cursor),
            // Older than its route (a replay): every event counts.
            Some(r) if cursor < r.created_seq => hist.bytes_since(cursor),
            Some(r) => r
                .with_seqs_from(cursor, |seqs| {
                    seqs.map(|s| hist.get(s).map(|ev| ev.wire_bytes()))
                        .sum::<Option<u64>>()
                })
                .ok()
                .flatten()
                .ok_or_else(gone),
        }
    }

    /// Whether a watcher of `route` at `cursor` may have events to read:
    /// checked without a lock, so a watcher polled with nothing new (every
    /// delivery ends with such a poll) touches nothing shared but atomics.
    pub(crate) fn may_have_events(&self, route: Option<&Route>, cursor: u64) -> bool {
        match route {
            Some(r) if cursor >= r.created_seq => r.end_seq() > cursor,
            _ => self.next_seq.load(Ordering::Acquire) > cursor,
        }
    }

    /// Up to `max` events from `cursor` on (all of them, routed or not).
    pub(crate) fn read_all(&self, cursor: u64, max: usize) -> Result<Events, Gone> {
        self.history.read().read_from(cursor, max)
    }

    /// Events of `route` from `cursor` on. The returned cursor is past the
    /// last event returned.
    ///
    /// A cursor older than the route (a watch from an old RV that created or
    /// joined a young route) first gets every retained event up to the
    /// route's creation, which the route never logged; the watcher's own
    /// filter drops what is not its business.
    pub(crate) fn read_route(
        &self,
        route: &Route,
        cursor: u64,
        max: usize,
    ) -> Result<(Events, u64), Gone> {
        if cursor < route.created_seq {
            let mut out: Events = self
                .history
                .read()
                .read_from(cursor, max)?
                .into_iter()
                .take_while(|ev| ev.seq < route.created_seq)
                .collect();
            if out.len() == max {
                let next = out.last().map_or(cursor, |ev| ev.seq + 1);
                return Ok((out, next));
            }
            let (more, next) = self.read_route(route, route.created_seq, max - out.len())?;
            out.extend(more);
            return Ok((out, next));
        }
        // The history's lock first, then the route's, as every reader.
        let hist = self.history.read();
        let gone = || Gone {
            oldest_rv: hist.start_rv(),
        };
        let read = route.with_seqs_from(cursor, |seqs| {
            let mut out = Events::new();
            let mut next = cursor;
            for s in seqs.take(max) {
                out.push(Arc::clone(hist.get(s)?));
                next = s + 1;
            }
            Some((out, next))
        });
        let (out, next) = read.ok().flatten().ok_or_else(gone)?;
        Ok((out, next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cacher::CacherError;
    use crate::cacher::SelectionPredicate;
    use crate::cacher::watcher::{WatchChunk, Watcher, WatcherParams};
    use crate::object::{FieldSelector, LabelSelector};

    fn codec() -> Arc<ObjectCodec> {
        let r = crate::object::tests::resource(true, &["spec.nodeName"]);
        Arc::new(r.object_codec("/registry"))
    }

    fn obj(c: &ObjectCodec, name: &str, node: &str, rv: i64) -> Arc<Object> {
        let key = c.key(Some("ns"), name);
        let v = format!(
            r#"{{"metadata":{{"name":"{name}","namespace":"ns","labels":{{"app":"x"}}}},"spec":{{"nodeName":"{node}"}}}}"#
        );
        Arc::new(c.decode(&key, v.as_bytes(), rv, rv).expect("decode"))
    }

    fn put(c: &ObjectCodec, name: &str, node: &str, rv: i64) -> Change {
        let o = obj(c, name, node, rv);
        Change {
            key: Arc::clone(&o.key),
            new: Some(o),
            rv,
        }
    }

    fn params(allow_bookmarks: bool, timeout: Option<Duration>) -> WatcherParams {
        WatcherParams {
            allow_bookmarks,
            bookmark_interval: Duration::from_secs(60),
            timeout,
            initial_chunk: 2,
        }
    }

    fn watch(cache: &Arc<WatchCache>, field: &str, start: WatchStart, p: WatcherParams) -> Watcher {
        let c = cache.codec();
        let fs = FieldSelector::parse(field, c.index_paths()).expect("field");
        let f = SelectionPredicate::new(c, None, LabelSelector::default(), fs);
        Watcher::register(Arc::clone(cache), f, start, p)
    }

    fn lines(chunk: Option<WatchChunk>) -> Vec<(String, String, String)> {
        let Some(WatchChunk::Data(b)) = chunk else {
            panic!("expected data, got {chunk:?}");
        };
        String::from_utf8_lossy(&b)
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("json");
                let m = &v["object"]["metadata"];
                (
                    v["type"].as_str().unwrap_or("").to_string(),
                    m["name"].as_str().unwrap_or("").to_string(),
                    m["resourceVersion"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    fn new_cache(cap: usize) -> Arc<WatchCache> {
        let cache = Arc::new(WatchCache::new(codec(), "pods".into(), cap));
        cache.init(Vec::new(), 10);
        cache
    }

    /// A watch from an RV ahead of the cache opens at once and sends only
    /// the events after that RV, as they come.
    #[tokio::test(start_paused = true)]
    async fn a_watch_from_ahead_of_the_cache_starts_after_its_rv() {
        let cache = new_cache(100);
        let c = codec();
        let mut w = watch(&cache, "", WatchStart::After(13), params(false, None));
        for rv in 11..=15 {
            cache.apply(vec![put(&c, &format!("p{rv}"), "n1", rv)], rv, false);
        }
        let got = lines(w.next().await);
        let rvs: Vec<&str> = got.iter().map(|(_, _, rv)| rv.as_str()).collect();
        assert_eq!(rvs, ["14", "15"]);
        assert_eq!(w.resource_version(), 15);
        // A watch from the cache's own RV or before it replays as before.
        let mut from = watch(&cache, "", WatchStart::After(12), params(false, None));
        assert_eq!(lines(from.next().await).len(), 3);
    }

    /// A watcher far behind (a replay from an old RV, through a route
    /// created after the events) takes its backlog in bounded chunks, every
    /// event once and in order, and gets no bookmark before it has caught
    /// up (a bookmark's RV says every event up to it was sent).
    #[tokio::test(start_paused = true)]
    async fn a_replay_from_far_behind_comes_in_bounded_chunks() {
        use crate::cacher::watcher::MAX_CHUNK_BYTES;
        let n = 5_000;
        let cache = new_cache(n);
        let c = codec();
        let pad = "x".repeat(300);
        let mut biggest = 0;
        for i in 0..n as i64 {
            // Every other event on the watched node, some of them large.
            let node = if i % 2 == 0 { "n1" } else { "n2" };
            let name = if i % 7 == 0 {
                format!("p{i}-{pad}")
            } else {
                format!("p{i}")
            };
            let ch = put(&c, &name, node, 11 + i);
            biggest = biggest.max(ch.new.as_ref().map_or(0, |o| o.wire.len()));
            cache.apply(vec![ch], 11 + i, false);
        }
        let mut p = params(true, None);
        p.bookmark_interval = Duration::from_secs(60);
        let mut w = watch(&cache, "spec.nodeName=n1", WatchStart::After(10), p);
        tokio::time::advance(Duration::from_secs(61)).await;
        let mut seen = Vec::new();
        let mut chunks = 0;
        while seen.len() < n / 2 {
            let Some(WatchChunk::Data(b)) = w.next().await else {
                panic!("data expected");
            };
            assert!(
                b.len() <= MAX_CHUNK_BYTES + biggest + 100,
                "{} bytes",
                b.len()
            );
            chunks += 1;
            for (ty, _, rv) in lines(Some(WatchChunk::Data(b))) {
                assert_eq!(ty, "ADDED", "no bookmark before caught up");
                seen.push(rv.parse::<i64>().expect("rv"));
            }
        }
        assert!(chunks > 2, "{chunks} chunks");
        let want: Vec<i64> = (0..n as i64)
            .filter(|i| i % 2 == 0)
            .map(|i| 11 + i)
            .collect();
        assert_eq!(seen, want);
        tokio::time::advance(Duration::from_secs(61)).await;
        let last = lines(w.next().await);
        assert_eq!(last.len(), 1);
        assert_eq!(last[0].0, "BOOKMARK");
        assert_eq!(last[0].2, (10 + n as i64).to_string());
    }

    #[tokio::test(start_paused = true)]
    async fn unread_bytes_count_a_watchers_own_route_and_end_behind_the_ring() {
        let cache = new_cache(4);
        let c = codec();
        let mut routed = watch(
            &cache,
            "spec.nodeName=n1",
            WatchStart::Now,
            params(false, None),
        );
        let mut all = watch(&cache, "", WatchStart::Now, params(false, None));
        assert_eq!(routed.unread_bytes(), Some(0));
        assert_eq!(all.unread_bytes(), Some(0));
        // Other routes' events are nothing this watcher has to take.
        let other = put(&c, "p0", "n2", 11);
        let other_bytes = other.new.as_ref().map_or(0, |o| o.wire.len() as u64);
        cache.apply(vec![other], 11, false);
        assert_eq!(routed.unread_bytes(), Some(0));
        assert_eq!(all.unread_bytes(), Some(other_bytes));
        let mine = put(&c, "p1", "n1", 12);
        let mine_bytes = mine.new.as_ref().map_or(0, |o| o.wire.len() as u64);
        cache.apply(vec![mine], 12, false);
        assert_eq!(routed.unread_bytes(), Some(mine_bytes));
        assert_eq!(all.unread_bytes(), Some(other_bytes + mine_bytes));
        // Taking the events leaves nothing unread.
        assert_eq!(lines(routed.next().await).len(), 1);
        assert_eq!(lines(all.next().await).len(), 2);
        assert_eq!(routed.unread_bytes(), Some(0));
        assert_eq!(all.unread_bytes(), Some(0));
        // Overrun by the ring of four: behind it, nothing to count.
        for i in 0..5 {
            cache.apply(vec![put(&c, &format!("q{i}"), "n1", 13 + i)], 13 + i, false);
        }
        assert_eq!(routed.unread_bytes(), None);
        assert_eq!(all.unread_bytes(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn routed_watcher_is_not_woken_or_expired_by_other_events() {
        let cache = new_cache(4);
        let c = codec();
        let mut w = watch(
            &cache,
            "spec.nodeName=n1",
            WatchStart::After(10),
            params(false, None),
        );
        // Ten non-matching events overflow the ring of four.
        for i in 0..10 {
            cache.apply(vec![put(&c, &format!("p{i}"), "n2", 11 + i)], 11 + i, false);
        }
        assert!(
            tokio::time::timeout(Duration::from_secs(5), w.next())
                .await
                .is_err(),
            "not woken, not expired"
        );
        cache.apply(vec![put(&c, "p3", "n1", 30)], 30, false);
        assert_eq!(
            lines(w.next().await),
            vec![("ADDED".into(), "p3".into(), "30".into())]
        );
        cache.apply(vec![put(&c, "p3", "n2", 31)], 31, false);
        assert_eq!(
            lines(w.next().await),
            vec![("DELETED".into(), "p3".into(), "31".into())]
        );
        assert_eq!(cache.watchers.route_count(), 1);
        drop(w);
        assert_eq!(
            cache.watchers.route_count(),
            0,
            "dropping frees the route at once"
        );
    }

    /// Sharded watchers (KEP-5866) route on their selector: each gets the
    /// events whose uid hashes into its ranges, in order, and no other
    /// event wakes or expires it.
    #[tokio::test(start_paused = true)]
    async fn sharded_watchers_get_their_shard_only() {
        use crate::object::sharding::{ShardSelector, hash_field};
        let cache = new_cache(8);
        let c = codec();
        let sel = |start: &str, end: &str| {
            Arc::new(
                ShardSelector::parse(&format!(
                    "shardRange(object.metadata.uid, '{start}', '{end}')"
                ))
                .expect("shard selector"),
            )
        };
        let halves = [
            sel("0x0000000000000000", "0x8000000000000000"),
            sel("0x8000000000000000", "0x10000000000000000"),
        ];
        let mut ws: Vec<Watcher> = halves
            .iter()
            .map(|h| {
                let f = SelectionPredicate::everything(&c).with_shard(Some(Arc::clone(h)));
                assert!(matches!(f.route(), Some(IndexKey::Shard(_))));
                Watcher::register(
                    Arc::clone(&cache),
                    f,
                    WatchStart::After(10),
                    params(false, None),
                )
            })
            .collect();
        // Two watchers of one selector share its route.
        let twin = Watcher::register(
            Arc::clone(&cache),
            SelectionPredicate::everything(&c).with_shard(Some(Arc::clone(&halves[0]))),
            WatchStart::After(10),
            params(false, None),
        );
        assert_eq!(cache.watchers.route_count(), 2);
        assert_eq!(cache.stats().shard_watchers.load(Ordering::Relaxed), 3);
        let put_uid = |name: &str, uid: &str, rv: i64| {
            let key = c.key(Some("ns"), name);
            let v = format!(r#"{{"metadata":{{"name":"{name}","namespace":"ns","uid":"{uid}"}}}}"#);
            let o = Arc::new(c.decode(&key, v.as_bytes(), rv, rv).expect("decode"));
            Change {
                key: Arc::clone(&o.key),
                new: Some(o),
                rv,
            }
        };
        // UUID-like, as the API server makes them.
        let uids: Vec<String> = (0..40u64)
            .map(|i| {
                let r = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                format!(
                    "{:08x}-0000-4000-8000-{:012x}",
                    r >> 32,
                    r & 0xffff_ffff_ffff
                )
            })
            .collect();
        let lower: Vec<bool> = uids.iter().map(|u| hash_field(u) < 1 << 63).collect();
        assert!(
            lower.iter().filter(|l| **l).count() > 8,
            "more than the ring"
        );
        assert!(lower.iter().filter(|l| !**l).count() >= 3);
        // One shard's events only, more than the ring holds: the other
        // shard's watcher is neither woken nor expired.
        let mut rv = 10;
        for (i, u) in uids.iter().enumerate().filter(|(i, _)| lower[*i]) {
            rv += 1;
            cache.apply(vec![put_uid(&format!("p{i}"), u, rv)], rv, false);
            let got = lines(ws[0].next().await);
            assert_eq!(got, vec![("ADDED".into(), format!("p{i}"), rv.to_string())]);
        }
        assert!(
            tokio::time::timeout(Duration::from_secs(5), ws[1].next())
                .await
                .is_err(),
            "the other shard is not woken"
        );
        // Both shards in one batch: each watcher its part.
        let mut batch: Vec<(usize, &String)> = Vec::new();
        for half in [true, false] {
            batch.extend(
                uids.iter()
                    .enumerate()
                    .filter(|(i, _)| lower[*i] == half)
                    .take(3),
            );
        }
        batch.sort();
        let start = rv + 1;
        let changes: Vec<Change> = batch
            .iter()
            .map(|(i, u)| {
                rv += 1;
                put_uid(&format!("q{i}"), u, rv)
            })
            .collect();
        cache.apply(changes, rv, false);
        for (half, w) in ws.iter_mut().enumerate() {
            let want: Vec<String> = batch
                .iter()
                .zip(start..)
                .filter(|((i, _), _)| lower[*i] == (half == 0))
                .map(|((i, _), r)| format!("q{i}@{r}"))
                .collect();
            let mut got = Vec::new();
            while got.len() < want.len() {
                got.extend(
                    lines(w.next().await)
                        .into_iter()
                        .map(|(_, n, r)| format!("{n}@{r}")),
                );
            }
            assert_eq!(got, want, "shard {half}");
        }
        drop(twin);
        assert_eq!(cache.watchers.route_count(), 2);
        ws.clear();
        assert_eq!(cache.watchers.route_count(), 0, "routes freed");
        assert_eq!(cache.stats().shard_watchers.load(Ordering::Relaxed), 0);
        assert!(cache.watchers.shard_entries() == 0, "shard index emptied");
    }

    #[tokio::test(start_paused = true)]
    async fn unread_events_leaving_the_ring_expire_the_watcher() {
        let cache = new_cache(4);
        let c = codec();
        let mut w = watch(&cache, "", WatchStart::After(10), params(false, None));
        for i in 0..6 {
            cache.apply(vec![put(&c, &format!("p{i}"), "n1", 11 + i)], 11 + i, false);
        }
        match w.next().await {
            Some(WatchChunk::Error(CacherError::Expired(m))) => {
                assert_eq!(m, "too old resource version: 10 (12)")
            }
            other => panic!("{other:?}"),
        }
        assert!(w.next().await.is_none());
        // The routed flavour: its own events were evicted unread.
        let mut r = watch(
            &cache,
            "spec.nodeName=n1",
            WatchStart::After(16),
            params(false, None),
        );
        for i in 0..6 {
            cache.apply(vec![put(&c, &format!("q{i}"), "n1", 17 + i)], 17 + i, false);
        }
        assert!(matches!(
            r.next().await,
            Some(WatchChunk::Error(CacherError::Expired(_)))
        ));
    }

    /// Initial events of large objects come in chunks of about
    /// `INITIAL_CHUNK_BYTES`, however many objects a page may hold, every
    /// object once and in order.
    #[tokio::test(start_paused = true)]
    async fn initial_events_come_in_chunks_bounded_by_bytes() {
        use crate::cacher::watcher::INITIAL_CHUNK_BYTES;
        let c = codec();
        let pad = "x".repeat(20_000);
        let objects: Vec<Arc<Object>> = (0..60)
            .map(|i| {
                let name = format!("p{i:02}");
                let key = c.key(Some("ns"), &name);
                let v = format!(
                    r#"{{"metadata":{{"name":"{name}","namespace":"ns","annotations":{{"pad":"{pad}"}}}}}}"#
                );
                Arc::new(c.decode(&key, v.as_bytes(), 5, 5).expect("decode"))
            })
            .collect();
        let cache = Arc::new(WatchCache::new(codec(), "pods".into(), 100));
        cache.init(objects, 10);
        let mut p = params(true, None);
        p.initial_chunk = 500;
        let mut w = watch(&cache, "", WatchStart::Initial { end_bookmark: true }, p);
        let (mut names, mut chunks) = (Vec::new(), 0);
        while names.len() < 60 {
            let Some(WatchChunk::Data(b)) = w.next().await else {
                panic!("initial events ended after {}", names.len());
            };
            assert!(b.len() <= INITIAL_CHUNK_BYTES + 21_000, "{} bytes", b.len());
            chunks += 1;
            for l in String::from_utf8_lossy(&b).lines() {
                let v: serde_json::Value = serde_json::from_str(l).expect("json");
                if v["type"] == "ADDED" {
                    names.push(
                        v["object"]["metadata"]["name"]
                            .as_str()
                            .unwrap_or("")
                            .to_string(),
                    );
                }
            }
        }
        let want: Vec<String> = (0..60).map(|i| format!("p{i:02}")).collect();
        assert_eq!(names, want);
        assert!(
            chunks >= 60 * 20_000 / INITIAL_CHUNK_BYTES,
            "{chunks} chunks"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn periodic_and_final_bookmarks() {
        let cache = new_cache(100);
        let c = codec();
        cache.apply(vec![put(&c, "a", "n1", 11)], 11, false);
        let mut w = watch(
            &cache,
            "",
            WatchStart::Initial { end_bookmark: true },
            params(true, Some(Duration::from_secs(150))),
        );
        assert_eq!(
            lines(w.next().await),
            vec![
                ("ADDED".into(), "a".into(), "11".into()),
                ("BOOKMARK".into(), "".into(), "11".into())
            ]
        );
        let contents = cache.current().contents();
        cache.advance(15); // progress: no events, newer RV
        assert_eq!(cache.current().contents(), contents);
        let t0 = tokio::time::Instant::now();
        assert_eq!(
            lines(w.next().await),
            vec![("BOOKMARK".into(), "".into(), "15".into())]
        );
        assert!(t0.elapsed() >= Duration::from_secs(60));
        assert_eq!(
            lines(w.next().await),
            vec![("BOOKMARK".into(), "".into(), "15".into())]
        );
        cache.apply(vec![put(&c, "b", "n1", 16)], 16, false);
        assert_eq!(
            lines(w.next().await),
            vec![("ADDED".into(), "b".into(), "16".into())]
        );
        // At the timeout (150 s): a last bookmark, then the end.
        assert_eq!(
            lines(w.next().await),
            vec![("BOOKMARK".into(), "".into(), "16".into())]
        );
        assert!(t0.elapsed() >= Duration::from_secs(150) - Duration::from_millis(1));
        assert!(w.next().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_always_has_events_still_gets_bookmarks_and_times_out() {
        let cache = new_cache(1000);
        let c = codec();
        let mut w = watch(
            &cache,
            "",
            WatchStart::After(10),
            params(true, Some(Duration::from_secs(150))),
        );
        let mut bookmarks = 0;
        for i in 0..300 {
            // An event is waiting every time the client asks for more.
            cache.apply(vec![put(&c, "a", "n1", 11 + i)], 11 + i, false);
            tokio::time::advance(Duration::from_secs(1)).await;
            match w.next().await {
                Some(chunk) => {
                    bookmarks += lines(Some(chunk))
                        .iter()
                        .filter(|l| l.0 == "BOOKMARK")
                        .count();
                }
                None => {
                    assert_eq!(i, 150, "ended right after the 150 s timeout");
                    assert_eq!(bookmarks, 3, "at 60 s, 120 s and the final one");
                    return;
                }
            }
        }
        panic!("the stream never timed out");
    }

    #[tokio::test(start_paused = true)]
    async fn close_ends_waiting_routed_and_unrouted_watchers() {
        let cache = new_cache(100);
        let mut tasks = Vec::new();
        for field in ["", "spec.nodeName=n1", "metadata.name=a"] {
            let mut w = watch(&cache, field, WatchStart::Now, params(true, None));
            tasks.push(tokio::spawn(async move { w.next().await }));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        cache.close();
        for t in tasks {
            let ended = tokio::time::timeout(Duration::from_secs(1), t).await;
            assert!(matches!(ended, Ok(Ok(None))), "ended at once: {ended:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn relist_diff_becomes_ordered_events() {
        let cache = Arc::new(WatchCache::new(codec(), "pods".into(), 100));
        let c = codec();
        cache.init(
            vec![
                obj(&c, "a", "n1", 5),
                obj(&c, "b", "n1", 6),
                obj(&c, "c", "n1", 7),
            ],
            10,
        );
        let mut w = watch(&cache, "", WatchStart::After(10), params(false, None));
        // Relist at 20: d added at 14, b deleted, a modified at 12, c unchanged.
        let listed = vec![
            obj(&c, "a", "n2", 12),
            obj(&c, "c", "n1", 7),
            obj(&c, "d", "n1", 14),
        ];
        let changes = cache.diff(listed, 20);
        cache.apply(changes, 20, true);
        assert_eq!(
            lines(w.next().await),
            vec![
                ("MODIFIED".into(), "a".into(), "12".into()),
                ("ADDED".into(), "d".into(), "14".into()),
                ("DELETED".into(), "b".into(), "20".into()),
            ]
        );
        assert_eq!(cache.resource_version(), 20);
        assert!(
            cache.snapshot_at(15).is_none(),
            "pre-relist states are not exact"
        );
        assert_eq!(cache.snapshot_at(20).map(|s| s.len()), Some(3));
    }

    #[tokio::test(start_paused = true)]
    async fn snapshots_per_revision_within_one_batch_and_rv_waits() {
        let cache = new_cache(100);
        let c = codec();
        cache.apply(
            vec![
                put(&c, "a", "n1", 11),
                put(&c, "b", "n1", 12),
                put(&c, "a", "n2", 13),
            ],
            13,
            false,
        );
        let at = |rv| {
            cache.snapshot_at(rv).map(|s| {
                (
                    s.len(),
                    s.get(&c.key(Some("ns"), "a")).map(|o| o.mod_revision),
                )
            })
        };
        assert_eq!(at(10), Some((0, None)));
        assert_eq!(at(11), Some((1, Some(11))));
        assert_eq!(at(12), Some((2, Some(11))));
        assert_eq!(at(13), Some((2, Some(13))));
        assert_eq!(at(9), None);
        let cancel = CancellationToken::new();
        assert!(!cache.wait_for_rv(14, Duration::from_secs(3), &cancel).await);
        let c2 = Arc::clone(&cache);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            c2.advance(14);
        });
        assert!(cache.wait_for_rv(14, Duration::from_secs(3), &cancel).await);
    }

    /// One revision per write (as kube-apiserver writes): one snapshot is
    /// kept per `SNAPSHOT_EVERY_EVENTS` events, and every revision of the
    /// history still reads exactly (the events after the kept one replayed,
    /// labels index included); revisions whose events left the history
    /// read as gone.
    #[tokio::test(start_paused = true)]
    async fn sparse_snapshots_still_read_every_revision_exactly() {
        let cache = new_cache(500);
        let c = codec();
        // Revisions 11..=310: p0..p99 created, then p0..p199 mod 100 moved
        // to node n2 (the field index changes).
        for rv in 11..=310 {
            let i = (rv - 11) % 100;
            let node = if rv <= 110 { "n1" } else { "n2" };
            cache.apply(vec![put(&c, &format!("p{i}"), node, rv)], rv, false);
        }
        let kept = cache.recent.lock().len() as u64;
        assert!(
            kept <= 300 / SNAPSHOT_EVERY_EVENTS + 2,
            "{kept} snapshots kept"
        );
        let n2 = IndexKey::Field("spec.nodeName".into(), "n2".into());
        for rv in 10..=310i64 {
            let s = cache.snapshot_at(rv).expect("in the history");
            let want_len = (rv - 10).clamp(0, 100) as usize;
            let want_n2 = (rv - 110).clamp(0, 100) as usize;
            assert_eq!(s.len(), want_len, "objects at {rv}");
            let in_n2 = s.index_lookup(&n2).map_or(0, |set| set.len());
            assert_eq!(in_n2, want_n2, "n2 index at {rv}");
            assert_eq!(s.rv, rv.max(10), "rv of the state at {rv}");
        }
        // A small history (capacity 50): older revisions are gone.
        let small = new_cache(50);
        for rv in 11..=310 {
            let i = (rv - 11) % 100;
            small.apply(vec![put(&c, &format!("p{i}"), "n1", rv)], rv, false);
        }
        assert!(small.snapshot_at(100).is_none());
        assert_eq!(small.snapshot_at(300).map(|s| s.len()), Some(100));
    }
}

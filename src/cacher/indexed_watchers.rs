//! `IndexedWatchers`: which watchers an event wakes (Kubernetes'
//! `indexedWatchers` / `dispatchEvent` in the cacher).
//!
//! A watcher whose [`SelectionPredicate`](super::SelectionPredicate) names an
//! exact fact (an index field, the name, a label, the namespace) registers on
//! the [`Route`] of that fact; every applied event is logged in the routes of
//! the facts its old or new object carries, and only those routes are woken.
//! Watchers without a route share one channel woken on every batch. The
//! events themselves stay in the history ring: a route logs sequence numbers.
//!
//! A shard selector is a route too: its ranges sit in a list sorted by
//! start, where an event's hash finds the routes it belongs to, so an event
//! costs one hash and a walk over the distinct selectors (not the watchers)
//! whose ranges start at or below it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use futures::task::AtomicWaker;
use parking_lot::Mutex;

use super::history::HistoryEvent;
use super::snapshot::{IndexKey, route_keys};
use crate::object::Object;
use crate::object::sharding::{ShardField, hash_field};

/// A watch route: the sequence numbers of retained events whose old or new
/// object carries the route's key, and a wake-up channel.
///
/// The log only holds events applied after the route was created
/// (`created_seq`); a watcher starting from an older RV reads the full
/// history up to `created_seq` first (see `WatchCache::read_route`).
#[derive(Debug)]
pub struct Route {
    /// The fact its watchers select on (its key in the routes map).
    key: IndexKey,
    log: Mutex<RouteLog>,
    /// One past the newest sequence number logged.
    end_seq: AtomicU64,
    wakers: Wakers,
    /// History sequence number at creation: events from here on are logged.
    pub(crate) created_seq: u64,
}

#[derive(Debug, Default)]
struct RouteLog {
    seqs: VecDeque<u64>,
    /// Largest seq dropped from `seqs` because the history evicted it.
    trimmed_max: Option<u64>,
}

/// A route's log no longer holds events the cursor still needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Trimmed;

impl Route {
    /// `f` over the logged sequence numbers from `cursor` on, under the
    /// log's lock (callers holding the history's lock take it first, as
    /// every reader does).
    pub(crate) fn with_seqs_from<R>(
        &self,
        cursor: u64,
        f: impl FnOnce(&mut dyn Iterator<Item = u64>) -> R,
    ) -> Result<R, Trimmed> {
        let log = self.log.lock();
        if log.trimmed_max.is_some_and(|t| t >= cursor) {
            return Err(Trimmed);
        }
        let from = log.seqs.partition_point(|s| *s < cursor);
        Ok(f(&mut log.seqs.range(from..).copied()))
    }

    /// One past the newest sequence number logged (0 before any).
    pub(crate) fn end_seq(&self) -> u64 {
        self.end_seq.load(Ordering::Acquire)
    }

    fn log(&self, seq: u64, first_retained: u64) {
        let mut log = self.log.lock();
        log.seqs.push_back(seq);
        self.end_seq.store(seq + 1, Ordering::Release);
        while log.seqs.front().is_some_and(|s| *s < first_retained) {
            log.trimmed_max = log.seqs.pop_front();
        }
    }
}

/// The wakers of a set of watchers. Each watcher registers its task in its
/// own `AtomicWaker`, so waiting takes no lock that other watchers share
/// (a `watch` channel's waiters sit in one mutex-guarded list); an apply
/// takes this list's lock once to wake them all.
#[derive(Debug, Default)]
pub(crate) struct Wakers(Mutex<Vec<Arc<AtomicWaker>>>);

impl Wakers {
    fn subscribe(&self) -> Arc<AtomicWaker> {
        let w = Arc::new(AtomicWaker::new());
        self.0.lock().push(Arc::clone(&w));
        w
    }

    /// Removes `w`; returns how many are left.
    fn unsubscribe(&self, w: &Arc<AtomicWaker>) -> usize {
        let mut list = self.0.lock();
        if let Some(i) = list.iter().position(|x| Arc::ptr_eq(x, w)) {
            list.swap_remove(i);
        }
        list.len()
    }

    fn wake_all(&self) {
        for w in self.0.lock().iter() {
            w.wake();
        }
    }
}

/// The routes of one resource and the wakers of unrouted watchers.
///
/// Callers serialise [`register`](Self::register), [`dispatch`](Self::dispatch),
/// [`close`](Self::close) and the [`unregister`](Self::unregister) of a
/// routed watcher (the watch cache's apply lock), so a route is never
/// created between an event being logged and the snapshot that contains it
/// being published, nor removed while a watcher joins it.
#[derive(Debug)]
pub(crate) struct IndexedWatchers {
    routes: DashMap<IndexKey, Arc<Route>>,
    /// The ranges of the shard routes, sorted by (field, start).
    shards: Mutex<Vec<ShardEntry>>,
    /// Woken on every applied batch (watchers without a route).
    all: Wakers,
}

/// One range of a shard route.
#[derive(Debug)]
struct ShardEntry {
    field: ShardField,
    start: u128,
    end: u128,
    route: Arc<Route>,
}

/// The hash of an object's shard fields, each computed once per event.
#[derive(Default)]
struct EventHashes {
    uid: Option<u128>,
    namespace: Option<u128>,
}

impl EventHashes {
    fn of(&mut self, field: ShardField, o: &Object) -> u128 {
        let (slot, value) = match field {
            ShardField::Uid => (&mut self.uid, o.uid.as_deref()),
            ShardField::Namespace => (&mut self.namespace, o.namespace.as_deref()),
        };
        *slot.get_or_insert_with(|| u128::from(hash_field(value.unwrap_or(""))))
    }
}

impl IndexedWatchers {
    pub(crate) fn new() -> IndexedWatchers {
        IndexedWatchers {
            routes: DashMap::new(),
            shards: Mutex::new(Vec::new()),
            all: Wakers::default(),
        }
    }

    /// The route of `key` (created, logging from `next_seq`, if new) and a
    /// receiver woken when it gets events; `None`: the all-events channel.
    pub(crate) fn register(
        &self,
        key: Option<IndexKey>,
        next_seq: u64,
    ) -> (Option<Arc<Route>>, Arc<AtomicWaker>) {
        match key {
            Some(k) => {
                let mut created = false;
                let route = Arc::clone(
                    self.routes
                        .entry(k.clone())
                        .or_insert_with(|| {
                            created = true;
                            Arc::new(Route {
                                key: k,
                                log: Mutex::new(RouteLog::default()),
                                end_seq: AtomicU64::new(0),
                                wakers: Wakers::default(),
                                created_seq: next_seq,
                            })
                        })
                        .value(),
                );
                if created && let IndexKey::Shard(sel) = &route.key {
                    let mut shards = self.shards.lock();
                    for r in sel.ranges() {
                        shards.push(ShardEntry {
                            field: sel.field(),
                            start: r.start,
                            end: r.end,
                            route: Arc::clone(&route),
                        });
                    }
                    shards.sort_by_key(|e| (e.field, e.start));
                }
                let waker = route.wakers.subscribe();
                (Some(route), waker)
            }
            None => (None, self.all.subscribe()),
        }
    }

    /// Forgets the watcher woken through `waker`; frees its route when it
    /// was the route's last.
    pub(crate) fn unregister(&self, route: Option<&Route>, waker: &Arc<AtomicWaker>) {
        match route {
            Some(route) => {
                if route.wakers.unsubscribe(waker) == 0 {
                    self.routes.remove(&route.key);
                    if matches!(route.key, IndexKey::Shard(_)) {
                        self.shards
                            .lock()
                            .retain(|e| !std::ptr::eq(Arc::as_ptr(&e.route), route));
                    }
                }
            }
            None => {
                self.all.unsubscribe(waker);
            }
        }
    }

    /// Logs each event in the routes its old and new object belong to;
    /// returns the routes to wake. `first_retained`: the history's oldest
    /// sequence number (older log entries are trimmed).
    pub(crate) fn dispatch(
        &self,
        events: &[Arc<HistoryEvent>],
        first_retained: u64,
        index_paths: &[Arc<str>],
    ) -> Vec<Arc<Route>> {
        let mut woken: Vec<Arc<Route>> = Vec::new();
        if self.routes.is_empty() {
            return woken;
        }
        let shards = self.shards.lock();
        for ev in events {
            let mut keys: Vec<IndexKey> = Vec::new();
            if let Some(o) = &ev.object {
                keys.extend(route_keys(o, index_paths));
            }
            if let Some(p) = &ev.prev {
                for k in route_keys(p, index_paths) {
                    if !keys.contains(&k) {
                        keys.push(k);
                    }
                }
            }
            for k in keys {
                if let Some(route) = self.routes.get(&k) {
                    route.log(ev.seq, first_retained);
                    if !woken.iter().any(|r| Arc::ptr_eq(r, &route)) {
                        woken.push(Arc::clone(&route));
                    }
                }
            }
            // An object keeps its uid and namespace: either side hashes alike.
            if !shards.is_empty()
                && let Some(o) = ev.object.as_deref().or(ev.prev.as_deref())
            {
                Self::dispatch_shards(&shards, o, ev.seq, first_retained, &mut woken);
            }
        }
        woken
    }

    /// Logs `seq` in every shard route whose ranges hold `o`'s hash.
    fn dispatch_shards(
        shards: &[ShardEntry],
        o: &Object,
        seq: u64,
        first_retained: u64,
        woken: &mut Vec<Arc<Route>>,
    ) {
        let mut hashes = EventHashes::default();
        let mut logged: Vec<&Arc<Route>> = Vec::new();
        let mut i = 0;
        while i < shards.len() {
            let field = shards[i].field;
            let h = hashes.of(field, o);
            // This field's entries starting at or below the hash.
            let end = i + shards[i..].partition_point(|e| e.field == field && e.start <= h);
            for e in &shards[i..end] {
                if h < e.end && !logged.iter().any(|r| Arc::ptr_eq(r, &e.route)) {
                    e.route.log(seq, first_retained);
                    logged.push(&e.route);
                    if !woken.iter().any(|r| Arc::ptr_eq(r, &e.route)) {
                        woken.push(Arc::clone(&e.route));
                    }
                }
            }
            // On to the next field's entries.
            i = end + shards[end..].partition_point(|e| e.field == field);
        }
    }

    /// Wakes `woken` and every unrouted watcher (after the apply has
    /// published its sequence numbers).
    pub(crate) fn wake(&self, woken: Vec<Arc<Route>>) {
        for r in woken {
            r.wakers.wake_all();
        }
        self.all.wake_all();
    }

    /// Wakes every watcher for good (shutdown: they see the closed flag).
    pub(crate) fn close(&self) {
        self.all.wake_all();
        for route in self.routes.iter() {
            route.wakers.wake_all();
        }
    }

    /// Ranges in the shard index.
    #[cfg(test)]
    pub(crate) fn shard_entries(&self) -> usize {
        self.shards.lock().len()
    }

    /// Routes alive (watchers registered on an exact fact).
    #[cfg(test)]
    pub(crate) fn route_count(&self) -> usize {
        self.routes.len()
    }
}

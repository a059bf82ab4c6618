//! `KvCache`: the raw watch cache of one etcd key prefix for the gRPC front.
//!
//! The Kubernetes [`crate::cacher::WatchCache`] holds decoded objects only;
//! etcd clients need what etcd itself answers: every key (also values that
//! are not Kubernetes objects), the exact stored bytes (before any
//! encryption transformer), `version`, `lease`, `create_revision`,
//! `mod_revision` and `prev_kv`. So this cache keeps etcd's own `KeyValue`s:
//! a persistent ordered map (key -> KeyValue) per revision for Range, and a
//! fixed-capacity ring of events (with prev_kv) that watchers read through a
//! cursor at their own pace. An event's prev_kv is the map's entry for its
//! key: etcd is not asked for it (docs/DESIGN.md section 3).
//!
//! It is fed like the [`crate::cacher::Reflector`]: list in pages at one
//! revision, then one etcd watch from the next revision (progress notify,
//! no prev_kv), resumed with backoff when it breaks; when etcd compacted past
//! it, the cache relists and starts a new epoch (watchers of the old one are
//! canceled with `compact_revision`, as etcd does). One etcd watch per
//! prefix, however many clients.

use std::collections::VecDeque;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use etcd_client::proto::{PbEvent, PbKeyValue, PbResponseHeader};
use imbl::OrdMap;
use parking_lot::{Mutex, RwLock};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::backoff::Backoff;
use crate::storage::{RawWatchItem, Storage, StorageError, prefix_range_end};

const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A silent watch is asked for progress after this long, and restarted if
/// it stays silent as long again (as the reflector does).
const PROGRESS_INTERVAL: Duration = Duration::from_secs(5);
const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// etcd's event types (mvccpb.Event.EventType).
pub const PUT: i32 = 0;
pub const DELETE: i32 = 1;

/// The keys of one revision range, as a persistent map.
pub type KvMap = OrdMap<Vec<u8>, Arc<PbKeyValue>>;

/// The cluster identity of etcd's response headers, learnt from every etcd
/// response the front sees (cache-served answers carry it too).
#[derive(Debug, Default)]
pub struct HeaderSource {
    latest: Mutex<PbResponseHeader>,
}

impl HeaderSource {
    pub fn learn(&self, h: &PbResponseHeader) {
        let mut l = self.latest.lock();
        l.cluster_id = h.cluster_id;
        l.member_id = h.member_id;
        l.raft_term = l.raft_term.max(h.raft_term);
    }

    /// etcd's cluster/member ids and raft term with `revision`.
    pub fn header(&self, revision: i64) -> PbResponseHeader {
        let l = self.latest.lock();
        PbResponseHeader {
            cluster_id: l.cluster_id,
            member_id: l.member_id,
            raft_term: l.raft_term,
            revision,
        }
    }
}

/// One event of the ring: etcd's event, its KeyValues shared (`Arc`) with
/// the maps instead of copied.
#[derive(Debug)]
pub struct RingEvent {
    /// `PUT` or `DELETE`.
    pub r#type: i32,
    pub kv: Arc<PbKeyValue>,
    pub prev_kv: Option<Arc<PbKeyValue>>,
}

impl RingEvent {
    pub fn mod_revision(&self) -> i64 {
        self.kv.mod_revision
    }

    /// The event as etcd sends it, with or without `prev_kv`.
    pub fn to_pb(&self, with_prev_kv: bool) -> PbEvent {
        PbEvent {
            r#type: self.r#type,
            kv: Some(PbKeyValue::clone(&self.kv)),
            prev_kv: if with_prev_kv {
                self.prev_kv.as_deref().cloned()
            } else {
                None
            },
        }
    }

    /// About its encoded size (keys and values).
    fn size(&self) -> usize {
        let kv = |kv: &PbKeyValue| kv.key.len() + kv.value.len() + 32;
        kv(&self.kv) + self.prev_kv.as_deref().map_or(0, kv)
    }
}

/// Where a watcher reads: an event sequence number and the epoch it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub epoch: u64,
    pub seq: u64,
}

/// What a watcher finds at its cursor.
#[derive(Debug)]
pub enum Read {
    /// Events from the cursor on (whole revisions); `next` is where to read next.
    Events {
        events: Vec<Arc<RingEvent>>,
        next: Cursor,
    },
    /// Nothing new: every event up to `revision` was read.
    UpToDate { revision: i64 },
    /// The cursor's events are gone (ring overrun, or a relist): the watch
    /// must be canceled with this `compact_revision`.
    Gone { compact_revision: i64 },
}

struct State {
    ready: bool,
    /// Increases on every (re)list: cursors of an older epoch are gone.
    epoch: u64,
    /// The revision the cache is at (events and progress applied).
    rev: i64,
    /// Every event with a revision above this is in the ring.
    start_rev: i64,
    /// Compaction revision that ended the previous epoch (for its watchers).
    epoch_compacted: i64,
    /// Oldest first; `(revision, map)`: the map is the state from that
    /// revision until the next entry's (the last: until `rev`).
    snapshots: VecDeque<(i64, KvMap)>,
    ring: VecDeque<(i64, Arc<RingEvent>)>,
    /// Sequence number of `ring[0]`.
    first_seq: u64,
}

impl State {
    fn next_seq(&self) -> u64 {
        self.first_seq + self.ring.len() as u64
    }
    fn current(&self) -> KvMap {
        self.snapshots
            .back()
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }
}

/// The raw cache of one prefix. Shared as `Arc<KvCache>`.
pub struct KvCache {
    prefix: Vec<u8>,
    range_end: Vec<u8>,
    capacity: usize,
    state: RwLock<State>,
    /// Bumped on every change of any cache of the front (events, progress,
    /// relist), so watch streams wake and read from their cursors.
    changes: Arc<watch::Sender<u64>>,
    /// This cache's revision, for waits.
    rev_tx: watch::Sender<i64>,
    ready: AtomicBool,
    /// Asks the feeding watch for a progress notification (consistent reads).
    progress: Notify,
    headers: Arc<HeaderSource>,
}

impl std::fmt::Debug for KvCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvCache")
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .field("rev", &self.revision())
            .finish_non_exhaustive()
    }
}

impl KvCache {
    /// A cache of every key under `prefix`, not yet filled (see [`KvCache::run`]).
    pub fn new(
        prefix: &str,
        capacity: usize,
        changes: Arc<watch::Sender<u64>>,
        headers: Arc<HeaderSource>,
    ) -> KvCache {
        KvCache {
            prefix: prefix.as_bytes().to_vec(),
            range_end: prefix_range_end(prefix),
            capacity: capacity.max(1),
            state: RwLock::new(State {
                ready: false,
                epoch: 0,
                rev: 0,
                start_rev: 0,
                epoch_compacted: 0,
                snapshots: VecDeque::new(),
                ring: VecDeque::new(),
                first_seq: 0,
            }),
            changes,
            rev_tx: watch::Sender::new(0),
            ready: AtomicBool::new(false),
            progress: Notify::new(),
            headers,
        }
    }

    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub fn revision(&self) -> i64 {
        self.state.read().rev
    }

    /// Whether `[key, range_end)` (etcd's range semantics: empty end = the
    /// one key; `"\0"` = from key on) lies inside this prefix.
    pub fn contains_range(&self, key: &[u8], range_end: &[u8]) -> bool {
        if key.is_empty() || !key.starts_with(&self.prefix) {
            return false;
        }
        match range_end {
            [] => true,
            [0] => false,
            end => end <= self.range_end.as_slice() && key < end,
        }
    }

    /// Where a watch from `start_revision` (> 0) starts in the ring: `None`
    /// when the cache is not ready or the ring no longer holds that revision
    /// (the caller asks etcd). A revision beyond the cache starts at the
    /// ring's end (the watcher skips events below its start).
    pub fn cursor_at(&self, start_revision: i64) -> Option<(Cursor, i64)> {
        let s = self.state.read();
        if !s.ready || start_revision <= s.start_rev {
            return None;
        }
        let idx = s.ring.partition_point(|(rev, _)| *rev < start_revision);
        Some((
            Cursor {
                epoch: s.epoch,
                seq: s.first_seq + idx as u64,
            },
            s.rev,
        ))
    }

    /// The cursor after every event so far, and the revision it stands at.
    pub fn cursor_now(&self) -> Option<(Cursor, i64)> {
        let s = self.state.read();
        s.ready.then(|| {
            (
                Cursor {
                    epoch: s.epoch,
                    seq: s.next_seq(),
                },
                s.rev,
            )
        })
    }

    /// Events from `cursor` on: whole revisions, at least one, stopping once
    /// `max_events` or about `max_bytes` of keys and values are gathered.
    pub fn read(&self, cursor: Cursor, max_events: usize, max_bytes: usize) -> Read {
        let s = self.state.read();
        if cursor.epoch != s.epoch {
            return Read::Gone {
                compact_revision: s.epoch_compacted,
            };
        }
        if cursor.seq < s.first_seq {
            return Read::Gone {
                compact_revision: s.start_rev + 1,
            };
        }
        let idx = (cursor.seq - s.first_seq) as usize;
        if idx >= s.ring.len() {
            return Read::UpToDate { revision: s.rev };
        }
        let mut events = Vec::new();
        let mut last_rev = 0;
        let mut bytes = 0;
        for (rev, ev) in s.ring.range(idx..) {
            if (events.len() >= max_events || bytes >= max_bytes) && *rev != last_rev {
                break;
            }
            last_rev = *rev;
            bytes += ev.size();
            events.push(Arc::clone(ev));
        }
        let next = Cursor {
            epoch: cursor.epoch,
            seq: cursor.seq + events.len() as u64,
        };
        Read::Events { events, next }
    }

    /// The map at `revision` (0 = current) and the cache's current
    /// revision, if the cache holds that revision.
    pub fn snapshot(&self, revision: i64) -> Option<(KvMap, i64)> {
        let s = self.state.read();
        if !s.ready || revision > s.rev {
            return None;
        }
        if revision == 0 {
            return Some((s.current(), s.rev));
        }
        let idx = s.snapshots.partition_point(|(r, _)| *r <= revision);
        if idx == 0 {
            return None;
        }
        s.snapshots.get(idx - 1).map(|(_, m)| (m.clone(), s.rev))
    }

    /// Asks the feeding etcd watch for a progress notification, so a quiet
    /// prefix's revision catches up with etcd's.
    pub fn request_progress(&self) {
        self.progress.notify_one();
    }

    /// Waits (at most `timeout`) until the cache has reached `rev`, asking
    /// its etcd watch for progress so a quiet prefix catches up too.
    pub async fn wait_for_rev(&self, rev: i64, timeout: Duration) -> bool {
        let mut rx = self.rev_tx.subscribe();
        if *rx.borrow_and_update() >= rev {
            return true;
        }
        self.progress.notify_one();
        tokio::time::timeout(timeout, rx.wait_for(|r| *r >= rev))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Keeps the cache filled until `shutdown`.
    pub async fn run(
        self: Arc<Self>,
        storage: Storage,
        page_size: i64,
        shutdown: CancellationToken,
    ) {
        let span = info_span!("kv_cache", prefix = %String::from_utf8_lossy(&self.prefix));
        async move {
            let mut backoff = Backoff::new(BACKOFF_START, BACKOFF_MAX).with_jitter();
            let mut need_list = true;
            let mut compacted = 0;
            loop {
                if shutdown.is_cancelled() {
                    return;
                }
                if need_list {
                    match self.list(&storage, page_size.max(1)).await {
                        Ok((map, rev)) => {
                            info!(rev, keys = map.len(), "raw cache listed");
                            self.reset(map, rev, compacted);
                            need_list = false;
                            backoff.reset();
                        }
                        Err(e) => {
                            let wait = backoff.step();
                            warn!(error = %e, backoff_ms = wait.as_millis() as u64, "raw cache list failed; backing off");
                            if sleep(&shutdown, wait).await {
                                return;
                            }
                            continue;
                        }
                    }
                }
                match self.watch(&storage, &shutdown, &mut backoff).await {
                    Ok(()) => return,
                    Err(StorageError::Compacted { compacted: c, .. }) => {
                        info!(compacted = c, "raw cache watch compacted; relisting");
                        compacted = c;
                        need_list = true;
                    }
                    Err(e) => {
                        let wait = backoff.step();
                        info!(error = %e, backoff_ms = wait.as_millis() as u64, "raw cache watch ended; resuming");
                        if sleep(&shutdown, wait).await {
                            return;
                        }
                    }
                }
            }
        }
        .instrument(span)
        .await
    }

    /// The whole prefix at one revision, in pages.
    async fn list(&self, storage: &Storage, page_size: i64) -> Result<(KvMap, i64), StorageError> {
        let mut map = KvMap::new();
        let mut start = self.prefix.clone();
        let mut rev = 0;
        loop {
            let page = storage
                .range_raw(&start, &self.range_end, rev, page_size)
                .await?;
            if let Some(h) = &page.header {
                self.headers.learn(h);
                if rev == 0 {
                    rev = h.revision;
                }
            }
            let more = page.more;
            let mut last = None;
            for kv in page.kvs {
                last = Some(kv.key.clone());
                map.insert(kv.key.clone(), Arc::new(kv));
            }
            match last {
                Some(mut k) if more => {
                    k.push(0);
                    start = k;
                }
                _ => return Ok((map, rev)),
            }
        }
    }

    /// Starts a new epoch from a fresh list.
    fn reset(&self, map: KvMap, rev: i64, compacted: i64) {
        {
            let mut s = self.state.write();
            let next = s.next_seq();
            s.epoch += 1;
            s.epoch_compacted = compacted;
            s.rev = rev;
            s.start_rev = rev;
            s.ring.clear();
            s.first_seq = next;
            s.snapshots.clear();
            s.snapshots.push_back((rev, map));
            s.ready = true;
        }
        self.ready.store(true, Ordering::Release);
        self.rev_tx.send_replace(rev);
        self.changes.send_modify(|g| *g += 1);
    }

    /// A ready, empty cache at `rev`, as after a list (for other modules' tests).
    #[cfg(test)]
    pub(crate) fn reset_for_test(&self, rev: i64) {
        self.reset(KvMap::new(), rev, 0);
    }

    /// One etcd watch from the cache's revision + 1 until it ends; `Ok` on shutdown.
    async fn watch(
        &self,
        storage: &Storage,
        shutdown: &CancellationToken,
        backoff: &mut Backoff,
    ) -> Result<(), StorageError> {
        let from = self.revision() + 1;
        let mut w = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            w = storage.watch_raw(&self.prefix, &self.range_end, from, false) => w?,
        };
        debug!(from, "raw cache watching");
        let mut last_msg = Instant::now();
        let mut progress_requested: Option<Instant> = None;
        loop {
            let idle_at = match progress_requested {
                None => last_msg + PROGRESS_INTERVAL,
                Some(t) => t + IDLE_TIMEOUT,
            };
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = self.progress.notified() => {
                    w.request_progress().await?;
                    progress_requested.get_or_insert_with(Instant::now);
                }
                _ = tokio::time::sleep_until(idle_at) => {
                    if progress_requested.is_some() {
                        return Err(StorageError::Unavailable("watch silent after a progress request".into()));
                    }
                    w.request_progress().await?;
                    progress_requested = Some(Instant::now());
                }
                item = w.next() => {
                    let item = item?;
                    last_msg = Instant::now();
                    progress_requested = None;
                    backoff.reset();
                    match item {
                        RawWatchItem::Progress { header, revision } => {
                            self.headers.learn(&header);
                            self.advance(revision);
                        }
                        RawWatchItem::Events { header, events, revision } => {
                            self.headers.learn(&header);
                            self.apply(events, revision);
                        }
                    }
                }
            }
        }
    }

    /// Every event up to `revision` was delivered: the cache is at it.
    fn advance(&self, revision: i64) {
        {
            let mut s = self.state.write();
            if revision <= s.rev {
                return;
            }
            s.rev = revision;
        }
        self.rev_tx.send_replace(revision);
        self.changes.send_modify(|g| *g += 1);
    }

    /// Applies one etcd watch response: the map, a snapshot per revision,
    /// the ring (oldest events evicted beyond capacity).
    pub(crate) fn apply(&self, events: Vec<PbEvent>, revision: i64) {
        {
            let mut s = self.state.write();
            let mut map = s.current();
            let mut map_rev = 0;
            for ev in events {
                let Some(kv) = ev.kv else { continue };
                let rev = kv.mod_revision;
                if rev <= s.rev {
                    continue; // already applied (a resumed watch)
                }
                if map_rev != 0 && rev != map_rev {
                    push_snapshot(&mut s, map_rev, map.clone(), self.capacity);
                }
                map_rev = rev;
                // The key's previous value is the map's entry (the cache holds
                // the whole range); etcd's prev_kv, if it sent one, is the same.
                let prev_kv = map.get(kv.key.as_slice()).cloned();
                let kv = Arc::new(kv);
                if ev.r#type == DELETE {
                    map.remove(kv.key.as_slice());
                } else {
                    map.insert(kv.key.clone(), Arc::clone(&kv));
                }
                let event = RingEvent {
                    r#type: ev.r#type,
                    kv,
                    prev_kv,
                };
                s.ring.push_back((rev, Arc::new(event)));
                while s.ring.len() > self.capacity {
                    if let Some((evicted, _)) = s.ring.pop_front() {
                        s.first_seq += 1;
                        s.start_rev = s.start_rev.max(evicted);
                    }
                }
            }
            if map_rev != 0 {
                push_snapshot(&mut s, map_rev, map, self.capacity);
            }
            s.rev = s.rev.max(revision);
        }
        self.rev_tx.send_replace(self.revision());
        self.changes.send_modify(|g| *g += 1);
    }
}

fn push_snapshot(s: &mut State, rev: i64, map: KvMap, capacity: usize) {
    s.snapshots.push_back((rev, map));
    while s.snapshots.len() > capacity {
        s.snapshots.pop_front();
    }
}

/// Sleeps unless shut down first; true = shut down.
async fn sleep(shutdown: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = shutdown.cancelled() => true,
        _ = tokio::time::sleep(d) => false,
    }
}

/// The keys of `map` in `[key, range_end)` (etcd's semantics, see
/// [`KvCache::contains_range`]), in key order.
pub fn range_iter<'a>(
    map: &'a KvMap,
    key: &'a [u8],
    range_end: &'a [u8],
) -> Box<dyn Iterator<Item = &'a Arc<PbKeyValue>> + 'a> {
    match range_end {
        [] => Box::new(map.get(key).into_iter()),
        [0] => Box::new(
            map.range::<_, [u8]>((Bound::Included(key), Bound::Unbounded))
                .map(|(_, v)| v),
        ),
        end => Box::new(
            map.range::<_, [u8]>((Bound::Included(key), Bound::Excluded(end)))
                .map(|(_, v)| v),
        ),
    }
}

/// Whether `k` lies in `[key, range_end)` (etcd's semantics).
pub fn in_range(k: &[u8], key: &[u8], range_end: &[u8]) -> bool {
    match range_end {
        [] => k == key,
        [0] => k >= key,
        end => k >= key && k < end,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: &str, rev: i64, create: i64, version: i64) -> PbKeyValue {
        PbKeyValue {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            mod_revision: rev,
            create_revision: create,
            version,
            lease: 0,
        }
    }

    fn put(key: &str, value: &str, rev: i64) -> PbEvent {
        PbEvent {
            r#type: PUT,
            kv: Some(kv(key, value, rev, rev, 1)),
            prev_kv: None,
        }
    }

    fn cache(capacity: usize) -> KvCache {
        let c = KvCache::new(
            "/p/",
            capacity,
            Arc::new(watch::Sender::new(0)),
            Arc::default(),
        );
        c.reset(KvMap::new(), 10, 0);
        c
    }

    #[test]
    fn contains_range_only_inside_the_prefix() {
        let c = cache(4);
        assert!(c.contains_range(b"/p/a", b""));
        assert!(c.contains_range(b"/p/", b"/p0"));
        assert!(c.contains_range(b"/p/a", b"/p/b"));
        assert!(!c.contains_range(b"/p", b"/q"));
        assert!(!c.contains_range(b"/p/a", b"/p1"));
        assert!(!c.contains_range(b"/p/a", b"\0"));
        assert!(!c.contains_range(b"/q/a", b""));
        assert!(!c.contains_range(b"", b""));
    }

    #[test]
    fn ring_reads_whole_revisions_and_overrun_is_gone() {
        let c = cache(3);
        let (start, rev) = c.cursor_now().unwrap();
        assert_eq!(rev, 10);
        // Two events of revision 11 (a txn), one of 12.
        c.apply(vec![put("/p/a", "1", 11), put("/p/b", "1", 11)], 11);
        c.apply(vec![put("/p/c", "1", 12)], 12);
        match c.read(start, 1, usize::MAX) {
            Read::Events { events, next } => {
                assert_eq!(events.len(), 2, "a revision is never split");
                assert_eq!(next.seq, start.seq + 2);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(c.cursor_at(12).unwrap().0.seq, start.seq + 2);
        // Overrun: a 4th event evicts revision 11's first event.
        c.apply(vec![put("/p/d", "1", 13)], 13);
        assert!(matches!(
            c.read(start, 10, usize::MAX),
            Read::Gone {
                compact_revision: 12
            }
        ));
        assert!(c.cursor_at(11).is_none(), "revision 11 is no longer whole");
        assert!(c.cursor_at(12).is_some());
    }

    #[test]
    fn snapshots_answer_past_revisions() {
        let c = cache(10);
        c.apply(vec![put("/p/a", "1", 11)], 11);
        c.apply(
            vec![PbEvent {
                r#type: DELETE,
                kv: Some(kv("/p/a", "", 12, 0, 0)),
                prev_kv: None,
            }],
            12,
        );
        c.advance(15);
        let at = |r| c.snapshot(r).map(|(m, cur)| (m.len(), cur));
        assert_eq!(at(10), Some((0, 15)));
        assert_eq!(at(11), Some((1, 15)));
        assert_eq!(at(14), Some((0, 15)));
        assert_eq!(at(0), Some((0, 15)));
        assert_eq!(at(9), None, "older than the oldest snapshot");
        assert_eq!(at(16), None, "beyond the cache");
    }

    #[test]
    fn relist_ends_the_epoch() {
        let c = cache(10);
        let (cur, _) = c.cursor_now().unwrap();
        c.reset(KvMap::new(), 50, 40);
        assert!(matches!(
            c.read(cur, 10, usize::MAX),
            Read::Gone {
                compact_revision: 40
            }
        ));
    }
}

//! `History`: the ring of recent events (docs/DESIGN.md sections 4, 5).
//!
//! The ring is the fan-out medium: watchers are cursors (sequence numbers)
//! into it, so no per-watcher queue exists. Cursors are by sequence number,
//! not RV, because the events of one etcd transaction share an RV.
//!
//! Its size follows a [`HistoryPolicy`]: a fixed number of events, or, as
//! kube-apiserver sizes its watch cache, enough events to cover a minimum
//! age (doubled while the oldest event is younger than that, halved while a
//! quarter of the ring covers it), always within a byte budget.

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use tokio::time::Instant;

use crate::object::Object;
use crate::object::protobuf::ProtobufError;
use crate::object::wire::{EventType, event_line, protobuf_object_frame, protobuf_watch_frames};

/// Events a watcher reads in one drain: usually one or two (a watcher that
/// keeps up), so they live inline, not in an allocation per delivery.
pub(crate) type Events = smallvec::SmallVec<[Arc<HistoryEvent>; 4]>;

/// The kind of a cached change (the watch event type before per-watcher conversion).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Added,
    Modified,
    Deleted,
}

/// One applied change. Immutable once in the ring; the wire lines are
/// rendered lazily, once, and shared by every watcher that sends them.
#[derive(Debug)]
pub struct HistoryEvent {
    pub seq: u64,
    pub kind: EventKind,
    pub key: Arc<str>,
    /// The object after the change; `None` for `Deleted`.
    pub object: Option<Arc<Object>>,
    /// The object before the change; `None` for `Added`.
    pub prev: Option<Arc<Object>>,
    /// The etcd revision of the change (shared by the events of one txn).
    pub rv: i64,
    /// When the reflector received the change (for delivery-delay metrics).
    pub received: Instant,
    /// The wire bytes of every event before this one (see
    /// [`History::bytes_since`]).
    pub(crate) bytes_before: u64,
    added: OnceLock<Bytes>,
    modified: OnceLock<Bytes>,
    deleted: OnceLock<Bytes>,
    /// The protobuf watch frames of the added/modified/deleted lines, for
    /// protobuf watchers: encoded once, like the lines; boxed so that events
    /// no protobuf watcher reads stay small.
    frames: OnceLock<Box<[FrameCell; 3]>>,
    /// The added/modified/deleted lines in up to [`CONVERTED_FORMS`]
    /// converted forms ([`ConvertedLines`]: a metadata watch's
    /// `PartialObjectMetadata`, meta.k8s.io v1 or v1beta1, JSON or
    /// protobuf): made once, like the lines, and shared by every watcher of
    /// that form.
    converted: OnceLock<Box<[ConvertedCell; 3 * CONVERTED_FORMS]>>,
}

/// How many converted forms of its lines a history event keeps.
pub const CONVERTED_FORMS: usize = 4;

/// One converted line, made on first use (or why it cannot be).
type ConvertedCell = OnceLock<Result<Bytes, String>>;

/// JSON watch lines to the same events in a converted form, or why they
/// cannot be.
pub type LineConverter = dyn Fn(&[u8]) -> Result<Bytes, String> + Send + Sync;

/// A converted form of watch lines (kube-apiserver's
/// `PartialObjectMetadata` watch events), made by the layer above from the
/// full lines. Every watcher of one resource that gives the same `slot`
/// must give the same conversion: history events keep one line per slot.
#[derive(Clone)]
pub struct ConvertedLines {
    /// Which of an event's converted forms this is, below [`CONVERTED_FORMS`].
    pub slot: usize,
    /// JSON watch lines to the same events in this form, or why they
    /// cannot be.
    pub convert: Arc<LineConverter>,
}

impl std::fmt::Debug for ConvertedLines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConvertedLines")
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

impl HistoryEvent {
    pub fn new(
        seq: u64,
        kind: EventKind,
        key: Arc<str>,
        object: Option<Arc<Object>>,
        prev: Option<Arc<Object>>,
        rv: i64,
        received: Instant,
    ) -> HistoryEvent {
        HistoryEvent {
            seq,
            kind,
            key,
            object,
            prev,
            rv,
            received,
            bytes_before: 0,
            added: OnceLock::new(),
            modified: OnceLock::new(),
            deleted: OnceLock::new(),
            frames: OnceLock::new(),
            converted: OnceLock::new(),
        }
    }

    /// About what this event takes on the wire: its object's JSON.
    pub(crate) fn wire_bytes(&self) -> u64 {
        self.object
            .as_ref()
            .or(self.prev.as_ref())
            .map_or(0, |o| o.wire.len() as u64)
    }

    /// `ADDED` line of the new object (None when there is no new object).
    /// Borrowed: a watcher copies it into its chunk without touching the
    /// shared refcount.
    pub fn added_line(&self) -> Option<&Bytes> {
        let obj = self.object.as_ref()?;
        Some(rendered(&self.added, EventType::Added, || obj.wire.clone()))
    }

    /// `MODIFIED` line of the new object.
    pub fn modified_line(&self) -> Option<&Bytes> {
        let obj = self.object.as_ref()?;
        Some(rendered(&self.modified, EventType::Modified, || {
            obj.wire.clone()
        }))
    }

    /// `DELETED` line: the previous object at this event's RV.
    pub fn deleted_line(&self) -> Option<&Bytes> {
        let prev = self.prev.as_ref()?;
        Some(rendered(&self.deleted, EventType::Deleted, || {
            prev.wire_at(self.rv)
        }))
    }
}

impl HistoryEvent {
    /// The line of an `ADDED`, `MODIFIED` or `DELETED` event (None for
    /// other types, or when the event has no such object).
    pub fn line(&self, ty: EventType) -> Option<&Bytes> {
        match ty {
            EventType::Added => self.added_line(),
            EventType::Modified => self.modified_line(),
            EventType::Deleted => self.deleted_line(),
            EventType::Bookmark | EventType::Error => None,
        }
    }

    /// [`HistoryEvent::line`] in the converted `form`, converted on first
    /// use and kept.
    pub fn converted_line(
        &self,
        ty: EventType,
        form: &ConvertedLines,
    ) -> Option<Result<&Bytes, String>> {
        let i = match ty {
            EventType::Added => 0,
            EventType::Modified => 1,
            EventType::Deleted => 2,
            EventType::Bookmark | EventType::Error => return None,
        };
        let line = self.line(ty)?;
        let slot = form.slot.min(CONVERTED_FORMS - 1);
        let cell = &self.converted.get_or_init(Default::default)[slot * 3 + i];
        Some(
            cell.get_or_init(|| (form.convert)(line))
                .as_ref()
                .map_err(Clone::clone),
        )
    }

    /// [`HistoryEvent::line`] as a protobuf watch frame
    /// ([`protobuf_watch_frames`]); `api_version` and `kind` are the
    /// resource's. ADDED and MODIFIED frames are made from the object's
    /// cached message (shared with protobuf Gets and Lists); a DELETED one
    /// from the deleted object's, with the deletion's revision written in.
    pub fn frame(
        &self,
        ty: EventType,
        api_version: &str,
        kind: &str,
    ) -> Option<Result<&Bytes, ProtobufError>> {
        let i = match ty {
            EventType::Added => 0,
            EventType::Modified => 1,
            EventType::Deleted => 2,
            EventType::Bookmark | EventType::Error => return None,
        };
        let cell = &self.frames.get_or_init(Default::default)[i];
        let encode =
            || match (ty, &self.object, &self.prev) {
                (EventType::Added | EventType::Modified, Some(obj), _) => Some(
                    protobuf_object_frame(ty, obj, obj.mod_revision, api_version, kind),
                ),
                (EventType::Deleted, _, Some(prev)) => {
                    Some(protobuf_object_frame(ty, prev, self.rv, api_version, kind))
                }
                _ => Some(protobuf_watch_frames(self.line(ty)?)),
            };
        if cell.get().is_none() {
            let frame = encode()?;
            let _ = cell.set(frame);
        }
        cell.get().map(|r| r.as_ref().map_err(Clone::clone))
    }
}

/// One protobuf watch frame, encoded on first use (or why it cannot be).
type FrameCell = OnceLock<Result<Bytes, ProtobufError>>;

/// The line in `cell`, rendered from `object_json()` on first use.
fn rendered(cell: &OnceLock<Bytes>, ty: EventType, object_json: impl FnOnce() -> Bytes) -> &Bytes {
    cell.get_or_init(|| event_line(ty, &object_json()))
}

/// The watcher's cursor left the ring: its next event is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gone {
    /// The oldest RV a watch can still start from.
    pub oldest_rv: i64,
}

/// How many events a [`History`] keeps (docs/DESIGN.md section 4, "History").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryPolicy {
    /// `Some(n)`: exactly the last `n` events (`resources[].history_capacity`).
    pub fixed: Option<usize>,
    /// Keep at least this much time of events, within the event bounds
    /// (kube-apiserver's eventFreshDuration, 75 s).
    pub min_age: std::time::Duration,
    /// The ring's capacity never goes below this (kube-apiserver: 100) ...
    pub min_events: usize,
    /// ... nor above this (kube-apiserver: 100 * 1024).
    pub max_events: usize,
    /// The retained events' wire bytes never exceed this (the newest event
    /// is always kept).
    pub max_bytes: u64,
}

impl HistoryPolicy {
    /// kube-apiserver's defaults: 75 s, 100 to 102,400 events; 256 MiB.
    pub const DEFAULT: HistoryPolicy = HistoryPolicy {
        fixed: None,
        min_age: std::time::Duration::from_secs(75),
        min_events: 100,
        max_events: 100 * 1024,
        max_bytes: 256 << 20,
    };

    fn initial_capacity(&self) -> usize {
        match self.fixed {
            Some(n) => n.max(1),
            None => self.min_events.max(1),
        }
    }
}

/// A fixed ring of `n` events (tests, and `history_capacity`).
impl From<usize> for HistoryPolicy {
    fn from(n: usize) -> HistoryPolicy {
        HistoryPolicy {
            fixed: Some(n),
            ..HistoryPolicy::DEFAULT
        }
    }
}

/// Ring of events with monotonically increasing sequence numbers.
#[derive(Debug)]
pub struct History {
    policy: HistoryPolicy,
    capacity: usize,
    ring: VecDeque<Arc<HistoryEvent>>,
    next_seq: u64,
    /// Every event with an RV greater than this is in the ring.
    start_rv: i64,
    /// The wire bytes of every event pushed so far.
    bytes_total: u64,
}

impl History {
    pub fn new(policy: impl Into<HistoryPolicy>, start_rv: i64) -> History {
        let policy = policy.into();
        let capacity = policy.initial_capacity();
        History {
            policy,
            capacity,
            ring: VecDeque::with_capacity(capacity.min(1 << 16)),
            next_seq: 0,
            start_rv,
            bytes_total: 0,
        }
    }

    /// The ring's current capacity (the events it keeps when full).
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// The wire bytes of the retained events.
    pub fn bytes(&self) -> u64 {
        self.ring
            .front()
            .map_or(0, |e| self.bytes_total - e.bytes_before)
    }
    /// When the oldest retained event was received.
    pub fn oldest_received(&self) -> Option<Instant> {
        self.ring.front().map(|e| e.received)
    }
    pub fn len(&self) -> usize {
        self.ring.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }
    /// The sequence number the next pushed event gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }
    /// The sequence number of the oldest retained event (== next_seq when empty).
    pub fn first_seq(&self) -> u64 {
        self.ring.front().map_or(self.next_seq, |e| e.seq)
    }
    /// The oldest RV a watch can start from: all events after it are retained.
    pub fn start_rv(&self) -> i64 {
        self.start_rv
    }

    /// Moves the start forward, used when the cache is (re)initialized with an
    /// empty ring. Never moves it backwards.
    pub fn set_start_rv_if_empty(&mut self, rv: i64) {
        if self.ring.is_empty() && rv > self.start_rv {
            self.start_rv = rv;
        }
    }

    /// Appends an event, resizing the ring first as the policy says, then
    /// evicting the oldest events beyond the capacity and the byte budget.
    pub fn push(
        &mut self,
        kind: EventKind,
        key: Arc<str>,
        object: Option<Arc<Object>>,
        prev: Option<Arc<Object>>,
        rv: i64,
        received: Instant,
    ) -> Arc<HistoryEvent> {
        self.resize(received);
        let mut ev = HistoryEvent::new(self.next_seq, kind, key, object, prev, rv, received);
        ev.bytes_before = self.bytes_total;
        self.bytes_total += ev.wire_bytes();
        let ev = Arc::new(ev);
        self.next_seq += 1;
        self.ring.push_back(Arc::clone(&ev));
        while self.ring.len() > self.capacity
            || (self.ring.len() > 1 && self.bytes() > self.policy.max_bytes)
        {
            self.evict_oldest();
        }
        ev
    }

    fn evict_oldest(&mut self) {
        if let Some(old) = self.ring.pop_front() {
            // RVs are non-decreasing in seq order, so every event with a
            // larger RV is still retained.
            self.start_rv = self.start_rv.max(old.rv);
        }
    }

    /// kube-apiserver's `resizeCacheLocked`, before an event received at
    /// `now` is added to a full ring: double while the oldest event is
    /// younger than the minimum age (a burst must not cost watchers their
    /// place), halve while the newest quarter alone spans more than it.
    fn resize(&mut self, now: Instant) {
        if self.policy.fixed.is_some() || self.ring.len() < self.capacity {
            return;
        }
        let age = |e: &HistoryEvent| now.saturating_duration_since(e.received);
        let max = self.policy.max_events.max(self.policy.min_events).max(1);
        let min = self.policy.min_events.max(1);
        if self
            .ring
            .front()
            .is_some_and(|e| age(e) < self.policy.min_age)
        {
            self.capacity = (self.capacity.saturating_mul(2)).min(max);
            return;
        }
        let quarter = self.ring.len() - self.capacity / 4;
        let stale = self
            .ring
            .get(quarter.min(self.ring.len().saturating_sub(1)))
            .is_some_and(|e| age(e) > self.policy.min_age);
        if stale {
            let smaller = (self.capacity / 2).max(min);
            if smaller < self.capacity {
                self.capacity = smaller;
                while self.ring.len() >= self.capacity {
                    self.evict_oldest();
                }
                self.ring.shrink_to(self.capacity);
            }
        }
    }

    /// The event with sequence number `seq`, if retained.
    pub fn get(&self, seq: u64) -> Option<&Arc<HistoryEvent>> {
        let first = self.first_seq();
        if seq < first {
            return None;
        }
        self.ring.get(usize::try_from(seq - first).ok()?)
    }

    /// About how many bytes the events from `seq` on take on the wire (each
    /// counted as its object's JSON): how far behind a watcher at `seq` is,
    /// in the unit of `server.watch_max_buffered_bytes`. `Gone` if `seq` was
    /// evicted.
    pub fn bytes_since(&self, seq: u64) -> Result<u64, Gone> {
        match self.get(seq) {
            Some(ev) => Ok(self.bytes_total - ev.bytes_before),
            None if seq >= self.next_seq => Ok(0),
            None => Err(Gone {
                oldest_rv: self.start_rv,
            }),
        }
    }

    /// Up to `max` events from `seq` on; `Gone` if `seq` was evicted.
    pub fn read_from(&self, seq: u64, max: usize) -> Result<Events, Gone> {
        let first = self.first_seq();
        if seq < first {
            return Err(Gone {
                oldest_rv: self.start_rv,
            });
        }
        let skip = usize::try_from(seq - first).unwrap_or(usize::MAX);
        Ok(self.ring.iter().skip(skip).take(max).cloned().collect())
    }

    /// The sequence number of the first event with an RV greater than `rv`:
    /// where a watch "from RV N" starts. `Gone` if events after `rv` were evicted.
    pub fn seq_after_rv(&self, rv: i64) -> Result<u64, Gone> {
        if rv < self.start_rv {
            return Err(Gone {
                oldest_rv: self.start_rv,
            });
        }
        let idx = self.ring.partition_point(|e| e.rv <= rv);
        Ok(self.first_seq() + idx as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn obj(key: &str, rv: i64) -> Arc<Object> {
        Arc::new(Object {
            key: Arc::from(key),
            namespace: Some(Arc::from("ns")),
            name: Arc::from(key.rsplit('/').next().unwrap_or(key)),
            uid: None,
            labels: Default::default(),
            fields: vec![],
            creation_timestamp: None,
            mod_revision: rv,
            create_revision: rv,
            wire: Bytes::from(format!(
                "{{\"metadata\":{{\"name\":\"{key}\",\"resourceVersion\":\"{rv}\"}}}}"
            )),
            protobuf: Default::default(),
        })
    }

    fn push(h: &mut History, rv: i64) -> Arc<HistoryEvent> {
        h.push(
            EventKind::Added,
            Arc::from(format!("/p/ns/k{rv}")),
            Some(obj("/p/ns/k", rv)),
            None,
            rv,
            Instant::now(),
        )
    }

    #[test]
    fn seqs_increase_and_ring_evicts() {
        let mut h = History::new(3, 10);
        for rv in 11..=15 {
            push(&mut h, rv);
        }
        assert_eq!(h.len(), 3);
        assert_eq!(h.first_seq(), 2);
        assert_eq!(h.next_seq(), 5);
        assert_eq!(h.start_rv(), 12);
        assert!(h.get(1).is_none());
        assert_eq!(h.get(2).map(|e| e.rv), Some(13));
        assert_eq!(h.read_from(1, 10).unwrap_err(), Gone { oldest_rv: 12 });
        let evs = h.read_from(3, 10).unwrap();
        assert_eq!(evs.iter().map(|e| e.rv).collect::<Vec<_>>(), vec![14, 15]);
        assert!(h.read_from(5, 10).unwrap().is_empty());
    }

    #[test]
    fn bytes_since_sums_the_retained_events_from_a_seq() {
        let mut h = History::new(3, 10);
        let sizes: Vec<u64> = (11..=15)
            .map(|rv| {
                push(&mut h, rv)
                    .object
                    .as_ref()
                    .map_or(0, |o| o.wire.len() as u64)
            })
            .collect();
        // seqs 2..=4 are retained (rvs 13..=15).
        assert_eq!(h.bytes_since(5), Ok(0));
        assert_eq!(h.bytes_since(4), Ok(sizes[4]));
        assert_eq!(h.bytes_since(2), Ok(sizes[2] + sizes[3] + sizes[4]));
        assert_eq!(h.bytes_since(1), Err(Gone { oldest_rv: 12 }));
    }

    #[test]
    fn protobuf_frames_encode_once_and_fail_typed() {
        let mut pod = (*obj("/p/ns/a", 3)).clone();
        pod.wire = Bytes::from_static(
            br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","resourceVersion":"3"}}"#,
        );
        let mut h = History::new(4, 0);
        let ev = h.push(
            EventKind::Added,
            Arc::from("/p/ns/a"),
            Some(Arc::new(pod)),
            None,
            3,
            Instant::now(),
        );
        let a = ev
            .frame(EventType::Added, "v1", "Pod")
            .unwrap()
            .expect("a Pod encodes");
        let b = ev
            .frame(EventType::Added, "v1", "Pod")
            .unwrap()
            .expect("a Pod encodes");
        assert_eq!(a.as_ptr(), b.as_ptr(), "shared bytes");
        // Made from the object's cached message, byte for byte what the
        // JSON line encodes to.
        let from_line = protobuf_watch_frames(ev.added_line().unwrap()).expect("line encodes");
        assert_eq!(a, &from_line);
        let len = u32::from_be_bytes([a[0], a[1], a[2], a[3]]) as usize;
        assert_eq!(len + 4, a.len());
        let event = crate::object::protobuf::decode_watch_event(&a[4..]).expect("decodes");
        assert_eq!(event["type"], "ADDED");
        assert_eq!(event["object"]["metadata"]["name"], "a");
        assert!(
            ev.frame(EventType::Deleted, "v1", "Pod").is_none(),
            "no previous object"
        );
        // A DELETED frame carries the object at the deletion's revision.
        let mut gone = (*obj("/p/ns/a", 3)).clone();
        gone.wire = Bytes::from_static(
            br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","resourceVersion":"3"}}"#,
        );
        let del = h.push(
            EventKind::Deleted,
            Arc::from("/p/ns/a"),
            None,
            Some(Arc::new(gone)),
            5,
            Instant::now(),
        );
        let d = del
            .frame(EventType::Deleted, "v1", "Pod")
            .unwrap()
            .expect("a Pod encodes");
        let event = crate::object::protobuf::decode_watch_event(&d[4..]).expect("decodes");
        assert_eq!(event["type"], "DELETED");
        assert_eq!(event["object"]["metadata"]["resourceVersion"], "5");
        // Made from the deleted object's message with the revision written
        // in: byte for byte what its line (re-rendered JSON) encodes to.
        let from_line = protobuf_watch_frames(del.deleted_line().unwrap()).expect("line encodes");
        assert_eq!(d, &from_line);
        // An object of a type that is not built in cannot be sent as protobuf.
        let plain = h.push(
            EventKind::Added,
            Arc::from("/p/ns/b"),
            Some(obj("/p/ns/b", 4)),
            None,
            4,
            Instant::now(),
        );
        assert!(matches!(
            plain.frame(EventType::Added, "v1", "NoSuchKind"),
            Some(Err(
                crate::object::protobuf::ProtobufError::UnknownKind { .. }
            ))
        ));
    }

    #[test]
    fn seq_after_rv_handles_shared_revisions() {
        let mut h = History::new(10, 5);
        push(&mut h, 6);
        push(&mut h, 7); // a txn: three events at RV 7
        push(&mut h, 7);
        push(&mut h, 7);
        push(&mut h, 9);
        assert_eq!(h.seq_after_rv(5), Ok(0));
        assert_eq!(h.seq_after_rv(6), Ok(1));
        assert_eq!(h.seq_after_rv(7), Ok(4));
        assert_eq!(h.seq_after_rv(8), Ok(4));
        assert_eq!(h.seq_after_rv(9), Ok(5));
        assert_eq!(h.seq_after_rv(100), Ok(5));
        assert_eq!(h.seq_after_rv(4), Err(Gone { oldest_rv: 5 }));
    }

    #[test]
    fn partial_eviction_of_a_txn_keeps_later_rvs_servable() {
        let mut h = History::new(2, 5);
        push(&mut h, 7);
        push(&mut h, 7);
        push(&mut h, 8); // evicts one RV-7 event
        assert_eq!(h.start_rv(), 7);
        assert_eq!(h.seq_after_rv(6), Err(Gone { oldest_rv: 7 }));
        assert_eq!(h.seq_after_rv(7), Ok(2));
    }

    #[test]
    fn lines_render_once_and_deleted_carries_new_rv() {
        let mut h = History::new(4, 0);
        let ev = h.push(
            EventKind::Deleted,
            Arc::from("/p/ns/a"),
            None,
            Some(obj("/p/ns/a", 3)),
            9,
            Instant::now(),
        );
        let a = ev.deleted_line().unwrap();
        let b = ev.deleted_line().unwrap();
        assert_eq!(a.as_ptr(), b.as_ptr(), "shared bytes");
        let s = std::str::from_utf8(a).unwrap();
        assert!(s.starts_with("{\"type\":\"DELETED\""), "{s}");
        assert!(s.contains("\"resourceVersion\":\"9\""), "{s}");
        assert!(ev.added_line().is_none());
    }

    #[test]
    fn converted_lines_are_made_once_per_form_and_shared() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let mut h = History::new(4, 0);
        let ev = h.push(
            EventKind::Deleted,
            Arc::from("/p/ns/a"),
            None,
            Some(obj("/p/ns/a", 3)),
            9,
            Instant::now(),
        );
        let calls = Arc::new(AtomicUsize::new(0));
        let form = |slot: usize, tag: &'static str| {
            let calls = Arc::clone(&calls);
            ConvertedLines {
                slot,
                convert: Arc::new(move |line: &[u8]| {
                    calls.fetch_add(1, Ordering::SeqCst);
                    if tag.is_empty() {
                        return Err("cannot".to_string());
                    }
                    Ok(Bytes::from([tag.as_bytes(), line].concat()))
                }),
            }
        };
        let (v1, beta) = (form(0, "v1:"), form(1, "beta:"));
        let a = ev.converted_line(EventType::Deleted, &v1).unwrap().unwrap();
        let b = ev.converted_line(EventType::Deleted, &v1).unwrap().unwrap();
        assert_eq!(a.as_ptr(), b.as_ptr(), "shared bytes");
        assert!(a.starts_with(b"v1:{\"type\":\"DELETED\""));
        let c = ev
            .converted_line(EventType::Deleted, &beta)
            .unwrap()
            .unwrap();
        assert!(c.starts_with(b"beta:"));
        let failing = form(3, "");
        for _ in 0..2 {
            let e = ev.converted_line(EventType::Deleted, &failing).unwrap();
            assert_eq!(e, Err("cannot".to_string()));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 3, "one conversion per form");
        assert!(ev.converted_line(EventType::Added, &v1).is_none());
        assert!(ev.converted_line(EventType::Bookmark, &v1).is_none());
    }

    fn adaptive(min: usize, max: usize, max_bytes: u64) -> HistoryPolicy {
        HistoryPolicy {
            fixed: None,
            min_age: std::time::Duration::from_secs(75),
            min_events: min,
            max_events: max,
            max_bytes,
        }
    }

    fn push_at(h: &mut History, rv: i64, at: Instant) {
        h.push(
            EventKind::Added,
            Arc::from(format!("/p/ns/k{rv}")),
            Some(obj("/p/ns/k", rv)),
            None,
            rv,
            at,
        );
    }

    #[test]
    fn a_burst_doubles_the_ring_up_to_its_bound() {
        let t0 = Instant::now();
        let mut h = History::new(adaptive(4, 16, u64::MAX), 0);
        assert_eq!(h.capacity(), 4);
        for rv in 1..=10 {
            push_at(&mut h, rv, t0);
        }
        // 4 -> 8 -> 16 as the ring fills within 75 s: nothing evicted yet.
        assert_eq!((h.capacity(), h.len(), h.start_rv()), (16, 10, 0));
        for rv in 11..=40 {
            push_at(&mut h, rv, t0 + std::time::Duration::from_secs(10));
        }
        assert_eq!((h.capacity(), h.len()), (16, 16), "never above the bound");
        assert_eq!(h.start_rv(), 24);
        assert_eq!(h.seq_after_rv(24), Ok(24));
    }

    #[test]
    fn a_ring_whose_quarter_spans_the_age_halves_down_to_its_bound() {
        let t0 = Instant::now();
        let secs = std::time::Duration::from_secs;
        let mut h = History::new(adaptive(4, 16, u64::MAX), 0);
        for rv in 1..=16 {
            push_at(&mut h, rv, t0);
        }
        assert_eq!(h.capacity(), 16);
        // Full, and its newest quarter is older than 75 s: halved at once.
        let mut at = t0 + secs(100);
        push_at(&mut h, 17, at);
        assert_eq!((h.capacity(), h.len()), (8, 8));
        assert_eq!(h.start_rv(), 9, "the oldest events went");
        // A write every 30 s: four events span more than 75 s.
        for rv in 18..=30 {
            at += secs(30);
            push_at(&mut h, rv, at);
        }
        assert_eq!((h.capacity(), h.len()), (4, 4), "never below the bound");
        // A burst: as soon as the whole ring is younger than 75 s, it
        // doubles again, and keeps every event of the last 75 s.
        for rv in 31..=40 {
            push_at(&mut h, rv, at + secs(1));
        }
        assert_eq!(h.capacity(), 16);
        assert_eq!(h.first_seq(), 27, "rv 28, written 61 s before, is kept");
    }

    #[test]
    fn quiet_rings_keep_their_events_whatever_their_age() {
        let t0 = Instant::now();
        let mut h = History::new(adaptive(4, 16, u64::MAX), 0);
        for rv in 1..=3 {
            push_at(&mut h, rv, t0);
        }
        push_at(&mut h, 4, t0 + std::time::Duration::from_secs(3600));
        assert_eq!((h.capacity(), h.len(), h.start_rv()), (4, 4, 0));
    }

    #[test]
    fn the_byte_budget_evicts_whatever_the_age_but_keeps_the_newest() {
        let t0 = Instant::now();
        let one = obj("/p/ns/k", 10).wire.len() as u64;
        let mut h = History::new(adaptive(4, 1024, 3 * one), 0);
        for rv in 1..=10 {
            push_at(&mut h, rv, t0);
        }
        assert_eq!(h.len(), 3);
        assert!(h.bytes() <= 3 * one, "{} bytes", h.bytes());
        assert_eq!(h.bytes_since(h.first_seq()), Ok(h.bytes()));
        assert_eq!(h.start_rv(), 7);
        let mut tiny = History::new(adaptive(4, 1024, 1), 0);
        push_at(&mut tiny, 1, t0);
        push_at(&mut tiny, 2, t0);
        assert_eq!(tiny.len(), 1, "the newest event stays, over the budget");
        assert_eq!(tiny.read_from(1, 10).map(|e| e.len()), Ok(1));
    }

    #[test]
    fn a_fixed_ring_ignores_time() {
        let t0 = Instant::now();
        let mut h = History::new(4, 0);
        for rv in 1..=10 {
            push_at(&mut h, rv, t0);
        }
        assert_eq!((h.capacity(), h.len()), (4, 4));
        push_at(&mut h, 11, t0 + std::time::Duration::from_secs(1000));
        assert_eq!((h.capacity(), h.len()), (4, 4));
        assert_eq!(h.oldest_received(), Some(t0));
    }
}

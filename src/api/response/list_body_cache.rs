//! `ListBodyCache`: the finished body of a full List, kept for the next List
//! of the same snapshot.
//!
//! Why: Lists of one resource at one resourceVersion ask for the same bytes:
//! every informer of a resource relisting after a restart or a partition, a
//! controller listing a quiet resource again. Building the body copies every
//! object's cached bytes into frames, about a fifth of a 10,000-object
//! List's time (docs/BENCHMARKS.md#list-floor); written from kept frames, a
//! List costs little more than the socket's own copy. etcd's grpc-proxy
//! keeps Range answers for the same reason.
//!
//! An entry belongs to the objects it was built from, named by the
//! snapshot's [`contents`](Snapshot::contents): every change gives a new
//! value (a progress notification, which only moves the resourceVersion,
//! does not), so an entry cannot answer for objects it does not hold, no
//! invalidation can be missed, and entries of older contents are dropped
//! at the next List. It never keeps a snapshot alive. Memory is bounded:
//! `server.list_body_cache_bytes` for all resources together (0 turns the
//! cache off) and [`ENTRIES`] per resource (the latest prefixes listed:
//! the whole resource, a few namespaces). Only what is the same for every
//! client is kept: the items and the closing bytes, not the head (it holds
//! the List's resourceVersion, and for protobuf the lengths around the
//! items). JSON and protobuf bodies are kept apart ([`ListMedia`]). A kept
//! body's gzip, for clients that ask for it, is kept beside it
//! ([`KeptFrames::gzip`]), in the same budget.

use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering};
use tokio::time::Instant;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use prometheus::IntCounter;

use super::budget::{ListBodyBudget, Reservation};
use super::gzip::{self, GzipItems};
use crate::cacher::{ListItems, Snapshot};

/// Entries kept per resource.
pub const ENTRIES: usize = 4;

/// A recording not finished after this long (its client reads slowly, or
/// not at all) no longer stops the next List from recording.
const RECORDING_LIMIT: Duration = Duration::from_secs(10);

/// Kept bodies are regrouped into frames of about this size as they are
/// recorded (one copy, once per snapshot): a List written from them costs a
/// quarter of the writes and reader wake-ups of one built in the 256 KiB
/// frames a List in the making uses (those stay small, as several Lists may
/// be in the making at once). 10,000 x 1 KB: p50 3.5-3.9 -> 2.5-3.0 ms.
/// A kept frame holds whole List frames: those end a little past 256 KiB
/// (at the item that crosses it), so three fit and a quarter of the buffer
/// stays empty; the budget counts it. Filling buffers to exactly 1 MiB (a
/// List frame split across two) or to four List frames made Lists slower:
/// 2.7-3.2 against 1.7-2.6 ms, 10,000 x 1 KB, interleaved (docs/BENCHMARKS.md#what-did-not-work).
const KEPT_FRAME_BYTES: usize = 1 << 20;

/// The encoding of a kept body: a JSON List and a protobuf List of the
/// same objects are different bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListMedia {
    Json,
    Protobuf,
}

/// What is known of the List of one prefix at one snapshot.
enum Kept {
    /// Listed once: the next List records its frames.
    Seen,
    /// A List is recording its frames (one at a time: a relist storm
    /// records once, not once per client); the recording's id, so only
    /// that recording's end changes the entry, and when it started.
    Recording(u64, Instant),
    /// Too large for the budget: built every time (no further attempt at
    /// this snapshot).
    Unkept,
    /// The frames, for every later List.
    Frames(Arc<KeptFrames>),
}

/// A kept body's frames (the items and the closing bytes), and once a
/// client that asks for gzip has listed them, their gzip: so a relist
/// storm of client-go informers (which all ask for gzip) costs one
/// compression, not one per client, as it costs one build. The gzip's
/// bytes are taken from the same budget; none are kept when they do not
/// fit (those Lists are compressed each time instead). Both are counted
/// until their last holder is gone: a List still being written from them
/// keeps them in memory after their entry is dropped.
pub struct KeptFrames {
    frames: Arc<[Bytes]>,
    gzip: tokio::sync::OnceCell<Option<Arc<GzipItems>>>,
    /// The frames' bytes (the gzip holds its own).
    held: Reservation,
}

impl KeptFrames {
    pub(crate) fn new(frames: Vec<Bytes>, held: Reservation) -> KeptFrames {
        KeptFrames {
            frames: frames.into(),
            gzip: tokio::sync::OnceCell::new(),
            held,
        }
    }

    /// The frames compressed for a gzip response (`compression::spliced`):
    /// made for the first List that asks (the others wait for it), `None` if
    /// they cannot be made or will not fit in the budget. Made by a task of
    /// its own, so a first client that goes away midway does not waste the
    /// work: the next List finds it made. Without room in the budget now,
    /// nothing is kept and a later List tries again.
    pub async fn gzip(self: &Arc<Self>) -> Option<Arc<GzipItems>> {
        if let Some(made) = self.gzip.get() {
            return made.clone();
        }
        let kept = Arc::clone(self);
        let making = tokio::spawn(async move {
            let made = kept
                .gzip
                .get_or_try_init(|| async {
                    let made = gzip::deflate_items(Arc::clone(&kept.frames), kept.held.budget());
                    made.await.map(|items| items.map(Arc::new))
                })
                .await;
            made.ok().cloned().flatten()
        });
        making.await.ok().flatten()
    }
}

#[cfg(test)]
impl KeptFrames {
    /// Whether [`KeptFrames::gzip`] has settled (made, or found never to fit).
    pub(crate) fn gzip_made(&self) -> bool {
        self.gzip.initialized()
    }
}

impl std::ops::Deref for KeptFrames {
    type Target = [Bytes];

    fn deref(&self) -> &[Bytes] {
        &self.frames
    }
}

/// One prefix of one snapshot's contents.
struct Entry {
    contents: u64,
    prefix: String,
    media: ListMedia,
    kept: Kept,
}

impl Entry {
    fn is(&self, contents: u64, prefix: &str, media: ListMedia) -> bool {
        self.contents == contents && self.media == media && self.prefix == prefix
    }
}

/// One resource's kept List bodies (see the module documentation).
pub struct ListBodyCache {
    budget: Arc<ListBodyBudget>,
    /// The last recording id given out.
    recordings: AtomicU64,
    /// Oldest first.
    entries: Mutex<Vec<Entry>>,
    hits: IntCounter,
    misses: IntCounter,
}

impl ListBodyCache {
    /// The cache of resource `resource` (a metrics label), drawing on `budget`.
    pub fn new(resource: &str, budget: Arc<ListBodyBudget>) -> Arc<ListBodyCache> {
        let m = &crate::metrics::metrics().list_body_cache;
        Arc::new(ListBodyCache {
            budget,
            recordings: AtomicU64::new(0),
            entries: Mutex::new(Vec::new()),
            hits: m.with_label_values(&[resource, "hit"]),
            misses: m.with_label_values(&[resource, "miss"]),
        })
    }

    /// The kept frames of the List of everything under `prefix` at `snap`;
    /// otherwise whether the List about to be built should record its
    /// frames: the second List of a snapshot does, so a resource that
    /// changes between Lists never pays for keeping what no one reads again.
    pub fn lookup(
        self: &Arc<Self>,
        snap: &Arc<Snapshot>,
        prefix: &str,
        media: ListMedia,
    ) -> Lookup {
        if self.budget.limit() == 0 {
            return Lookup::Off;
        }
        let contents = snap.contents();
        let mut entries = self.entries.lock();
        // Older contents: changed since, never asked for again (a List at
        // an older resourceVersion finds its own entry, or builds).
        entries.retain(|e| e.contents >= contents);
        let Some(e) = entries.iter_mut().find(|e| e.is(contents, prefix, media)) else {
            if entries.len() >= ENTRIES {
                entries.remove(0);
            }
            entries.push(Entry {
                contents,
                prefix: prefix.to_string(),
                media,
                kept: Kept::Seen,
            });
            self.misses.inc();
            return Lookup::Miss(None);
        };
        // A recording held up by its client's reading (it records as the
        // body is written) is given up after RECORDING_LIMIT: the next List
        // records instead, and the slow one's end no longer counts.
        let stalled =
            matches!(e.kept, Kept::Recording(_, since) if since.elapsed() >= RECORDING_LIMIT);
        match &e.kept {
            Kept::Frames(f) => {
                self.hits.inc();
                Lookup::Hit(Arc::clone(f))
            }
            Kept::Recording(..) if !stalled => {
                self.misses.inc();
                Lookup::Miss(None)
            }
            Kept::Seen | Kept::Recording(..) => {
                let id = self.recordings.fetch_add(1, Ordering::Relaxed) + 1;
                e.kept = Kept::Recording(id, Instant::now());
                self.misses.inc();
                Lookup::Miss(Some(Recorder {
                    cache: Arc::clone(self),
                    id,
                    contents,
                    prefix: prefix.to_string(),
                    media,
                    frames: Vec::new(),
                    pending: BytesMut::new(),
                    held: self.budget.empty(),
                    over: false,
                    finished: false,
                }))
            }
            Kept::Unkept => {
                self.misses.inc();
                Lookup::Miss(None)
            }
        }
    }

    /// [`ListBodyCache::lookup`] for a List's items: only everything under
    /// a prefix (no selector, no limit, no continue) is kept; other Lists
    /// are `Off`.
    pub fn lookup_items(self: &Arc<Self>, items: &ListItems, media: ListMedia) -> Lookup {
        match items {
            ListItems::Range { snap, prefix, from } if from.is_empty() => {
                self.lookup(snap, prefix, media)
            }
            _ => Lookup::Off,
        }
    }

    /// Recording `r` ended: with its frames and the budget they hold, or
    /// without. `retry`: it was abandoned; the next List records again.
    /// Only the entry's own recording changes it: one evicted and made
    /// again meanwhile has another (the frames dropped here give their
    /// bytes back, never held twice).
    fn recorded(&self, r: &Recorder, frames: Option<(Vec<Bytes>, Reservation)>, retry: bool) {
        let mut entries = self.entries.lock();
        let own = entries.iter_mut().find(|e| {
            e.is(r.contents, &r.prefix, r.media)
                && matches!(e.kept, Kept::Recording(id, _) if id == r.id)
        });
        // Evicted meanwhile (changed, or pushed out by other prefixes):
        // nothing to change.
        let Some(e) = own else { return };
        e.kept = match frames {
            Some((f, held)) => Kept::Frames(Arc::new(KeptFrames::new(f, held))),
            None if retry => Kept::Seen,
            None => Kept::Unkept,
        };
    }

    /// Drops what was kept for objects older than `current` (the cache's
    /// newest contents): run periodically, so the bodies of a resource that
    /// changed and is not listed again do not hold memory until its next
    /// List.
    pub fn drop_older_than(&self, current: u64) {
        self.entries.lock().retain(|e| e.contents >= current);
    }

    /// Prefixes known now (for tests).
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What [`ListBodyCache::lookup`] found.
pub enum Lookup {
    /// Not kept: the cache is off, or the List is not one it keeps.
    Off,
    /// The frames of an earlier List of the same snapshot and prefix.
    Hit(Arc<KeptFrames>),
    /// Not kept: build the body, recording its frames with the recorder.
    Miss(Option<Recorder>),
}

/// Collects the frames of a body being built; [`Recorder::finish`] keeps
/// them once the body is complete. The bytes it holds are reserved as it
/// goes (it stops once they would not fit), so recordings in progress are
/// bounded too; a recording dropped unfinished (the client went away)
/// gives them back with its reservation.
pub struct Recorder {
    cache: Arc<ListBodyCache>,
    id: u64,
    contents: u64,
    prefix: String,
    media: ListMedia,
    frames: Vec<Bytes>,
    /// The frame being regrouped (see [`KEPT_FRAME_BYTES`]).
    pending: BytesMut,
    /// The bytes of `frames` and `pending`.
    held: Reservation,
    /// Would not fit in the budget: recording stopped.
    over: bool,
    finished: bool,
}

impl Recorder {
    /// A frame of the body, in order: a large one is shared, smaller ones
    /// are copied into frames of about [`KEPT_FRAME_BYTES`].
    pub fn record(&mut self, frame: &Bytes) {
        if self.over {
            return;
        }
        if !self.held.grow(frame.len()) {
            self.give_up();
            return;
        }
        if frame.len() >= KEPT_FRAME_BYTES {
            self.end_frame();
            if !self.over {
                self.frames.push(frame.clone());
            }
            return;
        }
        if self.pending.len() + frame.len() > KEPT_FRAME_BYTES {
            self.end_frame();
            if self.over {
                return;
            }
        }
        if self.pending.capacity() == 0 {
            self.pending.reserve(KEPT_FRAME_BYTES);
        }
        self.pending.extend_from_slice(frame);
    }

    /// Would not fit: give back at once what this recording held, as it
    /// keeps nothing.
    fn give_up(&mut self) {
        self.over = true;
        self.frames = Vec::new();
        self.pending = BytesMut::new();
        self.held.resize(0);
    }

    fn end_frame(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending);
        // A frozen buffer keeps its whole capacity: a short frame (the `]}`
        // of an empty List) is copied out rather than hold a buffer mostly
        // empty; a fuller one is kept as it is, its empty room counted.
        let frame = if pending.len() < pending.capacity() / 2 {
            Bytes::copy_from_slice(&pending)
        } else {
            let room = pending.capacity() - pending.len();
            if !self.held.grow(room) {
                self.give_up();
                return;
            }
            pending.freeze()
        };
        self.frames.push(frame);
    }

    /// The body is complete: keep it (if it fit).
    pub fn finish(mut self) {
        self.finished = true;
        self.end_frame();
        let frames = (!self.over).then(|| {
            let held = std::mem::replace(&mut self.held, self.cache.budget.empty());
            (std::mem::take(&mut self.frames), held)
        });
        let cache = Arc::clone(&self.cache);
        cache.recorded(&self, frames, false);
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if !self.finished {
            let retry = !self.over;
            let cache = Arc::clone(&self.cache);
            cache.recorded(self, None, retry);
        }
    }
}

/// A List body's frames: `head` (this List's own: it holds the List's
/// resourceVersion), then `items` (the items and the closing bytes, the
/// same for every List of these objects), recorded with `recorder` as they
/// go out and kept once the last has.
pub fn list_frames<I>(
    head: Bytes,
    items: I,
    recorder: Option<Recorder>,
) -> impl Iterator<Item = Bytes> + Send + 'static
where
    I: Iterator<Item = Bytes> + Send + 'static,
{
    std::iter::once(head).chain(Recorded { items, recorder })
}

/// See [`list_frames`].
struct Recorded<I> {
    items: I,
    recorder: Option<Recorder>,
}

impl<I: Iterator<Item = Bytes>> Iterator for Recorded<I> {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        let frame = self.items.next();
        match (&frame, &mut self.recorder) {
            (Some(f), Some(r)) => r.record(f),
            (None, r) => {
                if let Some(r) = r.take() {
                    r.finish();
                }
            }
            (Some(_), None) => {}
        }
        frame
    }
}

/// The recorder of the second List of `prefix` at `snap` (the first
/// builds without one), for the tests of the List bodies that use it.
#[cfg(test)]
impl ListBodyCache {
    pub(crate) fn second_list(
        self: &Arc<Self>,
        snap: &Arc<Snapshot>,
        prefix: &str,
        media: ListMedia,
    ) -> Recorder {
        assert!(
            matches!(self.lookup(snap, prefix, media), Lookup::Miss(None)),
            "the first List builds"
        );
        match self.lookup(snap, prefix, media) {
            Lookup::Miss(Some(r)) => r,
            _ => panic!("the second List records"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot with contents of its own (as after a change).
    fn snap(rv: i64) -> Arc<Snapshot> {
        let mut s = Snapshot::empty(rv, 0);
        let o = Arc::new(crate::object::tests::object("ns", "a", "{}"));
        s.apply(&Arc::clone(&o.key), Some(o), &[]);
        Arc::new(s)
    }

    /// The same objects at a later resourceVersion (a progress notification).
    fn advanced(s: &Snapshot, rv: i64) -> Arc<Snapshot> {
        let mut later = s.clone();
        later.rv = rv;
        Arc::new(later)
    }

    /// A List of `prefix` at `s` as the API makes it: the frames are
    /// recorded when the cache asks for it. Returns what the lookup said.
    fn list(
        cache: &Arc<ListBodyCache>,
        s: &Arc<Snapshot>,
        prefix: &str,
        frames: &[&'static [u8]],
    ) -> &'static str {
        match cache.lookup(s, prefix, ListMedia::Json) {
            Lookup::Off => "off",
            Lookup::Hit(_) => "hit",
            Lookup::Miss(None) => "built",
            Lookup::Miss(Some(mut r)) => {
                for f in frames {
                    r.record(&Bytes::from_static(f));
                }
                r.finish();
                "recorded"
            }
        }
    }

    fn kept(cache: &Arc<ListBodyCache>, s: &Arc<Snapshot>, prefix: &str) -> Option<Vec<u8>> {
        match cache.lookup(s, prefix, ListMedia::Json) {
            Lookup::Hit(f) => Some(f.iter().flat_map(|b| b.to_vec()).collect()),
            _ => None,
        }
    }

    #[test]
    fn the_second_list_of_a_snapshot_records_and_later_ones_are_written_from_it() {
        let budget = ListBodyBudget::new(1 << 20);
        let cache = ListBodyCache::new("t-kept", Arc::clone(&budget));
        let s1 = snap(1);
        let body: &[&[u8]] = &[b"{\"a\":1}", b",{\"b\":2}]}"];
        assert_eq!(list(&cache, &s1, "/r/pods/", body), "built");
        assert_eq!(budget.used(), 0);
        assert_eq!(list(&cache, &s1, "/r/pods/", body), "recorded");
        assert_eq!(
            kept(&cache, &s1, "/r/pods/").as_deref(),
            Some(&b"{\"a\":1},{\"b\":2}]}"[..])
        );
        assert_eq!(budget.used(), 17);
        // The same objects at a later resourceVersion: the same items.
        assert_eq!(list(&cache, &advanced(&s1, 5), "/r/pods/", body), "hit");
        // Another prefix: built.
        assert_eq!(list(&cache, &s1, "/r/pods/ns/", body), "built");
    }

    #[test]
    fn a_change_drops_the_body_and_its_bytes_return_to_the_budget() {
        let budget = ListBodyBudget::new(1 << 20);
        let cache = ListBodyCache::new("t-gone", Arc::clone(&budget));
        let s1 = snap(1);
        list(&cache, &s1, "/r/pods/", &[]);
        assert_eq!(list(&cache, &s1, "/r/pods/", &[b"0123456789"]), "recorded");
        assert_eq!(budget.used(), 10);
        // A List still being written from the body.
        let Lookup::Hit(writing) = cache.lookup(&s1, "/r/pods/", ListMedia::Json) else {
            panic!("kept");
        };
        // A change: the next List builds, and the old body is gone; its
        // bytes are counted until the List writing from it is done.
        let s2 = snap(2);
        assert_eq!(list(&cache, &s2, "/r/pods/", &[]), "built");
        assert_eq!(cache.len(), 1);
        assert_eq!(budget.used(), 10);
        drop(writing);
        assert_eq!(budget.used(), 0);
        // A List at the older contents (an exact resourceVersion) builds
        // and leaves the newer entries alone.
        assert_eq!(list(&cache, &s2, "/r/pods/", &[b"2"]), "recorded");
        assert_eq!(list(&cache, &s1, "/r/pods/", &[]), "built");
        assert_eq!(kept(&cache, &s2, "/r/pods/").as_deref(), Some(&b"2"[..]));
    }

    #[test]
    fn one_list_records_at_a_time_and_an_abandoned_recording_is_retried() {
        let budget = ListBodyBudget::new(1 << 20);
        let cache = ListBodyCache::new("t-abandoned", Arc::clone(&budget));
        let s = snap(1);
        let mut r = cache.second_list(&s, "/r/pods/", ListMedia::Json);
        r.record(&Bytes::from_static(b"{\"a\":1}"));
        assert_eq!(budget.used(), 7, "a recording holds budget as it goes");
        // A relist storm: the others build while one records.
        assert_eq!(list(&cache, &s, "/r/pods/", &[b"x"]), "built");
        drop(r);
        assert_eq!(budget.used(), 0);
        assert!(kept(&cache, &s, "/r/pods/").is_none());
        assert_eq!(list(&cache, &s, "/r/pods/", &[b"x"]), "recorded");
        assert_eq!(kept(&cache, &s, "/r/pods/").as_deref(), Some(&b"x"[..]));
    }

    #[test]
    fn memory_stays_within_the_budget_and_the_entries_per_resource() {
        let budget = ListBodyBudget::new(25);
        let a = ListBodyCache::new("t-budget-a", Arc::clone(&budget));
        let b = ListBodyCache::new("t-budget-b", Arc::clone(&budget));
        let s = snap(1);
        let ten: &[&[u8]] = &[b"0123456789"];
        for p in ["/a/1/", "/a/2/"] {
            list(&a, &s, p, ten);
            assert_eq!(list(&a, &s, p, ten), "recorded");
        }
        assert_eq!(budget.used(), 20);
        // Another resource's body does not fit: built every time, and a's
        // bodies stay.
        let t = snap(1);
        list(&b, &t, "/b/", ten);
        assert_eq!(list(&b, &t, "/b/", ten), "recorded");
        assert!(kept(&b, &t, "/b/").is_none());
        assert_eq!(list(&b, &t, "/b/", ten), "built");
        assert_eq!(budget.used(), 20);
        assert!(kept(&a, &s, "/a/1/").is_some() && kept(&a, &s, "/a/2/").is_some());
        // Larger than what is left: not kept.
        list(&a, &s, "/a/big/", &[]);
        list(&a, &s, "/a/big/", &[b"0123456789", b"0123456789"]);
        assert!(kept(&a, &s, "/a/big/").is_none());
        assert_eq!(budget.used(), 20);
        // At most ENTRIES prefixes per resource: the oldest goes first.
        let roomy = ListBodyCache::new("t-budget-roomy", ListBodyBudget::new(1 << 20));
        for i in 0..ENTRIES + 2 {
            let p = format!("/p/{i}/");
            list(&roomy, &s, &p, &[b"x"]);
            assert_eq!(list(&roomy, &s, &p, &[b"x"]), "recorded");
        }
        assert_eq!(roomy.len(), ENTRIES);
        assert!(kept(&roomy, &s, "/p/0/").is_none());
        assert!(kept(&roomy, &s, &format!("/p/{}/", ENTRIES + 1)).is_some());
        drop(a);
        drop(b);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn small_frames_are_regrouped_and_large_ones_shared() {
        let budget = ListBodyBudget::new(64 << 20);
        let cache = ListBodyCache::new("t-regroup", Arc::clone(&budget));
        let s = snap(1);
        let mut r = cache.second_list(&s, "/r/", ListMedia::Json);
        let small = Bytes::from(vec![b'a'; KEPT_FRAME_BYTES / 4 + 1]);
        let large = Bytes::from(vec![b'b'; KEPT_FRAME_BYTES]);
        let mut want = Vec::new();
        for f in [&small, &small, &small, &small, &large, &small] {
            r.record(f);
            want.extend_from_slice(f);
        }
        r.finish();
        let Lookup::Hit(frames) = cache.lookup(&s, "/r/", ListMedia::Json) else {
            panic!("kept");
        };
        let lens: Vec<usize> = frames.iter().map(|f| f.len()).collect();
        let q = KEPT_FRAME_BYTES / 4 + 1;
        assert_eq!(lens, [3 * q, q, KEPT_FRAME_BYTES, q]);
        // The first keeps its buffer, and the budget counts the buffer's
        // empty room; the two short ones were copied out of theirs.
        assert!(
            budget.used() >= 2 * KEPT_FRAME_BYTES + 2 * q,
            "{}",
            budget.used()
        );

        // A last frame over half its buffer keeps the buffer, and the
        // budget counts its empty room too.
        let budget = ListBodyBudget::new(64 << 20);
        let cache = ListBodyCache::new("t-regroup-room", Arc::clone(&budget));
        let mut r = cache.second_list(&s, "/r/", ListMedia::Json);
        for _ in 0..3 {
            r.record(&small);
        }
        r.finish();
        assert!(matches!(
            cache.lookup(&s, "/r/", ListMedia::Json),
            Lookup::Hit(f) if f.len() == 1 && f[0].len() == 3 * q
        ));
        assert!(budget.used() >= KEPT_FRAME_BYTES, "{}", budget.used());
        assert_eq!(
            frames[2].as_ptr(),
            large.as_ptr(),
            "a large frame is not copied"
        );
        assert_eq!(frames.concat(), want);
    }

    /// A recording whose entry was pushed out and made again meanwhile
    /// neither changes the new entry nor leaves its bytes taken.
    #[test]
    fn only_the_entrys_own_recording_ends_it() {
        let budget = ListBodyBudget::new(1 << 20);
        let cache = ListBodyCache::new("t-own", Arc::clone(&budget));
        let s = snap(1);
        let mut slow = cache.second_list(&s, "/r/", ListMedia::Json);
        slow.record(&Bytes::from_static(b"slow"));
        for i in 0..ENTRIES {
            list(&cache, &s, &format!("/ns{i}/"), &[]);
        }
        let mut fast = cache.second_list(&s, "/r/", ListMedia::Json);
        fast.record(&Bytes::from_static(b"fast!"));
        slow.finish();
        assert!(kept(&cache, &s, "/r/").is_none(), "still fast's to end");
        assert_eq!(budget.used(), 5);
        fast.finish();
        assert_eq!(kept(&cache, &s, "/r/").as_deref(), Some(&b"fast!"[..]));
        assert_eq!(budget.used(), 5);
        drop(cache);
        assert_eq!(budget.used(), 0);
    }

    /// A client that stops reading its List does not stop the next List
    /// from recording for long, and its end no longer counts.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_recording_is_taken_over() {
        let budget = ListBodyBudget::new(1 << 20);
        let cache = ListBodyCache::new("t-stalled", Arc::clone(&budget));
        let s = snap(1);
        let mut stalled = cache.second_list(&s, "/r/", ListMedia::Json);
        stalled.record(&Bytes::from_static(b"old"));
        tokio::time::advance(RECORDING_LIMIT / 2).await;
        assert_eq!(list(&cache, &s, "/r/", &[b"x"]), "built");
        tokio::time::advance(RECORDING_LIMIT / 2).await;
        assert_eq!(list(&cache, &s, "/r/", &[b"new"]), "recorded");
        stalled.finish();
        assert_eq!(kept(&cache, &s, "/r/").as_deref(), Some(&b"new"[..]));
        assert_eq!(budget.used(), 3);
    }

    #[test]
    fn a_recording_over_the_budget_gives_its_bytes_back_at_once() {
        let budget = ListBodyBudget::new(8);
        let cache = ListBodyCache::new("t-over", Arc::clone(&budget));
        let s = snap(1);
        let mut r = cache.second_list(&s, "/r/", ListMedia::Json);
        r.record(&Bytes::from_static(b"12345"));
        assert_eq!(budget.used(), 5);
        r.record(&Bytes::from_static(b"12345"));
        assert_eq!(budget.used(), 0, "nothing held while the List goes on");
        r.record(&Bytes::from_static(b"1"));
        assert_eq!(budget.used(), 0);
        r.finish();
        assert!(kept(&cache, &s, "/r/").is_none());
        assert_eq!(
            list(&cache, &s, "/r/", &[b"1"]),
            "built",
            "no retry at this snapshot"
        );
    }

    #[test]
    fn the_sweep_drops_bodies_of_older_contents() {
        let budget = ListBodyBudget::new(1 << 20);
        let cache = ListBodyCache::new("t-sweep", Arc::clone(&budget));
        let s1 = snap(1);
        list(&cache, &s1, "/r/", &[]);
        assert_eq!(list(&cache, &s1, "/r/", &[b"0123"]), "recorded");
        cache.drop_older_than(s1.contents());
        assert_eq!(budget.used(), 4, "current contents stay");
        let s2 = snap(2);
        cache.drop_older_than(s2.contents());
        assert!(cache.is_empty());
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_reservation_holds_its_bytes_until_dropped_and_resizes_within_the_budget() {
        let budget = ListBodyBudget::new(100);
        let mut r = budget.reserve(30).expect("fits");
        assert!(budget.reserve(71).is_none());
        assert!(r.resize(10));
        assert_eq!(budget.used(), 10);
        assert!(!r.resize(101), "does not fit");
        assert_eq!((r.bytes(), budget.used()), (10, 10));
        assert!(r.resize(100));
        assert_eq!(budget.used(), 100);
        drop(r);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn with_no_budget_the_cache_is_off() {
        let cache = ListBodyCache::new("t-off", ListBodyBudget::new(0));
        assert_eq!(list(&cache, &snap(1), "/r/", &[]), "off");
    }
}

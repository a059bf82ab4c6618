//! `SelectionPredicate`: what a List or a Watch selects (Kubernetes'
//! `storage.SelectionPredicate`): a namespace, a label selector and a field
//! selector, plus the index hints their exact terms imply.
//!
//! List and Watch use this one type, so they cannot disagree on what a
//! request selects: a List walks the snapshot range (or the smallest index
//! set) the predicate names and keeps what [`SelectionPredicate::matches`];
//! a Watch registers on the predicate's [`route`](SelectionPredicate::route)
//! and converts each event with the same `matches`.

use std::sync::Arc;

use super::snapshot::{IndexKey, Snapshot, field_pair_key};
use crate::object::sharding::ShardSelector;
use crate::object::{FieldSelector, LabelSelector, Object, ObjectCodec};

/// A List's or Watch's selection over one resource.
#[derive(Debug, Clone)]
pub struct SelectionPredicate {
    /// Only for namespaced resources, never empty.
    namespace: Option<Box<str>>,
    label: LabelSelector,
    field: FieldSelector,
    /// The key range every match lies in: the resource, or one namespace.
    /// Boxed strings (no spare capacity): a watch holds its predicate as
    /// long as it lives.
    prefix: Box<str>,
    /// Exact terms a snapshot index can answer (labels, indexed fields).
    index_keys: Vec<IndexKey>,
    /// The single most selective exact fact every match carries: the watch
    /// route a watcher registers on so other events never wake it.
    route: Option<IndexKey>,
    /// `shardSelector`: only objects whose field hash lies in its ranges.
    shard: Option<Arc<ShardSelector>>,
}

/// Where a selection's matches lie ([`SelectionPredicate::candidates`]).
enum Candidates<'s> {
    /// An exact term names a value nothing carries: nothing matches.
    Nothing,
    /// The smallest index set an exact term names.
    Indexed(&'s imbl::OrdSet<Arc<str>>),
    /// No exact term is indexed: the whole key range.
    Range,
}

/// One step of a watch's initial events ([`SelectionPredicate::initial_step`]).
#[derive(Debug)]
pub struct InitialStep {
    pub items: Vec<Arc<Object>>,
    /// The last key walked, when the range may hold more: the next step
    /// starts after it.
    pub resume_after: Option<String>,
}

/// One page of a List.
#[derive(Debug)]
pub struct ListPage {
    pub items: Vec<Arc<Object>>,
    /// The last returned key when more items follow (for the continue token).
    pub last_key: Option<String>,
    /// Matches after this page, when they were counted.
    pub remaining: Option<i64>,
}

impl SelectionPredicate {
    /// The selection of `namespace` (ignored for a cluster-scoped resource;
    /// empty means all namespaces) and the two selectors.
    pub fn new(
        codec: &ObjectCodec,
        namespace: Option<&str>,
        label: LabelSelector,
        field: FieldSelector,
    ) -> SelectionPredicate {
        let namespace = namespace
            .filter(|n| !n.is_empty() && codec.is_namespaced())
            .map(Box::<str>::from);
        let prefix = match &namespace {
            Some(ns) => codec.namespace_prefix(ns).into_boxed_str(),
            None => Box::from(codec.key_prefix()),
        };
        let paths = codec.index_paths();
        let field_keys: Vec<IndexKey> = field
            .exact_pairs()
            .into_iter()
            .filter_map(|(p, v)| field_pair_key(&p, &v, paths))
            .collect();
        let label_keys: Vec<IndexKey> = label
            .exact_pairs()
            .into_iter()
            .map(|(k, v)| IndexKey::Label(k, v))
            .collect();
        let index_keys = label_keys
            .iter()
            .chain(field_keys.iter())
            .filter(|k| Snapshot::is_indexed(k))
            .cloned()
            .collect();
        // Most selective first: an index field, the name, a label, the namespace.
        let route = field_keys
            .iter()
            .find(|k| matches!(k, IndexKey::Field(..)))
            .or_else(|| field_keys.iter().find(|k| matches!(k, IndexKey::Name(_))))
            .or_else(|| label_keys.first())
            .cloned()
            .or_else(|| {
                namespace
                    .as_deref()
                    .map(|ns| IndexKey::Namespace(ns.to_string()))
            })
            .or_else(|| {
                field_keys
                    .iter()
                    .find(|k| matches!(k, IndexKey::Namespace(_)))
                    .cloned()
            });
        SelectionPredicate {
            namespace,
            label,
            field,
            prefix,
            index_keys,
            route,
            shard: None,
        }
    }

    /// Narrows the selection to a shard. A watch with no more selective
    /// exact fact (an index field, the name, a label) than its namespace
    /// routes on the shard instead: other shards' events never wake it.
    pub fn with_shard(mut self, shard: Option<Arc<ShardSelector>>) -> SelectionPredicate {
        if let Some(sel) = &shard
            && matches!(self.route, None | Some(IndexKey::Namespace(_)))
        {
            self.route = Some(IndexKey::Shard(Arc::clone(sel)));
        }
        self.shard = shard;
        self
    }

    /// The shard selector, if any (echoed in a List's `shardInfo`).
    pub fn shard(&self) -> Option<&Arc<ShardSelector>> {
        self.shard.as_ref()
    }

    /// Everything of the resource.
    pub fn everything(codec: &ObjectCodec) -> SelectionPredicate {
        SelectionPredicate::new(
            codec,
            None,
            LabelSelector::default(),
            FieldSelector::default(),
        )
    }

    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The etcd key range (a prefix ending in '/') every match lies in.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The watch route (see the module doc); `None`: every event concerns it.
    pub fn route(&self) -> Option<&IndexKey> {
        self.route.as_ref()
    }

    /// Whether `o` is selected.
    pub fn matches(&self, o: &Object) -> bool {
        if let Some(ns) = &self.namespace
            && o.namespace.as_deref() != Some(&**ns)
        {
            return false;
        }
        self.passes_selectors(o)
    }

    /// Whether `o` passes the label and field selectors (its namespace
    /// aside: a walk within the prefix is within the namespace).
    fn passes_selectors(&self, o: &Object) -> bool {
        self.label.matches(&o.labels)
            && self.field.matches(o)
            && self.shard.as_ref().is_none_or(|s| s.matches(o))
    }

    /// Every object its route's events carry is selected: a namespace with
    /// no selector (an object never changes namespace, so both sides of an
    /// event logged on the namespace's route lie in it).
    pub fn route_selects_all(&self) -> bool {
        matches!(self.route, Some(IndexKey::Namespace(_)))
            && self.namespace.is_some()
            && !self.has_selectors()
    }

    /// No namespace and no selector: every object of the resource.
    pub fn is_everything(&self) -> bool {
        self.namespace.is_none() && !self.has_selectors()
    }

    /// The size of the smallest index set an exact term of the selectors
    /// names (0 when a term names one nothing carries), if any does: a
    /// List walks no more than that.
    pub fn smallest_index_set(&self, snap: &Snapshot) -> Option<usize> {
        match self.candidates(snap) {
            Candidates::Nothing => Some(0),
            Candidates::Indexed(set) => Some(set.len()),
            Candidates::Range => None,
        }
    }

    /// A label or field selector is set. Kubernetes leaves a List's
    /// `remainingItemCount` unset then (the count is "unknown"), which also
    /// spares walking the rest of the range on every page.
    pub fn has_selectors(&self) -> bool {
        !self.label.is_empty() || !self.field.is_empty() || self.shard.is_some()
    }

    /// Objects of the whole selection at `snap`, for a predicate without
    /// selectors: the snapshot's size for a whole resource, one walk of the
    /// namespace range otherwise.
    pub fn count_all(&self, snap: &Snapshot) -> u64 {
        if self.namespace.is_none() {
            snap.len() as u64
        } else {
            snap.range_from(&self.prefix, "").count() as u64
        }
    }

    /// Selects from `snap` from `start_key` (inclusive), up to `limit` items,
    /// through the smallest index set an exact term names, if any.
    /// `count_rest`: count the matches after the page for `remaining` (a walk
    /// over the rest of the range); otherwise only look whether one more
    /// exists (`remaining` is then `None`).
    pub fn list(
        &self,
        snap: &Snapshot,
        start_key: Option<&str>,
        limit: Option<usize>,
        count_rest: bool,
    ) -> ListPage {
        let from = start_key.unwrap_or("");
        match self.candidates(snap) {
            Candidates::Nothing => ListPage {
                items: Vec::new(),
                last_key: None,
                remaining: None,
            },
            Candidates::Indexed(set) => self.page(
                snap.indexed_range_from(set, &self.prefix, from),
                limit,
                count_rest,
            ),
            Candidates::Range => self.page(snap.range_from(&self.prefix, from), limit, count_rest),
        }
    }

    /// One step of a watch's initial events: up to `limit` matches from
    /// `start_key` (inclusive), walking at most `max_walk` objects. A
    /// selector few objects pass would otherwise walk a large cache in one
    /// poll of its stream, holding every other stream of its connection.
    pub fn initial_step(
        &self,
        snap: &Snapshot,
        start_key: Option<&str>,
        limit: usize,
        max_walk: usize,
    ) -> InitialStep {
        let from = start_key.unwrap_or("");
        match self.candidates(snap) {
            Candidates::Nothing => InitialStep {
                items: Vec::new(),
                resume_after: None,
            },
            Candidates::Indexed(set) => self.step(
                snap.indexed_range_from(set, &self.prefix, from),
                limit,
                max_walk,
            ),
            Candidates::Range => self.step(snap.range_from(&self.prefix, from), limit, max_walk),
        }
    }

    /// Where the matches lie in `snap`: the smallest index set an exact
    /// term names, if any does.
    fn candidates<'s>(&self, snap: &'s Snapshot) -> Candidates<'s> {
        let mut best: Option<&imbl::OrdSet<Arc<str>>> = None;
        for k in &self.index_keys {
            let Some(set) = snap.index_lookup(k) else {
                return Candidates::Nothing;
            };
            if best.is_none_or(|b| set.len() < b.len()) {
                best = Some(set);
            }
        }
        best.map_or(Candidates::Range, Candidates::Indexed)
    }

    fn step<'o>(
        &self,
        mut objects: impl Iterator<Item = &'o Arc<Object>>,
        limit: usize,
        max_walk: usize,
    ) -> InitialStep {
        let selectors = self.has_selectors();
        let mut items = Vec::new();
        let mut last: Option<&Arc<Object>> = None;
        let mut walked = 0usize;
        let exhausted = loop {
            if items.len() >= limit.max(1) || walked >= max_walk.max(1) {
                break false;
            }
            let Some(o) = objects.next() else {
                break true;
            };
            walked += 1;
            last = Some(o);
            if !selectors || self.passes_selectors(o) {
                items.push(Arc::clone(o));
            }
        };
        InitialStep {
            items,
            resume_after: if exhausted {
                None
            } else {
                last.map(|o| o.key.to_string())
            },
        }
    }

    /// One page of the matches among `objects` (in key order, already within
    /// the prefix and from the start key): see [`SelectionPredicate::list`].
    pub fn page<'o>(
        &self,
        objects: impl Iterator<Item = &'o Arc<Object>>,
        limit: Option<usize>,
        count_rest: bool,
    ) -> ListPage {
        // Within the prefix means within the namespace (keys are
        // `{prefix}{ns}/{name}` and the namespace is read from the key): only
        // the selectors are left to check, and without them nothing is.
        // (Reading each object's namespace was a cache miss per item on a
        // large page.)
        let selectors = self.has_selectors();
        let matches = |o: &&Arc<Object>| !selectors || self.passes_selectors(o);
        let mut objects = objects.peekable();
        let limit = limit.unwrap_or(usize::MAX);
        let mut items: Vec<Arc<Object>> = Vec::new();
        while items.len() < limit {
            match objects.next() {
                Some(o) if matches(&o) => items.push(Arc::clone(o)),
                Some(_) => {}
                None => break,
            }
        }
        // A full page is followed by more when any object follows, matching
        // or not, as kube-apiserver decides (its cacher's `hasMoreListItems`):
        // a selective List may end with an empty page.
        let rest = if count_rest {
            objects.filter(matches).count()
        } else {
            usize::from(objects.peek().is_some())
        };
        if rest > 0 {
            ListPage {
                last_key: items.last().map(|o| o.key.to_string()),
                items,
                remaining: count_rest.then_some(rest as i64),
            }
        } else {
            ListPage {
                items,
                last_key: None,
                remaining: None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::cacher::watch_cache::{Change, WatchCache, WatchStart};
    use crate::cacher::watcher::{WatchChunk, Watcher, WatcherParams};

    fn codec(namespaced: bool) -> Arc<ObjectCodec> {
        let r = crate::object::tests::resource(namespaced, &["spec.nodeName"]);
        Arc::new(r.object_codec("/registry"))
    }

    /// name, namespace, labels JSON, node.
    const OBJECTS: &[(&str, &str, &str, &str)] = &[
        ("p1", "a", r#"{"app":"web"}"#, "n1"),
        ("p2", "a", r#"{"app":"db"}"#, "n2"),
        ("p3", "b", r#"{"app":"web"}"#, "n1"),
        ("p4", "b", r#"{}"#, "n2"),
    ];

    fn objects(c: &ObjectCodec, rv0: i64) -> Vec<Arc<Object>> {
        OBJECTS
            .iter()
            .enumerate()
            .map(|(i, (name, ns, labels, node))| {
                let ns = c.is_namespaced().then_some(*ns);
                let meta_ns = ns.map(|n| format!(r#","namespace":"{n}""#)).unwrap_or_default();
                let v = format!(
                    r#"{{"metadata":{{"name":"{name}"{meta_ns},"labels":{labels}}},"spec":{{"nodeName":"{node}"}}}}"#
                );
                let rv = rv0 + i as i64;
                Arc::new(c.decode(&c.key(ns, name), v.as_bytes(), rv, rv).expect("decode"))
            })
            .collect()
    }

    #[derive(Debug, PartialEq)]
    enum Hint {
        None,
        Namespace,
        Name,
        Label,
        Field,
        Shard,
    }

    fn hint(p: &SelectionPredicate) -> Hint {
        match p.route() {
            None => Hint::None,
            Some(IndexKey::Namespace(_)) => Hint::Namespace,
            Some(IndexKey::Name(_)) => Hint::Name,
            Some(IndexKey::Label(..)) => Hint::Label,
            Some(IndexKey::Field(..)) => Hint::Field,
            Some(IndexKey::Shard(_)) => Hint::Shard,
        }
    }

    /// (namespaced resource, namespace, label selector, field selector,
    /// route hint, selected names).
    type Case = (
        bool,
        Option<&'static str>,
        &'static str,
        &'static str,
        Hint,
        &'static [&'static str],
    );

    const ALL: &[&str] = &["p1", "p2", "p3", "p4"];

    fn cases() -> Vec<Case> {
        vec![
            (true, None, "", "", Hint::None, ALL),
            (true, Some(""), "", "", Hint::None, ALL),
            (true, Some("a"), "", "", Hint::Namespace, &["p1", "p2"]),
            (true, None, "app=web", "", Hint::Label, &["p1", "p3"]),
            (true, Some("b"), "app=web", "", Hint::Label, &["p3"]),
            (true, None, "app!=web", "", Hint::None, &["p2", "p4"]),
            (true, None, "app", "", Hint::None, &["p1", "p2", "p3"]),
            (true, None, "app=nothing", "", Hint::Label, &[]),
            (
                true,
                None,
                "",
                "spec.nodeName=n1",
                Hint::Field,
                &["p1", "p3"],
            ),
            (
                true,
                Some("a"),
                "",
                "spec.nodeName=n2",
                Hint::Field,
                &["p2"],
            ),
            (
                true,
                None,
                "",
                "spec.nodeName!=n1",
                Hint::None,
                &["p2", "p4"],
            ),
            (true, None, "", "metadata.name=p4", Hint::Name, &["p4"]),
            (
                true,
                None,
                "",
                "metadata.namespace=b",
                Hint::Namespace,
                &["p3", "p4"],
            ),
            (
                true,
                Some("a"),
                "",
                "metadata.namespace=b",
                Hint::Namespace,
                &[],
            ),
            (true, None, "app=web", "spec.nodeName=n2", Hint::Field, &[]),
            (
                true,
                Some("a"),
                "app=web",
                "spec.nodeName=n1",
                Hint::Field,
                &["p1"],
            ),
            // Cluster-scoped: a namespace does not narrow anything.
            (false, Some("a"), "", "", Hint::None, ALL),
            (false, Some("a"), "app=db", "", Hint::Label, &["p2"]),
        ]
    }

    fn predicate(c: &ObjectCodec, case: &Case) -> SelectionPredicate {
        let (_, ns, label, field, _, _) = case;
        SelectionPredicate::new(
            c,
            *ns,
            LabelSelector::parse(label).expect("label selector"),
            FieldSelector::parse(field, c.index_paths()).expect("field selector"),
        )
    }

    fn names(items: &[Arc<Object>]) -> Vec<String> {
        items.iter().map(|o| o.name.to_string()).collect()
    }

    /// A shard selector narrows any selection; it is the route unless an
    /// index field, the name or a label is more selective.
    #[test]
    fn shard_selector_narrows_and_routes() {
        use crate::object::sharding::{ShardSelector, hash_field};
        let c = codec(true);
        let mut snap = Snapshot::empty(100, 0);
        for o in objects(&c, 1) {
            let key = Arc::clone(&o.key);
            snap.apply(&key, Some(o), c.index_paths());
        }
        // Exactly namespace a's hash.
        let h = hash_field("a");
        let only_a = Arc::new(
            ShardSelector::parse(&format!(
                "shardRange(object.metadata.namespace, '0x{h:016x}', '0x{:016x}')",
                u128::from(h) + 1
            ))
            .expect("shard selector"),
        );
        let cases: &[(Option<&str>, &str, Hint, &[&str])] = &[
            (None, "", Hint::Shard, &["p1", "p2"]),
            (Some("a"), "", Hint::Shard, &["p1", "p2"]),
            (Some("b"), "", Hint::Shard, &[]),
            (None, "app=web", Hint::Label, &["p1"]),
        ];
        for (ns, label, route, want) in cases {
            let p = SelectionPredicate::new(
                &c,
                *ns,
                LabelSelector::parse(label).expect("label selector"),
                FieldSelector::default(),
            )
            .with_shard(Some(Arc::clone(&only_a)));
            assert_eq!(hint(&p), *route, "{ns:?} {label}");
            assert!(p.has_selectors());
            assert_eq!(names(&p.list(&snap, None, None, true).items), *want);
        }
    }

    #[test]
    fn list_selects_the_table() {
        for case in cases() {
            let c = codec(case.0);
            let mut snap = Snapshot::empty(100, 0);
            for o in objects(&c, 1) {
                let key = Arc::clone(&o.key);
                snap.apply(&key, Some(o), c.index_paths());
            }
            let p = predicate(&c, &case);
            assert_eq!(hint(&p), case.4, "route of {case:?}");
            let page = p.list(&snap, None, None, true);
            assert_eq!(names(&page.items), case.5, "list of {case:?}");
            assert!(page.last_key.is_none());
            // Paged one by one, the same objects in the same order.
            let mut paged = Vec::new();
            let mut from: Option<String> = None;
            loop {
                let page = p.list(&snap, from.as_deref(), Some(1), false);
                paged.extend(names(&page.items));
                match page.last_key {
                    Some(k) => from = Some(format!("{k}\0")),
                    None => break,
                }
            }
            assert_eq!(paged, case.5, "paged list of {case:?}");
            // In initial-event steps of any bounds, the same objects in
            // the same order.
            for (limit, max_walk) in [(1, 1), (2, 3), (100, 100)] {
                let mut stepped = Vec::new();
                let mut from: Option<String> = None;
                loop {
                    let step = p.initial_step(&snap, from.as_deref(), limit, max_walk);
                    assert!(step.items.len() <= limit);
                    stepped.extend(names(&step.items));
                    match step.resume_after {
                        Some(k) => from = Some(format!("{k}\0")),
                        None => break,
                    }
                }
                assert_eq!(stepped, case.5, "steps ({limit}, {max_walk}) of {case:?}");
            }
        }
    }

    /// `n` objects `p00000`.. of namespace `a`, labelled `app=x` at
    /// `marked` and `app=y` elsewhere.
    fn many_objects(c: &ObjectCodec, n: usize, marked: &[usize]) -> Vec<Arc<Object>> {
        crate::object::tests::labelled(c, n, |i| if marked.contains(&i) { "x" } else { "y" })
    }

    /// [`many_objects`] in a snapshot.
    fn many(c: &ObjectCodec, n: usize, marked: &[usize]) -> Snapshot {
        let mut snap = Snapshot::empty(100, 0);
        for o in many_objects(c, n, marked) {
            let key = Arc::clone(&o.key);
            snap.apply(&key, Some(o), c.index_paths());
        }
        snap
    }

    /// Counts the wakes of a task.
    struct CountingWaker(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Objects of the sparse caches below: three empty initial steps, then
    /// the one match (the last object) in the fourth.
    const SPARSE_N: usize = 3 * super::super::watcher::INITIAL_WALK_MAX + 10;

    /// A sparse selection's initial events over a large cache: a poll walks
    /// one bounded step, and one that finds nothing returns pending with
    /// the task woken to go on (the connection's other streams run in
    /// between), until the match and the end bookmark.
    #[tokio::test(start_paused = true)]
    async fn a_sparse_selection_yields_between_initial_steps() {
        let events: Vec<serde_json::Value> = String::from_utf8_lossy(&sparse_initial_steps(false))
            .lines()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect();
        assert_initial_match_then_bookmark(&events);
    }

    /// The same steps for a protobuf watcher: its initial events are frames
    /// made from each object's cached message, its end bookmark a frame too.
    #[tokio::test(start_paused = true)]
    async fn a_sparse_protobuf_selection_yields_between_initial_steps() {
        let b = sparse_initial_steps(true);
        let mut events = Vec::new();
        let mut rest = &b[..];
        while !rest.is_empty() {
            assert!(rest.len() >= 4, "a frame's length: {rest:?}");
            let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
            assert!(rest.len() >= 4 + len, "a frame of {len} bytes");
            let event =
                crate::object::protobuf::decode_watch_event(&rest[4..4 + len]).expect("decodes");
            events.push(event);
            rest = &rest[4 + len..];
        }
        assert_initial_match_then_bookmark(&events);
    }

    /// One ADDED event of the last object, then the end bookmark.
    fn assert_initial_match_then_bookmark(events: &[serde_json::Value]) {
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(events[0]["type"], "ADDED");
        assert_eq!(
            events[0]["object"]["metadata"]["name"],
            format!("p{:05}", SPARSE_N - 1)
        );
        assert_eq!(events[1]["type"], "BOOKMARK");
        assert_eq!(
            events[1]["object"]["metadata"]["annotations"]
                [crate::object::wire::INITIAL_EVENTS_END_ANNOTATION],
            "true"
        );
    }

    /// Polls a watcher of `app!=y` over a cache where only the last object
    /// passes through its three empty steps (each pending and woken again)
    /// and returns the chunk that follows.
    fn sparse_initial_steps(protobuf: bool) -> bytes::Bytes {
        let c = codec(true);
        let cache = Arc::new(WatchCache::new(Arc::clone(&c), "pods".into(), 100));
        cache.init(many_objects(&c, SPARSE_N, &[SPARSE_N - 1]), 10);
        let p = SelectionPredicate::new(
            &c,
            None,
            LabelSelector::parse("app!=y").expect("label selector"),
            FieldSelector::default(),
        );
        let params = WatcherParams {
            allow_bookmarks: true,
            bookmark_interval: Duration::from_secs(3600),
            timeout: None,
            initial_chunk: 100,
        };
        let start = WatchStart::Initial { end_bookmark: true };
        let mut w = Watcher::register(Arc::clone(&cache), p, start, params);
        if protobuf {
            w.use_protobuf();
        }
        let wakes = Arc::new(CountingWaker(Default::default()));
        let waker = std::task::Waker::from(Arc::clone(&wakes));
        let mut cx = std::task::Context::from_waker(&waker);
        // Three steps of nothing, each pending and woken again.
        for i in 1..=3 {
            assert!(w.poll_next(&mut cx).is_pending(), "step {i}");
            assert_eq!(wakes.0.load(std::sync::atomic::Ordering::Relaxed), i);
        }
        let std::task::Poll::Ready(Some(WatchChunk::Data(b))) = w.poll_next(&mut cx) else {
            panic!("the match and the end bookmark");
        };
        assert!(!w.sending_initial_events());
        b
    }

    #[test]
    fn an_initial_step_walks_at_most_its_bound() {
        let c = codec(true);
        let snap = many(&c, 50, &[7, 31, 32, 49]);
        // No index answers `!=`: every object is walked.
        let p = SelectionPredicate::new(
            &c,
            None,
            LabelSelector::parse("app!=y").expect("label selector"),
            FieldSelector::default(),
        );
        let mut steps = Vec::new();
        let mut from: Option<String> = None;
        loop {
            let step = p.initial_step(&snap, from.as_deref(), 10, 8);
            let resume = step.resume_after.clone();
            steps.push((names(&step.items), resume.clone()));
            match resume {
                Some(k) => from = Some(format!("{k}\0")),
                None => break,
            }
        }
        // 8 objects per step: 7 steps to walk 50 (the last finds the end).
        let walked_to: Vec<Option<String>> = steps.iter().map(|(_, r)| r.clone()).collect();
        let expected: Vec<Option<String>> = (1..=6)
            .map(|s| Some(c.key(Some("a"), &format!("p{:05}", 8 * s - 1)).to_string()))
            .chain([None])
            .collect();
        assert_eq!(walked_to, expected);
        let found: Vec<Vec<String>> = steps.into_iter().map(|(n, _)| n).collect();
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            found,
            vec![
                s(&["p00007"]),
                s(&[]),
                s(&[]),
                s(&["p00031"]),
                s(&["p00032"]),
                s(&[]),
                s(&["p00049"]),
            ]
        );
    }

    fn added_names(chunk: WatchChunk) -> Vec<String> {
        let WatchChunk::Data(b) = chunk else {
            panic!("expected data, got {chunk:?}");
        };
        String::from_utf8_lossy(&b)
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("json");
                assert_eq!(v["type"], "ADDED");
                v["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap_or("")
                    .to_string()
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn watch_selects_the_table_like_list() {
        for case in cases() {
            let c = codec(case.0);
            let cache = Arc::new(WatchCache::new(Arc::clone(&c), "pods".into(), 100));
            cache.init(Vec::new(), 10);
            let p = predicate(&c, &case);
            let params = WatcherParams {
                allow_bookmarks: false,
                bookmark_interval: Duration::from_secs(3600),
                timeout: None,
                initial_chunk: 100,
            };
            let mut w = Watcher::register(Arc::clone(&cache), p, WatchStart::After(10), params);
            let changes: Vec<Change> = objects(&c, 11)
                .into_iter()
                .map(|o| Change {
                    key: Arc::clone(&o.key),
                    rv: o.mod_revision,
                    new: Some(o),
                })
                .collect();
            cache.apply(changes, 14, false);
            let got = match tokio::time::timeout(Duration::from_secs(1), w.next()).await {
                Ok(Some(chunk)) => added_names(chunk),
                Ok(None) => panic!("stream ended: {case:?}"),
                Err(_) => Vec::new(),
            };
            assert_eq!(got, case.5, "watch of {case:?}");
        }
    }
}

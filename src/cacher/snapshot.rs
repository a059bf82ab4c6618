//! `Snapshot`: the cache's state at one RV (docs/DESIGN.md section 5).
//!
//! Persistent (imbl) maps make a clone O(1), so the reflector publishes a new
//! immutable snapshot after every batch and readers never block it. Label and
//! configured-field indexes live in the same snapshot so a List is consistent
//! at the snapshot's RV by construction.

use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use imbl::{HashMap as PHashMap, OrdMap, OrdSet};

use crate::object::sharding::ShardSelector;
use crate::object::{FIELD_NAME, FIELD_NAMESPACE, Object};

/// An exact `key=value` fact about an object, used by indexes and watch routes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IndexKey {
    /// The object's namespace (`""` for cluster-scoped). Route only.
    Namespace(String),
    /// The object's name. Route only.
    Name(String),
    Label(String, String),
    /// A configured index path and its value (absent reads as `""`).
    Field(String, String),
    /// A shard selector: the objects whose hash lies in its ranges. Route
    /// only, found by hash ([`IndexedWatchers`](super::indexed_watchers)).
    Shard(Arc<ShardSelector>),
}

/// Index keys kept in a snapshot: labels and configured index fields.
pub fn index_keys(obj: &Object, index_paths: &[Arc<str>]) -> Vec<IndexKey> {
    let mut out = Vec::with_capacity(obj.labels.len() + index_paths.len());
    for (k, v) in &obj.labels {
        out.push(IndexKey::Label(k.clone(), v.clone()));
    }
    for p in index_paths {
        if let Some(v) = obj.field(p) {
            out.push(IndexKey::Field(p.to_string(), v.to_string()));
        }
    }
    out
}

/// Watch routes an object belongs to: its index keys plus namespace and name.
pub fn route_keys(obj: &Object, index_paths: &[Arc<str>]) -> Vec<IndexKey> {
    let mut out = index_keys(obj, index_paths);
    out.push(IndexKey::Namespace(
        obj.namespace.as_deref().unwrap_or("").to_string(),
    ));
    out.push(IndexKey::Name(obj.name.to_string()));
    out
}

/// Maps a field-selector exact pair to the index/route key it implies.
pub fn field_pair_key(path: &str, value: &str, index_paths: &[Arc<str>]) -> Option<IndexKey> {
    match path {
        FIELD_NAMESPACE => Some(IndexKey::Namespace(value.to_string())),
        FIELD_NAME => Some(IndexKey::Name(value.to_string())),
        _ if index_paths.iter().any(|p| &**p == path) => {
            Some(IndexKey::Field(path.to_string(), value.to_string()))
        }
        _ => None,
    }
}

/// The cache's objects (by key) and indexes at one RV.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The cache RV this snapshot represents (may be ahead of the newest
    /// object's mod_revision after a progress notification).
    pub rv: i64,
    /// Sequence number of the first history event NOT reflected here: a
    /// watcher starting from this snapshot starts its cursor here.
    pub next_seq: u64,
    objects: OrdMap<Arc<str>, Arc<Object>>,
    index: PHashMap<IndexKey, OrdSet<Arc<str>>>,
    /// Names the objects this snapshot holds: a change gives it a new value
    /// (never used before); a progress notification, which only moves
    /// `rv`, keeps it. What is built from the objects alone (a List's
    /// items) can be kept for as long as it stays the same.
    contents: u64,
}

/// The last [`Snapshot::contents`] given out.
static CONTENTS: AtomicU64 = AtomicU64::new(0);

impl Snapshot {
    pub fn empty(rv: i64, next_seq: u64) -> Snapshot {
        Snapshot {
            rv,
            next_seq,
            ..Default::default()
        }
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// See the field: equal values mean the same objects (and a larger one
    /// a later change of the same cache).
    pub fn contents(&self) -> u64 {
        self.contents
    }
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    pub fn get(&self, key: &str) -> Option<&Arc<Object>> {
        self.objects.get(key)
    }

    /// All objects in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &Arc<Object>)> {
        self.objects.iter()
    }

    /// The keys carrying `key` (only label and configured-field keys are indexed).
    pub fn index_lookup(&self, key: &IndexKey) -> Option<&OrdSet<Arc<str>>> {
        self.index.get(key)
    }

    /// Whether `key` kind is maintained in this snapshot's index.
    pub fn is_indexed(key: &IndexKey) -> bool {
        matches!(key, IndexKey::Label(..) | IndexKey::Field(..))
    }

    /// Sets (`Some`) or removes (`None`) the object at `key`; returns the previous one.
    pub fn apply(
        &mut self,
        key: &Arc<str>,
        new: Option<Arc<Object>>,
        index_paths: &[Arc<str>],
    ) -> Option<Arc<Object>> {
        self.contents = CONTENTS.fetch_add(1, Ordering::Relaxed) + 1;
        let prev = match &new {
            Some(o) => self.objects.insert(Arc::clone(key), Arc::clone(o)),
            None => self.objects.remove(&**key),
        };
        // Only the index entries that differ change: an update that keeps
        // its labels and fields (most do) touches no index set.
        let old_keys = prev
            .as_deref()
            .map(|p| index_keys(p, index_paths))
            .unwrap_or_default();
        let new_keys = new
            .as_deref()
            .map(|o| index_keys(o, index_paths))
            .unwrap_or_default();
        for ik in old_keys.iter().filter(|k| !new_keys.contains(k)) {
            let mut drop_entry = false;
            if let Some(set) = self.index.get_mut(ik) {
                set.remove(&**key);
                drop_entry = set.is_empty();
            }
            if drop_entry {
                self.index.remove(ik);
            }
        }
        for ik in new_keys {
            if !old_keys.contains(&ik) {
                self.index.entry(ik).or_default().insert(Arc::clone(key));
            }
        }
        prev
    }

    /// Objects with keys in `[from, ..)` that start with `prefix`, in key
    /// order; `from` is inclusive.
    pub fn range_from<'a>(
        &'a self,
        prefix: &'a str,
        from: &'a str,
    ) -> impl Iterator<Item = &'a Arc<Object>> + 'a {
        let start = if from > prefix { from } else { prefix };
        let end = prefix_end(prefix);
        self.objects
            .range::<_, str>((Bound::Included(start), excluded(&end)))
            // Only without an end bound: a bounded range never reads a key
            // (each would be a cache miss on a large List).
            .take_while(move |(k, _)| end.is_some() || k.starts_with(prefix))
            .map(|(_, o)| o)
    }

    /// Like [`Snapshot::range_from`] but only over the keys of an index set.
    pub fn indexed_range_from<'a>(
        &'a self,
        set: &'a OrdSet<Arc<str>>,
        prefix: &'a str,
        from: &'a str,
    ) -> impl Iterator<Item = &'a Arc<Object>> + 'a {
        let start = if from > prefix { from } else { prefix };
        let end = prefix_end(prefix);
        set.range::<_, str>((Bound::Included(start), excluded(&end)))
            .take_while(move |k| end.is_some() || k.starts_with(prefix))
            .filter_map(move |k| self.objects.get(&**k))
    }
}

/// The least string above every string that starts with `prefix` (its last
/// character incremented; str order is code point order), so a prefix walk
/// can be a bounded range. `None` when there is no such string.
fn prefix_end(prefix: &str) -> Option<String> {
    let last = prefix.chars().next_back()?;
    let next = (last as u32 + 1..=char::MAX as u32).find_map(char::from_u32)?;
    let mut end = String::with_capacity(prefix.len() + 1);
    end.push_str(&prefix[..prefix.len() - last.len_utf8()]);
    end.push(next);
    Some(end)
}

fn excluded(end: &Option<String>) -> Bound<&str> {
    match end {
        Some(e) => Bound::Excluded(e.as_str()),
        None => Bound::Unbounded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::collections::BTreeMap;

    fn obj(ns: &str, name: &str, labels: &[(&str, &str)], node: Option<&str>) -> Arc<Object> {
        let mut o = crate::object::tests::object(ns, name, Bytes::from_static(b"{}"));
        o.labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>();
        o.fields = node
            .map(|n| vec![(Arc::from("spec.nodeName"), n.to_string())])
            .unwrap_or_default();
        Arc::new(o)
    }

    fn paths() -> Vec<Arc<str>> {
        vec![Arc::from("spec.nodeName")]
    }

    #[test]
    fn contents_change_with_the_objects_and_only_with_them() {
        let mut s = Snapshot::empty(1, 0);
        let k: Arc<str> = Arc::from("/r/pods/ns/a");
        s.apply(&k, Some(obj("ns", "a", &[], None)), &paths());
        let c = s.contents();
        // A progress notification: a newer RV, the same objects.
        let mut later = s.clone();
        later.rv = 9;
        assert_eq!(later.contents(), c);
        later.apply(&k, None, &paths());
        assert!(later.contents() > c);
        assert_eq!(s.contents(), c);
        let mut other = Snapshot::empty(1, 0);
        other.apply(&k, Some(obj("ns", "a", &[], None)), &paths());
        assert_ne!(other.contents(), c, "every change gets a value of its own");
    }

    #[test]
    fn apply_maintains_indexes_and_old_snapshots_are_unchanged() {
        let p = paths();
        let mut s = Snapshot::empty(1, 0);
        let a = obj("ns1", "a", &[("app", "x")], Some("n1"));
        let ka = Arc::clone(&a.key);
        assert!(s.apply(&ka, Some(a), &p).is_none());
        let b = obj("ns1", "b", &[("app", "y")], None);
        s.apply(&Arc::clone(&b.key), Some(b), &p);
        let old = s.clone();

        let a2 = obj("ns1", "a", &[("app", "y")], Some("n2"));
        let prev = s.apply(&ka, Some(a2), &p);
        assert_eq!(prev.map(|o| o.labels["app"].clone()), Some("x".into()));
        let lx = IndexKey::Label("app".into(), "x".into());
        let ly = IndexKey::Label("app".into(), "y".into());
        assert!(s.index_lookup(&lx).is_none(), "emptied entries are dropped");
        assert_eq!(s.index_lookup(&ly).map(|x| x.len()), Some(2));
        // absent field indexes as ""
        let unscheduled = IndexKey::Field("spec.nodeName".into(), "".into());
        assert_eq!(s.index_lookup(&unscheduled).map(|x| x.len()), Some(1));
        // the old snapshot still sees the old state
        assert_eq!(old.index_lookup(&lx).map(|x| x.len()), Some(1));
        assert_eq!(
            old.get("/r/pods/ns1/a").map(|o| o.labels["app"].as_str()),
            Some("x")
        );

        // An update that keeps labels and fields keeps the index entries.
        let a3 = obj("ns1", "a", &[("app", "y")], Some("n2"));
        s.apply(&ka, Some(a3), &p);
        assert_eq!(s.index_lookup(&ly).map(|x| x.len()), Some(2));
        let n2 = IndexKey::Field("spec.nodeName".into(), "n2".into());
        assert_eq!(s.index_lookup(&n2).map(|x| x.len()), Some(1));

        s.apply(&ka, None, &p);
        assert!(s.get("/r/pods/ns1/a").is_none());
        assert!(s.index_lookup(&n2).is_none());
        assert_eq!(s.index_lookup(&ly).map(|x| x.len()), Some(1));
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn prefix_end_is_the_least_string_above_the_prefix() {
        assert_eq!(prefix_end("/r/pods/").as_deref(), Some("/r/pods0"));
        assert_eq!(prefix_end("/r/é").as_deref(), Some("/r/ê"));
        assert_eq!(prefix_end("x\u{D7FF}").as_deref(), Some("x\u{E000}"));
        assert_eq!(prefix_end("x\u{10FFFF}"), None);
        assert_eq!(prefix_end(""), None);
        for k in ["/r/pods/", "/r/pods/\u{10FFFF}\u{10FFFF}", "/r/pods/a"] {
            assert!(k < prefix_end("/r/pods/").unwrap().as_str(), "{k}");
        }
    }

    #[test]
    fn ranges_respect_prefix_and_start() {
        let p = paths();
        let mut s = Snapshot::empty(1, 0);
        // "a." and "a0" sort just below and just above every "a/" key.
        for (ns, n) in [
            ("a", "1"),
            ("a", "2"),
            ("a.", "1"),
            ("a0", "1"),
            ("ab", "1"),
            ("b", "1"),
        ] {
            let o = obj(ns, n, &[("k", "v")], None);
            s.apply(&Arc::clone(&o.key), Some(o), &p);
        }
        let names = |it: Vec<&Arc<Object>>| {
            it.iter()
                .map(|o| format!("{}/{}", o.namespace.as_deref().unwrap_or(""), o.name))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(s.range_from("/r/pods/a/", "").collect()),
            vec!["a/1", "a/2"]
        );
        assert_eq!(
            names(s.range_from("/r/pods/", "/r/pods/a/2\0").collect()),
            vec!["a0/1", "ab/1", "b/1"]
        );
        let set = s
            .index_lookup(&IndexKey::Label("k".into(), "v".into()))
            .unwrap()
            .clone();
        assert_eq!(
            names(
                s.indexed_range_from(&set, "/r/pods/a/", "/r/pods/a/1\0")
                    .collect()
            ),
            vec!["a/2"]
        );
    }
}

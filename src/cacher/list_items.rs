//! The items of a List answer.
//!
//! Why not always a `Vec`: a List of everything under a prefix (no selector,
//! no limit, the common informer relist) would first walk the whole range
//! and take a reference count on every object before its first byte could
//! go out, then drop them all at the end. Such a List instead keeps the
//! (immutable) snapshot and walks it while the body is written, a frame at a
//! time, so the walk overlaps the socket writes and costs no allocation.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::Arc;

use crate::object::Object;
use crate::prefetch::prefetch;

use super::Snapshot;

/// See the module documentation.
#[derive(Debug, Clone)]
pub enum ListItems {
    /// A page, a selection, or an answer from etcd: already chosen.
    Collected(Vec<Arc<Object>>),
    /// Every object of `snap` under `prefix` from `from` on (inclusive).
    Range {
        snap: Arc<Snapshot>,
        prefix: String,
        from: String,
    },
}

impl ListItems {
    /// The items in key order.
    pub fn iter(&self) -> Box<dyn Iterator<Item = &Arc<Object>> + Send + '_> {
        match self {
            ListItems::Collected(v) => Box::new(v.iter()),
            ListItems::Range { snap, prefix, from } => Box::new(snap.range_from(prefix, from)),
        }
    }

    /// How many items (a walk of the range for [`ListItems::Range`]).
    pub fn len(&self) -> usize {
        match self {
            ListItems::Collected(v) => v.len(),
            ListItems::Range { .. } => self.iter().count(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }

    /// The `i`th item in key order (a walk for [`ListItems::Range`]).
    pub fn get(&self, i: usize) -> Option<&Arc<Object>> {
        self.iter().nth(i)
    }

    /// A cursor that hands the items out a batch at a time.
    pub fn into_cursor(self) -> ListCursor {
        ListCursor {
            items: self,
            next: Next::Index(0),
        }
    }
}

/// Walks [`ListItems`] in batches (see [`ListCursor::visit`]).
#[derive(Debug)]
pub struct ListCursor {
    items: ListItems,
    next: Next,
}

/// Where the next batch starts.
#[derive(Debug)]
enum Next {
    /// At this index of a collected list, or at the start of a range.
    Index(usize),
    /// At this key of a range (the first item not yet visited).
    Key(Arc<str>),
    Done,
}

impl ListCursor {
    /// Calls `f` with each item from where the last call stopped, until `f`
    /// breaks (the item it broke on is visited again next time) or the items
    /// end. Returns whether items remain.
    pub fn visit(&mut self, f: impl FnMut(&Arc<Object>) -> ControlFlow<()>) -> bool {
        let next = std::mem::replace(&mut self.next, Next::Done);
        match (&self.items, next) {
            (_, Next::Done) | (ListItems::Collected(_), Next::Key(_)) => {}
            (ListItems::Collected(v), Next::Index(start)) => {
                if let Some((at, _)) = walk(v.iter().skip(start), f) {
                    self.next = Next::Index(start + at);
                    return true;
                }
            }
            (ListItems::Range { snap, prefix, from }, next) => {
                let from: &str = match &next {
                    Next::Key(k) => k,
                    _ => from,
                };
                if let Some((_, o)) = walk(snap.range_from(prefix, from), f) {
                    self.next = Next::Key(Arc::clone(&o.key));
                    return true;
                }
            }
        }
        false
    }
}

/// How far ahead of `f` the walk reaches. An item costs two dependent cache
/// misses (its `Object`, then its bytes) when a large List walks a snapshot
/// bigger than the cache; prefetching the object `2 * AHEAD` items early and
/// its bytes `AHEAD` items early hides both behind the copying of the items
/// before it.
pub(crate) const AHEAD: usize = 8;

/// Calls `f` on each item until it breaks; returns the item it broke on
/// and its index.
fn walk<'a>(
    items: impl Iterator<Item = &'a Arc<Object>>,
    mut f: impl FnMut(&Arc<Object>) -> ControlFlow<()>,
) -> Option<(usize, &'a Arc<Object>)> {
    let mut items = items.fuse();
    let mut window: VecDeque<&Arc<Object>> = VecDeque::with_capacity(2 * AHEAD);
    for i in 0.. {
        while window.len() < 2 * AHEAD {
            let Some(o) = items.next() else { break };
            prefetch(&o.wire);
            window.push_back(o);
        }
        if let Some(o) = window.get(AHEAD) {
            prefetch(o.wire.as_ptr());
        }
        let o = window.pop_front()?;
        if f(o).is_break() {
            return Some((i, o));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(name: &str) -> Arc<Object> {
        obj_in("ns", name)
    }

    fn obj_in(ns: &str, name: &str) -> Arc<Object> {
        let wire = format!("{{\"name\":\"{name}\"}}");
        Arc::new(crate::object::tests::object(ns, name, wire))
    }

    fn names(items: &ListItems) -> Vec<String> {
        items.iter().map(|o| o.name.to_string()).collect()
    }

    /// Visits in batches of at most `n`, one batch per call.
    fn batches(items: ListItems, n: usize) -> Vec<Vec<String>> {
        let mut cursor = items.into_cursor();
        let mut out = Vec::new();
        loop {
            let mut batch = Vec::new();
            let more = cursor.visit(|o| {
                if batch.len() == n {
                    return ControlFlow::Break(());
                }
                batch.push(o.name.to_string());
                ControlFlow::Continue(())
            });
            out.push(batch);
            if !more {
                return out;
            }
        }
    }

    fn snapshot() -> Arc<Snapshot> {
        let mut s = Snapshot::empty(1, 0);
        for n in ["a", "b", "c", "d", "e"] {
            let o = obj(n);
            s.apply(&Arc::clone(&o.key), Some(o), &[]);
        }
        // Outside the prefix on both sides.
        for ns in ["nr", "nt"] {
            let o = obj_in(ns, "x");
            s.apply(&Arc::clone(&o.key), Some(o), &[]);
        }
        Arc::new(s)
    }

    #[test]
    fn a_range_is_walked_in_batches_that_resume_where_they_stopped() {
        let range = ListItems::Range {
            snap: snapshot(),
            prefix: "/r/pods/ns/".into(),
            from: "/r/pods/ns/b".into(),
        };
        assert_eq!(names(&range), ["b", "c", "d", "e"]);
        assert_eq!(range.len(), 4);
        assert_eq!(range.get(1).map(|o| &*o.name), Some("c"));
        assert_eq!(batches(range.clone(), 3), [vec!["b", "c", "d"], vec!["e"]]);
        assert_eq!(batches(range.clone(), 2), [vec!["b", "c"], vec!["d", "e"]]);
    }

    #[test]
    fn a_collected_list_is_walked_in_the_same_batches() {
        let items = ListItems::Collected(["a", "b", "c"].map(obj).to_vec());
        assert_eq!(names(&items), ["a", "b", "c"]);
        assert_eq!(batches(items.clone(), 2), [vec!["a", "b"], vec!["c"]]);
        assert_eq!(batches(items, 5), [vec!["a", "b", "c"]]);
        let empty = ListItems::Collected(Vec::new());
        assert!(empty.is_empty());
        assert_eq!(batches(empty, 1), [Vec::<String>::new()]);
    }
}

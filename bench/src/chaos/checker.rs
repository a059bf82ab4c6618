//! The chaos run's independent checker.
//!
//! It shares no code with the cache: its truth is etcd's own history (read by
//! [`super::recorder`] with a plain etcd watch), replayed here into the state
//! at any revision, and its input is what the clients saw on the wire. It
//! checks, for every watcher, that the stream equals etcd's history for the
//! watcher's selection from its start revision (ordered, no duplicates, no
//! gaps; a 410 Expired then a relist is allowed), that every List equals etcd
//! at its resourceVersion, that every acknowledged write is in etcd's history,
//! and that the daemon's final List equals etcd.
//!
//! One allowance, from docs/DESIGN.md section 4: when etcd compacts history the
//! daemon has not seen (the bench does that only while it cuts the daemon
//! off), the daemon relists and sends watchers the difference: each changed
//! key once at its newest revision, deletions at the relist revision. Inside
//! such a window (from the watcher's position before the compaction up to the
//! revision the daemon was confirmed caught up at) a missing intermediate event
//! is not a gap, but every event must still be true and the watcher's state
//! at the window's end must equal etcd's state there.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;
use serde_json::Value;

/// A listed object: (name, resourceVersion, object without resourceVersion).
pub type Item = (String, i64, Value);

/// An object's name and its state: (mod revision, value without resourceVersion).
pub type State = BTreeMap<String, (i64, Value)>;

/// One change in etcd's history (a put, or a delete when `value` is `None`).
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub rev: i64,
    /// The object's name (the key below the namespace prefix).
    pub name: String,
    pub value: Option<Value>,
}

/// etcd's history of the namespace: the state at `base_rev`, then every change.
#[derive(Debug, Clone, Default)]
pub struct History {
    pub base_rev: i64,
    pub base: State,
    /// In revision order.
    pub changes: Vec<Change>,
}

impl History {
    /// The state at revision `rev` (`rev` >= `base_rev`).
    pub fn state_at(&self, rev: i64) -> State {
        let mut s = self.base.clone();
        for c in self.changes.iter().take_while(|c| c.rev <= rev) {
            match &c.value {
                Some(v) => {
                    s.insert(c.name.clone(), (c.rev, v.clone()));
                }
                None => {
                    s.remove(&c.name);
                }
            }
        }
        s
    }

    /// The newest revision the history knows.
    pub fn last_rev(&self) -> i64 {
        self.changes.last().map_or(self.base_rev, |c| c.rev)
    }
}

/// What a client selects: every object of the namespace, or those whose label
/// `group` has a value (`labelSelector=group=VALUE`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub enum Selection {
    All,
    Group(String),
}

impl Selection {
    pub fn matches(&self, obj: &Value) -> bool {
        match self {
            Selection::All => true,
            Selection::Group(g) => obj["metadata"]["labels"]["group"].as_str() == Some(g),
        }
    }

    /// The `labelSelector` query value, if any.
    pub fn label_selector(&self) -> Option<String> {
        match self {
            Selection::All => None,
            Selection::Group(g) => Some(format!("group={g}")),
        }
    }

    fn filter(&self, s: &State) -> State {
        s.iter()
            .filter(|(_, (_, v))| self.matches(v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// A watch event type, as the checker reads it off the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Kind {
    Added,
    Modified,
    Deleted,
}

/// What a watcher saw, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Obs {
    /// A complete List (all pages) at `rv`: (name, resourceVersion, object).
    List {
        rv: i64,
        items: Vec<Item>,
    },
    /// A watch request from resourceVersion `from`.
    Watch {
        from: i64,
    },
    /// An ADDED/MODIFIED/DELETED event (`object` without resourceVersion).
    Event {
        kind: Kind,
        name: String,
        rv: i64,
        object: Value,
    },
    Bookmark {
        rv: i64,
    },
    /// 410 Expired (an ERROR event or the watch request's status).
    Expired,
    /// The stream ended (timeout, disconnect, daemon restart).
    Closed,
}

/// Everything one client observed.
#[derive(Debug, Clone)]
pub struct ClientLog {
    pub name: String,
    pub selection: Selection,
    pub obs: Vec<Obs>,
}

/// A write the daemon or etcd acknowledged.
#[derive(Debug, Clone)]
pub struct Ack {
    pub name: String,
    pub rev: i64,
    /// `spec.writeId` of the written object (`None`: a delete).
    pub write_id: Option<String>,
}

/// A compaction the bench made while the daemon was cut off from etcd.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Compaction {
    /// The compaction revision.
    pub rev: i64,
    /// A revision the daemon was confirmed to have reached after it.
    pub caught_up: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum ViolationKind {
    /// An event of etcd's history the watcher never got.
    Gap,
    /// The same event twice.
    Duplicate,
    /// An event older than the one before it.
    OutOfOrder,
    /// An event that is not in etcd's history (wrong object, type or revision).
    WrongEvent,
    /// A List that differs from etcd at its resourceVersion.
    WrongList,
    /// A watcher whose state differs from etcd at a bookmark or after a relist window.
    WrongState,
    /// An acknowledged write missing from etcd's history.
    LostWrite,
    /// The daemon's final List differs from etcd (or is older than etcd's last write).
    FinalMismatch,
    /// A watcher's stream made no sense (events before any List or watch).
    Protocol,
}

#[derive(Debug, Clone, Serialize)]
pub struct Violation {
    pub kind: ViolationKind,
    pub client: String,
    pub detail: String,
}

/// The checker's totals.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub events_checked: u64,
    pub bookmarks_checked: u64,
    pub lists_checked: u64,
    pub writes_acknowledged: u64,
    pub expired: u64,
    /// Events accepted as part of a relist difference (compaction windows).
    pub relist_events: u64,
    /// History events a watcher missed inside a compaction window (not gaps).
    pub compacted_events_skipped: u64,
    pub violations: Vec<Violation>,
}

impl Report {
    fn violation(&mut self, kind: ViolationKind, client: &str, detail: String) {
        self.violations.push(Violation {
            kind,
            client: client.to_string(),
            detail,
        });
    }

    /// Violations by kind.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for v in &self.violations {
            *m.entry(format!("{:?}", v.kind)).or_insert(0) += 1;
        }
        m
    }
}

/// One event of a selection's history: what a watcher of it must see.
#[derive(Debug, Clone)]
struct Expected {
    rev: i64,
    name: String,
    kind: Kind,
    /// The object the event carries: the new one, or for DELETED the last
    /// one in the selection (Kubernetes sends the deleted object).
    value: Value,
}

/// The events a watcher of `sel` sees for `history`: a change that makes an
/// object enter the selection is ADDED, one that keeps it in is MODIFIED, one
/// that makes it leave (delete, or a label change) is DELETED.
fn selection_events(history: &History, sel: &Selection) -> Vec<Expected> {
    let mut state = history.base.clone();
    let mut out = Vec::new();
    for c in &history.changes {
        let prev = state
            .get(&c.name)
            .map(|(_, v)| v)
            .filter(|v| sel.matches(v));
        let old = prev.is_some();
        let new = c.value.as_ref().is_some_and(|v| sel.matches(v));
        let kind = match (old, new) {
            (false, true) => Some(Kind::Added),
            (true, true) => Some(Kind::Modified),
            (true, false) => Some(Kind::Deleted),
            (false, false) => None,
        };
        let value = match kind {
            Some(Kind::Deleted) => prev.cloned(),
            _ => c.value.clone(),
        };
        if let (Some(kind), Some(value)) = (kind, value) {
            out.push(Expected {
                rev: c.rev,
                name: c.name.clone(),
                kind,
                value,
            });
        }
        match &c.value {
            Some(v) => {
                state.insert(c.name.clone(), (c.rev, v.clone()));
            }
            None => {
                state.remove(&c.name);
            }
        }
    }
    out
}

fn describe_state_diff(want: &State, got: &State) -> String {
    let mut missing = Vec::new();
    let mut extra = Vec::new();
    let mut differ = Vec::new();
    for (k, v) in want {
        match got.get(k) {
            None => missing.push(format!("{k}@{}", v.0)),
            Some(g) if g != v => differ.push(format!("{k}: want @{} got @{}", v.0, g.0)),
            Some(_) => {}
        }
    }
    for (k, v) in got {
        if !want.contains_key(k) {
            extra.push(format!("{k}@{}", v.0));
        }
    }
    let cut = |v: Vec<String>| -> String {
        let n = v.len();
        let mut s = v.into_iter().take(5).collect::<Vec<_>>().join(", ");
        if n > 5 {
            s.push_str(&format!(" (+{} more)", n - 5));
        }
        s
    };
    format!(
        "missing [{}], unexpected [{}], different [{}]",
        cut(missing),
        cut(extra),
        cut(differ)
    )
}

/// Checks one client's stream against the expected events of its selection.
struct WatcherCheck<'a> {
    h: &'a History,
    compactions: &'a [Compaction],
    expected: &'a [Expected],
    name: &'a str,
    sel: &'a Selection,
    view: State,
    /// Expected events before this index are resolved (matched, reported or excused).
    next: usize,
    /// Expected events at or after `next` already matched.
    matched: HashSet<usize>,
    seen: HashSet<(String, i64, Kind)>,
    /// The newest revision the watcher has reached (events and bookmarks).
    last_rv: i64,
    /// Whether a List has established the watcher's state.
    listed: bool,
    /// An open compaction window: the compaction it belongs to.
    window: Option<Compaction>,
}

impl<'a> WatcherCheck<'a> {
    /// A compaction the daemon may not have seen from the watcher's position.
    fn compaction_covering(&self, rev: i64) -> Option<Compaction> {
        if let Some(w) = self.window
            && rev <= w.caught_up
        {
            return Some(w);
        }
        self.compactions
            .iter()
            .copied()
            .find(|c| self.last_rv < c.rev && rev <= c.caught_up)
    }

    /// Resolves every expected event with revision < `before` (or <= when
    /// `inclusive`): an unmatched one is a gap, unless a compaction window covers it.
    fn flush(&mut self, r: &mut Report, before: i64, inclusive: bool) {
        while let Some(e) = self.expected.get(self.next) {
            if e.rev > before || (e.rev == before && !inclusive) {
                break;
            }
            if !self.matched.remove(&self.next) {
                if let Some(c) = self.compaction_covering(e.rev) {
                    self.window.get_or_insert(c);
                    r.compacted_events_skipped += 1;
                } else {
                    r.violation(
                        ViolationKind::Gap,
                        self.name,
                        format!("missed {:?} {} at revision {}", e.kind, e.name, e.rev),
                    );
                }
            }
            self.next += 1;
        }
    }

    /// Closes an open compaction window once the watcher is past it: its state
    /// must equal etcd's at some revision the daemon may have relisted at.
    fn close_window(&mut self, r: &mut Report, at: i64) {
        let Some(w) = self.window else { return };
        if at < w.caught_up {
            return;
        }
        self.window = None;
        let ok = (w.rev..=w.caught_up).any(|b| self.sel.filter(&self.h.state_at(b)) == self.view);
        if !ok {
            let want = self.sel.filter(&self.h.state_at(w.caught_up));
            r.violation(
                ViolationKind::WrongState,
                self.name,
                format!(
                    "after the relist window of compaction {} (daemon caught up by {}): {}",
                    w.rev,
                    w.caught_up,
                    describe_state_diff(&want, &self.view)
                ),
            );
            // Report a wrong state once, not again at every later check.
            self.view = want;
        }
    }

    fn list(&mut self, r: &mut Report, rv: i64, items: &[Item]) {
        r.lists_checked += 1;
        let got: State = items
            .iter()
            .map(|(n, rv, v)| (n.clone(), (*rv, v.clone())))
            .collect();
        if got.len() != items.len() {
            r.violation(
                ViolationKind::WrongList,
                self.name,
                format!("List at {rv} holds a name twice"),
            );
        }
        if rv < self.h.base_rev {
            r.violation(
                ViolationKind::WrongList,
                self.name,
                format!(
                    "List at {rv}, before the recorded history ({})",
                    self.h.base_rev
                ),
            );
        } else {
            let want = self.sel.filter(&self.h.state_at(rv));
            if want != got {
                r.violation(
                    ViolationKind::WrongList,
                    self.name,
                    format!("List at {rv}: {}", describe_state_diff(&want, &got)),
                );
            }
        }
        self.view = got;
        self.last_rv = rv;
        self.next = self.expected.partition_point(|e| e.rev <= rv);
        self.matched.clear();
        self.seen.clear();
        self.window = None;
        self.listed = true;
    }

    fn event(&mut self, r: &mut Report, kind: Kind, name: &str, rv: i64, object: &Value) {
        if !self.listed {
            r.violation(
                ViolationKind::Protocol,
                self.name,
                format!("{kind:?} {name}@{rv} before any List"),
            );
            return;
        }
        r.events_checked += 1;
        if rv < self.last_rv {
            r.violation(
                ViolationKind::OutOfOrder,
                self.name,
                format!("{kind:?} {name}@{rv} after revision {}", self.last_rv),
            );
            return;
        }
        if !self.seen.insert((name.to_string(), rv, kind)) {
            r.violation(
                ViolationKind::Duplicate,
                self.name,
                format!("{kind:?} {name}@{rv} twice"),
            );
            return;
        }
        self.flush(r, rv, false);
        if let Some(w) = self.window
            && rv > w.caught_up
        {
            self.close_window(r, rv);
        }
        // The expected event of this name at this revision, if any.
        let mut found = None;
        let mut i = self.next;
        while let Some(e) = self.expected.get(i) {
            if e.rev != rv {
                break;
            }
            if e.name == name && !self.matched.contains(&i) {
                found = Some(i);
                break;
            }
            i += 1;
        }
        let exact = found.is_some_and(|i| {
            let e = &self.expected[i];
            e.kind == kind && &e.value == object
        });
        if exact {
            if let Some(i) = found {
                self.matched.insert(i);
            }
        } else if let Some(c) = self
            .compaction_covering(rv)
            .filter(|_| self.relist_true(kind, name, rv, object))
        {
            // Part of a relist difference: true for some relist revision.
            self.window.get_or_insert(c);
            r.relist_events += 1;
        } else {
            r.violation(
                ViolationKind::WrongEvent,
                self.name,
                match found {
                    Some(i) => format!(
                        "{kind:?} {name}@{rv}, but etcd's history has {:?} {name}@{rv}{}",
                        self.expected[i].kind,
                        if self.expected[i].kind == kind {
                            " with another object"
                        } else {
                            ""
                        }
                    ),
                    None => {
                        format!("{kind:?} {name}@{rv} is not in etcd's history for this selection")
                    }
                },
            );
        }
        match kind {
            Kind::Added | Kind::Modified => {
                self.view.insert(name.to_string(), (rv, object.clone()));
            }
            Kind::Deleted => {
                self.view.remove(name);
            }
        }
        self.last_rv = rv;
    }

    /// Whether an event fits a relist at some revision the window allows: a
    /// put is the object's newest version there, a delete finds it gone (or
    /// out of the selection).
    fn relist_true(&self, kind: Kind, name: &str, rv: i64, object: &Value) -> bool {
        let Some(c) = self.compaction_covering(rv) else {
            return false;
        };
        (c.rev.max(rv)..=c.caught_up).any(|b| {
            let s = self.h.state_at(b);
            match kind {
                Kind::Added | Kind::Modified => s
                    .get(name)
                    .is_some_and(|(m, v)| *m == rv && v == object && self.sel.matches(v)),
                // Gone at b, and carrying the object the watcher had.
                Kind::Deleted => {
                    !s.get(name).is_some_and(|(_, v)| self.sel.matches(v))
                        && self.view.get(name).is_some_and(|(_, v)| v == object)
                }
            }
        })
    }

    fn bookmark(&mut self, r: &mut Report, rv: i64) {
        if !self.listed {
            return;
        }
        if rv < self.last_rv {
            r.violation(
                ViolationKind::OutOfOrder,
                self.name,
                format!("BOOKMARK @{rv} after revision {}", self.last_rv),
            );
            return;
        }
        r.bookmarks_checked += 1;
        self.flush(r, rv, true);
        self.last_rv = rv;
        if self.window.is_some() {
            self.close_window(r, rv);
        }
        if self.window.is_none() {
            let want = self.sel.filter(&self.h.state_at(rv));
            if want != self.view {
                r.violation(
                    ViolationKind::WrongState,
                    self.name,
                    format!(
                        "at BOOKMARK @{rv}: {}",
                        describe_state_diff(&want, &self.view)
                    ),
                );
                // Report a wrong state once, not at every later bookmark.
                self.view = want;
            }
        }
    }

    fn watch(&mut self, r: &mut Report, from: i64) {
        if !self.listed {
            r.violation(
                ViolationKind::Protocol,
                self.name,
                format!("watch from {from} before any List"),
            );
            return;
        }
        // Everything before the resume point must have arrived.
        self.flush(r, from, false);
    }

    fn closed(&mut self, r: &mut Report) {
        if self.listed {
            self.flush(r, self.last_rv, false);
        }
    }
}

/// Checks everything the clients saw against etcd's history.
pub fn check(
    history: &History,
    compactions: &[Compaction],
    clients: &[ClientLog],
    acks: &[Ack],
    final_list: Option<(i64, &[Item])>,
) -> Report {
    let mut r = Report::default();
    let mut by_sel: HashMap<&Selection, Vec<Expected>> = HashMap::new();
    for c in clients {
        by_sel
            .entry(&c.selection)
            .or_insert_with(|| selection_events(history, &c.selection));
    }
    for c in clients {
        let expected = &by_sel[&c.selection];
        let mut w = WatcherCheck {
            h: history,
            compactions,
            expected,
            name: &c.name,
            sel: &c.selection,
            view: State::new(),
            next: 0,
            matched: HashSet::new(),
            seen: HashSet::new(),
            last_rv: 0,
            listed: false,
            window: None,
        };
        for o in &c.obs {
            match o {
                Obs::List { rv, items } => w.list(&mut r, *rv, items),
                Obs::Watch { from } => w.watch(&mut r, *from),
                Obs::Event {
                    kind,
                    name,
                    rv,
                    object,
                } => w.event(&mut r, *kind, name, *rv, object),
                Obs::Bookmark { rv } => w.bookmark(&mut r, *rv),
                Obs::Expired => {
                    r.expired += 1;
                    w.closed(&mut r);
                    // A relist follows; until then nothing is promised.
                    w.listed = false;
                }
                Obs::Closed => w.closed(&mut r),
            }
        }
        w.closed(&mut r);
    }

    // Acknowledged writes.
    let mut by_rev: HashMap<(i64, &str), &Change> = HashMap::new();
    for c in &history.changes {
        by_rev.insert((c.rev, c.name.as_str()), c);
    }
    for a in acks {
        r.writes_acknowledged += 1;
        let ok =
            by_rev
                .get(&(a.rev, a.name.as_str()))
                .is_some_and(|c| match (&a.write_id, &c.value) {
                    (Some(id), Some(v)) => v["spec"]["writeId"].as_str() == Some(id),
                    (None, None) => true,
                    _ => false,
                });
        if !ok {
            r.violation(
                ViolationKind::LostWrite,
                "writers",
                format!(
                    "{} of {} acknowledged at revision {} is not in etcd's history",
                    a.write_id.as_deref().unwrap_or("delete"),
                    a.name,
                    a.rev
                ),
            );
        }
    }

    // The daemon's final state.
    if let Some((rv, items)) = final_list {
        r.lists_checked += 1;
        let got: State = items
            .iter()
            .map(|(n, rv, v)| (n.clone(), (*rv, v.clone())))
            .collect();
        let want = history.state_at(rv);
        if want != got {
            r.violation(
                ViolationKind::FinalMismatch,
                "final list",
                format!("at {rv}: {}", describe_state_diff(&want, &got)),
            );
        }
        if rv < history.last_rev() {
            r.violation(
                ViolationKind::FinalMismatch,
                "final list",
                format!(
                    "consistent List at {rv}, older than etcd's last change ({})",
                    history.last_rev()
                ),
            );
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(name: &str, group: &str, n: i64) -> Value {
        json!({"metadata": {"name": name, "labels": {"group": group}}, "spec": {"writeId": format!("w{n}")}})
    }

    /// a@2 (group a), b@3 (b), a@4 (a -> b), c@5 (a), b deleted @6.
    fn history() -> History {
        History {
            base_rev: 1,
            base: State::new(),
            changes: vec![
                Change {
                    rev: 2,
                    name: "a".into(),
                    value: Some(obj("a", "a", 2)),
                },
                Change {
                    rev: 3,
                    name: "b".into(),
                    value: Some(obj("b", "b", 3)),
                },
                Change {
                    rev: 4,
                    name: "a".into(),
                    value: Some(obj("a", "b", 4)),
                },
                Change {
                    rev: 5,
                    name: "c".into(),
                    value: Some(obj("c", "a", 5)),
                },
                Change {
                    rev: 6,
                    name: "b".into(),
                    value: None,
                },
            ],
        }
    }

    fn ev(kind: Kind, name: &str, rv: i64, o: Value) -> Obs {
        Obs::Event {
            kind,
            name: name.into(),
            rv,
            object: o,
        }
    }

    fn empty_list(rv: i64) -> Obs {
        Obs::List { rv, items: vec![] }
    }

    /// The exact stream of an all-objects watcher from revision 1.
    fn clean_all() -> Vec<Obs> {
        vec![
            empty_list(1),
            Obs::Watch { from: 1 },
            ev(Kind::Added, "a", 2, obj("a", "a", 2)),
            ev(Kind::Added, "b", 3, obj("b", "b", 3)),
            ev(Kind::Modified, "a", 4, obj("a", "b", 4)),
            ev(Kind::Added, "c", 5, obj("c", "a", 5)),
            ev(Kind::Deleted, "b", 6, obj("b", "b", 3)),
            Obs::Bookmark { rv: 6 },
            Obs::Closed,
        ]
    }

    fn run(obs: Vec<Obs>, sel: Selection) -> Report {
        let c = ClientLog {
            name: "w".into(),
            selection: sel,
            obs,
        };
        check(&history(), &[], &[c], &[], None)
    }

    fn kinds(r: &Report) -> Vec<ViolationKind> {
        r.violations.iter().map(|v| v.kind).collect()
    }

    #[test]
    fn a_clean_stream_passes() {
        let r = run(clean_all(), Selection::All);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(
            (r.events_checked, r.bookmarks_checked, r.lists_checked),
            (5, 1, 1)
        );
    }

    #[test]
    fn a_selection_stream_sees_label_changes_as_added_and_deleted() {
        let obs = vec![
            empty_list(1),
            Obs::Watch { from: 1 },
            ev(Kind::Added, "a", 2, obj("a", "a", 2)),
            // a leaves group a at 4; c enters at 5.
            ev(Kind::Deleted, "a", 4, obj("a", "a", 2)),
            ev(Kind::Added, "c", 5, obj("c", "a", 5)),
            Obs::Bookmark { rv: 6 },
        ];
        let r = run(obs, Selection::Group("a".into()));
        assert!(r.violations.is_empty(), "{:?}", r.violations);
    }

    #[test]
    fn a_gap_is_reported() {
        let mut obs = clean_all();
        obs.remove(3); // b@3
        let r = run(obs, Selection::All);
        assert!(
            kinds(&r).contains(&ViolationKind::Gap),
            "{:?}",
            r.violations
        );
    }

    #[test]
    fn a_gap_at_the_end_is_found_by_the_bookmark() {
        let mut obs = clean_all();
        obs.remove(6); // b deleted @6, then BOOKMARK 6
        let r = run(obs, Selection::All);
        assert!(
            kinds(&r).contains(&ViolationKind::Gap),
            "{:?}",
            r.violations
        );
        assert!(
            kinds(&r).contains(&ViolationKind::WrongState),
            "{:?}",
            r.violations
        );
    }

    #[test]
    fn a_duplicate_is_reported() {
        let mut obs = clean_all();
        obs.insert(4, ev(Kind::Added, "b", 3, obj("b", "b", 3)));
        let r = run(obs, Selection::All);
        assert_eq!(
            kinds(&r),
            vec![ViolationKind::Duplicate],
            "{:?}",
            r.violations
        );
    }

    #[test]
    fn an_out_of_order_event_is_reported() {
        let mut obs = clean_all();
        obs.swap(3, 4); // a@4 before b@3
        let r = run(obs, Selection::All);
        assert!(
            kinds(&r).contains(&ViolationKind::OutOfOrder),
            "{:?}",
            r.violations
        );
    }

    #[test]
    fn a_wrong_object_or_type_is_reported() {
        let mut obs = clean_all();
        obs[4] = ev(Kind::Modified, "a", 4, obj("a", "b", 99));
        let r = run(obs, Selection::All);
        assert!(
            kinds(&r).contains(&ViolationKind::WrongEvent),
            "{:?}",
            r.violations
        );
        // A DELETED carries the object as it was.
        let mut obs = clean_all();
        obs[6] = ev(Kind::Deleted, "b", 6, obj("b", "b", 99));
        let r = run(obs, Selection::All);
        assert!(
            kinds(&r).contains(&ViolationKind::WrongEvent),
            "{:?}",
            r.violations
        );
        let mut obs = clean_all();
        obs[5] = ev(Kind::Modified, "c", 5, obj("c", "a", 5));
        let r = run(obs, Selection::All);
        assert!(
            kinds(&r).contains(&ViolationKind::WrongEvent),
            "{:?}",
            r.violations
        );
    }

    #[test]
    fn a_wrong_list_is_reported() {
        let list = |items: Vec<(&str, i64, Value)>| Obs::List {
            rv: 4,
            items: items
                .into_iter()
                .map(|(n, rv, v)| (n.to_string(), rv, v))
                .collect(),
        };
        let right = list(vec![("a", 4, obj("a", "b", 4)), ("b", 3, obj("b", "b", 3))]);
        assert!(run(vec![right], Selection::All).violations.is_empty());
        for wrong in [
            list(vec![("a", 4, obj("a", "b", 4))]), // b missing
            list(vec![("a", 2, obj("a", "a", 2)), ("b", 3, obj("b", "b", 3))]), // a too old
            list(vec![
                ("a", 4, obj("a", "b", 4)),
                ("b", 3, obj("b", "b", 3)),
                ("c", 5, obj("c", "a", 5)),
            ]), // c from the future
        ] {
            let r = run(vec![wrong], Selection::All);
            assert_eq!(
                kinds(&r),
                vec![ViolationKind::WrongList],
                "{:?}",
                r.violations
            );
        }
    }

    #[test]
    fn expired_then_relist_is_allowed() {
        let obs = vec![
            empty_list(1),
            Obs::Watch { from: 1 },
            ev(Kind::Added, "a", 2, obj("a", "a", 2)),
            Obs::Expired,
            Obs::List {
                rv: 5,
                items: vec![
                    ("a".into(), 4, obj("a", "b", 4)),
                    ("b".into(), 3, obj("b", "b", 3)),
                    ("c".into(), 5, obj("c", "a", 5)),
                ],
            },
            Obs::Watch { from: 5 },
            ev(Kind::Deleted, "b", 6, obj("b", "b", 3)),
            Obs::Bookmark { rv: 6 },
        ];
        let r = run(obs, Selection::All);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.expired, 1);
    }

    #[test]
    fn a_relist_difference_is_allowed_only_inside_a_compaction_window() {
        // A group-a watcher saw a@2; then the daemon was cut off, etcd
        // compacted at 5 and the daemon relisted at 5. Without the compaction
        // the missing DELETED a@4 is a gap.
        let diff = vec![
            empty_list(1),
            Obs::Watch { from: 1 },
            ev(Kind::Added, "a", 2, obj("a", "a", 2)),
            ev(Kind::Added, "c", 5, obj("c", "a", 5)),
            Obs::Bookmark { rv: 6 },
        ];
        let c = ClientLog {
            name: "w".into(),
            selection: Selection::Group("a".into()),
            obs: diff.clone(),
        };
        let r = check(&history(), &[], std::slice::from_ref(&c), &[], None);
        assert_eq!(
            kinds(&r),
            vec![ViolationKind::Gap, ViolationKind::WrongState],
            "{:?}",
            r.violations
        );
        // With the compaction the missing DELETED is excused, but the state
        // (a still there) is wrong: the difference was incomplete.
        let comp = [Compaction {
            rev: 5,
            caught_up: 5,
        }];
        let r = check(&history(), &comp, std::slice::from_ref(&c), &[], None);
        assert_eq!(
            kinds(&r),
            vec![ViolationKind::WrongState],
            "{:?}",
            r.violations
        );
        // A complete difference: a deleted at the relist revision.
        let mut good = diff;
        good.insert(3, ev(Kind::Deleted, "a", 5, obj("a", "a", 2)));
        let c = ClientLog {
            name: "w".into(),
            selection: Selection::Group("a".into()),
            obs: good,
        };
        let r = check(&history(), &comp, &[c], &[], None);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!((r.relist_events, r.compacted_events_skipped), (1, 1));
    }

    #[test]
    fn acknowledged_writes_and_the_final_list() {
        let h = history();
        let acks = [
            Ack {
                name: "a".into(),
                rev: 4,
                write_id: Some("w4".into()),
            },
            Ack {
                name: "b".into(),
                rev: 6,
                write_id: None,
            },
        ];
        let r = check(&h, &[], &[], &acks, None);
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        assert_eq!(r.writes_acknowledged, 2);
        let lost = [Ack {
            name: "c".into(),
            rev: 5,
            write_id: Some("w-other".into()),
        }];
        let r = check(&h, &[], &[], &lost, None);
        assert_eq!(kinds(&r), vec![ViolationKind::LostWrite]);

        let fin: Vec<(String, i64, Value)> = vec![
            ("a".into(), 4, obj("a", "b", 4)),
            ("c".into(), 5, obj("c", "a", 5)),
        ];
        let r = check(&h, &[], &[], &[], Some((6, &fin)));
        assert!(r.violations.is_empty(), "{:?}", r.violations);
        // Right at 5 is wrong at 6 (b deleted) and older than etcd's last change.
        let r = check(&h, &[], &[], &[], Some((5, &fin)));
        assert_eq!(
            kinds(&r),
            vec![ViolationKind::FinalMismatch, ViolationKind::FinalMismatch]
        );
    }
}

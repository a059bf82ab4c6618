//! Checks of what the etcd clients of `chaos --front grpc` saw through the
//! gRPC front, against etcd's own history of the prefix (the recorder's):
//! the watch guarantees of etcd's robustness suite
//! (tests/robustness/validate/watch.go: Ordered, Unique, Atomic, Reliable,
//! Resumable, Bookmarkable, PrevKV, IsCreate, Filter), ErrCompacted below
//! etcd's compaction, and serializable reads (never older than a revision
//! the same client already saw, and exactly etcd's state at their revision).
//! Linearizability of the KV history is porcupine's (tests/clients/go/porcupine).

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;
use serde_json::Value;

use super::checker::History;

/// One event as a watch delivered it (keys are relative to the run's prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ev {
    pub delete: bool,
    pub key: String,
    pub value: String,
    pub mod_rev: i64,
    pub create_rev: i64,
    pub version: i64,
    /// prev_kv: (value, mod_revision).
    pub prev: Option<(String, i64)>,
}

/// One watch response of one watch.
#[derive(Debug, Clone, Default)]
pub struct Resp {
    /// Its header revision.
    pub rev: i64,
    pub events: Vec<Ev>,
    /// A progress notification (no events, not a creation or cancel).
    pub progress: bool,
}

/// One watch as its client created it and what it got.
#[derive(Debug, Clone, Default)]
pub struct WatchLog {
    pub client: String,
    /// The key (relative), and whether it is a prefix.
    pub key: String,
    pub prefix: bool,
    /// `start_revision` asked for (0: from now).
    pub start_rev: i64,
    /// Header revision of the created response (0: never created).
    pub created_rev: i64,
    /// When the creation was sent (ns since the run started).
    pub sent_at: i64,
    pub prev_kv: bool,
    pub no_put: bool,
    pub no_delete: bool,
    pub resps: Vec<Resp>,
    /// Canceled by the server with this compact_revision (> 0).
    pub compacted: Option<i64>,
    /// How it ended: "stopped" (the run's end), "canceled" (by the client),
    /// "compacted", "refused", or "broken: ..." (the stream failed).
    pub end: String,
    /// When it ended (ns since the run started).
    pub ended_at: i64,
}

/// A read of one key at a past revision (`revision` set).
#[derive(Debug, Clone)]
pub struct RevRead {
    pub client: String,
    pub key: String,
    pub rev: i64,
    pub sent_at: i64,
    pub returned_at: i64,
    /// Ok(value) or Err(compacted?).
    pub result: Result<Option<(String, i64)>, bool>,
}

/// A serializable read of one key.
#[derive(Debug, Clone)]
pub struct SerialRead {
    pub client: String,
    pub key: String,
    /// The highest revision the client had seen before it sent the read.
    pub floor: i64,
    /// The answer's header revision and the key's (value, mod_revision).
    pub rev: i64,
    pub kv: Option<(String, i64)>,
}

/// An etcd compaction the run made.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct GrpcCompaction {
    pub rev: i64,
    /// ns since the run started: sent, and answered.
    pub started: i64,
    pub done: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Violation {
    pub kind: &'static str,
    pub client: String,
    pub detail: String,
}

/// What the checks covered and found.
#[derive(Debug, Default)]
pub struct GrpcReport {
    pub watches_checked: u64,
    pub events_checked: u64,
    pub progress_checked: u64,
    pub serializable_checked: u64,
    pub rev_reads_checked: u64,
    pub compacted_answers: u64,
    pub violations: Vec<Violation>,
}

impl GrpcReport {
    pub fn counts(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for v in &self.violations {
            *m.entry(v.kind).or_insert(0) += 1;
        }
        m
    }
}

/// An event of etcd's history, with what a watch with prev_kv must carry.
#[derive(Debug, Clone)]
struct HEv {
    ev: Ev,
}

/// The value as the run wrote it (a JSON string) or its JSON text.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

/// A key's (value, mod_revision), `None` while it does not exist.
type KeyState = Option<(String, i64)>;

/// etcd's history replayed: every event with its create revision, version
/// and previous value; and each key's values over time.
struct Replay {
    events: Vec<HEv>,
    /// key -> [(rev, value at and after rev)], in revision order.
    timeline: HashMap<String, Vec<(i64, KeyState)>>,
    /// rev -> indexes into `events`.
    by_rev: BTreeMap<i64, Vec<usize>>,
}

impl Replay {
    fn new(h: &History) -> Replay {
        // key -> (value, mod_rev, create_rev, version)
        let mut state: HashMap<String, (String, i64, i64, i64)> = HashMap::new();
        let mut timeline: HashMap<String, Vec<(i64, KeyState)>> = HashMap::new();
        for (k, (rev, v)) in &h.base {
            state.insert(k.clone(), (text(v), *rev, *rev, 1));
            timeline
                .entry(k.clone())
                .or_default()
                .push((h.base_rev, Some((text(v), *rev))));
        }
        let mut events = Vec::new();
        let mut by_rev: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
        for c in &h.changes {
            let prev = state.get(&c.name).cloned();
            let ev = match &c.value {
                Some(v) => {
                    let (create_rev, version) = match &prev {
                        Some((_, _, cr, ver)) => (*cr, ver + 1),
                        None => (c.rev, 1),
                    };
                    let value = text(v);
                    state.insert(c.name.clone(), (value.clone(), c.rev, create_rev, version));
                    timeline
                        .entry(c.name.clone())
                        .or_default()
                        .push((c.rev, Some((value.clone(), c.rev))));
                    Ev {
                        delete: false,
                        key: c.name.clone(),
                        value,
                        mod_rev: c.rev,
                        create_rev,
                        version,
                        prev: prev.map(|(v, m, _, _)| (v, m)),
                    }
                }
                None => {
                    state.remove(&c.name);
                    timeline
                        .entry(c.name.clone())
                        .or_default()
                        .push((c.rev, None));
                    Ev {
                        delete: true,
                        key: c.name.clone(),
                        value: String::new(),
                        mod_rev: c.rev,
                        create_rev: 0,
                        version: 0,
                        prev: prev.map(|(v, m, _, _)| (v, m)),
                    }
                }
            };
            by_rev.entry(c.rev).or_default().push(events.len());
            events.push(HEv { ev });
        }
        Replay {
            events,
            timeline,
            by_rev,
        }
    }

    /// `key`'s (value, mod_revision) at revision `rev`.
    fn at(&self, key: &str, rev: i64) -> Option<(String, i64)> {
        let t = self.timeline.get(key)?;
        let i = t.partition_point(|(r, _)| *r <= rev);
        if i == 0 {
            return None;
        }
        t[i - 1].1.clone()
    }
}

fn matches(w: &WatchLog, e: &Ev) -> bool {
    let key_ok = if w.prefix {
        e.key.starts_with(&w.key)
    } else {
        e.key == w.key
    };
    let filtered = if e.delete { w.no_delete } else { w.no_put };
    key_ok && !filtered
}

fn describe(e: &Ev) -> String {
    format!(
        "{} {}@{}",
        if e.delete { "DELETE" } else { "PUT" },
        e.key,
        e.mod_rev
    )
}

/// Checks every watch, read and compaction answer against etcd's history.
pub fn check(
    h: &History,
    compactions: &[GrpcCompaction],
    watches: &[WatchLog],
    serial: &[SerialRead],
    rev_reads: &[RevRead],
) -> GrpcReport {
    let replay = Replay::new(h);
    let mut r = GrpcReport::default();
    for w in watches {
        check_watch(&replay, compactions, w, &mut r);
    }
    for s in serial {
        r.serializable_checked += 1;
        if s.rev < s.floor {
            r.violations.push(Violation {
                kind: "StaleSerializableRead",
                client: s.client.clone(),
                detail: format!(
                    "{} read at revision {} after the client saw revision {}",
                    s.key, s.rev, s.floor
                ),
            });
        }
        // The history is recorded up to etcd's revision after the run.
        let want = replay.at(&s.key, s.rev);
        if want != s.kv {
            r.violations.push(Violation {
                kind: "SerializableRead",
                client: s.client.clone(),
                detail: format!(
                    "{} at revision {}: got {:?}, etcd had {:?}",
                    s.key, s.rev, s.kv, want
                ),
            });
        }
    }
    for q in rev_reads {
        r.rev_reads_checked += 1;
        // Compacted before it was sent: etcd refuses it; compacted only
        // after it returned: it must be served.
        let before = compactions
            .iter()
            .any(|c| c.done < q.sent_at && c.rev > q.rev);
        let maybe = compactions
            .iter()
            .any(|c| c.started < q.returned_at && c.rev > q.rev);
        match &q.result {
            Err(true) => {
                r.compacted_answers += 1;
                if !maybe {
                    r.violations.push(Violation {
                        kind: "Compacted",
                        client: q.client.clone(),
                        detail: format!(
                            "{} at revision {}: ErrCompacted, but no compaction above it",
                            q.key, q.rev
                        ),
                    });
                }
            }
            Err(false) => {}
            Ok(kv) => {
                if before {
                    r.violations.push(Violation {
                        kind: "Compacted",
                        client: q.client.clone(),
                        detail: format!(
                            "{} at revision {} served after etcd compacted past it",
                            q.key, q.rev
                        ),
                    });
                }
                let want = replay.at(&q.key, q.rev);
                if *kv != want {
                    r.violations.push(Violation {
                        kind: "RevisionRead",
                        client: q.client.clone(),
                        detail: format!(
                            "{} at revision {}: got {kv:?}, etcd had {want:?}",
                            q.key, q.rev
                        ),
                    });
                }
            }
        }
    }
    r
}

fn check_watch(replay: &Replay, compactions: &[GrpcCompaction], w: &WatchLog, r: &mut GrpcReport) {
    let mut v = |kind: &'static str, detail: String| {
        r.violations.push(Violation {
            kind,
            client: w.client.clone(),
            detail,
        })
    };
    // Compacted: a watch from below a compaction etcd had finished before
    // the watch was asked for is canceled with compact_revision, no events.
    if w.start_rev > 0
        && let Some(c) = compactions
            .iter()
            .filter(|c| c.done < w.sent_at && c.rev > w.start_rev)
            .max_by_key(|c| c.rev)
    {
        let evs: usize = w.resps.iter().map(|x| x.events.len()).sum();
        // A stream that broke (a fault) or was stopped before the cancel
        // came (etcd sends it after `created`) says nothing, unless it
        // carried events.
        let cut_short = evs == 0 && (w.end.starts_with("broken") || w.end == "stopped");
        if !cut_short && (w.compacted.is_none() || evs > 0) {
            v(
                "Compacted",
                format!(
                    "watch from {} after compaction at {}: created at {}, {} events, canceled with {:?}, ended {} after {} ms",
                    w.start_rev,
                    c.rev,
                    w.created_rev,
                    evs,
                    w.compacted,
                    w.end,
                    (w.ended_at - w.sent_at) / 1_000_000
                ),
            );
        }
        return;
    }
    if w.created_rev == 0 && w.compacted.is_none() {
        return;
    }
    r.watches_checked += 1;
    let mut last_rev = 0i64;
    let mut seen: HashSet<(i64, String)> = HashSet::new();
    let mut progressed = 0i64;
    let mut delivered: Vec<&Ev> = Vec::new();
    let mut rev_response: HashMap<i64, usize> = HashMap::new();
    for (i, resp) in w.resps.iter().enumerate() {
        if resp.progress {
            r.progress_checked += 1;
            // Bookmarkable: a progress notification is never behind an
            // event already sent...
            if resp.rev < last_rev {
                v(
                    "Bookmarkable",
                    format!("progress at {} after an event at {last_rev}", resp.rev),
                );
            }
            progressed = progressed.max(resp.rev);
            continue;
        }
        for e in &resp.events {
            r.events_checked += 1;
            // ...and never ahead of one still to come.
            if e.mod_rev <= progressed {
                v(
                    "Bookmarkable",
                    format!(
                        "{} after a progress notification at {progressed}",
                        describe(e)
                    ),
                );
            }
            if e.mod_rev < last_rev {
                v(
                    "Ordered",
                    format!("{} after revision {last_rev}", describe(e)),
                );
            }
            last_rev = last_rev.max(e.mod_rev);
            if !seen.insert((e.mod_rev, e.key.clone())) {
                v("Unique", format!("{} delivered twice", describe(e)));
            }
            if (e.delete && w.no_delete) || (!e.delete && w.no_put) {
                v("Filter", format!("{} despite its filter", describe(e)));
            }
            match rev_response.get(&e.mod_rev) {
                Some(j) if *j != i => v(
                    "Atomic",
                    format!("revision {} split over two responses", e.mod_rev),
                ),
                _ => {
                    rev_response.insert(e.mod_rev, i);
                }
            }
            let want = replay.by_rev.get(&e.mod_rev).and_then(|ix| {
                ix.iter()
                    .map(|&i| &replay.events[i].ev)
                    .find(|h| h.key == e.key)
            });
            let Some(want) = want else {
                v(
                    "Reliable",
                    format!("{} is not in etcd's history", describe(e)),
                );
                continue;
            };
            if want.delete != e.delete || (!e.delete && want.value != e.value) {
                v(
                    "Reliable",
                    format!("{} differs from etcd's {}", describe(e), describe(want)),
                );
            }
            if !e.delete {
                let is_create = e.create_rev == e.mod_rev;
                if is_create != want.prev.is_none()
                    || e.create_rev != want.create_rev
                    || e.version != want.version
                {
                    v(
                        "IsCreate",
                        format!(
                            "{}: create_revision {} version {}, etcd's {} {}",
                            describe(e),
                            e.create_rev,
                            e.version,
                            want.create_rev,
                            want.version
                        ),
                    );
                }
            }
            let want_prev = if w.prev_kv { want.prev.clone() } else { None };
            // etcd sends an event at (or below) its compaction revision
            // without prev_kv (the revision before is gone); never a wrong one.
            let prev_compacted = compactions.iter().any(|c| c.rev >= e.mod_rev);
            if e.prev != want_prev && !(e.prev.is_none() && prev_compacted) {
                v(
                    "PrevKV",
                    format!(
                        "{}: prev_kv {:?}, want {:?}",
                        describe(e),
                        e.prev,
                        want_prev
                    ),
                );
            }
            delivered.push(e);
        }
        // Atomic: every matching event of a revision in this response.
        let mut revs: Vec<i64> = resp.events.iter().map(|e| e.mod_rev).collect();
        revs.dedup();
        for rev in revs {
            let want = replay.by_rev.get(&rev).map_or(0, |ix| {
                ix.iter()
                    .filter(|&&i| matches(w, &replay.events[i].ev))
                    .count()
            });
            let got = resp.events.iter().filter(|e| e.mod_rev == rev).count();
            if got != want {
                v(
                    "Atomic",
                    format!("revision {rev}: {got} of its {want} events in one response"),
                );
            }
        }
    }
    // Reliable (from now) / Resumable (from a revision): exactly etcd's
    // matching events from the start up to the last event or progress.
    let start = if w.start_rev > 0 {
        w.start_rev
    } else {
        w.created_rev + 1
    };
    let upto = last_rev.max(progressed);
    let kind = if w.start_rev > 0 {
        "Resumable"
    } else {
        "Reliable"
    };
    let want: Vec<&Ev> = replay
        .by_rev
        .range(start..(upto + 1).max(start))
        .flat_map(|(_, ix)| ix.iter().map(|&i| &replay.events[i].ev))
        .filter(|e| matches(w, e))
        .collect();
    let key = |e: &&Ev| (e.mod_rev, e.key.clone(), e.delete);
    let mut got: Vec<(i64, String, bool)> = delivered.iter().map(key).collect();
    got.sort();
    got.dedup();
    let mut want: Vec<(i64, String, bool)> = want.iter().map(key).collect();
    want.sort();
    if let Some(missing) = want.iter().find(|e| got.binary_search(e).is_err()) {
        v(
            kind,
            format!(
                "watch of {}{} from {start}: missed {} {}@{} (delivered {} of {} events up to {upto})",
                w.key,
                if w.prefix { "*" } else { "" },
                if missing.2 { "DELETE" } else { "PUT" },
                missing.1,
                missing.0,
                got.len(),
                want.len()
            ),
        );
    }
    if let Some(extra) = got
        .iter()
        .find(|e| e.0 < start && want.binary_search(e).is_err())
    {
        v(
            kind,
            format!(
                "{}@{} is before the watch's start {start}",
                extra.1, extra.0
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::checker::Change;
    use super::*;
    use serde_json::json;

    /// k1 put at 11, 12; k2 put at 13; k1 deleted at 14; lease keys l1, l2
    /// put at 15, 16 and deleted together at 17.
    fn history() -> History {
        let ch = |rev, name: &str, v: Option<&str>| Change {
            rev,
            name: name.into(),
            value: v.map(|v| json!(v)),
        };
        History {
            base_rev: 10,
            base: Default::default(),
            changes: vec![
                ch(11, "k1", Some("a")),
                ch(12, "k1", Some("b")),
                ch(13, "k2", Some("c")),
                ch(14, "k1", None),
                ch(15, "l1", Some("x")),
                ch(16, "l2", Some("y")),
                ch(17, "l1", None),
                ch(17, "l2", None),
            ],
        }
    }

    /// The events a prev_kv watch of everything gets, one response per revision.
    fn good_watch() -> WatchLog {
        let replay = Replay::new(&history());
        let mut resps: Vec<Resp> = Vec::new();
        for (rev, ix) in &replay.by_rev {
            resps.push(Resp {
                rev: *rev,
                events: ix.iter().map(|&i| replay.events[i].ev.clone()).collect(),
                progress: false,
            });
        }
        resps.push(Resp {
            rev: 17,
            events: vec![],
            progress: true,
        });
        WatchLog {
            client: "w".into(),
            key: String::new(),
            prefix: true,
            start_rev: 0,
            created_rev: 10,
            sent_at: 0,
            prev_kv: true,
            resps,
            ..Default::default()
        }
    }

    fn kinds(w: &WatchLog) -> Vec<&'static str> {
        let r = check(&history(), &[], std::slice::from_ref(w), &[], &[]);
        let mut k: Vec<_> = r.violations.iter().map(|v| v.kind).collect();
        k.dedup();
        k
    }

    #[test]
    fn a_faithful_watch_passes() {
        assert_eq!(kinds(&good_watch()), Vec::<&str>::new());
        let mut resumed = good_watch();
        resumed.start_rev = 13;
        resumed.resps.drain(..2);
        assert_eq!(kinds(&resumed), Vec::<&str>::new());
    }

    #[test]
    fn each_guarantee_can_fail() {
        let mut w = good_watch();
        w.resps.swap(0, 1);
        assert!(kinds(&w).contains(&"Ordered"), "{:?}", kinds(&w));

        let mut w = good_watch();
        let dup = w.resps[1].clone();
        w.resps.insert(2, dup);
        assert!(kinds(&w).contains(&"Unique"));

        let mut w = good_watch();
        let last = w.resps[6].events.pop().unwrap();
        w.resps.insert(
            7,
            Resp {
                rev: 17,
                events: vec![last],
                progress: false,
            },
        );
        assert!(kinds(&w).contains(&"Atomic"));

        let mut w = good_watch();
        w.resps.remove(2);
        assert_eq!(kinds(&w), vec!["Reliable"]);

        let mut w = good_watch();
        w.start_rev = 12;
        w.resps.drain(..1);
        w.resps.remove(1);
        assert_eq!(kinds(&w), vec!["Resumable"]);

        let mut w = good_watch();
        w.resps.insert(
            1,
            Resp {
                rev: 13,
                events: vec![],
                progress: true,
            },
        );
        assert!(kinds(&w).contains(&"Bookmarkable"));
        let mut w = good_watch();
        w.resps.insert(
            2,
            Resp {
                rev: 11,
                events: vec![],
                progress: true,
            },
        );
        assert!(kinds(&w).contains(&"Bookmarkable"));

        let mut w = good_watch();
        w.resps[1].events[0].prev = None;
        assert_eq!(kinds(&w), vec!["PrevKV"]);
        let mut w = good_watch();
        w.prev_kv = false;
        assert_eq!(kinds(&w), vec!["PrevKV"]);

        let mut w = good_watch();
        w.resps[1].events[0].create_rev = 12;
        assert_eq!(kinds(&w), vec!["IsCreate"]);

        let mut w = good_watch();
        w.no_delete = true;
        assert!(kinds(&w).contains(&"Filter"));

        let mut w = good_watch();
        w.resps[2].events[0].value = "other".into();
        assert_eq!(kinds(&w), vec!["Reliable"]);
    }

    #[test]
    fn compacted_watches_and_reads_are_checked() {
        let c = [GrpcCompaction {
            rev: 14,
            started: 5,
            done: 10,
        }];
        let mut w = good_watch();
        w.start_rev = 12;
        w.sent_at = 20;
        w.resps.drain(..1);
        let r = check(&history(), &c, &[w.clone()], &[], &[]);
        assert_eq!(r.violations[0].kind, "Compacted");
        w.resps.clear();
        w.created_rev = 20;
        w.end = "canceled".into();
        let r = check(&history(), &c, &[w.clone()], &[], &[]);
        assert_eq!(r.violations[0].kind, "Compacted", "no cancel from etcd");
        w.end = "broken: reset".into();
        let r = check(&history(), &c, &[w.clone()], &[], &[]);
        assert!(r.violations.is_empty(), "cut short: {:?}", r.violations);
        w.end = "compacted".into();
        w.compacted = Some(14);
        let r = check(&history(), &c, &[w], &[], &[]);
        assert!(r.violations.is_empty(), "{:?}", r.violations);

        let read = |sent_at, result| RevRead {
            client: "r".into(),
            key: "k1".into(),
            rev: 12,
            sent_at,
            returned_at: sent_at + 1,
            result,
        };
        let good = [read(20, Err(true)), read(1, Ok(Some(("b".into(), 12))))];
        assert!(check(&history(), &c, &[], &[], &good).violations.is_empty());
        for bad in [
            read(20, Ok(Some(("b".into(), 12)))),
            read(1, Ok(Some(("a".into(), 11)))),
        ] {
            assert_eq!(check(&history(), &c, &[], &[], &[bad]).violations.len(), 1);
        }
        assert_eq!(
            check(&history(), &[], &[], &[], &[read(1, Err(true))])
                .violations
                .len(),
            1
        );
    }

    #[test]
    fn serializable_reads_are_checked() {
        let s = |floor, rev, kv: Option<(&str, i64)>| SerialRead {
            client: "s".into(),
            key: "k1".into(),
            floor,
            rev,
            kv: kv.map(|(v, m)| (v.to_string(), m)),
        };
        let good = [s(11, 12, Some(("b", 12))), s(12, 14, None)];
        assert!(
            check(&history(), &[], &[], &good, &[])
                .violations
                .is_empty()
        );
        let r = check(&history(), &[], &[], &[s(13, 12, Some(("b", 12)))], &[]);
        assert_eq!(r.violations[0].kind, "StaleSerializableRead");
        let r = check(&history(), &[], &[], &[s(11, 13, Some(("a", 11)))], &[]);
        assert_eq!(r.violations[0].kind, "SerializableRead");
    }
}

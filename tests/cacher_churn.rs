//! The Cacher under churn against a real etcd: every watcher's stream must
//! equal etcd's own history filtered for that watcher, and the cache must
//! equal an etcd range at the same revision. Also across an etcd SIGKILL +
//! restart, and across a compaction that forces a relist.
mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use rand::Rng;
use serde_json::{Value, json};
use watchcache::cacher::{
    Cacher, CacherError, CacherOptions, ListRequest, ResourceVersionMatch, WatchChunk,
    WatchRequest, Watcher,
};
use watchcache::object::{FieldSelector, LabelSelector, Object, ObjectCodec};
use watchcache::storage::{Preconditions, Storage, WriteOptions};

const WAIT: Duration = Duration::from_secs(60);

fn opts() -> CacherOptions {
    CacherOptions {
        progress_interval: Duration::from_millis(500),
        idle_timeout: Duration::from_secs(3),
        list_page_size: 50,
        ..CacherOptions::default()
    }
}

fn pod_value(ns: &str, name: &str, app: &str, node: &str, generation: u64) -> String {
    json!({"apiVersion":"v1","kind":"Pod",
        "metadata":{"name":name,"namespace":ns,"labels":{"app":app}},
        "spec":{"nodeName":node},"status":{"gen":generation}})
    .to_string()
}

/// One watch event as seen by a client (or predicted from etcd's history).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ev {
    ty: String,
    ns: String,
    name: String,
    rv: i64,
    app: String,
}

fn parse_chunk(b: &[u8], out: &mut Vec<Ev>) {
    for line in String::from_utf8_lossy(b).lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            panic!("bad line {line}");
        };
        let ty = v["type"].as_str().unwrap_or("").to_string();
        if ty == "BOOKMARK" {
            continue;
        }
        let m = &v["object"]["metadata"];
        out.push(Ev {
            ty,
            ns: m["namespace"].as_str().unwrap_or("").into(),
            name: m["name"].as_str().unwrap_or("").into(),
            rv: m["resourceVersion"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .unwrap_or(-1),
            app: m["labels"]["app"].as_str().unwrap_or("").into(),
        });
    }
}

#[derive(Debug, Default)]
struct Collected {
    events: Vec<Ev>,
    error: Option<CacherError>,
    ended: bool,
}

/// Drains a watcher in the background.
fn spawn_collector(mut w: Watcher) -> Arc<Mutex<Collected>> {
    let c = Arc::new(Mutex::new(Collected::default()));
    let c2 = Arc::clone(&c);
    tokio::spawn(async move {
        while let Some(chunk) = w.next().await {
            match chunk {
                WatchChunk::Data(b) => {
                    let mut evs = Vec::new();
                    parse_chunk(&b, &mut evs);
                    c2.lock().events.extend(evs);
                }
                WatchChunk::Error(e) => c2.lock().error = Some(e),
            }
        }
        c2.lock().ended = true;
    });
    c
}

/// A watcher's filter, as the test predicts it.
#[derive(Debug, Clone)]
struct Spec {
    namespace: Option<String>,
    label: String,
    field: String,
    start_rv: i64,
}

impl Spec {
    fn request(&self, paths: &[Arc<str>]) -> WatchRequest {
        WatchRequest {
            namespace: self.namespace.clone(),
            resource_version: Some(self.start_rv),
            label_selector: LabelSelector::parse(&self.label).expect("label"),
            field_selector: FieldSelector::parse(&self.field, paths).expect("field"),
            ..Default::default()
        }
    }
    fn matches(&self, o: &Object, paths: &[Arc<str>]) -> bool {
        if let Some(ns) = &self.namespace
            && o.namespace.as_deref() != Some(ns.as_str())
        {
            return false;
        }
        LabelSelector::parse(&self.label)
            .expect("label")
            .matches(&o.labels)
            && FieldSelector::parse(&self.field, paths)
                .expect("field")
                .matches(o)
    }
}

fn spec_for(i: usize, start_rv: i64) -> Spec {
    let (namespace, label, field) = match i % 7 {
        0 => (None, "", ""),
        1 => (Some("ns1"), "", ""),
        2 => (None, "app=a", ""),
        3 => (None, "", "spec.nodeName=n1"),
        4 => (Some("ns0"), "app in (a,b)", ""),
        5 => (None, "", "metadata.name=w0-3"),
        _ => (None, "app!=c", "spec.nodeName!=n2"),
    };
    Spec {
        namespace: namespace.map(String::from),
        label: label.into(),
        field: field.into(),
        start_rv,
    }
}

/// One etcd event with decoded new and previous objects.
struct EtcdEv {
    rv: i64,
    new: Option<Object>,
    prev: Option<Object>,
}

/// etcd's own history of `prefix` in (from, to], read with an etcd watch.
async fn etcd_history(endpoint: &str, codec: &ObjectCodec, from: i64, to: i64) -> Vec<EtcdEv> {
    let mut client = etcd_client::Client::connect([endpoint], None)
        .await
        .expect("connect");
    let opts = etcd_client::WatchOptions::new()
        .with_prefix()
        .with_prev_key()
        .with_start_revision(from + 1);
    let mut stream = client
        .watch(codec.key_prefix(), Some(opts))
        .await
        .expect("watch");
    let mut out = Vec::new();
    let mut last = from;
    // `to` is etcd's revision, which other tests' writes to the shared etcd
    // move too: the prefix's own events may stop short of it. A progress
    // notification at or past `to` says every event up to it was delivered.
    let deadline = tokio::time::Instant::now() + WAIT;
    while last < to {
        let resp = match tokio::time::timeout(Duration::from_secs(1), stream.message()).await {
            Ok(r) => r.expect("watch ok").expect("stream open"),
            Err(_) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "etcd history in time (at {last} of {to})"
                );
                stream.request_progress().await.expect("progress request");
                continue;
            }
        };
        assert!(!resp.canceled(), "history watch canceled");
        if resp.events().is_empty() && !resp.created() {
            if resp.header().is_some_and(|h| h.revision() >= to) {
                break;
            }
            continue;
        }
        for ev in resp.events() {
            let kv = ev.kv().expect("kv");
            let key = kv.key_str().expect("utf8 key");
            let rv = kv.mod_revision();
            last = last.max(rv);
            let new = match ev.event_type() {
                etcd_client::EventType::Put => {
                    codec.decode(key, kv.value(), rv, kv.create_revision()).ok()
                }
                etcd_client::EventType::Delete => None,
            };
            let prev = ev.prev_kv().and_then(|p| {
                codec
                    .decode(key, p.value(), p.mod_revision(), p.create_revision())
                    .ok()
            });
            out.push(EtcdEv { rv, new, prev });
        }
    }
    out
}

/// What a watcher with `spec` must see, given etcd's history.
fn expected(spec: &Spec, history: &[EtcdEv], paths: &[Arc<str>]) -> Vec<Ev> {
    let ev = |ty: &str, o: &Object, rv: i64| Ev {
        ty: ty.into(),
        ns: o.namespace.as_deref().unwrap_or("").into(),
        name: o.name.to_string(),
        rv,
        app: o.labels.get("app").cloned().unwrap_or_default(),
    };
    let mut out = Vec::new();
    for h in history.iter().filter(|h| h.rv > spec.start_rv) {
        let new_m = h.new.as_ref().filter(|o| spec.matches(o, paths));
        let old_m = h.prev.as_ref().filter(|o| spec.matches(o, paths));
        match (old_m, new_m) {
            (None, Some(n)) => out.push(ev("ADDED", n, h.rv)),
            (Some(_), Some(n)) => out.push(ev("MODIFIED", n, h.rv)),
            (Some(o), None) => out.push(ev("DELETED", o, h.rv)),
            (None, None) => {}
        }
    }
    out
}

fn check_rvs_increase(evs: &[Ev]) -> Result<(), String> {
    for w in evs.windows(2) {
        if w[1].rv < w[0].rv {
            return Err(format!("RV went backwards: {:?} then {:?}", w[0], w[1]));
        }
    }
    Ok(())
}

/// The cache at `rev` equals an etcd range at `rev` (keys and mod revisions).
async fn assert_cache_equals_etcd(cacher: &Cacher, endpoint: &str, prefix: &str, rev: i64) {
    let mut client = etcd_client::Client::connect([endpoint], None)
        .await
        .expect("connect");
    let resp = client
        .get(
            prefix,
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_revision(rev),
            ),
        )
        .await
        .expect("range");
    let want: BTreeMap<String, i64> = resp
        .kvs()
        .iter()
        .map(|kv| (kv.key_str().unwrap_or("").to_string(), kv.mod_revision()))
        .collect();
    let got = cacher
        .list(&ListRequest {
            resource_version: Some(rev),
            resource_version_match: Some(ResourceVersionMatch::Exact),
            ..Default::default()
        })
        .await
        .expect("exact list");
    assert_eq!(got.resource_version, rev);
    let got: BTreeMap<String, i64> = got
        .items
        .iter()
        .map(|o| (o.key.to_string(), o.mod_revision))
        .collect();
    assert_eq!(got, want, "cache equals etcd at {rev}");
}

async fn wait_rv(cacher: &Arc<Cacher>, rv: i64) {
    common::wait_cacher_rv(cacher, rv, WAIT).await;
}

/// Waits until every collector holds at least its expected count, then a
/// little longer so duplicates or extras would show.
async fn wait_collected(cols: &[(Arc<Mutex<Collected>>, Vec<Ev>)]) {
    let ok = common::eventually(WAIT, || {
        let done = cols.iter().all(|(c, want)| {
            let c = c.lock();
            c.events.len() >= want.len() || c.error.is_some() || c.ended
        });
        async move { done }
    })
    .await;
    assert!(ok, "watchers received their events in time");
    tokio::time::sleep(Duration::from_millis(300)).await;
}

// ------------------------------------------------------------------ writers

async fn storage_writer(
    storage: Storage,
    prefix: String,
    w: usize,
    ops: usize,
    done: Arc<AtomicUsize>,
) {
    let mut rng = rand::rng().random::<u64>();
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut live: BTreeMap<usize, i64> = BTreeMap::new();
    let opts = WriteOptions::default();
    for op in 0..ops {
        let i = next(20) as usize;
        let ns = format!("ns{}", i % 3);
        let name = format!("w{w}-{i}");
        let key = format!("{prefix}{ns}/{name}");
        let app = ["a", "b", "c"][next(3) as usize];
        let node = ["n1", "n2", "n3", ""][next(4) as usize];
        let value = Bytes::from(pod_value(&ns, &name, app, node, op as u64));
        match live.get(&i).copied() {
            None => {
                let s = storage.create(&key, value, &opts).await.expect("create");
                live.insert(i, s.mod_revision);
            }
            Some(rev) if next(10) < 7 => {
                let s = storage
                    .update(&key, value, rev, &opts)
                    .await
                    .expect("update");
                live.insert(i, s.mod_revision);
            }
            Some(_) => {
                storage
                    .delete(&key, &Preconditions::none(), &opts)
                    .await
                    .expect("delete");
                live.remove(&i);
            }
        }
        done.fetch_add(1, Ordering::Relaxed);
    }
}

/// Writes straight to etcd, sometimes two keys in one txn (shared RV).
/// Tolerates etcd being down (retries) when `tolerant`.
async fn etcd_writer(
    endpoint: String,
    prefix: String,
    w: usize,
    ops: usize,
    done: Arc<AtomicUsize>,
) {
    let mut client = etcd_client::Client::connect([endpoint.as_str()], None)
        .await
        .expect("connect");
    let mut live = std::collections::BTreeSet::new();
    let mut op = 0;
    while op < ops {
        let (i, j, app, node, coin) = {
            let mut r = rand::rng();
            (
                r.random_range(0..20usize),
                r.random_range(0..20usize),
                ["a", "b", "c"][r.random_range(0..3)],
                ["n1", "n2", "n3", ""][r.random_range(0..4)],
                r.random_range(0..10),
            )
        };
        let key = |i: usize| format!("{prefix}ns{}/w{w}-{i}", i % 3);
        let val = |i: usize| {
            pod_value(
                &format!("ns{}", i % 3),
                &format!("w{w}-{i}"),
                app,
                node,
                op as u64,
            )
        };
        let res = if coin < 2 && i != j {
            let txn = etcd_client::Txn::new().and_then(vec![
                etcd_client::TxnOp::put(key(i), val(i), None),
                etcd_client::TxnOp::put(key(j), val(j), None),
            ]);
            client.txn(txn).await.map(|_| {
                live.insert(i);
                live.insert(j);
            })
        } else if coin < 5 && live.contains(&i) {
            client.delete(key(i), None).await.map(|_| {
                live.remove(&i);
            })
        } else {
            client.put(key(i), val(i), None).await.map(|_| {
                live.insert(i);
            })
        };
        match res {
            Ok(()) => {
                op += 1;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                // etcd is down (restart test): retry the same op later. A
                // write that did land before the error is harmless: the
                // history and the cache both contain it.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

// ------------------------------------------------------------------ tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_streams_equal_etcd_history() {
    let prefix = common::unique_prefix("churn");
    let endpoint = common::etcd().to_string();
    let (storage, cacher) =
        common::start_cacher(&endpoint, &prefix, common::pods_resource(10_000), opts()).await;
    let codec = cacher.codec().clone();
    let paths = codec.index_paths().to_vec();
    let key_prefix = codec.key_prefix().to_string();
    let r0 = cacher.resource_version();

    let mut specs: Vec<Spec> = Vec::new();
    let mut cols = Vec::new();
    for i in 0..35 {
        let s = spec_for(i, r0);
        cols.push(spawn_collector(
            cacher.watch(s.request(&paths)).await.expect("watch"),
        ));
        specs.push(s);
    }

    const OPS: usize = 667;
    let done = Arc::new(AtomicUsize::new(0));
    let writers = vec![
        tokio::spawn(storage_writer(
            storage.clone(),
            key_prefix.clone(),
            0,
            OPS,
            Arc::clone(&done),
        )),
        tokio::spawn(storage_writer(
            storage.clone(),
            key_prefix.clone(),
            1,
            OPS,
            Arc::clone(&done),
        )),
        tokio::spawn(etcd_writer(
            endpoint.clone(),
            key_prefix.clone(),
            2,
            OPS,
            Arc::clone(&done),
        )),
    ];
    // Mid-way: 15 more watchers from an older RV (taken at a quarter).
    let quarter = common::eventually(WAIT, || {
        let d = Arc::clone(&done);
        async move { d.load(Ordering::Relaxed) >= 3 * OPS / 4 }
    })
    .await;
    assert!(quarter);
    let older = cacher.resource_version();
    assert!(
        common::eventually(WAIT, || {
            let d = Arc::clone(&done);
            async move { d.load(Ordering::Relaxed) >= 3 * OPS / 2 }
        })
        .await
    );
    for i in 35..50 {
        let s = spec_for(i, older);
        cols.push(spawn_collector(
            cacher.watch(s.request(&paths)).await.expect("watch"),
        ));
        specs.push(s);
    }
    for w in writers {
        w.await.expect("writer");
    }
    let fin = storage.current_revision().await.expect("rev");
    wait_rv(&cacher, fin).await;

    let history = etcd_history(&endpoint, &codec, r0, fin).await;
    assert!(
        history.len() >= 3 * OPS,
        "history has every write ({})",
        history.len()
    );
    let pairs: Vec<(Arc<Mutex<Collected>>, Vec<Ev>)> = cols
        .into_iter()
        .zip(&specs)
        .map(|(c, s)| (c, expected(s, &history, &paths)))
        .collect();
    wait_collected(&pairs).await;
    for (i, ((col, want), spec)) in pairs.iter().zip(&specs).enumerate() {
        let col = col.lock();
        assert!(col.error.is_none(), "watcher {i} {spec:?}: {:?}", col.error);
        check_rvs_increase(&col.events).unwrap_or_else(|e| panic!("watcher {i}: {e}"));
        if col.events != *want {
            let at = col
                .events
                .iter()
                .zip(want.iter())
                .position(|(a, b)| a != b)
                .unwrap_or(col.events.len().min(want.len()));
            panic!(
                "watcher {i} {spec:?}: got {} events, want {}; first difference at {at}: got {:?} want {:?}",
                col.events.len(),
                want.len(),
                col.events.get(at),
                want.get(at)
            );
        }
    }
    // Filtered watchers saw fewer events than unfiltered ones (filters work).
    assert!(pairs[2].1.len() < pairs[0].1.len());
    assert_cache_equals_etcd(&cacher, &endpoint, &key_prefix, fin).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_sigkill_and_restart_mid_stream() {
    let mut etcd = common::PrivateEtcd::start().await.expect("private etcd");
    let endpoint = etcd.endpoint();
    let prefix = common::unique_prefix("restart");
    let (storage, cacher) =
        common::start_cacher(&endpoint, &prefix, common::pods_resource(10_000), opts()).await;
    let codec = cacher.codec().clone();
    let paths = codec.index_paths().to_vec();
    let key_prefix = codec.key_prefix().to_string();
    let r0 = cacher.resource_version();
    let specs: Vec<Spec> = (0..10).map(|i| spec_for(i, r0)).collect();
    let mut cols = Vec::new();
    for s in &specs {
        cols.push(spawn_collector(
            cacher.watch(s.request(&paths)).await.expect("watch"),
        ));
    }
    const OPS: usize = 400;
    let done = Arc::new(AtomicUsize::new(0));
    let writer = tokio::spawn(etcd_writer(
        endpoint.clone(),
        key_prefix.clone(),
        0,
        OPS,
        Arc::clone(&done),
    ));
    assert!(
        common::eventually(WAIT, || {
            let d = Arc::clone(&done);
            async move { d.load(Ordering::Relaxed) >= OPS / 3 }
        })
        .await
    );
    etcd.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    etcd.restart().await.expect("restart");
    writer.await.expect("writer");

    let fin = storage.current_revision().await.expect("rev");
    wait_rv(&cacher, fin).await;
    let history = etcd_history(&endpoint, &codec, r0, fin).await;
    let pairs: Vec<(Arc<Mutex<Collected>>, Vec<Ev>)> = cols
        .into_iter()
        .zip(&specs)
        .map(|(c, s)| (c, expected(s, &history, &paths)))
        .collect();
    wait_collected(&pairs).await;
    for (i, (col, want)) in pairs.iter().enumerate() {
        let col = col.lock();
        check_rvs_increase(&col.events).unwrap_or_else(|e| panic!("watcher {i}: {e}"));
        match &col.error {
            None => assert_eq!(col.events, *want, "watcher {i} continues gap-free"),
            Some(CacherError::Expired(_)) => assert_eq!(
                col.events[..],
                want[..col.events.len()],
                "watcher {i}: a 410 only after a gap-free prefix"
            ),
            Some(e) => panic!("watcher {i}: unexpected error {e:?}"),
        }
    }
    assert_cache_equals_etcd(&cacher, &endpoint, &key_prefix, fin).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_while_disconnected_relists_and_makes_watchers_whole() {
    let etcd = common::PrivateEtcd::start().await.expect("private etcd");
    let endpoint = etcd.endpoint();
    // The cacher reaches etcd only through a proxy the test can cut; the
    // test itself writes to etcd directly.
    let target = format!("127.0.0.1:{}", etcd.client_port())
        .parse()
        .expect("addr");
    let proxy = common::TcpProxy::start(target).await;
    let prefix = common::unique_prefix("compact");
    let mut client = etcd_client::Client::connect([endpoint.as_str()], None)
        .await
        .expect("client");
    let key_prefix = format!("{prefix}/pods/");
    for i in 0..6 {
        let name = format!("p{i}");
        client
            .put(
                format!("{key_prefix}ns1/{name}"),
                pod_value("ns1", &name, "a", "n1", 0),
                None,
            )
            .await
            .expect("seed");
    }
    let (_storage, cacher) = common::start_cacher(
        &proxy.endpoint(),
        &prefix,
        common::pods_resource(1000),
        opts(),
    )
    .await;
    // A watcher from the current state: initial ADDED events, then changes.
    let col = spawn_collector(
        cacher
            .watch(WatchRequest {
                resource_version: Some(0),
                ..Default::default()
            })
            .await
            .expect("watch"),
    );

    // Cut the reflector off, then make changes it cannot see as events
    // (modify, delete, add) and compact them away.
    proxy.cut().await;
    client
        .put(
            format!("{key_prefix}ns1/p0"),
            pod_value("ns1", "p0", "b", "n2", 1),
            None,
        )
        .await
        .expect("put");
    client
        .delete(format!("{key_prefix}ns1/p1"), None)
        .await
        .expect("delete");
    let last = common::etcd_put(
        &mut client,
        format!("{key_prefix}ns1/q"),
        pod_value("ns1", "q", "c", "n3", 1),
    )
    .await;
    client
        .compact(
            last,
            Some(etcd_client::CompactionOptions::new().with_physical()),
        )
        .await
        .expect("compact");
    assert!(
        cacher.resource_version() < last,
        "the reflector was cut off"
    );
    proxy.restore();

    wait_rv(&cacher, last).await;
    assert!(
        cacher.stats().relists.load(Ordering::Relaxed) >= 1,
        "resuming below the compaction made the reflector relist"
    );
    assert_cache_equals_etcd(&cacher, &endpoint, &key_prefix, last).await;

    // The watcher's stream, replayed on an empty map, gives etcd's state.
    let resp = client
        .get(
            key_prefix.as_str(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .expect("range");
    let want: BTreeMap<String, String> = resp
        .kvs()
        .iter()
        .filter_map(|kv| {
            let v: Value = serde_json::from_slice(kv.value()).ok()?;
            Some((
                v["metadata"]["name"].as_str()?.to_string(),
                v["metadata"]["labels"]["app"].as_str()?.to_string(),
            ))
        })
        .collect();
    let ok = common::eventually(WAIT, || {
        let c = Arc::clone(&col);
        let want = want.clone();
        async move {
            let mut state: BTreeMap<String, String> = BTreeMap::new();
            for e in &c.lock().events {
                if e.ty == "DELETED" {
                    state.remove(&e.name);
                } else {
                    state.insert(e.name.clone(), e.app.clone());
                }
            }
            state == want
        }
    })
    .await;
    let c = col.lock();
    assert!(
        ok,
        "watcher made whole: {:?} (error {:?})",
        c.events, c.error
    );
    assert!(c.error.is_none());
    check_rvs_increase(&c.events).expect("rv order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_watch_is_detected_and_restarted() {
    let etcd = common::PrivateEtcd::start().await.expect("private etcd");
    let endpoint = etcd.endpoint();
    let pid = etcd.pid().expect("pid") as libc::pid_t;
    let prefix = common::unique_prefix("idle");
    let (_storage, cacher) = common::start_cacher(
        &endpoint,
        &prefix,
        common::pods_resource(100),
        CacherOptions {
            progress_interval: Duration::from_millis(200),
            idle_timeout: Duration::from_millis(600),
            ..opts()
        },
    )
    .await;
    // A write seen through the watch: the stream is established.
    let key_prefix = cacher.codec().key_prefix().to_string();
    let mut client = etcd_client::Client::connect([endpoint.as_str()], None)
        .await
        .expect("client");
    let rev = common::etcd_put(
        &mut client,
        format!("{key_prefix}ns1/before"),
        pod_value("ns1", "before", "a", "n1", 0),
    )
    .await;
    wait_rv(&cacher, rev).await;
    // Freeze etcd: the watch stream stays open but says nothing, not even
    // to progress requests.
    // SAFETY: signalling the etcd process this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    // A bound, not a timing goal: generous for a loaded CI machine.
    let restarted = common::eventually(Duration::from_secs(20), || {
        let c = Arc::clone(&cacher);
        async move { c.stats().idle_restarts.load(Ordering::Relaxed) >= 1 }
    })
    .await;
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert!(restarted, "the silent watch was restarted");
    let rev = common::etcd_put(
        &mut client,
        format!("{key_prefix}ns1/after"),
        pod_value("ns1", "after", "a", "n1", 0),
    )
    .await;
    wait_rv(&cacher, rev).await;
    assert_cache_equals_etcd(&cacher, &endpoint, &key_prefix, rev).await;
}

/// The consistency checker compares cache and etcd at one revision while
/// writers (through the store and straight to etcd) keep changing both: it
/// never reports a difference that is not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistency_checker_stays_quiet_through_churn() {
    use watchcache::cacher::consistency_checker::CheckOutcome;
    let prefix = common::unique_prefix("cc-churn");
    let endpoint = common::etcd().to_string();
    let (storage, cacher) =
        common::start_cacher(&endpoint, &prefix, common::pods_resource(10_000), opts()).await;
    let key_prefix = cacher.codec().key_prefix().to_string();
    const OPS: usize = 300;
    let done = Arc::new(AtomicUsize::new(0));
    let writers = vec![
        tokio::spawn(storage_writer(
            storage.clone(),
            key_prefix.clone(),
            0,
            OPS,
            Arc::clone(&done),
        )),
        tokio::spawn(etcd_writer(
            endpoint.clone(),
            key_prefix.clone(),
            1,
            OPS,
            Arc::clone(&done),
        )),
    ];
    let mut matches = 0;
    let mut max_objects = 0;
    while done.load(Ordering::Relaxed) < 2 * OPS {
        match cacher.check_consistency().await {
            Ok(CheckOutcome::Match { objects, .. }) => {
                matches += 1;
                max_objects = max_objects.max(objects);
            }
            Ok(mismatch) => panic!("a difference under plain churn: {mismatch:?}"),
            // A check that could not be made is not a finding.
            Err(e) => eprintln!("check not made: {e}"),
        }
    }
    for w in writers {
        w.await.expect("writer");
    }
    let last = cacher.check_and_heal().await.expect("final check");
    assert!(matches!(last, CheckOutcome::Match { .. }), "{last:?}");
    assert!(matches >= 1, "checks ran during the churn");
    assert!(max_objects > 0, "the checks compared real objects");
    assert_eq!(cacher.stats().consistency_mismatches(), 0);
    cacher.shutdown();
}

/// A cache corrupted behind the reflector's back (test hook): the periodic
/// checker names the differing keys, relists, and watchers receive the
/// difference as events, after which cache and etcd agree again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistency_checker_finds_and_heals_a_corrupted_cache() {
    use watchcache::cacher::consistency_checker::CheckOutcome;
    let prefix = common::unique_prefix("cc-heal");
    let endpoint = common::etcd().to_string();
    let (_storage, cacher) = common::start_cacher(
        &endpoint,
        &prefix,
        common::pods_resource(1_000),
        CacherOptions {
            consistency_check_interval: Duration::from_millis(300),
            ..opts()
        },
    )
    .await;
    let codec = cacher.codec().clone();
    let mut etcd = etcd_client::Client::connect([endpoint.as_str()], None)
        .await
        .expect("connect");
    let mut rev = 0;
    for name in ["a", "b", "c"] {
        rev = common::etcd_put(
            &mut etcd,
            codec.key(Some("ns"), name),
            pod_value("ns", name, "web", "n1", 1),
        )
        .await;
    }
    common::wait_cacher_rv(&cacher, rev, WAIT).await;
    assert!(matches!(
        cacher.check_consistency().await,
        Ok(CheckOutcome::Match { objects: 3, .. })
    ));
    let collected = spawn_collector(
        cacher
            .watch(WatchRequest {
                resource_version: Some(rev),
                ..WatchRequest::default()
            })
            .await
            .expect("watch"),
    );

    // a vanishes, b changes, a phantom d appears: no event, no new RV.
    let cache = cacher.watch_cache();
    let bogus = |name: &str, mod_rev: i64| {
        let key = codec.key(Some("ns"), name);
        let v = pod_value("ns", name, "bogus", "n9", 99);
        Some(Arc::new(
            codec
                .decode(&key, v.as_bytes(), mod_rev, mod_rev)
                .expect("decode"),
        ))
    };
    cache.inject_inconsistency(&codec.key(Some("ns"), "a"), None);
    cache.inject_inconsistency(&codec.key(Some("ns"), "b"), bogus("b", rev - 1));
    cache.inject_inconsistency(&codec.key(Some("ns"), "d"), bogus("d", rev));

    // The periodic checker finds it and heals it.
    let healed = common::eventually(WAIT, || {
        let c = Arc::clone(&cacher);
        async move {
            c.stats().consistency_mismatches() >= 1
                && matches!(
                    c.check_consistency().await,
                    Ok(CheckOutcome::Match { objects: 3, .. })
                )
        }
    })
    .await;
    assert!(healed, "mismatch found and healed");
    let list = cacher
        .list(&ListRequest::default())
        .await
        .expect("list after healing");
    let names: Vec<&str> = list.items.iter().map(|o| &*o.name).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert!(
        list.items
            .iter()
            .all(|o| o.labels.get("app").map(String::as_str) == Some("web"))
    );
    // The watcher saw the repair as events.
    let events = common::eventually(WAIT, || {
        let c = Arc::clone(&collected);
        async move { c.lock().events.len() >= 3 }
    })
    .await;
    assert!(events, "repair events delivered");
    let mut seen: Vec<(String, String, String)> = collected
        .lock()
        .events
        .iter()
        .map(|e| (e.ty.clone(), e.name.clone(), e.app.clone()))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("ADDED".to_string(), "a".to_string(), "web".to_string()),
            ("DELETED".to_string(), "d".to_string(), "bogus".to_string()),
            ("MODIFIED".to_string(), "b".to_string(), "web".to_string()),
        ]
    );
    cacher.shutdown();
}

//! The Cacher against a real etcd: docs/DESIGN.md section 2's Get/List table cell
//! by cell, watch semantics, consistent reads, selectors, slow watchers and
//! pagination.
mod common;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use watchcache::cacher::{
    Cacher, CacherError, CacherOptions, GetRequest, ListRequest, ListResult, ListSource,
    ResourceVersionMatch, WatchChunk, WatchRequest, Watcher,
};
use watchcache::object::{FieldSelector, LabelSelector};
use watchcache::storage::Storage;

const WAIT: Duration = Duration::from_secs(20);

struct Env {
    cacher: Arc<Cacher>,
    etcd: etcd_client::Client,
    key_prefix: String,
}

fn opts() -> CacherOptions {
    CacherOptions {
        // Long enough for a busy CI machine's etcd to answer a progress
        // request: tests that assert "served from the cache" must not see a
        // fallback because the machine was slow.
        consistent_read_timeout: Duration::from_secs(10),
        progress_interval: Duration::from_millis(300),
        idle_timeout: Duration::from_secs(3),
        list_page_size: 7,
        ..CacherOptions::default()
    }
}

/// An env whose reads wait at most 5 s for the cache to reach their
/// revision (short enough for a read far ahead to fail in a test's time,
/// long enough for a busy CI machine's cache to catch up with a write), with
/// room for 1,000 events and `seed` objects.
async fn env_short_wait(name: &str, seed: usize) -> Env {
    let o = CacherOptions {
        consistent_read_timeout: Duration::from_secs(5),
        ..opts()
    };
    env_with(name, 1000, o, seed).await
}

async fn env_with(name: &str, history_capacity: usize, o: CacherOptions, seed: usize) -> Env {
    let prefix = common::unique_prefix(name);
    let mut etcd = etcd_client::Client::connect([common::etcd()], None)
        .await
        .expect("etcd client");
    let key_prefix = format!("{prefix}/pods/");
    // Seed before starting, so the first list holds the seeds.
    for i in 0..seed {
        let name = format!("seed-{i:02}");
        let v = pod("ns1", &name, "web", "n1").to_string();
        common::etcd_put(&mut etcd, format!("{key_prefix}ns1/{name}"), v).await;
    }
    let resource = common::pods_resource(history_capacity);
    let (_, cacher) = common::start_cacher(common::etcd(), &prefix, resource, o).await;
    Env {
        cacher,
        etcd,
        key_prefix,
    }
}

async fn env(name: &str) -> Env {
    env_with(name, 1000, opts(), 0).await
}

fn pod(ns: &str, name: &str, app: &str, node: &str) -> Value {
    json!({"apiVersion":"v1","kind":"Pod",
        "metadata":{"name":name,"namespace":ns,"labels":{"app":app}},
        "spec":{"nodeName":node}})
}

impl Env {
    fn key(&self, ns: &str, name: &str) -> String {
        format!("{}{ns}/{name}", self.key_prefix)
    }
    /// Writes straight to etcd (behind the cache's back); returns the revision.
    async fn put(&mut self, ns: &str, name: &str, app: &str, node: &str) -> i64 {
        let key = self.key(ns, name);
        let v = pod(ns, name, app, node).to_string();
        common::etcd_put(&mut self.etcd, key, v).await
    }
    /// Writes a key outside this resource's prefix: etcd's revision moves,
    /// the cache only learns of it through a progress notification.
    async fn put_outside_prefix(&mut self, name: &str) -> i64 {
        let key = format!("{}-elsewhere/{name}", self.key_prefix.trim_end_matches('/'));
        common::etcd_put(&mut self.etcd, key, "1").await
    }
    async fn delete(&mut self, ns: &str, name: &str) -> i64 {
        let key = self.key(ns, name);
        let r = self.etcd.delete(key, None).await.expect("delete");
        r.header().expect("header").revision()
    }
    async fn wait_rv(&self, rv: i64) {
        common::wait_cacher_rv(&self.cacher, rv, WAIT).await;
    }
    async fn list(&self, req: ListRequest) -> Result<ListResult, CacherError> {
        self.cacher.list(&req).await
    }
}

fn names(r: &ListResult) -> Vec<String> {
    r.items.iter().map(|o| o.name.to_string()).collect()
}

fn get_req<'a>(ns: &'a str, name: &'a str, rv: Option<i64>) -> GetRequest<'a> {
    GetRequest {
        namespace: Some(ns),
        name,
        resource_version: rv,
    }
}

fn lreq(
    rv: Option<i64>,
    m: Option<ResourceVersionMatch>,
    limit: Option<i64>,
    cont: Option<String>,
) -> ListRequest {
    ListRequest {
        namespace: None,
        resource_version: rv,
        resource_version_match: m,
        limit,
        continue_token: cont,
        ..Default::default()
    }
}

fn is_bad_request<T: std::fmt::Debug>(r: &Result<T, CacherError>) -> bool {
    matches!(r, Err(CacherError::BadRequest(_)))
}

fn rv_of(obj_wire: &[u8]) -> String {
    let v: Value = serde_json::from_slice(obj_wire).expect("json");
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

// ---------------------------------------------------------------- Get

#[tokio::test]
async fn get_rv_unset_is_consistent() {
    let mut e = env("get_unset").await;
    // Idle for longer than the progress interval, then write behind the
    // cache's back and read at once.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let rev = e.put("ns1", "a", "web", "n1").await;
    let o = e.cacher.get(&get_req("ns1", "a", None)).await.expect("get");
    assert_eq!(o.mod_revision, rev);
    assert_eq!(rv_of(&o.wire), rev.to_string());
    // A write outside this resource's prefix moves etcd's revision, which
    // the cache only learns from a progress notification: a consistent read
    // must still be served from the cache, at or after that revision.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let other = e.put_outside_prefix("x").await;
    let r = e.list(lreq(None, None, None, None)).await.expect("list");
    assert_eq!(
        r.source,
        ListSource::Cache,
        "caught up through progress, no fallback"
    );
    assert!(
        r.resource_version >= other,
        "{} < {other}",
        r.resource_version
    );
    let before = e
        .cacher
        .stats()
        .consistent_read_fallback
        .load(std::sync::atomic::Ordering::Relaxed);
    let o = e.cacher.get(&get_req("ns1", "a", None)).await.expect("get");
    assert_eq!(o.mod_revision, rev);
    assert!(e.cacher.resource_version() >= other);
    assert_eq!(
        e.cacher
            .stats()
            .consistent_read_fallback
            .load(std::sync::atomic::Ordering::Relaxed),
        before
    );
}

#[tokio::test]
async fn get_rv_zero_serves_any() {
    let mut e = env("get_zero").await;
    let rev = e.put("ns1", "a", "web", "n1").await;
    e.wait_rv(rev).await;
    let o = e
        .cacher
        .get(&get_req("ns1", "a", Some(0)))
        .await
        .expect("get");
    assert_eq!(o.mod_revision, rev);
    assert_eq!(
        e.cacher.get(&get_req("ns1", "missing", Some(0))).await,
        Err(CacherError::NotFound)
    );
    // Answered at once, without a future: the same object, the same 404.
    let now = e.cacher.get_now(&get_req("ns1", "a", Some(0)));
    assert_eq!(now.map(|r| r.map(|o| o.mod_revision)), Some(Ok(rev)));
    assert_eq!(
        e.cacher.get_now(&get_req("ns1", "missing", Some(0))),
        Some(Err(CacherError::NotFound))
    );
    // A consistent read is never answered at once: it needs etcd's revision.
    assert!(e.cacher.get_now(&get_req("ns1", "a", None)).is_none());
}

#[tokio::test]
async fn get_rv_n_not_older_than() {
    let mut e = env_short_wait("get_n", 0).await;
    let r1 = e.put("ns1", "a", "web", "n1").await;
    let r2 = e.put("ns1", "a", "db", "n1").await;
    // Not older than r1: the newest version, waiting for it if needed.
    let o = e
        .cacher
        .get(&get_req("ns1", "a", Some(r1)))
        .await
        .expect("get");
    assert!(o.mod_revision >= r1);
    let o = e
        .cacher
        .get(&get_req("ns1", "a", Some(r2)))
        .await
        .expect("get");
    assert_eq!(o.mod_revision, r2);
    // Reached: answered at once. Far ahead: only the waiting `get` can
    // answer (504 after the bounded wait, below).
    let far = r2 + 1_000_000;
    let now = e.cacher.get_now(&get_req("ns1", "a", Some(r2)));
    assert_eq!(now.map(|r| r.map(|o| o.mod_revision)), Some(Ok(r2)));
    assert!(e.cacher.get_now(&get_req("ns1", "a", Some(far))).is_none());
    assert!(matches!(
        e.cacher.get_now(&get_req("ns1", "a", Some(-2))),
        Some(Err(CacherError::BadRequest(_)))
    ));
    match e.cacher.get(&get_req("ns1", "a", Some(far))).await {
        Err(CacherError::TooLargeResourceVersion { requested, current }) => {
            assert_eq!(requested, far);
            assert!(current >= r2);
        }
        other => panic!("expected 504, got {other:?}"),
    }
    assert!(is_bad_request(
        &e.cacher.get(&get_req("ns1", "a", Some(-2))).await
    ));
}

// ---------------------------------------------------------------- List: match unset, no limit

#[tokio::test]
async fn list_unset_nolimit_rv_unset_most_recent() {
    let mut e = env_with("l_u_n_unset", 1000, opts(), 3).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let rev = e.put("ns2", "direct", "web", "n1").await;
    let r = e.list(lreq(None, None, None, None)).await.expect("list");
    assert!(r.resource_version >= rev);
    assert_eq!(r.source, ListSource::Cache);
    assert!(names(&r).contains(&"direct".to_string()));
    assert_eq!(r.items.len(), 4);
    assert!(r.continue_token.is_none());
}

#[tokio::test]
async fn list_unset_nolimit_rv_zero_any() {
    let e = env_with("l_u_n_zero", 1000, opts(), 3).await;
    let before = e.cacher.resource_version();
    let r = e.list(lreq(Some(0), None, None, None)).await.expect("list");
    assert_eq!(r.items.len(), 3);
    assert_eq!(r.source, ListSource::Cache);
    // The cache's own revision (a progress notification may move it on
    // while the List runs).
    assert!((before..=e.cacher.resource_version()).contains(&r.resource_version));
}

#[tokio::test]
async fn list_unset_nolimit_rv_n_not_older_than() {
    let mut e = env_short_wait("l_u_n_n", 2).await;
    let rev = e.put("ns1", "x", "web", "n1").await;
    let r = e
        .list(lreq(Some(rev), None, None, None))
        .await
        .expect("list");
    assert!(r.resource_version >= rev);
    assert_eq!(r.items.len(), 3);
    let far = rev + 1_000_000;
    assert!(matches!(
        e.list(lreq(Some(far), None, None, None)).await,
        Err(CacherError::TooLargeResourceVersion { requested, .. }) if requested == far
    ));
}

// ---------------------------------------------------------------- List: match unset, limit, no continue

#[tokio::test]
async fn list_unset_limit_rv_unset_most_recent() {
    let mut e = env_with("l_u_l_unset", 1000, opts(), 5).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let rev = e.put("ns0", "first", "web", "n1").await;
    let r = e.list(lreq(None, None, Some(2), None)).await.expect("list");
    assert!(r.resource_version >= rev);
    assert_eq!(names(&r), vec!["first", "seed-00"], "ns0 sorts first");
    assert_eq!(r.remaining_item_count, Some(4));
    assert!(r.continue_token.is_some());
}

#[tokio::test]
async fn list_unset_limit_rv_zero_any() {
    let e = env_with("l_u_l_zero", 1000, opts(), 5).await;
    let r = e
        .list(lreq(Some(0), None, Some(2), None))
        .await
        .expect("list");
    assert_eq!(names(&r), vec!["seed-00", "seed-01"]);
    assert_eq!(r.remaining_item_count, Some(3));
}

#[tokio::test]
async fn list_unset_limit_rv_n_exact() {
    let mut e = env_with("l_u_l_n", 1000, opts(), 0).await;
    let r1 = e.put("ns1", "a", "v1", "n1").await;
    e.put("ns1", "b", "v1", "n1").await;
    let r3 = e.put("ns1", "a", "v2", "n1").await;
    e.delete("ns1", "b").await;
    e.wait_rv(r3 + 1).await;
    let r = e
        .list(lreq(Some(r1), None, Some(10), None))
        .await
        .expect("list");
    assert_eq!(r.resource_version, r1, "exact");
    assert_eq!(names(&r), vec!["a"]);
    assert_eq!(r.items.get(0).expect("an item").labels["app"], "v1");
    let r = e
        .list(lreq(Some(r3), None, Some(10), None))
        .await
        .expect("list");
    assert_eq!(r.resource_version, r3);
    assert_eq!(names(&r), vec!["a", "b"]);
    assert_eq!(r.items.get(0).expect("an item").labels["app"], "v2");
}

// ---------------------------------------------------------------- List: match unset, continue

async fn first_page(e: &Env) -> ListResult {
    let r = e
        .list(lreq(None, None, Some(2), None))
        .await
        .expect("first page");
    assert!(r.continue_token.is_some());
    r
}

#[tokio::test]
async fn list_unset_continue_rv_unset_continuation() {
    let e = env_with("l_u_c_unset", 1000, opts(), 5).await;
    let p1 = first_page(&e).await;
    let p2 = e
        .list(lreq(None, None, Some(2), p1.continue_token.clone()))
        .await
        .expect("page 2");
    assert_eq!(names(&p2), vec!["seed-02", "seed-03"]);
    assert_eq!(p2.resource_version, p1.resource_version);
}

#[tokio::test]
async fn list_unset_continue_rv_zero_continuation() {
    let e = env_with("l_u_c_zero", 1000, opts(), 5).await;
    let p1 = first_page(&e).await;
    let p2 = e
        .list(lreq(Some(0), None, Some(2), p1.continue_token.clone()))
        .await
        .expect("page 2");
    assert_eq!(names(&p2), vec!["seed-02", "seed-03"]);
}

#[tokio::test]
async fn list_unset_continue_rv_n_is_400() {
    let e = env_with("l_u_c_n", 1000, opts(), 5).await;
    let p1 = first_page(&e).await;
    let r = e
        .list(lreq(
            Some(p1.resource_version),
            None,
            Some(2),
            p1.continue_token,
        ))
        .await;
    assert!(is_bad_request(&r), "{r:?}");
}

// ---------------------------------------------------------------- List: Exact

#[tokio::test]
async fn list_exact_rv_unset_is_400() {
    let e = env("l_e_unset").await;
    for limit in [None, Some(2)] {
        let r = e
            .list(lreq(None, Some(ResourceVersionMatch::Exact), limit, None))
            .await;
        assert!(is_bad_request(&r), "{r:?}");
    }
}

#[tokio::test]
async fn list_exact_rv_zero_is_400() {
    let e = env("l_e_zero").await;
    for limit in [None, Some(2)] {
        let r = e
            .list(lreq(
                Some(0),
                Some(ResourceVersionMatch::Exact),
                limit,
                None,
            ))
            .await;
        assert!(is_bad_request(&r), "{r:?}");
    }
}

#[tokio::test]
async fn list_exact_rv_n_from_cache_or_etcd() {
    let mut e = env_with("l_e_n", 4, opts(), 0).await;
    let r1 = e.put("ns1", "a", "v1", "n1").await;
    let r2 = e.put("ns1", "a", "v2", "n1").await;
    e.wait_rv(r2).await;
    let r = e
        .list(lreq(
            Some(r1),
            Some(ResourceVersionMatch::Exact),
            None,
            None,
        ))
        .await
        .expect("exact");
    assert_eq!(r.resource_version, r1);
    assert_eq!(r.items.get(0).expect("an item").labels["app"], "v1");
    // Push r1 out of the history span: Exact r1 is answered by etcd at r1,
    // as kube-apiserver's cacher delegates it (410 once etcd compacted it).
    let mut last = r2;
    for i in 0..10 {
        last = e.put("ns1", "a", &format!("w{i}"), "n1").await;
    }
    e.wait_rv(last).await;
    let r = e
        .list(lreq(
            Some(r1),
            Some(ResourceVersionMatch::Exact),
            None,
            None,
        ))
        .await
        .expect("exact, from etcd");
    assert_eq!(r.resource_version, r1);
    assert_eq!(r.items.get(0).expect("an item").labels["app"], "v1");
}

// ---------------------------------------------------------------- List: NotOlderThan

#[tokio::test]
async fn list_not_older_than_rv_unset_is_400() {
    let e = env("l_not_unset").await;
    let r = e
        .list(lreq(
            None,
            Some(ResourceVersionMatch::NotOlderThan),
            None,
            None,
        ))
        .await;
    assert!(is_bad_request(&r), "{r:?}");
}

#[tokio::test]
async fn list_not_older_than_rv_zero_any() {
    let e = env_with("l_not_zero", 1000, opts(), 2).await;
    let r = e
        .list(lreq(
            Some(0),
            Some(ResourceVersionMatch::NotOlderThan),
            Some(5),
            None,
        ))
        .await
        .expect("list");
    assert_eq!(r.items.len(), 2);
}

#[tokio::test]
async fn list_not_older_than_rv_n() {
    let mut e = env_short_wait("l_not_n", 0).await;
    let r1 = e.put("ns1", "a", "v1", "n1").await;
    let r2 = e.put("ns1", "a", "v2", "n1").await;
    let r = e
        .list(lreq(
            Some(r1),
            Some(ResourceVersionMatch::NotOlderThan),
            None,
            None,
        ))
        .await
        .expect("list");
    assert!(r.resource_version >= r1);
    let r = e
        .list(lreq(
            Some(r2),
            Some(ResourceVersionMatch::NotOlderThan),
            None,
            None,
        ))
        .await
        .expect("list");
    assert_eq!(r.items.get(0).expect("an item").labels["app"], "v2");
    let r = e
        .list(lreq(
            Some(r2 + 1_000_000),
            Some(ResourceVersionMatch::NotOlderThan),
            None,
            None,
        ))
        .await;
    assert!(
        matches!(r, Err(CacherError::TooLargeResourceVersion { .. })),
        "{r:?}"
    );
}

// ---------------------------------------------------------------- pagination

/// remainingItemCount on every page of a namespace list, against a count of
/// what is really left, while another namespace holds objects too.
#[tokio::test]
async fn namespace_pages_count_what_remains() {
    let mut e = env_with("ns_paging", 1000, opts(), 7).await; // 7 in ns1
    for i in 0..5 {
        e.put("ns2", &format!("other-{i}"), "web", "n1").await;
    }
    let last = e.put("ns1", "zz", "web", "n1").await; // 8 in ns1
    e.wait_rv(last).await;
    let mut token = None;
    let mut seen = 0;
    loop {
        let page = e
            .list(ListRequest {
                namespace: Some("ns1".into()),
                ..lreq(None, None, Some(3), token.clone())
            })
            .await
            .expect("page");
        assert!(
            page.items
                .iter()
                .all(|o| o.namespace.as_deref() == Some("ns1"))
        );
        seen += page.items.len();
        match page.continue_token {
            Some(t) => {
                assert_eq!(
                    page.remaining_item_count,
                    Some((8 - seen) as i64),
                    "after {seen}"
                );
                token = Some(t);
            }
            None => {
                assert_eq!(page.remaining_item_count, None);
                break;
            }
        }
    }
    assert_eq!(seen, 8);
}

#[tokio::test]
async fn pagination_is_consistent_at_the_first_page_rv() {
    let mut e = env_with("paging", 1000, opts(), 25).await;
    let p1 = e
        .list(lreq(None, None, Some(10), None))
        .await
        .expect("page 1");
    assert_eq!(p1.items.len(), 10);
    assert_eq!(p1.remaining_item_count, Some(15));
    // Change things between pages: the later pages must not see it.
    e.delete("ns1", "seed-15").await;
    e.put("ns1", "seed-12", "changed", "n9").await;
    let last = e.put("ns1", "seed-99", "web", "n1").await;
    e.wait_rv(last).await;
    let p2 = e
        .list(lreq(None, None, Some(10), p1.continue_token.clone()))
        .await
        .expect("page 2");
    assert_eq!(p2.resource_version, p1.resource_version);
    assert_eq!(p2.remaining_item_count, Some(5));
    let p3 = e
        .list(lreq(None, None, Some(10), p2.continue_token.clone()))
        .await
        .expect("page 3");
    assert!(p3.continue_token.is_none());
    assert_eq!(p3.remaining_item_count, None);
    let all: Vec<String> = [names(&p1), names(&p2), names(&p3)].concat();
    let want: Vec<String> = (0..25).map(|i| format!("seed-{i:02}")).collect();
    assert_eq!(all, want);
    assert!(p2.items.iter().all(|o| o.labels["app"] == "web"));
    // A fresh list sees the changes.
    let now = e.list(lreq(None, None, None, None)).await.expect("list");
    assert_eq!(now.items.len(), 25);
    assert!(names(&now).contains(&"seed-99".to_string()));
}

#[tokio::test]
async fn continue_token_outside_the_prefix_is_400() {
    use base64::Engine;
    let e = env_with("bad_token", 1000, opts(), 3).await;
    let forge = |start: &str| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(
            json!({"v":"meta.k8s.io/v1","rv":e.cacher.resource_version(),"start":start})
                .to_string(),
        )
    };
    for start in ["../secrets/x", "/etc", "ns1/../../../x", ""] {
        let r = e.list(lreq(None, None, Some(2), Some(forge(start)))).await;
        assert!(is_bad_request(&r), "{start:?}: {r:?}");
    }
    let r = e.list(lreq(None, None, Some(2), Some("%%%".into()))).await;
    assert!(is_bad_request(&r));
}

#[tokio::test]
async fn continue_token_older_than_retained_snapshots_is_served_from_etcd() {
    let mut e = env_with("old_token", 3, opts(), 6).await;
    let p1 = e
        .list(lreq(None, None, Some(2), None))
        .await
        .expect("page 1");
    let mut last = 0;
    for i in 0..10 {
        last = e.put("ns1", "seed-04", &format!("w{i}"), "n1").await;
    }
    e.wait_rv(last).await;
    let p2 = e
        .list(lreq(None, None, Some(2), p1.continue_token.clone()))
        .await
        .expect("page 2 from etcd at the token's revision");
    assert_eq!(p2.source, ListSource::Etcd);
    assert_eq!(p2.resource_version, p1.resource_version);
    assert_eq!(names(&p2), vec!["seed-02", "seed-03"]);
    let p3 = e
        .list(lreq(None, None, Some(2), p2.continue_token.clone()))
        .await
        .expect("page 3");
    assert_eq!(names(&p3), vec!["seed-04", "seed-05"]);
    assert_eq!(
        p3.items.get(0).expect("an item").labels["app"],
        "web",
        "old state of seed-04"
    );
}

// ---------------------------------------------------------------- selectors

#[tokio::test]
async fn list_selectors_and_namespace() {
    let mut e = env("list_sel").await;
    e.put("ns1", "a", "web", "n1").await;
    e.put("ns1", "b", "db", "n1").await;
    e.put("ns2", "c", "web", "n2").await;
    let last = e.put("ns2", "d", "web", "").await;
    e.wait_rv(last).await;
    let paths = e.cacher.codec().index_paths().to_vec();
    let q = |ns: Option<&str>, l: &str, f: &str| ListRequest {
        namespace: ns.map(String::from),
        resource_version: Some(0),
        label_selector: LabelSelector::parse(l).expect("label"),
        field_selector: FieldSelector::parse(f, &paths).expect("field"),
        ..Default::default()
    };
    let n = |r: Result<ListResult, CacherError>| names(&r.expect("list"));
    assert_eq!(n(e.list(q(Some("ns1"), "", "")).await), vec!["a", "b"]);
    assert_eq!(n(e.list(q(None, "app=web", "")).await), vec!["a", "c", "d"]);
    assert_eq!(
        n(e.list(q(Some("ns2"), "app=web", "")).await),
        vec!["c", "d"]
    );
    assert_eq!(n(e.list(q(None, "app!=web", "")).await), vec!["b"]);
    assert_eq!(
        n(e.list(q(None, "", "spec.nodeName=n1")).await),
        vec!["a", "b"]
    );
    assert_eq!(n(e.list(q(None, "", "spec.nodeName=")).await), vec!["d"]);
    assert_eq!(
        n(e.list(q(None, "app=web", "spec.nodeName=n1")).await),
        vec!["a"]
    );
    assert_eq!(n(e.list(q(None, "", "metadata.name=c")).await), vec!["c"]);
    assert_eq!(
        n(
            e.list(q(None, "", "metadata.namespace=ns1,spec.nodeName!=n2"))
                .await
        ),
        vec!["a", "b"]
    );
    assert!(n(e.list(q(None, "app=none", "")).await).is_empty());
    // Selector + paging.
    let mut req = q(None, "app=web", "");
    req.limit = Some(2);
    let p1 = e.list(req.clone()).await.expect("p1");
    assert_eq!(names(&p1), vec!["a", "c"]);
    // Kubernetes: with a selector the remaining count is unknown (unset).
    assert_eq!(p1.remaining_item_count, None);
    assert!(p1.continue_token.is_some());
    req.continue_token = p1.continue_token;
    req.resource_version = None;
    assert_eq!(n(e.list(req).await), vec!["d"]);
}

// ---------------------------------------------------------------- watch helpers

#[derive(Debug, Clone, PartialEq)]
struct Ev {
    ty: String,
    name: String,
    rv: String,
    app: String,
    initial_end: bool,
}

fn parse_chunk(b: &[u8]) -> Vec<Ev> {
    std::str::from_utf8(b)
        .expect("utf8")
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("line is json");
            let o = &v["object"];
            Ev {
                ty: v["type"].as_str().unwrap_or("").into(),
                name: o["metadata"]["name"].as_str().unwrap_or("").into(),
                rv: o["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or("")
                    .into(),
                app: o["metadata"]["labels"]["app"].as_str().unwrap_or("").into(),
                initial_end: o["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true",
            }
        })
        .collect()
}

/// Reads until `n` events arrived (or a timeout / error / end).
async fn read_n(w: &mut Watcher, n: usize) -> Result<Vec<Ev>, CacherError> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while out.len() < n {
        match tokio::time::timeout_at(deadline, w.next()).await {
            Ok(Some(WatchChunk::Data(b))) => out.extend(parse_chunk(&b)),
            Ok(Some(WatchChunk::Error(e))) => return Err(e),
            Ok(None) | Err(_) => break,
        }
    }
    Ok(out)
}

/// Whatever arrives within `d`.
async fn read_for(w: &mut Watcher, d: Duration) -> Vec<Ev> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + d;
    while let Ok(Some(WatchChunk::Data(b))) = tokio::time::timeout_at(deadline, w.next()).await {
        out.extend(parse_chunk(&b));
    }
    out
}

fn wreq(rv: Option<i64>, bookmarks: bool, sie: Option<bool>) -> WatchRequest {
    WatchRequest {
        resource_version: rv,
        resource_version_match: sie.map(|_| ResourceVersionMatch::NotOlderThan),
        allow_bookmarks: bookmarks,
        send_initial_events: sie,
        ..Default::default()
    }
}

fn types(evs: &[Ev]) -> Vec<String> {
    evs.iter().map(|e| e.ty.clone()).collect()
}

// ---------------------------------------------------------------- watch

/// allowWatchBookmarks x sendInitialEvents x RV in {unset, 0, 1, current}.
#[tokio::test]
async fn watch_semantics_grid() {
    let mut e = env_with("watch_grid", 1000, opts(), 2).await;
    assert!(
        e.cacher.resource_version() > 1,
        "the shared etcd has history before this prefix"
    );
    let mut n = 0;
    for bookmarks in [false, true] {
        for sie in [None, Some(false), Some(true)] {
            for label in ["unset", "0", "1", "current"] {
                let current = e.cacher.resource_version();
                let rv = match label {
                    "unset" => None,
                    "0" => Some(0),
                    "1" => Some(1),
                    _ => Some(current),
                };
                let case = format!("bookmarks={bookmarks} sie={sie:?} rv={label}");
                let r = e.cacher.watch(wreq(rv, bookmarks, sie)).await;
                if sie == Some(true) && !bookmarks {
                    assert!(is_bad_request(&r), "{case}: {r:?}");
                    continue;
                }
                let mut w = r.unwrap_or_else(|err| panic!("{case}: {err:?}"));
                // RV=1 without initial events: events after 1 are long gone.
                if rv == Some(1) && sie != Some(true) {
                    match w.next().await {
                        Some(WatchChunk::Error(CacherError::Expired(msg))) => {
                            assert!(
                                msg.starts_with("too old resource version: 1 ("),
                                "{case}: {msg}"
                            )
                        }
                        other => panic!("{case}: expected 410, got {other:?}"),
                    }
                    assert!(w.next().await.is_none(), "{case}: ends after the error");
                    continue;
                }
                let initial = match sie {
                    None => matches!(rv, None | Some(0)),
                    Some(false) => false,
                    Some(true) => true,
                };
                if initial {
                    let want = if sie == Some(true) { 3 } else { 2 };
                    let evs = read_n(&mut w, want).await.expect(&case);
                    let mut expect = vec!["ADDED", "ADDED"];
                    if sie == Some(true) {
                        expect.push("BOOKMARK");
                        assert!(evs[2].initial_end, "{case}: initial-events-end");
                        assert!(evs[2].rv.parse::<i64>().unwrap_or(0) >= current, "{case}");
                    }
                    assert_eq!(types(&evs), expect, "{case}");
                    assert_eq!(evs[0].name, "seed-00", "{case}");
                }
                // Then changes: a new write arrives as the next event.
                n += 1;
                let name = format!("new-{n}");
                let rev = e.put("ns1", &name, "web", "n1").await;
                let evs = read_n(&mut w, 1).await.expect(&case);
                assert_eq!(evs.len(), 1, "{case}: {evs:?}");
                assert_eq!(evs[0].ty, "ADDED", "{case}");
                assert_eq!(evs[0].name, name, "{case}");
                assert_eq!(evs[0].rv, rev.to_string(), "{case}");
                let del = e.delete("ns1", &name).await;
                e.wait_rv(del).await;
            }
        }
    }
}

#[tokio::test]
async fn watch_from_rv_replays_history_including_txns() {
    let mut e = env("watch_from_rv").await;
    let start = e.cacher.resource_version();
    e.put("ns1", "a", "v1", "n1").await;
    // A multi-key txn: both events share one RV.
    let txn = etcd_client::Txn::new().and_then(vec![
        etcd_client::TxnOp::put(
            e.key("ns1", "b"),
            pod("ns1", "b", "v1", "n1").to_string(),
            None,
        ),
        etcd_client::TxnOp::put(
            e.key("ns1", "c"),
            pod("ns1", "c", "v1", "n1").to_string(),
            None,
        ),
    ]);
    let tr = e.etcd.txn(txn).await.expect("txn");
    let txn_rev = tr.header().expect("header").revision();
    e.delete("ns1", "a").await;
    let mut w = e
        .cacher
        .watch(wreq(Some(start), false, None))
        .await
        .expect("watch");
    let evs = read_n(&mut w, 4).await.expect("events");
    assert_eq!(types(&evs), vec!["ADDED", "ADDED", "ADDED", "DELETED"]);
    assert_eq!(evs[1].rv, txn_rev.to_string());
    assert_eq!(evs[2].rv, txn_rev.to_string());
    // From the txn's RV: only what follows it.
    let mut w = e
        .cacher
        .watch(wreq(Some(txn_rev), false, None))
        .await
        .expect("watch");
    let evs = read_n(&mut w, 1).await.expect("events");
    assert_eq!(types(&evs), vec!["DELETED"]);
    assert_eq!(evs[0].name, "a");
}

/// A watch from an old RV that is routed (namespace, index field, label)
/// replays the history from that RV, whether its route is new or already
/// exists (the route's own log only starts when the route is created).
#[tokio::test]
async fn routed_watch_from_rv_replays_history() {
    let mut e = env("routed_from_rv").await;
    let start = e.cacher.resource_version();
    e.put("ns1", "a", "web", "n1").await;
    e.put("ns2", "b", "db", "n2").await;
    let last = e.put("ns1", "c", "web", "n2").await;
    e.wait_rv(last).await;
    let paths: Vec<std::sync::Arc<str>> = vec!["spec.nodeName".into()];
    let cases: Vec<(&str, WatchRequest, Vec<&str>)> = vec![
        (
            "namespace",
            WatchRequest {
                namespace: Some("ns1".into()),
                ..wreq(Some(start), false, None)
            },
            vec!["a", "c"],
        ),
        (
            "field",
            WatchRequest {
                field_selector: FieldSelector::parse("spec.nodeName=n2", &paths).expect("selector"),
                ..wreq(Some(start), false, None)
            },
            vec!["b", "c"],
        ),
        (
            "label",
            WatchRequest {
                label_selector: LabelSelector::parse("app=db").expect("selector"),
                ..wreq(Some(start), false, None)
            },
            vec!["b"],
        ),
    ];
    // Twice: the first watcher creates each route; the second joins it while
    // the first still holds it.
    let mut held = Vec::new();
    for round in 0..2 {
        for (name, req, want) in &cases {
            let req = WatchRequest {
                namespace: req.namespace.clone(),
                field_selector: req.field_selector.clone(),
                label_selector: req.label_selector.clone(),
                ..wreq(Some(start), false, None)
            };
            let mut w = e.cacher.watch(req).await.expect("watch");
            let evs = read_n(&mut w, want.len()).await.expect("events");
            let got: Vec<&str> = evs.iter().map(|ev| ev.name.as_str()).collect();
            assert_eq!(&got, want, "{name} round {round}: {evs:?}");
            held.push(w);
        }
    }
    // And the live events after the replay still flow on the route.
    let rev = e.put("ns1", "d", "db", "n2").await;
    for w in held.iter_mut() {
        let evs = read_n(w, 1).await.expect("live event");
        assert_eq!(evs.len(), 1);
        assert_eq!(evs[0].name, "d");
        assert_eq!(evs[0].rv, rev.to_string());
    }
}

#[tokio::test]
async fn watch_too_old_rv_is_410_with_message() {
    let mut e = env_with("watch_old", 3, opts(), 0).await;
    let start = e.cacher.resource_version();
    let mut last = 0;
    for i in 0..6 {
        last = e.put("ns1", &format!("p{i}"), "web", "n1").await;
    }
    e.wait_rv(last).await;
    let oldest = e.cacher.watch_cache().oldest_watch_rv();
    assert!(oldest > start);
    let mut w = e
        .cacher
        .watch(wreq(Some(start), false, None))
        .await
        .expect("watch");
    match w.next().await {
        Some(WatchChunk::Error(CacherError::Expired(msg))) => {
            assert_eq!(msg, format!("too old resource version: {start} ({oldest})"))
        }
        other => panic!("expected 410, got {other:?}"),
    }
    // The oldest servable RV itself works.
    let mut w = e
        .cacher
        .watch(wreq(Some(oldest), false, None))
        .await
        .expect("watch");
    let evs = read_n(&mut w, 1).await.expect("events");
    assert!(!evs.is_empty());
}

#[tokio::test]
async fn slow_watcher_gets_410_when_history_overflows() {
    let mut e = env_with("slow", 5, opts(), 0).await;
    let mut fast = e
        .cacher
        .watch(wreq(Some(0), false, None))
        .await
        .expect("fast");
    let mut slow = e
        .cacher
        .watch(wreq(Some(0), false, None))
        .await
        .expect("slow");
    let mut last = 0;
    for i in 0..20 {
        last = e.put("ns1", &format!("p{i}"), "web", "n1").await;
        // The fast watcher keeps up.
        let got = read_n(&mut fast, 1).await.expect("fast keeps up");
        assert_eq!(got.len(), 1);
    }
    e.wait_rv(last).await;
    match slow.next().await {
        Some(WatchChunk::Error(CacherError::Expired(msg))) => {
            assert!(msg.starts_with("too old resource version: "), "{msg}")
        }
        other => panic!("expected 410 for the slow watcher, got {other:?}"),
    }
    assert!(slow.next().await.is_none());
    assert_eq!(
        e.cacher.watch_cache().history_len(),
        5,
        "memory bounded by the ring"
    );
}

#[tokio::test]
async fn watch_selector_conversion_uses_the_previous_object() {
    let mut e = env("conversion").await;
    let paths = e.cacher.codec().index_paths().to_vec();
    let by_label = WatchRequest {
        label_selector: LabelSelector::parse("app=web").expect("sel"),
        ..wreq(Some(0), false, None)
    };
    let by_node = WatchRequest {
        field_selector: FieldSelector::parse("spec.nodeName=n1", &paths).expect("sel"),
        ..wreq(Some(0), false, None)
    };
    let by_set = WatchRequest {
        label_selector: LabelSelector::parse("app in (web,api)").expect("sel"),
        namespace: Some("ns1".into()),
        ..wreq(Some(0), false, None)
    };
    let mut wl = e.cacher.watch(by_label).await.expect("watch");
    let mut wn = e.cacher.watch(by_node).await.expect("watch");
    let mut ws = e.cacher.watch(by_set).await.expect("watch");
    e.put("ns1", "a", "db", "n2").await; // matches none
    let r_add = e.put("ns1", "a", "web", "n2").await; // label: ADDED
    let r_mod = e.put("ns1", "a", "web", "n1").await; // label: MODIFIED; node: ADDED
    let r_del = e.put("ns1", "a", "db", "n1").await; // label: DELETED (old object); node: MODIFIED
    let r_gone = e.delete("ns1", "a").await; // node: DELETED
    e.put("ns2", "z", "web", "n3").await; // label only: ADDED

    let evs = read_n(&mut wl, 4).await.expect("label");
    assert_eq!(types(&evs), vec!["ADDED", "MODIFIED", "DELETED", "ADDED"]);
    assert_eq!(evs[0].rv, r_add.to_string());
    assert_eq!(evs[1].rv, r_mod.to_string());
    assert_eq!(evs[2].rv, r_del.to_string(), "the old object at the new RV");
    assert_eq!(evs[2].app, "web", "DELETED carries the old object");
    assert_eq!(evs[3].name, "z");

    let evs = read_n(&mut wn, 3).await.expect("node");
    assert_eq!(types(&evs), vec!["ADDED", "MODIFIED", "DELETED"]);
    assert_eq!(evs[2].rv, r_gone.to_string());
    assert_eq!(evs[2].app, "db");

    let evs = read_n(&mut ws, 3).await.expect("set");
    assert_eq!(types(&evs), vec!["ADDED", "MODIFIED", "DELETED"]);
    // Nothing else for the field-routed watcher.
    assert!(
        read_for(&mut wn, Duration::from_millis(300))
            .await
            .is_empty()
    );
}

#[tokio::test]
async fn bookmarks_and_timeout() {
    let mut e = env_with(
        "bookmarks",
        1000,
        CacherOptions {
            bookmark_interval: Duration::from_millis(200),
            ..opts()
        },
        1,
    )
    .await;
    let mut w = e
        .cacher
        .watch(WatchRequest {
            timeout: Some(Duration::from_secs(4)),
            ..wreq(Some(0), true, None)
        })
        .await
        .expect("watch");
    let mut no_bm = e
        .cacher
        .watch(WatchRequest {
            timeout: Some(Duration::from_secs(4)),
            ..wreq(Some(0), false, None)
        })
        .await
        .expect("watch");
    // A live event, well inside the watches' timeout even on a slow machine.
    let rev = e.put("ns1", "x", "web", "n1").await;
    let mut all = Vec::new();
    while let Some(c) = tokio::time::timeout(WAIT, w.next())
        .await
        .expect("ends by itself")
    {
        match c {
            WatchChunk::Data(b) => all.extend(parse_chunk(&b)),
            WatchChunk::Error(e) => panic!("{e:?}"),
        }
    }
    let bms: Vec<&Ev> = all.iter().filter(|e| e.ty == "BOOKMARK").collect();
    assert!(bms.len() >= 2, "periodic bookmarks and a last one: {all:?}");
    assert_eq!(
        all.last().map(|e| e.ty.as_str()),
        Some("BOOKMARK"),
        "last item is a bookmark"
    );
    assert!(
        bms.last()
            .map(|b| b.rv.parse::<i64>().unwrap_or(0) >= rev)
            .unwrap_or(false)
    );
    assert!(bms.iter().all(|b| !b.initial_end));
    let mut plain = Vec::new();
    while let Some(c) = tokio::time::timeout(WAIT, no_bm.next())
        .await
        .expect("ends by itself")
    {
        if let WatchChunk::Data(b) = c {
            plain.extend(parse_chunk(&b));
        }
    }
    assert!(plain.iter().all(|e| e.ty != "BOOKMARK"), "{plain:?}");
    assert_eq!(types(&plain), vec!["ADDED", "ADDED"]);
}

#[tokio::test]
async fn shutdown_ends_watchers_and_refuses_requests() {
    let e = env_with("shutdown", 1000, opts(), 1).await;
    let mut w = e
        .cacher
        .watch(wreq(None, false, None))
        .await
        .expect("watch");
    assert_eq!(read_n(&mut w, 1).await.expect("initial").len(), 1);
    e.cacher.shutdown();
    assert!(
        tokio::time::timeout(WAIT, w.next())
            .await
            .expect("ends")
            .is_none()
    );
    assert_eq!(
        e.cacher.list(&lreq(Some(0), None, None, None)).await.err(),
        Some(CacherError::ShuttingDown)
    );
}

#[tokio::test]
async fn not_ready_until_the_first_list() {
    let mut etcd = common::PrivateEtcd::start().await.expect("private etcd");
    let prefix = common::unique_prefix("not_ready");
    let storage = Storage::connect(&common::etcd_config(&etcd.endpoint(), &prefix))
        .await
        .expect("connect");
    etcd.kill();
    let cacher = Cacher::start(common::pods_resource(100), &prefix, storage, opts());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!cacher.is_ready());
    assert_eq!(
        cacher.list(&lreq(None, None, None, None)).await.err(),
        Some(CacherError::NotReady)
    );
    assert_eq!(
        cacher.watch(wreq(None, false, None)).await.err(),
        Some(CacherError::NotReady)
    );
    // Get falls back to etcd, which is down: a storage error, not 429.
    assert!(matches!(
        cacher.get(&get_req("ns1", "a", None)).await,
        Err(CacherError::Storage(_))
    ));
    etcd.restart().await.expect("restart");
    assert!(cacher.wait_ready(WAIT).await, "ready once etcd is back");
    assert!(cacher.list(&lreq(None, None, None, None)).await.is_ok());
}

#[tokio::test]
async fn undecodable_values_are_skipped() {
    let mut e = env("undecodable").await;
    let bad = e.key("ns1", "bad");
    e.etcd
        .put(bad.as_str(), "not json", None)
        .await
        .expect("put");
    let rev = e.put("ns1", "good", "web", "n1").await;
    e.wait_rv(rev).await;
    let r = e.list(lreq(None, None, None, None)).await.expect("list");
    assert_eq!(names(&r), vec!["good"]);
    assert!(
        e.cacher
            .stats()
            .decode_errors
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
    // A valid object turned invalid disappears from the cache.
    let good = e.key("ns1", "good");
    let r2 = e.etcd.put(good.as_str(), "[1,2]", None).await.expect("put");
    e.wait_rv(r2.header().expect("h").revision()).await;
    assert_eq!(
        e.cacher.get(&get_req("ns1", "good", Some(0))).await,
        Err(CacherError::NotFound)
    );
}

#[tokio::test]
async fn a_non_utf8_key_does_not_keep_the_cache_from_starting() {
    let prefix = common::unique_prefix("non_utf8");
    let key_prefix = format!("{prefix}/pods/");
    let mut etcd = etcd_client::Client::connect([common::etcd()], None)
        .await
        .expect("etcd client");
    let mut bad = format!("{key_prefix}ns1/").into_bytes();
    bad.extend_from_slice(&[0x01, 0xff]);
    common::etcd_put(&mut etcd, bad, "{}").await;
    for name in ["a", "b"] {
        let v = pod("ns1", name, "web", "n1").to_string();
        common::etcd_put(&mut etcd, format!("{key_prefix}ns1/{name}"), v).await;
    }
    let o = CacherOptions {
        list_page_size: 1,
        ..opts()
    };
    // Ready despite the bad key.
    let (_, cacher) =
        common::start_cacher(common::etcd(), &prefix, common::pods_resource(100), o).await;
    let r = cacher
        .list(&lreq(None, None, None, None))
        .await
        .expect("list");
    assert_eq!(names(&r), vec!["a", "b"]);
    assert!(
        cacher
            .stats()
            .decode_errors
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
}

#[tokio::test]
async fn consistent_read_requests_progress_on_an_idle_resource() {
    // The reflector's own idle timer is far away: only the reader's progress
    // request can move the cache RV past a write to another prefix.
    let mut e = env_with(
        "consistent_progress",
        1000,
        CacherOptions {
            progress_interval: Duration::from_secs(120),
            idle_timeout: Duration::from_secs(120),
            ..opts()
        },
        1,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let other = e.put_outside_prefix("y").await;
    assert!(
        e.cacher.resource_version() < other,
        "cache {} other {other}",
        e.cacher.resource_version()
    );
    // Served from the cache at or after `other`: the progress request, not
    // the bounded wait's fallback to etcd, brought the cache there.
    let r = e.list(lreq(None, None, None, None)).await.expect("list");
    assert_eq!(r.source, ListSource::Cache);
    assert!(r.resource_version >= other);
    let o = e
        .cacher
        .get(&get_req("ns1", "seed-00", None))
        .await
        .expect("get");
    assert_eq!(o.name.as_ref(), "seed-00");
}

#[tokio::test]
async fn consistent_read_falls_back_to_etcd_on_timeout() {
    // A zero wait bound: a consistent read the cache is behind for goes to etcd.
    let mut e = env_with(
        "consistent_fallback",
        1000,
        CacherOptions {
            consistent_read_timeout: Duration::ZERO,
            progress_interval: Duration::from_secs(120),
            idle_timeout: Duration::from_secs(120),
            ..opts()
        },
        3,
    )
    .await;
    let other = e.put_outside_prefix("z").await;
    let r = e.list(lreq(None, None, Some(2), None)).await.expect("list");
    assert_eq!(r.source, ListSource::Etcd);
    {
        assert!(r.resource_version >= other);
        assert_eq!(names(&r), vec!["seed-00", "seed-01"]);
        assert_eq!(r.remaining_item_count, Some(1));
        // The continuation is served consistently at the etcd revision.
        let p2 = e
            .list(lreq(None, None, Some(2), r.continue_token.clone()))
            .await
            .expect("page 2");
        assert_eq!(p2.resource_version, r.resource_version);
        assert_eq!(names(&p2), vec!["seed-02"]);
    }
    let fallbacks = e
        .cacher
        .stats()
        .consistent_read_fallback
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(fallbacks >= 1);
    // Get falls back too, and still finds the object.
    let o = e
        .cacher
        .get(&get_req("ns1", "seed-01", None))
        .await
        .expect("get");
    assert_eq!(o.name.as_ref(), "seed-01");
    assert!(
        e.cacher
            .stats()
            .consistent_read_fallback
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1,
        "a zero bound cannot be met after an outside write"
    );
    e.put("ns1", "late", "web", "n1").await;
}

#[tokio::test]
async fn continue_token_from_the_future_is_504() {
    use base64::Engine;
    let e = env_with(
        "future_token",
        1000,
        CacherOptions {
            consistent_read_timeout: Duration::from_millis(300),
            ..opts()
        },
        3,
    )
    .await;
    let rv = e.cacher.resource_version() + 1_000_000;
    let token = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(json!({"v":"meta.k8s.io/v1","rv":rv,"start":"ns1/seed-01\u{0}"}).to_string());
    let r = e.list(lreq(None, None, Some(2), Some(token))).await;
    assert!(
        matches!(r, Err(CacherError::TooLargeResourceVersion { requested, .. }) if requested == rv),
        "{r:?}"
    );
}

/// The Prometheus side of the cacher: events received and dispatched, the
/// delivery delay, watchers, and each termination reason, on a resource name
/// no other test uses (the registry is process-wide).
#[tokio::test]
async fn cacher_records_prometheus_metrics() {
    let prefix = common::unique_prefix("metrics");
    let mut etcd = etcd_client::Client::connect([common::etcd()], None)
        .await
        .expect("etcd client");
    let res = watchcache::config::ResourceConfig {
        plural: "metricpods".into(),
        ..common::pods_resource(2)
    };
    let (_, cacher) = common::start_cacher(common::etcd(), &prefix, res, opts()).await;
    let m = watchcache::metrics::metrics().for_resource("metricpods");
    // The figures as `/metrics` renders them.
    let scrape = |name: &str, labels: &str| -> f64 {
        let text = watchcache::metrics::gather();
        let series = format!("{name}{{{labels}}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{series} not in\n{text}"))
    };
    const R: &str = "resource=\"metricpods\"";
    assert_eq!(scrape("watchcache_history_capacity", R), 2.0);
    assert_eq!(scrape("watchcache_initializations_total", R), 1.0);

    let key = |n: &str| format!("{prefix}/metricpods/ns1/{n}");
    let put = |n: &str| (key(n), pod("ns1", n, "web", "n1").to_string());

    // A watcher that reads, one the client closes, one that times out.
    let mut reader = cacher.watch(wreq(None, false, None)).await.expect("watch");
    let closed = cacher.watch(wreq(None, false, None)).await.expect("watch");
    let mut timed = cacher
        .watch(WatchRequest {
            timeout: Some(Duration::from_millis(300)),
            ..wreq(None, false, None)
        })
        .await
        .expect("watch");
    assert_eq!(scrape("watchcache_watchers", R), 3.0);
    let (k, v) = put("a");
    let rev = etcd
        .put(k, v, None)
        .await
        .expect("put")
        .header()
        .expect("h")
        .revision();
    let evs = read_n(&mut reader, 1).await.expect("event");
    assert_eq!(evs.len(), 1);
    assert_eq!(scrape("watchcache_events_received_total", R), 1.0);
    // Progress notifications may have moved it on since (other tests write
    // to the same etcd).
    assert!(scrape("watchcache_resource_version", R) >= rev as f64);
    assert_eq!(scrape("watchcache_objects", R), 1.0);
    assert!(scrape("watchcache_events_dispatched_total", R) >= 1.0);
    assert!(m.watch_event_delay.sample_count() >= 1);

    drop(closed);
    assert_eq!(
        scrape(
            "watchcache_terminated_watchers_total",
            "reason=\"closed\",resource=\"metricpods\""
        ),
        1.0
    );
    while let Some(c) = tokio::time::timeout(WAIT, timed.next())
        .await
        .expect("ends")
    {
        assert!(matches!(c, WatchChunk::Data(_)));
    }
    drop(timed);
    assert_eq!(
        scrape(
            "watchcache_terminated_watchers_total",
            "reason=\"timeout\",resource=\"metricpods\""
        ),
        1.0
    );

    // The reader falls behind a 2-event history: 410, counted as expired.
    for n in ["b", "c", "d", "e"] {
        let (k, v) = put(n);
        etcd.put(k, v, None).await.expect("put");
    }
    let last = etcd
        .get(key("e"), None)
        .await
        .expect("get")
        .header()
        .expect("h")
        .revision();
    assert!(
        common::eventually(WAIT, || {
            let c = Arc::clone(&cacher);
            async move { c.resource_version() >= last }
        })
        .await
    );
    let r = read_n(&mut reader, 10).await;
    assert!(matches!(r, Err(CacherError::Expired(_))), "{r:?}");
    drop(reader);
    // The history holds its last two events: their objects' JSON, and how
    // long ago the older one came.
    assert_eq!(scrape("watchcache_history_events", R), 2.0);
    let bytes = scrape("watchcache_history_bytes", R);
    assert!(
        (200.0..4000.0).contains(&bytes),
        "two pods' JSON, {bytes} bytes"
    );
    assert!(scrape("watchcache_history_oldest_age_seconds", R) > 0.0);
    assert_eq!(
        scrape(
            "watchcache_terminated_watchers_total",
            "reason=\"expired\",resource=\"metricpods\""
        ),
        1.0
    );
    assert_eq!(scrape("watchcache_watchers", R), 0.0);
    cacher.shutdown();
}

/// A List run to its end, and whether it was done at its first poll (it
/// never left the caller's task).
async fn list_polled_once(
    cacher: &Cacher,
    req: &ListRequest,
) -> (bool, Result<ListResult, CacherError>) {
    let list = cacher.list(req);
    tokio::pin!(list);
    match futures::poll!(list.as_mut()) {
        std::task::Poll::Ready(r) => (true, r),
        std::task::Poll::Pending => (false, list.await),
    }
}

/// Every page of a List from `first` on, following continue tokens; with
/// each page's remainingItemCount.
async fn all_pages(cacher: &Cacher, first: ListRequest) -> Vec<(Vec<String>, Option<i64>)> {
    let mut pages = Vec::new();
    let mut req = first;
    loop {
        let page = cacher.list(&req).await.expect("page");
        pages.push((names(&page), page.remaining_item_count));
        match page.continue_token {
            Some(t) => {
                req.continue_token = Some(t);
                req.resource_version = None;
            }
            None => return pages,
        }
    }
}

/// A selection that may walk more objects than a List walks inline (32,768)
/// runs on the blocking pool: the first poll leaves the List pending instead
/// of walking the whole cache in the caller's task, which holds every other
/// stream of the client's connection; one an index bounds stays inline. It
/// answers as the inline selection does: selectors, namespaces, pages and
/// their counts.
#[tokio::test]
async fn a_large_selection_runs_off_the_task_and_answers_the_same() {
    const N: usize = 33_000;
    let prefix = common::unique_prefix("large_sel");
    let key_prefix = format!("{prefix}/pods/");
    let mut etcd = etcd_client::Client::connect([common::etcd()], None)
        .await
        .expect("etcd client");
    let ns = |i: usize| if i.is_multiple_of(2) { "ns1" } else { "ns2" };
    let app = |i: usize| if i.is_multiple_of(3) { "web" } else { "db" };
    let all: Vec<usize> = (0..N).collect();
    for chunk in all.chunks(100) {
        let ops = chunk
            .iter()
            .map(|&i| {
                let name = format!("p{i:05}");
                let v = pod(ns(i), &name, app(i), "n1").to_string();
                etcd_client::TxnOp::put(format!("{key_prefix}{}/{name}", ns(i)), v, None)
            })
            .collect::<Vec<_>>();
        etcd.txn(etcd_client::Txn::new().and_then(ops))
            .await
            .expect("txn");
    }
    let o = CacherOptions {
        list_page_size: 5_000,
        ..opts()
    };
    let (_, cacher) =
        common::start_cacher(common::etcd(), &prefix, common::pods_resource(100), o).await;
    // Names in key order (namespace, then name) of the objects that pass.
    let expect = |pass: &dyn Fn(usize) -> bool| {
        let mut v: Vec<(&str, String)> = all
            .iter()
            .filter(|&&i| pass(i))
            .map(|&i| (ns(i), format!("p{i:05}")))
            .collect();
        v.sort();
        v.into_iter().map(|(_, n)| n).collect::<Vec<_>>()
    };

    let by_label = |l: &str| ListRequest {
        resource_version: Some(0),
        label_selector: LabelSelector::parse(l).expect("selector"),
        ..Default::default()
    };
    // A selector no index answers: the whole cache is walked.
    let (at_once, r) = list_polled_once(&cacher, &by_label("app!=web")).await;
    assert!(!at_once, "the selection ran in the caller's task");
    let r = r.expect("list");
    assert_eq!(names(&r), expect(&|i| app(i) != "web"));
    assert_eq!(r.remaining_item_count, None);
    // An index answers `app=web`: it walks its 11,000 objects inline.
    let (at_once, r) = list_polled_once(&cacher, &by_label("app=web")).await;
    assert!(at_once, "an indexed selection left the task");
    assert_eq!(names(&r.expect("list")), expect(&|i| app(i) == "web"));

    // Pages of a selection in one namespace: no counts (selectors).
    let pages = all_pages(
        &cacher,
        ListRequest {
            namespace: Some("ns2".into()),
            label_selector: LabelSelector::parse("app=web").expect("selector"),
            ..lreq(Some(0), None, Some(1_500), None)
        },
    )
    .await;
    assert!(pages.len() > 1, "{} pages", pages.len());
    assert!(pages.iter().all(|(_, remaining)| remaining.is_none()));
    let got: Vec<String> = pages.into_iter().flat_map(|(p, _)| p).collect();
    assert_eq!(got, expect(&|i| ns(i) == "ns2" && app(i) == "web"));

    // Pages of one namespace without selectors: the first page counts the
    // namespace (a walk of its range), later pages carry the count.
    let pages = all_pages(
        &cacher,
        ListRequest {
            namespace: Some("ns1".into()),
            ..lreq(Some(0), None, Some(1_000), None)
        },
    )
    .await;
    assert_eq!(pages.len(), 17, "16,500 objects in pages of 1,000");
    let remaining: Vec<Option<i64>> = pages.iter().map(|(_, r)| *r).collect();
    let expected: Vec<Option<i64>> = (1..=16)
        .map(|p| Some(16_500 - 1_000 * p))
        .chain([None])
        .collect();
    assert_eq!(remaining, expected);
    let got: Vec<String> = pages.into_iter().flat_map(|(p, _)| p).collect();
    assert_eq!(got, expect(&|i| ns(i) == "ns1"));
}

//! The Kubernetes-style REST API over HTTP against a real etcd: every route,
//! every error path (HTTP code + Status.reason + etcd untouched), optimistic
//! concurrency, pagination, watch and read-your-writes.
mod common;
use common::server as api_support;

use std::time::Duration;

use futures::StreamExt;
use reqwest::Method;
use serde_json::{Value, json};

use api_support::{TestServer, create_large_pods, gunzip, pod, rv_of};
use watchcache::object::protobuf;

const PODS: &str = "/api/v1/namespaces/ns1/pods";

fn assert_status(code: u16, body: &Value, want_code: u16, want_reason: &str) {
    assert_eq!(code, want_code, "HTTP code; body: {body}");
    assert_eq!(body["kind"], "Status", "a Status object: {body}");
    assert_eq!(body["status"], "Failure", "{body}");
    assert_eq!(body["code"], want_code, "{body}");
    assert_eq!(body["reason"], want_reason, "{body}");
}

/// Reads a watch stream line by line.
struct WatchStream {
    resp: Option<reqwest::Response>,
    buf: Vec<u8>,
}

impl WatchStream {
    async fn open(ts: &TestServer, path: &str) -> WatchStream {
        let resp = ts
            .http
            .get(ts.url(path))
            .timeout(Duration::from_secs(120))
            .send()
            .await
            .expect("watch request");
        assert_eq!(resp.status(), 200, "watch status");
        WatchStream {
            resp: Some(resp),
            buf: Vec::new(),
        }
    }

    /// The next event, or None at the end of the stream / after `timeout`.
    async fn next(&mut self, timeout: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                return Some(serde_json::from_slice(&line).expect("watch line is JSON"));
            }
            let resp = self.resp.as_mut()?;
            match tokio::time::timeout_at(deadline, resp.chunk()).await {
                Ok(Ok(Some(chunk))) => self.buf.extend_from_slice(&chunk),
                Ok(Ok(None)) | Ok(Err(_)) => {
                    self.resp = None;
                    return None;
                }
                Err(_) => return None,
            }
        }
    }

    /// The next event that is not a BOOKMARK.
    async fn next_event(&mut self, timeout: Duration) -> Option<Value> {
        loop {
            let ev = self.next(timeout).await?;
            if ev["type"] != "BOOKMARK" {
                return Some(ev);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// ops and discovery

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_endpoints() {
    let ts = TestServer::start("ops", |_| {}).await;
    for path in ["/healthz", "/livez", "/readyz"] {
        let r = ts.http.get(ts.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(r.text().await.unwrap(), "ok", "{path}");
    }
    let r = ts.http.get(ts.url("/readyz?verbose")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains("[+]cacher-pods ok"), "{text}");
    assert!(text.contains("[+]cacher-widgets.example.com ok"), "{text}");
    let r = ts.http.get(ts.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = ts.http.post(ts.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 405);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_documents() {
    let ts = TestServer::start("discovery", |_| {}).await;
    let (c, v) = ts.get_json("/version").await;
    assert_eq!(c, 200);
    assert_eq!(v["major"], "1");
    let (c, v) = ts.get_json("/api").await;
    assert_eq!(c, 200);
    assert_eq!(v["kind"], "APIVersions");
    assert_eq!(v["versions"], json!(["v1"]));
    let (c, v) = ts.get_json("/api/v1").await;
    assert_eq!(c, 200);
    assert_eq!(v["kind"], "APIResourceList");
    assert_eq!(v["groupVersion"], "v1");
    let res = v["resources"].as_array().unwrap();
    let pods = res.iter().find(|r| r["name"] == "pods").expect("pods");
    assert_eq!(pods["kind"], "Pod");
    assert_eq!(pods["namespaced"], true);
    assert_eq!(pods["singularName"], "pod");
    assert!(pods["verbs"].as_array().unwrap().contains(&json!("watch")));
    let nodes = res.iter().find(|r| r["name"] == "nodes").expect("nodes");
    assert_eq!(nodes["namespaced"], false);
    let (c, v) = ts.get_json("/apis").await;
    assert_eq!(c, 200);
    assert_eq!(v["kind"], "APIGroupList");
    assert_eq!(v["groups"][0]["name"], "example.com");
    assert_eq!(
        v["groups"][0]["preferredVersion"]["groupVersion"],
        "example.com/v1"
    );
    let (c, v) = ts.get_json("/apis/example.com/v1").await;
    assert_eq!(c, 200);
    assert_eq!(v["groupVersion"], "example.com/v1");
    assert_eq!(v["resources"][0]["name"], "widgets");
    let (c, v) = ts.get_json("/apis/example.com").await;
    assert_eq!(c, 200);
    assert_eq!(v["kind"], "APIGroup");
    let (c, v) = ts.get_json("/apis/nope.io/v1").await;
    assert_status(c, &v, 404, "NotFound");
    let (c, v) = ts.get_json("/api/v2").await;
    assert_status(c, &v, 404, "NotFound");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_prior_knowledge() {
    let ts = TestServer::start("h2c", |_| {}).await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let r = h2.get(ts.url("/api/v1")).send().await.unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    assert_eq!(r.status(), 200);
    // Several watches multiplexed on one connection.
    let mut streams = Vec::new();
    for _ in 0..5 {
        let r = h2.get(ts.url("/api/v1/pods?watch=1")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        streams.push(r);
    }
    let (c, _) = ts.post_json(PODS, &pod("ns1", "h2")).await;
    assert_eq!(c, 201);
    for r in &mut streams {
        let chunk = tokio::time::timeout(Duration::from_secs(10), r.chunk())
            .await
            .expect("event in time")
            .unwrap()
            .unwrap();
        let ev: Value =
            serde_json::from_slice(chunk.split(|b| *b == b'\n').next().unwrap()).unwrap();
        assert_eq!(ev["type"], "ADDED");
        assert_eq!(ev["object"]["metadata"]["name"], "h2");
    }
}

// ---------------------------------------------------------------------------
// CRUD

/// A PUT at a resourceVersion that changes nothing is still a compare-and-
/// swap: when the cached object says that version is current but etcd has
/// moved on, the answer is 409, as kube-apiserver's GuaranteedUpdate
/// re-reads before trusting a no-op on a cached object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_no_op_update_on_a_stale_cache_is_a_conflict() {
    let ts = TestServer::start("noopstale", |_| {}).await;
    let path = format!("{PODS}/stale");
    let (c, v1) = ts.post_json(PODS, &pod("ns1", "stale")).await;
    assert_eq!(c, 201, "{v1}");
    let rv1 = rv_of(&v1);
    let (c, v2) = ts
        .patch_json(
            &path,
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"moved": "on"}}}),
        )
        .await;
    assert_eq!(c, 200, "{v2}");
    let rv2 = rv_of(&v2);
    // The cache learns of the patch, then is made to hold the first
    // version again (as a cache behind etcd would).
    let pods = ts
        .cachers
        .iter()
        .find(|c| c.resource().plural == "pods")
        .expect("pods cacher");
    let cache = pods.watch_cache();
    assert!(
        common::eventually(Duration::from_secs(20), || async {
            cache.resource_version() >= rv2
        })
        .await
    );
    let key = pods.codec().key(Some("ns1"), "stale");
    let mut etcd = ts.etcd.clone();
    let old = etcd
        .get(
            key.as_str(),
            Some(etcd_client::GetOptions::new().with_revision(rv1)),
        )
        .await
        .expect("etcd get at rv1");
    let kv = &old.kvs()[0];
    let object = pods
        .codec()
        .decode(&key, kv.value(), kv.mod_revision(), kv.create_revision())
        .expect("decode");
    cache.inject_inconsistency(&key, Some(std::sync::Arc::new(object)));

    let before = ts.etcd_dump().await;
    let (c, v) = ts.put_json(&path, &v1).await;
    assert_status(c, &v, 409, "Conflict");
    assert_eq!(ts.etcd_dump().await, before);
    // A real no-op at the current version is still a 200 without a write.
    let (c, v) = ts.put_json(&path, &v2).await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(rv_of(&v), rv2);
}

/// Many concurrent consistent reads while etcd moves on elsewhere ask etcd
/// for progress at most once per 100 ms (kube-apiserver's progress
/// requester), not once per read: an upper bound that holds however slow
/// the machine is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistent_reads_share_progress_requests() {
    let ts = std::sync::Arc::new(TestServer::start("progressrate", |_| {}).await);
    let pods = ts
        .cachers
        .iter()
        .find(|c| c.resource().plural == "pods")
        .expect("pods cacher");
    let count = || {
        pods.stats()
            .progress_requests
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = count();
    let started = std::time::Instant::now();
    // At least 2 s and at least 200 reads, however slow the machine: the
    // bound below means something only when reads outnumber it.
    let run_for = Duration::from_secs(2);
    const MIN_READS: usize = 200;
    let total = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let more = {
        let total = std::sync::Arc::clone(&total);
        move || {
            started.elapsed() < run_for
                || total.load(std::sync::atomic::Ordering::Relaxed) < MIN_READS
        }
    };
    // etcd's revision moves outside this resource, so each read finds the
    // cache behind it.
    let mut etcd = ts.etcd.clone();
    let key = format!("{}/elsewhere", ts.prefix);
    let writer = {
        let done = std::sync::Arc::clone(&done);
        tokio::spawn(async move {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = etcd.put(key.as_str(), "x", None).await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let ts = std::sync::Arc::clone(&ts);
        let total = std::sync::Arc::clone(&total);
        let more = more.clone();
        tasks.push(tokio::spawn(async move {
            while more() {
                let (c, _) = ts.get_json(PODS).await;
                assert_eq!(c, 200);
                total.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.expect("reader");
    }
    let elapsed = started.elapsed();
    let sent = count() - before;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.await.expect("writer");
    let reads = total.load(std::sync::atomic::Ordering::Relaxed);
    // One per 100 ms, plus the idle detector's and the one a read after
    // the loop's end may have scheduled.
    let bound = (elapsed.as_millis() / 100) as u64 + 3;
    assert!(reads >= MIN_READS, "{reads} reads");
    assert!(
        sent <= bound,
        "{sent} progress requests for {reads} reads in {elapsed:?} (bound {bound})"
    );
}

/// Patches whose cost grows faster than their size: a JSON patch of
/// copies of copies (refused, as kube-apiserver refuses it, before it can
/// grow the object past memory), too many operations (413), and a strategic
/// merge patch of long lists (merged by key in one pass, not compared
/// element by element). Nothing refused is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patches_whose_cost_grows_faster_than_their_size() {
    let ts = TestServer::start("patchcost", |_| {}).await;
    let path = format!("{PODS}/grow");
    let (c, v) = ts.post_json(PODS, &pod("ns1", "grow")).await;
    assert_eq!(c, 201, "{v}");
    let before = ts.etcd_dump().await;

    // Each copy doubles /metadata: 40 would be 2^40 times its size.
    let copies: Vec<Value> = (0..40)
        .map(|i| json!({"op": "copy", "from": "/metadata", "path": format!("/metadata/c{i}")}))
        .collect();
    let (c, v) = ts
        .patch_json(&path, "application/json-patch+json", &Value::Array(copies))
        .await;
    assert_status(c, &v, 422, "Invalid");
    assert!(
        v["message"]
            .as_str()
            .unwrap_or_default()
            .contains("accumulated size increase of copy"),
        "{v}"
    );
    assert_eq!(ts.etcd_dump().await, before);

    // A few copies within the limit still apply.
    let (c, v) = ts
        .patch_json(
            &path,
            "application/json-patch+json",
            &json!([{"op": "copy", "from": "/metadata/labels", "path": "/metadata/annotations"}]),
        )
        .await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(v["metadata"]["annotations"], v["metadata"]["labels"]);
    let before = ts.etcd_dump().await;

    let many: Vec<Value> = (0..10_001)
        .map(|_| json!({"op": "test", "path": "/kind", "value": "Pod"}))
        .collect();
    let (c, v) = ts
        .patch_json(&path, "application/json-patch+json", &Value::Array(many))
        .await;
    assert_status(c, &v, 413, "RequestEntityTooLarge");
    assert!(
        v["message"]
            .as_str()
            .unwrap_or_default()
            .contains("10000, got 10001"),
        "{v}"
    );
    assert_eq!(ts.etcd_dump().await, before);

    // 60,000 finalizers, reordered: one pass each, well inside the bound
    // (element-by-element lookups would be billions of comparisons).
    let n = 60_000;
    let names: Vec<String> = (0..n).map(|i| format!("f{i}")).collect();
    let patch = json!({"metadata": {
        "finalizers": names,
        "$setElementOrder/finalizers": names.iter().rev().collect::<Vec<_>>(),
    }});
    let r = tokio::time::timeout(
        Duration::from_secs(120),
        ts.patch_json(&path, "application/strategic-merge-patch+json", &patch),
    )
    .await;
    let (c, v) = r.expect("a long strategic merge patch finishes");
    assert_eq!(c, 200, "{}", &v.to_string()[..300.min(v.to_string().len())]);
    let f = v["metadata"]["finalizers"].as_array().expect("finalizers");
    assert_eq!(f.len(), n);
    assert_eq!(f[0], json!(format!("f{}", n - 1)));
    assert_eq!(f[n - 1], json!("f0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crud_namespaced_core() {
    let ts = TestServer::start("crud", |_| {}).await;
    // create
    let (c, created) = ts.post_json(PODS, &pod("ns1", "a")).await;
    assert_eq!(c, 201, "{created}");
    assert_eq!(created["kind"], "Pod");
    assert_eq!(created["metadata"]["namespace"], "ns1");
    let uid = created["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_string();
    assert_eq!(uid.len(), 36);
    let ts_str = created["metadata"]["creationTimestamp"].as_str().unwrap();
    assert!(
        chrono::DateTime::parse_from_rfc3339(ts_str).is_ok(),
        "{ts_str}"
    );
    let rv1 = rv_of(&created);
    // stored without resourceVersion, with uid
    let stored = ts.etcd_get(&ts.pod_key("ns1", "a")).await.expect("stored");
    assert!(
        stored["metadata"].get("resourceVersion").is_none(),
        "{stored}"
    );
    assert_eq!(stored["metadata"]["uid"], uid.as_str());
    // create again -> AlreadyExists
    let (c, v) = ts.post_json(PODS, &pod("ns1", "a")).await;
    assert_status(c, &v, 409, "AlreadyExists");
    // get (read-your-writes)
    let (c, got) = ts.get_json(&format!("{PODS}/a")).await;
    assert_eq!(c, 200);
    assert_eq!(rv_of(&got), rv1);
    // list in namespace and across namespaces
    let (c, list) = ts.get_json(PODS).await;
    assert_eq!(c, 200);
    assert_eq!(list["kind"], "PodList");
    assert_eq!(list["apiVersion"], "v1");
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    assert!(rv_of(&list) >= rv1);
    let (c, all) = ts.get_json("/api/v1/pods").await;
    assert_eq!(c, 200);
    assert_eq!(all["items"].as_array().unwrap().len(), 1);
    let (_, other) = ts.get_json("/api/v1/namespaces/other/pods").await;
    assert_eq!(other["items"].as_array().unwrap().len(), 0);
    // update with the right RV (CAS)
    let mut upd = got.clone();
    upd["spec"]["nodeName"] = json!("node-2");
    let (c, updated) = ts.put_json(&format!("{PODS}/a"), &upd).await;
    assert_eq!(c, 200, "{updated}");
    let rv2 = rv_of(&updated);
    assert!(rv2 > rv1);
    assert_eq!(updated["metadata"]["uid"], uid.as_str(), "uid kept");
    assert_eq!(
        updated["metadata"]["creationTimestamp"], ts_str,
        "creationTimestamp kept"
    );
    // update with a stale RV -> Conflict, etcd untouched
    let before = ts.etcd_dump().await;
    let (c, v) = ts.put_json(&format!("{PODS}/a"), &upd).await;
    assert_status(c, &v, 409, "Conflict");
    assert_eq!(ts.etcd_dump().await, before);
    // update without RV (unconditional)
    let mut upd2 = upd.clone();
    upd2["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    upd2["metadata"].as_object_mut().unwrap().remove("uid");
    upd2["spec"]["nodeName"] = json!("node-3");
    let (c, v) = ts.put_json(&format!("{PODS}/a"), &upd2).await;
    assert_eq!(c, 200, "{v}");
    let rv3 = rv_of(&v);
    assert!(rv3 > rv2);
    assert_eq!(v["metadata"]["uid"], uid.as_str());
    // a no-op update does not write
    let (c, v) = ts.put_json(&format!("{PODS}/a"), &upd2).await;
    assert_eq!(c, 200);
    assert_eq!(rv_of(&v), rv3, "no-op update keeps the RV");
    // merge patch
    let (c, v) = ts
        .patch_json(
            &format!("{PODS}/a"),
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"tier": "fe"}}, "spec": {"nodeName": "node-4"}}),
        )
        .await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(v["metadata"]["labels"]["tier"], "fe");
    assert_eq!(v["metadata"]["labels"]["app"], "web");
    assert_eq!(v["spec"]["nodeName"], "node-4");
    let rv4 = rv_of(&v);
    // json patch
    let (c, v) = ts
        .patch_json(
            &format!("{PODS}/a"),
            "application/json-patch+json",
            &json!([{"op": "replace", "path": "/spec/nodeName", "value": "node-5"},
                    {"op": "remove", "path": "/metadata/labels/tier"}]),
        )
        .await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(v["spec"]["nodeName"], "node-5");
    assert!(v["metadata"]["labels"].get("tier").is_none());
    assert!(rv_of(&v) > rv4);
    // strategic merge patch is treated as a merge patch
    let (c, v) = ts
        .patch_json(
            &format!("{PODS}/a"),
            "application/strategic-merge-patch+json",
            &json!({"spec": {"nodeName": "node-6"}}),
        )
        .await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(v["spec"]["nodeName"], "node-6");
    // merge patch with a stale resourceVersion -> Conflict
    let before = ts.etcd_dump().await;
    let (c, v) = ts
        .patch_json(
            &format!("{PODS}/a"),
            "application/merge-patch+json",
            &json!({"metadata": {"resourceVersion": rv1.to_string()}, "spec": {"nodeName": "x"}}),
        )
        .await;
    assert_status(c, &v, 409, "Conflict");
    assert_eq!(ts.etcd_dump().await, before);
    // json patch whose test fails -> 422, etcd untouched
    let (c, v) = ts
        .patch_json(
            &format!("{PODS}/a"),
            "application/json-patch+json",
            &json!([{"op": "test", "path": "/spec/nodeName", "value": "nope"}]),
        )
        .await;
    assert_status(c, &v, 422, "Invalid");
    assert_eq!(ts.etcd_dump().await, before);
    // delete with a wrong uid precondition -> Conflict
    let (c, v) = ts
        .delete_json(
            &format!("{PODS}/a"),
            Some(&json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "nope"}})),
        )
        .await;
    assert_status(c, &v, 409, "Conflict");
    // with a wrong resourceVersion precondition -> Conflict
    let (c, v) = ts
        .delete_json(
            &format!("{PODS}/a"),
            Some(&json!({"preconditions": {"resourceVersion": rv1.to_string()}})),
        )
        .await;
    assert_status(c, &v, 409, "Conflict");
    assert_eq!(ts.etcd_dump().await, before);
    // with the right ones -> deleted
    let (c, v) = ts
        .delete_json(
            &format!("{PODS}/a"),
            Some(&json!({"preconditions": {"uid": uid}})),
        )
        .await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(v["metadata"]["name"], "a");
    assert!(ts.etcd_get(&ts.pod_key("ns1", "a")).await.is_none());
    // gone
    let (c, v) = ts.get_json(&format!("{PODS}/a")).await;
    assert_status(c, &v, 404, "NotFound");
    assert_eq!(v["details"]["name"], "a");
    assert_eq!(v["details"]["kind"], "pods");
    let (c, v) = ts.delete_json(&format!("{PODS}/a"), None).await;
    assert_status(c, &v, 404, "NotFound");
    let (c, v) = ts.put_json(&format!("{PODS}/a"), &pod("ns1", "a")).await;
    assert_status(c, &v, 404, "NotFound");
    let (c, v) = ts
        .patch_json(
            &format!("{PODS}/a"),
            "application/merge-patch+json",
            &json!({}),
        )
        .await;
    assert_status(c, &v, 404, "NotFound");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crud_cluster_scoped_and_non_core() {
    let ts = TestServer::start("scopes", |_| {}).await;
    // cluster-scoped core: nodes
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}});
    let (c, v) = ts.post_json("/api/v1/nodes", &node).await;
    assert_eq!(c, 201, "{v}");
    assert!(v["metadata"].get("namespace").is_none());
    assert!(
        ts.etcd_get(&format!("{}/nodes/n1", ts.prefix))
            .await
            .is_some()
    );
    let (c, v) = ts.get_json("/api/v1/nodes/n1").await;
    assert_eq!(c, 200);
    assert_eq!(v["metadata"]["name"], "n1");
    let (c, v) = ts.get_json("/api/v1/nodes").await;
    assert_eq!(c, 200);
    assert_eq!(v["kind"], "NodeList");
    assert_eq!(v["items"].as_array().unwrap().len(), 1);
    let (c, v) = ts
        .patch_json(
            "/api/v1/nodes/n1",
            "application/merge-patch+json",
            &json!({"spec": {"unschedulable": true}}),
        )
        .await;
    assert_eq!(c, 200, "{v}");
    // namespaced path for a cluster-scoped resource -> 404
    let (c, v) = ts.get_json("/api/v1/namespaces/ns1/nodes/n1").await;
    assert_status(c, &v, 404, "NotFound");
    let (c, v) = ts.delete_json("/api/v1/nodes/n1", None).await;
    assert_eq!(c, 200, "{v}");
    assert!(
        ts.etcd_get(&format!("{}/nodes/n1", ts.prefix))
            .await
            .is_none()
    );

    // non-core namespaced: widgets.example.com
    let base = "/apis/example.com/v1/namespaces/ns1/widgets";
    let w = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"}, "spec": {"size": 1}});
    let (c, v) = ts.post_json(base, &w).await;
    assert_eq!(c, 201, "{v}");
    assert_eq!(
        v["metadata"]["namespace"], "ns1",
        "namespace filled from the path"
    );
    assert!(
        ts.etcd_get(&format!("{}/example.com/widgets/ns1/w1", ts.prefix))
            .await
            .is_some()
    );
    let (c, v) = ts.get_json(&format!("{base}/w1")).await;
    assert_eq!(c, 200);
    assert_eq!(v["apiVersion"], "example.com/v1");
    let (c, v) = ts.get_json("/apis/example.com/v1/widgets").await;
    assert_eq!(c, 200);
    assert_eq!(v["kind"], "WidgetList");
    assert_eq!(v["apiVersion"], "example.com/v1");
    let mut w2 = v["items"][0].clone();
    w2["spec"]["size"] = json!(2);
    let (c, v) = ts.put_json(&format!("{base}/w1"), &w2).await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(v["spec"]["size"], 2);
    let (c, _) = ts.delete_json(&format!("{base}/w1"), None).await;
    assert_eq!(c, 200);
    // Gone: the Status names the group too, as kube-apiserver's does.
    let (c, v) = ts.get_json(&format!("{base}/w1")).await;
    assert_status(c, &v, 404, "NotFound");
    assert_eq!(v["message"], r#"widgets.example.com "w1" not found"#);
    assert_eq!(
        (
            &v["details"]["name"],
            &v["details"]["group"],
            &v["details"]["kind"]
        ),
        (&json!("w1"), &json!("example.com"), &json!("widgets"))
    );
    // wrong apiVersion in the body -> 400
    let bad = json!({"apiVersion": "v1", "kind": "Widget", "metadata": {"name": "w2"}});
    let (c, v) = ts.post_json(base, &bad).await;
    assert_status(c, &v, 400, "BadRequest");
    let bad = json!({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "w2"}});
    let (c, v) = ts.post_json(base, &bad).await;
    assert_status(c, &v, 400, "BadRequest");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_name_and_defaults() {
    let ts = TestServer::start("genname", |_| {}).await;
    let body = json!({"metadata": {"generateName": "web-"}, "spec": {}});
    let (c, v) = ts.post_json(PODS, &body).await;
    assert_eq!(c, 201, "{v}");
    let name = v["metadata"]["name"].as_str().unwrap();
    assert!(name.starts_with("web-") && name.len() == 9, "{name}");
    assert_eq!(v["apiVersion"], "v1", "apiVersion filled");
    assert_eq!(v["kind"], "Pod", "kind filled");
    assert!(ts.etcd_get(&ts.pod_key("ns1", name)).await.is_some());
    // a resourceVersion in a create body is ignored (never stored)
    let mut p = pod("ns1", "withrv");
    p["metadata"]["resourceVersion"] = json!("12345");
    let (c, v) = ts.post_json(PODS, &p).await;
    assert_eq!(c, 201, "{v}");
    let stored = ts.etcd_get(&ts.pod_key("ns1", "withrv")).await.unwrap();
    assert!(stored["metadata"].get("resourceVersion").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_writes_nothing() {
    let ts = TestServer::start("dryrun", |_| {}).await;
    let (c, v) = ts.post_json(PODS, &pod("ns1", "real")).await;
    assert_eq!(c, 201, "{v}");
    let before = ts.etcd_dump().await;
    let (c, v) = ts
        .post_json(&format!("{PODS}?dryRun=All"), &pod("ns1", "dry"))
        .await;
    assert_eq!(c, 201, "{v}");
    assert_eq!(v["metadata"]["name"], "dry");
    assert!(v["metadata"]["uid"].is_string());
    let (c, v) = ts
        .post_json(&format!("{PODS}?dryRun=All"), &pod("ns1", "real"))
        .await;
    assert_status(c, &v, 409, "AlreadyExists");
    let mut p = pod("ns1", "real");
    p["spec"]["nodeName"] = json!("dry-node");
    let (c, v) = ts.put_json(&format!("{PODS}/real?dryRun=All"), &p).await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(v["spec"]["nodeName"], "dry-node");
    let (c, v) = ts
        .patch_json(
            &format!("{PODS}/real?dryRun=All"),
            "application/merge-patch+json",
            &json!({"spec": {"nodeName": "dry2"}}),
        )
        .await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(v["spec"]["nodeName"], "dry2");
    let (c, v) = ts
        .delete_json(&format!("{PODS}/real?dryRun=All"), None)
        .await;
    assert_eq!(c, 200, "{v}");
    let (c, v) = ts
        .delete_json(&format!("{PODS}/real"), Some(&json!({"dryRun": ["All"]})))
        .await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(ts.etcd_dump().await, before, "dry runs left etcd untouched");
    let (c, v) = ts
        .post_json(&format!("{PODS}?dryRun=Some"), &pod("ns1", "x"))
        .await;
    assert_status(c, &v, 400, "BadRequest");
    assert_eq!(ts.etcd_dump().await, before);
}

// ---------------------------------------------------------------------------
// bad input

/// An object within the API's body limit but over etcd's request limit
/// (1.5 MiB by default, and gRPC's receive limit above it) is the client's
/// problem: 413, on create and on a GuaranteedUpdate (patch) alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_over_etcds_request_limit_are_413() {
    let ts = TestServer::start("etcdlimit", |c| c.server.max_body_bytes = 8 << 20).await;
    let (c, _) = ts.post_json(PODS, &pod("ns1", "small")).await;
    assert_eq!(c, 201);
    let before = ts.etcd_dump().await;
    // Over --max-request-bytes, and over the gRPC server's message limit.
    for size in [1_700_000, 3_000_000] {
        let mut big = pod("ns1", &format!("big-{size}"));
        big["spec"]["blob"] = json!("x".repeat(size));
        let (c, v) = ts.post_json(PODS, &big).await;
        assert_status(c, &v, 413, "RequestEntityTooLarge");
        let (c, v) = ts
            .patch_json(
                &format!("{PODS}/small"),
                "application/merge-patch+json",
                &json!({"spec": {"blob": "x".repeat(size)}}),
            )
            .await;
        assert_status(c, &v, 413, "RequestEntityTooLarge");
    }
    assert_eq!(ts.etcd_dump().await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_leave_etcd_untouched() {
    let ts = TestServer::start("bad", |c| c.server.max_body_bytes = 4096).await;
    let (c, _) = ts.post_json(PODS, &pod("ns1", "exists")).await;
    assert_eq!(c, 201);
    let before = ts.etcd_dump().await;
    let item = format!("{PODS}/exists");
    let json_ct = Some("application/json");

    // 413: body over the limit (with and without Content-Length)
    let mut big = pod("ns1", "big");
    big["spec"]["blob"] = json!("x".repeat(10_000));
    let (c, v) = ts.post_json(PODS, &big).await;
    assert_status(c, &v, 413, "RequestEntityTooLarge");
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..10).map(|_| Ok(vec![b' '; 1000])).collect();
    let r = ts
        .http
        .post(ts.url(PODS))
        .header("Content-Type", "application/json")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    // The rest of that body is never read: the HTTP/1.1 connection ends
    // with this answer, and says so, so the client does not send its next
    // request on it.
    assert_eq!(
        r.headers().get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["reason"], "RequestEntityTooLarge");

    // 400: malformed JSON on create, update, patch, delete
    for (m, path, ct) in [
        (Method::POST, PODS.to_string(), "application/json"),
        (Method::PUT, item.clone(), "application/json"),
        (Method::PATCH, item.clone(), "application/merge-patch+json"),
        (Method::PATCH, item.clone(), "application/json-patch+json"),
        (Method::DELETE, item.clone(), "application/json"),
    ] {
        let (c, v) = ts
            .send(m.clone(), &path, Some(ct), Some(b"{not json".to_vec()))
            .await;
        assert_status(c, &v, 400, "BadRequest");
    }
    // a body that is JSON but not an object
    let (c, v) = ts
        .send(Method::POST, PODS, json_ct, Some(b"[1,2]".to_vec()))
        .await;
    assert_status(c, &v, 400, "BadRequest");
    // a json patch that is not a list of operations
    let (c, v) = ts
        .patch_json(&item, "application/json-patch+json", &json!({"op": "add"}))
        .await;
    assert_status(c, &v, 400, "BadRequest");

    // 422: missing / invalid names
    let (c, v) = ts
        .post_json(PODS, &json!({"metadata": {}, "spec": {}}))
        .await;
    assert_status(c, &v, 422, "Invalid");
    for bad in ["UPPER", "a_b", "-a", "a/b", &"a".repeat(254)] {
        let (c, v) = ts.post_json(PODS, &pod("ns1", bad)).await;
        assert_status(c, &v, 422, "Invalid");
    }
    let (c, v) = ts
        .post_json(PODS, &json!({"metadata": {"generateName": "BAD_"}}))
        .await;
    assert_status(c, &v, 422, "Invalid");
    let (c, v) = ts
        .post_json("/api/v1/namespaces/Bad_NS/pods", &pod("Bad_NS", "x"))
        .await;
    assert_status(c, &v, 422, "Invalid");

    // 400: namespace / name not matching the path
    let (c, v) = ts.post_json(PODS, &pod("other", "x")).await;
    assert_status(c, &v, 400, "BadRequest");
    let (c, v) = ts.put_json(&item, &pod("ns1", "different")).await;
    assert_status(c, &v, 400, "BadRequest");
    let (c, v) = ts.put_json(&item, &pod("other", "exists")).await;
    assert_status(c, &v, 400, "BadRequest");
    let (c, v) = ts
        .patch_json(
            &item,
            "application/merge-patch+json",
            &json!({"metadata": {"name": "renamed"}}),
        )
        .await;
    assert_status(c, &v, 400, "BadRequest");

    // 415: unsupported patch and body types
    for ct in ["text/plain", "application/json"] {
        let (c, v) = ts.patch_json(&item, ct, &json!({})).await;
        assert_status(c, &v, 415, "UnsupportedMediaType");
    }
    let (c, v) = ts
        .send(Method::PATCH, &item, None, Some(b"{}".to_vec()))
        .await;
    assert_status(c, &v, 415, "UnsupportedMediaType");
    let (c, v) = ts
        .send(
            Method::POST,
            PODS,
            Some("application/yaml"),
            Some(b"a: b".to_vec()),
        )
        .await;
    assert_status(c, &v, 415, "UnsupportedMediaType");

    // 400: bad query parameters
    for q in [
        "resourceVersion=abc",
        "resourceVersion=-1",
        "limit=x",
        "limit=-5",
        "labelSelector=a%20in%20(",
        "fieldSelector=spec.unknownField%3Dx",
        "continue=garbage",
        "resourceVersionMatch=Sometimes&resourceVersion=1",
        "resourceVersionMatch=Exact",
        "watch=1&timeoutSeconds=soon",
        "watch=1&resourceVersion=abc",
        "watch=1&labelSelector=%21%21",
    ] {
        let (c, v) = ts.get_json(&format!("{PODS}?{q}")).await;
        assert_status(c, &v, 400, "BadRequest");
    }
    let (c, v) = ts.get_json(&format!("{item}?resourceVersion=zz")).await;
    assert_status(c, &v, 400, "BadRequest");
    let (c, v) = ts
        .put_json(&item, &{
            let mut p = pod("ns1", "exists");
            p["metadata"]["resourceVersion"] = json!("not-a-number");
            p
        })
        .await;
    assert_status(c, &v, 400, "BadRequest");
    let (c, v) = ts
        .delete_json(
            &item,
            Some(&json!({"preconditions": {"resourceVersion": "x"}})),
        )
        .await;
    assert_status(c, &v, 400, "BadRequest");

    // 404: unknown resources, groups, subresources, objects
    for p in [
        "/api/v1/namespaces/ns1/gadgets",
        "/api/v1/gadgets",
        "/apis/nope.io/v1/widgets",
        "/apis/example.com/v2/namespaces/ns1/widgets",
        "/api/v1/namespaces/ns1/pods/exists/status",
        "/api/v1/pods/exists",
        "/api/v1/namespaces/ns1/pods/missing",
        "/nothing",
    ] {
        let (c, v) = ts.get_json(p).await;
        assert_status(c, &v, 404, "NotFound");
    }
    let (c, v) = ts
        .post_json("/api/v1/namespaces/ns1/gadgets", &pod("ns1", "g"))
        .await;
    assert_status(c, &v, 404, "NotFound");

    // 405: unsupported methods
    for (m, p) in [
        (Method::PUT, PODS.to_string()),
        (Method::PATCH, PODS.to_string()),
        (Method::DELETE, PODS.to_string()),
        (Method::POST, item.clone()),
        (Method::POST, "/api/v1/pods".to_string()),
        (Method::POST, "/api/v1".to_string()),
        (Method::DELETE, "/version".to_string()),
        (Method::OPTIONS, item.clone()),
    ] {
        let (c, v) = ts.send(m.clone(), &p, json_ct, Some(b"{}".to_vec())).await;
        assert_status(c, &v, 405, "MethodNotAllowed");
    }

    assert_eq!(ts.etcd_dump().await, before, "no bad request touched etcd");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_continue_token_is_410() {
    // A private etcd: this test compacts it, which would expire the other
    // tests' older revisions (their continue tokens, their watches) too.
    let etcd = common::PrivateEtcd::start().await.expect("private etcd");
    let ts = TestServer::start_on(
        &etcd.endpoint(),
        &common::unique_prefix("expiredcont"),
        |c| {
            for r in &mut c.resources {
                r.history_capacity = Some(5);
            }
        },
        true,
    )
    .await;
    for i in 0..6 {
        let (c, _) = ts.post_json(PODS, &pod("ns1", &format!("p{i}"))).await;
        assert_eq!(c, 201);
    }
    let (c, page) = ts.get_json(&format!("{PODS}?limit=2")).await;
    assert_eq!(c, 200);
    let token = page["metadata"]["continue"]
        .as_str()
        .expect("continue")
        .to_string();
    // Push the page's RV out of the cache's history, then compact etcd past it.
    for i in 0..20 {
        let (c, _) = ts
            .patch_json(
                &format!("{PODS}/p0"),
                "application/merge-patch+json",
                &json!({"metadata": {"labels": {"n": i.to_string()}}}),
            )
            .await;
        assert_eq!(c, 200);
    }
    let rev = ts.etcd_revision().await;
    let mut etcd = ts.etcd.clone();
    etcd.compact(
        rev,
        Some(etcd_client::CompactionOptions::new().with_physical()),
    )
    .await
    .unwrap();
    let before = ts.etcd_dump().await;
    let (c, v) = ts
        .get_json(&format!("{PODS}?limit=2&continue={}", urlencode(&token)))
        .await;
    assert_status(c, &v, 410, "Expired");
    assert_eq!(ts.etcd_dump().await, before);
}

fn urlencode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_large_resource_version_is_504() {
    let ts = TestServer::start("toolarge", |c| c.server.consistent_read_timeout_ms = 300).await;
    let (c, created) = ts.post_json(PODS, &pod("ns1", "a")).await;
    assert_eq!(c, 201);
    let future = rv_of(&created) + 1_000_000;
    for path in [
        format!("{PODS}/a?resourceVersion={future}"),
        format!("{PODS}?resourceVersion={future}"),
    ] {
        let r = ts.http.get(ts.url(&path)).send().await.unwrap();
        assert_eq!(r.status(), 504, "{path}");
        assert!(
            r.headers().get("retry-after").is_some(),
            "Retry-After on {path}"
        );
        let v: Value = r.json().await.unwrap();
        assert_status(504, &v, 504, "Timeout");
        // kube-apiserver's NewTooLargeResourceVersionError, which client-go's
        // IsTooLargeResourceVersion recognises by its cause.
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .starts_with("Timeout: Too large resource version: "),
            "{v}"
        );
        assert_eq!(
            v["details"]["causes"],
            json!([{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}])
        );
        assert_eq!(v["details"]["retryAfterSeconds"], 1);
        assert!(v["details"].get("group").is_none(), "core: no group");
    }
}

/// A watch from an RV ahead of the cache (a client that listed on a
/// replica further along) opens at once, as in kube-apiserver, and sends
/// exactly the events after that RV as they come: no 504, no replay of
/// what the client already has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_ahead_of_the_cache_opens_and_starts_after_its_rv() {
    let ts = TestServer::start("watchahead", |_| {}).await;
    let (c, created) = ts.post_json(PODS, &pod("ns1", "seed")).await;
    assert_eq!(c, 201);
    let ahead = rv_of(&created) + 2;
    let mut w = WatchStream::open(&ts, &format!("{PODS}?watch=1&resourceVersion={ahead}")).await;
    let mut written = Vec::new();
    for i in 0..3 {
        let (c, v) = ts.post_json(PODS, &pod("ns1", &format!("w{i}"))).await;
        assert_eq!(c, 201, "{v}");
        written.push((format!("w{i}"), rv_of(&v)));
    }
    // Revisions are etcd's, shared with other tests: whichever writes came
    // after `ahead` are the ones sent (the last one always is).
    let want: Vec<&(String, i64)> = written.iter().filter(|(_, rv)| *rv > ahead).collect();
    assert!(!want.is_empty());
    for (name, rv) in want {
        let ev = w
            .next_event(Duration::from_secs(20))
            .await
            .unwrap_or_else(|| panic!("an event for {name}"));
        assert_eq!(ev["type"], "ADDED");
        assert_eq!(ev["object"]["metadata"]["name"], name.as_str());
        assert_eq!(rv_of(&ev["object"]), *rv);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_watches_is_429_and_disconnect_frees_the_slot() {
    let ts = TestServer::start("maxwatch", |c| c.server.max_watches = 2).await;
    let w1 = WatchStream::open(&ts, "/api/v1/pods?watch=1").await;
    let w2 = WatchStream::open(&ts, "/api/v1/pods?watch=true").await;
    let r = ts
        .http
        .get(ts.url("/api/v1/pods?watch=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(
        r.headers().get("retry-after").and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let v: Value = r.json().await.unwrap();
    assert_status(429, &v, 429, "TooManyRequests");
    // Lists are not limited.
    let (c, _) = ts.get_json("/api/v1/pods").await;
    assert_eq!(c, 200);
    // A client that goes away frees its slot at once.
    drop(w1);
    let ok = common::eventually(Duration::from_secs(20), || async {
        match ts.http.get(ts.url("/api/v1/pods?watch=1")).send().await {
            Ok(r) => r.status() == 200,
            Err(_) => false,
        }
    })
    .await;
    assert!(ok, "slot freed after disconnect");
    drop(w2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_down_not_ready_and_unavailable() {
    let mut etcd = common::PrivateEtcd::start().await.expect("private etcd");
    let endpoint = etcd.endpoint();
    // Connect while etcd is up, then take it away before the cachers list.
    let storage_probe = etcd_client::Client::connect([endpoint.as_str()], None)
        .await
        .unwrap();
    drop(storage_probe);
    let prefix = common::unique_prefix("down");
    let mut cfg = api_support::test_config(&endpoint, &prefix);
    cfg.server.consistent_read_timeout_ms = 300;
    let storage = watchcache::storage::Storage::connect(&cfg.etcd)
        .await
        .expect("connect");
    etcd.kill();
    let server = watchcache::api::Server::new(cfg, storage).expect("server");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let h = tokio::spawn(server.serve(listener, async move {
        let _ = rx.await;
    }));
    let http = reqwest::Client::new();
    let url = |p: &str| format!("http://{addr}{p}");
    // not ready
    let r = http.get(url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    let r = http.get(url("/readyz?verbose")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.text().await.unwrap().contains("[-]cacher-pods"));
    let r = http.get(url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200, "liveness does not depend on etcd");
    // list and watch: 429 with Retry-After while not ready
    for p in [PODS.to_string(), format!("{PODS}?watch=1")] {
        let r = http.get(url(&p)).send().await.unwrap();
        assert_eq!(r.status(), 429, "{p}");
        assert!(r.headers().get("retry-after").is_some());
        let v: Value = r.json().await.unwrap();
        assert_status(429, &v, 429, "TooManyRequests");
    }
    // writes: etcd unavailable -> 503 ServiceUnavailable or 504 Timeout
    let r = http
        .post(url(PODS))
        .header("Content-Type", "application/json")
        .body(pod("ns1", "a").to_string())
        .send()
        .await
        .unwrap();
    let code = r.status().as_u16();
    let v: Value = r.json().await.unwrap();
    match code {
        503 => assert_status(code, &v, 503, "ServiceUnavailable"),
        504 => assert_status(code, &v, 504, "Timeout"),
        other => panic!("want 503/504, got {other}: {v}"),
    }
    // and a Get falls back to etcd, which is down: 503/504 as well
    let r = http.get(url(&format!("{PODS}/a"))).send().await.unwrap();
    assert!(matches!(r.status().as_u16(), 503 | 504), "{}", r.status());
    let _ = tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_header_clients_are_dropped() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ts = TestServer::start("slowhdr", |c| c.server.header_read_timeout_ms = 300).await;
    let mut s = tokio::net::TcpStream::connect(ts.addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    // The server closes the connection (possibly after a 408) instead of waiting forever.
    let n = tokio::time::timeout(Duration::from_secs(5), async {
        let mut total = Vec::new();
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total.extend_from_slice(&buf[..n]),
            }
        }
        total
    })
    .await
    .expect("server closed the slow connection");
    let text = String::from_utf8_lossy(&n);
    assert!(!text.contains("200 OK"), "{text}");
}

// ---------------------------------------------------------------------------
// concurrency, pagination, watch

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_read_modify_write_increments() {
    let ts = std::sync::Arc::new(TestServer::start("rmw", |_| {}).await);
    let mut obj = pod("ns1", "counter");
    obj["spec"]["count"] = json!(0);
    let (c, _) = ts.post_json(PODS, &obj).await;
    assert_eq!(c, 201);
    let path = format!("{PODS}/counter");
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let ts = ts.clone();
        let path = path.clone();
        tasks.push(tokio::spawn(async move {
            let mut conflicts = 0;
            for _ in 0..25 {
                loop {
                    let (c, mut cur) = ts.get_json(&path).await;
                    assert_eq!(c, 200);
                    let n = cur["spec"]["count"].as_i64().unwrap();
                    cur["spec"]["count"] = json!(n + 1);
                    let (c, v) = ts.put_json(&path, &cur).await;
                    match c {
                        200 => break,
                        409 => {
                            assert_eq!(v["reason"], "Conflict");
                            conflicts += 1;
                        }
                        other => panic!("unexpected {other}: {v}"),
                    }
                }
            }
            conflicts
        }));
    }
    let mut conflicts = 0;
    for t in tasks {
        conflicts += t.await.unwrap();
    }
    let (_, v) = ts.get_json(&path).await;
    assert_eq!(
        v["spec"]["count"], 200,
        "8 x 25 increments (after {conflicts} conflicts)"
    );
    let stored = ts.etcd_get(&ts.pod_key("ns1", "counter")).await.unwrap();
    assert_eq!(stored["spec"]["count"], 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pagination_is_consistent_across_writes() {
    let ts = TestServer::start("paging", |_| {}).await;
    for i in 0..25 {
        let (c, _) = ts.post_json(PODS, &pod("ns1", &format!("p{i:02}"))).await;
        assert_eq!(c, 201);
    }
    let (c, first) = ts.get_json(&format!("{PODS}?limit=10")).await;
    assert_eq!(c, 200);
    let list_rv = rv_of(&first);
    assert_eq!(first["metadata"]["remainingItemCount"], 15);
    let mut names: Vec<String> = first["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    let mut token = first["metadata"]["continue"].as_str().unwrap().to_string();
    let mut pages = 1;
    loop {
        // a write between pages: a new object and a change to a later one
        let (c, _) = ts
            .post_json(PODS, &pod("ns1", &format!("zz-new{pages}")))
            .await;
        assert_eq!(c, 201);
        let (c, _) = ts.delete_json(&format!("{PODS}/p24"), None).await;
        assert!(c == 200 || c == 404);
        let (c, page) = ts
            .get_json(&format!("{PODS}?limit=10&continue={}", urlencode(&token)))
            .await;
        assert_eq!(c, 200, "{page}");
        assert_eq!(rv_of(&page), list_rv, "every page has the first page's RV");
        for i in page["items"].as_array().unwrap() {
            assert!(rv_of(i) <= list_rv);
            names.push(i["metadata"]["name"].as_str().unwrap().to_string());
        }
        pages += 1;
        match page["metadata"]["continue"].as_str() {
            Some(t) if !t.is_empty() => token = t.to_string(),
            _ => break,
        }
    }
    assert_eq!(pages, 3);
    let want: Vec<String> = (0..25).map(|i| format!("p{i:02}")).collect();
    assert_eq!(
        names, want,
        "exactly the 25 objects present at the first page's RV"
    );
    // a fresh list sees the writes
    let (_, now) = ts.get_json(PODS).await;
    let n = now["items"].as_array().unwrap().len();
    assert_eq!(n, 25 - 1 + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_events() {
    let ts = TestServer::start("watch", |_| {}).await;
    let (c, pre) = ts.post_json(PODS, &pod("ns1", "pre")).await;
    assert_eq!(c, 201);
    // RV unset: current state as ADDED, then changes
    let mut w = WatchStream::open(&ts, &format!("{PODS}?watch=1")).await;
    let ev = w
        .next_event(Duration::from_secs(10))
        .await
        .expect("initial");
    assert_eq!(ev["type"], "ADDED");
    assert_eq!(ev["object"]["metadata"]["name"], "pre");
    // from an RV: only later events
    let mut w_rv = WatchStream::open(
        &ts,
        &format!("{PODS}?watch=true&resourceVersion={}", rv_of(&pre)),
    )
    .await;
    // filtered watch: only node-9 pods
    let mut w_sel = WatchStream::open(
        &ts,
        "/api/v1/pods?watch=1&fieldSelector=spec.nodeName%3Dnode-9&labelSelector=app%3Dweb",
    )
    .await;
    let (c, created) = ts.post_json(PODS, &pod("ns1", "live")).await;
    assert_eq!(c, 201);
    let (c, _) = ts
        .patch_json(
            &format!("{PODS}/live"),
            "application/merge-patch+json",
            &json!({"spec": {"nodeName": "node-9"}}),
        )
        .await;
    assert_eq!(c, 200);
    let (c, _) = ts.delete_json(&format!("{PODS}/live"), None).await;
    assert_eq!(c, 200);
    for w in [&mut w, &mut w_rv] {
        let ev = w.next_event(Duration::from_secs(10)).await.expect("added");
        assert_eq!(ev["type"], "ADDED");
        assert_eq!(ev["object"]["metadata"]["name"], "live");
        assert_eq!(rv_of(&ev["object"]), rv_of(&created));
        let ev = w
            .next_event(Duration::from_secs(10))
            .await
            .expect("modified");
        assert_eq!(ev["type"], "MODIFIED");
        assert_eq!(ev["object"]["spec"]["nodeName"], "node-9");
        let ev = w
            .next_event(Duration::from_secs(10))
            .await
            .expect("deleted");
        assert_eq!(ev["type"], "DELETED");
    }
    // the filtered watch sees the pod enter (ADDED) and leave (DELETED)
    let ev = w_sel
        .next_event(Duration::from_secs(10))
        .await
        .expect("sel added");
    assert_eq!(ev["type"], "ADDED");
    assert_eq!(ev["object"]["spec"]["nodeName"], "node-9");
    let ev = w_sel
        .next_event(Duration::from_secs(10))
        .await
        .expect("sel deleted");
    assert_eq!(ev["type"], "DELETED");

    // timeoutSeconds ends the stream
    let start = std::time::Instant::now();
    let mut wt = WatchStream::open(
        &ts,
        &format!("{PODS}?watch=1&timeoutSeconds=1&resourceVersion=0"),
    )
    .await;
    while wt.next(Duration::from_secs(10)).await.is_some() {}
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "ended by timeoutSeconds"
    );

    // bookmarks with sendInitialEvents
    let mut wb = WatchStream::open(
        &ts,
        &format!("{PODS}?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&resourceVersion="),
    )
    .await;
    let ev = wb.next(Duration::from_secs(10)).await.expect("initial");
    assert_eq!(ev["type"], "ADDED");
    let ev = wb.next(Duration::from_secs(10)).await.expect("bookmark");
    assert_eq!(ev["type"], "BOOKMARK");
    assert_eq!(
        ev["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
}

/// A watch with sendInitialEvents=true and no resourceVersion ends its
/// initial events with a bookmark that tells the client it has a consistent
/// list: when the cache is behind etcd and does not catch up in time (here:
/// no wait allowed at all), the answer is 504, never initial events of a
/// stale state with an end bookmark below etcd's revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_events_never_end_below_etcds_revision() {
    let ts = TestServer::start("initialstale", |c| c.server.consistent_read_timeout_ms = 0).await;
    let (c, _) = ts.post_json(PODS, &pod("ns1", "a")).await;
    assert_eq!(c, 201);
    let path = format!(
        "{PODS}?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan"
    );
    for _ in 0..5 {
        // etcd moves on outside this resource: the idle cache is behind.
        let mut etcd = ts.etcd.clone();
        let put = etcd
            .put(format!("{}/elsewhere", ts.prefix), "x", None)
            .await
            .expect("put");
        let etcd_rev = put.header().map(|h| h.revision()).expect("header");
        let r = ts
            .http
            .get(ts.url(&path))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .expect("watch");
        if r.status() == 504 {
            let v: Value = r.json().await.expect("Status");
            assert_status(504, &v, 504, "Timeout");
            continue;
        }
        // Caught up in time after all (a progress notification landed):
        // then the end bookmark is at etcd's revision or later.
        assert_eq!(r.status(), 200);
        let mut w = WatchStream {
            resp: Some(r),
            buf: Vec::new(),
        };
        loop {
            let ev = w.next(Duration::from_secs(10)).await.expect("an event");
            if ev["type"] == "BOOKMARK" {
                assert!(rv_of(&ev["object"]) >= etcd_rev, "{ev}");
                break;
            }
        }
    }
}

/// A watch holds no timer of its own: the streams' sweeper wakes it for its
/// periodic bookmarks and at its `timeoutSeconds`, where the watcher ends
/// itself with a last bookmark (the sweeper's backstop, 2 s later, ends a
/// stream without one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_watches_are_woken_for_bookmarks_and_their_timeout() {
    let ts = TestServer::start("idlewake", |c| c.server.bookmark_interval_ms = 300).await;
    let mut w = WatchStream::open(
        &ts,
        &format!("{PODS}?watch=1&allowWatchBookmarks=true&resourceVersion=0"),
    )
    .await;
    for _ in 0..2 {
        let ev = w
            .next(Duration::from_secs(10))
            .await
            .expect("a periodic bookmark");
        assert_eq!(ev["type"], "BOOKMARK", "{ev}");
    }
    assert!(w.resp.is_some(), "no timeoutSeconds: still open");

    // The default bookmark interval (60 s): the only bookmark is the last.
    let ts = TestServer::start("idletimeout", |_| {}).await;
    let mut t = WatchStream::open(
        &ts,
        &format!("{PODS}?watch=1&allowWatchBookmarks=true&resourceVersion=0&timeoutSeconds=1"),
    )
    .await;
    let mut events = Vec::new();
    while let Some(ev) = t.next(Duration::from_secs(10)).await {
        events.push(ev);
    }
    assert!(t.resp.is_none(), "ended by its timeoutSeconds");
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(types, ["BOOKMARK"], "one last bookmark: {events:?}");
}

/// The value of one sample of `/metrics`, e.g.
/// `watchcache_http_requests_total{code="200",verb="watch"}` (0 when absent).
/// The bytes after a List's head (`..."items":[`): what a kept body holds.
fn list_items_bytes(body: &[u8]) -> &[u8] {
    let at = body
        .windows(9)
        .position(|w| w == b"\"items\":[")
        .expect("a List body");
    &body[at..]
}

async fn list_raw(ts: &TestServer, path: &str) -> bytes::Bytes {
    let r = ts.http.get(ts.url(path)).send().await.expect("list");
    assert_eq!(r.status(), 200);
    r.bytes().await.expect("list body")
}

fn item_names(body: &[u8]) -> Vec<String> {
    let v: Value = serde_json::from_slice(body).expect("a whole JSON List");
    v["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap_or("").to_string())
        .collect()
}

/// Repeated full Lists of the same objects are written from the body the
/// second one kept (`ListBodyCache`): byte for byte what was built, whole,
/// for a namespace and for all namespaces; and after a write or a delete
/// the next List shows it, never a kept body of the objects before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_lists_are_written_from_the_kept_body_and_see_every_write() {
    let ts = TestServer::start("listbody", |_| {}).await;
    // Bodies of several frames (256 KiB each): 160 pods of about 2 KiB.
    let mut want: Vec<String> = Vec::new();
    for i in 0..160 {
        let name = format!("p{i:03}");
        let mut p = pod("ns1", &name);
        p["metadata"]["annotations"] = json!({"blob": "x".repeat(2000)});
        let (c, _) = ts.post_json(PODS, &p).await;
        assert_eq!(c, 201);
        want.push(name);
    }
    let hits = r#"watchcache_list_body_cache_total{resource="pods",result="hit"} "#;
    let before = ts.metric(hits).await;
    for path in [PODS, "/api/v1/pods"] {
        // Consistent: at the last write. Then built, recorded, kept.
        let fresh = list_raw(&ts, path).await;
        assert_eq!(item_names(&fresh), want);
        for _ in 0..3 {
            let again = list_raw(&ts, path).await;
            assert_eq!(list_items_bytes(&again), list_items_bytes(&fresh));
            assert_eq!(item_names(&again), want);
        }
        let rv0 = list_raw(&ts, &format!("{path}?resourceVersion=0")).await;
        assert_eq!(list_items_bytes(&rv0), list_items_bytes(&fresh));
    }
    assert!(
        ts.metric(hits).await > before,
        "repeated Lists were written from a kept body"
    );
    // A write, then a delete: every later List shows it.
    let mut p = pod("ns1", "p500");
    p["metadata"]["annotations"] = json!({"blob": "y"});
    let (c, _) = ts.post_json(PODS, &p).await;
    assert_eq!(c, 201);
    want.push("p500".into());
    for _ in 0..3 {
        assert_eq!(item_names(&list_raw(&ts, PODS).await), want);
        assert_eq!(item_names(&list_raw(&ts, "/api/v1/pods").await), want);
    }
    let (c, _) = ts.delete_json(&format!("{PODS}/p000"), None).await;
    assert_eq!(c, 200);
    want.remove(0);
    for _ in 0..3 {
        assert_eq!(item_names(&list_raw(&ts, PODS).await), want);
    }
}

/// Every spelling of a true `?watch=` is served as a watch and counted as
/// one: the verb comes from the one RequestInfo both use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_param_spellings_are_served_and_counted_as_watches() {
    const WATCHES: &str = r#"watchcache_http_requests_total{code="200",verb="watch"} "#;
    let ts = TestServer::start("watchspell", |_| {}).await;
    // As kube-apiserver reads ListOptions: anything sent but 0 and false
    // is true, even nothing.
    for (i, spelling) in ["True", "1", "true", "", "yes"].into_iter().enumerate() {
        let before = ts.metric(WATCHES).await;
        let mut w = WatchStream::open(&ts, &format!("{PODS}?watch={spelling}")).await;
        // Counted when the response head is out (the metrics registry is
        // process-wide, so other tests can only add to it).
        let after = ts.metric(WATCHES).await;
        assert!(
            after >= before + 1.0,
            "watch={spelling}: watch count {before} -> {after}"
        );
        // Served as a watch: a later create arrives as an event (after the
        // ADDED events of the pods created before, as the watch has no RV).
        let name = format!("spell-{i}");
        let (c, _) = ts.post_json(PODS, &pod("ns1", &name)).await;
        assert_eq!(c, 201);
        loop {
            let ev = w
                .next_event(Duration::from_secs(10))
                .await
                .unwrap_or_else(|| panic!("watch={spelling}: an event for {name}"));
            assert_eq!(ev["type"], "ADDED", "watch={spelling}");
            if ev["object"]["metadata"]["name"] == name.as_str() {
                break;
            }
        }
    }
    // The false spellings are lists.
    for spelling in ["False", "0", "false", "FALSE"] {
        let (c, v) = ts.get_json(&format!("{PODS}?watch={spelling}")).await;
        assert_eq!(c, 200, "watch={spelling}");
        assert_eq!(v["kind"], "PodList", "watch={spelling}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_from_too_old_rv_gets_410_error_event() {
    let ts = TestServer::start("watch410", |c| {
        for r in &mut c.resources {
            r.history_capacity = Some(5);
        }
    })
    .await;
    let (c, first) = ts.post_json(PODS, &pod("ns1", "a")).await;
    assert_eq!(c, 201);
    let old = rv_of(&first);
    for i in 0..20 {
        let (c, _) = ts
            .patch_json(
                &format!("{PODS}/a"),
                "application/merge-patch+json",
                &json!({"metadata": {"labels": {"n": i.to_string()}}}),
            )
            .await;
        assert_eq!(c, 200);
    }
    // wait until the cache has seen them all
    let (_, cur) = ts.get_json(&format!("{PODS}/a")).await;
    assert!(rv_of(&cur) > old + 10);
    let mut w = WatchStream::open(&ts, &format!("{PODS}?watch=1&resourceVersion={old}")).await;
    let ev = w.next(Duration::from_secs(10)).await.expect("an event");
    assert_eq!(ev["type"], "ERROR", "{ev}");
    assert_eq!(ev["object"]["kind"], "Status");
    assert_eq!(ev["object"]["code"], 410);
    assert_eq!(ev["object"]["reason"], "Expired");
    assert!(
        ev["object"]["message"]
            .as_str()
            .unwrap()
            .contains("too old resource version"),
        "{ev}"
    );
    assert!(
        w.next(Duration::from_secs(5)).await.is_none(),
        "stream ends after ERROR"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_your_writes() {
    let ts = TestServer::start("ryw", |_| {}).await;
    for i in 0..20 {
        let name = format!("r{i}");
        let (c, created) = ts.post_json(PODS, &pod("ns1", &name)).await;
        assert_eq!(c, 201);
        let (c, got) = ts.get_json(&format!("{PODS}/{name}")).await;
        assert_eq!(c, 200, "get right after create: {got}");
        assert_eq!(rv_of(&got), rv_of(&created));
        let (_, list) = ts.get_json(PODS).await;
        assert!(rv_of(&list) >= rv_of(&created));
        assert_eq!(list["items"].as_array().unwrap().len(), i + 1);
        let (c, patched) = ts
            .patch_json(
                &format!("{PODS}/{name}"),
                "application/merge-patch+json",
                &json!({"spec": {"nodeName": "n2"}}),
            )
            .await;
        assert_eq!(c, 200);
        let (_, got) = ts.get_json(&format!("{PODS}/{name}")).await;
        assert_eq!(rv_of(&got), rv_of(&patched));
        assert_eq!(got["spec"]["nodeName"], "n2");
    }
    let (c, _) = ts.delete_json(&format!("{PODS}/r0"), None).await;
    assert_eq!(c, 200);
    let (c, v) = ts.get_json(&format!("{PODS}/r0")).await;
    assert_status(c, &v, 404, "NotFound");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_output_for_kubectl() {
    let ts = TestServer::start("table", |_| {}).await;
    let (c, _) = ts.post_json(PODS, &pod("ns1", "t1")).await;
    assert_eq!(c, 201);
    let accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
    let r = ts
        .http
        .get(ts.url(PODS))
        .header("Accept", accept)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let t: Value = r.json().await.unwrap();
    assert_eq!(t["kind"], "Table");
    assert_eq!(t["apiVersion"], "meta.k8s.io/v1");
    let cols: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    // kube-apiserver's Pod printer, with the -o wide columns.
    assert_eq!(
        cols,
        [
            "Name",
            "Ready",
            "Status",
            "Restarts",
            "Age",
            "IP",
            "Node",
            "Nominated Node",
            "Readiness Gates"
        ]
    );
    assert_eq!(t["rows"][0]["cells"][0], "t1");
    assert_eq!(t["rows"][0]["cells"][6], "node-1");
    assert_eq!(t["rows"][0]["object"]["metadata"]["namespace"], "ns1");
    let r = ts
        .http
        .get(ts.url(&format!("{PODS}/t1")))
        .header("Accept", accept)
        .send()
        .await
        .unwrap();
    let t: Value = r.json().await.unwrap();
    assert_eq!(t["kind"], "Table");
    assert_eq!(t["rows"].as_array().unwrap().len(), 1);
    // A kind without a printer: Name and Age.
    let widgets = "/apis/example.com/v1/namespaces/ns1/widgets";
    let widget = json!({"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w1", "namespace": "ns1"}});
    let (c, _) = ts.post_json(widgets, &widget).await;
    assert_eq!(c, 201);
    let r = ts
        .http
        .get(ts.url(widgets))
        .header("Accept", accept)
        .send()
        .await
        .unwrap();
    let t: Value = r.json().await.unwrap();
    let cols: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(cols, ["Name", "Age"]);
    assert_eq!(t["rows"][0]["cells"][0], "w1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_watches_quickly() {
    let mut ts = TestServer::start("shutdown", |_| {}).await;
    let mut w = WatchStream::open(&ts, &format!("{PODS}?watch=1")).await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let r = h2
        .get(ts.url(&format!("{PODS}?watch=1")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut h2_stream = r.bytes_stream();
    let took = ts.shutdown().await;
    assert!(took < Duration::from_secs(5), "serve returned in {took:?}");
    assert!(
        w.next(Duration::from_secs(5)).await.is_none(),
        "HTTP/1.1 watch ended"
    );
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(_)) = h2_stream.next().await {}
    })
    .await;
    assert!(end.is_ok(), "HTTP/2 watch ended");
    assert!(
        reqwest::get(ts.url("/healthz")).await.is_err(),
        "no longer accepting"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_from_rv_replays_history_for_namespaced_and_filtered_watches() {
    // Events already in the history when the watch starts are replayed, for
    // every kind of watch (all namespaces, one namespace, field selector).
    let ts = TestServer::start("replay", |_| {}).await;
    let (c, a) = ts.post_json(PODS, &pod("ns1", "a")).await;
    assert_eq!(c, 201);
    let (c, b) = ts.post_json(PODS, &pod("ns1", "b")).await;
    assert_eq!(c, 201);
    // make sure the cache has seen b
    let (_, got) = ts.get_json(&format!("{PODS}/b")).await;
    assert_eq!(rv_of(&got), rv_of(&b));
    for path in [
        format!("/api/v1/pods?watch=1&resourceVersion={}", rv_of(&a)),
        format!("{PODS}?watch=1&resourceVersion={}", rv_of(&a)),
        format!(
            "/api/v1/pods?watch=1&resourceVersion={}&fieldSelector=metadata.namespace%3Dns1",
            rv_of(&a)
        ),
        format!(
            "/api/v1/pods?watch=1&resourceVersion={}&fieldSelector=spec.nodeName%3Dnode-1",
            rv_of(&a)
        ),
    ] {
        let mut w = WatchStream::open(&ts, &path).await;
        let ev = w.next_event(Duration::from_secs(5)).await;
        let ev = ev.unwrap_or_else(|| panic!("no replayed event for {path}"));
        assert_eq!(ev["type"], "ADDED", "{path}");
        assert_eq!(ev["object"]["metadata"]["name"], "b", "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_serves_and_sigterm_ends_watches_within_5s() {
    let prefix = common::unique_prefix("daemon");
    let mut d = common::Daemon::start_default(common::etcd(), &prefix).await;
    let http = reqwest::Client::new();
    let ok = common::eventually(Duration::from_secs(20), || {
        let (http, url) = (http.clone(), d.url("/readyz"));
        async move { matches!(http.get(&url).send().await, Ok(r) if r.status() == 200) }
    })
    .await;
    assert!(ok, "daemon ready");
    let r = http
        .post(d.url(PODS))
        .header("Content-Type", "application/json")
        .body(pod("ns1", "d1").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let mut watch = http
        .get(d.url(&format!("{PODS}?watch=1")))
        .send()
        .await
        .unwrap();
    assert_eq!(watch.status(), 200);
    let first = tokio::time::timeout(Duration::from_secs(10), watch.chunk())
        .await
        .expect("initial event")
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&first).contains("\"d1\""));
    let start = std::time::Instant::now();
    d.sigterm();
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(_)) = watch.chunk().await {}
    })
    .await;
    assert!(ended.is_ok(), "the open watch ended after SIGTERM");
    let status = d.wait_exit(Duration::from_secs(5)).await;
    assert!(status.is_some(), "daemon exited within 5 s of SIGTERM");
    assert!(start.elapsed() < Duration::from_secs(5));
}

// ---------------------------------------------------------------------------
// Response compression (kube-apiserver's APIResponseCompression)

/// (status, Content-Encoding, Vary, body as sent) of a GET.
async fn get_raw(
    client: &reqwest::Client,
    url: &str,
    headers: &[(&str, &str)],
) -> (u16, Option<String>, Option<String>, Vec<u8>) {
    let mut req = client.get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.expect("request");
    let header = |name: &str| {
        r.headers()
            .get(name)
            .map(|v| v.to_str().expect("ASCII header").to_string())
    };
    let (code, encoding, vary) = (
        r.status().as_u16(),
        header("content-encoding"),
        header("vary"),
    );
    (
        code,
        encoding,
        vary,
        r.bytes().await.expect("body").to_vec(),
    )
}

/// The same List, but for its resourceVersion: the other tests of this
/// binary write to the same etcd at once, and a consistent List is served at
/// etcd's current revision, which their writes move on between two Lists.
fn assert_same_list(got: &Value, want: &Value) {
    let rv = |l: &Value| {
        l["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|rv| rv.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no resourceVersion in {}", l["metadata"]))
    };
    assert!(
        want["items"].as_array().is_some_and(|i| !i.is_empty()),
        "no items in {want}"
    );
    assert!(rv(got) >= rv(want), "{} before {}", rv(got), rv(want));
    assert_eq!(got["kind"], want["kind"]);
    assert_eq!(got["apiVersion"], want["apiVersion"]);
    assert_eq!(got["items"], want["items"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_responses_are_gzipped_for_clients_that_ask() {
    let ts = TestServer::start("gzip", |_| {}).await;
    // About 2.5 MB: a List of many frames, each compressed in its own round.
    create_large_pods(&ts, "ns1", 120, 20_000).await;
    let url = ts.url(PODS);
    let gzip = [("Accept-Encoding", "gzip")];

    let (code, encoding, _, plain) = get_raw(&ts.http, &url, &[]).await;
    assert_eq!((code, encoding), (200, None));
    assert!(plain.len() > 2_000_000, "{} bytes", plain.len());
    let plain: Value = serde_json::from_slice(&plain).unwrap();
    assert_eq!(plain["items"].as_array().unwrap().len(), 120);

    // Lists of one snapshot: built (above), recorded into the List body
    // cache, then written from it, the last ones from its kept gzip. Each
    // path gives the same bytes; over HTTP/2 as well.
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    for client in [&ts.http, &ts.http, &ts.http, &h2] {
        let (code, encoding, vary, body) = get_raw(client, &url, &gzip).await;
        assert_eq!(code, 200);
        assert_eq!(encoding.as_deref(), Some("gzip"));
        assert_eq!(vary.as_deref(), Some("Accept-Encoding"));
        assert!(
            body.len() * 2 < plain.to_string().len(),
            "{} bytes",
            body.len()
        );
        let got: Value = serde_json::from_slice(&gunzip(&body)).unwrap();
        assert_same_list(&got, &plain);
    }

    // Protobuf too: the same List as the uncompressed protobuf one.
    let proto = [("Accept", "application/vnd.kubernetes.protobuf")];
    let (_, encoding, _, plain_pb) = get_raw(&ts.http, &url, &proto).await;
    assert_eq!(encoding, None);
    // Built, recorded, then written from the kept frames and their kept
    // gzip.
    for _ in 0..3 {
        let (code, encoding, _, body) = get_raw(
            &ts.http,
            &url,
            &[proto[0], ("Accept-Encoding", "deflate, gzip;q=0.8")],
        )
        .await;
        assert_eq!((code, encoding.as_deref()), (200, Some("gzip")));
        let got = protobuf::decode(&gunzip(&body)).unwrap();
        assert_same_list(&got, &protobuf::decode(&plain_pb).unwrap());
    }

    // Pages of a paged List (each over the threshold) and their continue
    // tokens: every pod once, in order.
    let mut names = Vec::new();
    let mut next = format!("{url}?limit=40");
    loop {
        let (code, encoding, _, body) = get_raw(&ts.http, &next, &gzip).await;
        assert_eq!((code, encoding.as_deref()), (200, Some("gzip")));
        let page: Value = serde_json::from_slice(&gunzip(&body)).unwrap();
        for item in page["items"].as_array().unwrap() {
            names.push(item["metadata"]["name"].as_str().unwrap().to_string());
        }
        match page["metadata"]["continue"].as_str() {
            Some(c) if !c.is_empty() => next = format!("{url}?limit=40&continue={}", urlencode(c)),
            _ => break,
        }
    }
    let want: Vec<String> = (0..120).map(|i| format!("big-{i:03}")).collect();
    assert_eq!(names, want);

    // A Table (kubectl's `get`), a whole body rather than a stream.
    let table = [
        ("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io"),
        ("Accept-Encoding", "gzip"),
    ];
    let (code, encoding, _, body) =
        get_raw(&ts.http, &format!("{url}?includeObject=Object"), &table).await;
    assert_eq!((code, encoding.as_deref()), (200, Some("gzip")));
    let t: Value = serde_json::from_slice(&gunzip(&body)).unwrap();
    assert_eq!(t["kind"], "Table");
    assert_eq!(t["rows"].as_array().unwrap().len(), 120);

    // Not compressed: a small body, a client that refuses gzip, a watch
    // (its initial events are over the threshold too).
    let one = ts.url(&format!("{PODS}/big-000"));
    let (code, encoding, vary, body) = get_raw(&ts.http, &one, &gzip).await;
    assert_eq!((code, encoding, vary), (200, None, None));
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["metadata"]["name"],
        "big-000"
    );
    let (_, encoding, _, _) = get_raw(&ts.http, &url, &[("Accept-Encoding", "gzip;q=0, br")]).await;
    assert_eq!(encoding, None);
    let r = ts
        .http
        .get(format!("{url}?watch=1&resourceVersion=0"))
        .header("Accept-Encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("content-encoding").is_none());
    let mut stream = r.bytes_stream();
    let mut seen = Vec::new();
    while !seen.ends_with(b"\n") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("an event in time")
            .unwrap()
            .unwrap();
        seen.extend_from_slice(&chunk);
    }
    let first: Value = serde_json::from_slice(seen.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(first["type"], "ADDED");
    drop(stream);

    // The Lists written from kept frames used their kept gzip: the JSON
    // hits (two over HTTP/1.1, one over HTTP/2) and the protobuf one. No
    // other test here asks for gzip.
    let kept = ts
        .metric(r#"watchcache_api_gzip_responses_total{source="kept"} "#)
        .await;
    assert!(kept >= 4.0, "{kept} Lists from kept gzip");

    // Turned off (kube-apiserver's APIResponseCompression=false): a second
    // server on the same objects sends them as they are.
    let off = TestServer::start_on(
        &ts.endpoint,
        &ts.prefix,
        |c| c.server.response_compression = false,
        true,
    )
    .await;
    let (code, encoding, _, body) = get_raw(&off.http, &off.url(PODS), &gzip).await;
    assert_eq!((code, encoding), (200, None));
    let got: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(got["items"], plain["items"]);
}

/// A gzipped watch stream read as it comes: each chunk is decoded on
/// arrival (the server sync-flushes each one), so an event is seen without
/// waiting for more bytes or for the stream's end.
struct GzipWatch {
    resp: reqwest::Response,
    dec: flate2::write::GzDecoder<Vec<u8>>,
    lines: Vec<u8>,
}

impl GzipWatch {
    /// The next event decoded, or None at the stream's end or after 10 s.
    async fn next(&mut self) -> Option<Value> {
        use std::io::Write;
        loop {
            let out = self.dec.get_mut();
            if !out.is_empty() {
                self.lines.append(out);
            }
            if let Some(pos) = self.lines.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.lines.drain(..=pos).collect();
                return Some(serde_json::from_slice(&line).expect("a JSON event"));
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), self.resp.chunk())
                .await
                .ok()?
                .expect("the stream's bytes")?;
            self.dec.write_all(&chunk).expect("valid gzip");
            self.dec.flush().expect("valid gzip");
        }
    }
}

/// A WatchList (`sendInitialEvents=true`) to a client that accepts gzip
/// comes gzipped, as kube-apiserver 1.37 sends it: the same events as
/// without gzip, each readable as it arrives (the initial-events-end
/// bookmark before any later write), one valid gzip stream to its end. A
/// plain watch is not compressed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_list_streams_are_gzipped_for_clients_that_ask() {
    let ts = TestServer::start("gzip-watchlist", |_| {}).await;
    create_large_pods(&ts, "ns1", 40, 4_000).await;
    let (_, list) = ts.get_json(PODS).await;
    let rv = rv_of(&list);
    let url = ts.url(&format!(
        "{PODS}?watch=1&sendInitialEvents=true&allowWatchBookmarks=true\
         &resourceVersionMatch=NotOlderThan&resourceVersion={rv}"
    ));
    let is_end = |ev: &Value| {
        ev["type"] == "BOOKMARK"
            && ev["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true"
    };

    // Without gzip: the events up to the initial-events-end bookmark.
    let mut plain = WatchStream {
        resp: Some(ts.http.get(&url).send().await.unwrap()),
        buf: Vec::new(),
    };
    let mut want = Vec::new();
    loop {
        let ev = plain
            .next(Duration::from_secs(10))
            .await
            .expect("plain event");
        let end = is_end(&ev);
        want.push(ev);
        if end {
            break;
        }
    }
    assert_eq!(want.len(), 41);
    drop(plain);

    let r = ts
        .http
        .get(&url)
        .header("Accept-Encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-encoding"], "gzip");
    assert_eq!(r.headers()["vary"], "Accept-Encoding");
    let mut z = GzipWatch {
        resp: r,
        dec: flate2::write::GzDecoder::new(Vec::new()),
        lines: Vec::new(),
    };
    let mut got = Vec::new();
    loop {
        // Nothing is written meanwhile: the bookmark is readable at once.
        let ev = z.next().await.expect("initial events and their end");
        let end = is_end(&ev);
        got.push(ev);
        if end {
            break;
        }
    }
    // The same objects; the bookmarks' resourceVersions may differ, as
    // other tests' writes move etcd's revision on.
    let objects = |evs: &[Value]| -> Vec<Value> {
        evs.iter()
            .filter(|ev| ev["type"] != "BOOKMARK")
            .cloned()
            .collect()
    };
    assert_eq!(objects(&got), objects(&want));
    assert_eq!(objects(&got).len(), 40);

    // A later write arrives while the stream stays open.
    let (c, v) = ts.post_json(PODS, &pod("ns1", "later")).await;
    assert_eq!(c, 201, "{v}");
    let ev = loop {
        let ev = z.next().await.expect("the later event");
        if ev["type"] != "BOOKMARK" {
            break ev;
        }
    };
    assert_eq!(ev["type"], "ADDED");
    assert_eq!(ev["object"]["metadata"]["name"], "later");
    drop(z);

    // To its end (timeoutSeconds): one whole gzip stream, its trailer
    // (CRC and length) checked by the decoder.
    let (code, encoding, _, body) = get_raw(
        &ts.http,
        &format!("{url}&timeoutSeconds=1"),
        &[("Accept-Encoding", "gzip")],
    )
    .await;
    assert_eq!((code, encoding.as_deref()), (200, Some("gzip")));
    let text = String::from_utf8(gunzip(&body)).unwrap();
    let names: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|ev| ev["type"] == "ADDED")
        .map(|ev| ev["object"]["metadata"]["name"].clone())
        .collect();
    assert_eq!(names.len(), 41, "{names:?}");
    let counted = ts
        .metric(r#"watchcache_api_gzip_responses_total{source="watch"} "#)
        .await;
    assert_eq!(counted, 2.0, "gzipped WatchLists");

    // A plain watch, with or without sendInitialEvents=false: as it is.
    for plain in [
        "",
        "&sendInitialEvents=false&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan",
    ] {
        let r = ts
            .http
            .get(ts.url(&format!("{PODS}?watch=1&resourceVersion={rv}{plain}")))
            .header("Accept-Encoding", "gzip")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.headers().get("content-encoding").is_none(), "{plain}");
        let mut w = WatchStream {
            resp: Some(r),
            buf: Vec::new(),
        };
        let ev = w
            .next_event(Duration::from_secs(10))
            .await
            .expect("an event");
        assert_eq!(ev["object"]["metadata"]["name"], "later");
    }

    // Turned off with the rest of gzip (`server.response_compression`).
    let off = TestServer::start_on(
        &ts.endpoint,
        &ts.prefix,
        |c| c.server.response_compression = false,
        true,
    )
    .await;
    let r = off
        .http
        .get(off.url(&format!(
            "{PODS}?watch=1&sendInitialEvents=true&allowWatchBookmarks=true\
             &resourceVersionMatch=NotOlderThan&timeoutSeconds=1"
        )))
        .header("Accept-Encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("content-encoding").is_none());
}

/// `shardSelector` follows the `ShardedListAndWatch` gate as kube-apiserver
/// does: off (the default), the parameter is ignored, even a bad one; on,
/// a List selects the shard and echoes it, a sharded watch gets only its
/// shard's events, and a bad selector is kube-apiserver's 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_selector_follows_the_feature_gate() {
    let lower = "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')";
    let q = |s: &str| {
        s.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect::<String>()
    };
    let in_lower = |uid: &str| watchcache::object::sharding::hash_field(uid) < 1 << 63;
    for gate in [false, true] {
        let ts = TestServer::start(&format!("shards-{gate}"), |c| {
            c.server.sharded_list_and_watch = gate;
        })
        .await;
        let mut uids = Vec::new();
        for i in 0..12 {
            let (c, created) = ts.post_json(PODS, &pod("ns1", &format!("p{i}"))).await;
            assert_eq!(c, 201, "{created}");
            uids.push(
                created["metadata"]["uid"]
                    .as_str()
                    .expect("uid")
                    .to_string(),
            );
        }
        let (code, list) = ts
            .get_json(&format!("{PODS}?shardSelector={}", q(lower)))
            .await;
        assert_eq!(code, 200, "{list}");
        let got: std::collections::BTreeSet<&str> = list["items"]
            .as_array()
            .expect("items")
            .iter()
            .filter_map(|p| p["metadata"]["uid"].as_str())
            .collect();
        let want: std::collections::BTreeSet<&str> = uids
            .iter()
            .map(String::as_str)
            .filter(|u| !gate || in_lower(u))
            .collect();
        assert_eq!(got, want, "gate {gate}");
        assert_eq!(
            list["metadata"]["shardInfo"],
            if gate {
                json!({ "selector": lower })
            } else {
                Value::Null
            },
        );
        let (code, status) = ts.get_json(&format!("{PODS}?shardSelector=x")).await;
        if gate {
            assert_eq!(code, 500, "{status}");
            assert_eq!(
                status["message"],
                "invalid shard selector: unexpected expression kind 3; expected shardRange() call or || operator"
            );
            assert!(status.get("reason").is_none(), "{status}");
        } else {
            assert_eq!(code, 200, "ignored: {status}");
        }
        if gate {
            // A sharded watch: the next pod in the lower half arrives; the
            // ones before it, in the upper half, never do.
            let rv = list["metadata"]["resourceVersion"].as_str().expect("rv");
            let mut w = WatchStream::open(
                &ts,
                &format!(
                    "{PODS}?watch=1&resourceVersion={rv}&shardSelector={}",
                    q(lower)
                ),
            )
            .await;
            let mut skipped = 0;
            let mut i = 100;
            let uid = loop {
                let (c, created) = ts.post_json(PODS, &pod("ns1", &format!("p{i}"))).await;
                assert_eq!(c, 201, "{created}");
                let uid = created["metadata"]["uid"]
                    .as_str()
                    .expect("uid")
                    .to_string();
                if in_lower(&uid) {
                    break uid;
                }
                skipped += 1;
                i += 1;
            };
            let ev = w.next_event(Duration::from_secs(30)).await.expect("event");
            assert_eq!(ev["type"], "ADDED");
            assert_eq!(
                ev["object"]["metadata"]["uid"],
                uid.as_str(),
                "{skipped} skipped"
            );
        }
    }
}

//! kube-apiserver's protobuf storage encoding end to end: values written
//! straight into etcd the way kube-apiserver writes them (`k8s\0` +
//! `runtime.Unknown`) are served as kube-apiserver's JSON by get, list and
//! watch; a corrupt one is skipped and counted without stopping the reflector.
mod common;
use common::server as api_support;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use api_support::{TestServer, rv_of};

/// Kubernetes 1.34's own serialization fixtures (k8s.io/api's
/// `testdata/v1.34.0`, linked by `scripts/setup.sh`).
fn fixture(name: &str) -> Vec<u8> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/k8s-api-testdata/v1.34.0");
    std::fs::read(dir.join(name)).unwrap_or_else(|e| {
        panic!(
            "fixture {} is missing ({e}): run scripts/setup.sh (make test does)",
            dir.join(name).display()
        )
    })
}

/// The fixture Pod as kube-apiserver serves it at `rv`.
fn fixture_pod_json(rv: i64) -> Value {
    let mut v: Value = serde_json::from_slice(&fixture("core.v1.Pod.json")).expect("fixture JSON");
    v["metadata"]["resourceVersion"] = json!(rv.to_string());
    v
}

/// A protobuf Pod made by the codec (as kube-apiserver would store it).
fn protobuf_pod(ns: &str, name: &str) -> Vec<u8> {
    watchcache::object::protobuf::encode(&json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"), "labels": {"app": "web"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "nginx"}]}
    }))
    .expect("encode a Pod")
}

/// The names of a List's items, in order.
fn item_names(list: &Value) -> Vec<&str> {
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect()
}

async fn first_event(ts: &TestServer, path: &str) -> Value {
    let mut resp = ts
        .http
        .get(ts.url(path))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("watch request");
    assert_eq!(resp.status(), 200);
    let mut buf = Vec::new();
    loop {
        if let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let ev: Value = serde_json::from_slice(&line).expect("watch line is JSON");
            if ev["type"] != "BOOKMARK" {
                return ev;
            }
            continue;
        }
        let chunk = tokio::time::timeout(Duration::from_secs(15), resp.chunk())
            .await
            .expect("an event in time")
            .expect("watch stream")
            .expect("watch stream open");
        buf.extend_from_slice(&chunk);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_values_are_served_as_kube_apiserver_json() {
    let ts = TestServer::start("pb-serve", |_| {}).await;
    let mut etcd = ts.etcd.clone();
    // The fixture is byte for byte what kube-apiserver stores for this Pod.
    let key = ts.pod_key("namespaceValue", "nameValue");
    let rev = common::etcd_put(&mut etcd, key, fixture("core.v1.Pod.pb")).await;

    // get (at the etcd revision, so the cache has caught up)
    let path = "/api/v1/namespaces/namespaceValue/pods/nameValue";
    let ok = common::eventually(Duration::from_secs(10), || async {
        ts.get_json(path).await.0 == 200
    })
    .await;
    assert!(ok, "the protobuf pod never showed up");
    let (code, got) = ts.get_json(path).await;
    assert_eq!(code, 200, "{got}");
    assert_eq!(got, fixture_pod_json(rev));
    assert_eq!(rv_of(&got), rev);

    // list
    let (code, list) = ts
        .get_json(&format!(
            "/api/v1/pods?resourceVersion={rev}&resourceVersionMatch=NotOlderThan"
        ))
        .await;
    assert_eq!(code, 200, "{list}");
    let items = list["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "{list}");
    assert_eq!(items[0]["spec"], fixture_pod_json(rev)["spec"]);

    // watch: a protobuf Pod written after `rev` arrives as JSON.
    let watch = format!("/api/v1/namespaces/ns1/pods?watch=1&resourceVersion={rev}");
    let (event, rev2) = tokio::join!(first_event(&ts, &watch), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        common::etcd_put(
            &mut etcd,
            ts.pod_key("ns1", "live"),
            protobuf_pod("ns1", "live"),
        )
        .await
    });
    assert_eq!(event["type"], "ADDED", "{event}");
    assert_eq!(event["object"]["kind"], "Pod");
    assert_eq!(event["object"]["metadata"]["name"], "live");
    assert_eq!(event["object"]["metadata"]["uid"], "uid-live");
    assert_eq!(event["object"]["spec"]["containers"][0]["image"], "nginx");
    assert_eq!(rv_of(&event["object"]), rev2);

    // A JSON value next to protobuf ones stays JSON.
    let (code, created) = ts
        .post_json(
            "/api/v1/namespaces/ns1/pods",
            &api_support::pod("ns1", "json-pod"),
        )
        .await;
    assert_eq!(code, 201, "{created}");
    let (code, list) = ts
        .get_json(&format!(
            "/api/v1/namespaces/ns1/pods?resourceVersion={}&resourceVersionMatch=NotOlderThan",
            rv_of(&created)
        ))
        .await;
    assert_eq!(code, 200);
    let mut names: Vec<&str> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    names.sort();
    assert_eq!(names, ["json-pod", "live"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_protobuf_is_skipped_and_counted() {
    let ts = TestServer::start("pb-corrupt", |_| {}).await;
    let mut etcd = ts.etcd.clone();
    let good = protobuf_pod("ns1", "good");
    // Truncated, unknown kind (envelope says "Pxd"), garbage after the magic.
    let mut unknown_kind = good.clone();
    let at = unknown_kind
        .windows(3)
        .position(|w| w == b"Pod")
        .expect("kind");
    unknown_kind[at..at + 3].copy_from_slice(b"Pxd");
    let bad: [(&str, Vec<u8>); 3] = [
        ("truncated", good[..good.len() - 5].to_vec()),
        ("unknown-kind", unknown_kind),
        ("garbage", b"k8s\0\x0a\xff\xff\xff\xff".to_vec()),
    ];
    for (name, value) in &bad {
        common::etcd_put(&mut etcd, ts.pod_key("ns1", name), value.clone()).await;
    }
    // The reflector goes on: a good value written afterwards is served.
    let rev = common::etcd_put(&mut etcd, ts.pod_key("ns1", "good"), good).await;
    let (code, list) = ts
        .get_json(&format!(
            "/api/v1/namespaces/ns1/pods?resourceVersion={rev}&resourceVersionMatch=NotOlderThan"
        ))
        .await;
    assert_eq!(code, 200, "{list}");
    let names = item_names(&list);
    assert_eq!(names, ["good"], "{list}");
    let metrics = ts.metrics_text().await;
    let skipped: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("watchcache_undecodable_values_total") && l.contains("pods"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    // Each bad value is counted (a relist would count it again).
    assert!(skipped >= 3.0, "{metrics}");
}

/// `storage_encoding = "protobuf"`: writes store what kube-apiserver stores
/// (`k8s\0` + runtime.Unknown, readable by the codec as the served JSON);
/// update, patch and a uid-preconditioned delete work on such values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_storage_encoding_writes_kube_apiserver_protobuf() {
    let ts = TestServer::start("pb-write", |cfg| {
        for r in &mut cfg.resources {
            if r.plural == "pods" {
                r.storage_encoding = watchcache::config::StorageEncoding::Protobuf;
            }
        }
    })
    .await;
    let pods = "/api/v1/namespaces/ns1/pods";
    let (code, created) = ts.post_json(pods, &api_support::pod("ns1", "web")).await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["kind"], "Pod");

    let stored = ts
        .etcd_dump()
        .await
        .into_iter()
        .find(|(k, _, _)| *k == ts.pod_key("ns1", "web"))
        .expect("stored");
    assert!(
        stored.1.starts_with(b"k8s\0"),
        "stored as protobuf: {:?}",
        &stored.1[..8]
    );
    let mut decoded = watchcache::object::protobuf::decode(&stored.1).expect("decodes");
    decoded["metadata"]["resourceVersion"] = json!(stored.2.to_string());
    assert_eq!(decoded, created);
    // Byte for byte what the codec makes of the JSON (kube-apiserver's bytes).
    let mut plain = created.clone();
    plain["metadata"]
        .as_object_mut()
        .expect("metadata")
        .remove("resourceVersion");
    assert_eq!(
        watchcache::object::protobuf::encode(&plain).expect("encode"),
        stored.1
    );

    // A dry-run create answers the object it would store, as JSON.
    let before = ts.etcd_dump().await;
    let (code, dry) = ts
        .post_json(
            &format!("{pods}?dryRun=All"),
            &api_support::pod("ns1", "dry"),
        )
        .await;
    assert_eq!(code, 201, "{dry}");
    assert_eq!(dry["kind"], "Pod");
    assert_eq!(dry["metadata"]["name"], "dry");
    assert!(dry["metadata"]["uid"].is_string(), "{dry}");
    assert_eq!(ts.etcd_dump().await, before);

    // update with the uid as precondition (what kubectl replace sends)
    let mut next = created.clone();
    next["spec"]["nodeName"] = json!("node-2");
    let (code, updated) = ts.put_json(&format!("{pods}/web"), &next).await;
    assert_eq!(code, 200, "{updated}");
    assert_eq!(updated["spec"]["nodeName"], "node-2");
    // merge patch
    let (code, patched) = ts
        .patch_json(
            &format!("{pods}/web"),
            "application/merge-patch+json",
            &json!({"metadata": {"labels": {"tier": "front"}}}),
        )
        .await;
    assert_eq!(code, 200, "{patched}");
    assert_eq!(patched["metadata"]["labels"]["tier"], "front");
    let (code, got) = ts
        .get_json(&format!(
            "{pods}/web?resourceVersion={}&resourceVersionMatch=NotOlderThan",
            rv_of(&patched)
        ))
        .await;
    assert_eq!(code, 200);
    assert_eq!(got, patched);
    // Server-side apply: managedFields (fieldsV1 is embedded JSON in
    // protobuf) are stored and read back as applied.
    let (code, applied) = ts
        .send(
            reqwest::Method::PATCH,
            &format!("{pods}/web?fieldManager=pb-test"),
            Some("application/apply-patch+yaml"),
            Some(
                b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  labels:\n    tier: back\n"
                    .to_vec(),
            ),
        )
        .await;
    assert_eq!(code, 200, "{applied}");
    assert_eq!(applied["metadata"]["labels"]["tier"], "back");
    let (_, value, _) = ts
        .etcd_dump()
        .await
        .into_iter()
        .find(|(k, _, _)| *k == ts.pod_key("ns1", "web"))
        .expect("stored");
    assert!(value.starts_with(b"k8s\0"));
    let decoded = watchcache::object::protobuf::decode(&value).expect("decodes");
    let entry = &decoded["metadata"]["managedFields"][0];
    assert_eq!(entry["manager"], "pb-test", "{decoded}");
    assert_eq!(
        entry["fieldsV1"],
        json!({"f:metadata": {"f:labels": {"f:tier": {}}}}),
        "{decoded}"
    );
    // A field the schema does not have is refused, not silently dropped.
    let mut odd = api_support::pod("ns1", "odd");
    odd["spec"]["notAField"] = json!(1);
    let (code, status) = ts.post_json(pods, &odd).await;
    assert_eq!(code, 400, "{status}");
    assert!(
        status["message"]
            .as_str()
            .unwrap_or("")
            .contains("spec.notAField"),
        "{status}"
    );
    // delete with a uid precondition
    let (code, deleted) = ts
        .delete_json(
            &format!("{pods}/web"),
            Some(&json!({"kind": "DeleteOptions", "apiVersion": "v1",
                          "preconditions": {"uid": created["metadata"]["uid"]}})),
        )
        .await;
    assert_eq!(code, 200, "{deleted}");
}

/// `Accept: application/vnd.kubernetes.protobuf` (what client-go's protobuf
/// clients send, JSON as the fallback): get, list and watch answer in
/// kube-apiserver's protobuf; custom resources and Table requests stay JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_protobuf_serves_get_list_and_watch_in_protobuf() {
    use watchcache::object::protobuf as pb;
    const ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";
    let ts = TestServer::start("pb-accept", |_| {}).await;
    let mut etcd = ts.etcd.clone();
    let key = ts.pod_key("namespaceValue", "nameValue");
    let rev = common::etcd_put(&mut etcd, key, fixture("core.v1.Pod.pb")).await;
    let fetch = |path: String| {
        let req = ts.http.get(ts.url(&path)).header("Accept", ACCEPT);
        async move {
            let resp = req.send().await.expect("request");
            let code = resp.status().as_u16();
            let ct = resp
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            (code, ct, resp.bytes().await.expect("body").to_vec())
        }
    };

    // get: kube-apiserver's bytes for the object at `rev`.
    let (code, ct, body) = fetch(format!(
        "/api/v1/namespaces/namespaceValue/pods/nameValue?resourceVersion={rev}"
    ))
    .await;
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(ct, "application/vnd.kubernetes.protobuf");
    let expected = fixture_pod_json(rev);
    assert_eq!(body, pb::encode(&expected).expect("encode"));
    assert_eq!(pb::decode(&body).expect("decodes"), expected);

    // list: a PodList.
    let (code, ct, body) = fetch(format!(
        "/api/v1/pods?resourceVersion={rev}&resourceVersionMatch=NotOlderThan"
    ))
    .await;
    assert_eq!(code, 200);
    assert_eq!(ct, "application/vnd.kubernetes.protobuf");
    let list = pb::decode(&body).expect("list decodes");
    assert_eq!(list["kind"], "PodList");
    // At least `rev`: the shared etcd's revision moves with other tests' writes.
    assert!(rv_of(&list) >= rev, "{list}");
    let mut item = expected.clone();
    let item_map = item.as_object_mut().expect("object");
    item_map.remove("kind");
    item_map.remove("apiVersion");
    assert_eq!(list["items"], json!([item]));

    // watch: length-delimited WatchEvent frames.
    let mut resp = ts
        .http
        .get(ts.url(&format!(
            "/api/v1/namespaces/ns1/pods?watch=1&resourceVersion={rev}"
        )))
        .header("Accept", ACCEPT)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("watch");
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"],
        "application/vnd.kubernetes.protobuf;stream=watch"
    );
    let rev2 = common::etcd_put(
        &mut etcd,
        ts.pod_key("ns1", "live"),
        protobuf_pod("ns1", "live"),
    )
    .await;
    let mut buf = Vec::new();
    let frame = loop {
        if buf.len() >= 4 {
            let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            if buf.len() >= 4 + len {
                break buf[4..4 + len].to_vec();
            }
        }
        let chunk = tokio::time::timeout(Duration::from_secs(15), resp.chunk())
            .await
            .expect("a frame in time")
            .expect("watch stream")
            .expect("watch stream open");
        buf.extend_from_slice(&chunk);
    };
    // A bare WatchEvent message (kube-apiserver's raw stream serializer),
    // not a `k8s\0` envelope: client-go's decoder fails on one.
    assert!(
        !frame.starts_with(pb::MAGIC),
        "no k8s\\0 envelope: {frame:?}"
    );
    let event = pb::decode_watch_event(&frame).expect("WatchEvent frame decodes");
    assert_eq!(event["type"], "ADDED");
    assert_eq!(event["object"]["kind"], "Pod");
    assert_eq!(event["object"]["metadata"]["name"], "live");
    assert_eq!(rv_of(&event["object"]), rev2);

    // Initial events (a watch without resourceVersion) and their closing
    // bookmark come in protobuf too.
    let mut resp = ts
        .http
        .get(ts.url(
            "/api/v1/namespaces/ns1/pods?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan",
        ))
        .header("Accept", ACCEPT)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("watch");
    assert_eq!(resp.status(), 200);
    let mut buf = Vec::new();
    let mut events = Vec::new();
    while events.len() < 2 {
        if buf.len() >= 4 {
            let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            if buf.len() >= 4 + len {
                let frame: Vec<u8> = buf.drain(..4 + len).skip(4).collect();
                events.push(pb::decode_watch_event(&frame).expect("frame decodes"));
                continue;
            }
        }
        let chunk = tokio::time::timeout(Duration::from_secs(15), resp.chunk())
            .await
            .expect("a frame in time")
            .expect("watch stream")
            .expect("watch stream open");
        buf.extend_from_slice(&chunk);
    }
    assert_eq!(events[0]["type"], "ADDED", "{}", events[0]);
    assert_eq!(events[0]["object"]["metadata"]["name"], "live");
    assert_eq!(events[1]["type"], "BOOKMARK", "{}", events[1]);
    assert_eq!(
        events[1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );

    // A custom resource stays JSON.
    let (code, created) = ts
        .post_json(
            "/apis/example.com/v1/namespaces/ns1/widgets",
            &json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}),
        )
        .await;
    assert_eq!(code, 201, "{created}");
    let (code, ct, body) = fetch("/apis/example.com/v1/namespaces/ns1/widgets/w".into()).await;
    assert_eq!(code, 200);
    assert_eq!(ct, "application/json");
    let w: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(w["metadata"]["name"], "w");
}

/// A protobuf List is written from each object's cached message: it is the
/// JSON List of the same revision encoded whole (items without TypeMeta),
/// across frames and with an item too large to share a frame; a second List
/// (from the cached messages) is the same bytes, so are later ones (from the
/// kept body), and an object changed in etcd is listed as it now is, not as
/// it was first encoded or kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_list_is_the_json_list_encoded_and_follows_changes() {
    use watchcache::object::protobuf as pb;
    let ts = TestServer::start("pb-list", |_| {}).await;
    let mut etcd = ts.etcd.clone();
    let pod = |name: &str, pad: usize, image: &str| {
        pb::encode(&json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "pbl", "annotations": {"pad": "x".repeat(pad)}},
            "spec": {"containers": [{"name": "c", "image": image}]}
        }))
        .expect("encode a Pod")
    };
    for i in 0..300 {
        let pad = if i == 150 { 200_000 } else { 1_000 };
        common::etcd_put(
            &mut etcd,
            ts.pod_key("pbl", &format!("p{i:03}")),
            pod(&format!("p{i:03}"), pad, "nginx"),
        )
        .await;
    }
    let rev = common::etcd_put(
        &mut etcd,
        ts.pod_key("pbl", "p000"),
        pod("p000", 10, "busybox"),
    )
    .await;
    let fetch = |accept: &'static str, rv: i64| {
        let req = ts
            .http
            .get(ts.url(&format!(
                "/api/v1/namespaces/pbl/pods?resourceVersion={rv}&resourceVersionMatch=Exact"
            )))
            .header("Accept", accept);
        async move {
            let resp = req.send().await.expect("request");
            assert_eq!(resp.status(), 200);
            resp.bytes().await.expect("body").to_vec()
        }
    };
    let json_list: Value =
        serde_json::from_slice(&fetch("application/json", rev).await).expect("JSON list");
    assert_eq!(json_list["items"].as_array().map(Vec::len), Some(300));
    let mut expected = json_list.clone();
    for item in expected["items"].as_array_mut().expect("items") {
        let m = item.as_object_mut().expect("item");
        m.remove("apiVersion");
        m.remove("kind");
    }
    let expected = pb::encode(&expected).expect("encode the JSON list");
    let first = fetch("application/vnd.kubernetes.protobuf", rev).await;
    assert!(
        first == expected,
        "protobuf List differs from the JSON List encoded"
    );
    let second = fetch("application/vnd.kubernetes.protobuf", rev).await;
    assert!(second == first, "the cached encoding gives the same List");
    // The second List of these objects recorded its body: later ones are
    // written from it, with their own head, and are the same bytes.
    for _ in 0..2 {
        let kept = fetch("application/vnd.kubernetes.protobuf", rev).await;
        assert!(kept == expected, "a List from the kept body differs");
    }

    let rev2 = common::etcd_put(
        &mut etcd,
        ts.pod_key("pbl", "p001"),
        pod("p001", 10, "redis"),
    )
    .await;
    for _ in 0..4 {
        let changed =
            pb::decode(&fetch("application/vnd.kubernetes.protobuf", rev2).await).expect("decodes");
        assert_eq!(rv_of(&changed), rev2);
        let items = changed["items"].as_array().expect("items");
        assert_eq!(items.len(), 300);
        assert_eq!(items[0]["spec"]["containers"][0]["image"], "busybox");
        assert_eq!(items[1]["spec"]["containers"][0]["image"], "redis");
        assert_eq!(rv_of(&items[1]), rev2);
        assert_eq!(items[2]["spec"]["containers"][0]["image"], "nginx");
    }
}

/// A JSON object that does not fit the Pod schema (a field this build's
/// schema does not know) cannot be sent as protobuf: a Get or List that
/// asked for protobuf (with client-go's JSON fallback in its Accept) is
/// answered in JSON, with every object, and the fallback is counted. A List
/// without that object stays protobuf.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_outside_the_schema_are_answered_in_json() {
    use watchcache::object::protobuf as pb;
    const ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";
    let ts = TestServer::start("pb-fallback", |_| {}).await;
    let mut etcd = ts.etcd.clone();
    common::etcd_put(&mut etcd, ts.pod_key("fb", "ok"), protobuf_pod("fb", "ok")).await;
    let odd = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "odd", "namespace": "fb"},
        "spec": {"containers": [{"name": "c", "image": "nginx"}], "futureField": {"x": 1}}
    });
    common::etcd_put(
        &mut etcd,
        ts.pod_key("fb", "odd"),
        serde_json::to_vec(&odd).expect("json"),
    )
    .await;
    let rev = common::etcd_put(
        &mut etcd,
        ts.pod_key("other", "ok2"),
        protobuf_pod("other", "ok2"),
    )
    .await;
    let fetch = |path: String| {
        let req = ts.http.get(ts.url(&path)).header("Accept", ACCEPT);
        async move {
            let resp = req.send().await.expect("request");
            let code = resp.status().as_u16();
            let ct = resp.headers()["content-type"]
                .to_str()
                .expect("ascii")
                .to_string();
            (code, ct, resp.bytes().await.expect("body").to_vec())
        }
    };
    let fallbacks = || async {
        let metrics = ts
            .http
            .get(ts.url("/metrics"))
            .send()
            .await
            .expect("metrics");
        let metrics = metrics.text().await.expect("metrics body");
        metrics
            .lines()
            .filter(|l| l.starts_with("watchcache_protobuf_fallbacks_total") && l.contains("pods"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let rv = format!("resourceVersion={rev}&resourceVersionMatch=NotOlderThan");
    let before = fallbacks().await;

    let (code, ct, body) = fetch(format!("/api/v1/namespaces/fb/pods/odd?{rv}")).await;
    assert_eq!((code, ct.as_str()), (200, "application/json"));
    let got: Value = serde_json::from_slice(&body).expect("a JSON Pod");
    assert_eq!(got["spec"]["futureField"]["x"], 1, "the object as stored");

    let (code, ct, body) = fetch(format!("/api/v1/namespaces/fb/pods?{rv}")).await;
    assert_eq!((code, ct.as_str()), (200, "application/json"));
    let list: Value = serde_json::from_slice(&body).expect("a JSON PodList");
    assert_eq!(list["kind"], "PodList");
    let names = item_names(&list);
    assert_eq!(names, ["odd", "ok"]);
    assert_eq!(
        fallbacks().await - before,
        2.0,
        "a Get and a List fell back"
    );

    // The good object alone, and another namespace, are still protobuf.
    let (code, ct, body) = fetch(format!("/api/v1/namespaces/fb/pods/ok?{rv}")).await;
    assert_eq!(
        (code, ct.as_str()),
        (200, "application/vnd.kubernetes.protobuf")
    );
    assert_eq!(
        pb::decode(&body).expect("protobuf Pod")["metadata"]["name"],
        "ok"
    );
    let (code, ct, body) = fetch(format!("/api/v1/namespaces/other/pods?{rv}")).await;
    assert_eq!(
        (code, ct.as_str()),
        (200, "application/vnd.kubernetes.protobuf")
    );
    let list = pb::decode(&body).expect("protobuf PodList");
    assert_eq!(list["items"][0]["metadata"]["name"], "ok2");
    assert_eq!(fallbacks().await - before, 2.0);
}

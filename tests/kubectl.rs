//! Real kubectl against the REST API (`--server http://127.0.0.1:PORT` via a
//! private kubeconfig, no ambient config).
mod common;
use common::server as api_support;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use api_support::{TestServer, pod};
use common::kubectl::{KubeUser, Kubectl};

/// kubectl for the test server over plain HTTP, with no credentials.
fn kubectl(ts: &TestServer) -> Kubectl {
    Kubectl::new(&ts.base(), None, KubeUser::Anonymous)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_pods_all_namespaces() {
    let ts = TestServer::start("kc-getall", |_| {}).await;
    for (ns, name) in [("team-a", "alpha"), ("team-b", "beta")] {
        let (c, v) = ts
            .post_json(&format!("/api/v1/namespaces/{ns}/pods"), &pod(ns, name))
            .await;
        assert_eq!(c, 201, "{v}");
    }
    let k = kubectl(&ts);
    let out = k.run(&["get", "pods", "-A"]).await;
    println!("{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("NAMESPACE"), "{out}");
    assert!(
        lines[0].contains("NAME") && lines[0].contains("AGE"),
        "{out}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("team-a") && l.contains("alpha")),
        "{out}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("team-b") && l.contains("beta")),
        "{out}"
    );
    assert_eq!(lines.len(), 3, "{out}");
    // Kubernetes' short name and category, known to kubectl only through
    // discovery.
    for short in ["po", "all"] {
        let out = k.run(&["get", short, "-A", "-o", "name"]).await;
        let mut names: Vec<&str> = out.lines().collect();
        names.sort_unstable();
        assert_eq!(names, ["pod/alpha", "pod/beta"], "get {short}: {out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_pod_json() {
    let ts = TestServer::start("kc-getjson", |_| {}).await;
    let (c, created) = ts
        .post_json("/api/v1/namespaces/ns1/pods", &pod("ns1", "web"))
        .await;
    assert_eq!(c, 201);
    let k = kubectl(&ts);
    let out = k
        .run(&["get", "pod", "web", "-n", "ns1", "-o", "json"])
        .await;
    let v: Value = serde_json::from_str(&out).expect("kubectl printed JSON");
    assert_eq!(v["kind"], "Pod");
    assert_eq!(v["metadata"]["name"], "web");
    assert_eq!(v["metadata"]["namespace"], "ns1");
    assert_eq!(v["metadata"]["uid"], created["metadata"]["uid"]);
    assert_eq!(
        v["metadata"]["resourceVersion"],
        created["metadata"]["resourceVersion"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_from_file() {
    let ts = TestServer::start("kc-create", |_| {}).await;
    let k = kubectl(&ts);
    let file = k.write_file(
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: from-file\n  namespace: ns1\n  labels:\n    app: demo\n\
         spec:\n  containers:\n  - name: c\n    image: nginx\n",
    );
    let out = k.run(&["create", "-f", &file]).await;
    assert!(out.contains("pod/from-file created"), "{out}");
    let stored = ts
        .etcd_get(&ts.pod_key("ns1", "from-file"))
        .await
        .expect("stored in etcd");
    assert_eq!(stored["metadata"]["labels"]["app"], "demo");
    assert!(stored["metadata"]["uid"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_replace_from_file() {
    let ts = TestServer::start("kc-replace", |_| {}).await;
    let (c, _) = ts
        .post_json("/api/v1/namespaces/ns1/pods", &pod("ns1", "rep"))
        .await;
    assert_eq!(c, 201);
    let k = kubectl(&ts);
    let out = k
        .run(&["get", "pod", "rep", "-n", "ns1", "-o", "json"])
        .await;
    let mut v: Value = serde_json::from_str(&out).unwrap();
    v["spec"]["nodeName"] = json!("replaced-node");
    let file = k.write_file("rep.json", &v.to_string());
    let out = k.run(&["replace", "-f", &file]).await;
    assert!(out.contains("pod/rep replaced"), "{out}");
    let stored = ts.etcd_get(&ts.pod_key("ns1", "rep")).await.unwrap();
    assert_eq!(stored["spec"]["nodeName"], "replaced-node");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_patch_merge() {
    let ts = TestServer::start("kc-patch", |_| {}).await;
    let (c, _) = ts
        .post_json("/api/v1/namespaces/ns1/pods", &pod("ns1", "pat"))
        .await;
    assert_eq!(c, 201);
    let k = kubectl(&ts);
    let out = k
        .run(&[
            "patch",
            "pod",
            "pat",
            "-n",
            "ns1",
            "--type",
            "merge",
            "-p",
            r#"{"metadata":{"labels":{"patched":"yes"}}}"#,
        ])
        .await;
    assert!(out.contains("pod/pat patched"), "{out}");
    let stored = ts.etcd_get(&ts.pod_key("ns1", "pat")).await.unwrap();
    assert_eq!(stored["metadata"]["labels"]["patched"], "yes");
    assert_eq!(stored["metadata"]["labels"]["app"], "web");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_delete() {
    let ts = TestServer::start("kc-delete", |_| {}).await;
    let (c, _) = ts
        .post_json("/api/v1/namespaces/ns1/pods", &pod("ns1", "gone"))
        .await;
    assert_eq!(c, 201);
    let k = kubectl(&ts);
    let out = k.run(&["delete", "pod", "gone", "-n", "ns1"]).await;
    assert!(out.contains("pod \"gone\" deleted"), "{out}");
    assert!(ts.etcd_get(&ts.pod_key("ns1", "gone")).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_watch_shows_new_pod() {
    let ts = TestServer::start("kc-watch", |_| {}).await;
    let (c, _) = ts
        .post_json("/api/v1/namespaces/ns1/pods", &pod("ns1", "before"))
        .await;
    assert_eq!(c, 201);
    let k = kubectl(&ts);
    let mut child = k
        .command(&["get", "pods", "-n", "ns1", "-w", "--output-watch-events"])
        .spawn()
        .expect("spawn kubectl -w");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut seen = Vec::new();
    // The initial state first.
    let got_initial = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(l)) = lines.next_line().await {
            seen.push(l.clone());
            if l.contains("before") {
                return true;
            }
        }
        false
    })
    .await;
    assert!(
        matches!(got_initial, Ok(true)),
        "initial pod listed: {seen:?}"
    );
    let (c, _) = ts
        .post_json("/api/v1/namespaces/ns1/pods", &pod("ns1", "during"))
        .await;
    assert_eq!(c, 201);
    let got_new = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(l)) = lines.next_line().await {
            seen.push(l.clone());
            if l.contains("during") {
                return Some(l);
            }
        }
        None
    })
    .await;
    let _ = child.kill().await;
    let line = match got_new {
        Ok(Some(l)) => l,
        _ => {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                use tokio::io::AsyncReadExt;
                let _ = e.read_to_string(&mut err).await;
            }
            panic!("new pod not shown by kubectl -w: {seen:?}; stderr: {err}");
        }
    };
    println!("{seen:#?}");
    assert!(line.trim_start().starts_with("ADDED"), "{line} ({seen:?})");
    assert!(
        seen[0].contains("EVENT") && seen[0].contains("NAME"),
        "{seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_creates_then_updates() {
    let ts = TestServer::start("kc-apply", |_| {}).await;
    let k = kubectl(&ts);
    let manifest = |image: &str, extra: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: applied\n  namespace: ns1\n  labels:\n    app: demo\n{extra}\
             spec:\n  containers:\n  - name: c\n    image: {image}\n  - name: d\n    image: busybox\n"
        )
    };
    let file = k.write_file("a1.yaml", &manifest("nginx:1", "    tier: fe\n"));
    let out = k.run(&["apply", "-f", &file]).await;
    assert!(out.contains("pod/applied created"), "{out}");
    let file = k.write_file("a2.yaml", &manifest("nginx:2", ""));
    let out = k.run(&["apply", "-f", &file]).await;
    assert!(out.contains("pod/applied configured"), "{out}");
    let stored = ts.etcd_get(&ts.pod_key("ns1", "applied")).await.unwrap();
    assert_eq!(
        stored["spec"]["containers"][0]["image"], "nginx:2",
        "{stored}"
    );
    assert_eq!(stored["spec"]["containers"][1]["name"], "d", "{stored}");
    assert!(
        stored["metadata"]["labels"].get("tier").is_none(),
        "removed label pruned: {stored}"
    );
    let text = stored.to_string();
    assert!(!text.contains("\"$"), "no patch directives stored: {text}");
}

/// A Pod stored by kube-apiserver as protobuf (Kubernetes 1.34's fixture, byte
/// for byte) reads through kubectl like any other: `kubectl get -o json` prints
/// kube-apiserver's JSON, resourceVersion = the etcd mod revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_protobuf_pod_json() {
    let ts = TestServer::start("kc-protobuf", |_| {}).await;
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/k8s-api-testdata/v1.34.0");
    let read = |name: &str| {
        std::fs::read(fixtures.join(name))
            .unwrap_or_else(|e| panic!("fixture {name} missing in {} ({e})", fixtures.display()))
    };
    let mut etcd = ts.etcd.clone();
    let rev = etcd
        .put(
            ts.pod_key("namespaceValue", "nameValue"),
            read("core.v1.Pod.pb"),
            None,
        )
        .await
        .expect("put")
        .header()
        .expect("header")
        .revision();
    let mut expected: Value = serde_json::from_slice(&read("core.v1.Pod.json")).expect("JSON");
    expected["metadata"]["resourceVersion"] = json!(rev.to_string());
    let k = kubectl(&ts);
    // Wait until the cache has the write, then read through kubectl.
    let path = format!("/api/v1/namespaces/namespaceValue/pods/nameValue?resourceVersion={rev}");
    let (code, _) = ts.get_json(&path).await;
    assert_eq!(code, 200);
    let out = k
        .run(&[
            "get",
            "pod",
            "nameValue",
            "-n",
            "namespaceValue",
            "-o",
            "json",
            // kubectl hides managedFields by default; the fixture has them.
            "--show-managed-fields",
        ])
        .await;
    let got: Value = serde_json::from_str(&out).expect("kubectl printed JSON");
    assert_eq!(got, expected);
}

/// kubectl asks for gzip by itself (Go's transport): a List over 128 KiB
/// comes back compressed, and kubectl reads every item of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_reads_a_gzipped_list() {
    let ts = TestServer::start("kc-gzip", |_| {}).await;
    api_support::create_large_pods(&ts, "ns1", 120, 1500).await;
    let k = kubectl(&ts);
    // Three Lists of the same objects: built, recorded into the List body
    // cache, then written from its kept gzip joined to the List's own head
    // (Go's reader checks the joined CRC and length).
    for _ in 0..2 {
        k.run(&["get", "pods", "-n", "ns1", "-o", "name", "--chunk-size=0"])
            .await;
    }
    // -v=8 logs each response's headers, as Go's transport leaves them
    // after it has unpacked a gzip body: `Content-Encoding` removed, the
    // `Vary: Accept-Encoding` the server sends only with gzip kept.
    let out = k
        .output(&[
            "get",
            "pods",
            "-n",
            "ns1",
            "-o",
            "json",
            "--chunk-size=0",
            "-v=8",
        ])
        .await;
    assert!(out.success, "{}", out.stderr);
    let list: Value = serde_json::from_str(&out.stdout).unwrap();
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 120);
    assert_eq!(items[119]["metadata"]["name"], "big-119");
    assert_eq!(
        items[0]["metadata"]["annotations"]["note"]
            .as_str()
            .map(str::len),
        Some(1500)
    );
    // The last List was written from the kept gzip (the metrics are the
    // test binary's; no other test here lists over 128 KiB).
    let kept = ts
        .metric(r#"watchcache_api_gzip_responses_total{source="kept"} "#)
        .await;
    assert!(kept >= 1.0, "{kept} Lists from kept gzip");
    assert!(
        out.stderr.contains("Vary: Accept-Encoding"),
        "kubectl was not sent gzip:\n{}",
        out.stderr
    );
}

/// `kubectl apply --server-side`: created, then configured with what the
/// manager no longer applies removed; a second manager's different value
/// conflicts (409, the field named) until `--force-conflicts`; a server-side
/// dry run writes nothing; `kubectl replace` keeps the managed fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_server_side_apply() {
    let ts = TestServer::start("kc-ssa", |_| {}).await;
    let k = kubectl(&ts);
    let manifest = |image: &str, labels: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: ssa\n  namespace: ns1\n  labels:\n{labels}\
             spec:\n  containers:\n  - name: c\n    image: {image}\n"
        )
    };
    let key = ts.pod_key("ns1", "ssa");
    let file = k.write_file(
        "s1.yaml",
        &manifest("nginx:1", "    app: demo\n    tier: fe\n"),
    );
    let out = k.run(&["apply", "--server-side", "-f", &file]).await;
    assert!(out.contains("pod/ssa serverside-applied"), "{out}");
    let stored = ts.etcd_get(&key).await.expect("created");
    let managed = &stored["metadata"]["managedFields"];
    assert_eq!(managed[0]["manager"], "kubectl", "{stored}");
    assert_eq!(managed[0]["operation"], "Apply", "{stored}");
    assert_eq!(
        managed[0]["fieldsV1"]["f:metadata"]["f:labels"],
        json!({"f:app": {}, "f:tier": {}}),
        "{stored}"
    );
    assert!(stored["metadata"]["uid"].is_string(), "{stored}");

    // Dropping a label and changing the image: the label goes.
    let file = k.write_file("s2.yaml", &manifest("nginx:2", "    app: demo\n"));
    let out = k.run(&["apply", "--server-side", "-f", &file]).await;
    assert!(out.contains("pod/ssa serverside-applied"), "{out}");
    let stored = ts.etcd_get(&key).await.expect("applied");
    assert_eq!(
        stored["metadata"]["labels"],
        json!({"app": "demo"}),
        "{stored}"
    );
    assert_eq!(stored["spec"]["containers"][0]["image"], "nginx:2");

    // Another manager, another value: a conflict naming field and manager.
    let other = k.write_file("o.yaml", &manifest("nginx:2", "    app: other\n"));
    let err = k
        .fail(&[
            "apply",
            "--server-side",
            "--field-manager=ops",
            "-f",
            &other,
        ])
        .await;
    assert!(
        err.contains("conflict with \"kubectl\"") && err.contains(".metadata.labels.app"),
        "{err}"
    );
    let unchanged = ts.etcd_get(&key).await.expect("still there");
    assert_eq!(unchanged, stored, "a refused apply writes nothing");
    // A server-side dry run of the forced apply writes nothing either.
    k.run(&[
        "apply",
        "--server-side",
        "--field-manager=ops",
        "--force-conflicts",
        "--dry-run=server",
        "-f",
        &other,
    ])
    .await;
    assert_eq!(ts.etcd_get(&key).await.expect("there"), stored);
    k.run(&[
        "apply",
        "--server-side",
        "--field-manager=ops",
        "--force-conflicts",
        "-f",
        &other,
    ])
    .await;
    let forced = ts.etcd_get(&key).await.expect("forced");
    assert_eq!(forced["metadata"]["labels"]["app"], "other", "{forced}");
    let managers: Vec<&str> = forced["metadata"]["managedFields"]
        .as_array()
        .expect("entries")
        .iter()
        .filter_map(|e| e["manager"].as_str())
        .collect();
    assert_eq!(managers, ["kubectl", "ops"], "{forced}");
    assert!(
        forced["metadata"]["managedFields"][0]["fieldsV1"]["f:metadata"]["f:labels"]
            .get("f:app")
            .is_none(),
        "the field moved to ops: {forced}"
    );

    // kubectl replace sends no managedFields: they are kept.
    let file = k.write_file("r.yaml", &manifest("nginx:3", "    app: other\n"));
    k.run(&["replace", "-f", &file]).await;
    let replaced = ts.etcd_get(&key).await.expect("replaced");
    assert_eq!(replaced["spec"]["containers"][0]["image"], "nginx:3");
    assert_eq!(
        replaced["metadata"]["managedFields"],
        forced["metadata"]["managedFields"]
    );
}

/// A server-side apply of raw (YAML) bytes: (status, JSON body).
async fn apply_raw(ts: &TestServer, path: &str, body: Vec<u8>) -> (u16, Value) {
    ts.send(
        reqwest::Method::PATCH,
        path,
        Some("application/apply-patch+yaml"),
        Some(body),
    )
    .await
}

/// Server-side apply's own rules, over raw requests: a field manager is
/// required, `force` only goes with apply, the body must be an object with
/// its type, managedFields may not be sent, a uid must be the object's, and
/// a resourceVersion is a precondition on an existing object (none on a
/// create, `0` unconditional). Nothing refused is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_refuses_bad_requests() {
    let ts = TestServer::start("ssa-bad", |_| {}).await;
    let path = "/api/v1/namespaces/ns1/pods/p";
    let ct = "application/apply-patch+yaml";
    let good = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                      "spec": {"nodeName": "n1"}});
    let (c, v) = ts.patch_json(path, ct, &good).await;
    assert_eq!(c, 422, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("fieldManager"),
        "{v}"
    );
    let apply = format!("{path}?fieldManager=t");
    for (bad, want) in [
        (json!([1]), 400),
        (json!({"kind": "Pod", "metadata": {"name": "p"}}), 400),
        (
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q"}}),
            400,
        ),
        (
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "p", "managedFields": [{"manager": "x"}]}}),
            400,
        ),
    ] {
        let (c, v) = ts.patch_json(&apply, ct, &bad).await;
        assert_eq!(c, want, "{bad}: {v}");
    }
    let (c, v) = apply_raw(
        &ts,
        &apply,
        b"apiVersion: v1\nkind: Pod\nmetadata: [unclosed".to_vec(),
    )
    .await;
    assert_eq!(c, 400, "{v}");
    // Aliases that would expand to a billion nodes: refused, not expanded.
    let mut bomb = String::from("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n");
    bomb.push_str("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..9 {
        let p = i - 1;
        bomb.push_str(&format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    let (c, v) = apply_raw(&ts, &apply, bomb.into_bytes()).await;
    assert_eq!(c, 400, "{v}");
    assert!(v["message"].as_str().unwrap().contains("budget"), "{v}");
    assert!(ts.etcd_get(&ts.pod_key("ns1", "p")).await.is_none());
    let (c, v) = ts
        .patch_json(
            &format!("{path}?force=true"),
            "application/merge-patch+json",
            &json!({}),
        )
        .await;
    assert_eq!(c, 422, "{v}");

    // A uid names an object that must exist: 409 when none does.
    let mut with_uid = good.clone();
    with_uid["metadata"]["uid"] = json!("not-there");
    let (c, v) = ts.patch_json(&apply, ct, &with_uid).await;
    assert_eq!(c, 409, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("uid mismatch"),
        "{v}"
    );

    // YAML creates (201; a resourceVersion is no precondition on a create;
    // `010` is octal, as YAML 1.1 and kube-apiserver read it), the same
    // again changes nothing but is 200.
    let yaml = b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  resourceVersion: \"1\"\nspec:\n  nodeName: n1\n  terminationGracePeriodSeconds: 010\n";
    let (c, created) = apply_raw(&ts, &apply, yaml.to_vec()).await;
    assert_eq!(c, 201, "{created}");
    assert_eq!(created["metadata"]["namespace"], "ns1");
    assert_eq!(created["spec"]["terminationGracePeriodSeconds"], 8);
    // On the object that now exists, the same "1" (never a key's revision: etcd's first write is 2) is a failed precondition.
    let (c, v) = apply_raw(&ts, &apply, yaml.to_vec()).await;
    assert_eq!(c, 409, "{v}");
    let yaml = String::from_utf8_lossy(yaml).replace("  resourceVersion: \"1\"\n", "");
    let (c, again) = apply_raw(&ts, &apply, yaml.into_bytes()).await;
    assert_eq!(c, 200, "{again}");
    assert_eq!(again, created, "the same configuration writes nothing");
    // Another object's uid: 422, as for any write that changes it.
    let (c, v) = ts.patch_json(&apply, ct, &with_uid).await;
    assert_eq!(c, 422, "{v}");
    // A stale resourceVersion: 409, nothing written.
    let mut stale = good.clone();
    stale["metadata"]["resourceVersion"] = json!("1");
    stale["spec"]["nodeName"] = json!("n2");
    let (c, v) = ts.patch_json(&apply, ct, &stale).await;
    assert_eq!(c, 409, "{v}");
    let stored = ts.etcd_get(&ts.pod_key("ns1", "p")).await.expect("stored");
    assert_eq!(stored["spec"]["nodeName"], "n1");
    // resourceVersion "0": unconditional.
    let mut any = good.clone();
    any["metadata"]["resourceVersion"] = json!("0");
    any["spec"]["nodeName"] = json!("n3");
    let (c, v) = ts.patch_json(&apply, ct, &any).await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(v["spec"]["nodeName"], "n3");
    // A merge patch that nulls managedFields keeps them; a PUT of `[{}]`
    // clears them (kube-apiserver's reset).
    let (c, v) = ts
        .patch_json(
            path,
            "application/merge-patch+json",
            &json!({"metadata": {"managedFields": null}}),
        )
        .await;
    assert_eq!(c, 200, "{v}");
    assert_eq!(v["metadata"]["managedFields"][0]["manager"], "t", "{v}");
    let mut reset = v.clone();
    reset["metadata"]["managedFields"] = json!([{}]);
    let (c, v) = ts.put_json(path, &reset).await;
    assert_eq!(c, 200, "{v}");
    assert!(v["metadata"].get("managedFields").is_none(), "{v}");
}

/// kubectl's discovery through aggregated discovery: `kubectl
/// api-resources` asks `/api` and `/apis` once each (no request per group
/// version), lists the configured resources, and a second run revalidates
/// its cached copies (`--cache-dir`) with `If-None-Match`: the server's 304
/// makes kubectl's HTTP cache answer from its copy (`X-From-Cache: 1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_discovery_uses_aggregated_discovery_and_its_cache() {
    let ts = TestServer::start("kc-discovery", |_| {}).await;
    let k = kubectl(&ts);
    // `-v=8` logs each request with its URL and status, and the response
    // headers.
    let from_cache = |stderr: &str| stderr.matches("X-From-Cache: 1").count();
    let requests = |stderr: &str| -> Vec<(String, String)> {
        stderr
            .lines()
            .filter(|l| l.contains("GET") && l.contains(ts.base().as_str()))
            .map(|l| {
                let path = l
                    .split(ts.base().as_str())
                    .nth(1)
                    .and_then(|rest| rest.split(['?', '"', ' ']).next())
                    .unwrap_or("")
                    .to_string();
                let status = if l.contains("304") {
                    "304"
                } else if l.contains("200") {
                    "200"
                } else {
                    "other"
                };
                (path, status.to_string())
            })
            .collect()
    };
    let first = k.output(&["api-resources", "-v=8"]).await;
    assert!(first.success, "{}", first.stderr);
    for (name, group) in [("pods", "v1"), ("widgets", "example.com/v1")] {
        assert!(
            first
                .stdout
                .lines()
                .any(|l| l.starts_with(name) && l.contains(group)),
            "{name} in\n{}",
            first.stdout
        );
    }
    let reqs = requests(&first.stderr);
    let paths: Vec<&str> = reqs.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        ["/api", "/apis"],
        "exactly the two aggregated requests:\n{}",
        first.stderr
    );
    assert_eq!(from_cache(&first.stderr), 0, "{}", first.stderr);
    let second = k.output(&["api-resources", "-v=8"]).await;
    assert!(second.success, "{}", second.stderr);
    assert_eq!(second.stdout, first.stdout);
    let reqs = requests(&second.stderr);
    let paths: Vec<&str> = reqs.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(paths, ["/api", "/apis"], "{}", second.stderr);
    assert_eq!(
        from_cache(&second.stderr),
        2,
        "both revalidated with 304s and answered from kubectl's cache:\n{}",
        second.stderr
    );
}

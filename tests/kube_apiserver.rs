//! kube-apiserver as the oracle: a real kube-apiserver (built from the Go
//! module `k8s.io/kubernetes` by `scripts/peers.sh`) and watchcache on the
//! same etcd, with the same encryption config. kube-apiserver writes a
//! realistic cluster; then, for every resource of the shipped
//! `config/kubernetes.toml`, the same request to both must get the same
//! answer: Lists (cluster-wide, per namespace, by label and field, paged),
//! Gets as JSON, protobuf and Table, and errors. A difference fails the test
//! unless `docs/KUBERNETES.md`'s table "Differences from kube-apiserver"
//! lists it with its reason; a row of that table that no longer differs
//! fails it too, so the list cannot go stale.
mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use common::kube_apiserver::{KubeApiserver, peer, write_encryption_config};
use common::{Daemon, PrivateEtcd};

const NS: &str = "oracle";
const JSON: &str = "application/json";
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";

/// One resource of `config/kubernetes.toml`.
#[derive(Clone, Debug)]
struct Resource {
    /// Its etcd key prefix, ending in `/`.
    key_prefix: String,
    protobuf: bool,
    group: String,
    version: String,
    plural: String,
    namespaced: bool,
}

impl Resource {
    fn base(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }
    fn all(&self) -> String {
        format!("{}/{}", self.base(), self.plural)
    }
    fn in_ns(&self, ns: &str) -> String {
        format!("{}/namespaces/{ns}/{}", self.base(), self.plural)
    }
    /// The path of one object.
    fn object(&self, ns: Option<&str>, name: &str) -> String {
        match ns {
            Some(ns) if self.namespaced => format!("{}/{name}", self.in_ns(ns)),
            _ => format!("{}/{name}", self.all()),
        }
    }
}

fn shipped_resources() -> Vec<Resource> {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/kubernetes.toml"),
    )
    .expect("config/kubernetes.toml");
    let cfg = watchcache::config::Config::parse(&text, "config/kubernetes.toml")
        .expect("shipped config parses");
    cfg.resources
        .iter()
        .map(|r| Resource {
            key_prefix: r.key_prefix(&cfg.etcd.prefix),
            protobuf: r.storage_encoding == watchcache::config::StorageEncoding::Protobuf,
            group: r.group.clone(),
            version: r.version.clone(),
            plural: r.plural.clone(),
            namespaced: r.namespaced,
        })
        .collect()
}

/// `config/kubernetes.toml` pointed at a plain-HTTP test etcd: its
/// resources and settings as shipped, TLS to etcd aside.
fn watchcache_config(etcd: &str) -> String {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/kubernetes.toml"),
    )
    .expect("config/kubernetes.toml");
    let mut out = String::new();
    let mut in_tls = false;
    for line in text.lines() {
        if line.starts_with('[') {
            in_tls = line.trim() == "[etcd.tls]";
        }
        if in_tls {
            continue;
        }
        if line.starts_with("endpoints") {
            out.push_str(&format!("endpoints = [\"{etcd}\"]\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// A known difference: `docs/KUBERNETES.md`'s table rows
/// `| resource | where | why |` between the `differences` markers.
/// `resource` is a plural (`pods:write` for objects written through
/// watchcache) or `*`; `where` a JSON path whose segments may be `*`, or
/// under `table/` or `protobuf/`.
struct Known {
    resource: String,
    path: String,
    seen: bool,
}

impl Known {
    /// Its `resource` cell (`*`, or plurals separated by commas) names `resource`.
    fn applies_to(&self, resource: &str) -> bool {
        self.resource
            .split(',')
            .map(|r| r.trim().trim_matches('`'))
            .any(|r| r == "*" || r == resource)
    }
}

fn known_differences(kube_version: &str) -> Vec<Known> {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/KUBERNETES.md"),
    )
    .expect("docs/KUBERNETES.md");
    let start = doc
        .find("<!-- differences:begin -->")
        .expect("docs/KUBERNETES.md has the differences table");
    let end = doc.find("<!-- differences:end -->").expect("end marker");
    doc[start..end]
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---") && !l.starts_with("| resource"))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect::<Vec<&str>>()
        })
        // The `kube` column: `*` or the kube-apiserver minor it applies to.
        .filter(|cells| cells[2] == "*" || cells[2] == kube_version)
        .map(|cells| Known {
            resource: cells[0].trim_matches('`').to_string(),
            path: cells[1].trim_matches('`').to_string(),
            seen: false,
        })
        .collect()
}

fn path_matches(pattern: &str, path: &str) -> bool {
    let p: Vec<&str> = pattern.split('/').collect();
    let q: Vec<&str> = path.split('/').collect();
    // A trailing `**` matches anything below.
    if let Some((&"**", head)) = p.split_last() {
        return q.len() >= head.len() && head.iter().zip(&q).all(|(a, b)| *a == "*" || a == b);
    }
    p.len() == q.len() && p.iter().zip(&q).all(|(a, b)| *a == "*" || a == b)
}

/// Collects the differences between two JSON values as
/// `path: watchcache X, kube-apiserver Y`.
fn diff(path: &str, w: &Value, k: &Value, out: &mut Vec<(String, String)>) {
    match (w, k) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                let p = format!("{path}/{key}");
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => diff(&p, x, y, out),
                    (x, y) => out.push((p, format!("watchcache {x:?}, kube-apiserver {y:?}"))),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                diff(&format!("{path}/{i}"), x, y, out);
            }
        }
        _ if w == k => {}
        _ => {
            let short = |v: &Value| {
                let s = v.to_string();
                if s.len() > 300 {
                    format!("{}...", &s[..300])
                } else {
                    s
                }
            };
            out.push((
                path.to_string(),
                format!("watchcache {}, kube-apiserver {}", short(w), short(k)),
            ))
        }
    }
}

/// The two servers and what the comparison found.
struct Oracle {
    kube: KubeApiserver,
    watchcache: Daemon,
    http: reqwest::Client,
    known: Vec<Known>,
    failures: Vec<String>,
    compared: usize,
}

impl Oracle {
    /// watchcache started with `config/kubernetes.toml` on kube-apiserver's
    /// etcd and encryption config, ready, beside `kube`.
    async fn with_watchcache(
        kube: KubeApiserver,
        etcd: &str,
        encryption: &std::path::Path,
        version: &str,
    ) -> Oracle {
        Oracle::with_watchcache_args(kube, etcd, encryption, version, &[]).await
    }

    /// [`Oracle::with_watchcache`] with more command-line arguments.
    async fn with_watchcache_args(
        kube: KubeApiserver,
        etcd: &str,
        encryption: &std::path::Path,
        version: &str,
        args: &[&str],
    ) -> Oracle {
        let enc = encryption.display().to_string();
        let mut all = vec!["--encryption-provider-config", &enc];
        all.extend_from_slice(args);
        let watchcache = Daemon::start(&watchcache_config(etcd), &all).await;
        watchcache.wait_ready().await;
        Oracle {
            kube,
            watchcache,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .expect("client"),
            known: known_differences(version),
            failures: Vec::new(),
            compared: 0,
        }
    }

    async fn kube_get(&self, path: &str, accept: &str) -> (u16, Vec<u8>) {
        let r = self
            .kube
            .http
            .get(self.kube.url(path))
            .header("accept", accept)
            .send()
            .await
            .expect("kube-apiserver GET");
        (r.status().as_u16(), r.bytes().await.expect("body").to_vec())
    }

    async fn wc_get(&self, path: &str, accept: &str) -> (u16, Vec<u8>) {
        let r = self
            .http
            .get(self.watchcache.url(path))
            .header("accept", accept)
            .send()
            .await
            .expect("watchcache GET");
        (r.status().as_u16(), r.bytes().await.expect("body").to_vec())
    }

    /// Records the differences of one comparison, less the known ones.
    fn record(&mut self, resource: &str, what: &str, diffs: Vec<(String, String)>) {
        self.compared += 1;
        for (path, detail) in diffs {
            let known = self
                .known
                .iter_mut()
                .find(|k| k.applies_to(resource) && path_matches(&k.path, &path));
            match known {
                Some(k) => k.seen = true,
                None => self
                    .failures
                    .push(format!("{resource} {what}: {path}: {detail}")),
            }
        }
    }

    /// The same GET to both as JSON: code and body compared as values.
    async fn compare_json(&mut self, resource: &str, wc_path: &str, kube_path: &str) -> Value {
        self.compare_json_as(resource, wc_path, kube_path, JSON)
            .await
    }

    /// [`Oracle::compare_json`] with this `Accept`.
    async fn compare_json_as(
        &mut self,
        resource: &str,
        wc_path: &str,
        kube_path: &str,
        accept: &str,
    ) -> Value {
        let (wc_code, wc_body) = self.wc_get(wc_path, accept).await;
        let (k_code, k_body) = self.kube_get(kube_path, accept).await;
        let parse = |b: &[u8]| {
            serde_json::from_slice::<Value>(b)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(b).into_owned()))
        };
        let (w, k) = (parse(&wc_body), parse(&k_body));
        let mut diffs = Vec::new();
        if wc_code != k_code {
            diffs.push((
                "/code".to_string(),
                format!("watchcache {wc_code}, kube-apiserver {k_code}"),
            ));
        }
        diff("", &w, &k, &mut diffs);
        let what = if accept == JSON {
            format!("GET {wc_path}")
        } else {
            format!("GET {wc_path} ({accept})")
        };
        self.record(resource, &what, diffs);
        w
    }

    /// The same GET to both as protobuf: the same bytes.
    async fn compare_protobuf(&mut self, resource: &str, wc_path: &str, kube_path: &str) {
        self.compare_protobuf_as(resource, wc_path, kube_path, PROTOBUF)
            .await
    }

    /// [`Oracle::compare_protobuf`] with this `Accept`.
    async fn compare_protobuf_as(
        &mut self,
        resource: &str,
        wc_path: &str,
        kube_path: &str,
        accept: &str,
    ) {
        let (wc_code, wc_body) = self.wc_get(wc_path, accept).await;
        let (k_code, k_body) = self.kube_get(kube_path, accept).await;
        let mut diffs = Vec::new();
        if wc_code != k_code {
            diffs.push((
                "protobuf/code".to_string(),
                format!("watchcache {wc_code}, kube-apiserver {k_code}"),
            ));
        } else if wc_body != k_body {
            let at = wc_body
                .iter()
                .zip(&k_body)
                .take_while(|(a, b)| a == b)
                .count();
            diffs.push((
                "protobuf/bytes".to_string(),
                format!(
                    "differ at byte {at} (watchcache {} bytes, kube-apiserver {})",
                    wc_body.len(),
                    k_body.len()
                ),
            ));
        }
        self.record(resource, &format!("GET {wc_path} ({accept})"), diffs);
    }

    /// The same List as a Table: the same columns and cells, the Age
    /// column aside (it is the time of the request).
    async fn compare_table(&mut self, resource: &str, wc_path: &str, kube_path: &str) {
        let (wc_code, wc_body) = self.wc_get(wc_path, TABLE).await;
        let (k_code, k_body) = self.kube_get(kube_path, TABLE).await;
        let parse = |b: &[u8]| serde_json::from_slice::<Value>(b).unwrap_or(Value::Null);
        let (mut w, mut k) = (parse(&wc_body), parse(&k_body));
        for t in [&mut w, &mut k] {
            let age = t["columnDefinitions"]
                .as_array()
                .and_then(|c| c.iter().position(|c| c["name"] == "Age"));
            if let (Some(age), Some(rows)) = (age, t["rows"].as_array_mut()) {
                for row in rows {
                    if let Some(cells) = row["cells"].as_array_mut() {
                        cells[age] = Value::Null;
                    }
                }
            }
        }
        let mut diffs = Vec::new();
        if wc_code != k_code {
            diffs.push((
                "table/code".to_string(),
                format!("watchcache {wc_code}, kube-apiserver {k_code}"),
            ));
        }
        diff("table", &w, &k, &mut diffs);
        self.record(resource, &format!("GET {wc_path} (Table)"), diffs);
    }

    /// A List and its variants at the revision watchcache answered at.
    async fn compare_list(&mut self, resource: &str, path: &str, query: &str) -> Value {
        let sep = |p: &str| if p.contains('?') { '&' } else { '?' };
        let wc_path = if query.is_empty() {
            path.to_string()
        } else {
            format!("{path}?{query}")
        };
        let (_, wc_body) = self.wc_get(&wc_path, JSON).await;
        let w: Value = serde_json::from_slice(&wc_body).unwrap_or(Value::Null);
        let Some(rv) = w["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_string)
        else {
            self.failures.push(format!(
                "{resource}: GET {wc_path}: no resourceVersion in {}",
                String::from_utf8_lossy(&wc_body)
            ));
            return Value::Null;
        };
        let exact = format!("resourceVersion={rv}&resourceVersionMatch=Exact");
        let wc_exact = format!("{wc_path}{}{exact}", sep(&wc_path));
        self.compare_json(resource, &wc_exact, &wc_exact).await;
        self.compare_table(resource, &wc_exact, &wc_exact).await;
        w
    }

    /// Both Lists page by page (`limit=2`), each server following its own
    /// continue tokens: the same items, remainingItemCount and ends.
    async fn compare_pages(&mut self, resource: &str, path: &str) {
        let (_, body) = self.wc_get(path, JSON).await;
        let w: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let Some(rv) = w["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_string)
        else {
            return;
        };
        let sep = if path.contains('?') { '&' } else { '?' };
        let mut wc_next =
            format!("{path}{sep}limit=2&resourceVersion={rv}&resourceVersionMatch=Exact");
        let mut k_next = wc_next.clone();
        for page in 0..100 {
            let (_, wb) = self.wc_get(&wc_next, JSON).await;
            let (_, kb) = self.kube_get(&k_next, JSON).await;
            let mut w: Value = serde_json::from_slice(&wb).unwrap_or(Value::Null);
            let mut k: Value = serde_json::from_slice(&kb).unwrap_or(Value::Null);
            let wc_cont = w["metadata"]["continue"].as_str().map(str::to_string);
            let k_cont = k["metadata"]["continue"].as_str().map(str::to_string);
            // The tokens are each server's own; whether there is one is compared.
            for v in [&mut w, &mut k] {
                if let Some(m) = v["metadata"].as_object_mut()
                    && m.contains_key("continue")
                {
                    m.insert("continue".into(), json!("<token>"));
                }
            }
            let mut diffs = Vec::new();
            diff("", &w, &k, &mut diffs);
            self.record(resource, &format!("GET {path} page {page}"), diffs);
            match (wc_cont, k_cont) {
                (Some(a), Some(b)) => {
                    wc_next = format!("{path}{sep}limit=2&continue={a}");
                    k_next = format!("{path}{sep}limit=2&continue={b}");
                }
                _ => return,
            }
        }
    }
}

fn names(list: &Value) -> Vec<(Option<String>, String)> {
    list["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|i| {
                    let m = &i["metadata"];
                    Some((
                        m["namespace"].as_str().map(str::to_string),
                        m["name"].as_str()?.to_string(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A realistic cluster written through kube-apiserver: a namespace with
/// objects of most built-in kinds, labels, updates, deletes, a server-side
/// apply (managedFields), a sealed Secret and ConfigMap, a CRD.
async fn populate(k: &KubeApiserver) {
    let labels = |app: &str| json!({"app": app, "tier": "oracle"});
    k.create(
        "/api/v1/namespaces",
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "labels": {"team": "oracle"}}}),
    )
    .await;
    let ns = |p: &str| format!("/api/v1/namespaces/{NS}/{p}");
    let nsg = |g: &str, p: &str| format!("/apis/{g}/namespaces/{NS}/{p}");
    for (name, app) in [("cm-a", "web"), ("cm-b", "db"), ("cm-c", "web")] {
        k.create(
            &ns("configmaps"),
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels(app)}, "data": {"k": name}}),
        )
        .await;
    }
    // An update and a delete.
    let (code, body) = k
        .send(
            Method::PATCH,
            &ns("configmaps/cm-a"),
            "application/merge-patch+json",
            Some(json!({"data": {"k2": "v2"}}).to_string()),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = k
        .send(Method::DELETE, &ns("configmaps/cm-c"), JSON, None)
        .await;
    assert_eq!(code, 200, "{body}");
    // Server-side apply: managedFields of an Apply manager.
    let (code, body) = k
        .send(
            Method::PATCH,
            &format!("{}?fieldManager=oracle-apply", ns("configmaps/cm-applied")),
            "application/apply-patch+yaml",
            Some(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-applied\n  labels:\n    app: web\ndata:\n  a: b\n"
                    .into(),
            ),
        )
        .await;
    assert_eq!(code, 201, "{body}");
    k.create(
        &ns("secrets"),
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s-a", "labels": labels("web")}, "type": "Opaque", "stringData": {"password": "hunter2"}}),
    )
    .await;
    k.create(
        "/api/v1/nodes",
        &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1", "labels": {"kubernetes.io/hostname": "node-1"}}}),
    )
    .await;
    let pod = |name: &str, app: &str, node: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels(app)},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                "ports": [{"containerPort": 80}], "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}})
    };
    for (name, app, node) in [
        ("p-a", "web", "node-1"),
        ("p-b", "db", "node-1"),
        ("p-c", "web", "node-2"),
        ("p-d", "web", "node-2"),
    ] {
        k.create(&ns("pods"), &pod(name, app, node)).await;
    }
    let (code, body) = k.send(Method::DELETE, &ns("pods/p-d"), JSON, None).await;
    assert_eq!(code, 200, "{body}");
    k.create(
        &ns("services"),
        &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc-a", "labels": labels("web")},
            "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}),
    )
    .await;
    k.create(
        &ns("serviceaccounts"),
        &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sa-a"}}),
    )
    .await;
    k.create(
        "/api/v1/persistentvolumes",
        &json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-a"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/tmp/pv-a"}}}),
    )
    .await;
    k.create(
        &ns("persistentvolumeclaims"),
        &json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "pvc-a"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .await;
    k.create(
        &ns("events"),
        &json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "ev-a"},
            "involvedObject": {"kind": "Pod", "namespace": NS, "name": "p-a"}, "reason": "Oracle", "message": "made by the test", "type": "Normal"}),
    )
    .await;
    k.create(
        &ns("limitranges"),
        &json!({"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "lr-a"},
            "spec": {"limits": [{"type": "Container", "default": {"cpu": "200m"}}]}}),
    )
    .await;
    k.create(
        &ns("resourcequotas"),
        &json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "rq-a"}, "spec": {"hard": {"pods": "10"}}}),
    )
    .await;
    let template = json!({"metadata": {"labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}});
    k.create(
        &ns("podtemplates"),
        &json!({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "pt-a"}, "template": template}),
    )
    .await;
    k.create(
        &ns("replicationcontrollers"),
        &json!({"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "rc-a"},
            "spec": {"replicas": 1, "selector": {"app": "web"}, "template": template}}),
    )
    .await;
    let selector = json!({"matchLabels": {"app": "web"}});
    for (plural, kind, spec) in [
        (
            "deployments",
            "Deployment",
            json!({"replicas": 2, "selector": selector, "template": template}),
        ),
        (
            "replicasets",
            "ReplicaSet",
            json!({"replicas": 1, "selector": selector, "template": template}),
        ),
        (
            "statefulsets",
            "StatefulSet",
            json!({"serviceName": "svc-a", "selector": selector, "template": template}),
        ),
        (
            "daemonsets",
            "DaemonSet",
            json!({"selector": selector, "template": template}),
        ),
    ] {
        k.create(
            &nsg("apps/v1", plural),
            &json!({"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": format!("{plural}-a"), "labels": labels("web")}, "spec": spec}),
        )
        .await;
    }
    k.create(
        &nsg("apps/v1", "controllerrevisions"),
        &json!({"apiVersion": "apps/v1", "kind": "ControllerRevision", "metadata": {"name": "cr-a"}, "revision": 1, "data": {"spec": {"a": 1}}}),
    )
    .await;
    let job_template = json!({"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}});
    k.create(
        &nsg("batch/v1", "jobs"),
        &json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "job-a"}, "spec": {"template": job_template}}),
    )
    .await;
    k.create(
        &nsg("batch/v1", "cronjobs"),
        &json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "cj-a"},
            "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": job_template}}}}),
    )
    .await;
    k.create(
        &nsg("autoscaling/v2", "horizontalpodautoscalers"),
        &json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "hpa-a"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "deployments-a"}, "minReplicas": 1, "maxReplicas": 3,
                "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}]}}),
    )
    .await;
    k.create(
        &nsg("policy/v1", "poddisruptionbudgets"),
        &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "pdb-a"}, "spec": {"minAvailable": 1, "selector": selector}}),
    )
    .await;
    k.create(
        "/apis/networking.k8s.io/v1/ingressclasses",
        &json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": "ic-a"}, "spec": {"controller": "example.com/ingress"}}),
    )
    .await;
    k.create(
        &nsg("networking.k8s.io/v1", "ingresses"),
        &json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "ing-a"},
            "spec": {"ingressClassName": "ic-a", "rules": [{"host": "a.example.com", "http": {"paths": [{"path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": "svc-a", "port": {"number": 80}}}}]}}]}}),
    )
    .await;
    k.create(
        &nsg("networking.k8s.io/v1", "networkpolicies"),
        &json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "np-a"},
            "spec": {"podSelector": selector, "policyTypes": ["Ingress"]}}),
    )
    .await;
    k.create(
        &nsg("discovery.k8s.io/v1", "endpointslices"),
        &json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "eps-a", "labels": {"kubernetes.io/service-name": "svc-a"}},
            "addressType": "IPv4", "endpoints": [{"addresses": ["10.1.0.5"], "conditions": {"ready": true}}], "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}),
    )
    .await;
    k.create(
        &nsg("coordination.k8s.io/v1", "leases"),
        &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "lease-a"},
            "spec": {"holderIdentity": "oracle", "leaseDurationSeconds": 15}}),
    )
    .await;
    let rules =
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]);
    k.create(
        &nsg("rbac.authorization.k8s.io/v1", "roles"),
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "role-a"}, "rules": rules}),
    )
    .await;
    k.create(
        &nsg("rbac.authorization.k8s.io/v1", "rolebindings"),
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "rb-a"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "role-a"},
            "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"}]}),
    )
    .await;
    k.create(
        "/apis/storage.k8s.io/v1/storageclasses",
        &json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "sc-a"}, "provisioner": "example.com/disk"}),
    )
    .await;
    k.create(
        "/apis/storage.k8s.io/v1/csidrivers",
        &json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": "disk.example.com"}, "spec": {"attachRequired": true}}),
    )
    .await;
    k.create(
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        &json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "pc-a"}, "value": 1000, "description": "oracle"}),
    )
    .await;
    k.create(
        "/apis/node.k8s.io/v1/runtimeclasses",
        &json!({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "rtc-a"}, "handler": "runc"}),
    )
    .await;
    k.create(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        &json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": "widgets.oracle.example.com"},
            "spec": {"group": "oracle.example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object", "properties": {"size": {"type": "integer", "maximum": 65535}}}}}}}]}}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchcache_serves_what_kube_apiserver_1_34_serves() {
    oracle("1.34").await;
}

/// The newest release: Kubernetes 1.37.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchcache_serves_what_kube_apiserver_1_37_serves() {
    oracle("1.37").await;
}

/// The differential test against kube-apiserver `version` (a peer of
/// `scripts/peers.sh`), the rows of the differences table for it.
async fn oracle(version: &str) {
    let binary = peer(&format!("kube-apiserver-{version}"));
    let etcd = PrivateEtcd::start().await.expect("start etcd");
    let dir = tempfile::tempdir().expect("tempdir");
    let encryption = write_encryption_config(dir.path());
    let kube = KubeApiserver::start(&binary, &etcd.endpoint(), "/registry", &encryption, &[]).await;
    populate(&kube).await;
    populate_printed_pods(&kube).await;

    let mut o = Oracle::with_watchcache(kube, &etcd.endpoint(), &encryption, version).await;

    for r in shipped_resources() {
        let res = r.plural.as_str();
        let all = o.compare_list(res, &r.all(), "").await;
        o.compare_list(res, &r.all(), "labelSelector=app%3Dweb")
            .await;
        o.compare_list(
            res,
            &r.all(),
            "labelSelector=tier%20in%20(oracle),app!%3Ddb",
        )
        .await;
        if r.namespaced {
            o.compare_list(res, &r.in_ns(NS), "").await;
        }
        o.compare_pages(res, &r.all()).await;
        // kube-apiserver stores built-in types as protobuf (and an
        // APIService as JSON): the shipped config writes what it writes.
        if let Some((ns, name)) = names(&all).into_iter().next()
            && r.plural != "secrets"
            && r.plural != "configmaps"
        {
            let key = match &ns {
                Some(ns) => format!("{}{ns}/{name}", r.key_prefix),
                None => format!("{}{name}", r.key_prefix),
            };
            let stored = etcd_value(&etcd.endpoint(), &key).await;
            let kube_protobuf = stored.starts_with(b"k8s\0");
            if kube_protobuf != r.protobuf {
                o.failures.push(format!(
                    "{res}: kube-apiserver stored {key} as {}, config/kubernetes.toml writes {}",
                    if kube_protobuf { "protobuf" } else { "JSON" },
                    if r.protobuf { "protobuf" } else { "JSON" },
                ));
            }
        }
        for (ns, name) in names(&all).into_iter().take(4) {
            let path = r.object(ns.as_deref(), &name);
            o.compare_json(res, &path, &path).await;
            o.compare_protobuf(res, &path, &path).await;
            let by_name = format!("fieldSelector=metadata.name%3D{name}");
            o.compare_list(res, &r.all(), &by_name).await;
        }
        // A missing object.
        let missing = r.object(Some(NS), "no-such-object");
        o.compare_json(res, &missing, &missing).await;
    }

    // Errors: a bad selector, an invalid name, a conflict.
    let pods = "/api/v1/namespaces/oracle/pods";
    for q in [
        "labelSelector=a%20in%20(",
        "fieldSelector=spec.nodeName%3D%3D%3Dx",
        "fieldSelector=spec.unknown%3Dx",
    ] {
        let p = format!("{pods}?{q}");
        o.compare_json("pods", &p, &p).await;
    }

    aggregated_discovery(&mut o).await;
    printed_tables(&mut o).await;
    writes_through_watchcache(&mut o, &etcd.endpoint()).await;
    watches_from_the_same_revision(&mut o).await;
    manifests_pass_server_dry_run(&o.kube);
    protobuf_watch_frames_byte_for_byte(&mut o, PROTOBUF).await;
    for version in ["v1", "v1beta1"] {
        let accept = metadata_protobuf("PartialObjectMetadata", version);
        protobuf_watch_frames_byte_for_byte(&mut o, &accept).await;
    }
    partial_object_metadata(&mut o).await;

    let unseen: Vec<String> = o
        .known
        .iter()
        .filter(|k| !k.seen)
        .map(|k| format!("{} {}", k.resource, k.path))
        .collect();
    assert!(o.compared > 200, "only {} comparisons", o.compared);
    assert!(
        o.failures.is_empty(),
        "{} differences from kube-apiserver (of {} comparisons) not listed in docs/KUBERNETES.md:\n{}",
        o.failures.len(),
        o.compared,
        o.failures.join("\n")
    );
    assert!(
        unseen.is_empty(),
        "rows of docs/KUBERNETES.md's differences table that no longer differ (remove them): {unseen:?}"
    );
}

impl Oracle {
    /// Sends a request to watchcache: (status, body as JSON).
    async fn wc_send(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        body: String,
    ) -> (u16, Value) {
        let r = self
            .http
            .request(method, self.watchcache.url(path))
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .expect("watchcache request");
        let code = r.status().as_u16();
        let bytes = r.bytes().await.expect("body");
        (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// The same failing write (a JSON body) to both: the same code and Status.
    async fn compare_write(&mut self, what: &str, method: Method, path: &str, body: String) {
        let (wc_code, wc_status) = self.wc_send(method.clone(), path, JSON, body.clone()).await;
        let (k_code, k_status) = self.kube.send(method, path, JSON, Some(body)).await;
        let mut diffs = Vec::new();
        diff("", &wc_status, &k_status, &mut diffs);
        if wc_code != k_code {
            diffs.push((
                "/code".into(),
                format!("watchcache {wc_code}, kube-apiserver {k_code}"),
            ));
        }
        self.record("configmaps:write", what, diffs);
    }

    /// Once watchcache's cache holds `path` at resourceVersion `rv` or later,
    /// the same Get to both, as JSON and protobuf.
    /// Recorded as `<resource>:write`, the table's name for objects
    /// written through watchcache.
    async fn compare_object(&mut self, resource: &str, path: &str, rv: &str) {
        let at = format!("{path}?resourceVersion={rv}");
        let (code, _) = self.wc_get(&at, JSON).await;
        assert!(code == 200 || code == 404, "GET {at}: {code}");
        let resource = format!("{resource}:write");
        self.compare_json(&resource, path, path).await;
        self.compare_protobuf(&resource, path, path).await;
    }
}

/// kubectl's discovery `Accept` (aggregated v2 first, then the legacy form).
const AGGREGATED: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";

/// A GET with headers to one of the servers: (status, headers, body).
async fn get_with(
    http: &reqwest::Client,
    url: String,
    headers: &[(&str, &str)],
) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
    let mut req = http.get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.expect("GET");
    let (code, h) = (r.status().as_u16(), r.headers().clone());
    (code, h, r.bytes().await.expect("body").to_vec())
}

/// kube-apiserver's ETag rule: the SHA-512 of the list's items without type
/// meta, as Go marshals them: the served items' bytes (the last key of the
/// compact document), after `{"metadata":{},"items":`.
fn discovery_etag(body: &[u8]) -> String {
    use sha2::Digest;
    const ITEMS: &[u8] = b"\"items\":";
    let Some(at) = body.windows(ITEMS.len()).position(|w| w == ITEMS) else {
        return "no items".into();
    };
    let body = body.trim_ascii_end();
    let items = &body[at + ITEMS.len()..body.len().saturating_sub(1)];
    let mut hashed = b"{\"metadata\":{},\"items\":".to_vec();
    hashed.extend_from_slice(items);
    hashed.push(b'}');
    let hex: String = sha2::Sha512::digest(&hashed)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect();
    format!("\"{hex}\"")
}

/// Aggregated discovery (`apidiscovery.k8s.io/v2`) on `/api` and `/apis`:
/// the same groups in the same order, the same versions in order, each
/// resource watchcache serves described as kube-apiserver describes it;
/// the same headers, ETag rule, 304 on `If-None-Match` and 406 for v2beta1
/// alone. Recorded as resource `discovery`, paths
/// `/{api|apis}/{group}/{version}/{resource}/...`.
async fn aggregated_discovery(o: &mut Oracle) {
    for root in ["api", "apis"] {
        let path = format!("/{root}");
        let (wc_code, wc_h, wc_body) =
            get_with(&o.http, o.watchcache.url(&path), &[("accept", AGGREGATED)]).await;
        let (k_code, k_h, k_body) =
            get_with(&o.kube.http, o.kube.url(&path), &[("accept", AGGREGATED)]).await;
        let mut diffs = Vec::new();
        if (wc_code, k_code) != (200, 200) {
            diffs.push((
                format!("/{root}/code"),
                format!("watchcache {wc_code}, kube-apiserver {k_code}"),
            ));
        }
        for h in ["content-type", "vary", "cache-control"] {
            if wc_h.get(h) != k_h.get(h) {
                diffs.push((
                    format!("/{root}/header/{h}"),
                    format!(
                        "watchcache {:?}, kube-apiserver {:?}",
                        wc_h.get(h),
                        k_h.get(h)
                    ),
                ));
            }
        }
        let w: Value = serde_json::from_slice(&wc_body).unwrap_or(Value::Null);
        let k: Value = serde_json::from_slice(&k_body).unwrap_or(Value::Null);
        for (who, body, h) in [
            ("watchcache", &wc_body, &wc_h),
            ("kube-apiserver", &k_body, &k_h),
        ] {
            let etag = h.get("etag").and_then(|v| v.to_str().ok()).unwrap_or("");
            if etag != discovery_etag(body) {
                diffs.push((
                    format!("/{root}/header/etag"),
                    format!("{who}'s ETag {etag} is not the SHA-512 of its document"),
                ));
            }
        }
        for key in ["kind", "apiVersion", "metadata"] {
            diff(&format!("/{root}/{key}"), &w[key], &k[key], &mut diffs);
        }
        let group_name = |g: &Value| g["metadata"]["name"].as_str().unwrap_or("").to_string();
        let empty = Vec::new();
        let wg = w["items"].as_array().unwrap_or(&empty);
        let kg = k["items"].as_array().unwrap_or(&empty);
        let served: Vec<String> = wg.iter().map(group_name).collect();
        let kube_order: Vec<String> = kg
            .iter()
            .map(group_name)
            .filter(|n| served.contains(n))
            .collect();
        if served != kube_order {
            diffs.push((
                format!("/{root}/order"),
                format!("watchcache {served:?}, kube-apiserver {kube_order:?}"),
            ));
        }
        for g in wg {
            let name = group_name(g);
            let Some(kgroup) = kg.iter().find(|x| group_name(x) == name) else {
                diffs.push((
                    format!("/{root}/{name}"),
                    "not served by kube-apiserver".into(),
                ));
                continue;
            };
            diff(
                &format!("/{root}/{name}/metadata"),
                &g["metadata"],
                &kgroup["metadata"],
                &mut diffs,
            );
            let versions =
                |x: &Value| -> Vec<Value> { x["versions"].as_array().cloned().unwrap_or_default() };
            let (wv, kv) = (versions(g), versions(kgroup));
            let wnames: Vec<&Value> = wv.iter().map(|v| &v["version"]).collect();
            let knames: Vec<&Value> = kv
                .iter()
                .map(|v| &v["version"])
                .filter(|v| wnames.contains(v))
                .collect();
            if wnames != knames {
                diffs.push((
                    format!("/{root}/{name}/versions"),
                    format!("watchcache {wnames:?}, kube-apiserver {knames:?}"),
                ));
            }
            for v in &wv {
                let ver = v["version"].as_str().unwrap_or("");
                let Some(kver) = kv.iter().find(|x| x["version"] == v["version"]) else {
                    continue;
                };
                diff(
                    &format!("/{root}/{name}/{ver}/freshness"),
                    &v["freshness"],
                    &kver["freshness"],
                    &mut diffs,
                );
                let rs = |x: &Value| x["resources"].as_array().cloned().unwrap_or_default();
                let (wr, kr) = (rs(v), rs(kver));
                for r in &wr {
                    let res = r["resource"].as_str().unwrap_or("");
                    let p = format!("/{root}/{name}/{ver}/{res}");
                    match kr.iter().find(|x| x["resource"] == r["resource"]) {
                        Some(x) => diff(&p, r, x, &mut diffs),
                        None => diffs.push((p, "not served by kube-apiserver".into())),
                    }
                }
                let wnames: Vec<&Value> = wr.iter().map(|r| &r["resource"]).collect();
                let knames: Vec<&Value> = kr
                    .iter()
                    .map(|r| &r["resource"])
                    .filter(|r| wnames.contains(r))
                    .collect();
                if wnames != knames {
                    diffs.push((
                        format!("/{root}/{name}/{ver}/order"),
                        format!("watchcache {wnames:?}, kube-apiserver {knames:?}"),
                    ));
                }
            }
        }
        // A client's cached copy: 304 from both with the ETag each sent.
        for (who, http, url, h) in [
            ("watchcache", &o.http, o.watchcache.url(&path), &wc_h),
            ("kube-apiserver", &o.kube.http, o.kube.url(&path), &k_h),
        ] {
            let etag = h
                .get("etag")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("none");
            let (code, _, body) = get_with(
                http,
                url,
                &[("accept", AGGREGATED), ("if-none-match", etag)],
            )
            .await;
            if code != 304 || !body.is_empty() {
                diffs.push((
                    format!("/{root}/if-none-match"),
                    format!("{who}: {code}, {} bytes", body.len()),
                ));
            }
        }
        // v2beta1 alone: removed in 1.33, 406 from both with the same Status.
        let beta = [(
            "accept",
            "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
        )];
        let (wc_code, _, wc_body) = get_with(&o.http, o.watchcache.url(&path), &beta).await;
        let (k_code, _, k_body) = get_with(&o.kube.http, o.kube.url(&path), &beta).await;
        if wc_code != k_code {
            diffs.push((
                format!("/{root}/v2beta1/code"),
                format!("watchcache {wc_code}, kube-apiserver {k_code}"),
            ));
        }
        let parse = |b: &[u8]| serde_json::from_slice::<Value>(b).unwrap_or(Value::Null);
        diff(
            &format!("/{root}/v2beta1"),
            &parse(&wc_body),
            &parse(&k_body),
            &mut diffs,
        );
        o.record("discovery", "aggregated discovery", diffs);
    }
}

/// The raw value etcd holds at `key`.
async fn etcd_value(endpoint: &str, key: &str) -> Vec<u8> {
    let mut c = etcd_client::Client::connect([endpoint], None)
        .await
        .expect("etcd client");
    let r = c.get(key, None).await.expect("etcd get");
    r.kvs()
        .first()
        .map(|kv| kv.value().to_vec())
        .unwrap_or_default()
}

/// Writes through watchcache (create, update, JSON, merge and strategic
/// merge patches, server-side apply, delete) read back the same through
/// kube-apiserver, and are stored as kube-apiserver stores them: protobuf
/// for built-in types, sealed by the first provider of the shared
/// encryption config. Errors (conflict, invalid name) get the same Status.
async fn writes_through_watchcache(o: &mut Oracle, etcd: &str) {
    let cms = format!("/api/v1/namespaces/{NS}/configmaps");
    let cm = |rv: Option<&str>, data: Value| {
        let mut v = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "wc-cm", "labels": {"app": "web"}}, "data": data});
        if let Some(rv) = rv {
            v["metadata"]["resourceVersion"] = json!(rv);
        }
        v.to_string()
    };
    let rv_of = |v: &Value| {
        v["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };

    let (code, created) = o
        .wc_send(Method::POST, &cms, JSON, cm(None, json!({"a": "1"})))
        .await;
    assert_eq!(code, 201, "{created}");
    let path = format!("{cms}/wc-cm");
    o.compare_object("configmaps", &path, &rv_of(&created))
        .await;
    let stored = etcd_value(etcd, &format!("/registry/configmaps/{NS}/wc-cm")).await;
    assert!(
        stored.starts_with(b"k8s:enc:secretbox:v1:key1:"),
        "a ConfigMap written through watchcache is sealed as kube-apiserver seals it: {:?}",
        String::from_utf8_lossy(&stored[..stored.len().min(40)])
    );

    let (code, updated) = o
        .wc_send(
            Method::PUT,
            &path,
            JSON,
            cm(Some(&rv_of(&created)), json!({"a": "2"})),
        )
        .await;
    assert_eq!(code, 200, "{updated}");
    o.compare_object("configmaps", &path, &rv_of(&updated))
        .await;
    // The same stale update to both: 409 Conflict with the same Status.
    let stale = cm(Some(&rv_of(&created)), json!({"a": "3"}));
    o.compare_write("stale PUT", Method::PUT, &path, stale)
        .await;

    for (content_type, patch) in [
        (
            "application/json-patch+json",
            json!([{"op": "add", "path": "/data/b", "value": "x"}]),
        ),
        (
            "application/merge-patch+json",
            json!({"metadata": {"labels": {"merged": "yes"}}}),
        ),
        (
            "application/strategic-merge-patch+json",
            json!({"data": {"c": "y"}}),
        ),
    ] {
        let (code, patched) = o
            .wc_send(Method::PATCH, &path, content_type, patch.to_string())
            .await;
        assert_eq!(code, 200, "{content_type}: {patched}");
        o.compare_object("configmaps", &path, &rv_of(&patched))
            .await;
    }
    let apply = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: wc-applied\ndata:\n  k: v\n";
    let (code, applied) = o
        .wc_send(
            Method::PATCH,
            &format!("{cms}/wc-applied?fieldManager=oracle"),
            "application/apply-patch+yaml",
            apply.into(),
        )
        .await;
    assert_eq!(code, 201, "{applied}");
    o.compare_object("configmaps", &format!("{cms}/wc-applied"), &rv_of(&applied))
        .await;

    let secrets = format!("/api/v1/namespaces/{NS}/secrets");
    let (code, secret) = o
        .wc_send(
            Method::POST,
            &secrets,
            JSON,
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "wc-secret"}, "stringData": {"token": "t0ps3cret"}})
                .to_string(),
        )
        .await;
    assert_eq!(code, 201, "{secret}");
    o.compare_object("secrets", &format!("{secrets}/wc-secret"), &rv_of(&secret))
        .await;
    let stored = etcd_value(etcd, &format!("/registry/secrets/{NS}/wc-secret")).await;
    assert!(
        stored.starts_with(b"k8s:enc:aesgcm:v1:key1:"),
        "a Secret written through watchcache is sealed with aesgcm"
    );

    let pods = format!("/api/v1/namespaces/{NS}/pods");
    let (code, pod) = o
        .wc_send(
            Method::POST,
            &pods,
            JSON,
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "wc-pod", "labels": {"app": "web"}},
                "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}})
                .to_string(),
        )
        .await;
    assert_eq!(code, 201, "{pod}");
    let pod_path = format!("{pods}/wc-pod");
    o.compare_object("pods", &pod_path, &rv_of(&pod)).await;
    let stored = etcd_value(etcd, &format!("/registry/pods/{NS}/wc-pod")).await;
    assert!(
        stored.starts_with(b"k8s\0"),
        "a Pod written through watchcache is stored as protobuf, as kube-apiserver stores it"
    );
    let (code, patched) = o
        .wc_send(
            Method::PATCH,
            &pod_path,
            "application/strategic-merge-patch+json",
            json!({"spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.9"}]}})
                .to_string(),
        )
        .await;
    assert_eq!(code, 200, "{patched}");
    o.compare_object("pods", &pod_path, &rv_of(&patched)).await;
    let (code, deleted) = o
        .wc_send(Method::DELETE, &pod_path, JSON, String::new())
        .await;
    assert_eq!(code, 200, "{deleted}");
    o.compare_object("pods", &pod_path, &rv_of(&deleted)).await;

    // An invalid name: 422 with the same Status from both.
    let bad = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "Not_Valid"}})
        .to_string();
    o.compare_write("invalid name", Method::POST, &cms, bad)
        .await;
}

/// Reads watch event lines from a response until `count` events (bookmarks
/// included) or 30 s.
async fn read_events(resp: reqwest::Response, count: usize) -> Vec<Value> {
    use futures::StreamExt;
    let mut stream = resp.bytes_stream();
    let mut buf = Vec::new();
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while events.len() < count {
        let next = tokio::time::timeout_at(deadline, stream.next()).await;
        let Ok(Some(Ok(chunk))) = next else { break };
        buf.extend_from_slice(&chunk);
        while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            if let Ok(v) = serde_json::from_slice::<Value>(&line) {
                events.push(v);
            }
        }
    }
    events
}

impl Oracle {
    /// The client and URL of `path` on kube-apiserver (`kube`) or watchcache.
    fn client_for(&self, kube: bool, path: &str) -> (&reqwest::Client, String) {
        if kube {
            (&self.kube.http, self.kube.url(path))
        } else {
            (&self.http, self.watchcache.url(path))
        }
    }

    async fn open_watch(&self, kube: bool, path: &str) -> reqwest::Response {
        self.open_watch_as(kube, path, JSON).await
    }

    async fn open_watch_as(&self, kube: bool, path: &str, accept: &str) -> reqwest::Response {
        let (client, url) = self.client_for(kube, path);
        let r = client
            .get(url)
            .header("accept", accept)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .expect("watch");
        assert_eq!(r.status(), 200, "watch {path}");
        r
    }
}

/// Watches from the same resourceVersion on both while kube-apiserver
/// writes: the same events in the same order. A `sendInitialEvents` stream
/// (client-go's WatchList): the same initial objects, then a bookmark
/// marking their end at a revision not older than the List's.
async fn watches_from_the_same_revision(o: &mut Oracle) {
    let cms = format!("/api/v1/namespaces/{NS}/configmaps");
    let (_, body) = o.wc_get(&cms, JSON).await;
    let list: Value = serde_json::from_slice(&body).expect("list");
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();
    let path = format!("{cms}?watch=1&resourceVersion={rv}");
    let wc = o.open_watch(false, &path).await;
    let kube = o.open_watch(true, &path).await;
    let cm = |name: &str, v: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": {"app": "watch"}}, "data": {"v": v}});
    o.kube.create(&cms, &cm("watched-1", "1")).await;
    let (code, body) = o
        .kube
        .send(
            Method::PATCH,
            &format!("{cms}/watched-1"),
            "application/merge-patch+json",
            Some(json!({"data": {"v": "2"}}).to_string()),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    o.kube.create(&cms, &cm("watched-2", "1")).await;
    let (code, body) = o
        .kube
        .send(Method::DELETE, &format!("{cms}/watched-1"), JSON, None)
        .await;
    assert_eq!(code, 200, "{body}");
    let (w, k) = tokio::join!(read_events(wc, 4), read_events(kube, 4));
    assert_eq!(k.len(), 4, "kube-apiserver's watch events: {k:?}");
    let mut diffs = Vec::new();
    diff("", &Value::Array(w), &Value::Array(k), &mut diffs);
    o.record("configmaps", &format!("watch {path}"), diffs);

    // A streaming list: initial events, then the bookmark that ends them.
    let (_, body) = o.wc_get(&cms, JSON).await;
    let list: Value = serde_json::from_slice(&body).expect("list");
    let list_rv: i64 = list["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("rv");
    let items = list["items"].as_array().map_or(0, Vec::len);
    let path = format!(
        "{cms}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
    );
    let wc = o.open_watch(false, &path).await;
    let kube = o.open_watch(true, &path).await;
    let (w, k) = tokio::join!(read_events(wc, items + 1), read_events(kube, items + 1));
    let split = |events: Vec<Value>| {
        let mut initial = Vec::new();
        let mut end = None;
        for e in events {
            if e["type"] == "BOOKMARK" {
                if e["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true" {
                    end = e["object"]["metadata"]["resourceVersion"]
                        .as_str()
                        .and_then(|s| s.parse::<i64>().ok());
                }
            } else {
                initial.push(e);
            }
        }
        (initial, end)
    };
    let ((w_initial, w_end), (k_initial, k_end)) = (split(w), split(k));
    let mut diffs = Vec::new();
    diff(
        "/initial",
        &Value::Array(w_initial),
        &Value::Array(k_initial),
        &mut diffs,
    );
    for (who, end) in [("watchcache", w_end), ("kube-apiserver", k_end)] {
        if end.is_none_or(|rv| rv < list_rv) {
            diffs.push((
                format!("/bookmark/{who}"),
                format!("initial-events-end bookmark at {end:?}, the List was at {list_rv}"),
            ));
        }
    }
    o.record("configmaps", &format!("watch {path}"), diffs);
}

/// A metadata client's JSON `Accept`.
fn metadata_accept(kind: &str, version: &str) -> String {
    format!("application/json;as={kind};g=meta.k8s.io;v={version}")
}

/// A metadata client's protobuf `Accept` (client-go's `metadata` package).
fn metadata_protobuf(kind: &str, version: &str) -> String {
    format!("{PROTOBUF};as={kind};g=meta.k8s.io;v={version}")
}

/// `PartialObjectMetadata` Gets, Lists (selected, paged) and watches
/// (from a revision; a streaming list with its bookmark), meta.k8s.io v1
/// and v1beta1, for every shipped resource: the same as kube-apiserver's.
async fn partial_object_metadata(o: &mut Oracle) {
    for r in shipped_resources() {
        let res = r.plural.as_str();
        let (_, body) = o.wc_get(&r.all(), JSON).await;
        let all: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let Some(rv) = all["metadata"]["resourceVersion"].as_str() else {
            o.failures.push(format!("{res}: no List resourceVersion"));
            continue;
        };
        let exact = format!("resourceVersion={rv}&resourceVersionMatch=Exact");
        for version in ["v1", "v1beta1"] {
            let list = metadata_accept("PartialObjectMetadataList", version);
            for q in ["", "&labelSelector=app%3Dweb", "&limit=2"] {
                let p = format!("{}?{exact}{q}", r.all());
                if q.contains("limit") {
                    // The continue tokens are each server's own.
                    let (_, wb) = o.wc_get(&p, &list).await;
                    let (_, kb) = o.kube_get(&p, &list).await;
                    let mut w: Value = serde_json::from_slice(&wb).unwrap_or(Value::Null);
                    let mut k: Value = serde_json::from_slice(&kb).unwrap_or(Value::Null);
                    for v in [&mut w, &mut k] {
                        if let Some(m) = v["metadata"].as_object_mut()
                            && m.contains_key("continue")
                        {
                            m.insert("continue".into(), json!("<token>"));
                        }
                    }
                    let mut diffs = Vec::new();
                    diff("", &w, &k, &mut diffs);
                    o.record(res, &format!("GET {p} ({list})"), diffs);
                } else {
                    o.compare_json_as(res, &p, &p, &list).await;
                }
            }
            let p = format!("{}?{exact}", r.all());
            let list_pb = metadata_protobuf("PartialObjectMetadataList", version);
            o.compare_protobuf_as(res, &p, &p, &list_pb).await;
            let one = metadata_accept("PartialObjectMetadata", version);
            let one_pb = metadata_protobuf("PartialObjectMetadata", version);
            for (ns, name) in names(&all).into_iter().take(2) {
                let path = r.object(ns.as_deref(), &name);
                o.compare_json_as(res, &path, &path, &one).await;
                o.compare_protobuf_as(res, &path, &path, &one_pb).await;
                // The List form for a Get, and the object form for a List:
                // kube-apiserver's 406.
                o.compare_json_as(res, &path, &path, &list).await;
            }
            let p = format!("{}?{exact}", r.all());
            o.compare_json_as(res, &p, &p, &one).await;
        }
    }
    metadata_watches(o).await;
}

/// Metadata watches of ConfigMaps on both: from one revision while
/// kube-apiserver writes, and a streaming list with bookmarks.
async fn metadata_watches(o: &mut Oracle) {
    let cms = format!("/api/v1/namespaces/{NS}/configmaps");
    for version in ["v1", "v1beta1"] {
        let accept = metadata_accept("PartialObjectMetadata", version);
        let (_, body) = o.wc_get(&cms, JSON).await;
        let list: Value = serde_json::from_slice(&body).expect("list");
        let rv = list["metadata"]["resourceVersion"]
            .as_str()
            .expect("rv")
            .to_string();
        let path = format!("{cms}?watch=1&resourceVersion={rv}&allowWatchBookmarks=true");
        let wc = o.open_watch_as(false, &path, &accept).await;
        let kube = o.open_watch_as(true, &path, &accept).await;
        let name = format!("meta-watched-{version}");
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {"app": "watch"}}, "data": {"v": "1"}});
        o.kube.create(&cms, &cm).await;
        let (code, body) = o
            .kube
            .send(
                Method::PATCH,
                &format!("{cms}/{name}"),
                "application/merge-patch+json",
                Some(json!({"metadata": {"annotations": {"a": "b"}}}).to_string()),
            )
            .await;
        assert_eq!(code, 200, "{body}");
        let (code, body) = o
            .kube
            .send(Method::DELETE, &format!("{cms}/{name}"), JSON, None)
            .await;
        assert_eq!(code, 200, "{body}");
        let (w, k) = tokio::join!(read_events(wc, 3), read_events(kube, 3));
        assert_eq!(k.len(), 3, "kube-apiserver's watch events: {k:?}");
        // Bookmarks come when each server sends them: compared apart.
        let changes = |evs: Vec<Value>| -> Vec<Value> {
            evs.into_iter()
                .filter(|e| e["type"] != "BOOKMARK")
                .collect()
        };
        let mut diffs = Vec::new();
        diff(
            "",
            &Value::Array(changes(w)),
            &Value::Array(changes(k)),
            &mut diffs,
        );
        o.record("configmaps", &format!("watch {path} ({accept})"), diffs);

        // A streaming list: the initial objects' metadata, then the
        // bookmark that ends them, in the same form.
        let (_, body) = o.wc_get(&cms, JSON).await;
        let list: Value = serde_json::from_slice(&body).expect("list");
        let items = list["items"].as_array().map_or(0, Vec::len);
        let path = format!(
            "{cms}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
        );
        let wc = o.open_watch_as(false, &path, &accept).await;
        let kube = o.open_watch_as(true, &path, &accept).await;
        let (w, k) = tokio::join!(read_events(wc, items + 1), read_events(kube, items + 1));
        let shape = |evs: Vec<Value>| -> Vec<Value> {
            evs.into_iter()
                .map(|mut e| {
                    if e["type"] == "BOOKMARK"
                        && let Some(m) = e["object"]["metadata"].as_object_mut()
                    {
                        // Each server's own revision: the form is compared.
                        m.insert("resourceVersion".into(), json!("<rv>"));
                    }
                    e
                })
                .collect()
        };
        let mut diffs = Vec::new();
        diff(
            "/initial",
            &Value::Array(shape(w)),
            &Value::Array(shape(k)),
            &mut diffs,
        );
        o.record("configmaps", &format!("watch {path} ({accept})"), diffs);
    }
}

/// Reads `count` frames of a protobuf watch stream (4-byte big-endian
/// length, then the frame), or what came within 30 s.
async fn read_frames(resp: reqwest::Response, count: usize) -> Vec<Vec<u8>> {
    use futures::StreamExt;
    let mut stream = resp.bytes_stream();
    let mut buf = Vec::new();
    let mut frames = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while frames.len() < count {
        while buf.len() >= 4 {
            let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            if buf.len() < 4 + len {
                break;
            }
            frames.push(buf[4..4 + len].to_vec());
            buf.drain(..4 + len);
        }
        if frames.len() >= count {
            break;
        }
        let next = tokio::time::timeout_at(deadline, stream.next()).await;
        let Ok(Some(Ok(chunk))) = next else { break };
        buf.extend_from_slice(&chunk);
    }
    frames
}

/// Protobuf watches from the same resourceVersion on both while
/// kube-apiserver writes: the same frames, byte for byte. Each is a bare
/// `meta.v1.WatchEvent` (kube-apiserver's raw stream serializer, what
/// client-go decodes), its object in the full `k8s\0` encoding. `accept`
/// asks for the objects or their `PartialObjectMetadata`.
async fn protobuf_watch_frames_byte_for_byte(o: &mut Oracle, accept: &str) {
    use watchcache::object::protobuf as pb;
    let cms = format!("/api/v1/namespaces/{NS}/configmaps");
    let (_, body) = o.wc_get(&cms, JSON).await;
    let list: Value = serde_json::from_slice(&body).expect("list");
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();
    let path = format!("{cms}?watch=1&resourceVersion={rv}");
    let open = |kube: bool| {
        let (client, url) = o.client_for(kube, &path);
        client
            .get(url)
            .header("accept", accept)
            .timeout(Duration::from_secs(60))
            .send()
    };
    let (wc, kube) = tokio::join!(open(false), open(true));
    let (wc, kube) = (wc.expect("watchcache watch"), kube.expect("kube watch"));
    let mut diffs = Vec::new();
    for (who, r) in [("watchcache", &wc), ("kube-apiserver", &kube)] {
        let ct = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if r.status() != 200 || ct != "application/vnd.kubernetes.protobuf;stream=watch" {
            diffs.push((
                format!("protobuf/watch/{who}"),
                format!("{} {ct}", r.status()),
            ));
        }
    }
    let cm = |name: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": "1"}});
    o.kube.create(&cms, &cm("framed")).await;
    let (code, body) = o
        .kube
        .send(
            Method::PATCH,
            &format!("{cms}/framed"),
            "application/merge-patch+json",
            Some(json!({"data": {"v": "2"}}).to_string()),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = o
        .kube
        .send(Method::DELETE, &format!("{cms}/framed"), JSON, None)
        .await;
    assert_eq!(code, 200, "{body}");
    let (w, k) = tokio::join!(read_frames(wc, 3), read_frames(kube, 3));
    assert_eq!(k.len(), 3, "kube-apiserver's protobuf watch frames");
    for (i, kf) in k.iter().enumerate() {
        assert!(
            !kf.starts_with(pb::MAGIC),
            "kube-apiserver's frame {i} is a bare WatchEvent"
        );
        match w.get(i) {
            Some(wf) if wf == kf => {}
            Some(wf) => {
                let mut d = Vec::new();
                let decode = |f: &[u8]| {
                    pb::decode_watch_event(f).unwrap_or_else(|e| Value::String(e.to_string()))
                };
                diff("", &decode(wf), &decode(kf), &mut d);
                diffs.push((
                    format!("protobuf/watch/{i}"),
                    format!(
                        "{} bytes, kube-apiserver {} bytes; decoded: {d:?}",
                        wf.len(),
                        kf.len()
                    ),
                ));
            }
            None => diffs.push((format!("protobuf/watch/{i}"), "missing".into())),
        }
    }
    o.record("configmaps", &format!("watch {path} ({accept})"), diffs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_too_old_resource_version_is_answered_as_kube_apiserver_1_34_does() {
    too_old_resource_version("1.34").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_too_old_resource_version_is_answered_as_kube_apiserver_1_37_does() {
    too_old_resource_version("1.37").await;
}

/// A resourceVersion older than both caches and compacted in etcd: a watch
/// and an Exact List from it get the same code, reason and message (numbers
/// aside: each names its own oldest revision) from both. etcd is 50
/// revisions in before kube-apiserver starts, so that its watch cache (which
/// keeps every event since it started) begins after revision 10.
async fn too_old_resource_version(version: &str) {
    let binary = peer(&format!("kube-apiserver-{version}"));
    let etcd = PrivateEtcd::start().await.expect("start etcd");
    let mut c = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .expect("etcd client");
    for i in 0..50 {
        c.put(format!("/unrelated/{i}"), "x", None)
            .await
            .expect("etcd put");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let encryption = write_encryption_config(dir.path());
    let kube = KubeApiserver::start(&binary, &etcd.endpoint(), "/registry", &encryption, &[]).await;
    let mut o = Oracle::with_watchcache(kube, &etcd.endpoint(), &encryption, version).await;
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}});
    o.kube.create("/api/v1/namespaces", &ns).await;
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "old"}, "data": {"v": "1"}});
    o.kube
        .create(&format!("/api/v1/namespaces/{NS}/configmaps"), &cm)
        .await;
    common::compact_etcd(&etcd.endpoint()).await;
    // The shape of a Status: its code, reason, status and message with
    // every number as N.
    let shape = |code: u16, status: &Value| {
        let message = status["message"].as_str().unwrap_or("");
        let mut m = String::new();
        let mut in_number = false;
        for ch in message.chars() {
            if ch.is_ascii_digit() {
                if !in_number {
                    m.push('N');
                }
                in_number = true;
            } else {
                m.push(ch);
                in_number = false;
            }
        }
        json!({"httpCode": code, "kind": status["kind"], "status": status["status"],
            "reason": status["reason"], "code": status["code"], "message": m})
    };
    let cms = format!("/api/v1/namespaces/{NS}/configmaps");
    // A watch: kube-apiserver answers 200 and an ERROR event.
    let path = format!("{cms}?watch=1&resourceVersion=10");
    let mut answers = Vec::new();
    for kube in [false, true] {
        let (client, url) = o.client_for(kube, &path);
        let r = client
            .get(url)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .expect("watch");
        let code = r.status().as_u16();
        let answer = if code == 200 {
            let events = read_events(r, 1).await;
            let event = events.first().cloned().unwrap_or(Value::Null);
            json!({"type": event["type"], "status": shape(code, &event["object"])})
        } else {
            let body = r.bytes().await.unwrap_or_default();
            let status = serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null);
            json!({"type": null, "status": shape(code, &status)})
        };
        answers.push(answer);
    }
    let mut diffs = Vec::new();
    diff("", &answers[0], &answers[1], &mut diffs);
    if answers[1]["type"] != "ERROR" || answers[1]["status"]["code"] != 410 {
        diffs.push(("/kube".into(), format!("kube-apiserver: {}", answers[1])));
    }
    o.record("configmaps", &format!("watch {path}"), diffs);
    // An Exact List.
    let path = format!("{cms}?resourceVersion=10&resourceVersionMatch=Exact");
    let (wc_code, wc_body) = o.wc_get(&path, JSON).await;
    let (k_code, k_body) = o.kube_get(&path, JSON).await;
    let parse = |b: &[u8]| serde_json::from_slice::<Value>(b).unwrap_or(Value::Null);
    let mut diffs = Vec::new();
    diff(
        "",
        &shape(wc_code, &parse(&wc_body)),
        &shape(k_code, &parse(&k_body)),
        &mut diffs,
    );
    if k_code != 410 {
        diffs.push(("/kube".into(), format!("kube-apiserver answered {k_code}")));
    }
    o.record("configmaps", &format!("GET {path}"), diffs);
    assert!(
        o.failures.is_empty(),
        "differences from kube-apiserver {version}:\n{}",
        o.failures.join("\n")
    );
}

/// kube-apiserver with `--etcd-servers` on watchcache's etcd gRPC front
/// (config/kubernetes.toml's prefixes cached): it starts and bootstraps,
/// creates, reads and lists; a watch from a create's resourceVersion sees
/// the update; and its consistent reads (served from its own watch cache
/// after an etcd progress request, which etcd's grpc-proxy drops) return
/// its own writes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_apiserver_runs_on_the_grpc_front() {
    let binary = peer("kube-apiserver-1.34");
    let etcd = PrivateEtcd::start().await.expect("start etcd");
    let dir = tempfile::tempdir().expect("tempdir");
    let encryption = write_encryption_config(dir.path());
    let enc = encryption.display().to_string();
    let port = watchcache::etcd_server::free_port().expect("port");
    let grpc = format!("127.0.0.1:{port}");
    let watchcache = Daemon::start(
        &watchcache_config(&etcd.endpoint()),
        &["--encryption-provider-config", &enc, "--grpc-listen", &grpc],
    )
    .await;
    watchcache.wait_ready().await;
    let kube = KubeApiserver::start(
        &binary,
        &format!("http://{grpc}"),
        "/registry",
        &encryption,
        &[],
    )
    .await;

    let cms = "/api/v1/namespaces/default/configmaps";
    let created = kube
        .create(
            cms,
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "via-front"}, "data": {"v": "1"}}),
        )
        .await;
    let rv = created["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();
    let watch = kube
        .http
        .get(kube.url(&format!("{cms}?watch=1&resourceVersion={rv}")))
        .send()
        .await
        .expect("watch");
    assert_eq!(watch.status(), 200);
    let (code, body) = kube
        .send(
            Method::PATCH,
            &format!("{cms}/via-front"),
            "application/merge-patch+json",
            Some(json!({"data": {"v": "2"}}).to_string()),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let events = read_events(watch, 1).await;
    assert_eq!(events.len(), 1, "the update through the front is watched");
    assert_eq!(events[0]["type"], "MODIFIED");
    assert_eq!(events[0]["object"]["data"]["v"], "2");
    // A consistent read right after the write sees it.
    for i in 0..20 {
        let name = format!("rw-{i}");
        kube.create(
            cms,
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}),
        )
        .await;
        let (code, list) = kube.send(Method::GET, cms, JSON, None).await;
        assert_eq!(code, 200, "{list}");
        let names: Vec<&str> = list["items"]
            .as_array()
            .expect("items")
            .iter()
            .filter_map(|i| i["metadata"]["name"].as_str())
            .collect();
        assert!(
            names.contains(&name.as_str()),
            "{name} in a consistent List: {names:?}"
        );
    }
    let (code, got) = kube
        .send(Method::GET, &format!("{cms}/via-front"), JSON, None)
        .await;
    assert_eq!(code, 200, "{got}");
    assert_eq!(got["data"]["v"], "2");
    // What kube-apiserver stored through the front is what watchcache's
    // REST API serves.
    let r = reqwest::get(watchcache.url(&format!(
        "{cms}/via-front?resourceVersion={}",
        got["metadata"]["resourceVersion"].as_str().unwrap_or("0")
    )))
    .await
    .expect("watchcache GET");
    assert_eq!(r.status(), 200);
    let served: Value = r.json().await.expect("json");
    assert_eq!(
        served, got,
        "watchcache serves what kube-apiserver wrote through the front"
    );
    // The front served kube-apiserver from its caches, not only by forwarding.
    let metrics = reqwest::get(watchcache.url("/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let cached: f64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("watchcache_grpc_requests_total{") && l.contains("source=\"cache\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(
        cached > 0.0,
        "no request served from the front's caches:\n{metrics}"
    );
    drop(kube);
}

/// The deployment manifests in `config/` are valid for the real
/// kube-apiserver: `kubectl apply --dry-run=server` accepts every object.
fn manifests_pass_server_dry_run(kube: &KubeApiserver) {
    let kubeconfig = kube.kubeconfig();
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut checked = 0;
    for entry in std::fs::read_dir(&config).expect("config/") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("manifest");
        // Kubernetes manifests (not Prometheus' or Grafana's files).
        if !text.lines().any(|l| l.starts_with("apiVersion:")) || !text.contains("\nkind:") {
            continue;
        }
        let out = std::process::Command::new(common::kubectl::kubectl_binary())
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["apply", "--dry-run=server", "-f"])
            .arg(&path)
            .output()
            .expect("run kubectl");
        assert!(
            out.status.success(),
            "kubectl apply --dry-run=server -f {}: {}{}",
            path.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    assert!(checked >= 1, "no Kubernetes manifest found in config/");
}

/// The kinds whose Tables come from kube-apiserver's printers, ported:
/// (the plural of the differences table, kubectl's resource name).
const PRINTED: &[(&str, &str)] = &[
    ("pods", "pods"),
    ("configmaps", "configmaps"),
    ("secrets", "secrets"),
    ("namespaces", "namespaces"),
    ("serviceaccounts", "serviceaccounts"),
    ("services", "services"),
    ("nodes", "nodes"),
    ("deployments", "deployments.apps"),
    ("replicasets", "replicasets.apps"),
    ("statefulsets", "statefulsets.apps"),
    ("daemonsets", "daemonsets.apps"),
    ("jobs", "jobs.batch"),
    ("cronjobs", "cronjobs.batch"),
    ("leases", "leases.coordination.k8s.io"),
    ("priorityclasses", "priorityclasses.scheduling.k8s.io"),
];

/// Pods in the states kube-apiserver's Pod printer tells apart, created
/// through kube-apiserver with their statuses then written through the
/// `/status` subresource, as a kubelet writes them: running and ready
/// (behind a readiness gate), crash-looping with restarts, initializing
/// behind a started sidecar, succeeded.
async fn populate_printed_pods(k: &KubeApiserver) {
    let ns = |p: &str| format!("/api/v1/namespaces/{NS}/pods{p}");
    let image = "registry.k8s.io/pause:3.10";
    let ago = |secs: i64| {
        (chrono::Utc::now() - chrono::Duration::seconds(secs))
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    };
    // Restarts print as "N (X ago)": a last restart 3d12h30m ago prints
    // the same for an hour, whichever server is asked when.
    let restarted = ago(3 * 86400 + 12 * 3600 + 1800);
    let started = ago(4 * 86400);
    let container = |name: &str| json!({"name": name, "image": image});
    let status = |name: &str, ready: bool, restarts: i64, state: Value| {
        json!({"name": name, "image": image, "imageID": "", "ready": ready,
               "restartCount": restarts, "state": state, "started": ready})
    };
    let conditions = |ready: &str, initialized: &str| {
        json!([{"type": "Initialized", "status": initialized},
               {"type": "Ready", "status": ready},
               {"type": "PodScheduled", "status": "True"}])
    };
    let pods = [
        (
            "print-running",
            json!({"nodeName": "node-1", "containers": [container("c")],
                   "readinessGates": [{"conditionType": "example.com/gate"}]}),
            json!({"phase": "Running", "podIP": "10.1.0.10", "podIPs": [{"ip": "10.1.0.10"}],
                   "hostIP": "192.168.0.1",
                   "conditions": [{"type": "Initialized", "status": "True"},
                                  {"type": "Ready", "status": "True"},
                                  {"type": "example.com/gate", "status": "True"}],
                   "containerStatuses": [status("c", true, 0, json!({"running": {"startedAt": started}}))]}),
        ),
        (
            "print-crashloop",
            json!({"nodeName": "node-1", "containers": [container("c"), container("d")]}),
            json!({"phase": "Running", "podIP": "10.1.0.11", "podIPs": [{"ip": "10.1.0.11"}],
                   "conditions": conditions("False", "True"),
                   "containerStatuses": [
                       {"name": "c", "image": image, "imageID": "", "ready": false, "restartCount": 5,
                        "started": false,
                        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting"}},
                        "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                            "startedAt": restarted, "finishedAt": restarted}}},
                       status("d", true, 0, json!({"running": {"startedAt": started}}))]}),
        ),
        (
            "print-initializing",
            json!({"nodeName": "node-1", "containers": [container("c")],
                   "initContainers": [{"name": "sidecar", "image": image, "restartPolicy": "Always"},
                                      container("init")]}),
            json!({"phase": "Pending", "conditions": conditions("False", "False"),
                   "initContainerStatuses": [
                       status("sidecar", true, 0, json!({"running": {"startedAt": started}})),
                       status("init", false, 0, json!({"running": {"startedAt": started}}))],
                   "containerStatuses": [status("c", false, 0,
                       json!({"waiting": {"reason": "PodInitializing"}}))]}),
        ),
        (
            "print-succeeded",
            json!({"nodeName": "node-1", "restartPolicy": "Never", "containers": [container("c")]}),
            json!({"phase": "Succeeded", "conditions": conditions("False", "True"),
                   "containerStatuses": [status("c", false, 0, json!({"terminated": {
                       "exitCode": 0, "reason": "Completed", "startedAt": started, "finishedAt": started}}))]}),
        ),
    ];
    for (name, spec, status) in pods {
        k.create(
            &ns(""),
            &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}),
        )
        .await;
        let (code, body) = k
            .send(
                Method::PATCH,
                &ns(&format!("/{name}/status")),
                "application/merge-patch+json",
                Some(json!({"status": status}).to_string()),
            )
            .await;
        assert_eq!(code, 200, "status of {name}: {body}");
    }
}

/// `kubectl get` output as rows of cells (the header first), the AGE
/// column left out. Columns start where the header's names do (kubectl
/// pads columns with at least three spaces; a name may hold one).
fn kubectl_cells(out: &str) -> Vec<Vec<String>> {
    let mut lines = out.lines().map(|l| l.chars().collect::<Vec<char>>());
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let starts: Vec<usize> = (0..header.len())
        .filter(|&i| header[i] != ' ' && (i == 0 || (i >= 3 && header[i - 3..i] == [' '; 3])))
        .collect();
    let cells = |line: &[char]| -> Vec<String> {
        starts
            .iter()
            .enumerate()
            .map(|(n, &s)| {
                let end = starts
                    .get(n + 1)
                    .copied()
                    .unwrap_or(line.len())
                    .min(line.len());
                line[s.min(end)..end]
                    .iter()
                    .collect::<String>()
                    .trim()
                    .to_string()
            })
            .collect()
    };
    let head = cells(&header);
    let age = head.iter().position(|h| h == "AGE");
    std::iter::once(header)
        .chain(lines)
        .map(|l| {
            let mut c = cells(&l);
            if let Some(a) = age {
                c.remove(a);
            }
            c
        })
        .collect()
}

/// kube-apiserver's printers, ported: for every printed kind, each
/// object's Table (Lists are compared by `compare_list`), and
/// `kubectl get R -A -o wide` through both servers prints the same cells,
/// AGE aside.
async fn printed_tables(o: &mut Oracle) {
    let resources = shipped_resources();
    let dir = tempfile::tempdir().expect("tempdir");
    let wc_kubectl = common::kubectl::Kubectl::new(
        &o.watchcache.url(""),
        None,
        common::kubectl::KubeUser::Anonymous,
    );
    let kubeconfig = o.kube.kubeconfig();
    for (plural, kubectl_name) in PRINTED {
        let r = resources
            .iter()
            .find(|r| r.plural == *plural)
            .unwrap_or_else(|| panic!("{plural} is in config/kubernetes.toml"));
        let (_, body) = o.wc_get(&r.all(), JSON).await;
        let list: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        for (ns, name) in names(&list) {
            let path = r.object(ns.as_deref(), &name);
            o.compare_table(plural, &path, &path).await;
        }
        for include in ["None", "Object"] {
            let p = format!("{}?includeObject={include}", r.all());
            o.compare_table(plural, &p, &p).await;
        }

        let args = ["get", kubectl_name, "-A", "-o", "wide"];
        let wc_out = wc_kubectl.run(&args).await;
        let out = tokio::process::Command::new(common::kubectl::kubectl_binary())
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--cache-dir")
            .arg(dir.path())
            .args(args)
            .output()
            .await
            .expect("run kubectl");
        assert!(
            out.status.success(),
            "kubectl {args:?} on kube-apiserver: {out:?}"
        );
        let k_out = String::from_utf8_lossy(&out.stdout);
        let (w, k) = (kubectl_cells(&wc_out), kubectl_cells(&k_out));
        let mut diffs = Vec::new();
        if w.first() != k.first() {
            diffs.push((
                "kubectl/header".to_string(),
                format!("watchcache {:?}, kube-apiserver {:?}", w.first(), k.first()),
            ));
        } else if w != k {
            diffs.push((
                "kubectl/rows".to_string(),
                format!("watchcache:\n{wc_out}kube-apiserver:\n{k_out}"),
            ));
        }
        assert!(w.len() > 1, "kubectl {args:?} printed no object:\n{wc_out}");
        o.record(plural, &format!("kubectl {}", args.join(" ")), diffs);
    }

    // A watch as Tables (`kubectl get -w`): the same events, the first with
    // the column definitions, Ages aside.
    let pods = format!("/api/v1/namespaces/{NS}/pods");
    let (_, body) = o.wc_get(&pods, JSON).await;
    let list: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let rv = list["metadata"]["resourceVersion"].as_str().unwrap_or("0");
    let path = format!("{pods}?watch=1&resourceVersion={rv}");
    let (wc, kube) = (
        o.http.get(o.watchcache.url(&path)),
        o.kube.http.get(o.kube.url(&path)),
    );
    let (wc, kube) = tokio::join!(
        wc.header("accept", TABLE).send(),
        kube.header("accept", TABLE).send()
    );
    let (wc, kube) = (
        wc.expect("watchcache watch"),
        kube.expect("kube-apiserver watch"),
    );
    for name in ["print-running", "print-succeeded"] {
        let (code, body) = o
            .kube
            .send(
                Method::PATCH,
                &format!("{pods}/{name}"),
                "application/merge-patch+json",
                Some(json!({"metadata": {"labels": {"watched": "yes"}}}).to_string()),
            )
            .await;
        assert_eq!(code, 200, "{body}");
    }
    let (mut w, mut k) = tokio::join!(read_events(wc, 2), read_events(kube, 2));
    assert_eq!(k.len(), 2, "kube-apiserver's Table watch events: {k:?}");
    for events in [&mut w, &mut k] {
        for ev in events.iter_mut() {
            if let Some(cells) = ev["object"]["rows"][0]["cells"].as_array_mut()
                && cells.len() > 4
            {
                cells[4] = Value::Null; // a Pod's Age
            }
        }
    }
    let mut diffs = Vec::new();
    diff("table", &Value::Array(w), &Value::Array(k), &mut diffs);
    o.record("pods", &format!("watch {path} (Table)"), diffs);
}

/// `etcd grpc-proxy start` (etcd 3.5 from `tools/`) on a free loopback
/// port in front of `etcd`; killed on drop.
struct GrpcProxy {
    child: std::process::Child,
    endpoint: String,
    dir: tempfile::TempDir,
}

impl GrpcProxy {
    async fn start(etcd: &str) -> GrpcProxy {
        let bin = watchcache::etcd_server::find_etcd_binary().expect("etcd binary");
        let bin = std::fs::canonicalize(&bin).unwrap_or(bin);
        let dir = tempfile::tempdir().expect("tempdir");
        let addr = format!(
            "127.0.0.1:{}",
            watchcache::etcd_server::free_port().expect("port")
        );
        let log = std::fs::File::create(dir.path().join("grpc-proxy.log")).expect("log");
        let mut cmd = std::process::Command::new(&bin);
        cmd.args(["grpc-proxy", "start", "--endpoints"])
            .arg(etcd.trim_start_matches("http://"))
            .arg("--listen-addr")
            .arg(&addr)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .current_dir(dir.path())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log);
        watchcache::etcd_server::kill_with_parent(&mut cmd);
        let child = cmd.spawn().expect("spawn etcd grpc-proxy");
        let proxy = GrpcProxy {
            child,
            endpoint: format!("http://{addr}"),
            dir,
        };
        let up = common::eventually(Duration::from_secs(30), || async {
            let Ok(mut c) = etcd_client::Client::connect([proxy.endpoint.as_str()], None).await
            else {
                return false;
            };
            c.get("probe", None).await.is_ok()
        })
        .await;
        assert!(
            up,
            "etcd grpc-proxy not answering; log:\n{}",
            std::fs::read_to_string(proxy.dir.path().join("grpc-proxy.log")).unwrap_or_default()
        );
        proxy
    }
}

impl Drop for GrpcProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The sum of the samples of metric `name` (exactly that name, any labels)
/// whose labels contain every one of `labels`, in Prometheus text.
fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// etcd's open watchers (`etcd_debugging_mvcc_watcher_total`, from its own
/// `/metrics` on the client port), once the figure held still for 3 s.
async fn etcd_watchers_settled(etcd: &str) -> f64 {
    let mut last = f64::NAN;
    let mut same = 0;
    for _ in 0..180 {
        let text = reqwest::get(format!("{etcd}/metrics"))
            .await
            .expect("etcd /metrics")
            .text()
            .await
            .expect("text");
        let now = metric_sum(&text, "etcd_debugging_mvcc_watcher_total", &[]);
        same = if now == last { same + 1 } else { 0 };
        last = now;
        if same >= 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    last
}

/// etcd's watchers once settled; with `bound`, polled (90 s at most) until
/// they are no more than it, as a watch forwarded at a kube-apiserver's
/// start moves onto the front's caches once etcd caught it up.
async fn etcd_watchers_within(etcd: &str, bound: Option<f64>) -> f64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let n = etcd_watchers_settled(etcd).await;
        match bound {
            Some(b) if n > b && tokio::time::Instant::now() < deadline => {}
            _ => return n,
        }
    }
}

/// A check of etcd's watchers: (the endpoint alone, now, with whom).
type WatcherCheck<'a> = dyn Fn(f64, f64, &str) + 'a;

/// What one run of three kube-apiservers on one etcd endpoint measured.
struct SharedRun {
    name: &'static str,
    first_ready: Duration,
    /// etcd's watchers: the endpoint alone, with one, with three kube-apiservers.
    watchers: [f64; 3],
    /// Consistent Lists of configmaps right after a write elsewhere.
    lists: Vec<Duration>,
    /// Of those: served from kube-apiserver's watch cache / fell back to etcd
    /// (`apiserver_watch_cache_consistent_read_total`).
    from_cache: f64,
    fell_back: f64,
}

impl SharedRun {
    fn row(&self) -> String {
        let mut ms: Vec<f64> = self.lists.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        let median = ms.get(ms.len() / 2).copied().unwrap_or(f64::NAN);
        format!(
            "| {} | {:.1} | {} / {} / {} | {:.1} / {:.1} / {:.1} | {} / {} of {} |",
            self.name,
            self.first_ready.as_secs_f64(),
            self.watchers[0],
            self.watchers[1],
            self.watchers[2],
            ms.first().copied().unwrap_or(f64::NAN),
            median,
            ms.last().copied().unwrap_or(f64::NAN),
            self.from_cache,
            self.fell_back,
            self.lists.len()
        )
    }
}

/// The consistent-read counters of configmaps on `kube`: (from its watch
/// cache, fell back to etcd).
async fn consistent_reads(kube: &KubeApiserver) -> (f64, f64) {
    let (code, text) = kube.send(Method::GET, "/metrics", JSON, None).await;
    assert_eq!(code, 200, "kube-apiserver /metrics");
    let text = text.as_str().unwrap_or_default().to_string();
    let name = "apiserver_watch_cache_consistent_read_total";
    let cm = "resource=\"configmaps\"";
    (
        metric_sum(&text, name, &[cm, "fallback=\"false\"", "success=\"true\""]),
        metric_sum(&text, name, &[cm, "fallback=\"true\""]),
    )
}

/// Three kube-apiservers 1.34 with `--etcd-servers` at `endpoint` (in front
/// of `etcd`): etcd's watchers counted with the endpoint alone, one and
/// three of them; each creates, reads and watches (updates made through
/// another); consistent Lists right after a write through another one
/// contain it. Returns the figures; `check_watchers`, when given, checks
/// etcd's watchers (alone, now, with whom) after each start (the front:
/// they must not grow).
async fn three_on_one_endpoint(
    name: &'static str,
    etcd: &str,
    endpoint: &str,
    encryption: &std::path::Path,
    check_watchers: Option<&WatcherCheck<'_>>,
) -> SharedRun {
    let binary = peer("kube-apiserver-1.34");
    let alone = etcd_watchers_settled(etcd).await;
    let bound = check_watchers.map(|_| alone);
    let started = std::time::Instant::now();
    let first = KubeApiserver::start(&binary, endpoint, "/registry", encryption, &[]).await;
    let first_ready = started.elapsed();
    let one = etcd_watchers_within(etcd, bound).await;
    if let Some(check) = check_watchers {
        check(alone, one, "one kube-apiserver");
    }
    let (second, third) = tokio::join!(
        KubeApiserver::start(&binary, endpoint, "/registry", encryption, &[]),
        KubeApiserver::start(&binary, endpoint, "/registry", encryption, &[]),
    );
    let kubes = [first, second, third];
    let three = etcd_watchers_within(etcd, bound).await;
    if let Some(check) = check_watchers {
        check(alone, three, "three kube-apiservers");
    }

    let cms = "/api/v1/namespaces/default/configmaps";
    let secrets = "/api/v1/namespaces/default/secrets";
    // Each creates, each reads another's object, each watches an update
    // made through another.
    for (k, kube) in kubes.iter().enumerate() {
        let other = &kubes[(k + 1) % 3];
        let cm = format!("watched-{k}");
        let created = kube
            .create(
                cms,
                &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cm}, "data": {"v": "1"}}),
            )
            .await;
        let rv = created["metadata"]["resourceVersion"]
            .as_str()
            .expect("rv")
            .to_string();
        let watch = kube
            .http
            .get(kube.url(&format!(
                "{cms}?watch=1&resourceVersion={rv}&fieldSelector=metadata.name%3D{cm}"
            )))
            .send()
            .await
            .expect("watch");
        assert_eq!(watch.status(), 200, "{name}: watch on kube-apiserver {k}");
        let (code, body) = other
            .send(
                Method::PATCH,
                &format!("{cms}/{cm}"),
                "application/merge-patch+json",
                Some(json!({"data": {"v": "2"}}).to_string()),
            )
            .await;
        assert_eq!(code, 200, "{name}: {body}");
        let events = read_events(watch, 1).await;
        assert_eq!(
            events.len(),
            1,
            "{name}: kube-apiserver {k} watches the update made through another"
        );
        assert_eq!(events[0]["type"], "MODIFIED", "{name}: {events:?}");
        assert_eq!(events[0]["object"]["data"]["v"], "2", "{name}: {events:?}");
        let (code, got) = kubes[(k + 2) % 3]
            .send(Method::GET, &format!("{cms}/{cm}"), JSON, None)
            .await;
        assert_eq!(code, 200, "{name}: {got}");
        assert_eq!(got["data"]["v"], "2", "{name}: {got}");
    }

    // Consistent Lists of configmaps right after a write: a ConfigMap
    // through one kube-apiserver, then a Secret (so etcd's revision is past
    // every configmaps event), then the List through another. Its watch
    // cache serves it only once etcd's progress notification brought the
    // configmaps cache up to etcd's revision; else it falls back to etcd.
    let before = futures::future::join_all(kubes.iter().map(consistent_reads)).await;
    let mut lists = Vec::new();
    for i in 0..12 {
        let (writer, reader) = (&kubes[i % 3], &kubes[(i + 1) % 3]);
        let cm = format!("listed-{i}");
        writer
            .create(
                cms,
                &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cm}}),
            )
            .await;
        writer
            .create(
                secrets,
                &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": cm}}),
            )
            .await;
        let t = std::time::Instant::now();
        let (code, list) = reader.send(Method::GET, cms, JSON, None).await;
        lists.push(t.elapsed());
        assert_eq!(code, 200, "{name}: {list}");
        let names: Vec<&str> = list["items"]
            .as_array()
            .expect("items")
            .iter()
            .filter_map(|i| i["metadata"]["name"].as_str())
            .collect();
        assert!(
            names.contains(&cm.as_str()),
            "{name}: {cm} in a consistent List right after its write: {names:?}"
        );
    }
    let after = futures::future::join_all(kubes.iter().map(consistent_reads)).await;
    let delta = |f: fn(&(f64, f64)) -> f64| -> f64 {
        after.iter().map(f).sum::<f64>() - before.iter().map(f).sum::<f64>()
    };
    SharedRun {
        name,
        first_ready,
        watchers: [alone, one, three],
        lists,
        from_cache: delta(|c| c.0),
        fell_back: delta(|c| c.1),
    }
}

/// Three kube-apiservers on one watchcache gRPC front (config/kubernetes.toml)
/// cost etcd no watch beyond the front's own one per prefix, and are served
/// correctly; then the same run with etcd's grpc-proxy in the front's
/// place. `--nocapture` prints both side by side (docs/KUBERNETES.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_kube_apiservers_share_one_front() {
    let dir = tempfile::tempdir().expect("tempdir");
    let encryption = write_encryption_config(dir.path());
    let enc = encryption.display().to_string();

    let etcd = PrivateEtcd::start().await.expect("start etcd");
    let grpc = format!(
        "127.0.0.1:{}",
        watchcache::etcd_server::free_port().expect("port")
    );
    let log = format!(
        "{},watchcache::grpc::watch=debug",
        std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into())
    );
    let watchcache = Daemon::start_env(
        &watchcache_config(&etcd.endpoint()),
        &["--encryption-provider-config", &enc, "--grpc-listen", &grpc],
        &[("RUST_LOG", &log)],
    )
    .await;
    watchcache.wait_ready().await;
    let front = three_on_one_endpoint(
        "watchcache gRPC front",
        &etcd.endpoint(),
        &format!("http://{grpc}"),
        &encryption,
        Some(&|alone: f64, now: f64, when: &str| {
            let log = watchcache.log();
            let forwarded: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("watch forwarded to etcd"))
                .map(|l| l.split("watch forwarded to etcd").nth(1).unwrap_or(l))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            assert!(
                now <= alone,
                "etcd's watchers grew from {alone} (the front alone) to {now} with {when}; \
                 watches the front forwarded:\n{}",
                forwarded.join("\n")
            );
        }),
    )
    .await;
    assert!(
        front.from_cache > 0.0,
        "no consistent List served from kube-apiserver's watch cache through the front \
         ({} fell back to etcd)",
        front.fell_back
    );
    drop(watchcache);
    drop(etcd);

    let etcd = PrivateEtcd::start().await.expect("start etcd");
    let proxy = GrpcProxy::start(&etcd.endpoint()).await;
    let grpc_proxy = three_on_one_endpoint(
        "etcd grpc-proxy",
        &etcd.endpoint(),
        &proxy.endpoint,
        &encryption,
        None,
    )
    .await;

    println!(
        "| endpoint | first kube-apiserver ready after (s) | etcd watchers: alone / 1 / 3 \
         kube-apiservers | consistent List right after a write, ms: min / median / max | \
         served from kube-apiserver's cache / fell back to etcd |"
    );
    println!("|---|---|---|---|---|");
    println!("{}", front.row());
    println!("{}", grpc_proxy.row());
}

/// A query value, percent-encoded.
fn query_value(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Sharded list and watch (KEP-5866) against kube-apiserver 1.37 with
/// `ShardedListAndWatch` on: Lists (JSON, protobuf, Table, pages) with
/// shard selectors on uid and namespace, alone and with a label selector,
/// echo `shardInfo` and select the same objects; bad selectors get the
/// same Status; sharded watches from the same revision and sharded
/// WatchLists get the same events; the shards of a split are disjoint
/// and cover the List.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_list_and_watch_as_kube_apiserver_1_37_serves() {
    let binary = peer("kube-apiserver-1.37");
    let etcd = PrivateEtcd::start().await.expect("start etcd");
    let dir = tempfile::tempdir().expect("tempdir");
    let encryption = write_encryption_config(dir.path());
    let gate = "--feature-gates=ShardedListAndWatch=true";
    let kube =
        KubeApiserver::start(&binary, &etcd.endpoint(), "/registry", &encryption, &[gate]).await;
    let mut o = Oracle::with_watchcache_args(
        kube,
        &etcd.endpoint(),
        &encryption,
        "1.37",
        &["--feature-gates", "ShardedListAndWatch=true"],
    )
    .await;
    let spaces = ["shard-a", "shard-b", "shard-c", "shard-d"];
    for ns in spaces {
        let n = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        o.kube.create("/api/v1/namespaces", &n).await;
        for i in 0..6 {
            let app = if i % 2 == 0 { "web" } else { "db" };
            let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("cm-{i}"), "labels": {"app": app}}, "data": {"i": i.to_string()}});
            o.kube
                .create(&format!("/api/v1/namespaces/{ns}/configmaps"), &cm)
                .await;
        }
    }
    let range = |field: &str, start: &str, end: &str| {
        format!("shardRange(object.metadata.{field}, '{start}', '{end}')")
    };
    let quarters = [
        "0x0000000000000000",
        "0x4000000000000000",
        "0x8000000000000000",
        "0xc000000000000000",
        "0x10000000000000000",
    ];
    let mut selectors: Vec<String> = Vec::new();
    for field in ["uid", "namespace"] {
        for q in quarters.windows(2) {
            selectors.push(range(field, q[0], q[1]));
        }
    }
    selectors.push(format!(
        "{} || {}",
        range("uid", quarters[0], quarters[1]),
        range("uid", quarters[2], quarters[3])
    ));
    let cms = "/api/v1/configmaps";
    // The quarters of each field are disjoint and cover the List.
    let (_, body) = o.wc_get(cms, JSON).await;
    let all: BTreeSet<(Option<String>, String)> =
        names(&serde_json::from_slice::<Value>(&body).expect("list"))
            .into_iter()
            .filter(|(ns, _)| ns.as_deref().is_some_and(|n| n.starts_with("shard-")))
            .collect();
    assert_eq!(all.len(), 24);
    for field in 0..2 {
        let mut covered = BTreeSet::new();
        for sel in &selectors[field * 4..field * 4 + 4] {
            let (code, body) = o
                .wc_get(&format!("{cms}?shardSelector={}", query_value(sel)), JSON)
                .await;
            assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
            let list: Value = serde_json::from_slice(&body).expect("list");
            assert_eq!(list["metadata"]["shardInfo"]["selector"], json!(sel));
            for n in names(&list) {
                if all.contains(&n) {
                    assert!(covered.insert(n.clone()), "{n:?} in two shards");
                }
            }
        }
        assert_eq!(covered, all, "the shards cover the List");
    }
    for sel in &selectors {
        let q = format!("shardSelector={}", query_value(sel));
        o.compare_list("configmaps", cms, &q).await;
        o.compare_list("configmaps", cms, &format!("{q}&labelSelector=app%3Dweb"))
            .await;
        o.compare_list("configmaps", "/api/v1/namespaces/shard-a/configmaps", &q)
            .await;
        o.compare_pages("configmaps", &format!("{cms}?{q}")).await;
        let (_, body) = o.wc_get(&format!("{cms}?{q}"), JSON).await;
        let list: Value = serde_json::from_slice(&body).expect("list");
        let rv = list["metadata"]["resourceVersion"].as_str().unwrap_or("0");
        let exact = format!("{cms}?{q}&resourceVersion={rv}&resourceVersionMatch=Exact");
        o.compare_protobuf("configmaps", &exact, &exact).await;
        for version in ["v1", "v1beta1"] {
            let accept = metadata_accept("PartialObjectMetadataList", version);
            o.compare_json_as("configmaps", &exact, &exact, &accept)
                .await;
        }
    }
    // Bad selectors: kube-apiserver's code and Status.
    let long = format!("0x{}", "1".repeat(18));
    for bad in [
        " ".to_string(),
        "shardRange(".to_string(),
        range("name", quarters[0], quarters[1]),
        range("uid", quarters[2], quarters[1]),
        range("uid", "0x0", quarters[1]),
        range("uid", "0xG000000000000000", quarters[1]),
        range("uid", quarters[0], &long),
        range("uid", quarters[0], "0x20000000000000000"),
        "shardRange(object.metadata.uid, 0, '0x8000000000000000')".to_string(),
        "shardRange(object.metadata.uid, '0x0000000000000000')".to_string(),
        format!("{} && true", range("uid", quarters[0], quarters[1])),
        format!(
            "{} || {}",
            range("uid", quarters[0], quarters[1]),
            range("namespace", quarters[1], quarters[2])
        ),
        "'0x0'".to_string(),
    ] {
        let q = query_value(&bad);
        for path in [
            format!("{cms}?shardSelector={q}"),
            format!("{cms}?watch=1&shardSelector={q}"),
        ] {
            o.compare_json("configmaps", &path, &path).await;
        }
    }
    // Sharded watches from the same revision while kube-apiserver writes:
    // each shard's events, the same on both.
    let (_, body) = o.wc_get(cms, JSON).await;
    let rv = serde_json::from_slice::<Value>(&body).expect("list")["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string();
    let split = &selectors[..4];
    let mut streams = Vec::new();
    for sel in split {
        let path = format!(
            "{cms}?watch=1&resourceVersion={rv}&shardSelector={}",
            query_value(sel)
        );
        streams.push((
            path.clone(),
            o.open_watch(false, &path).await,
            o.open_watch(true, &path).await,
        ));
    }
    // Both servers report the open sharded watches.
    let metrics = o
        .http
        .get(o.watchcache.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("watchcache_watch_shards{resource=\"configmaps\"} 4")),
        "watchcache_watch_shards: {}",
        metrics
            .lines()
            .filter(|l| l.contains("watch_shards"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Four creates and four deletes; the uid of each event.
    let mut uids = Vec::new();
    for (i, ns) in spaces.iter().enumerate() {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("new-{i}")}, "data": {"v": "1"}});
        let created = o
            .kube
            .create(&format!("/api/v1/namespaces/{ns}/configmaps"), &cm)
            .await;
        uids.push(
            created["metadata"]["uid"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        );
        let path = format!("/api/v1/namespaces/{ns}/configmaps/cm-{i}");
        let (code, body) = o.kube.send(Method::DELETE, &path, JSON, None).await;
        assert_eq!(code, 200, "{body}");
        // A Status naming the deleted object (or the object).
        let uid = body["details"]["uid"]
            .as_str()
            .or(body["metadata"]["uid"].as_str());
        uids.push(uid.expect("deleted object's uid").to_string());
    }
    let quarter = 1u128 << 62;
    let mut total = 0;
    for (i, (path, wc, kube)) in streams.into_iter().enumerate() {
        let lo = quarter * i as u128;
        let in_shard = |uid: &str| {
            let h = u128::from(watchcache::object::sharding::hash_field(uid));
            lo <= h && h < lo + quarter
        };
        let expected = uids.iter().filter(|u| in_shard(u)).count();
        let (w, k) = tokio::join!(read_events(wc, expected), read_events(kube, expected));
        assert_eq!(k.len(), expected, "kube-apiserver's shard {i}: {k:?}");
        assert!(
            k.iter()
                .all(|e| in_shard(e["object"]["metadata"]["uid"].as_str().unwrap_or(""))),
            "kube-apiserver's shard {i}: {k:?}"
        );
        total += k.len();
        let mut diffs = Vec::new();
        diff("", &Value::Array(w), &Value::Array(k), &mut diffs);
        o.record("configmaps", &format!("watch {path}"), diffs);
    }
    assert_eq!(total, 8, "four creates and four deletes, over the shards");
    // Sharded WatchLists: the same initial objects and an end bookmark.
    for sel in &selectors[4..] {
        let (_, body) = o
            .wc_get(&format!("{cms}?shardSelector={}", query_value(sel)), JSON)
            .await;
        let items = serde_json::from_slice::<Value>(&body).expect("list")["items"]
            .as_array()
            .map_or(0, Vec::len);
        let path = format!(
            "{cms}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&shardSelector={}",
            query_value(sel)
        );
        let wc = o.open_watch(false, &path).await;
        let kube = o.open_watch(true, &path).await;
        let (w, k) = tokio::join!(read_events(wc, items + 1), read_events(kube, items + 1));
        let strip = |events: Vec<Value>| -> Vec<Value> {
            events
                .into_iter()
                .map(|mut e| {
                    if e["type"] == "BOOKMARK" {
                        // The bookmark's revision is each server's own.
                        e["object"]["metadata"]["resourceVersion"] = json!("<rv>");
                    }
                    e
                })
                .collect()
        };
        let (w, k) = (strip(w), strip(k));
        assert_eq!(k.len(), items + 1, "kube-apiserver's WatchList {path}");
        let mut diffs = Vec::new();
        diff("", &Value::Array(w), &Value::Array(k), &mut diffs);
        o.record("configmaps", &format!("watch {path}"), diffs);
    }
    assert!(
        o.failures.is_empty(),
        "{} differences from kube-apiserver 1.37 (of {} comparisons):\n{}",
        o.failures.len(),
        o.compared,
        o.failures.join("\n")
    );
}

/// (what, method, path, impersonation headers).
type ImpersonationCase = (
    &'static str,
    &'static str,
    &'static str,
    Vec<(&'static str, &'static str)>,
);

/// The RBAC objects of the impersonation comparison: carol may impersonate
/// alice, the group dev and the extra `scopes`; alice may list ConfigMaps
/// in team-a.
const IMPERSONATION_RBAC: &str = r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: impersonate-alice}
rules:
- apiGroups: [""]
  resources: [users]
  resourceNames: [alice]
  verbs: [impersonate]
- apiGroups: [""]
  resources: [groups]
  resourceNames: [dev]
  verbs: [impersonate]
- apiGroups: [authentication.k8s.io]
  resources: [userextras/scopes]
  verbs: [impersonate]
- apiGroups: [authentication.k8s.io]
  resources: [uids]
  resourceNames: [alice-uid]
  verbs: [impersonate]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: carol-impersonates-alice}
subjects:
- {kind: User, name: carol, apiGroup: rbac.authorization.k8s.io}
roleRef: {kind: ClusterRole, name: impersonate-alice, apiGroup: rbac.authorization.k8s.io}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: configmap-reader, namespace: team-a}
rules:
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: alice-reads, namespace: team-a}
subjects:
- {kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}
roleRef: {kind: Role, name: configmap-reader, apiGroup: rbac.authorization.k8s.io}
"#;

/// Impersonation (`Impersonate-*` headers, kubectl `--as`) against
/// kube-apiserver 1.37 with the same users and RBAC (its objects through
/// its API, watchcache's from a policy file): allowed and refused
/// impersonations of a user, a group, a uid, a user extra and a service
/// account get the same code and Status; the impersonated identity reads
/// what it may, as `SelfSubjectReview` reports it; a forbidden resource,
/// object, other group and path get the same Status details; a
/// `SelfSubjectAccessReview` as alice (what `kubectl auth can-i --as`
/// sends) answers the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impersonation_as_kube_apiserver_1_37_does_it() {
    let binary = peer("kube-apiserver-1.37");
    let etcd = PrivateEtcd::start().await.expect("start etcd");
    let dir = tempfile::tempdir().expect("tempdir");
    let encryption = write_encryption_config(dir.path());
    let tokens = "carol-token,carol,carol-uid,\"\"\n";
    let kube = KubeApiserver::start_with_tokens(
        &binary,
        &etcd.endpoint(),
        "/registry",
        &encryption,
        &[],
        tokens,
    )
    .await;
    for ns in ["team-a", "team-b"] {
        let n = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        kube.create("/api/v1/namespaces", &n).await;
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}});
        kube.create(&format!("/api/v1/namespaces/{ns}/configmaps"), &cm)
            .await;
    }
    for doc in IMPERSONATION_RBAC.split("\n---\n") {
        let v: Value = serde_saphyr::from_str(doc).expect("RBAC YAML");
        let kind = v["kind"].as_str().expect("kind");
        let path = match (kind, v["metadata"]["namespace"].as_str()) {
            ("ClusterRole", _) => "/apis/rbac.authorization.k8s.io/v1/clusterroles".to_string(),
            ("ClusterRoleBinding", _) => {
                "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings".to_string()
            }
            ("Role", Some(ns)) => {
                format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles")
            }
            (_, Some(ns)) => {
                format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings")
            }
            other => panic!("{other:?}"),
        };
        kube.create(&path, &v).await;
    }
    let policy = dir.path().join("rbac.yaml");
    std::fs::write(&policy, IMPERSONATION_RBAC).expect("write policy");
    let token_file = dir.path().join("tokens.csv");
    std::fs::write(
        &token_file,
        format!(
            "{},oracle-admin,oracle-admin-uid,\"system:masters\"\n{tokens}",
            common::kube_apiserver::ADMIN_TOKEN
        ),
    )
    .expect("write tokens");
    let (policy, token_file) = (
        policy.display().to_string(),
        token_file.display().to_string(),
    );
    let mut o = Oracle::with_watchcache_args(
        kube,
        &etcd.endpoint(),
        &encryption,
        "1.37",
        &[
            "--token-auth-file",
            &token_file,
            "--authorization-mode",
            "RBAC",
            "--rbac-policy-file",
            &policy,
        ],
    )
    .await;
    // (what, method, path, headers): each sent as carol to both.
    let review = "/apis/authentication.k8s.io/v1/selfsubjectreviews";
    let team_a = "/api/v1/namespaces/team-a/configmaps";
    let team_b = "/api/v1/namespaces/team-b/configmaps";
    let cases: Vec<ImpersonationCase> = vec![
        ("carol alone", "GET", team_a, vec![]),
        (
            "as alice",
            "GET",
            team_a,
            vec![("Impersonate-User", "alice")],
        ),
        (
            "as alice, elsewhere",
            "GET",
            team_b,
            vec![("Impersonate-User", "alice")],
        ),
        ("as bob", "GET", team_a, vec![("Impersonate-User", "bob")]),
        (
            "as alice in dev",
            "POST",
            review,
            vec![("Impersonate-User", "alice"), ("Impersonate-Group", "dev")],
        ),
        (
            "as alice in ops",
            "GET",
            team_a,
            vec![("Impersonate-User", "alice"), ("Impersonate-Group", "ops")],
        ),
        (
            "as alice with her uid",
            "POST",
            review,
            vec![
                ("Impersonate-User", "alice"),
                ("Impersonate-Uid", "alice-uid"),
            ],
        ),
        (
            "as alice with another uid",
            "GET",
            team_a,
            vec![("Impersonate-User", "alice"), ("Impersonate-Uid", "other")],
        ),
        (
            "as alice with a scope",
            "POST",
            review,
            vec![
                ("Impersonate-User", "alice"),
                ("Impersonate-Extra-Scopes", "view"),
            ],
        ),
        (
            "as alice with another extra",
            "GET",
            team_a,
            vec![
                ("Impersonate-User", "alice"),
                ("Impersonate-Extra-Team", "x"),
            ],
        ),
        (
            "a group alone",
            "GET",
            team_a,
            vec![("Impersonate-Group", "dev")],
        ),
        (
            "as alice, a path",
            "GET",
            "/metrics",
            vec![("Impersonate-User", "alice")],
        ),
        (
            "as alice, an object",
            "GET",
            "/api/v1/namespaces/team-b/configmaps/cm",
            vec![("Impersonate-User", "alice")],
        ),
        (
            "as alice, another group",
            "GET",
            "/apis/apps/v1/namespaces/team-a/deployments",
            vec![("Impersonate-User", "alice")],
        ),
        (
            "a uid alone",
            "GET",
            team_a,
            vec![("Impersonate-Uid", "alice-uid")],
        ),
        (
            "as a service account",
            "GET",
            team_a,
            vec![("Impersonate-User", "system:serviceaccount:team-a:builder")],
        ),
    ];
    let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let mut answers = Vec::new();
    for (what, method, path, headers) in &cases {
        let mut pair = Vec::new();
        for kube in [false, true] {
            let (client, url) = o.client_for(kube, path);
            let mut r = client
                .request(Method::from_bytes(method.as_bytes()).expect("method"), url)
                .header("authorization", "Bearer carol-token")
                .header("accept", JSON);
            for (k, v) in headers {
                r = r.header(*k, *v);
            }
            if *method == "POST" {
                r = r.header("content-type", JSON).body(body.to_string());
            }
            let resp = r.send().await.expect("request");
            let code = resp.status().as_u16();
            let mut v: Value = resp.json().await.unwrap_or(Value::Null);
            // What is compared: a Status whole, a List's names, a review's user.
            let v = if v["kind"] == "Status" {
                v
            } else if let Some(items) = v["items"].as_array_mut() {
                json!(
                    items
                        .iter()
                        .map(|i| i["metadata"]["name"].clone())
                        .collect::<Vec<_>>()
                )
            } else {
                v["status"].take()
            };
            pair.push(json!({"code": code, "body": v}));
        }
        let mut diffs = Vec::new();
        diff("", &pair[0], &pair[1], &mut diffs);
        o.record("impersonation", &format!("{what}: {method} {path}"), diffs);
        answers.push((what, pair[1].clone()));
    }
    // The comparison is not of two refusals: kube-apiserver allowed some.
    let allowed = answers
        .iter()
        .filter(|(_, a)| a["code"] == 200 || a["code"] == 201)
        .count();
    assert!(allowed >= 4, "kube-apiserver's answers: {answers:?}");
    // What `kubectl auth can-i VERB configmaps -n NS --as alice` sends: a
    // SelfSubjectAccessReview as alice. The same answer from both.
    let ssar = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
    for (ns, verb) in [("team-a", "list"), ("team-b", "list"), ("team-a", "delete")] {
        let review = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"namespace": ns, "verb": verb, "resource": "configmaps"}}});
        let mut pair = Vec::new();
        for kube in [false, true] {
            let (client, url) = o.client_for(kube, ssar);
            let r = client
                .post(url)
                .header("authorization", "Bearer carol-token")
                .header("impersonate-user", "alice")
                .header("content-type", JSON)
                .body(review.to_string())
                .send()
                .await
                .expect("review");
            let code = r.status().as_u16();
            let v: Value = r.json().await.unwrap_or(Value::Null);
            pair.push(json!({"code": code, "allowed": v["status"]["allowed"]}));
        }
        assert_eq!(pair[0], pair[1], "can-i {verb} configmaps in {ns} as alice");
        assert_eq!(pair[1]["code"], 201, "{pair:?}");
    }
    assert!(
        o.failures.is_empty(),
        "{} differences from kube-apiserver 1.37 (of {} comparisons):\n{}",
        o.failures.len(),
        o.compared,
        o.failures.join("\n")
    );
}

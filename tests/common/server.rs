//! In-process REST API server for the API tests: `Server::new(..).serve(..)`
//! on a free loopback port against the shared (or a private) etcd, plus
//! helpers to read etcd directly.

use std::net::SocketAddr;
use std::time::Duration;

use etcd_client::GetOptions;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use watchcache::api::Server;
use watchcache::config::Config;
use watchcache::storage::Storage;

use crate::common;

pub struct TestServer {
    pub addr: SocketAddr,
    pub prefix: String,
    pub endpoint: String,
    pub http: reqwest::Client,
    pub etcd: etcd_client::Client,
    /// The server's cachers, one per resource (test hooks).
    pub cachers: Vec<std::sync::Arc<watchcache::cacher::Cacher>>,
    shutdown: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

/// A config for the test resources (pods namespaced core with an index,
/// nodes cluster-scoped, widgets in group example.com) under `prefix`.
pub fn test_config(endpoint: &str, prefix: &str) -> Config {
    let text = common::daemon_config(endpoint, prefix, "");
    let mut cfg = Config::parse(&text, "test").expect("test config parses");
    // Long enough for a busy CI machine's cache to catch up with a write;
    // tests of the timeout itself set their own.
    cfg.server.consistent_read_timeout_ms = 5_000;
    cfg
}

impl TestServer {
    /// Starts a server on the shared etcd with a fresh prefix; `tweak` may
    /// change the config first. Waits until every cacher is ready.
    pub async fn start(name: &str, tweak: impl FnOnce(&mut Config)) -> TestServer {
        let endpoint = common::etcd().to_string();
        let prefix = common::unique_prefix(name);
        TestServer::start_on(&endpoint, &prefix, tweak, true).await
    }

    pub async fn start_on(
        endpoint: &str,
        prefix: &str,
        tweak: impl FnOnce(&mut Config),
        wait_ready: bool,
    ) -> TestServer {
        let mut cfg = test_config(endpoint, prefix);
        tweak(&mut cfg);
        let tls = cfg.server.tls.is_some();
        let storage = Storage::connect(&cfg.etcd).await.expect("connect storage");
        let server = Server::new(cfg, storage).expect("server config loads");
        let cachers = server.cachers();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (tx, rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(async move {
            let _ = server
                .serve(listener, async move {
                    let _ = rx.await;
                })
                .await;
        });
        let etcd = etcd_client::Client::connect([endpoint], None)
            .await
            .expect("etcd client");
        let ts = TestServer {
            addr,
            prefix: prefix.to_string(),
            endpoint: endpoint.to_string(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("http client"),
            etcd,
            cachers: cachers.clone(),
            shutdown: Some(tx),
            handle: Some(handle),
        };
        if wait_ready && tls {
            // The plain-HTTP client cannot probe a TLS port: wait on the
            // cachers themselves.
            for c in &cachers {
                assert!(
                    c.wait_ready(Duration::from_secs(20)).await,
                    "server did not become ready"
                );
            }
        } else if wait_ready {
            let url = ts.url("/readyz");
            let http = ts.http.clone();
            let ok = common::eventually(Duration::from_secs(20), || {
                let (url, http) = (url.clone(), http.clone());
                async move { matches!(http.get(&url).send().await, Ok(r) if r.status() == 200) }
            })
            .await;
            assert!(ok, "server did not become ready");
        }
        ts
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Triggers shutdown and waits for `serve` to return; returns how long it took.
    pub async fn shutdown(&mut self) -> Duration {
        let start = std::time::Instant::now();
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.handle.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), h).await;
        }
        start.elapsed()
    }

    /// Every key under this server's prefix: (key, value, mod_revision).
    pub async fn etcd_dump(&self) -> Vec<(String, Vec<u8>, i64)> {
        let mut c = self.etcd.clone();
        let resp = c
            .get(self.prefix.as_str(), Some(GetOptions::new().with_prefix()))
            .await
            .expect("etcd get");
        resp.kvs()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    kv.value().to_vec(),
                    kv.mod_revision(),
                )
            })
            .collect()
    }

    /// etcd's current revision.
    pub async fn etcd_revision(&self) -> i64 {
        let mut c = self.etcd.clone();
        let resp = c.get("/", None).await.expect("etcd get");
        resp.header().map(|h| h.revision()).unwrap_or(0)
    }

    /// The stored JSON of one key, if any.
    pub async fn etcd_get(&self, key: &str) -> Option<Value> {
        let mut c = self.etcd.clone();
        let resp = c.get(key, None).await.expect("etcd get");
        resp.kvs()
            .first()
            .map(|kv| serde_json::from_slice(kv.value()).expect("stored JSON"))
    }

    pub fn pod_key(&self, ns: &str, name: &str) -> String {
        format!("{}/pods/{ns}/{name}", self.prefix)
    }

    /// POSTs a JSON body and returns (status, JSON body).
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        content_type: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> (u16, Value) {
        let mut req = self.http.request(method, self.url(path));
        if let Some(ct) = content_type {
            req = req.header("Content-Type", ct);
        }
        if let Some(b) = body {
            req = req.body(b);
        }
        let resp = req.send().await.expect("request");
        let code = resp.status().as_u16();
        let bytes = resp.bytes().await.expect("body");
        let v = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (code, v)
    }

    /// The `/metrics` page.
    pub async fn metrics_text(&self) -> String {
        self.http
            .get(self.url("/metrics"))
            .send()
            .await
            .expect("/metrics")
            .text()
            .await
            .expect("/metrics body")
    }

    /// The value of one `/metrics` sample, given with its labels and the
    /// space after them (0 when absent). The registry is the test
    /// binary's: look at labels only one test moves, or at increases.
    pub async fn metric(&self, sample: &str) -> f64 {
        self.metrics_text()
            .await
            .lines()
            .find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
            .unwrap_or(0.0)
    }

    pub async fn get_json(&self, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, path, None, None).await
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send(
            reqwest::Method::POST,
            path,
            Some("application/json"),
            Some(body.to_string().into_bytes()),
        )
        .await
    }

    pub async fn put_json(&self, path: &str, body: &Value) -> (u16, Value) {
        self.send(
            reqwest::Method::PUT,
            path,
            Some("application/json"),
            Some(body.to_string().into_bytes()),
        )
        .await
    }

    pub async fn patch_json(&self, path: &str, ct: &str, body: &Value) -> (u16, Value) {
        self.send(
            reqwest::Method::PATCH,
            path,
            Some(ct),
            Some(body.to_string().into_bytes()),
        )
        .await
    }

    pub async fn delete_json(&self, path: &str, body: Option<&Value>) -> (u16, Value) {
        self.send(
            reqwest::Method::DELETE,
            path,
            body.map(|_| "application/json"),
            body.map(|b| b.to_string().into_bytes()),
        )
        .await
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Creates `n` pods `big-000`... in `ns`, each with a `note` annotation of
/// `note_bytes` bytes that differ from pod to pod (the List's size and a
/// realistic-enough gzip ratio are what the compression tests need).
pub async fn create_large_pods(ts: &TestServer, ns: &str, n: usize, note_bytes: usize) {
    for i in 0..n {
        let mut p = pod(ns, &format!("big-{i:03}"));
        let note: String = (0..note_bytes)
            .map(|j| char::from(b'a' + ((i * 7 + j * j) % 26) as u8))
            .collect();
        p["metadata"]["annotations"] = serde_json::json!({ "note": note });
        let (c, v) = ts
            .post_json(&format!("/api/v1/namespaces/{ns}/pods"), &p)
            .await;
        assert_eq!(c, 201, "{v}");
    }
}

/// The whole of a gzip stream; panics on a truncated or corrupt one.
pub fn gunzip(b: &[u8]) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(b)
        .read_to_end(&mut out)
        .expect("a whole gzip stream");
    out
}

/// A pod object.
pub fn pod(ns: &str, name: &str) -> Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "web"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "nginx"}]},
    })
}

/// The `metadata.resourceVersion` of an object as a number.
pub fn rv_of(v: &Value) -> i64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no resourceVersion in {v}"))
}

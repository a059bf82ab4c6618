//! client-go against watchcache (issue "kube-apiserver as the oracle"
//! §1/§3): a real `k8s.io/client-go` SharedIndexInformer
//! (tests/clients/go/informer, built and cached by `scripts/clients.sh`)
//! follows the configmaps of a namespace through churn, with client-go's
//! WatchListClient feature gate off and on; its store must end equal (names
//! and resourceVersions) to watchcache's List.
mod common;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

const CONFIGMAPS: &str = r#"
[[resources]]
group = ""
version = "v1"
kind = "ConfigMap"
plural = "configmaps"
namespaced = true
history_capacity = 1000
"#;

/// name -> resourceVersion
type Store = BTreeMap<String, String>;

/// The informer binary: `scripts/clients.sh informer` builds it when it is
/// not cached yet and prints "informer PATH".
fn informer_binary() -> String {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new("bash")
        .arg(format!("{root}/scripts/clients.sh"))
        .arg("informer")
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/clients.sh");
    assert!(out.status.success(), "scripts/clients.sh informer failed");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    text.lines()
        .find_map(|l| l.strip_prefix("informer "))
        .expect("informer path")
        .trim()
        .to_string()
}

struct Informer {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: tokio::io::Lines<BufReader<ChildStdout>>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    synced: tokio::sync::watch::Receiver<bool>,
}

impl Informer {
    async fn start(bin: &str, server: &str, namespace: &str, watch_list: bool) -> Informer {
        let mut child = Command::new(bin)
            .args(["--server", server, "--resource", "configmaps"])
            .args(["--namespace", namespace])
            .env("KUBE_FEATURE_WatchListClient", watch_list.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn informer");
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (tx, synced) = tokio::sync::watch::channel(false);
        let mut err_lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let log = stderr.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = err_lines.next_line().await {
                if line.trim() == "SYNCED" {
                    let _ = tx.send(true);
                }
                let mut log = log.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        Informer {
            stdin: child.stdin.take(),
            stdout: BufReader::new(child.stdout.take().unwrap()).lines(),
            child,
            stderr,
            synced,
        }
    }

    fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    async fn wait_synced(&mut self) {
        let ok = tokio::time::timeout(
            Duration::from_secs(30),
            self.synced.wait_for(|synced| *synced),
        )
        .await
        .is_ok_and(|r| r.is_ok());
        assert!(
            ok,
            "informer printed SYNCED within 30 s; its log:\n{}",
            self.log()
        );
    }

    /// Reads store lines until "END" (`until_end`) or EOF.
    async fn read_store(&mut self, until_end: bool) -> Store {
        let mut store = Store::new();
        loop {
            let line = tokio::time::timeout(Duration::from_secs(10), self.stdout.next_line())
                .await
                .expect("informer answered")
                .expect("read informer stdout");
            let Some(line) = line else {
                assert!(!until_end, "informer stdout ended before END");
                return store;
            };
            if line == "END" && until_end {
                return store;
            }
            let e: Value = serde_json::from_str(&line).expect("a JSON line");
            store.insert(
                e["name"].as_str().unwrap().to_string(),
                e["resourceVersion"].as_str().unwrap().to_string(),
            );
        }
    }

    async fn dump(&mut self) -> Store {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(b"DUMP\n").await.expect("write DUMP");
        stdin.flush().await.expect("flush");
        self.read_store(true).await
    }

    /// Closes stdin; the informer prints its store and exits 0.
    async fn finish(mut self) -> Store {
        drop(self.stdin.take());
        let store = self.read_store(false).await;
        let status = tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .expect("informer exited within 10 s of stdin EOF")
            .expect("wait informer");
        assert!(
            status.success(),
            "informer exit: {status}; log:\n{}",
            self.log()
        );
        store
    }
}

async fn list(http: &reqwest::Client, d: &common::Daemon, ns: &str) -> Store {
    let r = http
        .get(d.url(&format!("/api/v1/namespaces/{ns}/configmaps")))
        .send()
        .await
        .expect("list");
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.expect("list JSON");
    body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|o| {
            (
                o["metadata"]["name"].as_str().unwrap().to_string(),
                o["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect()
}

async fn create(http: &reqwest::Client, d: &common::Daemon, ns: &str, name: &str) {
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns},
        "data": {"v": "0"}
    });
    let r = http
        .post(d.url(&format!("/api/v1/namespaces/{ns}/configmaps")))
        .header("Content-Type", "application/json")
        .body(cm.to_string())
        .send()
        .await
        .expect("create");
    assert_eq!(
        r.status(),
        201,
        "create {name}: {}",
        r.text().await.unwrap()
    );
}

async fn update(http: &reqwest::Client, d: &common::Daemon, ns: &str, name: &str) {
    let r = http
        .patch(d.url(&format!("/api/v1/namespaces/{ns}/configmaps/{name}")))
        .header("Content-Type", "application/merge-patch+json")
        .body(json!({"data": {"v": "1"}}).to_string())
        .send()
        .await
        .expect("update");
    assert_eq!(
        r.status(),
        200,
        "update {name}: {}",
        r.text().await.unwrap()
    );
}

async fn delete(http: &reqwest::Client, d: &common::Daemon, ns: &str, name: &str) {
    let r = http
        .delete(d.url(&format!("/api/v1/namespaces/{ns}/configmaps/{name}")))
        .send()
        .await
        .expect("delete");
    assert_eq!(
        r.status(),
        200,
        "delete {name}: {}",
        r.text().await.unwrap()
    );
}

async fn informer_follows_churn(watch_list: bool) {
    let bin = tokio::task::spawn_blocking(informer_binary)
        .await
        .expect("build informer");
    let prefix = common::unique_prefix(&format!("client-go-{watch_list}"));
    let d = common::Daemon::start(
        &common::daemon_config(common::etcd(), &prefix, CONFIGMAPS),
        &[],
    )
    .await;
    d.wait_ready().await;
    let http = reqwest::Client::new();
    let ns = "informer";

    // Some objects before the informer starts, for its initial list.
    for i in 0..5 {
        create(&http, &d, ns, &format!("pre-{i}")).await;
    }
    let mut informer = Informer::start(&bin, &d.url(""), ns, watch_list).await;
    informer.wait_synced().await;
    assert!(
        informer
            .log()
            .contains(&format!("WatchListClient={watch_list}")),
        "client-go's gate follows KUBE_FEATURE_WatchListClient; log:\n{}",
        informer.log()
    );
    let first = informer.dump().await;
    assert_eq!(first, list(&http, &d, ns).await, "store after sync");

    // Churn: create 30, update 20, delete 10.
    for i in 0..30 {
        create(&http, &d, ns, &format!("cm-{i:02}")).await;
    }
    for i in 0..20 {
        update(&http, &d, ns, &format!("cm-{i:02}")).await;
    }
    for i in 20..30 {
        delete(&http, &d, ns, &format!("cm-{i:02}")).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut expected = list(&http, &d, ns).await;
    while expected.len() != 25 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        expected = list(&http, &d, ns).await;
    }
    assert_eq!(
        expected.len(),
        25,
        "watchcache's List shows the final state: {expected:?}"
    );

    // The informer catches up: poll its store until equal, within 30 s.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut seen = informer.dump().await;
    while seen != expected && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        seen = informer.dump().await;
    }
    assert_eq!(
        seen,
        expected,
        "informer store (WatchListClient={watch_list}) equals watchcache's List; log:\n{}",
        informer.log()
    );
    let last = informer.finish().await;
    assert_eq!(last, expected, "store printed at stdin EOF");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn informer_list_watch() {
    informer_follows_churn(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn informer_watch_list() {
    informer_follows_churn(true).await;
}

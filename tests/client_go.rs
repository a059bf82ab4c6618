//! client-go against watchcache (issue "kube-apiserver as the oracle"
//! §1/§3): a real `k8s.io/client-go` SharedIndexInformer
//! (tests/clients/go/informer, built against v0.34 and against the newest
//! client-go, cached by `scripts/clients.sh`) on configmaps and pods, in JSON
//! and in protobuf, through a TCP tap that records its requests:
//! - churn: its store ends equal (names and resourceVersions) to
//!   watchcache's List and to etcd; v0.34 with WatchListClient off LISTs then
//!   WATCHes, with it on (and the newest, by default) it sends one
//!   `sendInitialEvents=true` watch and no LIST;
//! - a forced 410: cut off while writes overrun a 20-event history and etcd
//!   is compacted, each informer relists exactly once and converges;
//! - bookmarks: on a quiet namespace the informer resumes after a cut
//!   without a relist, bookmarks having moved it past the compaction.
mod common;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::GetOptions;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// configmaps and pods, with this history capacity and bookmark interval.
fn config(endpoint: &str, prefix: &str, history: usize, bookmark_ms: u64) -> String {
    let mut text = format!(
        "listen = \"127.0.0.1:0\"\n[etcd]\nendpoints = [\"{endpoint}\"]\nprefix = \"{prefix}\"\nrequest_timeout_ms = 10000\ndial_timeout_ms = 1000\n[server]\nbookmark_interval_ms = {bookmark_ms}\n"
    );
    for (kind, plural) in [("ConfigMap", "configmaps"), ("Pod", "pods")] {
        text.push_str(&format!(
            "[[resources]]\ngroup = \"\"\nversion = \"v1\"\nkind = \"{kind}\"\nplural = \"{plural}\"\nnamespaced = true\nhistory_capacity = {history}\n"
        ));
    }
    text
}

/// name -> resourceVersion
type Store = BTreeMap<String, String>;

/// Which client-go, and how its informer gets its initial state.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Client {
    /// v0.34, WatchListClient off: LIST, then WATCH.
    ListWatch,
    /// v0.34, WatchListClient on: a `sendInitialEvents=true` watch.
    WatchList,
    /// The newest client-go, its default (WatchList).
    Latest,
}

impl Client {
    const ALL: [Client; 3] = [Client::ListWatch, Client::WatchList, Client::Latest];

    fn program(self) -> &'static str {
        match self {
            Client::Latest => "informer-latest",
            _ => "informer",
        }
    }

    fn watch_list(self) -> bool {
        self != Client::ListWatch
    }
}

/// The informer binary of `name`: `scripts/clients.sh NAME` builds it when
/// it is not cached yet and prints "NAME PATH".
fn informer_binary(name: &str) -> String {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new("bash")
        .arg(format!("{root}/scripts/clients.sh"))
        .arg(name)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/clients.sh");
    assert!(out.status.success(), "scripts/clients.sh {name} failed");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .expect("informer path")
        .trim()
        .to_string()
}

async fn binary(client: Client) -> String {
    let name = client.program();
    tokio::task::spawn_blocking(move || informer_binary(name))
        .await
        .expect("build informer")
}

/// A TCP forwarder between an informer and watchcache (plain HTTP/1.1) that
/// records each request line and counts the BOOKMARK events it passes back.
/// `cut` closes its listener (new connections are refused, as by a server
/// that is down) and drops the live ones; `restore` listens again on the
/// same port.
struct Tap {
    addr: std::net::SocketAddr,
    open: tokio::sync::watch::Sender<bool>,
    requests: Arc<Mutex<Vec<String>>>,
    bookmarks: Arc<std::sync::atomic::AtomicUsize>,
    /// Responses sent with `content-encoding: gzip`.
    gzipped: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Tap {
    /// With `hide_gzip`, requests offer no gzip (their `Accept-Encoding:
    /// gzip` becomes `none`), so the BOOKMARKs stay countable.
    async fn start(target: std::net::SocketAddr, hide_gzip: bool) -> Tap {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind tap");
        let addr = listener.local_addr().expect("tap addr");
        let (open, _) = tokio::sync::watch::channel(true);
        let requests = Arc::new(Mutex::new(Vec::new()));
        let bookmarks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let gzipped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let open_tx = open.clone();
        let mut open_rx = open.subscribe();
        let (reqs, marks, zs) = (requests.clone(), bookmarks.clone(), gzipped.clone());
        let task = tokio::spawn(async move {
            let mut listener = Some(listener);
            loop {
                let Some(l) = listener.as_ref() else {
                    // Cut: wait to be opened again, then listen on the same port.
                    if open_rx.wait_for(|open| *open).await.is_err() {
                        return;
                    }
                    listener = Some(bind_again(addr).await);
                    continue;
                };
                let cut = tokio::select! {
                    accepted = l.accept() => {
                        // One accepted as the tap is cut is closed at once.
                        if let Ok((inbound, _)) = accepted
                            && *open_tx.borrow()
                        {
                            let conn_open = open_tx.subscribe();
                            let counts = (reqs.clone(), marks.clone(), zs.clone());
                            tokio::spawn(forward(inbound, target, conn_open, counts, hide_gzip));
                        }
                        false
                    }
                    closed = async { open_rx.wait_for(|open| !*open).await.is_ok() } => closed,
                };
                if cut {
                    listener = None;
                }
            }
        });
        Tap {
            addr,
            open,
            requests,
            bookmarks,
            gzipped,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    fn bookmarks(&self) -> usize {
        self.bookmarks.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn gzipped(&self) -> usize {
        self.gzipped.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn cut(&self) {
        self.open.send_replace(false);
    }

    fn restore(&self) {
        self.open.send_replace(true);
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn bind_again(addr: std::net::SocketAddr) -> tokio::net::TcpListener {
    for _ in 0..100 {
        if let Ok(l) = tokio::net::TcpListener::bind(addr).await {
            return l;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the tap could not listen on {addr} again");
}

/// One connection: both directions copied until either side closes or the
/// tap is cut; request lines, BOOKMARKs and gzipped responses recorded on
/// the way.
async fn forward(
    inbound: tokio::net::TcpStream,
    target: std::net::SocketAddr,
    mut open: tokio::sync::watch::Receiver<bool>,
    (requests, bookmarks, gzipped): (
        Arc<Mutex<Vec<String>>>,
        Arc<std::sync::atomic::AtomicUsize>,
        Arc<std::sync::atomic::AtomicUsize>,
    ),
    hide_gzip: bool,
) {
    let Ok(outbound) = tokio::net::TcpStream::connect(target).await else {
        return;
    };
    let (mut cr, mut cw) = inbound.into_split();
    let (mut sr, mut sw) = outbound.into_split();
    let up = async {
        let mut buf = vec![0u8; 16 * 1024];
        let mut line = Vec::new();
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            for &b in &buf[..n] {
                line.push(b);
                if line.ends_with(b"\r\n") {
                    let text = String::from_utf8_lossy(&line[..line.len() - 2]).into_owned();
                    if let Some(rest) = text.strip_prefix("GET ")
                        && let Some(target) = rest.strip_suffix(" HTTP/1.1")
                    {
                        requests.lock().unwrap().push(target.to_string());
                    }
                    line.clear();
                } else if line.len() > 64 * 1024 {
                    line.clear();
                }
            }
            if hide_gzip {
                // Go writes a request's head at once: the header is whole.
                const OFFER: &[u8] = b"Accept-Encoding: gzip\r\n";
                if let Some(at) = buf[..n].windows(OFFER.len()).position(|w| w == OFFER) {
                    buf[at + OFFER.len() - 6..at + OFFER.len() - 2].copy_from_slice(b"none");
                }
            }
            if sw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; 64 * 1024];
        let mut carry: Vec<u8> = Vec::new();
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            carry.extend_from_slice(&buf[..n]);
            let found = carry.windows(8).filter(|w| w == b"BOOKMARK").count();
            bookmarks.fetch_add(found, std::sync::atomic::Ordering::SeqCst);
            const GZIPPED: &[u8] = b"\r\ncontent-encoding: gzip\r\n";
            let found = carry
                .windows(GZIPPED.len())
                .filter(|w| w == &GZIPPED)
                .count();
            gzipped.fetch_add(found, std::sync::atomic::Ordering::SeqCst);
            let keep = carry.len().min(GZIPPED.len() - 1);
            carry.drain(..carry.len() - keep);
            if cw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        biased;
        _ = open.wait_for(|open| !*open) => {}
        _ = up => {}
        _ = down => {}
    }
}

/// What an informer asked for, from the tap's request lines.
#[derive(Debug, Default, PartialEq)]
struct Requests {
    /// Plain LISTs.
    lists: usize,
    /// Watches with `sendInitialEvents=true` (WatchList's initial state).
    initial_watches: usize,
    /// Other watches.
    watches: usize,
}

impl Requests {
    fn of(lines: &[String]) -> Requests {
        let mut r = Requests::default();
        for l in lines {
            let query = l.split_once('?').map(|(_, q)| q).unwrap_or("");
            let has = |kv: &str| query.split('&').any(|p| p == kv);
            if !has("watch=true") {
                r.lists += 1;
            } else if has("sendInitialEvents=true") {
                r.initial_watches += 1;
            } else {
                r.watches += 1;
            }
        }
        r
    }

    /// Requests for the whole state: a LIST or an initial-events watch.
    fn relists(&self) -> usize {
        self.lists + self.initial_watches
    }
}

struct Informer {
    what: String,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: tokio::io::Lines<BufReader<ChildStdout>>,
    stderr: Arc<Mutex<String>>,
    synced: tokio::sync::watch::Receiver<bool>,
    tap: Tap,
}

impl Informer {
    /// An informer of `client` on `resource` in `namespace`, through a tap
    /// in front of `d`.
    async fn start(
        client: Client,
        d: &common::Daemon,
        resource: &str,
        namespace: &str,
        protobuf: bool,
        hide_gzip: bool,
    ) -> Informer {
        let flags: &[&str] = if protobuf { &["--protobuf"] } else { &[] };
        Informer::start_with(client, d, resource, namespace, flags, hide_gzip).await
    }

    /// [`Informer::start`] with the program's own `flags`.
    async fn start_with(
        client: Client,
        d: &common::Daemon,
        resource: &str,
        namespace: &str,
        flags: &[&str],
        hide_gzip: bool,
    ) -> Informer {
        Informer::start_at(client, d.addr, resource, namespace, flags, hide_gzip).await
    }

    /// [`Informer::start_with`] through a tap in front of `target`.
    async fn start_at(
        client: Client,
        target: std::net::SocketAddr,
        resource: &str,
        namespace: &str,
        flags: &[&str],
        hide_gzip: bool,
    ) -> Informer {
        let protobuf = flags.contains(&"--protobuf");
        let bin = binary(client).await;
        let tap = Tap::start(target, hide_gzip).await;
        let mut cmd = Command::new(bin);
        cmd.args(["--server", &tap.url(), "--resource", resource])
            .args(["--namespace", namespace])
            .args(flags);
        // The newest runs with its default gates; v0.34 with the gate set.
        if client != Client::Latest {
            cmd.env(
                "KUBE_FEATURE_WatchListClient",
                client.watch_list().to_string(),
            );
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn informer");
        let stderr = Arc::new(Mutex::new(String::new()));
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
        let encoding = if protobuf { "protobuf" } else { "JSON" };
        Informer {
            what: format!(
                "{client:?} informer on {resource} in {namespace} ({encoding} {flags:?})"
            ),
            stdin: child.stdin.take(),
            stdout: BufReader::new(child.stdout.take().unwrap()).lines(),
            child,
            stderr,
            synced,
            tap,
        }
    }

    fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn requests(&self) -> Requests {
        Requests::of(&self.tap.requests())
    }

    /// Waits for SYNCED and checks the client-go and gate it reports.
    async fn wait_synced(&mut self, client: Client) {
        let ok = tokio::time::timeout(
            Duration::from_secs(30),
            self.synced.wait_for(|synced| *synced),
        )
        .await
        .is_ok_and(|r| r.is_ok());
        assert!(
            ok,
            "{} printed SYNCED within 30 s; its log:\n{}",
            self.what,
            self.log()
        );
        let log = self.log();
        let want = format!("WatchListClient={}", client.watch_list());
        assert!(log.contains(&want), "{}: {want}; log:\n{log}", self.what);
        let version = if client == Client::Latest {
            "client-go=v0.37."
        } else {
            "client-go=v0.34."
        };
        assert!(
            log.contains(version),
            "{}: {version}; log:\n{log}",
            self.what
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

    /// Polls the store until it equals `expected`, within 60 s.
    async fn converge(&mut self, expected: &Store) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut seen = self.dump().await;
        while &seen != expected && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            seen = self.dump().await;
        }
        assert_eq!(
            &seen,
            expected,
            "{}: its store equals the expected state; log:\n{}",
            self.what,
            self.log()
        );
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
            "{} exit: {status}; log:\n{}",
            self.what,
            self.log()
        );
        store
    }
}

/// watchcache's List of `resource` in `ns`.
async fn list(http: &reqwest::Client, d: &common::Daemon, resource: &str, ns: &str) -> Store {
    let r = http
        .get(d.url(&format!("/api/v1/namespaces/{ns}/{resource}")))
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

/// etcd's state of `resource` in `ns`: name -> mod_revision.
async fn etcd_state(endpoint: &str, prefix: &str, resource: &str, ns: &str) -> Store {
    let mut c = etcd_client::Client::connect([endpoint], None)
        .await
        .expect("etcd client");
    let key = format!("{}/{resource}/{ns}/", prefix.trim_end_matches('/'));
    let resp = c
        .get(key.as_str(), Some(GetOptions::new().with_prefix()))
        .await
        .expect("etcd get");
    resp.kvs()
        .iter()
        .map(|kv| {
            let k = String::from_utf8_lossy(kv.key());
            (
                k.trim_start_matches(&key).to_string(),
                kv.mod_revision().to_string(),
            )
        })
        .collect()
}

fn object(resource: &str, ns: &str, name: &str) -> Value {
    match resource {
        "pods" => json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}
        }),
        _ => json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns},
            "data": {"v": "0"}
        }),
    }
}

async fn create(http: &reqwest::Client, d: &common::Daemon, resource: &str, ns: &str, name: &str) {
    let r = http
        .post(d.url(&format!("/api/v1/namespaces/{ns}/{resource}")))
        .header("Content-Type", "application/json")
        .body(object(resource, ns, name).to_string())
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

async fn update(http: &reqwest::Client, d: &common::Daemon, resource: &str, ns: &str, name: &str) {
    let r = http
        .patch(d.url(&format!("/api/v1/namespaces/{ns}/{resource}/{name}")))
        .header("Content-Type", "application/merge-patch+json")
        .body(json!({"metadata": {"labels": {"v": "1"}}}).to_string())
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

async fn delete(http: &reqwest::Client, d: &common::Daemon, resource: &str, ns: &str, name: &str) {
    let r = http
        .delete(d.url(&format!(
            "/api/v1/namespaces/{ns}/{resource}/{name}?gracePeriodSeconds=0"
        )))
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

/// Creates 30, updates 20, deletes 10 (`tag` keeps rounds apart).
async fn churn(http: &reqwest::Client, d: &common::Daemon, resource: &str, ns: &str, tag: &str) {
    for i in 0..30 {
        create(http, d, resource, ns, &format!("{tag}-{i:02}")).await;
    }
    for i in 0..20 {
        update(http, d, resource, ns, &format!("{tag}-{i:02}")).await;
    }
    for i in 20..30 {
        delete(http, d, resource, ns, &format!("{tag}-{i:02}")).await;
    }
}

/// watchcache's List once it equals etcd's state (names and RVs).
async fn settled(
    http: &reqwest::Client,
    d: &common::Daemon,
    endpoint: &str,
    prefix: &str,
    resource: &str,
    ns: &str,
) -> Store {
    let want = etcd_state(endpoint, prefix, resource, ns).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut got = list(http, d, resource, ns).await;
    while got != want && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        got = list(http, d, resource, ns).await;
    }
    assert_eq!(
        got, want,
        "watchcache's List of {resource} in {ns} equals etcd"
    );
    got
}

/// For one client: on configmaps and pods, JSON and protobuf, an informer
/// syncs, follows churn and ends equal to watchcache's List and etcd; the
/// tap shows how it got its initial state.
async fn informer_follows_churn(client: Client) {
    let endpoint = common::etcd();
    let prefix = common::unique_prefix(&format!("client-go-{client:?}"));
    let d = common::Daemon::start(&config(endpoint, &prefix, 1000, 60_000), &[]).await;
    d.wait_ready().await;
    let http = reqwest::Client::new();
    for resource in ["configmaps", "pods"] {
        for protobuf in [false, true] {
            let ns = format!("churn-{}", if protobuf { "pb" } else { "json" });
            // Some objects before the informer starts, for its initial state.
            for i in 0..5 {
                create(&http, &d, resource, &ns, &format!("pre-{i}")).await;
            }
            let mut inf = Informer::start(client, &d, resource, &ns, protobuf, false).await;
            inf.wait_synced(client).await;
            let first = inf.dump().await;
            assert_eq!(
                first,
                list(&http, &d, resource, &ns).await,
                "store after sync"
            );

            churn(&http, &d, resource, &ns, "obj").await;
            let expected = settled(&http, &d, endpoint, &prefix, resource, &ns).await;
            assert_eq!(expected.len(), 25, "the final state: {expected:?}");
            inf.converge(&expected).await;

            // On the wire: LIST+WATCH, or one initial-events watch and no LIST.
            let r = inf.requests();
            if client.watch_list() {
                assert_eq!(
                    (r.lists, r.initial_watches),
                    (0, 1),
                    "{}: a sendInitialEvents=true watch, no LIST: {:?}",
                    inf.what,
                    inf.tap.requests()
                );
                // Go's transport asked for gzip, and the WatchList came
                // gzipped (decoded by the transport itself).
                assert!(inf.tap.gzipped() >= 1, "{}: gzipped WatchList", inf.what);
            } else {
                assert_eq!(
                    (r.lists, r.initial_watches),
                    (1, 0),
                    "{}: one LIST, then watches: {:?}",
                    inf.what,
                    inf.tap.requests()
                );
                assert!(r.watches >= 1, "{}: {:?}", inf.what, inf.tap.requests());
                // A small LIST and plain watches: nothing gzipped.
                assert_eq!(inf.tap.gzipped(), 0, "{}", inf.what);
            }
            let what = inf.what.clone();
            let last = inf.finish().await;
            assert_eq!(last, expected, "{what}: store printed at stdin EOF");
        }
    }
}

/// client-go's metadata informer (`metadata` client and
/// `metadatainformer`: PartialObjectMetadata objects, as controller-runtime's
/// `OnlyMetadata` watches use), v0.34 with LIST+WATCH and the newest with
/// WatchList, on configmaps and pods: it syncs, follows churn and ends
/// equal to watchcache's List and etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_informers_follow_churn() {
    let endpoint = common::etcd();
    let prefix = common::unique_prefix("client-go-metadata");
    let d = common::Daemon::start(&config(endpoint, &prefix, 1000, 60_000), &[]).await;
    d.wait_ready().await;
    let http = reqwest::Client::new();
    for client in [Client::ListWatch, Client::Latest] {
        for resource in ["configmaps", "pods"] {
            let ns = format!("meta-{}", client.program());
            for i in 0..5 {
                create(&http, &d, resource, &ns, &format!("pre-{i}")).await;
            }
            let mut inf =
                Informer::start_with(client, &d, resource, &ns, &["--metadata"], false).await;
            inf.wait_synced(client).await;
            let first = inf.dump().await;
            assert_eq!(first, list(&http, &d, resource, &ns).await, "{}", inf.what);
            churn(&http, &d, resource, &ns, "obj").await;
            let expected = settled(&http, &d, endpoint, &prefix, resource, &ns).await;
            assert_eq!(expected.len(), 25, "the final state: {expected:?}");
            inf.converge(&expected).await;
            let r = inf.requests();
            let initial = if client.watch_list() { (0, 1) } else { (1, 0) };
            assert_eq!(
                (r.lists, r.initial_watches),
                initial,
                "{}: {:?}",
                inf.what,
                inf.tap.requests()
            );
            let what = inf.what.clone();
            assert_eq!(inf.finish().await, expected, "{what}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn informer_list_watch() {
    informer_follows_churn(Client::ListWatch).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn informer_watch_list() {
    informer_follows_churn(Client::WatchList).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn informer_latest_watch_list() {
    informer_follows_churn(Client::Latest).await;
}

/// Each client, on configmaps (JSON) and pods (protobuf), in one namespace
/// of a private etcd (it is compacted) with a 20-event history.
async fn informers(
    d: &common::Daemon,
    ns: &str,
    hide_gzip: bool,
) -> Vec<(Client, &'static str, Informer)> {
    let mut out = Vec::new();
    for client in Client::ALL {
        for (resource, protobuf) in [("configmaps", false), ("pods", true)] {
            let mut inf = Informer::start(client, d, resource, ns, protobuf, hide_gzip).await;
            inf.wait_synced(client).await;
            out.push((client, resource, inf));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn informers_relist_once_after_a_forced_410() {
    let etcd = common::PrivateEtcd::start().await.expect("private etcd");
    let endpoint = etcd.endpoint();
    let prefix = common::unique_prefix("client-go-410");
    let d = common::Daemon::start(&config(&endpoint, &prefix, 20, 60_000), &[]).await;
    d.wait_ready().await;
    let http = reqwest::Client::new();
    let ns = "gone";
    for resource in ["configmaps", "pods"] {
        for i in 0..3 {
            create(&http, &d, resource, ns, &format!("pre-{i}")).await;
        }
    }
    let mut infs = informers(&d, ns, false).await;
    // Past client-go's "very short watch" (under 1 s, no event).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before: Vec<usize> = infs
        .iter()
        .map(|(_, _, inf)| inf.tap.requests().len())
        .collect();

    // Cut off, the informers miss 60 events per resource (three times the
    // history), compacted away in etcd too.
    for (_, _, inf) in &infs {
        inf.tap.cut();
    }
    for resource in ["configmaps", "pods"] {
        churn(&http, &d, resource, ns, "gone").await;
    }
    let mut expected = BTreeMap::new();
    for resource in ["configmaps", "pods"] {
        let state = settled(&http, &d, &endpoint, &prefix, resource, ns).await;
        assert_eq!(state.len(), 23, "{resource}: {state:?}");
        expected.insert(resource, state);
    }
    common::compact_etcd(&endpoint).await;
    // watchcache answers a watch from before the cut with 410 Gone.
    let old_rv = {
        let (_, _, inf) = &infs[0];
        let lines = inf.tap.requests();
        let watch = lines
            .iter()
            .rev()
            .find(|l| l.contains("watch=true"))
            .expect("a watch before the cut")
            .clone();
        watch
            .split(['?', '&'])
            .find_map(|p| p.strip_prefix("resourceVersion="))
            .expect("the watch's resourceVersion")
            .to_string()
    };
    let r = http
        .get(d.url(&format!(
            "/api/v1/namespaces/{ns}/configmaps?watch=true&resourceVersion={old_rv}&timeoutSeconds=1"
        )))
        .send()
        .await
        .expect("watch");
    let text = r.text().await.expect("watch body");
    assert!(
        text.contains("\"code\":410"),
        "a watch from {old_rv} is too old now: {text}"
    );

    for (_, _, inf) in &infs {
        inf.tap.restore();
    }
    for (i, (client, resource, inf)) in infs.iter_mut().enumerate() {
        inf.converge(&expected[resource]).await;
        // Give a second relist (there must be none) time to show.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let after = Requests::of(&inf.tap.requests()[before[i]..]);
        assert_eq!(
            after.relists(),
            1,
            "{client:?} on {resource}: exactly one relist after the 410: {:?}",
            &inf.tap.requests()[before[i]..]
        );
        if client.watch_list() {
            assert_eq!(after.lists, 0, "{}: relisted by WatchList", inf.what);
        }
    }
    for (_, resource, inf) in infs {
        assert_eq!(inf.finish().await, expected[resource]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookmarks_let_a_quiet_informer_resume_past_a_compaction() {
    let etcd = common::PrivateEtcd::start().await.expect("private etcd");
    let endpoint = etcd.endpoint();
    let prefix = common::unique_prefix("client-go-bookmarks");
    // Bookmarks every 300 ms instead of every minute.
    let d = common::Daemon::start(&config(&endpoint, &prefix, 20, 300), &[]).await;
    d.wait_ready().await;
    let http = reqwest::Client::new();
    let (quiet, busy) = ("quiet", "busy");
    let mut expected = BTreeMap::new();
    for resource in ["configmaps", "pods"] {
        for i in 0..2 {
            create(&http, &d, resource, quiet, &format!("q-{i}")).await;
        }
        expected.insert(resource, list(&http, &d, resource, quiet).await);
    }
    // Gzip hidden: the tap counts BOOKMARKs in plain bytes (a WatchList
    // would come gzipped).
    let mut infs = informers(&d, quiet, true).await;

    // Writes elsewhere overrun the history; the quiet informers see none
    // of them, only bookmarks past them.
    for resource in ["configmaps", "pods"] {
        churn(&http, &d, resource, busy, "busy").await;
        settled(&http, &d, &endpoint, &prefix, resource, busy).await;
    }
    let marks: Vec<usize> = infs.iter().map(|(_, _, i)| i.tap.bookmarks()).collect();
    for (i, (_, _, inf)) in infs.iter().enumerate() {
        let (tap, want) = (&inf.tap, marks[i] + 2);
        let ok = common::eventually(Duration::from_secs(20), || async move {
            tap.bookmarks() >= want
        })
        .await;
        assert!(ok, "{}: bookmarks after the writes", inf.what);
    }
    common::compact_etcd(&endpoint).await;
    let before: Vec<usize> = infs
        .iter()
        .map(|(_, _, inf)| inf.tap.requests().len())
        .collect();
    for (_, _, inf) in &infs {
        inf.tap.cut();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let marks: Vec<usize> = infs.iter().map(|(_, _, i)| i.tap.bookmarks()).collect();
    for (_, _, inf) in &infs {
        inf.tap.restore();
    }
    for (i, (client, resource, inf)) in infs.iter_mut().enumerate() {
        // Resumed: a new watch that brings bookmarks again.
        let (tap, want) = (&inf.tap, marks[i] + 2);
        let ok = common::eventually(Duration::from_secs(60), || async move {
            tap.bookmarks() >= want
        })
        .await;
        assert!(ok, "{}: watching again after the cut", inf.what);
        let after = Requests::of(&inf.tap.requests()[before[i]..]);
        assert_eq!(
            after.relists(),
            0,
            "{client:?} on {resource}: resumed without a relist: {:?}",
            &inf.tap.requests()[before[i]..]
        );
        assert!(after.watches >= 1, "{}: watched again", inf.what);
        inf.converge(&expected[resource]).await;
    }
    for (_, resource, inf) in infs {
        assert_eq!(inf.finish().await, expected[resource]);
    }
}

/// HAProxy (Debian's, `scripts/setup.sh`) in TCP mode, round robin over
/// `backends`, each checked with `GET /readyz` every 200 ms; a refused
/// connection is retried on another replica.
struct Haproxy {
    child: Child,
    addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

impl Haproxy {
    async fn start(backends: &[u16]) -> Haproxy {
        let bin = ["haproxy", "/usr/sbin/haproxy"]
            .into_iter()
            .find(|b| {
                std::process::Command::new(b)
                    .arg("-v")
                    .output()
                    .is_ok_and(|o| o.status.success())
            })
            .expect("haproxy (Debian's package: scripts/setup.sh installs it)");
        let port = watchcache::etcd_server::free_port().expect("free port");
        let mut cfg = format!(
            "global\n  maxconn 4096\ndefaults\n  mode tcp\n  timeout connect 1s\n  timeout client 1h\n  timeout server 1h\n  retries 3\n  option redispatch\nfrontend api\n  bind 127.0.0.1:{port}\n  default_backend replicas\nbackend replicas\n  balance roundrobin\n  option httpchk GET /readyz\n  http-check expect status 200\n  default-server inter 200ms fall 1 rise 2\n"
        );
        for (i, p) in backends.iter().enumerate() {
            cfg.push_str(&format!("  server r{i} 127.0.0.1:{p} check\n"));
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, cfg).expect("write haproxy.cfg");
        let child = Command::new(bin)
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn haproxy");
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        let lb = Haproxy {
            child,
            addr,
            _dir: dir,
        };
        let http = reqwest::Client::new();
        let ready = common::eventually(Duration::from_secs(20), || {
            let http = http.clone();
            async move {
                http.get(format!("http://{addr}/readyz"))
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 200)
            }
        })
        .await;
        assert!(ready, "haproxy serves /readyz through its replicas");
        lb
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Which of `replicas` holds the (one) configmaps watch.
async fn watch_holder(http: &reqwest::Client, replicas: &[common::Daemon]) -> usize {
    for _ in 0..100 {
        for (i, d) in replicas.iter().enumerate() {
            if configmap_watchers(http, d).await >= 1.0 {
                return i;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no replica holds the informer's watch");
}

/// SIGKILL, and wait for the exit.
async fn kill_replica(d: &mut common::Daemon) {
    let pid = d.pid().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    d.wait_exit(Duration::from_secs(10)).await;
}

/// `watchcache_watchers` of configmaps on `d`.
async fn configmap_watchers(http: &reqwest::Client, d: &common::Daemon) -> f64 {
    let Ok(r) = http.get(d.url("/metrics")).send().await else {
        return 0.0;
    };
    let text = r.text().await.unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("watchcache_watchers{resource=\"configmaps\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// An update through `d` that changes `name`'s data to `v`: its new RV.
async fn set_data(
    http: &reqwest::Client,
    d: &common::Daemon,
    ns: &str,
    name: &str,
    v: usize,
) -> String {
    let r = http
        .patch(d.url(&format!("/api/v1/namespaces/{ns}/configmaps/{name}")))
        .header("Content-Type", "application/merge-patch+json")
        .body(json!({"data": {"v": v.to_string()}}).to_string())
        .send()
        .await
        .expect("update");
    assert_eq!(r.status(), 200, "update {name}");
    let o: Value = r.json().await.expect("updated object");
    o["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .to_string()
}

/// Per object, the resourceVersions the informer's handlers were given
/// (ADD, then each UPDATE's new object), from its `EVENT` lines.
fn handled(log: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in log.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["EVENT", "ADD", name, rv] => {
                out.entry(name.to_string())
                    .or_default()
                    .push(rv.to_string());
            }
            // old == new: a relist's re-delivery of an unchanged object
            // (client-go's Replace), not a watch event.
            ["EVENT", "UPDATE", name, old, rv] if old != rv => {
                out.entry(name.to_string())
                    .or_default()
                    .push(rv.to_string());
            }
            ["EVENT", "DELETE", name, rv] => {
                out.entry(name.to_string())
                    .or_default()
                    .push(format!("deleted@{rv}"));
            }
            _ => {}
        }
    }
    out
}

/// Three replicas behind HAProxy (#37 point 4): a client-go informer
/// (v0.34 LIST+WATCH, and the newest with WatchList) follows writes made
/// through another replica while the replica holding its watch is killed
/// (SIGKILL) and started again on its port. Its watch resumes on the next
/// replica from its resourceVersion, which is in that replica's history:
/// no relist, and its handlers see every write exactly once, in order. Cut
/// off while the writes overrun every replica's history, it relists once
/// and converges, no version handled twice or out of order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn informers_behind_a_load_balancer_survive_a_replica_restart() {
    // An etcd of its own: three replicas and their writes beside the
    // other tests' daemons on the shared one would slow them all.
    let etcd = common::PrivateEtcd::start().await.expect("private etcd");
    let endpoint = etcd.endpoint();
    let endpoint = endpoint.as_str();
    for client in [Client::ListWatch, Client::Latest] {
        let prefix = common::unique_prefix(&format!("client-go-lb-{client:?}"));
        let text = config(endpoint, &prefix, 30, 1000);
        let ports: Vec<u16> = (0..3)
            .map(|_| watchcache::etcd_server::free_port().expect("free port"))
            .collect();
        let mut replicas = Vec::new();
        for p in &ports {
            let d = common::Daemon::start_on(&text, &[], &[], *p).await;
            d.wait_ready().await;
            replicas.push(d);
        }
        for d in &mut replicas {
            d.assert_running();
        }
        let lb = Haproxy::start(&ports).await;
        let http = reqwest::Client::new();
        let ns = "behind-lb";
        let names: Vec<String> = (0..5).map(|i| format!("cm-{i}")).collect();
        for n in &names {
            create(&http, &replicas[0], "configmaps", ns, n).await;
        }
        let mut inf =
            Informer::start_at(client, lb.addr, "configmaps", ns, &["--events"], true).await;
        inf.wait_synced(client).await;
        // Past client-go's "very short watch" (under 1 s, no event).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // The replica holding the informer's watch, and another to write through.
        let victim = watch_holder(&http, &replicas).await;
        let writer = (victim + 1) % 3;
        let mut written: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut before_kill = 0;
        for round in 0..60 {
            if round == 20 {
                before_kill = inf.tap.requests().len();
                kill_replica(&mut replicas[victim]).await;
            }
            if round == 40 {
                let d = common::Daemon::start_on(&text, &[], &[], ports[victim]).await;
                d.wait_ready().await;
                replicas[victim] = d;
            }
            let name = &names[round % names.len()];
            let rv = set_data(&http, &replicas[writer], ns, name, round + 1).await;
            written.entry(name.clone()).or_default().push(rv);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let expected = settled(
            &http,
            &replicas[writer],
            endpoint,
            &prefix,
            "configmaps",
            ns,
        )
        .await;
        inf.converge(&expected).await;
        // Give a late relist (there must be none) time to show.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            inf.requests().relists(),
            1,
            "{}: only the first List or initial-events watch: {:?}",
            inf.what,
            inf.tap.requests()
        );
        let since_kill = Requests::of(&inf.tap.requests()[before_kill..]);
        assert!(
            since_kill.watches >= 1 && since_kill.relists() == 0,
            "{}: after the kill, its watch resumed (no List): {since_kill:?}",
            inf.what
        );
        // Every write once, in order, after the object's ADD.
        let seen = handled(&inf.log());
        for (name, rvs) in &written {
            let got = seen.get(name).cloned().unwrap_or_default();
            assert_eq!(
                got.get(1..).unwrap_or_default(),
                rvs.as_slice(),
                "{}: {name}'s handled versions after its ADD",
                inf.what
            );
        }

        // Cut off while its replica dies and 60 writes overrun every
        // history (30 events): its resourceVersion is gone, so it relists
        // once, converges, and its handlers never get a version twice or
        // out of order.
        let victim = watch_holder(&http, &replicas).await;
        let writer = (victim + 1) % 3;
        let before_cut = inf.tap.requests().len();
        inf.tap.cut();
        kill_replica(&mut replicas[victim]).await;
        for round in 0..60 {
            set_data(
                &http,
                &replicas[writer],
                ns,
                &names[round % names.len()],
                100 + round,
            )
            .await;
        }
        replicas[victim] = common::Daemon::start_on(&text, &[], &[], ports[victim]).await;
        replicas[victim].wait_ready().await;
        inf.tap.restore();
        let expected = settled(
            &http,
            &replicas[writer],
            endpoint,
            &prefix,
            "configmaps",
            ns,
        )
        .await;
        inf.converge(&expected).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let since_cut = Requests::of(&inf.tap.requests()[before_cut..]);
        assert_eq!(
            since_cut.relists(),
            1,
            "{}: one relist after its resourceVersion left every history: {since_cut:?}",
            inf.what
        );
        for (name, rvs) in handled(&inf.log()) {
            let nums: Vec<i64> = rvs.iter().filter_map(|r| r.parse().ok()).collect();
            assert!(
                nums.windows(2).all(|w| w[0] < w[1]),
                "{}: {name}'s handled versions rise: {rvs:?}",
                inf.what
            );
            assert_eq!(rvs.last(), expected.get(&name), "{}: {name}", inf.what);
        }
        assert_eq!(inf.finish().await, expected);
    }
}

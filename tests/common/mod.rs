//! The shared integration-test harness: a real etcd per test binary (free
//! loopback ports, temp dir, killed at exit), private etcds for tests that
//! kill or compact, and client helpers. Later layers add the daemon here.
#![allow(dead_code, unused_imports)]

pub mod cluster;
pub mod front;
pub mod kube_apiserver;
pub mod kubectl;
pub mod pki;
pub mod server;
pub mod tls;

pub use cluster::EtcdCluster;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use watchcache::cacher::{Cacher, CacherOptions};
use watchcache::config::{EtcdConfig, ResourceConfig};
use watchcache::etcd_server::EtcdServer;
use watchcache::storage::Storage;

pub use watchcache::etcd_server::EtcdServer as PrivateEtcd;

struct Shared {
    endpoint: String,
    pid: u32,
    data_dir: std::path::PathBuf,
}

static SHARED: OnceLock<Shared> = OnceLock::new();

/// The endpoint of the etcd shared by every test in this binary. Tests keep
/// apart by using their own key prefix ([`unique_prefix`]).
pub fn etcd() -> &'static str {
    &SHARED
        .get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            // A keeper thread starts etcd and lives until the process exits, so
            // PDEATHSIG reaps etcd even if the test binary is killed.
            std::thread::Builder::new()
                .name("etcd-keeper".into())
                .spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("keeper runtime");
                    let server = rt.block_on(EtcdServer::start()).expect("start shared etcd");
                    tx.send(Shared {
                        endpoint: server.endpoint(),
                        pid: server.pid().unwrap_or(0),
                        data_dir: server.data_dir().to_path_buf(),
                    })
                    .expect("send endpoint");
                    // Keep `server` alive for the life of the process.
                    loop {
                        std::thread::park();
                    }
                })
                .expect("spawn keeper");
            let shared = rx.recv().expect("shared etcd failed to start");
            // SAFETY: registering a plain extern "C" fn with atexit.
            unsafe {
                libc::atexit(cleanup_shared);
            }
            shared
        })
        .endpoint
}

extern "C" fn cleanup_shared() {
    if let Some(s) = SHARED.get() {
        // SAFETY: kill(2) on the pid of the etcd we started.
        unsafe {
            libc::kill(s.pid as libc::pid_t, libc::SIGKILL);
        }
        let _ = std::fs::remove_dir_all(&s.data_dir);
    }
}

/// A key prefix no other test uses, e.g. `/t/create_conflict-3`.
pub fn unique_prefix(name: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "/t-{}/{name}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// An `EtcdConfig` for one endpoint with short deadlines suited to tests.
pub fn etcd_config(endpoint: &str, prefix: &str) -> EtcdConfig {
    EtcdConfig {
        endpoints: vec![endpoint.to_string()],
        prefix: prefix.to_string(),
        request_timeout_ms: 2_000,
        dial_timeout_ms: 1_000,
        ..EtcdConfig::default()
    }
}

/// The Pod resource of the cacher tests: namespaced, indexed on `spec.nodeName`.
pub fn pods_resource(history_capacity: usize) -> ResourceConfig {
    ResourceConfig {
        group: String::new(),
        version: "v1".into(),
        kind: "Pod".into(),
        plural: "pods".into(),
        namespaced: true,
        indexes: vec!["spec.nodeName".into()],
        history_capacity: Some(history_capacity),
        key_prefix: None,
        ttl_seconds: None,
        storage_encoding: Default::default(),
        short_names: None,
        categories: None,
        ..Default::default()
    }
}

/// Connects a `Storage` to `endpoint` under `prefix`, starts a cacher for
/// `resource` and waits (up to a minute) for its first list.
pub async fn start_cacher(
    endpoint: &str,
    prefix: &str,
    resource: ResourceConfig,
    opts: CacherOptions,
) -> (Storage, std::sync::Arc<Cacher>) {
    let storage = Storage::connect(&etcd_config(endpoint, prefix))
        .await
        .expect("connect");
    let cacher = Cacher::start(resource, prefix, storage.clone(), opts);
    assert!(
        cacher.wait_ready(Duration::from_secs(60)).await,
        "cacher ready"
    );
    (storage, cacher)
}

/// Puts `value` at `key` straight into etcd (behind the cache's back);
/// returns the revision of the write.
pub async fn etcd_put(
    etcd: &mut etcd_client::Client,
    key: impl Into<Vec<u8>>,
    value: impl Into<Vec<u8>>,
) -> i64 {
    etcd.put(key, value, None)
        .await
        .expect("put")
        .header()
        .expect("header")
        .revision()
}

/// Waits until the cacher's RV reaches `rv`; fails the test after `timeout`.
/// Compacts the etcd at `endpoint` (physically) at its current revision.
pub async fn compact_etcd(endpoint: &str) {
    let mut c = etcd_client::Client::connect([endpoint], None)
        .await
        .expect("etcd client");
    let rev = c
        .get("/", None)
        .await
        .expect("etcd get")
        .header()
        .expect("header")
        .revision();
    c.compact(
        rev,
        Some(etcd_client::CompactionOptions::new().with_physical()),
    )
    .await
    .expect("compact");
}

pub async fn wait_cacher_rv(cacher: &Cacher, rv: i64, timeout: Duration) {
    let ok = eventually(timeout, || async move { cacher.resource_version() >= rv }).await;
    assert!(
        ok,
        "cache reached rv {rv} (at {})",
        cacher.resource_version()
    );
}

/// Polls `f` until it returns true or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if f().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Resources used by daemon-level tests: namespaced core (with an index),
/// cluster-scoped core, and a non-core group.
pub const TEST_RESOURCES: &str = r#"
[[resources]]
group = ""
version = "v1"
kind = "Pod"
plural = "pods"
namespaced = true
indexes = ["spec.nodeName"]
history_capacity = 1000

[[resources]]
group = ""
version = "v1"
kind = "Node"
plural = "nodes"
namespaced = false
history_capacity = 1000

[[resources]]
group = "example.com"
version = "v1"
kind = "Widget"
plural = "widgets"
namespaced = true
history_capacity = 1000
"#;

/// A config file text for the daemon: etcd at `endpoint`, keys under `prefix`.
pub fn daemon_config(endpoint: &str, prefix: &str, extra: &str) -> String {
    format!(
        "listen = \"127.0.0.1:0\"\n[etcd]\nendpoints = [\"{endpoint}\"]\nprefix = \"{prefix}\"\nrequest_timeout_ms = 2000\ndial_timeout_ms = 1000\n{extra}\n{TEST_RESOURCES}"
    )
}

/// The `watchcache` binary running as a child process on a free port.
pub struct Daemon {
    child: Option<std::process::Child>,
    pub addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
    pub config_path: std::path::PathBuf,
}

impl Daemon {
    /// Starts the daemon with this config text and extra args; waits for `/healthz`.
    pub async fn start(config_text: &str, args: &[&str]) -> Daemon {
        Daemon::start_env(config_text, args, &[]).await
    }

    /// Like [`Daemon::start`], with extra environment variables (e.g. `RUST_LOG`).
    pub async fn start_env(config_text: &str, args: &[&str], envs: &[(&str, &str)]) -> Daemon {
        let port = watchcache::etcd_server::free_port().expect("free port");
        Daemon::start_on(config_text, args, envs, port).await
    }

    /// [`Daemon::start_env`] listening on `port` (a replica started again
    /// where its clients and load balancer expect it).
    pub async fn start_on(
        config_text: &str,
        args: &[&str],
        envs: &[(&str, &str)],
        port: u16,
    ) -> Daemon {
        let dir = tempfile::tempdir().expect("tempdir");
        let config_path = dir.path().join("watchcache.toml");
        std::fs::write(&config_path, config_text).expect("write config");
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let log = std::fs::File::create(dir.path().join("watchcache.log")).expect("log file");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_watchcache"))
            .arg("--config")
            .arg(&config_path)
            .arg("--listen")
            .arg(addr.to_string())
            .args(args)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .envs(envs.iter().copied())
            .stdin(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn watchcache");
        let mut daemon = Daemon {
            child: Some(child),
            addr,
            _dir: dir,
            config_path,
        };
        let url = daemon.url("/healthz");
        let up = eventually(Duration::from_secs(30), || {
            let url = url.clone();
            async move { matches!(reqwest::get(&url).await, Ok(r) if r.status().is_success()) }
        })
        .await;
        if !up {
            let status = daemon
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            panic!(
                "watchcache did not answer /healthz (exit status: {status:?}); log:\n{}",
                daemon.log()
            );
        }
        daemon.assert_running();
        daemon
    }

    /// Fails the test if the daemon exited: a free port is free only until
    /// another process binds it, and then `/healthz` there is not ours.
    pub fn assert_running(&mut self) {
        if let Some(status) = self
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
        {
            panic!(
                "watchcache on {} exited ({status}): another process has its port? log:\n{}",
                self.addr,
                self.log()
            );
        }
    }

    /// Starts the daemon against `endpoint` with [`TEST_RESOURCES`] under `prefix`.
    pub async fn start_default(endpoint: &str, prefix: &str) -> Daemon {
        Daemon::start(&daemon_config(endpoint, prefix, ""), &[]).await
    }

    /// Waits until `/readyz` answers 200 (every cache listed); fails the
    /// test after 30 s.
    pub async fn wait_ready(&self) {
        let url = self.url("/readyz");
        let ready = eventually(Duration::from_secs(30), || {
            let url = url.clone();
            async move { matches!(reqwest::get(&url).await, Ok(r) if r.status().is_success()) }
        })
        .await;
        assert!(ready, "watchcache became ready; log:\n{}", self.log());
    }

    /// Everything the daemon logged to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("watchcache.log")).unwrap_or_default()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Sends SIGTERM.
    pub fn sigterm(&self) {
        // SAFETY: kill(2) on our own unreaped child.
        unsafe {
            libc::kill(self.pid() as libc::pid_t, libc::SIGTERM);
        }
    }

    /// Waits up to `timeout` for the process to exit; returns its status.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Some(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A TCP forwarder in front of etcd that a test can cut and restore, so a
/// client (the reflector) loses etcd while the test still writes to it
/// directly: deterministic "disconnected while X happened" scenarios.
pub struct TcpProxy {
    pub addr: std::net::SocketAddr,
    /// Where new connections go (see [`TcpProxy::retarget`]).
    target: std::sync::Arc<std::sync::Mutex<std::net::SocketAddr>>,
    /// `true` = forwarding; on `false` live connections are dropped and new
    /// ones are closed at once.
    open: tokio::sync::watch::Sender<bool>,
    /// Forwarded connections still open.
    live: tokio::sync::watch::Sender<usize>,
    task: tokio::task::JoinHandle<()>,
}

/// Counts a forwarded connection as live until dropped.
struct LiveConnection(tokio::sync::watch::Sender<usize>);

impl LiveConnection {
    fn new(live: &tokio::sync::watch::Sender<usize>) -> LiveConnection {
        live.send_modify(|n| *n += 1);
        LiveConnection(live.clone())
    }
}

impl Drop for LiveConnection {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

impl TcpProxy {
    pub async fn start(target: std::net::SocketAddr) -> TcpProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let (open, _) = tokio::sync::watch::channel(true);
        let (live, _) = tokio::sync::watch::channel(0usize);
        let open_tx = open.clone();
        let live_tx = live.clone();
        let target = std::sync::Arc::new(std::sync::Mutex::new(target));
        let to = std::sync::Arc::clone(&target);
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let mut open_rx = open_tx.subscribe();
                if !*open_rx.borrow_and_update() {
                    continue; // dropped: the client sees the connection close
                }
                let counted = LiveConnection::new(&live_tx);
                let target = *to.lock().expect("proxy target");
                tokio::spawn(async move {
                    let _counted = counted;
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = open_rx.wait_for(|open| !*open) => {}
                    }
                });
            }
        });
        TcpProxy {
            addr,
            target,
            open,
            live,
            task,
        }
    }

    /// The proxy's client URL.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Drops every forwarded connection and refuses new ones; returns once
    /// every one is closed, so nothing more passes after it.
    pub async fn cut(&self) {
        self.open.send_replace(false);
        let mut live = self.live.subscribe();
        tokio::time::timeout(Duration::from_secs(30), live.wait_for(|n| *n == 0))
            .await
            .expect("forwarded connections closed")
            .expect("the proxy's count");
    }

    /// Forwards again.
    pub fn restore(&self) {
        self.open.send_replace(true);
    }

    /// Drops every forwarded connection and forwards new ones to `target`
    /// (another member of a cluster): the client's next call reaches it.
    pub async fn retarget(&self, target: std::net::SocketAddr) {
        self.cut().await;
        *self.target.lock().expect("proxy target") = target;
        self.restore();
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

//! The shared integration-test harness: a real etcd per test binary (free
//! loopback ports, temp dir, killed at exit), private etcds for tests that
//! kill or compact, and client helpers. Later layers add the daemon here.
#![allow(dead_code)]

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use watchcache::config::EtcdConfig;
use watchcache::etcd_server::EtcdServer;

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

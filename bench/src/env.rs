//! The system under test: etcd (our own, or one at `--etcd URL`) and the
//! watchcache daemon (our own child process, or one at `--proxy URL`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use etcd_client::{Client, ConnectOptions, GetOptions, KvClient, Txn, TxnOp};
use futures::StreamExt;

use watchcache::etcd_server::{EtcdServer, free_port};

use crate::http::{get_once, get_once_with};
use crate::secure::{ClientTls, SecureSetup};
use crate::wire::{ObjectShape, make_object, make_schema_pod, now_nanos};

enum KeeperCmd {
    /// Kill etcd and start it again on the same data dir; reply with the
    /// time from spawn to healthy.
    Restart(mpsc::Sender<Result<Duration, String>>),
}

/// Our own etcd, owned by a thread that lives for the whole run (etcd gets
/// SIGKILL through PDEATHSIG when the thread that forked it exits).
pub struct EtcdKeeper {
    pub endpoint: String,
    pid: Arc<AtomicU32>,
    tx: Option<mpsc::Sender<KeeperCmd>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EtcdKeeper {
    /// Starts etcd on free loopback ports (blocking).
    pub fn start() -> Result<EtcdKeeper> {
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(String, u32), String>>();
        let (tx, rx) = mpsc::channel::<KeeperCmd>();
        let pid = Arc::new(AtomicU32::new(0));
        let pid2 = pid.clone();
        let thread = std::thread::Builder::new()
            .name("etcd-keeper".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let mut server = match rt.block_on(EtcdServer::start()) {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                pid2.store(server.pid().unwrap_or(0), Ordering::SeqCst);
                let _ = ready_tx.send(Ok((server.endpoint(), server.pid().unwrap_or(0))));
                // Serve commands until the sender is dropped, then drop (kill) etcd.
                while let Ok(cmd) = rx.recv() {
                    match cmd {
                        KeeperCmd::Restart(reply) => {
                            server.kill();
                            let t = Instant::now();
                            let r = rt.block_on(server.restart());
                            let took = t.elapsed();
                            pid2.store(server.pid().unwrap_or(0), Ordering::SeqCst);
                            let _ = reply.send(r.map(|_| took).map_err(|e| e.to_string()));
                        }
                    }
                }
                drop(server);
            })
            .context("spawning the etcd keeper thread")?;
        let (endpoint, _) = ready_rx
            .recv()
            .map_err(|_| anyhow!("etcd keeper thread died"))?
            .map_err(|e| anyhow!("starting etcd: {e}"))?;
        Ok(EtcdKeeper {
            endpoint,
            pid,
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid.load(Ordering::SeqCst)
    }

    /// Restarts etcd (same ports, same data) and returns the time to healthy.
    pub async fn restart(&self) -> Result<Duration> {
        let tx = self.tx.clone().ok_or_else(|| anyhow!("keeper stopped"))?;
        tokio::task::spawn_blocking(move || {
            let (rtx, rrx) = mpsc::channel();
            tx.send(KeeperCmd::Restart(rtx))
                .map_err(|_| anyhow!("etcd keeper thread died"))?;
            rrx.recv()
                .map_err(|_| anyhow!("etcd keeper thread died"))?
                .map_err(|e| anyhow!("restarting etcd: {e}"))
        })
        .await?
    }
}

impl Drop for EtcdKeeper {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A watchcache daemon started by the bench.
pub struct Daemon {
    child: Option<Child>,
    pub authority: String,
    pub pid: u32,
    /// The client side of `--secure` (None: plain HTTP).
    pub tls: Option<Arc<ClientTls>>,
    /// `host:port` of its etcd v3 gRPC front (`--grpc-listen`), if asked for.
    pub grpc_authority: Option<String>,
    bin: PathBuf,
    /// Flags after `--config` and `--listen` (the secure serving files).
    args: Vec<OsString>,
    dir: tempfile::TempDir,
}

/// The daemon config: one namespaced resource, `pods`, under `prefix`, from
/// the etcd members at `etcd`.
pub fn daemon_config(
    etcd: &[String],
    prefix: &str,
    history_capacity: usize,
    list_page_size: Option<usize>,
    server: &[String],
) -> String {
    let page = list_page_size
        .map(|n| format!("list_page_size = {n}\n"))
        .unwrap_or_default();
    let server = if server.is_empty() {
        String::new()
    } else {
        format!("\n[server]\n{}\n", server.join("\n"))
    };
    let etcd = etcd
        .iter()
        .map(|e| format!("{e:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"listen = "127.0.0.1:8080"

[etcd]
endpoints = [{etcd}]
prefix = "{prefix}"
{page}
[[resources]]
group = ""
version = "v1"
kind = "Pod"
plural = "pods"
namespaced = true
history_capacity = {history_capacity}
{server}"#
    )
}

/// `$WATCHCACHE_BIN`, or the `watchcache` binary next to this executable.
///
/// In the cargo workspace `cargo run -p watchcache-bench` and `cargo test -p
/// watchcache-bench` build only the bench, not the daemon binary. So when
/// cargo started us (it sets `$CARGO`) and the daemon next to us is missing
/// or older than a file of its source tree, we have cargo build it (same
/// profile, same target dir) first: the bench never runs a stale daemon.
/// (Not on every run: a build of one package resolves other features than the
/// workspace build that made the binary, and would recompile much of it.)
pub fn default_watchcache_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("WATCHCACHE_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("locating watchcache-bench")?;
    let dir = exe
        .parent()
        .ok_or_else(|| anyhow!("{} has no parent directory", exe.display()))?;
    let bin = dir.join("watchcache");
    if let Some(cargo) = std::env::var_os("CARGO") {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let built = std::fs::metadata(&bin).and_then(|m| m.modified()).ok();
        let sources = ["src", "config", "Cargo.toml", "Cargo.lock"].map(|p| root.join(p));
        if built.is_none_or(|b| sources.iter().any(|p| newer_than(p, b))) {
            build_daemon(Path::new(&cargo), &root, dir)?;
        }
    }
    Ok(bin)
}

/// Whether `path` (a file, or any file below a directory) changed after `t`.
fn newer_than(path: &Path, t: std::time::SystemTime) -> bool {
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    if meta.is_dir() {
        std::fs::read_dir(path)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| newer_than(&e.path(), t))
    } else {
        meta.modified().is_ok_and(|m| m > t)
    }
}

/// `cargo build -p watchcache --bin watchcache` in the workspace at `root`
/// for the profile whose output dir is `out_dir` (`debug` is `dev`).
fn build_daemon(cargo: &Path, root: &Path, out_dir: &Path) -> Result<()> {
    let profile = match out_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev",
        Some(p) => p,
    };
    eprintln!("building the watchcache daemon (cargo build -p watchcache --profile {profile})");
    let status = Command::new(cargo)
        .args([
            "build",
            "--quiet",
            "-p",
            "watchcache",
            "--bin",
            "watchcache",
        ])
        .arg("--profile")
        .arg(profile)
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .stdin(Stdio::null())
        .status()
        .context("running cargo build for the watchcache daemon")?;
    if !status.success() {
        bail!("cargo build -p watchcache --bin watchcache --profile {profile}: {status}");
    }
    Ok(())
}

impl Daemon {
    /// Spawns the daemon on a free loopback port. Call it from a thread that
    /// outlives the daemon (PDEATHSIG).
    pub fn spawn(bin: &Path, config_text: &str) -> Result<Daemon> {
        Daemon::spawn_with(bin, config_text, false, None)
    }

    /// [`Daemon::spawn`] with its etcd gRPC front on a second free loopback
    /// port (`--grpc-listen`).
    pub fn spawn_grpc(bin: &Path, config_text: &str) -> Result<Daemon> {
        let mut d = Daemon::spawn_with_front(bin, config_text, false, None, true)?;
        d.start_child()?;
        Ok(d)
    }

    /// [`Daemon::spawn`] serving TLS with token authentication and RBAC
    /// ([`SecureSetup`]); the client sends `token_override` when given.
    pub fn spawn_secure(
        bin: &Path,
        config_text: &str,
        token_override: Option<&str>,
    ) -> Result<Daemon> {
        Daemon::spawn_with(bin, config_text, true, token_override)
    }

    fn spawn_with(
        bin: &Path,
        config_text: &str,
        secure: bool,
        token_override: Option<&str>,
    ) -> Result<Daemon> {
        let mut d = Daemon::spawn_with_front(bin, config_text, secure, token_override, false)?;
        d.start_child()?;
        Ok(d)
    }

    /// The daemon's files and flags (not started yet).
    fn spawn_with_front(
        bin: &Path,
        config_text: &str,
        secure: bool,
        token_override: Option<&str>,
        grpc: bool,
    ) -> Result<Daemon> {
        if !bin.is_file() {
            bail!(
                "watchcache binary not found at {} (build it: cargo build --release --workspace, or pass --watchcache-bin)",
                bin.display()
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("watchcache-bench-")
            .tempdir()?;
        std::fs::write(dir.path().join("watchcache.toml"), config_text)?;
        let (mut args, tls) = if secure {
            let s = SecureSetup::generate(dir.path(), token_override)?;
            (s.daemon_args, Some(s.client))
        } else {
            (Vec::new(), None)
        };
        let port = free_port()?;
        let grpc_authority = if grpc {
            let a = format!("127.0.0.1:{}", free_port()?);
            args.push("--grpc-listen".into());
            args.push(a.clone().into());
            Some(a)
        } else {
            None
        };
        Ok(Daemon {
            child: None,
            authority: format!("127.0.0.1:{port}"),
            pid: 0,
            tls,
            grpc_authority,
            bin: bin.to_path_buf(),
            args,
            dir,
        })
    }

    /// Starts the daemon process (its log is appended to).
    fn start_child(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("watchcache.log"))?;
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--config")
            .arg(self.dir.path().join("watchcache.toml"))
            .arg("--listen")
            .arg(&self.authority)
            .args(&self.args)
            .env(
                "RUST_LOG",
                std::env::var("WATCHCACHE_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        watchcache::etcd_server::kill_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("spawning {}", self.bin.display()))?;
        self.pid = child.id();
        self.child = Some(child);
        Ok(())
    }

    /// SIGKILLs the daemon (a crash: no shutdown).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the daemon again with the same config on the same address.
    /// Call it from the thread that spawned it (PDEATHSIG).
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.start_child()
    }

    fn log_tail(&self) -> String {
        let text =
            std::fs::read_to_string(self.dir.path().join("watchcache.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// Polls `/readyz` until it answers 200; returns the time since `since`.
    pub async fn wait_ready(&mut self, since: Instant, timeout: Duration) -> Result<Duration> {
        let deadline = since + timeout;
        // Health endpoints answer without credentials (a wrong token would
        // be refused there too; the caller checks the token separately).
        let probe = self.tls.as_ref().map(|t| Arc::new(t.anonymous()));
        loop {
            if let Ok(Ok((200, _))) = tokio::time::timeout(
                Duration::from_secs(2),
                get_once_with(&self.authority, probe.clone(), "/readyz"),
            )
            .await
            {
                return Ok(since.elapsed());
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                bail!("watchcache exited with {status}; log:\n{}", self.log_tail());
            }
            if Instant::now() >= deadline {
                bail!(
                    "watchcache not ready after {timeout:?}; log:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Leaves the daemon's directory (its config, certificates and
    /// `watchcache.log`) in place when the daemon is dropped; returns it.
    pub fn keep_dir(&mut self) -> String {
        self.dir.disable_cleanup(true);
        let path = self.dir.path().display().to_string();
        eprintln!("the daemon's directory, kept after the run: {path}");
        path
    }
}

impl Drop for Daemon {
    /// SIGTERM (a clean shutdown, so profilers wrapping the daemon can write
    /// their data), SIGKILL after 5 s.
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe {
                libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `etcd grpc-proxy start` in front of the bench's etcd: the etcd project's
/// own watch-coalescing proxy, from the same etcd binary as the harness's
/// (found as etcd is: `$WATCHCACHE_ETCD_BIN`, `tools/etcd`, `PATH`).
pub struct GrpcProxy {
    child: Option<Child>,
    /// `host:port` it listens on.
    pub authority: String,
    pub pid: u32,
    dir: tempfile::TempDir,
}

impl GrpcProxy {
    /// Whether the etcd binary the bench uses has `grpc-proxy start`
    /// (etcd 3.x's does; a build without it answers its help with an error).
    pub fn supported() -> bool {
        let Some(bin) = watchcache::etcd_server::find_etcd_binary() else {
            return false;
        };
        Command::new(bin)
            .args(["grpc-proxy", "start", "--help"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Starts it on a free loopback port and waits until a Range through it
    /// answers. Call it from a thread that outlives it (PDEATHSIG).
    pub async fn start(etcd_endpoint: &str) -> Result<GrpcProxy> {
        let bin = watchcache::etcd_server::find_etcd_binary().ok_or_else(|| {
            anyhow!("no etcd binary for `etcd grpc-proxy start` (set WATCHCACHE_ETCD_BIN)")
        })?;
        // It runs in its own directory: the path must not be relative.
        let bin = std::fs::canonicalize(&bin).unwrap_or(bin);
        let dir = tempfile::Builder::new()
            .prefix("watchcache-bench-grpc-proxy-")
            .tempdir()?;
        let authority = format!("127.0.0.1:{}", free_port()?);
        let log = std::fs::File::create(dir.path().join("grpc-proxy.log"))?;
        let endpoint = etcd_endpoint
            .trim_start_matches("http://")
            .trim_end_matches('/');
        let mut cmd = Command::new(&bin);
        cmd.args(["grpc-proxy", "start", "--endpoints", endpoint])
            .arg("--listen-addr")
            .arg(&authority)
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        watchcache::etcd_server::kill_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("spawning {} grpc-proxy start", bin.display()))?;
        let mut p = GrpcProxy {
            pid: child.id(),
            child: Some(child),
            authority,
            dir,
        };
        p.wait_ready(Duration::from_secs(60)).await?;
        Ok(p)
    }

    fn log_tail(&self) -> String {
        let text =
            std::fs::read_to_string(self.dir.path().join("grpc-proxy.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let endpoint = format!("http://{}", self.authority);
        loop {
            let ok = tokio::time::timeout(Duration::from_secs(2), async {
                let c = etcd_connect(&endpoint).await.ok()?;
                current_revision(&mut c.kv_client()).await.ok()
            })
            .await;
            if let Ok(Some(_)) = ok {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                bail!(
                    "etcd grpc-proxy exited with {status}; log:\n{}",
                    self.log_tail()
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "etcd grpc-proxy not ready after {timeout:?}; log:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for GrpcProxy {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits until a Range through the etcd gRPC endpoint at `authority` answers
/// (the daemon's front opens with its HTTP listener, but not in one step).
pub async fn wait_grpc(authority: &str, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let endpoint = format!("http://{authority}");
    loop {
        let r = tokio::time::timeout(Duration::from_secs(2), async {
            let c = etcd_connect(&endpoint).await?;
            current_revision(&mut c.kv_client()).await
        })
        .await;
        match r {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) if Instant::now() >= deadline => {
                bail!("etcd gRPC at {authority} not answering after {timeout:?}: {e:#}")
            }
            Err(_) if Instant::now() >= deadline => {
                bail!("etcd gRPC at {authority} not answering after {timeout:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// A new etcd client (its own gRPC connection).
pub async fn etcd_connect(endpoint: &str) -> Result<Client> {
    etcd_connect_all(&[endpoint.to_string()]).await
}

/// A new etcd client balanced over the members at `endpoints`.
pub async fn etcd_connect_all(endpoints: &[String]) -> Result<Client> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_keep_alive(Duration::from_secs(30), Duration::from_secs(10));
    Client::connect(endpoints, Some(opts))
        .await
        .with_context(|| format!("connecting to etcd at {}", endpoints.join(",")))
}

/// A KV client that accepts responses of any size (full ranges of 100 MB).
pub fn big_kv(client: &Client) -> KvClient {
    client
        .kv_client()
        .max_decoding_message_size(i32::MAX as usize)
}

/// `/registry/pods/{ns}/`.
pub fn ns_prefix(etcd_prefix: &str, namespace: &str) -> String {
    format!("{}/pods/{namespace}/", etcd_prefix.trim_end_matches('/'))
}

/// etcd's current revision.
pub async fn current_revision(kv: &mut KvClient) -> Result<i64> {
    let r = kv
        .get("/", Some(GetOptions::new().with_count_only()))
        .await
        .context("reading etcd's revision")?;
    r.header()
        .map(|h| h.revision())
        .ok_or_else(|| anyhow!("etcd response without header"))
}

/// Deletes every key under `prefix`; returns the revision after.
pub async fn clear_prefix(kv: &mut KvClient, prefix: &str) -> Result<i64> {
    let r = kv
        .delete(
            prefix,
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await
        .with_context(|| format!("clearing {prefix}"))?;
    r.header()
        .map(|h| h.revision())
        .ok_or_else(|| anyhow!("etcd response without header"))
}

/// Name of bench object `i`.
pub fn object_name(i: usize) -> String {
    format!("obj-{i:06}")
}

/// Writes objects `obj-000000..obj-{n-1}` of about `size` bytes under
/// `prefix` in transactions of 100 puts; returns the last revision.
pub async fn load_objects(
    kv: &KvClient,
    prefix: &str,
    namespace: &str,
    n: usize,
    size: usize,
    shape: ObjectShape,
    progress: &indicatif::ProgressBar,
) -> Result<i64> {
    const BATCH: usize = 100;
    let batches: Vec<(usize, usize)> = (0..n)
        .step_by(BATCH)
        .map(|s| (s, (s + BATCH).min(n)))
        .collect();
    let mut last_rev = 0i64;
    let mut results = futures::stream::iter(batches.into_iter().map(|(s, e)| {
        let mut kv = kv.clone();
        async move {
            let ops = (s..e)
                .map(|i| {
                    let name = object_name(i);
                    let value = match shape {
                        ObjectShape::Bench => make_object(namespace, &name, now_nanos(), size),
                        ObjectShape::SchemaPod => make_schema_pod(namespace, &name, size),
                        ObjectShape::StoredProtobufPod => {
                            let pod =
                                serde_json::from_slice(&make_schema_pod(namespace, &name, size))?;
                            watchcache::object::protobuf::encode(&pod)?
                        }
                    };
                    Ok(TxnOp::put(format!("{prefix}{name}"), value, None))
                })
                .collect::<Result<Vec<TxnOp>>>()?;
            let r = kv
                .txn(Txn::new().and_then(ops))
                .await
                .context("loading objects")?;
            let rev = r.header().map(|h| h.revision()).unwrap_or(0);
            Ok::<_, anyhow::Error>((e - s, rev))
        }
    }))
    .buffer_unordered(4);
    while let Some(r) = results.next().await {
        let (count, rev) = r?;
        progress.inc(count as u64);
        last_rev = last_rev.max(rev);
    }
    Ok(last_rev)
}

/// A value from etcd's `/metrics` (e.g. `etcd_debugging_mvcc_watcher_total`).
pub async fn etcd_metric(endpoint: &str, name: &str) -> Option<f64> {
    let authority = endpoint
        .strip_prefix("http://")?
        .trim_end_matches('/')
        .to_string();
    let (status, body) =
        tokio::time::timeout(Duration::from_secs(5), get_once(&authority, "/metrics"))
            .await
            .ok()?
            .ok()?;
    if status != 200 {
        return None;
    }
    let text = String::from_utf8_lossy(&body);
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b' ') | Some(b'{'))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// etcd's version string, from its `/version` endpoint.
pub async fn etcd_version(endpoint: &str) -> Option<String> {
    let authority = endpoint.strip_prefix("http://")?.trim_end_matches('/');
    let (_, body) = tokio::time::timeout(Duration::from_secs(5), get_once(authority, "/version"))
        .await
        .ok()?
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
    v["etcdserver"].as_str().map(str::to_string)
}

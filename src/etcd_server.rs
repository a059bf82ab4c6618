//! A private etcd process on free loopback ports with its own data dir.
//!
//! One launcher serves dev mode (`watchcache --dev`), the integration-test
//! harness and the bench, so all three start etcd the same way. The process is
//! killed and its data dir removed when the [`EtcdServer`] is dropped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, thiserror::Error)]
pub enum EtcdServerError {
    #[error(
        "no etcd binary found: set WATCHCACHE_ETCD_BIN, run scripts/setup.sh (fetches etcd into tools/), or put etcd on PATH"
    )]
    NotFound,
    #[error("etcd: {0}")]
    Io(#[from] std::io::Error),
    #[error("etcd did not become healthy within {0:?}; log: {1}")]
    NotHealthy(Duration, String),
}

/// Finds the etcd binary: `$WATCHCACHE_ETCD_BIN`, the project's `tools/` folder
/// (relative to the working directory, then to the source tree), then `PATH`.
pub fn find_etcd_binary() -> Option<PathBuf> {
    find_tool("WATCHCACHE_ETCD_BIN", "etcd", "etcd")
}

/// Finds etcdctl the same way as [`find_etcd_binary`].
pub fn find_etcdctl_binary() -> Option<PathBuf> {
    find_tool("WATCHCACHE_ETCDCTL_BIN", "etcd", "etcdctl")
}

/// Finds kubectl: `$WATCHCACHE_KUBECTL_BIN`, `tools/kubernetes` (fetched by
/// scripts/setup.sh, so every machine tests the same client), then `PATH`.
pub fn find_kubectl_binary() -> Option<PathBuf> {
    find_tool("WATCHCACHE_KUBECTL_BIN", "kubernetes", "kubectl")
}

/// Looks for `name` in `$env`, `tools/{package}/usr/bin` (cwd, then source tree), then `PATH`.
fn find_tool(env: &str, package: &str, name: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Some(p);
        }
    }
    let rel = Path::new("tools").join(package).join("usr/bin").join(name);
    let candidates = [
        rel.clone(),
        Path::new(env!("CARGO_MANIFEST_DIR")).join(&rel),
    ];
    for c in candidates {
        if c.is_file() {
            return Some(c);
        }
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Asks the kernel for a free loopback port. The port is released before
/// use, so a race is possible but vanishingly rare on a test machine.
pub fn free_port() -> std::io::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Makes the child get SIGKILL when the thread that spawns it exits
/// (Linux PDEATHSIG), so a helper process (etcd, a daemon under test) never
/// outlives us, even if we are SIGKILLed.
pub fn kill_with_parent(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cmd;
}

/// Two distinct free loopback ports (both held until both are known, so
/// they cannot be the same port).
fn free_port_pair() -> std::io::Result<(u16, u16)> {
    let a = TcpListener::bind("127.0.0.1:0")?;
    let b = TcpListener::bind("127.0.0.1:0")?;
    Ok((a.local_addr()?.port(), b.local_addr()?.port()))
}

pub struct EtcdServer {
    binary: PathBuf,
    child: Option<Child>,
    data_dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    tls: Option<EtcdServerTls>,
    /// Plain-HTTP `/health` port (`--listen-metrics-urls`) of a TLS etcd.
    metrics_port: u16,
}

/// The serving files of a TLS etcd (etcd's `--cert-file`, `--key-file`,
/// `--trusted-ca-file`, `--client-cert-auth`), as a kubeadm etcd runs.
#[derive(Debug, Clone)]
pub struct EtcdServerTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub trusted_ca_file: PathBuf,
    /// Require a client certificate signed by `trusted_ca_file`.
    pub client_cert_auth: bool,
}

impl EtcdServer {
    /// Starts etcd on free loopback ports and waits until it is healthy.
    ///
    /// etcd gets SIGKILL when the thread that started it exits (PDEATHSIG), so
    /// start it from a thread that lives as long as etcd should.
    pub async fn start() -> Result<EtcdServer, EtcdServerError> {
        Self::start_with(None).await
    }

    /// Starts a TLS etcd (`https://` client URL) with these files; its
    /// health is polled on a plain-HTTP metrics port.
    pub async fn start_tls(tls: EtcdServerTls) -> Result<EtcdServer, EtcdServerError> {
        Self::start_with(Some(tls)).await
    }

    async fn start_with(tls: Option<EtcdServerTls>) -> Result<EtcdServer, EtcdServerError> {
        let binary = find_etcd_binary().ok_or(EtcdServerError::NotFound)?;
        // Ports are picked free and released before etcd binds them, so a
        // parallel test can take one in between: retry with fresh ports.
        let mut last_err = None;
        for _ in 0..3 {
            let data_dir = tempfile::Builder::new()
                .prefix("watchcache-etcd-")
                .tempdir()?;
            let (client_port, peer_port) = free_port_pair()?;
            let mut server = EtcdServer {
                binary: binary.clone(),
                child: None,
                data_dir,
                client_port,
                peer_port,
                metrics_port: if tls.is_some() { free_port()? } else { 0 },
                tls: tls.clone(),
            };
            server.spawn()?;
            match server.wait_healthy(Duration::from_secs(30)).await {
                Ok(()) => return Ok(server),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or(EtcdServerError::NotFound))
    }

    /// The client URL, e.g. `http://127.0.0.1:23791` (`https://` with TLS).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    pub fn data_dir(&self) -> &Path {
        self.data_dir.path()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    fn log_path(&self) -> PathBuf {
        self.data_dir.path().join("etcd.log")
    }

    fn spawn(&mut self) -> Result<(), EtcdServerError> {
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--name=watchcache-dev")
            .arg(format!(
                "--data-dir={}",
                self.data_dir.path().join("data").display()
            ))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=watchcache-dev={peer}"))
            .arg("--log-level=warn");
        if let Some(tls) = &self.tls {
            cmd.arg(format!("--cert-file={}", tls.cert_file.display()))
                .arg(format!("--key-file={}", tls.key_file.display()))
                .arg(format!(
                    "--trusted-ca-file={}",
                    tls.trusted_ca_file.display()
                ))
                .arg(format!("--client-cert-auth={}", tls.client_cert_auth))
                .arg(format!(
                    "--listen-metrics-urls=http://127.0.0.1:{}",
                    self.metrics_port
                ));
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        kill_with_parent(&mut cmd);
        let child = cmd.spawn()?;
        self.child = Some(child);
        Ok(())
    }

    /// Polls etcd's `/health` endpoint until it answers `"health":"true"`.
    pub async fn wait_healthy(&mut self, timeout: Duration) -> Result<(), EtcdServerError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.healthy().await {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(EtcdServerError::NotHealthy(
                    timeout,
                    format!("exited with {status}: {}", self.log_tail()),
                ));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(EtcdServerError::NotHealthy(timeout, self.log_tail()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn healthy(&self) -> bool {
        let fut = async {
            let port = if self.tls.is_some() {
                self.metrics_port
            } else {
                self.client_port
            };
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
            s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                .await?;
            let mut buf = Vec::new();
            s.read_to_end(&mut buf).await?;
            Ok::<_, std::io::Error>(String::from_utf8_lossy(&buf).contains("\"health\":\"true\""))
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(2), fut).await,
            Ok(Ok(true))
        )
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let start = text.len().saturating_sub(2000);
        let start = (start..text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(text.len());
        text[start..].to_string()
    }

    /// SIGKILLs etcd (the data dir stays) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERMs etcd and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on a pid we own and have not reaped yet.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
            let _ = child.wait();
        }
    }

    /// Starts etcd again on the same ports and data dir (after `kill`/`stop`).
    pub async fn restart(&mut self) -> Result<(), EtcdServerError> {
        self.kill();
        self.spawn()?;
        self.wait_healthy(Duration::from_secs(30)).await
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}

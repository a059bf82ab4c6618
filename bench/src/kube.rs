//! The kube-apiserver target (`--target kube`, `--compare-kube`): a real
//! kube-apiserver (1.37 by default, built by `scripts/peers.sh`) on the
//! bench's etcd with its watch cache on (the default), priority and
//! fairness off and no in-flight limits, HTTPS with a certificate from a CA
//! the bench makes and a static token for a `system:masters` user; the
//! watchcache it is compared with serves `config/kubernetes.toml` from the
//! same etcd. Objects are written through kube-apiserver ([`KubeWriter`]),
//! so etcd holds what kube-apiserver stores (protobuf, with its defaults
//! and managed fields) and both servers serve the same objects.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::ServerName;

use watchcache::etcd_server::free_port;

use crate::http::{HttpTarget, JSON, get_once_with};
use crate::secure::{ClientTls, pki, random_token};
use crate::wire::{extract_resource_version, make_realistic_pod};

/// The peer `scripts/peers.sh` builds when no binary is named.
pub const DEFAULT_PEER: &str = "kube-apiserver-1.37";

/// The kube-apiserver binary: `$WATCHCACHE_KUBE_APISERVER_BIN`, else what
/// `scripts/peers.sh --print kube-apiserver-1.37` names (in the source tree
/// the bench was built from).
pub fn kube_apiserver_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("WATCHCACHE_KUBE_APISERVER_BIN") {
        return Ok(PathBuf::from(p));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("bash")
        .arg(root.join("scripts/peers.sh"))
        .arg("--print")
        .arg(DEFAULT_PEER)
        .stdin(Stdio::null())
        .output()
        .context("running scripts/peers.sh --print")?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || path.is_empty() {
        bail!(
            "{DEFAULT_PEER} is not built: run `bash scripts/peers.sh {DEFAULT_PEER}` (or pass --kube-apiserver-bin)\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(PathBuf::from(path))
}

/// `config/kubernetes.toml` as compiled into the bench, pointed at the
/// bench's etcd (plain, so without its `[etcd.tls]`) under `prefix`, with
/// the `[server]` settings `server` (`KEY=VALUE`, the value in TOML).
pub fn watchcache_kubernetes_config(etcd: &str, prefix: &str, server: &[String]) -> Result<String> {
    const TEXT: &str = include_str!("../../config/kubernetes.toml");
    let mut cfg: toml::Table = TEXT.parse().context("config/kubernetes.toml")?;
    let etcd_table = cfg
        .get_mut("etcd")
        .and_then(|e| e.as_table_mut())
        .ok_or_else(|| anyhow!("config/kubernetes.toml has no [etcd]"))?;
    etcd_table.remove("tls");
    etcd_table.insert(
        "endpoints".into(),
        toml::Value::Array(vec![toml::Value::String(etcd.to_string())]),
    );
    etcd_table.insert("prefix".into(), toml::Value::String(prefix.to_string()));
    if !server.is_empty() {
        let mut settings = toml::Table::new();
        for kv in server {
            let one: toml::Table = kv
                .parse()
                .with_context(|| format!("--daemon-server {kv:?}: want KEY=VALUE in TOML"))?;
            settings.extend(one);
        }
        cfg.insert("server".into(), toml::Value::Table(settings));
    }
    Ok(toml::to_string(&cfg)?)
}

/// A kube-apiserver started by the bench; SIGKILLed on drop.
pub struct KubeApiserver {
    child: Option<Child>,
    pub authority: String,
    pub pid: u32,
    /// Trusts its serving certificate; sends the admin token.
    pub tls: Arc<ClientTls>,
    dir: tempfile::TempDir,
}

impl KubeApiserver {
    /// Starts `bin` on `etcd` (`http://`) under `prefix` and waits for
    /// `/readyz`. `profiling` leaves `/debug/pprof` on. Call it from a
    /// thread that outlives it (PDEATHSIG).
    pub async fn start(bin: &Path, etcd: &str, prefix: &str, profiling: bool) -> Result<Self> {
        if !bin.is_file() {
            bail!("kube-apiserver binary not found at {}", bin.display());
        }
        let dir = tempfile::Builder::new()
            .prefix("watchcache-bench-kube-")
            .tempdir()?;
        let d = dir.path();
        let (ca_pem, ca_der, cert_pem, key_pem) = pki().context("generating certificates")?;
        // The service-account signing key and its public half.
        let sa = rcgen::KeyPair::generate()?;
        let token = random_token();
        let files = [
            ("ca.crt", ca_pem),
            ("tls.crt", cert_pem),
            ("tls.key", key_pem),
            ("sa.key", sa.serialize_pem()),
            ("sa.pub", sa.public_key_pem()),
            (
                "tokens.csv",
                format!("{token},kube-bench-admin,kube-bench-admin,\"system:masters\"\n"),
            ),
        ];
        for (name, text) in &files {
            std::fs::write(d.join(name), text)
                .with_context(|| format!("writing {}", d.join(name).display()))?;
        }
        let port = free_port()?;
        let f = |name: &str| d.join(name).display().to_string();
        let log = std::fs::File::create(d.join("kube-apiserver.log"))?;
        let mut cmd = Command::new(bin);
        cmd.args([
            format!("--etcd-servers={etcd}"),
            format!("--etcd-prefix={prefix}"),
            format!("--secure-port={port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            // 1.37 refuses a loopback address for the `kubernetes`
            // Service's endpoints; the bench needs none.
            "--endpoint-reconciler-type=none".into(),
            format!("--cert-dir={}", f("certs")),
            format!("--tls-cert-file={}", f("tls.crt")),
            format!("--tls-private-key-file={}", f("tls.key")),
            format!("--client-ca-file={}", f("ca.crt")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", f("sa.pub")),
            format!("--service-account-signing-key-file={}", f("sa.key")),
            format!("--token-auth-file={}", f("tokens.csv")),
            "--authorization-mode=RBAC".into(),
            // Pods without a service account (the bench has no controllers).
            "--disable-admission-plugins=ServiceAccount".into(),
            "--enable-priority-and-fairness=false".into(),
            "--max-requests-inflight=0".into(),
            "--max-mutating-requests-inflight=0".into(),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            format!("--profiling={profiling}"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log));
        watchcache::etcd_server::kill_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        let mut k = KubeApiserver {
            pid: child.id(),
            child: Some(child),
            authority: format!("127.0.0.1:{port}"),
            tls: ClientTls::trusting(ca_der, &token)?,
            dir,
        };
        k.wait_ready(Duration::from_secs(180)).await?;
        Ok(k)
    }

    fn log_tail(&self) -> String {
        let text =
            std::fs::read_to_string(self.dir.path().join("kube-apiserver.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Ok((200, _))) = tokio::time::timeout(
                Duration::from_secs(2),
                get_once_with(&self.authority, Some(self.tls.clone()), "/readyz"),
            )
            .await
            {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                bail!(
                    "kube-apiserver exited with {status}; log:\n{}",
                    self.log_tail()
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "kube-apiserver not ready after {timeout:?}; log:\n{}",
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Its API as an HTTP target of the bench (h2 over TLS, the admin token).
    pub fn target(&self, http1: bool) -> HttpTarget {
        HttpTarget {
            authority: self.authority.clone(),
            http1,
            tls: Some(self.tls.clone()),
            accept: JSON,
        }
    }
}

impl Drop for KubeApiserver {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Writes through kube-apiserver: creates and merge patches of Pods over
/// a few HTTP/2 connections (TLS, the admin token), JSON in and out.
#[derive(Clone)]
pub struct KubeWriter {
    conns: Vec<http2::SendRequest<Full<Bytes>>>,
    authority: String,
    authorization: hyper::header::HeaderValue,
    namespace: String,
}

impl KubeWriter {
    /// `n` connections to `kube`, writing into `namespace`.
    pub async fn connect(kube: &KubeApiserver, namespace: &str, n: usize) -> Result<KubeWriter> {
        let authorization = kube
            .tls
            .authorization
            .clone()
            .ok_or_else(|| anyhow!("kube-apiserver client without a token"))?;
        let mut conns = Vec::new();
        for _ in 0..n.max(1) {
            let tcp = tokio::net::TcpStream::connect(&kube.authority)
                .await
                .with_context(|| format!("connecting to {}", kube.authority))?;
            let _ = tcp.set_nodelay(true);
            let name = ServerName::try_from("127.0.0.1".to_string())
                .map_err(|_| anyhow!("127.0.0.1 is not a TLS server name"))?;
            let tls = kube
                .tls
                .h2
                .connect(name, tcp)
                .await
                .context("TLS handshake")?;
            let (send, conn) = http2::Builder::new(TokioExecutor::new())
                .handshake(TokioIo::new(tls))
                .await
                .context("HTTP/2 handshake")?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            conns.push(send);
        }
        Ok(KubeWriter {
            conns,
            authority: kube.authority.clone(),
            authorization,
            namespace: namespace.to_string(),
        })
    }

    /// Sends one request on connection `i % n`: (status, body).
    async fn send(
        &self,
        i: usize,
        method: hyper::Method,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Result<(u16, Bytes)> {
        let mut s = self.conns[i % self.conns.len()].clone();
        let req = hyper::Request::builder()
            .method(method)
            .uri(format!("https://{}{path}", self.authority))
            .header(hyper::header::AUTHORIZATION, self.authorization.clone())
            .header(hyper::header::CONTENT_TYPE, content_type)
            .header(hyper::header::ACCEPT, JSON)
            .body(Full::new(Bytes::from(body)))?;
        s.ready()
            .await
            .context("HTTP/2 connection to kube-apiserver closed")?;
        let resp = s.send_request(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }

    /// Creates the namespace (an existing one is fine).
    pub async fn ensure_namespace(&self) -> Result<()> {
        let body = serde_json::to_vec(&serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace},
        }))?;
        let (status, resp) = self
            .send(0, hyper::Method::POST, "/api/v1/namespaces", JSON, body)
            .await?;
        if status != 201 && status != 409 {
            bail!(
                "creating namespace {}: {status}: {}",
                self.namespace,
                String::from_utf8_lossy(&resp[..resp.len().min(300)])
            );
        }
        Ok(())
    }

    fn pods_path(&self) -> String {
        format!("/api/v1/namespaces/{}/pods", self.namespace)
    }

    /// Creates Pod `name` ([`make_realistic_pod`] of about `size` bytes);
    /// returns its resourceVersion (the etcd revision of the write).
    pub async fn create(&self, i: usize, name: &str, write_ts: i64, size: usize) -> Result<i64> {
        let body = make_realistic_pod(&self.namespace, name, write_ts, size);
        let (status, resp) = self
            .send(i, hyper::Method::POST, &self.pods_path(), JSON, body)
            .await?;
        rv_of(status, 201, &resp, "create", name)
    }

    /// Sets Pod `name`'s `writeTs` annotation (a merge patch: the object
    /// keeps its size); returns the write's resourceVersion.
    pub async fn touch(&self, i: usize, name: &str, write_ts: i64) -> Result<i64> {
        let body = format!(r#"{{"metadata":{{"annotations":{{"writeTs":"{write_ts}"}}}}}}"#);
        let path = format!("{}/{name}", self.pods_path());
        let (status, resp) = self
            .send(
                i,
                hyper::Method::PATCH,
                &path,
                "application/merge-patch+json",
                body.into_bytes(),
            )
            .await?;
        rv_of(status, 200, &resp, "patch", name)
    }

    /// Creates `obj-000000..obj-{n-1}` with `parallel` requests in flight;
    /// returns the highest resourceVersion.
    pub async fn create_many(
        &self,
        n: usize,
        size: usize,
        parallel: usize,
        progress: &indicatif::ProgressBar,
    ) -> Result<i64> {
        let mut last = 0i64;
        let mut results = futures::stream::iter((0..n).map(|i| async move {
            let name = crate::env::object_name(i);
            self.create(i, &name, crate::wire::now_nanos(), size).await
        }))
        .buffer_unordered(parallel.max(1));
        while let Some(r) = results.next().await {
            last = last.max(r?);
            progress.inc(1);
        }
        Ok(last)
    }
}

fn rv_of(status: u16, want: u16, body: &[u8], what: &str, name: &str) -> Result<i64> {
    if status != want {
        bail!(
            "kube-apiserver {what} pod {name}: {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(300)])
        );
    }
    extract_resource_version(body)
        .ok_or_else(|| anyhow!("kube-apiserver {what} pod {name}: no resourceVersion"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_kubernetes_config_points_at_the_bench_etcd_without_tls() {
        let text = super::watchcache_kubernetes_config(
            "http://127.0.0.1:1234",
            "/registry",
            &["coalesce_writes=false".into()],
        )
        .unwrap();
        let cfg: toml::Table = text.parse().unwrap();
        let etcd = cfg["etcd"].as_table().unwrap();
        assert!(etcd.get("tls").is_none());
        assert_eq!(
            etcd["endpoints"].as_array().unwrap()[0].as_str(),
            Some("http://127.0.0.1:1234")
        );
        assert!(cfg["resources"].as_array().unwrap().len() > 40);
        assert_eq!(cfg["server"]["coalesce_writes"].as_bool(), Some(false));
    }
}

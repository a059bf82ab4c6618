//! A real kube-apiserver for the differential tests: built from the Go
//! module `k8s.io/kubernetes` by `scripts/peers.sh` (cached outside the
//! clone), started on a private etcd with secure serving on a free loopback
//! port, a token for `system:masters`, RBAC, and an encryption config that
//! seals Secrets with aesgcm and ConfigMaps with secretbox.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use serde_json::Value;

use super::pki::TestCa;

/// The bearer token of the test's cluster admin (`system:masters`).
pub const ADMIN_TOKEN: &str = "oracle-admin-token";

/// The path of a peer binary `scripts/peers.sh` built (`NAME` as in its
/// table, e.g. `kube-apiserver-1.34`); fails the test naming the command
/// that builds it when it is missing.
pub fn peer(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg(root.join("scripts/peers.sh"))
        .arg("--print")
        .arg(name)
        .output()
        .expect("run scripts/peers.sh");
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        out.status.success() && !path.is_empty(),
        "peer {name} is not built: run `make peers` (scripts/peers.sh), which `make test` \
         runs first\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(path)
}

/// An encryption configuration as kube-apiserver reads it
/// (`--encryption-provider-config`), written to `dir`; watchcache reads the
/// same file.
pub fn write_encryption_config(dir: &Path) -> PathBuf {
    let b64 = |seed: u8| base64::engine::general_purpose::STANDARD.encode([seed; 32]);
    let text = format!(
        "apiVersion: apiserver.config.k8s.io/v1\n\
         kind: EncryptionConfiguration\n\
         resources:\n\
         - resources: [secrets]\n  \
           providers:\n  \
           - aesgcm:\n      \
               keys:\n      \
               - name: key1\n        \
                 secret: {}\n  \
           - identity: {{}}\n\
         - resources: [configmaps]\n  \
           providers:\n  \
           - secretbox:\n      \
               keys:\n      \
               - name: key1\n        \
                 secret: {}\n  \
           - identity: {{}}\n",
        b64(7),
        b64(9)
    );
    let path = dir.join("encryption-config.yaml");
    std::fs::write(&path, text).expect("write encryption config");
    path
}

/// A running kube-apiserver; killed on drop.
pub struct KubeApiserver {
    child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
    /// Trusts the serving certificate; sends the admin token.
    pub http: reqwest::Client,
}

impl KubeApiserver {
    /// Starts `binary` on `etcd` (an `http://` endpoint) under `prefix`
    /// (`--etcd-prefix`) with `encryption_config`, and waits for `/readyz`.
    pub async fn start(
        binary: &Path,
        etcd: &str,
        prefix: &str,
        encryption_config: &Path,
        extra_args: &[&str],
    ) -> KubeApiserver {
        KubeApiserver::start_with_tokens(binary, etcd, prefix, encryption_config, extra_args, "")
            .await
    }

    /// [`KubeApiserver::start`] with more lines of its token file
    /// (`token,user,uid,"groups"`).
    pub async fn start_with_tokens(
        binary: &Path,
        etcd: &str,
        prefix: &str,
        encryption_config: &Path,
        extra_args: &[&str],
        extra_tokens: &str,
    ) -> KubeApiserver {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = TestCa::new("kube-apiserver-test-ca");
        let ca_path = ca.write(dir.path(), "ca.crt");
        let serving = ca.server_cert(dir.path(), "apiserver");
        // The service-account signing key (ECDSA P-256) and its public half.
        let sa = rcgen::KeyPair::generate().expect("sa key");
        let sa_key = dir.path().join("sa.key");
        let sa_pub = dir.path().join("sa.pub");
        std::fs::write(&sa_key, sa.serialize_pem()).expect("write sa.key");
        std::fs::write(&sa_pub, sa.public_key_pem()).expect("write sa.pub");
        let tokens = dir.path().join("tokens.csv");
        std::fs::write(
            &tokens,
            format!(
                "{ADMIN_TOKEN},oracle-admin,oracle-admin-uid,\"system:masters\"\n{extra_tokens}"
            ),
        )
        .expect("write tokens");
        let port = watchcache::etcd_server::free_port().expect("free port");
        let log = std::fs::File::create(dir.path().join("kube-apiserver.log")).expect("log");
        let p = |p: &Path| p.display().to_string();
        let mut cmd = Command::new(binary);
        cmd.args([
            format!("--etcd-servers={etcd}"),
            format!("--etcd-prefix={prefix}"),
            format!("--secure-port={port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            // 1.37 refuses a loopback address for the `kubernetes`
            // Service's endpoints; the test needs none.
            "--endpoint-reconciler-type=none".into(),
            format!("--cert-dir={}", p(&dir.path().join("certs"))),
            format!("--tls-cert-file={}", p(&serving.cert)),
            format!("--tls-private-key-file={}", p(&serving.key)),
            format!("--client-ca-file={}", p(&ca_path)),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", p(&sa_pub)),
            format!("--service-account-signing-key-file={}", p(&sa_key)),
            format!("--token-auth-file={}", p(&tokens)),
            "--authorization-mode=RBAC".into(),
            format!("--encryption-provider-config={}", p(encryption_config)),
            "--disable-admission-plugins=ServiceAccount".into(),
            "--enable-priority-and-fairness=false".into(),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
        ]);
        cmd.args(extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        watchcache::etcd_server::kill_with_parent(&mut cmd);
        let child = cmd.spawn().expect("spawn kube-apiserver");
        let http = reqwest::Client::builder()
            .add_root_certificate(
                reqwest::Certificate::from_pem(ca.cert_pem.as_bytes()).expect("ca pem"),
            )
            .default_headers({
                let mut h = reqwest::header::HeaderMap::new();
                h.insert(
                    reqwest::header::AUTHORIZATION,
                    format!("Bearer {ADMIN_TOKEN}").parse().expect("header"),
                );
                h
            })
            .timeout(Duration::from_secs(60))
            .build()
            .expect("client");
        let mut k = KubeApiserver {
            child,
            port,
            dir,
            http,
        };
        k.wait_ready().await;
        k
    }

    async fn wait_ready(&mut self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "kube-apiserver exited at start-up ({status}); log:\n{}",
                    self.log_tail()
                );
            }
            if let Ok(r) = self.http.get(self.url("/readyz")).send().await
                && r.status() == 200
            {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "kube-apiserver not ready after 180 s; log:\n{}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The last 60 lines of its log.
    pub fn log_tail(&self) -> String {
        let text =
            std::fs::read_to_string(self.dir.path().join("kube-apiserver.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    /// A kubeconfig for kubectl: this server, its CA, the admin token.
    pub fn kubeconfig(&self) -> PathBuf {
        let path = self.dir.path().join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: oracle\n  cluster:\n    server: {}\n    \
             certificate-authority: {}\nusers:\n- name: admin\n  user:\n    token: {ADMIN_TOKEN}\n\
             contexts:\n- name: oracle\n  context:\n    cluster: oracle\n    user: admin\n\
             current-context: oracle\n",
            self.url(""),
            self.dir.path().join("ca.crt").display()
        );
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    /// Sends a request with a JSON body (or none) and content type; returns
    /// (status, body as JSON, or `Value::Null` for an empty body).
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        content_type: &str,
        body: Option<String>,
    ) -> (u16, Value) {
        let mut req = self.http.request(method, self.url(path));
        if let Some(b) = body {
            req = req.header("content-type", content_type).body(b);
        }
        let resp = req.send().await.expect("kube-apiserver request");
        let code = resp.status().as_u16();
        let bytes = resp.bytes().await.expect("kube-apiserver body");
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        (code, value)
    }

    /// POSTs `object` (JSON) to `path`, expecting 201.
    pub async fn create(&self, path: &str, object: &Value) -> Value {
        let (code, body) = self
            .send(
                reqwest::Method::POST,
                path,
                "application/json",
                Some(object.to_string()),
            )
            .await;
        assert_eq!(code, 201, "create {path}: {body}");
        body
    }
}

impl Drop for KubeApiserver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! Real kubectl with a private kubeconfig (no ambient config): plain HTTP,
//! or HTTPS with a CA and a client certificate, a bearer token or nothing.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use super::tls::CertFiles;

/// The kubectl binary: PATH, the usual places, or the tools folder.
pub fn kubectl_binary() -> PathBuf {
    let candidates = [
        watchcache::etcd_server::find_kubectl_binary(),
        Some(PathBuf::from("/usr/bin/kubectl")),
        Some(PathBuf::from("/usr/local/bin/kubectl")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "kubectl not found (looked on PATH, /usr/bin, /usr/local/bin and the tools folder): \
                 install kubectl v1.32 to run these tests"
            )
        })
}

/// How kubectl authenticates.
pub enum KubeUser<'a> {
    Anonymous,
    Cert(&'a CertFiles),
    Token(&'a str),
}

pub struct Kubectl {
    bin: PathBuf,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

/// What one kubectl run printed.
pub struct Output {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Kubectl {
    /// kubectl for `server` (`https://...` needs `ca`), as `user`.
    pub fn new(server: &str, ca: Option<&Path>, user: KubeUser<'_>) -> Kubectl {
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = dir.path().join("kubeconfig");
        let ca_line = ca
            .map(|p| format!("    certificate-authority: {}\n", p.display()))
            .unwrap_or_default();
        let user_block = match user {
            // Over HTTPS, kubectl prompts for a user name when the user has
            // no credentials; Basic credentials are not a Kubernetes
            // authenticator, so the server sees an anonymous request.
            KubeUser::Anonymous if server.starts_with("https://") => {
                "  user:\n    username: nobody\n    password: none\n".to_string()
            }
            KubeUser::Anonymous => "  user: {}\n".to_string(),
            KubeUser::Cert(f) => format!(
                "  user:\n    client-certificate: {}\n    client-key: {}\n",
                f.cert.display(),
                f.key.display()
            ),
            KubeUser::Token(t) => format!("  user:\n    token: {t}\n"),
        };
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: wc\n  cluster:\n    server: {server}\n{ca_line}\
             contexts:\n- name: wc\n  context:\n    cluster: wc\n    user: wc\n    namespace: default\n\
             current-context: wc\nusers:\n- name: wc\n{user_block}"
        );
        std::fs::write(&kubeconfig, text).expect("write kubeconfig");
        Kubectl {
            bin: kubectl_binary(),
            dir,
            kubeconfig,
        }
    }

    /// The kubectl command with this kubeconfig and `args`, stdout and
    /// stderr piped, killed when dropped.
    pub fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.env_clear()
            .env("HOME", self.dir.path())
            .env("KUBECONFIG", &self.kubeconfig)
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .arg("--request-timeout=20s")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    /// Runs kubectl and returns what it printed, whatever its exit status.
    pub async fn output(&self, args: &[&str]) -> Output {
        let out = tokio::time::timeout(Duration::from_secs(60), self.command(args).output())
            .await
            .expect("kubectl finished in time")
            .expect("run kubectl");
        Output {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs kubectl; panics with its output unless it succeeds. Returns stdout.
    pub async fn run(&self, args: &[&str]) -> String {
        let o = self.output(args).await;
        assert!(
            o.success,
            "kubectl {args:?} failed:\nstdout: {}\nstderr: {}",
            o.stdout, o.stderr
        );
        o.stdout
    }

    /// Runs kubectl; panics unless it fails. Returns stderr.
    pub async fn fail(&self, args: &[&str]) -> String {
        let o = self.output(args).await;
        assert!(
            !o.success,
            "kubectl {args:?} should fail:\nstdout: {}\nstderr: {}",
            o.stdout, o.stderr
        );
        o.stderr
    }

    pub fn write_file(&self, name: &str, content: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, content).expect("write manifest");
        p.display().to_string()
    }
}

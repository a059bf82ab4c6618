//! The `watchcache` binary: CLI flags, config errors at start-up, dev mode.
mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

fn watchcache() -> Command {
    Command::new(env!("CARGO_BIN_EXE_watchcache"))
}

/// Runs the daemon with `config_text` and returns (exit code, stderr).
/// SIGTERM to a dev-mode daemon the test started; its exit status and
/// what it logged.
fn sigterm_and_wait(child: &mut std::process::Child) -> (std::process::ExitStatus, String) {
    // SAFETY: SIGTERM to our own child.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
    }
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut stderr).unwrap();
    }
    (status, stderr)
}

fn run_with_config(config_text: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, config_text).unwrap();
    let out = watchcache().arg("--config").arg(&path).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn help_and_version() {
    let out = watchcache().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--config",
        "--listen",
        "--etcd-endpoints",
        "--dev",
        "--help",
        "--version",
    ] {
        assert!(help.contains(flag), "--help mentions {flag}: {help}");
    }
    let out = watchcache().arg("--version").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(env!("CARGO_PKG_VERSION")));
}

#[test]
fn invalid_config_stops_startup_naming_file_and_field() {
    let cases = [
        (
            "colour = 1\n[[resources]]\nversion=\"v1\"\nkind=\"Pod\"\nplural=\"pods\"\n",
            "colour",
        ),
        (
            "listen = \"nowhere\"\n[[resources]]\nversion=\"v1\"\nkind=\"Pod\"\nplural=\"pods\"\n",
            "listen",
        ),
        ("listen = \"127.0.0.1:1\"\n", "resources"),
        (
            "[[resources]]\nversion=\"v1\"\nkind=\"Pod\"\nplural=\"pods\"\nhistory_capacity=0\n",
            "resources[0].history_capacity",
        ),
    ];
    for (text, field) in cases {
        let (code, stderr) = run_with_config(text);
        assert_eq!(code, Some(2), "exit code for {field}: {stderr}");
        assert!(stderr.contains("bad.toml"), "names the file: {stderr}");
        assert!(stderr.contains(field), "names {field}: {stderr}");
    }
}

/// The security files are read before etcd is dialled: a missing RBAC
/// policy stops start-up naming it, even with an etcd that cannot be
/// reached (its error would otherwise come first and hide this one).
#[test]
fn a_bad_security_file_is_named_before_etcd_is_dialled() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("etcd-ca.pem");
    std::fs::write(&ca, "not a certificate").unwrap();
    let text = format!(
        r#"listen = "127.0.0.1:0"
[etcd]
endpoints = ["https://127.0.0.1:1"]
[etcd.tls]
ca_file = "{}"
[server.authorization]
mode = "RBAC"
policy_files = ["/nonexistent/policy.yaml"]
[[resources]]
version = "v1"
kind = "Pod"
plural = "pods"
namespaced = true
"#,
        ca.display()
    );
    let (code, stderr) = run_with_config(&text);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("/nonexistent/policy.yaml"), "{stderr}");
}

#[test]
fn missing_config_file_and_bad_override() {
    let out = watchcache()
        .args(["--config", "/nonexistent/wc.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/wc.toml"));

    let out = watchcache().output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--config"));

    let out = watchcache()
        .args(["--dev", "--etcd-endpoints", "ftp://x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("etcd.endpoints[0]"));
}

#[tokio::test]
async fn dev_mode_serves_healthz_and_cleans_up() {
    let port = watchcache::etcd_server::free_port().unwrap();
    let mut child = watchcache()
        .args(["--dev", "--listen", &format!("127.0.0.1:{port}")])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/healthz");
    let up = common::eventually(Duration::from_secs(60), || {
        let url = url.clone();
        async move { matches!(reqwest::get(&url).await, Ok(r) if r.status().is_success()) }
    })
    .await;
    let (status, stderr) = sigterm_and_wait(&mut child);
    assert!(up, "dev mode answered /healthz; log:\n{stderr}");
    assert!(
        status.success(),
        "clean exit on SIGTERM: {status:?}\n{stderr}"
    );
    let data_dir = stderr
        .split("data_dir=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("log names the dev etcd data dir");
    assert!(
        !std::path::Path::new(data_dir).exists(),
        "dev etcd data dir {data_dir} removed on exit"
    );
}

#[test]
fn a_bad_consistency_check_interval_stops_startup_naming_the_flag() {
    // `500ms` would round down to 0, which turns the check off.
    for bad in ["often", "500ms", "1s 500ms"] {
        let out = watchcache()
            .args(["--dev", "--consistency-check-interval", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--consistency-check-interval"), "{bad}: {err}");
    }
    let help = watchcache().arg("--help").output().unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("--consistency-check-interval"));
}

/// The daemon's jemalloc runs its background purging thread (the options
/// compiled into the binary, src/main.rs): without it, pages freed by closed
/// watches stayed resident until their arena allocated again, and RSS rose
/// over cycles of opening and closing watches (docs/RELIABILITY.md). An
/// operator's `_RJEM_MALLOC_CONF` still overrides the compiled options.
#[tokio::test]
async fn jemalloc_purges_freed_pages_from_a_background_thread() {
    async fn allocator_threads(envs: &[(&str, &str)]) -> (usize, String) {
        let port = watchcache::etcd_server::free_port().unwrap();
        let mut child = watchcache()
            .args(["--dev", "--listen", &format!("127.0.0.1:{port}")])
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}/healthz");
        let up = common::eventually(Duration::from_secs(60), || {
            let url = url.clone();
            async move { matches!(reqwest::get(&url).await, Ok(r) if r.status().is_success()) }
        })
        .await;
        let tasks = std::fs::read_dir(format!("/proc/{}/task", child.id()))
            .map(|d| d.flatten().map(|t| t.path()).collect::<Vec<_>>())
            .unwrap_or_default();
        let bg = tasks
            .iter()
            .filter_map(|t| std::fs::read_to_string(t.join("comm")).ok())
            .filter(|name| name.trim() == "jemalloc_bg_thd")
            .count();
        let (status, stderr) = sigterm_and_wait(&mut child);
        assert!(up, "dev mode answered /healthz; log:\n{stderr}");
        assert!(status.success(), "clean exit: {status:?}\n{stderr}");
        (bg, stderr)
    }
    let (bg, log) = allocator_threads(&[]).await;
    assert!(bg > 0, "a jemalloc_bg_thd thread; log:\n{log}");
    let (bg, log) = allocator_threads(&[("_RJEM_MALLOC_CONF", "background_thread:false")]).await;
    assert_eq!(bg, 0, "_RJEM_MALLOC_CONF overrides; log:\n{log}");
}

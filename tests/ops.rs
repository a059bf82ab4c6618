//! Operability: /metrics passes promtool, every dashboard query returns data
//! from a real Prometheus scraping the daemon, /readyz follows etcd, SIGTERM
//! ends open watches quickly, logs, and the Dockerfile lint.
mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Daemon, PrivateEtcd, daemon_config, eventually, unique_prefix};
use serde_json::{Value, json};

fn tool(rel: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tools")
        .join(rel);
    assert!(
        p.is_file(),
        "{} missing: run scripts/setup.sh (make test does)",
        p.display()
    );
    p
}

fn pod(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"nodeName": "node-1"}
    })
}

/// Creates, lists, gets, updates and watches so that every metric family has samples.
async fn drive_traffic(d: &Daemon) {
    let http = reqwest::Client::new();
    let pods = d.url("/api/v1/namespaces/default/pods");
    for i in 0..5 {
        let r = http
            .post(&pods)
            .json(&pod(&format!("p{i}"), json!({"app": "a"})))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "create p{i}");
    }
    // A watch that the server ends by timeout, while writes flow.
    let watch = http
        .get(d.url("/api/v1/pods?watch=1&timeoutSeconds=2&allowWatchBookmarks=true"))
        .send();
    let writes = async {
        for i in 5..10 {
            http.post(&pods)
                .json(&pod(&format!("p{i}"), json!({"app": "b"})))
                .send()
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let (w, ()) = tokio::join!(watch, writes);
    let body = w.unwrap().text().await.unwrap();
    assert!(body.contains("ADDED"), "watch saw events: {body}");
    // Consistent list (RV unset), list from cache at RV 0, get, a 404.
    for q in ["", "?resourceVersion=0", "?limit=2"] {
        let r = http.get(format!("{pods}{q}")).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    let r = http.get(format!("{pods}/p1")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = http.get(format!("{pods}/missing")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let r = http
        .patch(format!("{pods}/p1"))
        .header("content-type", "application/merge-patch+json")
        .body(r#"{"metadata":{"labels":{"patched":"yes"}}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn metrics_pass_promtool() {
    let d = Daemon::start_default(common::etcd(), &unique_prefix("promtool")).await;
    d.wait_ready().await;
    drive_traffic(&d).await;
    let text = reqwest::get(d.url("/metrics")).await.unwrap();
    assert_eq!(text.status(), 200);
    let text = text.text().await.unwrap();
    for name in [
        "watchcache_events_received_total",
        "watchcache_events_dispatched_total",
        "watchcache_watchers",
        "watchcache_terminated_watchers_total",
        "watchcache_resource_version",
        "watchcache_history_capacity",
        "watchcache_objects",
        "watchcache_initializations_total",
        "watchcache_initialization_duration_seconds",
        "watchcache_read_wait_seconds",
        "watchcache_consistent_read_total",
        "watchcache_list_total",
        "watchcache_watch_event_delay_seconds",
        "watchcache_etcd_request_duration_seconds",
        "watchcache_http_requests_total",
        "watchcache_http_request_duration_seconds",
        "watchcache_relists_total",
        "watchcache_reflector_watch_restarts_total",
        "watchcache_consistency_checks_total",
        "watchcache_consistency_last_match_timestamp_seconds",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
    ] {
        assert!(
            text.contains(&format!("\n{name}")),
            "/metrics exports {name}"
        );
    }
    let mut child = Command::new(tool("prometheus/usr/bin/promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The alert rules in config/ load and fire as their promtool unit tests say.
#[test]
fn alert_rules_pass_their_promtool_tests() {
    let out = Command::new(tool("prometheus/usr/bin/promtool"))
        .args(["test", "rules", "config/alerts_test.yml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool test rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every PromQL expression in the dashboard, with Grafana's variables
/// replaced by what "All" and a short rate window mean.
fn dashboard_queries() -> Vec<(String, String)> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("dashboards/watchcache.json");
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut out = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            let q = expr
                .replace("$__rate_interval", "30s")
                .replace("$resource", ".*")
                .replace("$job", ".*");
            out.push((panel["title"].as_str().unwrap().to_string(), q));
        }
    }
    out
}

#[tokio::test]
async fn dashboard_queries_return_data_from_real_prometheus() {
    let d = Daemon::start_default(common::etcd(), &unique_prefix("dashboard")).await;
    d.wait_ready().await;

    // A real Prometheus scraping the daemon every second.
    let dir = tempfile::tempdir().unwrap();
    let port = watchcache::etcd_server::free_port().unwrap();
    let cfg = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/prometheus.yml"),
    )
    .unwrap()
    .replace("127.0.0.1:8080", &d.addr.to_string())
    .replace("scrape_interval: 15s", "scrape_interval: 1s")
    .replace("evaluation_interval: 15s", "evaluation_interval: 1s");
    std::fs::write(dir.path().join("prometheus.yml"), cfg).unwrap();
    let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    let prom = Command::new(tool("prometheus/usr/bin/prometheus"))
        .arg(format!(
            "--config.file={}",
            dir.path().join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _prom = Kill(prom);
    let api = format!("http://127.0.0.1:{port}/api/v1");

    // Wait for the first scrape, drive traffic, let a few more scrapes land.
    let up = eventually(Duration::from_secs(120), || {
        let url = format!("{api}/query?query=up");
        async move {
            match reqwest::get(&url).await {
                Ok(r) => r
                    .json::<Value>()
                    .await
                    .map(|v| v["data"]["result"][0]["value"][1] == "1")
                    .unwrap_or(false),
                Err(_) => false,
            }
        }
    })
    .await;
    let prom_log =
        || std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default();
    if !up {
        // Why not: the target's last scrape error, as Prometheus saw it.
        let targets = match reqwest::get(format!("{api}/targets")).await {
            Ok(r) => r.text().await.unwrap_or_default(),
            Err(e) => e.to_string(),
        };
        panic!(
            "prometheus did not scrape the daemon; targets: {targets}\nlog:\n{}\ndaemon log:\n{}",
            prom_log(),
            d.log()
        );
    }
    drive_traffic(&d).await;
    tokio::time::sleep(Duration::from_secs(4)).await;

    // No panel may use a metric the daemon does not export.
    let exported = reqwest::get(d.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let exported: BTreeSet<&str> = exported
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();

    let mut failures = Vec::new();
    for (title, q) in dashboard_queries() {
        for metric in q
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("watchcache_") || w.starts_with("process_"))
        {
            if !exported.contains(metric) {
                failures.push(format!("{title}: metric {metric} not exported"));
            }
        }
        // Series can take a scrape or two to have two points for rate().
        let ok = eventually(Duration::from_secs(10), || {
            let url = format!("{api}/query");
            let q = q.clone();
            async move {
                let Ok(r) = reqwest::Client::new()
                    .get(&url)
                    .query(&[("query", q.as_str())])
                    .send()
                    .await
                else {
                    return false;
                };
                let v: Value = r.json().await.unwrap_or(Value::Null);
                v["status"] == "success"
                    && v["data"]["result"]
                        .as_array()
                        .map(|a| !a.is_empty())
                        .unwrap_or(false)
            }
        })
        .await;
        if !ok {
            failures.push(format!("{title}: no data for {q}"));
        }
    }
    assert!(
        failures.is_empty(),
        "dashboard problems:\n{}",
        failures.join("\n")
    );
}

/// GETs `url` and returns the status code (0 when the request fails).
async fn status_of(url: &str) -> u16 {
    reqwest::get(url)
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

/// Waits up to 30 s for `url` to answer `want`.
async fn wait_status(url: &str, want: u16) -> bool {
    eventually(Duration::from_secs(30), || async move {
        status_of(url).await == want
    })
    .await
}

#[tokio::test]
async fn readyz_follows_the_first_list_and_etcd() {
    let mut etcd = PrivateEtcd::start().await.unwrap();
    etcd.kill();
    // Started while etcd is down: alive, not ready.
    let d = Daemon::start(&daemon_config(&etcd.endpoint(), "/registry", ""), &[]).await;
    let (livez, readyz) = (d.url("/livez"), d.url("/readyz"));
    assert_eq!(status_of(&livez).await, 200);
    assert_eq!(
        status_of(&readyz).await,
        503,
        "not ready before the first list"
    );
    let verbose = reqwest::get(d.url("/readyz?verbose"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        verbose.contains("pods"),
        "verbose readyz lists resources: {verbose}"
    );

    etcd.restart().await.unwrap();
    assert!(
        wait_status(&readyz, 200).await,
        "ready once etcd is up and the lists completed; log:\n{}",
        d.log()
    );
    etcd.kill();
    assert!(
        wait_status(&readyz, 503).await,
        "not ready while etcd is down"
    );
    assert_eq!(
        status_of(&livez).await,
        200,
        "still alive while etcd is down"
    );
    etcd.restart().await.unwrap();
    assert!(
        wait_status(&readyz, 200).await,
        "ready again after etcd is back"
    );
}

#[tokio::test]
async fn sigterm_with_open_watches_exits_within_5s() {
    let prefix = unique_prefix("sigterm");
    let mut d = Daemon::start_default(common::etcd(), &prefix).await;
    d.wait_ready().await;
    let http = reqwest::Client::new();
    let mut streams = Vec::new();
    for path in [
        "/api/v1/pods?watch=1",
        "/api/v1/nodes?watch=1",
        "/api/v1/namespaces/default/pods?watch=1",
    ] {
        let r = http.get(d.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "watch {path} open");
        streams.push(r);
    }
    let t0 = std::time::Instant::now();
    d.sigterm();
    let status = d.wait_exit(Duration::from_secs(5)).await;
    assert!(
        status.is_some(),
        "exited within 5 s of SIGTERM with open watches; log:\n{}",
        d.log()
    );
    assert!(status.unwrap().success(), "clean exit");
    assert!(t0.elapsed() < Duration::from_secs(5));
    for s in streams {
        // The streams end (the server closed them) rather than hang.
        let body = tokio::time::timeout(Duration::from_secs(5), s.text()).await;
        assert!(body.is_ok(), "watch stream ended");
    }
}

#[tokio::test]
async fn json_logs_with_one_line_per_request() {
    let cfg = daemon_config(common::etcd(), &unique_prefix("logs"), "");
    let d = Daemon::start(&cfg, &["--log-format", "json"]).await;
    d.wait_ready().await;
    let r = reqwest::get(d.url("/api/v1/namespaces/default/pods"))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    drop(d);
    // The harness logs at warn; request lines are at debug.
    let cfg = daemon_config(common::etcd(), &unique_prefix("logs-debug"), "");
    let d = Daemon::start_env(
        &cfg,
        &["--log-format", "json"],
        &[("RUST_LOG", "info,watchcache=debug")],
    )
    .await;
    let r = reqwest::get(d.url("/api/v1/namespaces/default/pods/nope"))
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let found = eventually(Duration::from_secs(5), || {
        let log = d.log();
        async move {
            log.lines().any(|l| {
                serde_json::from_str::<Value>(l)
                    .map(|v| {
                        let s = v.to_string();
                        s.contains("/pods/nope") && s.contains("404")
                    })
                    .unwrap_or(false)
            })
        }
    })
    .await;
    let log = d.log();
    assert!(
        found,
        "a JSON debug line for the request with path and code:\n{log}"
    );
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            serde_json::from_str::<Value>(line).is_ok(),
            "every log line is JSON: {line}"
        );
    }
}

#[test]
fn dockerfile_passes_hadolint() {
    let out = Command::new(tool("hadolint/hadolint"))
        .arg("--no-color")
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Dockerfile"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "hadolint: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

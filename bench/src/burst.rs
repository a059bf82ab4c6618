//! H1: a burst of writes while a watcher is away (docs/BENCHMARKS.md#history-h1).
//!
//! kube-apiserver keeps at least 75 s of events per resource, so a client
//! that reconnects within 75 s resumes where it was, whatever the burst in
//! between. The run: a daemon with the default history policy (plus
//! `--history-max-bytes` when given), the etcd revision before the burst,
//! `--events` writes in `--duration` seconds, then, `--reconnect-after`
//! seconds after the burst began, a watch from that revision: it must get
//! every event (or, past the byte budget, the 410 a client relists on).
//! The history's gauges and the daemon's RSS are read before the watch.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use http_body_util::BodyExt;
use serde_json::{Value, json};

use crate::env::{self, Daemon};
use crate::http::HttpTarget;
use crate::procfs;
use crate::report::f;
use crate::wire::{LineSplitter, make_object, now_nanos, parse_watch_line};
use watchcache::object::wire::EventType;

/// What one burst run does.
pub struct BurstParams {
    pub events: usize,
    pub duration_s: f64,
    pub reconnect_after_s: f64,
    pub size: usize,
    pub keys: usize,
    pub writers: usize,
    pub history_max_bytes: Option<u64>,
    pub namespace: String,
    pub etcd_prefix: String,
}

/// The daemon's config: pods, with the default history policy.
fn config(etcd: &str, p: &BurstParams) -> String {
    let budget = p
        .history_max_bytes
        .map(|b| format!("history_max_bytes = {b}\n"))
        .unwrap_or_default();
    format!(
        r#"listen = "127.0.0.1:8080"

[etcd]
endpoints = ["{etcd}"]
prefix = "{}"

[[resources]]
group = ""
version = "v1"
kind = "Pod"
plural = "pods"
namespaced = true
{budget}"#,
        p.etcd_prefix
    )
}

/// A gauge of `/metrics` for the pods resource.
fn gauge(metrics: &str, name: &str) -> Option<f64> {
    let series = format!("{name}{{resource=\"pods\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

/// Writes `p.events` puts over `p.keys` objects at `events / duration` per
/// second from `p.writers` clients; returns the last revision.
async fn write_burst(etcd: &str, p: &BurstParams) -> Result<i64> {
    let next = Arc::new(AtomicUsize::new(0));
    let per_writer = Duration::from_secs_f64(p.duration_s * p.writers as f64 / p.events as f64);
    let prefix = env::ns_prefix(&p.etcd_prefix, &p.namespace);
    let mut tasks = Vec::new();
    for _ in 0..p.writers {
        let client = env::etcd_connect(etcd).await?;
        let next = Arc::clone(&next);
        let (prefix, ns) = (prefix.clone(), p.namespace.clone());
        let (events, keys, size) = (p.events, p.keys, p.size);
        tasks.push(tokio::spawn(async move {
            let mut kv = client.kv_client();
            let mut tick = tokio::time::interval(per_writer);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut last = 0i64;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= events {
                    return Ok::<i64, anyhow::Error>(last);
                }
                tick.tick().await;
                let name = env::object_name(i % keys);
                let value = make_object(&ns, &name, now_nanos(), size);
                let r = kv
                    .put(format!("{prefix}{name}"), value, None)
                    .await
                    .context("burst write")?;
                last = last.max(r.header().map_or(0, |h| h.revision()));
            }
        }));
    }
    let mut last = 0;
    for t in tasks {
        last = last.max(t.await.context("writer task")??);
    }
    Ok(last)
}

/// Watches from `from` until revision `last` or an ERROR event; returns
/// (events received, the ERROR's message).
async fn watch_from(
    authority: &str,
    ns: &str,
    from: i64,
    last: i64,
) -> Result<(u64, Option<String>)> {
    let target = HttpTarget::parse(&format!("http://{authority}"), true)?;
    let mut conn = target.connect().await?;
    let resp = conn
        .get(&format!(
            "/api/v1/namespaces/{ns}/pods?watch=1&resourceVersion={from}"
        ))
        .await?;
    if resp.status() != 200 {
        bail!("watch from {from}: HTTP {}", resp.status());
    }
    let mut body = resp.into_body();
    let mut lines = LineSplitter::default();
    let (mut received, mut error, mut done) = (0u64, None, false);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !done {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(f)) => f.context("watch body")?,
            Ok(None) => break,
            Err(_) => bail!("watch from {from}: {received} events, then nothing for 120 s"),
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let mut bad = None;
        lines.feed(&data, |line| match parse_watch_line(line) {
            Ok(ev) if ev.kind == Some(EventType::Error) => {
                error = ev.message;
                done = true;
            }
            Ok(ev) => {
                received += 1;
                done |= ev.rv >= last;
            }
            Err(e) => bad = Some(e),
        });
        if let Some(e) = bad {
            bail!("{e}");
        }
    }
    Ok((received, error))
}

/// One burst run; its report.
pub async fn run(etcd: &str, bin: &std::path::Path, p: &BurstParams) -> Result<Value> {
    if p.events == 0 || p.writers == 0 || p.keys == 0 {
        bail!("--events, --writers and --keys must be positive");
    }
    let t = Instant::now();
    let mut daemon = Daemon::spawn(bin, &config(etcd, p))?;
    daemon
        .wait_ready(t, Duration::from_secs(120))
        .await
        .context("starting watchcache")?;
    let client = env::etcd_connect(etcd).await?;
    let mut kv = env::big_kv(&client);
    env::clear_prefix(&mut kv, &env::ns_prefix(&p.etcd_prefix, &p.namespace)).await?;
    let from = env::current_revision(&mut kv).await?;
    eprintln!(
        "burst: {} writes in {} s from revision {from}; a watch from it {} s after the start",
        p.events, p.duration_s, p.reconnect_after_s
    );
    let started = Instant::now();
    let last = write_burst(etcd, p).await?;
    let burst_s = started.elapsed().as_secs_f64();
    let back_at = started + Duration::from_secs_f64(p.reconnect_after_s);
    tokio::time::sleep_until(back_at.into()).await;
    let (_, metrics) = crate::http::get_once(&daemon.authority, "/metrics").await?;
    let metrics = String::from_utf8_lossy(&metrics);
    let rss = procfs::sample(daemon.pid).map_or(0, |s| s.rss_kb * 1024);
    let away_s = started.elapsed().as_secs_f64();
    let (received, error) = watch_from(&daemon.authority, &p.namespace, from, last).await?;
    let written = (last - from).max(0) as u64;
    let report = json!({
        "scenario": "burst",
        "events_written": written,
        "burst_seconds": burst_s,
        "watcher_away_seconds": away_s,
        "events_received": received,
        "expired": error.is_some(),
        "error": error,
        "history_events": gauge(&metrics, "watchcache_history_events"),
        "history_bytes": gauge(&metrics, "watchcache_history_bytes"),
        "history_capacity": gauge(&metrics, "watchcache_history_capacity"),
        "history_oldest_age_seconds": gauge(&metrics, "watchcache_history_oldest_age_seconds"),
        "history_max_bytes": p.history_max_bytes.unwrap_or(256 << 20),
        "daemon_rss_bytes": rss,
    });
    println!(
        "\nH1 burst: {written} events in {} s; watcher back after {} s: {received} of {written} events{}",
        f(burst_s),
        f(away_s),
        error
            .as_ref()
            .map(|e| format!(", then 410 ({e})"))
            .unwrap_or_default()
    );
    println!(
        "history: {} events, {} bytes (budget {}), capacity {}, oldest {} s; daemon RSS {} MB",
        report["history_events"],
        report["history_bytes"],
        report["history_max_bytes"],
        report["history_capacity"],
        report["history_oldest_age_seconds"],
        f(rss as f64 / 1e6)
    );
    daemon.kill();
    Ok(report)
}

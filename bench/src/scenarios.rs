//! The scenarios of docs/DESIGN.md section 9: fanout (F1), list (L1), get (G1),
//! startup (S1) and idle (M1). Each runs against one target and returns its
//! figures as JSON; the caller tabulates and compares.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use etcd_client::{Client, GetOptions};
use hdrhistogram::Histogram;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use parking_lot::Mutex;
use serde_json::{Value, json};
use watchcache::storage::prefix_range_end;

use crate::check::{CheckResult, check_deliveries};
use crate::env::{
    Daemon, EtcdKeeper, GrpcProxy, big_kv, clear_prefix, current_revision, daemon_config,
    etcd_connect, etcd_metric, load_objects, ns_prefix, object_name,
};
use crate::http::{Conn, HttpTarget, JSON, PROTOBUF, Pool};
use crate::kube::{KubeApiserver, KubeWriter};
use crate::procfs::{ProcSample, reset_peak, sample, self_pid};
use crate::report::{distribution, new_histogram, summarize};
use crate::secure::ClientTls;
use crate::watchers::{WatchTarget, WatcherSet};
use crate::wire::{
    ObjectShape, extract_continue, extract_resource_version, make_object, now_nanos,
};

/// What a scenario runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Proxy,
    Etcd,
    /// etcd watchers on watchcache's etcd v3 gRPC front (`--grpc-listen`).
    Grpc,
    /// etcd watchers through `etcd grpc-proxy start` (etcd's own proxy).
    GrpcProxy,
    /// kube-apiserver's REST API and its own watch cache ([`crate::kube`]).
    Kube,
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Proxy => "proxy",
            Target::Etcd => "etcd",
            Target::Grpc => "grpc",
            Target::GrpcProxy => "grpc_proxy",
            Target::Kube => "kube",
        }
    }

    /// The process in front of etcd that holds the watchers, if any.
    pub fn front(self) -> Option<&'static str> {
        match self {
            Target::Proxy | Target::Grpc => Some("watchcache"),
            Target::GrpcProxy => Some("etcd grpc-proxy"),
            Target::Kube => Some("kube-apiserver"),
            Target::Etcd => None,
        }
    }
}

/// Scenario parameters (from the command line).
#[derive(Debug, Clone)]
pub struct Params {
    pub watchers: usize,
    pub rate: f64,
    pub duration_s: f64,
    pub size: usize,
    pub keys: usize,
    pub connections: usize,
    pub streams_per_conn: usize,
    pub http1: bool,
    /// etcd watchers share one gRPC watch stream per connection.
    pub etcd_mux: bool,
    pub writers: usize,
    pub drain_timeout_s: f64,
    pub objects: usize,
    pub concurrency: usize,
    pub iterations: usize,
    pub page_size: usize,
    pub namespace: String,
    pub etcd_prefix: String,
    pub settle_s: f64,
    /// idle: times the watchers (and their connections) are opened and
    /// closed (`--cycles`).
    pub cycles: u32,
    /// `etcd.list_page_size` of the daemons the bench starts (None: its default).
    pub list_page_size: Option<usize>,
    /// `[server]` settings (`KEY=VALUE`) of the daemon the bench starts.
    pub daemon_server: Vec<String>,
    /// list: protobuf responses, schema-valid Pods (`--protobuf`).
    pub protobuf: bool,
    /// list: `Accept-Encoding: gzip` on the proxy's Lists, each unpacked
    /// (`--gzip`).
    pub gzip: bool,
    /// list: WatchList streams too (`--watch-list`).
    pub watch_list: bool,
    /// informers: how many start at once.
    pub informers: usize,
    /// list, get, startup: objects stored as kube-apiserver protobuf
    /// (`--storage-media-type application/vnd.kubernetes.protobuf`).
    pub storage_protobuf: bool,
}

/// The environment every scenario runs in.
pub struct Ctx {
    pub etcd_endpoint: String,
    pub keeper: Option<EtcdKeeper>,
    pub etcd_pid_override: Option<u32>,
    pub proxy_authority: Option<String>,
    pub proxy_pid_override: Option<u32>,
    pub daemon: Option<Daemon>,
    /// `etcd grpc-proxy start` for the `grpc_proxy` target.
    pub grpc_proxy: Option<GrpcProxy>,
    /// TLS and bearer token of the proxy under test (`--secure`), None: plain.
    pub tls: Option<Arc<ClientTls>>,
    /// kube-apiserver (`--target kube`, `--compare-kube`).
    pub kube: Option<KubeApiserver>,
    /// Writes through kube-apiserver: set whenever it runs, so etcd holds
    /// what it stores and both servers serve the same objects.
    pub kube_writer: Option<KubeWriter>,
    pub watchcache_bin: std::path::PathBuf,
    pub mp: MultiProgress,
    pub progress: bool,
    pub p: Params,
}

impl Ctx {
    pub fn etcd_pid(&self) -> Option<u32> {
        self.etcd_pid_override
            .or_else(|| self.keeper.as_ref().map(|k| k.pid()))
    }

    pub fn proxy_pid(&self) -> Option<u32> {
        self.proxy_pid_override
            .or_else(|| self.daemon.as_ref().map(|d| d.pid))
    }

    /// The pid sampled as `processes.proxy` while `target` runs: etcd
    /// grpc-proxy for its target, else the watchcache daemon.
    fn front_pid(&self, target: Target) -> Option<u32> {
        match target {
            Target::GrpcProxy => self.grpc_proxy.as_ref().map(|g| g.pid),
            Target::Kube => self.kube.as_ref().map(|k| k.pid),
            _ => self.proxy_pid(),
        }
    }

    /// The servers in front of etcd the bench runs, by name: the ones not
    /// under test in a phase are sampled as `idle_fronts`.
    fn fronts(&self) -> [(&'static str, Option<u32>); 3] {
        [
            ("watchcache", self.proxy_pid()),
            ("grpc_proxy", self.front_pid(Target::GrpcProxy)),
            ("kube_apiserver", self.front_pid(Target::Kube)),
        ]
    }

    /// The HTTP API of `target`: the proxy, or kube-apiserver.
    fn http(&self, target: Target) -> Result<HttpTarget> {
        match target {
            Target::Kube => self
                .kube
                .as_ref()
                .map(|k| k.target(self.p.http1))
                .ok_or_else(|| anyhow!("no kube-apiserver (internal error)")),
            _ => self.proxy(),
        }
    }

    /// `http://host:port` of the etcd gRPC endpoint the watchers of `target` use.
    fn grpc_endpoint(&self, target: Target) -> Result<String> {
        match target {
            Target::Etcd => Ok(self.etcd_endpoint.clone()),
            Target::Grpc => self
                .daemon
                .as_ref()
                .and_then(|d| d.grpc_authority.as_ref())
                .map(|a| format!("http://{a}"))
                .ok_or_else(|| anyhow!("no watchcache gRPC front (internal error)")),
            Target::GrpcProxy => self
                .grpc_proxy
                .as_ref()
                .map(|g| format!("http://{}", g.authority))
                .ok_or_else(|| anyhow!("no etcd grpc-proxy (internal error)")),
            Target::Proxy | Target::Kube => bail!("the {} target speaks HTTP", target.name()),
        }
    }

    fn proxy(&self) -> Result<HttpTarget> {
        let a = self
            .proxy_authority
            .as_ref()
            .ok_or_else(|| anyhow!("no proxy (internal error)"))?;
        Ok(HttpTarget::parse(&format!("http://{a}"), self.p.http1)?.with_tls(self.tls.clone()))
    }

    /// How the bench talks to the target.
    pub fn transport(&self, target: Target) -> &'static str {
        let p = &self.p;
        match target {
            Target::Proxy => match (p.http1, self.tls.is_some()) {
                (true, false) => "http/1.1",
                (false, false) => "h2c",
                (true, true) => "http/1.1 over TLS, bearer token, RBAC",
                (false, true) => "h2 over TLS, bearer token, RBAC",
            },
            Target::Etcd if p.etcd_mux => "grpc, one watch stream per connection",
            Target::Etcd => "grpc, one watch stream per watcher",
            Target::Grpc if p.etcd_mux => {
                "grpc to watchcache's etcd front, one watch stream per connection"
            }
            Target::Grpc => "grpc to watchcache's etcd front, one watch stream per watcher",
            Target::GrpcProxy if p.etcd_mux => {
                "grpc to etcd grpc-proxy, one watch stream per connection"
            }
            Target::GrpcProxy => "grpc to etcd grpc-proxy, one watch stream per watcher",
            Target::Kube if p.http1 => "http/1.1 over TLS, bearer token (system:masters)",
            Target::Kube => "h2 over TLS, bearer token (system:masters)",
        }
    }

    /// A progress bar of `len` steps (hidden with --no-progress).
    pub fn bar(&self, len: u64, msg: &str) -> ProgressBar {
        if !self.progress {
            return ProgressBar::hidden();
        }
        let pb = self.mp.add(ProgressBar::new(len));
        pb.set_style(
            ProgressStyle::with_template(
                "{prefix:>9} {msg:<28} [{bar:36.cyan/blue}] {pos}/{len} {elapsed_precise}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        pb.set_message(msg.to_string());
        pb
    }

    fn prefix(&self) -> String {
        ns_prefix(&self.p.etcd_prefix, &self.p.namespace)
    }

    /// `/api/v1/namespaces/{ns}/pods`.
    fn list_path(&self) -> String {
        format!("/api/v1/namespaces/{}/pods", self.p.namespace)
    }
}

/// CPU and memory of the processes involved, sampled at phase start and end.
struct Usage {
    etcd: Option<(u32, ProcSample)>,
    proxy: Option<(u32, ProcSample)>,
    bench: Option<ProcSample>,
    /// In the etcd column: the fronts that hold no watcher in it (the
    /// daemon, grpc-proxy). The daemon's growth there is what caching the
    /// same writes costs it, which is not a per-watcher cost.
    idle_fronts: Vec<(&'static str, u32, ProcSample)>,
}

impl Usage {
    /// Resets peak RSS and samples etcd, the process in front of it (the
    /// daemon, or etcd grpc-proxy for that target) and the bench itself.
    fn start(ctx: &Ctx, target: Target) -> Usage {
        let etcd = ctx.etcd_pid().and_then(|pid| {
            reset_peak(pid);
            sample(pid).map(|s| (pid, s))
        });
        let proxy = ctx.front_pid(target).and_then(|pid| {
            reset_peak(pid);
            sample(pid).map(|s| (pid, s))
        });
        let mut idle_fronts = Vec::new();
        let own = match target {
            Target::Etcd => None,
            _ => ctx.front_pid(target),
        };
        for (name, pid) in ctx.fronts() {
            if let Some(pid) = pid.filter(|p| Some(*p) != own) {
                reset_peak(pid);
                if let Some(s) = sample(pid) {
                    idle_fronts.push((name, pid, s));
                }
            }
        }
        Usage {
            etcd,
            proxy,
            bench: sample(self_pid()),
            idle_fronts,
        }
    }

    /// CPU seconds used since `start`, peak and current RSS, per process.
    fn finish(&self) -> Value {
        let one = |start: &Option<(u32, ProcSample)>| -> Value {
            match start {
                Some((pid, s0)) => match sample(*pid) {
                    Some(s1) => json!({
                        "pid": pid,
                        "cpu_s": round3(s1.cpu_s - s0.cpu_s),
                        "peak_rss_kb": s1.hwm_kb,
                        "rss_kb": s1.rss_kb,
                        "rss_at_start_kb": s0.rss_kb,
                    }),
                    None => Value::Null,
                },
                None => Value::Null,
            }
        };
        let bench = match (&self.bench, sample(self_pid())) {
            (Some(s0), Some(s1)) => json!({
                "cpu_s": round3(s1.cpu_s - s0.cpu_s),
                "rss_kb": s1.rss_kb,
            }),
            _ => Value::Null,
        };
        let mut idle = serde_json::Map::new();
        for (name, pid, s0) in &self.idle_fronts {
            if let Some(s1) = sample(*pid) {
                idle.insert(
                    (*name).to_string(),
                    json!({
                        "pid": pid,
                        "peak_growth_kb": (s1.hwm_kb as f64 - s0.rss_kb as f64).max(0.0),
                        "cpu_s": round3(s1.cpu_s - s0.cpu_s),
                    }),
                );
            }
        }
        json!({
            "etcd": one(&self.etcd),
            "proxy": one(&self.proxy),
            "bench": bench,
            "idle_fronts": Value::Object(idle),
        })
    }
}

/// The costs per unit of work (issue 14's columns): CPU microseconds per
/// delivered event of the process that holds the watchers (the proxy, or
/// etcd when the watchers are on etcd) and of etcd; the RSS growth of the
/// holder per established watcher during the load (peak minus start: send
/// buffers); and RSS per busy watcher, the holder's peak during the load
/// minus its RSS before any watcher was established (the watch itself, its
/// share of a connection, and its send buffers).
fn per_delivery_costs(
    usage: &Value,
    target: Target,
    deliveries: u64,
    watchers: usize,
    rss_before_watchers_kb: Option<f64>,
) -> Value {
    let get = |who: &str, k: &str| usage[who][k].as_f64();
    let holder = match target {
        Target::Proxy | Target::Grpc | Target::GrpcProxy | Target::Kube => "proxy",
        Target::Etcd => "etcd",
    };
    let us = |cpu: Option<f64>| -> Value {
        match cpu {
            Some(c) if deliveries > 0 => json!(round3(c * 1e6 / deliveries as f64)),
            _ => Value::Null,
        }
    };
    let per_watcher = |base: Option<f64>| match (get(holder, "peak_rss_kb"), base) {
        (Some(peak), Some(base)) if watchers > 0 => {
            json!(((peak - base).max(0.0) * 1024.0 / watchers as f64).round())
        }
        _ => Value::Null,
    };
    json!({
        "holder": holder,
        "holder_cpu_us_per_delivery": us(get(holder, "cpu_s")),
        "etcd_cpu_us_per_delivery": us(get("etcd", "cpu_s")),
        "holder_rss_per_watcher_bytes": per_watcher(get(holder, "rss_at_start_kb")),
        "holder_rss_before_watchers_kb": rss_before_watchers_kb,
        "holder_rss_per_busy_watcher_bytes": per_watcher(rss_before_watchers_kb),
    })
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// Percent-encodes a query value.
fn qenc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Waits until the proxy answers a consistent list of the namespace at a
/// resourceVersion >= `rev` (it is ready and has caught up with etcd).
async fn proxy_caught_up(conn: &mut Conn, path: &str, rev: i64, timeout: Duration) -> Result<i64> {
    let deadline = Instant::now() + timeout;
    let mut last_err;
    loop {
        match conn.get_body(&format!("{path}?limit=1")).await {
            Ok(body) => match extract_resource_version(&body) {
                Some(rv) if rv >= rev => return Ok(rv),
                Some(rv) => last_err = format!("list resourceVersion {rv} < {rev}"),
                None => last_err = "list without resourceVersion".into(),
            },
            Err(e) => last_err = format!("{e:#}"),
        }
        if Instant::now() >= deadline {
            bail!("proxy did not catch up with etcd revision {rev}: {last_err}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn etcd_clients(endpoint: &str, n: usize) -> Result<Vec<Client>> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        v.push(etcd_connect(endpoint).await?);
    }
    Ok(v)
}

/// Proxy connections for `w` watch streams: at least `--connections`, and
/// enough that none carries more than `--streams-per-conn`.
fn proxy_connections(p: &Params, w: usize) -> usize {
    p.connections
        .max(w.div_ceil(p.streams_per_conn.max(1)))
        .max(1)
}

// ---------------------------------------------------------------- F1 fanout

/// One write of the fan-out run.
#[derive(Debug, Clone, Copy)]
struct WriteRecord {
    rev: i64,
}

pub async fn fanout(ctx: &Ctx, target: Target) -> Result<(Value, Option<Histogram<u64>>)> {
    let p = &ctx.p;
    let prefix = ctx.prefix();
    let writer = etcd_connect(&ctx.etcd_endpoint).await?;
    let mut kv = writer.kv_client();
    clear_prefix(&mut kv, &prefix).await?;
    // Through kube-apiserver, the writes are patches of Pods created here,
    // before the watchers start.
    if let Some(w) = &ctx.kube_writer {
        let pb = ctx.bar(p.keys as u64, "creating pods");
        pb.set_prefix(target.name());
        w.create_many(p.keys, p.size, p.writers, &pb).await?;
        pb.finish_and_clear();
    }
    let r0 = current_revision(&mut kv).await?;

    let mut pool: Option<Pool> = None;
    let mut clients: Vec<Client> = Vec::new();
    let watch_target = match target {
        Target::Proxy | Target::Kube => {
            let t = ctx.http(target)?;
            let mut c = t.connect().await?;
            proxy_caught_up(&mut c, &ctx.list_path(), r0, Duration::from_secs(60)).await?;
            let t = if p.protobuf {
                t.with_accept(PROTOBUF)
            } else {
                t
            };
            pool = Some(t.pool(proxy_connections(p, p.watchers)).await?);
            WatchTarget::Proxy {
                pool: pool.as_ref().ok_or_else(|| anyhow!("no pool"))?,
                path: ctx.list_path(),
                protobuf: p.protobuf,
                // Beside kube-apiserver, watchers resume as client-go's do:
                // both servers cut off a watcher that falls behind.
                resume: ctx.kube.is_some(),
            }
        }
        Target::Etcd | Target::Grpc | Target::GrpcProxy => {
            if target == Target::Grpc {
                // The front serves the ring from where the cache is: let it
                // reach r0 first, as for the proxy target.
                let mut c = ctx.proxy()?.connect().await?;
                proxy_caught_up(&mut c, &ctx.list_path(), r0, Duration::from_secs(60)).await?;
            }
            clients = etcd_clients(&ctx.grpc_endpoint(target)?, p.connections).await?;
            WatchTarget::Etcd {
                clients: &clients,
                prefix: prefix.clone(),
                mux: p.etcd_mux,
            }
        }
    };

    // The holder's RSS before any watcher: the base of RSS per busy watcher.
    let holder_pid = match target {
        Target::Etcd => ctx.etcd_pid(),
        _ => ctx.front_pid(target),
    };
    let rss_before_watchers_kb = holder_pid.and_then(sample).map(|s| s.rss_kb as f64);
    let pb = ctx.bar(p.watchers as u64, "establishing watchers");
    pb.set_prefix(target.name());
    let set = WatcherSet::start(watch_target, p.watchers, r0).await?;
    let established = set.wait_established(Duration::from_secs(180), &pb).await;
    pb.finish_and_clear();
    if established == 0 && p.watchers > 0 {
        let outs = set.stop().await;
        let err = outs
            .iter()
            .find_map(|o| o.error.clone())
            .unwrap_or_default();
        bail!("{}: no watcher could be established: {err}", target.name());
    }
    let connections = set.connections;
    let etcd_watchers = etcd_metric(&ctx.etcd_endpoint, "etcd_debugging_mvcc_watcher_total").await;
    let etcd_streams =
        etcd_metric(&ctx.etcd_endpoint, "etcd_debugging_mvcc_watch_stream_total").await;

    // Write phase.
    let total = (p.rate * p.duration_s).round().max(1.0) as u64;
    let usage = Usage::start(ctx, target);
    let pb = ctx.bar(total, "writing");
    pb.set_prefix(target.name());
    let log: Arc<Mutex<Vec<WriteRecord>>> =
        Arc::new(Mutex::new(Vec::with_capacity(total as usize)));
    let write_errors = Arc::new(AtomicU64::new(0));
    let first_write_error: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let sem = Arc::new(tokio::sync::Semaphore::new(p.writers.max(1)));
    let interval = Duration::from_secs_f64(1.0 / p.rate.max(0.001));
    let t0 = tokio::time::Instant::now();
    let t0_std = Instant::now();
    for i in 0..total {
        tokio::time::sleep_until(t0 + interval.mul_f64(i as f64)).await;
        let permit = sem.clone().acquire_owned().await?;
        let mut kv = kv.clone();
        let log = log.clone();
        let errors = write_errors.clone();
        let first_err = first_write_error.clone();
        let name = object_name(i as usize % p.keys.max(1));
        let key = format!("{prefix}{name}");
        let ns = p.namespace.clone();
        let size = p.size;
        let pb = pb.clone();
        let shared = set.shared.clone();
        let kube = ctx.kube_writer.clone();
        tokio::spawn(async move {
            let written = match kube {
                Some(w) => w.touch(i as usize, &name, now_nanos()).await,
                None => {
                    let value = make_object(&ns, &name, now_nanos(), size);
                    kv.put(key, value, None)
                        .await
                        .map_err(anyhow::Error::from)
                        .and_then(|r| {
                            r.header()
                                .map(|h| h.revision())
                                .ok_or_else(|| anyhow!("etcd put without header"))
                        })
                }
            };
            match written {
                Ok(rev) => log.lock().push(WriteRecord { rev }),
                Err(e) => {
                    errors.fetch_add(1, Ordering::Relaxed);
                    first_err.lock().get_or_insert(format!("{e:#}"));
                }
            }
            drop(permit);
            pb.inc(1);
            pb.set_message(format!(
                "writing ({} deliveries)",
                shared.deliveries.load(Ordering::Relaxed)
            ));
        });
    }
    // Wait for the last writes.
    let _all = sem.acquire_many(p.writers.max(1) as u32).await?;
    let write_phase = t0_std.elapsed();
    pb.finish_and_clear();

    // Drain: wait until every live watcher has seen the last write.
    let revs: Vec<i64> = {
        let mut v: Vec<i64> = log.lock().iter().map(|w| w.rev).collect();
        v.sort_unstable();
        v
    };
    let final_rev = revs.last().copied().unwrap_or(r0);
    let pb = ctx.bar(established as u64, "draining (watchers done)");
    pb.set_prefix(target.name());
    let drain_start = Instant::now();
    let drain_deadline = drain_start + Duration::from_secs_f64(p.drain_timeout_s);
    let mut drained = false;
    loop {
        let failed = set.failed();
        let behind = set.shared.behind(final_rev, &failed);
        let live = failed.iter().filter(|f| !**f).count();
        pb.set_length(live as u64);
        pb.set_position((live - behind.min(live)) as u64);
        if behind == 0 {
            drained = true;
            break;
        }
        if Instant::now() >= drain_deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let drain = drain_start.elapsed();
    pb.finish_and_clear();
    let usage = usage.finish();
    let shared = set.shared.clone();
    let outcomes = set.stop().await;
    // Watchers flush their last latencies when they stop.
    let hist = shared.histogram();
    let deliveries = shared.deliveries.load(Ordering::Relaxed);
    drop(pool);
    drop(clients);

    // Check every watcher against the write log.
    let mut total_check = CheckResult::default();
    let mut watchers_with_loss = 0u64;
    let mut watchers_with_dup = 0u64;
    let mut errors = 0u64;
    let mut first_error: Option<String> = None;
    for o in &outcomes {
        if !o.established {
            errors += 1;
            if first_error.is_none() {
                first_error = o.error.clone();
            }
            continue;
        }
        let c = check_deliveries(&revs, &o.revs);
        if c.lost > 0 {
            watchers_with_loss += 1;
        }
        if c.duplicated > 0 {
            watchers_with_dup += 1;
        }
        total_check.add(&c);
        if let Some(e) = &o.error {
            errors += 1;
            first_error.get_or_insert(e.clone());
        }
    }
    let elapsed = (write_phase + drain).as_secs_f64();
    let lat = summarize(&hist);
    let per_delivery = per_delivery_costs(
        &usage,
        target,
        deliveries,
        established,
        rss_before_watchers_kb,
    );
    let result = json!({
        "target": target.name(),
        // The process sampled as `processes.proxy` (null: none in front).
        "front": target.front(),
        "per_delivery": per_delivery,
        "watchers": p.watchers,
        "watchers_established": established,
        "watchers_failed": errors,
        "connections": connections,
        "transport": ctx.transport(target),
        "secure": (target == Target::Proxy && ctx.tls.is_some()) || target == Target::Kube,
        "writes_through": if ctx.kube_writer.is_some() { "kube-apiserver (merge patches of Pods)" } else { "etcd (puts)" },
        "media_type": if p.protobuf { PROTOBUF } else { JSON },
        "rate_per_s": p.rate,
        "duration_s": p.duration_s,
        "object_size": p.size,
        "keys": p.keys,
        "start_revision": r0,
        "writes": revs.len(),
        "write_errors": write_errors.load(Ordering::Relaxed),
        "first_write_error": *first_write_error.lock(),
        "write_phase_s": round3(write_phase.as_secs_f64()),
        "achieved_write_rate_per_s": round3(revs.len() as f64 / write_phase.as_secs_f64().max(1e-9)),
        "drain_s": round3(drain.as_secs_f64()),
        "drained": drained,
        "deliveries": deliveries,
        // Streams the server ended that the watchers opened again from
        // their last resourceVersion (beside kube-apiserver only).
        "resumed_watches": shared.resumed.load(Ordering::Relaxed),
        "expected_deliveries": (revs.len() * established) as u64,
        "deliveries_per_s": round3(deliveries as f64 / elapsed.max(1e-9)),
        "latency_ms": lat,
        "lost": total_check.lost,
        "duplicated": total_check.duplicated,
        "unexpected": total_check.unexpected,
        "out_of_order": total_check.out_of_order,
        "watchers_with_loss": watchers_with_loss,
        "watchers_with_duplicates": watchers_with_dup,
        "first_error": first_error,
        "etcd_watchers": etcd_watchers,
        "etcd_watch_streams": etcd_streams,
        "processes": usage,
        "latency_distribution": distribution(&hist),
    });
    Ok((result, Some(hist)))
}

// ---------------------------------------------------------------- L1 list

/// Loads `--objects` objects into the namespace (after clearing it).
async fn load(ctx: &Ctx) -> Result<i64> {
    let p = &ctx.p;
    let client = etcd_connect(&ctx.etcd_endpoint).await?;
    let mut kv = client.kv_client();
    clear_prefix(&mut kv, &ctx.prefix()).await?;
    if let Some(w) = &ctx.kube_writer {
        let pb = ctx.bar(p.objects as u64, "creating pods (kube-apiserver)");
        pb.set_prefix("setup");
        let rev = w.create_many(p.objects, p.size, 32, &pb).await?;
        pb.finish_and_clear();
        return Ok(rev.max(current_revision(&mut kv).await?));
    }
    let pb = ctx.bar(p.objects as u64, "loading objects into etcd");
    pb.set_prefix("setup");
    let shape = if p.storage_protobuf {
        ObjectShape::StoredProtobufPod
    } else if p.protobuf {
        ObjectShape::SchemaPod
    } else {
        ObjectShape::Bench
    };
    let rev = load_objects(
        &kv,
        &ctx.prefix(),
        &p.namespace,
        p.objects,
        p.size,
        shape,
        &pb,
    )
    .await?;
    pb.finish_and_clear();
    Ok(rev.max(current_revision(&mut kv).await?))
}

pub async fn load_for(ctx: &Ctx) -> Result<i64> {
    load(ctx).await
}

/// The server of a list or get variant: kube-apiserver for `kube*`, else
/// the proxy (etcd's rows do not ask).
fn variant_target(variant: &str) -> Target {
    if variant.starts_with("kube") {
        Target::Kube
    } else {
        Target::Proxy
    }
}

/// `variant` is "proxy" (resourceVersion=0: served from the cache as is),
/// "proxy_consistent" (resourceVersion unset: a consistent read), "etcd",
/// or with kube-apiserver "kube" (resourceVersion=0, from its watch cache),
/// and "proxy_protobuf" / "kube_protobuf" (the same in protobuf).
pub async fn list(
    ctx: &Ctx,
    variant: &str,
    loaded_rev: i64,
) -> Result<(Value, Option<Histogram<u64>>)> {
    let p = &ctx.p;
    let mut full = new_histogram();
    let mut paged = new_histogram();
    let mut full_bytes = 0u64;
    let mut full_wire_bytes = 0u64;
    let items;
    let mut paged_items = 0usize;
    let mut pages = 0usize;
    let first_ms;
    let usage;
    if variant == "loopback" {
        return list_loopback_floor(ctx).await;
    }
    let served_by = variant_target(variant);
    let protobuf = p.protobuf || variant.ends_with("_protobuf");
    let pb = ctx.bar((2 * p.iterations) as u64, "full and paged lists");
    pb.set_prefix(variant.to_string());
    if variant == "etcd" {
        let client = etcd_connect(&ctx.etcd_endpoint).await?;
        let mut kv = big_kv(&client);
        let prefix = ctx.prefix();
        let end = prefix_range_end(&prefix);
        // Warm-up (timed apart from the rest), also counts the items.
        let t = Instant::now();
        let r = kv
            .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
            .await?;
        first_ms = round3(t.elapsed().as_secs_f64() * 1000.0);
        items = r.kvs().len();
        usage = Usage::start(ctx, Target::Proxy);
        for _ in 0..p.iterations {
            let t = Instant::now();
            let r = kv
                .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
                .await?;
            full.saturating_record(t.elapsed().as_micros() as u64);
            full_bytes = r.kvs().iter().map(|kv| kv.value().len() as u64).sum();
            full_wire_bytes = full_bytes;
            pb.inc(1);
        }
        for _ in 0..p.iterations {
            let t = Instant::now();
            let (n, np) = etcd_paged(&mut kv, &prefix, &end, p.page_size as i64).await?;
            paged.saturating_record(t.elapsed().as_micros() as u64);
            paged_items = n;
            pages = np;
            pb.inc(1);
        }
    } else {
        let target = ctx.http(served_by)?;
        let mut conn = target.connect().await?;
        let path = ctx.list_path();
        proxy_caught_up(&mut conn, &path, loaded_rev, Duration::from_secs(120)).await?;
        if protobuf {
            conn = target.with_accept(PROTOBUF).connect().await?;
        }
        if p.gzip {
            conn = conn.asking_gzip();
        }
        let rv0 = variant != "proxy_consistent";
        let full_q = if rv0 {
            format!("{path}?resourceVersion=0")
        } else {
            path.clone()
        };
        // Warm-up (timed apart from the rest: on a fresh daemon, the first
        // List is the one that encodes what is not cached yet), then parsed
        // once to count the items.
        let t = Instant::now();
        let body = conn.get_body(&full_q).await?;
        first_ms = round3(t.elapsed().as_secs_f64() * 1000.0);
        let v: Value = if protobuf {
            watchcache::object::protobuf::decode(&body).context("list body is not protobuf")?
        } else {
            serde_json::from_slice(&body).context("list body is not JSON")?
        };
        items = v["items"].as_array().map(|a| a.len()).unwrap_or(0);
        drop(v);
        drop(body);
        usage = Usage::start(ctx, served_by);
        for _ in 0..p.iterations {
            let t = Instant::now();
            (full_wire_bytes, full_bytes) = conn.get_count(&full_q).await?;
            full.saturating_record(t.elapsed().as_micros() as u64);
            pb.inc(1);
        }
        // The continue token of a protobuf page would need a decode per
        // page on the bench's side: protobuf runs time full Lists only.
        for _ in 0..(if protobuf { 0 } else { p.iterations }) {
            let t = Instant::now();
            let mut tok: Option<String> = None;
            let mut np = 0usize;
            loop {
                let q = match (&tok, rv0) {
                    (Some(c), _) => format!("{path}?limit={}&continue={}", p.page_size, qenc(c)),
                    (None, true) => format!("{path}?limit={}&resourceVersion=0", p.page_size),
                    (None, false) => format!("{path}?limit={}", p.page_size),
                };
                let body = conn.get_body(&q).await?;
                np += 1;
                tok = extract_continue(&body);
                if tok.is_none() {
                    break;
                }
                if np > 1_000_000 {
                    bail!("paged list does not end");
                }
            }
            paged.saturating_record(t.elapsed().as_micros() as u64);
            pages = np;
            paged_items = items;
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    let usage = usage.finish();
    let watch_list = if p.watch_list && variant == "proxy" {
        watch_lists(ctx).await?
    } else {
        Value::Null
    };
    let result = json!({
        "watch_list": watch_list,
        "target": variant,
        "read": match variant { "etcd" => "linearizable range", "proxy_consistent" => "resourceVersion unset (consistent, from cache)", _ => "resourceVersion=0 (from cache)" },
        "objects": p.objects,
        "object_size": p.size,
        "media_type": if protobuf && variant != "etcd" { PROTOBUF } else { JSON },
        "iterations": p.iterations,
        "items": items,
        "full_list_bytes": full_bytes,
        "full_list_wire_bytes": full_wire_bytes,
        "gzip": p.gzip && variant != "etcd",
        "first_list_ms": first_ms,
        "full_list_ms": summarize(&full),
        "page_size": p.page_size,
        "pages": pages,
        "paged_items": paged_items,
        "paged_list_ms": summarize(&paged),
        "processes": usage,
        "latency_distribution": distribution(&full),
    });
    Ok((result, Some(full)))
}

/// `--watch-list`: `--iterations` WatchList streams of the List's objects,
/// one after another, each on its own connection (asking for gzip with
/// `--gzip`), read to the initial-events-end bookmark: bytes on the wire
/// and of the stream, time to the bookmark and the proxy's CPU, per stream.
async fn watch_lists(ctx: &Ctx) -> Result<Value> {
    let p = &ctx.p;
    let target = ctx.proxy()?;
    let target = if p.protobuf {
        target.with_accept(PROTOBUF)
    } else {
        target
    };
    let path = ctx.list_path();
    let streams = p.iterations.max(1);
    let mut took = new_histogram();
    let (mut wire, mut plain, mut gzipped) = (0u64, 0u64, 0usize);
    let usage = Usage::start(ctx, Target::Proxy);
    for _ in 0..streams {
        let mut conn = target.connect().await?;
        if p.gzip {
            conn = conn.asking_gzip();
        }
        let t = Instant::now();
        let (w, b, z) = conn.watch_list_count(&path).await?;
        took.saturating_record(t.elapsed().as_micros() as u64);
        wire += w;
        plain += b;
        gzipped += usize::from(z);
    }
    let usage = usage.finish();
    let n = streams as f64;
    let cpu_ms = usage["proxy"]["cpu_s"]
        .as_f64()
        .map(|s| round3(s * 1000.0 / n));
    Ok(json!({
        "streams": streams,
        "gzipped_streams": gzipped,
        "wire_bytes_per_stream": wire / streams as u64,
        "stream_bytes_per_stream": plain / streams as u64,
        "proxy_cpu_ms_per_stream": cpu_ms,
        "to_initial_events_end_ms": summarize(&took),
        "processes": usage,
    }))
}

/// The `loopback` row of L1: the proxy's full List body (fetched once, as
/// the `proxy` row reads it) moved `--iterations` times over a bare loopback
/// TCP connection ([`crate::floor`]). Right after the proxy's rows, so it
/// sees the same minute of the machine.
async fn list_loopback_floor(ctx: &Ctx) -> Result<(Value, Option<Histogram<u64>>)> {
    let p = &ctx.p;
    let target = ctx.proxy()?;
    let target = if p.protobuf {
        target.with_accept(PROTOBUF)
    } else {
        target
    };
    let mut conn = target.connect().await?;
    let body = conn
        .get_body(&format!("{}?resourceVersion=0", ctx.list_path()))
        .await?;
    let iterations = p.iterations.max(1);
    let floor_body = body.clone();
    let full =
        tokio::task::spawn_blocking(move || crate::floor::loopback_floor(&floor_body, iterations))
            .await??;
    let result = json!({
        "target": "loopback",
        "read": "the proxy's List bytes over a bare loopback TCP connection: no HTTP, no server (a reference for the transport's floor)",
        "objects": p.objects,
        "object_size": p.size,
        "iterations": iterations,
        "full_list_bytes": body.len(),
        "full_list_ms": summarize(&full),
        "latency_distribution": distribution(&full),
    });
    Ok((result, Some(full)))
}

/// A paged range as the Kubernetes etcd3 store does it: pages of `limit`
/// keys at the revision of the first page. Returns (items, pages).
async fn etcd_paged(
    kv: &mut etcd_client::KvClient,
    prefix: &str,
    end: &[u8],
    limit: i64,
) -> Result<(usize, usize)> {
    let mut key: Vec<u8> = prefix.as_bytes().to_vec();
    let mut rev = 0i64;
    let mut items = 0usize;
    let mut pages = 0usize;
    loop {
        let mut opts = GetOptions::new().with_range(end.to_vec()).with_limit(limit);
        if rev > 0 {
            opts = opts.with_revision(rev);
        }
        let r = kv.get(key.clone(), Some(opts)).await?;
        pages += 1;
        if rev == 0 {
            rev = r.header().map(|h| h.revision()).unwrap_or(0);
        }
        items += r.kvs().len();
        match r.kvs().last() {
            Some(last) if r.more() => {
                key = last.key().to_vec();
                key.push(0);
            }
            _ => return Ok((items, pages)),
        }
    }
}

// ---------------------------------------------------------------- G1 get

pub async fn get(
    ctx: &Ctx,
    variant: &str,
    loaded_rev: i64,
) -> Result<(Value, Option<Histogram<u64>>)> {
    let p = &ctx.p;
    let k = p.concurrency.max(1);
    let n = p.objects.max(1);
    let ops = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let first_error: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let hist = Arc::new(Mutex::new(new_histogram()));
    let dur = Duration::from_secs_f64(p.duration_s);
    let mut handles = Vec::new();
    let mut pool_keep: Option<Pool> = None;
    let mut clients_keep: Vec<Client> = Vec::new();
    let connections;
    let rv0 = variant != "proxy_consistent";
    let served_by = variant_target(variant);
    let base = format!("/api/v1/namespaces/{}/pods/", p.namespace);
    // Every request target is built once, before the timed loop: it
    // measures the server, not the client formatting and parsing names.
    let mut keys: Vec<Vec<u8>> = Vec::new();
    let mut uris: Vec<hyper::Uri> = Vec::new();
    if variant == "etcd" {
        clients_keep = etcd_clients(&ctx.etcd_endpoint, p.connections).await?;
        connections = clients_keep.len();
        keys = (0..n)
            .map(|i| format!("{}{}", ctx.prefix(), object_name(i)).into_bytes())
            .collect();
    } else {
        let t = ctx.http(served_by)?;
        let mut c = t.connect().await?;
        proxy_caught_up(
            &mut c,
            &ctx.list_path(),
            loaded_rev,
            Duration::from_secs(120),
        )
        .await?;
        // Same target, same protocol: `c`'s request form is the pool's.
        uris = (0..n)
            .map(|i| {
                let q = if rv0 {
                    format!("{base}{}?resourceVersion=0", object_name(i))
                } else {
                    format!("{base}{}", object_name(i))
                };
                c.uri(&q)
            })
            .collect::<Result<_>>()?;
        let pool = t.pool(p.connections).await?;
        connections = if pool.len() == 0 { k } else { pool.len() };
        pool_keep = Some(pool);
    }
    let keys = Arc::new(keys);
    let uris = Arc::new(uris);
    let usage = Usage::start(ctx, served_by);
    let start = Instant::now();
    let deadline = start + dur;
    for w in 0..k {
        let ops = ops.clone();
        let errors = errors.clone();
        let first_error = first_error.clone();
        let hist = hist.clone();
        let keys = Arc::clone(&keys);
        let uris = Arc::clone(&uris);
        let mut seed =
            0x9E37_79B9_7F4A_7C15u64 ^ (w as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        if variant == "etcd" {
            let mut kv = clients_keep[w % clients_keep.len()].kv_client();
            handles.push(tokio::spawn(async move {
                let mut local = new_histogram();
                while Instant::now() < deadline {
                    let key = keys[next()].clone();
                    let t = Instant::now();
                    match kv.get(key, None).await {
                        Ok(r) if r.kvs().len() == 1 => {
                            local.saturating_record(t.elapsed().as_micros() as u64);
                            ops.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            first_error
                                .lock()
                                .get_or_insert("etcd get: key not found".into());
                        }
                        Err(e) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            first_error.lock().get_or_insert(e.to_string());
                        }
                    }
                }
                let _ = hist.lock().add(&local);
            }));
        } else {
            let pool = pool_keep.as_ref().ok_or_else(|| anyhow!("no pool"))?;
            let mut conn = pool.conn(w).await?;
            handles.push(tokio::spawn(async move {
                let mut local = new_histogram();
                while Instant::now() < deadline {
                    let uri = uris[next()].clone();
                    let t = Instant::now();
                    match conn.get_body_uri(uri).await {
                        Ok(_) => {
                            local.saturating_record(t.elapsed().as_micros() as u64);
                            ops.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            first_error.lock().get_or_insert(format!("{e:#}"));
                            if conn.share().is_none() {
                                // HTTP/1.1: the connection may be gone; stop this worker.
                                break;
                            }
                        }
                    }
                }
                let _ = hist.lock().add(&local);
            }));
        }
    }
    let pb = ctx.bar(dur.as_secs().max(1), "gets");
    pb.set_prefix(variant.to_string());
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        pb.set_position(start.elapsed().as_secs());
        pb.set_message(format!("gets ({} done)", ops.load(Ordering::Relaxed)));
    }
    for h in handles {
        let _ = h.await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    pb.finish_and_clear();
    let usage = usage.finish();
    drop(pool_keep);
    drop(clients_keep);
    let h = hist.lock().clone();
    let done = ops.load(Ordering::Relaxed);
    let mut result = json!({
        "target": variant,
        "read": match variant { "etcd" => "linearizable get", "proxy_consistent" => "resourceVersion unset (consistent, from cache)", _ => "resourceVersion=0 (from cache)" },
        "objects": n,
        "object_size": p.size,
        "concurrency": k,
        "connections": connections,
        "secure": served_by == Target::Kube || (variant != "etcd" && ctx.tls.is_some()),
        "transport": ctx.transport(if variant == "etcd" { Target::Etcd } else { served_by }),
        "duration_s": round3(elapsed),
        "gets": done,
        "errors": errors.load(Ordering::Relaxed),
        "first_error": *first_error.lock(),
        "gets_per_s": round3(done as f64 / elapsed.max(1e-9)),
        "latency_ms": summarize(&h),
        "processes": usage,
        "latency_distribution": distribution(&h),
    });
    set_cpu_per_get(&mut result);
    Ok((result, Some(h)))
}

/// The CPU microseconds per Get of the process serving the Gets
/// (`server_cpu_us_per_get`) and of the bench's client (`client_cpu_us_per_get`),
/// from a result's `processes` and `gets`. Both run on the machine's cores,
/// so the two together bound a target's rate.
fn set_cpu_per_get(out: &mut Value) {
    let gets = out["gets"].as_u64().unwrap_or(0);
    let server = if out["target"] == "etcd" {
        "etcd"
    } else {
        "proxy"
    };
    let per_get = |name: &str| match out["processes"][name]["cpu_s"].as_f64() {
        Some(c) if gets > 0 => json!(round3(c * 1e6 / gets as f64)),
        _ => Value::Null,
    };
    let (server, client) = (per_get(server), per_get("bench"));
    out["server_cpu_us_per_get"] = server;
    out["client_cpu_us_per_get"] = client;
}

/// One run of a scenario against one target: its figures and latencies.
pub type Part = (Value, Option<Histogram<u64>>);

/// A target's result from its parts: the only part as it is, or the sum of
/// its get rounds (`--rounds`): gets, errors, time and each process's CPU
/// added up (peak RSS the highest), the rate and the server's CPU per Get
/// computed again from the sums, latencies from the merged histograms.
pub fn merge_get_rounds(parts: Vec<Part>) -> Result<Value> {
    let rounds = parts.len();
    let mut it = parts.into_iter();
    let Some((mut out, hist)) = it.next() else {
        bail!("a target without results");
    };
    if rounds == 1 {
        return Ok(out);
    }
    let no_latencies = || anyhow!("a get round without latencies");
    let mut hist = hist.ok_or_else(no_latencies)?;
    let num = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64).unwrap_or(0.0);
    for (v, h) in it {
        // Every round's Gets are counted, so every round's latencies are.
        hist.add(&h.ok_or_else(no_latencies)?)
            .map_err(|e| anyhow!("merging latencies: {e}"))?;
        for k in ["gets", "errors"] {
            let sum = out.get(k).and_then(Value::as_u64).unwrap_or(0)
                + v.get(k).and_then(Value::as_u64).unwrap_or(0);
            out[k] = json!(sum);
        }
        out["duration_s"] = json!(round3(num(&out, "duration_s") + num(&v, "duration_s")));
        if out["first_error"].is_null() {
            out["first_error"] = v["first_error"].clone();
        }
        let (Some(po), Some(pv)) = (out["processes"].as_object_mut(), v["processes"].as_object())
        else {
            bail!("a get round without process figures");
        };
        for (name, now) in pv {
            let mut merged = now.clone();
            if let Some(before) = po.get(name) {
                if let (Some(a), Some(b)) = (before["cpu_s"].as_f64(), now["cpu_s"].as_f64()) {
                    merged["cpu_s"] = json!(round3(a + b));
                }
                if let (Some(a), Some(b)) =
                    (before["peak_rss_kb"].as_u64(), now["peak_rss_kb"].as_u64())
                {
                    merged["peak_rss_kb"] = json!(a.max(b));
                }
            }
            po.insert(name.clone(), merged);
        }
    }
    let gets = out["gets"].as_u64().unwrap_or(0);
    out["gets_per_s"] = json!(round3(gets as f64 / num(&out, "duration_s").max(1e-9)));
    set_cpu_per_get(&mut out);
    out["latency_ms"] = json!(summarize(&hist));
    out["latency_distribution"] = json!(distribution(&hist));
    out["rounds"] = json!(rounds);
    Ok(out)
}

// ---------------------------------------------------------------- S1 startup

/// Starts a fresh daemon against the bench etcd; returns (time to ready, RSS
/// after `settle`).
async fn daemon_ready(ctx: &Ctx, etcd_prefix: &str) -> Result<(f64, u64)> {
    let cfg = daemon_config(
        std::slice::from_ref(&ctx.etcd_endpoint),
        etcd_prefix,
        10_000,
        ctx.p.list_page_size,
        &ctx.p.daemon_server,
    );
    let t = Instant::now();
    let mut d = Daemon::spawn(&ctx.watchcache_bin, &cfg)?;
    let took = d.wait_ready(t, Duration::from_secs(600)).await?;
    tokio::time::sleep(Duration::from_secs_f64(ctx.p.settle_s)).await;
    let rss = sample(d.pid).map(|s| s.rss_kb).unwrap_or(0);
    Ok((took.as_secs_f64(), rss))
}

pub async fn startup(ctx: &Ctx, target: Target) -> Result<(Value, Option<Histogram<u64>>)> {
    let p = &ctx.p;
    let iters = p.iterations.max(1);
    let mut times = Vec::new();
    let pb = ctx.bar(iters as u64, "start-ups");
    pb.set_prefix(target.name());
    let result = match target {
        Target::Proxy => {
            let empty_prefix = format!("{}-empty", p.etcd_prefix.trim_end_matches('/'));
            let (empty_s, empty_rss) = daemon_ready(ctx, &empty_prefix).await?;
            let mut rss = 0;
            for _ in 0..iters {
                let (s, r) = daemon_ready(ctx, &p.etcd_prefix).await?;
                times.push(s);
                rss = r;
                pb.inc(1);
            }
            let per_object = if p.objects > 0 {
                (rss.saturating_sub(empty_rss) as f64 * 1024.0) / p.objects as f64
            } else {
                0.0
            };
            json!({
                "target": "proxy",
                "objects": p.objects,
                "object_size": p.size,
                "iterations": iters,
                "ready_s": times,
                "ready_s_median": median(&times),
                "empty_ready_s": round3(empty_s),
                "rss_kb": rss,
                "empty_rss_kb": empty_rss,
                "rss_per_object_bytes": round3(per_object),
            })
        }
        Target::Etcd => {
            let keeper = ctx.keeper.as_ref().ok_or_else(|| {
                anyhow!("startup --target etcd needs the bench's own etcd (no --etcd)")
            })?;
            for _ in 0..iters {
                let d = keeper.restart().await?;
                times.push(d.as_secs_f64());
                pb.inc(1);
            }
            tokio::time::sleep(Duration::from_secs_f64(p.settle_s)).await;
            let rss = sample(keeper.pid()).map(|s| s.rss_kb).unwrap_or(0);
            json!({
                "target": "etcd",
                "objects": p.objects,
                "object_size": p.size,
                "iterations": iters,
                "ready_s": times,
                "ready_s_median": median(&times),
                "rss_kb": rss,
                "note": "etcd restarted on its data dir; time from spawn to /health ok",
            })
        }
        Target::Grpc | Target::GrpcProxy | Target::Kube => {
            bail!("startup has no {} target", target.name())
        }
    };
    pb.finish_and_clear();
    Ok((result, None))
}

fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    round3(s[s.len() / 2])
}

// ---------------------------------------------------------------- K2 informers

/// How a client-go-like informer starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InformerStart {
    /// LIST at resourceVersion=0 (from the cache), then WATCH from the
    /// List's resourceVersion with bookmarks: client-go before WatchList.
    ListWatch,
    /// One WATCH with `sendInitialEvents=true`, read to its
    /// initial-events-end bookmark: client-go's WatchList (on by default
    /// since 1.34's client-go).
    WatchList,
}

impl InformerStart {
    pub fn name(self) -> &'static str {
        match self {
            InformerStart::ListWatch => "list_watch",
            InformerStart::WatchList => "watch_list",
        }
    }
}

/// `--informers` informers on `target` start at once, each over a share
/// of `--connections` HTTP/2 connections (JSON, as the bench's client
/// reads it): the wall time until every one has synced (its List read and
/// its watch open, or its WatchList read to the bookmark), per informer
/// times, and the server's CPU and peak RSS meanwhile. A synced informer's
/// watch is closed (the scenario measures the sync).
pub async fn informers(
    ctx: &Ctx,
    target: Target,
    start: InformerStart,
    loaded_rev: i64,
) -> Result<Part> {
    let p = &ctx.p;
    if !matches!(target, Target::Proxy | Target::Kube) {
        bail!("informers has no {} target", target.name());
    }
    let t = ctx.http(target)?;
    let mut c = t.connect().await?;
    let path = ctx.list_path();
    proxy_caught_up(&mut c, &path, loaded_rev, Duration::from_secs(300)).await?;
    drop(c);
    let n = p.informers.max(1);
    let pool = t.pool(p.connections).await?;
    let hist = Arc::new(Mutex::new(new_histogram()));
    let errors = Arc::new(AtomicU64::new(0));
    let bytes = Arc::new(AtomicU64::new(0));
    let first_error: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
    let pb = ctx.bar(n as u64, &format!("informers ({})", start.name()));
    pb.set_prefix(target.name());
    let usage = Usage::start(ctx, target);
    let t0 = Instant::now();
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let mut conn = pool.conn(i).await?;
        let (hist, errors, bytes, first_error, pb) = (
            hist.clone(),
            errors.clone(),
            bytes.clone(),
            first_error.clone(),
            pb.clone(),
        );
        let path = path.clone();
        handles.push(tokio::spawn(async move {
            let r: Result<u64> = async {
                match start {
                    InformerStart::ListWatch => {
                        let (n, head) = conn
                            .get_count_head(&format!("{path}?resourceVersion=0"), 4096)
                            .await?;
                        let rv = extract_resource_version(&head)
                            .ok_or_else(|| anyhow!("list without resourceVersion"))?;
                        let resp = conn
                            .get(&format!(
                                "{path}?watch=1&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=600"
                            ))
                            .await?;
                        if !resp.status().is_success() {
                            bail!("watch from {rv}: {}", resp.status());
                        }
                        Ok(n)
                    }
                    InformerStart::WatchList => Ok(conn.watch_list_count(&path).await?.0),
                }
            }
            .await;
            match r {
                Ok(b) => {
                    hist.lock().saturating_record(t0.elapsed().as_micros() as u64);
                    bytes.fetch_add(b, Ordering::Relaxed);
                }
                Err(e) => {
                    errors.fetch_add(1, Ordering::Relaxed);
                    first_error.lock().get_or_insert(format!("{e:#}"));
                }
            }
            pb.inc(1);
        }));
    }
    for h in handles {
        let _ = h.await;
    }
    let wall = t0.elapsed().as_secs_f64();
    pb.finish_and_clear();
    let usage = usage.finish();
    let h = hist.lock().clone();
    let result = json!({
        "target": target.name(),
        "front": target.front(),
        "start": start.name(),
        "informers": n,
        "objects": p.objects,
        "object_size": p.size,
        "connections": pool.len(),
        "synced": h.len(),
        "errors": errors.load(Ordering::Relaxed),
        "first_error": *first_error.lock(),
        "sync_wall_s": round3(wall),
        "sync_ms": summarize(&h),
        "bytes_per_informer": bytes.load(Ordering::Relaxed) / n as u64,
        "server_cpu_s": usage["proxy"]["cpu_s"],
        "server_peak_rss_kb": usage["proxy"]["peak_rss_kb"],
        "processes": usage,
    });
    Ok((result, Some(h)))
}

// ---------------------------------------------------------------- K3 memory

/// RSS now of the server of `target` (the proxy, kube-apiserver), KiB.
pub fn front_rss_kb(ctx: &Ctx, target: Target) -> Option<u64> {
    ctx.front_pid(target).and_then(sample).map(|s| s.rss_kb)
}

/// The memory of the server of `target` holding the loaded objects in its
/// cache with no watcher: it is asked for a consistent List of one item
/// until it has caught up with `loaded_rev`, then left `--settle` seconds.
/// `rss_before_load_kb`: its RSS before the objects were written.
pub async fn memory(
    ctx: &Ctx,
    target: Target,
    loaded_rev: i64,
    rss_before_load_kb: Option<u64>,
) -> Result<Part> {
    let p = &ctx.p;
    if !matches!(target, Target::Proxy | Target::Kube) {
        bail!("memory has no {} target", target.name());
    }
    let mut c = ctx.http(target)?.connect().await?;
    proxy_caught_up(
        &mut c,
        &ctx.list_path(),
        loaded_rev,
        Duration::from_secs(600),
    )
    .await?;
    drop(c);
    tokio::time::sleep(Duration::from_secs_f64(p.settle_s)).await;
    let pid = ctx
        .front_pid(target)
        .ok_or_else(|| anyhow!("memory: no pid for {} (pass --proxy-pid)", target.name()))?;
    let s = sample(pid).ok_or_else(|| anyhow!("memory: process {pid} is gone"))?;
    let growth = rss_before_load_kb.map(|b| s.rss_kb.saturating_sub(b));
    let per_object = growth
        .filter(|_| p.objects > 0)
        .map(|g| (g as f64 * 1024.0 / p.objects as f64).round());
    let result = json!({
        "target": target.name(),
        "front": target.front(),
        "objects": p.objects,
        "object_size": p.size,
        "pid": pid,
        "rss_kb": s.rss_kb,
        "peak_rss_kb": s.hwm_kb,
        "rss_before_load_kb": rss_before_load_kb,
        "rss_growth_kb": growth,
        "rss_growth_per_object_bytes": per_object,
        "settle_s": p.settle_s,
    });
    Ok((result, None))
}

// ---------------------------------------------------------------- M1 idle

pub async fn idle(ctx: &Ctx, target: Target) -> Result<(Value, Option<Histogram<u64>>)> {
    let p = &ctx.p;
    let prefix = ctx.prefix();
    let client = etcd_connect(&ctx.etcd_endpoint).await?;
    let mut kv = client.kv_client();
    let r0 = current_revision(&mut kv).await?;
    let settle = Duration::from_secs_f64(p.settle_s);
    if target == Target::GrpcProxy {
        bail!("idle has no {} target", target.name());
    }
    let holder_pid = match target {
        Target::Etcd => ctx.etcd_pid(),
        _ => ctx.front_pid(target),
    };
    let cycles = p.cycles.max(1);
    let mut result = Value::Null;
    let mut rows: Vec<Value> = Vec::new();
    // Each cycle opens its connections and watchers and closes them all: a
    // holder that frees what a closed watch held levels off over the cycles.
    for cycle in 1..=cycles {
        let mut pool: Option<Pool> = None;
        let mut clients: Vec<Client> = Vec::new();
        if cycle == 1 && target != Target::Etcd {
            // The front serves the ring from where the cache is: let it
            // reach r0 first.
            let mut c = ctx.http(target)?.connect().await?;
            proxy_caught_up(&mut c, &ctx.list_path(), r0, Duration::from_secs(60)).await?;
        }
        if matches!(target, Target::Proxy | Target::Kube) {
            pool = Some(
                ctx.http(target)?
                    .pool(proxy_connections(p, p.watchers))
                    .await?,
            );
        } else {
            clients = etcd_clients(&ctx.grpc_endpoint(target)?, p.connections).await?;
        }
        tokio::time::sleep(settle).await;
        let front = ctx.front_pid(target);
        let before_etcd = ctx.etcd_pid().and_then(sample);
        let before_proxy = front.and_then(sample);
        let before_bench = sample(self_pid());
        let wt = match target {
            Target::Proxy | Target::Kube => WatchTarget::Proxy {
                pool: pool.as_ref().ok_or_else(|| anyhow!("no pool"))?,
                path: ctx.list_path(),
                protobuf: false,
                resume: false,
            },
            Target::Etcd | Target::Grpc | Target::GrpcProxy => WatchTarget::Etcd {
                clients: &clients,
                prefix: prefix.clone(),
                mux: p.etcd_mux,
            },
        };
        let pb = ctx.bar(p.watchers as u64, "establishing idle watchers");
        pb.set_prefix(target.name());
        let set = WatcherSet::start(wt, p.watchers, r0).await?;
        let established = set.wait_established(Duration::from_secs(300), &pb).await;
        pb.finish_and_clear();
        tokio::time::sleep(settle).await;
        let after_etcd = ctx.etcd_pid().and_then(sample);
        let after_proxy = front.and_then(sample);
        let after_bench = sample(self_pid());
        let etcd_watchers =
            etcd_metric(&ctx.etcd_endpoint, "etcd_debugging_mvcc_watcher_total").await;
        let connections = set.connections;
        let outcomes = set.stop().await;
        let first_error = outcomes.iter().find_map(|o| o.error.clone());
        drop(pool);
        drop(clients);
        if cycles > 1 {
            tokio::time::sleep(settle).await;
            let open = match target {
                Target::Etcd => after_etcd,
                _ => after_proxy,
            };
            let closed = holder_pid.and_then(sample);
            rows.push(json!({
                "cycle": cycle,
                "watchers_established": established,
                "rss_open_kb": open.map(|s| s.rss_kb),
                "rss_closed_kb": closed.map(|s| s.rss_kb),
                "first_error": first_error,
            }));
        }
        if cycle > 1 {
            continue;
        }
        let per = |b: Option<ProcSample>, a: Option<ProcSample>| -> Value {
            match (b, a) {
                (Some(b), Some(a)) if established > 0 => json!({
                    "rss_before_kb": b.rss_kb,
                    "rss_after_kb": a.rss_kb,
                    "rss_per_watcher_bytes": round3((a.rss_kb as f64 - b.rss_kb as f64) * 1024.0 / established as f64),
                }),
                _ => Value::Null,
            }
        };
        let holder = match target {
            Target::Etcd => per(before_etcd, after_etcd),
            _ => per(before_proxy, after_proxy),
        };
        result = json!({
            "target": target.name(),
            "watchers": p.watchers,
            "watchers_established": established,
            "connections": connections,
            "first_error": first_error,
            "rss_per_watcher_bytes": holder.get("rss_per_watcher_bytes").cloned().unwrap_or(Value::Null),
            "holder": holder,
            "etcd": per(before_etcd, after_etcd),
            "proxy": per(before_proxy, after_proxy),
            "bench": per(before_bench, after_bench),
            "etcd_watchers": etcd_watchers,
        });
    }
    if cycles > 1 {
        result["cycles"] = json!(rows);
    }
    Ok((result, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(target: &str, gets: u64, secs: f64, cpu: f64, peak: u64, lat_us: u64) -> Part {
        let mut h = new_histogram();
        for _ in 0..gets {
            h.saturating_record(lat_us);
        }
        let v = json!({
            "target": target,
            "gets": gets,
            "errors": 0,
            "first_error": null,
            "duration_s": secs,
            "gets_per_s": gets as f64 / secs,
            "processes": {
                "etcd": {"cpu_s": cpu, "peak_rss_kb": peak},
                "proxy": {"cpu_s": cpu / 2.0, "peak_rss_kb": peak},
                "bench": {"cpu_s": cpu / 4.0, "rss_kb": peak},
                "idle_fronts": {},
            },
        });
        (v, Some(h))
    }

    #[test]
    fn one_part_is_kept_as_it_is() {
        let (v, _) = round("etcd", 10, 1.0, 0.5, 100, 1000);
        let merged = merge_get_rounds(vec![(v.clone(), None)]).unwrap();
        assert_eq!(merged, v);
        assert!(merge_get_rounds(Vec::new()).is_err());
    }

    #[test]
    fn rounds_add_up_and_rates_come_from_the_sums() {
        let mut second = round("etcd", 300, 2.0, 1.5, 300, 3000);
        second.0["first_error"] = json!("boom");
        let v = merge_get_rounds(vec![round("etcd", 100, 1.0, 0.5, 200, 1000), second]).unwrap();
        assert_eq!(v["gets"], 400);
        assert_eq!(v["duration_s"], 3.0);
        assert_eq!(v["gets_per_s"], round3(400.0 / 3.0));
        assert_eq!(v["processes"]["etcd"]["cpu_s"], 2.0);
        assert_eq!(v["processes"]["proxy"]["cpu_s"], 1.0);
        assert_eq!(v["processes"]["etcd"]["peak_rss_kb"], 300);
        // etcd serves these Gets: 2 s of its CPU over 400 Gets.
        assert_eq!(v["server_cpu_us_per_get"], 5000.0);
        // The bench's client: 0.5 s over 400 Gets.
        assert_eq!(v["processes"]["bench"]["cpu_s"], 0.5);
        assert_eq!(v["client_cpu_us_per_get"], 1250.0);
        assert_eq!(v["first_error"], "boom");
        assert_eq!(v["rounds"], 2);
        assert_eq!(v["latency_ms"]["count"], 400);
        // A quarter of the Gets took 1 ms, the rest 3 ms.
        let p50 = v["latency_ms"]["p50_ms"].as_f64().unwrap();
        assert!((2.9..3.1).contains(&p50), "{p50}");
        let min = v["latency_ms"]["min_ms"].as_f64().unwrap();
        assert!((0.9..1.1).contains(&min), "{min}");
    }

    #[test]
    fn the_proxy_rows_cpu_per_get_is_the_proxys() {
        let parts = vec![
            round("proxy", 100, 1.0, 0.4, 10, 500),
            round("proxy", 100, 1.0, 0.4, 10, 500),
        ];
        let v = merge_get_rounds(parts).unwrap();
        // proxy CPU 0.2 s per round: 0.4 s over 200 Gets.
        assert_eq!(v["server_cpu_us_per_get"], 2000.0);
        assert_eq!(v["client_cpu_us_per_get"], 1000.0);
    }

    #[test]
    fn a_single_round_gets_its_cpu_per_get_too() {
        let (mut v, _) = round("etcd", 200, 1.0, 0.4, 10, 500);
        set_cpu_per_get(&mut v);
        assert_eq!(v["server_cpu_us_per_get"], 2000.0);
        assert_eq!(v["client_cpu_us_per_get"], 500.0);
        // No Gets: no figure, rather than a division by zero.
        v["gets"] = json!(0);
        set_cpu_per_get(&mut v);
        assert!(v["server_cpu_us_per_get"].is_null());
        assert!(v["client_cpu_us_per_get"].is_null());
    }
}

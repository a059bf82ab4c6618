//! Prometheus metrics (docs/DESIGN.md section 7).
//!
//! One process-wide registry: every layer records into [`metrics()`] without
//! threading a handle through each constructor, and `/metrics` renders it with
//! [`gather`]. Names and labels are the contract the Grafana dashboard in
//! `dashboards/` relies on.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hyper::StatusCode;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

/// Buckets from 50 µs to 10 s: watch delivery and cache reads are sub-ms,
/// etcd round trips and consistent-read waits are ms to seconds.
const LATENCY_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
];

/// Initialization (initial list) takes from ms to minutes for huge prefixes.
const INIT_BUCKETS: &[f64] = &[
    0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

pub struct Metrics {
    registry: Registry,
    pub initialization_duration: HistogramVec,
    pub read_wait: HistogramVec,
    pub watch_event_delay: ShardedHistogramVec,
    pub etcd_request_duration: HistogramVec,
    pub http_requests: IntCounterVec,
    pub http_request_duration: HistogramVec,
    pub api_open_watches: prometheus::IntGauge,
    /// Requests by authentication result: `success`, `failure` (401) or
    /// `anonymous` (no credentials, anonymous access on).
    pub authentication_attempts: IntCounterVec,
    /// Authorization decisions: `allowed` or `denied`.
    pub authorization_decisions: IntCounterVec,
    pub impersonation_attempts: IntCounterVec,
    pub transformation_operations: IntCounterVec,
    pub transformation_failures: IntCounterVec,
    pub etcd_tls_handshake_errors: IntCounterVec,
    /// Open client connections (limited by `server.max_connections`).
    pub api_open_connections: IntGauge,
    /// Connections closed at accept because `server.max_connections` were open.
    pub api_connections_refused: IntCounter,
    /// Connections the server closed on a client that held them without use:
    /// `first_request_timeout`, `idle_timeout`, `stalled_watch`.
    pub api_connections_closed: IntCounterVec,
    pub grpc_requests: IntCounterVec,
    pub grpc_watchers: prometheus::IntGaugeVec,
    /// Full Lists by resource and whether their body was kept from an
    /// earlier List of the same objects (`hit`) or built (`miss`).
    pub list_body_cache: IntCounterVec,
    /// Bytes of List bodies kept (bounded by `server.list_body_cache_bytes`).
    pub list_body_cache_bytes: IntGauge,
    /// Responses sent gzipped (`api::compression`), by how: `whole` (one
    /// buffer), `stream` (compressed as it was made), `kept` (a List
    /// written from its kept gzip).
    pub api_gzip_responses: IntCounterVec,
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric definition");
    r.register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid metric definition");
    r.register(Box::new(g.clone()))
        .expect("metric registered once");
    g
}

fn histogram(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: &[f64],
) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .expect("valid metric definition");
    r.register(Box::new(h.clone()))
        .expect("metric registered once");
    h
}

impl Metrics {
    // The definitions are constants of this file; a failure here is a
    // programming error caught by the unit test below, not a run-time input.
    fn new() -> Metrics {
        let r = Registry::new();
        #[cfg(target_os = "linux")]
        {
            let pc = prometheus::process_collector::ProcessCollector::for_self();
            let _ = r.register(Box::new(pc));
        }
        let res = &["resource"];
        Metrics {
            initialization_duration: histogram(
                &r,
                "watchcache_initialization_duration_seconds",
                "Duration of an initial list or relist.",
                res,
                INIT_BUCKETS,
            ),
            read_wait: histogram(
                &r,
                "watchcache_read_wait_seconds",
                "Time a read waited for the cache to reach the wanted resourceVersion.",
                res,
                LATENCY_BUCKETS,
            ),
            watch_event_delay: {
                let h = ShardedHistogramVec::new(
                    "watchcache_watch_event_delay_seconds",
                    "Time from the reflector receiving an event from etcd to its line being written to a watcher.",
                    "resource",
                    LATENCY_BUCKETS,
                );
                r.register(Box::new(h.clone()))
                    .expect("metric registered once");
                h
            },
            etcd_request_duration: histogram(
                &r,
                "watchcache_etcd_request_duration_seconds",
                "Duration of etcd requests by operation.",
                &["operation"],
                LATENCY_BUCKETS,
            ),
            http_requests: counter(
                &r,
                "watchcache_http_requests_total",
                "HTTP requests by verb and status code.",
                &["verb", "code"],
            ),
            http_request_duration: histogram(
                &r,
                "watchcache_http_request_duration_seconds",
                "HTTP request duration by verb (watches: until the response head is sent).",
                &["verb"],
                LATENCY_BUCKETS,
            ),
            api_open_watches: gauge(
                &r,
                "watchcache_api_open_watches",
                "Open watch streams of the REST API (limited by server.max_watches).",
            ),
            authentication_attempts: counter(
                &r,
                "watchcache_authentication_attempts_total",
                "Requests by authentication result (success, failure, anonymous).",
                &["result"],
            ),
            authorization_decisions: counter(
                &r,
                "watchcache_authorization_decisions_total",
                "Authorization decisions (allowed, denied).",
                &["decision"],
            ),
            impersonation_attempts: counter(
                &r,
                "watchcache_impersonation_attempts_total",
                "Requests with impersonation headers, by decision (allowed, denied).",
                &["decision"],
            ),
            transformation_operations: counter(
                &r,
                "watchcache_transformation_operations_total",
                "Value transformations (encryption at rest) by resource, direction (from_storage, to_storage) and result (ok, error); after apiserver_storage_transformation_operations_total.",
                &["resource", "transformation_type", "result"],
            ),
            transformation_failures: counter(
                &r,
                "watchcache_transformation_failures_total",
                "Stored values no encryption provider could read (or write), by resource and reason (no_matching_provider, truncated, decrypt_failed, encrypt_failed).",
                &["resource", "reason"],
            ),
            etcd_tls_handshake_errors: counter(
                &r,
                "watchcache_etcd_tls_handshake_errors_total",
                "Failed TLS handshakes with etcd, by endpoint.",
                &["endpoint"],
            ),
            api_open_connections: gauge(
                &r,
                "watchcache_api_open_connections",
                "Open client connections of the REST API (limited by server.max_connections).",
            ),
            api_connections_refused: {
                let c = IntCounter::new(
                    "watchcache_api_connections_refused_total",
                    "Connections closed at accept because server.max_connections were open.",
                )
                .expect("valid metric definition");
                r.register(Box::new(c.clone()))
                    .expect("metric registered once");
                c
            },
            api_connections_closed: counter(
                &r,
                "watchcache_api_connections_closed_total",
                "Connections closed by the server, by reason (first_request_timeout, idle_timeout, stalled_watch).",
                &["reason"],
            ),
            grpc_requests: counter(
                &r,
                "watchcache_grpc_requests_total",
                "etcd v3 gRPC front: Range calls and watch creations by method and source (cache, etcd).",
                &["method", "source"],
            ),
            grpc_watchers: {
                let g = prometheus::IntGaugeVec::new(
                    Opts::new(
                        "watchcache_grpc_watchers",
                        "etcd v3 gRPC front: open client watches by source (cache, etcd).",
                    ),
                    &["source"],
                )
                .expect("valid metric definition");
                r.register(Box::new(g.clone()))
                    .expect("metric registered once");
                g
            },
            list_body_cache: counter(
                &r,
                "watchcache_list_body_cache_total",
                "Full Lists (JSON or protobuf) by resource and result: hit (written from the body kept from an earlier List of the same objects) or miss (built).",
                &["resource", "result"],
            ),
            list_body_cache_bytes: gauge(
                &r,
                "watchcache_list_body_cache_bytes",
                "Bytes of List bodies kept, or being recorded, for Lists of the same objects (bounded by server.list_body_cache_bytes).",
            ),
            api_gzip_responses: counter(
                &r,
                "watchcache_api_gzip_responses_total",
                "Responses sent gzipped to clients that asked (over 128 KiB), by source: whole (one buffer), stream (compressed as it was made), kept (a List written from the gzip kept beside its kept body), watch (a WatchList stream).",
                &["source"],
            ),
            registry: r,
        }
    }
}

/// One resource's histograms with the `resource` label bound once, so hot
/// paths touch a plain handle, not a label lookup. (Counters and gauges of a
/// resource are its cacher's `CacherStats`, exported at scrape time.)
#[derive(Clone)]
pub struct ResourceMetrics {
    pub initialization_duration: Histogram,
    pub read_wait: Histogram,
    pub watch_event_delay: Arc<ShardedHistogram>,
}

impl std::fmt::Debug for ResourceMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceMetrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// The handles of one resource (e.g. `pods`).
    pub fn for_resource(&self, resource: &str) -> ResourceMetrics {
        let r = &[resource];
        ResourceMetrics {
            initialization_duration: self.initialization_duration.with_label_values(r),
            read_wait: self.read_wait.with_label_values(r),
            watch_event_delay: self.watch_event_delay.with_label_value(resource),
        }
    }

    /// Adds a collector read at scrape time (e.g. the cachers' stats).
    /// A second registration of the same metric names is refused and logged.
    pub fn register_collector(&self, c: Box<dyn prometheus::core::Collector>) {
        if let Err(e) = self.registry.register(c) {
            tracing::error!(error = %e, "metrics collector not registered");
        }
    }
}

/// Shards of a [`ShardedHistogram`]: more than the threads that observe at
/// once (the runtime's workers), so two rarely share one.
const SHARDS: usize = 8;
/// Bucket bounds a [`ShardedHistogram`] can have.
const MAX_BUCKETS: usize = 24;

/// A histogram of durations observed from every worker thread at once, once
/// per watch event delivered (`watchcache_watch_event_delay_seconds`).
///
/// Why not prometheus' `Histogram`: each of its observations updates the
/// same count, sum and bucket words from whichever core it runs on, and at
/// 10,000 watchers those shared cache lines were 4% of a fan-out profile.
/// Here each thread adds to its own shard (by a per-thread index), with no
/// compare-and-swap loop (the sum is whole nanoseconds); a scrape adds the
/// shards up. The count is the buckets' total, so `_count` and `_bucket`
/// always agree; `_sum` may lag an observation in progress.
pub struct ShardedHistogram {
    bounds: &'static [f64],
    shards: Box<[Shard]>,
}

#[repr(align(128))]
struct Shard {
    /// Per bound, then one for +Inf.
    buckets: [AtomicU64; MAX_BUCKETS + 1],
    sum_nanos: AtomicU64,
}

impl Default for Shard {
    fn default() -> Shard {
        Shard {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_nanos: AtomicU64::new(0),
        }
    }
}

thread_local! {
    /// This thread's shard of every [`ShardedHistogram`].
    static SHARD: usize = {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS
    };
}

impl ShardedHistogram {
    fn new(bounds: &'static [f64]) -> ShardedHistogram {
        assert!(bounds.len() <= MAX_BUCKETS, "a constant of this file");
        ShardedHistogram {
            bounds,
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        }
    }

    pub fn observe(&self, d: std::time::Duration) {
        let secs = d.as_secs_f64();
        let i = self
            .bounds
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(self.bounds.len());
        let shard = &self.shards[SHARD.with(|s| *s)];
        shard.buckets[i].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        shard.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn sample_count(&self) -> u64 {
        self.shards
            .iter()
            .flat_map(|s| s.buckets.iter())
            .map(|b| b.load(Ordering::Relaxed))
            .sum()
    }

    fn proto(&self) -> prometheus::proto::Histogram {
        let mut counts = [0u64; MAX_BUCKETS + 1];
        let mut sum_nanos = 0u64;
        for s in self.shards.iter() {
            for (c, b) in counts.iter_mut().zip(s.buckets.iter()) {
                *c += b.load(Ordering::Relaxed);
            }
            sum_nanos = sum_nanos.wrapping_add(s.sum_nanos.load(Ordering::Relaxed));
        }
        let mut h = prometheus::proto::Histogram::default();
        let mut cumulative = 0;
        let mut buckets = Vec::with_capacity(self.bounds.len());
        for (bound, c) in self.bounds.iter().zip(counts.iter()) {
            cumulative += c;
            let mut b = prometheus::proto::Bucket::default();
            b.set_cumulative_count(cumulative);
            b.set_upper_bound(*bound);
            buckets.push(b);
        }
        h.set_bucket(buckets);
        h.set_sample_count(cumulative + counts[self.bounds.len()]);
        h.set_sample_sum(sum_nanos as f64 / 1e9);
        h
    }
}

/// [`ShardedHistogram`]s by the value of one label, as one metric family.
#[derive(Clone)]
pub struct ShardedHistogramVec {
    inner: Arc<ShardedVecInner>,
}

struct ShardedVecInner {
    desc: prometheus::core::Desc,
    label: String,
    bounds: &'static [f64],
    children: parking_lot::Mutex<Vec<(String, Arc<ShardedHistogram>)>>,
}

impl ShardedHistogramVec {
    fn new(name: &str, help: &str, label: &str, bounds: &'static [f64]) -> ShardedHistogramVec {
        let desc = prometheus::core::Desc::new(
            name.to_string(),
            help.to_string(),
            vec![label.to_string()],
            Default::default(),
        )
        .expect("valid metric definition");
        ShardedHistogramVec {
            inner: Arc::new(ShardedVecInner {
                desc,
                label: label.to_string(),
                bounds,
                children: Default::default(),
            }),
        }
    }

    /// The histogram of `value` (created on first use).
    pub fn with_label_value(&self, value: &str) -> Arc<ShardedHistogram> {
        let mut children = self.inner.children.lock();
        if let Some((_, h)) = children.iter().find(|(v, _)| v == value) {
            return Arc::clone(h);
        }
        let h = Arc::new(ShardedHistogram::new(self.inner.bounds));
        children.push((value.to_string(), Arc::clone(&h)));
        h
    }
}

impl prometheus::core::Collector for ShardedHistogramVec {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        vec![&self.inner.desc]
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let children = self.inner.children.lock();
        if children.is_empty() {
            return Vec::new();
        }
        let metrics = children
            .iter()
            .map(|(value, h)| {
                let mut label = prometheus::proto::LabelPair::default();
                label.set_name(self.inner.label.clone());
                label.set_value(value.clone());
                let mut m = prometheus::proto::Metric::from_label(vec![label]);
                m.set_histogram(h.proto());
                m
            })
            .collect();
        let mut f = prometheus::proto::MetricFamily::default();
        f.set_name(self.inner.desc.fq_name.clone());
        f.set_help(self.inner.desc.help.clone());
        f.set_field_type(prometheus::proto::MetricType::HISTOGRAM);
        f.set_metric(metrics);
        vec![f]
    }
}

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(Metrics::new)
}

thread_local! {
    /// This thread's children of the HTTP request metrics, by verb and
    /// code: resolving one (`with_label_values`) hashes its labels and
    /// takes the family's lock, twice per request otherwise.
    static HTTP_CHILDREN: RefCell<Vec<(&'static str, u16, IntCounter, Histogram)>> =
        const { RefCell::new(Vec::new()) };
}

/// Counts a served HTTP request (`watchcache_http_requests_total`) and
/// records its duration (`watchcache_http_request_duration_seconds`).
pub fn observe_http_request(verb: &'static str, code: StatusCode, elapsed: Duration) {
    HTTP_CHILDREN.with(|children| {
        let mut children = children.borrow_mut();
        let i = match children
            .iter()
            .position(|(v, c, ..)| *c == code.as_u16() && *v == verb)
        {
            Some(i) => i,
            None => {
                let m = metrics();
                children.push((
                    verb,
                    code.as_u16(),
                    m.http_requests.with_label_values(&[verb, code.as_str()]),
                    m.http_request_duration.with_label_values(&[verb]),
                ));
                children.len() - 1
            }
        };
        let (_, _, requests, duration) = &children[i];
        requests.inc();
        duration.observe(elapsed.as_secs_f64());
    });
}

/// Renders every metric in the Prometheus text format.
pub fn gather() -> String {
    let families = metrics().registry.gather();
    let mut buf = Vec::new();
    if TextEncoder::new().encode(&families, &mut buf).is_err() {
        return String::new();
    }
    String::from_utf8(buf).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Observed from several threads, it renders what prometheus' own
    /// histogram renders for the same observations.
    #[test]
    fn sharded_histogram_renders_as_a_histogram() {
        let r = Registry::new();
        let sharded =
            ShardedHistogramVec::new("t_sharded_seconds", "h", "resource", LATENCY_BUCKETS);
        r.register(Box::new(sharded.clone())).unwrap();
        let plain = histogram(&r, "t_plain_seconds", "h", &["resource"], LATENCY_BUCKETS);
        let micros: Vec<u64> = (0..4000).map(|i| (i * 7919) % 3_000_000).collect();
        std::thread::scope(|scope| {
            for part in micros.chunks(1000) {
                let h = sharded.with_label_value("pods");
                let p = plain.with_label_values(&["pods"]);
                scope.spawn(move || {
                    for us in part {
                        let d = std::time::Duration::from_micros(*us);
                        h.observe(d);
                        p.observe(d.as_secs_f64());
                    }
                });
            }
        });
        let mut buf = Vec::new();
        TextEncoder::new().encode(&r.gather(), &mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        let lines = |name: &str, what: &str| -> Vec<String> {
            text.lines()
                .filter(|l| l.starts_with(&format!("{name}_{what}")))
                .map(|l| l.replacen(name, "x", 1))
                .collect()
        };
        for what in ["bucket", "count"] {
            let (a, b) = (
                lines("t_sharded_seconds", what),
                lines("t_plain_seconds", what),
            );
            assert!(!a.is_empty(), "{text}");
            assert_eq!(a, b, "{what}");
        }
        let sum = |name: &str| -> f64 {
            lines(name, "sum")[0]
                .rsplit(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        assert!((sum("t_sharded_seconds") - sum("t_plain_seconds")).abs() < 1e-6);
        assert_eq!(sharded.with_label_value("pods").sample_count(), 4000);
        assert!(
            text.contains("t_sharded_seconds_bucket{resource=\"pods\",le=\"+Inf\"} 4000"),
            "{text}"
        );
    }

    #[test]
    fn all_metrics_register_and_render() {
        let m = metrics();
        m.http_requests.with_label_values(&["get", "200"]).inc();
        m.watch_event_delay
            .with_label_value("pods")
            .observe(std::time::Duration::from_millis(1));
        let text = gather();
        for name in [
            "watchcache_http_requests_total",
            "watchcache_watch_event_delay_seconds_bucket",
        ] {
            assert!(text.contains(name), "{name} rendered");
        }
    }
}

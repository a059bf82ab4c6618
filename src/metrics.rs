//! Prometheus metrics (DESIGN.md section 7).
//!
//! One process-wide registry: every layer records into [`metrics()`] without
//! threading a handle through each constructor, and `/metrics` renders it with
//! [`gather`]. Names and labels are the contract the Grafana dashboard in
//! `dashboards/` relies on.

use std::sync::OnceLock;

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
    pub watch_event_delay: HistogramVec,
    pub etcd_request_duration: HistogramVec,
    pub http_requests: IntCounterVec,
    pub http_request_duration: HistogramVec,
    pub api_open_watches: prometheus::IntGauge,
    /// Requests by authentication result: `success`, `failure` (401) or
    /// `anonymous` (no credentials, anonymous access on).
    pub authentication_attempts: IntCounterVec,
    /// Authorization decisions: `allowed` or `denied`.
    pub authorization_decisions: IntCounterVec,
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
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric definition");
    r.register(Box::new(c.clone()))
        .expect("metric registered once");
    c
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
            watch_event_delay: histogram(
                &r,
                "watchcache_watch_event_delay_seconds",
                "Time from the reflector receiving an event from etcd to its line being written to a watcher.",
                res,
                LATENCY_BUCKETS,
            ),
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
            api_open_watches: {
                let g = prometheus::IntGauge::new(
                    "watchcache_api_open_watches",
                    "Open watch streams of the REST API (limited by server.max_watches).",
                )
                .expect("valid metric definition");
                r.register(Box::new(g.clone()))
                    .expect("metric registered once");
                g
            },
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
            api_open_connections: {
                let g = IntGauge::new(
                    "watchcache_api_open_connections",
                    "Open client connections of the REST API (limited by server.max_connections).",
                )
                .expect("valid metric definition");
                r.register(Box::new(g.clone()))
                    .expect("metric registered once");
                g
            },
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
    pub watch_event_delay: Histogram,
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
            watch_event_delay: self.watch_event_delay.with_label_values(r),
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

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(Metrics::new)
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

    #[test]
    fn all_metrics_register_and_render() {
        let m = metrics();
        m.http_requests.with_label_values(&["get", "200"]).inc();
        m.watch_event_delay
            .with_label_values(&["pods"])
            .observe(0.001);
        let text = gather();
        for name in [
            "watchcache_http_requests_total",
            "watchcache_watch_event_delay_seconds_bucket",
        ] {
            assert!(text.contains(name), "{name} rendered");
        }
    }
}

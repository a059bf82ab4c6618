//! Prometheus metrics (DESIGN.md section 7).
//!
//! One process-wide registry: every layer records into [`metrics()`] without
//! threading a handle through each constructor, and `/metrics` renders it with
//! [`gather`]. Names and labels are the contract the Grafana dashboard in
//! `dashboards/` relies on.

use std::sync::OnceLock;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
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
    pub events_received: IntCounterVec,
    pub events_dispatched: IntCounterVec,
    pub watchers: IntGaugeVec,
    pub terminated_watchers: IntCounterVec,
    pub resource_version: IntGaugeVec,
    pub history_capacity: IntGaugeVec,
    pub objects: IntGaugeVec,
    pub initializations: IntCounterVec,
    pub initialization_duration: HistogramVec,
    pub read_wait: HistogramVec,
    pub consistent_read: IntCounterVec,
    pub list: IntCounterVec,
    pub watch_event_delay: HistogramVec,
    pub etcd_request_duration: HistogramVec,
    pub http_requests: IntCounterVec,
    pub http_request_duration: HistogramVec,
    pub undecodable_values: IntCounterVec,
    pub api_open_watches: prometheus::IntGauge,
    /// Requests by authentication result: `success`, `failure` (401) or
    /// `anonymous` (no credentials, anonymous access on).
    pub authentication_attempts: IntCounterVec,
    /// Authorization decisions: `allowed` or `denied`.
    pub authorization_decisions: IntCounterVec,
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric definition");
    r.register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

fn gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric definition");
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
            events_received: counter(
                &r,
                "watchcache_events_received_total",
                "Events received from etcd by the reflector.",
                res,
            ),
            events_dispatched: counter(
                &r,
                "watchcache_events_dispatched_total",
                "Events written to watchers (one per watcher and event).",
                res,
            ),
            watchers: gauge(&r, "watchcache_watchers", "Open watchers.", res),
            terminated_watchers: counter(
                &r,
                "watchcache_terminated_watchers_total",
                "Watchers ended by the server, by reason (expired, timeout, shutdown, closed).",
                &["resource", "reason"],
            ),
            resource_version: gauge(
                &r,
                "watchcache_resource_version",
                "Current resourceVersion (etcd revision) of the cache.",
                res,
            ),
            history_capacity: gauge(
                &r,
                "watchcache_history_capacity",
                "Capacity of the event history ring.",
                res,
            ),
            objects: gauge(&r, "watchcache_objects", "Objects in the cache.", res),
            initializations: counter(
                &r,
                "watchcache_initializations_total",
                "Initial lists and relists of the cache.",
                res,
            ),
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
            consistent_read: counter(
                &r,
                "watchcache_consistent_read_total",
                "Consistent reads, served from the cache or by falling back to etcd.",
                &["resource", "outcome"],
            ),
            list: counter(
                &r,
                "watchcache_list_total",
                "List requests by the source that answered them.",
                &["resource", "source"],
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
            undecodable_values: counter(
                &r,
                "watchcache_undecodable_values_total",
                "etcd values skipped because they are not JSON objects or their key does not fit.",
                res,
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
            registry: r,
        }
    }
}

/// One resource's metrics with the `resource` label bound once, so hot
/// paths (per event, per watcher) touch a plain atomic, not a label lookup.
#[derive(Clone)]
pub struct ResourceMetrics {
    pub events_received: IntCounter,
    pub events_dispatched: IntCounter,
    pub watchers: IntGauge,
    pub terminated_expired: IntCounter,
    pub terminated_timeout: IntCounter,
    pub terminated_shutdown: IntCounter,
    pub terminated_closed: IntCounter,
    pub resource_version: IntGauge,
    pub history_capacity: IntGauge,
    pub objects: IntGauge,
    pub initializations: IntCounter,
    pub initialization_duration: Histogram,
    pub read_wait: Histogram,
    pub consistent_read_cache: IntCounter,
    pub consistent_read_fallback: IntCounter,
    pub list_cache: IntCounter,
    pub list_etcd: IntCounter,
    pub watch_event_delay: Histogram,
    pub undecodable_values: IntCounter,
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
        let term = |reason: &str| {
            self.terminated_watchers
                .with_label_values(&[resource, reason])
        };
        ResourceMetrics {
            events_received: self.events_received.with_label_values(r),
            events_dispatched: self.events_dispatched.with_label_values(r),
            watchers: self.watchers.with_label_values(r),
            terminated_expired: term("expired"),
            terminated_timeout: term("timeout"),
            terminated_shutdown: term("shutdown"),
            terminated_closed: term("closed"),
            resource_version: self.resource_version.with_label_values(r),
            history_capacity: self.history_capacity.with_label_values(r),
            objects: self.objects.with_label_values(r),
            initializations: self.initializations.with_label_values(r),
            initialization_duration: self.initialization_duration.with_label_values(r),
            read_wait: self.read_wait.with_label_values(r),
            consistent_read_cache: self.consistent_read.with_label_values(&[resource, "cache"]),
            consistent_read_fallback: self
                .consistent_read
                .with_label_values(&[resource, "fallback"]),
            list_cache: self.list.with_label_values(&[resource, "cache"]),
            list_etcd: self.list.with_label_values(&[resource, "etcd"]),
            watch_event_delay: self.watch_event_delay.with_label_values(r),
            undecodable_values: self.undecodable_values.with_label_values(r),
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
        m.events_received.with_label_values(&["pods"]).inc();
        m.consistent_read
            .with_label_values(&["pods", "cache"])
            .inc();
        m.watch_event_delay
            .with_label_values(&["pods"])
            .observe(0.001);
        let text = gather();
        for name in [
            "watchcache_events_received_total",
            "watchcache_consistent_read_total",
            "watchcache_watch_event_delay_seconds_bucket",
        ] {
            assert!(text.contains(name), "{name} rendered");
        }
    }
}

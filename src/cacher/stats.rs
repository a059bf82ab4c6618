//! `CacherStats`: the one home of a cacher's counters and gauges.
//!
//! Each figure is kept once, as an atomic of the cacher that produces it
//! (cheap on the hot paths, and readable per cacher by tests and embedders);
//! `/metrics` reads the same atomics through [`StatsCollector`] at scrape
//! time, summed by `resource` label. Histograms (delays, durations) live
//! only in the Prometheus registry ([`ResourceMetrics`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts};

use crate::metrics::ResourceMetrics;

/// Why a watcher ended (the `reason` label of
/// `watchcache_terminated_watchers_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WatchEnd {
    /// It fell out of the history ring (410).
    Expired,
    /// Its `timeoutSeconds` passed.
    Timeout,
    /// The server shut down.
    Shutdown,
    /// The client went away.
    Closed,
    /// Cut off by the API: its client did not read what it was sent
    /// (`server.watch_max_buffered_bytes`).
    Unresponsive,
}

impl WatchEnd {
    /// In declaration order: `reason as usize` indexes `CacherStats::terminated`.
    const ALL: [WatchEnd; 5] = [
        WatchEnd::Expired,
        WatchEnd::Timeout,
        WatchEnd::Shutdown,
        WatchEnd::Closed,
        WatchEnd::Unresponsive,
    ];

    fn label(self) -> &'static str {
        match self {
            WatchEnd::Expired => "expired",
            WatchEnd::Timeout => "timeout",
            WatchEnd::Shutdown => "shutdown",
            WatchEnd::Closed => "closed",
            WatchEnd::Unresponsive => "unresponsive",
        }
    }
}

/// The `result` label of `watchcache_consistency_checks_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CheckResult {
    Match,
    Mismatch,
    Error,
}

/// Counters (monotonic) and gauges of one cacher.
#[derive(Debug)]
pub struct CacherStats {
    resource: String,
    pub events_received: AtomicU64,
    /// Values skipped because they could not be read or decoded.
    pub decode_errors: AtomicU64,
    pub initializations: AtomicU64,
    pub relists: AtomicU64,
    /// Watch streams that ended with an error and were resumed (idle
    /// restarts not included).
    pub watch_restarts: AtomicU64,
    /// Watch restarts because the stream went silent (idle detection).
    pub idle_restarts: AtomicU64,
    /// Progress requests sent on the reflector's watch stream.
    pub progress_requests: AtomicU64,
    pub consistent_read_cache: AtomicU64,
    pub consistent_read_fallback: AtomicU64,
    pub list_cache: AtomicU64,
    pub list_etcd: AtomicU64,
    /// Gets and Lists answered in JSON to a protobuf client because an
    /// object does not fit its type's protobuf schema.
    pub protobuf_fallbacks: AtomicU64,
    /// Gauge: open watchers.
    pub watchers: AtomicI64,
    /// Gauge: open watchers with a shard selector.
    pub shard_watchers: AtomicI64,
    /// Watchers ended, by [`WatchEnd`] (in `WatchEnd::ALL` order).
    terminated: [AtomicU64; 5],
    pub events_dispatched: AtomicU64,
    /// Gauges of the published state.
    pub resource_version: AtomicI64,
    pub objects: AtomicI64,
    pub history_capacity: AtomicI64,
    /// The history's retained events and their wire bytes.
    pub history_events: AtomicI64,
    pub history_bytes: AtomicI64,
    /// When the history's oldest event was received: nanoseconds after
    /// [`clock_base`], plus one; 0 while the history is empty.
    history_oldest: AtomicU64,
    /// Consistency checks by result: match, mismatch, error.
    pub consistency_checks: [AtomicU64; 3],
    /// Unix time (seconds) of the last check that matched; 0: none yet.
    pub last_consistent: AtomicI64,
    /// Histograms, labelled by resource.
    prom: ResourceMetrics,
}

impl CacherStats {
    /// Stats of `resource`, exported through the process's registry.
    pub(crate) fn new(resource: &str, history_capacity: usize) -> Arc<CacherStats> {
        let stats = Arc::new(CacherStats {
            resource: resource.to_string(),
            events_received: AtomicU64::new(0),
            decode_errors: AtomicU64::new(0),
            initializations: AtomicU64::new(0),
            relists: AtomicU64::new(0),
            watch_restarts: AtomicU64::new(0),
            idle_restarts: AtomicU64::new(0),
            progress_requests: AtomicU64::new(0),
            consistent_read_cache: AtomicU64::new(0),
            consistent_read_fallback: AtomicU64::new(0),
            list_cache: AtomicU64::new(0),
            list_etcd: AtomicU64::new(0),
            protobuf_fallbacks: AtomicU64::new(0),
            watchers: AtomicI64::new(0),
            shard_watchers: AtomicI64::new(0),
            terminated: Default::default(),
            events_dispatched: AtomicU64::new(0),
            resource_version: AtomicI64::new(0),
            objects: AtomicI64::new(0),
            history_capacity: AtomicI64::new(history_capacity as i64),
            history_events: AtomicI64::new(0),
            history_bytes: AtomicI64::new(0),
            history_oldest: AtomicU64::new(0),
            consistency_checks: Default::default(),
            last_consistent: AtomicI64::new(0),
            prom: crate::metrics::metrics().for_resource(resource),
        });
        collector().add(&stats);
        stats
    }

    fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn consistent_cache(&self) {
        Self::bump(&self.consistent_read_cache);
    }
    pub(crate) fn consistent_fallback(&self) {
        Self::bump(&self.consistent_read_fallback);
    }
    pub(crate) fn list_cache(&self) {
        Self::bump(&self.list_cache);
    }
    pub(crate) fn list_etcd(&self) {
        Self::bump(&self.list_etcd);
    }
    pub(crate) fn observe_read_wait(&self, d: Duration) {
        self.prom.read_wait.observe(d.as_secs_f64());
    }
    pub(crate) fn protobuf_fallback(&self) {
        Self::bump(&self.protobuf_fallbacks);
    }

    pub(crate) fn decode_error(&self) {
        Self::bump(&self.decode_errors);
    }
    pub(crate) fn watch_restart(&self) {
        Self::bump(&self.watch_restarts);
    }
    pub(crate) fn progress_request(&self) {
        Self::bump(&self.progress_requests);
    }
    pub(crate) fn idle_restart(&self) {
        Self::bump(&self.idle_restarts);
    }
    /// An initial list or a relist finished after `took`.
    pub(crate) fn initialized(&self, took: Duration, relist: bool) {
        if relist {
            Self::bump(&self.relists);
        } else {
            Self::bump(&self.initializations);
        }
        self.prom
            .initialization_duration
            .observe(took.as_secs_f64());
    }
    pub(crate) fn received(&self, n: u64) {
        self.events_received.fetch_add(n, Ordering::Relaxed);
    }
    pub(crate) fn watcher_added(&self) {
        self.watchers.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn watcher_removed(&self) {
        self.watchers.fetch_sub(1, Ordering::Relaxed);
    }
    /// A sharded watcher opened (`1`) or closed (`-1`).
    pub(crate) fn shard_watcher_added(&self, n: i64) {
        self.shard_watchers.fetch_add(n, Ordering::Relaxed);
    }
    /// A watcher ended for `reason`.
    pub(crate) fn watcher_ended(&self, reason: WatchEnd) {
        Self::bump(&self.terminated[reason as usize]);
    }
    /// Watchers ended for `reason` so far.
    pub(crate) fn terminated(&self, reason: WatchEnd) -> u64 {
        self.terminated[reason as usize].load(Ordering::Relaxed)
    }
    /// Watchers that fell out of the history (410).
    pub fn watchers_expired(&self) -> u64 {
        self.terminated(WatchEnd::Expired)
    }
    /// `n` events handed to one watcher's stream.
    pub(crate) fn dispatched(&self, n: u64) {
        self.events_dispatched.fetch_add(n, Ordering::Relaxed);
    }
    /// One "received from etcd -> handed to a watcher" delay.
    pub(crate) fn event_delay(&self, d: std::time::Duration) {
        self.prom.watch_event_delay.observe(d);
    }
    pub(crate) fn consistency_checked(&self, result: CheckResult) {
        Self::bump(&self.consistency_checks[result as usize]);
    }
    /// Consistency checks that found a mismatch so far.
    pub fn consistency_mismatches(&self) -> u64 {
        self.consistency_checks[CheckResult::Mismatch as usize].load(Ordering::Relaxed)
    }
    /// The history's size after a change: its capacity, events, wire bytes
    /// and when its oldest event was received.
    pub(crate) fn history(
        &self,
        capacity: usize,
        events: usize,
        bytes: u64,
        oldest: Option<std::time::Instant>,
    ) {
        let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.history_capacity
            .store(clamp(capacity as u64), Ordering::Relaxed);
        self.history_events
            .store(clamp(events as u64), Ordering::Relaxed);
        self.history_bytes.store(clamp(bytes), Ordering::Relaxed);
        let oldest = oldest.map_or(0, |t| {
            let ns = t.saturating_duration_since(clock_base()).as_nanos();
            u64::try_from(ns).unwrap_or(u64::MAX - 1) + 1
        });
        self.history_oldest.store(oldest, Ordering::Relaxed);
    }

    /// Seconds since the history's oldest event was received (0: empty).
    pub fn history_oldest_age_seconds(&self) -> f64 {
        match self.history_oldest.load(Ordering::Relaxed) {
            0 => 0.0,
            ns => {
                let at = clock_base() + std::time::Duration::from_nanos(ns - 1);
                std::time::Instant::now()
                    .saturating_duration_since(at)
                    .as_secs_f64()
            }
        }
    }

    pub(crate) fn published(&self, rv: i64, objects: usize) {
        self.resource_version.store(rv, Ordering::Relaxed);
        self.objects.store(objects as i64, Ordering::Relaxed);
    }

    /// The counters, as (metric index, extra label, value), for export.
    fn counters(&self) -> Vec<(usize, &'static str, u64)> {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = vec![
            (C_RECEIVED, "", l(&self.events_received)),
            (C_DISPATCHED, "", l(&self.events_dispatched)),
            (C_UNDECODABLE, "", l(&self.decode_errors)),
            (
                C_INITIALIZATIONS,
                "",
                l(&self.initializations) + l(&self.relists),
            ),
            (C_RELISTS, "", l(&self.relists)),
            (C_RESTARTS, "error", l(&self.watch_restarts)),
            (C_RESTARTS, "idle", l(&self.idle_restarts)),
            (C_CONSISTENT, "cache", l(&self.consistent_read_cache)),
            (C_CONSISTENT, "fallback", l(&self.consistent_read_fallback)),
            (C_LIST, "cache", l(&self.list_cache)),
            (C_LIST, "etcd", l(&self.list_etcd)),
            (C_PROTOBUF_FALLBACK, "", l(&self.protobuf_fallbacks)),
            (C_PROGRESS_REQUESTS, "", l(&self.progress_requests)),
        ];
        for (i, r) in WatchEnd::ALL.iter().enumerate() {
            out.push((C_TERMINATED, r.label(), l(&self.terminated[i])));
        }
        for (i, r) in ["match", "mismatch", "error"].into_iter().enumerate() {
            out.push((C_CHECKS, r, l(&self.consistency_checks[i])));
        }
        out
    }
}

/// The process's reference instant for the history's age gauge.
fn clock_base() -> std::time::Instant {
    static BASE: OnceLock<std::time::Instant> = OnceLock::new();
    *BASE.get_or_init(std::time::Instant::now)
}

// Counter metrics exported from the atomics: (name, help, extra label).
const C_RECEIVED: usize = 0;
const C_DISPATCHED: usize = 1;
const C_UNDECODABLE: usize = 2;
const C_INITIALIZATIONS: usize = 3;
const C_RELISTS: usize = 4;
const C_RESTARTS: usize = 5;
const C_CONSISTENT: usize = 6;
const C_LIST: usize = 7;
const C_TERMINATED: usize = 8;
const C_CHECKS: usize = 9;
const C_PROTOBUF_FALLBACK: usize = 10;
const C_PROGRESS_REQUESTS: usize = 11;
const COUNTERS: [(&str, &str, Option<&str>); 12] = [
    (
        "watchcache_events_received_total",
        "Events received from etcd by the reflector.",
        None,
    ),
    (
        "watchcache_events_dispatched_total",
        "Events written to watchers (one per watcher and event).",
        None,
    ),
    (
        "watchcache_undecodable_values_total",
        "etcd values skipped because they could not be read or decoded, or their key does not fit.",
        None,
    ),
    (
        "watchcache_initializations_total",
        "Initial lists and relists of the cache.",
        None,
    ),
    (
        "watchcache_relists_total",
        "Relists of the cache (after a compacted watch or a detected inconsistency).",
        None,
    ),
    (
        "watchcache_reflector_watch_restarts_total",
        "Reflector watch streams restarted, by reason (error: the stream failed; idle: silent even after a progress request).",
        Some("reason"),
    ),
    (
        "watchcache_consistent_read_total",
        "Consistent reads, served from the cache or by falling back to etcd.",
        Some("outcome"),
    ),
    (
        "watchcache_list_total",
        "List requests by the source that answered them.",
        Some("source"),
    ),
    (
        "watchcache_terminated_watchers_total",
        "Watchers ended, by reason (expired, timeout, shutdown, closed, unresponsive).",
        Some("reason"),
    ),
    (
        "watchcache_consistency_checks_total",
        "Comparisons of the cache with etcd at one revision, by result (match, mismatch: the resource was relisted, error: no comparison could be made).",
        Some("result"),
    ),
    (
        "watchcache_protobuf_fallbacks_total",
        "Gets and Lists answered in JSON to a client that asked for protobuf, because an object does not fit its type's protobuf schema.",
        None,
    ),
    (
        "watchcache_reflector_progress_requests_total",
        "Progress requests the reflector sent on its etcd watch (for consistent reads and idle detection; at most one per 100 ms).",
        None,
    ),
];

const G_WATCHERS: usize = 0;
const G_RV: usize = 1;
const G_OBJECTS: usize = 2;
const G_CAPACITY: usize = 3;
const G_LAST_MATCH: usize = 4;
const G_HISTORY_EVENTS: usize = 5;
const G_HISTORY_BYTES: usize = 6;
const G_SHARD_WATCHERS: usize = 7;
const GAUGES: [(&str, &str); 8] = [
    ("watchcache_watchers", "Open watchers."),
    (
        "watchcache_resource_version",
        "Current resourceVersion (etcd revision) of the cache.",
    ),
    ("watchcache_objects", "Objects in the cache."),
    (
        "watchcache_history_capacity",
        "Capacity of the event history ring (fixed, or sized by age and bytes).",
    ),
    (
        "watchcache_consistency_last_match_timestamp_seconds",
        "Unix time of the last consistency check that found the cache equal to etcd (0: none yet).",
    ),
    (
        "watchcache_history_events",
        "Events retained in the history.",
    ),
    (
        "watchcache_history_bytes",
        "Wire bytes (JSON) of the events retained in the history.",
    ),
    (
        "watchcache_watch_shards",
        "Open watchers with a shard selector (kube-apiserver's apiserver_watch_shards_total).",
    ),
];

/// Exports every live cacher's [`CacherStats`] (plus the final counts of
/// cachers that went away) at scrape time.
pub(crate) struct StatsCollector {
    descs: Vec<Desc>,
    inner: Mutex<CollectorState>,
}

/// The collector holds every cacher's stats itself, so that no drop of a
/// [`CacherStats`] runs while a scrape holds the lock (a `Drop` that took
/// this lock deadlocked a scrape that had upgraded the last reference).
/// Stats only the collector still holds belong to cachers that went away:
/// their counters are folded into `retired`, under the lock, so the
/// process's counters stay monotonic.
struct CollectorState {
    live: Vec<Arc<CacherStats>>,
    /// Counter totals of dropped cachers: (metric, resource, label) -> value.
    retired: BTreeMap<(usize, String, &'static str), u64>,
    counters: Vec<IntCounterVec>,
    gauges: Vec<IntGaugeVec>,
    oldest_age: GaugeVec,
}

fn collector() -> &'static StatsCollector {
    static C: OnceLock<&'static StatsCollector> = OnceLock::new();
    C.get_or_init(|| {
        let c: &'static StatsCollector = Box::leak(Box::new(StatsCollector::new()));
        crate::metrics::metrics().register_collector(Box::new(CollectorRef(c)));
        c
    })
}

/// The registry owns collectors as boxes; this one lives for the process.
struct CollectorRef(&'static StatsCollector);

impl Collector for CollectorRef {
    fn desc(&self) -> Vec<&Desc> {
        self.0.descs.iter().collect()
    }
    fn collect(&self) -> Vec<MetricFamily> {
        self.0.collect()
    }
}

impl StatsCollector {
    // The definitions are constants of this file; a failure is a
    // programming error caught by the unit tests, not a run-time input.
    fn new() -> StatsCollector {
        let counters: Vec<IntCounterVec> = COUNTERS
            .iter()
            .map(|(name, help, extra)| {
                let labels: Vec<&str> = std::iter::once("resource").chain(*extra).collect();
                IntCounterVec::new(Opts::new(*name, *help), &labels)
                    .expect("valid metric definition")
            })
            .collect();
        let gauges: Vec<IntGaugeVec> = GAUGES
            .iter()
            .map(|(name, help)| {
                IntGaugeVec::new(Opts::new(*name, *help), &["resource"])
                    .expect("valid metric definition")
            })
            .collect();
        let oldest_age = GaugeVec::new(
            Opts::new(
                "watchcache_history_oldest_age_seconds",
                "Seconds since the history's oldest retained event was received (0: empty).",
            ),
            &["resource"],
        )
        .expect("valid metric definition");
        let descs = counters
            .iter()
            .flat_map(|c| c.desc().into_iter().cloned())
            .chain(gauges.iter().flat_map(|g| g.desc().into_iter().cloned()))
            .chain(oldest_age.desc().into_iter().cloned())
            .collect();
        StatsCollector {
            descs,
            inner: Mutex::new(CollectorState {
                live: Vec::new(),
                retired: BTreeMap::new(),
                counters,
                gauges,
                oldest_age,
            }),
        }
    }

    fn add(&self, stats: &Arc<CacherStats>) {
        let mut st = self.inner.lock();
        st.retire_unheld();
        st.live.push(Arc::clone(stats));
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let st = &mut *self.inner.lock();
        st.retire_unheld();
        for c in &st.counters {
            c.reset();
        }
        for g in &st.gauges {
            g.reset();
        }
        st.oldest_age.reset();
        let inc = |counters: &[IntCounterVec], m: usize, resource: &str, label: &str, v: u64| {
            let c = if COUNTERS[m].2.is_some() {
                counters[m].with_label_values(&[resource, label])
            } else {
                counters[m].with_label_values(&[resource])
            };
            c.inc_by(v);
        };
        for ((m, resource, label), v) in &st.retired {
            inc(&st.counters, *m, resource, label, *v);
        }
        for s in &st.live {
            let r = s.resource.as_str();
            for (m, label, v) in s.counters() {
                inc(&st.counters, m, r, label, v);
            }
            let l = |a: &AtomicI64| a.load(Ordering::Relaxed);
            st.gauges[G_WATCHERS]
                .with_label_values(&[r])
                .add(l(&s.watchers));
            st.gauges[G_SHARD_WATCHERS]
                .with_label_values(&[r])
                .add(l(&s.shard_watchers));
            st.gauges[G_OBJECTS]
                .with_label_values(&[r])
                .add(l(&s.objects));
            // Several cachers of one resource exist only in tests: the
            // newest state wins for the RV and the capacity.
            let rv = st.gauges[G_RV].with_label_values(&[r]);
            rv.set(rv.get().max(l(&s.resource_version)));
            st.gauges[G_CAPACITY]
                .with_label_values(&[r])
                .set(l(&s.history_capacity));
            let last = st.gauges[G_LAST_MATCH].with_label_values(&[r]);
            last.set(last.get().max(l(&s.last_consistent)));
            st.gauges[G_HISTORY_EVENTS]
                .with_label_values(&[r])
                .set(l(&s.history_events));
            st.gauges[G_HISTORY_BYTES]
                .with_label_values(&[r])
                .set(l(&s.history_bytes));
            let age = st.oldest_age.with_label_values(&[r]);
            age.set(age.get().max(s.history_oldest_age_seconds()));
        }
        st.counters
            .iter()
            .flat_map(|c| c.collect())
            .chain(st.gauges.iter().flat_map(|g| g.collect()))
            .chain(st.oldest_age.collect())
            .collect()
    }
}

impl CollectorState {
    /// Folds the counters of stats nobody but the collector holds into
    /// `retired` and lets them go. Called under the lock; dropping a
    /// `CacherStats` runs no code of this module.
    fn retire_unheld(&mut self) {
        let retired = &mut self.retired;
        self.live.retain(|s| {
            if Arc::strong_count(s) > 1 {
                return true;
            }
            for (m, label, v) in s.counters() {
                *retired.entry((m, s.resource.clone(), label)).or_default() += v;
            }
            false
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomics_are_exported_and_survive_the_cacher() {
        let s = CacherStats::new("stats-test-widgets", 7);
        s.received(3);
        s.watch_restart();
        s.idle_restart();
        s.idle_restart();
        s.watcher_ended(WatchEnd::Timeout);
        s.published(42, 5);
        let text = crate::metrics::gather();
        for line in [
            "watchcache_events_received_total{resource=\"stats-test-widgets\"} 3",
            "watchcache_reflector_watch_restarts_total{reason=\"error\",resource=\"stats-test-widgets\"} 1",
            "watchcache_reflector_watch_restarts_total{reason=\"idle\",resource=\"stats-test-widgets\"} 2",
            "watchcache_terminated_watchers_total{reason=\"timeout\",resource=\"stats-test-widgets\"} 1",
            "watchcache_resource_version{resource=\"stats-test-widgets\"} 42",
            "watchcache_history_capacity{resource=\"stats-test-widgets\"} 7",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        drop(s);
        let text = crate::metrics::gather();
        assert!(
            text.contains("watchcache_events_received_total{resource=\"stats-test-widgets\"} 3"),
            "a dropped cacher's counters stay counted"
        );
    }

    /// A scrape racing cachers coming and going: once it deadlocked when a
    /// scrape dropped the last reference to a stopped cacher's stats. Every
    /// counter stays counted, live or retired.
    #[test]
    fn scrapes_race_stats_coming_and_going() {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            let churn = std::thread::spawn(|| {
                for _ in 0..20_000 {
                    let s = CacherStats::new("stats-race-widgets", 1);
                    s.received(1);
                    drop(s);
                }
            });
            let mut scrapes = 0u32;
            while !churn.is_finished() || scrapes < 20_000 {
                let _ = collector().collect();
                scrapes += 1;
            }
            let churned = churn.join().is_ok();
            let _ = done_tx.send(churned);
        });
        let finished = done_rx.recv_timeout(std::time::Duration::from_secs(60));
        assert_eq!(finished, Ok(true), "scrapes and stats churn finished");
        assert!(worker.join().is_ok());
        let text = crate::metrics::gather();
        assert!(
            text.contains(
                "watchcache_events_received_total{resource=\"stats-race-widgets\"} 20000"
            ),
            "every dropped cacher's events stay counted"
        );
    }
}

//! Small real runs of `watchcache-bench fanout` with etcd watchers on
//! watchcache's etcd gRPC front (`--target grpc`), through `etcd grpc-proxy
//! start` (`--target grpc-proxy`) and on all three (`--compare-grpc`), issue
//! 13's benchmark: every watcher established, nothing lost or duplicated,
//! every figure reported.

mod common;

use serde_json::Value;

use common::{bench, bench_fails};

/// The figures every fan-out column of these runs reports.
const FIELDS: &[&str] = &[
    "target",
    "front",
    "watchers_established",
    "transport",
    "writes",
    "deliveries",
    "deliveries_per_s",
    "latency_ms.p50_ms",
    "latency_ms.p99_ms",
    "lost",
    "duplicated",
    "unexpected",
    "out_of_order",
    "etcd_watchers",
    "processes.etcd.cpu_s",
    "processes.etcd.peak_rss_kb",
    "processes.proxy.pid",
    "processes.proxy.cpu_s",
    "processes.proxy.peak_rss_kb",
    "per_delivery.holder_cpu_us_per_delivery",
    "per_delivery.etcd_cpu_us_per_delivery",
    "per_delivery.holder_rss_per_watcher_bytes",
];

fn get<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(v, |cur, k| &cur[k])
}

/// Asserts column `t` of a run of `w` watchers and `writes` writes is clean
/// and complete.
fn assert_clean(t: &Value, w: u64, writes: u64, what: &str) {
    for p in FIELDS {
        // etcd direct has nothing in front of it.
        if *p == "front" && t["target"] == "etcd" {
            continue;
        }
        assert!(!get(t, p).is_null(), "{what}: field {p} missing in {t:#}");
    }
    assert_eq!(t["watchers_established"], w, "{what}: {t:#}");
    assert_eq!(t["watchers_failed"], 0, "{what}: {t:#}");
    assert_eq!(t["writes"], writes, "{what}");
    assert_eq!(t["write_errors"], 0, "{what}");
    for k in ["lost", "duplicated", "unexpected", "out_of_order"] {
        assert_eq!(t[k], 0, "{what}: {k} on a clean run: {t:#}");
    }
    assert_eq!(t["deliveries"], w * writes, "{what}: {t:#}");
    assert_eq!(t["latency_ms"]["count"], w * writes, "{what}");
    assert!(t["latency_ms"]["p99_ms"].as_f64().unwrap() > 0.0, "{what}");
}

#[test]
fn fanout_on_watchcaches_grpc_front_is_clean() {
    let dir = tempfile::tempdir().unwrap();
    let r = bench(
        &[
            "fanout", "--target", "grpc", "-w", "20", "-r", "50", "-d", "1",
        ],
        &dir.path().join("f1.json"),
    );
    assert_eq!(r["params"]["targets"], serde_json::json!(["grpc"]));
    let t = &r["results"]["grpc"];
    assert_clean(t, 20, 50, "grpc");
    assert_eq!(t["front"], "watchcache");
    assert!(
        t["transport"].as_str().unwrap().contains("watchcache"),
        "{t:#}"
    );
    // The front coalesces: etcd holds the cache's watches, not the 20.
    assert!(t["etcd_watchers"].as_f64().unwrap() < 20.0, "{t:#}");
    assert_eq!(r["goals"]["zero_lost_and_duplicated"], true);
}

#[test]
fn fanout_through_etcd_grpc_proxy_is_clean() {
    let dir = tempfile::tempdir().unwrap();
    let r = bench(
        &[
            "fanout",
            "--target",
            "grpc-proxy",
            "-w",
            "20",
            "-r",
            "50",
            "-d",
            "1",
        ],
        &dir.path().join("f1.json"),
    );
    let t = &r["results"]["grpc_proxy"];
    assert_clean(t, 20, 50, "grpc_proxy");
    assert_eq!(t["front"], "etcd grpc-proxy");
    assert!(
        t["transport"].as_str().unwrap().contains("grpc-proxy"),
        "{t:#}"
    );
    assert_eq!(r["goals"]["zero_lost_and_duplicated"], true);
}

#[test]
fn compare_grpc_runs_three_columns_with_ratios() {
    let dir = tempfile::tempdir().unwrap();
    let r = bench(
        &[
            "fanout",
            "--compare-grpc",
            "-w",
            "10",
            "-r",
            "40",
            "-d",
            "1",
            "--etcd-watch-mode",
            "stream",
        ],
        &dir.path().join("f1.json"),
    );
    assert_eq!(
        r["params"]["targets"],
        serde_json::json!(["etcd", "grpc_proxy", "grpc"])
    );
    for c in ["etcd", "grpc_proxy", "grpc"] {
        let t = &r["results"][c];
        assert_clean(t, 10, 40, c);
        assert!(t["etcd_watch_streams"].as_f64().is_some(), "{c}: {t:#}");
    }
    // Each column's front is its own process: the daemon, grpc-proxy.
    assert_ne!(
        r["results"]["grpc"]["processes"]["proxy"]["pid"],
        r["results"]["grpc_proxy"]["processes"]["proxy"]["pid"]
    );
    assert!(r["results"]["etcd"]["front"].is_null());
    for k in [
        "deliveries_per_s_front_over_grpc_proxy",
        "p99_latency_front_over_grpc_proxy",
        "front_rss_per_watcher_front_over_grpc_proxy",
        "etcd_cpu_front_over_etcd_direct",
        "etcd_cpu_grpc_proxy_over_etcd_direct",
    ] {
        assert!(!r["ratios"][k].is_null(), "ratio {k} missing: {r:#}");
    }
    // Over grpc-proxy's CPU, which a one-second run can leave under the
    // kernel's 10 ms accounting tick: reported, and a number unless that
    // denominator is zero.
    let gp_cpu = r["results"]["grpc_proxy"]["processes"]["proxy"]["cpu_s"].as_f64();
    for k in [
        "front_cpu_front_over_grpc_proxy",
        "front_cpu_per_delivery_front_over_grpc_proxy",
    ] {
        let v = r["ratios"].get(k);
        assert!(v.is_some(), "ratio {k} reported: {r:#}");
        assert!(
            v.is_some_and(|v| !v.is_null()) || gp_cpu == Some(0.0),
            "ratio {k} is a number when grpc-proxy used CPU: {r:#}"
        );
    }
    assert_eq!(r["goals"]["zero_lost_and_duplicated"], true, "{r:#}");
    assert_eq!(r["goals"]["every_watcher_established"], true, "{r:#}");
    for k in [
        "front_p99_no_worse_than_grpc_proxy",
        "front_cpu_below_grpc_proxy",
        "etcd_cpu_with_front_at_most_a_tenth",
    ] {
        assert!(r["goals"][k].is_boolean(), "goal {k} missing: {r:#}");
    }
}

#[test]
fn grpc_targets_apply_to_fanout_and_idle_only() {
    let err = bench_fails(&["list", "--target", "grpc"]);
    assert!(err.contains("apply to fanout"), "{err}");
    let err = bench_fails(&["idle", "--target", "grpc-proxy"]);
    assert!(err.contains("apply to fanout"), "{err}");
    let err = bench_fails(&["fanout", "--compare-grpc", "--compare"]);
    assert!(err.contains("--compare-grpc"), "{err}");
}

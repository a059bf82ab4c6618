//! `--compare-kube` end to end at a tiny scale: the bench starts its etcd,
//! a real kube-apiserver 1.37 (built by `scripts/peers.sh`, as `make test`
//! does before the tests) and watchcache on `config/kubernetes.toml`,
//! writes Pods through kube-apiserver and watches them on both.

mod common;

use serde_json::Value;

use common::bench;

/// Both sides of a fan-out run delivered every write to every watcher, in
/// order, once, and the report carries the `*_over_kube` keys.
fn assert_clean_fanout(r: &Value, watchers: u64, writes: u64) {
    assert_eq!(r["params"]["targets"], serde_json::json!(["proxy", "kube"]));
    assert!(
        r["kube_apiserver_version"]
            .as_str()
            .is_some_and(|v| v.starts_with("v1.37")),
        "{}",
        r["kube_apiserver_version"]
    );
    for side in ["proxy", "kube"] {
        let t = &r["results"][side];
        assert_eq!(t["watchers_established"], watchers, "{side}: {t:#}");
        assert_eq!(t["writes"], writes, "{side}: {t:#}");
        assert_eq!(t["write_errors"], 0, "{side}: {t:#}");
        assert_eq!(t["deliveries"], watchers * writes, "{side}: {t:#}");
        for k in ["lost", "duplicated", "unexpected", "out_of_order"] {
            assert_eq!(t[k], 0, "{side}: {k}: {t:#}");
        }
        // Every event carried the write's timestamp annotation.
        assert_eq!(t["latency_ms"]["count"], watchers * writes, "{side}");
        assert!(t["processes"]["proxy"]["cpu_s"].is_number(), "{side}");
    }
    assert_eq!(r["results"]["kube"]["front"], "kube-apiserver");
    assert_eq!(r["results"]["proxy"]["front"], "watchcache");
    for k in [
        "cpu_per_delivery_over_kube",
        "cpu_per_delivery_gross_over_kube",
        "p99_over_kube",
        "deliveries_per_s_over_kube",
    ] {
        assert!(
            r["ratios"].get(k).is_some(),
            "ratio {k} missing: {:#}",
            r["ratios"]
        );
    }
    // The gross ratio is always computable: both servers spent CPU.
    assert!(
        r["ratios"]["p99_over_kube"]
            .as_f64()
            .is_some_and(|v| v > 0.0)
    );
    assert!(
        r["ratios"]["cpu_per_delivery_gross_over_kube"]
            .as_f64()
            .is_some_and(|v| v > 0.0)
    );
    assert_eq!(r["goals"]["zero_lost_and_duplicated"], true);
}

#[test]
fn fanout_against_kube_apiserver_json_watches() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("k1.json");
    let r = bench(
        &["fanout", "--compare-kube", "-w", "3", "-r", "5", "-d", "2"],
        &json,
    );
    assert_clean_fanout(&r, 3, 10);
    assert_eq!(r["results"]["kube"]["media_type"], "application/json");
}

#[test]
fn fanout_against_kube_apiserver_protobuf_watches() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("k1p.json");
    let r = bench(
        &[
            "fanout",
            "--compare-kube",
            "--protobuf",
            "-w",
            "3",
            "-r",
            "5",
            "-d",
            "2",
        ],
        &json,
    );
    assert_clean_fanout(&r, 3, 10);
    assert_eq!(
        r["results"]["proxy"]["media_type"],
        "application/vnd.kubernetes.protobuf"
    );
}

//! A short real chaos run: the bench starts its own etcd and watchcache,
//! injects faults on a fixed seed, and its independent checker must find no
//! violation while having checked events, writes and faults. (That the checker
//! can fail is shown by its unit tests in src/chaos/checker.rs.)

mod common;

use serde_json::Value;

use common::bench_with_output;

#[test]
fn a_short_chaos_run_finds_no_violation() {
    let dir = tempfile::tempdir().unwrap();
    let (report, stdout): (Value, String) = bench_with_output(
        &["chaos", "--duration", "20s", "--seed", "7"],
        &dir.path().join("chaos.json"),
    );
    assert_eq!(report["scenario"], "chaos");
    let r = &report["results"];
    assert_eq!(r["violations"], 0, "{r:#}");
    assert_eq!(r["seed"], 7);
    let n = |k: &str| {
        r[k].as_u64()
            .unwrap_or_else(|| panic!("{k} missing: {r:#}"))
    };
    assert!(n("faults_injected") >= 2, "faults were injected: {r:#}");
    assert!(n("events_checked") > 100, "events were checked: {r:#}");
    assert!(n("lists_checked") > 0, "lists were checked: {r:#}");
    assert!(
        n("writes_acknowledged") > 50,
        "writes were acknowledged: {r:#}"
    );
    assert!(n("etcd_history_changes") >= n("writes_acknowledged"));
    // The printed totals match the JSON.
    assert!(
        stdout.contains(&format!("events checked        {}", n("events_checked"))),
        "{stdout}"
    );
}

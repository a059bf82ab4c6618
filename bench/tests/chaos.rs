//! A short real chaos run: the bench starts its own etcd and watchcache,
//! injects faults on a fixed seed, and its independent checker must find no
//! violation while having checked events, writes and faults. (That the checker
//! can fail is shown by its unit tests in src/chaos/checker.rs.)

use std::process::Command;

use serde_json::Value;

#[test]
fn a_short_chaos_run_finds_no_violation() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("chaos.json");
    let out = Command::new(env!("CARGO_BIN_EXE_watchcache-bench"))
        .args(["chaos", "--duration", "20s", "--seed", "7", "--json"])
        .arg(&json)
        .output()
        .expect("run watchcache-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "chaos failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON report written"))
            .expect("JSON report parses");
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

//! `chaos --front grpc` end to end at a tiny scale (the bench starts etcd and
//! the daemon with its gRPC front, etcd clients run through it while faults
//! are injected on a fixed seed; no violation, and ops, watch events and
//! faults were all checked), and its porcupine checker on crafted histories.
//! (That each watch validator can fail: src/chaos/grpc_checker.rs's tests.)

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use common::bench_with_output;

#[test]
fn a_short_grpc_chaos_run_finds_no_violation() {
    let dir = tempfile::tempdir().unwrap();
    let (report, stdout): (Value, String) = bench_with_output(
        &[
            "chaos",
            "--front",
            "grpc",
            "--duration",
            "15s",
            "--seed",
            "7",
            "-w",
            "6",
            "--keep-dir",
        ],
        &dir.path().join("chaos-grpc.json"),
    );
    let r = &report["results"];
    // --keep-dir: the daemon's config and log outlive the run.
    let kept = PathBuf::from(r["daemon_dir"].as_str().unwrap_or_else(|| panic!("{r:#}")));
    let config = std::fs::read_to_string(kept.join("watchcache.toml")).unwrap_or_default();
    let has_log = kept.join("watchcache.log").is_file();
    let _ = std::fs::remove_dir_all(&kept);
    assert!(config.contains("grpc_cache_prefixes"), "{config}");
    assert!(has_log, "no watchcache.log in {}", kept.display());
    assert_eq!(r["front"], "grpc", "{r:#}");
    assert_eq!(r["violations"], 0, "{r:#}");
    let n = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("missing in {r:#}"));
    assert!(n(&r["faults_injected"]) > 0, "{r:#}");
    assert!(n(&r["kv_ops_ok"]) > 0, "{r:#}");
    assert!(n(&r["linearizability"]["ops_checked"]) > 0, "{r:#}");
    assert_eq!(r["linearizability"]["result"], "Ok", "{r:#}");
    assert!(n(&r["events_checked"]) > 0, "{r:#}");
    assert!(n(&r["watches_checked"]) > 0, "{r:#}");
    assert!(n(&r["serializable_reads_checked"]) > 0, "{r:#}");
    // etcd's Go client ran through the front too, and its operations are in
    // porcupine's history.
    assert!(n(&r["clientv3"]["kv_ops"]) > 0, "{r:#}");
    assert!(n(&r["clientv3"]["watches"]) > 0, "{r:#}");
    assert!(
        n(&r["linearizability"]["ops_checked"]) > n(&r["clientv3"]["kv_ops"]),
        "{r:#}"
    );
    // Every fault's recovery was measured, and the daemon's memory sampled.
    assert!(
        r["recovery_by_kind"]
            .as_object()
            .is_some_and(|m| !m.is_empty()),
        "{r:#}"
    );
    assert!(n(&r["daemon_memory"]["peak_rss_kb"]) > 0, "{r:#}");
    assert!(
        stdout.contains(&format!("events checked        {}", r["events_checked"])),
        "{stdout}"
    );
}

/// The checker binary, built by scripts/clients.sh if missing.
fn porcupine() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/clients.sh");
    let out = Command::new("bash")
        .arg(script)
        .arg("porcupine")
        .output()
        .expect("run scripts/clients.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    PathBuf::from(text.split_whitespace().nth(1).expect("a path"))
}

fn verdict(ops: Value) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.json");
    std::fs::write(&path, json!({ "ops": ops }).to_string()).unwrap();
    let out = Command::new(porcupine()).arg(&path).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn op(client: u64, call: i64, ret: i64, input: Value, output: Value) -> Value {
    json!({"client": client, "call": call, "return": ret, "input": input, "output": output})
}

#[test]
fn porcupine_tells_linearizable_histories_from_others() {
    let put = |v: &str| json!({"op": "put", "key": "k", "value": v});
    let get = json!({"op": "get", "key": "k"});
    let read =
        |v: &str, m: i64, rev: i64| json!({"rev": rev, "exists": true, "value": v, "mod_rev": m});
    // put a@5, put b@6, then a read (after both returned) sees b.
    let good = vec![
        op(0, 1, 2, put("a"), json!({"rev": 5})),
        op(1, 3, 4, put("b"), json!({"rev": 6})),
        op(2, 5, 6, get.clone(), read("b", 6, 6)),
    ];
    assert_eq!(verdict(json!(good))["result"], "Ok");
    // A stale linearizable read: a after b returned.
    let mut stale = good.clone();
    stale[2] = op(2, 5, 6, get.clone(), read("a", 5, 6));
    let v = verdict(json!(stale));
    assert_eq!(v["result"], "Illegal", "{v}");
    assert_eq!(v["illegal"], json!(["k"]));
    // Revisions must grow: a write after another with a lower revision.
    let mut backwards = good.clone();
    backwards[1] = op(1, 3, 4, put("b"), json!({"rev": 4}));
    backwards[2] = op(2, 5, 6, get.clone(), read("b", 4, 6));
    assert_eq!(verdict(json!(backwards))["result"], "Illegal");
    // A write whose answer was lost may have happened (or not)...
    let lost = vec![
        op(0, 1, 2, put("a"), json!({"rev": 5})),
        op(1, 3, 0, put("b"), json!({"unknown": true})),
        op(2, 5, 6, get.clone(), read("b", 9, 9)),
        op(2, 7, 8, get.clone(), read("b", 9, 10)),
    ];
    assert_eq!(verdict(json!(lost))["result"], "Ok");
    // ...but a Txn that compared against the current mod_revision succeeds.
    let txn = |e: i64| json!({"op": "txn", "key": "k", "value": "c", "expect": e});
    let mut cas = good.clone();
    cas.push(op(3, 7, 8, txn(6), json!({"rev": 7, "succeeded": true})));
    assert_eq!(verdict(json!(cas))["result"], "Ok");
    cas.push(op(3, 9, 10, txn(6), json!({"rev": 8, "succeeded": true})));
    assert_eq!(verdict(json!(cas))["result"], "Illegal");
}

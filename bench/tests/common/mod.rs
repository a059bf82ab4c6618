//! Running the `watchcache-bench` binary from the tests.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Runs `watchcache-bench ARGS --no-progress --json JSON`, asserts it
/// succeeded, and returns the JSON report and the printed summary.
pub fn bench_with_output(args: &[&str], json: &Path) -> (Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_watchcache-bench"))
        .args(args)
        .arg("--no-progress")
        .arg("--json")
        .arg(json)
        .output()
        .expect("run watchcache-bench");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "watchcache-bench {args:?} failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let text = std::fs::read_to_string(json).expect("JSON report written");
    let report = serde_json::from_str(&text).expect("JSON report parses");
    (report, stdout)
}

/// [`bench_with_output`] without the summary.
#[allow(dead_code)] // each test crate uses what it needs
pub fn bench(args: &[&str], json: &Path) -> Value {
    bench_with_output(args, json).0
}

/// Runs `watchcache-bench ARGS --no-progress`, asserts it failed, and
/// returns its stderr.
#[allow(dead_code)] // each test crate uses what it needs
pub fn bench_fails(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_watchcache-bench"))
        .args(args)
        .arg("--no-progress")
        .output()
        .expect("run watchcache-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "watchcache-bench {args:?} succeeded but should have failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    stderr
}

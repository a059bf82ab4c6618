//! `--secure` and `--compare-secure` (issue 12): the bench runs its daemon
//! with TLS, a token file and RBAC, and its client speaks TLS with the bench
//! user's bearer token. Small real runs must be as clean as plain ones, and a
//! wrong token must fail the run (authentication is really on).

mod common;

use common::{bench, bench_fails, bench_with_output};

#[test]
fn fanout_plain_and_secure_in_one_run_are_clean() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("f1.json");
    let (r, stdout) = bench_with_output(
        &[
            "fanout",
            "--compare-secure",
            "-w",
            "20",
            "-r",
            "50",
            "-d",
            "1",
        ],
        &json,
    );
    assert_eq!(r["secure"], true, "{r:#}");
    assert_eq!(r["params"]["compare_secure"], true);
    for (key, secure) in [("proxy", false), ("proxy_secure", true)] {
        let t = &r["results"][key];
        assert_eq!(t["secure"], secure, "{key}: {t:#}");
        assert_eq!(t["watchers_established"], 20, "{key}: {t:#}");
        assert_eq!(t["writes"], 50, "{key}");
        assert_eq!(t["watchers_failed"], 0, "{key}: {t:#}");
        for k in ["lost", "duplicated", "unexpected", "out_of_order"] {
            assert_eq!(t[k], 0, "{key}: {k} on a clean run: {t:#}");
        }
        assert_eq!(t["deliveries"], 20 * 50, "{key}");
        assert!(
            t["per_delivery"]["holder_cpu_us_per_delivery"]
                .as_f64()
                .is_some(),
            "{key}: {t:#}"
        );
    }
    assert_eq!(r["results"]["proxy"]["transport"], "h2c");
    assert_eq!(
        r["results"]["proxy_secure"]["transport"],
        "h2 over TLS, bearer token, RBAC"
    );
    for k in [
        "holder_cpu_per_delivery_secure_over_plain",
        "p99_latency_secure_over_plain",
        "deliveries_per_s_secure_over_plain",
    ] {
        assert!(r["ratios"][k].as_f64().is_some(), "ratio {k}: {r:#}");
    }
    assert_eq!(r["goals"]["secure_zero_lost_and_duplicated"], true);
    assert!(stdout.contains("F1 fan-out (rows *_secure: TLS + bearer token + RBAC)"));
    assert!(stdout.contains("proxy_secure"), "{stdout}");
}

#[test]
fn secure_get_over_http1_is_clean() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("g1.json");
    let (r, stdout) = bench_with_output(
        &[
            "get", "--secure", "--http1", "-n", "200", "-s", "512", "-d", "1", "-k", "8",
        ],
        &json,
    );
    assert_eq!(r["secure"], true, "{r:#}");
    assert_eq!(r["params"]["secure"], true);
    for key in ["proxy", "proxy_consistent"] {
        let t = &r["results"][key];
        assert_eq!(t["secure"], true, "{key}: {t:#}");
        assert_eq!(t["transport"], "http/1.1 over TLS, bearer token, RBAC");
        assert_eq!(t["errors"], 0, "{key}: {t:#}");
        assert!(t["gets"].as_u64().unwrap() > 0, "{key}: {t:#}");
    }
    assert!(stdout.contains("G1 get (proxy over TLS + bearer token + RBAC)"));
}

#[test]
fn secure_get_compared_with_plain_reports_ratios() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("g1.json");
    let r = bench(
        &[
            "get",
            "--compare-secure",
            "-n",
            "200",
            "-s",
            "512",
            "-d",
            "1",
            "-k",
            "8",
        ],
        &json,
    );
    for key in [
        "proxy",
        "proxy_consistent",
        "proxy_secure",
        "proxy_consistent_secure",
    ] {
        let t = &r["results"][key];
        assert_eq!(t["secure"], key.ends_with("_secure"), "{key}: {t:#}");
        assert_eq!(t["errors"], 0, "{key}: {t:#}");
        assert!(t["gets"].as_u64().unwrap() > 0, "{key}: {t:#}");
    }
    for k in [
        "gets_per_s_secure_over_plain",
        "p99_latency_secure_over_plain",
        "consistent_gets_per_s_secure_over_plain",
    ] {
        assert!(r["ratios"][k].as_f64().is_some(), "ratio {k}: {r:#}");
    }
}

#[test]
fn a_wrong_token_fails_the_run() {
    let stderr = bench_fails(&[
        "get",
        "--secure",
        "--bearer-token",
        "not-the-bench-token",
        "-n",
        "10",
        "-d",
        "1",
    ]);
    assert!(
        stderr.contains("refused the bench user") && stderr.contains("401"),
        "{stderr}"
    );
    assert!(stderr.contains("Unauthorized"), "{stderr}");
}

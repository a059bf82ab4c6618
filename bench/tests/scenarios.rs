//! Small real runs of every scenario of `watchcache-bench` (the bench starts
//! its own etcd and watchcache), checking that the JSON report carries every
//! figure. The pure checker is unit tested in src/check.rs.

mod common;

use serde_json::Value;

use common::{bench, bench_fails, bench_with_output};

/// Asserts that `v` has every dotted path in `paths` (null allowed only if `allow_null`).
fn has_fields(v: &Value, paths: &[&str], allow_null: bool, what: &str) {
    for p in paths {
        let mut cur = v;
        for k in p.split('.') {
            cur = cur
                .get(k)
                .unwrap_or_else(|| panic!("{what}: missing field {p} in {v:#}"));
        }
        assert!(allow_null || !cur.is_null(), "{what}: field {p} is null");
    }
}

const TOP: &[&str] = &[
    "tool",
    "version",
    "scenario",
    "command",
    "started_at",
    "finished_at",
    "machine.nproc",
    "machine.mem_total_kb",
    "machine.kernel",
    "etcd_version",
    "params.targets",
    "results",
    "ratios",
    "goals",
];

const FANOUT: &[&str] = &[
    "target",
    "watchers",
    "watchers_established",
    "watchers_failed",
    "connections",
    "transport",
    "rate_per_s",
    "duration_s",
    "object_size",
    "writes",
    "write_errors",
    "write_phase_s",
    "drain_s",
    "drained",
    "deliveries",
    "expected_deliveries",
    "deliveries_per_s",
    "latency_ms.p50_ms",
    "latency_ms.p90_ms",
    "latency_ms.p99_ms",
    "latency_ms.max_ms",
    "lost",
    "duplicated",
    "unexpected",
    "out_of_order",
    "watchers_with_loss",
    "watchers_with_duplicates",
    "etcd_watchers",
    "processes.etcd.cpu_s",
    "processes.etcd.peak_rss_kb",
    "processes.proxy.cpu_s",
    "processes.proxy.peak_rss_kb",
    "processes.bench.cpu_s",
    "per_delivery.holder",
    "per_delivery.holder_cpu_us_per_delivery",
    "per_delivery.etcd_cpu_us_per_delivery",
    "per_delivery.holder_rss_per_watcher_bytes",
    "per_delivery.holder_rss_before_watchers_kb",
    "per_delivery.holder_rss_per_busy_watcher_bytes",
    "latency_distribution",
];

#[test]
fn fanout_small_run_on_both_targets_is_clean() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("f1.json");
    let svg = dir.path().join("f1.svg");
    let r = bench(
        &[
            "fanout",
            "--compare",
            "-w",
            "20",
            "-r",
            "50",
            "-d",
            "1",
            "--plot",
            svg.to_str().unwrap(),
        ],
        &json,
    );
    has_fields(&r, TOP, false, "report");
    assert_eq!(r["scenario"], "fanout");
    // The third column: the same etcd watchers through `etcd grpc-proxy`
    // (the project's etcd has it).
    for target in ["proxy", "etcd", "grpc_proxy"] {
        let t = &r["results"][target];
        has_fields(t, FANOUT, false, target);
        assert_eq!(t["watchers_established"], 20, "{target}: {t:#}");
        assert_eq!(t["writes"], 50, "{target}");
        assert_eq!(t["write_errors"], 0, "{target}");
        for k in ["lost", "duplicated", "unexpected", "out_of_order"] {
            assert_eq!(t[k], 0, "{target}: {k} on a clean run: {t:#}");
        }
        assert_eq!(t["deliveries"], 20 * 50, "{target}");
        assert_eq!(
            t["latency_ms"]["count"],
            20 * 50,
            "{target}: one latency per delivery"
        );
        assert!(t["latency_ms"]["p50_ms"].as_f64().unwrap() > 0.0);
        assert!(!t["latency_distribution"].as_array().unwrap().is_empty());
    }
    // etcd holds the watchers only when they are on etcd.
    assert!(r["results"]["etcd"]["etcd_watchers"].as_f64().unwrap() >= 20.0);
    assert!(r["results"]["proxy"]["etcd_watchers"].as_f64().unwrap() < 20.0);
    assert!(
        r["results"]["grpc_proxy"]["etcd_watchers"]
            .as_f64()
            .unwrap()
            < 20.0
    );
    assert_eq!(
        r["results"]["grpc_proxy"]["per_delivery"]["holder"], "proxy",
        "the grpc-proxy process holds that column's watchers"
    );
    has_fields(
        &r,
        &[
            "ratios.holder_cpu_per_delivery_proxy_over_grpc_proxy",
            "ratios.p99_latency_proxy_over_grpc_proxy",
            "ratios.deliveries_per_s_proxy_over_grpc_proxy",
            "ratios.busy_rss_per_watcher_proxy_over_grpc_proxy",
            "ratios.etcd_cpu_proxy_target_over_grpc_proxy_target",
        ],
        true,
        "grpc-proxy ratios",
    );
    has_fields(
        &r,
        &[
            "ratios.p99_latency_proxy_over_etcd",
            "ratios.deliveries_per_s_proxy_over_etcd",
            "ratios.etcd_cpu_proxy_target_over_etcd_target",
            "goals.zero_lost_and_duplicated",
            "goals.proxy_p99_no_worse_than_etcd",
            "goals.etcd_cpu_at_most_a_tenth",
            "ratios.holder_cpu_per_delivery_proxy_over_etcd",
            "goals.holder_cpu_per_delivery_at_most_half_of_etcd",
        ],
        true,
        "fanout ratios",
    );
    // The per-delivery figures are the process CPU over the deliveries.
    for target in ["proxy", "etcd"] {
        let t = &r["results"][target];
        let holder = t["per_delivery"]["holder"].as_str().unwrap();
        assert_eq!(holder, target);
        let cpu = t["processes"][holder]["cpu_s"].as_f64().unwrap();
        let us = t["per_delivery"]["holder_cpu_us_per_delivery"]
            .as_f64()
            .unwrap();
        let want = cpu * 1e6 / (20.0 * 50.0);
        assert!(
            (us - want).abs() <= 0.001 + want * 1e-6,
            "{target}: {us} vs {want}"
        );
        // RSS per busy watcher: the load's peak over the RSS before any
        // watcher, per watcher.
        let peak = t["processes"][holder]["peak_rss_kb"].as_f64().unwrap();
        let before = t["per_delivery"]["holder_rss_before_watchers_kb"]
            .as_f64()
            .unwrap();
        let busy = t["per_delivery"]["holder_rss_per_busy_watcher_bytes"]
            .as_f64()
            .unwrap();
        assert!(before > 0.0, "{target}: {t:#}");
        assert_eq!(busy, ((peak - before).max(0.0) * 1024.0 / 20.0).round());
    }
    assert_eq!(r["goals"]["zero_lost_and_duplicated"], true);
    // The memory goal is judged at 10,000 watchers only.
    assert!(
        r["goals"]
            .get("rss_per_busy_watcher_at_most_4kb_at_10000")
            .is_none()
    );
    let plot = std::fs::read_to_string(&svg).expect("plot written");
    assert!(plot.starts_with("<svg") && plot.contains("proxy") && plot.contains("etcd"));
    assert!(plot.contains("grpc_proxy"), "three distributions drawn");
}

#[test]
fn fanout_over_http1_on_the_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("f1.json");
    let r = bench(
        &[
            "fanout", "--target", "proxy", "--http1", "-w", "10", "-r", "40", "-d", "1",
        ],
        &json,
    );
    let t = &r["results"]["proxy"];
    has_fields(t, FANOUT, false, "proxy http1");
    assert_eq!(t["transport"], "http/1.1");
    assert_eq!(t["connections"], 10);
    assert_eq!(t["deliveries"], 10 * 40);
    assert_eq!(
        (t["lost"].as_u64(), t["duplicated"].as_u64()),
        (Some(0), Some(0))
    );
}

#[test]
fn fanout_with_one_etcd_watch_stream_per_watcher() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("f1.json");
    let r = bench(
        &[
            "fanout",
            "--target",
            "etcd",
            "--etcd-watch-mode",
            "stream",
            "-w",
            "10",
            "-r",
            "40",
            "-d",
            "1",
        ],
        &json,
    );
    assert_eq!(r["params"]["etcd_watch_mode"], "stream");
    let t = &r["results"]["etcd"];
    let mut fields: Vec<&str> = FANOUT.to_vec();
    fields.retain(|f| !f.starts_with("processes.proxy"));
    has_fields(t, &fields, false, "etcd stream mode");
    assert_eq!(t["deliveries"], 10 * 40);
    assert_eq!(
        (t["lost"].as_u64(), t["duplicated"].as_u64()),
        (Some(0), Some(0))
    );
    assert!(t["etcd_watch_streams"].as_f64().unwrap() >= 10.0, "{t:#}");
}

#[test]
fn list_get_startup_idle_report_every_figure() {
    let dir = tempfile::tempdir().unwrap();
    let common = ["--compare", "-n", "600", "-s", "512", "--iterations", "2"];

    let mut args = vec!["list"];
    args.extend(common);
    let r = bench(&args, &dir.path().join("l1.json"));
    has_fields(&r, TOP, false, "list");
    for t in ["proxy", "proxy_consistent", "etcd"] {
        let v = &r["results"][t];
        has_fields(
            v,
            &[
                "items",
                "full_list_bytes",
                "full_list_ms.p50_ms",
                "paged_list_ms.p50_ms",
                "pages",
                "page_size",
            ],
            false,
            t,
        );
        assert_eq!(v["items"], 600, "{t}: {v:#}");
        assert_eq!(v["pages"], 2, "{t}: 600 objects in pages of 500");
        // Without --gzip, what crossed the wire is the body itself.
        assert_eq!(
            v["full_list_wire_bytes"], v["full_list_bytes"],
            "{t}: {v:#}"
        );
    }
    // The loopback floor moved the proxy's own List bytes, once per iteration.
    let floor = &r["results"]["loopback"];
    has_fields(
        floor,
        &["full_list_bytes", "full_list_ms.p50_ms"],
        false,
        "loopback",
    );
    assert_eq!(
        floor["full_list_bytes"], r["results"]["proxy"]["full_list_bytes"],
        "{floor:#}"
    );
    assert_eq!(floor["full_list_ms"]["count"], 2, "{floor:#}");
    has_fields(
        &r,
        &[
            "ratios.full_list_p50_speedup_proxy_vs_etcd",
            "ratios.full_list_p50_proxy_over_loopback_floor",
            "ratios.full_list_p50_speedup_loopback_floor_vs_etcd",
            "goals.full_list_at_least_10x_faster",
        ],
        false,
        "list ratios",
    );

    let mut args = vec!["get", "-d", "1", "-k", "8"];
    args.extend(common);
    let r = bench(&args, &dir.path().join("g1.json"));
    for t in ["proxy", "proxy_consistent", "etcd"] {
        let v = &r["results"][t];
        has_fields(
            v,
            &[
                "gets",
                "errors",
                "gets_per_s",
                "latency_ms.p50_ms",
                "latency_ms.p99_ms",
                "concurrency",
                "server_cpu_us_per_get",
                "client_cpu_us_per_get",
            ],
            false,
            t,
        );
        assert_eq!(v["errors"], 0, "{t}: {v:#}");
        assert!(v["gets"].as_u64().unwrap() > 0, "{t}");
        // The bench's client did the Gets: it used CPU for them.
        assert!(
            v["client_cpu_us_per_get"].as_f64().unwrap() > 0.0,
            "{t}: {v:#}"
        );
    }
    has_fields(
        &r,
        &[
            "ratios.throughput_proxy_over_etcd",
            "ratios.server_cpu_per_get_etcd_over_proxy",
            "ratios.server_and_client_cpu_per_get_etcd_over_proxy",
            "goals.throughput_at_least_5x",
        ],
        false,
        "get ratios",
    );

    // In turns: each target's rounds add up to one result.
    let mut args = vec!["get", "-d", "1", "-k", "8", "--rounds", "2"];
    args.extend(common);
    let r = bench(&args, &dir.path().join("g1-rounds.json"));
    assert_eq!(r["params"]["rounds"], 2, "{:#}", r["params"]);
    for t in ["proxy", "proxy_consistent", "etcd"] {
        let v = &r["results"][t];
        has_fields(
            v,
            &[
                "gets_per_s",
                "server_cpu_us_per_get",
                "processes.bench.cpu_s",
            ],
            false,
            t,
        );
        assert_eq!(v["rounds"], 2, "{t}: {v:#}");
        assert_eq!(v["errors"], 0, "{t}: {v:#}");
        let gets = v["gets"].as_u64().unwrap();
        assert!(gets > 0, "{t}");
        // One latency per Get, over both rounds.
        assert_eq!(v["latency_ms"]["count"].as_u64(), Some(gets), "{t}: {v:#}");
        // Two rounds of about half a second each.
        let secs = v["duration_s"].as_f64().unwrap();
        assert!((0.9..3.0).contains(&secs), "{t}: {secs} s");
        let rate = v["gets_per_s"].as_f64().unwrap();
        assert!(
            (rate - gets as f64 / secs).abs() <= 0.01 * rate,
            "{t}: {v:#}"
        );
    }
    has_fields(
        &r,
        &["ratios.throughput_proxy_over_etcd"],
        false,
        "rounds ratios",
    );
    let err = bench_fails(&["list", "--rounds", "2"]);
    assert!(err.contains("--rounds applies to get"), "{err}");

    let mut args = vec!["startup", "--settle", "0.2"];
    args.extend(common);
    let r = bench(&args, &dir.path().join("s1.json"));
    has_fields(
        &r["results"]["proxy"],
        &[
            "ready_s",
            "ready_s_median",
            "rss_kb",
            "empty_rss_kb",
            "rss_per_object_bytes",
        ],
        false,
        "startup proxy",
    );
    has_fields(
        &r["results"]["etcd"],
        &["ready_s", "ready_s_median", "rss_kb"],
        false,
        "startup etcd",
    );
    assert_eq!(
        r["results"]["proxy"]["ready_s"].as_array().unwrap().len(),
        2
    );
    has_fields(
        &r,
        &["ratios.ready_s_proxy_over_etcd"],
        false,
        "startup ratios",
    );

    let r = bench(
        &["idle", "--compare", "-w", "50", "--settle", "0.2"],
        &dir.path().join("m1.json"),
    );
    for t in ["proxy", "etcd"] {
        let v = &r["results"][t];
        has_fields(
            v,
            &[
                "watchers_established",
                "rss_per_watcher_bytes",
                "holder.rss_before_kb",
                "holder.rss_after_kb",
            ],
            false,
            t,
        );
        assert_eq!(v["watchers_established"], 50, "{t}: {v:#}");
    }
    has_fields(
        &r,
        &[
            "ratios.rss_per_watcher_proxy_over_etcd",
            "goals.under_10kb_per_idle_watcher",
            "goals.at_most_2kb_per_idle_watcher",
        ],
        false,
        "idle ratios",
    );

    // The whole comparison twice: every run's report, and the summary of
    // their ratios and goals, computed from those reports.
    let (r, printed) = bench_with_output(
        &[
            "idle",
            "--compare",
            "-w",
            "50",
            "--settle",
            "0.2",
            "--repeat",
            "2",
        ],
        &dir.path().join("m1-repeat.json"),
    );
    assert_eq!(r["repeat"], 2, "{r:#}");
    assert_eq!(r["scenario"], "idle", "{r:#}");
    assert_eq!(r["completed_runs"], 2, "{r:#}");
    assert!(r["error"].is_null(), "{r:#}");
    assert!(printed.contains("ratios over 2 runs"), "{printed}");
    assert!(printed.contains("goals over 2 runs"), "{printed}");
    let runs = r["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2);
    for run in runs {
        has_fields(run, TOP, false, "a repeated run");
        assert_eq!(run["results"]["proxy"]["watchers_established"], 50);
    }
    // Each run's own ratio, in run order (null where a run has none: etcd's
    // RSS may not grow for a few watchers), and the spread of the numbers.
    let key = "rss_per_watcher_proxy_over_etcd";
    let each: Vec<Value> = runs.iter().map(|run| run["ratios"][key].clone()).collect();
    let mut nums: Vec<f64> = each.iter().filter_map(Value::as_f64).collect();
    nums.sort_by(f64::total_cmp);
    let s = &r["summary"]["ratios"][key];
    if nums.is_empty() {
        assert!(s.is_null(), "{s:#}");
    } else {
        assert_eq!(s["values"], serde_json::json!(each), "{s:#}");
        assert_eq!(s["count"], nums.len(), "{s:#}");
        assert_eq!(s["min"].as_f64(), nums.first().copied(), "{s:#}");
        assert_eq!(s["max"].as_f64(), nums.last().copied(), "{s:#}");
        // A new number, so compared within an ulp or two: the JSON text of
        // a float need not parse back to the same bits.
        let want = (nums[0] + nums[nums.len() - 1]) / 2.0;
        let median = s["median"].as_f64().expect("median");
        assert!(
            (median - want).abs() <= 1e-12 * want.abs().max(1.0),
            "{s:#}"
        );
    }
    let goal = "under_10kb_per_idle_watcher";
    let met = runs
        .iter()
        .filter(|run| run["goals"][goal] == serde_json::json!(true))
        .count();
    let g = &r["summary"]["goals"][goal];
    assert_eq!(g["met"], met, "{g:#}");
    assert_eq!(g["runs"], 2, "{g:#}");
    assert_eq!(g["every_run"], met == 2, "{g:#}");
    // A run that fails ends the set with an error, and the report still
    // says how many runs finished and why the next did not.
    let failed = dir.path().join("repeat-failed.json");
    let err = bench_fails(&[
        "idle",
        "--compare",
        "-w",
        "5",
        "--repeat",
        "2",
        "--watchcache-bin",
        "/nonexistent/watchcache",
        "--json",
        failed.to_str().expect("utf-8 path"),
    ]);
    assert!(err.contains("run 1 of 2"), "{err}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&failed).expect("report"))
        .expect("JSON report");
    assert_eq!(r["completed_runs"], 0, "{r:#}");
    assert_eq!(r["runs"], serde_json::json!([]), "{r:#}");
    assert!(
        r["error"]
            .as_str()
            .is_some_and(|e| e.contains("nonexistent")),
        "{r:#}"
    );
    let err = bench_fails(&["chaos", "--repeat", "2"]);
    assert!(err.contains("--repeat applies to"), "{err}");
    let err = bench_fails(&["get", "--repeat", "2", "--plot", "g1.svg"]);
    assert!(err.contains("--plot draws one run"), "{err}");
}

/// `idle --cycles`: the watchers are opened and closed on new connections
/// each cycle (over HTTP/1.1, and as etcd watches on the daemon's gRPC
/// front), and the holder's RSS is reported and printed after each opening
/// and each closing.
#[test]
fn idle_cycles_report_the_holders_rss_after_each_opening_and_closing() {
    let dir = tempfile::tempdir().expect("tempdir");
    for target in ["proxy", "grpc"] {
        let mut args = vec![
            "idle", "--target", target, "-w", "20", "--cycles", "3", "--settle", "0.2",
        ];
        if target == "proxy" {
            args.push("--http1");
        }
        let (r, printed) =
            bench_with_output(&args, &dir.path().join(format!("m1-cycles-{target}.json")));
        let v = &r["results"][target];
        assert_eq!(v["watchers_established"], 20, "{target}: {v:#}");
        let cycles = v["cycles"].as_array().expect("cycles");
        assert_eq!(cycles.len(), 3, "{target}: {v:#}");
        for (i, c) in cycles.iter().enumerate() {
            assert_eq!(c["cycle"], i + 1, "{c:#}");
            assert_eq!(c["watchers_established"], 20, "{target}: {c:#}");
            assert!(c["first_error"].is_null(), "{target}: {c:#}");
            for k in ["rss_open_kb", "rss_closed_kb"] {
                assert!(
                    c[k].as_u64().is_some_and(|kb| kb > 0),
                    "{target} {k}: {c:#}"
                );
            }
        }
        assert!(printed.contains("holder RSS per cycle"), "{printed}");
    }
    let err = bench_fails(&["fanout", "--cycles", "2"]);
    assert!(err.contains("--cycles applies to idle"), "{err}");
}

/// A short `list` of the proxy alone (600 objects of 512 bytes, 2
/// iterations) with `extra` options.
fn small_list<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "list",
        "--target",
        "proxy",
        "-n",
        "600",
        "-s",
        "512",
        "--iterations",
        "2",
    ];
    args.extend_from_slice(extra);
    args
}

#[test]
fn protobuf_list_counts_every_item() {
    let dir = tempfile::tempdir().unwrap();
    let r = bench(&small_list(&["--protobuf"]), &dir.path().join("l1-pb.json"));
    for t in ["proxy", "proxy_consistent"] {
        let v = &r["results"][t];
        assert_eq!(
            v["media_type"], "application/vnd.kubernetes.protobuf",
            "{t}: {v:#}"
        );
        // Counted by decoding the protobuf List: every object was served.
        assert_eq!(v["items"], 600, "{t}: {v:#}");
        assert!(
            v["full_list_bytes"].as_u64().unwrap() > 600 * 400,
            "{t}: {v:#}"
        );
        assert_eq!(v["pages"], 0, "{t}: protobuf runs time no paged Lists");
    }
    // --protobuf is refused where it does not apply.
    let err = bench_fails(&["fanout", "--protobuf"]);
    assert!(err.contains("--protobuf applies to list"), "{err}");
}

/// `--gzip`: the proxy's Lists (over 128 KiB) come gzipped, and the bench
/// unpacks every one: all items counted, fewer bytes on the wire than in
/// the body, in JSON and in protobuf.
#[test]
fn gzip_lists_are_unpacked_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    for media in [&["--gzip"][..], &["--gzip", "--protobuf"][..]] {
        let r = bench(&small_list(media), &dir.path().join("l1-gzip.json"));
        assert_eq!(r["params"]["gzip"], true, "{r:#}");
        for t in ["proxy", "proxy_consistent"] {
            let v = &r["results"][t];
            assert_eq!(v["gzip"], true, "{t}: {v:#}");
            assert_eq!(v["items"], 600, "{t}: {v:#}");
            let body = v["full_list_bytes"].as_u64().unwrap();
            let wire = v["full_list_wire_bytes"].as_u64().unwrap();
            assert!(body > 600 * 400, "{t}: {v:#}");
            assert!(wire > 0 && wire * 2 < body, "{t}: {v:#}");
        }
    }
    let err = bench_fails(&["fanout", "--gzip"]);
    assert!(err.contains("--gzip applies to list"), "{err}");
}

/// Objects stored as kube-apiserver stores them (protobuf), listed in
/// protobuf and in JSON: every item comes back either way.
#[test]
fn protobuf_stored_objects_are_listed_in_both_media_types() {
    let dir = tempfile::tempdir().unwrap();
    for (accept, media_type) in [
        (&["--protobuf"][..], "application/vnd.kubernetes.protobuf"),
        (&[][..], "application/json"),
    ] {
        let mut args = vec![
            "list",
            "--target",
            "proxy",
            "--storage-media-type",
            "application/vnd.kubernetes.protobuf",
            "-n",
            "300",
            "-s",
            "512",
            "--iterations",
            "2",
        ];
        args.extend_from_slice(accept);
        let r = bench(&args, &dir.path().join("l1-stored-pb.json"));
        assert_eq!(
            r["params"]["storage_media_type"], "application/vnd.kubernetes.protobuf",
            "{r:#}"
        );
        let v = &r["results"]["proxy"];
        assert_eq!(v["media_type"], media_type, "{v:#}");
        assert_eq!(v["items"], 300, "{v:#}");
        assert!(v["first_list_ms"].as_f64().unwrap() > 0.0, "{v:#}");
    }
    let err = bench_fails(&[
        "fanout",
        "--storage-media-type",
        "application/vnd.kubernetes.protobuf",
    ]);
    assert!(
        err.contains("--storage-media-type applies to list, get, startup and memory"),
        "{err}"
    );
}

#[test]
fn codec_times_both_object_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let r = bench(
        &["codec", "-n", "30", "-s", "512"],
        &dir.path().join("codec.json"),
    );
    for shape in ["bench_pod", "realistic_pod"] {
        let v = &r["results"][shape];
        assert_eq!(v["objects"], 30, "{shape}: {v:#}");
        for f in ["encode_us_per_object", "decode_us_per_object"] {
            assert!(v[f].as_f64().unwrap() > 0.0, "{shape}.{f}: {v:#}");
        }
        assert!(
            v["stored_message_us_per_object"].as_f64().is_some(),
            "{shape}: {v:#}"
        );
        let (json_b, pb_b) = (
            v["json_bytes"].as_u64().unwrap(),
            v["protobuf_bytes"].as_u64().unwrap(),
        );
        assert!(
            pb_b > 100 && pb_b < json_b,
            "{shape}: protobuf is the smaller form: {v:#}"
        );
    }
    assert!(
        r["results"]["realistic_pod"]["json_bytes"]
            .as_u64()
            .unwrap()
            > 3000
    );
}

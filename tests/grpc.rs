//! The etcd v3 gRPC front (`--grpc-listen`) with real etcd clients:
//! `etcdctl` against the front vs. against etcd directly (equal outputs),
//! and the `etcd-client` crate (many watches per stream, watch ids,
//! progress ordering, compaction, slow clients).

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, EventType, Txn, TxnOp, WatchOptions, WatchResponse};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use common::front::TestFront;

const WAIT: Duration = Duration::from_secs(20);

fn etcdctl_bin() -> std::path::PathBuf {
    watchcache::etcd_server::find_etcdctl_binary().expect("etcdctl (tools/etcd/usr/bin)")
}

/// Runs etcdctl against `endpoint`; returns (success, stdout, stderr).
async fn etcdctl(endpoint: &str, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    // No ETCDCTL_API: v3 is the default since etcdctl 3.4, and 3.7 warns
    // about the variable on stderr.
    let mut cmd = tokio::process::Command::new(etcdctl_bin());
    cmd.env_remove("ETCDCTL_API")
        .arg(format!("--endpoints={endpoint}"))
        .arg("--command-timeout=10s")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("spawn etcdctl");
    let mut input = child.stdin.take().expect("stdin");
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).await.expect("write stdin");
    }
    drop(input);
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("etcdctl finished")
        .expect("etcdctl output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn put(c: &mut Client, key: &str, value: impl Into<Vec<u8>>) -> i64 {
    common::etcd_put(c, key, value).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_reads_through_the_front_equal_etcd() {
    // A private etcd: nothing else writes, so even headers (revision,
    // raft term, ids) must be equal.
    let etcd = common::PrivateEtcd::start().await.expect("private etcd");
    let ep = etcd.endpoint();
    let prefix = common::unique_prefix("ctl");
    let p = format!("{prefix}/pods/");
    let mut c = Client::connect([ep.as_str()], None).await.expect("etcd");
    put(&mut c, &format!("{p}ns/a"), "1").await;
    put(&mut c, &format!("{p}ns/b"), "two").await;
    let mid = put(&mut c, &format!("{p}ns/a"), "1-again").await;
    put(&mut c, &format!("{p}ns/c"), r#"{"kind":"Pod"}"#).await;
    put(&mut c, &format!("{prefix}/elsewhere"), "x").await;
    let del = c
        .delete(format!("{p}ns/b"), None)
        .await
        .expect("delete")
        .header()
        .map(|h| h.revision())
        .unwrap_or(0);
    put(&mut c, &format!("{p}ns/d"), vec![0xffu8, 0, 1]).await; // not UTF-8, not JSON

    let front = TestFront::start(&ep, &prefix, |_| {}).await;
    let last = put(&mut c, &format!("{p}ns/e"), "after-start").await;
    front.wait_rev(last).await;
    let fe = front.endpoint();
    let mid = mid.to_string();
    let del = del.to_string();
    let key_a = format!("{p}ns/a");
    let from_c = format!("{p}ns/c");
    let else_prefix = format!("{prefix}/else");
    let cases: Vec<Vec<&str>> = vec![
        vec!["get", "--prefix", &p],
        vec!["get", "--prefix", &p, "--limit", "2"],
        vec![
            "get",
            "--prefix",
            &p,
            "--sort-by",
            "MODIFY",
            "--order",
            "DESCEND",
        ],
        vec!["get", "--prefix", &p, "--sort-by", "CREATE"],
        vec![
            "get",
            "--prefix",
            &p,
            "--sort-by",
            "VERSION",
            "--order",
            "DESCEND",
        ],
        vec!["get", "--prefix", &p, "--keys-only"],
        vec!["get", "--prefix", &p, "--count-only"],
        vec!["get", "--prefix", &p, "--rev", &mid],
        vec!["get", "--prefix", &p, "--rev", &del],
        vec!["get", "--prefix", &p, "--consistency", "s"],
        vec!["get", "--prefix", &p, "--limit", "1", "--sort-by", "VALUE"],
        vec!["get", &key_a],
        vec!["get", &key_a, "--rev", &mid],
        vec!["get", &from_c, "--from-key"],
        vec!["get", "--prefix", &else_prefix],
    ];
    for case in &cases {
        let formats: &[&str] = if case.contains(&"--count-only") {
            &["fields"]
        } else {
            &["simple", "json", "fields"]
        };
        for format in formats {
            let mut args = case.clone();
            args.extend(["-w", *format]);
            let direct = etcdctl(&ep, &args, None).await;
            let via = etcdctl(&fe, &args, None).await;
            assert!(direct.0, "etcdctl {args:?} against etcd: {}", direct.2);
            assert_eq!(via, direct, "etcdctl {args:?}: front vs etcd");
        }
    }
    // The reads inside the prefixes were served by the cache (the from-key
    // and `elsewhere` ones were forwarded).
    let text = watchcache::metrics::gather();
    assert!(
        text.lines()
            .any(|l| l
                .starts_with("watchcache_grpc_requests_total{method=\"range\",source=\"cache\"}")),
        "cache-served ranges counted"
    );

    // endpoint status: passthrough. The endpoint column differs by nature;
    // the raft indexes (and with them the database's size) move with any
    // raft request between the two calls, such as the front's own
    // auth-status poll, so they are checked to be there, not compared.
    let status = |out: &str| -> serde_json::Value {
        let mut v: serde_json::Value = serde_json::from_str(out).expect("status JSON");
        for s in v.as_array_mut().expect("array") {
            let s = s.as_object_mut().expect("object");
            s.remove("Endpoint");
            let st = s
                .get_mut("Status")
                .and_then(|st| st.as_object_mut())
                .expect("Status");
            for moving in ["raftIndex", "raftAppliedIndex", "dbSize", "dbSizeInUse"] {
                assert!(st.remove(moving).is_some(), "{moving} in {out}");
            }
        }
        v
    };
    let direct = etcdctl(&ep, &["endpoint", "status", "-w", "json"], None).await;
    let via = etcdctl(&fe, &["endpoint", "status", "-w", "json"], None).await;
    assert!(via.0, "endpoint status via the front: {}", via.2);
    assert_eq!(status(&via.1), status(&direct.1));
    let via = etcdctl(&fe, &["member", "list"], None).await;
    assert_eq!(via, etcdctl(&ep, &["member", "list"], None).await);
}

/// The front's connections have the REST API's limits (tonic sets none): a
/// connection that sends nothing is closed after `header_read_timeout_ms`,
/// connections beyond `max_connections` are closed at once, and a request
/// larger than `grpc_max_request_bytes` (etcd's own limit) is refused
/// before its buffer is taken, while one within it passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fronts_connections_are_bounded() {
    use tokio::io::AsyncReadExt;
    let ep = common::etcd().to_string();
    let prefix = common::unique_prefix("grpclimits");
    let f = TestFront::start(&ep, &prefix, |c| {
        c.server.header_read_timeout_ms = 1_500;
        c.server.max_connections = 3;
        c.grpc_max_request_bytes = 64 << 10;
    })
    .await;
    // Silent: closed by the server (EOF), not left open.
    let mut silent = tokio::net::TcpStream::connect(f.addr)
        .await
        .expect("connect");
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(20), silent.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "closed: {read:?}");

    // Two held open (a first byte of the preface, then nothing) and the
    // client's make the limit of 3.
    let mut held = Vec::new();
    for _ in 0..2 {
        use tokio::io::AsyncWriteExt;
        let mut h = tokio::net::TcpStream::connect(f.addr)
            .await
            .expect("connect");
        h.write_all(b"P").await.expect("a first byte");
        held.push(h);
    }
    let mut c = f.client().await;
    let key = format!("{prefix}/big");
    let err = c
        .put(key.as_str(), vec![b'x'; 100 << 10], None)
        .await
        .expect_err("over grpc_max_request_bytes");
    match err {
        etcd_client::Error::GRpcStatus(s) => {
            assert_eq!(s.code(), tonic::Code::OutOfRange, "{s:?}")
        }
        other => panic!("a gRPC status, got {other:?}"),
    }
    c.put(key.as_str(), vec![b'x'; 10 << 10], None)
        .await
        .expect("within the limit");
    // A fourth connection is refused at once while three are open (one
    // let in would be kept for the 1.5 s first-bytes wait).
    let mut extra = tokio::net::TcpStream::connect(f.addr)
        .await
        .expect("connect");
    let read = tokio::time::timeout(Duration::from_secs(1), extra.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "refused: {read:?}");
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_writes_and_leases_pass_through() {
    let ep = common::etcd().to_string();
    let prefix = common::unique_prefix("ctlw");
    let p = format!("{prefix}/pods/");
    let front = TestFront::start(&ep, &prefix, |_| {}).await;
    let fe = front.endpoint();
    let mut c = Client::connect([ep.as_str()], None).await.expect("etcd");
    let key = format!("{p}ns/x");

    let out = etcdctl(&fe, &["put", &key, "v1"], None).await;
    assert_eq!((out.0, out.1.trim()), (true, "OK"), "{}", out.2);
    let got = c.get(key.as_str(), None).await.expect("get");
    assert_eq!(got.kvs()[0].value(), b"v1");

    // txn: compare on the value just written, then put; else branch untouched.
    let script = format!("value(\"{key}\") = \"v1\"\n\nput {key} v2\n\nput {key} never\n\n");
    let out = etcdctl(&fe, &["txn"], Some(&script)).await;
    assert!(out.0, "txn: {}", out.2);
    assert_eq!(out.1.lines().next(), Some("SUCCESS"), "{}", out.1);
    let got = c.get(key.as_str(), None).await.expect("get");
    assert_eq!(got.kvs()[0].value(), b"v2");

    // lease grant, then a put attached to it.
    let out = etcdctl(&fe, &["lease", "grant", "600"], None).await;
    assert!(out.0, "lease grant: {}", out.2);
    // "lease 694d7b6c2a8f6e0b granted with TTL(600s)"
    let id = out
        .1
        .split_whitespace()
        .nth(1)
        .expect("lease id")
        .to_string();
    assert!(out.1.contains("granted with TTL(600s)"), "{}", out.1);
    let leased = format!("{p}ns/leased");
    let out = etcdctl(&fe, &["put", &leased, "l", &format!("--lease={id}")], None).await;
    assert_eq!((out.0, out.1.trim()), (true, "OK"), "{}", out.2);
    let got = c.get(leased.as_str(), None).await.expect("get");
    assert_eq!(
        Ok(got.kvs()[0].lease()),
        i64::from_str_radix(&id, 16),
        "the key carries the lease"
    );
    let ttl = etcdctl(&fe, &["lease", "timetolive", &id], None).await;
    assert!(ttl.0 && ttl.1.contains(&id), "timetolive: {:?}", ttl);
    let keep = etcdctl(&fe, &["lease", "keep-alive", "--once", &id], None).await;
    assert!(
        keep.0 && keep.1.contains("keepalived"),
        "keep-alive: {keep:?}"
    );

    // The cache learns of the writes by its watch: a serializable read
    // through the front sees them once the cache caught up.
    let rev = c
        .get("/", None)
        .await
        .expect("rev")
        .header()
        .map(|h| h.revision())
        .unwrap_or(0);
    front.wait_rev(rev).await;
    let out = etcdctl(
        &fe,
        &["get", &key, "--print-value-only", "--consistency=s"],
        None,
    )
    .await;
    assert_eq!(out.1.trim(), "v2");

    let out = etcdctl(&fe, &["del", &key], None).await;
    assert_eq!((out.0, out.1.trim()), (true, "1"), "{}", out.2);
    assert!(
        c.get(key.as_str(), None)
            .await
            .expect("get")
            .kvs()
            .is_empty()
    );
    let out = etcdctl(&fe, &["lease", "revoke", &id], None).await;
    assert!(out.0 && out.1.contains("revoked"), "{out:?}");
}

/// Reads etcdctl watch output lines until `n` lines came (or `WAIT` passed).
async fn watch_lines(endpoint: &str, args: &[&str], n: usize) -> Vec<String> {
    let mut child = tokio::process::Command::new(etcdctl_bin())
        .env_remove("ETCDCTL_API")
        .arg(format!("--endpoints={endpoint}"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn etcdctl watch");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(WAIT, async {
        while out.len() < n {
            match lines.next_line().await {
                Ok(Some(l)) => out.push(l),
                _ => break,
            }
        }
    })
    .await;
    let _ = child.kill().await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_watch_history_with_prev_kv_equals_etcd() {
    let ep = common::etcd().to_string();
    let prefix = common::unique_prefix("ctlwatch");
    let p = format!("{prefix}/pods/");
    let front = TestFront::start(&ep, &prefix, |_| {}).await;
    let mut c = Client::connect([ep.as_str()], None).await.expect("etcd");
    let first = put(&mut c, &format!("{p}a"), "1").await;
    put(&mut c, &format!("{p}b"), "1").await;
    put(&mut c, &format!("{prefix}/elsewhere"), "not watched").await;
    put(&mut c, &format!("{p}a"), "2").await;
    c.delete(format!("{p}b"), None).await.expect("delete");
    let last = put(&mut c, &format!("{p}c"), "3").await;
    front.wait_rev(last).await;
    let from = (first + 1).to_string();
    let args = [
        "watch",
        "--prefix",
        p.as_str(),
        "--rev",
        from.as_str(),
        "--prev-kv",
    ];
    // From `first + 1`: b put (3 lines), a put with prev (5), b delete with
    // prev (5), c put (3).
    let n = 16;
    let direct = watch_lines(&ep, &args, n).await;
    assert_eq!(direct.len(), n, "etcd's own output: {direct:?}");
    let via = watch_lines(&front.endpoint(), &args, n).await;
    assert_eq!(via, direct);
}

/// Reads responses until `done` says so; fails after `WAIT`.
async fn read_until(
    stream: &mut etcd_client::WatchStream,
    mut done: impl FnMut(&WatchResponse) -> bool,
) -> Vec<WatchResponse> {
    let mut out = Vec::new();
    let r = tokio::time::timeout(WAIT, async {
        loop {
            let resp = stream
                .message()
                .await
                .expect("watch message")
                .expect("stream open");
            let stop = done(&resp);
            out.push(resp);
            if stop {
                return;
            }
        }
    })
    .await;
    assert!(
        r.is_ok(),
        "watch responses so far (watch id, created, canceled, events): {:?}",
        out.iter()
            .map(|r| (r.watch_id(), r.created(), r.canceled(), r.events().len()))
            .collect::<Vec<_>>()
    );
    out
}

/// Reads responses until `n` watches have been created.
async fn read_created(stream: &mut etcd_client::WatchStream, n: usize) -> Vec<WatchResponse> {
    let mut created = 0;
    read_until(stream, move |r| {
        created += usize::from(r.created());
        created == n
    })
    .await
}

/// Asks for progress twice back to back (etcd answers the front's forwarded
/// requests twice: neither answer may reach the client raw) and reads up to
/// an answer: the events' revisions go to `received`, and the answer's
/// revision with how many events came before it to `answers`. Returns the
/// answer's revision. A second answer is read by the next round.
async fn progress_round(
    s: &mut etcd_client::WatchStream,
    received: &mut Vec<i64>,
    answers: &mut Vec<(i64, usize)>,
) -> i64 {
    s.request_progress().await.expect("progress");
    s.request_progress().await.expect("progress");
    let got = read_until(s, is_progress).await;
    for r in &got {
        for e in r.events() {
            received.push(e.kv().map(|kv| kv.mod_revision()).unwrap_or(0));
        }
    }
    let rev = got
        .last()
        .and_then(|r| r.header())
        .map(|h| h.revision())
        .unwrap_or(0);
    answers.push((rev, received.len()));
    rev
}

fn is_progress(r: &WatchResponse) -> bool {
    r.watch_id() == -1 && r.events().is_empty() && !r.created() && !r.canceled()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_watches_on_one_stream_with_ids_cancel_and_progress() {
    let ep = common::etcd().to_string();
    let prefix = common::unique_prefix("streams");
    let p = format!("{prefix}/pods/");
    let front = TestFront::start(&ep, &prefix, |_| {}).await;
    let mut fc = front.client().await;
    let mut ec = Client::connect([ep.as_str()], None).await.expect("etcd");
    let outside = format!("{prefix}/outside/x");

    // Watch 7: one key; 9: another; auto ids: the prefix (0), a range
    // outside every cached prefix (1, forwarded to etcd).
    let mut s = fc
        .watch(format!("{p}a"), Some(WatchOptions::new().with_watch_id(7)))
        .await
        .expect("watch");
    s.watch(format!("{p}b"), Some(WatchOptions::new().with_watch_id(9)))
        .await
        .expect("watch");
    s.watch(p.as_str(), Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch");
    s.watch(outside.as_str(), None).await.expect("watch");
    // A taken id is refused as etcd refuses it.
    s.watch(format!("{p}z"), Some(WatchOptions::new().with_watch_id(7)))
        .await
        .expect("watch");
    let created = read_until(&mut s, {
        let mut n = 0;
        move |_| {
            n += 1;
            n == 5
        }
    })
    .await;
    let ids: Vec<(i64, bool, bool)> = created
        .iter()
        .map(|r| (r.watch_id(), r.created(), r.canceled()))
        .collect();
    assert_eq!(
        ids,
        [
            (7, true, false),
            (9, true, false),
            (0, true, false),
            (1, true, false),
            (-1, true, true)
        ]
    );

    let ra = put(&mut ec, &format!("{p}a"), "1").await;
    let rb = put(&mut ec, &format!("{p}b"), "1").await;
    let rx = put(&mut ec, &outside, "1").await;
    let mut seen: HashMap<i64, Vec<i64>> = HashMap::new();
    let total = |seen: &HashMap<i64, Vec<i64>>| seen.values().map(Vec::len).sum::<usize>();
    read_until(&mut s, |r| {
        for e in r.events() {
            seen.entry(r.watch_id())
                .or_default()
                .push(e.kv().map(|kv| kv.mod_revision()).unwrap_or(0));
        }
        total(&seen) == 5
    })
    .await;
    assert_eq!(seen[&7], [ra]);
    assert_eq!(seen[&9], [rb]);
    assert_eq!(seen[&0], [ra, rb]);
    assert_eq!(seen[&1], [rx]);

    // Cancel 9 (cached) and 1 (forwarded): each answered canceled.
    s.cancel(9).await.expect("cancel");
    s.cancel(1).await.expect("cancel");
    let mut canceled = Vec::new();
    read_until(&mut s, |r| {
        if r.canceled() {
            canceled.push(r.watch_id());
        }
        canceled.len() == 2
    })
    .await;
    canceled.sort();
    assert_eq!(canceled, [1, 9]);

    // After cancel, b's change reaches only the prefix watch; the progress
    // answer comes after every event up to its revision.
    let rb2 = put(&mut ec, &format!("{p}b"), "2").await;
    front.wait_rev(rb2).await;
    s.request_progress().await.expect("progress");
    let got = read_until(&mut s, is_progress).await;
    let progress = got
        .last()
        .and_then(|r| r.header())
        .map(|h| h.revision())
        .unwrap_or(0);
    assert!(progress >= rb2, "progress at {progress} < {rb2}");
    let events: Vec<(i64, i64)> = got
        .iter()
        .flat_map(|r| {
            r.events().iter().map(move |e| {
                (
                    r.watch_id(),
                    e.kv().map(|kv| kv.mod_revision()).unwrap_or(0),
                )
            })
        })
        .collect();
    assert_eq!(events, [(0, rb2)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_answers_only_after_every_event_up_to_its_revision() {
    let ep = common::etcd().to_string();
    let prefix = common::unique_prefix("progress");
    let p = format!("{prefix}/pods/");
    let front = TestFront::start(&ep, &prefix, |_| {}).await;
    let mut fc = front.client().await;
    let mut ec = Client::connect([ep.as_str()], None).await.expect("etcd");
    let mut s = fc
        .watch(p.as_str(), Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch");
    // A forwarded watch on the same stream: etcd's answer is held too.
    s.watch(
        format!("{prefix}/outside/"),
        Some(WatchOptions::new().with_prefix()),
    )
    .await
    .expect("watch");
    read_created(&mut s, 2).await;
    let writer = tokio::spawn(async move {
        let mut revs = Vec::new();
        for i in 0..200 {
            revs.push(put(&mut ec, &format!("{p}k{}", i % 20), format!("{i}")).await);
        }
        revs
    });
    // Progress requests while the writes are under way: each answer's
    // revision, and how many events had arrived before it.
    let mut received: Vec<i64> = Vec::new();
    let mut answers: Vec<(i64, usize)> = Vec::new();
    loop {
        let done = writer.is_finished();
        progress_round(&mut s, &mut received, &mut answers).await;
        if done {
            break;
        }
    }
    let revs = writer.await.expect("writer");
    let last = *revs.last().expect("writes");
    // One more answer at or past the last write.
    loop {
        let rev = progress_round(&mut s, &mut received, &mut answers).await;
        if rev >= last {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(received, revs, "every write once, in order");
    assert!(answers.len() > 2);
    for (rev, before) in answers {
        let due = revs.iter().filter(|r| **r <= rev).count();
        assert_eq!(
            before, due,
            "the answer at {rev} came after exactly the events up to it"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_older_than_the_ring_and_compaction_answer_as_etcd() {
    let mut etcd = common::PrivateEtcd::start().await.expect("private etcd");
    let ep = etcd.endpoint();
    let prefix = common::unique_prefix("compact");
    let p = format!("{prefix}/pods/");
    let mut ec = Client::connect([ep.as_str()], None).await.expect("etcd");
    // A ring of 3 events.
    let front = TestFront::start(&ep, &prefix, |cfg| {
        for r in &mut cfg.resources {
            r.history_capacity = Some(3);
        }
    })
    .await;
    let mut revs = Vec::new();
    for i in 0..10 {
        revs.push(put(&mut ec, &format!("{p}k{i}"), format!("{i}")).await);
    }
    front.wait_rev(revs[9]).await;
    let mut fc = front.client().await;

    // Older than the ring, not compacted: etcd's own answer (forwarded).
    let events = |rs: &[WatchResponse]| -> Vec<(EventType, i64)> {
        rs.iter()
            .flat_map(|r| {
                r.events().iter().map(|e| {
                    (
                        e.event_type(),
                        e.kv().map(|kv| kv.mod_revision()).unwrap_or(0),
                    )
                })
            })
            .collect()
    };
    let opts = WatchOptions::new()
        .with_prefix()
        .with_start_revision(revs[2])
        .with_prev_key();
    let mut via = fc
        .watch(p.as_str(), Some(opts.clone()))
        .await
        .expect("watch");
    let mut direct = ec.watch(p.as_str(), Some(opts)).await.expect("watch");
    let count = |n: usize| {
        let mut seen = 0;
        move |r: &WatchResponse| {
            seen += r.events().len();
            seen >= n
        }
    };
    let a = read_until(&mut via, count(8)).await;
    let b = read_until(&mut direct, count(8)).await;
    assert_eq!(events(&a), events(&b));
    assert_eq!(events(&a).len(), 8);
    // etcd's catch-up reached the ring: the watch moved onto the cache
    // (etcd's watch canceled) and goes on without a gap or a duplicate.
    let f = Arc::clone(&front.front);
    let moved = common::eventually(WAIT, || {
        let f = Arc::clone(&f);
        async move { f.watchers() == (1, 0) }
    })
    .await;
    assert!(moved, "handed over: {:?}", front.front.watchers());
    for i in 10..12 {
        revs.push(put(&mut ec, &format!("{p}k{i}"), format!("{i}")).await);
    }
    let a = read_until(&mut via, count(2)).await;
    let b = read_until(&mut direct, count(2)).await;
    assert_eq!(events(&a), events(&b));
    assert_eq!(
        events(&a).iter().map(|e| e.1).collect::<Vec<_>>(),
        revs[10..12].to_vec()
    );
    // From inside the ring: served by the cache, same events.
    let opts = WatchOptions::new()
        .with_prefix()
        .with_start_revision(revs[8]);
    let mut via = fc
        .watch(p.as_str(), Some(opts.clone()))
        .await
        .expect("watch");
    let mut direct = ec.watch(p.as_str(), Some(opts)).await.expect("watch");
    let a = read_until(&mut via, count(2)).await;
    let b = read_until(&mut direct, count(2)).await;
    assert_eq!(events(&a), events(&b));

    // Compacted in etcd: canceled with compact_revision, as etcd does.
    front.wait_rev(revs[11]).await;
    ec.compact(revs[5], None).await.expect("compact");
    let opts = WatchOptions::new()
        .with_prefix()
        .with_start_revision(revs[1]);
    let mut via = fc
        .watch(p.as_str(), Some(opts.clone()))
        .await
        .expect("watch");
    let mut direct = ec.watch(p.as_str(), Some(opts)).await.expect("watch");
    let a = read_until(&mut via, |r| r.canceled()).await;
    let b = read_until(&mut direct, |r| r.canceled()).await;
    let last = |rs: &[WatchResponse]| rs.last().map(|r| (r.canceled(), r.compact_revision()));
    assert_eq!(last(&a), last(&b));
    assert_eq!(last(&a), Some((true, revs[5])));
    etcd.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_is_canceled_with_compact_revision_when_the_ring_overruns_it() {
    let ep = common::etcd().to_string();
    let prefix = common::unique_prefix("slow");
    let p = format!("{prefix}/pods/");
    let front = TestFront::start(&ep, &prefix, |cfg| {
        for r in &mut cfg.resources {
            r.history_capacity = Some(5);
        }
    })
    .await;
    let mut fc = front.client().await;
    let mut ec = Client::connect([ep.as_str()], None).await.expect("etcd");
    let mut slow = fc
        .watch(p.as_str(), Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch");
    let created = read_until(&mut slow, |r| r.created()).await;
    assert_eq!(created.len(), 1);
    // A fast watcher on another stream keeps up all along.
    let mut fast = front
        .client()
        .await
        .watch(p.as_str(), Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch");
    read_until(&mut fast, |r| r.created()).await;
    // `slow` reads nothing while 100 values of 256 KiB are written: flow
    // control stops its stream, its cursor stays, the ring overruns it.
    let big = vec![b'x'; 256 * 1024];
    let mut revs = Vec::new();
    let mut fast_seen = 0;
    for i in 0..100 {
        revs.push(put(&mut ec, &format!("{p}k{}", i % 10), big.clone()).await);
        let got = read_until(&mut fast, |r| !r.events().is_empty()).await;
        fast_seen += got.iter().map(|r| r.events().len()).sum::<usize>();
        while fast_seen < i + 1 {
            let got = read_until(&mut fast, |r| !r.events().is_empty()).await;
            fast_seen += got.iter().map(|r| r.events().len()).sum::<usize>();
        }
    }
    assert_eq!(fast_seen, 100, "the fast watcher got every event");
    let got = read_until(&mut slow, |r| r.canceled()).await;
    let received: Vec<i64> = got
        .iter()
        .flat_map(|r| {
            r.events()
                .iter()
                .filter_map(|e| e.kv().map(|kv| kv.mod_revision()))
        })
        .collect();
    let cancel = got.last().expect("cancel");
    assert!(cancel.compact_revision() > 0, "compact_revision set");
    assert!(received.len() < 100, "the slow watcher was overrun");
    assert_eq!(
        received,
        revs[..received.len()],
        "what it got is contiguous"
    );
    // Re-watching from the compact revision is served (from the ring or
    // etcd) and resumes without a gap.
    let mut again = fc
        .watch(
            p.as_str(),
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(cancel.compact_revision()),
            ),
        )
        .await
        .expect("watch");
    let got = read_until(&mut again, |r| {
        r.events()
            .last()
            .and_then(|e| e.kv())
            .is_some_and(|kv| kv.mod_revision() == revs[99])
    })
    .await;
    let resumed: Vec<i64> = got
        .iter()
        .flat_map(|r| {
            r.events()
                .iter()
                .filter_map(|e| e.kv().map(|kv| kv.mod_revision()))
        })
        .collect();
    let due: Vec<i64> = revs
        .iter()
        .copied()
        .filter(|r| *r >= cancel.compact_revision())
        .collect();
    assert_eq!(resumed, due, "every write from the compact revision on");
    assert!(
        received
            .last()
            .is_some_and(|r| due.first().is_some_and(|d| d > r)),
        "nothing the slow watcher got is repeated"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_with_options_equal_etcd_through_the_crate() {
    let ep = common::etcd().to_string();
    let prefix = common::unique_prefix("ranges");
    let p = format!("{prefix}/widgets-not/");
    let w = format!("{prefix}/example.com/widgets/");
    let front = TestFront::start(&ep, &prefix, |_| {}).await;
    // etcd without auth: learned as off, so cached reads ask etcd nothing.
    let off = common::eventually(WAIT, || {
        let front = Arc::clone(&front.front);
        async move { front.auth().status() == Some(false) }
    })
    .await;
    assert!(off, "the front learned that etcd's auth is off");
    assert!(!front.front.auth().enabled());
    let mut fc = front.client().await;
    let mut ec = Client::connect([ep.as_str()], None).await.expect("etcd");
    let mut revs = Vec::new();
    for (k, v) in [("a", "3"), ("b", "1"), ("c", "2"), ("a", "4"), ("d", "0")] {
        revs.push(put(&mut ec, &format!("{w}{k}"), v).await);
    }
    put(&mut ec, &format!("{p}z"), "other").await;
    // A txn writes two keys at one revision.
    let t = Txn::new()
        .when([Compare::version(format!("{w}a"), CompareOp::Equal, 2)])
        .and_then([
            TxnOp::put(format!("{w}e"), "5", None),
            TxnOp::delete(format!("{w}b"), None),
        ]);
    let tr = fc.txn(t).await.expect("txn through the front");
    assert!(tr.succeeded());
    let last = tr.header().map(|h| h.revision()).expect("header");
    front.wait_rev(last).await;
    use etcd_client::{GetOptions, SortOrder, SortTarget};
    let opts = [
        GetOptions::new().with_prefix(),
        GetOptions::new().with_prefix().with_limit(2),
        GetOptions::new()
            .with_prefix()
            .with_min_mod_revision(revs[2])
            .with_max_create_revision(revs[3]),
        GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Value, SortOrder::Descend)
            .with_limit(3),
        GetOptions::new().with_prefix().with_count_only(),
        GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_serializable(),
        GetOptions::new().with_prefix().with_revision(revs[3]),
        GetOptions::new()
            .with_prefix()
            .with_max_mod_revision(revs[2])
            .with_min_create_revision(revs[1]),
    ];
    for o in opts {
        let a = fc
            .get(w.as_str(), Some(o.clone()))
            .await
            .expect("front get");
        let b = ec.get(w.as_str(), Some(o.clone())).await.expect("etcd get");
        assert_eq!(get_view(&a), get_view(&b), "{o:?}");
        let (ha, hb) = (a.header().expect("header"), b.header().expect("header"));
        assert_eq!(
            (ha.cluster_id(), ha.member_id()),
            (hb.cluster_id(), hb.member_id())
        );
        assert!(ha.revision() >= last);
    }
}

/// The daemon with `--grpc-listen` in front of an etcd that requires mutual
/// TLS: the front's passthrough and its cache both use the store's TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_grpc_listen_over_mtls_etcd() {
    let pki = common::pki::Pki::generate();
    let etcd = common::PrivateEtcd::start_tls(pki.etcd_server_tls())
        .await
        .expect("TLS etcd");
    let prefix = common::unique_prefix("grpc-daemon");
    let base = common::daemon_config(&etcd.endpoint(), &prefix, "");
    let (head, resources) = base
        .split_once("\n[[resources]]")
        .expect("daemon_config has resources");
    let tls = format!(
        "[etcd.tls]\nca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
        pki.path("ca.crt").display(),
        pki.path("client.crt").display(),
        pki.path("client.key").display()
    );
    let text = format!("{head}\n{tls}\n[[resources]]{resources}");
    let port = watchcache::etcd_server::free_port().expect("port");
    let grpc = format!("127.0.0.1:{port}");
    let daemon = common::Daemon::start(&text, &["--grpc-listen", &grpc]).await;
    let fe = format!("http://{grpc}");
    let key = format!("{prefix}/pods/default/a");
    let up = common::eventually(WAIT, || {
        let (fe, key) = (fe.clone(), key.clone());
        async move { etcdctl(&fe, &["put", &key, "v"], None).await.0 }
    })
    .await;
    assert!(up, "put through the front; log:\n{}", daemon.log());
    // Linearizable read: served once the cache caught up with the put.
    let out = etcdctl(&fe, &["get", &key, "--print-value-only"], None).await;
    assert_eq!((out.0, out.1.trim()), (true, "v"), "{}", out.2);
    let out = etcdctl(&fe, &["endpoint", "status"], None).await;
    assert!(out.0, "endpoint status: {}", out.2);

    // SIGTERM with a watch and a (passed-through) lease keep-alive open:
    // the daemon still exits, cleanly.
    let mut c = Client::connect([fe.as_str()], None).await.expect("client");
    let mut w = c.watch(key.as_str(), None).await.expect("watch");
    read_until(&mut w, |r| r.created()).await;
    let lease = c.lease_grant(60, None).await.expect("lease").id();
    let (mut keeper, mut alive) = c.lease_keep_alive(lease).await.expect("keep-alive");
    keeper.keep_alive().await.expect("keep alive");
    assert!(alive.message().await.expect("keep-alive answer").is_some());
    let mut daemon = daemon;
    daemon.sigterm();
    let status = daemon.wait_exit(Duration::from_secs(30)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "exit status {status:?}; log:\n{}",
        daemon.log()
    );
}

/// A range answer as a comparable tuple: (count, more, each kv's key,
/// value, create, mod, version, lease).
type GetView = (i64, bool, Vec<KvView>);

fn get_view(r: &etcd_client::GetResponse) -> GetView {
    (r.count(), r.more(), r.kvs().iter().map(kv_view).collect())
}

/// A key-value as a comparable tuple: (key, value, create, mod, version,
/// lease).
type KvView = (Vec<u8>, Vec<u8>, i64, i64, i64, i64);

fn kv_view(kv: &etcd_client::KeyValue) -> KvView {
    (
        kv.key().to_vec(),
        kv.value().to_vec(),
        kv.create_revision(),
        kv.mod_revision(),
        kv.version(),
        kv.lease(),
    )
}

/// One event as a comparable tuple: (type, its key-value, prev (value,
/// mod) if any).
type EventView = (i32, KvView, Option<(Vec<u8>, i64)>);

fn event_views(r: &WatchResponse) -> Vec<EventView> {
    r.events()
        .iter()
        .map(|e| {
            (
                e.event_type() as i32,
                kv_view(e.kv().expect("event kv")),
                e.prev_kv().map(|p| (p.value().to_vec(), p.mod_revision())),
            )
        })
        .collect()
}

/// Reads a stream until a progress answer at or past `rev`, asking for
/// progress as it goes (again after a second without an answer: etcd
/// ignores a progress request while a watch catches up); returns the events
/// per watch id.
async fn events_until(s: &mut etcd_client::WatchStream, rev: i64) -> HashMap<i64, Vec<EventView>> {
    let mut out: HashMap<i64, Vec<EventView>> = HashMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no progress answer at {rev}"
        );
        s.request_progress().await.expect("progress");
        let ask_again = tokio::time::Instant::now() + Duration::from_secs(1);
        while let Ok(msg) = tokio::time::timeout_at(ask_again, s.message()).await {
            let r = msg.expect("watch message").expect("stream open");
            if !r.events().is_empty() {
                out.entry(r.watch_id()).or_default().extend(event_views(&r));
            }
            if is_progress(&r) {
                if r.header().map(|h| h.revision()).unwrap_or(0) >= rev {
                    return out;
                }
                break;
            }
        }
    }
}

/// A random workload (puts, overwrites, deletes, range deletes, multi-key
/// txns, leases, binary and large values): every watch stream and every
/// Range through the front equals the same through etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential_random_workload_equals_etcd() {
    use etcd_client::{
        DeleteOptions, GetOptions, PutOptions, SortOrder, SortTarget, WatchFilterType,
    };
    use rand::{Rng, SeedableRng};
    let seed: u64 = rand::random();
    println!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let ep = common::etcd().to_string();
    let prefix = common::unique_prefix("diff");
    let p = format!("{prefix}/nodes/");
    // The streams are read only after the workload: the ring must hold it
    // all (a smaller one cancels the watches with compact_revision).
    let front = TestFront::start(&ep, &prefix, |cfg| {
        for r in &mut cfg.resources {
            r.history_capacity = Some(1000);
        }
    })
    .await;
    let mut fc = front.client().await;
    let mut ec = Client::connect([ep.as_str()], None).await.expect("etcd");
    let key = |i: usize| format!("{p}k{i}");

    // The same five watches on one stream each, through the front and direct.
    let watches: Vec<(i64, String, WatchOptions)> = vec![
        (
            1,
            p.clone(),
            WatchOptions::new().with_prefix().with_prev_key(),
        ),
        (2, key(3), WatchOptions::new()),
        (
            3,
            key(2),
            WatchOptions::new().with_range(key(6)).with_prev_key(),
        ),
        (
            4,
            p.clone(),
            WatchOptions::new()
                .with_prefix()
                .with_filters([WatchFilterType::NoDelete]),
        ),
        (
            5,
            p.clone(),
            WatchOptions::new()
                .with_prefix()
                .with_filters([WatchFilterType::NoPut])
                .with_prev_key(),
        ),
    ];
    // etcd's own catch-up batches can exceed tonic's default 4 MiB.
    let wide = |c: &Client| c.watch_client().max_decoding_message_size(64 << 20);
    let mut streams = Vec::new();
    for c in [&fc, &ec] {
        let mut c = wide(c);
        let mut s: Option<etcd_client::WatchStream> = None;
        for (id, k, o) in &watches {
            let o = o.clone().with_watch_id(*id);
            match &mut s {
                None => s = Some(c.watch(k.as_str(), Some(o)).await.expect("watch")),
                Some(s) => s.watch(k.as_str(), Some(o)).await.expect("watch"),
            }
        }
        let mut s = s.expect("stream");
        read_created(&mut s, 5).await;
        streams.push(s);
    }
    let lease = ec.lease_grant(600, None).await.expect("lease").id();

    let first = ec
        .get("/", None)
        .await
        .expect("rev")
        .header()
        .map(|h| h.revision())
        .unwrap_or(0);
    let mut last = first;
    for _ in 0..300 {
        let i = rng.random_range(0..10);
        let value: Vec<u8> = match rng.random_range(0..10) {
            0 => vec![0xff, 0x00, rng.random()],
            1 => vec![b'L'; 100_000],
            _ => format!("v{}", rng.random::<u32>()).into_bytes(),
        };
        let rev = match rng.random_range(0..10) {
            0..=4 => ec
                .put(key(i), value, None)
                .await
                .expect("put")
                .header()
                .map(|h| h.revision()),
            5 => ec
                .put(key(i), value, Some(PutOptions::new().with_lease(lease)))
                .await
                .expect("put")
                .header()
                .map(|h| h.revision()),
            6 | 7 => ec
                .delete(key(i), None)
                .await
                .expect("delete")
                .header()
                .map(|h| h.revision()),
            8 => ec
                .delete(key(4), Some(DeleteOptions::new().with_range(key(7))))
                .await
                .expect("delete range")
                .header()
                .map(|h| h.revision()),
            _ => {
                let j = (i + 1 + rng.random_range(0..8)) % 10;
                let t = Txn::new()
                    .and_then([TxnOp::put(key(i), value, None), TxnOp::delete(key(j), None)]);
                ec.txn(t).await.expect("txn").header().map(|h| h.revision())
            }
        };
        last = last.max(rev.unwrap_or(0));
    }
    front.wait_rev(last).await;
    let (front_stream, etcd_stream) = streams.split_at_mut(1);
    let via = events_until(&mut front_stream[0], last).await;
    let direct = events_until(&mut etcd_stream[0], last).await;
    for (id, _, _) in &watches {
        let (a, b) = (via.get(id), direct.get(id));
        if a != b {
            let (a, b) = (
                a.cloned().unwrap_or_default(),
                b.cloned().unwrap_or_default(),
            );
            let at = a
                .iter()
                .zip(&b)
                .position(|(x, y)| x != y)
                .unwrap_or(a.len().min(b.len()));
            let brief = |e: Option<&EventView>| {
                e.map(|(ty, kv, prev)| {
                    (
                        *ty,
                        String::from_utf8_lossy(&kv.0).into_owned(),
                        kv.1.len(),
                        kv.2,
                        kv.3,
                        kv.4,
                        kv.5,
                        prev.as_ref().map(|p| (p.0.len(), p.1)),
                    )
                })
            };
            panic!(
                "watch {id} (seed {seed}): {} events via the front, {} direct; first difference at {at}: {:?} vs {:?}",
                a.len(),
                b.len(),
                brief(a.get(at)),
                brief(b.get(at))
            );
        }
    }
    assert!(
        direct.get(&1).is_some_and(|e| e.len() > 100),
        "the workload was seen"
    );

    // A watch from a revision in the middle of the workload.
    let mid = first + (last - first) / 2;
    let o = WatchOptions::new()
        .with_prefix()
        .with_prev_key()
        .with_start_revision(mid);
    let mut a = wide(&fc)
        .watch(p.as_str(), Some(o.clone()))
        .await
        .expect("watch");
    let mut b = wide(&ec).watch(p.as_str(), Some(o)).await.expect("watch");
    let a = events_until(&mut a, last).await;
    let b = events_until(&mut b, last).await;
    assert_eq!(a, b, "watch from {mid} (seed {seed})");

    // Ranges at random revisions (some beyond the retained snapshots: etcd
    // answers) with random options.
    for _ in 0..60 {
        let mut o = GetOptions::new();
        let k = match rng.random_range(0..3) {
            0 => {
                o = o.with_prefix();
                p.clone()
            }
            1 => {
                o = o.with_range(key(rng.random_range(5..10)));
                key(rng.random_range(0..5))
            }
            _ => key(rng.random_range(0..10)),
        };
        if rng.random_bool(0.5) {
            o = o.with_revision(rng.random_range(first..=last));
        }
        if rng.random_bool(0.3) {
            o = o.with_limit(rng.random_range(1..5));
        }
        if rng.random_bool(0.3) {
            let t = [
                SortTarget::Key,
                SortTarget::Version,
                SortTarget::Create,
                SortTarget::Mod,
                SortTarget::Value,
            ][rng.random_range(0..5)];
            let ord = [SortOrder::Ascend, SortOrder::Descend][rng.random_range(0..2)];
            o = o.with_sort(t, ord);
        }
        if rng.random_bool(0.2) {
            o = o.with_keys_only();
        }
        if rng.random_bool(0.2) {
            o = o.with_min_mod_revision(rng.random_range(first..=last));
        }
        if rng.random_bool(0.2) {
            o = o.with_max_create_revision(rng.random_range(first..=last));
        }
        if rng.random_bool(0.5) {
            o = o.with_serializable();
        }
        let a = fc
            .get(k.as_str(), Some(o.clone()))
            .await
            .expect("front get");
        let b = ec.get(k.as_str(), Some(o.clone())).await.expect("etcd get");
        assert_eq!(get_view(&a), get_view(&b), "{k} {o:?} (seed {seed})");
    }
}

/// `fragment`: a response over etcd's request limit is split as etcd
/// splits it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fragment_splits_a_large_revision_like_etcd() {
    let ep = common::etcd().to_string();
    let prefix = common::unique_prefix("fragment");
    let p = format!("{prefix}/pods/");
    let front = TestFront::start(&ep, &prefix, |_| {}).await;
    let mut fc = front.client().await;
    let mut ec = Client::connect([ep.as_str()], None).await.expect("etcd");
    let big = |c: u8| vec![c; 350 * 1024];
    for i in 0..4 {
        put(&mut ec, &format!("{p}k{i}"), big(b'a')).await;
    }
    let start = ec
        .get("/", None)
        .await
        .expect("rev")
        .header()
        .map(|h| h.revision())
        .unwrap_or(0)
        + 1;
    // One revision of 4 x 350 KiB, with prev_kv: about 2.8 MiB of events.
    let t = Txn::new().and_then(
        (0..4)
            .map(|i| TxnOp::put(format!("{p}k{i}"), big(b'b'), None))
            .collect::<Vec<_>>(),
    );
    let rev = ec
        .txn(t)
        .await
        .expect("txn")
        .header()
        .map(|h| h.revision())
        .unwrap_or(0);
    front.wait_rev(rev).await;
    let o = WatchOptions::new()
        .with_prefix()
        .with_prev_key()
        .with_fragment()
        .with_start_revision(start);
    let shape = |rs: &[WatchResponse]| -> Vec<(bool, usize)> {
        rs.iter()
            .filter(|r| !r.created())
            .map(|r| (r.0.fragment, r.events().len()))
            .collect()
    };
    let mut a = fc.watch(p.as_str(), Some(o.clone())).await.expect("watch");
    let mut b = ec.watch(p.as_str(), Some(o)).await.expect("watch");
    let done = || {
        let mut n = 0;
        move |r: &WatchResponse| {
            n += r.events().len();
            n >= 4
        }
    };
    let a = read_until(&mut a, done()).await;
    let b = read_until(&mut b, done()).await;
    assert!(
        shape(&b).len() > 1 && shape(&b)[0].0,
        "etcd fragmented: {:?}",
        shape(&b)
    );
    assert_eq!(shape(&a), shape(&b));
    let all = |rs: &[WatchResponse]| rs.iter().flat_map(event_views).collect::<Vec<_>>();
    assert_eq!(all(&a), all(&b));
}

/// The front loses etcd while etcd compacts past the cache: the cache
/// relists, and every watch it served is canceled with etcd's compaction
/// revision (its events in between are gone), as etcd cancels a compacted
/// watch; reads then show the new state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relist_after_compaction_cancels_cached_watches() {
    let etcd = common::PrivateEtcd::start().await.expect("private etcd");
    let target: SocketAddr = format!("127.0.0.1:{}", etcd.client_port())
        .parse()
        .expect("addr");
    let proxy = common::TcpProxy::start(target).await;
    let prefix = common::unique_prefix("relist");
    let p = format!("{prefix}/pods/");
    let mut ec = Client::connect([etcd.endpoint()], None)
        .await
        .expect("etcd");
    put(&mut ec, &format!("{p}a"), "1").await;
    let front = TestFront::start(&proxy.endpoint(), &prefix, |_| {}).await;
    let mut fc = front.client().await;
    let mut w = fc
        .watch(p.as_str(), Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch");
    read_until(&mut w, |r| r.created()).await;

    proxy.cut().await;
    put(&mut ec, &format!("{p}b"), "2").await;
    let c = put(&mut ec, &format!("{p}a"), "3").await;
    ec.compact(c, None).await.expect("compact");
    proxy.restore();

    let got = read_until(&mut w, |r| r.canceled()).await;
    let last = got.last().expect("cancel");
    assert_eq!(last.compact_revision(), c);
    assert!(
        got.iter().all(|r| r.events().is_empty()),
        "no events from the old epoch"
    );
    front.wait_rev(c).await;
    let r = fc
        .get(
            p.as_str(),
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_serializable(),
            ),
        )
        .await
        .expect("get");
    let values: Vec<&[u8]> = r.kvs().iter().map(|kv| kv.value()).collect();
    assert_eq!(values, [b"3".as_slice(), b"2".as_slice()]);
}

/// `progress_notify` watches (etcdctl `watch --progress-notify`) get a
/// progress notification when idle, every
/// `server.watch_progress_notify_interval_ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_notify_reaches_idle_watches() {
    let ep = common::etcd().to_string();
    let prefix = common::unique_prefix("notify");
    let p = format!("{prefix}/pods/");
    let front = TestFront::start(&ep, &prefix, |cfg| {
        cfg.server.watch_progress_notify_interval_ms = 200;
    })
    .await;
    let mut ec = Client::connect([ep.as_str()], None).await.expect("etcd");
    let rev = put(&mut ec, &format!("{p}a"), "1").await;
    front.wait_rev(rev).await;
    let from = rev.to_string();
    let args = [
        "watch",
        "--prefix",
        p.as_str(),
        "--rev",
        from.as_str(),
        "--progress-notify",
    ];
    // The event (3 lines), then a notification.
    let lines = watch_lines(&front.endpoint(), &args, 4).await;
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert_eq!(lines[..2], ["PUT".to_string(), format!("{p}a")]);
    let notified: i64 = lines[3]
        .strip_prefix("progress notify: ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a progress notification: {lines:?}"));
    assert!(notified >= rev);

    // Through the crate: the notification carries the watch's own id.
    let mut fc = front.client().await;
    let mut w = fc
        .watch(
            p.as_str(),
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_progress_notify()
                    .with_watch_id(42),
            ),
        )
        .await
        .expect("watch");
    let got = read_until(&mut w, |r| !r.created() && r.events().is_empty()).await;
    let n = got.last().expect("notification");
    assert_eq!(n.watch_id(), 42);
    assert!(n.header().map(|h| h.revision()).unwrap_or(0) >= rev);
}

/// Many clients on one prefix cost etcd nothing more: every watch is served
/// from the cache (none forwarded), and each gets every event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_share_the_prefix_watch() {
    let ep = common::etcd().to_string();
    let prefix = common::unique_prefix("fanout");
    let p = format!("{prefix}/pods/");
    let front = TestFront::start(&ep, &prefix, |_| {}).await;
    let mut streams = Vec::new();
    for _ in 0..10 {
        let mut c = front.client().await;
        let mut s = c
            .watch(p.as_str(), Some(WatchOptions::new().with_prefix()))
            .await
            .expect("watch");
        for _ in 1..10 {
            s.watch(p.as_str(), Some(WatchOptions::new().with_prefix()))
                .await
                .expect("watch");
        }
        read_created(&mut s, 10).await;
        streams.push(s);
    }
    assert_eq!(
        front.front.watchers(),
        (100, 0),
        "(from the cache, from etcd)"
    );
    let mut ec = Client::connect([ep.as_str()], None).await.expect("etcd");
    let revs = [
        put(&mut ec, &format!("{p}a"), "1").await,
        put(&mut ec, &format!("{p}b"), "2").await,
    ];
    for s in &mut streams {
        let mut seen: HashMap<i64, Vec<i64>> = HashMap::new();
        read_until(s, |r| {
            for e in r.events() {
                seen.entry(r.watch_id())
                    .or_default()
                    .push(e.kv().map(|kv| kv.mod_revision()).unwrap_or(0));
            }
            seen.len() == 10 && seen.values().all(|v| v.len() == 2)
        })
        .await;
        assert!(seen.values().all(|v| v[..] == revs[..]));
    }
    drop(streams);
    let f = Arc::clone(&front.front);
    let gone = common::eventually(WAIT, || {
        let f = Arc::clone(&f);
        async move { f.watchers() == (0, 0) }
    })
    .await;
    assert!(
        gone,
        "closed streams end their watches: {:?}",
        front.front.watchers()
    );
}

/// A watch "from now" starts after etcd's current revision, as etcd's does:
/// a write acknowledged before the watch was created is never delivered,
/// even if the cache had not applied it yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_now_starts_after_acknowledged_writes() {
    let ep = common::etcd().to_string();
    let prefix = common::unique_prefix("fromnow");
    let p = format!("{prefix}/pods/");
    let front = TestFront::start(&ep, &prefix, |_| {}).await;
    let mut fc = front.client().await;
    let mut ec = Client::connect([ep.as_str()], None).await.expect("etcd");
    let filler = vec![b'f'; 8 * 1024];
    for i in 0..20 {
        let key = format!("{p}k{i}");
        // A burst the cache has to take in just before: without the wait
        // for etcd's revision the watch would start behind the write.
        let burst = Txn::new().and_then(
            (0..100)
                .map(|j| TxnOp::put(format!("{p}burst{j}"), filler.clone(), None))
                .collect::<Vec<_>>(),
        );
        ec.txn(burst).await.expect("burst");
        let before = put(&mut ec, &key, "before").await;
        let mut w = fc.watch(key.as_str(), None).await.expect("watch");
        let created = read_until(&mut w, |r| r.created()).await;
        let at = created[0].header().map(|h| h.revision()).unwrap_or(0);
        assert!(
            at >= before,
            "created at {at}, before the write at {before}"
        );
        let after = put(&mut fc, &key, "after").await;
        let got = read_until(&mut w, |r| !r.events().is_empty()).await;
        let first = got
            .iter()
            .flat_map(|r| {
                r.events()
                    .iter()
                    .filter_map(|e| e.kv().map(|kv| kv.mod_revision()))
            })
            .next();
        assert_eq!(
            first,
            Some(after),
            "round {i}: the write before the watch is not delivered"
        );
    }
}

/// A progress answer on a stream of cached watches is at least etcd's
/// revision when the request came, as etcd's own (kube-apiserver's
/// consistent reads from its watch cache wait for that revision), even
/// when the cached prefix is idle and etcd moved on elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_on_an_idle_cached_prefix_reaches_etcds_revision() {
    let ep = common::etcd().to_string();
    let prefix = common::unique_prefix("idleprogress");
    let p = format!("{prefix}/pods/");
    let front = TestFront::start(&ep, &prefix, |_| {}).await;
    let mut fc = front.client().await;
    let mut ec = Client::connect([ep.as_str()], None).await.expect("etcd");
    let mut s = fc
        .watch(p.as_str(), Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch");
    read_created(&mut s, 1).await;
    // Outside every cached prefix: no cache sees this write.
    let written = put(&mut ec, &format!("{prefix}/outside/x"), "1").await;
    s.request_progress().await.expect("progress");
    // A generous bound only as a hang guard: the answer must not wait for
    // the caches' own idle progress either.
    let got = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let r = s
                .message()
                .await
                .expect("watch message")
                .expect("stream open");
            if is_progress(&r) {
                return r.header().map(|h| h.revision()).unwrap_or(0);
            }
        }
    })
    .await
    .expect("a progress answer");
    assert!(
        got >= written,
        "progress answered at {got}, behind etcd's {written} at the request"
    );
}

/// A serializable Range right after the client's own write through the
/// front shows that write, as etcd (one member) does, even when the
/// cache has not applied it yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serializable_get_after_a_write_through_the_front_sees_it() {
    let ep = common::etcd().to_string();
    let prefix = common::unique_prefix("ryw");
    let key = format!("{prefix}/pods/ns/a");
    let front = TestFront::start(&ep, &prefix, |_| {}).await;
    let mut fc = front.client().await;
    let serializable = || Some(etcd_client::GetOptions::new().with_serializable());
    for i in 0..200 {
        let value = format!("v{i}");
        let rev = put(&mut fc, &key, value.as_str()).await;
        let got = fc.get(key.as_str(), serializable()).await.expect("get");
        let seen: Vec<(&[u8], i64)> = got
            .kvs()
            .iter()
            .map(|kv| (kv.value(), kv.mod_revision()))
            .collect();
        assert_eq!(
            seen,
            [(value.as_bytes(), rev)],
            "round {i}: the write at {rev} is missing"
        );
    }
}

/// A serializable Range never answers at a revision older than one the
/// front showed the client, even in an answer that wrote nothing: a Txn
/// whose compare failed carries etcd's current revision, here moved on by
/// writes the cache does not watch (found by `chaos --front grpc
/// --etcd-members 3`, docs/RELIABILITY.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serializable_get_is_not_behind_a_revision_the_front_showed() {
    let ep = common::etcd().to_string();
    let prefix = common::unique_prefix("seen");
    let key = format!("{prefix}/pods/ns/a");
    let front = TestFront::start(&ep, &prefix, |_| {}).await;
    let mut fc = front.client().await;
    let mut ec = Client::connect([ep.as_str()], None).await.expect("etcd");
    put(&mut fc, &key, "v").await;
    let serializable = || Some(etcd_client::GetOptions::new().with_serializable());
    for i in 0..20 {
        // etcd moves on, outside every cached prefix: no event for the cache.
        put(&mut ec, &format!("{prefix}-other/{i}"), "x").await;
        let t = Txn::new()
            .when([Compare::version(key.as_str(), CompareOp::Equal, 999)])
            .and_then([TxnOp::put(key.as_str(), "never", None)]);
        let r = fc.txn(t).await.expect("txn");
        assert!(!r.succeeded());
        let shown = r.header().map(|h| h.revision()).unwrap_or(0);
        let got = fc.get(key.as_str(), serializable()).await.expect("get");
        let at = got.header().map(|h| h.revision()).unwrap_or(0);
        assert!(
            at >= shown,
            "round {i}: read at {at} after the front showed {shown}"
        );
    }
}

/// The front on a 3-member cluster, through a proxy to the leader that a
/// test moves onto `follower`, the member it cuts off.
struct FrontOnCluster {
    cluster: common::EtcdCluster,
    leader: usize,
    follower: usize,
    proxy: common::TcpProxy,
    front: TestFront,
    prefix: String,
}

impl FrontOnCluster {
    async fn start(name: &str) -> FrontOnCluster {
        let cluster = common::EtcdCluster::start().await;
        let leader = cluster.leader().await.expect("a leader");
        let follower = (0..3).find(|&i| i != leader).expect("a follower");
        let proxy = common::TcpProxy::start(cluster.addr(leader)).await;
        let prefix = common::unique_prefix(name);
        let front = TestFront::start(&proxy.endpoint(), &prefix, |_| {}).await;
        FrontOnCluster {
            cluster,
            leader,
            follower,
            proxy,
            front,
            prefix,
        }
    }

    /// Waits until the follower has applied `rev` (etcd refuses a
    /// serializable read at a revision the member has not reached).
    async fn follower_at(&self, rev: i64) {
        let at = common::eventually(WAIT, || {
            let ep = self.cluster.endpoint(self.follower);
            async move {
                let Ok(mut c) = Client::connect([ep], None).await else {
                    return false;
                };
                let opts = etcd_client::GetOptions::new()
                    .with_serializable()
                    .with_revision(rev);
                c.get("/", Some(opts)).await.is_ok()
            }
        })
        .await;
        assert!(at, "the follower applied revision {rev}");
    }

    /// Moves the front's connections to etcd onto the follower.
    async fn front_to_follower(&self) {
        self.proxy.retarget(self.cluster.addr(self.follower)).await;
    }
}

/// A serializable Range the front leaves to etcd, answered by a member
/// behind a revision the front already showed the client, is asked again
/// linearizably: the client gets what etcd answers a linearizable read
/// there, never the older answer. The member here is cut off its peers
/// (a partition of the test's peer proxies) before the cluster takes a
/// write through the front (found by `chaos --front grpc --etcd-members
/// 3`, docs/RELIABILITY.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serializable_get_a_member_answers_behind_a_shown_revision_is_asked_again() {
    let f = FrontOnCluster::start("behind").await;
    let mut fc = f.front.client().await;
    // Outside every cached prefix: etcd answers each read of it.
    let key = format!("{}-uncached/a", f.prefix);
    let serializable = || Some(etcd_client::GetOptions::new().with_serializable());
    let first = put(&mut fc, &key, "v1").await;
    f.follower_at(first).await;
    let mut member = Client::connect([f.cluster.endpoint(f.follower)], None)
        .await
        .expect("client of the member");

    f.cluster.isolate(Some(f.follower));
    let shown = put(&mut fc, &key, "v2").await;
    f.front_to_follower().await;

    // The member serves a serializable read at its own, older revision...
    let stale = member
        .get(key.as_str(), serializable())
        .await
        .expect("a serializable read of the member");
    let at = stale.header().map(|h| h.revision()).unwrap_or(0);
    assert!(
        at < shown,
        "the member answered at {at}, not behind {shown}"
    );
    // ...and a linearizable one not at all; through the front, the
    // serializable read gets that answer.
    let (direct, through) = tokio::join!(
        member.get(key.as_str(), None),
        fc.get(key.as_str(), serializable())
    );
    let direct = status_of(direct);
    match through {
        Ok(r) => panic!(
            "the front answered at {:?} after showing {shown}",
            r.header().map(|h| h.revision())
        ),
        Err(e) => {
            let through = status_of::<()>(Err(e));
            assert_eq!(through.0, direct.0, "front {through:?}, etcd {direct:?}");
        }
    }
    // Healed, the member catches up and the same read is answered.
    f.cluster.isolate(None);
    let healed = common::eventually(Duration::from_secs(60), || {
        let mut fc = fc.clone();
        let key = key.clone();
        async move {
            fc.get(key, serializable())
                .await
                .is_ok_and(|r| r.header().is_some_and(|h| h.revision() >= shown))
        }
    })
    .await;
    assert!(healed, "no answer at {shown} or later after the heal");
}

/// The front's check that a watch's start is not compacted does not take
/// the word of a member behind the cluster. Here the member is cut off
/// before the cluster compacts, so it still serves the compacted revision;
/// asked serializably, it said "not compacted" and the front served the
/// start from its ring. The check is linearizable, which the cut-off member
/// cannot answer, so the watch is left to etcd (found by `chaos --front
/// grpc --etcd-members 3`, docs/RELIABILITY.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_members_word_that_a_start_is_not_compacted_is_not_taken() {
    let f = FrontOnCluster::start("behind-compact").await;
    let p = format!("{}/pods/", f.prefix);
    let mut lc = Client::connect([f.cluster.endpoint(f.leader)], None)
        .await
        .expect("client of the leader");
    let mut revs = Vec::new();
    for i in 0..6 {
        revs.push(put(&mut lc, &format!("{p}k{i}"), "v").await);
    }
    f.front.wait_rev(revs[5]).await;
    f.follower_at(revs[5]).await;

    f.cluster.isolate(Some(f.follower));
    lc.compact(revs[4], None).await.expect("compact");
    f.front_to_follower().await;
    // The cluster refuses the compacted revision; the cut-off member, which
    // missed the compaction, serves it.
    let at = |rev: i64| {
        Some(
            etcd_client::GetOptions::new()
                .with_prefix()
                .with_serializable()
                .with_revision(rev),
        )
    };
    let refused = lc.get(p.as_str(), at(revs[1])).await;
    assert!(refused.is_err(), "{refused:?}");
    let mut member = Client::connect([f.cluster.endpoint(f.follower)], None)
        .await
        .expect("client of the member");
    member
        .get(p.as_str(), at(revs[1]))
        .await
        .expect("the member serves the compacted revision");

    let forwarded = f.front.front.creations_forwarded();
    let mut fc = f.front.client().await;
    let opts = WatchOptions::new()
        .with_prefix()
        .with_start_revision(revs[1]);
    let mut s = fc.watch(p.as_str(), Some(opts)).await.expect("watch");
    let got = read_until(&mut s, |r| !r.events().is_empty() || r.canceled()).await;
    assert_eq!(
        f.front.front.creations_forwarded(),
        forwarded + 1,
        "served from the ring on the cut-off member's word: {got:?}"
    );
}

// ---- etcd auth (`auth enable`) -------------------------------------------

/// A call's error as (gRPC code, message), to compare the front with etcd.
fn status_of<T: std::fmt::Debug>(r: Result<T, etcd_client::Error>) -> (tonic::Code, String) {
    match r {
        Err(etcd_client::Error::GRpcStatus(s)) => (s.code(), s.message().to_string()),
        other => panic!("expected a gRPC error, got {other:?}"),
    }
}

/// Keys and values of a range, or its error (code, message).
type RangeView = Result<Vec<(Vec<u8>, Vec<u8>, i64)>, (tonic::Code, String)>;

async fn range_view(c: &mut Client, prefix: &str) -> RangeView {
    match c
        .get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
        .await
    {
        Ok(r) => Ok(r
            .kvs()
            .iter()
            .map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.mod_revision()))
            .collect()),
        Err(e) => Err(status_of::<()>(Err(e))),
    }
}

/// The first answer to a watch creation: (created, canceled, watch_id,
/// cancel_reason).
async fn watch_creation(c: &mut Client, prefix: &str) -> (bool, bool, i64, String) {
    let mut w = c
        .watch(prefix, Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch stream");
    let r = tokio::time::timeout(WAIT, w.message())
        .await
        .expect("watch answered")
        .expect("watch answer")
        .expect("a watch response");
    (
        r.created(),
        r.canceled(),
        r.watch_id(),
        r.cancel_reason().to_string(),
    )
}

async fn client_as(endpoint: &str, user: Option<(&str, &str)>) -> Client {
    let opts = user.map(|(u, p)| etcd_client::ConnectOptions::new().with_user(u, p));
    Client::connect([endpoint], opts).await.expect("client")
}

/// etcd with `auth enable`: the front answers every caller as etcd does.
/// No token -> etcd's error; a user who may read only `/a` gets `/a` from
/// the cache (Range and Watch) and etcd's refusal for `/b`; root reads
/// everything; the Auth service (etcdctl `--user`, `auth status`, `user
/// list`) passes through; `auth disable`/`enable` through the front
/// switch the checks at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_auth_is_enforced_on_cached_reads_as_etcd_does() {
    let etcd = common::PrivateEtcd::start().await.expect("private etcd");
    let ep = etcd.endpoint();
    let prefix = common::unique_prefix("auth");
    let p = format!("{prefix}/pods/");
    let (pa, pb) = (format!("{p}a/"), format!("{p}b/"));
    let mut c = Client::connect([ep.as_str()], None).await.expect("etcd");
    put(&mut c, &format!("{pa}1"), "a1").await;
    put(&mut c, &format!("{pa}2"), "a2").await;
    put(&mut c, &format!("{pb}1"), "b1").await;
    c.user_add("root", "rootpw", None)
        .await
        .expect("user add root");
    c.user_grant_role("root", "root").await.expect("root role");
    c.user_add("reader", "readpw", None)
        .await
        .expect("user add reader");
    c.role_add("read-a").await.expect("role add");
    c.role_grant_permission(
        "read-a",
        etcd_client::Permission::read(pa.as_str()).with_prefix(),
    )
    .await
    .expect("grant read on /a");
    c.user_grant_role("reader", "read-a")
        .await
        .expect("grant role");
    c.auth_enable().await.expect("auth enable");
    drop(c);

    // The front's own identity: root (its cache lists and watches).
    let front = TestFront::start(&ep, &prefix, |cfg| {
        cfg.etcd.username = Some("root".into());
        cfg.etcd.password = Some(watchcache::config::Password("rootpw".into()));
    })
    .await;
    let fe = front.endpoint();
    let ok = common::eventually(WAIT, || {
        let front = Arc::clone(&front.front);
        async move { front.auth().status() == Some(true) }
    })
    .await;
    assert!(ok, "the front learned that etcd has auth enabled");

    // No token: etcd's own error, Range and Watch.
    let mut anon_e = client_as(&ep, None).await;
    let mut anon_f = client_as(&fe, None).await;
    for range in [&p, &pa] {
        let direct = range_view(&mut anon_e, range).await;
        assert!(direct.is_err(), "etcd refuses a caller without a token");
        assert_eq!(range_view(&mut anon_f, range).await, direct, "{range}");
        let direct = watch_creation(&mut anon_e, range).await;
        assert!(direct.1, "etcd cancels the watch: {direct:?}");
        assert_eq!(watch_creation(&mut anon_f, range).await, direct, "{range}");
    }

    // reader: /a from the cache, /b refused as etcd refuses it.
    let mut rd_e = client_as(&ep, Some(("reader", "readpw"))).await;
    let mut rd_f = client_as(&fe, Some(("reader", "readpw"))).await;
    let a = range_view(&mut rd_e, &pa).await;
    assert_eq!(a.as_ref().map(|v| v.len()), Ok(2), "reader reads /a");
    assert_eq!(range_view(&mut rd_f, &pa).await, a);
    for denied in [&pb, &p] {
        let direct = range_view(&mut rd_e, denied).await;
        assert_eq!(
            direct.as_ref().map_err(|e| e.0),
            Err(tonic::Code::PermissionDenied),
            "{denied}"
        );
        assert_eq!(range_view(&mut rd_f, denied).await, direct, "{denied}");
        let direct = watch_creation(&mut rd_e, denied).await;
        assert!(direct.1, "etcd cancels the watch: {direct:?}");
        assert_eq!(watch_creation(&mut rd_f, denied).await, direct, "{denied}");
    }
    assert_eq!(front.front.watchers(), (0, 0), "refused watches are gone");
    // A watch on /a is served from the cache and gets the next write.
    let mut w = rd_f
        .watch(pa.as_str(), Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch /a");
    let created = read_until(&mut w, |r| r.created()).await;
    assert!(!created[0].canceled(), "reader may watch /a");
    assert_eq!(front.front.watchers(), (1, 0), "served from the cache");
    let mut root_e = client_as(&ep, Some(("root", "rootpw"))).await;
    let rev = put(&mut root_e, &format!("{pa}3"), "a3").await;
    let got = read_until(&mut w, |r| !r.events().is_empty()).await;
    let kv = got[0].events()[0].kv().expect("kv");
    assert_eq!(
        (kv.key(), kv.mod_revision()),
        (format!("{pa}3").as_bytes(), rev)
    );
    front.wait_rev(rev).await;

    // Forwarded calls carry the caller's token: a write by the read-only
    // user is refused as etcd refuses it; root's write goes through.
    let direct = status_of(rd_e.put(format!("{pa}x"), "x", None).await);
    assert_eq!(direct.0, tonic::Code::PermissionDenied);
    assert_eq!(
        status_of(rd_f.put(format!("{pa}x"), "x", None).await),
        direct
    );
    let mut root_f = client_as(&fe, Some(("root", "rootpw"))).await;
    root_f
        .delete(format!("{pa}x"), None)
        .await
        .expect("root deletes through the front");

    // root: everything, as from etcd.
    let all = range_view(&mut root_e, &p).await;
    assert_eq!(all.as_ref().map(|v| v.len()), Ok(4));
    assert_eq!(range_view(&mut root_f, &p).await, all);

    // etcdctl --user, auth status, user list: equal to etcd's.
    let root = ["--user", "root:rootpw"];
    for args in [
        vec!["get", "--prefix", p.as_str()],
        vec!["get", "--prefix", p.as_str(), "-w", "json"],
        vec!["get", "--prefix", pa.as_str(), "--consistency=s"],
        vec!["auth", "status"],
        vec!["user", "list"],
        vec!["role", "get", "read-a"],
    ] {
        let args: Vec<&str> = root.iter().copied().chain(args).collect();
        let direct = etcdctl(&ep, &args, None).await;
        assert!(direct.0, "etcdctl {args:?} against etcd: {}", direct.2);
        assert_eq!(etcdctl(&fe, &args, None).await, direct, "etcdctl {args:?}");
    }
    for args in [
        vec!["--user", "reader:readpw", "get", "--prefix", pa.as_str()],
        vec!["--user", "reader:readpw", "get", "--prefix", pb.as_str()],
        vec!["--user", "reader:wrong", "get", "--prefix", pa.as_str()],
        vec!["get", "--prefix", pa.as_str()],
        vec!["auth", "status"],
    ] {
        // stderr: client-side retry logs (times, addresses), then etcd's
        // error as `Error: ...`, which must be equal.
        let error_line = |o: (bool, String, String)| {
            let err =
                o.2.lines()
                    .filter(|l| l.starts_with("Error:"))
                    .collect::<Vec<_>>()
                    .join("\n");
            (o.0, o.1, err)
        };
        let direct = error_line(etcdctl(&ep, &args, None).await);
        assert_eq!(
            error_line(etcdctl(&fe, &args, None).await),
            direct,
            "etcdctl {args:?}"
        );
    }

    // auth disable / enable through the front: the checks follow at once.
    let out = etcdctl(&fe, &["--user", "root:rootpw", "auth", "disable"], None).await;
    assert!(out.0, "auth disable: {}", out.2);
    assert_eq!(front.front.auth().status(), Some(false), "off at once");
    let open = range_view(&mut anon_f, &p).await;
    assert_eq!(open, range_view(&mut anon_e, &p).await);
    assert_eq!(open.map(|v| v.len()), Ok(4), "anyone reads with auth off");
    let out = etcdctl(&fe, &["--user", "root:rootpw", "auth", "enable"], None).await;
    assert!(out.0, "auth enable: {}", out.2);
    assert_eq!(front.front.auth().status(), Some(true), "on at once");
    let direct = range_view(&mut anon_e, &pa).await;
    assert!(direct.is_err());
    assert_eq!(range_view(&mut anon_f, &pa).await, direct);
}

/// A user permitted only a sub-range (`{p}a/` .. `{p}a0`): every Range and
/// Watch shape (single key, prefix, from-key, explicit range; inside,
/// straddling and outside the permitted range; cached and passed to etcd)
/// is answered through the front exactly as etcd answers it. etcd 3.7.1
/// fixed a from-key watch whose permission check covered only its first
/// key (GHSA-xg4h-6gfc-h4m8); the CI's etcd matrix runs this against 3.6
/// and 3.7 too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_range_permissions_are_enforced_on_every_range_shape_as_etcd_does() {
    let etcd = common::PrivateEtcd::start().await.expect("private etcd");
    let ep = etcd.endpoint();
    let prefix = common::unique_prefix("subrange");
    let p = format!("{prefix}/pods/");
    let (pa, pb) = (format!("{p}a/"), format!("{p}b/"));
    let pa_end = format!("{p}a0");
    let mut c = Client::connect([ep.as_str()], None).await.expect("etcd");
    for (k, v) in [("a/1", "a1"), ("a/2", "a2"), ("b/1", "b1")] {
        put(&mut c, &format!("{p}{k}"), v).await;
    }
    c.user_add("root", "rootpw", None).await.expect("root");
    c.user_grant_role("root", "root").await.expect("root role");
    c.user_add("sub", "subpw", None).await.expect("sub");
    c.role_add("read-sub").await.expect("role");
    c.role_grant_permission(
        "read-sub",
        etcd_client::Permission::read(pa.as_str()).with_range_end(pa_end.as_str()),
    )
    .await
    .expect("grant the sub-range");
    c.user_grant_role("sub", "read-sub").await.expect("grant");
    c.auth_enable().await.expect("auth enable");
    drop(c);
    let front = TestFront::start(&ep, &prefix, |cfg| {
        cfg.etcd.username = Some("root".into());
        cfg.etcd.password = Some(watchcache::config::Password("rootpw".into()));
    })
    .await;
    let ok = common::eventually(WAIT, || {
        let front = Arc::clone(&front.front);
        async move { front.auth().status() == Some(true) }
    })
    .await;
    assert!(ok, "the front learned that etcd has auth enabled");
    let mut direct = client_as(&ep, Some(("sub", "subpw"))).await;
    let mut fronted = client_as(&front.endpoint(), Some(("sub", "subpw"))).await;

    // (name, key, range end: None = the key alone, Some("\0") = from-key)
    let a1 = format!("{pa}1");
    let shapes: Vec<(&str, String, Option<String>)> = vec![
        ("key inside", a1.clone(), None),
        ("key outside", format!("{pb}1"), None),
        ("prefix inside", pa.clone(), Some(pa_end.clone())),
        ("prefix outside", pb.clone(), Some(format!("{p}b0"))),
        ("prefix around", p.clone(), Some(format!("{prefix}/pods0"))),
        ("range inside", a1.clone(), Some(format!("{pa}2"))),
        ("range straddling", a1.clone(), Some(format!("{pb}2"))),
        ("from-key inside", a1.clone(), Some("\0".into())),
        ("from-key before", p.clone(), Some("\0".into())),
    ];
    let mut permitted = 0;
    for (name, key, end) in &shapes {
        let opts = || {
            let o = etcd_client::GetOptions::new();
            match end.as_deref() {
                None => o,
                Some("\0") => o.with_from_key(),
                Some(e) => o.with_range(e),
            }
        };
        let view = |r: Result<etcd_client::GetResponse, etcd_client::Error>| match r {
            Ok(r) => Ok(r
                .kvs()
                .iter()
                .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
                .collect::<Vec<_>>()),
            Err(e) => Err(status_of::<()>(Err(e))),
        };
        let want = view(direct.get(key.as_str(), Some(opts())).await);
        let got = view(fronted.get(key.as_str(), Some(opts())).await);
        assert_eq!(got, want, "Range {name}");
        permitted += usize::from(want.is_ok());
        let wopts = || {
            let o = WatchOptions::new();
            match end.as_deref() {
                None => o,
                Some("\0") => o.with_from_key(),
                Some(e) => o.with_range(e),
            }
        };
        let creation = |c: &mut Client| {
            let (key, o) = (key.clone(), wopts());
            let mut c = c.clone();
            async move {
                let mut w = c.watch(key, Some(o)).await.expect("watch stream");
                let r = tokio::time::timeout(WAIT, w.message())
                    .await
                    .expect("watch answered")
                    .expect("watch answer")
                    .expect("a watch response");
                (r.created(), r.canceled(), r.cancel_reason().to_string())
            }
        };
        let want = creation(&mut direct).await;
        assert_eq!(creation(&mut fronted).await, want, "Watch {name}");
    }
    assert!(
        (1..shapes.len()).contains(&permitted),
        "some shapes permitted, some refused: {permitted} of {}",
        shapes.len()
    );
}

/// A progress request waits for etcd's current revision; while etcd does
/// not answer (SIGSTOP), the stream's other requests go on: a cancel sent
/// after the progress request is answered first, and the progress answer
/// follows once etcd's revision is given up on. (Found by `watchcache-bench
/// chaos --front grpc`: a watch's cancel went unanswered for seconds while
/// etcd was silent, behind its stream's progress requests.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_progress_request_does_not_hold_up_its_stream_while_etcd_is_silent() {
    let etcd = common::PrivateEtcd::start().await.expect("private etcd");
    let ep = etcd.endpoint();
    let prefix = common::unique_prefix("progress-silent");
    let p = format!("{prefix}/pods/");
    let front = TestFront::start(&ep, &prefix, |_| {}).await;
    let mut fc = front.client().await;
    let mut s = fc
        .watch(p.as_str(), Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch");
    s.watch(format!("{p}k"), None).await.expect("watch");
    let created = read_created(&mut s, 2).await;
    let first = created
        .iter()
        .find(|r| r.created())
        .map(|r| r.watch_id())
        .expect("a created watch");
    let pid = etcd.pid().expect("pid") as libc::pid_t;
    // SAFETY: signalling the etcd process this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    s.request_progress().await.expect("progress");
    s.cancel(first).await.expect("cancel");
    let got = read_until(&mut s, is_progress).await;
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let order: Vec<&str> = got
        .iter()
        .filter_map(|r| {
            if r.canceled() && r.watch_id() == first {
                Some("canceled")
            } else if is_progress(r) {
                Some("progress")
            } else {
                None
            }
        })
        .collect();
    assert_eq!(order, ["canceled", "progress"], "{got:?}");
    drop(etcd);
}

/// A watch from a revision still in the front's ring but compacted in etcd
/// is left to etcd when etcd does not answer the front's compaction check
/// (it was served from the ring, compacted history and all, when the check
/// failed instead of answering), and is canceled as compacted once etcd is
/// back. (Found by `watchcache-bench chaos --front grpc`: watches from
/// compacted revisions streamed events after etcd was cut off and back.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_a_compacted_revision_is_not_served_while_etcd_is_down() {
    let mut etcd = common::PrivateEtcd::start().await.expect("private etcd");
    let ep = etcd.endpoint();
    let prefix = common::unique_prefix("compact-down");
    let p = format!("{prefix}/pods/");
    let front = TestFront::start(&ep, &prefix, |_| {}).await;
    let mut ec = Client::connect([ep.as_str()], None).await.expect("etcd");
    let mut revs = Vec::new();
    for i in 0..5 {
        revs.push(put(&mut ec, &format!("{p}k{i}"), format!("{i}")).await);
    }
    front.wait_rev(revs[4]).await;
    ec.compact(revs[3], None).await.expect("compact");
    let mut fc = front.client().await;
    etcd.kill();
    let opts = || {
        WatchOptions::new()
            .with_prefix()
            .with_start_revision(revs[1])
    };
    // While etcd is down: no event (none of the compacted history).
    let mut events = 0;
    if let Ok(Ok(mut s)) =
        tokio::time::timeout(Duration::from_secs(5), fc.watch(p.as_str(), Some(opts()))).await
    {
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while let Ok(Some(r)) = s.message().await {
                events += r.events().len();
            }
        })
        .await;
    }
    assert_eq!(events, 0, "no event from a compacted revision");
    etcd.restart().await.expect("etcd back");
    // Back: etcd's answer, a cancel with its compaction revision.
    let mut fc = front.client().await;
    let mut s = fc.watch(p.as_str(), Some(opts())).await.expect("watch");
    let got = read_until(&mut s, |r| r.canceled()).await;
    assert!(got.iter().all(|r| r.events().is_empty()), "{got:?}");
    assert_eq!(got.last().map(|r| r.compact_revision()), Some(revs[3]));
}

/// What a client reads of a watch from a compacted revision, up to its
/// cancel: per response (created, canceled, compact_revision, header
/// revision, events).
async fn compacted_watch_view(
    c: &mut Client,
    key: &str,
    opts: WatchOptions,
) -> Vec<(bool, bool, i64, i64, usize)> {
    let mut s = c.watch(key, Some(opts)).await.expect("watch");
    read_until(&mut s, |r| r.canceled())
        .await
        .iter()
        .map(|r| {
            (
                r.created(),
                r.canceled(),
                r.compact_revision(),
                r.header().map(|h| h.revision()).unwrap_or(-1),
                r.events().len(),
            )
        })
        .collect()
}

/// A watch from below etcd's compaction is answered by the front itself,
/// exactly as etcd answers it (`created` at etcd's revision, then a cancel
/// with etcd's compact revision, no events), cached range or not, without
/// passing the creation on: a member that froze between its `created` and
/// its sync loop's cancel left such a watch with neither. (Found by the
/// soak of `watchcache-bench chaos --front grpc --etcd-members 3`.) A
/// watch with prev_kv from the compact revision itself is still etcd's to
/// serve (its events there have no prev_kv).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_a_compacted_revision_is_answered_by_the_front_as_etcd_answers() {
    let etcd = common::PrivateEtcd::start().await.expect("private etcd");
    let ep = etcd.endpoint();
    let prefix = common::unique_prefix("compact-self");
    let p = format!("{prefix}/pods/");
    let uncached = format!("{prefix}-other/x");
    let front = TestFront::start(&ep, &prefix, |_| {}).await;
    let mut ec = Client::connect([ep.as_str()], None).await.expect("etcd");
    let mut revs = Vec::new();
    for i in 0..12 {
        revs.push(put(&mut ec, &format!("{p}k{i}"), format!("{i}")).await);
        revs.push(put(&mut ec, &uncached, format!("{i}")).await);
    }
    front.wait_rev(revs[23]).await;
    // An odd compact revision, nowhere near either end.
    let compact = revs[13];
    ec.compact(compact, None).await.expect("compact");
    let mut fc = front.client().await;
    let forwarded = front.front.creations_forwarded();
    for (key, opts) in [
        (
            p.as_str(),
            WatchOptions::new()
                .with_prefix()
                .with_start_revision(revs[1]),
        ),
        (
            p.as_str(),
            WatchOptions::new()
                .with_prefix()
                .with_prev_key()
                .with_start_revision(compact - 1),
        ),
        (
            uncached.as_str(),
            WatchOptions::new().with_start_revision(revs[2]),
        ),
    ] {
        let via = compacted_watch_view(&mut fc, key, opts.clone()).await;
        let direct = compacted_watch_view(&mut ec, key, opts).await;
        assert_eq!(via, direct, "{key}");
        assert_eq!(
            via.last().map(|r| (r.1, r.2, r.4)),
            Some((true, compact, 0)),
            "{key}"
        );
    }
    assert_eq!(
        front.front.creations_forwarded(),
        forwarded,
        "no creation passed on to etcd"
    );
    // From the compact revision itself with prev_kv: etcd serves it.
    let opts = WatchOptions::new()
        .with_prefix()
        .with_prev_key()
        .with_start_revision(compact);
    let mut s = fc.watch(p.as_str(), Some(opts)).await.expect("watch");
    let got = read_until(&mut s, |r| !r.events().is_empty()).await;
    assert!(got.iter().all(|r| !r.canceled()), "{got:?}");
    assert_eq!(front.front.creations_forwarded(), forwarded + 1);
    drop(etcd);
}

//! Clients cannot hold the server hostage (issue 16): a connection that
//! sends nothing, an HTTP/2 preface sent a byte at a time, idle keep-alive
//! connections, more connections than the cap, and watches whose client
//! stops reading. Short real timeouts are configured; nothing asserts how
//! fast something happened, only that it happened.
mod common;
use common::server as api_support;

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use api_support::TestServer;

/// Generous bound for "eventually"; the limits under test are far shorter.
const BOUND: Duration = Duration::from_secs(20);

/// A client without a connection pool: with short idle timeouts a pooled
/// connection may be closed under a request.
fn fresh_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(BOUND)
        .build()
        .expect("http client")
}

/// The value of one `/metrics` sample (0 when absent). The registry is
/// process-wide: tests only look at labels they own, or at increases.
async fn metric(ts: &TestServer, sample: &str) -> f64 {
    let http = fresh_client();
    let prefix = format!("{sample} ");
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        // Retried: a test with a low connection cap may be at it.
        if let Ok(r) = http.get(ts.url("/metrics")).send().await
            && let Ok(text) = r.text().await
        {
            return text
                .lines()
                .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
                .unwrap_or(0.0);
        }
        assert!(tokio::time::Instant::now() < deadline, "/metrics answers");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads until the peer closes (EOF or reset); returns what was read, or
/// None if the connection is still open after `bound`.
async fn read_until_closed(s: &mut TcpStream, bound: Duration) -> Option<Vec<u8>> {
    let mut all = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    tokio::time::timeout(bound, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => all.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .ok()?;
    Some(all)
}

/// Sends one HTTP/1.1 keep-alive GET and reads its (small, non-chunked)
/// response; returns the response text, or None if the connection closed first.
async fn keep_alive_get(s: &mut TcpStream, path: &str) -> Option<String> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(BOUND, s.read(&mut buf))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if body.len() >= len {
                return Some(text.into_owned());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_nothing_is_closed() {
    let ts = TestServer::start("silent", |c| c.server.header_read_timeout_ms = 300).await;
    const CLOSED: &str =
        r#"watchcache_api_connections_closed_total{reason="first_request_timeout"}"#;
    let before = metric(&ts, CLOSED).await;
    let mut s = TcpStream::connect(ts.addr).await.unwrap();
    let got = read_until_closed(&mut s, BOUND)
        .await
        .expect("the server closed a connection that sent nothing");
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    assert!(metric(&ts, CLOSED).await > before);
    // A client that does send its request in time is served.
    let mut s = TcpStream::connect(ts.addr).await.unwrap();
    let resp = keep_alive_get(&mut s, "/healthz").await.expect("served");
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
}

/// A request whose body never arrives gets 408 and its HTTP/1.1
/// connection is closed, instead of holding it (and its task) for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_that_never_arrives_times_out() {
    let ts = TestServer::start("slowbody", |c| c.server.request_body_timeout_ms = 300).await;
    let before = ts.etcd_dump().await;
    let mut s = TcpStream::connect(ts.addr).await.unwrap();
    s.write_all(
        b"POST /api/v1/namespaces/ns1/pods HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"kind\":",
    )
    .await
    .unwrap();
    let got = read_until_closed(&mut s, BOUND)
        .await
        .expect("answered and closed");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("did not arrive"), "{text}");
    assert_eq!(ts.etcd_dump().await, before, "nothing written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_preface_sent_a_byte_at_a_time_is_closed() {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let ts = TestServer::start("slowpreface", |c| c.server.header_read_timeout_ms = 300).await;
    let s = TcpStream::connect(ts.addr).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    // Keep the connection busy, one byte every 500 ms, never completing
    // the preface: an inactivity timer would never fire.
    let trickle = tokio::spawn(async move {
        let mut sent = 0;
        for b in &PREFACE[..PREFACE.len() - 1] {
            if wr.write_all(&[*b]).await.is_err() {
                break;
            }
            sent += 1;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // Hold the write half (and the connection) open.
        tokio::time::sleep(BOUND).await;
        drop(wr);
        sent
    });
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(BOUND, async {
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the server closed the slow-preface connection"
    );
    assert!(
        !trickle.is_finished(),
        "closed while the preface was still arriving"
    );
    trickle.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_but_busy_ones_are_not() {
    let ts = TestServer::start("idle", |c| c.server.idle_timeout_ms = 300).await;
    const CLOSED: &str = r#"watchcache_api_connections_closed_total{reason="idle_timeout"}"#;
    let before = metric(&ts, CLOSED).await;
    // A keep-alive connection, used once, then left idle.
    let mut s = TcpStream::connect(ts.addr).await.unwrap();
    let resp = keep_alive_get(&mut s, "/healthz").await.expect("served");
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    let rest = read_until_closed(&mut s, BOUND)
        .await
        .expect("the server closed the idle connection");
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
    assert!(metric(&ts, CLOSED).await > before);

    // A connection with a watch in flight is not idle, however quiet.
    let mut w = TcpStream::connect(ts.addr).await.unwrap();
    w.write_all(b"GET /api/v1/namespaces/ns1/pods?watch=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let r = fresh_client()
        .post(ts.url("/api/v1/namespaces/ns1/pods"))
        .header("Content-Type", "application/json")
        .body(api_support::pod("ns1", "late").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let seen = tokio::time::timeout(BOUND, async {
        while !String::from_utf8_lossy(&got).contains("\"late\"") {
            match w.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        true
    })
    .await;
    assert_eq!(
        seen,
        Ok(true),
        "the quiet watch stayed open: {}",
        String::from_utf8_lossy(&got)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http2_connections_are_closed() {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let ts = TestServer::start("idleh2", |c| c.server.idle_timeout_ms = 300).await;
    let tcp = TcpStream::connect(ts.addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .expect("h2 handshake");
    let conn = tokio::spawn(conn);
    let req = hyper::Request::get(ts.url("/healthz"))
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.expect("h2 request");
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"ok");
    // The client keeps the connection; the server ends it once idle (GOAWAY).
    let ended = tokio::time::timeout(BOUND, conn).await;
    assert!(
        ended.is_ok(),
        "the server closed the idle HTTP/2 connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_are_refused_and_counted() {
    // The harness's own pooled connection goes idle and is closed quickly;
    // the two watch connections below stay busy and hold the cap.
    let ts = TestServer::start("conncap", |c| {
        c.server.max_connections = 2;
        c.server.idle_timeout_ms = 200;
    })
    .await;
    const REFUSED: &str = "watchcache_api_connections_refused_total";
    let before = metric(&ts, REFUSED).await;
    let watch = b"GET /api/v1/namespaces/ns1/pods?watch=1 HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut held = Vec::new();
    let deadline = tokio::time::Instant::now() + BOUND;
    while held.len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "watch connection {} accepted",
            held.len() + 1
        );
        let Ok(mut s) = TcpStream::connect(ts.addr).await else {
            continue;
        };
        if s.write_all(watch).await.is_err() {
            continue;
        }
        let mut buf = [0u8; 12];
        match tokio::time::timeout(BOUND, s.read_exact(&mut buf)).await {
            Ok(Ok(_)) if buf.starts_with(b"HTTP/1.1 200") => held.push(s),
            // Refused while the harness's idle connection held a slot.
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    // Both slots are held: the next connection is closed at once, unserved.
    let mut s = TcpStream::connect(ts.addr).await.unwrap();
    let _ = s
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let got = read_until_closed(&mut s, BOUND)
        .await
        .expect("the refused connection was closed");
    assert!(
        !String::from_utf8_lossy(&got).contains("HTTP/1.1"),
        "refused connections are not served: {}",
        String::from_utf8_lossy(&got)
    );
    // Releasing a slot lets new connections in again.
    drop(held.pop());
    let ok = common::eventually(BOUND, || async {
        let Ok(mut s) = TcpStream::connect(ts.addr).await else {
            return false;
        };
        keep_alive_get(&mut s, "/healthz")
            .await
            .is_some_and(|r| r.starts_with("HTTP/1.1 200"))
    })
    .await;
    assert!(ok, "a freed slot serves again");
    assert!(metric(&ts, REFUSED).await > before);
    drop(held);
}

/// Starts a server whose widgets resource is called `plural` (so its
/// per-resource metrics belong to this test alone), with `tweak` applied.
async fn server_with_own_resource(
    name: &str,
    plural: &'static str,
    tweak: impl FnOnce(&mut watchcache::config::Config),
) -> TestServer {
    TestServer::start(name, move |c| {
        for r in &mut c.resources {
            if r.plural == "widgets" {
                r.plural = plural.to_string();
            }
        }
        tweak(c);
    })
    .await
}

/// Opens a watch on a socket with a tiny receive buffer and never reads it.
async fn stalled_watch(ts: &TestServer, path: &str) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut s = sock.connect(ts.addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    s
}

/// Writes about 8 MB of widgets through the API, far more than the
/// connection's buffers hold.
async fn write_widgets(ts: &TestServer, plural: &str) {
    let path = format!("/apis/example.com/v1/namespaces/ns1/{plural}");
    let blob = "x".repeat(80_000);
    for i in 0..100 {
        let obj = json!({"metadata": {"name": format!("w{i}")}, "spec": {"blob": blob}});
        let (c, v) = ts.post_json(&path, &obj).await;
        assert_eq!(c, 201, "{v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_whose_client_stops_reading_ends_at_timeout_seconds() {
    const PLURAL: &str = "stalledwidgets";
    // No buffered-bytes cut-off here: only the deadline can end this watch.
    let ts = server_with_own_resource("stalledwatch", PLURAL, |c| {
        c.server.watch_max_buffered_bytes = 1 << 30;
    })
    .await;
    let watchers = format!(r#"watchcache_watchers{{resource="{PLURAL}"}}"#);
    let timeouts =
        format!(r#"watchcache_terminated_watchers_total{{reason="timeout",resource="{PLURAL}"}}"#);
    const STALLED: &str = r#"watchcache_api_connections_closed_total{reason="stalled_watch"}"#;
    let stalled_before = metric(&ts, STALLED).await;
    // The initial events alone are far more than the connection buffers.
    write_widgets(&ts, PLURAL).await;
    let mut s = stalled_watch(
        &ts,
        &format!("/apis/example.com/v1/namespaces/ns1/{PLURAL}?watch=1&timeoutSeconds=2"),
    )
    .await;
    // Ended at its timeoutSeconds although the client reads nothing: the
    // watcher is freed and counted as timed out.
    let freed = common::eventually(BOUND, || async {
        metric(&ts, &watchers).await == 0.0 && metric(&ts, &timeouts).await >= 1.0
    })
    .await;
    assert!(freed, "the stalled watcher was ended and freed");
    // Its end cannot be written to a socket nobody reads: the connection
    // is closed (HTTP/1.1), and the client reads to its end.
    let closed = common::eventually(BOUND, || async {
        metric(&ts, STALLED).await > stalled_before
    })
    .await;
    assert!(closed, "the stalled connection was closed");
    let got = read_until_closed(&mut s, BOUND)
        .await
        .expect("the stalled watch's connection was closed");
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_leaves_too_much_unread_is_cut_off_and_can_resume() {
    const PLURAL: &str = "cutwidgets";
    let ts = server_with_own_resource("cutwatch", PLURAL, |c| {
        c.server.watch_max_buffered_bytes = 64 * 1024;
    })
    .await;
    let watchers = format!(r#"watchcache_watchers{{resource="{PLURAL}"}}"#);
    let cut = format!(
        r#"watchcache_terminated_watchers_total{{reason="unresponsive",resource="{PLURAL}"}}"#
    );
    let base = format!("/apis/example.com/v1/namespaces/ns1/{PLURAL}");
    let mut s = stalled_watch(&ts, &format!("{base}?watch=1&timeoutSeconds=600")).await;
    let registered =
        common::eventually(BOUND, || async { metric(&ts, &watchers).await == 1.0 }).await;
    assert!(registered, "the watcher is registered");
    write_widgets(&ts, PLURAL).await;
    let ended = common::eventually(BOUND, || async {
        metric(&ts, &cut).await >= 1.0 && metric(&ts, &watchers).await == 0.0
    })
    .await;
    assert!(ended, "the unresponsive watcher was cut off and freed");
    // The client sees its stream end, long before timeoutSeconds...
    let got = read_until_closed(&mut s, BOUND)
        .await
        .expect("the cut-off watch's connection ended");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"));
    // ...and resumes from the last resourceVersion it received.
    // (The last occurrence may be cut short by the closed connection.)
    let last_rv: i64 = text
        .rsplit("\"resourceVersion\":\"")
        .filter_map(|t| t.split_once('"')?.0.parse().ok())
        .next()
        .expect("the client received at least one event");
    let resp = ts
        .http
        .get(ts.url(&format!(
            "{base}?watch=1&resourceVersion={last_rv}&timeoutSeconds=1"
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.text().await.unwrap();
    for line in body.lines() {
        let ev: Value = serde_json::from_str(line).expect("event line");
        assert_ne!(ev["type"], "ERROR", "resumable from {last_rv}: {ev}");
    }
}

/// Opens a watch on a socket with a small receive buffer and reads it
/// steadily but slower than the server produces (a client on a slow link),
/// until `until` appears in the stream; returns everything read.
async fn slow_reader(
    ts: &TestServer,
    path: &str,
    until: String,
) -> tokio::task::JoinHandle<String> {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut s = sock.connect(ts.addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    tokio::spawn(async move {
        let mut all: Vec<u8> = Vec::new();
        let mut buf = vec![0u8; 8192];
        // Megabytes at 2 ms per small read: a deadline of its own, well
        // above what a slow machine needs, not the per-read BOUND.
        let deadline = tokio::time::Instant::now() + 3 * BOUND;
        let needle = until.as_bytes();
        loop {
            assert!(tokio::time::Instant::now() < deadline, "{until} arrived");
            let n = match tokio::time::timeout(BOUND, s.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => n,
                other => panic!(
                    "the stream ended before {until} ({other:?}) after {} bytes",
                    all.len()
                ),
            };
            // Only the new bytes (and a needle's length before them) can
            // complete a match: no rescan of megabytes per read.
            let from = all.len().saturating_sub(needle.len());
            all.extend_from_slice(&buf[..n]);
            if all[from..].windows(needle.len()).any(|w| w == needle) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        String::from_utf8_lossy(&all).into_owned()
    })
}

/// Puts a ~2 KB widget straight into etcd; returns the revision.
async fn put_widget(
    ts: &TestServer,
    etcd: &mut etcd_client::Client,
    plural: &str,
    name: &str,
) -> i64 {
    let key = format!(
        "{}/example.com/{plural}/ns1/{name}",
        ts.prefix.trim_end_matches('/')
    );
    let value = json!({
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": "ns1"},
        "spec": {"blob": "x".repeat(2_000)},
    });
    common::etcd_put(etcd, key, value.to_string()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_events_and_replays_larger_than_the_cap_are_not_cut_off() {
    const PLURAL: &str = "burstwidgets";
    let ts = server_with_own_resource("burst", PLURAL, |c| {
        c.server.watch_max_buffered_bytes = 16 * 1024;
        for r in &mut c.resources {
            r.history_capacity = Some(5_000);
        }
    })
    .await;
    let mut etcd = ts.etcd.clone();
    let watchers = format!(r#"watchcache_watchers{{resource="{PLURAL}"}}"#);
    let cut = format!(
        r#"watchcache_terminated_watchers_total{{reason="unresponsive",resource="{PLURAL}"}}"#
    );
    let base = format!("/apis/example.com/v1/namespaces/ns1/{PLURAL}");
    // About 2.4 MB of state in several initial-event pages, 150 times the cap.
    let start_rv = ts.etcd_revision().await;
    for i in 0..1200 {
        put_widget(&ts, &mut etcd, PLURAL, &format!("o{i:04}")).await;
    }
    let gauge_is = |n: f64| {
        let (ts, watchers) = (&ts, &watchers);
        async move {
            let ok = common::eventually(BOUND, || async { metric(ts, watchers).await == n }).await;
            assert!(ok, "{watchers} reached {n}");
        }
    };
    // Initial events (no resourceVersion), then a live event, read by a
    // client on a slow link.
    let reader = slow_reader(
        &ts,
        &format!("{base}?watch=1"),
        "\"name\":\"live-0\"".into(),
    )
    .await;
    gauge_is(1.0).await;
    put_widget(&ts, &mut etcd, PLURAL, "live-0").await;
    let text = reader.await.unwrap();
    assert_eq!(text.matches("\"type\":\"ADDED\"").count(), 1201);
    gauge_is(0.0).await;
    // A replay of the history from before the objects, with live events
    // arriving while the client still downloads it.
    let reader = slow_reader(
        &ts,
        &format!("{base}?watch=1&resourceVersion={start_rv}"),
        "\"name\":\"live-20\"".into(),
    )
    .await;
    gauge_is(1.0).await;
    for i in 1..=20 {
        put_widget(&ts, &mut etcd, PLURAL, &format!("live-{i}")).await;
    }
    let text = reader.await.unwrap();
    assert_eq!(text.matches("\"type\":\"ADDED\"").count(), 1221);
    assert!(!text.contains("\"type\":\"ERROR\""));
    assert_eq!(
        metric(&ts, &cut).await,
        0.0,
        "no reading client was cut off"
    );
}

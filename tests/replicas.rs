//! Replicas are interchangeable: two daemons in front of one etcd. A List on
//! A followed by a watch on B from that List's resourceVersion sees every
//! later change exactly once, and a B that lags (stopped, then resumed)
//! makes a consistent read wait for it instead of returning older data.
mod common;

use std::time::Duration;

use common::Daemon;
use futures::StreamExt;
use serde_json::{Value, json};

const PODS: &str = "/api/v1/namespaces/ns1/pods";
const WAIT: Duration = Duration::from_secs(30);

fn pod(name: &str, generation: u64) -> Value {
    json!({"apiVersion":"v1","kind":"Pod",
        "metadata":{"name":name,"namespace":"ns1"},
        "spec":{"nodeName":"n1"},"status":{"gen":generation}})
}

async fn post(client: &reqwest::Client, d: &Daemon, body: &Value) -> Value {
    let r = client
        .post(d.url(PODS))
        .json(body)
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 201);
    r.json().await.expect("json")
}

fn rv(obj: &Value) -> i64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("resourceVersion")
}

/// Reads watch events from a chunked JSON-lines body until the object named
/// `last` arrives (or `WAIT` passes): a duplicate or a stray event before it
/// would show in the result.
async fn read_events(resp: reqwest::Response, last: &str) -> Vec<(String, String, i64)> {
    let mut stream = resp.bytes_stream();
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while out.last().is_none_or(|(_, name, _)| name != last) {
        let chunk = match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(Ok(c))) => c,
            _ => break,
        };
        buf.extend_from_slice(&chunk);
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let v: Value = serde_json::from_slice(&line).expect("event line");
            let ty = v["type"].as_str().unwrap_or("").to_string();
            if ty == "BOOKMARK" {
                continue;
            }
            let name = v["object"]["metadata"]["name"]
                .as_str()
                .unwrap_or("")
                .to_string();
            out.push((ty, name, rv(&v["object"])));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_on_one_replica_then_watch_on_the_other_sees_every_change_once() {
    let prefix = common::unique_prefix("replicas");
    let a = Daemon::start_default(common::etcd(), &prefix).await;
    let b = Daemon::start_default(common::etcd(), &prefix).await;
    // Both caches listed (healthz does not wait for them).
    a.wait_ready().await;
    b.wait_ready().await;
    let client = reqwest::Client::new();
    for i in 0..5 {
        post(&client, &a, &pod(&format!("before-{i}"), 0)).await;
    }
    let list: Value = client
        .get(a.url(PODS))
        .send()
        .await
        .expect("list on A")
        .json()
        .await
        .expect("json");
    assert_eq!(list["items"].as_array().map(Vec::len), Some(5));
    let list_rv = rv(&list);
    // Writes after the List, through both replicas.
    let mut written = Vec::new();
    for i in 0..6 {
        let via = if i % 2 == 0 { &a } else { &b };
        let o = post(&client, via, &pod(&format!("after-{i}"), 1)).await;
        written.push((format!("after-{i}"), rv(&o)));
    }
    let watch = client
        .get(b.url(&format!("{PODS}?watch=1&resourceVersion={list_rv}")))
        .send()
        .await
        .expect("watch on B");
    assert_eq!(watch.status(), 200);
    let events = read_events(watch, "after-5").await;
    let want: Vec<(String, String, i64)> = written
        .iter()
        .map(|(n, r)| ("ADDED".to_string(), n.clone(), *r))
        .collect();
    assert_eq!(events, want, "every later change exactly once, in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_waits_instead_of_serving_older_data() {
    let prefix = common::unique_prefix("replicas-lag");
    let a = Daemon::start_default(common::etcd(), &prefix).await;
    let b = Daemon::start_default(common::etcd(), &prefix).await;
    // Both caches listed (healthz does not wait for them).
    a.wait_ready().await;
    b.wait_ready().await;
    let client = reqwest::Client::new();
    let first = post(&client, &a, &pod("p", 0)).await;
    // B is frozen while the object changes through A.
    // SAFETY: kill(2) on the test's own child process.
    unsafe {
        libc::kill(b.pid() as libc::pid_t, libc::SIGSTOP);
    }
    let mut cur = first;
    for g in 1..=3 {
        let mut next = cur.clone();
        next["status"]["gen"] = json!(g);
        let r = client
            .put(a.url(&format!("{PODS}/p")))
            .json(&next)
            .send()
            .await
            .expect("update");
        assert_eq!(r.status(), 200);
        cur = r.json().await.expect("json");
    }
    let newest = rv(&cur);
    // The read is sent while B is stopped, then B resumes: its consistent
    // read must not answer from the state it had when it stopped.
    let get = {
        let client = client.clone();
        let url = b.url(&format!("{PODS}/p"));
        tokio::spawn(async move { client.get(url).send().await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // SAFETY: as above.
    unsafe {
        libc::kill(b.pid() as libc::pid_t, libc::SIGCONT);
    }
    let resp = tokio::time::timeout(WAIT, get)
        .await
        .expect("answered")
        .expect("task")
        .expect("get on B");
    assert_eq!(resp.status(), 200);
    let got: Value = resp.json().await.expect("json");
    assert_eq!(got["status"]["gen"], 3, "the newest state: {got}");
    assert_eq!(rv(&got), newest);
    // And a consistent List on B right after says the same.
    let list: Value = client
        .get(b.url(PODS))
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    assert!(rv(&list) >= newest);
    assert_eq!(list["items"][0]["status"]["gen"], 3);
}

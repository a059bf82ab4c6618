//! etcd's own clients against the gRPC front, differentially (issue
//! "kube-apiserver as the oracle"): etcd's Go client clientv3 3.6 and 3.7
//! (tests/clients/go/etcdclient, built by `scripts/clients.sh`) and
//! etcdctl 3.5 (tools/), 3.6 and 3.7 (`scripts/peers.sh`) run the same
//! sequence once against a fresh etcd directly and once through the front
//! over another fresh etcd; the outputs must be equal after masking only
//! what differs between two etcds by nature: cluster and member ids, lease
//! ids, ports, and the times in a lease's remaining TTL and a health
//! check's `took` (and, in `endpoint status`, the raft indexes and database
//! sizes, which the front's own requests to etcd move: see README's gRPC
//! front section).

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use common::front::TestFront;

const WAIT: Duration = Duration::from_secs(20);
/// The resources' key prefix: the front caches `/ec/pods/` (and the other
/// test resources); `/ec/other/` is outside every cached prefix.
const PREFIX: &str = "/ec";
const CACHED: &str = "/ec/pods/ns/";
const OTHER: &str = "/ec/other/";

/// One differential run at a time: two etcds and a front each.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What one side's outputs are masked with: (text, placeholder).
#[derive(Default)]
struct Mask(Vec<(String, String)>);

impl Mask {
    fn id(&mut self, id: u64, name: &str) {
        if id != 0 {
            self.0.push((id.to_string(), format!("<{name}>")));
            self.0.push((format!("{id:016x}"), format!("<{name}>")));
            self.0.push((format!("{id:x}"), format!("<{name}>")));
        }
    }

    fn apply(&self, text: &str) -> String {
        let mut s = text.to_string();
        for (from, to) in &self.0 {
            s = s.replace(from.as_str(), to);
        }
        // A remaining TTL and a health check's duration are times.
        s = mask_between(&s, "remaining(", ")");
        mask_between(&s, "\"took\":\"", "\"")
    }
}

fn mask_between(s: &str, open: &str, close: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find(open) {
        out.push_str(&rest[..i + open.len()]);
        rest = &rest[i + open.len()..];
        let end = rest.find(close).unwrap_or(rest.len());
        out.push_str("<time>");
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// A fresh etcd, the endpoint its clients use (its own or a front's over
/// it), and the masks of its ids and addresses.
struct Side {
    _etcd: common::PrivateEtcd,
    _front: Option<TestFront>,
    endpoint: String,
    mask: Mask,
}

impl Side {
    async fn start(through_front: bool) -> Side {
        let etcd = common::PrivateEtcd::start().await.expect("private etcd");
        let mut c = etcd_client::Client::connect([etcd.endpoint()], None)
            .await
            .expect("etcd client");
        let members = c.member_list().await.expect("member list");
        let mut mask = Mask::default();
        if let Some(h) = members.header() {
            mask.id(h.cluster_id(), "cluster-id");
            mask.id(h.member_id(), "member-id");
        }
        for m in members.members() {
            for url in m.peer_urls() {
                mask.0.push((url.clone(), "<peer-url>".into()));
            }
            for url in m.client_urls() {
                mask.0.push((url.clone(), "<client-url>".into()));
            }
        }
        let (front, endpoint) = if through_front {
            let front = TestFront::start(&etcd.endpoint(), PREFIX, |_| {}).await;
            let ep = format!("http://{}", front.addr);
            mask.0.push((ep.clone(), "<client-url>".into()));
            (Some(front), ep)
        } else {
            (None, etcd.endpoint())
        };
        Side {
            _etcd: etcd,
            _front: front,
            endpoint,
            mask,
        }
    }
}

/// The clientv3 program of this version: `scripts/clients.sh` builds it
/// when it is not cached yet and prints "NAME PATH".
fn clientv3_binary(version: &str) -> PathBuf {
    let name = format!("etcdclient-{version}");
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new("bash")
        .arg(format!("{root}/scripts/clients.sh"))
        .arg(&name)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/clients.sh");
    assert!(out.status.success(), "scripts/clients.sh {name} failed");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let path = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .expect("the client's path");
    PathBuf::from(path.trim())
}

/// A run's exit, stdout and stderr without the client's JSON log lines
/// (they carry times and local ports).
#[derive(Debug, PartialEq)]
struct Output {
    success: bool,
    stdout: String,
    stderr: String,
}

fn without_logs(stderr: &[u8]) -> String {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter(|l| !l.trim_start().starts_with('{'))
        .map(|l| format!("{l}\n"))
        .collect()
}

async fn run(bin: &Path, args: &[String], stdin: Option<&str>) -> Output {
    let mut child = tokio::process::Command::new(bin)
        .env_remove("ETCDCTL_API")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the client");
    let mut input = child.stdin.take().expect("stdin");
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).await.expect("write stdin");
    }
    drop(input);
    let out = tokio::time::timeout(Duration::from_secs(90), child.wait_with_output())
        .await
        .expect("the client finished")
        .expect("the client's output");
    Output {
        success: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: without_logs(&out.stderr),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clientv3_3_6_through_the_front_equals_etcd() {
    clientv3_differential("3.6").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clientv3_3_7_through_the_front_equals_etcd() {
    clientv3_differential("3.7").await;
}

/// The clientv3 scenario's transcripts (see its main.go) are equal, step
/// by step, directly and through the front.
async fn clientv3_differential(version: &str) {
    let bin = clientv3_binary(version);
    let _one = ONE_AT_A_TIME.lock().await;
    let mut transcripts = Vec::new();
    for through_front in [false, true] {
        let side = Side::start(through_front).await;
        let args = [
            "--endpoint",
            side.endpoint.as_str(),
            "--prefix",
            CACHED,
            "--other",
            OTHER,
        ]
        .map(String::from);
        let out = run(&bin, &args, None).await;
        assert!(
            out.success,
            "clientv3 {version} scenario (front: {through_front}): {}",
            out.stderr
        );
        transcripts.push(side.mask.apply(&out.stdout));
    }
    let (direct, via) = (&transcripts[0], &transcripts[1]);
    assert!(direct.lines().count() > 50, "a whole transcript: {direct}");
    // The scenario did what it says against etcd: every watch got its
    // events, and the compacted revision was refused to reads and watches.
    let step = |name: &str| {
        let tag = format!("\"step\":\"{name}\"");
        direct
            .lines()
            .find(|l| l.contains(&tag))
            .unwrap_or_else(|| panic!("step {name} in {direct}"))
            .to_string()
    };
    assert!(!direct.contains("context deadline exceeded"), "{direct}");
    assert!(step("get before compaction").contains("required revision has been compacted"));
    assert!(step("watch before compaction").contains("\"canceled\":true"));
    assert!(step("watch progress").contains("\"revision\":"));
    for (d, v) in direct.lines().zip(via.lines()) {
        assert_eq!(v, d, "clientv3 {version}: front (left) vs etcd (right)");
    }
    assert_eq!(via.lines().count(), direct.lines().count());
}

/// One etcdctl step: its arguments (`{lease}` stands for the side's lease
/// id in hex), its stdin, and for a watch the line that ends it.
struct Step {
    args: Vec<String>,
    stdin: Option<String>,
    watch_until: Option<&'static str>,
}

fn cmd(args: &[&str]) -> Step {
    Step {
        args: args.iter().map(|a| a.to_string()).collect(),
        stdin: None,
        watch_until: None,
    }
}

fn txn(script: String) -> Step {
    Step {
        stdin: Some(script),
        ..cmd(&["txn", "-w", "json"])
    }
}

fn watch(args: &[&str], until: &'static str) -> Step {
    Step {
        watch_until: Some(until),
        ..cmd(args)
    }
}

/// The etcdctl sequence. Revisions of a fresh etcd: 2 put a, 3 put b,
/// 4 put a again, 5 put c, 6 put other, 7 txn, 8 del c, 9 put leased,
/// 10 revoke, 11 put zend; compaction at 7.
fn etcdctl_steps() -> Vec<Step> {
    let p = CACHED;
    let a = format!("{p}a");
    let b = format!("{p}b");
    let c = format!("{p}c");
    let leased = format!("{p}leased");
    let other = format!("{OTHER}x");
    let txn_ok = format!(
        "value(\"{b}\") = \"two\"\n\nput {b} three\nget {p} --prefix --count-only\n\nget {b}\n\n"
    );
    let txn_fail = format!(
        "ver(\"{a}\") = \"1\"\n\ndel {a}\n\nget {a}\nget {p} --prefix --keys-only --limit 1\n\n"
    );
    vec![
        cmd(&["put", &a, "1"]),
        cmd(&["put", &b, "two", "-w", "json"]),
        cmd(&["put", &a, "1-again", "--prev-kv", "-w", "json"]),
        cmd(&["put", &c, r#"{"kind":"Pod"}"#]),
        cmd(&["put", &other, "outside"]),
        cmd(&["get", "--prefix", p]),
        cmd(&["get", "--prefix", p, "-w", "json"]),
        cmd(&["get", "--prefix", p, "--limit", "2", "-w", "json"]),
        cmd(&[
            "get",
            "--prefix",
            p,
            "--sort-by",
            "MODIFY",
            "--order",
            "DESCEND",
        ]),
        cmd(&["get", "--prefix", p, "--sort-by", "CREATE", "-w", "json"]),
        cmd(&[
            "get",
            "--prefix",
            p,
            "--sort-by",
            "VERSION",
            "--order",
            "DESCEND",
            "-w",
            "fields",
        ]),
        cmd(&["get", "--prefix", p, "--sort-by", "VALUE", "--limit", "1"]),
        cmd(&["get", "--prefix", p, "--keys-only"]),
        cmd(&["get", "--prefix", p, "--count-only", "-w", "fields"]),
        cmd(&["get", "--prefix", p, "--print-value-only"]),
        cmd(&["get", "--prefix", p, "--rev", "4", "-w", "json"]),
        cmd(&["get", &a, "--rev", "3", "--consistency", "s", "-w", "json"]),
        cmd(&["get", &c, "--from-key", "-w", "json"]),
        cmd(&["get", "--prefix", p, "--consistency", "s", "-w", "json"]),
        cmd(&["get", &format!("{p}zz"), "-w", "json"]),
        cmd(&["get", "--prefix", OTHER, "-w", "json"]),
        cmd(&["get", "--prefix", p, "--rev", "1000"]),
        txn(txn_ok),
        txn(txn_fail),
        cmd(&["del", &c, "--prev-kv", "-w", "json"]),
        cmd(&["del", &format!("{p}zz")]),
        cmd(&["lease", "grant", "600", "-w", "json"]),
        cmd(&["put", &leased, "l", "--lease={lease}"]),
        cmd(&["lease", "keep-alive", "--once", "{lease}"]),
        cmd(&["lease", "timetolive", "{lease}", "--keys"]),
        cmd(&["lease", "list"]),
        cmd(&["get", &leased, "-w", "json"]),
        cmd(&["get", "--prefix", p, "--keys-only", "-w", "json"]),
        cmd(&["lease", "revoke", "{lease}"]),
        cmd(&["lease", "timetolive", "{lease}"]),
        cmd(&["get", &leased, "-w", "json"]),
        cmd(&["put", &format!("{p}zend"), "END"]),
        watch(&["watch", "--prefix", p, "--rev", "2", "--prev-kv"], "END"),
        watch(&["watch", &b, "--rev", "1"], "three"),
        watch(
            &["watch", &c, &format!("{p}zz"), "--rev", "4", "-w", "json"],
            "END",
        ),
        cmd(&["compaction", "7"]),
        cmd(&["compaction", "5"]),
        cmd(&["get", "--prefix", p, "--rev", "4"]),
        cmd(&["get", "--prefix", p, "--rev", "6", "--consistency", "s"]),
        cmd(&["get", "--prefix", p, "--rev", "7", "-w", "json"]),
        cmd(&[
            "get",
            "--prefix",
            p,
            "--rev",
            "8",
            "--consistency",
            "s",
            "-w",
            "json",
        ]),
        watch(&["watch", "--prefix", p, "--rev", "3"], "END"),
        watch(&["watch", "--prefix", p, "--rev", "7", "--prev-kv"], "END"),
        cmd(&["endpoint", "status", "-w", "json"]),
        cmd(&["endpoint", "health", "-w", "json"]),
        cmd(&["member", "list"]),
        cmd(&["member", "list", "-w", "json"]),
        cmd(&["auth", "status"]),
        cmd(&["alarm", "list"]),
        cmd(&["get", "", "--prefix", "--keys-only"]),
        cmd(&["del", "--prefix", p, "--prev-kv", "-w", "json"]),
        cmd(&["get", "--prefix", p, "-w", "json"]),
    ]
}

/// etcdctl's output lines until one equals `until` (a watch's last
/// event), or until it exits (a canceled watch).
async fn watch_until(bin: &Path, args: &[String], until: &str) -> Output {
    let mut child = tokio::process::Command::new(bin)
        .env_remove("ETCDCTL_API")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn etcdctl watch");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut stdout = String::new();
    let mut ended = false;
    let read = tokio::time::timeout(WAIT, async {
        while let Ok(Some(l)) = lines.next_line().await {
            stdout.push_str(&l);
            stdout.push('\n');
            if l.trim() == until || l.contains(&format!("\"{}\"", b64(until))) {
                return;
            }
        }
        ended = true;
    })
    .await;
    assert!(read.is_ok(), "etcdctl {args:?}: no {until:?} in: {stdout}");
    let mut stderr = Vec::new();
    let success = if ended {
        let status = tokio::time::timeout(WAIT, child.wait())
            .await
            .expect("etcdctl exited")
            .expect("status");
        if let Some(mut e) = child.stderr.take() {
            e.read_to_end(&mut stderr).await.expect("stderr");
        }
        status.success()
    } else {
        let _ = child.kill().await;
        true
    };
    Output {
        success,
        stdout,
        stderr: without_logs(&stderr),
    }
}

/// Base64 as etcdctl's JSON output writes keys and values.
fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// etcd's `endpoint status -w json` without the fields the front's own
/// requests to etcd move (raft indexes, database sizes), and etcd 3.6's
/// `storageVersion`, which a member moves from 3.5.0 to 3.6.0 some seconds
/// after it starts (the two etcds of a comparison differ in age).
fn without_moving_status(out: &str) -> String {
    let Ok(mut v) = serde_json::from_str::<serde_json::Value>(out) else {
        return out.to_string();
    };
    for s in v.as_array_mut().into_iter().flatten() {
        if let Some(st) = s.get_mut("Status").and_then(|st| st.as_object_mut()) {
            for moving in [
                "raftIndex",
                "raftAppliedIndex",
                "dbSize",
                "dbSizeInUse",
                "storageVersion",
            ] {
                st.remove(moving);
            }
        }
    }
    v.to_string()
}

async fn etcdctl_differential(bin: PathBuf) {
    let _one = ONE_AT_A_TIME.lock().await;
    let steps = etcdctl_steps();
    assert!(steps.len() >= 40, "about 40 commands");
    let mut outputs: Vec<Vec<Output>> = Vec::new();
    for through_front in [false, true] {
        let mut side = Side::start(through_front).await;
        let mut lease = String::new();
        let mut outs = Vec::new();
        for step in &steps {
            let mut args = vec![
                format!("--endpoints={}", side.endpoint),
                "--command-timeout=10s".to_string(),
            ];
            args.extend(step.args.iter().map(|a| a.replace("{lease}", &lease)));
            let mut out = match step.watch_until {
                Some(until) => watch_until(&bin, &args, until).await,
                None => run(&bin, &args, step.stdin.as_deref()).await,
            };
            if step.args[..2] == ["lease", "grant"] {
                let v: serde_json::Value =
                    serde_json::from_str(&out.stdout).expect("lease grant JSON");
                // A number, or a string where the JSON is protojson's.
                let id = ["ID", "id"]
                    .iter()
                    .find_map(|k| match &v[*k] {
                        serde_json::Value::Number(n) => n.as_u64(),
                        serde_json::Value::String(s) => s.parse().ok(),
                        _ => None,
                    })
                    .unwrap_or_else(|| panic!("a lease ID in {}", out.stdout));
                lease = format!("{id:x}");
                side.mask.id(id, "lease-id");
            }
            if step.args[..2] == ["endpoint", "status"] {
                out.stdout = without_moving_status(&out.stdout);
            }
            out.stdout = side.mask.apply(&out.stdout);
            out.stderr = side.mask.apply(&out.stderr);
            outs.push(out);
        }
        outputs.push(outs);
    }
    for (step, (direct, via)) in steps.iter().zip(outputs[0].iter().zip(&outputs[1])) {
        assert_eq!(
            via,
            direct,
            "etcdctl {:?} ({}): front (left) vs etcd (right)",
            step.args,
            bin.display()
        );
    }
    // The sequence did what it says: these failed as etcd fails them, the
    // others answered.
    let failed: Vec<_> = steps
        .iter()
        .zip(&outputs[0])
        .filter(|(_, o)| !o.success)
        .map(|(s, _)| s.args.join(" "))
        .collect();
    let p = CACHED;
    assert_eq!(
        failed,
        [
            format!("get --prefix {p} --rev 1000"),
            "compaction 5".to_string(),
            format!("get --prefix {p} --rev 4"),
            format!("get --prefix {p} --rev 6 --consistency s"),
            format!("watch --prefix {p} --rev 3"),
        ],
        "the failing steps"
    );
}

fn tools_etcdctl() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/etcd/usr/bin/etcdctl")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_3_5_through_the_front_equals_etcd() {
    etcdctl_differential(tools_etcdctl()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_3_6_through_the_front_equals_etcd() {
    etcdctl_differential(common::kube_apiserver::peer("etcdctl-3.6")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_3_7_through_the_front_equals_etcd() {
    etcdctl_differential(common::kube_apiserver::peer("etcdctl-3.7")).await;
}

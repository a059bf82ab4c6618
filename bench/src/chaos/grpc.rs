//! `watchcache-bench chaos --front grpc`: etcd clients (the `etcd-client`
//! crate) through the daemon's etcd gRPC front while the faults run, then
//! every watch and read checked against etcd's own history
//! ([`super::grpc_checker`]) and the KV history checked for linearizability
//! by porcupine (tests/clients/go/porcupine, built by scripts/clients.sh).
//!
//! Keys live under [`PREFIX`], which the daemon's front caches
//! (`grpc_cache_prefixes`). Clients, in Rust and in Go (etcd's own clientv3,
//! [`clientv3_driver`]): KV workers (Put, Delete, Txn "if
//! mod_revision == the last one seen then Put else Get", linearizable,
//! serializable and past-revision Ranges), a lease worker (Grant, Put of
//! keys with the lease, KeepAlive, Revoke: all its keys deleted in one
//! revision), and watchers (prefix with prev_kv and progress_notify,
//! NOPUT / NODELETE filters, single key, from an older revision; progress
//! requests; canceled and re-created, resumed after a break from the last
//! revision seen). Faults on a schedule drawn from `--seed`: SIGSTOP and
//! SIGKILL of etcd, compaction, the daemon cut off etcd or silenced past its
//! watch timeout (the bench's proxy), SIGKILL of the daemon. With
//! `--etcd-members 3` the run starts its own cluster and adds the REST run's
//! member faults ([`super::member_fault`]). After every fault the run
//! measures the time until the front serves fresh data again ([`recovery`]).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use etcd_client::{
    Client, CompactionOptions, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp,
    TxnOpResponse, WatchFilterType, WatchOptions,
};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::grpc_checker::{
    self, Ev, GrpcCompaction, GrpcReport, Resp, RevRead, SerialRead, WatchLog,
};
use super::proxy::{Mode, TcpProxy};
use super::recorder::Recorder;
use super::{
    ChaosParams, DAEMON_WATCH_TIMEOUT, Fresh, MemberCtx, MemberFault, RECOVERY_TIMEOUT,
    etcd_version_of, member_fault, probe_put, stop_for,
};
use crate::env::{
    Daemon, EtcdKeeper, clear_prefix, current_revision, daemon_config, etcd_connect,
    etcd_connect_all, wait_grpc,
};

/// The etcd prefix the run's clients use (cached by the front).
pub const PREFIX: &str = "/chaos-grpc/";

/// How long a client waits for one answer.
const OP_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GrpcFault {
    /// SIGSTOP etcd for 1-4 s, then SIGCONT.
    EtcdStop,
    /// SIGKILL etcd and start it again.
    EtcdKill,
    /// Compact etcd a few revisions behind its current one.
    Compact,
    /// Reset the daemon's etcd connections and refuse new ones for 1-3 s.
    EtcdCut,
    /// Silence the daemon's etcd connections past its watch timeout.
    EtcdSilent,
    /// SIGKILL the daemon (and so its front) and start it again.
    DaemonKill,
    /// The REST run's member faults ([`super::Fault`]), with 3 members.
    LeaderKill,
    MemberStop,
    MemberPartition,
    RollingRestart,
    RollingUpgrade,
}

impl GrpcFault {
    fn needs(self) -> Duration {
        match self {
            GrpcFault::EtcdSilent => DAEMON_WATCH_TIMEOUT + Duration::from_secs(5),
            GrpcFault::Compact => Duration::from_secs(2),
            GrpcFault::MemberStop => Duration::from_secs(16),
            GrpcFault::MemberPartition => Duration::from_secs(9),
            GrpcFault::RollingRestart => Duration::from_secs(6),
            GrpcFault::RollingUpgrade => Duration::from_secs(30),
            _ => Duration::from_secs(5),
        }
    }

    fn member(self) -> Option<MemberFault> {
        Some(match self {
            GrpcFault::LeaderKill => MemberFault::LeaderKill,
            GrpcFault::MemberStop => MemberFault::MemberStop,
            GrpcFault::MemberPartition => MemberFault::MemberPartition,
            GrpcFault::RollingRestart => MemberFault::RollingRestart,
            GrpcFault::RollingUpgrade => MemberFault::RollingUpgrade,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct GrpcFaultRecord {
    pub fault: GrpcFault,
    pub at_s: f64,
    pub took_s: f64,
    /// When the front served fresh data again; None if not within 90 s.
    pub recovery: Option<Fresh>,
    pub detail: String,
}

#[derive(Default)]
struct Counters {
    kv_ok: AtomicU64,
    kv_errors: AtomicU64,
    lease_ops: AtomicU64,
    lease_errors: AtomicU64,
    watches_created: AtomicU64,
    watch_breaks: AtomicU64,
    watch_cancels: AtomicU64,
    progress_requests: AtomicU64,
}

/// What every client shares.
struct G {
    t0: Instant,
    stop: CancellationToken,
    front: Mutex<String>,
    keys: usize,
    /// porcupine's operations.
    ops: Mutex<Vec<Value>>,
    serial: Mutex<Vec<SerialRead>>,
    rev_reads: Mutex<Vec<RevRead>>,
    watches: Mutex<Vec<WatchLog>>,
    counters: Counters,
    /// The recovery probe's writes so far.
    probes: AtomicU64,
}

impl G {
    fn now(&self) -> i64 {
        self.t0.elapsed().as_nanos() as i64
    }

    async fn connect(&self) -> Option<Client> {
        let ep = self.front.lock().clone();
        match tokio::time::timeout(OP_TIMEOUT, etcd_connect(&ep)).await {
            Ok(Ok(c)) => Some(c),
            _ => None,
        }
    }
}

/// The result of the run.
pub struct GrpcOutcome {
    pub report: GrpcReport,
    /// Keys porcupine found not linearizable (or could not decide).
    pub illegal_keys: Vec<String>,
    pub unknown_keys: Vec<String>,
    pub faults: Vec<GrpcFaultRecord>,
    pub json: Value,
    /// etcd's version at the end of the run (after an upgrade, the newest).
    pub etcd_version: Option<String>,
}

impl GrpcOutcome {
    pub fn violations(&self) -> usize {
        self.report.violations.len() + self.illegal_keys.len()
    }
}

fn key_name(i: usize) -> String {
    format!("k{i:02}")
}

/// A value as the run writes it: a JSON string (the recorder reads JSON).
fn encode(v: &str) -> String {
    Value::String(v.to_string()).to_string()
}

fn decode(b: &[u8]) -> String {
    match serde_json::from_slice::<Value>(b) {
        Ok(Value::String(s)) => s,
        Ok(v) => v.to_string(),
        Err(_) => String::from_utf8_lossy(b).into_owned(),
    }
}

fn is_compacted(e: &etcd_client::Error) -> bool {
    e.to_string()
        .contains("required revision has been compacted")
}

/// Runs the gRPC-front chaos scenario (see the module doc).
pub async fn run(p: &ChaosParams, keeper: Option<&EtcdKeeper>) -> Result<GrpcOutcome> {
    let started = Instant::now();
    let (mut cluster, endpoints) = super::start_etcd(p).await?;
    let client = etcd_connect_all(&endpoints).await?;
    let mut kv = client.kv_client();
    let base = clear_prefix(&mut kv, PREFIX).await?;
    let recorder = Recorder::start(&endpoints, PREFIX, base).await?;
    // A client per member, for the recovery probe's writes.
    let mut members = Vec::new();
    for ep in &endpoints {
        members.push(etcd_connect(ep).await?);
    }
    let mut rng = StdRng::seed_from_u64(p.seed);

    // The daemon, given every member's endpoint, each behind our proxy.
    let proxies = super::proxies_for(&endpoints).await?;
    let set_proxies = |m: Mode| proxies.iter().for_each(|px| px.set(m));
    let via: Vec<String> = proxies.iter().map(TcpProxy::endpoint).collect();
    let cfg = format!(
        "grpc_cache_prefixes = [\"{PREFIX}\"]\n{}",
        daemon_config(&via, &p.etcd_prefix, 10_000, None, &[])
    );
    let mut daemon = Daemon::spawn_grpc(&p.watchcache_bin, &cfg)?;
    let kept_dir = p.keep_dir.then(|| daemon.keep_dir());
    let rss = super::memory::RssSampler::start(daemon.pid, started);
    daemon
        .wait_ready(Instant::now(), Duration::from_secs(120))
        .await
        .context("starting watchcache")?;
    let grpc = daemon
        .grpc_authority
        .clone()
        .ok_or_else(|| anyhow!("the daemon has no gRPC front"))?;
    wait_grpc(&grpc, Duration::from_secs(60)).await?;

    let g = Arc::new(G {
        t0: started,
        stop: CancellationToken::new(),
        front: Mutex::new(format!("http://{grpc}")),
        keys: p.keys.clamp(1, 50),
        ops: Mutex::new(Vec::new()),
        serial: Mutex::new(Vec::new()),
        rev_reads: Mutex::new(Vec::new()),
        watches: Mutex::new(Vec::new()),
        counters: Counters::default(),
        probes: AtomicU64::new(0),
    });
    let seeded = |salt: u64, i: u64| {
        StdRng::seed_from_u64(p.seed.wrapping_mul(1_000_003).wrapping_add(salt * 1000 + i))
    };
    let mut tasks = Vec::new();
    let workers = 4u64;
    for id in 0..workers {
        let rate = (p.rate / workers as f64).max(0.1);
        tasks.push(tokio::spawn(kv_worker(g.clone(), id, rate, seeded(1, id))));
    }
    tasks.push(tokio::spawn(lease_worker(g.clone(), seeded(2, 0))));
    for i in 0..p.watchers as u64 {
        tasks.push(tokio::spawn(watcher(g.clone(), i, seeded(3, i))));
    }
    let go_driver = tokio::spawn(clientv3_driver(
        g.clone(),
        format!("http://{grpc}"),
        p.duration,
        p.seed,
    ));

    // Faults, on the seeded schedule.
    let mut kinds = vec![
        GrpcFault::Compact,
        GrpcFault::EtcdCut,
        GrpcFault::EtcdSilent,
        GrpcFault::DaemonKill,
    ];
    if keeper.is_some() || p.etcd_pid.is_some() || cluster.is_some() {
        kinds.push(GrpcFault::EtcdStop);
    }
    if keeper.is_some() || cluster.is_some() {
        kinds.push(GrpcFault::EtcdKill);
    }
    if cluster.as_ref().is_some_and(|c| c.len() >= 3) {
        kinds.extend([
            GrpcFault::LeaderKill,
            GrpcFault::MemberStop,
            GrpcFault::MemberPartition,
            GrpcFault::RollingRestart,
        ]);
        if !p.etcd_upgrades.is_empty() {
            kinds.push(GrpcFault::RollingUpgrade);
        }
    }
    eprintln!("chaos --front grpc: faults available: {kinds:?}");
    let etcd_pid = || p.etcd_pid.or_else(|| keeper.map(|k| k.pid()));
    let deadline = started + p.duration;
    let mut faults = Vec::new();
    let mut compactions: Vec<GrpcCompaction> = Vec::new();
    let mut order: Vec<GrpcFault> = Vec::new();
    loop {
        let calm = Duration::from_millis(rng.random_range(1000..3000));
        tokio::time::sleep(calm).await;
        if order.is_empty() {
            order = kinds.clone();
            order.shuffle(&mut rng);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let Some(pos) = order.iter().position(|f| f.needs() <= left) else {
            break;
        };
        let fault = order.remove(pos);
        let t = Instant::now();
        // The recovery the fault measured itself, if it did.
        let mut measured = None;
        let detail = match fault {
            GrpcFault::EtcdStop => {
                let pids: Vec<u32> = match &cluster {
                    Some(c) => (0..c.len()).filter_map(|i| c.pid(i)).collect(),
                    None => vec![etcd_pid().ok_or_else(|| anyhow!("no etcd pid"))?],
                };
                let ms = rng.random_range(1000..4000);
                stop_for(&pids, Duration::from_millis(ms)).await?;
                format!("etcd (pid {pids:?}) stopped for {ms} ms")
            }
            GrpcFault::EtcdKill => match cluster.as_mut() {
                Some(c) => {
                    let took = c.kill_and_restart_all().await?;
                    format!("every etcd member killed and restarted, healthy after {took:?}")
                }
                None => {
                    let k = keeper.ok_or_else(|| anyhow!("no etcd keeper"))?;
                    let took = k.restart().await?;
                    format!("etcd killed and restarted, healthy after {took:?}")
                }
            },
            GrpcFault::Compact => {
                let rev = super::retry(Duration::from_secs(30), || async {
                    current_revision(&mut client.kv_client()).await
                })
                .await?;
                recorder.wait_for(rev, Duration::from_secs(30)).await?;
                let at = (rev - rng.random_range(1..40)).max(base);
                let started = g.now();
                super::retry(Duration::from_secs(30), || async {
                    let mut c = client.clone();
                    match c
                        .compact(at, Some(CompactionOptions::new().with_physical()))
                        .await
                    {
                        Ok(_) => Ok(()),
                        Err(e) if e.to_string().contains("compacted") => Ok(()),
                        Err(e) => Err(anyhow!(e)),
                    }
                })
                .await?;
                compactions.push(GrpcCompaction {
                    rev: at,
                    started,
                    done: g.now(),
                });
                format!("etcd compacted at {at} (current {rev})")
            }
            GrpcFault::EtcdCut => {
                let ms = rng.random_range(1000..3000);
                set_proxies(Mode::Cut);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                set_proxies(Mode::Forward);
                format!("daemon cut off etcd for {ms} ms")
            }
            GrpcFault::EtcdSilent => {
                let silent = DAEMON_WATCH_TIMEOUT + Duration::from_secs(2);
                set_proxies(Mode::Blackhole);
                tokio::time::sleep(silent).await;
                set_proxies(Mode::Forward);
                format!("etcd silent to the daemon for {silent:?}")
            }
            GrpcFault::DaemonKill => {
                let ms = rng.random_range(200..2000);
                daemon.kill();
                tokio::time::sleep(Duration::from_millis(ms)).await;
                daemon.restart()?;
                rss.set_pid(daemon.pid);
                daemon
                    .wait_ready(Instant::now(), Duration::from_secs(60))
                    .await
                    .context("restarting watchcache")?;
                format!(
                    "daemon killed, restarted after {ms} ms (pid {})",
                    daemon.pid
                )
            }
            GrpcFault::LeaderKill
            | GrpcFault::MemberStop
            | GrpcFault::MemberPartition
            | GrpcFault::RollingRestart
            | GrpcFault::RollingUpgrade => {
                let c = cluster.as_mut().ok_or_else(|| anyhow!("no cluster"))?;
                let mf = fault
                    .member()
                    .ok_or_else(|| anyhow!("{fault:?} is no member fault"))?;
                let ctx = MemberCtx {
                    proxies: &proxies,
                    recorder: &recorder,
                    client: &client,
                    upgrades: &p.etcd_upgrades,
                };
                let (d, r) =
                    member_fault(mf, c, &ctx, &mut rng, |t| recovery(&g, &members, t)).await?;
                if mf == MemberFault::RollingUpgrade {
                    // Once: the cluster does not go back.
                    kinds.retain(|k| *k != GrpcFault::RollingUpgrade);
                }
                measured = Some(r);
                d
            }
        };
        let recovery = match measured {
            Some(r) => r,
            None => recovery(&g, &members, Instant::now()).await,
        };
        let at_s = t.duration_since(started).as_secs_f64();
        let rec = recovery.map_or("not within 90 s".into(), |r| {
            format!(
                "{:.2} s (etcd took a write after {:.2} s)",
                r.s, r.etcd_write_s
            )
        });
        eprintln!("chaos --front grpc: {at_s:6.1}s {fault:?}: {detail}; fresh data after {rec}");
        faults.push(GrpcFaultRecord {
            fault,
            at_s,
            took_s: t.elapsed().as_secs_f64(),
            recovery,
            detail,
        });
    }
    if let Some(left) = deadline.checked_duration_since(Instant::now()) {
        tokio::time::sleep(left).await;
    }
    g.stop.cancel();
    for t in tasks {
        let _ = t.await;
    }
    // The Go driver stops by itself after the run's duration.
    let go = tokio::time::timeout(Duration::from_secs(60), go_driver)
        .await
        .context("the Go driver did not stop")?
        .context("the Go driver panicked")??;
    let end_rev = super::retry(Duration::from_secs(60), || async {
        current_revision(&mut client.kv_client()).await
    })
    .await?;
    recorder.wait_for(end_rev, Duration::from_secs(60)).await?;
    let history = recorder.finish().await?;
    let etcd_version = etcd_version_of(&endpoints).await;
    drop(daemon);
    drop(proxies);
    drop(cluster);

    let watches = std::mem::take(&mut *g.watches.lock());
    let serial = std::mem::take(&mut *g.serial.lock());
    let rev_reads = std::mem::take(&mut *g.rev_reads.lock());
    let ops = std::mem::take(&mut *g.ops.lock());
    let mut watch_ends: BTreeMap<String, u64> = BTreeMap::new();
    let mut break_reasons: BTreeMap<String, u64> = BTreeMap::new();
    let mut unanswered = Vec::new();
    for w in &watches {
        let reason = w.end.split(':').next().unwrap_or_default();
        let answered = if w.created_rev > 0 || w.compacted.is_some() {
            ""
        } else {
            " (before created)"
        };
        *watch_ends.entry(format!("{reason}{answered}")).or_insert(0) += 1;
        if w.end == "cancel unanswered" && unanswered.len() < 20 {
            unanswered.push(json!({
                "watch": format!("{}{}", w.key, if w.prefix { "*" } else { "" }),
                "start_rev": w.start_rev,
                "created_rev": w.created_rev,
                "events": w.resps.iter().map(|r| r.events.len()).sum::<usize>(),
                "sent_at_s": w.sent_at as f64 / 1e9,
                "ended_at_s": w.ended_at as f64 / 1e9,
            }));
        }
        if reason == "broken" {
            // Counted by kind: sizes and addresses in the message vary.
            let kind: String = w
                .end
                .chars()
                .map(|c| if c.is_ascii_digit() { 'N' } else { c })
                .collect();
            let kind = if break_reasons.len() < 20 || break_reasons.contains_key(&kind) {
                kind
            } else {
                "other".to_string()
            };
            *break_reasons.entry(kind).or_insert(0u64) += 1;
        }
    }
    let report = grpc_checker::check(&history, &compactions, &watches, &serial, &rev_reads);
    let (verdict, history_file) = porcupine(&ops).await?;
    let list = |k: &str| -> Vec<String> {
        verdict[k]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    };
    let illegal_keys = list("illegal");
    let unknown_keys = list("unknown");
    let kept = if illegal_keys.is_empty() {
        None
    } else {
        // Keep the history for porcupine again (or its visualization).
        let path = std::env::temp_dir().join(format!("chaos-grpc-history-{}.json", p.seed));
        std::fs::copy(history_file.path(), &path)?;
        Some(path)
    };
    let mut by_kind: BTreeMap<GrpcFault, u64> = BTreeMap::new();
    let mut rec: BTreeMap<GrpcFault, Vec<Option<Fresh>>> = BTreeMap::new();
    for f in &faults {
        *by_kind.entry(f.fault).or_insert(0) += 1;
        rec.entry(f.fault).or_default().push(f.recovery);
    }
    let recovery_by_kind: BTreeMap<GrpcFault, Value> = rec
        .into_iter()
        .map(|(k, v)| (k, super::recovery_summary(&v)))
        .collect();
    let c = &g.counters;
    let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let violations = report.violations.len() + illegal_keys.len();
    let json = json!({
        "front": "grpc",
        "seed": p.seed,
        "etcd_members": p.etcd_members.max(1),
        "duration_s": p.duration.as_secs_f64(),
        "elapsed_s": started.elapsed().as_secs_f64(),
        "watchers": p.watchers,
        "rate_per_s": p.rate,
        "keys": g.keys,
        "kv_ops_ok": ld(&c.kv_ok),
        "kv_ops_failed": ld(&c.kv_errors),
        "linearizability": {
            "checker": "porcupine (tests/clients/go/porcupine)",
            "ops_checked": verdict["ops"],
            "result": verdict["result"],
            "illegal_keys": illegal_keys,
            "unknown_keys": unknown_keys,
            "history_kept": kept,
        },
        "serializable_reads_checked": report.serializable_checked,
        "revision_reads_checked": report.rev_reads_checked,
        "compacted_answers": report.compacted_answers,
        "lease_ops": ld(&c.lease_ops),
        "lease_errors": ld(&c.lease_errors),
        "watches_created": ld(&c.watches_created),
        "watches_checked": report.watches_checked,
        "watch_breaks": ld(&c.watch_breaks),
        "watch_cancels": ld(&c.watch_cancels),
        "watch_ends": watch_ends,
        "watch_break_reasons": break_reasons,
        "cancels_unanswered": unanswered,
        "progress_requests": ld(&c.progress_requests),
        "clientv3": {
            "driver": "tests/clients/go/etcdclient (chaos.go), go.etcd.io/etcd/client/v3 v3.7",
            "kv_ops": go.ops,
            "serializable_reads": go.serializable,
            "watches": go.watches,
            "events": go.events,
            "big_revisions": go.big_revisions,
        },
        "events_checked": report.events_checked,
        "progress_notifications_checked": report.progress_checked,
        "etcd_history_changes": history.changes.len(),
        "faults_injected": faults.len(),
        "faults_by_kind": by_kind,
        "recovery_by_kind": recovery_by_kind,
        "faults": faults,
        "compactions": compactions,
        "daemon_memory": rss.report(),
        "daemon_dir": kept_dir,
        "violations": violations,
        "violations_by_kind": report.counts(),
        "violation_list": report.violations.iter().take(100).collect::<Vec<_>>(),
    });
    Ok(GrpcOutcome {
        report,
        illegal_keys,
        unknown_keys,
        faults,
        json,
        etcd_version,
    })
}

/// The key the recovery probe writes (no client's key).
const PROBE: &str = "probe";

/// Seconds from `since` until the front serves fresh data: a write made
/// straight to etcd after `since` (to every member at once; the first to
/// answer gives its revision) is in a serializable Range through the front,
/// which the front answers from its cache. None if that takes longer than
/// [`RECOVERY_TIMEOUT`].
async fn recovery(g: &G, members: &[Client], since: Instant) -> Option<Fresh> {
    let deadline = since + RECOVERY_TIMEOUT;
    let key = format!("{PREFIX}{PROBE}");
    let rev = loop {
        let v = encode(&format!(
            "probe-{}",
            g.probes.fetch_add(1, Ordering::Relaxed)
        ));
        if let Some(rev) = probe_put(members, &key, &v).await {
            break rev;
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let written = since.elapsed();
    let mut front: Option<Client> = None;
    loop {
        if front.is_none() {
            front = g.connect().await;
        }
        if let Some(c) = front.as_mut() {
            let get = c.get(key.as_str(), Some(GetOptions::new().with_serializable()));
            match tokio::time::timeout(Duration::from_secs(2), get).await {
                Ok(Ok(r)) if r.kvs().first().is_some_and(|kv| kv.mod_revision() >= rev) => break,
                Ok(Ok(_)) => {}
                _ => front = None,
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Some(Fresh {
        s: since.elapsed().as_secs_f64(),
        etcd_write_s: written.as_secs_f64(),
    })
}

/// A Go program of tests/clients/go: `$env`, or the one scripts/clients.sh
/// builds and caches as `name`.
fn client_bin(name: &str, env: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Ok(PathBuf::from(p));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/clients.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg(name)
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} {name}: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .nth(1)
        .map(PathBuf::from)
        .ok_or_else(|| anyhow!("scripts/clients.sh {name} printed no path"))
}

/// The porcupine checker (`$WATCHCACHE_PORCUPINE` overrides).
fn porcupine_bin() -> Result<PathBuf> {
    client_bin("porcupine", "WATCHCACHE_PORCUPINE")
}

/// The first porcupine client id of the Go driver (the Rust workers are
/// 0..4).
const CLIENTV3_ID: u64 = 100;

/// What etcd's Go client (clientv3) did through the front.
#[derive(Default)]
struct GoCounts {
    ops: u64,
    serializable: u64,
    watches: u64,
    events: u64,
    /// Revisions of 4 x 300 KiB written (fragmented for its watch).
    big_revisions: u64,
}

/// Runs etcd's Go client through the front for `d`: the chaos driver of
/// tests/clients/go/etcdclient (chaos.go), built against clientv3 3.7 by
/// scripts/clients.sh (`$WATCHCACHE_ETCDCLIENT` overrides). Its KV
/// operations join porcupine's history, its serializable reads and watches
/// the checker's, under their own client names.
async fn clientv3_driver(g: Arc<G>, front: String, d: Duration, seed: u64) -> Result<GoCounts> {
    let bin = tokio::task::spawn_blocking(|| client_bin("etcdclient-3.7", "WATCHCACHE_ETCDCLIENT"))
        .await??;
    // The bench's clock: `Instant` is CLOCK_MONOTONIC on Linux.
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
        bail!("clock_gettime: {}", std::io::Error::last_os_error());
    }
    let t0 = ts.tv_sec * 1_000_000_000 + ts.tv_nsec - g.now();
    let stderr = tempfile::NamedTempFile::new()?;
    let mut child = tokio::process::Command::new(&bin)
        .arg(format!("--endpoint={front}"))
        .arg(format!("--prefix={PREFIX}"))
        .arg(format!("--chaos={}ms", d.as_millis()))
        .arg(format!("--keys={}", g.keys))
        .arg(format!("--client-id={CLIENTV3_ID}"))
        .arg(format!("--t0={t0}"))
        .arg(format!("--seed={seed}"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(stderr.reopen()?)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("spawning {}", bin.display()))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("no stdout from {}", bin.display()))?;
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let mut n = GoCounts::default();
    while let Some(line) = lines.next_line().await? {
        let v: Value = serde_json::from_str(&line)
            .with_context(|| format!("the Go driver printed {line:?}"))?;
        if let Some(op) = v.get("op") {
            n.ops += 1;
            g.ops.lock().push(op.clone());
        } else if let Some(r) = v.get("serial") {
            n.serializable += 1;
            g.serial.lock().push(go_serial(r));
        } else if v.get("big").is_some() {
            n.big_revisions += 1;
        } else if let Some(w) = v.get("watch") {
            let w = go_watch(w);
            n.watches += 1;
            n.events += w.resps.iter().map(|r| r.events.len() as u64).sum::<u64>();
            g.watches.lock().push(w);
        }
    }
    let status = child.wait().await?;
    if !status.success() {
        let err = std::fs::read_to_string(stderr.path()).unwrap_or_default();
        bail!("the Go driver ({}) failed: {status}: {err}", bin.display());
    }
    Ok(n)
}

fn go_str(v: &Value, k: &str) -> String {
    v[k].as_str().unwrap_or_default().to_string()
}

fn go_i64(v: &Value, k: &str) -> i64 {
    v[k].as_i64().unwrap_or(0)
}

/// A `{"serial": ...}` record of the Go driver.
fn go_serial(r: &Value) -> SerialRead {
    SerialRead {
        client: go_str(r, "client"),
        key: go_str(r, "key"),
        floor: go_i64(r, "floor"),
        rev: go_i64(r, "rev"),
        kv: r["value"]
            .as_str()
            .map(|v| (v.to_string(), go_i64(r, "mod_rev"))),
    }
}

/// A `{"watch": ...}` record of the Go driver.
fn go_watch(w: &Value) -> WatchLog {
    let pair = |p: &Value| Some((p[0].as_str()?.to_string(), p[1].as_i64()?));
    let resps = w["resps"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| Resp {
            rev: go_i64(r, "rev"),
            progress: r["progress"].as_bool().unwrap_or(false),
            events: r["events"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| Ev {
                    delete: e["delete"].as_bool().unwrap_or(false),
                    key: go_str(e, "key"),
                    value: go_str(e, "value"),
                    mod_rev: go_i64(e, "mod_rev"),
                    create_rev: go_i64(e, "create_rev"),
                    version: go_i64(e, "version"),
                    prev: pair(&e["prev"]),
                })
                .collect(),
        })
        .collect();
    WatchLog {
        client: go_str(w, "client"),
        key: go_str(w, "key"),
        prefix: w["prefix"].as_bool().unwrap_or(false),
        start_rev: go_i64(w, "start_rev"),
        created_rev: go_i64(w, "created_rev"),
        sent_at: go_i64(w, "sent_at"),
        prev_kv: w["prev_kv"].as_bool().unwrap_or(false),
        no_put: false,
        no_delete: false,
        resps,
        compacted: w["compacted"].as_i64(),
        end: go_str(w, "end"),
        ended_at: go_i64(w, "ended_at"),
    }
}

/// Writes the history and has porcupine check it; returns its verdict.
async fn porcupine(ops: &[Value]) -> Result<(Value, tempfile::NamedTempFile)> {
    let file = tempfile::Builder::new()
        .prefix("chaos-grpc-history-")
        .suffix(".json")
        .tempfile()?;
    serde_json::to_writer(
        std::io::BufWriter::new(file.as_file()),
        &json!({"ops": ops}),
    )?;
    let path = file.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || -> Result<std::process::Output> {
        let bin = porcupine_bin()?;
        std::process::Command::new(&bin)
            .arg(&path)
            .arg("300")
            .stdin(std::process::Stdio::null())
            .output()
            .with_context(|| format!("running {}", bin.display()))
    })
    .await??;
    if !out.status.success() {
        bail!(
            "porcupine checker failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: Value = serde_json::from_slice(&out.stdout).context("porcupine's verdict")?;
    Ok((v, file))
}

async fn pause(stop: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

/// One porcupine operation.
fn op(client: u64, call: i64, ret: i64, input: Value, output: Value) -> Value {
    json!({"client": client, "call": call, "return": ret, "input": input, "output": output})
}

/// Put, Delete, Txn and Ranges of the keys, as fast as `rate`.
async fn kv_worker(g: Arc<G>, id: u64, rate: f64, mut rng: StdRng) {
    let mut client: Option<Client> = None;
    // The highest revision this client has seen in an answer.
    let mut seen = 0i64;
    let mut last_mod: HashMap<String, i64> = HashMap::new();
    let mut n = 0u64;
    loop {
        let d = Duration::from_secs_f64(rng.random_range(0.5..1.5) / rate);
        if !pause(&g.stop, d).await {
            return;
        }
        let c = match &client {
            Some(c) => c.clone(),
            None => match g.connect().await {
                Some(c) => {
                    client = Some(c.clone());
                    c
                }
                None => continue,
            },
        };
        let mut kv = c.kv_client();
        let name = key_name(rng.random_range(0..g.keys));
        let key = format!("{PREFIX}{name}");
        n += 1;
        let value = format!("c{id}-{n}");
        let dice = rng.random_range(0..100);
        let call = g.now();
        let ok = match dice {
            0..30 => {
                let r = tokio::time::timeout(OP_TIMEOUT, kv.put(key, encode(&value), None)).await;
                let input = json!({"op": "put", "key": name, "value": value});
                let out = match r {
                    Ok(Ok(r)) => {
                        let rev = r.header().map_or(0, |h| h.revision());
                        seen = seen.max(rev);
                        json!({"rev": rev})
                    }
                    _ => json!({"unknown": true}),
                };
                let ok = out["unknown"].is_null();
                g.ops
                    .lock()
                    .push(op(id, call, if ok { g.now() } else { 0 }, input, out));
                ok
            }
            30..40 => {
                let r = tokio::time::timeout(OP_TIMEOUT, kv.delete(key, None)).await;
                let input = json!({"op": "delete", "key": name});
                let out = match r {
                    Ok(Ok(r)) => {
                        let rev = r.header().map_or(0, |h| h.revision());
                        seen = seen.max(rev);
                        json!({"rev": rev, "deleted": r.deleted()})
                    }
                    _ => json!({"unknown": true}),
                };
                let ok = out["unknown"].is_null();
                g.ops
                    .lock()
                    .push(op(id, call, if ok { g.now() } else { 0 }, input, out));
                ok
            }
            40..60 => {
                let expect = last_mod.get(&name).copied().unwrap_or(0);
                let txn = Txn::new()
                    .when([Compare::mod_revision(key.clone(), CompareOp::Equal, expect)])
                    .and_then([TxnOp::put(key.clone(), encode(&value), None)])
                    .or_else([TxnOp::get(key, None)]);
                let r = tokio::time::timeout(OP_TIMEOUT, kv.txn(txn)).await;
                let input = json!({"op": "txn", "key": name, "value": value, "expect": expect});
                let out = match r {
                    Ok(Ok(r)) => {
                        let rev = r.header().map_or(0, |h| h.revision());
                        seen = seen.max(rev);
                        if r.succeeded() {
                            last_mod.insert(name.clone(), rev);
                            json!({"rev": rev, "succeeded": true})
                        } else {
                            let kv = r.op_responses().into_iter().find_map(|o| match o {
                                TxnOpResponse::Get(g) => Some(
                                    g.kvs()
                                        .first()
                                        .map(|kv| (decode(kv.value()), kv.mod_revision())),
                                ),
                                _ => None,
                            });
                            match kv {
                                Some(Some((v, m))) => {
                                    last_mod.insert(name.clone(), m);
                                    json!({"rev": rev, "exists": true, "value": v, "mod_rev": m})
                                }
                                Some(None) => {
                                    last_mod.remove(&name);
                                    json!({"rev": rev, "exists": false})
                                }
                                None => json!({"unknown": true}),
                            }
                        }
                    }
                    _ => json!({"unknown": true}),
                };
                let ok = out["unknown"].is_null();
                g.ops
                    .lock()
                    .push(op(id, call, if ok { g.now() } else { 0 }, input, out));
                ok
            }
            60..80 => {
                // Linearizable Range.
                let r = tokio::time::timeout(OP_TIMEOUT, kv.get(key, None)).await;
                match r {
                    Ok(Ok(r)) => {
                        let rev = r.header().map_or(0, |h| h.revision());
                        seen = seen.max(rev);
                        let out = match r.kvs().first() {
                            Some(kv) => {
                                last_mod.insert(name.clone(), kv.mod_revision());
                                json!({"rev": rev, "exists": true, "value": decode(kv.value()), "mod_rev": kv.mod_revision()})
                            }
                            None => {
                                last_mod.remove(&name);
                                json!({"rev": rev, "exists": false})
                            }
                        };
                        let input = json!({"op": "get", "key": name});
                        g.ops.lock().push(op(id, call, g.now(), input, out));
                        true
                    }
                    _ => false,
                }
            }
            80..95 => {
                let floor = seen;
                let opts = GetOptions::new().with_serializable();
                match tokio::time::timeout(OP_TIMEOUT, kv.get(key, Some(opts))).await {
                    Ok(Ok(r)) => {
                        let rev = r.header().map_or(0, |h| h.revision());
                        seen = seen.max(rev);
                        let kv = r
                            .kvs()
                            .first()
                            .map(|kv| (decode(kv.value()), kv.mod_revision()));
                        g.serial.lock().push(SerialRead {
                            client: format!("kv-{id}"),
                            key: name,
                            floor,
                            rev,
                            kv,
                        });
                        true
                    }
                    _ => false,
                }
            }
            _ => {
                // A Range at a past revision (maybe compacted).
                let at = (seen - rng.random_range(1..200)).max(1);
                let opts = GetOptions::new().with_revision(at);
                let r = tokio::time::timeout(OP_TIMEOUT, kv.get(key, Some(opts))).await;
                let result = match r {
                    Ok(Ok(r)) => Ok(r
                        .kvs()
                        .first()
                        .map(|kv| (decode(kv.value()), kv.mod_revision()))),
                    Ok(Err(e)) => Err(is_compacted(&e)),
                    Err(_) => Err(false),
                };
                let ok = !matches!(result, Err(false));
                if seen > 0 {
                    g.rev_reads.lock().push(RevRead {
                        client: format!("kv-{id}"),
                        key: name,
                        rev: at,
                        sent_at: call,
                        returned_at: g.now(),
                        result,
                    });
                }
                ok
            }
        };
        if ok {
            g.counters.kv_ok.fetch_add(1, Ordering::Relaxed);
        } else {
            g.counters.kv_errors.fetch_add(1, Ordering::Relaxed);
            client = None;
        }
    }
}

/// Grant a lease, put 1-3 keys with it, keep it alive, revoke it (its keys
/// are deleted in one revision: what watchers get must be atomic).
async fn lease_worker(g: Arc<G>, mut rng: StdRng) {
    let mut n = 0u64;
    while pause(&g.stop, Duration::from_millis(rng.random_range(300..1200))).await {
        let Some(c) = g.connect().await else {
            continue;
        };
        n += 1;
        let keys = rng.random_range(1..=3);
        let r = tokio::time::timeout(OP_TIMEOUT * 3, async {
            let mut lease = c.lease_client();
            let id = lease.grant(10, None).await?.id();
            let mut kv = c.kv_client();
            for j in 0..keys {
                let key = format!("{PREFIX}lease-{n:04}-{j}");
                kv.put(
                    key,
                    encode(&format!("lease-{n}")),
                    Some(PutOptions::new().with_lease(id)),
                )
                .await?;
            }
            let (mut keeper, mut stream) = lease.keep_alive(id).await?;
            keeper.keep_alive().await?;
            stream.message().await?;
            lease.revoke(id).await?;
            Ok::<_, etcd_client::Error>(())
        })
        .await;
        if matches!(r, Ok(Ok(()))) {
            g.counters.lease_ops.fetch_add(1, Ordering::Relaxed);
        } else {
            g.counters.lease_errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The shapes of watch a watcher cycles through.
fn watch_shape(kind: u64, rng: &mut StdRng, keys: usize) -> (String, bool, bool, bool, bool) {
    // (key, prefix, prev_kv, no_put, no_delete)
    match kind % 5 {
        0 => (String::new(), true, true, false, false),
        1 => (String::new(), true, true, true, false),
        2 => (String::new(), true, false, false, true),
        3 => (
            key_name(rng.random_range(0..keys)),
            false,
            true,
            false,
            false,
        ),
        _ => ("k".into(), true, true, false, false),
    }
}

fn to_ev(e: &etcd_client::Event) -> Option<Ev> {
    let kv = e.kv()?;
    let key = std::str::from_utf8(kv.key())
        .ok()?
        .strip_prefix(PREFIX)?
        .to_string();
    let delete = e.event_type() == EventType::Delete;
    Some(Ev {
        delete,
        key,
        value: if delete {
            String::new()
        } else {
            decode(kv.value())
        },
        mod_rev: kv.mod_revision(),
        create_rev: kv.create_revision(),
        version: kv.version(),
        prev: e.prev_kv().map(|p| (decode(p.value()), p.mod_revision())),
    })
}

/// Watches in turn each shape; cancels and re-creates its watch every few
/// seconds (from now, or from the next revision it has not seen), asks for
/// progress, and resumes from the last revision it saw after a break.
async fn watcher(g: Arc<G>, i: u64, mut rng: StdRng) {
    let mut generation = i;
    let mut resume: Option<i64> = None;
    let mut last_seen = 0i64;
    while !g.stop.is_cancelled() {
        let Some(c) = g.connect().await else {
            if !pause(&g.stop, Duration::from_millis(200)).await {
                return;
            }
            continue;
        };
        let (key, prefix, prev_kv, no_put, no_delete) = watch_shape(generation, &mut rng, g.keys);
        let start_rev = match resume {
            Some(r) => r,
            None if generation % 5 == 4 && last_seen > 0 => {
                (last_seen - rng.random_range(1..300)).max(1)
            }
            None => 0,
        };
        let mut opts = WatchOptions::new().with_progress_notify();
        if prefix {
            opts = opts.with_prefix();
        }
        if prev_kv {
            opts = opts.with_prev_key();
        }
        let mut filters = Vec::new();
        if no_put {
            filters.push(WatchFilterType::NoPut);
        }
        if no_delete {
            filters.push(WatchFilterType::NoDelete);
        }
        if !filters.is_empty() {
            opts = opts.with_filters(filters);
        }
        if start_rev > 0 {
            opts = opts.with_start_revision(start_rev);
        }
        let mut log = WatchLog {
            client: format!("watcher-{i}"),
            key: key.clone(),
            prefix,
            start_rev,
            sent_at: g.now(),
            prev_kv,
            no_put,
            no_delete,
            ..Default::default()
        };
        // etcd sends a catch-up of several revisions in one response (4.9 MB
        // with the clientv3 driver's revisions and prev_kv); tonic's default
        // 4 MiB limit broke such a watch at every resume, from the same
        // start. clientv3 receives up to 2 GiB by default; so does this one.
        let mut wc = c
            .watch_client()
            .max_decoding_message_size(i32::MAX as usize);
        let mut stream =
            match tokio::time::timeout(OP_TIMEOUT, wc.watch(format!("{PREFIX}{key}"), Some(opts)))
                .await
            {
                Ok(Ok(s)) => s,
                _ => {
                    g.counters.watch_breaks.fetch_add(1, Ordering::Relaxed);
                    if !pause(&g.stop, Duration::from_millis(200)).await {
                        return;
                    }
                    continue;
                }
            };
        g.counters.watches_created.fetch_add(1, Ordering::Relaxed);
        let life = tokio::time::sleep(Duration::from_millis(rng.random_range(2000..8000)));
        tokio::pin!(life);
        let mut watch_id = None;
        let mut canceling = false;
        let mut last_rev = 0i64;
        // Where a new watch resumes this one: after its last event.
        let resume_at = |last_rev: i64, created_rev: i64| {
            if last_rev > 0 {
                last_rev + 1
            } else if start_rev > 0 {
                start_rev
            } else {
                created_rev + 1
            }
        };
        // How this watch ended: None = stopped; Some(resume revision).
        let next: Option<Option<i64>> = loop {
            let tick = Duration::from_millis(rng.random_range(300..1500));
            let msg = tokio::select! {
                _ = g.stop.cancelled() => {
                    log.end = "stopped".into();
                    break None;
                }
                _ = &mut life, if !canceling && watch_id.is_some() => {
                    canceling = true;
                    g.counters.watch_cancels.fetch_add(1, Ordering::Relaxed);
                    if let Some(id) = watch_id && let Err(e) = stream.cancel(id).await {
                        log.end = format!("broken: {e}");
                        break Some(Some(resume_at(last_rev, log.created_rev)));
                    }
                    continue;
                }
                _ = tokio::time::sleep(tick), if !canceling => {
                    g.counters.progress_requests.fetch_add(1, Ordering::Relaxed);
                    if let Err(e) = stream.request_progress().await {
                        log.end = format!("broken: {e}");
                        break Some(Some(resume_at(last_rev, log.created_rev)));
                    }
                    continue;
                }
                _ = tokio::time::sleep(OP_TIMEOUT), if canceling => {
                    log.end = "cancel unanswered".into();
                    break Some(None);
                }
                m = stream.message() => m,
            };
            let resp = match msg {
                Ok(Some(r)) => r,
                other => {
                    g.counters.watch_breaks.fetch_add(1, Ordering::Relaxed);
                    log.end = match other {
                        Err(e) => format!("broken: {e}"),
                        _ => "broken: end of stream".into(),
                    };
                    break Some(Some(resume_at(last_rev, log.created_rev)));
                }
            };
            let rev = resp.header().map_or(0, |h| h.revision());
            if resp.created() {
                log.created_rev = rev;
                watch_id = Some(resp.watch_id());
                if resp.canceled() {
                    // Refused at creation (compacted start revision).
                    if resp.compact_revision() > 0 {
                        log.compacted = Some(resp.compact_revision());
                    }
                    log.end = "refused".into();
                    break Some(None);
                }
                continue;
            }
            if resp.canceled() {
                if resp.compact_revision() > 0 {
                    log.compacted = Some(resp.compact_revision());
                    log.end = "compacted".into();
                    break Some(Some(resp.compact_revision()));
                }
                log.end = "canceled".into();
                break Some(None);
            }
            let events: Vec<Ev> = resp.events().iter().filter_map(to_ev).collect();
            if canceling && events.is_empty() {
                // After a cancel request a stream's progress speaks for its
                // other watches only: etcd answers over the watchers it
                // still has, and may have dropped this one's.
                continue;
            }
            if let Some(e) = events.last() {
                last_rev = last_rev.max(e.mod_rev);
            }
            log.resps.push(Resp {
                rev,
                progress: events.is_empty(),
                events,
            });
        };
        log.ended_at = g.now();
        last_seen = last_seen.max(last_rev).max(log.created_rev);
        let broken = log.end.starts_with("broken");
        g.watches.lock().push(log);
        // A broken stream: the front may be down; do not spin.
        if broken && !pause(&g.stop, Duration::from_millis(200)).await {
            return;
        }
        match next {
            None => return,
            // Broken or compacted: resume where it stopped, same shape.
            Some(Some(r)) if r > 1 => resume = Some(r),
            // Canceled: re-create, from now or from the next revision.
            _ => {
                generation += 1;
                resume = (last_rev > 0 && rng.random_bool(0.3)).then_some(last_rev + 1);
            }
        }
    }
}

/// Prints the run's summary.
pub fn print(out: &GrpcOutcome, seed: u64) {
    let j = &out.json;
    let r = &out.report;
    println!("chaos --front grpc (seed {seed})");
    println!("  faults injected       {}", out.faults.len());
    for (k, v) in j["faults_by_kind"].as_object().into_iter().flatten() {
        println!("    {k:<20} {v}");
    }
    super::print_recovery(&j["recovery_by_kind"]);
    super::print_memory(&j["daemon_memory"]);
    println!(
        "  kv ops                {} ok, {} failed during faults",
        j["kv_ops_ok"], j["kv_ops_failed"]
    );
    println!(
        "  linearizability       {} ops, porcupine: {}",
        j["linearizability"]["ops_checked"], j["linearizability"]["result"]
    );
    println!("  serializable reads    {}", r.serializable_checked);
    println!(
        "  past-revision reads   {} ({} ErrCompacted)",
        r.rev_reads_checked, r.compacted_answers
    );
    println!("  lease cycles          {}", j["lease_ops"]);
    let go = &j["clientv3"];
    println!(
        "  clientv3 (Go)         {} kv ops, {} serializable reads, {} watches, {} events, {} revisions of 1.2 MB",
        go["kv_ops"], go["serializable_reads"], go["watches"], go["events"], go["big_revisions"]
    );
    println!("  watches checked       {}", r.watches_checked);
    println!("  events checked        {}", r.events_checked);
    println!("  progress checked      {}", r.progress_checked);
    println!("  violations            {}", out.violations());
    for k in &out.illegal_keys {
        println!("    Linearizability key {k}");
    }
    if !out.unknown_keys.is_empty() {
        println!("    (porcupine timed out on keys {:?})", out.unknown_keys);
    }
    for v in r.violations.iter().take(20) {
        println!("    {} {}: {}", v.kind, v.client, v.detail);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_go_drivers_records_become_the_checkers() {
        let w = json!({
            "client": "clientv3-watch-100", "key": "k", "prefix": true,
            "start_rev": 7, "created_rev": 9, "sent_at": 5, "prev_kv": true,
            "resps": [
                {"rev": 10, "progress": false, "events": [
                    {"delete": false, "key": "k01", "value": "g100-1", "mod_rev": 10,
                     "create_rev": 8, "version": 2, "prev": ["g100-0", 8]},
                    {"delete": true, "key": "k02", "value": "", "mod_rev": 10,
                     "create_rev": 0, "version": 0},
                ]},
                {"rev": 12, "progress": true, "events": []},
            ],
            "compacted": 3, "end": "compacted", "ended_at": 99,
        });
        let l = go_watch(&w);
        assert_eq!(
            (l.start_rev, l.created_rev, l.sent_at, l.ended_at),
            (7, 9, 5, 99)
        );
        assert!(l.prefix && l.prev_kv && !l.no_put && !l.no_delete);
        assert_eq!(l.compacted, Some(3));
        assert_eq!(l.end, "compacted");
        assert_eq!(l.resps.len(), 2);
        let e = &l.resps[0].events;
        assert_eq!(e[0].prev, Some(("g100-0".to_string(), 8)));
        assert!(e[1].delete && e[1].prev.is_none());
        assert_eq!((e[0].mod_rev, e[0].create_rev, e[0].version), (10, 8, 2));
        assert!(l.resps[1].progress && l.resps[1].events.is_empty());

        let r = go_serial(&json!({"client": "clientv3-100", "key": "k03",
            "floor": 4, "rev": 6, "value": "v", "mod_rev": 5}));
        assert_eq!((r.floor, r.rev, r.kv), (4, 6, Some(("v".to_string(), 5))));
        let r = go_serial(&json!({"client": "clientv3-100", "key": "k03", "floor": 4, "rev": 6}));
        assert_eq!(r.kv, None);
    }
}

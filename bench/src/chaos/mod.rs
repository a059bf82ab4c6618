//! `watchcache-bench chaos`: clients and faults against etcd and the daemon,
//! then an independent check of everything the clients saw (docs/RELIABILITY.md).
//!
//! Clients: CAS writers through the daemon (read, modify, PUT with the
//! resourceVersion read, retry on 409), a writer straight to etcd (puts and
//! deletes), watchers (all objects or a label selector; some disconnect and
//! resume from their last resourceVersion; all relist after 410) and listers
//! paging with limit/continue. Faults, on a schedule drawn from `--seed`:
//! SIGSTOP/SIGCONT of etcd, SIGKILL and restart of etcd, compaction while
//! the daemon is cut off from etcd, etcd silent for longer than the daemon's
//! watch timeout, SIGKILL and restart of the daemon. The daemon reaches etcd
//! through the bench's [`proxy::TcpProxy`], which the bench cuts or silences.
//!
//! With `--etcd-members 3` the run starts its own [`cluster::Cluster`] and
//! adds member faults: SIGKILL of the leader, SIGSTOP of the member holding
//! the daemon's watch, a partition of that member from the others, a rolling
//! restart and a rolling upgrade. After every fault the run measures the time
//! until the daemon serves fresh data again ([`recovery`]).

pub mod api;
pub mod checker;
pub mod cluster;
pub mod grpc;
pub mod grpc_checker;
pub mod memory;
pub mod proxy;
pub mod recorder;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use etcd_client::{Client, CompactionOptions, KvClient};
use futures::StreamExt;
use http_body_util::BodyExt;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::env::{
    Daemon, EtcdKeeper, clear_prefix, current_revision, daemon_config, etcd_connect_all, ns_prefix,
};
use crate::wire::LineSplitter;
use api::{Api, ApiError, split_object};
use checker::{Ack, ClientLog, Compaction, History, Kind, Obs, Report, Selection};
use cluster::Cluster;
use proxy::{Mode, TcpProxy};
use recorder::Recorder;

/// The daemon's watch timeout: its reflector asks a silent etcd watch for
/// progress after 5 s and restarts it 10 s later (cacher defaults).
const DAEMON_WATCH_TIMEOUT: Duration = Duration::from_secs(15);

/// What the chaos run is pointed at and how hard it pushes.
#[derive(Debug, Clone)]
pub struct ChaosParams {
    pub duration: Duration,
    pub seed: u64,
    pub watchers: usize,
    pub listers: usize,
    /// Writes per second, all writers together.
    pub rate: f64,
    /// Distinct objects the writers cycle over.
    pub keys: usize,
    pub namespace: String,
    pub etcd_prefix: String,
    pub etcd_endpoint: String,
    /// pid of an etcd the bench did not start (SIGSTOP faults only).
    pub etcd_pid: Option<u32>,
    /// A running daemon (`--proxy`/`--daemon`): no daemon or cut faults.
    pub daemon_authority: Option<String>,
    pub watchcache_bin: std::path::PathBuf,
    /// Members of the etcd cluster the run starts (1: the single etcd of
    /// `etcd_endpoint`).
    pub etcd_members: usize,
    /// The etcd binary of the cluster's members.
    pub etcd_bin: std::path::PathBuf,
    /// The binaries of the rolling upgrade, oldest first (empty: none).
    pub etcd_upgrades: Vec<std::path::PathBuf>,
    /// Keep the daemon's directory (its config and `watchcache.log`) after
    /// the run, failed or not, to read its log around a violation.
    pub keep_dir: bool,
}

/// How long a member fault holds the member down (stopped, cut off) at most
/// while the run waits for the daemon to serve fresh data without it.
const MEMBER_FAULT_HOLD: Duration = Duration::from_secs(30);

/// How long the run waits for the daemon to serve fresh data after a fault.
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(90);

/// The object the recovery probe writes (not one the writers touch).
const PROBE: &str = "chaos-probe";

/// The faults the bench injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// SIGSTOP etcd for 1-4 s, then SIGCONT.
    EtcdStop,
    /// SIGKILL etcd and start it again (same data dir, same ports).
    EtcdKill,
    /// Cut the daemon off etcd, write, compact etcd, reconnect.
    CompactWhileCut,
    /// Silence the daemon's etcd connections for longer than its watch timeout.
    EtcdSilent,
    /// SIGKILL the daemon and start it again (same config, same address).
    DaemonKill,
    /// SIGKILL the cluster's leader; start it again once the daemon serves
    /// fresh data without it.
    LeaderKill,
    /// SIGSTOP the member holding the daemon's watch until the daemon serves
    /// fresh data without it (at most 30 s), then SIGCONT.
    MemberStop,
    /// Cut the member holding the daemon's watch off the other members
    /// (at least 3 s, until the daemon serves fresh data, at most 30 s);
    /// heal and wait until it has caught up.
    MemberPartition,
    /// SIGTERM and start each member in turn (the leader last).
    RollingRestart,
    /// A rolling restart onto each newer binary in turn (3.5 -> 3.6 -> 3.7).
    RollingUpgrade,
}

impl Fault {
    /// The member fault of the same name, if it is one.
    fn member(self) -> Option<MemberFault> {
        Some(match self {
            Fault::LeaderKill => MemberFault::LeaderKill,
            Fault::MemberStop => MemberFault::MemberStop,
            Fault::MemberPartition => MemberFault::MemberPartition,
            Fault::RollingRestart => MemberFault::RollingRestart,
            Fault::RollingUpgrade => MemberFault::RollingUpgrade,
            _ => return None,
        })
    }

    /// About how long the fault and its recovery take.
    fn needs(self) -> Duration {
        match self {
            Fault::EtcdStop => Duration::from_secs(5),
            Fault::EtcdKill => Duration::from_secs(5),
            Fault::CompactWhileCut => Duration::from_secs(6),
            Fault::EtcdSilent => DAEMON_WATCH_TIMEOUT + Duration::from_secs(5),
            Fault::DaemonKill => Duration::from_secs(5),
            Fault::LeaderKill => Duration::from_secs(5),
            Fault::MemberStop => Duration::from_secs(16),
            Fault::MemberPartition => Duration::from_secs(9),
            Fault::RollingRestart => Duration::from_secs(6),
            Fault::RollingUpgrade => Duration::from_secs(30),
        }
    }
}

/// One injected fault.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    pub fault: Fault,
    pub at_s: f64,
    pub took_s: f64,
    /// When the daemon served fresh data again (the slowest of a rolling
    /// fault's steps); None if not within 90 s.
    pub recovery: Option<Fresh>,
    pub detail: String,
}

/// The daemon's recovery from a fault, in seconds from the fault (or its
/// undoing): until it served fresh data, and of that the time until etcd
/// took the probe's write (etcd's own unavailability; the rest is the
/// daemon's).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Fresh {
    pub s: f64,
    pub etcd_write_s: f64,
}

/// The slower of two recoveries (None, not recovered, is slowest).
fn slower(a: Option<Fresh>, b: Option<Fresh>) -> Option<Fresh> {
    a.zip(b).map(|(a, b)| if b.s > a.s { b } else { a })
}

/// Counters the clients share.
#[derive(Default)]
struct Counters {
    write_attempts: AtomicU64,
    write_conflicts: AtomicU64,
    write_errors: AtomicU64,
    list_errors: AtomicU64,
    watch_errors: AtomicU64,
}

/// Holds writers back while the bench compacts (no write may land between
/// the compaction and the daemon's relist, so the relist revision is known).
struct WriteGate {
    open: watch::Sender<bool>,
    in_flight: AtomicUsize,
}

impl WriteGate {
    /// Waits until writes are allowed and registers one in flight.
    async fn enter(&self, stop: &CancellationToken) -> Option<WriteTicket<'_>> {
        loop {
            self.in_flight.fetch_add(1, Ordering::SeqCst);
            if *self.open.borrow() {
                return Some(WriteTicket(self));
            }
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            let mut rx = self.open.subscribe();
            tokio::select! {
                _ = stop.cancelled() => return None,
                _ = rx.wait_for(|o| *o) => {}
            }
        }
    }

    /// Closes the gate and waits for the writes in flight.
    async fn close(&self) {
        self.open.send_replace(false);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
        while self.in_flight.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn reopen(&self) {
        self.open.send_replace(true);
    }
}

struct WriteTicket<'a>(&'a WriteGate);

impl Drop for WriteTicket<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What every client task shares.
struct Shared {
    api: Api,
    stop: CancellationToken,
    gate: WriteGate,
    acks: Mutex<Vec<Ack>>,
    counters: Counters,
    keys: usize,
    namespace: String,
    prefix: String,
    /// The last resourceVersion (event, bookmark or List) each watcher of
    /// all objects has seen, for the recovery probe.
    positions: Vec<AtomicI64>,
    /// The recovery probe's writes so far.
    probes: AtomicU64,
    /// The recovery probe's consistent Lists, checked as the listers' are.
    probe_log: Mutex<Vec<Obs>>,
}

fn object_name(i: usize) -> String {
    format!("chaos-{i:03}")
}

fn new_object(ns: &str, name: &str, group: &str, write_id: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"group": group}},
        "spec": {"writeId": write_id},
    })
}

/// The result of a chaos run.
pub struct ChaosOutcome {
    pub report: Report,
    pub faults: Vec<FaultRecord>,
    pub json: Value,
    /// etcd's version at the end of the run (after an upgrade, the newest).
    pub etcd_version: Option<String>,
}

/// Runs the chaos scenario. Call it from the thread that should own the
/// daemon (it is spawned and restarted from here: PDEATHSIG).
pub async fn run(p: ChaosParams, keeper: Option<&EtcdKeeper>) -> Result<ChaosOutcome> {
    let started = Instant::now();
    let prefix = ns_prefix(&p.etcd_prefix, &p.namespace);
    let (mut cluster, endpoints) = start_etcd(&p).await?;
    let client = etcd_connect_all(&endpoints).await?;
    let mut kv = client.kv_client();
    let base = clear_prefix(&mut kv, &prefix).await?;
    let recorder = Recorder::start(&endpoints, &prefix, base).await?;
    // A client per member, for the recovery probe's writes.
    let mut members = Vec::new();
    for ep in &endpoints {
        members.push(crate::env::etcd_connect(ep).await?);
    }
    let mut rng = StdRng::seed_from_u64(p.seed);

    // The objects every writer cycles over, straight into etcd.
    for i in 0..p.keys {
        let name = object_name(i);
        let group = if i % 2 == 0 { "a" } else { "b" };
        let v = new_object(&p.namespace, &name, group, &format!("init-{i}"));
        kv.put(format!("{prefix}{name}"), v.to_string(), None)
            .await
            .context("loading the chaos objects")?;
    }

    // The daemon, given every member's endpoint, each behind our proxy
    // (or one that is already running).
    let mut proxies: Vec<TcpProxy> = Vec::new();
    let mut daemon = None;
    let mut kept_dir = None;
    let rss = memory::RssSampler::start(0, started);
    let authority = match &p.daemon_authority {
        Some(a) => a.clone(),
        None => {
            proxies = proxies_for(&endpoints).await?;
            let history = ((p.rate * p.duration.as_secs_f64()) as usize * 2).max(10_000);
            let via: Vec<String> = proxies.iter().map(TcpProxy::endpoint).collect();
            let cfg = daemon_config(&via, &p.etcd_prefix, history, None, &[]);
            let mut d = Daemon::spawn(&p.watchcache_bin, &cfg)?;
            kept_dir = p.keep_dir.then(|| d.keep_dir());
            d.wait_ready(Instant::now(), Duration::from_secs(120))
                .await
                .context("starting watchcache")?;
            let a = d.authority.clone();
            rss.set_pid(d.pid);
            daemon = Some(d);
            a
        }
    };
    let set_proxies = |m: Mode| proxies.iter().for_each(|px| px.set(m));
    let api = Api {
        authority: authority.clone(),
        namespace: p.namespace.clone(),
    };
    api.wait_ready(Duration::from_secs(60)).await?;

    let (open, _) = watch::channel(true);
    let shared = Arc::new(Shared {
        api: api.clone(),
        stop: CancellationToken::new(),
        gate: WriteGate {
            open,
            in_flight: AtomicUsize::new(0),
        },
        acks: Mutex::new(Vec::new()),
        counters: Counters::default(),
        keys: p.keys.max(1),
        namespace: p.namespace.clone(),
        prefix: prefix.clone(),
        positions: (0..p.watchers).map(|_| AtomicI64::new(0)).collect(),
        probes: AtomicU64::new(0),
        probe_log: Mutex::new(Vec::new()),
    });

    // Clients.
    let per_writer = (p.rate / 3.0).max(0.1);
    let mut writers: Vec<JoinHandle<()>> = Vec::new();
    for id in 0..2 {
        let rng = StdRng::seed_from_u64(p.seed.wrapping_mul(1_000_003).wrapping_add(id));
        writers.push(tokio::spawn(cas_writer(
            shared.clone(),
            id,
            per_writer,
            rng,
        )));
    }
    {
        let rng = StdRng::seed_from_u64(p.seed.wrapping_mul(1_000_003).wrapping_add(99));
        writers.push(tokio::spawn(etcd_writer(
            shared.clone(),
            client.clone(),
            per_writer,
            rng,
        )));
    }
    let mut readers: Vec<JoinHandle<ClientLog>> = Vec::new();
    for i in 0..p.watchers {
        let (sel, resume) = match i % 4 {
            0 => (Selection::All, false),
            1 => (Selection::Group("a".into()), false),
            2 => (Selection::All, true),
            _ => (Selection::Group("b".into()), true),
        };
        let name = format!(
            "watcher-{i}{}{}",
            sel.label_selector()
                .map(|s| format!("[{s}]"))
                .unwrap_or_default(),
            if resume { "-resuming" } else { "" }
        );
        let rng = StdRng::seed_from_u64(p.seed.wrapping_mul(7919).wrapping_add(i as u64));
        readers.push(tokio::spawn(watcher(
            shared.clone(),
            i,
            name,
            sel,
            resume,
            rng,
        )));
    }
    for i in 0..p.listers {
        let sel = if i % 2 == 0 {
            Selection::All
        } else {
            Selection::Group("a".into())
        };
        let rng = StdRng::seed_from_u64(p.seed.wrapping_mul(104_729).wrapping_add(i as u64));
        readers.push(tokio::spawn(lister(
            shared.clone(),
            format!("lister-{i}"),
            sel,
            rng,
        )));
    }

    // Faults, on the seeded schedule, from this thread.
    let mut kinds: Vec<Fault> = Vec::new();
    let etcd_pid = || p.etcd_pid.or_else(|| keeper.map(|k| k.pid()));
    if etcd_pid().is_some() || cluster.is_some() {
        kinds.push(Fault::EtcdStop);
    }
    if keeper.is_some() || cluster.is_some() {
        kinds.push(Fault::EtcdKill);
    }
    if !proxies.is_empty() {
        kinds.push(Fault::CompactWhileCut);
        kinds.push(Fault::EtcdSilent);
    }
    if daemon.is_some() {
        kinds.push(Fault::DaemonKill);
    }
    if cluster.as_ref().is_some_and(|c| c.len() >= 3) {
        kinds.extend([
            Fault::LeaderKill,
            Fault::MemberStop,
            Fault::MemberPartition,
            Fault::RollingRestart,
        ]);
        if !p.etcd_upgrades.is_empty() {
            kinds.push(Fault::RollingUpgrade);
        }
    }
    if kinds.is_empty() {
        eprintln!(
            "chaos: no fault can be injected (a running etcd needs --etcd-pid; a running daemon allows no daemon or cut faults)"
        );
    } else {
        eprintln!("chaos: faults available: {kinds:?}");
    }
    let deadline = started + p.duration;
    let mut faults: Vec<FaultRecord> = Vec::new();
    let mut compactions: Vec<Compaction> = Vec::new();
    let mut order: Vec<Fault> = Vec::new();
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
        let t0 = Instant::now();
        let at_s = t0.duration_since(started).as_secs_f64();
        // When the fault was undone (the daemon's recovery is measured from
        // there), or the recovery the fault measured itself.
        let (detail, recovered) = match fault {
            Fault::EtcdStop => {
                let pids: Vec<u32> = match &cluster {
                    Some(c) => (0..c.len()).filter_map(|i| c.pid(i)).collect(),
                    None => vec![etcd_pid().ok_or_else(|| anyhow!("no etcd pid"))?],
                };
                let ms = rng.random_range(1000..4000);
                stop_for(&pids, Duration::from_millis(ms)).await?;
                let what = if cluster.is_some() {
                    "every etcd member"
                } else {
                    "etcd"
                };
                (
                    format!("{what} (pid {pids:?}) stopped for {ms} ms"),
                    Recovered::Since(Instant::now()),
                )
            }
            Fault::EtcdKill => match cluster.as_mut() {
                Some(c) => {
                    let took = c.kill_and_restart_all().await?;
                    (
                        format!("every etcd member killed and restarted, healthy after {took:?}"),
                        Recovered::Since(Instant::now()),
                    )
                }
                None => {
                    let k = keeper.ok_or_else(|| anyhow!("no etcd keeper"))?;
                    let took = k.restart().await?;
                    (
                        format!("etcd killed and restarted, healthy after {took:?}"),
                        Recovered::Since(Instant::now()),
                    )
                }
            },
            Fault::CompactWhileCut => {
                let c = compact_while_cut(&shared, &proxies, &recorder, &client, &mut rng).await?;
                let d = format!(
                    "daemon cut off, etcd compacted at {}, daemon caught up by {}",
                    c.rev, c.caught_up
                );
                compactions.push(c);
                (d, Recovered::Since(Instant::now()))
            }
            Fault::EtcdSilent => {
                let silent = DAEMON_WATCH_TIMEOUT + Duration::from_secs(2);
                set_proxies(Mode::Blackhole);
                tokio::time::sleep(silent).await;
                set_proxies(Mode::Forward);
                (
                    format!("etcd silent to the daemon for {silent:?}"),
                    Recovered::Since(Instant::now()),
                )
            }
            Fault::DaemonKill => {
                let d = daemon.as_mut().ok_or_else(|| anyhow!("no daemon"))?;
                let ms = rng.random_range(200..2000);
                d.kill();
                tokio::time::sleep(Duration::from_millis(ms)).await;
                d.restart()?;
                rss.set_pid(d.pid);
                (
                    format!("daemon killed, restarted after {ms} ms (pid {})", d.pid),
                    Recovered::Since(Instant::now()),
                )
            }
            Fault::LeaderKill
            | Fault::MemberStop
            | Fault::MemberPartition
            | Fault::RollingRestart
            | Fault::RollingUpgrade => {
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
                    member_fault(mf, c, &ctx, &mut rng, |t| recovery(&shared, &members, t)).await?;
                if mf == MemberFault::RollingUpgrade {
                    // Once: the cluster does not go back.
                    kinds.retain(|k| *k != Fault::RollingUpgrade);
                }
                (d, Recovered::Measured(r))
            }
        };
        let recovery = match recovered {
            Recovered::Since(t) => recovery(&shared, &members, t).await,
            Recovered::Measured(r) => r,
        };
        // Recovered: the daemon serves again.
        api.wait_ready(Duration::from_secs(90))
            .await
            .with_context(|| format!("recovering from {fault:?}"))?;
        let rec = recovery.map_or("not within 90 s".into(), |r| {
            format!(
                "{:.2} s (etcd took a write after {:.2} s)",
                r.s, r.etcd_write_s
            )
        });
        eprintln!("chaos: {at_s:6.1}s {fault:?}: {detail}; fresh data after {rec}");
        faults.push(FaultRecord {
            fault,
            at_s,
            took_s: t0.elapsed().as_secs_f64(),
            recovery,
            detail,
        });
    }
    tokio::time::sleep(deadline.saturating_duration_since(Instant::now())).await;

    // Stop the clients; collect what they saw.
    shared.stop.cancel();
    for w in writers {
        let _ = w.await;
    }
    let mut logs = Vec::new();
    for r in readers {
        logs.push(r.await.context("a chaos client panicked")?);
    }

    // The end state: everything in etcd recorded, the daemon's final List.
    let end_rev = retry(Duration::from_secs(30), || {
        let mut kv = client.kv_client();
        async move { current_revision(&mut kv).await }
    })
    .await?;
    recorder.wait_for(end_rev, Duration::from_secs(60)).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let final_list = loop {
        match api.list(&Selection::All, 0, None).await {
            Ok(l) => break l,
            Err(e) if tokio::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => bail!("final List from the daemon: {e}"),
        }
    };
    let history = recorder.finish().await?;
    let etcd_version = etcd_version_of(&endpoints).await;
    drop(cluster);
    drop(daemon);
    drop(proxies);

    logs.push(ClientLog {
        name: "recovery-probe".into(),
        selection: Selection::All,
        obs: std::mem::take(&mut *shared.probe_log.lock()),
    });
    let acks = std::mem::take(&mut *shared.acks.lock());
    let report = checker::check(
        &history,
        &compactions,
        &logs,
        &acks,
        Some((final_list.0, &final_list.1)),
    );
    let mut json = report_json(
        &p,
        &report,
        &faults,
        &compactions,
        &history,
        &shared.counters,
        started,
    );
    json["daemon_memory"] = rss.report();
    json["daemon_dir"] = json!(kept_dir);
    Ok(ChaosOutcome {
        report,
        faults,
        json,
        etcd_version,
    })
}

fn report_json(
    p: &ChaosParams,
    r: &Report,
    faults: &[FaultRecord],
    compactions: &[Compaction],
    h: &History,
    c: &Counters,
    started: Instant,
) -> Value {
    let mut by_kind: BTreeMap<String, u64> = BTreeMap::new();
    for f in faults {
        *by_kind
            .entry(
                serde_json::to_value(f.fault)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
            )
            .or_insert(0) += 1;
    }
    // Recovery per fault kind: the time until the daemon served fresh data.
    let mut rec: BTreeMap<String, Vec<Option<Fresh>>> = BTreeMap::new();
    for f in faults {
        let k = serde_json::to_value(f.fault)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        rec.entry(k).or_default().push(f.recovery);
    }
    let recovery_by_kind: BTreeMap<String, Value> = rec
        .into_iter()
        .map(|(k, v)| (k, recovery_summary(&v)))
        .collect();
    json!({
        "seed": p.seed,
        "etcd_members": p.etcd_members.max(1),
        "duration_s": p.duration.as_secs_f64(),
        "elapsed_s": started.elapsed().as_secs_f64(),
        "watchers": p.watchers,
        "listers": p.listers,
        "rate_per_s": p.rate,
        "keys": p.keys,
        "events_checked": r.events_checked,
        "bookmarks_checked": r.bookmarks_checked,
        "lists_checked": r.lists_checked,
        "faults_injected": faults.len(),
        "faults_by_kind": by_kind,
        "recovery_by_kind": recovery_by_kind,
        "faults": faults,
        "compactions": compactions,
        "writes_acknowledged": r.writes_acknowledged,
        "write_attempts": c.write_attempts.load(Ordering::Relaxed),
        "write_conflicts": c.write_conflicts.load(Ordering::Relaxed),
        "write_errors": c.write_errors.load(Ordering::Relaxed),
        "list_errors": c.list_errors.load(Ordering::Relaxed),
        "watch_errors": c.watch_errors.load(Ordering::Relaxed),
        "watch_expired": r.expired,
        "relist_events": r.relist_events,
        "compacted_events_skipped": r.compacted_events_skipped,
        "etcd_history_changes": h.changes.len(),
        "violations": r.violations.len(),
        "violations_by_kind": r.counts(),
        "violation_list": r.violations.iter().take(100).collect::<Vec<_>>(),
    })
}

/// Prints a run's `daemon_memory` ([`memory::RssSampler::report`]).
pub fn print_memory(m: &Value) {
    let mb = |k: &str| {
        m[k].as_u64()
            .map_or("-".into(), |kb| format!("{:.1}", kb as f64 / 1024.0))
    };
    println!(
        "  daemon RSS (MB)       {} peak; first quarter {}, last quarter {}; {} daemon processes",
        mb("peak_rss_kb"),
        mb("first_quarter_peak_rss_kb"),
        mb("last_quarter_peak_rss_kb"),
        m["daemon_lifetimes"].as_array().map_or(0, Vec::len)
    );
}

/// Prints a run's `recovery_by_kind` (see [`recovery_summary`]).
pub fn print_recovery(by_kind: &Value) {
    let recovery = by_kind.as_object();
    if recovery.is_some_and(|m| !m.is_empty()) {
        println!(
            "  fresh data after a fault (s): min / median / max; of which after etcd took a write, max; recovered/faults"
        );
    }
    for (k, v) in recovery.into_iter().flatten() {
        let s = |f: &str| v[f].as_f64().map_or("-".into(), |x| format!("{x:.2}"));
        println!(
            "    {k:<20} {} / {} / {}; {}; {}/{}",
            s("min_s"),
            s("median_s"),
            s("max_s"),
            s("max_after_etcd_write_s"),
            v["recovered"],
            v["faults"]
        );
    }
}

/// The recoveries of one fault kind: how many faults, how many recovered
/// within the timeout, the min, median and max seconds of those, and the
/// most the daemon took after etcd had taken the probe's write.
fn recovery_summary(v: &[Option<Fresh>]) -> Value {
    let mut ok: Vec<f64> = v.iter().flatten().map(|f| f.s).collect();
    ok.sort_by(f64::total_cmp);
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    let after_write = v
        .iter()
        .flatten()
        .map(|f| f.s - f.etcd_write_s)
        .reduce(f64::max);
    json!({
        "faults": v.len(),
        "recovered": ok.len(),
        "min_s": ok.first().map(|x| round(*x)),
        "median_s": ok.get(ok.len() / 2).map(|x| round(*x)),
        "max_s": ok.last().map(|x| round(*x)),
        "max_after_etcd_write_s": after_write.map(round),
    })
}

/// Retries `f` until it succeeds or `timeout` passes.
async fn retry<T, F, Fut>(timeout: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

fn signal(pid: u32, sig: libc::c_int) -> Result<()> {
    // SAFETY: kill(2) on the etcd process this run started or was given.
    let r = unsafe { libc::kill(pid as libc::pid_t, sig) };
    if r != 0 {
        bail!("kill({pid}, {sig}): {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// The cluster the run starts (`--etcd-members` of 2 or more) and the etcd
/// endpoints it uses (the cluster's, or the one etcd).
async fn start_etcd(p: &ChaosParams) -> Result<(Option<Cluster>, Vec<String>)> {
    let cluster = match p.etcd_members {
        0 | 1 => None,
        n => Some(
            Cluster::start(n, &p.etcd_bin)
                .await
                .with_context(|| format!("starting a {n}-member etcd cluster"))?,
        ),
    };
    let endpoints = match &cluster {
        Some(c) => c.endpoints(),
        None => vec![p.etcd_endpoint.clone()],
    };
    Ok((cluster, endpoints))
}

/// A cuttable proxy in front of each etcd endpoint, for the daemon.
async fn proxies_for(endpoints: &[String]) -> Result<Vec<TcpProxy>> {
    let mut proxies = Vec::new();
    for ep in endpoints {
        let target: SocketAddr = ep
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .with_context(|| format!("etcd endpoint {ep} is not http://IP:PORT"))?;
        proxies.push(TcpProxy::start(target).await?);
    }
    Ok(proxies)
}

/// SIGSTOPs the processes `pids` for `d`, then SIGCONTs them.
async fn stop_for(pids: &[u32], d: Duration) -> Result<()> {
    for pid in pids {
        signal(*pid, libc::SIGSTOP)?;
    }
    tokio::time::sleep(d).await;
    for pid in pids {
        signal(*pid, libc::SIGCONT)?;
    }
    Ok(())
}

/// etcd's version, from the first of `endpoints` that answers.
async fn etcd_version_of(endpoints: &[String]) -> Option<String> {
    for ep in endpoints {
        if let Some(v) = crate::env::etcd_version(ep).await {
            return Some(v);
        }
    }
    None
}

/// Puts `value` at `key` on every member at once, each on its own
/// connection: the first to answer gives the revision, so the bench's own
/// client waits neither for a dead member nor for a connection to fail
/// over. None if none answered within 2 s.
async fn probe_put(members: &[Client], key: &str, value: &str) -> Option<i64> {
    let puts = members.iter().map(|c| {
        let mut kv = c.kv_client();
        let (key, value) = (key.to_string(), value.to_string());
        Box::pin(async move {
            match tokio::time::timeout(Duration::from_secs(2), kv.put(key, value, None)).await {
                Ok(Ok(r)) => r.header().map(|h| h.revision()).ok_or(()),
                _ => Err(()),
            }
        })
    });
    futures::future::select_ok(puts)
        .await
        .ok()
        .map(|(rev, _)| rev)
}

/// Where a fault's recovery time comes from.
enum Recovered {
    /// Measured by the run from this moment (the fault undone).
    Since(Instant),
    /// Measured by the fault itself (None: not within the timeout).
    Measured(Option<Fresh>),
}

/// Seconds from `since` until the daemon serves fresh data: a write made
/// straight to etcd after `since` is in a consistent List from the daemon
/// (its resourceVersion is at least the write's revision) and every watcher
/// of all objects has seen it (an event, bookmark or List at least as new).
/// None if that takes longer than [`RECOVERY_TIMEOUT`].
async fn recovery(s: &Shared, members: &[Client], since: Instant) -> Option<Fresh> {
    let deadline = since + RECOVERY_TIMEOUT;
    let key = format!("{}{PROBE}", s.prefix);
    let rev = loop {
        let id = format!("probe-{}", s.probes.fetch_add(1, Ordering::Relaxed));
        let v = new_object(&s.namespace, PROBE, "a", &id).to_string();
        if let Some(rev) = probe_put(members, &key, &v).await {
            s.acks.lock().push(Ack {
                name: PROBE.into(),
                rev,
                write_id: Some(id),
            });
            break rev;
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let written = since.elapsed();
    loop {
        let list = s.api.list(&Selection::All, 0, None);
        if let Ok(Ok((rv, items))) = tokio::time::timeout(Duration::from_secs(5), list).await {
            s.probe_log.lock().push(Obs::List { rv, items });
            if rv >= rev {
                break;
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while s.positions.iter().any(|p| p.load(Ordering::Relaxed) < rev) {
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Some(Fresh {
        s: since.elapsed().as_secs_f64(),
        etcd_write_s: written.as_secs_f64(),
    })
}

/// Holds a member fault begun at `since` until `probe` (the daemon's
/// recovery from `since`) sees fresh data without the member (at least
/// `min`, at most [`MEMBER_FAULT_HOLD`]), then undoes it. Returns the
/// recovery time (past the hold it includes the time after the undo) and how
/// long the fault was held.
async fn hold(
    probe: impl std::future::Future<Output = Option<Fresh>>,
    since: Instant,
    min: Duration,
    undo: impl FnOnce(),
) -> (Option<Fresh>, Duration) {
    tokio::pin!(probe);
    let mut undo = Some(undo);
    let mut held = None;
    let r = tokio::select! {
        r = &mut probe => r,
        _ = tokio::time::sleep(MEMBER_FAULT_HOLD) => {
            if let Some(u) = undo.take() {
                u();
            }
            held = Some(since.elapsed());
            probe.await
        }
    };
    tokio::time::sleep((since + min).saturating_duration_since(Instant::now())).await;
    if let Some(u) = undo.take() {
        u();
    }
    (r, held.unwrap_or_else(|| since.elapsed()))
}

/// The member holding the daemon's watch: the one whose client proxy moved
/// the most bytes to the daemon in the last second (the watch's events), if
/// it also has an etcd watch stream that is not the recorder's
/// (`etcd_debugging_mvcc_watch_stream_total`). A member at random if none
/// does; says which.
async fn watch_member(
    c: &Cluster,
    proxies: &[TcpProxy],
    recorder: &Recorder,
    rng: &mut StdRng,
) -> (usize, &'static str) {
    let before: Vec<u64> = proxies.iter().map(TcpProxy::bytes_to_clients).collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut by_bytes: Vec<(u64, usize)> = proxies
        .iter()
        .zip(before)
        .enumerate()
        .map(|(i, (p, b))| (p.bytes_to_clients().saturating_sub(b), i))
        .collect();
    by_bytes.sort_unstable_by(|a, b| b.cmp(a));
    let mine = recorder.member();
    for (_, i) in by_bytes {
        let streams = c.watch_streams(i).await.unwrap_or(0.0);
        if streams - if i == mine { 1.0 } else { 0.0 } >= 1.0 {
            return (i, "the daemon's watch member");
        }
    }
    (
        rng.random_range(0..c.len()),
        "at random: no daemon watch seen",
    )
}

/// Writes more entries than [`cluster::SNAPSHOT_COUNT`] (to a key outside
/// the run's prefix), so that every member saves a raft snapshot past every
/// entry written before: a restarted member replays nothing older.
async fn snapshot_every_member(client: &Client) -> Result<()> {
    let kv = client.kv_client();
    let n = cluster::SNAPSHOT_COUNT + 100;
    let results: Vec<Result<()>> = futures::stream::iter(0..n)
        .map(|i| {
            let kv = kv.clone();
            async move {
                retry(Duration::from_secs(30), || {
                    let mut kv = kv.clone();
                    async move {
                        kv.put("/watchcache-bench-chaos/snapshot", i.to_string(), None)
                            .await
                            .map(|_| ())
                            .context("writing the snapshot entries")
                    }
                })
                .await
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Restarts every member in turn, the leader last (SIGTERM, start, healthy),
/// onto `binary` if given; measures the daemon's recovery after each step.
/// Returns the longest recovery (None if one step did not recover) and a
/// description.
async fn roll<F, Fut>(
    c: &mut Cluster,
    binary: Option<&std::path::Path>,
    measure: &F,
) -> Result<(Option<Fresh>, String)>
where
    F: Fn(Instant) -> Fut,
    Fut: std::future::Future<Output = Option<Fresh>>,
{
    let l = c.wait_leader(Duration::from_secs(30)).await?;
    let order: Vec<usize> = (0..c.len()).filter(|i| *i != l).chain([l]).collect();
    let mut worst = Some(Fresh {
        s: 0.0,
        etcd_write_s: 0.0,
    });
    let mut steps = Vec::new();
    for i in order {
        let leader = c.leader().await == Some(i);
        let name = c.name(i).to_string();
        let t = Instant::now();
        // The daemon's recovery is measured from the SIGTERM, while the
        // member stops (etcd's graceful stop waits for open watch streams,
        // 7 s per listener at most) and starts again.
        let restart = async {
            c.terminate(i).await;
            let stopped = t.elapsed();
            if let Some(b) = binary {
                c.set_binary(i, b);
            }
            c.spawn(i)?;
            let healthy = c.wait_healthy(i, Duration::from_secs(60)).await?;
            Ok::<_, anyhow::Error>((stopped, healthy))
        };
        let (r, restarted) = tokio::join!(measure(t), restart);
        let (stopped, healthy) = restarted?;
        worst = slower(worst, r);
        steps.push(format!(
            "{name}{}: stopped in {:.1}s, healthy {:.1}s after its start, fresh data after {}",
            if leader { " (leader)" } else { "" },
            stopped.as_secs_f64(),
            healthy.as_secs_f64(),
            r.map_or("-".into(), |r| format!("{:.2}s", r.s))
        ));
    }
    let what = match binary {
        Some(b) => format!("rolled onto {}", b.display()),
        None => "rolling restart".into(),
    };
    Ok((worst, format!("{what}, leader last ({})", steps.join("; "))))
}

/// The faults on the members of a cluster of three or more, the same for
/// both fronts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberFault {
    LeaderKill,
    MemberStop,
    MemberPartition,
    RollingRestart,
    RollingUpgrade,
}

/// What a member fault needs of the run besides the cluster.
pub struct MemberCtx<'a> {
    /// The daemon's proxies to the members (which member holds its watch).
    pub proxies: &'a [TcpProxy],
    pub recorder: &'a Recorder,
    /// The bench's own client (the upgrade's snapshot entries).
    pub client: &'a Client,
    /// The rolling upgrade's binaries, oldest first.
    pub upgrades: &'a [std::path::PathBuf],
}

/// Injects `fault` (see [`Fault`]'s variants of the same names); `measure`
/// is the daemon's recovery from a moment (None: not within the timeout).
/// Returns what was done and the recovery (a rolling fault's slowest step).
pub async fn member_fault<F, Fut>(
    fault: MemberFault,
    c: &mut Cluster,
    ctx: &MemberCtx<'_>,
    rng: &mut StdRng,
    measure: F,
) -> Result<(String, Option<Fresh>)>
where
    F: Fn(Instant) -> Fut,
    Fut: std::future::Future<Output = Option<Fresh>>,
{
    Ok(match fault {
        MemberFault::LeaderKill => {
            let l = c.wait_leader(Duration::from_secs(30)).await?;
            let t = Instant::now();
            c.kill(l);
            let r = measure(t).await;
            let took = c.restart(l).await?;
            (
                format!(
                    "leader {} killed; started again once the daemon served fresh data, healthy after {took:?}",
                    c.name(l)
                ),
                r,
            )
        }
        MemberFault::MemberStop => {
            let (m, how) = watch_member(c, ctx.proxies, ctx.recorder, rng).await;
            let pid = c.pid(m).ok_or_else(|| anyhow!("member {m} not running"))?;
            let min = Duration::from_millis(rng.random_range(2000..5000));
            let t = Instant::now();
            signal(pid, libc::SIGSTOP)?;
            let (r, held) = hold(measure(t), t, min, || {
                let _ = signal(pid, libc::SIGCONT);
            })
            .await;
            (format!("{} ({how}) stopped for {held:.1?}", c.name(m)), r)
        }
        MemberFault::MemberPartition => {
            let (m, how) = watch_member(c, ctx.proxies, ctx.recorder, rng).await;
            let min = Duration::from_millis(rng.random_range(3000..6000));
            let t = Instant::now();
            c.mesh.isolate(Some(m));
            let (r, held) = hold(measure(t), t, min, || c.mesh.isolate(None)).await;
            let caught_up = c.wait_caught_up(m, Duration::from_secs(60)).await?;
            (
                format!(
                    "{} ({how}) cut off the other members for {held:.1?}, caught up {caught_up:.1?} after the heal",
                    c.name(m)
                ),
                r,
            )
        }
        MemberFault::RollingRestart => {
            let (r, d) = roll(c, None, &measure).await?;
            (d, r)
        }
        MemberFault::RollingUpgrade => {
            let mut worst = Some(Fresh {
                s: 0.0,
                etcd_write_s: 0.0,
            });
            let mut details = Vec::new();
            for (n, bin) in ctx.upgrades.iter().enumerate() {
                if n > 0 {
                    // etcd 3.7 reads no etcd 3.5 (v2) entry in a log it
                    // replays (it panics): every member snapshots first.
                    snapshot_every_member(ctx.client).await?;
                    details.push(format!("{} entries written", cluster::SNAPSHOT_COUNT + 100));
                }
                let (r, d) = roll(c, Some(bin), &measure).await?;
                worst = slower(worst, r);
                details.push(d);
                let v = c.wait_cluster_version(Duration::from_secs(60)).await?;
                details.push(format!("cluster version {v}"));
            }
            (details.join("; "), worst)
        }
    })
}

/// Cuts the daemon off etcd, writes to etcd directly, compacts everything
/// the daemon missed, reconnects, and waits until the daemon has caught up.
async fn compact_while_cut(
    s: &Shared,
    proxies: &[TcpProxy],
    recorder: &Recorder,
    client: &Client,
    rng: &mut StdRng,
) -> Result<Compaction> {
    let kv = client.kv_client();
    s.gate.close().await;
    proxies.iter().for_each(|px| px.set(Mode::Cut));
    // Changes the daemon cannot see: puts and a delete, on a few objects so
    // some are changed twice (a relist sees only the newest version). Each
    // is retried while a member restarts (the client may still pick it);
    // an attempt that did land unacknowledged is a write like any other.
    for i in 0..6 {
        let name = object_name(rng.random_range(0..s.keys.min(3)));
        let key = format!("{}{name}", s.prefix);
        let put = (i != 2).then(|| {
            let id = format!("cut-{}", rng.random::<u32>());
            let group = if rng.random_bool(0.5) { "a" } else { "b" };
            (
                id.clone(),
                new_object(&s.namespace, &name, group, &id).to_string(),
            )
        });
        let write = || {
            let (mut kv, key, put) = (kv.clone(), key.clone(), put.clone());
            async move {
                let r = match put {
                    None => kv.delete(key, None).await.map(|r| {
                        (
                            r.deleted() > 0,
                            r.header().map(|h| h.revision()).unwrap_or(0),
                            None,
                        )
                    }),
                    Some((id, v)) => kv.put(key, v, None).await.map(|r| {
                        (
                            true,
                            r.header().map(|h| h.revision()).unwrap_or(0),
                            Some(id),
                        )
                    }),
                };
                r.context("writing while the daemon is cut off")
            }
        };
        let (done, rev, write_id) = retry(Duration::from_secs(30), write).await?;
        if done {
            s.acks.lock().push(Ack {
                name,
                rev,
                write_id,
            });
        }
    }
    let rev = retry(Duration::from_secs(30), || {
        let mut kv = kv.clone();
        async move { current_revision(&mut kv).await }
    })
    .await?;
    // The recorder must hold the history before etcd drops it.
    recorder.wait_for(rev, Duration::from_secs(30)).await?;
    retry(Duration::from_secs(30), || {
        let mut c = client.clone();
        async move {
            match c
                .compact(rev, Some(CompactionOptions::new().with_physical()))
                .await
            {
                Ok(_) => Ok(()),
                // An attempt whose answer was lost may have compacted.
                Err(e) if e.to_string().contains("compacted") => Ok(()),
                Err(e) => Err(anyhow!(e).context("compacting")),
            }
        }
    })
    .await?;
    proxies.iter().for_each(|px| px.set(Mode::Forward));
    // Caught up: a List not older than the compaction revision is served
    // (the cache answers 504 until it has relisted past it).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        match s
            .api
            .list(&Selection::All, 1, Some((rev, "NotOlderThan")))
            .await
        {
            Ok(_) => break,
            Err(e) if tokio::time::Instant::now() >= deadline => {
                s.gate.reopen();
                bail!("the daemon did not catch up with compaction {rev}: {e}");
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let caught_up = retry(Duration::from_secs(30), || {
        let mut kv = kv.clone();
        async move { current_revision(&mut kv).await }
    })
    .await?;
    s.gate.reopen();
    Ok(Compaction { rev, caught_up })
}

/// Sleeps about 1/rate, so the writers keep to the rate.
async fn pace(stop: &CancellationToken, rate: f64, rng: &mut StdRng) -> bool {
    let mean = 1.0 / rate;
    let d = Duration::from_secs_f64(mean * rng.random_range(0.5..1.5));
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

/// Read, modify, write with the resourceVersion read (GuaranteedUpdate as a
/// client does it); 409 -> read the latest and try again.
async fn cas_writer(s: Arc<Shared>, id: u64, rate: f64, mut rng: StdRng) {
    let mut n = 0u64;
    while pace(&s.stop, rate, &mut rng).await {
        let name = object_name(rng.random_range(0..s.keys));
        let Some(_ticket) = s.gate.enter(&s.stop).await else {
            return;
        };
        // The first read may be stale (from the cache, as GuaranteedUpdate
        // starts from the cached object); after a conflict, read the latest.
        for attempt in 0..10 {
            if s.stop.is_cancelled() {
                return;
            }
            n += 1;
            let write_id = format!("cas{id}-{n}");
            s.counters.write_attempts.fetch_add(1, Ordering::Relaxed);
            let r = match s.api.get(&name, attempt == 0).await {
                Ok(mut obj) => {
                    obj["spec"]["writeId"] = json!(write_id);
                    if rng.random_bool(0.3) {
                        let g = if rng.random_bool(0.5) { "a" } else { "b" };
                        obj["metadata"]["labels"]["group"] = json!(g);
                    }
                    s.api.replace(&name, &obj).await
                }
                Err(e) if e.code() == Some(404) => {
                    let g = if rng.random_bool(0.5) { "a" } else { "b" };
                    s.api
                        .create(&new_object(&s.namespace, &name, g, &write_id))
                        .await
                }
                Err(e) => Err(e),
            };
            match r {
                Ok(obj) => {
                    if let Some((n, rev, _)) = split_object(obj) {
                        s.acks.lock().push(Ack {
                            name: n,
                            rev,
                            write_id: Some(write_id),
                        });
                    }
                    break;
                }
                Err(e) if e.code() == Some(409) => {
                    s.counters.write_conflicts.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    s.counters.write_errors.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
        }
    }
}

/// Puts and deletes straight to etcd.
async fn etcd_writer(s: Arc<Shared>, client: Client, rate: f64, mut rng: StdRng) {
    let mut kv: KvClient = client.kv_client();
    let mut n = 0u64;
    while pace(&s.stop, rate, &mut rng).await {
        let name = object_name(rng.random_range(0..s.keys));
        let key = format!("{}{name}", s.prefix);
        let Some(_ticket) = s.gate.enter(&s.stop).await else {
            return;
        };
        n += 1;
        s.counters.write_attempts.fetch_add(1, Ordering::Relaxed);
        let op = async {
            if rng.random_bool(0.15) {
                let r = kv.delete(key, None).await?;
                let rev = r.header().map(|h| h.revision()).unwrap_or(0);
                Ok::<_, etcd_client::Error>((r.deleted() > 0).then_some((rev, None)))
            } else {
                let id = format!("etcd-{n}");
                let g = if rng.random_bool(0.5) { "a" } else { "b" };
                let v = new_object(&s.namespace, &name, g, &id);
                let r = kv.put(key, v.to_string(), None).await?;
                let rev = r.header().map(|h| h.revision()).unwrap_or(0);
                Ok(Some((rev, Some(id))))
            }
        };
        match tokio::time::timeout(Duration::from_secs(5), op).await {
            Ok(Ok(Some((rev, write_id)))) => s.acks.lock().push(Ack {
                name,
                rev,
                write_id,
            }),
            Ok(Ok(None)) => {}
            _ => {
                s.counters.write_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Pages through a List of `sel` (page size 1..=7), logging it.
async fn list_into(
    s: &Shared,
    sel: &Selection,
    rng: &mut StdRng,
    log: &mut Vec<Obs>,
) -> Option<i64> {
    let limit = rng.random_range(1..=7);
    match s.api.list(sel, limit, None).await {
        Ok((rv, items)) => {
            log.push(Obs::List { rv, items });
            Some(rv)
        }
        Err(_) => {
            s.counters.list_errors.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Pages through Lists until stopped.
async fn lister(s: Arc<Shared>, name: String, sel: Selection, mut rng: StdRng) -> ClientLog {
    let mut obs = Vec::new();
    while !s.stop.is_cancelled() {
        list_into(&s, &sel, &mut rng, &mut obs).await;
        let d = Duration::from_millis(rng.random_range(200..800));
        tokio::select! {
            _ = s.stop.cancelled() => break,
            _ = tokio::time::sleep(d) => {}
        }
    }
    ClientLog {
        name,
        selection: sel,
        obs,
    }
}

/// List, then watch from the List's resourceVersion; on any end resume from
/// the last resourceVersion seen; on 410 list again. A `resuming` watcher
/// also hangs up by itself every 1-4 s.
async fn watcher(
    s: Arc<Shared>,
    index: usize,
    name: String,
    sel: Selection,
    resuming: bool,
    mut rng: StdRng,
) -> ClientLog {
    let mut obs = Vec::new();
    let mut pos: Option<i64> = None;
    // The recovery probe follows the watchers of all objects only.
    let seen = |rv: i64| {
        if let Some(p) = s.positions.get(index) {
            p.store(
                if sel == Selection::All { rv } else { i64::MAX },
                Ordering::Relaxed,
            );
        }
    };
    seen(0);
    'outer: while !s.stop.is_cancelled() {
        let from = match pos {
            Some(p) => p,
            None => match list_into(&s, &sel, &mut rng, &mut obs).await {
                Some(rv) => {
                    pos = Some(rv);
                    seen(rv);
                    rv
                }
                None => {
                    if pause(&s.stop, 200).await {
                        continue;
                    }
                    break;
                }
            },
        };
        let timeout_s = rng.random_range(5..=20);
        let resp = tokio::select! {
            _ = s.stop.cancelled() => break,
            r = s.api.watch(&sel, from, timeout_s) => r,
        };
        let resp = match resp {
            Ok(r) => r,
            Err(ApiError::Status(410, _)) => {
                obs.push(Obs::Expired);
                pos = None;
                continue;
            }
            Err(_) => {
                s.counters.watch_errors.fetch_add(1, Ordering::Relaxed);
                if pause(&s.stop, 200).await {
                    continue;
                }
                break;
            }
        };
        obs.push(Obs::Watch { from });
        let hang_up = tokio::time::sleep(if resuming {
            Duration::from_millis(rng.random_range(1000..4000))
        } else {
            Duration::from_secs(3600)
        });
        tokio::pin!(hang_up);
        let mut body = resp.into_body();
        let mut lines = LineSplitter::default();
        loop {
            let frame = tokio::select! {
                _ = s.stop.cancelled() => {
                    obs.push(Obs::Closed);
                    break 'outer;
                }
                _ = &mut hang_up => {
                    obs.push(Obs::Closed);
                    continue 'outer;
                }
                f = body.frame() => f,
            };
            let data = match frame {
                Some(Ok(f)) => match f.into_data() {
                    Ok(d) => d,
                    Err(_) => continue,
                },
                Some(Err(_)) | None => {
                    obs.push(Obs::Closed);
                    continue 'outer;
                }
            };
            let mut end = None;
            lines.feed(&data, |line| {
                if end.is_some() {
                    return;
                }
                match parse_line(line) {
                    Line::Event(o) => {
                        if let Obs::Event { rv, .. } | Obs::Bookmark { rv } = &o {
                            pos = Some(*rv);
                            seen(*rv);
                        }
                        obs.push(o);
                    }
                    Line::Expired => end = Some(true),
                    Line::Other => end = Some(false),
                }
            });
            match end {
                Some(true) => {
                    obs.push(Obs::Expired);
                    pos = None;
                    continue 'outer;
                }
                Some(false) => {
                    obs.push(Obs::Closed);
                    continue 'outer;
                }
                None => {}
            }
        }
    }
    ClientLog {
        name,
        selection: sel,
        obs,
    }
}

/// Sleeps `ms` unless stopped first (then false).
async fn pause(stop: &CancellationToken, ms: u64) -> bool {
    tokio::select! {
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(Duration::from_millis(ms)) => true,
    }
}

enum Line {
    Event(Obs),
    /// An ERROR event with code 410.
    Expired,
    /// Another ERROR, or a line that does not parse: the stream is over.
    Other,
}

fn parse_line(line: &[u8]) -> Line {
    let Ok(v) = serde_json::from_slice::<Value>(line) else {
        return Line::Other;
    };
    let kind = match v["type"].as_str() {
        Some("ADDED") => Kind::Added,
        Some("MODIFIED") => Kind::Modified,
        Some("DELETED") => Kind::Deleted,
        Some("BOOKMARK") => {
            return match v["object"]["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|s| s.parse().ok())
            {
                Some(rv) => Line::Event(Obs::Bookmark { rv }),
                None => Line::Other,
            };
        }
        Some("ERROR") if v["object"]["code"].as_u64() == Some(410) => return Line::Expired,
        _ => return Line::Other,
    };
    match split_object(v["object"].clone()) {
        Some((name, rv, object)) => Line::Event(Obs::Event {
            kind,
            name,
            rv,
            object,
        }),
        None => Line::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh(s: f64, etcd_write_s: f64) -> Option<Fresh> {
        Some(Fresh { s, etcd_write_s })
    }

    #[test]
    fn the_slower_recovery_wins_and_none_is_slowest() {
        assert_eq!(
            slower(fresh(1.0, 0.5), fresh(2.0, 0.1)).map(|f| f.s),
            Some(2.0)
        );
        assert_eq!(
            slower(fresh(3.0, 0.5), fresh(2.0, 0.1)).map(|f| f.s),
            Some(3.0)
        );
        assert!(slower(fresh(1.0, 0.5), None).is_none());
        assert!(slower(None, fresh(1.0, 0.5)).is_none());
    }

    #[test]
    fn recovery_summary_counts_and_orders() {
        let v = [fresh(3.0, 2.5), None, fresh(1.0, 0.2), fresh(2.0, 0.5)];
        let s = recovery_summary(&v);
        assert_eq!(s["faults"], 4);
        assert_eq!(s["recovered"], 3);
        assert_eq!(s["min_s"], 1.0);
        assert_eq!(s["median_s"], 2.0);
        assert_eq!(s["max_s"], 3.0);
        // The daemon's own share: the most time after etcd took the write.
        assert_eq!(s["max_after_etcd_write_s"], 1.5);
        let none = recovery_summary(&[None]);
        assert_eq!(none["recovered"], 0);
        assert!(none["max_s"].is_null());
    }
}

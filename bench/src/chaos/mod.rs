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

pub mod api;
pub mod checker;
pub mod grpc;
pub mod grpc_checker;
pub mod proxy;
pub mod recorder;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use etcd_client::{Client, CompactionOptions, KvClient};
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
    Daemon, EtcdKeeper, clear_prefix, current_revision, daemon_config, etcd_connect, ns_prefix,
};
use crate::wire::LineSplitter;
use api::{Api, ApiError, split_object};
use checker::{Ack, ClientLog, Compaction, History, Kind, Obs, Report, Selection};
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
}

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
}

impl Fault {
    /// About how long the fault and its recovery take.
    fn needs(self) -> Duration {
        match self {
            Fault::EtcdStop => Duration::from_secs(5),
            Fault::EtcdKill => Duration::from_secs(5),
            Fault::CompactWhileCut => Duration::from_secs(6),
            Fault::EtcdSilent => DAEMON_WATCH_TIMEOUT + Duration::from_secs(5),
            Fault::DaemonKill => Duration::from_secs(5),
        }
    }
}

/// One injected fault.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    pub fault: Fault,
    pub at_s: f64,
    pub took_s: f64,
    pub detail: String,
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
}

/// Runs the chaos scenario. Call it from the thread that should own the
/// daemon (it is spawned and restarted from here: PDEATHSIG).
pub async fn run(p: ChaosParams, keeper: Option<&EtcdKeeper>) -> Result<ChaosOutcome> {
    let started = Instant::now();
    let prefix = ns_prefix(&p.etcd_prefix, &p.namespace);
    let client = etcd_connect(&p.etcd_endpoint).await?;
    let mut kv = client.kv_client();
    let base = clear_prefix(&mut kv, &prefix).await?;
    let recorder = Recorder::start(&p.etcd_endpoint, &prefix, base).await?;
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

    // The daemon, behind our proxy to etcd (or one that is already running).
    let mut proxy = None;
    let mut daemon = None;
    let authority = match &p.daemon_authority {
        Some(a) => a.clone(),
        None => {
            let target: SocketAddr = p
                .etcd_endpoint
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .parse()
                .with_context(|| {
                    format!("etcd endpoint {} is not http://IP:PORT", p.etcd_endpoint)
                })?;
            let px = TcpProxy::start(target).await?;
            let history = ((p.rate * p.duration.as_secs_f64()) as usize * 2).max(10_000);
            let cfg = daemon_config(&px.endpoint(), &p.etcd_prefix, history, None, &[]);
            let mut d = Daemon::spawn(&p.watchcache_bin, &cfg)?;
            d.wait_ready(Instant::now(), Duration::from_secs(120))
                .await
                .context("starting watchcache")?;
            let a = d.authority.clone();
            proxy = Some(px);
            daemon = Some(d);
            a
        }
    };
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
    if etcd_pid().is_some() {
        kinds.push(Fault::EtcdStop);
    }
    if keeper.is_some() {
        kinds.push(Fault::EtcdKill);
    }
    if proxy.is_some() {
        kinds.push(Fault::CompactWhileCut);
        kinds.push(Fault::EtcdSilent);
    }
    if daemon.is_some() {
        kinds.push(Fault::DaemonKill);
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
        let detail = match fault {
            Fault::EtcdStop => {
                let pid = etcd_pid().ok_or_else(|| anyhow!("no etcd pid"))?;
                let ms = rng.random_range(1000..4000);
                signal(pid, libc::SIGSTOP)?;
                tokio::time::sleep(Duration::from_millis(ms)).await;
                signal(pid, libc::SIGCONT)?;
                format!("etcd (pid {pid}) stopped for {ms} ms")
            }
            Fault::EtcdKill => {
                let k = keeper.ok_or_else(|| anyhow!("no etcd keeper"))?;
                let took = k.restart().await?;
                format!("etcd killed and restarted, healthy after {took:?}")
            }
            Fault::CompactWhileCut => {
                let px = proxy.as_ref().ok_or_else(|| anyhow!("no proxy"))?;
                let c = compact_while_cut(&shared, px, &recorder, &client, &mut rng).await?;
                let d = format!(
                    "daemon cut off, etcd compacted at {}, daemon caught up by {}",
                    c.rev, c.caught_up
                );
                compactions.push(c);
                d
            }
            Fault::EtcdSilent => {
                let px = proxy.as_ref().ok_or_else(|| anyhow!("no proxy"))?;
                let silent = DAEMON_WATCH_TIMEOUT + Duration::from_secs(2);
                px.set(Mode::Blackhole);
                tokio::time::sleep(silent).await;
                px.set(Mode::Forward);
                format!("etcd silent to the daemon for {silent:?}")
            }
            Fault::DaemonKill => {
                let d = daemon.as_mut().ok_or_else(|| anyhow!("no daemon"))?;
                let ms = rng.random_range(200..2000);
                d.kill();
                tokio::time::sleep(Duration::from_millis(ms)).await;
                d.restart()?;
                format!("daemon killed, restarted after {ms} ms (pid {})", d.pid)
            }
        };
        // Recovered: the daemon serves again.
        api.wait_ready(Duration::from_secs(90))
            .await
            .with_context(|| format!("recovering from {fault:?}"))?;
        eprintln!("chaos: {:6.1}s {fault:?}: {detail}", at_s);
        faults.push(FaultRecord {
            fault,
            at_s,
            took_s: t0.elapsed().as_secs_f64(),
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
    drop(daemon);
    drop(proxy);

    let acks = std::mem::take(&mut *shared.acks.lock());
    let report = checker::check(
        &history,
        &compactions,
        &logs,
        &acks,
        Some((final_list.0, &final_list.1)),
    );
    let json = report_json(
        &p,
        &report,
        &faults,
        &compactions,
        &history,
        &shared.counters,
        started,
    );
    Ok(ChaosOutcome {
        report,
        faults,
        json,
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
    json!({
        "seed": p.seed,
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

/// Cuts the daemon off etcd, writes to etcd directly, compacts everything
/// the daemon missed, reconnects, and waits until the daemon has caught up.
async fn compact_while_cut(
    s: &Shared,
    px: &TcpProxy,
    recorder: &Recorder,
    client: &Client,
    rng: &mut StdRng,
) -> Result<Compaction> {
    let mut kv = client.kv_client();
    s.gate.close().await;
    px.set(Mode::Cut);
    // Changes the daemon cannot see: puts and a delete, on a few objects so
    // some are changed twice (a relist sees only the newest version).
    for i in 0..6 {
        let name = object_name(rng.random_range(0..s.keys.min(3)));
        let key = format!("{}{name}", s.prefix);
        let r = if i == 2 {
            kv.delete(key, None).await.map(|r| {
                (
                    r.deleted() > 0,
                    r.header().map(|h| h.revision()).unwrap_or(0),
                    None,
                )
            })
        } else {
            let id = format!("cut-{}", rng.random::<u32>());
            let group = if rng.random_bool(0.5) { "a" } else { "b" };
            let v = new_object(&s.namespace, &name, group, &id);
            kv.put(key, v.to_string(), None).await.map(|r| {
                (
                    true,
                    r.header().map(|h| h.revision()).unwrap_or(0),
                    Some(id),
                )
            })
        };
        let (done, rev, write_id) = r.context("writing while the daemon is cut off")?;
        if done {
            s.acks.lock().push(Ack {
                name,
                rev,
                write_id,
            });
        }
    }
    let rev = current_revision(&mut kv).await?;
    // The recorder must hold the history before etcd drops it.
    recorder.wait_for(rev, Duration::from_secs(30)).await?;
    client
        .clone()
        .compact(rev, Some(CompactionOptions::new().with_physical()))
        .await
        .context("compacting")?;
    px.set(Mode::Forward);
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
    let caught_up = current_revision(&mut kv).await?;
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
    name: String,
    sel: Selection,
    resuming: bool,
    mut rng: StdRng,
) -> ClientLog {
    let mut obs = Vec::new();
    let mut pos: Option<i64> = None;
    'outer: while !s.stop.is_cancelled() {
        let from = match pos {
            Some(p) => p,
            None => match list_into(&s, &sel, &mut rng, &mut obs).await {
                Some(rv) => {
                    pos = Some(rv);
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

//! `watchcache-bench`: the load generator of docs/DESIGN.md section 9.
//!
//! Scenarios: `fanout` (F1), `list` (L1), `get` (G1), `startup` (S1), `idle`
//! (M1), each against `--target proxy` (watchcache's HTTP API) or `--target
//! etcd` (the same work on etcd directly), or both with `--compare` on the
//! same etcd. By default the bench starts its own etcd and its own watchcache
//! daemon (the `watchcache` binary next to this one); `--etcd URL` and
//! `--proxy URL` use running ones. `--secure` runs that daemon with TLS,
//! bearer tokens and RBAC; `--compare-secure` runs the proxy target plain and
//! secure and prints the cost as ratios. `fanout --target grpc` / `--target
//! grpc-proxy` put etcd watchers on watchcache's etcd gRPC front or on `etcd
//! grpc-proxy`; `--compare-grpc` runs both and etcd direct. `--target
//! kube` measures a real kube-apiserver and its own watch cache;
//! `--compare-kube` runs watchcache (`config/kubernetes.toml`) and
//! kube-apiserver side by side on the same etcd (fanout, list, get, memory,
//! idle), the objects written through kube-apiserver. See
//! docs/BENCHMARKS.md.

mod burst;
mod chaos;
mod check;
mod codec;
mod env;
mod floor;
mod http;
mod kube;
mod procfs;
mod repeat;
mod report;
mod scenarios;
mod secure;
mod watchers;
mod wire;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use indicatif::MultiProgress;
use serde_json::{Value, json};

use env::{Daemon, EtcdKeeper, daemon_config, default_watchcache_bin};
use http::{JSON, PROTOBUF};
use report::{f, print_table, ratio};
use scenarios::{Ctx, Params, Target};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// F1: W watchers, R writes/s of ~S-byte objects for D seconds.
    Fanout,
    /// L1: full and paged (limit) List of N objects.
    List,
    /// G1: single-object Get throughput and latency at concurrency K.
    Get,
    /// S1: time from daemon start to /readyz 200 with N objects in etcd.
    Startup,
    /// M1: RSS per idle watcher.
    Idle,
    /// K2: I client-go-like informers start at once on N objects (LIST
    /// at resourceVersion=0 then WATCH, and WatchList), on the proxy,
    /// kube-apiserver, or both with --compare-kube.
    Informers,
    /// K3: RSS of the server holding N objects in its cache, no watcher
    /// (the proxy, kube-apiserver, or both with --compare-kube).
    Memory,
    /// The protobuf codec's cost per object (encode for protobuf clients,
    /// decode of stored values), N objects of each shape; no etcd, no daemon.
    Codec,
    /// H1: --events writes in --duration seconds while a watcher is away;
    /// it comes back --reconnect-after seconds after the burst began and
    /// must get every event (the history keeps at least 75 s of them,
    /// within its byte budget).
    Burst,
    /// Faults against etcd and the daemon under load, every stream checked
    /// against etcd's own history (docs/RELIABILITY.md). Exits 1 on a violation.
    Chaos,
}

/// Which API the chaos run's clients use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ChaosFront {
    /// Kubernetes REST clients (CAS writers, watchers, listers).
    Rest,
    /// etcd clients through the etcd v3 gRPC front (docs/RELIABILITY.md).
    Grpc,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum EtcdWatchMode {
    /// All watchers of a connection share one gRPC watch stream (as Go's clientv3 does).
    Mux,
    /// One gRPC watch stream per watcher (as independent clients do).
    Stream,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum TargetArg {
    Proxy,
    Etcd,
    /// etcd watchers on watchcache's etcd v3 gRPC front (fanout, idle).
    Grpc,
    /// etcd watchers through `etcd grpc-proxy start` (fanout only).
    GrpcProxy,
    /// A real kube-apiserver (1.37, from scripts/peers.sh) and its own
    /// watch cache, on the bench's etcd; objects written through it.
    Kube,
}

/// Load generator for watchcache: watch fan-out, lists, gets, start-up and
/// memory, measured side by side with etcd.
#[derive(Debug, Clone, Parser)]
#[command(name = "watchcache-bench", version, about, long_about = None)]
struct Cli {
    /// The scenario to run.
    #[arg(value_enum)]
    scenario: Scenario,
    /// What to measure: the proxy's HTTP API or etcd directly.
    #[arg(long, value_enum, default_value = "proxy")]
    target: TargetArg,
    /// Run both targets in one invocation on the same etcd and print ratios.
    /// fanout: also a third column, etcd watchers through `etcd grpc-proxy
    /// start` (the peer a user would put in front of etcd instead), when the
    /// etcd binary has it (see --no-grpc-proxy).
    #[arg(long)]
    compare: bool,
    /// fanout --compare: leave the `etcd grpc-proxy` column out.
    #[arg(long)]
    no_grpc_proxy: bool,
    /// fanout: three columns on the same etcd, etcd watchers on etcd
    /// directly, through `etcd grpc-proxy start` and on watchcache's gRPC
    /// front, with the front/grpc-proxy and etcd-CPU ratios.
    #[arg(long)]
    compare_grpc: bool,
    /// fanout, list, get, memory, idle: watchcache (serving
    /// config/kubernetes.toml over TLS with a bearer token) and a real
    /// kube-apiserver with its own watch cache, in turns on the same etcd,
    /// the objects written through kube-apiserver; prints the
    /// watchcache/kube-apiserver ratios (`*_over_kube`).
    #[arg(long)]
    compare_kube: bool,
    /// The kube-apiserver binary of --target kube / --compare-kube
    /// (default: $WATCHCACHE_KUBE_APISERVER_BIN, else what `scripts/peers.sh
    /// --print kube-apiserver-1.37` names).
    #[arg(long, value_name = "PATH")]
    kube_apiserver_bin: Option<PathBuf>,
    /// Start kube-apiserver with `--profiling=true` (its /debug/pprof).
    #[arg(long)]
    kube_profiling: bool,
    /// Serve the proxy the bench starts with TLS, bearer-token authentication
    /// and RBAC (the bench makes the CA, certificate, token file and policy);
    /// its client speaks TLS and sends the token on every request.
    #[arg(long)]
    secure: bool,
    /// Run the proxy target twice, plain then secure (a daemon each, same
    /// etcd), and print the secure/plain ratios.
    #[arg(long)]
    compare_secure: bool,
    /// With --secure: send this bearer token instead of the bench user's
    /// (to check that authentication is on: the run then fails).
    #[arg(long, value_name = "TOKEN")]
    bearer_token: Option<String>,
    /// Use this running etcd instead of starting one (e.g. http://127.0.0.1:2379).
    #[arg(long, value_name = "URL")]
    etcd: Option<String>,
    /// pid of the etcd at --etcd, for its CPU and RSS figures.
    #[arg(long, value_name = "PID")]
    etcd_pid: Option<u32>,
    /// Use this running watchcache instead of starting one (e.g. http://127.0.0.1:8080).
    /// It must serve core/v1 pods from the same etcd with the default prefix.
    #[arg(long, visible_alias = "daemon", value_name = "URL")]
    proxy: Option<String>,
    /// pid of the watchcache at --proxy, for its CPU and RSS figures.
    #[arg(long, value_name = "PID")]
    proxy_pid: Option<u32>,
    /// The watchcache binary to start (default: `watchcache` next to this binary).
    #[arg(long, value_name = "PATH")]
    watchcache_bin: Option<PathBuf>,
    /// Watchers (fanout, idle: 100; chaos: 12).
    #[arg(short = 'w', long)]
    watchers: Option<usize>,
    /// Writes per second (fanout: 100; chaos: 30, all writers together).
    #[arg(short = 'r', long)]
    rate: Option<f64>,
    /// Seconds of writes (fanout), of gets (get) or of faults (chaos):
    /// `30`, `30s`, `2m` (default 10; chaos: 120).
    #[arg(short = 'd', long, value_parser = parse_seconds)]
    duration: Option<f64>,
    /// chaos: start an etcd cluster of this many members (own data dirs and
    /// loopback ports; the daemon gets every endpoint) and, with 3 or more,
    /// add member faults: leader kill, stop and partition of the daemon's
    /// member, rolling restart and upgrade (docs/RELIABILITY.md).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=7))]
    etcd_members: u32,
    /// chaos --etcd-members: an etcd binary of the rolling upgrade
    /// (repeatable, oldest first). Default: etcd 3.6 and 3.7 as
    /// `scripts/peers.sh --print etcd-3.6 etcd-3.7` finds them, if built.
    #[arg(long, value_name = "BIN")]
    etcd_upgrade: Vec<PathBuf>,
    /// Seed of the chaos run's fault schedule and client choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The API the chaos run's clients use: `rest`, or `grpc` (etcd clients
    /// through the daemon's etcd gRPC front).
    #[arg(long, value_enum, default_value = "rest")]
    front: ChaosFront,
    /// Clients paging through Lists (chaos).
    #[arg(long, default_value_t = 2)]
    listers: usize,
    /// Object size in bytes (JSON; default 1024, with kube-apiserver 3072:
    /// a Pod as sent, which kube-apiserver stores with its defaults and
    /// managed fields).
    #[arg(short = 's', long)]
    size: Option<usize>,
    /// Distinct objects the writes cycle over (fanout: 100; chaos: 20).
    #[arg(long)]
    keys: Option<usize>,
    /// Connections: etcd clients for etcd watchers and gets; HTTP/2
    /// connections to the proxy (at least; see --streams-per-conn).
    #[arg(short = 'c', long, default_value_t = 10)]
    connections: usize,
    /// At most this many watch streams per HTTP/2 connection to the proxy
    /// (default 1000; with kube-apiserver 100, the most it allows, for
    /// both servers).
    #[arg(long)]
    streams_per_conn: Option<usize>,
    /// Talk HTTP/1.1 to the proxy (one connection per watcher or worker)
    /// instead of HTTP/2 with prior knowledge.
    #[arg(long)]
    http1: bool,
    /// How etcd watchers use their connections.
    #[arg(long, value_enum, default_value = "mux")]
    etcd_watch_mode: EtcdWatchMode,
    /// Concurrent writes in flight (fanout; default 4, through
    /// kube-apiserver 32: its writes take longer than etcd's, and the rate
    /// must hold).
    #[arg(long)]
    writers: Option<usize>,
    /// Seconds to wait after the last write for every watcher to see it.
    #[arg(long, default_value_t = 60.0)]
    drain_timeout: f64,
    /// Objects in etcd (list: 10000, get: 1000, startup: 10000 by default).
    #[arg(short = 'n', long)]
    objects: Option<usize>,
    /// Informers that start at once (informers).
    #[arg(short = 'i', long, default_value_t = 100)]
    informers: usize,
    /// Concurrent requests (get).
    #[arg(short = 'k', long, default_value_t = 64)]
    concurrency: usize,
    /// Repetitions (list: 10, startup: 3 by default).
    #[arg(long)]
    iterations: Option<usize>,
    /// get: split --duration into this many rounds and run the targets in
    /// turn, round after round (proxy, etcd, proxy, etcd...), summing each
    /// target's gets, time and CPU. A comparison of phases run one after the
    /// other moves with the machine's speed in each phase
    /// (docs/BENCHMARKS.md#get-g1); in turns, every target sees the same
    /// minutes.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    rounds: u32,
    /// Run the whole comparison this many times, each with a fresh etcd
    /// (unless --etcd) and daemon (unless --proxy), then print each ratio's
    /// min, median and max and each goal's count of runs that met it: a goal
    /// counts as met only when every run meets it (docs/BENCHMARKS.md).
    /// --json then holds every run's report and the summary.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    repeat: u32,
    /// Page size of the paged list.
    #[arg(long, default_value_t = 500)]
    page_size: usize,
    /// Namespace the bench writes to (cleared first!).
    #[arg(long, default_value = "watchcache-bench")]
    namespace: String,
    /// etcd key prefix (keys are {prefix}/pods/{ns}/{name}).
    #[arg(long, default_value = "/registry")]
    etcd_prefix: String,
    /// `etcd.list_page_size` in the config of the daemons the bench starts
    /// (default: the daemon's own default).
    #[arg(long, value_name = "N")]
    list_page_size: Option<usize>,
    /// Seconds to let memory settle before reading RSS (startup, idle).
    #[arg(long, default_value_t = 2.0)]
    settle: f64,
    /// idle: open and close the watchers, each time on new connections,
    /// this many times, and print the holder's RSS after each opening and
    /// each closing (memory a closed watch does not give back grows with
    /// the cycles; memory kept for reuse levels off).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    cycles: u32,
    /// list: ask the proxy for protobuf (`Accept:
    /// application/vnd.kubernetes.protobuf`, as client-go does for built-in
    /// types) instead of JSON. The objects are then Pods that fit the Pod
    /// schema (the padding in an annotation); no paged Lists are timed.
    /// fanout with kube-apiserver: protobuf watches (length-prefixed frames).
    #[arg(long)]
    protobuf: bool,
    /// list: send `Accept-Encoding: gzip` to the proxy, as kubectl and
    /// client-go do, and unpack each List (timed: a client's work too).
    /// The proxy gzips Lists over 128 KiB; etcd's rows are unchanged.
    #[arg(long)]
    gzip: bool,
    /// list: also open --iterations WatchList streams
    /// (`sendInitialEvents=true`, each on a new connection, read to the
    /// initial-events-end bookmark) on the proxy, with gzip if --gzip, and
    /// report bytes on the wire and the proxy's CPU per stream.
    #[arg(long)]
    watch_list: bool,
    /// list, get, startup, memory: how the bench stores its objects in etcd, named
    /// like kube-apiserver's flag: `application/json`, or
    /// `application/vnd.kubernetes.protobuf` (Pods that fit the Pod schema,
    /// in kube-apiserver's `k8s\0` envelope, as a real cluster stores them).
    #[arg(long, default_value = JSON, value_parser = [JSON, PROTOBUF], value_name = "MEDIA_TYPE")]
    storage_media_type: String,
    /// burst: the writes of the burst.
    #[arg(long, default_value_t = 50_000)]
    events: usize,
    /// burst: seconds after the burst began when the watcher comes back.
    #[arg(long, default_value_t = 60.0)]
    reconnect_after: f64,
    /// burst: the daemon's `history_max_bytes` (default: its own, 256 MiB).
    #[arg(long, value_name = "BYTES")]
    history_max_bytes: Option<u64>,
    /// Write every figure as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Draw the latency distributions (proxy vs etcd) into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// No progress bars.
    #[arg(long)]
    no_progress: bool,
    /// chaos: keep the daemon's directory (its config and `watchcache.log`)
    /// after the run, failed or not, and print where it is.
    #[arg(long)]
    keep_dir: bool,
    /// A `[server]` setting of the daemon the bench starts, as TOML
    /// `KEY=VALUE` (repeatable), e.g. `--daemon-server coalesce_writes=false`
    /// to measure what a setting is worth.
    #[arg(long = "daemon-server", value_name = "KEY=VALUE")]
    daemon_server: Vec<String>,
}

fn main() -> Result<()> {
    let nofile = procfs::raise_nofile_limit();
    let cli = Cli::parse();
    if cli.rate.is_some_and(|r| r <= 0.0) || cli.duration.is_some_and(|d| d <= 0.0) {
        bail!("--rate and --duration must be positive");
    }
    if (cli.secure || cli.compare_secure || cli.bearer_token.is_some())
        && !matches!(
            cli.scenario,
            Scenario::Fanout | Scenario::List | Scenario::Get | Scenario::Idle
        )
    {
        bail!("--secure, --compare-secure and --bearer-token apply to fanout, list, get and idle");
    }
    if (cli.secure || cli.compare_secure) && cli.proxy.is_some() {
        bail!("--secure and --compare-secure need the daemon the bench starts (no --proxy)");
    }
    if cli.bearer_token.is_some() && !(cli.secure || cli.compare_secure) {
        bail!("--bearer-token needs --secure or --compare-secure");
    }
    if cli.compare_secure && cli.target == TargetArg::Etcd && !cli.compare {
        bail!("--compare-secure compares proxy targets: drop --target etcd");
    }
    let grpc_target =
        cli.compare_grpc || matches!(cli.target, TargetArg::Grpc | TargetArg::GrpcProxy);
    if grpc_target
        && cli.scenario != Scenario::Fanout
        && !(cli.scenario == Scenario::Idle && cli.target == TargetArg::Grpc && !cli.compare_grpc)
    {
        bail!(
            "--target grpc-proxy and --compare-grpc apply to fanout, --target grpc to fanout and idle"
        );
    }
    if grpc_target && (cli.compare || cli.secure || cli.compare_secure || cli.proxy.is_some()) {
        bail!(
            "--target grpc, --target grpc-proxy and --compare-grpc need the plain daemon the bench starts (no --compare, --secure, --compare-secure or --proxy)"
        );
    }
    if cli.rounds > 1 && (cli.scenario != Scenario::Get || cli.compare_secure) {
        bail!("--rounds applies to get, without --compare-secure");
    }
    if cli.repeat > 1
        && matches!(
            cli.scenario,
            Scenario::Chaos | Scenario::Codec | Scenario::Burst
        )
    {
        bail!("--repeat applies to fanout, list, get, startup and idle");
    }
    if cli.cycles > 1 && cli.scenario != Scenario::Idle {
        bail!("--cycles applies to idle");
    }
    if cli.repeat > 1 && cli.plot.is_some() {
        bail!("--plot draws one run: drop --repeat");
    }
    let kube_mode = cli.compare_kube || cli.target == TargetArg::Kube;
    if kube_mode {
        if !matches!(
            cli.scenario,
            Scenario::Fanout
                | Scenario::List
                | Scenario::Get
                | Scenario::Memory
                | Scenario::Idle
                | Scenario::Informers
        ) {
            bail!(
                "--target kube and --compare-kube apply to fanout, list, get, memory, idle and informers"
            );
        }
        if cli.compare || grpc_target || cli.compare_secure || cli.secure || cli.proxy.is_some() {
            bail!(
                "--target kube and --compare-kube run their own servers: no --compare, --compare-grpc, --secure, --compare-secure or --proxy"
            );
        }
        if cli.storage_media_type == PROTOBUF {
            bail!("with kube-apiserver, it stores the objects itself (drop --storage-media-type)");
        }
        if cli.protobuf && cli.scenario == Scenario::List {
            bail!("list with kube-apiserver times JSON and protobuf Lists both: drop --protobuf");
        }
    }
    if matches!(cli.scenario, Scenario::Memory | Scenario::Informers)
        && !kube_mode
        && cli.target != TargetArg::Proxy
    {
        bail!("memory and informers measure the proxy or kube-apiserver");
    }
    if cli.protobuf
        && cli.scenario != Scenario::List
        && !(kube_mode && cli.scenario == Scenario::Fanout)
    {
        bail!("--protobuf applies to list, and to fanout with kube-apiserver");
    }
    if cli.watch_list && cli.scenario != Scenario::List {
        bail!("--watch-list applies to list");
    }
    if cli.gzip && cli.scenario != Scenario::List {
        bail!("--gzip applies to list");
    }
    if cli.storage_media_type == PROTOBUF
        && !matches!(
            cli.scenario,
            Scenario::List | Scenario::Get | Scenario::Startup | Scenario::Memory
        )
    {
        bail!("--storage-media-type applies to list, get, startup and memory");
    }
    if (cli.etcd_members > 1 || !cli.etcd_upgrade.is_empty())
        && (cli.scenario != Scenario::Chaos || cli.etcd.is_some() || cli.proxy.is_some())
    {
        bail!("--etcd-members and --etcd-upgrade apply to chaos, with the etcd the bench starts");
    }
    if cli.proxy.is_some() && cli.etcd.is_none() {
        bail!("--proxy needs --etcd: the etcd that proxy serves from (the bench writes there)");
    }
    if cli.scenario == Scenario::Codec {
        let results = codec::run(cli.objects.unwrap_or(2000), cli.size.unwrap_or(1024))?;
        if let Some(path) = &cli.json {
            let report = json!({"scenario": "codec", "results": results});
            write_report(path, &report)?;
        }
        return Ok(());
    }
    let repeat = cli.repeat as usize;
    if repeat == 1 {
        // One run writes its own report (then its plot).
        return run_once(&cli, nofile).map(|_| ());
    }
    let mut reports = Vec::new();
    let mut failure = None;
    for i in 0..repeat {
        eprintln!("\nrun {} of {repeat}", i + 1);
        match run_once(&cli, nofile) {
            Ok(report) => reports.extend(report),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    // The runs that finished are summarized and written even when a later
    // one failed: a set can take an hour.
    let completed = reports.len();
    let summary = repeat::summarize(&reports);
    repeat::print_summary(&summary);
    if let Some(path) = &cli.json {
        let report = json!({
            "tool": "watchcache-bench",
            "version": env!("CARGO_PKG_VERSION"),
            "scenario": format!("{:?}", cli.scenario).to_lowercase(),
            "command": std::env::args().collect::<Vec<_>>().join(" "),
            "repeat": repeat,
            "completed_runs": completed,
            "error": failure.as_ref().map(|e| format!("{e:#}")),
            "summary": summary,
            "runs": reports,
        });
        write_report(path, &report)?;
    }
    match failure {
        Some(e) => Err(e.context(format!("run {} of {repeat}", completed + 1))),
        None => Ok(()),
    }
}

/// One run of the scenario in a runtime and, unless `--etcd`, an etcd of
/// its own, both ended with it: nothing of one run (a detached task, a
/// connection) runs on into the next. Returns the run's report.
fn run_once(cli: &Cli, nofile: u64) -> Result<Option<Value>> {
    // Our own etcd lives in a keeper thread for the whole run (a cluster
    // is started by the chaos run itself).
    let keeper = match &cli.etcd {
        Some(_) => None,
        None if cli.etcd_members > 1 => None,
        None => Some(EtcdKeeper::start()?),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // The daemon is spawned from this (main) thread inside block_on, which
    // outlives it (PDEATHSIG).
    let r = rt.block_on(run(cli.clone(), keeper, nofile));
    rt.shutdown_timeout(Duration::from_secs(2));
    r
}

/// Writes a report as `--json` asks.
fn write_report(path: &std::path::Path, report: &Value) -> Result<()> {
    std::fs::write(path, serde_json::to_vec_pretty(report)?)
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// `30`, `30s`, `1.5s`, `2m`, `1h`: seconds.
fn parse_seconds(s: &str) -> Result<f64, String> {
    let (num, mul) = if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s.strip_suffix('s').unwrap_or(s), 1.0)
    };
    num.trim()
        .parse::<f64>()
        .map(|v| v * mul)
        .map_err(|_| format!("{s:?} is not a duration (e.g. 30, 30s, 2m, 1h)"))
}

/// One run of the scenario; its report (`None` for chaos, which writes its
/// own).
async fn run(cli: Cli, keeper: Option<EtcdKeeper>, nofile: u64) -> Result<Option<Value>> {
    let started = chrono::Utc::now();
    let etcd_endpoint = match (&cli.etcd, &keeper) {
        (Some(u), _) => u.trim_end_matches('/').to_string(),
        (None, Some(k)) => k.endpoint.clone(),
        (None, None) if cli.etcd_members > 1 => String::new(),
        (None, None) => bail!("no etcd"),
    };
    if cli.scenario == Scenario::Chaos {
        return run_chaos(cli, keeper, etcd_endpoint, nofile, started)
            .await
            .map(|()| None);
    }
    if cli.scenario == Scenario::Burst {
        let bin = match &cli.watchcache_bin {
            Some(p) => p.clone(),
            None => default_watchcache_bin()?,
        };
        let p = burst::BurstParams {
            events: cli.events,
            duration_s: cli.duration.unwrap_or(10.0),
            reconnect_after_s: cli.reconnect_after,
            size: cli.size.unwrap_or(1024),
            keys: cli.keys.unwrap_or(1000).max(1),
            writers: cli.writers.unwrap_or(4).max(1),
            history_max_bytes: cli.history_max_bytes,
            namespace: cli.namespace.clone(),
            etcd_prefix: cli.etcd_prefix.clone(),
        };
        let mut report = burst::run(&etcd_endpoint, &bin, &p).await?;
        report["command"] = json!(std::env::args().collect::<Vec<_>>().join(" "));
        report["started"] = json!(started.to_rfc3339());
        if let Some(path) = &cli.json {
            write_report(path, &report)?;
        }
        return Ok(Some(report));
    }
    let duration = cli.duration.unwrap_or(10.0);
    let rate = cli.rate.unwrap_or(100.0);
    let kube_mode = cli.compare_kube || cli.target == TargetArg::Kube;
    let targets: Vec<Target> = if cli.compare_kube {
        vec![Target::Proxy, Target::Kube]
    } else if cli.target == TargetArg::Kube {
        vec![Target::Kube]
    } else if cli.compare_grpc {
        vec![Target::Etcd, Target::GrpcProxy, Target::Grpc]
    } else if cli.compare {
        let mut t = vec![Target::Proxy, Target::Etcd];
        // The plain comparison of fan-out also runs the peer a user would
        // pick instead of watchcache, when this etcd build has it.
        if cli.scenario == Scenario::Fanout
            && !cli.no_grpc_proxy
            && !cli.secure
            && !cli.compare_secure
            && cli.proxy.is_none()
        {
            if env::GrpcProxy::supported() {
                t.push(Target::GrpcProxy);
            } else {
                eprintln!("no `etcd grpc-proxy` in this etcd build: its column is left out");
            }
        }
        t
    } else if cli.target == TargetArg::Proxy || cli.compare_secure {
        vec![Target::Proxy]
    } else if cli.target == TargetArg::Grpc {
        vec![Target::Grpc]
    } else if cli.target == TargetArg::GrpcProxy {
        vec![Target::GrpcProxy]
    } else {
        vec![Target::Etcd]
    };
    // (target, served securely): the proxy plain then secure with
    // --compare-secure, secure only with --secure.
    let runs: Vec<(Target, bool)> = targets
        .iter()
        .flat_map(|&t| match t {
            Target::Proxy if cli.compare_secure => vec![(t, false), (t, true)],
            // Beside kube-apiserver, watchcache serves TLS with a bearer
            // token too.
            Target::Proxy => vec![(t, cli.secure || kube_mode)],
            Target::Etcd | Target::Grpc | Target::GrpcProxy | Target::Kube => vec![(t, false)],
        })
        .collect();
    let default_objects = match cli.scenario {
        Scenario::Get => 1000,
        Scenario::Fanout | Scenario::Idle => 0,
        _ => 10_000,
    };
    let default_iterations = match cli.scenario {
        Scenario::Startup => 3,
        _ => 10,
    };
    let p = Params {
        watchers: cli.watchers.unwrap_or(100),
        rate,
        duration_s: duration,
        size: cli.size.unwrap_or(if kube_mode { 3072 } else { 1024 }),
        keys: cli.keys.unwrap_or(100).max(1),
        connections: cli.connections.max(1),
        streams_per_conn: cli
            .streams_per_conn
            .unwrap_or(if kube_mode { 100 } else { 1000 })
            .max(1),
        http1: cli.http1,
        etcd_mux: cli.etcd_watch_mode == EtcdWatchMode::Mux,
        writers: cli.writers.unwrap_or(if kube_mode { 32 } else { 4 }).max(1),
        drain_timeout_s: cli.drain_timeout,
        objects: cli.objects.unwrap_or(default_objects),
        concurrency: cli.concurrency.max(1),
        iterations: cli.iterations.unwrap_or(default_iterations).max(1),
        page_size: cli.page_size.max(1),
        namespace: cli.namespace.clone(),
        etcd_prefix: cli.etcd_prefix.clone(),
        settle_s: cli.settle,
        cycles: cli.cycles,
        list_page_size: cli.list_page_size,
        daemon_server: cli.daemon_server.clone(),
        protobuf: cli.protobuf,
        gzip: cli.gzip,
        watch_list: cli.watch_list,
        storage_protobuf: cli.storage_media_type == PROTOBUF,
        informers: cli.informers,
    };
    let watchcache_bin = match &cli.watchcache_bin {
        Some(p) => p.clone(),
        None => default_watchcache_bin()?,
    };
    let needs_daemon = (targets.contains(&Target::Proxy) || targets.contains(&Target::Grpc))
        && cli.scenario != Scenario::Startup;
    let mut ctx = Ctx {
        etcd_endpoint: etcd_endpoint.clone(),
        keeper,
        etcd_pid_override: cli.etcd_pid,
        proxy_authority: cli.proxy.as_ref().map(|u| {
            u.trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string()
        }),
        proxy_pid_override: cli.proxy_pid,
        daemon: None,
        grpc_proxy: None,
        tls: None,
        kube: None,
        kube_writer: None,
        watchcache_bin,
        mp: MultiProgress::new(),
        progress: !cli.no_progress,
        p,
    };
    let own_daemon = needs_daemon && ctx.proxy_authority.is_none();
    // History large enough for every write of the run plus the setup.
    let history = ((rate * duration) as usize + ctx.p.objects + 1000).max(10_000);
    let daemon_cfg = if kube_mode {
        kube::watchcache_kubernetes_config(
            &etcd_endpoint,
            &ctx.p.etcd_prefix,
            &ctx.p.daemon_server,
        )?
    } else {
        daemon_config(
            std::slice::from_ref(&etcd_endpoint),
            &ctx.p.etcd_prefix,
            history,
            ctx.p.list_page_size,
            &ctx.p.daemon_server,
        )
    };
    // kube-apiserver first: watchcache then starts on the etcd it has
    // bootstrapped, as in front of a running cluster.
    let mut kube_version = None;
    if kube_mode {
        let bin = match &cli.kube_apiserver_bin {
            Some(p) => p.clone(),
            None => kube::kube_apiserver_bin()?,
        };
        let k = kube::KubeApiserver::start(
            &bin,
            &etcd_endpoint,
            &ctx.p.etcd_prefix,
            cli.kube_profiling,
        )
        .await
        .context("starting kube-apiserver")?;
        kube_version = http::get_once_with(&k.authority, Some(k.tls.clone()), "/version")
            .await
            .ok()
            .and_then(|(_, b)| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|v| v["gitVersion"].as_str().map(str::to_string));
        let w = kube::KubeWriter::connect(&k, &ctx.p.namespace, 4).await?;
        w.ensure_namespace().await?;
        ctx.kube_writer = Some(w);
        ctx.kube = Some(k);
    }
    if own_daemon && targets.contains(&Target::Grpc) {
        let t = Instant::now();
        let mut d = Daemon::spawn_grpc(&ctx.watchcache_bin, &daemon_cfg)?;
        d.wait_ready(t, Duration::from_secs(120))
            .await
            .context("starting watchcache")?;
        let front = d.grpc_authority.clone().unwrap_or_default();
        env::wait_grpc(&front, Duration::from_secs(60)).await?;
        ctx.proxy_authority = Some(d.authority.clone());
        ctx.daemon = Some(d);
    } else if own_daemon {
        let secure = runs.iter().any(|&(t, s)| t == Target::Proxy && s) && !cli.compare_secure;
        start_daemon(&mut ctx, &daemon_cfg, secure, cli.bearer_token.as_deref()).await?;
    }
    if targets.contains(&Target::GrpcProxy) {
        ctx.grpc_proxy = Some(
            env::GrpcProxy::start(&etcd_endpoint)
                .await
                .context("starting etcd grpc-proxy")?,
        );
    }

    let etcd_version = env::etcd_version(&etcd_endpoint).await;
    eprintln!(
        "watchcache-bench {:?}: etcd {} ({}){}",
        cli.scenario,
        etcd_endpoint,
        etcd_version.as_deref().unwrap_or("version unknown"),
        ctx.proxy_authority
            .as_ref()
            .map(|a| format!(", proxy http://{a}"))
            .unwrap_or_default()
    );

    // Setup shared by both targets.
    // memory: each server's RSS before the objects are written.
    let rss_before_load: Vec<(Target, Option<u64>)> = targets
        .iter()
        .map(|&t| (t, scenarios::front_rss_kb(&ctx, t)))
        .collect();
    let loaded_rev = match cli.scenario {
        Scenario::List
        | Scenario::Get
        | Scenario::Startup
        | Scenario::Memory
        | Scenario::Informers => scenarios::load_for(&ctx).await?,
        _ => 0,
    };

    // Each result key's parts, in the order the keys first ran: one part,
    // or one per round (get --rounds).
    let rounds = cli.rounds as usize;
    let full_duration = ctx.p.duration_s;
    ctx.p.duration_s = full_duration / rounds as f64;
    let mut parts: Vec<(String, bool, Vec<scenarios::Part>)> = Vec::new();
    for _round in 0..rounds {
        for &(t, secure) in &runs {
            if own_daemon && t == Target::Proxy && ctx.tls.is_some() != secure {
                // The next run needs the other kind of daemon: a fresh one.
                ctx.daemon.take();
                start_daemon(&mut ctx, &daemon_cfg, secure, cli.bearer_token.as_deref()).await?;
            }
            let variants: Vec<&str> = match (cli.scenario, t) {
                (Scenario::List, Target::Proxy) if kube_mode => vec!["proxy", "proxy_protobuf"],
                (Scenario::List, Target::Kube) => vec!["kube", "kube_protobuf"],
                (Scenario::Get, Target::Proxy) if kube_mode => vec!["proxy"],
                (Scenario::Informers, Target::Proxy) => {
                    vec!["proxy_list_watch", "proxy_watch_list"]
                }
                (Scenario::Informers, Target::Kube) => vec!["kube_list_watch", "kube_watch_list"],
                // The loopback floor of a List: plain TCP, so not beside TLS.
                (Scenario::List, Target::Proxy) if !secure => {
                    vec!["proxy", "proxy_consistent", "loopback"]
                }
                (Scenario::List | Scenario::Get, Target::Proxy) => {
                    vec!["proxy", "proxy_consistent"]
                }
                _ => vec![t.name()],
            };
            for v in variants {
                // Secure results are `<variant>_secure` beside the plain ones.
                let key = if secure && cli.compare_secure {
                    format!("{v}_secure")
                } else {
                    v.to_string()
                };
                let r = match cli.scenario {
                    Scenario::Fanout => scenarios::fanout(&ctx, t).await,
                    Scenario::List => scenarios::list(&ctx, v, loaded_rev).await,
                    Scenario::Get => scenarios::get(&ctx, v, loaded_rev).await,
                    Scenario::Startup => scenarios::startup(&ctx, t).await,
                    Scenario::Idle => scenarios::idle(&ctx, t).await,
                    Scenario::Informers => {
                        let start = if v.ends_with("watch_list") {
                            scenarios::InformerStart::WatchList
                        } else {
                            scenarios::InformerStart::ListWatch
                        };
                        scenarios::informers(&ctx, t, start, loaded_rev).await
                    }
                    Scenario::Memory => {
                        let before = rss_before_load
                            .iter()
                            .find(|(x, _)| *x == t)
                            .and_then(|(_, r)| *r);
                        scenarios::memory(&ctx, t, loaded_rev, before).await
                    }
                    Scenario::Chaos | Scenario::Codec | Scenario::Burst => {
                        bail!("{:?} runs on its own path", cli.scenario)
                    }
                };
                let part = r.with_context(|| format!("{:?} against {key}", cli.scenario))?;
                match parts.iter_mut().find(|(k, _, _)| *k == key) {
                    Some((_, _, ps)) => ps.push(part),
                    None => parts.push((key, secure, vec![part])),
                }
            }
        }
    }
    ctx.p.duration_s = full_duration;

    let mut results = serde_json::Map::new();
    let mut hists: Vec<(String, Vec<[f64; 2]>)> = Vec::new();
    for (key, secure, ps) in parts {
        let mut value = scenarios::merge_get_rounds(ps)?;
        if let Some(o) = value.as_object_mut() {
            o.insert("secure".into(), json!(secure));
        }
        if let Some(d) = value.get("latency_distribution").and_then(|d| d.as_array()) {
            let pts: Vec<[f64; 2]> = d
                .iter()
                .filter_map(|p| Some([p.get(0)?.as_f64()?, p.get(1)?.as_f64()?]))
                .collect();
            if !pts.is_empty() {
                hists.push((key.clone(), pts));
            }
        }
        results.insert(key, value);
    }
    // Shut the daemon, grpc-proxy and kube-apiserver down before reporting.
    ctx.daemon.take();
    ctx.grpc_proxy.take();
    ctx.kube_writer.take();
    ctx.kube.take();

    let results = Value::Object(results);
    let (mut ratios, mut goals) = ratios_and_goals(cli.scenario, &results);
    if cli.compare_grpc {
        (ratios, goals) = grpc_ratios_and_goals(&results);
    }
    if cli.compare_kube {
        (ratios, goals) = kube_ratios_and_goals(cli.scenario, &results);
    }
    if cli.compare_secure {
        let (r, g) = secure_ratios_and_goals(cli.scenario, &results);
        merge(&mut ratios, r);
        merge(&mut goals, g);
    }
    let security = if targets
        .iter()
        .any(|t| matches!(t, Target::Grpc | Target::GrpcProxy))
    {
        " (proxy cpu s / proxy MB: the front of the row: watchcache, or etcd grpc-proxy)"
    } else if kube_mode {
        " (proxy: watchcache, config/kubernetes.toml; kube: kube-apiserver; both TLS + bearer token; proxy cpu s / proxy MB: the server of the row)"
    } else if cli.compare_secure {
        " (rows *_secure: TLS + bearer token + RBAC)"
    } else if cli.secure {
        " (proxy over TLS + bearer token + RBAC)"
    } else {
        ""
    };
    print_summary(cli.scenario, &results, &ratios, &goals, security);

    let argv: Vec<String> = std::env::args().collect();
    let report = json!({
        "tool": "watchcache-bench",
        "version": env!("CARGO_PKG_VERSION"),
        "scenario": format!("{:?}", cli.scenario).to_lowercase(),
        "command": argv.join(" "),
        "started_at": started.to_rfc3339(),
        "finished_at": chrono::Utc::now().to_rfc3339(),
        "machine": procfs::machine_info(nofile),
        "etcd_version": etcd_version,
        "etcd_endpoint": etcd_endpoint,
        "kube_apiserver_version": kube_version,
        // The proxy served TLS with bearer tokens and RBAC (in every proxy
        // run with --secure; in the `*_secure` runs with --compare-secure).
        "secure": cli.secure || cli.compare_secure,
        "params": {
            "targets": targets.iter().map(|t| t.name()).collect::<Vec<_>>(),
            "secure": cli.secure,
            "compare_secure": cli.compare_secure,
            "compare_grpc": cli.compare_grpc,
            "compare_kube": cli.compare_kube,
            "protobuf": ctx.p.protobuf,
            "watchers": ctx.p.watchers,
            "rate_per_s": ctx.p.rate,
            "duration_s": ctx.p.duration_s,
            "object_size": ctx.p.size,
            "keys": ctx.p.keys,
            "connections": ctx.p.connections,
            "streams_per_conn": ctx.p.streams_per_conn,
            "storage_media_type": if ctx.p.storage_protobuf { PROTOBUF } else { JSON },
            "gzip": ctx.p.gzip,
            "transport": if ctx.p.http1 { "http/1.1" } else { "h2c" },
            "transport_secure": (cli.secure || cli.compare_secure).then_some(if ctx.p.http1 { "http/1.1 over TLS" } else { "h2 over TLS" }),
            "etcd_watch_mode": if ctx.p.etcd_mux { "mux" } else { "stream" },
            "writers": ctx.p.writers,
            "objects": ctx.p.objects,
            "concurrency": ctx.p.concurrency,
            "iterations": ctx.p.iterations,
            "rounds": cli.rounds,
            "page_size": ctx.p.page_size,
            "namespace": ctx.p.namespace,
            "list_page_size": ctx.p.list_page_size,
        },
        "results": results,
        "ratios": ratios,
        "goals": goals,
    });
    // A set of runs (--repeat) is written as one report by main.
    if let Some(path) = cli.json.as_ref().filter(|_| cli.repeat == 1) {
        write_report(path, &report)?;
    }
    if let Some(path) = &cli.plot {
        if hists.is_empty() {
            eprintln!("--plot: this scenario has no latency distribution to draw");
        } else {
            let title = match cli.scenario {
                Scenario::Fanout => "F1 watch delivery latency",
                Scenario::List => "L1 full list latency",
                Scenario::Get => "G1 get latency",
                _ => "latency",
            };
            report::plot_latency(path, title, &hists)?;
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(Some(report))
}

/// Starts the bench's daemon, plain or secure ([`secure::SecureSetup`]),
/// waits until it is ready and makes it the proxy under test. A secure daemon
/// is asked for the bench's namespace first, so refused credentials fail the
/// run at once with the daemon's answer.
async fn start_daemon(
    ctx: &mut scenarios::Ctx,
    cfg: &str,
    secure: bool,
    token: Option<&str>,
) -> Result<()> {
    let t = Instant::now();
    let mut d = if secure {
        Daemon::spawn_secure(&ctx.watchcache_bin, cfg, token)?
    } else {
        Daemon::spawn(&ctx.watchcache_bin, cfg)?
    };
    d.wait_ready(t, Duration::from_secs(120))
        .await
        .context("starting watchcache")?;
    if secure {
        let path = format!("/api/v1/namespaces/{}/pods?limit=1", ctx.p.namespace);
        let (status, body) = http::get_once_with(&d.authority, d.tls.clone(), &path)
            .await
            .context("first request to the secure proxy")?;
        if !(200..300).contains(&status) {
            bail!(
                "the secure proxy refused the bench user {:?}: GET {path}: {status}: {}",
                secure::BENCH_USER,
                String::from_utf8_lossy(&body[..body.len().min(300)])
            );
        }
    }
    ctx.proxy_authority = Some(d.authority.clone());
    ctx.tls = d.tls.clone();
    ctx.daemon = Some(d);
    Ok(())
}

/// Adds the fields of object `extra` to object `into`.
fn merge(into: &mut Value, extra: Value) {
    if let (Some(a), Value::Object(b)) = (into.as_object_mut(), extra) {
        a.extend(b);
    }
}

/// The cost of TLS + bearer token + RBAC (`--compare-secure`): secure over
/// plain for the same scenario against the same etcd.
fn secure_ratios_and_goals(s: Scenario, r: &Value) -> (Value, Value) {
    let pair = |v: &str| Some((r.get(v)?, r.get(format!("{v}_secure"))?));
    match s {
        Scenario::Fanout => {
            let Some((plain, sec)) = pair("proxy") else {
                return (json!({}), json!({}));
            };
            let clean = ["lost", "duplicated", "unexpected", "out_of_order"]
                .iter()
                .all(|k| num(sec, &[k]) == 0.0);
            (
                json!({
                    "holder_cpu_per_delivery_secure_over_plain": ratio(
                        num(sec, &["per_delivery", "holder_cpu_us_per_delivery"]),
                        num(plain, &["per_delivery", "holder_cpu_us_per_delivery"]),
                    ),
                    "p50_latency_secure_over_plain": ratio(num(sec, &["latency_ms", "p50_ms"]), num(plain, &["latency_ms", "p50_ms"])),
                    "p99_latency_secure_over_plain": ratio(num(sec, &["latency_ms", "p99_ms"]), num(plain, &["latency_ms", "p99_ms"])),
                    "deliveries_per_s_secure_over_plain": ratio(num(sec, &["deliveries_per_s"]), num(plain, &["deliveries_per_s"])),
                    "holder_rss_per_watcher_secure_over_plain": ratio(
                        num(sec, &["per_delivery", "holder_rss_per_watcher_bytes"]),
                        num(plain, &["per_delivery", "holder_rss_per_watcher_bytes"]),
                    ),
                }),
                json!({ "secure_zero_lost_and_duplicated": clean }),
            )
        }
        Scenario::Get => {
            let mut ratios = serde_json::Map::new();
            for v in ["proxy", "proxy_consistent"] {
                let Some((plain, sec)) = pair(v) else {
                    continue;
                };
                let name = if v == "proxy" { "" } else { "consistent_" };
                ratios.insert(
                    format!("{name}gets_per_s_secure_over_plain"),
                    ratio(num(sec, &["gets_per_s"]), num(plain, &["gets_per_s"])),
                );
                ratios.insert(
                    format!("{name}p99_latency_secure_over_plain"),
                    ratio(
                        num(sec, &["latency_ms", "p99_ms"]),
                        num(plain, &["latency_ms", "p99_ms"]),
                    ),
                );
                ratios.insert(
                    format!("{name}p50_latency_secure_over_plain"),
                    ratio(
                        num(sec, &["latency_ms", "p50_ms"]),
                        num(plain, &["latency_ms", "p50_ms"]),
                    ),
                );
                ratios.insert(
                    format!("{name}server_cpu_per_get_secure_over_plain"),
                    ratio(
                        num(sec, &["server_cpu_us_per_get"]),
                        num(plain, &["server_cpu_us_per_get"]),
                    ),
                );
            }
            (Value::Object(ratios), json!({}))
        }
        Scenario::List => {
            let Some((plain, sec)) = pair("proxy") else {
                return (json!({}), json!({}));
            };
            (
                json!({
                    "full_list_p50_secure_over_plain": ratio(num(sec, &["full_list_ms", "p50_ms"]), num(plain, &["full_list_ms", "p50_ms"])),
                    "paged_list_p50_secure_over_plain": ratio(num(sec, &["paged_list_ms", "p50_ms"]), num(plain, &["paged_list_ms", "p50_ms"])),
                }),
                json!({}),
            )
        }
        Scenario::Idle => {
            let Some((plain, sec)) = pair("proxy") else {
                return (json!({}), json!({}));
            };
            (
                json!({
                    "rss_per_watcher_secure_over_plain": ratio(num(sec, &["rss_per_watcher_bytes"]), num(plain, &["rss_per_watcher_bytes"])),
                }),
                json!({}),
            )
        }
        Scenario::Startup
        | Scenario::Chaos
        | Scenario::Codec
        | Scenario::Burst
        | Scenario::Memory
        | Scenario::Informers => (json!({}), json!({})),
    }
}

/// `fanout --compare` with the grpc-proxy column: watchcache (the REST
/// watches) over etcd's own proxy (etcd watches through it), same writes,
/// same etcd; holder = the process holding the watchers.
fn proxy_over_grpc_proxy(proxy: &Value, gp: &Value) -> Value {
    let over = |p: &[&str]| ratio(num(proxy, p), num(gp, p));
    json!({
        "holder_cpu_per_delivery_proxy_over_grpc_proxy": over(&["per_delivery", "holder_cpu_us_per_delivery"]),
        "p99_latency_proxy_over_grpc_proxy": over(&["latency_ms", "p99_ms"]),
        "deliveries_per_s_proxy_over_grpc_proxy": over(&["deliveries_per_s"]),
        "busy_rss_per_watcher_proxy_over_grpc_proxy": over(&["per_delivery", "holder_rss_per_busy_watcher_bytes"]),
        "etcd_cpu_proxy_target_over_grpc_proxy_target": over(&["processes", "etcd", "cpu_s"]),
    })
}

/// `--compare-grpc`: watchcache's gRPC front (`grpc`) against etcd
/// grpc-proxy (`grpc_proxy`), and the etcd CPU each leaves to etcd against
/// watchers on etcd directly (`etcd`). `processes.proxy` is the front of
/// each column (the daemon, or grpc-proxy). Both deliver what the writers
/// offer, so deliveries/s count as matched within 1 %.
fn grpc_ratios_and_goals(r: &Value) -> (Value, Value) {
    let (Some(front), Some(gp), Some(etcd)) = (r.get("grpc"), r.get("grpc_proxy"), r.get("etcd"))
    else {
        return (json!({}), json!({}));
    };
    let clean = ["lost", "duplicated", "unexpected", "out_of_order"]
        .iter()
        .all(|k| [front, gp, etcd].iter().all(|x| num(x, &[k]) == 0.0));
    let all_established = [front, gp, etcd]
        .iter()
        .all(|x| num(x, &["watchers_established"]) == num(x, &["watchers"]));
    let over = |path: &[&str]| ratio(num(front, path), num(gp, path));
    let dps = ["deliveries_per_s"];
    let p99 = ["latency_ms", "p99_ms"];
    let cpu = ["processes", "proxy", "cpu_s"];
    let cpu_per = ["per_delivery", "holder_cpu_us_per_delivery"];
    let rss = ["per_delivery", "holder_rss_per_watcher_bytes"];
    let etcd_cpu = ["processes", "etcd", "cpu_s"];
    // RSS growth per watcher net of what the same writes cost the front
    // with no watcher on it (its growth in the etcd column, where it is
    // idle): the daemon caches every write, grpc-proxy caches nothing.
    let net = |col: &Value, name: &str| -> f64 {
        let growth = num(col, &["processes", "proxy", "peak_rss_kb"])
            - num(col, &["processes", "proxy", "rss_at_start_kb"]);
        let idle = num(etcd, &["processes", "idle_fronts", name, "peak_growth_kb"]);
        let w = num(col, &["watchers_established"]);
        ((growth - idle).max(0.0) * 1024.0 / w).round()
    };
    let (front_net, gp_net) = (net(front, "watchcache"), net(gp, "grpc_proxy"));
    (
        json!({
            "front_rss_per_watcher_net_bytes": front_net,
            "grpc_proxy_rss_per_watcher_net_bytes": gp_net,
            "front_rss_per_watcher_net_front_over_grpc_proxy": ratio(front_net, gp_net),
            "deliveries_per_s_front_over_grpc_proxy": over(&dps),
            "p99_latency_front_over_grpc_proxy": over(&p99),
            "p50_latency_front_over_grpc_proxy": over(&["latency_ms", "p50_ms"]),
            "front_cpu_front_over_grpc_proxy": over(&cpu),
            "front_cpu_per_delivery_front_over_grpc_proxy": over(&cpu_per),
            "front_rss_per_watcher_front_over_grpc_proxy": over(&rss),
            "etcd_cpu_front_over_etcd_direct": ratio(num(front, &etcd_cpu), num(etcd, &etcd_cpu)),
            "etcd_cpu_grpc_proxy_over_etcd_direct": ratio(num(gp, &etcd_cpu), num(etcd, &etcd_cpu)),
            "p99_latency_front_over_etcd_direct": ratio(num(front, &p99), num(etcd, &p99)),
        }),
        json!({
            "zero_lost_and_duplicated": clean,
            "every_watcher_established": all_established,
            "front_deliveries_per_s_at_least_grpc_proxy": num(front, &dps) >= 0.99 * num(gp, &dps),
            "front_p99_no_worse_than_grpc_proxy": num(front, &p99) <= num(gp, &p99),
            "front_cpu_below_grpc_proxy": num(front, &cpu) <= num(gp, &cpu),
            "front_rss_per_watcher_below_grpc_proxy": num(front, &rss) <= num(gp, &rss),
            "front_rss_per_watcher_net_of_cached_writes_below_grpc_proxy": front_net <= gp_net,
            "etcd_cpu_with_front_at_most_a_tenth": num(front, &etcd_cpu) <= num(etcd, &etcd_cpu) / 10.0,
        }),
    )
}

/// `--compare-kube`: watchcache (`proxy`, `proxy_protobuf`) over
/// kube-apiserver (`kube`, `kube_protobuf`), same etcd, same objects, same
/// clients, in turns; the goals are issue 35's.
///
/// fanout's CPU per delivery is each server's CPU in its own turn net of
/// what the same writes cost it in the other server's turn, when it holds
/// no watcher (kube-apiserver serves every write in both turns; both cache
/// every write): the cost of the deliveries alone. The gross ratio, each
/// server's whole CPU in its turn, is beside it.
fn kube_ratios_and_goals(s: Scenario, r: &Value) -> (Value, Value) {
    let none = Value::Null;
    let (wc, kube) = match (r.get("proxy"), r.get("kube")) {
        (Some(a), Some(b)) => (a, b),
        _ if s == Scenario::Informers => (&none, &none),
        _ => return (json!({}), json!({})),
    };
    let over = |p: &[&str]| ratio(num(wc, p), num(kube, p));
    match s {
        Scenario::Fanout => {
            let net_us = |x: &Value, other: &Value, idle_name: &str| {
                let cpu = num(x, &["processes", "proxy", "cpu_s"])
                    - num(other, &["processes", "idle_fronts", idle_name, "cpu_s"]);
                cpu.max(0.0) * 1e6 / num(x, &["deliveries"])
            };
            let wc_net = net_us(wc, kube, "watchcache");
            let kube_net = net_us(kube, wc, "kube_apiserver");
            let cpu_ratio = ratio(wc_net, kube_net);
            let p99 = over(&["latency_ms", "p99_ms"]);
            let counts = |x: &Value| {
                json!({
                    "lost": num(x, &["lost"]),
                    "duplicated": num(x, &["duplicated"]),
                    "unexpected": num(x, &["unexpected"]),
                    "out_of_order": num(x, &["out_of_order"]),
                    "resumed_watches": num(x, &["resumed_watches"]),
                })
            };
            let clean = ["lost", "duplicated", "unexpected", "out_of_order"]
                .iter()
                .all(|k| num(wc, &[k]) == 0.0 && num(kube, &[k]) == 0.0);
            let established = [wc, kube]
                .iter()
                .all(|x| num(x, &["watchers_established"]) == num(x, &["watchers"]));
            (
                json!({
                    "cpu_per_delivery_over_kube": cpu_ratio,
                    "cpu_us_per_delivery_net_watchcache": (wc_net * 1000.0).round() / 1000.0,
                    "cpu_us_per_delivery_net_kube": (kube_net * 1000.0).round() / 1000.0,
                    "cpu_per_delivery_gross_over_kube": over(&["per_delivery", "holder_cpu_us_per_delivery"]),
                    "p99_over_kube": p99,
                    "p50_over_kube": over(&["latency_ms", "p50_ms"]),
                    "deliveries_per_s_over_kube": over(&["deliveries_per_s"]),
                    "rss_per_busy_watcher_over_kube": over(&["per_delivery", "holder_rss_per_busy_watcher_bytes"]),
                    "watchcache": counts(wc),
                    "kube": counts(kube),
                }),
                json!({
                    "zero_lost_and_duplicated": clean,
                    "every_watcher_established": established,
                    "cpu_per_delivery_at_most_0_2_of_kube": cpu_ratio.as_f64().is_some_and(|v| v <= 0.2),
                    "p99_at_most_half_of_kube": p99.as_f64().is_some_and(|v| v <= 0.5),
                }),
            )
        }
        Scenario::List => {
            let full = ["full_list_ms", "p50_ms"];
            let json_ratio = over(&full);
            let pb = match (r.get("proxy_protobuf"), r.get("kube_protobuf")) {
                (Some(a), Some(b)) => ratio(num(a, &full), num(b, &full)),
                _ => Value::Null,
            };
            let met = |v: &Value| v.as_f64().is_some_and(|x| x <= 0.33);
            (
                json!({
                    "full_list_p50_over_kube": json_ratio,
                    "full_list_protobuf_p50_over_kube": pb,
                    "paged_list_p50_over_kube": over(&["paged_list_ms", "p50_ms"]),
                    "full_list_p99_over_kube": over(&["full_list_ms", "p99_ms"]),
                }),
                json!({
                    "full_list_p50_at_most_0_33_of_kube": met(&json_ratio),
                    "full_list_protobuf_p50_at_most_0_33_of_kube": met(&pb),
                }),
            )
        }
        Scenario::Get => {
            let tput = over(&["gets_per_s"]);
            (
                json!({
                    "throughput_over_kube": tput,
                    "p50_over_kube": over(&["latency_ms", "p50_ms"]),
                    "p99_over_kube": over(&["latency_ms", "p99_ms"]),
                    "server_cpu_per_get_over_kube": over(&["server_cpu_us_per_get"]),
                }),
                json!({ "throughput_at_least_3x_kube": tput.as_f64().is_some_and(|v| v >= 3.0) }),
            )
        }
        Scenario::Informers => {
            let mut ratios = serde_json::Map::new();
            let mut goals = serde_json::Map::new();
            for (start, suffix) in [("list_watch", ""), ("watch_list", "_watch_list")] {
                let (Some(a), Some(b)) = (
                    r.get(format!("proxy_{start}")),
                    r.get(format!("kube_{start}")),
                ) else {
                    continue;
                };
                // A side that did not sync every informer has no sync time
                // (kube-apiserver's request timeout cuts Lists that take
                // over a minute): no ratio, and the goals say so.
                let synced = |x: &Value| num(x, &["errors"]) == 0.0;
                goals.insert(
                    format!("every_informer{suffix}_synced_by_watchcache"),
                    json!(synced(a)),
                );
                goals.insert(
                    format!("every_informer{suffix}_synced_by_kube_apiserver"),
                    json!(synced(b)),
                );
                let both = synced(a) && synced(b);
                let o = |p: &[&str]| {
                    if both {
                        ratio(num(a, p), num(b, p))
                    } else {
                        Value::Null
                    }
                };
                let (wall, cpu, rss) = (
                    o(&["sync_wall_s"]),
                    o(&["server_cpu_s"]),
                    o(&["server_peak_rss_kb"]),
                );
                let at_most = |v: &Value, x: f64| json!(v.as_f64().is_some_and(|v| v <= x));
                goals.insert(
                    format!("sync_wall{suffix}_at_most_0_33_of_kube"),
                    at_most(&wall, 0.33),
                );
                goals.insert(
                    format!("server_cpu{suffix}_at_most_0_2_of_kube"),
                    at_most(&cpu, 0.2),
                );
                goals.insert(
                    format!("peak_rss{suffix}_at_most_0_25_of_kube"),
                    at_most(&rss, 0.25),
                );
                ratios.insert(format!("sync_wall{suffix}_over_kube"), wall);
                ratios.insert(format!("server_cpu{suffix}_over_kube"), cpu);
                ratios.insert(format!("peak_rss{suffix}_over_kube"), rss);
            }
            goals.insert(
                "every_informer_synced".into(),
                json!(
                    r.as_object()
                        .is_some_and(|m| m.values().all(|x| num(x, &["errors"]) == 0.0))
                ),
            );
            (Value::Object(ratios), Value::Object(goals))
        }
        Scenario::Memory => {
            let rss = over(&["rss_kb"]);
            (
                json!({
                    "rss_over_kube": rss,
                    "rss_growth_over_kube": over(&["rss_growth_kb"]),
                }),
                json!({ "rss_at_most_0_25_of_kube": rss.as_f64().is_some_and(|v| v <= 0.25) }),
            )
        }
        Scenario::Idle => {
            let per = ["rss_per_watcher_bytes"];
            let r = over(&per);
            (
                json!({ "rss_per_idle_watcher_over_kube": r }),
                json!({
                    "at_most_1kb_per_idle_watcher": num(wc, &per) <= 1024.0,
                    "rss_per_idle_watcher_at_most_0_25_of_kube": r.as_f64().is_some_and(|v| v <= 0.25),
                }),
            )
        }
        _ => (json!({}), json!({})),
    }
}

/// Issue 14's memory goal: RSS per busy watcher at most 4 KB, judged at
/// 10,000 watchers or more on the proxy (with fewer, the cached objects
/// weigh on each watcher's share and the figure says little).
fn add_busy_rss_goal(goals: &mut Value, x: &Value) {
    if x["target"] == "proxy" && num(x, &["watchers_established"]) >= 10_000.0 {
        goals["rss_per_busy_watcher_at_most_4kb_at_10000"] =
            json!(num(x, &["per_delivery", "holder_rss_per_busy_watcher_bytes"]) <= 4096.0);
    }
}

fn num(v: &Value, path: &[&str]) -> f64 {
    let mut cur = v;
    for p in path {
        match cur.get(p) {
            Some(n) => cur = n,
            None => return f64::NAN,
        }
    }
    cur.as_f64().unwrap_or(f64::NAN)
}

fn ratios_and_goals(s: Scenario, r: &Value) -> (Value, Value) {
    let (Some(proxy), Some(etcd)) = (r.get("proxy"), r.get("etcd")) else {
        let one = ["proxy", "etcd", "grpc", "grpc_proxy"]
            .iter()
            .find_map(|k| r.get(*k));
        let goals = match (s, one) {
            (Scenario::Fanout, Some(x)) => {
                let mut g = json!({
                    "zero_lost_and_duplicated": num(x, &["lost"]) == 0.0 && num(x, &["duplicated"]) == 0.0,
                });
                add_busy_rss_goal(&mut g, x);
                g
            }
            _ => json!({}),
        };
        return (json!({}), goals);
    };
    match s {
        Scenario::Fanout => {
            let p99p = num(proxy, &["latency_ms", "p99_ms"]);
            let p99e = num(etcd, &["latency_ms", "p99_ms"]);
            let cpup = num(proxy, &["processes", "etcd", "cpu_s"]);
            let cpue = num(etcd, &["processes", "etcd", "cpu_s"]);
            let clean = ["lost", "duplicated", "unexpected", "out_of_order"]
                .iter()
                .all(|k| num(proxy, &[k]) == 0.0 && num(etcd, &[k]) == 0.0);
            let mut out = (
                json!({
                    "p50_latency_proxy_over_etcd": ratio(num(proxy, &["latency_ms", "p50_ms"]), num(etcd, &["latency_ms", "p50_ms"])),
                    "p99_latency_proxy_over_etcd": ratio(p99p, p99e),
                    "max_latency_proxy_over_etcd": ratio(num(proxy, &["latency_ms", "max_ms"]), num(etcd, &["latency_ms", "max_ms"])),
                    "deliveries_per_s_proxy_over_etcd": ratio(num(proxy, &["deliveries_per_s"]), num(etcd, &["deliveries_per_s"])),
                    "etcd_cpu_proxy_target_over_etcd_target": ratio(cpup, cpue),
                    "holder_cpu_proxy_over_etcd": ratio(num(proxy, &["processes", "proxy", "cpu_s"]), cpue),
                    "holder_cpu_per_delivery_proxy_over_etcd": ratio(
                        num(proxy, &["per_delivery", "holder_cpu_us_per_delivery"]),
                        num(etcd, &["per_delivery", "holder_cpu_us_per_delivery"]),
                    ),
                }),
                json!({
                    "zero_lost_and_duplicated": clean,
                    "proxy_p99_no_worse_than_etcd": p99p <= p99e,
                    "etcd_cpu_at_most_a_tenth": cpup <= cpue / 10.0,
                    "holder_cpu_per_delivery_at_most_half_of_etcd":
                        num(proxy, &["per_delivery", "holder_cpu_us_per_delivery"])
                            <= 0.5 * num(etcd, &["per_delivery", "holder_cpu_us_per_delivery"]),
                }),
            );
            add_busy_rss_goal(&mut out.1, proxy);
            if let Some(gp) = r.get("grpc_proxy") {
                merge(&mut out.0, proxy_over_grpc_proxy(proxy, gp));
            }
            out
        }
        Scenario::List => {
            let full = |x: &Value| num(x, &["full_list_ms", "p50_ms"]);
            let paged = |x: &Value| num(x, &["paged_list_ms", "p50_ms"]);
            let cons = r.get("proxy_consistent");
            let floor = r.get("loopback");
            (
                json!({
                    "full_list_p50_speedup_proxy_vs_etcd": ratio(full(etcd), full(proxy)),
                    "paged_list_p50_speedup_proxy_vs_etcd": ratio(paged(etcd), paged(proxy)),
                    "full_list_p50_speedup_proxy_consistent_vs_etcd": cons.map(|c| ratio(full(etcd), full(c))).unwrap_or(Value::Null),
                    "paged_list_p50_speedup_proxy_consistent_vs_etcd": cons.map(|c| ratio(paged(etcd), paged(c))).unwrap_or(Value::Null),
                    // The proxy's List against the same bytes over bare
                    // loopback TCP, and about the most a server could reach
                    // against etcd in this run.
                    "full_list_p50_proxy_over_loopback_floor": floor.map(|l| ratio(full(proxy), full(l))).unwrap_or(Value::Null),
                    "full_list_p50_speedup_loopback_floor_vs_etcd": floor.map(|l| ratio(full(etcd), full(l))).unwrap_or(Value::Null),
                }),
                json!({ "full_list_at_least_10x_faster": full(etcd) >= 10.0 * full(proxy) }),
            )
        }
        Scenario::Get => {
            let tput = |x: &Value| num(x, &["gets_per_s"]);
            let cons = r.get("proxy_consistent");
            (
                json!({
                    "throughput_proxy_over_etcd": ratio(tput(proxy), tput(etcd)),
                    "throughput_proxy_consistent_over_etcd": cons.map(|c| ratio(tput(c), tput(etcd))).unwrap_or(Value::Null),
                    "p50_latency_proxy_over_etcd": ratio(num(proxy, &["latency_ms", "p50_ms"]), num(etcd, &["latency_ms", "p50_ms"])),
                    // What a Get costs each server, and each server with the
                    // bench's client: the two share the cores, so the second
                    // is the throughput ratio the machine allows.
                    "server_cpu_per_get_etcd_over_proxy": ratio(num(etcd, &["server_cpu_us_per_get"]), num(proxy, &["server_cpu_us_per_get"])),
                    "server_and_client_cpu_per_get_etcd_over_proxy": ratio(
                        num(etcd, &["server_cpu_us_per_get"]) + num(etcd, &["client_cpu_us_per_get"]),
                        num(proxy, &["server_cpu_us_per_get"]) + num(proxy, &["client_cpu_us_per_get"]),
                    ),
                }),
                json!({ "throughput_at_least_5x": tput(proxy) >= 5.0 * tput(etcd) }),
            )
        }
        Scenario::Startup => (
            json!({
                "ready_s_proxy_over_etcd": ratio(num(proxy, &["ready_s_median"]), num(etcd, &["ready_s_median"])),
            }),
            json!({}),
        ),
        Scenario::Chaos
        | Scenario::Codec
        | Scenario::Burst
        | Scenario::Memory
        | Scenario::Informers => (json!({}), json!({})),
        Scenario::Idle => {
            let pp = num(proxy, &["rss_per_watcher_bytes"]);
            (
                json!({
                    "rss_per_watcher_proxy_over_etcd": ratio(pp, num(etcd, &["rss_per_watcher_bytes"])),
                }),
                json!({
                    "under_10kb_per_idle_watcher": pp < 10_240.0,
                    // Issue 14's goal.
                    "at_most_2kb_per_idle_watcher": pp <= 2_048.0,
                }),
            )
        }
    }
}

fn print_summary(s: Scenario, r: &Value, ratios: &Value, goals: &Value, security: &str) {
    let Some(map) = r.as_object() else { return };
    let s2 = |v: &Value, p: &[&str]| -> String {
        let mut cur = v;
        for k in p {
            match cur.get(k) {
                Some(n) => cur = n,
                None => return "-".into(),
            }
        }
        match cur {
            Value::Number(n) => f(n.as_f64().unwrap_or(f64::NAN)),
            Value::Null => "-".into(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        }
    };
    let kb_to_mb = |v: &Value, p: &[&str]| -> String {
        let x = num(v, p);
        if x.is_nan() {
            "-".into()
        } else {
            f(x / 1024.0)
        }
    };
    match s {
        Scenario::Fanout => {
            let rows: Vec<Vec<String>> = map
                .iter()
                .map(|(k, v)| {
                    vec![
                        k.clone(),
                        s2(v, &["watchers_established"]),
                        s2(v, &["writes"]),
                        s2(v, &["deliveries"]),
                        s2(v, &["deliveries_per_s"]),
                        s2(v, &["latency_ms", "p50_ms"]),
                        s2(v, &["latency_ms", "p90_ms"]),
                        s2(v, &["latency_ms", "p99_ms"]),
                        s2(v, &["latency_ms", "max_ms"]),
                        s2(v, &["lost"]),
                        s2(v, &["duplicated"]),
                        s2(v, &["processes", "etcd", "cpu_s"]),
                        kb_to_mb(v, &["processes", "etcd", "peak_rss_kb"]),
                        s2(v, &["processes", "proxy", "cpu_s"]),
                        kb_to_mb(v, &["processes", "proxy", "peak_rss_kb"]),
                        s2(v, &["per_delivery", "holder_cpu_us_per_delivery"]),
                        s2(v, &["per_delivery", "etcd_cpu_us_per_delivery"]),
                        s2(v, &["per_delivery", "holder_rss_per_watcher_bytes"]),
                        s2(v, &["per_delivery", "holder_rss_per_busy_watcher_bytes"]),
                        s2(v, &["etcd_watchers"]),
                    ]
                })
                .collect();
            print_table(
                &format!("F1 fan-out{security}"),
                &[
                    "target",
                    "watchers",
                    "writes",
                    "deliveries",
                    "deliv/s",
                    "p50 ms",
                    "p90 ms",
                    "p99 ms",
                    "max ms",
                    "lost",
                    "dup",
                    "etcd cpu s",
                    "etcd MB",
                    "proxy cpu s",
                    "proxy MB",
                    "holder cpu us/deliv",
                    "etcd cpu us/deliv",
                    "holder RSS B/watcher",
                    "busy RSS B/watcher",
                    "etcd watchers",
                ],
                &rows,
            );
        }
        Scenario::List => {
            let rows: Vec<Vec<String>> = map
                .iter()
                .map(|(k, v)| {
                    vec![
                        k.clone(),
                        s2(v, &["items"]),
                        kb_to_mb(v, &["full_list_bytes"]),
                        kb_to_mb(v, &["full_list_wire_bytes"]),
                        s2(v, &["first_list_ms"]),
                        s2(v, &["full_list_ms", "p50_ms"]),
                        s2(v, &["full_list_ms", "p99_ms"]),
                        s2(v, &["paged_list_ms", "p50_ms"]),
                        s2(v, &["paged_list_ms", "p99_ms"]),
                        s2(v, &["pages"]),
                    ]
                })
                .collect();
            print_table(
                &format!("L1 list{security}"),
                &[
                    "target",
                    "items",
                    "full KiB",
                    "wire KiB",
                    "first ms",
                    "full p50 ms",
                    "full p99 ms",
                    "paged p50 ms",
                    "paged p99 ms",
                    "pages",
                ],
                &rows,
            );
            let wl = |v: &Value| v.get("watch_list").is_some_and(|w| !w.is_null());
            let rows: Vec<Vec<String>> = map
                .iter()
                .filter(|(_, v)| wl(v))
                .map(|(k, v)| {
                    let w = &v["watch_list"];
                    vec![
                        k.clone(),
                        s2(w, &["streams"]),
                        s2(w, &["gzipped_streams"]),
                        kb_to_mb(w, &["stream_bytes_per_stream"]),
                        kb_to_mb(w, &["wire_bytes_per_stream"]),
                        s2(w, &["proxy_cpu_ms_per_stream"]),
                        s2(w, &["to_initial_events_end_ms", "p50_ms"]),
                    ]
                })
                .collect();
            if !rows.is_empty() {
                print_table(
                    &format!("WatchList streams{security}"),
                    &[
                        "target",
                        "streams",
                        "gzipped",
                        "stream KiB",
                        "wire KiB",
                        "proxy CPU ms/stream",
                        "to bookmark p50 ms",
                    ],
                    &rows,
                );
            }
        }
        Scenario::Get => {
            let rows: Vec<Vec<String>> = map
                .iter()
                .map(|(k, v)| {
                    vec![
                        k.clone(),
                        s2(v, &["concurrency"]),
                        s2(v, &["gets"]),
                        s2(v, &["errors"]),
                        s2(v, &["gets_per_s"]),
                        s2(v, &["latency_ms", "p50_ms"]),
                        s2(v, &["latency_ms", "p99_ms"]),
                        s2(v, &["latency_ms", "max_ms"]),
                        s2(v, &["server_cpu_us_per_get"]),
                        s2(v, &["client_cpu_us_per_get"]),
                    ]
                })
                .collect();
            print_table(
                &format!("G1 get{security}"),
                &[
                    "target",
                    "K",
                    "gets",
                    "errors",
                    "gets/s",
                    "p50 ms",
                    "p99 ms",
                    "max ms",
                    "server cpu us/get",
                    "bench cpu us/get",
                ],
                &rows,
            );
        }
        Scenario::Startup => {
            let rows: Vec<Vec<String>> = map
                .iter()
                .map(|(k, v)| {
                    vec![
                        k.clone(),
                        s2(v, &["objects"]),
                        s2(v, &["ready_s_median"]),
                        kb_to_mb(v, &["rss_kb"]),
                        s2(v, &["rss_per_object_bytes"]),
                    ]
                })
                .collect();
            print_table(
                "S1 start-up",
                &[
                    "target",
                    "objects",
                    "ready s (median)",
                    "RSS MB",
                    "RSS B/object",
                ],
                &rows,
            );
        }
        Scenario::Chaos | Scenario::Codec | Scenario::Burst => {}
        Scenario::Informers => {
            let rows: Vec<Vec<String>> = map
                .iter()
                .map(|(k, v)| {
                    vec![
                        k.clone(),
                        s2(v, &["informers"]),
                        s2(v, &["objects"]),
                        s2(v, &["synced"]),
                        s2(v, &["errors"]),
                        s2(v, &["sync_wall_s"]),
                        s2(v, &["sync_ms", "p50_ms"]),
                        s2(v, &["sync_ms", "p99_ms"]),
                        kb_to_mb(v, &["bytes_per_informer"]),
                        s2(v, &["server_cpu_s"]),
                        kb_to_mb(v, &["server_peak_rss_kb"]),
                    ]
                })
                .collect();
            print_table(
                &format!("K2 informers{security}"),
                &[
                    "target",
                    "informers",
                    "objects",
                    "synced",
                    "errors",
                    "wall s",
                    "sync p50 ms",
                    "sync p99 ms",
                    "KiB/informer",
                    "server cpu s",
                    "server peak MB",
                ],
                &rows,
            );
        }
        Scenario::Memory => {
            let rows: Vec<Vec<String>> = map
                .iter()
                .map(|(k, v)| {
                    vec![
                        k.clone(),
                        s2(v, &["front"]),
                        s2(v, &["objects"]),
                        kb_to_mb(v, &["rss_before_load_kb"]),
                        kb_to_mb(v, &["rss_kb"]),
                        kb_to_mb(v, &["rss_growth_kb"]),
                        s2(v, &["rss_growth_per_object_bytes"]),
                    ]
                })
                .collect();
            print_table(
                &format!("K3 memory{security}"),
                &[
                    "target",
                    "server",
                    "objects",
                    "RSS before MB",
                    "RSS MB",
                    "growth MB",
                    "growth B/object",
                ],
                &rows,
            );
        }
        Scenario::Idle => {
            let rows: Vec<Vec<String>> = map
                .iter()
                .map(|(k, v)| {
                    vec![
                        k.clone(),
                        s2(v, &["watchers_established"]),
                        s2(v, &["connections"]),
                        kb_to_mb(v, &["holder", "rss_before_kb"]),
                        kb_to_mb(v, &["holder", "rss_after_kb"]),
                        s2(v, &["rss_per_watcher_bytes"]),
                        s2(v, &["etcd", "rss_per_watcher_bytes"]),
                    ]
                })
                .collect();
            print_table(
                &format!("M1 idle watchers{security}"),
                &[
                    "target",
                    "watchers",
                    "conns",
                    "RSS before MB",
                    "RSS after MB",
                    "B/watcher",
                    "etcd B/watcher",
                ],
                &rows,
            );
            let rows: Vec<Vec<String>> = map
                .iter()
                .flat_map(|(k, v)| {
                    v["cycles"].as_array().into_iter().flatten().map(move |c| {
                        vec![
                            k.clone(),
                            s2(c, &["cycle"]),
                            s2(c, &["watchers_established"]),
                            kb_to_mb(c, &["rss_open_kb"]),
                            kb_to_mb(c, &["rss_closed_kb"]),
                        ]
                    })
                })
                .collect();
            if !rows.is_empty() {
                print_table(
                    "M1 idle watchers opened and closed: holder RSS per cycle",
                    &[
                        "target",
                        "cycle",
                        "watchers",
                        "RSS open MB",
                        "RSS closed MB",
                    ],
                    &rows,
                );
            }
        }
    }
    if let Some(m) = ratios.as_object().filter(|m| !m.is_empty()) {
        println!("\nratios");
        for (k, v) in m {
            println!("  {k:<52} {}", s2(v, &[]));
        }
    }
    if let Some(m) = goals.as_object().filter(|m| !m.is_empty()) {
        println!("\ngoals");
        for (k, v) in m {
            let ok = v.as_bool().unwrap_or(false);
            println!("  {k:<52} {}", if ok { "met" } else { "MISSED" });
        }
    }
    for (k, v) in map {
        for key in ["first_error", "first_write_error"] {
            if let Some(e) = v.get(key).and_then(|e| e.as_str()) {
                println!("\n{k}: {key}: {e}");
            }
        }
    }
}

/// The binaries of the chaos run's rolling upgrade: `--etcd-upgrade`, or
/// etcd 3.6 and 3.7 from `scripts/peers.sh --print` in the source tree when
/// both are built (none otherwise).
fn upgrade_binaries(given: &[PathBuf]) -> Result<Vec<PathBuf>> {
    if !given.is_empty() {
        for b in given {
            if !b.is_file() {
                bail!("--etcd-upgrade {}: no such file", b.display());
            }
        }
        return Ok(given.to_vec());
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/peers.sh");
    let Ok(out) = std::process::Command::new("bash")
        .arg(&script)
        .args(["--print", "etcd-3.6", "etcd-3.7"])
        .stderr(std::process::Stdio::null())
        .output()
    else {
        return Ok(Vec::new());
    };
    let bins: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .collect();
    Ok(if out.status.success() && bins.len() == 2 {
        bins
    } else {
        Vec::new()
    })
}

/// `chaos`: faults against etcd and the daemon, every stream checked against
/// etcd's history; an error (exit 1) on any violation, after the report.
async fn run_chaos(
    cli: Cli,
    keeper: Option<EtcdKeeper>,
    etcd_endpoint: String,
    nofile: u64,
    started: chrono::DateTime<chrono::Utc>,
) -> Result<()> {
    let watchcache_bin = match (&cli.watchcache_bin, &cli.proxy) {
        (Some(p), _) => p.clone(),
        (None, Some(_)) => PathBuf::new(),
        (None, None) => default_watchcache_bin()?,
    };
    let p = chaos::ChaosParams {
        duration: Duration::from_secs_f64(cli.duration.unwrap_or(120.0)),
        seed: cli.seed,
        watchers: cli.watchers.unwrap_or(12),
        listers: cli.listers,
        rate: cli.rate.unwrap_or(30.0),
        keys: cli.keys.unwrap_or(20).max(1),
        namespace: cli.namespace.clone(),
        etcd_prefix: cli.etcd_prefix.clone(),
        etcd_endpoint: etcd_endpoint.clone(),
        etcd_pid: cli.etcd_pid,
        daemon_authority: cli.proxy.as_ref().map(|u| {
            u.trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string()
        }),
        watchcache_bin,
        etcd_members: cli.etcd_members as usize,
        etcd_bin: match watchcache::etcd_server::find_etcd_binary() {
            Some(b) => b,
            None if cli.etcd_members > 1 => {
                bail!("{}", watchcache::etcd_server::EtcdServerError::NotFound)
            }
            None => PathBuf::new(),
        },
        keep_dir: cli.keep_dir,
        etcd_upgrades: if cli.etcd_members >= 3 {
            upgrade_binaries(&cli.etcd_upgrade)?
        } else {
            Vec::new()
        },
    };
    let etcd_desc = if p.etcd_members > 1 {
        format!(
            "a {}-member cluster of {}",
            p.etcd_members,
            p.etcd_bin.display()
        )
    } else {
        etcd_endpoint.clone()
    };
    eprintln!(
        "watchcache-bench chaos: seed {}, {:?}, etcd {etcd_desc}",
        p.seed, p.duration
    );
    if !p.etcd_upgrades.is_empty() {
        eprintln!("chaos: rolling upgrade onto {:?}", p.etcd_upgrades);
    } else if p.etcd_members >= 3 {
        eprintln!(
            "chaos: no rolling upgrade (no etcd 3.6/3.7: scripts/peers.sh etcd-3.6 etcd-3.7, or --etcd-upgrade BIN)"
        );
    }
    if cli.front == ChaosFront::Grpc {
        let out = chaos::grpc::run(&p, keeper.as_ref()).await?;
        chaos::grpc::print(&out, cli.seed);
        if let Some(path) = &cli.json {
            let argv: Vec<String> = std::env::args().collect();
            let report = json!({
                "tool": "watchcache-bench",
                "version": env!("CARGO_PKG_VERSION"),
                "scenario": "chaos",
                "command": argv.join(" "),
                "started_at": started.to_rfc3339(),
                "finished_at": chrono::Utc::now().to_rfc3339(),
                "machine": procfs::machine_info(nofile),
                "etcd_version": out.etcd_version,
                "etcd_endpoint": etcd_endpoint,
                "results": out.json,
            });
            write_report(path, &report)?;
        }
        if out.violations() > 0 {
            let first = match (out.report.violations.first(), out.illegal_keys.first()) {
                (Some(v), _) => format!("{} {}: {}", v.kind, v.client, v.detail),
                (None, Some(k)) => format!("porcupine: key {k} not linearizable"),
                (None, None) => String::new(),
            };
            bail!(
                "{} consistency violations; the first: {first}",
                out.violations()
            );
        }
        return Ok(());
    }
    let out = chaos::run(p, keeper.as_ref()).await?;
    let r = &out.report;
    println!("chaos (seed {})", cli.seed);
    println!("  faults injected       {}", out.faults.len());
    for (k, v) in out.json["faults_by_kind"].as_object().into_iter().flatten() {
        println!("    {k:<20} {v}");
    }
    chaos::print_recovery(&out.json["recovery_by_kind"]);
    chaos::print_memory(&out.json["daemon_memory"]);
    println!("  writes acknowledged   {}", r.writes_acknowledged);
    println!(
        "    (409 retried {}, failed during faults {})",
        out.json["write_conflicts"], out.json["write_errors"]
    );
    println!("  events checked        {}", r.events_checked);
    println!("  bookmarks checked     {}", r.bookmarks_checked);
    println!("  lists checked         {}", r.lists_checked);
    println!("  watches expired (410) {}", r.expired);
    println!("  relist events         {}", r.relist_events);
    println!("  violations            {}", r.violations.len());
    for v in r.violations.iter().take(20) {
        println!("    {:?} {}: {}", v.kind, v.client, v.detail);
    }
    if let Some(path) = &cli.json {
        let argv: Vec<String> = std::env::args().collect();
        let report = json!({
            "tool": "watchcache-bench",
            "version": env!("CARGO_PKG_VERSION"),
            "scenario": "chaos",
            "command": argv.join(" "),
            "started_at": started.to_rfc3339(),
            "finished_at": chrono::Utc::now().to_rfc3339(),
            "machine": procfs::machine_info(nofile),
            "etcd_version": out.etcd_version,
            "etcd_endpoint": etcd_endpoint,
            "results": out.json,
        });
        write_report(path, &report)?;
    }
    if let Some(v) = r.violations.first() {
        bail!(
            "{} consistency violations; the first: {:?} {}: {}",
            r.violations.len(),
            v.kind,
            v.client,
            v.detail
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_seconds_minutes_and_hours() {
        assert_eq!(parse_seconds("30"), Ok(30.0));
        assert_eq!(parse_seconds("1.5s"), Ok(1.5));
        assert_eq!(parse_seconds("2m"), Ok(120.0));
        assert_eq!(parse_seconds("1h"), Ok(3600.0));
        assert!(parse_seconds("1d").is_err());
    }

    fn column(peak_kb: f64, start_kb: f64, idle: Value) -> Value {
        json!({
            "watchers": 1000, "watchers_established": 1000,
            "lost": 0, "duplicated": 0, "unexpected": 0, "out_of_order": 0,
            "deliveries_per_s": 1000.0,
            "latency_ms": {"p50_ms": 1.0, "p99_ms": 2.0},
            "processes": {
                "proxy": {"cpu_s": 1.0, "peak_rss_kb": peak_kb, "rss_at_start_kb": start_kb},
                "etcd": {"cpu_s": 1.0},
                "idle_fronts": idle,
            },
            "per_delivery": {"holder_cpu_us_per_delivery": 1.0, "holder_rss_per_watcher_bytes": 1.0},
        })
    }

    #[test]
    fn grpc_rss_per_watcher_is_net_of_the_idle_fronts_growth() {
        let etcd = column(
            0.0,
            0.0,
            json!({"watchcache": {"peak_growth_kb": 8000.0}, "grpc_proxy": {"peak_growth_kb": 500.0}}),
        );
        let r = json!({
            "etcd": etcd,
            // 10,000 KB of growth with 1,000 watchers, 8,000 of it the cached writes.
            "grpc": column(50_000.0, 40_000.0, json!({})),
            "grpc_proxy": column(37_500.0, 30_000.0, json!({})),
        });
        let (ratios, goals) = grpc_ratios_and_goals(&r);
        assert_eq!(ratios["front_rss_per_watcher_net_bytes"], json!(2048.0));
        assert_eq!(
            ratios["grpc_proxy_rss_per_watcher_net_bytes"],
            json!(7168.0)
        );
        assert_eq!(
            goals["front_rss_per_watcher_net_of_cached_writes_below_grpc_proxy"],
            json!(true)
        );
    }
}

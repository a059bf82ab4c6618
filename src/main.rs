//! `watchcache`: the daemon. Parses the CLI, loads and validates the config,
//! optionally starts a private etcd (`--dev`), then serves the API until
//! SIGTERM/SIGINT.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use tracing::info;

use watchcache::api::Server;
use watchcache::config::{AuthorizationMode, Config, ConfigError, TlsConfig};
use watchcache::etcd_server::EtcdServer;
use watchcache::grpc::GrpcServer;
use watchcache::storage::tls::EtcdTls;
use watchcache::storage::{EncryptionTransformer, Storage};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// A watch-cache proxy daemon for etcd.
#[derive(Debug, Parser)]
#[command(name = "watchcache", version, about, long_about = None)]
struct Cli {
    /// Path of the TOML config file (see config/watchcache.toml).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to listen on (overrides `listen` in the file), e.g. 127.0.0.1:8080.
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Address of the etcd v3 gRPC front (overrides `grpc_listen`), e.g.
    /// 127.0.0.1:2381: etcd clients get Range/Watch from the cache. Off unless set.
    #[arg(long, value_name = "ADDR")]
    grpc_listen: Option<String>,
    /// etcd endpoints (overrides `etcd.endpoints`), comma-separated.
    #[arg(long, value_name = "URL[,URL]", value_delimiter = ',')]
    etcd_endpoints: Option<Vec<String>>,
    /// CA bundle that verifies etcd's serving certificate (sets `etcd.tls.ca_file`).
    #[arg(long, value_name = "FILE")]
    etcd_cafile: Option<PathBuf>,
    /// Client certificate for etcd's --client-cert-auth (sets `etcd.tls.cert_file`).
    #[arg(long, value_name = "FILE")]
    etcd_certfile: Option<PathBuf>,
    /// Private key of --etcd-certfile (sets `etcd.tls.key_file`).
    #[arg(long, value_name = "FILE")]
    etcd_keyfile: Option<PathBuf>,
    /// kube-apiserver's EncryptionConfiguration (YAML or JSON): encryption at
    /// rest (sets `etcd.encryption_provider_config`).
    #[arg(long, value_name = "FILE")]
    encryption_provider_config: Option<PathBuf>,
    /// Dev mode: start a private etcd on free loopback ports with a temporary
    /// data dir (removed on exit) and serve the example resources (or --config).
    #[arg(long)]
    dev: bool,
    /// How often each resource's cache is compared with etcd at one revision
    /// (relisted on a mismatch), e.g. `5m`, `30s`; `0` turns it off.
    /// Overrides `server.consistency_check_interval_seconds`.
    #[arg(long, value_name = "DURATION", value_parser = parse_interval)]
    consistency_check_interval: Option<std::time::Duration>,
    /// Log format; the level comes from RUST_LOG (default info).
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// PEM serving certificate (chain); with --tls-private-key-file the API
    /// is served over HTTPS (overrides `[server.tls]`). Re-read on change.
    #[arg(long, value_name = "FILE", requires = "tls_private_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// PEM private key of --tls-cert-file.
    #[arg(long, value_name = "FILE", requires = "tls_cert_file")]
    tls_private_key_file: Option<PathBuf>,
    /// Minimum TLS version: VersionTLS12 (default) or VersionTLS13.
    #[arg(long, value_name = "VERSION")]
    tls_min_version: Option<String>,
    /// PEM CA bundle: client certificates signed by it authenticate as
    /// user = CN, groups = O.
    #[arg(long, value_name = "FILE")]
    client_ca_file: Option<PathBuf>,
    /// Static bearer tokens, CSV `token,user,uid,"group1,group2"`.
    #[arg(long, value_name = "FILE")]
    token_auth_file: Option<PathBuf>,
    /// Requests without credentials are `system:anonymous` (default: true
    /// only when no authenticator is configured).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    anonymous_auth: Option<bool>,
    /// AlwaysAllow (default) or RBAC.
    #[arg(long, value_name = "MODE")]
    authorization_mode: Option<String>,
    /// RBAC policy file (Roles, ClusterRoles, bindings; YAML, several
    /// documents); repeatable. Replaces `[server.authorization] policy_files`.
    #[arg(long, value_name = "FILE")]
    rbac_policy_file: Vec<PathBuf>,
    /// kube-apiserver's feature gates watchcache has, `Name=bool,...`:
    /// `APIResponseCompression` (default true), `ShardedListAndWatch`
    /// (default false).
    #[arg(long, value_name = "GATES")]
    feature_gates: Option<String>,
}

/// A duration like `5m`, `90s`, `1h30m`, or `0`.
fn parse_interval(s: &str) -> Result<std::time::Duration, String> {
    if s.trim() == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (e.g. 5m, 30s, 0)"))?;
    // The setting is in whole seconds, where 0 means off: `500ms` must not
    // turn the check off by rounding down.
    if d.subsec_nanos() != 0 {
        return Err(format!(
            "{s:?} is not a whole number of seconds (e.g. 5m, 30s, 0)"
        ));
    }
    Ok(d)
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Loads the config named on the command line (or the example in dev mode)
/// and applies the command-line overrides, then validates the result once:
/// flags may complete a file that is not valid on its own (`https://`
/// endpoints in the file, their CA in `--etcd-cafile`, as kube-apiserver
/// takes them).
fn load_config(cli: &Cli) -> Result<Config, ConfigError> {
    let (mut cfg, file) = match (&cli.config, cli.dev) {
        (Some(path), _) => (Config::read(path)?, path.display().to_string()),
        (None, true) => (Config::example(), "config/watchcache.toml".to_string()),
        (None, false) => {
            return Err(ConfigError::Invalid {
                file: "command line".into(),
                field: "--config".into(),
                message: "a config file is required (or use --dev)".into(),
            });
        }
    };
    let mut overridden = false;
    if let Some(listen) = &cli.listen {
        cfg.listen = listen.clone();
        overridden = true;
    }
    if let Some(grpc) = &cli.grpc_listen {
        cfg.grpc_listen = Some(grpc.clone());
        overridden = true;
    }
    if let Some(eps) = &cli.etcd_endpoints {
        cfg.etcd.endpoints = eps.clone();
        overridden = true;
    }
    overridden |= apply_security_flags(cli, &mut cfg, &file)?;
    if let Some(gates) = &cli.feature_gates {
        cfg.server
            .set_feature_gates(gates)
            .map_err(|e| ConfigError::Invalid {
                file: "command line".into(),
                field: "--feature-gates".into(),
                message: e,
            })?;
        overridden = true;
    }
    if let Some(d) = cli.consistency_check_interval {
        cfg.server.consistency_check_interval_seconds = d.as_secs();
        overridden = true;
    }
    if cli.etcd_cafile.is_some() || cli.etcd_certfile.is_some() || cli.etcd_keyfile.is_some() {
        let tls = cfg.etcd.tls.get_or_insert_with(Default::default);
        if let Some(p) = &cli.etcd_cafile {
            tls.ca_file = Some(p.clone());
        }
        if let Some(p) = &cli.etcd_certfile {
            tls.cert_file = Some(p.clone());
        }
        if let Some(p) = &cli.etcd_keyfile {
            tls.key_file = Some(p.clone());
        }
        overridden = true;
    }
    if let Some(path) = &cli.encryption_provider_config {
        cfg.etcd.encryption_provider_config = Some(path.clone());
        overridden = true;
    }
    if overridden {
        cfg.validate(&format!("{file} (with command-line overrides)"))?;
    } else {
        cfg.validate(&file)?;
    }
    Ok(cfg)
}

/// Applies the kube-apiserver-style security flags over the file's
/// `[server.tls]`, `[server.authentication]` and `[server.authorization]`.
/// Returns whether anything was overridden.
fn apply_security_flags(cli: &Cli, cfg: &mut Config, file: &str) -> Result<bool, ConfigError> {
    let flag_error = |field: &str, message: String| ConfigError::Invalid {
        file: format!("{file} (with command-line overrides)"),
        field: field.into(),
        message,
    };
    let mut overridden = false;
    let server = &mut cfg.server;
    if let (Some(cert), Some(key)) = (&cli.tls_cert_file, &cli.tls_private_key_file) {
        let min_version = server
            .tls
            .as_ref()
            .map(|t| t.min_version.clone())
            .unwrap_or_else(|| "VersionTLS12".into());
        server.tls = Some(TlsConfig {
            cert_file: cert.clone(),
            private_key_file: key.clone(),
            min_version,
        });
        overridden = true;
    }
    if let Some(v) = &cli.tls_min_version {
        match &mut server.tls {
            Some(t) => t.min_version = v.clone(),
            None => {
                return Err(flag_error(
                    "--tls-min-version",
                    "needs --tls-cert-file and --tls-private-key-file".into(),
                ));
            }
        }
        overridden = true;
    }
    let authn = &mut server.authentication;
    if let Some(ca) = &cli.client_ca_file {
        authn.client_ca_file = Some(ca.clone());
        overridden = true;
    }
    if let Some(t) = &cli.token_auth_file {
        authn.token_auth_file = Some(t.clone());
        overridden = true;
    }
    if let Some(a) = cli.anonymous_auth {
        authn.anonymous = Some(a);
        overridden = true;
    }
    let authz = &mut server.authorization;
    if let Some(mode) = &cli.authorization_mode {
        authz.mode =
            AuthorizationMode::parse(mode).map_err(|m| flag_error("--authorization-mode", m))?;
        overridden = true;
    }
    if !cli.rbac_policy_file.is_empty() {
        authz.policy_files = cli.rbac_policy_file.clone();
        overridden = true;
    }
    Ok(overridden)
}

/// Resolves when SIGTERM or SIGINT arrives.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
    info!("shutdown signal received");
}

/// jemalloc instead of glibc's malloc. A connection's task moves between
/// the runtime's worker threads, so buffers are often freed on another
/// thread than the one that allocated them, and glibc then takes the owning
/// arena's lock: under consistent Gets, `malloc` and `free` with their
/// futex wake-ups were 18% of the daemon's CPU. Against glibc (tuned as the
/// daemon had it), in interleaved runs (docs/BENCHMARKS.md#build-and-allocator):
/// CPU per Get -2 to -6%, per delivered event -6 to -12%; RSS per idle
/// watcher the same, per cached object lower. jemalloc keeps freed pages a
/// while for reuse (its dirty-page decay), so a List's frames are not
/// faulted in again on every List, which glibc needed `mallopt` for.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read at its start (`_RJEM_MALLOC_CONF` in the
/// environment still overrides them). By default jemalloc gives freed pages
/// back to the system over 10 s, and only while the arena holding them
/// allocates: the pages 2,000 closed HTTP/1.1 watches freed stayed resident,
/// the next 2,000 reused them only in part, and RSS with them open went
/// from 79 MB to 82-110 MB over cycles of opening and closing them, with
/// them closed 56-87 MB. A background thread purges every arena, within
/// about a second of the frees: RSS stays at 79 MB open and 15-16 MB closed
/// (docs/RELIABILITY.md#memory-over-watch-cycles).
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &u8 = &b"background_thread:true,dirty_decay_ms:1000\0"[0];

fn main() -> Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(daemon_main())
}

async fn daemon_main() -> Result<()> {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    let mut cfg = match load_config(&cli) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("watchcache: invalid configuration: {e}");
            std::process::exit(2);
        }
    };

    // The security files (serving certificate, client CA, token file, RBAC
    // policy) are read first, before etcd is dialled: a bad one stops
    // start-up (exit 2) naming its file, whatever state etcd is in.
    let security = match watchcache::api::Security::from_config(&cfg.server) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("watchcache: invalid configuration: {e}");
            std::process::exit(2);
        }
    };

    // Dev mode: the private etcd lives as long as this (main) thread, which
    // started it; it is killed and its data dir removed when `_etcd` drops.
    let _etcd = if cli.dev {
        let etcd = EtcdServer::start()
            .await
            .context("dev mode: starting a private etcd")?;
        info!(endpoint = %etcd.endpoint(), data_dir = %etcd.data_dir().display(), "dev mode: private etcd started");
        cfg.etcd.endpoints = vec![etcd.endpoint()];
        Some(etcd)
    } else {
        None
    };

    // TLS files and the encryption config are checked before anything
    // listens: a bad one stops start-up (exit 2) naming the field.
    let tls = match load_etcd_tls(&cfg).await {
        Ok(t) => t,
        Err(e) => {
            eprintln!("watchcache: invalid configuration: {e}");
            std::process::exit(2);
        }
    };
    let transformer = match &cfg.etcd.encryption_provider_config {
        None => Some(Arc::new(EncryptionTransformer::identity(
            &cfg.resources,
            &cfg.etcd.prefix,
        ))),
        Some(path) => match EncryptionTransformer::load(path, &cfg.resources, &cfg.etcd.prefix) {
            Ok(t) => {
                info!(file = %path.display(), "encryption at rest enabled");
                Some(Arc::new(t))
            }
            Err(e) => {
                eprintln!(
                    "watchcache: invalid configuration: etcd.encryption_provider_config: {e}"
                );
                std::process::exit(2);
            }
        },
    };

    let addr = match cfg.listen_addr() {
        Ok(a) => a,
        Err(m) => bail!("listen: {m}"),
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    info!(listen = %listener.local_addr()?, resources = cfg.resources.len(), "watchcache listening");
    let grpc_listener = match cfg.grpc_listen_addr() {
        Ok(None) => None,
        Ok(Some(addr)) => {
            // The front is plain gRPC and passes writes, maintenance and
            // member calls to etcd over this daemon's own connection: where
            // etcd's only access control is the client certificate
            // (`--client-cert-auth`, auth off, as kubeadm sets it up),
            // anyone who reaches the front holds that certificate's rights.
            let lends_cert = cfg.etcd.tls.as_ref().is_some_and(|t| t.cert_file.is_some());
            if !addr.ip().is_loopback() && lends_cert && cfg.etcd.username.is_none() {
                tracing::warn!(
                    %addr,
                    "the etcd gRPC front listens on a non-loopback address and reaches etcd with this daemon's client certificate: unless etcd's own authentication is on, anyone who can reach the front can write to etcd with that certificate's rights; bind grpc_listen to loopback or restrict access to it"
                );
            }
            Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding {addr} (grpc_listen)"))?,
            )
        }
        Err(m) => bail!("grpc_listen: {m}"),
    };
    run(cfg, tls, transformer, security, listener, grpc_listener).await
}

/// Loads `[etcd.tls]` for `https://` endpoints and checks one handshake,
/// so a CA that does not verify etcd, or a client certificate etcd refuses,
/// stops start-up instead of showing up later as an unready daemon.
async fn load_etcd_tls(cfg: &Config) -> Result<Option<Arc<EtcdTls>>, String> {
    let Some(tls_cfg) = &cfg.etcd.tls else {
        return Ok(None);
    };
    if !cfg.etcd.endpoints.iter().any(|e| e.starts_with("https://")) {
        return Ok(None);
    }
    let tls = EtcdTls::load(tls_cfg).map_err(|e| e.to_string())?;
    tls.probe(&cfg.etcd.endpoints, cfg.etcd.dial_timeout())
        .await
        .map_err(|e| e.to_string())?;
    Ok(Some(tls))
}

/// Connects to etcd (lazily: an etcd that is down at start only delays
/// readiness), starts one Cacher per resource (and the gRPC front when
/// configured) and serves until a signal.
async fn run(
    cfg: Config,
    tls: Option<Arc<EtcdTls>>,
    transformer: Option<Arc<EncryptionTransformer>>,
    security: watchcache::api::Security,
    listener: tokio::net::TcpListener,
    grpc_listener: Option<tokio::net::TcpListener>,
) -> Result<()> {
    let mut storage = Storage::connect_with_tls(&cfg.etcd, tls)
        .await
        .with_context(|| format!("connecting to etcd at {:?}", cfg.etcd.endpoints))?;
    if let Some(t) = transformer {
        storage = storage.with_transformer(t);
    }
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            shutdown_signal().await;
            stop.cancel();
        }
    });
    // The gRPC front reads etcd's stored bytes as they are (no transformer).
    let grpc = grpc_listener.map(|l| {
        let front = GrpcServer::new(&cfg, storage.clone());
        tokio::spawn(front.serve(l, stop.clone().cancelled_owned()))
    });
    let server = Server::with_security(cfg, storage, security);
    server.serve(listener, stop.cancelled_owned()).await?;
    if let Some(g) = grpc {
        match g.await {
            Ok(Err(e)) => tracing::warn!(error = %e, "gRPC front ended with an error"),
            Err(e) => tracing::warn!(error = %e, "gRPC front task failed"),
            Ok(Ok(())) => {}
        }
    }
    info!("watchcache stopped");
    Ok(())
}

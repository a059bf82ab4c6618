//! The front doors: an HTTP server (hyper 1.x; HTTP/1.1 and h2c with prior
//! knowledge on one port) serving the Kubernetes-style REST API ([`k8s`]) and
//! the operational endpoints ([`ops`]).
//!
//! [`Server::new`] starts one [`Cacher`] per configured resource;
//! [`Server::serve`] accepts connections until the shutdown future resolves,
//! then stops accepting, shuts every cacher down (which ends open watch
//! streams), lets in-flight requests finish and returns within 5 s.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{CONNECTION, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Request, Response, StatusCode};
use smallvec::SmallVec;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, warn};

use crate::auth::UserInfo;
use crate::cacher::{Cacher, CacherOptions};
use crate::config::{Config, ResourceConfig};
use crate::storage::Storage;
use connection::ConnectionHandle;
use list_body_cache::{ListBodyBudget, ListBodyCache};
use params::Query;

mod body;
mod compression;
mod connection;
pub mod discovery;
mod errors;
pub mod field_manager;
pub mod k8s;
pub mod list_body_cache;
pub mod ops;
pub mod params;
mod protobuf;
mod reads;
pub mod request_info;
mod reviews;
pub mod secure;
pub mod smp;
pub mod status;
mod stream_executor;
pub mod table;
mod watch_stream;
pub use watch_stream::WatchStreams;
mod writes;

pub use request_info::{RequestInfo, RequestInfoError};
pub use secure::{Security, SecurityError};
pub use status::ApiStatus;

/// How long [`Server::serve`] waits for connections to drain after shutdown.
const DRAIN_TIMEOUT: Duration = Duration::from_millis(4_000);

pub use body::Body;

/// Errors of the server itself (request errors are `Status` responses).
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Security(#[from] SecurityError),
}

/// One served resource: its config and its cacher.
pub struct Resource {
    pub config: ResourceConfig,
    pub cacher: Arc<Cacher>,
    /// Bodies of full Lists, kept for Lists of the same objects.
    pub list_bodies: Arc<ListBodyCache>,
}

/// State shared by every request.
pub struct State {
    pub config: Config,
    pub storage: Storage,
    pub resources: Vec<Resource>,
    /// Indexes into `resources` by plural, for [`State::resource`]: every
    /// request looks its resource up.
    by_plural: foldhash::HashMap<String, SmallVec<[usize; 2]>>,
    /// One permit per open watch stream, `server.max_watches` in all; each
    /// stream holds its owned permit until it ends.
    pub watch_slots: Arc<Semaphore>,
    /// Cancelled when the server shuts down; open watch streams end.
    pub shutdown: CancellationToken,
    /// Result of the latest etcd probe (see [`probe_etcd`]); part of `/readyz`.
    pub etcd_reachable: AtomicBool,
    /// TLS, authentication and authorization as configured.
    pub security: Security,
    /// Open watch streams, for their sweeper.
    pub watch_streams: Arc<WatchStreams>,
}

impl State {
    /// Watch streams open now.
    pub fn open_watches(&self) -> usize {
        self.config
            .server
            .max_watches
            .min(Semaphore::MAX_PERMITS)
            .saturating_sub(self.watch_slots.available_permits())
    }

    /// The resource served at `group`/`version`/`plural`.
    pub fn resource(&self, group: &str, version: &str, plural: &str) -> Option<&Resource> {
        self.by_plural
            .get(plural)?
            .iter()
            .filter_map(|i| self.resources.get(*i))
            .find(|r| r.config.group == group && r.config.version == version)
    }
}

/// The HTTP server.
pub struct Server {
    state: Arc<State>,
}

impl Server {
    /// Reads the security files the config names (TLS certificates, client
    /// CA, token file, RBAC policy) and starts one [`Cacher`] per configured
    /// resource. Must be called inside a tokio runtime.
    pub fn new(config: Config, storage: Storage) -> Result<Server, ApiError> {
        let security = Security::from_config(&config.server)?;
        Ok(Server::with_security(config, storage, security))
    }

    /// [`Server::new`] with the security files already read (the daemon
    /// reads them before it connects anywhere, so a bad one stops start-up
    /// at once).
    pub fn with_security(config: Config, storage: Storage, security: Security) -> Server {
        let opts = CacherOptions::from_config(&config.server, config.etcd.list_page_size);
        let max_watches = config.server.max_watches.min(Semaphore::MAX_PERMITS);
        let list_body_budget = ListBodyBudget::new(config.server.list_body_cache_bytes);
        let resources = config
            .resources
            .iter()
            .map(|r| Resource {
                config: r.clone(),
                list_bodies: ListBodyCache::new(&r.plural, Arc::clone(&list_body_budget)),
                cacher: Cacher::start(
                    r.clone(),
                    &config.etcd.prefix,
                    storage.clone(),
                    opts.clone(),
                ),
            })
            .collect::<Vec<Resource>>();
        let mut by_plural = foldhash::HashMap::<String, SmallVec<[usize; 2]>>::default();
        for (i, r) in resources.iter().enumerate() {
            by_plural
                .entry(r.config.plural.clone())
                .or_default()
                .push(i);
        }
        let server = Server {
            state: Arc::new(State {
                config,
                storage,
                resources,
                by_plural,
                watch_slots: Arc::new(Semaphore::new(max_watches)),
                shutdown: CancellationToken::new(),
                etcd_reachable: AtomicBool::new(false),
                security,
                watch_streams: Arc::default(),
            }),
        };
        tokio::spawn(probe_etcd(Arc::clone(&server.state)));
        tokio::spawn(sweep_list_bodies(Arc::clone(&server.state)));
        tokio::spawn(watch_stream::sweep(
            Arc::clone(&server.state.watch_streams),
            server.state.shutdown.clone(),
        ));
        server
    }

    /// The shared state (config, storage, cachers).
    pub fn state(&self) -> &Arc<State> {
        &self.state
    }

    /// The cachers, one per configured resource, in config order.
    pub fn cachers(&self) -> Vec<Arc<Cacher>> {
        self.state
            .resources
            .iter()
            .map(|r| Arc::clone(&r.cacher))
            .collect()
    }

    /// Serves connections from `listener` until `shutdown` resolves.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ApiError> {
        let state = self.state;

        let limits = connection::ConnectionLimits::from_config(&state.config.server);
        let conn_slots = Arc::new(Semaphore::new(
            state
                .config
                .server
                .max_connections
                .min(Semaphore::MAX_PERMITS),
        ));
        let (close_tx, close_rx) = tokio::sync::watch::channel(false);
        let mut conns = JoinSet::new();
        let mut shutdown = std::pin::pin!(shutdown);
        let tls = state.security.tls.clone();
        if let Ok(addr) = listener.local_addr() {
            match &tls {
                Some(_) => info!(%addr, "serving the REST API over TLS"),
                None if addr.ip().is_loopback() => info!(%addr, "serving the REST API"),
                None => warn!(
                    %addr,
                    "serving the REST API over plain HTTP on a non-loopback address: anyone who can reach it can read and write through it; set --tls-cert-file and --tls-private-key-file"
                ),
            }
        }
        if let Some(t) = &tls {
            tokio::spawn(crate::server_tls::watch_files(
                Arc::clone(&t.cert),
                state.shutdown.clone(),
            ));
        }
        let acceptor = tls
            .as_ref()
            .map(|t| tokio_rustls::TlsAcceptor::from(Arc::clone(&t.config)));
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(x) => x,
                        Err(e) => {
                            // EMFILE and friends: back off instead of spinning.
                            warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let Ok(permit) = Arc::clone(&conn_slots).try_acquire_owned() else {
                        // At the cap: close at once, so the connections
                        // already open (and /readyz) keep working.
                        crate::metrics::metrics().api_connections_refused.inc();
                        debug!(%peer, "connection refused: server.max_connections open");
                        drop(stream);
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&TCP_KEEPALIVE);
                    conns.spawn(connection::serve(
                        stream,
                        peer,
                        Arc::clone(&state),
                        limits,
                        acceptor.clone(),
                        close_rx.clone(),
                        permit,
                    ));
                }
            }
        }

        info!("shutting down: no new connections; ending watches");
        drop(listener);
        state.shutdown.cancel();
        for r in &state.resources {
            r.cacher.shutdown();
        }
        let _ = close_tx.send(true);
        let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
            while conns.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            warn!(
                open = conns.len(),
                "connections still open after the drain timeout; closing them"
            );
            conns.abort_all();
        }
        Ok(())
    }
}

/// TCP keep-alive of accepted connections: Go's net/http defaults (15 s
/// idle, then probes every 15 s; the kernel gives up after 9).
const TCP_KEEPALIVE: socket2::TcpKeepalive = socket2::TcpKeepalive::new()
    .with_time(Duration::from_secs(15))
    .with_interval(Duration::from_secs(15));

/// How often `/readyz`'s etcd check is refreshed. Probing in the background
/// keeps readiness probes cheap and off etcd's hot path.
const ETCD_PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// Keeps `State::etcd_reachable` current until shutdown: a cheap range
/// (current revision) with a short deadline.
async fn probe_etcd(state: Arc<State>) {
    loop {
        let ok = tokio::time::timeout(Duration::from_secs(2), state.storage.current_revision())
            .await
            .is_ok_and(|r| r.is_ok());
        if state.etcd_reachable.swap(ok, Ordering::Relaxed) != ok {
            if ok {
                info!("etcd reachable");
                check_etcd_version(&state.storage).await;
            } else {
                warn!("etcd unreachable");
            }
        }
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = tokio::time::sleep(ETCD_PROBE_INTERVAL) => {}
        }
    }
}

/// Warns when etcd is older than the versions this daemon needs (DESIGN.md
/// section 8): before 3.5.13 a progress answer can overtake events, and
/// the reflector then relists each time it notices.
async fn check_etcd_version(storage: &Storage) {
    let Ok(Ok(version)) =
        tokio::time::timeout(Duration::from_secs(2), storage.etcd_version()).await
    else {
        return;
    };
    match crate::storage::progress_requests_are_safe(&version) {
        Some(true) => debug!(%version, "etcd version"),
        Some(false) => warn!(
            %version,
            "etcd is older than 3.5.13 (3.4.31 on 3.4): its watch progress answers can overtake events (etcd#17507); the caches relist when that happens. Upgrade etcd"
        ),
        None => warn!(%version, "etcd's version cannot be read"),
    }
}

/// How often kept List bodies of objects that have changed since are
/// dropped (a List drops them too).
const LIST_BODY_SWEEP_INTERVAL: Duration = Duration::from_secs(5);

async fn sweep_list_bodies(state: Arc<State>) {
    loop {
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = tokio::time::sleep(LIST_BODY_SWEEP_INTERVAL) => {}
        }
        for r in &state.resources {
            r.list_bodies
                .drop_older_than(r.cacher.watch_cache().current().contents());
        }
    }
}

/// Resolves the request's [`RequestInfo`] once, authenticates and
/// authorizes it ([`secure`]), routes by it, logs the request and records
/// the HTTP metrics under its verb.
async fn handle(
    state: Arc<State>,
    conn: ConnectionHandle,
    req: Request<Incoming>,
) -> Response<Body> {
    let start = Instant::now();
    let method = req.method().clone();
    let query = Query::parse(req.uri().query());
    let info = RequestInfo::new(&method, req.uri().path(), &query);
    let verb = match &info {
        Ok(info) => info.metric_verb(),
        Err(e) => e.metric_verb(),
    };
    // The span records the path when it is created (when debug logging is
    // on): no copy of it is kept for the log line.
    let span = tracing::debug_span!("request", %method, path = %req.uri().path(), verb);
    let gzip = state.config.server.response_compression && compression::accepts_gzip(req.headers());
    let resp = match &info {
        Ok(info) => match secure::admit(&state, &req, conn.identity(), info) {
            Ok(admitted) => {
                // Each level below is boxed: an async fn holds its callee's
                // future and the arguments it moved there, so unboxed the
                // request future was 17 KB (measured with `size_of_val`),
                // allocated and moved for every request; now 1.7 KB.
                let user = admitted.user.as_ref();
                // A Get the cache answers at once needs none of the routed
                // futures below (nor their boxes).
                let resp = match span.in_scope(|| k8s::get_now(&state, &req, info, &query)) {
                    Some(Ok(resp)) => resp,
                    Some(Err(status)) => status_response(&status),
                    None => {
                        Box::pin(
                            route(state, req, info, query, user, &conn).instrument(span.clone()),
                        )
                        .await
                    }
                };
                secure::finish(&admitted, resp.status().as_u16());
                resp
            }
            Err(denied) => status_response(&unread_body(&req, denied)),
        },
        Err(e) => status_response(&unread_body(&req, errors::request_info_status(e))),
    };
    let resp = if gzip && compression::candidate(&resp) {
        // Boxed, see above: only a response that may be gzipped pays for it.
        Box::pin(compression::compress(resp).instrument(span.clone())).await
    } else {
        resp
    };
    let elapsed = start.elapsed();
    let code = resp.status().as_u16();
    crate::metrics::observe_http_request(verb, resp.status(), elapsed);
    let _enter = span.enter();
    debug!(
        %method,
        path = info.as_ref().map(|i| i.path()).unwrap_or_default(),
        verb,
        code,
        duration_ms = elapsed.as_secs_f64() * 1000.0,
        "request"
    );
    resp
}

/// `status` for a request refused before its body was read: on HTTP/1.x,
/// with `Connection: close` when a body may still be on its way (see
/// [`ApiStatus::close_connection`]).
fn unread_body(req: &Request<Incoming>, status: ApiStatus) -> ApiStatus {
    use hyper::body::Body as _;
    if req.version() < hyper::Version::HTTP_2 && !req.body().is_end_stream() {
        status.with_close_connection()
    } else {
        status
    }
}

async fn route(
    state: Arc<State>,
    req: Request<Incoming>,
    info: &RequestInfo,
    query: Query,
    user: Option<&Arc<UserInfo>>,
    conn: &ConnectionHandle,
) -> Response<Body> {
    match info.path() {
        "/healthz" | "/livez" | "/readyz" | "/metrics" => ops::handle(&state, &req, &query),
        reviews::SSAR_PATH | reviews::SSR_PATH | reviews::SSRR_PATH => {
            match Box::pin(reviews::handle(&state, req, user)).await {
                Some(Ok(resp)) => resp,
                Some(Err(status)) => status_response(&status),
                None => status_response(&ApiStatus::not_found("not found")),
            }
        }
        // Boxed, see `handle`.
        _ => Box::pin(k8s::handle(state, req, info, query, conn)).await,
    }
}

// ---------------------------------------------------------------------------
// Response helpers

pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Body::full(bytes)
}

/// A response with `body` and the given content type.
pub(crate) fn response(code: u16, content_type: &'static str, body: Body) -> Response<Body> {
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// A JSON response.
pub(crate) fn json_response(code: u16, body: impl Into<Bytes>) -> Response<Body> {
    response(code, "application/json", full(body))
}

/// A `Status` error response (with `Retry-After` when set).
pub(crate) fn status_response(status: &ApiStatus) -> Response<Body> {
    let mut resp = json_response(status.code, status.to_bytes());
    if let Some(secs) = status.retry_after
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        resp.headers_mut().insert(RETRY_AFTER, v);
    }
    if status.close_connection {
        resp.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

//! The etcd v3 gRPC front (`--grpc-listen`): etcd's own API (the
//! `etcdserverpb` services, served by tonic) for any etcd client, with Range
//! and Watch answered from a raw cache of every configured resource's key
//! prefix (and of each `grpc_cache_prefixes` entry) and everything else
//! passed to etcd unchanged.
//!
//! - [`kv_cache`]: `KvCache`, the raw cache of one prefix (etcd's own
//!   KeyValues, snapshots per revision, a ring of events with prev_kv), fed
//!   by one etcd watch per prefix however many clients watch it.
//! - [`kv`]: KV (Range from the cache when inside one cached prefix).
//! - [`watch`]: Watch (cursor-based fan-out from the ring).
//! - [`passthrough`]: Lease, Maintenance, Cluster, unchanged.
//! - [`auth`]: etcd's Auth service relayed, and etcd's own authorization
//!   of every cached read when etcd has auth enabled.
//! - [`upstream`]: the raw gRPC client of etcd (the store's channel and TLS).

pub mod auth;
pub mod kv;
pub mod kv_cache;
pub mod passthrough;
pub mod upstream;
pub mod watch;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use etcd_client::proto::{PbClusterServer, PbKvServer, PbLeaseServer, PbMaintenanceServer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::coalesced_stream::ServerStream;
use crate::config::Config;
use crate::storage::{MAX_DECODING_MESSAGE_BYTES, Storage};
use auth::AuthGate;
use kv_cache::{HeaderSource, KvCache};
use upstream::Upstream;

/// How long [`GrpcServer::serve`] waits for streams to end after shutdown.
const DRAIN_TIMEOUT: Duration = Duration::from_millis(4_000);

/// Errors of the gRPC server itself (request errors are gRPC statuses).
#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// State shared by the front's services.
pub struct Front {
    caches: Vec<Arc<KvCache>>,
    pub(crate) upstream: Upstream,
    /// etcd's auth status and its verdicts on cached reads.
    pub(crate) auth: Arc<AuthGate>,
    pub(crate) storage: Storage,
    pub(crate) headers: Arc<HeaderSource>,
    /// Bumped by every cache change; watch streams wait on it.
    pub(crate) changes: Arc<tokio::sync::watch::Sender<u64>>,
    pub(crate) consistent_read_timeout: Duration,
    /// Idle `progress_notify` watches get a progress notification this often.
    pub(crate) progress_notify_interval: Duration,
    pub(crate) shutdown: CancellationToken,
    /// `server.coalesce_writes`.
    pub(crate) coalesce_writes: bool,
    /// Open client watches served from the caches / by etcd.
    pub(crate) watchers_cached: AtomicI64,
    pub(crate) watchers_forwarded: AtomicI64,
    /// Client watch creations passed on to etcd, ever.
    pub(crate) creations_forwarded: AtomicI64,
    /// Whether etcd answers a `keys_only` Range from its index, without
    /// leases (3.7's `FastKeysOnly`): read from etcd's version once.
    pub(crate) keys_only_from_index: Arc<tokio::sync::OnceCell<bool>>,
    /// The highest revision of an etcd answer the front passed on
    /// ([`Front::note_seen`]).
    pub(crate) seen: AtomicI64,
}

impl std::fmt::Debug for Front {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Front")
            .field("caches", &self.caches)
            .finish_non_exhaustive()
    }
}

/// Asks etcd its version (Maintenance `Status`) until it answers, backing
/// off, and records whether it answers `keys_only` Ranges from its index
/// (3.7 and later: no leases).
async fn learn_etcd_version(
    storage: Storage,
    known: Arc<tokio::sync::OnceCell<bool>>,
    shutdown: CancellationToken,
) {
    let mut backoff =
        crate::backoff::Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        if let Ok(v) = storage.etcd_version().await {
            let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
            let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
            let _ = known.set((major, minor) >= (3, 7));
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff.step()) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

impl Front {
    /// Whether etcd (3.7 and later) leaves the lease out of a `keys_only`
    /// Range not sorted by value; `None` until etcd's version is known
    /// ([`learn_etcd_version`]), when such a Range goes to etcd itself
    /// rather than wait for it.
    pub(crate) fn keys_only_from_index(&self) -> Option<bool> {
        self.keys_only_from_index.get().copied()
    }

    /// The cache whose prefix holds all of `[key, range_end)`.
    pub(crate) fn cache_for(&self, key: &[u8], range_end: &[u8]) -> Option<&Arc<KvCache>> {
        self.caches
            .iter()
            .find(|c| c.contains_range(key, range_end))
    }

    /// etcd's answer at `revision` went to a client through the front (a
    /// write, a Txn that wrote nothing, a Range etcd answered, the header of
    /// a past-revision read): a serializable read from any cache waits for
    /// it, so no client reads a revision older than one it was shown, as
    /// from etcd's one member.
    pub(crate) fn note_seen(&self, revision: i64) {
        self.seen.fetch_max(revision, Ordering::AcqRel);
    }

    /// The highest revision the front has shown a client ([`Front::note_seen`]).
    pub(crate) fn seen(&self) -> i64 {
        self.seen.load(Ordering::Acquire)
    }

    /// The highest revision any cache is at.
    pub(crate) fn revision(&self) -> i64 {
        self.caches.iter().map(|c| c.revision()).max().unwrap_or(0)
    }

    /// Open client watches: (served from the caches, served by etcd).
    pub fn watchers(&self) -> (i64, i64) {
        (
            self.watchers_cached.load(Ordering::Relaxed),
            self.watchers_forwarded.load(Ordering::Relaxed),
        )
    }

    /// Client watch creations the front passed on to etcd since it started
    /// (the rest it answered itself).
    pub fn creations_forwarded(&self) -> i64 {
        self.creations_forwarded.load(Ordering::Relaxed)
    }

    /// etcd's auth status as the front sees it.
    pub fn auth(&self) -> &Arc<AuthGate> {
        &self.auth
    }

    /// The raw caches, one per configured resource prefix.
    pub fn caches(&self) -> &[Arc<KvCache>] {
        &self.caches
    }

    /// Waits until every cache has listed (at most `timeout`).
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while !self.caches.iter().all(|c| c.is_ready()) {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }
}

/// Accepted connections, with nodelay and (`server.coalesce_writes`) their
/// writes coalesced as the REST API's: one system call per batch of
/// responses, not per HTTP/2 frame. The REST API's connection limits apply
/// (tonic sets none): at most `max_connections` open (others are closed at
/// once), each must send its first bytes within `first_request_timeout`,
/// and an accept error (out of file descriptors) is retried after a pause,
/// not at once in a loop that would take a core.
fn incoming(
    listener: TcpListener,
    coalesce: bool,
    max_connections: usize,
    first_request_timeout: Duration,
    shutdown: CancellationToken,
) -> impl tokio_stream::Stream<Item = std::io::Result<GrpcConn>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<GrpcConn>>(64);
    let slots = Arc::new(tokio::sync::Semaphore::new(
        max_connections.min(tokio::sync::Semaphore::MAX_PERMITS),
    ));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tx.closed() => return,
                a = listener.accept() => a,
            };
            let (stream, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    warn!(error = %e, "gRPC accept failed");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            };
            let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
                debug!(%peer, "gRPC connection refused: server.max_connections open");
                continue;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut first = [0u8; 1];
                match tokio::time::timeout(first_request_timeout, stream.peek(&mut first)).await {
                    Ok(Ok(1)) => {}
                    _ => {
                        debug!(%peer, "gRPC connection closed: nothing sent in time");
                        return;
                    }
                }
                let _ = stream.set_nodelay(true);
                let conn = GrpcConn {
                    stream: ServerStream::new(stream, coalesce),
                    _permit: permit,
                };
                let _ = tx.send(Ok(conn)).await;
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// How long the accept loop pauses after an error.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// A gRPC connection, holding its place among `server.max_connections`.
pub struct GrpcConn {
    stream: ServerStream,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl tokio::io::AsyncRead for GrpcConn {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for GrpcConn {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for GrpcConn {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl tonic::transport::server::Connected for ServerStream {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

/// The gRPC server: one raw cache per resource prefix and the services.
pub struct GrpcServer {
    front: Arc<Front>,
    /// `grpc_max_request_bytes`: the KV service's largest request.
    max_request_bytes: usize,
    /// `server.max_connections` and `server.header_read_timeout_ms`,
    /// applied to the front's connections as to the REST API's.
    max_connections: usize,
    first_request_timeout: Duration,
}

/// The ring of a prefix of `grpc_cache_prefixes` (events).
pub const EXTRA_PREFIX_HISTORY: usize = 1000;

/// HTTP/2 streams per gRPC connection.
const GRPC_MAX_CONCURRENT_STREAMS: u32 = 10_000;

impl GrpcServer {
    /// Starts the raw caches (one etcd watch per resource prefix). Must be
    /// called inside a tokio runtime.
    pub fn new(config: &Config, storage: Storage) -> GrpcServer {
        let changes = Arc::new(tokio::sync::watch::Sender::new(0u64));
        let headers = Arc::new(HeaderSource::default());
        let shutdown = CancellationToken::new();
        let mut prefixes: Vec<(String, usize)> = Vec::new();
        let extra = config
            .grpc_cache_prefixes
            .iter()
            .map(|p| (p.clone(), EXTRA_PREFIX_HISTORY));
        let resources = config.resources.iter().map(|r| {
            (
                r.key_prefix(&config.etcd.prefix),
                r.history_capacity.unwrap_or(10_000),
            )
        });
        for (p, cap) in resources.chain(extra) {
            if !prefixes.iter().any(|(q, _)| *q == p) {
                prefixes.push((p, cap));
            }
        }
        let caches: Vec<Arc<KvCache>> = prefixes
            .iter()
            .map(|(p, cap)| {
                Arc::new(KvCache::new(
                    p,
                    *cap,
                    Arc::clone(&changes),
                    Arc::clone(&headers),
                ))
            })
            .collect();
        for c in &caches {
            tokio::spawn(Arc::clone(c).run(
                storage.clone(),
                config.etcd.list_page_size,
                shutdown.clone(),
            ));
        }
        let upstream = Upstream::new(storage.channel());
        let keys_only_from_index = Arc::new(tokio::sync::OnceCell::new());
        tokio::spawn(learn_etcd_version(
            storage.clone(),
            Arc::clone(&keys_only_from_index),
            shutdown.clone(),
        ));
        let auth = Arc::new(AuthGate::new(upstream.clone()));
        {
            let auth = Arc::clone(&auth);
            let shutdown = shutdown.clone();
            tokio::spawn(async move { auth.run(shutdown).await });
        }
        GrpcServer {
            front: Arc::new(Front {
                caches,
                upstream,
                auth,
                storage,
                headers,
                changes,
                consistent_read_timeout: Duration::from_millis(
                    config.server.consistent_read_timeout_ms,
                ),
                progress_notify_interval: Duration::from_millis(
                    config.server.watch_progress_notify_interval_ms.max(1),
                ),
                shutdown,
                coalesce_writes: config.server.coalesce_writes,
                watchers_cached: AtomicI64::new(0),
                watchers_forwarded: AtomicI64::new(0),
                creations_forwarded: AtomicI64::new(0),
                seen: AtomicI64::new(0),
                keys_only_from_index,
            }),
            max_request_bytes: config.grpc_max_request_bytes,
            max_connections: config.server.max_connections,
            first_request_timeout: Duration::from_millis(config.server.header_read_timeout_ms),
        }
    }

    pub fn front(&self) -> &Arc<Front> {
        &self.front
    }

    /// Serves etcd's v3 API on `listener` until `shutdown` resolves; then
    /// ends every watch stream and stops the caches.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), GrpcError> {
        if let Ok(addr) = listener.local_addr() {
            info!(%addr, "serving the etcd v3 gRPC API");
        }
        let front = self.front;
        let max = MAX_DECODING_MESSAGE_BYTES;
        let kv = PbKvServer::new(kv::KvService {
            front: Arc::clone(&front),
        })
        .max_decoding_message_size(self.max_request_bytes)
        .max_encoding_message_size(max);
        let watch = watch::WatchServer::new(
            watch::WatchService {
                front: Arc::clone(&front),
            },
            max,
        );
        let lease = PbLeaseServer::new(passthrough::LeaseService {
            upstream: front.upstream.clone(),
            front: Arc::clone(&front),
        });
        let maintenance = PbMaintenanceServer::new(passthrough::MaintenanceService {
            upstream: front.upstream.clone(),
        })
        .max_encoding_message_size(max);
        let cluster = PbClusterServer::new(passthrough::ClusterService {
            upstream: front.upstream.clone(),
        });
        let auth = auth::AuthService {
            upstream: front.upstream.clone(),
            gate: Arc::clone(&front.auth),
        };
        let token = front.shutdown.clone();
        let stop = async move {
            shutdown.await;
            // Watch streams end first, so the server's graceful drain
            // does not wait for them.
            token.cancel();
        };
        let served = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(20)))
            // tonic turns off h2's bound on streams a client makes the
            // server reset (hyper's default: 1024, the defence against
            // "MadeYouReset", CVE-2025-8671): put it back, and bound the
            // streams of one connection (clientv3 multiplexes every watch
            // of a client on one stream).
            .http2_max_local_error_reset_streams(Some(1024))
            .max_concurrent_streams(Some(GRPC_MAX_CONCURRENT_STREAMS))
            .add_service(kv)
            .add_service(watch)
            .add_service(lease)
            .add_service(maintenance)
            .add_service(cluster)
            .add_service(auth)
            .serve_with_incoming_shutdown(
                incoming(
                    listener,
                    front.coalesce_writes,
                    self.max_connections,
                    self.first_request_timeout,
                    front.shutdown.clone(),
                ),
                stop,
            );
        // Streams that are not the front's own (a lease keep-alive passed
        // to etcd) may outlive the shutdown: bounded, as the REST server.
        let drain_expired = async {
            front.shutdown.cancelled().await;
            tokio::time::sleep(DRAIN_TIMEOUT).await;
        };
        let result = tokio::select! {
            r = served => r,
            _ = drain_expired => {
                warn!("gRPC streams still open after the drain timeout; closing them");
                Ok(())
            }
        };
        front.shutdown.cancel();
        result?;
        info!("gRPC front stopped");
        Ok(())
    }
}

/// Counts a Range by where it was answered.
pub(crate) fn count_range(from_cache: bool) {
    crate::metrics::metrics()
        .grpc_requests
        .with_label_values(&["range", if from_cache { "cache" } else { "etcd" }])
        .inc();
}

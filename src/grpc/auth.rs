//! etcd's own authentication and authorization in front of the cache.
//!
//! - [`AuthService`]: etcd's Auth service (Authenticate, AuthStatus,
//!   AuthEnable/Disable, User*, Role*) relayed to etcd as it is, so
//!   `etcdctl --user` authenticates against the front and sends the token.
//! - [`AuthGate`]: whether etcd has auth enabled (its `AuthStatus`, asked
//!   without a token, so a refusal for auth also means "on";
//!   every [`AUTH_STATUS_INTERVAL`], at once after an auth change through
//!   the front or an auth error from etcd while believed off), and, when
//!   it has, etcd's own verdict on a caller reading a range before the
//!   cache answers: the same range asked of etcd with the caller's token
//!   (`count_only`, `limit = 1`, `serializable`: no raft round, no values).
//!   A caller etcd refuses is not served from the cache: its request goes
//!   to etcd, which answers it itself (same code, same message, or the
//!   same refused watch creation). With auth off, nothing is asked.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::codegen::{Body, BoxFuture, StdError, http};
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;
use tonic::{Request, Response, Status};
use tracing::{debug, info};

use etcd_client::proto::{PbRangeRequest, PbRangeResponse, PbResponseHeader};

use super::upstream::{RawCodec, Upstream, is_auth_error};

/// How often etcd's auth status is asked: the longest the front takes to
/// notice `auth enable` done on etcd directly (through the front: at once).
pub const AUTH_STATUS_INTERVAL: Duration = Duration::from_secs(2);
/// How long etcd's "yes" for one (token, range) is reused: a revoked
/// permission still reads from the cache for at most this long.
pub const PERMIT_TTL: Duration = Duration::from_secs(3);
/// Remembered permits at most (beyond, expired ones are dropped, then all).
const MAX_PERMITS: usize = 10_000;
/// Auth errors while believed off re-ask etcd at most this often.
const MIN_RECHECK: Duration = Duration::from_millis(100);

const UNKNOWN: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

/// The paths of etcd's Auth service (rpc.proto), relayed as they are.
const AUTH_METHODS: &[&str] = &[
    "/etcdserverpb.Auth/AuthEnable",
    "/etcdserverpb.Auth/AuthDisable",
    "/etcdserverpb.Auth/AuthStatus",
    "/etcdserverpb.Auth/Authenticate",
    "/etcdserverpb.Auth/UserAdd",
    "/etcdserverpb.Auth/UserGet",
    "/etcdserverpb.Auth/UserList",
    "/etcdserverpb.Auth/UserDelete",
    "/etcdserverpb.Auth/UserChangePassword",
    "/etcdserverpb.Auth/UserGrantRole",
    "/etcdserverpb.Auth/UserRevokeRole",
    "/etcdserverpb.Auth/RoleAdd",
    "/etcdserverpb.Auth/RoleGet",
    "/etcdserverpb.Auth/RoleList",
    "/etcdserverpb.Auth/RoleDelete",
    "/etcdserverpb.Auth/RoleGrantPermission",
    "/etcdserverpb.Auth/RoleRevokePermission",
];

/// etcd's `AuthStatusRequest` (which etcd-client does not export).
#[derive(Clone, PartialEq, prost::Message)]
struct AuthStatusRequest {}

/// etcd's `AuthStatusResponse`.
#[derive(Clone, PartialEq, prost::Message)]
struct AuthStatusResponse {
    #[prost(message, optional, tag = "1")]
    header: Option<PbResponseHeader>,
    #[prost(bool, tag = "2")]
    enabled: bool,
    #[prost(uint64, tag = "3")]
    auth_revision: u64,
}

/// (token, key, range_end) etcd allowed, and until when that is trusted.
type Permits = HashMap<(Option<Vec<u8>>, Vec<u8>, Vec<u8>), Instant>;

/// etcd's auth status and its verdicts on cached reads.
#[derive(Debug)]
pub struct AuthGate {
    upstream: Upstream,
    /// UNKNOWN (until etcd first answers: checked as if on), OFF or ON.
    state: AtomicU8,
    permits: Mutex<Permits>,
}

impl AuthGate {
    pub(crate) fn new(upstream: Upstream) -> AuthGate {
        AuthGate {
            upstream,
            state: AtomicU8::new(UNKNOWN),
            permits: Mutex::new(HashMap::new()),
        }
    }

    /// etcd's auth status as last learned (`None`: not known yet).
    pub fn status(&self) -> Option<bool> {
        match self.state.load(Ordering::Acquire) {
            ON => Some(true),
            OFF => Some(false),
            _ => None,
        }
    }

    /// Whether cached reads are checked with etcd (auth on, or not known yet).
    pub fn enabled(&self) -> bool {
        self.state.load(Ordering::Acquire) != OFF
    }

    /// Asks etcd's auth status until `shutdown`: every interval, and after
    /// an auth error from etcd while the front believes auth is off.
    pub(crate) async fn run(&self, shutdown: CancellationToken) {
        let errors = std::sync::Arc::clone(self.upstream.auth_errors());
        loop {
            self.refresh().await;
            let since = Instant::now();
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep_until(since + AUTH_STATUS_INTERVAL) => break,
                    _ = errors.notified() => {
                        if self.state.load(Ordering::Acquire) != ON {
                            tokio::time::sleep_until(since + MIN_RECHECK).await;
                            break;
                        }
                    }
                }
            }
        }
    }

    /// Asks etcd whether auth is enabled; keeps the last answer if etcd
    /// does not answer.
    pub(crate) async fn refresh(&self) {
        let r = self
            .upstream
            .unary::<_, AuthStatusResponse>(
                "/etcdserverpb.Auth/AuthStatus",
                Request::new(AuthStatusRequest {}),
            )
            .await;
        match r {
            Ok(resp) => self.set(resp.into_inner().enabled),
            // etcd asks for an admin (root) to answer `AuthStatus` when
            // auth is on, and refuses for auth only when it is on: the
            // refusal is the answer.
            Err(s) if is_auth_error(&s) => self.set(true),
            Err(s) => debug!(error = %s, "etcd auth status unknown; keeping the last one"),
        }
    }

    fn set(&self, enabled: bool) {
        let new = if enabled { ON } else { OFF };
        let old = self.state.swap(new, Ordering::AcqRel);
        if old != new {
            info!(enabled, "etcd auth status");
            self.permits.lock().clear();
        }
    }

    /// Whether etcd lets the caller (its `token` in `md`) read
    /// `[key, range_end)`; false sends the request to etcd, which answers
    /// it. True at once when auth is off.
    pub async fn permits(&self, md: &MetadataMap, key: &[u8], range_end: &[u8]) -> bool {
        if !self.enabled() {
            return true;
        }
        let token = md
            .get("token")
            .or_else(|| md.get("authorization"))
            .map(|v| v.as_bytes().to_vec());
        let id = (token, key.to_vec(), range_end.to_vec());
        let now = Instant::now();
        if self.permits.lock().get(&id).is_some_and(|t| *t > now) {
            return true;
        }
        let mut req = Request::new(PbRangeRequest {
            key: key.to_vec(),
            range_end: range_end.to_vec(),
            limit: 1,
            count_only: true,
            serializable: true,
            ..Default::default()
        });
        *req.metadata_mut() = md.clone();
        let r = self
            .upstream
            .unary::<_, PbRangeResponse>("/etcdserverpb.KV/Range", req)
            .await;
        match r {
            Ok(_) => {
                let mut p = self.permits.lock();
                if p.len() >= MAX_PERMITS {
                    p.retain(|_, t| *t > now);
                    if p.len() >= MAX_PERMITS {
                        p.clear();
                    }
                }
                p.insert(id, now + PERMIT_TTL);
                true
            }
            Err(s) => {
                debug!(code = ?s.code(), message = s.message(), "etcd refused a cached read; etcd answers it");
                false
            }
        }
    }
}

/// etcd's Auth service, relayed unchanged (messages undecoded; the
/// caller's token goes along).
#[derive(Debug, Clone)]
pub struct AuthService {
    pub(crate) upstream: Upstream,
    pub(crate) gate: std::sync::Arc<AuthGate>,
}

impl NamedService for AuthService {
    const NAME: &'static str = "etcdserverpb.Auth";
}

/// One relayed unary call.
struct Relay {
    upstream: Upstream,
    gate: std::sync::Arc<AuthGate>,
    path: &'static str,
}

impl tonic::server::UnaryService<Bytes> for Relay {
    type Response = Bytes;
    type Future = BoxFuture<Response<Bytes>, Status>;

    fn call(&mut self, req: Request<Bytes>) -> Self::Future {
        let upstream = self.upstream.clone();
        let gate = std::sync::Arc::clone(&self.gate);
        let path = self.path;
        Box::pin(async move {
            let r = upstream.unary_raw(path, req).await;
            if r.is_ok()
                && matches!(
                    path,
                    "/etcdserverpb.Auth/AuthEnable" | "/etcdserverpb.Auth/AuthDisable"
                )
            {
                gate.refresh().await;
            }
            r
        })
    }
}

impl<B> tower::Service<http::Request<B>> for AuthService
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let path = AUTH_METHODS
            .iter()
            .copied()
            .find(|p| *p == req.uri().path());
        let relay = path.map(|path| Relay {
            upstream: self.upstream.clone(),
            gate: std::sync::Arc::clone(&self.gate),
            path,
        });
        Box::pin(async move {
            match relay {
                Some(relay) => {
                    let mut grpc = tonic::server::Grpc::new(RawCodec)
                        .apply_max_message_size_config(
                            Some(crate::storage::MAX_DECODING_MESSAGE_BYTES),
                            Some(crate::storage::MAX_DECODING_MESSAGE_BYTES),
                        );
                    Ok(grpc.unary(relay, req).await)
                }
                None => Ok(Status::unimplemented("").into_http()),
            }
        })
    }
}

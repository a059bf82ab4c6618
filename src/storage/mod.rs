//! The etcd3 store (docs/DESIGN.md section 3), after the Kubernetes
//! `storage/etcd3` store: CAS create/update/delete as etcd transactions,
//! `GuaranteedUpdate`, preconditions, lease reuse for TTLs, a value
//! transformer hook and dry-run.
//!
//! Keys are absolute etcd keys (the object layer builds them). Every etcd call
//! runs under the configured request deadline, so an unreachable etcd turns
//! into [`StorageError::Unavailable`] / [`StorageError::Timeout`] instead of a
//! hang. Reads are retried with backoff within that deadline (they are
//! idempotent); writes are not (a lost answer may hide an applied write).

pub mod encryption;
mod error;
mod lease;
mod preconditions;
mod revision_batcher;
pub mod tls;
mod transformer;
mod watch;

pub use encryption::{EncryptionConfigError, EncryptionTransformer, TransformError};
pub use error::StorageError;
pub use lease::{DEFAULT_MAX_ATTACHED_OBJECTS, LeaseManager};
pub use preconditions::Preconditions;
pub use transformer::{IdentityTransformer, Transformer};
pub use watch::{RawWatch, RawWatchItem, Watch, WatchEvent, WatchItem};

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, KeyValue, KvClient,
    PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchClient, WatchOptions,
};
use tokio::time::Instant;
use tracing::{Instrument, debug, debug_span, warn};

use crate::backoff::Backoff;
use crate::config::EtcdConfig;

/// HTTP/2 keepalive: detect a dead etcd connection under a long watch. Idle
/// pings stay off because etcd answers pings without streams with GOAWAY.
/// Largest gRPC response we decode: a list page of big objects (etcd itself
/// caps a response only by its own `--max-recv-bytes`, default unlimited).
pub const MAX_DECODING_MESSAGE_BYTES: usize = 1 << 30;
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);
const TCP_KEEPALIVE: Duration = Duration::from_secs(30);
/// First and largest pause between retries of an idempotent read.
const READ_BACKOFF_START: Duration = Duration::from_millis(50);
const READ_BACKOFF_MAX: Duration = Duration::from_millis(500);

/// One key as stored in etcd, value already passed through
/// [`Transformer::from_storage`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredObject {
    pub key: String,
    pub value: Bytes,
    /// The key's last modification revision: the object's resourceVersion.
    /// 0 for the result of a dry-run create (nothing was written).
    pub mod_revision: i64,
    pub create_revision: i64,
    /// Number of writes since creation (etcd `version`).
    pub version: i64,
    /// Attached lease id, 0 if none.
    pub lease: i64,
}

impl StoredObject {
    fn from_kv(kv: KeyValue, transformer: &dyn Transformer) -> Result<Self, StorageError> {
        Self::read_kv(kv, transformer)
            .map(|(o, _)| o)
            .map_err(|u| u.error)
    }

    /// The object, and whether its stored bytes are stale
    /// ([`Transformer::from_storage_checked`]); a failure names the key.
    fn read_kv(kv: KeyValue, transformer: &dyn Transformer) -> Result<(Self, bool), Unreadable> {
        let create_revision = kv.create_revision();
        let mod_revision = kv.mod_revision();
        let version = kv.version();
        let lease = kv.lease();
        let (key, value) = kv.into_key_value();
        let key = utf8_key(key)?;
        let (value, stale) = match transformer.from_storage_checked(&key, Bytes::from(value)) {
            Ok(v) => v,
            Err(error) => return Err(Unreadable { key, error }),
        };
        let obj = StoredObject {
            key,
            value,
            mod_revision,
            create_revision,
            version,
            lease,
        };
        Ok((obj, stale))
    }
}

/// An etcd key as a string; a non-UTF-8 key is [`Unreadable`] (lossily named).
pub(crate) fn utf8_key(key: Vec<u8>) -> Result<String, Unreadable> {
    String::from_utf8(key).map_err(|e| {
        let key = String::from_utf8_lossy(e.as_bytes()).into_owned();
        Unreadable {
            error: StorageError::InvalidObject(format!("non-UTF-8 key {key:?}")),
            key,
        }
    })
}

/// A listed key whose key or value cannot be read: a non-UTF-8 key, or a
/// value the transformer rejects. A list skips it instead of failing, so one
/// bad key cannot keep a whole prefix (and the cache over it) unreadable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// The key (lossily decoded when it is not UTF-8).
    pub key: String,
    pub error: StorageError,
}

/// Options of a write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteOptions {
    /// Attach a (reused) lease so the key expires after at least this long.
    pub ttl_seconds: Option<u64>,
    /// Run every check, write nothing, return the would-be object.
    pub dry_run: bool,
}

impl WriteOptions {
    pub fn dry_run() -> Self {
        WriteOptions {
            dry_run: true,
            ..Default::default()
        }
    }

    pub fn with_ttl(ttl_seconds: u64) -> Self {
        WriteOptions {
            ttl_seconds: Some(ttl_seconds),
            ..Default::default()
        }
    }
}

/// Options of one list page.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListOptions {
    /// Revision to read at; 0 = latest. Pass the first page's
    /// [`ListPage::revision`] for later pages so all pages are one snapshot.
    pub revision: i64,
    /// Page size; 0 = everything.
    pub limit: i64,
    /// Where the page starts (inclusive); `None` = the prefix itself. Must lie
    /// within the prefix. Use the previous page's [`ListPage::next_start_key`].
    /// Bytes, not a string: etcd keys need not be UTF-8.
    pub start_key: Option<Vec<u8>>,
}

/// One page of a list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListPage {
    /// Items in key order.
    pub items: Vec<StoredObject>,
    /// The revision the page was read at (the header revision for a read at
    /// latest, else the requested revision).
    pub revision: i64,
    /// More keys follow this page.
    pub more: bool,
    /// How many keys follow this page (at `revision`).
    pub remaining: i64,
    /// Start key of the next page when `more`.
    pub next_start_key: Option<Vec<u8>>,
    /// Keys of this page that were skipped because they cannot be read.
    pub unreadable: Vec<Unreadable>,
}

/// What an update function decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdateAction {
    /// Store this new (plain) value.
    Update(Bytes),
    /// Leave the object as it is; no write happens, unless the stored bytes
    /// are stale (see [`Transformer::from_storage_checked`]): then the same
    /// value is rewritten under the current write key, as kube-apiserver does.
    Unchanged,
}

/// The etcd3 store. Cheap to clone; clones share the connection, the lease
/// manager and the counters.
#[derive(Clone)]
pub struct Storage {
    client: Client,
    /// KV client with a decode limit that fits a list page of large objects
    /// (tonic's default of 4 MiB does not: 10,000 objects of 1 KiB is 10 MiB).
    kv: KvClient,
    transformer: Arc<dyn Transformer>,
    request_timeout: Duration,
    max_update_retries: u32,
    leases: Arc<LeaseManager>,
    conflict_retries: Arc<AtomicU64>,
    revisions: Arc<revision_batcher::RevisionBatcher>,
    /// TLS material of `https://` endpoints (reloaded on change).
    tls: Option<Arc<tls::EtcdTls>>,
    /// A tonic channel to etcd (same endpoints, same TLS connector) for
    /// callers that speak etcd's protos themselves (the gRPC front).
    channel: tonic::transport::Channel,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage")
            .field("request_timeout", &self.request_timeout)
            .field("max_update_retries", &self.max_update_retries)
            .finish_non_exhaustive()
    }
}

/// The end of the key range `[prefix, end)` that holds every key starting with `prefix`.
pub fn prefix_range_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (or empty): the range runs to the end of the keyspace.
    vec![0]
}

/// A lazy, balanced tonic channel over plain-HTTP endpoints, with the
/// client's dial timeout and keepalives.
fn plain_channel(cfg: &EtcdConfig) -> Result<tonic::transport::Channel, etcd_client::Error> {
    let mut endpoints = Vec::with_capacity(cfg.endpoints.len());
    for ep in &cfg.endpoints {
        let e = tonic::transport::Endpoint::from_shared(ep.clone())
            .map_err(|e| etcd_client::Error::InvalidArgs(e.to_string()))?
            .connect_timeout(cfg.dial_timeout())
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(false)
            .tcp_keepalive(Some(TCP_KEEPALIVE));
        endpoints.push(e);
    }
    Ok(tonic::transport::Channel::balance_list(
        endpoints.into_iter(),
    ))
}

/// Records one etcd round trip in `watchcache_etcd_request_duration_seconds`
/// (`op` is one of a fixed set of names, so the label stays bounded).
pub(crate) fn observe(op: &str, started: Instant) {
    crate::metrics::metrics()
        .etcd_request_duration
        .with_label_values(&[op])
        .observe(started.elapsed().as_secs_f64());
}

fn header_revision(h: Option<&etcd_client::ResponseHeader>) -> Result<i64, StorageError> {
    h.map(|h| h.revision())
        .ok_or_else(|| StorageError::Internal("etcd response without header".into()))
}

/// The first kv of the `Get` in a txn's else branch, if the key exists.
fn txn_else_kv(resp: &TxnResponse) -> Option<KeyValue> {
    resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(mut g) => g.take_kvs().into_iter().next(),
        _ => None,
    })
}

/// The prev_kv of the put in a txn's then branch.
fn txn_put_prev(resp: &TxnResponse) -> Option<KeyValue> {
    resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Put(mut p) => p.take_prev_key(),
        _ => None,
    })
}

impl Storage {
    /// Builds the client. The connection itself is lazy (as etcd's clientv3
    /// without `WithBlock`): the daemon can start while etcd is still coming
    /// up, and each call then fails within its deadline until etcd answers.
    pub async fn connect(cfg: &EtcdConfig) -> Result<Storage, StorageError> {
        let tls = match &cfg.tls {
            Some(t) if cfg.endpoints.iter().any(|e| e.starts_with("https://")) => {
                Some(tls::EtcdTls::load(t).map_err(|e| StorageError::Internal(e.to_string()))?)
            }
            _ => None,
        };
        Self::connect_with_tls(cfg, tls).await
    }

    /// Like [`Storage::connect`] with TLS material already loaded (and
    /// checked) by the caller, e.g. the daemon's start-up.
    pub async fn connect_with_tls(
        cfg: &EtcdConfig,
        tls: Option<Arc<tls::EtcdTls>>,
    ) -> Result<Storage, StorageError> {
        let request_timeout = cfg.request_timeout();
        // Every endpoint's handshake-error series exists from the start (at
        // 0), so dashboards and alerts see "no errors" rather than "no data".
        for ep in &cfg.endpoints {
            crate::metrics::metrics()
                .etcd_tls_handshake_errors
                .with_label_values(&[ep.as_str()]);
        }
        // No client-wide request timeout (`with_timeout`): it would also cut
        // the Reflector's long-lived watch streams on this client. Unary calls
        // get their deadline from `call`/`read` instead.
        // Every request requires a leader (etcd's `hasleader` metadata;
        // kube-apiserver sets it on its watches): a member that has lost
        // its leader (cut off the rest of its cluster) ends the watches on
        // it and answers reads at once with "no leader", so they are opened
        // again, or retried, on another member. Without it such a member
        // keeps watches open with nothing new and holds linearizable reads
        // until their deadline.
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(cfg.dial_timeout())
            .with_keep_alive(KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT)
            .with_tcp_keepalive(TCP_KEEPALIVE)
            .with_require_leader(true);
        // etcd's own auth: the client authenticates and renews its token
        // when etcd expires it. Only this client carries the token; the raw
        // `channel` (the gRPC front's passthrough) never does, so a caller
        // of the front is never served as the daemon's user.
        if let (Some(user), Some(pw)) = (&cfg.username, &cfg.password) {
            opts = opts
                .with_user(user.clone(), pw.0.clone())
                .with_auto_token_refresh(true);
        }
        let connecting = async {
            let connected: Result<(Client, tonic::transport::Channel), etcd_client::Error> =
                match &tls {
                    // Our connector does TLS (see `tls`); tonic sees plain
                    // HTTP/2 over it, so the endpoint URI is http://.
                    Some(t) => {
                        let connector = tls::Connector::new(Arc::clone(t), &cfg.endpoints);
                        let first = cfg
                            .endpoints
                            .first()
                            .map(|e| e.replacen("https://", "http://", 1))
                            .unwrap_or_default();
                        let endpoint = tonic::transport::Endpoint::from_shared(first)
                            .map_err(|e| etcd_client::Error::InvalidArgs(e.to_string()))?
                            .connect_timeout(cfg.dial_timeout())
                            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
                            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
                            .keep_alive_while_idle(false);
                        let channel = endpoint.connect_with_connector_lazy(tower::service_fn(
                            move |_: hyper::Uri| connector.clone().connect(),
                        ));
                        let client = Client::from_channel(
                            etcd_client::Channel::Tonic(channel.clone()),
                            Some(opts),
                        )
                        .await?;
                        Ok((client, channel))
                    }
                    None => {
                        let client = Client::connect(&cfg.endpoints, Some(opts)).await?;
                        Ok((client, plain_channel(cfg)?))
                    }
                };
            connected
        };
        let client = match tokio::time::timeout(cfg.dial_timeout(), connecting).await {
            Err(_) => {
                return Err(StorageError::Timeout(format!(
                    "connecting to {:?} took longer than {:?}",
                    cfg.endpoints,
                    cfg.dial_timeout()
                )));
            }
            Ok(Err(e)) => return Err(StorageError::from_etcd("connect", 0, e)),
            Ok(Ok(c)) => c,
        };
        let (client, channel) = client;
        debug!(endpoints = ?cfg.endpoints, "etcd client ready");
        let leases = LeaseManager::new(
            client.clone(),
            Duration::from_secs(cfg.lease_reuse_seconds),
            request_timeout,
        );
        Ok(Storage {
            kv: client
                .kv_client()
                .max_decoding_message_size(MAX_DECODING_MESSAGE_BYTES),
            client,
            transformer: Arc::new(IdentityTransformer),
            request_timeout,
            max_update_retries: cfg.max_update_retries,
            leases: Arc::new(leases),
            conflict_retries: Arc::new(AtomicU64::new(0)),
            revisions: Arc::default(),
            tls,
            channel,
        })
    }

    /// A tonic channel to etcd over the same endpoints and TLS as the
    /// client: for speaking etcd's protos unchanged (the gRPC front's
    /// passthrough). Cheap to clone.
    pub fn channel(&self) -> tonic::transport::Channel {
        self.channel.clone()
    }

    /// One raw etcd range `[key, range_end)` (etcd's own semantics for
    /// `range_end`), at `revision` (0 = latest), at most `limit` keys (0 =
    /// all): values exactly as stored (no transformer), with `version`,
    /// `lease` and the header. A read: retried within the request deadline.
    pub async fn range_raw(
        &self,
        key: &[u8],
        range_end: &[u8],
        revision: i64,
        limit: i64,
    ) -> Result<etcd_client::proto::PbRangeResponse, StorageError> {
        let (key, end) = (key.to_vec(), range_end.to_vec());
        let resp = self
            .read("range_raw", revision, |mut c| {
                let (key, end) = (key.clone(), end.clone());
                async move {
                    let mut o = GetOptions::new().with_range(end).with_limit(limit);
                    if revision > 0 {
                        o = o.with_revision(revision);
                    }
                    c.get(key, Some(o)).await
                }
            })
            .instrument(debug_span!("storage.range_raw", revision, limit))
            .await?;
        Ok(resp.0)
    }

    /// The latest failed TLS handshake with etcd, if the latest one failed
    /// (shown by `/readyz`).
    pub fn tls_error(&self) -> Option<String> {
        self.tls.as_ref().and_then(|t| t.last_error())
    }

    pub fn with_transformer(mut self, t: Arc<dyn Transformer>) -> Storage {
        self.transformer = t;
        self
    }

    /// The underlying client, for the Reflector's watch.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// A watch client whose decode limit fits large watch responses (a
    /// burst of events, or a txn touching many keys, in one message).
    pub fn watch_client(&self) -> WatchClient {
        self.client
            .watch_client()
            .max_decoding_message_size(MAX_DECODING_MESSAGE_BYTES)
    }

    pub fn transformer(&self) -> &Arc<dyn Transformer> {
        &self.transformer
    }

    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    pub fn lease_manager(&self) -> &LeaseManager {
        &self.leases
    }

    /// How many times a GuaranteedUpdate or delete lost a CAS race and retried
    /// (shared by clones of this `Storage`).
    pub fn conflict_retries(&self) -> u64 {
        self.conflict_retries.load(Ordering::Relaxed)
    }

    // ---- call plumbing -------------------------------------------------

    /// One etcd call under the request deadline, not retried (writes).
    async fn call<T, Fut>(&self, op: &str, requested: i64, fut: Fut) -> Result<T, StorageError>
    where
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let started = Instant::now();
        let r = match tokio::time::timeout(self.request_timeout, fut).await {
            Err(_) => Err(StorageError::Timeout(format!(
                "{op}: etcd did not answer within {:?}",
                self.request_timeout
            ))),
            Ok(r) => r.map_err(|e| StorageError::from_etcd(op, requested, e)),
        };
        observe(op, started);
        debug!(
            op,
            elapsed_ms = started.elapsed().as_millis() as u64,
            ok = r.is_ok(),
            "etcd call"
        );
        r
    }

    /// An idempotent read: retried with backoff on transient errors, all
    /// attempts together within the request deadline.
    async fn read<T, F, Fut>(&self, op: &str, requested: i64, mut f: F) -> Result<T, StorageError>
    where
        F: FnMut(KvClient) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + self.request_timeout;
        let mut backoff = Backoff::new(READ_BACKOFF_START, READ_BACKOFF_MAX);
        loop {
            let started = Instant::now();
            let left = deadline.saturating_duration_since(started);
            let r = match tokio::time::timeout(left, f(self.kv.clone())).await {
                Err(_) => Err(StorageError::Timeout(format!(
                    "{op}: etcd did not answer within {:?}",
                    self.request_timeout
                ))),
                Ok(r) => r.map_err(|e| StorageError::from_etcd(op, requested, e)),
            };
            observe(op, started);
            match r {
                Err(StorageError::Unavailable(msg))
                    if Instant::now() + backoff.peek() < deadline =>
                {
                    debug!(op, error = %msg, "transient etcd error, retrying");
                    tokio::time::sleep(backoff.step()).await;
                }
                Err(StorageError::Compacted { requested, .. }) => {
                    let compacted = self.compacted_revision(requested).await;
                    return Err(StorageError::Compacted {
                        requested,
                        compacted,
                    });
                }
                other => return other,
            }
        }
    }

    /// etcd's compaction error does not carry the compaction revision; a
    /// watch from the compacted revision does, so ask one (best effort, 0 on
    /// failure).
    async fn compacted_revision(&self, requested: i64) -> i64 {
        let mut watch = self.watch_client();
        let probe = async move {
            let mut stream = watch
                .watch(
                    "\0",
                    Some(WatchOptions::new().with_start_revision(requested.max(1))),
                )
                .await?;
            while let Some(resp) = stream.message().await? {
                if resp.compact_revision() > 0 {
                    return Ok(resp.compact_revision());
                }
                if resp.canceled() || !resp.events().is_empty() {
                    break;
                }
            }
            Ok::<i64, etcd_client::Error>(0)
        };
        let wait = self.request_timeout.min(Duration::from_secs(1));
        match tokio::time::timeout(wait, probe).await {
            Ok(Ok(rev)) => rev,
            _ => 0,
        }
    }

    async fn lease_for(&self, opts: &WriteOptions) -> Result<i64, StorageError> {
        match opts.ttl_seconds {
            Some(ttl) if !opts.dry_run => self.leases.get_lease(ttl).await,
            _ => Ok(0),
        }
    }

    fn put_options(lease: i64) -> PutOptions {
        if lease != 0 {
            PutOptions::new().with_lease(lease)
        } else {
            PutOptions::new()
        }
    }

    /// Reads the key at the latest revision, and whether its stored bytes
    /// are stale; `None` if it does not exist.
    async fn read_current(&self, key: &str) -> Result<Option<(StoredObject, bool)>, StorageError> {
        let k = key.to_string();
        let mut resp = self
            .read("get", 0, |mut c| {
                let k = k.clone();
                async move { c.get(k, None).await }
            })
            .await?;
        match resp.take_kvs().into_iter().next() {
            Some(kv) => StoredObject::read_kv(kv, self.transformer.as_ref())
                .map(Some)
                .map_err(|u| u.error),
            None => Ok(None),
        }
    }

    async fn read_existing(&self, key: &str) -> Result<(StoredObject, bool), StorageError> {
        self.read_current(key)
            .await?
            .ok_or_else(|| StorageError::not_found(key))
    }

    // ---- reads ---------------------------------------------------------

    /// etcd's current revision, from the header of a cheap count-only range
    /// (a linearizable read, so the answer is at least every acknowledged write).
    pub async fn current_revision(&self) -> Result<i64, StorageError> {
        let resp = self
            .read("current_revision", 0, |mut c| async move {
                c.get("\0", Some(GetOptions::new().with_count_only())).await
            })
            .instrument(debug_span!("storage.current_revision"))
            .await?;
        header_revision(resp.header())
    }

    /// The version of the etcd member this client reaches (Maintenance
    /// `Status`), e.g. `3.5.16`.
    pub async fn etcd_version(&self) -> Result<String, StorageError> {
        let mut m = self.client.maintenance_client();
        let resp = self.call("status", 0, m.status()).await?;
        Ok(resp.version().to_string())
    }

    /// etcd's current revision, read by a request that started after this
    /// call began; concurrent callers (of every resource) share one read.
    /// This is what consistent reads from the cache wait for.
    pub async fn fresh_revision(&self) -> Result<i64, StorageError> {
        self.revisions
            .fresh(|| {
                let s = self.clone();
                move || {
                    let s = s.clone();
                    async move { s.current_revision().await }
                }
            })
            .await
    }

    /// One key at `revision` (0 = latest).
    pub async fn get(&self, key: &str, revision: i64) -> Result<StoredObject, StorageError> {
        let span = debug_span!("storage.get", key, revision);
        async {
            let k = key.to_string();
            let mut resp = self
                .read("get", revision, |mut c| {
                    let k = k.clone();
                    let opts = (revision > 0).then(|| GetOptions::new().with_revision(revision));
                    async move { c.get(k, opts).await }
                })
                .await?;
            match resp.take_kvs().into_iter().next() {
                Some(kv) => StoredObject::from_kv(kv, self.transformer.as_ref()),
                None => Err(StorageError::not_found(key)),
            }
        }
        .instrument(span)
        .await
    }

    /// One page of the keys under `prefix`, in key order, at one revision.
    pub async fn list(&self, prefix: &str, opts: &ListOptions) -> Result<ListPage, StorageError> {
        let span = debug_span!(
            "storage.list",
            prefix,
            revision = opts.revision,
            limit = opts.limit
        );
        async {
            let start = match &opts.start_key {
                Some(s) if !s.starts_with(prefix.as_bytes()) => {
                    return Err(StorageError::InvalidObject(format!(
                        "list start key {:?} is outside the prefix {prefix:?}",
                        String::from_utf8_lossy(s)
                    )));
                }
                Some(s) => s.clone(),
                None => prefix.as_bytes().to_vec(),
            };
            let end = prefix_range_end(prefix);
            let (revision, limit) = (opts.revision, opts.limit.max(0));
            let mut resp = self
                .read("list", revision, |mut c| {
                    let (start, end) = (start.clone(), end.clone());
                    async move {
                        let mut o = GetOptions::new().with_range(end).with_limit(limit);
                        if revision > 0 {
                            o = o.with_revision(revision);
                        }
                        c.get(start, Some(o)).await
                    }
                })
                .await?;
            // At a past revision the header still carries the current
            // revision; the page is "at" the one we asked for.
            let page_rev = if revision > 0 {
                revision
            } else {
                header_revision(resp.header())?
            };
            let more = resp.more();
            let count = resp.count();
            let kvs = resp.take_kvs();
            let remaining = (count - kvs.len() as i64).max(0);
            // The next page starts after the last key read, readable or not.
            let next_start_key = match kvs.last() {
                Some(kv) if more => {
                    let mut k = kv.key().to_vec();
                    k.push(0);
                    Some(k)
                }
                _ => None,
            };
            let mut items = Vec::with_capacity(kvs.len());
            let mut unreadable = Vec::new();
            for kv in kvs {
                match StoredObject::read_kv(kv, self.transformer.as_ref()) {
                    Ok((o, _)) => items.push(o),
                    Err(u) => {
                        debug!(key = %u.key, error = %u.error, "list: skipping an unreadable key");
                        unreadable.push(u);
                    }
                }
            }
            debug!(items = items.len(), page_rev, more, remaining, "listed");
            Ok(ListPage {
                items,
                revision: page_rev,
                more,
                remaining,
                next_start_key,
                unreadable,
            })
        }
        .instrument(span)
        .await
    }

    /// Every key under `prefix` from `opts.start_key` on, at one revision
    /// (`opts.revision`, 0 = latest), read in pages of `opts.limit`, as one
    /// page: the `items` and `unreadable` keys of every page, and the
    /// `revision` they are all at.
    pub async fn list_all(
        &self,
        prefix: &str,
        opts: &ListOptions,
    ) -> Result<ListPage, StorageError> {
        let mut opts = opts.clone();
        let mut all = ListPage::default();
        loop {
            let page = self.list(prefix, &opts).await?;
            opts.revision = page.revision;
            all.items.extend(page.items);
            all.unreadable.extend(page.unreadable);
            match page.next_start_key {
                Some(next) if page.more => opts.start_key = Some(next),
                _ => {
                    all.revision = opts.revision;
                    return Ok(all);
                }
            }
        }
    }

    /// Number of keys under `prefix` (latest revision).
    pub async fn count(&self, prefix: &str) -> Result<i64, StorageError> {
        let end = prefix_range_end(prefix);
        let p = prefix.to_string();
        let resp = self
            .read("count", 0, |mut c| {
                let (p, end) = (p.clone(), end.clone());
                async move {
                    c.get(p, Some(GetOptions::new().with_range(end).with_count_only()))
                        .await
                }
            })
            .instrument(debug_span!("storage.count", prefix))
            .await?;
        Ok(resp.count())
    }

    // ---- writes --------------------------------------------------------

    /// Creates `key`; fails with `AlreadyExists` (value untouched) if it exists.
    pub async fn create(
        &self,
        key: &str,
        value: Bytes,
        opts: &WriteOptions,
    ) -> Result<StoredObject, StorageError> {
        let span = debug_span!("storage.create", key, dry_run = opts.dry_run);
        async {
            let data = self.transformer.to_storage(key, value.clone())?;
            if opts.dry_run {
                if self.read_current(key).await?.is_some() {
                    return Err(StorageError::already_exists(key));
                }
                return Ok(StoredObject {
                    key: key.to_string(),
                    value,
                    mod_revision: 0,
                    create_revision: 0,
                    version: 0,
                    lease: 0,
                });
            }
            let lease = self.lease_for(opts).await?;
            let txn = Txn::new()
                .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key,
                    Vec::from(data),
                    Some(Self::put_options(lease)),
                )])
                .or_else([TxnOp::get(key, None)]);
            let mut kv = self.kv.clone();
            let resp = self.call("create", 0, kv.txn(txn)).await?;
            if !resp.succeeded() {
                debug!("create: key exists");
                return Err(StorageError::already_exists(key));
            }
            let rev = header_revision(resp.header())?;
            Ok(StoredObject {
                key: key.to_string(),
                value,
                mod_revision: rev,
                create_revision: rev,
                version: 1,
                lease,
            })
        }
        .instrument(span)
        .await
    }

    /// CAS put: succeeds only if the key's mod_revision is
    /// `expected_mod_revision`; `Conflict` otherwise, `NotFound` if the key is gone.
    pub async fn update(
        &self,
        key: &str,
        value: Bytes,
        expected_mod_revision: i64,
        opts: &WriteOptions,
    ) -> Result<StoredObject, StorageError> {
        let span = debug_span!(
            "storage.update",
            key,
            expected_mod_revision,
            dry_run = opts.dry_run
        );
        async {
            let data = self.transformer.to_storage(key, value.clone())?;
            if opts.dry_run {
                let (cur, _) = self.read_existing(key).await?;
                if cur.mod_revision != expected_mod_revision {
                    return Err(StorageError::modified(key));
                }
                return Ok(StoredObject { value, ..cur });
            }
            let lease = self.lease_for(opts).await?;
            let txn = Txn::new()
                .when([
                    // Guards against expected 0 recreating a missing key.
                    Compare::create_revision(key, CompareOp::Greater, 0),
                    Compare::mod_revision(key, CompareOp::Equal, expected_mod_revision),
                ])
                .and_then([TxnOp::put(
                    key,
                    Vec::from(data),
                    Some(Self::put_options(lease).with_prev_key()),
                )])
                .or_else([TxnOp::get(key, None)]);
            let mut kv = self.kv.clone();
            let resp = self.call("update", 0, kv.txn(txn)).await?;
            if !resp.succeeded() {
                return match txn_else_kv(&resp) {
                    None => Err(StorageError::not_found(key)),
                    Some(kv) => {
                        debug!(current = kv.mod_revision(), "update: CAS lost");
                        Err(StorageError::modified(key))
                    }
                };
            }
            let rev = header_revision(resp.header())?;
            let (create_revision, version) = match txn_put_prev(&resp) {
                Some(prev) => (prev.create_revision(), prev.version() + 1),
                None => (0, 0),
            };
            Ok(StoredObject {
                key: key.to_string(),
                value,
                mod_revision: rev,
                create_revision,
                version,
                lease,
            })
        }
        .instrument(span)
        .await
    }

    /// Read-modify-write with CAS retries, as Kubernetes `GuaranteedUpdate`.
    ///
    /// Starts from `suggestion` (e.g. the cached object) when given, saving a
    /// read; since it may be stale, a precondition failure, an update error or
    /// a no-op decided on it is re-checked against a fresh read before it is
    /// believed. On a lost CAS the txn's else-branch read is the fresh state,
    /// so a retry costs one round trip. Retries are bounded by
    /// `max_update_retries`, then `Conflict`. A no-op on a value the
    /// transformer reports stale (read with a key that is no longer the write
    /// key) is written anyway, re-encrypting it, as kube-apiserver does.
    ///
    /// The update fn's error type `E` is the caller's own (the REST API
    /// returns its `Status` answers through it untouched); the store's errors
    /// become an `E` by `From<StorageError>`.
    pub async fn guaranteed_update<F, E>(
        &self,
        key: &str,
        preconditions: &Preconditions,
        suggestion: Option<StoredObject>,
        opts: &WriteOptions,
        mut update: F,
    ) -> Result<StoredObject, E>
    where
        F: FnMut(&StoredObject) -> Result<UpdateAction, E> + Send,
        E: From<StorageError> + Send,
    {
        let span = debug_span!("storage.guaranteed_update", key, dry_run = opts.dry_run);
        async {
            // `stale`: the stored bytes are not what a write would store now
            // (read with a key that is no longer the write key); unknown,
            // so false, for a suggestion, which is re-read before a no-op.
            let (mut state, mut is_current, mut stale) = match suggestion {
                Some(s) if s.key == key => (s, false, false),
                _ => {
                    let (s, stale) = self.read_existing(key).await?;
                    (s, true, stale)
                }
            };
            let mut lease: Option<i64> = None;
            let mut conflicts: u32 = 0;
            loop {
                if let Err(e) = preconditions.check(key, &state) {
                    if is_current {
                        return Err(e.into());
                    }
                    debug!("precondition failed on suggestion, re-reading");
                    (state, stale) = self.read_existing(key).await?;
                    is_current = true;
                    continue;
                }
                let action = match update(&state) {
                    Ok(a) => a,
                    Err(e) => {
                        if is_current {
                            return Err(e);
                        }
                        let cached_rev = state.mod_revision;
                        (state, stale) = self.read_existing(key).await?;
                        is_current = true;
                        if state.mod_revision == cached_rev {
                            return Err(e);
                        }
                        continue;
                    }
                };
                let new_value = match action {
                    UpdateAction::Update(v) if v != state.value => Some(v),
                    // kube-apiserver's GuaranteedUpdate writes a no-op on a
                    // stale value anyway: that moves it to the current key.
                    _ if is_current && stale => {
                        debug!("no change, but stored with a stale key: rewriting");
                        Some(state.value.clone())
                    }
                    _ => None,
                };
                let Some(new_value) = new_value else {
                    if !is_current {
                        // A no-op against possibly stale data proves nothing.
                        debug!("no-op on suggestion, re-reading");
                        (state, stale) = self.read_existing(key).await?;
                        is_current = true;
                        continue;
                    }
                    debug!(rev = state.mod_revision, "no change, skipping write");
                    return Ok(state);
                };
                let data = self.transformer.to_storage(key, new_value.clone())?;
                if opts.dry_run {
                    if !is_current {
                        (state, stale) = self.read_existing(key).await?;
                        is_current = true;
                        continue;
                    }
                    return Ok(StoredObject {
                        value: new_value,
                        ..state
                    });
                }
                let lease_id = match lease {
                    Some(l) => l,
                    None => {
                        let l = self.lease_for(opts).await?;
                        lease = Some(l);
                        l
                    }
                };
                let txn = Txn::new()
                    .when([Compare::mod_revision(
                        key,
                        CompareOp::Equal,
                        state.mod_revision,
                    )])
                    .and_then([TxnOp::put(
                        key,
                        Vec::from(data),
                        Some(Self::put_options(lease_id)),
                    )])
                    .or_else([TxnOp::get(key, None)]);
                let mut kv = self.kv.clone();
                let resp = self.call("guaranteed_update", 0, kv.txn(txn)).await?;
                if resp.succeeded() {
                    let rev = header_revision(resp.header())?;
                    return Ok(StoredObject {
                        key: key.to_string(),
                        value: new_value,
                        mod_revision: rev,
                        create_revision: state.create_revision,
                        version: state.version + 1,
                        lease: lease_id,
                    });
                }
                self.conflict_retries.fetch_add(1, Ordering::Relaxed);
                conflicts += 1;
                if conflicts > self.max_update_retries {
                    warn!(conflicts, "guaranteed_update gave up");
                    return Err(StorageError::conflict(
                        key,
                        format!("gave up after {conflicts} conflicting concurrent updates"),
                    )
                    .into());
                }
                debug!(conflicts, "CAS lost, retrying on the fresh state");
                (state, stale) = match txn_else_kv(&resp) {
                    Some(kv) => {
                        StoredObject::read_kv(kv, self.transformer.as_ref()).map_err(|u| u.error)?
                    }
                    None => return Err(StorageError::not_found(key).into()),
                };
                is_current = true;
            }
        }
        .instrument(span)
        .await
    }

    /// Deletes `key` if `preconditions` hold against the current object and
    /// returns the deleted object at the delete's revision (its
    /// `mod_revision` is the delete's, as kube-apiserver's etcd3 store
    /// decodes it: a watch from the answer's resourceVersion does not
    /// replay the delete; a dry run answers it as it is). CAS on mod_revision: if the object changed
    /// between read and delete, preconditions are checked again on the fresh
    /// state and the delete retried (bounded by `max_update_retries`).
    pub async fn delete(
        &self,
        key: &str,
        preconditions: &Preconditions,
        opts: &WriteOptions,
    ) -> Result<StoredObject, StorageError> {
        let span = debug_span!("storage.delete", key, dry_run = opts.dry_run);
        async {
            let (mut state, _) = self.read_existing(key).await?;
            let mut conflicts: u32 = 0;
            loop {
                preconditions.check(key, &state)?;
                if opts.dry_run {
                    return Ok(state);
                }
                let txn = Txn::new()
                    .when([Compare::mod_revision(
                        key,
                        CompareOp::Equal,
                        state.mod_revision,
                    )])
                    .and_then([TxnOp::delete(key, Some(DeleteOptions::new()))])
                    .or_else([TxnOp::get(key, None)]);
                let mut kv = self.kv.clone();
                let resp = self.call("delete", 0, kv.txn(txn)).await?;
                if resp.succeeded() {
                    state.mod_revision = header_revision(resp.header())?;
                    debug!(rev = state.mod_revision, "deleted");
                    return Ok(state);
                }
                self.conflict_retries.fetch_add(1, Ordering::Relaxed);
                conflicts += 1;
                if conflicts > self.max_update_retries {
                    return Err(StorageError::conflict(
                        key,
                        format!("gave up after {conflicts} conflicting concurrent updates"),
                    ));
                }
                state = match txn_else_kv(&resp) {
                    Some(kv) => StoredObject::from_kv(kv, self.transformer.as_ref())?,
                    None => return Err(StorageError::not_found(key)),
                };
            }
        }
        .instrument(span)
        .await
    }
}

/// Whether etcd `version` answers watch progress requests only once every
/// event before them was sent (etcd#15220, etcd#17507: fixed in 3.4.31 and
/// 3.5.13, the versions kube-apiserver's feature checker requires for
/// consistent reads from its cache). `None`: not a version this can read.
pub fn progress_requests_are_safe(version: &str) -> Option<bool> {
    let mut parts = version
        .trim()
        .trim_start_matches('v')
        .split(['.', '-', '+']);
    let mut next = || parts.next()?.parse::<u64>().ok();
    let (major, minor, patch) = (next()?, next()?, next()?);
    Some(match (major, minor) {
        (3, 4) => patch >= 31,
        (3, 5) => patch >= 13,
        (3, m) => m > 5,
        (m, _) => m > 3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_requests_are_safe_from_3_5_13_and_3_4_31() {
        for (v, want) in [
            ("3.5.13", Some(true)),
            ("3.5.16", Some(true)),
            ("v3.6.0", Some(true)),
            ("4.0.0-alpha.0", Some(true)),
            ("3.4.31", Some(true)),
            ("3.5.12", Some(false)),
            ("3.5.0", Some(false)),
            ("3.4.30", Some(false)),
            ("3.3.27", Some(false)),
            ("", None),
            ("3.5", None),
            ("x.y.z", None),
        ] {
            assert_eq!(progress_requests_are_safe(v), want, "{v:?}");
        }
    }

    #[test]
    fn range_end() {
        assert_eq!(prefix_range_end("/a/"), b"/a0".to_vec());
        assert_eq!(prefix_range_end("a\u{7f}"), b"a\x80".to_vec());
        assert_eq!(prefix_range_end(""), vec![0]);
    }
}

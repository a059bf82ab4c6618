//! The per-resource watch cache (DESIGN.md sections 2, 4, 5).
//!
//! [`Cacher`] is the public face: it owns a [`Reflector`] task that keeps a
//! [`WatchCache`] in step with one etcd prefix, answers Get/List from
//! immutable [`Snapshot`]s following the resourceVersion table of DESIGN.md
//! section 2, and serves watches as cursors into the [`History`] ring.

pub mod continue_token;
pub mod history;
pub mod reflector;
pub mod snapshot;
pub mod watch_cache;
pub mod watcher;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::config::{ResourceConfig, ServerConfig};
use crate::object::{FieldSelector, LabelSelector, Object, ObjectCodec};
use crate::storage::{ListOptions, Storage, StorageError};

pub use history::{EventKind, History, HistoryEvent};
pub use reflector::Reflector;
pub use snapshot::{IndexKey, Snapshot};
pub use watch_cache::{CacherStats, WatchCache};
pub use watcher::{WatchChunk, Watcher};

/// Tunables of one [`Cacher`].
#[derive(Debug, Clone)]
pub struct CacherOptions {
    /// Bound of the wait for the cache to catch up (consistent reads, "not
    /// older than N"); then fall back to etcd or answer 504. Zero: never wait.
    pub consistent_read_timeout: Duration,
    /// Interval of periodic bookmarks for watchers that allow them.
    pub bookmark_interval: Duration,
    /// Page size of the reflector's list.
    pub list_page_size: i64,
    /// When the reflector's watch has been silent this long it asks etcd for
    /// a progress notification (keeps an idle resource's RV fresh).
    pub progress_interval: Duration,
    /// When nothing at all (not even the requested progress) arrives for this
    /// long after a progress request, the watch is restarted.
    pub idle_timeout: Duration,
    /// Largest page of objects put in one initial-events watch chunk.
    pub initial_events_chunk: usize,
}

impl Default for CacherOptions {
    fn default() -> Self {
        CacherOptions {
            consistent_read_timeout: Duration::from_secs(3),
            bookmark_interval: Duration::from_secs(60),
            list_page_size: 10_000,
            progress_interval: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(10),
            initial_events_chunk: 500,
        }
    }
}

impl CacherOptions {
    /// Options from the server config, other values default.
    pub fn from_config(server: &ServerConfig, list_page_size: i64) -> CacherOptions {
        CacherOptions {
            consistent_read_timeout: Duration::from_millis(server.consistent_read_timeout_ms),
            bookmark_interval: Duration::from_millis(server.bookmark_interval_ms),
            list_page_size,
            ..CacherOptions::default()
        }
    }
}

/// `resourceVersionMatch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceVersionMatch {
    Exact,
    NotOlderThan,
}

/// A Get. `resource_version`: `None` = unset, `Some(0)` = "0", `Some(n)`.
#[derive(Debug, Clone, Default)]
pub struct GetRequest {
    pub namespace: Option<String>,
    pub name: String,
    pub resource_version: Option<i64>,
}

/// A List (see DESIGN.md section 2's table).
#[derive(Debug, Clone, Default)]
pub struct ListRequest {
    pub namespace: Option<String>,
    pub resource_version: Option<i64>,
    pub resource_version_match: Option<ResourceVersionMatch>,
    /// `None` or `<= 0` = no limit.
    pub limit: Option<i64>,
    pub continue_token: Option<String>,
    pub label_selector: LabelSelector,
    pub field_selector: FieldSelector,
}

/// Where a List was answered from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListSource {
    Cache,
    Etcd,
}

#[derive(Debug, Clone)]
pub struct ListResult {
    /// The list's RV (`metadata.resourceVersion`).
    pub resource_version: i64,
    pub items: Vec<Arc<Object>>,
    pub continue_token: Option<String>,
    pub remaining_item_count: Option<i64>,
    pub source: ListSource,
}

/// A Watch.
#[derive(Debug, Clone, Default)]
pub struct WatchRequest {
    pub namespace: Option<String>,
    pub resource_version: Option<i64>,
    pub resource_version_match: Option<ResourceVersionMatch>,
    pub label_selector: LabelSelector,
    pub field_selector: FieldSelector,
    pub allow_bookmarks: bool,
    pub send_initial_events: Option<bool>,
    /// `timeoutSeconds`: the stream ends (after a last bookmark) when it passes.
    pub timeout: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacherError {
    /// 400.
    #[error("{0}")]
    BadRequest(String),
    /// 404.
    #[error("not found")]
    NotFound,
    /// 410 (message e.g. `too old resource version: N (M)`).
    #[error("{0}")]
    Expired(String),
    /// 504 "Too large resource version", with Retry-After.
    #[error("Too large resource version: {requested}, current: {current}")]
    TooLargeResourceVersion { requested: i64, current: i64 },
    /// 429 with Retry-After: the first list has not completed.
    #[error("the watch cache is not initialized yet")]
    NotReady,
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("the watch cache is shutting down")]
    ShuttingDown,
}

/// How a Get or List read is to be served (the cells of DESIGN.md section 2's table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadPlan {
    /// RV unset: consistent read.
    MostRecent,
    /// RV "0": whatever the cache has.
    Any,
    NotOlderThan(i64),
    Exact(i64),
    /// A continue token: exact at the token's RV, starting at its key.
    Continue {
        rv: i64,
        start_key: String,
        /// From the token: (items in the whole list, items returned so far).
        counts: Option<(u64, u64)>,
    },
}

impl From<continue_token::ContinueToken> for ReadPlan {
    fn from(t: continue_token::ContinueToken) -> ReadPlan {
        ReadPlan::Continue {
            rv: t.rv,
            start_key: t.start_key,
            counts: t.counts,
        }
    }
}

/// Applies the List table of DESIGN.md section 2, 400 cells included.
pub(crate) fn plan_list(req: &ListRequest, key_prefix: &str) -> Result<ReadPlan, CacherError> {
    let rv = req.resource_version;
    if let Some(n) = rv
        && n < 0
    {
        return Err(CacherError::BadRequest(format!(
            "invalid resource version: {n}"
        )));
    }
    let has_limit = req.limit.is_some_and(|l| l > 0);
    let token = match req.continue_token.as_deref() {
        Some(t) if !t.is_empty() => {
            Some(continue_token::decode(t, key_prefix).map_err(CacherError::BadRequest)?)
        }
        _ => None,
    };
    use ResourceVersionMatch::*;
    match (req.resource_version_match, rv, token) {
        (Some(Exact), None | Some(0), _) => Err(CacherError::BadRequest(
            "resourceVersionMatch \"Exact\" requires a non-zero resourceVersion".into(),
        )),
        (Some(NotOlderThan), None, _) => Err(CacherError::BadRequest(
            "resourceVersionMatch is forbidden unless resourceVersion is provided".into(),
        )),
        // "Exact N" with a continue token: only the token's own RV is exact N.
        (Some(Exact), Some(n), Some(t)) => {
            if t.rv == n {
                Ok(ReadPlan::from(t))
            } else {
                Err(CacherError::BadRequest(format!(
                    "resourceVersion {n} does not match the continue token's {}",
                    t.rv
                )))
            }
        }
        (Some(Exact), Some(n), None) => Ok(ReadPlan::Exact(n)),
        (Some(NotOlderThan), Some(n), Some(t)) => {
            if t.rv >= n {
                Ok(ReadPlan::from(t))
            } else {
                Err(CacherError::BadRequest(format!(
                    "the continue token's resourceVersion {} is older than {n}",
                    t.rv
                )))
            }
        }
        (Some(NotOlderThan), Some(0), None) => Ok(ReadPlan::Any),
        (Some(NotOlderThan), Some(n), None) => Ok(ReadPlan::NotOlderThan(n)),
        (None, None | Some(0), Some(t)) => Ok(ReadPlan::from(t)),
        (None, Some(_), Some(_)) => Err(CacherError::BadRequest(
            "specifying resource version is not allowed when using continue".into(),
        )),
        (None, None, None) => Ok(ReadPlan::MostRecent),
        (None, Some(0), None) => Ok(ReadPlan::Any),
        (None, Some(n), None) if has_limit => Ok(ReadPlan::Exact(n)),
        (None, Some(n), None) => Ok(ReadPlan::NotOlderThan(n)),
    }
}

/// Get: unset -> most recent; `0` -> any; `N` -> not older than N.
pub(crate) fn plan_get(rv: Option<i64>) -> Result<ReadPlan, CacherError> {
    match rv {
        None => Ok(ReadPlan::MostRecent),
        Some(0) => Ok(ReadPlan::Any),
        Some(n) if n < 0 => Err(CacherError::BadRequest(format!(
            "invalid resource version: {n}"
        ))),
        Some(n) => Ok(ReadPlan::NotOlderThan(n)),
    }
}

/// Where a watch starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WatchPlan {
    /// Send the state (as ADDED) at a snapshot chosen by `read`, then changes;
    /// `end_bookmark`: then a BOOKMARK with the initial-events-end annotation.
    Initial { read: ReadPlan, end_bookmark: bool },
    /// No initial state: changes after the most recent RV (consistent) or any.
    FromNow { read: ReadPlan },
    /// Exactly the events after N.
    After(i64),
}

/// Applies the watch rules of DESIGN.md section 2.
pub(crate) fn plan_watch(req: &WatchRequest) -> Result<WatchPlan, CacherError> {
    if let Some(n) = req.resource_version
        && n < 0
    {
        return Err(CacherError::BadRequest(format!(
            "invalid resource version: {n}"
        )));
    }
    match req.send_initial_events {
        None => {
            if req.resource_version_match.is_some() {
                return Err(CacherError::BadRequest(
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"
                        .into(),
                ));
            }
            Ok(match req.resource_version {
                None => WatchPlan::Initial {
                    read: ReadPlan::MostRecent,
                    end_bookmark: false,
                },
                Some(0) => WatchPlan::Initial {
                    read: ReadPlan::Any,
                    end_bookmark: false,
                },
                Some(n) => WatchPlan::After(n),
            })
        }
        Some(send) => {
            if req.resource_version_match != Some(ResourceVersionMatch::NotOlderThan) {
                return Err(CacherError::BadRequest(
                    "sendInitialEvents requires resourceVersionMatch=NotOlderThan".into(),
                ));
            }
            if send && !req.allow_bookmarks {
                return Err(CacherError::BadRequest(
                    "sendInitialEvents=true requires allowWatchBookmarks=true".into(),
                ));
            }
            let read = match req.resource_version {
                None => ReadPlan::MostRecent,
                Some(0) => ReadPlan::Any,
                Some(n) => ReadPlan::NotOlderThan(n),
            };
            Ok(if send {
                WatchPlan::Initial {
                    read,
                    end_bookmark: true,
                }
            } else {
                match read {
                    ReadPlan::NotOlderThan(n) => WatchPlan::After(n),
                    read => WatchPlan::FromNow { read },
                }
            })
        }
    }
}

/// The per-resource watch cache: reflector + snapshots + history + watchers.
pub struct Cacher {
    resource: ResourceConfig,
    codec: Arc<ObjectCodec>,
    storage: Storage,
    opts: CacherOptions,
    cache: Arc<WatchCache>,
    /// Readers ask the reflector for a watch progress notification.
    progress: Arc<Notify>,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for Cacher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cacher")
            .field("resource", &self.resource.plural)
            .field("rv", &self.cache.resource_version())
            .finish_non_exhaustive()
    }
}

impl Cacher {
    /// Creates the cacher and spawns its reflector (needs a tokio runtime).
    pub fn start(
        resource: ResourceConfig,
        etcd_prefix: &str,
        storage: Storage,
        opts: CacherOptions,
    ) -> Arc<Cacher> {
        let codec = Arc::new(ObjectCodec::new(&resource, etcd_prefix));
        let cache = Arc::new(WatchCache::new(
            Arc::clone(&codec),
            resource.plural.clone(),
            resource.history_capacity,
        ));
        let progress = Arc::new(Notify::new());
        let shutdown = CancellationToken::new();
        let reflector = Reflector::new(
            Arc::clone(&cache),
            Arc::clone(&codec),
            storage.clone(),
            opts.clone(),
            Arc::clone(&progress),
            shutdown.clone(),
        );
        tokio::spawn(reflector.run());
        Arc::new(Cacher {
            resource,
            codec,
            storage,
            opts,
            cache,
            progress,
            shutdown,
        })
    }

    pub fn resource(&self) -> &ResourceConfig {
        &self.resource
    }
    pub fn codec(&self) -> &ObjectCodec {
        &self.codec
    }
    pub fn watch_cache(&self) -> &Arc<WatchCache> {
        &self.cache
    }
    /// Counters for the metrics layer.
    pub fn stats(&self) -> &CacherStats {
        self.cache.stats()
    }
    pub fn is_ready(&self) -> bool {
        self.cache.is_ready()
    }
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        self.cache.wait_ready(timeout).await
    }
    /// The cache's current RV.
    pub fn resource_version(&self) -> i64 {
        self.cache.resource_version()
    }

    /// Stops the reflector and ends every watcher.
    pub fn shutdown(&self) {
        self.shutdown.cancel();
        self.cache.close();
    }

    fn check_open(&self) -> Result<(), CacherError> {
        if self.shutdown.is_cancelled() {
            Err(CacherError::ShuttingDown)
        } else {
            Ok(())
        }
    }

    /// Waits (bounded) until the cache has caught up with etcd's current
    /// revision. Ok(true): caught up; Ok(false): timed out.
    async fn wait_fresh(&self) -> Result<bool, CacherError> {
        let rev = self.storage.fresh_revision().await?;
        Ok(self.wait_for_rv(rev).await)
    }

    /// Waits (bounded) until the cache RV reaches `rv`, asking etcd for a
    /// progress notification so an idle resource catches up too.
    async fn wait_for_rv(&self, rv: i64) -> bool {
        if self.cache.resource_version() >= rv {
            return true;
        }
        if self.opts.consistent_read_timeout.is_zero() {
            // A zero bound means "never wait": go to etcd (or 504) at once.
            return false;
        }
        self.progress.notify_one();
        let started = tokio::time::Instant::now();
        let ok = self
            .cache
            .wait_for_rv(rv, self.opts.consistent_read_timeout, &self.shutdown)
            .await;
        self.cache.stats().observe_read_wait(started.elapsed());
        ok
    }

    /// Resolves a read plan to a snapshot: `Ok(None)` means "fall back to etcd".
    async fn snapshot_for(&self, plan: &ReadPlan) -> Result<Option<Arc<Snapshot>>, CacherError> {
        match plan {
            ReadPlan::MostRecent => {
                if self.wait_fresh().await? {
                    self.cache.stats().consistent_cache();
                    Ok(Some(self.cache.current()))
                } else {
                    self.cache.stats().consistent_fallback();
                    Ok(None)
                }
            }
            ReadPlan::Any => Ok(Some(self.cache.current())),
            ReadPlan::NotOlderThan(n) => {
                if self.wait_for_rv(*n).await {
                    Ok(Some(self.cache.current()))
                } else {
                    Err(CacherError::TooLargeResourceVersion {
                        requested: *n,
                        current: self.cache.resource_version(),
                    })
                }
            }
            ReadPlan::Exact(n) | ReadPlan::Continue { rv: n, .. } => {
                if !self.wait_for_rv(*n).await {
                    return Err(CacherError::TooLargeResourceVersion {
                        requested: *n,
                        current: self.cache.resource_version(),
                    });
                }
                match self.cache.snapshot_at(*n) {
                    Some(s) => Ok(Some(s)),
                    None => Err(CacherError::Expired(format!(
                        "too old resource version: {n} ({})",
                        self.cache.oldest_snapshot_rv()
                    ))),
                }
            }
        }
    }

    /// Get (DESIGN.md section 2): unset -> most recent, 0 -> any, N -> not older than N.
    pub async fn get(&self, req: &GetRequest) -> Result<Arc<Object>, CacherError> {
        self.check_open()?;
        let plan = plan_get(req.resource_version)?;
        let key = self.codec.key(req.namespace.as_deref(), &req.name);
        if !self.cache.is_ready() {
            // Not ready: Get may fall back to etcd (DESIGN.md section 4).
            let rev = match plan {
                ReadPlan::NotOlderThan(n) => {
                    let cur = self.storage.current_revision().await?;
                    if n > cur {
                        return Err(CacherError::TooLargeResourceVersion {
                            requested: n,
                            current: cur,
                        });
                    }
                    0
                }
                _ => 0,
            };
            return self.get_from_etcd(&key, rev).await;
        }
        match self.snapshot_for(&plan).await? {
            Some(snap) => snap.get(&key).cloned().ok_or(CacherError::NotFound),
            None => self.get_from_etcd(&key, 0).await,
        }
    }

    async fn get_from_etcd(&self, key: &str, revision: i64) -> Result<Arc<Object>, CacherError> {
        let stored = match self.storage.get(key, revision).await {
            Ok(s) => s,
            Err(StorageError::NotFound { .. }) => return Err(CacherError::NotFound),
            Err(e) => return Err(e.into()),
        };
        match self.codec.decode(
            key,
            &stored.value,
            stored.mod_revision,
            stored.create_revision,
        ) {
            Ok(o) => Ok(Arc::new(o)),
            Err(e) => {
                debug!(key, error = %e, "undecodable value read from etcd");
                Err(CacherError::NotFound)
            }
        }
    }

    /// List (DESIGN.md section 2's table).
    pub async fn list(&self, req: &ListRequest) -> Result<ListResult, CacherError> {
        self.check_open()?;
        let plan = plan_list(req, self.codec.key_prefix())?;
        if !self.cache.is_ready() {
            return Err(CacherError::NotReady);
        }
        let query = watch_cache::ListQuery::new(
            &self.codec,
            req.namespace.as_deref(),
            &req.label_selector,
            &req.field_selector,
        );
        let limit = req.limit.filter(|l| *l > 0).map(|l| l as usize);
        let start_key = match &plan {
            ReadPlan::Continue { start_key, .. } => Some(start_key.as_str()),
            _ => None,
        };
        let snap = match self.snapshot_for(&plan).await {
            Ok(Some(s)) => s,
            Ok(None) => return self.list_from_etcd(&query, 0, None, limit).await,
            Err(e @ (CacherError::Expired(_) | CacherError::TooLargeResourceVersion { .. })) => {
                // A continue token older than the retained snapshots, or from
                // an etcd-served first page the cache has not reached: etcd
                // may have that revision (else it answers Compacted -> 410).
                if let ReadPlan::Continue { rv, start_key, .. } = &plan {
                    return self
                        .list_from_etcd(&query, *rv, Some(start_key.clone()), limit)
                        .await;
                }
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        let list_rv = match &plan {
            ReadPlan::Exact(n) | ReadPlan::Continue { rv: n, .. } => *n,
            _ => snap.rv,
        };
        // remainingItemCount (lists without selectors): the first page counts
        // the whole list once (O(1) without a namespace: the snapshot holds
        // only this resource) and the token carries (total, returned), so
        // later pages do not walk the rest of the range.
        let counts = if !query.counts_remaining() {
            None
        } else {
            match &plan {
                ReadPlan::Continue { counts, .. } => *counts,
                _ => Some((query.count_all(&snap), 0)),
            }
        };
        let walk_rest = query.counts_remaining() && counts.is_none();
        let page = query.run(&snap, start_key, limit, walk_rest);
        let returned = counts.map(|(total, before)| (total, before + page.items.len() as u64));
        let remaining = match returned {
            Some((total, upto)) => page
                .last_key
                .is_some()
                .then(|| total.saturating_sub(upto) as i64),
            None => page.remaining,
        };
        self.cache.stats().list_cache();
        Ok(ListResult {
            resource_version: list_rv,
            continue_token: page
                .last_key
                .as_deref()
                .map(|k| continue_token::encode(list_rv, k, self.codec.key_prefix(), returned)),
            remaining_item_count: remaining,
            items: page.items,
            source: ListSource::Cache,
        })
    }

    /// The etcd fallback of a List: read everything under the (namespace)
    /// prefix at `revision` (0 = latest) and filter like the cache does.
    async fn list_from_etcd(
        &self,
        query: &watch_cache::ListQuery<'_>,
        revision: i64,
        start_key: Option<String>,
        limit: Option<usize>,
    ) -> Result<ListResult, CacherError> {
        if revision > 0 {
            // A (forged) token from the future: the same 504 as the cache's.
            let current = self.storage.current_revision().await?;
            if revision > current {
                return Err(CacherError::TooLargeResourceVersion {
                    requested: revision,
                    current,
                });
            }
        }
        let prefix = query.prefix();
        let opts = ListOptions {
            revision,
            limit: self.opts.list_page_size.max(1),
            // Reading from the token's key saves etcd work when it lies in
            // the (namespace) prefix; the query filters by it either way.
            start_key: start_key
                .as_ref()
                .filter(|k| k.starts_with(prefix))
                .map(|k| k.clone().into_bytes()),
        };
        let all = match self.storage.list_all(prefix, &opts).await {
            Ok(all) => all,
            Err(StorageError::Compacted { requested, .. }) => {
                return Err(CacherError::Expired(format!(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter. (resource version {requested})"
                )));
            }
            Err(e) => return Err(e.into()),
        };
        // Items come in key order from the (namespace) prefix and from the
        // start key on: decode and filter them straight, no snapshot needed.
        let objects: Vec<Arc<Object>> = all
            .items
            .iter()
            .filter(|item| start_key.as_deref().is_none_or(|s| item.key.as_str() >= s))
            .filter_map(|item| {
                self.codec
                    .decode(
                        &item.key,
                        &item.value,
                        item.mod_revision,
                        item.create_revision,
                    )
                    .ok()
                    .map(Arc::new)
            })
            .collect();
        let page = query.page(objects.iter(), limit, query.counts_remaining());
        self.cache.stats().list_etcd();
        Ok(ListResult {
            resource_version: all.revision,
            continue_token: page
                .last_key
                .as_deref()
                .map(|k| continue_token::encode(all.revision, k, self.codec.key_prefix(), None)),
            remaining_item_count: page.remaining,
            items: page.items,
            source: ListSource::Etcd,
        })
    }

    /// Watch (DESIGN.md sections 2, 4, 5). A watch from an RV older than the
    /// history yields a watcher whose only item is a 410 `Error` chunk (the
    /// API sends it as an ERROR event).
    pub async fn watch(&self, req: WatchRequest) -> Result<Watcher, CacherError> {
        self.check_open()?;
        let plan = plan_watch(&req)?;
        if !self.cache.is_ready() {
            return Err(CacherError::NotReady);
        }
        let filter = watcher::Filter::new(
            &self.codec,
            req.namespace.clone(),
            req.label_selector.clone(),
            req.field_selector.clone(),
        );
        let start = match plan {
            WatchPlan::Initial { read, end_bookmark } => {
                self.wait_for_plan(&read).await?;
                watch_cache::WatchStart::Initial { end_bookmark }
            }
            WatchPlan::FromNow { read } => {
                self.wait_for_plan(&read).await?;
                watch_cache::WatchStart::Now
            }
            WatchPlan::After(n) => {
                if !self.wait_for_rv(n).await {
                    return Err(CacherError::TooLargeResourceVersion {
                        requested: n,
                        current: self.cache.resource_version(),
                    });
                }
                watch_cache::WatchStart::After(n)
            }
        };
        let params = watcher::WatcherParams {
            api_version: self.codec.api_version().into(),
            kind: self.codec.kind().into(),
            allow_bookmarks: req.allow_bookmarks,
            bookmark_interval: self.opts.bookmark_interval,
            timeout: req.timeout,
            initial_chunk: self.opts.initial_events_chunk.max(1),
        };
        Ok(Watcher::register(
            Arc::clone(&self.cache),
            filter,
            start,
            params,
        ))
    }

    /// The wait a watch's starting point needs: consistent (bounded, then
    /// start from what the cache has), any, or not older than N (504).
    async fn wait_for_plan(&self, read: &ReadPlan) -> Result<(), CacherError> {
        match read {
            ReadPlan::MostRecent => {
                // A watch cannot fall back to etcd: after the bounded wait it
                // starts from the cache's state, which it then follows.
                let _ = self.wait_fresh().await?;
                Ok(())
            }
            ReadPlan::NotOlderThan(n) => {
                if self.wait_for_rv(*n).await {
                    Ok(())
                } else {
                    Err(CacherError::TooLargeResourceVersion {
                        requested: *n,
                        current: self.cache.resource_version(),
                    })
                }
            }
            _ => Ok(()),
        }
    }
}

impl Drop for Cacher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "/registry/pods/";

    fn list(
        rv: Option<i64>,
        m: Option<ResourceVersionMatch>,
        limit: Option<i64>,
        cont: bool,
    ) -> Result<ReadPlan, CacherError> {
        let tok = continue_token::encode(7, "/registry/pods/ns/a", P, None);
        plan_list(
            &ListRequest {
                resource_version: rv,
                resource_version_match: m,
                limit,
                continue_token: cont.then_some(tok),
                ..Default::default()
            },
            P,
        )
    }

    fn is_bad(r: Result<ReadPlan, CacherError>) -> bool {
        matches!(r, Err(CacherError::BadRequest(_)))
    }

    #[test]
    fn list_table_match_unset() {
        use ReadPlan::*;
        let cont = Continue {
            rv: 7,
            start_key: "/registry/pods/ns/a\0".into(),
            counts: None,
        };
        // no limit
        assert_eq!(list(None, None, None, false), Ok(MostRecent));
        assert_eq!(list(Some(0), None, None, false), Ok(Any));
        assert_eq!(list(Some(5), None, None, false), Ok(NotOlderThan(5)));
        // limit, no continue
        assert_eq!(list(None, None, Some(2), false), Ok(MostRecent));
        assert_eq!(list(Some(0), None, Some(2), false), Ok(Any));
        assert_eq!(list(Some(5), None, Some(2), false), Ok(Exact(5)));
        // continue
        assert_eq!(list(None, None, Some(2), true), Ok(cont.clone()));
        assert_eq!(list(Some(0), None, Some(2), true), Ok(cont));
        assert!(is_bad(list(Some(5), None, Some(2), true)));
        // limit 0 counts as no limit
        assert_eq!(list(Some(5), None, Some(0), false), Ok(NotOlderThan(5)));
    }

    #[test]
    fn list_table_match_set() {
        use ReadPlan::{Any, Continue};
        const EXACT: Option<ResourceVersionMatch> = Some(ResourceVersionMatch::Exact);
        const NOT_OLDER: Option<ResourceVersionMatch> = Some(ResourceVersionMatch::NotOlderThan);
        for limit in [None, Some(2)] {
            assert!(is_bad(list(None, EXACT, limit, false)));
            assert!(is_bad(list(Some(0), EXACT, limit, false)));
            assert_eq!(list(Some(5), EXACT, limit, false), Ok(ReadPlan::Exact(5)));
            assert!(is_bad(list(None, NOT_OLDER, limit, false)));
            assert_eq!(list(Some(0), NOT_OLDER, limit, false), Ok(Any));
            assert_eq!(
                list(Some(5), NOT_OLDER, limit, false),
                Ok(ReadPlan::NotOlderThan(5))
            );
        }
        assert!(is_bad(list(None, EXACT, Some(2), true)));
        assert!(is_bad(list(Some(0), EXACT, Some(2), true)));
        assert!(is_bad(list(Some(5), EXACT, Some(2), true)));
        assert!(matches!(
            list(Some(7), EXACT, Some(2), true),
            Ok(Continue { rv: 7, .. })
        ));
        assert!(is_bad(list(None, NOT_OLDER, Some(2), true)));
        assert!(matches!(
            list(Some(0), NOT_OLDER, Some(2), true),
            Ok(Continue { rv: 7, .. })
        ));
    }

    #[test]
    fn bad_tokens_and_negative_rvs_are_400() {
        let r = plan_list(
            &ListRequest {
                continue_token: Some("garbage!".into()),
                ..Default::default()
            },
            P,
        );
        assert!(is_bad(r));
        assert!(is_bad(list(Some(-1), None, None, false)));
        assert!(matches!(
            plan_get(Some(-1)),
            Err(CacherError::BadRequest(_))
        ));
        assert_eq!(plan_get(None), Ok(ReadPlan::MostRecent));
        assert_eq!(plan_get(Some(0)), Ok(ReadPlan::Any));
        assert_eq!(plan_get(Some(9)), Ok(ReadPlan::NotOlderThan(9)));
    }

    #[test]
    fn watch_rules() {
        use ResourceVersionMatch::*;
        let w = |rv, m, sie, bm| {
            plan_watch(&WatchRequest {
                resource_version: rv,
                resource_version_match: m,
                send_initial_events: sie,
                allow_bookmarks: bm,
                ..Default::default()
            })
        };
        assert_eq!(
            w(None, None, None, false),
            Ok(WatchPlan::Initial {
                read: ReadPlan::MostRecent,
                end_bookmark: false
            })
        );
        assert_eq!(
            w(Some(0), None, None, true),
            Ok(WatchPlan::Initial {
                read: ReadPlan::Any,
                end_bookmark: false
            })
        );
        assert_eq!(w(Some(4), None, None, true), Ok(WatchPlan::After(4)));
        assert!(matches!(
            w(Some(4), Some(Exact), None, true),
            Err(CacherError::BadRequest(_))
        ));
        assert!(matches!(
            w(Some(4), None, Some(true), true),
            Err(CacherError::BadRequest(_))
        ));
        assert!(matches!(
            w(Some(4), Some(NotOlderThan), Some(true), false),
            Err(CacherError::BadRequest(_))
        ));
        assert!(matches!(
            w(Some(4), Some(Exact), Some(true), true),
            Err(CacherError::BadRequest(_))
        ));
        assert_eq!(
            w(Some(4), Some(NotOlderThan), Some(true), true),
            Ok(WatchPlan::Initial {
                read: ReadPlan::NotOlderThan(4),
                end_bookmark: true
            })
        );
        assert_eq!(
            w(None, Some(NotOlderThan), Some(false), false),
            Ok(WatchPlan::FromNow {
                read: ReadPlan::MostRecent
            })
        );
        assert_eq!(
            w(Some(4), Some(NotOlderThan), Some(false), false),
            Ok(WatchPlan::After(4))
        );
    }
}

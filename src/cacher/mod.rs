//! The per-resource watch cache (docs/DESIGN.md sections 2, 4, 5).
//!
//! [`Cacher`] is the public face: it owns a [`Reflector`] task that keeps a
//! [`WatchCache`] in step with one etcd prefix, answers Get/List from
//! immutable [`Snapshot`]s following the resourceVersion table of docs/DESIGN.md
//! section 2, and serves watches as cursors into the [`History`] ring.
//!
//! One file per concept: [`read_plan`] (which RV a request is served at),
//! [`delegator`] (cache or etcd), [`selection_predicate`] (what a List or
//! Watch selects), [`watch_cache`] (state + history), [`indexed_watchers`]
//! (which watchers an event wakes), [`watcher`] (one stream), [`reflector`]
//! (etcd -> cache), [`stats`] (counters exported to `/metrics`).

pub mod consistency_checker;
pub mod continue_token;
mod delegator;
pub mod history;
mod indexed_watchers;
pub mod list_items;
pub(crate) mod read_plan;
pub mod reflector;
pub mod selection_predicate;
pub mod snapshot;
pub mod stats;
pub mod watch_cache;
pub mod watcher;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::error;

use crate::config::{ResourceConfig, ServerConfig};
use crate::object::sharding::ShardSelector;
use crate::object::{FieldSelector, LabelSelector, Object, ObjectCodec};
use crate::storage::{Storage, StorageError};

pub use history::{ConvertedLines, EventKind, History, HistoryEvent};
pub use list_items::{ListCursor, ListItems};
use read_plan::{ReadPlan, WatchPlan, plan_get, plan_list, plan_watch};
pub use reflector::Reflector;
pub use selection_predicate::{ListPage, SelectionPredicate};
pub use snapshot::{IndexKey, Snapshot};
pub use stats::CacherStats;
pub use watch_cache::WatchCache;
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
    /// Interval of the consistency check against etcd; zero: off.
    pub consistency_check_interval: Duration,
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
            consistency_check_interval: Duration::ZERO,
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
            consistency_check_interval: Duration::from_secs(
                server.consistency_check_interval_seconds,
            ),
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
/// It borrows the request's names: a Get from memory allocates only its key.
#[derive(Debug, Clone, Copy, Default)]
pub struct GetRequest<'a> {
    pub namespace: Option<&'a str>,
    pub name: &'a str,
    pub resource_version: Option<i64>,
}

/// A List (see docs/DESIGN.md section 2's table).
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
    /// `shardSelector` (the `ShardedListAndWatch` gate on).
    pub shard_selector: Option<Arc<ShardSelector>>,
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
    pub items: ListItems,
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
    /// `shardSelector` (the `ShardedListAndWatch` gate on).
    pub shard_selector: Option<Arc<ShardSelector>>,
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
    /// An event cannot be sent in the watcher's protobuf encoding (a stored
    /// JSON object that does not fit the built-in type's schema).
    #[error("cannot encode a watch event as protobuf: {0}")]
    Encoding(String),
}

/// Objects a List's selection may walk inline. A larger cache's selection
/// runs on the blocking pool: it is milliseconds of CPU (1.2-1.9 ms over
/// 100,000 objects for a field selector), and inline it would hold a runtime
/// worker and, with it, every other stream of the client's connection,
/// which run in the same task (an informer's watches share its List's
/// connection). Below this, the walk (under half a millisecond) costs
/// less than the hand-off: at 10,000 objects, the first page's hand-off
/// made paged Lists slower (docs/BENCHMARKS.md#what-did-not-work).
const INLINE_SELECTION_MAX: usize = 32_768;

/// Selections on the blocking pool at once: about the cores. A burst of
/// large Lists waits for a slot (holding no connection's task) instead of
/// starting up to the pool's 512 threads.
static SELECTION_SLOTS: std::sync::LazyLock<Arc<tokio::sync::Semaphore>> =
    std::sync::LazyLock::new(|| {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Arc::new(tokio::sync::Semaphore::new(cores))
    });

/// About how many objects [`select`] walks at most: the smallest index set
/// a selector names; without selectors, the page and one more, unless a
/// first page counts a namespace's range or a token without counts has the
/// rest walked to count it; otherwise the whole snapshot.
fn walk_bound(
    pred: &SelectionPredicate,
    snap: &Snapshot,
    plan_counts: Option<Option<(u64, u64)>>,
    limit: Option<usize>,
) -> usize {
    if let Some(n) = pred.smallest_index_set(snap) {
        return n;
    }
    if pred.has_selectors() {
        return snap.len();
    }
    let page = limit.map_or(snap.len(), |l| l.saturating_add(1));
    match plan_counts {
        // A first page counts the whole list: O(1) for a whole resource.
        None if pred.namespace().is_none() => page,
        None => snap.len(),
        Some(Some(_)) => page,
        Some(None) => snap.len(),
    }
}

/// A List's page from `snap`, and the counts its continue token carries.
/// remainingItemCount (lists without selectors): the first page counts the
/// whole list once (O(1) without a namespace: the snapshot holds only this
/// resource) and the token carries (total, returned), so later pages do not
/// walk the rest of the range. `plan_counts` is a continue token's counts
/// (None for a first page).
fn select(
    pred: &SelectionPredicate,
    snap: &Snapshot,
    plan_counts: Option<Option<(u64, u64)>>,
    start_key: Option<&str>,
    limit: Option<usize>,
) -> (Option<(u64, u64)>, ListPage) {
    let counts = if pred.has_selectors() {
        None
    } else {
        match plan_counts {
            Some(counts) => counts,
            None => Some((pred.count_all(snap), 0)),
        }
    };
    let walk_rest = !pred.has_selectors() && counts.is_none();
    (counts, pred.list(snap, start_key, limit, walk_rest))
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
    /// The consistency checker asks the reflector to relist.
    relist: Arc<Notify>,
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

/// The history sizing a resource's settings ask for (docs/DESIGN.md
/// section 4, "History").
pub fn history_policy(r: &ResourceConfig) -> history::HistoryPolicy {
    history::HistoryPolicy {
        fixed: r.history_capacity,
        min_age: Duration::from_secs(r.history_min_seconds),
        min_events: r.history_min_events,
        max_events: r.history_max_events,
        max_bytes: r.history_max_bytes,
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
        let codec = Arc::new(resource.object_codec(etcd_prefix));
        let cache = Arc::new(WatchCache::new(
            Arc::clone(&codec),
            resource.plural.clone(),
            history_policy(&resource),
        ));
        let progress = Arc::new(Notify::new());
        let relist = Arc::new(Notify::new());
        let shutdown = CancellationToken::new();
        let reflector = Reflector::new(
            Arc::clone(&cache),
            Arc::clone(&codec),
            storage.clone(),
            opts.clone(),
            Arc::clone(&progress),
            Arc::clone(&relist),
            shutdown.clone(),
        );
        // The reflector's handle is watched: a panic there (a bug) must not
        // leave a cache that silently stops following etcd. The cache is
        // marked failed (not ready, so /readyz says so) and its watchers end.
        let handle = tokio::spawn(reflector.run());
        let watched = Arc::clone(&cache);
        let resource_name = resource.plural.clone();
        tokio::spawn(async move {
            if let Err(e) = handle.await
                && e.is_panic()
            {
                error!(resource = %resource_name, "the reflector panicked; the cache stops serving");
                watched.fail();
            }
        });
        let cacher = Arc::new(Cacher {
            resource,
            codec,
            storage,
            opts,
            cache,
            progress,
            relist,
            shutdown,
        });
        if !cacher.opts.consistency_check_interval.is_zero() {
            tokio::spawn(consistency_checker::run(Arc::downgrade(&cacher)));
        }
        cacher
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
    /// The counters (exported to `/metrics`).
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

    /// [`Cacher::get`] when the current snapshot answers it without waiting
    /// (`resourceVersion=0`, or an RV the cache has reached); `None` when it
    /// must wait, read consistently or go to etcd: then only the async
    /// `get` can answer. Why: most Gets need no future, and the handling
    /// around a Get's lookup (its futures and the boxes that keep them
    /// small, most of all) was a sixth of its CPU.
    pub fn get_now(&self, req: &GetRequest<'_>) -> Option<Result<Arc<Object>, CacherError>> {
        if let Err(e) = self.check_open() {
            return Some(Err(e));
        }
        let plan = match plan_get(req.resource_version) {
            Ok(plan) => plan,
            Err(e) => return Some(Err(e)),
        };
        let min_rv = plan.current_at_least()?;
        self.answer_now(min_rv, &self.codec.key(req.namespace, req.name))
    }

    /// The current snapshot's answer for `key`, if the cache is ready and
    /// has reached `min_rv`.
    fn answer_now(&self, min_rv: i64, key: &str) -> Option<Result<Arc<Object>, CacherError>> {
        if !self.cache.is_ready() {
            return None;
        }
        self.cache.with_current(|snap| {
            (snap.rv >= min_rv).then(|| snap.get(key).cloned().ok_or(CacherError::NotFound))
        })
    }

    /// Get (docs/DESIGN.md section 2): unset -> most recent, 0 -> any, N -> not older than N.
    pub async fn get(&self, req: &GetRequest<'_>) -> Result<Arc<Object>, CacherError> {
        self.check_open()?;
        let plan = plan_get(req.resource_version)?;
        let key = self.codec.key(req.namespace, req.name);
        if let Some(answer) = plan
            .current_at_least()
            .and_then(|min_rv| self.answer_now(min_rv, &key))
        {
            return answer;
        }
        if !self.cache.is_ready() {
            // Not ready: Get may fall back to etcd (docs/DESIGN.md section 4).
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

    /// List (docs/DESIGN.md section 2's table).
    pub async fn list(&self, req: &ListRequest) -> Result<ListResult, CacherError> {
        self.check_open()?;
        let plan = plan_list(req, self.codec.key_prefix())?;
        if !self.cache.is_ready() {
            return Err(CacherError::NotReady);
        }
        let pred = SelectionPredicate::new(
            &self.codec,
            req.namespace.as_deref(),
            req.label_selector.clone(),
            req.field_selector.clone(),
        )
        .with_shard(req.shard_selector.clone());
        let limit = req.limit.filter(|l| *l > 0).map(|l| l as usize);
        let start_key = match &plan {
            ReadPlan::Continue { start_key, .. } => Some(start_key.as_str()),
            _ => None,
        };
        let snap = match self.snapshot_for(&plan).await {
            Ok(Some(s)) => s,
            Ok(None) => return self.list_from_etcd(&pred, 0, None, limit).await,
            Err(e @ (CacherError::Expired(_) | CacherError::TooLargeResourceVersion { .. })) => {
                // A continue token older than the retained snapshots, or from
                // an etcd-served first page the cache has not reached: etcd
                // may have that revision (else it answers Compacted -> 410).
                if let ReadPlan::Continue { rv, start_key, .. } = &plan {
                    return self
                        .list_from_etcd(&pred, *rv, Some(start_key.clone()), limit)
                        .await;
                }
                // An exact revision older than the retained snapshots: etcd
                // may still have it, as kube-apiserver's cacher delegates it
                // (else it answers Compacted -> 410).
                if let (ReadPlan::Exact(n), CacherError::Expired(_)) = (&plan, &e) {
                    return self.list_from_etcd(&pred, *n, None, limit).await;
                }
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        let list_rv = match &plan {
            ReadPlan::Exact(n) | ReadPlan::Continue { rv: n, .. } => *n,
            _ => snap.rv,
        };
        self.cache.stats().list_cache();
        if limit.is_none() && !pred.has_selectors() {
            // Everything under the prefix: walked while the body is written.
            return Ok(ListResult {
                resource_version: list_rv,
                continue_token: None,
                remaining_item_count: None,
                items: ListItems::Range {
                    snap,
                    prefix: pred.prefix().to_string(),
                    from: start_key.unwrap_or("").to_string(),
                },
                source: ListSource::Cache,
            });
        }
        let plan_counts = match &plan {
            ReadPlan::Continue { counts, .. } => Some(*counts),
            _ => None,
        };
        let (counts, page) = if walk_bound(&pred, &snap, plan_counts, limit) <= INLINE_SELECTION_MAX
        {
            select(&pred, &snap, plan_counts, start_key, limit)
        } else {
            let start_key = start_key.map(str::to_string);
            let snap = Arc::clone(&snap);
            // Held until the walk ends, even when its client has gone.
            let slot = Arc::clone(&SELECTION_SLOTS)
                .acquire_owned()
                .await
                .map_err(|_| CacherError::ShuttingDown)?;
            let selected = tokio::task::spawn_blocking(move || {
                let _slot = slot;
                select(&pred, &snap, plan_counts, start_key.as_deref(), limit)
            });
            match selected.await {
                Ok(selected) => selected,
                // A panic in the selection is the same bug inline or here.
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => return Err(CacherError::ShuttingDown),
            }
        };
        let returned = counts.map(|(total, before)| (total, before + page.items.len() as u64));
        let remaining = match returned {
            Some((total, upto)) => page
                .last_key
                .is_some()
                .then(|| total.saturating_sub(upto) as i64),
            None => page.remaining,
        };
        Ok(ListResult {
            resource_version: list_rv,
            continue_token: page
                .last_key
                .as_deref()
                .map(|k| continue_token::encode(list_rv, k, self.codec.key_prefix(), returned)),
            remaining_item_count: remaining,
            items: ListItems::Collected(page.items),
            source: ListSource::Cache,
        })
    }

    /// Watch (docs/DESIGN.md sections 2, 4, 5). A watch from an RV older than the
    /// history yields a watcher whose only item is a 410 `Error` chunk (the
    /// API sends it as an ERROR event).
    pub async fn watch(&self, req: WatchRequest) -> Result<Watcher, CacherError> {
        self.check_open()?;
        let plan = plan_watch(&req)?;
        if !self.cache.is_ready() {
            return Err(CacherError::NotReady);
        }
        let pred = SelectionPredicate::new(
            &self.codec,
            req.namespace.as_deref(),
            req.label_selector,
            req.field_selector,
        )
        .with_shard(req.shard_selector);
        let start = match plan {
            WatchPlan::Initial { read, end_bookmark } => {
                if end_bookmark {
                    self.wait_for_initial(&read).await?;
                } else {
                    self.wait_for_plan(&read).await?;
                }
                watch_cache::WatchStart::Initial { end_bookmark }
            }
            WatchPlan::FromNow { read } => {
                self.wait_for_plan(&read).await?;
                watch_cache::WatchStart::Now
            }
            // No wait for an N ahead of the cache: as in kube-apiserver, the
            // watch opens at once and sends the events after N as they
            // come (a lagging replica's client waits on an open stream, not
            // on a 504 that client-go would answer with a relist).
            WatchPlan::After(n) => watch_cache::WatchStart::After(n),
        };
        let params = watcher::WatcherParams {
            allow_bookmarks: req.allow_bookmarks,
            bookmark_interval: self.opts.bookmark_interval,
            timeout: req.timeout,
            initial_chunk: self.opts.initial_events_chunk.max(1),
        };
        Ok(Watcher::register(
            Arc::clone(&self.cache),
            pred,
            start,
            params,
        ))
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

    #[test]
    fn walk_bound_is_the_index_set_the_page_or_everything() {
        let r = crate::object::tests::resource(true, &["spec.nodeName"]);
        let c = r.object_codec("/registry");
        let mut snap = Snapshot::empty(1, 0);
        let app = |i: usize| if i < 10 { "x" } else { "y" };
        for o in crate::object::tests::labelled(&c, 100, app) {
            let key = Arc::clone(&o.key);
            snap.apply(&key, Some(o), c.index_paths());
        }
        let pred = |ns: Option<&str>, label: &str| {
            SelectionPredicate::new(
                &c,
                ns,
                LabelSelector::parse(label).expect("label selector"),
                FieldSelector::default(),
            )
        };
        let page = Some(5);
        // An exact label term: its index set, or nothing.
        assert_eq!(walk_bound(&pred(None, "app=x"), &snap, None, page), 10);
        assert_eq!(walk_bound(&pred(None, "app=z"), &snap, None, page), 0);
        // A term no index answers: everything.
        assert_eq!(walk_bound(&pred(None, "app!=x"), &snap, None, page), 100);
        // No selectors: the page and one more, when the count is free (a
        // whole resource) or carried by the token.
        assert_eq!(walk_bound(&pred(None, ""), &snap, None, page), 6);
        let ns = pred(Some("a"), "");
        assert_eq!(walk_bound(&ns, &snap, Some(Some((100, 5))), page), 6);
        // A first page counts its namespace; a token without counts has the
        // rest walked to count it.
        assert_eq!(walk_bound(&ns, &snap, None, page), 100);
        assert_eq!(walk_bound(&ns, &snap, Some(None), page), 100);
    }
}

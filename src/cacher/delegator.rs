//! The delegator: serves a [`ReadPlan`] from the cache or from etcd
//! (Kubernetes' `cacher/delegator`): consistent reads wait (bounded) for the
//! cache to reach etcd's current revision and otherwise go to etcd; "not
//! older than N" waits or answers 504; exact reads use a retained snapshot
//! or answer 410; continue tokens older than the retained snapshots are
//! served by etcd at their revision.

use std::sync::Arc;

use tracing::debug;

use super::read_plan::ReadPlan;
use super::selection_predicate::SelectionPredicate;
use super::snapshot::Snapshot;
use super::{Cacher, CacherError, ListItems, ListResult, ListSource, continue_token};
use crate::object::Object;
use crate::storage::{ListOptions, StorageError};

impl Cacher {
    /// Waits (bounded) until the cache has caught up with etcd's current
    /// revision. Ok(true): caught up; Ok(false): timed out.
    pub(super) async fn wait_fresh(&self) -> Result<bool, CacherError> {
        let rev = self.storage.fresh_revision().await?;
        Ok(self.wait_for_rv(rev).await)
    }

    /// Waits (bounded) until the cache RV reaches `rv`, asking etcd for a
    /// progress notification so an idle resource catches up too.
    pub(super) async fn wait_for_rv(&self, rv: i64) -> bool {
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
    pub(super) async fn snapshot_for(
        &self,
        plan: &ReadPlan,
    ) -> Result<Option<Arc<Snapshot>>, CacherError> {
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

    pub(super) async fn get_from_etcd(
        &self,
        key: &str,
        revision: i64,
    ) -> Result<Arc<Object>, CacherError> {
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

    /// The etcd fallback of a List: read everything under the (namespace)
    /// prefix at `revision` (0 = latest) and filter like the cache does.
    pub(super) async fn list_from_etcd(
        &self,
        pred: &SelectionPredicate,
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
        let prefix = pred.prefix();
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
                return Err(CacherError::Expired(match start_key {
                    Some(_) => format!(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter. (resource version {requested})"
                    ),
                    // kube-apiserver's etcd3 store, for an exact revision.
                    None => "The resourceVersion for the provided list is too old.".to_string(),
                }));
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
        let page = pred.page(objects.iter(), limit, !pred.has_selectors());
        self.cache.stats().list_etcd();
        Ok(ListResult {
            resource_version: all.revision,
            continue_token: page
                .last_key
                .as_deref()
                .map(|k| continue_token::encode(all.revision, k, self.codec.key_prefix(), None)),
            remaining_item_count: page.remaining,
            items: ListItems::Collected(page.items),
            source: ListSource::Etcd,
        })
    }

    /// The wait of a watch whose initial events end with a bookmark
    /// (`sendInitialEvents=true`): that bookmark tells the client it has a
    /// consistent list, so unlike [`Cacher::wait_for_plan`] a cache that
    /// does not catch up with etcd in time is an error (504), as in
    /// kube-apiserver, never a stale state marked complete.
    pub(super) async fn wait_for_initial(&self, read: &ReadPlan) -> Result<(), CacherError> {
        if let ReadPlan::MostRecent = read {
            let rev = self.storage.fresh_revision().await?;
            if !self.wait_for_rv(rev).await {
                return Err(CacherError::TooLargeResourceVersion {
                    requested: rev,
                    current: self.cache.resource_version(),
                });
            }
            return Ok(());
        }
        self.wait_for_plan(read).await
    }

    /// The wait a watch's starting point needs: consistent (bounded, then
    /// start from what the cache has), any, or not older than N (504).
    pub(super) async fn wait_for_plan(&self, read: &ReadPlan) -> Result<(), CacherError> {
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

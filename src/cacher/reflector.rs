//! `Reflector`: keeps a [`WatchCache`] in step with one etcd prefix
//! (docs/DESIGN.md section 4).
//!
//! List in pages at one revision, then watch from list RV+1 (prev_kv,
//! progress notify) on its own watch stream. A broken stream resumes from
//! the last applied RV with exponential backoff and jitter; a compacted one
//! relists and turns the difference into events so watchers are made whole.
//! A silent stream is asked for progress, then restarted.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use super::CacherOptions;
use super::watch_cache::{Change, WatchCache};
use crate::backoff::Backoff;
use crate::object::{Object, ObjectCodec};
use crate::storage::{ListOptions, Storage, StorageError, WatchEvent, WatchItem};

const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Why a watch stream ended.
/// The least time between two progress requests for readers (kube-apiserver's
/// `progressRequestPeriod`): under load nearly every consistent read finds
/// the cache a little behind etcd and asks.
const PROGRESS_REQUEST_PERIOD: Duration = Duration::from_millis(100);

enum StreamEnd {
    Shutdown,
    /// etcd compacted past our RV: relist.
    Compacted(i64),
    /// Transient: resume from the last applied RV after a backoff.
    Error(String),
    /// Silent even after a progress request: restart after a backoff.
    Idle,
    /// Asked to relist (the consistency checker found a difference).
    Relist,
}

pub struct Reflector {
    cache: Arc<WatchCache>,
    codec: Arc<ObjectCodec>,
    storage: Storage,
    opts: CacherOptions,
    progress: Arc<Notify>,
    relist: Arc<Notify>,
    shutdown: CancellationToken,
    /// Keys whose undecodable value was already logged (logged once per key).
    logged_bad: HashSet<String>,
}

impl Reflector {
    pub(crate) fn new(
        cache: Arc<WatchCache>,
        codec: Arc<ObjectCodec>,
        storage: Storage,
        opts: CacherOptions,
        progress: Arc<Notify>,
        relist: Arc<Notify>,
        shutdown: CancellationToken,
    ) -> Reflector {
        Reflector {
            cache,
            codec,
            storage,
            opts,
            progress,
            relist,
            shutdown,
            logged_bad: HashSet::new(),
        }
    }

    /// The reflector loop; returns on shutdown.
    pub async fn run(mut self) {
        let span = info_span!("reflector", resource = %self.cache.resource());
        async move {
            let mut backoff = Backoff::new(BACKOFF_START, BACKOFF_MAX).with_jitter();
            let mut need_list = true;
            let mut last_rv = 0i64;
            loop {
                if self.shutdown.is_cancelled() {
                    info!("reflector stopped");
                    return;
                }
                if need_list {
                    info!(relist = self.cache.is_ready(), "listing");
                    let started = Instant::now();
                    match self.list().await {
                        Ok((objects, rv)) => {
                            let count = objects.len();
                            if self.cache.is_ready() {
                                let changes = self.cache.diff(objects, rv);
                                info!(rv, objects = count, changes = changes.len(), "relisted; differences sent as events");
                                self.cache.apply(changes, rv, true);
                                self.cache.stats().initialized(started.elapsed(), true);
                            } else {
                                self.cache.init(objects, rv);
                                self.cache.stats().initialized(started.elapsed(), false);
                                info!(rv, objects = count, took_ms = started.elapsed().as_millis() as u64, "initialized; ready");
                            }
                            last_rv = rv;
                            need_list = false;
                            backoff.reset();
                        }
                        Err(e) => {
                            let wait = backoff.step();
                            warn!(error = %e, backoff_ms = wait.as_millis() as u64, "list failed; backing off");
                            if self.sleep(wait).await {
                                return;
                            }
                            continue;
                        }
                    }
                }
                match self.watch(&mut last_rv, &mut backoff).await {
                    StreamEnd::Shutdown => {
                        info!("reflector stopped");
                        return;
                    }
                    StreamEnd::Compacted(compacted) => {
                        info!(last_rv, compacted, "watch compacted; relisting");
                        need_list = true;
                    }
                    StreamEnd::Relist => {
                        info!(last_rv, "relisting on request");
                        need_list = true;
                    }
                    end @ (StreamEnd::Error(_) | StreamEnd::Idle) => {
                        let reason = match end {
                            StreamEnd::Error(reason) => {
                                self.cache.stats().watch_restart();
                                reason
                            }
                            _ => "idle".to_string(),
                        };
                        let wait = backoff.step();
                        info!(%reason, last_rv, backoff_ms = wait.as_millis() as u64, "watch ended; backing off, then resuming");
                        if self.sleep(wait).await {
                            return;
                        }
                    }
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Sleeps unless shut down first; true = shut down.
    async fn sleep(&self, d: Duration) -> bool {
        tokio::select! {
            _ = self.shutdown.cancelled() => true,
            _ = tokio::time::sleep(d) => false,
        }
    }

    /// The whole prefix, paged, at one revision; undecodable values skipped.
    async fn list(&mut self) -> Result<(Vec<Arc<Object>>, i64), StorageError> {
        let all = self
            .storage
            .list_all(
                self.codec.key_prefix(),
                &ListOptions {
                    limit: self.opts.list_page_size.max(1),
                    ..ListOptions::default()
                },
            )
            .await?;
        // Keys whose value the transformer rejects (or that are not UTF-8)
        // are skipped like undecodable values, as the watch path does.
        for u in &all.unreadable {
            self.skip(&u.key, &u.error);
        }
        let mut out = Vec::with_capacity(all.items.len());
        for it in all.items {
            if let Some(o) = self.decode(&it.key, &it.value, it.mod_revision, it.create_revision) {
                out.push(Arc::new(o));
            }
        }
        Ok((out, all.revision))
    }

    fn decode(&mut self, key: &str, value: &[u8], mod_rev: i64, create_rev: i64) -> Option<Object> {
        match self.codec.decode(key, value, mod_rev, create_rev) {
            Ok(o) => {
                if !self.logged_bad.is_empty() {
                    self.logged_bad.remove(key);
                }
                Some(o)
            }
            Err(e) => {
                self.skip(key, &e);
                None
            }
        }
    }

    /// Counts a skipped value and logs it once per key.
    fn skip(&mut self, key: &str, error: &dyn std::fmt::Display) {
        self.cache.stats().decode_error();
        if self.logged_bad.insert(key.to_string()) {
            warn!(key, error = %error, "skipping undecodable value");
        }
    }

    /// One watch stream from `last_rv + 1`, applying events until it ends.
    async fn watch(&mut self, last_rv: &mut i64, backoff: &mut Backoff) -> StreamEnd {
        let created = tokio::select! {
            _ = self.shutdown.cancelled() => return StreamEnd::Shutdown,
            r = self.storage.watch(self.codec.key_prefix(), *last_rv + 1) => r,
        };
        let mut watch = match created {
            Ok(w) => w,
            Err(e) => return StreamEnd::Error(format!("watch create: {e}")),
        };
        info!(from = *last_rv + 1, "watching");
        let mut last_msg = Instant::now();
        let mut progress_requested: Option<Instant> = None;
        // When the last progress request went out, and when a reader's is
        // due: readers ask at most once per PROGRESS_REQUEST_PERIOD (as
        // kube-apiserver's progress requester), however many there are.
        let mut progress_sent: Option<Instant> = None;
        let mut progress_due: Option<Instant> = None;
        loop {
            let idle_at = match progress_requested {
                None => last_msg + self.opts.progress_interval,
                Some(t) => t + self.opts.idle_timeout,
            };
            let due = async {
                match progress_due {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.shutdown.cancelled() => return StreamEnd::Shutdown,
                _ = self.relist.notified() => return StreamEnd::Relist,
                _ = self.progress.notified(), if progress_due.is_none() => {
                    let now = Instant::now();
                    progress_due = Some(progress_sent.map_or(now, |t| (t + PROGRESS_REQUEST_PERIOD).max(now)));
                }
                _ = due => {
                    progress_due = None;
                    if let Err(e) = watch.request_progress().await {
                        return StreamEnd::Error(format!("progress request: {e}"));
                    }
                    self.cache.stats().progress_request();
                    let now = Instant::now();
                    progress_sent = Some(now);
                    progress_requested.get_or_insert(now);
                }
                _ = tokio::time::sleep_until(idle_at) => {
                    if progress_requested.is_some() {
                        warn!(idle_ms = self.opts.idle_timeout.as_millis() as u64, "watch silent even after a progress request; restarting it");
                        self.cache.stats().idle_restart();
                        return StreamEnd::Idle;
                    }
                    debug!("watch idle; requesting progress");
                    if let Err(e) = watch.request_progress().await {
                        return StreamEnd::Error(format!("progress request: {e}"));
                    }
                    self.cache.stats().progress_request();
                    let now = Instant::now();
                    progress_sent = Some(now);
                    progress_requested = Some(now);
                }
                item = watch.next() => {
                    let item = match item {
                        Ok(item) => item,
                        Err(StorageError::Compacted { compacted, .. }) => {
                            return StreamEnd::Compacted(compacted);
                        }
                        Err(e) => return StreamEnd::Error(e.to_string()),
                    };
                    last_msg = Instant::now();
                    progress_requested = None;
                    backoff.reset();
                    if let Some(end) = self.take(item, last_rv) {
                        return end;
                    }
                }
            }
        }
    }

    /// Applies one watch item to the cache; `Some` ends the stream.
    fn take(&mut self, item: WatchItem, last_rv: &mut i64) -> Option<StreamEnd> {
        match item {
            WatchItem::Progress { revision } => {
                if revision > *last_rv {
                    self.cache.advance(revision);
                    *last_rv = revision;
                }
            }
            WatchItem::Events { events, revision } => {
                if revision <= *last_rv {
                    // Events at or below what the cache already claims to
                    // hold: an etcd whose progress answer overtook them
                    // (etcd before 3.5.13, etcd#17507). Dropping them would
                    // leave the cache wrong; relisting repairs it.
                    warn!(
                        revision,
                        last_rv = *last_rv,
                        "watch events older than the cache's revision; relisting"
                    );
                    return Some(StreamEnd::Relist);
                }
                let changes = self.changes(events);
                self.cache.apply(changes, revision, false);
                *last_rv = revision;
            }
        }
        None
    }

    /// Turns watch events into cache changes, decoding each value once.
    fn changes(&mut self, events: Vec<WatchEvent>) -> Vec<Change> {
        let mut out = Vec::with_capacity(events.len());
        for ev in events {
            match ev {
                WatchEvent::Delete { key, mod_revision } => {
                    self.logged_bad.remove(&key);
                    out.push(Change {
                        key: Arc::from(key),
                        new: None,
                        rv: mod_revision,
                    });
                }
                WatchEvent::Put {
                    key,
                    value,
                    mod_revision,
                    create_revision,
                } => {
                    let obj = self.decode(&key, &value, mod_revision, create_revision);
                    // An undecodable new value removes the old object (if
                    // any) so the cache never serves a stale version.
                    out.push(Change {
                        key: Arc::from(key),
                        new: obj.map(Arc::new),
                        rv: mod_revision,
                    });
                }
                WatchEvent::Unreadable {
                    unreadable,
                    mod_revision,
                } => {
                    self.skip(&unreadable.key, &unreadable.error);
                    out.push(Change {
                        key: Arc::from(unreadable.key),
                        new: None,
                        rv: mod_revision,
                    });
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EtcdConfig;

    fn put(codec: &ObjectCodec, name: &str, rev: i64) -> WatchEvent {
        WatchEvent::Put {
            key: codec.key(Some("ns"), name),
            value: bytes::Bytes::from(format!(
                r#"{{"metadata":{{"name":"{name}","namespace":"ns"}}}}"#
            )),
            mod_revision: rev,
            create_revision: rev,
        }
    }

    /// Events older than a progress answer (etcd before 3.5.13 could send
    /// them so) end the stream for a relist; they are never dropped while
    /// the cache claims their revision.
    #[tokio::test]
    async fn events_behind_the_cache_end_the_stream_for_a_relist() {
        let r = crate::object::tests::resource(true, &[]);
        let codec = Arc::new(r.object_codec("/registry"));
        let cache = Arc::new(WatchCache::new(Arc::clone(&codec), "pods".into(), 100));
        cache.init(Vec::new(), 10);
        // Never dialled: the client is lazy.
        let storage = Storage::connect(&EtcdConfig {
            endpoints: vec!["http://127.0.0.1:1".to_string()],
            ..EtcdConfig::default()
        })
        .await
        .expect("lazy etcd client");
        let mut reflector = Reflector::new(
            Arc::clone(&cache),
            Arc::clone(&codec),
            storage,
            CacherOptions::default(),
            Arc::new(Notify::new()),
            Arc::new(Notify::new()),
            CancellationToken::new(),
        );
        let mut last_rv = 10;
        let events = |name, rev| WatchItem::Events {
            events: vec![put(&codec, name, rev)],
            revision: rev,
        };
        assert!(reflector.take(events("a", 11), &mut last_rv).is_none());
        assert!(
            reflector
                .take(WatchItem::Progress { revision: 20 }, &mut last_rv)
                .is_none()
        );
        assert_eq!(cache.resource_version(), 20);
        assert!(matches!(
            reflector.take(events("b", 19), &mut last_rv),
            Some(StreamEnd::Relist)
        ));
        assert_eq!(last_rv, 20);
        assert!(reflector.take(events("c", 21), &mut last_rv).is_none());
        assert_eq!((cache.resource_version(), last_rv), (21, 21));
        assert_eq!(cache.current().len(), 2, "a and c");
    }
}

//! `Reflector`: keeps a [`WatchCache`] in step with one etcd prefix
//! (DESIGN.md section 4).
//!
//! List in pages at one revision, then watch from list RV+1 (prev_kv,
//! progress notify) on its own watch stream. A broken stream resumes from
//! the last applied RV with exponential backoff and jitter; a compacted one
//! relists and turns the difference into events so watchers are made whole.
//! A silent stream is asked for progress, then restarted.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use etcd_client::{EventType as EtcdEventType, WatchOptions};
use rand::Rng;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use super::CacherOptions;
use super::watch_cache::{Change, WatchCache};
use crate::object::{Object, ObjectCodec};
use crate::storage::{ListOptions, Storage};

const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Exponential backoff with +-50% jitter.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Backoff {
    fn new() -> Backoff {
        Backoff {
            next: BACKOFF_START,
        }
    }
    fn reset(&mut self) {
        self.next = BACKOFF_START;
    }
    fn step(&mut self) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        let jitter = rand::rng().random_range(0.5..1.5);
        base.mul_f64(jitter)
    }
}

/// Why a watch stream ended.
enum WatchEnd {
    Shutdown,
    /// etcd compacted past our RV: relist.
    Compacted(i64),
    /// Transient: resume from the last applied RV after a backoff.
    Error(String),
}

pub struct Reflector {
    cache: Arc<WatchCache>,
    codec: Arc<ObjectCodec>,
    storage: Storage,
    opts: CacherOptions,
    progress: Arc<Notify>,
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
        shutdown: CancellationToken,
    ) -> Reflector {
        Reflector {
            cache,
            codec,
            storage,
            opts,
            progress,
            shutdown,
            logged_bad: HashSet::new(),
        }
    }

    /// The reflector loop; returns on shutdown.
    pub async fn run(mut self) {
        let span = info_span!("reflector", resource = %self.cache.resource());
        async move {
            let mut backoff = Backoff::new();
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
                    WatchEnd::Shutdown => {
                        info!("reflector stopped");
                        return;
                    }
                    WatchEnd::Compacted(compacted) => {
                        info!(last_rv, compacted, "watch compacted; relisting");
                        need_list = true;
                    }
                    WatchEnd::Error(reason) => {
                        self.cache
                            .stats()
                            .watch_restarts
                            .fetch_add(1, Ordering::Relaxed);
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
    async fn list(&mut self) -> Result<(Vec<Arc<Object>>, i64), crate::storage::StorageError> {
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
    async fn watch(&mut self, last_rv: &mut i64, backoff: &mut Backoff) -> WatchEnd {
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(*last_rv + 1)
            .with_prev_key()
            .with_progress_notify();
        let mut client = self.storage.watch_client();
        let prefix = self.codec.key_prefix().to_string();
        let created = tokio::select! {
            _ = self.shutdown.cancelled() => return WatchEnd::Shutdown,
            r = tokio::time::timeout(self.storage.request_timeout(), client.watch(prefix, Some(opts))) => r,
        };
        let stream = match created {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return WatchEnd::Error(format!("watch create: {e}")),
            Err(_) => return WatchEnd::Error("watch create timed out".into()),
        };
        let (mut requests, mut responses) = stream.split();
        info!(from = *last_rv + 1, "watching");
        let mut last_msg = Instant::now();
        let mut progress_requested: Option<Instant> = None;
        loop {
            let idle_at = match progress_requested {
                None => last_msg + self.opts.progress_interval,
                Some(t) => t + self.opts.idle_timeout,
            };
            tokio::select! {
                _ = self.shutdown.cancelled() => return WatchEnd::Shutdown,
                _ = self.progress.notified() => {
                    if let Err(e) = requests.request_progress().await {
                        return WatchEnd::Error(format!("progress request: {e}"));
                    }
                    progress_requested.get_or_insert_with(Instant::now);
                }
                _ = tokio::time::sleep_until(idle_at) => {
                    if progress_requested.is_some() {
                        warn!(idle_ms = self.opts.idle_timeout.as_millis() as u64, "watch silent even after a progress request; restarting it");
                        self.cache.stats().idle_restarts.fetch_add(1, Ordering::Relaxed);
                        return WatchEnd::Error("idle".into());
                    }
                    debug!("watch idle; requesting progress");
                    if let Err(e) = requests.request_progress().await {
                        return WatchEnd::Error(format!("progress request: {e}"));
                    }
                    progress_requested = Some(Instant::now());
                }
                msg = responses.message() => {
                    let resp = match msg {
                        Ok(Some(r)) => r,
                        Ok(None) => return WatchEnd::Error("watch stream closed".into()),
                        Err(e) => return WatchEnd::Error(format!("watch stream: {e}")),
                    };
                    last_msg = Instant::now();
                    progress_requested = None;
                    backoff.reset();
                    if resp.canceled() {
                        if resp.compact_revision() > 0 {
                            return WatchEnd::Compacted(resp.compact_revision());
                        }
                        return WatchEnd::Error(format!("watch canceled: {}", resp.cancel_reason()));
                    }
                    if resp.created() && resp.events().is_empty() {
                        // The creation header's revision does not mean the
                        // events up to it have been sent: ignore it.
                        continue;
                    }
                    if resp.events().is_empty() {
                        // A progress notification: every event up to this
                        // revision has been delivered.
                        if let Some(rev) = resp.header().map(|h| h.revision())
                            && rev > *last_rv
                        {
                            self.cache.advance(rev);
                            *last_rv = rev;
                        }
                        continue;
                    }
                    let (changes, rv) = self.changes(resp.events());
                    if rv > *last_rv {
                        self.cache.apply(changes, rv, false);
                        *last_rv = rv;
                    }
                }
            }
        }
    }

    /// Turns etcd events into cache changes; returns them and the highest revision.
    fn changes(&mut self, events: &[etcd_client::Event]) -> (Vec<Change>, i64) {
        let mut out = Vec::with_capacity(events.len());
        let mut max_rv = 0;
        let transformer = Arc::clone(self.storage.transformer());
        for ev in events {
            let Some(kv) = ev.kv() else { continue };
            let rv = kv.mod_revision();
            max_rv = max_rv.max(rv);
            let Ok(key) = kv.key_str() else {
                self.cache.stats().decode_error();
                continue;
            };
            let key: Arc<str> = Arc::from(key);
            match ev.event_type() {
                EtcdEventType::Delete => {
                    self.logged_bad.remove(&*key);
                    out.push(Change { key, new: None, rv });
                }
                EtcdEventType::Put => {
                    let value =
                        match transformer.from_storage(&key, Bytes::copy_from_slice(kv.value())) {
                            Ok(v) => Some(v),
                            Err(e) => {
                                self.skip(&key, &e);
                                None
                            }
                        };
                    let obj = value.and_then(|v| {
                        self.decode(&key, &v, kv.mod_revision(), kv.create_revision())
                    });
                    // An undecodable new value removes the old object (if
                    // any) so the cache never serves a stale version.
                    out.push(Change {
                        key,
                        new: obj.map(Arc::new),
                        rv,
                    });
                }
            }
        }
        (out, max_rv)
    }
}

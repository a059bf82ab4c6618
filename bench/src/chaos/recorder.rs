//! etcd's own history of the chaos namespace, for the checker: a range at
//! the base revision, then a plain etcd watch from the next revision, resumed
//! from the last revision it saw whenever etcd is stopped, killed or
//! restarted. It talks to etcd directly (never through the daemon or the
//! bench's cuttable proxy) and shares no code with the cache. With several
//! members it watches one at a time and moves to the next when its stream
//! breaks or stays silent (a stopped or cut-off member).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use etcd_client::{Client, ConnectOptions, EventType, GetOptions, WatchOptions};
use parking_lot::Mutex;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::checker::{Change, History, State};

#[derive(Default)]
struct Shared {
    history: History,
    /// Every event up to this revision has been recorded.
    progress: i64,
    /// A fatal error (e.g. the history was compacted before we read it).
    error: Option<String>,
}

/// The running recorder.
pub struct Recorder {
    shared: Arc<Mutex<Shared>>,
    /// Asks the watch task for a progress notification.
    poke: Arc<tokio::sync::Notify>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
    /// The endpoint (index) the watch is on now.
    member: Arc<AtomicUsize>,
}

/// An object's name below `prefix`, and its value as JSON.
fn parse_kv(prefix: &str, key: &[u8], value: &[u8]) -> Option<(String, Value)> {
    let name = std::str::from_utf8(key)
        .ok()?
        .strip_prefix(prefix)?
        .to_string();
    let v = serde_json::from_slice(value).unwrap_or(Value::Null);
    Some((name, v))
}

impl Recorder {
    /// Reads the state of `prefix` at `base_rev` and starts recording every
    /// change after it.
    pub async fn start(endpoints: &[String], prefix: &str, base_rev: i64) -> Result<Recorder> {
        let client = crate::env::etcd_connect_all(endpoints).await?;
        let mut kv = client.kv_client();
        let r = kv
            .get(
                prefix,
                Some(GetOptions::new().with_prefix().with_revision(base_rev)),
            )
            .await
            .context("recorder: reading the base state")?;
        let mut base = State::new();
        for kv in r.kvs() {
            if let Some((name, v)) = parse_kv(prefix, kv.key(), kv.value()) {
                base.insert(name, (kv.mod_revision(), v));
            }
        }
        let shared = Arc::new(Mutex::new(Shared {
            history: History {
                base_rev,
                base,
                changes: Vec::new(),
            },
            progress: base_rev,
            error: None,
        }));
        let poke = Arc::new(tokio::sync::Notify::new());
        let cancel = CancellationToken::new();
        let member = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(record(
            endpoints.to_vec(),
            prefix.to_string(),
            shared.clone(),
            poke.clone(),
            cancel.clone(),
            member.clone(),
        ));
        Ok(Recorder {
            shared,
            poke,
            cancel,
            task,
            member,
        })
    }

    /// The index of the endpoint the recorder watches now.
    pub fn member(&self) -> usize {
        self.member.load(Ordering::Relaxed)
    }

    /// Waits until every change up to `rev` is recorded.
    pub async fn wait_for(&self, rev: i64, timeout: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            {
                let s = self.shared.lock();
                if let Some(e) = &s.error {
                    bail!("recorder: {e}");
                }
                if s.progress >= rev {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "recorder: history recorded up to {} only, wanted {rev}",
                    self.shared.lock().progress
                );
            }
            self.poke.notify_one();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops recording and returns the history.
    pub async fn finish(self) -> Result<History> {
        self.cancel.cancel();
        let _ = self.task.await;
        let s = Arc::try_unwrap(self.shared)
            .map_err(|_| anyhow!("recorder still shared"))?
            .into_inner();
        if let Some(e) = s.error {
            bail!("recorder: {e}");
        }
        Ok(s.history)
    }
}

async fn record(
    endpoints: Vec<String>,
    prefix: String,
    shared: Arc<Mutex<Shared>>,
    poke: Arc<tokio::sync::Notify>,
    cancel: CancellationToken,
    member: Arc<AtomicUsize>,
) {
    let mut next = 0usize;
    loop {
        let from = shared.lock().progress + 1;
        let i = next % endpoints.len().max(1);
        member.store(i, Ordering::Relaxed);
        let endpoint = endpoints.get(i).cloned().unwrap_or_default();
        let r = tokio::select! {
            _ = cancel.cancelled() => return,
            r = watch_once(&endpoint, &prefix, from, &shared, &poke) => r,
        };
        match r {
            Ok(()) => {}
            Err(WatchError::Fatal(e)) => {
                shared.lock().error = Some(e);
                return;
            }
            Err(WatchError::Retry(_)) => next += 1,
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

enum WatchError {
    Retry(#[allow(dead_code)] String),
    Fatal(String),
}

/// One watch stream from `from` until it breaks.
async fn watch_once(
    endpoint: &str,
    prefix: &str,
    from: i64,
    shared: &Mutex<Shared>,
    poke: &tokio::sync::Notify,
) -> Result<(), WatchError> {
    let retry = |e: String| WatchError::Retry(e);
    // Require a leader: a member cut off the others ends the watch (etcd's
    // "no leader") rather than keeping it open with nothing new.
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_require_leader(true);
    let client = tokio::time::timeout(
        Duration::from_secs(5),
        Client::connect([endpoint], Some(opts)),
    )
    .await
    .map_err(|_| retry("connect timed out".into()))?
    .map_err(|e| retry(e.to_string()))?;
    let mut wc = client
        .watch_client()
        .max_decoding_message_size(i32::MAX as usize);
    let opts = WatchOptions::new()
        .with_prefix()
        .with_start_revision(from)
        .with_progress_notify();
    let mut stream = tokio::time::timeout(Duration::from_secs(5), wc.watch(prefix, Some(opts)))
        .await
        .map_err(|_| retry("watch create timed out".into()))?
        .map_err(|e| retry(e.to_string()))?;
    // A member that is stopped, or cut off the others, answers nothing or
    // nothing new: leave it when it has said nothing for 6 s (progress is
    // asked for every 2 s).
    let mut last_msg = tokio::time::Instant::now();
    loop {
        let msg = tokio::select! {
            m = stream.message() => m,
            _ = tokio::time::sleep_until(last_msg + Duration::from_secs(6)) => {
                return Err(retry("watch silent".into()));
            }
            _ = poke.notified() => {
                stream.request_progress().await.map_err(|e| retry(e.to_string()))?;
                continue;
            }
            // A stopped etcd says nothing: ask again now and then.
            _ = tokio::time::sleep(Duration::from_secs(2)) => {
                stream.request_progress().await.map_err(|e| retry(e.to_string()))?;
                continue;
            }
        };
        let resp = match msg {
            Ok(Some(r)) => {
                last_msg = tokio::time::Instant::now();
                r
            }
            Ok(None) => return Err(retry("watch closed".into())),
            Err(e) => return Err(retry(e.to_string())),
        };
        if resp.canceled() {
            if resp.compact_revision() > 0 {
                return Err(WatchError::Fatal(format!(
                    "etcd compacted revision {} before the recorder read it",
                    resp.compact_revision()
                )));
            }
            return Err(retry(format!("watch canceled: {}", resp.cancel_reason())));
        }
        let header_rev = resp.header().map(|h| h.revision()).unwrap_or(0);
        let mut s = shared.lock();
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            let Some((name, v)) = parse_kv(prefix, kv.key(), kv.value()) else {
                continue;
            };
            let rev = kv.mod_revision();
            if rev <= s.progress {
                continue; // already recorded (a resumed stream)
            }
            let value = match ev.event_type() {
                EventType::Put => Some(v),
                EventType::Delete => None,
            };
            s.history.changes.push(Change { rev, name, value });
        }
        if let Some(last) = resp.events().last().and_then(|e| e.kv()) {
            s.progress = s.progress.max(last.mod_revision());
        }
        // A creation header does not say earlier events were sent; a
        // progress notification (no events) does.
        if resp.events().is_empty() && !resp.created() {
            s.progress = s.progress.max(header_rev);
        }
    }
}

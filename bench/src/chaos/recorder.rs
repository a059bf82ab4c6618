//! etcd's own history of the chaos namespace, for the checker: a range at
//! the base revision, then a plain etcd watch from the next revision, resumed
//! from the last revision it saw whenever etcd is stopped, killed or
//! restarted. It talks to etcd directly (never through the daemon or the
//! bench's cuttable proxy) and shares no code with the cache.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use etcd_client::{EventType, GetOptions, WatchOptions};
use parking_lot::Mutex;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::checker::{Change, History, State};
use crate::env::etcd_connect;

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
    pub async fn start(endpoint: &str, prefix: &str, base_rev: i64) -> Result<Recorder> {
        let client = etcd_connect(endpoint).await?;
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
        let task = tokio::spawn(record(
            endpoint.to_string(),
            prefix.to_string(),
            shared.clone(),
            poke.clone(),
            cancel.clone(),
        ));
        Ok(Recorder {
            shared,
            poke,
            cancel,
            task,
        })
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
    endpoint: String,
    prefix: String,
    shared: Arc<Mutex<Shared>>,
    poke: Arc<tokio::sync::Notify>,
    cancel: CancellationToken,
) {
    loop {
        let from = shared.lock().progress + 1;
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
            Err(WatchError::Retry(_)) => {}
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
    let client = tokio::time::timeout(Duration::from_secs(5), etcd_connect(endpoint))
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
    loop {
        let msg = tokio::select! {
            m = stream.message() => m,
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
            Ok(Some(r)) => r,
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

//! W watchers on one namespace, on the proxy (HTTP watch) or on etcd directly
//! (etcd watch streams over C connections). Each watcher records the
//! revisions it received (for the lost/duplicate check) and the delivery
//! latency of every event (receipt time - `spec.writeTs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Result, anyhow};
use etcd_client::{Client, WatchOptions};
use hdrhistogram::Histogram;
use http_body_util::BodyExt;
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use watchcache::object::wire::EventType;

use crate::http::{Conn, Pool};
use crate::report::new_histogram;
use crate::wire::{
    EventInfo, FrameSplitter, LineSplitter, extract_write_ts, now_nanos, parse_watch_frame,
    parse_watch_line,
};

const SHARDS: usize = 16;
const FLUSH_EVERY: usize = 256;

/// State shared by all watchers of a set.
pub struct Shared {
    pub established: AtomicUsize,
    pub failed: AtomicUsize,
    pub deliveries: AtomicU64,
    /// Streams the server ended that a resuming watcher opened again.
    pub resumed: AtomicU64,
    /// Last revision each watcher has seen.
    pub last_rev: Vec<AtomicI64>,
    hist: Vec<Mutex<Histogram<u64>>>,
    pub cancel: CancellationToken,
}

impl Shared {
    fn record(&self, watcher: usize, lat_us: &mut Vec<u64>) {
        if lat_us.is_empty() {
            return;
        }
        let mut h = self.hist[watcher % SHARDS].lock();
        for v in lat_us.drain(..) {
            h.saturating_record(v.max(1));
        }
    }

    /// All latencies recorded so far, merged.
    pub fn histogram(&self) -> Histogram<u64> {
        let mut all = new_histogram();
        for h in &self.hist {
            let _ = all.add(&*h.lock());
        }
        all
    }

    /// Number of live (not failed) watchers whose last revision is below `rev`.
    pub fn behind(&self, rev: i64, outcomes_failed: &[bool]) -> usize {
        self.last_rev
            .iter()
            .enumerate()
            .filter(|(i, r)| {
                !outcomes_failed.get(*i).copied().unwrap_or(false)
                    && r.load(Ordering::Relaxed) < rev
            })
            .count()
    }
}

/// What one watcher saw.
#[derive(Debug, Default)]
pub struct Outcome {
    pub revs: Vec<i64>,
    pub error: Option<String>,
    pub established: bool,
}

/// A running set of watchers.
pub struct WatcherSet {
    pub shared: Arc<Shared>,
    pub failed_flags: Arc<Vec<std::sync::atomic::AtomicBool>>,
    /// Each task reports (watcher index, outcome) for the watchers it ran.
    handles: Vec<JoinHandle<Vec<(usize, Outcome)>>>,
    n: usize,
    pub connections: usize,
}

/// Where the watchers connect.
pub enum WatchTarget<'a> {
    /// HTTP watch on the proxy (or kube-apiserver), watchers spread over
    /// the pool's connections; `protobuf`: the pool asks for protobuf and
    /// the stream is read as length-prefixed frames.
    Proxy {
        pool: &'a Pool,
        path: String,
        protobuf: bool,
        /// Open a stream the server ends again from the last
        /// resourceVersion seen (client-go's reflector).
        resume: bool,
    },
    /// etcd watches, spread over these clients (one connection each): one
    /// gRPC watch stream per watcher, or (`mux`) one stream per connection
    /// carrying all its watchers, as Go's clientv3 does.
    Etcd {
        clients: &'a [Client],
        prefix: String,
        mux: bool,
    },
}

impl WatcherSet {
    /// Starts `n` watchers that receive every event after revision `r0`.
    pub async fn start(target: WatchTarget<'_>, n: usize, r0: i64) -> Result<WatcherSet> {
        let shared = Arc::new(Shared {
            established: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            deliveries: AtomicU64::new(0),
            resumed: AtomicU64::new(0),
            last_rev: (0..n).map(|_| AtomicI64::new(r0)).collect(),
            hist: (0..SHARDS).map(|_| Mutex::new(new_histogram())).collect(),
            cancel: CancellationToken::new(),
        });
        let failed_flags: Arc<Vec<std::sync::atomic::AtomicBool>> = Arc::new(
            (0..n)
                .map(|_| std::sync::atomic::AtomicBool::new(false))
                .collect(),
        );
        let mut handles = Vec::with_capacity(n);
        let connections;
        match target {
            WatchTarget::Proxy {
                pool,
                path,
                protobuf,
                resume,
            } => {
                connections = if pool.len() == 0 { n } else { pool.len() };
                for i in 0..n {
                    let conn = pool.conn(i).await?;
                    let shared = shared.clone();
                    let flags = failed_flags.clone();
                    let path = path.clone();
                    handles.push(tokio::spawn(async move {
                        let out =
                            proxy_watcher(i, conn, path, r0, protobuf, resume, shared.clone())
                                .await;
                        vec![(i, finish(i, out, &shared, &flags))]
                    }));
                }
            }
            WatchTarget::Etcd {
                clients,
                prefix,
                mux: true,
            } => {
                if clients.is_empty() {
                    return Err(anyhow!("no etcd clients"));
                }
                connections = clients.len().min(n.max(1));
                for (c, client) in clients.iter().enumerate().take(n) {
                    let ids: Vec<usize> = (c..n).step_by(clients.len()).collect();
                    let client = client.clone();
                    let shared = shared.clone();
                    let flags = failed_flags.clone();
                    let prefix = prefix.clone();
                    handles.push(tokio::spawn(async move {
                        let outs = etcd_mux_watchers(ids, client, prefix, r0, shared.clone()).await;
                        outs.into_iter()
                            .map(|(i, o)| (i, finish(i, o, &shared, &flags)))
                            .collect()
                    }));
                }
            }
            WatchTarget::Etcd {
                clients,
                prefix,
                mux: false,
            } => {
                if clients.is_empty() {
                    return Err(anyhow!("no etcd clients"));
                }
                connections = clients.len();
                // Bound concurrent stream creation so etcd is not hit by W creates at once.
                let sem = Arc::new(tokio::sync::Semaphore::new(256));
                for i in 0..n {
                    let client = clients[i % clients.len()].clone();
                    let shared = shared.clone();
                    let flags = failed_flags.clone();
                    let prefix = prefix.clone();
                    let sem = sem.clone();
                    handles.push(tokio::spawn(async move {
                        let out = etcd_watcher(i, client, prefix, r0, shared.clone(), sem).await;
                        vec![(i, finish(i, out, &shared, &flags))]
                    }));
                }
            }
        }
        Ok(WatcherSet {
            shared,
            failed_flags,
            handles,
            n,
            connections,
        })
    }

    /// Waits until every watcher is established or failed; returns the
    /// number established.
    pub async fn wait_established(&self, timeout: Duration, pb: &indicatif::ProgressBar) -> usize {
        let n = self.n;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let e = self.shared.established.load(Ordering::Relaxed);
            let f = self.shared.failed.load(Ordering::Relaxed);
            pb.set_position(e as u64);
            if e + f >= n || tokio::time::Instant::now() >= deadline {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Failed flags as plain bools.
    pub fn failed(&self) -> Vec<bool> {
        self.failed_flags
            .iter()
            .map(|f| f.load(Ordering::Relaxed))
            .collect()
    }

    /// Stops every watcher and collects what each saw.
    pub async fn stop(self) -> Vec<Outcome> {
        self.shared.cancel.cancel();
        let mut out: Vec<Outcome> = (0..self.n)
            .map(|_| Outcome {
                error: Some("watcher task failed".into()),
                ..Outcome::default()
            })
            .collect();
        for h in self.handles {
            // A task that panicked leaves its watchers with the placeholder.
            if let Ok(v) = h.await {
                for (i, o) in v {
                    if let Some(slot) = out.get_mut(i) {
                        *slot = o;
                    }
                }
            }
        }
        out
    }
}

fn finish(
    i: usize,
    out: Outcome,
    shared: &Shared,
    flags: &[std::sync::atomic::AtomicBool],
) -> Outcome {
    if out.error.is_some() && !shared.cancel.is_cancelled() {
        flags[i].store(true, Ordering::Relaxed);
        shared.failed.fetch_add(1, Ordering::Relaxed);
    }
    out
}

/// A watch stream's events: JSON lines, or length-prefixed protobuf frames.
enum Splitter {
    Lines(LineSplitter),
    Frames(FrameSplitter),
}

impl Splitter {
    fn feed(&mut self, data: &[u8], mut f: impl FnMut(Result<EventInfo, String>)) {
        match self {
            Splitter::Lines(s) => s.feed(data, |line| f(parse_watch_line(line))),
            Splitter::Frames(s) => s.feed(data, |frame| f(parse_watch_frame(frame))),
        }
    }
}

/// One HTTP watcher: watches `path` from `r0`; with `resume`, a stream the
/// server ends (a watcher it cut off as unresponsive, a timeout) is opened
/// again from the last resourceVersion seen, as client-go's reflector does
/// (counted in [`Shared::resumed`]); an ERROR event ends it.
async fn proxy_watcher(
    i: usize,
    mut conn: Conn,
    path: String,
    r0: i64,
    protobuf: bool,
    resume: bool,
    shared: Arc<Shared>,
) -> Outcome {
    let mut out = Outcome::default();
    let mut last_seen = r0;
    let mut lat_us: Vec<u64> = Vec::with_capacity(FLUSH_EVERY * 2);
    loop {
        let url = format!(
            "{path}?watch=1&resourceVersion={last_seen}&allowWatchBookmarks=false&timeoutSeconds=3600"
        );
        let resp = tokio::select! {
            _ = shared.cancel.cancelled() => break,
            r = conn.get(&url) => r,
        };
        let resp = match resp {
            Ok(r) => r,
            Err(e) => {
                out.error = Some(format!("watch request: {e:#}"));
                break;
            }
        };
        if !resp.status().is_success() {
            let status = resp.status();
            let body = resp
                .into_body()
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            out.error = Some(format!(
                "watch: {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(300)])
            ));
            break;
        }
        if !out.established {
            out.established = true;
            shared.established.fetch_add(1, Ordering::Relaxed);
        }
        let ended = read_watch(
            i,
            resp.into_body(),
            protobuf,
            &shared,
            &mut out,
            &mut lat_us,
            &mut last_seen,
        )
        .await;
        if !(ended && resume) || out.error.is_some() || shared.cancel.is_cancelled() {
            if ended && out.error.is_none() && !shared.cancel.is_cancelled() {
                out.error = Some("watch stream ended".into());
            }
            break;
        }
        shared.resumed.fetch_add(1, Ordering::Relaxed);
    }
    shared.record(i, &mut lat_us);
    out
}

/// Reads one watch stream into `out` until it ends (true), fails (false,
/// the reason in `out.error`) or the set is stopped (false).
async fn read_watch(
    i: usize,
    mut body: hyper::body::Incoming,
    protobuf: bool,
    shared: &Shared,
    out: &mut Outcome,
    lat_us: &mut Vec<u64>,
    last_seen: &mut i64,
) -> bool {
    let mut splitter = if protobuf {
        Splitter::Frames(FrameSplitter::default())
    } else {
        Splitter::Lines(LineSplitter::default())
    };
    // One cancellation future for the whole loop, not one per frame.
    let cancelled = shared.cancel.cancelled();
    tokio::pin!(cancelled);
    loop {
        let frame = tokio::select! {
            biased;
            _ = &mut cancelled => return false,
            f = body.frame() => f,
        };
        let data = match frame {
            None => return true,
            Some(Err(e)) => {
                out.error = Some(format!("watch stream: {e}"));
                return false;
            }
            Some(Ok(fr)) => match fr.into_data() {
                Ok(d) => d,
                Err(_) => continue,
            },
        };
        let now = now_nanos();
        let mut n = 0u64;
        let mut last = 0i64;
        let mut err: Option<String> = None;
        splitter.feed(&data, |ev| match ev {
            Ok(ev) => match ev.kind {
                Some(EventType::Added | EventType::Modified | EventType::Deleted) => {
                    out.revs.push(ev.rv);
                    last = last.max(ev.rv);
                    n += 1;
                    if let Some(ts) = ev.write_ts {
                        lat_us.push(((now - ts).max(0) / 1000) as u64);
                    }
                }
                Some(EventType::Error) => {
                    err.get_or_insert(format!("ERROR event: {}", ev.message.unwrap_or_default()));
                }
                Some(EventType::Bookmark) | None => {}
            },
            Err(e) => {
                err.get_or_insert(e);
            }
        });
        if n > 0 {
            shared.deliveries.fetch_add(n, Ordering::Relaxed);
            shared.last_rev[i].fetch_max(last, Ordering::Relaxed);
            *last_seen = (*last_seen).max(last);
        }
        if lat_us.len() >= FLUSH_EVERY {
            shared.record(i, lat_us);
        }
        if err.is_some() {
            out.error = err;
            return false;
        }
    }
}

async fn etcd_watcher(
    i: usize,
    client: Client,
    prefix: String,
    r0: i64,
    shared: Arc<Shared>,
    sem: Arc<tokio::sync::Semaphore>,
) -> Outcome {
    let mut out = Outcome::default();
    let mut wc = client.watch_client();
    let opts = WatchOptions::new()
        .with_prefix()
        .with_start_revision(r0 + 1);
    let permit = sem.acquire_owned().await;
    let stream = tokio::select! {
        _ = shared.cancel.cancelled() => return out,
        s = wc.watch(prefix, Some(opts)) => s,
    };
    let mut stream = match stream {
        Ok(s) => s,
        Err(e) => {
            out.error = Some(format!("etcd watch: {e}"));
            return out;
        }
    };
    let mut lat_us: Vec<u64> = Vec::with_capacity(FLUSH_EVERY * 2);
    let mut permit = Some(permit);
    let cancelled = shared.cancel.cancelled();
    tokio::pin!(cancelled);
    loop {
        let msg = tokio::select! {
            biased;
            _ = &mut cancelled => break,
            m = stream.message() => m,
        };
        let resp = match msg {
            Ok(Some(r)) => r,
            Ok(None) => {
                out.error = Some("etcd watch stream ended".into());
                break;
            }
            Err(e) => {
                out.error = Some(format!("etcd watch stream: {e}"));
                break;
            }
        };
        if resp.created() && !out.established {
            out.established = true;
            permit.take();
            shared.established.fetch_add(1, Ordering::Relaxed);
        }
        if !record_etcd_response(&resp, &mut out, &mut lat_us, &shared, i) {
            break;
        }
    }
    shared.record(i, &mut lat_us);
    out
}

/// Several watchers on one etcd gRPC watch stream (one connection), told
/// apart by watch id; etcd answers creates in the order they were sent.
/// Records one etcd watch response of watcher `i` (its revisions into `out`,
/// latencies into `lat_us`, counts into `shared`); false when etcd canceled
/// the watch (the reason is in `out.error`).
fn record_etcd_response(
    resp: &etcd_client::WatchResponse,
    out: &mut Outcome,
    lat_us: &mut Vec<u64>,
    shared: &Shared,
    i: usize,
) -> bool {
    if resp.canceled() {
        out.error = Some(format!(
            "etcd watch canceled: {} (compact revision {})",
            resp.cancel_reason(),
            resp.compact_revision()
        ));
        return false;
    }
    let events = resp.events();
    if events.is_empty() {
        return true;
    }
    let now = now_nanos();
    let mut last = 0i64;
    for ev in events {
        if let Some(kv) = ev.kv() {
            let rv = kv.mod_revision();
            out.revs.push(rv);
            last = last.max(rv);
            if let Some(ts) = extract_write_ts(kv.value()) {
                lat_us.push(((now - ts).max(0) / 1000) as u64);
            }
        }
    }
    shared
        .deliveries
        .fetch_add(events.len() as u64, Ordering::Relaxed);
    shared.last_rev[i].fetch_max(last, Ordering::Relaxed);
    if lat_us.len() >= FLUSH_EVERY {
        shared.record(i, lat_us);
    }
    true
}

async fn etcd_mux_watchers(
    ids: Vec<usize>,
    client: Client,
    prefix: String,
    r0: i64,
    shared: Arc<Shared>,
) -> Vec<(usize, Outcome)> {
    let mut outs: Vec<Outcome> = ids.iter().map(|_| Outcome::default()).collect();
    fn fail_all(outs: &mut [Outcome], e: &str) {
        for o in outs.iter_mut() {
            o.error.get_or_insert_with(|| e.to_string());
        }
    }
    if ids.is_empty() {
        return Vec::new();
    }
    let opts = move || {
        WatchOptions::new()
            .with_prefix()
            .with_start_revision(r0 + 1)
    };
    let mut wc = client.watch_client();
    let stream = tokio::select! {
        _ = shared.cancel.cancelled() => return ids.into_iter().zip(outs).collect(),
        s = wc.watch(prefix.clone(), Some(opts())) => s,
    };
    let (mut sender, mut responses) = match stream {
        Ok(s) => s.split(),
        Err(e) => {
            fail_all(&mut outs, &format!("etcd watch: {e}"));
            return ids.into_iter().zip(outs).collect();
        }
    };
    // Send the other creates from their own task so responses keep flowing;
    // it keeps the request side open until the end.
    let more = ids.len() - 1;
    let stop = shared.cancel.clone();
    let sender_task = tokio::spawn(async move {
        for _ in 0..more {
            if sender.watch(prefix.clone(), Some(opts())).await.is_err() {
                break;
            }
        }
        stop.cancelled().await;
        drop(sender);
    });
    let mut by_id: std::collections::HashMap<i64, usize> = std::collections::HashMap::new();
    let mut created = 0usize;
    let mut lat_us: Vec<u64> = Vec::with_capacity(FLUSH_EVERY * 2);
    let cancelled = shared.cancel.cancelled();
    tokio::pin!(cancelled);
    loop {
        let msg = tokio::select! {
            biased;
            _ = &mut cancelled => break,
            m = responses.message() => m,
        };
        let resp = match msg {
            Ok(Some(r)) => r,
            Ok(None) => {
                fail_all(&mut outs, "etcd watch stream ended");
                break;
            }
            Err(e) => {
                fail_all(&mut outs, &format!("etcd watch stream: {e}"));
                break;
            }
        };
        if resp.created() {
            if let Some(o) = outs.get_mut(created) {
                by_id.insert(resp.watch_id(), created);
                o.established = true;
                shared.established.fetch_add(1, Ordering::Relaxed);
            }
            created += 1;
        }
        let Some(&local) = by_id.get(&resp.watch_id()) else {
            continue;
        };
        let i = ids[local];
        let o = &mut outs[local];
        record_etcd_response(&resp, o, &mut lat_us, &shared, i);
    }
    shared.record(ids[0], &mut lat_us);
    sender_task.abort();
    ids.into_iter().zip(outs).collect()
}

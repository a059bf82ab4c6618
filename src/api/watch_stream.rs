//! A watch's response stream, decoupled from its connection so a client
//! cannot hold the server hostage by not reading.
//!
//! A pump task reads the [`Watcher`] and queues its chunks in a [`Pipe`];
//! the response body takes them as fast as the connection writes. So:
//! - the watch ends at its `timeoutSeconds` (and on shutdown) whether or not
//!   the body is polled: hyper stops polling a body once the socket buffers
//!   are full, but the pump keeps running, and ending frees the watcher;
//! - a client that leaves more than `server.watch_max_buffered_bytes` unread
//!   (beyond what its connection buffers) when a new event arrives is cut
//!   off (`reason="unresponsive"`): its unread bytes are dropped and the
//!   stream ends, so it resumes from the last resourceVersion it received,
//!   like Kubernetes' terminated blocked watchers. Initial events and the
//!   replay (until the connection has once taken all of them) are exempt:
//!   the pump waits for such a client instead (a burst it downloads at
//!   network speed is not a backlog);
//! - a stream whose end the client does not take within a grace period has
//!   its unread bytes dropped, and an HTTP/1.1 connection is closed (the only
//!   way to end a response on a socket that does not drain; an HTTP/2 stream
//!   ends as soon as flow control lets the body be polled again).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::task::AtomicWaker;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use parking_lot::Mutex;
use tokio::sync::{Notify, OwnedSemaphorePermit};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::cacher::{CacherError, WatchChunk, Watcher};
use crate::object::wire::protobuf_watch_frames;

use super::Body;
use super::connection::ConnectionHandle;
use super::errors::{What, cacher_status};
use super::reads::TableWatch;

/// How long a stream that has ended waits for its client to take the end
/// before its unread bytes are dropped (and an HTTP/1.1 connection closed).
const END_GRACE: Duration = Duration::from_secs(2);

/// Everything a watch stream needs besides its watcher.
pub(crate) struct WatchStreamParams {
    /// The cap on unread bytes (`server.watch_max_buffered_bytes`).
    pub max_buffered_bytes: usize,
    /// A backstop after `timeoutSeconds` (the watcher ends itself at it).
    pub backstop: Option<Instant>,
    /// Server shutdown.
    pub shutdown: CancellationToken,
    /// For the Status of an error event.
    pub what: What,
    /// Table conversion for kubectl `get -w`.
    pub table: Option<TableWatch>,
    /// The watch slot, held until the watcher is freed.
    pub permit: OwnedSemaphorePermit,
    /// The HTTP/1.1 connection, closed if the stream's end cannot be written.
    pub http1_connection: Option<ConnectionHandle>,
    /// A protobuf stream (`application/vnd.kubernetes.protobuf;stream=watch`)
    /// of this resource's apiVersion: its ERROR event is a protobuf frame too.
    pub protobuf_api_version: Option<String>,
}

/// Starts the pump of `watcher` and returns the response body.
pub(crate) fn spawn(watcher: Watcher, params: WatchStreamParams) -> Body {
    let pipe = Arc::new(Pipe::default());
    tokio::spawn(pump(watcher, Arc::clone(&pipe), params));
    StreamBody::new(PipeReader(pipe)).boxed_unsync()
}

/// The chunks a watch produced that the connection has not taken yet.
#[derive(Default)]
struct Pipe {
    inner: Mutex<PipeInner>,
    /// The body, waiting for a chunk or the end.
    reader: AtomicWaker,
    /// The pump, waiting for room.
    room: Notify,
    /// The body was dropped (the response ended or the client went away).
    /// A flag and a waker, not a token: the pump checks it on every wake,
    /// and a token's check takes a lock.
    reader_gone: AtomicBool,
    gone_waker: AtomicWaker,
}

#[derive(Default)]
struct PipeInner {
    queue: VecDeque<Bytes>,
    bytes: usize,
    ended: bool,
    /// How often the body found the pipe empty: the connection had taken
    /// everything and had room for more (hyper polls a body only then).
    found_empty: u64,
}

impl Pipe {
    /// Resolves once the body is dropped.
    fn gone(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| {
            if self.reader_gone.load(Ordering::Acquire) {
                return Poll::Ready(());
            }
            self.gone_waker.register(cx.waker());
            if self.reader_gone.load(Ordering::Acquire) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    }

    fn unread(&self) -> usize {
        self.inner.lock().bytes
    }

    /// Queues `chunk`; returns the bytes that were unread before it and
    /// the `found_empty` count at that moment.
    fn push(&self, chunk: Bytes) -> (usize, u64) {
        let before = {
            let mut inner = self.inner.lock();
            let before = (inner.bytes, inner.found_empty);
            inner.bytes += chunk.len();
            inner.queue.push_back(chunk);
            before
        };
        self.reader.wake();
        before
    }

    fn found_empty(&self) -> u64 {
        self.inner.lock().found_empty
    }

    /// Ends the stream after what is queued, or at once with `drop_unread`.
    fn finish(&self, drop_unread: bool) {
        {
            let mut inner = self.inner.lock();
            inner.ended = true;
            if drop_unread {
                inner.queue.clear();
                inner.bytes = 0;
            }
        }
        self.reader.wake();
    }
}

/// The body side of a [`Pipe`].
struct PipeReader(Arc<Pipe>);

impl futures::Stream for PipeReader {
    type Item = Result<Frame<Bytes>, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let pipe = &self.0;
        let mut inner = pipe.inner.lock();
        if let Some(chunk) = inner.queue.pop_front() {
            inner.bytes -= chunk.len();
            drop(inner);
            pipe.room.notify_one();
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if inner.ended {
            return Poll::Ready(None);
        }
        inner.found_empty += 1;
        // Registered under the lock the pump pushes under: no lost wake-up.
        pipe.reader.register(cx.waker());
        Poll::Pending
    }
}

impl Drop for PipeReader {
    fn drop(&mut self) {
        self.0.reader_gone.store(true, Ordering::Release);
        self.0.gone_waker.wake();
    }
}

/// Why the pump stopped reading the watcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The watcher ended (timeout, error, cacher shutdown).
    Done,
    /// The backstop after `timeoutSeconds` fired.
    Deadline,
    /// The server is shutting down.
    Shutdown,
    /// The body was dropped: the client went away.
    Gone,
    /// Cut off: the client left too much unread.
    Unresponsive,
}

/// Sleeps until `sleep`, or forever without one.
async fn sleep_opt(sleep: &mut Option<Pin<Box<tokio::time::Sleep>>>) {
    match sleep {
        Some(s) => s.as_mut().await,
        None => std::future::pending().await,
    }
}

async fn pump(mut watcher: Watcher, pipe: Arc<Pipe>, params: WatchStreamParams) {
    let WatchStreamParams {
        max_buffered_bytes: cap,
        backstop,
        shutdown,
        what,
        mut table,
        permit,
        http1_connection,
        protobuf_api_version,
    } = params;
    let mut backstop = backstop.map(|at| Box::pin(tokio::time::sleep_until(at)));
    // Until the connection has taken everything sent so far once after the
    // initial events and the replay (the first chunk), the pump waits for
    // the client instead of cutting it off: such a burst is downloaded at
    // network speed, it is not a backlog the client failed to read.
    let mut catching_up = true;
    let mut pushed = false;
    // `found_empty` when the last chunk was queued while catching up.
    let mut mark = 0u64;
    // Server shutdown ends the watcher (the cachers close every watch), so
    // only the rare catching-up wait below watches the shared token.
    let end = loop {
        if catching_up && pipe.unread() >= cap {
            tokio::select! {
                _ = pipe.room.notified() => continue,
                _ = pipe.gone() => break End::Gone,
                _ = shutdown.cancelled() => break End::Shutdown,
                _ = sleep_opt(&mut backstop) => break End::Deadline,
            }
        }
        let initial = watcher.sending_initial_events();
        let item = tokio::select! {
            biased;
            _ = pipe.gone() => break End::Gone,
            // No backstop timer here: the watcher ends itself at its
            // deadline, and polling a timer per event is not free.
            item = watcher.next() => item,
        };
        match item {
            None | Some(WatchChunk::Error(CacherError::ShuttingDown)) => break End::Done,
            Some(WatchChunk::Data(chunk)) => {
                let chunk = match table.as_mut() {
                    Some(t) => t.convert(&chunk),
                    None => chunk,
                };
                if catching_up && pushed && !initial && pipe.found_empty() > mark {
                    catching_up = false;
                }
                let (before, found_empty) = pipe.push(chunk);
                pushed = true;
                if catching_up {
                    mark = found_empty;
                } else if before >= cap {
                    watcher.end_unresponsive();
                    break End::Unresponsive;
                }
            }
            Some(WatchChunk::Error(e)) => {
                let line = cacher_status(e, &what).error_line();
                let last = match &protobuf_api_version {
                    // The ERROR event's Status in the stream's encoding.
                    Some(api_version) => match protobuf_watch_frames(&line, api_version) {
                        Ok(frames) => frames,
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot encode a watch error as protobuf");
                            Bytes::new()
                        }
                    },
                    None => line,
                };
                pipe.push(last);
                break End::Done;
            }
        }
    };
    if end == End::Deadline && pipe.unread() > 0 {
        // Its time is up and the client has not even read what it has.
        watcher.end_unresponsive();
    }
    // The watcher and its slot are freed now, whatever the client does.
    drop(watcher);
    drop(permit);
    if end == End::Gone {
        return;
    }
    debug!(?end, "watch stream ended");
    pipe.finish(end == End::Unresponsive);
    tokio::select! {
        _ = pipe.gone() => {}
        _ = tokio::time::sleep(END_GRACE) => {
            // The client does not take the end of its stream.
            pipe.finish(true);
            if let Some(conn) = http1_connection {
                conn.close_stalled();
            }
        }
    }
}

//! A watch's response body, polled by the connection itself, and the
//! sweeper that keeps a client from holding the server hostage by not
//! reading.
//!
//! The body polls its [`Watcher`] directly, in the connection's stream task:
//! an event costs one wake of that task and no copy (a task and a queue per
//! watch doubled the cost of a delivery and the memory of an idle watch).
//! hyper polls a body only while the connection has room for more (HTTP/2
//! flow control, HTTP/1.1 write buffer), so a client that stops reading stops
//! its watcher where it is: nothing queues up beyond the connection's own
//! buffers. What such a client would still hold (its watcher, its watch slot)
//! is freed by one sweeper for all streams ([`sweep`]), which every
//! [`SWEEP_INTERVAL`] wakes each watch whose deadline or next bookmark has
//! come (a watcher here holds no timer of its own), and looks at each stream
//! that is not being polled:
//! - a watch not polled at its `timeoutSeconds` (plus [`DEADLINE_GRACE`]) ends then,
//!   whether or not the client reads (`reason="timeout"`);
//! - a watch whose client has left more than `server.watch_max_buffered_bytes`
//!   of events untaken (beyond what its connection buffers), and taken
//!   nothing for [`STALL_GRACE`], or that the ring has overrun, is cut off
//!   (`reason="unresponsive"`): it resumes from the last resourceVersion it
//!   received, like Kubernetes' terminated blocked watchers. Initial events
//!   and the replay are exempt until the watcher has once caught up: such a
//!   burst is downloaded at network speed, it is not a backlog;
//! - a stream ended that way whose client does not take the end within
//!   [`END_GRACE`] has its HTTP/1.1 connection closed (the only way to end a
//!   response on a socket that does not drain; an HTTP/2 stream ends as soon
//!   as flow control lets the body be polled again).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use std::io::Write;

use bytes::Bytes;
use flate2::Compression;
use flate2::write::GzEncoder;
use hyper::body::Frame;
use parking_lot::Mutex;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::cacher::{Cacher, CacherError, WatchChunk, Watcher};
use crate::object::wire::protobuf_watch_frames;

use super::table::TableWatch;
use crate::api::request::connection::ConnectionHandle;
use crate::api::status::errors::{What, cacher_status};

/// How often the sweeper looks at every open watch stream.
pub(crate) const SWEEP_INTERVAL: Duration = Duration::from_millis(250);
/// How long a watch with too much unread must take nothing before it is
/// cut off: a client that reads, however slowly, is never cut off.
pub(crate) const STALL_GRACE: Duration = Duration::from_secs(1);
/// How long after its `timeoutSeconds` the sweeper ends a watch that was
/// not polled then (a polled watcher ends itself, after a last bookmark).
pub(crate) const DEADLINE_GRACE: Duration = Duration::from_secs(2);
/// How long a stream the sweeper ended waits for its client to take the end
/// before its HTTP/1.1 connection is closed.
pub(crate) const END_GRACE: Duration = Duration::from_secs(2);

/// Everything a watch stream needs besides its watcher.
pub(crate) struct WatchStreamParams {
    /// The cap on unread bytes (`server.watch_max_buffered_bytes`).
    pub max_buffered_bytes: usize,
    /// The resource, for the Status of an error event (a collection watch
    /// has no name).
    pub cacher: Arc<Cacher>,
    /// Table conversion for kubectl `get -w`.
    pub table: Option<TableWatch>,
    /// The watch slot, held until the watcher is freed.
    pub permit: OwnedSemaphorePermit,
    /// The HTTP/1.1 connection, closed if the stream's end cannot be written.
    pub http1_connection: Option<ConnectionHandle>,
    /// A protobuf stream (`application/vnd.kubernetes.protobuf;stream=watch`):
    /// its ERROR event is a protobuf frame too.
    pub protobuf: bool,
    /// Sent gzipped (a WatchList to a client that accepts gzip), each
    /// chunk flushed as it is written: see [`WatchGzip`].
    pub gzip: bool,
}

/// Every open watch stream, for the sweeper. Weak: a stream is gone with
/// its body, and the next sweep forgets it.
#[derive(Default)]
pub struct WatchStreams {
    streams: Mutex<Vec<Weak<Shared>>>,
}

impl WatchStreams {
    /// The response body of `watcher` (a [`Body::Watch`](super::body::Body::Watch)).
    pub(crate) fn open(&self, mut watcher: Watcher, params: WatchStreamParams) -> WatchBody {
        // The sweeper wakes the body at the watcher's deadline and bookmarks.
        watcher.use_external_timer();
        let shared = Arc::new(Shared {
            slot: Mutex::new(Slot {
                seen_cursor: watcher.cursor(),
                watcher: Some(watcher),
                permit: Some(params.permit),
                waker: None,
                stalled_since: None,
                ended_at: None,
            }),
            catching_up: AtomicBool::new(true),
            body_gone: AtomicBool::new(false),
            cap: params.max_buffered_bytes as u64,
            http1_connection: params.http1_connection,
        });
        self.streams.lock().push(Arc::downgrade(&shared));
        let extras = (params.table.is_some() || params.protobuf || params.gzip).then(|| {
            Box::new(Extras {
                table: params.table,
                protobuf: params.protobuf,
                gzip: params.gzip.then(WatchGzip::new),
            })
        });
        WatchBody {
            shared,
            cacher: params.cacher,
            extras,
            done: false,
        }
    }

    /// One pass over every stream.
    fn sweep(&self, now: Instant) {
        let live: Vec<Arc<Shared>> = {
            let mut streams = self.streams.lock();
            streams.retain(|w| w.strong_count() > 0);
            streams.iter().filter_map(Weak::upgrade).collect()
        };
        for s in live {
            s.sweep(now);
        }
    }
}

/// Sweeps `streams` every [`SWEEP_INTERVAL`] until `shutdown`.
pub(crate) async fn sweep(streams: Arc<WatchStreams>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            now = tick.tick() => streams.sweep(now),
        }
    }
}

/// What the body and the sweeper share.
struct Shared {
    slot: Mutex<Slot>,
    /// Set until the watcher has once had nothing to send after its initial
    /// events or replay: until then it is not cut off.
    catching_up: AtomicBool,
    /// The body was dropped (the response ended or the client went away).
    body_gone: AtomicBool,
    cap: u64,
    http1_connection: Option<ConnectionHandle>,
}

struct Slot {
    /// `None` once the stream has ended (or the sweeper ended it).
    watcher: Option<Watcher>,
    permit: Option<OwnedSemaphorePermit>,
    /// The body's task, to wake when the sweeper ends its watcher.
    waker: Option<Waker>,
    /// The watcher's cursor at the previous sweep.
    seen_cursor: u64,
    /// Since when the sweeper has seen the cursor stand still.
    stalled_since: Option<Instant>,
    /// When the sweeper ended the watcher, until the end grace is over.
    ended_at: Option<Instant>,
}

impl Slot {
    /// Frees the watcher and its slot, whatever the client does next.
    fn free(&mut self) {
        self.watcher = None;
        self.permit = None;
    }
}

impl Shared {
    fn sweep(&self, now: Instant) {
        // A body being polled right now is not stalled.
        let Some(mut slot) = self.slot.try_lock() else {
            return;
        };
        if let Some(at) = slot.ended_at {
            if now >= at + END_GRACE {
                slot.ended_at = None;
                if !self.body_gone.load(Ordering::Acquire)
                    && let Some(conn) = &self.http1_connection
                {
                    // The client does not take the end of its stream.
                    conn.close_stalled();
                }
            }
            return;
        }
        let Slot {
            watcher: Some(watcher),
            waker,
            seen_cursor,
            stalled_since,
            ..
        } = &mut *slot
        else {
            return;
        };
        // Its deadline or next bookmark: the watcher holds no timer of its
        // own (a timer per watch costs more memory than this check).
        if watcher.wake_at().is_some_and(|t| now >= t) {
            watcher.time_is_due();
            if let Some(w) = waker {
                w.wake_by_ref();
            }
        }
        if watcher
            .deadline()
            .is_some_and(|d| now >= d + DEADLINE_GRACE)
        {
            // Not even polled at its `timeoutSeconds`: the client does not
            // take what it was sent.
            watcher.end_timeout();
        } else if self.catching_up.load(Ordering::Acquire) {
            return;
        } else {
            let cursor = watcher.cursor();
            let unread = watcher.unread_bytes();
            if cursor != *seen_cursor || unread.is_some_and(|n| n == 0) {
                *seen_cursor = cursor;
                *stalled_since = None;
                return;
            }
            let since = *stalled_since.get_or_insert(now);
            match unread {
                // Behind the ring: its next read is a 410 anyway.
                None => {}
                Some(n) if n >= self.cap && now.duration_since(since) >= STALL_GRACE => {}
                Some(_) => return,
            }
            watcher.end_unresponsive();
        }
        debug!("watch stream ended by the sweeper");
        slot.free();
        slot.ended_at = Some(now);
        if let Some(w) = slot.waker.take() {
            w.wake();
        }
    }
}

/// The response body of a watch: small, as it lives as long as the watch.
pub struct WatchBody {
    shared: Arc<Shared>,
    cacher: Arc<Cacher>,
    /// Table, protobuf or gzipped streams only.
    extras: Option<Box<Extras>>,
    done: bool,
}

struct Extras {
    /// Table conversion for kubectl `get -w`.
    table: Option<TableWatch>,
    /// A protobuf stream: its ERROR event is a protobuf frame.
    protobuf: bool,
    /// A gzipped stream's encoder, taken when its trailer is written.
    gzip: Option<WatchGzip>,
}

/// The gzip of a watch stream (kube-apiserver 1.37's gzip of WatchList
/// streams): one gzip stream for the whole response, each chunk the
/// watcher gives compressed and sync-flushed at once (RFC 1951's empty
/// stored block), so the client decodes every event, and the
/// initial-events-end bookmark, as soon as it arrives, never waiting for
/// more. At level 1 ([`LEVEL`](super::gzip::LEVEL)), on the connection's
/// task: a chunk is at most the watcher's 256 KiB (its initial events),
/// usually one event.
struct WatchGzip {
    enc: GzEncoder<Vec<u8>>,
}

impl WatchGzip {
    fn new() -> WatchGzip {
        WatchGzip {
            enc: GzEncoder::new(Vec::new(), Compression::new(super::gzip::LEVEL)),
        }
    }

    /// `chunk` compressed and flushed: bytes the client can decode whole.
    fn chunk(&mut self, chunk: &[u8]) -> std::io::Result<Bytes> {
        self.enc.write_all(chunk)?;
        self.enc.flush()?;
        Ok(Bytes::from(std::mem::take(self.enc.get_mut())))
    }

    /// `last` (if any) and the end of the gzip stream: its trailer.
    fn finish(mut self, last: Option<&[u8]>) -> std::io::Result<Bytes> {
        if let Some(last) = last {
            self.enc.write_all(last)?;
        }
        self.enc.finish().map(Bytes::from)
    }
}

impl WatchBody {
    /// The stream's last frame: `last` (an ERROR event), gzipped with the
    /// gzip stream's end when the stream is gzipped.
    fn end(&mut self, last: Option<Bytes>) -> Option<Result<Frame<Bytes>, Infallible>> {
        self.done = true;
        let last = match self.extras.as_mut().and_then(|x| x.gzip.take()) {
            None => last,
            Some(gzip) => match gzip.finish(last.as_deref()) {
                Ok(end) => Some(end),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot end a gzipped watch");
                    None
                }
            },
        };
        last.map(|b| Ok(Frame::data(b)))
    }

    /// The ERROR event of `e`, in the stream's encoding.
    fn error_event(&self, e: CacherError) -> Bytes {
        let what = What::of(self.cacher.resource(), None);
        let line = cacher_status(e, &what).error_line();
        if !self.extras.as_ref().is_some_and(|x| x.protobuf) {
            return line;
        }
        match protobuf_watch_frames(&line) {
            Ok(frames) => frames,
            Err(e) => {
                tracing::warn!(error = %e, "cannot encode a watch error as protobuf");
                Bytes::new()
            }
        }
    }
}

impl hyper::body::Body for WatchBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let mut slot = this.shared.slot.lock();
        let Some(watcher) = slot.watcher.as_mut() else {
            // Ended by the sweeper.
            drop(slot);
            return Poll::Ready(this.end(None));
        };
        let item = match watcher.poll_next(cx) {
            Poll::Pending => {
                if !watcher.sending_initial_events() {
                    this.shared.catching_up.store(false, Ordering::Release);
                }
                if !slot.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    slot.waker = Some(cx.waker().clone());
                }
                return Poll::Pending;
            }
            Poll::Ready(item) => item,
        };
        let last = match item {
            Some(WatchChunk::Data(chunk)) => {
                drop(slot);
                let table = this.extras.as_mut().and_then(|x| x.table.as_mut());
                let chunk = match table {
                    Some(t) => t.convert(&chunk),
                    None => chunk,
                };
                let Some(gzip) = this.extras.as_mut().and_then(|x| x.gzip.as_mut()) else {
                    return Poll::Ready(Some(Ok(Frame::data(chunk))));
                };
                return match gzip.chunk(&chunk) {
                    Ok(z) => Poll::Ready(Some(Ok(Frame::data(z)))),
                    Err(e) => {
                        // Ended without its trailer: the client sees an
                        // error, never a short stream taken for the whole.
                        tracing::warn!(error = %e, "cannot gzip a watch event");
                        this.shared.slot.lock().free();
                        this.done = true;
                        Poll::Ready(None)
                    }
                };
            }
            None | Some(WatchChunk::Error(CacherError::ShuttingDown)) => None,
            Some(WatchChunk::Error(e)) => Some(e),
        };
        // The watcher and its slot are freed now, whatever the client does.
        slot.free();
        drop(slot);
        debug!("watch stream ended");
        let last = last.map(|e| this.error_event(e));
        Poll::Ready(this.end(last))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

impl Drop for WatchBody {
    fn drop(&mut self) {
        self.shared.body_gone.store(true, Ordering::Release);
        // The client went away (or the response ended): free the watcher.
        self.shared.slot.lock().free();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an idle watch holds besides HTTP/2's stream: one allocation of
    /// [`Shared`] (the watcher inline). It must stay within jemalloc's
    /// 448-byte size class (the next is 512, then 640): every byte counts a
    /// 100,000 times (docs/BENCHMARKS.md, "Against kube-apiserver", K6).
    #[test]
    fn an_idle_watchs_state_fits_one_448_byte_allocation() {
        // `Arc`'s two counts come on top.
        let arc = std::mem::size_of::<Shared>() + 2 * std::mem::size_of::<usize>();
        assert!(arc <= 448, "Arc<Shared> is {arc} bytes");
    }
}

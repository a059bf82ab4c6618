//! One client connection, from accept to close, with the limits that keep a
//! client from holding it (and a file descriptor) without using it:
//! - the first request must arrive within `server.header_read_timeout_ms` of
//!   accept. This covers what hyper's own header timeout does not: the wait
//!   for the first bytes (the HTTP/1-or-2 detection has no timer) and the
//!   HTTP/2 preface and SETTINGS;
//! - a connection with no request in flight for `server.idle_timeout_ms` is
//!   shut down gracefully (HTTP/2: GOAWAY), like Go's `http.Server.IdleTimeout`;
//! - a watch whose stream cannot be ended on an HTTP/1.1 connection (its
//!   client does not read) closes the connection through [`ConnectionHandle`].
//!
//! The cap on open connections (`server.max_connections`) is applied at
//! accept, in [`super::listener::Server::serve`], with the permit this task holds.

use crate::coalesced_stream::{Flusher, ServerStream};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::Request;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tracing::debug;

use super::stream_executor::{StreamExecutor, Streams};
use crate::api::pipeline::handle as pipeline;
use crate::api::request::connection::{ConnectionHandle, InFlight};
use crate::api::response::Body;
use crate::api::state::State;
use crate::auth::ConnectionIdentity;

/// How long a connection being shut down (idle, or the server stopping) may
/// take to finish before it is closed.
const CLOSE_GRACE: Duration = Duration::from_secs(4);

/// The connection limits of `server.*`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectionLimits {
    /// From accept to the first request (`header_read_timeout_ms`).
    pub first_request_timeout: Duration,
    /// Without a request in flight (`idle_timeout_ms`); `None` = never.
    pub idle_timeout: Option<Duration>,
    /// `coalesce_writes`: one system call per batch of frames.
    pub coalesce_writes: bool,
}

impl ConnectionLimits {
    pub(crate) fn from_config(cfg: &crate::config::ServerConfig) -> ConnectionLimits {
        ConnectionLimits {
            first_request_timeout: Duration::from_millis(cfg.header_read_timeout_ms.max(1)),
            idle_timeout: (cfg.idle_timeout_ms > 0)
                .then(|| Duration::from_millis(cfg.idle_timeout_ms)),
            coalesce_writes: cfg.coalesce_writes,
        }
    }
}

/// A response body that keeps its request in flight while it lives.
pub(crate) struct InFlightBody {
    inner: Body,
    _in_flight: InFlight,
}

impl hyper::body::Body for InFlightBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Keeps `watchcache_api_open_connections` while the connection lives.
struct Open;

impl Open {
    fn new() -> Open {
        crate::metrics::metrics().api_open_connections.inc();
        Open
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        crate::metrics::metrics().api_open_connections.dec();
    }
}

fn closed(reason: &str) {
    crate::metrics::metrics()
        .api_connections_closed
        .with_label_values(&[reason])
        .inc();
}

/// Serves one accepted connection until it ends, is closed by a limit, or
/// the server shuts down (`close_rx`). `_permit` is its slot of
/// `server.max_connections`. With `tls`, the TLS handshake comes first and
/// counts against the first-request deadline.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    state: Arc<State>,
    limits: ConnectionLimits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    close_rx: tokio::sync::watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
) {
    let _open = Open::new();
    let first_request_deadline = Instant::now() + limits.first_request_timeout;
    let Some(acceptor) = tls else {
        let stream = ServerStream::new(stream, limits.coalesce_writes);
        let flusher = stream.flusher();
        let io = TokioIo::new(stream);
        let at = first_request_deadline;
        serve_io(io, flusher, None, peer, state, limits, at, close_rx).await;
        return;
    };
    let Some(tls) = tls_handshake(&acceptor, stream, &limits, peer).await else {
        return;
    };
    // The client certificate is verified once per connection; every request
    // on it reuses the result.
    let identity = state
        .security
        .authenticator
        .authenticate_connection(tls.get_ref().1.peer_certificates());
    // Taken after the handshake, whose writes are not polled by the
    // connection's future.
    let flusher = tls.get_ref().0.flusher();
    let io = TokioIo::new(tls);
    serve_io(
        io,
        flusher,
        identity,
        peer,
        state,
        limits,
        first_request_deadline,
        close_rx,
    )
    .await;
}

/// The HTTP part of [`serve`], over a plain or TLS stream.
#[allow(clippy::too_many_arguments)]
async fn serve_io<I>(
    io: I,
    flusher: Option<Flusher>,
    identity: ConnectionIdentity,
    peer: SocketAddr,
    state: Arc<State>,
    limits: ConnectionLimits,
    first_request_deadline: Instant,
    mut close_rx: tokio::sync::watch::Receiver<bool>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let handle = ConnectionHandle::new(identity);
    let svc = {
        let handle = handle.clone();
        service_fn(move |req: Request<Incoming>| {
            let in_flight = handle.request_started();
            // hyper sizes each stream's task by this future, and a watch's
            // task lives as long as the watch: the handler's future (4.6 KB)
            // is boxed, so the task shrinks to the watch body once the
            // response head is out. It is boxed when the task first runs,
            // not here: hyper calls the service for every stream of a burst
            // before it runs any of them, and 10,000 watches opened at once
            // would otherwise hold 10,000 handler futures at the same time
            // (a heap high-water mark that stays in the RSS).
            let args = Box::new((Arc::clone(&state), handle.clone(), req));
            async move {
                let (state, conn, req) = *args;
                let resp = Box::pin(pipeline::handle(state, conn, req)).await;
                Ok::<_, Infallible>(resp.map(|inner| InFlightBody {
                    inner,
                    _in_flight: in_flight,
                }))
            }
        })
    };
    let executor = StreamExecutor::default();
    let builder = http_builder(&limits, executor.clone());
    let conn = Streams::new(builder.serve_connection(io, svc), &executor);
    let mut conn = std::pin::pin!(FlushAfterPoll { conn, flusher });
    let mut closing: Option<Instant> = None;
    loop {
        tokio::select! {
            res = conn.as_mut() => {
                if let Err(e) = res {
                    debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = handle.closed() => {
                debug!(%peer, "closing a connection whose watch stream cannot end");
                closed("stalled_watch");
                return;
            }
            _ = tokio::time::sleep_until(first_request_deadline), if handle.requests() == 0 => {
                if handle.requests() == 0 {
                    debug!(%peer, "no request within the header read timeout; closing");
                    closed("first_request_timeout");
                    return;
                }
            }
            _ = idle(&handle, limits.idle_timeout), if closing.is_none() => {
                debug!(%peer, "idle connection; closing");
                closed("idle_timeout");
                conn.as_mut().conn().conn().graceful_shutdown();
                closing = Some(Instant::now() + CLOSE_GRACE);
            }
            _ = close_rx.changed(), if closing.is_none() => {
                conn.as_mut().conn().conn().graceful_shutdown();
                closing = Some(Instant::now() + CLOSE_GRACE);
            }
            _ = tokio::time::sleep_until(closing.unwrap_or(first_request_deadline)), if closing.is_some() => {
                return;
            }
        }
    }
}

/// The connection's future, followed after each poll by a write of what
/// that poll queued ([`Flusher`]): the round's frames, from every stream of
/// the connection (they all run in this task), leave in one system call.
struct FlushAfterPoll<F> {
    conn: F,
    flusher: Option<Flusher>,
}

impl<F: Future + Unpin> FlushAfterPoll<F> {
    fn conn(self: Pin<&mut Self>) -> Pin<&mut F> {
        Pin::new(&mut self.get_mut().conn)
    }
}

impl<F: Future + Unpin> Future for FlushAfterPoll<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let r = self.as_mut().conn().poll(cx);
        if let Some(f) = &self.flusher {
            f.flush();
        }
        r
    }
}

/// HTTP/2 streams per connection (each watch is one stream).
const H2_MAX_CONCURRENT_STREAMS: u32 = 10_000;

/// The HTTP/1.1 and HTTP/2 settings of one connection, whose HTTP/2 streams
/// run in its own task ([`StreamExecutor`]).
fn http_builder(
    limits: &ConnectionLimits,
    executor: StreamExecutor,
) -> auto::Builder<StreamExecutor> {
    let mut builder = auto::Builder::new(executor);
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.first_request_timeout)
        .keep_alive(true);
    // No HTTP/2 PING keep-alive: hyper checks its ping timer on every
    // poll of the connection (`Ponger::poll`, 1.5% of a fan-out profile,
    // plus its clock reads). Dead peers are found by TCP keep-alive
    // instead, set on every accepted socket, as Go's net/http
    // (kube-apiserver) does.
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_CONCURRENT_STREAMS);
    builder
}

/// What Go's TLS server answers a plain-HTTP request on a TLS port (and so
/// kube-apiserver): readable by curl and kubectl instead of a reset.
const PLAIN_HTTP_ON_TLS: &[u8] =
    b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n";

/// The TLS handshake of one connection, bounded by `timeout`. A client that
/// speaks plain HTTP gets [`PLAIN_HTTP_ON_TLS`]; failures end the
/// connection (logged at debug: scanners and health checkers are noisy).
async fn tls_handshake(
    acceptor: &tokio_rustls::TlsAcceptor,
    mut stream: tokio::net::TcpStream,
    limits: &ConnectionLimits,
    peer: std::net::SocketAddr,
) -> Option<tokio_rustls::server::TlsStream<ServerStream>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let timeout = limits.first_request_timeout;
    let mut first = [0u8; 1];
    match tokio::time::timeout(timeout, stream.peek(&mut first)).await {
        Ok(Ok(1)) => {}
        _ => return None,
    }
    // 0x16: a TLS handshake record.
    if first[0] != 0x16 {
        debug!(%peer, "plain HTTP (or garbage) on the TLS port");
        if first[0].is_ascii_uppercase() {
            let _ = stream.write_all(PLAIN_HTTP_ON_TLS).await;
            let _ = stream.shutdown().await;
            // Drain what the client sent so closing does not reset the
            // connection before it reads the answer.
            let mut sink = [0u8; 4096];
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
            })
            .await;
        }
        return None;
    }
    match tokio::time::timeout(
        timeout,
        acceptor.accept(ServerStream::new(stream, limits.coalesce_writes)),
    )
    .await
    {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(e)) => {
            debug!(%peer, error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            debug!(%peer, "TLS handshake timed out");
            None
        }
    }
}

/// [`ConnectionHandle::idle`], or never without an idle timeout.
async fn idle(handle: &ConnectionHandle, after: Option<Duration>) {
    match after {
        Some(after) => handle.idle(after).await,
        None => std::future::pending().await,
    }
}

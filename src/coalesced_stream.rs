//! A TCP stream whose small writes are coalesced into one `write` per
//! scheduling round of its connection.
//!
//! Why: the h2 crate writes every DATA frame larger than 256 bytes with a
//! `writev` of its own, and hyper's HTTP/1.1 flushes every body chunk. With
//! 100 watch streams on a connection, one event is 100 system calls, and the
//! kernel's per-call TCP work was the largest single cost of fan-out. Here a
//! write of less than [`DIRECT_MIN`] bytes is copied into a buffer, and a
//! writer task (woken once per batch, not per frame) writes everything the
//! connection queued since it last ran in one call: like grpc-go's loopy
//! writer. Large writes (List pages, big objects, full HTTP/2 frames) go
//! straight to the socket, after what was queued before them, and are never
//! copied: copying them would cost more than the system call it saves, most
//! of all when a slow reader keeps the socket full.
//!
//! When the connection's task holds a [`Flusher`] (it calls
//! [`Flusher::flush`] after each of its polls), it writes the round's batch
//! itself, and the writer task only takes over what the socket did not
//! accept: a batch then costs one system call and no task wake-up.
//!
//! Memory stays bounded whatever the client does: once [`HIGH_WATER`] bytes
//! wait (the peer does not read), writes return `Pending` and the protocol
//! above applies its own flow control, as it would with a full socket.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Whether the runtime's selector is edge-triggered (epoll, kqueue): only
/// then does a short read show that the socket is drained (the targets
/// tokio's `PollEvented::poll_read` lists, tokio issue 5866).
const EDGE_TRIGGERED: bool = cfg!(all(
    not(mio_unsupported_force_poll_poll),
    any(
        target_os = "android",
        target_os = "illumos",
        target_os = "linux",
        target_os = "redox",
        target_os = "dragonfly",
        target_os = "freebsd",
        target_os = "ios",
        target_os = "macos",
        target_os = "netbsd",
        target_os = "openbsd",
        target_os = "tvos",
        target_os = "visionos",
        target_os = "watchos",
    )
));

/// Writes at least this long go to the socket directly (after the queue).
pub const DIRECT_MIN: usize = 16 * 1024;
/// Queued bytes above which writes wait for the writer.
pub const HIGH_WATER: usize = 64 * 1024;
/// A write buffer larger than this is released once written, so a burst
/// does not pin memory on an idle connection.
const KEEP_CAPACITY: usize = 16 * 1024;
/// How long bytes queued when the stream is dropped (without a shutdown)
/// may take to go out before the socket is closed under them.
const DROP_GRACE: Duration = Duration::from_secs(2);

/// See the module documentation.
pub struct CoalescedStream {
    shared: Arc<Shared>,
}

struct Shared {
    /// Read and written through `&self` (`try_*` and `poll_*_ready`): the
    /// connection's task reads, and writes large buffers (and batches, with
    /// a [`Flusher`]); the writer task writes batches; never two at once.
    stream: TcpStream,
    state: Mutex<State>,
    /// Wakes the writer: bytes queued, or a shutdown asked for.
    work: Notify,
    /// The stream was dropped: the writer flushes for [`DROP_GRACE`] at most.
    dropped: CancellationToken,
}

#[derive(Default)]
struct State {
    /// Bytes queued for the writer, in order.
    queued: Vec<u8>,
    /// The writer holds a batch it has not finished writing.
    in_flight: bool,
    /// The first write error; every later operation returns it.
    error: Option<(io::ErrorKind, String)>,
    /// The connection's task, waiting for room or for the queue to drain.
    waiter: Option<Waker>,
    /// Batches handed to the socket so far (for tests of the coalescing).
    batches: u64,
    /// A [`Flusher`] is held: queueing bytes does not wake the writer, the
    /// connection's task writes them after its poll.
    inline_flush: bool,
}

impl State {
    fn idle(&self) -> bool {
        self.queued.is_empty() && !self.in_flight
    }

    /// Records the first write error (every later operation returns it),
    /// drops what was queued (it can no longer be sent) and wakes the
    /// connection's task, which may be waiting for room or a shutdown.
    fn fail(&mut self, e: &io::Error) {
        self.error = Some((e.kind(), e.to_string()));
        self.queued = Vec::new();
        self.in_flight = false;
        if let Some(w) = self.waiter.take() {
            w.wake();
        }
    }

    fn error(&self) -> Option<io::Error> {
        self.error
            .as_ref()
            .map(|(kind, msg)| io::Error::new(*kind, msg.clone()))
    }
}

impl CoalescedStream {
    /// Wraps `stream` and starts its writer task (on the current runtime).
    pub fn new(stream: TcpStream) -> Self {
        let shared = Arc::new(Shared {
            stream,
            state: Mutex::new(State::default()),
            work: Notify::new(),
            dropped: CancellationToken::new(),
        });
        tokio::spawn(writer(Arc::clone(&shared)));
        CoalescedStream { shared }
    }

    /// Queues as much of `bufs` as there is room for, or writes it directly.
    fn poll_write_bufs(
        &self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total == 0 {
            return Poll::Ready(Ok(0));
        }
        let mut st = self.shared.state.lock();
        if let Some(e) = st.error() {
            return Poll::Ready(Err(e));
        }
        if total >= DIRECT_MIN {
            drop(st);
            return self.poll_write_large(cx, bufs);
        }
        let room = HIGH_WATER.saturating_sub(st.queued.len());
        if room == 0 {
            st.waiter = Some(cx.waker().clone());
            drop(st);
            // The writer may have drained the queue before the waker was set.
            self.shared.work.notify_one();
            return Poll::Pending;
        }
        let wake_writer = st.queued.is_empty() && !st.inline_flush;
        let mut taken = 0;
        for b in bufs {
            let n = b.len().min(room - taken);
            st.queued.extend_from_slice(&b[..n]);
            taken += n;
            if taken == room {
                break;
            }
        }
        drop(st);
        if wake_writer {
            self.shared.work.notify_one();
        }
        Poll::Ready(Ok(taken))
    }

    /// While the returned [`Flusher`] lives, its holder writes the queue:
    /// it must call [`Flusher::flush`] after every poll that may write.
    pub fn flusher(&self) -> Flusher {
        self.shared.state.lock().inline_flush = true;
        Flusher(Arc::clone(&self.shared))
    }
}

/// Writes what a [`CoalescedStream`] queued, from the task that queued it.
///
/// Why: the stream's writer task costs a wake-up and two polls per batch
/// (2-3% of a Get's CPU under G1, measured); the connection's task,
/// which queued the whole round, can hand it to the socket itself once its
/// poll ends. Only bytes the socket does not take go to the writer task,
/// which waits for room.
pub struct Flusher(Arc<Shared>);

impl Flusher {
    /// Writes the queue now if the socket takes it; hands the rest (or all,
    /// while the writer is busy with an earlier batch) to the writer task.
    pub fn flush(&self) {
        let shared = &self.0;
        let mut st = shared.state.lock();
        if st.queued.is_empty() || st.error.is_some() {
            return;
        }
        if st.in_flight {
            // The writer holds earlier bytes; these go after them: it looks
            // at the queue again when its batch is out, without a wake-up.
            return;
        }
        // Held across the system call, as in `poll_write_large`: the
        // writer cannot start a batch meanwhile.
        match shared.stream.try_write(&st.queued) {
            Ok(n) if n == st.queued.len() => {
                st.batches += 1;
                st.queued.clear();
                if st.queued.capacity() > KEEP_CAPACITY {
                    st.queued = Vec::new();
                }
                if let Some(w) = st.waiter.take() {
                    w.wake();
                }
            }
            Ok(n) => {
                st.batches += 1;
                st.queued.drain(..n);
                drop(st);
                shared.work.notify_one();
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                drop(st);
                shared.work.notify_one();
            }
            Err(e) => {
                st.fail(&e);
                drop(st);
                // The writer ends on the error (and lets go of the stream).
                shared.work.notify_one();
            }
        }
    }
}

/// The writer takes the queue back: bytes queued from now on wake it.
impl Drop for Flusher {
    fn drop(&mut self) {
        let mut st = self.0.state.lock();
        st.inline_flush = false;
        let pending = !st.queued.is_empty();
        drop(st);
        if pending {
            self.0.work.notify_one();
        }
    }
}

impl CoalescedStream {
    /// A large write goes to the socket in one `writev` with whatever is
    /// queued before it, so it is never copied and costs no extra call.
    fn poll_write_large(
        &self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            // Held across the system call: the writer cannot start a batch
            // meanwhile (it only ever takes the lock briefly).
            let mut st = self.shared.state.lock();
            if let Some(e) = st.error() {
                return Poll::Ready(Err(e));
            }
            if st.in_flight {
                st.waiter = Some(cx.waker().clone());
                drop(st);
                self.shared.work.notify_one();
                return Poll::Pending;
            }
            if let Err(e) = ready!(self.shared.stream.poll_write_ready(cx)) {
                return Poll::Ready(Err(e));
            }
            let queued = st.queued.len();
            let mut iov = Vec::with_capacity(bufs.len() + 1);
            if queued > 0 {
                iov.push(io::IoSlice::new(&st.queued));
            }
            iov.extend(bufs.iter().map(|b| io::IoSlice::new(b)));
            match self.shared.stream.try_write_vectored(&iov) {
                Ok(n) if n < queued => {
                    drop(iov);
                    st.queued.drain(..n);
                }
                Ok(n) => {
                    drop(iov);
                    st.queued.clear();
                    if n > queued {
                        return Poll::Ready(Ok(n - queued));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl Drop for CoalescedStream {
    fn drop(&mut self) {
        self.shared.dropped.cancel();
        self.shared.work.notify_one();
    }
}

/// Writes the queue in batches until the stream is dropped or fails.
async fn writer(shared: Arc<Shared>) {
    let mut batch: Vec<u8> = Vec::new();
    loop {
        {
            let mut st = shared.state.lock();
            if st.error.is_some() {
                return;
            }
            if st.queued.is_empty() {
                st.in_flight = false;
                if let Some(w) = st.waiter.take() {
                    w.wake();
                }
                if shared.dropped.is_cancelled() {
                    return;
                }
            } else {
                std::mem::swap(&mut st.queued, &mut batch);
                st.in_flight = true;
                st.batches += 1;
                if let Some(w) = st.waiter.take() {
                    w.wake();
                }
            }
        }
        if batch.is_empty() {
            shared.work.notified().await;
            // Let every task that is ready now (other watches of this
            // connection, hyper's stream tasks) queue its frames first, so
            // one write carries the whole round instead of the first few.
            tokio::task::yield_now().await;
            continue;
        }
        let mut pos = 0;
        let finished = tokio::select! {
            r = write_from(&shared.stream, &batch, &mut pos) => Some(r),
            _ = shared.dropped.cancelled() => None,
        };
        // Dropped mid-batch: the rest gets a grace period, no more.
        let written = match finished {
            Some(r) => r,
            None => tokio::time::timeout(DROP_GRACE, write_from(&shared.stream, &batch, &mut pos))
                .await
                .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into())),
        };
        if let Err(e) = written {
            shared.state.lock().fail(&e);
            return;
        }
        batch.clear();
        if batch.capacity() > KEEP_CAPACITY {
            batch = Vec::new();
        }
    }
}

/// Writes `buf[*pos..]`, advancing `pos` as bytes go out, so a write
/// cancelled at its await point can be resumed without repeating bytes.
async fn write_from(w: &TcpStream, buf: &[u8], pos: &mut usize) -> io::Result<()> {
    while *pos < buf.len() {
        w.writable().await?;
        match w.try_write(&buf[*pos..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => *pos += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl AsyncRead for CoalescedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let stream = &self.shared.stream;
        loop {
            ready!(stream.poll_read_ready(cx))?;
            let dst = buf.initialize_unfilled();
            let want = dst.len();
            let mut short = None;
            // A read shorter than the buffer drained the socket: with an
            // edge-triggered selector its readiness is cleared with it, as
            // tokio's own `TcpStream::poll_read` does, so the next read
            // waits for the next event instead of costing a system call that
            // returns EAGAIN (one per request batch, 2% of the daemon under
            // G1). `try_io` clears only if no event came in since the read
            // began; the read itself is mio's (`try_read`).
            let r = stream.try_io(tokio::io::Interest::READABLE, || {
                let n = stream.try_read(dst)?;
                if EDGE_TRIGGERED && n > 0 && n < want {
                    short = Some(n);
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Ok(n)
            });
            match (r, short) {
                (_, Some(n)) | (Ok(n), None) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                (Err(e), None) if e.kind() == io::ErrorKind::WouldBlock => continue,
                (Err(e), None) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for CoalescedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_bufs(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_bufs(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Ready once the bytes are queued: they are sent after this task's
    /// poll (by its [`Flusher`], or the writer task when this task yields).
    /// Waiting here would cost one system call per frame again.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.shared.state.lock().error() {
            Some(e) => Poll::Ready(Err(e)),
            None => Poll::Ready(Ok(())),
        }
    }

    /// Waits until everything queued is written, then shuts the write side.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        {
            let mut st = self.shared.state.lock();
            if let Some(e) = st.error() {
                return Poll::Ready(Err(e));
            }
            if !st.idle() {
                st.waiter = Some(cx.waker().clone());
                drop(st);
                self.shared.work.notify_one();
                return Poll::Pending;
            }
        }
        let sock = socket2::SockRef::from(&self.shared.stream);
        match sock.shutdown(std::net::Shutdown::Write) {
            Ok(()) => Poll::Ready(Ok(())),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

/// An accepted connection, with its writes coalesced or not
/// (`server.coalesce_writes`).
pub enum ServerStream {
    Plain(TcpStream),
    Coalesced(CoalescedStream),
}

impl ServerStream {
    pub fn new(stream: TcpStream, coalesce: bool) -> Self {
        if coalesce {
            ServerStream::Coalesced(CoalescedStream::new(stream))
        } else {
            ServerStream::Plain(stream)
        }
    }

    /// [`CoalescedStream::flusher`], when writes are coalesced.
    pub fn flusher(&self) -> Option<Flusher> {
        match self {
            ServerStream::Plain(_) => None,
            ServerStream::Coalesced(s) => Some(s.flusher()),
        }
    }
}

impl AsyncRead for ServerStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ServerStream::Coalesced(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ServerStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ServerStream::Coalesced(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ServerStream::Coalesced(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            ServerStream::Plain(s) => s.is_write_vectored(),
            ServerStream::Coalesced(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_flush(cx),
            ServerStream::Coalesced(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ServerStream::Coalesced(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A connected pair: (the coalesced server side, the plain client side).
    async fn pair() -> (CoalescedStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = TcpStream::connect(addr);
        let (accepted, client) = tokio::join!(listener.accept(), client);
        (CoalescedStream::new(accepted.unwrap().0), client.unwrap())
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    #[tokio::test]
    async fn small_writes_of_one_round_go_out_as_one_batch_in_order() {
        let (mut server, mut client) = pair().await;
        let data = pattern(100 * 1200);
        // 100 frames of 1.2 KB, written without yielding (as h2 does in
        // one poll of its connection), each followed by a flush.
        for frame in data.chunks(1200) {
            server.write_all(frame).await.unwrap();
            server.flush().await.unwrap();
        }
        let mut got = vec![0u8; data.len()];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(got, data);
        // 120 KB in batches of at most HIGH_WATER: 2, not 100.
        let batches = server.shared.state.lock().batches;
        assert!(
            batches <= 3,
            "{batches} batches for one round of 100 frames"
        );
    }

    /// With a flusher, a round's writes wait for the flush (no writer task
    /// wake-up), which hands them to the socket in one call.
    #[tokio::test]
    async fn a_flusher_writes_the_round_in_one_call_from_its_task() {
        let (mut server, mut client) = pair().await;
        // The writer task's first run (it looks at the queue once before
        // it waits for work).
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let flusher = server.flusher();
        let data = pattern(10 * 1200);
        for frame in data.chunks(1200) {
            server.write_all(frame).await.unwrap();
            server.flush().await.unwrap();
        }
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            server.shared.state.lock().batches,
            0,
            "sent before the flush"
        );
        flusher.flush();
        {
            let st = server.shared.state.lock();
            assert!(st.queued.is_empty(), "the flush left bytes queued");
            assert_eq!(st.batches, 1);
        }
        let mut got = vec![0u8; data.len()];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(got, data);
    }

    /// What the socket does not take when the flusher runs (the peer reads
    /// slowly) goes out through the writer task, in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flush_the_socket_cannot_take_is_finished_by_the_writer() {
        let (mut server, mut client) = pair().await;
        let flusher = server.flusher();
        let data = pattern(8 * 1024 * 1024 + 3);
        let expected = data.clone();
        let reader = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            got
        });
        for frame in data.chunks(1000) {
            server.write_all(frame).await.unwrap();
            flusher.flush();
        }
        server.shutdown().await.unwrap();
        let got = reader.await.unwrap();
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "bytes out of order or changed");
    }

    /// A short read clears the socket's readiness: bytes that arrive after
    /// it (even while it runs, from another thread) must still wake the
    /// reader, and EOF must still be seen.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_after_a_short_read_get_every_later_byte_and_eof() {
        let (mut server, mut client) = pair().await;
        let data = pattern(2_000_000);
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            let mut rest = &sent[..];
            let mut n = 1;
            while !rest.is_empty() {
                let k = n.min(rest.len());
                client.write_all(&rest[..k]).await.unwrap();
                rest = &rest[k..];
                n = (n * 13 + 5) % 3000 + 1;
                if n % 7 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            // EOF after the last byte.
        });
        let mut got = Vec::with_capacity(data.len());
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = tokio::time::timeout(Duration::from_secs(10), server.read(&mut buf))
                .await
                .expect("a read after a short read was never woken")
                .unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        writer.await.unwrap();
        assert_eq!(got.len(), data.len());
        assert!(got == data, "bytes out of order or changed");
    }

    #[tokio::test]
    async fn large_writes_and_shutdown_deliver_every_byte_then_eof() {
        let (mut server, mut client) = pair().await;
        let data = pattern(3 * 1024 * 1024 + 17);
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            got
        });
        // Mixed sizes: direct writes and queued ones must stay in order.
        let mut rest = &data[..];
        let mut n = 1;
        while !rest.is_empty() {
            let k = n.min(rest.len());
            server.write_all(&rest[..k]).await.unwrap();
            rest = &rest[k..];
            n = (n * 7 + 3) % 70_000;
        }
        server.shutdown().await.unwrap();
        assert_eq!(reader.await.unwrap(), data);
    }

    #[tokio::test]
    async fn a_peer_that_does_not_read_gets_backpressure_not_unbounded_buffering() {
        let (mut server, client) = pair().await;
        let frame = pattern(1000);
        let mut written = 0usize;
        // The socket buffers fill, then the queue, then a write waits: the
        // backpressure ends the loop.
        while let Ok(r) =
            tokio::time::timeout(Duration::from_millis(500), server.write_all(&frame)).await
        {
            r.unwrap();
            written += frame.len();
            assert!(written < 64 * 1024 * 1024, "never blocked");
        }
        assert!(server.shared.state.lock().queued.len() <= HIGH_WATER);
        drop(client);
    }

    #[tokio::test]
    async fn bytes_queued_when_dropped_still_reach_the_peer() {
        let (mut server, mut client) = pair().await;
        server.write_all(b"last words").await.unwrap();
        drop(server);
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"last words");
    }

    #[tokio::test]
    async fn a_write_error_is_returned_by_later_writes() {
        let (mut server, client) = pair().await;
        drop(client);
        let frame = pattern(1000);
        let mut failed = None;
        for _ in 0..10_000 {
            if let Err(e) = server.write_all(&frame).await {
                failed = Some(e);
                break;
            }
            tokio::task::yield_now().await;
        }
        let e = failed.expect("writes to a closed peer never failed");
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ),
            "{e}"
        );
    }
}

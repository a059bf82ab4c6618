//! The connection a request came on, as its handlers see it
//! ([`ConnectionHandle`]): what its client certificate proved, its requests
//! in flight, and the switch that closes it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::auth::ConnectionIdentity;

/// A connection's shared state, handed to each of its requests: what its
/// client certificate proved, its request activity, and the switch that
/// closes it. Passed as an argument, not in the request's extensions: an
/// extension costs a map and a box per request.
#[derive(Clone, Default)]
pub(crate) struct ConnectionHandle {
    inner: Arc<HandleInner>,
}

#[derive(Default)]
struct HandleInner {
    /// What the client certificate proved (TLS only), computed once.
    identity: ConnectionIdentity,
    /// Requests whose response has not been fully sent.
    in_flight: AtomicUsize,
    /// Requests received so far.
    requests: AtomicU64,
    /// Signalled when `in_flight` becomes or stops being 0.
    changed: Notify,
    /// Cancelled to close the connection at once.
    close: CancellationToken,
}

impl ConnectionHandle {
    pub(crate) fn new(identity: ConnectionIdentity) -> ConnectionHandle {
        ConnectionHandle {
            inner: Arc::new(HandleInner {
                identity,
                ..HandleInner::default()
            }),
        }
    }

    /// What the connection's client certificate proved.
    pub(crate) fn identity(&self) -> &ConnectionIdentity {
        &self.inner.identity
    }

    /// Resolves once [`close_stalled`](Self::close_stalled) was called.
    pub(crate) async fn closed(&self) {
        self.inner.close.cancelled().await;
    }

    /// Closes the connection at once: a watch stream ended but its client
    /// does not read, so its response cannot be finished.
    pub(crate) fn close_stalled(&self) {
        self.inner.close.cancel();
    }

    pub(crate) fn request_started(&self) -> InFlight {
        self.inner.requests.fetch_add(1, Ordering::Relaxed);
        // Only the moves between idle and busy matter to `idle` (a
        // notification takes a lock; most requests move neither way).
        if self.inner.in_flight.fetch_add(1, Ordering::AcqRel) == 0 {
            self.inner.changed.notify_waiters();
        }
        InFlight(self.clone())
    }

    pub(crate) fn requests(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// Resolves once no request has been in flight for `after`.
    pub(crate) async fn idle(&self, after: Duration) {
        loop {
            let changed = self.inner.changed.notified();
            let mut changed = std::pin::pin!(changed);
            changed.as_mut().enable();
            if self.inner.in_flight.load(Ordering::Acquire) == 0 {
                tokio::select! {
                    _ = tokio::time::sleep(after) => return,
                    _ = changed => {}
                }
            } else {
                changed.await;
            }
        }
    }
}

/// A request in flight until its response body is dropped.
pub(crate) struct InFlight(ConnectionHandle);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.inner.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.inner.changed.notify_waiters();
        }
    }
}

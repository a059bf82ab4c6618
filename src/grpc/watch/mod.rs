//! The Watch service: every client watch whose range lies inside one cached
//! prefix is served from that prefix's [`KvCache`](super::kv_cache::KvCache)
//! ring; the rest (other ranges, a start revision the ring no longer holds,
//! a cache not ready) goes to etcd unchanged on one etcd stream per client
//! stream. A forwarded watch over a cached range moves onto the ring once
//! etcd's catch-up reaches it (an event, or etcd's progress notification or
//! progress answer, which etcd sends a synced watch only).
//!
//! One task per client stream owns its watches. A cached watch is only a
//! cursor into the ring: the task reads from it when the client can take
//! more (a bounded output), round-robin over the stream's watches, so a
//! slow client costs no queue growth and never slows the cache or other
//! streams; a watch whose cursor the ring overran is canceled with
//! `compact_revision`, as etcd cancels a compacted watch. Progress
//! requests are answered only once every event up to the answered revision
//! was sent (for forwarded watches too: etcd's answer is held until then).
//!
//! Split by concern, as etcd's grpcproxy splits its watch. Every piece but
//! `server` and `state` is an `impl ClientStream` block over the one task's
//! state, so a step never crosses a lock, a channel or a trait object:
//!
//! - `state`: the data only: `ClientStream` and the state of each concern,
//!   below every other piece (each imports it, it imports none of them).
//! - `stream`: the per-client stream: the task's loop, the client's
//!   requests, where a creation goes (cache or etcd).
//! - `cached`: watches served from a cache's ring (placing, reading
//!   batches round robin, the overrun cancel).
//! - `forwarded`: watches etcd serves (its stream, its answers, the
//!   handover to the ring).
//! - `compacted`: watches from a revision etcd compacted (the front's own
//!   answer, and its answer in etcd's place when a member froze).
//! - `progress`: progress requests and periodic progress notifications.
//! - `fragment`: fragmented responses (splitting the ring's, keeping
//!   etcd's whole).
//! - `server`: the tonic service with small per-stream codec buffers.

mod cached;
mod compacted;
mod forwarded;
mod fragment;
mod progress;
mod server;
mod state;
mod stream;
#[cfg(test)]
mod test_support;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use etcd_client::proto::*;

use super::Front;
use state::ClientStream;

pub use server::WatchServer;

/// Responses buffered towards one client stream. With
/// [`MAX_BATCH_BYTES`](cached::MAX_BATCH_BYTES) this bounds what a stream
/// whose client reads slowly holds (the ring holds the rest, shared): about
/// 4 x 128 KiB. 16 x 1 MiB let 10,000 watchers on 10 lagging streams hold
/// 21-23 KB each (docs/BENCHMARKS.md).
const OUT_BUFFER: usize = 4;
/// etcd's watch id of stream-wide answers (progress) and failed creations.
const INVALID_WATCH_ID: i64 = -1;
/// Responses a stream queues (`pending`) before it stops taking etcd's
/// answers and the client's requests: a client that stops reading then
/// holds back etcd (its watch stream's flow control), not the front's
/// memory. One step adds at most one response, or one batch when empty.
const MAX_PENDING: usize = 16;
/// The bytes a stream queues before it stops taking etcd's answers (see
/// `MAX_PENDING`): a stream holds about this much and one response more
/// (a revision of several MiB is one response unless the client asked
/// for fragments).
const MAX_PENDING_BYTES: usize = 1 << 20;

#[derive(Debug, Clone)]
pub struct WatchService {
    pub(crate) front: Arc<Front>,
}

#[tonic::async_trait]
impl PbWatchService for WatchService {
    type WatchStream = BoxStream<'static, Result<PbWatchResponse, Status>>;

    async fn watch(
        &self,
        req: Request<Streaming<PbWatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let (tx, rx) = mpsc::channel(OUT_BUFFER);
        let md = req.metadata().clone();
        let stream = ClientStream::new(Arc::clone(&self.front), md, tx);
        tokio::spawn(stream.run(req.into_inner()));
        Ok(Response::new(ReceiverStream::new(rx).boxed()))
    }
}

/// A watch moved from etcd to a cache.
fn move_watch(front: &Front) {
    front.watchers_forwarded.fetch_sub(1, Ordering::Relaxed);
    front.watchers_cached.fetch_add(1, Ordering::Relaxed);
    let g = &crate::metrics::metrics().grpc_watchers;
    g.with_label_values(&["etcd"]).dec();
    g.with_label_values(&["cache"]).inc();
}

fn count_watch(front: &Front, source: &str, delta: i64) {
    match source {
        "cache" => front.watchers_cached.fetch_add(delta, Ordering::Relaxed),
        _ => front.watchers_forwarded.fetch_add(delta, Ordering::Relaxed),
    };
    crate::metrics::metrics()
        .grpc_watchers
        .with_label_values(&[source])
        .add(delta);
    if delta > 0 {
        crate::metrics::metrics()
            .grpc_requests
            .with_label_values(&["watch", source])
            .inc();
    }
}

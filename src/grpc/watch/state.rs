//! The data of one client stream, and nothing else: `ClientStream` (owned
//! by its task) with the creation it reads (`CreateSpec`) and the state of
//! each concern (`CachedWatch`, `UpstreamWatch`, `AwaitingCreated`,
//! `PendingProgress`). The layer under every other file of `watch`: each
//! adds its behaviour in its own `impl` blocks, and calls the others'
//! without importing them.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::Status;
use tonic::metadata::MetadataMap;

use etcd_client::proto::*;

use super::Front;
use crate::grpc::kv::Compaction;
use crate::grpc::kv_cache::{Cursor, KvCache};

/// What the front reads of a `WatchCreateRequest` (whose type etcd-client
/// does not export by name).
#[derive(Clone)]
pub(super) struct CreateSpec {
    pub(super) key: Vec<u8>,
    pub(super) range_end: Vec<u8>,
    pub(super) start_revision: i64,
    pub(super) prev_kv: bool,
    pub(super) filters: Vec<i32>,
    pub(super) fragment: bool,
    pub(super) progress_notify: bool,
}

/// The responses a stream queued for its client, in order, and their
/// encoded bytes: a stream stops taking etcd's answers when either bound
/// (`MAX_PENDING`, `MAX_PENDING_BYTES`) is reached, so a forwarded watch
/// replaying revisions of megabytes holds a few of them, not sixteen.
#[derive(Default)]
pub(super) struct Pending {
    queue: VecDeque<(PbWatchResponse, usize)>,
    bytes: usize,
}

impl Pending {
    pub(super) fn push_back(&mut self, r: PbWatchResponse) {
        let n = prost::Message::encoded_len(&r);
        self.bytes += n;
        self.queue.push_back((r, n));
    }

    pub(super) fn pop_front(&mut self) -> Option<PbWatchResponse> {
        let (r, n) = self.queue.pop_front()?;
        self.bytes -= n;
        Some(r)
    }

    pub(super) fn len(&self) -> usize {
        self.queue.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The encoded size of what is queued.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    #[cfg(test)]
    pub(super) fn iter(&self) -> impl Iterator<Item = &PbWatchResponse> {
        self.queue.iter().map(|(r, _)| r)
    }

    #[cfg(test)]
    pub(super) fn clear(&mut self) {
        self.queue.clear();
        self.bytes = 0;
    }
}

/// One client stream's watches and queue, owned by its task (`run`).
pub(super) struct ClientStream {
    pub(super) front: Arc<Front>,
    pub(super) md: MetadataMap,
    pub(super) out: mpsc::Sender<Result<PbWatchResponse, Status>>,
    /// Control answers and the fragments of one batch, in order.
    pub(super) pending: Pending,
    pub(super) watches: Vec<CachedWatch>,
    /// Where the next round-robin turn starts.
    pub(super) rr: usize,
    /// Watches etcd serves.
    pub(super) forwarded: HashMap<i64, Forwarded>,
    /// Forwarded creations sent to etcd so far on this stream.
    pub(super) creations_sent: u64,
    /// The progress requests sent to etcd and not answered yet, oldest
    /// first, each with `creations_sent` when it went (see `covered_by`).
    pub(super) progress_asked: VecDeque<u64>,
    /// When etcd is asked for progress after creating a watch over a
    /// cached range (`ask_progress_later`).
    pub(super) ask_progress_at: Option<Instant>,
    /// Handed over to a cache, or canceled by the front in etcd's place
    /// (`answer_found_compacted`); etcd's answers for them (until its
    /// `canceled`) are dropped: the ring delivers those events, or the
    /// client was told the watch ended.
    pub(super) handing_over: HashSet<i64>,
    /// Forwarded watches the client canceled, until etcd's `canceled`:
    /// etcd's answers in flight for them are dropped (the client asked for
    /// no more), its `canceled` passed on once.
    pub(super) canceling: HashSet<i64>,
    pub(super) upstream: Option<UpstreamWatch>,
    pub(super) next_id: i64,
    pub(super) progress: Option<PendingProgress>,
    /// etcd's current revision being fetched for a progress request (off
    /// the stream's task: the stream goes on meanwhile).
    pub(super) revision_fetch: Option<RevisionFetch>,
    /// A creation forwarded to etcd and not answered yet: later requests
    /// wait, so `created` answers keep the order of the requests (clients
    /// such as clientv3 match them in order).
    pub(super) awaiting_created: Option<AwaitingCreated>,
    /// The forwarded watch whose fragmented response is partly queued:
    /// until its last fragment nothing else is queued, as clientv3 drops a
    /// response for another watch while it assembles one, and discards the
    /// fragments it has on a `created` or `canceled`.
    pub(super) open_fragment: Option<i64>,
    /// The highest event revision sent on this stream: a progress answer
    /// never goes back behind it.
    pub(super) max_sent: i64,
    /// The answers of the re-checks of forwarded creations' starts
    /// (`recheck`), sent by their tasks.
    pub(super) rechecks: mpsc::Sender<Rechecked>,
    pub(super) rechecked: mpsc::Receiver<Rechecked>,
    /// Forwarded creations (their `generation`) found from below etcd's
    /// compaction, with its compact revision: answered in etcd's place
    /// once etcd's `created` passed and no fragment is open.
    pub(super) compacted_found: Vec<(u64, i64)>,
}

/// One watch etcd serves (`forwarded`).
pub(super) struct Forwarded {
    /// Its creation, when a cache could take the watch over once etcd's
    /// catch-up reaches the ring.
    pub(super) spec: Option<CreateSpec>,
    /// Its creation's number (`creations_sent` once it was sent): which
    /// of etcd's progress answers cover it.
    pub(super) generation: u64,
    /// Its start's compaction check failed, and is asked again
    /// (`recheck`) until etcd sends it anything but `created`.
    pub(super) rechecking: bool,
    /// The check to ask again once etcd's `created` comes.
    pub(super) recheck: Option<RecheckSpec>,
    /// The client canceled it while its re-check was under way: the cancel
    /// waits for the re-check's answer (`release_held_cancel`).
    pub(super) cancel_held: bool,
}

/// What a re-check of a forwarded creation's start asks: whether etcd
/// compacted `checked` (the start, or the revision before it for
/// prev_kv), for a watch from `start_revision`.
pub(super) struct RecheckSpec {
    pub(super) key: Vec<u8>,
    pub(super) checked: i64,
    pub(super) start_revision: i64,
}

/// The answer of a re-check of a forwarded creation's start revision.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rechecked {
    /// The creation's `Forwarded::generation`.
    pub(super) generation: u64,
    pub(super) start_revision: i64,
    pub(super) compaction: Compaction,
}

/// One client watch served from a cache (`cached`).
pub(super) struct CachedWatch {
    pub(super) id: i64,
    pub(super) cache: Arc<KvCache>,
    pub(super) key: Vec<u8>,
    pub(super) range_end: Vec<u8>,
    pub(super) cursor: Cursor,
    /// Events below this revision are skipped (the start revision).
    pub(super) min_rev: i64,
    pub(super) prev_kv: bool,
    pub(super) no_put: bool,
    pub(super) no_delete: bool,
    pub(super) fragment: bool,
    pub(super) progress_notify: bool,
    pub(super) last_sent: Instant,
    /// The highest revision the client was already told about for this
    /// watch before the ring served it (etcd's events of a handed-over
    /// watch): progress notifications never go back behind it.
    pub(super) notified_rev: i64,
}

/// etcd's watch stream towards one client stream's forwarded watches
/// (`forwarded`).
pub(super) struct UpstreamWatch {
    pub(super) requests: mpsc::Sender<PbWatchRequest>,
    pub(super) responses: mpsc::Receiver<Result<PbWatchResponse, Status>>,
}

/// A creation etcd has not answered yet (`forwarded`).
pub(super) struct AwaitingCreated {
    pub(super) id: i64,
    /// `next_id` before an auto-assigned `id`: etcd refusing the creation
    /// gives it back, as etcd assigns an id only to a watch it creates.
    pub(super) prev_next_id: Option<i64>,
}

/// A progress request not answered yet (`progress`).
pub(super) struct PendingProgress {
    /// Forwarded watches exist: etcd was asked too; once it answered, its
    /// revision and the creations its answer covers (see `covered_by`).
    pub(super) upstream: Option<Option<UpstreamAnswer>>,
    /// The client's request, to ask etcd again.
    pub(super) request: PbWatchRequest,
    /// The revision the cached watches wait for before the answer.
    pub(super) catch_up: Option<CatchUp>,
}

/// etcd's answer to a progress request over the forwarded watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct UpstreamAnswer {
    pub(super) revision: i64,
    /// The forwarded watches whose creation number is at most this were
    /// created before the request it answers.
    pub(super) covers: u64,
}

/// A fetch of etcd's current revision for the pending progress request.
pub(super) struct RevisionFetch {
    /// etcd's revision, or `None` when etcd did not answer by `deadline`.
    pub(super) rx: tokio::sync::oneshot::Receiver<Option<i64>>,
    /// Another progress request came meanwhile: fetch again (its answer is
    /// at etcd's revision at the later request).
    pub(super) again: bool,
    /// The first waiting request's deadline (see [`CatchUp`]).
    pub(super) deadline: Instant,
}

/// etcd answers a progress request with its current revision; cached
/// watches wait (bounded) for their caches to get there, so the answer is
/// not behind etcd's (kube-apiserver's consistent reads wait for that).
#[derive(Debug, Clone, Copy)]
pub(super) struct CatchUp {
    /// etcd's revision when the request came.
    pub(super) revision: i64,
    /// After this, the answer is the revision the caches reached.
    pub(super) deadline: Instant,
}

//! Watches etcd serves: one etcd watch stream per client stream carries
//! them, its answers passed on unchanged (bar progress answers, which wait
//! for the cached watches). A forwarded watch over a cached range moves
//! onto the ring once etcd's catch-up reaches it.

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tracing::debug;

use etcd_client::proto::*;

use super::progress::is_progress_answer;
use super::state::{AwaitingCreated, ClientStream, CreateSpec, Forwarded, UpstreamWatch};
use super::{OUT_BUFFER, count_watch, move_watch};

/// The unanswered progress requests to etcd a stream keeps count of.
const MAX_ASKED: usize = 64;

/// How long after etcd created a watch over a cached range the front asks
/// etcd for progress (see `ask_progress_later`).
const PROGRESS_AFTER_CREATE: std::time::Duration = std::time::Duration::from_millis(1000);

impl ClientStream {
    /// Forwards a creation (`req`, carrying `id`) etcd serves; `spec` when
    /// a cache could take the watch over later.
    pub(super) async fn forward_create(
        &mut self,
        id: i64,
        prev_next_id: Option<i64>,
        spec: Option<CreateSpec>,
        req: PbWatchRequest,
    ) -> Result<(), Status> {
        if let Some(PbWatchRequestUnion::CreateRequest(c)) = &req.request_union {
            debug!(
                key = %String::from_utf8_lossy(&c.key),
                range_end = %String::from_utf8_lossy(&c.range_end),
                start_revision = c.start_revision,
                cacheable = spec.is_some(),
                "watch forwarded to etcd"
            );
        }
        self.creations_sent += 1;
        let generation = self.creations_sent;
        self.forwarded.insert(
            id,
            Forwarded {
                spec,
                generation,
                rechecking: false,
                recheck: None,
                cancel_held: false,
            },
        );
        self.awaiting_created = Some(AwaitingCreated { id, prev_next_id });
        count_watch(&self.front, "etcd", 1);
        self.front
            .creations_forwarded
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.send_upstream(req).await
    }

    /// Passes the client's cancel (`req`) of forwarded watch `id` on to
    /// etcd, once.
    pub(super) async fn cancel_forwarded(
        &mut self,
        id: i64,
        req: PbWatchRequest,
    ) -> Result<(), Status> {
        let Some(f) = self.forwarded.get_mut(&id) else {
            return Ok(()); // etcd ignores an unknown id
        };
        // No handover once the client canceled: an event
        // answer in flight would bring the watch back.
        f.spec = None;
        // etcd's sync loop would have judged its start within 100 ms; the
        // re-check standing in for it answers first (see `compacted`).
        if f.rechecking && f.recheck.is_none() && !self.canceling.contains(&id) {
            debug!(watch_id = id, "cancel held for the compaction re-check");
            f.cancel_held = true;
            return Ok(());
        }
        if !self.canceling.insert(id) {
            return Ok(()); // asked already; etcd answers once
        }
        self.send_upstream(req).await
    }

    pub(super) async fn send_upstream(&mut self, req: PbWatchRequest) -> Result<(), Status> {
        if self.upstream.is_none() {
            self.upstream = Some(self.open_upstream());
            self.progress_asked.clear();
        }
        let Some(up) = &self.upstream else {
            return Err(Status::internal("no etcd watch stream"));
        };
        let progress = matches!(
            req.request_union,
            Some(PbWatchRequestUnion::ProgressRequest(_))
        );
        up.requests
            .send(req)
            .await
            .map_err(|_| Status::unavailable("etcd watch stream closed"))?;
        // Not recorded past the bound: an answer then counts as one to an
        // older request, which covers less (see `covered_by`).
        if progress && self.progress_asked.len() < MAX_ASKED {
            self.progress_asked.push_back(self.creations_sent);
        }
        Ok(())
    }

    /// The forwarded creations etcd's next progress answer covers. etcd
    /// answers progress requests in order, but not each: while one waits
    /// for its watches to sync, it ignores the next (3.5.8+), and the
    /// waiting one's answer then covers every watch. Taking each answer as
    /// the oldest unanswered request's errs only towards covering less.
    /// An answer to a request sent before a creation does not speak for
    /// that watch, whose catch-up may not have been sent yet.
    fn covered_by_next_answer(&mut self) -> u64 {
        self.progress_asked.pop_front().unwrap_or(0)
    }

    /// Whether etcd's answer covering creations up to `covers` speaks for
    /// every forwarded watch the client still wants.
    pub(super) fn covers_forwarded(&self, covers: u64) -> bool {
        self.forwarded
            .iter()
            .filter(|(id, _)| !self.canceling.contains(id))
            .all(|(_, f)| f.generation <= covers)
    }

    /// Opens etcd's stream for this client stream's forwarded watches; a
    /// task pumps its answers into a bounded channel (etcd waits when the
    /// client is slow).
    fn open_upstream(&self) -> UpstreamWatch {
        let (req_tx, req_rx) = mpsc::channel::<PbWatchRequest>(64);
        let (resp_tx, resp_rx) = mpsc::channel(OUT_BUFFER);
        let upstream = self.front.upstream.clone();
        let md = self.md.clone();
        tokio::spawn(async move {
            let mut stream = match upstream
                .streaming::<_, PbWatchResponse, _>(
                    "/etcdserverpb.Watch/Watch",
                    &md,
                    ReceiverStream::new(req_rx),
                )
                .await
            {
                Ok(r) => r.into_inner(),
                Err(s) => {
                    let _ = resp_tx.send(Err(s)).await;
                    return;
                }
            };
            loop {
                tokio::select! {
                    _ = resp_tx.closed() => return,
                    m = stream.message() => {
                        let item = match m {
                            Ok(Some(r)) => Ok(r),
                            Ok(None) => Err(Status::unavailable("etcd closed the watch stream")),
                            Err(s) => Err(s),
                        };
                        let end = item.is_err();
                        if resp_tx.send(item).await.is_err() || end {
                            return;
                        }
                    }
                }
            }
        });
        UpstreamWatch {
            requests: req_tx,
            responses: resp_rx,
        }
    }

    /// An answer from etcd for a forwarded watch, passed on unchanged
    /// (progress answers wait for the cached watches, see `answer_progress`);
    /// the cancels for etcd of the watches that move onto the ring.
    pub(super) fn on_upstream(&mut self, resp: PbWatchResponse) -> Vec<PbWatchRequest> {
        if let Some(h) = &resp.header {
            self.front.headers.learn(h);
        }
        if resp.created || resp.canceled {
            debug!(
                watch_id = resp.watch_id,
                created = resp.created,
                canceled = resp.canceled,
                compact_revision = resp.compact_revision,
                "etcd's answer to a creation or cancel"
            );
        }
        if self.dropped(&resp) {
            return Vec::new();
        }
        if is_progress_answer(&resp) {
            let covers = self.covered_by_next_answer();
            // Every watch it covers is synced: etcd judged their starts.
            for f in self.forwarded.values_mut() {
                f.rechecking &= f.generation > covers;
            }
            self.upstream_progress(&resp, covers);
            // etcd answers a progress request only once every watch of its
            // stream is synced: each sent everything up to the revision.
            let rev = resp.header.as_ref().map_or(0, |h| h.revision);
            let mut cancels = self.hand_over_synced(rev, covers);
            cancels.extend(self.release_held_cancels());
            return cancels;
        }
        self.note_sent(&resp.events);
        self.settle_ids(&resp);
        if !resp.created {
            self.etcd_answered(resp.watch_id);
        } else if !resp.canceled {
            self.recheck(resp.watch_id);
        }
        if resp.created
            && !resp.canceled
            && self
                .forwarded
                .get(&resp.watch_id)
                .is_some_and(|f| f.spec.is_some())
        {
            self.ask_progress_later();
        }
        let handover = self.handover_point(&resp);
        self.track_fragment(&resp);
        let resp_id = resp.watch_id;
        self.pending.push_back(resp);
        // Only this watch's held cancel can be due (`etcd_answered`): no
        // walk of every forwarded watch per event.
        let released = self.release_held_cancel(resp_id);
        handover
            .and_then(|(id, from)| self.hand_over(id, from))
            .into_iter()
            .chain(released)
            .collect()
    }

    /// After etcd created a watch over a cached range: asks etcd for
    /// progress [`PROGRESS_AFTER_CREATE`] later (`ask_progress`), and its
    /// answer moves the watch onto the ring even if no event ever comes (a
    /// start at the revision the cache listed at, as kube-apiserver's
    /// compactor watches `compact_rev_key` from a Get's revision). Not at
    /// once: etcd defers the answer to a request that finds a watch still
    /// catching up until the stream's next event, which a quiet range never
    /// has; etcd syncs such a watch within its 100 ms sync loop.
    fn ask_progress_later(&mut self) {
        let at = Instant::now() + PROGRESS_AFTER_CREATE;
        self.ask_progress_at = Some(self.ask_progress_at.map_or(at, |t| t.min(at)));
    }

    /// `ask_progress_later`'s request, due: sent on the stream's own task,
    /// so it takes its place among the creations (see `covered_by_next_answer`).
    pub(super) async fn ask_progress(&mut self) -> Result<(), Status> {
        self.ask_progress_at = None;
        if self.upstream.is_none() {
            return Ok(());
        }
        let ask = PbWatchRequest {
            request_union: Some(PbWatchRequestUnion::ProgressRequest(Default::default())),
        };
        self.send_upstream(ask).await
    }

    /// Moves every forwarded watch over a cached range onto its ring after
    /// etcd said all of them were sent every event up to `rev`; the cancels
    /// for etcd. Without it a watch of a quiet prefix (no event to hand
    /// over at) would stay on etcd.
    fn hand_over_synced(&mut self, rev: i64, covers: u64) -> Vec<PbWatchRequest> {
        if rev <= 0 {
            return Vec::new();
        }
        let creating = self.awaiting_created.as_ref().map(|a| a.id);
        let ready: Vec<(i64, i64)> = self
            .forwarded
            .iter()
            .filter(|(id, _)| Some(**id) != creating)
            .filter(|(_, f)| f.generation <= covers)
            .filter_map(|(id, f)| {
                let spec = f.spec.as_ref()?;
                let from = (rev + 1).max(spec.start_revision);
                let cache = self.front.cache_for(&spec.key, &spec.range_end)?;
                cache.cursor_at(from).map(|_| (*id, from))
            })
            .collect();
        ready
            .into_iter()
            .filter_map(|(id, from)| self.hand_over(id, from))
            .collect()
    }

    /// Whether etcd's answer is dropped: for a watch handed over (the ring
    /// delivers its events) or canceled by the client (who asked for no
    /// more), until etcd's `canceled`, which only the latter passes on.
    fn dropped(&mut self, resp: &PbWatchResponse) -> bool {
        if self.handing_over.contains(&resp.watch_id) {
            if resp.canceled {
                self.handing_over.remove(&resp.watch_id);
            }
            return true;
        }
        if self.canceling.contains(&resp.watch_id) {
            if !resp.canceled {
                return true;
            }
            self.canceling.remove(&resp.watch_id);
        }
        false
    }

    /// Follows etcd's `created` and `canceled` in the stream's watch ids.
    fn settle_ids(&mut self, resp: &PbWatchResponse) {
        if resp.created
            && let Some(AwaitingCreated { id, prev_next_id }) = self.awaiting_created.take()
            && resp.watch_id != id
        {
            // etcd refused it (id -1) or chose another id (our 0 = "auto").
            let f = self.forwarded.remove(&id);
            if resp.canceled {
                count_watch(&self.front, "etcd", -1);
                if let Some(n) = prev_next_id {
                    self.next_id = n;
                }
            } else {
                let f = f.unwrap_or(Forwarded {
                    spec: None,
                    generation: self.creations_sent,
                    rechecking: false,
                    recheck: None,
                    cancel_held: false,
                });
                self.forwarded.insert(resp.watch_id, f);
            }
        }
        if resp.canceled && self.forwarded.remove(&resp.watch_id).is_some() {
            count_watch(&self.front, "etcd", -1);
        }
    }

    /// The revision a forwarded watch could continue from in the ring after
    /// this answer: etcd sent every event of the watch up to the answer's
    /// last one (whole revisions; the last fragment of a split one).
    /// An answer without events (not `created`) is etcd's progress
    /// notification of the watch, which etcd sends a synced watch only:
    /// every event up to its header's revision was sent.
    fn handover_point(&self, resp: &PbWatchResponse) -> Option<(i64, i64)> {
        if resp.fragment || resp.canceled || resp.created {
            return None;
        }
        let spec = self.forwarded.get(&resp.watch_id)?.spec.as_ref()?;
        let cache = self.front.cache_for(&spec.key, &spec.range_end)?;
        let last = if resp.events.is_empty() {
            resp.header.as_ref()?.revision
        } else {
            resp.events
                .iter()
                .filter_map(|e| e.kv.as_ref())
                .map(|kv| kv.mod_revision)
                .max()?
        };
        let from = (last + 1).max(spec.start_revision);
        cache.cursor_at(from).map(|_| (resp.watch_id, from))
    }

    /// Moves a forwarded watch onto its cache's ring from revision `from`
    /// (etcd sent everything before it) and returns the cancel for etcd.
    fn hand_over(&mut self, id: i64, from: i64) -> Option<PbWatchRequest> {
        let spec = self.forwarded.get(&id)?.spec.clone()?;
        let mut w = self.place(
            id,
            CreateSpec {
                start_revision: from,
                ..spec
            },
        )?;
        debug!(
            watch_id = id,
            from, "etcd's catch-up reached the ring; handed over"
        );
        self.forwarded.remove(&id);
        self.handing_over.insert(id);
        // etcd sent its events up to `from - 1`.
        w.notified_rev = from - 1;
        self.watches.push(w);
        move_watch(&self.front);
        Some(cancel_request(id))
    }
}

/// The cancel for etcd of forwarded watch `id`.
pub(super) fn cancel_request(id: i64) -> PbWatchRequest {
    let mut cancel = PbWatchRequestUnion::CancelRequest(Default::default());
    if let PbWatchRequestUnion::CancelRequest(c) = &mut cancel {
        c.watch_id = id;
    }
    PbWatchRequest {
        request_union: Some(cancel),
    }
}

/// etcd's next answer; never without its stream.
pub(super) async fn recv_upstream(
    up: &mut Option<UpstreamWatch>,
) -> Option<Result<PbWatchResponse, Status>> {
    match up {
        Some(u) => u.responses.recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::time::Duration;

    use super::*;
    use crate::grpc::watch::INVALID_WATCH_ID;
    use crate::grpc::watch::test_support::*;

    #[tokio::test]
    async fn a_canceled_forwarded_watch_is_not_handed_over() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        // A forwarded watch catching up over the cached range.
        h.cache.apply(vec![put("/c/a", b"1".to_vec(), 11)], 12);
        s.forwarded.insert(5, fwd(Some(spec("/c/a", 11))));
        s.handle(cancel(5)).await.expect("handled");
        s.handle(cancel(5)).await.expect("handled");
        assert!(matches!(
            h.to_etcd.try_recv().map(|r| r.request_union),
            Ok(Some(PbWatchRequestUnion::CancelRequest(c))) if c.watch_id == 5
        ));
        assert!(h.to_etcd.try_recv().is_err(), "etcd is asked once");
        // etcd's event in flight reaches the ring: no handover, not passed on.
        assert!(s.on_upstream(event_answer(5, "/c/a", 11)).is_empty());
        assert!(s.watches.is_empty(), "not resurrected as a cached watch");
        assert!(s.pending.is_empty(), "no events after the cancel");
        // etcd's `canceled`, once.
        let canceled = PbWatchResponse {
            watch_id: 5,
            canceled: true,
            ..Default::default()
        };
        assert!(s.on_upstream(canceled).is_empty());
        let got: Vec<(i64, bool)> = s.pending.iter().map(|r| (r.watch_id, r.canceled)).collect();
        assert_eq!(got, vec![(5, true)]);
        assert!(s.forwarded.is_empty() && s.canceling.is_empty());
    }

    /// A forwarded creation etcd refuses (its auth, say) gives its
    /// auto-assigned id back.
    #[tokio::test]
    async fn a_creation_etcd_refuses_uses_up_no_watch_id() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        s.handle(create_from("/x/a", "", 0)).await.expect("handled");
        assert_eq!(sent_create_id(&mut h.to_etcd), Some(0));
        let created = PbWatchResponse {
            watch_id: 0,
            created: true,
            ..Default::default()
        };
        assert!(s.on_upstream(created).is_empty());
        s.handle(create_from("/x/b", "", 0)).await.expect("handled");
        assert_eq!(sent_create_id(&mut h.to_etcd), Some(1));
        let refused = PbWatchResponse {
            watch_id: INVALID_WATCH_ID,
            created: true,
            canceled: true,
            cancel_reason: "etcdserver: permission denied".to_string(),
            ..Default::default()
        };
        assert!(s.on_upstream(refused).is_empty());
        s.handle(create_from("/x/c", "", 0)).await.expect("handled");
        assert_eq!(sent_create_id(&mut h.to_etcd), Some(1), "1 again");
        assert_eq!(
            s.forwarded.keys().copied().collect::<HashSet<_>>(),
            HashSet::from([0, 1])
        );
    }

    fn progress(id: i64, rev: i64) -> PbWatchResponse {
        PbWatchResponse {
            header: Some(PbResponseHeader {
                revision: rev,
                ..Default::default()
            }),
            watch_id: id,
            ..Default::default()
        }
    }

    fn canceled_ids(cancels: &[PbWatchRequest]) -> Vec<i64> {
        let mut ids: Vec<i64> = cancels
            .iter()
            .filter_map(|r| match &r.request_union {
                Some(PbWatchRequestUnion::CancelRequest(c)) => Some(c.watch_id),
                _ => None,
            })
            .collect();
        ids.sort();
        ids
    }

    /// A forwarded watch of a quiet cached prefix (its start older than the
    /// ring: no event ever comes to hand over at) moves onto the ring at
    /// etcd's answer to a progress request, which etcd sends only once
    /// every watch of the stream is synced; one starting later than that
    /// keeps its start.
    #[tokio::test]
    async fn a_quiet_forwarded_watch_moves_onto_the_ring_at_etcds_progress_answer() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        s.forwarded.insert(5, fwd(Some(spec("/c/a", 3))));
        s.forwarded.insert(6, fwd(Some(spec("/c/b", 30))));
        s.forwarded.insert(7, fwd(None)); // a range no cache holds
        let cancels = s.on_upstream(progress(INVALID_WATCH_ID, 12));
        assert_eq!(
            canceled_ids(&cancels),
            vec![5, 6],
            "etcd's watches canceled"
        );
        assert_eq!(
            s.forwarded.keys().copied().collect::<Vec<_>>(),
            vec![7],
            "the uncached one stays on etcd"
        );
        let mut starts: Vec<(i64, i64)> = s.watches.iter().map(|w| (w.id, w.min_rev)).collect();
        starts.sort();
        assert_eq!(starts, vec![(5, 13), (6, 30)]);
        // etcd's events of a handed-over watch are dropped; the ring's come.
        assert!(s.on_upstream(event_answer(5, "/c/a", 13)).is_empty());
        assert!(s.pending.is_empty());
        h.cache.apply(vec![put("/c/a", b"1".to_vec(), 13)], 13);
        assert!(s.next_events());
        let got: Vec<(i64, usize)> = s
            .pending
            .iter()
            .map(|r| (r.watch_id, r.events.len()))
            .collect();
        assert_eq!(got, vec![(5, 1)]);
    }

    /// etcd's `created` of a forwarded watch over a cached range asks etcd
    /// for progress a moment later (whose answer hands it over); an
    /// uncached one does not.
    #[tokio::test]
    async fn a_created_forwarded_watch_over_a_cached_range_asks_etcd_for_progress() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        s.forwarded.insert(5, fwd(Some(spec("/c/a", 10))));
        s.forwarded.insert(6, fwd(None));
        let created = |id| PbWatchResponse {
            created: true,
            ..progress(id, 10)
        };
        assert!(s.on_upstream(created(6)).is_empty());
        assert!(s.ask_progress_at.is_none(), "not for the uncached one");
        assert!(s.on_upstream(created(5)).is_empty());
        let due = s.ask_progress_at.expect("asks for the cached one");
        assert!(due >= Instant::now() + PROGRESS_AFTER_CREATE / 2, "later");
        s.ask_progress().await.expect("asked");
        assert!(matches!(
            h.to_etcd.try_recv(),
            Ok(PbWatchRequest {
                request_union: Some(PbWatchRequestUnion::ProgressRequest(_))
            })
        ));
        assert!(s.ask_progress_at.is_none());
        assert_eq!(
            canceled_ids(&s.on_upstream(progress(INVALID_WATCH_ID, 10))),
            vec![5]
        );
        assert_eq!(s.watches.len(), 1);
        assert_eq!(s.watches[0].min_rev, 11);
    }

    /// etcd's answer to a progress request sent before a watch's creation
    /// says nothing of that watch, which may still be catching up (its
    /// `created` may even come first: etcd sends control answers and
    /// watch answers on separate queues); it is handed over only at the
    /// answer to a request sent after it.
    #[tokio::test]
    async fn a_progress_answer_to_a_request_before_a_creation_does_not_hand_that_watch_over() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        forward_created(s, 5, "/c/a", 3, Some(spec("/c/a", 3)), 12).await;
        s.ask_progress().await.expect("asked");
        forward_created(s, 6, "/c/b", 3, Some(spec("/c/b", 3)), 12).await;
        // The answer to the request sent between the two creations.
        assert_eq!(
            canceled_ids(&s.on_upstream(progress(INVALID_WATCH_ID, 12))),
            vec![5],
            "only the watch created before the request"
        );
        assert_eq!(s.forwarded.keys().copied().collect::<Vec<_>>(), vec![6]);
        s.ask_progress().await.expect("asked");
        assert_eq!(
            canceled_ids(&s.on_upstream(progress(INVALID_WATCH_ID, 14))),
            vec![6]
        );
        let mut starts: Vec<(i64, i64)> = s.watches.iter().map(|w| (w.id, w.min_rev)).collect();
        starts.sort();
        assert_eq!(starts, vec![(5, 13), (6, 15)]);
    }

    /// etcd's progress notification of one forwarded watch (no events, not
    /// `created`) hands that watch over; its `created` does not.
    #[tokio::test]
    async fn a_forwarded_watch_moves_onto_the_ring_at_its_progress_notification() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        s.forwarded.insert(5, fwd(Some(spec("/c/a", 3))));
        let created = PbWatchResponse {
            created: true,
            ..progress(5, 12)
        };
        assert!(
            canceled_ids(&s.on_upstream(created)).is_empty(),
            "created: nothing sent yet"
        );
        assert!(s.watches.is_empty());
        let cancels = s.on_upstream(progress(5, 12));
        assert_eq!(canceled_ids(&cancels), vec![5]);
        assert!(s.forwarded.is_empty());
        assert_eq!(s.watches.len(), 1);
        assert_eq!(s.watches[0].min_rev, 13);
        // The notification itself reaches the client.
        let got: Vec<i64> = s.pending.iter().map(|r| r.watch_id).collect();
        assert_eq!(got, vec![5, 5]);
    }
}

//! Progress: the client's progress requests, answered only once every event
//! up to the answered revision was sent (for forwarded watches too: etcd's
//! answer is held until then), and the periodic progress notifications of
//! idle `progress_notify` watches.

use std::sync::Arc;

use tokio::time::Instant;
use tonic::Status;

use etcd_client::proto::*;

use super::state::{CatchUp, ClientStream, PendingProgress, RevisionFetch, UpstreamAnswer};
use super::{INVALID_WATCH_ID, MAX_PENDING};
use crate::grpc::kv_cache::{KvCache, Read};

/// etcd's answer to a progress request: stream-wide, no events, neither a
/// creation nor a cancel.
pub(super) fn is_progress_answer(resp: &PbWatchResponse) -> bool {
    resp.watch_id == INVALID_WATCH_ID && resp.events.is_empty() && !resp.created && !resp.canceled
}

impl ClientStream {
    /// The client's progress request (`request`): etcd is asked too when it
    /// serves watches of the stream; answered by `answer_progress`.
    pub(super) async fn request_progress(&mut self, request: PbWatchRequest) -> Result<(), Status> {
        // etcd's `progressIfSync` over no watchers sends nothing.
        let canceled_all = self.forwarded.keys().all(|id| self.canceling.contains(id));
        if self.watches.is_empty() && canceled_all {
            return Ok(());
        }
        let upstream = if self.forwarded.is_empty() {
            None
        } else {
            self.send_upstream(request.clone()).await?;
            Some(None)
        };
        // etcd's revision is fetched off this task: the stream's other
        // requests and events go on meanwhile (while etcd is unreachable,
        // for up to the consistent-read timeout).
        if !self.watches.is_empty() {
            match &mut self.revision_fetch {
                Some(f) => f.again = true,
                None => {
                    let deadline = Instant::now() + self.front.consistent_read_timeout;
                    self.fetch_revision(deadline);
                }
            }
        }
        // A second request before the first is answered is answered
        // with it (etcd, asked again, may answer now: it ignores a
        // request while one of its watches catches up), at etcd's
        // revision at the later one, by the first one's deadline.
        match &mut self.progress {
            Some(pp) => {
                if !matches!(pp.upstream, Some(Some(_))) {
                    pp.upstream = upstream;
                }
            }
            None => {
                self.progress = Some(PendingProgress {
                    upstream,
                    request,
                    catch_up: None,
                })
            }
        }
        Ok(())
    }

    /// Starts fetching etcd's current revision, given up at `deadline`.
    fn fetch_revision(&mut self, deadline: Instant) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let front = Arc::clone(&self.front);
        tokio::spawn(async move {
            let rev = tokio::time::timeout_at(deadline, front.storage.fresh_revision())
                .await
                .ok()
                .and_then(Result::ok);
            let _ = tx.send(rev);
        });
        self.revision_fetch = Some(RevisionFetch {
            rx,
            again: false,
            deadline,
        });
    }

    /// etcd's revision for the pending progress request came (`None`: not
    /// in time; the answer is then what the caches reached, as before).
    pub(super) fn fetched_revision(&mut self, revision: Option<i64>) {
        let Some(fetch) = self.revision_fetch.take() else {
            return;
        };
        if let Some(revision) = revision {
            if let Some(new) = self.catch_up(revision, fetch.deadline)
                && let Some(pp) = &mut self.progress
            {
                pp.catch_up = Some(match pp.catch_up {
                    Some(old) => CatchUp {
                        revision: old.revision.max(new.revision),
                        ..old
                    },
                    None => new,
                });
            }
            if fetch.again && Instant::now() < fetch.deadline {
                self.fetch_revision(fetch.deadline);
            }
        }
    }

    /// What the cached watches of a progress request wait for: etcd's
    /// current revision, each of their caches asked for progress so an
    /// idle prefix gets there too. `None` without cached watches.
    fn catch_up(&self, revision: i64, deadline: Instant) -> Option<CatchUp> {
        if self.watches.is_empty() {
            return None;
        }
        let mut asked: Vec<&Arc<KvCache>> = Vec::new();
        for w in &self.watches {
            if w.cache.revision() < revision && !asked.iter().any(|c| Arc::ptr_eq(c, &w.cache)) {
                w.cache.request_progress();
                asked.push(&w.cache);
            }
        }
        Some(CatchUp { revision, deadline })
    }

    /// etcd's answer to a progress request, never passed on: etcd's
    /// revision says nothing of the cached watches. Kept only for the
    /// answer being assembled (a second answer to requests sent back to
    /// back is dropped).
    pub(super) fn upstream_progress(&mut self, resp: &PbWatchResponse, covers: u64) {
        if let Some(PendingProgress {
            upstream: Some(answer @ None),
            ..
        }) = &mut self.progress
        {
            *answer = Some(UpstreamAnswer {
                revision: resp.header.as_ref().map(|h| h.revision).unwrap_or(0),
                covers,
            });
        }
    }

    /// Events about to be sent: a progress answer never goes back behind
    /// them.
    pub(super) fn note_sent(&mut self, events: &[PbEvent]) {
        for e in events {
            if let Some(kv) = &e.kv {
                self.max_sent = self.max_sent.max(kv.mod_revision);
            }
        }
    }

    /// Answers a pending progress request once every cached watch is up to
    /// date, at etcd's revision of the request (see [`CatchUp`]), and etcd
    /// answered for the forwarded ones: the revision is the
    /// lowest one every watch of the stream has been sent up to, and never
    /// behind an event already sent (else the caches are asked for
    /// progress, or etcd asked again: `Some(request)` to send it).
    pub(super) fn answer_progress(&mut self) -> Option<PbWatchRequest> {
        if self.revision_fetch.is_some() {
            return None; // etcd's revision is on its way (bounded)
        }
        let wanted = self.forwarded.keys().any(|id| !self.canceling.contains(id));
        if !wanted && self.watches.is_empty() {
            // Every watch of the stream was canceled meanwhile: etcd's
            // `progressIfSync` over no watchers sends nothing.
            self.progress = None;
            return None;
        }
        let answer = self.progress.as_ref()?.upstream;
        let covered = matches!(answer, Some(Some(a)) if self.covers_forwarded(a.covers));
        let p = self.progress.as_mut()?;
        let upstream_rev = match answer {
            // No forwarded watch left to wait for.
            _ if !wanted => None,
            Some(None) => return None, // etcd has not answered yet
            Some(Some(a)) if covered => Some(a.revision),
            // A watch etcd serves was created after the request etcd
            // answered (or after the client's, which etcd was not asked):
            // etcd is asked now.
            Some(Some(_)) | None => {
                p.upstream = Some(None);
                return Some(p.request.clone());
            }
        };
        let catch_up = p.catch_up;
        let cached = self.cached_progress(catch_up)?;
        let rev = match (upstream_rev, cached) {
            (Some(u), Some(c)) => u.min(c),
            (Some(u), None) => u,
            (None, Some(c)) => c,
            (None, None) => self.front.revision(),
        };
        if rev < self.max_sent {
            return self.progress_behind(upstream_rev);
        }
        self.progress = None;
        self.pending.push_back(PbWatchResponse {
            header: self.header(rev),
            watch_id: INVALID_WATCH_ID,
            ..Default::default()
        });
        None
    }

    /// The lowest revision the cached watches were sent up to (`Some(None)`
    /// without any); `None` while one has events to send, or its cache is
    /// behind `catch_up` (`CatchUpExpired` ends that wait).
    fn cached_progress(&self, catch_up: Option<CatchUp>) -> Option<Option<i64>> {
        let mut cached: Option<i64> = None;
        for w in &self.watches {
            match w.cache.read(w.cursor, 1, 0) {
                Read::UpToDate { revision } => {
                    cached = Some(cached.map_or(revision, |r| r.min(revision)));
                }
                _ => return None,
            }
        }
        if let (Some(c), Some(t)) = (cached, catch_up)
            && c < t.revision
        {
            return None; // the caches are catching up
        }
        Some(cached)
    }

    /// The answer would go back behind an event already sent: the caches
    /// behind it are asked for progress, etcd asked again (`Some(request)`)
    /// if its answer is behind.
    fn progress_behind(&mut self, upstream_rev: Option<i64>) -> Option<PbWatchRequest> {
        for w in &self.watches {
            if w.cache.revision() < self.max_sent {
                w.cache.request_progress();
            }
        }
        if let Some(u) = upstream_rev
            && u < self.max_sent
        {
            let p = self.progress.as_mut()?;
            p.upstream = Some(None);
            return Some(p.request.clone());
        }
        None
    }

    /// etcd's periodic progress notification of `progress_notify` watches
    /// that are up to date and sent nothing for the interval. At most what
    /// fits in `pending`: the others are due at a later tick.
    pub(super) fn progress_notify(&mut self) {
        let now = Instant::now();
        let every = self.front.progress_notify_interval;
        let room = MAX_PENDING.saturating_sub(self.pending.len());
        let mut out = Vec::new();
        for w in &mut self.watches {
            if out.len() >= room {
                break;
            }
            if !w.progress_notify || now.duration_since(w.last_sent) < every {
                continue;
            }
            if let Read::UpToDate { revision } = w.cache.read(w.cursor, 1, 0)
                && revision >= w.notified_rev
            {
                w.last_sent = now;
                out.push((w.id, revision));
            }
        }
        for (id, revision) in out {
            let header = self.header(revision);
            self.pending.push_back(PbWatchResponse {
                header,
                watch_id: id,
                ..Default::default()
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::ReceiverStream;

    use super::*;
    use crate::grpc::watch::state::CreateSpec;
    use crate::grpc::watch::test_support::*;

    fn progress_answer(rev: i64) -> PbWatchResponse {
        PbWatchResponse {
            header: Some(PbResponseHeader {
                revision: rev,
                ..Default::default()
            }),
            watch_id: INVALID_WATCH_ID,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_second_progress_answer_from_etcd_is_not_passed_on() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        // A cached watch behind the cache (an event at 11 not read yet)
        // and a forwarded one.
        let w = s.place(1, spec("/c/a", 0)).expect("cached watch");
        s.watches.push(w);
        s.forwarded.insert(2, fwd(None));
        h.cache.apply(vec![put("/c/a", b"1".to_vec(), 11)], 11);
        // Two requests back to back: etcd is asked (and answers) twice.
        s.handle(progress_request()).await.expect("handled");
        s.handle(progress_request()).await.expect("handled");
        // etcd's revision, fetched off the stream (the harness's etcd is
        // not there: the answer is what the caches reached).
        assert!(s.answer_progress().is_none(), "waits for etcd's revision");
        let rev = super::super::stream::recv_revision(&mut s.revision_fetch).await;
        s.fetched_revision(rev);
        for _ in 0..2 {
            assert!(matches!(
                h.to_etcd.try_recv().map(|r| r.request_union),
                Ok(Some(PbWatchRequestUnion::ProgressRequest(_)))
            ));
        }
        assert!(s.on_upstream(progress_answer(20)).is_empty());
        assert!(s.on_upstream(progress_answer(20)).is_empty());
        assert!(s.pending.is_empty(), "etcd's answers are not passed on");
        // The answer: after the event, at the cached watch's revision.
        assert!(s.next_events());
        assert!(!s.next_events());
        assert!(s.answer_progress().is_none());
        let revs: Vec<(usize, i64)> = s
            .pending
            .iter()
            .map(|r| (r.events.len(), r.header.as_ref().map_or(0, |h| h.revision)))
            .collect();
        assert_eq!(revs, vec![(1, 11), (0, 11)]);
        assert!(s.progress.is_none());
    }

    /// A progress request that found etcd at `revision`.
    fn pending_progress(revision: i64, wait: Duration) -> PendingProgress {
        PendingProgress {
            upstream: None,
            request: progress_request(),
            catch_up: Some(CatchUp {
                revision,
                deadline: Instant::now() + wait,
            }),
        }
    }

    fn answered(s: &ClientStream) -> Vec<i64> {
        s.pending
            .iter()
            .filter(|r| r.watch_id == INVALID_WATCH_ID)
            .map(|r| r.header.as_ref().map_or(0, |h| h.revision))
            .collect()
    }

    #[tokio::test]
    async fn progress_waits_for_the_caches_to_reach_etcds_revision() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        let w = s.place(1, spec("/c/a", 0)).expect("cached watch");
        s.watches.push(w);
        // etcd was at 20 when the client asked; the idle cache is at 10.
        s.progress = Some(pending_progress(20, Duration::from_secs(600)));
        assert!(!s.next_events());
        assert!(s.answer_progress().is_none());
        assert!(answered(s).is_empty(), "not answered behind etcd's 20");
        // The cache's progress from etcd.
        h.cache.apply(Vec::new(), 21);
        assert!(!s.next_events());
        assert!(s.answer_progress().is_none());
        assert_eq!(answered(s), [21]);
        assert!(s.progress.is_none());
    }

    /// A cache that does not catch up in time delays the answer, bounded:
    /// then it is what the cache reached.
    #[tokio::test(start_paused = true)]
    async fn progress_waits_for_the_caches_only_until_the_deadline() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let quiet = CreateSpec {
            progress_notify: false,
            ..spec("/c/a", 0)
        };
        let w = h.stream.place(1, quiet).expect("cached watch");
        h.stream.watches.push(w);
        h.stream.progress = Some(pending_progress(20, Duration::from_secs(3)));
        let asked = Instant::now();
        let (_client, requests) = mpsc::channel::<PbWatchRequest>(1);
        tokio::spawn(h.stream.run(ReceiverStream::new(requests).map(Ok)));
        let got = tokio::time::timeout(Duration::from_secs(3600), h.out.recv())
            .await
            .expect("answered")
            .expect("stream open")
            .expect("ok");
        assert_eq!(got.watch_id, INVALID_WATCH_ID);
        assert_eq!(got.header.map(|h| h.revision), Some(10));
        assert!(
            asked.elapsed() >= Duration::from_secs(3),
            "after the deadline"
        );
    }

    #[tokio::test]
    async fn progress_notify_never_goes_behind_a_handed_over_watch() {
        let mut h = harness(8, Duration::ZERO).await;
        let s = &mut h.stream;
        s.forwarded.insert(5, fwd(Some(spec("/c/a", 5))));
        // etcd, ahead of the cache (at 10), sent the event at 15.
        let cancel = s.on_upstream(event_answer(5, "/c/a", 15));
        assert_eq!(cancel.len(), 1, "handed over to the ring");
        assert_eq!(s.watches.len(), 1);
        s.pending.clear();
        s.progress_notify();
        assert!(s.pending.is_empty(), "10 would go back behind 15");
        h.cache.apply(Vec::new(), 16);
        s.progress_notify();
        let got: Vec<(i64, i64)> = s
            .pending
            .iter()
            .map(|r| (r.watch_id, r.header.as_ref().map_or(0, |h| h.revision)))
            .collect();
        assert_eq!(got, vec![(5, 16)]);
    }

    /// A progress answer speaks for a watch etcd serves only through
    /// etcd's answer to a request sent after the watch's creation: one to
    /// an earlier request (the front's own, here) is not enough, and etcd
    /// is asked again.
    #[tokio::test]
    async fn a_forwarded_watch_created_after_etcds_request_waits_for_another_answer() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        forward_created(s, 5, "/x/a", 0, None, 12).await;
        s.ask_progress().await.expect("asked");
        forward_created(s, 6, "/x/b", 3, None, 12).await;
        s.handle(progress_request()).await.expect("handled");
        let sent: Vec<bool> = std::iter::from_fn(|| h.to_etcd.try_recv().ok())
            .map(|r| {
                matches!(
                    r.request_union,
                    Some(PbWatchRequestUnion::ProgressRequest(_))
                )
            })
            .collect();
        assert_eq!(sent, [false, true, false, true]);
        // The answer to the front's request, sent before watch 6.
        assert!(s.on_upstream(progress_answer(12)).is_empty());
        let again = s.answer_progress().expect("etcd asked again");
        assert!(answered(s).is_empty(), "not answered for watch 6 yet");
        s.send_upstream(again).await.expect("sent");
        // The answer to the client's request, then to the one just sent.
        assert!(s.on_upstream(progress_answer(13)).is_empty());
        assert!(s.answer_progress().is_none());
        assert_eq!(answered(s), [13]);
    }

    /// A progress request still pending when the client canceled every
    /// watch of its stream is not answered (etcd answers over the watchers
    /// it has): an answer would speak for a watch the client gave up,
    /// whose last events etcd may not have sent.
    #[tokio::test]
    async fn a_progress_request_is_not_answered_once_every_watch_is_canceled() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        forward_created(s, 5, "/x/a", 3, None, 12).await;
        s.handle(progress_request()).await.expect("handled");
        s.handle(cancel(5)).await.expect("handled");
        assert!(s.answer_progress().is_none());
        assert!(answered(s).is_empty(), "not answered");
        assert!(s.progress.is_none(), "dropped");
    }

    /// A client's progress request that found no watch etcd serves, still
    /// pending when one is created: etcd is asked before it is answered.
    #[tokio::test]
    async fn a_pending_progress_request_asks_etcd_for_a_watch_forwarded_meanwhile() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        let w = s.place(1, spec("/c/a", 0)).expect("cached watch");
        s.watches.push(w);
        s.progress = Some(PendingProgress {
            upstream: None,
            request: progress_request(),
            catch_up: None,
        });
        forward_created(s, 5, "/x/a", 3, None, 12).await;
        let ask = s.answer_progress().expect("etcd asked");
        assert!(answered(s).is_empty(), "not at the cache's 10 yet");
        s.send_upstream(ask).await.expect("sent");
        assert!(s.on_upstream(progress_answer(12)).is_empty());
        assert!(s.answer_progress().is_none());
        assert_eq!(answered(s), [10], "the cached watch's revision");
    }

    /// etcd's `progressIfSync` over no watchers sends nothing; a watch the
    /// client canceled does not count.
    #[tokio::test]
    async fn a_progress_request_without_watches_is_not_answered() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        s.handle(progress_request()).await.expect("handled");
        s.forwarded.insert(5, fwd(None));
        s.canceling.insert(5);
        s.handle(progress_request()).await.expect("handled");
        assert!(!s.next_events());
        assert!(s.answer_progress().is_none());
        assert!(s.pending.is_empty(), "no answer");
        assert!(s.progress.is_none());
        assert!(h.to_etcd.try_recv().is_err(), "etcd is not asked");
    }
}

//! Watches from a revision etcd compacted: etcd creates such a watch, then
//! its sync loop (every 100 ms) cancels it with `compact_revision`. A member
//! that freezes in between leaves the client with neither events nor the
//! cancel, so the front gives etcd's answer itself: at once when its check
//! of the start (`Front::compaction`) answers, else in etcd's place once a
//! re-check, asked while etcd serves the watch, finds the start compacted.
//! A client's cancel of such a watch waits for the re-check's answer, as
//! etcd's sync loop would have answered before it.

use std::sync::Arc;
use std::time::Duration;

use tracing::debug;

use etcd_client::proto::*;

use super::count_watch;
use super::forwarded::cancel_request;
use super::state::{ClientStream, RecheckSpec, Rechecked};
use crate::grpc::kv::Compaction;

/// How long a failed check of a forwarded creation's start is asked again:
/// a client with neither events nor a cancel gives up on a watch after a
/// few seconds (etcd's own clients, after their progress requests go
/// unanswered).
const RECHECK_FOR: Duration = Duration::from_secs(10);
/// The pause between two re-checks.
const RECHECK_PAUSE: Duration = Duration::from_millis(500);

impl ClientStream {
    /// etcd's answer to a creation from below its compaction: `created`
    /// (at etcd's `revision`), then the sync loop's cancel, which carries
    /// `compact_revision`, no reason, and a header at revision 0 (mvcc's
    /// `WatchResponse` names no revision).
    pub(super) fn answer_compacted(&mut self, id: i64, compact_revision: i64, revision: i64) {
        debug!(
            watch_id = id,
            compact_revision, "watch from a compacted revision; canceled"
        );
        crate::metrics::metrics()
            .grpc_requests
            .with_label_values(&["watch", "cache"])
            .inc();
        self.pending.push_back(PbWatchResponse {
            header: self.header(revision),
            watch_id: id,
            created: true,
            ..Default::default()
        });
        self.push_compacted_cancel(id, compact_revision);
    }

    fn push_compacted_cancel(&mut self, id: i64, compact_revision: i64) {
        self.pending.push_back(PbWatchResponse {
            header: self.header(0),
            watch_id: id,
            canceled: true,
            compact_revision,
            ..Default::default()
        });
    }

    /// Marks the forwarded creation of watch `id` (just sent), from
    /// `start_revision`, whose check at `checked` was not answered (a
    /// member fault): once etcd's `created` shows etcd reachable again,
    /// the check is asked again (`recheck`).
    pub(super) fn recheck_at_created(
        &mut self,
        id: i64,
        key: Vec<u8>,
        checked: i64,
        start_revision: i64,
    ) {
        if let Some(f) = self.forwarded.get_mut(&id) {
            f.rechecking = true;
            f.recheck = Some(RecheckSpec {
                key,
                checked,
                start_revision,
            });
        }
    }

    /// etcd created forwarded watch `id`: its start's check, if one is
    /// due, is asked by a task for [`RECHECK_FOR`], which hands the answer
    /// to the stream (`on_rechecked`).
    pub(super) fn recheck(&mut self, id: i64) {
        let Some(f) = self.forwarded.get_mut(&id) else {
            return;
        };
        let Some(RecheckSpec {
            key,
            checked,
            start_revision,
        }) = f.recheck.take()
        else {
            return;
        };
        let generation = f.generation;
        let front = Arc::clone(&self.front);
        let md = self.md.clone();
        let tx = self.rechecks.clone();
        tokio::spawn(async move {
            let ask = async {
                loop {
                    let c = front.compaction(&key, checked, &md).await;
                    debug!(checked, compaction = ?c, "compaction re-check");
                    if c != Compaction::Unknown {
                        return c;
                    }
                    tokio::time::sleep(RECHECK_PAUSE).await;
                }
            };
            // Bounded as a whole: a client's cancel may be waiting for it.
            let compaction = tokio::select! {
                _ = tx.closed() => return, // the stream ended
                c = tokio::time::timeout(RECHECK_FOR, ask) => c.unwrap_or(Compaction::Unknown),
            };
            let _ = tx
                .send(Rechecked {
                    generation,
                    start_revision,
                    compaction,
                })
                .await;
        });
    }

    /// A re-check's answer: a start below etcd's compaction is noted, to
    /// be answered (`answer_found_compacted`) unless etcd sends the watch
    /// anything first; else the client's held cancel goes to etcd (the
    /// requests for etcd).
    pub(super) fn on_rechecked(&mut self, r: Rechecked) -> Vec<PbWatchRequest> {
        debug!(
            start_revision = r.start_revision,
            compaction = ?r.compaction,
            "compaction re-check answered"
        );
        let Some((&id, f)) = self
            .forwarded
            .iter_mut()
            .find(|(_, f)| f.generation == r.generation)
        else {
            return Vec::new(); // etcd canceled it, or the client's cancel went through
        };
        match r.compaction {
            Compaction::At {
                compact_revision, ..
            } if r.start_revision < compact_revision && f.rechecking => {
                self.compacted_found.push((r.generation, compact_revision));
                Vec::new()
            }
            _ => {
                // Only this watch's held cancel can have become due.
                f.rechecking = false;
                self.release_held_cancel(id).into_iter().collect()
            }
        }
    }

    /// The client's cancels held for a re-check (`cancel_forwarded`) that
    /// no longer runs, after an etcd progress answer judged the starts of
    /// the watches it covers. Their requests for etcd.
    pub(super) fn release_held_cancels(&mut self) -> Vec<PbWatchRequest> {
        let ids: Vec<i64> = self.forwarded.keys().copied().collect();
        ids.into_iter()
            .filter_map(|id| self.release_held_cancel(id))
            .collect()
    }

    /// Forwarded watch `id`'s held cancel, if it is due; the request for
    /// etcd.
    pub(super) fn release_held_cancel(&mut self, id: i64) -> Option<PbWatchRequest> {
        let f = self.forwarded.get_mut(&id)?;
        if !f.cancel_held || f.rechecking {
            return None;
        }
        f.cancel_held = false;
        self.canceling.insert(id);
        Some(cancel_request(id))
    }

    /// etcd sent forwarded watch `id` something besides `created` (an
    /// event, a progress notification): etcd judged its start, so the
    /// front no longer answers for it.
    pub(super) fn etcd_answered(&mut self, id: i64) {
        if let Some(f) = self.forwarded.get_mut(&id) {
            f.rechecking = false;
        }
    }

    /// Answers each forwarded watch found from below etcd's compaction as
    /// etcd's sync loop would have (its cancel with `compact_revision`),
    /// once etcd's `created` has passed; the cancels for etcd. etcd's own
    /// answers for it are dropped from then on (`handing_over`), so the
    /// client hears one cancel. A client that canceled meanwhile gets this
    /// cancel, as from etcd when its sync loop came first.
    pub(super) fn answer_found_compacted(&mut self) -> Vec<PbWatchRequest> {
        if self.compacted_found.is_empty() {
            return Vec::new();
        }
        let awaiting = self.awaiting_created.as_ref().map(|a| a.id);
        let mut cancels = Vec::new();
        for (generation, compact_revision) in std::mem::take(&mut self.compacted_found) {
            let Some((&id, f)) = self
                .forwarded
                .iter()
                .find(|(_, f)| f.generation == generation)
            else {
                continue;
            };
            if !f.rechecking {
                continue;
            }
            if Some(id) == awaiting {
                self.compacted_found.push((generation, compact_revision));
                continue;
            }
            debug!(
                watch_id = id,
                compact_revision, "forwarded watch from a compacted revision; canceled"
            );
            self.forwarded.remove(&id);
            count_watch(&self.front, "etcd", -1);
            self.handing_over.insert(id);
            self.push_compacted_cancel(id, compact_revision);
            if !self.canceling.remove(&id) {
                cancels.push(cancel_request(id));
            }
        }
        cancels
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::grpc::watch::test_support::*;

    fn compacted_at(generation: u64, compact_revision: i64) -> Rechecked {
        Rechecked {
            generation,
            start_revision: 3,
            compaction: Compaction::At {
                compact_revision,
                revision: 12,
            },
        }
    }

    fn canceled(id: i64) -> PbWatchResponse {
        PbWatchResponse {
            watch_id: id,
            canceled: true,
            ..Default::default()
        }
    }

    /// What the client was sent: (watch id, created, canceled,
    /// compact_revision, events).
    fn sent(s: &ClientStream) -> Vec<(i64, bool, bool, i64, usize)> {
        s.pending
            .iter()
            .map(|r| {
                (
                    r.watch_id,
                    r.created,
                    r.canceled,
                    r.compact_revision,
                    r.events.len(),
                )
            })
            .collect()
    }

    fn canceled_upstream(cancels: &[PbWatchRequest]) -> Vec<i64> {
        cancels
            .iter()
            .filter_map(|r| match &r.request_union {
                Some(PbWatchRequestUnion::CancelRequest(c)) => Some(c.watch_id),
                _ => None,
            })
            .collect()
    }

    /// A forwarded creation whose check failed, then found compacted
    /// while etcd (a frozen member) sent only `created`: the client gets
    /// etcd's compacted cancel from the front, etcd is told to cancel, and
    /// etcd's own late cancel is not passed on a second time.
    #[tokio::test]
    async fn a_forwarded_watch_found_compacted_is_canceled_in_etcds_place() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        forward_created(s, 5, "/x/a", 3, None, 12).await;
        s.forwarded.get_mut(&5).expect("forwarded").rechecking = true;
        let generation = s.forwarded[&5].generation;
        s.on_rechecked(compacted_at(generation, 8));
        let cancels = s.answer_found_compacted();
        assert_eq!(canceled_upstream(&cancels), vec![5]);
        assert_eq!(
            sent(s),
            vec![(5, true, false, 0, 0), (5, false, true, 8, 0)],
            "etcd's created, then the front's cancel with etcd's compact revision"
        );
        assert_eq!(
            s.pending
                .iter()
                .last()
                .and_then(|r| r.header.as_ref())
                .map(|h| h.revision),
            Some(0)
        );
        assert!(s.forwarded.is_empty());
        // etcd, back, cancels it too: dropped, and the id is free again.
        assert!(s.on_upstream(canceled(5)).is_empty());
        assert_eq!(s.pending.len(), 2, "one cancel reaches the client");
        assert!(s.handing_over.is_empty());
        assert!(s.answer_found_compacted().is_empty(), "answered once");
    }

    /// etcd sending the watch anything but `created` (an event here) means
    /// it judged the start itself: a re-check's later answer changes
    /// nothing; nor does one that finds the start not compacted.
    #[tokio::test]
    async fn a_forwarded_watch_etcd_answered_is_left_to_etcd() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        forward_created(s, 5, "/x/a", 3, None, 12).await;
        s.forwarded.get_mut(&5).expect("forwarded").rechecking = true;
        let g5 = s.forwarded[&5].generation;
        assert!(s.on_upstream(event_answer(5, "/x/a", 9)).is_empty());
        s.on_rechecked(compacted_at(g5, 8));
        assert!(s.answer_found_compacted().is_empty());

        forward_created(s, 6, "/x/b", 3, None, 12).await;
        s.forwarded.get_mut(&6).expect("forwarded").rechecking = true;
        let g6 = s.forwarded[&6].generation;
        s.on_rechecked(compacted_at(g6, 3)); // the start itself: not compacted
        assert!(s.answer_found_compacted().is_empty());
        assert!(!s.forwarded[&6].rechecking);
        assert!(sent(s).iter().all(|r| !r.2), "no cancel: {:?}", sent(s));
    }

    /// A re-check that answers before etcd's `created` waits for it, so the
    /// client hears `created` first; a client that canceled meanwhile gets
    /// the compacted cancel, and etcd is asked to cancel once.
    #[tokio::test]
    async fn a_compacted_start_found_before_created_is_answered_after_it() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        s.forward_create(7, None, None, create_from("/x/a", "", 3))
            .await
            .expect("sent");
        s.forwarded.get_mut(&7).expect("forwarded").rechecking = true;
        let generation = s.forwarded[&7].generation;
        s.on_rechecked(compacted_at(generation, 8));
        assert!(s.answer_found_compacted().is_empty(), "created first");
        assert!(s.pending.is_empty());
        let created = PbWatchResponse {
            watch_id: 7,
            created: true,
            ..Default::default()
        };
        assert!(s.on_upstream(created).is_empty());
        s.handle(cancel(7)).await.expect("handled");
        let asked: Vec<_> = std::iter::from_fn(|| h.to_etcd.try_recv().ok()).collect();
        assert_eq!(
            canceled_upstream(&s.answer_found_compacted()),
            vec![7],
            "etcd asked once: {asked:?}"
        );
        assert!(canceled_upstream(&asked).is_empty());
        assert_eq!(
            sent(s),
            vec![(7, true, false, 0, 0), (7, false, true, 8, 0)]
        );
        assert!(s.on_upstream(canceled(7)).is_empty());
        assert_eq!(s.pending.len(), 2, "etcd's answer to the cancel is dropped");
        assert!(s.canceling.is_empty() && s.handing_over.is_empty());
    }

    /// The client's cancel of a watch whose re-check is under way waits
    /// for its answer (etcd's sync loop would have judged the start within
    /// 100 ms, long before a client cancels): found compacted, the client
    /// gets the compacted cancel; not compacted (or etcd sent the watch
    /// anything), the cancel goes to etcd, whose `canceled` is passed on.
    #[tokio::test]
    async fn a_cancel_waits_for_the_recheck() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        for (id, key) in [(5, "/x/a"), (6, "/x/b"), (7, "/x/c")] {
            forward_created(s, id, key, 3, None, 12).await;
            s.forwarded.get_mut(&id).expect("forwarded").rechecking = true;
            s.handle(cancel(id)).await.expect("handled");
        }
        let asked: Vec<_> = std::iter::from_fn(|| h.to_etcd.try_recv().ok()).collect();
        assert!(
            canceled_upstream(&asked).is_empty(),
            "no cancel before the re-check answers: {asked:?}"
        );
        assert!(s.canceling.is_empty());

        // 5: found compacted.
        let g5 = s.forwarded[&5].generation;
        assert!(s.on_rechecked(compacted_at(g5, 8)).is_empty());
        assert_eq!(canceled_upstream(&s.answer_found_compacted()), vec![5]);
        assert!(s.on_upstream(canceled(5)).is_empty());

        // 6: not compacted.
        let g6 = s.forwarded[&6].generation;
        let not_compacted = Rechecked {
            generation: g6,
            start_revision: 3,
            compaction: Compaction::NotCompacted,
        };
        assert_eq!(canceled_upstream(&s.on_rechecked(not_compacted)), vec![6]);
        assert!(s.on_upstream(canceled(6)).is_empty());

        // 7: etcd sent an event first.
        assert_eq!(
            canceled_upstream(&s.on_upstream(event_answer(7, "/x/c", 9))),
            vec![7]
        );
        assert!(s.on_upstream(canceled(7)).is_empty());

        let created = |id| (id, true, false, 0, 0);
        assert_eq!(
            sent(s),
            vec![
                created(5),
                created(6),
                created(7),
                (5, false, true, 8, 0),
                (6, false, true, 0, 0),
                (7, false, false, 0, 1),
                (7, false, true, 0, 0),
            ]
        );
        assert!(s.forwarded.is_empty() && s.canceling.is_empty() && s.handing_over.is_empty());
    }

    /// A creation whose check failed is checked again once etcd's
    /// `created` shows etcd reachable, not before (a check at the fault's
    /// end meets the same broken connection); under the id etcd chose.
    #[tokio::test]
    async fn the_check_is_asked_again_at_etcds_created() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        s.forward_create(0, Some(0), None, create_from("/x/a", "", 3))
            .await
            .expect("sent");
        s.recheck_at_created(0, b"/x/a".to_vec(), 3, 3);
        assert!(s.forwarded[&0].recheck.is_some(), "not asked yet");
        let created = PbWatchResponse {
            watch_id: 4,
            created: true,
            ..Default::default()
        };
        assert!(s.on_upstream(created).is_empty());
        let f = &s.forwarded[&4];
        assert!(f.recheck.is_none(), "asked at created");
        assert!(f.rechecking, "answered in etcd's place if found compacted");
    }
}

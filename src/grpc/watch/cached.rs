//! Watches served from a cache: each is a cursor into its cache's ring,
//! read only when the client can take more, round robin over the stream's
//! watches, so a slow client costs no queue growth and never slows the
//! cache or other streams.

use std::sync::Arc;

use tokio::time::Instant;
use tracing::debug;

use etcd_client::proto::*;

use super::count_watch;
use super::state::{CachedWatch, ClientStream, CreateSpec};
use crate::grpc::kv_cache::{DELETE, PUT, Read, RingEvent, in_range};

/// Events read from the ring per watch per turn (whole revisions), and
/// about as many bytes: a response stays well within clients' default
/// receive limits (4 MiB in tonic) unless one revision alone is larger.
const MAX_BATCH_EVENTS: usize = 1000;
pub(super) const MAX_BATCH_BYTES: usize = 128 * 1024;
/// `WatchCreateRequest.FilterType`.
const FILTER_NOPUT: i32 = 0;
const FILTER_NODELETE: i32 = 1;

impl CachedWatch {
    fn wants(&self, ev: &RingEvent) -> bool {
        let kv = &ev.kv;
        kv.mod_revision >= self.min_rev
            && in_range(&kv.key, &self.key, &self.range_end)
            && !(self.no_put && ev.r#type == PUT)
            && !(self.no_delete && ev.r#type == DELETE)
    }
}

impl ClientStream {
    /// A cached watch for this creation, if a cache can serve it: the range
    /// inside one cached prefix and the start revision in its ring.
    pub(super) fn place(&self, id: i64, c: CreateSpec) -> Option<CachedWatch> {
        if c.start_revision < 0 {
            return None; // etcd's own answer
        }
        let cache = self.front.cache_for(&c.key, &c.range_end)?;
        let (cursor, rev) = if c.start_revision > 0 {
            cache.cursor_at(c.start_revision)?
        } else {
            cache.cursor_now()?
        };
        let min_rev = if c.start_revision > 0 {
            c.start_revision
        } else {
            rev + 1
        };
        Some(CachedWatch {
            id,
            cache: Arc::clone(cache),
            key: c.key,
            range_end: c.range_end,
            cursor,
            min_rev,
            prev_kv: c.prev_kv,
            no_put: c.filters.contains(&FILTER_NOPUT),
            no_delete: c.filters.contains(&FILTER_NODELETE),
            fragment: c.fragment,
            progress_notify: c.progress_notify,
            last_sent: Instant::now(),
            notified_rev: 0,
        })
    }

    /// Starts serving a placed watch with its `created`, at `created_at`
    /// when the creation waited for etcd's revision, else at its cache's.
    pub(super) fn start_cached(&mut self, w: CachedWatch, created_at: Option<i64>) {
        let rev = created_at.unwrap_or_else(|| w.cache.revision());
        let created = PbWatchResponse {
            header: self.header(rev),
            watch_id: w.id,
            created: true,
            ..Default::default()
        };
        self.pending.push_back(created);
        self.watches.push(w);
        count_watch(&self.front, "cache", 1);
    }

    /// The client's cancel of a cached watch; false when `id` is none.
    pub(super) fn cancel_cached(&mut self, id: i64) -> bool {
        let Some(i) = self.watches.iter().position(|w| w.id == id) else {
            return false;
        };
        let w = self.watches.remove(i);
        debug!(
            watch_id = id,
            min_rev = w.min_rev,
            "cached watch canceled by the client"
        );
        count_watch(&self.front, "cache", -1);
        let canceled = PbWatchResponse {
            header: self.header(w.cache.revision()),
            watch_id: w.id,
            canceled: true,
            ..Default::default()
        };
        self.pending.push_back(canceled);
        true
    }

    /// Reads the next batch of some watch (round robin) into `pending`;
    /// false when every watch is up to date.
    pub(super) fn next_events(&mut self) -> bool {
        loop {
            let n = self.watches.len();
            let mut moved = false;
            for i in 0..n {
                let idx = (self.rr + i) % n;
                let w = &mut self.watches[idx];
                match w.cache.read(w.cursor, MAX_BATCH_EVENTS, MAX_BATCH_BYTES) {
                    Read::UpToDate { .. } => {}
                    Read::Gone { compact_revision } => {
                        self.cancel_overrun(idx, compact_revision);
                        self.rr = idx;
                        return true;
                    }
                    Read::Events { events, next } => {
                        moved = true;
                        w.cursor = next;
                        let last_rev = events.last().map(|e| e.mod_revision()).unwrap_or(0);
                        let out: Vec<PbEvent> = events
                            .iter()
                            .filter(|e| w.wants(e))
                            .map(|e| e.to_pb(w.prev_kv))
                            .collect();
                        if out.is_empty() {
                            continue;
                        }
                        w.last_sent = Instant::now();
                        let resp = PbWatchResponse {
                            header: Some(self.front.headers.header(last_rev)),
                            watch_id: w.id,
                            events: out,
                            ..Default::default()
                        };
                        let fragment = w.fragment;
                        self.push_events(resp, fragment);
                        self.rr = (idx + 1) % n;
                        return true;
                    }
                }
            }
            if !moved {
                return false;
            }
        }
    }

    /// Cancels the watch at `idx`, whose cursor the ring overran, as etcd
    /// cancels a compacted watch.
    fn cancel_overrun(&mut self, idx: usize, compact_revision: i64) {
        let w = self.watches.remove(idx);
        count_watch(&self.front, "cache", -1);
        debug!(
            watch_id = w.id,
            compact_revision, "watch fell behind the ring; canceled"
        );
        let resp = PbWatchResponse {
            header: self.header(w.cache.revision()),
            watch_id: w.id,
            canceled: true,
            compact_revision,
            // etcd's compaction cancel has no reason, only
            // `compact_revision` (clientv3 reads that).
            ..Default::default()
        };
        self.pending.push_back(resp);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::grpc::watch::test_support::*;

    /// etcd's compaction cancel (`syncWatchers` -> `sendLoop`) carries
    /// `compact_revision` and no `cancel_reason`.
    #[tokio::test]
    async fn a_watch_the_ring_overran_is_canceled_as_etcd_cancels_it() {
        let mut h = harness(8, Duration::from_secs(600)).await;
        let s = &mut h.stream;
        let w = s.place(1, spec("/c/a", 11)).expect("cached watch");
        s.watches.push(w);
        let events = (11..=210)
            .map(|rev| put("/c/a", b"v".to_vec(), rev))
            .collect();
        h.cache.apply(events, 210);
        assert!(s.next_events());
        let got: Vec<(i64, bool, i64, &str)> = s
            .pending
            .iter()
            .map(|r| {
                (
                    r.watch_id,
                    r.canceled,
                    r.compact_revision,
                    r.cancel_reason.as_str(),
                )
            })
            .collect();
        assert_eq!(got, vec![(1, true, 111, "")]);
    }
}

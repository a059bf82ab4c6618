//! The KV service: `Range` from the raw cache when the range lies inside one
//! cached prefix, evaluated exactly as etcd's `Range` (limit, sort, filters,
//! keys_only, count_only, count, more); everything else (other ranges,
//! Put, DeleteRange, Txn, Compact) goes to etcd unchanged. The cache learns
//! of writes from its own watch; the revision of every etcd answer passed on
//! is noted on the caches, so that a serializable read waits for it (etcd's
//! grpc-proxy invalidates its cache on writes instead).

use std::cmp::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};
use tracing::debug;

use etcd_client::proto::*;

use super::Front;
use super::kv_cache::{KvMap, range_iter};
use crate::backoff::Backoff;
use crate::storage::StorageError;

/// etcd's `RangeRequest.SortOrder`.
const SORT_NONE: i32 = 0;
const SORT_ASCEND: i32 = 1;
const SORT_DESCEND: i32 = 2;
/// etcd's `RangeRequest.SortTarget`.
const TARGET_KEY: i32 = 0;
const TARGET_VERSION: i32 = 1;
const TARGET_CREATE: i32 = 2;
const TARGET_MOD: i32 = 3;
const TARGET_VALUE: i32 = 4;

#[derive(Debug, Clone)]
pub struct KvService {
    pub(crate) front: Arc<Front>,
}

impl Front {
    /// The answer from the cache, or `None` when etcd must answer: the
    /// range is not inside one cached prefix, the cache is not ready, the
    /// revision is not retained (or etcd did not confirm it is not
    /// compacted), or a linearizable read could not wait
    /// (or a serializable one for a write through the front) for the cache
    /// in time.
    pub(crate) async fn range_from_cache(
        &self,
        r: &PbRangeRequest,
        md: &MetadataMap,
    ) -> Option<PbRangeResponse> {
        let cache = self.cache_for(&r.key, &r.range_end)?;
        // Values etcd refuses or treats specially are left to etcd.
        if !cache.is_ready() || r.revision < 0 || r.limit < 0 || invalid_sort(r) {
            return None;
        }
        // A past revision: etcd says whether it is compacted (then etcd
        // answers, with its error) and gives the header (its current
        // revision), whatever the cache still holds of it.
        let mut etcd_header = None;
        let (map, current) = if r.revision > 0 {
            let held = cache.snapshot(r.revision)?;
            let shown = self.seen();
            let mut header = self
                .probe_revision(&r.key, r.revision, r.serializable, md)
                .await
                .ok()?;
            if header.revision < shown {
                // A member behind what the front showed (see `range`).
                header = self
                    .probe_revision(&r.key, r.revision, false, md)
                    .await
                    .ok()?;
            }
            self.note_seen(header.revision);
            etcd_header = Some(header);
            held
        } else if r.serializable {
            // May be stale, but not behind a revision this front showed a
            // client (it reads its own writes, as from etcd's one member).
            if !cache
                .wait_for_rev(self.seen(), self.consistent_read_timeout)
                .await
            {
                return None;
            }
            cache.snapshot(0)?
        } else {
            // Linearizable: at least every write etcd acknowledged before
            // this request (the REST API's consistent-read wait).
            let fresh = self.storage.fresh_revision().await.ok()?;
            if !cache
                .wait_for_rev(fresh, self.consistent_read_timeout)
                .await
            {
                return None;
            }
            cache.snapshot(0)?
        };
        // How etcd answers keys_only depends on its version: until that is
        // known, etcd answers.
        let from_index = if r.keys_only {
            self.keys_only_from_index()?
        } else {
            false
        };
        let (kvs, count, more) = evaluate(r, &map, from_index);
        Some(PbRangeResponse {
            header: Some(etcd_header.unwrap_or_else(|| self.headers.header(current))),
            kvs,
            more,
            count,
        })
    }

    /// etcd's answer to a `count_only` Range of `key` at `revision` (as
    /// `serializable` or not, with the caller's credentials): its header
    /// (its current revision), or its error for a compacted or future
    /// revision.
    pub(crate) async fn probe_revision(
        &self,
        key: &[u8],
        revision: i64,
        serializable: bool,
        md: &MetadataMap,
    ) -> Result<PbResponseHeader, Status> {
        let mut probe = Request::new(PbRangeRequest {
            key: key.to_vec(),
            revision,
            serializable,
            count_only: true,
            ..Default::default()
        });
        *probe.metadata_mut() = md.clone();
        let resp: Response<PbRangeResponse> =
            self.upstream.unary("/etcdserverpb.KV/Range", probe).await?;
        Ok(resp.into_inner().header.unwrap_or_default())
    }

    /// Whether etcd compacted `revision` away, and if so, its compact
    /// revision (what etcd's cancel of a watch from there carries). A
    /// revision etcd has not reached yet (a watch from the next one) is not
    /// compacted: the cache serves it. Asked linearizably: a member behind
    /// the cluster (cut off, or catching up after a restart) answers a
    /// serializable probe "future revision", or without a compaction the
    /// cluster finished, and the ring would serve a compacted start.
    ///
    /// The compact revision is found by bisection: etcd refuses a Range
    /// below it and answers one at it (mvcc's `rev < compactMainRev`), and
    /// it only grows. etcd has no call that names it (a watch's cancel
    /// does, but only once the member's sync loop ran, and a member that
    /// freezes first never sends it).
    pub(crate) async fn compaction(
        &self,
        key: &[u8],
        revision: i64,
        md: &MetadataMap,
    ) -> Compaction {
        match self.probe_retrying(key, revision, md).await {
            Ok(_) => return Compaction::NotCompacted,
            Err(s) if is_future_rev(&s) => return Compaction::NotCompacted,
            Err(s) if !is_compacted(&s) => {
                debug!(revision, error = %s, "compaction check not answered");
                return Compaction::Unknown;
            }
            Err(_) => {}
        }
        // etcd's current revision: a Range there is answered (etcd
        // refuses to compact past it).
        let current = match self.probe_retrying(key, 0, md).await {
            Ok(h) => h,
            Err(s) => {
                debug!(revision, error = %s, "compaction search not answered");
                return Compaction::Unknown;
            }
        };
        self.note_seen(current.revision);
        let found = first_answered(revision, current.revision, |rev| async move {
            match self.probe_retrying(key, rev, md).await {
                Ok(_) => Some(true),
                Err(s) if is_compacted(&s) => Some(false),
                Err(_) => None,
            }
        })
        .await;
        match found {
            Some(compact_revision) => Compaction::At {
                compact_revision,
                revision: current.revision,
            },
            None => {
                debug!(revision, "compaction search not answered");
                Compaction::Unknown
            }
        }
    }

    /// A linearizable probe of `revision`, tried again after a failure
    /// that says nothing of it (a connection reset while a member
    /// restarts, a keepalive timeout, a leader election): a creation whose
    /// check is not answered is left to etcd, and a member that freezes
    /// between its `created` and its compacted cancel leaves the client
    /// with neither.
    async fn probe_retrying(
        &self,
        key: &[u8],
        revision: i64,
        md: &MetadataMap,
    ) -> Result<PbResponseHeader, Status> {
        retrying(|| async {
            tokio::time::timeout(PROBE_TIMEOUT, self.probe_revision(key, revision, false, md))
                .await
                .unwrap_or_else(|_| Err(Status::deadline_exceeded("context deadline exceeded")))
        })
        .await
    }
}

/// How long one probe of a compaction check waits: a frozen member holds a
/// call until the channel's keepalive gives up (15 s); another try may go
/// to another member.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Tries again after a failure of the call rather than of the request.
const RETRIES: u32 = 3;
const FIRST_PAUSE: Duration = Duration::from_millis(100);

/// `call`, again up to [`RETRIES`] times while it fails for want of etcd
/// ([`StorageError::is_transient`]), pausing 0.1, 0.2, 0.4 s in between.
async fn retrying<F, Fut, T>(mut call: F) -> Result<T, Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Status>>,
{
    let mut backoff = Backoff::new(FIRST_PAUSE, FIRST_PAUSE * 4);
    for _ in 0..RETRIES {
        match call().await {
            Err(s) if StorageError::from_status("range", 0, &s).is_transient() => {
                tokio::time::sleep(backoff.step()).await;
            }
            r => return r,
        }
    }
    call().await
}

/// What etcd says of a past revision ([`Front::compaction`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compaction {
    /// Not compacted: etcd answers a Range there (or it is in the future).
    NotCompacted,
    /// Compacted, at etcd's `compact_revision`, when etcd was at
    /// `revision`.
    At {
        compact_revision: i64,
        revision: i64,
    },
    /// etcd did not say (unreachable, or it refused the caller): it must
    /// answer the request itself.
    Unknown,
}

/// The smallest revision in (`lo`, `hi`] that `answered` holds for, given
/// it fails at `lo` and holds at `hi` and, as etcd's compaction, only
/// moves up; `None` once `answered` cannot tell.
async fn first_answered<F, Fut>(mut lo: i64, mut hi: i64, mut answered: F) -> Option<i64>
where
    F: FnMut(i64) -> Fut,
    Fut: std::future::Future<Output = Option<bool>>,
{
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if answered(mid).await? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

fn is_future_rev(s: &Status) -> bool {
    s.code() == tonic::Code::OutOfRange && s.message().contains(FUTURE_REV)
}

fn is_compacted(s: &Status) -> bool {
    matches!(
        StorageError::from_status("range", 0, s),
        StorageError::Compacted { .. }
    )
}

/// etcd's `ErrFutureRev` message.
const FUTURE_REV: &str = "required revision is a future revision";

fn invalid_sort(r: &PbRangeRequest) -> bool {
    !(SORT_NONE..=SORT_DESCEND).contains(&r.sort_order)
        || !(TARGET_KEY..=TARGET_VALUE).contains(&r.sort_target)
}

/// etcd's `Range` over one map (server/etcdserver/txn `Range`): fetch (all
/// when sorting or filtering, else limit + 1), prune by revision filters,
/// sort, truncate to `limit` (`more`), clear values for `keys_only` (and
/// leases too when `keys_only_from_index`: etcd 3.7 answers a `keys_only`
/// Range not sorted by value from its index, which holds no leases).
/// `count` is every key in the range, as etcd counts it.
pub fn evaluate(
    r: &PbRangeRequest,
    map: &KvMap,
    keys_only_from_index: bool,
) -> (Vec<PbKeyValue>, i64, bool) {
    let drop_lease = keys_only_from_index && r.keys_only && r.sort_target != TARGET_VALUE;
    let fetch_all = r.sort_order != SORT_NONE
        || r.min_mod_revision != 0
        || r.max_mod_revision != 0
        || r.min_create_revision != 0
        || r.max_create_revision != 0;
    let fetch = if fetch_all || r.limit <= 0 {
        usize::MAX
    } else {
        usize::try_from(r.limit)
            .unwrap_or(usize::MAX)
            .saturating_add(1)
    };
    let mut count: i64 = 0;
    let mut kvs: Vec<&Arc<PbKeyValue>> = Vec::new();
    for kv in range_iter(map, &r.key, &r.range_end) {
        count += 1;
        if !r.count_only && kvs.len() < fetch {
            kvs.push(kv);
        }
    }
    kvs.retain(|kv| {
        !(r.max_mod_revision != 0 && kv.mod_revision > r.max_mod_revision
            || r.min_mod_revision != 0 && kv.mod_revision < r.min_mod_revision
            || r.max_create_revision != 0 && kv.create_revision > r.max_create_revision
            || r.min_create_revision != 0 && kv.create_revision < r.min_create_revision)
    });
    let mut order = r.sort_order;
    if r.sort_target != TARGET_KEY && order == SORT_NONE {
        order = SORT_ASCEND;
    } else if r.sort_target == TARGET_KEY && order == SORT_ASCEND {
        order = SORT_NONE; // already in key order
    }
    if order != SORT_NONE {
        let target = r.sort_target;
        let cmp = move |a: &&Arc<PbKeyValue>, b: &&Arc<PbKeyValue>| -> Ordering {
            match target {
                TARGET_VERSION => a.version.cmp(&b.version),
                TARGET_CREATE => a.create_revision.cmp(&b.create_revision),
                TARGET_MOD => a.mod_revision.cmp(&b.mod_revision),
                TARGET_VALUE => a.value.cmp(&b.value),
                _ => a.key.cmp(&b.key),
            }
        };
        if order == SORT_DESCEND {
            kvs.sort_by(|a, b| cmp(b, a));
        } else {
            kvs.sort_by(cmp);
        }
    }
    let mut more = false;
    if r.limit > 0 && kvs.len() as i64 > r.limit {
        kvs.truncate(r.limit as usize);
        more = true;
    }
    let kvs = kvs
        .into_iter()
        .map(|kv| {
            if r.keys_only {
                PbKeyValue {
                    value: Vec::new(),
                    lease: if drop_lease { 0 } else { kv.lease },
                    ..PbKeyValue::clone(kv)
                }
            } else {
                PbKeyValue::clone(kv)
            }
        })
        .collect();
    (kvs, count, more)
}

#[tonic::async_trait]
impl PbKvService for KvService {
    async fn range(
        &self,
        req: Request<PbRangeRequest>,
    ) -> Result<Response<PbRangeResponse>, Status> {
        // With etcd's auth on, etcd decides first whether this caller may
        // read this range; if not, etcd answers the request itself.
        let r = req.get_ref();
        let permitted = self.front.cache_for(&r.key, &r.range_end).is_none()
            || self
                .front
                .auth
                .permits(req.metadata(), &r.key, &r.range_end)
                .await;
        if permitted
            && let Some(resp) = self
                .front
                .range_from_cache(req.get_ref(), req.metadata())
                .await
        {
            super::count_range(true);
            return Ok(Response::new(resp));
        }
        super::count_range(false);
        // A serializable read etcd answers may come from a member behind
        // the revisions the front has shown (cut off, or catching up): then
        // it is asked again linearizably, so no client reads older than
        // what the front showed it.
        let shown = self.front.seen();
        let again = (r.serializable && r.revision == 0).then(|| {
            let mut linearizable = Request::new(PbRangeRequest {
                serializable: false,
                ..r.clone()
            });
            *linearizable.metadata_mut() = req.metadata().clone();
            linearizable
        });
        let mut resp: Response<PbRangeResponse> = self
            .front
            .upstream
            .unary("/etcdserverpb.KV/Range", req)
            .await?;
        let behind = resp
            .get_ref()
            .header
            .as_ref()
            .is_some_and(|h| h.revision < shown);
        if behind && let Some(again) = again {
            resp = self
                .front
                .upstream
                .unary("/etcdserverpb.KV/Range", again)
                .await?;
        }
        if let Some(h) = &resp.get_ref().header {
            self.front.note_seen(h.revision);
        }
        Ok(resp)
    }

    type RangeStreamStream = BoxStream<'static, Result<PbRangeStreamResponse, Status>>;

    async fn range_stream(
        &self,
        req: Request<PbRangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        let up = self
            .front
            .upstream
            .server_streaming("/etcdserverpb.KV/RangeStream", req)
            .await?;
        Ok(Response::new(up.into_inner().boxed()))
    }

    async fn put(&self, req: Request<PbPutRequest>) -> Result<Response<PbPutResponse>, Status> {
        let resp: Response<PbPutResponse> = self
            .front
            .upstream
            .unary("/etcdserverpb.KV/Put", req)
            .await?;
        if let Some(h) = &resp.get_ref().header {
            self.front.note_seen(h.revision);
        }
        Ok(resp)
    }

    async fn delete_range(
        &self,
        req: Request<PbDeleteRequest>,
    ) -> Result<Response<PbDeleteResponse>, Status> {
        let resp: Response<PbDeleteResponse> = self
            .front
            .upstream
            .unary("/etcdserverpb.KV/DeleteRange", req)
            .await?;
        if let Some(h) = &resp.get_ref().header {
            self.front.note_seen(h.revision);
        }
        Ok(resp)
    }

    async fn txn(&self, req: Request<PbTxnRequest>) -> Result<Response<PbTxnResponse>, Status> {
        let resp: Response<PbTxnResponse> = self
            .front
            .upstream
            .unary("/etcdserverpb.KV/Txn", req)
            .await?;
        if let Some(h) = &resp.get_ref().header {
            self.front.note_seen(h.revision);
        }
        Ok(resp)
    }

    async fn compact(
        &self,
        req: Request<PbCompactionRequest>,
    ) -> Result<Response<PbCompactionResponse>, Status> {
        self.front
            .upstream
            .unary("/etcdserverpb.KV/Compact", req)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call that fails for want of etcd is tried again, a bounded number
    /// of times; a refusal of the request is not.
    #[tokio::test(start_paused = true)]
    async fn only_a_failed_call_is_tried_again() {
        let calls = std::sync::atomic::AtomicU32::new(0);
        let answer = |fails: u32, code: tonic::Code| {
            let calls = &calls;
            calls.store(0, std::sync::atomic::Ordering::Relaxed);
            retrying(move || async move {
                let n = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n < fails {
                    Err(Status::new(code, "transport error"))
                } else {
                    Ok(n)
                }
            })
        };
        let got = answer(2, tonic::Code::Unavailable)
            .await
            .map_err(|s| s.code());
        assert_eq!(got, Ok(2));
        let got = answer(9, tonic::Code::Unknown).await.map_err(|s| s.code());
        assert_eq!(got, Err(tonic::Code::Unknown));
        assert_eq!(
            calls.load(std::sync::atomic::Ordering::Relaxed),
            RETRIES + 1
        );
        let got = answer(9, tonic::Code::OutOfRange)
            .await
            .map_err(|s| s.code());
        assert_eq!(got, Err(tonic::Code::OutOfRange));
        assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 1);
    }

    /// The bisection finds etcd's compact revision exactly wherever it lies
    /// in (lo, hi], and gives up as soon as a probe cannot tell.
    #[tokio::test]
    async fn the_compact_revision_is_found_by_bisection() {
        for compact in 11..=40 {
            let mut probes = 0;
            let found = first_answered(10, 40, |rev| {
                probes += 1;
                async move { Some(rev >= compact) }
            })
            .await;
            assert_eq!(found, Some(compact));
            assert!(probes <= 5, "{probes} probes for 30 revisions");
        }
        let found = first_answered(10, 40, |rev| async move { (rev > 30).then_some(true) }).await;
        assert_eq!(found, None);
    }

    fn map() -> KvMap {
        let mut m = KvMap::new();
        // (key, value, create, mod, version)
        for (k, v, c, md, ver) in [
            ("/p/a", "z", 5, 9, 3),
            ("/p/b", "y", 6, 6, 1),
            ("/p/c", "x", 2, 7, 2),
            ("/p/d", "w", 8, 8, 1),
        ] {
            m.insert(
                k.as_bytes().to_vec(),
                Arc::new(PbKeyValue {
                    key: k.as_bytes().to_vec(),
                    value: v.as_bytes().to_vec(),
                    create_revision: c,
                    mod_revision: md,
                    version: ver,
                    lease: if k == "/p/b" { 42 } else { 0 },
                }),
            );
        }
        m
    }

    fn req() -> PbRangeRequest {
        PbRangeRequest {
            key: b"/p/".to_vec(),
            range_end: b"/p0".to_vec(),
            ..Default::default()
        }
    }

    fn keys(kvs: &[PbKeyValue]) -> Vec<String> {
        kvs.iter()
            .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
            .collect()
    }

    #[test]
    fn limit_sets_more_and_count_is_the_whole_range() {
        let (kvs, count, more) = evaluate(&PbRangeRequest { limit: 2, ..req() }, &map(), false);
        assert_eq!(keys(&kvs), ["/p/a", "/p/b"]);
        assert_eq!((count, more), (4, true));
        let (_, _, more) = evaluate(&PbRangeRequest { limit: 4, ..req() }, &map(), false);
        assert!(!more);
    }

    #[test]
    fn sort_targets_and_orders() {
        let sorted = |target, order| {
            let (kvs, _, _) = evaluate(
                &PbRangeRequest {
                    sort_target: target,
                    sort_order: order,
                    ..req()
                },
                &map(),
                false,
            );
            keys(&kvs)
        };
        assert_eq!(
            sorted(TARGET_CREATE, SORT_ASCEND),
            ["/p/c", "/p/a", "/p/b", "/p/d"]
        );
        assert_eq!(
            sorted(TARGET_MOD, SORT_DESCEND),
            ["/p/a", "/p/d", "/p/c", "/p/b"]
        );
        assert_eq!(
            sorted(TARGET_VALUE, SORT_NONE),
            ["/p/d", "/p/c", "/p/b", "/p/a"]
        );
        assert_eq!(
            sorted(TARGET_KEY, SORT_DESCEND),
            ["/p/d", "/p/c", "/p/b", "/p/a"]
        );
        // Ties keep key order (as etcd's insertion sort on small results).
        assert_eq!(
            sorted(TARGET_VERSION, SORT_ASCEND),
            ["/p/b", "/p/d", "/p/c", "/p/a"]
        );
    }

    #[test]
    fn filters_keys_only_and_count_only() {
        let (kvs, count, _) = evaluate(
            &PbRangeRequest {
                min_mod_revision: 7,
                max_create_revision: 6,
                keys_only: true,
                ..req()
            },
            &map(),
            false,
        );
        assert_eq!(keys(&kvs), ["/p/a", "/p/c"]);
        assert!(kvs.iter().all(|kv| kv.value.is_empty()));
        assert_eq!(count, 4);
        let (kvs, count, more) = evaluate(
            &PbRangeRequest {
                count_only: true,
                limit: 1,
                ..req()
            },
            &map(),
            false,
        );
        assert!(kvs.is_empty());
        assert_eq!((count, more), (4, false));
        let (kvs, count, _) = evaluate(
            &PbRangeRequest {
                key: b"/p/b".to_vec(),
                range_end: Vec::new(),
                ..Default::default()
            },
            &map(),
            false,
        );
        assert_eq!((keys(&kvs), count), (vec!["/p/b".to_string()], 1));
    }

    /// etcd 3.7 answers `keys_only` from its index: no values and no
    /// leases, unless sorted by value; 3.6 keeps the leases.
    #[test]
    fn keys_only_from_the_index_has_no_leases() {
        let lease_of_b = |from_index, sort_target| {
            let (kvs, _, _) = evaluate(
                &PbRangeRequest {
                    keys_only: true,
                    sort_target,
                    ..req()
                },
                &map(),
                from_index,
            );
            let b = kvs.iter().find(|kv| kv.key == b"/p/b").expect("/p/b");
            assert!(b.value.is_empty());
            b.lease
        };
        assert_eq!(lease_of_b(false, TARGET_KEY), 42);
        assert_eq!(lease_of_b(true, TARGET_KEY), 0);
        assert_eq!(lease_of_b(true, TARGET_VALUE), 42);
        let (kvs, _, _) = evaluate(&req(), &map(), true);
        let b = kvs.iter().find(|kv| kv.key == b"/p/b").expect("/p/b");
        assert_eq!(b.lease, 42, "only keys_only drops leases");
    }
}

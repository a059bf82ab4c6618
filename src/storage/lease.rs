//! Lease reuse for writes with a TTL, after the Kubernetes `leaseManager`.
//!
//! Granting a lease is a raft write and every lease costs etcd memory and
//! expiry work, so writes that need about the same TTL share one lease: a
//! lease is granted for `ttl + reuse window` and later writes reuse it while
//! its remaining lifetime still covers their TTL. Only one previous lease is
//! kept, because all writes of a resource use the same TTL. A key may thus
//! live up to `reuse window` longer than asked, never shorter.

use std::future::Future;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

use super::StorageError;

/// Caps how many keys share one lease, so revoking or expiring a single lease
/// never has to delete an unbounded number of keys at once (Kubernetes: 1000).
pub const DEFAULT_MAX_ATTACHED_OBJECTS: u64 = 1000;

#[derive(Debug, Clone, Copy)]
struct PrevLease {
    id: i64,
    /// Our (conservative) estimate: measured from before the grant request.
    expires_at: Instant,
    attached: u64,
}

/// Hands out lease ids for writes with a TTL, reusing the previous lease when
/// it fits. See the module docs.
pub struct LeaseManager {
    client: Option<etcd_client::Client>,
    reuse_window: Duration,
    request_timeout: Duration,
    max_attached: u64,
    /// Held across the grant, so concurrent writers share one new lease
    /// instead of each granting their own.
    prev: Mutex<Option<PrevLease>>,
    granted: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for LeaseManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseManager")
            .field("reuse_window", &self.reuse_window)
            .field("max_attached", &self.max_attached)
            .finish_non_exhaustive()
    }
}

impl LeaseManager {
    pub fn new(
        client: etcd_client::Client,
        reuse_window: Duration,
        request_timeout: Duration,
    ) -> Self {
        Self::build(Some(client), reuse_window, request_timeout)
    }

    /// A manager without a client, for exercising the reuse logic with
    /// [`LeaseManager::get_lease_with`] (unit tests).
    pub fn detached(reuse_window: Duration) -> Self {
        Self::build(None, reuse_window, Duration::from_secs(5))
    }

    fn build(
        client: Option<etcd_client::Client>,
        reuse_window: Duration,
        request_timeout: Duration,
    ) -> Self {
        LeaseManager {
            client,
            reuse_window,
            request_timeout,
            max_attached: DEFAULT_MAX_ATTACHED_OBJECTS,
            prev: Mutex::new(None),
            granted: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub fn with_max_attached(mut self, max: u64) -> Self {
        self.max_attached = max.max(1);
        self
    }

    /// How many leases this manager has granted so far.
    pub fn granted(&self) -> u64 {
        self.granted.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A lease id that keeps a key alive for at least `ttl_seconds`.
    pub async fn get_lease(&self, ttl_seconds: u64) -> Result<i64, StorageError> {
        let Some(client) = &self.client else {
            return Err(StorageError::Internal(
                "lease manager has no etcd client".into(),
            ));
        };
        let timeout = self.request_timeout;
        self.get_lease_with(ttl_seconds, |ttl| {
            let mut lease = client.lease_client();
            async move {
                let started = Instant::now();
                let r = tokio::time::timeout(timeout, lease.grant(ttl, None)).await;
                super::observe("lease_grant", started);
                match r {
                    Err(_) => Err(StorageError::Timeout(format!(
                        "lease grant did not answer within {timeout:?}"
                    ))),
                    Ok(Err(e)) => Err(StorageError::from_etcd("lease grant", 0, e)),
                    Ok(Ok(resp)) if !resp.error().is_empty() => Err(StorageError::Internal(
                        format!("lease grant: {}", resp.error()),
                    )),
                    Ok(Ok(resp)) => Ok(resp.id()),
                }
            }
        })
        .await
    }

    /// The reuse logic with the grant call supplied by the caller: `grant`
    /// receives the TTL in seconds to ask etcd for and returns the lease id.
    pub async fn get_lease_with<F, Fut>(
        &self,
        ttl_seconds: u64,
        grant: F,
    ) -> Result<i64, StorageError>
    where
        F: FnOnce(i64) -> Fut,
        Fut: Future<Output = Result<i64, StorageError>>,
    {
        let ttl = Duration::from_secs(ttl_seconds.max(1));
        let mut prev = self.prev.lock().await;
        let now = Instant::now();
        if let Some(p) = prev.as_mut()
            && self.reusable(p, now, ttl)
        {
            p.attached += 1;
            tracing::trace!(lease = p.id, attached = p.attached, "reusing lease");
            return Ok(p.id);
        }
        let grant_ttl = ttl + self.reuse_window;
        let grant_secs = i64::try_from(grant_ttl.as_secs()).unwrap_or(i64::MAX);
        let id = grant(grant_secs).await?;
        self.granted
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(lease = id, ttl = grant_secs, "granted lease");
        *prev = Some(PrevLease {
            id,
            expires_at: now + grant_ttl,
            attached: 1,
        });
        Ok(id)
    }

    /// Reuse if the lease outlives the requested TTL ("valid"), is not much
    /// longer than needed ("sufficient": at most the reuse window extra, so a
    /// short TTL never rides a long lease) and is not too crowded.
    fn reusable(&self, p: &PrevLease, now: Instant, ttl: Duration) -> bool {
        let needed = now + ttl;
        let valid = needed < p.expires_at;
        let sufficient = needed + self.reuse_window >= p.expires_at;
        valid && sufficient && p.attached < self.max_attached
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicI64, Ordering};

    async fn lease(m: &LeaseManager, ttl: u64, next: &AtomicI64) -> i64 {
        m.get_lease_with(ttl, |_| async { Ok(next.fetch_add(1, Ordering::SeqCst)) })
            .await
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn reuses_within_window_then_grants_anew() {
        let m = LeaseManager::detached(Duration::from_secs(10));
        let next = AtomicI64::new(1);
        let asked = std::sync::Mutex::new(Vec::new());
        let id = m
            .get_lease_with(30, |ttl| {
                asked.lock().unwrap().push(ttl);
                async { Ok(next.fetch_add(1, Ordering::SeqCst)) }
            })
            .await
            .unwrap();
        assert_eq!(id, 1);
        assert_eq!(
            *asked.lock().unwrap(),
            vec![40],
            "granted with ttl + window"
        );
        for _ in 0..50 {
            assert_eq!(lease(&m, 30, &next).await, 1);
        }
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(lease(&m, 30, &next).await, 1, "9s in: 31s left covers 30s");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            lease(&m, 30, &next).await,
            2,
            "10s in: 30s left no longer covers 30s"
        );
        assert_eq!(m.granted(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn different_ttls_do_not_share_unsuitable_leases() {
        let m = LeaseManager::detached(Duration::from_secs(10));
        let next = AtomicI64::new(1);
        assert_eq!(lease(&m, 100, &next).await, 1);
        // A 5s TTL must not ride a 110s lease (too long: beyond the window).
        assert_eq!(lease(&m, 5, &next).await, 2);
        // A 200s TTL does not fit in a 15s lease.
        assert_eq!(lease(&m, 200, &next).await, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn attached_count_is_capped() {
        let m = LeaseManager::detached(Duration::from_secs(60)).with_max_attached(3);
        let next = AtomicI64::new(1);
        let ids: Vec<i64> = {
            let mut v = Vec::new();
            for _ in 0..7 {
                v.push(lease(&m, 10, &next).await);
            }
            v
        };
        assert_eq!(ids, vec![1, 1, 1, 2, 2, 2, 3]);
    }

    #[tokio::test(start_paused = true)]
    async fn zero_window_never_reuses() {
        let m = LeaseManager::detached(Duration::ZERO);
        let next = AtomicI64::new(1);
        assert_eq!(lease(&m, 10, &next).await, 1);
        assert_eq!(lease(&m, 10, &next).await, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn failed_grant_keeps_previous_state() {
        let m = LeaseManager::detached(Duration::from_secs(10));
        let r = m
            .get_lease_with(5, |_| async {
                Err(StorageError::Unavailable("down".into()))
            })
            .await;
        assert!(matches!(r, Err(StorageError::Unavailable(_))));
        let next = AtomicI64::new(9);
        assert_eq!(lease(&m, 5, &next).await, 9);
        assert_eq!(m.granted(), 1);
    }
}

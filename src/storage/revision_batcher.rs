//! Batched "fresh" revision reads for consistent reads from the cache.
//!
//! A consistent read (resourceVersion unset) needs etcd's current revision
//! as of some moment *after* the request arrived, then waits for the cache to
//! reach it. Under load, one etcd round trip per request would make etcd the
//! bottleneck of every cached read. The batcher lets concurrent callers share
//! one read: callers queue, a driver takes the whole queue and only then
//! starts the etcd request, so that request began after every caller in its
//! batch arrived (linearizable for each of them). Callers arriving while a
//! read is in flight wait for the next one. The revision is global to etcd,
//! so one batcher serves every resource.

use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::StorageError;

type Waiter = oneshot::Sender<Result<i64, StorageError>>;

#[derive(Default)]
pub(crate) struct RevisionBatcher {
    state: Mutex<BatchState>,
}

#[derive(Default)]
struct BatchState {
    /// A driver task is running (it drains `waiters` until empty).
    running: bool,
    waiters: Vec<Waiter>,
}

impl RevisionBatcher {
    /// A revision read that started after this call. `make_fetch` is only
    /// called when this caller has to start the driver (so the common case,
    /// joining a batch, costs no clone of the client); the fetch it returns
    /// performs one read per batch.
    pub(crate) async fn fresh<M, F, Fut>(
        self: &Arc<Self>,
        make_fetch: M,
    ) -> Result<i64, StorageError>
    where
        M: FnOnce() -> F,
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Result<i64, StorageError>> + Send,
    {
        let (tx, rx) = oneshot::channel();
        let start_driver = {
            let mut st = self.state.lock();
            st.waiters.push(tx);
            !std::mem::replace(&mut st.running, true)
        };
        if start_driver {
            // A task of its own: a caller that gives up (its request was
            // cancelled) must not strand the others.
            let me = Arc::clone(self);
            let fetch = make_fetch();
            tokio::spawn(async move {
                loop {
                    let batch = {
                        let mut st = me.state.lock();
                        if st.waiters.is_empty() {
                            st.running = false;
                            return;
                        }
                        std::mem::take(&mut st.waiters)
                    };
                    let result = fetch().await;
                    for w in batch {
                        let _ = w.send(result.clone());
                    }
                }
            });
        }
        rx.await
            .unwrap_or_else(|_| Err(StorageError::Internal("revision batcher stopped".into())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn concurrent_callers_share_reads_that_start_after_them() {
        let b = Arc::new(RevisionBatcher::default());
        // The "etcd revision" moves on every read; each read takes a while.
        let rev = Arc::new(AtomicI64::new(0));
        let reads = Arc::new(AtomicUsize::new(0));
        let fetch = {
            let (rev, reads) = (Arc::clone(&rev), Arc::clone(&reads));
            move || {
                let (rev, reads) = (Arc::clone(&rev), Arc::clone(&reads));
                async move {
                    reads.fetch_add(1, Ordering::SeqCst);
                    let r = rev.fetch_add(1, Ordering::SeqCst) + 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok(r)
                }
            }
        };
        let mut tasks = Vec::new();
        for _ in 0..100 {
            let (b, f, rev) = (Arc::clone(&b), fetch.clone(), Arc::clone(&rev));
            tasks.push(tokio::spawn(async move {
                // The revision at arrival: the answer may not be older.
                let at_arrival = rev.load(Ordering::SeqCst);
                let got = b.fresh(|| f).await.unwrap();
                assert!(
                    got > at_arrival,
                    "{got} started after arrival at {at_arrival}"
                );
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let n = reads.load(Ordering::SeqCst);
        assert!((1..100).contains(&n), "100 callers shared {n} reads");
    }

    #[tokio::test]
    async fn errors_reach_every_caller_and_the_batcher_recovers() {
        let b = Arc::new(RevisionBatcher::default());
        let err = b
            .fresh(|| || async { Err(StorageError::Unavailable("down".into())) })
            .await;
        assert!(matches!(err, Err(StorageError::Unavailable(_))));
        assert_eq!(b.fresh(|| || async { Ok(7) }).await, Ok(7));
    }
}

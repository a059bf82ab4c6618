//! The memory budget of kept List bodies and their gzip
//! (`server.list_body_cache_bytes`, for all resources together): a
//! [`Reservation`] holds bytes of it until dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The bytes every resource's cache may keep, shared.
#[derive(Debug)]
pub struct ListBodyBudget {
    limit: usize,
    used: AtomicUsize,
}

impl ListBodyBudget {
    pub fn new(limit: usize) -> Arc<ListBodyBudget> {
        Arc::new(ListBodyBudget {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    /// Bytes that may be kept.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes kept now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Reserves `n` bytes if they fit.
    fn take(&self, n: usize) -> bool {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let Some(after) = used.checked_add(n).filter(|a| *a <= self.limit) else {
                return false;
            };
            match self
                .used
                .compare_exchange_weak(used, after, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    crate::metrics::metrics()
                        .list_body_cache_bytes
                        .add(n as i64);
                    return true;
                }
                Err(now) => used = now,
            }
        }
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
        crate::metrics::metrics()
            .list_body_cache_bytes
            .sub(n as i64);
    }
}

/// Bytes taken from a [`ListBodyBudget`], given back when dropped: held
/// across awaits, so a request dropped midway (its client gone) never
/// leaves them taken.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<ListBodyBudget>,
    bytes: usize,
}

impl ListBodyBudget {
    /// `n` bytes if they fit.
    pub fn reserve(self: &Arc<Self>, n: usize) -> Option<Reservation> {
        self.take(n).then(|| Reservation {
            budget: Arc::clone(self),
            bytes: n,
        })
    }

    /// None yet: grown with [`Reservation::grow`].
    pub(crate) fn empty(self: &Arc<Self>) -> Reservation {
        Reservation {
            budget: Arc::clone(self),
            bytes: 0,
        }
    }
}

impl Reservation {
    /// The budget the bytes are held in.
    pub fn budget(&self) -> &Arc<ListBodyBudget> {
        &self.budget
    }

    /// Holds `n` bytes more if they fit (`false`, and nothing changed, if
    /// they do not).
    pub fn grow(&mut self, n: usize) -> bool {
        self.resize(self.bytes + n)
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds `n` bytes instead: gives back the difference, or takes it if
    /// it fits (`false`, and nothing changed, if it does not).
    pub fn resize(&mut self, n: usize) -> bool {
        if n <= self.bytes {
            self.budget.give(self.bytes - n);
        } else if !self.budget.take(n - self.bytes) {
            return false;
        }
        self.bytes = n;
        true
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.give(self.bytes);
    }
}

//! The consistency checker (Kubernetes' `DetectCacheInconsistency`): every
//! interval it compares one resource's cache with etcd at one revision and,
//! on a mismatch, has the reflector relist, which sends the difference to
//! watchers as events (the same path as the relist after a compaction).
//!
//! Both sides are read at the same revision R (etcd's current one): the
//! cache's exact snapshot at R and a paged etcd list at R, each decoded by
//! the same codec, hashed with FNV-1a 64 over (key, mod revision, served
//! JSON). Values neither side can read are left out of both.

use std::collections::BTreeMap;
use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tracing::{Instrument, debug, info, info_span, warn};

use super::Cacher;
use super::stats::CheckResult;
use crate::storage::{ListOptions, StorageError};

/// At most this many differing keys are named in the log line.
const MAX_KEYS_LOGGED: usize = 20;

/// What one check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckOutcome {
    /// Cache and etcd agree at `revision`.
    Match { revision: i64, objects: usize },
    /// They differ at `revision`: the keys (names only) that differ.
    Mismatch { revision: i64, keys: Vec<String> },
}

/// Why a check could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("the cache did not reach revision {0} in time")]
    NotCaughtUp(i64),
    #[error("the cache no longer holds a snapshot at revision {0}")]
    NoSnapshot(i64),
    #[error("the cache is not ready")]
    NotReady,
}

/// FNV-1a 64 (the hash kube-apiserver's checker uses, in its -a variant).
#[derive(Debug, Clone, Copy)]
struct Fnv1a(u64);

impl Fnv1a {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn new() -> Fnv1a {
        Fnv1a(Self::OFFSET)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }
}

/// Per key: (mod revision, hash of the served JSON).
type Digest = BTreeMap<String, (i64, u64)>;

fn entry(key: &str, mod_revision: i64, wire: &[u8]) -> (String, (i64, u64)) {
    let mut h = Fnv1a::new();
    h.write(wire);
    (key.to_string(), (mod_revision, h.0))
}

/// The whole-list hash (what would be compared first) of a digest.
fn list_hash(d: &Digest) -> u64 {
    let mut h = Fnv1a::new();
    for (k, (rev, wire)) in d {
        h.write(k.as_bytes());
        h.write(&rev.to_be_bytes());
        h.write(&wire.to_be_bytes());
    }
    h.0
}

impl Cacher {
    /// One check of this resource (see the module doc). Does not heal.
    pub async fn check_consistency(&self) -> Result<CheckOutcome, CheckError> {
        if !self.cache.is_ready() {
            return Err(CheckError::NotReady);
        }
        let revision = self.storage.current_revision().await?;
        if !self.wait_for_rv(revision).await {
            return Err(CheckError::NotCaughtUp(revision));
        }
        let snap = self
            .cache
            .snapshot_at(revision)
            .ok_or(CheckError::NoSnapshot(revision))?;
        let cached: Digest = snap
            .iter()
            .map(|(k, o)| entry(k, o.mod_revision, &o.wire))
            .collect();
        let listed = self
            .storage
            .list_all(
                self.codec.key_prefix(),
                &ListOptions {
                    revision,
                    limit: self.opts.list_page_size.max(1),
                    ..ListOptions::default()
                },
            )
            .await?;
        let stored: Digest = listed
            .items
            .iter()
            .filter_map(|it| {
                self.codec
                    .decode(&it.key, &it.value, it.mod_revision, it.create_revision)
                    .ok()
                    .map(|o| entry(&it.key, o.mod_revision, &o.wire))
            })
            .collect();
        if list_hash(&cached) == list_hash(&stored) {
            return Ok(CheckOutcome::Match {
                revision,
                objects: cached.len(),
            });
        }
        let mut keys: Vec<String> = cached
            .iter()
            .filter(|(k, v)| stored.get(*k) != Some(*v))
            .map(|(k, _)| k.clone())
            .chain(stored.keys().filter(|k| !cached.contains_key(*k)).cloned())
            .collect();
        keys.sort();
        Ok(CheckOutcome::Mismatch { revision, keys })
    }

    /// Checks once, counts the result, and on a mismatch logs the keys and
    /// has the reflector relist.
    pub async fn check_and_heal(&self) -> Result<CheckOutcome, CheckError> {
        let stats = self.cache.stats();
        let outcome = self.check_consistency().await;
        match &outcome {
            Ok(CheckOutcome::Match { revision, objects }) => {
                stats.consistency_checked(CheckResult::Match);
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs() as i64);
                stats.last_consistent.store(now, Ordering::Relaxed);
                debug!(revision, objects, "cache consistent with etcd");
            }
            Ok(CheckOutcome::Mismatch { revision, keys }) => {
                stats.consistency_checked(CheckResult::Mismatch);
                let named: Vec<&str> = keys
                    .iter()
                    .take(MAX_KEYS_LOGGED)
                    .map(String::as_str)
                    .collect();
                warn!(
                    revision,
                    differing = keys.len(),
                    keys = ?named,
                    "cache differs from etcd; relisting"
                );
                self.relist.notify_one();
            }
            Err(e) => {
                stats.consistency_checked(CheckResult::Error);
                info!(error = %e, "consistency check not made");
            }
        }
        outcome
    }
}

/// The checker loop of one cacher; ends when the cacher goes away or shuts
/// down.
pub(crate) async fn run(cacher: Weak<Cacher>) {
    let Some(c) = cacher.upgrade() else { return };
    let interval = c.opts.consistency_check_interval;
    let shutdown = c.shutdown.clone();
    let span = info_span!("consistency_checker", resource = %c.resource.plural);
    drop(c);
    async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(interval.max(Duration::from_millis(10))) => {}
            }
            let Some(c) = cacher.upgrade() else { return };
            let _ = c.check_and_heal().await;
        }
    }
    .instrument(span)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_reference_vectors() {
        // Reference values of FNV-1a 64 (draft-eastlake-fnv).
        for (input, want) in [
            ("", 0xcbf2_9ce4_8422_2325u64),
            ("a", 0xaf63_dc4c_8601_ec8c),
            ("foobar", 0x8594_4171_f739_67e8),
        ] {
            let mut h = Fnv1a::new();
            h.write(input.as_bytes());
            assert_eq!(h.0, want, "{input:?}");
        }
    }

    #[test]
    fn list_hash_sees_key_revision_and_value() {
        let base: Digest = [entry("/a", 5, b"{}"), entry("/b", 6, b"{\"x\":1}")]
            .into_iter()
            .collect();
        let h = list_hash(&base);
        let mut other = base.clone();
        other.insert("/b".into(), entry("/b", 7, b"{\"x\":1}").1);
        assert_ne!(list_hash(&other), h, "revision");
        let mut other = base.clone();
        other.insert("/b".into(), entry("/b", 6, b"{\"x\":2}").1);
        assert_ne!(list_hash(&other), h, "value");
        let mut other = base.clone();
        other.remove("/a");
        assert_ne!(list_hash(&other), h, "key");
        assert_eq!(list_hash(&base.clone()), h);
    }
}

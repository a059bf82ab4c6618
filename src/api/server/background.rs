//! The server's background tasks, each until shutdown: the etcd probe
//! behind `/readyz`, and the sweeps of kept List bodies and of open watch
//! streams.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::api::response::watch_stream::{self, WatchStreams};
use crate::api::state::State;
use crate::storage::Storage;

/// How often `/readyz`'s etcd check is refreshed. Probing in the background
/// keeps readiness probes cheap and off etcd's hot path.
const ETCD_PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// Keeps `State::etcd_reachable` current until shutdown: a cheap range
/// (current revision) with a short deadline.
pub(crate) async fn probe_etcd(state: Arc<State>) {
    loop {
        let ok = tokio::time::timeout(Duration::from_secs(2), state.storage.current_revision())
            .await
            .is_ok_and(|r| r.is_ok());
        if state.etcd_reachable.swap(ok, Ordering::Relaxed) != ok {
            if ok {
                info!("etcd reachable");
                check_etcd_version(&state.storage).await;
            } else {
                warn!("etcd unreachable");
            }
        }
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = tokio::time::sleep(ETCD_PROBE_INTERVAL) => {}
        }
    }
}

/// Warns when etcd is older than the versions this daemon needs (docs/DESIGN.md
/// section 8): before 3.5.13 a progress answer can overtake events, and
/// the reflector then relists each time it notices.
async fn check_etcd_version(storage: &Storage) {
    let Ok(Ok(version)) =
        tokio::time::timeout(Duration::from_secs(2), storage.etcd_version()).await
    else {
        return;
    };
    match crate::storage::progress_requests_are_safe(&version) {
        Some(true) => debug!(%version, "etcd version"),
        Some(false) => warn!(
            %version,
            "etcd is older than 3.5.13 (3.4.31 on 3.4): its watch progress answers can overtake events (etcd#17507); the caches relist when that happens. Upgrade etcd"
        ),
        None => warn!(%version, "etcd's version cannot be read"),
    }
}

/// How often kept List bodies of objects that have changed since are
/// dropped (a List drops them too).
const LIST_BODY_SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Drops kept List bodies of objects that have changed since, every
/// [`LIST_BODY_SWEEP_INTERVAL`].
pub(crate) async fn sweep_list_bodies(state: Arc<State>) {
    loop {
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = tokio::time::sleep(LIST_BODY_SWEEP_INTERVAL) => {}
        }
        for r in &state.resources {
            r.list_bodies
                .drop_older_than(r.cacher.watch_cache().current().contents());
        }
    }
}

/// Wakes watch streams at their deadlines and bookmarks, and ends stalled
/// ones ([`watch_stream::sweep`]).
pub(crate) async fn sweep_watch_streams(streams: Arc<WatchStreams>, shutdown: CancellationToken) {
    watch_stream::sweep(streams, shutdown).await;
}

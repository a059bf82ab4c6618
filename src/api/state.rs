//! The state every request shares ([`State`]): config, storage, the
//! served [`Resource`]s and their lookup, the watch slots, security, and
//! the open watch streams.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use smallvec::SmallVec;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::response::budget::ListBodyBudget;
use super::response::list_body_cache::ListBodyCache;
use super::response::watch_stream::WatchStreams;
use super::security::Security;
use crate::cacher::{Cacher, CacherOptions};
use crate::config::{Config, ResourceConfig};
use crate::storage::Storage;

/// One served resource: its config and its cacher.
pub struct Resource {
    pub config: ResourceConfig,
    pub cacher: Arc<Cacher>,
    /// Bodies of full Lists, kept for Lists of the same objects.
    pub list_bodies: Arc<ListBodyCache>,
}

/// State shared by every request.
pub struct State {
    pub config: Config,
    pub storage: Storage,
    pub resources: Vec<Resource>,
    /// Indexes into `resources` by plural, for [`State::resource`]: every
    /// request looks its resource up.
    by_plural: foldhash::HashMap<String, SmallVec<[usize; 2]>>,
    /// One permit per open watch stream, `server.max_watches` in all; each
    /// stream holds its owned permit until it ends.
    pub watch_slots: Arc<Semaphore>,
    /// Cancelled when the server shuts down; open watch streams end.
    pub shutdown: CancellationToken,
    /// Result of the latest etcd probe (see
    /// [`probe_etcd`](crate::api::server::background::probe_etcd)); part of `/readyz`.
    pub etcd_reachable: AtomicBool,
    /// TLS, authentication and authorization as configured.
    pub security: Security,
    /// Open watch streams, for their sweeper.
    pub watch_streams: Arc<WatchStreams>,
}

impl State {
    /// Starts one [`Cacher`] per configured resource. Must be called inside
    /// a tokio runtime.
    pub fn new(config: Config, storage: Storage, security: Security) -> State {
        let opts = CacherOptions::from_config(&config.server, config.etcd.list_page_size);
        let max_watches = config.server.max_watches.min(Semaphore::MAX_PERMITS);
        let list_body_budget = ListBodyBudget::new(config.server.list_body_cache_bytes);
        let resources = config
            .resources
            .iter()
            .map(|r| Resource {
                config: r.clone(),
                list_bodies: ListBodyCache::new(&r.plural, Arc::clone(&list_body_budget)),
                cacher: Cacher::start(
                    r.clone(),
                    &config.etcd.prefix,
                    storage.clone(),
                    opts.clone(),
                ),
            })
            .collect::<Vec<Resource>>();
        let mut by_plural = foldhash::HashMap::<String, SmallVec<[usize; 2]>>::default();
        for (i, r) in resources.iter().enumerate() {
            by_plural
                .entry(r.config.plural.clone())
                .or_default()
                .push(i);
        }
        State {
            config,
            storage,
            resources,
            by_plural,
            watch_slots: Arc::new(Semaphore::new(max_watches)),
            shutdown: CancellationToken::new(),
            etcd_reachable: AtomicBool::new(false),
            security,
            watch_streams: Arc::default(),
        }
    }

    /// Watch streams open now.
    pub fn open_watches(&self) -> usize {
        self.config
            .server
            .max_watches
            .min(Semaphore::MAX_PERMITS)
            .saturating_sub(self.watch_slots.available_permits())
    }

    /// The resource served at `group`/`version`/`plural`.
    pub fn resource(&self, group: &str, version: &str, plural: &str) -> Option<&Resource> {
        self.by_plural
            .get(plural)?
            .iter()
            .filter_map(|i| self.resources.get(*i))
            .find(|r| r.config.group == group && r.config.version == version)
    }
}

//! `Storage::watch`: the etcd3 watch protocol, after Kubernetes' etcd3
//! `watcher`: one etcd watch stream over a key prefix from a given revision,
//! with progress notifications, turned into typed items.
//!
//! The caches do not ask etcd for `prev_kv`: each holds the previous value of
//! every key it watches, and etcd's look-up of previous values is a large
//! part of its cost per watch event (docs/DESIGN.md section 3).
//!
//! What the stream means is decided here, once: the creation response says
//! nothing about delivered events and is skipped; an empty response is a
//! progress notification (every event up to its revision was delivered); a
//! cancel with a compact revision is [`StorageError::Compacted`] (the caller
//! must relist); values pass through the [`Transformer`]. Callers (the
//! reflector, the etcd gRPC front) only fold the items into their state.

use std::sync::Arc;

use bytes::Bytes;
use etcd_client::proto::{PbEvent, PbResponseHeader};
use etcd_client::{
    EventType as PbEventType, WatchOptions, WatchRequestSender, WatchResponseStream,
};

use super::{Storage, StorageError, Transformer, Unreadable, prefix_range_end, utf8_key};

/// One change of a watched key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// The key was created or updated; `value` is already transformed.
    Put {
        key: String,
        value: Bytes,
        mod_revision: i64,
        create_revision: i64,
    },
    Delete {
        key: String,
        mod_revision: i64,
    },
    /// A put whose key or value cannot be read (a non-UTF-8 key, a value the
    /// transformer rejects): the key's previous value is gone all the same.
    Unreadable {
        unreadable: Unreadable,
        mod_revision: i64,
    },
}

impl WatchEvent {
    pub fn mod_revision(&self) -> i64 {
        match self {
            WatchEvent::Put { mod_revision, .. }
            | WatchEvent::Delete { mod_revision, .. }
            | WatchEvent::Unreadable { mod_revision, .. } => *mod_revision,
        }
    }
}

/// One item of a [`Watch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchItem {
    /// The events of one etcd watch response (one or more revisions, in
    /// order); `revision` is the highest of them.
    Events {
        events: Vec<WatchEvent>,
        revision: i64,
    },
    /// Every event up to `revision` has been delivered.
    Progress { revision: i64 },
}

/// An open etcd watch stream over one prefix: a [`RawWatch`] whose values
/// pass through the [`Transformer`].
pub struct Watch {
    raw: RawWatch,
    transformer: Arc<dyn Transformer>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("from_revision", &self.raw.from_revision)
            .finish_non_exhaustive()
    }
}

impl Storage {
    /// Watches every key under `prefix` from `from_revision` on (the first
    /// revision delivered; etcd's `start_revision`), with progress
    /// notifications and without previous values. Opening the stream is bounded by the request
    /// deadline; the stream itself is not.
    pub async fn watch(&self, prefix: &str, from_revision: i64) -> Result<Watch, StorageError> {
        let raw = self
            .watch_raw(
                prefix.as_bytes(),
                &prefix_range_end(prefix),
                from_revision,
                false,
            )
            .await?;
        Ok(Watch {
            raw,
            transformer: Arc::clone(&self.transformer),
        })
    }
}

impl Watch {
    /// The next item. Errors end the stream: [`StorageError::Compacted`]
    /// when etcd compacted past the start (relist), anything else is
    /// transient (resume from the last revision seen). Cancel-safe: the
    /// only await is the stream's next message.
    pub async fn next(&mut self) -> Result<WatchItem, StorageError> {
        let (events, revision) = match self.raw.next().await? {
            RawWatchItem::Progress { revision, .. } => return Ok(WatchItem::Progress { revision }),
            RawWatchItem::Events {
                events, revision, ..
            } => (events, revision),
        };
        let events = events
            .into_iter()
            .filter_map(|ev| {
                let delete = ev.r#type == PbEventType::Delete as i32;
                let kv = ev.kv?;
                let mod_revision = kv.mod_revision;
                let key = match utf8_key(kv.key) {
                    Ok(k) => k,
                    Err(unreadable) => {
                        return Some(WatchEvent::Unreadable {
                            unreadable,
                            mod_revision,
                        });
                    }
                };
                if delete {
                    return Some(WatchEvent::Delete { key, mod_revision });
                }
                Some(
                    match self.transformer.from_storage(&key, Bytes::from(kv.value)) {
                        Ok(value) => WatchEvent::Put {
                            key,
                            value,
                            mod_revision,
                            create_revision: kv.create_revision,
                        },
                        Err(error) => WatchEvent::Unreadable {
                            unreadable: Unreadable { key, error },
                            mod_revision,
                        },
                    },
                )
            })
            .collect();
        Ok(WatchItem::Events { events, revision })
    }

    /// Asks etcd for a progress notification (answered as a
    /// [`WatchItem::Progress`] once every event up to its revision was sent).
    pub async fn request_progress(&mut self) -> Result<(), StorageError> {
        self.raw.request_progress().await
    }
}

/// One item of a [`RawWatch`]: etcd's own messages, values as stored.
#[derive(Debug, Clone, PartialEq)]
pub enum RawWatchItem {
    /// The events of one etcd watch response (one or more revisions, in
    /// order, each with its `prev_kv` when asked for); `revision` is the
    /// highest of them.
    Events {
        header: PbResponseHeader,
        events: Vec<PbEvent>,
        revision: i64,
    },
    /// Every event up to `revision` has been delivered.
    Progress {
        header: PbResponseHeader,
        revision: i64,
    },
}

/// An open etcd watch stream over one key range, yielding etcd's events
/// untouched: the exact stored bytes (no [`Transformer`]), `version`,
/// `lease` and, when asked for, `prev_kv`, for keys that need not be UTF-8. Same protocol
/// decisions as [`Watch`] (creation skipped, empty = progress, compaction =
/// [`StorageError::Compacted`]).
pub struct RawWatch {
    requests: WatchRequestSender,
    responses: WatchResponseStream,
    from_revision: i64,
}

impl std::fmt::Debug for RawWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawWatch")
            .field("from_revision", &self.from_revision)
            .finish_non_exhaustive()
    }
}

impl Storage {
    /// Watches `[key, range_end)` from `from_revision` on, with progress
    /// notifications (and previous values when `prev_kv`), without the
    /// transformer. Opening the stream is bounded by the request deadline;
    /// the stream is not.
    pub async fn watch_raw(
        &self,
        key: &[u8],
        range_end: &[u8],
        from_revision: i64,
        prev_kv: bool,
    ) -> Result<RawWatch, StorageError> {
        let mut opts = WatchOptions::new()
            .with_range(range_end.to_vec())
            .with_start_revision(from_revision)
            .with_progress_notify();
        if prev_kv {
            opts = opts.with_prev_key();
        }
        let mut client = self.watch_client();
        let stream = match tokio::time::timeout(
            self.request_timeout,
            client.watch(key.to_vec(), Some(opts)),
        )
        .await
        {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(StorageError::from_etcd("watch", from_revision, e)),
            Err(_) => {
                return Err(StorageError::Timeout(format!(
                    "watch: etcd did not open the stream within {:?}",
                    self.request_timeout
                )));
            }
        };
        let (requests, responses) = stream.split();
        Ok(RawWatch {
            requests,
            responses,
            from_revision,
        })
    }
}

impl RawWatch {
    /// The next item; errors end the stream as for [`Watch::next`].
    /// Cancel-safe.
    pub async fn next(&mut self) -> Result<RawWatchItem, StorageError> {
        loop {
            let resp = match self.responses.message().await {
                Ok(Some(r)) => r.0,
                Ok(None) => {
                    return Err(StorageError::Unavailable("watch stream closed".into()));
                }
                Err(e) => return Err(StorageError::from_etcd("watch", self.from_revision, e)),
            };
            if resp.canceled {
                if resp.compact_revision > 0 {
                    return Err(StorageError::Compacted {
                        requested: self.from_revision,
                        compacted: resp.compact_revision,
                    });
                }
                return Err(StorageError::Unavailable(format!(
                    "watch canceled by etcd: {}",
                    resp.cancel_reason
                )));
            }
            let Some(header) = resp.header else { continue };
            if resp.events.is_empty() {
                if resp.created {
                    continue;
                }
                let revision = header.revision;
                return Ok(RawWatchItem::Progress { header, revision });
            }
            let revision = resp
                .events
                .iter()
                .filter_map(|e| e.kv.as_ref().map(|kv| kv.mod_revision))
                .max()
                .unwrap_or(0);
            self.from_revision = self.from_revision.max(revision + 1);
            return Ok(RawWatchItem::Events {
                header,
                events: resp.events,
                revision,
            });
        }
    }

    /// Asks etcd for a progress notification.
    pub async fn request_progress(&mut self) -> Result<(), StorageError> {
        self.requests
            .request_progress()
            .await
            .map_err(|e| StorageError::from_etcd("watch progress request", 0, e))
    }
}

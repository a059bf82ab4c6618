//! watchcache: a watch-cache proxy daemon for etcd, after the kube-apiserver `Cacher`.
//!
//! Data flows one way: etcd -> [`cacher::Reflector`] -> [`cacher::WatchCache`]
//! -> watchers -> clients. Writes go client -> [`storage::Storage`] -> etcd and
//! come back only through the reflector's watch. See `docs/ARCHITECTURE.md`.

pub mod api;
pub mod auth;
pub mod backoff;
pub mod cacher;
pub mod coalesced_stream;
pub mod config;
pub mod etcd_server;
pub mod grpc;
pub mod metrics;
pub mod object;
pub mod prefetch;
pub mod storage;
pub mod tls;

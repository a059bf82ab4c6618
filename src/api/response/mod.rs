//! Writing answers (kube-apiserver's `responsewriters`): the response
//! [`Body`], the frames of a List ([`list`]) and those kept for the next
//! List of the same objects ([`list_body_cache`], within [`budget`]),
//! gzip ([`compression`], [`gzip`]), protobuf, Tables (with kube-apiserver's
//! [`printers`]), `PartialObjectMetadata` ([`metadata`]), and watch streams.
//! Below the handlers: nothing here imports them or the state.

pub mod body;
pub mod budget;
pub mod compression;
pub mod gzip;
pub mod list;
pub mod list_body_cache;
pub mod metadata;
pub mod printers;
pub mod protobuf;
pub mod table;
pub mod watch_stream;
pub mod writers;

pub use body::Body;
pub use watch_stream::WatchStreams;

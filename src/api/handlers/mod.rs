//! The handlers, one file per verb (kube-apiserver's
//! `endpoints/handlers/`): reads answered by the cacher, writes through
//! storage. [`target`] resolves what a path addresses; [`object_meta`]
//! holds the metadata rules of a write and [`write`] what every write
//! shares; discovery, the self reviews and the ops endpoints have a file
//! each.

pub mod aggregated_discovery;
pub mod apply;
pub mod create;
pub mod delete;
pub mod discovery;
pub mod get;
pub mod list;
pub mod object_meta;
pub mod ops;
pub mod patch;
pub mod reviews;
pub mod target;
pub mod update;
pub mod watch;
pub mod write;

//! The front door: an HTTP server (hyper 1.x; HTTP/1.1 and h2c with prior
//! knowledge on one port, or TLS) serving the Kubernetes-style REST API
//! and the operational endpoints.
//!
//! Layers, each importing only those below it (`tests/architecture.rs`
//! checks that no import goes round in a circle):
//! [`server`] (accept, connections, background tasks) ->
//! [`pipeline`] (request info, admission, routing, gzip, metrics) ->
//! [`handlers`] (one file per verb) -> [`patch`] and [`state`] ->
//! [`response`] (bodies, List frames, compression, protobuf, tables,
//! watch streams) -> [`request`] (query, negotiation, body, the
//! connection) -> [`status`] (`Status` answers). [`security`] (TLS,
//! authentication, authorization as loaded) sits under [`state`].
//! This file holds modules and re-exports only: nothing imports from it.

pub mod handlers;
pub mod patch;
pub mod pipeline;
pub mod request;
pub mod response;
pub mod security;
pub mod server;
pub mod state;
pub mod status;

pub use request::{RequestInfo, RequestInfoError};
pub use response::{Body, WatchStreams};
pub use security::{Security, SecurityError};
pub use server::{ApiError, Server};
pub use state::{Resource, State};
pub use status::ApiStatus;

//! What a request brings: its query parameters ([`params`]), what its
//! headers ask the answer to be ([`negotiation`]), its body read within the
//! limits ([`body`]), its [`RequestInfo`] (verb, resource, namespace, name),
//! and the connection it came on ([`connection`]).

pub mod body;
pub mod connection;
pub mod negotiation;
pub mod params;
pub mod request_info;

pub use request_info::{RequestInfo, RequestInfoError};

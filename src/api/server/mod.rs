//! The server: the listener (accept, the connection cap, drain on
//! shutdown), one connection (TLS, timers, HTTP/1 or h2), the executor of a
//! connection's h2 streams, and the background tasks.

pub mod background;
pub mod connection;
pub mod listener;
pub mod stream_executor;

pub use listener::{ApiError, Server};

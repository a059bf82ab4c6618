//! What every request goes through between its connection and its handler:
//! [`handle`] resolves its request info, [`admit`]s it (authentication,
//! [`impersonation`], authorization, audit), [`route`]s it, gzips the answer when asked, and
//! records its metrics and log line.

pub mod admit;
pub mod handle;
pub mod impersonation;
pub mod route;

//! Failure answers: [`ApiStatus`] (a Kubernetes `Status`) and the one
//! mapping from the library's errors to it ([`errors`]). The bottom layer of
//! `api/`: it imports nothing from the layers above.

pub mod api_status;
pub mod errors;

pub use api_status::ApiStatus;

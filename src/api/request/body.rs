//! Reading a request's body: within `server.max_body_bytes` and
//! `server.request_body_timeout_ms`, and its media type checked before it
//! is parsed.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::Request;
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE};
use hyper::http::request::Parts;
use serde_json::Value;

use super::negotiation::media_type;
use crate::api::status::ApiStatus;
use crate::config::ServerConfig;

pub(crate) async fn read_body(
    server: &ServerConfig,
    req: Request<Incoming>,
) -> Result<(Parts, Bytes), ApiStatus> {
    let max = server.max_body_bytes;
    let (parts, body) = req.into_parts();
    // The rest of the body is left unread: an HTTP/1.x connection cannot
    // carry another request after it, so the answer says so (as Go's
    // net/http does for a request over its limit); without it the client
    // could send its next request on a connection being closed.
    let http1 = parts.version < hyper::Version::HTTP_2;
    let too_large = || {
        let s = ApiStatus::too_large(format!(
            "the request body is larger than the limit of {max} bytes"
        ));
        if http1 { s.with_close_connection() } else { s }
    };
    if let Some(len) = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        && len > max as u64
    {
        return Err(too_large());
    }
    let wait = Duration::from_millis(server.request_body_timeout_ms);
    let Ok(read) = tokio::time::timeout(wait, Limited::new(body, max).collect()).await else {
        let s = ApiStatus::new(
            408,
            "Timeout",
            format!("the request body did not arrive within {wait:?}"),
        );
        return Err(if http1 { s.with_close_connection() } else { s });
    };
    match read {
        Ok(c) => Ok((parts, c.to_bytes())),
        Err(e) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                Err(too_large())
            } else {
                Err(ApiStatus::bad_request(format!(
                    "cannot read the request body: {e}"
                )))
            }
        }
    }
}

/// Create and update bodies must be JSON.
pub(crate) fn check_json_content_type(parts: &Parts) -> Result<(), ApiStatus> {
    let ct = media_type(
        parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    );
    match ct.as_deref() {
        None | Some("") | Some("application/json") | Some("*/*") => Ok(()),
        Some(other) => Err(ApiStatus::unsupported_media_type(format!(
            "the body of the request was in an unknown format - accepted media types include: application/json (got {other})"
        ))),
    }
}

pub(crate) fn parse_json(body: &[u8]) -> Result<Value, ApiStatus> {
    serde_json::from_slice(body)
        .map_err(|e| ApiStatus::bad_request(format!("the request body is not valid JSON: {e}")))
}

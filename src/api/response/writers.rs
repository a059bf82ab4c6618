//! Writing answers: a response with a body and its content type, JSON,
//! and a `Status` (with `Retry-After` and `Connection: close` when it
//! says so). Every handler's answer is made here.

use bytes::Bytes;
use hyper::header::{CONNECTION, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Response, StatusCode};
use serde_json::Value;

use super::body::Body;
use crate::api::status::ApiStatus;

/// `bytes` as a whole body.
pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Body::full(bytes)
}

/// A response with `body` and the given content type.
pub(crate) fn response(code: u16, content_type: &'static str, body: Body) -> Response<Body> {
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// A JSON response.
pub(crate) fn json_response(code: u16, body: impl Into<Bytes>) -> Response<Body> {
    response(code, "application/json", full(body))
}

/// `v` as a JSON response.
pub(crate) fn json_value(code: u16, v: &Value) -> Response<Body> {
    json_response(code, v.to_string())
}

/// A `Status` error response (with `Retry-After` when set).
pub(crate) fn status_response(status: &ApiStatus) -> Response<Body> {
    let mut resp = json_response(status.code, status.to_bytes());
    if let Some(secs) = status.retry_after
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        resp.headers_mut().insert(RETRY_AFTER, v);
    }
    if status.close_connection {
        resp.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

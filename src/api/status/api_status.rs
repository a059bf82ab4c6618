//! The API's failure answers as Kubernetes `Status` objects.
//!
//! Every error that leaves the API goes through [`ApiStatus`]: handlers build
//! one directly for request problems, and [`super::errors`] maps the storage
//! and cacher errors once, at the edge. The JSON is rendered by the object
//! layer's [`Status`].

use bytes::Bytes;

use crate::object::wire::{Status, StatusCause, StatusDetails};

/// A failure answer: HTTP code, Kubernetes reason, message and optional
/// `Retry-After` seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiStatus {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub retry_after: Option<u64>,
    /// Answered with `Connection: close` (HTTP/1.x): the request's body was
    /// left unread, so the connection cannot carry another request.
    pub close_connection: bool,
    /// `details` of the Status (name, group, kind, causes), when known;
    /// `retryAfterSeconds` comes from `retry_after`. Boxed: most failures
    /// have none, and every `Result<_, ApiStatus>` carries the room.
    pub details: Option<Box<StatusDetails>>,
}

impl ApiStatus {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiStatus {
        ApiStatus {
            code,
            reason,
            message: message.into(),
            retry_after: None,
            close_connection: false,
            details: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiStatus {
        ApiStatus::new(400, "BadRequest", message)
    }

    /// 401: the credentials were missing or wrong; deliberately no detail.
    pub fn unauthorized() -> ApiStatus {
        ApiStatus::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403: authenticated, but the authorizer said no.
    pub fn forbidden(message: impl Into<String>) -> ApiStatus {
        ApiStatus::new(403, "Forbidden", message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiStatus {
        ApiStatus::new(404, "NotFound", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> ApiStatus {
        ApiStatus::new(405, "MethodNotAllowed", message)
    }

    pub fn conflict(message: impl Into<String>) -> ApiStatus {
        ApiStatus::new(409, "Conflict", message)
    }

    pub fn already_exists(message: impl Into<String>) -> ApiStatus {
        ApiStatus::new(409, "AlreadyExists", message)
    }

    pub fn expired(message: impl Into<String>) -> ApiStatus {
        ApiStatus::new(410, "Expired", message)
    }

    pub fn too_large(message: impl Into<String>) -> ApiStatus {
        ApiStatus::new(413, "RequestEntityTooLarge", message)
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> ApiStatus {
        ApiStatus::new(415, "UnsupportedMediaType", message)
    }

    pub fn invalid(message: impl Into<String>) -> ApiStatus {
        ApiStatus::new(422, "Invalid", message)
    }

    pub fn too_many_requests(message: impl Into<String>, retry_after: u64) -> ApiStatus {
        ApiStatus::new(429, "TooManyRequests", message).with_retry_after(retry_after)
    }

    pub fn internal(message: impl Into<String>) -> ApiStatus {
        ApiStatus::new(500, "InternalError", message)
    }

    pub fn service_unavailable(message: impl Into<String>) -> ApiStatus {
        ApiStatus::new(503, "ServiceUnavailable", message).with_retry_after(1)
    }

    pub fn timeout(message: impl Into<String>) -> ApiStatus {
        ApiStatus::new(504, "Timeout", message)
    }

    /// See [`ApiStatus::close_connection`].
    pub fn with_close_connection(mut self) -> ApiStatus {
        self.close_connection = true;
        self
    }

    pub fn with_retry_after(mut self, seconds: u64) -> ApiStatus {
        self.retry_after = Some(seconds);
        self
    }

    pub fn with_details(mut self, name: impl Into<String>, kind: impl Into<String>) -> ApiStatus {
        let d = self.details.get_or_insert_with(Box::default);
        d.name = Some(name.into());
        d.kind = Some(kind.into());
        self
    }

    /// `details: {}`: kube's `NewForbidden` of a non-resource request.
    pub fn with_empty_details(mut self) -> ApiStatus {
        self.details.get_or_insert_with(Box::default);
        self
    }

    /// `details.kind` alone (a collection: kube's `NewForbidden` with no name).
    pub fn with_kind(mut self, kind: impl Into<String>) -> ApiStatus {
        self.details.get_or_insert_with(Box::default).kind = Some(kind.into());
        self
    }

    /// `details.group`, for a resource outside the core group.
    pub fn with_group(mut self, group: &str) -> ApiStatus {
        if !group.is_empty() {
            self.details.get_or_insert_with(Box::default).group = Some(group.to_string());
        }
        self
    }

    /// One `details.causes` entry (`reason` is Kubernetes' cause type).
    pub fn with_cause(self, reason: &str, message: &str) -> ApiStatus {
        self.with_field_cause(reason, message, "")
    }

    /// One `details.causes` entry about a field (`.spec.replicas`).
    pub fn with_field_cause(mut self, reason: &str, message: &str, field: &str) -> ApiStatus {
        self.details
            .get_or_insert_with(Box::default)
            .causes
            .push(StatusCause {
                reason: reason.to_string(),
                message: message.to_string(),
                field: field.to_string(),
            });
        self
    }

    /// The `Status` object (the object layer renders it).
    pub fn status(&self) -> Status {
        let status = Status::failure(self.code, self.reason, self.message.clone());
        let mut details = self.details.as_deref().cloned().unwrap_or_default();
        details.retry_after_seconds = self
            .retry_after
            .map(|s| u32::try_from(s).unwrap_or(u32::MAX));
        if self.details.is_none() && details == StatusDetails::default() {
            status
        } else {
            status.with_details(details)
        }
    }

    /// The `Status` object as bytes.
    pub fn to_bytes(&self) -> Bytes {
        self.status().to_json()
    }

    /// A watch `ERROR` event line carrying this Status.
    pub fn error_line(&self) -> Bytes {
        crate::object::wire::error_line(&self.status())
    }
}

impl std::fmt::Display for ApiStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn status_shape() {
        let s = ApiStatus::too_many_requests("busy", 2).with_details("a", "pods");
        let v: Value = serde_json::from_slice(&s.to_bytes()).unwrap();
        assert_eq!(v["kind"], "Status");
        assert_eq!(v["status"], "Failure");
        assert_eq!(v["code"], 429);
        assert_eq!(v["reason"], "TooManyRequests");
        assert_eq!(v["details"]["retryAfterSeconds"], 2);
        assert_eq!(v["details"]["name"], "a");
        let line = s.error_line();
        assert!(line.ends_with(b"\n"));
        let ev: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(ev["type"], "ERROR");
    }
}

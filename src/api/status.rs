//! Kubernetes `Status` objects and the one mapping from error enums to them.
//!
//! Every error that leaves the API goes through [`ApiStatus`]: handlers build
//! one directly for request problems, and `From` impls map the storage and
//! cacher errors once, at the edge.

use bytes::Bytes;
use serde_json::{Value, json};

/// A failure answer: HTTP code, Kubernetes reason, message and optional
/// `Retry-After` seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiStatus {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub retry_after: Option<u64>,
    /// `details` of the Status (name, kind), when known.
    pub details: Option<(String, String)>,
}

impl ApiStatus {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiStatus {
        ApiStatus {
            code,
            reason,
            message: message.into(),
            retry_after: None,
            details: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiStatus {
        ApiStatus::new(400, "BadRequest", message)
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

    pub fn with_retry_after(mut self, seconds: u64) -> ApiStatus {
        self.retry_after = Some(seconds);
        self
    }

    pub fn with_details(mut self, name: impl Into<String>, kind: impl Into<String>) -> ApiStatus {
        self.details = Some((name.into(), kind.into()));
        self
    }

    /// The `Status` object as JSON.
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        let mut details = serde_json::Map::new();
        if let Some((name, kind)) = &self.details {
            details.insert("name".into(), Value::String(name.clone()));
            details.insert("kind".into(), Value::String(kind.clone()));
        }
        if let Some(secs) = self.retry_after {
            details.insert("retryAfterSeconds".into(), json!(secs));
        }
        if !details.is_empty() {
            v["details"] = Value::Object(details);
        }
        v
    }

    /// The `Status` object as bytes.
    pub fn to_bytes(&self) -> Bytes {
        Bytes::from(self.to_json().to_string())
    }

    /// A watch `ERROR` event line carrying this Status.
    pub fn error_line(&self) -> Bytes {
        let mut line = json!({"type": "ERROR", "object": self.to_json()}).to_string();
        line.push('\n');
        Bytes::from(line)
    }
}

impl std::fmt::Display for ApiStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

/// A `Status` object with `status: Success` (used by deletes that answer with a Status).
pub fn success_json(name: &str, kind: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": name, "kind": kind},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_shape() {
        let s = ApiStatus::too_many_requests("busy", 2).with_details("a", "pods");
        let v = s.to_json();
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

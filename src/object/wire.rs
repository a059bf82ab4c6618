//! Watch stream lines and `Status` objects (docs/DESIGN.md section 2).
//!
//! A watch body is one JSON object per line:
//! `{"type":"ADDED|MODIFIED|DELETED|BOOKMARK|ERROR","object":{..}}\n`.
//! Lines are built by concatenation around the object's already-serialized
//! wire JSON; the object is never re-parsed.

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

/// The `type` of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
    Bookmark,
    Error,
}

impl EventType {
    /// The wire name: `ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`, `ERROR`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
            EventType::Bookmark => "BOOKMARK",
            EventType::Error => "ERROR",
        }
    }
}

impl std::fmt::Display for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `{"type":"<TYPE>","object":<object_json>}\n`. `object_json` must be one
/// complete JSON value without a trailing newline (e.g. [`super::Object::wire`]).
pub fn event_line(event_type: EventType, object_json: &[u8]) -> Bytes {
    const HEAD: &[u8] = b"{\"type\":\"";
    const MID: &[u8] = b"\",\"object\":";
    const TAIL: &[u8] = b"}\n";
    let t = event_type.as_str().as_bytes();
    let mut buf =
        BytesMut::with_capacity(HEAD.len() + t.len() + MID.len() + object_json.len() + TAIL.len());
    buf.put_slice(HEAD);
    buf.put_slice(t);
    buf.put_slice(MID);
    buf.put_slice(object_json);
    buf.put_slice(TAIL);
    buf.freeze()
}

/// Annotation marking the bookmark at the end of a watch's initial events.
pub const INITIAL_EVENTS_END_ANNOTATION: &str = "k8s.io/initial-events-end";

/// Watch lines (`{"type":..,"object":..}`, newline-separated) as
/// kube-apiserver's protobuf watch stream: per event, a 4-byte big-endian
/// length, then a bare `meta.v1.WatchEvent` message (no `k8s\0` envelope:
/// kube-apiserver's stream serializer is protobuf's raw one) whose object
/// is the object's own `k8s\0` encoding. Only for built-in types (see
/// [`super::protobuf`]).
pub fn protobuf_watch_frames(lines: &[u8]) -> Result<Bytes, super::protobuf::ProtobufError> {
    use super::protobuf::{ProtobufError, encode, encode_watch_event};
    let mut out = BytesMut::with_capacity(lines.len());
    for line in lines.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let event: serde_json::Value =
            serde_json::from_slice(line).map_err(|e| ProtobufError::Json {
                path: String::new(),
                reason: format!("watch event is not JSON: {e}"),
            })?;
        let ty = event.get("type").and_then(|t| t.as_str()).unwrap_or("");
        let object = encode(event.get("object").unwrap_or(&serde_json::Value::Null))?;
        push_frame(&mut out, &encode_watch_event(ty, object)?)?;
    }
    Ok(out.freeze())
}

/// One protobuf watch frame (as [`protobuf_watch_frames`] writes it) of an
/// `event_type` event of `object` at `resource_version` (its own, or a
/// deletion's), made from the object's cached message
/// ([`super::Object::protobuf_message_at`]) without parsing its JSON:
/// `api_version`/`kind` are its resource's.
pub fn protobuf_object_frame(
    event_type: EventType,
    object: &super::Object,
    resource_version: i64,
    api_version: &str,
    kind: &str,
) -> Result<Bytes, super::protobuf::ProtobufError> {
    use super::protobuf::{encode_watch_event, wrap_message};
    let message = object.protobuf_message_at(api_version, kind, resource_version)?;
    let object = wrap_message(api_version, kind, &message)?;
    let frame = encode_watch_event(event_type.as_str(), object)?;
    let mut out = BytesMut::with_capacity(4 + frame.len());
    push_frame(&mut out, &frame)?;
    Ok(out.freeze())
}

/// A frame of a protobuf watch stream: its 4-byte big-endian length, then it.
fn push_frame(out: &mut BytesMut, frame: &[u8]) -> Result<(), super::protobuf::ProtobufError> {
    let len = u32::try_from(frame.len()).map_err(|_| {
        super::protobuf::ProtobufError::Schema("watch event larger than 4 GiB".into())
    })?;
    out.put_u32(len);
    out.put_slice(frame);
    Ok(())
}

/// The object of a BOOKMARK event: only `apiVersion`, `kind` and
/// `metadata.resourceVersion`, plus the `k8s.io/initial-events-end: "true"`
/// annotation when `initial_events_end`.
pub fn bookmark_object(
    api_version: &str,
    kind: &str,
    resource_version: i64,
    initial_events_end: bool,
) -> Bytes {
    let mut s = String::with_capacity(128 + api_version.len() + kind.len());
    s.push_str("{\"apiVersion\":");
    push_json_str(&mut s, api_version);
    s.push_str(",\"kind\":");
    push_json_str(&mut s, kind);
    s.push_str(",\"metadata\":{\"resourceVersion\":\"");
    s.push_str(&resource_version.to_string());
    s.push('"');
    if initial_events_end {
        s.push_str(",\"annotations\":{\"");
        s.push_str(INITIAL_EVENTS_END_ANNOTATION);
        s.push_str("\":\"true\"}");
    }
    s.push_str("}}");
    Bytes::from(s)
}

/// A whole BOOKMARK line: `{"type":"BOOKMARK","object":<bookmark_object>}\n`.
pub fn bookmark_line(
    api_version: &str,
    kind: &str,
    resource_version: i64,
    initial_events_end: bool,
) -> Bytes {
    event_line(
        EventType::Bookmark,
        &bookmark_object(api_version, kind, resource_version, initial_events_end),
    )
}

/// An ERROR line carrying `status`: `{"type":"ERROR","object":<Status>}\n`.
/// Watch event lines (`{"type":..,"object":..}\n`) with each event
/// replaced by `convert(type, event)`'s line, or kept as it is where that
/// gives `None` (or the line is not an event): the one loop of every
/// per-watcher conversion (Tables, metadata).
pub fn map_event_lines(
    data: &[u8],
    mut convert: impl FnMut(&str, &serde_json::Value) -> Option<String>,
) -> Bytes {
    let mut out = BytesMut::with_capacity(data.len());
    for line in data.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let converted = serde_json::from_slice::<serde_json::Value>(line)
            .ok()
            .and_then(|ev| {
                let ty = ev.get("type")?.as_str()?.to_string();
                convert(&ty, &ev)
            });
        match converted {
            Some(s) => out.put_slice(s.as_bytes()),
            None => out.put_slice(line),
        }
        out.put_u8(b'\n');
    }
    out.freeze()
}

pub fn error_line(status: &Status) -> Bytes {
    event_line(EventType::Error, &status.to_json())
}

fn push_json_str(out: &mut String, s: &str) {
    // Serializing a &str cannot fail; fall back to an empty string anyway
    // rather than panic.
    match serde_json::to_string(s) {
        Ok(q) => out.push_str(&q),
        Err(_) => out.push_str("\"\""),
    }
}

/// A Kubernetes `Status` (`kind: Status`, `apiVersion: v1`), used for error
/// responses and ERROR watch events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub kind: String,
    pub api_version: String,
    #[serde(default)]
    pub metadata: StatusMetadata,
    /// `Failure` (or `Success`).
    pub status: String,
    #[serde(default)]
    pub message: String,
    /// Machine-readable reason: `NotFound`, `Expired`, `Conflict`, ...;
    /// empty (and left out, as Go's `omitempty`) for an error kube-apiserver
    /// has no reason for.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// The HTTP status code.
    #[serde(default)]
    pub code: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<StatusDetails>,
}

/// `Status.metadata` (always `{}` here).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusMetadata {}

/// `Status.details`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusDetails {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<StatusCause>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u32>,
}

/// One entry of `Status.details.causes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusCause {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub field: String,
}

impl Status {
    /// A `Failure` status with the given HTTP code, reason and message.
    pub fn failure(code: u16, reason: impl Into<String>, message: impl Into<String>) -> Status {
        Status {
            kind: "Status".into(),
            api_version: "v1".into(),
            metadata: StatusMetadata {},
            status: "Failure".into(),
            message: message.into(),
            reason: reason.into(),
            code,
            details: None,
        }
    }

    /// 410 Expired, as sent when a watch cannot be served from history:
    /// message `too old resource version: N (M)`.
    pub fn expired(message: impl Into<String>) -> Status {
        Status::failure(410, "Expired", message)
    }

    /// Adds `details`.
    pub fn with_details(mut self, details: StatusDetails) -> Status {
        self.details = Some(details);
        self
    }

    /// The JSON encoding.
    pub fn to_json(&self) -> Bytes {
        match serde_json::to_vec(self) {
            Ok(v) => Bytes::from(v),
            // Unreachable for this plain struct; never panic on the error path.
            Err(_) => Bytes::from_static(
                b"{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"internal error\",\"reason\":\"InternalError\",\"code\":500}",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn parse_line(line: &[u8]) -> Value {
        assert_eq!(line.last(), Some(&b'\n'), "line ends with a newline");
        assert_eq!(
            line.iter().filter(|&&b| b == b'\n').count(),
            1,
            "exactly one newline"
        );
        serde_json::from_slice(line).expect("valid JSON")
    }

    #[test]
    fn event_type_names() {
        assert_eq!(EventType::Added.as_str(), "ADDED");
        assert_eq!(EventType::Modified.as_str(), "MODIFIED");
        assert_eq!(EventType::Deleted.as_str(), "DELETED");
        assert_eq!(EventType::Bookmark.as_str(), "BOOKMARK");
        assert_eq!(EventType::Error.to_string(), "ERROR");
    }

    #[test]
    fn event_line_exact_bytes() {
        let obj = br#"{"kind":"Pod","metadata":{"name":"a"}}"#;
        let line = event_line(EventType::Added, obj);
        assert_eq!(
            &line[..],
            br#"{"type":"ADDED","object":{"kind":"Pod","metadata":{"name":"a"}}}"#
                .iter()
                .chain(b"\n")
                .copied()
                .collect::<Vec<u8>>()
                .as_slice()
        );
        for t in [
            EventType::Added,
            EventType::Modified,
            EventType::Deleted,
            EventType::Bookmark,
            EventType::Error,
        ] {
            let v = parse_line(&event_line(t, obj));
            assert_eq!(v["type"], t.as_str());
            assert_eq!(v["object"]["metadata"]["name"], "a");
        }
    }

    #[test]
    fn bookmark_line_shape() {
        let v = parse_line(&bookmark_line("v1", "Pod", 42, false));
        assert_eq!(
            v,
            json!({"type":"BOOKMARK","object":{"apiVersion":"v1","kind":"Pod","metadata":{"resourceVersion":"42"}}})
        );
        let v = parse_line(&bookmark_line("apps/v1", "Deployment", 7, true));
        assert_eq!(
            v,
            json!({"type":"BOOKMARK","object":{"apiVersion":"apps/v1","kind":"Deployment",
                "metadata":{"resourceVersion":"7","annotations":{"k8s.io/initial-events-end":"true"}}}})
        );
        // Odd strings are escaped, never break the JSON.
        let v = parse_line(&bookmark_line("a\"b\n", "K\\\u{1}", -1, true));
        assert_eq!(v["object"]["apiVersion"], "a\"b\n");
        assert_eq!(v["object"]["kind"], "K\\\u{1}");
        assert_eq!(v["object"]["metadata"]["resourceVersion"], "-1");
    }

    #[test]
    fn status_json_and_error_line() {
        let s = Status::expired("too old resource version: 5 (10)");
        let v: Value = serde_json::from_slice(&s.to_json()).unwrap();
        assert_eq!(
            v,
            json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                "message":"too old resource version: 5 (10)","reason":"Expired","code":410})
        );
        let v = parse_line(&error_line(&s));
        assert_eq!(v["type"], "ERROR");
        assert_eq!(v["object"]["code"], 410);
        assert_eq!(v["object"]["reason"], "Expired");

        let s =
            Status::failure(404, "NotFound", "pods \"x\" not found").with_details(StatusDetails {
                name: Some("x".into()),
                kind: Some("pods".into()),
                retry_after_seconds: Some(1),
                ..Default::default()
            });
        let v: Value = serde_json::from_slice(&s.to_json()).unwrap();
        assert_eq!(
            v["details"],
            json!({"name":"x","kind":"pods","retryAfterSeconds":1})
        );
        let back: Status = serde_json::from_slice(&s.to_json()).unwrap();
        assert_eq!(back, s);
    }
}

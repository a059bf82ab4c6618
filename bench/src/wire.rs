//! Bench objects and the cheap parsing of what comes back.
//!
//! The receiving side of a fan-out run handles up to a million events a
//! second on the same two cores as the system under test, so it does not build
//! a JSON tree per event: it finds the few fields it needs by substring search
//! and falls back to serde_json only when that fails. Pure.

use std::sync::LazyLock;

use memchr::memmem::Finder;
use watchcache::object::wire::EventType;

static TYPE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"type\":\""));
static RV: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"resourceVersion\":\""));
static WRITE_TS: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"writeTs\":"));
static CONTINUE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"continue\":\""));

/// Nanoseconds since the Unix epoch (the clock shared by writer and watchers).
pub fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// A Pod of about `size` bytes of JSON carrying its write timestamp.
pub fn make_object(namespace: &str, name: &str, write_ts: i64, size: usize) -> Vec<u8> {
    let head = format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"{namespace}"}},"spec":{{"writeTs":{write_ts},"pad":""#
    );
    let tail = r#""}}"#;
    let pad = size.saturating_sub(head.len() + tail.len());
    let mut v = Vec::with_capacity(head.len() + pad + tail.len());
    v.extend_from_slice(head.as_bytes());
    v.resize(head.len() + pad, b'x');
    v.extend_from_slice(tail.as_bytes());
    v
}

/// Which objects a scenario loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectShape {
    /// [`make_object`]: the write timestamp in `spec`.
    Bench,
    /// [`make_schema_pod`]: fits the Pod schema, so it can be served as protobuf.
    SchemaPod,
    /// [`make_schema_pod`] stored as kube-apiserver stores it (`k8s\0` protobuf).
    StoredProtobufPod,
}

/// A Pod of about `size` bytes of JSON that fits the Pod schema (so
/// watchcache can serve it as protobuf): one container, the padding in an
/// annotation.
pub fn make_schema_pod(namespace: &str, name: &str, size: usize) -> Vec<u8> {
    let head = format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"{namespace}","annotations":{{"pad":""#
    );
    let tail = r#""}},"spec":{"containers":[{"name":"c","image":"busybox"}]}}"#;
    let pad = size.saturating_sub(head.len() + tail.len());
    let mut v = Vec::with_capacity(head.len() + pad + tail.len());
    v.extend_from_slice(head.as_bytes());
    v.resize(head.len() + pad, b'x');
    v.extend_from_slice(tail.as_bytes());
    v
}

/// A Pod of about `size` bytes of JSON as a workload controller would
/// create it (labels, owner, one container with env, ports, resources,
/// probes and a volume), carrying its write timestamp in the `writeTs`
/// annotation (a string: kube-apiserver keeps annotations, not unknown
/// fields), padded to `size` with a `pad` annotation. Fits the Pod schema
/// and kube-apiserver's validation.
pub fn make_realistic_pod(namespace: &str, name: &str, write_ts: i64, size: usize) -> Vec<u8> {
    let head = format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"{namespace}","labels":{{"app.kubernetes.io/name":"bench","app.kubernetes.io/instance":"bench-web","app.kubernetes.io/component":"frontend","pod-template-hash":"7d9f8b6c5d","tier":"web"}},"annotations":{{"writeTs":"{write_ts}","kubectl.kubernetes.io/default-container":"app","prometheus.io/scrape":"true","prometheus.io/port":"9090","pad":""#
    );
    let tail = r#""}},"spec":{"nodeName":"node-1","restartPolicy":"Always","terminationGracePeriodSeconds":30,"dnsPolicy":"ClusterFirst","containers":[{"name":"app","image":"registry.k8s.io/e2e-test-images/agnhost:2.53","args":["netexec","--http-port=8080"],"ports":[{"name":"http","containerPort":8080,"protocol":"TCP"},{"name":"metrics","containerPort":9090,"protocol":"TCP"}],"env":[{"name":"POD_NAME","valueFrom":{"fieldRef":{"fieldPath":"metadata.name"}}},{"name":"POD_NAMESPACE","valueFrom":{"fieldRef":{"fieldPath":"metadata.namespace"}}},{"name":"LOG_LEVEL","value":"info"}],"resources":{"requests":{"cpu":"100m","memory":"128Mi"},"limits":{"cpu":"500m","memory":"256Mi"}},"readinessProbe":{"httpGet":{"path":"/healthz","port":8080},"periodSeconds":10},"livenessProbe":{"httpGet":{"path":"/healthz","port":8080},"initialDelaySeconds":5,"periodSeconds":20},"volumeMounts":[{"name":"config","mountPath":"/etc/app","readOnly":true}],"imagePullPolicy":"IfNotPresent"}],"volumes":[{"name":"config","configMap":{"name":"bench-config"}}],"tolerations":[{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}]}}"#;
    let pad = size.saturating_sub(head.len() + tail.len());
    let mut v = Vec::with_capacity(head.len() + pad + tail.len());
    v.extend_from_slice(head.as_bytes());
    v.resize(head.len() + pad, b'x');
    v.extend_from_slice(tail.as_bytes());
    v
}

/// The watch event type named by `name` (`ADDED`, ...), `None` for any other.
fn event_type(name: &[u8]) -> Option<EventType> {
    [
        EventType::Added,
        EventType::Modified,
        EventType::Deleted,
        EventType::Bookmark,
        EventType::Error,
    ]
    .into_iter()
    .find(|t| t.as_str().as_bytes() == name)
}

/// What the bench needs from one watch event line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventInfo {
    /// The event's `type` (`None`: a type this bench does not know).
    pub kind: Option<EventType>,
    /// `metadata.resourceVersion` of the object (0 when absent).
    pub rv: i64,
    /// `spec.writeTs` of the object, when present.
    pub write_ts: Option<i64>,
    /// For ERROR events: the Status message.
    pub message: Option<String>,
}

fn digits_at(s: &[u8], mut i: usize) -> Option<i64> {
    while i < s.len() && s[i] == b' ' {
        i += 1;
    }
    // A string of digits (the `writeTs` annotation) reads as its number.
    if s.get(i) == Some(&b'"') {
        i += 1;
    }
    let start = i;
    while i < s.len() && s[i].is_ascii_digit() {
        i += 1;
    }
    if i == start {
        return None;
    }
    std::str::from_utf8(&s[start..i]).ok()?.parse().ok()
}

/// `spec.writeTs` of a bench object, or the `writeTs` annotation of a
/// [`make_realistic_pod`] (a raw etcd value or an event line).
pub fn extract_write_ts(value: &[u8]) -> Option<i64> {
    let at = WRITE_TS.find(value)?;
    digits_at(value, at + WRITE_TS.needle().len())
}

/// Parses one watch event line (`{"type":..,"object":..}`).
pub fn parse_watch_line(line: &[u8]) -> Result<EventInfo, String> {
    if let Some(at) = TYPE.find(line) {
        let start = at + TYPE.needle().len();
        if let Some(len) = memchr::memchr(b'"', &line[start..]) {
            let kind = event_type(&line[start..start + len]);
            if kind != Some(EventType::Error) {
                let rv = RV
                    .find(line)
                    .and_then(|i| digits_at(line, i + RV.needle().len()))
                    .unwrap_or(0);
                if rv != 0 || kind.is_none() {
                    return Ok(EventInfo {
                        kind,
                        rv,
                        write_ts: extract_write_ts(line),
                        message: None,
                    });
                }
            }
        }
    }
    parse_watch_line_slow(line)
}

fn parse_watch_line_slow(line: &[u8]) -> Result<EventInfo, String> {
    let v: serde_json::Value = serde_json::from_slice(line).map_err(|e| {
        format!(
            "unparsable watch line ({e}): {}",
            String::from_utf8_lossy(&line[..line.len().min(200)])
        )
    })?;
    let kind = event_type(v["type"].as_str().unwrap_or("").as_bytes());
    let obj = &v["object"];
    let rv = match &obj["metadata"]["resourceVersion"] {
        serde_json::Value::String(s) => s.parse().unwrap_or(0),
        serde_json::Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    };
    let write_ts = obj["spec"]["writeTs"].as_i64().or_else(|| {
        obj["metadata"]["annotations"]["writeTs"]
            .as_str()
            .and_then(|s| s.parse().ok())
    });
    let message = (kind == Some(EventType::Error)).then(|| {
        obj["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| obj.to_string())
    });
    Ok(EventInfo {
        kind,
        rv,
        write_ts,
        message,
    })
}

/// Splits a protobuf watch stream into its frames: each a 4-byte
/// big-endian length, then a bare `meta.v1.WatchEvent`. Copies only what
/// straddles two chunks.
#[derive(Default)]
pub struct FrameSplitter {
    partial: Vec<u8>,
}

impl FrameSplitter {
    /// Feeds one chunk; calls `f` for every complete frame (without its length).
    pub fn feed(&mut self, data: &[u8], mut f: impl FnMut(&[u8])) {
        let mut data = data;
        if !self.partial.is_empty() {
            // Complete the pending frame first.
            if self.partial.len() < 4 {
                let take = (4 - self.partial.len()).min(data.len());
                self.partial.extend_from_slice(&data[..take]);
                data = &data[take..];
                if self.partial.len() < 4 {
                    return;
                }
            }
            let len = frame_len(&self.partial);
            let have = self.partial.len() - 4;
            let take = (len - have).min(data.len());
            self.partial.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.partial.len() - 4 < len {
                return;
            }
            f(&self.partial[4..]);
            self.partial.clear();
        }
        while data.len() >= 4 {
            let len = frame_len(data);
            if data.len() - 4 < len {
                break;
            }
            f(&data[4..4 + len]);
            data = &data[4 + len..];
        }
        self.partial.extend_from_slice(data);
    }
}

fn frame_len(b: &[u8]) -> usize {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize
}

/// The fields of a protobuf message: (number, wire type, bytes of a
/// length-delimited field or empty). `None` when the bytes are not protobuf.
fn proto_fields(mut b: &[u8]) -> Option<Vec<(u64, u8, &[u8])>> {
    fn varint(b: &mut &[u8]) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = b.split_first()?;
            *b = rest;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = varint(&mut b)?;
        let wire = (key & 7) as u8;
        let payload: &[u8] = match wire {
            0 => {
                varint(&mut b)?;
                &[]
            }
            1 | 5 => {
                let n = if wire == 1 { 8 } else { 4 };
                b = b.get(n..)?;
                &[]
            }
            2 => {
                let len = varint(&mut b)? as usize;
                let (p, rest) = (b.get(..len)?, b.get(len..)?);
                b = rest;
                p
            }
            _ => return None,
        };
        out.push((key >> 3, wire, payload));
    }
    Some(out)
}

/// The length-delimited field `n` of a message (the last one, as protobuf
/// merges).
fn proto_field(msg: &[u8], n: u64) -> Option<&[u8]> {
    proto_fields(msg)?
        .into_iter()
        .rev()
        .find(|(f, w, _)| *f == n && *w == 2)
        .map(|(_, _, p)| p)
}

/// Parses one frame of a protobuf watch stream ([`FrameSplitter`]): the
/// event type, the object's `metadata.resourceVersion`, its `writeTs`
/// annotation, an ERROR event's message. Walks the few fields it needs
/// (WatchEvent.object.raw, the `k8s\0` envelope's raw, ObjectMeta) without
/// decoding the object.
pub fn parse_watch_frame(frame: &[u8]) -> Result<EventInfo, String> {
    let bad = |what: &str| format!("protobuf watch frame: {what} ({} bytes)", frame.len());
    let kind_name = proto_field(frame, 1).ok_or_else(|| bad("no type"))?;
    let kind = event_type(kind_name);
    let raw = proto_field(frame, 2)
        .and_then(|o| proto_field(o, 1))
        .ok_or_else(|| bad("no object"))?;
    let unknown = raw
        .strip_prefix(b"k8s\0".as_slice())
        .ok_or_else(|| bad("object without the k8s envelope"))?;
    let object = proto_field(unknown, 2).ok_or_else(|| bad("envelope without raw"))?;
    if kind == Some(EventType::Error) {
        // meta.v1.Status: message is field 3.
        let message = proto_field(object, 3).map(|m| String::from_utf8_lossy(m).into_owned());
        return Ok(EventInfo {
            kind,
            rv: 0,
            write_ts: None,
            message,
        });
    }
    let meta = proto_field(object, 1).ok_or_else(|| bad("object without metadata"))?;
    let mut rv = 0;
    let mut write_ts = None;
    for (n, w, p) in proto_fields(meta).ok_or_else(|| bad("bad metadata"))? {
        match (n, w) {
            // ObjectMeta.resourceVersion
            (6, 2) => {
                rv = std::str::from_utf8(p)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0)
            }
            // ObjectMeta.annotations: map entries (key 1, value 2).
            (12, 2) if proto_field(p, 1) == Some(b"writeTs".as_slice()) => {
                write_ts = proto_field(p, 2)
                    .and_then(|v| std::str::from_utf8(v).ok())
                    .and_then(|s| s.parse().ok());
            }
            _ => {}
        }
    }
    Ok(EventInfo {
        kind,
        rv,
        write_ts,
        message: None,
    })
}

/// The `metadata.continue` token of a list body, if any.
pub fn extract_continue(body: &[u8]) -> Option<String> {
    let at = CONTINUE.find(body)?;
    let start = at + CONTINUE.needle().len();
    let len = memchr::memchr(b'"', &body[start..])?;
    let tok = std::str::from_utf8(&body[start..start + len]).ok()?;
    (!tok.is_empty()).then(|| tok.to_string())
}

/// `metadata.resourceVersion` of a list body (the first one in it).
pub fn extract_resource_version(body: &[u8]) -> Option<i64> {
    let at = RV.find(body)?;
    digits_at(body, at + RV.needle().len())
}

/// Splits a byte stream into `\n`-terminated lines, copying only the pieces
/// that straddle two chunks.
#[derive(Default)]
pub struct LineSplitter {
    partial: Vec<u8>,
}

impl LineSplitter {
    /// Feeds one chunk; calls `f` for every complete line (without the `\n`;
    /// empty lines are skipped).
    pub fn feed(&mut self, mut data: &[u8], mut f: impl FnMut(&[u8])) {
        if !self.partial.is_empty() {
            match memchr::memchr(b'\n', data) {
                Some(nl) => {
                    self.partial.extend_from_slice(&data[..nl]);
                    if !self.partial.is_empty() {
                        f(&self.partial);
                    }
                    self.partial.clear();
                    data = &data[nl + 1..];
                }
                None => {
                    self.partial.extend_from_slice(data);
                    return;
                }
            }
        }
        while let Some(nl) = memchr::memchr(b'\n', data) {
            if nl > 0 {
                f(&data[..nl]);
            }
            data = &data[nl + 1..];
        }
        self.partial.extend_from_slice(data);
    }

    /// Bytes of an unfinished line.
    #[cfg(test)]
    pub fn pending(&self) -> usize {
        self.partial.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_has_the_requested_size_and_timestamp() {
        let o = make_object("ns", "obj-1", 1_700_000_000_123_456_789, 1024);
        assert_eq!(o.len(), 1024);
        let v: serde_json::Value = serde_json::from_slice(&o).unwrap();
        assert_eq!(
            v["spec"]["writeTs"].as_i64(),
            Some(1_700_000_000_123_456_789)
        );
        assert_eq!(extract_write_ts(&o), Some(1_700_000_000_123_456_789));
    }

    #[test]
    fn parses_event_lines_fast_and_slow() {
        let line = br#"{"type":"MODIFIED","object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","resourceVersion":"42"},"spec":{"pad":"x","writeTs":17}}}"#;
        let e = parse_watch_line(line).unwrap();
        assert_eq!(
            (e.kind, e.rv, e.write_ts),
            (Some(EventType::Modified), 42, Some(17))
        );
        let spaced = br#"{"type": "ADDED", "object": {"metadata": {"resourceVersion": "7"}, "spec": {"writeTs": 9}}}"#;
        let e = parse_watch_line(spaced).unwrap();
        assert_eq!(
            (e.kind, e.rv, e.write_ts),
            (Some(EventType::Added), 7, Some(9))
        );
        let err = br#"{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old resource version: 1 (5)"}}"#;
        let e = parse_watch_line(err).unwrap();
        assert_eq!(e.kind, Some(EventType::Error));
        assert_eq!(
            e.message.as_deref(),
            Some("too old resource version: 1 (5)")
        );
        assert!(parse_watch_line(b"{not json").is_err());
    }

    #[test]
    fn splits_lines_across_chunks() {
        let mut s = LineSplitter::default();
        let mut got = Vec::new();
        for chunk in [&b"ab"[..], b"c\nde", b"f\n\ngh\n", b"i"] {
            s.feed(chunk, |l| got.push(String::from_utf8_lossy(l).to_string()));
        }
        assert_eq!(got, ["abc", "def", "gh"]);
        assert_eq!(s.pending(), 1);
    }

    #[test]
    fn protobuf_watch_frames_are_split_and_parsed() {
        let pod: serde_json::Value =
            serde_json::from_slice(&make_realistic_pod("ns", "p", 1234, 3000)).unwrap();
        let mut pod = pod;
        pod["metadata"]["resourceVersion"] = "77".into();
        let object = watchcache::object::protobuf::encode(&pod).unwrap();
        let frame = watchcache::object::protobuf::encode_watch_event("MODIFIED", object).unwrap();
        let mut stream = Vec::new();
        for _ in 0..3 {
            stream.extend_from_slice(&(frame.len() as u32).to_be_bytes());
            stream.extend_from_slice(&frame);
        }
        // Fed in uneven chunks, every frame comes out whole.
        let mut s = FrameSplitter::default();
        let mut got = Vec::new();
        for chunk in stream.chunks(7).chain(std::iter::once(&[][..])) {
            s.feed(chunk, |f| got.push(parse_watch_frame(f).unwrap()));
        }
        assert_eq!(got.len(), 3);
        for e in got {
            assert_eq!(
                (e.kind, e.rv, e.write_ts),
                (Some(EventType::Modified), 77, Some(1234))
            );
        }
        assert!(parse_watch_frame(b"\xff\xff").is_err());
    }

    #[test]
    fn a_realistic_pod_has_its_size_and_timestamp() {
        let o = make_realistic_pod("ns", "p", 42, 3072);
        assert_eq!(o.len(), 3072);
        assert_eq!(extract_write_ts(&o), Some(42));
        let line = format!(
            r#"{{"type":"ADDED","object":{}}}"#,
            String::from_utf8_lossy(&o)
        );
        let e = parse_watch_line_slow(line.as_bytes()).unwrap();
        assert_eq!(e.write_ts, Some(42));
    }

    #[test]
    fn finds_continue_and_rv() {
        let body = br#"{"kind":"PodList","metadata":{"resourceVersion":"12","continue":"abc="},"items":[]}"#;
        assert_eq!(extract_continue(body).as_deref(), Some("abc="));
        assert_eq!(extract_resource_version(body), Some(12));
        assert_eq!(extract_continue(br#"{"metadata":{"continue":""}}"#), None);
    }
}

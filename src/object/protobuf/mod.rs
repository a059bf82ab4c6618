//! kube-apiserver's protobuf storage encoding (issue 11 part 3).
//!
//! kube-apiserver stores every built-in type as the magic `k8s\0` followed by
//! a `runtime.Unknown` envelope: `typeMeta{apiVersion, kind}`, `raw` (the
//! object's own protobuf message), `contentEncoding` and `contentType` (both
//! empty). This module turns such a value into the JSON kube-apiserver would
//! serve for it, and back, byte for byte as Go's marshalers write it.
//!
//! The codec is generic: the message types and their fields come from the
//! Kubernetes `.proto` schema (a committed descriptor set, see [`schema`]),
//! read with prost-reflect's dynamic messages; the wire format is prost's.
//! Only the few apimachinery types with their own Go JSON marshalers are
//! named (see [`json`]).

mod duration;
mod json;
mod schema;
#[cfg(test)]
mod tests;

use bytes::{BufMut, Bytes};
use prost::Message as _;
use prost::encoding::{self, WireType};
use prost_reflect::{DynamicMessage, MessageDescriptor, Value as PValue};
use serde_json::Value;

use schema::Schema;

/// The first bytes of every protobuf value kube-apiserver writes.
pub const MAGIC: &[u8; 4] = b"k8s\0";

const UNKNOWN: &str = "k8s.io.apimachinery.pkg.runtime.Unknown";
const TYPE_META: &str = "k8s.io.apimachinery.pkg.runtime.TypeMeta";
const WATCH_EVENT: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.WatchEvent";
const RAW_EXTENSION: &str = "k8s.io.apimachinery.pkg.runtime.RawExtension";
const OBJECT_META: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta";

/// Why a value could not be decoded or encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtobufError {
    /// The value does not start with `k8s\0`.
    #[error("not a Kubernetes protobuf value (no k8s\\0 prefix)")]
    NotProtobuf,
    /// The `runtime.Unknown` envelope is not valid protobuf.
    #[error("invalid runtime.Unknown envelope: {0}")]
    Envelope(String),
    /// The envelope names a type that is not a built-in Kubernetes type.
    #[error("unknown type apiVersion={api_version:?} kind={kind:?}")]
    UnknownKind { api_version: String, kind: String },
    /// The envelope's payload is not a valid message of its type.
    #[error("invalid {message} protobuf: {reason}")]
    Decode { message: String, reason: String },
    /// The envelope declares a content encoding (e.g. gzip) this codec does not read.
    #[error("unsupported content encoding {0:?}")]
    ContentEncoding(String),
    /// The JSON does not fit the type's schema (path like `spec.containers.0.name`).
    #[error("{path}: {reason}")]
    Json { path: String, reason: String },
    /// Objects embedded in objects deeper than the limit.
    #[error("objects nested deeper than {0} levels")]
    TooDeep(usize),
    /// The built-in schema could not be loaded (a build defect).
    #[error("protobuf schema: {0}")]
    Schema(String),
}

impl ProtobufError {
    /// Prefixes a JSON path segment (errors bubble up from the leaf).
    fn under(self, segment: &str) -> ProtobufError {
        match self {
            ProtobufError::Json { path, reason } => ProtobufError::Json {
                path: if path.is_empty() {
                    segment.to_string()
                } else {
                    format!("{segment}.{path}")
                },
                reason,
            },
            other => other,
        }
    }
}

/// Whether a stored value is kube-apiserver protobuf (auto-detection, as
/// kube-apiserver's recognizing decoder does).
pub fn is_protobuf(value: &[u8]) -> bool {
    value.starts_with(MAGIC)
}

/// Whether `apiVersion`/`kind` is a built-in Kubernetes type of the schema
/// (which [`encode`] can store as protobuf).
pub fn is_builtin_type(api_version: &str, kind: &str) -> bool {
    Schema::get().is_ok_and(|s| s.resolve(api_version, kind).is_some())
}

/// Decodes a `k8s\0` value into the JSON kube-apiserver serves for it
/// (`kind` and `apiVersion` first, from the envelope).
pub fn decode(value: &[u8]) -> Result<Value, ProtobufError> {
    decode_envelope(Schema::get()?, value, None, 0)
}

/// Like [`decode`], for values whose envelope carries no type (kube-apiserver
/// leaves it empty for a `WatchEvent`): `api_version`/`kind` name the type.
pub fn decode_as(value: &[u8], api_version: &str, kind: &str) -> Result<Value, ProtobufError> {
    decode_envelope(Schema::get()?, value, Some((api_version, kind)), 0)
}

/// Encodes an object (with `apiVersion` and `kind`) as kube-apiserver stores it.
pub fn encode(object: &Value) -> Result<Vec<u8>, ProtobufError> {
    let (api_version, kind) = type_of(object);
    encode_as(object, api_version, kind)
}

/// Like [`encode`], with the type given (for JSON without `apiVersion`/`kind`,
/// e.g. a `WatchEvent`); the envelope's `typeMeta` is the JSON's own.
pub fn encode_as(object: &Value, api_version: &str, kind: &str) -> Result<Vec<u8>, ProtobufError> {
    let schema = Schema::get()?;
    let desc = resolve(schema, api_version, kind)?;
    let message = encode_typed(schema, &desc, object.clone())?;
    let (tm_version, tm_kind) = type_of(object);
    wrap(schema, tm_version, tm_kind, &message)
}

/// The typed message of an object of type `api_version`/`kind`: what an
/// envelope's `raw` and a List's items carry (the JSON's own TypeMeta is not
/// part of it). Cached per object ([`crate::object::Object::protobuf_message`])
/// so that Gets and Lists do not re-encode.
pub fn encode_message(
    object: Value,
    api_version: &str,
    kind: &str,
) -> Result<Vec<u8>, ProtobufError> {
    let schema = Schema::get()?;
    let desc = resolve(schema, api_version, kind)?;
    encode_typed(schema, &desc, object)
}

/// `message` (a typed message of `api_version`/`kind`) as kube-apiserver
/// stores and serves it: `k8s\0` and the `runtime.Unknown` envelope.
pub fn wrap_message(
    api_version: &str,
    kind: &str,
    message: &[u8],
) -> Result<Vec<u8>, ProtobufError> {
    wrap(Schema::get()?, api_version, kind, message)
}

fn resolve(
    schema: &Schema,
    api_version: &str,
    kind: &str,
) -> Result<MessageDescriptor, ProtobufError> {
    schema
        .resolve(api_version, kind)
        .ok_or_else(|| ProtobufError::UnknownKind {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
        })
}

fn encode_typed(
    schema: &Schema,
    desc: &MessageDescriptor,
    mut body: Value,
) -> Result<Vec<u8>, ProtobufError> {
    if let Value::Object(map) = &mut body {
        // TypeMeta lives in the envelope, not in the typed message.
        for key in ["apiVersion", "kind"] {
            if desc.get_field_by_name(key).is_none() {
                map.remove(key);
            }
        }
    }
    Ok(json::json_to_message(schema, desc, &body)?.encode_to_vec())
}

fn wrap(
    schema: &Schema,
    api_version: &str,
    kind: &str,
    raw: &[u8],
) -> Result<Vec<u8>, ProtobufError> {
    let parts = EnvelopeParts::new(schema, api_version, kind)?;
    let mut out = Vec::with_capacity(parts.len(raw.len()));
    parts.head(raw.len(), &mut out);
    out.extend_from_slice(raw);
    out.extend_from_slice(&parts.tail);
    Ok(out)
}

/// The bytes of a `k8s\0` value around its `raw` message: `k8s\0` and the
/// `runtime.Unknown` fields before `raw` (`typeMeta`, then `raw`'s key and
/// length), and those after it (`contentEncoding` and `contentType`, empty).
/// Go writes fields in number order, so a value can be written as head, raw,
/// tail without building the envelope around a copy of `raw`.
struct EnvelopeParts {
    /// `k8s\0` and the encoded `typeMeta` field.
    type_meta: Vec<u8>,
    raw_field: u32,
    tail: Vec<u8>,
}

impl EnvelopeParts {
    fn new(schema: &Schema, api_version: &str, kind: &str) -> Result<EnvelopeParts, ProtobufError> {
        let missing = |name: &str| ProtobufError::Schema(format!("{name} missing"));
        let unknown = schema.message(UNKNOWN).ok_or_else(|| missing(UNKNOWN))?;
        let type_meta = schema
            .message(TYPE_META)
            .ok_or_else(|| missing(TYPE_META))?;
        let number = |name: &str| {
            unknown
                .get_field_by_name(name)
                .map(|f| f.number())
                .ok_or_else(|| missing(&format!("{UNKNOWN}.{name}")))
        };
        let (tm_field, raw_field) = (number("typeMeta")?, number("raw")?);
        let (ce_field, ct_field) = (number("contentEncoding")?, number("contentType")?);
        if !(tm_field < raw_field && raw_field < ce_field && ce_field < ct_field) {
            return Err(ProtobufError::Schema(format!(
                "{UNKNOWN}: fields not in the expected order"
            )));
        }
        let set = |m: &mut DynamicMessage, name: &str, v: PValue| {
            m.try_set_field_by_name(name, v)
                .map_err(|e| ProtobufError::Schema(e.to_string()))
        };
        let mut tm = DynamicMessage::new(type_meta);
        set(&mut tm, "apiVersion", PValue::String(api_version.into()))?;
        set(&mut tm, "kind", PValue::String(kind.into()))?;
        let mut head = DynamicMessage::new(unknown.clone());
        set(&mut head, "typeMeta", PValue::Message(tm))?;
        let mut tail = DynamicMessage::new(unknown);
        set(&mut tail, "contentEncoding", PValue::String(String::new()))?;
        set(&mut tail, "contentType", PValue::String(String::new()))?;
        let mut type_meta = MAGIC.to_vec();
        head.encode(&mut type_meta)
            .map_err(|e| ProtobufError::Schema(e.to_string()))?;
        Ok(EnvelopeParts {
            type_meta,
            raw_field,
            tail: tail.encode_to_vec(),
        })
    }

    /// Everything before a `raw` of `raw_len` bytes.
    fn head(&self, raw_len: usize, out: &mut impl BufMut) {
        out.put_slice(&self.type_meta);
        encoding::encode_key(self.raw_field, WireType::LengthDelimited, out);
        encoding::encode_varint(raw_len as u64, out);
    }

    /// The whole value's length for a `raw` of `raw_len` bytes.
    fn len(&self, raw_len: usize) -> usize {
        self.type_meta.len()
            + encoding::key_len(self.raw_field)
            + encoding::encoded_len_varint(raw_len as u64)
            + raw_len
            + self.tail.len()
    }
}

/// A `<Kind>List` in kube-apiserver's protobuf, written from its items'
/// typed messages ([`encode_message`]) as they are: the list's `metadata`
/// comes first and its `items` (the last field) after, so each item is its
/// key, its length and its bytes. Nothing is parsed or re-encoded per item.
pub struct ListEncoder {
    envelope: EnvelopeParts,
    /// The list message's `metadata` field, encoded.
    metadata: Vec<u8>,
    items_field: u32,
}

impl ListEncoder {
    /// For a list of `api_version`/`kind` objects with ListMeta `metadata`.
    pub fn new(
        api_version: &str,
        kind: &str,
        metadata: Value,
    ) -> Result<ListEncoder, ProtobufError> {
        let schema = Schema::get()?;
        let list_kind = format!("{kind}List");
        let desc = resolve(schema, api_version, &list_kind)?;
        let items_field = desc
            .get_field_by_name("items")
            .map(|f| f.number())
            .ok_or_else(|| ProtobufError::Schema(format!("{} has no items", desc.full_name())))?;
        if desc.fields().any(|f| f.number() > items_field) {
            return Err(ProtobufError::Schema(format!(
                "{}: items is not the last field",
                desc.full_name()
            )));
        }
        let metadata = encode_typed(schema, &desc, serde_json::json!({ "metadata": metadata }))?;
        Ok(ListEncoder {
            envelope: EnvelopeParts::new(schema, api_version, &list_kind)?,
            metadata,
            items_field,
        })
    }

    /// The bytes one item of `len` bytes takes in the list, itself included.
    pub fn item_len(&self, len: usize) -> usize {
        encoding::key_len(self.items_field) + encoding::encoded_len_varint(len as u64) + len
    }

    /// What precedes one item of `len` bytes: its key and length.
    pub fn item_prefix(&self, len: usize, out: &mut impl BufMut) {
        encoding::encode_key(self.items_field, WireType::LengthDelimited, out);
        encoding::encode_varint(len as u64, out);
    }

    /// Everything before the first item, for items taking `items_len` bytes
    /// in all (the sum of their [`ListEncoder::item_len`]).
    pub fn head(&self, items_len: usize, out: &mut impl BufMut) {
        self.envelope.head(self.metadata.len() + items_len, out);
        out.put_slice(&self.metadata);
    }

    /// Everything after the last item.
    pub fn tail(&self) -> &[u8] {
        &self.envelope.tail
    }
}

/// One event of a protobuf watch stream as kube-apiserver writes it: a bare
/// `meta.v1.WatchEvent` message, without the `k8s\0` envelope (its watch
/// stream uses protobuf's raw serializer; client-go decodes each frame as
/// the message itself), whose object is `object`, itself an encoded
/// `k8s\0` value.
pub fn encode_watch_event(event_type: &str, object: Vec<u8>) -> Result<Vec<u8>, ProtobufError> {
    let schema = Schema::get()?;
    let missing = |name: &str| ProtobufError::Schema(format!("{name} missing"));
    let event_desc = schema
        .message(WATCH_EVENT)
        .ok_or_else(|| missing(WATCH_EVENT))?;
    let raw_desc = schema
        .message(RAW_EXTENSION)
        .ok_or_else(|| missing(RAW_EXTENSION))?;
    let schema_error = |e: prost_reflect::SetFieldError| ProtobufError::Schema(e.to_string());
    let mut raw = DynamicMessage::new(raw_desc);
    raw.try_set_field_by_name("raw", PValue::Bytes(object.into()))
        .map_err(schema_error)?;
    let mut event = DynamicMessage::new(event_desc);
    event
        .try_set_field_by_name("type", PValue::String(event_type.into()))
        .map_err(schema_error)?;
    event
        .try_set_field_by_name("object", PValue::Message(raw))
        .map_err(schema_error)?;
    Ok(event.encode_to_vec())
}

/// Decodes one frame of a protobuf watch stream ([`encode_watch_event`]):
/// `{"type", "object"}`, the object decoded from its `k8s\0` value.
pub fn decode_watch_event(frame: &[u8]) -> Result<Value, ProtobufError> {
    let schema = Schema::get()?;
    let desc = schema
        .message(WATCH_EVENT)
        .ok_or_else(|| ProtobufError::Schema(format!("{WATCH_EVENT} missing")))?;
    let event = DynamicMessage::decode(desc, frame).map_err(|e| ProtobufError::Decode {
        message: WATCH_EVENT.to_string(),
        reason: e.to_string(),
    })?;
    json::message_to_json(schema, &event, 0)
}

fn type_of(object: &Value) -> (&str, &str) {
    let get = |k: &str| object.get(k).and_then(Value::as_str).unwrap_or("");
    (get("apiVersion"), get("kind"))
}

/// Decodes one `k8s\0` envelope; `embedding` counts enclosing envelopes.
fn decode_envelope(
    schema: &Schema,
    value: &[u8],
    type_hint: Option<(&str, &str)>,
    embedding: usize,
) -> Result<Value, ProtobufError> {
    decode_parts(schema, value, type_hint, embedding).map(|(json, _)| json)
}

/// [`decode_envelope`], also returning the typed message as stored.
fn decode_parts(
    schema: &Schema,
    value: &[u8],
    type_hint: Option<(&str, &str)>,
    embedding: usize,
) -> Result<(Value, StoredMessage), ProtobufError> {
    let body = value
        .strip_prefix(MAGIC)
        .ok_or(ProtobufError::NotProtobuf)?;
    let unknown = schema
        .message(UNKNOWN)
        .ok_or_else(|| ProtobufError::Schema(format!("{UNKNOWN} missing")))?;
    let env = DynamicMessage::decode(unknown, body)
        .map_err(|e| ProtobufError::Envelope(e.to_string()))?;
    let field_str = |m: &DynamicMessage, name: &str| match m.get_field_by_name(name).as_deref() {
        Some(PValue::String(s)) => s.clone(),
        _ => String::new(),
    };
    let (api_version, kind) = match env.get_field_by_name("typeMeta").as_deref() {
        Some(PValue::Message(tm)) => (field_str(tm, "apiVersion"), field_str(tm, "kind")),
        _ => (String::new(), String::new()),
    };
    let encoding = field_str(&env, "contentEncoding");
    if !encoding.is_empty() {
        return Err(ProtobufError::ContentEncoding(encoding));
    }
    let (lookup_version, lookup_kind) = match type_hint {
        Some((v, k)) if kind.is_empty() => (v, k),
        _ => (api_version.as_str(), kind.as_str()),
    };
    let desc =
        schema
            .resolve(lookup_version, lookup_kind)
            .ok_or_else(|| ProtobufError::UnknownKind {
                api_version: lookup_version.to_string(),
                kind: lookup_kind.to_string(),
            })?;
    let raw = match env.get_field_by_name("raw").as_deref() {
        Some(PValue::Bytes(b)) => b.clone(),
        _ => Default::default(),
    };
    let message =
        DynamicMessage::decode(desc.clone(), raw.clone()).map_err(|e| ProtobufError::Decode {
            message: desc.full_name().to_string(),
            reason: e.to_string(),
        })?;
    let body = json::message_to_json(schema, &message, embedding)?;
    let Value::Object(fields) = body else {
        return Err(ProtobufError::Decode {
            message: desc.full_name().to_string(),
            reason: "not an object type".into(),
        });
    };
    let mut out = serde_json::Map::with_capacity(fields.len() + 2);
    if !kind.is_empty() {
        out.insert("kind".into(), Value::String(kind.clone()));
    }
    if !api_version.is_empty() {
        out.insert("apiVersion".into(), Value::String(api_version.clone()));
    }
    out.extend(fields);
    let stored = StoredMessage {
        api_version,
        kind,
        desc,
        raw,
    };
    Ok((Value::Object(out), stored))
}

/// Decodes a stored `k8s\0` value like [`decode`], keeping the typed
/// message it carried: a cluster that stores protobuf already holds, in
/// etcd, the bytes its protobuf clients are served (but for
/// `metadata.resourceVersion`, see [`StoredMessage::at`]), so they need
/// not be encoded again from the JSON.
pub fn decode_stored(value: &[u8]) -> Result<(Value, StoredMessage), ProtobufError> {
    decode_parts(Schema::get()?, value, None, 0)
}

/// The typed message of a stored value ([`decode_stored`]).
#[derive(Debug, Clone)]
pub struct StoredMessage {
    api_version: String,
    kind: String,
    desc: MessageDescriptor,
    raw: Bytes,
}

impl StoredMessage {
    /// Whether the envelope named this type (kube-apiserver stores a
    /// resource at its storage version, which may differ from the one
    /// served).
    pub fn is(&self, api_version: &str, kind: &str) -> bool {
        self.api_version == api_version && self.kind == kind
    }

    /// The message as served at `resource_version`: kube-apiserver stores
    /// objects with `metadata.resourceVersion` empty and sets it from the
    /// key's revision on every read. Every other byte is the stored one;
    /// Go writes fields in number order, so for a value Go wrote this is
    /// byte for byte what [`encode_message`] makes of the decoded JSON with
    /// the same resourceVersion. `None` when the message has no single
    /// `metadata` (an `ObjectMeta`) to set it in.
    pub fn at(&self, resource_version: i64) -> Option<Bytes> {
        with_resource_version(&self.desc, &self.raw, resource_version).map(Bytes::from)
    }
}

/// `message`, a typed message of `api_version`/`kind`, with its
/// `metadata.resourceVersion` set to `resource_version` and every other byte
/// kept (as [`StoredMessage::at`]): a DELETED watch event carries the
/// deleted object at the deletion's revision. `Ok(None)` when the type has
/// no `ObjectMeta` or the message no single one.
pub fn message_at(
    message: &[u8],
    api_version: &str,
    kind: &str,
    resource_version: i64,
) -> Result<Option<Bytes>, ProtobufError> {
    let desc = resolve(Schema::get()?, api_version, kind)?;
    Ok(with_resource_version(&desc, message, resource_version).map(Bytes::from))
}

/// See [`StoredMessage::at`].
fn with_resource_version(
    desc: &MessageDescriptor,
    message: &[u8],
    resource_version: i64,
) -> Option<Vec<u8>> {
    let meta = desc.get_field_by_name("metadata")?;
    let prost_reflect::Kind::Message(meta_desc) = meta.kind() else {
        return None;
    };
    if meta_desc.full_name() != OBJECT_META || meta.is_list() {
        return None;
    }
    let rv_field = meta_desc.get_field_by_name("resourceVersion")?.number();
    let rv = resource_version.to_string();
    with_field_in(message, meta.number(), rv_field, rv.as_bytes())
}

/// One field of an encoded message: `[start, end)` with its key, the value
/// from `value_start` (after the length of a length-delimited field).
struct FieldSpan {
    number: u32,
    wire_type: WireType,
    start: usize,
    value_start: usize,
    end: usize,
}

/// The top-level fields of an encoded message, in the order written;
/// `None` if it is not valid protobuf.
fn field_spans(message: &[u8]) -> Option<Vec<FieldSpan>> {
    let mut buf = message;
    let offset = |buf: &[u8]| message.len() - buf.len();
    let mut spans = Vec::new();
    while !buf.is_empty() {
        let start = offset(buf);
        let (number, wire_type) = encoding::decode_key(&mut buf).ok()?;
        let value_start = if wire_type == WireType::LengthDelimited {
            let mut peek = buf;
            encoding::decode_varint(&mut peek).ok()?;
            offset(peek)
        } else {
            offset(buf)
        };
        encoding::skip_field(wire_type, number, &mut buf, Default::default()).ok()?;
        spans.push(FieldSpan {
            number,
            wire_type,
            start,
            value_start,
            end: offset(buf),
        });
    }
    Some(spans)
}

/// `message` with the string field `field` of its (single, length-delimited)
/// sub-message field `outer` set to `value`: written where Go writes it (before
/// the first field numbered above it), any earlier occurrence dropped, every
/// other byte kept. `None` if the message is not valid protobuf or `outer`
/// is absent or repeated.
fn with_field_in(message: &[u8], outer: u32, field: u32, value: &[u8]) -> Option<Vec<u8>> {
    let top = field_spans(message)?;
    let mut outers = top.iter().filter(|f| f.number == outer);
    let sub = outers.next()?;
    if outers.next().is_some() || sub.wire_type != WireType::LengthDelimited {
        return None;
    }
    let inner = &message[sub.value_start..sub.end];
    let fields = field_spans(inner)?;
    let mut new_inner = Vec::with_capacity(inner.len() + value.len() + 12);
    let put = |out: &mut Vec<u8>| {
        encoding::encode_key(field, WireType::LengthDelimited, out);
        encoding::encode_varint(value.len() as u64, out);
        out.extend_from_slice(value);
    };
    let mut written = false;
    for f in fields.iter().filter(|f| f.number != field) {
        if !written && f.number > field {
            put(&mut new_inner);
            written = true;
        }
        new_inner.extend_from_slice(&inner[f.start..f.end]);
    }
    if !written {
        put(&mut new_inner);
    }
    // Exactly sized: the result is kept for the object's life.
    let len = sub.start
        + encoding::key_len(outer)
        + encoding::encoded_len_varint(new_inner.len() as u64)
        + new_inner.len()
        + (message.len() - sub.end);
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&message[..sub.start]);
    encoding::encode_key(outer, WireType::LengthDelimited, &mut out);
    encoding::encode_varint(new_inner.len() as u64, &mut out);
    out.extend_from_slice(&new_inner);
    out.extend_from_slice(&message[sub.end..]);
    debug_assert_eq!(out.len(), len, "sized exactly");
    Some(out)
}

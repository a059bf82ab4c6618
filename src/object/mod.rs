//! The object layer: a JSON view of stored values (docs/DESIGN.md section 1, "object").
//!
//! Each etcd value is decoded ONCE at ingest by an [`ObjectCodec`] into an
//! immutable [`Object`] (shared as `Arc<Object>`): namespace and name come from
//! the etcd key, `uid`, labels, `creationTimestamp` and the configured index
//! fields are extracted, and the wire JSON (with `metadata.resourceVersion`
//! injected) is serialized once into [`Bytes`]. No `serde_json::Value` is kept,
//! so memory per cached object stays small.
//!
//! Values are JSON, or kube-apiserver's protobuf (`k8s\0` + `runtime.Unknown`,
//! decoded by [`protobuf`] to the JSON kube-apiserver would serve), detected
//! per value.
//!
//! Submodules: [`protobuf`] (the storage encoding of built-in types),
//! [`selector`] (label and field selectors), [`validation`]
//! (Kubernetes' RFC 1123 name rules) and [`wire`] (watch event lines,
//! bookmark lines, `Status`).
//!
//! The small JSON helpers at the bottom ([`metadata`], [`metadata_mut`],
//! [`metadata_str`], [`strip_resource_version`], [`set_resource_version`],
//! [`lookup_path`]) are for the REST API's write path.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde_json::{Map, Value};

pub mod conversion;
pub mod protobuf;
pub mod selector;
pub mod sharding;
pub mod validation;
pub mod wire;

use protobuf::ProtobufError;
pub use selector::{FieldSelector, LabelSelector, SelectorError};
pub use wire::{EventType, Status};

/// Field path of an object's name (always usable in field selectors).
pub const FIELD_NAME: &str = "metadata.name";
/// Field path of an object's namespace (always usable in field selectors).
pub const FIELD_NAMESPACE: &str = "metadata.namespace";

/// Why a stored key/value could not be turned into an [`Object`].
///
/// The cacher skips such values (counting them in a metric and logging once
/// per key, docs/DESIGN.md section 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectError {
    /// The etcd key does not have the shape `{prefix}{ns}/{name}` (namespaced)
    /// or `{prefix}{name}` (cluster-scoped).
    #[error("invalid key {key:?}: {reason}")]
    InvalidKey { key: String, reason: String },
    /// The value is not valid JSON.
    #[error("value at {key:?} is not valid JSON: {message}")]
    InvalidJson { key: String, message: String },
    /// The value is valid JSON but not a JSON object.
    #[error("value at {key:?} is not a JSON object")]
    NotJsonObject { key: String },
    /// `metadata` is present but is not a JSON object.
    #[error("value at {key:?}: metadata is not a JSON object")]
    InvalidMetadata { key: String },
    /// The value is kube-apiserver protobuf (`k8s\0...`) that cannot be read:
    /// corrupt, or a type outside the built-in Kubernetes schema.
    #[error("value at {key:?} is unreadable protobuf: {source}")]
    InvalidProtobuf {
        key: String,
        source: protobuf::ProtobufError,
    },
}

/// A stored value as JSON: kube-apiserver protobuf (`k8s\0` prefix) is
/// decoded to the JSON kube-apiserver serves; anything else is parsed as JSON.
/// Auto-detected per value, as kube-apiserver's storage decoder does.
pub fn parse_stored_value(key: &str, value: &[u8]) -> Result<Value, ObjectError> {
    if protobuf::is_protobuf(value) {
        return protobuf::decode(value).map_err(|source| ObjectError::InvalidProtobuf {
            key: key.to_string(),
            source,
        });
    }
    serde_json::from_slice(value).map_err(|e| ObjectError::InvalidJson {
        key: key.to_string(),
        message: e.to_string(),
    })
}

/// Per-resource codec: knows the key layout, the configured index paths and
/// the `apiVersion`/`kind` of the resource.
#[derive(Debug, Clone)]
pub struct ObjectCodec {
    key_prefix: String,
    namespaced: bool,
    index_paths: Vec<Arc<str>>,
    /// `index_paths` pre-split on '.', same order.
    index_segments: Vec<Vec<String>>,
    /// Shared: every watcher's bookmarks carry them.
    api_version: Arc<str>,
    kind: Arc<str>,
}

impl ObjectCodec {
    /// Builds the codec of one resource (`ResourceConfig::object_codec`
    /// builds it from the config): objects under `key_prefix` (ending in
    /// '/'), with the field paths `indexes` extracted at ingest.
    pub fn new(
        key_prefix: String,
        namespaced: bool,
        indexes: &[String],
        api_version: &str,
        kind: &str,
    ) -> ObjectCodec {
        let mut index_paths: Vec<Arc<str>> = Vec::with_capacity(indexes.len());
        for p in indexes {
            // Duplicates and the always-present metadata paths add nothing.
            if p == FIELD_NAME || p == FIELD_NAMESPACE || index_paths.iter().any(|q| **q == **p) {
                continue;
            }
            index_paths.push(Arc::from(p.as_str()));
        }
        let index_segments = index_paths
            .iter()
            .map(|p| p.split('.').map(str::to_string).collect())
            .collect();
        ObjectCodec {
            key_prefix,
            namespaced,
            index_paths,
            index_segments,
            api_version: api_version.into(),
            kind: kind.into(),
        }
    }

    /// The resource's etcd key prefix; always ends with '/'.
    pub fn key_prefix(&self) -> &str {
        &self.key_prefix
    }

    /// Whether objects of this resource live in namespaces.
    pub fn is_namespaced(&self) -> bool {
        self.namespaced
    }

    /// The etcd key of an object: `{prefix}{ns}/{name}` for a namespaced
    /// resource, `{prefix}{name}` for a cluster-scoped one (where `namespace`
    /// is ignored). For a namespaced resource called with `None` the result is
    /// `{prefix}{name}`, which [`ObjectCodec::decode`] rejects: callers must
    /// pass the namespace.
    pub fn key(&self, namespace: Option<&str>, name: &str) -> String {
        match namespace {
            Some(ns) if self.namespaced => {
                let mut k =
                    String::with_capacity(self.key_prefix.len() + ns.len() + 1 + name.len());
                k.push_str(&self.key_prefix);
                k.push_str(ns);
                k.push('/');
                k.push_str(name);
                k
            }
            _ => format!("{}{}", self.key_prefix, name),
        }
    }

    /// `{key_prefix}{ns}/`: the prefix of every key in one namespace.
    pub fn namespace_prefix(&self, namespace: &str) -> String {
        format!("{}{}/", self.key_prefix, namespace)
    }

    /// The configured index paths (e.g. `spec.nodeName`), without
    /// `metadata.name`/`metadata.namespace`, deduplicated, in config order.
    pub fn index_paths(&self) -> &[Arc<str>] {
        &self.index_paths
    }

    /// `apiVersion` of the resource (`v1`, `apps/v1`).
    pub fn api_version(&self) -> &Arc<str> {
        &self.api_version
    }

    /// `kind` of the resource (`Pod`).
    pub fn kind(&self) -> &Arc<str> {
        &self.kind
    }

    /// Splits a key into `(namespace, name)`; namespace is `None` for a
    /// cluster-scoped resource. Names and namespaces must be non-empty and
    /// contain no '/'.
    pub fn parse_key<'k>(&self, key: &'k str) -> Result<(Option<&'k str>, &'k str), ObjectError> {
        let bad = |reason: &str| ObjectError::InvalidKey {
            key: key.to_string(),
            reason: reason.to_string(),
        };
        let rest = key
            .strip_prefix(self.key_prefix.as_str())
            .ok_or_else(|| bad(&format!("not under prefix {:?}", self.key_prefix)))?;
        if self.namespaced {
            let (ns, name) = rest
                .split_once('/')
                .ok_or_else(|| bad("want {prefix}{namespace}/{name}"))?;
            if ns.is_empty() {
                return Err(bad("empty namespace"));
            }
            if name.is_empty() {
                return Err(bad("empty name"));
            }
            if name.contains('/') {
                return Err(bad("name contains '/'"));
            }
            Ok((Some(ns), name))
        } else {
            if rest.is_empty() {
                return Err(bad("empty name"));
            }
            if rest.contains('/') {
                return Err(bad("name contains '/' (resource is cluster-scoped)"));
            }
            Ok((None, rest))
        }
    }

    /// Decodes one stored value. See the module docs; `mod_revision` becomes
    /// `metadata.resourceVersion` in [`Object::wire`].
    pub fn decode(
        &self,
        key: &str,
        value: &[u8],
        mod_revision: i64,
        create_revision: i64,
    ) -> Result<Object, ObjectError> {
        let (namespace, name) = self.parse_key(key)?;
        let (mut root, stored) = if protobuf::is_protobuf(value) {
            let (json, stored) =
                protobuf::decode_stored(value).map_err(|source| ObjectError::InvalidProtobuf {
                    key: key.to_string(),
                    source,
                })?;
            (json, Some(stored))
        } else {
            (parse_stored_value(key, value)?, None)
        };
        let Some(obj) = root.as_object() else {
            return Err(ObjectError::NotJsonObject {
                key: key.to_string(),
            });
        };

        let mut uid = None;
        let mut labels = BTreeMap::new();
        let mut creation_timestamp = None;
        match obj.get("metadata") {
            None | Some(Value::Null) => {}
            Some(Value::Object(meta)) => {
                uid = meta.get("uid").and_then(Value::as_str).map(Arc::from);
                creation_timestamp = meta
                    .get("creationTimestamp")
                    .and_then(Value::as_str)
                    .map(Arc::from);
                if let Some(Value::Object(l)) = meta.get("labels") {
                    for (k, v) in l {
                        if let Value::String(s) = v {
                            labels.insert(k.clone(), s.clone());
                        }
                    }
                }
            }
            Some(_) => {
                return Err(ObjectError::InvalidMetadata {
                    key: key.to_string(),
                });
            }
        }

        let mut fields = Vec::with_capacity(self.index_paths.len());
        for (path, segs) in self.index_paths.iter().zip(&self.index_segments) {
            if let Some(v) = lookup_segments(&root, segs).and_then(field_string) {
                fields.push((Arc::clone(path), v));
            }
        }

        set_resource_version(&mut root, mod_revision);
        let mut wire = serde_json::to_vec(&root).map_err(|e| ObjectError::InvalidJson {
            key: key.to_string(),
            message: e.to_string(),
        })?;
        // The cache keeps this for the object's life: serde_json grows the
        // vector by doubling, so without this up to half of it is unused
        // capacity (docs/BENCHMARKS.md, "Against kube-apiserver", K3).
        wire.shrink_to_fit();

        Ok(Object {
            key: Arc::from(key),
            namespace: namespace.map(Arc::from),
            name: Arc::from(name),
            uid,
            labels,
            fields,
            creation_timestamp,
            mod_revision,
            create_revision,
            wire: Bytes::from(wire),
            // The stored message is what protobuf clients are served: keep
            // it rather than encode it again from the JSON on their first
            // read (a resource stored at another version is encoded then).
            protobuf: ProtobufCache::from(
                stored
                    .filter(|s| s.is(&self.api_version, &self.kind))
                    .and_then(|s| s.at(mod_revision)),
            ),
        })
    }
}

/// One decoded stored object. Immutable; shared as `Arc<Object>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    /// The etcd key.
    pub key: Arc<str>,
    /// From the key; `None` for cluster-scoped resources.
    pub namespace: Option<Arc<str>>,
    /// From the key.
    pub name: Arc<str>,
    /// `metadata.uid` when it is a string.
    pub uid: Option<Arc<str>>,
    /// `metadata.labels`; entries whose value is not a string are ignored.
    pub labels: BTreeMap<String, String>,
    /// Configured index path -> value, for the paths present in the object
    /// (strings as-is, numbers and booleans stringified; missing, null,
    /// objects and arrays are absent). Use [`Object::field`] to read with
    /// Kubernetes semantics (absent = "").
    pub fields: Vec<(Arc<str>, String)>,
    /// `metadata.creationTimestamp` when it is a string.
    pub creation_timestamp: Option<Arc<str>>,
    pub mod_revision: i64,
    pub create_revision: i64,
    /// The object's JSON with `metadata.resourceVersion` = `mod_revision`.
    pub wire: Bytes,
    /// The same object's typed protobuf message, encoded on the first
    /// protobuf read ([`Object::protobuf_message`]).
    pub protobuf: ProtobufCache,
}

/// An object's protobuf message once it has been encoded (boxed: 16 bytes
/// per object that no protobuf client reads), or as it was stored when etcd
/// holds protobuf. The same object as [`Object::wire`], so it never makes
/// two objects differ; an object that does not fit its type's schema is not
/// cached (and fails every time). A clone starts empty: the cloned object
/// may be given another `wire`.
#[derive(Debug, Default)]
pub struct ProtobufCache(OnceLock<Box<Bytes>>);

impl From<Option<Bytes>> for ProtobufCache {
    fn from(message: Option<Bytes>) -> ProtobufCache {
        let cache = ProtobufCache::default();
        if let Some(m) = message {
            let _ = cache.0.set(Box::new(m));
        }
        cache
    }
}

impl ProtobufCache {
    /// Whether the message is held (encoded or as stored).
    pub fn is_filled(&self) -> bool {
        self.0.get().is_some()
    }

    /// The message, if held.
    pub fn get(&self) -> Option<&Bytes> {
        self.0.get().map(|b| &**b)
    }

    /// Asks the CPU to fetch the message's handle (a large List reads it a
    /// few items later: a cache miss per object otherwise).
    #[inline]
    pub fn prefetch(&self) {
        if let Some(b) = self.0.get() {
            crate::prefetch::prefetch(&**b as *const Bytes);
        }
    }
}

impl Clone for ProtobufCache {
    fn clone(&self) -> ProtobufCache {
        ProtobufCache::default()
    }
}

impl PartialEq for ProtobufCache {
    fn eq(&self, _: &ProtobufCache) -> bool {
        true
    }
}

impl Eq for ProtobufCache {}

impl Object {
    /// The value of a field-selector path:
    ///
    /// - `metadata.name` -> the name;
    /// - `metadata.namespace` -> the namespace, `""` for cluster-scoped objects;
    /// - any other path -> its value in [`Object::fields`], or `Some("")` when
    ///   the object lacks it: like Kubernetes, a missing field reads as the
    ///   empty string (so `spec.nodeName=` selects unscheduled pods).
    ///
    /// The object does not know which paths its codec indexes; callers check
    /// paths against [`ObjectCodec::index_paths`] ([`FieldSelector::parse`]
    /// does). Returns `None` only for a path that is not a valid dotted field
    /// path (empty or with empty segments). The cacher should index with
    /// this method (not `fields` directly) so that absent fields index as "".
    pub fn field(&self, path: &str) -> Option<&str> {
        match path {
            FIELD_NAME => Some(&self.name),
            FIELD_NAMESPACE => Some(self.namespace.as_deref().unwrap_or("")),
            _ => {
                if let Some((_, v)) = self.fields.iter().find(|(p, _)| **p == *path) {
                    return Some(v);
                }
                if path.is_empty() || path.split('.').any(str::is_empty) {
                    None
                } else {
                    Some("")
                }
            }
        }
    }

    /// The object as a typed protobuf message of `api_version`/`kind` (its
    /// resource's type): what a protobuf Get wraps and a protobuf List
    /// carries per item. Taken from the stored value when etcd holds this
    /// type's protobuf, else encoded from [`Object::wire`] once; Gets and
    /// Lists after the first share the bytes.
    pub fn protobuf_message(&self, api_version: &str, kind: &str) -> Result<Bytes, ProtobufError> {
        self.protobuf_message_ref(api_version, kind).cloned()
    }

    /// [`Object::protobuf_message`] without taking a reference on the bytes
    /// (a List holds its objects).
    pub fn protobuf_message_ref(
        &self,
        api_version: &str,
        kind: &str,
    ) -> Result<&Bytes, ProtobufError> {
        if let Some(b) = self.protobuf.0.get() {
            return Ok(b);
        }
        let value: Value = serde_json::from_slice(&self.wire).map_err(|e| ProtobufError::Json {
            path: String::new(),
            reason: format!("cached object is not JSON: {e}"),
        })?;
        let message = Bytes::from(protobuf::encode_message(value, api_version, kind)?);
        Ok(self.protobuf.0.get_or_init(|| Box::new(message)))
    }

    /// [`Object::protobuf_message`] at `resource_version` (DELETED events
    /// carry the deleted object at the deletion's revision): the cached
    /// message with its resourceVersion replaced, or, for a message that has
    /// no `ObjectMeta` to replace it in, [`Object::wire_at`] encoded.
    pub fn protobuf_message_at(
        &self,
        api_version: &str,
        kind: &str,
        resource_version: i64,
    ) -> Result<Bytes, ProtobufError> {
        let message = self.protobuf_message_ref(api_version, kind)?;
        if resource_version == self.mod_revision {
            return Ok(message.clone());
        }
        if let Some(m) = protobuf::message_at(message, api_version, kind, resource_version)? {
            return Ok(m);
        }
        let value: Value =
            serde_json::from_slice(&self.wire_at(resource_version)).map_err(|e| {
                ProtobufError::Json {
                    path: String::new(),
                    reason: format!("cached object is not JSON: {e}"),
                }
            })?;
        protobuf::encode_message(value, api_version, kind).map(Bytes::from)
    }

    /// `metadata.resourceVersion` as carried by [`Object::wire`].
    pub fn resource_version(&self) -> i64 {
        self.mod_revision
    }

    /// The same JSON as [`Object::wire`] with `metadata.resourceVersion` set to
    /// `resource_version` (DELETED events carry the deleted object at the
    /// deletion revision). Re-renders from `wire`; returns `wire` itself
    /// when `resource_version == mod_revision`.
    pub fn wire_at(&self, resource_version: i64) -> Bytes {
        if resource_version == self.mod_revision {
            return self.wire.clone();
        }
        // `wire` was produced by serde_json from a JSON object, so this parse
        // succeeds; if it ever did not, the original bytes are the best answer.
        let Ok(mut v) = serde_json::from_slice::<Value>(&self.wire) else {
            return self.wire.clone();
        };
        set_resource_version(&mut v, resource_version);
        match serde_json::to_vec(&v) {
            Ok(mut b) => {
                // Kept in the history with its event, as `wire` is kept.
                b.shrink_to_fit();
                Bytes::from(b)
            }
            Err(_) => self.wire.clone(),
        }
    }
}

// ---------------------------------------------------------------------------
// JSON helpers (ingest and the REST API's write path)

/// `metadata` of an object, if `value` is an object with an object `metadata`.
pub fn metadata(value: &Value) -> Option<&Map<String, Value>> {
    value.get("metadata")?.as_object()
}

/// Mutable `metadata` of an object, created (as `{}`) when missing or null.
/// `None` when `value` is not a JSON object or `metadata` is not an object.
pub fn metadata_mut(value: &mut Value) -> Option<&mut Map<String, Value>> {
    let obj = value.as_object_mut()?;
    let meta = obj
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if meta.is_null() {
        *meta = Value::Object(Map::new());
    }
    meta.as_object_mut()
}

/// A string field of `metadata` (`name`, `namespace`, `uid`,
/// `resourceVersion`, `generateName`, ...); `None` when missing or not a string.
pub fn metadata_str<'a>(value: &'a Value, field: &str) -> Option<&'a str> {
    metadata(value)?.get(field)?.as_str()
}

/// Removes `metadata.resourceVersion` (it is never stored in etcd: it is the
/// key's mod_revision, injected on read). No-op when absent or when `value`
/// is not an object.
pub fn strip_resource_version(value: &mut Value) {
    if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
    }
}

/// Sets `metadata.resourceVersion` to `rv` as a string, creating `metadata`
/// when missing. Returns false (and changes nothing) when `value` is not an
/// object or `metadata` is not an object.
pub fn set_resource_version(value: &mut Value, rv: i64) -> bool {
    match metadata_mut(value) {
        Some(meta) => {
            meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
            true
        }
        None => false,
    }
}

/// The value at a dotted path (`spec.nodeName`) inside nested objects.
pub fn lookup_path<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(value, |v, seg| v.as_object()?.get(seg))
}

fn lookup_segments<'a>(value: &'a Value, segs: &[String]) -> Option<&'a Value> {
    segs.iter()
        .try_fold(value, |v, seg| v.as_object()?.get(seg.as_str()))
}

/// A field value as a selector string: strings as-is, numbers and booleans
/// stringified; null, objects and arrays have none.
pub fn field_string(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

/// Go's `%q` of `s` (strconv.Quote, printable characters kept) for the
/// texts kube-apiserver prints.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
pub(crate) mod tests;

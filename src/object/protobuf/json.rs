//! The JSON mapping of Kubernetes protobuf messages, generic over the schema:
//! what Go's `encoding/json` writes for the Go types the messages were
//! generated from. Field names are the proto names (go-to-protobuf names
//! fields after their JSON tags); int32/int64 are JSON numbers; bytes are
//! base64; map fields are JSON objects; slice wrappers (`ExtraValue`,
//! `Verbs`, ...) are bare lists. A handful of apimachinery types have their
//! own Go JSON marshalers and are mapped as Go maps them: `Time`,
//! `MicroTime`, `Duration`, `Quantity`, `IntOrString`, `RawExtension`,
//! `FieldsV1`, `GroupVersion`, and apiextensions' `JSON` and
//! `JSONSchemaPropsOr{Bool,Array,StringArray}` (CRD schemas).
//!
//! Encoding sets the fields present in the JSON, in any order: prost-reflect
//! writes them in tag order, map entries in key order (maps are lists of
//! entries here, see [`Schema::load`](super::schema)), and the special types
//! set every field Go's marshalers write even when zero, so the bytes equal
//! Go's for objects as kube-apiserver serves them.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, SecondsFormat, Utc};
use prost_reflect::{
    DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, ReflectMessage as _, Value as PValue,
};
use serde_json::{Map, Number, Value};

use super::ProtobufError;
use super::schema::{JsonKey, Schema};

const TIME: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.Time";
const MICRO_TIME: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime";
const DURATION: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.Duration";
const FIELDS_V1: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1";
const GROUP_VERSION: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.GroupVersion";
const QUANTITY: &str = "k8s.io.apimachinery.pkg.api.resource.Quantity";
const QUANTITY_VALUE: &str = "k8s.io.apimachinery.pkg.api.resource.QuantityValue";
const INT_OR_STRING: &str = "k8s.io.apimachinery.pkg.util.intstr.IntOrString";
const RAW_EXTENSION: &str = "k8s.io.apimachinery.pkg.runtime.RawExtension";
/// Package prefix of the apiextensions.k8s.io (CustomResourceDefinition) types.
const APIEXTENSIONS_PACKAGE: &str = "k8s.io.apiextensions_apiserver.";

/// Nesting limit for objects embedded in objects (`RawExtension` holding
/// another `k8s\0` value).
pub(super) const MAX_EMBEDDING: usize = 8;

// ---------------------------------------------------------------- decoding

/// A decoded message -> its JSON. `embedding` counts enclosing envelopes.
pub(super) fn message_to_json(
    schema: &Schema,
    message: &DynamicMessage,
    embedding: usize,
) -> Result<Value, ProtobufError> {
    let desc = message.descriptor();
    match desc.full_name() {
        TIME => return Ok(time_to_json(message, SecondsFormat::Secs)),
        MICRO_TIME => return Ok(time_to_json(message, SecondsFormat::Micros)),
        DURATION => {
            let nanos = get_i64(message, "duration");
            return Ok(Value::String(super::duration::format(nanos)));
        }
        QUANTITY | QUANTITY_VALUE => {
            let s = get_str(message, "string");
            // A zero Quantity marshals as "0" in Go.
            return Ok(Value::String(if s.is_empty() { "0".into() } else { s }));
        }
        INT_OR_STRING => {
            return Ok(if get_i64(message, "type") == 1 {
                Value::String(get_str(message, "strVal"))
            } else {
                Value::from(get_i64(message, "intVal"))
            });
        }
        RAW_EXTENSION => return raw_json(schema, &get_bytes(message, "raw"), embedding),
        FIELDS_V1 => return raw_json(schema, &get_bytes(message, "Raw"), embedding),
        GROUP_VERSION => {
            let (g, v) = (get_str(message, "group"), get_str(message, "version"));
            return Ok(Value::String(if g.is_empty() {
                v
            } else {
                format!("{g}/{v}")
            }));
        }
        _ => {}
    }
    if let Some(name) = apiextensions_type(&desc) {
        return apiextensions_to_json(schema, name, message, embedding);
    }
    if schema.is_slice_wrapper(&desc) {
        return Ok(match message.fields().next() {
            Some((field, value)) => field_to_json(schema, &field, value, embedding)?,
            None => Value::Array(Vec::new()),
        });
    }
    let mut out = Map::new();
    fields_to_json(schema, message, embedding, &mut out)?;
    Ok(Value::Object(out))
}

/// A message's fields into a JSON object, as Go's `encoding/json` writes the
/// struct: JSON names from the tags, embedded structs inlined, zero values of
/// non-pointer `omitempty` fields left out.
fn fields_to_json(
    schema: &Schema,
    message: &DynamicMessage,
    embedding: usize,
    out: &mut Map<String, Value>,
) -> Result<(), ProtobufError> {
    // Fields absent from the bytes that Go writes all the same.
    for field in message.descriptor().fields() {
        if message.has_field(&field) {
            continue;
        }
        let tag = schema.field_tag(&field);
        let name = match tag {
            Some(t) if t.inline => continue,
            Some(t) => match &t.json_name {
                Some(n) => n.as_str(),
                None => continue,
            },
            None => field.name(),
        };
        let (keep, pointer) = tag.map_or((false, false), |t| (t.keep, t.pointer));
        let struct_desc = match field.kind() {
            Kind::Message(d) if !field.is_list() && !field.is_map() => Some(d),
            _ => None,
        };
        let nil_able = field.is_list()
            || field.is_map()
            || pointer
            || field.kind() == Kind::Bytes
            || struct_desc
                .as_ref()
                .is_some_and(|d| schema.is_slice_wrapper(d));
        if nil_able {
            // Without omitempty a nil slice, map or pointer is written as
            // null (an aggregated ClusterRole's `"rules": null`).
            if keep {
                out.insert(name.to_string(), Value::Null);
            }
        } else if let Some(desc) = struct_desc
            && !tag.is_some_and(|t| t.omitzero)
        {
            // A non-pointer struct is written even when zero (omitempty
            // never omits a struct); Go's own bytes always hold it, so it is
            // absent only from an older release's bytes, as a field added
            // since (1.34's CSINode read by 1.37: `"status": {}`).
            let zero = match go_zero_json(schema, &desc) {
                Value::Object(_) => message_to_json(schema, &DynamicMessage::new(desc), embedding)?,
                v => v,
            };
            out.insert(name.to_string(), zero);
        }
    }
    for (field, value) in message.fields() {
        let tag = schema.field_tag(&field);
        if let Some(tag) = tag
            && tag.inline
        {
            if let PValue::Message(inner) = value {
                fields_to_json(schema, inner, embedding, out)?;
            }
            continue;
        }
        let name = match tag {
            Some(t) => match &t.json_name {
                Some(n) => n.as_str(),
                None => continue,
            },
            None => field.name(),
        };
        let zero_is_written = tag.is_some_and(|t| t.keep || t.pointer);
        if !zero_is_written && is_zero_scalar(value) {
            continue;
        }
        if tag.is_some_and(|t| t.omitzero)
            && let PValue::Message(m) = value
            && m.fields().next().is_none()
        {
            continue;
        }
        out.insert(
            name.to_string(),
            field_to_json(schema, &field, value, embedding)?,
        );
    }
    Ok(())
}

/// The apiextensions.k8s.io types with their own Go JSON marshalers (CRD
/// schemas: `JSON`, `JSONSchemaPropsOr{Bool,Array,StringArray}`), by name.
fn apiextensions_type(desc: &MessageDescriptor) -> Option<&str> {
    const NAMES: [&str; 4] = [
        "JSON",
        "JSONSchemaPropsOrBool",
        "JSONSchemaPropsOrArray",
        "JSONSchemaPropsOrStringArray",
    ];
    (desc.package_name().starts_with(APIEXTENSIONS_PACKAGE) && NAMES.contains(&desc.name()))
        .then(|| desc.name())
}

/// Go's `MarshalJSON` of the [`apiextensions_type`]s.
fn apiextensions_to_json(
    schema: &Schema,
    name: &str,
    message: &DynamicMessage,
    embedding: usize,
) -> Result<Value, ProtobufError> {
    let sub_schema = || -> Result<Option<Value>, ProtobufError> {
        match message.get_field_by_name("schema").as_deref() {
            Some(PValue::Message(m)) if message.has_field_by_name("schema") => {
                message_to_json(schema, m, embedding).map(Some)
            }
            _ => Ok(None),
        }
    };
    let list = |field: &str| -> Result<Option<Value>, ProtobufError> {
        match message.get_field_by_name(field).as_deref() {
            Some(PValue::List(items)) if !items.is_empty() => items
                .iter()
                .map(|v| single_to_json(schema, v, embedding))
                .collect::<Result<Vec<_>, _>>()
                .map(|v| Some(Value::Array(v))),
            _ => Ok(None),
        }
    };
    Ok(match name {
        "JSON" => raw_json(schema, &get_bytes(message, "raw"), embedding)?,
        "JSONSchemaPropsOrBool" => match sub_schema()? {
            Some(v) => v,
            None => Value::Bool(matches!(
                message.get_field_by_name("allows").as_deref(),
                Some(PValue::Bool(true))
            )),
        },
        "JSONSchemaPropsOrArray" => match list("jSONSchemas")? {
            Some(v) => v,
            None => sub_schema()?.unwrap_or(Value::Null),
        },
        _ => match list("property")? {
            Some(v) => v,
            None => sub_schema()?.unwrap_or(Value::Null),
        },
    })
}

/// JSON -> one of the [`apiextensions_type`]s, as Go's `UnmarshalJSON` reads it.
fn apiextensions_from_json(
    schema: &Schema,
    name: &str,
    message: &mut DynamicMessage,
    json: &Value,
) -> Result<(), ProtobufError> {
    let desc = message.descriptor();
    let field = |n: &str| {
        desc.get_field_by_name(n)
            .ok_or_else(|| ProtobufError::Schema(format!("{}.{n} missing", desc.full_name())))
    };
    match (name, json) {
        (_, Value::Null) => {}
        ("JSON", v) => {
            let raw = serde_json::to_vec(v).map_err(|e| json_error(e.to_string()))?;
            set(message, "raw", PValue::Bytes(raw.into()))?;
        }
        ("JSONSchemaPropsOrBool", Value::Bool(b)) => set(message, "allows", PValue::Bool(*b))?,
        ("JSONSchemaPropsOrBool", Value::Object(_)) => {
            set(message, "allows", PValue::Bool(true))?;
            let f = field("schema")?;
            message.set_field(&f, single_value(schema, &f.kind(), json)?);
        }
        ("JSONSchemaPropsOrArray", Value::Array(_)) => {
            let f = field("jSONSchemas")?;
            message.set_field(&f, list_to_value(schema, &f, json)?);
        }
        ("JSONSchemaPropsOrStringArray", Value::Array(_)) => {
            let f = field("property")?;
            message.set_field(&f, list_to_value(schema, &f, json)?);
        }
        ("JSONSchemaPropsOrArray" | "JSONSchemaPropsOrStringArray", Value::Object(_)) => {
            let f = field("schema")?;
            message.set_field(&f, single_value(schema, &f.kind(), json)?);
        }
        (_, other) => {
            return Err(json_error(format!(
                "{name}: unexpected {}",
                type_name(other)
            )));
        }
    }
    Ok(())
}

fn field_to_json(
    schema: &Schema,
    field: &FieldDescriptor,
    value: &PValue,
    embedding: usize,
) -> Result<Value, ProtobufError> {
    if let (PValue::List(items), Kind::Message(entry)) = (value, field.kind())
        && schema.is_map_entry(&entry)
    {
        let mut map = Map::new();
        for item in items {
            let PValue::Message(m) = item else { continue };
            let key = match m.get_field_by_number(1).as_deref() {
                Some(PValue::String(s)) => s.clone(),
                Some(other) => scalar_to_json(other)?.to_string(),
                None => String::new(),
            };
            let value = match m.get_field_by_number(2) {
                Some(v) => single_to_json(schema, &v, embedding)?,
                None => Value::Null,
            };
            map.insert(key, value);
        }
        return Ok(Value::Object(map));
    }
    match value {
        PValue::List(items) => items
            .iter()
            .map(|v| single_to_json(schema, v, embedding))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        v => single_to_json(schema, v, embedding),
    }
}

fn single_to_json(
    schema: &Schema,
    value: &PValue,
    embedding: usize,
) -> Result<Value, ProtobufError> {
    match value {
        PValue::Message(m) => message_to_json(schema, m, embedding),
        v => scalar_to_json(v),
    }
}

fn scalar_to_json(value: &PValue) -> Result<Value, ProtobufError> {
    Ok(match value {
        PValue::Bool(b) => Value::Bool(*b),
        PValue::I32(n) => Value::from(*n),
        PValue::I64(n) => Value::from(*n),
        PValue::U32(n) => Value::from(*n),
        PValue::U64(n) => Value::from(*n),
        PValue::F32(f) => float(f64::from(*f))?,
        PValue::F64(f) => float(*f)?,
        PValue::String(s) => Value::String(s.clone()),
        PValue::Bytes(b) => Value::String(BASE64.encode(b)),
        PValue::EnumNumber(n) => Value::from(*n),
        PValue::Message(_) | PValue::List(_) | PValue::Map(_) => {
            return Err(ProtobufError::Decode {
                message: String::new(),
                reason: "unexpected nested value".into(),
            });
        }
    })
}

/// A double as Go's encoding/json writes it: a whole number without a
/// fraction (`65535`, not serde's `65535.0`), so a CRD's `maximum: 65535`
/// is served as kube-apiserver serves it.
fn float(f: f64) -> Result<Value, ProtobufError> {
    // Below 2^53 every whole double is exact as an i64; -0.0 keeps its sign.
    if f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 && (f != 0.0 || f.is_sign_positive()) {
        return Ok(Value::from(f as i64));
    }
    Number::from_f64(f)
        .map(Value::Number)
        .ok_or_else(|| ProtobufError::Decode {
            message: String::new(),
            reason: format!("{f} has no JSON form"),
        })
}

fn is_zero_scalar(value: &PValue) -> bool {
    match value {
        PValue::Bool(b) => !b,
        PValue::I32(n) => *n == 0,
        PValue::I64(n) => *n == 0,
        PValue::U32(n) => *n == 0,
        PValue::U64(n) => *n == 0,
        PValue::F32(f) => *f == 0.0,
        PValue::F64(f) => *f == 0.0,
        PValue::String(s) => s.is_empty(),
        PValue::Bytes(b) => b.is_empty(),
        PValue::EnumNumber(n) => *n == 0,
        PValue::Message(_) | PValue::List(_) | PValue::Map(_) => false,
    }
}

/// `Time` / `MicroTime`: Go marshals the zero time (an empty message) as null,
/// any other as RFC 3339 in UTC (seconds, or 6 fractional digits).
fn time_to_json(message: &DynamicMessage, format: SecondsFormat) -> Value {
    let seconds = get_i64(message, "seconds");
    let nanos = get_i64(message, "nanos");
    if seconds == 0 && nanos == 0 && message.fields().next().is_none() {
        return Value::Null;
    }
    // Go's zero time.Time, 0001-01-01T00:00:00Z, is null too.
    const GO_ZERO_UNIX: i64 = -62_135_596_800;
    if seconds == GO_ZERO_UNIX && nanos == 0 {
        return Value::Null;
    }
    let nanos = u32::try_from(nanos.clamp(0, 999_999_999)).unwrap_or(0);
    go_rfc3339(seconds, nanos, format).map_or(Value::Null, Value::String)
}

/// RFC 3339 in UTC as Go's `Time.AppendFormat` writes it: chrono truncates
/// to the digits asked for, as Go does, but writes a year past 9999 with a
/// `+` that Go does not (`10000-01-01T...`). Go's parser refuses such a
/// year, and so does ours: a client can read it, not write it back, as with
/// kube-apiserver.
fn go_rfc3339(seconds: i64, nanos: u32, format: SecondsFormat) -> Option<String> {
    let t = DateTime::<Utc>::from_timestamp(seconds, nanos)?;
    let mut text = t.to_rfc3339_opts(format, true);
    if text.starts_with('+') {
        text.remove(0);
    }
    Some(text)
}

/// Embedded JSON (`RawExtension.raw`, `FieldsV1.Raw`), or an embedded
/// protobuf object (`k8s\0...`), or null when empty.
fn raw_json(schema: &Schema, raw: &[u8], embedding: usize) -> Result<Value, ProtobufError> {
    if raw.is_empty() {
        return Ok(Value::Null);
    }
    if raw.starts_with(super::MAGIC) {
        if embedding >= MAX_EMBEDDING {
            return Err(ProtobufError::TooDeep(MAX_EMBEDDING));
        }
        return super::decode_envelope(schema, raw, None, embedding + 1);
    }
    serde_json::from_slice(raw).map_err(|e| ProtobufError::Decode {
        message: RAW_EXTENSION.into(),
        reason: format!("embedded value is neither JSON nor protobuf: {e}"),
    })
}

fn get_i64(message: &DynamicMessage, name: &str) -> i64 {
    match message.get_field_by_name(name).as_deref() {
        Some(PValue::I64(n)) => *n,
        Some(PValue::I32(n)) => i64::from(*n),
        Some(PValue::U32(n)) => i64::from(*n),
        Some(PValue::U64(n)) => i64::try_from(*n).unwrap_or(i64::MAX),
        _ => 0,
    }
}

fn get_str(message: &DynamicMessage, name: &str) -> String {
    match message.get_field_by_name(name).as_deref() {
        Some(PValue::String(s)) => s.clone(),
        _ => String::new(),
    }
}

fn get_bytes(message: &DynamicMessage, name: &str) -> Vec<u8> {
    match message.get_field_by_name(name).as_deref() {
        Some(PValue::Bytes(b)) => b.to_vec(),
        _ => Vec::new(),
    }
}

// ---------------------------------------------------------------- encoding

/// JSON -> a message of type `desc`. Errors name the JSON path.
pub(super) fn json_to_message(
    schema: &Schema,
    desc: &MessageDescriptor,
    json: &Value,
) -> Result<DynamicMessage, ProtobufError> {
    let mut message = DynamicMessage::new(desc.clone());
    match desc.full_name() {
        TIME | MICRO_TIME => {
            match json {
                Value::Null => {}
                Value::String(s) => {
                    let t = DateTime::parse_from_rfc3339(s)
                        .map_err(|e| json_error(format!("invalid time {s:?}: {e}")))?
                        .with_timezone(&Utc);
                    set(&mut message, "seconds", PValue::I64(t.timestamp()))?;
                    let nanos = i32::try_from(t.timestamp_subsec_nanos()).unwrap_or(0);
                    set(&mut message, "nanos", PValue::I32(nanos))?;
                }
                other => return Err(json_error(format!("expected a time string, got {other}"))),
            }
            return Ok(message);
        }
        DURATION => {
            let Value::String(s) = json else {
                return Err(json_error(format!(
                    "expected a duration string, got {json}"
                )));
            };
            let nanos = super::duration::parse(s)
                .ok_or_else(|| json_error(format!("invalid duration {s:?}")))?;
            set(&mut message, "duration", PValue::I64(nanos))?;
            return Ok(message);
        }
        QUANTITY | QUANTITY_VALUE => {
            let s = match json {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                other => return Err(json_error(format!("expected a quantity, got {other}"))),
            };
            set(&mut message, "string", PValue::String(s))?;
            return Ok(message);
        }
        INT_OR_STRING => {
            let (kind, int, string) = match json {
                Value::String(s) => (1, 0, s.clone()),
                Value::Number(n) => {
                    let i = n
                        .as_i64()
                        .and_then(|i| i32::try_from(i).ok())
                        .ok_or_else(|| json_error(format!("{n} is not an int32")))?;
                    (0, i, String::new())
                }
                other => {
                    return Err(json_error(format!(
                        "expected an int or a string, got {other}"
                    )));
                }
            };
            set(&mut message, "type", PValue::I64(kind))?;
            set(&mut message, "intVal", PValue::I32(int))?;
            set(&mut message, "strVal", PValue::String(string))?;
            return Ok(message);
        }
        RAW_EXTENSION | FIELDS_V1 => {
            if !json.is_null() {
                let raw = serde_json::to_vec(json).map_err(|e| json_error(e.to_string()))?;
                let name = if desc.full_name() == RAW_EXTENSION {
                    "raw"
                } else {
                    "Raw"
                };
                set(&mut message, name, PValue::Bytes(raw.into()))?;
            }
            return Ok(message);
        }
        GROUP_VERSION => {
            let Value::String(s) = json else {
                return Err(json_error(format!("expected group/version, got {json}")));
            };
            let (g, v) = s.split_once('/').unwrap_or(("", s));
            set(&mut message, "group", PValue::String(g.into()))?;
            set(&mut message, "version", PValue::String(v.into()))?;
            return Ok(message);
        }
        _ => {}
    }
    if let Some(name) = apiextensions_type(desc) {
        apiextensions_from_json(schema, name, &mut message, json)?;
        return Ok(message);
    }
    if schema.is_slice_wrapper(desc) {
        if let Some(field) = desc.fields().next()
            && !json.is_null()
        {
            let value = list_to_value(schema, &field, json)?;
            message.set_field(&field, value);
        }
        return Ok(message);
    }
    let Value::Object(object) = json else {
        return Err(json_error(format!(
            "expected an object, got {}",
            type_name(json)
        )));
    };
    // Keys of embedded (inlined) structs, gathered per embedding field.
    let mut embedded: Vec<(FieldDescriptor, Map<String, Value>)> = Vec::new();
    for (key, value) in object {
        match schema.json_key(desc, key) {
            Some(JsonKey {
                field,
                embedded: false,
            }) => {
                if let Some(v) = field_value(schema, field, value).map_err(|e| e.under(key))? {
                    message.set_field(field, v);
                }
            }
            Some(JsonKey {
                field,
                embedded: true,
            }) => match embedded.iter_mut().find(|(f, _)| f == field) {
                Some((_, keys)) => {
                    keys.insert(key.clone(), value.clone());
                }
                None => {
                    let mut keys = Map::new();
                    keys.insert(key.clone(), value.clone());
                    embedded.push((field.clone(), keys));
                }
            },
            None => return Err(json_error(format!("unknown field {key:?}")).under(key)),
        }
    }
    // Go writes a non-pointer embedded struct even when all its fields are empty.
    for field in desc.fields() {
        if let Some(tag) = schema.field_tag(&field)
            && tag.inline
            && !tag.pointer
            && !embedded.iter().any(|(f, _)| *f == field)
        {
            embedded.push((field, Map::new()));
        }
    }
    for (field, keys) in embedded {
        if let Kind::Message(inner) = field.kind() {
            let m = json_to_message(schema, &inner, &Value::Object(keys))?;
            message.set_field(&field, PValue::Message(m));
        }
    }
    set_go_zero_fields(schema, desc, &mut message)?;
    Ok(message)
}

/// Sets the fields the JSON left out (or gave as null) that Go's generated
/// marshalers write anyway: every non-pointer field that is not a slice, a
/// map or `[]byte` is written even when zero (`name: ""`, `generation: 0`,
/// `paused: false`, a struct with its own zero fields), since the Go struct
/// kube-apiserver decodes the JSON into has no "unset" for them. Pointers
/// (the tags' `ptr`) are written only when set, as here.
fn set_go_zero_fields(
    schema: &Schema,
    desc: &MessageDescriptor,
    message: &mut DynamicMessage,
) -> Result<(), ProtobufError> {
    for field in desc.fields() {
        if field.is_list() || field.is_map() || message.has_field(&field) {
            continue;
        }
        if schema.field_tag(&field).is_some_and(|t| t.pointer) {
            continue;
        }
        let value = match field.kind() {
            Kind::Bytes => continue,
            Kind::Message(inner) => {
                let zero = go_zero_json(schema, &inner);
                PValue::Message(json_to_message(schema, &inner, &zero).map_err(|e| {
                    ProtobufError::Schema(format!("zero value of {}: {e}", inner.full_name()))
                })?)
            }
            kind => PValue::default_value(&kind),
        };
        message.set_field(&field, value);
    }
    Ok(())
}

/// The JSON of Go's zero value of a message type, as its JSON marshaler
/// writes it: the types with their own marshalers have their own zero.
pub(super) fn go_zero_json(schema: &Schema, desc: &MessageDescriptor) -> Value {
    match desc.full_name() {
        DURATION => Value::String("0s".into()),
        QUANTITY | QUANTITY_VALUE => Value::String("0".into()),
        INT_OR_STRING => Value::Number(0.into()),
        GROUP_VERSION => Value::String(String::new()),
        TIME | MICRO_TIME | RAW_EXTENSION | FIELDS_V1 => Value::Null,
        _ if apiextensions_type(desc).is_some() || schema.is_slice_wrapper(desc) => Value::Null,
        _ => Value::Object(Map::new()),
    }
}

/// The value of one field, or None to leave it unset (JSON null).
fn field_value(
    schema: &Schema,
    field: &FieldDescriptor,
    json: &Value,
) -> Result<Option<PValue>, ProtobufError> {
    if json.is_null() {
        // Unset: a non-pointer field gets Go's zero value, see `set_go_zero_fields`.
        return Ok(None);
    }
    if field.is_list() {
        return list_to_value(schema, field, json).map(Some);
    }
    single_value(schema, &field.kind(), json).map(Some)
}

fn list_to_value(
    schema: &Schema,
    field: &FieldDescriptor,
    json: &Value,
) -> Result<PValue, ProtobufError> {
    let kind = field.kind();
    if let Kind::Message(entry) = &kind
        && schema.is_map_entry(entry)
    {
        let Value::Object(object) = json else {
            return Err(json_error(format!(
                "expected an object, got {}",
                type_name(json)
            )));
        };
        let (Some(key_field), Some(value_field)) = (entry.get_field(1), entry.get_field(2)) else {
            return Err(ProtobufError::Schema(format!(
                "{} is no map entry",
                entry.full_name()
            )));
        };
        // Go's marshalers write map entries sorted by key.
        let mut keys: Vec<&String> = object.keys().collect();
        keys.sort();
        let mut entries = Vec::with_capacity(keys.len());
        for key in keys {
            let mut e = DynamicMessage::new(entry.clone());
            let k = single_value(schema, &key_field.kind(), &Value::String(key.clone()))
                .map_err(|e| e.under(key))?;
            e.set_field(&key_field, k);
            let v = &object[key];
            let v = if v.is_null() {
                PValue::default_value(&value_field.kind())
            } else if value_field.is_list() {
                list_to_value(schema, &value_field, v).map_err(|e| e.under(key))?
            } else {
                single_value(schema, &value_field.kind(), v).map_err(|e| e.under(key))?
            };
            e.set_field(&value_field, v);
            entries.push(PValue::Message(e));
        }
        return Ok(PValue::List(entries));
    }
    let Value::Array(items) = json else {
        return Err(json_error(format!(
            "expected a list, got {}",
            type_name(json)
        )));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, v)| single_value(schema, &kind, v).map_err(|e| e.under(&i.to_string())))
        .collect::<Result<Vec<_>, _>>()
        .map(PValue::List)
}

fn single_value(schema: &Schema, kind: &Kind, json: &Value) -> Result<PValue, ProtobufError> {
    let mismatch = || json_error(format!("expected {kind:?}, got {}", type_name(json)));
    Ok(match kind {
        Kind::Message(m) => PValue::Message(json_to_message(schema, m, json)?),
        Kind::String => PValue::String(json.as_str().ok_or_else(mismatch)?.to_string()),
        Kind::Bool => PValue::Bool(json.as_bool().ok_or_else(mismatch)?),
        Kind::Bytes => {
            let s = json.as_str().ok_or_else(mismatch)?;
            PValue::Bytes(
                BASE64
                    .decode(s)
                    .map_err(|e| json_error(format!("invalid base64: {e}")))?
                    .into(),
            )
        }
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => PValue::I32(
            json.as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .ok_or_else(mismatch)?,
        ),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => {
            PValue::I64(json.as_i64().ok_or_else(mismatch)?)
        }
        Kind::Uint32 | Kind::Fixed32 => PValue::U32(
            json.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(mismatch)?,
        ),
        Kind::Uint64 | Kind::Fixed64 => PValue::U64(json.as_u64().ok_or_else(mismatch)?),
        Kind::Double => PValue::F64(json.as_f64().ok_or_else(mismatch)?),
        #[allow(clippy::cast_possible_truncation)]
        Kind::Float => PValue::F32(json.as_f64().ok_or_else(mismatch)? as f32),
        Kind::Enum(e) => match json {
            Value::String(s) => PValue::EnumNumber(
                e.get_value_by_name(s)
                    .map(|v| v.number())
                    .ok_or_else(mismatch)?,
            ),
            _ => PValue::EnumNumber(
                json.as_i64()
                    .and_then(|n| i32::try_from(n).ok())
                    .ok_or_else(mismatch)?,
            ),
        },
    })
}

fn set(message: &mut DynamicMessage, name: &str, value: PValue) -> Result<(), ProtobufError> {
    message.try_set_field_by_name(name, value).map_err(|e| {
        ProtobufError::Schema(format!("{}.{name}: {e}", message.descriptor().full_name()))
    })
}

fn json_error(reason: String) -> ProtobufError {
    ProtobufError::Json {
        path: String::new(),
        reason,
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod time_tests {
    use chrono::SecondsFormat;

    use super::go_rfc3339;

    /// Go writes years as they are: four digits up to 9999, more after
    /// (no sign), a minus and four digits before year 1.
    #[test]
    fn years_are_written_as_go_writes_them() {
        for (seconds, nanos, format, want) in [
            (
                1_199_149_261,
                0,
                SecondsFormat::Secs,
                "2008-01-01T01:01:01Z",
            ),
            (
                1_199_149_261,
                123_456_789,
                SecondsFormat::Micros,
                "2008-01-01T01:01:01.123456Z",
            ),
            (
                253_402_300_799,
                0,
                SecondsFormat::Secs,
                "9999-12-31T23:59:59Z",
            ),
            (
                253_402_300_800,
                0,
                SecondsFormat::Secs,
                "10000-01-01T00:00:00Z",
            ),
            (
                4_397_921_470_000,
                0,
                SecondsFormat::Secs,
                "141334-08-01T20:46:40Z",
            ),
            (
                -62_198_755_200,
                0,
                SecondsFormat::Secs,
                "-0001-01-01T00:00:00Z",
            ),
        ] {
            assert_eq!(
                go_rfc3339(seconds, nanos, format).as_deref(),
                Some(want),
                "{seconds}"
            );
        }
        // Past chrono's range: no time at all (served as null).
        assert_eq!(go_rfc3339(i64::MAX, 0, SecondsFormat::Secs), None);
    }
}

#[cfg(test)]
mod float_tests {
    use super::float;

    /// Doubles are written as Go's encoding/json writes them.
    #[test]
    fn whole_doubles_have_no_fraction() {
        for (f, want) in [
            (65535.0, "65535"),
            (-3.0, "-3"),
            (0.0, "0"),
            (0.5, "0.5"),
            (1.25e-3, "0.00125"),
            (9_007_199_254_740_991.0, "9007199254740991"),
        ] {
            assert_eq!(float(f).expect("finite").to_string(), want, "{f}");
        }
        assert!(float(f64::NAN).is_err());
    }
}

//! kube-apiserver's `PartialObjectMetadata` form of objects, asked for by
//! metadata clients (client-go's `metadata` package, controller-runtime's
//! `OnlyMetadata`) with `Accept: application/json;as=PartialObjectMetadata;
//! g=meta.k8s.io;v=v1` (Get, watch) or `as=PartialObjectMetadataList` (List):
//! the object's `metadata` alone, as the internal type holds it (less an
//! annotation the printer of the kind says becomes a field). Table rows with
//! `includeObject=Metadata` carry the same form ([`partial`]).

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::printers::Printer;
use crate::object::protobuf::{self, ProtobufError};
use crate::object::wire::protobuf_watch_frames;

/// An object's `PartialObjectMetadata` in `api_version` (`meta.k8s.io/v1`
/// or `meta.k8s.io/v1beta1`); `printer` is the kind's, when it has one.
pub fn partial(obj: &Value, printer: Option<&Printer>, api_version: &str) -> Value {
    let mut meta = obj.get("metadata").cloned().unwrap_or_else(|| json!({}));
    if let Some(p) = printer {
        p.row_metadata(&mut meta);
    }
    json!({"kind": "PartialObjectMetadata", "apiVersion": api_version, "metadata": meta})
}

/// The `PartialObjectMetadata` of an object's JSON `wire` bytes.
pub fn partial_of_wire(wire: &[u8], printer: Option<&Printer>, api_version: &str) -> Value {
    let obj: Value = serde_json::from_slice(wire).unwrap_or_else(|_| json!({}));
    partial(&obj, printer, api_version)
}

/// A `PartialObjectMetadata(List)` as kube-apiserver's protobuf body
/// (`k8s\0` and a `runtime.Unknown` of the meta.k8s.io type). A List's
/// items carry no type in protobuf.
pub fn protobuf_body(form: &Value) -> Result<Vec<u8>, ProtobufError> {
    let form = untyped_items(form);
    let api_version = form["apiVersion"].as_str().unwrap_or("").to_string();
    let kind = form["kind"].as_str().unwrap_or("").to_string();
    let mut message = protobuf::encode_message(form, &api_version, &kind)?;
    // The schema's message of either version is v1's (`metadata = 1`,
    // `items = 2`); meta.k8s.io/v1beta1's has `items = 1`, `metadata = 2`,
    // and Go writes them in that order.
    if kind == "PartialObjectMetadataList" && api_version == "meta.k8s.io/v1beta1" {
        message = v1beta1_list(&message);
    }
    protobuf::wrap_message(&api_version, &kind, &message)
}

/// `form` with its items' `kind` and `apiVersion` removed.
fn untyped_items(form: &Value) -> Value {
    let mut form = form.clone();
    if let Some(items) = form.get_mut("items").and_then(Value::as_array_mut) {
        for item in items.iter_mut().filter_map(Value::as_object_mut) {
            item.remove("kind");
            item.remove("apiVersion");
        }
    }
    form
}

/// A base-128 varint at the start of `b`: (value, its length).
fn varint(b: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, byte) in b.iter().enumerate().take(10) {
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

/// A v1 `PartialObjectMetadataList` message as v1beta1's: fields 1 and 2
/// swapped, then written in field-number order (stable); a message with
/// other fields as it is.
fn v1beta1_list(message: &[u8]) -> Vec<u8> {
    let mut fields: Vec<(u8, &[u8])> = Vec::new();
    let mut at = 0;
    while at < message.len() {
        let rest = &message[at..];
        let number = match rest[0] {
            0x0a => 2u8,
            0x12 => 1u8,
            _ => return message.to_vec(),
        };
        let Some((len, len_len)) = varint(&rest[1..]) else {
            return message.to_vec();
        };
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| (1 + len_len).checked_add(l));
        match end {
            Some(end) if end <= rest.len() => {
                fields.push((number, &rest[1..end]));
                at += end;
            }
            _ => return message.to_vec(),
        }
    }
    fields.sort_by_key(|(n, _)| *n);
    let mut out = Vec::with_capacity(message.len());
    for (number, body) in fields {
        out.push((number << 3) | 2);
        out.extend_from_slice(body);
    }
    out
}

/// Watch lines in their `PartialObjectMetadata` form ([`watch_lines`]),
/// as protobuf watch frames when `protobuf`.
pub fn watch_events(
    data: &[u8],
    printer: Option<&Printer>,
    api_version: &str,
    protobuf: bool,
) -> Result<Bytes, String> {
    let lines = watch_lines(data, printer, api_version);
    if protobuf {
        protobuf_watch_frames(&lines).map_err(|e| e.to_string())
    } else {
        Ok(lines)
    }
}

/// A `PartialObjectMetadataList` of JSON objects with list `metadata`.
pub fn partial_list(
    items: impl Iterator<Item = Value>,
    printer: Option<&Printer>,
    api_version: &str,
    metadata: Map<String, Value>,
) -> Value {
    let items: Vec<Value> = items.map(|o| partial(&o, printer, api_version)).collect();
    // kube-apiserver's list of no items has nil `items`.
    let items = if items.is_empty() {
        Value::Null
    } else {
        Value::Array(items)
    };
    json!({
        "kind": "PartialObjectMetadataList",
        "apiVersion": api_version,
        "metadata": Value::Object(metadata),
        "items": items,
    })
}

/// Watch event lines (`{"type":..,"object":..}\n`) with each object in its
/// `PartialObjectMetadata` form, bookmarks included; ERROR events (a
/// Status) are left as they are.
pub fn watch_lines(data: &[u8], printer: Option<&Printer>, api_version: &str) -> Bytes {
    crate::object::wire::map_event_lines(data, |ty, ev| {
        if ty == "ERROR" {
            return None;
        }
        let obj = partial(ev.get("object")?, printer, api_version);
        let ty = serde_json::to_string(ty).ok()?;
        Some(format!("{{\"type\":{ty},\"object\":{obj}}}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::response::printers::for_resource;

    #[test]
    fn partial_keeps_metadata_only_in_the_requested_version() {
        let obj = json!({"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": "p", "labels": {"a": "b"}}, "spec": {"x": 1}});
        let p = partial(&obj, for_resource("", "pods"), "meta.k8s.io/v1beta1");
        assert_eq!(
            p,
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1beta1",
                "metadata": {"name": "p", "labels": {"a": "b"}}})
        );
    }

    #[test]
    fn daemonset_generation_annotation_is_dropped_as_in_table_rows() {
        let obj = json!({"metadata": {"name": "d", "annotations": {
            "deprecated.daemonset.template.generation": "3"}}});
        let ds = for_resource("apps", "daemonsets");
        assert!(ds.is_some());
        let p = partial(&obj, ds, "meta.k8s.io/v1");
        assert_eq!(p["metadata"], json!({"name": "d"}));
        // Other kinds keep it.
        let p = partial(&obj, None, "meta.k8s.io/v1");
        assert_eq!(
            p["metadata"]["annotations"]["deprecated.daemonset.template.generation"],
            "3"
        );
    }

    #[test]
    fn protobuf_forms_decode_back() {
        let obj = json!({"metadata": {"name": "a", "namespace": "n", "labels": {"x": "y"}}});
        let p = partial(&obj, None, "meta.k8s.io/v1");
        let body = protobuf_body(&p).expect("encodes");
        assert_eq!(protobuf::decode(&body).expect("decodes"), p);
        let line =
            b"{\"type\":\"ADDED\",\"object\":{\"kind\":\"Pod\",\"metadata\":{\"name\":\"a\"}}}\n";
        let frames = watch_events(line, None, "meta.k8s.io/v1beta1", true).expect("encodes");
        let ev = protobuf::decode_watch_event(&frames[4..]).expect("a WatchEvent");
        assert_eq!(ev["type"], "ADDED");
        let json = watch_events(line, None, "meta.k8s.io/v1beta1", false).expect("JSON");
        assert!(json.starts_with(b"{\"type\":\"ADDED\""));
    }

    #[test]
    fn list_and_watch_forms() {
        let objs = vec![
            json!({"metadata": {"name": "a"}}),
            json!({"metadata": {"name": "b"}}),
        ];
        let mut m = Map::new();
        m.insert("resourceVersion".into(), json!("7"));
        let l = partial_list(objs.into_iter(), None, "meta.k8s.io/v1", m.clone());
        assert_eq!(l["kind"], "PartialObjectMetadataList");
        assert_eq!(l["metadata"]["resourceVersion"], "7");
        assert_eq!(l["items"][1]["metadata"]["name"], "b");
        assert_eq!(l["items"][1]["kind"], "PartialObjectMetadata");
        let empty = partial_list(std::iter::empty(), None, "meta.k8s.io/v1", m);
        assert_eq!(empty["items"], Value::Null);
        for list in [&l, &empty] {
            let body = protobuf_body(list).expect("encodes");
            let back = protobuf::decode(&body).expect("decodes");
            assert_eq!(back["metadata"], list["metadata"]);
            assert_eq!(back["kind"], "PartialObjectMetadataList");
        }
        // v1beta1: items (field 1) before metadata (field 2), as Go writes.
        let objs = vec![json!({"metadata": {"name": "a"}})];
        let mut m = Map::new();
        m.insert("resourceVersion".into(), json!("7"));
        let beta = partial_list(objs.into_iter(), None, "meta.k8s.io/v1beta1", m);
        let raw = protobuf::encode_message(
            untyped_items(&beta),
            "meta.k8s.io/v1beta1",
            "PartialObjectMetadataList",
        )
        .expect("encodes");
        // v1's message: metadata (field 1) first.
        assert_eq!(raw[0], 0x0a);
        let beta_raw = v1beta1_list(&raw);
        assert_eq!(beta_raw.len(), raw.len());
        // items (field 1) first, then metadata (field 2), as in the body.
        assert_eq!(beta_raw[0], 0x0a);
        let meta_len = usize::from(raw[1]) + 2;
        let tail = beta_raw.len() - meta_len;
        assert_eq!(beta_raw[tail], 0x12);
        assert_eq!(&beta_raw[tail + 1..], &raw[1..meta_len]);
        let body = protobuf_body(&beta).expect("encodes");
        assert!(
            body.windows(beta_raw.len())
                .any(|w| w == beta_raw.as_slice())
        );
        assert_eq!(
            v1beta1_list(&[0x08, 0x01]),
            vec![0x08, 0x01],
            "other fields"
        );

        let lines = b"{\"type\":\"ADDED\",\"object\":{\"kind\":\"Pod\",\"metadata\":{\"name\":\"a\"},\"spec\":{}}}\n\
{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"Pod\",\"metadata\":{\"resourceVersion\":\"9\"}}}\n\
{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"code\":410}}\n";
        let out = watch_lines(lines, None, "meta.k8s.io/v1");
        let evs: Vec<Value> = out
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).expect("a JSON line"))
            .collect();
        assert_eq!(evs.len(), 3);
        assert_eq!(
            evs[0],
            json!({"type": "ADDED", "object": {"kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1", "metadata": {"name": "a"}}})
        );
        assert_eq!(evs[1]["object"]["metadata"]["resourceVersion"], "9");
        assert_eq!(evs[1]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(evs[2]["object"]["kind"], "Status");
    }
}

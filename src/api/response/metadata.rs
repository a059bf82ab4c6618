//! kube-apiserver's `PartialObjectMetadata` form of objects, asked for by
//! metadata clients (client-go's `metadata` package, controller-runtime's
//! `OnlyMetadata`) with `Accept: application/json;as=PartialObjectMetadata;
//! g=meta.k8s.io;v=v1` (Get, watch) or `as=PartialObjectMetadataList` (List):
//! the object's `metadata` alone, as the internal type holds it (less an
//! annotation the printer of the kind says becomes a field). Table rows with
//! `includeObject=Metadata` carry the same form ([`partial`]).

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Map, Value, json};

use super::printers::Printer;

/// An object's `PartialObjectMetadata` in `api_version` (`meta.k8s.io/v1`
/// or `meta.k8s.io/v1beta1`); `printer` is the kind's, when it has one.
pub fn partial(obj: &Value, printer: Option<&Printer>, api_version: &str) -> Value {
    let mut meta = obj.get("metadata").cloned().unwrap_or_else(|| json!({}));
    if let Some(p) = printer {
        p.row_metadata(&mut meta);
    }
    json!({"kind": "PartialObjectMetadata", "apiVersion": api_version, "metadata": meta})
}

/// The `PartialObjectMetadata` JSON of an object's JSON `wire` bytes.
pub fn partial_json(wire: &[u8], printer: Option<&Printer>, api_version: &str) -> Vec<u8> {
    let obj: Value = serde_json::from_slice(wire).unwrap_or_else(|_| json!({}));
    serde_json::to_vec(&partial(&obj, printer, api_version)).unwrap_or_default()
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
    let mut out = BytesMut::with_capacity(data.len());
    for line in data.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let converted = serde_json::from_slice::<Value>(line).ok().and_then(|ev| {
            let ty = ev.get("type")?.as_str()?;
            if ty == "ERROR" {
                return None;
            }
            let obj = partial(ev.get("object")?, printer, api_version);
            Some(json!({"type": ty, "object": obj}).to_string())
        });
        match converted {
            Some(s) => out.put_slice(s.as_bytes()),
            None => out.put_slice(line),
        }
        out.put_u8(b'\n');
    }
    out.freeze()
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

//! `meta.k8s.io/v1` Table rendering for `kubectl get` (which asks for
//! `application/json;as=Table;v=v1;g=meta.k8s.io`): columns NAME, AGE and one
//! per configured index field. Only kubectl-style clients pay for this; plain
//! JSON reads keep writing the cached wire bytes.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Map, Value, json};

use crate::api::request::negotiation::IncludeObject;
use crate::object::{Object, metadata_str};

/// Column header of an index path: its last segment, first letter uppercased
/// (`spec.nodeName` -> `NodeName`).
fn column_name(path: &str) -> String {
    let last = path.rsplit('.').next().unwrap_or(path);
    let mut c = last.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// The column definitions: Name, Age, then the index paths.
pub fn column_definitions(index_paths: &[Arc<str>]) -> Value {
    let mut cols = vec![
        json!({"name": "Name", "type": "string", "format": "name",
               "description": "Name must be unique within a namespace.", "priority": 0}),
        json!({"name": "Age", "type": "string", "format": "",
               "description": "Time since metadata.creationTimestamp.", "priority": 0}),
    ];
    for p in index_paths {
        cols.push(
            json!({"name": column_name(p), "type": "string", "format": "",
                         "description": format!("The value of {p}."), "priority": 0}),
        );
    }
    Value::Array(cols)
}

/// One row for an object given as JSON.
pub fn row(obj: Value, index_paths: &[Arc<str>], include: IncludeObject) -> Value {
    let meta_str = |f: &str| crate::object::metadata_str(&obj, f).map(str::to_string);
    let name = meta_str("name").unwrap_or_default();
    let age = meta_str("creationTimestamp")
        .map(|t| age_of(&t))
        .unwrap_or_else(|| "<unknown>".to_string());
    let mut cells = vec![Value::String(name), Value::String(age)];
    for p in index_paths {
        let v = crate::object::lookup_path(&obj, p)
            .and_then(crate::object::field_string)
            .unwrap_or_default();
        cells.push(Value::String(v));
    }
    let mut row = Map::new();
    row.insert("cells".into(), Value::Array(cells));
    match include {
        IncludeObject::None => {}
        IncludeObject::Object => {
            row.insert("object".into(), obj);
        }
        IncludeObject::Metadata => {
            let meta = obj.get("metadata").cloned().unwrap_or_else(|| json!({}));
            row.insert(
                "object".into(),
                json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta}),
            );
        }
    }
    Value::Object(row)
}

/// One row for a cached object.
pub fn object_row(obj: &Object, index_paths: &[Arc<str>], include: IncludeObject) -> Value {
    let v: Value = serde_json::from_slice(&obj.wire).unwrap_or_else(|_| json!({}));
    row(v, index_paths, include)
}

/// A whole Table from rows. `meta` is the list's `metadata` (resourceVersion,
/// continue, remainingItemCount). Column definitions are left empty when
/// `with_columns` is false (later watch events).
pub fn table(rows: Vec<Value>, index_paths: &[Arc<str>], meta: Value, with_columns: bool) -> Value {
    let columns = if with_columns {
        column_definitions(index_paths)
    } else {
        Value::Array(Vec::new())
    };
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": columns,
        "rows": rows,
    })
}

/// `kubectl`'s short age: `45s`, `3m12s`, `25m`, `5h3m`, `20h`, `3d4h`, `40d`, `2y10d`.
pub fn age_of(creation_timestamp: &str) -> String {
    match chrono::DateTime::parse_from_rfc3339(creation_timestamp) {
        Ok(t) => {
            let secs = (chrono::Utc::now() - t.with_timezone(&chrono::Utc)).num_seconds();
            human_duration(secs)
        }
        Err(_) => "<invalid>".into(),
    }
}

/// Kubernetes' `duration.HumanDuration`.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    let s = secs.max(0);
    let m = s / 60;
    let h = s / 3600;
    let d = s / 86400;
    let y = d / 365;
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        if s % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", s % 60)
        }
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{}m", m % 60)
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        if h % 24 == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{}h", h % 24)
        }
    } else if d < 365 * 2 {
        format!("{d}d")
    } else if y < 8 {
        if d % 365 == 0 {
            format!("{y}y")
        } else {
            format!("{y}y{}d", d % 365)
        }
    } else {
        format!("{y}y")
    }
}

/// Turns watch lines into Table watch lines (kubectl `get -w`).
pub(crate) struct TableWatch {
    paths: Vec<Arc<str>>,
    include: IncludeObject,
    first: bool,
}

impl TableWatch {
    /// Rows with the columns of `paths`; the first event's Table carries
    /// the column definitions.
    pub(crate) fn new(paths: Vec<Arc<str>>, include: IncludeObject) -> TableWatch {
        TableWatch {
            paths,
            include,
            first: true,
        }
    }

    pub(crate) fn convert(&mut self, data: &[u8]) -> Bytes {
        let mut out = BytesMut::with_capacity(data.len());
        for line in data.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let converted = serde_json::from_slice::<Value>(line).ok().and_then(|ev| {
                let ty = ev.get("type")?.as_str()?.to_string();
                if !matches!(ty.as_str(), "ADDED" | "MODIFIED" | "DELETED") {
                    return None;
                }
                let obj = ev.get("object")?.clone();
                let rv = metadata_str(&obj, "resourceVersion")
                    .unwrap_or("")
                    .to_string();
                let row = row(obj, &self.paths, self.include);
                let t = table(
                    vec![row],
                    &self.paths,
                    json!({"resourceVersion": rv}),
                    self.first,
                );
                self.first = false;
                Some(json!({"type": ty, "object": t}).to_string())
            });
            match converted {
                Some(s) => out.put_slice(s.as_bytes()),
                None => out.put_slice(line),
            }
            out.put_u8(b'\n');
        }
        out.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(192), "3m12s");
        assert_eq!(human_duration(25 * 60), "25m");
        assert_eq!(human_duration(5 * 3600 + 180), "5h3m");
        assert_eq!(human_duration(20 * 3600), "20h");
        assert_eq!(human_duration(3 * 86400 + 4 * 3600), "3d4h");
        assert_eq!(human_duration(40 * 86400), "40d");
        assert_eq!(human_duration(-5), "<invalid>");
        assert_eq!(column_name("spec.nodeName"), "NodeName");
    }
}

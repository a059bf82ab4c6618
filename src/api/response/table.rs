//! `meta.k8s.io/v1` Table rendering for `kubectl get` (which asks for
//! `application/json;as=Table;v=v1;g=meta.k8s.io`): a built-in kind with a
//! ported kube-apiserver printer ([`super::printers`]) gets its columns and
//! cells; any other resource NAME, AGE and one column per configured index
//! field. Only kubectl-style clients pay for this; plain JSON reads keep
//! writing the cached wire bytes.

use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde_json::{Map, Value, json};

use super::metadata;
use super::printers::{self, Printer};
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

/// The columns of a resource's Tables.
#[derive(Clone)]
pub enum Columns {
    /// kube-apiserver's printer of the kind.
    Printed(&'static Printer),
    /// Name, Age, then the configured index paths.
    Generic(Vec<Arc<str>>),
}

impl Columns {
    /// The printer of `group`/`plural` if there is one, else the generic
    /// columns of `index_paths`.
    pub fn of(group: &str, plural: &str, index_paths: &[Arc<str>]) -> Columns {
        match printers::for_resource(group, plural) {
            Some(p) => Columns::Printed(p),
            None => Columns::Generic(index_paths.to_vec()),
        }
    }

    /// The column definitions.
    pub fn definitions(&self) -> Value {
        match self {
            Columns::Printed(p) => p.column_definitions(),
            Columns::Generic(paths) => generic_definitions(paths),
        }
    }
}

/// The generic column definitions: Name, Age, then the index paths.
fn generic_definitions(index_paths: &[Arc<str>]) -> Value {
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

/// The generic cells of an object.
fn generic_cells(obj: &Value, index_paths: &[Arc<str>], now: DateTime<Utc>) -> Vec<Value> {
    let meta_str = |f: &str| crate::object::metadata_str(obj, f).map(str::to_string);
    let name = meta_str("name").unwrap_or_default();
    let age = meta_str("creationTimestamp")
        .map(|t| age_of(&t, now))
        .unwrap_or_else(|| "<unknown>".to_string());
    let mut cells = vec![Value::String(name), Value::String(age)];
    for p in index_paths {
        let v = crate::object::lookup_path(obj, p)
            .and_then(crate::object::field_string)
            .unwrap_or_default();
        cells.push(Value::String(v));
    }
    cells
}

/// One row for an object given as JSON; `now` is the time Ages are taken at.
pub fn row(obj: Value, columns: &Columns, include: IncludeObject, now: DateTime<Utc>) -> Value {
    let mut row = Map::new();
    match columns {
        Columns::Printed(p) => {
            let printed = p.row(&obj, now);
            row.insert("cells".into(), Value::Array(printed.cells));
            if let Some(c) = printed.conditions {
                row.insert("conditions".into(), c);
            }
        }
        Columns::Generic(paths) => {
            row.insert(
                "cells".into(),
                Value::Array(generic_cells(&obj, paths, now)),
            );
        }
    }
    match include {
        // kube-apiserver's row has an empty RawExtension, written as null.
        IncludeObject::None => {
            row.insert("object".into(), Value::Null);
        }
        IncludeObject::Object => {
            row.insert("object".into(), obj);
        }
        IncludeObject::Metadata => {
            let printer = match columns {
                Columns::Printed(p) => Some(*p),
                Columns::Generic(_) => None,
            };
            row.insert(
                "object".into(),
                metadata::partial(&obj, printer, "meta.k8s.io/v1"),
            );
        }
    }
    Value::Object(row)
}

/// One row for a cached object.
pub fn object_row(
    obj: &Object,
    columns: &Columns,
    include: IncludeObject,
    now: DateTime<Utc>,
) -> Value {
    let v: Value = serde_json::from_slice(&obj.wire).unwrap_or_else(|_| json!({}));
    row(v, columns, include, now)
}

/// A whole Table from rows. `meta` is the list's `metadata` (resourceVersion,
/// continue, remainingItemCount). Column definitions are null, as
/// kube-apiserver writes them, when `with_columns` is false (later watch
/// events).
pub fn table(rows: Vec<Value>, columns: &Columns, meta: Value, with_columns: bool) -> Value {
    let columns = if with_columns {
        columns.definitions()
    } else {
        Value::Null
    };
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": columns,
        "rows": rows,
    })
}

/// `kubectl`'s short age of a creation timestamp at `now`: `45s`, `3m12s`,
/// `25m`, `5h3m`, `20h`, `3d4h`, `40d`, `2y10d`.
fn age_of(creation_timestamp: &str, now: DateTime<Utc>) -> String {
    match chrono::DateTime::parse_from_rfc3339(creation_timestamp) {
        Ok(t) => printers::human_duration((now - t.with_timezone(&Utc)).num_seconds()),
        Err(_) => "<invalid>".into(),
    }
}

/// Turns watch lines into Table watch lines (kubectl `get -w`).
pub(crate) struct TableWatch {
    columns: Columns,
    include: IncludeObject,
    first: bool,
}

impl TableWatch {
    /// Rows with `columns`; the first event's Table carries the column
    /// definitions.
    pub(crate) fn new(columns: Columns, include: IncludeObject) -> TableWatch {
        TableWatch {
            columns,
            include,
            first: true,
        }
    }

    pub(crate) fn convert(&mut self, data: &[u8]) -> Bytes {
        crate::object::wire::map_event_lines(data, |ty, ev| {
            if !matches!(ty, "ADDED" | "MODIFIED" | "DELETED") {
                return None;
            }
            let obj = ev.get("object")?.clone();
            let rv = metadata_str(&obj, "resourceVersion")
                .unwrap_or("")
                .to_string();
            let row = row(obj, &self.columns, self.include, Utc::now());
            let t = table(
                vec![row],
                &self.columns,
                json!({"resourceVersion": rv}),
                self.first,
            );
            self.first = false;
            Some(json!({"type": ty, "object": t}).to_string())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_names() {
        assert_eq!(column_name("spec.nodeName"), "NodeName");
    }

    #[test]
    fn printed_and_generic_columns() {
        let paths: Vec<Arc<str>> = vec![Arc::from("spec.nodeName")];
        let pods = Columns::of("", "pods", &paths);
        assert_eq!(pods.definitions()[1]["name"], "Ready");
        let generic = Columns::of("example.com", "widgets", &paths);
        assert_eq!(generic.definitions()[2]["name"], "NodeName");
        let now = Utc::now();
        let obj = json!({"metadata": {"name": "w"}, "spec": {"nodeName": "n1"}});
        let r = row(obj.clone(), &generic, IncludeObject::None, now);
        assert_eq!(r["cells"], json!(["w", "<unknown>", "n1"]));
        let r = row(obj, &pods, IncludeObject::Metadata, now);
        assert_eq!(r["cells"][0], "w");
        assert_eq!(r["object"]["kind"], "PartialObjectMetadata");
    }
}

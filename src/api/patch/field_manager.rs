//! Server-side apply (`PATCH` with `application/apply-patch+yaml`: what
//! `kubectl apply --server-side`, Helm 4 and controllers built on
//! client-go's apply configurations send), after kube-apiserver's
//! FieldManager. `metadata.managedFields` records which fields each apply
//! manager set, so that an apply removes what the same manager applied
//! before and no longer applies, and refuses (409, one cause per field) to
//! change a field another manager set, unless forced (`force=true`), which
//! takes the field over.
//!
//! What this does not know, with no OpenAPI schemas of the types: lists are
//! atomic (set, owned and removed whole, as kube-apiserver does for lists
//! without merge keys; it merges e.g. containers by name), and fields written
//! by create, update or a non-apply patch belong to no manager (kube-apiserver
//! records those as `Update` managers, whose fields an apply may then
//! conflict with). Entries written by kube-apiserver itself, with list keys
//! (`k:{..}`), are kept and read: their fields conflict like any other.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::api::status::ApiStatus;

/// One field: the `fieldsV1` keys from the object's root (`f:spec`,
/// `f:replicas`; `k:{..}`, `v:..`, `i:..` in kube-apiserver's own entries).
pub type FieldPath = Vec<String>;

/// A set of fields, each owned whole (with everything under it).
pub type FieldSet = BTreeSet<FieldPath>;

/// Top-level and `metadata` fields no manager owns (kube-apiserver's
/// `stripmeta`): identity and system fields.
const STRIPPED_TOP: &[&str] = &["apiVersion", "kind"];
const STRIPPED_META: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "selfLink",
    "managedFields",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];

/// Apply's own operation name in a managed fields entry.
const APPLY: &str = "Apply";

/// The fields an applied configuration sets: every value that is not an
/// object, and every empty object, by its path; nulls set nothing.
pub fn applied_fields(applied: &Value) -> FieldSet {
    fn walk(v: &Map<String, Value>, path: &mut FieldPath, top: bool, out: &mut FieldSet) {
        for (k, child) in v {
            let stripped = if top {
                STRIPPED_TOP.contains(&k.as_str())
            } else {
                path.len() == 1 && path[0] == "f:metadata" && STRIPPED_META.contains(&k.as_str())
            };
            if stripped || child.is_null() {
                continue;
            }
            path.push(format!("f:{k}"));
            match child {
                Value::Object(m) if !m.is_empty() => walk(m, path, false, out),
                _ => {
                    out.insert(path.clone());
                }
            }
            path.pop();
        }
    }
    let mut out = FieldSet::new();
    if let Value::Object(m) = applied {
        walk(m, &mut Vec::new(), true, &mut out);
    }
    out
}

/// Reads a `fieldsV1` value: a key with an empty object, or with `"."`
/// among its keys, is an owned field.
pub fn parse_fields_v1(v: &Value) -> Option<FieldSet> {
    fn walk(v: &Map<String, Value>, path: &mut FieldPath, out: &mut FieldSet) -> Option<()> {
        for (k, child) in v {
            if k == "." {
                if !path.is_empty() {
                    out.insert(path.clone());
                }
                continue;
            }
            let Value::Object(m) = child else {
                return None;
            };
            path.push(k.clone());
            if m.is_empty() {
                out.insert(path.clone());
            } else {
                walk(m, path, out)?;
            }
            path.pop();
        }
        Some(())
    }
    let Value::Object(m) = v else {
        return None;
    };
    let mut out = FieldSet::new();
    walk(m, &mut Vec::new(), &mut out)?;
    Some(out)
}

/// Writes a set as `fieldsV1`: a field with fields owned under it gets `"."`.
pub fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut node = &mut root;
        for (i, seg) in path.iter().enumerate() {
            let entry = node
                .entry(seg.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            if !entry.is_object() {
                *entry = Value::Object(Map::new());
            }
            let Value::Object(m) = entry else {
                break;
            };
            // Owned itself, with fields owned under it (a set lists a
            // field before the fields inside it).
            if i + 1 < path.len() && set.contains(&path[..=i]) {
                m.insert(".".into(), Value::Object(Map::new()));
            }
            node = m;
        }
    }
    Value::Object(root)
}

/// The value at `path`, when every step is an object field (`f:`).
fn value_at<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter()
        .try_fold(v, |v, seg| v.get(seg.strip_prefix("f:")?))
}

/// Sets `path` to `value`, making the objects on the way.
fn set_at(root: &mut Value, path: &[String], value: Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = root;
    for seg in parents {
        let Some(name) = seg.strip_prefix("f:") else {
            return;
        };
        if !node.is_object() {
            *node = Value::Object(Map::new());
        }
        let Value::Object(m) = node else {
            return;
        };
        node = m
            .entry(name.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    if !node.is_object() {
        *node = Value::Object(Map::new());
    }
    if let (Value::Object(m), Some(name)) = (node, last.strip_prefix("f:")) {
        m.insert(name.to_string(), value);
    }
}

/// Removes the field at `path` (a field inside a list, `k:`/`v:`/`i:`, is
/// left alone: with atomic lists this manager never owns one).
fn remove_at(root: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = root;
    for seg in parents {
        let Some(next) = seg.strip_prefix("f:").and_then(|n| node.get_mut(n)) else {
            return;
        };
        node = next;
    }
    if let (Value::Object(m), Some(name)) = (node, last.strip_prefix("f:")) {
        m.remove(name);
    }
}

/// A field path as kube-apiserver prints it: `.spec.replicas`,
/// `.spec.containers[name="c"].image`.
pub fn display_path(path: &[String]) -> String {
    let mut s = String::new();
    for seg in path {
        if let Some(f) = seg.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(k) = seg.strip_prefix("k:") {
            let keys: Option<Map<String, Value>> = serde_json::from_str(k).ok();
            let inner = match keys {
                Some(m) => m
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(","),
                None => k.to_string(),
            };
            s.push('[');
            s.push_str(&inner);
            s.push(']');
        } else if let Some(v) = seg.strip_prefix("v:") {
            s.push_str(&format!("[={v}]"));
        } else if let Some(i) = seg.strip_prefix("i:") {
            s.push_str(&format!("[{i}]"));
        } else {
            s.push('.');
            s.push_str(seg);
        }
    }
    s
}

/// One `metadata.managedFields` entry, kept as it was read so that what
/// this module does not change is written back untouched.
#[derive(Debug, Clone)]
struct Entry {
    raw: Map<String, Value>,
    /// `None`: not `FieldsV1` (kept, never compared).
    fields: Option<FieldSet>,
}

impl Entry {
    fn str(&self, key: &str) -> &str {
        self.raw.get(key).and_then(Value::as_str).unwrap_or("")
    }

    /// Whether this is `manager`'s apply entry (no subresource).
    fn is_apply_of(&self, manager: &str) -> bool {
        self.str("manager") == manager
            && self.str("operation") == APPLY
            && self.str("subresource").is_empty()
    }

    /// How kube-apiserver names the manager in a conflict.
    fn describe(&self) -> String {
        let mut s = format!("{:?}", self.str("manager"));
        let sub = self.str("subresource");
        if !sub.is_empty() {
            s.push_str(&format!(" with subresource {sub:?}"));
        }
        if self.str("operation") == "Update" {
            s.push_str(&format!(" using {}", self.str("apiVersion")));
            let time = self.str("time");
            if !time.is_empty() {
                s.push_str(&format!(" at {time}"));
            }
        }
        s
    }
}

fn read_entries(live: &Value) -> Result<Vec<Entry>, ApiStatus> {
    let items = match live.get("metadata").and_then(|m| m.get("managedFields")) {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(ApiStatus::internal(
                "the stored object's metadata.managedFields is not a list",
            ));
        }
    };
    Ok(items
        .iter()
        .filter_map(Value::as_object)
        .map(|raw| Entry {
            fields: match raw.get("fieldsType").and_then(Value::as_str) {
                Some("FieldsV1") => raw.get("fieldsV1").and_then(parse_fields_v1),
                _ => None,
            },
            raw: raw.clone(),
        })
        .collect())
}

/// What an apply asks for.
pub struct ApplyRequest<'a> {
    /// The applied configuration (identity and type meta already checked).
    pub applied: &'a Value,
    pub manager: &'a str,
    pub force: bool,
    /// The resource's `apiVersion`, recorded in the entry.
    pub api_version: &'a str,
    /// RFC 3339, the entry's `time`.
    pub now: &'a str,
}

/// Whether applying `p` changes `live`: an empty object only sets the field
/// when there is no object there (the merge keeps the live map's keys, as
/// structured-merge-diff merges maps); any other value when it differs.
fn changes(live: &Value, applied: &Value, p: &[String]) -> bool {
    let (now, want) = (value_at(live, p), value_at(applied, p));
    match want {
        Some(Value::Object(m)) if m.is_empty() => !now.is_some_and(Value::is_object),
        _ => now != want,
    }
}

/// The order kube-apiserver stores entries in: `Apply` before `Update`, then
/// by time, manager, apiVersion and subresource.
fn entry_order(a: &Map<String, Value>, b: &Map<String, Value>) -> std::cmp::Ordering {
    let key = |e: &Map<String, Value>| {
        let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        (
            s("operation"),
            s("time"),
            s("manager"),
            s("apiVersion"),
            s("subresource"),
        )
    };
    key(a).cmp(&key(b))
}

/// Applies `req` to `live` (the stored object, or `None` to create), giving
/// the new object with its `managedFields`; identity fields (name,
/// namespace, uid, creationTimestamp) are the caller's.
pub fn apply(live: Option<&Value>, req: &ApplyRequest<'_>) -> Result<Value, ApiStatus> {
    let empty = Value::Object(Map::new());
    let live = live.unwrap_or(&empty);
    let mut entries = read_entries(live)?;
    let new_fields = applied_fields(req.applied);
    let mine = entries.iter().position(|e| e.is_apply_of(req.manager));
    let old_fields = mine
        .and_then(|i| entries[i].fields.clone())
        .unwrap_or_default();

    // Conflicts: a field another manager owns at or inside a field this
    // apply changes. A manager owning a parent (kube-apiserver's `"."`, e.g.
    // the labels map) does not own the fields inside it.
    let mut conflicts: BTreeSet<(usize, FieldPath)> = BTreeSet::new();
    for (i, e) in entries.iter().enumerate() {
        if Some(i) == mine {
            continue;
        }
        let Some(theirs) = &e.fields else { continue };
        for p in new_fields.iter().filter(|p| changes(live, req.applied, p)) {
            for q in theirs.iter().filter(|q| q.starts_with(p)) {
                conflicts.insert((i, q.clone()));
            }
        }
    }
    let conflicts: Vec<(usize, FieldPath)> = conflicts.into_iter().collect();
    if !conflicts.is_empty() && !req.force {
        return Err(conflict_status(&entries, &conflicts));
    }
    // Forced: the fields move to this manager.
    for (i, q) in &conflicts {
        if let Some(set) = entries[*i].fields.as_mut() {
            set.remove(q);
        }
    }

    let mut out = live.clone();
    // What this manager applied before and no longer applies goes, unless
    // it (or a field inside it) is still applied or owned by another manager.
    for p in old_fields.difference(&new_fields) {
        let kept = new_fields.iter().any(|n| n.starts_with(p))
            || entries.iter().enumerate().any(|(i, e)| {
                Some(i) != mine
                    && e.fields
                        .as_ref()
                        .is_some_and(|s| s.iter().any(|q| q.starts_with(p)))
            });
        if !kept {
            remove_at(&mut out, p);
        }
    }
    for p in &new_fields {
        if changes(&out, req.applied, p)
            && let Some(v) = value_at(req.applied, p)
        {
            set_at(&mut out, p, v.clone());
        }
    }
    for top in STRIPPED_TOP {
        if let Some(v) = req.applied.get(*top) {
            set_at(&mut out, &[format!("f:{top}")], v.clone());
        }
    }

    // The managed fields: this manager's entry (none when it applies
    // nothing); others as they were, less what was forced from them, empty
    // ones dropped; in kube-apiserver's order.
    let mine_entry = |time: Value| {
        let mut e = Map::new();
        e.insert("manager".into(), req.manager.into());
        e.insert("operation".into(), APPLY.into());
        e.insert("apiVersion".into(), req.api_version.into());
        e.insert("time".into(), time);
        e.insert("fieldsType".into(), "FieldsV1".into());
        e.insert("fieldsV1".into(), to_fields_v1(&new_fields));
        e
    };
    let old_time = mine.and_then(|i| entries[i].raw.get("time").cloned());
    let mut list: Vec<Map<String, Value>> = Vec::with_capacity(entries.len() + 1);
    for (i, mut e) in entries.drain(..).enumerate() {
        if Some(i) == mine {
            continue;
        }
        match &e.fields {
            Some(set) if set.is_empty() => continue,
            Some(set) => {
                e.raw.insert("fieldsV1".into(), to_fields_v1(set));
            }
            None => {}
        }
        list.push(e.raw);
    }
    let with_entry = |out: &Value, time: Option<Value>| -> Value {
        let mut list = list.clone();
        if !new_fields.is_empty() {
            list.push(mine_entry(time.unwrap_or_else(|| req.now.into())));
        }
        list.sort_by(entry_order);
        let mut out = if out.is_object() {
            out.clone()
        } else {
            Value::Object(Map::new())
        };
        if list.is_empty() {
            remove_at(&mut out, &["f:metadata".into(), "f:managedFields".into()]);
        } else {
            let list = list.into_iter().map(Value::Object).collect();
            set_at(
                &mut out,
                &["f:metadata".into(), "f:managedFields".into()],
                Value::Array(list),
            );
        }
        out
    };
    // The entry's time moves when the object does (kube-apiserver's
    // ManagedFieldsUpdater, less its timestamp-only changes): applying the
    // same configuration again changes nothing, and nothing is written.
    let kept_time = with_entry(&out, old_time);
    if kept_time == *live {
        return Ok(kept_time);
    }
    Ok(with_entry(&out, None))
}

/// kube-apiserver's apply conflict: 409 `Conflict`, a
/// `FieldManagerConflict` cause per field.
fn conflict_status(entries: &[Entry], conflicts: &[(usize, FieldPath)]) -> ApiStatus {
    let message = if let [(i, path)] = conflicts {
        format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            entries[*i].describe(),
            display_path(path)
        )
    } else {
        let mut by_manager: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for (i, path) in conflicts {
            by_manager
                .entry(entries[*i].describe())
                .or_default()
                .push(display_path(path));
        }
        let mut lines = Vec::new();
        for (manager, paths) in by_manager {
            lines.push(format!("conflicts with {manager}:"));
            lines.extend(paths.into_iter().map(|p| format!("- {p}")));
        }
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    let mut status = ApiStatus::conflict(message);
    for (i, path) in conflicts {
        status = status.with_field_cause(
            "FieldManagerConflict",
            &format!("conflict with {}", entries[*i].describe()),
            &display_path(path),
        );
    }
    status
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn req<'a>(applied: &'a Value, manager: &'a str, force: bool) -> ApplyRequest<'a> {
        ApplyRequest {
            applied,
            manager,
            force,
            api_version: "v1",
            now: "2026-11-27T00:00:00Z",
        }
    }

    fn managers(obj: &Value) -> Vec<(String, Value)> {
        obj["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["manager"].as_str().unwrap().to_string(),
                    e["fieldsV1"].clone(),
                )
            })
            .collect()
    }

    #[test]
    fn fields_of_an_applied_configuration() {
        let applied = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "namespace": "n", "labels": {"x": "1"}, "annotations": {}},
            "data": {"k": "v", "gone": null}, "binaryData": {}, "list": [1, 2]});
        let fields = applied_fields(&applied);
        let shown: Vec<String> = fields.iter().map(|p| display_path(p)).collect();
        assert_eq!(
            shown,
            [
                ".binaryData",
                ".data.k",
                ".list",
                ".metadata.annotations",
                ".metadata.labels.x"
            ]
        );
        let v1 = to_fields_v1(&fields);
        assert_eq!(
            v1,
            json!({"f:binaryData": {}, "f:data": {"f:k": {}}, "f:list": {},
                   "f:metadata": {"f:annotations": {}, "f:labels": {"f:x": {}}}})
        );
        assert_eq!(parse_fields_v1(&v1), Some(fields));
    }

    #[test]
    fn kube_apiserver_entries_are_read() {
        let v1 = json!({"f:spec": {"f:containers": {
            "k:{\"name\":\"c\"}": {".": {}, "f:image": {}, "f:name": {}}}}});
        let set = parse_fields_v1(&v1).unwrap();
        let shown: Vec<String> = set.iter().map(|p| display_path(p)).collect();
        assert_eq!(
            shown,
            [
                ".spec.containers[name=\"c\"]",
                ".spec.containers[name=\"c\"].image",
                ".spec.containers[name=\"c\"].name"
            ]
        );
        assert_eq!(to_fields_v1(&set), v1);
        assert_eq!(parse_fields_v1(&json!({"f:a": "x"})), None);
    }

    #[test]
    fn an_apply_removes_what_it_no_longer_applies() {
        let first = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "labels": {"x": "1", "y": "2"}}, "data": {"k": "v", "old": "o"}});
        let created = apply(None, &req(&first, "mgr", false)).unwrap();
        assert_eq!(created["data"], json!({"k": "v", "old": "o"}));
        // Someone else's field, written without apply, stays.
        let mut live = created.clone();
        live["data"]["theirs"] = json!("t");
        let second = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "labels": {"x": "1"}}, "data": {"k": "v2"}});
        let out = apply(Some(&live), &req(&second, "mgr", false)).unwrap();
        assert_eq!(out["data"], json!({"k": "v2", "theirs": "t"}));
        assert_eq!(out["metadata"]["labels"], json!({"x": "1"}));
        assert_eq!(
            managers(&out),
            [(
                "mgr".to_string(),
                json!({"f:data": {"f:k": {}}, "f:metadata": {"f:labels": {"f:x": {}}}})
            )]
        );
    }

    #[test]
    fn the_same_apply_again_changes_nothing() {
        let a = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a"}, "data": {"k": "v"}});
        let first = apply(None, &req(&a, "m", false)).unwrap();
        let later = ApplyRequest {
            now: "2030-01-01T00:00:00Z",
            ..req(&a, "m", false)
        };
        assert_eq!(apply(Some(&first), &later).unwrap(), first);
        // The same fields, another value: the object moved, so the time does.
        let c = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a"}, "data": {"k": "w"}});
        let changed = apply(
            Some(&first),
            &ApplyRequest {
                applied: &c,
                ..later
            },
        )
        .unwrap();
        assert_eq!(
            changed["metadata"]["managedFields"][0]["time"],
            "2030-01-01T00:00:00Z"
        );
        // New fields: a new time.
        let b = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a"}, "data": {"k": "v", "l": "w"}});
        let moved = apply(
            Some(&first),
            &ApplyRequest {
                applied: &b,
                ..later
            },
        )
        .unwrap();
        assert_eq!(
            moved["metadata"]["managedFields"][0]["time"],
            "2030-01-01T00:00:00Z"
        );
    }

    #[test]
    fn another_managers_field_conflicts_unless_forced() {
        let a = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a"}, "data": {"k": "v", "shared": "s"}});
        let live = apply(None, &req(&a, "alice", false)).unwrap();
        // The same value is shared, not a conflict.
        let b_same = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a"}, "data": {"shared": "s"}});
        let shared = apply(Some(&live), &req(&b_same, "bob", false)).unwrap();
        assert_eq!(managers(&shared).len(), 2);
        // Bob drops his claim: Alice still owns it, so it stays.
        let b_none = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"},
            "data": {"other": "o"}});
        let out = apply(Some(&shared), &req(&b_none, "bob", false)).unwrap();
        assert_eq!(out["data"]["shared"], "s");
        // A different value conflicts, naming the field and the manager.
        let b_diff = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a"}, "data": {"k": "mine"}});
        let err = apply(Some(&shared), &req(&b_diff, "bob", false)).unwrap_err();
        assert_eq!((err.code, err.reason), (409, "Conflict"));
        assert_eq!(
            err.message,
            "Apply failed with 1 conflict: conflict with \"alice\": .data.k"
        );
        let causes = &err.details.as_ref().unwrap().causes;
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].reason, "FieldManagerConflict");
        assert_eq!(causes[0].field, ".data.k");
        // Forced: the value and the field move to Bob.
        let out = apply(Some(&shared), &req(&b_diff, "bob", true)).unwrap();
        assert_eq!(out["data"]["k"], "mine");
        let m = managers(&out);
        assert_eq!(
            m[0],
            ("alice".to_string(), json!({"f:data": {"f:shared": {}}}))
        );
        assert_eq!(m[1], ("bob".to_string(), json!({"f:data": {"f:k": {}}})));
    }

    #[test]
    fn kube_apiserver_update_managers_are_named_as_it_names_them() {
        let live = json!({"metadata": {"name": "a", "managedFields": [
            {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "apps/v1",
             "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:spec": {"f:replicas": {}}, "f:status": {"f:ready": {}}}},
            {"manager": "odd", "operation": "Update", "fieldsType": "FieldsV2", "fieldsV2": {}}]},
            "spec": {"replicas": 3, "paused": false}, "status": {"ready": 1}});
        let applied = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "a"}, "spec": {"replicas": 5, "paused": true}});
        let err = apply(Some(&live), &req(&applied, "helm", false)).unwrap_err();
        assert_eq!(
            err.message,
            "Apply failed with 1 conflict: conflict with \"kube-controller-manager\" using apps/v1 at 2026-01-01T00:00:00Z: .spec.replicas"
        );
        let out = apply(Some(&live), &req(&applied, "helm", true)).unwrap();
        assert_eq!(out["spec"], json!({"replicas": 5, "paused": true}));
        assert_eq!(out["status"], json!({"ready": 1}));
        // Apply entries first, then Update ones by time (none is oldest).
        let entries = out["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(entries.len(), 3, "{entries:?}");
        assert_eq!(entries[0]["manager"], "helm");
        assert_eq!(entries[1]["fieldsType"], "FieldsV2", "kept untouched");
        assert_eq!(entries[2]["fieldsV1"], json!({"f:status": {"f:ready": {}}}));
    }

    /// kube-apiserver's `Update` entries own parents with `"."` (the labels
    /// map itself): a new label inside is no conflict, and the parent stays
    /// theirs. An empty map applied keeps what the live map holds.
    #[test]
    fn owning_a_map_is_not_owning_its_fields_and_empty_maps_merge() {
        let live = json!({"metadata": {"name": "a", "labels": {"app": "x"},
            "annotations": {"note": "n"},
            "managedFields": [{"manager": "kubectl-create", "operation": "Update",
                "apiVersion": "v1", "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}}}]},
            "status": {"phase": "Running"}});
        let applied = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "a", "labels": {"tier": "fe"}, "annotations": {}},
            "status": {}});
        let out = apply(Some(&live), &req(&applied, "m", false)).expect("no conflict");
        assert_eq!(out["metadata"]["labels"], json!({"app": "x", "tier": "fe"}));
        assert_eq!(out["metadata"]["annotations"], json!({"note": "n"}));
        assert_eq!(out["status"], json!({"phase": "Running"}));
        let entries = out["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(entries[0]["manager"], "m");
        assert_eq!(
            entries[1]["fieldsV1"],
            json!({"f:metadata": {"f:labels": {".": {}, "f:app": {}}}})
        );
        // A different value for their label conflicts; the same does not.
        let other = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "a", "labels": {"app": "y"}}});
        let err = apply(Some(&live), &req(&other, "m", false)).unwrap_err();
        assert!(
            err.message.ends_with(".metadata.labels.app"),
            "{}",
            err.message
        );
        // An empty map where there is none, or where a value is, sets it.
        let bare = json!({"metadata": {"name": "a", "labels": "odd"}});
        let out = apply(Some(&bare), &req(&applied, "m", false)).unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"tier": "fe"}));
        assert_eq!(out["status"], json!({}));
    }

    /// A manager that applies nothing any more has no entry; with no
    /// entries left there is no managedFields.
    #[test]
    fn a_manager_that_applies_nothing_has_no_entry() {
        let a = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a"}, "data": {"k": "v"}});
        let live = apply(None, &req(&a, "m", false)).unwrap();
        let nothing = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}});
        let out = apply(Some(&live), &req(&nothing, "m", false)).unwrap();
        assert_eq!(out["data"], json!({}));
        assert!(out["metadata"].get("managedFields").is_none(), "{out}");
    }

    #[test]
    fn nothing_odd_panics() {
        for live in [
            json!(null),
            json!([]),
            json!({"metadata": "x"}),
            json!({"metadata": {"managedFields": [1, {"fieldsType": "FieldsV1", "fieldsV1": 3}]}}),
            json!({"a": 1}),
        ] {
            for applied in [
                json!({"a": {"b": 1}}),
                json!({"metadata": {"labels": {"x": "y"}}}),
                json!(7),
            ] {
                let _ = apply(Some(&live), &req(&applied, "m", false));
                let _ = apply(Some(&live), &req(&applied, "m", true));
            }
        }
        let bad = json!({"metadata": {"managedFields": "x"}});
        assert_eq!(
            apply(Some(&bad), &req(&json!({}), "m", false))
                .unwrap_err()
                .code,
            500
        );
    }
}

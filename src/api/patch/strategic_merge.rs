//! A schema-less strategic merge patch (`application/strategic-merge-patch+json`),
//! enough for `kubectl apply`/`kubectl patch` on any resource.
//!
//! Without Go type metadata the merge key of a list is learnt from the
//! patch's own directives: `$setElementOrder/<field>` (which kubectl sends
//! with every merged list) or a `{"$patch": "delete", <key>: ..}` element.
//! Lists without such a directive are replaced, as in a JSON merge patch.
//! Supported directives: `$patch` (`replace`, `delete`, `merge`),
//! `$setElementOrder/<field>`, `$deleteFromPrimitiveList/<field>`,
//! `$retainKeys`. Directives are never stored.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

const SET_ORDER: &str = "$setElementOrder/";
const DELETE_PRIMITIVE: &str = "$deleteFromPrimitiveList/";

/// Applies `patch` to `target`.
pub fn apply(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = stripped(patch);
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        *target = stripped(patch);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else {
        return;
    };
    for (k, pv) in p {
        if k.starts_with('$') {
            continue;
        }
        match pv {
            Value::Null => {
                t.remove(k);
            }
            Value::Object(po) if po.get("$patch").and_then(Value::as_str) == Some("delete") => {
                t.remove(k);
            }
            Value::Object(_) => {
                let entry = t.entry(k.clone()).or_insert(Value::Null);
                apply(entry, pv);
            }
            Value::Array(items) => {
                let order = p.get(&format!("{SET_ORDER}{k}")).and_then(Value::as_array);
                let existing = t
                    .get(k)
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let merged = match merge_key(order, items) {
                    Some(ListKey::Field(f)) => merge_object_list(existing, items, &f, order),
                    Some(ListKey::Primitive) => merge_primitive_list(existing, items, order),
                    None => items.iter().map(stripped).collect(),
                };
                t.insert(k.clone(), Value::Array(merged));
            }
            other => {
                t.insert(k.clone(), other.clone());
            }
        }
    }
    for (k, v) in p {
        if let Some(field) = k.strip_prefix(SET_ORDER) {
            // Order given without a list patch: reorder what is there.
            if !p.contains_key(field)
                && let (Some(order), Some(Value::Array(list))) = (v.as_array(), t.get_mut(field))
            {
                let key = merge_key(Some(order), &[]);
                reorder(list, order, key.as_ref());
            }
        } else if let Some(field) = k.strip_prefix(DELETE_PRIMITIVE)
            && let (Some(gone), Some(Value::Array(list))) = (v.as_array(), t.get_mut(field))
        {
            let gone: HashSet<String> = gone.iter().map(identity).collect();
            list.retain(|x| !gone.contains(&identity(x)));
        }
    }
    if let Some(Value::Array(keep)) = p.get("$retainKeys") {
        let keep: HashSet<&str> = keep.iter().filter_map(Value::as_str).collect();
        t.retain(|k, _| keep.contains(k.as_str()));
    }
}

enum ListKey {
    Field(String),
    Primitive,
}

fn merge_key(order: Option<&Vec<Value>>, items: &[Value]) -> Option<ListKey> {
    if let Some(first) = order.and_then(|o| o.first()) {
        return match first {
            Value::Object(m) => m.keys().next().map(|k| ListKey::Field(k.clone())),
            _ => Some(ListKey::Primitive),
        };
    }
    items.iter().find_map(|i| {
        let m = i.as_object()?;
        m.get("$patch")?;
        m.keys()
            .find(|k| !k.starts_with('$'))
            .map(|k| ListKey::Field(k.clone()))
    })
}

fn merge_object_list(
    existing: Vec<Value>,
    items: &[Value],
    field: &str,
    order: Option<&Vec<Value>>,
) -> Vec<Value> {
    let replace = items.iter().any(|i| {
        i.get("$patch").and_then(Value::as_str) == Some("replace") && i.get(field).is_none()
    });
    // Deleted elements are left as `None` until the end, so positions in
    // `at` stay valid: each patch item costs one hash lookup, not a scan of
    // the list (a patch of n items on a list of n would be n^2).
    let mut result: Vec<Option<Value>> = if replace {
        Vec::new()
    } else {
        existing.into_iter().map(Some).collect()
    };
    let mut at: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, e) in result.iter().enumerate() {
        if let Some(k) = e.as_ref().and_then(|e| e.get(field)) {
            at.entry(identity(k)).or_default().push(i);
        }
    }
    for item in items {
        let Some(m) = item.as_object() else {
            result.push(Some(item.clone()));
            continue;
        };
        let Some(key) = m.get(field) else {
            if !replace {
                result.push(Some(stripped(item)));
            }
            continue;
        };
        let id = identity(key);
        let first = at.get(&id).and_then(|p| p.first().copied());
        match (m.get("$patch").and_then(Value::as_str), first) {
            (Some("delete"), _) => {
                for i in at.remove(&id).unwrap_or_default() {
                    result[i] = None;
                }
            }
            (Some("replace"), Some(i)) => result[i] = Some(stripped(item)),
            (_, Some(i)) => {
                if let Some(e) = &mut result[i] {
                    apply(e, item);
                }
            }
            (_, None) => {
                at.entry(id).or_default().push(result.len());
                result.push(Some(stripped(item)));
            }
        }
    }
    let mut result: Vec<Value> = result.into_iter().flatten().collect();
    if let Some(order) = order {
        reorder(&mut result, order, Some(&ListKey::Field(field.to_string())));
    }
    result
}

fn merge_primitive_list(
    existing: Vec<Value>,
    items: &[Value],
    order: Option<&Vec<Value>>,
) -> Vec<Value> {
    let mut seen: HashSet<String> = existing.iter().map(identity).collect();
    let mut result = existing;
    for i in items {
        if seen.insert(identity(i)) {
            result.push(i.clone());
        }
    }
    if let Some(order) = order {
        reorder(&mut result, order, Some(&ListKey::Primitive));
    }
    result
}

/// Sorts `list` so elements named in `order` come first, in that order;
/// the others keep their relative order after them. Each element's place
/// is looked up once (not per comparison, not by a scan of `order`).
fn reorder(list: &mut [Value], order: &[Value], key: Option<&ListKey>) {
    let ident = |v: &Value| -> Option<String> {
        match key {
            Some(ListKey::Field(f)) => v.get(f.as_str()).map(identity),
            _ => Some(identity(v)),
        }
    };
    let mut wanted: HashMap<String, usize> = HashMap::new();
    for (i, id) in order.iter().filter_map(ident).enumerate() {
        wanted.entry(id).or_insert(i);
    }
    list.sort_by_cached_key(|v| {
        ident(v)
            .and_then(|id| wanted.get(&id).copied())
            .unwrap_or(usize::MAX)
    });
}

/// A string equal for two values when they are equal as
/// `serde_json::Value`s (object keys in sorted order; only `0.0` and
/// `-0.0` differ here), to hash them.
fn identity(v: &Value) -> String {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(m) => {
                let mut fields: Vec<_> = m.iter().collect();
                fields.sort_unstable_by(|a, b| a.0.cmp(b.0));
                out.push('{');
                for (k, v) in fields {
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    write(v, out);
                    out.push(',');
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for v in a {
                    write(v, out);
                    out.push(',');
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(v, &mut out);
    out
}

/// `v` without any `$` directive keys.
pub fn stripped(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), stripped(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(stripped).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kubectl_apply_patch_merges_containers_by_name() {
        let mut pod = json!({"metadata": {"labels": {"app": "demo", "tier": "fe"}},
            "spec": {"containers": [{"name": "c", "image": "nginx:1", "ports": [1]}, {"name": "d", "image": "busybox"}]}});
        let patch = json!({
            "metadata": {"labels": {"tier": null}},
            "spec": {"$setElementOrder/containers": [{"name": "c"}, {"name": "d"}],
                     "containers": [{"name": "c", "image": "nginx:2"}]}
        });
        apply(&mut pod, &patch);
        assert_eq!(
            pod,
            json!({"metadata": {"labels": {"app": "demo"}},
                "spec": {"containers": [{"name": "c", "image": "nginx:2", "ports": [1]}, {"name": "d", "image": "busybox"}]}})
        );
    }

    #[test]
    fn delete_replace_order_and_primitives() {
        let mut v = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
            "finalizers": ["x", "y"], "m": {"k": 1, "j": 2}, "r": {"a": 1, "b": 2}}});
        let patch = json!({"spec": {
            "containers": [{"$patch": "delete", "name": "b"}, {"name": "z", "image": "i"}],
            "$setElementOrder/containers": [{"name": "z"}, {"name": "c"}, {"name": "a"}],
            "$deleteFromPrimitiveList/finalizers": ["x"],
            "m": {"$patch": "replace", "q": 3},
            "r": {"$retainKeys": ["a"], "a": 5}
        }});
        apply(&mut v, &patch);
        assert_eq!(
            v,
            json!({"spec": {"containers": [{"name": "z", "image": "i"}, {"name": "c"}, {"name": "a"}],
                "finalizers": ["y"], "m": {"q": 3}, "r": {"a": 5}}})
        );
        // lists without directives are replaced
        let mut v = json!({"args": ["a", "b"], "items": [{"name": "x", "v": 1}]});
        apply(&mut v, &json!({"args": ["c"], "items": [{"name": "y"}]}));
        assert_eq!(v, json!({"args": ["c"], "items": [{"name": "y"}]}));
        // a non-object patch replaces
        let mut v = json!({"a": 1});
        apply(&mut v, &json!([1]));
        assert_eq!(v, json!([1]));
    }

    #[test]
    fn merge_keys_compare_as_values() {
        assert_eq!(
            identity(&json!({"a": 1, "b": [1, "x"]})),
            identity(&json!({"b": [1, "x"], "a": 1}))
        );
        for (x, y) in [
            (json!(1), json!(1.0)),
            (json!("1"), json!(1)),
            (json!({"a": 1}), json!({"a": 2})),
            (json!([1, 2]), json!([2, 1])),
            (json!({"a,": 1}), json!({"a": ",1"})),
        ] {
            assert_ne!(x == y, identity(&x) != identity(&y), "{x} {y}");
        }
    }

    /// Long lists merge element by element, keep duplicates the list
    /// already had, and follow the order given.
    #[test]
    fn long_lists_merge_by_key() {
        let n = 20_000;
        let existing: Vec<Value> = (0..n)
            .map(|i| json!({"name": format!("c{i}"), "v": i}))
            .collect();
        let mut v = json!({"containers": existing, "tags": (0..n).collect::<Vec<_>>()});
        let items: Vec<Value> = (0..n)
            .rev()
            .map(|i| json!({"name": format!("c{i}"), "w": i}))
            .chain([
                json!({"name": "c0", "$patch": "delete"}),
                json!({"name": "new"}),
            ])
            .collect();
        let order: Vec<Value> = (1..n)
            .rev()
            .map(|i| json!({"name": format!("c{i}")}))
            .collect();
        let patch = json!({
            "containers": items,
            "$setElementOrder/containers": order,
            "tags": [n, 0, 1],
            "$setElementOrder/tags": (0..=n).rev().collect::<Vec<_>>(),
            "$deleteFromPrimitiveList/tags": [5],
        });
        apply(&mut v, &patch);
        let c = v["containers"].as_array().unwrap();
        assert_eq!(c.len(), n);
        for (at, i) in (1..n).rev().enumerate() {
            assert_eq!(c[at], json!({"name": format!("c{i}"), "v": i, "w": i}));
        }
        assert_eq!(c[n - 1], json!({"name": "new"}), "unordered last");
        let tags = v["tags"].as_array().unwrap();
        assert_eq!(tags.len(), n);
        assert_eq!(tags[0], json!(n));
        assert!(!tags.contains(&json!(5)));
        assert_eq!(tags[n - 1], json!(0));

        let mut v = json!({"c": [{"name": "a", "v": 1}, {"name": "a", "v": 2}, {"name": "b"}]});
        apply(
            &mut v,
            &json!({"c": [{"name": "a", "w": 3}, {"name": "b", "$patch": "delete"}], "$setElementOrder/c": [{"name": "a"}]}),
        );
        assert_eq!(
            v,
            json!({"c": [{"name": "a", "v": 1, "w": 3}, {"name": "a", "v": 2}]})
        );
    }
}

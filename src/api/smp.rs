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
            list.retain(|x| !gone.contains(x));
        }
    }
    if let Some(Value::Array(keep)) = p.get("$retainKeys") {
        t.retain(|k, _| keep.iter().any(|x| x.as_str() == Some(k)));
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
    let mut result = if replace { Vec::new() } else { existing };
    for item in items {
        let Some(m) = item.as_object() else {
            result.push(item.clone());
            continue;
        };
        let Some(key) = m.get(field) else {
            if !replace {
                result.push(stripped(item));
            }
            continue;
        };
        let pos = result.iter().position(|e| e.get(field) == Some(key));
        match (m.get("$patch").and_then(Value::as_str), pos) {
            (Some("delete"), _) => result.retain(|e| e.get(field) != Some(key)),
            (Some("replace"), Some(i)) => result[i] = stripped(item),
            (_, Some(i)) => apply(&mut result[i], item),
            (_, None) => result.push(stripped(item)),
        }
    }
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
    let mut result = existing;
    for i in items {
        if !result.contains(i) {
            result.push(i.clone());
        }
    }
    if let Some(order) = order {
        reorder(&mut result, order, Some(&ListKey::Primitive));
    }
    result
}

/// Sorts `list` so elements named in `order` come first, in that order;
/// the others keep their relative order after them.
fn reorder(list: &mut [Value], order: &[Value], key: Option<&ListKey>) {
    let ident = |v: &Value| -> Option<Value> {
        match key {
            Some(ListKey::Field(f)) => v.get(f.as_str()).cloned(),
            _ => Some(v.clone()),
        }
    };
    let wanted: Vec<Value> = order.iter().filter_map(ident).collect();
    list.sort_by_key(|v| {
        ident(v)
            .and_then(|id| wanted.iter().position(|w| *w == id))
            .unwrap_or(usize::MAX)
    });
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
}

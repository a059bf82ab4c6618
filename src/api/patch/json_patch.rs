//! JSON patch (RFC 6902) with kube-apiserver's limits: at most
//! [`MAX_JSON_PATCH_OPERATIONS`] operations, and the bytes `copy`
//! operations add bounded.

use ::json_patch::{Patch, PatchOperation};
use serde_json::Value;

use crate::api::status::ApiStatus;

/// kube-apiserver's `maxJSONPatchOperations`: more get 413.
pub const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

/// A JSON patch from its JSON: 400 when it is not one, 413 past
/// [`MAX_JSON_PATCH_OPERATIONS`].
pub fn parse(v: Value) -> Result<Patch, ApiStatus> {
    let p: Patch = serde_json::from_value(v)
        .map_err(|e| ApiStatus::bad_request(format!("the JSON patch is malformed: {e}")))?;
    if p.0.len() > MAX_JSON_PATCH_OPERATIONS {
        return Err(ApiStatus::too_large(format!(
            "The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {}",
            p.0.len()
        )));
    }
    Ok(p)
}

/// Applies a JSON patch (RFC 6902) to `doc`, a copy: on an error it is
/// dropped, so no undo is kept. A `copy` duplicates a subtree, so a few
/// dozen copies of a copy would grow a small object past any memory; like
/// kube-apiserver (`jsonpatch.AccumulatedCopySizeLimit`, set to the request
/// body limit), the bytes all copies add are summed and the patch is
/// refused (422) once they pass `copy_limit`.
pub fn apply(doc: &mut Value, ops: &[PatchOperation], copy_limit: usize) -> Result<(), ApiStatus> {
    let mut copied = 0usize;
    for (i, op) in ops.iter().enumerate() {
        if let PatchOperation::Copy(c) = op
            && let Some(from) = doc.pointer(c.from.as_str())
        {
            copied = copied.saturating_add(json_size(from));
            if copied > copy_limit {
                return Err(ApiStatus::invalid(format!(
                    "the JSON patch could not be applied: Unable to complete the copy, the accumulated size increase of copy is {copied}, exceeding the limit {copy_limit}"
                )));
            }
        }
        ::json_patch::patch_unsafe(doc, std::slice::from_ref(op)).map_err(|e| {
            ApiStatus::invalid(format!(
                "the JSON patch could not be applied: operation '/{i}' failed at path '{}': {}",
                e.path, e.kind
            ))
        })?;
    }
    Ok(())
}

/// The length of `v` as compact JSON, without writing it out.
fn json_size(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(0);
    // Writing a `Value` to a sink that never fails cannot fail.
    let _ = serde_json::to_writer(&mut n, v);
    n.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn patch(ops: Value) -> Patch {
        parse(ops).unwrap()
    }

    #[test]
    fn operations_apply_in_order() {
        let mut doc = json!({"a": 1});
        let p = patch(json!([
            {"op": "add", "path": "/b", "value": [1]},
            {"op": "copy", "from": "/b", "path": "/c"},
            {"op": "remove", "path": "/a"},
        ]));
        apply(&mut doc, &p.0, 1 << 20).unwrap();
        assert_eq!(doc, json!({"b": [1], "c": [1]}));
    }

    #[test]
    fn a_failed_operation_is_422_naming_its_index() {
        let mut doc = json!({"a": 1});
        let p = patch(json!([
            {"op": "add", "path": "/b", "value": 2},
            {"op": "remove", "path": "/missing"},
        ]));
        let e = apply(&mut doc, &p.0, 1 << 20).unwrap_err();
        assert_eq!(e.code, 422);
        assert!(
            e.message
                .contains("operation '/1' failed at path '/missing'"),
            "{}",
            e.message
        );
    }

    #[test]
    fn copies_are_bounded_by_the_bytes_they_add() {
        let big = "x".repeat(100);
        let ops = json!([
            {"op": "copy", "from": "/a", "path": "/b"},
            {"op": "copy", "from": "/a", "path": "/c"},
        ]);
        // Each copy adds `"xxx..."`, 102 bytes: two fit in 204, not in 203.
        let mut doc = json!({"a": big});
        apply(&mut doc, &patch(ops.clone()).0, 204).unwrap();
        let mut doc = json!({"a": big});
        let e = apply(&mut doc, &patch(ops).0, 203).unwrap_err();
        assert_eq!(e.code, 422);
        assert!(
            e.message
                .contains("accumulated size increase of copy is 204, exceeding the limit 203"),
            "{}",
            e.message
        );
        assert_eq!(json_size(&json!({"a": [1, "b"]})), r#"{"a":[1,"b"]}"#.len());
    }

    #[test]
    fn too_many_operations_are_413() {
        let op = json!({"op": "test", "path": "/a", "value": 1});
        let at_limit = Value::Array(vec![op.clone(); MAX_JSON_PATCH_OPERATIONS]);
        assert_eq!(parse(at_limit).unwrap().0.len(), MAX_JSON_PATCH_OPERATIONS);
        let over = Value::Array(vec![op; MAX_JSON_PATCH_OPERATIONS + 1]);
        assert_eq!(parse(over).unwrap_err().code, 413);
        assert_eq!(parse(json!({"op": "add"})).unwrap_err().code, 400);
    }
}

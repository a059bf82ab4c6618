//! The rules of an object's metadata on a write, as kube-apiserver's
//! `rest.BeforeCreate`/`BeforeUpdate` apply them: type meta filled or
//! checked, the name and namespace against the path, the server-owned fields
//! (uid, creationTimestamp, managedFields) stamped on a new object and
//! carried over on an update.

use serde_json::{Map, Value};

use crate::api::status::ApiStatus;
use crate::config::ResourceConfig;
use crate::object::{metadata_str, strip_resource_version};

/// Checks `apiVersion`/`kind` (filling them when absent) and that the body
/// is an object with an object `metadata`.
pub(crate) fn check_type_meta(obj: &mut Value, config: &ResourceConfig) -> Result<(), ApiStatus> {
    let api_version = config.api_version();
    let kind = config.kind.clone();
    let Some(map) = obj.as_object_mut() else {
        return Err(ApiStatus::bad_request(
            "the request body must be a JSON object",
        ));
    };
    fill_or_check(map, "apiVersion", "API version", api_version)?;
    fill_or_check(map, "kind", "kind", kind)?;
    match map.get("metadata") {
        None | Some(Value::Null) => {
            map.insert("metadata".into(), Value::Object(Map::new()));
        }
        Some(Value::Object(_)) => {}
        Some(_) => return Err(ApiStatus::bad_request("metadata must be a JSON object")),
    }
    Ok(())
}

/// Sets `field` to `expected` when it is absent, null or empty; any other
/// value than `expected` is a 400.
fn fill_or_check(
    map: &mut Map<String, Value>,
    field: &str,
    what: &str,
    expected: String,
) -> Result<(), ApiStatus> {
    match map.get(field) {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) if *s == expected => return Ok(()),
        Some(other) => {
            return Err(ApiStatus::bad_request(format!(
                "the {what} in the data ({}) does not match the expected {what} ({expected})",
                other.as_str().unwrap_or("?")
            )));
        }
    }
    map.insert(field.into(), Value::String(expected));
    Ok(())
}

pub(crate) fn meta_mut(obj: &mut Value) -> Result<&mut Map<String, Value>, ApiStatus> {
    crate::object::metadata_mut(obj)
        .ok_or_else(|| ApiStatus::bad_request("metadata must be a JSON object"))
}

/// A string field of the body's metadata: absent/null -> None; non-string -> 400.
pub(crate) fn meta_string(obj: &Value, field: &str) -> Result<Option<String>, ApiStatus> {
    match obj.get("metadata").and_then(|m| m.get(field)) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiStatus::bad_request(format!(
            "metadata.{field} must be a string"
        ))),
    }
}

/// A `422 Invalid` for `field` of the object `name` of `c`'s kind when
/// `errs` (a validation's findings) is not empty, as kube-apiserver's
/// `NewInvalid` words it: `ConfigMap "Not_Valid" is invalid: metadata.name:
/// Invalid value: ...` (several errors in brackets), with `details` naming
/// the object and one `FieldValueInvalid` cause per error.
pub(crate) fn invalid_field(
    c: &ResourceConfig,
    name: &str,
    field: &str,
    value: &str,
    errs: Vec<String>,
) -> Result<(), ApiStatus> {
    if errs.is_empty() {
        return Ok(());
    }
    let bodies: Vec<String> = errs
        .iter()
        .map(|e| format!("Invalid value: {value:?}: {e}"))
        .collect();
    let full: Vec<String> = bodies.iter().map(|b| format!("{field}: {b}")).collect();
    let aggregate = match full.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    let qualified = if c.group.is_empty() {
        c.kind.clone()
    } else {
        format!("{}.{}", c.kind, c.group)
    };
    let mut status = ApiStatus::invalid(format!("{qualified} {name:?} is invalid: {aggregate}"))
        .with_details(name, &c.kind)
        .with_group(&c.group);
    for body in &bodies {
        status = status.with_field_cause("FieldValueInvalid", body, field);
    }
    Err(status)
}

pub(crate) fn validate_name(c: &ResourceConfig, name: &str) -> Result<(), ApiStatus> {
    invalid_field(
        c,
        name,
        "metadata.name",
        name,
        crate::object::validation::object_name_errors(&c.group, &c.plural, name),
    )
}

/// The namespace in the body must match the path (filled when absent);
/// cluster-scoped objects carry none.
pub(crate) fn reconcile_namespace(
    obj: &mut Value,
    namespace: Option<&str>,
) -> Result<(), ApiStatus> {
    let body_ns = meta_string(obj, "namespace")?;
    let meta = meta_mut(obj)?;
    match (namespace, body_ns.as_deref()) {
        (Some(ns), None) | (Some(ns), Some("")) => {
            meta.insert("namespace".into(), Value::String(ns.to_string()));
        }
        (Some(ns), Some(b)) if b == ns => {}
        (Some(ns), Some(b)) => {
            return Err(ApiStatus::bad_request(format!(
                "the namespace of the provided object ({b}) does not match the namespace sent on the request ({ns})"
            )));
        }
        (None, _) => {
            meta.remove("namespace");
        }
    }
    Ok(())
}

/// The 400 for a body whose name is not the one on the URL.
pub(crate) fn name_mismatch(body_name: &str, path_name: &str) -> ApiStatus {
    ApiStatus::bad_request(format!(
        "the name of the object ({body_name}) does not match the name on the URL ({path_name})"
    ))
}

/// The server-owned fields of a new object: a fresh uid, created `now`.
pub(crate) fn stamp_new(obj: &mut Value, now: &str) -> Result<(), ApiStatus> {
    let meta = meta_mut(obj)?;
    meta.insert(
        "uid".into(),
        Value::String(uuid::Uuid::new_v4().to_string()),
    );
    meta.insert("creationTimestamp".into(), Value::String(now.to_string()));
    Ok(())
}

/// Copies the server-owned fields (uid, creationTimestamp) of `current` into
/// `obj` and strips resourceVersion. `managedFields` left out of `obj` (or
/// null) are kept, as kube-apiserver keeps them for an update that does not
/// send them (kubectl replace); `[]` and `[{}]` clear them, as there.
pub(crate) fn carry_system_fields(obj: &mut Value, current: &Value) -> Result<(), ApiStatus> {
    let uid = metadata_str(current, "uid").map(str::to_string);
    let created = metadata_str(current, "creationTimestamp").map(str::to_string);
    let meta = meta_mut(obj)?;
    match meta.get("managedFields") {
        // Not sent (or null): the stored entries stay (copied only then).
        None | Some(Value::Null) => {
            match current.get("metadata").and_then(|m| m.get("managedFields")) {
                Some(m) => meta.insert("managedFields".into(), m.clone()),
                None => meta.remove("managedFields"),
            }
        }
        // `[]` or `[{}]`: kube-apiserver's way to clear them.
        Some(Value::Array(a)) if a.iter().all(|e| e.as_object().is_some_and(Map::is_empty)) => {
            meta.remove("managedFields")
        }
        Some(_) => None,
    };
    match uid {
        Some(u) => meta.insert("uid".into(), Value::String(u)),
        None => meta.remove("uid"),
    };
    match created {
        Some(c) => meta.insert("creationTimestamp".into(), Value::String(c)),
        None => meta.remove("creationTimestamp"),
    };
    strip_resource_version(obj);
    Ok(())
}

pub(crate) fn now_rfc3339() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pods() -> ResourceConfig {
        crate::object::tests::resource(true, &[])
    }

    #[test]
    fn type_meta_is_filled_when_absent_and_checked_when_sent() {
        let mut obj = json!({"metadata": null});
        check_type_meta(&mut obj, &pods()).unwrap();
        assert_eq!(
            obj,
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {}})
        );
        let mut empty = json!({"apiVersion": "", "kind": "Pod", "metadata": {"name": "a"}});
        check_type_meta(&mut empty, &pods()).unwrap();
        assert_eq!(empty["apiVersion"], "v1");
        assert_eq!(empty["metadata"]["name"], "a");
        let e = check_type_meta(&mut json!({"kind": "Service"}), &pods()).unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "the kind in the data (Service) does not match the expected kind (Pod)"
        );
        let e = check_type_meta(&mut json!({"apiVersion": "apps/v1"}), &pods()).unwrap_err();
        assert!(
            e.message.contains("API version in the data (apps/v1)"),
            "{}",
            e.message
        );
        for bad in [json!([]), json!("pod"), json!({"metadata": []})] {
            let e = check_type_meta(&mut bad.clone(), &pods()).unwrap_err();
            assert_eq!(e.code, 400, "{bad}");
        }
    }

    #[test]
    fn namespace_is_filled_from_the_path_and_must_match_it() {
        let mut obj = json!({"metadata": {}});
        reconcile_namespace(&mut obj, Some("ns1")).unwrap();
        assert_eq!(obj["metadata"]["namespace"], "ns1");
        let mut empty = json!({"metadata": {"namespace": ""}});
        reconcile_namespace(&mut empty, Some("ns1")).unwrap();
        assert_eq!(empty["metadata"]["namespace"], "ns1");
        let mut same = json!({"metadata": {"namespace": "ns1"}});
        reconcile_namespace(&mut same, Some("ns1")).unwrap();
        let e = reconcile_namespace(
            &mut json!({"metadata": {"namespace": "other"}}),
            Some("ns1"),
        )
        .unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "the namespace of the provided object (other) does not match the namespace sent on the request (ns1)"
        );
        // Cluster-scoped: whatever the body says, no namespace is stored.
        let mut cluster = json!({"metadata": {"namespace": "ns1"}});
        reconcile_namespace(&mut cluster, None).unwrap();
        assert_eq!(cluster, json!({"metadata": {}}));
        let e = reconcile_namespace(&mut json!({"metadata": {"namespace": 1}}), None).unwrap_err();
        assert_eq!(e.message, "metadata.namespace must be a string");
    }

    #[test]
    fn name_mismatch_names_both() {
        let e = name_mismatch("a", "b");
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "the name of the object (a) does not match the name on the URL (b)"
        );
    }

    #[test]
    fn metadata_strings_and_field_errors() {
        let obj = json!({"metadata": {"name": "a", "uid": null, "generation": 1}});
        assert_eq!(meta_string(&obj, "name").unwrap().as_deref(), Some("a"));
        assert_eq!(meta_string(&obj, "uid").unwrap(), None);
        assert_eq!(meta_string(&obj, "absent").unwrap(), None);
        assert_eq!(
            meta_string(&obj, "generation").unwrap_err().message,
            "metadata.generation must be a string"
        );
        assert!(invalid_field(&pods(), "a", "metadata.name", "a", Vec::new()).is_ok());
        let e =
            invalid_field(&pods(), "A_", "metadata.name", "A_", vec!["one".into()]).unwrap_err();
        assert_eq!(e.code, 422);
        assert_eq!(
            e.message,
            r#"Pod "A_" is invalid: metadata.name: Invalid value: "A_": one"#
        );
        let details = e.details.as_deref().expect("details");
        assert_eq!(
            (
                details.name.as_deref(),
                details.kind.as_deref(),
                details.group.as_deref()
            ),
            (Some("A_"), Some("Pod"), None)
        );
        assert_eq!(details.causes.len(), 1);
        assert_eq!(details.causes[0].reason, "FieldValueInvalid");
        assert_eq!(details.causes[0].message, r#"Invalid value: "A_": one"#);
        assert_eq!(details.causes[0].field, "metadata.name");
        let e = invalid_field(
            &pods(),
            "A_",
            "metadata.name",
            "A_",
            vec!["one".into(), "two".into()],
        )
        .unwrap_err();
        assert_eq!(
            e.message,
            r#"Pod "A_" is invalid: [metadata.name: Invalid value: "A_": one, metadata.name: Invalid value: "A_": two]"#
        );
        assert!(validate_name(&pods(), "web-1").is_ok());
        assert_eq!(validate_name(&pods(), "Web_1").unwrap_err().code, 422);
    }

    #[test]
    fn a_new_object_gets_a_fresh_uid_and_its_creation_time() {
        let mut a = json!({"metadata": {"uid": "sent", "creationTimestamp": "sent"}});
        let mut b = json!({"metadata": {}});
        stamp_new(&mut a, "2024-01-02T03:04:05Z").unwrap();
        stamp_new(&mut b, "2024-01-02T03:04:05Z").unwrap();
        let uid = a["metadata"]["uid"].as_str().unwrap();
        assert_ne!(uid, "sent");
        assert!(uuid::Uuid::parse_str(uid).is_ok(), "{uid}");
        assert_ne!(a["metadata"]["uid"], b["metadata"]["uid"]);
        assert_eq!(a["metadata"]["creationTimestamp"], "2024-01-02T03:04:05Z");
        assert!(stamp_new(&mut json!({"metadata": 1}), "now").is_err());
        let now = now_rfc3339();
        assert!(chrono::DateTime::parse_from_rfc3339(&now).is_ok(), "{now}");
    }

    #[test]
    fn an_update_carries_the_stored_system_fields() {
        let current = json!({"metadata": {
            "uid": "u1",
            "creationTimestamp": "t1",
            "resourceVersion": "5",
            "managedFields": [{"manager": "kubectl"}],
        }});
        // The body's uid, creationTimestamp and resourceVersion give way.
        let mut obj = json!({"metadata": {
            "name": "a",
            "uid": "u2",
            "creationTimestamp": "t2",
            "resourceVersion": "4",
        }});
        carry_system_fields(&mut obj, &current).unwrap();
        assert_eq!(
            obj,
            json!({"metadata": {
                "name": "a",
                "uid": "u1",
                "creationTimestamp": "t1",
                "managedFields": [{"manager": "kubectl"}],
            }})
        );
        // managedFields: null keeps them, [] and [{}] clear them, others stay.
        for (sent, kept) in [
            (json!(null), Some(json!([{"manager": "kubectl"}]))),
            (json!([]), None),
            (json!([{}]), None),
            (json!([{"manager": "me"}]), Some(json!([{"manager": "me"}]))),
        ] {
            let mut obj = json!({"metadata": {"managedFields": sent.clone()}});
            carry_system_fields(&mut obj, &current).unwrap();
            assert_eq!(
                obj["metadata"].get("managedFields"),
                kept.as_ref(),
                "{sent}"
            );
        }
        // Fields the stored object lacks are not invented (nor kept).
        let mut obj = json!({"metadata": {"uid": "u2", "creationTimestamp": "t2"}});
        carry_system_fields(&mut obj, &json!({"metadata": {}})).unwrap();
        assert_eq!(obj, json!({"metadata": {}}));
    }
}

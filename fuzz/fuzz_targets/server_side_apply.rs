//! Server-side apply's merge over any stored object and any applied
//! configuration (the first and second JSON values of the input; a third
//! byte picks force). No panic; and when it succeeds, the result holds every
//! value the configuration sets (an empty map: a map there), and the
//! manager has an entry exactly when it applies something.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use watchcache::api::patch::field_manager::{ApplyRequest, applied_fields, apply};

fuzz_target!(|data: &[u8]| {
    let mut values = serde_json::Deserializer::from_slice(data).into_iter::<Value>();
    let (Some(Ok(live)), Some(Ok(applied))) = (values.next(), values.next()) else {
        return;
    };
    // The handler refuses a configuration whose metadata is not a map.
    if applied.get("metadata").is_some_and(|m| !m.is_object()) {
        return;
    }
    let force = data.last().is_some_and(|b| b & 1 == 1);
    let req = ApplyRequest {
        applied: &applied,
        manager: "fuzz",
        force,
        api_version: "v1",
        now: "2026-11-27T00:00:00Z",
    };
    let Ok(out) = apply(Some(&live), &req) else {
        return;
    };
    let fields = applied_fields(&applied);
    for p in &fields {
        let at = |v: &Value| {
            p.iter()
                .try_fold(v, |v, seg| v.get(seg.strip_prefix("f:")?))
                .cloned()
        };
        match at(&applied) {
            Some(Value::Object(m)) if m.is_empty() => {
                assert!(at(&out).is_some_and(|v| v.is_object()), "{p:?}: a map")
            }
            want => assert_eq!(at(&out), want, "{p:?}"),
        }
    }
    let entry = out
        .get("metadata")
        .and_then(|m| m.get("managedFields"))
        .and_then(Value::as_array)
        .is_some_and(|l| {
            l.iter()
                .any(|e| e["manager"] == "fuzz" && e["operation"] == "Apply")
        });
    assert_eq!(entry, !fields.is_empty(), "{out}");
});

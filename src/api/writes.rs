//! The write verbs of the REST API: create, update (replace), patch and
//! delete. Every write goes to etcd through [`Storage`](crate::storage::Storage)
//! (never into the cache); responses carry the new resourceVersion.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::Request;
use hyper::Response;
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE};
use hyper::http::request::Parts;
use serde_json::{Map, Value};

use crate::cacher::GetRequest;
use crate::config::StorageEncoding;
use crate::object::protobuf;
use crate::object::validation::is_dns1123_label;
use crate::object::{metadata_str, set_resource_version, strip_resource_version};
use crate::storage::{Preconditions, StorageError, StoredObject, UpdateAction, WriteOptions};

use super::errors::{UpdateError, What, storage_status, update_status};
use super::field_manager;
use super::k8s::{Target, json_value};
use super::params::{Query, media_type, parse_resource_version};
use super::{ApiStatus, Body, Resource, State, json_response};

/// Characters of a generateName suffix (Kubernetes' alphabet, no vowels).
const GENERATE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
const GENERATE_SUFFIX_LEN: usize = 5;
const GENERATE_ATTEMPTS: usize = 3;
pub(crate) async fn read_body(
    state: &State,
    req: Request<Incoming>,
) -> Result<(Parts, Bytes), ApiStatus> {
    let max = state.config.server.max_body_bytes;
    let (parts, body) = req.into_parts();
    // The rest of the body is left unread: an HTTP/1.x connection cannot
    // carry another request after it, so the answer says so (as Go's
    // net/http does for a request over its limit); without it the client
    // could send its next request on a connection being closed.
    let http1 = parts.version < hyper::Version::HTTP_2;
    let too_large = || {
        let s = ApiStatus::too_large(format!(
            "the request body is larger than the limit of {max} bytes"
        ));
        if http1 { s.with_close_connection() } else { s }
    };
    if let Some(len) = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        && len > max as u64
    {
        return Err(too_large());
    }
    let wait = Duration::from_millis(state.config.server.request_body_timeout_ms);
    let Ok(read) = tokio::time::timeout(wait, Limited::new(body, max).collect()).await else {
        let s = ApiStatus::new(
            408,
            "Timeout",
            format!("the request body did not arrive within {wait:?}"),
        );
        return Err(if http1 { s.with_close_connection() } else { s });
    };
    match read {
        Ok(c) => Ok((parts, c.to_bytes())),
        Err(e) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                Err(too_large())
            } else {
                Err(ApiStatus::bad_request(format!(
                    "cannot read the request body: {e}"
                )))
            }
        }
    }
}

/// Create and update bodies must be JSON.
fn check_json_content_type(parts: &Parts) -> Result<(), ApiStatus> {
    let ct = media_type(
        parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    );
    match ct.as_deref() {
        None | Some("") | Some("application/json") | Some("*/*") => Ok(()),
        Some(other) => Err(ApiStatus::unsupported_media_type(format!(
            "the body of the request was in an unknown format - accepted media types include: application/json (got {other})"
        ))),
    }
}

pub(crate) fn parse_json(body: &[u8]) -> Result<Value, ApiStatus> {
    serde_json::from_slice(body)
        .map_err(|e| ApiStatus::bad_request(format!("the request body is not valid JSON: {e}")))
}

/// Checks `apiVersion`/`kind` (filling them when absent) and that the body
/// is an object with an object `metadata`.
pub(crate) fn check_type_meta(obj: &mut Value, res: &Resource) -> Result<(), ApiStatus> {
    let api_version = res.config.api_version();
    let kind = res.config.kind.clone();
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

fn meta_mut(obj: &mut Value) -> Result<&mut Map<String, Value>, ApiStatus> {
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

/// A `422 Invalid` for `field` when `errs` (a validation's findings) is not
/// empty, worded as kube-apiserver's field errors.
fn invalid_field(field: &str, value: &str, errs: Vec<String>) -> Result<(), ApiStatus> {
    if errs.is_empty() {
        return Ok(());
    }
    let msgs: Vec<String> = errs
        .iter()
        .map(|e| format!("{field}: Invalid value: {value:?}: {e}"))
        .collect();
    Err(ApiStatus::invalid(msgs.join(", ")))
}

fn validate_name(res: &Resource, name: &str) -> Result<(), ApiStatus> {
    let c = &res.config;
    invalid_field(
        "metadata.name",
        name,
        crate::object::validation::object_name_errors(&c.group, &c.plural, name),
    )
}

/// The namespace in the body must match the path (filled when absent);
/// cluster-scoped objects carry none.
fn reconcile_namespace(obj: &mut Value, target: &Target<'_>) -> Result<(), ApiStatus> {
    let body_ns = meta_string(obj, "namespace")?;
    let meta = meta_mut(obj)?;
    match (target.namespace, body_ns.as_deref()) {
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

fn write_options(res: &Resource, dry_run: bool) -> WriteOptions {
    WriteOptions {
        ttl_seconds: res.config.ttl_seconds,
        dry_run,
    }
}

/// The stored form of an object: JSON, or kube-apiserver's protobuf when the
/// resource is configured with `storage_encoding = "protobuf"`.
fn to_bytes(res: &Resource, obj: &Value) -> Result<Bytes, ApiStatus> {
    match res.config.storage_encoding {
        StorageEncoding::Json => serde_json::to_vec(obj)
            .map(Bytes::from)
            .map_err(|e| ApiStatus::internal(format!("cannot encode the object: {e}"))),
        StorageEncoding::Protobuf => {
            protobuf::encode_as(obj, &res.config.api_version(), &res.config.kind)
                .map(Bytes::from)
                .map_err(|e| match e {
                    // The object does not fit the type's schema: the client's fault.
                    protobuf::ProtobufError::Json { .. } => ApiStatus::bad_request(format!(
                        "the object does not fit the {} schema: {e}",
                        res.config.kind
                    )),
                    other => ApiStatus::internal(format!("cannot encode the object: {other}")),
                })
        }
    }
}

/// The JSON answer for a stored object: its value with
/// `metadata.resourceVersion` = mod_revision (none for a dry-run create).
fn stored_response(code: u16, res: &Resource, stored: &StoredObject) -> Response<Body> {
    if stored.mod_revision == 0 {
        // A dry-run create: the value it would store, which may be
        // protobuf (`storage_encoding`), served as JSON like any other;
        // no resourceVersion, as nothing was written.
        return match crate::object::parse_stored_value(&stored.key, &stored.value) {
            Ok(v) => json_value(code, &v),
            Err(_) => json_response(code, stored.value.clone()),
        };
    }
    match res.cacher.codec().decode(
        &stored.key,
        &stored.value,
        stored.mod_revision,
        stored.create_revision,
    ) {
        Ok(obj) => json_response(code, obj.wire),
        Err(_) => {
            // Not decodable by the codec (should not happen for what we
            // wrote); inject the RV by hand.
            match crate::object::parse_stored_value(&stored.key, &stored.value) {
                Ok(mut v) => {
                    set_resource_version(&mut v, stored.mod_revision);
                    json_value(code, &v)
                }
                Err(_) => json_response(code, stored.value.clone()),
            }
        }
    }
}

/// The cached object as a `StoredObject` suggestion for a GuaranteedUpdate
/// (its value without the injected resourceVersion).
async fn suggestion(target: &Target<'_>, key: &str) -> Option<StoredObject> {
    let req = GetRequest {
        namespace: target.namespace,
        name: target.name?,
        resource_version: Some(0),
    };
    let obj = target.resource.cacher.get(&req).await.ok()?;
    let mut v: Value = serde_json::from_slice(&obj.wire).ok()?;
    strip_resource_version(&mut v);
    let value = Bytes::from(serde_json::to_vec(&v).ok()?);
    Some(StoredObject {
        key: key.to_string(),
        value,
        mod_revision: obj.mod_revision,
        create_revision: obj.create_revision,
        version: 0,
        lease: 0,
    })
}

fn now_rfc3339() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn generate_name(prefix: &str) -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    let mut s = String::with_capacity(prefix.len() + GENERATE_SUFFIX_LEN);
    // Kubernetes truncates the prefix so the result stays a valid name.
    let max_prefix = 253 - GENERATE_SUFFIX_LEN;
    s.push_str(if prefix.len() > max_prefix {
        prefix.get(..max_prefix).unwrap_or(prefix)
    } else {
        prefix
    });
    for _ in 0..GENERATE_SUFFIX_LEN {
        let i = rng.random_range(0..GENERATE_ALPHABET.len());
        s.push(char::from(GENERATE_ALPHABET[i]));
    }
    s
}

// ---------------------------------------------------------------------------
// Writes

pub(crate) async fn create(
    state: &State,
    target: &Target<'_>,
    query: &Query,
    parts: &Parts,
    body: Bytes,
) -> Result<Response<Body>, ApiStatus> {
    check_json_content_type(parts)?;
    let dry_run = query.dry_run()?;
    let res = target.resource;
    let mut obj = parse_json(&body)?;
    check_type_meta(&mut obj, res)?;
    reconcile_namespace(&mut obj, target)?;
    if let Some(ns) = &target.namespace {
        invalid_field("metadata.namespace", ns, is_dns1123_label(ns))?;
    }
    let name = meta_string(&obj, "name")?.filter(|n| !n.is_empty());
    let generate = meta_string(&obj, "generateName")?.filter(|n| !n.is_empty());
    let attempts = if name.is_none() && generate.is_some() {
        GENERATE_ATTEMPTS
    } else {
        1
    };
    if name.is_none() && generate.is_none() {
        return Err(ApiStatus::invalid(
            "metadata.name: Required value: name or generateName is required",
        ));
    }
    stamp_new(&mut obj, &now_rfc3339())?;
    strip_resource_version(&mut obj);
    let opts = write_options(res, dry_run);
    let mut last = None;
    for _ in 0..attempts {
        let name = match (&name, &generate) {
            (Some(n), _) => n.clone(),
            (None, Some(g)) => generate_name(g),
            (None, None) => unreachable_name()?,
        };
        validate_name(res, &name)?;
        meta_mut(&mut obj)?.insert("name".into(), Value::String(name.clone()));
        let key = res.cacher.codec().key(target.namespace, &name);
        let what = What {
            name: Some(name.clone()),
            ..target.what()
        };
        match state
            .storage
            .create(&key, to_bytes(res, &obj)?, &opts)
            .await
        {
            Ok(stored) => return Ok(stored_response(201, res, &stored)),
            Err(e @ StorageError::AlreadyExists { .. }) if attempts > 1 => {
                last = Some(storage_status(e, &what));
            }
            Err(e) => return Err(storage_status(e, &what)),
        }
    }
    Err(last.unwrap_or_else(|| ApiStatus::internal("create failed")))
}

fn unreachable_name() -> Result<String, ApiStatus> {
    Err(ApiStatus::invalid(
        "metadata.name: Required value: name or generateName is required",
    ))
}

/// The body of an update, checked against the path: name must match,
/// namespace must match (filled when absent), type meta must match.
fn prepare_update_body(body: &[u8], target: &Target<'_>) -> Result<Value, ApiStatus> {
    let mut obj = parse_json(body)?;
    check_type_meta(&mut obj, target.resource)?;
    let path_name = target.name.unwrap_or_default();
    match meta_string(&obj, "name")? {
        Some(n) if n == path_name => {}
        other => return Err(name_mismatch(&other.unwrap_or_default(), path_name)),
    }
    reconcile_namespace(&mut obj, target)?;
    Ok(obj)
}

/// The 400 for a body whose name is not the one on the URL.
fn name_mismatch(body_name: &str, path_name: &str) -> ApiStatus {
    ApiStatus::bad_request(format!(
        "the name of the object ({body_name}) does not match the name on the URL ({path_name})"
    ))
}

/// The server-owned fields of a new object: a fresh uid, created `now`.
fn stamp_new(obj: &mut Value, now: &str) -> Result<(), ApiStatus> {
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
fn carry_system_fields(obj: &mut Value, current: &Value) -> Result<(), ApiStatus> {
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

/// Runs `f` inside a GuaranteedUpdate, starting from the cached object.
/// `f` answers with the request's own errors or the store's (a conflict);
/// either way, on a stale suggestion the store retries on fresh state.
async fn guaranteed_update<F>(
    state: &State,
    target: &Target<'_>,
    key: &str,
    preconditions: &Preconditions,
    opts: &WriteOptions,
    mut f: F,
) -> Result<StoredObject, ApiStatus>
where
    F: FnMut(&StoredObject) -> Result<Bytes, UpdateError> + Send,
{
    let suggestion = suggestion(target, key).await;
    state
        .storage
        .guaranteed_update(key, preconditions, suggestion, opts, |cur| {
            f(cur).map(UpdateAction::Update)
        })
        .await
        .map_err(|e| update_status(e, &target.what()))
}

fn parse_stored(cur: &StoredObject) -> Result<Value, ApiStatus> {
    crate::object::parse_stored_value(&cur.key, &cur.value)
        .map_err(|e| ApiStatus::internal(format!("the stored object cannot be read: {e}")))
}

const MODIFIED: &str =
    "the object has been modified; please apply your changes to the latest version and try again";

pub(crate) async fn update(
    state: &State,
    target: &Target<'_>,
    query: &Query,
    parts: &Parts,
    body: Bytes,
) -> Result<Response<Body>, ApiStatus> {
    check_json_content_type(parts)?;
    let dry_run = query.dry_run()?;
    let res = target.resource;
    let obj = prepare_update_body(&body, target)?;
    let rv = parse_resource_version(meta_string(&obj, "resourceVersion")?.as_deref())?
        .filter(|rv| *rv > 0);
    let body_uid = meta_string(&obj, "uid")?.filter(|u| !u.is_empty());
    let name = target.name.unwrap_or_default();
    let key = res.cacher.codec().key(target.namespace, name);
    let opts = write_options(res, dry_run);
    let what = target.what();
    let preconditions = Preconditions {
        uid: body_uid,
        resource_version: None,
    };

    let stored = match rv {
        Some(rv) => {
            // CAS on the given resourceVersion. The current object (for uid
            // and creationTimestamp) comes from the cache when it is at
            // exactly that revision, else from etcd.
            let (current, from_cache) = match suggestion(target, &key).await {
                Some(s) if s.mod_revision == rv => (s, true),
                _ => (
                    state
                        .storage
                        .get(&key, 0)
                        .await
                        .map_err(|e| storage_status(e, &what))?,
                    false,
                ),
            };
            if current.mod_revision != rv {
                return Err(storage_status(
                    StorageError::conflict(&key, MODIFIED),
                    &what,
                ));
            }
            preconditions
                .check(&key, &current)
                .map_err(|e| storage_status(e, &what))?;
            let mut obj = obj;
            carry_system_fields(&mut obj, &parse_stored(&current)?)?;
            let value = to_bytes(res, &obj)?;
            if value == current.value {
                // Nothing to write, so no compare-and-swap proves `rv` is
                // still current: a cached object may be behind etcd. As
                // kube-apiserver's GuaranteedUpdate does for a no-op on a
                // cached suggestion, etcd is asked before answering.
                if from_cache {
                    let fresh = state
                        .storage
                        .get(&key, 0)
                        .await
                        .map_err(|e| storage_status(e, &what))?;
                    if fresh.mod_revision != rv {
                        return Err(storage_status(
                            StorageError::conflict(&key, MODIFIED),
                            &what,
                        ));
                    }
                }
                current
            } else {
                state
                    .storage
                    .update(&key, value, rv, &opts)
                    .await
                    .map_err(|e| storage_status(e, &what))?
            }
        }
        None => {
            guaranteed_update(state, target, &key, &preconditions, &opts, |cur| {
                let mut new = obj.clone();
                carry_system_fields(&mut new, &parse_stored(cur)?)?;
                Ok(to_bytes(res, &new)?)
            })
            .await?
        }
    };
    Ok(stored_response(200, res, &stored))
}

enum PatchKind {
    Merge(Value),
    Strategic(Value),
    Json(json_patch::Patch),
}

/// kube-apiserver's `maxJSONPatchOperations`: more get 413.
const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

/// Applies a JSON patch (RFC 6902) to `doc`, a copy: on an error it is
/// dropped, so no undo is kept. A `copy` duplicates a subtree, so a few
/// dozen copies of a copy would grow a small object past any memory; like
/// kube-apiserver (`jsonpatch.AccumulatedCopySizeLimit`, set to the request
/// body limit), the bytes all copies add are summed and the patch is
/// refused (422) once they pass `copy_limit`.
fn apply_json_patch(
    doc: &mut Value,
    ops: &[json_patch::PatchOperation],
    copy_limit: usize,
) -> Result<(), ApiStatus> {
    let mut copied = 0usize;
    for (i, op) in ops.iter().enumerate() {
        if let json_patch::PatchOperation::Copy(c) = op
            && let Some(from) = doc.pointer(c.from.as_str())
        {
            copied = copied.saturating_add(json_size(from));
            if copied > copy_limit {
                return Err(ApiStatus::invalid(format!(
                    "the JSON patch could not be applied: Unable to complete the copy, the accumulated size increase of copy is {copied}, exceeding the limit {copy_limit}"
                )));
            }
        }
        json_patch::patch_unsafe(doc, std::slice::from_ref(op)).map_err(|e| {
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

pub(crate) async fn patch(
    state: &State,
    target: &Target<'_>,
    query: &Query,
    parts: &Parts,
    body: Bytes,
) -> Result<Response<Body>, ApiStatus> {
    let ct = media_type(
        parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    );
    if ct.as_deref() == Some(APPLY_PATCH) {
        return apply_patch(state, target, query, body).await;
    }
    let kind = match ct.as_deref() {
        Some("application/merge-patch+json") => PatchKind::Merge(parse_json(&body)?),
        Some("application/strategic-merge-patch+json") => PatchKind::Strategic(parse_json(&body)?),
        Some("application/json-patch+json") => {
            let v = parse_json(&body)?;
            let p: json_patch::Patch = serde_json::from_value(v)
                .map_err(|e| ApiStatus::bad_request(format!("the JSON patch is malformed: {e}")))?;
            if p.0.len() > MAX_JSON_PATCH_OPERATIONS {
                return Err(ApiStatus::too_large(format!(
                    "The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {}",
                    p.0.len()
                )));
            }
            PatchKind::Json(p)
        }
        other => {
            return Err(ApiStatus::unsupported_media_type(format!(
                "the body of the request was in an unknown format ({}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json",
                other.unwrap_or("no Content-Type")
            )));
        }
    };
    if query.has("force") {
        return Err(ApiStatus::invalid(
            "PatchOptions.meta.k8s.io \"\" is invalid: force: Forbidden: may not be specified for non-apply patch",
        ));
    }
    if let PatchKind::Merge(v) | PatchKind::Strategic(v) = &kind
        && !v.is_object()
    {
        return Err(ApiStatus::bad_request(
            "a merge patch must be a JSON object",
        ));
    }
    let dry_run = query.dry_run()?;
    let res = target.resource;
    let name = target.name.unwrap_or_default();
    let key = res.cacher.codec().key(target.namespace, name);
    let opts = write_options(res, dry_run);
    let stored = guaranteed_update(state, target, &key, &Preconditions::none(), &opts, |cur| {
        let current = parse_stored(cur)?;
        let mut doc = current.clone();
        set_resource_version(&mut doc, cur.mod_revision);
        match &kind {
            PatchKind::Merge(p) => json_patch::merge(&mut doc, p),
            PatchKind::Strategic(p) => super::smp::apply(&mut doc, p),
            PatchKind::Json(p) => {
                apply_json_patch(&mut doc, &p.0, state.config.server.max_body_bytes)?
            }
        }
        if !doc.is_object() {
            return Err(ApiStatus::invalid("the patched object is not a JSON object").into());
        }
        check_type_meta(&mut doc, res).map_err(|s| ApiStatus::invalid(s.message))?;
        match meta_string(&doc, "name")? {
            Some(n) if n == name => {}
            other => return Err(name_mismatch(&other.unwrap_or_default(), name).into()),
        }
        reconcile_namespace(&mut doc, target)?;
        if let Some(rv) = meta_string(&doc, "resourceVersion")?.filter(|s| !s.is_empty())
            && rv != cur.mod_revision.to_string()
        {
            return Err(StorageError::modified(&key).into());
        }
        let old_uid = metadata_str(&current, "uid");
        let new_uid = meta_string(&doc, "uid")?;
        if new_uid.as_deref().filter(|u| !u.is_empty()) != old_uid.filter(|u| !u.is_empty())
            && new_uid.is_some()
        {
            return Err(
                ApiStatus::invalid("metadata.uid: Invalid value: field is immutable").into(),
            );
        }
        carry_system_fields(&mut doc, &current)?;
        Ok(to_bytes(res, &doc)?)
    })
    .await?;
    Ok(stored_response(200, res, &stored))
}

/// Server-side apply's media type (the body is YAML or JSON).
const APPLY_PATCH: &str = "application/apply-patch+yaml";

/// kube-apiserver's limit on a field manager's name.
const MAX_FIELD_MANAGER_LEN: usize = 128;

/// The applied configuration of a server-side apply: YAML (JSON is YAML),
/// an object with its type meta; identity fields checked against the path.
fn parse_applied(body: &[u8], target: &Target<'_>) -> Result<Value, ApiStatus> {
    let mut obj: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(_) => {
            let text = std::str::from_utf8(body)
                .map_err(|_| ApiStatus::bad_request("the applied configuration is not UTF-8"))?;
            // serde_saphyr's default budget bounds what aliases expand to;
            // no snippet of the body (a Secret's data) in the error.
            // Leading-zero octal (`defaultMode: 0644`) as YAML 1.1 reads it,
            // like kube-apiserver's sigs.k8s.io/yaml.
            let options = serde_saphyr::options! {
                with_snippet: false,
                legacy_octal_numbers: true,
            };
            serde_saphyr::from_str_with_options(text, options)
                .map_err(|e| ApiStatus::bad_request(format!("error decoding YAML: {e}")))?
        }
    };
    if !obj.is_object() {
        return Err(ApiStatus::bad_request(
            "the applied configuration must be an object",
        ));
    }
    for (field, shown) in [("apiVersion", "apiVersion"), ("kind", "Kind")] {
        if obj
            .get(field)
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            return Err(ApiStatus::bad_request(format!(
                "Object '{shown}' is missing in the applied configuration"
            )));
        }
    }
    check_type_meta(&mut obj, target.resource)?;
    let path_name = target.name.unwrap_or_default();
    match meta_string(&obj, "name")?.as_deref() {
        None | Some("") => {
            meta_mut(&mut obj)?.insert("name".into(), Value::String(path_name.to_string()));
        }
        Some(n) if n == path_name => {}
        Some(n) => return Err(name_mismatch(n, path_name)),
    }
    reconcile_namespace(&mut obj, target)?;
    if obj
        .get("metadata")
        .and_then(|m| m.get("managedFields"))
        .is_some_and(|m| !m.is_null())
    {
        return Err(ApiStatus::bad_request("metadata.managedFields must be nil"));
    }
    Ok(obj)
}

/// `PATCH` with `application/apply-patch+yaml` (`field_manager` has the
/// rules): merged into the stored object, or created when there is none
/// (201). A `metadata.uid` in the configuration must be the object's.
async fn apply_patch(
    state: &State,
    target: &Target<'_>,
    query: &Query,
    body: Bytes,
) -> Result<Response<Body>, ApiStatus> {
    let manager = match query.get("fieldManager") {
        Some(m) if !m.is_empty() => m,
        _ => {
            return Err(ApiStatus::invalid(
                "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
            ));
        }
    };
    if manager.len() > MAX_FIELD_MANAGER_LEN {
        return Err(ApiStatus::invalid(format!(
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Too long: may not be more than {MAX_FIELD_MANAGER_LEN} bytes"
        )));
    }
    if manager.chars().any(char::is_control) {
        return Err(ApiStatus::invalid(format!(
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Invalid value: {manager:?}: must only contain printable characters"
        )));
    }
    let force = query.bool("force");
    let dry_run = query.dry_run()?;
    let res = target.resource;
    let mut applied = parse_applied(&body, target)?;
    // A resourceVersion is a precondition on an existing object (0 or none:
    // unconditional), ignored on a create, as kube-apiserver's store does.
    let precondition =
        parse_resource_version(meta_string(&applied, "resourceVersion")?.as_deref())?
            .filter(|rv| *rv > 0);
    strip_resource_version(&mut applied);
    let applied_uid = meta_string(&applied, "uid")?.filter(|u| !u.is_empty());
    let name = target.name.unwrap_or_default();
    let key = res.cacher.codec().key(target.namespace, name);
    let opts = write_options(res, dry_run);
    let what = target.what();
    let now = now_rfc3339();
    let api_version = res.config.api_version();
    let req = field_manager::ApplyRequest {
        applied: &applied,
        manager,
        force,
        api_version: &api_version,
        now: &now,
    };
    // Twice at most: an object created between the update's "not found"
    // and the create is then updated.
    for _ in 0..2 {
        let suggestion = suggestion(target, &key).await;
        let updated = state
            .storage
            .guaranteed_update(
                &key,
                &Preconditions::none(),
                suggestion,
                &opts,
                |cur| -> Result<UpdateAction, UpdateError> {
                    if precondition.is_some_and(|rv| rv != cur.mod_revision) {
                        return Err(StorageError::modified(&key).into());
                    }
                    let current = parse_stored(cur)?;
                    if applied_uid
                        .as_deref()
                        .is_some_and(|u| Some(u) != metadata_str(&current, "uid"))
                    {
                        return Err(ApiStatus::invalid(
                            "metadata.uid: Invalid value: field is immutable",
                        )
                        .into());
                    }
                    let mut out = field_manager::apply(Some(&current), &req)?;
                    reconcile_namespace(&mut out, target)?;
                    meta_mut(&mut out)?.insert("name".into(), Value::String(name.to_string()));
                    carry_system_fields(&mut out, &current)?;
                    Ok(UpdateAction::Update(to_bytes(res, &out)?))
                },
            )
            .await;
        match updated {
            Ok(stored) => return Ok(stored_response(200, res, &stored)),
            Err(UpdateError::Storage(StorageError::NotFound { .. })) => {}
            Err(e) => return Err(update_status(e, &what)),
        }
        if let Some(uid) = &applied_uid {
            return Err(ApiStatus::conflict(format!(
                "uid mismatch: the provided object specified uid {uid}, and no existing object was found"
            )));
        }
        validate_name(res, name)?;
        if let Some(ns) = &target.namespace {
            invalid_field("metadata.namespace", ns, is_dns1123_label(ns))?;
        }
        let mut out = field_manager::apply(None, &req)?;
        reconcile_namespace(&mut out, target)?;
        meta_mut(&mut out)?.insert("name".into(), Value::String(name.to_string()));
        stamp_new(&mut out, &now)?;
        match state
            .storage
            .create(&key, to_bytes(res, &out)?, &opts)
            .await
        {
            Ok(stored) => return Ok(stored_response(201, res, &stored)),
            Err(StorageError::AlreadyExists { .. }) => continue,
            Err(e) => return Err(storage_status(e, &what)),
        }
    }
    Err(storage_status(StorageError::modified(&key), &what))
}

pub(crate) async fn delete(
    state: &State,
    target: &Target<'_>,
    query: &Query,
    body: Bytes,
) -> Result<Response<Body>, ApiStatus> {
    let mut dry_run = query.dry_run()?;
    let mut preconditions = Preconditions::none();
    if !body.iter().all(u8::is_ascii_whitespace) {
        let opts = parse_json(&body)?;
        if !opts.is_object() {
            return Err(ApiStatus::bad_request(
                "DeleteOptions must be a JSON object",
            ));
        }
        if let Some(pre) = opts.get("preconditions").filter(|p| !p.is_null()) {
            match pre.get("uid") {
                None | Some(Value::Null) => {}
                Some(Value::String(u)) => preconditions.uid = Some(u.clone()),
                Some(_) => {
                    return Err(ApiStatus::bad_request("preconditions.uid must be a string"));
                }
            }
            match pre.get("resourceVersion") {
                None | Some(Value::Null) => {}
                Some(Value::String(rv)) => {
                    preconditions.resource_version = parse_resource_version(Some(rv))?
                }
                Some(_) => {
                    return Err(ApiStatus::bad_request(
                        "preconditions.resourceVersion must be a string",
                    ));
                }
            }
        }
        match opts.get("dryRun") {
            None | Some(Value::Null) => {}
            Some(Value::Array(a)) => {
                for v in a {
                    match v.as_str() {
                        Some("All") => dry_run = true,
                        _ => {
                            return Err(ApiStatus::bad_request(format!(
                                "invalid dryRun value {v}: only \"All\" is supported"
                            )));
                        }
                    }
                }
            }
            Some(_) => return Err(ApiStatus::bad_request("dryRun must be a list")),
        }
    }
    let res = target.resource;
    let name = target.name.unwrap_or_default();
    let key = res.cacher.codec().key(target.namespace, name);
    let stored = state
        .storage
        .delete(&key, &preconditions, &write_options(res, dry_run))
        .await
        .map_err(|e| storage_status(e, &target.what()))?;
    Ok(stored_response(200, res, &stored))
}

//! Server-side apply: `PATCH` with `application/apply-patch+yaml`. The
//! field ownership rules are [`crate::api::patch::field_manager`]'s; this
//! is the request around them.

use bytes::Bytes;
use hyper::Response;
use serde_json::Value;

use super::object_meta::{
    carry_system_fields, check_type_meta, invalid_field, meta_mut, meta_string, name_mismatch,
    now_rfc3339, reconcile_namespace, stamp_new, validate_name,
};
use super::target::Target;
use super::write::{parse_stored, stored_response, suggestion, to_bytes, write_options};
use crate::api::patch::field_manager;
use crate::api::request::params::{Query, parse_resource_version};
use crate::api::response::Body;
use crate::api::state::State;
use crate::api::status::ApiStatus;
use crate::api::status::errors::{UpdateError, storage_status, update_status};
use crate::object::validation::is_dns1123_label;
use crate::object::{metadata_str, strip_resource_version};
use crate::storage::{Preconditions, StorageError, UpdateAction};

/// Server-side apply's media type (the body is YAML or JSON).
pub(crate) const APPLY_PATCH: &str = "application/apply-patch+yaml";

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
    check_type_meta(&mut obj, &target.resource.config)?;
    let path_name = target.name.unwrap_or_default();
    match meta_string(&obj, "name")?.as_deref() {
        None | Some("") => {
            meta_mut(&mut obj)?.insert("name".into(), Value::String(path_name.to_string()));
        }
        Some(n) if n == path_name => {}
        Some(n) => return Err(name_mismatch(n, path_name)),
    }
    reconcile_namespace(&mut obj, target.namespace)?;
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
pub(crate) async fn apply_patch(
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
                    reconcile_namespace(&mut out, target.namespace)?;
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
        validate_name(&res.config, name)?;
        if let Some(ns) = &target.namespace {
            invalid_field(
                &res.config,
                name,
                "metadata.namespace",
                ns,
                is_dns1123_label(ns),
            )?;
        }
        let mut out = field_manager::apply(None, &req)?;
        reconcile_namespace(&mut out, target.namespace)?;
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

//! `PATCH` on an object: a JSON merge patch, a strategic merge patch or a
//! JSON patch applied to the stored object inside a GuaranteedUpdate;
//! server-side apply is [`super::apply`].

use bytes::Bytes;
use hyper::Response;
use hyper::header::CONTENT_TYPE;
use hyper::http::request::Parts;
use serde_json::Value;

use super::apply::{APPLY_PATCH, apply_patch};
use super::object_meta::{
    carry_system_fields, check_type_meta, meta_string, name_mismatch, reconcile_namespace,
};
use super::target::Target;
use super::write::{guaranteed_update, parse_stored, stored_response, to_bytes, write_options};
use crate::api::patch::{json_patch, strategic_merge};
use crate::api::request::body::parse_json;
use crate::api::request::negotiation::media_type;
use crate::api::request::params::Query;
use crate::api::response::Body;
use crate::api::state::State;
use crate::api::status::ApiStatus;
use crate::object::{metadata_str, set_resource_version};
use crate::storage::{Preconditions, StorageError};

/// A non-apply patch, parsed by its media type.
#[derive(Debug)]
enum PatchKind {
    Merge(Value),
    Strategic(Value),
    Json(::json_patch::Patch),
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
    let kind = patch_kind(ct.as_deref(), &body)?;
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
            PatchKind::Merge(p) => ::json_patch::merge(&mut doc, p),
            PatchKind::Strategic(p) => strategic_merge::apply(&mut doc, p),
            PatchKind::Json(p) => {
                json_patch::apply(&mut doc, &p.0, state.config.server.max_body_bytes)?
            }
        }
        if !doc.is_object() {
            return Err(ApiStatus::invalid("the patched object is not a JSON object").into());
        }
        check_type_meta(&mut doc, &res.config).map_err(|s| ApiStatus::invalid(s.message))?;
        match meta_string(&doc, "name")? {
            Some(n) if n == name => {}
            other => return Err(name_mismatch(&other.unwrap_or_default(), name).into()),
        }
        reconcile_namespace(&mut doc, target.namespace)?;
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

/// The patch a `Content-Type` names, parsed from `body`; 415 for a media
/// type that is not a patch (apply is handled before this).
fn patch_kind(media_type: Option<&str>, body: &[u8]) -> Result<PatchKind, ApiStatus> {
    match media_type {
        Some("application/merge-patch+json") => Ok(PatchKind::Merge(parse_json(body)?)),
        Some("application/strategic-merge-patch+json") => {
            Ok(PatchKind::Strategic(parse_json(body)?))
        }
        Some("application/json-patch+json") => {
            Ok(PatchKind::Json(json_patch::parse(parse_json(body)?)?))
        }
        other => Err(ApiStatus::unsupported_media_type(format!(
            "the body of the request was in an unknown format ({}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json",
            other.unwrap_or("no Content-Type")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_media_type_picks_the_patch() {
        let body = br#"{"metadata":{"labels":{"a":"b"}}}"#;
        assert!(matches!(
            patch_kind(Some("application/merge-patch+json"), body),
            Ok(PatchKind::Merge(_))
        ));
        assert!(matches!(
            patch_kind(Some("application/strategic-merge-patch+json"), body),
            Ok(PatchKind::Strategic(_))
        ));
        let ops = br#"[{"op":"add","path":"/metadata/labels/a","value":"b"}]"#;
        match patch_kind(Some("application/json-patch+json"), ops) {
            Ok(PatchKind::Json(p)) => assert_eq!(p.0.len(), 1),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn other_media_types_are_415_and_bad_bodies_400() {
        for ct in [None, Some("application/json"), Some("text/plain")] {
            let e = patch_kind(ct, b"{}").unwrap_err();
            assert_eq!(e.code, 415, "{ct:?}");
            assert!(
                e.message.contains(&format!(
                    "unknown format ({})",
                    ct.unwrap_or("no Content-Type")
                )),
                "{}",
                e.message
            );
        }
        let e = patch_kind(Some("application/merge-patch+json"), b"{").unwrap_err();
        assert_eq!(e.code, 400);
        let e = patch_kind(Some("application/json-patch+json"), br#"{"op":"add"}"#).unwrap_err();
        assert_eq!(e.code, 400);
        assert!(
            e.message.starts_with("the JSON patch is malformed"),
            "{}",
            e.message
        );
    }
}

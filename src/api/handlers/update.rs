//! `PUT` on an object: replaces it, as a compare-and-swap on the
//! resourceVersion the body names, or unconditionally without one.

use bytes::Bytes;
use hyper::Response;
use hyper::http::request::Parts;
use serde_json::Value;

use super::object_meta::{
    carry_system_fields, check_type_meta, meta_string, name_mismatch, reconcile_namespace,
};
use super::target::Target;
use super::write::{
    guaranteed_update, parse_stored, stored_response, suggestion, to_bytes, write_options,
};
use crate::api::request::body::{check_json_content_type, parse_json};
use crate::api::request::params::{Query, parse_resource_version};
use crate::api::response::Body;
use crate::api::state::State;
use crate::api::status::ApiStatus;
use crate::api::status::errors::storage_status;
use crate::config::ResourceConfig;
use crate::storage::{Preconditions, StorageError};

/// The body of an update, checked against the path: name must match,
/// namespace must match (filled when absent), type meta must match.
fn prepare_update_body(
    body: &[u8],
    config: &ResourceConfig,
    namespace: Option<&str>,
    path_name: &str,
) -> Result<Value, ApiStatus> {
    let mut obj = parse_json(body)?;
    check_type_meta(&mut obj, config)?;
    match meta_string(&obj, "name")? {
        Some(n) if n == path_name => {}
        other => return Err(name_mismatch(&other.unwrap_or_default(), path_name)),
    }
    reconcile_namespace(&mut obj, namespace)?;
    Ok(obj)
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
    let obj = prepare_update_body(
        &body,
        &res.config,
        target.namespace,
        target.name.unwrap_or_default(),
    )?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pods() -> ResourceConfig {
        crate::object::tests::resource(true, &[])
    }

    #[test]
    fn the_body_must_name_the_object_of_the_path() {
        let body = br#"{"metadata":{"name":"web"},"spec":{}}"#;
        let obj = prepare_update_body(body, &pods(), Some("ns1"), "web").unwrap();
        assert_eq!(obj["apiVersion"], "v1");
        assert_eq!(obj["kind"], "Pod");
        assert_eq!(obj["metadata"]["namespace"], "ns1");
        let e = prepare_update_body(body, &pods(), Some("ns1"), "db").unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "the name of the object (web) does not match the name on the URL (db)"
        );
        // No name at all is a mismatch too (kube-apiserver's message).
        let e =
            prepare_update_body(br#"{"metadata":{}}"#, &pods(), Some("ns1"), "web").unwrap_err();
        assert!(
            e.message.starts_with("the name of the object () "),
            "{}",
            e.message
        );
        let e = prepare_update_body(
            br#"{"metadata":{"name":"web","namespace":"ns2"}}"#,
            &pods(),
            Some("ns1"),
            "web",
        )
        .unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(
            prepare_update_body(b"not json", &pods(), None, "web")
                .unwrap_err()
                .code,
            400
        );
    }
}

//! What every write verb shares: the stored form of an object, the answer
//! for a stored object, and a GuaranteedUpdate started from the cached
//! object. Every write goes to etcd through [`Storage`](crate::storage::Storage)
//! (never into the cache); responses carry the new resourceVersion.

use bytes::Bytes;
use hyper::Response;
use serde_json::Value;

use super::target::Target;
use crate::api::response::Body;
use crate::api::response::writers::{json_response, json_value};
use crate::api::state::{Resource, State};
use crate::api::status::ApiStatus;
use crate::api::status::errors::{UpdateError, update_status};
use crate::cacher::GetRequest;
use crate::config::StorageEncoding;
use crate::object::{conversion, protobuf};
use crate::object::{set_resource_version, strip_resource_version};
use crate::storage::{Preconditions, StoredObject, UpdateAction, WriteOptions};

pub(crate) fn write_options(res: &Resource, dry_run: bool) -> WriteOptions {
    WriteOptions {
        ttl_seconds: res.config.ttl_seconds,
        dry_run,
    }
}

/// The stored form of an object: JSON, or kube-apiserver's protobuf when the
/// resource is configured with `storage_encoding = "protobuf"`, after
/// kube-apiserver's write-time conversion (a Secret's `stringData`,
/// [`conversion`]). Every write stores through here, and its answer is
/// decoded from what was stored.
pub(crate) fn to_bytes(res: &Resource, obj: &Value) -> Result<Bytes, ApiStatus> {
    let api_version = res.config.api_version();
    let converted;
    let obj = if conversion::converts(&api_version, &res.config.kind) {
        let mut c = obj.clone();
        conversion::convert_for_storage(&api_version, &res.config.kind, &mut c)
            .map_err(ApiStatus::bad_request)?;
        converted = c;
        &converted
    } else {
        obj
    };
    match res.config.storage_encoding {
        StorageEncoding::Json => serde_json::to_vec(obj)
            .map(Bytes::from)
            .map_err(|e| ApiStatus::internal(format!("cannot encode the object: {e}"))),
        StorageEncoding::Protobuf => {
            protobuf::encode_as(obj, &api_version, &res.config.kind)
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
pub(crate) fn stored_response(code: u16, res: &Resource, stored: &StoredObject) -> Response<Body> {
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
pub(crate) async fn suggestion(target: &Target<'_>, key: &str) -> Option<StoredObject> {
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

/// Runs `f` inside a GuaranteedUpdate, starting from the cached object.
/// `f` answers with the request's own errors or the store's (a conflict);
/// either way, on a stale suggestion the store retries on fresh state.
pub(crate) async fn guaranteed_update<F>(
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

pub(crate) fn parse_stored(cur: &StoredObject) -> Result<Value, ApiStatus> {
    crate::object::parse_stored_value(&cur.key, &cur.value)
        .map_err(|e| ApiStatus::internal(format!("the stored object cannot be read: {e}")))
}

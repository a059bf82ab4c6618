//! `POST` on a collection: a new object, named or with a generated name.

use bytes::Bytes;
use hyper::Response;
use hyper::http::request::Parts;
use serde_json::Value;

use super::object_meta::{
    check_type_meta, invalid_field, meta_mut, meta_string, now_rfc3339, reconcile_namespace,
    stamp_new, validate_name,
};
use super::target::Target;
use super::write::{stored_response, to_bytes, write_options};
use crate::api::request::body::{check_json_content_type, parse_json};
use crate::api::request::params::Query;
use crate::api::response::Body;
use crate::api::state::State;
use crate::api::status::ApiStatus;
use crate::api::status::errors::{What, storage_status};
use crate::object::strip_resource_version;
use crate::object::validation::is_dns1123_label;
use crate::storage::StorageError;

/// Characters of a generateName suffix (Kubernetes' alphabet, no vowels).
const GENERATE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
const GENERATE_SUFFIX_LEN: usize = 5;
const GENERATE_ATTEMPTS: usize = 3;

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
    check_type_meta(&mut obj, &res.config)?;
    reconcile_namespace(&mut obj, target.namespace)?;
    let name = meta_string(&obj, "name")?.filter(|n| !n.is_empty());
    if let Some(ns) = &target.namespace {
        let object = name.as_deref().unwrap_or_default();
        invalid_field(
            &res.config,
            object,
            "metadata.namespace",
            ns,
            is_dns1123_label(ns),
        )?;
    }
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
        validate_name(&res.config, &name)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_names_add_a_suffix_from_kubernetes_alphabet() {
        let a = generate_name("web-");
        let b = generate_name("web-");
        assert_eq!(a.len(), "web-".len() + GENERATE_SUFFIX_LEN);
        let suffix = a.strip_prefix("web-").unwrap();
        assert!(
            suffix.bytes().all(|c| GENERATE_ALPHABET.contains(&c)),
            "{a}"
        );
        // 27^5 suffixes: two alike in a row would be a broken generator.
        assert_ne!(a, b);
    }

    #[test]
    fn a_long_prefix_is_cut_so_the_name_stays_valid() {
        let name = generate_name(&"a".repeat(300));
        assert_eq!(name.len(), 253);
        assert!(name.starts_with(&"a".repeat(248)));
    }
}

//! `DELETE` on an object, with the preconditions and dry run of its
//! DeleteOptions body.

use bytes::Bytes;
use hyper::Response;
use serde_json::Value;

use super::target::Target;
use super::write::{stored_response, write_options};
use crate::api::request::body::parse_json;
use crate::api::request::params::{Query, parse_resource_version};
use crate::api::response::Body;
use crate::api::state::State;
use crate::api::status::ApiStatus;
use crate::api::status::errors::storage_status;
use crate::storage::Preconditions;

pub(crate) async fn delete(
    state: &State,
    target: &Target<'_>,
    query: &Query,
    body: Bytes,
) -> Result<Response<Body>, ApiStatus> {
    let (preconditions, dry_run) = delete_options(&body, query.dry_run()?)?;
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

/// The preconditions and dry run of a DeleteOptions body (empty: none);
/// `dry_run` is the query's, which the body can only add to.
fn delete_options(body: &[u8], mut dry_run: bool) -> Result<(Preconditions, bool), ApiStatus> {
    let mut preconditions = Preconditions::none();
    if !body.iter().all(u8::is_ascii_whitespace) {
        let opts = parse_json(body)?;
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
    Ok((preconditions, dry_run))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(body: &str, dry_run: bool) -> Result<(Preconditions, bool), ApiStatus> {
        delete_options(body.as_bytes(), dry_run)
    }

    #[test]
    fn no_body_means_no_preconditions_and_the_query_s_dry_run() {
        for body in ["", "  \n"] {
            for dry_run in [false, true] {
                let (pre, dry) = options(body, dry_run).unwrap();
                assert_eq!((pre.uid, pre.resource_version, dry), (None, None, dry_run));
            }
        }
    }

    #[test]
    fn preconditions_and_dry_run_come_from_the_body() {
        let (pre, dry) = options(
            r#"{"preconditions":{"uid":"u1","resourceVersion":"7"},"dryRun":["All"]}"#,
            false,
        )
        .unwrap();
        assert_eq!(pre.uid.as_deref(), Some("u1"));
        assert_eq!(pre.resource_version, Some(7));
        assert!(dry);
        // The body cannot turn the query's dry run off.
        let (_, dry) = options(r#"{"dryRun":[]}"#, true).unwrap();
        assert!(dry);
        let (pre, dry) = options(r#"{"preconditions":null,"dryRun":null}"#, false).unwrap();
        assert_eq!((pre.uid, pre.resource_version, dry), (None, None, false));
    }

    #[test]
    fn malformed_options_are_400() {
        for (body, message) in [
            ("[]", "DeleteOptions must be a JSON object"),
            (
                r#"{"preconditions":{"uid":1}}"#,
                "preconditions.uid must be a string",
            ),
            (
                r#"{"preconditions":{"resourceVersion":7}}"#,
                "preconditions.resourceVersion must be a string",
            ),
            (r#"{"dryRun":"All"}"#, "dryRun must be a list"),
            (
                r#"{"dryRun":["Some"]}"#,
                r#"invalid dryRun value "Some": only "All" is supported"#,
            ),
        ] {
            let e = options(body, false).unwrap_err();
            assert_eq!((e.code, e.message.as_str()), (400, message), "{body}");
        }
        let e = options(r#"{"preconditions":{"resourceVersion":"-1"}}"#, false).unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(options("{", false).unwrap_err().code, 400);
    }
}

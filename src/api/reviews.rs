//! The self reviews kubectl uses: `SelfSubjectAccessReview`
//! (authorization.k8s.io/v1, `kubectl auth can-i`) asks the authorizer about
//! the caller; `SelfSubjectReview` (authentication.k8s.io/v1, `kubectl auth
//! whoami`) returns the caller's user. Neither is stored.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::k8s::json_value;
use super::writes::read_body;
use super::{ApiStatus, Body, State};
use crate::auth::{Attributes, UserInfo};

pub const SSAR_PATH: &str = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
pub const SSR_PATH: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";

/// The built-in groups served beside the configured resources, for
/// discovery: (group, version, plural, kind).
pub const REVIEW_RESOURCES: [(&str, &str, &str, &str); 2] = [
    (
        "authentication.k8s.io",
        "v1",
        "selfsubjectreviews",
        "SelfSubjectReview",
    ),
    (
        "authorization.k8s.io",
        "v1",
        "selfsubjectaccessreviews",
        "SelfSubjectAccessReview",
    ),
];

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResourceAttributes {
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    verb: String,
    #[serde(default)]
    group: String,
    #[serde(default)]
    version: String,
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: String,
    #[serde(default)]
    name: String,
}

#[derive(Debug, Default, Deserialize)]
struct NonResourceAttributes {
    #[serde(default)]
    path: String,
    #[serde(default)]
    verb: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SsarSpec {
    #[serde(default)]
    resource_attributes: Option<ResourceAttributes>,
    #[serde(default)]
    non_resource_attributes: Option<NonResourceAttributes>,
}

/// Serves the two review paths; None when `req` is for another path.
pub(crate) async fn handle(
    state: &Arc<State>,
    req: Request<Incoming>,
) -> Option<Result<Response<Body>, ApiStatus>> {
    let path = req.uri().path();
    if path != SSAR_PATH && path != SSR_PATH {
        return None;
    }
    if req.method() != Method::POST {
        return Some(Err(ApiStatus::method_not_allowed(format!(
            "{} is not supported on {path}",
            req.method()
        ))));
    }
    Some(review(state, req).await)
}

async fn review(state: &Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, ApiStatus> {
    let ssar = req.uri().path() == SSAR_PATH;
    // Set by the authentication filter; absent only on paths it waves
    // through, which these are not.
    let user = req
        .extensions()
        .get::<UserInfo>()
        .cloned()
        .unwrap_or_else(UserInfo::anonymous);
    let (_, body) = read_body(state, req).await?;
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiStatus::bad_request(format!("invalid JSON body: {e}")))?;
    if ssar {
        let spec: SsarSpec = serde_json::from_value(v.get("spec").cloned().unwrap_or(Value::Null))
            .map_err(|e| ApiStatus::bad_request(format!("invalid spec: {e}")))?;
        let attrs = match (spec.resource_attributes, spec.non_resource_attributes) {
            (Some(r), None) => Attributes {
                verb: r.verb,
                is_resource_request: true,
                path: String::new(),
                namespace: r.namespace,
                api_group: r.group,
                api_version: r.version,
                resource: r.resource,
                subresource: r.subresource,
                name: r.name,
            },
            (None, Some(n)) => Attributes::non_resource(n.verb, n.path),
            _ => {
                return Err(ApiStatus::invalid(
                    "SelfSubjectAccessReview: exactly one of spec.resourceAttributes and spec.nonResourceAttributes is required",
                ));
            }
        };
        let decision = state.security.authorizer.authorize(&user, &attrs);
        let mut status = json!({"allowed": decision.allowed});
        if !decision.reason.is_empty() {
            status["reason"] = json!(decision.reason);
        }
        Ok(json_value(
            201,
            &json!({
                "kind": "SelfSubjectAccessReview",
                "apiVersion": "authorization.k8s.io/v1",
                "metadata": {"creationTimestamp": null},
                "spec": v.get("spec").cloned().unwrap_or(json!({})),
                "status": status,
            }),
        ))
    } else {
        let mut info = json!({"username": user.name, "groups": user.groups});
        if !user.uid.is_empty() {
            info["uid"] = json!(user.uid);
        }
        Ok(json_value(
            201,
            &json!({
                "kind": "SelfSubjectReview",
                "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"creationTimestamp": null},
                "status": {"userInfo": info},
            }),
        ))
    }
}

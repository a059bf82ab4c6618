//! The self reviews kubectl uses: `SelfSubjectAccessReview`
//! (authorization.k8s.io/v1, `kubectl auth can-i`) asks the authorizer about
//! the caller; `SelfSubjectReview` (authentication.k8s.io/v1, `kubectl auth
//! whoami`) returns the caller's user; `SelfSubjectRulesReview` (`kubectl
//! auth can-i --list`) lists the caller's rules in a namespace. None is
//! stored.
//!
//! kubectl sends these as Kubernetes protobuf (`application/vnd.kubernetes.protobuf`)
//! and accepts JSON back; [`proto`] decodes the few messages involved with
//! prost.

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::api::request::body::read_body;
use crate::api::response::Body;
use crate::api::response::writers::json_value;
use crate::api::state::State;
use crate::api::status::ApiStatus;
use crate::auth::{Attributes, UserInfo};

pub const SSAR_PATH: &str = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
pub const SSR_PATH: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";
pub const SSRR_PATH: &str = "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews";

/// The built-in groups served beside the configured resources, for
/// discovery: (group, version, plural, kind).
pub const REVIEW_RESOURCES: [(&str, &str, &str, &str); 3] = [
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
    (
        "authorization.k8s.io",
        "v1",
        "selfsubjectrulesreviews",
        "SelfSubjectRulesReview",
    ),
];

#[derive(Debug, Default, Deserialize, serde::Serialize)]
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

#[derive(Debug, Default, Deserialize, serde::Serialize)]
struct NonResourceAttributes {
    #[serde(default)]
    path: String,
    #[serde(default)]
    verb: String,
}

#[derive(Debug, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct SsarSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resource_attributes: Option<ResourceAttributes>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    non_resource_attributes: Option<NonResourceAttributes>,
}

/// The Kubernetes protobuf messages of a `SelfSubjectAccessReview` request
/// (k8s.io/api/authorization/v1 and apimachinery's `runtime.Unknown`
/// envelope), only the fields the review reads.
mod proto {
    /// Every Kubernetes protobuf body starts with these four bytes.
    pub const MAGIC: &[u8] = b"k8s\0";

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Unknown {
        #[prost(bytes = "vec", optional, tag = "2")]
        pub raw: Option<Vec<u8>>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SelfSubjectAccessReview {
        #[prost(message, optional, tag = "2")]
        pub spec: Option<Spec>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Spec {
        #[prost(message, optional, tag = "1")]
        pub resource_attributes: Option<ResourceAttributes>,
        #[prost(message, optional, tag = "2")]
        pub non_resource_attributes: Option<NonResourceAttributes>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResourceAttributes {
        #[prost(string, optional, tag = "1")]
        pub namespace: Option<String>,
        #[prost(string, optional, tag = "2")]
        pub verb: Option<String>,
        #[prost(string, optional, tag = "3")]
        pub group: Option<String>,
        #[prost(string, optional, tag = "4")]
        pub version: Option<String>,
        #[prost(string, optional, tag = "5")]
        pub resource: Option<String>,
        #[prost(string, optional, tag = "6")]
        pub subresource: Option<String>,
        #[prost(string, optional, tag = "7")]
        pub name: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct SelfSubjectRulesReview {
        #[prost(message, optional, tag = "2")]
        pub spec: Option<RulesSpec>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RulesSpec {
        #[prost(string, optional, tag = "1")]
        pub namespace: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NonResourceAttributes {
        #[prost(string, optional, tag = "1")]
        pub path: Option<String>,
        #[prost(string, optional, tag = "2")]
        pub verb: Option<String>,
    }
}

/// The spec of a protobuf `SelfSubjectAccessReview` body.
fn spec_from_protobuf(body: &[u8]) -> Result<SsarSpec, String> {
    use prost::Message;
    let envelope = body
        .strip_prefix(proto::MAGIC)
        .ok_or("not a Kubernetes protobuf body (no k8s magic)")?;
    let unknown = proto::Unknown::decode(envelope).map_err(|e| e.to_string())?;
    let review = proto::SelfSubjectAccessReview::decode(unknown.raw.unwrap_or_default().as_slice())
        .map_err(|e| e.to_string())?;
    let spec = review.spec.unwrap_or_default();
    Ok(SsarSpec {
        resource_attributes: spec.resource_attributes.map(|r| ResourceAttributes {
            namespace: r.namespace.unwrap_or_default(),
            verb: r.verb.unwrap_or_default(),
            group: r.group.unwrap_or_default(),
            version: r.version.unwrap_or_default(),
            resource: r.resource.unwrap_or_default(),
            subresource: r.subresource.unwrap_or_default(),
            name: r.name.unwrap_or_default(),
        }),
        non_resource_attributes: spec.non_resource_attributes.map(|n| NonResourceAttributes {
            path: n.path.unwrap_or_default(),
            verb: n.verb.unwrap_or_default(),
        }),
    })
}

/// The `spec.namespace` of a `SelfSubjectRulesReview` body.
fn parse_rules_namespace(content_type: &str, body: &[u8]) -> Result<String, ApiStatus> {
    if content_type.starts_with("application/vnd.kubernetes.protobuf") {
        use prost::Message;
        let decode = || -> Result<String, String> {
            let envelope = body
                .strip_prefix(proto::MAGIC)
                .ok_or("not a Kubernetes protobuf body (no k8s magic)")?;
            let unknown = proto::Unknown::decode(envelope).map_err(|e| e.to_string())?;
            let review =
                proto::SelfSubjectRulesReview::decode(unknown.raw.unwrap_or_default().as_slice())
                    .map_err(|e| e.to_string())?;
            Ok(review.spec.and_then(|s| s.namespace).unwrap_or_default())
        };
        return decode().map_err(|e| ApiStatus::bad_request(format!("invalid protobuf body: {e}")));
    }
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiStatus::bad_request(format!("invalid JSON body: {e}")))?;
    Ok(v["spec"]["namespace"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// The `SelfSubjectRulesReview` answer: every rule the caller has in
/// `namespace` (cluster-wide ones included), split into resource and
/// non-resource rules as Kubernetes does.
fn rules_review(state: &State, user: &UserInfo, namespace: &str) -> Value {
    let mut resource_rules = Vec::new();
    let mut non_resource_rules = Vec::new();
    for r in state.security.authorizer.rules_for(user, namespace) {
        if !r.resources.is_empty() {
            let mut rule =
                json!({"verbs": r.verbs, "apiGroups": r.api_groups, "resources": r.resources});
            if !r.resource_names.is_empty() {
                rule["resourceNames"] = json!(r.resource_names);
            }
            resource_rules.push(rule);
        }
        if !r.non_resource_urls.is_empty() {
            non_resource_rules
                .push(json!({"verbs": r.verbs, "nonResourceURLs": r.non_resource_urls}));
        }
    }
    json!({
        "kind": "SelfSubjectRulesReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": {"namespace": namespace},
        "status": {
            "resourceRules": resource_rules,
            "nonResourceRules": non_resource_rules,
            "incomplete": false,
        },
    })
}

/// The SSAR spec of a JSON or protobuf body.
fn parse_spec(content_type: &str, body: &[u8]) -> Result<SsarSpec, ApiStatus> {
    if content_type.starts_with("application/vnd.kubernetes.protobuf") {
        return spec_from_protobuf(body)
            .map_err(|e| ApiStatus::bad_request(format!("invalid protobuf body: {e}")));
    }
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiStatus::bad_request(format!("invalid JSON body: {e}")))?;
    serde_json::from_value(v.get("spec").cloned().unwrap_or(Value::Null))
        .map_err(|e| ApiStatus::bad_request(format!("invalid spec: {e}")))
}

/// Serves the two review paths; None when `req` is for another path.
/// `user` is who [`crate::api::pipeline::admit::admit`] authenticated.
pub(crate) async fn handle(
    state: &Arc<State>,
    req: Request<Incoming>,
    user: Option<&Arc<UserInfo>>,
) -> Option<Result<Response<Body>, ApiStatus>> {
    let path = req.uri().path();
    if path != SSAR_PATH && path != SSR_PATH && path != SSRR_PATH {
        return None;
    }
    if req.method() != Method::POST {
        return Some(Err(ApiStatus::method_not_allowed(format!(
            "{} is not supported on {path}",
            req.method()
        ))));
    }
    Some(review(state, req, user).await)
}

async fn review(
    state: &Arc<State>,
    req: Request<Incoming>,
    user: Option<&Arc<UserInfo>>,
) -> Result<Response<Body>, ApiStatus> {
    let path = req.uri().path().to_string();
    let ssar = path == SSAR_PATH;
    // Set by authentication; absent only on paths it waves through, which
    // these are not.
    let user = user
        .cloned()
        .unwrap_or_else(|| Arc::new(UserInfo::anonymous()));
    let (parts, body) = read_body(&state.config.server, req).await?;
    if path == SSRR_PATH {
        let content_type = parts
            .headers
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json");
        let namespace = parse_rules_namespace(content_type, &body)?;
        return Ok(json_value(201, &rules_review(state, &user, &namespace)));
    }
    if ssar {
        let content_type = parts
            .headers
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json");
        let spec = parse_spec(content_type, &body)?;
        let spec_json = serde_json::to_value(&spec).unwrap_or(Value::Null);
        let attrs = match (&spec.resource_attributes, &spec.non_resource_attributes) {
            (Some(r), None) => Attributes {
                verb: &r.verb,
                is_resource_request: true,
                path: "",
                namespace: &r.namespace,
                api_group: &r.group,
                api_version: &r.version,
                resource: &r.resource,
                subresource: &r.subresource,
                name: &r.name,
            },
            (None, Some(n)) => Attributes::non_resource(&n.verb, &n.path),
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
                "spec": spec_json,
                "status": status,
            }),
        ))
    } else {
        let mut info = json!({"username": user.name, "groups": user.groups});
        if !user.uid.is_empty() {
            info["uid"] = json!(user.uid);
        }
        if !user.extra.is_empty() {
            info["extra"] = json!(user.extra);
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

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn protobuf_review_decodes() {
        let review = proto::SelfSubjectAccessReview {
            spec: Some(proto::Spec {
                resource_attributes: Some(proto::ResourceAttributes {
                    namespace: Some("team-a".into()),
                    verb: Some("list".into()),
                    resource: Some("pods".into()),
                    ..Default::default()
                }),
                non_resource_attributes: None,
            }),
        };
        let envelope = proto::Unknown {
            raw: Some(review.encode_to_vec()),
        };
        let mut body = proto::MAGIC.to_vec();
        body.extend(envelope.encode_to_vec());
        let spec = parse_spec("application/vnd.kubernetes.protobuf", &body).unwrap();
        let r = spec.resource_attributes.unwrap();
        assert_eq!(
            (r.namespace.as_str(), r.verb.as_str(), r.resource.as_str()),
            ("team-a", "list", "pods")
        );
        assert!(parse_spec("application/vnd.kubernetes.protobuf", b"junk").is_err());
        let spec = parse_spec(
            "application/json",
            br#"{"spec":{"nonResourceAttributes":{"path":"/metrics","verb":"get"}}}"#,
        )
        .unwrap();
        assert_eq!(spec.non_resource_attributes.unwrap().path, "/metrics");
    }
}

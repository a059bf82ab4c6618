//! Content negotiation: what a request's headers ask the answer to be
//! (JSON, protobuf, a Table) and what media type its body is in. Decided
//! here once; the handlers and response writers only read the outcome.

use hyper::Request;
use hyper::body::Incoming;
use hyper::header::ACCEPT;

use super::params::Query;
use crate::api::status::ApiStatus;
use crate::config::ResourceConfig;
use crate::object::protobuf::is_builtin_type;

/// Whether the `Accept` header asks for a `meta.k8s.io/v1` Table.
pub fn wants_table(accept: Option<&str>) -> bool {
    let Some(accept) = accept else {
        return false;
    };
    accept.split(',').any(|media| {
        let mut parts = media.split(';').map(str::trim);
        let ty = parts.next().unwrap_or("");
        if ty != "application/json" {
            return false;
        }
        let (mut as_table, mut v1, mut meta) = (false, false, false);
        for p in parts {
            match p.split_once('=') {
                Some(("as", "Table")) => as_table = true,
                Some(("v", "v1")) | Some(("v", "v1beta1")) => v1 = true,
                Some(("g", "meta.k8s.io")) => meta = true,
                _ => {}
            }
        }
        as_table && v1 && meta
    })
}

/// The `PartialObjectMetadata` form an `Accept` header asks for
/// (`application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1`, or
/// `as=PartialObjectMetadataList`, or `v=v1beta1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetadataForm {
    /// `as=PartialObjectMetadataList` (else `as=PartialObjectMetadata`).
    pub list: bool,
    /// `meta.k8s.io/v1` or `meta.k8s.io/v1beta1`.
    pub api_version: &'static str,
    /// Asked for as `application/vnd.kubernetes.protobuf`.
    pub protobuf: bool,
}

/// The metadata form of the first media range of `accept` this server can
/// serve: a JSON or protobuf `PartialObjectMetadata(List)` range of
/// meta.k8s.io v1 or v1beta1; a plain JSON or protobuf range first means
/// the objects themselves.
pub fn metadata_form(accept: Option<&str>) -> Option<MetadataForm> {
    for media in accept?.split(',') {
        let mut parts = media.split(';').map(str::trim);
        let ty = parts.next().unwrap_or("");
        let (mut as_kind, mut group, mut version) = (None, false, None);
        for p in parts {
            match p.split_once('=') {
                Some(("as", k)) => as_kind = Some(k),
                Some(("g", "meta.k8s.io")) => group = true,
                Some(("v", "v1")) => version = Some("meta.k8s.io/v1"),
                Some(("v", "v1beta1")) => version = Some("meta.k8s.io/v1beta1"),
                _ => {}
            }
        }
        let json = ["application/json", "application/*", "*/*"]
            .iter()
            .any(|t| ty.eq_ignore_ascii_case(t));
        let protobuf = ty.eq_ignore_ascii_case(PROTOBUF);
        match as_kind {
            None if json || protobuf => return None,
            Some(k @ ("PartialObjectMetadata" | "PartialObjectMetadataList"))
                if (json || protobuf) && group =>
            {
                if let Some(api_version) = version {
                    return Some(MetadataForm {
                        list: k == "PartialObjectMetadataList",
                        api_version,
                        protobuf,
                    });
                }
            }
            _ => {}
        }
    }
    None
}

/// The Go type kube-apiserver's messages name for an object of `config`
/// (`*core.Pod`): the internal type of a built-in kind (its package is the
/// group's first label, `core` for the legacy group and for
/// events.k8s.io's Event), else `*unstructured.Unstructured`.
fn go_type(config: &ResourceConfig, list: bool) -> String {
    let suffix = if list { "List" } else { "" };
    if !is_builtin_type(&config.api_version(), &config.kind) {
        return format!("*unstructured.Unstructured{suffix}");
    }
    let package = match config.group.as_str() {
        "" | "events.k8s.io" => "core",
        g => g.split('.').next().unwrap_or(g),
    };
    format!("*{package}.{}{suffix}", config.kind)
}

/// The metadata form a request asks for; a form for the other kind of
/// endpoint (a List's on a Get) is kube-apiserver's 406.
pub fn metadata(
    req: &Request<Incoming>,
    list: bool,
    config: &ResourceConfig,
) -> Result<Option<MetadataForm>, ApiStatus> {
    let accept = req.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
    let Some(form) = metadata_form(accept) else {
        return Ok(None);
    };
    if form.list == list {
        return Ok(Some(form));
    }
    let go_type = go_type(config, list);
    let message = if list {
        format!(
            "you requested PartialObjectMetadata, but the requested object is a list ({go_type})"
        )
    } else {
        format!(
            "you requested PartialObjectMetadataList, but the requested object is not a list ({go_type})"
        )
    };
    Err(ApiStatus::new(406, "NotAcceptable", message))
}

/// Which discovery document an `Accept` header asks `/api` or `/apis` for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoveryFormat {
    /// `APIVersions` / `APIGroupList` (no `Accept`, or plain JSON first).
    Legacy,
    /// `apidiscovery.k8s.io/v2` `APIGroupDiscoveryList`, as JSON.
    AggregatedV2,
    /// Only aggregated forms this server does not serve (v2beta1, removed in
    /// Kubernetes 1.33; protobuf): kube-apiserver's 406.
    NotAcceptable,
}

/// kube-apiserver's discovery negotiation: the first media range of the
/// `Accept` header that can be served decides. An aggregated range
/// (`as=APIGroupDiscoveryList;g=apidiscovery.k8s.io`) is served for `v=v2`
/// as JSON; any other aggregated range is passed over; anything else is the
/// legacy document.
pub fn discovery_format(accept: Option<&str>) -> DiscoveryFormat {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return DiscoveryFormat::Legacy;
    };
    for media in accept.split(',') {
        let mut parts = media.split(';').map(str::trim);
        let ty = parts.next().unwrap_or("");
        let (mut as_list, mut group, mut v2) = (false, false, false);
        for p in parts {
            match p.split_once('=') {
                Some(("as", "APIGroupDiscoveryList")) => as_list = true,
                Some(("g", "apidiscovery.k8s.io")) => group = true,
                Some(("v", "v2")) => v2 = true,
                _ => {}
            }
        }
        if !(as_list && group) {
            return DiscoveryFormat::Legacy;
        }
        let json = ["application/json", "application/*", "*/*"]
            .iter()
            .any(|t| ty.eq_ignore_ascii_case(t));
        if json && v2 {
            return DiscoveryFormat::AggregatedV2;
        }
    }
    DiscoveryFormat::NotAcceptable
}

/// kube-apiserver's protobuf media type (`k8s\0` + `runtime.Unknown` bodies).
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
/// The protobuf watch stream: length-delimited `WatchEvent` frames.
pub const PROTOBUF_WATCH: &str = "application/vnd.kubernetes.protobuf;stream=watch";

/// Whether the `Accept` header prefers protobuf: its first media range this
/// server can serve is `application/vnd.kubernetes.protobuf` (client-go's
/// protobuf clients send `application/vnd.kubernetes.protobuf,application/json`).
pub fn wants_protobuf(accept: Option<&str>) -> bool {
    let Some(accept) = accept else {
        return false;
    };
    for media in accept.split(',') {
        let mut parts = media.split(';').map(str::trim);
        let ty = parts.next().unwrap_or("");
        // Tables and other `as=` conversions are JSON-only here.
        let converted = parts.any(|p| p.starts_with("as="));
        if ty.eq_ignore_ascii_case(PROTOBUF) && !converted {
            return true;
        }
        if ["application/json", "application/*", "*/*"]
            .iter()
            .any(|t| ty.eq_ignore_ascii_case(t))
        {
            return false;
        }
    }
    false
}

/// The media type of a `Content-Type` header, lowercased, without parameters.
pub fn media_type(content_type: Option<&str>) -> Option<String> {
    content_type.map(|ct| {
        ct.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase()
    })
}

/// Whether to answer this request in protobuf: the client prefers it and the
/// resource is a built-in type (others, like custom resources, stay JSON).
pub fn protobuf(req: &Request<Incoming>, config: &ResourceConfig) -> bool {
    let accept = req.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
    wants_protobuf(accept) && is_builtin_type(&config.api_version(), &config.kind)
}

/// How much of each object a row carries (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn parse(v: Option<&str>) -> Result<IncludeObject, String> {
        match v {
            None | Some("") | Some("Metadata") => Ok(IncludeObject::Metadata),
            Some("None") => Ok(IncludeObject::None),
            Some("Object") => Ok(IncludeObject::Object),
            Some(other) => Err(format!(
                "invalid includeObject {other:?}: want None, Metadata or Object"
            )),
        }
    }
}

/// The Table a get, list or watch asks for (kubectl's `Accept`), with the
/// rows' `includeObject`; `None`: the objects themselves.
pub fn table(req: &Request<Incoming>, query: &Query) -> Result<Option<IncludeObject>, ApiStatus> {
    let accept = req.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
    if !wants_table(accept) {
        return Ok(None);
    }
    IncludeObject::parse(query.get("includeObject"))
        .map(Some)
        .map_err(ApiStatus::bad_request)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_accept() {
        assert!(wants_table(Some(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
        )));
        assert!(!wants_table(Some("application/json")));
        assert!(!wants_table(None));
    }

    #[test]
    fn protobuf_accept() {
        assert!(wants_protobuf(Some(
            "application/vnd.kubernetes.protobuf, application/json"
        )));
        assert!(wants_protobuf(Some("application/vnd.kubernetes.protobuf")));
        assert!(!wants_protobuf(Some(
            "application/json, application/vnd.kubernetes.protobuf"
        )));
        assert!(!wants_protobuf(Some(
            "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io, application/json"
        )));
        assert!(!wants_protobuf(Some("*/*")));
        assert!(!wants_protobuf(None));
    }

    #[test]
    fn metadata_accept() {
        let v1 = Some(MetadataForm {
            list: false,
            api_version: "meta.k8s.io/v1",
            protobuf: false,
        });
        assert_eq!(
            metadata_form(Some(
                "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
            )),
            v1
        );
        // client-go's metadata client: protobuf first, then JSON.
        assert_eq!(
            metadata_form(Some(
                "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1beta1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1beta1"
            )),
            Some(MetadataForm {
                list: true,
                api_version: "meta.k8s.io/v1beta1",
                protobuf: true,
            })
        );
        // A plain range first wins.
        assert_eq!(
            metadata_form(Some(
                "application/json,application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
            )),
            None
        );
        // Another group or version is not this form.
        assert_eq!(
            metadata_form(Some("application/json;as=PartialObjectMetadata;g=x;v=v1")),
            None
        );
        assert_eq!(
            metadata_form(Some(
                "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v2"
            )),
            None
        );
        assert_eq!(metadata_form(None), None);
    }
}

//! Query-string parsing for the REST API: percent-decoding and the typed
//! Kubernetes list/watch/write parameters. Every malformed value is a 400.

use std::time::Duration;

use super::status::ApiStatus;
use crate::cacher::ResourceVersionMatch;

/// Decodes `application/x-www-form-urlencoded` text (`+` is a space).
/// Invalid escapes are kept literally; invalid UTF-8 is replaced.
pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 3;
                }
                _ => {
                    out.push(b'%');
                    i += 1;
                }
            },
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The decoded `key=value` pairs of a query string, in order.
#[derive(Debug, Default, Clone)]
pub struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    pub fn parse(query: Option<&str>) -> Query {
        let mut pairs = Vec::new();
        if let Some(q) = query {
            for part in q.split('&') {
                if part.is_empty() {
                    continue;
                }
                let (k, v) = part.split_once('=').unwrap_or((part, ""));
                pairs.push((percent_decode(k), percent_decode(v)));
            }
        }
        Query { pairs }
    }

    /// The first value of `key`, as Kubernetes takes it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn has(&self, key: &str) -> bool {
        self.pairs.iter().any(|(k, _)| k == key)
    }

    /// A boolean parameter: absent or empty -> false; otherwise one of the
    /// spellings [`parse_bool`] accepts; anything else -> 400.
    pub fn bool(&self, key: &str) -> Result<bool, ApiStatus> {
        match self.get(key) {
            None | Some("") => Ok(false),
            Some(v) => parse_bool(v).ok_or_else(|| {
                ApiStatus::bad_request(format!("invalid value {v:?} for boolean parameter {key}"))
            }),
        }
    }

    /// `resourceVersion`: absent or empty -> None; a non-negative integer otherwise.
    pub fn resource_version(&self) -> Result<Option<i64>, ApiStatus> {
        parse_resource_version(self.get("resourceVersion"))
    }

    /// `resourceVersionMatch`.
    pub fn resource_version_match(&self) -> Result<Option<ResourceVersionMatch>, ApiStatus> {
        match self.get("resourceVersionMatch") {
            None | Some("") => Ok(None),
            Some("Exact") => Ok(Some(ResourceVersionMatch::Exact)),
            Some("NotOlderThan") => Ok(Some(ResourceVersionMatch::NotOlderThan)),
            Some(v) => Err(ApiStatus::bad_request(format!(
                "invalid resourceVersionMatch {v:?}: want Exact or NotOlderThan"
            ))),
        }
    }

    /// `limit`: absent, empty or 0 -> None; a positive integer otherwise.
    pub fn limit(&self) -> Result<Option<i64>, ApiStatus> {
        match self.get("limit") {
            None | Some("") => Ok(None),
            Some(v) => match v.parse::<i64>() {
                Ok(0) => Ok(None),
                Ok(n) if n > 0 => Ok(Some(n)),
                _ => Err(ApiStatus::bad_request(format!(
                    "invalid limit {v:?}: want a non-negative integer"
                ))),
            },
        }
    }

    /// `continue`: absent or empty -> None.
    pub fn continue_token(&self) -> Option<String> {
        match self.get("continue") {
            None | Some("") => None,
            Some(v) => Some(v.to_string()),
        }
    }

    /// `timeoutSeconds`: absent or empty -> None; a non-negative integer otherwise.
    pub fn timeout(&self) -> Result<Option<Duration>, ApiStatus> {
        match self.get("timeoutSeconds") {
            None | Some("") => Ok(None),
            Some(v) => match v.parse::<u64>() {
                Ok(0) => Ok(None),
                Ok(n) => Ok(Some(Duration::from_secs(n.min(365 * 24 * 3600)))),
                Err(_) => Err(ApiStatus::bad_request(format!(
                    "invalid timeoutSeconds {v:?}: want a non-negative integer"
                ))),
            },
        }
    }

    /// `dryRun`: absent -> false; `All` -> true; anything else -> 400.
    pub fn dry_run(&self) -> Result<bool, ApiStatus> {
        let mut dry = false;
        for (k, v) in &self.pairs {
            if k != "dryRun" {
                continue;
            }
            match v.as_str() {
                "All" => dry = true,
                "" => {}
                other => {
                    return Err(ApiStatus::bad_request(format!(
                        "invalid dryRun value {other:?}: only \"All\" is supported"
                    )));
                }
            }
        }
        Ok(dry)
    }
}

/// A boolean as Go's `strconv.ParseBool` reads it (`1 t T TRUE true True` /
/// `0 f F FALSE false False`), the one spelling rule for every boolean
/// parameter (`watch`, `allowWatchBookmarks`, ...): the request's verb and
/// its routing never disagree on what `?watch=True` means.
pub fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Parses a resourceVersion string (query or DeleteOptions).
pub fn parse_resource_version(v: Option<&str>) -> Result<Option<i64>, ApiStatus> {
    match v {
        None | Some("") => Ok(None),
        Some(s) => match s.parse::<i64>() {
            Ok(n) if n >= 0 => Ok(Some(n)),
            _ => Err(ApiStatus::bad_request(format!(
                "invalid resourceVersion {s:?}: want a non-negative integer"
            ))),
        },
    }
}

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
        let ty = parts.next().unwrap_or("").to_ascii_lowercase();
        // Tables and other `as=` conversions are JSON-only here.
        let converted = parts.any(|p| p.starts_with("as="));
        match ty.as_str() {
            PROTOBUF if !converted => return true,
            "application/json" | "application/*" | "*/*" => return false,
            _ => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode() {
        assert_eq!(percent_decode("a%3Db+c"), "a=b c");
        assert_eq!(percent_decode("%"), "%");
        assert_eq!(percent_decode("%4"), "%4");
        assert_eq!(percent_decode("%zz1"), "%zz1");
        assert_eq!(percent_decode("x%2"), "x%2");
        assert_eq!(percent_decode("%41"), "A");
    }

    #[test]
    fn query_values() {
        let q = Query::parse(Some(
            "watch=1&resourceVersion=5&limit=10&labelSelector=app%3Dweb&timeoutSeconds=3&dryRun=All",
        ));
        assert!(q.bool("watch").unwrap());
        assert_eq!(q.resource_version().unwrap(), Some(5));
        assert_eq!(q.limit().unwrap(), Some(10));
        assert_eq!(q.get("labelSelector"), Some("app=web"));
        assert_eq!(q.timeout().unwrap(), Some(Duration::from_secs(3)));
        assert!(q.dry_run().unwrap());
        let bad = Query::parse(Some(
            "resourceVersion=x&limit=-1&timeoutSeconds=z&watch=maybe&dryRun=Some",
        ));
        assert_eq!(bad.resource_version().unwrap_err().code, 400);
        assert_eq!(bad.limit().unwrap_err().code, 400);
        assert_eq!(bad.timeout().unwrap_err().code, 400);
        assert_eq!(bad.bool("watch").unwrap_err().code, 400);
        assert_eq!(bad.dry_run().unwrap_err().code, 400);
        assert_eq!(
            Query::parse(Some("resourceVersion=-3"))
                .resource_version()
                .unwrap_err()
                .code,
            400
        );
    }

    #[test]
    fn booleans_are_go_parse_bool() {
        for t in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_bool(t), Some(true), "{t}");
        }
        for f in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_bool(f), Some(false), "{f}");
        }
        for bad in ["", "yes", "tRUE", "2", " true", "on"] {
            assert_eq!(parse_bool(bad), None, "{bad:?}");
        }
        // Absent and empty are false, not an error.
        assert!(!Query::parse(Some("watch=")).bool("watch").unwrap());
        assert!(!Query::parse(None).bool("watch").unwrap());
    }

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
}

//! Query-string parsing for the REST API: percent-decoding and the typed
//! Kubernetes list/watch/write parameters. Every malformed value is a 400.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::api::status::ApiStatus;
use crate::cacher::ResourceVersionMatch;
use crate::object::sharding::ShardSelector;
use crate::object::{FieldSelector, LabelSelector};

/// The decoded `key=value` pairs of a query string, in order
/// (`application/x-www-form-urlencoded`: `+` is a space, invalid escapes are
/// kept literally, invalid UTF-8 is replaced; decoded by `form_urlencoded`).
///
/// Parsed for every request: the query is copied once, and a pair that
/// needs no decoding (most do not) is a range of that copy.
#[derive(Debug, Default, Clone)]
pub struct Query {
    raw: String,
    pairs: SmallVec<[(Text, Text); 4]>,
}

/// One key or value of a [`Query`].
#[derive(Debug, Clone)]
enum Text {
    /// `raw[start..end]`, as sent.
    Raw(usize, usize),
    Decoded(String),
}

impl Query {
    pub fn parse(query: Option<&str>) -> Query {
        let raw = query.unwrap_or_default().to_string();
        // Nothing to decode (no escape, no `+`): each pair is a range of the
        // copy, split where `form_urlencoded` splits it (on `&`, skipping
        // empty parts, then at the first `=`) but without its decoder's
        // passes over every byte: most queries (`resourceVersion=0`) are
        // this, and their decode was about 1% of a Get's CPU.
        if !raw.bytes().any(|b| b == b'%' || b == b'+') {
            let mut pairs = SmallVec::new();
            let mut start = 0;
            for part in raw.split('&') {
                let end = start + part.len();
                if !part.is_empty() {
                    pairs.push(match part.find('=') {
                        Some(i) => (Text::Raw(start, start + i), Text::Raw(start + i + 1, end)),
                        None => (Text::Raw(start, end), Text::Raw(0, 0)),
                    });
                }
                start = end + 1;
            }
            return Query { raw, pairs };
        }
        let base = raw.as_ptr() as usize;
        // A borrowed piece is a slice of `raw` (checked: anything else, such
        // as the static "" of a pair without `=`, is kept as decoded text).
        let text = |c: Cow<'_, str>| match c {
            Cow::Borrowed("") => Text::Raw(0, 0),
            Cow::Borrowed(b) => {
                let start = (b.as_ptr() as usize).checked_sub(base);
                match start.map(|s| (s, s + b.len())) {
                    Some((s, e)) if raw.get(s..e) == Some(b) => Text::Raw(s, e),
                    _ => Text::Decoded(b.to_string()),
                }
            }
            Cow::Owned(o) => Text::Decoded(o),
        };
        let pairs = form_urlencoded::parse(raw.as_bytes())
            .map(|(k, v)| (text(k), text(v)))
            .collect();
        Query { raw, pairs }
    }

    fn text<'a>(&'a self, t: &'a Text) -> &'a str {
        match t {
            Text::Raw(start, end) => self.raw.get(*start..*end).unwrap_or(""),
            Text::Decoded(s) => s,
        }
    }

    /// The pairs, in order.
    fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.pairs.iter().map(|(k, v)| (self.text(k), self.text(v)))
    }

    /// The first value of `key`, as Kubernetes takes it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    pub fn has(&self, key: &str) -> bool {
        self.pairs().any(|(k, _)| k == key)
    }

    /// A boolean parameter: absent -> false; sent -> [`list_option_bool`].
    pub fn bool(&self, key: &str) -> bool {
        self.get(key).is_some_and(list_option_bool)
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
    /// `shardSelector`, when the `ShardedListAndWatch` gate is `on` (off,
    /// kube-apiserver ignores it). A bad one is kube-apiserver's 500: its
    /// storage layer refuses it with a plain error, which it reports with
    /// no reason.
    pub fn shard_selector(&self, on: bool) -> Result<Option<Arc<ShardSelector>>, ApiStatus> {
        match self.get("shardSelector") {
            Some(s) if on && !s.is_empty() => ShardSelector::parse(s)
                .map(|sel| Some(Arc::new(sel)))
                .map_err(|e| ApiStatus::new(500, "", format!("invalid shard selector: {e}"))),
            _ => Ok(None),
        }
    }

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
        for (k, v) in self.pairs() {
            if k != "dryRun" {
                continue;
            }
            match v {
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

    /// The label and field selectors (`labelSelector`, `fieldSelector`);
    /// fields are those of `index_paths` (a resource's indexed fields).
    pub fn selectors(
        &self,
        index_paths: &[Arc<str>],
    ) -> Result<(LabelSelector, FieldSelector), ApiStatus> {
        let labels = LabelSelector::parse(self.get("labelSelector").unwrap_or(""))
            .map_err(|e| ApiStatus::bad_request(e.to_string()))?;
        let fields = FieldSelector::parse(self.get("fieldSelector").unwrap_or(""), index_paths)
            .map_err(|e| ApiStatus::bad_request(e.to_string()))?;
        Ok((labels, fields))
    }
}

/// A boolean query parameter as kube-apiserver decodes `ListOptions`
/// (apimachinery's `Convert_Slice_string_To_bool`): only `0` and `false`
/// (any case) are false; anything else sent, even an empty value
/// (`?watch`, `?watch=`), is true. One rule for every boolean parameter
/// (`watch`, `allowWatchBookmarks`, `sendInitialEvents`), so the request's
/// verb and its routing never disagree on what a value means.
pub fn list_option_bool(v: &str) -> bool {
    !(v == "0" || v.eq_ignore_ascii_case("false"))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode() {
        let decoded = |v: &str| {
            Query::parse(Some(&format!("k={v}")))
                .get("k")
                .map(str::to_string)
        };
        assert_eq!(decoded("a%3Db+c").as_deref(), Some("a=b c"));
        assert_eq!(decoded("%").as_deref(), Some("%"));
        assert_eq!(decoded("%4").as_deref(), Some("%4"));
        assert_eq!(decoded("%zz1").as_deref(), Some("%zz1"));
        assert_eq!(decoded("x%2").as_deref(), Some("x%2"));
        assert_eq!(decoded("%41").as_deref(), Some("A"));
        assert_eq!(decoded("%FF").as_deref(), Some("\u{FFFD}"));
        // Keys decode too; a key without `=` has an empty value; empty
        // parts are skipped; the first value counts.
        let q = Query::parse(Some("a%62c=1&&flag&x=1&x=2&sp+ace=%20"));
        assert_eq!(q.get("abc"), Some("1"));
        assert_eq!(q.get("flag"), Some(""));
        assert!(q.has("flag") && !q.has("nope"));
        assert_eq!(q.get("x"), Some("1"));
        assert_eq!(q.get("sp ace"), Some(" "));
        assert_eq!(Query::parse(None).get("x"), None);
        assert_eq!(Query::parse(Some("")).get(""), None);
    }

    /// A query with nothing to decode is split without the decoder: the
    /// pairs must be the ones `form_urlencoded` gives, whatever the shape.
    #[test]
    fn undecoded_queries_split_as_form_urlencoded_does() {
        let mut cases: Vec<String> = [
            "",
            "&",
            "&&",
            "=",
            "==",
            "a=1&&b&c=&=x&d==e&",
            "&a=1&",
            "resourceVersion=0",
            "watch=1&resourceVersion=5&limit=10",
            "k=\u{e9}t\u{e9}&\u{1F600}=1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // Every string of up to 5 characters over `a`, `=`, `&`.
        let mut frontier = vec![String::new()];
        for _ in 0..5 {
            frontier = frontier
                .iter()
                .flat_map(|p| ['a', '=', '&'].map(|c| format!("{p}{c}")))
                .collect();
            cases.extend(frontier.iter().cloned());
        }
        for case in &cases {
            let ours: Vec<(String, String)> = Query::parse(Some(case))
                .pairs()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let theirs: Vec<(String, String)> = form_urlencoded::parse(case.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
            assert_eq!(ours, theirs, "{case:?}");
        }
    }

    #[test]
    fn query_values() {
        let q = Query::parse(Some(
            "watch=1&resourceVersion=5&limit=10&labelSelector=app%3Dweb&timeoutSeconds=3&dryRun=All",
        ));
        assert!(q.bool("watch"));
        assert_eq!(q.resource_version().unwrap(), Some(5));
        assert_eq!(q.limit().unwrap(), Some(10));
        assert_eq!(q.get("labelSelector"), Some("app=web"));
        assert_eq!(q.timeout().unwrap(), Some(Duration::from_secs(3)));
        assert!(q.dry_run().unwrap());
        let bad = Query::parse(Some(
            "resourceVersion=x&limit=-1&timeoutSeconds=z&dryRun=Some",
        ));
        assert_eq!(bad.resource_version().unwrap_err().code, 400);
        assert_eq!(bad.limit().unwrap_err().code, 400);
        assert_eq!(bad.timeout().unwrap_err().code, 400);
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
    fn booleans_are_kubernetes_list_options() {
        for t in [
            "1", "t", "T", "TRUE", "true", "True", "", "yes", "2", " false", "f",
        ] {
            assert!(list_option_bool(t), "{t:?}");
        }
        for f in ["0", "false", "False", "FALSE", "fAlSe"] {
            assert!(!list_option_bool(f), "{f:?}");
        }
        // Sent without a value is true; absent is false.
        assert!(Query::parse(Some("watch=")).bool("watch"));
        assert!(Query::parse(Some("watch")).bool("watch"));
        assert!(Query::parse(Some("a=1&watch&b=2")).bool("watch"));
        assert!(!Query::parse(None).bool("watch"));
        assert!(!Query::parse(Some("watches=1")).bool("watch"));
    }
}

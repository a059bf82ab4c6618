//! Opaque, validated continue tokens (docs/DESIGN.md section 2).
//!
//! Same shape as Kubernetes' etcd3 tokens: URL-safe base64 of
//! `{"v":"meta.k8s.io/v1","rv":N,"start":"<key relative to the resource prefix>"}`,
//! where `start` is the first key of the next page. The key is relative so a
//! token can never name a key outside the resource's prefix, and it is
//! path-validated so `..` tricks are rejected.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

const VERSION: &str = "meta.k8s.io/v1";

#[derive(Debug, Serialize, Deserialize)]
struct Wire {
    v: String,
    rv: i64,
    start: String,
    /// Items in the whole list (no selectors) at `rv`, counted on the first
    /// page, so later pages get `remainingItemCount` without walking the rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    t: Option<u64>,
    /// Items returned by the pages before `start`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    n: Option<u64>,
}

/// A decoded token: the list RV and the absolute key the next page starts at (inclusive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContinueToken {
    pub rv: i64,
    pub start_key: String,
    /// (items in the whole list, items returned before `start_key`), when
    /// the list counts its remaining items.
    pub counts: Option<(u64, u64)>,
}

/// Token for the page after `last_key` of a list at `rv`. `last_key` must
/// start with `key_prefix` (it is a key the cacher just returned).
///
/// `counts`: (items in the whole list, items returned up to and including
/// `last_key`), carried for `remainingItemCount`.
pub fn encode(rv: i64, last_key: &str, key_prefix: &str, counts: Option<(u64, u64)>) -> String {
    let rel = last_key.strip_prefix(key_prefix).unwrap_or(last_key);
    // The next page starts right after `last_key`.
    let wire = Wire {
        v: VERSION.to_string(),
        rv,
        start: format!("{rel}\u{0}"),
        t: counts.map(|c| c.0),
        n: counts.map(|c| c.1),
    };
    // Serializing a plain struct of strings and integers cannot fail.
    let json = serde_json::to_vec(&wire).unwrap_or_default();
    URL_SAFE_NO_PAD.encode(json)
}

/// Decodes and validates `token` against `key_prefix` (which ends with '/').
pub fn decode(token: &str, key_prefix: &str) -> Result<ContinueToken, String> {
    let raw = URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .or_else(|_| base64::engine::general_purpose::STANDARD.decode(token))
        .map_err(|_| "continue key is not valid: not base64".to_string())?;
    let wire: Wire =
        serde_json::from_slice(&raw).map_err(|e| format!("continue key is not valid: {e}"))?;
    if wire.v != VERSION {
        return Err(format!(
            "continue key is not valid: incorrect encoded start resourceVersion (version {})",
            wire.v
        ));
    }
    if wire.rv <= 0 {
        return Err("continue key is not valid: incorrect encoded start resourceVersion".into());
    }
    validate_relative(&wire.start)?;
    Ok(ContinueToken {
        rv: wire.rv,
        start_key: format!("{key_prefix}{}", wire.start),
        counts: wire.t.zip(wire.n),
    })
}

/// A relative key must be non-empty, relative, and free of `.`/`..`/empty
/// path segments, so `prefix + key` stays under the prefix.
fn validate_relative(rel: &str) -> Result<(), String> {
    let bad = || Err(format!("continue key is not valid: {rel:?}"));
    if rel.is_empty() || rel.starts_with('/') {
        return bad();
    }
    let segments: Vec<&str> = rel.split('/').collect();
    for (i, seg) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        let s = seg.trim_end_matches('\0');
        if s == "." || s == ".." || (seg.is_empty() && !last) {
            return bad();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "/registry/pods/";

    #[test]
    fn round_trip() {
        let t = encode(42, "/registry/pods/ns/a", P, None);
        let d = decode(&t, P).unwrap();
        assert_eq!(d.rv, 42);
        assert_eq!(d.start_key, "/registry/pods/ns/a\0");
        assert!(d.start_key.starts_with(P));
    }

    fn forge(rv: i64, start: &str) -> String {
        URL_SAFE_NO_PAD.encode(
            serde_json::to_vec(&serde_json::json!({"v": VERSION, "rv": rv, "start": start}))
                .unwrap(),
        )
    }

    #[test]
    fn rejects_escapes_and_garbage() {
        for start in [
            "../secrets/x",
            "ns/../../secrets",
            "/abs",
            "",
            "./x",
            "a//b",
            "..",
        ] {
            assert!(decode(&forge(5, start), P).is_err(), "{start:?} accepted");
        }
        assert!(decode(&forge(0, "ns/a"), P).is_err(), "rv 0");
        assert!(decode(&forge(-3, "ns/a"), P).is_err(), "negative rv");
        assert!(decode("!!!not base64", P).is_err());
        assert!(decode(&URL_SAFE_NO_PAD.encode(b"{}"), P).is_err());
        let wrong_v = URL_SAFE_NO_PAD.encode(br#"{"v":"x","rv":3,"start":"a"}"#);
        assert!(decode(&wrong_v, P).is_err());
        assert!(decode(&forge(5, "ns/a\u{0}"), P).is_ok());
    }

    #[test]
    fn counts_round_trip_and_old_tokens_have_none() {
        let t = encode(9, "/registry/pods/ns/b", P, Some((40, 10)));
        assert_eq!(decode(&t, P).unwrap().counts, Some((40, 10)));
        let t = encode(9, "/registry/pods/ns/b", P, None);
        assert_eq!(decode(&t, P).unwrap().counts, None);
    }
}

//! Name validation as Kubernetes does it (`k8s.io/apimachinery/pkg/util/validation`):
//! the one home of the RFC 1123 rules, used for object names and namespaces
//! (REST API), label-key prefixes (selectors) and configured groups, versions
//! and plurals (config).
//!
//! Like Kubernetes' `IsDNS1123Label` / `IsDNS1123Subdomain`, each check
//! returns the list of what is wrong (empty = valid) in Kubernetes' words, so
//! a `422 Invalid` reads the same as kube-apiserver's.

/// Longest RFC 1123 label (`DNS1123LabelMaxLength`).
pub const DNS1123_LABEL_MAX_LENGTH: usize = 63;
/// Longest RFC 1123 subdomain (`DNS1123SubdomainMaxLength`).
pub const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_ERR_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_ERR_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";

/// Kubernetes `MaxLenError`.
fn max_len_error(length: usize) -> String {
    format!("must be no more than {length} characters")
}

/// Kubernetes `RegexError` (its spacing included, so messages match).
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let mut out = format!("{msg} (e.g. ");
    for (i, e) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push('\'');
        out.push_str(e);
        out.push_str("', ");
    }
    out.push_str("regex used for validation is '");
    out.push_str(fmt);
    out.push_str("')");
    out
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
fn matches_label(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    match (b.first(), b.last()) {
        (Some(f), Some(l)) => alnum(f) && alnum(l) && b.iter().all(|c| alnum(c) || *c == b'-'),
        _ => false,
    }
}

/// Kubernetes `IsDNS1123Label`: what is wrong with `value` as an RFC 1123
/// label (namespaces, resource plurals, versions); empty when valid.
pub fn is_dns1123_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_LABEL_MAX_LENGTH));
    }
    if !matches_label(value) {
        errs.push(regex_error(
            DNS1123_LABEL_ERR_MSG,
            DNS1123_LABEL_FMT,
            &["my-name", "123-abc"],
        ));
    }
    errs
}

/// Kubernetes `IsDNS1123Subdomain`: what is wrong with `value` as an RFC 1123
/// subdomain (object names, API groups, label-key prefixes); empty when
/// valid. As in Kubernetes, only the whole is limited to 253 characters, not
/// each dot-separated label.
pub fn is_dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if !value.split('.').all(matches_label) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_ERR_MSG,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

const DNS1035_LABEL_FMT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const DNS1035_LABEL_ERR_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character";

/// Kubernetes `IsDNS1035Label`: what is wrong with `value` as an RFC 1035
/// label (Service names: they become DNS names that must not start with a
/// digit); empty when valid.
pub fn is_dns1035_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_LABEL_MAX_LENGTH));
    }
    if !(matches_label(value) && value.as_bytes()[0].is_ascii_lowercase()) {
        errs.push(regex_error(
            DNS1035_LABEL_ERR_MSG,
            DNS1035_LABEL_FMT,
            &["my-name", "abc-123"],
        ));
    }
    errs
}

/// Kubernetes `IsValidPathSegmentName`: what is wrong with `value` as one
/// segment of a URL path (RBAC names such as `system:node`); empty when
/// valid.
pub fn is_path_segment_name(value: &str) -> Vec<String> {
    if value == "." || value == ".." {
        return vec![format!("may not be '{value}'")];
    }
    ["/", "%"]
        .into_iter()
        .filter(|c| value.contains(c))
        .map(|c| format!("may not contain '{c}'"))
        .collect()
}

/// Which rule an object's name follows, as kube-apiserver validates each
/// kind: namespaces are RFC 1123 labels, Services RFC 1035 labels, RBAC
/// objects any path segment (`system:controller:...`), everything else an
/// RFC 1123 subdomain.
pub fn object_name_errors(group: &str, plural: &str, name: &str) -> Vec<String> {
    match (group, plural) {
        ("", "namespaces") => is_dns1123_label(name),
        ("", "services") => is_dns1035_label(name),
        ("rbac.authorization.k8s.io", _) => is_path_segment_name(name),
        _ => is_dns1123_subdomain(name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_kubernetes_name_rule() {
        let ok = |g, p, n| object_name_errors(g, p, n).is_empty();
        assert!(ok(
            "rbac.authorization.k8s.io",
            "clusterroles",
            "system:node"
        ));
        assert!(!ok("rbac.authorization.k8s.io", "clusterroles", "a/b"));
        assert!(!ok("rbac.authorization.k8s.io", "roles", ".."));
        assert!(!ok("", "pods", "system:node"));
        assert!(ok("", "pods", "a.b"));
        assert!(!ok("", "namespaces", "a.b"));
        assert!(ok("", "namespaces", "1ns"));
        assert!(!ok("", "services", "1svc"));
        assert!(ok("", "services", "svc-1"));
        assert_eq!(
            is_path_segment_name("a/%"),
            ["may not contain '/'", "may not contain '%'"]
        );
    }

    #[test]
    fn labels() {
        for ok in ["a", "pods", "v1", "123-abc", "a-b-c", &"a".repeat(63)] {
            assert!(is_dns1123_label(ok).is_empty(), "{ok}");
        }
        for bad in ["", "-a", "a-", "Pods", "a.b", "a_b", "é", &"a".repeat(64)] {
            assert!(!is_dns1123_label(bad).is_empty(), "{bad}");
        }
        assert_eq!(
            is_dns1123_label("Foo"),
            vec![
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
            ]
        );
        assert_eq!(
            is_dns1123_label(&"a".repeat(64)),
            vec!["must be no more than 63 characters"]
        );
    }

    #[test]
    fn subdomains() {
        for ok in ["a", "example.com", "a-1.b-2", "0.0", &"a".repeat(100)] {
            assert!(is_dns1123_subdomain(ok).is_empty(), "{ok}");
        }
        for bad in ["", ".", "a..b", "a.", ".a", "A.com", "a_b", "-a.b", "a-.b"] {
            assert!(!is_dns1123_subdomain(bad).is_empty(), "{bad}");
        }
        let long = format!("{}.com", "a".repeat(250));
        assert_eq!(
            is_dns1123_subdomain(&long),
            vec!["must be no more than 253 characters"]
        );
        assert_eq!(
            is_dns1123_subdomain("Web"),
            vec![
                r"a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            ]
        );
    }
}

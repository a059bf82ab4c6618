//! Impersonation (`Impersonate-User`, `-Group`, `-Uid`, `-Extra-*`:
//! `kubectl --as`, `--as-group`, `--as-uid`), kube-apiserver's
//! `WithImpersonation` filter: after authentication, each thing asked for
//! must be allowed to the requestor with the verb `impersonate` on `users`,
//! `groups`, `serviceaccounts`, `uids` or `userextras/{key}`; the request
//! then runs as the impersonated user.

use std::collections::BTreeMap;

use hyper::HeaderMap;

use crate::api::status::ApiStatus;
use crate::auth::{
    ANONYMOUS_USER, AUTHENTICATED_GROUP, Attributes, Authorizer, UNAUTHENTICATED_GROUP, UserInfo,
};
use crate::object::go_quote;
use crate::object::validation::{is_dns1123_label, is_dns1123_subdomain};

const USER: &str = "impersonate-user";
const GROUP: &str = "impersonate-group";
const UID: &str = "impersonate-uid";
const EXTRA_PREFIX: &str = "impersonate-extra-";
const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// One thing a request asks to impersonate (kube's `ObjectReference`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Wanted {
    User(String),
    ServiceAccount { namespace: String, name: String },
    Group(String),
    Extra { key: String, value: String },
    Uid(String),
}

impl Wanted {
    /// The authorizer's question: may the requestor impersonate this?
    fn attributes(&self) -> Attributes<'_> {
        let base = Attributes {
            verb: "impersonate",
            is_resource_request: true,
            api_version: "v1",
            ..Attributes::default()
        };
        match self {
            Wanted::User(n) => Attributes {
                resource: "users",
                name: n,
                ..base
            },
            Wanted::ServiceAccount { namespace, name } => Attributes {
                resource: "serviceaccounts",
                namespace,
                name,
                ..base
            },
            Wanted::Group(g) => Attributes {
                resource: "groups",
                name: g,
                ..base
            },
            Wanted::Extra { key, value } => Attributes {
                api_group: "authentication.k8s.io",
                resource: "userextras",
                subresource: key,
                name: value,
                ..base
            },
            Wanted::Uid(u) => Attributes {
                api_group: "authentication.k8s.io",
                resource: "uids",
                name: u,
                ..base
            },
        }
    }
}

/// `system:serviceaccount:{namespace}:{name}` with a valid namespace and
/// name (kube's `serviceaccount.SplitUsername`).
fn split_service_account(user: &str) -> Option<(String, String)> {
    let rest = user.strip_prefix(SERVICE_ACCOUNT_PREFIX)?;
    let (namespace, name) = rest.split_once(':')?;
    if name.contains(':')
        || !is_dns1123_label(namespace).is_empty()
        || !is_dns1123_subdomain(name).is_empty()
    {
        return None;
    }
    Some((namespace.to_string(), name.to_string()))
}

/// What the headers ask for, in kube-apiserver's order; `Err` is its 400
/// for groups, extras or a uid without a user.
fn wanted(headers: &HeaderMap) -> Result<Vec<Wanted>, ApiStatus> {
    let mut out = Vec::new();
    let user = headers
        .get(USER)
        .and_then(|v| v.to_str().ok())
        .filter(|u| !u.is_empty());
    if let Some(u) = user {
        out.push(match split_service_account(u) {
            Some((namespace, name)) => Wanted::ServiceAccount { namespace, name },
            None => Wanted::User(u.to_string()),
        });
    }
    let mut others = false;
    for g in headers.get_all(GROUP) {
        others = true;
        out.push(Wanted::Group(
            String::from_utf8_lossy(g.as_bytes()).into_owned(),
        ));
    }
    // Header names arrive lower-cased; an extra key may be %-encoded.
    let mut extras: Vec<(&str, &hyper::header::HeaderValue)> = headers
        .iter()
        .filter_map(|(n, v)| n.as_str().strip_prefix(EXTRA_PREFIX).map(|k| (k, v)))
        .collect();
    extras.sort_by_key(|(k, _)| *k);
    for (key, value) in extras {
        others = true;
        let key = percent_decode(key);
        out.push(Wanted::Extra {
            key,
            value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
        });
    }
    if let Some(u) = headers
        .get(UID)
        .and_then(|v| v.to_str().ok())
        .filter(|u| !u.is_empty())
    {
        others = true;
        out.push(Wanted::Uid(u.to_string()));
    }
    if others && user.is_none() {
        return Err(ApiStatus::bad_request(format!(
            "requested {} without impersonating a user name",
            go_default_info(&out)
        )));
    }
    Ok(out)
}

/// Go's `%#v` of the `*user.DefaultInfo` a user-less request asked for, as
/// kube-apiserver 1.36+ prints it (its default constrained impersonation
/// filter): `&user.DefaultInfo{Name:"", UID:"…", Groups:[]string{…},
/// Extra:map[string][]string{…}}`, extras by key.
fn go_default_info(wanted: &[Wanted]) -> String {
    let strings = |v: &[&str]| {
        let q: Vec<String> = v.iter().map(|s| go_quote(s)).collect();
        format!("[]string{{{}}}", q.join(", "))
    };
    let mut uid = "";
    let mut groups: Vec<&str> = Vec::new();
    let mut extra: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for w in wanted {
        match w {
            Wanted::Uid(u) => uid = u,
            Wanted::Group(g) => groups.push(g),
            Wanted::Extra { key, value } => extra.entry(key).or_default().push(value),
            Wanted::User(_) | Wanted::ServiceAccount { .. } => {}
        }
    }
    let groups = if groups.is_empty() {
        "[]string(nil)".to_string()
    } else {
        strings(&groups)
    };
    let extra = if extra.is_empty() {
        "map[string][]string(nil)".to_string()
    } else {
        let pairs: Vec<String> = extra
            .iter()
            .map(|(k, v)| format!("{}:{}", go_quote(k), strings(v)))
            .collect();
        format!("map[string][]string{{{}}}", pairs.join(", "))
    };
    format!(
        "&user.DefaultInfo{{Name:\"\", UID:{}, Groups:{groups}, Extra:{extra}}}",
        go_quote(uid)
    )
}

/// `%XX`-decoded, as Go's `url.PathUnescape`; the key as sent if malformed.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok());
            match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                Some(v) => {
                    out.push(v);
                    i += 3;
                    continue;
                }
                None => return s.to_string(),
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_string())
}

/// The user a request runs as: `requestor` itself without impersonation
/// headers, else the impersonated user once every part of it is allowed.
/// `Err`: kube-apiserver's 400 (a group, extra or uid without a user) or
/// 403 (`users "bob" is forbidden: User "alice" cannot impersonate
/// resource "users" in API group "" at the cluster scope`).
pub(crate) fn impersonate(
    authorizer: &Authorizer,
    requestor: &UserInfo,
    headers: &HeaderMap,
) -> Result<Option<UserInfo>, ApiStatus> {
    let wanted = wanted(headers)?;
    if wanted.is_empty() {
        return Ok(None);
    }
    let groups_given = headers.contains_key(GROUP);
    let mut user = UserInfo::default();
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for w in &wanted {
        let attrs = w.attributes();
        let decision = authorizer.authorize(requestor, &attrs);
        if !decision.allowed {
            let mut status =
                ApiStatus::forbidden(attrs.forbidden_message(requestor, &decision.reason))
                    .with_details(attrs.name.to_string(), attrs.resource.to_string());
            if !attrs.api_group.is_empty() {
                status = status.with_group(attrs.api_group);
            }
            return Err(status);
        }
        match w {
            Wanted::User(n) => user.name = n.clone(),
            Wanted::ServiceAccount { namespace, name } => {
                user.name = format!("{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}");
                if !groups_given {
                    user.groups = vec![
                        "system:serviceaccounts".into(),
                        format!("system:serviceaccounts:{namespace}"),
                    ];
                }
            }
            Wanted::Group(g) => user.groups.push(g.clone()),
            Wanted::Extra { key, value } => {
                extra.entry(key.clone()).or_default().push(value.clone())
            }
            Wanted::Uid(u) => user.uid = u.clone(),
        }
    }
    let (add, unless) = if user.name == ANONYMOUS_USER {
        (UNAUTHENTICATED_GROUP, &[UNAUTHENTICATED_GROUP][..])
    } else {
        (
            AUTHENTICATED_GROUP,
            &[AUTHENTICATED_GROUP, UNAUTHENTICATED_GROUP][..],
        )
    };
    if !user.groups.iter().any(|g| unless.contains(&g.as_str())) {
        user.groups.push(add.into());
    }
    user.extra = extra;
    Ok(Some(user))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn headers_become_kube_apiservers_requests() {
        let w = wanted(&headers(&[
            ("impersonate-user", "system:serviceaccount:ns:builder"),
            ("impersonate-group", "devs"),
            ("impersonate-extra-scopes", "view"),
            ("impersonate-extra-acme.com%2fteam", "a"),
            ("impersonate-uid", "1234"),
        ]))
        .unwrap();
        assert_eq!(
            w,
            [
                Wanted::ServiceAccount {
                    namespace: "ns".into(),
                    name: "builder".into()
                },
                Wanted::Group("devs".into()),
                Wanted::Extra {
                    key: "acme.com/team".into(),
                    value: "a".into()
                },
                Wanted::Extra {
                    key: "scopes".into(),
                    value: "view".into()
                },
                Wanted::Uid("1234".into()),
            ]
        );
        assert_eq!(
            wanted(&headers(&[(
                "impersonate-user",
                "system:serviceaccount:Bad:x"
            )]))
            .unwrap(),
            [Wanted::User("system:serviceaccount:Bad:x".into())],
            "not a valid namespace: a plain user name"
        );
        let err = wanted(&headers(&[("impersonate-group", "devs")])).unwrap_err();
        assert_eq!(err.code, 400);
        assert_eq!(
            err.message,
            r#"requested &user.DefaultInfo{Name:"", UID:"", Groups:[]string{"devs"}, Extra:map[string][]string(nil)} without impersonating a user name"#
        );
        assert!(wanted(&HeaderMap::new()).unwrap().is_empty());
    }

    #[test]
    fn the_impersonated_user_gets_kube_apiservers_groups() {
        let allow = Authorizer::AlwaysAllow;
        let alice = UserInfo {
            name: "alice".into(),
            ..Default::default()
        };
        let as_user = |h: &[(&'static str, &'static str)]| {
            impersonate(&allow, &alice, &headers(h)).unwrap().unwrap()
        };
        assert_eq!(
            as_user(&[("impersonate-user", "bob")]).groups,
            [AUTHENTICATED_GROUP]
        );
        assert_eq!(
            as_user(&[("impersonate-user", "bob"), ("impersonate-group", "devs")]).groups,
            ["devs", AUTHENTICATED_GROUP]
        );
        assert_eq!(
            as_user(&[("impersonate-user", "system:anonymous")]).groups,
            [UNAUTHENTICATED_GROUP]
        );
        let sa = as_user(&[("impersonate-user", "system:serviceaccount:ns:b")]);
        assert_eq!(
            sa.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:ns",
                AUTHENTICATED_GROUP
            ]
        );
        let extra = as_user(&[
            ("impersonate-user", "bob"),
            ("impersonate-extra-scopes", "view"),
        ]);
        assert_eq!(
            extra.extra.get("scopes").map(Vec::as_slice),
            Some(&["view".to_string()][..])
        );
        assert_eq!(
            impersonate(&allow, &alice, &HeaderMap::new()).unwrap(),
            None
        );
    }
}

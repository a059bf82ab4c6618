//! Aggregated discovery (`apidiscovery.k8s.io/v2`): every group, version and
//! resource in one document on `/api` (the core group) and `/apis` (the
//! others), as kube-apiserver serves it to kubectl and client-go when they
//! ask for it (`Accept: application/json;g=apidiscovery.k8s.io;v=v2;
//! as=APIGroupDiscoveryList`): one request instead of one per group version.
//!
//! The shape, the order of groups and versions and the ETag follow
//! kube-apiserver's `endpoints/discovery/aggregated` (its handler, and the
//! group priorities of `pkg/controlplane/apiserver/aggregator.go`); the
//! structs below keep Go's field order, so the ETag is computed over the same
//! bytes Go's `json.Marshal` would hash.

use std::cmp::Ordering;

use serde::Serialize;
use sha2::{Digest, Sha512};

use crate::config::ResourceConfig;

/// The `Content-Type` of an aggregated discovery answer.
pub const CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

const VERBS: [&str; 7] = [
    "create", "delete", "get", "list", "patch", "update", "watch",
];

/// `APIGroupDiscoveryList` without its type meta: what the ETag hashes.
#[derive(Debug, Serialize)]
pub struct GroupDiscoveryList {
    metadata: Empty,
    items: Vec<GroupDiscovery>,
}

#[derive(Debug, Serialize)]
struct Empty {}

#[derive(Debug, Serialize)]
struct GroupDiscovery {
    metadata: GroupMeta,
    versions: Vec<VersionDiscovery>,
}

#[derive(Debug, Serialize)]
struct GroupMeta {
    #[serde(skip_serializing_if = "str::is_empty")]
    name: String,
}

#[derive(Debug, Serialize)]
struct VersionDiscovery {
    version: String,
    resources: Vec<ResourceDiscovery>,
    freshness: &'static str,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ResourceDiscovery {
    resource: String,
    response_kind: Gvk,
    scope: &'static str,
    singular_resource: String,
    verbs: Vec<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    short_names: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    categories: Vec<String>,
}

/// A resource's `responseKind`: the group and version are empty when they
/// are the resource's own.
#[derive(Debug, Serialize)]
struct Gvk {
    group: &'static str,
    version: &'static str,
    kind: String,
}

/// kube-apiserver's group and version priorities
/// (`apiVersionPriorities`, cmd/kube-apiserver/app/aggregator.go and
/// pkg/controlplane/apiserver/aggregator.go, 1.34-1.37): (group, version,
/// group priority, version priority). Groups sort by priority, highest
/// first, then by name; versions by priority, then as Kubernetes compares
/// version strings. Other groups (custom resources) have 1000.
const PRIORITIES: &[(&str, &str, u32, u32)] = &[
    ("", "v1", 18000, 1),
    ("apiregistration.k8s.io", "v1", 18000, 15),
    ("apps", "v1", 17800, 15),
    ("events.k8s.io", "v1", 17750, 15),
    ("events.k8s.io", "v1beta1", 17750, 5),
    ("authentication.k8s.io", "v1", 17700, 15),
    ("authentication.k8s.io", "v1beta1", 17700, 9),
    ("authentication.k8s.io", "v1alpha1", 17700, 1),
    ("authorization.k8s.io", "v1", 17600, 15),
    ("autoscaling", "v2", 17500, 30),
    ("autoscaling", "v1", 17500, 15),
    ("autoscaling", "v2beta1", 17500, 9),
    ("autoscaling", "v2beta2", 17500, 1),
    ("batch", "v1", 17400, 15),
    ("batch", "v1beta1", 17400, 9),
    ("certificates.k8s.io", "v1", 17300, 15),
    ("certificates.k8s.io", "v1beta1", 17300, 9),
    ("certificates.k8s.io", "v1alpha1", 17300, 1),
    ("networking.k8s.io", "v1", 17200, 15),
    ("networking.k8s.io", "v1beta1", 17200, 9),
    ("policy", "v1", 17100, 15),
    ("policy", "v1beta1", 17100, 9),
    ("rbac.authorization.k8s.io", "v1", 17000, 15),
    ("storage.k8s.io", "v1", 16800, 15),
    ("storage.k8s.io", "v1beta1", 16800, 9),
    ("storage.k8s.io", "v1alpha1", 16800, 1),
    ("apiextensions.k8s.io", "v1", 16700, 15),
    ("admissionregistration.k8s.io", "v1", 16700, 15),
    ("admissionregistration.k8s.io", "v1beta1", 16700, 12),
    ("admissionregistration.k8s.io", "v1alpha1", 16700, 9),
    ("scheduling.k8s.io", "v1", 16600, 15),
    ("scheduling.k8s.io", "v1beta1", 16600, 9),
    ("scheduling.k8s.io", "v1alpha3", 16600, 3),
    ("coordination.k8s.io", "v1", 16500, 15),
    ("coordination.k8s.io", "v1beta1", 16500, 13),
    ("coordination.k8s.io", "v1alpha2", 16500, 12),
    ("node.k8s.io", "v1", 16300, 15),
    ("node.k8s.io", "v1beta1", 16300, 9),
    ("node.k8s.io", "v1alpha1", 16300, 1),
    ("discovery.k8s.io", "v1", 16200, 15),
    ("discovery.k8s.io", "v1beta1", 16200, 12),
    ("resource.k8s.io", "v1", 16200, 21),
    ("resource.k8s.io", "v1beta2", 16200, 15),
    ("resource.k8s.io", "v1beta1", 16200, 9),
    ("resource.k8s.io", "v1alpha3", 16200, 1),
    ("flowcontrol.apiserver.k8s.io", "v1", 16100, 21),
    ("flowcontrol.apiserver.k8s.io", "v1beta3", 16100, 18),
    ("flowcontrol.apiserver.k8s.io", "v1beta2", 16100, 15),
    ("flowcontrol.apiserver.k8s.io", "v1beta1", 16100, 12),
    ("flowcontrol.apiserver.k8s.io", "v1alpha1", 16100, 9),
    ("internal.apiserver.k8s.io", "v1alpha1", 16000, 9),
    ("storagemigration.k8s.io", "v1", 15800, 15),
    ("storagemigration.k8s.io", "v1beta1", 15800, 9),
    ("lifecycle.k8s.io", "v1alpha1", 15700, 1),
];

/// A custom resource group's priority in kube-apiserver.
const DEFAULT_GROUP_PRIORITY: u32 = 1000;

fn group_priority(group: &str) -> u32 {
    PRIORITIES
        .iter()
        .filter(|p| p.0 == group)
        .map(|p| p.2)
        .max()
        .unwrap_or(DEFAULT_GROUP_PRIORITY)
}

fn version_priority(group: &str, version: &str) -> u32 {
    PRIORITIES
        .iter()
        .find(|p| p.0 == group && p.1 == version)
        .map_or(0, |p| p.3)
}

/// Kubernetes' version string order (`version.CompareKubeAwareVersionStrings`):
/// GA before beta before alpha, higher major then higher minor first; a
/// string that is not `v<N>[alpha|beta<M>]` after every one that is, by name.
fn kube_version_order(a: &str, b: &str) -> Ordering {
    fn parse(v: &str) -> Option<(u32, u8, u32)> {
        let rest = v.strip_prefix('v')?;
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let major: u32 = rest[..digits].parse().ok()?;
        let tail = &rest[digits..];
        let (stage, minor) = if tail.is_empty() {
            return Some((major, 2, 0));
        } else if let Some(m) = tail.strip_prefix("beta") {
            (1, m)
        } else if let Some(m) = tail.strip_prefix("alpha") {
            (0, m)
        } else {
            return None;
        };
        Some((major, stage, minor.parse().ok()?))
    }
    match (parse(a), parse(b)) {
        (Some((ma, sa, na)), Some((mb, sb, nb))) => {
            // Stage first (GA > beta > alpha), then major, then minor: all
            // higher first.
            sb.cmp(&sa).then(mb.cmp(&ma)).then(nb.cmp(&na))
        }
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

fn resource(r: &ResourceConfig) -> ResourceDiscovery {
    ResourceDiscovery {
        resource: r.plural.clone(),
        response_kind: Gvk {
            group: "",
            version: "",
            kind: r.kind.clone(),
        },
        scope: if r.namespaced {
            "Namespaced"
        } else {
            "Cluster"
        },
        singular_resource: r.kind.to_ascii_lowercase(),
        verbs: VERBS.to_vec(),
        short_names: r.short_names().into_iter().map(String::from).collect(),
        categories: r.categories().into_iter().map(String::from).collect(),
    }
}

/// The review resources (group, version, plural, kind) watchcache answers
/// itself, offered where no configured resource has their group.
type Review = (&'static str, &'static str, &'static str, &'static str);

/// The document for `/api` (`core`) or `/apis`: the configured resources of
/// the core group, or of every other group plus `reviews`.
pub fn document(
    resources: &[ResourceConfig],
    core: bool,
    reviews: &[Review],
) -> GroupDiscoveryList {
    // group -> version -> resources, in first-seen order, then sorted.
    type Versions = Vec<(String, Vec<ResourceDiscovery>)>;
    let mut groups: Vec<(String, Versions)> = Vec::new();
    let mut add = |group: &str, version: &str, res: ResourceDiscovery| {
        let gi = match groups.iter().position(|(g, _)| g == group) {
            Some(i) => i,
            None => {
                groups.push((group.to_string(), Vec::new()));
                groups.len() - 1
            }
        };
        let versions = &mut groups[gi].1;
        let vi = match versions.iter().position(|(v, _)| v == version) {
            Some(i) => i,
            None => {
                versions.push((version.to_string(), Vec::new()));
                versions.len() - 1
            }
        };
        versions[vi].1.push(res);
    };
    for r in resources.iter().filter(|r| r.group.is_empty() == core) {
        add(&r.group, &r.version, resource(r));
    }
    if !core {
        for &(g, v, plural, kind) in reviews {
            add(
                g,
                v,
                ResourceDiscovery {
                    resource: plural.to_string(),
                    response_kind: Gvk {
                        group: "",
                        version: "",
                        kind: kind.to_string(),
                    },
                    scope: "Cluster",
                    singular_resource: kind.to_ascii_lowercase(),
                    verbs: vec!["create"],
                    short_names: Vec::new(),
                    categories: Vec::new(),
                },
            );
        }
    }
    groups.sort_by(|(a, _), (b, _)| {
        group_priority(b)
            .cmp(&group_priority(a))
            .then_with(|| a.cmp(b))
    });
    let items = groups
        .into_iter()
        .map(|(group, mut versions)| {
            versions.sort_by(|(a, _), (b, _)| {
                version_priority(&group, b)
                    .cmp(&version_priority(&group, a))
                    .then_with(|| kube_version_order(a, b))
            });
            GroupDiscovery {
                metadata: GroupMeta {
                    name: group.clone(),
                },
                versions: versions
                    .into_iter()
                    .map(|(version, mut resources)| {
                        resources.sort_by(|a, b| a.resource.cmp(&b.resource));
                        VersionDiscovery {
                            version,
                            resources,
                            freshness: "Current",
                        }
                    })
                    .collect(),
            }
        })
        .collect();
    GroupDiscoveryList {
        metadata: Empty {},
        items,
    }
}

impl GroupDiscoveryList {
    /// kube-apiserver's ETag: the upper-case hex SHA-512 of the list's JSON
    /// without type meta, quoted.
    pub fn etag(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        let digest = Sha512::digest(&json);
        let hex: String = digest.iter().map(|b| format!("{b:02X}")).collect();
        format!("\"{hex}\"")
    }

    /// The answer's body: the list with its type meta, in Go's field order
    /// (so the ETag is the hash of the served items' bytes, as for
    /// kube-apiserver).
    pub fn to_body(&self) -> Vec<u8> {
        #[derive(Serialize)]
        struct Typed<'a> {
            kind: &'static str,
            #[serde(rename = "apiVersion")]
            api_version: &'static str,
            #[serde(flatten)]
            list: &'a GroupDiscoveryList,
        }
        serde_json::to_vec(&Typed {
            kind: "APIGroupDiscoveryList",
            api_version: "apidiscovery.k8s.io/v2",
            list: self,
        })
        .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn groups_and_versions_sort_as_kube_apiserver_sorts_them() {
        let mut names = vec![
            "zeta.example.com",
            "batch",
            "apps",
            "alpha.example.com",
            "events.k8s.io",
        ];
        names.sort_by(|a, b| {
            group_priority(b)
                .cmp(&group_priority(a))
                .then_with(|| a.cmp(b))
        });
        assert_eq!(
            names,
            [
                "apps",
                "events.k8s.io",
                "batch",
                "alpha.example.com",
                "zeta.example.com"
            ]
        );
        let mut vs = vec![
            "v1alpha1", "v1", "v2beta1", "v1beta2", "v2", "foo", "v1beta1",
        ];
        vs.sort_by(|a, b| kube_version_order(a, b));
        assert_eq!(
            vs,
            [
                "v2", "v1", "v2beta1", "v1beta2", "v1beta1", "v1alpha1", "foo"
            ]
        );
        // Priorities before version strings: autoscaling v2 (30) then v1.
        let mut auto = vec!["v1", "v2"];
        auto.sort_by(|a, b| {
            version_priority("autoscaling", b)
                .cmp(&version_priority("autoscaling", a))
                .then_with(|| kube_version_order(a, b))
        });
        assert_eq!(auto, ["v2", "v1"]);
    }

    #[test]
    fn documents_carry_every_configured_resource() {
        let cfg = Config::example();
        let core = document(&cfg.resources, true, &[]);
        let v = serde_json::to_value(&core).unwrap();
        assert_eq!(v["items"].as_array().map(Vec::len), Some(1));
        assert_eq!(v["items"][0]["metadata"], serde_json::json!({}));
        let pods = v["items"][0]["versions"][0]["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["resource"] == "pods")
            .cloned()
            .unwrap();
        assert_eq!(
            pods,
            serde_json::json!({
                "resource": "pods",
                "responseKind": {"group": "", "version": "", "kind": "Pod"},
                "scope": "Namespaced",
                "singularResource": "pod",
                "verbs": VERBS,
                "shortNames": ["po"],
                "categories": ["all"],
            })
        );
        let apis = document(
            &cfg.resources,
            false,
            &[(
                "authorization.k8s.io",
                "v1",
                "selfsubjectaccessreviews",
                "SelfSubjectAccessReview",
            )],
        );
        let v = serde_json::to_value(&apis).unwrap();
        let names: Vec<&str> = v["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|g| g["metadata"]["name"].as_str())
            .collect();
        assert_eq!(names, ["apps", "authorization.k8s.io"]);
        let raw = apis.to_body();
        assert!(
            raw.starts_with(br#"{"kind":"APIGroupDiscoveryList","apiVersion":"apidiscovery.k8s.io/v2","metadata":{},"items":[{"#),
            "Go's field order"
        );
        let body: serde_json::Value = serde_json::from_slice(&raw).unwrap();
        assert_eq!(body["kind"], "APIGroupDiscoveryList");
        assert_eq!(body["apiVersion"], "apidiscovery.k8s.io/v2");
        assert_eq!(body["items"], v["items"]);
    }

    /// The ETag is kube-apiserver's rule: the SHA-512 of Go's JSON of the
    /// list (the rule reproduces the ETag kube-apiserver 1.34.4 sent for its
    /// whole `/api`; the value below is Python's hashlib of the same bytes).
    #[test]
    fn etag_is_the_sha512_of_gos_json() {
        let list = GroupDiscoveryList {
            metadata: Empty {},
            items: vec![GroupDiscovery {
                metadata: GroupMeta {
                    name: String::new(),
                },
                versions: vec![VersionDiscovery {
                    version: "v1".into(),
                    resources: vec![ResourceDiscovery {
                        resource: "bindings".into(),
                        response_kind: Gvk {
                            group: "",
                            version: "",
                            kind: "Binding".into(),
                        },
                        scope: "Namespaced",
                        singular_resource: "binding".into(),
                        verbs: vec!["create"],
                        short_names: Vec::new(),
                        categories: Vec::new(),
                    }],
                    freshness: "Current",
                }],
            }],
        };
        assert_eq!(
            String::from_utf8(serde_json::to_vec(&list).unwrap()).unwrap(),
            r#"{"metadata":{},"items":[{"metadata":{},"versions":[{"version":"v1","resources":[{"resource":"bindings","responseKind":{"group":"","version":"","kind":"Binding"},"scope":"Namespaced","singularResource":"binding","verbs":["create"]}],"freshness":"Current"}]}]}"#
        );
        assert_eq!(
            list.etag(),
            "\"58F4AA0D6858A3CF43D6258FDEBCE0B16810FE68480D6E511BB296D8297686976FD02C7588374696C2842113A69DD42F0F615A44294CDDA673D4EAD3022A8E42\""
        );
    }
}

//! Printers of core kinds: kube-apiserver's `printConfigMap`, `printSecret`,
//! `printNamespace`, `printServiceAccount`, `printService` and `printNode`.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::{
    AGE, Column, NAME, Printer, Row, age, boolean, format_labels, int, list, map, map_len, name,
    string,
};

/// kube-apiserver's `configMapColumnDefinitions`.
pub(super) const CONFIG_MAP_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Data",
        "string",
        0,
        "Data contains the configuration data. Each key must consist of alphanumeric characters, '-', '_' or '.'. Values with non-UTF-8 byte sequences must use the BinaryData field. The keys stored in Data must not overlap with the keys in the BinaryData field, this is enforced during validation process.",
    ),
    AGE,
];

/// kube-apiserver's `secretColumnDefinitions`.
pub(super) const SECRET_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Type",
        "string",
        0,
        "Used to facilitate programmatic handling of secret data. More info: https://kubernetes.io/docs/concepts/configuration/secret/#secret-types",
    ),
    Column::new(
        "Data",
        "string",
        0,
        "Data contains the secret data. Each key must consist of alphanumeric characters, '-', '_' or '.'. The serialized form of the secret data is a base64 encoded string, representing the arbitrary (possibly non-string) data value here. Described in https://tools.ietf.org/html/rfc4648#section-4",
    ),
    AGE,
];

/// kube-apiserver's `namespaceColumnDefinitions`.
pub(super) const NAMESPACE_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Status", "string", 0, "The status of the namespace"),
    AGE,
];

/// kube-apiserver's `serviceAccountColumnDefinitions`.
pub(super) const SERVICE_ACCOUNT_COLUMNS: &[Column] = &[NAME, AGE];

/// kube-apiserver's `serviceColumnDefinitions`.
pub(super) const SERVICE_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Type",
        "string",
        0,
        "type determines how the Service is exposed. Defaults to ClusterIP. Valid options are ExternalName, ClusterIP, NodePort, and LoadBalancer. \"ClusterIP\" allocates a cluster-internal IP address for load-balancing to endpoints. Endpoints are determined by the selector or if that is not specified, by manual construction of an Endpoints object or EndpointSlice objects. If clusterIP is \"None\", no virtual IP is allocated and the endpoints are published as a set of endpoints rather than a virtual IP. \"NodePort\" builds on ClusterIP and allocates a port on every node which routes to the same endpoints as the clusterIP. \"LoadBalancer\" builds on NodePort and creates an external load-balancer (if supported in the current cloud) which routes to the same endpoints as the clusterIP. \"ExternalName\" aliases this service to the specified externalName. Several other fields do not apply to ExternalName services. More info: https://kubernetes.io/docs/concepts/services-networking/service/#publishing-services-service-types",
    ),
    Column::new(
        "Cluster-IP",
        "string",
        0,
        "clusterIP is the IP address of the service and is usually assigned randomly. If an address is specified manually, is in-range (as per system configuration), and is not in use, it will be allocated to the service; otherwise creation of the service will fail. This field may not be changed through updates unless the type field is also being changed to ExternalName (which requires this field to be blank) or the type field is being changed from ExternalName (in which case this field may optionally be specified, as describe above).  Valid values are \"None\", empty string (\"\"), or a valid IP address. Setting this to \"None\" makes a \"headless service\" (no virtual IP), which is useful when direct endpoint connections are preferred and proxying is not required.  Only applies to types ClusterIP, NodePort, and LoadBalancer. If this field is specified when creating a Service of type ExternalName, creation will fail. This field will be wiped when updating a Service to type ExternalName. More info: https://kubernetes.io/docs/concepts/services-networking/service/#virtual-ips-and-service-proxies",
    ),
    Column::new(
        "External-IP",
        "string",
        0,
        "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.  These IPs are not managed by Kubernetes.  The user is responsible for ensuring that traffic arrives at a node with this IP.  A common example is external load-balancers that are not part of the Kubernetes system.",
    ),
    Column::new(
        "Port(s)",
        "string",
        0,
        "The list of ports that are exposed by this service. More info: https://kubernetes.io/docs/concepts/services-networking/service/#virtual-ips-and-service-proxies",
    ),
    AGE,
    Column::new(
        "Selector",
        "string",
        1,
        "Route service traffic to pods with label keys and values matching this selector. If empty or not present, the service is assumed to have an external process managing its endpoints, which Kubernetes will not modify. Only applies to types ClusterIP, NodePort, and LoadBalancer. Ignored if type is ExternalName. More info: https://kubernetes.io/docs/concepts/services-networking/service/",
    ),
];

/// kube-apiserver's `nodeColumnDefinitions`.
pub(super) const NODE_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Status", "string", 0, "The status of the node"),
    Column::new("Roles", "string", 0, "The roles of the node"),
    AGE,
    Column::new(
        "Version",
        "string",
        0,
        "Kubelet Version reported by the node.",
    ),
    Column::new(
        "Internal-IP",
        "string",
        1,
        "List of addresses reachable to the node. Queried from cloud provider, if available. More info: https://kubernetes.io/docs/reference/node/node-status/#addresses Note: This field is declared as mergeable, but the merge key is not sufficiently unique, which can cause data corruption when it is merged. Callers should instead use a full-replacement patch. See https://pr.k8s.io/79391 for an example. Consumers should assume that addresses can change during the lifetime of a Node. However, there are some exceptions where this may not be possible, such as Pods that inherit a Node's address in its own status or consumers of the downward API (status.hostIP).",
    ),
    Column::new(
        "External-IP",
        "string",
        1,
        "List of addresses reachable to the node. Queried from cloud provider, if available. More info: https://kubernetes.io/docs/reference/node/node-status/#addresses Note: This field is declared as mergeable, but the merge key is not sufficiently unique, which can cause data corruption when it is merged. Callers should instead use a full-replacement patch. See https://pr.k8s.io/79391 for an example. Consumers should assume that addresses can change during the lifetime of a Node. However, there are some exceptions where this may not be possible, such as Pods that inherit a Node's address in its own status or consumers of the downward API (status.hostIP).",
    ),
    Column::new(
        "OS-Image",
        "string",
        1,
        "OS Image reported by the node from /etc/os-release (e.g. Debian GNU/Linux 7 (wheezy)).",
    ),
    Column::new(
        "Kernel-Version",
        "string",
        1,
        "Kernel Version reported by the node from 'uname -r' (e.g. 3.16.0-0.bpo.4-amd64).",
    ),
    Column::new(
        "Container-Runtime",
        "string",
        1,
        "ContainerRuntime Version reported by the node through runtime remote API (e.g. containerd://1.4.2).",
    ),
];

pub(super) const CONFIGMAPS: Printer = Printer {
    columns: CONFIG_MAP_COLUMNS,
    print: |o, now| {
        let data = map_len(o, &["data"]) + map_len(o, &["binaryData"]);
        Row::cells(vec![name(o), json!(data), age(o, now)])
    },
    internal_annotation: None,
};

pub(super) const SECRETS: Printer = Printer {
    columns: SECRET_COLUMNS,
    print: |o, now| {
        // v1 defaulting (applied when read from storage): an empty type is Opaque.
        let ty = match string(o, &["type"]) {
            "" => "Opaque",
            t => t,
        };
        Row::cells(vec![
            name(o),
            json!(ty),
            json!(map_len(o, &["data"])),
            age(o, now),
        ])
    },
    internal_annotation: None,
};

pub(super) const NAMESPACES: Printer = Printer {
    columns: NAMESPACE_COLUMNS,
    print: |o, now| {
        // v1 defaulting: an empty phase is Active.
        let phase = match string(o, &["status", "phase"]) {
            "" => "Active",
            p => p,
        };
        Row::cells(vec![name(o), json!(phase), age(o, now)])
    },
    internal_annotation: None,
};

pub(super) const SERVICEACCOUNTS: Printer = Printer {
    columns: SERVICE_ACCOUNT_COLUMNS,
    print: |o, now| Row::cells(vec![name(o), age(o, now)]),
    internal_annotation: None,
};

pub(super) const SERVICES: Printer = Printer {
    columns: SERVICE_COLUMNS,
    print: print_service,
    internal_annotation: None,
};

pub(super) const NODES: Printer = Printer {
    columns: NODE_COLUMNS,
    print: print_node,
    internal_annotation: None,
};

fn strings<'a>(v: &'a Value, path: &[&str]) -> Vec<&'a str> {
    list(v, path).iter().filter_map(Value::as_str).collect()
}

/// `getServiceExternalIP` (wide).
fn service_external_ip(svc: &Value, ty: &str) -> String {
    let external = strings(svc, &["spec", "externalIPs"]);
    match ty {
        "ClusterIP" | "NodePort" if !external.is_empty() => external.join(","),
        "ClusterIP" | "NodePort" => "<none>".into(),
        "LoadBalancer" => {
            // `loadBalancerStatusStringer`: a sorted set of IPs or hostnames.
            let lb: BTreeSet<&str> = list(svc, &["status", "loadBalancer", "ingress"])
                .iter()
                .filter_map(|i| match (string(i, &["ip"]), string(i, &["hostname"])) {
                    ("", "") => None,
                    ("", h) => Some(h),
                    (ip, _) => Some(ip),
                })
                .collect();
            let mut all: Vec<&str> = lb.into_iter().collect();
            all.extend(external);
            if all.is_empty() {
                "<pending>".into()
            } else {
                all.join(",")
            }
        }
        "ExternalName" => string(svc, &["spec", "externalName"]).to_string(),
        _ => "<unknown>".into(),
    }
}

fn print_service(svc: &Value, now: DateTime<Utc>) -> Row {
    // v1 defaulting: an empty type is ClusterIP, a port's protocol TCP.
    let ty = match string(svc, &["spec", "type"]) {
        "" => "ClusterIP",
        t => t,
    };
    let cluster_ip = strings(svc, &["spec", "clusterIPs"])
        .first()
        .map_or("<none>", |ip| *ip)
        .to_string();
    let ports: Vec<String> = list(svc, &["spec", "ports"])
        .iter()
        .map(|p| {
            let protocol = match string(p, &["protocol"]) {
                "" => "TCP",
                pr => pr,
            };
            let port = int(p, &["port"]);
            match int(p, &["nodePort"]) {
                n if n > 0 => format!("{port}:{n}/{protocol}"),
                _ => format!("{port}/{protocol}"),
            }
        })
        .collect();
    let ports = if ports.is_empty() {
        "<none>".to_string()
    } else {
        ports.join(",")
    };
    Row::cells(vec![
        name(svc),
        json!(ty),
        json!(cluster_ip),
        json!(service_external_ip(svc, ty)),
        json!(ports),
        age(svc, now),
        json!(format_labels(map(svc, &["spec", "selector"]))),
    ])
}

/// The address of the first `status.addresses` entry of type `ty`.
fn node_address(node: &Value, ty: &str) -> String {
    list(node, &["status", "addresses"])
        .iter()
        .find(|a| string(a, &["type"]) == ty)
        .map_or("<none>", |a| string(a, &["address"]))
        .to_string()
}

fn print_node(node: &Value, now: DateTime<Utc>) -> Row {
    // The last condition of a type wins, as in Go's map.
    let ready = list(node, &["status", "conditions"])
        .iter()
        .rev()
        .find(|c| string(c, &["type"]) == "Ready");
    let mut status = vec![match ready {
        Some(c) if string(c, &["status"]) == "True" => "Ready",
        Some(_) => "NotReady",
        None => "Unknown",
    }];
    if boolean(node, &["spec", "unschedulable"]) {
        status.push("SchedulingDisabled");
    }
    // `findNodeRoles`: node-role.kubernetes.io/<role> keys and kubernetes.io/role values.
    let roles: BTreeSet<&str> = map(node, &["metadata", "labels"])
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| match k.strip_prefix("node-role.kubernetes.io/") {
            Some(role) if !role.is_empty() => Some(role),
            Some(_) => None,
            None if k == "kubernetes.io/role" => v.as_str().filter(|v| !v.is_empty()),
            None => None,
        })
        .collect();
    let roles = if roles.is_empty() {
        "<none>".to_string()
    } else {
        roles.into_iter().collect::<Vec<_>>().join(",")
    };
    let info = |f: &str| string(node, &["status", "nodeInfo", f]);
    let unknown = |s: &str| {
        if s.is_empty() {
            "<unknown>".to_string()
        } else {
            s.to_string()
        }
    };
    let mut kernel = unknown(info("kernelVersion"));
    if !info("architecture").is_empty() {
        kernel = format!("{kernel} ({})", info("architecture"));
    }
    Row::cells(vec![
        name(node),
        json!(status.join(",")),
        json!(roles),
        age(node, now),
        json!(info("kubeletVersion")),
        json!(node_address(node, "InternalIP")),
        json!(node_address(node, "ExternalIP")),
        json!(unknown(info("osImage"))),
        json!(kernel),
        json!(unknown(info("containerRuntimeVersion"))),
    ])
}

//! Printers of apps kinds: kube-apiserver's `printDeployment`,
//! `printReplicaSet`, `printStatefulSet` and `printDaemonSet`.

use serde_json::{Value, json};

use super::{
    AGE, Column, NAME, Printer, Row, TEMPLATE_CONTAINERS, TEMPLATE_IMAGES, age, at,
    container_cells, format_label_selector, format_labels, int, list, map, name, selector_string,
};

/// kube-apiserver's `deploymentColumnDefinitions`.
pub(super) const DEPLOYMENT_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Ready", "string", 0, "Number of the pod with ready state"),
    Column::new(
        "Up-to-date",
        "string",
        0,
        "Total number of non-terminating pods targeted by this deployment that have the desired template spec.",
    ),
    Column::new(
        "Available",
        "string",
        0,
        "Total number of available non-terminating pods (ready for at least minReadySeconds) targeted by this deployment.",
    ),
    AGE,
    TEMPLATE_CONTAINERS,
    TEMPLATE_IMAGES,
    Column::new(
        "Selector",
        "string",
        1,
        "Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment. It must match the pod template's labels.",
    ),
];

/// kube-apiserver's `replicaSetColumnDefinitions`.
pub(super) const REPLICA_SET_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Desired",
        "integer",
        0,
        "Replicas is the number of desired pods. This is a pointer to distinguish between explicit zero and unspecified. Defaults to 1. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicaset",
    ),
    Column::new(
        "Current",
        "integer",
        0,
        "Replicas is the most recently observed number of non-terminating pods. More info: https://kubernetes.io/docs/concepts/workloads/controllers/replicaset",
    ),
    Column::new(
        "Ready",
        "integer",
        0,
        "The number of non-terminating pods targeted by this ReplicaSet with a Ready Condition.",
    ),
    AGE,
    TEMPLATE_CONTAINERS,
    TEMPLATE_IMAGES,
    Column::new(
        "Selector",
        "string",
        1,
        "Selector is a label query over pods that should match the replica count. Label keys and values that must match in order to be controlled by this replica set. It must match the pod template's labels. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
    ),
];

/// kube-apiserver's `statefulSetColumnDefinitions`.
pub(super) const STATEFUL_SET_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Ready", "string", 0, "Number of the pod with ready state"),
    AGE,
    TEMPLATE_CONTAINERS,
    TEMPLATE_IMAGES,
];

/// kube-apiserver's `daemonSetColumnDefinitions`.
pub(super) const DAEMON_SET_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Desired",
        "integer",
        0,
        "The total number of nodes that should be running the daemon pod (including nodes correctly running the daemon pod). More info: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/",
    ),
    Column::new(
        "Current",
        "integer",
        0,
        "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod. More info: https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/",
    ),
    Column::new(
        "Ready",
        "integer",
        0,
        "numberReady is the number of nodes that should be running the daemon pod and have one or more of the daemon pod running with a Ready Condition.",
    ),
    Column::new(
        "Up-to-date",
        "integer",
        0,
        "The total number of nodes that are running updated daemon pod",
    ),
    Column::new(
        "Available",
        "integer",
        0,
        "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available (ready for at least spec.minReadySeconds)",
    ),
    Column::new(
        "Node Selector",
        "string",
        0,
        "NodeSelector is a selector which must be true for the pod to fit on a node. Selector which must match a node's labels for the pod to be scheduled on that node. More info: https://kubernetes.io/docs/concepts/configuration/assign-pod-node/",
    ),
    AGE,
    TEMPLATE_CONTAINERS,
    TEMPLATE_IMAGES,
    Column::new(
        "Selector",
        "string",
        1,
        "A label query over pods that are managed by the daemon set. Must match in order to be controlled. It must match the pod template's labels. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
    ),
];

/// `spec.replicas`; apps/v1 defaulting (applied when read from storage) makes it 1.
fn replicas(o: &Value) -> i64 {
    at(o, &["spec", "replicas"])
        .and_then(Value::as_i64)
        .unwrap_or(1)
}

fn containers(o: &Value) -> [Value; 2] {
    container_cells(list(o, &["spec", "template", "spec", "containers"]))
}

pub(super) const DEPLOYMENTS: Printer = Printer {
    columns: DEPLOYMENT_COLUMNS,
    print: |o, now| {
        let ready = int(o, &["status", "readyReplicas"]);
        let selector =
            selector_string(at(o, &["spec", "selector"])).unwrap_or_else(|| "<invalid>".into());
        let [names, images] = containers(o);
        Row::cells(vec![
            name(o),
            json!(format!("{ready}/{}", replicas(o))),
            json!(int(o, &["status", "updatedReplicas"])),
            json!(int(o, &["status", "availableReplicas"])),
            age(o, now),
            names,
            images,
            json!(selector),
        ])
    },
    internal_annotation: Some("deprecated.deployment.rollback.to"),
};

pub(super) const REPLICASETS: Printer = Printer {
    columns: REPLICA_SET_COLUMNS,
    print: |o, now| {
        let [names, images] = containers(o);
        Row::cells(vec![
            name(o),
            json!(replicas(o)),
            json!(int(o, &["status", "replicas"])),
            json!(int(o, &["status", "readyReplicas"])),
            age(o, now),
            names,
            images,
            json!(format_label_selector(at(o, &["spec", "selector"]))),
        ])
    },
    internal_annotation: None,
};

pub(super) const STATEFULSETS: Printer = Printer {
    columns: STATEFUL_SET_COLUMNS,
    print: |o, now| {
        let ready = int(o, &["status", "readyReplicas"]);
        let [names, images] = containers(o);
        Row::cells(vec![
            name(o),
            json!(format!("{ready}/{}", replicas(o))),
            age(o, now),
            names,
            images,
        ])
    },
    internal_annotation: None,
};

pub(super) const DAEMONSETS: Printer = Printer {
    columns: DAEMON_SET_COLUMNS,
    print: |o, now| {
        let status = |f: &str| json!(int(o, &["status", f]));
        let [names, images] = containers(o);
        Row::cells(vec![
            name(o),
            status("desiredNumberScheduled"),
            status("currentNumberScheduled"),
            status("numberReady"),
            status("updatedNumberScheduled"),
            status("numberAvailable"),
            json!(format_labels(map(
                o,
                &["spec", "template", "spec", "nodeSelector"]
            ))),
            age(o, now),
            names,
            images,
            json!(format_label_selector(at(o, &["spec", "selector"]))),
        ])
    },
    internal_annotation: Some("deprecated.daemonset.template.generation"),
};

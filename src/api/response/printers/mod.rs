//! kube-apiserver's Table printers (`pkg/printers/internalversion` of
//! k8s.io/kubernetes v1.37): per built-in kind, the column definitions
//! (names, types, priorities and the fields' swagger descriptions) and the
//! cells of one object's row, computed from its JSON. kube-apiserver prints
//! with `Wide` set, so every row carries the priority-1 cells too; kubectl
//! shows them with `-o wide`.

mod apps;
mod batch;
mod cluster;
mod core;
mod pods;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value, json};

/// One `TableColumnDefinition`.
#[derive(Debug, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    pub ty: &'static str,
    pub format: &'static str,
    pub priority: u8,
    pub description: &'static str,
}

impl Column {
    const fn new(
        name: &'static str,
        ty: &'static str,
        priority: u8,
        description: &'static str,
    ) -> Column {
        Column {
            name,
            ty,
            format: "",
            priority,
            description,
        }
    }

    fn definition(&self) -> Value {
        json!({"name": self.name, "type": self.ty, "format": self.format,
               "description": self.description, "priority": self.priority})
    }
}

/// `metav1.ObjectMeta{}.SwaggerDoc()["name"]`, the first column of every printer.
const NAME: Column = Column {
    name: "Name",
    ty: "string",
    format: "name",
    priority: 0,
    description: "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
};

/// `metav1.ObjectMeta{}.SwaggerDoc()["creationTimestamp"]`.
/// The -o wide columns of every kind with a pod template.
const TEMPLATE_CONTAINERS: Column = Column::new(
    "Containers",
    "string",
    1,
    "Names of each container in the template.",
);
const TEMPLATE_IMAGES: Column = Column::new(
    "Images",
    "string",
    1,
    "Images referenced by each container in the template.",
);

const AGE: Column = Column::new(
    "Age",
    "string",
    0,
    "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata",
);

/// The printed row of one object: its cells and, for a finished Pod, the
/// row's conditions.
#[derive(Debug, PartialEq)]
pub struct Row {
    pub cells: Vec<Value>,
    pub conditions: Option<Value>,
}

impl Row {
    fn cells(cells: Vec<Value>) -> Row {
        Row {
            cells,
            conditions: None,
        }
    }
}

/// The printer of one kind.
pub struct Printer {
    pub columns: &'static [Column],
    print: fn(&Value, DateTime<Utc>) -> Row,
    /// An annotation that kube-apiserver's conversion to the internal type
    /// moves into a field when it holds an integer (a DaemonSet's
    /// `deprecated.daemonset.template.generation`), so that the metadata of
    /// its rows (`includeObject=Metadata`, built from the internal object)
    /// lacks it.
    internal_annotation: Option<&'static str>,
}

impl Printer {
    /// The column definitions as a Table carries them.
    pub fn column_definitions(&self) -> Value {
        Value::Array(self.columns.iter().map(Column::definition).collect())
    }

    /// The row of `obj` at time `now` (the Age cells).
    pub fn row(&self, obj: &Value, now: DateTime<Utc>) -> Row {
        (self.print)(obj, now)
    }

    /// `metadata` as kube-apiserver's PartialObjectMetadata rows carry it:
    /// less the annotation the internal type holds as a field.
    pub fn row_metadata(&self, metadata: &mut Value) {
        let Some(key) = self.internal_annotation else {
            return;
        };
        let Some(annotations) = metadata
            .get_mut("annotations")
            .and_then(Value::as_object_mut)
        else {
            return;
        };
        let converted = annotations
            .get(key)
            .and_then(Value::as_str)
            .is_some_and(|v| v.parse::<i64>().is_ok());
        if converted {
            annotations.remove(key);
            if annotations.is_empty()
                && let Some(m) = metadata.as_object_mut()
            {
                m.remove("annotations");
            }
        }
    }
}

/// The printer kube-apiserver uses for the resource `plural` of `group`,
/// if it is one of those ported here.
pub fn for_resource(group: &str, plural: &str) -> Option<&'static Printer> {
    Some(match (group, plural) {
        ("", "pods") => &pods::PODS,
        ("", "configmaps") => &core::CONFIGMAPS,
        ("", "secrets") => &core::SECRETS,
        ("", "namespaces") => &core::NAMESPACES,
        ("", "serviceaccounts") => &core::SERVICEACCOUNTS,
        ("", "services") => &core::SERVICES,
        ("", "nodes") => &core::NODES,
        ("apps", "deployments") => &apps::DEPLOYMENTS,
        ("apps", "replicasets") => &apps::REPLICASETS,
        ("apps", "statefulsets") => &apps::STATEFULSETS,
        ("apps", "daemonsets") => &apps::DAEMONSETS,
        ("batch", "jobs") => &batch::JOBS,
        ("batch", "cronjobs") => &batch::CRONJOBS,
        ("coordination.k8s.io", "leases") => &cluster::LEASES,
        ("scheduling.k8s.io", "priorityclasses") => &cluster::PRIORITYCLASSES,
        _ => return None,
    })
}

// Reading the JSON object: a missing or mistyped field reads as Go's zero value.

/// The value at `path`, if any.
fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(k))
}

/// The string at `path`, or "".
fn string<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    at(v, path).and_then(Value::as_str).unwrap_or("")
}

/// The integer at `path`, or 0.
fn int(v: &Value, path: &[&str]) -> i64 {
    at(v, path).and_then(Value::as_i64).unwrap_or(0)
}

/// The boolean at `path`, or false.
fn boolean(v: &Value, path: &[&str]) -> bool {
    at(v, path).and_then(Value::as_bool).unwrap_or(false)
}

/// The array at `path`, or none.
fn list<'a>(v: &'a Value, path: &[&str]) -> &'a [Value] {
    at(v, path)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// The map at `path`, if any.
fn map<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Map<String, Value>> {
    at(v, path).and_then(Value::as_object)
}

/// The number of entries of the map at `path`.
fn map_len(v: &Value, path: &[&str]) -> i64 {
    map(v, path).map_or(0, |m| m.len() as i64)
}

fn name(obj: &Value) -> Value {
    Value::String(string(obj, &["metadata", "name"]).to_string())
}

/// The Age cell: `translateTimestampSince(metadata.creationTimestamp)`.
fn age(obj: &Value, now: DateTime<Utc>) -> Value {
    Value::String(since(at(obj, &["metadata", "creationTimestamp"]), now))
}

/// The time a `metav1.Time` field holds, if set and valid.
fn time(v: Option<&Value>) -> Option<DateTime<Utc>> {
    let s = v?.as_str()?;
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// `translateTimestampSince`: `<unknown>` for an unset time, else the
/// human duration since it.
fn since(t: Option<&Value>, now: DateTime<Utc>) -> String {
    match time(t) {
        Some(t) => ago(t, now),
        None => "<unknown>".into(),
    }
}

/// The human duration from `t` to `now`.
fn ago(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    human_duration((now - t).num_seconds())
}

/// Kubernetes' `duration.HumanDuration` of a number of seconds.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    let s = secs.max(0);
    let m = s / 60;
    let h = s / 3600;
    let d = s / 86400;
    let y = d / 365;
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        if s % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", s % 60)
        }
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{}m", m % 60)
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        if h % 24 == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{}h", h % 24)
        }
    } else if d < 365 * 2 {
        format!("{d}d")
    } else if y < 8 {
        if d % 365 == 0 {
            format!("{y}y")
        } else {
            format!("{y}y{}d", d % 365)
        }
    } else {
        format!("{y}y")
    }
}

/// `labels.Set.String()`: `k=v` pairs sorted by key, comma-joined.
fn labels_string(labels: Option<&Map<String, Value>>) -> String {
    let mut pairs: Vec<(&String, &str)> = labels
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k, v.as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `labels.FormatLabels`: the set as a string, `<none>` when empty.
fn format_labels(labels: Option<&Map<String, Value>>) -> String {
    let s = labels_string(labels);
    if s.is_empty() { "<none>".into() } else { s }
}

/// `metav1.LabelSelectorAsSelector(sel).String()`; `None` where Go
/// returns an error (an unknown operator, In/NotIn without values).
fn selector_string(sel: Option<&Value>) -> Option<String> {
    let Some(sel) = sel.filter(|s| !s.is_null()) else {
        return Some(String::new());
    };
    // (key, rendered requirement); Go sorts the requirements by key, stably.
    let mut reqs: Vec<(String, String)> = Vec::new();
    if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in m {
            reqs.push((k.clone(), format!("{k}={}", v.as_str().unwrap_or(""))));
        }
    }
    for e in sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
    {
        let key = string(e, &["key"]);
        let mut values: Vec<&str> = list(e, &["values"])
            .iter()
            .map(|v| v.as_str().unwrap_or(""))
            .collect();
        values.sort_unstable();
        let r = match string(e, &["operator"]) {
            "In" | "NotIn" if values.is_empty() => return None,
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" if values.is_empty() => key.to_string(),
            "DoesNotExist" if values.is_empty() => format!("!{key}"),
            _ => return None,
        };
        reqs.push((key.to_string(), r));
    }
    reqs.sort_by(|a, b| a.0.cmp(&b.0));
    Some(
        reqs.into_iter()
            .map(|(_, r)| r)
            .collect::<Vec<_>>()
            .join(","),
    )
}

/// `metav1.FormatLabelSelector`: `<error>` for an invalid selector,
/// `<none>` for one that is empty.
fn format_label_selector(sel: Option<&Value>) -> String {
    match selector_string(sel) {
        None => "<error>".into(),
        Some(s) if s.is_empty() => "<none>".into(),
        Some(s) => s,
    }
}

/// `layoutContainerCells`: container names and images, comma-joined.
fn container_cells(containers: &[Value]) -> [Value; 2] {
    let join = |f: &str| {
        containers
            .iter()
            .map(|c| string(c, &[f]))
            .collect::<Vec<_>>()
            .join(",")
    };
    [Value::String(join("name")), Value::String(join("image"))]
}

/// `printBool`.
fn print_bool(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(-1), "0s");
        assert_eq!(human_duration(192), "3m12s");
        assert_eq!(human_duration(25 * 60), "25m");
        assert_eq!(human_duration(5 * 3600 + 180), "5h3m");
        assert_eq!(human_duration(20 * 3600), "20h");
        assert_eq!(human_duration(3 * 86400 + 4 * 3600), "3d4h");
        assert_eq!(human_duration(40 * 86400), "40d");
        assert_eq!(human_duration(3 * 365 * 86400 + 86400), "3y1d");
        assert_eq!(human_duration(-5), "<invalid>");
    }

    #[test]
    fn selectors() {
        let sel = json!({"matchLabels": {"b": "2", "a": "1"},
            "matchExpressions": [{"key": "c", "operator": "In", "values": ["y", "x"]},
                                 {"key": "a0", "operator": "DoesNotExist"}]});
        assert_eq!(
            format_label_selector(Some(&sel)),
            "a=1,a0,b=2,c in (x,y)".replace("a0", "!a0")
        );
        assert_eq!(format_label_selector(Some(&json!({}))), "<none>");
        assert_eq!(format_label_selector(None), "<none>");
        let bad = json!({"matchExpressions": [{"key": "c", "operator": "In"}]});
        assert_eq!(format_label_selector(Some(&bad)), "<error>");
        assert_eq!(format_labels(None), "<none>");
        assert_eq!(
            format_labels(json!({"z": "1", "a": "2"}).as_object()),
            "a=2,z=1"
        );
    }
}

/// Cases of kube-apiserver 1.37's printers_test.go for the other kinds.
#[cfg(test)]
mod kind_tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or_default()
    }

    fn cells(group: &str, plural: &str, obj: Value) -> Vec<Value> {
        let p = for_resource(group, plural).map(|p| (p.columns.len(), p.row(&obj, now())));
        let Some((columns, row)) = p else {
            panic!("no printer for {plural}")
        };
        assert_eq!(row.cells.len(), columns, "{plural}: a cell per column");
        row.cells
    }

    #[test]
    fn services() {
        let svc = |ty: &str, ports: Value, external: Value, ingress: Value| {
            json!({"metadata": {"name": "s"}, "spec": {"type": ty, "ports": ports,
                "clusterIPs": ["10.9.8.7"], "externalIPs": external, "selector": {"foo": "bar"}},
                "status": {"loadBalancer": {"ingress": ingress}}})
        };
        let tcp = json!([{"protocol": "tcp", "port": 2233}]);
        assert_eq!(
            cells(
                "",
                "services",
                svc("ClusterIP", tcp.clone(), json!(null), json!(null))
            ),
            json!([
                "s",
                "ClusterIP",
                "10.9.8.7",
                "<none>",
                "2233/tcp",
                "<unknown>",
                "foo=bar"
            ])
            .as_array()
            .cloned()
            .unwrap_or_default()
        );
        let node_port = json!([{"protocol": "tcp", "port": 8888, "nodePort": 9999}]);
        assert_eq!(
            cells(
                "",
                "services",
                svc("NodePort", node_port, json!(null), json!(null))
            )[4],
            "8888:9999/tcp"
        );
        assert_eq!(
            cells(
                "",
                "services",
                svc("LoadBalancer", tcp.clone(), json!(null), json!(null))
            )[3],
            "<pending>"
        );
        let lb = cells(
            "",
            "services",
            svc(
                "LoadBalancer",
                tcp.clone(),
                json!(["80.11.12.10"]),
                json!([{"ip": "3.4.5.6", "hostname": "test.cluster.com"}]),
            ),
        );
        assert_eq!(lb[3], "3.4.5.6,80.11.12.10");
        let none = json!({"metadata": {"name": "s"}, "spec": {"externalName": "x"}});
        assert_eq!(
            cells("", "services", none)[1..5],
            [
                json!("ClusterIP"),
                json!("<none>"),
                json!("<none>"),
                json!("<none>")
            ]
        );
    }

    #[test]
    fn nodes() {
        let node = |labels: Value, status: Value| json!({"metadata": {"name": "n", "labels": labels}, "status": status});
        let c = cells("", "nodes", node(json!({}), json!({})));
        assert_eq!(c[1..3], [json!("Unknown"), json!("<none>")]);
        let roles = json!({"node-role.kubernetes.io/master": "", "node-role.kubernetes.io/control-plane": "",
            "node-role.kubernetes.io/proxy": "", "kubernetes.io/role": "node"});
        assert_eq!(
            cells("", "nodes", node(roles, json!({})))[2],
            "control-plane,master,node,proxy"
        );
        let mut n = node(
            json!({}),
            json!({"conditions": [{"type": "Ready", "status": "False"}],
            "addresses": [{"type": "ExternalIP", "address": "1.1.1.1"}, {"type": "InternalIP", "address": "10.0.0.1"}],
            "nodeInfo": {"kubeletVersion": "v1.37.2", "kernelVersion": "6.1", "architecture": "arm64"}}),
        );
        n["spec"] = json!({"unschedulable": true});
        assert_eq!(
            cells("", "nodes", n),
            [
                "n",
                "NotReady,SchedulingDisabled",
                "<none>",
                "<unknown>",
                "v1.37.2",
                "10.0.0.1",
                "1.1.1.1",
                "<unknown>",
                "6.1 (arm64)",
                "<unknown>"
            ]
        );
    }

    #[test]
    fn jobs_and_cronjobs() {
        let job = |spec: Value, status: Value| json!({"metadata": {"name": "job1"}, "spec": spec, "status": status});
        let template = json!({"spec": {"containers": [{"name": "a", "image": "ia"}, {"name": "b", "image": "ib"}]}});
        let c = cells(
            "batch",
            "jobs",
            job(
                json!({"completions": 2, "template": template,
            "selector": {"matchLabels": {"job-label": "job-label-value"}}}),
                json!({"succeeded": 1}),
            ),
        );
        assert_eq!(
            c,
            [
                "job1",
                "Running",
                "1/2",
                "",
                "<unknown>",
                "a,b",
                "ia,ib",
                "job-label=job-label-value"
            ]
        );
        let start = "2025-12-31T23:00:00Z";
        let c = cells(
            "batch",
            "jobs",
            job(
                json!({"parallelism": 3}),
                json!({"startTime": start,
            "completionTime": "2025-12-31T23:30:00Z", "conditions": [{"type": "Complete", "status": "True"}]}),
            ),
        );
        assert_eq!(
            c[1..4],
            [json!("Complete"), json!("0/1 of 3"), json!("30m")]
        );
        let c = cells(
            "batch",
            "jobs",
            job(
                json!({}),
                json!({"startTime": start,
            "conditions": [{"type": "Suspended", "status": "True"}]}),
            ),
        );
        assert_eq!(c[1..4], [json!("Suspended"), json!("0/1"), json!("60m")]);
        let cj = json!({"metadata": {"name": "cj"}, "spec": {"schedule": "0/5 * * * ?", "suspend": false,
            "jobTemplate": {"spec": {"template": template}}},
            "status": {"active": [{}], "lastScheduleTime": "2025-12-31T23:59:00Z"}});
        assert_eq!(
            cells("batch", "cronjobs", cj),
            json!([
                "cj",
                "0/5 * * * ?",
                "<none>",
                "False",
                1,
                "60s",
                "<unknown>",
                "a,b",
                "ia,ib",
                "<none>"
            ])
            .as_array()
            .cloned()
            .unwrap_or_default()
        );
    }

    #[test]
    fn apps() {
        let template = json!({"spec": {"containers": [{"name": "c", "image": "i"}], "nodeSelector": {"disk": "ssd"}}});
        let sel = json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["b", "a"]}]});
        let obj = json!({"metadata": {"name": "d"}, "spec": {"replicas": 3, "selector": sel, "template": template},
            "status": {"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2, "availableReplicas": 1,
                "desiredNumberScheduled": 4, "numberReady": 3}});
        let sel = "app=web,env notin (a,b)";
        assert_eq!(
            cells("apps", "deployments", obj.clone()),
            json!(["d", "1/3", 2, 1, "<unknown>", "c", "i", sel])
                .as_array()
                .cloned()
                .unwrap_or_default()
        );
        assert_eq!(
            cells("apps", "replicasets", obj.clone()),
            json!(["d", 3, 2, 1, "<unknown>", "c", "i", sel])
                .as_array()
                .cloned()
                .unwrap_or_default()
        );
        assert_eq!(
            cells("apps", "statefulsets", obj.clone()),
            json!(["d", "1/3", "<unknown>", "c", "i"])
                .as_array()
                .cloned()
                .unwrap_or_default()
        );
        assert_eq!(
            cells("apps", "daemonsets", obj),
            json!(["d", 4, 0, 3, 0, 0, "disk=ssd", "<unknown>", "c", "i", sel])
                .as_array()
                .cloned()
                .unwrap_or_default()
        );
        // apps/v1 defaulting: no replicas is one.
        assert_eq!(
            cells("apps", "deployments", json!({"metadata": {"name": "d"}}))[1],
            "0/1"
        );
    }

    #[test]
    fn core_and_cluster() {
        let cm = json!({"metadata": {"name": "cm"}, "data": {"a": "1", "b": "2"}, "binaryData": {"c": ""}});
        assert_eq!(cells("", "configmaps", cm)[1], 3);
        let s = json!({"metadata": {"name": "s"}, "data": {"a": "MQ=="}});
        assert_eq!(cells("", "secrets", s)[1..3], [json!("Opaque"), json!(1)]);
        assert_eq!(
            cells("", "namespaces", json!({"metadata": {"name": "n"}}))[1],
            "Active"
        );
        assert_eq!(
            cells("", "serviceaccounts", json!({"metadata": {"name": "sa"}})).len(),
            2
        );
        let lease = json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "h"}});
        assert_eq!(cells("coordination.k8s.io", "leases", lease)[1], "h");
        let pc = json!({"metadata": {"name": "pc"}, "value": 1000, "globalDefault": true});
        assert_eq!(
            cells("scheduling.k8s.io", "priorityclasses", pc),
            json!(["pc", 1000, true, "<unknown>", "PreemptLowerPriority"])
                .as_array()
                .cloned()
                .unwrap_or_default()
        );
        assert!(for_resource("example.com", "widgets").is_none());
    }

    #[test]
    fn row_metadata_drops_what_the_internal_type_holds_as_a_field() {
        let ds = for_resource("apps", "daemonsets").map(|p| {
            let mut only = json!({"name": "d", "annotations": {"deprecated.daemonset.template.generation": "1"}});
            p.row_metadata(&mut only);
            let mut more = json!({"annotations": {"deprecated.daemonset.template.generation": "x", "a": "b"}});
            p.row_metadata(&mut more);
            (only, more)
        });
        assert_eq!(
            ds,
            Some((
                json!({"name": "d"}),
                json!({"annotations": {"deprecated.daemonset.template.generation": "x", "a": "b"}})
            ))
        );
    }
}

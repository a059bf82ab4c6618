//! The Pod printer: kube-apiserver's `printPod`.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::{
    AGE, Column, NAME, Printer, Row, age, ago, at, boolean, int, list, name, string, time,
};

/// kube-apiserver's `podColumnDefinitions`.
pub(super) const POD_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Ready",
        "string",
        0,
        "The aggregate readiness state of this pod for accepting traffic.",
    ),
    Column::new(
        "Status",
        "string",
        0,
        "The aggregate status of the containers in this pod.",
    ),
    Column::new(
        "Restarts",
        "string",
        0,
        "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
    ),
    AGE,
    Column::new(
        "IP",
        "string",
        1,
        "podIP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.",
    ),
    Column::new(
        "Node",
        "string",
        1,
        "NodeName indicates in which node this pod is scheduled. If empty, this pod is a candidate for scheduling by the scheduler defined in schedulerName. Once this field is set, the kubelet for this node becomes responsible for the lifecycle of this pod. This field should not be used to express a desire for the pod to be scheduled on a specific node. https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#nodename",
    ),
    Column::new(
        "Nominated Node",
        "string",
        1,
        "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods. This field does not guarantee that the pod will be scheduled on this node. Scheduler may decide to place the pod elsewhere if other nodes become available sooner. Scheduler may also decide to give the resources on this node to a higher priority pod that is created after preemption. As a result, this field may be different than PodSpec.nodeName when the pod is scheduled.",
    ),
    Column::new(
        "Readiness Gates",
        "string",
        1,
        "If specified, all readiness gates will be evaluated for pod readiness. A pod is ready when all its containers are ready AND all conditions specified in the readiness gates have status equal to \"True\" More info: https://git.k8s.io/enhancements/keps/sig-network/580-pod-readiness-gates",
    ),
];

pub(super) const PODS: Printer = Printer {
    columns: POD_COLUMNS,
    print: print_pod,
    internal_annotation: None,
};

/// `podutil.IsRestartableInitContainer`: `restartPolicy: Always`.
fn restartable(c: Option<&Value>) -> bool {
    c.is_some_and(|c| string(c, &["restartPolicy"]) == "Always")
}

/// The condition `ty` is present with status True.
fn condition_true(pod: &Value, ty: &str) -> bool {
    list(pod, &["status", "conditions"])
        .iter()
        .find(|c| string(c, &["type"]) == ty)
        .is_some_and(|c| string(c, &["status"]) == "True")
}

/// `lastState.terminated.finishedAt` (Go's `LastTerminationState`), if later than `latest`.
fn later_restart(status: &Value, latest: &mut Option<DateTime<Utc>>) {
    if let Some(t) = at(status, &["lastState", "terminated"]).filter(|t| t.is_object()) {
        // An unset finishedAt is Go's zero time, never after another.
        if let Some(finished) = time(t.get("finishedAt"))
            && latest.is_none_or(|l| l < finished)
        {
            *latest = Some(finished);
        }
    }
}

/// A state of a container status (`waiting`, `running`, `terminated`), if set.
fn state<'a>(status: &'a Value, which: &str) -> Option<&'a Value> {
    at(status, &["state", which]).filter(|s| s.is_object())
}

/// The reason of a terminated state: its reason, else `Signal:N`, else `ExitCode:N`.
fn terminated_reason(t: &Value, prefix: &str) -> String {
    let reason = string(t, &["reason"]);
    if !reason.is_empty() {
        format!("{prefix}{reason}")
    } else if int(t, &["signal"]) != 0 {
        format!("{prefix}Signal:{}", int(t, &["signal"]))
    } else {
        format!("{prefix}ExitCode:{}", int(t, &["exitCode"]))
    }
}

fn print_pod(pod: &Value, now: DateTime<Utc>) -> Row {
    let mut restarts = 0;
    let mut sidecar_restarts = 0;
    let init_specs = list(pod, &["spec", "initContainers"]);
    let mut total = list(pod, &["spec", "containers"]).len();
    let mut ready = 0;
    let mut last_restart: Option<DateTime<Utc>> = None;
    let mut last_sidecar_restart: Option<DateTime<Utc>> = None;

    let phase = string(pod, &["status", "phase"]);
    let status_reason = string(pod, &["status", "reason"]);
    let mut reason = if status_reason.is_empty() {
        phase.to_string()
    } else {
        status_reason.to_string()
    };
    let conditions = list(pod, &["status", "conditions"]);
    if conditions.iter().any(|c| {
        string(c, &["type"]) == "PodScheduled" && string(c, &["reason"]) == "SchedulingGated"
    }) {
        reason = "SchedulingGated".into();
    }
    let row_conditions = match phase {
        "Succeeded" => Some(json!([{"type": "Completed", "status": "True",
            "reason": "Succeeded", "message": "The pod has completed successfully."}])),
        "Failed" => Some(json!([{"type": "Completed", "status": "True",
            "reason": "Failed", "message": "The pod failed."}])),
        _ => None,
    };

    let init_spec = |name: &str| {
        init_specs
            .iter()
            .rev() // Go's map keeps the last container of a name.
            .find(|c| string(c, &["name"]) == name)
    };
    total += init_specs.iter().filter(|c| restartable(Some(c))).count();

    let mut initializing = false;
    for (i, c) in list(pod, &["status", "initContainerStatuses"])
        .iter()
        .enumerate()
    {
        let count = int(c, &["restartCount"]);
        restarts += count;
        later_restart(c, &mut last_restart);
        let sidecar = restartable(init_spec(string(c, &["name"])));
        if sidecar {
            sidecar_restarts += count;
            later_restart(c, &mut last_sidecar_restart);
        }
        let terminated = state(c, "terminated");
        let waiting_reason = state(c, "waiting").map(|w| string(w, &["reason"]));
        if terminated.is_some_and(|t| int(t, &["exitCode"]) == 0) {
            continue;
        } else if sidecar && boolean(c, &["started"]) {
            if boolean(c, &["ready"]) {
                ready += 1;
            }
            continue;
        } else if let Some(t) = terminated {
            reason = terminated_reason(t, "Init:");
        } else if let Some(w) = waiting_reason.filter(|w| !w.is_empty() && *w != "PodInitializing")
        {
            reason = format!("Init:{w}");
        } else {
            reason = format!("Init:{i}/{}", init_specs.len());
        }
        initializing = true;
        break;
    }

    if !initializing || condition_true(pod, "Initialized") {
        restarts = sidecar_restarts;
        last_restart = last_sidecar_restart;
        let mut has_running = false;
        let mut error_reason = String::new();
        for c in list(pod, &["status", "containerStatuses"]).iter().rev() {
            restarts += int(c, &["restartCount"]);
            later_restart(c, &mut last_restart);
            let waiting_reason = state(c, "waiting").map(|w| string(w, &["reason"]));
            if let Some(w) = waiting_reason.filter(|w| !w.is_empty()) {
                reason = w.to_string();
            } else if let Some(t) = state(c, "terminated") {
                reason = terminated_reason(t, "");
                if int(t, &["exitCode"]) != 0 {
                    error_reason = reason.clone();
                }
            } else if boolean(c, &["ready"]) && state(c, "running").is_some() {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" {
            if has_running && condition_true_any(pod, "Ready") {
                reason = "Running".into();
            } else if !error_reason.is_empty() {
                reason = error_reason;
            } else if has_running {
                reason = "NotReady".into();
            }
        }
    }

    let deleting = at(pod, &["metadata", "deletionTimestamp"]).is_some_and(|d| !d.is_null());
    if deleting && status_reason == "NodeLost" {
        reason = "Unknown".into();
    } else if deleting && phase != "Succeeded" && phase != "Failed" {
        reason = "Terminating".into();
    }

    let restarts_cell = match last_restart {
        Some(t) if restarts != 0 => format!("{restarts} ({} ago)", ago(t, now)),
        _ => restarts.to_string(),
    };

    let or_none = |s: &str| {
        Value::String(if s.is_empty() {
            "<none>".into()
        } else {
            s.into()
        })
    };
    let pod_ip = list(pod, &["status", "podIPs"])
        .first()
        .map_or("", |ip| string(ip, &["ip"]));
    let gates = list(pod, &["spec", "readinessGates"]);
    let readiness_gates = if gates.is_empty() {
        "<none>".to_string()
    } else {
        let true_gates = gates
            .iter()
            .filter(|g| {
                let ty = string(g, &["conditionType"]);
                conditions
                    .iter()
                    .find(|c| string(c, &["type"]) == ty)
                    .is_some_and(|c| string(c, &["status"]) == "True")
            })
            .count();
        format!("{true_gates}/{}", gates.len())
    };
    Row {
        cells: vec![
            name(pod),
            Value::String(format!("{ready}/{total}")),
            Value::String(reason),
            Value::String(restarts_cell),
            age(pod, now),
            or_none(pod_ip),
            or_none(string(pod, &["spec", "nodeName"])),
            or_none(string(pod, &["status", "nominatedNodeName"])),
            Value::String(readiness_gates),
        ],
        conditions: row_conditions,
    }
}

/// `hasPodReadyCondition`: any condition `ty` with status True.
fn condition_true_any(pod: &Value, ty: &str) -> bool {
    list(pod, &["status", "conditions"])
        .iter()
        .any(|c| string(c, &["type"]) == ty && string(c, &["status"]) == "True")
}

/// Cases of kube-apiserver 1.37's `TestPrintPod`,
/// `TestPrintPodWithRestartableInitContainer`, `TestPrintPodwide` and
/// `TestPrintPodConditions` (printers_test.go), as JSON objects.
#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or_default()
    }

    /// The RFC 3339 time `secs` before [`now`].
    fn before(secs: i64) -> String {
        (now() - chrono::Duration::seconds(secs)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    }

    fn empty(n: usize) -> Value {
        Value::Array(vec![json!({"name": ""}); n])
    }

    fn pod(name: &str, spec: Value, status: Value) -> Value {
        json!({"metadata": {"name": name}, "spec": spec, "status": status})
    }

    fn running() -> Value {
        json!({"running": {}})
    }

    fn waiting(reason: &str) -> Value {
        json!({"waiting": {"reason": reason}})
    }

    fn terminated(reason: &str, exit: i64) -> Value {
        json!({"terminated": {"reason": reason, "exitCode": exit}})
    }

    /// A lastState finished `secs` ago.
    fn finished(secs: i64) -> Value {
        json!({"terminated": {"exitCode": 0, "finishedAt": before(secs)}})
    }

    /// The first `want.len()` cells (5 without `-o wide`, 9 with it).
    fn cells(pod: &Value, want: &[&str]) {
        let row = print_pod(pod, now());
        let got: Vec<&str> = row.cells[..want.len()]
            .iter()
            .map(|c| c.as_str().unwrap_or("?"))
            .collect();
        assert_eq!(got, want, "{pod}");
    }

    fn completed(pod: &Value) -> Option<String> {
        print_pod(pod, now())
            .conditions
            .map(|c| c[0]["reason"].to_string())
    }

    #[test]
    fn print_pod_cases() {
        let two = empty(2);
        let cases = [
            (
                pod(
                    "test1",
                    json!({"containers": two}),
                    json!({"phase": "podPhase", "containerStatuses": [
                    {"ready": true, "restartCount": 3, "state": running()}, {"restartCount": 3}]}),
                ),
                ["test1", "1/2", "podPhase", "6", "<unknown>"],
            ),
            (
                pod(
                    "test2",
                    json!({"containers": two}),
                    json!({"phase": "podPhase", "containerStatuses": [
                    {"ready": true, "restartCount": 3, "state": running()},
                    {"state": waiting("ContainerWaitingReason"), "restartCount": 3}]}),
                ),
                ["test2", "1/2", "ContainerWaitingReason", "6", "<unknown>"],
            ),
            (
                pod(
                    "test3",
                    json!({"containers": two}),
                    json!({"phase": "podPhase", "containerStatuses": [
                    {"state": waiting("ContainerWaitingReason"), "restartCount": 3},
                    {"state": terminated("ContainerTerminatedReason", 0), "restartCount": 3}]}),
                ),
                ["test3", "0/2", "ContainerWaitingReason", "6", "<unknown>"],
            ),
            (
                pod(
                    "test4",
                    json!({"containers": two}),
                    json!({"phase": "podPhase", "containerStatuses": [
                    {"ready": true, "restartCount": 3, "state": running()}, {"ready": true, "restartCount": 3}]}),
                ),
                ["test4", "1/2", "podPhase", "6", "<unknown>"],
            ),
            (
                pod(
                    "test5",
                    json!({"containers": two}),
                    json!({"reason": "podReason", "phase": "podPhase", "containerStatuses": [
                    {"ready": true, "restartCount": 3, "state": running()}, {"ready": true, "restartCount": 3}]}),
                ),
                ["test5", "1/2", "podReason", "6", "<unknown>"],
            ),
            (
                pod(
                    "test6",
                    json!({"containers": two}),
                    json!({"phase": "Running", "containerStatuses": [
                    {"ready": true, "restartCount": 3, "state": terminated("Completed", 0)},
                    {"ready": true, "restartCount": 3, "state": running()}]}),
                ),
                ["test6", "1/2", "NotReady", "6", "<unknown>"],
            ),
            (
                pod(
                    "test6",
                    json!({"containers": two}),
                    json!({"phase": "Running", "containerStatuses": [
                    {"ready": true, "restartCount": 3, "state": terminated("Completed", 0)},
                    {"ready": true, "restartCount": 3, "state": running()}],
                    "conditions": [{"type": "Ready", "status": "True", "lastProbeTime": before(0)}]}),
                ),
                ["test6", "1/2", "Running", "6", "<unknown>"],
            ),
            (
                pod(
                    "test7",
                    json!({"initContainers": empty(1), "containers": empty(1)}),
                    json!({"phase": "podPhase",
                    "initContainerStatuses": [{"restartCount": 3, "state": running(), "lastState": finished(10)}],
                    "containerStatuses": [{"state": {"waiting": {}}}]}),
                ),
                ["test7", "0/1", "Init:0/1", "3 (10s ago)", "<unknown>"],
            ),
            (
                pod(
                    "test8",
                    json!({"initContainers": two, "containers": empty(1)}),
                    json!({"phase": "podPhase",
                    "initContainerStatuses": [{"restartCount": 3, "state": running(), "lastState": finished(10)},
                                              {"state": {"waiting": {}}}],
                    "containerStatuses": [{"state": {"waiting": {}}}]}),
                ),
                ["test8", "0/1", "Init:0/2", "3 (10s ago)", "<unknown>"],
            ),
            (
                pod(
                    "test9",
                    json!({"initContainers": two, "containers": empty(1)}),
                    json!({"phase": "podPhase",
                    "initContainerStatuses": [{"state": {"terminated": {"exitCode": 0}}},
                        {"restartCount": 3, "state": running(), "lastState": finished(10)}],
                    "containerStatuses": [{"state": {"waiting": {}}}]}),
                ),
                ["test9", "0/1", "Init:1/2", "3 (10s ago)", "<unknown>"],
            ),
            (
                pod(
                    "test10",
                    json!({"initContainers": two, "containers": empty(1)}),
                    json!({"phase": "podPhase",
                    "initContainerStatuses": [
                        {"restartCount": 2, "state": {"terminated": {"exitCode": 0}}, "lastState": finished(120)},
                        {"restartCount": 3, "state": running(), "lastState": finished(10)}],
                    "containerStatuses": [{"state": {"waiting": {}}}]}),
                ),
                ["test10", "0/1", "Init:1/2", "5 (10s ago)", "<unknown>"],
            ),
            (
                pod(
                    "test11",
                    json!({"initContainers": empty(1), "containers": empty(1)}),
                    json!({"phase": "Running",
                    "initContainerStatuses": [
                        {"restartCount": 2, "state": {"terminated": {"exitCode": 0}}, "lastState": finished(120)}],
                    "containerStatuses": [{"restartCount": 4, "state": running(), "lastState": finished(20)}]}),
                ),
                ["test11", "0/1", "Running", "4 (20s ago)", "<unknown>"],
            ),
            (
                pod(
                    "test12",
                    json!({"containers": empty(1)}),
                    json!({"phase": "Running", "containerStatuses": [
                    {"ready": true, "restartCount": 3, "state": running(), "lastState": finished(5 * 86400)}]}),
                ),
                ["test12", "1/1", "Running", "3 (5d ago)", "<unknown>"],
            ),
            (
                pod(
                    "test13",
                    json!({"containers": two}),
                    json!({"phase": "Running", "containerStatuses": [
                    {"ready": true, "restartCount": 0, "state": running()},
                    {"ready": true, "restartCount": 3, "state": running(), "lastState": finished(10 * 86400)}]}),
                ),
                ["test13", "2/2", "Running", "3 (10d ago)", "<unknown>"],
            ),
            (
                pod(
                    "test14",
                    json!({"containers": two}),
                    json!({"phase": "Running", "containerStatuses": [
                    {"ready": true, "restartCount": 6, "state": running(), "lastState": finished(5 * 86400)},
                    {"ready": true, "restartCount": 3, "state": running(), "lastState": finished(20 * 86400)}]}),
                ),
                ["test14", "2/2", "Running", "9 (5d ago)", "<unknown>"],
            ),
            (
                pod(
                    "test15",
                    json!({"containers": two}),
                    json!({"phase": "podPhase", "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]}),
                ),
                ["test15", "0/2", "SchedulingGated", "0", "<unknown>"],
            ),
        ];
        for (pod, want) in &cases {
            cells(pod, want);
            assert_eq!(completed(pod), None);
        }
    }

    #[test]
    fn print_pod_finished_and_terminating() {
        let one = empty(1);
        let three = empty(3);
        let deleted = before(10);
        let meta = |name: &str, deleting: bool| {
            if deleting {
                json!({"name": name, "deletionTimestamp": deleted})
            } else {
                json!({"name": name})
            }
        };
        let p = |name: &str, deleting: bool, spec: &Value, status: Value| json!({"metadata": meta(name, deleting), "spec": {"containers": spec}, "status": status});
        let crash =
            json!({"terminated": {"finishedAt": before(0), "exitCode": 1, "reason": "podCrash"}});
        let ok = json!({"terminated": {"finishedAt": before(0), "exitCode": 0}});
        let started = json!({"running": {"startedAt": before(0)}});
        let cases = [
            (
                p(
                    "test16",
                    false,
                    &one,
                    json!({"phase": "Succeeded", "containerStatuses": [{"state": terminated("Completed", 0)}]}),
                ),
                ["test16", "0/1", "Completed", "0", "<unknown>"],
                Some("\"Succeeded\""),
            ),
            (
                p(
                    "test17",
                    false,
                    &one,
                    json!({"phase": "Failed", "containerStatuses": [{"state": terminated("Error", 1)}]}),
                ),
                ["test17", "0/1", "Error", "0", "<unknown>"],
                Some("\"Failed\""),
            ),
            (
                p(
                    "test18",
                    true,
                    &one,
                    json!({"phase": "Succeeded", "containerStatuses": [{"state": terminated("Completed", 0)}]}),
                ),
                ["test18", "0/1", "Completed", "0", "<unknown>"],
                Some("\"Succeeded\""),
            ),
            (
                p(
                    "test19",
                    true,
                    &one,
                    json!({"phase": "Running", "containerStatuses": [{"state": running()}]}),
                ),
                ["test19", "0/1", "Terminating", "0", "<unknown>"],
                None,
            ),
            (
                p("test20", true, &one, json!({"phase": "Pending"})),
                ["test20", "0/1", "Terminating", "0", "<unknown>"],
                None,
            ),
            (
                p(
                    "test21",
                    false,
                    &empty(2),
                    json!({"phase": "Failed", "containerStatuses": [
                    {"state": crash, }, {"ready": true, "state": started}]}),
                ),
                ["test21", "1/2", "podCrash", "0", "<unknown>"],
                Some("\"Failed\""),
            ),
            (
                p(
                    "test22",
                    false,
                    &empty(2),
                    json!({"phase": "Failed", "containerStatuses": [
                    {"ready": true, "state": started}, {"state": crash}]}),
                ),
                ["test22", "1/2", "podCrash", "0", "<unknown>"],
                Some("\"Failed\""),
            ),
            (
                p(
                    "test23",
                    false,
                    &three,
                    json!({"phase": "Failed", "containerStatuses": [
                    {"ready": true, "state": started}, {"ready": true, "state": crash}, {"ready": true, "state": ok}]}),
                ),
                ["test23", "1/3", "podCrash", "0", "<unknown>"],
                Some("\"Failed\""),
            ),
            (
                p(
                    "test24",
                    false,
                    &three,
                    json!({"phase": "Failed", "containerStatuses": [
                    {"state": started}, {"state": crash}, {"state": ok}]}),
                ),
                ["test24", "0/3", "podCrash", "0", "<unknown>"],
                Some("\"Failed\""),
            ),
        ];
        for (pod, want, conditions) in &cases {
            cells(pod, want);
            assert_eq!(completed(pod).as_deref(), *conditions, "{pod}");
        }
        // A pod of an unreachable node being deleted (not in printers_test.go).
        let lost = p(
            "lost",
            true,
            &one,
            json!({"phase": "Running", "reason": "NodeLost"}),
        );
        cells(&lost, &["lost", "0/1", "Unknown"]);
    }

    #[test]
    fn print_pod_with_restartable_init_containers() {
        let sidecars = json!({"initContainers": [
            {"name": "restartable-init-1", "restartPolicy": "Always"},
            {"name": "restartable-init-2", "restartPolicy": "Always"}], "containers": empty(1)});
        let init = |s1: Value, started1: bool, s2: Value, started2: bool| {
            json!([
                {"name": "restartable-init-1", "restartCount": 3, "state": s1, "started": started1,
                 "lastState": finished(10)},
                {"name": "restartable-init-2", "state": s2, "started": started2}])
        };
        let cases = [
            (
                pod(
                    "test1",
                    sidecars.clone(),
                    json!({"phase": "Pending",
                    "initContainerStatuses": init(running(), false, json!({"waiting": {}}), false),
                    "containerStatuses": [{"state": {"waiting": {}}}],
                    "conditions": [{"type": "Initialized", "status": "False"}]}),
                ),
                ["test1", "0/3", "Init:0/2", "3 (10s ago)", "<unknown>"],
                None,
            ),
            (
                pod(
                    "test1",
                    sidecars.clone(),
                    json!({"phase": "Pending",
                    "initContainerStatuses": init(running(), true, running(), false),
                    "containerStatuses": [{"state": {"waiting": {}}}],
                    "conditions": [{"type": "Initialized", "status": "False"}]}),
                ),
                ["test1", "0/3", "Init:1/2", "3 (10s ago)", "<unknown>"],
                None,
            ),
            (
                pod(
                    "test2",
                    sidecars.clone(),
                    json!({"phase": "Running",
                    "initContainerStatuses": init(running(), true, running(), true),
                    "containerStatuses": [{"ready": true, "restartCount": 4, "state": running(),
                        "lastState": finished(20)}],
                    "conditions": [{"type": "Initialized", "status": "True"}]}),
                ),
                ["test2", "1/3", "Running", "7 (10s ago)", "<unknown>"],
                None,
            ),
            (
                pod(
                    "test3",
                    sidecars.clone(),
                    json!({"phase": "Succeeded",
                    "initContainerStatuses": init(terminated("Error", 137), false, terminated("Error", 137), false),
                    "containerStatuses": [{"restartCount": 4, "state": terminated("Completed", 0),
                        "lastState": finished(20)}],
                    "conditions": [{"type": "Initialized", "status": "True"}]}),
                ),
                ["test3", "0/3", "Completed", "7 (10s ago)", "<unknown>"],
                Some("\"Succeeded\""),
            ),
            (
                pod(
                    "test4",
                    json!({"initContainers": [{"name": "init1", "image": "initimage"},
                        {"name": "sidecar1", "image": "sidecarimage", "restartPolicy": "Always"}],
                    "containers": [{"name": "container1", "image": "containerimage"}]}),
                    json!({"phase": "Running",
                        "initContainerStatuses": [{"name": "initinvalid"}, {"name": "init1"}, {"name": "sidecar1"}],
                        "containerStatuses": [{"name": "containerinvalid"}, {"name": "container1"}]}),
                ),
                ["test4", "0/2", "Init:0/2", "0", "<unknown>"],
                None,
            ),
        ];
        for (pod, want, conditions) in &cases {
            cells(pod, want);
            assert_eq!(completed(pod).as_deref(), *conditions, "{pod}");
        }
    }

    #[test]
    fn print_pod_wide() {
        let gates = json!([{"conditionType": "condition1"}, {"conditionType": "condition2"},
                           {"conditionType": "condition3"}]);
        let statuses =
            json!([{"ready": true, "restartCount": 3, "state": running()}, {"restartCount": 3}]);
        let conditions = json!([{"type": "condition1", "status": "False"},
                                {"type": "condition2", "status": "True"}]);
        for ips in [
            json!([{"ip": "1.1.1.1"}]),
            json!([{"ip": "1.1.1.1"}, {"ip": "2001:db8::"}]),
        ] {
            let p = pod(
                "test1",
                json!({"containers": empty(2), "nodeName": "test1", "readinessGates": gates}),
                json!({"conditions": conditions, "phase": "podPhase", "podIPs": ips,
                       "containerStatuses": statuses, "nominatedNodeName": "node1"}),
            );
            cells(
                &p,
                &[
                    "test1",
                    "1/2",
                    "podPhase",
                    "6",
                    "<unknown>",
                    "1.1.1.1",
                    "test1",
                    "node1",
                    "1/3",
                ],
            );
        }
        let p = pod(
            "test2",
            json!({"containers": empty(2), "nodeName": ""}),
            json!({"phase": "podPhase",
            "containerStatuses": [{"ready": true, "restartCount": 3, "state": running()},
                {"state": waiting("ContainerWaitingReason"), "restartCount": 3}]}),
        );
        cells(
            &p,
            &[
                "test2",
                "1/2",
                "ContainerWaitingReason",
                "6",
                "<unknown>",
                "<none>",
                "<none>",
                "<none>",
                "<none>",
            ],
        );
    }

    #[test]
    fn print_pod_conditions() {
        let statuses =
            json!([{"ready": true, "restartCount": 3, "state": running()}, {"restartCount": 3}]);
        for (name, phase, conditions) in [
            ("test1", "Running", None),
            (
                "test1",
                "Succeeded",
                Some(json!([{"type": "Completed", "status": "True",
                "reason": "Succeeded", "message": "The pod has completed successfully."}])),
            ),
            (
                "test2",
                "Failed",
                Some(json!([{"type": "Completed", "status": "True",
                "reason": "Failed", "message": "The pod failed."}])),
            ),
        ] {
            let p = pod(
                name,
                json!({"containers": empty(2)}),
                json!({"phase": phase, "containerStatuses": statuses}),
            );
            cells(&p, &[name, "1/2", phase, "6", "<unknown>"]);
            assert_eq!(print_pod(&p, now()).conditions, conditions);
        }
    }

    #[test]
    fn age_and_columns() {
        let p = json!({"metadata": {"name": "a", "creationTimestamp": before(3 * 3600 + 60)}});
        assert_eq!(print_pod(&p, now()).cells[4], "3h1m");
        assert_eq!(POD_COLUMNS.len(), print_pod(&p, now()).cells.len());
        assert_eq!(print_pod(&json!("not a pod"), now()).cells[1], "0/0");
    }
}

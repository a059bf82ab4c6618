//! Printers of batch kinds: kube-apiserver's `printJob` and `printCronJob`.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::{
    AGE, Column, NAME, Printer, Row, TEMPLATE_CONTAINERS, TEMPLATE_IMAGES, age, ago, at,
    container_cells, format_label_selector, int, list, name, print_bool, since, string, time,
};

/// kube-apiserver's `jobColumnDefinitions`.
pub(super) const JOB_COLUMNS: &[Column] = &[
    NAME,
    Column::new("Status", "string", 0, "Status of the job."),
    Column::new(
        "Completions",
        "string",
        0,
        "The number of pods which reached phase Succeeded. The value increases monotonically for a given spec. However, it may decrease in reaction to scale down of elastic indexed jobs.",
    ),
    Column::new(
        "Duration",
        "string",
        0,
        "Time required to complete the job.",
    ),
    AGE,
    TEMPLATE_CONTAINERS,
    TEMPLATE_IMAGES,
    Column::new(
        "Selector",
        "string",
        1,
        "A label query over pods that should match the pod count. Normally, the system sets this field for you. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
    ),
];

/// kube-apiserver's `cronJobColumnDefinitions`.
pub(super) const CRON_JOB_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Schedule",
        "string",
        0,
        "The schedule in Cron format, see https://en.wikipedia.org/wiki/Cron.",
    ),
    Column::new(
        "Timezone",
        "string",
        0,
        "The time zone name for the given schedule, see https://en.wikipedia.org/wiki/List_of_tz_database_time_zones. If not specified, this will default to the time zone of the kube-controller-manager process. The set of valid time zone names and the time zone offset is loaded from the system-wide time zone database by the API server during CronJob validation and the controller manager during execution. If no system-wide time zone database can be found a bundled version of the database is used instead. If the time zone name becomes invalid during the lifetime of a CronJob or due to a change in host configuration, the controller will stop creating new new Jobs and will create a system event with the reason UnknownTimeZone. More information can be found in https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/#time-zones",
    ),
    Column::new(
        "Suspend",
        "boolean",
        0,
        "This flag tells the controller to suspend subsequent executions, it does not apply to already started executions.  Defaults to false.",
    ),
    Column::new(
        "Active",
        "integer",
        0,
        "A list of pointers to currently running jobs.",
    ),
    Column::new(
        "Last Schedule",
        "string",
        0,
        "Information when was the last time the job was successfully scheduled.",
    ),
    AGE,
    TEMPLATE_CONTAINERS,
    TEMPLATE_IMAGES,
    Column::new(
        "Selector",
        "string",
        1,
        "A label query over pods that should match the pod count. Normally, the system sets this field for you. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors",
    ),
];

pub(super) const JOBS: Printer = Printer {
    columns: JOB_COLUMNS,
    print: print_job,
    internal_annotation: None,
};

pub(super) const CRONJOBS: Printer = Printer {
    columns: CRON_JOB_COLUMNS,
    print: print_cronjob,
    internal_annotation: None,
};

/// `hasJobCondition`: the first condition of the type has status True.
fn job_condition(job: &Value, ty: &str) -> bool {
    list(job, &["status", "conditions"])
        .iter()
        .find(|c| string(c, &["type"]) == ty)
        .is_some_and(|c| string(c, &["status"]) == "True")
}

fn print_job(job: &Value, now: DateTime<Utc>) -> Row {
    let succeeded = int(job, &["status", "succeeded"]);
    let completions = match at(job, &["spec", "completions"]).and_then(Value::as_i64) {
        Some(c) => format!("{succeeded}/{c}"),
        None => match int(job, &["spec", "parallelism"]) {
            p if p > 1 => format!("{succeeded}/1 of {p}"),
            _ => format!("{succeeded}/1"),
        },
    };
    let start = time(at(job, &["status", "startTime"]));
    let duration = match (start, time(at(job, &["status", "completionTime"]))) {
        (None, _) => String::new(),
        (Some(s), None) => ago(s, now),
        (Some(s), Some(c)) => ago(s, c),
    };
    let deleting = at(job, &["metadata", "deletionTimestamp"]).is_some_and(|d| !d.is_null());
    let status = if job_condition(job, "Complete") {
        "Complete"
    } else if job_condition(job, "Failed") {
        "Failed"
    } else if deleting {
        "Terminating"
    } else if job_condition(job, "Suspended") {
        "Suspended"
    } else if job_condition(job, "FailureTarget") {
        "FailureTarget"
    } else if job_condition(job, "SuccessCriteriaMet") {
        "SuccessCriteriaMet"
    } else {
        "Running"
    };
    let [names, images] = container_cells(list(job, &["spec", "template", "spec", "containers"]));
    Row::cells(vec![
        name(job),
        json!(status),
        json!(completions),
        json!(duration),
        age(job, now),
        names,
        images,
        json!(format_label_selector(at(job, &["spec", "selector"]))),
    ])
}

fn print_cronjob(cj: &Value, now: DateTime<Utc>) -> Row {
    let last = match at(cj, &["status", "lastScheduleTime"]).filter(|t| !t.is_null()) {
        Some(t) => since(Some(t), now),
        None => "<none>".into(),
    };
    let time_zone = at(cj, &["spec", "timeZone"])
        .and_then(Value::as_str)
        .unwrap_or("<none>");
    let suspend = at(cj, &["spec", "suspend"])
        .and_then(Value::as_bool)
        .map_or("<unset>", print_bool);
    let [names, images] = container_cells(list(
        cj,
        &[
            "spec",
            "jobTemplate",
            "spec",
            "template",
            "spec",
            "containers",
        ],
    ));
    Row::cells(vec![
        name(cj),
        json!(string(cj, &["spec", "schedule"])),
        json!(time_zone),
        json!(suspend),
        json!(list(cj, &["status", "active"]).len()),
        json!(last),
        age(cj, now),
        names,
        images,
        json!(format_label_selector(at(
            cj,
            &["spec", "jobTemplate", "spec", "selector"]
        ))),
    ])
}

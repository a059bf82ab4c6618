//! Printers of cluster-wide coordination kinds: kube-apiserver's
//! `printLease` and `printPriorityClass`.

use serde_json::{Value, json};

use super::{AGE, Column, NAME, Printer, Row, age, at, boolean, int, name, string};

/// kube-apiserver's `leaseColumnDefinitions`.
pub(super) const LEASE_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Holder",
        "string",
        0,
        "holderIdentity contains the identity of the holder of a current lease. If Coordinated Leader Election is used, the holder identity must be equal to the elected LeaseCandidate.metadata.name field.",
    ),
    AGE,
];

/// kube-apiserver's `priorityClassColumnDefinitions`.
pub(super) const PRIORITY_CLASS_COLUMNS: &[Column] = &[
    NAME,
    Column::new(
        "Value",
        "integer",
        0,
        "value represents the integer value of this priority class. This is the actual priority that pods receive when they have the name of this class in their pod spec.",
    ),
    Column::new(
        "Global-Default",
        "boolean",
        0,
        "globalDefault specifies whether this PriorityClass should be considered as the default priority for pods that do not have any priority class. Only one PriorityClass can be marked as `globalDefault`. However, if more than one PriorityClasses exists with their `globalDefault` field set to true, the smallest value of such global default PriorityClasses will be used as the default priority.",
    ),
    AGE,
    Column::new(
        "PreemptionPolicy",
        "string",
        0,
        "preemptionPolicy is the Policy for preempting pods with lower priority. One of Never, PreemptLowerPriority. Defaults to PreemptLowerPriority if unset.",
    ),
];

pub(super) const LEASES: Printer = Printer {
    columns: LEASE_COLUMNS,
    print: |o, now| {
        Row::cells(vec![
            name(o),
            json!(string(o, &["spec", "holderIdentity"])),
            age(o, now),
        ])
    },
    internal_annotation: None,
};

pub(super) const PRIORITYCLASSES: Printer = Printer {
    columns: PRIORITY_CLASS_COLUMNS,
    print: |o, now| {
        // scheduling/v1 defaulting: an unset policy is PreemptLowerPriority.
        let preemption = at(o, &["preemptionPolicy"])
            .and_then(Value::as_str)
            .unwrap_or("PreemptLowerPriority");
        Row::cells(vec![
            name(o),
            json!(int(o, &["value"])),
            json!(boolean(o, &["globalDefault"])),
            age(o, now),
            json!(preemption),
        ])
    },
    internal_annotation: None,
};

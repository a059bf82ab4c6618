//! `--repeat N`: the whole comparison run N times, each against a fresh etcd
//! and daemon, then summarized as docs/BENCHMARKS.md judges the goals. One
//! run on a shared machine moves with the minute it lands in, so a goal
//! counts as met only when every run of a set meets it; the bench prints
//! that count and each ratio's spread instead of leaving them to be tallied
//! by hand.

use serde_json::{Map, Value, json};

use crate::report::{f, print_table};

/// Each ratio's values over the runs (`values` in run order, `null` for a
/// run without it; `count`, `min`, `median`, `max` of the numbers; a ratio
/// no run has is left out) and each goal's count of runs that met it
/// (`met`, `runs`, `every_run`; a run without the goal did not meet it).
pub fn summarize(reports: &[Value]) -> Value {
    let runs = reports.len();
    let mut ratios: Map<String, Value> = Map::new();
    for k in keys(reports, "ratios") {
        let values: Vec<Option<f64>> = reports
            .iter()
            .map(|r| r["ratios"][k.as_str()].as_f64())
            .collect();
        let mut xs: Vec<f64> = values.iter().flatten().copied().collect();
        if xs.is_empty() {
            continue;
        }
        xs.sort_by(f64::total_cmp);
        ratios.insert(
            k.clone(),
            json!({
                "count": xs.len(),
                "min": xs.first(),
                "median": median(&xs),
                "max": xs.last(),
                "values": values,
            }),
        );
    }
    let mut goals: Map<String, Value> = Map::new();
    for k in keys(reports, "goals") {
        let met = reports
            .iter()
            .filter(|r| r["goals"][k.as_str()].as_bool() == Some(true))
            .count();
        goals.insert(
            k.clone(),
            json!({ "met": met, "runs": runs, "every_run": met == runs }),
        );
    }
    json!({ "runs": runs, "ratios": ratios, "goals": goals })
}

/// The keys of the `field` object of any report, each once, in the order
/// they first appear.
fn keys<'a>(reports: &'a [Value], field: &str) -> Vec<&'a String> {
    let mut out: Vec<&String> = Vec::new();
    for report in reports {
        for (k, _) in report[field].as_object().into_iter().flatten() {
            if !out.contains(&k) {
                out.push(k);
            }
        }
    }
    out
}

/// The middle value of sorted `xs` (the mean of the two middle ones for an
/// even count); `None` when empty.
fn median(xs: &[f64]) -> Option<f64> {
    let n = xs.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(xs[n / 2]),
        _ => Some((xs[n / 2 - 1] + xs[n / 2]) / 2.0),
    }
}

/// Prints [`summarize`]'s figures: each ratio's min, median, max and values,
/// and each goal as met (in every run) or MISSED, with its count.
pub fn print_summary(summary: &Value) {
    let runs = summary["runs"].as_u64().unwrap_or(0);
    let num = |v: &Value| v.as_f64().map(f).unwrap_or_else(|| "-".into());
    let rows: Vec<Vec<String>> = summary["ratios"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let values: Vec<String> = v["values"]
                .as_array()
                .into_iter()
                .flatten()
                .map(num)
                .collect();
            vec![
                k.clone(),
                num(&v["min"]),
                num(&v["median"]),
                num(&v["max"]),
                values.join(" "),
            ]
        })
        .collect();
    print_table(
        &format!("ratios over {runs} runs"),
        &["ratio", "min", "median", "max", "each run"],
        &rows,
    );
    let rows: Vec<Vec<String>> = summary["goals"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let met = v["met"].as_u64().unwrap_or(0);
            let verdict = if v["every_run"].as_bool() == Some(true) {
                "met"
            } else {
                "MISSED"
            };
            vec![k.clone(), format!("{met} of {runs}"), verdict.into()]
        })
        .collect();
    if !rows.is_empty() {
        print_table(
            &format!("goals over {runs} runs (met only when every run meets it)"),
            &["goal", "runs met", "verdict"],
            &rows,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(ratio: Option<f64>, goal: bool) -> Value {
        let mut ratios = json!({ "other": null });
        if let Some(r) = ratio {
            ratios["throughput_proxy_over_etcd"] = json!(r);
        }
        json!({
            "ratios": ratios,
            "goals": { "throughput_at_least_5x": goal, "always": true },
        })
    }

    #[test]
    fn ratios_spread_and_goals_count_over_the_runs() {
        let s = summarize(&[
            report(Some(5.2), true),
            report(Some(4.9), false),
            report(None, true),
            report(Some(6.1), true),
            report(Some(5.5), true),
        ]);
        assert_eq!(s["runs"], 5);
        let r = &s["ratios"]["throughput_proxy_over_etcd"];
        assert_eq!(r["min"], 4.9);
        // Four values: the mean of the middle two.
        assert_eq!(r["median"], (5.2 + 5.5) / 2.0);
        assert_eq!(r["max"], 6.1);
        // In run order, the run without it as null.
        assert_eq!(r["values"], json!([5.2, 4.9, null, 6.1, 5.5]));
        assert_eq!(r["count"], 4);
        // A ratio that is never a number has no summary.
        assert!(s["ratios"].get("other").is_none());
        let g = &s["goals"]["throughput_at_least_5x"];
        assert_eq!(g["met"], 4);
        assert_eq!(g["runs"], 5);
        assert_eq!(g["every_run"], false);
        assert_eq!(s["goals"]["always"]["every_run"], true);
        assert_eq!(s["goals"]["always"]["met"], 5);
    }

    #[test]
    fn a_goal_some_runs_lack_counts_as_missed_there() {
        let mut only_first = report(Some(5.0), true);
        only_first["goals"]["at_10000"] = json!(true);
        let s = summarize(&[only_first, report(Some(5.0), true)]);
        assert_eq!(s["goals"]["at_10000"]["met"], 1);
        assert_eq!(s["goals"]["at_10000"]["every_run"], false);
        assert_eq!(summarize(&[])["runs"], 0);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[1.0, 2.0, 9.0]), Some(2.0));
        assert_eq!(median(&[1.0, 2.0, 4.0, 9.0]), Some(3.0));
    }
}

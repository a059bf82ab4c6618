//! Latency histograms, the summary table, and the SVG latency plot.

use std::path::Path;

use anyhow::{Result, anyhow};
use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{Value, json};

/// A latency histogram in microseconds (1 us .. 1 h, 3 significant digits).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)
        .unwrap_or_else(|_| Histogram::<u64>::new(3).unwrap_or_else(|_| unreachable!()))
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct LatencySummary {
    pub count: u64,
    pub min_ms: f64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

pub fn summarize(h: &Histogram<u64>) -> LatencySummary {
    if h.is_empty() {
        return LatencySummary::default();
    }
    let ms = |us: u64| us as f64 / 1000.0;
    LatencySummary {
        count: h.len(),
        min_ms: ms(h.min()),
        mean_ms: h.mean() / 1000.0,
        p50_ms: ms(h.value_at_quantile(0.50)),
        p90_ms: ms(h.value_at_quantile(0.90)),
        p99_ms: ms(h.value_at_quantile(0.99)),
        p999_ms: ms(h.value_at_quantile(0.999)),
        max_ms: ms(h.max()),
    }
}

/// The latency distribution as `[percentile, ms]` pairs, dense in the tail
/// (percentiles 1 - 10^(-k/20) for k = 0..=100, then the max).
pub fn distribution(h: &Histogram<u64>) -> Vec<[f64; 2]> {
    if h.is_empty() {
        return Vec::new();
    }
    let mut out: Vec<[f64; 2]> = (0..=100)
        .map(|k| 1.0 - 10f64.powf(-(k as f64) / 20.0))
        .map(|q| [q * 100.0, h.value_at_quantile(q) as f64 / 1000.0])
        .collect();
    out.push([100.0, h.max() as f64 / 1000.0]);
    out
}

/// Prints rows as an aligned table.
pub fn print_table(title: &str, header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(c.len());
            }
        }
    }
    println!("\n{title}");
    let line = |cells: Vec<String>| {
        let s: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i == 0 {
                    format!("{c:<w$}", w = widths[i])
                } else {
                    format!("{c:>w$}", w = widths[i])
                }
            })
            .collect();
        println!("  {}", s.join("  "));
    };
    line(header.iter().map(|s| s.to_string()).collect());
    line(widths.iter().map(|w| "-".repeat(*w)).collect());
    for r in rows {
        line(r.clone());
    }
}

/// Formats a float compactly for the table.
pub fn f(v: f64) -> String {
    let whole = v.fract() == 0.0 && v.abs() < 1e15;
    if !v.is_finite() {
        "-".into()
    } else if whole || v.abs() >= 1000.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else if v.abs() >= 0.1 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

/// `a / b` as JSON (null when undefined).
pub fn ratio(a: f64, b: f64) -> Value {
    if b > 0.0 && a.is_finite() && b.is_finite() {
        json!((a / b * 1000.0).round() / 1000.0)
    } else {
        Value::Null
    }
}

/// Draws latency distributions (percentile on a "nines" axis, latency on a
/// log axis), one line per series, into an SVG file.
pub fn plot_latency(path: &Path, title: &str, series: &[(String, Vec<[f64; 2]>)]) -> Result<()> {
    use plotters::prelude::*;

    // x = -log10(1 - p): 0 -> 0%, 1 -> 90%, 2 -> 99%, ...
    let nines = |p: f64| -> f64 { -(1.0 - (p / 100.0).min(0.99999)).log10() };
    let mut ymin = f64::MAX;
    let mut ymax = 0f64;
    for (_, pts) in series {
        for [_, ms] in pts {
            ymin = ymin.min(ms.max(0.001));
            ymax = ymax.max(*ms);
        }
    }
    if ymax <= 0.0 {
        return Err(anyhow!("nothing to plot"));
    }
    let ymin = (ymin / 1.5).max(0.001);
    let ymax = ymax * 1.5;

    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("plot: {e}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .margin_right(40)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..5.0f64, ymin.log10()..ymax.log10())
        .map_err(|e| anyhow!("plot: {e}"))?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (ms, log scale)")
        .x_labels(6)
        .y_labels(12)
        .x_label_formatter(&|x| {
            let p = 100.0 * (1.0 - 10f64.powf(-x));
            let decimals = (x.ceil() as usize).saturating_sub(2);
            format!("{p:.decimals$}%")
        })
        .y_label_formatter(&|y| f(10f64.powf(*y)))
        .draw()
        .map_err(|e| anyhow!("plot: {e}"))?;
    let colors = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK];
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = colors[i % colors.len()];
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|[p, ms]| (nines(*p), ms.max(ymin).log10())),
                color.stroke_width(2),
            ))
            .map_err(|e| anyhow!("plot: {e}"))?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(|e| anyhow!("plot: {e}"))?;
    root.present().map_err(|e| anyhow!("plot: {e}"))?;
    Ok(())
}

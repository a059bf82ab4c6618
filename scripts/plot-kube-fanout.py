#!/usr/bin/env python3
"""Draws K1 (docs/BENCHMARKS.md, "Against kube-apiserver"): deliveries/s and
p99 delivery latency against the watcher count, watchcache and
kube-apiserver, from `watchcache-bench fanout --compare-kube --json` reports.

    python3 scripts/plot-kube-fanout.py OUT.svg REPORT.json...

Standard library only; one report per watcher count (the x axis is each
report's watcher count, log scale)."""

import json
import math
import sys

SERIES = [("proxy", "watchcache", "#1f77b4"), ("kube", "kube-apiserver", "#d62728")]
W, H = 850, 360
PANEL_W, PANEL_H = 320, 230
LEFT, TOP = 70, 50


def points(reports, key, path):
    out = []
    for r in reports:
        row = r["results"].get(key)
        if row is None:
            continue
        v = row
        for p in path:
            v = v.get(p) if isinstance(v, dict) else None
        if isinstance(v, (int, float)) and v > 0:
            out.append((row["watchers_established"], float(v)))
    return sorted(out)


def fmt(v):
    if v >= 1e6:
        return f"{v / 1e6:g}M"
    if v >= 1e3:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def panel(x0, title, ylabel, reports, path):
    all_pts = [p for key, _, _ in SERIES for p in points(reports, key, path)]
    if not all_pts:
        return []
    xs = [p[0] for p in all_pts]
    ys = [p[1] for p in all_pts]
    lx0, lx1 = math.floor(math.log10(min(xs))), math.ceil(math.log10(max(xs)))
    if lx1 == lx0:
        lx1 += 1
    ly0, ly1 = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
    if ly1 == ly0:
        ly1 += 1

    def sx(x):
        return x0 + (math.log10(x) - lx0) / (lx1 - lx0) * PANEL_W

    def sy(y):
        return TOP + PANEL_H - (math.log10(y) - ly0) / (ly1 - ly0) * PANEL_H

    s = [
        f'<text x="{x0 + PANEL_W / 2}" y="{TOP - 14}" text-anchor="middle" font-size="14">{title}</text>',
        f'<rect x="{x0}" y="{TOP}" width="{PANEL_W}" height="{PANEL_H}" fill="none" stroke="#888"/>',
    ]
    for e in range(lx0, lx1 + 1):
        x = sx(10**e)
        s.append(f'<line x1="{x}" y1="{TOP}" x2="{x}" y2="{TOP + PANEL_H}" stroke="#eee"/>')
        s.append(f'<text x="{x}" y="{TOP + PANEL_H + 16}" text-anchor="middle" font-size="11">{fmt(10**e)}</text>')
    for e in range(ly0, ly1 + 1):
        y = sy(10**e)
        s.append(f'<line x1="{x0}" y1="{y}" x2="{x0 + PANEL_W}" y2="{y}" stroke="#eee"/>')
        s.append(f'<text x="{x0 - 6}" y="{y + 4}" text-anchor="end" font-size="11">{fmt(10**e)}</text>')
    s.append(f'<text x="{x0 + PANEL_W / 2}" y="{TOP + PANEL_H + 34}" text-anchor="middle" font-size="12">watchers</text>')
    s.append(
        f'<text x="{x0 - 48}" y="{TOP + PANEL_H / 2}" text-anchor="middle" font-size="12" '
        f'transform="rotate(-90 {x0 - 48} {TOP + PANEL_H / 2})">{ylabel}</text>'
    )
    for key, _, color in SERIES:
        pts = points(reports, key, path)
        if not pts:
            continue
        d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        s.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y in pts:
            s.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="{color}"/>')
    return s


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, paths = sys.argv[1], sys.argv[2:]
    reports = [json.load(open(p)) for p in paths]
    body = []
    body += panel(LEFT, "deliveries/s", "deliveries/s", reports, ["deliveries_per_s"])
    body += panel(LEFT + PANEL_W + 110, "p99 delivery latency", "ms", reports, ["latency_ms", "p99_ms"])
    y = TOP + PANEL_H + 56
    x = LEFT
    for _, label, color in SERIES:
        body.append(f'<rect x="{x}" y="{y - 10}" width="14" height="4" fill="{color}"/>')
        body.append(f'<text x="{x + 20}" y="{y - 4}" font-size="12">{label}</text>')
        x += 150
    rates = sorted({r["params"]["rate_per_s"] for r in reports})
    body.append(
        f'<text x="{x + 20}" y="{y - 4}" font-size="11" fill="#555">K1: fanout --compare-kube, '
        f'{"/".join(f"{r:g}" for r in rates)} writes/s through kube-apiserver, JSON watches</text>'
    )
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">\n'
        f'<rect width="{W}" height="{H}" fill="white"/>\n' + "\n".join(body) + "\n</svg>\n"
    )
    with open(out, "w") as f:
        f.write(svg)


if __name__ == "__main__":
    main()

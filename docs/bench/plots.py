#!/usr/bin/env python3
"""Draw the plots of docs/BENCHMARKS.md from the JSON reports next to this file.

Standard library only: the SVG is written by hand. Run from the repository root:

    python3 docs/bench/plots.py

It reads the `--json` reports of `watchcache-bench` kept in docs/bench/ and
writes, next to them:

- f1-cpu-per-delivery.svg: CPU of the process holding 1,000 watchers, per
  delivered event, for watchcache, etcd and etcd grpc-proxy, over HTTP/2
  (Kubernetes watches) and over gRPC (etcd watches on watchcache's etcd front);
- speedup-vs-etcd.svg: every run of G1 and L1 as a ratio against etcd, with
  the target line of each;
- l1-10000-runs.svg: the twelve L1 runs at 10,000 objects, watchcache's List
  and the bare loopback transfer of the same bytes, each against etcd.

Re-run it after replacing a JSON file; the SVGs are committed.
"""

import json
import os
from statistics import median

HERE = os.path.dirname(os.path.abspath(__file__))

COLORS = {
    "watchcache": "#1f77b4",
    "etcd": "#d62728",
    "grpc-proxy": "#ff7f0e",
    "floor": "#7f7f7f",
}
FONT = 'font-family="Helvetica, Arial, sans-serif"'


def load(name):
    with open(os.path.join(HERE, name)) as f:
        return json.load(f)


def runs(report):
    """The single-run reports of a file: its `runs` (--repeat) or itself."""
    return report.get("runs", [report])


def esc(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class Svg:
    def __init__(self, width, height):
        self.width, self.height = width, height
        self.items = []

    def text(self, x, y, s, size=12, anchor="start", weight="normal", fill="#222"):
        self.items.append(
            f'<text x="{x:.1f}" y="{y:.1f}" {FONT} font-size="{size}" '
            f'text-anchor="{anchor}" font-weight="{weight}" fill="{fill}">{esc(s)}</text>'
        )

    def rect(self, x, y, w, h, fill):
        self.items.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}"/>')

    def line(self, x1, y1, x2, y2, stroke="#999", width=1, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.items.append(
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
            f'stroke="{stroke}" stroke-width="{width}"{d}/>'
        )

    def circle(self, x, y, r, fill, stroke=None):
        s = f' stroke="{stroke}" stroke-width="1.5"' if stroke else ""
        self.items.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{fill}"{s}/>')

    def write(self, name):
        body = "\n".join(self.items)
        svg = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}" '
            f'viewBox="0 0 {self.width} {self.height}">\n'
            f'<rect width="100%" height="100%" fill="white"/>\n{body}\n</svg>\n'
        )
        with open(os.path.join(HERE, name), "w") as f:
            f.write(svg)
        print("wrote", os.path.join("docs/bench", name))


def f1_cpu_per_delivery():
    http = load("f1-1000x100-compare.json")["results"]
    grpc = load("f1-grpc-1000x100-compare.json")["results"]

    def cpu(result):
        return result["per_delivery"]["holder_cpu_us_per_delivery"]

    groups = [
        (
            "Kubernetes watches (HTTP/2), f1-1000x100-compare.json",
            [("watchcache", cpu(http["proxy"])), ("etcd", cpu(http["etcd"])), ("grpc-proxy", cpu(http["grpc_proxy"]))],
        ),
        (
            "etcd watches (gRPC), f1-grpc-1000x100-compare.json",
            [("watchcache", cpu(grpc["grpc"])), ("etcd", cpu(grpc["etcd"])), ("grpc-proxy", cpu(grpc["grpc_proxy"]))],
        ),
    ]
    labels = {"watchcache": "watchcache", "etcd": "etcd (watchers on etcd)", "grpc-proxy": "etcd grpc-proxy"}
    left, right, bar, gap = 190, 60, 22, 6
    width = 720
    scale_max = 6.0
    plot_w = width - left - right
    y = 50
    svg = Svg(width, 60 + len(groups) * (3 * (bar + gap) + 40) + 40)
    svg.text(width / 2, 24, "F1: CPU per delivered event, 1,000 watchers x 100 writes/s (lower is better)",
             size=14, anchor="middle", weight="bold")
    for title, bars in groups:
        svg.text(left, y + 4, title, size=12, weight="bold")
        y += 14
        for name, value in bars:
            svg.text(left - 8, y + bar * 0.7, labels[name], anchor="end")
            svg.rect(left, y, plot_w * value / scale_max, bar, COLORS[name])
            svg.text(left + plot_w * value / scale_max + 6, y + bar * 0.7, f"{value:.2f} us")
            y += bar + gap
        y += 26
    for tick in range(0, int(scale_max) + 1):
        x = left + plot_w * tick / scale_max
        svg.line(x, y - 6, x, y)
        svg.text(x, y + 14, f"{tick}", anchor="middle", size=11)
    svg.line(left, y - 6, left + plot_w, y - 6)
    svg.text(left + plot_w / 2, y + 30, "CPU microseconds of the process holding the watchers, per delivery",
             anchor="middle", size=11)
    svg.write("f1-cpu-per-delivery.svg")


def speedup_vs_etcd():
    g1 = [r["ratios"]["throughput_proxy_over_etcd"] for r in runs(load("g1-1000-rounds-compare.json"))]
    l1_100k = [r["ratios"]["full_list_p50_speedup_proxy_vs_etcd"] for r in runs(load("l1-100000-compare.json"))]
    l1_10k = [
        r["ratios"]["full_list_p50_speedup_proxy_vs_etcd"]
        for i in range(1, 5)
        for r in runs(load(f"l1-10000-compare-set{i}.json"))
    ]
    rows = [
        ("G1: Gets/s, 1,000 objects, K=64", g1, 5.0),
        ("L1: full List, 100,000 x 1 KB", l1_100k, 10.0),
        ("L1: full List, 10,000 x 1 KB", l1_10k, 10.0),
    ]
    left, right, top, row_h = 230, 40, 50, 56
    width = 720
    plot_w = width - left - right
    scale_max = 20.0
    height = top + len(rows) * row_h + 60
    svg = Svg(width, height)
    svg.text(width / 2, 24, "watchcache over etcd, every run (higher is better)", size=14, anchor="middle",
             weight="bold")

    def x_of(v):
        return left + plot_w * min(v, scale_max) / scale_max

    for i, (label, values, goal) in enumerate(rows):
        y = top + i * row_h + row_h / 2
        svg.text(left - 10, y + 4, label, anchor="end")
        svg.line(left, y, left + plot_w, y, stroke="#eee")
        svg.line(x_of(goal), y - 18, x_of(goal), y + 18, stroke="#2ca02c", width=2, dash="4,3")
        svg.text(x_of(goal) + 4, y - 10, f"target {goal:g}x", size=10, fill="#2ca02c")
        for v in values:
            svg.circle(x_of(v), y, 5, COLORS["watchcache"])
        m = median(values)
        svg.line(x_of(m), y - 12, x_of(m), y + 12, stroke="#222", width=2)
        svg.text(x_of(m), y + 24, f"median {m:.1f}x ({len(values)} runs)", size=10, anchor="middle")
    axis_y = top + len(rows) * row_h + 4
    svg.line(left, axis_y, left + plot_w, axis_y)
    for tick in range(0, int(scale_max) + 1, 2):
        svg.line(x_of(tick), axis_y, x_of(tick), axis_y + 5)
        svg.text(x_of(tick), axis_y + 18, f"{tick}x", anchor="middle", size=11)
    svg.text(left + plot_w / 2, axis_y + 38, "G1: watchcache's Gets/s over etcd's; L1: etcd's List p50 over watchcache's", anchor="middle",
             size=11)
    svg.write("speedup-vs-etcd.svg")


def l1_10000_runs():
    points = []
    for i in range(1, 5):
        for r in runs(load(f"l1-10000-compare-set{i}.json")):
            points.append((r["ratios"]["full_list_p50_speedup_proxy_vs_etcd"],
                           r["ratios"]["full_list_p50_speedup_loopback_floor_vs_etcd"]))
    left, right, top, bottom = 60, 30, 60, 60
    width, height = 720, 360
    plot_w, plot_h = width - left - right, height - top - bottom
    y_max = 18.0
    svg = Svg(width, height)
    svg.text(width / 2, 24, "L1 at 10,000 objects: etcd's full List p50 over watchcache's, and over the bare transfer",
             size=13, anchor="middle", weight="bold")
    svg.circle(left + 10, 42, 5, COLORS["watchcache"])
    svg.text(left + 20, 46, "watchcache's full List", size=11)
    svg.circle(left + 250, 42, 5, "white", stroke=COLORS["floor"])
    svg.text(left + 260, 46, "the same bytes over bare loopback TCP (no HTTP, no server)", size=11)

    def y_of(v):
        return top + plot_h * (1 - min(v, y_max) / y_max)

    def x_of(i):
        return left + plot_w * (i + 0.5) / len(points)

    for tick in range(0, int(y_max) + 1, 2):
        svg.line(left, y_of(tick), left + plot_w, y_of(tick), stroke="#eee")
        svg.text(left - 6, y_of(tick) + 4, f"{tick}x", anchor="end", size=11)
    svg.line(left, y_of(10), left + plot_w, y_of(10), stroke="#2ca02c", width=2, dash="4,3")
    svg.text(left + 4, y_of(10) - 6, "target 10x", size=10, fill="#2ca02c")
    for i, (proxy, floor) in enumerate(points):
        svg.line(x_of(i), y_of(proxy), x_of(i), y_of(floor), stroke="#ccc")
        svg.circle(x_of(i), y_of(floor), 5, "white", stroke=COLORS["floor"])
        svg.circle(x_of(i), y_of(proxy), 5, COLORS["watchcache"])
        svg.text(x_of(i), top + plot_h + 16, str(i + 1), anchor="middle", size=11)
    svg.line(left, top + plot_h, left + plot_w, top + plot_h)
    svg.text(left + plot_w / 2, top + plot_h + 36,
             "run (l1-10000-compare-set1..4.json, 3 runs each)", anchor="middle", size=11)
    svg.write("l1-10000-runs.svg")


if __name__ == "__main__":
    f1_cpu_per_delivery()
    speedup_vs_etcd()
    l1_10000_runs()

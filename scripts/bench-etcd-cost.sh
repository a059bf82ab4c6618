#!/usr/bin/env bash
# etcd's own cost behind watchcache under watch fan-out (docs/BENCHMARKS.md,
# "etcd's cost behind watchcache"): for each round and each watchcache
# binary given, a fresh etcd (tools/etcd, or $WATCHCACHE_ETCD_BIN), the
# bench's fan-out against a daemon of that binary on it, and etcd's own
# counters from its /metrics before and after the run: CPU seconds, bytes
# allocated by its Go runtime, and Range requests it served.
#
#   scripts/bench-etcd-cost.sh [-w WATCHERS] [-r RATE] [-d SECONDS] [--rounds N] BIN...
#
# Binaries run in turns (A B A B ...), so each sees the same minutes of the
# machine. Prints one line per run and writes nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."

watchers=200 rate=200 duration=20 rounds=2
bins=()
while [ $# -gt 0 ]; do
  case "$1" in
    -w) watchers=$2; shift 2 ;;
    -r) rate=$2; shift 2 ;;
    -d) duration=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -*) echo "unknown flag $1" >&2; exit 2 ;;
    *) bins+=("$1"); shift ;;
  esac
done
[ "${#bins[@]}" -gt 0 ] || { echo "usage: $0 [-w N] [-r N] [-d S] [--rounds N] BIN..." >&2; exit 2; }

etcd_bin=${WATCHCACHE_ETCD_BIN:-tools/etcd/usr/bin/etcd}
bench=target/debug/watchcache-bench
[ -x "$bench" ] || cargo build -q -p watchcache-bench

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# metric URL NAME[{labels}] -> value (sum of the matching series)
metric() {
  curl -s "$1/metrics" | awk -v n="$2" '
    $0 !~ /^#/ && (index($1, n "{") == 1 || $1 == n) { s += $2 } END { printf "%.3f\n", s }'
}

printf '%-6s %-40s %10s %14s %8s %s\n' round binary etcd_cpu_s etcd_alloc_mb ranges deliveries/expected
for round in $(seq 1 "$rounds"); do
  for bin in "${bins[@]}"; do
    dir=$(mktemp -d)
    cport=$(free_port) pport=$(free_port)
    url="http://127.0.0.1:$cport"
    "$etcd_bin" --name cost --data-dir "$dir/data" \
      --listen-client-urls "$url" --advertise-client-urls "$url" \
      --listen-peer-urls "http://127.0.0.1:$pport" \
      --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
      --initial-cluster "cost=http://127.0.0.1:$pport" >"$dir/etcd.log" 2>&1 &
    epid=$!
    for _ in $(seq 1 100); do curl -sf "$url/health" >/dev/null && break; sleep 0.1; done
    cpu0=$(metric "$url" process_cpu_seconds_total)
    alloc0=$(metric "$url" go_memstats_alloc_bytes_total)
    range0=$(metric "$url" etcd_mvcc_range_total)
    "$bench" fanout --target proxy --etcd "$url" --etcd-pid "$epid" \
      -w "$watchers" -r "$rate" -d "$duration" --watchcache-bin "$bin" \
      --no-progress --json "$dir/fanout.json" >"$dir/bench.log" 2>&1 || {
        echo "bench failed for $bin (log: $dir/bench.log)" >&2; kill "$epid"; exit 1; }
    cpu1=$(metric "$url" process_cpu_seconds_total)
    alloc1=$(metric "$url" go_memstats_alloc_bytes_total)
    range1=$(metric "$url" etcd_mvcc_range_total)
    deliveries=$(python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["results"]["proxy"]; print("%s/%s" % (p.get("deliveries"), p.get("expected_deliveries")))' "$dir/fanout.json" 2>/dev/null || echo "?")
    kill "$epid"; wait "$epid" 2>/dev/null || true
    printf '%-6s %-40s %10.2f %14.1f %8.0f %s\n' "$round" "$bin" \
      "$(python3 -c "print($cpu1 - $cpu0)")" "$(python3 -c "print(($alloc1 - $alloc0) / 1e6)")" \
      "$(python3 -c "print($range1 - $range0)")" "$deliveries"
    rm -rf "$dir"
  done
done

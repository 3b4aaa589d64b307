#!/usr/bin/env bash
# The validity stamp (issue 53) against the ground-truth server: the same replay with the
# client pinned to CPU 0 alone ("quiet"), beside one CPU hog, and beside HOGS hogs pinned
# to CPU 0 ("starved"); the server on CPU 1. Prints per run: the stamp, its error budget,
# the reader lateness and dispatch lag measured, the measured TTFT and ITL p50/p99 against
# the server's true 50 ms and 10 ms, and the client's error against the chunk log
# (bench/accuracy.py). ~1 min; figures in bench/README.md ("The validity stamp").
#
# usage: bench/validity.sh [BIN] [HOGS]     (default: target/release/llmreplay, 3 hogs)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-target/release/llmreplay}
HOGS=${2:-3}
OUT=bench/out/validity-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
[ "$(nproc)" -ge 2 ] || { echo "needs 2 CPUs (client on 0, server on 1)" >&2; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; return 1; }

# 300 streamed requests at 30 req/s (10 s), 30 output tokens each.
"$BIN" synth -o "$OUT/trace.parquet" --num-prompts 300 --input-len 16 --output-len 30 \
  --request-rate 30 --seed 1 2>/dev/null

one() { # one TAG NHOGS
  local tag=$1 n=$2 port hogs=() rc=0
  port=$(free_port)
  taskset -c 1 "$BIN" sim --ground-truth --fixed-timing 50,10 --listen "127.0.0.1:$port" \
    --chunk-log "$OUT/$tag-gt.jsonl" 2>/dev/null &
  local gt=$!
  wait_port "$port"
  for _ in $(seq "$n"); do taskset -c 0 sh -c 'while :; do :; done' & hogs+=($!); done
  taskset -c 0 "$BIN" replay "$OUT/trace.parquet" --target "gt=http://127.0.0.1:$port" -q \
    --results "$OUT/$tag-results.parquet" --save-result "$OUT/$tag.json" --fail-on-invalid \
    > "$OUT/$tag.txt" 2> "$OUT/$tag.err" || rc=$?
  [ ${#hogs[@]} -gt 0 ] && kill "${hogs[@]}"
  kill -TERM "$gt"; wait "$gt" 2>/dev/null || true
  python3 bench/accuracy.py "$OUT/$tag-results.parquet" "$OUT/$tag-gt.jsonl" 50 10 1 \
    > "$OUT/$tag-errors.json" 2>/dev/null || echo '{}' > "$OUT/$tag-errors.json"
  python3 - "$OUT/$tag.json" "$OUT/$tag-errors.json" "$tag" "$n" "$rc" <<'PY'
import json, sys
doc, errs, tag, hogs, rc = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), *sys.argv[3:]
v = doc["llmreplay"]["client"]["validity"]
def err(k):
    e = errs.get(k) or {}
    return "p50 %+.2f / p99 %+.2f" % (e.get("p50", float("nan")), e.get("p99", float("nan"))) if e else "-"
print(f"| {tag} | {hogs} | {'VALID' if v['valid'] else 'INVALID'} (exit {rc}) | {v['error_ms']:.2f} ({v['error_of']}) | {v['budget_ms']:.2f} "
      f"| {v['reader_lateness_p50_ms']:.3f} / {v['reader_lateness_p99_ms']:.2f} / {v['reader_lateness_max_ms']:.1f} "
      f"| {v['thread_lateness_p99_ms']:.2f} | {v['dispatch_lag_p99_ms']:.2f} "
      f"| {doc['median_ttft_ms']:.2f} / {doc['p99_ttft_ms']:.2f} | {doc['median_itl_ms']:.2f} / {doc['p99_itl_ms']:.2f} "
      f"| {err('ttft_err_vs_nominal_ms')} | {err('itl_err_vs_nominal_ms')} | {err('ttft_err_vs_logged_ms')} |")
PY
}

{
  echo "| run | hogs on the client's CPU | stamp | client timing error ms | budget ms | reader lateness p50 / p99 / max ms | thread wake p99 ms | dispatch lag p99 ms | TTFT p50 / p99 ms (true 50) | ITL p50 / p99 ms (true 10) | TTFT error vs the script, ms | ITL error vs the script, ms | TTFT error vs the server's log, ms |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  one quiet 0
  one one-hog 1
  one starved "$HOGS"
} | tee "$OUT/summary.md"
echo "client error against the server's chunk log (bench/accuracy.py): $OUT/*-errors.json" >&2

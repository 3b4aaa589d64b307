#!/usr/bin/env bash
# Replay at production scale (issue 21): a long synthetic trace and the Mooncake trace with a
# real tokenizer, replayed against the ground-truth server on 127.0.0.1, by this build and (for
# a before/after in the same run) another one. Per run: peak RSS of the replay process and its
# slope over the second half of the run and over the part after 2^20 requests had been sent
# until the last was (once every exact metric has turned into its estimate; sampled from
# /proc/PID/status every 0.5 s), time from the process start to the first request's send,
# throughput, and dispatch lag p50/p99. Every run is bounded (a request count, or SIGINT
# after a few seconds) and stops by itself; figures go to bench/out/<timestamp>/scale.md.
#
# usage: bench/scale.sh [synth N RATE]... [first N RATE]... [mooncake] [schedule]
#   (default: the README's set)
#   first N RATE   the synth trace of N requests, SIGINT ${FIRST_STOP:-3} s after the start:
#                  the time to the first request for a trace of any size, without its run
#   BEFORE_BIN=/path/to/llmreplay   also run the same traces with that build (before/after)
#   LLMREPLAY_BIN=...               the build measured (default target/release/llmreplay)
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=bench/out/$(date -u +%Y%m%dT%H%M%SZ)-scale
mkdir -p "$OUT"
python3 -m pip install -q numpy pyarrow >/dev/null 2>&1 || true
[ -n "${LLMREPLAY_BIN:-}" ] || cargo build --release --bin llmreplay 2>&1 | tail -1
BIN=${LLMREPLAY_BIN:-target/release/llmreplay}
BEFORE=${BEFORE_BIN:-}
ulimit -n 65536 2>/dev/null || true

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "server on $1 did not start" >&2; return 1; }
start_gt() { # TTFT ms, ITL ms
  GT_PORT=$(free_port)
  "$BIN" sim --ground-truth --fixed-timing "$1,$2" --tokens-per-chunk 1 --listen "127.0.0.1:$GT_PORT" 2>/dev/null &
  GT_PID=$!
  wait_port "$GT_PORT"
}
stop_gt() { kill -TERM "$GT_PID"; wait "$GT_PID" || true; }

# measure TAG BIN TRACE [replay flags...]: one replay, its RSS sampled while it runs.
measure() {
  local tag=$1 bin=$2 trace=$3; shift 3
  local t0; t0=$(python3 -c 'import time; print(int(time.time()*1e6))')
  "$bin" replay "$trace" --target "gt=http://127.0.0.1:$GT_PORT" --save-result "$OUT/$tag.json" \
    --results "$OUT/$tag-results.parquet" -q "$@" > "$OUT/$tag.txt" 2>&1 &
  local pid=$! stop_at="" signalled=""
  [ -n "${STOP_AFTER:-}" ] && stop_at=$(( $(date +%s) + STOP_AFTER ))
  : > "$OUT/$tag-rss.tsv"
  while kill -0 "$pid" 2>/dev/null; do
    awk -v t="$(date +%s.%N)" '/^VmRSS/{print t "\t" $2}' "/proc/$pid/status" >> "$OUT/$tag-rss.tsv" 2>/dev/null || true
    if [ -n "$stop_at" ] && [ -z "$signalled" ] && [ "$(date +%s)" -ge "$stop_at" ]; then
      kill -INT "$pid" 2>/dev/null || true
      signalled=1
    fi
    sleep 0.5
  done
  # An interrupted run exits 130 (SIGINT) after writing what ran.
  wait "$pid" || { rc=$?; [ -n "$signalled" ] && [ $rc -eq 130 ] || echo "$tag: replay exited $rc" >&2; }
  python3 - "$OUT" "$tag" "$t0" >> "$OUT/scale.tsv" <<'PY'
import json, sys
import pyarrow.parquet as pq
out, tag, t0 = sys.argv[1], sys.argv[2], int(sys.argv[3])
rss = [tuple(map(float, l.split("\t"))) for l in open(f"{out}/{tag}-rss.tsv") if l.strip()]
r = json.load(open(f"{out}/{tag}.json"))
sends = sorted(pq.read_table(f"{out}/{tag}-results.parquet", columns=["arrival_time"]).column(0).cast("int64").to_pylist())
# A run stopped before its first send (`first` with a slow build) has none.
first_s = f"{(sends[0] - t0) / 1e6:.2f}" if sends else f"none in {rss[-1][0] - t0 / 1e6:.1f} s"
peak = max(k for _, k in rss) / 1024

def slope(samples):
    """Least-squares slope of RSS over the samples, MiB per minute."""
    if len(samples) < 3:
        return float("nan")
    n = len(samples); mt = sum(t for t, _ in samples) / n; mk = sum(k for _, k in samples) / n
    return sum((t - mt) * (k - mk) for t, k in samples) / max(sum((t - mt) ** 2 for t, _ in samples), 1e-9) * 60 / 1024

# Over the second half of the samples; and from the 2^20-th send (every exact metric has
# turned into its estimate) to the last send (the drain and the writing after it excluded).
half = slope(rss[len(rss) // 2:])
CAP = 1 << 20
if len(sends) > CAP:
    lo, hi = sends[CAP] / 1e6, sends[-1] / 1e6
    past = [(t, k) for t, k in rss if lo <= t <= hi]
    past_cap = f"{slope(past):.1f} ({max(k for _, k in past) / 1024:.0f} MiB peak)" if past else "-"
else:
    past_cap = "-"
lag = r["llmreplay"]["dispatch_lag_ms"]
dur = r.get("duration") or r.get("duration_s") or 0
print("\t".join(str(x) for x in [tag, r["num_prompts"], r["completed"], f"{peak:.0f}", f"{half:.1f}", past_cap,
      first_s, f"{r['completed'] / dur if dur else float('nan'):.0f}", f"{lag['p50']:.3f}", f"{lag['p99']:.3f}",
      f"{rss[-1][0] - t0 / 1e6:.1f}" if rss else "-"]))
PY
  rm -f "$OUT/$tag-results.parquet"
  echo "scale: $tag done"
}

# synth N RATE: N requests of 256 → 2 tokens at RATE req/s (Poisson), this build and BEFORE.
synth_run() {
  local n=$1 rate=$2 trace="$OUT/synth-$1.parquet"
  "$BIN" synth -o "$trace" --num-prompts "$n" --input-len 256 --output-len 2 --request-rate "$rate" --seed 3 2>/dev/null
  start_gt 1 1
  measure "synth-$n-$rate-after" "$BIN" "$trace"
  [ -n "$BEFORE" ] && measure "synth-$n-$rate-before" "$BEFORE" "$trace"
  stop_gt
  rm -f "$trace"
}

# first N RATE: the time to the first request for a trace of N requests (stopped by SIGINT
# after FIRST_STOP seconds: the rest of the run is not what is measured).
first_run() {
  local n=$1 rate=$2 trace="$OUT/synth-$1.parquet"
  "$BIN" synth -o "$trace" --num-prompts "$n" --input-len 256 --output-len 2 --request-rate "$rate" --seed 3 2>/dev/null
  start_gt 1 1
  STOP_AFTER=${FIRST_STOP:-3} measure "first-$n-$rate-after" "$BIN" "$trace"
  [ -n "$BEFORE" ] && STOP_AFTER=${FIRST_STOP:-3} measure "first-$n-$rate-before" "$BEFORE" "$trace"
  stop_gt
  rm -f "$trace"
}

# The Mooncake trace (../shared/data) imported, replayed at its recorded pace ×SPEEDUP with
# prompts synthesized exactly for cl100k_base (the prompts' 512-token blocks shared as the
# trace's hash ids say).
mooncake_run() {
  local src=../shared/data/mooncake_synthetic_trace.jsonl trace="$OUT/mooncake.parquet" speed=${MOONCAKE_SPEEDUP:-20}
  [ -f "$src" ] || { echo "mooncake: $src not found: skipped"; return 0; }
  "$BIN" import "$src" --format mooncake -o "$trace" 2>/dev/null
  start_gt 1 1
  measure "mooncake-x$speed-after" "$BIN" "$trace" --tokenizer cl100k_base --speedup "$speed" --output-len 2
  [ -n "$BEFORE" ] && measure "mooncake-x$speed-before" "$BEFORE" "$trace" --tokenizer cl100k_base --speedup "$speed" --output-len 2
  stop_gt
}

printf 'run\trequests\tcompleted\tpeak RSS (MiB)\tRSS slope, 2nd half (MiB/min)\tRSS slope past 2^20 requests (MiB/min)\tfirst request after (s)\tthroughput (req/s)\tlag p50 (ms)\tlag p99 (ms)\twall (s)\n' > "$OUT/scale.tsv"
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(synth 200000 10000 synth 1000000 5000 first 10000000 5000 mooncake schedule)
i=0
while [ $i -lt ${#args[@]} ]; do
  case "${args[$i]}" in
    synth) synth_run "${args[$((i + 1))]}" "${args[$((i + 2))]}"; i=$((i + 3)) ;;
    first) first_run "${args[$((i + 1))]}" "${args[$((i + 2))]}"; i=$((i + 3)) ;;
    mooncake) mooncake_run; i=$((i + 1)) ;;
    # The dispatch-lag runs of bench/run.sh (schedule fidelity), for the same machine state.
    schedule) LLMREPLAY_BIN=$BIN bench/run.sh schedule | tail -8 > "$OUT/schedule.md"; i=$((i + 1)) ;;
    *) echo "unknown part ${args[$i]} (synth N RATE, first N RATE, mooncake, schedule)" >&2; exit 2 ;;
  esac
done
python3 - "$OUT/scale.tsv" > "$OUT/scale.md" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
print("| " + " | ".join(rows[0]) + " |")
print("|" + "---|" * len(rows[0]))
for r in rows[1:]:
    print("| " + " | ".join(r) + " |")
PY
cat "$OUT/scale.md"
[ -f "$OUT/schedule.md" ] && cat "$OUT/schedule.md"

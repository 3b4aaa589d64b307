#!/usr/bin/env bash
# llmreplay's benchmarks: client accuracy against a ground-truth server, schedule fidelity,
# and client cost. Everything runs on 127.0.0.1 with bounded request counts and stops by
# itself; the figures go to bench/out/<timestamp>/summary.md (copy them into bench/README.md).
#
# usage: bench/run.sh [accuracy] [schedule]     (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."

parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(accuracy schedule)
OUT=bench/out/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
python3 -m pip install -q numpy pyarrow >/dev/null
cargo build --release --bin llmreplay 2>&1 | tail -1
BIN=target/release/llmreplay
ulimit -n 65536 2>/dev/null || true

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "server on $1 did not start" >&2; return 1; }

# Ground-truth server: TTFT $2 ms, ITL $3 ms, $4 tokens per chunk; chunk log to $1.
start_gt() {
  GT_PORT=$(free_port)
  "$BIN" sim --ground-truth --fixed-timing "$2,$3" --tokens-per-chunk "$4" --listen "127.0.0.1:$GT_PORT" --chunk-log "$1" 2>/dev/null &
  GT_PID=$!
  wait_port "$GT_PORT"
}
stop_gt() { kill -TERM "$GT_PID"; wait "$GT_PID" || true; }

accuracy() {
  local n=$1 tpc=$2 tag="acc-$1-tpc$2"
  local reqs=$(( n == 1 ? 20 : 2 * n ))
  start_gt "$OUT/$tag-gt.jsonl" 50 10 "$tpc"
  "$BIN" synth -o "$OUT/$tag.parquet" --num-prompts "$reqs" --input-len 16 --output-len 100 --request-rate inf --seed 1 2>/dev/null
  "$BIN" replay "$OUT/$tag.parquet" --target "gt=http://127.0.0.1:$GT_PORT" --max-concurrency "$n" \
    --results "$OUT/$tag-results.parquet" --save-result "$OUT/$tag.json" -q > "$OUT/$tag.txt" 2>&1
  stop_gt
  python3 bench/accuracy.py "$OUT/$tag-results.parquet" "$OUT/$tag-gt.jsonl" 50 10 "$tpc" > "$OUT/$tag-errors.json"
  echo "accuracy: $n streams, $tpc tokens/chunk done"
}

schedule() {
  local rate=$1 tag="sched-$1"
  local reqs=$(( rate * 4 ))
  start_gt "$OUT/$tag-gt.jsonl" 1 1 1
  "$BIN" synth -o "$OUT/$tag.parquet" --num-prompts "$reqs" --input-len 8 --output-len 2 --request-rate "$rate" --seed 2 2>/dev/null
  "$BIN" replay "$OUT/$tag.parquet" --target "gt=http://127.0.0.1:$GT_PORT" \
    --results "$OUT/$tag-results.parquet" --save-result "$OUT/$tag.json" -q > "$OUT/$tag.txt" 2>&1
  stop_gt
  echo "schedule: $rate req/s done"
}

for p in "${parts[@]}"; do
  case "$p" in
    accuracy) for n in 1 100 500 1000; do accuracy "$n" 1; done; accuracy 100 4 ;;
    schedule) for r in 500 1000 2000 5000; do schedule "$r"; done ;;
    *) echo "unknown part $p (accuracy, schedule)" >&2; exit 2 ;;
  esac
done
python3 bench/summarize.py "$OUT" | tee "$OUT/summary.md"

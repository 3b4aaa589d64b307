#!/usr/bin/env bash
# CPU per forwarded chunk in steady streaming (issue 17): N streams of 600 one-token chunks
# (ground-truth server, TTFT 50 ms, ITL 10 ms), all started at t=0 through a proxy; once
# every stream is past its first chunk, the CPU of every thread of the proxy over WINDOW
# seconds (/proc/<pid>/task/*/schedstat, ns resolution) divided by the chunks due in it
# (N per 10 ms), and the proxy's voluntary context switches per chunk. ROUNDS times, paths
# interleaved.
#
# usage: bench/chunk-cpu.sh N ROUNDS PATH...
#   PATH: capture | capture-b | nginx | nginx2 (as in bench/request-path-cpu.sh)
#   WINDOW (default 3) seconds measured, from 2 s after the start.
#   e.g. CAPTURE_B_BIN=/tmp/old bench/chunk-cpu.sh 500 3 capture capture-b nginx2
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { sed -n 2,12p "$0"; exit 2; }
N=$1 ROUNDS=$2; shift 2
WINDOW=${WINDOW:-3}
BIN=${BIN:-target/release/llmreplay}
CAPTURE_BIN=${CAPTURE_BIN:-$BIN}
OUT=bench/out/chunk-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
ulimit -n 65536 2>/dev/null || true
# shellcheck source=bench/proxies.sh
. bench/proxies.sh
"$BIN" synth -o "$OUT/in.parquet" --num-prompts "$N" --input-len 16 --output-len 600 --request-rate inf --seed 1 2>/dev/null

one() { # one PATH RUN_DIR
  local path=$1 d=$2 gt pp cp gp rp
  mkdir -p "$d"
  gt=$(free_port)
  "$BIN" sim --ground-truth --fixed-timing 50,10 --tokens-per-chunk 1 --listen "127.0.0.1:$gt" 2>/dev/null &
  gp=$!
  wait_port "$gt"
  pp=$(free_port)
  proxy_start "$path" "$PWD/$d" "$pp" "$gt"
  cp=$!
  wait_port "$pp"; sleep 0.3
  "$BIN" replay "$OUT/in.parquet" --target "c=http://127.0.0.1:$pp" --request-rate inf --max-concurrency "$N" --no-preconnect -q > "$d/replay.txt" 2>&1 &
  rp=$!
  sleep 2
  local pids c0 c1 v0 v1
  pids="$cp $(pgrep -P "$cp" || true)"
  c0=$(cpu $pids); v0=$(vcs $pids)
  sleep "$WINDOW"
  c1=$(cpu $pids); v1=$(vcs $pids)
  wait "$rp" || true
  kill -TERM "$cp"; wait "$cp" || true
  kill -TERM "$gp"; wait "$gp" || true
  # Chunks due in the window: N streams, one chunk per 10 ms each.
  awk -v n="$N" -v w="$WINDOW" -v c=$(( c1 - c0 )) -v v=$(( v1 - v0 )) -v p="$path" 'BEGIN {
    chunks = n * w * 100
    printf "%5d %-9s proxy %6.2f us/chunk  %5.3f voluntary switches/chunk\n", n, p, c / chunks / 1000, v / chunks }'
}

for r in $(seq "$ROUNDS"); do
  for p in "$@"; do one "$p" "$OUT/$p-r$r"; done
done | tee "$OUT/chunk-cpu.txt"
echo "Run: \`$OUT\`"

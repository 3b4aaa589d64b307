#!/usr/bin/env bash
# CPU per request of a connection burst's request paths only (issue 17): N one-token requests,
# each on a new connection at t=0, through a proxy in front of a ground-truth server whose
# TTFT is 1.5 s, so the first second holds only what each request costs from its accept to
# its upstream write (with the upstream's response head forwarded). Reports, per request, the
# CPU of every thread of the proxy, of the ground-truth server and of the client over that
# second (/proc/<pid>/task/*/schedstat, ns resolution), ROUNDS times, paths interleaved.
#
# usage: bench/request-path-cpu.sh N ROUNDS PATH...
#   PATH: capture | capture1 | capture-b | nginx | nginx2
#   capture: --threads default (one per core); capture1: --threads 1; capture-b: the build
#   CAPTURE_B_BIN, for an A/B of two builds in one run; nginx: one worker; nginx2: two
#   workers. CAPTURE_BIN picks the capture build (default target/release/llmreplay).
#   e.g. bench/request-path-cpu.sh 500 3 capture1 nginx
#   PERF_RECORD=1: also a sampled profile of the proxy over that second (perf record, 20 kHz,
#   its user and kernel stacks' leaves) in <run>/<path>-r<N>/perf.data, and its top symbols
#   in perf-top.txt beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { sed -n 2,15p "$0"; exit 2; }
N=$1 ROUNDS=$2; shift 2
BIN=${BIN:-target/release/llmreplay}
CAPTURE_BIN=${CAPTURE_BIN:-$BIN}
OUT=bench/out/rp-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
ulimit -n 65536 2>/dev/null || true
# shellcheck source=bench/proxies.sh
. bench/proxies.sh
"$BIN" synth -o "$OUT/in.parquet" --num-prompts "$N" --input-len 16 --output-len 1 --request-rate inf --seed 1 2>/dev/null

one() { # one PATH RUN_DIR
  local path=$1 d=$2 gt pp cp gp rp
  mkdir -p "$d"
  gt=$(free_port)
  "$BIN" sim --ground-truth --fixed-timing 1500,10 --tokens-per-chunk 1 --listen "127.0.0.1:$gt" 2>/dev/null &
  gp=$!
  wait_port "$gt"
  pp=$(free_port)
  proxy_start "$path" "$PWD/$d" "$pp" "$gt"
  cp=$!
  wait_port "$pp"; sleep 0.3
  local pids c0 g0 c1 g1 r1
  pids="$cp $(pgrep -P "$cp" || true)"
  local pf=""
  if [ -n "${PERF_RECORD:-}" ]; then
    perf record -q -F 20000 -p "$(echo $pids | tr ' ' ,)" -o "$d/perf.data" 2>/dev/null & pf=$!
    sleep 0.5
  fi
  c0=$(cpu $pids); g0=$(cpu "$gp")
  "$BIN" replay "$OUT/in.parquet" --target "c=http://127.0.0.1:$pp" --request-rate inf --max-concurrency "$N" --no-preconnect -q > "$d/replay.txt" 2>&1 &
  rp=$!
  sleep 1.0
  [ -n "$pf" ] && { kill -INT "$pf"; wait "$pf" || true
    perf report -i "$d/perf.data" --no-children --sort dso,sym --stdio 2>/dev/null | grep -E '^ +[0-9]' | head -60 > "$d/perf-top.txt" || true; }
  # Threads started meanwhile (capture's prompt runners) count too.
  pids="$cp $(pgrep -P "$cp" || true)"
  c1=$(cpu $pids); g1=$(cpu "$gp"); r1=$(cpu "$rp")
  wait "$rp" || true
  kill -TERM "$cp"; wait "$cp" || true
  kill -TERM "$gp"; wait "$gp" || true
  printf '%5d %-9s proxy %4d  ground truth %4d  client %4d  us/req\n' "$N" "$path" \
    $(( (c1 - c0) / N / 1000 )) $(( (g1 - g0) / N / 1000 )) $(( r1 / N / 1000 ))
}

for r in $(seq "$ROUNDS"); do
  for p in "$@"; do one "$p" "$OUT/$p-r$r"; done
done | tee "$OUT/request-path-cpu.txt"
echo "Run: \`$OUT\`"

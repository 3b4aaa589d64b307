#!/usr/bin/env bash
# Recorder throughput (issue 40): capture with `--record-bodies full --tokenizer cl100k_base`
# in front of a fast `llmreplay sim` (1 ms TTFT and ITL, 8 output tokens in one chunk),
# driven by `llmreplay replay` of a synth trace at a fixed rate for SECS seconds (default 10).
# Per rate: requests sent, rows dropped (`records_dropped_total`), the recorder's lag (time
# from the end of the load until every row was written or counted dropped, read from
# capture's /metrics every 0.1 s; and the largest `recorder_lag_seconds` seen, on builds that
# have it), the work shed (`recorder_shed_total`, same) and capture's CPU per request. A rate
# passes with 0 dropped and a lag of at most 2 s. Every run stops by itself.
#
# usage: bench/recorder.sh [LEN:RATE[,RATE...]]...   (default: 1000:1000,2000,3000 8000:250,500,1000)
#   LLMREPLAY_BIN=path   the build measured (default target/release/llmreplay); it also runs
#                        the sim, synth and the replay client
#   SECS=10              seconds of load per rate
#   TAG=name             a label for the build in the table
#   CAPTURES="a=PATH b=PATH"  several builds' capture, interleaved per rate in one run (an
#                        A/B: the sim, synth and client stay LLMREPLAY_BIN's)
#   ENDPOINTS="completions responses messages"  the API of the traffic (synth --endpoint),
#                        each in turn per rate and build (default completions)
# Figures go to bench/out/<timestamp>-recorder-<tag>/recorder.md (and stdout).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${LLMREPLAY_BIN:-target/release/llmreplay}
SECS=${SECS:-10}
TAG=${TAG:-$(basename "$(dirname "$(dirname "$(dirname "$(realpath "$BIN")")")")")}
OUT=bench/out/$(date -u +%Y%m%dT%H%M%SZ)-recorder-$TAG
mkdir -p "$OUT"
[ $# -gt 0 ] || set -- 1000:1000,2000,3000 8000:250,500,1000

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "server on $1 did not start" >&2; return 1; }
metric() { # FILE NAME: the value of an unlabelled (or exactly labelled) sample, 0 if absent
  awk -v n="$2" '$1 == n { v = $2 } END { print (v == "" ? 0 : v) }' "$1"
}
cpu_s() { awk '{ print ($14 + $15) / 100 }' "/proc/$1/stat"; }

SIM_PORT=$(free_port)
"$BIN" sim --listen "127.0.0.1:$SIM_PORT" --fixed-timing 1,1 --tokens-per-chunk 8 2>"$OUT/sim.log" &
SIM_PID=$!
CAP_PID=""
trap 'kill -TERM $SIM_PID ${CAP_PID:-} 2>/dev/null || true' EXIT
wait_port "$SIM_PORT"

CAPTURES=${CAPTURES:-$TAG=$BIN}
ENDPOINTS=${ENDPOINTS:-completions}
echo "| build | API | prompt tokens | rate req/s | sent | dropped | last row after the load (s) | max recorder_lag_seconds | shed (hashes) | capture CPU ms/req | pass |" | tee "$OUT/recorder.md"
echo "|---|---|---|---|---|---|---|---|---|---|---|" | tee -a "$OUT/recorder.md"
for spec in "$@"; do
  len=${spec%%:*}
  for rate in ${spec#*:}; do
    rate=${rate//,/ }
    for r in $rate; do
      for cap in $CAPTURES; do
        for api in $ENDPOINTS; do
          n=$(( r * SECS ))
          label=${cap%%=*}; CAP_BIN=${cap#*=}
          tag=$label-$api-$len-$r
          "$BIN" synth -o "$OUT/$tag.parquet" --num-prompts "$n" --input-len "$len" --output-len 8 \
            --request-rate "$r" --burstiness 1 --seed 1 --endpoint "$api" >/dev/null
          CAP_PORT=$(free_port); ADMIN_PORT=$(free_port)
          "$CAP_BIN" capture --listen "127.0.0.1:$CAP_PORT" --admin "127.0.0.1:$ADMIN_PORT" \
            --upstream "http://127.0.0.1:$SIM_PORT" --out "$OUT/trace-$tag" \
            --record-bodies full --tokenizer cl100k_base 2>"$OUT/capture-$tag.log" &
          CAP_PID=$!
          wait_port "$CAP_PORT"; wait_port "$ADMIN_PORT"
          cpu0=$(cpu_s "$CAP_PID")
          maxlag=0
          "$BIN" replay "$OUT/$tag.parquet" --target "cap=http://127.0.0.1:$CAP_PORT" -q \
            --save-result "$OUT/replay-$tag.json" > "$OUT/replay-$tag.txt" 2>&1 &
          RP=$!
          while kill -0 "$RP" 2>/dev/null; do
            curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" > "$OUT/m.txt" || true
            l=$(metric "$OUT/m.txt" llmreplay_capture_recorder_lag_seconds)
            maxlag=$(awk -v a="$maxlag" -v b="$l" 'BEGIN { print (b > a ? b : a) }')
            sleep 0.1
          done
          wait "$RP" || echo "$tag: replay exited $?" >&2
          t_end=$(date +%s.%N)
          # Until every recorded request is written or dropped (bounded: 60 s).
          done_at=""
          for _ in $(seq 600); do
            curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" > "$OUT/m.txt" || true
            l=$(metric "$OUT/m.txt" llmreplay_capture_recorder_lag_seconds)
            maxlag=$(awk -v a="$maxlag" -v b="$l" 'BEGIN { print (b > a ? b : a) }')
            total=$(grep '^llmreplay_capture_requests_total{' "$OUT/m.txt" | awk '{ s += $2 } END { print s + 0 }')
            w=$(metric "$OUT/m.txt" llmreplay_capture_records_written_total)
            d=$(metric "$OUT/m.txt" llmreplay_capture_records_dropped_total)
            if [ "$total" -gt 0 ] && [ $(( w + d )) -ge "$total" ]; then done_at=$(date +%s.%N); break; fi
            sleep 0.1
          done
          cpu1=$(cpu_s "$CAP_PID")
          shed=$(metric "$OUT/m.txt" 'llmreplay_capture_recorder_shed_total{work="prefix_hashes"}')
          kill -TERM "$CAP_PID"; wait "$CAP_PID" || true; CAP_PID=""
          lag=$( [ -n "$done_at" ] && awk -v a="$t_end" -v b="$done_at" 'BEGIN { printf "%.1f", b - a }' || echo ">60")
          cpu=$(awk -v a="$cpu0" -v b="$cpu1" -v n="$total" 'BEGIN { printf "%.2f", (b - a) * 1000 / (n > 0 ? n : 1) }')
          pass=$(awk -v d="$d" -v l="$lag" 'BEGIN { print (d == 0 && l != ">60" && l <= 2.0 ? "yes" : "no") }')
          echo "| $label | $api | $len | $r | $total | $d | $lag | $maxlag | $shed | $cpu | $pass |" | tee -a "$OUT/recorder.md"
          rm -rf "$OUT/trace-$tag" "$OUT/$tag.parquet"
        done
      done
    done
  done
done
kill -TERM "$SIM_PID"; wait "$SIM_PID" || true
trap - EXIT

#!/usr/bin/env bash
# Soak of `llmreplay capture` (not CI): N minutes of steady streamed load through capture in
# front of the sim, with faults the load asks for by plan (500, 429, reset mid-stream, stall,
# client cancel; bench/soak.py). Capture's RSS and open fds are sampled every few seconds;
# at the end the summary says whether rows recorded == requests sent, the RSS and fd slopes
# (least squares, per hour) and the rows' outcomes by the fault that caused them. Everything
# on 127.0.0.1; it stops by itself. Output: bench/out/soak-<timestamp>/summary.md.
#
# usage: bench/soak.sh [MINUTES]        (default 30, fractions allowed; or SOAK_MINUTES)
#   SOAK_CONCURRENCY  clients, each sending its next request when the last ended (default 8)
#   SOAK_SAMPLE_S     seconds between samples (default 5)
#   SOAK_CAPTURE_FLAGS  more capture flags, e.g. "--max-file-age 30s" (the writer keeps a
#                     file's records in memory until it rotates, so RSS grows with them)
#   LLMREPLAY_BIN     another build
set -euo pipefail
cd "$(dirname "$0")/.."

MINUTES=${1:-${SOAK_MINUTES:-30}}
CONC=${SOAK_CONCURRENCY:-8}
SAMPLE=${SOAK_SAMPLE_S:-5}
OUT=bench/out/soak-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
python3 -c 'import pyarrow' 2>/dev/null || python3 -m pip install -q pyarrow >/dev/null
cargo build --release --bin llmreplay 2>&1 | tail -1
BIN=${LLMREPLAY_BIN:-target/release/llmreplay}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "server on $1 did not start" >&2; return 1; }

SIM_PORT=$(free_port)
CAP_PORT=$(free_port)
# 16 tokens per stream, TTFT 20 ms, ITL 5 ms (~100 ms a stream); a stall lasts 3 s at the
# sim, and capture cuts it after 1 s without data.
"$BIN" sim --listen "127.0.0.1:$SIM_PORT" --fixed-timing 20,5 --stall 3s 2>"$OUT/sim.log" &
SIM_PID=$!
wait_port "$SIM_PORT"
# shellcheck disable=SC2086 # SOAK_CAPTURE_FLAGS is split into flags on purpose.
"$BIN" capture --listen "127.0.0.1:$CAP_PORT" --upstream "http://127.0.0.1:$SIM_PORT" --out "$OUT/trace" \
  --no-admin --session-header x-soak-id --idle-timeout 1s --upstream-timeout 10s ${SOAK_CAPTURE_FLAGS:-} 2>"$OUT/capture.log" &
CAP_PID=$!
trap 'kill -TERM $CAP_PID $SIM_PID 2>/dev/null || true' EXIT
wait_port "$CAP_PORT"

SECONDS_TOTAL=$(awk -v m="$MINUTES" 'BEGIN { print m * 60 }')
echo "soak: $MINUTES min, $CONC clients, capture pid $CAP_PID${SOAK_CAPTURE_FLAGS:+ ($SOAK_CAPTURE_FLAGS)}, sampling every ${SAMPLE}s into $OUT" | tee "$OUT/params.txt"
( while kill -0 "$CAP_PID" 2>/dev/null; do
    rss=$(awk '/^VmRSS/ {print $2}' "/proc/$CAP_PID/status" 2>/dev/null || echo)
    fds=$(ls "/proc/$CAP_PID/fd" 2>/dev/null | wc -l)
    [ -n "$rss" ] && echo "$(date +%s.%N) $rss $fds" >> "$OUT/samples.tsv"
    sleep "$SAMPLE"
  done ) &
SAMPLER=$!
python3 bench/soak.py load "$CAP_PORT" "$SECONDS_TOTAL" "$CONC" "$OUT/load.jsonl"
sleep "$SAMPLE" # one more sample after the load, with every stream ended
kill -TERM "$CAP_PID"; wait "$CAP_PID" || echo "capture exited $?" >&2
kill "$SAMPLER" 2>/dev/null || true; wait "$SAMPLER" 2>/dev/null || true
kill -TERM "$SIM_PID"; wait "$SIM_PID" || true
trap - EXIT
tail -1 "$OUT/capture.log" | cut -c1-200 > "$OUT/capture-summary.txt"
python3 bench/soak.py report "$OUT" | tee "$OUT/summary.md"
echo "capture: $(cat "$OUT/capture-summary.txt")" | tee -a "$OUT/summary.md"

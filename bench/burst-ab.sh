#!/usr/bin/env bash
# Interleaved A/B of capture builds in connection bursts (issue 17): N connections opened at
# t=0 through a cold `llmreplay capture` of build A, then of build B (then nginx, with
# `nginx`), ROUNDS times, alternating, so both see the same machine. The client and the
# ground-truth server are one build throughout ($BIN, default target/release/llmreplay).
# Prints per run: TTFT p50 / p99, the proxy's CPU µs and context switches per request
# (`perf stat` on every thread of the proxy) and the kernel's listen-queue overflows, then
# the medians. nginx listens with the backlog capture asks for (4,096; its default of 511
# overflows at 1,000 connections and sends those clients into a 1 s SYN retry).
#
# usage: bench/burst-ab.sh N TOKENS ROUNDS CAPTURE_A CAPTURE_B [nginx]
#   e.g. bench/burst-ab.sh 500 100 4 /tmp/old/llmreplay target/release/llmreplay nginx
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 5 ] || { sed -n 2,10p "$0"; exit 2; }
N=$1 TOK=$2 ROUNDS=$3 A=$4 B=$5 NG=${6:-}
BIN=${BIN:-target/release/llmreplay}
OUT=bench/out/ab-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
ulimit -n 65536 2>/dev/null || true
# shellcheck source=bench/nginx.sh
. bench/nginx.sh
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "nothing on $1" >&2; return 1; }
"$BIN" synth -o "$OUT/in.parquet" --num-prompts "$N" --input-len 16 --output-len "$TOK" --request-rate inf --seed 1 2>/dev/null

one() { # one LABEL PROXY_BIN|nginx RUN_DIR
  local label=$1 proxy=$2 d=$3 gt pp pid pids
  mkdir -p "$d"
  gt=$(free_port)
  "$BIN" sim --ground-truth --fixed-timing 50,10 --tokens-per-chunk 1 --listen "127.0.0.1:$gt" --chunk-log "$d/gt.jsonl" 2>/dev/null &
  local gpid=$!
  wait_port "$gt"
  pp=$(free_port)
  if [ "$proxy" = nginx ]; then
    nginx_start "$PWD/$d/ng" 1 "$pp" "$gt"
  else
    "$proxy" capture --listen "127.0.0.1:$pp" --upstream "http://127.0.0.1:$gt" --out "$d/trace" --no-admin 2>"$d/capture.log" &
  fi
  pid=$!
  wait_port "$pp"
  pids=$(echo "$pid" $(pgrep -P "$pid" || true) | tr ' ' ,)
  perf stat -e task-clock,context-switches -x, -o "$d/perf.csv" -p "$pids" 2>/dev/null &
  local perf=$!
  sleep 0.3
  local o0; o0=$(nstat -az TcpExtListenOverflows 2>/dev/null | awk '/ListenOverflows/{print $2}' || true)
  "$BIN" replay "$OUT/in.parquet" --target "$label=http://127.0.0.1:$pp" --request-rate inf --max-concurrency "$N" \
    --no-preconnect --save-result "$d/r.json" -q > "$d/replay.txt" 2>&1
  local o1; o1=$(nstat -az TcpExtListenOverflows 2>/dev/null | awk '/ListenOverflows/{print $2}' || true)
  echo $(( ${o1:-0} - ${o0:-0} )) > "$d/overflows"
  kill -INT "$perf"; wait "$perf" || true
  kill -TERM "$pid"; wait "$pid" || true
  kill -TERM "$gpid"; wait "$gpid" || true
  echo "$label $d" >> "$OUT/runs.txt"
}

for r in $(seq "$ROUNDS"); do
  one A "$A" "$OUT/A-$r"
  one B "$B" "$OUT/B-$r"
  [ "$NG" = nginx ] && one nginx nginx "$OUT/nginx-$r"
done

python3 - "$OUT" "$N" <<'PY'
import json, statistics, sys
out, n = sys.argv[1], int(sys.argv[2])
rows = {}
for line in open(f"{out}/runs.txt"):
    label, d = line.split()
    r = json.load(open(f"{d}/r.json"))
    v = {f[2].split(":")[0]: float(f[0]) for f in (l.strip().split(",") for l in open(f"{d}/perf.csv"))
         if len(f) > 2 and f[0].replace(".", "").isdigit()}
    row = (r["median_ttft_ms"], r["p99_ttft_ms"], v.get("task-clock", float("nan")) * 1000 / n,
           v.get("context-switches", float("nan")) / n, r["completed"], open(f"{d}/overflows").read().strip())
    rows.setdefault(label, []).append(row)
    print(f"{label:6} TTFT p50 {row[0]:7.1f} p99 {row[1]:7.1f} ms  CPU {row[2]:6.0f} us/req  {row[3]:5.2f} cs/req  ok {row[4]}/{n}  listen overflows {row[5]}")
for label, rs in rows.items():
    med = [statistics.median(x[i] for x in rs) for i in range(4)]
    print(f"median {label:6} TTFT p50 {med[0]:7.1f} p99 {med[1]:7.1f} ms  CPU {med[2]:6.0f} us/req  {med[3]:5.2f} cs/req  ({len(rs)} runs)")
PY

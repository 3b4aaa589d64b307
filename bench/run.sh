#!/usr/bin/env bash
# llmreplay's benchmarks: client accuracy against a ground-truth server, schedule fidelity,
# and client cost. Everything runs on 127.0.0.1 with bounded request counts and stops by
# itself; the figures go to bench/out/<timestamp>/summary.md (copy them into bench/README.md).
#
# usage: bench/run.sh [accuracy] [schedule] [proxy] [burst] [shards] [cost]     (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."

parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(accuracy schedule proxy burst shards cost)
OUT=bench/out/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
python3 -m pip install -q numpy pyarrow >/dev/null
cargo build --release --bin llmreplay 2>&1 | tail -1
cargo build --release -p replay --example floor --example floor_uring -p trace-format --example writer_throughput 2>&1 | tail -1
BIN=${LLMREPLAY_BIN:-target/release/llmreplay}  # LLMREPLAY_BIN: another build, for an A/B
# CAPTURE_BIN: the build that runs `capture` (default $BIN), to A/B the proxy alone while the
# client and the ground-truth server stay the same build.
CAPTURE_BIN=${CAPTURE_BIN:-$BIN}
ulimit -n 65536 2>/dev/null || true
# shellcheck source=bench/nginx.sh
. bench/nginx.sh

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "server on $1 did not start" >&2; return 1; }

# Where the accuracy runs put client and server. "split" (the default on 2+ CPUs): the client
# on CPU 0, the ground-truth server on the others, as if on two machines, so the server's
# bursts (1,000 chunks due at one instant) do not take the client's CPU. "shared": both float
# over all CPUs, contending. Everything else runs shared.
NCPU=$(nproc)
PLACE=shared
pin_client() { if [ "$PLACE" = split ]; then taskset -c 0 "$@"; else "$@"; fi; }
server_pin() { if [ "$PLACE" = split ]; then echo "taskset -c 1-$(( NCPU - 1 ))"; fi; }

# Ground-truth server: TTFT $2 ms, ITL $3 ms, $4 tokens per chunk; chunk log to $1.
start_gt() {
  GT_PORT=$(free_port)
  # shellcheck disable=SC2046 # the prefix is empty or "taskset -c 1-N": split on purpose.
  $(server_pin) "$BIN" sim --ground-truth --fixed-timing "$2,$3" --tokens-per-chunk "$4" --listen "127.0.0.1:$GT_PORT" --chunk-log "$1" 2>/dev/null &
  GT_PID=$!
  wait_port "$GT_PORT"
}
stop_gt() { kill -TERM "$GT_PID"; wait "$GT_PID" || true; }

accuracy() { # accuracy N TOKENS_PER_CHUNK PLACEMENT
  local n=$1 tpc=$2 tag="acc-$3-$1-tpc$2"
  PLACE=$3
  local reqs=$(( n == 1 ? 20 : 2 * n ))
  start_gt "$OUT/$tag-gt.jsonl" 50 10 "$tpc"
  "$BIN" synth -o "$OUT/$tag.parquet" --num-prompts "$reqs" --input-len 16 --output-len 100 --request-rate inf --seed 1 2>/dev/null
  pin_client "$BIN" replay "$OUT/$tag.parquet" --target "gt=http://127.0.0.1:$GT_PORT" --max-concurrency "$n" \
    --results "$OUT/$tag-results.parquet" --save-result "$OUT/$tag.json" -q > "$OUT/$tag.txt" 2>&1
  stop_gt
  PLACE=shared
  python3 bench/accuracy.py "$OUT/$tag-results.parquet" "$OUT/$tag-gt.jsonl" 50 10 "$tpc" > "$OUT/$tag-errors.json"
  python3 bench/accuracy.py --vs-server llmreplay "$OUT/$tag-results.parquet" "$OUT/$tag-gt.jsonl" > "$OUT/$tag-vs-server.json"
  echo "accuracy: $n streams, $tpc tokens/chunk, $3 done"
}

# The same load read by a bare client (replay/examples/floor.rs: one thread, epoll, one
# recvmsg with its kernel stamp per read, no parsing), against a fresh ground-truth server:
# the kernel's share of the CPU per event, and the first-event error any client would see on
# this machine at this load.
floor() { # floor N PLACEMENT
  local n=$1 tag="floor-$2-$1"
  PLACE=$2
  local reqs=$(( n == 1 ? 20 : 2 * n ))
  start_gt "$OUT/$tag-gt.jsonl" 50 10 1
  pin_client target/release/examples/floor "127.0.0.1:$GT_PORT" "$reqs" "$n" 100 --stamps "$OUT/$tag-stamps.jsonl" > "$OUT/$tag.json"
  stop_gt
  PLACE=shared
  python3 bench/accuracy.py --floor "$OUT/$tag-stamps.jsonl" "$OUT/$tag-gt.jsonl" > "$OUT/$tag-errors.json"
  echo "floor: $n streams, $2 done"
}

# The floor through two kernel interfaces, same load (1,000 streams, split placement):
# epoll + one recvmsg per read (floor.rs) and io_uring multishot recvmsg into provided
# buffers (floor_uring.rs, no syscall per read). If the syscalls were the floor, io_uring
# would be well below epoll.
floor_kinds() {
  local n=1000 kind
  PLACE=split; [ "$NCPU" -ge 2 ] || PLACE=shared
  for kind in floor floor_uring; do
    start_gt "$OUT/kind-$kind-gt.jsonl" 50 10 1
    pin_client "target/release/examples/$kind" "127.0.0.1:$GT_PORT" $(( 2 * n )) "$n" 100 --stamps "$OUT/kind-$kind-stamps.jsonl" > "$OUT/kind-$kind.json"
    stop_gt
    python3 bench/accuracy.py --floor "$OUT/kind-$kind-stamps.jsonl" "$OUT/kind-$kind-gt.jsonl" > "$OUT/kind-$kind-errors.json"
  done
  PLACE=shared
  echo "floor kinds: done"
}

# Other benchmark clients, when bench/peers/install.sh has installed them (or `vllm` is on
# PATH): the same load as `accuracy N 1 PLACEMENT` (2×N requests, 20 at N = 1, of 16 → 100
# tokens at concurrency N, all offered at once) against a fresh ground-truth server, so their TTFT and
# ITL can be set against the server's log exactly as llmreplay's are. They send no request
# id the log could join on (v0.7.3) or one in their own format, so the comparison is of
# distributions: the client's figure minus the server's own over the same run.
PEERS_DIR=bench/.peers
peer_cmd() { # peer_cmd NAME: prints the client's command, or nothing when not installed
  case "$1" in
    vllm-0.7.3) [ -x "$PEERS_DIR/venv073/bin/python" ] && [ -f "$PEERS_DIR/vllm073/benchmark_serving.py" ]                   && echo "$PWD/$PEERS_DIR/venv073/bin/python $PWD/$PEERS_DIR/vllm073/benchmark_serving.py" ;;
    vllm-bench-serve)
      if [ -x "$PEERS_DIR/venv-current/bin/vllm" ]; then echo "$PWD/$PEERS_DIR/venv-current/bin/vllm bench serve --save-detailed --random-range-ratio 0"
      elif command -v vllm >/dev/null 2>&1; then echo "vllm bench serve --save-detailed --random-range-ratio 0"; fi ;;
  esac
  return 0
}
peer() { # peer NAME N PLACEMENT
  local name=$1 n=$2 tag="peer-$1-$3-$2" cmd tok=$PWD/$PEERS_DIR/tok/qwen3
  local reqs=$(( n == 1 ? 20 : 2 * n ))
  cmd=$(peer_cmd "$name")
  [ -n "$cmd" ] || return 0
  [ -f "$PEERS_DIR/tok/qwen3/tokenizer.json" ] || { echo "peer $name: no tokenizer (run bench/peers/install.sh)"; return 0; }
  PLACE=$3
  start_gt "$OUT/$tag-gt.jsonl" 50 10 1
  # shellcheck disable=SC2086 # $cmd is a command line on purpose.
  ( cd "$OUT" && export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 && pin_client timeout 600 \
      $cmd --backend openai \
      --base-url "http://127.0.0.1:$GT_PORT" --endpoint /v1/completions --model ground-truth \
      --tokenizer "$tok" --dataset-name random --random-input-len 16 \
      --random-output-len 100 --ignore-eos --num-prompts "$reqs" --max-concurrency "$n" \
      --request-rate inf --save-result --result-dir . --result-filename "$tag.json" --disable-tqdm ) \
    > "$OUT/$tag.txt" 2>&1 || echo "peer $name at $n streams failed: see $OUT/$tag.txt"
  stop_gt
  PLACE=shared
  [ -f "$OUT/$tag.json" ] && python3 bench/accuracy.py --vs-server vllm "$OUT/$tag.json" "$OUT/$tag-gt.jsonl" > "$OUT/$tag-errors.json"
  echo "peer: $name, $n streams, $3 done"
}

# Capture's trace writer alone: records per second and bytes on disk per request.
writer_cost() {
  rm -rf "$OUT/writer"
  target/release/examples/writer_throughput "$OUT/writer" 200000 > "$OUT/writer.json"
  rm -rf "$OUT/writer"
  echo "writer: done"
}

schedule() {
  local rate=$1 tag="sched-$1"
  # The same number of requests at every rate, so that one stall of the machine weighs the
  # same in every p99 (at 500 req/s a 4 s run has 2,000 requests: 21 late ones move its p99).
  local reqs=8000
  start_gt "$OUT/$tag-gt.jsonl" 1 1 1
  "$BIN" synth -o "$OUT/$tag.parquet" --num-prompts "$reqs" --input-len 8 --output-len 2 --request-rate "$rate" --seed 2 2>/dev/null
  "$BIN" replay "$OUT/$tag.parquet" --target "gt=http://127.0.0.1:$GT_PORT" \
    --results "$OUT/$tag-results.parquet" --save-result "$OUT/$tag.json" -q > "$OUT/$tag.txt" 2>&1
  stop_gt
  echo "schedule: $rate req/s done"
}

# CPU ticks of a process and its children (nginx's workers).
cpu_ticks() { local t=0 p; for p in $1 $(pgrep -P "$1" || true); do t=$(( t + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0) )); done; echo $t; }

# The same load direct, through `llmreplay capture`, and through nginx (proxy_buffering off)
# when nginx is installed (the script tries Debian's package); each path gets a fresh
# ground-truth server so its chunk log belongs to that path alone.
proxy_path() { # proxy_path N PATH [burst [ROUND]]
  local n=$1 path=$2 mode=${3:-poisson} tag="proxy-$1-$2"
  local reqs=$(( 2 * n ))
  [ "$mode" = burst ] && { tag="burst-$1-$2${4:+-r$4}"; reqs=$n; }
  start_gt "$OUT/$tag-gt.jsonl" 50 10 1
  local target="http://127.0.0.1:$GT_PORT" ppid=""
  case "$path" in
    capture|capture1|capture-b)
      # capture1: one serving thread, like nginx's one worker below. capture-b: the build
      # $CAPTURE_B_BIN, for an A/B of two builds of the proxy in the same run.
      local pp threads=() cbin=$CAPTURE_BIN; pp=$(free_port)
      [ "$path" = capture-b ] && cbin=${CAPTURE_B_BIN:?capture-b needs CAPTURE_B_BIN}
      [ "$path" = capture1 ] && threads=(--threads 1)
      # Bursts: capture's own stamps of each request's phases (builds that have the flag).
      [ "$mode" = burst ] && grep -q -- phase-log "$cbin" && threads+=(--phase-log "$PWD/$OUT/$tag-phases.jsonl")
      "$cbin" capture --listen "127.0.0.1:$pp" --upstream "$target" --out "$OUT/$tag-trace" --no-admin "${threads[@]}" 2>"$OUT/$tag-capture.log" &
      ppid=$!; wait_port "$pp"; target="http://127.0.0.1:$pp" ;;
    nginx|nginx2)
      # nginx2: two workers, like capture's default of one serving thread per core here.
      local pp workers=1; pp=$(free_port); [ "$path" = nginx2 ] && workers=2
      nginx_start "$PWD/$OUT/$tag-nginx" "$workers" "$pp" "$GT_PORT"
      ppid=$!; wait_port "$pp"; target="http://127.0.0.1:$pp" ;;
  esac
  if [ "$mode" = burst ]; then
    # A connection burst (clients reconnecting after a deploy): N requests at t=0, each on a
    # connection opened at that instant through a cold proxy; the kernel's listen-queue
    # overflows are counted around it, and capture's rows against the requests.
    "$BIN" synth -o "$OUT/$tag.parquet" --num-prompts "$reqs" --input-len 16 --output-len 100 --request-rate inf --seed 1 2>/dev/null
    local o0; o0=$(nstat -az TcpExtListenOverflows 2>/dev/null | awk '/ListenOverflows/{print $2}' || true)
    # The proxy's CPU and context switches over the burst (every thread of capture; nginx's
    # master and worker), when perf can attach.
    local perf_pid=""
    if [ -n "$ppid" ] && command -v perf >/dev/null 2>&1; then
      perf stat -e task-clock,context-switches -x, -o "$OUT/$tag-perf.csv" \
        -p "$(echo "$ppid" $(pgrep -P "$ppid" || true) | tr ' ' ,)" 2>/dev/null &
      perf_pid=$!; sleep 0.3
    fi
    # perf counts the threads that exist when it attaches; the kernel's ticks count them all
    # (capture's blocking pool starts during the burst), at 10 ms resolution.
    local c0=0; [ -n "$ppid" ] && c0=$(cpu_ticks "$ppid")
    "$BIN" replay "$OUT/$tag.parquet" --target "$path=$target" --request-rate inf --max-concurrency "$n" --no-preconnect \
      --results "$OUT/$tag-results.parquet" --save-result "$OUT/$tag.json" -q > "$OUT/$tag.txt" 2>&1
    local o1; o1=$(nstat -az TcpExtListenOverflows 2>/dev/null | awk '/ListenOverflows/{print $2}' || true)
    [ -n "$perf_pid" ] && { kill -INT "$perf_pid"; wait "$perf_pid" || true; }
    local ticks=-; [ -n "$ppid" ] && ticks=$(( $(cpu_ticks "$ppid") - c0 ))
    [ -n "$ppid" ] && { kill -TERM "$ppid"; wait "$ppid" || true; }
    stop_gt
    local rows=-
    [ -d "$OUT/$tag-trace" ] && rows=$(python3 -c "import pyarrow.dataset as d,sys; print(d.dataset(sys.argv[1], format='parquet').count_rows())" "$OUT/$tag-trace" 2>/dev/null || echo '?')
    # Added TTFT, per request: the client's TTFT minus the server's own (its logged write of
    # the first chunk after it read the request), so the server's lateness in the burst
    # (its one writer thread) is not counted against the path.
    python3 bench/accuracy.py "$OUT/$tag-results.parquet" "$OUT/$tag-gt.jsonl" 50 10 1 > "$OUT/$tag-errors.json" 2>/dev/null || true
    python3 - "$OUT/$tag.json" "$n" "$path" "$(( ${o1:-0} - ${o0:-0} ))" "$rows" "$OUT/$tag-perf.csv" "$ticks" "${4:-1}" "$OUT/burst.jsonl" "$OUT/$tag-errors.json" >> "$OUT/burst.txt" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
added = {"p50": None, "p99": None}
try:
    added = json.load(open(sys.argv[10]))["ttft_err_vs_logged_ms"]
except (OSError, ValueError, KeyError):
    pass
cpu, us = "", None
if os.path.exists(sys.argv[6]):
    v = {f[2].split(":")[0]: float(f[0]) for f in (l.strip().split(",") for l in open(sys.argv[6]))
         if len(f) > 2 and f[0].replace(".", "").isdigit()}
    n = int(sys.argv[2])
    if "task-clock" in v:
        us = v['task-clock'] * 1000 / n
        cpu = (f"  proxy CPU {us:6.0f} us/req  {v.get('context-switches', 0) / n:5.2f} cs/req"
               f"  ({sys.argv[7]} ticks of 10 ms, all threads)")
fmt = lambda v: "   -" if v is None else f"{v:8.1f}"
print(f"{sys.argv[2]:>5} {sys.argv[3]:<9} r{sys.argv[8]} TTFT p50 {r['median_ttft_ms']:8.1f} p99 {r['p99_ttft_ms']:8.1f} ms  "
      f"added p50 {fmt(added['p50'])} p99 {fmt(added['p99'])} ms  "
      f"ok {r['completed']}/{r['num_prompts']}  listen overflows {sys.argv[4]}  rows recorded {sys.argv[5]}{cpu}")
with open(sys.argv[9], "a") as f:
    f.write(json.dumps({"n": int(sys.argv[2]), "path": sys.argv[3], "round": int(sys.argv[8]),
                        "p50": r["median_ttft_ms"], "p99": r["p99_ttft_ms"],
                        "added_p50": added["p50"], "added_p99": added["p99"], "ok": r["completed"],
                        "sent": r["num_prompts"], "overflows": int(sys.argv[4]), "rows": sys.argv[5],
                        "cpu_us_per_req": us}) + "\n")
PY
    [ -f "$OUT/$tag-phases.jsonl" ] && python3 bench/phases.py "$OUT/$tag-phases.jsonl" > "$OUT/$tag-phases.txt"
    echo "burst: $n connections via $path done"
    return
  fi
  # Poisson arrivals at N req/s: each response lasts ~1.04 s, so about N streams are in
  # flight, without every stream starting (and every chunk falling due) at the same instant.
  "$BIN" synth -o "$OUT/$tag.parquet" --num-prompts "$reqs" --input-len 16 --output-len 100 --request-rate "$n" --seed 1 2>/dev/null
  # A first pass warms every path's connection pools (a proxy in production is warm);
  # the second pass is measured. The server's log keeps the last entry per request id.
  "$BIN" replay "$OUT/$tag.parquet" --target "$path=$target" --request-rate inf --max-concurrency "$n" -q > /dev/null 2>&1
  local c0=0; [ -n "$ppid" ] && c0=$(cpu_ticks "$ppid")
  "$BIN" replay "$OUT/$tag.parquet" --target "$path=$target" \
    --results "$OUT/$tag-results.parquet" --save-result "$OUT/$tag.json" -q > "$OUT/$tag.txt" 2>&1
  if [ -n "$ppid" ]; then
    echo $(( $(cpu_ticks "$ppid") - c0 )) > "$OUT/$tag-proxy-cpu-ticks"
    kill -TERM "$ppid"; wait "$ppid" || true
  fi
  stop_gt
  python3 bench/accuracy.py "$OUT/$tag-results.parquet" "$OUT/$tag-gt.jsonl" 50 10 1 > "$OUT/$tag-errors.json"
  echo "proxy: $n streams via $path done"
}

proxy_bench() {
  command -v nginx >/dev/null 2>&1 || { apt-get install -y -qq nginx-light >/dev/null 2>&1 || apt-get install -y -qq nginx >/dev/null 2>&1 || true; }
  for n in 100 300 1000; do
    proxy_path "$n" direct
    proxy_path "$n" capture
    proxy_path "$n" capture1
    if command -v nginx >/dev/null 2>&1; then proxy_path "$n" nginx; else echo "nginx not installed: skipped"; fi
  done
}

# Connection bursts (issue 17): 100, 500 and 1,000 connections opened at t=0 (BURST_NS to
# change), direct, through capture and through nginx, BURST_ROUNDS rounds (default 15) with
# the paths interleaved in each, since one burst on a shared 2-core machine swings p99 by 2x;
# bench/out/<run>/burst.txt has each run's TTFT, listen overflows, rows, and the proxies' CPU
# and context switches per request (perf stat), burst-medians.txt the medians over rounds
# (TTFT and added TTFT: the client's minus the server's own logged one, per request) and
# how many rounds capture's p99 was no worse than nginx's, with pooled percentiles and a
# permutation p (3 rounds cannot tell 5 ms from noise); burst-N-capture-r*-phases.txt
# where capture's time went (bench/phases.py). BURST_PATHS picks the paths (default "direct
# capture nginx"); "capture1" is capture with one serving thread and "nginx2" nginx with two
# workers (like-for-like with nginx's one worker and capture's default of one thread per
# core); "capture-b" is the build CAPTURE_B_BIN, for an A/B of two proxies:
#   BURST_NS=100 BURST_ROUNDS=10 BURST_PATHS="capture capture-b nginx" CAPTURE_B_BIN=/tmp/old bench/run.sh burst
burst_bench() {
  command -v nginx >/dev/null 2>&1 || { apt-get install -y -qq nginx-light >/dev/null 2>&1 || apt-get install -y -qq nginx >/dev/null 2>&1 || true; }
  for n in ${BURST_NS:-100 500 1000}; do
    for r in $(seq "${BURST_ROUNDS:-15}"); do
      for path in ${BURST_PATHS:-direct capture nginx}; do
        if [[ "$path" = nginx* ]] && ! command -v nginx >/dev/null 2>&1; then echo "nginx not installed: skipped"; continue; fi
        proxy_path "$n" "$path" burst "$r"
      done
    done
  done
  cat "$OUT/burst.txt"
  python3 bench/burst_medians.py "$OUT/burst.jsonl" | tee "$OUT/burst-medians.txt"
}

# Four `replay --shard K/4` processes sharing one absolute --start-at against one
# ground-truth server, versus one process replaying the whole trace (issue 8): the test
# prints the server-side arrival differences and, with LLMREPLAY_STRICT_TIMING=1, asserts
# p99 <= 2 ms.
shards() {
  LLMREPLAY_STRICT_TIMING=1 cargo test --release --test integration shard::four_shards_with_one_start -- --nocapture \
    > "$OUT/shards.txt" 2>&1 || { cat "$OUT/shards.txt" >&2; echo "shards: FAILED" >&2; }
  echo "shards: done"
}

for p in "${parts[@]}"; do
  case "$p" in
    accuracy)
      split=split; [ "$NCPU" -ge 2 ] || split=shared
      for n in 1 100 500 1000; do accuracy "$n" 1 "$split"; floor "$n" "$split"; done
      accuracy 100 4 "$split"
      for n in 100 1000; do accuracy "$n" 1 shared; floor "$n" shared; done
      # Last, so that a peer's exit (a Python process of a few GB) cannot disturb ours.
      for n in 1 100 500 1000; do
        for peer_name in vllm-0.7.3 vllm-bench-serve; do peer "$peer_name" "$n" "$split"; done
      done ;;
    cost)
      # llmreplay beside the bare reader at the same loads, same run: CPU per event as a ratio.
      split=split; [ "$NCPU" -ge 2 ] || split=shared
      writer_cost
      for n in 100 1000; do accuracy "$n" 1 "$split"; floor "$n" "$split"; done
      floor_kinds ;;
    schedule) for r in 500 1000 2000 5000; do schedule "$r"; done ;;
    proxy) proxy_bench ;;
    burst) burst_bench ;;
    shards) shards ;;
    *) echo "unknown part $p (accuracy, schedule, proxy, burst, shards, cost)" >&2; exit 2 ;;
  esac
done
python3 bench/summarize.py "$OUT" | tee "$OUT/summary.md"

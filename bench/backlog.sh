#!/usr/bin/env bash
# A backlog in bounded memory (issue 40, item 3): peak RSS of `llmreplay replay` when
# requests wait for a --max-concurrency slot, beside an older binary.
#
#   bench/backlog.sh [PART...]          # parts: burst paced (default: both)
#   SIZES="100000 1000000 10000000" OLD_SIZES="100000 400000" bench/backlog.sh burst
#   SECONDS_PACED=90 bench/backlog.sh paced
#   OLD=/path/to/old/llmreplay NEW=/path/to/new/llmreplay bench/backlog.sh
#
# burst:  N requests all due at once (`--request-rate inf`) with --max-concurrency 256
#         against a sim that answers at once with one output token (`--fixed-timing 0,0`,
#         `--output-len 1`): /usr/bin/time's peak RSS and wall time. The input is a
#         100,000-row synth trace looped N/100,000 times (`--loop`: read again per pass), so
#         no process holds the N rows.
# paced:  Poisson arrivals at twice the `tiny` sim profile's capacity (measured first: all
#         at once, --max-concurrency 64), --max-concurrency 64, for SECONDS_PACED of schedule;
#         the backlog then drains. RSS sampled every 5 s from /proc; the console verdict.
# Everything runs on 127.0.0.1 and ends by itself. Output: bench/out/backlog-<time>/.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NEW=${NEW:-$ROOT/target/release/llmreplay}
OLD=${OLD:-/work/main/target/release/llmreplay}
SIZES=${SIZES:-100000 1000000 10000000}
OLD_SIZES=${OLD_SIZES:-100000 400000}
SECONDS_PACED=${SECONDS_PACED:-90}
PARTS=${*:-burst paced}
OUT=$ROOT/bench/out/backlog-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
[ -x "$NEW" ] || (cd "$ROOT" && cargo build --release --bin llmreplay)
SUM=$OUT/summary.md
echo "# bench/backlog.sh $(date -u +%FT%TZ), new $NEW, old $OLD" >"$SUM"

SIMS=()
cleanup() { for p in "${SIMS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start_sim() { # PORT ARGS...: a sim on 127.0.0.1:PORT, waited for
  local port=$1; shift
  "$NEW" sim --listen "127.0.0.1:$port" "$@" >"$OUT/sim-$port.log" 2>&1 &
  SIMS+=($!)
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && return 0
    sleep 0.1
  done
  echo "sim on $port did not start" >&2; exit 1
}

field() { # FILE KEY: a value from /usr/bin/time -v's report
  grep -F "$2" "$1" | sed 's/.*: //'
}

TRACE=$OUT/t100k.parquet
"$NEW" synth -o "$TRACE" --num-prompts 100000 --input-len 16 --output-len 1 >/dev/null 2>&1

burst() {
  local port; port=$(free_port)
  start_sim "$port" --fixed-timing 0,0
  echo -e "\n## burst: N requests at once, --max-concurrency 256, 1 output token\n" >>"$SUM"
  echo "| binary | requests | wall | peak RSS (MiB) | completed | client queue p50/p99 (ms) | dispatch lag p99 (ms) |" >>"$SUM"
  echo "|---|---|---|---|---|---|---|" >>"$SUM"
  for which in new old; do
    local bin=$NEW sizes=$SIZES
    [ "$which" = old ] && bin=$OLD && sizes=$OLD_SIZES
    for n in $sizes; do
      local tag=$which-$n
      /usr/bin/time -v "$bin" replay "$TRACE" --loop $((n / 100000)) \
        --target "http://127.0.0.1:$port" --request-rate inf --max-concurrency 256 \
        --output-len 1 --no-preconnect -q >"$OUT/$tag.out" 2>"$OUT/$tag.time" || true
      local rss wall ok q lag
      rss=$(field "$OUT/$tag.time" "Maximum resident set size")
      wall=$(field "$OUT/$tag.time" "Elapsed (wall clock)")
      ok=$(grep -F "Successful requests:" "$OUT/$tag.out" | awk '{print $3}' || true)
      q=$(grep -F "Client queue time p50/p99" "$OUT/$tag.out" | sed 's/.*: *//' || true)
      lag=$(grep -F "Dispatch lag p50/p99/max" "$OUT/$tag.out" | sed 's/.*: *//' | awk -F' / ' '{print $2}' || true)
      echo "| $which | $n | $wall | $((rss / 1024)) | ${ok:-?} | ${q:-?} | ${lag:-?} |" | tee -a "$SUM"
    done
  done
}

sample_rss() { # PID FILE: VmRSS every 5 s while PID lives
  local t=0
  while kill -0 "$1" 2>/dev/null; do
    awk -v t="$t" '/VmRSS/ {printf "%d %d\n", t, $2 / 1024}' "/proc/$1/status" >>"$2" 2>/dev/null || true
    sleep 5; t=$((t + 5))
  done
}

paced() {
  local port; port=$(free_port)
  start_sim "$port" --profile tiny
  # The sim's capacity: 4,000 requests at once, 64 in flight at most.
  "$NEW" replay "$TRACE" --max-requests 4000 --target "http://127.0.0.1:$port" \
    --request-rate inf --max-concurrency 64 --output-len 1 -q >"$OUT/capacity.out" 2>&1 || true
  local cap rate n
  cap=$(grep -F "Request throughput (req/s):" "$OUT/capacity.out" | awk '{print $4}')
  rate=$(python3 -c "print(round(2 * $cap))")
  n=$((rate * SECONDS_PACED))
  echo -e "\n## paced: Poisson at 2× the tiny profile's capacity ($cap req/s → $rate req/s), --max-concurrency 64, $n requests over ${SECONDS_PACED} s\n" >>"$SUM"
  for which in new old; do
    local bin=$NEW
    [ "$which" = old ] && bin=$OLD
    local tag=paced-$which
    "$bin" replay "$TRACE" --loop $(((n + 99999) / 100000)) --max-requests "$n" \
      --target "http://127.0.0.1:$port" --request-rate "$rate" --max-concurrency 64 \
      --output-len 1 -q >"$OUT/$tag.out" 2>&1 &
    local pid=$!
    : >"$OUT/$tag.rss"
    sample_rss "$pid" "$OUT/$tag.rss"
    wait "$pid" || true
    echo "$which: RSS (MiB) every 5 s: $(awk '{printf "%s ", $2}' "$OUT/$tag.rss")" | tee -a "$SUM"
    echo "$which: $(grep -E "^(OVERLOADED|Served)" "$OUT/$tag.out" | head -2 | tr '\n' ' ')" | tee -a "$SUM"
    echo >>"$SUM"
  done
}

for p in $PARTS; do "$p"; done
echo "summary: $SUM"

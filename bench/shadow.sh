#!/usr/bin/env bash
# What --shadow costs production: the same trace replayed through four captures of the sim
# (fixed 20 ms TTFT, ITL_MS between tokens) — no shadow, a healthy candidate (a sim, 60 ms
# TTFT, the same ITL, up to 1024 in flight), a stalled one (accepts, never answers;
# --shadow-max-in-flight 16) and an unreachable one (a closed port) — in interleaved rounds
# (the order rotates each round), all four captures running throughout.
# Per run: the production TTFT p50/p99 the client saw and its outcomes; per mode: the median
# over rounds, and the capture's shadow counters at the end.
# Streams open at once ≈ RATE × (20 ms + OUTPUT_LEN × ITL_MS): the defaults (16 tokens, 5 ms)
# give about 10 at 100 req/s; 100 tokens 10 ms apart give 100, 100 tokens 50 ms apart 500.
#   bash bench/shadow.sh [BIN] [ROUNDS] [REQUESTS] [RATE] [OUTPUT_LEN] [ITL_MS]
set -euo pipefail
BIN=${1:-target/release/llmreplay}; R=${2:-3}; N=${3:-400}; RATE=${4:-100}; OUT=${5:-16}; ITL=${6:-5}
W=$(mktemp -d /tmp/shadow-bench.XXXX); trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$W"' EXIT
"$BIN" synth -o "$W/t.parquet" --num-prompts "$N" --request-rate "$RATE" --input-len 64 --output-len "$OUT" --seed 1 >/dev/null
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
SIM=$(port); CAND=$(port); STALL=$(port); GONE=$(port)
"$BIN" sim --listen 127.0.0.1:$SIM --fixed-timing 20,$ITL >/dev/null 2>&1 &
"$BIN" sim --listen 127.0.0.1:$CAND --fixed-timing 60,$ITL >/dev/null 2>&1 &
python3 - "$STALL" <<'P' &
import sys, socket
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(1024); held = []
while True:
    c, _ = s.accept(); held.append(c)
P
MODES=(none healthy stalled unreachable)
declare -A LISTEN ADMIN
for mode in "${MODES[@]}"; do
  LISTEN[$mode]=$(port); ADMIN[$mode]=$(port)
  case $mode in
    none) X=();;
    healthy) X=(--shadow cand=http://127.0.0.1:$CAND --shadow-max-in-flight 1024);;
    stalled) X=(--shadow cand=http://127.0.0.1:$STALL --shadow-max-in-flight 16);;
    unreachable) X=(--shadow cand=http://127.0.0.1:$GONE --shadow-max-in-flight 1024);;
  esac
  "$BIN" capture --listen 127.0.0.1:${LISTEN[$mode]} --admin 127.0.0.1:${ADMIN[$mode]} --threads 1 \
    --upstream http://127.0.0.1:$SIM --out "$W/cap-$mode" "${X[@]}" 2>"$W/cap-$mode.err" &
done
sleep 1.5
for r in $(seq 1 "$R"); do
  for i in "${!MODES[@]}"; do
    mode=${MODES[$(( (i + r) % ${#MODES[@]} ))]}
    "$BIN" replay "$W/t.parquet" --target http://127.0.0.1:${LISTEN[$mode]} -q \
      --results "$W/$mode-$r.parquet" >/dev/null 2>"$W/$mode-$r.err" || true
  done
done
for mode in "${MODES[@]}"; do
  curl -s http://127.0.0.1:${ADMIN[$mode]}/metrics | grep -E '^llmreplay_shadow_(sent|completed|dropped)_total' \
    | grep -v ' 0$' | sed "s/^/$mode: /" > "$W/$mode.metrics" || true
done
python3 - "$W" "$R" "${MODES[@]}" <<'P'
import sys, statistics, pyarrow.parquet as pq
w, rounds, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def pct(v, q):
    v = sorted(x for x in v if x is not None); return v[min(len(v) - 1, int(q * len(v)))] / 1000
for m in modes:
    p50s, p99s, oks = [], [], []
    for r in range(1, rounds + 1):
        t = pq.read_table(f"{w}/{m}-{r}.parquet").to_pydict()
        p50s.append(pct(t["ttft_us"], .5)); p99s.append(pct(t["ttft_us"], .99))
        oks.append(f'{sum(o == "ok" for o in t["outcome"])}/{len(t["outcome"])}')
    print(f"{m:12} ok {oks}  TTFT p50 {[round(x, 2) for x in p50s]} ms  p99 {[round(x, 2) for x in p99s]} ms"
          f"  median p99 {statistics.median(p99s):.2f} ms")
for m in modes:
    print(open(f"{w}/{m}.metrics").read().rstrip() or f"{m}: (no shadow counters)")
P

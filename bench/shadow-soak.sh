#!/usr/bin/env bash
# Memory of capture with a stalled --shadow candidate: production (the sim, fixed 20 ms TTFT,
# 5 ms ITL) served through capture for DURATION seconds at RATE req/s (synthetic streamed
# requests, Poisson), every request mirrored to a candidate that accepts, reads and never
# answers. Capture's RSS (VmRSS of /proc/PID/status) is sampled every STEP seconds; prints the
# series, the first-minute and last-minute maxima, production's outcomes, the shadow counters,
# and checks the RSS is flat: last-minute max <= 1.2 x first-minute max + SLACK_MB.
#   DURATION=600 RATE=100 bash bench/shadow-soak.sh [BIN] [-- extra capture flags...]
# e.g. a shorter shadow deadline, so the candidate's slots are freed and refilled all along:
#   bash bench/shadow-soak.sh target/release/llmreplay -- --shadow-timeout 5s
# Exit status 1 when the RSS is not flat. Everything listens on 127.0.0.1; every loop is
# bounded by DURATION.
set -euo pipefail
BIN=${1:-target/release/llmreplay}; shift || true
[ "${1:-}" = "--" ] && shift
EXTRA=("$@")
DURATION=${DURATION:-600}; RATE=${RATE:-100}; STEP=${STEP:-10}; SLACK_MB=${SLACK_MB:-4}
N=$(( DURATION * RATE ))
W=$(mktemp -d /tmp/shadow-soak.XXXX); trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$W"' EXIT
"$BIN" synth -o "$W/t.parquet" --num-prompts "$N" --request-rate "$RATE" --input-len 64 \
  --output-len 16 --seed 1 >/dev/null
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
SIM=$(port); STALL=$(port); LISTEN=$(port); ADMIN=$(port)
"$BIN" sim --listen 127.0.0.1:$SIM --fixed-timing 20,5 >/dev/null 2>&1 &
# The stalled candidate: accepts, reads what it is sent, never writes; closes its side when
# capture closes its own (so a capture that gives up on it leaves no connection behind).
python3 - "$STALL" <<'P' &
import selectors, socket, sys
sel = selectors.DefaultSelector()
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(4096); sel.register(s, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        if key.fileobj is s:
            c, _ = s.accept(); sel.register(c, selectors.EVENT_READ)
        else:
            try:
                data = key.fileobj.recv(65536)
            except OSError:
                data = b""
            if not data:
                sel.unregister(key.fileobj); key.fileobj.close()
P
# Wait (bounded) until the sim and the candidate listen: a request mirrored before the
# candidate is up is a connect failure, not a stall.
listening() { python3 -c 'import socket,sys;socket.create_connection(("127.0.0.1",int(sys.argv[1])),1).close()' "$1" 2>/dev/null; }
for p in $SIM $STALL; do
  for _ in $(seq 1 100); do listening "$p" && break; sleep 0.1; done
done
"$BIN" capture --listen 127.0.0.1:$LISTEN --admin 127.0.0.1:$ADMIN --threads 1 \
  --upstream http://127.0.0.1:$SIM --out "$W/cap" \
  --shadow stalled=http://127.0.0.1:$STALL "${EXTRA[@]}" 2>"$W/cap.err" &
CAP=$!
for _ in $(seq 1 50); do curl -sf http://127.0.0.1:$ADMIN/healthz >/dev/null && break; sleep 0.1; done
rss() { awk '/^VmRSS:/ {print $2}' /proc/$CAP/status; }
"$BIN" replay "$W/t.parquet" --target http://127.0.0.1:$LISTEN -q --results "$W/r.parquet" \
  >/dev/null 2>"$W/replay.err" &
REPLAY=$!
START=$(date +%s)
echo "t_s rss_kb in_flight" > "$W/rss"
while :; do
  t=$(( $(date +%s) - START ))
  inflight=$(curl -s http://127.0.0.1:$ADMIN/metrics | awk '/^llmreplay_shadow_in_flight/ {print $2}')
  echo "$t $(rss) ${inflight:-?}" >> "$W/rss"
  kill -0 $REPLAY 2>/dev/null || break
  [ "$t" -ge $(( DURATION + 60 )) ] && { echo "replay still running after $t s: stopped" >&2; kill $REPLAY; break; }
  sleep "$STEP"
done
wait $REPLAY || echo "replay exited $?" >&2
curl -s http://127.0.0.1:$ADMIN/metrics | grep -E '^llmreplay_shadow_(sent|completed|dropped)_total|^llmreplay_shadow_in_flight' \
  | grep -v ' 0$' > "$W/metrics" || true
python3 - "$W" "$SLACK_MB" <<'P'
import sys, collections, pyarrow.parquet as pq
w, slack = sys.argv[1], float(sys.argv[2])
rows = [l.split() for l in open(f"{w}/rss").read().split("\n")[1:] if l.strip()]
series = [(int(t), int(kb)) for t, kb, _ in rows]
print("capture RSS (t s: MiB, shadows in flight):")
print("  " + "  ".join(f"{t}:{kb/1024:.1f}({f})" for (t, kb), (_, _, f) in zip(series, rows)))
end = series[-1][0]
first = [kb for t, kb in series if 0 < t <= 60]
last = [kb for t, kb in series if t >= end - 60]
fmax, lmax = max(first) / 1024, max(last) / 1024
t = pq.read_table(f"{w}/r.parquet").to_pydict()
outcomes = collections.Counter(t["outcome"])
print(f"production: {len(t['outcome'])} requests, outcomes {dict(outcomes)}")
print(open(f"{w}/metrics").read().rstrip())
limit = 1.2 * fmax + slack
flat = lmax <= limit
print(f"RSS first-minute max {fmax:.1f} MiB, last-minute max {lmax:.1f} MiB, "
      f"overall max {max(kb for _, kb in series)/1024:.1f} MiB; limit 1.2 x first + {slack:g} = "
      f"{limit:.1f} MiB: {'FLAT' if flat else 'GROWING'}")
sys.exit(0 if flat else 1)
P

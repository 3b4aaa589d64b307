#!/usr/bin/env bash
# What --otlp-endpoint costs the measurement: the same trace replayed against the sim
# (fixed 20 ms TTFT, 5 ms ITL) with no exporter, with a receiver that answers every POST
# (python3, 127.0.0.1), and with one that accepts and never answers (stalled); per run, the
# p50/p99 of TTFT and of the client's own dispatch lag from --results, and the exporter's
# end-of-run line.
#   bash bench/otel.sh [BIN] [REQUESTS] [RATE]
set -euo pipefail
BIN=${1:-target/release/llmreplay}; N=${2:-2000}; RATE=${3:-200}
W=$(mktemp -d /tmp/otel-bench.XXXX); trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$W"' EXIT
"$BIN" synth -o "$W/t.parquet" --num-prompts "$N" --request-rate "$RATE" --input-len 64 --output-len 16 --seed 1 >/dev/null
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
SIM=$(port); OK=$(port); STALL=$(port)
"$BIN" sim --listen 127.0.0.1:$SIM --fixed-timing 20,5 >/dev/null 2>&1 &
python3 - "$OK" <<'P' &
import sys, http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200); self.send_header("content-length", "0"); self.end_headers()
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
P
python3 - "$STALL" <<'P' &
import sys, socket, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(1024); held = []
while True:
    c, _ = s.accept(); held.append(c)
P
sleep 1
for mode in none ok stalled; do
  case $mode in none) X=();; ok) X=(--otlp-endpoint http://127.0.0.1:$OK);; stalled) X=(--otlp-endpoint http://127.0.0.1:$STALL);; esac
  "$BIN" replay "$W/t.parquet" --target http://127.0.0.1:$SIM -q --results "$W/$mode.parquet" "${X[@]}" >/dev/null 2>"$W/$mode.err" || true
  python3 - "$W/$mode.parquet" "$mode" "$(grep OTLP "$W/$mode.err" || echo '-')" <<'P'
import sys, pyarrow.parquet as pq
t = pq.read_table(sys.argv[1]).to_pydict()
def pct(v, q):
    v = sorted(x for x in v if x is not None); return v[min(len(v) - 1, int(q * len(v)))] / 1000
ok = sum(o == "ok" for o in t["outcome"])
print(f"{sys.argv[2]:8} rows {len(t['outcome'])} ok {ok}  TTFT p50 {pct(t['ttft_us'],.5):.2f} ms p99 {pct(t['ttft_us'],.99):.2f} ms  "
      f"lag p50 {pct(t['dispatch_lag_us'],.5):.3f} ms p99 {pct(t['dispatch_lag_us'],.99):.3f} ms  | {sys.argv[3]}")
P
done

#!/usr/bin/env bash
# The client's send path counted, not timed (issue 40): what the machine's noise cannot move.
# For each build, N requests of 16 -> 1 tokens all due at once (--request-rate inf,
# --max-concurrency N) against a ground-truth server whose first token comes after 3 s, so the
# burst of sends (and the response heads) is all that happens until then:
#   - syscalls per request between the first request written and the last (strace -f), with
#     one client worker (client on CPU 0, as bench/client-ab.sh places it) and with two
#     (unpinned): a syscall made under a lock shows as futex calls with two;
#   - instructions per request spent in the request's task (callgrind, --toggle-collect on
#     the task's function: sending, the head, the one chunk and the row).
# usage: bench/send-path.sh BIN... [-- N]        (N: 1,000 by default)
#   e.g. bench/send-path.sh /tmp/99ff4b5/llmreplay target/release/llmreplay
set -euo pipefail
cd "$(dirname "$0")/.."
BINS=()
N=1000
while [ $# -gt 0 ]; do
  case "$1" in
    --) N=$2; shift 2 ;;
    *) BINS+=("$(realpath "$1")"); shift ;;
  esac
done
[ ${#BINS[@]} -ge 1 ] || { sed -n 2,13p "$0"; exit 2; }
for bin in "${BINS[@]}"; do
  [ -x "$bin" ] || { echo "send-path: not an executable llmreplay build: $bin" >&2; exit 2; }
done
command -v strace >/dev/null && command -v valgrind >/dev/null || { echo "needs strace and valgrind" >&2; exit 2; }
OUT=$PWD/bench/out/send-path-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; return 1; }
# One server for every run: its first token after 3 s, its own CPU when there are two.
port=$(free_port)
pin_server=""; [ "$(nproc)" -ge 2 ] && pin_server="taskset -c 1"
$pin_server "${BINS[0]}" sim --ground-truth --fixed-timing 3000,10 --tokens-per-chunk 1 \
  --listen "127.0.0.1:$port" --chunk-log /dev/null 2>/dev/null &
server=$!
trap 'kill $server 2>/dev/null' EXIT
wait_port "$port"
i=0
for bin in "${BINS[@]}"; do
  i=$((i + 1))
  # Each build writes its own trace: an older build may not read a newer trace's metadata.
  "$bin" synth -o "$OUT/in-$i.parquet" --num-prompts "$N" --input-len 16 --output-len 1 \
    --request-rate inf --seed 1 >/dev/null 2>&1
  taskset -c 0 strace -f -o "$OUT/strace-1w-$i.txt" "$bin" replay "$OUT/in-$i.parquet" \
    --target "gt=http://127.0.0.1:$port" --max-concurrency "$N" --results "$OUT/r-$i.parquet" -q >/dev/null 2>&1
  if [ "$(nproc)" -ge 2 ]; then
    strace -f -o "$OUT/strace-2w-$i.txt" "$bin" replay "$OUT/in-$i.parquet" --client-threads 2 \
      --target "gt=http://127.0.0.1:$port" --max-concurrency "$N" --results "$OUT/r-$i.parquet" -q >/dev/null 2>&1
  fi
  valgrind --tool=callgrind --toggle-collect='*one_request*' --callgrind-out-file="$OUT/callgrind-$i.out" \
    "$bin" replay "$OUT/in-$i.parquet" --target "gt=http://127.0.0.1:$port" --max-concurrency "$N" \
    --results "$OUT/r-$i.parquet" -q >/dev/null 2>&1
  echo "$i $bin" >> "$OUT/builds.txt"
done
python3 - "$OUT" "$N" <<'EOF'
import collections, os, re, subprocess, sys
out, n = sys.argv[1], int(sys.argv[2])
def syscalls(path):
    if not os.path.exists(path):
        return None
    lines = open(path).read().splitlines()
    sent = [k for k, l in enumerate(lines) if "POST /v1" in l and ("sendto(" in l or "write(" in l)]
    if not sent:
        return None
    c = collections.Counter()
    for l in lines[sent[0]:sent[-1] + 1]:
        m = re.match(r"\d+\s+(\w+)\(", l)
        if m:
            c[m.group(1)] += 1
    return c
print(f"run {os.path.basename(out)}: {n} requests due at once; per request, between the first and the last written")
for line in open(f"{out}/builds.txt"):
    i, b = line.split(maxsplit=1)
    ir = subprocess.run(["callgrind_annotate", f"{out}/callgrind-{i}.out"], capture_output=True, text=True).stdout
    m = re.search(r"([\d,]+) \(100\.0%\)\s+PROGRAM TOTALS", ir)
    instr = int(m.group(1).replace(",", "")) / n if m else float("nan")
    print(f"\n{b.strip()}\n  instructions in the request's task: {instr:,.0f}")
    for w in ("1w", "2w"):
        c = syscalls(f"{out}/strace-{w}-{i}.txt")
        if c:
            print(f"  syscalls, {w[0]} worker(s): " + ", ".join(f"{k} {v / n:.2f}" for k, v in c.most_common(8)))
EOF

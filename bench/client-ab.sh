#!/usr/bin/env bash
# Same-run A/B of the client's accuracy (issue 40): two llmreplay builds, and vLLM's
# benchmark_serving.py v0.7.3 when bench/peers/install.sh installed it, against a fresh
# ground-truth server each (one build's `sim --ground-truth`, the same for every client, which
# logs when it handed each chunk to the kernel), at each stream count: N requests of 16 -> 100
# tokens, all due at once (--request-rate inf, --max-concurrency N), TTFT 50 ms, ITL 10 ms,
# one token per chunk. Rounds interleave the clients (the order rotates every round), so every
# client sees the same machine; bench/client_ab.py then reports per client and stream count
# the medians over rounds, with the spread, of:
#   added TTFT        the client's TTFT - the server's own (per request, joined on x-request-id);
#   added from due    (due -> request written) + that: what a request due at t=0 waited for its
#                     first token beyond the server's own TTFT (vLLM's TTFT clock starts before
#                     its send, so this is the figure to set beside vLLM's);
#   queue             due -> request written (the client's queue time + dispatch lag + connect);
#   added ITL         per gap, the client's gap - the server's.
# vLLM's client sends no request id: its figures compare distributions (its percentile - the
# server's over the same run).
#
# usage: bench/client-ab.sh OLD_BIN NEW_BIN ROUNDS [STREAMS...]    (default streams: 100 1000)
#   e.g. nice -n -5 bench/client-ab.sh /tmp/99ff4b5/llmreplay target/release/llmreplay 5
# Env: GT_BIN (the ground-truth server's build, default NEW_BIN); C_BIN (a third build, "C");
# PLACE=split (default: client on CPU 0, server on the others, as on two machines) or shared;
# NO_PEER=1 skips vLLM's client.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { sed -n 2,22p "$0"; exit 2; }
A=$(realpath "$1") B=$(realpath "$2") ROUNDS=$3
shift 3
STREAMS=("$@")
[ ${#STREAMS[@]} -eq 0 ] && STREAMS=(100 1000)
GT_BIN=$(realpath "${GT_BIN:-$B}")
C=${C_BIN:+$(realpath "$C_BIN")}
PLACE=${PLACE:-split}
[ "$(nproc)" -ge 2 ] || PLACE=shared
OUT=$PWD/bench/out/client-ab-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
ulimit -n 65536 2>/dev/null || true
python3 -m pip install -q numpy pyarrow >/dev/null 2>&1 || true

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "nothing on $1" >&2; return 1; }
client_pin() { if [ "$PLACE" = split ]; then taskset -c 0 "$@"; else "$@"; fi; }
# A prefix, not a function: the server's own pid must be $! (a backgrounded function is a
# subshell, and killing that leaves the server running).
server_pin() { if [ "$PLACE" = split ]; then echo "taskset -c 1-$(( $(nproc) - 1 ))"; fi; }

PEERS=bench/.peers
VLLM=""
if [ -z "${NO_PEER:-}" ] && [ -x "$PEERS/venv073/bin/python" ] && [ -f "$PEERS/vllm073/benchmark_serving.py" ] \
  && [ -f "$PEERS/tok/qwen3/tokenizer.json" ]; then
  VLLM="$PWD/$PEERS/venv073/bin/python $PWD/$PEERS/vllm073/benchmark_serving.py"
fi

# Each build writes its own trace (same seed and shape): an older build may not read a newer
# trace's metadata.
for n in "${STREAMS[@]}"; do
  "$A" synth -o "$OUT/in-A-$n.parquet" --num-prompts "$n" --input-len 16 --output-len 100 --request-rate inf --seed 1 2>/dev/null
  "$B" synth -o "$OUT/in-B-$n.parquet" --num-prompts "$n" --input-len 16 --output-len 100 --request-rate inf --seed 1 2>/dev/null
  [ -z "$C" ] || "$C" synth -o "$OUT/in-C-$n.parquet" --num-prompts "$n" --input-len 16 --output-len 100 --request-rate inf --seed 1 2>/dev/null
done

one() { # one LABEL N ROUND
  local label=$1 n=$2 r=$3 d="$OUT/$1-$2-$3" port gpid
  mkdir -p "$d"
  port=$(free_port)
  # shellcheck disable=SC2046 # the prefix is empty or "taskset -c 1-N": split on purpose.
  $(server_pin) "$GT_BIN" sim --ground-truth --fixed-timing 50,10 --tokens-per-chunk 1 \
    --listen "127.0.0.1:$port" --chunk-log "$d/gt.jsonl" 2>/dev/null &
  gpid=$!
  wait_port "$port"
  case "$label" in
    A|B|C)
      local bin=$A; [ "$label" = B ] && bin=$B; [ "$label" = C ] && bin=$C
      client_pin "$bin" replay "$OUT/in-$label-$n.parquet" --target "gt=http://127.0.0.1:$port" \
        --max-concurrency "$n" --results "$d/r.parquet" --save-result "$d/r.json" -q > "$d/client.txt" 2>&1 \
        || echo "$label at $n streams, round $r: exit $? (see $d/client.txt)"
      ;;
    vllm)
      # shellcheck disable=SC2086 # $VLLM is a command line on purpose.
      ( cd "$d" && export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 && client_pin timeout 600 \
          $VLLM --backend openai --base-url "http://127.0.0.1:$port" --endpoint /v1/completions \
          --model ground-truth --tokenizer "$OLDPWD/$PEERS/tok/qwen3" --dataset-name random \
          --random-input-len 16 --random-output-len 100 --ignore-eos --num-prompts "$n" \
          --max-concurrency "$n" --request-rate inf --save-result --result-dir . \
          --result-filename r.json --disable-tqdm ) > "$d/client.txt" 2>&1 \
        || echo "vllm at $n streams, round $r failed: see $d/client.txt"
      ;;
  esac
  kill -TERM "$gpid"; wait "$gpid" || true
  echo "$label $n $r $d" >> "$OUT/runs.txt"
}

clients=(A B)
[ -n "$C" ] && clients+=(C)
[ -n "$VLLM" ] && clients+=(vllm)
echo "client A: $A"$'\n'"client B: $B"$'\n'"client C: ${C:-none}"$'\n'"server: $GT_BIN"$'\n'"vllm: ${VLLM:-not installed}"$'\n'"placement: $PLACE" > "$OUT/setup.txt"
for r in $(seq "$ROUNDS"); do
  for n in "${STREAMS[@]}"; do
    k=${#clients[@]}
    for i in $(seq 0 $(( k - 1 ))); do
      one "${clients[$(( (i + r) % k ))]}" "$n" "$r"
    done
  done
  echo "round $r of $ROUNDS done"
done
cat "$OUT/setup.txt"
python3 bench/client_ab.py "$OUT" | tee "$OUT/summary.txt"

#!/usr/bin/env bash
# A real engine against its simulation: llama.cpp's llama-server serving Gemma 3 270M on this
# machine's CPU (scripts/real-engine), and `llmreplay sim --profile gemma3-270m-cpu-2core`
# (sim/src/profile.rs), fitted to the first part below.
#
#   bench/real-engine.sh            # fit + compare; tables in bench/out/<time>/real-engine.md
#   bench/real-engine.sh fit        # the measurements the profile is fitted to
#   bench/real-engine.sh compare    # one trace replayed against both at 1, 2, 4, 8 concurrency
#
# Everything on 127.0.0.1 with bounded request counts (~10 min in all). Extra llama-server
# arguments: REAL_ENGINE_ARGS="-t 2" bench/real-engine.sh (the profile is for the defaults).
set -euo pipefail
cd "$(dirname "$0")/.."

parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(fit compare)
OUT=bench/out/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
cargo build --release --bin llmreplay 2>&1 | tail -1
BIN=target/release/llmreplay
bash scripts/fetch-tokenizers.sh > /dev/null
TOK=target/tokenizers/gemma3/tokenizer.json
scripts/real-engine setup > /dev/null
PID_FILE="$PWD/$OUT/llama-server.pid"
trap 'scripts/real-engine stop --pid-file "$PID_FILE"' EXIT
# shellcheck disable=SC2086 # REAL_ENGINE_ARGS is a list of words on purpose
URL="$(scripts/real-engine start --pid-file "$PID_FILE" -- ${REAL_ENGINE_ARGS:-})"
{
    echo "# Real engine vs gemma3-270m-cpu-2core, $(date -u +%FT%TZ)"
    echo
    echo "- machine: $(nproc) vCPU, load average at start $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "- llama-server: $(tr '\0' ' ' < "/proc/$(cat "$PID_FILE")/cmdline" | sed "s|$HOME|~|g")"
    echo
} > "$OUT/real-engine.md"

# replay TRACE NAME [ARGS...]: against the real server, exact prompt lengths for Gemma's tokenizer.
replay_real() {
    local trace=$1 name=$2
    shift 2
    "$BIN" replay "$OUT/$trace.parquet" --target "llama=$URL" --tokenizer "$TOK" \
        --request-rate inf --save-result "$OUT/$name.json" -q "$@" > "$OUT/$name.txt" 2>&1
}

fit() {
    # Prefill alone: one request at a time, one output token, so TTFT is the prompt's prefill.
    for n in 128 512 1024; do
        "$BIN" synth -o "$OUT/prefill-$n.parquet" --num-prompts 6 --input-len "$n" \
            --output-len 1 --seed "$n" > /dev/null 2>&1
        replay_real "prefill-$n" "fit-prefill-$n" --max-concurrency 1
    done
    # Decode: 32-token prompts, 64 tokens out, 1/2/4/8 streams at a time.
    "$BIN" synth -o "$OUT/decode.parquet" --num-prompts 16 --input-len 32 --output-len 64 \
        --seed 1 > /dev/null 2>&1
    replay_real decode fit-decode --sweep max-concurrency=1,2,4,8
    # Attention's KV reads: the same decode at a 1536-token context.
    "$BIN" synth -o "$OUT/kv.parquet" --num-prompts 4 --input-len 1536 --output-len 64 \
        --seed 2 > /dev/null 2>&1
    replay_real kv fit-kv --max-concurrency 1
    python3 bench/real_engine_table.py fit "$OUT" >> "$OUT/real-engine.md"
    echo "fit done"
}

compare() {
    # One trace: 32 requests, prompts 64-192 tokens, outputs 16-48 tokens, offered all at
    # once and capped by --max-concurrency (closed loop at each level).
    "$BIN" synth -o "$OUT/mixed.parquet" --num-prompts 32 --input-len 128 --output-len 32 \
        --range-ratio 0.5 --seed 7 > /dev/null 2>&1
    replay_real mixed cmp-real --sweep max-concurrency=1,2,4,8 --server-metrics
    "$BIN" replay "$OUT/mixed.parquet" --profile gemma3-270m-cpu-2core --request-rate inf \
        --sweep max-concurrency=1,2,4,8 --save-result "$OUT/cmp-sim.json" -q \
        > "$OUT/cmp-sim.txt" 2>&1
    python3 bench/real_engine_table.py compare "$OUT" >> "$OUT/real-engine.md"
    echo "compare done"
}

for p in "${parts[@]}"; do "$p"; done
cat "$OUT/real-engine.md"

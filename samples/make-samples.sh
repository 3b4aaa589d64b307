#!/usr/bin/env bash
# Regenerates the committed samples in samples/ with llmreplay itself.
# Run from the repository root:  bash samples/make-samples.sh
# The binary is $LLMREPLAY, else target/release/llmreplay (cargo build --release).
set -euo pipefail

LLMREPLAY="${LLMREPLAY:-target/release/llmreplay}"
if ! command -v "$LLMREPLAY" > /dev/null 2>&1; then
    echo "make-samples: $LLMREPLAY not found or not executable; run 'cargo build --release' or set LLMREPLAY" >&2
    exit 1
fi
if [[ ! -d samples ]]; then
    echo "make-samples: run from the repository root (no ./samples here)" >&2
    exit 1
fi

# 1. A synthetic trace: vLLM's random dataset (prompt 200±50%, output 40±50% tokens),
#    Poisson arrivals at 30 req/s, 80% of requests streamed.
"$LLMREPLAY" synth -o samples/synth-300.parquet \
    --num-prompts 300 --input-len 200 --output-len 40 --range-ratio 0.5 \
    --request-rate 30 --stream-ratio 0.8 --seed 7

# 2. Replay it against the in-process sim (no --target) with injected faults:
#    3% HTTP 500, 2% HTTP 429 (both outcome http_error), 2% of streams reset mid-stream
#    (outcome upstream_error). Per-request rows go to Parquet, the vLLM-style result to JSON.
"$LLMREPLAY" replay samples/synth-300.parquet \
    --profile llama-3.1-8b-h100 \
    --error-rate 0.03 --rate-limit-rate 0.02 --reset-rate 0.02 \
    --prompt-salt 1 --seed 7 --sim-seed 7 \
    --goodput ttft:200 tpot:20 \
    --results samples/sim-replay-300.parquet \
    --save-result samples/sim-replay-300.json --save-detailed \
    -q > /dev/null

# 3. Summaries (`llmreplay inspect --json`) of the replay results and of the synthetic trace.
"$LLMREPLAY" inspect samples/sim-replay-300.parquet --json > samples/sim-replay-300.inspect.json
"$LLMREPLAY" inspect samples/synth-300.parquet --json > samples/synth-300.inspect.json

ls -l samples/synth-300.parquet samples/synth-300.inspect.json samples/sim-replay-300.parquet \
    samples/sim-replay-300.json samples/sim-replay-300.inspect.json

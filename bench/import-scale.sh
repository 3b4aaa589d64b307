#!/usr/bin/env bash
# `llmreplay import` and `synth` at scale (issue 52): peak RSS and rows/s writing a trace of
# ROWS requests (default 16,000,000, the size of the SwissAI serving trace), new build beside
# an older one, in the same run.
#
#   bench/import-scale.sh [ROWS] [OLD_ROWS]
#   OLD=/path/to/old/llmreplay bench/import-scale.sh   # the comparison binary
#   DIR=/tmp/somewhere bench/import-scale.sh           # where the inputs go (reused)
#
# The inputs are synthetic rows in the Azure LLM inference CSV layout
# (`TIMESTAMP,ContextTokens,GeneratedTokens`, 7 fractional digits, ~1 req/ms) and, for
# `import --format swissai`, in the SwissAI serving trace's own layout (SWISSAI_ROWS rows,
# default ROWS: a JSON line per request with its id, status, ISO created_at/finished_at, model,
# model_parameters and reported token counts, a third of them -1 and 1 in 20 ERROR, as the
# published file's head is; no older build reads that format). The old build held every
# row before writing, so it is measured on OLD_ROWS rows (default 2,000,000; RSS grows with
# rows) and its bytes per row shown beside the new build's at ROWS.
set -euo pipefail
ROWS=${1:-16000000}
OLD_ROWS=${2:-2000000}
SWISSAI_ROWS=${SWISSAI_ROWS:-$ROWS}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NEW=${NEW:-$ROOT/target/release/llmreplay}
OLD=${OLD:-/tmp/llmreplay-before/llmreplay}
DIR=${DIR:-/tmp/llmreplay-import-scale}
mkdir -p "$DIR"
[ -x "$NEW" ] || (cd "$ROOT" && cargo build --release --bin llmreplay)

csv() { # csv N: the input of N rows
  local f="$DIR/azure-$1.csv"
  [ -s "$f" ] || python3 - "$1" "$f" <<'PY'
import sys, random
n, path = int(sys.argv[1]), sys.argv[2]
rng = random.Random(52)
with open(path, "w", buffering=1 << 22) as f:
    f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    us = 0
    lines = []
    for i in range(n):
        us += rng.randint(1, 2000)
        s, frac = divmod(us, 1_000_000)
        h, rem = divmod(s, 3600)
        m, sec = divmod(rem, 60)
        lines.append(f"2023-11-16 {h:02d}:{m:02d}:{sec:02d}.{frac:06d}0,"
                     f"{rng.randint(1, 8000)},{rng.randint(1, 800)}\n")
        if len(lines) == 100_000:
            f.writelines(lines)
            lines.clear()
    f.writelines(lines)
PY
  echo "$f"
}

swissai() { # swissai N: the input of N rows in the SwissAI trace's layout
  local f="$DIR/swissai-$1.jsonl"
  [ -s "$f" ] || python3 - "$1" "$f" <<'PY'
import sys, random
n, path = int(sys.argv[1]), sys.argv[2]
rng = random.Random(52)
models = ["Qwen/Qwen3-32B", "meta-llama/Llama-3.3-70B-Instruct", "swiss-ai/Apertus-70B"]
params = ('{"top_p": 1, "seed": 42, "max_tokens": null, "temperature": 0.7, '
          '"presence_penalty": 0, "frequency_penalty": 0}')
def iso(ms):  # 2025-08-21 plus ms (the bench spans under a day per 16 M rows at ~2 ms apart)
    d, ms = divmod(ms, 86_400_000)
    s, ms = divmod(ms, 1000)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"2025-08-{21 + d:02d}T{h:02d}:{m:02d}:{s:02d}.{ms:03d}Z"
with open(path, "w", buffering=1 << 22) as f:
    ms, lines = 0, []
    for i in range(n):
        ms += rng.randint(0, 4)
        end = ms + rng.randint(100, 60_000)
        known = rng.random() > 1 / 3
        tin, tout = (rng.randint(1, 8000), rng.randint(1, 800)) if known else (-1, -1)
        status = "ERROR" if rng.random() < 0.05 else "DEFAULT"
        lines.append(
            f'{{"id": "{rng.getrandbits(64):016x}:{rng.getrandbits(128):032x}:clypmz9si000g44hc5qr704rn", '
            f'"status": "{status}", "created_at": "{iso(ms)}", "finished_at": "{iso(end)}", '
            f'"model": "{models[i % 3]}", "model_parameters": {params}, '
            f'"reported_token_input": {tin}, "reported_token_output": {tout}}}\n')
        if len(lines) == 100_000:
            f.writelines(lines)
            lines.clear()
    f.writelines(lines)
PY
  echo "$f"
}

# measure LABEL ROWS COMMAND...: one table line
measure() {
  local label=$1 rows=$2; shift 2
  local t; t=$(mktemp)
  /usr/bin/time -f "%e %M" "$@" >/dev/null 2>"$t"
  read -r secs kb < <(tail -1 "$t")
  python3 - "$label" "$rows" "$secs" "$kb" <<'PY'
import sys
label, rows, secs, kb = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
print(f"| {label} | {rows:,} | {secs:.1f} | {rows/secs:,.0f} | {kb/1024:,.0f} | {kb*1024/rows:,.1f} |")
PY
  rm -f "$t"
}

big=$(csv "$ROWS")
small=$(csv "$OLD_ROWS")
out="$DIR/out.parquet"
echo "| build, command | rows | wall s | rows/s | peak RSS MB | RSS bytes per row |"
echo "|---|---|---|---|---|---|"
measure "new, import" "$ROWS" "$NEW" import --format azure "$big" -o "$out"
measure "new, import" "$OLD_ROWS" "$NEW" import --format azure "$small" -o "$out"
[ -x "$OLD" ] && measure "old, import" "$OLD_ROWS" "$OLD" import --format azure "$small" -o "$out"
swiss=$(swissai "$SWISSAI_ROWS")
measure "new, import swissai" "$SWISSAI_ROWS" "$NEW" import --format swissai "$swiss" -o "$out"
measure "new, synth" "$ROWS" "$NEW" synth -o "$out" --num-prompts "$ROWS" --request-rate 1000
measure "new, synth" "$OLD_ROWS" "$NEW" synth -o "$out" --num-prompts "$OLD_ROWS" --request-rate 1000
[ -x "$OLD" ] && measure "old, synth" "$OLD_ROWS" "$OLD" synth -o "$out" --num-prompts "$OLD_ROWS" --request-rate 1000
rm -f "$out"

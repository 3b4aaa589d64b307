#!/usr/bin/env bash
# `llmreplay import` and `synth` at scale (issue 52): peak RSS and rows/s writing a trace of
# ROWS requests (default 16,000,000, the size of the SwissAI serving trace), new build beside
# an older one, in the same run.
#
#   bench/import-scale.sh [ROWS] [OLD_ROWS]
#   OLD=/path/to/old/llmreplay bench/import-scale.sh   # the comparison binary
#   DIR=/tmp/somewhere bench/import-scale.sh           # where the inputs go (reused)
#
# The input is synthetic rows in the Azure LLM inference CSV layout
# (`TIMESTAMP,ContextTokens,GeneratedTokens`, 7 fractional digits, ~1 req/ms): the SwissAI
# trace's own column layout was not found in a public source reachable here, and a CSV of
# timestamps and lengths is what a production trace of that size is. The old build held every
# row before writing, so it is measured on OLD_ROWS rows (default 2,000,000; RSS grows with
# rows) and its bytes per row shown beside the new build's at ROWS.
set -euo pipefail
ROWS=${1:-16000000}
OLD_ROWS=${2:-2000000}
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
measure "new, synth" "$ROWS" "$NEW" synth -o "$out" --num-prompts "$ROWS" --request-rate 1000
measure "new, synth" "$OLD_ROWS" "$NEW" synth -o "$out" --num-prompts "$OLD_ROWS" --request-rate 1000
[ -x "$OLD" ] && measure "old, synth" "$OLD_ROWS" "$OLD" synth -o "$out" --num-prompts "$OLD_ROWS" --request-rate 1000
rm -f "$out"

#!/usr/bin/env bash
# `llmreplay inspect` at scale (issue 21): peak RSS and time over a synthetic trace of
# FILES × ROWS requests (default 5 × 2,000,000 = 10,000,000, written by `llmreplay synth`,
# overlapping in time so the stream merges them), beside an older binary on one file.
#
#   bench/inspect-scale.sh [FILES] [ROWS]
#   OLD=/path/to/old/llmreplay bench/inspect-scale.sh     # the comparison binary
#   DIR=/tmp/somewhere bench/inspect-scale.sh             # where the traces go (reused)
#
# The traces stay out of git, under $DIR (default /tmp/llmreplay-inspect-scale, ~160 MB).
set -euo pipefail
FILES=${1:-5}
ROWS=${2:-2000000}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NEW=${NEW:-$ROOT/target/release/llmreplay}
OLD=${OLD:-/work/golden/bin-before/llmreplay}
DIR=${DIR:-/tmp/llmreplay-inspect-scale}
mkdir -p "$DIR"
[ -x "$NEW" ] || (cd "$ROOT" && cargo build --release --bin llmreplay)

for i in $(seq 0 $((FILES - 1))); do
  f="$DIR/part-$ROWS-$i.parquet"
  [ -s "$f" ] || "$NEW" synth -o "$f" --num-prompts "$ROWS" --input-len 256 --output-len 64 \
    --range-ratio 0.5 --request-rate 1000 --seed "$i" >/dev/null 2>&1
done

# measure LABEL BINARY FILES...: one line "LABEL rows s MB bytes/row"
measure() {
  local label=$1 bin=$2; shift 2
  local t; t=$(mktemp)
  /usr/bin/time -f "%e %M" "$bin" inspect --json "$@" >"$t.json" 2>"$t"
  local rows; rows=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['rows'])" "$t.json")
  read -r secs kb < <(tail -1 "$t")
  python3 - "$label" "$rows" "$secs" "$kb" <<'PY'
import sys
label, rows, secs, kb = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
print(f"| {label} | {rows:,} | {secs:.2f} | {rows/secs:,.0f} | {kb/1024:,.0f} | {kb*1024/rows:,.1f} |")
PY
  rm -f "$t" "$t.json"
}

echo "| binary, input | rows | wall s | rows/s | peak RSS MB | RSS bytes per row |"
echo "|---|---|---|---|---|---|"
measure "new, 1 file" "$NEW" "$DIR/part-$ROWS-0.parquet"
[ -x "$OLD" ] && measure "old ($OLD), 1 file" "$OLD" "$DIR/part-$ROWS-0.parquet"
measure "new, $FILES files" "$NEW" "$DIR"/part-"$ROWS"-*.parquet

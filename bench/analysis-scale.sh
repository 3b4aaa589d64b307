#!/usr/bin/env bash
# `merge` and `report` at scale (issue 21): peak RSS and wall time of `llmreplay merge` over
# SHARDS result files of ROWS rows each (default 4 × 2,500,000 = 10,000,000) and of
# `llmreplay report --results` / `--trace` over them, beside an older binary (which reads its
# inputs whole) on one shard file.
#
#   bench/analysis-scale.sh [SHARDS] [ROWS]
#   OLD=/path/to/old/llmreplay bench/analysis-scale.sh    # the comparison binary
#   DIR=/tmp/somewhere bench/analysis-scale.sh            # where the files go (reused)
#
# The results files are a real sharded replay (`replay --shard K/N` against the in-process
# sim, 500 rows a shard) replicated with pyarrow to ROWS rows a shard: each copy gets its own
# request ids and is shifted by the replay's span, so every file is one shard run of one long
# trace. They stay out of git, under $DIR (default /tmp/llmreplay-analysis-scale, ~1.5 GB);
# the merge also writes its journal (JSON lines) beside its output while
# it runs (up to ~1 KB a row). Delete $DIR afterwards.
set -euo pipefail
SHARDS=${1:-4}
ROWS=${2:-2500000}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NEW=${NEW:-$ROOT/target/release/llmreplay}
OLD=${OLD:-/work/golden/bin-before/llmreplay}
DIR=${DIR:-/tmp/llmreplay-analysis-scale}
mkdir -p "$DIR"
[ -x "$NEW" ] || (cd "$ROOT" && cargo build --release --bin llmreplay)

SEED="$DIR/seed"
if [ ! -s "$SEED/r0.json" ]; then
  mkdir -p "$SEED"
  "$NEW" synth -o "$SEED/t.parquet" --num-prompts $((500 * SHARDS)) --input-len 64 \
    --output-len 16 --request-rate 400 >/dev/null 2>&1
  for k in $(seq 0 $((SHARDS - 1))); do
    "$NEW" replay "$SEED/t.parquet" --shard "$k/$SHARDS" --start-at +2s --fixed-timing 5,1 \
      --client-threads 1 --results "$SEED/r$k.parquet" --save-result "$SEED/r$k.json" -q \
      >/dev/null 2>&1 &
  done
  wait
fi

for k in $(seq 0 $((SHARDS - 1))); do
  f="$DIR/shard-$ROWS-$k.parquet"
  [ -s "$f" ] || python3 - "$SEED/r$k.parquet" "$f" "$ROWS" <<'PY'
import sys
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
src, dst, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
t = pq.read_table(src)
meta = pq.read_metadata(src).metadata
ts = pc.cast(t["arrival_time"], pa.int64())
span = (pc.max(ts).as_py() - pc.min(ts).as_py()) + 1_000_000
sched = t["scheduled_offset_us"]
sched_span = (pc.max(sched).as_py() or 0) + 1_000_000
schema = t.schema.with_metadata(meta)
with pq.ParquetWriter(dst, schema, compression="snappy") as w:
    done, copy, group = 0, 0, []
    while done < rows:
        n = min(t.num_rows, rows - done)
        c = t.slice(0, n)
        cols = {name: c[name] for name in c.column_names}
        cols["request_id"] = pc.binary_join_element_wise(c["request_id"], pa.scalar(f"-c{copy}"), "")
        cols["arrival_time"] = pc.cast(pc.add(pc.cast(c["arrival_time"], pa.int64()), copy * span), c.schema.field("arrival_time").type)
        cols["scheduled_offset_us"] = pc.add(c["scheduled_offset_us"], copy * span)
        group.append(pa.table(cols, schema=schema))
        done += n
        copy += 1
        # Row groups of 64 Ki rows, as llmreplay writes them.
        if sum(g.num_rows for g in group) >= 65_536 or done >= rows:
            w.write_table(pa.concat_tables(group), row_group_size=65_536)
            group = []
PY
done
FILES=("$DIR"/shard-"$ROWS"-*.parquet)

# run LABEL ROWS BINARY ARGS...: one table line "LABEL | rows | wall s | CPU s | rows per CPU
# s | MB | bytes/row" (CPU: user + system, steadier than wall time on a shared machine, where
# the fsyncs of the output wait on the disk)
run() {
  local label=$1 rows=$2 bin=$3; shift 3
  local t; t=$(mktemp)
  if ! /usr/bin/time -f "%e %U %S %M" "$bin" "$@" >/dev/null 2>"$t"; then
    echo "| $label | failed: $(tail -3 "$t" | tr '\n' ' ') |"; rm -f "$t"; return
  fi
  read -r secs user sys kb < <(tail -1 "$t")
  python3 -c "import sys; l,r,s,u,y,k=sys.argv[1],int(sys.argv[2]),*map(float,sys.argv[3:6]),int(sys.argv[6]); c=u+y; print(f'| {l} | {r:,} | {s:.1f} | {c:.1f} | {r/c:,.0f} | {k/1024:,.0f} | {k*1024/r:,.1f} |')" \
    "$label" "$rows" "$secs" "$user" "$sys" "$kb"
  rm -f "$t"
}

echo "load: $(uptime)"
echo "| command, binary, input | rows | wall s | CPU s | rows per CPU s | peak RSS MB | RSS bytes per row |"
echo "|---|---|---|---|---|---|---|"
run "merge, new, 1 shard" "$ROWS" "$NEW" merge "${FILES[0]}" -o "$DIR/m1"
[ -x "$OLD" ] && run "merge, old, 1 shard" "$ROWS" "$OLD" merge "${FILES[0]}" -o "$DIR/m1-old"
run "merge, new, $SHARDS shards" $((ROWS * SHARDS)) "$NEW" merge "${FILES[@]}" -o "$DIR/merged"
rm -f "$DIR"/m1*.parquet "$DIR"/m1*.json
REP=(report "$SEED/r0.json" -o "$DIR/report.html")
run "report --results, new, 1 shard" "$ROWS" "$NEW" "${REP[@]}" --results "${FILES[0]}"
[ -x "$OLD" ] && run "report --results, old, 1 shard" "$ROWS" "$OLD" "${REP[@]}" --results "${FILES[0]}"
run "report --results, new, $SHARDS shards" $((ROWS * SHARDS)) "$NEW" "${REP[@]}" --results "${FILES[@]}"
run "report --trace, new, merged" $((ROWS * SHARDS)) "$NEW" "${REP[@]}" --trace "$DIR/merged.parquet"
[ -x "$OLD" ] && run "report --trace, old, 1 shard" "$ROWS" "$OLD" "${REP[@]}" --trace "${FILES[0]}"
run "report --trace, new, 1 shard" "$ROWS" "$NEW" "${REP[@]}" --trace "${FILES[0]}"
echo "load: $(uptime)"

#!/usr/bin/env bash
# Golden outputs of every command, for a before/after check of a behaviour-preserving change.
#   bash scripts/golden.sh OLD_BINARY /tmp/before; bash scripts/golden.sh NEW_BINARY /tmp/after
#   diff -r /tmp/before /tmp/after
# Deterministic commands (synth, import, export, inspect, compare, report, plan) are compared
# exactly (wall-clock stamps masked); runs against the in-process sim (replay, sweep, num-runs,
# shards + merge) are compared by keys, counts, tokens, outcomes and console line shapes, with
# timing numbers masked (normalize.py).
set -uo pipefail
BIN=$(readlink -f "$1"); OUT=$(mkdir -p "$2" && readlink -f "$2")
G=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
ROOT=$(cd "$G/.." && pwd)
N="python3 $G/golden-normalize.py"
SHARED=${LLMREPLAY_SHARED_DATA:-$ROOT/../shared/data}
SAMPLES=$ROOT/samples
W=/tmp/golden-work-$$; rm -rf "$W"; mkdir -p "$W"; cd "$W"
rm -rf "$OUT"/*
run() {  # name kind cmd... : stdout+stderr and exit code, normalised by kind
    local name=$1 kind=$2; shift 2
    "$@" > "$W/$name.out" 2> "$W/$name.err"; echo "exit $?" > "$OUT/$name.exit"
    $N "text-$kind" "$W/$name.out" > "$OUT/$name.stdout"
    $N "text-$kind" "$W/$name.err" | grep -v "^\s*$" > "$OUT/$name.stderr"
}
file() {  # kind path -> normalised copy
    local kind=$1 p=$2 base; base=$(basename "$p")
    if [[ -f "$p" ]]; then $N "$kind" "$p" > "$OUT/file.$base.txt" 2>&1; else echo "missing" > "$OUT/file.$base.txt"; fi
}

# --- fixtures for the importers without a shared sample
printf 'Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,472,18,490,Conversation log\n45,ChatGPT,1087,0,1087,Conversation log\n118.5,GPT-4,417,276,693,API log\n' > BurstGPT_1.csv
printf '%s\n' '{"chat_id": 10, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 40, "output_length": 5, "type": "text", "turn": 1, "hash_ids": [1, 2, 3]}' '{"chat_id": 12, "parent_chat_id": 10, "timestamp": 3.000001, "input_length": 60, "output_length": 7, "type": "text", "turn": 2, "hash_ids": [1, 2, 3, 4]}' '{"chat_id": 13, "parent_chat_id": 12, "timestamp": 4, "input_length": 90, "output_length": 1, "type": "text", "turn": 3, "hash_ids": [1, 2, 3, 4, 5, 6]}' > qwen.jsonl
cat > sg.json <<'J'
[{"id": "a", "conversations": [{"from": "human", "value": "hello world"}, {"from": "gpt", "value": "hi there, friend"}]},
 {"id": "b", "conversations": [{"from": "human", "value": "only a question"}]},
 {"id": "c", "conversations": [{"from": "human", "value": "one two three four"}, {"from": "gpt", "value": "five"}, {"from": "human", "value": "six"}]}]
J

# --- help of every command (flags unchanged)
run help exact "$BIN" --help
for c in capture import export sim replay synth inspect demo compare report merge; do
    run "help-$c" exact "$BIN" "$c" --help
done

# --- deterministic commands
run synth exact "$BIN" synth -o synth.parquet --num-prompts 300 --input-len 200 --output-len 40 --range-ratio 0.5 --request-rate 30 --stream-ratio 0.8 --seed 7
file parquet-exact synth.parquet
run synth-burst exact "$BIN" synth -o synth-burst.parquet --num-prompts 50 --burstiness 0.5 --request-rate 10 --endpoint chat --seed 3
file parquet-exact synth-burst.parquet
run import-azure exact "$BIN" import "$SHARED/AzureLLMInferenceTrace_code.csv" -o azure.parquet --head 300
file parquet-exact azure.parquet
run import-mooncake exact "$BIN" import "$SHARED/mooncake_synthetic_trace.jsonl" -o mooncake.parquet --head 300
file parquet-exact mooncake.parquet
run import-burstgpt exact "$BIN" import BurstGPT_1.csv -o burstgpt.parquet
file parquet-exact burstgpt.parquet
run import-qwen exact "$BIN" import qwen.jsonl --format qwen -o qwen.parquet
file parquet-exact qwen.parquet
run import-sharegpt exact "$BIN" import sg.json --tokenizer cl100k_base --request-rate 10 --seed 3 -o sharegpt.parquet
file parquet-exact sharegpt.parquet
run import-bad exact "$BIN" import sg.json --format azure -o bad.parquet
run export exact "$BIN" export mooncake.parquet -o mooncake.jsonl --format mooncake
file json-exact mooncake.jsonl
for t in synth azure mooncake burstgpt qwen sharegpt; do
    run "inspect-$t" exact "$BIN" inspect "$t.parquet"
    run "inspect-$t-json" exact "$BIN" inspect "$t.parquet" --json
done
run inspect-samples exact "$BIN" inspect "$SAMPLES/sim-replay-300.parquet" --json
python3 - "$SAMPLES/sim-replay-300.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["label"] = "candidate"
for k in list(d):
    if k.endswith("_ttft_ms") or k.endswith("_e2el_ms"):
        if isinstance(d[k], (int, float)): d[k] = d[k] * 1.3
open("candidate.json", "w").write(json.dumps(d))
PY
run compare-samples exact "$BIN" compare "$SAMPLES/sim-replay-300.json" candidate.json --json compare.json
file json-exact compare.json
run report-md exact "$BIN" report "$SAMPLES/sim-replay-300.json" -o report.md --results "$SAMPLES/sim-replay-300.parquet" --trace "$SAMPLES/synth-300.parquet" --title Golden
file text-exact report.md
run report-html exact "$BIN" report "$SAMPLES/sim-replay-300.json" -o report.html --title Golden
file text-exact report.html

# --- runs against the in-process sim (timings masked)
run replay run "$BIN" replay synth.parquet --profile llama-3.1-8b-h100 --prompt-salt 1 --seed 7 --sim-seed 7 --goodput ttft:200 tpot:20 --speedup 4 --max-concurrency 64 --results replay.parquet --save-result replay.json --save-detailed --metadata team=golden
file json-run replay.json
file parquet-run replay.parquet
run replay-faults run "$BIN" replay synth-burst.parquet --fixed-timing 2,1 --output-len 20 --max-concurrency 1 --error-rate 0.1 --rate-limit-rate 0.05 --reset-rate 0.05 --sim-seed 5 --prompt-salt 5 --results faults.parquet --save-result faults.json --save-detailed
file json-run faults.json
python3 -c "import pyarrow.parquet as pq, collections; t=pq.read_table('faults.parquet'); print(sorted(collections.Counter(zip(t['outcome'].to_pylist(), t['status'].to_pylist())).items(), key=str))" > "$OUT/faults.outcomes" 2>&1
run replay-chat run "$BIN" replay synth-burst.parquet --fixed-timing 20,2 --max-concurrency 4 --percentile-metrics ttft,e2el --metric-percentiles 50,90 --prompt-salt 2 --save-result chat.json --label chat
file json-run chat.json
run shard1 run "$BIN" replay synth.parquet --fixed-timing 10,1 --speedup 6 --shard 0/2 --seed 1 --prompt-salt 1 --results shard1.parquet
run shard2 run "$BIN" replay synth.parquet --fixed-timing 10,1 --speedup 6 --shard 1/2 --seed 1 --prompt-salt 1 --results shard2.parquet
run merge run "$BIN" merge shard1.parquet shard2.parquet -o merged --goodput ttft:200
for f in merged*; do file json-run "$f" 2>/dev/null; done
ls merged* > "$OUT/merge.files" 2>&1
run sweep run "$BIN" replay synth.parquet --fixed-timing 10,1 --sweep rate=20,40 --level-duration 2s --prompt-salt 3 --save-result sweep.json --results sweep-results
file json-run sweep.json
ls sweep-results > "$OUT/sweep.files" 2>&1
run numruns run "$BIN" replay synth-burst.parquet --fixed-timing 10,1 --num-runs 2 --prompt-salt 4 --save-result runs.json
file json-run runs.json
run compare-runs run "$BIN" compare replay.json chat.json
run report-runs run "$BIN" report sweep.json -o sweep-report.md --target-qps 100
file text-run sweep-report.md
rm -rf "$W"
echo "golden: $(ls "$OUT" | wc -l) files in $OUT"

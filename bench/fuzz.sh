#!/usr/bin/env bash
# The long fuzz run of every reader of untrusted bytes: the harnesses `cargo test` runs with a
# few hundred cases each in CI, here with LLMREPLAY_FUZZ_CASES cases per property (proptest,
# on stable) and the Parquet mutation sweep with several seeds. Runs niced; stops by itself.
#
#   wire          tests/fuzz_framing.rs   response framing, chunked decoder
#   wire          tests/fuzz_sse.rs       SSE parser, response classifiers
#   proxy         tests/fuzz_jsonscan.rs  JSON member scanner
#   proxy         tests/observer_props.rs SSE observer (usage stripping)
#   proxy         src/http1.rs (lib)      lean HTTP/1.1 head parser, differentially against hyper
#   import        tests/fuzz_import.rs    importers
#   trace-format  tests/fuzz_inputs.rs    journal recovery, redactor
#   trace-format  tests/fuzz_parquet.rs   Parquet reader on damaged data pages
#
# usage: bench/fuzz.sh [framing] [sse] [jsonscan] [observer] [lean] [import] [inputs] [parquet]
#        (default: all)
#        defaults: LLMREPLAY_FUZZ_CASES=20000, LLMREPLAY_FUZZ_SEEDS=4 (Parquet sweeps, each
#        LLMREPLAY_FUZZ_CASES damaged files per writer setting, five settings)
#        e.g. LLMREPLAY_FUZZ_CASES=100000 LLMREPLAY_FUZZ_SEEDS=10 bench/fuzz.sh parquet
# A failing proptest case is written to the test's proptest-regressions file (commit it); a
# Parquet input that panics is saved under target/fuzz-crashes/parquet/ (copy it into
# trace-format/tests/fuzz-regressions/parquet/).
set -euo pipefail
cd "$(dirname "$0")/.."
export LLMREPLAY_FUZZ_CASES=${LLMREPLAY_FUZZ_CASES:-20000}
SEEDS=${LLMREPLAY_FUZZ_SEEDS:-4}
export LLMREPLAY_FUZZ_SAVE=$PWD/target/fuzz-crashes/parquet
nice -n 10 cargo test --release -p wire -p proxy -p import -p trace-format --no-run 2>&1 | tail -1

run() { # package test [env...]   (test: an integration test's name, or lib:FILTER)
    local pkg=$1 test=$2 t0=$SECONDS
    shift 2
    local what=(--test "$test") log="target/fuzz-$test.log"
    if [[ $test == lib:* ]]; then
        what=(--lib "${test#lib:}")
        log="target/fuzz-$pkg-lib.log"
    fi
    if ! env "$@" nice -n 10 cargo test --release -q -p "$pkg" "${what[@]}" -- --nocapture \
        >"$log" 2>&1; then
        echo "FAILED: $pkg $test ($*), see $log"
        grep -E "minimal failing input|panicked|fuzz:" "$log" | head -20
        exit 1
    fi
    grep -h "fuzz:" "$log" || true
    local props
    props=$(grep -oE "ok\. [0-9]+ passed" "$log" | awk '{ n += $2 } END { print n + 0 }')
    echo "$pkg $test $*: ok, $props tests, $LLMREPLAY_FUZZ_CASES cases per property, $((SECONDS - t0)) s"
}
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(framing sse jsonscan observer lean import inputs parquet)
for part in "${parts[@]}"; do
    case $part in
        framing) run wire fuzz_framing ;;
        sse) run wire fuzz_sse ;;
        jsonscan) run proxy fuzz_jsonscan ;;
        observer) run proxy observer_props ;;
        lean) run proxy lib:http1::tests::differential ;;
        import) run import fuzz_import ;;
        inputs) run trace-format fuzz_inputs ;;
        parquet) for seed in $(seq 1 "$SEEDS"); do
            run trace-format fuzz_parquet LLMREPLAY_FUZZ_SEED="$seed"
        done ;;
        *) echo "unknown part $part (framing sse jsonscan observer lean import inputs parquet)" >&2; exit 2 ;;
    esac
done

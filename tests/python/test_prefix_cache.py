"""`llmreplay inspect`'s theoretical prefix-cache hit rate, checked against an independent
computation in Python over Mooncake's published synthetic trace (../shared/data) and over a
small trace worked by hand.

The rule (trace-format/src/prefix_cache.rs): requests in arrival order; a request's cached
prefix is its leading run of block hashes already in the cache (the first miss ends it);
hit tokens are min(blocks hit x block size, prompt tokens); afterwards all its blocks are in the
cache, most recently used; an LRU cache of N blocks evicts the least recently used.
"""

import json
import subprocess
from collections import OrderedDict
from pathlib import Path

import pytest

from conftest import ROOT, llmreplay_binary

MOONCAKE = ROOT.parent / "shared" / "data" / "mooncake_synthetic_trace.jsonl"


def run(*args):
    p = subprocess.run([str(llmreplay_binary()), *map(str, args)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout


def python_hit_rate(rows, block_size, capacity=None):
    """rows: (arrival, hash ids, prompt tokens), any order. Returns (hit tokens, total)."""
    cache = OrderedDict()
    hit = total = 0
    for _, hashes, tokens in sorted(rows, key=lambda r: r[0]):
        n = 0
        for h in hashes:
            if h not in cache:
                break
            n += 1
        hit += min(n * block_size, tokens)
        total += tokens
        for h in hashes:
            cache[h] = True
            cache.move_to_end(h)
        while capacity is not None and len(cache) > capacity:
            cache.popitem(last=False)
    return hit, total


@pytest.fixture(scope="module")
def mooncake(tmp_path_factory):
    if not MOONCAKE.exists():
        pytest.skip(f"{MOONCAKE} not present")
    out = tmp_path_factory.mktemp("pc") / "mooncake.parquet"
    run("import", MOONCAKE, "-o", out)
    return out


def test_mooncake_unbounded_hit_rate_matches_python(mooncake):
    s = json.loads(run("inspect", mooncake, "--json"))
    pc = s["prefix_cache"]
    rows = []
    with open(MOONCAKE, encoding="utf-8", newline="") as f:
        for line in f:
            r = json.loads(line)
            rows.append((r["timestamp"], r["hash_ids"], r["input_length"]))
    hit, total = python_hit_rate(rows, 512)
    assert pc["block_size"] == 512
    assert pc["rows_with_hashes"] == len(rows)
    assert pc["prompt_tokens"] == total
    unbounded = pc["caches"][0]
    assert unbounded["cache_blocks"] is None
    assert unbounded["hit_tokens"] == hit
    assert abs(unbounded["token_hit_rate"] - hit / total) < 1e-12
    # The published synthetic trace is highly cacheable: about two thirds of its prompt tokens.
    assert 0.6 < unbounded["token_hit_rate"] < 0.7


def test_inspect_prints_the_hit_rate(mooncake):
    text = run("inspect", mooncake)
    assert "prefix cache" in text
    assert "unbounded: 65.1% of prompt tokens" in text


def test_a_trace_without_hashes_has_no_prefix_cache_entry():
    s = json.loads(run("inspect", ROOT / "samples" / "synth-300.parquet", "--json"))
    assert "prefix_cache" not in s


def test_mooncake_lru_hit_rates_match_python(mooncake):
    s = json.loads(run("inspect", mooncake, "--json", "--cache-blocks", "1000,10000"))
    caches = s["prefix_cache"]["caches"]
    assert [c["cache_blocks"] for c in caches] == [None, 1000, 10000]
    rows = []
    with open(MOONCAKE, encoding="utf-8", newline="") as f:
        for line in f:
            r = json.loads(line)
            rows.append((r["timestamp"], r["hash_ids"], r["input_length"]))
    for c in caches[1:]:
        hit, total = python_hit_rate(rows, 512, c["cache_blocks"])
        assert c["hit_tokens"] == hit, c
    # A smaller cache serves less.
    assert caches[1]["hit_tokens"] < caches[2]["hit_tokens"] <= caches[0]["hit_tokens"]

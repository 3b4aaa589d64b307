"""Markdown tables for bench/real-engine.sh from llmreplay's --save-result JSON files.

usage: python3 bench/real_engine_table.py fit|compare OUT_DIR
"""

import json
import pathlib
import sys


def runs(path):
    """The run results of a --save-result file: a list for a sweep, else the one result."""
    d = json.loads(pathlib.Path(path).read_text())
    return d["results"] if "results" in d else [d]


def ms(v):
    return "-" if v is None else f"{v:.1f}"


def fit(out):
    print("## Fit: the measurements behind gemma3-270m-cpu-2core\n")
    print("| workload | concurrency | TTFT p50 (ms) | TPOT p50 (ms) | TPOT p99 (ms) |")
    print("|---|---|---|---|---|")
    for n in (128, 512, 1024):
        for r in runs(out / f"fit-prefill-{n}.json"):
            row = (f"prefill {n} tokens, 1 out", 1, r["p50_ttft_ms"], None, None)
            print("| {} | {} | {} | {} | {} |".format(*row[:2], *map(ms, row[2:])))
    for r in runs(out / "fit-decode.json"):
        row = ("decode 32 in, 64 out", r["max_concurrency"], r["p50_ttft_ms"],
               r["p50_tpot_ms"], r["p99_tpot_ms"])
        print("| {} | {} | {} | {} | {} |".format(*row[:2], *map(ms, row[2:])))
    for r in runs(out / "fit-kv.json"):
        row = ("decode 1536 in, 64 out", 1, r["p50_ttft_ms"], r["p50_tpot_ms"], r["p99_tpot_ms"])
        print("| {} | {} | {} | {} | {} |".format(*row[:2], *map(ms, row[2:])))
    print()


def compare(out):
    real = {r["max_concurrency"]: r for r in runs(out / "cmp-real.json")}
    sim = {r["max_concurrency"]: r for r in runs(out / "cmp-sim.json")}
    print("## One trace, real llama-server vs the sim profile\n")
    print("32 requests, prompts 64-192 tokens, outputs 16-48 (synth --range-ratio 0.5), all "
          "offered at t=0 and capped by --max-concurrency.\n")
    print("| concurrency | target | req/s | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) "
          "| TPOT p99 (ms) |")
    print("|---|---|---|---|---|---|---|")
    for c in sorted(set(real) | set(sim)):
        for name, src in (("llama-server", real), ("sim", sim)):
            r = src.get(c)
            if r is None:
                continue
            print(f"| {c} | {name} | {r['request_throughput']:.2f} | {ms(r['p50_ttft_ms'])} "
                  f"| {ms(r['p99_ttft_ms'])} | {ms(r['p50_tpot_ms'])} | {ms(r['p99_tpot_ms'])} |")
    gauges = {}
    for c, r in sorted(real.items()):
        for k, g in (r.get("llmreplay", {}).get("server_gauges") or {}).items():
            gauges.setdefault(k, []).append(f"{c}: {g['mean']:.2f} / {g['max']:.0f}")
    if gauges:
        print("\nllama-server's own gauges (--server-metrics), mean / max at each concurrency:\n")
        for k, v in gauges.items():
            print(f"- `{k}`: " + ", ".join(v))
    print()


if __name__ == "__main__":
    part, out = sys.argv[1], pathlib.Path(sys.argv[2])
    {"fit": fit, "compare": compare}[part](out)

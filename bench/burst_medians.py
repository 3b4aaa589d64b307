#!/usr/bin/env python3
"""Medians over the rounds of `bench/run.sh burst` (its burst.jsonl): per size and path,
TTFT p50 / p99, added TTFT p50 / p99 (per request, the client's TTFT minus the server's own
logged one) and proxy CPU per request, listen overflows and rows over all rounds, and in how
many rounds capture's p99 (TTFT, and added TTFT) was no worse than nginx's of the same round.

A round's p99 moves by a factor of two between rounds of one path on this machine (the
client, the server and the proxy share two cores), so two more lines per pair compare all
rounds at once: the added TTFT of every request of every round pooled (its p50 / p99, what
a client sees over many bursts), and how likely a difference of the rounds' mean added p99
at least as large as the one seen would be if the two paths were the same (a one-sided
permutation test over the rounds' labels, 20,000 draws).
usage: bench/burst_medians.py BURST_JSONL"""
import json
import os
import random
import statistics
import sys

import numpy as np

from accuracy import added_ttft_ms


def med(rs, key):
    """The median of `key` over the rounds that have it (older runs have no added TTFT)."""
    xs = [r[key] for r in rs if r.get(key) is not None]
    return statistics.median(xs) if xs else float("nan")


def pooled(run, n, path, rounds):
    """Every request's added TTFT over `rounds` of `path` at `n` (None when a round's files
    are missing)."""
    xs = []
    for k in rounds:
        tag = f"{run}/burst-{n}-{path}-r{k}"
        try:
            xs += added_ttft_ms(f"{tag}-results.parquet", f"{tag}-gt.jsonl")
        except OSError:
            return None
    return xs


def permutation_p(a, b, draws=20000, seed=1):
    """One-sided: the share of relabellings of `a` + `b` whose mean(a) - mean(b) is at
    least the one observed."""
    seen = statistics.mean(a) - statistics.mean(b)
    both, rng, hits = a + b, random.Random(seed), 0
    for _ in range(draws):
        rng.shuffle(both)
        hits += statistics.mean(both[:len(a)]) - statistics.mean(both[len(a):]) >= seen - 1e-9
    return hits / draws


def main():
    runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    by = {}
    for r in runs:
        by.setdefault((r["n"], r["path"]), []).append(r)
    print("    N path      rounds  TTFT p50 (median)  p99 (median)  added p50  added p99"
          "  CPU us/req  overflows  ok / sent  rows")
    for (n, path), rs in sorted(by.items()):
        cpu = [r["cpu_us_per_req"] for r in rs if r["cpu_us_per_req"] is not None]
        print(f"{n:>5} {path:<9} {len(rs):>6}  {statistics.median(r['p50'] for r in rs):17.1f}"
              f"  {statistics.median(r['p99'] for r in rs):12.1f}"
              f"  {med(rs, 'added_p50'):9.1f}  {med(rs, 'added_p99'):9.1f}"
              f"  {statistics.median(cpu) if cpu else float('nan'):10.0f}"
              f"  {sum(r['overflows'] for r in rs):9}"
              f"  {sum(r['ok'] for r in rs)} / {sum(r['sent'] for r in rs)}"
              f"  {','.join(str(r['rows']) for r in rs)}")
    # capture (one serving thread per core) against nginx's one worker, the criterion of
    # issue 17; and, when the run has them, the like-for-like pairs of thread counts.
    pairs = (("capture", "nginx"), ("capture1", "nginx"), ("capture", "nginx2"))
    for key, what in (("p99", "TTFT p99"), ("added_p99", "added TTFT p99")):
        for a, b in pairs:
            for n in sorted({n for n, _ in by}):
                cap = {r["round"]: r[key] for r in by.get((n, a), []) if r.get(key) is not None}
                ng = {r["round"]: r[key] for r in by.get((n, b), []) if r.get(key) is not None}
                both = sorted(set(cap) & set(ng))
                if both:
                    wins = sum(cap[k] <= ng[k] for k in both)
                    print(f"{n:>5}: {a}'s {what} no worse than {b}'s in {wins} of {len(both)} rounds "
                          f"({a} {', '.join(f'{cap[k]:.1f}' for k in both)}; "
                          f"{b} {', '.join(f'{ng[k]:.1f}' for k in both)} ms)")
                    if key != "added_p99" or len(both) < 2:
                        continue
                    run = os.path.dirname(sys.argv[1]) or "."
                    pa, pb = pooled(run, n, a, both), pooled(run, n, b, both)
                    if pa and pb:
                        print(f"{n:>5}: added TTFT of all {len(both)} rounds' requests pooled, p50 / p99: "
                              f"{a} {np.percentile(pa, 50):.1f} / {np.percentile(pa, 99):.1f}, "
                              f"{b} {np.percentile(pb, 50):.1f} / {np.percentile(pb, 99):.1f} ms")
                    p = permutation_p([cap[k] for k in both], [ng[k] for k in both])
                    print(f"{n:>5}: {a}'s rounds' mean added p99 over {b}'s: "
                          f"{statistics.mean(cap[k] for k in both) - statistics.mean(ng[k] for k in both):+.1f} ms, "
                          f"one-sided permutation p = {p:.2f}")


if __name__ == "__main__":
    main()

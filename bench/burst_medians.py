#!/usr/bin/env python3
"""Medians over the rounds of `bench/run.sh burst` (its burst.jsonl): per size and path,
TTFT p50 / p99 and proxy CPU per request, listen overflows and rows over all rounds, and in
how many rounds capture's p99 was no worse than nginx's of the same round.
usage: bench/burst_medians.py BURST_JSONL"""
import json
import statistics
import sys


def main():
    runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    by = {}
    for r in runs:
        by.setdefault((r["n"], r["path"]), []).append(r)
    print("    N path      rounds  TTFT p50 (median)  p99 (median)  CPU us/req  overflows  ok / sent  rows")
    for (n, path), rs in sorted(by.items()):
        cpu = [r["cpu_us_per_req"] for r in rs if r["cpu_us_per_req"] is not None]
        print(f"{n:>5} {path:<9} {len(rs):>6}  {statistics.median(r['p50'] for r in rs):17.1f}"
              f"  {statistics.median(r['p99'] for r in rs):12.1f}"
              f"  {statistics.median(cpu) if cpu else float('nan'):10.0f}"
              f"  {sum(r['overflows'] for r in rs):9}"
              f"  {sum(r['ok'] for r in rs)} / {sum(r['sent'] for r in rs)}"
              f"  {','.join(str(r['rows']) for r in rs)}")
    for n in sorted({n for n, _ in by}):
        cap = {r["round"]: r["p99"] for r in by.get((n, "capture"), [])}
        ng = {r["round"]: r["p99"] for r in by.get((n, "nginx"), [])}
        both = sorted(set(cap) & set(ng))
        if both:
            wins = sum(cap[k] <= ng[k] for k in both)
            print(f"{n:>5}: capture's p99 no worse than nginx's in {wins} of {len(both)} rounds "
                  f"(capture {', '.join(f'{cap[k]:.1f}' for k in both)}; nginx {', '.join(f'{ng[k]:.1f}' for k in both)} ms)")


if __name__ == "__main__":
    main()

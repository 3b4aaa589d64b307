#!/usr/bin/env python3
"""Medians over the rounds of `bench/run.sh burst` (its burst.jsonl): per size and path,
TTFT p50 / p99, added TTFT p50 / p99 (per request, the client's TTFT minus the server's own
logged one) and proxy CPU per request, listen overflows and rows over all rounds, and in how
many rounds capture's p99 (TTFT, and added TTFT) was no worse than nginx's of the same round.
usage: bench/burst_medians.py BURST_JSONL"""
import json
import statistics
import sys


def med(rs, key):
    """The median of `key` over the rounds that have it (older runs have no added TTFT)."""
    xs = [r[key] for r in rs if r.get(key) is not None]
    return statistics.median(xs) if xs else float("nan")


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


if __name__ == "__main__":
    main()

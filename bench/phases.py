#!/usr/bin/env python3
"""Summarise capture's phase log (`llmreplay capture --phase-log FILE`): for each gap between
two stamps of a request, its p50 / p90 / p99 / max in ms, and how far the burst's accepts and
head reads are spread. usage: bench/phases.py FILE [--json]"""
import json
import sys

PHASES = [  # (label, from, to)
    ("accept -> head read", "accepted_us", "head_us"),
    ("head read -> upstream conn in hand", "head_us", "leased_us"),
    ("conn in hand -> request written", "leased_us", "written_us"),
    ("written -> upstream response head", "written_us", "response_head_us"),
    ("response head -> first byte out", "response_head_us", "first_byte_us"),
    ("accept -> first byte out", "accepted_us", "first_byte_us"),
]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def summary(rows):
    out = {"requests": len(rows), "new_connections": sum(r["accepted_us"] is not None for r in rows),
           "reused_upstream": sum(bool(r["reused"]) for r in rows), "gaps_ms": {}}
    for label, a, b in PHASES:
        d = [(r[b] - r[a]) / 1000 for r in rows if r.get(a) is not None and r.get(b) is not None]
        if d:
            out["gaps_ms"][label] = {q: round(pct(d, v), 2) for q, v in
                                     (("p50", .5), ("p90", .9), ("p99", .99), ("max", 1.0))}
    # Builds with the thread field: how the burst's connections fell to the serving threads.
    per = {}
    for r in rows:
        if r["accepted_us"] is not None and "thread" in r:
            per[r["thread"]] = per.get(r["thread"], 0) + 1
    if per:
        out["connections_per_thread"] = [per[t] for t in sorted(per)]
    for k in ("accepted_us", "head_us", "written_us"):
        ts = [r[k] for r in rows if r.get(k) is not None]
        if ts:
            out[f"spread_{k[:-3]}_ms"] = round((max(ts) - min(ts)) / 1000, 2)
    return out


def main():
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    rows = [r for r in rows if "head_us" in r]
    s = summary(rows)
    if "--json" in sys.argv:
        print(json.dumps(s))
        return
    print(f"{s['requests']} requests, {s['new_connections']} on new connections, "
          f"{s['reused_upstream']} on pooled upstream connections; spread of accepts "
          f"{s.get('spread_accepted_ms', '-')} ms, of head reads {s.get('spread_head_ms', '-')} ms, "
          f"of upstream writes {s.get('spread_written_ms', '-')} ms")
    if "connections_per_thread" in s:
        print("  new connections per serving thread: " + ", ".join(map(str, s["connections_per_thread"])))
    for label, g in s["gaps_ms"].items():
        print(f"  {label:<38} p50 {g['p50']:8.2f}  p90 {g['p90']:8.2f}  p99 {g['p99']:8.2f}  max {g['max']:8.2f} ms")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Summary of a bench/client-ab.sh run: per client and stream count, the median over rounds
(with the smallest and largest round in brackets) of each run's p50 and p95 of

- added TTFT: the client's TTFT minus the server's logged TTFT of the same request (first
  chunk handed to the kernel - request received), in ms;
- added from due: (due -> request written) + added TTFT: how much later than the server's own
  TTFT a request due at t=0 got its first token, as the client counted it (vLLM's TTFT clock
  starts in its request coroutine, before it connects and sends, so its figure is this one);
- queue: due -> request written (llmreplay's queue time + dispatch lag + connect);
- added ITL: per gap, the client's gap minus the server's;
- send gap: the median interval between consecutive requests written in the burst, in µs
  (the client's cost per request on the send path; a preemption shows as a few long gaps, not
  in the median, so it holds on a busy machine where the burst's length does not);
- send gap mean: the mean of those intervals up to their 90th percentile, in µs: the same
  figure without the median's 1 µs steps (arrival times are whole µs), so builds 0.5 µs apart
  can be told apart.

llmreplay's requests are joined to the server's log on x-request-id. vLLM's benchmark_serving.py
v0.7.3 sends no id: its figures are distributions, its percentile minus the server's over the
same run (for ITL, the client's gaps against the server's).

usage: client_ab.py OUT_DIR   (the directory bench/client-ab.sh wrote)
"""
import json
import os
import statistics
import sys

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from accuracy import joined, log_entries, read_log  # noqa: E402

METRICS = ["added_ttft", "added_from_due", "queue", "added_itl"]


def pct(xs, q):
    return float(np.percentile(np.asarray(xs, dtype=float), q)) if len(xs) else float("nan")


def llmreplay_run(d):
    cols = ["request_id", "outcome", "ttft_us", "chunk_times_us", "queue_us", "dispatch_lag_us", "connect_us",
            "arrival_time"]
    t = pq.read_table(f"{d}/r.parquet", columns=cols).to_pydict()
    tally = {"ok": 0, "unmatched": 0}
    added, due, queue, itl = [], [], [], []
    for i, s in joined(t, read_log(f"{d}/gt.jsonl"), tally):
        w = s["chunk_written_us"]
        a = t["ttft_us"][i] / 1000.0 - w[0] / 1000.0
        q = sum((t[c][i] or 0) for c in ("queue_us", "dispatch_lag_us", "connect_us")) / 1000.0
        added.append(a)
        queue.append(q)
        due.append(q + a)
        cg = np.diff(np.asarray(t["chunk_times_us"][i], dtype=float))
        sg = np.diff(np.asarray(w, dtype=float))
        itl.extend((cg - sg) / 1000.0)
    row = {"ok": tally["ok"], "failed": len(t["outcome"]) - tally["ok"], "unmatched": tally["unmatched"]}
    sent = np.sort(np.asarray([a.timestamp() * 1e6 for a in t["arrival_time"]], dtype=float))
    gaps = np.diff(sent)
    row["send_gap"] = float(np.median(gaps)) if sent.size > 1 else float("nan")
    row["send_gap_mean"] = float(gaps[gaps <= np.percentile(gaps, 90)].mean()) if sent.size > 1 else float("nan")
    for name, xs in (("added_ttft", added), ("added_from_due", due), ("queue", queue), ("added_itl", itl)):
        row[name] = (pct(xs, 50), pct(xs, 95))
    return row


def vllm_run(d):
    with open(f"{d}/r.json") as f:
        r = json.load(f)
    good = [i for i, e in enumerate(r["errors"]) if not e]
    ttft = [r["ttfts"][i] * 1000.0 for i in good]
    itl = [g * 1000.0 for i in good for g in r["itls"][i]]
    written = [e["chunk_written_us"] for e in log_entries(f"{d}/gt.jsonl") if e.get("complete") and e.get("chunk_written_us")]
    s_ttft = [w[0] / 1000.0 for w in written]
    s_gap = [g / 1000.0 for w in written for g in np.diff(np.asarray(w, dtype=float))]
    row = {"ok": len(good), "failed": len(r["errors"]) - len(good), "unmatched": 0}
    added = tuple(pct(ttft, q) - pct(s_ttft, q) for q in (50, 95))
    row["added_ttft"] = added
    row["added_from_due"] = added
    row["queue"] = (float("nan"), float("nan"))
    row["added_itl"] = tuple(pct(itl, q) - pct(s_gap, q) for q in (50, 95))
    row["send_gap"] = float("nan")
    row["send_gap_mean"] = float("nan")
    return row


def fmt(vals):
    vals = [v for v in vals if v == v]
    if not vals:
        return "—"
    return f"{statistics.median(vals):.2f} [{min(vals):.2f}, {max(vals):.2f}]"


def main():
    out = sys.argv[1]
    runs = {}
    for line in open(f"{out}/runs.txt"):
        label, n, _r, d = line.split()
        try:
            row = vllm_run(d) if label == "vllm" else llmreplay_run(d)
        except (OSError, ValueError, KeyError) as e:
            print(f"{label} {n} {d}: no result ({e})")
            continue
        runs.setdefault((int(n), label), []).append(row)
    setup = {}
    if os.path.exists(f"{out}/setup.txt"):
        for line in open(f"{out}/setup.txt"):
            k, _, v = line.partition(": ")
            setup[k.strip()] = v.strip()
    names = {"A": "A", "B": "B", "C": "C", "vllm": "vllm-0.7.3"}
    print(f"run {os.path.basename(out)}; medians over rounds [smallest, largest round], ms")
    for k in ("client A", "client B", "client C", "placement"):
        if k in setup:
            print(f"{k}: {setup[k]}")
    print()
    print("| streams | client | rounds | ok / failed (all rounds) | added TTFT p50 | p95 | added from due p50 | p95 "
          "| queue (due → written) p50 | p95 | added ITL p50 | p95 | send gap p50 (µs) | mean (µs) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (n, label) in sorted(runs, key=lambda k: (k[0], ["A", "B", "C", "vllm"].index(k[1]))):
        rs = runs[(n, label)]
        ok = sum(r["ok"] for r in rs)
        failed = sum(r["failed"] for r in rs)
        cells = []
        for m in METRICS:
            for j in (0, 1):
                cells.append(fmt([r[m][j] for r in rs]))
        cells.append(fmt([r["send_gap"] for r in rs]))
        cells.append(fmt([r["send_gap_mean"] for r in rs]))
        print(f"| {n} | {names.get(label, label)} | {len(rs)} | {ok} / {failed} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

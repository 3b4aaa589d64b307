#!/usr/bin/env python3
"""Client accuracy against a ground-truth server.

Joins llmreplay's per-request results (Parquet) with the ground-truth server's chunk log
(JSON lines, one entry per request, matched on x-request-id) and reports the client's TTFT,
ITL and TPOT error against the nominal script and against the times the server logged it
actually wrote each chunk: mean, p99 and standard deviation, in milliseconds.

usage: accuracy.py RESULTS.parquet CHUNK_LOG.jsonl TTFT_MS ITL_MS TOKENS_PER_CHUNK
       accuracy.py --floor STAMPS.jsonl CHUNK_LOG.jsonl
       accuracy.py --vs-server {llmreplay RESULTS.parquet | vllm RESULT.json} CHUNK_LOG.jsonl

With --floor it reads the bare reader's first-event stamps (replay/examples/floor.rs) instead
and reports their error against the server's logged write of the first chunk, on the wall
clock both sides share (the reader has no send time of its own to measure TTFT from).

With --vs-server it compares distributions instead of joining requests, for clients whose
requests the server's log cannot name (vLLM's benchmark_serving.py v0.7.3 sends no request
id; for `vllm bench serve`, whose ids end in the request's index, it also joins them): the
client's TTFT, ITL and TPOT over all its requests against the server's own over the same run
(TTFT: first chunk written − request received; ITL: gaps between chunk writes). llmreplay's
results are read the same way, so the figures sit side by side.
"""
import json
import sys

import numpy as np
import pyarrow.parquet as pq


def stats(xs):
    a = np.asarray(xs, dtype=float)
    if a.size == 0:
        return {"n": 0, "mean": float("nan"), "p50": float("nan"), "p99": float("nan"), "std": float("nan")}
    return {"n": int(a.size), "mean": float(a.mean()), "p50": float(np.percentile(a, 50)),
            "p99": float(np.percentile(a, 99)), "std": float(a.std())}


def log_entries(log_path):
    with open(log_path, newline="") as f:
        return [json.loads(line) for line in f]


def read_log(log_path):
    """The server's log by request id (the last entry of an id wins)."""
    return {e["request_id"]: e for e in log_entries(log_path) if e.get("request_id")}


def joined(t, server, tally):
    """The client's ok requests (indices into the results `t`) with the server's complete
    log entry of each, when both saw the same number of chunks; `tally` counts the ok ones
    and those left unmatched."""
    for i, rid in enumerate(t["request_id"]):
        if t["outcome"][i] != "ok":
            continue
        tally["ok"] += 1
        s = server.get(rid)
        if s is None or not s["complete"] or len(t["chunk_times_us"][i]) != len(s["chunk_written_us"]):
            tally["unmatched"] += 1
            continue
        yield i, s


def added_ttft_ms(results, log_path):
    """Per joined request, the client's TTFT minus the server's logged write of the first
    chunk (what `ttft_err_vs_logged_ms` summarises): the time a path in between added."""
    t = pq.read_table(results, columns=["request_id", "outcome", "ttft_us", "chunk_times_us"]).to_pydict()
    return [t["ttft_us"][i] / 1000.0 - s["chunk_written_us"][0] / 1000.0
            for i, s in joined(t, read_log(log_path), {"ok": 0, "unmatched": 0})]


def floor_main(stamps_path, log_path):
    server = read_log(log_path)
    errs, missing = [], 0
    with open(stamps_path) as f:
        for line in f:
            d = json.loads(line)
            s = server.get(d["request_id"])
            if s is None or not s["chunk_written_us"] or not d["first_event_ns"]:
                missing += 1
                continue
            written_unix_us = s["received_unix_us"] + s["chunk_written_us"][0]
            errs.append((d["first_event_ns"] / 1000.0 - written_unix_us) / 1000.0)
    json.dump({"requests": len(errs), "unmatched": missing, "first_event_err_vs_logged_ms": stats(errs)},
              sys.stdout, indent=1)
    print()


def join_vllm(r, written):
    """Per-request errors for a vLLM client whose requests carry `x-request-id:
    <prefix>-<i>` (`vllm bench serve` since 2025), i being the request's index in the
    result's arrays. The join is kept only if it holds up: a client's TTFT can never be
    shorter than the server's own for the same request (beyond 0.5 ms of clock reading), so a
    wrong join shows as negative errors for about half of the requests. `r` is the client's
    result, `written` the server's complete log entries."""
    n = len(r["ttfts"])
    by_index = {}
    for e in written:
        head, _, idx = (e.get("request_id") or "").rpartition("-")
        if head and idx.isdigit():
            by_index[int(idx)] = e
    ttft_err, itl_err = [], []
    for i in range(n):
        e = by_index.get(i)
        if e is None or r["errors"][i]:
            continue
        w = e["chunk_written_us"]
        ttft_err.append(r["ttfts"][i] * 1000.0 - w[0] / 1000.0)
        gaps = np.diff(np.asarray(w, dtype=float)) / 1000.0
        if len(r["itls"][i]) == len(gaps):
            itl_err.extend(np.asarray(r["itls"][i]) * 1000.0 - gaps)
    if len(ttft_err) < 0.9 * n:
        return None
    negative = sum(1 for x in ttft_err if x < -0.5) / len(ttft_err)
    if negative > 0.01:
        return None
    return {"joined": len(ttft_err), "ttft_err_vs_logged_ms": stats(ttft_err),
            "itl_err_vs_logged_ms": stats(itl_err)}


def vs_server_main(kind, results, log_path):
    r = None
    if kind == "llmreplay":
        t = pq.read_table(results).to_pydict()
        ok = [i for i, o in enumerate(t["outcome"]) if o == "ok"]
        ttft = [t["ttft_us"][i] / 1000.0 for i in ok]
        itl = [g / 1000.0 for i in ok for g in np.diff(np.asarray(t["chunk_times_us"][i], dtype=float))]
        tpot = [(t["e2el_us"][i] - t["ttft_us"][i]) / 1000.0 / (t["output_tokens"][i] - 1)
                for i in ok if t["output_tokens"][i] and t["output_tokens"][i] > 1]
        failed = len(t["outcome"]) - len(ok)
    elif kind == "vllm":
        with open(results) as f:
            r = json.load(f)
        good = [i for i, e in enumerate(r["errors"]) if not e]
        ttft = [r["ttfts"][i] * 1000.0 for i in good]
        itl = [g * 1000.0 for i in good for g in r["itls"][i]]
        tpot = [(sum(r["itls"][i]) * 1000.0) / (r["output_lens"][i] - 1)
                for i in good if r["output_lens"][i] > 1]
        failed = len(r["errors"]) - len(good)
    else:
        sys.exit(f"--vs-server: unknown client kind {kind}")
    written = [e for e in log_entries(log_path) if e.get("complete") and e.get("chunk_written_us")]
    s_ttft, s_gap, s_tpot = [], [], []
    for e in written:
        w = e["chunk_written_us"]
        s_ttft.append(w[0] / 1000.0)
        s_gap.extend(np.diff(np.asarray(w, dtype=float)) / 1000.0)
        if len(w) > 1:
            s_tpot.append((w[-1] - w[0]) / 1000.0 / (len(w) - 1))
    joined = join_vllm(r, written) if r is not None else None
    c, s = stats(ttft), stats(s_ttft)
    ci, si = stats(itl), stats(s_gap)
    report = {
        "client": kind, "requests_ok": len(ttft), "failed": failed, "server_requests": len(s_ttft),
        "client_ttft_ms": c, "server_ttft_ms": s,
        "ttft_over_server_mean_ms": c["mean"] - s["mean"], "ttft_over_server_p99_ms": c["p99"] - s["p99"],
        "client_itl_ms": ci, "server_gap_ms": si, "itl_jitter_ms": ci["std"] - si["std"],
        "client_tpot_ms": stats(tpot), "server_tpot_ms": stats(s_tpot),
    }
    if joined:
        report["per_request"] = joined
    json.dump(report, sys.stdout, indent=1)
    print()


def main():
    if sys.argv[1] == "--floor":
        floor_main(sys.argv[2], sys.argv[3])
        return
    if sys.argv[1] == "--vs-server":
        vs_server_main(sys.argv[2], sys.argv[3], sys.argv[4])
        return
    results, log_path, ttft_ms, itl_ms, tpc = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    t = pq.read_table(results).to_pydict()
    ttft_nom, ttft_log, itl_nom, itl_log, tpot_nom, tpot_log = [], [], [], [], [], []
    client_gaps, server_gaps = [], []
    tally = {"ok": 0, "unmatched": 0}
    for i, s in joined(t, read_log(log_path), tally):
        chunks = t["chunk_times_us"][i]
        written = s["chunk_written_us"]
        nominal = s["chunk_nominal_us"]
        ttft = t["ttft_us"][i] / 1000.0
        ttft_nom.append(ttft - ttft_ms)
        ttft_log.append(ttft - written[0] / 1000.0)
        cg = np.diff(np.asarray(chunks, dtype=float)) / 1000.0
        sg = np.diff(np.asarray(written, dtype=float)) / 1000.0
        ng = np.diff(np.asarray(nominal, dtype=float)) / 1000.0
        client_gaps.extend(cg)
        server_gaps.extend(sg)
        itl_nom.extend(cg - ng)
        itl_log.extend(cg - sg)
        out = t["output_tokens"][i]
        if out and out > 1:
            tpot = (t["e2el_us"][i] - t["ttft_us"][i]) / 1000.0 / (out - 1)
            tpot_n = (nominal[-1] - nominal[0]) / 1000.0 / (out - 1)
            tpot_l = (written[-1] - written[0]) / 1000.0 / (out - 1)
            tpot_nom.append(tpot - tpot_n)
            tpot_log.append(tpot - tpot_l)
    cg, sg = np.asarray(client_gaps), np.asarray(server_gaps)
    report = {
        "requests_ok": tally["ok"],
        "unmatched": tally["unmatched"],
        "ttft_err_vs_nominal_ms": stats(ttft_nom),
        "ttft_err_vs_logged_ms": stats(ttft_log),
        "itl_err_vs_nominal_ms": stats(itl_nom),
        "itl_err_vs_logged_ms": stats(itl_log),
        "tpot_err_vs_nominal_ms": stats(tpot_nom),
        "tpot_err_vs_logged_ms": stats(tpot_log),
        "client_itl_std_ms": float(cg.std()) if cg.size else float("nan"),
        "server_gap_std_ms": float(sg.std()) if sg.size else float("nan"),
        "client_itl_jitter_ms": float(cg.std() - sg.std()) if cg.size else float("nan"),
    }
    json.dump(report, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()

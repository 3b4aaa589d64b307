#!/usr/bin/env python3
"""Normalise llmreplay outputs for a before/after comparison of a restructuring.

Usage: normalize.py KIND FILE  -> prints the normalised form on stdout.
KIND: json-exact | json-run | parquet-exact | parquet-run | text-exact | text-run
'-run' kinds come from real runs (timings vary): numbers that measure time are masked,
counts and keys are kept. '-exact' kinds come from deterministic commands: only
wall-clock stamps, versions and hosts are masked.
"""
import json, re, sys

VOLATILE = re.compile(r"(^|_)(us|ms|s|at|date|time|epoch|pid|host|hostname|version|created|started|ended|duration|elapsed|rate|throughput|rps|seconds|lag|rss|cpu|start|end|wall|sent|ratio|p\d+.*|mean.*|median.*|std.*|min.*|max.*|hist.*|gaps?|ttft.*|tpot.*|itl.*|e2el.*|offset.*|sojourn.*|from_s|window.*|bucket.*|counts?)$|ttft|tpot|itl|e2el|latenc|_ms$|_us$|_s$|throughput|time|rate|lag|cpu|rss|duration|start|stamp|percentile|goodput|steady|overload|served|offered|chunk|recv|send|arriv", re.I)
RUN_MASK = {"worst_shard_lag_too_high", "run_id", "content_hash", "prompt_salt", "new_connection", "client_saturated", "lag_too_high", "late_dispatches"}
STAMP_KEYS = re.compile(r"(created|date|timestamp|command|host|pid|version|started_at|start_us|run_start|epoch|_at$|wall)", re.I)


RUN_SUBTREES = {"steady", "overload", "steady_missing", "server_gauges", "server_histograms"}


def mask_all(v):
    if isinstance(v, dict):
        return {k: mask_all(x) for k, x in v.items()}
    if isinstance(v, list):
        return "<list>"
    return f"<{type(v).__name__}>"


def mask_json(v, key="", run=False):
    if run and key in RUN_SUBTREES:
        return mask_all(v)
    if isinstance(v, dict):
        return {k: mask_json(x, k, run) for k, x in v.items()}
    if isinstance(v, list):
        if run and v and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            return "<numbers>"
        out = [mask_json(x, key, run) for x in v]
        if run and all(not isinstance(x, dict) for x in out):
            out.sort(key=lambda x: json.dumps(x))
        return out
    if run and key in RUN_MASK:
        return f"<{key}>"
    if run and key == "message" and isinstance(v, str):
        return "<message>"
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, (int, float)):
        if STAMP_KEYS.search(key):
            return f"<{type(v).__name__}>"
        if run and (isinstance(v, float) or VOLATILE.search(key)):
            return f"<{type(v).__name__}>"
        return v
    if isinstance(v, str):
        if STAMP_KEYS.search(key):
            return "<str>"
        if run:
            return re.sub(r"\d+(\.\d+)?", "N", v)
        return re.sub(r"\b20\d\d-\d\d-\d\dT[\d:.]+Z?\b", "<utc>", v)
    return v


def text(path, run):
    out = []
    for line in open(path, errors="replace"):
        line = re.sub(r"\b20\d\d-\d\d-\d\d[T ][\d:.]+Z?\b", "<utc>", line)
        line = re.sub(r"/tmp/[^\s'\"]+", "<tmp>", line)
        line = re.sub(r"[^\s`'\"]*/llmreplay\b", "llmreplay", line)
        if run:
            line = re.sub(r"[-+]?\d+(\.\d+)?(e[-+]?\d+)?", "N", line)
            line = re.sub(r"N(\s*[,/x×]\s*N)+", "N", line)
            line = re.sub(r"[ \t]+", " ", line)
            line = re.sub(r"hash \w+", "hash H", line)
            line = re.sub(r"={3,}", "==", line)
            line = re.sub(r"-{3,}", "--", line)
            line = re.sub(r"SLO (FAIL|PASS|OK).*", "SLO <verdict>", line)
            line = re.sub(r" \[client saturated[^\]]*\]", "", line)
            line = re.sub(r"\| (client saturated: not clean server figures|OK) \|", "| <client verdict> |", line)
            if re.search(r"client (could not|kept up)|dispatch lag", line):
                line = "<client verdict>"
        out.append(line.rstrip())
    return "\n".join(out)


def parquet(path, run):
    import pyarrow.parquet as pq
    f = pq.ParquetFile(path)
    t = f.read()
    kv = dict(f.metadata.metadata or {})
    kv.pop(b"ARROW:schema", None)
    meta = {k.decode(): v.decode(errors="replace") for k, v in kv.items()}
    out = ["schema:", str(t.schema.remove_metadata())]
    for k in sorted(meta):
        v = meta[k]
        if run and (k.endswith(".url") or k.endswith("content_hash")):
            v = "<varies per run>"
        try:
            v = json.dumps(mask_json(json.loads(v), k, run), indent=1, sort_keys=True)
        except Exception:
            v = "<str>" if STAMP_KEYS.search(k) else v
        out.append(f"meta {k}: {v}")
    rows = t.to_pylist()
    if not run and rows and "arrival_time" in t.column_names:
        ts = [r["arrival_time"] for r in rows if r["arrival_time"] is not None]
        t0 = min(ts) if ts else None
        for r in rows:
            if r["arrival_time"] is not None:
                r["arrival_time"] = (r["arrival_time"] - t0).total_seconds()
    out.append(f"rows: {len(rows)}")
    if run:
        keep = [c for c in t.column_names if not VOLATILE.search(c) and c not in ("error", "target_url") and c not in RUN_MASK]
        rows = sorted(json.dumps({c: r[c] for c in keep}, sort_keys=True, default=str) for r in rows)
        out += rows
    else:
        out += [json.dumps(mask_json(r, "", False), sort_keys=True, default=str) for r in rows]
    return "\n".join(out)


kind, path = sys.argv[1], sys.argv[2]
fmt, mode = kind.split("-")
run = mode == "run"
if fmt == "json":
    docs = []
    txt = open(path).read()
    try:
        docs = [json.loads(txt)]
    except json.JSONDecodeError:
        docs = [json.loads(l) for l in txt.splitlines() if l.strip()]
    for d in docs:
        print(json.dumps(mask_json(d, "", run), indent=1, sort_keys=False))
elif fmt == "parquet":
    print(parquet(path, run))
else:
    print(text(path, run))

"""Load and report for bench/soak.sh (not CI).

  python3 bench/soak.py load PORT SECONDS CONCURRENCY LOG.jsonl
      Steady streamed load through capture: CONCURRENCY keep-alive clients, each sending the
      next request as soon as its previous one ended, until SECONDS have passed. Request n
      carries `x-soak-id: n` (capture records it as the session id) and, by a fixed plan,
      asks the sim for a fault (`x-sim-fault`) or is cancelled by its client mid-stream:
        n % 100 == 0  error       the sim answers 500
        n % 100 == 1  rate-limit  429 with Retry-After
        n % 100 == 2  reset       the sim drops the stream after two chunks
        n % 100 == 3  cancel      the client closes after the first bytes of the stream
        n % 500 == 4  stall       the sim stalls after the head (capture's --idle-timeout cuts it)
      One line per request: id, fault, what the client saw.

  python3 bench/soak.py report OUT_DIR
      Reads OUT_DIR/load.jsonl, OUT_DIR/samples.tsv (time, RSS KiB, open fds of capture) and
      capture's trace files OUT_DIR/trace/*.parquet, and prints the summary: rows recorded vs
      requests sent (missing, duplicated, unknown), RSS and fd slopes by least squares (per
      hour: whole run, after the first fifth, second half), and the rows' outcomes by the fault the
      load caused, with every row that does not have the outcome its fault should give.
"""

import collections
import glob
import http.client
import itertools
import json
import sys
import threading
import time

PLAN = [
    (lambda n: n % 100 == 0, "error"),
    (lambda n: n % 100 == 1, "rate-limit"),
    (lambda n: n % 100 == 2, "reset"),
    (lambda n: n % 100 == 3, "cancel"),
    (lambda n: n % 500 == 4, "stall"),
]

# What capture must record for each fault the load caused: (outcome, status).
EXPECTED = {
    "none": ("ok", 200),
    "error": ("http_error", 500),
    "rate-limit": ("http_error", 429),
    "reset": ("upstream_error", 200),
    "cancel": ("client_cancelled", 200),
    "stall": ("timeout", 200),
}


def fault_of(n):
    for test, name in PLAN:
        if test(n):
            return name
    return "none"


def load(port, seconds, concurrency, log_path):
    deadline = time.monotonic() + seconds
    ids = itertools.count()
    lock = threading.Lock()
    log = open(log_path, "w")

    def worker():
        conn = None
        while time.monotonic() < deadline:
            with lock:
                n = next(ids)
            fault = fault_of(n)
            body = json.dumps({
                "model": "m", "prompt": f"soak request {n} " + "w " * 24,
                "max_tokens": 16, "ignore_eos": True, "stream": True,
            })
            headers = {"content-type": "application/json", "x-soak-id": str(n)}
            if fault not in ("none", "cancel"):
                headers["x-sim-fault"] = fault
            t0 = time.monotonic()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                conn.request("POST", "/v1/completions", body, headers)
                r = conn.getresponse()
                if fault == "cancel":
                    r.read(1)
                    conn.close()
                    conn = None
                    seen = "cancelled"
                else:
                    data = r.read()
                    seen = str(r.status)
                    if r.status == 200 and not data.endswith(b"data: [DONE]\n\n"):
                        seen += " without [DONE]"
                    if r.will_close:
                        conn.close()
                        conn = None
            except Exception as e:  # a cut stream: IncompleteRead, reset, ...
                seen = type(e).__name__
                if conn is not None:
                    conn.close()
                conn = None
            line = json.dumps({"id": n, "fault": fault, "seen": seen,
                               "ms": round((time.monotonic() - t0) * 1e3, 1)})
            with lock:
                log.write(line + "\n")
        if conn is not None:
            conn.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()


def slope_per_hour(points):
    """Least-squares slope of (seconds, value) points, per hour."""
    if len(points) < 2:
        return float("nan")
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    if sxx == 0:
        return float("nan")
    sxy = sum((p[0] - mx) * (p[1] - my) for p in points)
    return sxy / sxx * 3600


def report(out):
    import pyarrow.parquet as pq

    sent = [json.loads(l) for l in open(f"{out}/load.jsonl")]
    by_id = {s["id"]: s for s in sent}
    rows = []
    for f in sorted(glob.glob(f"{out}/trace/*.parquet")):
        t = pq.read_table(f, columns=["session_id", "outcome", "status", "error"])
        rows.extend(t.to_pylist())
    per_id = collections.Counter(r["session_id"] for r in rows)
    missing = [i for i in by_id if per_id.get(str(i), 0) == 0]
    dup = [k for k, c in per_id.items() if c > 1]
    unknown = [k for k in per_id if k is None or not k.isdigit() or int(k) not in by_id]

    samples = []
    for l in open(f"{out}/samples.tsv"):
        p = l.split()
        if len(p) == 3:
            samples.append((float(p[0]), int(p[1]), int(p[2])))
    # The last sample is taken after the load ended (every stream closed): it is reported
    # as the end state and kept out of the slopes, which are of the process under load.
    after = samples.pop() if len(samples) > 2 else None
    t0 = samples[0][0] if samples else 0
    span = (samples[-1][0] - t0) if samples else 0
    rss = [(t - t0, r) for t, r, _ in samples]
    fds = [(t - t0, f) for t, _, f in samples]
    warm = span / 5
    rss_w = [p for p in rss if p[0] >= warm]
    fds_w = [p for p in fds if p[0] >= warm]
    rss_h = [p for p in rss if p[0] >= span / 2]
    fds_h = [p for p in fds if p[0] >= span / 2]

    print(f"# Soak: {out}\n")
    print(f"- Load: {len(sent)} requests in {span:.0f} s of samples "
          f"({len(sent) / max(span, 1):.1f} req/s), {len(samples)} samples of capture's RSS and fds.")
    verdict = "yes" if len(rows) == len(sent) and not missing and not dup and not unknown else "NO"
    print(f"- **Rows recorded == requests sent: {verdict}** ({len(rows)} rows for {len(sent)} "
          f"requests; missing {len(missing)}, duplicated {len(dup)}, unknown {len(unknown)})"
          + (f"; missing ids {missing[:10]}" if missing else ""))
    if samples:
        print(f"- RSS under load: {rss[0][1] / 1024:.1f} MiB at the start, {max(r for _, r in rss) / 1024:.1f} MiB peak, "
              f"{rss[-1][1] / 1024:.1f} MiB at the end; slope {slope_per_hour(rss) / 1024:+.2f} MiB/h "
              f"(after the first fifth: {slope_per_hour(rss_w) / 1024:+.2f}, second half: "
              f"{slope_per_hour(rss_h) / 1024:+.2f} MiB/h)"
              + (f"; {after[1] / 1024:.1f} MiB after the load" if after else ""))
        print(f"- Open fds under load: {fds[0][1]} at the start, {max(f for _, f in fds)} peak, {fds[-1][1]} at the end; "
              f"slope {slope_per_hour(fds):+.1f} fds/h (after the first fifth: {slope_per_hour(fds_w):+.1f}, "
              f"second half: {slope_per_hour(fds_h):+.1f} fds/h)"
              + (f"; {after[2]} after the load" if after else ""))
    print("\n| fault the load caused | requests | client saw | rows by outcome (status) | as expected |")
    print("|---|---|---|---|---|")
    wrong = []
    row_of = {}
    for r in rows:
        row_of.setdefault(r["session_id"], r)
    for fault in EXPECTED:
        mine = [s for s in sent if s["fault"] == fault]
        if not mine:
            continue
        seen = collections.Counter(s["seen"] for s in mine)
        outs = collections.Counter()
        ok = 0
        for s in mine:
            r = row_of.get(str(s["id"]))
            if r is None:
                outs["(no row)"] += 1
                continue
            outs[f"{r['outcome']} ({r['status']})"] += 1
            if (r["outcome"], r["status"]) == EXPECTED[fault]:
                ok += 1
            else:
                wrong.append((s, r))
        fmt = lambda c: ", ".join(f"{k} ×{v}" for k, v in c.most_common())
        print(f"| {fault} | {len(mine)} | {fmt(seen)} | {fmt(outs)} | {ok}/{len(mine)} |")
    print(f"\nRows whose outcome is not their fault's: {len(wrong)}")
    for s, r in wrong[:10]:
        print(f"- id {s['id']} ({s['fault']}, client saw {s['seen']}): {r['outcome']} {r['status']} {r['error']}")


if __name__ == "__main__":
    if sys.argv[1] == "load":
        load(int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    elif sys.argv[1] == "report":
        report(sys.argv[2])
    else:
        sys.exit(f"usage: {sys.argv[0]} load PORT SECONDS CONCURRENCY LOG | report OUT_DIR")

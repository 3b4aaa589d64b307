#!/usr/bin/env python3
"""Where a burst's added TTFT is: the request path and the response path, per request.

usage: bench/burst_paths.py RUN_DIR TAG [TAG...]
  e.g. bench/burst_paths.py bench/out/20261202T112651Z burst-100-capture-r1 burst-100-nginx-r1

For each TAG of a `bench/run.sh burst` run (files TAG-results.parquet and TAG-gt.jsonl):
  request path  = the ground-truth server's kernel receive stamp of the request minus the
                  client's dispatch (its `arrival_time`): the proxy's accept, head read,
                  upstream connection and write, and the queueing on the machine meanwhile;
  response path = the client's first token (dispatch + TTFT) minus the server's logged write
                  of the first chunk: the proxy's read and write of it.
Both clocks are the machine's wall clock; the two add up to the added TTFT of
bench/accuracy.py (`ttft_err_vs_logged_ms`). Direct runs read ~0 on both.
"""
import sys

import pyarrow.parquet as pq

from accuracy import read_log
from phases import pct


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        sys.exit(2)
    run = sys.argv[1]
    for tag in sys.argv[2:]:
        try:
            gt = read_log(f"{run}/{tag}-gt.jsonl")
            rows = pq.read_table(f"{run}/{tag}-results.parquet").to_pylist()
        except OSError as e:
            sys.exit(f"burst_paths: {tag}: {e} (a tag of `bench/run.sh burst`, e.g. burst-100-capture-r1)")
        t0 = min(r["arrival_time"].timestamp() * 1e6 for r in rows)
        req, resp, disp = [], [], []
        for r in rows:
            g = gt.get(r["request_id"])
            if g is None or r["ttft_us"] is None or not g["chunk_written_us"]:
                continue
            d = r["arrival_time"].timestamp() * 1e6
            received = g["received_unix_us"]
            first_write = received + g["chunk_written_us"][0]
            req.append((received - d) / 1000)
            resp.append((d + r["ttft_us"] - first_write) / 1000)
            disp.append((d - t0) / 1000)

        def f(v):
            return f"p50 {pct(v, .5):7.2f}  p90 {pct(v, .9):7.2f}  p99 {pct(v, .99):7.2f} ms"

        print(f"{tag} ({len(req)} requests)")
        print(f"  dispatch after the first  {f(disp)}")
        print(f"  request path              {f(req)}")
        print(f"  response path             {f(resp)}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Turns a bench/out/<run> directory into the Markdown tables of bench/README.md."""
import glob
import json
import os
import re
import sys


def load(p):
    with open(p) as f:
        return json.load(f)


def print_table(title, columns, rows):
    """A Markdown table under a heading, or nothing when there are no rows."""
    if not rows:
        return
    print(f"### {title}\n")
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    print("\n".join(rows))
    print()


def main():
    out = sys.argv[1]
    print(f"Run: `{out}`\n")
    acc = sorted(glob.glob(os.path.join(out, "acc-*-errors.json")),
                 key=lambda p: (("shared" in p),) + tuple(int(x) for x in re.findall(r"\d+", os.path.basename(p))))
    if acc:
        print("### Accuracy against the ground-truth server (TTFT 50 ms, ITL 10 ms, 100 tokens)\n")
        print("| placement | streams | tok/chunk | TTFT err vs logged mean / p99 / std (ms) | TTFT err vs nominal mean / p99 | ITL err vs logged mean / p99 / std | TPOT err vs logged mean / p99 | client ITL jitter (ms) | dispatch lag p99 (ms) | client CPU per SSE event (µs) |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for p in acc:
            m = re.search(r"acc-(\w+)-(\d+)-tpc(\d+)-errors.json", p)
            place, n, tpc = m.group(1), m.group(2), m.group(3)
            e = load(p)
            r = load(p.replace("-errors.json", ".json"))
            ours = r["llmreplay"]
            load_ = ours["client"]["load"] or {}
            events = r["completed"] * (100 // int(tpc) + (1 if 100 % int(tpc) else 0))
            cpu_us = (load_.get("cpu_seconds", 0) * 1e6 / events) if events else float("nan")
            tl, tn, il, pl = e["ttft_err_vs_logged_ms"], e["ttft_err_vs_nominal_ms"], e["itl_err_vs_logged_ms"], e["tpot_err_vs_logged_ms"]
            print(f"| {place} | {n} | {tpc} | {tl['mean']:.3f} / {tl['p99']:.3f} / {tl['std']:.3f} | {tn['mean']:.3f} / {tn['p99']:.3f} "
                  f"| {il['mean']:.4f} / {il['p99']:.3f} / {il['std']:.3f} | {pl['mean']:.4f} / {pl['p99']:.4f} "
                  f"| {e['client_itl_jitter_ms']:.4f} | {ours['dispatch_lag_ms']['p99']:.3f} | {cpu_us:.2f} |")
        print()
    floor_table(out)
    peers_table(out)
    sched = sorted(glob.glob(os.path.join(out, "sched-*.json")), key=lambda p: int(re.findall(r"\d+", os.path.basename(p))[0]))
    if sched:
        print("### Schedule fidelity (open loop, short requests)\n")
        print("| offered req/s | requests | dispatch lag p50 (ms) | p99 (ms) | max (ms) | client CPU | verdict |")
        print("|---|---|---|---|---|---|---|")
        for p in sched:
            r = load(p)
            rate = re.findall(r"\d+", os.path.basename(p))[0]
            lag = r["llmreplay"]["dispatch_lag_ms"]
            v = r["llmreplay"]["client"]["verdict"]
            cpu = v.get("client_cpu_utilization")
            print(f"| {rate} | {r['num_prompts']} | {lag['p50']:.3f} | {lag['p99']:.3f} | {lag['max']:.3f} | "
                  f"{(cpu or 0) * 100:.0f}% | {'saturated' if v['client_saturated'] else 'kept up'} |")
        print()
    proxy_tables(out)
    shards_table(out)
    writer_table(out)
    floor_kinds_table(out)


def floor_table(out):
    rows = []
    for place, n in [(p, n) for p in ("split", "shared") for n in (1, 100, 500, 1000)]:
        fp = os.path.join(out, f"floor-{place}-{n}.json")
        ap = os.path.join(out, f"acc-{place}-{n}-tpc1.json")
        if not (os.path.exists(fp) and os.path.exists(ap)):
            continue
        f, fe = load(fp), load(os.path.join(out, f"floor-{place}-{n}-errors.json"))["first_event_err_vs_logged_ms"]
        r = load(ap)
        e = load(os.path.join(out, f"acc-{place}-{n}-tpc1-errors.json"))["ttft_err_vs_logged_ms"]
        cpu = (r["llmreplay"]["client"]["load"] or {}).get("cpu_seconds", float("nan"))
        events = r["completed"] * 100
        ours_ev = cpu * 1e6 / events if events else float("nan")
        ours_req = cpu * 1e6 / r["completed"] if r["completed"] else float("nan")
        rows.append(f"| {place} | {n} | {e['mean']:.3f} / {e['p99']:.3f} | {fe['mean']:.3f} / {fe['p99']:.3f} | "
                    f"{ours_ev:.2f} | {f['cpu_us_per_event']:.2f} | {ours_ev - f['cpu_us_per_event']:.2f} | {ours_req:.0f} |")
    print_table(
        "llmreplay beside a bare reader (the kernel's floor), same load",
        [
            "placement",
            "streams",
            "llmreplay TTFT err vs logged mean / p99 (ms)",
            "bare reader first-event err vs logged mean / p99 (ms)",
            "llmreplay CPU per event (µs)",
            "bare reader CPU per event (µs)",
            "llmreplay above the floor (µs)",
            "llmreplay CPU per request (µs)",
        ],
        rows,
    )


def writer_table(out):
    p = os.path.join(out, "writer.json")
    if not os.path.exists(p):
        return
    w = load(p)
    print("### Capture's trace writer alone (journal + Parquet, 100 chunk times and 64 prefix hashes per record)\n")
    print("| records | records per second | CPU seconds | bytes on disk per request | files |")
    print("|---|---|---|---|---|")
    print(f"| {w['records']} | {w['records_per_second']:.0f} | {w['cpu_seconds']:.2f} | {w['bytes_per_record']:.0f} | {w['files']} |")
    print()


def proxy_tables(out):
    rows = []
    for n in (100, 300, 1000):
        direct = os.path.join(out, f"proxy-{n}-direct-errors.json")
        if not os.path.exists(direct):
            continue
        d = load(direct)
        for path in ("capture", "capture1", "nginx"):
            e_path = os.path.join(out, f"proxy-{n}-{path}-errors.json")
            if not os.path.exists(e_path):
                continue
            e = load(e_path)
            r = load(os.path.join(out, f"proxy-{n}-{path}.json"))
            ticks = open(os.path.join(out, f"proxy-{n}-{path}-proxy-cpu-ticks")).read().strip()
            cpu_s = int(ticks) / os.sysconf("SC_CLK_TCK")
            recorded, per_req = "-", "-"
            if path.startswith("capture"):
                import pyarrow.parquet as pq
                files = glob.glob(os.path.join(out, f"proxy-{n}-{path}-trace", "*.parquet"))
                got = sum(pq.read_metadata(f).num_rows for f in files)
                recorded = f"{got} / {2 * r['num_prompts']}"
                if got:
                    per_req = f"{sum(os.path.getsize(f) for f in files) / got:.0f} B"
            tt = lambda k: e["ttft_err_vs_logged_ms"][k] - d["ttft_err_vs_logged_ms"][k]
            it = lambda k: e["itl_err_vs_logged_ms"][k] - d["itl_err_vs_logged_ms"][k]
            rows.append(f"| {n} | {path} | {tt('p50'):.3f} / {tt('p99'):.3f} | {it('p50'):.4f} / {it('p99'):.3f} | "
                        f"{cpu_s:.2f} s | {recorded} | {per_req} | {r['completed']} ok, {r['failed']} failed |")
    print_table(
        "Proxy overhead (added over direct, client-measured against the server's logged writes)",
        [
            "streams",
            "path",
            "added TTFT p50 / p99 (ms)",
            "added chunk gap p50 / p99 (ms)",
            "proxy CPU (measured pass)",
            "rows recorded (both passes)",
            "on disk per request",
            "requests",
        ],
        rows,
    )


def shards_table(out):
    p = os.path.join(out, "shards.txt")
    if not os.path.exists(p):
        return
    line = next((l for l in open(p) if l.startswith("server-side arrival")), None)
    ok = any("test result: ok" in l for l in open(p))
    print("### Sharded replay: 4 shards with one --start-at vs one process (server-side arrivals)\n")
    print(f"{line.strip() if line else 'no figures (see shards.txt)'}; p99 <= 2 ms: {'met' if ok else 'NOT met'}\n")



def floor_kinds_table(out):
    rows = []
    for kind, name in (("floor", "epoll + recvmsg per read"), ("floor_uring", "io_uring multishot recvmsg")):
        p = os.path.join(out, f"kind-{kind}.json")
        if os.path.exists(p):
            f = load(p)
            e = load(os.path.join(out, f"kind-{kind}-errors.json"))["first_event_err_vs_logged_ms"]
            rows.append(f"| {name} | {f['events']} | {f['reads']} | {f['wakeups']} | {f['cpu_us_per_event']:.2f} | {e['p99']:.3f} |")
    print_table(
        "The bare reader through two kernel interfaces (1,000 streams)",
        [
            "interface",
            "events",
            "reads",
            "wake-ups",
            "CPU per event (µs)",
            "first-event error p99 (ms)",
        ],
        rows,
    )


def peers_table(out):
    rows = []
    for n in (1, 100, 500, 1000):
        for place in ("split", "shared"):
            files = [("llmreplay", os.path.join(out, f"acc-{place}-{n}-tpc1-vs-server.json"))]
            files += [(os.path.basename(f)[len("peer-"):-len(f"-{place}-{n}-errors.json")], f)
                      for f in sorted(glob.glob(os.path.join(out, f"peer-*-{place}-{n}-errors.json")))]
            if len(files) < 2:
                continue  # no peer ran at this point
            for name, f in files:
                if not os.path.exists(f):
                    continue
                e = load(f)
                joined = e.get("per_request", {}).get("ttft_err_vs_logged_ms")
                if name == "llmreplay":
                    acc = os.path.join(out, f"acc-{place}-{n}-tpc1-errors.json")
                    joined = load(acc)["ttft_err_vs_logged_ms"] if os.path.exists(acc) else None
                per_req = f"{joined['mean']:.2f} / {joined['p99']:.2f}" if joined else "— (no request id)"
                c, s = e["client_ttft_ms"], e["server_ttft_ms"]
                ci, ct, st = e["client_itl_ms"], e["client_tpot_ms"], e["server_tpot_ms"]
                rows.append(f"| {place} | {n} | {name} | {e['requests_ok']} / {e['failed']} | {c['mean']:.2f} / {c['p99']:.2f} "
                            f"| {s['mean']:.2f} / {s['p99']:.2f} | **{e['ttft_over_server_mean_ms']:.2f} / {e['ttft_over_server_p99_ms']:.2f}** "
                            f"| {per_req} | {ci['p50']:.3f} / {ci['std']:.3f} | **{e['itl_jitter_ms']:.3f}** | {ct['mean']:.3f} / {st['mean']:.3f} |")
    print_table(
        "Beside other clients: each client's figures against the server's own over the same run",
        [
            "placement",
            "streams",
            "client",
            "ok / failed",
            "client TTFT mean / p99 (ms)",
            "server's own TTFT mean / p99",
            "client − server mean / p99",
            "per request: TTFT err vs logged mean / p99",
            "client ITL p50 / std",
            "ITL jitter (client std − server gap std)",
            "TPOT client / server mean",
        ],
        rows,
    )


if __name__ == "__main__":
    main()


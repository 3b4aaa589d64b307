"""Traces on object storage (issue 8): `capture --out s3://...` into a local S3-compatible
server (moto in server mode, on loopback, started here), read back by `llmreplay inspect`,
by `llmreplay replay` and by DuckDB's own s3:// reader with Hive partitions; results written
to s3://; a store that is down delays files without losing them; and a fleet's day of hourly
partitions read as one trace in a time window, in bounded memory.
"""

import datetime
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import free_port, llmreplay_binary

boto3 = pytest.importorskip("boto3", reason="pip install 'moto[server]' (tests/python/requirements.txt)")
pytest.importorskip("moto", reason="pip install 'moto[server]' (tests/python/requirements.txt)")

KEY = re.compile(r"^prod/date=(\d{4}-\d{2}-\d{2})/hour=(\d{2})/capture-(\d{8})T(\d{2})\d{4}Z-\d{6}\.parquet$")


def wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{what} did not listen on {port} within {timeout} s")


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on loopback with a bucket `caps`; yields (endpoint, client, env)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, proc, "moto server")
        endpoint = f"http://127.0.0.1:{port}"
        env = dict(
            os.environ,
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_REGION="us-east-1",
            AWS_ENDPOINT_URL=endpoint,
            AWS_ALLOW_HTTP="true",
        )
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        client.create_bucket(Bucket="caps")
        yield endpoint, client, env
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def serve_sim(*args):
    """`llmreplay sim` with `args` on a free loopback port, for a fixture: yields its URL."""
    port = free_port()
    proc = subprocess.Popen(
        [str(llmreplay_binary()), "sim", "--listen", f"127.0.0.1:{port}", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, proc, "llmreplay sim")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def sim():
    yield from serve_sim("--profile", "tiny")


def post(url: str, stream: bool, i: int):
    body = (
        '{"model":"m","prompt":"request %d says hello","max_tokens":%d,"stream":%s}'
        % (i, 3 + i % 4, "true" if stream else "false")
    ).encode()
    req = urllib.request.Request(
        url + "/v1/completions", data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
        r.read()


def capture(upstream: str, out: str, env: dict, spool: Path, n: int, extra=()):
    """Runs `llmreplay capture`, sends n requests through it, stops it with SIGTERM;
    returns (exit code, stderr)."""
    port = free_port()
    proc = subprocess.Popen(
        [
            str(llmreplay_binary()), "capture", "--listen", f"127.0.0.1:{port}",
            "--upstream", upstream, "--out", out, "--spool-dir", str(spool),
            "--no-admin", "--drain-timeout", "5s", *extra,
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_port(port, proc, "llmreplay capture")
        for i in range(n):
            post(f"http://127.0.0.1:{port}", stream=i % 3 != 0, i=i)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err


def keys(client, prefix: str):
    got = client.list_objects_v2(Bucket="caps", Prefix=prefix)
    return sorted(o["Key"] for o in got.get("Contents", []))


def duckdb_with_s3(endpoint: str):
    """A DuckDB connection with the httpfs extension (from the duckdb-extension-httpfs
    package: the extension server is not reachable here) and a secret for the moto server."""
    import duckdb
    import duckdb_extension_httpfs

    ext = (
        Path(duckdb_extension_httpfs.__file__).parent
        / "extensions" / f"v{duckdb.__version__}" / "httpfs.duckdb_extension"
    )
    assert ext.exists(), f"{ext}: duckdb and duckdb-extension-httpfs versions must match"
    con = duckdb.connect()
    con.load_extension(str(ext))
    host = endpoint.removeprefix("http://")
    con.sql(
        "CREATE SECRET (TYPE s3, KEY_ID 'testing', SECRET 'testing', REGION 'us-east-1', "
        f"ENDPOINT '{host}', USE_SSL false, URL_STYLE 'path')"
    )
    return con


def test_capture_to_s3_reads_back_with_inspect_replay_and_duckdb(s3, sim, tmp_path):
    endpoint, client, env = s3
    n = 12
    rc, err = capture(sim, "s3://caps/prod", env, tmp_path / "spool", n)
    assert rc == 0, err
    assert "uploaded to s3://caps/prod" in err, err

    # Every object sits in a Hive partition named after the hour its file was started.
    objects = keys(client, "prod/")
    assert objects, err
    for k in objects:
        m = KEY.match(k)
        assert m, f"{k} is not in a date=/hour= partition"
        date, hour, stamp_day, stamp_hour = m.groups()
        assert date.replace("-", "") == stamp_day and hour == stamp_hour, k
    # The spool is empty once everything is uploaded.
    assert not list((tmp_path / "spool").glob("*.parquet"))

    # llmreplay inspect reads the prefix (recursively, through the partitions).
    out = subprocess.run(
        [str(llmreplay_binary()), "inspect", "s3://caps/prod", "--json"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert f'"rows": {n}' in out.stdout.replace("\n", " ") or f'"rows":{n}' in out.stdout, out.stdout

    # DuckDB's own s3:// reader, with the partition columns.
    con = duckdb_with_s3(endpoint)
    rows = con.sql(
        "SELECT date, hour, count(*) AS n, count(DISTINCT request_id) AS ids, "
        "sum(prompt_tokens) AS p "
        "FROM read_parquet('s3://caps/prod/**/*.parquet', hive_partitioning = true) "
        "GROUP BY ALL"
    ).fetchall()
    assert sum(r[2] for r in rows) == n, rows
    assert sum(r[3] for r in rows) == n, rows
    assert all(r[4] > 0 for r in rows), rows
    parts = {(str(r[0]), int(r[1])) for r in rows}
    from_keys = {(KEY.match(k).group(1), int(KEY.match(k).group(2))) for k in objects}
    assert parts == from_keys

    # Replay reads the trace from s3:// and writes its results there too.
    out = subprocess.run(
        [
            str(llmreplay_binary()), "replay", "s3://caps/prod", "--target", sim,
            "--speedup", "20", "--quiet",
            "--results", "s3://caps/runs/r1.parquet", "--save-result", "s3://caps/runs/r1.json",
        ],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert keys(client, "runs/") == ["runs/r1.json", "runs/r1.parquet"]
    got = con.sql(
        "SELECT count(*), count(DISTINCT request_id) FROM read_parquet('s3://caps/runs/r1.parquet')"
    ).fetchone()
    assert got == (n, n)
    body = client.get_object(Bucket="caps", Key="runs/r1.json")["Body"].read()
    assert b'"completed": %d' % n in body


def test_store_down_keeps_files_in_the_spool_until_the_next_capture(s3, sim, tmp_path):
    endpoint, client, env = s3
    spool = tmp_path / "spool"
    down = dict(env, AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}")
    rc, err = capture(sim, "s3://caps/later", down, spool, 5)
    # Requests were served and recorded; the upload failed, so the capture says so and
    # exits 1, naming the spool that keeps the file.
    assert rc == 1, err
    assert "could not be uploaded" in err and str(spool) in err, err
    left = sorted(spool.glob("*.parquet"))
    assert len(left) == 1
    assert keys(client, "later/") == []

    # The next capture with the same spool uploads the leftover file first.
    rc, err = capture(sim, "s3://caps/later", env, spool, 2)
    assert rc == 0, err
    objects = keys(client, "later/")
    assert len(objects) == 2, objects
    assert any(k.endswith(left[0].name) for k in objects), objects
    out = subprocess.run(
        [str(llmreplay_binary()), "inspect", "s3://caps/later", "--json"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert '"rows": 7' in out.stdout, out.stdout


def test_missing_prefix_and_bad_credentials_are_clear_errors(s3):
    endpoint, client, env = s3
    out = subprocess.run(
        [str(llmreplay_binary()), "inspect", "s3://caps/nothing-here"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 1
    assert "s3://caps/nothing-here: no trace files found" in out.stderr, out.stderr
    out = subprocess.run(
        [str(llmreplay_binary()), "inspect", "s3://no-such-bucket/x"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 1
    assert "s3://no-such-bucket/x" in out.stderr, out.stderr
    assert "panicked" not in out.stderr


def test_import_reads_a_public_trace_from_s3(s3, tmp_path):
    """`llmreplay import s3://…` gives the same rows as importing the local file."""
    _, client, env = s3
    csv = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(50):
        lines.append(f"2023-11-16 18:{15 + i // 60:02d}:{i % 60:02d}.{i * 7919 % 10**7:07d},{100 + 13 * i},{5 + i % 17}")
    csv.write_text("\n".join(lines) + "\n")
    client.upload_file(str(csv), "caps", "public/AzureLLMInferenceTrace_conv.csv")
    url = "s3://caps/public/AzureLLMInferenceTrace_conv.csv"
    url_out, file_out = tmp_path / "url.parquet", tmp_path / "file.parquet"
    subprocess.run([str(llmreplay_binary()), "import", url, "-o", str(url_out)],
                   env=env, check=True, capture_output=True, timeout=120)
    subprocess.run([str(llmreplay_binary()), "import", str(csv), "-o", str(file_out)],
                   check=True, capture_output=True, timeout=120)
    import pyarrow.parquet as pq

    a, b = pq.read_table(url_out), pq.read_table(file_out)
    assert a.num_rows == b.num_rows == 50
    for col in ("request_id", "arrival_time", "prompt_tokens", "output_tokens"):
        assert a.column(col).to_pylist() == b.column(col).to_pylist(), col
    assert pq.read_metadata(url_out).metadata[b"llmreplay.source"] == f"azure:{url}".encode()
    # A key that is not there: a clear one-line error naming it.
    r = subprocess.run([str(llmreplay_binary()), "import", url + ".missing", "-o", str(tmp_path / "x.parquet")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert url + ".missing" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_merge_and_report_stream_shard_results_from_s3(s3, sim, tmp_path):
    """`merge` and `report --results/--trace` read an s3:// prefix the way `inspect` does
    (streamed, object by object), and `merge` writes its outputs there."""
    _, client, env = s3
    trace = tmp_path / "t.parquet"
    subprocess.run(
        [str(llmreplay_binary()), "synth", "-o", str(trace), "--num-prompts", "40",
         "--input-len", "16", "--output-len", "4", "--request-rate", "20"],
        check=True, capture_output=True, timeout=60,
    )
    # 40 requests at 20 req/s span ~2 s: an arrival curve (one second of arrivals is no curve,
    # and the report draws none).
    client.upload_file(str(trace), "caps", "shardtrace/t.parquet")
    for k in range(2):
        out = subprocess.run(
            [str(llmreplay_binary()), "replay", "s3://caps/shardtrace", "--target", sim,
             "--shard", f"{k}/2", "--quiet",
             "--results", f"s3://caps/shards/r{k}.parquet", "--save-result", f"s3://caps/shards/r{k}.json"],
            env=env, capture_output=True, text=True, timeout=120,
        )
        assert out.returncode == 0, out.stderr
    out = subprocess.run(
        [str(llmreplay_binary()), "merge", "s3://caps/shards", "-o", "s3://caps/merged/m"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "merged 40 rows of 2 runs" in out.stdout, out.stdout
    assert keys(client, "merged/") == ["merged/m.json", "merged/m.parquet"]
    merged = tmp_path / "m.parquet"
    client.download_file("caps", "merged/m.parquet", str(merged))
    import pyarrow.parquet as pq

    t = pq.read_table(merged)
    assert t.num_rows == 40 and len(set(t.column("request_id").to_pylist())) == 40
    arrivals = t.column("arrival_time").to_pylist()
    assert arrivals == sorted(arrivals), "rows in arrival order"
    body = client.get_object(Bucket="caps", Key="merged/m.json")["Body"].read()
    assert b'"num_prompts": 40' in body, body[:300]

    # report: the result JSON is local, the rows and the trace on the store.
    result = tmp_path / "r0.json"
    client.download_file("caps", "shards/r0.json", str(result))
    html = tmp_path / "report.html"
    out = subprocess.run(
        [str(llmreplay_binary()), "report", str(result), "--results", "s3://caps/shards",
         "--trace", "s3://caps/shardtrace", "-o", str(html)],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    text = html.read_text()
    assert "TTFT distribution" in text and "estimated" not in text
    assert "Arrival" in text or "arrival" in text


# A fleet's day on the store (issue 56): 4 captures × 24 hourly partitions, each capture under
# its own prefix, as `capture --out s3://…/pod-K` lays them out.
FLEET_DAY = "2026-11-29"
FLEET_PODS = 4
FLEET_ROWS = 75  # requests through each capture
FLEET_PROMPT = 32 * 1024  # bytes of prompt per request, recorded (--privacy full)
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def utc_us(us: int) -> str:
    """µs since the epoch as llmreplay prints it (RFC 3339, µs, UTC)."""
    return (EPOCH + datetime.timedelta(microseconds=us)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def day_us(hour: int) -> int:
    start = datetime.datetime.fromisoformat(f"{FLEET_DAY}T00:00:00+00:00")
    return (start - EPOCH) // datetime.timedelta(microseconds=1) + hour * 3_600_000_000


def post_prompt(url: str, pod: int, i: int):
    # A long shared prefix (a system prompt), the request's own words at the end.
    own = f" pod {pod} request {i}"
    words = ("lorem ipsum dolor sit amet consectetur " * (FLEET_PROMPT // 40))[: FLEET_PROMPT - len(own)] + own
    body = json.dumps({"model": "m", "prompt": words, "max_tokens": 3, "stream": i % 2 == 0})
    req = urllib.request.Request(
        url + "/v1/completions", data=body.encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
        r.read()


# Runs argv[2:] and writes the peak RSS (KiB) of that process alone to argv[1]. A process
# forked from pytest (hundreds of MiB of tables here) starts with pytest's high-water mark,
# which Linux carries across exec; one forked from this small launcher starts with its own.
MEASURE = (
    "import os, subprocess, sys\n"
    "p = subprocess.Popen(sys.argv[2:])\n"
    "_, status, usage = os.wait4(p.pid, 0)\n"
    "open(sys.argv[1], 'w').write(str(usage.ru_maxrss))\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def run_measured(args, env, out_path: Path):
    """Runs llmreplay with stdout to `out_path`; returns (exit code, stderr, peak RSS in bytes
    of the llmreplay process alone, from wait4's rusage in a small launcher)."""
    rss = Path(str(out_path) + ".rss")
    with open(out_path, "w") as out, open(str(out_path) + ".err", "w") as err:
        rc = subprocess.run(
            [sys.executable, "-c", MEASURE, str(rss), str(llmreplay_binary()), *args],
            env=env, stdout=out, stderr=err, timeout=300,
        ).returncode
    return rc, Path(str(out_path) + ".err").read_text(), int(rss.read_text()) * 1024


def fleet_day(sim: str, client, tmp_path: Path):
    """The 96 partitions: four real captures (--capture-id pod-K, one --hash-key-file, bodies
    recorded) of FLEET_ROWS requests each, each capture's file placed in each hour of the day
    (its arrivals, request ids and footer's recorded extent moved there, one capture start per
    pod) and uploaded to fleet/pod-K/date=…/hour=HH/capture-….parquet. Returns each
    (pod, hour)'s arrivals and the bytes of recorded bodies over the whole day."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    key = tmp_path / "fleet.key"
    key.write_text("5eed" * 16 + "\n")  # one key for the fleet (256 bits, hex)
    key.chmod(0o600)
    arrivals, body_bytes = {}, 0
    for pod in range(FLEET_PODS):
        out = tmp_path / f"pod-{pod}"
        port = free_port()
        proc = subprocess.Popen(
            [str(llmreplay_binary()), "capture", "--listen", f"127.0.0.1:{port}", "--upstream", sim,
             "--out", str(out), "--no-admin", "--drain-timeout", "5s", "--capture-id", f"pod-{pod}",
             "--privacy", "full", "--hash-key-file", str(key)],
            stderr=subprocess.PIPE, text=True,
        )
        try:
            wait_port(port, proc, "llmreplay capture")
            for i in range(FLEET_ROWS):
                post_prompt(f"http://127.0.0.1:{port}", pod, i)
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, err
        files = sorted(out.glob("*.parquet"))
        assert len(files) == 1, files
        table = pq.read_table(files[0])
        kv = dict(pq.read_metadata(files[0]).metadata)
        assert table.num_rows == FLEET_ROWS
        assert set(table.column("capture_id").to_pylist()) == {f"pod-{pod}"}
        at = pc.cast(table.column("arrival_time"), pa.int64()).to_pylist()
        started = day_us(0) - 3_600_000_000 + pod  # the pod started an hour before the day
        body_bytes += 24 * sum(len(b) for b in table.column("body").to_pylist())
        for hour in range(24):
            shift = day_us(hour) + 60_000_000 + pod * 1_000 - min(at)
            moved = [a + shift for a in at]
            arrivals[(pod, hour)] = moved
            t = table
            for name, values in (
                ("arrival_time", moved),
                ("capture_started", [started] * table.num_rows),
            ):
                i = t.schema.get_field_index(name)
                t = t.set_column(i, t.schema.field(i), pa.array(values, pa.int64()).cast(t.schema.field(i).type))
            i = t.schema.get_field_index("request_id")
            t = t.set_column(i, "request_id", pa.array([f"{r}-h{hour:02d}" for r in table.column("request_id").to_pylist()]))
            order = json.loads(kv[b"llmreplay.arrival_order"])
            order["first_arrival_us"] += shift
            order["last_arrival_us"] += shift
            caps = json.loads(kv[b"llmreplay.captures"])
            for c in caps:
                c["started_us"] = started
            meta = {**{k: v for k, v in kv.items() if k != b"ARROW:schema"},
                    b"llmreplay.arrival_order": json.dumps(order).encode(),
                    b"llmreplay.captures": json.dumps(caps).encode()}
            local = tmp_path / f"p{pod}-h{hour:02d}.parquet"
            pq.write_table(t.replace_schema_metadata(meta), local, compression="zstd")
            name = f"capture-{FLEET_DAY.replace('-', '')}T{hour:02d}0100Z-{hour:06d}.parquet"
            client.upload_file(str(local), "caps", f"fleet/pod-{pod}/date={FLEET_DAY}/hour={hour:02d}/{name}")
            local.unlink()
    return arrivals, body_bytes


@pytest.fixture
def roomy_sim():
    """A sim of fixed timing (1 ms to the first token, 1 ms a token) and the default profile's
    context: FLEET_PROMPT is beyond `tiny`'s 1,024 tokens."""
    yield from serve_sim("--fixed-timing", "1,1")


def test_a_fleet_day_of_hourly_partitions_reads_as_one_trace_in_a_window(s3, roomy_sim, tmp_path):
    """24 hourly partitions of 4 captures under one prefix are one trace to `inspect` and
    `replay` with --since/--until: exactly the rows of the window, per capture and in total,
    each capture's span said; the reader's memory bounded by the files open at once (the 4
    captures' files of an hour, a batch of rows decoded in each), not by the window: `inspect`
    over 8 hours costs less than a quarter of the 7 extra hours' recorded bodies over 1 hour,
    and the day's bodies alone are twice that bound."""
    _, client, env = s3
    sim = roomy_sim
    arrivals, day_bytes = fleet_day(sim, client, tmp_path)
    assert len(keys(client, "fleet/")) == FLEET_PODS * 24
    since, until, hour_end = f"{FLEET_DAY}T06:00:00Z", f"{FLEET_DAY}T14:00:00Z", f"{FLEET_DAY}T07:00:00Z"
    hours = range(6, 14)
    want = {
        f"pod-{p}": (
            len(hours) * FLEET_ROWS,
            utc_us(min(arrivals[(p, hours[0])])),
            utc_us(max(arrivals[(p, hours[-1])])),
        )
        for p in range(FLEET_PODS)
    }
    total = sum(n for n, _, _ in want.values())
    hour_bytes = day_bytes // 24
    extra = (len(hours) - 1) * hour_bytes // 4  # a quarter of the 7 more hours' bodies

    def measured(command, *extra_args, until=until, name="window"):
        return run_measured([*command, "s3://caps/fleet", "--since", since, "--until", until, *extra_args],
                            env, tmp_path / f"{name}.out")

    # inspect: the window's rows, per capture (rows, first and last arrival) and in total.
    rc, err, one_hour = measured(["inspect", "--json"], until=hour_end, name="hour")
    assert rc == 0, err
    assert json.loads((tmp_path / "hour.out").read_text())["rows"] == FLEET_PODS * FLEET_ROWS
    rc, err, rss = measured(["inspect", "--json"])
    assert rc == 0, err
    summary = json.loads((tmp_path / "window.out").read_text())
    assert summary["rows"] == total
    got = {c["id"]: (c["rows"], c["first_arrival"], c["last_arrival"]) for c in summary["captures"]["captures"]}
    assert got == want
    bound = one_hour + extra
    print(f"fleet day: {total} of {FLEET_PODS * 24 * FLEET_ROWS} rows in the window; recorded bodies "
          f"{day_bytes >> 20} MiB a day, {hour_bytes >> 20} MiB an hour; inspect peak RSS {rss >> 20} MiB "
          f"over 8 hours, {one_hour >> 20} MiB over 1 (bound {bound >> 20} MiB)")
    assert day_bytes > 2 * bound
    assert rss < bound, f"inspect held {rss >> 20} MiB, bound {bound >> 20} MiB"

    # replay: every row of the window sent (and none other), each capture's share said.
    results = tmp_path / "replayed.json"
    replay = ["replay", "--target", sim, "--speedup", "1200", "--max-concurrency", "16", "--quiet",
              "--save-result", str(results)]
    rc, err, one_hour = measured(replay, until=hour_end, name="hour")
    assert rc == 0, err
    rc, err, rss = measured(replay)
    assert rc == 0, err
    done = json.loads(results.read_text())
    assert (done["num_prompts"], done["completed"]) == (total, total), {k: done.get(k) for k in ("num_prompts", "completed")}
    assert f"trace: {total} rows in the window [{since[:-1]}.000000Z, {until[:-1]}.000000Z) from 4 capture(s):" in err, err
    for pod, (n, first, last) in want.items():
        assert f"  {pod} (started " in err and f"): {n} rows, {first} → {last} (" in err, err
    # The engine holds more than the reader: its look-ahead builds up to 5 s of schedule ahead
    # (here 100 minutes of the trace) and keeps per-request state, so its peak grows with the
    # window; what is asserted is that it stays far below a load of the day (whose bodies
    # alone are twice the allowance over the 1-hour run).
    bound = one_hour + day_bytes // 2
    print(f"fleet day: replay peak RSS {rss >> 20} MiB over 8 hours, {one_hour >> 20} MiB over 1 "
          f"(bound {bound >> 20} MiB)")
    assert rss < bound, f"replay held {rss >> 20} MiB, bound {bound >> 20} MiB"

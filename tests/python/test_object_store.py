"""Traces on object storage (issue 8): `capture --out s3://...` into a local S3-compatible
server (moto in server mode, on loopback, started here), read back by `llmreplay inspect`,
by `llmreplay replay` and by DuckDB's own s3:// reader with Hive partitions; results written
to s3://; and a store that is down delays files without losing them.
"""

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


@pytest.fixture(scope="module")
def sim():
    port = free_port()
    proc = subprocess.Popen(
        [str(llmreplay_binary()), "sim", "--listen", f"127.0.0.1:{port}", "--profile", "tiny"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, proc, "llmreplay sim")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


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

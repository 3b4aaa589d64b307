"""The committed samples, read by DuckDB, pandas (pyarrow engine) and Polars.

Each library computes the same facts about a trace file natively (SQL, DataFrame
operations); the facts must agree across libraries and with what llmreplay itself reported
in the inspect JSON and the --save-result JSON. Values are compared, not just "it opens".
"""

import math
import re
from datetime import datetime, timezone

import duckdb
import pandas as pd
import polars as pl
import pyarrow.parquet as pq
import pytest

from conftest import (
    OUTCOMES,
    REPLAY_PARQUET,
    SYNTH_PARQUET,
    columns_of_version,
    llmreplay_binary,
    schema_version,
)

FILES = {"replay": REPLAY_PARQUET, "synth": SYNTH_PARQUET}
LIBRARIES = ["duckdb", "pandas", "polars"]


def _iso_to_us(s: str) -> int:
    """'2026-11-29T16:29:30.503661Z' -> µs since the epoch."""
    dt = datetime.strptime(s.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")
    delta = dt - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def lit(path) -> str:
    """A path as a SQL string literal (DuckDB cannot bind parameters in CREATE VIEW)."""
    return "'" + str(path).replace("'", "''") + "'"


def duck(path=REPLAY_PARQUET):
    """A DuckDB connection with view `t` over a Parquet file, timestamps shown in UTC."""
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet({lit(path)})")
    return con


# --- one summary per library, each computed with that library's own operations -------------


def summarize_duckdb(path):
    con = duck(path)
    types = dict(con.execute("SELECT column_name, column_type FROM (DESCRIBE t)").fetchall())
    rows, streamed, first_us = con.execute(
        "SELECT count(*), count(*) FILTER (WHERE stream), epoch_us(min(arrival_time)) FROM t"
    ).fetchone()
    outcomes = dict(con.execute("SELECT outcome, count(*) FROM t GROUP BY outcome").fetchall())
    ok_streamed, ok_streamed_bad = con.execute(
        """
        SELECT count(*),
               count(*) FILTER (WHERE NOT coalesce(
                   len(chunk_times_us) >= 1
                   AND ttft_us = chunk_times_us[1]
                   AND e2el_us = chunk_times_us[-1], false))
        FROM t WHERE outcome = 'ok' AND stream
        """
    ).fetchone()
    ok_in, ok_out, completed, failed = con.execute(
        """
        SELECT coalesce(sum(prompt_tokens) FILTER (WHERE outcome = 'ok'), 0),
               coalesce(sum(output_tokens) FILTER (WHERE outcome = 'ok'), 0),
               count(*) FILTER (WHERE outcome = 'ok'),
               count(*) FILTER (WHERE outcome <> 'ok')
        FROM t
        """
    ).fetchone()
    con.close()
    return {
        "columns": set(types),
        "arrival_time_utc": types["arrival_time"] == "TIMESTAMP WITH TIME ZONE",
        "rows": rows,
        "streamed": streamed,
        "first_arrival_us": first_us,
        "outcomes": outcomes,
        "ok_streamed": ok_streamed,
        "ok_streamed_bad": ok_streamed_bad,
        "ok_input_tokens": int(ok_in),
        "ok_output_tokens": int(ok_out),
        "completed": completed,
        "failed": failed,
    }


def summarize_pandas(path):
    df = pd.read_parquet(path, engine="pyarrow")
    dtype = df["arrival_time"].dtype
    ok = df[df["outcome"] == "ok"]
    ok_streamed = ok[ok["stream"]]
    bad = 0
    for ttft, e2el, chunks in zip(
        ok_streamed["ttft_us"], ok_streamed["e2el_us"], ok_streamed["chunk_times_us"]
    ):
        if (
            chunks is None
            or len(chunks) < 1
            or pd.isna(ttft)
            or pd.isna(e2el)
            or int(ttft) != int(chunks[0])
            or int(e2el) != int(chunks[-1])
        ):
            bad += 1
    first = df["arrival_time"].min()
    return {
        "columns": set(df.columns),
        "arrival_time_utc": isinstance(dtype, pd.DatetimeTZDtype) and str(dtype.tz) == "UTC",
        "rows": len(df),
        "streamed": int(df["stream"].sum()),
        "first_arrival_us": int(first.value // 1000),  # Timestamp.value is always ns
        "outcomes": {k: int(v) for k, v in df["outcome"].value_counts().items()},
        "ok_streamed": len(ok_streamed),
        "ok_streamed_bad": bad,
        "ok_input_tokens": int(ok["prompt_tokens"].fillna(0).sum()),
        "ok_output_tokens": int(ok["output_tokens"].fillna(0).sum()),
        "completed": len(ok),
        "failed": int((df["outcome"] != "ok").sum()),
    }


def summarize_polars(path):
    df = pl.read_parquet(path)
    dtype = df.schema["arrival_time"]
    ok = df.filter(pl.col("outcome") == "ok")
    ok_streamed = ok.filter(pl.col("stream"))
    good = (
        (pl.col("chunk_times_us").list.len() >= 1)
        & (pl.col("ttft_us") == pl.col("chunk_times_us").list.first())
        & (pl.col("e2el_us") == pl.col("chunk_times_us").list.last())
    ).fill_null(False)
    bad = ok_streamed.filter(~good).height
    first = df.select(pl.col("arrival_time").min().dt.epoch("us")).item()
    return {
        "columns": set(df.columns),
        "arrival_time_utc": isinstance(dtype, pl.Datetime) and dtype.time_zone == "UTC",
        "rows": df.height,
        "streamed": int(df["stream"].sum()),
        "first_arrival_us": int(first),
        "outcomes": {
            r["outcome"]: int(r["n"])
            for r in df.group_by("outcome").agg(pl.len().alias("n")).to_dicts()
        },
        "ok_streamed": ok_streamed.height,
        "ok_streamed_bad": bad,
        "ok_input_tokens": int(ok["prompt_tokens"].fill_null(0).sum()),
        "ok_output_tokens": int(ok["output_tokens"].fill_null(0).sum()),
        "completed": ok.height,
        "failed": df.filter(pl.col("outcome") != "ok").height,
    }


SUMMARIZERS = {
    "duckdb": summarize_duckdb,
    "pandas": summarize_pandas,
    "polars": summarize_polars,
}

_cache = {}


def summary(lib, which):
    key = (lib, which)
    if key not in _cache:
        _cache[key] = SUMMARIZERS[lib](FILES[which])
    return _cache[key]


def inspect_for(which, replay_inspect, synth_inspect):
    return replay_inspect if which == "replay" else synth_inspect


def nonzero(counts):
    return {k: v for k, v in counts.items() if v}


# --- every library, both files --------------------------------------------------------------

both = pytest.mark.parametrize("which", ["replay", "synth"])
libs = pytest.mark.parametrize("lib", LIBRARIES)


@both
@libs
def test_documented_columns_present(lib, which):
    cols = columns_of_version(schema_version(FILES[which]))
    missing = [c for c in cols if c not in summary(lib, which)["columns"]]
    assert not missing, f"{lib} does not see columns {missing} in {FILES[which].name}"


@both
@libs
def test_arrival_time_is_utc_timestamp(lib, which):
    assert summary(lib, which)["arrival_time_utc"], (
        f"{lib}: arrival_time of {FILES[which].name} is not a timezone-aware UTC timestamp"
    )


@both
def test_arrival_time_is_utc_in_parquet_schema(which):
    field = pq.read_schema(FILES[which]).field("arrival_time")
    assert str(field.type) == "timestamp[us, tz=UTC]"


@both
@libs
def test_rows_and_first_arrival_match_inspect(lib, which, replay_inspect, synth_inspect):
    ins = inspect_for(which, replay_inspect, synth_inspect)
    s = summary(lib, which)
    assert s["rows"] == ins["rows"]
    assert s["first_arrival_us"] == _iso_to_us(ins["first_arrival"])


@both
@libs
def test_outcome_counts_match_inspect(lib, which, replay_inspect, synth_inspect):
    ins = inspect_for(which, replay_inspect, synth_inspect)
    got = summary(lib, which)["outcomes"]
    assert set(got) <= set(OUTCOMES), f"unknown outcomes {set(got) - set(OUTCOMES)}"
    assert nonzero(got) == nonzero(ins["outcomes"])


@both
@libs
def test_streamed_rows_match_inspect(lib, which, replay_inspect, synth_inspect):
    ins = inspect_for(which, replay_inspect, synth_inspect)
    assert summary(lib, which)["streamed"] == ins["streamed"]


@both
def test_libraries_agree(which):
    base = summary("duckdb", which)
    for lib in LIBRARIES[1:]:
        other = summary(lib, which)
        diff = {k: (base[k], other[k]) for k in base if base[k] != other[k]}
        assert not diff, f"duckdb vs {lib} on {FILES[which].name}: {diff}"


@libs
def test_ok_streamed_rows_have_consistent_chunks(lib):
    s = summary(lib, "replay")
    assert s["ok_streamed"] > 0
    assert s["ok_streamed_bad"] == 0, (
        f"{lib}: {s['ok_streamed_bad']} of {s['ok_streamed']} ok streamed rows break "
        "len(chunk_times_us) >= 1, ttft_us == chunk_times_us[0], e2el_us == chunk_times_us[-1]"
    )


@libs
def test_totals_match_result_json(lib, result):
    s = summary(lib, "replay")
    assert s["ok_output_tokens"] == result["total_output_tokens"]
    assert s["ok_input_tokens"] == result["total_input_tokens"]
    assert s["completed"] == result["completed"]
    assert s["failed"] == result["failed"]
    assert s["rows"] == result["num_prompts"]
    assert nonzero(s["outcomes"]) == nonzero(result["llmreplay"]["outcomes"])


# --- what the sample is said to be ----------------------------------------------------------


def test_sample_replay_has_the_promised_mix(replay_inspect, synth_inspect):
    """A few hundred requests, streamed and not, 500s and 429s, and mid-stream resets."""
    con = duckdb.connect()
    statuses = {
        s for (s,) in con.execute(
            "SELECT DISTINCT status FROM read_parquet(?) WHERE outcome = 'http_error'",
            [str(REPLAY_PARQUET)],
        ).fetchall()
    }
    assert {500, 429} <= statuses
    oc = replay_inspect["outcomes"]
    assert replay_inspect["rows"] >= 200
    assert oc["ok"] > 0 and oc["http_error"] > 0 and oc["upstream_error"] > 0
    assert 0 < replay_inspect["streamed"] < replay_inspect["rows"]
    # The replay streams exactly the rows the trace streamed, and keeps their ids.
    assert replay_inspect["streamed"] == synth_inspect["streamed"]
    assert replay_inspect["rows"] == synth_inspect["rows"]
    mism = con.execute(
        """
        SELECT count(*) FILTER (WHERE s.request_id IS NULL),
               count(*) FILTER (WHERE r.stream <> s.stream),
               count(*) FILTER (WHERE r.outcome = 'ok' AND r.output_tokens <> s.output_tokens)
        FROM read_parquet(?) r LEFT JOIN read_parquet(?) s USING (request_id)
        """,
        [str(REPLAY_PARQUET), str(SYNTH_PARQUET)],
    ).fetchone()
    # (no such request, stream differs, ok with another output length than recorded)
    assert mism == (0, 0, 0)


@pytest.mark.parametrize(
    "which,producer", [("replay", "replay"), ("synth", "synth")]
)
def test_parquet_key_value_metadata(which, producer):
    md = pq.read_metadata(FILES[which]).metadata
    assert schema_version(FILES[which])[0] == 1, md[b"llmreplay.schema_version"]
    assert md[b"llmreplay.producer"] == producer.encode()


@libs
def test_a_fresh_trace_has_every_column_of_its_version(lib, tmp_path):
    """A file the current build writes (its version, 1.1 or later) has the session columns,
    typed as documented, and each library reads them (null where nothing was linked)."""
    import subprocess

    binary = llmreplay_binary()
    if not binary.exists():
        pytest.skip(f"{binary} not built")
    out = tmp_path / "fresh.parquet"
    subprocess.run(
        [str(binary), "synth", "-o", str(out), "--num-prompts", "5", "--seed", "1"],
        check=True,
        capture_output=True,
    )
    version = schema_version(out)
    assert version >= (1, 1), version
    cols = columns_of_version(version)
    types = {f.name: str(f.type) for f in pq.read_schema(out)}
    assert types["parent_request_id"] == "string" and types["think_time_us"] == "int64"
    if lib == "duckdb":
        names = [r[0] for r in duckdb.sql(f"DESCRIBE SELECT * FROM {lit(out)}").fetchall()]
        nulls = duckdb.sql(
            f"SELECT count(*) FROM {lit(out)} WHERE parent_request_id IS NULL"
        ).fetchone()[0]
    elif lib == "pandas":
        df = pd.read_parquet(out, engine="pyarrow")
        names, nulls = list(df.columns), int(df["parent_request_id"].isna().sum())
    else:
        df = pl.read_parquet(out)
        names, nulls = df.columns, df["parent_request_id"].null_count()
    assert [c for c in cols if c not in names] == []
    assert nulls == 5


def test_trace_identity_hash_matches_result(result):
    """trace.content_hash is FNV-1a 64 over (request_id, arrival_time µs LE) of every row."""
    t = pq.read_table(SYNTH_PARQUET, columns=["request_id", "arrival_time"])
    h = 0xCBF29CE484222325
    for rid, ts in zip(
        t.column("request_id").to_pylist(),
        t.column("arrival_time").cast("int64").to_pylist(),
    ):
        for b in rid.encode() + ts.to_bytes(8, "little", signed=True):
            h ^= b
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    trace = result["llmreplay"]["trace"]
    assert trace["content_hash"] == f"{h:016x}"
    assert trace["rows"] == t.num_rows
    assert trace["selected_rows"] == t.num_rows


def test_detailed_arrays_follow_the_rows(result):
    """--save-detailed arrays are per request in schedule order; the Parquet rows are written
    as requests finish, so in that order once sorted by their scheduled offset."""
    t = pq.read_table(
        REPLAY_PARQUET,
        columns=[
            "outcome", "prompt_tokens", "output_tokens", "ttft_us", "chunk_times_us", "error",
            "scheduled_offset_us",
        ],
    ).to_pylist()
    t.sort(key=lambda r: r["scheduled_offset_us"])
    n = result["num_prompts"]
    for k in ("input_lens", "output_lens", "ttfts", "itls", "errors"):
        assert len(result[k]) == n, k
    assert result["input_lens"] == [r["prompt_tokens"] or 0 for r in t]
    assert result["output_lens"] == [
        (r["output_tokens"] or 0) if r["outcome"] == "ok" else 0 for r in t
    ]
    assert sum(result["output_lens"]) == result["total_output_tokens"]
    assert result["errors"] == [r["error"] or "" for r in t]
    assert sum(1 for e in result["errors"] if e) == result["failed"]
    for got, r in zip(result["ttfts"], t):
        want = (r["ttft_us"] or 0) / 1e6 if r["outcome"] == "ok" else 0.0
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)
    for got, r in zip(result["itls"], t):
        c = r["chunk_times_us"] if r["outcome"] == "ok" else []
        want = [(b - a) / 1e6 for a, b in zip(c, c[1:])]
        assert len(got) == len(want)
        assert all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12) for x, y in zip(got, want))


# --- the metrics, recomputed in SQL ---------------------------------------------------------


def close(a, b, rel=1e-6):
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-9)


def test_duckdb_p99_ttft_matches_result(result):
    """The question people ask first, in the SQL they would write."""
    (p99,) = (
        duckdb.connect()
        .execute(
            f"SELECT quantile_cont(ttft_us, 0.99) / 1000 FROM read_parquet({lit(REPLAY_PARQUET)}) "
            "WHERE outcome = 'ok'"
        )
        .fetchone()
    )
    assert close(p99, result["p99_ttft_ms"]), (p99, result["p99_ttft_ms"])


# Per-request values of each metric over ok rows, ms (shared/docs/metrics.md).
METRIC_SQL = {
    "ttft": "SELECT ttft_us / 1000 AS v FROM t WHERE outcome = 'ok' AND ttft_us IS NOT NULL",
    "e2el": "SELECT e2el_us / 1000 AS v FROM t WHERE outcome = 'ok' AND e2el_us IS NOT NULL",
    "tpot": """SELECT ((e2el_us - ttft_us) / 1000) / (output_tokens - 1) AS v FROM t
               WHERE outcome = 'ok' AND output_tokens > 1
                 AND e2el_us IS NOT NULL AND ttft_us IS NOT NULL""",
    "itl": """SELECT (c[i + 1] - c[i]) / 1000 AS v FROM (
                  SELECT chunk_times_us AS c, unnest(range(1, len(chunk_times_us))) AS i
                  FROM t WHERE outcome = 'ok')""",
}


@pytest.mark.parametrize("metric", ["ttft", "tpot", "itl", "e2el"])
def test_duckdb_summaries_match_result(metric, result):
    con = duck()
    keys = {
        k: float(m.group(1)) / 100
        for k in result
        if (m := re.fullmatch(rf"p([0-9.]+)_{metric}_ms", k))
    }
    assert keys, f"no percentile keys for {metric} in the result"
    quantiles = ", ".join(f"quantile_cont(v, {q!r})" for q in keys.values())
    row = con.execute(
        f"SELECT count(*), avg(v), median(v), stddev_pop(v), {quantiles} FROM ({METRIC_SQL[metric]})"
    ).fetchone()
    n, mean, median, std, *ps = row
    assert n > 0
    assert close(mean, result[f"mean_{metric}_ms"])
    assert close(median, result[f"median_{metric}_ms"])
    assert close(std, result[f"std_{metric}_ms"], rel=1e-5)
    for (key, _), got in zip(keys.items(), ps):
        assert close(got, result[key]), (key, got, result[key])


def test_duckdb_goodput_matches_result(result):
    """Goodput: ok rows with TTFT ≤ 200 ms and TPOT ≤ 20 ms (TPOT passes when ≤ 1 output token);
    neither SLO applies to a request that was not streamed (it has no first token)."""
    assert result["llmreplay"]["goodput_slos"] == {"ttft": 200.0, "tpot": 20.0}
    (good, rows) = duck().execute(
        """
        SELECT count(*) FILTER (WHERE outcome = 'ok'
                 AND (NOT stream OR (ttft_us / 1000 <= 200
                 AND (CASE WHEN output_tokens > 1
                           THEN ((e2el_us - ttft_us) / 1000) / (output_tokens - 1)
                           ELSE 0 END) <= 20))),
               count(*)
        FROM t
        """
    ).fetchone()
    assert 0 < good < rows
    assert close(result["request_goodput"], good / result["duration"])
    assert close(result["llmreplay"]["slo_attainment"], good / rows)
    assert close(result["request_throughput"], result["completed"] / result["duration"])
    assert close(result["output_throughput"], result["total_output_tokens"] / result["duration"])

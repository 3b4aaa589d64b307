"""A capture filtered in DuckDB, pandas or Polars and written back replays (issue 52).

The written-back file has llmreplay's columns but not its metadata, in the writer's own Arrow
types (pandas: floats for integers with nulls, a `null` column for one with only nulls, large
strings, its index as a column; Polars: large strings and lists, zstd; DuckDB: plain types, no
metadata). `inspect`, `replay`, `fidelity` and `report` take it as a trace, say once what they
assumed, and replay exactly the rows the filter kept.

Runs the release binary ($LLMREPLAY, else target/release/llmreplay).
"""

import json
import subprocess

import duckdb
import pandas as pd
import polars as pl
import pyarrow.parquet as pq
import pytest

from conftest import llmreplay_binary

WHERE = "prompt_tokens > 200 AND outcome = 'ok'"


def run(*args, check=True):
    p = subprocess.run(
        [str(llmreplay_binary()), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check:
        assert p.returncode == 0, f"{args}: {p.stdout}\n{p.stderr}"
    return p


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    """A directory of two traces of the current schema, as `import` writes them: Mooncake
    JSON lines, one with AIPerf's sessions (so the session, parent and think-time columns are
    partly null: pandas writes them back as floats)."""
    if not llmreplay_binary().exists():
        pytest.skip(f"{llmreplay_binary()} not built")
    src = tmp_path_factory.mktemp("src")
    cap = tmp_path_factory.mktemp("cap")
    for name, sessions in [("a", False), ("b", True)]:
        lines = []
        for i in range(60):
            row = {"timestamp": 20 * i + (7 if sessions else 0), "input_length": 100 + (37 * i) % 300,
                   "output_length": 5 + i % 7, "hash_ids": list(range(i % 4 + 1))}
            if sessions:
                row["session_id"] = f"s{i % 5}"
                if i >= 5:
                    row["delay"] = 10
            lines.append(json.dumps(row))
        (src / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
        run("import", src / f"{name}.jsonl", "-o", cap / f"{name}.parquet")
    return cap


def written_back(capture, how, out):
    """The capture filtered by WHERE and written back by `how`; returns the kept ids."""
    glob = str(capture / "*.parquet")
    if how == "duckdb":
        duckdb.sql(f"COPY (SELECT * FROM '{glob}' WHERE {WHERE}) TO '{out}' (FORMAT parquet)")
    elif how == "pandas":
        df = pd.read_parquet(capture)
        df.query(WHERE.replace("AND", "and").replace("=", "==")).to_parquet(out)
    else:
        pl.read_parquet(glob).filter(
            (pl.col("prompt_tokens") > 200) & (pl.col("outcome") == "ok")
        ).write_parquet(out)
    ids = duckdb.sql(f"SELECT request_id FROM '{glob}' WHERE {WHERE}").fetchall()
    return sorted(r[0] for r in ids)


@pytest.mark.parametrize("how", ["duckdb", "pandas", "polars"])
def test_a_filtered_capture_written_back_replays_the_filtered_rows(capture, tmp_path, how):
    sub = tmp_path / "sub.parquet"
    want = written_back(capture, how, sub)
    assert 0 < len(want) < 120
    assert b"llmreplay.schema_version" not in (pq.read_metadata(sub).metadata or {})

    inspect = run("inspect", "--json", sub)
    assert json.loads(inspect.stdout)["rows"] == len(want)
    notes = [l for l in inspect.stderr.splitlines() if "inferred from its columns" in l]
    assert len(notes) == 1, inspect.stderr

    results = tmp_path / "results.parquet"
    doc = tmp_path / "run.json"
    rep = run("replay", sub, "--speedup", "100", "--results", results, "--save-result", doc, "-q",
              "--timeout", "60s")
    assert rep.stderr.count("inferred from its columns") == 1, rep.stderr
    got = duckdb.sql(f"SELECT request_id FROM '{results}'").fetchall()
    assert sorted(r[0] for r in got) == want
    assert json.loads(doc.read_text())["completed"] == len(want)

    # The replay's results, written back by the same tool, are read by fidelity and report.
    back = tmp_path / "results-back.parquet"
    if how == "duckdb":
        duckdb.sql(f"COPY (SELECT * FROM '{results}') TO '{back}' (FORMAT parquet)")
    elif how == "pandas":
        pd.read_parquet(results).to_parquet(back)
    else:
        pl.read_parquet(results).write_parquet(back)
    fid = run("fidelity", "--captured", sub, "--replayed", back, "--speedup", "100")
    assert "request" in fid.stdout.lower(), fid.stdout
    report = tmp_path / "report.md"
    run("report", doc, "-o", report, "--results", back, "--trace", sub)
    assert report.read_text().strip()


def test_a_file_of_other_columns_is_still_not_a_trace(tmp_path):
    if not llmreplay_binary().exists():
        pytest.skip(f"{llmreplay_binary()} not built")
    other = tmp_path / "other.parquet"
    pd.DataFrame({"x": [1, 2]}).to_parquet(other)
    p = run("inspect", other, check=False)
    assert p.returncode != 0
    assert "not an llmreplay trace" in p.stderr and "request_id" in p.stderr, p.stderr

"""Shared paths and fixtures for the Python interop and schema tests.

Paths are found from this file's location, so the tests run from any working directory.
The samples are made by samples/make-samples.sh (see samples/README.md).
"""

import itertools
import json
import os
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"
REPLAY_PARQUET = SAMPLES / "sim-replay-300.parquet"
SYNTH_PARQUET = SAMPLES / "synth-300.parquet"
RESULT_JSON = SAMPLES / "sim-replay-300.json"
REPLAY_INSPECT_JSON = SAMPLES / "sim-replay-300.inspect.json"
SYNTH_INSPECT_JSON = SAMPLES / "synth-300.inspect.json"
RESULT_SCHEMA = ROOT / "results" / "result.schema.json"

# The documented columns of trace schema v1 (trace-format/src/schema.rs).
DOCUMENTED_COLUMNS = [
    "request_id",
    "session_id",
    "arrival_time",
    "endpoint",
    "model",
    "stream",
    "prompt_tokens",
    "output_tokens",
    "max_tokens",
    "prompt_tokens_source",
    "output_tokens_source",
    "status",
    "outcome",
    "error",
    "ttft_us",
    "e2el_us",
    "chunk_times_us",
    "chunk_tokens",
    "body",
    "prefix_hashes",
    "request_bytes",
    "response_bytes",
]

# Columns added by a minor version: present in files of that version or later.
COLUMNS_SINCE = {
    (1, 1): ["parent_request_id", "think_time_us"],
    (1, 3): ["trace_id", "span_id"],
    (1, 4): [
        "ttfat_us",
        "reasoning_tokens",
        "reasoning_tokens_source",
        "tools_offered",
        "tool_names",
        "tool_calls",
        "tool_call_names",
        "parent_link",
        "pair_request_id",
    ],
    (1, 5): [
        "cached_tokens",
        "images",
        "image_bytes",
        "image_dims",
        "audio_inputs",
        "audio_bytes",
    ],
}


def schema_version(path) -> tuple:
    """`llmreplay.schema_version` of a trace file as (major, minor)."""
    import pyarrow.parquet as pq

    v = pq.read_metadata(path).metadata[b"llmreplay.schema_version"].decode()
    major, minor = v.split(".")[:2]
    return int(major), int(minor)


def columns_of_version(version) -> list:
    """The documented columns a file of schema `version` has."""
    cols = list(DOCUMENTED_COLUMNS)
    for since, added in sorted(COLUMNS_SINCE.items()):
        if version >= since:
            cols += added
    return cols

OUTCOMES = ["ok", "http_error", "upstream_error", "client_cancelled", "timeout"]


def llmreplay_binary() -> Path:
    """The binary under test: $LLMREPLAY, else target/release/llmreplay."""
    p = Path(os.environ.get("LLMREPLAY", ROOT / "target" / "release" / "llmreplay"))
    return p if p.is_absolute() else ROOT / p


def _load(path: Path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="session")
def result():
    """The --save-result JSON of the sample replay."""
    return _load(RESULT_JSON)


@pytest.fixture(scope="session")
def replay_inspect():
    """`llmreplay inspect --json` of the sample replay's Parquet results."""
    return _load(REPLAY_INSPECT_JSON)


@pytest.fixture(scope="session")
def synth_inspect():
    """`llmreplay inspect --json` of the synthetic trace."""
    return _load(SYNTH_INSPECT_JSON)


@pytest.fixture(scope="session")
def result_schema():
    return _load(RESULT_SCHEMA)


_PORTS = itertools.count()


def free_port() -> int:
    """A loopback port nobody listens on, for a process a test starts to bind.

    Taken below the kernel's ephemeral range, never from it: a port `bind(0)` hands out and
    the test releases goes back to the pool outgoing connections draw their local ports
    from, so another client could hold it by the time the process binds (the Rust tests'
    `free_addr` in tests/integration/support/env.rs, for the same reason).
    """
    first = 10_000
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32_768
    if low <= first + 1_000:
        low = 32_768
    span = low - first
    start = os.getpid() * 89
    for _ in range(span):
        port = first + (start + next(_PORTS)) % span
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {first}..{low}")

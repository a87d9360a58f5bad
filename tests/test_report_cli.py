"""`gpudoctor report` from every kind of input, `analyze --html`, and the annotated trace: it keeps the
original events, adds gpudoctor's tracks, and loads back into gpudoctor (and so into trace viewers)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

from typer.testing import CliRunner, Result

from gpudoctor.analysis.summary import analyze
from gpudoctor.cli.main import app
from gpudoctor.monitor.samples import MonitorRecord
from gpudoctor.report.annotated_trace import CATEGORY, PID, TID_FINDINGS
from gpudoctor.runner.record import RunRecord
from gpudoctor.trace import load_trace

TRACE = Path(__file__).parent / "fixtures" / "traces" / "sync_every_step.json.gz"


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def run_dir(tmp_path: Path) -> Path:
    """A run directory like `gpudoctor demo` writes: the trace and analysis.json."""
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(TRACE, folder / TRACE.name)
    result = run("analyze", folder / TRACE.name, "--json")
    assert result.exit_code == 0
    (folder / "analysis.json").write_text(result.stdout)
    return folder


def test_report_of_a_trace_a_run_directory_and_analysis_json(tmp_path: Path) -> None:
    folder = run_dir(tmp_path)
    for source, name in ((TRACE, "a.html"), (folder, "b.html"), (folder / "analysis.json", "c.html")):
        result = run("report", source, "-o", tmp_path / name)
        assert result.exit_code == 0, result.output
        page = (tmp_path / name).read_text()
        assert 'class="fid">tensor_cores_unused<' in page
        assert 'aria-label="GPU timeline of one step"' in page  # the trace was found for the timeline
    (folder / TRACE.name).unlink()
    result = run("report", folder / "analysis.json", "-o", tmp_path / "d.html")
    assert result.exit_code == 0
    page = (tmp_path / "d.html").read_text()
    assert (
        'class="fid">tensor_cores_unused<' in page
        and "not available: render the report from the trace" in page
    )


def test_markdown_format(tmp_path: Path) -> None:
    result = run("report", TRACE, "--format", "md", "-o", tmp_path / "r.md")
    assert result.exit_code == 0
    assert "| critical |" in (tmp_path / "r.md").read_text()


def test_analyze_html_writes_the_report_too(tmp_path: Path) -> None:
    result = run("analyze", TRACE, "--html", tmp_path / "r.html")
    assert result.exit_code == 0 and "Diagnosis" in result.stdout
    assert "tensor_cores_unused" in (tmp_path / "r.html").read_text()


def test_bad_inputs_are_one_line_errors(tmp_path: Path) -> None:
    result = run("report", tmp_path / "missing.json.gz")
    assert result.exit_code == 2 and "no such file" in result.output
    folder = run_dir(tmp_path)
    (folder / TRACE.name).unlink()
    result = run("report", folder, "--format", "trace", "-o", tmp_path / "t.json.gz")
    assert result.exit_code == 2 and "not found" in result.output


def test_annotated_trace_adds_gpudoctor_tracks_and_loads_back(tmp_path: Path) -> None:
    out = tmp_path / "annotated.json.gz"
    result = run("report", TRACE, "--format", "trace", "-o", out)
    assert result.exit_code == 0, result.output
    with gzip.open(TRACE, "rt") as f:
        original = json.load(f)
    with gzip.open(out, "rt") as f:
        annotated = json.load(f)
    ours = [e for e in annotated["traceEvents"] if e.get("pid") == PID]
    assert annotated["traceEvents"][: len(original["traceEvents"])] == original["traceEvents"]
    assert len(annotated["traceEvents"]) == len(original["traceEvents"]) + len(ours)
    phases = {e["ph"] for e in ours}
    assert phases == {"M", "X", "i", "C"}
    names = {e["name"] for e in ours}
    assert {"GPU idle: host wait", "GPU busy %", "launch queue depth", "process_name"} <= names
    findings = [e for e in ours if e["ph"] == "i"]
    assert {e["args"]["id"] for e in findings} >= {"tensor_cores_unused", "host_sync"}
    assert all(e["s"] == "t" and e["tid"] == TID_FINDINGS for e in findings)

    # GIVEN gpudoctor's own loader THEN the added spans are rows on their own process, and the
    # analysis of the original events is unchanged.
    before, after = load_trace(TRACE), load_trace(out)
    rows = [i for i in range(len(after)) if after.pid[i] == PID]
    assert rows and {after.name_of(i) for i in rows} >= {"GPU idle: host wait"}
    a, b = analyze(before), analyze(after)
    assert [s.duration_us for s in a.steps] == [s.duration_us for s in b.steps]
    assert a.window.busy_us == b.window.busy_us
    # Idle spans line up with the trace's own time: inside the profiled steps.
    spans = [e for e in ours if e["ph"] == "X"]
    lo = a.steps[0].gpu.start_us + before.meta.origin_us
    hi = a.steps[-1].gpu.end_us + before.meta.origin_us
    assert all(lo - 1e-3 <= e["ts"] and e["ts"] + e["dur"] <= hi + 1e-3 for e in spans)
    assert CATEGORY == "gpudoctor"


def test_a_run_directory_with_nvml_samples_shows_their_series(tmp_path: Path) -> None:
    # GIVEN a run directory as `gpudoctor run` writes it, with NVML samples in record.json
    folder = run_dir(tmp_path)
    monitor = MonitorRecord.read_jsonl(Path(__file__).parent / "fixtures" / "nvml" / "burn.jsonl.gz")
    record = RunRecord(
        argv=("train.py",),
        started_at="2026-11-22T03:00:00Z",
        options={},
        environment=None,
        outcome="completed",
        exit_code=0,
        steps_seen=10,
        nvml_samples=tuple(s.to_json() for s in monitor.samples),
    )
    (folder / "record.json").write_text(json.dumps(record.to_json()))
    # WHEN its report is written THEN the NVML section is drawn from them
    result = run("report", folder, "-o", tmp_path / "r.html")
    assert result.exit_code == 0, result.output
    page = (tmp_path / "r.html").read_text()
    assert 'aria-label="NVML samples over time"' in page and "GPU utilization" in page
    run("report", TRACE, "-o", tmp_path / "plain.html")
    assert 'id="nvml"' not in (tmp_path / "plain.html").read_text()  # no samples, no section


DEMO_RUN = Path(__file__).parent / "fixtures" / "runs" / "demo_h100"  # `gpudoctor demo` on the H100


def test_a_run_directory_that_stopped_before_its_analysis_is_reported_from_its_trace(tmp_path: Path) -> None:
    # GIVEN a run directory with its trace, record.json and observer.json but no analysis.json (the run
    # stopped before analyzing) — JSON files of other kinds beside the trace
    folder = tmp_path / "run"
    shutil.copytree(DEMO_RUN, folder)
    assert not (folder / "analysis.json").exists()
    # WHEN reported and analyzed
    report = run("report", folder, "-o", tmp_path / "r.html")
    analyzed = run("analyze", folder)
    # THEN both read the trace, passing over the other JSON, and the report has the run's findings
    assert report.exit_code == 0, report.output
    assert analyzed.exit_code == 0, analyzed.output
    assert "tensor_cores_unused" in (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "NVIDIA H100 80GB HBM3" in analyzed.stdout


def test_a_directory_of_json_that_is_no_trace_is_one_line_and_exit_2(tmp_path: Path) -> None:
    # GIVEN a directory holding only a run's record.json
    shutil.copy(DEMO_RUN / "record.json", tmp_path / "record.json")
    result = run("analyze", tmp_path)
    # THEN one line saying so, not a traceback
    assert result.exit_code == 2
    assert "no trace files" in result.output and "record.json: JSON of another kind" in result.output
    assert "Traceback" not in result.output

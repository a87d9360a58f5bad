"""`gpudoctor demo` end to end on the CPU: the README's first command records, analyzes and writes
its run directory."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpudoctor.analysis.summary import Analysis
from gpudoctor.cli.main import app


def test_demo_records_and_diagnoses_on_the_cpu(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["demo", "--cpu", "--out", str(tmp_path), "--steps", "2", "--light-steps", "3"]
    )
    assert result.exit_code == 0, result.output
    assert "Step time" in result.output and "Top ops" in result.output
    trace = tmp_path / "trace.json.gz"  # the demo is a `gpudoctor run` of a built-in workload
    assert trace.exists() and not (tmp_path / "trace.json").exists()
    assert json.loads((tmp_path / "record.json").read_text())["light_median_us"] > 0
    analysis = Analysis.from_json(json.loads((tmp_path / "analysis.json").read_text())["analysis"])
    # both traced steps (the first one a warm-up where a loaded machine made it far the slower)
    assert [s.number for s in (*analysis.warmup_steps, *analysis.steps)] == [1, 2]
    assert analysis.steps and analysis.unprofiled_step_us
    assert any("CPU-only" in n for n in analysis.notes)
    assert "<!DOCTYPE html>" in (tmp_path / "report.html").read_text()  # the HTML report beside them


def test_demo_lists_its_workloads() -> None:
    result = CliRunner().invoke(app, ["demo", "--list"])
    assert result.exit_code == 0
    assert "sync_every_step" in result.output and "dataloader_bound" in result.output


def test_an_unknown_workload_is_a_one_line_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["demo", "--cpu", "--out", str(tmp_path), "--workload", "nope"])
    assert result.exit_code == 2
    assert "unknown workload 'nope'" in result.output and "Traceback" not in result.output


DEMO_RUN = Path(__file__).parent / "fixtures" / "runs" / "demo_h100"


def test_on_the_cpu_the_demo_also_shows_a_recorded_h100_run_labelled_as_such(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # GIVEN no GPU (or --cpu) WHEN the demo runs
    result = CliRunner().invoke(
        app, ["demo", "--cpu", "--out", str(tmp_path), "--steps", "2", "--light-steps", "3"]
    )
    assert result.exit_code == 0, result.output
    # THEN the H100's run comes first, under a heading that says where it is from, then this machine's
    head, rest = result.output.split(
        "No GPU here. First, the same workload recorded on an NVIDIA H100 80GB HBM3"
    )
    recorded, here = rest.split("This machine: sync_every_step on the CPU, live")
    assert "gpudoctor run:" not in head  # nothing of this machine's run before the recorded one
    assert "not this machine" in recorded and "torch 2.11.0+cu130" in recorded
    assert "[tensor_cores_unused]" in recorded and "[host_sync]" in recorded and "CRITICAL" in recorded
    assert "profiler slows each step by 2%" in recorded
    # and this machine's part says what a CPU run can tell, with no overhead figure for a CPU profile
    assert "the profiler slows each step" not in here and "on the CPU: step times are the host's" in here
    # and leaves out the GPU sections a CPU trace cannot fill, saying once what is missing
    assert "Top kernels" not in here and "Roofline" not in here and "Host synchronizations" not in here
    assert "not available: no GPU activity" not in here
    assert here.count("no GPU activity") == 1
    # its report sits beside the run's own, and `gpudoctor report` reads it
    assert "<!DOCTYPE html>" in (tmp_path / "recorded-h100" / "report.html").read_text()
    analysis = json.loads((tmp_path / "recorded-h100" / "analysis.json").read_text())["analysis"]
    assert analysis["device"]["name"] == "NVIDIA H100 80GB HBM3"
    # the profiler's own log lines went to the run directory, not to the terminal
    terminal = capfd.readouterr()
    assert "profiler_start" not in terminal.out + terminal.err + result.output
    assert "CPUAllocator" not in terminal.err
    assert "profiler_start" in (tmp_path / "profiler.log").read_text()


def test_the_shipped_recording_is_the_fixture_the_tests_use() -> None:
    shipped = resources.files("gpudoctor.workloads") / "recorded" / "sync_every_step_h100"
    for name in ("record.json", "trace.json.gz", "observer.json"):
        assert (shipped / name).read_bytes() == (DEMO_RUN / name).read_bytes()

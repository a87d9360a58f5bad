"""`gpudoctor demo` end to end on the CPU: the README's first command records, analyzes and writes
its run directory."""

from __future__ import annotations

import json
from pathlib import Path

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
    assert [s.number for s in analysis.steps] == [1, 2] and analysis.unprofiled_step_us
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

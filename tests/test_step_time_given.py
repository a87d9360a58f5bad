"""`--step-time-ms`, the step measured without the profiler, where it cannot be right: a note says so
rather than a diagnosis silently built on it (a GPU "busy 100% of each 5 ms step" whose traced steps
hold 17.8 ms of GPU work)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from gpudoctor.analysis.summary import analyze
from gpudoctor.cli.main import app
from gpudoctor.trace import load_trace

TRAIN = Path(__file__).parent / "fixtures" / "traces" / "transformer_train.json.gz"  # H200, 17.8 ms busy


def test_a_step_shorter_than_the_gpu_work_in_a_traced_step_is_flagged() -> None:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["analyze", str(TRAIN), "--step-time-ms", "5"])
    assert result.exit_code == 0, result.output
    assert "note: the step time measured without the profiler (5 ms) is shorter than the GPU's busy time" in (
        result.stdout
    )


def test_a_step_far_longer_than_the_traced_step_is_flagged() -> None:
    # GIVEN a trace whose steps take about 23 ms with the profiler on, and a step time "measured without
    # the profiler" of 100 ms (a typo, another batch size, or the time of several steps)
    trace = load_trace(TRAIN)
    traced_ms = analyze(trace).step_time_us.p50 / 1000  # type: ignore[union-attr]
    # WHEN analyzed with it
    notes = analyze(trace, unprofiled_step_us=100_000.0).notes
    # THEN a note says the profiler cannot have made the step faster, and that the rest is counted as idle
    [note] = [n for n in notes if "measured without the profiler" in n]
    assert f"(100 ms) is {100 / traced_ms:.1f}× the traced step" in note
    assert "cannot make one faster" in note and "counts it as GPU idle" in note


def test_a_plausible_step_time_gets_no_note() -> None:
    trace = load_trace(TRAIN)
    for step_us in (17_000.0, 25_000.0):  # GPU-bound within noise, and host-bound
        notes = analyze(trace, unprofiled_step_us=step_us).notes
        assert not any("measured without the profiler" in n for n in notes), notes
    assert not any("without the profiler" in n for n in analyze(trace).notes)

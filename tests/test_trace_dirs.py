"""A directory of traces that are not one run's ranks: what `analyze` and `report` say about it."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from gpudoctor.cli.main import app


def run(*args: str | Path) -> Result:
    return CliRunner(env={"COLUMNS": "200"}).invoke(app, [str(a) for a in args])


def one_line_error(result: Result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpudoctor: error: "), result.stderr
    return lines[0]


def test_the_cycles_tensorboard_trace_handler_writes_are_not_called_ranks(tmp_path: Path) -> None:
    # GIVEN the directory torch.profiler's tensorboard_trace_handler fills with schedule(repeat=2)
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    x = torch.randn(16, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that each profiler cycle clears its events
        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=0, warmup=1, active=1, repeat=2),
            on_trace_ready=tensorboard_trace_handler(str(tmp_path), use_gzip=True),
        ) as prof:
            for _ in range(5):
                (x @ x).sum()
                prof.step()
    assert len(list(tmp_path.glob("*.pt.trace.json.gz"))) == 2
    # THEN the error says what they are and what to do, for every command that reads a directory
    for args in (("analyze", tmp_path), ("report", tmp_path, "-o", tmp_path / "r.html")):
        line = one_line_error(run(*args))
        assert "both claim rank 0" in line and "not ranks of one run" in line and "analyze one file" in line


def test_two_ranks_of_a_distributed_run_claiming_one_rank_keep_the_old_advice(tmp_path: Path) -> None:
    doc = {
        "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 2},
        "traceEvents": [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0.0, "dur": 900.0, "pid": 1,
             "tid": 1},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10.0, "dur": 500.0, "pid": 1, "tid": 1},
        ],
    }  # fmt: skip
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(json.dumps(doc))
    line = one_line_error(run("analyze", tmp_path))
    assert "both claim rank 0: keep one run's rank traces in a directory" in line


def test_two_cycles_of_each_rank_of_a_distributed_run_are_told_apart_by_cycle(tmp_path: Path) -> None:
    # GIVEN what tensorboard_trace_handler writes for 2 ranks under torch.distributed with
    # schedule(repeat=2): two traces of rank 0 and two of rank 1, all of one run, side by side
    for rank in (0, 1):
        for cycle in (1, 2):
            doc = {
                "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2},
                "traceEvents": [
                    {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{cycle}", "ts": 1000.0 * cycle,
                     "dur": 900.0, "pid": 1 + rank, "tid": 1},
                    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1000.0 * cycle + 10, "dur": 500.0,
                     "pid": 1 + rank, "tid": 1},
                ],
            }  # fmt: skip
            (tmp_path / f"rank{rank}.{cycle}.pt.trace.json").write_text(json.dumps(doc))
    # WHEN analyzed THEN the error does not call them other runs' traces: it names the profiler's cycles
    # and what to do (a directory per cycle)
    for args in (("analyze", tmp_path), ("report", tmp_path, "-o", tmp_path / "r.html")):
        line = one_line_error(run(*args))
        assert "both claim rank 0" in line
        assert "one profiler cycle's" in line and "a trace per rank and cycle" in line
        assert "one directory per cycle" in line

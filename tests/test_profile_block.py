"""`with gpudoctor.profile():` around a loop written in the block itself — the README's shape — finds the
loop as the step on every Python: on 3.11 and older `sys.settrace` reaches only the frames called after
it is installed, and the frame that entered the block (a script's top level, a notebook cell, a function)
was already running, so a loop of plain tensor ops there found no step at all."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import gpudoctor
from gpudoctor.runner import capture


def test_a_loop_in_the_block_itself_is_the_step(tmp_path: Path) -> None:
    x = torch.randn(128, 128)
    # GIVEN a loop of tensor ops, no nn.Module and no optimizer, written inside the block
    with gpudoctor.profile(out=tmp_path / "block") as p:
        for _ in range(3000):
            y = x
            for _ in range(4):
                y = torch.tanh(y @ x)
    # THEN its iterations are the steps, found in this very frame
    record = p.run_report.record
    assert record is not None and record.step is not None and record.step.source == "loop", record.notes
    assert (
        "test_profile_block.py:21 in test_a_loop_in_the_block_itself_is_the_step()" in record.step.description
    )
    assert record.steps_seen >= 13 and record.trace_files  # 10 timed without the profiler, 3 traced
    # AND nothing stays installed: no tracer, no frame left with ours
    assert capture._ACTIVE is None and sys.gettrace() is None
    assert sys._getframe().f_trace is None


def test_a_script_that_profiles_a_block_runs_under_gpudoctor_run(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from gpudoctor.cli.main import app

    # GIVEN a script that profiles a block of its own, run under `gpudoctor run` to its end
    script = tmp_path / "train.py"
    script.write_text(
        "import torch, gpudoctor\n"
        "model = torch.nn.Linear(32, 32)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "with gpudoctor.profile() as p:\n"
        "    for _ in range(300):\n"
        "        model(torch.randn(16, 32)).sum().backward()\n"
        "        opt.step()\n"
        "print('REPORT', p.report)\n"
    )
    out = tmp_path / "run"
    args = ["run", "--out", str(out), "--run-to-end", "--warmup", "2", "--light-steps", "5", "--steps", "2"]
    result = CliRunner().invoke(app, [*args, str(script)])
    # THEN the script is not stopped for it: the run captured the block, and the inner profile() says so
    assert result.exit_code == 0, result.output
    record = json.loads((out / "record.json").read_text())
    assert record["outcome"] == "completed" and record["step"]["source"] == "optimizer"
    assert (
        "REPORT gpudoctor.profile(): this block ran inside another capture of this process" in result.output
    )
    assert capture._ACTIVE is None

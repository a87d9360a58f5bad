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
    x = torch.randn(64, 64)
    # GIVEN a loop of tensor ops, no nn.Module and no optimizer, written inside the block
    with gpudoctor.profile(out=tmp_path / "block") as p:
        for _ in range(400):
            y = x
            for _ in range(4):
                y = torch.tanh(y @ x)
    # THEN its iterations are the steps, found in this very frame
    record = p.run_report.record
    assert record is not None and record.step is not None and record.step.source == "loop", record.notes
    assert (
        "test_profile_block.py:21 in test_a_loop_in_the_block_itself_is_the_step()" in record.step.description
    )
    assert record.steps_seen >= 13  # 10 timed without the profiler and 3 traced, at least
    # AND nothing stays installed: no tracer, no frame left with ours
    assert capture._ACTIVE is None and sys.gettrace() is None
    assert sys._getframe().f_trace is None

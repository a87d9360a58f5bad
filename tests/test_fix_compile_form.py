"""The compile that `gpudoctor fix` measures is the compile it writes: the rounds compile each top-level
module's forward at runtime, and the change written into the script — `X.compile()` for a class of the
user's, `X.forward = torch.compile(X.forward)` for one of torch's own, where `X.compile()` compiles
nothing — makes Dynamo compile the same frames into the same graphs when the patched copy runs plainly."""

from __future__ import annotations

import functools
import runpy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn.modules import module as nn_module

from gpudoctor.fixes.diff import apply_edits
from gpudoctor.fixes.patches.base import PatchContext
from gpudoctor.fixes.patches.compile import Compile, compiles_in_place
from gpudoctor.runner.hooks import RootFinder, patched

# a class of the user's and one of torch's, called in turn from one function, as a script writes them
SCRIPT = """\
import torch


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


torch.manual_seed(0)
encoder = Encoder()
head = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def step(x):
    return head(encoder(x))


for _ in range(6):
    step(torch.randn(2, 8)).sum().backward()
"""


class Recorder:
    """A Dynamo backend that keeps each graph's code and runs it as traced."""

    def __init__(self) -> None:
        self.graphs: list[str] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        self.graphs.append(gm.code.strip())
        return gm.forward


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    hooks = (dict(nn_module._global_forward_pre_hooks), dict(nn_module._global_forward_hooks))
    yield
    torch._dynamo.reset()
    assert (dict(nn_module._global_forward_pre_hooks), dict(nn_module._global_forward_hooks)) == hooks


def run_under_the_patch(script: Path) -> tuple[Recorder, Compile]:
    """The script run as a fix round runs it: the finder watches two steps, compile waits for it."""
    recorder = Recorder()
    finder = RootFinder(until=lambda: sum(r.calls for r in finder.seen.values()) >= 4)
    patch = Compile(PatchContext(finder, str(script)), backend=recorder)  # type: ignore[arg-type]
    finder.install()
    try:
        with patched([patch]):
            runpy.run_path(str(script), run_name="__main__")
    finally:
        finder.uninstall()
    return recorder, patch


def run_plainly(script: Path, monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """The script run with no gpudoctor inside, every torch.compile it makes through the recorder."""
    recorder = Recorder()
    with monkeypatch.context() as m:  # `Module.compile` calls torch.compile too
        m.setattr(torch, "compile", functools.partial(torch.compile, backend=recorder))
        runpy.run_path(str(script), run_name="__main__")
    return recorder


def test_the_written_compile_makes_the_graphs_the_rounds_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the script run under the compile fix, as a round runs it
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    measured, patch = run_under_the_patch(script)
    outcome = patch.outcome()
    assert outcome.applied and len(measured.graphs) == 2
    # THEN the change written for the user's class is `.compile()`, for torch's Sequential the forward's
    codes = {e.name: e.code for e in outcome.edits}
    assert codes["encoder"] == ("{name}.compile()",)
    assert codes["head"][0].startswith("{name}.forward = torch.compile({name}.forward)")
    # WHEN the change is applied to a copy and the copy runs plainly
    fixed = tmp_path / "train_fixed.py"
    text, unplaced = apply_edits(SCRIPT, outcome.edits)
    assert unplaced == []
    fixed.write_text(text)
    written = run_plainly(fixed, monkeypatch)
    # THEN Dynamo compiled the same frames into the same graphs
    assert written.graphs == measured.graphs


def test_module_compile_compiles_nothing_for_torchs_own_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN `X.compile()` after both assignments (the form written for every module before)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.replace("\n\n\ndef step", "\nencoder.compile()\nhead.compile()\n\n\ndef step"))
    written = run_plainly(script, monkeypatch)
    # THEN the user's class is compiled and torch's Sequential is not: why its written form is the forward's
    assert compiles_in_place(torch.nn.Linear(2, 2)) is False
    assert len(written.graphs) == 1 and "relu" in written.graphs[0], (
        "module.compile() now compiles torch's own modules (pytorch/pytorch#150915 fixed?): "
        "patches.compile.written_form could write X.compile() for them too"
    )

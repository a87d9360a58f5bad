"""A policy that builds a `torch.distributions` object per step validates its arguments each time (a
host-device synchronization on the GPU, a graph break under torch.compile): the observing round counts
those constructions by line, `no_validation` is offered where the loop makes them, turns the class's
default off for the run and puts it back, and writes the one line after the imports."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch
from torch.distributions import Distribution, Normal

from gpudoctor.fixes.catalog import SPECS, build_patch
from gpudoctor.fixes.diff import apply_edits
from gpudoctor.fixes.kinds.base import Proposing
from gpudoctor.fixes.observe import Observer
from gpudoctor.fixes.patches.base import PatchContext
from gpudoctor.runner.hooks import RootFinder, patched

POLICY = torch.nn.Linear(4, 2)


@pytest.fixture(autouse=True)
def validating() -> Iterator[None]:
    """PyTorch's default, whatever a test before ran (an expert's script turns it off for the process)."""
    before = Distribution._validate_args
    Distribution.set_default_validate_args(True)
    yield
    Distribution.set_default_validate_args(before)


def sample(obs: torch.Tensor) -> torch.Tensor:
    return Normal(POLICY(obs), torch.ones(2)).sample()


def test_distributions_validated_per_step_are_counted_and_validation_goes_off_for_the_run() -> None:
    finder = RootFinder(until=lambda: True)
    patch = build_patch("no_validation", PatchContext(finder, __file__))
    observer = Observer(finder)
    seen_inside: list[bool] = []
    finder.install()
    try:
        with patched([observer]):
            for _ in range(4):
                sample(torch.randn(3, 4))
            obs = observer.observations()
        with patched([patch]):
            seen_inside.append(Normal(torch.zeros(2), torch.ones(2))._validate_args)
            seen_inside.append(Normal(torch.zeros(2), torch.ones(2), validate_args=True)._validate_args)
    finally:
        finder.uninstall()
    # THEN the observing round counted the 4 constructions on their line in `sample`
    [count] = obs.validated_distributions
    assert count.count == 4 and count.site is not None and count.site.function == "sample"
    # AND with the fix on, a distribution skips its checks (one asked for them keeps them), and after it
    # PyTorch's default is back
    assert seen_inside == [False, True] and Distribution._validate_args
    outcome = patch.outcome()
    assert outcome.applied and [e.op for e in outcome.edits] == ["insert_after_imports"]
    # AND the search offers it where the loop builds them on a GPU, not where it builds none
    spec = SPECS["no_validation"]
    on_gpu = replace(obs, cuda=True)
    assert spec.propose(Proposing({}, on_gpu, steps=4)) and spec.why_not(on_gpu, "", 4) is None
    none = replace(on_gpu, validated_distributions=())
    assert spec.propose(Proposing({}, none, steps=4)) == [] and spec.why_not(none, "", 4)


def test_the_line_goes_after_the_imports() -> None:
    text = "import torch\nfrom torch.distributions import Normal\n\npolicy = make()\n"
    finder = RootFinder(until=lambda: True)
    patch = build_patch("no_validation", PatchContext(finder, "rl.py"))
    with patched([patch]):
        pass
    new, unplaced = apply_edits(text, list(patch.outcome().edits))
    assert not unplaced
    assert new.startswith(
        "import torch\nfrom torch.distributions import Normal\n"
        "torch.distributions.Distribution.set_default_validate_args(False)\n"
    )


def test_validation_switches_in_blocks_and_is_back_after_the_run() -> None:
    # a compiled function over a distribution is guarded on the flag: each setting compiles once and is
    # reused, so the fix is timed in blocks of one process as TF32 is
    finder = RootFinder(until=lambda: True)
    patch = build_patch("no_validation", PatchContext(finder, __file__))
    assert patch.switchable
    seen: list[bool] = []
    with patched([patch]):
        for on in (False, True, False):
            patch.switch(on)
            seen.append(Normal(torch.zeros(2), torch.ones(2))._validate_args)
    assert seen == [True, False, True] and Distribution._validate_args


def test_counting_them_does_not_break_the_graph_of_compiled_code_that_builds_them() -> None:
    # the observer's wrapped __init__ is inlined by Dynamo where a compiled policy builds its Normal: a
    # Counter in its closure broke the graph there (actor_critic's compiled rollout: 2 breaks in every
    # round, 11.6% saved on the CPU against 20.9% without them)
    from torch._dynamo.utils import counters

    def unchecked(obs: torch.Tensor) -> torch.Tensor:
        # (without validation: Dynamo's own break at PyTorch's constraint check, whether it traces
        # into torch.distributions, is not the observer's)
        return Normal(POLICY(obs), torch.ones(2), validate_args=False).sample()

    torch._dynamo.reset()
    counters.clear()
    act = torch.compile(unchecked, backend="eager")
    finder = RootFinder(until=lambda: True)
    observer = Observer(finder)
    with patched([observer]):
        for _ in range(2):
            act(torch.randn(3, 4))
    assert sum(counters["graph_break"].values()) == 0, list(counters["graph_break"])
    # (built inside compiled code they are not counted: the observer counts those built eagerly)
    assert not observer.observations().validated_distributions


def test_a_process_that_called_torch_compile_already_skips_validation_and_the_fix_says_why() -> None:
    # dynamo patches torch once per process, at the first torch.compile call (before anything runs),
    # and sets the distributions' default validation off: the fix has nothing left to do there. In this
    # process an earlier test may have had that one call, so its effect is set here as it left it
    torch.compile(lambda x: x + 1)
    Distribution.set_default_validate_args(False)
    finder = RootFinder(until=lambda: True)
    patch = build_patch("no_validation", PatchContext(finder, "rl.py"))
    with patched([patch]):
        pass
    outcome = patch.outcome()
    assert not outcome.applied and outcome.reason is not None and "torch.compile" in outcome.reason

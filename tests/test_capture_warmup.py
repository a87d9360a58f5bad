"""When `gpudoctor run` (and each round of `gpudoctor fix`) ends its warm-up: at least --warmup steps,
then once a step is no slower than twice the fastest of the last few — after a compiled model's first calls and cudnn.benchmark's search,
and also after the first steps of a loop the GPU bounds, which end at the host's pace while the GPU's
queue fills (ViT-B/16 in float32 on the H100 warmed up for 50 extra steps of 98 ms every round)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from gpudoctor.runner.phases import MAX_EXTRA_WARMUP, LiveOptions, WarmUp


def warm_up_steps(tmp_path: Path, step_s: list[float], warmup: int = 5) -> int | None:
    """The number of steps after which the warm-up ends for these step times (None: not within them)."""
    warm = WarmUp(LiveOptions(warmup=warmup, warmup_seconds=0.0), lockstep=False)
    warm.boundaries = [0.0]
    for n, t in enumerate(itertools.accumulate(step_s), 1):
        warm.boundaries.append(t)
        if warm.warmed_up():
            return n
    return None


def test_a_loop_the_gpu_bounds_is_warm_once_its_fast_first_steps_are_past(tmp_path: Path) -> None:
    # GIVEN two steps enqueued at the host's pace (15 ms) before the queue is full, then the GPU's 98 ms
    step_s = [0.015, 0.015] + [0.098] * 80
    # THEN the warm-up ends with the fifth step (--warmup): the fast steps are no longer among the last three
    assert warm_up_steps(tmp_path, step_s) == 5


def test_a_compiled_model_is_warm_after_its_first_calls(tmp_path: Path) -> None:
    # a first step compiling for 30 s, the backward's second compile, then 100 ms steps
    assert warm_up_steps(tmp_path, [30.0, 4.0, 0.1, 0.1, 0.1, 0.1, 0.1]) == 5
    # slow steps beyond --warmup are waited out
    assert warm_up_steps(tmp_path, [0.1, 0.1, 0.1, 0.1, 30.0, 4.0, 0.1, 0.1, 0.1, 0.1]) == 7


@pytest.mark.parametrize("jitter", [0.0, 0.01])
def test_steps_within_the_slack_of_each_other_are_warm(tmp_path: Path, jitter: float) -> None:
    # 5 and 15 ms steps are three-fold apart, but within 20 ms: host jitter, not warm-up
    assert warm_up_steps(tmp_path, [0.005 + jitter, 0.015, 0.005, 0.015, 0.005]) == 5


def test_steps_that_alternate_are_warm(tmp_path: Path) -> None:
    # a steady loop whose steps alternate (a longer step every other one) is not warming up
    assert warm_up_steps(tmp_path, [0.1, 0.5] * 10) == 5


def test_steps_that_keep_growing_end_the_warm_up_at_its_cap(tmp_path: Path) -> None:
    step_s = [1.5**i for i in range(80)]
    assert warm_up_steps(tmp_path, step_s) == 5 + MAX_EXTRA_WARMUP

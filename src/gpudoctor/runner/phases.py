"""The phases of a capture and what sets them: `LiveOptions` (warm-up, light and traced phases, what is
sampled), `StopRun`, raised from a step boundary once everything is captured, the `WarmUp` that decides
when the steps are warm, and `fitted_options`, the phases that fit a script that ended before its
trace. Imported by the launcher and the command line, so it imports nothing heavy."""

from __future__ import annotations

import itertools
import math
import statistics
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpudoctor.runner.record import RunRecord
    from gpudoctor.timing.blocks import BlockPlan


class StopRun(BaseException):
    """Raised from a step boundary once everything is captured; a BaseException so that the script's
    own `except Exception` does not swallow it."""


@dataclass(frozen=True)
class LiveOptions:
    warmup: int = 3  # steps skipped before the light phase (more while step times still fall)
    warmup_seconds: float = 1.0  # and at least this long (caches, clocks, the interpreter settle)
    light_steps: int = 20
    light_seconds: float = 2.0  # and at least this long
    steps: int = 5  # profiled (active) steps of the traced phase
    light_only: bool = False
    run_to_end: bool = False  # let the script finish after the capture instead of stopping it
    with_stack: bool = False
    record_shapes: bool = False
    profile_memory: bool = False
    nvml: bool = True
    nvml_interval_s: float = 0.1
    module_depth: int = 3  # module ranges in the traced phase to this depth (-1: none)
    trace_all: bool = False  # trace the whole script (no steps, no light phase): for a short script
    memory_history: str = "outside-light"  # runner.memory: outside-light, always, off
    # the light phase as an A/B in blocks (timing.blocks): `on_switch` turns the candidate off and on
    blocks: BlockPlan | None = None
    # leave out the light phase's unsettled head, and time on (up to twice the plan) until it settles
    # (`runner.settle`); fix rounds do not: their pairs cancel what A and B share
    settle: bool = True


def fitted_options(record: RunRecord, options: LiveOptions) -> LiveOptions | None:
    """For a script that ended (by itself) before its trace: phases that fit the steps it ran, or the
    whole script traced when it ran too few; None when it was traced or must not run again."""
    if record.trace_files or record.exit_code != 0 or record.outcome not in ("completed", "exit"):
        return None
    if options.trace_all:
        return None
    n = record.steps_seen
    if n < 5 or record.step is None:
        return replace(options, trace_all=True)
    steps = max(1, min(options.steps, (n - 2) // 3))
    light = max(n - 2 - steps - 1, 1)
    return replace(options, warmup=1, warmup_seconds=0.0, light_steps=light, light_seconds=0.0, steps=steps)


MAX_MARKS = 20000  # the light phase ends after this many marks, however short its time
MARK_EVERY_US = 1000.0  # light-phase marks at least this far apart (steps shorter are marked in groups)
MAX_EVERY = 1000
MAX_EXTRA_WARMUP = 50  # warm-up steps beyond --warmup while step times still fall
SETTLE_SLACK_S = 0.02  # a step within this of the fastest is warm whatever the ratio
SETTLE_STEPS = 3  # the last warm-up steps whose fastest a warm step is held to


class WarmUp:
    """The warm-up's step boundaries (host times, seconds) and what they decide: when the steps are
    warm, how often the light phase marks a boundary, and how many light steps rank 0 plans."""

    def __init__(self, options: LiveOptions, lockstep: bool) -> None:
        self.options = options
        self.lockstep = lockstep  # ranks: the phases go by step counts every rank agrees on
        self.boundaries: list[float] = []

    def boundary(self) -> bool:
        """A step boundary now; whether the warm-up is over with it."""
        self.boundaries.append(time.perf_counter())
        return self.warmed_up()

    def restart(self) -> None:
        self.boundaries = []

    def step_times(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.boundaries)]

    def warmed_up(self) -> bool:
        """At least --warmup steps, and until a step takes no more than twice the fastest of the last
        SETTLE_STEPS (after the first calls of a compiled model, cudnn.benchmark's search), within a
        cap. Not the fastest so far: while the GPU's queue fills, a loop the GPU bounds ends its first
        steps at the host's pace, many times faster than it will run. With ranks, --warmup steps alone:
        a choice every rank makes at the same step."""
        n = len(self.boundaries) - 1  # whole steps between boundaries
        o = self.options
        if self.lockstep:
            return n >= max(o.warmup, 1)
        if self.boundaries and self.boundaries[-1] - self.boundaries[0] < o.warmup_seconds:
            return False
        if n < max(o.warmup, 1):
            return o.warmup == 0 and n >= 0
        times = self.step_times()
        recent = times[-SETTLE_STEPS:]
        settled = times[-1] <= max(2 * min(recent), min(recent) + SETTLE_SLACK_S)  # jitter is not warm-up
        return settled or n >= o.warmup + MAX_EXTRA_WARMUP

    def mark_every(self) -> int:
        """Mark every k-th boundary when the warm-up's steps are short, so that marks are at least
        MARK_EVERY_US apart and their own cost stays out of the step time."""
        times = self.step_times()
        if not times:
            return 1
        step_us = 1e6 * statistics.median(times)
        # (no more than a third of --light-steps a group: a short light phase keeps its steps)
        cap = max(1, min(MAX_EVERY, self.options.light_steps // 3))
        return max(1, min(cap, math.ceil(MARK_EVERY_US / max(step_us, 1e-3))))

    def light_plan(self) -> int:
        """Light-phase steps enough for --light-seconds at the warm-up's pace (what rank 0 proposes) —
        and for --warmup-seconds: with ranks the warm-up goes by --warmup steps alone, and the light
        phase leaves out its unsettled head instead, extended only where the ranks agree that one has
        not settled (`runner.agreement`; not with --light-seconds 0: then --light-steps)."""
        times = self.step_times()
        pace = statistics.median(times) if times else 0.0
        o = self.options
        wanted = o.light_seconds + (o.warmup_seconds if o.settle and o.light_seconds > 0 else 0.0)
        seconds = math.ceil(wanted / pace) if pace > 0 else 0
        return max(o.light_steps, min(seconds, MAX_MARKS))

"""The phases of a capture and what sets them: `LiveOptions` (warm-up, light and traced phases, what is
sampled), `StopRun`, raised from a step boundary once everything is captured, and `fitted_options`, the
phases that fit a script that ended before its trace. Imported by the launcher and the command line, so
it imports nothing heavy."""

from __future__ import annotations

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

"""`RoundResult`: what one child process reports to `gpudoctor fix` (schema `gpudoctor.fix-round/1`) —
the fixes it ran with and what each changed, the step times of its light phase, its first steps' losses or
outputs, compile time, what the script does (observations), and how it ended (a failure, an OOM, a
timeout are values here, not exceptions)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from gpudoctor.fixes.observe import Observations
from gpudoctor.fixes.patches.base import PatchOutcome
from gpudoctor.runner.record import StepFound
from gpudoctor.timing.blocks import Block, BlockLayout, Redone
from gpudoctor.util.serial import Serialized

SCHEMA = "gpudoctor.fix-round/1"


@dataclass(frozen=True)
class RoundResult(Serialized):
    json_schema: ClassVar[str | None] = SCHEMA
    json_what: ClassVar[str] = "a gpudoctor fix round"

    fixes: tuple[str, ...]
    outcome: str  # completed, stopped, exit, exception, interrupted, timeout, crashed, patch_failed
    exit_code: int
    clock: str | None = None  # cuda_events or perf_counter
    step_times_us: tuple[float, ...] = ()
    steps_seen: int = 0
    outputs_kind: str = "none"  # loss, output, none
    outputs: tuple[tuple[float, ...], ...] = ()
    compile_s: float = 0.0
    compile_timed_s: float = 0.0  # of it, during the timed steps (a recompilation)
    patches: dict[str, PatchOutcome] = field(default_factory=dict)
    observations: Observations | None = None
    error: str | None = None  # one line
    oom: bool = False
    exact_random: bool = False  # Inductor drew random numbers as eager does (a numerics-only round)
    wall_s: float = 0.0
    device: str = "unknown"  # the GPU's name, or cpu
    torch: str | None = None
    log_tail: str = ""
    # an A/B inside this process: the fixes turned off and on in blocks (each pair in a random order),
    # each block's times, and what the blocks were made of (the calibration, the loop's period)
    switch: tuple[str, ...] = ()
    blocks: tuple[Block, ...] = ()
    block_layout: BlockLayout | None = None
    switch_error: str | None = None  # a fix that could not be switched (its A/B needs fresh processes)
    switches: int = 0  # times the switched fixes were turned off or on (0: every fix stayed on throughout)
    redone: tuple[Redone, ...] = ()  # blocks set aside and timed again: the process compiled inside them
    restarted_s: tuple[float, ...] = ()  # without blocks: each restart of the light phase, seconds compiled
    leftover_processes: int = 0  # left running in its process group when it ended (then killed)
    step: StepFound | None = None  # what a step was (the proof's plain processes count the same)
    ended_at: float = 0.0  # when the script ended (time.time()): of a group's failed ranks, the first
    schema: str = SCHEMA

    @property
    def mean_step_us(self) -> float | None:
        """The mean step over the timed window (its whole time over its steps: what the loop's
        throughput pays, slow steps included)."""
        return sum(self.step_times_us) / len(self.step_times_us) if self.step_times_us else None

    @property
    def failure(self) -> str | None:
        """Why this round cannot count, in one line; None when it ran its steps."""
        if self.oom:
            return f"out of memory: {self.error}"
        if self.outcome == "patch_failed":
            return f"the fix could not be applied: {self.error}"
        if self.outcome in ("exception", "timeout", "crashed", "interrupted"):
            last = (self.log_tail.strip().splitlines() or ["no output"])[-1]
            return f"{self.outcome}: {self.error or last}"
        if self.switch_error:
            return f"could not be switched in the running process: {self.switch_error}"
        if self.switch and len(self.blocks) < 4:
            return f"{len(self.blocks)} blocks timed before the script ended (4 or more are needed)"
        if self.outcome == "exit" and self.exit_code and not self.step_times_us:
            return (
                f"it exited with status {self.exit_code} after {self.steps_seen} steps{said(self.log_tail)}"
            )
        if not self.step_times_us:
            return (
                f"no timed steps: the script ended ({self.outcome}, exit {self.exit_code}) after "
                f"{self.steps_seen} step boundaries"
            )
        return None


def said(log_tail: str) -> str:
    """The last line a script wrote before it exited with an error status (argparse's "error: the
    following arguments are required", sys.exit("no data")), for a one-line failure; empty if none."""
    last = (log_tail.strip().splitlines() or [""])[-1].strip()
    return f": {last[:200]}" if last else ""

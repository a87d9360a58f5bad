"""An A/B inside one running loop: the baseline (A) and the candidate (B) alternate in blocks of steps,
switched at step boundaries, so both share one process, one compilation and the same GPU clocks, and
drift cancels between adjacent blocks; each block's mean step is timed between two synchronizations.

Blocks are made exchangeable: each holds the same whole number of the loop's cycles (`loop_period`, from a
calibration of the baseline's steps), untimed steps precede every block (`settle`, `lag`), a block in which
the process compiled is timed again (`redo`), each pair's order is a coin (`seed`), and an undecided
schedule leaning to a saving times `extend_pairs` more. Why: docs/fix.md, steps 4, 5 and 10; what they
measured: docs/results.md. `BlockSchedule.boundary()` is called at every step boundary after the warm-up."""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from gpudoctor.timing.clock import HostClock, PerfCounterClock
from gpudoctor.timing.paired import LEAN, Pair, leans_to_a_saving, pairs_in_order, random_orders, sides
from gpudoctor.timing.stepclock import StepClock

PERIOD_CORRELATION = 0.5  # a cycle: the steps correlate at least this much one period apart …
PERIOD_MARGIN = 0.25  # … this much more than at any shorter lag …
PERIOD_SWING = 0.02  # … and vary by at least 2% of their mean


@dataclass(frozen=True)
class BlockPlan:
    pairs: int = 8  # block pairs: `pairs` blocks of each configuration
    min_steps: int = 2  # steps timed in a block, at least …
    min_seconds: float = 0.5  # … and at least this long at the calibration's pace
    settle: int = 1  # untimed steps before every block (after a switch: a layout converted, a first call)
    prewarm: int = 3  # untimed steps of the baseline's configuration before the calibration (its warm-up)
    calibrate_steps: int = 12  # timed baseline steps (and at least `min_seconds`): the loop's pace, period
    period: int | None = None  # steps of the loop's cycle; None: found in the calibration
    max_period: int = 16
    seed: int | None = None  # the pairs' orders; None: drawn afresh
    redo: int = 4  # blocks timed again because the process compiled inside them, at most
    extend_pairs: int = 0  # pairs added, once, where the planned ones lean to a saving undecided
    lean: float = LEAN

    def __post_init__(self) -> None:
        if (
            self.pairs < 2
            or self.extend_pairs < 0
            or not 0.0 <= self.lean < 1.0
            or self.min_steps < 1
            or self.min_seconds < 0
            or self.settle < 0
            or self.prewarm < 0
            or self.calibrate_steps < 2
            or (self.period is not None and self.period < 1)
            or self.max_period < 1
            or self.redo < 0
        ):
            raise ValueError(f"not a block plan: {self}")


@dataclass(frozen=True)
class Block:
    candidate: bool
    steps: int
    elapsed_us: float  # host time between the synchronizations at its ends
    step_times_us: tuple[float, ...]  # each step, from the step clock (CUDA events on the GPU)
    clock: str

    @property
    def mean_us(self) -> float:
        return self.elapsed_us / self.steps


@dataclass(frozen=True)
class BlockLayout:
    """What the calibration measured and the blocks were made of."""

    calibration_us: tuple[float, ...]  # the baseline's timed steps before the first block
    period: int  # steps of the loop's cycle (1: none found)
    measured_period: bool  # found in the calibration, not given
    steps: int  # in every block: a whole number of periods
    b_first: tuple[bool, ...]  # each pair's order: the candidate first
    seed: int
    extended: int = 0  # pairs added past the plan's: its pairs leaned to a saving undecided


def block_pairs(blocks: tuple[Block, ...] | list[Block]) -> list[Pair]:
    """The blocks of a schedule as pairs in the order they ran (A B → one pair, B A → the next)."""
    return pairs_in_order([(b.candidate, b.mean_us) for b in blocks])


def loop_period(
    times_us: Sequence[float],
    max_period: int = 16,
    *,
    least: float = PERIOD_CORRELATION,
    margin: float = PERIOD_MARGIN,
    swing: float = PERIOD_SWING,
) -> int:
    """The shortest cycle of a loop's step times: the smallest lag p (2 … max_period, at most a third
    of the steps) at which the steps' autocorrelation is at least `least` and beats every shorter lag
    by `margin` (a loader's two workers: −1 at lag 1, +1 at lag 2; a slow spell lasting several steps
    correlates most at lag 1 and has no cycle); 1 where none does, or where the steps vary by less than
    `swing` of their mean (a cycle too small to matter). Correlation rather than folding the steps by
    phase: a slip of the cycle (a worker late once) costs it one lag's products, not every phase after."""
    x = np.asarray(times_us, dtype=np.float64)
    n = x.size
    mean = float(x.mean()) if n else 0.0
    var = float(((x - mean) ** 2).mean()) if n else 0.0
    if n < 6 or mean <= 0.0 or math.sqrt(var) < swing * mean:
        return 1
    r = [1.0]
    for p in range(1, min(max_period, n // 3) + 1):
        r.append(float(((x[:-p] - mean) * (x[p:] - mean)).mean()) / var)
        if p >= 2 and r[p] >= least and r[p] >= max(r[1:p]) + margin:
            return p
    return 1


def steps_per_block(plan: BlockPlan, pace_us: float, period: int) -> int:
    """Whole periods, at least `min_steps` and `min_seconds` at `pace_us` a step."""
    least = max(plan.min_steps, math.ceil(1e6 * plan.min_seconds / pace_us) if pace_us > 0 else 1)
    return period * math.ceil(least / period)


@dataclass(frozen=True)
class Redone:
    """A block set aside and timed again: the process compiled inside it."""

    candidate: bool
    steps: int
    elapsed_us: float
    disturbed_s: float  # what `disturbed` moved by during it (seconds compiling)


class BlockSchedule:
    """The state of one in-process A/B, advanced at step boundaries (see the module's text)."""

    def __init__(
        self,
        plan: BlockPlan,
        switch: Callable[[bool], None],
        *,
        cuda: bool = False,
        host: HostClock | None = None,
        sync: Callable[[], None] | None = None,
        disturbed: Callable[[], float] | None = None,
        lag: Callable[[], int] | None = None,
        agree: Callable[[int], int] | None = None,
    ) -> None:
        self.plan = plan
        # with ranks (a group whose ranks step together): the steps of a block as rank 0 found them, so
        # that every rank switches at the same step and ends at the same step; the calibration, the blocks
        # and their number then go by step counts alone (no block timed again, no pairs added)
        self.agree = agree
        self.lag = lag  # steps a switch takes to reach the loop (batches made ahead): settled out
        self._switch = switch
        self.cuda = cuda
        self.host = host or PerfCounterClock()
        self.sync = sync or (lambda: None)
        self.disturbed = disturbed  # seconds spent compiling so far (the one under way included)
        self.redone: list[Redone] = []
        self._mark = 0.0
        self.seed = plan.seed if plan.seed is not None else secrets.randbits(63)
        self.b_first = random_orders(plan.pairs, np.random.default_rng(self.seed))
        self.order = sides(self.b_first)
        self.blocks: list[Block] = []
        self.layout: BlockLayout | None = None
        self.on = True  # the configuration now: the candidate's, as the process started
        self.switches = 0
        self._phase = "start"  # start, prewarm, calibrate, settle, timing, done
        self._count = 0
        self._t0 = 0.0
        self._steps: StepClock | None = None

    @property
    def done(self) -> bool:
        return self._phase == "done"

    @property
    def timing(self) -> bool:
        """A block's steps are being timed (not the prewarm, the calibration or a block's settling)."""
        return self._phase == "timing"

    def boundary(self) -> bool:
        """One step ended; True once every block is timed."""
        if self._phase == "done":
            return True
        if self._phase == "start":
            self._set(False)
            self._phase, self._count = "prewarm", 0
            if self.prewarm_steps() == 0:
                self._start_clock("calibrate")
            return False
        self._count += 1
        if self._phase == "prewarm":
            if self._count >= self.prewarm_steps():
                self._start_clock("calibrate")
            return False
        if self._phase == "settle":
            if self._count >= self.settle_steps():
                self._start_clock("timing")
            return False
        assert self._steps is not None
        self._steps.boundary()
        if self._phase == "calibrate":
            long_enough = (
                self.agree is not None or self.host.now_us() - self._t0 >= 1e6 * self.plan.min_seconds
            )
            if self._count >= self.plan.calibrate_steps and long_enough:
                self.sync()
                self._calibrated(self._steps.spans().times_us)
                self._begin(0)
            return False
        assert self.layout is not None
        if self._count < self.layout.steps:
            return False
        self.sync()
        elapsed = self.host.now_us() - self._t0
        spans = self._steps.spans()
        moved = self.disturbed() - self._mark if self.disturbed is not None else 0.0
        if moved > 0.0 and len(self.redone) < self.plan.redo and self.agree is None:
            self.redone.append(Redone(self.on, self._count, elapsed, moved))
            self._begin(len(self.blocks))  # the same configuration, settled and timed again
            return False
        self.blocks.append(Block(self.on, self._count, elapsed, spans.times_us, spans.clock))
        if len(self.blocks) == len(self.order) and not self._extends():  # extended: on with its pairs
            self._set(True)
            self._phase = "done"
            return True
        self._begin(len(self.blocks))
        return False

    def _extends(self) -> bool:
        """At the planned pairs' end: where they lean to a saving undecided, `extend_pairs` more pairs
        (their orders drawn from the seed's second stream), once."""
        plan, layout = self.plan, self.layout
        if not plan.extend_pairs or layout is None or layout.extended or self.agree is not None:
            return False
        if not leans_to_a_saving(block_pairs(self.blocks), plan.lean):
            return False
        more = random_orders(plan.extend_pairs, np.random.default_rng([self.seed, 1]))
        self.b_first = [*self.b_first, *more]
        self.order = sides(self.b_first)
        self.layout = replace(layout, b_first=tuple(self.b_first), extended=plan.extend_pairs)
        return True

    def _calibrated(self, times_us: tuple[float, ...]) -> None:
        pace = sum(times_us) / len(times_us)
        measured = self.plan.period is None
        period = loop_period(times_us, self.plan.max_period) if measured else self.plan.period
        assert period is not None
        steps = steps_per_block(self.plan, pace, period)
        if self.agree is not None:
            steps = self.agree(steps)
        self.layout = BlockLayout(times_us, period, measured, steps, tuple(self.b_first), self.seed)

    def _begin(self, index: int) -> None:
        self._set(self.order[index])
        if self.settle_steps() > 0:  # switched or not: the same steps fall in a block whatever the order
            self._phase, self._count = "settle", 0
            return
        self._start_clock("timing")

    def prewarm_steps(self) -> int:
        """Untimed steps of the baseline before the calibration: `prewarm`, or the switch's lag where
        larger (the calibration times the baseline's batches, not those made ahead for the warm-up)."""
        return max(self.plan.prewarm, self.lag() if self.lag is not None else 0)

    def settle_steps(self) -> int:
        """Untimed steps before every block: `settle`, or the switch's lag where larger."""
        return max(self.plan.settle, self.lag() if self.lag is not None else 0)

    def _start_clock(self, phase: str) -> None:
        self.sync()
        self._phase, self._count = phase, 0
        self._t0 = self.host.now_us()
        self._mark = self.disturbed() if self.disturbed is not None else 0.0
        self._steps = StepClock(self.cuda, host=self.host)
        self._steps.boundary()

    def _set(self, on: bool) -> bool:
        if on == self.on:
            return False
        self._switch(on)
        self.on = on
        self.switches += 1
        return True

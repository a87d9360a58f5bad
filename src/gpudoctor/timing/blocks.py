"""An A/B inside one running loop: the baseline (A) and the candidate (B) alternate in blocks of steps,
A B B A A B …, switched at step boundaries by a callback, so that both share one process start, one
import, one compilation and the same GPU clocks, and drift cancels between adjacent blocks. Each block
is a window synchronized at its ends (`sync`, then the host clock): its mean step is what the loop's
throughput pays, slow steps included; the per-step times inside it come from the step clock beside.

`BlockSchedule.boundary()` is called at every step boundary after the loop's warm-up (with the
candidate's configuration on, as the process started); it says when the schedule is done, with the
configuration switched back to the candidate's. No torch here but through the step clock and `sync`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpudoctor.timing.clock import HostClock, PerfCounterClock
from gpudoctor.timing.paired import Pair, abba, pairs_in_order
from gpudoctor.timing.stepclock import StepClock


@dataclass(frozen=True)
class BlockPlan:
    pairs: int = 8  # block pairs: `pairs` blocks of each configuration
    min_steps: int = 2  # steps timed in a block, at least …
    min_seconds: float = 0.5  # … and at least this long (a block should see the loop's periodic stalls)
    settle: int = 1  # steps after a switch that are not timed (a layout converted, a first call)
    prewarm: int = 3  # steps of the baseline's configuration before the first block (its warm-up)

    def __post_init__(self) -> None:
        if (
            self.pairs < 2
            or self.min_steps < 1
            or self.min_seconds < 0
            or self.settle < 0
            or self.prewarm < 0
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


def block_pairs(blocks: tuple[Block, ...] | list[Block]) -> list[Pair]:
    """The blocks of a schedule as pairs in the order they ran (A B → one pair, B A → the next)."""
    return pairs_in_order([(b.candidate, b.mean_us) for b in blocks])


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
    ) -> None:
        self.plan = plan
        self._switch = switch
        self.cuda = cuda
        self.host = host or PerfCounterClock()
        self.sync = sync or (lambda: None)
        self.order = abba(plan.pairs)
        self.blocks: list[Block] = []
        self.on = True  # the configuration now: the candidate's, as the process started
        self.switches = 0
        self._phase = "start"  # start, prewarm, settle, timing, done
        self._count = 0
        self._t0 = 0.0
        self._steps: StepClock | None = None

    @property
    def done(self) -> bool:
        return self._phase == "done"

    def boundary(self) -> bool:
        """One step ended; True once every block is timed."""
        if self._phase == "done":
            return True
        if self._phase == "start":
            self._set(False)
            self._phase, self._count = "prewarm", 0
            return self._after_count(self.plan.prewarm)
        if self._phase in ("prewarm", "settle"):
            self._count += 1
            return self._after_count(self.plan.settle if self._phase == "settle" else self.plan.prewarm)
        assert self._steps is not None
        self._steps.boundary()
        self._count += 1
        if self._count < self.plan.min_steps or self.host.now_us() - self._t0 < 1e6 * self.plan.min_seconds:
            return False
        self.sync()
        elapsed = self.host.now_us() - self._t0
        spans = self._steps.spans()
        self.blocks.append(Block(self.on, self._count, elapsed, spans.times_us, spans.clock))
        if len(self.blocks) == len(self.order):
            self._set(True)
            self._phase = "done"
            return True
        self._begin(len(self.blocks))
        return False

    def _after_count(self, needed: int) -> bool:
        if self._count >= needed:
            if self._phase == "prewarm":
                self._begin(0)
            else:
                self._start_window()
        return False

    def _begin(self, index: int) -> None:
        switched = self._set(self.order[index])
        if switched and self.plan.settle > 0 and index > 0:
            self._phase, self._count = "settle", 0
            return
        self._start_window()

    def _start_window(self) -> None:
        self.sync()
        self._phase, self._count = "timing", 0
        self._t0 = self.host.now_us()
        self._steps = StepClock(self.cuda, host=self.host)
        self._steps.boundary()

    def _set(self, on: bool) -> bool:
        if on == self.on:
            return False
        self._switch(on)
        self.on = on
        self.switches += 1
        return True

"""The light phase of a capture: step times with no profiler running, from a `StepClock` (CUDA events or
perf_counter, every k-th boundary marked) or, with a block plan, from the A/B blocks of a
`BlockSchedule`. It ends once --light-steps and --light-seconds are both reached and its steps settled
(`runner.settle`), or as the ranks agree (`runner.agreement`); without blocks, a recompilation inside it
starts it again. `end()` gives what it measured, a frozen `LightEnd`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpudoctor.runner import settle
from gpudoctor.runner.agreement import RankAgreement
from gpudoctor.runner.phases import MAX_MARKS, LiveOptions
from gpudoctor.runner.record import StepTimes

if TYPE_CHECKING:  # the timing core's package imports numpy: the command line starts without it
    from gpudoctor.timing.blocks import Block, BlockLayout, BlockSchedule, Redone
    from gpudoctor.timing.stepclock import StepClock

# A light phase without blocks during which the process compiled (`disturbed` moved: a recompilation on
# an epoch's last, smaller batch) starts again from the next step, at most this many times; past that
# the compilations are the loop's own and count
MAX_LIGHT_RESTARTS = 4


@dataclass(frozen=True)
class LightEnd:
    """What a light phase measured: its step times (settled, where it settles), with blocks the blocks,
    those timed again and their layout, the root module's calls per step, and its notes."""

    light: StepTimes
    blocks: tuple[Block, ...] = ()
    redone: tuple[Redone, ...] = ()
    block_layout: BlockLayout | None = None
    calls_per_step: float | None = None
    notes: tuple[str, ...] = ()


def step_times(clock: StepClock) -> StepTimes:
    spans = clock.spans()
    return StepTimes(spans.clock, spans.times_us, spans.host_span_s)


class LightPhase:
    """One light phase, from its first boundary to `end()`. `calls()` counts the root module's calls
    (0 where none is known), `disturbed()` the seconds spent compiling so far, `restarts` the seconds
    compiled at each restart of the capture's light phases (kept across them, as their cap is)."""

    def __init__(
        self,
        options: LiveOptions,
        *,
        cuda: bool,
        every: int,
        agreement: RankAgreement,
        calls: Callable[[], int],
        restarts: list[float],
        notes: list[str],
        disturbed: Callable[[], float] | None = None,
        can_restart: bool = True,
    ) -> None:
        self.options = options
        self.cuda = cuda
        self.every = every
        self.agreement = agreement
        self.calls = calls
        self.restarts = restarts
        self.notes = notes
        self.disturbed = disturbed
        self.can_restart = can_restart  # not under ranks, whose phases go by agreed step counts
        self.clock: StepClock | None = None
        self.schedule: BlockSchedule | None = None
        self.planned_s: float | None = None  # how long the phase took to reach its plan
        self._settle_checked = 0.0
        self._start_s = time.perf_counter()
        self._calls_at_start = calls()
        self._compiled_at = 0.0  # `disturbed()` when the phase (re)started

    @property
    def timing(self) -> bool:
        """Whether the steps now count in what it measures (with blocks: not their prewarm, calibration
        or settling steps)."""
        return self.schedule is None or self.schedule.timing

    def start_blocks(self, schedule: BlockSchedule) -> None:
        """The phase as A/B blocks: the schedule's first boundary is now."""
        self.schedule = schedule
        schedule.boundary()

    def start_clock(self) -> None:
        from gpudoctor.timing.stepclock import StepClock

        self.clock = StepClock(self.cuda, every=self.every)
        self.clock.boundary()
        self._compiled_at = self.disturbed() if self.disturbed is not None else 0.0

    def boundary(self) -> bool:
        """A step boundary; whether the phase is over with it."""
        if self.schedule is not None:
            return self.schedule.boundary()
        assert self.clock is not None
        if self._restart_if_compiled():
            return False
        self.clock.boundary()
        return self._done()

    def _done(self) -> bool:
        """--light-steps and --light-seconds both reached (or too many marks), and then its steps
        settled (`runner.settle`) or the phase ran twice as long as planned (not with --light-seconds
        0); with ranks, as they agree, so that every rank ends the phase at the same step."""
        assert self.clock is not None
        if self.agreement.target is not None:
            return self.agreement.done(self.clock.steps, self.options, self._settled_for_ranks)
        o, now = self.options, time.perf_counter()
        if len(self.clock.marks) > MAX_MARKS:
            return True
        if self.clock.timed_steps < o.light_steps or now - self._start_s < o.light_seconds:
            return False
        if not o.settle or o.light_seconds <= 0:  # no floor of seconds: --light-steps, not extended
            return True
        if self.planned_s is None:
            self.planned_s = now - self._start_s
        if now - self._start_s >= settle.EXTEND_FACTOR * self.planned_s:
            return True
        if now - self._settle_checked < settle.CHECK_EVERY_S:
            return False
        self._settle_checked = now
        times = self.clock.ready_times()
        return settle.light_done(times, min_steps=o.light_steps, min_seconds=o.light_seconds)

    def _settled_for_ranks(self) -> bool:
        """At an agreement's check: whether this rank's steps settled (the plan reached by then)."""
        assert self.clock is not None
        if self.planned_s is None:
            self.planned_s = time.perf_counter() - self._start_s
        times = self.clock.ready_times()
        return settle.light_done(times, min_steps=self.options.light_steps, min_seconds=0)

    def _restart_if_compiled(self) -> bool:
        """Where the process compiled since the phase (re)started, it starts again from this boundary (a
        recompilation is paid once, as the first compilation is, which the warm-up leaves out), up to
        MAX_LIGHT_RESTARTS times; True when it did."""
        if self.disturbed is None or not self.can_restart or len(self.restarts) >= MAX_LIGHT_RESTARTS:
            return False
        moved = self.disturbed() - self._compiled_at
        if moved <= 0.0:
            return False
        from gpudoctor.timing.stepclock import StepClock

        self.restarts.append(moved)
        self._compiled_at += moved
        n = len(self.restarts)
        note = (
            f"the light phase started again after a recompilation ({sum(self.restarts):.1f} s compiling"
            f"{f', {n} times' if n > 1 else ''}): a one-off cost, as the first compilation is, not the step's"
        )
        self.notes[:] = [x for x in self.notes if not x.startswith("the light phase started again")] + [note]
        self._start_s = time.perf_counter()
        self.planned_s, self._settle_checked = None, 0.0
        self._calls_at_start = self.calls()
        self.clock = StepClock(self.cuda, every=self.every)
        self.clock.boundary()
        return True

    def end(self, root_known: bool) -> LightEnd:
        """What the phase measured; `root_known`: the step's root module is known (calls per step)."""
        if self.schedule is not None:
            blocks = tuple(self.schedule.blocks)
            clock = blocks[0].clock if blocks else ("cuda_events" if self.cuda else "perf_counter")
            light = StepTimes(clock, tuple(t for b in blocks for t in b.step_times_us))
            end = LightEnd(light, blocks, tuple(self.schedule.redone), self.schedule.layout)
        else:
            assert self.clock is not None
            end = LightEnd(step_times(self.clock))
        calls = None
        if root_known and end.light.times_us:
            calls = (self.calls() - self._calls_at_start) / len(end.light.times_us)
        light, notes = end.light, ()
        if self.clock is not None and self.schedule is None and self.options.settle:
            light, notes = self._settled(light)
        return LightEnd(light, end.blocks, end.redone, end.block_layout, calls, notes)

    def _settled(self, light: StepTimes) -> tuple[StepTimes, tuple[str, ...]]:
        """The phase's unsettled head left out; the notes that say so where it mattered, and if it did
        not settle."""
        assert self.clock is not None
        late = time.perf_counter() - self._start_s - self.planned_s if self.planned_s else 0.0
        light = settle.settled(light, self.clock.host_time_of_step, max(late, 0.0))
        agreed = self.agreement.target is not None and self.agreement.agree is None
        return light, tuple(settle.notes(light, agreed=agreed))

"""The timing core's step clock: marks at a loop's step boundaries — CUDA events on the current stream
(no synchronization until the times are read) on the GPU, the host clock (`clock.HostClock`) on the CPU —
and the time between them. Every step time gpudoctor reports comes from here (`gpudoctor run`'s phases,
fix rounds, the blocks of an in-process A/B); tests pass a fake host clock."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

from gpudoctor.timing.clock import HostClock, PerfCounterClock

EVENT_BATCH = 64  # CUDA events made ahead at a time, so that a mark only records one


@dataclass(frozen=True)
class StepSpans:
    """What a `StepClock` measured: `clock` ("cuda_events" or "perf_counter"), one time per step (µs;
    steps marked in groups each get their group's mean), and when the first and last marks were made
    by the host's perf_counter (s)."""

    clock: str
    times_us: tuple[float, ...]
    host_span_s: tuple[float, float] | None = None

    @property
    def total_us(self) -> float:
        return sum(self.times_us)

    @property
    def mean_us(self) -> float | None:
        """The whole time over the steps: what the loop's throughput pays, its slow steps included."""
        return self.total_us / len(self.times_us) if self.times_us else None


class StepClock:
    """Marks at step boundaries. With `every` > 1 only every so many boundaries is marked (steps
    shorter than a mark's own cost: each mark then stands for the mean of the steps since the last)."""

    def __init__(self, cuda: bool, every: int = 1, host: HostClock | None = None) -> None:
        self.cuda = cuda
        self.every = every
        self.host = host or PerfCounterClock()
        self.name = "cuda_events" if cuda else "perf_counter"
        self.marks: list[Any] = []
        self.steps = 0  # boundaries seen since the first mark
        self.host_times: list[float] = []  # perf_counter at each mark
        self._spare: list[Any] = []
        self._ready: list[float] = []  # spans read so far without waiting (`ready_times`)

    def boundary(self) -> None:
        if self.marks:
            self.steps += 1
            if self.steps % self.every:
                return
        if self.cuda:
            if not self._spare:
                import torch

                self._spare = [torch.cuda.Event(enable_timing=True) for _ in range(EVENT_BATCH)]
            event = self._spare.pop()
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(self.host.now_us())
        self.host_times.append(time.perf_counter())

    @property
    def timed_steps(self) -> int:
        return (len(self.marks) - 1) * self.every if self.marks else 0

    def spans(self) -> StepSpans:
        """The step times so far (on the GPU: waits for the last mark)."""
        if len(self.marks) < 2:
            return StepSpans(self.name, ())
        if self.cuda:
            self.marks[-1].synchronize()
            spans = [a.elapsed_time(b) * 1e3 for a, b in itertools.pairwise(self.marks)]
        else:
            spans = [b - a for a, b in itertools.pairwise(self.marks)]
        times = tuple(t / self.every for t in spans for _ in range(self.every))
        return StepSpans(self.name, times, (self.host_times[0], self.host_times[-1]))

    def ready_times(self) -> tuple[float, ...]:
        """The step times so far whose closing mark the GPU has passed, without waiting for the others
        (marks on one stream complete in order: the last one passed is found by bisection)."""
        if len(self.marks) < 2:
            return ()
        if not self.cuda:
            return self.spans().times_us
        lo, hi = len(self._ready), len(self.marks) - 1  # marks up to `lo` are known passed
        if not self.marks[lo].query():
            hi = lo
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.marks[mid].query() else (lo, mid - 1)
        for i in range(len(self._ready), lo):
            self._ready.append(self.marks[i].elapsed_time(self.marks[i + 1]) * 1e3)
        return tuple(t / self.every for t in self._ready for _ in range(self.every))

    def host_time_of_step(self, step: int) -> float | None:
        """perf_counter when the mark that starts timed step `step` (0-based) was made."""
        mark = step // self.every
        return self.host_times[mark] if mark < len(self.host_times) else None

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
        self.host_times: list[float] = []  # perf_counter at the first and the latest mark
        self._spare: list[Any] = []

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
        now = time.perf_counter()
        self.host_times = [self.host_times[0] if self.host_times else now, now]

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

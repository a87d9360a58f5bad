"""Stand-ins for the hardware seams, to exercise the timing core without a GPU (and without waiting):
a fake host clock, a seeded cost-model backend (warm-up ramp, noise, throttled stretches, drift), a
scripted NVML sensor, and a loop that replays recorded step times through the block schedule. The tests
use them; so can anyone testing code built on `bench`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gpudoctor.timing.blocks import BlockPlan, BlockSchedule
from gpudoctor.timing.clock import ClockReading
from gpudoctor.timing.measurement import KernelTimes
from gpudoctor.timing.runner import Plan

SW_THERMAL = 0x20


class FakeClock:
    """A host clock that moves only when told to."""

    def __init__(self, start_us: float = 0.0) -> None:
        self.t = start_us

    def now_us(self) -> float:
        return self.t

    def advance(self, us: float) -> None:
        self.t += us


@dataclass
class CostModel:
    """Per-call device time: `base_us` × (1 + `ramp` · e^(−i/`ramp_tau`)) × lognormal(`noise`) × `drift`,
    i counting every call so far; calls made while throttled are `throttle_slowdown` times slower.
    `host_us` is what a synchronized single call costs the caller on top of the device time."""

    base_us: float = 100.0
    noise: float = 0.002
    ramp: float = 0.0
    ramp_tau: float = 20.0
    drift: float = 1.0
    throttle_slowdown: float = 1.2
    host_us: float = 12.0
    overhead_us: float = 30.0  # host time a sample costs beyond its device time (spin, sync, readings)
    seed: int = 0

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self.calls = 0

    def call_us(self, throttled: bool = False) -> float:
        i = self.calls
        self.calls += 1
        t = self.base_us * (1 + self.ramp * math.exp(-i / self.ramp_tau)) * self.drift
        t *= math.exp(self.rng.normal(0.0, self.noise))
        if throttled:
            t *= self.throttle_slowdown
        return t


Episode = Callable[[float], bool]  # is the GPU throttled at this fake-clock time (µs)?


class FakeBackend:
    """A `Backend` whose time comes from a `CostModel` and advances a `FakeClock`; while `throttled(t)`
    holds for the clock's time, calls run slower."""

    has_host_latency = True
    default_cooldown = 0.0

    def __init__(
        self,
        model: CostModel,
        clock: FakeClock,
        device: str = "fake:0",
        cold: bool = False,
        throttled: Episode | None = None,
    ) -> None:
        self.model = model
        self.throttled = throttled or (lambda t: False)
        self.clock = clock
        self.device = device
        self.cold = cold
        self.calls = 1
        self.prepared: int | None = None
        self.closed = False
        self.rested_us = 0.0
        self.kernel_share = 0.9  # kernel time is this share of the device time (gaps in between)
        self.samples = 0
        self.measuring_from: int | None = None

    def first_call(self) -> float:
        t = self.model.call_us() * 20 + self.model.host_us  # compilation makes the first call slow
        self.clock.advance(t)
        return t

    def estimate_call_us(self) -> float:
        t = self.model.call_us()
        self.clock.advance(t + self.model.overhead_us)
        return t

    def prepare(self, calls: int) -> Plan:
        self.calls = 1 if self.cold else calls
        self.prepared = calls
        return Plan("fake_graph", self.calls)

    def sample(self) -> float:
        hot = self.throttled(self.clock.now_us())
        t = sum(self.model.call_us(hot) for _ in range(self.calls))
        self.samples += 1
        self.clock.advance(t + self.model.overhead_us)
        return t

    def start_measuring(self) -> None:
        self.measuring_from = self.samples

    def host_latency(self) -> float:
        t = self.model.call_us() + self.model.host_us
        self.clock.advance(t)
        return t

    def rest(self, us: float) -> None:
        self.rested_us += us
        self.clock.advance(us)

    def kernel_times(self, calls: int) -> KernelTimes:
        per_call = tuple(self.model.call_us() * self.kernel_share for _ in range(calls))
        return KernelTimes(per_call_us=per_call, kernels_per_call=1.0, names=("fake_kernel",))

    def notes(self) -> tuple[str, ...]:
        return ()

    def close(self) -> None:
        self.closed = True


class ScriptedSensor:
    """NVML readings that report a throttle reason while `throttled(t)` holds for the fake clock's time
    (the episode the `FakeBackend` slows down in)."""

    available = True
    reason = None
    max_sm_mhz = 1980.0

    def __init__(self, clock: FakeClock, throttled: Episode | None = None, mask: int = SW_THERMAL) -> None:
        self._clock = clock
        self._throttled = throttled or (lambda t: False)
        self._mask = mask
        self.reads = 0
        self.closed = False

    def read(self) -> ClockReading:
        self.reads += 1
        hot = self._throttled(self._clock.now_us())
        return ClockReading(sm_mhz=1500.0 if hot else 1980.0, reasons=self._mask if hot else 0)

    def close(self) -> None:
        self.closed = True


class ReplayLoop:
    """A loop on a fake host clock whose steps take recorded times (µs), one after another from
    `start`; while the candidate's configuration is on, each is scaled by `effect` (1.0: an A/A).
    `run_one_step()` says False once the recording has run out."""

    def __init__(self, times_us: Sequence[float], start: int = 0, effect: float = 1.0) -> None:
        self.times = times_us
        self.i = start
        self.effect = effect
        self.now = 0.0
        self.on = True

    def now_us(self) -> float:
        return self.now

    def switch(self, on: bool) -> None:
        self.on = on

    def run_one_step(self) -> bool:
        if self.i >= len(self.times):
            return False
        self.now += self.times[self.i] * (self.effect if self.on else 1.0)
        self.i += 1
        return True


def replay_blocks(
    times_us: Sequence[float], plan: BlockPlan, *, start: int = 0, effect: float = 1.0
) -> BlockSchedule | None:
    """The block schedule of `plan` run on recorded step times from `start` (`ReplayLoop`); None when
    they run out before its last block."""
    loop = ReplayLoop(times_us, start, effect)
    schedule = BlockSchedule(plan, loop.switch, host=loop)
    while not schedule.boundary():
        if not loop.run_one_step():
            return None
    return schedule

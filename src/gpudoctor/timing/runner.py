"""The measuring loop, the same for every device: first call, estimate, choice of calls per sample,
warm-up until the timings are steady, sampling under a stopping rule (minimum samples, minimum time,
noise target, timeout), NVML clock readings after every sample, then host latency. The device is a
`Backend`; the loop only counts, decides and keeps the numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from gpudoctor.timing.clock import ClockReading, ClockSensor, HostClock, reason_names
from gpudoctor.timing.measurement import BenchOptions, KernelTimes, Warmup
from gpudoctor.timing.stats import summarize
from gpudoctor.timing.watchdog import TimeLimit, watchdog
from gpudoctor.util.errors import GpudoctorError

HOST_MIN_SAMPLES = 5
HOST_MAX_SAMPLES = 1000
HOST_NOISE = 0.01
HOST_MAX_TIME_S = 0.25
WARMUP_SHARE_OF_TIMEOUT = 0.4  # warm-up may use at most this much of the time still left
MAX_REST_US = 50_000.0
KERNEL_CALLS = 20
# The watchdog stops a run this long after its timeout: the loop's own check between samples ends
# it in time when calls return; the watchdog is for the call that does not.
HARD_LIMIT_FACTOR = 1.1
HARD_LIMIT_GRACE_S = 0.1


class BenchTimeout(GpudoctorError):
    """Not one call of the function finished within the timeout."""


@dataclass(frozen=True)
class Plan:
    method: str  # cuda_graph | cuda_events | host_sync | host_timer
    calls: int  # calls of the function per sample
    notes: tuple[str, ...] = ()


class Backend(Protocol):
    """Runs the function on one device. `sample()` returns the µs of one sample (all its calls)."""

    device: str
    has_host_latency: bool
    default_cooldown: float  # idle after each sample, × its length, when the options leave it to the device

    def first_call(self) -> float:
        """Run the function once; the host µs it took (compilation and autotuning included)."""
        ...

    def estimate_call_us(self) -> float:
        """A rough device time of one call, to choose the calls per sample."""
        ...

    def prepare(self, calls: int) -> Plan: ...

    def sample(self) -> float: ...

    def start_measuring(self) -> None:
        """Warm-up is over: from here on, count what goes into the notes."""
        ...

    def host_latency(self) -> float:
        """One call as a caller waits for it, synchronization included, in µs."""
        ...

    def rest(self, us: float) -> None:
        """Leave the device idle for `us` µs (power and clocks recover, as between a program's steps)."""
        ...

    def kernel_times(self, calls: int) -> KernelTimes | str | None:
        """Per-call kernel time from the device's own activity records; a reason, or None if the device
        has no such records."""
        ...

    def notes(self) -> tuple[str, ...]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RunOutcome:
    plan: Plan
    first_call_us: float
    estimate_us: float
    warmup: Warmup
    samples_us: tuple[float, ...]  # per call
    readings: tuple[ClockReading, ...]  # one per sample, read right after it
    throttled: tuple[bool, ...]  # per sample: a throttle reason in the reading before or after it
    before: ClockReading
    after: ClockReading
    reasons_seen: tuple[str, ...]
    host_latency_us: tuple[float, ...]
    kernels: KernelTimes | None
    stop_reason: str
    elapsed_s: float
    notes: tuple[str, ...]


def choose_calls(estimate_us: float, options: BenchOptions) -> int:
    """Calls per sample: enough for a sample to last `sample_target_us`; one in cold mode (each call
    must find a flushed cache)."""
    if options.mode == "cold":
        return 1
    calls = math.ceil(options.sample_target_us / max(estimate_us, 1e-3))
    return int(min(max(calls, 1), options.max_calls_per_sample))


def is_steady(times: list[float], window: int, tolerance: float) -> bool:
    """The median of the last `window` samples is within tolerance of the `window` samples that end
    halfway through the warm-up so far. Comparing with the halfway point, not the window just before,
    catches slow trends (a residual decay changes little per window but much per half-run). The
    tolerance is widened to the windows' own spread (IQR/median), so that noise alone does not block."""
    n = len(times)
    if n < 2 * window:
        return False
    half = n // 2
    prev = np.asarray(times[max(0, half - window) : half])
    last = np.asarray(times[-window:])
    m_prev, m_last = float(np.median(prev)), float(np.median(last))
    if m_prev <= 0:
        return m_last <= 0
    spread = max(_rel_iqr(prev), _rel_iqr(last))
    return abs(m_last / m_prev - 1) <= max(tolerance, spread)


def _rel_iqr(x: np.ndarray) -> float:
    q1, med, q3 = np.quantile(x, [0.25, 0.5, 0.75])
    return float((q3 - q1) / med) if med > 0 else 0.0


class StoppingRule:
    """nvbench's rule with the median's interval as the noise: stop when at least `min_samples` and
    `min_time_s` are in and the median's 95% interval is within ±`max_noise`; or at `max_samples`;
    or at the deadline. The interval is recomputed on a geometric schedule (every ~5% more samples)."""

    def __init__(self, options: BenchOptions) -> None:
        self.options = options
        self._next_check = options.min_samples

    def reason(self, times: list[float], sampling_us: float, timed_out: bool) -> str | None:
        n = len(times)
        if n >= self.options.max_samples:
            return "max_samples"
        if timed_out:
            return "timeout"
        if n < self.options.min_samples or sampling_us < self.options.min_time_s * 1e6:
            return None
        if n < self._next_check:
            return None
        self._next_check = n + max(1, n // 20)
        return "noise_target" if summarize(times).rel_ci <= self.options.max_noise else None


def cooldown_of(backend: Backend, options: BenchOptions) -> float:
    return backend.default_cooldown if options.cooldown is None else options.cooldown


def _sample(backend: Backend, cooldown: float) -> float:
    """One sample, then the device's rest that the cooldown asks for (outside the sample)."""
    t = backend.sample()
    if cooldown > 0:
        backend.rest(min(t * cooldown, MAX_REST_US))
    return t


def warm_up(
    backend: Backend,
    clock: HostClock,
    options: BenchOptions,
    deadline_us: float,
    times: list[float] | None = None,
) -> Warmup:
    """Sample until the timings are steady (`is_steady`), after at least `warmup_min_s`; give up at
    `warmup_max_s` or at a share of the time left before the deadline. The samples go into `times`
    as they come (a watchdog may stop this midway)."""
    start = clock.now_us()
    limit = min(start + options.warmup_max_s * 1e6, start + (deadline_us - start) * WARMUP_SHARE_OF_TIMEOUT)
    times = [] if times is None else times
    cooldown = cooldown_of(backend, options)
    while True:
        times.append(_sample(backend, cooldown))
        now = clock.now_us()
        if now - start >= options.warmup_min_s * 1e6 and is_steady(
            times, options.warmup_window, options.warmup_tolerance
        ):
            return Warmup(samples=len(times), time_us=now - start, steady=True)
        if now >= limit:
            return Warmup(samples=len(times), time_us=now - start, steady=False)


@dataclass
class _Progress:
    """What a run has measured so far: a watchdog that stops it midway finds it here."""

    before: ClockReading
    first: float | None = None
    estimate: float = math.nan
    plan: Plan | None = None
    warm: Warmup | None = None
    warm_times: list[float] = field(default_factory=list)
    warm_started_us: float = math.nan
    times: list[float] = field(default_factory=list)
    readings: list[ClockReading] = field(default_factory=list)
    throttled: list[bool] = field(default_factory=list)
    seen: int = 0
    host: tuple[float, ...] = ()
    kernels: KernelTimes | str | None = None
    stop: str = "timeout"


def run(backend: Backend, options: BenchOptions, clock: HostClock, sensor: ClockSensor) -> RunOutcome:
    """Measure; past the timeout (plus a tenth), a watchdog stops the run wherever it is, even inside
    a call that never returns to the loop, and the outcome is what was measured by then."""
    t0 = clock.now_us()
    got = _Progress(before=sensor.read())
    stopped = False
    try:
        with watchdog(options.timeout_s * HARD_LIMIT_FACTOR + HARD_LIMIT_GRACE_S):
            _measure(backend, options, clock, sensor, t0 + options.timeout_s * 1e6, got)
    except TimeLimit:
        stopped = True
    return _outcome(
        got, sensor.read(), (clock.now_us() - t0) / 1e6, backend, stopped=stopped, options=options
    )


def _measure(
    backend: Backend,
    options: BenchOptions,
    clock: HostClock,
    sensor: ClockSensor,
    deadline: float,
    got: _Progress,
) -> None:
    got.first = backend.first_call()
    got.estimate = backend.estimate_call_us()
    got.plan = backend.prepare(choose_calls(got.estimate, options))
    got.warm_started_us = clock.now_us()
    got.warm = warm_up(backend, clock, options, deadline, got.warm_times)
    backend.start_measuring()
    rule = StoppingRule(options)
    previous = sensor.read()
    cooldown = cooldown_of(backend, options)
    sampling_start = clock.now_us()
    while True:
        sample = _sample(backend, cooldown) / got.plan.calls
        reading = sensor.read()
        # the readings on both sides of a sample bracket it: throttled at either end flags it
        got.times.append(sample)
        got.readings.append(reading)
        got.throttled.append(reading.throttled or previous.throttled)
        got.seen |= reading.reasons or 0
        previous = reading
        now = clock.now_us()
        stop = rule.reason(got.times, now - sampling_start, now >= deadline)
        if stop:
            got.stop = stop
            break
    if options.host_latency and backend.has_host_latency:
        got.host = _host_latency(backend, clock, options)
    got.kernels = backend.kernel_times(KERNEL_CALLS) if options.kernel_time else None


def _outcome(
    got: _Progress,
    after: ClockReading,
    elapsed_s: float,
    backend: Backend,
    *,
    stopped: bool,
    options: BenchOptions,
) -> RunOutcome:
    """The run's outcome from what it measured; stopped by the watchdog, from the samples it had, else
    the warm-up's, else the first call alone (each said in a note); none at all is a `BenchTimeout`."""
    notes: list[str] = []
    plan = got.plan or Plan("first_call", 1)
    times, readings, throttled = got.times, got.readings, got.throttled
    n = min(len(times), len(readings), len(throttled))  # stopped between appending one and the next
    times, readings, throttled = times[:n], readings[:n], throttled[:n]
    warm = got.warm or Warmup(samples=len(got.warm_times), time_us=0.0, steady=False)
    limit = f"{options.timeout_s:g} s"
    if stopped:
        if times:
            notes.append(f"stopped by the {limit} timeout in the middle of a call: the samples before it")
        elif got.warm_times and got.plan is not None:
            times = [t / plan.calls for t in got.warm_times]
            readings, throttled = [got.before] * len(times), [False] * len(times)
            notes.append(f"stopped by the {limit} timeout during warm-up: its samples, not yet steady")
        elif got.first is not None:
            times, readings, throttled = [got.first], [got.before], [False]
            notes.append(
                f"stopped by the {limit} timeout after one call: its host time, first-call costs included"
            )
        else:
            raise BenchTimeout(f"no call finished within the {limit} timeout (--timeout / timeout_s)")
    kernels = got.kernels
    return RunOutcome(
        plan=plan,
        first_call_us=got.first if got.first is not None else math.nan,
        estimate_us=got.estimate,
        warmup=warm,
        samples_us=tuple(times),
        readings=tuple(readings),
        throttled=tuple(throttled),
        before=got.before,
        after=after,
        reasons_seen=reason_names(got.seen),
        host_latency_us=got.host,
        kernels=kernels if isinstance(kernels, KernelTimes) else None,
        stop_reason="timeout" if stopped else got.stop,
        elapsed_s=elapsed_s,
        notes=plan.notes + backend.notes() + ((kernels,) if isinstance(kernels, str) else ()) + tuple(notes),
    )


def _host_latency(backend: Backend, clock: HostClock, options: BenchOptions) -> tuple[float, ...]:
    """Single synchronized calls: at least HOST_MIN_SAMPLES (unless they take five times the phase's time),
    then until the median is known to ±1% or the phase's time (a tenth of the timeout, at most
    HOST_MAX_TIME_S) is spent."""
    budget = min(HOST_MAX_TIME_S, options.timeout_s / 10) * 1e6
    start = clock.now_us()
    times: list[float] = []
    while len(times) < HOST_MAX_SAMPLES:
        times.append(backend.host_latency())
        n = len(times)
        spent = clock.now_us() - start
        if spent >= 5 * budget or (n >= HOST_MIN_SAMPLES and spent >= budget):
            break  # slow functions get fewer than HOST_MIN_SAMPLES rather than a long wait
        if n >= 20 and n % 10 == 0 and summarize(times).rel_ci <= HOST_NOISE:
            break
    return tuple(times)

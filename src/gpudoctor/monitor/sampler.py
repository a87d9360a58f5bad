"""The background sampler: a daemon thread that reads every selected GPU each `interval_s` and hands the
samples to a callback and a ring buffer. It stops cleanly on `stop()`, on leaving a `with` block (also
on an exception or Ctrl-C), and measures its own CPU cost (`SamplerStats.cpu_share`)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpudoctor.monitor.backend import NvmlBackend
from gpudoctor.monitor.samples import GpuSample
from gpudoctor.util.errors import UsageError

DEFAULT_INTERVAL_S = 0.1
MIN_INTERVAL_S = 0.01


@dataclass(frozen=True)
class SamplerStats:
    """The sampler's own cost. CPU time is the sampling thread's (user + system, `time.thread_time`)."""

    interval_s: float
    wall_s: float  # since the thread started
    cpu_s: float  # CPU time of the sampling thread: NVML calls, building samples, callbacks
    ticks: int  # sampling rounds (each reads every selected GPU)
    reads: int  # device readings
    late_ticks: int  # rounds that started late because the previous one overran the interval
    read_ms_mean: float  # mean time of one device reading
    read_ms_max: float

    @property
    def cpu_share(self) -> float:
        """CPU used as a share of one core (0.01 = 1%)."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


class PeriodicThread:
    """Calls `tick()` every `interval_s` on a daemon thread, on a fixed schedule (no drift; a round that
    overruns makes the next start at once and counts as late). An exception in `tick` stops the thread
    and is kept in `error`."""

    def __init__(self, tick: Callable[[], None], interval_s: float, name: str) -> None:
        if not interval_s >= MIN_INTERVAL_S:
            raise UsageError(f"the sampling interval must be at least {MIN_INTERVAL_S * 1e3:.0f} ms")
        self._tick, self.interval_s = tick, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.error: BaseException | None = None
        self.ticks = self.late_ticks = 0
        self._started_s = self._stopped_s = 0.0
        self._cpu_s = 0.0

    def start(self) -> None:
        self._started_s = time.monotonic()
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def wall_s(self) -> float:
        end = self._stopped_s if self._stopped_s else time.monotonic()
        return max(end - self._started_s, 0.0) if self._started_s else 0.0

    def cpu_s(self) -> float:
        return self._cpu_s

    def _run(self) -> None:
        cpu0 = time.thread_time()
        next_s = time.monotonic()
        try:
            while not self._stop.is_set():
                self._tick()
                self.ticks += 1
                self._cpu_s = time.thread_time() - cpu0
                next_s += self.interval_s
                now = time.monotonic()
                if now > next_s:
                    self.late_ticks += 1
                    next_s = now
                self._stop.wait(next_s - now)
        except BaseException as err:  # kept for the owner: a thread cannot raise into it
            self.error = err
        finally:
            self._cpu_s = time.thread_time() - cpu0
            self._stopped_s = time.monotonic()


class Sampler:
    """Samples GPUs in the background.

    Args:
        backend: where readings come from (`open_backend()`, or a `ReplayBackend` in tests).
        interval_s: time between rounds (default 100 ms).
        devices: NVML indices to read (default: every GPU).
        on_sample: called on the sampling thread with each sample; keep it short.
        keep: samples kept per GPU in the ring buffer (None: all of them).

    Use as a context manager, or `start()` and `stop()`. `stop()` returns the `SamplerStats` and
    re-raises an error that stopped the thread (a bug in `on_sample`, say), unless the `with` block
    itself is leaving on an exception.
    """

    def __init__(
        self,
        backend: NvmlBackend,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        devices: Sequence[int] | None = None,
        on_sample: Callable[[GpuSample], None] | None = None,
        keep: int | None = 600,
    ) -> None:
        self._backend = backend
        self.devices = tuple(devices) if devices is not None else tuple(d.index for d in backend.devices())
        self._on_sample = on_sample
        self._buffers: dict[int, deque[GpuSample]] = {i: deque(maxlen=keep) for i in self.devices}
        self._lock = threading.Lock()
        self._read_ms_total = 0.0
        self._read_ms_max = 0.0
        self._reads = 0
        self._thread = PeriodicThread(self._round, interval_s, name="gpudoctor-sampler")

    @property
    def interval_s(self) -> float:
        return self._thread.interval_s

    @property
    def error(self) -> BaseException | None:
        return self._thread.error

    @property
    def running(self) -> bool:
        return self._thread.running

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self, *, raise_error: bool = True) -> SamplerStats:
        """Stop the thread, then take one last full round (so that a run's counters end at its end)."""
        was_running = self._thread.running
        self._thread.stop()
        if was_running and self._thread.error is None:
            try:
                self._round(full=True)
            except BaseException as err:  # treated as an error on the thread
                self._thread.error = err
        if raise_error and self._thread.error is not None:
            raise self._thread.error
        return self.stats()

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.stop(raise_error=exc is None)

    def latest(self) -> dict[int, GpuSample]:
        with self._lock:
            return {i: buf[-1] for i, buf in self._buffers.items() if buf}

    def samples(self, index: int | None = None) -> list[GpuSample]:
        """The buffered samples of one GPU, or of all in time order."""
        with self._lock:
            if index is not None:
                return list(self._buffers[index])
            merged = [s for buf in self._buffers.values() for s in buf]
        return sorted(merged, key=lambda s: (s.mono_s, s.index))

    def stats(self) -> SamplerStats:
        reads = self._reads
        return SamplerStats(
            interval_s=self.interval_s,
            wall_s=self._thread.wall_s(),
            cpu_s=self._thread.cpu_s(),
            ticks=self._thread.ticks,
            reads=reads,
            late_ticks=self._thread.late_ticks,
            read_ms_mean=self._read_ms_total / reads if reads else 0.0,
            read_ms_max=self._read_ms_max,
        )

    def _round(self, full: bool = False) -> None:
        for index in self.devices:
            sample = self._backend.read(index, full=full)
            self._reads += 1
            self._read_ms_total += sample.read_ms
            self._read_ms_max = max(self._read_ms_max, sample.read_ms)
            with self._lock:
                self._buffers[index].append(sample)
            if self._on_sample is not None:
                self._on_sample(sample)

"""Clocks for benchmarks: `read_clocks(device)` gives the SM and memory clocks against their maximum and the
decoded clock-event reasons now; `ClockWatch` samples them in the background around a timed region and
says whether they were held down. Without a `backend` both use one NVML session opened on first use and
shut down at exit; no GPU or no NVML is `NvmlUnavailable`."""

from __future__ import annotations

import atexit
import statistics
import threading
import time
from dataclasses import dataclass

from gpudoctor.monitor.backend import NvmlBackend, open_backend
from gpudoctor.monitor.sampler import PeriodicThread
from gpudoctor.monitor.samples import ClockState

_shared: NvmlBackend | None = None
_shared_lock = threading.Lock()


def shared_backend() -> NvmlBackend:
    """The process-wide NVML backend, opened on first use (never at import)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = open_backend(gpm=False)
            atexit.register(close_shared_backend)
        return _shared


def close_shared_backend() -> None:
    global _shared
    with _shared_lock:
        if _shared is not None:
            _shared.close()
            _shared = None


def read_clocks(device: int | str = 0, backend: NvmlBackend | None = None) -> ClockState:
    """The clocks of one GPU now.

    Args:
        device: NVML index, or UUID ("GPU-..." as nvidia-smi prints it, or torch's
            `str(torch.cuda.get_device_properties(i).uuid)`, which is the way to name a CUDA device
            whatever CUDA_VISIBLE_DEVICES says).
        backend: an open backend; the shared one when None.

    Returns:
        `ClockState`: `sm_mhz` / `sm_max_mhz`, `mem_mhz` / `mem_max_mhz`, `events` (decoded reasons,
        `gpu_idle` included), `slowdowns` (the reasons that lower clocks), `throttled`, `sm_share`.
    """
    nvml = backend or shared_backend()
    return nvml.read_clocks(nvml.resolve(device))


@dataclass(frozen=True)
class ClockReport:
    """The clocks over a watched region."""

    index: int
    samples: int
    sm_max_mhz: int | None
    sm_min_mhz: int | None
    sm_mean_mhz: float | None
    slowdown_shares: dict[str, float]  # reason -> share of samples it was active in
    first: ClockState | None
    last: ClockState | None
    temp_max_c: int | None = None
    power_mean_w: float | None = None

    @property
    def throttled(self) -> bool:
        return bool(self.slowdown_shares)

    @property
    def sm_min_share(self) -> float | None:
        if self.sm_min_mhz is None or not self.sm_max_mhz:
            return None
        return self.sm_min_mhz / self.sm_max_mhz


class ClockWatch:
    """Samples one GPU's clocks every `interval_s` while the `with` block runs.

    with ClockWatch(0) as watch:
        run_benchmark()
    if watch.report.throttled: ...
    """

    def __init__(
        self, device: int | str = 0, *, interval_s: float = 0.05, backend: NvmlBackend | None = None
    ) -> None:
        self._backend = backend or shared_backend()
        self._index = self._backend.resolve(device)
        self._states: list[ClockState] = []
        self._times: list[float] = []  # time.monotonic() of each state
        self._thread = PeriodicThread(self._read, interval_s, name="gpudoctor-clockwatch")
        self._report: ClockReport | None = None

    def _read(self) -> None:
        self._states.append(self._backend.read_clocks(self._index))
        self._times.append(time.monotonic())

    def __enter__(self) -> ClockWatch:
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._thread.stop()
        self._read()  # the state at the end of the region, even for a region shorter than one interval
        self._report = _report(self._index, self._states)
        if self._thread.error is not None and exc is None:
            raise self._thread.error

    @property
    def report(self) -> ClockReport:
        if self._report is None:
            raise RuntimeError("ClockWatch.report is available after the with block")
        return self._report

    def report_between(self, start: float, end: float) -> ClockReport:
        """The clocks over part of the region: the samples read from `start` to `end` (time.monotonic(),
        system-wide on Linux: another process's readings of it compare)."""
        read = zip(self._states, self._times, strict=False)  # a sampler stopped mid-read: one more state
        return _report(self._index, [s for s, t in read if start <= t <= end])


def _report(index: int, states: list[ClockState]) -> ClockReport:
    clocks = [s.sm_mhz for s in states if s.sm_mhz is not None]
    temps = [s.temp_c for s in states if s.temp_c is not None]
    powers = [s.power_w for s in states if s.power_w is not None]
    counts: dict[str, int] = {}
    for s in states:
        for name in s.slowdowns:
            counts[name] = counts.get(name, 0) + 1
    return ClockReport(
        index=index,
        samples=len(states),
        sm_max_mhz=states[0].sm_max_mhz if states else None,
        sm_min_mhz=min(clocks) if clocks else None,
        sm_mean_mhz=statistics.fmean(clocks) if clocks else None,
        slowdown_shares={k: v / len(states) for k, v in counts.items()},
        first=states[0] if states else None,
        last=states[-1] if states else None,
        temp_max_c=max(temps) if temps else None,
        power_mean_w=statistics.fmean(powers) if powers else None,
    )

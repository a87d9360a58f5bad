"""The CPU backend: a sample is `calls` back-to-back calls timed by the host clock (as timeit does);
in cold mode each sample is one call after a read of a buffer twice the last-level cache."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpudoctor.timing.clock import HostClock
from gpudoctor.timing.runner import Plan

DEFAULT_LLC_BYTES = 32 << 20
SLOW_CALL_US = 50_000.0


class CpuBackend:
    device = "cpu"
    has_host_latency = False  # on the CPU the caller waits exactly the measured time
    default_cooldown = 0.0

    def __init__(
        self,
        fn: Callable[[], object],
        *,
        clock: HostClock,
        cold: bool = False,
        grad_to_none: Sequence[Any] = (),
        flush_bytes: int | None = None,
    ) -> None:
        self._fn = fn
        self._clock = clock
        self._cold = cold
        self._grads = tuple(grad_to_none)
        self._calls = 1
        self._first_us = 0.0
        self._flush_buf = np.ones((flush_bytes or 2 * llc_bytes()) // 8, dtype=np.float64) if cold else None

    def _reset_grads(self) -> None:
        for t in self._grads:
            t.grad = None

    def flush(self) -> None:
        if self._flush_buf is not None:
            self._flush_buf.sum()  # a read: leaves clean lines, nothing to write back inside the sample

    def first_call(self) -> float:
        self._reset_grads()
        t0 = self._clock.now_us()
        self._fn()
        self._first_us = self._clock.now_us() - t0
        return self._first_us

    def estimate_call_us(self) -> float:
        if self._first_us > SLOW_CALL_US:  # slow work: the first call is estimate enough
            return self._first_us
        times = []
        for _ in range(3):
            self._reset_grads()
            t0 = self._clock.now_us()
            self._fn()
            times.append(self._clock.now_us() - t0)
        return min(times)

    def prepare(self, calls: int) -> Plan:
        self._calls = 1 if self._cold else calls
        return Plan("host_timer", self._calls)

    def sample(self) -> float:
        fn, reset, grads = self._fn, self._reset_grads, self._grads
        reset()
        self.flush()
        t0 = self._clock.now_us()
        if grads:
            for _ in range(self._calls):
                reset()
                fn()
        else:
            for _ in range(self._calls):
                fn()
        return self._clock.now_us() - t0

    def start_measuring(self) -> None:
        return None

    def host_latency(self) -> float:
        raise NotImplementedError("the CPU backend's samples are host latency")

    def rest(self, us: float) -> None:
        time.sleep(us / 1e6)  # lets a CPU that boosts (turbo) cool down too, when asked for

    def kernel_times(self, calls: int) -> None:
        return None

    def notes(self) -> tuple[str, ...]:
        return ()

    def close(self) -> None:
        self._flush_buf = None


def llc_bytes() -> int:
    """The largest CPU cache that sysfs reports for cpu0, else 32 MiB."""
    best = 0
    for size_file in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = size_file.read_text().strip().upper()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG")) * mult)
        except (OSError, ValueError):
            continue
    return best or DEFAULT_LLC_BYTES

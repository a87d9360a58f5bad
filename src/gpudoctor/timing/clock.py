"""The hardware seams of the timing core: the host clock (`HostClock`) and the GPU clock sensor
(`ClockSensor`: SM clock and NVML's clock-event reasons). Real implementations read
`time.perf_counter_ns` and NVML (through pynvml, imported only when a sensor is opened); tests pass fakes.
A sensor that cannot read is a value (`NoSensor` with its reason), never an exception."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Protocol

from gpudoctor.device.clock_reasons import decode_clock_events

# The clock-event reasons that lower the SM clock below what the work asks for: power cap, HW slowdown,
# SW and HW thermal slowdown, power brake (idle, sync boost and clock settings are not throttling).
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


def reason_names(mask: int | None) -> tuple[str, ...]:
    """NVML's clock-event mask decoded (the monitor's names: `device.clock_reasons`)."""
    return decode_clock_events(mask)


def is_throttled(mask: int | None) -> bool:
    return bool(mask and mask & THROTTLE_MASK)


class HostClock(Protocol):
    def now_us(self) -> float:
        """Monotonic time in µs."""
        ...


class PerfCounterClock:
    """`time.perf_counter_ns`, the finest monotonic clock Python has (tens of ns on Linux)."""

    def now_us(self) -> float:
        return time.perf_counter_ns() / 1e3


@dataclass(frozen=True)
class ClockReading:
    """One look at the GPU: SM clock in MHz (`nvidia-smi -q -d CLOCK`, "SM") and the clock-event
    reason bit mask (`nvidia-smi -q -d PERFORMANCE`); None where not read."""

    sm_mhz: float | None = None
    reasons: int | None = None

    @property
    def throttled(self) -> bool:
        return is_throttled(self.reasons)


class ClockSensor(Protocol):
    available: bool
    reason: str | None  # why it is not available
    max_sm_mhz: float | None

    def read(self) -> ClockReading: ...

    def close(self) -> None: ...


class NoSensor:
    """No GPU clock to read (on the CPU, or NVML missing); every reading is empty."""

    max_sm_mhz = None
    available = False

    def __init__(self, reason: str) -> None:
        self.reason: str | None = reason

    def read(self) -> ClockReading:
        return ClockReading()

    def close(self) -> None:
        return None


class NvmlSensor:
    """Reads one GPU through NVML. Open it with `open_nvml_sensor`; close it when done (NVML counts
    init/shutdown pairs, so this does not disturb other NVML users in the process)."""

    available = True
    reason = None

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml = nvml
        self._handle = handle
        self._reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        self.max_sm_mhz: float | None = self._query(nvml.nvmlDeviceGetMaxClockInfo, nvml.NVML_CLOCK_SM)

    def _query(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(self._handle, *args)
        except Exception:  # any NVML error is "not read", never a crash
            return None

    def read(self) -> ClockReading:
        sm = self._query(self._nvml.nvmlDeviceGetClockInfo, self._nvml.NVML_CLOCK_SM)
        reasons = self._query(self._reasons_fn) if self._reasons_fn else None
        return ClockReading(
            sm_mhz=float(sm) if sm is not None else None,
            reasons=int(reasons) if reasons is not None else None,
        )

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()


def open_nvml_sensor(uuid: str | None, index: int) -> NvmlSensor | NoSensor:
    """The NVML sensor of the GPU with this UUID (as torch reports it), else of NVML index `index`."""
    try:
        import pynvml as nvml  # nvidia-ml-py
    except ImportError:
        return NoSensor("pynvml is not installed (pip install nvidia-ml-py)")
    try:
        nvml.nvmlInit()
    except Exception as err:
        return NoSensor(f"NVML did not start: {err}")
    handle = None
    if uuid:
        ident = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(ident)
        except Exception:
            handle = None
    if handle is None:
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as err:
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()
            return NoSensor(f"NVML does not see GPU {index}: {err}")
    return NvmlSensor(nvml, handle)

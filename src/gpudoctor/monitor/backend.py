"""The seam to the hardware: `NvmlBackend`, what the sampler needs from NVML. `open_backend()` gives the
real one (nvidia-ml-py) or raises `NvmlUnavailable` with one line that says why; tests use
`monitor.replay.ReplayBackend`, which replays samples recorded on a GPU machine."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from gpudoctor.monitor.samples import ClockState, GpuInfo, GpuSample, SystemInfo
from gpudoctor.util.errors import NoGpuError

# nvml.h return codes that will not change on the next call: a backend stops asking.
PERMANENT_ERRORS = frozenset({3, 4, 13, 25, 26})
_REASONS = {
    3: "not supported on this GPU or driver",
    4: "no permission (needs root or a driver setting)",
    9: "the NVIDIA driver is not loaded",
    12: "libnvidia-ml.so.1 not found: no NVIDIA driver on this machine",
    13: "this driver's NVML lacks the call (driver too old)",
    15: "the GPU has fallen off the bus (GPU is lost)",
    18: "the driver's library and kernel module differ in version (reload the driver)",
    19: "in use by another tool (DCGM profiling or Nsight)",
    21: "no data yet",
}


def nvml_reason(err: BaseException) -> str:
    """One short line for an NVML error (pynvml's `NVMLError` carries the nvml.h code in `.value`)."""
    value = getattr(err, "value", None)
    if isinstance(value, int) and value in _REASONS:
        return _REASONS[value]
    return f"NVML error: {err}"


class NvmlUnavailable(NoGpuError):
    """No NVML here: nvidia-ml-py missing, no driver, or no NVIDIA GPU. One line; the CLI exits 2."""


@runtime_checkable
class NvmlBackend(Protocol):
    """A source of GPU readings. `read` never raises for a metric it cannot get: the value is None and
    the sample's `missing` says why. Implementations are safe to call from the sampler thread while
    another thread calls `read_clocks`."""

    def system(self) -> SystemInfo: ...

    def devices(self) -> tuple[GpuInfo, ...]: ...

    def read(self, index: int, *, full: bool = False) -> GpuSample:
        """One reading; `full` also refreshes the values that are read less often (counters, processes)."""
        ...

    def read_clocks(self, index: int) -> ClockState: ...

    def resolve(self, device: int | str) -> int:
        """The index of a device given as an index or a UUID (with or without "GPU-")."""
        ...

    def close(self) -> None: ...


def open_backend(*, gpm: bool = True, process_interval_s: float = 0.5) -> NvmlBackend:
    """NVML through nvidia-ml-py, initialized now; call `close()` (or use `with`) to shut it down.

    Args:
        gpm: also read NVML GPM metrics (SM, tensor-core and DRAM activity) where the GPU has them.
        process_interval_s: how often the (costlier) process list is read; other metrics every read.

    Raises:
        NvmlUnavailable: nvidia-ml-py is not installed, NVML cannot start, or it sees no GPU.
    """
    from gpudoctor.monitor.nvml import PynvmlBackend

    return PynvmlBackend(gpm=gpm, process_interval_s=process_interval_s)


def resolve_device(devices: tuple[GpuInfo, ...], device: int | str) -> int:
    """Find a device by NVML index or UUID; a `UsageError`-style `NvmlUnavailable` when there is none."""
    if isinstance(device, int):
        if any(d.index == device for d in devices):
            return device
        have = ", ".join(str(d.index) for d in devices)
        raise NvmlUnavailable(f"no GPU {device} (NVML sees {have or 'none'})")
    wanted = device.strip().lower().removeprefix("gpu-")
    for d in devices:
        if d.uuid and d.uuid.lower().removeprefix("gpu-") == wanted:
            return d.index
    raise NvmlUnavailable(f"no GPU with UUID {device}")

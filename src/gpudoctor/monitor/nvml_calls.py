"""The pieces of the pynvml backend that are not about one GPU's state: the one wrapper every NVML call
goes through (`NvmlQuery`: an NVML error becomes None plus a reason), the pacing of costly calls by
their measured CPU cost (`Pace`), NVML's ids and enums, and system information."""

from __future__ import annotations

import math
import socket
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from gpudoctor.monitor.backend import PERMANENT_ERRORS, nvml_reason
from gpudoctor.monitor.samples import SystemInfo

ARCHITECTURES = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada",
    9: "hopper",
    10: "blackwell",
    13: "rubin",
}
CLOCK_SM, CLOCK_MEM, TEMPERATURE_GPU = 1, 2, 0

# nvmlDeviceGetFieldValues ids (nvml.h), in three groups by what they are for and what they cost: the
# energy and violation counters cost far more CPU per call than the rest (docs/results.md, "The monitor").
LIVE_FIELDS = {"power_instant_mw": 186, "mem_temp_c": 82}  # shown live: every reading when cheap
PCIE_FIELDS = {"pcie_tx_bytes": 197, "pcie_rx_bytes": 198}  # for rates, where GPM cannot give them
# For run summaries: the energy counter, and the violation ("perf policy") counters, nanoseconds spent
# below the requested clocks because of each policy, cumulative since the driver loaded. Read at a
# session's start and end.
VIOLATION_FIELDS = {
    "power": 74,
    "thermal": 75,
    "sync_boost": 76,
    "board_limit": 77,
    "low_utilization": 78,
    "reliability": 79,
    "app_clocks": 80,
    "base_clocks": 81,
    "sw_thermal": 269,
    "hw_thermal": 270,
    "hw_power_brake": 271,
}
SUMMARY_FIELDS = {"energy_mj": 83, **VIOLATION_FIELDS}
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")  # by nvmlValueType_t


class NvmlQuery:
    """Calls NVML for one reading: a failure becomes None, and the reason goes to `missing` under the
    names of the values the call would have given. A call that fails for good (not supported, no
    permission, missing from the driver) is remembered in `skip` and not made again."""

    def __init__(self, nvml: ModuleType, skip: dict[str, str], missing: dict[str, str]) -> None:
        self.nvml, self.skip, self.missing = nvml, skip, missing

    def call(self, names: tuple[str, ...], fn: Any, *args: Any) -> Any:
        if names[0] in self.skip:
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError as err:
            reason = nvml_reason(err)
            if getattr(err, "value", None) in PERMANENT_ERRORS:
                for name in names:
                    self.skip[name] = reason
            for name in names:
                self.missing[name] = reason
            return None


@dataclass
class Pace:
    """When to make a call whose CPU cost varies by GPU and driver: at most every `base_s`, and rarely
    enough that it takes no more than `share` of one core (cost measured on each call, smoothed): one
    call can cost a thousand times another (docs/results.md, "The monitor")."""

    base_s: float
    share: float
    next_s: float = -math.inf
    cost_s: float = 0.0  # smoothed CPU time of one call

    def due(self, now_s: float) -> bool:
        return now_s >= self.next_s

    def done(self, now_s: float, cost_s: float) -> None:
        self.cost_s = cost_s if self.cost_s == 0.0 else 0.7 * self.cost_s + 0.3 * cost_s
        self.next_s = now_s + self.interval_s

    @property
    def interval_s(self) -> float:
        return max(self.base_s, self.cost_s / self.share)


def decode_field_values(names: list[str], values: Any) -> tuple[dict[str, float], list[str]]:
    """(values by name, names NVML refused for good) from nvmlDeviceGetFieldValues' answer."""
    out: dict[str, float] = {}
    refused = []
    for name, value in zip(names, values, strict=False):
        ret = int(value.nvmlReturn)
        if ret == 0:
            kind = value.valueType
            out[name] = getattr(
                value.value, _VALUE_MEMBERS[kind] if 0 <= kind < len(_VALUE_MEMBERS) else "ullVal"
            )
        elif ret in PERMANENT_ERRORS:
            refused.append(name)
    return out, refused


def read_system(nvml: ModuleType) -> SystemInfo:
    q = NvmlQuery(nvml, {}, {})
    cuda = q.call(("cuda",), nvml.nvmlSystemGetCudaDriverVersion)
    return SystemInfo(
        driver_version=text(q.call(("driver",), nvml.nvmlSystemGetDriverVersion)),
        nvml_version=text(q.call(("nvml",), nvml.nvmlSystemGetNVMLVersion)),
        cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None,
        nvml_binding=binding_version(nvml),
        hostname=socket.gethostname(),
    )


def events_function(nvml: ModuleType, handle: Any) -> Any:
    """nvmlDeviceGetCurrentClocksEventReasons, or its older name on older drivers; None if neither works."""
    for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
        fn = getattr(nvml, name, None)
        if fn is None:
            continue
        try:
            fn(handle)
        except nvml.NVMLError:
            continue
        return fn
    return None


def text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def binding_version(nvml: ModuleType) -> str:
    try:
        from importlib.metadata import version

        return f"nvidia-ml-py {version('nvidia-ml-py')}"
    except Exception:  # not installed as a distribution (a vendored or stand-in module)
        return f"pynvml {getattr(nvml, '__version__', '?')}"

"""Clock-event (throttle) reasons: NVML's `nvmlClocksEventReason*` bit mask decoded to stable names,
a one-line explanation each, and how bad each is. `nvidia-smi -q -d PERFORMANCE` shows the same bits
under "Clocks Event Reasons"."""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class ClockEventReason:
    name: str  # stable id, used in JSON, CSV and alerts
    bit: int
    label: str  # short, for tables
    meaning: str  # what it means for a training step
    severity: str  # "none" (not a slowdown), "info", "warning" or "critical"


# Bits from nvml.h (`nvmlClocksEventReason*`, formerly `nvmlClocksThrottleReason*`).
REASONS: tuple[ClockEventReason, ...] = (
    ClockEventReason("gpu_idle", 0x1, "idle", "nothing runs, so the clocks rest", "none"),
    ClockEventReason(
        "applications_clocks_setting",
        0x2,
        "app clocks",
        "application clocks are set below the maximum (nvidia-smi -ac / -lgc)",
        "warning",
    ),
    ClockEventReason(
        "sw_power_cap",
        0x4,
        "power cap",
        "the board draws its power limit and the driver lowers the clocks to stay under it",
        "warning",
    ),
    ClockEventReason(
        "hw_slowdown",
        0x8,
        "HW slowdown",
        "hardware slowdown: the clocks are cut by half or more (temperature, power brake or power supply)",
        "critical",
    ),
    ClockEventReason(
        "sync_boost",
        0x10,
        "sync boost",
        "clocks held down to match the other GPUs of its sync-boost group",
        "info",
    ),
    ClockEventReason(
        "sw_thermal_slowdown",
        0x20,
        "SW thermal",
        "GPU or memory temperature above its target: the driver lowers the clocks (check cooling)",
        "critical",
    ),
    ClockEventReason(
        "hw_thermal_slowdown",
        0x40,
        "HW thermal",
        "temperature too high: the hardware cuts the clocks (check cooling)",
        "critical",
    ),
    ClockEventReason(
        "hw_power_brake_slowdown",
        0x80,
        "power brake",
        "an external power brake is asserted (power supply or chassis): the hardware cuts the clocks",
        "critical",
    ),
    ClockEventReason("display_clock_setting", 0x100, "display", "clocks set by the display", "info"),
    ClockEventReason("board_limit", 0x200, "board limit", "a board-level limit holds the clocks", "warning"),
    ClockEventReason("reliability", 0x400, "reliability", "a reliability limit holds the clocks", "warning"),
)

BY_NAME: dict[str, ClockEventReason] = {r.name: r for r in REASONS}
_KNOWN_BITS = 0
for _r in REASONS:
    _KNOWN_BITS |= _r.bit
del _r

_NOT_SLOWDOWNS = frozenset(r.name for r in REASONS if r.severity == "none")
SEVERITY_RANK = {"none": 0, "info": 1, "warning": 2, "critical": 3}


@functools.lru_cache(maxsize=256)
def decode_clock_events(mask: int | None) -> tuple[str, ...]:
    """The names of the bits set in `mask`, in bit order; an unknown bit reads `unknown_0x...`."""
    if not mask:
        return ()
    names = [r.name for r in REASONS if mask & r.bit]
    rest = mask & ~_KNOWN_BITS
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"unknown_{bit:#x}")
            rest &= ~bit
        bit <<= 1
    return tuple(names)


def slowdowns(names: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The reasons among `names` that hold the clocks below what the work asks for (not `gpu_idle`)."""
    if not names:
        return ()
    return tuple(n for n in names if n not in _NOT_SLOWDOWNS)


def severity(name: str) -> str:
    reason = BY_NAME.get(name)
    return reason.severity if reason else "warning"


def label(name: str) -> str:
    reason = BY_NAME.get(name)
    return reason.label if reason else name


def meaning(name: str) -> str:
    reason = BY_NAME.get(name)
    return reason.meaning if reason else "a clock-event bit this version of gpudoctor does not know"

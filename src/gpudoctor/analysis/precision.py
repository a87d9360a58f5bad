"""The reduced-precision math of a trace's device (`device.precision`), from what the analysis holds of
it: its device properties and the accelerator the trace names. The rules reach the profiles here."""

from __future__ import annotations

from gpudoctor.device import DeviceInfo
from gpudoctor.device.precision import PROFILES, LowPrecision, architecture_name, low_precision
from gpudoctor.trace.content import Accelerator


def precision_of(device: DeviceInfo | None, acc: Accelerator | None) -> LowPrecision:
    """The profile advice follows for this device (UNKNOWN where the trace records none)."""
    return low_precision(
        acc.vendor if acc is not None else None,
        device.compute_capability if device is not None else None,
        acc.arch if acc is not None else None,
        device.name if device is not None else None,
    )


def device_phrase(device: DeviceInfo | None, acc: Accelerator | None) -> str:
    """How the evidence names the device: "Tesla V100-SXM2-16GB (sm_70, Volta)"; "" where unrecorded."""
    if device is None:
        return ""
    cc = device.compute_capability
    if acc is not None and acc.vendor == "AMD":
        return f"{device.name} ({acc.arch})" if acc.arch else device.name
    if cc is None:
        return device.name
    arch = architecture_name(cc)
    return f"{device.name} (sm_{cc[0]}{cc[1]}" + (f", {arch})" if arch else ")")


__all__ = ["PROFILES", "LowPrecision", "device_phrase", "precision_of"]

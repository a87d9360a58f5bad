"""What accelerator a trace was recorded on, and what it holds where it has no GPU activity gpudoctor
reads: `accelerator(trace)` (vendor and architecture, from the device properties, the runtime's call
names and the kernels' names) and `no_gpu_activity_reason(trace)` (a sentence, never "CPU-only" for a
trace that holds another device's events)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from gpudoctor.trace.model import LAUNCH_KINDS, Kind, Trace

# rocBLAS / hipBLASLt Tensile kernels carry the ISA they were built for: "..._ISA90a_..." is gfx90a.
_TENSILE_ISA = re.compile(r"_ISA(9[0-9a-f]{2}|1[0-2][0-9a-f]{2})_")
_AMD_NAME = re.compile(r"\bAMD\b|Radeon|Instinct|\bMI[1-3]\d\d", re.I)
# What ROCm's computeMajor.computeMinor leaves of the gfx target (the stepping letter is lost).
_GFX_OF_VERSION = {
    (9, 0): "gfx908 or gfx90a (compute 9.0)",
    (9, 4): "gfx94x (compute 9.4)",
    (9, 5): "gfx950 (compute 9.5)",
}
MTIA_CATEGORY = re.compile(r"^mtia")
PROFILER_RANGE_CATEGORY = "cuda_profiler_range"


@dataclass(frozen=True)
class Accelerator:
    vendor: str  # "NVIDIA", "AMD", "MTIA", or "unknown"
    arch: str | None  # "sm_90", "gfx90a", "gfx908 or gfx90a (compute 9.0)"; None where not recorded
    runtime: str  # "CUDA", "ROCm (HIP)", "MTIA"


def accelerator(trace: Trace) -> Accelerator | None:
    """The accelerator the trace's device work ran on; None where the trace records none at all."""
    info = trace.device_info
    calls = _launch_call_names(trace)
    if trace.meta.other_categories and any(MTIA_CATEGORY.match(c) for c in trace.meta.other_categories):
        return Accelerator("MTIA", info.name if info is not None else None, "MTIA")
    amd = any(n.startswith("hip") for n in calls) or (
        info is not None and (bool(_AMD_NAME.search(info.name)) or info.warp_size == 64)
    )
    if amd:
        return Accelerator("AMD", _gfx(trace, info.compute_capability if info else None), "ROCm (HIP)")
    if info is None and not calls:
        return None
    cc = info.compute_capability if info is not None else None
    return Accelerator("NVIDIA", f"sm_{cc[0]}{cc[1]}" if cc else None, "CUDA")


def _gfx(trace: Trace, version: tuple[int, int] | None) -> str | None:
    kernels = trace.rows(Kind.KERNEL)
    for name_id in np.unique(trace.name[kernels]).tolist():
        m = _TENSILE_ISA.search(trace.names[name_id])
        if m:
            return f"gfx{m.group(1)}"
    if version is None:
        return None
    return _GFX_OF_VERSION.get(version, f"gfx{version[0]} (compute {version[0]}.{version[1]})")


def _launch_call_names(trace: Trace) -> set[str]:
    rows = trace.rows(*LAUNCH_KINDS)
    return {trace.names[i] for i in np.unique(trace.name[rows]).tolist()}


def no_gpu_activity_reason(trace: Trace) -> str:
    """Why a trace without CUDA/ROCm kernels, copies or memsets has no GPU figures, naming what it
    holds instead."""
    other = trace.meta.other_categories
    mtia = {c: n for c, n in other.items() if MTIA_CATEGORY.match(c)}
    info = trace.device_info
    if mtia:
        device = f" on {info.name}" if info is not None else ""
        held = ", ".join(f"{n:,} {c}" for c, n in sorted(mtia.items(), key=lambda kv: -kv[1]))
        return (
            f"an MTIA (Meta Training and Inference Accelerator) trace: {held} device events{device}. "
            "gpudoctor reads CUDA and ROCm kernels, copies and memsets; MTIA device events have no kernel "
            "or stream schema it reads, so there are no GPU figures, only the host side"
        )
    ranges = other.get(PROFILER_RANGE_CATEGORY, 0)
    if ranges:
        device = f" ({info.name})" if info is not None else ""
        return (
            f"a CUPTI profiler-range trace{device}: its {ranges:,} kernels were recorded as "
            f"{PROFILER_RANGE_CATEGORY} events (hardware counters per range, for FLOP counts), not as kernel "
            "activity on the GPU's timeline, so there is no GPU timeline to analyze; record with "
            "ProfilerActivity.CUDA and without the profiler-range (counter) mode for one"
        )
    launches = len(trace.rows(*LAUNCH_KINDS))
    if launches:
        return (
            f"{launches:,} CUDA/HIP runtime calls but no GPU activity recorded (kernels, copies, memsets): "
            "the trace was recorded without ProfilerActivity.CUDA, so GPU figures are not available"
        )
    if not len(trace):
        return (
            "the trace holds no events at all: nothing was recorded between the profiler's start and its "
            "export (profile a few steps of the loop inside the profiler's context)"
        )
    if not len(trace.rows(Kind.CPU_OP, Kind.PYTHON)):
        # prof.export_chrome_trace() after a schedule's last active cycle: the profiler's own span and
        # the last step's mark are all it saves
        return (
            "no GPU activity and no ops: the trace holds only the profiler's own span and step marks. With "
            "a schedule, export each cycle's trace from on_trace_ready (tensorboard_trace_handler, or a "
            "function calling prof.export_chrome_trace); exporting after the last cycle saves nothing"
        )
    return "no GPU activity: a CPU-only trace, so GPU figures are not available"

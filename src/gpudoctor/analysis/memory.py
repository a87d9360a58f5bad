"""GPU memory from `profile_memory` events: allocated and reserved over time, the peak, and the
allocations made in each step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpudoctor.trace.model import Trace
from gpudoctor.trace.steps import Step

CUDA_DEVICE_TYPE = 1  # c10::DeviceType::CUDA
SERIES_POINTS = 400


@dataclass(frozen=True)
class MemoryStep:
    number: int
    allocations: int
    allocated_bytes: int  # sum of the allocations' sizes
    peak_allocated: int


@dataclass(frozen=True)
class MemoryReport:
    device: int
    events: int
    peak_allocated: int
    peak_reserved: int
    capacity: int | None  # the device's total memory, where the trace records it
    steps: tuple[MemoryStep, ...]
    series_ts_us: tuple[float, ...]  # downsampled, keeping each bucket's maximum
    series_allocated: tuple[int, ...]
    series_reserved: tuple[int, ...]


def memory_report(trace: Trace, steps: tuple[Step, ...]) -> MemoryReport | None:
    """None when the trace has no GPU memory events (profile_memory off, or CPU only)."""
    m = trace.memory
    cuda = m.device_type == CUDA_DEVICE_TYPE
    if not cuda.any():
        return None
    devices, counts = np.unique(m.device_id[cuda], return_counts=True)
    device = int(devices[np.argmax(counts)])
    sel = cuda & (m.device_id == device)
    ts, size = m.ts[sel], m.bytes[sel]
    allocated, reserved = m.total_allocated[sel], m.total_reserved[sel]
    capacity = next((d.total_memory_bytes for d in trace.meta.devices if d.index == device), None)
    per_step = []
    for s in steps:
        inside = (ts >= s.start_us) & (ts < s.end_us)
        allocs = inside & (size > 0)
        per_step.append(
            MemoryStep(
                number=s.number,
                allocations=int(allocs.sum()),
                allocated_bytes=int(size[allocs].sum()),
                peak_allocated=int(allocated[inside].max()) if inside.any() else 0,
            )
        )
    st, sa, sr = _downsample(ts, allocated, reserved)
    return MemoryReport(
        device=device,
        events=int(sel.sum()),
        peak_allocated=int(allocated.max()),
        peak_reserved=int(reserved.max()),
        capacity=capacity,
        steps=tuple(per_step),
        series_ts_us=st,
        series_allocated=sa,
        series_reserved=sr,
    )


def _downsample(
    ts: np.ndarray, allocated: np.ndarray, reserved: np.ndarray
) -> tuple[tuple[float, ...], tuple[int, ...], tuple[int, ...]]:
    if len(ts) <= SERIES_POINTS:
        return tuple(ts.tolist()), tuple(allocated.tolist()), tuple(reserved.tolist())
    bucket = np.minimum((np.arange(len(ts)) * SERIES_POINTS) // len(ts), SERIES_POINTS - 1)
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    return (
        tuple(ts[starts].tolist()),
        tuple(np.maximum.reduceat(allocated, starts).tolist()),
        tuple(np.maximum.reduceat(reserved, starts).tolist()),
    )

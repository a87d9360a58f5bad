"""GPU memory from `profile_memory` events: allocated and reserved over time, the peak, and the
allocations made in each step. Where the events carry no allocator totals (PyTorch <= 1.9 wrote only
each allocation's `Bytes`), allocated memory is their running sum: the rise from the trace's start."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpudoctor.trace.model import Trace
from gpudoctor.trace.steps import Step

CUDA_DEVICE_TYPE = 1  # c10::DeviceType::CUDA
SERIES_POINTS = 400
RISE = "rise"


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
    # "total": allocated as the allocator counted it; "rise": the running sum of the trace's allocations
    # and frees, from 0 at its start (what was allocated before is unknown; reserved: not recorded, -1)
    allocated_basis: str = "total"

    @property
    def is_rise(self) -> bool:
        """Whether allocated memory is the rise from the trace's start, not the allocator's total."""
        return self.allocated_basis == RISE

    @property
    def reserved_recorded(self) -> bool:
        return self.peak_reserved >= 0


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
    rise = bool((allocated < 0).any())
    if rise:  # no allocator totals on some events: count what the trace saw allocated and freed
        allocated = np.cumsum(size)
        if not (reserved >= 0).all():
            reserved = np.full(len(ts), -1, dtype=np.int64)
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
        peak_allocated=max(int(allocated.max()), 0),
        peak_reserved=int(reserved.max()),
        capacity=capacity,
        steps=tuple(per_step),
        series_ts_us=st,
        series_allocated=sa,
        series_reserved=sr,
        allocated_basis=RISE if rise else "total",
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

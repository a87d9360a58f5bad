"""Memory copies between host and device: bytes, time and bandwidth per direction, pageable versus
pinned host memory (Kineto names the memory kinds), and copies that blocked the host."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpudoctor.analysis import classify
from gpudoctor.analysis.syncs import SYNC_TOLERANCE_US
from gpudoctor.trace.links import launch_rows
from gpudoctor.trace.model import Kind, Trace

# Below this many bytes a copy's time is latency, and bytes/time says nothing about bandwidth.
MIN_BANDWIDTH_BYTES = 1 << 20


@dataclass(frozen=True)
class TransferStat:
    direction: str  # 'h2d', 'd2h', 'd2d', 'other'
    count: int
    bytes: int
    time_us: float
    bandwidth: float | None  # bytes/s over the copies' own GPU time (None under MIN_BANDWIDTH_BYTES)
    pageable_count: int  # host side in pageable (not pinned) memory
    pageable_bytes: int
    blocking_count: int  # the launching call returned only after the copy ended
    # copy time on a stream that also runs kernels: in order with that compute, it cannot overlap it
    on_compute_stream_us: float = 0.0


@dataclass(frozen=True)
class TransferReport:
    directions: tuple[TransferStat, ...]
    memset_count: int
    memset_time_us: float

    def get(self, direction: str) -> TransferStat | None:
        return next((d for d in self.directions if d.direction == direction), None)


def transfer_report(trace: Trace, window: tuple[float, float] | None = None) -> TransferReport:
    copies = trace.rows(Kind.MEMCPY)
    memsets = trace.rows(Kind.MEMSET)
    if window is not None:
        copies = copies[(trace.ts[copies] >= window[0]) & (trace.ts[copies] < window[1])]
        memsets = memsets[(trace.ts[memsets] >= window[0]) & (trace.ts[memsets] < window[1])]
    pageable_name = trace.name_ids_matching(classify.is_pageable, trace.name[copies])
    direction = classify.copy_directions(trace, copies)
    launch = launch_rows(trace, copies)
    linked = launch >= 0
    blocking = np.zeros(len(copies), dtype=bool)
    call_end = trace.ts[launch[linked]] + trace.dur[launch[linked]]
    blocking[linked] = call_end >= trace.ts[copies[linked]] + trace.dur[copies[linked]] - SYNC_TOLERANCE_US
    kernels = trace.rows(Kind.KERNEL)
    if window is not None:
        kernels = kernels[(trace.ts[kernels] >= window[0]) & (trace.ts[kernels] < window[1])]
    compute_streams = np.unique(trace.device[kernels].astype(np.int64) * (1 << 40) + trace.stream[kernels])
    on_compute = np.isin(
        trace.device[copies].astype(np.int64) * (1 << 40) + trace.stream[copies], compute_streams
    )
    stats = []
    for d in classify.COPY_DIRECTIONS:
        mine = direction == d
        if not mine.any():
            continue
        rows = copies[mine]
        size = np.maximum(trace.bytes[rows], 0)
        time = float(trace.dur[rows].sum())
        pageable = pageable_name[trace.name[rows]]
        stats.append(
            TransferStat(
                direction=d,
                count=len(rows),
                bytes=int(size.sum()),
                time_us=time,
                bandwidth=float(size.sum()) / (time * 1e-6)
                if time > 0 and size.sum() >= MIN_BANDWIDTH_BYTES
                else None,
                pageable_count=int(pageable.sum()),
                pageable_bytes=int(size[pageable].sum()),
                blocking_count=int(blocking[mine].sum()),
                on_compute_stream_us=float(trace.dur[rows][on_compute[mine]].sum()),
            )
        )
    return TransferReport(tuple(stats), len(memsets), float(trace.dur[memsets].sum()))

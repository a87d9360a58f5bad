"""The GPU timeline: busy time by kind and idle time by cause, per step and overall. Busy is the union of
all GPU activity on every stream; each idle gap is put down to one cause — `launch_gap`, `sync`,
`host_wait` or `other` — from the activity that ends it and the call that launched that activity. The
definitions, and how they differ from HTA's per-stream breakdown: docs/analysis.md, "GPU timeline"."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpudoctor.analysis import classify
from gpudoctor.analysis.intervals import Disjoint, union_groups
from gpudoctor.analysis.syncs import SYNC_TOLERANCE_US, host_sync_rows
from gpudoctor.trace.links import launch_rows
from gpudoctor.trace.model import GPU_ACTIVITY_KINDS, Trace
from gpudoctor.trace.steps import Step

IDLE_CAUSES = ("host_wait", "sync", "launch_gap", "other")
_AFTER_SYNC = "host_wait_after_sync"


@dataclass(frozen=True)
class TimeBreakdown:
    """Where the time of one window went on the GPU. Busy kinds are exclusive (a moment when compute
    and a copy overlap counts as compute, in `classify.ACTIVITY_LABELS` order) and sum to busy."""

    start_us: float
    end_us: float
    busy_us: float
    busy_by_kind_us: dict[str, float]
    idle_by_cause_us: dict[str, float]
    host_wait_after_sync_us: float  # the part of host_wait that followed a sync (the queue was drained)

    @property
    def window_us(self) -> float:
        return self.end_us - self.start_us

    @property
    def idle_us(self) -> float:
        return max(self.window_us - self.busy_us, 0.0)

    @property
    def busy_fraction(self) -> float:
        return self.busy_us / self.window_us if self.window_us > 0 else float("nan")


@dataclass(frozen=True)
class GpuTimeline:
    steps: tuple[TimeBreakdown, ...]  # one per profiled step (its window: see trace.steps.Step)
    profiled_steps: TimeBreakdown | None  # from the first step's start to the last step's end
    gpu_window: TimeBreakdown | None  # first GPU activity to last (HTA's window)
    concurrent_kinds_us: dict[str, float]  # each kind's own union, overlaps included


def gpu_timeline(
    trace: Trace, steps: tuple[Step, ...], gpu: np.ndarray | None = None, first: int = 0
) -> GpuTimeline:
    """Busy and idle per step, over the profiled steps, and over the GPU's own span. `gpu` restricts
    the GPU activity considered (default: all kernels, copies and memsets). The profiled-steps window
    starts at `steps[first]`: warm-up steps before it have their own breakdown and are left out of it."""
    if gpu is None:
        gpu = trace.rows(*GPU_ACTIVITY_KINDS)
    if not len(gpu):
        return GpuTimeline((), None, None, {})
    start, end = trace.ts[gpu], trace.ts[gpu] + trace.dur[gpu]
    labels = classify.gpu_activity_label(trace, gpu)
    busy_layers, concurrent = _busy_layers(start, end, labels)
    idle = idle_intervals(trace, steps, gpu)

    def window(a: float, b: float) -> TimeBreakdown:
        return _breakdown(a, b, busy_layers, idle)

    per_step = tuple(window(s.window_start_us, s.window_end_us) for s in steps)
    profiled = window(steps[first].window_start_us, steps[-1].window_end_us) if steps else None
    return GpuTimeline(per_step, profiled, window(float(start.min()), float(end.max())), concurrent)


def _busy_layers(
    start: np.ndarray, end: np.ndarray, labels: np.ndarray
) -> tuple[list[tuple[str, Disjoint]], dict[str, float]]:
    """Cumulative unions in priority order: layer k covers kinds 0..k; exclusive time of kind k in a
    window is layer k minus layer k-1 there."""
    layers: list[tuple[str, Disjoint]] = []
    concurrent: dict[str, float] = {}
    selected = np.zeros(len(start), dtype=bool)
    for label in classify.ACTIVITY_LABELS:
        mine = labels == label
        if not mine.any():
            continue
        concurrent[label] = Disjoint.of(start[mine], end[mine]).total
        selected |= mine
        layers.append((label, Disjoint.of(start[selected], end[selected])))
    return layers, concurrent


def _breakdown(
    a: float, b: float, layers: list[tuple[str, Disjoint]], idle: dict[str, Disjoint]
) -> TimeBreakdown:
    by_kind: dict[str, float] = {}
    below = 0.0
    for label, layer in layers:
        covered = float(layer.covered(np.array([a]), np.array([b]))[0])
        by_kind[label] = max(covered - below, 0.0)
        below = covered
    by_cause = {c: float(d.covered(np.array([a]), np.array([b]))[0]) for c, d in idle.items()}
    after_sync = by_cause.pop(_AFTER_SYNC)
    return TimeBreakdown(a, b, below, by_kind, by_cause, after_sync)


def idle_intervals(
    trace: Trace, steps: tuple[Step, ...], gpu: np.ndarray | None = None
) -> dict[str, Disjoint]:
    """The GPU's idle intervals by cause (and `host_wait_after_sync`), over the whole trace; `gpu`
    restricts the activity considered. Memoized per trace, steps and activity."""
    if gpu is None:
        gpu = trace.rows(*GPU_ACTIVITY_KINDS)
    key = ("idle", len(gpu), hash(gpu.tobytes()), tuple((s.window_start_us, s.window_end_us) for s in steps))
    if key not in trace._memo:
        start, end = trace.ts[gpu], trace.ts[gpu] + trace.dur[gpu]
        trace._memo[key] = _idle_by_cause(trace, gpu, start, end, steps) if len(gpu) else {}
    return trace._memo[key]


def _idle_by_cause(
    trace: Trace, gpu: np.ndarray, start: np.ndarray, end: np.ndarray, steps: tuple[Step, ...]
) -> dict[str, Disjoint]:
    """The idle gaps of the whole trace (including before the first and after the last activity,
    as far as the steps reach), each labelled with its cause."""
    busy_start, busy_end, opener = union_groups(start, end)
    lo = min(float(busy_start[0]), steps[0].window_start_us) if steps else float(busy_start[0])
    hi = max(float(busy_end[-1]), steps[-1].window_end_us) if steps else float(busy_end[-1])
    gap_start = np.concatenate(([lo], busy_end))
    gap_end = np.concatenate((busy_start, [hi]))
    # The launch time of the activity that closes each gap (+inf after the last one: nothing came).
    launch = launch_rows(trace, gpu[opener])
    launch_ts = np.where(launch >= 0, trace.ts[np.maximum(launch, 0)], np.nan)
    next_launch = np.concatenate((launch_ts, [np.inf]))
    has_launch = ~np.isnan(next_launch)
    host_late = has_launch & (next_launch > gap_start)
    # A gap the host opened late while blocked in a synchronization: the GPU idles for the sync's
    # return (`sync`), then for whatever the host does before its next launch (`host_wait`).
    sync_end = _sync_in_flight(trace, gap_start)
    in_sync = host_late & ~np.isnan(sync_end)
    split = np.where(in_sync, np.clip(sync_end, gap_start, gap_end), gap_start)
    cause = np.full(len(gap_start), "other", dtype=object)
    cause[has_launch & ~host_late] = "launch_gap"
    cause[host_late] = "host_wait"
    starts = {c: gap_start[cause == c] for c in IDLE_CAUSES}
    ends = {c: gap_end[cause == c] for c in IDLE_CAUSES}
    starts["sync"], ends["sync"] = gap_start[in_sync], split[in_sync]
    starts["host_wait"] = np.where(in_sync, split, gap_start)[cause == "host_wait"]
    starts[_AFTER_SYNC], ends[_AFTER_SYNC] = split[in_sync], gap_end[in_sync]
    return {c: _nonempty(starts[c], ends[c]) for c in (*IDLE_CAUSES, _AFTER_SYNC)}


def _nonempty(start: np.ndarray, end: np.ndarray) -> Disjoint:
    keep = end > start
    return Disjoint.of(start[keep], end[keep])


def _sync_in_flight(trace: Trace, at: np.ndarray) -> np.ndarray:
    """For each time, when the host synchronization in flight then returns (NaN if none is; the
    tolerance absorbs host/device clock skew)."""
    syncs = host_sync_rows(trace)
    if not len(syncs):
        return np.full(len(at), np.nan)
    order = np.argsort(trace.ts[syncs])
    s_ts = trace.ts[syncs][order]
    s_end = (trace.ts[syncs] + trace.dur[syncs])[order]
    reach = np.maximum.accumulate(s_end)
    i = np.searchsorted(s_ts, at + SYNC_TOLERANCE_US, side="right") - 1
    ends = reach[np.maximum(i, 0)]
    return np.where((i >= 0) & (ends >= at - SYNC_TOLERANCE_US), ends, np.nan)

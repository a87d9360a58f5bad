"""What the reports draw from a trace beyond the `Analysis`: the GPU timeline of one representative
step (merged to a bounded number of spans, so a huge trace draws small), the idle spans by cause and
the launch-queue depth over time for the annotated trace. Pure functions of a `Trace`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpudoctor.analysis import classify
from gpudoctor.analysis.timeline import IDLE_CAUSES, idle_intervals
from gpudoctor.trace.iterations import find_iterations
from gpudoctor.trace.links import launch_rows
from gpudoctor.trace.model import GPU_ACTIVITY_KINDS, Trace
from gpudoctor.trace.steps import Step

MAX_SPANS_PER_LANE = 1500  # after merging; a 50 MB trace's timeline stays a few hundred kB of SVG
MAX_COUNTER_POINTS = 4000


@dataclass(frozen=True)
class Span:
    start_us: float  # relative to the timeline's start
    end_us: float
    label: str  # one of classify.ACTIVITY_LABELS
    name: str  # the longest activity merged into this span (raw: renderers escape it)
    count: int  # activities merged into it


@dataclass(frozen=True)
class Lane:
    device: int
    stream: int
    spans: tuple[Span, ...]


@dataclass(frozen=True)
class StepTimeline:
    step: int | None  # None when the trace has no steps (then the whole GPU span)
    start_us: float  # trace time of the window's start
    duration_us: float
    lanes: tuple[Lane, ...]
    idle: tuple[tuple[float, float, str], ...]  # (start, end, cause), relative, merged like spans


@dataclass(frozen=True)
class IdleSpans:
    """The GPU's idle intervals by cause over the profiled steps, in trace time (µs)."""

    origin_us: float  # the trace file's timestamp of time 0: add it to write times back into the file
    by_cause: dict[str, tuple[np.ndarray, np.ndarray]]
    step_windows: tuple[tuple[int, float, float], ...]  # (number, start, end)
    queue_ts_us: np.ndarray  # launch-queue depth: launched, not yet started GPU work
    queue_depth: np.ndarray


def representative_step(steps: tuple[Step, ...]) -> Step | None:
    """The step of median duration (the first on ties): typical, not the warm-up outlier."""
    if not steps:
        return None
    order = sorted(range(len(steps)), key=lambda i: (steps[i].duration_us, i))
    return steps[order[(len(order) - 1) // 2]]


def step_timeline(trace: Trace, step_number: int | None = None) -> StepTimeline | None:
    """The GPU activity of one step (default: the representative one), one lane per device and stream,
    neighbouring spans of a kind merged where they would be under a pixel apart. None without GPU work."""
    gpu = trace.rows(*GPU_ACTIVITY_KINDS)
    if not len(gpu):
        return None
    steps = find_iterations(trace).steps
    step = next((s for s in steps if s.number == step_number), None) or representative_step(steps)
    if step is not None:
        a, b = step.window_start_us, step.window_end_us
    else:
        a, b = float(trace.ts[gpu].min()), float((trace.ts[gpu] + trace.dur[gpu]).max())
    inside = gpu[(trace.ts[gpu] < b) & (trace.ts[gpu] + trace.dur[gpu] > a)]
    labels = classify.gpu_activity_label(trace, inside)
    resolution = max(b - a, 1e-3) / 2000
    lanes = []
    for device, stream in sorted(
        {(int(d), int(s)) for d, s in zip(trace.device[inside], trace.stream[inside], strict=True)}
    ):
        mine = (trace.device[inside] == device) & (trace.stream[inside] == stream)
        rows, lab = inside[mine], labels[mine]
        start = np.clip(trace.ts[rows], a, b) - a
        end = np.clip(trace.ts[rows] + trace.dur[rows], a, b) - a
        names = [trace.names[int(i)] for i in trace.name[rows]]
        lanes.append(Lane(device, stream, _merged(start, end, lab, names, resolution)))
    idle = []
    for cause, d in idle_intervals(trace, steps).items():
        if cause not in IDLE_CAUSES:
            continue
        keep = (d.end > a) & (d.start < b)
        for s, e in zip(np.clip(d.start[keep], a, b) - a, np.clip(d.end[keep], a, b) - a, strict=True):
            if e - s >= resolution:
                idle.append((float(s), float(e), cause))
    return StepTimeline(step.number if step else None, a, b - a, tuple(lanes), tuple(sorted(idle)))


def _merged(
    start: np.ndarray, end: np.ndarray, labels: np.ndarray, names: list[str], resolution: float
) -> tuple[Span, ...]:
    """Spans of one lane, neighbours of one label merged when the gap between them is under
    `resolution`; the resolution doubles until the lane fits MAX_SPANS_PER_LANE."""
    order = np.argsort(start, kind="stable")
    while True:
        spans: list[Span] = []
        cur: list = []  # start, end, label, best name, best duration, count
        for i in order.tolist():
            s, e, lab = float(start[i]), float(end[i]), labels[i]
            if cur and lab == cur[2] and s - cur[1] < resolution:
                cur[1] = max(cur[1], e)
                cur[5] += 1
                if e - s > cur[4]:
                    cur[3], cur[4] = names[i], e - s
                continue
            if cur:
                spans.append(Span(cur[0], cur[1], cur[2], cur[3], cur[5]))
            cur = [s, e, lab, names[i], e - s, 1]
        if cur:
            spans.append(Span(cur[0], cur[1], cur[2], cur[3], cur[5]))
        if len(spans) <= MAX_SPANS_PER_LANE:
            return tuple(spans)
        resolution *= 2


def idle_spans(trace: Trace) -> IdleSpans:
    """Idle intervals by cause within the profiled steps (the whole trace without steps), and the
    launch-queue depth, downsampled to at most MAX_COUNTER_POINTS points (each bucket's maximum)."""
    steps = find_iterations(trace).steps
    idle = idle_intervals(trace, steps)
    if steps:
        lo, hi = steps[0].window_start_us, steps[-1].window_end_us
    else:
        lo, hi = -np.inf, np.inf
    by_cause = {}
    for cause in IDLE_CAUSES:
        if cause in idle:
            d = idle[cause]
            keep = (d.end > lo) & (d.start < hi)
            by_cause[cause] = (np.clip(d.start[keep], lo, hi), np.clip(d.end[keep], lo, hi))
    windows = tuple((s.number, s.window_start_us, s.window_end_us) for s in steps)
    ts, depth = _queue_depth(trace)
    return IdleSpans(trace.meta.origin_us, by_cause, windows, ts, depth)


def _queue_depth(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    gpu = trace.rows(*GPU_ACTIVITY_KINDS)
    launch = launch_rows(trace, gpu) if len(gpu) else np.zeros(0, dtype=np.int64)
    has = launch >= 0
    if not has.any():
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    ups, downs = trace.ts[launch[has]], trace.ts[gpu[has]]
    ts = np.concatenate((ups, downs))
    delta = np.concatenate((np.ones(len(ups), np.int64), -np.ones(len(downs), np.int64)))
    order = np.lexsort((delta, ts))  # a start before a launch at the same moment: depth never dips < 0
    ts, depth = ts[order], np.maximum(np.cumsum(delta[order]), 0)
    if len(ts) > MAX_COUNTER_POINTS:
        edges = np.linspace(ts[0], ts[-1], MAX_COUNTER_POINTS + 1)
        bucket = np.clip(np.searchsorted(edges, ts, side="right") - 1, 0, MAX_COUNTER_POINTS - 1)
        peak = np.zeros(MAX_COUNTER_POINTS, np.int64)
        np.maximum.at(peak, bucket, depth)
        used = np.unique(bucket)
        ts, depth = edges[used], peak[used]
    return ts, depth

"""Training/inference steps from the `ProfilerStep#N` annotations torch.profiler writes on the CPU
timeline (and, in newer Kineto, mirrors on the GPU timeline)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from gpudoctor.trace.links import launch_rows
from gpudoctor.trace.model import GPU_ACTIVITY_KINDS, Kind, Trace

_STEP = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass(frozen=True)
class Step:
    number: int
    start_us: float  # CPU ProfilerStep span: what the user's loop took
    end_us: float
    gpu_start_us: float | None  # first / last GPU activity the step launched
    gpu_end_us: float | None

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


def find_steps(trace: Trace) -> tuple[Step, ...]:
    """The profiled steps, in order; empty when the trace has no `ProfilerStep#N` annotation."""
    annotations = trace.rows(Kind.USER_ANNOTATION)
    step_name = {i: int(m.group(1)) for i, n in enumerate(trace.names) if (m := _STEP.match(n))}
    if not step_name or not len(annotations):
        return ()
    is_step = np.isin(trace.name[annotations], np.fromiter(step_name, dtype=np.int64))
    rows = annotations[is_step]
    if not len(rows):
        return ()
    # One thread drives the loop; if several carry steps (rare), keep the busiest.
    threads, counts = np.unique(trace.tid[rows], return_counts=True)
    rows = rows[trace.tid[rows] == threads[np.argmax(counts)]]
    gpu_spans = _gpu_spans(trace, rows)
    steps = []
    for r in rows.tolist():
        number = step_name[int(trace.name[r])]
        g0, g1 = gpu_spans.get(number, (None, None))
        steps.append(Step(number, float(trace.ts[r]), float(trace.ts[r] + trace.dur[r]), g0, g1))
    steps.sort(key=lambda s: (s.start_us, s.number))
    return tuple(steps)


def _gpu_spans(trace: Trace, step_rows: np.ndarray) -> dict[int, tuple[float, float]]:
    """GPU extent of each step: the GPU annotation if Kineto wrote one, else the span of the GPU
    activity whose launching call lies inside the step's CPU span."""
    spans: dict[int, tuple[float, float]] = {}
    for r in trace.rows(Kind.GPU_ANNOTATION).tolist():
        m = _STEP.match(trace.name_of(r))
        if m:
            spans[int(m.group(1))] = (float(trace.ts[r]), float(trace.ts[r] + trace.dur[r]))
    missing = [r for r in step_rows.tolist() if int(_STEP.match(trace.name_of(r)).group(1)) not in spans]  # type: ignore[union-attr]
    gpu = trace.rows(*GPU_ACTIVITY_KINDS)
    if not missing or not len(gpu):
        return spans
    launch = launch_rows(trace, gpu)
    linked = launch >= 0
    gpu, launch_ts = gpu[linked], trace.ts[launch[linked]]
    for r in missing:
        inside = (launch_ts >= trace.ts[r]) & (launch_ts < trace.ts[r] + trace.dur[r])
        if inside.any():
            g = gpu[inside]
            number = int(_STEP.match(trace.name_of(r)).group(1))  # type: ignore[union-attr]
            spans[number] = (float(trace.ts[g].min()), float((trace.ts[g] + trace.dur[g]).max()))
    return spans

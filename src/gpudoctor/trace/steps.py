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
    """One profiled step. Its CPU span is the `ProfilerStep#N` annotation; its GPU span covers the GPU
    work launched during that span (from any thread: backward kernels come from autograd's). Its window
    is where the step sits on the timeline once the GPU's lag is counted: it opens when the host has
    started the step and the GPU has finished the previous one, and closes where the next opens (the
    last closes when both host and GPU are done). Windows tile the profiled time; their length is the
    step time the loop really runs at, whether the host or the GPU is the slower."""

    number: int
    start_us: float  # CPU ProfilerStep span
    end_us: float
    gpu_start_us: float | None  # first / last GPU activity the step launched
    gpu_end_us: float | None
    window_start_us: float
    window_end_us: float

    @property
    def duration_us(self) -> float:
        """The step time: the length of its window."""
        return self.window_end_us - self.window_start_us

    @property
    def cpu_duration_us(self) -> float:
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
    rows = rows[np.argsort(trace.ts[rows], kind="stable")]
    cpu = [(float(trace.ts[r]), float(trace.ts[r] + trace.dur[r])) for r in rows.tolist()]
    gpu, before = _gpu_spans(trace, cpu)
    # Window boundaries: a step opens once the host started it and the GPU finished the one before.
    opens = []
    previous_gpu_end = before
    for (c0, _), g in zip(cpu, gpu, strict=True):
        opens.append(max(c0, previous_gpu_end) if previous_gpu_end is not None else c0)
        if g is not None:
            previous_gpu_end = g[1] if previous_gpu_end is None else max(previous_gpu_end, g[1])
    last_end = max(cpu[-1][1], gpu[-1][1] if gpu[-1] is not None else cpu[-1][1])
    closes = [*opens[1:], last_end]
    steps = []
    for i, r in enumerate(rows.tolist()):
        g0, g1 = gpu[i] if gpu[i] is not None else (None, None)
        steps.append(Step(step_name[int(trace.name[r])], *cpu[i], g0, g1, opens[i], max(closes[i], opens[i])))
    return tuple(steps)


def _gpu_spans(
    trace: Trace, cpu: list[tuple[float, float]]
) -> tuple[list[tuple[float, float] | None], float | None]:
    """For each CPU span, the extent of the GPU activity launched inside it (None if none); and when
    the GPU finished the work queued before the first step (None if there was none): work launched
    before it, and work whose launch the profiler did not record (it was queued before recording
    began) that ran before the first step's own."""
    gpu = trace.rows(*GPU_ACTIVITY_KINDS)
    if not len(gpu):
        return [None] * len(cpu), None
    launch = launch_rows(trace, gpu)
    linked = launch >= 0
    launch_ts = np.where(linked, trace.ts[np.maximum(launch, 0)], np.nan)
    start, end = trace.ts[gpu], trace.ts[gpu] + trace.dur[gpu]
    spans: list[tuple[float, float] | None] = []
    for c0, c1 in cpu:
        inside = (launch_ts >= c0) & (launch_ts < c1)
        spans.append((float(start[inside].min()), float(end[inside].max())) if inside.any() else None)
    first_own = next((sp[0] for sp in spans if sp is not None), np.inf)
    earlier = (launch_ts < cpu[0][0]) | (~linked & (start < first_own))
    return spans, (float(end[earlier].max()) if earlier.any() else None)

"""Steps on a trace's timeline: `find_steps` reads the `ProfilerStep#N` annotations torch.profiler writes
on the CPU timeline; `steps_from_spans` turns any CPU spans (inferred iterations: `trace.iterations`)
into steps, placing each on the timeline once the GPU's lag is counted; `leading_warmup` tells the
warm-up steps a trace may start with (autotuning, first allocations) from the loop's own."""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpudoctor.trace.links import launch_rows
from gpudoctor.trace.model import GPU_ACTIVITY_KINDS, LAUNCH_KINDS, Kind, Trace

_STEP = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass(frozen=True)
class Step:
    """One step. Its CPU span is the `ProfilerStep#N` annotation (or an inferred iteration's span); its
    GPU span covers the GPU work launched during that span (from any thread: backward kernels come from
    autograd's). Its window is where the step sits on the timeline once the GPU's lag is counted: it
    opens when the host has started the step and the GPU has finished the previous one, and closes where
    the next opens (the last closes when both host and GPU are done). Windows tile the profiled time;
    their length is the step time the loop really runs at, whether the host or the GPU is the slower."""

    number: int
    start_us: float  # CPU span
    end_us: float
    gpu_start_us: float | None  # first / last GPU activity the step launched
    gpu_end_us: float | None
    window_start_us: float
    window_end_us: float
    thread: tuple[int, int] | None = None  # (pid, tid) of the thread that drives the loop

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
    rows = on_busiest_thread(trace, rows)
    spans = [(float(trace.ts[r]), float(trace.ts[r] + trace.dur[r])) for r in rows.tolist()]
    numbers = [step_name[int(trace.name[r])] for r in rows.tolist()]
    return steps_from_spans(trace, spans, numbers, (int(trace.pid[rows[0]]), int(trace.tid[rows[0]])))


def on_busiest_thread(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """The rows of the thread that holds most of them (one thread drives a loop), in time order."""
    keys = trace.pid[rows] * (1 << 32) + trace.tid[rows]
    ids, counts = np.unique(keys, return_counts=True)
    rows = rows[keys == ids[np.argmax(counts)]]
    return rows[np.argsort(trace.ts[rows], kind="stable")]


def thread_extent(trace: Trace, thread: tuple[int, int]) -> tuple[float, float]:
    """When the loop's thread starts (its first host event, or when the profiler started recording,
    if earlier: a loop's first moments may be Python with no event) and when its last event ends."""
    rows = trace.rows(Kind.CPU_OP, Kind.USER_ANNOTATION, Kind.PYTHON, *LAUNCH_KINDS)
    mine = rows[(trace.pid[rows] == thread[0]) & (trace.tid[rows] == thread[1])]
    t0, t1 = float(trace.ts[mine].min()), float((trace.ts[mine] + trace.dur[mine]).max())
    other = trace.rows(Kind.OTHER)
    if len(other):
        profiler = trace.name_ids_matching(_is_profiler_span, trace.name[other])[trace.name[other]]
        if profiler.any():
            t0 = min(t0, float(trace.ts[other[profiler]].min()))
    return t0, t1


def _is_profiler_span(name: str) -> bool:
    return name.startswith("PyTorch Profiler")


def steps_from_spans(
    trace: Trace,
    spans: Sequence[tuple[float, float]],
    numbers: Sequence[int],
    thread: tuple[int, int] | None = None,
) -> tuple[Step, ...]:
    """Steps from CPU spans in time order (not overlapping): each gets the GPU work launched inside it
    and its window on the timeline."""
    if not spans:
        return ()
    cpu = [(float(a), float(b)) for a, b in spans]
    gpu, before = _gpu_spans(trace, cpu)
    if not launches_recorded(trace):
        # Where most GPU work has no recorded launch (a sampled or trimmed trace), the GPU cannot say
        # when a step's work ran: the windows are the CPU spans, the step times the loop's own.
        return tuple(
            Step(int(n), c0, c1, *(g if g is not None else (None, None)), c0, c1, thread)
            for n, (c0, c1), g in zip(numbers, cpu, gpu, strict=True)
        )
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
    for i, number in enumerate(numbers):
        g0, g1 = gpu[i] if gpu[i] is not None else (None, None)
        steps.append(Step(int(number), *cpu[i], g0, g1, opens[i], max(closes[i], opens[i]), thread))
    return tuple(steps)


# A step at the start of a trace is a warm-up where it is longer than every later step and this many
# times their median: cudnn autotuning, first allocations and lazy initialization take seconds once, and
# a loop's own steps vary far less than that.
WARMUP_FACTOR = 3.0
# and by this much at least: what a warm-up costs (an autotuning pass, first allocations) is tens of ms or
# more, where a short loop's first profiled step on a busy host may be a few ms slower than its others
WARMUP_MIN_EXCESS_US = 20_000.0


def leading_warmup(steps: Sequence[Step]) -> int:
    """How many steps at the start of a trace are warm-up outliers (see WARMUP_FACTOR), each judged
    against the steps after it; at least one step is always left. A step that launched GPU work is
    judged only against steps that did too (a trace cut off just after its last step began ends with
    a stub), and none against steps of no length."""
    n = 0
    while n < len(steps) - 1:
        rest = steps[n + 1 :]
        typical = statistics.median(s.duration_us for s in rest)
        comparable = steps[n].gpu_start_us is None or all(s.gpu_start_us is not None for s in rest)
        longest = max(s.duration_us for s in rest)
        d = steps[n].duration_us
        if not comparable or typical <= 0 or d <= longest or d <= WARMUP_FACTOR * typical:
            break
        if d - typical < WARMUP_MIN_EXCESS_US:
            break
        n += 1
    return n


MIN_LINKED_SHARE = 0.5  # of the GPU activities, with their launching call recorded


def launches_recorded(trace: Trace) -> bool:
    """Whether most of the trace's GPU activity has its launching call in the trace (no GPU activity:
    True, nothing is missing)."""
    gpu = trace.rows(*GPU_ACTIVITY_KINDS)
    return not len(gpu) or float((launch_rows(trace, gpu) >= 0).mean()) >= MIN_LINKED_SHARE


def _gpu_spans(
    trace: Trace, cpu: list[tuple[float, float]]
) -> tuple[list[tuple[float, float] | None], float | None]:
    """For each CPU span, the extent of the GPU activity launched inside it (None if none); and when
    the GPU finished the work queued before the first step (None if there was none): work launched
    before it, and work whose launch the profiler did not record (it was queued before recording
    began) that ran before the first step's own. Linear in the activity (spans are in time order)."""
    gpu = trace.rows(*GPU_ACTIVITY_KINDS)
    if not len(gpu):
        return [None] * len(cpu), None
    launch = launch_rows(trace, gpu)
    linked = launch >= 0
    launch_ts = trace.ts[launch[linked]]
    order = np.argsort(launch_ts, kind="stable")
    when = launch_ts[order]
    start = trace.ts[gpu[linked]][order]
    end = (trace.ts[gpu] + trace.dur[gpu])[linked][order]
    bounds = np.array(cpu)
    lo = np.searchsorted(when, bounds[:, 0], side="left")
    hi = np.searchsorted(when, bounds[:, 1], side="left")
    spans: list[tuple[float, float] | None] = []
    for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
        spans.append((float(start[a:b].min()), float(end[a:b].max())) if b > a else None)
    first_own = next((sp[0] for sp in spans if sp is not None), np.inf)
    all_start, all_end = trace.ts[gpu], trace.ts[gpu] + trace.dur[gpu]
    launched_before = np.zeros(len(gpu), dtype=bool)
    launched_before[linked] = trace.ts[launch[linked]] < cpu[0][0]
    earlier = launched_before | (~linked & (all_start < first_own))
    return spans, (float(all_end[earlier].max()) if earlier.any() else None)

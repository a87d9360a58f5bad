"""The profiler's own cost, estimated from the trace alone: `profiler_cost(trace, steps)`.

torch.profiler records every op, runtime call, Python frame (`with_stack`), op's arguments (`record_shapes`)
and allocation (`profile_memory`) on the host as the program runs; each record costs host time the program
does not spend unprofiled. The estimate counts those records per step and prices each kind with a cost per
event (`COSTS`). What the profiler adds to the *step* is at most that: the GPU's own work bounds the step
from below, so the unprofiled step is estimated as max(traced − cost, GPU busy).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpudoctor.analysis.classify import COMPILED, name_mask
from gpudoctor.trace.links import gpu_rows_of_launch
from gpudoctor.trace.model import LAUNCH_KINDS, Kind, Trace
from gpudoctor.trace.steps import Step


@dataclass(frozen=True)
class EventCost:
    us: float  # host time the profiler adds per event of this kind
    source: str  # where the figure comes from


# Measured by tools/measure_profiler_cost.py on an H100 (torch 2.11): two host-bound probes, eager and
# torch.compile'd, each traced under every option set; each cost a least-squares fit of the step time an
# option adds over the records it adds (benchmarks/results/profiler_cost.json; tests/test_profiler_cost.py
# holds these to it). The figures and how well the estimate holds: docs/results.md, "The profiler's cost".
_PROBES = "H100 probes (eager + compiled GPT blocks), tools/measure_profiler_cost.py"
COSTS: dict[str, EventCost] = {
    # Default options: traced − unprofiled step over its ops, annotations and runtime calls.
    "event": EventCost(1.78, f"{_PROBES}: eager, default options vs unprofiled"),
    # Provisional: the compiled probe cannot resolve what an Inductor launch costs (its fit is negative,
    # within its unprofiled steps' drift); 30 µs is what the traces that measure it need.
    "compiled_launch": EventCost(
        30.0,
        "H200 zoo traces and the H100 GPT-2 acceptance trace; the H100 compiled probe's fit (−34.5, its rerun "
        "−11.3) not",
    ),
    "shaped_op": EventCost(1.52, f"{_PROBES}: record_shapes vs default"),
    "memory_event": EventCost(1.83, f"{_PROBES}: all options vs with_stack + record_shapes"),
    "python_frame": EventCost(1.50, f"{_PROBES}: with_stack vs default"),
}
# with_stack and record_shapes together cost more than each alone: with both on, shaped ops and Python
# frames are priced as fitted together.
COSTS_WITH_STACK_AND_SHAPES: dict[str, EventCost] = {
    "shaped_op": EventCost(1.40, f"{_PROBES}: with_stack + record_shapes vs default, fitted together"),
    "python_frame": EventCost(2.92, f"{_PROBES}: with_stack + record_shapes vs default, fitted together"),
}
# How far a per-event estimate may be off: the high end of what the profiler may have added, for judging
# verdicts that host time the profiler may have added could make (the acceptance asks ±30% of measured).
UNCERTAINTY = 1.3
COSTS_STATUS = (
    "measured: per option on an H100, torch 2.11 (2026-11-26), but the compiled-launch cost (provisional); "
    "another host CPU may differ"
)


def prices(options: tuple[str, ...]) -> dict[str, EventCost]:
    """The cost per event of each kind under these options."""
    if "with_stack" in options and "record_shapes" in options:
        return {**COSTS, **COSTS_WITH_STACK_AND_SHAPES}
    return dict(COSTS)


@dataclass(frozen=True)
class ProfilerCost:
    """Per traced step (the traced time where there are no steps): what the profiler recorded and its
    estimated host cost, in all and where it lengthens the step."""

    options: tuple[str, ...]  # the options the trace shows: with_stack, record_shapes, profile_memory
    counts: dict[str, float]  # events per step by kind (the keys of COSTS)
    est_us: float  # estimated host time the profiler added per step
    costs_status: str  # COSTS_STATUS: provisional or measured

    def est_unprofiled_us(self, traced_step_us: float, gpu_busy_us: float, margin: float = 1.0) -> float:
        """The step without the profiler: the traced step less the profiler's cost (times `margin`: the
        high end of the estimate is UNCERTAINTY), never shorter than the GPU's own work. (Where the host
        waits for the GPU anyway, in a synchronization or a full launch queue, part of the cost hides
        behind the GPU: then this is a lower bound.)"""
        return max(traced_step_us - margin * self.est_us, gpu_busy_us, 0.0)


def profiler_cost(trace: Trace, steps: tuple[Step, ...]) -> ProfilerCost | None:
    """None for a trace without host events (nothing recorded on the CPU)."""
    host = trace.rows(Kind.CPU_OP, Kind.USER_ANNOTATION, *LAUNCH_KINDS)
    if not len(host):
        return None
    spans = [(s.start_us, s.end_us) for s in steps] or [
        (float(trace.ts.min()), float((trace.ts + trace.dur).max()))
    ]
    n = len(spans)

    def inside(ts: np.ndarray) -> float:
        """How many of these events per step."""
        hit = np.zeros(len(ts), dtype=bool)
        for a, b in spans:
            hit |= (ts >= a) & (ts < b)
        return float(hit.sum()) / n

    ops = trace.rows(Kind.CPU_OP)
    events = np.concatenate((ops, trace.rows(Kind.USER_ANNOTATION), trace.rows(*LAUNCH_KINDS)))
    shapes = bool(len(trace.op_inputs)) or bool(trace.meta.profiler_config.get("record_shapes"))
    empty = np.empty(0, np.float64)
    counts = {
        "event": inside(trace.ts[events]),
        "compiled_launch": inside(trace.ts[_compiled_launches(trace, trace.rows(*LAUNCH_KINDS))]),
        "shaped_op": inside(trace.ts[ops] if shapes else empty),
        "memory_event": inside(trace.memory.ts),
        "python_frame": inside(trace.ts[trace.rows(Kind.PYTHON)]),
    }
    options = tuple(
        name
        for name, on in (
            ("with_stack", counts["python_frame"] > 0),
            ("record_shapes", shapes),
            ("profile_memory", counts["memory_event"] > 0),
        )
        if on
    )
    price = prices(options)
    est = sum(price[k].us * v for k, v in counts.items())
    return ProfilerCost(options, counts, est, COSTS_STATUS)


def _compiled_launches(trace: Trace, launches: np.ndarray) -> np.ndarray:
    """The launch calls of kernels a compiler generated (Inductor's Triton kernels), which the profiler
    records through Inductor's own launcher: the costliest launches to profile."""
    if not len(launches):
        return launches
    gpu = gpu_rows_of_launch(trace, launches)
    has = gpu >= 0
    compiled = np.zeros(len(launches), dtype=bool)
    if has.any():
        rows = gpu[has]
        compiled[has] = name_mask(trace, COMPILED, rows)[trace.name[rows]]
    return launches[compiled]

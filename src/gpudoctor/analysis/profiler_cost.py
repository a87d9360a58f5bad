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


# PROVISIONAL until tools/measure_profiler_cost.py has run on the GPU (it writes the measured table to
# benchmarks/results/profiler_cost.json; tests/test_profiler_cost.py holds these to the committed figures).
# Derived from committed H100/H200 measurements, each traced − unprofiled step difference divided by the
# events that option adds per step:
COSTS: dict[str, EventCost] = {
    # conv_bf16_train fixture (ResNet-50 bf16, H200, default options): 39.7 ms traced, 29.3 ms unprofiled,
    # 3,765 ops + 1,623 runtime calls per step -> 1.93 µs; GPU.md's H100 table (ResNet-50, 30% slower
    # under CPU+CUDA activity, ~5,100 such events per step) -> 1.86 µs.
    "event": EventCost(1.9, "conv_bf16_train fixture and GPU.md observer-effect table (H200, H100)"),
    # Kernels Inductor generated, launched through its own launcher, which the profiler records as an op
    # with its arguments: what 1.9 µs per event leaves of the traced - unprofiled difference, per Triton
    # launch, is 16 µs on zoo optimizer_unfused__slow (compiled GPT, eager optimizer, host-bound in both
    # runs: 422 launches, 20.7 ms) and >= 42 µs on zoo profiler_distortion__fixed (compiled ResNet, 184
    # launches, 9.7 ms; GPU-bound unprofiled, so a floor). 30 µs puts both within 30%.
    "compiled_launch": EventCost(30.0, "zoo optimizer_unfused__slow and profiler_distortion__fixed (H200)"),
    # transformer_shapes vs transformer_train fixtures (the same GPT step, H200, record_shapes + with_flops
    # against none): 35.4 vs 22.8 ms traced over 3,181 ops per step -> 4.0 µs per op.
    "shaped_op": EventCost(4.0, "transformer_shapes vs transformer_train fixtures (H200)"),
    # zoo memory_pressure__slow (profile_memory) vs control_transformer (same step, H200): +0.5 ms for 394
    # allocation events per step -> 1.3 µs (a floor: that step is GPU-bound).
    "memory_event": EventCost(1.3, "zoo memory_pressure__slow vs control_transformer (H200)"),
    # zoo profiler_distortion__slow vs __fixed (with_stack + record_shapes + profile_memory vs default,
    # H200): +16.3 ms per step; less 541 shaped ops and 620 allocations at the costs above, over 6,434
    # Python frame events -> 2.1 µs each.
    "python_frame": EventCost(2.1, "zoo profiler_distortion__slow vs __fixed (H200)"),
}
# How far a per-event estimate may be off: the high end of what the profiler may have added, for judging
# verdicts that host time the profiler may have added could make (the acceptance asks ±30% of measured).
UNCERTAINTY = 1.3
COSTS_STATUS = (
    "provisional: derived from committed traced vs unprofiled step times, not yet measured per option"
)


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
    est = sum(COSTS[k].us * v for k, v in counts.items())
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

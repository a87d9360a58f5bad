"""The host side: per step, time in the DataLoader, the optimizer step, CPU ops and launch calls; and
PyTorch ops ranked by the GPU time of the kernels they launched (self and with their children)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from gpudoctor.analysis import classify
from gpudoctor.analysis.intervals import Disjoint, difference
from gpudoctor.trace.links import gpu_rows_of_launch, op_parents, op_rows, op_subtrees
from gpudoctor.trace.model import GPU_ACTIVITY_KINDS, LAUNCH_KINDS, Kind, Trace
from gpudoctor.trace.steps import Step

DATALOADER = re.compile(r"DataLoader.*__next__|^DataLoader\.__next__|_next_data|fetch.*DataLoader", re.I)
OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#|^Optimizer\.step$|optimizer\.step", re.I)
# A closure given to optimizer.step (Lightning's automatic optimization, LBFGS) runs the forward and
# backward inside the optimizer's range: gpudoctor run labels it; Lightning's profiler names its hooks.
CLOSURE = re.compile(r"^gpudoctor\.closure$|training_step|\bbackward\b|closure|gradient_clipping", re.I)
BACKWARD_OP = re.compile(r"^autograd::engine::evaluate_function")
# A host gap (in no op, DataLoader or synchronization, on any thread) this long, opened with at least
# AHEAD_QUEUED GPU activities launched and not yet started: the host is that far ahead of its GPU, blocked
# where the trace shows no op (a full launch queue behind a collective that waits for another rank) or
# working where it does not pace the GPU. A straggler's own host work leaves its GPU far fewer queued
# (docs/results.md, "Several GPUs").
AHEAD_GAP_US = 1000.0
AHEAD_QUEUED = 256
ZERO_GRAD = re.compile(r"^Optimizer\.zero_grad#")


@dataclass(frozen=True)
class CpuStep:
    number: int
    duration_us: float
    dataloader_us: float  # inside DataLoader __next__
    optimizer_us: float  # inside Optimizer.step, less the closure it may run (forward and backward)
    dataloader_gpu_wait_us: float  # GPU idle waiting for the host while the host was in the DataLoader
    optimizer_gpu_wait_us: float  # … while the host was in Optimizer.step
    cpu_ops_us: float  # top-level PyTorch ops, all threads (union)
    launch_us: float  # runtime calls that launch GPU work (and returned without waiting)
    launch_count: int
    sync_us: float  # runtime calls that block on the GPU
    allocator_calls: int  # cudaMalloc / cudaFree (and host-pinned ones): the caching allocator missed
    allocator_us: float
    optimizer_launches: int  # launch calls made inside Optimizer.step
    optimizer_kernel_us: float  # GPU time of what they launched
    # host gaps of AHEAD_GAP_US or more (in no op, DataLoader or synchronization) that open with
    # AHEAD_QUEUED launches or more queued on the GPU: the host ran ahead of its GPU there (a DDP rank that
    # waits for a straggler blocks on a full launch queue, in the trace outside the ops as well as inside)
    ahead_us: float = 0.0
    # the host's own span of the step (its ProfilerStep range), where `duration_us` is its window on the
    # timeline: a host ahead of its GPU (a rank waiting for a straggler in its collectives) finishes its
    # span well before the window closes, and the rest of the window is no host work of its own
    span_us: float | None = None


@dataclass(frozen=True)
class OpStat:
    name: str
    calls: int
    cpu_total_us: float  # wall time inside the op (its children included)
    cpu_self_us: float  # minus its child ops
    gpu_self_us: float  # kernels/copies the op itself launched
    gpu_total_us: float  # … plus those of its child ops
    kernels: int  # GPU activities launched (self)


def cpu_steps(
    trace: Trace, steps: tuple[Step, ...], sync_rows: np.ndarray, host_wait: Disjoint | None = None
) -> tuple[CpuStep, ...]:
    """Host-side figures per step; `host_wait` (the GPU's host-wait idle intervals) lets each be set
    against the GPU time it cost."""
    if not steps:
        return ()
    starts = np.array([s.start_us for s in steps])
    ends = np.array([s.end_us for s in steps])
    cpu_rows = trace.rows(Kind.USER_ANNOTATION, Kind.PYTHON, Kind.CPU_OP)
    loader = Disjoint.of(*_spans(trace, classify.rows_matching(trace, cpu_rows, DATALOADER)))
    optimizer = optimizer_time(trace)
    ops = trace.rows(Kind.CPU_OP)
    top_ops = ops[op_parents(trace, ops) < 0]
    op_union = Disjoint.of(*_spans(trace, top_ops))
    launches = classify.rows_matching(trace, trace.rows(*LAUNCH_KINDS), classify.LAUNCH_CALLS)
    launches = np.setdiff1d(launches, sync_rows)  # a copy that blocked counts as a sync, not a launch
    launch_union = Disjoint.of(*_spans(trace, launches))
    sync_union = Disjoint.of(*_spans(trace, sync_rows))
    ahead = _ahead_gaps(trace, (op_union, loader, sync_union), starts, ends, launches)
    edges = _edges(starts, ends)
    launch_counts = _per_step(trace.ts[launches], edges)
    allocs = classify.rows_matching(trace, trace.rows(*LAUNCH_KINDS), classify.ALLOCATOR_CALLS)
    alloc_union = Disjoint.of(*_spans(trace, allocs))
    alloc_counts = _per_step(trace.ts[allocs], edges)
    in_optimizer = optimizer.covered(trace.ts[launches], trace.ts[launches] + 1e-9) > 0
    loader_wait = _overlap_per_step(loader, host_wait, edges)
    optimizer_wait = _overlap_per_step(optimizer, host_wait, edges)
    optimizer_launches = _per_step(trace.ts[launches[in_optimizer]], edges)
    launched = gpu_rows_of_launch(trace, launches[in_optimizer])
    ok = launched >= 0
    optimizer_kernel_us = _per_step(trace.ts[launches[in_optimizer]][ok], edges, trace.dur[launched[ok]])
    out = []
    for i, s in enumerate(steps):
        a, b = np.array([s.start_us]), np.array([s.end_us])
        out.append(
            CpuStep(
                number=s.number,
                duration_us=s.duration_us,
                dataloader_us=float(loader.covered(a, b)[0]),
                optimizer_us=float(optimizer.covered(a, b)[0]),
                dataloader_gpu_wait_us=float(loader_wait[i]),
                optimizer_gpu_wait_us=float(optimizer_wait[i]),
                cpu_ops_us=float(op_union.covered(a, b)[0]),
                launch_us=float(launch_union.covered(a, b)[0]),
                launch_count=int(launch_counts[i]),
                sync_us=float(sync_union.covered(a, b)[0]),
                allocator_calls=int(alloc_counts[i]),
                allocator_us=float(alloc_union.covered(a, b)[0]),
                optimizer_launches=int(optimizer_launches[i]),
                optimizer_kernel_us=float(optimizer_kernel_us[i]),
                ahead_us=float(ahead.covered(a, b)[0]),
                span_us=s.cpu_duration_us,
            )
        )
    return tuple(out)


def optimizer_time(trace: Trace) -> Disjoint:
    """When the host runs the optimizer itself: `Optimizer.step` ranges less the closure each may run.
    torch's optimizers call the closure first, so it is the start of the range up to the end of the last
    closure range (gpudoctor's label, Lightning's training_step/backward hooks) or backward op in it."""
    annotations = trace.rows(Kind.USER_ANNOTATION, Kind.CPU_OP)
    steps = Disjoint.of(*_spans(trace, classify.rows_matching(trace, annotations, OPTIMIZER_STEP)))
    if not len(steps.start):
        return steps
    labelled = classify.rows_matching(trace, trace.rows(Kind.USER_ANNOTATION, Kind.PYTHON), CLOSURE)
    backward = classify.rows_matching(trace, trace.rows(Kind.CPU_OP), BACKWARD_OP)
    rows = np.concatenate((labelled, backward))
    starts, ends = trace.ts[rows], trace.ts[rows] + trace.dur[rows]
    step = np.searchsorted(steps.start, starts, side="right") - 1
    inside = (step >= 0) & (starts < steps.end[np.maximum(step, 0)])
    closure_end = np.full(len(steps.start), -np.inf)
    np.maximum.at(closure_end, step[inside], np.minimum(ends[inside], steps.end[step[inside]]))
    has = np.isfinite(closure_end)
    return difference(steps, Disjoint.of(steps.start[has], closure_end[has]))


def _ahead_gaps(
    trace: Trace, host: tuple[Disjoint, ...], starts: np.ndarray, ends: np.ndarray, launches: np.ndarray
) -> Disjoint:
    """The host gaps inside the steps (in none of `host`) of AHEAD_GAP_US or more that open with
    AHEAD_QUEUED GPU activities or more launched and not yet started."""
    busy_host = Disjoint.of(np.concatenate([d.start for d in host]), np.concatenate([d.end for d in host]))
    gaps = difference(Disjoint.of(starts, ends), busy_host)
    long = (gaps.end - gaps.start) >= AHEAD_GAP_US
    if not long.any():
        return Disjoint.of(np.zeros(0), np.zeros(0))
    gpu = gpu_rows_of_launch(trace, launches)
    ok = gpu >= 0
    launched, started = np.sort(trace.ts[launches[ok]]), np.sort(trace.ts[gpu[ok]])
    s, e = gaps.start[long], gaps.end[long]
    # queued at t: launched before t less started by t (an activity starts after its launch)
    queued = np.searchsorted(launched, s, side="left") - np.searchsorted(started, s, side="right")
    ahead = queued >= AHEAD_QUEUED
    return Disjoint.of(s[ahead], e[ahead])


def _spans(trace: Trace, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return trace.ts[rows], trace.ts[rows] + trace.dur[rows]


def _overlap_per_step(spans: Disjoint, idle: Disjoint | None, edges: np.ndarray) -> np.ndarray:
    """Per step, how much of `idle` falls inside `spans` (each span counted in the step it starts in)."""
    if idle is None or not len(spans.start):
        return np.zeros(len(edges) // 2)
    overlap = idle.covered(spans.start, spans.end)
    step = np.searchsorted(edges, spans.start, side="right") - 1
    inside = (step >= 0) & (step % 2 == 0)  # even bins are steps
    return np.bincount(step[inside] // 2, weights=overlap[inside], minlength=len(edges) // 2)


def _per_step(times: np.ndarray, edges: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """How many of `times` fall in each step (the even bins of `edges`), or the sum of their weights."""
    if len(edges) == 2:
        inside = (times >= edges[0]) & (times <= edges[1])
        return np.array([float(weights[inside].sum()) if weights is not None else int(inside.sum())])
    return np.histogram(times, bins=edges, weights=weights)[0][::2]


def _edges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Histogram edges [s0, e0, s1, e1, ...]: even bins are the steps (steps never overlap)."""
    edges = np.empty(2 * len(starts))
    edges[0::2], edges[1::2] = starts, ends
    return np.maximum.accumulate(edges)


def op_report(
    trace: Trace, window: tuple[float, float] | None = None, top: int | None = None
) -> tuple[OpStat, ...]:
    """PyTorch ops by the GPU time they caused, with their children's (`gpu_total_us`); all of them,
    or the `top` ones."""
    ops = trace.rows(Kind.CPU_OP)
    if not len(ops):
        return ()
    parent = op_parents(trace, ops)
    gpu = trace.rows(*GPU_ACTIVITY_KINDS)
    owner = op_rows(trace, gpu)  # trace rows of ops
    position = np.full(len(trace), -1, dtype=np.int64)
    position[ops] = np.arange(len(ops))
    owned = owner >= 0
    owner_pos = position[owner[owned]]
    ok = owner_pos >= 0
    gpu_self = np.bincount(owner_pos[ok], weights=trace.dur[gpu[owned]][ok], minlength=len(ops))
    kernels = np.bincount(owner_pos[ok], minlength=len(ops))
    gpu_total = _roll_up(gpu_self, trace, ops)
    child_cpu = np.bincount(parent[parent >= 0], weights=trace.dur[ops[parent >= 0]], minlength=len(ops))
    cpu_self = np.maximum(trace.dur[ops] - child_cpu, 0.0)
    keep = np.ones(len(ops), dtype=bool)
    if window is not None:
        keep = (trace.ts[ops] >= window[0]) & (trace.ts[ops] < window[1])
    names = trace.name[ops][keep]
    ids, inverse = np.unique(names, return_inverse=True)

    def per_name(values: np.ndarray) -> np.ndarray:
        return np.bincount(inverse, weights=values[keep], minlength=len(ids))

    calls = np.bincount(inverse, minlength=len(ids))
    # An op nested in an op of the same name (aten::to inside aten::to) must not count twice.
    outer = _not_inside_same_name(trace, ops)
    g_total = np.bincount(inverse, weights=np.where(outer, gpu_total, 0.0)[keep], minlength=len(ids))
    c_total = np.bincount(inverse, weights=np.where(outer, trace.dur[ops], 0.0)[keep], minlength=len(ids))
    g_self, c_self, k = per_name(gpu_self), per_name(cpu_self), per_name(kernels.astype(float))
    order = np.lexsort((-c_total, -g_total))[:top]
    return tuple(
        OpStat(
            trace.names[int(ids[i])],
            int(calls[i]),
            float(c_total[i]),
            float(c_self[i]),
            float(g_self[i]),
            float(g_total[i]),
            int(k[i]),
        )
        for i in order
    )


def _roll_up(values: np.ndarray, trace: Trace, ops: np.ndarray) -> np.ndarray:
    """Each op's value plus all its descendants': a difference of prefix sums over the preorder, in
    which every subtree is one stretch (linear however deep ops nest)."""
    order, end = op_subtrees(trace, ops)
    prefix = np.concatenate(([0.0], np.cumsum(values.astype(np.float64)[order])))
    total = np.empty(len(ops), dtype=np.float64)
    total[order] = prefix[end] - prefix[np.arange(len(ops))]
    return np.maximum(total, values)  # no rounding below the op's own value


def _not_inside_same_name(trace: Trace, ops: np.ndarray) -> np.ndarray:
    """Whether each op has no ancestor of its own name. In preorder an op is inside an earlier op
    iff its index is below that op's subtree end: per name, a running maximum of the ends."""
    order, end = op_subtrees(trace, ops)
    n = len(ops)
    names = trace.name[ops][order]
    by_name = np.lexsort((np.arange(n), names))  # each name's ops together, in preorder
    group = np.concatenate(([0], np.cumsum(names[by_name[1:]] != names[by_name[:-1]])))
    span = n + 1  # ends are at most n: an offset per name keeps one name's maximum from the next's
    reach = np.maximum.accumulate(group * span + end[by_name])
    before = np.concatenate(([-1], reach[:-1]))  # the furthest end among the name's earlier ops
    first = np.concatenate(([True], group[1:] != group[:-1]))
    inside = ~first & (before - group * span > by_name)
    outer = np.ones(n, dtype=bool)
    outer[order[by_name[inside]]] = False
    return outer

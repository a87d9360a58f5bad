"""Where in the model: per `nn.Module`, down to a chosen depth, its calls, host time, forward and backward
GPU time and kernels per step, children included. Module calls come from `gpudoctor.module:`
annotations, else from a with_stack trace's `nn.Module: X_N` frames; a backward kernel belongs to the
module whose forward ran the op it differentiates (autograd's sequence numbers); a root that only wraps
one child (DDP, OptimizedModule) is looked through. Pure, vectorized (docs/analysis.md, "Where in the
model")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpudoctor.trace.iterations import module_label, module_rows
from gpudoctor.trace.links import launch_rows, op_parents, op_rows
from gpudoctor.trace.model import GPU_ACTIVITY_KINDS, Kind, Trace
from gpudoctor.trace.steps import Step

DEFAULT_DEPTH = 2
MAX_DEPTH = 8
WRAPPER_SHARE = 0.9  # a root whose only child takes this much of its time is a wrapper


@dataclass(frozen=True)
class ModuleStat:
    path: str  # "layer1.0.conv1" (the root: its class, "ResNet"), or "ResNet_0.Sequential_0" (with_stack)
    depth: int  # 0 for a root
    calls: float  # per step
    host_us: float  # per step: wall time inside its forward calls, children included
    gpu_forward_us: float  # per step: GPU time of the work its forward launched
    gpu_backward_us: float  # per step: GPU time of the backward of the ops its forward ran
    kernels: float  # per step: GPU activities of both

    @property
    def gpu_us(self) -> float:
        return self.gpu_forward_us + self.gpu_backward_us


@dataclass(frozen=True)
class ModuleView:
    source: str  # where the module calls come from, in words
    depth: int  # the deepest level shown
    per: str  # "step", or "traced time" where the trace has no steps
    modules: tuple[ModuleStat, ...]  # in tree order: each module before its children
    gpu_us: float  # per step: all GPU activity launched in the steps, modules or not
    backward: bool  # whether backward work could be put on modules (autograd sequence numbers)

    @property
    def unattributed_gpu_us(self) -> float:
        """GPU time per step in no module's forward or backward (the optimizer, a loss outside the model,
        copies of the inputs)."""
        roots = sum(m.gpu_us for m in self.modules if m.depth == 0)
        return max(self.gpu_us - roots, 0.0)


def module_view(trace: Trace, steps: tuple[Step, ...], depth: int = DEFAULT_DEPTH) -> ModuleView | None:
    """The module view over the steps (the whole trace without steps); None without module calls."""
    rows, kind = module_rows(trace)
    if not len(rows):
        return None
    depth = max(1, min(depth, MAX_DEPTH))
    thread = _busiest(trace, rows)
    rows = rows[(trace.pid[rows] == thread[0]) & (trace.tid[rows] == thread[1])]
    rows = rows[np.lexsort((-trace.dur[rows], trace.ts[rows]))]
    lo, hi = (steps[0].start_us, steps[-1].end_us) if steps else (-np.inf, np.inf)
    rows = rows[(trace.ts[rows] >= lo) & (trace.ts[rows] < hi)]
    if not len(rows):
        return None
    parent = op_parents(trace, rows)
    level = _levels(parent)
    paths = _paths(trace, rows, parent, level, kind == "annotation")
    skip = _wrappers(trace, rows, parent, level, paths)
    gpu, gpu_event, backward_event, has_backward = _attribute(trace, rows, parent, thread, (lo, hi))
    durations = trace.dur[gpu]
    fwd = _roll_up(
        np.bincount(gpu_event[gpu_event >= 0], durations[gpu_event >= 0], len(rows)), parent, level
    )
    bwd_ok = backward_event >= 0
    bwd = _roll_up(np.bincount(backward_event[bwd_ok], durations[bwd_ok], len(rows)), parent, level)
    count = np.bincount(gpu_event[gpu_event >= 0], minlength=len(rows)) + np.bincount(
        backward_event[bwd_ok], minlength=len(rows)
    )
    kernels = _roll_up(count.astype(np.float64), parent, level)
    n = max(len(steps), 1)
    shown = (level >= skip) & (level <= depth + skip)
    stats = _aggregate(paths, level - skip, shown, trace.dur[rows], fwd, bwd, kernels, n)
    source = "gpudoctor.module annotations" if kind == "annotation" else "nn.Module frames (with_stack)"
    return ModuleView(
        source=source,
        depth=depth,
        per="step" if steps else "traced time",
        modules=stats,
        gpu_us=float(durations.sum()) / n,
        backward=has_backward,
    )


def _busiest(trace: Trace, rows: np.ndarray) -> tuple[int, int]:
    keys = trace.pid[rows] * (1 << 32) + trace.tid[rows]
    ids, counts = np.unique(keys, return_counts=True)
    first = int(np.flatnonzero(keys == ids[np.argmax(counts)])[0])
    return int(trace.pid[rows[first]]), int(trace.tid[rows[first]])


def _levels(parent: np.ndarray) -> np.ndarray:
    level = np.zeros(len(parent), dtype=np.int64)
    up = parent.copy()
    while (up >= 0).any():
        level += up >= 0
        up = np.where(up >= 0, parent[np.maximum(up, 0)], -1)
    return level


def _paths(
    trace: Trace, rows: np.ndarray, parent: np.ndarray, level: np.ndarray, annotated: bool
) -> list[str]:
    """Each call's module path: the annotation's own, or the frames' names joined down the nesting."""
    labels = [module_label(trace.names[i]) for i in trace.name[rows].tolist()]
    if annotated:
        return labels
    paths = list(labels)
    for i in np.argsort(level, kind="stable").tolist():  # parents first
        p = int(parent[i])
        if p >= 0:
            paths[i] = f"{paths[p]}.{labels[i]}"
    return paths


def _wrappers(trace: Trace, rows: np.ndarray, parent: np.ndarray, level: np.ndarray, paths: list[str]) -> int:
    """How many levels from the top only wrap a single child (DDP around the model): looked through."""
    skip = 0
    dur = trace.dur[rows]
    while True:
        top = np.flatnonzero(level == skip)
        below = np.flatnonzero(level == skip + 1)
        if not len(top) or not len(below) or len({paths[i] for i in top.tolist()}) != 1:
            return skip
        per_parent = np.bincount(parent[below], minlength=len(rows))[top]
        if (per_parent != 1).any() or dur[below].sum() < WRAPPER_SHARE * dur[top].sum():
            return skip
        skip += 1


def _attribute(
    trace: Trace, rows: np.ndarray, parent: np.ndarray, thread: tuple[int, int], window: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """The GPU activity launched in the window, and for each the module call whose forward launched it
    and the one whose forward ran the op its backward op differentiates (-1 where none)."""
    gpu = trace.rows(*GPU_ACTIVITY_KINDS)
    launch = launch_rows(trace, gpu)
    when = np.where(launch >= 0, trace.ts[np.maximum(launch, 0)], trace.ts[gpu])
    keep = (when >= window[0]) & (when < window[1])
    gpu, launch, when = gpu[keep], launch[keep], when[keep]
    mine = (
        (launch >= 0)
        & (trace.pid[np.maximum(launch, 0)] == thread[0])
        & (trace.tid[np.maximum(launch, 0)] == thread[1])
    )
    forward = np.where(mine, _innermost(trace, rows, parent, when), -1)
    backward = np.full(len(gpu), -1, dtype=np.int64)
    has_backward = False
    if len(trace.sequence):
        ops = trace.rows(Kind.CPU_OP)
        seq, fwd_thread = trace.sequence[ops], trace.fwd_thread[ops]
        is_backward = (seq >= 0) & (fwd_thread > 0)
        has_backward = bool(is_backward.any())
        if has_backward:
            backward = _backward_events(trace, rows, parent, thread, ops, gpu, is_backward)
            backward[forward >= 0] = -1  # a kernel launched inside a forward is that forward's
    return gpu, forward, backward, has_backward


def _backward_events(
    trace: Trace,
    rows: np.ndarray,
    parent: np.ndarray,
    thread: tuple[int, int],
    ops: np.ndarray,
    gpu: np.ndarray,
    is_backward: np.ndarray,
) -> np.ndarray:
    position = np.full(len(trace), -1, dtype=np.int64)
    position[ops] = np.arange(len(ops))
    op_of = op_rows(trace, gpu)
    at = np.where(op_of >= 0, position[np.maximum(op_of, 0)], -1)
    op_parent = op_parents(trace, ops)
    # up to the innermost enclosing backward op (AddmmBackward0 around its aten::mm)
    while True:
        climb = (at >= 0) & ~is_backward[np.maximum(at, 0)]
        if not climb.any():
            break
        at = np.where(climb, op_parent[np.maximum(at, 0)], at)
    seq = np.where(at >= 0, trace.sequence[ops[np.maximum(at, 0)]], -1)
    forward_ops = ops[
        (trace.sequence[ops] >= 0)
        & (trace.fwd_thread[ops] <= 0)
        & (trace.pid[ops] == thread[0])
        & (trace.tid[ops] == thread[1])
    ]
    events = np.full(len(gpu), -1, dtype=np.int64)
    if not len(forward_ops):
        return events
    order = np.argsort(trace.sequence[forward_ops], kind="stable")
    keys, forward_ops = trace.sequence[forward_ops][order], forward_ops[order]
    i = np.minimum(np.searchsorted(keys, seq), len(keys) - 1)
    found = (seq >= 0) & (keys[i] == seq)
    if found.any():
        events[found] = _innermost(trace, rows, parent, trace.ts[forward_ops[i[found]]])
    return events


def _innermost(trace: Trace, rows: np.ndarray, parent: np.ndarray, times: np.ndarray) -> np.ndarray:
    """For each time, the innermost module call open then (rows sorted by start, longest first)."""
    starts, ends = trace.ts[rows], trace.ts[rows] + trace.dur[rows]
    at = np.searchsorted(starts, times, side="right") - 1
    while True:
        closed = (at >= 0) & (ends[np.maximum(at, 0)] <= times)
        if not closed.any():
            return at
        at = np.where(closed, parent[np.maximum(at, 0)], at)


def _roll_up(values: np.ndarray, parent: np.ndarray, level: np.ndarray) -> np.ndarray:
    """Each call's value plus all its descendants', deepest first."""
    total = values.astype(np.float64).copy()
    for d in range(int(level.max()) if len(level) else 0, 0, -1):
        idx = np.flatnonzero(level == d)
        np.add.at(total, parent[idx], total[idx])
    return total


def _aggregate(
    paths: list[str],
    level: np.ndarray,
    shown: np.ndarray,
    host: np.ndarray,
    fwd: np.ndarray,
    bwd: np.ndarray,
    kernels: np.ndarray,
    n: int,
) -> tuple[ModuleStat, ...]:
    """One row per module path, per step, in tree order (first call first, each before its children)."""
    index: dict[str, int] = {}
    sums: list[list[float]] = []
    depth_of: list[int] = []
    for i in np.flatnonzero(shown).tolist():
        key = paths[i]
        j = index.get(key)
        if j is None:
            j = index[key] = len(sums)
            sums.append([0.0] * 5)
            depth_of.append(int(level[i]))
        row = sums[j]
        row[0] += 1
        row[1] += float(host[i])
        row[2] += float(fwd[i])
        row[3] += float(bwd[i])
        row[4] += float(kernels[i])
    stats = [
        ModuleStat(path, depth_of[j], *(v / n for v in sums[j]))  # type: ignore[arg-type]
        for path, j in index.items()
    ]
    return tuple(_tree_order(stats))


def _tree_order(stats: list[ModuleStat]) -> list[ModuleStat]:
    """Each module right after its parent (by path prefix), siblings in first-call order."""
    children: dict[str | None, list[ModuleStat]] = {}
    known = {s.path for s in stats}
    root = next((s.path for s in stats if s.depth == 0), None)
    for s in stats:
        up = _parent_path(s.path, known)
        if up is None and s.depth > 0:
            up = root  # an annotated child's path does not name its root ("layer1" under "ResNet")
        children.setdefault(up, []).append(s)
    out: list[ModuleStat] = []
    stack = list(reversed(children.get(None, [])))
    while stack:
        s = stack.pop()
        out.append(s)
        stack.extend(reversed(children.get(s.path, [])))
    placed = {s.path for s in out}
    return out + [s for s in stats if s.path not in placed]


def _parent_path(path: str, known: set[str]) -> str | None:
    while "." in path:
        path = path.rsplit(".", 1)[0]
        if path in known:
            return path
    return None

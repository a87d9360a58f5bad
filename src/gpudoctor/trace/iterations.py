"""The iterations of the loop a trace recorded, marked or inferred: `find_iterations(trace)`. The first
source that finds any wins: `ProfilerStep#N`, `gpudoctor.step`, `Optimizer.step#…`, DataLoader
`__next__`, calls of the root `nn.Module`, then the repeating sequence of kernel launches
(`trace.periodicity`); otherwise there is none and figures cover the traced time. Anchored sources give
one event per iteration, and iterations run from anchor to anchor. Rules and limits: docs/analysis.md,
"Steps"."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from gpudoctor.trace.links import op_parents
from gpudoctor.trace.model import Kind, Trace
from gpudoctor.trace.periodicity import launch_sequence, sequence_iterations
from gpudoctor.trace.steps import Step, find_steps, on_busiest_thread, steps_from_spans, thread_extent

# What each source is called in `StepSource.kind` (stable: JSON consumers read it).
PROFILER_STEPS = "profiler_steps"
GPUDOCTOR_STEPS = "gpudoctor_steps"
OPTIMIZER = "optimizer_step"
DATALOADER = "dataloader"
MODULE = "module_calls"
LAUNCHES = "launch_sequence"
NONE = "none"
MARKED = frozenset({PROFILER_STEPS, GPUDOCTOR_STEPS})

STEP_ANNOTATION = "gpudoctor.step"  # a user annotation around each step (gpudoctor run)
CLOSURE_ANNOTATION = "gpudoctor.closure"  # around an optimizer closure, inside Optimizer.step
MODULE_ANNOTATION = "gpudoctor.module: "  # + dotted path, around a module's forward; the root: its class
PYTHON_MODULE = "nn.Module: "  # with_stack's frame of a module call: "nn.Module: ResNet_0"

_STEP_MARK = re.compile(r"^gpudoctor\.step(#(\d+))?$")
_OPTIMIZER = re.compile(r"^Optimizer\.step#")
_LOADER = re.compile(r"^enumerate\(DataLoader\)#.*__next__$")
FIRST_AT_MOST = 1.5  # the first iteration's length, in the others' median
MIN_GROUP_SHARE = 0.8  # of the root module's calls inside repeated outer calls, to group them


@dataclass(frozen=True)
class StepSource:
    """How a trace's steps were found, in a word (`kind`) and a sentence."""

    kind: str
    description: str  # "ProfilerStep#N annotations", "inferred: 12 iterations from Optimizer.step"
    calls_per_step: float | None = None  # generate-style: root-module calls in each step
    call: str | None = None  # what one step is a call of (a module or function), where that is known

    @property
    def inferred(self) -> bool:
        return self.kind not in MARKED and self.kind != NONE


@dataclass(frozen=True)
class Iterations:
    steps: tuple[Step, ...]
    source: StepSource


def find_iterations(trace: Trace) -> Iterations:
    """The loop's iterations as `Step`s, and how they were found. Memoized per trace."""
    memo = trace._memo.get("iterations")
    if memo is None:
        memo = trace._memo["iterations"] = _find(trace)
    return memo


def _find(trace: Trace) -> Iterations:
    marked = find_steps(trace)
    if marked:
        how = f" (gpudoctor run: one step = {trace.meta.run_step})" if trace.meta.run_step else ""
        return Iterations(marked, StepSource(PROFILER_STEPS, f"ProfilerStep#N annotations{how}"))
    for finder in (_gpudoctor_steps, _optimizer_steps, _loader_batches, _module_calls, _repetition):
        found = finder(trace)
        if found is not None and found.steps:
            return found
    return Iterations((), StepSource(NONE, "no repeating iteration found: figures cover the traced time"))


def _gpudoctor_steps(trace: Trace) -> Iterations | None:
    rows = _annotations(trace, _STEP_MARK)
    if not len(rows):
        return None
    spans = [(float(trace.ts[r]), float(trace.ts[r] + trace.dur[r])) for r in rows.tolist()]
    numbers = []
    for i, r in enumerate(rows.tolist()):
        m = _STEP_MARK.match(trace.name_of(r))
        numbers.append(int(m.group(2)) if m and m.group(2) else i + 1)
    if len(set(numbers)) < len(numbers):
        numbers = list(range(1, len(rows) + 1))
    steps = steps_from_spans(trace, spans, numbers, _thread(trace, rows))
    return Iterations(steps, StepSource(GPUDOCTOR_STEPS, f"{STEP_ANNOTATION} annotations (gpudoctor run)"))


def _optimizer_steps(trace: Trace) -> Iterations | None:
    rows = _annotations(trace, _OPTIMIZER)
    if not len(rows):
        return None
    name = trace.name_of(int(rows[0])).split("#", 1)[-1]
    steps = _anchored(trace, rows, at_end=True)
    sentence = f"inferred: {_count(len(steps))} from Optimizer.step (one per optimizer step)"
    return Iterations(steps, StepSource(OPTIMIZER, sentence, call=name))


def _loader_batches(trace: Trace) -> Iterations | None:
    rows = _annotations(trace, _LOADER)
    if not len(rows):
        return None
    steps = _anchored(trace, rows, at_end=False)
    return Iterations(
        steps, StepSource(DATALOADER, f"inferred: {_count(len(steps))} from DataLoader __next__")
    )


def _module_calls(trace: Trace) -> Iterations | None:
    calls = root_module_calls(trace)
    if calls is None:
        return None
    rows, name = calls
    outer = _outer_calls(trace, rows)
    if outer is not None:
        groups, per_group = outer
        steps = _anchored(trace, groups, at_end=False)
        function = _function_name(trace.name_of(int(groups[0])))
        sentence = (
            f"inferred: {_count(len(steps))}, one call of {function} each "
            f"({per_group:.3g} calls of {name} per iteration)"
        )
        return Iterations(steps, StepSource(MODULE, sentence, per_group, function))
    steps = _anchored(trace, rows, at_end=False)
    return Iterations(
        steps, StepSource(MODULE, f"inferred: {_count(len(steps))}, one call of {name} each", call=name)
    )


def _repetition(trace: Trace) -> Iterations | None:
    found = sequence_iterations(trace)
    if found is None:
        return None
    steps = steps_from_spans(trace, found.spans, range(1, len(found.spans) + 1), found.thread)
    what = "launch" if found.items == "GPU activities" else "op"
    sentence = (
        f"inferred: the {what} sequence repeats every {found.period} {found.items} ({_count(len(steps))})"
    )
    return Iterations(steps, StepSource(LAUNCHES, sentence))


# ---- anchors -------------------------------------------------------------------------------------


def _annotations(trace: Trace, pattern: re.Pattern[str]) -> np.ndarray:
    """The outermost user annotations matching `pattern` on the thread that has most of them."""
    rows = trace.rows(Kind.USER_ANNOTATION)
    if not len(rows):
        return rows
    hit = trace.name_ids_matching(pattern.search, trace.name[rows])[trace.name[rows]]
    rows = rows[hit]
    if not len(rows):
        return rows
    rows = on_busiest_thread(trace, rows)
    return rows[op_parents(trace, rows) < 0]


def _thread(trace: Trace, rows: np.ndarray) -> tuple[int, int]:
    return int(trace.pid[rows[0]]), int(trace.tid[rows[0]])


def _anchored(trace: Trace, rows: np.ndarray, at_end: bool) -> tuple[Step, ...]:
    """Steps from one anchor event per iteration (rows in time order, one thread). An anchor starts
    its iteration (`at_end` False: a batch fetched, a model called) or ends it (an optimizer step)."""
    thread = _thread(trace, rows)
    starts, ends = trace.ts[rows], trace.ts[rows] + trace.dur[rows]
    calls, _ = launch_sequence(trace)
    launches = (trace.ts[calls], trace.ts[calls] + trace.dur[calls])
    spans = anchored_spans(starts, ends, at_end, thread_extent(trace, thread), launches)
    return steps_from_spans(trace, spans, range(1, len(spans) + 1), thread)


def anchored_spans(
    starts: np.ndarray,
    ends: np.ndarray,
    at_end: bool,
    extent: tuple[float, float],
    launches: tuple[np.ndarray, np.ndarray],
) -> list[tuple[float, float]]:
    """Iteration spans tiling the loop from anchors (`launches`: the start and end times of the
    launch calls, in order). Where the trace begins with an iteration (fewer launches than an
    iteration's before the first anchor), each iteration starts as many launches before its anchor
    as the first did (`at_end`: as many after the previous anchor as the first iteration leaves for
    after its own), the first where the loop's thread starts; iterations jitter in time, not in the
    work they launch. Otherwise each starts at its anchor (`at_end`: where the previous one ended).
    The last ends with the thread, at most one longest iteration after it starts."""
    t0, t1 = extent
    if len(starts) == 1:
        return [(min(t0, float(starts[0])), max(t1, float(ends[0])))]
    call_start, call_end = launches
    before = np.searchsorted(call_start, starts)  # launches before each anchor
    per = float(np.median(np.diff(before)))
    lead = int(before[0] - np.searchsorted(call_start, t0))
    if per >= 1 and lead <= 1.25 * per:
        if at_end:
            after = np.searchsorted(call_start, ends)
            tail = max(per - float(after[0] - before[0] + lead), 0.0)
            first = (after[:-1] + round(tail)).astype(np.int64)
        else:
            first = before[1:] - lead
        first = np.clip(first, 1, len(call_end))
        floor = ends[:-1] if at_end else starts[:-1]
        bounds = np.concatenate(([t0], np.clip(call_end[first - 1], floor, starts[1:])))
    elif at_end:  # exactly where the previous optimizer step ended: a median offset cut into it
        bounds = np.concatenate(([t0], ends[:-1]))
    else:
        bounds = starts.astype(np.float64)
    bounds = np.maximum.accumulate(bounds)
    if len(bounds) > 2:  # a first iteration far longer than the others holds what came before the loop
        bounds[0] = max(bounds[0], bounds[1] - FIRST_AT_MOST * float(np.median(np.diff(bounds[1:]))))
    last = min(t1, float(bounds[-1]) + float(np.diff(bounds).max()))
    last = max(last, float(ends[-1]))
    return list(zip(bounds.tolist(), [*bounds[1:].tolist(), last], strict=True))


# ---- module calls --------------------------------------------------------------------------------


def _is_module_frame(name: str) -> bool:
    return name.startswith(PYTHON_MODULE)


def _is_module_annotation(name: str) -> bool:
    return name.startswith(MODULE_ANNOTATION)


def module_rows(trace: Trace) -> tuple[np.ndarray, str]:
    """The rows that mark module calls, and which kind: `gpudoctor.module: path` annotations where the
    trace has them ("annotation"), else with_stack's `nn.Module: X_N` frames ("python"); empty if none."""
    for kind, predicate, label in (
        (Kind.USER_ANNOTATION, _is_module_annotation, "annotation"),
        (Kind.PYTHON, _is_module_frame, "python"),
    ):
        rows = trace.rows(kind)
        if len(rows):
            hit = trace.name_ids_matching(predicate, trace.name[rows])[trace.name[rows]]
            if hit.any():
                return rows[hit], label
    return np.empty(0, dtype=np.int64), ""


def module_label(name: str) -> str:
    """`ResNet_0` for `nn.Module: ResNet_0`, `layer1.0.conv1` for `gpudoctor.module: layer1.0.conv1`."""
    for prefix in (MODULE_ANNOTATION, PYTHON_MODULE):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def root_module_calls(trace: Trace) -> tuple[np.ndarray, str] | None:
    """The calls of the root module (the outermost module that takes the most time), in time order,
    on its thread; None without module calls in the trace."""
    rows, kind = module_rows(trace)
    if not len(rows):
        return None
    if kind == "annotation":  # the root is the one path without a dot
        rows = rows[[("." not in module_label(trace.name_of(r))) for r in rows.tolist()]]
        if not len(rows):
            return None
    rows = on_busiest_thread(trace, rows)
    top = rows[op_parents(trace, rows) < 0]
    names, inverse = np.unique(trace.name[top], return_inverse=True)
    total = np.bincount(inverse, weights=trace.dur[top])
    root = int(names[np.argmax(total)])
    return top[trace.name[top] == root], module_label(trace.names[root])


def _outer_calls(trace: Trace, calls: np.ndarray) -> tuple[np.ndarray, float] | None:
    """Where the root module is called several times inside one outer Python call, and that outer
    call repeats (a `generate` per prompt): those outer calls, and the module calls in each."""
    python = trace.rows(Kind.PYTHON)
    if len(calls) < 4 or not len(python):
        return None
    parent = op_parents(trace, python)
    position = np.full(len(trace), -1, dtype=np.int64)
    position[python] = np.arange(len(python))
    leaves = position[calls]
    if (leaves < 0).any():
        return None  # the calls are annotations: no Python frames to group them by
    count = np.zeros(len(python), dtype=np.int64)
    anc = parent[leaves]
    while (anc >= 0).any():
        alive = anc[anc >= 0]
        np.add.at(count, alive, 1)
        anc = np.where(anc >= 0, parent[np.maximum(anc, 0)], -1)
    group = np.full(len(leaves), -1, dtype=np.int64)
    anc = parent[leaves]
    while ((anc >= 0) & (group < 0)).any():
        take = (anc >= 0) & (group < 0) & (count[np.maximum(anc, 0)] >= 2)
        group[take] = anc[take]
        anc = np.where(anc >= 0, parent[np.maximum(anc, 0)], -1)
    grouped = group[group >= 0]
    if not len(grouped):
        return None
    outer, members = np.unique(grouped, return_counts=True)
    names = trace.name[python[outer]]
    _, inverse = np.unique(names, return_inverse=True)
    calls_by_name = np.bincount(inverse, weights=members)
    best = int(np.argmax(calls_by_name))
    chosen = outer[inverse == best]
    if len(chosen) < 2 or calls_by_name[best] < MIN_GROUP_SHARE * len(calls):
        return None
    rows = python[chosen]
    rows = rows[np.argsort(trace.ts[rows], kind="stable")]
    return rows, float(calls_by_name[best] / len(chosen))


def _count(n: int) -> str:
    return "1 iteration" if n == 1 else f"{n} iterations"


def _function_name(frame: str) -> str:
    """`generate` for `transformers/generation/utils.py(2150): generate`."""
    return frame.rsplit(": ", 1)[-1] if ": " in frame else frame


__all__ = ["Iterations", "StepSource", "find_iterations"]

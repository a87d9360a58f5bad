"""Where the host's time between PyTorch ops goes. Inside each step's CPU span, the stretches that no
top-level op (any thread), DataLoader call or GPU-waiting runtime call covers are the host running
Python between ops; with `with_stack`, each stretch is put on the innermost frame of the user's own
code that was open on the step's thread in its middle (`trace.links.user_frame`)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from gpudoctor.analysis import classify
from gpudoctor.analysis.cpu import DATALOADER
from gpudoctor.analysis.intervals import union
from gpudoctor.trace.links import frame_name, is_user_frame, op_parents, start_then_longest, user_frame
from gpudoctor.trace.model import LAUNCH_KINDS, Kind, Trace
from gpudoctor.trace.steps import Step

MIN_GAP_US = 20.0  # shorter stretches are the glue between ops: many, and nowhere in particular
TOP = 5
MAX_DEPTH = 64
MAX_PARENT_WALK = 2000  # Python parent ids followed to the frame open at a time (cycles in crafted traces)


@dataclass(frozen=True)
class HostGap:
    frame: str  # the user's frame around the stretches, e.g. "train.py(42): train_step"
    us_per_step: float
    stretches: int  # how many stretches of at least MIN_GAP_US, over all steps


def host_gaps(
    trace: Trace, steps: tuple[Step, ...], sync_rows: np.ndarray, top: int = TOP
) -> tuple[HostGap, ...]:
    """The user frames that hold the most host time between ops per step, most first; empty without
    steps or without Python stacks in the trace."""
    python = trace.rows(Kind.PYTHON)
    if not steps or not len(python):
        return ()
    covered = _covered(trace, sync_rows)
    thread = steps[0].thread or _step_thread(trace)
    if thread is None:
        return ()
    by_frame: dict[str, list[float]] = {}
    for s in steps:
        for a, b in _gaps(covered, s.start_us, s.end_us):
            if b - a < MIN_GAP_US:
                continue
            frame = _frame_at(trace, python, thread, (a + b) / 2)
            if frame is not None:
                by_frame.setdefault(frame, []).append(b - a)
    ranked = sorted(by_frame.items(), key=lambda kv: -sum(kv[1]))[:top]
    return tuple(HostGap(f, sum(d) / len(steps), len(d)) for f, d in ranked)


def _covered(trace: Trace, sync_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ops = trace.rows(Kind.CPU_OP)
    top_ops = ops[op_parents(trace, ops) < 0]
    cpu_rows = trace.rows(Kind.USER_ANNOTATION, Kind.PYTHON, Kind.CPU_OP)
    loader = classify.rows_matching(trace, cpu_rows, DATALOADER)
    launches = classify.rows_matching(trace, trace.rows(*LAUNCH_KINDS), classify.LAUNCH_CALLS)
    rows = np.concatenate((top_ops, loader, sync_rows.astype(np.int64), launches))
    return union(trace.ts[rows], trace.ts[rows] + trace.dur[rows])


def _gaps(covered: tuple[np.ndarray, np.ndarray], t0: float, t1: float) -> list[tuple[float, float]]:
    """The stretches of [t0, t1] outside the covered intervals."""
    s, e = covered
    i0 = int(np.searchsorted(e, t0, side="right"))
    i1 = int(np.searchsorted(s, t1, side="left"))
    out, cursor = [], t0
    for a, b in zip(s[i0:i1].tolist(), e[i0:i1].tolist(), strict=True):
        if a > cursor:
            out.append((cursor, min(a, t1)))
        cursor = max(cursor, b)
    if cursor < t1:
        out.append((cursor, t1))
    return out


def _step_thread(trace: Trace) -> tuple[int, int] | None:
    """(pid, tid) of the thread whose ProfilerStep#N annotations mark the steps."""
    annotations = trace.rows(Kind.USER_ANNOTATION)
    named = [r for r in annotations.tolist() if trace.name_of(r).startswith("ProfilerStep#")]
    if not named:
        return None
    return int(trace.pid[named[0]]), int(trace.tid[named[0]])


def _frame_at(trace: Trace, python: np.ndarray, thread: tuple[int, int], t: float) -> str | None:
    """The user frame of the innermost Python event open at time t on `thread`: the latest to start
    before t, or the first of its ancestors still open (Python events nest on a thread)."""
    key = ("python_on_thread", thread)
    memo = trace._memo.get(key)
    if memo is None:  # as Python lists: this runs for every gap, where numpy's per-call cost would tell
        on = python[(trace.pid[python] == thread[0]) & (trace.tid[python] == thread[1])]
        on = on[start_then_longest(trace.ts[on], trace.dur[on])]
        memo = trace._memo[key] = (on.tolist(), trace.ts[on].tolist())
    rows, starts = memo
    by_id = trace._memo.get("python_by_id")
    if by_id is None:
        by_id = trace._memo["python_by_id"] = dict(
            zip(trace.python_id[python].tolist(), python.tolist(), strict=True)
        )
    i = bisect.bisect_right(starts, t) - 1
    row: int | None = rows[i] if i >= 0 else None
    ts, dur, parent_id = trace.ts.item, trace.dur.item, trace.python_parent_id.item
    # Closed before t: up to the open one. Python's own stacks are at most ~1,000 deep; a crafted
    # trace's parent ids may run longer, or in a circle.
    for _ in range(MAX_PARENT_WALK):
        if row is None or ts(row) + dur(row) >= t:
            break
        row = by_id.get(parent_id(row))
    else:
        return None
    if row is None:
        return None
    cache: dict[int, str | None] = trace._memo.setdefault("user_frame_of_python_row", {})
    frames: list[str] = []
    visited: list[int] = []
    current: int | None = row
    while current is not None and current not in cache and len(frames) < MAX_DEPTH:
        visited.append(current)
        frames.append(frame_name(trace, current))
        if is_user_frame(frames[-1]):
            break  # the innermost user frame: no need to name the rest
        current = by_id.get(parent_id(current))
    if current is not None and current in cache and not (frames and is_user_frame(frames[-1])):
        found = cache[current] or user_frame(frames)  # an ancestor already answered
    else:
        found = user_frame(frames)
    for v in visited:  # every frame below the answer shares it
        cache[v] = found
    return found

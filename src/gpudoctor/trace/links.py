"""Links between a trace's rows: GPU activity ↔ the runtime call that launched it (`correlation`),
runtime call / GPU activity → CPU op (`External id`), CPU rows → the op or Python frame around them.

All functions are pure over a `Trace` and return row indices (-1 where there is no link).
"""

from __future__ import annotations

import re

import numpy as np

from gpudoctor.trace.model import GPU_ACTIVITY_KINDS, LAUNCH_KINDS, Kind, Trace


def launch_rows(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """For GPU rows, the runtime/driver call with the same correlation id (-1 if none)."""
    launches = trace.rows(*LAUNCH_KINDS)
    return _match(trace.correlation, launches, rows)


def gpu_rows_of_launch(trace: Trace, launches: np.ndarray) -> np.ndarray:
    """For runtime calls, the GPU activity (kernel, memcpy, memset) they launched (-1 if none)."""
    gpu = trace.rows(*GPU_ACTIVITY_KINDS)
    return _match(trace.correlation, gpu, launches)


def op_rows(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """The CPU op whose `External id` a runtime call or GPU activity carries (-1 if none)."""
    ops = trace.rows(Kind.CPU_OP)
    return _match(trace.external_id, ops, rows)


def _match(key: np.ndarray, candidates: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """For each query row, the candidate row with the same key (>= 0); -1 where none."""
    out = np.full(len(queries), -1, dtype=np.int64)
    if not len(candidates) or not len(queries):
        return out
    cand_keys = key[candidates]
    valid = cand_keys >= 0
    cand_keys, cands = cand_keys[valid], candidates[valid]
    order = np.argsort(cand_keys, kind="stable")
    sorted_keys, sorted_rows = cand_keys[order], cands[order]
    q = key[queries]
    pos = np.searchsorted(sorted_keys, q)
    pos_clipped = np.minimum(pos, max(len(sorted_keys) - 1, 0))
    hit = (pos < len(sorted_keys)) & (q >= 0)
    if len(sorted_keys):
        hit &= sorted_keys[pos_clipped] == q
    out[hit] = sorted_rows[pos_clipped[hit]]
    return out


def enclosing_rows(
    trace: Trace, candidates: np.ndarray, queries: np.ndarray, outermost: bool = False
) -> np.ndarray:
    """For each query row, the innermost (or outermost) row of `candidates` on the same thread whose
    span contains it; -1 where none does. `candidates` must be one kind's rows (e.g. all CPU ops).

    Finds the last candidate that starts before the query, then walks up its parents until one
    contains the query: O(log n + depth) per query once the nesting is known.
    """
    out = np.full(len(queries), -1, dtype=np.int64)
    if not len(candidates) or not len(queries):
        return out
    nest = _nesting(trace, candidates)
    for i, q in enumerate(queries.tolist()):
        thread = (int(trace.pid[q]), int(trace.tid[q]))
        seg = nest.segments.get(thread)
        if seg is None:
            continue
        lo, hi = seg
        t0, t1 = float(trace.ts[q]), float(trace.ts[q] + trace.dur[q])
        p = lo + int(np.searchsorted(nest.ts[lo:hi], t0, side="right")) - 1
        found = -1
        while p >= lo:
            row = int(nest.rows[p])
            if row != q and nest.end[p] >= t1:
                found = row
                if not outermost:
                    break
            p = int(nest.parent[p])
        out[i] = found
    return out


class _Nesting:
    """Candidates sorted by (thread, start, longest first) with each one's parent position."""

    def __init__(self, trace: Trace, candidates: np.ndarray) -> None:
        ts, dur = trace.ts[candidates], trace.dur[candidates]
        order = np.lexsort((-dur, ts, trace.tid[candidates], trace.pid[candidates]))
        self.rows = candidates[order]
        self.ts = ts[order]
        self.end = (ts + dur)[order]
        parents = op_parents(trace, self.rows)  # positions in self.rows, already in this order
        self.parent = parents
        pid, tid = trace.pid[self.rows], trace.tid[self.rows]
        self.segments: dict[tuple[int, int], tuple[int, int]] = {}
        if len(self.rows):
            change = np.flatnonzero((np.diff(pid) != 0) | (np.diff(tid) != 0)) + 1
            bounds = np.concatenate(([0], change, [len(self.rows)]))
            for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
                self.segments[(int(pid[a]), int(tid[a]))] = (a, b)


def _nesting(trace: Trace, candidates: np.ndarray) -> _Nesting:
    key = ("nesting", len(candidates), int(candidates[0]), int(candidates[-1]))
    memo = trace._memo
    if key not in memo:
        memo[key] = _Nesting(trace, candidates)
    return memo[key]


def python_stack(trace: Trace, row: int, depth: int = 12) -> list[str]:
    """The Python frames around a CPU row, innermost first (empty without `with_stack`)."""
    python = trace.rows(Kind.PYTHON)
    inner = int(enclosing_rows(trace, python, np.array([row]))[0])
    frames: list[str] = []
    if inner < 0:
        return frames
    by_id = trace._memo.get("python_by_id")
    if by_id is None:
        by_id = trace._memo["python_by_id"] = dict(
            zip(trace.python_id[python].tolist(), python.tolist(), strict=True)
        )
    current: int | None = inner
    while current is not None and current >= 0 and len(frames) < depth:
        frames.append(frame_name(trace, current))
        current = by_id.get(int(trace.python_parent_id[current]))
    return frames


_ADDRESS = re.compile(r" at 0x[0-9a-f]+")  # "<built-in method item of Tensor object at 0x7f..>"


def frame_name(trace: Trace, row: int) -> str:
    """A Python event's frame, without the object addresses that differ from run to run."""
    return _ADDRESS.sub("", trace.name_of(row))


_LIBRARY_FRAME = re.compile(
    r"(^|/)(torch|torchvision|site-packages|dist-packages)/|/lib/python3[\d.]*/|"
    r"(^|/)(contextlib|threading|runpy|functools)\.py|(^|/)gpudoctor/(?!workloads/)|^<built-in|^<frozen"
)


def is_user_frame(frame: str) -> bool:
    """A frame of the user's own code: not torch, the stdlib or a built-in."""
    return "(" in frame and not _LIBRARY_FRAME.search(frame)


def user_frame(stack: list[str]) -> str | None:
    """The innermost frame of the user's own code (not torch, the stdlib or a built-in)."""
    for frame in stack:
        if is_user_frame(frame):
            return frame
    for frame in stack:
        if not frame.startswith("<built-in"):
            return frame
    return None


def op_parents(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """For each of `rows`, the position in `rows` of its innermost enclosing row on the same thread
    (-1 at the top). Memoized per set of rows.

    The parent of an interval is the latest earlier-starting one on its thread still open when it
    starts (what a stack sweep finds): a "last position to the left with a value above x" query,
    answered for all rows at once by binary lifting over a sparse table of running maxima.
    """
    key = ("parents", len(rows), hash(rows.tobytes()))
    memo = trace._memo
    if key not in memo:
        memo[key] = _parents(trace, rows)
    return memo[key]


def _parents(trace: Trace, rows: np.ndarray) -> np.ndarray:
    n = len(rows)
    parent = np.full(n, -1, dtype=np.int64)
    if not n:
        return parent
    order = np.lexsort((-trace.dur[rows], trace.ts[rows], trace.tid[rows], trace.pid[rows]))
    r = rows[order]
    # Put each thread on its own stretch of the time axis so no interval can enclose another thread's.
    thread = np.zeros(n, dtype=np.int64)
    thread[1:] = np.cumsum((np.diff(trace.pid[r]) != 0) | (np.diff(trace.tid[r]) != 0))
    lo, hi = float(trace.ts[r].min()), float((trace.ts[r] + trace.dur[r]).max())
    shift = thread * (hi - lo + 1.0)
    start = trace.ts[r] - lo + shift
    end = trace.ts[r] + trace.dur[r] - lo + shift
    # table[l][i] = max(end[i - 2**l + 1 .. i])
    table = [end]
    while (1 << len(table)) <= n:
        prev, step = table[-1], 1 << (len(table) - 1)
        nxt = prev.copy()
        nxt[step:] = np.maximum(prev[step:], prev[:-step])
        table.append(nxt)
    p = np.arange(n) - 1  # candidate: the row just before
    for level in range(len(table) - 1, -1, -1):
        width = 1 << level
        ok = p - width + 1 >= 0
        idx = np.maximum(p, 0)
        skip = ok & (table[level][idx] <= start)
        p = np.where(skip, p - width, p)
    found = (p >= 0) & (end[np.maximum(p, 0)] > start)
    parent_sorted = np.where(found, p, -1)
    # back to the caller's order of rows
    parent[order] = np.where(parent_sorted >= 0, order[np.maximum(parent_sorted, 0)], -1)
    return parent

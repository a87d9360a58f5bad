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
    """The CPU op a runtime call or GPU activity belongs to (-1 if none): the op whose `External id` it
    carries; in traces where those ids are the correlation ids (`external_ids_collide`), the innermost
    op around the launching call on its thread."""
    ops = trace.rows(Kind.CPU_OP)
    if not external_ids_collide(trace):
        return _match(trace.external_id, ops, rows)
    rows = np.asarray(rows, dtype=np.int64)
    out = np.full(len(rows), -1, dtype=np.int64)
    is_gpu = np.isin(trace.kind[rows], np.array([int(k) for k in GPU_ACTIVITY_KINDS], dtype=np.int8))
    launch = rows.copy()
    if is_gpu.any():
        launch[is_gpu] = launch_rows(trace, rows[is_gpu])
    host = (launch >= 0) & np.isin(trace.kind[np.maximum(launch, 0)], [int(k) for k in LAUNCH_KINDS])
    if host.any():
        out[host] = enclosing_rows(trace, ops, launch[host])
    return out


# Older Kineto (before ~2023) wrote each runtime call's and GPU activity's correlation id as its
# `External id` too, a counter that collides with the CPU ops' own External ids: op 51 and the copy
# with correlation 51 are unrelated. Then only time containment links a launch to its op.
_COLLIDE_SHARE = 0.9


def external_ids_collide(trace: Trace) -> bool:
    """Whether the launches' `External id`s are their correlation ids (see above), not their ops'."""
    memo = trace._memo.get("external_ids_collide")
    if memo is None:
        launches = trace.rows(*LAUNCH_KINDS)
        both = launches[(trace.external_id[launches] >= 0) & (trace.correlation[launches] >= 0)]
        same = int((trace.external_id[both] == trace.correlation[both]).sum())
        memo = trace._memo["external_ids_collide"] = np.array(
            len(both) >= 10 and same >= _COLLIDE_SHARE * len(both)
        )
    return bool(memo)


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

    Finds the last candidate that starts before the query, then the first (or last) of it and its
    ancestors that contains the query, by binary lifting over the ancestor chains: O(log n) per
    query however deep the nesting (ops started at one timestamp can nest thousands deep).
    """
    out = np.full(len(queries), -1, dtype=np.int64)
    if not len(candidates) or not len(queries):
        return out
    nest = _nesting(trace, candidates)
    queries = np.asarray(queries, dtype=np.int64)
    start = nest.last_started(trace, queries)
    t1 = trace.ts[queries] + trace.dur[queries]
    found = nest.outermost_containing(start, t1) if outermost else nest.innermost_containing(start, t1)
    out[found >= 0] = nest.rows[found[found >= 0]]
    itself = np.flatnonzero(out == queries)  # a query that is also a candidate does not enclose itself
    for i in itself.tolist():
        out[i] = _walk(nest, int(start[i]), int(queries[i]), float(t1[i]), outermost)
    return out


def _walk(nest: _Nesting, p: int, q: int, t1: float, outermost: bool) -> int:
    """The slow walk up a chain, for the rare query that is a candidate itself."""
    result = -1
    while p >= 0:
        row = int(nest.rows[p])
        if row != q and nest.end[p] >= t1:
            result = row
            if not outermost:
                break
        p = int(nest.parent[p])
    return result


class _Nesting:
    """Candidates sorted by (thread, start, longest first) with each one's parent position, and the
    ancestor tables for binary lifting: `up[k][i]`, the 2**k-th ancestor of i (-1 above the root);
    `reach[k][i]`, the latest end among i and its next 2**k - 1 ancestors."""

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
        self._up: list[np.ndarray] | None = None
        self._reach: list[np.ndarray] = []

    def last_started(self, trace: Trace, queries: np.ndarray) -> np.ndarray:
        """Per query, the position of the last candidate on its thread starting at or before it."""
        out = np.full(len(queries), -1, dtype=np.int64)
        threads = np.stack((trace.pid[queries], trace.tid[queries]), axis=1)
        distinct, which = np.unique(threads, axis=0, return_inverse=True)
        which = which.reshape(-1)
        for t, (pid, tid) in enumerate(distinct.tolist()):
            seg = self.segments.get((pid, tid))
            if seg is None:
                continue
            lo, hi = seg
            mine = np.flatnonzero(which == t)
            p = lo + np.searchsorted(self.ts[lo:hi], trace.ts[queries[mine]], side="right") - 1
            out[mine] = np.where(p >= lo, p, -1)
        return out

    def _tables(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        if self._up is None:
            up, reach = [self.parent], [self.end]
            while (up[-1] >= 0).any():  # one level more per doubling of the deepest chain
                prev_up, prev_reach = up[-1], reach[-1]
                has = prev_up >= 0
                safe = np.maximum(prev_up, 0)
                up.append(np.where(has, prev_up[safe], -1))
                reach.append(np.where(has, np.maximum(prev_reach, prev_reach[safe]), prev_reach))
            self._up, self._reach = up, reach
        return self._up, self._reach

    def innermost_containing(self, start: np.ndarray, t1: np.ndarray) -> np.ndarray:
        """Per start position, the first of it and its ancestors that ends at or after t1 (-1: none)."""
        up, reach = self._tables()
        cur = start.copy()
        for k in range(len(up) - 1, -1, -1):
            live = cur >= 0
            skip = live & (reach[k][np.maximum(cur, 0)] < t1)  # none of these 2**k ends late enough
            cur = np.where(skip, up[k][np.maximum(cur, 0)], cur)
        ok = (cur >= 0) & (self.end[np.maximum(cur, 0)] >= t1)
        return np.where(ok, cur, -1)

    def outermost_containing(self, start: np.ndarray, t1: np.ndarray) -> np.ndarray:
        """Per start position, the last of it and its ancestors that ends at or after t1 (-1: none)."""
        up, reach = self._tables()
        whole = reach[-1]  # the latest end on the whole chain from a position to its root
        cur = np.where((start >= 0) & (whole[np.maximum(start, 0)] >= t1), start, -1)
        for k in range(len(up) - 1, -1, -1):
            nxt = up[k][np.maximum(cur, 0)]
            climb = (cur >= 0) & (nxt >= 0) & (whole[np.maximum(nxt, 0)] >= t1)
            cur = np.where(climb, nxt, cur)
        return cur


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


def _preorder(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """Positions of `rows` by thread, start, longest first (a parent before its children); memoized
    per set of rows, as both `op_parents` and `op_subtrees` sort by it."""
    key = ("preorder", len(rows), hash(rows.tobytes()))
    memo = trace._memo
    if key not in memo:
        memo[key] = _by_thread(
            trace.pid[rows], trace.tid[rows], start_then_longest(trace.ts[rows], trace.dur[rows])
        )
    return memo[key]


def _by_thread(pid: np.ndarray, tid: np.ndarray, order: np.ndarray) -> np.ndarray:
    """`order` sorted, stably, by (pid, tid): `np.lexsort((..., tid, pid))` where `order` already sorts
    the rest. The threads are few: numbered densely, they sort in one pass (a radix sort)."""
    p, t = pid[order], tid[order]
    if not len(order) or ((p == p[0]).all() and (t == t[0]).all()):
        return order
    _, p_rank = np.unique(p, return_inverse=True)
    tids, t_rank = np.unique(t, return_inverse=True)
    thread = p_rank.reshape(-1) * len(tids) + t_rank.reshape(-1)
    if thread.max() < np.iinfo(np.int16).max:
        thread = thread.astype(np.int16)
    return order[np.argsort(thread, kind="stable")]


def start_then_longest(ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """`np.lexsort((-dur, ts))`: by start, the longest first among equal starts. Rows come in time
    order, so only the runs of equal starts need sorting (a few): the rest stays where it is."""
    if len(ts) < 2 or not (ts[1:] >= ts[:-1]).all():
        return np.lexsort((-dur, ts))
    tied = np.flatnonzero(ts[1:] == ts[:-1])
    order = np.arange(len(ts))
    if len(tied):
        runs = np.unique(np.concatenate((tied, tied + 1)))  # every member of a run of equal starts
        order[runs] = runs[np.lexsort((-dur[runs], ts[runs]))]
    return order


def _parents(trace: Trace, rows: np.ndarray) -> np.ndarray:
    n = len(rows)
    parent = np.full(n, -1, dtype=np.int64)
    if not n:
        return parent
    order = _preorder(trace, rows)
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


def op_subtrees(trace: Trace, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`rows` as the forest `op_parents` makes of them, laid out so that every subtree is one stretch:
    `order`, the positions of `rows` in preorder (thread, start, longest first: a parent comes before
    its children, and all of a row's descendants come right after it); and `end`, per preorder index,
    one past the last preorder index of its subtree. Subtree sums are then differences of a prefix
    sum, and "inside an op like this one" a comparison of indices: O(n log depth) in all."""
    key = ("subtrees", len(rows), hash(rows.tobytes()))
    memo = trace._memo
    if key not in memo:
        memo[key] = _subtrees(trace, rows)
    return memo[key]


def _subtrees(trace: Trace, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = len(rows)
    order = _preorder(trace, rows)
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    parent = op_parents(trace, rows)[order]  # positions in rows -> preorder indices
    parent = np.where(parent >= 0, rank[np.maximum(parent, 0)], -1)
    # A subtree ends where the next sibling of its root starts; a last child's where its parent's
    # ends. Top-level rows are siblings of one another; the last one's subtree ends at n.
    by_parent = np.argsort(parent, kind="stable")  # siblings together, in preorder
    same = parent[by_parent[1:]] == parent[by_parent[:-1]]
    end = np.full(n, -1, dtype=np.int64)
    end[by_parent[:-1][same]] = by_parent[1:][same]
    end[(parent < 0) & (end < 0)] = n
    # Pointer jumping up the chains of last children: O(log depth) rounds.
    ptr = parent.copy()
    pending = np.flatnonzero(end < 0)
    while len(pending):
        up = ptr[pending]
        known = end[up] >= 0
        end[pending[known]] = end[up[known]]
        ptr[pending[~known]] = ptr[up[~known]]
        pending = pending[~known]
    return order, end

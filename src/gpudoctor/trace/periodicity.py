"""Iterations from the repeating sequence of work a loop issues: `sequence_iterations`. The sequence is
the GPU activities' names in launch order (the busiest thread's top-level ops where there is no GPU
activity); its period is the shift at which it best matches itself, judged on the later part of the
trace (the first iteration often differs), and boundaries are walked one period at a time from a
reference boundary. Linear in the sequence per candidate period. Limit: a trace of a single iteration of a
model whose layers repeat reads as iterations of one layer (docs/analysis.md, "Steps")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpudoctor.trace.links import launch_rows, op_parents
from gpudoctor.trace.model import GPU_ACTIVITY_KINDS, Kind, Trace
from gpudoctor.trace.steps import on_busiest_thread, thread_extent

MIN_SCORE = 0.8  # share of the later items that match one period on
NEAR_BEST = 0.02  # periods scoring within this of the best are equals: the shortest wins
MAX_RARE_NAMES = 0.1  # share of repeated names that may occur less than RARE times per period
RARE = 0.6
MIN_RARE_NAMES = 2  # one rare name is a stray (a kernel every N iterations), not a longer period
MAX_CANDIDATES = 64
KGRAM = 16  # items matched at each boundary
FAST_RUN = 4096  # boundaries checked at once where the sequence keeps its period exactly
# Fewer GPU activities than this are a few calls, not a loop (two iterations of four activities at the
# least): no iterations are read into them. Steps read into fewer than rules.registry's
# MIN_KERNELS_WITHOUT_STEPS kernels are too little GPU work to diagnose all the same.
MIN_GPU_SEQUENCE = 8


@dataclass(frozen=True)
class Repetition:
    spans: list[tuple[float, float]]  # the iterations' host spans
    period: int  # in items of the sequence
    items: str  # what the sequence is of: "GPU activities" or "top-level ops"
    thread: tuple[int, int]  # the thread that issues most of it


def sequence_iterations(trace: Trace) -> Repetition | None:
    """The iterations of the launch sequence (the top-level op sequence without GPU activity); None
    where it does not repeat at least twice."""
    rows, tokens = launch_sequence(trace)
    items = "GPU activities"
    if trace.has_gpu and len(rows) < MIN_GPU_SEQUENCE:
        return None
    if len(rows) < 4 and not trace.has_gpu:
        rows, tokens = op_sequence(trace)
        items = "top-level ops"
    if len(rows) < 4:
        return None
    period = find_period(tokens)
    if period is None:
        return None
    starts, ends = trace.ts[rows], trace.ts[rows] + trace.dur[rows]
    bounds = boundaries(tokens, period, starts - np.concatenate(([starts[0]], ends[:-1])))
    if len(bounds) < 2:
        return None
    keys = trace.pid[rows] * (1 << 32) + trace.tid[rows]
    ids, counts = np.unique(keys, return_counts=True)
    pick = int(np.flatnonzero(keys == ids[np.argmax(counts)])[0])
    thread = (int(trace.pid[rows[pick]]), int(trace.tid[rows[pick]]))
    return Repetition(_spans(trace, bounds, starts, ends, thread), period, items, thread)


def op_sequence(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """The top-level ops of the thread that runs the most ops, in order, and their names."""
    ops = trace.rows(Kind.CPU_OP)
    if not len(ops):
        return ops, ops
    ops = on_busiest_thread(trace, ops)
    top = ops[op_parents(trace, ops) < 0]
    return top, trace.name[top].astype(np.int64)


def launch_sequence(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """The runtime calls that launched GPU activity, in the host's order, and the names of what each
    launched. Activities without a recorded launch are left out: their place in that order is
    unknown. Memoized per trace."""
    memo = trace._memo.get("launch_sequence")
    if memo is None:
        gpu = trace.rows(*GPU_ACTIVITY_KINDS)
        launch = launch_rows(trace, gpu)
        linked = launch >= 0
        order = np.argsort(trace.ts[launch[linked]], kind="stable")
        memo = launch[linked][order], trace.name[gpu[linked][order]].astype(np.int64)
        trace._memo["launch_sequence"] = memo
    return memo


def find_period(tokens: np.ndarray) -> int | None:
    """The sequence's period in items, or None where it does not repeat twice."""
    n = len(tokens)
    _, inverse, counts = np.unique(tokens, return_inverse=True, return_counts=True)
    repeated = counts >= 2
    if not repeated.any():
        return None
    best: list[tuple[float, int]] = []
    for p in _candidates(inverse, counts):
        if p < 1 or p > n // 2:
            continue
        rare = counts[repeated] < RARE * n / p
        if rare.sum() >= MIN_RARE_NAMES and rare.mean() > MAX_RARE_NAMES:
            continue  # names that occur less than once per period: p is a repeat inside an iteration
        exact, loose = _scores(tokens, p)
        if loose >= MIN_SCORE:
            best.append((exact, p))
    if not best:
        return None
    top = max(s for s, _ in best)
    return min(p for s, p in best if s >= top - NEAR_BEST)


def _scores(tokens: np.ndarray, p: int) -> tuple[float, float]:
    """How well the later part of the sequence matches itself one period on: exactly, and allowing one
    item more or less in between (a stray launch shifts the rest of its iteration by one)."""
    n = len(tokens)
    span = max(p, (n - p) // 2)
    here = tokens[n - p - span : n - p]
    exact = here == tokens[n - span :]
    loose = exact.copy()
    loose[1:] |= here[1:] == tokens[n - span : n - 1]  # one item fewer in between
    loose[:-1] |= here[:-1] == tokens[n - span + 1 :]  # one more
    return float(exact.mean()), float(loose.mean())


def _candidates(inverse: np.ndarray, counts: np.ndarray) -> list[int]:
    """Candidate periods: each repeated name's median spacing (the lower median), the most often
    proposed first. Vectorized: linear in the sequence but for one sort."""
    order = np.argsort(inverse, kind="stable")  # positions, grouped by name, each group in order
    name = inverse[order]
    same = name[1:] == name[:-1]
    spacing, group = np.diff(order)[same], name[1:][same]
    if not len(spacing):
        return []
    by = np.lexsort((spacing, group))
    spacing, group = spacing[by], group[by]
    n_per = np.bincount(group)
    start = np.concatenate(([0], np.cumsum(n_per)[:-1]))
    has = n_per > 0
    medians = spacing[start[has] + (n_per[has] - 1) // 2]
    values, support = np.unique(medians, return_counts=True)
    ranked = np.lexsort((values, -support))[:MAX_CANDIDATES]
    return [int(v) for v in values[ranked]]


def boundaries(tokens: np.ndarray, period: int, gaps: np.ndarray) -> list[int]:
    """Where iterations start (indices into the sequence, the first 0): the most regular of the
    chains walked from the trace's end, its start, and the longest host gap (`gaps[i]`: the host's
    time before launch i)."""
    n = len(tokens)
    last = slice(n - period, n)
    references = [n - period, 0, n - period + int(np.argmax(gaps[last]))]
    best: list[int] = []
    best_cost = np.inf
    for ref in references:
        chain = _settle(_walk(tokens, period, ref), n, period)
        lengths = np.diff([*chain, n])
        cost = float(np.abs(lengths - period).sum())
        if cost < best_cost:
            best, best_cost = chain, cost
    return best


def _walk(tokens: np.ndarray, period: int, ref: int) -> list[int]:
    """Boundaries one period apart each way from `ref`: near each expected place, where the launches
    best match those at `ref` (at least half of KGRAM of them; the nearest among equals). Runs of exact
    periods are checked at once; the search near the expected place is for where one is off."""
    n = len(tokens)
    k = min(KGRAM, period, n - ref)
    pattern = tokens[ref : ref + k]
    offsets = np.arange(k)
    reach = max(1, period // 4)
    chain = [ref]
    for direction in (-1, 1):
        current, block = ref, 16
        while True:
            run = current + direction * period * np.arange(1, block + 1)
            run = run[(run >= 0) & (run <= n - k)]
            good = (tokens[run[:, None] + offsets] == pattern).sum(axis=1) * 2 >= k
            taken = len(run) if good.all() else int(np.argmin(good))
            chain.extend(run[:taken].tolist())
            current = int(run[taken - 1]) if taken else current
            if taken == len(run) == block:
                block = min(2 * block, FAST_RUN)
                continue
            block = 16
            expected = current + direction * period
            near = np.arange(max(expected - reach, 0), min(expected + reach, n - k) + 1)
            near = near[near < current] if direction < 0 else near[near > current]
            if not len(near):
                break
            matches = (tokens[near[:, None] + offsets] == pattern).sum(axis=1)
            best = np.lexsort((np.abs(near - expected), -matches))[0]
            if matches[best] * 2 < k:
                break
            current = int(near[best])
            chain.append(current)
    return sorted(set(chain))


def _settle(chain: list[int], n: int, period: int) -> list[int]:
    """Fragments at either end: an iteration of their own when they hold half a period or more,
    else part of their neighbour."""
    chain = [b for b in chain if 0 <= b < n]
    if not chain:
        return [0]
    if chain[0] < period / 2:
        chain[0] = 0
    else:
        chain.insert(0, 0)
    if len(chain) > 1 and n - chain[-1] < period / 2:
        chain.pop()
    return chain


def _spans(
    trace: Trace, bounds: list[int], starts: np.ndarray, ends: np.ndarray, thread: tuple[int, int]
) -> list[tuple[float, float]]:
    """Host spans: an iteration starts where the launch before its first one ended (the first where
    the loop's thread starts, at most one typical lead before its first launch), and the last ends with
    the thread, at most one longest iteration after it starts."""
    t0, t1 = thread_extent(trace, thread)
    opens = [float(ends[b - 1]) for b in bounds[1:]]
    leads = [float(starts[b]) - o for b, o in zip(bounds[1:], opens, strict=True)]
    lead = float(np.median(leads)) if leads else float(starts[0]) - t0
    first = max(t0, float(starts[0]) - max(lead, 0.0))
    opens.insert(0, min(first, float(starts[0])))
    longest = float(np.diff(opens).max()) if len(opens) > 1 else t1 - opens[0]
    last = max(min(t1, opens[-1] + longest), float(ends[-1]))
    return list(zip(opens, [*opens[1:], last], strict=True))

"""`rank_overview(analyses) -> RankOverview`: the ranks of a distributed run side by side — each
rank's step time, GPU busy share by kind and idle share by cause — and the slowest rank, the one the
others wait on in their collectives. Pure: it reads the `Analysis` of each rank, nothing else."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from gpudoctor.analysis.summary import Analysis
from gpudoctor.analysis.timeline import IDLE_CAUSES

# Below this spread the ranks are called balanced: step times of one rank vary by a few % anyway.
STRAGGLER_SPREAD = 0.05
COPY_KINDS = ("memcpy_h2d", "memcpy_d2h", "memcpy_d2d", "memcpy_other", "memset")


@dataclass(frozen=True)
class RankFigures:
    """One rank's figures. Shares are of the GPU window the rank's summary leads with (the profiled
    steps, else first to last GPU activity); None where the trace has no GPU activity."""

    rank: int
    path: str
    steps: int
    step_p50_us: float | None  # median step time; None without ProfilerStep#N annotations
    busy_fraction: float | None
    compute_share: float | None
    communication_share: float | None  # communication no compute overlaps (exposed)
    copy_share: float | None  # copies and memsets no compute or communication overlaps
    idle_share_by_cause: dict[str, float]  # IDLE_CAUSES → share of the window (empty without GPU)
    # Per step (the median step, else the whole GPU window): the time the rank spends outside exposed
    # communication — computing, copying or idle — and its exposed communication. A rank that takes
    # longer outside communication arrives late at each collective, and the others wait for it there.
    work_us: float | None
    communication_us: float | None


@dataclass(frozen=True)
class Slowest:
    rank: int
    work_us: float  # its time outside exposed communication per step
    others_work_us: float  # the median of the other ranks'
    spread: float  # work_us / others_work_us - 1 (0.2: 20% longer)
    # The other ranks' exposed communication per step beyond the slowest rank's own (median over them):
    # what they wait on it in collectives. None when no rank communicates.
    comm_wait_us: float | None
    straggler: bool  # spread ≥ STRAGGLER_SPREAD


@dataclass(frozen=True)
class RankOverview:
    ranks: tuple[RankFigures, ...]  # in the order given (load_traces: by rank)
    slowest: Slowest | None  # None with fewer than two ranks with figures


def rank_overview(analyses: Sequence[Analysis]) -> RankOverview:
    """The ranks side by side and the slowest of them (by time outside communication per step)."""
    return rank_overview_of([rank_figures(a) for a in analyses])


def rank_overview_of(figures: Sequence[RankFigures]) -> RankOverview:
    """The same from each rank's figures (what a worker that analyzed one rank sends back)."""
    ranks = tuple(figures)
    return RankOverview(ranks, _slowest(ranks))


def rank_figures(a: Analysis) -> RankFigures:
    w = a.window
    step = a.step_time_us.p50 if a.step_time_us is not None else None
    if w is None or w.window_us <= 0:
        return RankFigures(
            rank=a.trace.rank,
            path=a.trace.path,
            steps=len(a.steps),
            step_p50_us=step,
            busy_fraction=None,
            compute_share=None,
            communication_share=None,
            copy_share=None,
            idle_share_by_cause={},
            work_us=step,
            communication_us=None,
        )
    kinds = w.busy_by_kind_us
    comm = kinds.get("communication", 0.0) / w.window_us
    per_step = step if step is not None else w.window_us
    return RankFigures(
        rank=a.trace.rank,
        path=a.trace.path,
        steps=len(a.steps),
        step_p50_us=step,
        busy_fraction=w.busy_us / w.window_us,
        compute_share=kinds.get("compute", 0.0) / w.window_us,
        communication_share=comm,
        copy_share=sum(kinds.get(k, 0.0) for k in COPY_KINDS) / w.window_us,
        idle_share_by_cause={c: w.idle_by_cause_us.get(c, 0.0) / w.window_us for c in IDLE_CAUSES},
        work_us=per_step * (1 - comm),
        communication_us=per_step * comm,
    )


def _slowest(ranks: tuple[RankFigures, ...]) -> Slowest | None:
    timed = [r for r in ranks if r.work_us is not None and r.work_us > 0]
    if len(timed) < 2:
        return None
    slow = max(timed, key=lambda r: r.work_us or 0.0)  # the first of equals: a stable answer
    others = [r for r in timed if r is not slow]
    typical = statistics.median(r.work_us or 0.0 for r in others)
    spread = (slow.work_us or 0.0) / typical - 1
    waits = [r.communication_us for r in others if r.communication_us is not None]
    own = slow.communication_us
    wait = None
    if own is not None and waits and (own > 0 or any(w > 0 for w in waits)):
        wait = max(statistics.median(waits) - own, 0.0)
    return Slowest(slow.rank, slow.work_us or 0.0, typical, spread, wait, spread >= STRAGGLER_SPREAD)


__all__ = [
    "STRAGGLER_SPREAD",
    "RankFigures",
    "RankOverview",
    "Slowest",
    "rank_figures",
    "rank_overview",
    "rank_overview_of",
]

"""`rank_overview(analyses) -> RankOverview`: the ranks of a distributed run side by side — step time, GPU
busy by kind, idle by cause — and the slowest rank, the one the others wait on in their collectives. Pure.
Since the profiler slows the ranks' hosts unevenly, the slowest rank is judged against the unprofiled step
where it is known: by GPU work where the GPUs pace the run, else by NVML's unprofiled utilization
(`HOST_IDLE_GAP`) and the rank's own host time within its span of each step. Why: docs/run.md, "The ranks
judged against the unprofiled step"."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpudoctor.analysis.summary import Analysis
from gpudoctor.analysis.timeline import IDLE_CAUSES

# Below this spread the ranks are called balanced: step times of one rank vary by a few % anyway.
STRAGGLER_SPREAD = 0.05
# The unprofiled straggler's GPU idles this share of the step more than the other ranks' median (NVML
# utilization over the light phase): between what balanced runs and planted stragglers measured
# (docs/results.md, "Several GPUs").
HOST_IDLE_GAP = 0.25
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
    gpu_work_us: float | None = None  # per step: compute and copies no communication hides (as traced)


@dataclass(frozen=True)
class Slowest:
    rank: int
    work_us: float  # its time outside exposed communication per step
    others_work_us: float  # the median of the other ranks'
    spread: float  # work_us / others_work_us - 1 (0.2: 20% longer)
    # The other ranks' exposed communication per step beyond the slowest rank's own (median over them):
    # what they wait on it in collectives. None when no rank communicates.
    comm_wait_us: float | None
    straggler: bool  # spread ≥ STRAGGLER_SPREAD (and, unprofiled, catch_up_us ≥ that share of the step)
    # Judged against the unprofiled step (None where it is unknown): the most the step can lose if this
    # rank caught up — the unprofiled step less the GPU floor, or its GPU work beyond the others' where
    # the GPUs pace the run — and what paces the run: "gpu" or "host".
    catch_up_us: float | None = None
    paced_by: str | None = None
    unprofiled_step_us: float | None = None
    # Unprofiled (NVML, the light phase), where every rank's is known: the share of the step this rank's
    # GPU idled, and the other ranks' median; `traced_rank` is the rank the trace alone would have named
    # where the unprofiled utilization names another.
    gpu_idle: float | None = None
    others_gpu_idle: float | None = None
    traced_rank: int | None = None
    # what the unprofiled figures alone allow it to save (the step less the GPU floor, no more than its
    # GPU's idle beyond the others'), before its own host time as traced bounds it: where that is far
    # below, the trace's host times may not describe the unprofiled run (a busy host, the profiler
    # slowing one rank's host more than another's)
    unprofiled_bound_us: float | None = None


@dataclass(frozen=True)
class RankOverview:
    ranks: tuple[RankFigures, ...]  # in the order given (load_traces: by rank)
    slowest: Slowest | None  # None with fewer than two ranks with figures


def rank_overview(analyses: Sequence[Analysis]) -> RankOverview:
    """The ranks side by side and the slowest of them (by time outside communication per step)."""
    return rank_overview_of([rank_figures(a) for a in analyses])


def rank_overview_of(
    figures: Sequence[RankFigures],
    step_us: float | None = None,
    gpu_util: Sequence[float | None] | None = None,
    own_host_us: Sequence[float | None] | None = None,
) -> RankOverview:
    """The same from each rank's figures (what a worker that analyzed one rank sends back); with the
    run's unprofiled step time, the slowest rank judged against it, and with each rank's GPU utilization
    in that unprofiled phase (0–1, in the order of `figures`) and its own host time per step as traced
    (the script's Python outside ops, and the DataLoader), against those too."""
    ranks = tuple(figures)
    slowest = _slowest(ranks)
    if slowest is not None and step_us:
        numbers = [r.rank for r in ranks]
        utils = dict(zip(numbers, gpu_util, strict=True)) if gpu_util is not None else {}
        host = dict(zip(numbers, own_host_us, strict=True)) if own_host_us is not None else {}
        slowest = _unprofiled(slowest, ranks, step_us, utils, host)
    return RankOverview(ranks, slowest)


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
        gpu_work_us=per_step
        * (kinds.get("compute", 0.0) + sum(kinds.get(k, 0.0) for k in COPY_KINDS))
        / w.window_us,
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
    # without a GPU window (a CPU run, gloo) a rank's step holds its wait for the others too: ranks that
    # synchronize every step share it, and its spread is where the steps' ends fell, not a straggler
    # (a balanced 2-rank CPU run: "+17.7%" from the medians of 5 traced steps)
    apart = slow.communication_us is not None
    return Slowest(
        slow.rank, slow.work_us or 0.0, typical, spread, wait, apart and spread >= STRAGGLER_SPREAD
    )


GPU_PACED = 0.9  # the heaviest GPU's work and the transfer make this share of the unprofiled step


def _unprofiled(
    slow: Slowest,
    ranks: tuple[RankFigures, ...],
    step_us: float,
    utils: dict[int, float | None],
    host: dict[int, float | None],
) -> Slowest:
    """The slowest rank judged against the unprofiled step: which rank paces the run, and the most
    the step can lose if it caught up."""
    timed = [r for r in ranks if r.gpu_work_us is not None and r.work_us]
    if len(timed) < 2:
        return slow
    transfer = min((r.communication_us or 0.0) for r in timed)  # the rank that waits least: no wait
    heaviest = max(timed, key=lambda r: r.gpu_work_us or 0.0)
    floor = (heaviest.gpu_work_us or 0.0) + transfer
    if floor >= GPU_PACED * step_us:  # the GPUs pace the run: the most GPU work is the slowest rank
        others = [r.gpu_work_us or 0.0 for r in timed if r is not heaviest]
        typical = statistics.median(others)
        spread = (heaviest.gpu_work_us or 0.0) / typical - 1 if typical > 0 else 0.0
        catch_up = max((heaviest.gpu_work_us or 0.0) - typical, 0.0)
        waits = [r.communication_us for r in timed if r is not heaviest and r.communication_us is not None]
        wait = max(statistics.median(waits) - (heaviest.communication_us or 0.0), 0.0) if waits else None
        # in the trace it waited for the others in its collectives longer than its extra GPU work: what it
        # has beyond theirs may be its kernels slowed beside its own waiting collectives (NCCL's kernels
        # hold SMs while they wait), not work the others wait for (a balanced GPU-paced run on 2 × H100:
        # the waiting rank's compute +10%)
        waited = (heaviest.communication_us or 0.0) - statistics.median(waits) if waits else 0.0
        return Slowest(
            heaviest.rank, heaviest.gpu_work_us or 0.0, typical, spread, wait,
            spread >= STRAGGLER_SPREAD and catch_up >= STRAGGLER_SPREAD * step_us and waited < catch_up,
            catch_up, "gpu", step_us,
        )  # fmt: skip
    catch_up = max(step_us - floor, 0.0)
    idle = {r.rank: 1.0 - min(max(u, 0.0), 1.0) for r in timed if (u := utils.get(r.rank)) is not None}
    if len(idle) == len(timed):
        own = {r.rank: h for r in timed if (h := host.get(r.rank)) is not None}
        return _host_paced_unprofiled(
            slow, timed, step_us, catch_up, idle, own if len(own) == len(timed) else {}
        )
    if slow.comm_wait_us is not None:
        catch_up = min(catch_up, slow.comm_wait_us)
    straggler = slow.straggler and catch_up >= STRAGGLER_SPREAD * step_us
    return replace(
        slow, straggler=straggler, catch_up_us=catch_up, paced_by="host", unprofiled_step_us=step_us
    )


def _host_paced_unprofiled(
    slow: Slowest,
    timed: list[RankFigures],
    step_us: float,
    catch_up: float,
    idle: dict[int, float],
    host: dict[int, float],
) -> Slowest:
    """A host paces the run, and each rank's GPU idle share is known unprofiled: the rank whose GPU idles
    most is the one whose host paces the run (a faster host runs ahead, and its GPU waits in the
    collectives' kernels, busy). That says which rank, not by how much: in a run whose hosts pace it
    one rank always idles most. So it is a straggler when it idles HOST_IDLE_GAP of the step more than
    the others' median *and* its own host time as traced (`host`: Python outside ops and the DataLoader,
    which the profiler hardly slows, unlike the ops) exceeds the others' median by STRAGGLER_SPREAD of
    the step; it can save at most that excess, its idle beyond the others', and the step less the GPU
    floor (`catch_up`)."""

    def gap_of(rank: int) -> tuple[float, float, float]:
        others = [r.rank for r in timed if r.rank != rank]
        others_idle = statistics.median(idle[o] for o in others)
        excess = host[rank] - statistics.median(host[o] for o in others) if host else math.inf
        return idle[rank] - others_idle, others_idle, excess

    top = max(timed, key=lambda r: (idle[r.rank], r.rank == slow.rank))  # ties: the trace's choice
    gap, others_idle, excess = gap_of(top.rank)
    bound = min(catch_up, gap * step_us, excess)
    straggler = gap >= HOST_IDLE_GAP and bound >= STRAGGLER_SPREAD * step_us
    if not straggler:  # balanced unprofiled: the trace's slowest stays the one shown, with its own idle
        top = next(r for r in timed if r.rank == slow.rank)
        gap, others_idle, excess = gap_of(top.rank)
    unprofiled_bound = max(min(catch_up, gap * step_us), 0.0)
    catch_up = max(min(catch_up, gap * step_us, excess), 0.0)
    if top.rank == slow.rank:
        if slow.comm_wait_us is not None:
            catch_up = min(catch_up, slow.comm_wait_us)
        return replace(
            slow, straggler=straggler, catch_up_us=catch_up, paced_by="host", unprofiled_step_us=step_us,
            gpu_idle=idle[top.rank], others_gpu_idle=others_idle, unprofiled_bound_us=unprofiled_bound,
        )  # fmt: skip
    # the trace's slowest rank is not the unprofiled one: the profiler slowed its host more
    others = [r for r in timed if r is not top]
    typical = statistics.median(r.work_us or 0.0 for r in others)
    waits = [r.communication_us for r in others if r.communication_us is not None]
    wait = max(statistics.median(waits) - (top.communication_us or 0.0), 0.0) if waits else None
    return Slowest(
        top.rank, top.work_us or 0.0, typical, (top.work_us or 0.0) / typical - 1 if typical > 0 else 0.0,
        wait, straggler, catch_up, "host", step_us, idle[top.rank], others_idle, slow.rank, unprofiled_bound,
    )  # fmt: skip


__all__ = [
    "HOST_IDLE_GAP",
    "STRAGGLER_SPREAD",
    "RankFigures",
    "RankOverview",
    "Slowest",
    "rank_figures",
    "rank_overview",
    "rank_overview_of",
]

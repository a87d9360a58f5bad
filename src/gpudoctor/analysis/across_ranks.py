"""`across_ranks(summaries) -> AcrossRanks`: the reduce step over every rank's `RankSummary` — the ranks
side by side and the slowest (`analysis.ranks`), ordered outliers first (median absolute deviations from
the ranks' median); each collective call matched across ranks, its transfer time the shortest kernel over
them (the last to arrive waits for no one) and each rank's wait its own time beyond that, with the bus
bandwidth against the link's; and each compute kernel every rank runs, with whether the ranks launch it
with the same grid. Pure."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from gpudoctor.analysis.comms import bus_factor
from gpudoctor.analysis.rank_summary import RankSummary
from gpudoctor.analysis.ranks import RankOverview, rank_overview_of
from gpudoctor.device.links import Link

SCHEMA = "gpudoctor.across-ranks/1"


@dataclass(frozen=True)
class CollectiveAcross:
    collective: str
    group_size: int
    bytes: int
    calls: int  # calls matched on every rank that has the collective
    transfer_us: float  # median over the calls of the shortest kernel across ranks
    busbw: float  # bytes/s, of the transfer: factor × bytes / transfer time
    link_share: float | None  # busbw over the link's rate per direction
    waited_us: float  # median over calls of the longest kernel minus the shortest: the worst wait


@dataclass(frozen=True)
class KernelAcross:
    name: str
    ranks: int  # how many ranks run it among their top kernels
    median_us: float  # per step, median over those ranks
    max_us: float
    max_rank: int
    min_us: float
    same_grid: bool  # every rank launches its longest call with the same grid


@dataclass(frozen=True)
class AcrossRanks:
    schema: str
    overview: RankOverview
    outliers: tuple[int, ...]  # rank numbers, the furthest from the median first
    deviation: tuple[float | None, ...]  # per rank (overview order): |work − median| / MAD
    wait_us: tuple[float | None, ...]  # per rank: time per step in collectives waiting for others
    collectives: tuple[CollectiveAcross, ...]  # by transfer time × calls
    kernels: tuple[KernelAcross, ...]  # kernels every rank runs, the most uneven first
    link: Link | None
    steps_compared: tuple[int, ...]  # the step numbers all ranks' calls share


def across_ranks(summaries: Sequence[RankSummary]) -> AcrossRanks:
    overview = rank_overview_of(
        [s.figures for s in summaries],
        unprofiled_step_us(summaries),
        [_util(s) for s in summaries],
        [s.host_other_us + s.dataloader_us for s in summaries],
    )
    deviation = _deviation(summaries)
    order = sorted(range(len(summaries)), key=lambda i: (-(deviation[i] or 0.0), summaries[i].rank))
    steps, matched = _matched_calls(summaries)
    link = next((s.link for s in summaries if s.link is not None), None)
    return AcrossRanks(
        schema=SCHEMA,
        overview=overview,
        outliers=tuple(summaries[i].rank for i in order),
        deviation=deviation,
        wait_us=_waits(summaries, matched, len(steps)),
        collectives=_collectives(matched, link),
        kernels=_kernels(summaries),
        link=link,
        steps_compared=tuple(sorted(steps)),
    )


def unprofiled_step_us(summaries: Sequence[RankSummary]) -> float | None:
    """The ranks' median unprofiled step time, where every rank's is known (they step together)."""
    known = [s.unprofiled_step_us for s in summaries]
    return statistics.median(u for u in known if u) if known and all(known) else None


def _util(summary: RankSummary) -> float | None:
    """The rank's GPU utilization in the unprofiled light phase (NVML), 0–1."""
    u = summary.clocks.util_mean_pct if summary.clocks is not None else None
    return u / 100 if u is not None else None


def own_pace_us(x: AcrossRanks, summary: RankSummary) -> float | None:
    """A rank's own unprofiled step, where it waits for a straggler: the run's unprofiled step less that
    wait (host-paced: what the step would lose if the straggler caught up; GPU-paced: the straggler's
    GPU work beyond this rank's). A rank's own findings are judged against it: the time it waits for
    another rank is not its GPU idling for its own host. None where the run's step stands (no
    straggler, the straggler itself, or no unprofiled step)."""
    s = x.overview.slowest
    if s is None or not s.straggler or s.catch_up_us is None or not s.unprofiled_step_us:
        return None
    if summary.rank == s.rank:
        return None
    if s.paced_by == "gpu":
        wait = max(s.work_us - (summary.figures.gpu_work_us or 0.0), 0.0)
    else:
        wait = s.catch_up_us
    return s.unprofiled_step_us - wait


def _deviation(summaries: Sequence[RankSummary]) -> tuple[float | None, ...]:
    work = [s.figures.work_us for s in summaries]
    known = [w for w in work if w is not None]
    if len(known) < 2:
        return tuple(None for _ in work)
    median = statistics.median(known)
    mad = statistics.median(abs(w - median) for w in known)
    scale = max(mad, 0.01 * median, 1e-9)  # identical ranks: a 1% spread is one unit
    # rounded: with two ranks both are equally far from their median, and rank order breaks the tie
    return tuple(None if w is None else round(abs(w - median) / scale, 6) for w in work)


# A matched call: (key, [(rank index, duration µs)], collective, group size, bytes)
_Matched = dict[tuple[int, int], tuple[list[tuple[int, float]], str, int, int]]


def _matched_calls(summaries: Sequence[RankSummary]) -> tuple[set[int], _Matched]:
    """Calls keyed by (step, order) that every rank with calls in that step has, with the same
    collective and size; the steps every such rank has calls in."""
    with_calls = [i for i, s in enumerate(summaries) if s.calls]
    if len(with_calls) < 2:
        return set(), {}
    step_sets = [{c.step for c in summaries[i].calls if c.step is not None} for i in with_calls]
    steps = set.intersection(*step_sets)
    table: _Matched = {}
    bad: set[tuple[int, int]] = set()
    for i in with_calls:
        for c in summaries[i].calls:
            if c.step not in steps or c.dur_us is None or c.step is None:
                continue
            key = (c.step, c.order)
            entry = table.get(key)
            if entry is None:
                table[key] = ([(i, c.dur_us)], c.collective, c.group_size, c.bytes)
            elif (entry[1], entry[2], entry[3]) != (c.collective, c.group_size, c.bytes):
                bad.add(key)
            else:
                entry[0].append((i, c.dur_us))
    full = {k: v for k, v in table.items() if k not in bad and len(v[0]) == len(with_calls)}
    return steps, full


def _waits(summaries: Sequence[RankSummary], matched: _Matched, steps: int) -> tuple[float | None, ...]:
    if not matched or not steps:
        return tuple(None for _ in summaries)
    wait = [0.0] * len(summaries)
    for durations, *_ in matched.values():
        shortest = min(d for _, d in durations)
        for i, d in durations:
            wait[i] += d - shortest
    ranks_with = {i for durations, *_ in matched.values() for i, _ in durations}
    return tuple(wait[i] / steps if i in ranks_with else None for i in range(len(summaries)))


def _collectives(matched: _Matched, link: Link | None) -> tuple[CollectiveAcross, ...]:
    groups: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
    for durations, collective, n, size in matched.values():
        times = [d for _, d in durations]
        groups.setdefault((collective, n, size), []).append((min(times), max(times) - min(times)))
    out = []
    for (collective, n, size), calls in groups.items():
        if size <= 0:
            continue
        transfer = statistics.median(t for t, _ in calls)
        busbw = bus_factor(collective, n) * size / (transfer * 1e-6) if transfer > 0 else 0.0
        share = busbw / link.bytes_per_s if link is not None and link.bytes_per_s > 0 else None
        waited = statistics.median(w for _, w in calls)
        out.append(CollectiveAcross(collective, n, size, len(calls), transfer, busbw, share, waited))
    return tuple(sorted(out, key=lambda c: -c.transfer_us * c.calls))


def _kernels(summaries: Sequence[RankSummary]) -> tuple[KernelAcross, ...]:
    if len(summaries) < 2:
        return ()
    by_name: dict[str, list[tuple[int, float, tuple[int, int, int] | None]]] = {}
    for s in summaries:
        for k in s.kernels:
            by_name.setdefault(k.name, []).append((s.rank, k.us_per_step, k.grid))
    out = []
    for name, rows in by_name.items():
        if len(rows) < len(summaries):
            continue  # not among every rank's top kernels: no fair comparison
        times = [t for _, t, _ in rows]
        top = max(rows, key=lambda r: r[1])
        grids = {g for _, _, g in rows}
        out.append(
            KernelAcross(
                name, len(rows), statistics.median(times), top[1], top[0], min(times), len(grids) == 1
            )
        )
    return tuple(sorted(out, key=lambda k: -(k.max_us - k.median_us)))

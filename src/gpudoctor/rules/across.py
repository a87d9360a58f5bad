"""`diagnose_ranks(across, summaries) -> Diagnosis`: the findings about a distributed run as a whole —
the ranks compared with one another (a straggler and its cause, uneven work, collectives slower than
their link) — ranked like a rank's own findings. Each rule here is a function
(AcrossRanks, summaries, step µs) -> Finding | None; the step is the ranks' median step time, unprofiled
where every rank's is known."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from gpudoctor.analysis.across_ranks import AcrossRanks
from gpudoctor.analysis.rank_summary import RankSummary
from gpudoctor.rules.base import MIN_SAVING_PCT
from gpudoctor.rules.collectives import comm_bandwidth_low
from gpudoctor.rules.finding import SCHEMA, Diagnosis, Finding
from gpudoctor.rules.imbalance import load_imbalance
from gpudoctor.rules.stragglers import straggler

RankRule = Callable[[AcrossRanks, Sequence[RankSummary], float], Finding | None]
RANK_RULES: tuple[RankRule, ...] = (straggler, load_imbalance, comm_bandwidth_low)


def diagnose_ranks(x: AcrossRanks, summaries: Sequence[RankSummary]) -> Diagnosis:
    step_us = run_step_us(summaries)
    found = []
    if step_us is not None and len(summaries) >= 2:
        for rule in RANK_RULES:
            f = rule(x, summaries, step_us)
            if f is not None and f.est_saving_pct >= MIN_SAVING_PCT:
                found.append(f)
    found.sort(key=lambda f: (-f.est_saving_pct, f.id))
    s = x.overview.slowest
    if s is None:
        bound = "One rank: nothing to compare."
    elif s.straggler:
        bound = f"Rank {s.rank} holds the others back: {100 * s.spread:+.0f}% time outside communication."
    else:
        bound = (
            f"The {len(summaries)} ranks are balanced (the slowest, rank {s.rank}, {100 * s.spread:+.1f}%)."
        )
    return Diagnosis(SCHEMA, tuple(found), bound, {"step_us": step_us, "ranks": float(len(summaries))})


def run_step_us(summaries: Sequence[RankSummary]) -> float | None:
    """The ranks' median step time: unprofiled where every rank's is known, else as traced."""
    unprofiled = [s.unprofiled_step_us for s in summaries]
    if unprofiled and all(u for u in unprofiled):
        return statistics.median(u for u in unprofiled if u)
    traced = [s.figures.step_p50_us for s in summaries if s.figures.step_p50_us]
    return statistics.median(traced) if traced else None

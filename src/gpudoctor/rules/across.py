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
from gpudoctor.analysis.ranks import HOST_IDLE_GAP, STRAGGLER_SPREAD
from gpudoctor.rules.base import MIN_SAVING_PCT, pct, us
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
    return Diagnosis(
        SCHEMA,
        tuple(found),
        bound_line(x, len(summaries), found[0] if found else None),
        {"step_us": step_us, "ranks": float(len(summaries))},
    )


def bound_line(x: AcrossRanks, ranks: int, first: Finding | None = None) -> str:
    """What holds the run back, in one sentence: the rank with more work where uneven work is the
    first finding, else the slowest rank and by what, or that none does."""
    s = x.overview.slowest
    if s is None:
        return "One rank: nothing to compare."
    if first is not None and first.id == "load_imbalance":
        spread = first.values["compute_us"] / first.values["median_compute_us"] - 1
        return f"Rank {first.values['rank']:.0f} holds the others back: uneven work, {100 * spread:+.0f}% compute."
    what = "more GPU work" if s.paced_by == "gpu" else "time outside communication"
    if s.straggler and s.gpu_idle is not None and s.others_gpu_idle is not None:
        return (
            f"Rank {s.rank} holds the others back: unprofiled its GPU idles {pct(100 * s.gpu_idle)} of the step "
            f"waiting for its host, the others' {pct(100 * s.others_gpu_idle)}."
        )
    if s.straggler:
        return f"Rank {s.rank} holds the others back: {100 * s.spread:+.0f}% {what}."
    if s.gpu_idle is not None and s.others_gpu_idle is not None and s.paced_by == "host":
        traced = (
            f"; in the trace rank {s.rank} spends {100 * s.spread:+.0f}% longer outside communication, the "
            "profiler's doing"
            if s.spread >= STRAGGLER_SPREAD
            else ""
        )
        if s.gpu_idle - s.others_gpu_idle >= HOST_IDLE_GAP:  # one host paces, by no more than the others'
            return (
                f"The {ranks} ranks are balanced: unprofiled rank {s.rank}'s host paces the run (its GPU idles "
                f"{pct(100 * s.gpu_idle)} of the step, the others' {pct(100 * s.others_gpu_idle)}: theirs run ahead "
                "and wait in the collectives), but its own host work is no more than theirs: every host is slow "
                f"alike (each rank's findings say where){traced}."
            )
        return (
            f"The {ranks} ranks are balanced: unprofiled, no rank's GPU idles for its host much more than the "
            f"others' (rank {s.rank}'s {pct(100 * s.gpu_idle)} of the step, the others' "
            f"{pct(100 * s.others_gpu_idle)}){traced}."
        )
    if s.catch_up_us is not None and s.paced_by == "host" and s.spread >= STRAGGLER_SPREAD:
        return (
            f"The {ranks} ranks are balanced once the profiler's cost is out: in the trace rank {s.rank} spends "
            f"{100 * s.spread:+.0f}% longer outside communication, but unprofiled at most "
            f"{us(s.catch_up_us)} of the {us(s.unprofiled_step_us or 0.0)} step would go if it caught up."
        )
    return f"The {ranks} ranks are balanced (the slowest, rank {s.rank}, {100 * s.spread:+.1f}% {what})."


def run_step_us(summaries: Sequence[RankSummary]) -> float | None:
    """The ranks' median step time: unprofiled where every rank's is known, else as traced."""
    unprofiled = [s.unprofiled_step_us for s in summaries]
    if unprofiled and all(u for u in unprofiled):
        return statistics.median(u for u in unprofiled if u)
    traced = [s.figures.step_p50_us for s in summaries if s.figures.step_p50_us]
    return statistics.median(traced) if traced else None

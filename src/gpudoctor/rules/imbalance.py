"""`load_imbalance` (across ranks): the ranks run the same kernels for different lengths of time
because they get different shapes — uneven batch sizes or sequence lengths (the kernels' grids differ
from rank to rank) — so every step waits for the rank with the most work. A GPU that is merely slower
runs the same grids longer: that is a `straggler` with a slower GPU."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from gpudoctor.analysis.across_ranks import AcrossRanks
from gpudoctor.analysis.rank_summary import RankSummary
from gpudoctor.rules.base import finding, kernel, us
from gpudoctor.rules.finding import Finding, Fix

MIN_SPREAD = 0.10  # compute time per step over the ranks' median

FIX = Fix(
    summary="Give every rank the same amount of work per step: equal per-rank batch sizes "
    "(DistributedSampler with drop_last=True), sequences bucketed by length or packed to a fixed "
    "number of tokens per rank, the same padding everywhere.",
    snippet="""\
sampler = DistributedSampler(dataset, drop_last=True)          # the same number of samples per rank
# variable-length data: pack to a fixed token budget per rank and step instead of a fixed sample count
batches = pack_to_tokens(sorted_by_length(dataset), tokens_per_rank=16384)""",
)


def uneven_kernels(x: AcrossRanks) -> list[str]:
    """The kernels every rank runs, launched with different grids on different ranks."""
    return [k.name for k in x.kernels if not k.same_grid]


def load_imbalance(x: AcrossRanks, summaries: Sequence[RankSummary], step_us: float) -> Finding | None:
    computes = [(s.compute_us, s.rank) for s in summaries if s.compute_us is not None]
    uneven = uneven_kernels(x)
    if len(computes) < 2 or not uneven or step_us <= 0:
        return None
    median = statistics.median(c for c, _ in computes)
    most, rank = max(computes)
    if median <= 0 or most < (1 + MIN_SPREAD) * median:
        return None
    saving_us = most - median  # the others wait this long for it each step
    evidence = [
        f"Rank {rank} computes {us(most)} per step against the ranks' median {us(median)} "
        f"({100 * (most / median - 1):+.0f}%); the others wait for it in their collectives.",
        f"{len(uneven)} of the kernels every rank runs are launched with different grids on different "
        f"ranks ({kernel(uneven[0])}, …): the ranks get tensors of different shapes — uneven batch sizes or "
        "sequence lengths.",
    ]
    return finding(
        "load_imbalance",
        "The ranks get uneven work: different shapes, different compute time",
        100 * saving_us / step_us,
        evidence,
        FIX,
        {"rank": rank, "compute_us": most, "median_compute_us": median},
    )
